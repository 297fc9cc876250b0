/* GPU test: the batched pass's attention over the paged KV cache
 * (bn_cb_attn_paged, attn_paged.cu) against a double-precision CPU
 * reference over the same cache values:
 *
 *   - rows of different sequences and lengths (1 position up to several
 *     hundred), several rows of one sequence at different positions (a
 *     prefill chunk), blocks scattered over the cache through the tables;
 *   - fp32, fp16 and e4m3 caches (the reference reads the stored values as
 *     the kernel widens them), head sizes 64 and 128, GQA groups 1, 4 and
 *     16 (the e4m3 cache's tensor-core kernel takes up to 8);
 *   - one split and many (bn_cb_attn_paged_splits' choice and others);
 *   - a list of rows: only those computed, bit for bit as without it;
 *   - the output poisoned with NaN first, a guard row after the last that
 *     must survive; bad arguments refused;
 *   - the tiled prefill kernel over a paged cache (bn_cb_attn_prefill_runs):
 *     runs of several sequences' rows in one launch, blocks in reverse
 *     order, rows of no run left alone, 1 to 4 parts.
 *
 * Tolerance: fp32 sums in another order than the reference's doubles:
 * 1e-5 of the values' scale (|v| <= 1, a few hundred terms); the e4m3
 * cache's decode kernel rounds q and the weights to fp16 (2^-11 relative):
 * 1e-3. Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_kernels.h"
#include "fp16.h"
#include "test_util.h"
#include "test_util_cuda.h"

typedef struct shape {
    int n_heads, n_kv, hd, bs;
} shape;

static const char *kv_name(int kv)
{
    return kv == BN_CB_KV_E4M3 ? "e4m3" : kv == BN_CB_KV_F16 ? "f16" : "f32";
}

/* n random values of magnitude up to `top` (a power of two of at most 2)
 * as the cache of element kv stores them: vals gets the values the kernel
 * reads, the returned buffer (malloc) the stored elements. e4m3 values are
 * random bytes of that range (no encoder needed: every byte up to top's is
 * a value). */
static void *cache_image(int kv, float *vals, size_t n, float top)
{
    void *img = malloc(n * bn_cb_kv_bytes(kv));
    CHECK(img != NULL);
    uint8_t top_byte = 0;
    while (test_e4m3_value((uint8_t)(top_byte + 1)) <= top)
        top_byte++;
    for (size_t i = 0; i < n; i++) {
        const float x = test_rand_float(-top, top);
        if (kv == BN_CB_KV_E4M3) {
            const uint8_t b = (uint8_t)test_rand_range(0, top_byte) | (x < 0 ? 0x80 : 0);
            ((uint8_t *)img)[i] = b;
            vals[i] = test_e4m3_value(b);
        } else if (kv == BN_CB_KV_F16) {
            ((uint16_t *)img)[i] = bn_fp32_to_fp16(x);
            vals[i] = bn_fp16_to_fp32(((uint16_t *)img)[i]);
        } else {
            ((float *)img)[i] = vals[i] = x;
        }
    }
    return img;
}

/* The largest difference between a row's output (every head) and the
 * double-precision attention of q at position pos over the sequence's
 * table. */
static double row_error(const shape *s, const float *q, int pos, const int32_t *table,
                        const float *k, const float *v, const float *got)
{
    const int group = s->n_heads / s->n_kv, kv_dim = s->n_kv * s->hd;
    double *sc = malloc(sizeof(double) * (size_t)(pos + 1)), worst = 0.0;
    CHECK(sc != NULL);
    for (int h = 0; h < s->n_heads; h++) {
        const float *qh = q + (size_t)h * s->hd;
        const int off = (h / group) * s->hd;
        double mx = -1e300, sum = 0.0;
        for (int t = 0; t <= pos; t++) {
            const int64_t cr = (int64_t)table[t / s->bs] * s->bs + t % s->bs;
            double d = 0.0;
            for (int i = 0; i < s->hd; i++)
                d += (double)qh[i] * k[cr * kv_dim + off + i];
            sc[t] = d / sqrt((double)s->hd);
            mx = sc[t] > mx ? sc[t] : mx;
        }
        for (int t = 0; t <= pos; t++)
            sum += (sc[t] = exp(sc[t] - mx));
        for (int i = 0; i < s->hd; i++) {
            double a = 0.0;
            for (int t = 0; t <= pos; t++) {
                const int64_t cr = (int64_t)table[t / s->bs] * s->bs + t % s->bs;
                a += sc[t] * v[cr * kv_dim + off + i];
            }
            const double d = fabs(a / sum - got[(size_t)h * s->hd + i]);
            worst = isnan(d) ? INFINITY : d > worst ? d : worst;
        }
    }
    free(sc);
    return worst;
}

/* The tiled prefill kernel over a paged fp32, fp16 or e4m3 cache for several
 * runs in one launch (bn_cb_attn_prefill_runs): n_seqs sequences of up to
 * max_len positions, blocks scattered in reverse order, each with its last
 * `run` positions as consecutive rows, one row of no run between the runs
 * (it must stay as it was), blocks of at most 64 rows heaviest first. */
static void check_prefill_runs(const shape *s, int n_seqs, int max_len, int run, int parts, int kv)
{
    const int kv_dim = s->n_kv * s->hd, q_dim = s->n_heads * s->hd;
    const int max_blocks = (max_len + s->bs - 1) / s->bs, n_blocks = n_seqs * max_blocks;
    const int n = n_seqs * (run + 1);
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)n_blocks);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n), *seq_of = malloc(sizeof(int32_t) * (size_t)n);
    int32_t *blocks = malloc(sizeof(int32_t) * 4 * (size_t)(n_seqs * (run / 64 + 1)));
    const size_t vals = (size_t)n_blocks * (size_t)s->bs * (size_t)kv_dim;
    float *k = malloc(sizeof(float) * vals), *v = malloc(sizeof(float) * vals);
    float *q = malloc(sizeof(float) * (size_t)(n * q_dim));
    float *got = malloc(sizeof(float) * (size_t)((n + 1) * q_dim));
    CHECK(tables && pos && seq_of && blocks && k && v && q && got);
    for (int b = 0; b < n_blocks; b++)
        tables[b] = n_blocks - 1 - b;
    int nb = 0, max_pos = 0;
    for (int i = 0; i < n_seqs; i++) {
        const int len = i == 0 ? max_len : (int)test_rand_range(run, max_len);
        const int first = i * (run + 1);
        for (int r = 0; r < run; r++) {
            pos[first + r] = len - run + r;
            seq_of[first + r] = i;
        }
        pos[first + run] = 0; /* in no run */
        seq_of[first + run] = -1;
        for (int r = 0; r < run; r += 64) {
            blocks[4 * nb] = first + r;
            blocks[4 * nb + 1] = run - r < 64 ? run - r : 64;
            blocks[4 * nb + 2] = i;
            blocks[4 * nb + 3] = 0;
            nb++;
        }
        max_pos = len - 1 > max_pos ? len - 1 : max_pos;
    }
    void *kimg = cache_image(kv, k, vals, 2.0f), *vimg = cache_image(kv, v, vals, 1.0f);
    for (int i = 0; i < n * q_dim; i++)
        q[i] = test_rand_float(-1.5f, 1.5f);
    const size_t elem = bn_cb_kv_bytes(kv);
    void *dk, *dv;
    float *dq, *dout;
    int32_t *dtab, *dpos, *dblocks;
    void *dws = NULL;
    const bn_cb_attn_shape as = {s->n_heads, s->n_kv, s->hd, max_len};
    const size_t ws_bytes = bn_cb_attn_prefill_workspace_bytes(&as, n, parts);
    CUDA_OK(cudaMalloc(&dk, elem * vals));
    CUDA_OK(cudaMalloc(&dv, elem * vals));
    CUDA_OK(cudaMalloc((void **)&dq, sizeof(float) * (size_t)(n * q_dim)));
    CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)((n + 1) * q_dim)));
    CUDA_OK(cudaMalloc((void **)&dtab, sizeof(int32_t) * (size_t)n_blocks));
    CUDA_OK(cudaMalloc((void **)&dpos, sizeof(int32_t) * (size_t)n));
    CUDA_OK(cudaMalloc((void **)&dblocks, sizeof(int32_t) * 4 * (size_t)nb));
    if (ws_bytes)
        CUDA_OK(cudaMalloc(&dws, ws_bytes));
    CUDA_OK(cudaMemcpy(dk, kimg, elem * vals, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, vimg, elem * vals, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dq, q, sizeof(float) * (size_t)(n * q_dim), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dtab, tables, sizeof(int32_t) * (size_t)n_blocks, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dpos, pos, sizeof(int32_t) * (size_t)n, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dblocks, blocks, sizeof(int32_t) * 4 * (size_t)nb, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dout, 0xff, sizeof(float) * (size_t)((n + 1) * q_dim)));
    CUDA_OK(bn_cb_attn_prefill_runs(&as, dq, q_dim, n, dpos, dblocks, nb, dtab, max_blocks, s->bs,
                                    dk, dv, kv, dout, q_dim, parts, dws, ws_bytes, 0));
    CUDA_OK(cudaMemcpy(got, dout, sizeof(float) * (size_t)((n + 1) * q_dim),
                       cudaMemcpyDeviceToHost));
    double worst = 0.0;
    int untouched = 0;
    for (int i = 0; i < n; i++) {
        if (seq_of[i] < 0) {
            uint32_t w;
            memcpy(&w, got + (size_t)i * q_dim, sizeof w);
            untouched += w == 0xffffffffu;
            continue;
        }
        worst = fmax(worst, row_error(s, q + (size_t)i * q_dim, pos[i],
                                      tables + seq_of[i] * max_blocks, k, v,
                                      got + (size_t)i * q_dim));
    }
    uint32_t guard;
    memcpy(&guard, got + (size_t)n * q_dim, sizeof guard);
    printf("prefill runs: heads %d/%d hd %d, %s, %d runs of %d rows (%d row blocks) up to %d "
           "positions, %d parts: worst error %.2e\n",
           s->n_heads, s->n_kv, s->hd, kv_name(kv), n_seqs, run, nb, max_pos + 1, parts, worst);
    CHECK_MSG(worst <= 1e-5, "worst error %g", worst);
    CHECK_MSG(untouched == n_seqs, "%d of the %d rows in no run were written", n_seqs - untouched,
              n_seqs);
    CHECK(guard == 0xffffffffu);
    CHECK(bn_cb_attn_prefill_runs(&as, dq, q_dim, n, dpos, dblocks, nb, NULL, max_blocks, s->bs, dk,
                                  dv, kv, dout, q_dim, 1, NULL, 0, 0) == cudaErrorInvalidValue);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dtab);
    cudaFree(dpos);
    cudaFree(dblocks);
    cudaFree(dws);
    free(tables);
    free(pos);
    free(seq_of);
    free(blocks);
    free(k);
    free(v);
    free(kimg);
    free(vimg);
    free(q);
    free(got);
}

/* The attention's shares combined by the norm (bn_cb_attn_paged_shares,
 * then bn_cb_merge_norm_quantize) give the codes, scales and sums of the
 * attention with its merge followed by bn_cb_norm_quantize, bit for bit. */
static void check_merge_norm(const bn_cb_attn_shape *as, const float *dq, int q_dim, int n_rows,
                             const int32_t *dseq, const int32_t *dpos, const int32_t *dtab,
                             int max_blocks, int bs, const void *dk, const void *dv, int kv,
                             int splits, float *dout, float *dws)
{
    const int64_t ldq = q_dim + 32; /* padding: zero-filled by both */
    const size_t codes = (size_t)n_rows * (size_t)ldq;
    float *w = malloc(sizeof(float) * (size_t)q_dim);
    int8_t *qa = malloc(codes), *qb = malloc(codes);
    float *sa = malloc(sizeof(float) * (size_t)n_rows),
          *sb = malloc(sizeof(float) * (size_t)n_rows);
    int32_t *ua = malloc(sizeof(int32_t) * (size_t)n_rows),
            *ub = malloc(sizeof(int32_t) * (size_t)n_rows);
    CHECK(w && qa && qb && sa && sb && ua && ub);
    for (int i = 0; i < q_dim; i++)
        w[i] = test_rand_float(0.5f, 1.5f);
    float *dw, *dscale;
    int8_t *dcodes;
    int32_t *dsum;
    CUDA_OK(cudaMalloc((void **)&dw, sizeof(float) * (size_t)q_dim));
    CUDA_OK(cudaMemcpy(dw, w, sizeof(float) * (size_t)q_dim, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&dcodes, codes));
    CUDA_OK(cudaMalloc((void **)&dscale, sizeof(float) * (size_t)n_rows));
    CUDA_OK(cudaMalloc((void **)&dsum, sizeof(int32_t) * (size_t)n_rows));
    const float eps = 1e-5f;

    CUDA_OK(bn_cb_attn_paged(as, dq, q_dim, n_rows, dseq, dpos, dtab, max_blocks, bs, dk, dv, kv,
                             splits, NULL, dout, q_dim, dws, 0));
    CUDA_OK(
        bn_cb_norm_quantize(dout, q_dim, n_rows, q_dim, dw, eps, dcodes, ldq, dscale, dsum, 0, 0));
    CUDA_OK(cudaMemcpy(qa, dcodes, codes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(sa, dscale, sizeof(float) * (size_t)n_rows, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(ua, dsum, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyDeviceToHost));

    CUDA_OK(cudaMemset(dws, 0xff, bn_cb_attn_paged_workspace_bytes(as->n_heads, as->head_dim)));
    CUDA_OK(cudaMemset(dcodes, 0x5a, codes));
    CUDA_OK(cudaMemset(dscale, 0xff, sizeof(float) * (size_t)n_rows));
    CUDA_OK(cudaMemset(dsum, 0x5a, sizeof(int32_t) * (size_t)n_rows));
    CHECK(bn_cb_merge_norm_fits(dws, as->n_heads, as->head_dim, n_rows, dw, dcodes, ldq));
    CUDA_OK(bn_cb_attn_paged_shares(as, dq, q_dim, n_rows, dseq, dpos, dtab, max_blocks, bs, dk, dv,
                                    kv, splits, dws, 0));
    CUDA_OK(bn_cb_merge_norm_quantize(dws, splits, as->n_heads, as->head_dim, dpos, n_rows, dw, eps,
                                      dcodes, ldq, dscale, dsum, 0));
    CUDA_OK(cudaMemcpy(qb, dcodes, codes, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(sb, dscale, sizeof(float) * (size_t)n_rows, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(ub, dsum, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyDeviceToHost));
    CHECK_MSG(memcmp(qa, qb, codes) == 0 && memcmp(sa, sb, sizeof(float) * (size_t)n_rows) == 0 &&
                  memcmp(ua, ub, sizeof(int32_t) * (size_t)n_rows) == 0,
              "merged in the norm: codes, scales and sums differ from merge + norm");
    printf("  %d splits merged in the norm: codes, scales and sums of %d rows equal merge + norm\n",
           splits, n_rows);
    /* One split has no shares; more rows than the norm's kernel takes are
     * refused, for the caller to merge and norm apart. */
    CHECK(bn_cb_attn_paged_shares(as, dq, q_dim, n_rows, dseq, dpos, dtab, max_blocks, bs, dk, dv,
                                  kv, 1, dws, 0) == cudaErrorInvalidValue);
    CHECK(!bn_cb_merge_norm_fits(dws, as->n_heads, as->head_dim, 257, dw, dcodes, ldq));
    CHECK(bn_cb_merge_norm_quantize(dws, splits, as->n_heads, as->head_dim, dpos, 257, dw, eps,
                                    dcodes, ldq, dscale, dsum, 0) == cudaErrorNotSupported);
    cudaFree(dw);
    cudaFree(dcodes);
    cudaFree(dscale);
    cudaFree(dsum);
    free(w);
    free(qa);
    free(qb);
    free(sa);
    free(sb);
    free(ua);
    free(ub);
}

static void check_case(const shape *s, int n_seqs, int max_len, int kv, int splits_asked)
{
    const int kv_dim = s->n_kv * s->hd, q_dim = s->n_heads * s->hd;
    const int max_blocks = (max_len + s->bs - 1) / s->bs, n_blocks = n_seqs * max_blocks;
    /* Each sequence's length; its rows: the last position, and for every
     * other sequence two earlier ones too (a chunk of its prompt). */
    int *len = malloc(sizeof(int) * (size_t)n_seqs);
    int32_t *tables = malloc(sizeof(int32_t) * (size_t)n_blocks);
    int32_t *order = malloc(sizeof(int32_t) * (size_t)n_blocks);
    int32_t *row_seq = malloc(sizeof(int32_t) * (size_t)(3 * n_seqs));
    int32_t *row_pos = malloc(sizeof(int32_t) * (size_t)(3 * n_seqs));
    CHECK(len && tables && order && row_seq && row_pos);
    for (int i = 0; i < n_blocks; i++)
        order[i] = i;
    for (int i = n_blocks - 1; i > 0; i--) {
        const int j = (int)test_rand_range(0, i);
        const int32_t t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int n_rows = 0, max_pos = 0;
    for (int q = 0; q < n_seqs; q++) {
        len[q] = q == 0 ? 1 : (int)test_rand_range(1, max_len);
        for (int b = 0; b < max_blocks; b++)
            tables[q * max_blocks + b] = b * s->bs < len[q] ? order[q * max_blocks + b] : -1;
        if (q % 2 == 1 && len[q] > 2) {
            row_seq[n_rows] = q;
            row_pos[n_rows++] = len[q] / 3;
            row_seq[n_rows] = q;
            row_pos[n_rows++] = len[q] - 2;
        }
        row_seq[n_rows] = q;
        row_pos[n_rows++] = len[q] - 1;
        max_pos = len[q] - 1 > max_pos ? len[q] - 1 : max_pos;
    }
    const size_t cache_vals = (size_t)n_blocks * (size_t)s->bs * (size_t)kv_dim;
    float *k = malloc(sizeof(float) * cache_vals), *v = malloc(sizeof(float) * cache_vals);
    float *q = malloc(sizeof(float) * (size_t)(n_rows * q_dim));
    float *got = malloc(sizeof(float) * (size_t)((n_rows + 1) * q_dim));
    CHECK(k && v && q && got);
    void *kimg = cache_image(kv, k, cache_vals, 2.0f), *vimg = cache_image(kv, v, cache_vals, 1.0f);
    for (int i = 0; i < n_rows * q_dim; i++)
        q[i] = test_rand_float(-1.5f, 1.5f);

    void *dk, *dv;
    float *dq, *dout, *dws;
    int32_t *dseq, *dpos, *dtab;
    const size_t elem = bn_cb_kv_bytes(kv);
    CUDA_OK(cudaMalloc(&dk, elem * cache_vals));
    CUDA_OK(cudaMalloc(&dv, elem * cache_vals));
    CUDA_OK(cudaMemcpy(dk, kimg, elem * cache_vals, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, vimg, elem * cache_vals, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&dq, sizeof(float) * (size_t)(n_rows * q_dim)));
    CUDA_OK(cudaMemcpy(dq, q, sizeof(float) * (size_t)(n_rows * q_dim), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&dout, sizeof(float) * (size_t)((n_rows + 1) * q_dim)));
    CUDA_OK(cudaMalloc((void **)&dws, bn_cb_attn_paged_workspace_bytes(s->n_heads, s->hd)));
    CUDA_OK(cudaMalloc((void **)&dseq, sizeof(int32_t) * (size_t)n_rows));
    CUDA_OK(cudaMalloc((void **)&dpos, sizeof(int32_t) * (size_t)n_rows));
    CUDA_OK(cudaMalloc((void **)&dtab, sizeof(int32_t) * (size_t)n_blocks));
    CUDA_OK(cudaMemcpy(dseq, row_seq, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dpos, row_pos, sizeof(int32_t) * (size_t)n_rows, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dtab, tables, sizeof(int32_t) * (size_t)n_blocks, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dout, 0xff, sizeof(float) * (size_t)((n_rows + 1) * q_dim))); /* NaN */

    const int splits =
        splits_asked > 0 ? splits_asked : bn_cb_attn_paged_splits(n_rows, max_pos, s->n_kv, 0, kv);
    const bn_cb_attn_shape as = {s->n_heads, s->n_kv, s->hd, 0};
    CUDA_OK(bn_cb_attn_paged(&as, dq, q_dim, n_rows, dseq, dpos, dtab, max_blocks, s->bs, dk, dv,
                             kv, splits, NULL, dout, q_dim, dws, 0));
    CUDA_OK(cudaMemcpy(got, dout, sizeof(float) * (size_t)((n_rows + 1) * q_dim),
                       cudaMemcpyDeviceToHost));

    double worst = 0.0;
    for (int r = 0; r < n_rows; r++)
        worst = fmax(worst, row_error(s, q + (size_t)r * q_dim, row_pos[r],
                                      tables + row_seq[r] * max_blocks, k, v,
                                      got + (size_t)r * q_dim));
    uint32_t guard;
    memcpy(&guard, got + (size_t)n_rows * q_dim, sizeof guard);
    printf("heads %d/%d hd %d, %s, %d rows of %d sequences up to %d positions, %d splits: "
           "worst error %.2e\n",
           s->n_heads, s->n_kv, s->hd, kv_name(kv), n_rows, n_seqs, max_pos + 1, splits, worst);
    /* The e4m3 cache's tensor-core kernel (groups up to 8) rounds q and
     * the weights to fp16. */
    const bool rounded = kv == BN_CB_KV_E4M3 && s->n_heads / s->n_kv <= 8;
    CHECK_MSG(worst <= (rounded ? 1e-3 : 1e-5), "worst error %g", worst);
    CHECK_MSG(guard == 0xffffffffu, "the row past the last was written");
    /* Every other row listed: those rows exactly as before, the others
     * untouched. */
    int32_t *list = malloc(sizeof(int32_t) * (size_t)n_rows), n_list = 0;
    float *again = malloc(sizeof(float) * (size_t)((n_rows + 1) * q_dim));
    CHECK(list && again);
    for (int r = 1; r < n_rows; r += 2)
        list[n_list++] = r;
    int32_t *dlist;
    CUDA_OK(cudaMalloc((void **)&dlist, sizeof(int32_t) * (size_t)(n_list + 1)));
    CUDA_OK(cudaMemcpy(dlist, list, sizeof(int32_t) * (size_t)n_list, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(dout, 0xff, sizeof(float) * (size_t)((n_rows + 1) * q_dim)));
    CUDA_OK(bn_cb_attn_paged(&as, dq, q_dim, n_list, dseq, dpos, dtab, max_blocks, s->bs, dk, dv,
                             kv, splits, dlist, dout, q_dim, dws, 0));
    CUDA_OK(cudaMemcpy(again, dout, sizeof(float) * (size_t)((n_rows + 1) * q_dim),
                       cudaMemcpyDeviceToHost));
    for (int r = 0; r < n_rows; r++) {
        const bool listed = r % 2 == 1;
        uint32_t first;
        memcpy(&first, again + (size_t)r * q_dim, sizeof first);
        CHECK_MSG(listed ? memcmp(again + (size_t)r * q_dim, got + (size_t)r * q_dim,
                                  sizeof(float) * (size_t)q_dim) == 0
                         : first == 0xffffffffu,
                  "row %d (%s) with a row list", r, listed ? "listed" : "not listed");
    }
    /* A launch of the most splits the workspace allows (a captured pass's,
     * sized for the whole context) gives every row exactly what the
     * launcher's choice gives: a row takes the splits its length needs. */
    int most = 64;
    while (most > 1 && most * n_rows > BN_CB_ATTN_PAGED_SHARES)
        most--;
    CUDA_OK(cudaMemset(dout, 0xff, sizeof(float) * (size_t)((n_rows + 1) * q_dim)));
    CUDA_OK(bn_cb_attn_paged(&as, dq, q_dim, n_rows, dseq, dpos, dtab, max_blocks, s->bs, dk, dv,
                             kv, most, NULL, dout, q_dim, dws, 0));
    CUDA_OK(cudaMemcpy(again, dout, sizeof(float) * (size_t)((n_rows + 1) * q_dim),
                       cudaMemcpyDeviceToHost));
    if (splits_asked == 0)
        CHECK_MSG(memcmp(again, got, sizeof(float) * (size_t)(n_rows * q_dim)) == 0,
                  "%d splits and %d give different rows", most, splits);
    cudaFree(dlist);
    free(list);
    free(again);
    if (splits > 1)
        check_merge_norm(&as, dq, q_dim, n_rows, dseq, dpos, dtab, max_blocks, s->bs, dk, dv, kv,
                         splits, dout, dws);
    if (splits > 1) /* no workspace for several splits: refused */
        CHECK(bn_cb_attn_paged(&as, dq, q_dim, n_rows, dseq, dpos, dtab, max_blocks, s->bs, dk, dv,
                               kv, splits, NULL, dout, q_dim, NULL, 0) == cudaErrorInvalidValue);
    cudaFree(dk);
    cudaFree(dv);
    cudaFree(dq);
    cudaFree(dout);
    cudaFree(dws);
    cudaFree(dseq);
    cudaFree(dpos);
    cudaFree(dtab);
    free(len);
    free(tables);
    free(order);
    free(row_seq);
    free(row_pos);
    free(k);
    free(v);
    free(kimg);
    free(vimg);
    free(q);
    free(got);
}

int main(void)
{
    test_require_cuda(0, "");
    const shape s2b = {20, 5, 128, 32}, mha = {4, 4, 64, 16}, wide = {32, 2, 128, 16},
                kjv = {4, 2, 64, 32};
    for (int kv = BN_CB_KV_F32; kv <= BN_CB_KV_E4M3; kv++) {
        check_case(&s2b, 9, 700, kv, 0);  /* the splits the launcher picks */
        check_case(&s2b, 9, 700, kv, 1);  /* one split */
        check_case(&s2b, 5, 300, kv, 13); /* more splits than tiles for short rows */
        check_case(&s2b, 9, 700, kv, 2);  /* fewer splits than the longest rows need */
        check_case(&mha, 7, 200, kv, 0);
        check_case(&mha, 3, 40, kv, 2);
        check_case(&kjv, 6, 150, kv, 0);  /* the shipped model's heads */
        check_case(&wide, 4, 300, kv, 0); /* 16 q heads a kv head: the FMA kernel */
    }
    for (int kv = BN_CB_KV_F32; kv <= BN_CB_KV_E4M3; kv++) {
        check_prefill_runs(&s2b, 1, 300, 77, 1, kv);
        check_prefill_runs(&s2b, 4, 700, 128, 4, kv);
        check_prefill_runs(&mha, 3, 100, 40, 2, kv);
    }
    /* The launcher's ranges: ~128 positions each (at most 64, within the
     * workspace); one where the rows' blocks fill the device alone (792
     * resident); over e4m3 no more than keep every block resident. */
    static const struct {
        int rows, max_pos, resident, kv, want;
    } splits_cases[] = {
        {1, 0, 0, BN_CB_KV_F16, 1},         {64, 575, 0, BN_CB_KV_F16, 5},
        {4096, 100000, 0, BN_CB_KV_F16, 1}, {1, 100000, 0, BN_CB_KV_F16, 64},
        {64, 575, 792, BN_CB_KV_F16, 5},    {158, 575, 792, BN_CB_KV_F16, 5},
        {159, 575, 792, BN_CB_KV_F16, 1},   {159, 575, 792, BN_CB_KV_E4M3, 1},
        {16, 575, 792, BN_CB_KV_E4M3, 5},   {32, 575, 792, BN_CB_KV_E4M3, 4},
        {64, 575, 792, BN_CB_KV_E4M3, 2},   {128, 575, 792, BN_CB_KV_E4M3, 1},
        {64, 575, 0, BN_CB_KV_E4M3, 5},     {0, 575, 792, BN_CB_KV_E4M3, 5},
    };
    for (size_t i = 0; i < sizeof splits_cases / sizeof splits_cases[0]; i++) {
        const int got = bn_cb_attn_paged_splits(splits_cases[i].rows, splits_cases[i].max_pos, 5,
                                                splits_cases[i].resident, splits_cases[i].kv);
        CHECK_MSG(got == splits_cases[i].want, "splits of case %zu: %d, want %d", i, got,
                  splits_cases[i].want);
    }
    /* The blocks resident at once: at least one an SM for the shapes the
     * kernel takes (the fp32 tiles are twice the fp16 ones: no more of
     * them), none for a shape it refuses. */
    int sms = 0;
    CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    const bn_cb_attn_shape as2b = {20, 5, 128, 0}, as96 = {20, 5, 96, 0};
    const int r16 = bn_cb_attn_paged_resident(&as2b, BN_CB_KV_F16, sms),
              r32 = bn_cb_attn_paged_resident(&as2b, BN_CB_KV_F32, sms),
              r8 = bn_cb_attn_paged_resident(&as2b, BN_CB_KV_E4M3, sms);
    printf("paged attention blocks resident at once on %d SMs: fp16 %d, fp32 %d, e4m3 %d\n", sms,
           r16, r32, r8);
    CHECK(r16 >= sms && r32 >= sms && r8 >= sms && r32 <= r16);
    CHECK(bn_cb_attn_paged_resident(&as2b, 3, sms) == 0); /* no such cache element */
    CHECK(bn_cb_attn_paged_resident(&as96, 1, sms) == 0);
    const bn_cb_attn_shape bad = {20, 5, 96, 0};
    float *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, 4096));
    CHECK(bn_cb_attn_paged(&bad, d, 1920, 1, (int32_t *)d, (int32_t *)d, (int32_t *)d, 1, 16, d,
                           d, 0, 1, NULL, d, 1920, NULL, 0) == cudaErrorNotSupported);
    const bn_cb_attn_shape odd = {20, 3, 128, 0};
    CHECK(bn_cb_attn_paged(&odd, d, 2560, 1, (int32_t *)d, (int32_t *)d, (int32_t *)d, 1, 16, d,
                           d, 0, 1, NULL, d, 2560, NULL, 0) == cudaErrorInvalidValue);
    cudaFree(d);
    TEST_EXIT();
}
