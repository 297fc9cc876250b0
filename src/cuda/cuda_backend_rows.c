/*
 * cuda_backend_rows.c - rows of many sequences in one pass over the paged
 * cache (bn_cuda_backend_forward_rows and _pick, the batching scheduler's
 * pass; the contract is in cuda_backend.h and batch_rows.h).
 *
 * The rows go through the prefill machinery in chunks of at most the
 * prefill chunk: the W2A8 GEMMs, norms and residuals are row by row, so
 * rows of different sequences share them; only the k / v store
 * (bn_cb_qkv_post_slots: each row's paged cache row) and the attention know
 * about sequences: runs of prompts' rows go to the tiled prefill kernel
 * over their sequences' blocks (bn_cb_attn_prefill_runs, each cache tile
 * read once for up to 64 rows of a run, every run in one launch), the
 * other rows to the paged decode kernel (bn_cb_attn_paged, each row over
 * its own sequence's blocks).
 *
 * The wanted rows (at most one per sequence) then share the LM head: after
 * each chunk, their output norm goes into the head's input buffer
 * (bn_cb_rows_head_in), and once it holds rows_head rows, or the pass
 * ends, one GEMM over every row's 16-bit parts (cuBLAS, rows_head.cu says
 * why parts) reads the head's weights once for all of them. Then either
 * the device picks each row's token (bn_cuda_sample_rows) and only the
 * tokens come back, or the logits come back for the host's sampler. When
 * every row is greedy, the GEMM takes each row's first part alone and
 * bn_cb_rows_pick computes exactly only the vocabulary rows that its
 * estimates and their bounds leave (rows_head_pick.cu): half the GEMM,
 * and no logits written in full, combined or sampled.
 */
#include <cuda_runtime_api.h>
#include <stdlib.h>
#include <string.h>

#include "cublas_loader.h"
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

static bn_status check_picks(const bn_cuda_backend *b, const bn_batch_rows *r,
                             const rows_out *o, bn_error *err)
{
    if (!o->next)
        return r->n_logits > 0 && !o->logits
                   ? bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                  "cuda forward_rows: NULL logits")
                   : BN_OK;
    for (int64_t k = 0; o->p && k < r->n_logits; k++) {
        if (cb_choice_greedy(&o->p[k]))
            continue;
        const bn_status st = cb_check_choice(b, &o->p[k], o->u ? o->u[k] : -1.0, err);
        if (st != BN_OK)
            return st;
    }
    return BN_OK;
}

/* cuBLAS for the head's GEMMs, opened at the first batched pass; without
 * it (not installed, no handle) the rows take the head GEMV one by one. */
static void open_blas(bn_cuda_backend *b)
{
    if (b->blas_tried)
        return;
    b->blas_tried = true;
    const bn_cublas *api = NULL;
    bn_error e;
    bn_error_clear(&e);
    cublasHandle_t h = NULL;
    if (bn_cublas_get(&api, &e) != BN_OK || api->create(&h) != CUBLAS_STATUS_SUCCESS)
        return;
    if (api->set_stream(h, b->cs) != CUBLAS_STATUS_SUCCESS ||
        api->set_workspace(h, b->ws_blas, (size_t)32 << 20) != CUBLAS_STATUS_SUCCESS) {
        api->destroy(h);
        return;
    }
    b->blas_api = api;
    b->blas = h;
}

void cb_rows_release(bn_cuda_backend *b)
{
    if (b->blas)
        b->blas_api->destroy((cublasHandle_t)b->blas);
    b->blas = NULL;
    for (int g = 0; g < 2; g++)
        for (int i = 0; i < ROWS_GRAPHS; i++)
            if (b->rows_graph[g][i])
                cudaGraphExecDestroy(b->rows_graph[g][i]);
    if (b->h_rtok)
        cudaFreeHost(b->h_rtok);
    b->h_rtok = NULL;
}

/* The form of the head's input rows: the GEMM's parts, or fp32 rows for
 * the GEMV. */
static int head_form(const bn_cuda_backend *b)
{
    return b->blas ? b->rows_form : BN_CB_ROWS_HEAD_F32;
}

static size_t head_elem(int form)
{
    return form == BN_CB_ROWS_HEAD_F32 ? sizeof(float) : 2;
}

/* Whether greedy rows take head_pick: a 16-bit head, its buffers, and
 * cuBLAS for the GEMM (head_form then gives the 16-bit parts, whose fp32
 * rows and factors bn_cb_rows_head_in writes beside them). */
static bool picks(const bn_cuda_backend *b) { return b->rows_pick && b->blas; }

/* d_rlogits (vocab x cols, column-major) = the head times `cols` columns of
 * d_hin, ldb values apart, in cuBLAS: the [vocab][dim] head read as dim x
 * vocab and transposed, sums in fp32. */
static bn_status head_gemm(bn_cuda_backend *b, cudaDataType type, int64_t cols, int64_t ldb,
                           bn_error *err)
{
    const int64_t dim = b->hp.dim, vocab = b->hp.vocab;
    const float one = 1.0f, zero = 0.0f;
    const cublasStatus_t rc = b->blas_api->gemm_ex(
        (cublasHandle_t)b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)vocab, (int)cols, (int)dim, &one,
        b->d_head, type, (int)dim, b->d_hin, type, (int)ldb, &zero, b->d_rlogits, CUDA_R_32F,
        (int)vocab, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    if (rc != CUBLAS_STATUS_SUCCESS)
        return bn_error_set(err, BN_ERR_GPU, NULL,
                            "cuda forward_rows: cuBLAS GEMM of the LM head failed (status %d)",
                            (int)rc);
    b->ran |= 1u << K_HEAD_ROWS;
    return BN_OK;
}

/* Logits of the n rows in the head's input buffer into d_rlogits. */
static bn_status head_logits(bn_cuda_backend *b, int64_t n, bn_error *err)
{
    const int64_t dim = b->hp.dim, vocab = b->hp.vocab;
    const int form = head_form(b);
    if (!b->blas) {
        for (int64_t k = 0; k < n; k++)
            BN_CUDA_TRY(err, bn_cb_head_gemv(b->d_head, b->head_type, vocab, dim,
                                             (const float *)b->d_hin + k * dim,
                                             b->d_rlogits + k * vocab, b->sm, b->cs));
        b->ran |= 1u << K_HEAD;
        return cb_mark(b, BN_CUDA_STAGE_LM_HEAD, (int)n, err);
    }
    const cudaDataType type = form == BN_CB_ROWS_HEAD_F16    ? CUDA_R_16F
                              : form == BN_CB_ROWS_HEAD_BF16 ? CUDA_R_16BF
                                                             : CUDA_R_32F;
    const int parts = bn_cb_rows_head_parts(form);
    /* Every part of every row (a row's parts side by side), then each
     * row's parts added. */
    bn_status st = head_gemm(b, type, n * parts, dim, err);
    if (st != BN_OK)
        return st;
    int launches = 1;
    if (form != BN_CB_ROWS_HEAD_F32) {
        BN_CUDA_TRY(err, bn_cb_rows_combine(b->d_rlogits, vocab, n, parts, b->d_hscale, b->cs));
        launches++;
    }
    return cb_mark(b, BN_CUDA_STAGE_LM_HEAD, launches, err);
}

/* The greedy tokens of the n rows in the head's input buffer into d_rtok:
 * the GEMM of each row's first part, then the exact logits of the few
 * vocabulary rows its estimate and bound leave (rows_head_pick.cu). */
static bn_status head_pick(bn_cuda_backend *b, int64_t n, bn_error *err)
{
    const int64_t dim = b->hp.dim, vocab = b->hp.vocab;
    const cudaDataType type = b->rows_form == BN_CB_ROWS_HEAD_F16 ? CUDA_R_16F : CUDA_R_16BF;
    const int parts = bn_cb_rows_head_parts(b->rows_form);
    /* Every row's part 0 alone (columns parts * dim apart). */
    bn_status st = head_gemm(b, type, n, parts * dim, err);
    if (st == BN_OK)
        st = cb_mark(b, BN_CUDA_STAGE_LM_HEAD, 1, err);
    if (st != BN_OK)
        return st;
    BN_CUDA_TRY(err, bn_cb_rows_pick(b->d_head, b->head_type, vocab, dim, b->d_rlogits, b->d_hscale,
                                     b->d_hfactor, b->d_hwmax, b->d_hy, n,
                                     bn_cb_rows_pick_slices(n, vocab, b->sm), b->d_rbest,
                                     b->d_rcount, b->d_rtok, b->cs));
    b->ran |= 1u << K_ROWS_PICK;
    return cb_mark(b, BN_CUDA_STAGE_ARGMAX, 1, err);
}

/* The n rows' logits, then (o->next) their tokens by bn_cuda_sample_rows
 * with the parameters and numbers in hparams, hu, or (o->logits) the
 * logits themselves to the host at row `first`. */
static bn_status head_sample(bn_cuda_backend *b, int64_t first, int64_t n, const rows_out *o,
                             const bn_cuda_sample_params *hparams, const double *hu,
                             bool any_sampled, bn_error *err)
{
    const int64_t vocab = b->hp.vocab;
    bn_status st = head_logits(b, n, err);
    if (st != BN_OK)
        return st;
    if (!o->next) {
        BN_CUDA_TRY(err, cudaMemcpyAsync(o->logits + first * vocab, b->d_rlogits,
                                         (size_t)(n * vocab) * sizeof(float),
                                         cudaMemcpyDeviceToHost, b->cs));
        cb_count_d2h(b, (uint64_t)(n * vocab) * sizeof(float));
        return BN_OK;
    }
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_rparams, hparams, (size_t)n * sizeof *hparams,
                                     cudaMemcpyHostToDevice, b->cs));
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_ru, hu, (size_t)n * sizeof *hu, cudaMemcpyHostToDevice,
                                     b->cs));
    cb_count_h2d(b, (uint64_t)n * (sizeof *hparams + sizeof *hu));
    BN_CUDA_TRY(err, bn_cuda_sample_rows(b->d_rlogits, vocab, (int32_t)vocab, (int)n, b->d_rparams,
                                         b->d_ru, b->ws_rows, any_sampled, b->d_rtok, b->cs));
    b->ran |= 1u << K_SAMPLE_ROWS;
    return cb_mark(b, BN_CUDA_STAGE_ARGMAX, any_sampled ? 2 : 1, err);
}

/* The answers of the logit rows first .. first + n, whose head inputs are
 * the buffer's rows 0 .. n: their tokens (head_pick when every row is
 * greedy, else head_sample) or logits to the host. hparams and hu: host
 * room for rows_head parameters and numbers. */
static bn_status head_flush(bn_cuda_backend *b, int64_t first, int64_t n, const rows_out *o,
                            bn_cuda_sample_params *hparams, double *hu, bn_error *err)
{
    bool any_sampled = false;
    for (int64_t k = 0; o->next && k < n; k++) {
        const bn_cuda_sample_params greedy = {0.0f, 0, 1.0f, 0.0f};
        hparams[k] = o->p ? o->p[first + k] : greedy;
        hu[k] = o->p && o->u ? o->u[first + k] : 0.0;
        any_sampled |= !cb_choice_greedy(&hparams[k]);
    }
    const bn_status st = o->next && !any_sampled && picks(b)
                             ? head_pick(b, n, err)
                             : head_sample(b, first, n, o, hparams, hu, any_sampled, err);
    if (st != BN_OK || !o->next)
        return st;
    BN_CUDA_TRY(err, cudaMemcpyAsync(o->next + first, b->d_rtok, (size_t)n * sizeof(int32_t),
                                     cudaMemcpyDeviceToHost, b->cs));
    cb_count_d2h(b, (uint64_t)n * sizeof(int32_t));
    return BN_OK;
}

/* The block tables of the sequences the rows name, [max_seqs + 1]
 * [max_blocks] (-1 past each table's end; the last sequence, a captured
 * pass's padding rows', has none), to the device. */
static bn_status upload_tables(bn_cuda_backend *b, const bn_batch_rows *r, int32_t *h,
                               bn_error *err)
{
    const size_t n = ((size_t)b->paged_max_seqs + 1) * (size_t)b->paged_max_blocks;
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

/* Row blocks in order of decreasing work (their last row's position). */
static int heavier_first(const void *pa, const void *pb)
{
    const int32_t *a = pa, *b = pb;
    return (a[3] < b[3]) - (a[3] > b[3]);
}

/* Rows c .. c + M (one chunk) to the device and through the layers. h:
 * room for 5 * chunk ints; blocks: for PAGED_RUN_BLOCKS(chunk) row blocks
 * of 4 ints. */
static bn_status chunk_layers(bn_cuda_backend *b, const bn_batch_rows *r, int64_t c, int64_t M,
                              int32_t *h, int32_t *blocks, bn_error *err)
{
    const int64_t bs = b->paged_block;
    int32_t *ht = h, *hp = ht + M, *hs = hp + M, *hq = hs + M, *hd = hq + M;
    for (int64_t i = 0; i < M; i++) {
        const int32_t s = r->seq[c + i];
        const int64_t p = r->pos[c + i];
        ht[i] = r->tokens[c + i];
        hp[i] = (int32_t)p;
        hs[i] = (int32_t)(r->tables[s][p / bs] * bs + p % bs);
        hq[i] = s;
    }
    /* Runs of a prompt's consecutive positions for the tiled kernel, the
     * other rows listed for the decode kernel. */
    paged_rows pr = {b->d_tokens, b->d_pos, b->d_slot, b->d_rseq, NULL, 0, 0, b->d_rblocks, 0, 0};
    for (int64_t i = 0; i < M;) {
        int64_t n = 1;
        while (i + n < M && hq[i + n] == hq[i] && hp[i + n] == hp[i] + n)
            n++;
        if (n >= PAGED_RUN_MIN) {
            for (int64_t k = 0; k < n; k += 64) { /* blocks of 64 rows; the sort key last */
                const int64_t rows = n - k < 64 ? n - k : 64;
                int32_t *e = blocks + 4 * pr.n_blocks++;
                e[0] = (int32_t)(i + k);
                e[1] = (int32_t)rows;
                e[2] = hq[i];
                e[3] = hp[i + k + rows - 1];
            }
            pr.runs_max_pos = hp[i + n - 1] > pr.runs_max_pos ? hp[i + n - 1] : pr.runs_max_pos;
        } else {
            for (int64_t k = i; k < i + n; k++) {
                hd[pr.n_dec++] = (int32_t)k;
                pr.max_pos = hp[k] > pr.max_pos ? hp[k] : pr.max_pos;
            }
        }
        i += n;
    }
    const size_t bytes = (size_t)M * sizeof(int32_t);
    int32_t *const dst[4] = {b->d_tokens, b->d_pos, b->d_slot, b->d_rseq};
    for (int i = 0; i < 4; i++)
        BN_CUDA_TRY(err, cudaMemcpyAsync(dst[i], h + i * M, bytes, cudaMemcpyHostToDevice, b->cs));
    cb_count_h2d(b, 4 * bytes);
    if (pr.n_blocks > 0) {
        qsort(blocks, (size_t)pr.n_blocks, 4 * sizeof *blocks, heavier_first);
        for (int k = 0; k < pr.n_blocks; k++)
            blocks[4 * k + 3] = 0;
        BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_rblocks, blocks,
                                         (size_t)pr.n_blocks * 4 * sizeof *blocks,
                                         cudaMemcpyHostToDevice, b->cs));
        cb_count_h2d(b, (size_t)pr.n_blocks * 4 * sizeof *blocks);
    }
    if (pr.n_dec > 0 && pr.n_dec < M) {
        BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_dlist, hd, (size_t)pr.n_dec * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, b->cs));
        cb_count_h2d(b, (size_t)pr.n_dec * sizeof(int32_t));
        pr.dec_rows = b->d_dlist;
    }
    return cb_enqueue_paged_rows(b, M, &pr, err);
}

/* ---- decode-only passes as CUDA graphs --------------------------------------
 *
 * A pass whose every row decodes (one row a sequence, each wanting its
 * token picked on the device) runs as the graph of its bucket: M = the
 * next power of two rows, the rows past the pass's padded with token 0 at
 * position 0 of a sequence with no block (their keys and values stored
 * nowhere and read as zeros, their tokens dropped). The graph reads
 * everything that changes from device memory written before it is
 * launched; the attention's split covers the whole context. */

static int bucket_index(int64_t n)
{
    int i = 0;
    while (((int64_t)1 << i) < n)
        i++;
    return i;
}

/* Which graph form a pass of picks takes: 1 when every row is greedy and
 * the head can pick from first parts (head_pick), else 0. */
static int graph_form(const bn_cuda_backend *b, const bn_batch_rows *r, const rows_out *o)
{
    if (!picks(b))
        return 0;
    for (int64_t k = 0; o->p && k < r->n_rows; k++)
        if (!cb_choice_greedy(&o->p[k]))
            return 0;
    return 1;
}

static bool graph_fits(const bn_cuda_backend *b, const bn_batch_rows *r, const rows_out *o)
{
    if (!o->next || b->prof || !b->use_graphs || r->n_logits != r->n_rows)
        return false;
    const int i = bucket_index(r->n_rows);
    if (i >= ROWS_GRAPHS || ((int64_t)1 << i) > b->chunk || ((int64_t)1 << i) > b->rows_head ||
        b->rows_graph_state[graph_form(b, r, o)][i] == 2)
        return false;
    for (int64_t k = 0; k < r->n_rows; k++)
        if (r->logit_rows[k] != k)
            return false;
    return true;
}

/* The pass of M rows whose inputs are on the device: layers, head, picks,
 * tokens into h_rtok; `greedy` (graph_form): the picks of head_pick. */
static bn_status queue_graph_body(bn_cuda_backend *b, int64_t M, int greedy, bn_error *err)
{
    const int64_t dim = b->hp.dim;
    const paged_rows pr = {b->d_tokens, b->d_pos, b->d_slot, b->d_rseq, NULL, (int)M,
                           (int)(b->kv_len - 1), NULL, 0, 0};
    bn_status st = cb_enqueue_paged_rows(b, M, &pr, err);
    if (st != BN_OK)
        return st;
    const int form = head_form(b);
    BN_CUDA_TRY(err, bn_cb_rows_head_in(b->x, b->out, dim, dim, b->d_lrow, M,
                                        b->d_norms + b->out_norm_off, b->hp.rms_eps, form, b->d_hin,
                                        b->d_hscale, picks(b) ? b->d_hy : NULL,
                                        picks(b) ? b->d_hfactor : NULL, b->cs));
    b->ran |= 1u << K_OUT_NORM;
    st = cb_mark(b, BN_CUDA_STAGE_OUT_NORM, 1, err);
    if (st == BN_OK && greedy)
        st = head_pick(b, M, err);
    else if (st == BN_OK) {
        st = head_logits(b, M, err);
        if (st != BN_OK)
            return st;
        BN_CUDA_TRY(err,
                    bn_cuda_sample_rows(b->d_rlogits, b->hp.vocab, (int32_t)b->hp.vocab, (int)M,
                                        b->d_rparams, b->d_ru, b->ws_rows, 1, b->d_rtok, b->cs));
        b->ran |= 1u << K_SAMPLE_ROWS;
        st = cb_mark(b, BN_CUDA_STAGE_ARGMAX, 2, err);
    }
    if (st == BN_OK)
        BN_CUDA_TRY(err, cudaMemcpyAsync(b->h_rtok, b->d_rtok, (size_t)M * sizeof(int32_t),
                                         cudaMemcpyDeviceToHost, b->cs));
    return st;
}

/* Captures bucket i's graph of form g; false (and the bucket marked) when
 * it fails. */
static bool capture_bucket(bn_cuda_backend *b, int g, int i)
{
    bn_error cerr;
    bn_error_clear(&cerr);
    cudaGraph_t graph = NULL;
    bn_status st = BN_ERR_GPU;
    cudaError_t rc = cudaStreamBeginCapture(b->cs, cudaStreamCaptureModeRelaxed);
    if (rc == cudaSuccess) {
        st = queue_graph_body(b, (int64_t)1 << i, g, &cerr);
        rc = cudaStreamEndCapture(b->cs, &graph);
        if (rc != cudaSuccess)
            st = BN_ERR_GPU;
    }
    if (st == BN_OK && graph && cudaGraphInstantiate(&b->rows_graph[g][i], graph, 0) != cudaSuccess)
        st = BN_ERR_GPU;
    if (graph)
        cudaGraphDestroy(graph);
    if (st == BN_OK && b->rows_graph[g][i])
        return true;
    b->rows_graph[g][i] = NULL;
    b->rows_graph_state[g][i] = 2;
    (void)cudaGetLastError();
    bn_log(BN_LOG_WARN, "cuda backend: the graph of batched passes of %d rows could not be "
                        "captured (%s); they launch their kernels one by one",
           1 << i, cerr.message[0] ? cerr.message : cudaGetErrorString(rc));
    return false;
}

static bn_status graph_pass(bn_cuda_backend *b, const bn_batch_rows *r, const rows_out *o,
                            int32_t *h, bn_error *err)
{
    const int i = bucket_index(r->n_rows), g = graph_form(b, r, o);
    const int64_t M = (int64_t)1 << i, n = r->n_rows, bs = b->paged_block;
    if (!b->h_rtok) {
        BN_CUDA_TRY(err, cudaMallocHost((void **)&b->h_rtok, (size_t)b->rows_head * sizeof(int32_t)));
    }
    /* Tokens, positions, cache rows, sequences, logit rows; parameters and
     * numbers. */
    int32_t *ht = h, *hp = ht + M, *hs = hp + M, *hq = hs + M, *hl = hq + M;
    bn_cuda_sample_params *hparams = (bn_cuda_sample_params *)(void *)(hl + M);
    double *hu = (double *)(void *)(hparams + M);
    const bn_cuda_sample_params greedy = {0.0f, 0, 1.0f, 0.0f};
    for (int64_t k = 0; k < M; k++) {
        const bool real = k < n;
        const int32_t s = real ? r->seq[k] : 0;
        const int64_t p = real ? r->pos[k] : 0;
        ht[k] = real ? r->tokens[k] : 0;
        hp[k] = (int32_t)p;
        hs[k] = real ? (int32_t)(r->tables[s][p / bs] * bs + p % bs) : -1;
        hq[k] = real ? s : b->paged_max_seqs; /* the padding sequence: no blocks */
        hl[k] = (int32_t)k;
        hparams[k] = real && o->p ? o->p[k] : greedy;
        hu[k] = real && o->p && o->u ? o->u[k] : 0.0;
    }
    int32_t *const dst[5] = {b->d_tokens, b->d_pos, b->d_slot, b->d_rseq, b->d_lrow};
    for (int k = 0; k < 5; k++)
        BN_CUDA_TRY(err, cudaMemcpyAsync(dst[k], h + k * M, (size_t)M * sizeof(int32_t),
                                         cudaMemcpyHostToDevice, b->cs));
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_rparams, hparams, (size_t)M * sizeof *hparams,
                                     cudaMemcpyHostToDevice, b->cs));
    BN_CUDA_TRY(err, cudaMemcpyAsync(b->d_ru, hu, (size_t)M * sizeof *hu, cudaMemcpyHostToDevice,
                                     b->cs));
    cb_count_h2d(b, (uint64_t)M * (5 * sizeof(int32_t) + sizeof *hparams + sizeof *hu));
    bn_status st = BN_OK;
    unsigned char *state = &b->rows_graph_state[g][i];
    if (b->rows_graph[g][i] || (*state == 1 && capture_bucket(b, g, i))) {
        BN_CUDA_TRY(err, cudaGraphLaunch(b->rows_graph[g][i], b->cs));
        b->ran |= 1u << K_GRAPH;
    } else {
        *state = *state ? *state : 1;
        st = queue_graph_body(b, M, g, err);
    }
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
    if (st == BN_OK)
        memcpy(o->next, b->h_rtok, (size_t)n * sizeof(int32_t));
    cb_count_d2h(b, (uint64_t)M * sizeof(int32_t));
    return st;
}

bn_status cb_forward_rows(bn_cuda_backend *b, const bn_batch_rows *r, const rows_out *o,
                          bn_error *err)
{
    bn_status st = check_rows(b, r, err);
    if (st == BN_OK)
        st = check_picks(b, r, o, err);
    if (st == BN_OK)
        st = cb_begin_call(b, err);
    if (st != BN_OK)
        return st;
    open_blas(b);
    const int64_t H = b->rows_head, dim = b->hp.dim;
    const size_t n_tables = ((size_t)b->paged_max_seqs + 1) * (size_t)b->paged_max_blocks;
    /* The chunk's rows (graph_pass: 5 int arrays, parameters and numbers
     * for M <= chunk rows, 10 ints a row), the tables, the logit rows. */
    int32_t *h = malloc((10 * (size_t)b->chunk + n_tables + (size_t)H) * sizeof *h);
    bn_cuda_sample_params *hparams = malloc((size_t)H * sizeof *hparams);
    double *hu = malloc((size_t)H * sizeof *hu);
    int32_t *blocks = malloc(4 * (size_t)PAGED_RUN_BLOCKS(b->chunk) * sizeof *blocks);
    if (!h || !hparams || !hu || !blocks) {
        free(h);
        free(hparams);
        free(hu);
        free(blocks);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a pass's rows");
    }
    int32_t *hrows = h, *htab = hrows + 10 * b->chunk, *hl = htab + n_tables;
    const int form = head_form(b);
    /* A row's input: its parts side by side. */
    const size_t row_bytes = head_elem(form) * (size_t)bn_cb_rows_head_parts(form);
    st = upload_tables(b, r, htab, err);
    if (st == BN_OK && graph_fits(b, r, o)) {
        st = graph_pass(b, r, o, hrows, err);
        goto done;
    }
    int64_t next_logit = 0, head_first = 0, head_fill = 0;
    for (int64_t c = 0; c < r->n_rows && st == BN_OK; c += b->chunk) {
        const int64_t M = r->n_rows - c < b->chunk ? r->n_rows - c : b->chunk;
        st = chunk_layers(b, r, c, M, hrows, blocks, err);
        /* This chunk's wanted rows into the head's input, which is flushed
         * whenever it is full. */
        while (st == BN_OK && next_logit < r->n_logits && r->logit_rows[next_logit] < c + M) {
            int64_t take = 0;
            while (next_logit + take < r->n_logits && r->logit_rows[next_logit + take] < c + M &&
                   head_fill + take < H) {
                hl[head_fill + take] = (int32_t)(r->logit_rows[next_logit + take] - c);
                take++;
            }
            st = BN_CUDA_STATUS(err, cudaMemcpyAsync(b->d_lrow + head_fill, hl + head_fill,
                                                     (size_t)take * sizeof(int32_t),
                                                     cudaMemcpyHostToDevice, b->cs));
            if (st == BN_OK)
                st = BN_CUDA_STATUS(
                    err, bn_cb_rows_head_in(
                             b->x, b->out, dim, dim, b->d_lrow + head_fill, take,
                             b->d_norms + b->out_norm_off, b->hp.rms_eps, form,
                             (char *)b->d_hin + (size_t)(head_fill * dim) * row_bytes,
                             b->d_hscale + head_fill, picks(b) ? b->d_hy + head_fill * dim : NULL,
                             picks(b) ? b->d_hfactor + head_fill : NULL, b->cs));
            b->ran |= 1u << K_OUT_NORM;
            if (st == BN_OK)
                st = cb_mark(b, BN_CUDA_STAGE_OUT_NORM, 1, err);
            head_fill += take;
            next_logit += take;
            if (st == BN_OK && head_fill == H) {
                st = head_flush(b, head_first, head_fill, o, hparams, hu, err);
                head_first += head_fill;
                head_fill = 0;
            }
        }
        /* No wait before the next chunk: its kernels follow these on the
         * stream, and a copy from pageable host memory has taken its bytes
         * when cudaMemcpyAsync returns, so the host arrays can be reused. */
    }
    if (st == BN_OK && head_fill > 0)
        st = head_flush(b, head_first, head_fill, o, hparams, hu, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
done:
    free(h);
    free(hparams);
    free(hu);
    free(blocks);
    if (st != BN_OK) {
        (void)cudaStreamSynchronize(b->cs);
        (void)cudaGetLastError();
    }
    return st;
}

bn_status bn_cuda_backend_forward_rows(bn_cuda_backend *b, const bn_batch_rows *r, float *logits,
                                       bn_error *err)
{
    const rows_out o = {logits, NULL, NULL, NULL};
    return cb_forward_rows(b, r, &o, err);
}

bn_status bn_cuda_backend_forward_rows_pick(bn_cuda_backend *b, const bn_batch_rows *r,
                                            const bn_cuda_sample_params *p, const double *u,
                                            int32_t *next, bn_error *err)
{
    if (!next)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda forward_rows: NULL tokens");
    const rows_out o = {NULL, p, u, next};
    return cb_forward_rows(b, r, &o, err);
}
