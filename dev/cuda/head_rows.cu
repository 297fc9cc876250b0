/*
 * head_rows.cu - lab: the LM head for many rows at once (the batched CUDA
 * step's last product): logits[r][v] = sum_k head[v][k] * x[r][k] for up
 * to 64 rows, the head F16 (the 2B-4T model's tied embedding, 128256 x
 * 2560, 656 MB), the rows and the logits fp32. The decode step's GEMV reads
 * the head once per row; here every block takes 64 vocabulary rows and all
 * the rows, so the head is read once a pass whatever the row count.
 *
 * The kernel: 256 threads a block, a tile of 64 vocabulary rows x 64 rows,
 * K in chunks of 64 through shared memory (the head chunk converted to
 * fp32 there), each thread a 4 x 4 micro-tile of fp32 fused multiply-adds.
 *
 * The check: against a double-precision CPU product on ragged shapes
 * (relative error of each logit against the sum of |products|). The
 * timing: the 2B-4T head at 1, 8, 32 and 64 rows, against the copy
 * bandwidth (its floor: the head read once) and the per-row GEMV's cost
 * (the head read once per row) measured in the same run.
 *
 *   make -C dev/cuda head_rows && dev/cuda/head_rows
 */
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <vector>

#include "common.cuh"

namespace {

constexpr int kVB = 64, kRB = 64, kKC = 64, kThreads = 256;

__global__ void __launch_bounds__(kThreads)
    head_rows_kernel(const __half *__restrict__ head, int64_t vocab, int dim,
                     const float *__restrict__ x, int n_rows, float *__restrict__ logits)
{
    __shared__ float hs[kKC][kVB + 4]; /* [k][vocab row] */
    __shared__ float xs[kKC][kRB + 4]; /* [k][row]       */
    const int tid = threadIdx.x, tv = tid % 16, tr = tid / 16;
    const int64_t v0 = (int64_t)blockIdx.x * kVB;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < dim; k0 += kKC) {
        for (int i = tid; i < kVB * kKC; i += kThreads) {
            const int v = i / kKC, k = i % kKC;
            const int64_t gv = v0 + v;
            hs[k][v] = gv < vocab && k0 + k < dim ? __half2float(head[gv * dim + k0 + k]) : 0.0f;
        }
        for (int i = tid; i < kRB * kKC; i += kThreads) {
            const int r = i / kKC, k = i % kKC;
            xs[k][r] = r < n_rows && k0 + k < dim ? x[(int64_t)r * dim + k0 + k] : 0.0f;
        }
        __syncthreads();
#pragma unroll 8
        for (int k = 0; k < kKC; k++) {
            float a[4], b[4];
#pragma unroll
            for (int i = 0; i < 4; i++) {
                a[i] = hs[k][tv + 16 * i];
                b[i] = xs[k][tr + 16 * i];
            }
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int j = 0; j < 4; j++)
                    acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const int64_t v = v0 + tv + 16 * i;
            const int r = tr + 16 * j;
            if (v < vocab && r < n_rows)
                logits[(int64_t)r * vocab + v] = acc[i][j];
        }
}

/* The per-row baseline: one warp a vocabulary row, the row's x from L2. */
__global__ void head_gemv_kernel(const __half *__restrict__ head, int64_t vocab, int dim,
                                 const float *__restrict__ x, float *__restrict__ logits)
{
    const int64_t v = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    const int lane = threadIdx.x & 31;
    if (v >= vocab)
        return;
    float s = 0.0f;
    for (int k = lane * 2; k < dim; k += 64) {
        const __half2 h = *reinterpret_cast<const __half2 *>(head + v * dim + k);
        const float2 f = __half22float2(h);
        s = fmaf(f.x, x[k], fmaf(f.y, x[k + 1], s));
    }
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if (lane == 0)
        logits[v] = s;
}

void launch_rows(const __half *head, int64_t vocab, int dim, const float *x, int n,
                 float *logits, cudaStream_t st)
{
    head_rows_kernel<<<(unsigned)((vocab + kVB - 1) / kVB), kThreads, 0, st>>>(head, vocab, dim,
                                                                              x, n, logits);
    CUDA_CHECK(cudaGetLastError());
}

void launch_gemv(const __half *head, int64_t vocab, int dim, const float *x, int n,
                 float *logits, cudaStream_t st)
{
    for (int r = 0; r < n; r++)
        head_gemv_kernel<<<(unsigned)((vocab * 32 + 255) / 256), 256, 0, st>>>(
            head, vocab, dim, x + (int64_t)r * dim, logits + (int64_t)r * vocab);
    CUDA_CHECK(cudaGetLastError());
}

struct Head {
    int64_t vocab;
    int dim;
    std::vector<__half> h;
    std::vector<float> hf; /* the same values as floats, for the reference */
    __half *d = nullptr;
};

Head make_head(int64_t vocab, int dim)
{
    Head h{vocab, dim, {}, {}, nullptr};
    h.h.resize((size_t)(vocab * dim));
    h.hf.resize(h.h.size());
    for (size_t i = 0; i < h.h.size(); i++) {
        h.h[i] = __float2half((float)lab_rand_range(-3000, 3000) / 20000.0f);
        h.hf[i] = __half2float(h.h[i]);
    }
    CUDA_CHECK(cudaMalloc((void **)&h.d, h.h.size() * sizeof(__half)));
    CUDA_CHECK(cudaMemcpy(h.d, h.h.data(), h.h.size() * sizeof(__half), cudaMemcpyHostToDevice));
    return h;
}

bool check(int64_t vocab, int dim, int n)
{
    Head h = make_head(vocab, dim);
    std::vector<float> x((size_t)n * dim);
    for (auto &v : x)
        v = (float)lab_rand_range(-4000, 4000) / 1000.0f;
    float *dx, *dl;
    CUDA_CHECK(cudaMalloc((void **)&dx, x.size() * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&dl, (size_t)n * vocab * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemset(dl, 0xff, (size_t)n * vocab * sizeof(float))); /* poisoned: NaN */
    launch_rows(h.d, vocab, dim, dx, n, dl, 0);
    std::vector<float> got((size_t)n * vocab);
    CUDA_CHECK(cudaMemcpy(got.data(), dl, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double worst = 0.0;
    for (int r = 0; r < n; r++)
        for (int64_t v = 0; v < vocab; v++) {
            double s = 0.0, mag = 0.0;
            for (int k = 0; k < dim; k++) {
                const double p = (double)h.hf[(size_t)(v * dim + k)] * x[(size_t)r * dim + k];
                s += p;
                mag += fabs(p);
            }
            const double e = fabs(got[(size_t)r * vocab + v] - s) / (mag + 1e-30);
            worst = !(e <= worst) ? e : worst;
        }
    cudaFree(dx), cudaFree(dl), cudaFree(h.d);
    const bool ok = worst <= 1e-6;
    printf("check vocab %lld dim %d rows %d: max error %.2e of sum |products| %s\n",
           (long long)vocab, dim, n, worst, ok ? "ok" : "FAIL");
    return ok;
}

double time_graph(void (*fn)(const __half *, int64_t, int, const float *, int, float *,
                             cudaStream_t),
                  const Head &h, const float *dx, int n, float *dl)
{
    cudaStream_t st;
    CUDA_CHECK(cudaStreamCreate(&st));
    fn(h.d, h.vocab, h.dim, dx, n, dl, st);
    const int calls = 10;
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CUDA_CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < calls; i++)
        fn(h.d, h.vocab, h.dim, dx, n, dl, st);
    CUDA_CHECK(cudaStreamEndCapture(st, &g));
    CUDA_CHECK(cudaGraphInstantiate(&ge, g, 0));
    CUDA_CHECK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    CUDA_CHECK(cudaEventRecord(e0, st));
    CUDA_CHECK(cudaGraphLaunch(ge, st));
    CUDA_CHECK(cudaEventRecord(e1, st));
    CUDA_CHECK(cudaEventSynchronize(e1));
    float ms;
    CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
    cudaGraphExecDestroy(ge), cudaGraphDestroy(g), cudaStreamDestroy(st);
    return ms * 1e3 / calls;
}

} // namespace

int main()
{
    bool ok = check(1000, 2560, 1) & check(777, 200, 64) & check(130, 64, 37) & check(65, 100, 3);
    if (!ok) {
        printf("FAILED\n");
        return 1;
    }
    const double copy = copy_gbs();
    const int64_t vocab = 128256;
    const int dim = 2560;
    Head h = make_head(vocab, dim);
    const double floor_us = (double)vocab * dim * 2 / (copy * 1e9) * 1e6;
    printf("copy bandwidth %.0f GB/s; the head's %.0f MB read once: %.1f us\n", copy,
           (double)vocab * dim * 2 / 1e6, floor_us);
    float *dx, *dl;
    CUDA_CHECK(cudaMalloc((void **)&dx, (size_t)64 * dim * sizeof(float)));
    CUDA_CHECK(cudaMemset(dx, 0, (size_t)64 * dim * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&dl, (size_t)64 * vocab * sizeof(float)));
    for (int n : {1, 8, 32, 64}) {
        const double rows = time_graph(launch_rows, h, dx, n, dl);
        const double gemv = time_graph(launch_gemv, h, dx, n, dl);
        printf("rows %2d: tiled %8.1f us (%.2fx the floor), a GEMV per row %8.1f us\n", n, rows,
               rows / floor_us, gemv);
    }
    return 0;
}
