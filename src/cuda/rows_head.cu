/*
 * rows_head.cu - the LM head's input and output for many rows at once (the
 * batched pass, cuda_backend_rows.c), where the head is one tensor-core
 * GEMM over every wanted row instead of one GEMV per row.
 *
 * The head's weights are f16 or bf16; its input rows are fp32. A GEMM on
 * 16-bit tensor cores takes 16-bit inputs, so each input row is split
 * into 16-bit parts whose sum is the row: hi = round(v), lo = round(v -
 * hi), (bf16: a third part for what is left). The GEMMs of the parts add
 * up with fp32 accumulation, so the logits keep about 22 (f16) or 24
 * (bf16) bits of the input where one 16-bit copy would keep 11 or 8. So
 * that no part overflows or falls into f16's subnormals, each row is first
 * scaled by a power of two (exact) that brings its largest magnitude near
 * 2^14, and its logits are scaled back afterwards (exact too).
 *
 * The parts of a row are consecutive columns of the GEMM's input, so one
 * GEMM over n rows x parts columns reads the head's weights once (one GEMM
 * per part read them once a part: at 64 rows the head's time was two reads
 * of its 657 MB).
 *
 * bn_cb_rows_head_in    normed = output_norm(x + r) of the gathered rows,
 *                       as bn_cb_add_rmsnorm computes it, written as the
 *                       GEMM's parts (or fp32 for an fp32 head), with each
 *                       row's scale-back factor;
 * bn_cb_rows_combine    logits row k = (the sum of its parts' logits, in
 *                       part order) * that factor.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "block_reduce.cuh"
#include "cuda_backend_kernels.h"

namespace {

constexpr int kThreads = 512; /* as bn_cb_add_rmsnorm: the same sums */

struct SumD {
    __device__ double operator()(double a, double b) const { return __dadd_rn(a, b); }
};
struct MaxF {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumUpD { /* never below the exact sum of non-negative values */
    __device__ double operator()(double a, double b) const { return __dadd_ru(a, b); }
};

/* The screen's bound factor F of a row (rows_head_pick.cu): with m_v the
 * largest |w| of vocabulary row v, the GEMM of the rows' first parts
 * gives a_v = back sum hi_i w_vi and the head GEMV's logit of the row
 * (head_row.cuh) is within m_v F of it:
 *   - the other parts: |sum (y_i - back hi_i) w_vi| <= m_v R;
 *   - the tensor cores' fp32 sum of dim exact products, whatever its order
 *     and rounding (truncation included), within gamma sum |back hi_i w_vi|
 *     <= gamma m_v H, gamma = (dim + 64) 2^-21 (8 units of 2^-24 an add);
 *   - the GEMV's fp32 sum within g m_v L, g = (dim + 8) 2^-24 / (1 - (dim
 *     + 8) 2^-24).
 * So F = 1.01 (R + gamma H + g L), rounded up; +inf when a sum is not
 * finite (every vocabulary row is then computed exactly). */
__device__ float screen_factor(double L, double H, double R, int64_t dim)
{
    const double gamma = (double)(dim + 64) * 0x1p-21;
    double g = (double)(dim + 8) * 0x1p-24;
    g = g / (1.0 - g);
    const double f = __dmul_ru(1.01, __dadd_ru(R, __dadd_ru(__dmul_ru(gamma, H), __dmul_ru(g, L))));
    return isfinite(f) ? __double2float_ru(f) : INFINITY;
}

/* Block k: row lrow[k] of x + r, normed, into the parts of output row k. */
__global__ void __launch_bounds__(kThreads)
    rows_head_in_kernel(const float *__restrict__ x, const float *__restrict__ r, int64_t ld,
                        int64_t dim, const int32_t *__restrict__ lrow, const float *__restrict__ w,
                        float eps, int form, void *parts, int n_parts, float *__restrict__ unscale,
                        float *__restrict__ y_out, float *__restrict__ factor)
{
    __shared__ double red_d[32];
    __shared__ double red_u[32];
    __shared__ float red_f[32];
    const int64_t k = blockIdx.x;
    const int64_t row = lrow[k];
    const float *xr = x + row * ld, *rr = r + row * ld;
    double ss = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
        const float v = __fadd_rn(xr[i], rr[i]);
        ss = __dadd_rn(ss, __dmul_rn((double)v, (double)v));
    }
    ss = block_reduce(ss, SumD(), red_d);
    const float mean = __double2float_rn(__ddiv_rn(ss, (double)dim));
    const float inv = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(mean, eps)));
    if (form == BN_CB_ROWS_HEAD_F32) {
        float *y = static_cast<float *>(parts) + k * dim;
        for (int64_t i = threadIdx.x; i < dim; i += kThreads)
            y[i] = __fmul_rn(w[i], __fmul_rn(__fadd_rn(xr[i], rr[i]), inv));
        if (threadIdx.x == 0)
            unscale[k] = 1.0f;
        return;
    }
    /* The scale: a power of two taking the largest finite magnitude to
     * [2^13, 2^14) (1 when the row has none). */
    float big = 0.0f;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
        const float y = fabsf(__fmul_rn(w[i], __fmul_rn(__fadd_rn(xr[i], rr[i]), inv)));
        if (y <= 3.0e38f) /* finite: NaN and inf fail the test */
            big = fmaxf(big, y);
    }
    big = block_reduce(big, MaxF(), red_f);
    int e = 0;
    if (big > 0.0f)
        (void)frexpf(big, &e); /* big = m 2^e, m in [0.5, 1) */
    const int shift = big > 0.0f ? 14 - e : 0;
    const float back = ldexpf(1.0f, -shift);
    if (threadIdx.x == 0)
        unscale[k] = back;
    /* With y_out: the row itself, and the sums of the screen's bound
     * (rows_head_pick.cu): L = sum |y|, H = sum |back hi|, R = sum |y -
     * back hi|, in double rounded up (back hi is exact in double). */
    double l1 = 0.0, h1 = 0.0, r1 = 0.0;
    for (int64_t i = threadIdx.x; i < dim; i += kThreads) {
        const float y = __fmul_rn(w[i], __fmul_rn(__fadd_rn(xr[i], rr[i]), inv));
        const float v = ldexpf(y, shift);
        float hi_f;
        if (form == BN_CB_ROWS_HEAD_F16) {
            __half *p = static_cast<__half *>(parts) + k * n_parts * dim + i;
            const __half hi = __float2half_rn(v);
            p[0] = hi;
            p[dim] = __float2half_rn(v - __half2float(hi));
            hi_f = __half2float(hi);
        } else {
            __nv_bfloat16 *p = static_cast<__nv_bfloat16 *>(parts) + k * n_parts * dim + i;
            const __nv_bfloat16 hi = __float2bfloat16_rn(v);
            const float rest = v - __bfloat162float(hi);
            const __nv_bfloat16 mid = __float2bfloat16_rn(rest);
            p[0] = hi;
            p[dim] = mid;
            p[2 * dim] = __float2bfloat16_rn(rest - __bfloat162float(mid));
            hi_f = __bfloat162float(hi);
        }
        if (y_out) {
            y_out[k * dim + i] = y;
            const double h = (double)hi_f * (double)back;
            l1 = __dadd_ru(l1, fabs((double)y));
            h1 = __dadd_ru(h1, fabs(h));
            r1 = __dadd_ru(r1, fabs((double)y - h));
        }
    }
    if (!y_out)
        return;
    l1 = block_reduce(l1, SumUpD(), red_u);
    h1 = block_reduce(h1, SumUpD(), red_u);
    r1 = block_reduce(r1, SumUpD(), red_u);
    if (threadIdx.x == 0)
        factor[k] = screen_factor(l1, h1, r1, dim);
}

/* Thread v: column v of every row, rows in ascending order, in place:
 * output row k overwrites input row k, which belongs to row k / parts <= k,
 * already combined (the thread reads a row's parts before writing it), and
 * no other thread touches column v. */
__global__ void rows_combine_kernel(float *logits, int64_t vocab, int64_t n_rows, int parts,
                                    const float *__restrict__ unscale)
{
    for (int64_t v = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; v < vocab;
         v += (int64_t)gridDim.x * blockDim.x)
        for (int64_t k = 0; k < n_rows; k++) {
            const float *in = logits + k * parts * vocab + v;
            float sum = in[0];
            for (int p = 1; p < parts; p++)
                sum = __fadd_rn(sum, in[p * vocab]);
            logits[k * vocab + v] = __fmul_rn(sum, unscale[k]);
        }
}

} // namespace

extern "C" int bn_cb_rows_head_parts(int form)
{
    return form == BN_CB_ROWS_HEAD_F16 ? 2 : form == BN_CB_ROWS_HEAD_BF16 ? 3 : 1;
}

extern "C" cudaError_t bn_cb_rows_head_in(const float *x, const float *r, int64_t ld, int64_t dim,
                                          const int32_t *lrow, int64_t n_rows, const float *w,
                                          float eps, int form, void *parts, float *unscale,
                                          float *y, float *factor, cudaStream_t stream)
{
    if (!x || !r || !lrow || !w || !parts || !unscale || dim <= 0 || ld < dim || n_rows < 0 ||
        n_rows > INT32_MAX || form < BN_CB_ROWS_HEAD_F32 || form > BN_CB_ROWS_HEAD_BF16)
        return cudaErrorInvalidValue;
    if (n_rows == 0)
        return cudaSuccess;
    if ((y == NULL) != (factor == NULL) || (y && form == BN_CB_ROWS_HEAD_F32))
        return cudaErrorInvalidValue;
    rows_head_in_kernel<<<(unsigned)n_rows, kThreads, 0, stream>>>(
        x, r, ld, dim, lrow, w, eps, form, parts, bn_cb_rows_head_parts(form), unscale, y, factor);
    return cudaGetLastError();
}

extern "C" cudaError_t bn_cb_rows_combine(float *logits, int64_t vocab, int64_t n_rows, int parts,
                                          const float *unscale, cudaStream_t stream)
{
    if (!logits || !unscale || vocab <= 0 || n_rows < 0 || parts < 1 || parts > 3)
        return cudaErrorInvalidValue;
    if (n_rows == 0)
        return cudaSuccess;
    const int64_t blocks = (vocab + 255) / 256;
    rows_combine_kernel<<<(unsigned)(blocks < 4096 ? blocks : 4096), 256, 0, stream>>>(
        logits, vocab, n_rows, parts, unscale);
    return cudaGetLastError();
}
