/*
 * test_cuda_gemm_fused.c - the mma-rows GEMM with the batched pass's next
 * step in its own kernel, against the launches it replaces, bit for bit,
 * on random ternary weights and int8 rows: the q|k|v epilogue
 * (bn_w2a8_cuda_gemm_qkv) against the GEMM's raw q|k|v rows, then
 * bn_cb_qkv_post_slots (each part's scale, RoPE, k and v into
 * their cache rows):
 *   - q of every row, with q poisoned first (NaN);
 *   - both caches whole: the rows' slots written alike, every other row
 *     still its poison (rows with slot -1 or past the capacity store
 *     nothing);
 *   - head widths 16, 64 and 128 (the 2B-4T heads: 20 q, 5 kv), rope over
 *     the whole head or none, fp32, fp16 and e4m3 caches, 2 to 64 rows;
 *   - every second shape launched with programmatic dependent launch;
 *   - and where it declines without launching: head widths not a multiple
 *     of 16, a rotation over part of the head, more rows than the mma-rows
 *     kernel takes.
 * And the product that adds into the residual stream and codes the next
 * norm (bn_w2a8_cuda_gemm_norm) against the GEMM, then
 * bn_cb_add_norm_quantize: x bit for bit, the codes' whole rows (their
 * zero tail over a poisoned buffer, read and written in place as the
 * batched pass does), the code sums, the scales within an ulp (the double
 * sum of squares is added in another order); a row of zeros (the plain
 * rule), 2 to 64 rows, ragged k, the Wo and Wdown shapes of 2B-4T, and a
 * width it declines.
 *
 * Exits 77 without a usable GPU.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_kernels.h"
#include "cuda_layout.h"
#include "ops_cuda.h"
#include "test_util.h"
#include "test_util_cuda.h"
#include "w2a8_cuda.h"

static int sm_count;
static bool pdl_usable; /* programmatic dependent launch here (compute capability 9.0) */

typedef struct shape {
    int n_heads, n_kv, head_dim, rope_dim;
    int64_t k, m;
    int kv; /* BN_CB_KV_* */
} shape;

/* Count of bytes of a and b (n bytes each) that differ; the first at *first. */
static int64_t count_diff(const void *a, const void *b, size_t n, int64_t *first)
{
    const unsigned char *x = a, *y = b;
    int64_t diff = 0;
    *first = -1;
    for (size_t i = 0; i < n; i++)
        if (x[i] != y[i] && diff++ == 0)
            *first = (int64_t)i;
    return diff;
}

/* The e4m3 caches' stored bytes against the same epilogue into fp32
 * caches: each the fp32 value rounded to nearest (within half a step:
 * 2^-4 of its magnitude, 2^-10 among the subnormals), saturated at 448. */
static void check_e4m3_rows(const shape *sh, const float *d_raw, int64_t n,
                            const bn_rope_freqs *freqs, const float *d_table, int64_t table_len,
                            const int32_t *d_pos, const int32_t *d_slot, int64_t capacity,
                            const float scales[3], const unsigned char *k8, const unsigned char *v8)
{
    const int hd = sh->head_dim;
    const int64_t q_dim = (int64_t)sh->n_heads * hd, kv_dim = (int64_t)sh->n_kv * hd;
    const size_t vals = (size_t)(capacity * kv_dim);
    float *d_q, *d_k, *d_v;
    CUDA_OK(cudaMalloc((void **)&d_q, sizeof(float) * (size_t)(sh->m * q_dim)));
    CUDA_OK(cudaMalloc((void **)&d_k, sizeof(float) * vals));
    CUDA_OK(cudaMalloc((void **)&d_v, sizeof(float) * vals));
    CUDA_OK(cudaMemset(d_k, 0, sizeof(float) * vals));
    CUDA_OK(cudaMemset(d_v, 0, sizeof(float) * vals));
    const bn_cb_qkv_shape qs = {sh->n_heads, sh->n_kv,  hd,       capacity,
                                scales[0],   scales[1], scales[2]};
    CUDA_OK(bn_cb_qkv_post_slots(d_raw, n, sh->m, &qs, freqs, d_table,
                                 sh->rope_dim > 0 ? table_len : 0, d_pos, d_slot, d_q, q_dim, d_k,
                                 d_v, BN_CB_KV_F32, 0));
    float *k = malloc(sizeof(float) * vals), *v = malloc(sizeof(float) * vals);
    CHECK(k && v);
    CUDA_OK(cudaMemcpy(k, d_k, sizeof(float) * vals, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(v, d_v, sizeof(float) * vals, cudaMemcpyDeviceToHost));
    int64_t bad = 0, checked = 0;
    for (int pass = 0; pass < 2; pass++) {
        const float *want = pass ? v : k;
        const unsigned char *got = pass ? v8 : k8;
        for (size_t i = 0; i < vals; i++) {
            if (want[i] == 0.0f)
                continue; /* a row not stored (its poison in the e4m3 cache) */
            const float x = want[i], mag = fabsf(x) > 448.0f ? 448.0f : fabsf(x);
            const float step = mag < ldexpf(1.0f, -6) ? ldexpf(1.0f, -10) : mag / 16.0f;
            const float y = test_e4m3_value(got[i]);
            bad += !(fabsf(y - copysignf(mag, x)) <= step) || got[i] == 0x7f || got[i] == 0xff;
            checked++;
        }
    }
    CHECK_MSG(bad == 0 && checked > 0, "e4m3 caches: %lld of %lld values not the rounded fp32",
              (long long)bad, (long long)checked);
    cudaFree(d_q), cudaFree(d_k), cudaFree(d_v);
    free(k), free(v);
}

static void check_qkv(const shape *sh)
{
    const int hd = sh->head_dim;
    const int64_t q_dim = (int64_t)sh->n_heads * hd, kv_dim = (int64_t)sh->n_kv * hd;
    const int64_t n = q_dim + 2 * kv_dim, k = sh->k, m = sh->m;
    const int64_t capacity = 4 * m + 7, table_len = 300;

    /* Weights, activations as quantized rows, positions and slots: distinct
     * cache rows, some -1 or past the capacity (stored nowhere). */
    int8_t *codes = malloc((size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++)
        codes[i] = (int8_t)test_rand_range(-1, 1);
    bn_cuda_layout l;
    bn_cuda_layout_init(&l, n, k);
    uint8_t *packed = malloc(l.bytes);
    bn_cuda_layout_pack(&l, codes, packed);
    int8_t *xq = calloc((size_t)(m * l.k_padded), 1);
    float *act_scale = malloc(sizeof(float) * (size_t)m);
    int32_t *act_sum = malloc(sizeof(int32_t) * (size_t)m);
    int32_t *pos = malloc(sizeof(int32_t) * (size_t)m), *slot = malloc(sizeof(int32_t) * (size_t)m);
    for (int64_t r = 0; r < m; r++) {
        int32_t total = 0;
        const int amax = (int)test_rand_range(1, 127);
        for (int64_t c = 0; c < k; c++) {
            xq[r * l.k_padded + c] = (int8_t)test_rand_range(-amax, amax);
            total += xq[r * l.k_padded + c];
        }
        act_sum[r] = total;
        act_scale[r] = 127.0f / test_rand_float(0.05f, 20.0f);
        pos[r] = (int32_t)test_rand_range(0, table_len - 1);
        const int64_t kind = test_rand_range(0, 9);
        slot[r] = kind == 0 ? -1 : kind == 1 ? (int32_t)(capacity + r) : (int32_t)(4 * r + 1);
    }
    const float scales[3] = {test_rand_float(0.5f, 2.0f), test_rand_float(0.5f, 2.0f),
                             test_rand_float(0.5f, 2.0f)};

    void *d_w;
    int8_t *d_x;
    float *d_scale, *d_raw, *d_q, *d_table = NULL;
    int32_t *d_sum, *d_pos, *d_slot;
    const size_t elem = bn_cb_kv_bytes(sh->kv);
    const size_t cache_bytes = (size_t)(capacity * kv_dim) * elem;
    void *d_cache[4]; /* reference k, v; fused k, v */
    CUDA_OK(cudaMalloc(&d_w, l.bytes));
    CUDA_OK(cudaMemcpy(d_w, packed, l.bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_x, (size_t)(m * l.k_padded)));
    CUDA_OK(cudaMemcpy(d_x, xq, (size_t)(m * l.k_padded), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_scale, sizeof(float) * (size_t)m));
    CUDA_OK(cudaMemcpy(d_scale, act_scale, sizeof(float) * (size_t)m, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_sum, sizeof(int32_t) * (size_t)m));
    CUDA_OK(cudaMemcpy(d_sum, act_sum, sizeof(int32_t) * (size_t)m, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_pos, sizeof(int32_t) * (size_t)m));
    CUDA_OK(cudaMemcpy(d_pos, pos, sizeof(int32_t) * (size_t)m, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_slot, sizeof(int32_t) * (size_t)m));
    CUDA_OK(cudaMemcpy(d_slot, slot, sizeof(int32_t) * (size_t)m, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_raw, sizeof(float) * (size_t)(m * n)));
    CUDA_OK(cudaMalloc((void **)&d_q, sizeof(float) * (size_t)(2 * m * q_dim)));
    for (int i = 0; i < 4; i++) {
        CUDA_OK(cudaMalloc(&d_cache[i], cache_bytes));
        CUDA_OK(cudaMemset(d_cache[i], 0xa5, cache_bytes)); /* poison, alike in all four */
    }
    CUDA_OK(cudaMemset(d_q, 0xff, sizeof(float) * (size_t)(2 * m * q_dim))); /* NaN */
    bn_rope_freqs freqs = {0};
    if (sh->rope_dim > 0) {
        CUDA_OK(bn_rope_freqs_init(&freqs, 10000.0f, sh->rope_dim));
        CUDA_OK(cudaMalloc((void **)&d_table, sizeof(float) * (size_t)(table_len * sh->rope_dim)));
        CUDA_OK(bn_cb_rope_table(&freqs, table_len, d_table, 0));
    }

    bn_w2a8_cuda_args a = {.weights = d_w,
                           .n = n,
                           .tiles = l.tiles,
                           .groups = l.groups,
                           .weight_scale = 1.0f,
                           .x = d_x,
                           .m = m,
                           .ldx = l.k_padded,
                           .act_scale = d_scale,
                           .act_sum = d_sum,
                           .y = d_raw,
                           .ldy = n,
                           .sm_count = sm_count};
    const bn_w2a8_qkv_out o = {sh->n_heads, sh->n_kv,        hd,      sh->rope_dim, scales[0],
                               scales[1],   scales[2],       d_table, table_len,    d_pos,
                               d_slot,      d_q + m * q_dim, q_dim,   d_cache[2],   d_cache[3],
                               capacity,    sh->kv};
    /* The fused kernel writes its own q and caches: it may run first,
     * every second shape launched with programmatic dependent launch (its
     * weights loaded before its wait) where the device has it. */
    static int turn;
    a.pdl = pdl_usable && turn++ % 2 == 1;
    const cudaError_t rc = bn_w2a8_cuda_gemm_qkv(&a, &o, 0);
    a.pdl = 0;
    CHECK_MSG(rc == cudaSuccess || rc == cudaErrorNotSupported, "bn_w2a8_cuda_gemm_qkv: %s",
              cudaGetErrorString(rc));
    const bool fits = rc == cudaSuccess;
    const bool want_fit =
        hd % 16 == 0 && (sh->rope_dim == 0 || sh->rope_dim == hd) &&
        bn_w2a8_cuda_gemm_pick(m, n, l.groups * BN_CUDA_GROUP, bn_w2a8_cuda_gemm_wgmma_usable(),
                               sm_count, 0) == BN_W2A8_MMA_ROWS_X2;
    CHECK_MSG(fits == want_fit, "heads %d/%d of %d, rope %d, m %lld: fits %d, want %d", sh->n_heads,
              sh->n_kv, hd, sh->rope_dim, (long long)m, fits, want_fit);
    if (fits) {
        /* The reference: the GEMM's raw rows, then the epilogue kernel. */
        CUDA_OK(bn_w2a8_cuda_gemm_run(&a, BN_W2A8_MMA_ROWS_X2, 0));
        const bn_cb_qkv_shape qs = {sh->n_heads, sh->n_kv,  hd,       capacity,
                                    scales[0],   scales[1], scales[2]};
        CUDA_OK(bn_cb_qkv_post_slots(d_raw, n, m, &qs, &freqs, d_table,
                                     sh->rope_dim > 0 ? table_len : 0, d_pos, d_slot, d_q, q_dim,
                                     d_cache[0], d_cache[1], sh->kv, 0));
        CUDA_OK(cudaDeviceSynchronize());

        float *q = malloc(sizeof(float) * (size_t)(2 * m * q_dim));
        CUDA_OK(
            cudaMemcpy(q, d_q, sizeof(float) * (size_t)(2 * m * q_dim), cudaMemcpyDeviceToHost));
        int64_t first;
        int64_t diff = count_diff(q, q + m * q_dim, sizeof(float) * (size_t)(m * q_dim), &first);
        CHECK_MSG(diff == 0,
                  "q, heads %d/%d of %d, rope %d, m %lld: %lld bytes differ (first at %lld)",
                  sh->n_heads, sh->n_kv, hd, sh->rope_dim, (long long)m, (long long)diff,
                  (long long)first);
        int64_t nan = 0;
        for (int64_t i = 0; i < m * q_dim; i++)
            nan += q[i] != q[i];
        CHECK_MSG(nan == 0, "q: %lld values not written", (long long)nan);
        unsigned char *c[4];
        for (int i = 0; i < 4; i++) {
            c[i] = malloc(cache_bytes);
            CUDA_OK(cudaMemcpy(c[i], d_cache[i], cache_bytes, cudaMemcpyDeviceToHost));
        }
        for (int i = 0; i < 2; i++) {
            diff = count_diff(c[i], c[i + 2], cache_bytes, &first);
            CHECK_MSG(diff == 0,
                      "%s cache (%s), heads %d/%d of %d, rope %d, m %lld: %lld bytes differ "
                      "(first at %lld)",
                      i ? "v" : "k",
                      sh->kv == BN_CB_KV_E4M3  ? "e4m3"
                      : sh->kv == BN_CB_KV_F16 ? "fp16"
                                               : "fp32",
                      sh->n_heads, sh->n_kv, hd, sh->rope_dim, (long long)m, (long long)diff,
                      (long long)first);
        }
        /* The reference stored something: a stored row is not its poison. */
        int64_t stored = 0;
        for (int64_t r = 0; r < m; r++)
            if (slot[r] >= 0 && slot[r] < capacity)
                stored += memcmp(c[0] + (size_t)(slot[r] * kv_dim) * elem,
                                 c[0] + (size_t)(0 * kv_dim) * elem, (size_t)kv_dim * elem) != 0;
        CHECK_MSG(stored > 0 || m < 3, "no row stored in the k cache");
        if (sh->kv == BN_CB_KV_E4M3)
            check_e4m3_rows(sh, d_raw, n, &freqs, d_table, table_len, d_pos, d_slot, capacity,
                            scales, c[0], c[1]);
        for (int i = 0; i < 4; i++)
            free(c[i]);
        free(q);
    }
    for (int i = 0; i < 4; i++)
        cudaFree(d_cache[i]);
    cudaFree(d_w), cudaFree(d_x), cudaFree(d_scale), cudaFree(d_sum), cudaFree(d_pos);
    cudaFree(d_slot), cudaFree(d_raw), cudaFree(d_q), cudaFree(d_table);
    free(codes), free(packed), free(xq), free(act_scale), free(act_sum), free(pos), free(slot);
}

/* Bytes of n floats whose bits differ by more than one ulp (as integers). */
static int64_t count_ulp_diff(const float *a, const float *b, int64_t n)
{
    int64_t diff = 0;
    for (int64_t i = 0; i < n; i++) {
        int32_t x, y;
        memcpy(&x, a + i, 4);
        memcpy(&y, b + i, 4);
        diff += llabs((long long)x - (long long)y) > 1;
    }
    return diff;
}

static void check_norm(int64_t n, int64_t k, int64_t m, bool want_fit)
{
    bn_cuda_layout l;
    bn_cuda_layout_init(&l, n, k);
    const int64_t ldq = (l.k_padded > n ? l.k_padded : n) + 256; /* a tail past both */
    int8_t *codes = malloc((size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++)
        codes[i] = (int8_t)test_rand_range(-1, 1);
    uint8_t *packed = malloc(l.bytes);
    bn_cuda_layout_pack(&l, codes, packed);
    /* Input codes zero from k to k_padded, poison beyond; row `zero` all
     * zeros, with a zero residual: its norm takes the plain rule. */
    const int64_t zero = m / 2;
    int8_t *xq = malloc((size_t)(m * ldq));
    memset(xq, 0x5a, (size_t)(m * ldq));
    float *act_scale = malloc(sizeof(float) * (size_t)m),
          *x = malloc(sizeof(float) * (size_t)(m * n));
    int32_t *act_sum = malloc(sizeof(int32_t) * (size_t)m);
    float *g = malloc(sizeof(float) * (size_t)n);
    for (int64_t r = 0; r < m; r++) {
        int32_t total = 0;
        const int amax = r == zero ? 0 : (int)test_rand_range(1, 127);
        for (int64_t c = 0; c < l.k_padded; c++) {
            const int8_t v = c < k ? (int8_t)test_rand_range(-amax, amax) : 0;
            xq[r * ldq + c] = v;
            total += v;
        }
        act_sum[r] = total;
        act_scale[r] = 127.0f / test_rand_float(0.05f, 20.0f);
        for (int64_t c = 0; c < n; c++)
            x[r * n + c] = r == zero ? 0.0f : test_rand_float(-3.0f, 3.0f);
    }
    for (int64_t c = 0; c < n; c++)
        g[c] = test_rand_float(0.2f, 2.0f);
    const float w_scale = test_rand_float(0.5f, 2.0f), eps = 1e-5f;

    /* [0]: the reference's, [1]: the fused kernel's (in place). */
    void *d_w;
    int8_t *d_q[2], *d_xq;
    float *d_x[2], *d_scale[2], *d_y, *d_g;
    int32_t *d_sum[2];
    CUDA_OK(cudaMalloc(&d_w, l.bytes));
    CUDA_OK(cudaMemcpy(d_w, packed, l.bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_xq, (size_t)(m * ldq)));
    CUDA_OK(cudaMemcpy(d_xq, xq, (size_t)(m * ldq), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_y, sizeof(float) * (size_t)(m * n)));
    CUDA_OK(cudaMalloc((void **)&d_g, sizeof(float) * (size_t)n));
    CUDA_OK(cudaMemcpy(d_g, g, sizeof(float) * (size_t)n, cudaMemcpyHostToDevice));
    for (int i = 0; i < 2; i++) {
        CUDA_OK(cudaMalloc((void **)&d_q[i], (size_t)(m * ldq)));
        CUDA_OK(cudaMemcpy(d_q[i], xq, (size_t)(m * ldq), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMalloc((void **)&d_x[i], sizeof(float) * (size_t)(m * n)));
        CUDA_OK(cudaMemcpy(d_x[i], x, sizeof(float) * (size_t)(m * n), cudaMemcpyHostToDevice));
        CUDA_OK(cudaMalloc((void **)&d_scale[i], sizeof(float) * (size_t)m));
        CUDA_OK(
            cudaMemcpy(d_scale[i], act_scale, sizeof(float) * (size_t)m, cudaMemcpyHostToDevice));
        CUDA_OK(cudaMalloc((void **)&d_sum[i], sizeof(int32_t) * (size_t)m));
        CUDA_OK(cudaMemcpy(d_sum[i], act_sum, sizeof(int32_t) * (size_t)m, cudaMemcpyHostToDevice));
    }

    bn_w2a8_cuda_args a = {.weights = d_w,
                           .n = n,
                           .tiles = l.tiles,
                           .groups = l.groups,
                           .weight_scale = w_scale,
                           .x = d_q[1],
                           .m = m,
                           .ldx = ldq,
                           .act_scale = d_scale[1],
                           .act_sum = d_sum[1],
                           .ldy = n,
                           .sm_count = sm_count};
    const bn_w2a8_norm_out o = {d_x[1], n, d_g, eps, d_q[1], ldq, d_scale[1], d_sum[1]};
    static int turn;
    a.pdl = pdl_usable && turn++ % 2 == 1;
    const cudaError_t rc = bn_w2a8_cuda_gemm_norm(&a, &o, 0);
    CHECK_MSG(rc == cudaSuccess || rc == cudaErrorNotSupported, "bn_w2a8_cuda_gemm_norm: %s",
              cudaGetErrorString(rc));
    const bool fits = rc == cudaSuccess;
    CHECK_MSG(fits == want_fit && fits == (bn_w2a8_cuda_gemm_norm_fits(&a, &o) != 0),
              "%lld x %lld, m %lld: fits %d, want %d", (long long)n, (long long)k, (long long)m,
              fits, want_fit);
    if (fits) {
        /* The reference: the GEMM from the untouched input, then the norm. */
        a.pdl = 0;
        a.x = d_xq;
        a.act_scale = d_scale[0];
        a.act_sum = d_sum[0];
        a.y = d_y;
        CUDA_OK(bn_w2a8_cuda_gemm(&a, 0));
        CUDA_OK(bn_cb_add_norm_quantize(d_x[0], n, d_y, n, m, n, d_g, eps, d_q[0], ldq, d_scale[0],
                                        d_sum[0], 0, 0));
        CUDA_OK(cudaDeviceSynchronize());
        float *xs[2], *sc[2];
        int8_t *qs[2];
        int32_t *sums[2];
        for (int i = 0; i < 2; i++) {
            xs[i] = malloc(sizeof(float) * (size_t)(m * n));
            sc[i] = malloc(sizeof(float) * (size_t)m);
            qs[i] = malloc((size_t)(m * ldq));
            sums[i] = malloc(sizeof(int32_t) * (size_t)m);
            CUDA_OK(
                cudaMemcpy(xs[i], d_x[i], sizeof(float) * (size_t)(m * n), cudaMemcpyDeviceToHost));
            CUDA_OK(
                cudaMemcpy(sc[i], d_scale[i], sizeof(float) * (size_t)m, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(qs[i], d_q[i], (size_t)(m * ldq), cudaMemcpyDeviceToHost));
            CUDA_OK(
                cudaMemcpy(sums[i], d_sum[i], sizeof(int32_t) * (size_t)m, cudaMemcpyDeviceToHost));
        }
        int64_t first;
        int64_t diff = count_diff(xs[0], xs[1], sizeof(float) * (size_t)(m * n), &first);
        CHECK_MSG(diff == 0, "x, %lld x %lld, m %lld: %lld bytes differ (first at %lld)",
                  (long long)n, (long long)k, (long long)m, (long long)diff, (long long)first);
        diff = count_diff(qs[0], qs[1], (size_t)(m * ldq), &first);
        CHECK_MSG(diff == 0, "codes, %lld x %lld, m %lld: %lld bytes differ (first at %lld)",
                  (long long)n, (long long)k, (long long)m, (long long)diff, (long long)first);
        diff = count_diff(sums[0], sums[1], sizeof(int32_t) * (size_t)m, &first);
        CHECK_MSG(diff == 0, "code sums, %lld x %lld, m %lld: %lld bytes differ", (long long)n,
                  (long long)k, (long long)m, (long long)diff);
        diff = count_ulp_diff(sc[0], sc[1], m);
        CHECK_MSG(diff == 0, "scales, %lld x %lld, m %lld: %lld beyond an ulp", (long long)n,
                  (long long)k, (long long)m, (long long)diff);
        /* The tail past n is zero, the poison gone; the zero row's codes 0. */
        int64_t tail = 0, zero_codes = 0;
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = n; c < ldq; c++)
                tail += qs[1][r * ldq + c] != 0;
        for (int64_t c = 0; c < n; c++)
            zero_codes += qs[1][zero * ldq + c] != 0;
        CHECK_MSG(tail == 0 && zero_codes == 0, "tail %lld, zero row %lld nonzero codes",
                  (long long)tail, (long long)zero_codes);
        for (int i = 0; i < 2; i++)
            free(xs[i]), free(sc[i]), free(qs[i]), free(sums[i]);
    }
    for (int i = 0; i < 2; i++)
        cudaFree(d_q[i]), cudaFree(d_x[i]), cudaFree(d_scale[i]), cudaFree(d_sum[i]);
    cudaFree(d_w), cudaFree(d_xq), cudaFree(d_y), cudaFree(d_g);
    free(codes), free(packed), free(xq), free(act_scale), free(x), free(act_sum), free(g);
}

int main(void)
{
    const struct cudaDeviceProp prop = test_require_cuda(8, "the mma-rows GEMM");
    sm_count = prop.multiProcessorCount;
    pdl_usable = prop.major >= 9 && bn_w2a8_cuda_gemv_pdl_compiled();
    static const shape shapes[] = {
        /* the 2B-4T heads at the batched pass's row counts */
        {20, 5, 128, 128, 2560, 64, 1},
        {20, 5, 128, 128, 2560, 17, 1},
        {20, 5, 128, 128, 2560, 4, 0},
        {20, 5, 128, 128, 2560, 33, 0},
        {20, 5, 128, 128, 2560, 64, 2},
        {20, 5, 128, 128, 2560, 5, 2},
        /* narrow and middle heads, ragged k, no rotation */
        {4, 2, 16, 16, 300, 9, 1},
        {4, 2, 16, 16, 300, 64, 0},
        {6, 3, 64, 64, 1000, 24, 1},
        {6, 3, 64, 0, 1000, 12, 1},
        {6, 3, 64, 64, 1000, 40, 2},
        /* declined: heads of 8, rotation over half a head, many rows */
        {4, 2, 8, 8, 256, 8, 1},
        {4, 2, 64, 32, 256, 8, 1},
        {20, 5, 128, 128, 2560, 200, 1},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_qkv(&shapes[i]);

    /* The product with the residual add and the next norm: where the
     * device launches clusters (sm_90), else it declines everywhere. */
    const bool clusters = prop.major >= 9;
    static const int64_t norm_shapes[][3] = {
        {2560, 2560, 64}, {2560, 6912, 64}, {2560, 6912, 17}, {2560, 2560, 8},
        {2560, 2560, 2},  {384, 1000, 13},  {1024, 300, 40},  {1024, 300, 1},
    };
    for (size_t i = 0; i < sizeof norm_shapes / sizeof norm_shapes[0]; i++)
        check_norm(norm_shapes[i][0], norm_shapes[i][1], norm_shapes[i][2], clusters);
    check_norm(200, 512, 8, false); /* not whole clusters' columns */

    TEST_EXIT();
}
