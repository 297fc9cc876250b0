/* GPU test: the CUDA backend's LM head with fp32 activations
 * (bn_cb_head_gemv: the decode step's logits) for F32, F16 and BF16 weight
 * rows, against a double-precision CPU reference over the same weights:
 *
 *   - shapes with whole 16-byte rows (the vector path: dim % 4 for F32,
 *     dim % 8 for F16 / BF16), with rows that are not (the scalar path),
 *     rows of a single load per lane up to several passes (dim 2560 is 320
 *     loads of 16 bytes: one pass of the kernel's loads in flight; 4104
 *     takes two), row counts that are not multiples of a block's warps, and a
 *     vocabulary-sized row count;
 *   - logits poisoned with NaN first, with a guard value past the last row
 *     that must survive;
 *   - tolerance per logit: an fp32 sum of dim products in any order errs by
 *     at most (dim + 1) 2^-24 sum |w x| (the weights are exact in fp32, x is
 *     used as given), plus a tiny absolute term.
 *
 * Exits 77 without a usable GPU. */
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

static const char *const type_names[] = {"f32", "f16", "bf16"};

static void check_head(int type, int64_t rows, int64_t dim, int sm_count)
{
    const size_t esize = type == BN_CB_HEAD_F32 ? 4 : 2;
    void *w = malloc((size_t)rows * (size_t)dim * esize);
    float *wf = malloc((size_t)rows * (size_t)dim * sizeof(float)); /* w as the GPU reads it */
    float *x = malloc((size_t)dim * sizeof(float));
    float *got = malloc((size_t)(rows + 1) * sizeof(float));
    for (int64_t i = 0; i < rows * dim; i++) {
        const float v = test_rand_float(-1.0f, 1.0f);
        if (type == BN_CB_HEAD_F32) {
            ((float *)w)[i] = v;
            wf[i] = v;
        } else if (type == BN_CB_HEAD_F16) {
            ((uint16_t *)w)[i] = bn_fp32_to_fp16(v);
            wf[i] = bn_fp16_to_fp32(((uint16_t *)w)[i]);
        } else {
            ((uint16_t *)w)[i] = bn_fp32_to_bf16(v);
            wf[i] = bn_bf16_to_fp32(((uint16_t *)w)[i]);
        }
    }
    for (int64_t i = 0; i < dim; i++)
        x[i] = test_rand_float(-2.0f, 2.0f);

    void *d_w;
    float *d_x, *d_logits;
    CUDA_OK(cudaMalloc(&d_w, (size_t)rows * (size_t)dim * esize));
    CUDA_OK(cudaMalloc((void **)&d_x, (size_t)dim * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&d_logits, (size_t)(rows + 1) * sizeof(float)));
    CUDA_OK(cudaMemcpy(d_w, w, (size_t)rows * (size_t)dim * esize, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(d_x, x, (size_t)dim * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(d_logits, 0xff, (size_t)rows * sizeof(float))); /* NaN */
    const float guard = 12345.0f;
    CUDA_OK(cudaMemcpy(d_logits + rows, &guard, sizeof guard, cudaMemcpyHostToDevice));
    CUDA_OK(bn_cb_head_prepare(type, dim));
    CUDA_OK(bn_cb_head_gemv(d_w, type, rows, dim, d_x, d_logits, sm_count, 0));
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(got, d_logits, (size_t)(rows + 1) * sizeof(float),
                       cudaMemcpyDeviceToHost));

    int64_t bad = 0, first = -1;
    double worst = 0.0; /* error / bound */
    for (int64_t r = 0; r < rows; r++) {
        double ref = 0.0, mag = 0.0;
        for (int64_t i = 0; i < dim; i++) {
            const double p = (double)wf[r * dim + i] * (double)x[i];
            ref += p;
            mag += fabs(p);
        }
        const double bound = (double)(dim + 1) * 0x1p-24 * mag + 1e-30;
        const double e = fabs((double)got[r] - ref);
        if (!(e <= bound)) {
            if (bad++ == 0)
                first = r;
        } else if (e / bound > worst) {
            worst = e / bound;
        }
    }
    CHECK_MSG(bad == 0, "%s %lld x %lld: %lld logits off (first row %lld: gpu %.9g)",
              type_names[type], (long long)rows, (long long)dim, (long long)bad,
              (long long)first, first >= 0 ? got[first] : 0.0);
    CHECK_MSG(got[rows] == guard, "%s %lld x %lld: the value past the last row was written",
              type_names[type], (long long)rows, (long long)dim);
    printf("%-4s %6lld x %-5lld (%s path): %s, worst error %.3f of the bound\n", type_names[type],
           (long long)rows, (long long)dim,
           dim % (type == BN_CB_HEAD_F32 ? 4 : 8) == 0 ? "vector" : "scalar",
           bad ? "FAILED" : "as the reference", worst);
    cudaFree(d_w), cudaFree(d_x), cudaFree(d_logits);
    free(w), free(wf), free(x), free(got);
}

int main(void)
{
    const struct cudaDeviceProp prop = test_require_cuda(0, "");
    static const int64_t shapes[][2] = {
        {1000, 2560}, /* 2B-4T rows: one pass of loads per row (f16 / bf16) */
        {77, 4104},   /* two passes, the second partial */
        {513, 256},   /* short rows, a partial last block */
        {33, 100},    /* f32: vector; f16 / bf16: scalar */
        {9, 90},      /* scalar for every type */
        {20000, 2560}, /* more rows than the grid has warps: grid-stride */
    };
    for (int type = BN_CB_HEAD_F32; type <= BN_CB_HEAD_BF16; type++)
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            check_head(type, shapes[i][0], shapes[i][1], prop.multiProcessorCount);
    /* Bad arguments are refused. */
    float *d = NULL;
    CUDA_OK(cudaMalloc((void **)&d, 64));
    CHECK(bn_cb_head_gemv(d, BN_CB_HEAD_F16, 0, 8, d, d, 1, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_head_gemv(d, 7, 1, 8, d, d, 1, 0) == cudaErrorInvalidValue);
    CHECK(bn_cb_head_prepare(BN_CB_HEAD_F16, 0) == cudaErrorInvalidValue);
    cudaFree(d);
    TEST_EXIT();
}
