/*
 * qtype.h - the weight and embedding encodings bitnet reads and writes, and
 * one registry describing each of them.
 *
 * Vocabulary used by every format module:
 *   - A tensor is `rows` x `cols`, row-major, with `cols` the contiguous
 *     dimension (GGUF ne[0]); for a projection weight rows = outputs (N) and
 *     cols = inputs (K).
 *   - Ternary "codes" are int8 values in {-1, 0, +1}, one per weight, laid
 *     out [rows][cols]; together with one float per-tensor scale they are
 *     the canonical form every ternary format unpacks to and packs from.
 *   - "dequantize_row" turns n consecutive elements (n a multiple of the
 *     block size) into floats exactly as the format's reference does.
 *   - "quantize_row" turns floats into blocks exactly as the reference
 *     (ggml / the gguf Python package) does, byte for byte.
 *
 * The enum values are the ggml type ids where one exists, so a GGUF
 * tensor's type maps directly. Formats without a ggml id use values >= 1000.
 */
#ifndef BN_QTYPE_H
#define BN_QTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

typedef enum bn_qtype {
    BN_QTYPE_F32 = 0,
    BN_QTYPE_F16 = 1,
    BN_QTYPE_Q8_0 = 8,
    BN_QTYPE_Q4_K = 12,
    BN_QTYPE_Q6_K = 14,
    BN_QTYPE_BF16 = 30,
    BN_QTYPE_TQ1_0 = 34,
    BN_QTYPE_TQ2_0 = 35,
    BN_QTYPE_I2_S = 36, /* Microsoft bitnet.cpp */
    BN_QTYPE_TL1 = 38,  /* Microsoft bitnet.cpp, ARM LUT kernels */
    BN_QTYPE_TL2 = 39,  /* Microsoft bitnet.cpp, x86 LUT kernels */
    BN_QTYPE_HF_PACKED = 1000,    /* Hugging Face uint8 (out/4, in) + weight_scale */
    BN_QTYPE_BITNET32_F16 = 1001, /* BitNet.rs 32-element blocks with fp16 scale */
} bn_qtype;

/* Unpacks a whole ternary tensor into codes and its per-tensor scale.
 * src_bytes is the size of the data the caller has (checked). Formats with a
 * scale per block return BN_ERR_UNSUPPORTED when the blocks' non-zero scales
 * differ (not a per-tensor ternary tensor). */
typedef bn_status (*bn_ternary_unpack_fn)(const void *src, size_t src_bytes, int64_t rows,
                                          int64_t cols, int8_t *codes, float *scale,
                                          bn_error *err);
/* Packs codes and a per-tensor scale; dst holds bn_qtype_tensor_bytes(). */
typedef bn_status (*bn_ternary_pack_fn)(const int8_t *codes, float scale, int64_t rows,
                                        int64_t cols, void *dst, bn_error *err);
typedef void (*bn_dequantize_row_fn)(const void *src, float *dst, int64_t n);
typedef void (*bn_quantize_row_fn)(const float *src, void *dst, int64_t n);

typedef struct bn_qtype_info {
    bn_qtype type;
    const char *name;        /* "tq2_0", "i2_s", ... as the CLI spells them */
    int block_elems;         /* elements per block (1 for F32/F16/BF16)     */
    int block_bytes;         /* bytes per block                             */
    bool ternary;            /* weights in {-1,0,1} x scale                 */
    bn_dequantize_row_fn dequantize_row; /* NULL when only whole tensors    */
    bn_quantize_row_fn quantize_row;     /* NULL when not supported         */
    bn_ternary_unpack_fn unpack;         /* ternary formats only            */
    bn_ternary_pack_fn pack;             /* ternary formats only            */
    /* Whole-tensor size when it is not rows * cols / block_elems *
     * block_bytes (I2_S's trailing scale, TL1/TL2 tiling); else NULL. */
    size_t (*tensor_bytes)(int64_t rows, int64_t cols);
    /* Shape rule beyond cols % block_elems == 0 (e.g. TL2 tiles); NULL if
     * none. Returns false and fills err when the shape is unusable. */
    bool (*shape_ok)(int64_t rows, int64_t cols, bn_error *err);
} bn_qtype_info;

/* NULL for an unknown type. */
const bn_qtype_info *bn_qtype_get(bn_qtype type);

/* Checks the shape against the format and returns BN_OK with the tensor's
 * size in bytes, or an error naming the format and the rule broken. */
bn_status bn_qtype_tensor_size(bn_qtype type, int64_t rows, int64_t cols, size_t *bytes,
                               bn_error *err);

#endif
