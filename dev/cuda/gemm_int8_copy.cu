/*
 * gemm_int8_copy.cu - lab: the W2A8 product for tens to hundreds of rows as
 * cuBLAS's int8 GEMM over an int8 copy of the ternary codes (four times the
 * packed weights' bytes), with the W2A8 epilogue as a second kernel.
 *
 * From 65 rows the shipped table takes the warp-specialized wgmma kernels,
 * whose 192- or 256-row tiles take ~10 us over K = 2560 however few rows
 * they hold (docs/PERFORMANCE.md: cuBLAS BF16 is ahead on 2560 x 2560
 * between 64 and 256 rows). cuBLAS's int8 kernels read int8 weights, so the
 * codes -1..1 are given as int8; the int32 sums are then exactly the
 * shipped kernels' sum of (code + 1) x minus the activations' sum, and
 * the epilogue ((float)sum / act_scale) * w_scale makes the same floats.
 *
 * Timed (CUDA graphs of 50 calls over code copies larger than L2), per
 * shape and rows: the int8 GEMM alone, and with the epilogue kernel.
 * Checked: every output against the CPU reference, bit for bit (NaN
 * poisoned before).
 *
 *   make -C dev/cuda gemm_int8_copy
 *   dev/cuda/gemm_int8_copy [M,M,...] [NxK ...]   (default 16..512, the 2B-4T shapes)
 * Run `bitnet bench kernels --device cuda --m ... --shapes ...` in the same
 * call for the shipped kernels and cuBLAS BF16.
 */
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>

#include "common.cuh"
#include "cublas_lab.cuh"
#include "w2a8_epilogue.cuh"

namespace
{

/* sums [m][n] int32 = x [m][ldx] int8 . codes [n][k] int8 ^T (exact). */
cudaError_t gemm_int8(cublasHandle_t cb, const int8_t *codes, int64_t n, int64_t k, const int8_t *x,
                      int64_t m, int64_t ldx, int32_t *sums, cudaStream_t s)
{
    return lab_gemm_tn(cb, s, CUDA_R_8I, codes, n, k, x, m, ldx, sums);
}

__global__ void __launch_bounds__(256)
    epilogue_kernel(const int32_t *__restrict__ sums, int64_t m, int64_t n,
                    const float *__restrict__ act_scale, float w_scale, float *__restrict__ y)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * i >= m * n)
        return;
    /* Four outputs a thread (n is a multiple of 4, so they share a row). */
    const int4 v = reinterpret_cast<const int4 *>(sums)[i];
    const float sc = act_scale[(4 * i) / n];
    reinterpret_cast<float4 *>(y)[i] =
        make_float4(w2a8_epilogue(v.x, sc, w_scale), w2a8_epilogue(v.y, sc, w_scale),
                    w2a8_epilogue(v.z, sc, w_scale), w2a8_epilogue(v.w, sc, w_scale));
}

cudaError_t epilogue(const Problem &p, const int32_t *sums, cudaStream_t s)
{
    const int64_t quads = p.m * p.l.n / 4;
    epilogue_kernel<<<(unsigned)((quads + 255) / 256), 256, 0, s>>>(sums, p.m, p.l.n, p.d_scale,
                                                                    p.w_scale, p.d_y);
    return cudaGetLastError();
}

bool parse_rows(const char *arg, std::vector<int64_t> &rows)
{
    rows.clear();
    const char *c = arg;
    while (*c) {
        char *end = nullptr;
        const long v = strtol(c, &end, 10);
        if (end == c || v <= 0 || v > 65536)
            return false;
        rows.push_back(v);
        c = *end == ',' ? end + 1 : end;
        if (*end && *end != ',')
            return false;
    }
    return !rows.empty();
}

} // namespace

int main(int argc, char **argv)
{
    std::vector<int64_t> rows = {16, 32, 64, 128, 256, 512};
    int first = 1;
    if (argc > 1 && strchr(argv[1], 'x') == nullptr) {
        if (!parse_rows(argv[1], rows)) {
            fprintf(stderr, "usage: %s [M,M,...] [NxK ...]\n", argv[0]);
            return 2;
        }
        first = 2;
    }
    static const int64_t kDefaults[][2] = {{3840, 2560}, {2560, 2560}, {13824, 2560}, {2560, 6912}};
    lab_shape_list shapes;
    if (!lab_shapes(argc, argv, first, &shapes, kDefaults, 4))
        return 2;
    cublasHandle_t cb;
    CUBLAS_CHECK(cublasCreate(&cb));
    printf("copy bandwidth %.0f GB/s\n", copy_gbs());
    bool all_ok = true;
    for (const auto &sh : shapes) {
        const int64_t n = sh.first, k = sh.second;
        if (n % 4 != 0 || k % 4 != 0) {
            printf("%lld x %lld: cuBLAS's int8 GEMM needs n and k multiples of 4; skipped\n",
                   (long long)n, (long long)k);
            continue;
        }
        for (int64_t m : rows) {
            Problem p = make_problem(n, k, m, true);
            /* Copies of the codes totalling over 1 GiB, so every timed call
             * reads them from memory. */
            const size_t bytes = (size_t)(n * k);
            std::vector<int8_t *> copies;
            const int want = (int)(1024.0 * 1048576.0 / (double)bytes) + 2;
            for (int i = 0; i < (want > 256 ? 256 : want); i++)
                copies.push_back(upload(p.codes));
            int32_t *sums = nullptr;
            CUDA_CHECK(cudaMalloc((void **)&sums, (size_t)(m * n) * sizeof(int32_t)));
            poison(p);
            cudaError_t rc = gemm_int8(cb, copies[0], n, k, p.d_x, m, p.l.k_padded, sums, 0);
            if (rc == cudaSuccess)
                rc = epilogue(p, sums, 0);
            const bool ok = check(p, rc, "int8 copy");
            all_ok &= ok;
            const auto gemm = [&](int i, cudaStream_t s) {
                return gemm_int8(cb, copies[(size_t)i % copies.size()], n, k, p.d_x, m,
                                 p.l.k_padded, sums, s);
            };
            const double t_gemm = time_calls(gemm);
            const double t_both = time_calls([&](int i, cudaStream_t s) {
                const cudaError_t r = gemm(i, s);
                return r != cudaSuccess ? r : epilogue(p, sums, s);
            });
            printf("%6lld x %-6lld M %4lld: int8 GEMM %7.2f us, with the epilogue %7.2f us "
                   "(%.0f TOPS)  %s\n",
                   (long long)n, (long long)k, (long long)m, t_gemm, t_both,
                   2.0 * (double)n * (double)k * (double)m / (t_both * 1e-6) / 1e12,
                   ok ? "exact" : "WRONG");
            for (int8_t *c : copies)
                cudaFree(c);
            cudaFree(sums);
            free_problem(p);
        }
    }
    cublasDestroy(cb);
    printf(all_ok ? "all outputs equal the CPU's\n" : "FAILED\n");
    return all_ok ? 0 : 1;
}
