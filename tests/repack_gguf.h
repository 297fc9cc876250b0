/*
 * repack_gguf.h - test helper: a GGUF model rewritten with its projections
 * in another encoding (test_model checks the CPU's logits are unchanged,
 * test_cuda_backend runs each encoding on the GPU against the CPU).
 */
#ifndef BITNET_TEST_REPACK_GGUF_H
#define BITNET_TEST_REPACK_GGUF_H

#include <stdbool.h>

#include "qtype.h"

/* The encodings the tests rewrite a model into. */
typedef struct {
    bn_qtype type;
    const char *scale_suffix; /* see test_write_repacked_gguf */
    bool extras;
    const char *label;
} test_encoding;

extern const test_encoding test_encodings[];
extern const int test_encoding_count;

bool test_write_repacked_gguf(const char *src, const char *dst, bn_qtype type,
                              const char *scale_suffix, bool extras);

#endif
