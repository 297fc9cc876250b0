/*
 * batch_rows.h - rows of many sequences in one forward pass over a paged
 * KV cache: what the batching scheduler (src/engine/scheduler.c) hands a
 * backend that batches (bn_backend_ops.forward_rows; the CPU backend's
 * bn_cpu_backend_forward_rows).
 *
 * Row i computes tokens[i] at position pos[i] of sequence seq[i], whose
 * position t lives in paged cache row
 * tables[seq][t / block_size] * block_size + t % block_size
 * (table_len[seq] blocks). A sequence's rows come in position order, and
 * every position before a row's is computed, by an earlier pass or an
 * earlier row of this one. The logits of rows logit_rows[0 .. n_logits)
 * (increasing) are wanted, vocab floats each.
 */
#ifndef BN_BATCH_ROWS_H
#define BN_BATCH_ROWS_H

#include <stdint.h>

#include "bitnet.h"

typedef struct bn_batch_rows {
    int64_t n_rows;
    const int32_t *tokens;
    const int64_t *pos;
    const int32_t *seq;
    const int32_t *const *tables;
    const int32_t *table_len;
    int64_t block_size;
    const int64_t *logit_rows;
    int64_t n_logits;
} bn_batch_rows;

/* BN_ERR_INVALID_ARGUMENT, naming `who` ("cpu"), unless every row's
 * position is below kv_len and its sequence (below max_seqs) has a block
 * for it (a block index below max_blocks) among the cache's n_blocks, and
 * the logit rows are rows in increasing order (max_seqs, max_blocks <= 0:
 * no limit). The caller has checked the pointers and the block size. */
bn_status bn_batch_rows_check(const bn_batch_rows *r, int64_t kv_len, int64_t n_blocks,
                              int64_t max_seqs, int64_t max_blocks, const char *who,
                              bn_error *err);

#endif
