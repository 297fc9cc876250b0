/*
 * w2a8_gemm_norm.cu - a W2A8 product of a few activation rows that adds its
 * output to the residual stream and codes the next norm's int8 input in
 * the same kernel: the batched pass's Wo + ffn_norm and down + the next
 * layer's attn_norm, one kernel each instead of a GEMM and a norm.
 *
 * At a few dozen rows each of those kernels is a chain of latencies (the
 * weights' trip, the activations', block reductions, the grid's end), so a
 * kernel fewer is worth more than any of them made faster. A norm needs the
 * whole output row, which a GEMM spreads over all its blocks; here a
 * thread-block cluster owns whole rows instead: cluster c takes activation
 * rows 8c .. 8c + 7 and its C blocks split the n outputs, block r the
 * columns r n / C ..; every block reads the weights of its columns (each
 * cluster reads the whole matrix, from L2 after the first), and the row's
 * statistics meet in distributed shared memory, two cluster barriers:
 *
 *   1. each block: y = W xq for its columns (mma m16n8k32 with the weights
 *      as A, two 8-row tiles a warp, and the eight rows as B), the
 *      epilogue, x += y, then per row the double sum of squares and
 *      max|w x| of its columns;
 *   2. every block adds the C blocks' sums in rank order (the same order
 *      in each, so all agree), codes its columns under the exact rule
 *      (which needs only max|w x|) and leaves its part of the normed
 *      maximum and of the code sum;
 *   3. block 0 stores each row's scale and code sum. Rows the exact rule
 *      does not cover (tiny or non-finite: the same answer in every block)
 *      are coded again by the plain rule, a third barrier.
 *
 * The results are those of bn_w2a8_cuda_gemm followed by
 * bn_cb_add_norm_quantize: the int32 sums are exact, the epilogue and the
 * add are the CPU's fp32 operations, the codes the CPU's exact rule
 * (norm_code.cuh); only the double sum of squares is added in another
 * order (within the norm kernels' contract). Contract: w2a8_cuda.h.
 */
#include <cuda_runtime.h>
#include <stdint.h>

#include <mutex>

#include "cuda_layout.h"
#include "norm_code.cuh"
#include "pdl.cuh"
#include "w2a8_cuda.h"
#include "w2a8_epilogue.cuh"
#include "w2a8_gemv.cuh"

namespace
{

constexpr unsigned kFull = 0xffffffffu;
constexpr int kRows = 8;                         /* activation rows a cluster owns (mma's n)      */
constexpr int kPairCols = 16;                    /* outputs a warp owns: two tiles (mma's m)      */
constexpr int kMaxThreads = 640;                 /* a block's warps: pairs x K splits             */
constexpr int kBatch = 2;                        /* chunk-groups a warp has in flight             */
constexpr int kActPad = 64;                      /* smem row stride = K + 64: the eight rows of a
                                                    quarter warp's 16-byte loads hit distinct
                                                    banks (stride = 64 mod 128)                  */
constexpr int kGroupWords = kGemvBlockBytes / 4; /* one tile's chunk-group         */
constexpr int kMaxSmem = 216 * 1024;             /* dynamic shared memory a block may take    */

struct GemmNormArgs {
    const uint32_t *w; /* cuda_layout.h tiles                                     */
    int64_t n, groups;
    float w_scale;
    const int8_t *xq; /* input codes, ldxq apart                                 */
    int64_t ldxq, m;
    const float *act_scale;
    const int32_t *act_sum;
    float *x; /* the residual rows, ldx apart: x += W xq                         */
    int64_t ldx;
    const float *g; /* the next norm's weights (n)                              */
    float eps;
    int8_t *q; /* its codes, ldq apart, zero from n to ldq                      */
    int64_t ldq;
    float *scale;
    int32_t *sum;
    int splits; /* warps splitting K for each pair of tiles                    */
};

/* Word tig of entries (u, gid), u = 0..3, of both tiles of a pair at
 * chunk-group g (zero past the row's groups). */
__device__ __forceinline__ void load_pair(uint32_t (&b)[2][4], const uint32_t *w0,
                                          const uint32_t *w1, int64_t g, int64_t groups)
{
#pragma unroll
    for (int t = 0; t < 2; t++)
#pragma unroll
        for (int u = 0; u < 4; u++) {
            uint32_t v = 0;
            if (g < groups)
                asm volatile("ld.global.nc.L1::no_allocate.u32 %0, [%1];"
                             : "=r"(v)
                             : "l"((t ? w1 : w0) + g * kGroupWords + u * 32));
            b[t][u] = v;
        }
}

/* One chunk-group of a pair of tiles against the eight staged rows: the
 * k order of w2a8_gemm_rows.cu's mma kernel (lane (gid, tig) in step
 * (u, h) holds k = 64 u + 16 tig + 8 h + 0..7), with the roles swapped:
 * A is 16 weight rows (tile 0's row gid in a0 / a2, tile 1's in a1 / a3),
 * B row gid's 16 bytes 64 u + 16 tig .. from shared memory. */
__device__ __forceinline__ void pair_group(int32_t (&acc)[2][4], const uint32_t (&b)[2][4],
                                           const int8_t *xrow)
{
#pragma unroll
    for (int u = 0; u < 4; u++) {
        const uint4 xv = *reinterpret_cast<const uint4 *>(xrow + 64 * u);
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const uint32_t af[4] = {
                (b[0][u] >> (4 * h)) & 0x03030303u, (b[1][u] >> (4 * h)) & 0x03030303u,
                (b[0][u] >> (4 * h + 2)) & 0x03030303u, (b[1][u] >> (4 * h + 2)) & 0x03030303u};
            const uint32_t bf[2] = {h ? xv.z : xv.x, h ? xv.w : xv.y};
            w2a8_mma_s8(acc[h], af, bf);
        }
    }
}

struct SumMax {
    double ss, umax;
};

__device__ __forceinline__ SumMax warp_sum_max(double ss, double umax)
{
    for (int o = 16; o > 0; o >>= 1) {
        ss = __dadd_rn(ss, __shfl_xor_sync(kFull, ss, o));
        umax = fmax(umax, __shfl_xor_sync(kFull, umax, o));
    }
    return {ss, umax};
}

__device__ __forceinline__ int warp_sum(int v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(kFull, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1)
        v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
    return v;
}

/* Where a block's pieces lie in its dynamic shared memory: the eight
 * activation rows, the residual rows and norm weights of its columns, the
 * first `staged` chunk-groups of each of its tiles, the K splits' sums. */
struct GemmNormSmem {
    int64_t acts, xres, gw, wts, partial, bytes;
    int64_t stride; /* an activation row                               */
    int64_t staged; /* chunk-groups a tile has in shared memory            */
};

__host__ __device__ inline GemmNormSmem gemm_norm_layout(int64_t cols, int64_t groups, int splits)
{
    GemmNormSmem l;
    l.stride = groups * kGemvGroup + kActPad;
    l.acts = 0;
    l.xres = l.acts + kRows * l.stride;
    l.gw = l.xres + kRows * cols * 4;
    l.wts = l.gw + (cols * 4 + 15) / 16 * 16;
    const int64_t fixed = l.wts + (int64_t)splits * kRows * cols * 4;
    const int64_t tile_group = (cols / kGemvTileRows) * kGemvBlockBytes;
    int64_t staged = (kMaxSmem - fixed) / tile_group;
    if (staged > groups)
        staged = groups;
    l.staged = staged < 0 ? 0 : staged;
    l.partial = l.wts + l.staged * tile_group;
    l.bytes = l.partial + (int64_t)splits * kRows * cols * 4;
    return l;
}

/* Launched in clusters of C blocks (C a divisor of n / 16), grid C x
 * ceil(m / 8), 32 x (n / 16 C) x splits threads, dynamic shared memory
 * gemm_norm_layout's bytes. */
__global__ void __launch_bounds__(kMaxThreads) gemm_norm_kernel(GemmNormArgs a)
{
    extern __shared__ __align__(16) unsigned char smem[];
    __shared__ unsigned long long bar;
    __shared__ double st_ss[kRows], st_umax[kRows];
    __shared__ float st_amax[kRows];
    __shared__ int st_total[kRows], st_plain_total[kRows], row_plain[kRows];

    unsigned rank = 0, ranks = 1;
#if BN_HAS_CLUSTERS
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(ranks));
#endif
    const int cols = (int)(a.n / ranks), pairs = cols / kPairCols;
    const int tiles = cols / kGemvTileRows;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int pair = warp % pairs, split = warp / pairs;
    const int gid = lane >> 2, tig = lane & 3;
    const int64_t row0 = (int64_t)(blockIdx.x / ranks) * kRows;
    const int rows = a.m - row0 < kRows ? (int)(a.m - row0) : kRows;
    const int64_t col0 = (int64_t)rank * cols;
    const int64_t k = a.groups * kGemvGroup;
    const GemmNormSmem L = gemm_norm_layout(cols, a.groups, a.splits);
    int8_t *acts = reinterpret_cast<int8_t *>(smem + L.acts);
    float *xres = reinterpret_cast<float *>(smem + L.xres);
    const float *gw = reinterpret_cast<const float *>(smem + L.gw);
    const uint32_t *wts = reinterpret_cast<const uint32_t *>(smem + L.wts);
    int32_t *partial = reinterpret_cast<int32_t *>(smem + L.partial);

    /* What never depends on the kernel before is asked for before waiting
     * for it (programmatic dependent launch): the staged chunk-groups of
     * the block's tiles and the norm weights by bulk copies, the first of
     * the streamed chunk-groups into registers. The activation and
     * residual rows follow the wait, on the same barrier. */
    const uint32_t *wblock = a.w + (col0 / kGemvTileRows) * a.groups * kGroupWords;
    if (threadIdx.x == 0)
        bulk_bar_init(&bar);
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned staged_bytes = (unsigned)(L.staged * kGemvBlockBytes);
        bar_expect(&bar,
                   (unsigned)(tiles * staged_bytes + cols * 4 + rows * (k + (int64_t)cols * 4)));
        if (staged_bytes > 0)
            for (int t = 0; t < tiles; t++)
                bulk_issue(smem + L.wts + (int64_t)t * staged_bytes,
                           wblock + (int64_t)t * a.groups * kGroupWords, staged_bytes, &bar);
        bulk_issue(smem + L.gw, a.g + col0, (unsigned)(cols * 4), &bar);
    }
    const uint32_t *w0 = wblock + 2 * pair * a.groups * kGroupWords + gid * 4 + tig;
    const uint32_t *w1 = w0 + a.groups * kGroupWords;
    const int64_t step = (int64_t)a.splits * kBatch;
    int64_t first = L.staged + split; /* the warp's first streamed chunk-group */
    uint32_t cur[kBatch][2][4];
#pragma unroll
    for (int j = 0; j < kBatch; j++)
        load_pair(cur[j], w0, w1, first + j * a.splits, a.groups);
    pdl_trigger();
    pdl_wait();

    if (threadIdx.x == 0)
        for (int r = 0; r < rows; r++) {
            bulk_issue(acts + r * L.stride, a.xq + (row0 + r) * a.ldxq, (unsigned)k, &bar);
            bulk_issue(xres + r * cols, a.x + (row0 + r) * a.ldx + col0, (unsigned)(cols * 4),
                       &bar);
        }
    for (int64_t i = threadIdx.x; i < (kRows - rows) * (k / 16); i += blockDim.x)
        reinterpret_cast<int4 *>(acts +
                                 rows * L.stride)[i / (k / 16) * (L.stride / 16) + i % (k / 16)] =
            make_int4(0, 0, 0, 0);
    float asc = 1.0f;
    int32_t asum = 0;
    if (warp < rows) {
        asc = __ldcg(a.act_scale + row0 + warp);
        asum = __ldcg(a.act_sum + row0 + warp);
    }
    bulk_wait(&bar);
    __syncthreads();

    /* The products: the staged chunk-groups from shared memory, then the
     * rest streamed, a batch ahead. */
    int32_t acc[2][4] = {{0, 0, 0, 0}, {0, 0, 0, 0}};
    const int8_t *xrow = acts + gid * L.stride + 16 * tig;
    for (int64_t g = split; g < L.staged; g += a.splits) {
        const uint32_t *s0 = wts + (2 * pair * L.staged + g) * kGroupWords + gid * 4 + tig;
        const uint32_t *s1 = s0 + L.staged * kGroupWords;
        uint32_t b[2][4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            b[0][u] = s0[u * 32];
            b[1][u] = s1[u * 32];
        }
        pair_group(acc, b, xrow + g * kGemvGroup);
    }
    for (int64_t g0 = first; g0 < a.groups; g0 += step) {
        uint32_t next[kBatch][2][4];
#pragma unroll
        for (int j = 0; j < kBatch; j++)
            load_pair(next[j], w0, w1, g0 + step + j * a.splits, a.groups);
#pragma unroll
        for (int j = 0; j < kBatch; j++) {
            const int64_t g = g0 + j * a.splits;
            if (g < a.groups)
                pair_group(acc, cur[j], xrow + g * kGemvGroup);
        }
#pragma unroll
        for (int j = 0; j < kBatch; j++)
#pragma unroll
            for (int t = 0; t < 2; t++)
#pragma unroll
                for (int u = 0; u < 4; u++)
                    cur[j][t][u] = next[j][t][u];
    }

    /* c0, c1: output 16 pair + gid, rows 2 tig and 2 tig + 1; c2, c3: output
     * 16 pair + 8 + gid. The K splits of a pair meet in shared memory. */
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int r = 2 * tig + (e & 1), c = kPairCols * pair + 8 * (e >> 1) + gid;
        partial[(split * kRows + r) * cols + c] = acc[0][e] + acc[1][e];
    }
    __syncthreads();

    /* Warp r < 8 takes row r: y, x += y (the CPU's fp32 operations, kept in
     * xres for the codes), its columns' sum of squares and max|w x|
     * (double, exact per element, as the norm kernels). */
    const int r = warp;
    float *vr = xres + r * cols;
    if (r < kRows) {
        double ss = 0.0, umax = 0.0;
        if (r < rows) {
            float *xg = a.x + (row0 + r) * a.ldx + col0;
            for (int c = lane; c < cols; c += 32) {
                int32_t total = 0;
                for (int s = 0; s < a.splits; s++)
                    total += partial[(s * kRows + r) * cols + c];
                const float v = __fadd_rn(vr[c], w2a8_epilogue(total - asum, asc, a.w_scale));
                vr[c] = v;
                xg[c] = v;
                ss = __fma_rn((double)v, (double)v, ss);
                umax = fmax(umax, fabs(__dmul_rn((double)gw[c], (double)v)));
            }
        }
        const SumMax s = warp_sum_max(ss, umax);
        if (lane == 0) {
            st_ss[r] = s.ss;
            st_umax[r] = s.umax;
        }
    }
    cluster_sync_all();

    /* This block's share of the codes' zero tail, n .. ldq (after the
     * barrier: the input codes, the same buffer where q is xq, are read). */
    const int64_t tail = a.ldq - a.n, per = (tail + ranks - 1) / ranks;
    for (int64_t i = threadIdx.x; i < rows * per; i += blockDim.x) {
        const int64_t rr = i / per, at = a.n + rank * per + (i - rr * per);
        if (at < a.ldq)
            a.q[(row0 + rr) * a.ldq + at] = 0;
    }

    /* The row's statistics, the blocks' parts added in rank order; this
     * block's codes, its part of the normed maximum and of the code sum. */
    float inv = 0.0f, amax = 0.0f;
    bool usable = false;
    if (r < rows) {
        double ss = 0.0, umax = 0.0;
        if (lane < (int)ranks) {
            ss = ld_cluster(&st_ss[r], (unsigned)lane);
            umax = ld_cluster(&st_umax[r], (unsigned)lane);
        }
        const SumMax s = warp_sum_max(ss, umax);
        inv = inv_rms(s.ss, a.n, a.eps);
        usable = s.umax > 0.0 && isfinite(s.umax);
        const ExactCoder coder(s.umax);
        int total = 0;
        int8_t *qr = a.q + (row0 + r) * a.ldq + col0;
        for (int c = lane; c < cols; c += 32) {
            const float v = vr[c], w = gw[c];
            amax = fmaxf(amax, fabsf(__fmul_rn(w, __fmul_rn(v, inv))));
            const int code = usable ? coder.code(w, v) : 0;
            qr[c] = (int8_t)code;
            total += code;
        }
        amax = warp_max(amax);
        total = warp_sum(total);
        if (lane == 0) {
            st_amax[r] = amax;
            st_total[r] = total;
        }
    } else if (r < kRows && lane == 0) {
        st_amax[r] = 0.0f;
        st_total[r] = 0;
    }
    cluster_sync_all();

    /* The row's scale and code sum (block 0), or, for a row the exact rule
     * does not cover, its plain codes: the same decision in every block. */
    float s_plain = 0.0f;
    if (r < kRows) {
        bool plain = false;
        if (r < rows) {
            float m = 0.0f;
            int total = 0;
            if (lane < (int)ranks) {
                m = ld_cluster(&st_amax[r], (unsigned)lane);
                total = ld_cluster(&st_total[r], (unsigned)lane);
            }
            amax = warp_max(m);
            total = warp_sum(total);
            plain = !(amax >= kQuantEps && usable);
            s_plain = __fdiv_rn(127.0f, amax >= kQuantEps ? amax : kQuantEps);
            if (rank == 0 && lane == 0 && !plain) {
                a.scale[row0 + r] = __fdiv_rn(127.0f, amax);
                a.sum[row0 + r] = total;
            }
        }
        if (lane == 0)
            row_plain[r] = plain;
    }
    __syncthreads();
    bool any_plain = false;
#pragma unroll
    for (int i = 0; i < kRows; i++)
        any_plain |= row_plain[i] != 0;
    if (any_plain) {
        if (r < kRows && row_plain[r]) {
            int total = 0;
            int8_t *qr = a.q + (row0 + r) * a.ldq + col0;
            for (int c = lane; c < cols; c += 32) {
                const int code = plain_code(gw[c], vr[c], inv, s_plain);
                qr[c] = (int8_t)code;
                total += code;
            }
            total = warp_sum(total);
            if (lane == 0)
                st_plain_total[r] = total;
        }
        cluster_sync_all();
        if (rank == 0 && r < kRows && row_plain[r]) {
            const int total =
                warp_sum(lane < (int)ranks ? ld_cluster(&st_plain_total[r], (unsigned)lane) : 0);
            if (lane == 0) {
                a.scale[row0 + r] = s_plain;
                a.sum[row0 + r] = total;
            }
        }
    }
    /* No block leaves while another may still read its shared memory. */
    cluster_sync_all();
}

/* The block's shape for n outputs over C blocks and K of `groups`: warps
 * = pairs x splits, splits as many as keep a block within kMaxThreads. */
struct GemmNormShape {
    int cluster, pairs, splits;
};

static GemmNormSmem gemm_norm_smem(const GemmNormShape &s, int64_t groups)
{
    return gemm_norm_layout((int64_t)s.pairs * kPairCols, groups, s.splits);
}

static bool gemm_norm_shape(int64_t n, int64_t groups, int cluster, GemmNormShape *s)
{
    if (n % ((int64_t)cluster * kPairCols) != 0)
        return false;
    const int64_t pairs = n / ((int64_t)cluster * kPairCols);
    if (pairs < 1 || pairs * 32 > kMaxThreads)
        return false;
    int64_t splits = kMaxThreads / (32 * pairs);
    if (splits > groups)
        splits = groups;
    /* Warps 0 .. 7 norm the eight rows. */
    if (pairs * splits < kRows)
        return false;
    s->cluster = cluster;
    s->pairs = (int)pairs;
    s->splits = (int)splits;
    return gemm_norm_smem(*s, groups).bytes <= kMaxSmem;
}

/* Clusters of c blocks of a shape the current device holds at once (0:
 * none, or the query failed), asked of the runtime once per device and
 * shape: a pass asks for every launch, the answer never changes. */
struct HeldEntry {
    int dev, cluster;
    int64_t n, groups;
    int held;
};

static int held_clusters(const GemmNormShape &s, int64_t n, int64_t groups)
{
    static std::mutex lock;
    static HeldEntry cache[32];
    static int used = 0;
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    std::lock_guard<std::mutex> hold(lock);
    for (int i = 0; i < used; i++)
        if (cache[i].dev == dev && cache[i].cluster == s.cluster && cache[i].n == n &&
            cache[i].groups == groups)
            return cache[i].held;
    int held = 0;
    if (!clusters_usable(gemm_norm_kernel) ||
        cudaFuncSetAttribute(gemm_norm_kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) !=
            cudaSuccess ||
        cudaFuncSetAttribute(gemm_norm_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             kMaxSmem) != cudaSuccess ||
        resident_clusters(gemm_norm_kernel, dim3((unsigned)s.cluster),
                          dim3((unsigned)(32 * s.pairs * s.splits)),
                          gemm_norm_smem(s, groups).bytes, dim3((unsigned)s.cluster, 1, 1),
                          &held) != cudaSuccess) {
        (void)cudaGetLastError();
        held = 0;
    }
    if (used < 32)
        cache[used++] = {dev, s.cluster, n, groups, held};
    return held;
}

/* The cluster size for this product: 16 (a non-portable size) where the
 * device holds every cluster of the grid at once, else 8; 0 where neither
 * is held. */
static int gemm_norm_pick(int64_t m, int64_t n, int64_t groups, GemmNormShape *out)
{
    const int64_t clusters = (m + kRows - 1) / kRows;
    for (int c = 16; c >= 8; c /= 2) {
        GemmNormShape s;
        if (!gemm_norm_shape(n, groups, c, &s))
            continue;
        const int held = held_clusters(s, n, groups);
        if (held >= clusters || (c == 8 && held > 0)) {
            *out = s;
            return c;
        }
    }
    return 0;
}

} // namespace

extern "C" int bn_w2a8_cuda_gemm_norm_fits(const bn_w2a8_cuda_args *a, const bn_w2a8_norm_out *o)
{
    if (!a || !o || a->m < 1 || a->n < 1 || a->tiles * kGemvTileRows != a->n || !o->x || !o->w ||
        !o->q || !o->scale || !o->sum || o->ldq < a->n || o->ldx < a->n || (a->ldx & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(a->x) & 15) != 0 || (o->ldx & 3) != 0 ||
        (reinterpret_cast<uintptr_t>(o->x) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(o->w) & 15) != 0 ||
        (reinterpret_cast<uintptr_t>(a->weights) & 15) != 0 || a->m > 65535 * kRows)
        return 0;
    GemmNormShape s;
    return gemm_norm_pick(a->m, a->n, a->groups, &s) > 0;
}

extern "C" cudaError_t bn_w2a8_cuda_gemm_norm(const bn_w2a8_cuda_args *a, const bn_w2a8_norm_out *o,
                                              cudaStream_t stream)
{
    if (!bn_w2a8_cuda_gemm_norm_fits(a, o))
        return cudaErrorNotSupported;
    GemmNormShape s;
    const int c = gemm_norm_pick(a->m, a->n, a->groups, &s);
    GemmNormArgs g;
    g.w = static_cast<const uint32_t *>(a->weights);
    g.n = a->n;
    g.groups = a->groups;
    g.w_scale = a->weight_scale;
    g.xq = a->x;
    g.ldxq = a->ldx;
    g.m = a->m;
    g.act_scale = a->act_scale;
    g.act_sum = a->act_sum;
    g.x = o->x;
    g.ldx = o->ldx;
    g.g = o->w;
    g.eps = o->eps;
    g.q = o->q;
    g.ldq = o->ldq;
    g.scale = o->scale;
    g.sum = o->sum;
    g.splits = s.splits;
    const int64_t clusters = (a->m + kRows - 1) / kRows;
    static const bool pdl_ok = pdl_compiled(gemm_norm_kernel);
    return pdl_launch_clustered(
        gemm_norm_kernel, dim3((unsigned)(c * clusters)), dim3((unsigned)(32 * s.pairs * s.splits)),
        gemm_norm_smem(s, a->groups).bytes, dim3((unsigned)c, 1, 1), stream, a->pdl && pdl_ok, g);
}
