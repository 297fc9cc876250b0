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

#endif
