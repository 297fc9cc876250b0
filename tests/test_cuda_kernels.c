/* GPU test: the CUDA W2A8 kernels against the CPU reference, bit for bit,
 * on fresh random ragged shapes with poisoned outputs: the GEMV at every
 * split (the decode step's form also at every cluster staging, launched
 * with PDL, and in gate|up pairs), every kernel of the GEMM's table forced
 * on every problem and the table's own pick, the pipelined GEMM at every
 * split-K factor, the stream-K wgmma kernels over several grids, the wgmma
 * kernels chained by PDL after the kernel that writes their activations,
 * the wgmma epilogue's division, and activation quantization. Exits 77
 * without a usable GPU. */
#include <cuda_runtime_api.h>

#include "cuda_layout.h"
#include "kernel_manager.h"
#include "quant_rules.h"
#include "test_util.h"
#include "test_util_cuda.h"
#include "w2a8.h"
#include "w2a8_cuda.h"

static int sm_count;
/* BN_TEST_PART=i/n: only every n-th problem, starting at the i-th, reaches
 * the GPU (the others still draw their random data, so with one
 * BN_TEST_SEED the n parts together check exactly the problems one run
 * does). Lets a slow tool (racecheck) run the test as n processes. */
static int problem_counter;
static bool wgmma_usable; /* compute capability 9.0 and this build has sm_90a code */
static bool pdl_usable;   /* the decode GEMV can be launched with PDL here */

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

static void random_activations(float *x, int64_t n)
{
    const float range = test_rand_float(0.05f, 20.0f);
    for (int64_t i = 0; i < n; i++)
        x[i] = test_rand_float(-range, range);
}

/* Counts the outputs of d_y (m x n) whose bits differ from ref; the first
 * differing index goes to *first. */
static int64_t count_diff(const float *d_y, const float *ref, int64_t m, int64_t n, float *y,
                          int64_t *first)
{
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(y, d_y, sizeof(float) * (size_t)(m * n), cudaMemcpyDeviceToHost));
    int64_t diff = 0;
    *first = -1;
    for (int64_t i = 0; i < m * n; i++)
        if (!same_bits(y[i], ref[i]) && diff++ == 0)
            *first = i;
    return diff;
}

/* The decode step's gate|up GEMV in pairs (relu2_pair): a's n x k matrix
 * (codes) taken as [gate; up] of f = n / 2 rows each. Every split, with the
 * activations staged by every block and once per cluster of 2, 8 and 16
 * (where the device holds clusters of 16 of its blocks: on a device with
 * clusters, at least one split must), must
 * give the CPU's products with weight scale 1 turned into relu(g sg)^2
 * (u su) bit for bit, and write nothing past y[f - 1] (poison kept). */
static void check_gate_up_pair(const bn_w2a8_cuda_args *base, const int8_t *codes,
                               const bn_q8_rows *xq, float *y)
{
    const int64_t n = base->n, f = n / 2, k = (int64_t)xq->k;
    bn_w2a8_weights w1;
    CHECK(bn_w2a8_pack(&bn_provider_scalar, codes, n, k, 1.0f, &w1, NULL) == BN_OK);
    float *raw = malloc(sizeof(float) * (size_t)n), *ref = malloc(sizeof(float) * (size_t)n);
    CHECK(bn_w2a8_matmul(&w1, xq, raw, n, NULL, NULL) == BN_OK);
    const float sg = test_rand_float(0.01f, 2.0f), su = test_rand_float(0.01f, 2.0f);
    uint32_t poison = 0xffffffffu;
    for (int64_t i = 0; i < n; i++) {
        if (i < f) {
            const float gate = raw[i] * sg, up = raw[f + i] * su;
            const float rg = gate > 0.0f ? gate : 0.0f;
            ref[i] = (rg * rg) * up;
        } else {
            memcpy(&ref[i], &poison, sizeof poison);
        }
    }
    const int splits[] = {1, 2, 4, 8}, clusters[] = {0, 2, 8, 16};
    int ran16 = 0;
    for (int c = 0; c < 4; c++)
        for (int si = 0; si < 4; si++) {
            bn_w2a8_cuda_args a = *base;
            a.relu2_pair = 1;
            a.relu2_sg = sg;
            a.relu2_su = su;
            a.weight_scale = -1.0f; /* unused in pairs */
            a.cluster = clusters[c];
            if (clusters[c] == 16) {
                if (!bn_w2a8_cuda_gemv_pair_cluster16(&a, splits[si]))
                    continue;
                ran16++;
            }
            CUDA_OK(cudaMemset(a.y, 0xff, sizeof(float) * (size_t)n));
            CUDA_OK(bn_w2a8_cuda_gemv_pdl(&a, splits[si], 0, 0));
            int64_t first;
            const int64_t diff = count_diff(a.y, ref, 1, n, y, &first);
            CHECK_MSG(diff == 0,
                      "gate|up pair gemv (split %d, cluster %d) f=%lld k=%lld: %lld of %lld "
                      "differ (first at %lld: %g vs %g)",
                      splits[si], clusters[c], (long long)f, (long long)k, (long long)diff,
                      (long long)n, (long long)first, first >= 0 ? y[first] : 0.0,
                      first >= 0 ? ref[first] : 0.0);
        }
    CHECK_MSG(ran16 > 0 || !bn_w2a8_cuda_gemv_cluster_usable(),
              "gate|up pair gemv f=%lld k=%lld: clusters of 16 fit at no split", (long long)f,
              (long long)k);
    /* Shapes it does not take: an odd number of tiles a part. */
    bn_w2a8_cuda_args bad = *base;
    bad.relu2_pair = 1;
    bad.n = n - 8;
    bad.tiles = base->tiles - 1;
    CHECK(bn_w2a8_cuda_gemv_pdl(&bad, 1, 0, 0) == cudaErrorInvalidValue);
    free(raw);
    free(ref);
    bn_w2a8_weights_free(&w1);
}

/* One problem: n x k weights, m activation rows; checks GEMV (m == 1, all
 * splits) or GEMM against the scalar provider. */
static void check_problem(int64_t n, int64_t k, int64_t m)
{
    int8_t *codes = malloc((size_t)(n * k));
    for (int64_t i = 0; i < n * k; i++)
        codes[i] = (int8_t)test_rand_range(-1, 1);
    float *x = malloc(sizeof(float) * (size_t)(m * k));
    random_activations(x, m * k);
    const float ws = test_rand_float(0.01f, 2.0f);
    if (!test_in_part(problem_counter++)) {
        free(codes);
        free(x);
        return;
    }

    bn_q8_rows xq;
    CHECK(bn_q8_rows_alloc(&xq, m, k, NULL) == BN_OK);
    bn_w2a8_quantize(&bn_provider_scalar, x, m, k, &xq);
    bn_w2a8_weights wref;
    CHECK(bn_w2a8_pack(&bn_provider_scalar, codes, n, k, ws, &wref, NULL) == BN_OK);
    float *ref = malloc(sizeof(float) * (size_t)(m * n));
    CHECK(bn_w2a8_matmul(&wref, &xq, ref, n, NULL, NULL) == BN_OK);

    bn_cuda_layout l;
    bn_cuda_layout_init(&l, n, k);
    uint8_t *packed = malloc(l.bytes);
    bn_cuda_layout_pack(&l, codes, packed);
    void *d_w;
    int8_t *d_x;
    float *d_scale, *d_y;
    int32_t *d_sum;
    CUDA_OK(cudaMalloc(&d_w, l.bytes));
    CUDA_OK(cudaMemcpy(d_w, packed, l.bytes, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_x, (size_t)(m * l.k_padded)));
    CUDA_OK(cudaMemset(d_x, 0, (size_t)(m * l.k_padded)));
    CUDA_OK(cudaMemcpy2D(d_x, (size_t)l.k_padded, xq.q, (size_t)xq.lda, (size_t)k, (size_t)m,
                         cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_scale, sizeof(float) * (size_t)m));
    CUDA_OK(cudaMalloc((void **)&d_sum, sizeof(int32_t) * (size_t)m));
    CUDA_OK(cudaMemcpy(d_scale, xq.scale, sizeof(float) * (size_t)m, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_sum, xq.sum, sizeof(int32_t) * (size_t)m, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_y, sizeof(float) * (size_t)(m * n)));
    /* The stream-K workspace, for up to streamk_sms blocks; zeroed once. */
    const int streamk_sms = sm_count > 64 ? sm_count : 64;
    const size_t streamk_bytes = bn_w2a8_cuda_gemm_streamk_bytes(streamk_sms);
    int32_t *d_streamk;
    CUDA_OK(cudaMalloc((void **)&d_streamk, streamk_bytes));
    CUDA_OK(cudaMemset(d_streamk, 0, streamk_bytes));
    float *y = malloc(sizeof(float) * (size_t)(m * n));

    bn_w2a8_cuda_args a = {.weights = d_w,
                           .n = n,
                           .tiles = l.tiles,
                           .groups = l.groups,
                           .weight_scale = ws,
                           .x = d_x,
                           .m = m,
                           .ldx = l.k_padded,
                           .act_scale = d_scale,
                           .act_sum = d_sum,
                           .y = d_y,
                           .ldy = n,
                           .sm_count = sm_count,
                           .streamk = d_streamk};
    /* M = 1: the GEMV and the decode step's GEMV at every split, the
     * latter also staged per cluster of 2, 4 and 8 (where clusters are not
     * usable it stages per block) and launched with PDL where it can be. */
    const int splits[] = {1, 2, 4, 8}, clusters[] = {0, 2, 4, 8};
    for (int run = 0; m == 1 && run < 4 * (1 + 4 * 2); run++) {
        const int split = splits[run % 4], form = run / 4; /* 0: plain; then cluster x pdl */
        const int cluster = form > 0 ? clusters[(form - 1) % 4] : 0, pdl = form > 4;
        if (pdl && !pdl_usable)
            continue;
        a.cluster = cluster;
        CUDA_OK(cudaMemset(d_y, 0xff, sizeof(float) * (size_t)n)); /* NaN poison */
        CUDA_OK(form == 0 ? bn_w2a8_cuda_gemv(&a, split, 0)
                          : bn_w2a8_cuda_gemv_pdl(&a, split, pdl, 0));
        int64_t first;
        const int64_t diff = count_diff(d_y, ref, m, n, y, &first);
        CHECK_MSG(diff == 0,
                  "%s (split %d, cluster %d%s) n=%lld k=%lld: %lld of %lld differ (first at "
                  "%lld: %g vs %g)",
                  form == 0 ? "gemv" : "decode gemv", split, cluster, pdl ? ", PDL" : "",
                  (long long)n, (long long)k, (long long)diff, (long long)n, (long long)first,
                  first >= 0 ? y[first] : 0.0, first >= 0 ? ref[first] : 0.0);
    }
    a.cluster = 0;
    /* Every kernel of the GEMM's table forced, with and without a stream-K
     * workspace, then the table's own choice (bn_w2a8_cuda_gemm), for any M
     * (M = 1 included). */
    for (int v = 0; v < (BN_W2A8_KERNELS + 1) * 2; v++) {
        const int kernel = v / 2; /* BN_W2A8_KERNELS: the table's pick */
        a.streamk = v % 2 == 0 ? d_streamk : NULL;
        CUDA_OK(cudaMemset(d_y, 0xff, sizeof(float) * (size_t)(m * n))); /* NaN poison */
        const cudaError_t rc = kernel == BN_W2A8_KERNELS
                                   ? bn_w2a8_cuda_gemm(&a, 0)
                                   : bn_w2a8_cuda_gemm_run(&a, (bn_w2a8_kernel)kernel, 0);
        const char *name =
            kernel == BN_W2A8_KERNELS ? "the table's" : bn_w2a8_cuda_kernel_name(kernel);
        if (kernel == BN_W2A8_GEMV && m != 1) { /* one row only */
            CHECK_MSG(rc == cudaErrorInvalidValue, "gemv for %lld rows: %s", (long long)m,
                      cudaGetErrorString(rc));
            continue;
        }
        /* The wgmma kernels need compute capability 9.0 and an sm_90a
         * build; elsewhere they decline without launching. */
        if (rc == cudaErrorNotSupported && bn_w2a8_cuda_kernel_wgmma(kernel) && !wgmma_usable)
            continue;
        /* Stream-K declines without its workspace. */
        if (bn_w2a8_cuda_kernel_streamk(kernel) && !a.streamk) {
            CHECK_MSG(rc == cudaErrorInvalidValue, "stream-K without a workspace: %s",
                      cudaGetErrorString(rc));
            continue;
        }
        CUDA_OK(rc);
        int64_t first;
        const int64_t diff = count_diff(d_y, ref, m, n, y, &first);
        CHECK_MSG(diff == 0,
                  "gemm %s (workspace %s) n=%lld k=%lld m=%lld: %lld of %lld differ (first at "
                  "%lld: %g vs %g)",
                  name, a.streamk ? "yes" : "no", (long long)n, (long long)k, (long long)m,
                  (long long)diff, (long long)(m * n), (long long)first,
                  first >= 0 ? y[first] : 0.0, first >= 0 ? ref[first] : 0.0);
    }
    /* The wgmma and mma-rows GEMMs launched with programmatic dependent
     * launch right after the kernel that writes their activations (the
     * quantization, over poisoned codes, scales and sums): their weight
     * loads may start early, everything else must wait for it. */
    if (pdl_usable) {
        float *d_xf;
        CUDA_OK(cudaMalloc((void **)&d_xf, sizeof(float) * (size_t)(m * k)));
        CUDA_OK(cudaMemcpy(d_xf, x, sizeof(float) * (size_t)(m * k), cudaMemcpyHostToDevice));
        a.streamk = d_streamk;
        for (int v = 0; v < BN_W2A8_KERNELS; v++) {
            const bool mma_rows = v == BN_W2A8_MMA_ROWS_X2 || v == BN_W2A8_MMA_ROWS_X4;
            if (!(mma_rows || (wgmma_usable && bn_w2a8_cuda_kernel_wgmma((bn_w2a8_kernel)v))))
                continue;
            CUDA_OK(cudaMemset(d_x, 0x55, (size_t)(m * l.k_padded)));
            CUDA_OK(cudaMemset(d_scale, 0x55, sizeof(float) * (size_t)m));
            CUDA_OK(cudaMemset(d_sum, 0x55, sizeof(int32_t) * (size_t)m));
            CUDA_OK(cudaMemset(d_y, 0xff, sizeof(float) * (size_t)(m * n)));
            CUDA_OK(bn_cuda_quantize_rows(d_xf, m, k, k, d_x, l.k_padded, d_scale, d_sum, 0));
            a.pdl = 1;
            const cudaError_t rc = bn_w2a8_cuda_gemm_run(&a, (bn_w2a8_kernel)v, 0);
            a.pdl = 0;
            CUDA_OK(rc);
            int64_t first;
            const int64_t diff = count_diff(d_y, ref, m, n, y, &first);
            CHECK_MSG(diff == 0,
                      "gemm %s chained after the quantization (PDL) n=%lld k=%lld "
                      "m=%lld: %lld of %lld differ (first at %lld: %g vs %g)",
                      bn_w2a8_cuda_kernel_name((bn_w2a8_kernel)v), (long long)n, (long long)k,
                      (long long)m, (long long)diff,
                      (long long)(m * n), (long long)first, first >= 0 ? y[first] : 0.0,
                      first >= 0 ? ref[first] : 0.0);
        }
        cudaFree(d_xf);
    }
    /* The pipelined GEMM at every split-K factor (the table's kernels run
     * split 1 and the split chosen for the shape): split-K reduces through
     * a cluster (where clusters cannot run, every split runs as 1). */
    for (int split = 1; split <= BN_W2A8_PIPE_MAX_SPLIT; split++) {
        CUDA_OK(cudaMemset(d_y, 0xff, sizeof(float) * (size_t)(m * n)));
        CUDA_OK(bn_w2a8_cuda_gemm_pipelined(&a, split, 0));
        int64_t first;
        const int64_t diff = count_diff(d_y, ref, m, n, y, &first);
        CHECK_MSG(diff == 0,
                  "pipelined gemm split %d (runs as %d) n=%lld k=%lld m=%lld: %lld of %lld "
                  "differ (first at %lld: %g vs %g)",
                  split, bn_w2a8_cuda_gemm_pipelined_split(&a, split), (long long)n,
                  (long long)k, (long long)m, (long long)diff, (long long)(m * n),
                  (long long)first, first >= 0 ? y[first] : 0.0, first >= 0 ? ref[first] : 0.0);
    }

    /* Stream-K over grids of several sizes, so tiles are cut at many
     * places (one block per k-tile where the grid outnumbers them); every
     * call must leave the workspace's counters at zero. */
    const int grids[] = {1, 2, 3, 7, 13, 64, sm_count};
    const bn_w2a8_kernel streamk_configs[] = {BN_W2A8_WGMMA_128X128_STREAMK,
                                              BN_W2A8_WGMMA_192X128_STREAMK};
    const int n_configs = (int)(sizeof streamk_configs / sizeof streamk_configs[0]);
    a.streamk = d_streamk;
    for (int run = 0; wgmma_usable && run < n_configs * (int)(sizeof grids / sizeof grids[0]);
         run++) {
        const bn_w2a8_kernel config = streamk_configs[run % n_configs];
        const int gi = run / n_configs;
        a.sm_count = grids[gi] < streamk_sms ? grids[gi] : streamk_sms;
        CUDA_OK(cudaMemset(d_y, 0xff, sizeof(float) * (size_t)(m * n)));
        CUDA_OK(bn_w2a8_cuda_gemm_run(&a, config, 0));
        int64_t first;
        const int64_t diff = count_diff(d_y, ref, m, n, y, &first);
        CHECK_MSG(diff == 0,
                  "%s over %d blocks n=%lld k=%lld m=%lld: %lld of %lld "
                  "differ (first at %lld: %g vs %g)",
                  bn_w2a8_cuda_kernel_name(config), a.sm_count, (long long)n, (long long)k,
                  (long long)m, (long long)diff,
                  (long long)(m * n), (long long)first, first >= 0 ? y[first] : 0.0,
                  first >= 0 ? ref[first] : 0.0);
    }
    a.sm_count = sm_count;
    if (m == 1 && n % 16 == 0)
        check_gate_up_pair(&a, codes, &xq, y);
    if (wgmma_usable) {
        /* The counters open the workspace (at most 1024 of them). */
        int counters[1024];
        CUDA_OK(cudaMemcpy(counters, d_streamk, sizeof counters, cudaMemcpyDeviceToHost));
        for (int i = 0; i < 1024; i++)
            CHECK_MSG(counters[i] == 0, "stream-K counter %d left at %d", i, counters[i]);
    }

    cudaFree(d_w);
    cudaFree(d_x);
    cudaFree(d_scale);
    cudaFree(d_sum);
    cudaFree(d_y);
    cudaFree(d_streamk);
    free(y);
    free(packed);
    free(ref);
    free(x);
    free(codes);
    bn_q8_rows_free(&xq);
    bn_w2a8_weights_free(&wref);
}

static void check_quantize(int64_t m, int64_t k)
{
    const int64_t ldq = (k + 255) / 256 * 256;
    float *x = malloc(sizeof(float) * (size_t)(m * k));
    random_activations(x, m * k);
    if (k > 3) {
        x[test_rand_range(0, m * k - 1)] = NAN;
        x[test_rand_range(0, m * k - 1)] = 0.5f / 127.0f; /* near a tie */
    }
    float *d_x, *d_scale;
    int8_t *d_q;
    int32_t *d_sum;
    CUDA_OK(cudaMalloc((void **)&d_x, sizeof(float) * (size_t)(m * k)));
    CUDA_OK(cudaMemcpy(d_x, x, sizeof(float) * (size_t)(m * k), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMalloc((void **)&d_q, (size_t)(m * ldq)));
    CUDA_OK(cudaMemset(d_q, 0x7f, (size_t)(m * ldq))); /* poison, padding included */
    CUDA_OK(cudaMalloc((void **)&d_scale, sizeof(float) * (size_t)m));
    CUDA_OK(cudaMalloc((void **)&d_sum, sizeof(int32_t) * (size_t)m));
    CUDA_OK(bn_cuda_quantize_rows(d_x, m, k, k, d_q, ldq, d_scale, d_sum, 0));
    CUDA_OK(cudaDeviceSynchronize());
    int8_t *q = malloc((size_t)(m * ldq));
    float *scale = malloc(sizeof(float) * (size_t)m);
    int32_t *sum = malloc(sizeof(int32_t) * (size_t)m);
    CUDA_OK(cudaMemcpy(q, d_q, (size_t)(m * ldq), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(scale, d_scale, sizeof(float) * (size_t)m, cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(sum, d_sum, sizeof(int32_t) * (size_t)m, cudaMemcpyDeviceToHost));
    int8_t *ref = calloc(1, (size_t)ldq);
    for (int64_t i = 0; i < m; i++) {
        float s;
        int32_t total;
        memset(ref, 0, (size_t)ldq);
        bn_quantize_activations_row(x + i * k, k, ref, &s, &total);
        CHECK_MSG(memcmp(ref, q + i * ldq, (size_t)ldq) == 0 && same_bits(s, scale[i]) &&
                      total == sum[i],
                  "quantize m=%lld k=%lld row %lld differs", (long long)m, (long long)k,
                  (long long)i);
    }
    cudaFree(d_x);
    cudaFree(d_q);
    cudaFree(d_scale);
    cudaFree(d_sum);
    free(x);
    free(q);
    free(scale);
    free(sum);
    free(ref);
}

int main(void)
{
    int part_index, part_count;
    test_part(&part_index, &part_count);
    if (part_count > 1)
        printf("GEMV/GEMM problems %d, %d, %d, ...\n", part_index, part_index + part_count,
               part_index + 2 * part_count);
    sm_count = test_require_cuda(8, "the W2A8 GEMM").multiProcessorCount;
    {
        /* Whether the split-K tests below reach the cluster path (compute
         * capability 9.0 and a build for it) or all run as split 1. */
        const bn_w2a8_cuda_args probe = {.n = 256, .tiles = 32, .groups = 4, .m = 64,
                                         .sm_count = sm_count};
        printf("pipelined GEMM split-K: %s\n",
               bn_w2a8_cuda_gemm_pipelined_split(&probe, 2) == 2
                   ? "thread-block clusters"
                   : "unavailable here (every split runs as 1)");
    }

    {
        int dev = 0, major = 0, minor = 0;
        CUDA_OK(cudaGetDevice(&dev));
        CUDA_OK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
        CUDA_OK(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev));
        wgmma_usable = major == 9 && minor == 0 && bn_w2a8_cuda_gemm_wgmma_compiled();
        pdl_usable = major >= 9 && bn_w2a8_cuda_gemv_pdl_compiled();
        printf("wgmma GEMM: %s\n",
               wgmma_usable ? "checked"
               : bn_w2a8_cuda_gemm_wgmma_compiled()
                   ? "skipped (needs compute capability 9.0)"
                   : "skipped (this build has no sm_90a code: 90 not among the architectures)");
    }

    /* The wgmma epilogue's division (a row's reciprocal once, three
     * instructions a value) against __fdiv_rn on 2^28 random pairs (2^24
     * in quick mode), a fresh seed each run. */
    if (wgmma_usable) {
        unsigned long long *d_bad, bad = 0;
        const int64_t pairs = getenv("BN_TEST_QUICK") ? (int64_t)1 << 24 : (int64_t)1 << 28;
        const uint64_t seed = ((uint64_t)test_rand_range(0, 0x7fffffff) << 31) ^
                              (uint64_t)test_rand_range(0, 0x7fffffff);
        CUDA_OK(cudaMalloc((void **)&d_bad, sizeof bad));
        CUDA_OK(cudaMemset(d_bad, 0, sizeof bad));
        CUDA_OK(bn_w2a8_cuda_division_check(pairs, seed, d_bad, 0));
        CUDA_OK(cudaMemcpy(&bad, d_bad, sizeof bad, cudaMemcpyDeviceToHost));
        CHECK_MSG(bad == 0, "epilogue division: %llu of %lld pairs differ from __fdiv_rn", bad,
                  (long long)pairs);
        cudaFree(d_bad);
    }

    /* The packer against its own definition, on one small case. */
    {
        bn_cuda_layout l;
        bn_cuda_layout_init(&l, 9, 300);
        int8_t codes[9 * 300];
        for (int i = 0; i < 9 * 300; i++)
            codes[i] = (int8_t)test_rand_range(-1, 1);
        uint8_t *buf = malloc(l.bytes);
        bn_cuda_layout_pack(&l, codes, buf);
        int bad = 0;
        for (int r = 0; r < 9; r++)
            for (int c = 0; c < 300; c++)
                bad += bn_cuda_layout_get(&l, buf, r, c) != codes[r * 300 + c];
        CHECK(bad == 0 && l.tiles == 2 && l.groups == 2 && l.k_padded == 512);
        free(buf);
    }

    /* Long rows over a few tiles (the GEMV at split 8). */
    check_problem(24, 6912, 1);
    check_problem(8, 16384, 1);
    const int64_t ks[] = {1, 4, 63, 64, 65, 255, 256, 257, 640, 1000, 2560, 6912};
    for (size_t i = 0; i < sizeof ks / sizeof ks[0]; i++) {
        check_problem(test_rand_range(1, 100), ks[i], 1);
        check_problem(test_rand_range(1, 100), ks[i], test_rand_range(2, 17));
    }
    /* BN_TEST_QUICK=1 (runs under compute-sanitizer, racecheck above all,
     * which is slow on the shared-memory-heavy GEMMs): fewer random
     * problems here, no real shapes below. */
    const bool quick = getenv("BN_TEST_QUICK") != NULL;
    for (int iter = 0; iter < (quick ? 5 : 20); iter++)
        check_problem(test_rand_range(1, 700), test_rand_range(1, 3000), 1);
    for (int iter = 0; iter < (quick ? 3 : 12); iter++)
        check_problem(test_rand_range(1, 300), test_rand_range(1, 1500), test_rand_range(2, 140));
    /* Prefill-sized M for the pipelined and wgmma GEMMs (blocks of 64 and
     * 128 activation rows, k-tiles of 128): M around the block edges,
     * N not a multiple of 8 or 256 and exactly 256, K not a multiple of 128
     * or 256 and exactly 128. */
    const int64_t pipe_ms[] = {17, 33, 63, 64, 65, 100, 127, 128, 129, 191, 192, 193, 512};
    for (size_t i = 0; i < sizeof pipe_ms / sizeof pipe_ms[0]; i++)
        check_problem(test_rand_range(1, 600), test_rand_range(1, 1500), pipe_ms[i]);
    check_problem(256, 128, 64);
    check_problem(255, 129, 65);
    check_problem(257, 1000, 33);
    /* 533 tiles: at least four per SM (132 SMs or fewer), so the split-8
     * PDL GEMV runs two tiles a block, the last block half empty (small
     * enough for the sanitizers' quick mode). */
    check_problem(4257, 700, 1);
    /* The activation quantization with k a multiple of 4 (four values a
     * load) and not, with the wide blocks of few rows and the 256 threads
     * of 64 rows and more. */
    check_quantize(2, 4 * test_rand_range(1, 2500));
    check_quantize(70, 4 * test_rand_range(1, 2500));
    check_quantize(70, 4 * test_rand_range(1, 2500) + test_rand_range(1, 3));
    /* Real shapes: the 2B-4T projections, decode and a prefill batch
     * (skipped with BN_TEST_QUICK=1). */
    if (quick)
        TEST_EXIT();
    /* A row longer than what the PDL GEMV's warps load before their wait
     * at split 8 (4 x 8 chunk-groups): the rest streams after it. Then a
     * row longer than the 160 KiB the GEMVs stage in shared memory: read
     * through L1 (24 rows: not gate|up pairs, which must stage it). */
    check_problem(test_rand_range(1, 100), 8193 + test_rand_range(0, 4000), 1);
    check_problem(24, 160 * 1024 + 1 + test_rand_range(0, 4000), 1);
    check_problem(2560, 2560, 1);
    check_problem(6912, 2560, 1);
    check_problem(2560, 6912, 1);
    check_problem(13824, 2560, 1); /* gate|up of the 2B-4T shape (pairs) */
    check_problem(96, 300, 1);     /* pairs of 6 tiles, a ragged row */
    check_problem(640, 2560, 77);
    check_problem(2560, 2560, 300);
    check_problem(777, 2560 + 17, 512);

    for (int iter = 0; iter < 30; iter++)
        check_quantize(test_rand_range(1, 6), test_rand_range(1, 9000));
    check_quantize(3, 2560);
    check_quantize(65, 27648); /* a long row, four values a load */

    /* The provider table on the GPU: exercised through bn_w2a8_matmul. */
    CHECK(bn_provider_cuda.is_available());
    TEST_EXIT();
}
