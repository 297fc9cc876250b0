/* read_floor: how fast one kernel can read a buffer of a given size, the
 * ceiling for any kernel that must stream that many bytes once (a GEMV's
 * packed weights).
 *
 * The W2A8 GEMV's bandwidth is quoted against the device-to-device copy
 * bandwidth of a 1 GiB copy. A single kernel reading a few MB cannot reach
 * that: it pays a launch, the first loads' latency and a last partial wave.
 * This program measures what is left when the kernel does nothing but read:
 * each thread streams 16-byte loads (grid-stride, UNROLL loads in flight,
 * not kept in L1), folds them into one word and writes one word per block.
 *
 * Per size, every configuration (blocks per SM x threads x UNROLL) is timed
 * two ways, replayed from a CUDA graph over buffers rotated through >= 1 GiB
 * so that L2 never holds them:
 *
 *   alone    plain launches: each read starts after the previous finished;
 *   chained  programmatic dependent launch: each kernel's reads start while
 *            the one before it finishes (its write waits in
 *            griddepcontrol.wait), as the decode step chains its GEMVs.
 *
 * The best configuration of each is printed with its GB/s and its share of
 * the copy bandwidth measured in the same run.
 *
 * Build: with the CUDA backend (build/read_floor), or
 *        nvcc -O3 -arch=sm_90 -o read_floor bench/read_floor.cu
 * Run:   read_floor [MB ...]   (default: the packed sizes of bench kernels'
 *                               GEMV shapes) */
#include <cuda_runtime.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                       \
    do {                                                                                  \
        cudaError_t e_ = (call);                                                          \
        if (e_ != cudaSuccess) {                                                          \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                 \
                    cudaGetErrorString(e_));                                              \
            exit(1);                                                                      \
        }                                                                                 \
    } while (0)

enum { kLaunches = 50, kReps = 10 };

__device__ __forceinline__ uint4 load_stream(const uint4 *p)
{
    uint4 v;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
    return v;
}

/* Programmatic dependent launch (compute capability 9.0; on older devices
 * the chained launches simply run one after another). */
__device__ __forceinline__ void pdl_wait(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_trigger(void)
{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

template <int UNROLL, bool CHAINED>
__global__ void read_kernel(const uint4 *__restrict__ buf, size_t n16, uint32_t *sink)
{
    if (CHAINED)
        pdl_trigger();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    uint32_t acc = 0;
    for (; i + (UNROLL - 1) * stride < n16; i += UNROLL * stride) {
        uint4 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            v[u] = load_stream(buf + i + u * stride);
#pragma unroll
        for (int u = 0; u < UNROLL; u++)
            acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n16; i += stride) {
        const uint4 v = load_stream(buf + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    /* Fold the block's words so the loads cannot be dropped. */
    for (int o = 16; o > 0; o >>= 1)
        acc ^= __shfl_xor_sync(0xffffffffu, acc, o);
    if (CHAINED)
        pdl_wait();
    if ((threadIdx.x & 31) == 0)
        atomicXor(sink + blockIdx.x % 64, acc);
}

typedef void (*kernel_fn)(const uint4 *, size_t, uint32_t *);

struct Config {
    int blocks_per_sm, threads, unroll;
};

static kernel_fn pick(int unroll, bool chained)
{
    switch (unroll) {
    case 1: return chained ? read_kernel<1, true> : read_kernel<1, false>;
    case 2: return chained ? read_kernel<2, true> : read_kernel<2, false>;
    case 4: return chained ? read_kernel<4, true> : read_kernel<4, false>;
    default: return chained ? read_kernel<8, true> : read_kernel<8, false>;
    }
}

static void launch(kernel_fn k, bool chained, int blocks, int threads, const uint4 *buf,
                   size_t n16, uint32_t *sink, cudaStream_t s)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)blocks);
    cfg.blockDim = dim3((unsigned)threads);
    cfg.stream = s;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = &attr;
    cfg.numAttrs = chained ? 1 : 0;
    CHECK(cudaLaunchKernelEx(&cfg, k, buf, n16, sink));
}

/* Microseconds per call of kLaunches calls over the rotated buffers. */
static double time_config(const Config &c, bool chained, uint4 **bufs, int n_bufs, size_t n16,
                          uint32_t *sink, int sms, cudaStream_t s)
{
    const kernel_fn k = pick(c.unroll, chained);
    const int blocks = sms * c.blocks_per_sm;
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < kLaunches; i++)
        launch(k, chained, blocks, c.threads, bufs[i % n_bufs], n16, sink, s);
    CHECK(cudaStreamEndCapture(s, &graph));
    CHECK(cudaGraphInstantiate(&exec, graph, 0));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaGraphLaunch(exec, s)); /* warm up */
    CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(start, s));
    for (int r = 0; r < kReps; r++)
        CHECK(cudaGraphLaunch(exec, s));
    CHECK(cudaEventRecord(stop, s));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(cudaEventDestroy(start));
    CHECK(cudaEventDestroy(stop));
    CHECK(cudaGraphExecDestroy(exec));
    CHECK(cudaGraphDestroy(graph));
    return (double)ms * 1e3 / (kLaunches * kReps);
}

static double copy_gbs(cudaStream_t s)
{
    const size_t bytes = (size_t)1 << 30;
    void *a, *b;
    CHECK(cudaMalloc(&a, bytes));
    CHECK(cudaMalloc(&b, bytes));
    CHECK(cudaMemsetAsync(a, 1, bytes, s));
    CHECK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
    cudaEvent_t start, stop;
    CHECK(cudaEventCreate(&start));
    CHECK(cudaEventCreate(&stop));
    CHECK(cudaEventRecord(start, s));
    for (int r = 0; r < 10; r++)
        CHECK(cudaMemcpyAsync(r & 1 ? a : b, r & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, s));
    CHECK(cudaEventRecord(stop, s));
    CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CHECK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(cudaFree(a));
    CHECK(cudaFree(b));
    return 2.0 * (double)bytes * 10 / ((double)ms * 1e-3) / 1e9;
}

int main(int argc, char **argv)
{
    /* bench kernels' GEMV shapes, packed: N x round_up(K, 256) / 4 bytes. */
    const long long shapes[][2] = {{2560, 2560},  {3840, 2560},  {13824, 2560}, {2560, 6912},
                                   {20480, 3200}, {5120, 27648}, {55296, 5120}};
    double mb[16];
    int n_sizes = 0;
    if (argc > 1) {
        for (int i = 1; i < argc && n_sizes < 16; i++) {
            char *end;
            mb[n_sizes] = strtod(argv[i], &end);
            if (*end || !(mb[n_sizes] > 0.0 && mb[n_sizes] <= 4096.0)) {
                fprintf(stderr, "usage: read_floor [MB ...] (each 0 < MB <= 4096)\n");
                return 2;
            }
            n_sizes++;
        }
    } else {
        for (const auto &sh : shapes)
            mb[n_sizes++] = (double)(sh[0] * ((sh[1] + 255) / 256 * 256) / 4) / 1e6;
    }

    int dev = 0, sms = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, dev));
    cudaStream_t s;
    CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    uint32_t *sink;
    CHECK(cudaMalloc(&sink, 64 * sizeof(uint32_t)));
    const double copy = copy_gbs(s);
    printf("device: %s (%d SMs); device-to-device copy %.0f GB/s (read + write)\n\n", p.name, sms,
           copy);

    const Config configs[] = {{1, 512, 4}, {1, 1024, 4}, {2, 512, 4},  {2, 1024, 2},
                              {4, 256, 4}, {4, 512, 2},  {4, 512, 4},  {8, 256, 2},
                              {8, 256, 4}, {2, 1024, 4}, {1, 1024, 8}, {16, 128, 4}};
    printf("| MB | alone us | alone GB/s | alone %% of copy | best alone | chained us | "
           "chained GB/s | chained %% of copy | best chained |\n"
           "|---|---|---|---|---|---|---|---|---|\n");
    for (int si = 0; si < n_sizes; si++) {
        const size_t n16 = (size_t)(mb[si] * 1e6 / 16.0);
        const size_t bytes = n16 * 16;
        int n_bufs = (int)(((size_t)1 << 30) / bytes) + 1;
        n_bufs = n_bufs < 2 ? 2 : n_bufs > 512 ? 512 : n_bufs;
        uint4 **bufs = (uint4 **)calloc((size_t)n_bufs, sizeof *bufs);
        for (int i = 0; i < n_bufs; i++) {
            CHECK(cudaMalloc(&bufs[i], bytes));
            CHECK(cudaMemsetAsync(bufs[i], 0x5a + i, bytes, s)); /* never zeros */
        }
        double best[2] = {1e30, 1e30};
        int best_i[2] = {0, 0};
        for (int chained = 0; chained < 2; chained++)
            for (int c = 0; c < (int)(sizeof configs / sizeof configs[0]); c++) {
                const double us =
                    time_config(configs[c], chained, bufs, n_bufs, n16, sink, sms, s);
                if (us < best[chained]) {
                    best[chained] = us;
                    best_i[chained] = c;
                }
            }
        printf("| %.1f |", (double)bytes / 1e6);
        for (int chained = 0; chained < 2; chained++) {
            const double gbs = (double)bytes / (best[chained] * 1e-6) / 1e9;
            const Config &c = configs[best_i[chained]];
            printf(" %.2f | %.0f | %.0f%% | %d x %d threads, %d loads |", best[chained], gbs,
                   100.0 * gbs / copy, c.blocks_per_sm, c.threads, c.unroll);
        }
        printf("\n");
        fflush(stdout);
        for (int i = 0; i < n_bufs; i++)
            CHECK(cudaFree(bufs[i]));
        free(bufs);
    }
    printf("\nbest of %d configurations (blocks per SM x threads per block, 16-byte loads in "
           "flight per thread);\ntimes per call from %d replays of a graph of %d calls over "
           "buffers rotated through >= 1 GiB.\n",
           (int)(sizeof configs / sizeof configs[0]), kReps, kLaunches);
    CHECK(cudaFree(sink));
    CHECK(cudaStreamDestroy(s));
    return 0;
}
