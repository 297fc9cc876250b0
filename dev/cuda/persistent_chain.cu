/*
 * persistent_chain.cu - lab for issue 45's design question: what does a
 * chain of dependent matrix-vector stages cost as separate kernels (one
 * launch a stage, replayed as a CUDA graph: today's decode step) against
 * one persistent kernel of a block an SM, whose blocks wait for each other
 * through global memory? The persistent variants: a counter between stages;
 * the same with each block's share of the next stage prefetched to L2, or
 * copied into shared memory a stage ahead (bulk copies); outputs that carry
 * their stage's number in the same 8-byte word, so that a block waits for
 * its input by reading it (two or three shared-memory buffers, and with a
 * block-wide max before each input is coded, as a norm needs); and the
 * skeletons of the counter and flagged forms (the hand-over, no products).
 *
 * The chain has 2B-4T's shape of weight reads: 30 layers of four stages of
 * n rows of k int8 bytes (q|k|v 3840 x 640, o 2560 x 640, gate|up 13824 x
 * 640, down 2560 x 1728: 2560 and 6912 ternary inputs at four to a byte),
 * 522 MB in all, ten times the L2. Stage s computes
 *
 *     out_s[i] = sum_k W_s[i][k] * in_s[k]          (int8 x int8 -> int32)
 *     in_{s+1}[k] = clamp(out_s[k] >> 9, -127, 127)  (k < the next stage's k)
 *
 * (the normalised variant shifts by the smallest amount that brings the
 * input's largest |value| within 127 instead of 9), so every stage depends
 * on the whole of the one before, as the decode step's do. Each timed run
 * of a persistent variant starts with its counters' (and flags') reset. The CPU computes the same chain; every variant's last output
 * must equal it exactly.
 *
 *   make -C dev/cuda persistent_chain && dev/cuda/persistent_chain
 */
#include <algorithm>

#include "common.cuh"

struct Stage {
    int n, k;       /* rows, bytes a row (k % 16 == 0) */
    int64_t offset; /* of its rows in the weights      */
};

constexpr int kLayers = 30, kThreads = 512;
constexpr int kMaxK = 1728;

/* Device copies of the stage table. */
__constant__ Stage d_stages[4 * kLayers];

/* The block's run of stage s's rows: [*r0, *r1), a contiguous share. */
__device__ __forceinline__ void block_rows(const Stage &st, int *r0, int *r1)
{
    const int per = (st.n + gridDim.x - 1) / gridDim.x;
    *r0 = blockIdx.x * per;
    *r1 = min(st.n, *r0 + per);
}

/* Every block's stage s done: each block adds one to the counter (release)
 * and waits until it holds every block's (acquire). */
__device__ void grid_barrier(unsigned *counter, int s)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned target = (unsigned)(s + 1) * gridDim.x;
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
        unsigned seen;
        do
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter)
                         : "memory");
        while (seen < target);
    }
    __syncthreads();
}

/* in_next[k] from out (the stage before's), as the chain defines it. */
__device__ __forceinline__ int8_t requant(int32_t v)
{
    const int32_t t = v >> 9;
    return (int8_t)(t > 127 ? 127 : t < -127 ? -127 : t);
}

/* Rows [r0, r1) of stage s, in (k bytes) from shared memory. Eight lanes
 * take a row: lane j of the eight reads the row's 16-byte chunks j, j + 8,
 * ... (all loads in flight before any is used), and the eight partial sums
 * meet by shuffles; a warp thus reads four rows side by side. */
constexpr int kLanesPerRow = 8, kMaxChunks = kMaxK / 16 / kLanesPerRow + 1;
/* An output as the plain variants store it, or as the flagged one does: the
 * value and the number of the stage that wrote it plus one in one 8-byte
 * word, stored at once, so a reader that sees the flag sees the value. */
__device__ __forceinline__ void put_out(int32_t *out, int r, int32_t v, int)
{
    out[r] = v;
}
__device__ __forceinline__ void put_out(unsigned long long *out, int r, int32_t v, int s)
{
    const unsigned long long word = (unsigned long long)(unsigned)v |
                                    ((unsigned long long)(unsigned)(s + 1) << 32);
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(out + r), "l"(word) : "memory");
}

template <bool kShared, typename Out = int32_t>
__device__ void stage_rows_from(const int4 *base, const Stage &st, const int8_t *in_s,
                                Out *out, int r0, int r1, int s = 0)
{
    const int per_row = st.k / 16;
    const int sub = threadIdx.x % kLanesPerRow;
    const int groups = blockDim.x / kLanesPerRow;
    for (int i0 = 0; i0 < r1 - r0; i0 += groups) { /* the same trips for every thread */
        const int r = r0 + i0 + (int)threadIdx.x / kLanesPerRow;
        int acc = 0;
        if (r < r1) {
            const int4 *row = base + (int64_t)(r - r0) * per_row;
            int4 wv[kMaxChunks];
#pragma unroll
            for (int u = 0; u < kMaxChunks; u++) {
                const int c = sub + u * kLanesPerRow;
                wv[u] = c < per_row ? (kShared ? row[c] : __ldcs(row + c)) : make_int4(0, 0, 0, 0);
            }
#pragma unroll
            for (int u = 0; u < kMaxChunks; u++) {
                const int c = sub + u * kLanesPerRow;
                if (c < per_row) {
                    const int4 xv = *reinterpret_cast<const int4 *>(in_s + c * 16);
                    acc = __dp4a(wv[u].x, xv.x, acc);
                    acc = __dp4a(wv[u].y, xv.y, acc);
                    acc = __dp4a(wv[u].z, xv.z, acc);
                    acc = __dp4a(wv[u].w, xv.w, acc);
                }
            }
        }
#pragma unroll
        for (int o = kLanesPerRow / 2; o > 0; o >>= 1)
            acc += __shfl_xor_sync(0xffffffffu, acc, o);
        if (r < r1 && sub == 0)
            put_out(out, r, acc, s);
    }
}

__device__ void stage_rows(const int8_t *__restrict__ w, const Stage &st, const int8_t *in_s,
                           int32_t *out, int r0, int r1)
{
    const int4 *base = reinterpret_cast<const int4 *>(w + st.offset) + (int64_t)r0 * (st.k / 16);
    stage_rows_from<false>(base, st, in_s, out, r0, r1);
}

/* ---- the weights staged in shared memory by bulk copies ----------------------------- */

__device__ __forceinline__ unsigned smem_addr(const void *p)
{
    return (unsigned)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void mbar_init(uint64_t *bar)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

/* Thread 0: the block's rows of stage s into dst, completing on bar. */
__device__ void stage_copy(const int8_t *w, int s, int8_t *dst, uint64_t *bar)
{
    const Stage st = d_stages[s];
    int r0, r1;
    block_rows(st, &r0, &r1);
    const unsigned bytes = r1 > r0 ? (unsigned)((r1 - r0) * st.k) : 0u;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)),
                 "r"(bytes)
                 : "memory");
    const int8_t *src = w + st.offset + (int64_t)r0 * st.k;
    for (unsigned done = 0; done < bytes; done += 32768u) {
        const unsigned part = bytes - done < 32768u ? bytes - done : 32768u;
        asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                     "[%0], [%1], %2, [%3];" ::"r"(smem_addr(dst + done)),
                     "l"(src + done), "r"(part), "r"(smem_addr(bar))
                     : "memory");
    }
}

__device__ void mbar_wait(uint64_t *bar, unsigned phase)
{
    unsigned done = 0;
    while (!done)
        asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;"
                     " selp.u32 %0, 1, 0, p; }"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(phase)
                     : "memory");
}

/* The stage's input into shared memory: x itself for stage 0, else the
 * stage before's output requantized. */
__device__ void load_input(int s, const int8_t *x, const int32_t *prev, int8_t *in_s)
{
    const int k = d_stages[s].k;
    for (int i = threadIdx.x; i < k; i += blockDim.x)
        in_s[i] = s == 0 ? x[i] : requant(__ldcg(prev + i));
    __syncthreads();
}

/* The block's part of stage s, from global memory: its input, then its
 * rows. Stages write out0 and out1 in turn. */
__device__ void run_stage(const int8_t *w, const int8_t *x, int32_t *out0, int32_t *out1, int s,
                          int8_t *in_s)
{
    load_input(s, x, s % 2 ? out0 : out1, in_s);
    const Stage st = d_stages[s];
    int r0, r1;
    block_rows(st, &r0, &r1);
    stage_rows(w, st, in_s, s % 2 ? out1 : out0, r0, r1);
}

/* Variant 1: one kernel a stage (the launches chained in a graph). Outputs
 * alternate between two buffers. */
__global__ void __launch_bounds__(kThreads) stage_kernel(const int8_t *w, const int8_t *x,
                                                         int32_t *out0, int32_t *out1, int s)
{
    __shared__ __align__(16) int8_t in_s[kMaxK];
    run_stage(w, x, out0, out1, s, in_s);
}

/* Variants 2 and 3: one persistent kernel of one block an SM; after each
 * stage every block adds one to a counter (release) and waits until the
 * counter holds every block's (acquire). With prefetch, a block first asks
 * L2 for its rows of the next stage (one bulk prefetch of its contiguous
 * share), which arrive while it waits. */
template <bool kPrefetch, bool kRows = true>
__global__ void __launch_bounds__(kThreads) chain_kernel(const int8_t *w, const int8_t *x,
                                                         int32_t *out0, int32_t *out1,
                                                         unsigned *counter, int n_stages)
{
    __shared__ __align__(16) int8_t in_s[kMaxK];
    for (int s = 0; s < n_stages; s++) {
        if (kRows) {
            run_stage(w, x, out0, out1, s, in_s);
        } else { /* the chain's skeleton: each stage's input read, no rows */
            load_input(s, x, s % 2 ? out0 : out1, in_s);
            if (threadIdx.x == 0)
                (s % 2 ? out1 : out0)[blockIdx.x] = in_s[blockIdx.x % d_stages[s].k];
        }
        if (kPrefetch && s + 1 < n_stages && threadIdx.x == 0) {
            const Stage nx = d_stages[s + 1];
            int n0, n1;
            block_rows(nx, &n0, &n1);
            if (n1 > n0) {
                const int8_t *p = w + nx.offset + (int64_t)n0 * nx.k;
                const unsigned bytes = (unsigned)((n1 - n0) * nx.k); /* a multiple of 16 */
                asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes)
                             : "memory");
            }
        }
        grid_barrier(counter, s);
    }
}

/* Variant 4: persistent, each block's rows of the next stage copied into
 * shared memory (bulk copies, two buffers) as soon as the buffer is free,
 * a whole stage and a barrier ahead of their use: the weights never sit on
 * the chain's critical path. */
constexpr int kStageBytes = 67584; /* the largest block share: 105 rows x 640 bytes, rounded */
__global__ void __launch_bounds__(kThreads) chain_smem_kernel(const int8_t *w, const int8_t *x,
                                                              int32_t *out0, int32_t *out1,
                                                              unsigned *counter, int n_stages)
{
    extern __shared__ __align__(128) int8_t buf[]; /* two stage buffers */
    __shared__ __align__(16) int8_t in_s[kMaxK];
    __shared__ __align__(8) uint64_t bars[2];
    if (threadIdx.x == 0) {
        mbar_init(&bars[0]);
        mbar_init(&bars[1]);
    }
    __syncthreads();
    if (threadIdx.x == 0)
        stage_copy(w, 0, buf, &bars[0]);
    for (int s = 0; s < n_stages; s++) {
        if (threadIdx.x == 0 && s + 1 < n_stages) /* its buffer was read by stage s - 1 */
            stage_copy(w, s + 1, buf + ((s + 1) % 2) * kStageBytes, &bars[(s + 1) % 2]);
        int32_t *out = s % 2 ? out1 : out0;
        const int32_t *prev = s % 2 ? out0 : out1;
        load_input(s, x, prev, in_s);
        const Stage st = d_stages[s];
        int r0, r1;
        block_rows(st, &r0, &r1);
        mbar_wait(&bars[s % 2], (unsigned)((s / 2) % 2));
        stage_rows_from<true>(reinterpret_cast<const int4 *>(buf + (s % 2) * kStageBytes), st,
                              in_s, out, r0, r1);
        grid_barrier(counter, s);
    }
}

/* Variant 5: as variant 4, without the barrier: each output word carries
 * the number of its stage (put_out), so a block waits for its input by
 * reading it, value by value, until every word it needs is the previous
 * stage's (one round trip to L2 instead of a counter's two and then the
 * read). The output buffer a stage overwrites held the input of the stage
 * before; every block counts itself in readers[s] once it holds stage s's
 * input, and thread 0 sees every block counted for the stage before
 * before its block writes (long since true: it is one stage behind). */
/* The shift that brings a stage's largest |input| within 127: the
 * normalised chain's scale, found from the whole input as an RMSNorm's
 * absmax is (on the CPU: ref_chain). */
__host__ __device__ __forceinline__ int shift_for(uint32_t absmax)
{
    int sh = 0;
    while ((absmax >> sh) > 127u)
        sh++;
    return sh;
}

constexpr int kPerThread = (kMaxK + kThreads - 1) / kThreads;

template <bool kNorm>
__device__ void load_flagged(int s, const int8_t *x, const unsigned long long *prev,
                             int8_t *in_s, unsigned *readers)
{
    __shared__ uint32_t warp_max[kThreads / 32];
    const int k = d_stages[s].k;
    if (threadIdx.x == 0 && s > 0) {
        unsigned seen;
        do
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                         : "=r"(seen)
                         : "l"(readers + s - 1)
                         : "memory");
        while (seen < gridDim.x);
    }
    /* Every word this thread needs read at once, then again only those not
     * yet written: a thread's waits overlap rather than add up. */
    int32_t v[kPerThread];
    bool got[kPerThread];
#pragma unroll
    for (int j = 0; j < kPerThread; j++) {
        const int i = threadIdx.x + j * kThreads;
        got[j] = i >= k || s == 0;
        v[j] = s == 0 && i < k ? x[i] : 0;
    }
    for (bool all = false; !all;) {
        all = true;
        unsigned long long word[kPerThread];
#pragma unroll
        for (int j = 0; j < kPerThread; j++) /* the loads, all issued before any is used */
            if (!got[j])
                asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];"
                             : "=l"(word[j])
                             : "l"(prev + threadIdx.x + j * kThreads)
                             : "memory");
#pragma unroll
        for (int j = 0; j < kPerThread; j++) {
            if (got[j])
                continue;
            got[j] = (unsigned)(word[j] >> 32) == (unsigned)s;
            v[j] = (int32_t)(unsigned)word[j];
            all = all && got[j];
        }
    }
    uint32_t amax = 0;
#pragma unroll
    for (int j = 0; j < kPerThread; j++)
        amax = max(amax, (uint32_t)abs(v[j]));
    int sh = 9;
    if (kNorm && s > 0) { /* the block's max of |input|: warps, then the block */
        for (int o = 16; o > 0; o >>= 1)
            amax = max(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (threadIdx.x % 32 == 0)
            warp_max[threadIdx.x / 32] = amax;
        __syncthreads();
        amax = 0;
        for (int w = 0; w < kThreads / 32; w++)
            amax = max(amax, warp_max[w]);
        sh = shift_for(amax);
    }
#pragma unroll
    for (int j = 0; j < kPerThread; j++) {
        const int i = threadIdx.x + j * kThreads;
        if (i < k) {
            const int32_t t = v[j] >> sh;
            in_s[i] = s == 0 ? (int8_t)v[j] : (int8_t)(t > 127 ? 127 : t < -127 ? -127 : t);
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) /* after every thread's reads (the barrier), released */
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(readers + s) : "memory");
}

/* kBufs stage buffers: the copy of stage s + kBufs - 1 starts with stage s.
 * kNorm: the normalised chain (each block finds its input's scale). */
template <int kBufs, bool kNorm, bool kRows = true>
__global__ void __launch_bounds__(kThreads) chain_flagged_kernel(const int8_t *w, const int8_t *x,
                                                                 unsigned long long *out0,
                                                                 unsigned long long *out1,
                                                                 unsigned *readers, int n_stages)
{
    extern __shared__ __align__(128) int8_t buf[]; /* kBufs stage buffers */
    __shared__ __align__(16) int8_t in_s[kMaxK];
    __shared__ __align__(8) uint64_t bars[kBufs];
    if (threadIdx.x == 0)
        for (int i = 0; i < kBufs; i++)
            mbar_init(&bars[i]);
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 0; i + 1 < kBufs && i < n_stages; i++)
            stage_copy(w, i, buf + i * kStageBytes, &bars[i]);
    for (int s = 0; s < n_stages; s++) {
        const int ahead = s + kBufs - 1; /* its buffer was read by stage s - 1 */
        if (threadIdx.x == 0 && ahead < n_stages)
            stage_copy(w, ahead, buf + (ahead % kBufs) * kStageBytes, &bars[ahead % kBufs]);
        load_flagged<kNorm>(s, x, s % 2 ? out0 : out1, in_s, readers);
        const Stage st = d_stages[s];
        int r0, r1;
        block_rows(st, &r0, &r1);
        mbar_wait(&bars[s % kBufs], (unsigned)((s / kBufs) % 2));
        if (kRows)
            stage_rows_from<true>(reinterpret_cast<const int4 *>(buf + (s % kBufs) * kStageBytes),
                                  st, in_s, s % 2 ? out1 : out0, r0, r1, s);
        else /* the skeleton: each row's word written, no products */
            for (int r = r0 + threadIdx.x; r < r1; r += blockDim.x)
                put_out(s % 2 ? out1 : out0, r, in_s[r % st.k], s);
        __syncthreads(); /* the stage's buffer is free for a later copy */
    }
}

/* A plain read of every weight byte, for the copy-bandwidth ceiling. */
__global__ void read_kernel(const int4 *w, int64_t n16, int *sink)
{
    int acc = 0;
    for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < n16;
         i += (int64_t)gridDim.x * blockDim.x) {
        const int4 v = __ldcs(w + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    if (acc == 0x7fffffff)
        *sink = acc;
}

/* The CPU's chain: each stage's input the stage before's output >> 9 (or,
 * normalised, >> shift_for(its largest |value|)), clamped; the last
 * stage's output. */
static std::vector<int32_t> cpu_chain(const std::vector<Stage> &st, const std::vector<int8_t> &w,
                                      const std::vector<int8_t> &x, bool normalised)
{
    std::vector<int32_t> prev(13824), out(13824);
    std::vector<int8_t> in(kMaxK);
    for (size_t s = 0; s < st.size(); s++) {
        uint32_t amax = 0;
        for (int i = 0; normalised && s > 0 && i < st[s].k; i++)
            amax = std::max(amax, (uint32_t)std::abs(prev[i]));
        const int sh = normalised ? shift_for(amax) : 9;
        for (int i = 0; i < st[s].k; i++) {
            const int32_t t = s == 0 ? x[i] : prev[i] >> sh;
            in[i] = (int8_t)(t > 127 ? 127 : t < -127 ? -127 : t);
        }
        for (int r = 0; r < st[s].n; r++) {
            int32_t acc = 0;
            const int8_t *row = &w[(size_t)(st[s].offset + (int64_t)r * st[s].k)];
            for (int i = 0; i < st[s].k; i++)
                acc += (int32_t)row[i] * in[i];
            out[r] = acc;
        }
        prev.swap(out);
    }
    return prev;
}

int main()
{
    const int sms = device_sms();
    cudaDeviceProp prop;
    CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    std::vector<Stage> st;
    int64_t total = 0;
    const int shapes[4][2] = {{3840, 640}, {2560, 640}, {13824, 640}, {2560, 1728}};
    for (int l = 0; l < kLayers; l++)
        for (int j = 0; j < 4; j++) {
            st.push_back({shapes[j][0], shapes[j][1], total});
            total += (int64_t)shapes[j][0] * shapes[j][1];
        }
    const int S = (int)st.size();
    CUDA_CHECK(cudaMemcpyToSymbol(d_stages, st.data(), sizeof(Stage) * S));
    printf("device %s, %d SMs; chain of %d stages, %.1f MB of int8 weights\n", prop.name, sms, S,
           total / 1e6);

    std::vector<int8_t> w((size_t)total), x(kMaxK);
    for (auto &v : w)
        v = (int8_t)lab_rand_range(-127, 127);
    for (auto &v : x)
        v = (int8_t)lab_rand_range(-127, 127);
    const std::vector<int32_t> want_plain = cpu_chain(st, w, x, false);
    const int32_t *want = want_plain.data(); /* the last stage's output (n = 2560) */
    const std::vector<int32_t> want_norm = cpu_chain(st, w, x, true);
    const int last_n = st[S - 1].n;

    int8_t *dw, *dx;
    int32_t *o0, *o1;
    unsigned *counter;
    int *sink;
    CUDA_CHECK(cudaMalloc(&dw, (size_t)total));
    CUDA_CHECK(cudaMalloc(&dx, kMaxK));
    CUDA_CHECK(cudaMalloc(&o0, 13824 * 4));
    CUDA_CHECK(cudaMalloc(&o1, 13824 * 4));
    CUDA_CHECK(cudaMalloc(&counter, 4));
    CUDA_CHECK(cudaMalloc(&sink, 4));
    CUDA_CHECK(cudaMemcpy(dw, w.data(), (size_t)total, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(dx, x.data(), kMaxK, cudaMemcpyHostToDevice));
    int32_t *final_out = (S - 1) % 2 ? o1 : o0; /* stage s writes o1 when s is odd */

    cudaStream_t stream;
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CUDA_CHECK(cudaEventCreate(&a));
    CUDA_CHECK(cudaEventCreate(&b));
    std::vector<int32_t> got(last_n);
    auto check = [&](const char *what) {
        CUDA_CHECK(cudaMemcpy(got.data(), final_out, last_n * 4, cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < last_n; i++)
            bad += got[i] != want[i];
        if (bad)
            printf("FAIL %s: %d of %d outputs differ from the CPU's\n", what, bad, last_n);
        return bad == 0;
    };
    auto time_it = [&](const char *what, bool chain, auto &&run) {
        run(); /* warm */
        CUDA_CHECK(cudaStreamSynchronize(stream));
        const bool ok = !chain || check(what);
        const int reps = 20;
        CUDA_CHECK(cudaEventRecord(a, stream));
        for (int i = 0; i < reps; i++)
            run();
        CUDA_CHECK(cudaEventRecord(b, stream));
        CUDA_CHECK(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
        const double us = 1000.0 * ms / reps;
        printf("%-44s %8.1f us a chain, %5.2f us a stage, %6.0f GB/s%s\n", what, us, us / S,
               total / us / 1e3, ok ? "" : "  (WRONG)");
        return us;
    };

    /* The ceiling: every weight byte read once by a plain kernel. */
    time_it("plain read of the weights (no chain)", false, [&] {
        read_kernel<<<sms * 4, 512, 0, stream>>>(reinterpret_cast<const int4 *>(dw), total / 16,
                                                 sink);
    });
    /* Variant 1: a graph of one kernel a stage, each over every SM. */
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed));
    for (int s = 0; s < S; s++)
        stage_kernel<<<sms, kThreads, 0, stream>>>(dw, dx, o0, o1, s);
    CUDA_CHECK(cudaStreamEndCapture(stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    time_it("one kernel a stage (graph)", true, [&] { CUDA_CHECK(cudaGraphLaunch(exec, stream)); });
    /* Variants 2 and 3: one persistent kernel, one block an SM. */
    time_it("persistent, counter between stages", true, [&] {
        CUDA_CHECK(cudaMemsetAsync(counter, 0, 4, stream));
        chain_kernel<false><<<sms, kThreads, 0, stream>>>(dw, dx, o0, o1, counter, S);
    });
    time_it("persistent, inputs and barriers only (no rows)", false, [&] {
        CUDA_CHECK(cudaMemsetAsync(counter, 0, 4, stream));
        chain_kernel<false, false><<<sms, kThreads, 0, stream>>>(dw, dx, o0, o1, counter, S);
    });
    time_it("persistent, next stage prefetched to L2", true, [&] {
        CUDA_CHECK(cudaMemsetAsync(counter, 0, 4, stream));
        chain_kernel<true><<<sms, kThreads, 0, stream>>>(dw, dx, o0, o1, counter, S);
    });
    CUDA_CHECK(cudaFuncSetAttribute(chain_smem_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               2 * kStageBytes));
    time_it("persistent, next stage staged in shared memory", true, [&] {
        CUDA_CHECK(cudaMemsetAsync(counter, 0, 4, stream));
        chain_smem_kernel<<<sms, kThreads, 2 * kStageBytes, stream>>>(dw, dx, o0, o1, counter,
                                                                       S);
    });
    /* Variant 5: flagged outputs (their words' low halves checked). */
    unsigned long long *f0, *f1;
    unsigned *readers;
    CUDA_CHECK(cudaMalloc(&f0, 13824 * 8));
    CUDA_CHECK(cudaMalloc(&f1, 13824 * 8));
    CUDA_CHECK(cudaMalloc(&readers, S * sizeof(unsigned)));
    auto flagged = [&](const char *what, auto kernel, int bufs, const std::vector<int32_t> &ref) {
        CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                        bufs * kStageBytes));
        time_it(what, false, [&] {
            CUDA_CHECK(cudaMemsetAsync(f0, 0, 13824 * 8, stream));
            CUDA_CHECK(cudaMemsetAsync(f1, 0, 13824 * 8, stream));
            CUDA_CHECK(cudaMemsetAsync(readers, 0, S * sizeof(unsigned), stream));
            kernel<<<sms, kThreads, bufs * kStageBytes, stream>>>(dw, dx, f0, f1, readers, S);
        });
        CUDA_CHECK(cudaStreamSynchronize(stream));
        std::vector<unsigned long long> words(last_n);
        CUDA_CHECK(cudaMemcpy(words.data(), (S - 1) % 2 ? f1 : f0, last_n * 8,
                              cudaMemcpyDeviceToHost));
        int bad = 0;
        for (int i = 0; i < last_n; i++)
            bad += (!ref.empty() && (int32_t)(unsigned)words[i] != ref[i]) ||
                   (words[i] >> 32) != (unsigned)S;
        if (bad)
            printf("  FAIL: %d of %d outputs differ from the CPU's\n", bad, last_n);
    };
    flagged("flagged, inputs and outputs only (no rows)", chain_flagged_kernel<2, false, false>,
            2, {});
    flagged("persistent, shared memory (2), flagged outputs", chain_flagged_kernel<2, false>, 2,
            want_plain);
    flagged("persistent, shared memory (3), flagged outputs", chain_flagged_kernel<3, false>, 3,
            want_plain);
    flagged("as above, each block normalising its input", chain_flagged_kernel<3, true>, 3,
            want_norm);
    CUDA_CHECK(cudaGetLastError());
    return 0;
}
