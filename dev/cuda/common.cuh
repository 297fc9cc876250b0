/*
 * common.cuh - what the W2A8 labs share: error checks, random problems in
 * the kernels' weight layout (src/kernels/cuda_layout.h), the scalar CPU
 * reference, the bit-for-bit comparison, and timing by replayed CUDA
 * graphs over weight copies larger than the L2 cache.
 *
 * Every W2A8 kernel computes
 *
 *     acc = sum code * x    (exact int32; code = weight + 1)
 *     y   = ((float)(acc - act_sum) / act_scale) * weight_scale
 *
 * so its output must equal the CPU's ((float)sum w x / scale) * w_scale
 * bit for bit.
 */
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <functional>
#include <vector>

extern "C" {
#include "cuda_layout.h"
#include "w2a8_epilogue.cuh"
}

#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        const cudaError_t e_ = (call);                                                            \
        if (e_ != cudaSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                         \
                    cudaGetErrorString(e_));                                                      \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

/* The arguments every lab kernel's launcher takes (device pointers). */
struct w2a8_args {
    const void *weights; /* cuda_layout.h packing                  */
    int64_t n;           /* weight rows (outputs)                  */
    int64_t tiles, groups;
    float weight_scale;
    const int8_t *x; /* m rows of ldx bytes, zero from k to k_padded */
    int64_t m, ldx;
    const float *act_scale; /* m scales                            */
    const int32_t *act_sum; /* m sums of the int8 values           */
    float *y;               /* y[row * ldy + col]                  */
    int64_t ldy;
    int32_t *workspace; /* m * n int32 (the skinny lab's split-K)  */
    int sm_count;
};

static uint64_t lab_rng_state = 0x9E3779B97F4A7C15ull;

static inline uint32_t lab_rand()
{
    lab_rng_state ^= lab_rng_state << 13;
    lab_rng_state ^= lab_rng_state >> 7;
    lab_rng_state ^= lab_rng_state << 17;
    return (uint32_t)(lab_rng_state >> 32);
}

/* Uniform in [lo, hi]. */
static inline int64_t lab_rand_range(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(lab_rand() % (uint64_t)(hi - lo + 1));
}

/* One product: n x k ternary weights, m int8 activation rows, and the
 * CPU's result; on the device the packed weights (and, for timing,
 * copies of them), the activations, their scales and sums, the output. */
struct Problem {
    bn_cuda_layout l;
    int64_t m = 0;
    float w_scale = 1.0f;
    std::vector<float> ref; /* m x n */
    void *d_w = nullptr;
    int8_t *d_x = nullptr;
    float *d_scale = nullptr, *d_y = nullptr;
    int32_t *d_sum = nullptr, *d_ws = nullptr;
    std::vector<void *> copies; /* weight copies rotated by the timings */
    std::vector<int8_t> codes;  /* the n x k codes in -1..1 (make_problem's keep_codes) */

    w2a8_args args(int sm_count) const
    {
        return {d_w,     l.n,     l.tiles, l.groups, w_scale, d_x,   m,       l.k_padded,
                d_scale, d_sum,   d_y,     l.n,      d_ws,    sm_count};
    }
};

static Problem make_problem(int64_t n, int64_t k, int64_t m, bool keep_codes = false)
{
    Problem p;
    bn_cuda_layout_init(&p.l, n, k);
    p.m = m;
    p.w_scale = 0.01f + (float)(lab_rand() % 2000) / 1000.0f;
    std::vector<int8_t> w((size_t)(n * k)), x((size_t)(m * p.l.k_padded), 0);
    std::vector<float> scale((size_t)m);
    std::vector<int32_t> sum((size_t)m, 0);
    for (auto &v : w)
        v = (int8_t)lab_rand_range(-1, 1);
    for (int64_t r = 0; r < m; r++) {
        const int amax = (int)lab_rand_range(1, 127); /* rows of small and full range */
        for (int64_t c = 0; c < k; c++) {
            const int8_t v = (int8_t)lab_rand_range(-amax, amax);
            x[(size_t)(r * p.l.k_padded + c)] = v;
            sum[(size_t)r] += v;
        }
        scale[(size_t)r] = 127.0f / (0.05f + (float)(lab_rand() % 20000) / 1000.0f);
    }
    /* The reference: the exact integer dot, then the CPU's float steps. */
    p.ref.resize((size_t)(m * n));
    for (int64_t r = 0; r < m; r++)
        for (int64_t o = 0; o < n; o++) {
            int32_t dot = 0;
            const int8_t *wr = &w[(size_t)(o * k)], *xr = &x[(size_t)(r * p.l.k_padded)];
            for (int64_t c = 0; c < k; c++)
                dot += wr[c] * xr[c];
            p.ref[(size_t)(r * n + o)] = ((float)dot / scale[(size_t)r]) * p.w_scale;
        }
    std::vector<uint8_t> packed(p.l.bytes);
    bn_cuda_layout_pack(&p.l, w.data(), packed.data());
    if (keep_codes)
        p.codes.swap(w);
    CUDA_CHECK(cudaMalloc(&p.d_w, p.l.bytes));
    CUDA_CHECK(cudaMemcpy(p.d_w, packed.data(), p.l.bytes, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc((void **)&p.d_x, x.size()));
    CUDA_CHECK(cudaMemcpy(p.d_x, x.data(), x.size(), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc((void **)&p.d_scale, (size_t)m * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(p.d_scale, scale.data(), (size_t)m * sizeof(float),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc((void **)&p.d_sum, (size_t)m * sizeof(int32_t)));
    CUDA_CHECK(cudaMemcpy(p.d_sum, sum.data(), (size_t)m * sizeof(int32_t),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMalloc((void **)&p.d_y, (size_t)(m * n) * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&p.d_ws, (size_t)(m * n) * sizeof(int32_t)));
    return p;
}

/* Weight copies totalling at least `mib` MiB (at least two), so every
 * timed call streams its weights from memory, not from L2. */
static void make_copies(Problem &p, double mib = 1024.0)
{
    const int want = (int)(mib * 1048576.0 / (double)p.l.bytes) + 1;
    const int n = want < 2 ? 2 : want > 512 ? 512 : want;
    for (int i = 0; i < n; i++) {
        void *c = nullptr;
        if (cudaMalloc(&c, p.l.bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            break;
        }
        CUDA_CHECK(cudaMemcpy(c, p.d_w, p.l.bytes, cudaMemcpyDeviceToDevice));
        p.copies.push_back(c);
    }
}

static void free_problem(Problem &p)
{
    for (void *c : p.copies)
        cudaFree(c);
    cudaFree(p.d_w);
    cudaFree(p.d_x);
    cudaFree(p.d_scale);
    cudaFree(p.d_sum);
    cudaFree(p.d_y);
    cudaFree(p.d_ws);
    p = Problem();
}

/* NaN in every output, so a value the kernel does not write fails. */
static void poison(const Problem &p)
{
    CUDA_CHECK(cudaMemset(p.d_y, 0xff, (size_t)(p.m * p.l.n) * sizeof(float)));
}

/* Whether d_y equals the reference bit for bit (after rc, the launch's
 * error); prints the first difference. */
static bool check(const Problem &p, cudaError_t rc, const char *what)
{
    if (rc != cudaSuccess) {
        printf("  %s: launch failed: %s\n", what, cudaGetErrorString(rc));
        return false;
    }
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<float> y(p.ref.size());
    CUDA_CHECK(cudaMemcpy(y.data(), p.d_y, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
    int64_t bad = 0, first = -1;
    for (size_t i = 0; i < y.size(); i++)
        if (memcmp(&y[i], &p.ref[i], sizeof(float)) != 0 && bad++ == 0)
            first = (int64_t)i;
    if (bad) {
        printf("  %s: %lld of %zu differ (first at %lld: %g, want %g)\n", what, (long long)bad,
               y.size(), (long long)first, (double)y[(size_t)first],
               (double)p.ref[(size_t)first]);
        return false;
    }
    return true;
}

/* Microseconds a call: `launches` calls fn(i, stream) captured in one CUDA
 * graph (call i on weight copy i % copies), replayed `reps` times after two
 * warm-up replays; -1 if a call fails. */
static double time_calls(const std::function<cudaError_t(int, cudaStream_t)> &fn,
                         int launches = 50, int reps = 10)
{
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaGraph_t graph = nullptr;
    cudaGraphExec_t exec = nullptr;
    bool ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    for (int i = 0; ok && i < launches; i++)
        ok = fn(i, s) == cudaSuccess;
    ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && ok;
    ok = ok && cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    double us = -1.0;
    if (ok) {
        cudaEvent_t a, b;
        CUDA_CHECK(cudaEventCreate(&a));
        CUDA_CHECK(cudaEventCreate(&b));
        for (int w = 0; w < 2; w++)
            CUDA_CHECK(cudaGraphLaunch(exec, s));
        CUDA_CHECK(cudaEventRecord(a, s));
        for (int r = 0; r < reps; r++)
            CUDA_CHECK(cudaGraphLaunch(exec, s));
        CUDA_CHECK(cudaEventRecord(b, s));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        us = (double)ms * 1e3 / ((double)launches * reps);
        cudaEventDestroy(a);
        cudaEventDestroy(b);
    }
    (void)cudaGetLastError();
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    cudaStreamDestroy(s);
    return us;
}

/* A device copy of h (cudaMalloc'd: the caller frees it). */
template <class T> T *upload(const std::vector<T> &h)
{
    T *d = nullptr;
    CUDA_CHECK(cudaMalloc((void **)&d, h.size() * sizeof(T)));
    CUDA_CHECK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

/* Device-to-device copy bandwidth, bytes read + written per second (GB/s). */
static double copy_gbs()
{
    const size_t bytes = (size_t)1 << 30;
    void *a = nullptr, *b = nullptr;
    CUDA_CHECK(cudaMalloc(&a, bytes));
    CUDA_CHECK(cudaMalloc(&b, bytes));
    CUDA_CHECK(cudaMemset(a, 1, bytes));
    cudaEvent_t t0, t1;
    CUDA_CHECK(cudaEventCreate(&t0));
    CUDA_CHECK(cudaEventCreate(&t1));
    CUDA_CHECK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(t0));
    for (int r = 0; r < 10; r++)
        CUDA_CHECK(cudaMemcpyAsync(r & 1 ? a : b, r & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice));
    CUDA_CHECK(cudaEventRecord(t1));
    CUDA_CHECK(cudaEventSynchronize(t1));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, t0, t1));
    cudaEventDestroy(t0);
    cudaEventDestroy(t1);
    cudaFree(a);
    cudaFree(b);
    return 2.0 * (double)bytes * 10 / ((double)ms * 1e-3) / 1e9;
}

static int device_sms()
{
    int dev = 0, sms = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    return sms;
}

/* The benchmark shapes (N x K) of `bitnet bench kernels --device cuda`: the
 * projections of the BitNet b1.58 2B-4T family. */
static const int64_t kLabShapes[][2] = {{2560, 2560},  {3840, 2560}, {13824, 2560},
                                        {2560, 6912},  {20480, 3200}, {5120, 27648},
                                        {55296, 5120}};

typedef std::vector<std::pair<int64_t, int64_t>> lab_shape_list;

/* The shapes "NxK" of argv[first ..] into *shapes, or, where none is
 * given, the n_defaults of `defaults`; false (said on stderr) where an
 * argument is not a shape. */
static bool lab_shapes(int argc, char **argv, int first, lab_shape_list *shapes,
                       const int64_t (*defaults)[2] = kLabShapes,
                       size_t n_defaults = sizeof kLabShapes / sizeof kLabShapes[0])
{
    shapes->clear();
    for (int i = first; i < argc; i++) {
        long long n = 0, k = 0;
        char tail;
        if (sscanf(argv[i], "%lldx%lld%c", &n, &k, &tail) != 2 || n <= 0 || k <= 0) {
            fprintf(stderr, "%s: not a shape NxK: %s\n", argv[0], argv[i]);
            return false;
        }
        shapes->push_back({n, k});
    }
    if (shapes->empty())
        for (size_t i = 0; i < n_defaults; i++)
            shapes->push_back({defaults[i][0], defaults[i][1]});
    return true;
}
