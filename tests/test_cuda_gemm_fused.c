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
 * And the batched down product as int32 sums (bn_w2a8_cuda_gemm_add_sums)
 * finished by the next norm (bn_cb_add_sums_norm_quantize) against the
 * table's GEMM and bn_cb_add_norm_quantize: x, the codes, their scales and
 * sums bit for bit, the sums left zero; twice on the same accumulator;
 * 49-64 rows, the 2B-4T down shape and ragged ones; declined (nothing
 * launched) at 48 rows and columns not a multiple of 4.
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

/* A device copy of n bytes of h. */
static void *upload(const void *h, size_t n)
{
    void *d = NULL;
    CUDA_OK(cudaMalloc(&d, n));
    CUDA_OK(cudaMemcpy(d, h, n, cudaMemcpyHostToDevice));
    return d;
}

/* Whether n bytes at device address d equal h's; counts a failure if not. */
static void expect_bytes(const void *d, const void *h, size_t n, const char *what, int64_t rows,
                         int64_t cols, int64_t k)
{
    void *got = malloc(n);
    CUDA_OK(cudaMemcpy(got, d, n, cudaMemcpyDeviceToHost));
    int64_t first;
    const int64_t diff = count_diff(got, h, n, &first);
    CHECK_MSG(diff == 0,
              "down sums, %s, %lld x %lld rows, k %lld: %lld bytes differ (first at %lld)", what,
              (long long)rows, (long long)cols, (long long)k, (long long)diff, (long long)first);
    free(got);
}

/* The down product of m rows (n outputs, k inputs) and the next norm: the
 * sums path against the GEMM and bn_cb_add_norm_quantize. */
static void check_down_sums(int64_t n, int64_t k, int64_t m, bool pdl)
{
    int8_t *codes = malloc((size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++)
        codes[i] = (int8_t)test_rand_range(-1, 1);
    bn_cuda_layout l;
    bn_cuda_layout_init(&l, n, k);
    uint8_t *packed = malloc(l.bytes);
    bn_cuda_layout_pack(&l, codes, packed);
    int8_t *xq = calloc((size_t)(m * l.k_padded), 1);
    float *act_scale = malloc(sizeof(float) * (size_t)m),
          *x = malloc(sizeof(float) * (size_t)(m * n));
    float *w = malloc(sizeof(float) * (size_t)n);
    int32_t *act_sum = malloc(sizeof(int32_t) * (size_t)m);
    for (int64_t r = 0; r < m; r++) {
        int32_t total = 0;
        const int amax = (int)test_rand_range(1, 127);
        for (int64_t c = 0; c < k; c++) {
            xq[r * l.k_padded + c] = (int8_t)test_rand_range(-amax, amax);
            total += xq[r * l.k_padded + c];
        }
        act_sum[r] = total;
        act_scale[r] = 127.0f / test_rand_float(0.05f, 20.0f);
        for (int64_t c = 0; c < n; c++)
            x[r * n + c] = test_rand_float(-3.0f, 3.0f);
    }
    for (int64_t c = 0; c < n; c++)
        w[c] = test_rand_float(0.5f, 1.5f);
    const float w_scale = test_rand_float(0.5f, 2.0f);

    void *d_w = upload(packed, l.bytes);
    int8_t *d_x = upload(xq, (size_t)(m * l.k_padded));
    float *d_w_norm = upload(w, sizeof(float) * (size_t)n);
    /* reference: x, scales and sums read by the GEMM, written by the norm */
    float *d_xr = upload(x, sizeof(float) * (size_t)(m * n));
    float *d_scale = upload(act_scale, sizeof(float) * (size_t)m);
    int32_t *d_sum = upload(act_sum, sizeof(int32_t) * (size_t)m);
    /* the sums path: one scale and sum array, read, then overwritten */
    float *d_xs = upload(x, sizeof(float) * (size_t)(m * n));
    float *d_scale_s = upload(act_scale, sizeof(float) * (size_t)m);
    int32_t *d_sum_s = upload(act_sum, sizeof(int32_t) * (size_t)m);
    float *d_y, *d_scale_r;
    int32_t *d_sum_r, *d_acc;
    int8_t *d_qr, *d_qs;
    CUDA_OK(cudaMalloc((void **)&d_y, sizeof(float) * (size_t)(m * n)));
    CUDA_OK(cudaMalloc((void **)&d_scale_r, sizeof(float) * (size_t)m));
    CUDA_OK(cudaMalloc((void **)&d_sum_r, sizeof(int32_t) * (size_t)m));
    CUDA_OK(cudaMalloc((void **)&d_acc, sizeof(int32_t) * (size_t)(m * n)));
    CUDA_OK(cudaMemset(d_acc, 0, sizeof(int32_t) * (size_t)(m * n)));
    CUDA_OK(cudaMalloc((void **)&d_qr, (size_t)(m * n)));
    CUDA_OK(cudaMalloc((void **)&d_qs, (size_t)(m * n)));
    CUDA_OK(cudaMemset(d_qs, 0x7f, (size_t)(m * n))); /* poison */

    bn_w2a8_cuda_args a;
    memset(&a, 0, sizeof a);
    a.weights = d_w;
    a.n = n;
    a.tiles = l.tiles;
    a.groups = l.groups;
    a.weight_scale = w_scale;
    a.x = d_x;
    a.m = m;
    a.ldx = l.k_padded;
    a.act_scale = d_scale;
    a.act_sum = d_sum;
    a.y = d_y;
    a.ldy = n;
    a.sm_count = sm_count;
    a.pdl = pdl;
    /* sm_90 code on an sm_90 device, as for PDL */
    const bool want = m >= 49 && m <= 64 && n % 4 == 0 && pdl_usable;
    const int fits = bn_w2a8_cuda_gemm_add_sums_fits(m, n, l.groups, sm_count);
    CHECK_MSG(fits == want, "down sums, %lld x %lld rows: fits %d, want %d", (long long)n,
              (long long)m, fits, want);
    if (!want) {
        CHECK(bn_w2a8_cuda_gemm_add_sums(&a, d_acc, n, 0) == cudaErrorNotSupported);
    } else {
        CHECK(bn_cb_add_sums_norm_fits(d_xs, n, d_acc, n, m, n, d_w_norm, d_qs, n));
        CUDA_OK(bn_w2a8_cuda_gemm(&a, 0));
        CUDA_OK(bn_cb_add_norm_quantize(d_xr, n, d_y, n, m, n, d_w_norm, 1e-5f, d_qr, n, d_scale_r,
                                        d_sum_r, 0, 0));
        float *xr = malloc(sizeof(float) * (size_t)(m * n)),
              *scale_r = malloc(sizeof(float) * (size_t)m);
        int8_t *qr = malloc((size_t)(m * n));
        int32_t *sum_r = malloc(sizeof(int32_t) * (size_t)m), *zeros = calloc((size_t)(m * n), 4);
        CUDA_OK(cudaMemcpy(xr, d_xr, sizeof(float) * (size_t)(m * n), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(qr, d_qr, (size_t)(m * n), cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(scale_r, d_scale_r, sizeof(float) * (size_t)m, cudaMemcpyDeviceToHost));
        CUDA_OK(cudaMemcpy(sum_r, d_sum_r, sizeof(int32_t) * (size_t)m, cudaMemcpyDeviceToHost));
        for (int round = 0; round < 2; round++) { /* the second on the zeroed sums */
            if (round == 1) {
                CUDA_OK(
                    cudaMemcpy(d_xs, x, sizeof(float) * (size_t)(m * n), cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_scale_s, act_scale, sizeof(float) * (size_t)m,
                                   cudaMemcpyHostToDevice));
                CUDA_OK(cudaMemcpy(d_sum_s, act_sum, sizeof(int32_t) * (size_t)m,
                                   cudaMemcpyHostToDevice));
            }
            a.act_scale = d_scale_s;
            a.act_sum = d_sum_s;
            CUDA_OK(bn_w2a8_cuda_gemm_add_sums(&a, d_acc, n, 0));
            CUDA_OK(bn_cb_add_sums_norm_quantize(d_xs, n, d_acc, n, w_scale, m, n, d_w_norm, 1e-5f,
                                                 d_qs, n, d_scale_s, d_sum_s, pdl, 0));
            CUDA_OK(cudaDeviceSynchronize());
            expect_bytes(d_xs, xr, sizeof(float) * (size_t)(m * n), "x", n, m, k);
            expect_bytes(d_qs, qr, (size_t)(m * n), "codes", n, m, k);
            expect_bytes(d_scale_s, scale_r, sizeof(float) * (size_t)m, "scales", n, m, k);
            expect_bytes(d_sum_s, sum_r, sizeof(int32_t) * (size_t)m, "code sums", n, m, k);
            expect_bytes(d_acc, zeros, sizeof(int32_t) * (size_t)(m * n), "sums left", n, m, k);
        }
        free(xr), free(scale_r), free(qr), free(sum_r), free(zeros);
    }
    cudaFree(d_w), cudaFree(d_x), cudaFree(d_w_norm), cudaFree(d_xr), cudaFree(d_scale);
    cudaFree(d_sum), cudaFree(d_xs), cudaFree(d_scale_s), cudaFree(d_sum_s), cudaFree(d_y);
    cudaFree(d_scale_r), cudaFree(d_sum_r), cudaFree(d_acc), cudaFree(d_qr), cudaFree(d_qs);
    free(codes), free(packed), free(xq), free(act_scale), free(x), free(w), free(act_sum);
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
    /* The down product as sums: the 2B-4T shape, ragged ones, declines. */
    static const int64_t downs[][3] = {{2560, 6912, 64}, {2560, 6912, 49}, {1000, 2000, 57},
                                       {128, 300, 64},   {2560, 2560, 48}, {1002, 700, 64}};
    for (size_t i = 0; i < sizeof downs / sizeof downs[0]; i++)
        check_down_sums(downs[i][0], downs[i][1], downs[i][2], pdl_usable && (i & 1));

    TEST_EXIT();
}
