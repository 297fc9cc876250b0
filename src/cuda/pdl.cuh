/*
 * pdl.cuh - Programmatic Dependent Launch (compute capability 9.0+) for the
 * kernels of the decode step, shared by the .cu files that launch them.
 *
 * A kernel launched with programmatic stream serialization may start while
 * the kernel before it in the stream is still running. Such a kernel does
 * what needs nothing from earlier kernels first (loading weights, norm
 * vectors, RoPE tables, old KV-cache rows), then calls pdl_wait(), which
 * returns once every earlier kernel has completed and its memory is
 * visible. The rules every kernel launched that way follows:
 *
 *   - no global write, and no read of anything an earlier kernel of the
 *     step may write, before pdl_wait();
 *   - every thread calls pdl_wait() on every path (also threads with
 *     nothing to do): the grid then cannot complete before its
 *     predecessor, so waiting on it covers everything before it too;
 *   - pdl_trigger() (at the start) lets the next kernel be scheduled as
 *     soon as every block of this one is running; where it sits never
 *     affects correctness, only how early the next kernel starts.
 *
 * Compiled for an architecture below 9.0 both are no-ops, so the host must
 * ask for the launch attribute only where the kernels were compiled with
 * them (cudaFuncAttributes::ptxVersion >= 90) and the device runs them.
 * Without the attribute both are no-ops at run time as well.
 */
#ifndef BN_PDL_CUH
#define BN_PDL_CUH

#include <cuda_runtime.h>

#include <utility>

/* Decode tracing (a build with -DBITNET_DECODE_TRACE=ON, for measurement
 * only): thread 0 of every block notes the global timer at pdl_trigger()
 * (the block runs) and after pdl_wait() (its inputs are ready) into a
 * device buffer that the host attaches per .cu file (BN_TRACE_ATTACH).
 * docs/PERFORMANCE.md says how the step is read from them. */
#ifdef BN_DECODE_TRACE
constexpr int kTraceMarks = 4;
struct bn_trace_rec {
    unsigned long long t_run, t_ready; /* ns, %globaltimer               */
    unsigned grid, threads, block, sm;
    unsigned long long mark[kTraceMarks]; /* pdl_mark(k), 0 if not reached */
};
static __device__ bn_trace_rec *bn_trace_recs;
static __device__ unsigned *bn_trace_count;
static __device__ unsigned bn_trace_cap;

__device__ __forceinline__ unsigned long long bn_trace_now()
{
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ unsigned long long &bn_trace_run_time()
{
    __shared__ unsigned long long t_run;
    return t_run;
}

__device__ __forceinline__ unsigned &bn_trace_slot()
{
    __shared__ unsigned slot;
    return slot;
}

/* Defines the host function that points this file's kernels at a buffer. */
#define BN_TRACE_ATTACH(name)                                                                   \
    extern "C" cudaError_t name(void *recs, unsigned *count, unsigned cap)                       \
    {                                                                                            \
        bn_trace_rec *r = static_cast<bn_trace_rec *>(recs);                                     \
        cudaError_t rc = cudaMemcpyToSymbol(bn_trace_recs, &r, sizeof r);                        \
        if (rc == cudaSuccess)                                                                   \
            rc = cudaMemcpyToSymbol(bn_trace_count, &count, sizeof count);                       \
        return rc == cudaSuccess ? cudaMemcpyToSymbol(bn_trace_cap, &cap, sizeof cap) : rc;      \
    }
#endif

__device__ __forceinline__ void pdl_wait()
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
#ifdef BN_DECODE_TRACE
    if (threadIdx.x == 0 && threadIdx.y == 0 && bn_trace_recs) {
        const unsigned i = atomicAdd(bn_trace_count, 1u);
        if (i < bn_trace_cap) {
            unsigned sm;
            asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
            bn_trace_rec r = {bn_trace_run_time(), bn_trace_now(),
                              gridDim.x * gridDim.y * gridDim.z,
                              blockDim.x * blockDim.y * blockDim.z,
                              blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z), sm,
                              {0, 0, 0, 0}};
            bn_trace_recs[i] = r;
        }
        bn_trace_slot() = i;
    }
#endif
}

/* Trace builds: thread 0 notes the time it reaches point k (< 4) of the
 * kernel into its block's record (after pdl_wait only); no-op otherwise. */
__device__ __forceinline__ void pdl_mark(int k)
{
#ifdef BN_DECODE_TRACE
    if (threadIdx.x == 0 && threadIdx.y == 0 && bn_trace_recs && bn_trace_slot() < bn_trace_cap)
        bn_trace_recs[bn_trace_slot()].mark[k] = bn_trace_now();
#else
    (void)k;
#endif
}

__device__ __forceinline__ void pdl_trigger()
{
#ifdef BN_DECODE_TRACE
    if (threadIdx.x == 0 && threadIdx.y == 0)
        bn_trace_run_time() = bn_trace_now();
#endif
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* Launches kernel<<<grid, block, smem, stream>>>(args...), with
 * programmatic stream serialization when pdl is non-zero, in thread-block
 * clusters of cluster.x x cluster.y x cluster.z blocks unless that is one
 * block (sm_90). Returns the launch's error. */
template <typename... KArgs, typename... Args>
static inline cudaError_t pdl_launch_clustered(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                               size_t smem, dim3 cluster, cudaStream_t stream,
                                               int pdl, Args &&...args)
{
    cudaLaunchAttribute attr[2];
    int n = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n].val.programmaticStreamSerializationAllowed = 1;
        n++;
    }
    if (cluster.x * cluster.y * cluster.z > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = cluster.x;
        attr[n].val.clusterDim.y = cluster.y;
        attr[n].val.clusterDim.z = cluster.z;
        n++;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = stream;
    cfg.attrs = n ? attr : nullptr;
    cfg.numAttrs = (unsigned)n;
    return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

template <typename... KArgs, typename... Args>
static inline cudaError_t pdl_launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                                     cudaStream_t stream, int pdl, Args &&...args)
{
    return pdl_launch_clustered(kernel, grid, block, smem, dim3(1, 1, 1), stream, pdl,
                                std::forward<Args>(args)...);
}

/* Thread-block clusters: device code compiled for sm_90 or later may use
 * them; the host pass and older architectures compile that code out. */
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
#define BN_HAS_CLUSTERS 1
#else
#define BN_HAS_CLUSTERS 0
#endif

/* Whether `kernel` may be launched in clusters: the current device
 * launches them and the kernel was compiled for sm_90 or later (a JIT of
 * sm_80 PTX has no cluster code). A failed query answers false and leaves
 * no error behind for the next launch to report. */
template <typename... KArgs> static inline bool clusters_usable(void (*kernel)(KArgs...))
{
    int dev = 0, launch = 0;
    cudaFuncAttributes fa;
    if (cudaGetDevice(&dev) != cudaSuccess ||
        cudaDeviceGetAttribute(&launch, cudaDevAttrClusterLaunch, dev) != cudaSuccess ||
        cudaFuncGetAttributes(&fa, (const void *)kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return launch != 0 && fa.ptxVersion >= 90;
}

/* How many clusters of `cluster` blocks of `kernel`, launched as grid x
 * block with smem bytes of dynamic shared memory, the device can hold at
 * once (cudaOccupancyMaxActiveClusters). The kernel's attributes (its
 * dynamic shared memory limit, a non-portable cluster size) must be set
 * first. A failed query leaves *count 0 and returns its error, cleared. */
template <typename... KArgs>
static inline cudaError_t resident_clusters(void (*kernel)(KArgs...), dim3 grid, dim3 block,
                                            size_t smem, dim3 cluster, int *count)
{
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeClusterDimension;
    attr.val.clusterDim.x = cluster.x;
    attr.val.clusterDim.y = cluster.y;
    attr.val.clusterDim.z = cluster.z;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    *count = 0;
    const cudaError_t rc = cudaOccupancyMaxActiveClusters(count, kernel, &cfg);
    if (rc != cudaSuccess) {
        *count = 0;
        (void)cudaGetLastError();
    }
    return rc;
}

/* One block's bulk copies from global to its own shared memory by the
 * tensor memory accelerator, each completing on a transaction barrier:
 *
 *   bulk_bar_init(bar)              thread 0, then a block barrier before
 *                                   any other thread waits on bar;
 *   bulk_copy(dst, src, bytes, bar) thread 0: arms bar for the bytes and
 *                                   issues the copy (one copy per barrier
 *                                   phase);
 *   bulk_wait(bar)                  every thread: returns once the bytes
 *                                   have landed (phase 0).
 *
 * dst shared and src global, both 16-byte aligned, bytes a multiple of 16
 * and below 2^20. sm_90 only: elsewhere they compile to nothing and the
 * host must not launch a kernel that relies on them. */
__device__ __forceinline__ void bulk_bar_init(unsigned long long *bar)
{
#if BN_HAS_CLUSTERS
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(
                     (unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#else
    (void)bar;
#endif
}

/* The copy alone, its bytes counted on bar: for several copies on one
 * barrier phase, armed once for all of them (bar_expect, below). */
__device__ __forceinline__ void bulk_issue(void *dst, const void *src, unsigned bytes,
                                           unsigned long long *bar)
{
#if BN_HAS_CLUSTERS
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                 " [%0], [%1], %2, [%3];" ::"r"((unsigned)__cvta_generic_to_shared(dst)),
                 "l"(src), "r"(bytes), "r"((unsigned)__cvta_generic_to_shared(bar))
                 : "memory");
#else
    (void)dst, (void)src, (void)bytes, (void)bar;
#endif
}

/* Arms the calling block's barrier for `bytes` more (one arrival: the
 * barrier's count must be 1, as bulk_bar_init makes it). */
__device__ __forceinline__ void bar_expect(unsigned long long *bar, unsigned bytes)
{
#if BN_HAS_CLUSTERS
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(
                     (unsigned)__cvta_generic_to_shared(bar)),
                 "r"(bytes)
                 : "memory");
#else
    (void)bar, (void)bytes;
#endif
}

__device__ __forceinline__ void bulk_copy(void *dst, const void *src, unsigned bytes,
                                          unsigned long long *bar)
{
    bar_expect(bar, bytes);
    bulk_issue(dst, src, bytes, bar);
}

__device__ __forceinline__ void bulk_wait(unsigned long long *bar)
{
#if BN_HAS_CLUSTERS
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    unsigned done = 0;
    do {
        asm volatile("{\n\t.reg .pred p;\n\t"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n\t"
                     "selp.u32 %0, 1, 0, p;\n\t}"
                     : "=r"(done)
                     : "r"(b)
                     : "memory");
    } while (!done);
#else
    (void)bar;
#endif
}

/* ---- stores into another block of the cluster, counted on its barrier ----
 *
 * st_async_to(local, v, bar, rank): stores v at the shared-memory offset of
 * `local` in block `rank` of the cluster, asynchronously, and counts its
 * bytes (4 or 16) on the transaction barrier at the offset of `bar` in that
 * block. The receiving block arms its barrier for every byte it will get
 * (mbarrier.arrive.expect_tx, before any sender can start: e.g. before the
 * cluster barrier every sender waits at) and waits on it (bulk_wait); no
 * cluster-wide barrier is needed, and the sender never waits (bar_expect
 * is above). The receiver
 * must have started (a cluster barrier phase) before the first store. sm_90
 * only. */
__device__ __forceinline__ unsigned cluster_addr(const void *local, unsigned rank)
{
    unsigned r = 0;
#if BN_HAS_CLUSTERS
    asm("mapa.shared::cluster.u32 %0, %1, %2;"
        : "=r"(r)
        : "r"((unsigned)__cvta_generic_to_shared(local)), "r"(rank));
#else
    (void)local, (void)rank;
#endif
    return r;
}

__device__ __forceinline__ void st_async_to(const float *local, float v, unsigned long long *bar,
                                            unsigned rank)
{
#if BN_HAS_CLUSTERS
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(
                     cluster_addr(local, rank)),
                 "r"(__float_as_uint(v)), "r"(cluster_addr(bar, rank))
                 : "memory");
#else
    (void)local, (void)v, (void)bar, (void)rank;
#endif
}

__device__ __forceinline__ void st_async_to(const float4 *local, float4 v,
                                            unsigned long long *bar, unsigned rank)
{
#if BN_HAS_CLUSTERS
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, "
                 "%4}, [%5];" ::"r"(cluster_addr(local, rank)),
                 "r"(__float_as_uint(v.x)), "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)),
                 "r"(__float_as_uint(v.w)), "r"(cluster_addr(bar, rank))
                 : "memory");
#else
    (void)local, (void)v, (void)bar, (void)rank;
#endif
}

/* ---- one row staged into every block of a cluster ------------------------
 *
 * Many blocks of a decode kernel each copy the same short row (a GEMV's int8
 * activations) from L2 into their shared memory right after the PDL wait,
 * every copy a request for the same few cache lines. In a cluster of C
 * blocks the tensor memory accelerator can do it once per cluster: block r
 * copies the r-th of C slices of the row into the same offset of every
 * block's shared memory (multicast), and each block waits on a transaction
 * barrier of its own until all of the row's bytes have arrived.
 *
 *   row_multicast_arm(bar, bytes)    before pdl_wait (all threads): arms the
 *                                    block's barrier for `bytes`, arrives
 *                                    at the cluster barrier;
 *   row_multicast(dst, src, bytes, bar, C) after pdl_wait (all threads):
 *                                    waits for every block's barrier to be
 *                                    armed, issues this block's slice,
 *                                    waits for the whole row.
 *
 * dst: shared memory, 16-byte aligned, the same offset in every block;
 * src: global, 16-byte aligned; bytes a multiple of 16. sm_90 only (the
 * host launches such a kernel in clusters only where clusters_usable). */
__device__ __forceinline__ void row_multicast_arm(unsigned long long *bar, unsigned bytes)
{
#if BN_HAS_CLUSTERS
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    if (threadIdx.x == 0)
        bulk_bar_init(bar);
    /* The compiler initialises the barrier on the warp's uniform datapath,
     * which racecheck counts as a write by every lane of warp 0; the block
     * barrier orders it before the arming for the tool too (before the PDL
     * wait: off the critical path). */
    __syncthreads();
    if (threadIdx.x == 0)
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes)
                     : "memory");
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#endif
}

__device__ __forceinline__ void row_multicast(void *dst, const void *src, unsigned bytes,
                                              unsigned long long *bar, int C)
{
#if BN_HAS_CLUSTERS
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
    if (threadIdx.x == 0) {
        unsigned rank;
        asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
        const unsigned per = (bytes / 16 + (unsigned)C - 1) / (unsigned)C * 16;
        const unsigned off = rank * per;
        if (off < bytes) {
            const unsigned len = bytes - off < per ? bytes - off : per;
            const unsigned short mask = (unsigned short)((1u << C) - 1);
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes"
                         ".multicast::cluster [%0], [%1], %2, [%3], %4;" ::"r"(
                             (unsigned)__cvta_generic_to_shared(static_cast<char *>(dst) + off)),
                         "l"(static_cast<const char *>(src) + off), "r"(len), "r"(b), "h"(mask)
                         : "memory");
        }
    }
    bulk_wait(bar);
#else
    (void)dst, (void)src, (void)bytes, (void)bar, (void)C;
#endif
}

/* Whether `kernel` was compiled with the PDL instructions. */
template <typename... KArgs> static inline bool pdl_compiled(void (*kernel)(KArgs...))
{
    cudaFuncAttributes fa;
    if (cudaFuncGetAttributes(&fa, (const void *)kernel) != cudaSuccess) {
        (void)cudaGetLastError();
        return false;
    }
    return fa.ptxVersion >= 90;
}

#endif
