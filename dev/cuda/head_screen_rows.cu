/*
 * head_screen_rows.cu - lab: what a screened LM head for many rows at once
 * would cost, beside the batched pass's head as it ships.
 *
 * The batched CUDA pass (docs/CUDA.md, "Many sequences at once") computes
 * the logits of its wanted rows with one cuBLAS GEMM over the f16 head
 * (656 MB for 2B-4T), each row given as two f16 parts (hi + lo) side by
 * side: N = 2 rows columns. The single-sequence step screens instead
 * (head_screen.cu): the int8 copy of the head (half the bytes, one scale a
 * row) gives every vocabulary row an estimate and a bound, and only the
 * rows that can hold the argmax are computed exactly. Its estimate meets x
 * as two int8 codes a value (x ~ sx (128 h + l)), so for many rows the
 * screen's products are one int8 GEMM: the int8 head times 2 rows int8
 * code columns, exact int32 sums (cuBLAS, CUBLAS_COMPUTE_32I).
 *
 * Timed here, at 1 to 256 rows on the 2B-4T head:
 *   f16   the shipped product: cublasGemmEx f16 x f16 -> fp32, 2 rows columns
 *   int8  the screen's product: cublasGemmEx s8 x s8 -> s32, 2 rows columns
 *   pass  int8, then a kernel reading its int32 sums once: each (vocabulary
 *         row, x row)'s estimate and lower end (a_r -+ b_r with the single
 *         row screen's form of bound, its parts precomputed a row), and each
 *         block's largest lower end per x row: the traffic a batched screen
 *         adds before its exact pass (which computes a few rows per x row)
 * Checked: the int32 sums against the CPU's on sampled entries (exact),
 * and the estimates within the bound of the double-precision logits of
 * the f16 head for the sampled entries.
 *
 *   make -C dev/cuda head_screen_rows && dev/cuda/head_screen_rows
 */
#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include <vector>

#include "common.cuh"
#include "cublas_lab.cuh"

namespace
{

constexpr int kMaxRows = 256;

/* The head: f16 rows, their int8 codes with one scale a row (s = max|w| /
 * 127, code = rint(w / s)) and each row's bound factor e_r (the single-row
 * screen's 1.01 (0.501 s + g (m + 127 s)), g = (n + 8) 2^-24). */
struct Head {
    int64_t vocab;
    int dim;
    std::vector<__half> hf;
    std::vector<int8_t> q;
    std::vector<float> scale, e;
    __half *d_hf = nullptr;
    int8_t *d_q = nullptr;
    float *d_scale = nullptr, *d_e = nullptr;
};

static Head make_head(int64_t vocab, int dim)
{
    Head h;
    h.vocab = vocab;
    h.dim = dim;
    h.hf.resize((size_t)vocab * dim);
    h.q.resize((size_t)vocab * dim);
    h.scale.resize((size_t)vocab);
    h.e.resize((size_t)vocab);
    const double g = (dim + 8) * 0x1p-24 / (1.0 - (dim + 8) * 0x1p-24);
    for (int64_t v = 0; v < vocab; v++) {
        float m = 0.0f;
        for (int k = 0; k < dim; k++) {
            const float w = ((float)(lab_rand() % 20001) - 10000.0f) * 1e-5f;
            h.hf[(size_t)(v * dim + k)] = __float2half(w);
            m = fmaxf(m, fabsf(__half2float(h.hf[(size_t)(v * dim + k)])));
        }
        const float s = m > 0.0f ? m / 127.0f : 1.0f;
        for (int k = 0; k < dim; k++)
            h.q[(size_t)(v * dim + k)] = (int8_t)lrintf(
                fminf(127.0f, fmaxf(-127.0f, __half2float(h.hf[(size_t)(v * dim + k)]) / s)));
        h.scale[(size_t)v] = s;
        h.e[(size_t)v] = (float)(1.01 * (0.501 * s + g * (m + 127.0 * s)));
    }
    h.d_hf = upload(h.hf);
    h.d_q = upload(h.q);
    h.d_scale = upload(h.scale);
    h.d_e = upload(h.e);
    return h;
}

/* x rows, each as the two forms the products take: f16 parts hi + lo (the
 * shipped head's columns 2r, 2r + 1) and int8 codes h, l with x ~ sx (128
 * h + l) (the screen's), with L = sum |x| and ex = sum |x - y| per row. */
struct Rows {
    int n;
    std::vector<float> x, sx, L, ex;
    std::vector<__half> parts;
    std::vector<int8_t> codes;
    __half *d_parts = nullptr;
    int8_t *d_codes = nullptr;
    float *d_sx = nullptr, *d_L = nullptr, *d_ex = nullptr;
};

static Rows make_rows(int n, int dim)
{
    Rows r;
    r.n = n;
    r.x.resize((size_t)n * dim);
    r.parts.resize((size_t)2 * n * dim);
    r.codes.resize((size_t)2 * n * dim);
    r.sx.resize(n);
    r.L.resize(n);
    r.ex.resize(n);
    for (int i = 0; i < n; i++) {
        float m = 0.0f;
        double L = 0.0;
        for (int k = 0; k < dim; k++) {
            const float v = ((float)(lab_rand() % 20001) - 10000.0f) * 3e-4f;
            r.x[(size_t)i * dim + k] = v;
            m = fmaxf(m, fabsf(v));
            L += fabs(v);
        }
        /* sx: the largest |x| over 127 x 128, so h = rint(x / (128 sx)) is
         * in [-127, 127] and l = rint(x / sx - 128 h) in [-64, 64]. */
        const float sx = m > 0.0f ? m / (127.0f * 128.0f) : 1.0f;
        double ex = 0.0;
        for (int k = 0; k < dim; k++) {
            const float v = r.x[(size_t)i * dim + k];
            const float hv = rintf(v / (128.0f * sx));
            const float lv = fminf(127.0f, fmaxf(-127.0f, rintf(v / sx - 128.0f * hv)));
            r.codes[(size_t)(2 * i) * dim + k] = (int8_t)hv;
            r.codes[(size_t)(2 * i + 1) * dim + k] = (int8_t)lv;
            ex += fabs((double)v - (double)sx * (128.0 * hv + lv));
            const __half hi = __float2half(v);
            r.parts[(size_t)(2 * i) * dim + k] = hi;
            r.parts[(size_t)(2 * i + 1) * dim + k] = __float2half(v - __half2float(hi));
        }
        r.sx[i] = sx;
        r.L[i] = (float)(L * (1.0 + 1e-6));
        r.ex[i] = (float)(ex * (1.0 + 1e-6));
    }
    r.d_parts = upload(r.parts);
    r.d_codes = upload(r.codes);
    r.d_sx = upload(r.sx);
    r.d_L = upload(r.L);
    r.d_ex = upload(r.ex);
    return r;
}

static void free_rows(Rows &r)
{
    cudaFree(r.d_parts), cudaFree(r.d_codes), cudaFree(r.d_sx), cudaFree(r.d_L), cudaFree(r.d_ex);
}

/* The shipped product: logits [2 n][vocab] fp32 = parts x head^T. */
static cudaError_t product_f16(cublasHandle_t cb, const Head &h, const Rows &r, float *out,
                               cudaStream_t s)
{
    return lab_gemm_tn(cb, s, CUDA_R_16F, h.d_hf, h.vocab, h.dim, r.d_parts, 2 * r.n, h.dim, out);
}

/* The screen's product: sums [2 n][vocab] int32 = codes x q^T, exact. */
static cudaError_t product_int8(cublasHandle_t cb, const Head &h, const Rows &r, int32_t *out,
                                cudaStream_t s)
{
    return lab_gemm_tn(cb, s, CUDA_R_8I, h.d_q, h.vocab, h.dim, r.d_codes, 2 * r.n, h.dim, out);
}

/* Each (vocabulary row v, x row i): a = s_v sx_i (128 H + L) from the int32
 * sums, the lower end a - b, b = L_i e_v + 127 s_v ex_i; each block's
 * largest lower end per x row into lows[block][i]. A block: 256 vocabulary
 * rows, a thread a row, all x rows in turn (the sums of one x row's two
 * columns are vocab apart). */
constexpr int kBoundThreads = 256;

__global__ void __launch_bounds__(kBoundThreads)
    bounds_kernel(const int32_t *__restrict__ sums, int64_t vocab, int n,
                  const float *__restrict__ scale, const float *__restrict__ e,
                  const float *__restrict__ sx, const float *__restrict__ L,
                  const float *__restrict__ ex, float *__restrict__ lows)
{
    __shared__ float best[kBoundThreads / 32];
    const int64_t v = (int64_t)blockIdx.x * kBoundThreads + threadIdx.x;
    const bool in = v < vocab;
    const float s = in ? scale[v] : 0.0f, ev = in ? e[v] : 0.0f;
    for (int i = 0; i < n; i++) {
        float low = -INFINITY;
        if (in) {
            const int32_t hs = sums[(int64_t)(2 * i) * vocab + v];
            const int32_t ls = sums[(int64_t)(2 * i + 1) * vocab + v];
            const float a = s * sx[i] * (float)(128ll * hs + ls);
            const float b = __fadd_ru(__fmul_ru(L[i], ev), __fmul_ru(127.0f * s, ex[i]));
            low = __fsub_rd(a, b);
        }
        for (int o = 16; o > 0; o >>= 1)
            low = fmaxf(low, __shfl_xor_sync(0xffffffffu, low, o));
        if ((threadIdx.x & 31) == 0)
            best[threadIdx.x >> 5] = low;
        __syncthreads();
        if (threadIdx.x == 0) {
            float m = best[0];
            for (int w = 1; w < kBoundThreads / 32; w++)
                m = fmaxf(m, best[w]);
            lows[(int64_t)blockIdx.x * n + i] = m;
        }
        __syncthreads();
    }
}

static cudaError_t bounds(const Head &h, const Rows &r, const int32_t *sums, float *lows,
                          cudaStream_t s)
{
    const unsigned blocks = (unsigned)((h.vocab + kBoundThreads - 1) / kBoundThreads);
    bounds_kernel<<<blocks, kBoundThreads, 0, s>>>(sums, h.vocab, r.n, h.d_scale, h.d_e, r.d_sx,
                                                   r.d_L, r.d_ex, lows);
    return cudaGetLastError();
}

/* The int32 sums of sampled entries against the CPU's (exact), and each
 * sampled estimate within its bound of the f16 head's logit in double. */
static bool check(cublasHandle_t cb, const Head &h, int n)
{
    Rows r = make_rows(n, h.dim);
    int32_t *d_sums;
    float *d_lows;
    const unsigned blocks = (unsigned)((h.vocab + kBoundThreads - 1) / kBoundThreads);
    CUDA_CHECK(cudaMalloc((void **)&d_sums, (size_t)2 * n * h.vocab * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc((void **)&d_lows, (size_t)blocks * n * sizeof(float)));
    CUDA_CHECK(product_int8(cb, h, r, d_sums, 0));
    CUDA_CHECK(bounds(h, r, d_sums, d_lows, 0));
    std::vector<int32_t> sums((size_t)2 * n * h.vocab);
    CUDA_CHECK(
        cudaMemcpy(sums.data(), d_sums, sums.size() * sizeof(int32_t), cudaMemcpyDeviceToHost));
    int64_t wrong = 0, outside = 0, tried = 0;
    for (int t = 0; t < 2000; t++) {
        const int i = (int)lab_rand_range(0, n - 1);
        const int64_t v = lab_rand_range(0, h.vocab - 1);
        int64_t hs = 0, ls = 0;
        double logit = 0.0;
        for (int k = 0; k < h.dim; k++) {
            const int q = h.q[(size_t)(v * h.dim + k)];
            hs += (int64_t)q * r.codes[(size_t)(2 * i) * h.dim + k];
            ls += (int64_t)q * r.codes[(size_t)(2 * i + 1) * h.dim + k];
            logit +=
                (double)__half2float(h.hf[(size_t)(v * h.dim + k)]) * r.x[(size_t)i * h.dim + k];
        }
        wrong += sums[(size_t)(2 * i) * h.vocab + v] != hs ||
                 sums[(size_t)(2 * i + 1) * h.vocab + v] != ls;
        const double a = (double)h.scale[v] * r.sx[i] * (128.0 * hs + ls);
        const double b = (double)r.L[i] * h.e[v] + 127.0 * h.scale[v] * r.ex[i];
        outside += fabs(logit - a) > b;
        tried++;
    }
    free_rows(r);
    cudaFree(d_sums), cudaFree(d_lows);
    const bool ok = wrong == 0 && outside == 0;
    printf("check %d rows: %lld sampled sums, %lld differ from the CPU's, %lld estimates outside "
           "their bound: %s\n",
           n, (long long)tried, (long long)wrong, (long long)outside, ok ? "ok" : "FAIL");
    return ok;
}

} // namespace

int main()
{
    cublasHandle_t cb;
    CUBLAS_CHECK(cublasCreate(&cb));
    {
        Head small = make_head(4100, 256); /* cuBLAS's int8 GEMM: rows a multiple of 4 */
        bool ok = check(cb, small, 1) & check(cb, small, 13) & check(cb, small, 64);
        cudaFree(small.d_hf), cudaFree(small.d_q), cudaFree(small.d_scale), cudaFree(small.d_e);
        if (!ok) {
            printf("FAILED\n");
            return 1;
        }
    }
    const double copy = copy_gbs();
    const int64_t vocab = 128256;
    const int dim = 2560;
    Head h = make_head(vocab, dim);
    printf("copy bandwidth %.0f GB/s; the f16 head (%.0f MB) read once %.1f us, the int8 copy "
           "%.1f us\n",
           copy, (double)vocab * dim * 2 / 1e6, (double)vocab * dim * 2 / (copy * 1e9) * 1e6,
           (double)vocab * dim / (copy * 1e9) * 1e6);
    float *d_logits, *d_lows;
    int32_t *d_sums;
    CUDA_CHECK(cudaMalloc((void **)&d_logits, (size_t)2 * kMaxRows * vocab * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&d_sums, (size_t)2 * kMaxRows * vocab * sizeof(int32_t)));
    CUDA_CHECK(cudaMalloc((void **)&d_lows,
                          (size_t)(vocab / kBoundThreads + 1) * kMaxRows * sizeof(float)));
    for (int n : {1, 8, 32, 64, 128, 256}) {
        Rows r = make_rows(n, dim);
        const double f16 = time_calls(
            [&](int, cudaStream_t s) { return product_f16(cb, h, r, d_logits, s); }, 10, 5);
        const double i8 = time_calls(
            [&](int, cudaStream_t s) { return product_int8(cb, h, r, d_sums, s); }, 10, 5);
        const double pass = time_calls(
            [&](int, cudaStream_t s) {
                const cudaError_t rc = product_int8(cb, h, r, d_sums, s);
                return rc != cudaSuccess ? rc : bounds(h, r, d_sums, d_lows, s);
            },
            10, 5);
        printf("rows %3d: f16 product %8.1f us | int8 product %8.1f us | int8 + bounds %8.1f us "
               "(%.2fx the f16 product)\n",
               n, f16, i8, pass, pass / f16);
        free_rows(r);
    }
    cublasDestroy(cb);
    return 0;
}
