/*
 * w2a8_gemm_skinny.cu - lab: the "skinny" W2A8 GEMM for a few activation
 * rows, which the product does not ship (its mma-rows kernel,
 * src/cuda/w2a8_gemm_rows.cu, replaced it from 2 to 64 rows). Checked bit
 * for bit against the CPU and timed, with and without split-K.
 *
 *   1  B fragments straight from the packed weights, the activations of
 *      each chunk-group staged in shared memory, no split-K
 *   2  as 1, K split over blocks until about two blocks an SM, the int32
 *      partial sums added in a workspace and a second kernel's epilogue
 *
 * usage: w2a8_gemm_skinny [KERNEL] [M] [NxK ...]   (KERNEL 0: both; M 16)
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "w2a8_gemv.cuh"

namespace {

constexpr int kTileRows = kGemvTileRows;
constexpr int kGroup = kGemvGroup;
constexpr int kBlockBytes = kGemvBlockBytes;

/* ---- small M on tensor cores, B fragments straight from the packed weights ---
 *
 * For a few activation rows the weights dominate: each weight is used M
 * times only, so expanding it through shared memory costs more than the
 * multiply. Here a thread builds its mma B fragment directly from the
 * packed layout: for m16n8k32 the thread (gid, tig) needs the codes of row
 * gid at k = 4 tig .. 4 tig + 3 (b0) and 16 + 4 tig .. (b1) of a 32-wide
 * k-step, which are field tig of words 2s and 2s + 1 of its row's 16-byte
 * entry (cuda_layout.h): one shift and one mask each. The activation tile
 * (16 x 256 per chunk-group) is staged in shared memory. K is split over
 * blockIdx.y when the row blocks alone would not fill the GPU; the int32
 * partial sums then meet in a workspace (exact, order-free) and a second
 * kernel applies the epilogue. */

constexpr int kSkinnyWarps = 4;
constexpr int kSkinnyTilesPerWarp = 4; /* 4 x 8 = 32 weight rows per warp */
constexpr int kSkinnyRows = kSkinnyWarps * kSkinnyTilesPerWarp * kTileRows; /* 128 */
constexpr int kSkinnyStride = kGroup + 16;

template <int MT>
__global__ void __launch_bounds__(32 * kSkinnyWarps)
    skinny_kernel(const uint4 *__restrict__ w, const int8_t *__restrict__ x, int64_t ldx,
                  int64_t m, int64_t n, int64_t groups, int64_t tiles, int groups_per_split,
                  const float *__restrict__ act_scale, const int32_t *__restrict__ act_sum,
                  float w_scale, float *__restrict__ y, int64_t ldy, int32_t *__restrict__ ws)
{
    __shared__ __align__(16) int8_t xs[16 * MT * kSkinnyStride];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t m0 = (int64_t)blockIdx.z * 16 * MT;
    const int64_t tile0 = (int64_t)blockIdx.x * (kSkinnyRows / kTileRows) +
                          warp * kSkinnyTilesPerWarp;
    const int64_t g_begin = (int64_t)blockIdx.y * groups_per_split;
    const int64_t g_end = min(groups, g_begin + groups_per_split);

    int32_t acc[MT][kSkinnyTilesPerWarp][4] = {};
    for (int64_t g = g_begin; g < g_end; g++) {
        /* Stage activations rows m0 .. m0 + 16 MT, columns of chunk-group g. */
        for (int i = tid; i < 16 * MT * (kGroup / 16); i += 32 * kSkinnyWarps) {
            const int r = i / (kGroup / 16), c16 = i % (kGroup / 16);
            int4 v = make_int4(0, 0, 0, 0);
            if (m0 + r < m)
                v = __ldg(reinterpret_cast<const int4 *>(x + (m0 + r) * ldx + g * kGroup) + c16);
            *reinterpret_cast<int4 *>(&xs[r * kSkinnyStride + c16 * 16]) = v;
        }
        __syncthreads();
        /* All B entries of this chunk-group first: 16 loads in flight. */
        uint4 bw[4][kSkinnyTilesPerWarp];
#pragma unroll
        for (int q = 0; q < 4; q++)
#pragma unroll
            for (int t = 0; t < kSkinnyTilesPerWarp; t++) {
                const int64_t tile = tile0 + t;
                bw[q][t] = tile < tiles ? gemv_load_stream(w + (tile * groups + g) *
                                                                   (kBlockBytes / 16) +
                                                           q * 8 + gid)
                                        : make_uint4(0x55555555u, 0x55555555u, 0x55555555u,
                                                     0x55555555u);
            }
#pragma unroll
        for (int q = 0; q < 4; q++) {
#pragma unroll
            for (int s = 0; s < 2; s++) {
                const int kk = q * 64 + s * 32;
                uint32_t af[MT][4];
#pragma unroll
                for (int i = 0; i < MT; i++) {
                    const int8_t *base = &xs[(16 * i + gid) * kSkinnyStride + kk + tig * 4];
                    af[i][0] = *reinterpret_cast<const uint32_t *>(base);
                    af[i][1] = *reinterpret_cast<const uint32_t *>(base + 8 * kSkinnyStride);
                    af[i][2] = *reinterpret_cast<const uint32_t *>(base + 16);
                    af[i][3] = *reinterpret_cast<const uint32_t *>(base + 8 * kSkinnyStride + 16);
                }
#pragma unroll
                for (int t = 0; t < kSkinnyTilesPerWarp; t++) {
                    const uint32_t lo = s ? bw[q][t].z : bw[q][t].x;
                    const uint32_t hi = s ? bw[q][t].w : bw[q][t].y;
                    const uint32_t bf[2] = {(lo >> (2 * tig)) & 0x03030303u,
                                            (hi >> (2 * tig)) & 0x03030303u};
#pragma unroll
                    for (int i = 0; i < MT; i++)
                        w2a8_mma_s8(acc[i][t], af[i], bf);
                }
            }
        }
        __syncthreads();
    }

    const bool split = gridDim.y > 1;
#pragma unroll
    for (int i = 0; i < MT; i++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            const int64_t row = m0 + 16 * i + gid + 8 * half;
            if (row >= m)
                continue;
#pragma unroll
            for (int t = 0; t < kSkinnyTilesPerWarp; t++)
#pragma unroll
                for (int c = 0; c < 2; c++) {
                    const int64_t col = (tile0 + t) * kTileRows + 2 * tig + c;
                    if (col >= n)
                        continue;
                    const int32_t v = acc[i][t][2 * half + c];
                    if (split)
                        atomicAdd(&ws[row * n + col], v);
                    else
                        y[row * ldy + col] =
                            w2a8_epilogue(v - act_sum[row], act_scale[row], w_scale);
                }
        }
}

__global__ void skinny_epilogue(const int32_t *__restrict__ ws, int64_t m, int64_t n,
                                const float *__restrict__ act_scale,
                                const int32_t *__restrict__ act_sum, float w_scale,
                                float *__restrict__ y, int64_t ldy)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= m * n)
        return;
    const int64_t row = i / n, col = i % n;
    y[row * ldy + col] = w2a8_epilogue(ws[i] - act_sum[row], act_scale[row], w_scale);
}

cudaError_t launch_skinny(const w2a8_args *a, cudaStream_t stream)
{
    const int mt = a->m <= 16 ? 1 : 2;
    const int64_t row_blocks = (a->tiles * kTileRows + kSkinnyRows - 1) / kSkinnyRows;
    const int64_t m_blocks = (a->m + 16 * mt - 1) / (16 * mt);
    /* Split K until about two blocks per SM exist (needs the workspace). */
    int64_t splits = 1;
    if (a->workspace) {
        const int64_t want = 2 * (int64_t)(a->sm_count > 0 ? a->sm_count : 132);
        splits = (want + row_blocks * m_blocks - 1) / (row_blocks * m_blocks);
        splits = splits < 1 ? 1 : splits > a->groups ? a->groups : splits;
    }
    const int64_t per_split = (a->groups + splits - 1) / splits;
    splits = (a->groups + per_split - 1) / per_split;
    if (splits > 1) {
        cudaError_t rc =
            cudaMemsetAsync(a->workspace, 0, (size_t)(a->m * a->n) * sizeof(int32_t), stream);
        if (rc != cudaSuccess)
            return rc;
    }
    const dim3 grid((unsigned)row_blocks, (unsigned)splits, (unsigned)m_blocks);
    if (mt == 1)
        skinny_kernel<1><<<grid, 32 * kSkinnyWarps, 0, stream>>>(
            reinterpret_cast<const uint4 *>(a->weights), a->x, a->ldx, a->m, a->n, a->groups,
            a->tiles, (int)per_split, a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy,
            a->workspace);
    else
        skinny_kernel<2><<<grid, 32 * kSkinnyWarps, 0, stream>>>(
            reinterpret_cast<const uint4 *>(a->weights), a->x, a->ldx, a->m, a->n, a->groups,
            a->tiles, (int)per_split, a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy,
            a->workspace);
    cudaError_t rc = cudaGetLastError();
    if (rc != cudaSuccess || splits == 1)
        return rc;
    const int64_t total = a->m * a->n;
    skinny_epilogue<<<(unsigned)((total + 255) / 256), 256, 0, stream>>>(
        a->workspace, a->m, a->n, a->act_scale, a->act_sum, a->weight_scale, a->y, a->ldy);
    return cudaGetLastError();
}

/* Kernel 1 (no workspace: one split) or 2 (split-K through it). */
cudaError_t run(int kernel, w2a8_args a, cudaStream_t stream)
{
    if (kernel == 1)
        a.workspace = nullptr;
    return launch_skinny(&a, stream);
}

bool check_all(int64_t n, int64_t k, int64_t m, int only, int sms)
{
    Problem p = make_problem(n, k, m);
    bool ok = true;
    for (int kernel = 1; kernel <= 2; kernel++) {
        if (only && kernel != only)
            continue;
        char what[80];
        snprintf(what, sizeof what, "%lldx%lld M %lld kernel %d", (long long)n, (long long)k,
                 (long long)m, kernel);
        poison(p);
        ok = check(p, run(kernel, p.args(sms), 0), what) && ok;
    }
    free_problem(p);
    return ok;
}

} // namespace

int main(int argc, char **argv)
{
    const int only = argc > 1 ? atoi(argv[1]) : 0;
    const int64_t m = argc > 2 ? atoll(argv[2]) : 16;
    if (only < 0 || only > 2 || m < 1 || m > 65535 * 32) {
        fprintf(stderr, "usage: %s [KERNEL 1-2] [M] [NxK ...]\n", argv[0]);
        return 2;
    }
    lab_shape_list shapes;
    if (!lab_shapes(argc, argv, 3, &shapes))
        return 2;
    const int sms = device_sms();

    bool ok = true;
    for (int i = 0; i < 12; i++) /* ragged shapes, 2 to 40 rows */
        ok = check_all(lab_rand_range(1, 700), lab_rand_range(1, 3000), lab_rand_range(2, 40),
                       only, sms) && ok;
    for (const auto &s : shapes)
        ok = check_all(s.first, s.second, m, only, sms) && ok;
    printf("check: %s\n\n", ok ? "every kernel bit for bit the CPU's" : "FAILED");

    const double copy = copy_gbs();
    printf("copy bandwidth %.0f GB/s (read + write); %d SMs; M = %lld\n\n", copy, sms,
           (long long)m);
    printf("| N x K | kernel | us | GB/s |\n|---|---|---|---|\n");
    for (const auto &s : shapes) {
        Problem p = make_problem(s.first, s.second, m);
        make_copies(p);
        const double bytes = (double)p.l.bytes + (double)(m * p.l.k_padded) +
                             4.0 * (double)(m * p.l.n);
        for (int kernel = 1; kernel <= 2; kernel++) {
            if (only && kernel != only)
                continue;
            const w2a8_args base = p.args(sms);
            const double us = time_calls([&](int i, cudaStream_t st) {
                w2a8_args a = base;
                a.weights = p.copies[(size_t)i % p.copies.size()];
                return run(kernel, a, st);
            });
            printf("| %lldx%lld | %d %s | %.2f | %.0f |\n", (long long)s.first,
                   (long long)s.second, kernel, kernel == 1 ? "skinny" : "skinny split-K", us,
                   bytes / (us * 1e-6) / 1e9);
        }
        free_problem(p);
    }
    return ok ? 0 : 1;
}
