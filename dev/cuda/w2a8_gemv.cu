/*
 * w2a8_gemv.cu - lab: forms of the W2A8 GEMV (M = 1) that the product does
 * not ship, beside the one bn_w2a8_cuda_gemv runs, each checked bit for bit
 * against the CPU and timed (alone, and chained by programmatic dependent
 * launch where the kernel waits for its inputs).
 *
 *   1  2 chunk-groups in flight per warp, activations read through L1
 *   2  4 in flight, through L1 (the product's form for rows over 160 KiB)
 *   3  8 in flight, through L1
 *   4  4 in flight, the activation row staged in shared memory (the
 *      product's bn_w2a8_cuda_gemv)
 *   5  as 4, each 2-bit field masked in place (one logic op a field)
 *   6  one tile a block, its packed weights and the row copied into shared
 *      memory by two bulk copies of the tensor memory accelerator, the
 *      weights' before the PDL wait (sm_90)
 *   7  several consecutive tiles a block, one bulk copy a tile before the
 *      PDL wait, the row once a block after it, fields masked in place,
 *      row sums added in shared memory (sm_90; `split` read as blocks an
 *      SM)
 *
 * usage: w2a8_gemv [KERNEL] [NxK ...]   (KERNEL 0 or none: all)
 *
 * The weight layout is src/kernels/cuda_layout.h; the GEMV's shared pieces
 * (the streaming load, the dot, the tile epilogue) are src/cuda's
 * w2a8_gemv.cuh, the PDL and bulk-copy helpers its pdl.cuh.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include "common.cuh"
#include "pdl.cuh"
#include "smem_opt_in.cuh"
#include "w2a8_gemv.cuh"

namespace {

constexpr int kTileRows = kGemvTileRows;
constexpr int kGroup = kGemvGroup;
constexpr int kBlockBytes = kGemvBlockBytes;
/* Bytes of shared memory a bulk GEMV block may take (kernels 6, 7). */
constexpr int64_t kBulkMaxSmem = 96 * 1024;
constexpr int64_t kBulkTilesMaxSmem = 220 * 1024;

/* u8 x s8 dot of four byte pairs (PTX dp4a.u32.s32), for fields kept in
 * place (values up to 192, so they must be unsigned). */
__device__ __forceinline__ int dp4a_us(uint32_t a, int b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* As gemv_entry_dot, but each 2-bit field is masked in place instead of shifted
 * down: field j then holds code * 4^j, accumulated separately and divided
 * out at the end (exactly: every term is a multiple of 4^j). One logic op
 * per field instead of two. */
__device__ __forceinline__ void entry_dot_fields(uint4 w, const int8_t *x, int acc[4])
{
    const int4 *xv = reinterpret_cast<const int4 *>(x);
    const uint32_t words[4] = {w.x, w.y, w.z, w.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const int4 a = xv[i];
        const uint32_t wd = words[i];
        acc[0] = dp4a_us(wd & 0x03030303u, a.x, acc[0]);
        acc[1] = dp4a_us(wd & 0x0c0c0c0cu, a.y, acc[1]);
        acc[2] = dp4a_us(wd & 0x30303030u, a.z, acc[2]);
        acc[3] = dp4a_us(wd & 0xc0c0c0c0u, a.w, acc[3]);
    }
}

/* One block: TILES tiles of 8 rows, WARPS warps per tile splitting K.
 * UNROLL chunk-groups are loaded before any is used (bytes in flight).
 * X_SMEM stages the activation row in shared memory (dynamic, k_padded
 * bytes) instead of reading it through L1. */
template <int WARPS, int TILES, int UNROLL, bool X_SMEM, bool FIELDS = false>
__global__ void __launch_bounds__(32 * WARPS * TILES)
    gemv_kernel(const uint4 *__restrict__ w, const int8_t *__restrict__ x, int64_t n,
                int64_t groups, int64_t tiles, const float *__restrict__ act_scale,
                const int32_t *__restrict__ act_sum, float w_scale, float *__restrict__ y)
{
    extern __shared__ __align__(16) int8_t x_shared[];
    __shared__ int partial[TILES][WARPS][kTileRows];
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int tile_in_block = warp / WARPS;
    const int split = warp % WARPS;
    const int64_t tile = (int64_t)blockIdx.x * TILES + tile_in_block;

    const int8_t *xs = x;
    if (X_SMEM) {
        const int64_t words = groups * kGroup / 16;
        gemv_stage_row(x_shared, x, words, (int)threadIdx.x, (int)blockDim.x);
        __syncthreads();
        xs = x_shared;
    }

    int acc = 0;
    int fields[4] = {0, 0, 0, 0};
    if (tile < tiles) {
        const int quarter = lane >> 3;
        const uint4 *blocks = w + tile * groups * (kBlockBytes / 16) + lane;
        const int8_t *xq = xs + quarter * 64;
        int64_t g = split;
        for (; g + (UNROLL - 1) * WARPS < groups; g += UNROLL * WARPS) {
            uint4 v[UNROLL];
#pragma unroll
            for (int u = 0; u < UNROLL; u++)
                v[u] = gemv_load_stream(blocks + (g + u * WARPS) * (kBlockBytes / 16));
#pragma unroll
            for (int u = 0; u < UNROLL; u++) {
                if (FIELDS)
                    entry_dot_fields(v[u], xq + (g + u * WARPS) * kGroup, fields);
                else
                    acc = gemv_entry_dot(v[u], xq + (g + u * WARPS) * kGroup, acc);
            }
        }
        for (; g < groups; g += WARPS) {
            if (FIELDS)
                entry_dot_fields(gemv_load_stream(blocks + g * (kBlockBytes / 16)), xq + g * kGroup,
                                 fields);
            else
                acc = gemv_entry_dot(gemv_load_stream(blocks + g * (kBlockBytes / 16)),
                                     xq + g * kGroup, acc);
        }
    }
    if (FIELDS)
        acc = fields[0] + (fields[1] >> 2) + (fields[2] >> 4) + (fields[3] >> 6);
    gemv_tile_epilogue<WARPS, TILES>(
        acc, partial, tile_in_block, split, lane, threadIdx.x, n, [&](int64_t out_row, int total) {
            y[out_row] = w2a8_epilogue(total - act_sum[0], act_scale[0], w_scale);
        });
}

template <int WARPS, int TILES, int UNROLL, bool X_SMEM, bool FIELDS>
cudaError_t launch_gemv(const w2a8_args *a, cudaStream_t stream)
{
    const int64_t blocks = (a->tiles + TILES - 1) / TILES;
    const size_t smem = X_SMEM ? (size_t)(a->groups * kGroup) : 0;
    auto kernel = gemv_kernel<WARPS, TILES, UNROLL, X_SMEM, FIELDS>;
    const cudaError_t rc = allow_dynamic_smem(kernel, smem);
    if (rc != cudaSuccess)
        return rc;
    kernel<<<(unsigned)blocks, 32 * WARPS * TILES, smem, stream>>>(
        reinterpret_cast<const uint4 *>(a->weights), a->x, a->n, a->groups, a->tiles,
        a->act_scale, a->act_sum, a->weight_scale, a->y);
    return cudaGetLastError();
}

template <int UNROLL, bool X_SMEM, bool FIELDS = false>
cudaError_t launch_gemv_split(const w2a8_args *a, int split, cudaStream_t stream)
{
    switch (split) {
    case 1: return launch_gemv<1, 4, UNROLL, X_SMEM, FIELDS>(a, stream);
    case 2: return launch_gemv<2, 2, UNROLL, X_SMEM, FIELDS>(a, stream);
    case 4: return launch_gemv<4, 1, UNROLL, X_SMEM, FIELDS>(a, stream);
    case 8: return launch_gemv<8, 1, UNROLL, X_SMEM, FIELDS>(a, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- GEMV with every operand copied in bulk ---------------------------------
 *
 * One tile (8 rows) per block, WARPS warps splitting its K as gemv_kernel
 * does. Thread 0 copies the tile's packed weights (groups x 512 bytes,
 * contiguous in the layout) into shared memory with one bulk copy by the
 * tensor memory accelerator before the PDL wait, and the activation row
 * (groups x 256 bytes) after it. Every byte a block needs is requested at
 * once and no registers are held for loads in flight, so a GPU full of
 * blocks has the matrix in flight from the start (a register-prefetching
 * warp has at most 8 entries out), and a chained kernel's waiting blocks
 * hold only shared memory. The int32 sums are exact, so the output is
 * gemv_kernel's bit for bit. sm_90 only (bulk_usable says where it
 * runs). */
template <int WARPS>
__global__ void __launch_bounds__(32 * WARPS)
    gemv_bulk_kernel(const uint4 *__restrict__ w, const int8_t *x, int64_t n, int64_t groups,
                     const float *act_scale, const int32_t *act_sum, float w_scale,
                     float *__restrict__ y)
{
    extern __shared__ __align__(128) int8_t bulk_smem[];
    __shared__ int partial[1][WARPS][kTileRows];
    __shared__ unsigned long long bars[2]; /* weights, activations */
    const int lane = threadIdx.x & 31;
    const int split = threadIdx.x >> 5;
    const unsigned w_bytes = (unsigned)(groups * kBlockBytes);
    const uint4 *ws = reinterpret_cast<const uint4 *>(bulk_smem);
    const int8_t *xs = bulk_smem + w_bytes;
    if (threadIdx.x == 0) {
        bulk_bar_init(&bars[0]);
        bulk_bar_init(&bars[1]);
        bulk_copy(bulk_smem, w + (int64_t)blockIdx.x * groups * (kBlockBytes / 16), w_bytes,
                  &bars[0]);
    }
    __syncthreads(); /* the barriers are initialised before anyone waits */
    pdl_trigger();
    pdl_wait();
    if (threadIdx.x == 0)
        bulk_copy(bulk_smem + w_bytes, x, (unsigned)(groups * kGroup), &bars[1]);
    const bool writer = threadIdx.x < kTileRows;
    const int32_t x_sum = writer ? __ldcg(act_sum) : 0;
    const float x_scale = writer ? __ldcg(act_scale) : 1.0f;
    bulk_wait(&bars[0]);
    bulk_wait(&bars[1]);
    pdl_mark(0);
    int acc = 0;
    const int8_t *xq = xs + (lane >> 3) * 64;
    for (int64_t g = split; g < groups; g += WARPS)
        acc = gemv_entry_dot<false>(ws[g * (kBlockBytes / 16) + lane], xq + g * kGroup, acc);
    gemv_tile_epilogue<WARPS, 1>(acc, partial, 0, split, lane, threadIdx.x, n,
                                 [&](int64_t out_row, int total) {
                                     y[out_row] = w2a8_epilogue(total - x_sum, x_scale, w_scale);
                                 });
}

template <int WARPS>
cudaError_t launch_gemv_bulk(const w2a8_args *a, int pdl, cudaStream_t stream)
{
    const size_t smem = (size_t)(a->groups * (kBlockBytes + kGroup));
    auto kernel = gemv_bulk_kernel<WARPS>;
    const cudaError_t rc = allow_dynamic_smem(kernel, smem);
    if (rc != cudaSuccess)
        return rc;
    return pdl_launch(kernel, dim3((unsigned)a->tiles), dim3(32 * WARPS), smem, stream, pdl,
                      reinterpret_cast<const uint4 *>(a->weights), a->x, a->n, a->groups,
                      a->act_scale, a->act_sum, a->weight_scale, a->y);
}

bool bulk_usable(const w2a8_args *a)
{
    /* Asked once per process: bulk copies need sm_90 code and a device that
     * runs it (the same condition as clusters). */
    static int usable = -1;
    if (usable < 0)
        usable = clusters_usable(gemv_bulk_kernel<4>);
    return usable && a->groups * (kBlockBytes + kGroup) <= kBulkMaxSmem;
}

cudaError_t gemv_bulk(const w2a8_args *a, int split, int pdl, cudaStream_t stream)
{
    if (!bulk_usable(a))
        return cudaErrorNotSupported;
    switch (split) {
    case 1: return launch_gemv_bulk<1>(a, pdl, stream);
    case 2: return launch_gemv_bulk<2>(a, pdl, stream);
    case 4: return launch_gemv_bulk<4>(a, pdl, stream);
    case 8: return launch_gemv_bulk<8>(a, pdl, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* ---- GEMV with a block's whole share of the matrix copied in bulk -----------
 *
 * As gemv_bulk_kernel, but a block takes `per_block` consecutive tiles (up
 * to kBulkTilesMax; the layout keeps them contiguous), each copied into
 * shared memory by one bulk copy on a barrier of its own, all issued before
 * the PDL wait; the activation row is copied once per block after it. The
 * host sizes per_block so that the grid is a few blocks per SM: every
 * weight byte is then requested before the kernel's inputs are ready, and
 * an SM stages the row a few times instead of once per tile (kernel 6
 * stages it ~19 times per SM on 20480 x 3200, 8.5 MB of L2 reads after the
 * wait for 17 MB of weights). Each warp takes a contiguous range of the
 * block's (tile, chunk-group) entries, waits for a tile's copy only when it
 * reaches it, masks the 2-bit fields in place (entry_dot_fields: one logic
 * op a field) and adds its sum into the tile's rows in shared memory with
 * integer atomics, exact in any order: the output is gemv_kernel's bit for
 * bit. sm_90 only (bulk_tiles_per_block says where it runs). */
constexpr int kBulkTilesMax = 32;
constexpr int kBulkTilesWarps = 8;

__global__ void __launch_bounds__(32 * kBulkTilesWarps)
    gemv_bulk_tiles_kernel(const uint4 *__restrict__ w, const int8_t *x, int64_t n, int groups,
                           int64_t tiles, int per_block, const float *act_scale,
                           const int32_t *act_sum, float w_scale, float *__restrict__ y)
{
    extern __shared__ __align__(128) int8_t bulk_smem[];
    __shared__ int row_sums[kBulkTilesMax][kTileRows];
    __shared__ unsigned long long bars[kBulkTilesMax + 1]; /* tiles, then the row */
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const int64_t first = (int64_t)blockIdx.x * per_block;
    const int here = (int)(tiles - first < per_block ? tiles - first : per_block);
    const unsigned tile_bytes = (unsigned)groups * kBlockBytes;
    const uint4 *ws = reinterpret_cast<const uint4 *>(bulk_smem);
    const int8_t *xs = bulk_smem + (size_t)per_block * tile_bytes;
    if (threadIdx.x == 0) {
        for (int t = 0; t <= here; t++)
            bulk_bar_init(&bars[t == here ? kBulkTilesMax : t]);
        const uint4 *src = w + first * groups * (kBlockBytes / 16);
        for (int t = 0; t < here; t++)
            bulk_copy(bulk_smem + (size_t)t * tile_bytes,
                      src + (int64_t)t * groups * (kBlockBytes / 16), tile_bytes, &bars[t]);
    }
    for (int i = threadIdx.x; i < here * kTileRows; i += blockDim.x)
        row_sums[i / kTileRows][i % kTileRows] = 0;
    __syncthreads(); /* barriers initialised, sums zeroed */
    pdl_trigger();
    pdl_wait();
    if (threadIdx.x == 0)
        bulk_copy(bulk_smem + (size_t)per_block * tile_bytes, x, (unsigned)groups * kGroup,
                  &bars[kBulkTilesMax]);
    const bool writer = threadIdx.x < here * kTileRows;
    const int32_t x_sum = writer ? __ldcg(act_sum) : 0;
    const float x_scale = writer ? __ldcg(act_scale) : 1.0f;
    bulk_wait(&bars[kBulkTilesMax]);
    pdl_mark(0);

    const int entries = here * groups;
    const int begin = warp * entries / kBulkTilesWarps;
    const int end = (warp + 1) * entries / kBulkTilesWarps;
    const int8_t *xq = xs + (lane >> 3) * 64;
    int t = begin / groups, g = begin - t * groups;
    for (int e = begin; e < end;) {
        /* The entries of tile t in this warp's range: one barrier wait,
         * then the products, then one add per row. */
        const int stop = min(end - e, groups - g);
        bulk_wait(&bars[t]);
        int fields[4] = {0, 0, 0, 0};
        const uint4 *tw = ws + (int64_t)t * groups * (kBlockBytes / 16) + lane;
        for (int i = 0; i < stop; i++)
            entry_dot_fields(tw[(g + i) * (kBlockBytes / 16)], xq + (g + i) * kGroup, fields);
        int acc = fields[0] + (fields[1] >> 2) + (fields[2] >> 4) + (fields[3] >> 6);
        acc += __shfl_xor_sync(0xffffffffu, acc, 8);
        acc += __shfl_xor_sync(0xffffffffu, acc, 16);
        if (lane < kTileRows)
            atomicAdd(&row_sums[t][lane], acc);
        e += stop;
        t++;
        g = 0;
    }
    pdl_mark(1);
    __syncthreads();
    if (writer) {
        const int64_t row = first * kTileRows + threadIdx.x;
        if (row < n)
            y[row] =
                w2a8_epilogue(row_sums[threadIdx.x / kTileRows][threadIdx.x % kTileRows] - x_sum,
                              x_scale, w_scale);
    }
}

/* The tiles a block of kernel 7 takes at blocks_per_sm blocks an SM; 0
 * where it cannot run (no sm_90 code or device, or a block's share does
 * not fit its barriers and shared memory). */
int bulk_tiles_per_block(const w2a8_args *a, int blocks_per_sm)
{
    static int usable = -1;
    if (usable < 0)
        usable = clusters_usable(gemv_bulk_tiles_kernel);
    if (!usable || blocks_per_sm < 1 || a->tiles < 1 || a->groups < 1 || a->groups > (1 << 20))
        return 0;
    const int64_t sms = a->sm_count > 0 ? a->sm_count : 132;
    const int64_t per_block = (a->tiles + sms * blocks_per_sm - 1) / (sms * blocks_per_sm);
    const int64_t smem = per_block * a->groups * kBlockBytes + a->groups * kGroup;
    return per_block <= kBulkTilesMax && smem <= kBulkTilesMaxSmem ? (int)per_block : 0;
}

cudaError_t gemv_bulk_tiles(const w2a8_args *a, int blocks_per_sm, int pdl, cudaStream_t stream)
{
    const int per_block = bulk_tiles_per_block(a, blocks_per_sm);
    if (per_block == 0)
        return cudaErrorNotSupported;
    const size_t smem = (size_t)per_block * (size_t)(a->groups * kBlockBytes) +
                        (size_t)(a->groups * kGroup);
    const cudaError_t rc = allow_dynamic_smem(gemv_bulk_tiles_kernel, smem);
    if (rc != cudaSuccess)
        return rc;
    const int64_t blocks = (a->tiles + per_block - 1) / per_block;
    return pdl_launch(gemv_bulk_tiles_kernel, dim3((unsigned)blocks), dim3(32 * kBulkTilesWarps),
                      smem, stream, pdl, reinterpret_cast<const uint4 *>(a->weights), a->x, a->n,
                      (int)a->groups, a->tiles, per_block, a->act_scale, a->act_sum,
                      a->weight_scale, a->y);
}

/* The product's K split (bn_w2a8_cuda_gemv_split): enough warps for ~16
 * an SM, at most the chunk-groups, more for rows of over 24 chunk-groups
 * a warp. */
int gemv_split(int64_t tiles, int64_t groups, int sm_count)
{
    const int64_t want = (int64_t)sm_count * 16;
    int split = 1;
    while (split < 8 && groups >= 2 * split && (tiles * split < want || groups > 24 * split))
        split *= 2;
    return split;
}

constexpr int kKernels = 7;
const char *const kNames[kKernels + 1] = {"",
                                          "2 in flight, L1",
                                          "4 in flight, L1",
                                          "8 in flight, L1",
                                          "4 in flight, row in smem",
                                          "fields in place, row in smem",
                                          "bulk, one tile a block",
                                          "bulk, tiles a block"};

/* Whether kernel `kernel` can run a's shape here (6 and 7 need sm_90). */
bool runs(int kernel, const w2a8_args *a)
{
    if (kernel == 6)
        return bulk_usable(a);
    if (kernel == 7)
        return bulk_tiles_per_block(a, 8) > 0;
    return true;
}

/* Kernel `kernel` at `split` (kernel 7: blocks an SM), launched with PDL
 * where pdl is set (kernels 6 and 7 only). */
cudaError_t run(int kernel, const w2a8_args *a, int split, int pdl, cudaStream_t stream)
{
    switch (kernel) {
    case 1: return launch_gemv_split<2, false>(a, split, stream);
    case 2: return launch_gemv_split<4, false>(a, split, stream);
    case 3: return launch_gemv_split<8, false>(a, split, stream);
    case 4: return launch_gemv_split<4, true>(a, split, stream);
    case 5: return launch_gemv_split<4, true, true>(a, split, stream);
    case 6: return gemv_bulk(a, split, pdl, stream);
    case 7: return gemv_bulk_tiles(a, split, pdl, stream);
    default: return cudaErrorInvalidValue;
    }
}

/* Every kernel (or `only`) at every split on one problem; false on a
 * difference. Kernel 7 also with the SM count understated, so a block
 * takes many tiles and the last block fewer. */
bool check_all(int64_t n, int64_t k, int only, int sms)
{
    Problem p = make_problem(n, k, 1);
    bool ok = true;
    const int splits[] = {1, 2, 4, 8};
    const w2a8_args own = p.args(sms);
    for (int kernel = 1; kernel <= kKernels; kernel++) {
        if ((only && kernel != only) || !runs(kernel, &own))
            continue;
        for (int s : splits)
            for (int pdl = 0; pdl <= (kernel >= 6 ? 1 : 0); pdl++)
                for (int fake_sms : {sms, 1, 7}) {
                    if (fake_sms != sms && kernel != 7)
                        continue;
                    const w2a8_args a = p.args(fake_sms);
                    if (kernel == 7 && bulk_tiles_per_block(&a, s) == 0)
                        continue;
                    char what[96];
                    snprintf(what, sizeof what, "%lldx%lld kernel %d split %d%s (%d SMs)",
                             (long long)n, (long long)k, kernel, s, pdl ? " PDL" : "", fake_sms);
                    poison(p);
                    ok = check(p, run(kernel, &a, s, pdl, 0), what) && ok;
                }
    }
    free_problem(p);
    return ok;
}

} // namespace

int main(int argc, char **argv)
{
    int only = argc > 1 ? atoi(argv[1]) : 0;
    if (only < 0 || only > kKernels) {
        fprintf(stderr, "usage: %s [KERNEL 1-%d] [NxK ...]\n", argv[0], kKernels);
        return 2;
    }
    lab_shape_list shapes;
    if (!lab_shapes(argc, argv, 2, &shapes))
        return 2;
    const int sms = device_sms();

    /* Correctness first: ragged shapes (K = 16384: the largest rows the
     * bulk kernels take), then the timed shapes. */
    bool ok = true;
    const int64_t ragged[][2] = {{24, 6912}, {8, 16384}, {1, 1}, {9, 300}, {777, 2600},
                                 {4257, 700}, {100, 8193 + 4000}};
    for (const auto &s : ragged)
        ok = check_all(s[0], s[1], only, sms) && ok;
    for (const auto &s : shapes)
        ok = check_all(s.first, s.second, only, sms) && ok;
    printf("check: %s\n\n", ok ? "every kernel bit for bit the CPU's" : "FAILED");

    const double copy = copy_gbs();
    printf("copy bandwidth %.0f GB/s (read + write); %d SMs\n\n", copy, sms);
    printf("| N x K | kernel | split | us | %% of copy | PDL-chained us | %% of copy |\n"
           "|---|---|---|---|---|---|---|\n");
    for (const auto &s : shapes) {
        Problem p = make_problem(s.first, s.second, 1);
        make_copies(p);
        const double bytes = (double)p.l.bytes + (double)p.l.k_padded + 4.0 * (double)p.l.n;
        for (int kernel = 1; kernel <= kKernels; kernel++) {
            const w2a8_args base = p.args(sms);
            if ((only && kernel != only) || !runs(kernel, &base))
                continue;
            /* Kernel 7 at 2 and 4 blocks an SM (the two that measured
             * fastest); the others at the product's split. */
            for (int split : kernel == 7 ? std::vector<int>{2, 4}
                                         : std::vector<int>{gemv_split(p.l.tiles, p.l.groups,
                                                                       sms)}) {
                if (kernel == 7 && bulk_tiles_per_block(&base, split) == 0)
                    continue;
                double us[2] = {-1.0, -1.0};
                for (int pdl = 0; pdl <= (kernel >= 6 ? 1 : 0); pdl++)
                    us[pdl] = time_calls([&](int i, cudaStream_t st) {
                        w2a8_args a = base;
                        a.weights = p.copies[(size_t)i % p.copies.size()];
                        return run(kernel, &a, split, pdl, st);
                    });
                printf("| %lldx%lld | %d %s | %d | %.2f | %.0f%% |", (long long)s.first,
                       (long long)s.second, kernel, kNames[kernel], split, us[0],
                       100.0 * bytes / (us[0] * 1e-6) / 1e9 / copy);
                if (us[1] > 0)
                    printf(" %.2f | %.0f%% |\n", us[1], 100.0 * bytes / (us[1] * 1e-6) / 1e9 / copy);
                else
                    printf(" - | - |\n");
            }
        }
        free_problem(p);
    }
    return ok ? 0 : 1;
}
