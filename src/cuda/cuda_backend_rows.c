/*
 * cuda_backend_rows.c - rows of many sequences in one pass over the paged
 * cache (bn_cuda_backend_forward_rows, the batching scheduler's pass; the
 * contract is in cuda_backend.h and batch_rows.h).
 *
 * The rows go through the prefill machinery in chunks of at most the
 * prefill chunk: the W2A8 GEMMs, norms and residuals are row by row, so
 * rows of different sequences share them; only the k / v store
 * (bn_cb_qkv_post_slots: each row's paged cache row) and the attention
 * (bn_cb_attn_paged: each row over its own sequence's blocks) know about
 * sequences. Each wanted row then gets its output norm and the LM head.
 */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_internal.h"

bool bn_cuda_backend_batches(const bn_cuda_backend *b)
{
    return b && b->paged_rows > 0;
}

/* The rows' checks: everything the kernels will index is inside the
 * cache, the tables and the vocabulary. */
static bn_status check_rows(const bn_cuda_backend *b, const bn_batch_rows *r, bn_error *err)
{
    if (!bn_cuda_backend_batches(b))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "cuda forward_rows: the backend has no paged cache");
    if (!r || r->n_rows <= 0 || !r->tokens || !r->pos || !r->seq || !r->tables ||
        !r->table_len || r->block_size != b->paged_block || r->n_logits < 0 ||
        (r->n_logits > 0 && !r->logit_rows))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda forward_rows: rows, positions, sequences and block tables in "
                            "blocks of %d are needed",
                            b->paged_block);
    const int64_t n_blocks = b->paged_rows / b->paged_block;
    for (int64_t i = 0; i < r->n_rows; i++) {
        const int32_t s = r->seq[i];
        const int64_t p = r->pos[i], blk = p / b->paged_block;
        if (r->tokens[i] < 0 || r->tokens[i] >= b->hp.vocab)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "cuda forward_rows: token %d is outside the vocabulary",
                                (int)r->tokens[i]);
        if (s < 0 || s >= b->paged_max_seqs || p < 0 || p >= b->kv_len ||
            blk >= r->table_len[s] || r->table_len[s] > b->paged_max_blocks)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "cuda forward_rows: row %lld (sequence %d, position %lld) has no "
                                "block in the cache",
                                (long long)i, (int)s, (long long)p);
        for (int64_t k = 0; k <= blk; k++)
            if (r->tables[s][k] < 0 || r->tables[s][k] >= n_blocks)
                return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                    "cuda forward_rows: sequence %d names block %d of %lld",
                                    (int)s, (int)r->tables[s][k], (long long)n_blocks);
    }
    for (int64_t k = 0; k < r->n_logits; k++)
        if (r->logit_rows[k] < 0 || r->logit_rows[k] >= r->n_rows ||
            (k > 0 && r->logit_rows[k] <= r->logit_rows[k - 1]))
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "cuda forward_rows: logit rows must be rows, in increasing order");
    return BN_OK;
}

/* The block tables of the sequences the rows name, [max_seqs][max_blocks]
 * (-1 past each table's end), to the device. */
static bn_status upload_tables(bn_cuda_backend *b, const bn_batch_rows *r, int32_t *h,
                               bn_error *err)
{
    const size_t n = (size_t)b->paged_max_seqs * (size_t)b->paged_max_blocks;
    for (size_t i = 0; i < n; i++)
        h[i] = -1;
    for (int64_t i = 0; i < r->n_rows; i++) {
        const int32_t s = r->seq[i];
        for (int32_t k = 0; k < r->table_len[s]; k++)
            h[(size_t)s * b->paged_max_blocks + k] = r->tables[s][k];
    }
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_tables, h, n * sizeof(int32_t), cudaMemcpyHostToDevice,
                                     b->cs));
    cb_count_h2d(b, n * sizeof(int32_t));
    return BN_OK;
}

bn_status bn_cuda_backend_forward_rows(bn_cuda_backend *b, const bn_batch_rows *r, float *logits,
                                       bn_error *err)
{
    bn_status st = check_rows(b, r, err);
    if (st == BN_OK && r->n_logits > 0 && !logits)
        st = bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda forward_rows: NULL logits");
    if (st == BN_OK)
        st = cb_begin_call(b, err);
    if (st != BN_OK)
        return st;
    const size_t n_tables = (size_t)b->paged_max_seqs * (size_t)b->paged_max_blocks;
    int32_t *h = malloc((n_tables + 4 * (size_t)b->chunk) * sizeof *h);
    if (!h)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a pass's rows");
    int32_t *ht = h + n_tables, *hp = ht + b->chunk, *hs = hp + b->chunk, *hq = hs + b->chunk;
    const int64_t bs = b->paged_block, vocab = b->hp.vocab;
    st = upload_tables(b, r, h, err);
    int64_t next_logit = 0;
    for (int64_t c = 0; c < r->n_rows && st == BN_OK; c += b->chunk) {
        const int64_t M = r->n_rows - c < b->chunk ? r->n_rows - c : b->chunk;
        for (int64_t i = 0; i < M; i++) {
            const int32_t s = r->seq[c + i];
            const int64_t p = r->pos[c + i];
            ht[i] = r->tokens[c + i];
            hp[i] = (int32_t)p;
            hs[i] = (int32_t)(r->tables[s][p / bs] * bs + p % bs);
            hq[i] = s;
        }
        const size_t bytes = (size_t)M * sizeof(int32_t);
        cudaError_t rc = cudaMemcpyAsync(b->d_tokens, ht, bytes, cudaMemcpyHostToDevice, b->cs);
        if (rc == cudaSuccess)
            rc = cudaMemcpyAsync(b->d_pos, hp, bytes, cudaMemcpyHostToDevice, b->cs);
        if (rc == cudaSuccess)
            rc = cudaMemcpyAsync(b->d_slot, hs, bytes, cudaMemcpyHostToDevice, b->cs);
        if (rc == cudaSuccess)
            rc = cudaMemcpyAsync(b->d_rseq, hq, bytes, cudaMemcpyHostToDevice, b->cs);
        st = BN_CUDA_STATUS(err, rc);
        cb_count_h2d(b, 4 * bytes);
        if (st == BN_OK)
            st = cb_enqueue_paged_rows(b, M, b->d_tokens, b->d_pos, b->d_slot, b->d_rseq, err);
        /* The wanted rows of this chunk, each through the output norm and
         * the head, their logits to the host. */
        for (; st == BN_OK && next_logit < r->n_logits && r->logit_rows[next_logit] < c + M;
             next_logit++) {
            st = cb_row_logits(b, r->logit_rows[next_logit] - c, err);
            if (st == BN_OK)
                st = BN_CUDA_STATUS(err, cudaMemcpyAsync(logits + next_logit * vocab, b->logits,
                                                         (size_t)vocab * sizeof(float),
                                                         cudaMemcpyDeviceToHost, b->cs));
            cb_count_d2h(b, (uint64_t)vocab * sizeof(float));
        }
        /* The host arrays are reused by the next chunk. */
        if (st == BN_OK)
            st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
    }
    free(h);
    if (st != BN_OK) {
        (void)cudaStreamSynchronize(b->cs);
        (void)cudaGetLastError();
    }
    return st;
}
