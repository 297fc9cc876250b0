/* step_sync: what one dependent stage of a decode step costs, by how the
 * stages are chained.
 *
 * The decode step is a chain of small dependent stages (norms, GEMVs,
 * attention), each short enough that the cost of handing over from one
 * stage to the next matters as much as its work. This program times the
 * same chain of stages four ways, all replayed from CUDA graphs:
 *
 *   kernels        one kernel per stage, plainly launched;
 *   kernels+PDL    one kernel per stage with programmatic dependent launch
 *                  (the next kernel's blocks wait in griddepcontrol.wait);
 *   persistent     one kernel for the whole chain, its blocks all resident
 *                  (cooperative launch), a grid-wide barrier between stages.
 *
 * and with two kinds of stage: "empty" (only the hand-over) and "vector"
 * (every block reads the previous stage's 2560-float vector through L2,
 * sums it across the block and writes its share of the next vector: the
 * smallest piece of work a GEMV or norm stage does after its inputs are
 * ready). Per-stage time = replay time / stages.
 *
 * A second table times the decode step's norm -> GEMV edge: a one-block
 * "vector" stage (a norm) feeding a grid of blocks (a GEMV), then the next
 * norm, all with programmatic dependent launch. The grid's blocks wait for
 * the norm either in griddepcontrol.wait (the hardware's grid completion)
 * or by polling a flag the norm's block sets, with release semantics, once
 * its output is written; the norm always waits for the grid in
 * griddepcontrol.wait. Per-pair time = replay time / pairs.
 *
 * Build: with the CUDA backend (build/step_sync), or
 *        nvcc -O3 -arch=sm_90 -o step_sync bench/step_sync.cu
 * Run:   step_sync [stages]   (default 270, the 2B-4T decode step's count) */
#include <cuda_runtime.h>

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

enum { kThreads = 256, kDim = 2560 };

/* Programmatic dependent launch (compute capability 9.0; on older devices
 * the launches simply run one after another). */
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

/* One stage's work: read all of `in` through L2, sum it over the block,
 * write this block's share of `out`. */
__device__ __forceinline__ void vector_stage(const float *in, float *out, int block, int nblocks)
{
    __shared__ float part[kThreads / 32];
    float s = 0.0f;
    for (int i = threadIdx.x; i < kDim; i += kThreads)
        s += __ldcg(in + i);
    for (int o = 16; o > 0; o >>= 1)
        s += __shfl_xor_sync(0xffffffffu, s, o);
    if ((threadIdx.x & 31) == 0)
        part[threadIdx.x >> 5] = s;
    __syncthreads();
    float t = 0.0f;
    for (int w = 0; w < kThreads / 32; w++)
        t += part[w];
    __syncthreads();
    const int per = (kDim + nblocks - 1) / nblocks;
    for (int i = block * per + (int)threadIdx.x; i < (block + 1) * per && i < kDim; i += kThreads)
        out[i] = __ldcg(in + i) + t * 1e-9f;
}

__global__ void stage_kernel(const float *in, float *out, int work, int pdl)
{
    if (pdl) {
        pdl_trigger();
        pdl_wait();
    }
    if (work)
        vector_stage(in, out, blockIdx.x, gridDim.x);
}

/* The norm -> GEMV pairs. The norm (one block) writes all of `out`, then,
 * with flags, resets the flag of the edge before its own (its consumers, the
 * grid it waited for, are done with it) and sets its own edge's flag: a
 * release by thread 0 after the block barrier, so every thread's stores come
 * before it. */
__global__ void pair_norm_kernel(const float *in, float *out, unsigned *flags, int edge,
                                 int flag_mode)
{
    pdl_trigger();
    pdl_wait();
    vector_stage(in, out, 0, 1);
    if (flag_mode) {
        __syncthreads();
        if (threadIdx.x == 0) {
            if (edge > 0)
                flags[edge - 1] = 0;
            asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + edge), "r"(1u)
                         : "memory");
        }
    }
}

/* The GEMV: every block waits for the norm (its grid, or its edge's flag
 * polled by thread 0 with acquire loads, then a block barrier), then reads
 * the vector and writes its share. */
__global__ void pair_gemv_kernel(const float *in, float *out, const unsigned *flags, int edge,
                                 int flag_mode)
{
    pdl_trigger();
    if (flag_mode) {
        if (threadIdx.x == 0) {
            unsigned seen;
            for (;;) {
                asm volatile("ld.acquire.gpu.global.u32 %0, [%1];"
                             : "=r"(seen)
                             : "l"(flags + edge)
                             : "memory");
                if (seen)
                    break;
                if (flag_mode == 2) /* back off: fewer loads on the flag's line */
                    __nanosleep(100);
            }
        }
        __syncthreads();
    } else {
        pdl_wait();
    }
    vector_stage(in, out, blockIdx.x, gridDim.x);
}

/* Grid-wide barrier: every block adds one to a counter (release) and waits
 * until it reaches the stage's target (acquire). The counter only grows
 * within a launch, so no reset races with late readers. */
__device__ __forceinline__ void grid_barrier(unsigned *counter, unsigned target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        asm volatile("red.release.gpu.global.add.u32 [%0], 1;" ::"l"(counter) : "memory");
        unsigned seen;
        do {
            asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(seen) : "l"(counter) : "memory");
        } while (seen < target);
    }
    __syncthreads();
}

__global__ void persistent_kernel(float *buf0, float *buf1, int stages, int work, unsigned *counter)
{
    for (int s = 0; s < stages; s++) {
        const float *in = (s & 1) ? buf1 : buf0;
        float *out = (s & 1) ? buf0 : buf1;
        if (work)
            vector_stage(in, out, blockIdx.x, gridDim.x);
        grid_barrier(counter, (unsigned)(s + 1) * gridDim.x);
    }
}

/* A launch of `grid` blocks of kThreads on st with one attribute. */
static cudaLaunchConfig_t launch_config(cudaStream_t st, int grid, cudaLaunchAttribute *attr)
{
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3((unsigned)grid);
    cfg.blockDim = dim3(kThreads);
    cfg.stream = st;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    return cfg;
}

static cudaError_t launch_stage(cudaStream_t st, int grid, const float *in, float *out, int work,
                                int pdl)
{
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = pdl;
    const cudaLaunchConfig_t cfg = launch_config(st, grid, &attr);
    return cudaLaunchKernelEx(&cfg, stage_kernel, in, out, work, pdl);
}

/* Cooperative: the launch fails unless every block can be resident at
 * once, which the grid barrier needs. */
static cudaError_t launch_persistent(cudaStream_t st, int grid, float *b0, float *b1, int stages,
                                     int work, unsigned *counter)
{
    cudaError_t e = cudaMemsetAsync(counter, 0, sizeof(unsigned), st);
    if (e != cudaSuccess)
        return e;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeCooperative;
    attr.val.cooperative = 1;
    const cudaLaunchConfig_t cfg = launch_config(st, grid, &attr);
    return cudaLaunchKernelEx(&cfg, persistent_kernel, b0, b1, stages, work, counter);
}

/* Instantiates a captured chain, replays it three times to warm up, then
 * `reps` times between two events; milliseconds per replay. The graph and
 * the stream are destroyed. */
static double replay_ms(cudaStream_t st, cudaGraph_t g, int reps)
{
    cudaGraphExec_t ge;
    CHECK(cudaGraphInstantiate(&ge, g, 0));
    for (int i = 0; i < 3; i++)
        CHECK(cudaGraphLaunch(ge, st));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    CHECK(cudaEventRecord(e0, st));
    for (int i = 0; i < reps; i++)
        CHECK(cudaGraphLaunch(ge, st));
    CHECK(cudaEventRecord(e1, st));
    CHECK(cudaEventSynchronize(e1));
    float ms;
    CHECK(cudaEventElapsedTime(&ms, e0, e1));
    CHECK(cudaGraphExecDestroy(ge));
    CHECK(cudaGraphDestroy(g));
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    CHECK(cudaStreamDestroy(st));
    return ms / reps;
}

/* A chain of `pairs` norm -> GEMV pairs and a last norm, captured and
 * replayed; microseconds per pair. */
static double time_pairs(int flag_mode, int grid, int pairs, float *b0, float *b1,
                         unsigned *flags)
{
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    CHECK(cudaMemsetAsync(flags, 0, (size_t)(pairs + 1) * sizeof(unsigned), st));
    cudaGraph_t g;
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    for (int e = 0; e <= pairs; e++) {
        const cudaLaunchConfig_t one = launch_config(st, 1, &attr);
        CHECK(cudaLaunchKernelEx(&one, pair_norm_kernel, (const float *)b1, b0, flags, e,
                                 flag_mode));
        if (e == pairs)
            break;
        const cudaLaunchConfig_t many = launch_config(st, grid, &attr);
        CHECK(cudaLaunchKernelEx(&many, pair_gemv_kernel, (const float *)b0, b1,
                                 (const unsigned *)flags, e, flag_mode));
    }
    CHECK(cudaStreamEndCapture(st, &g));
    return replay_ms(st, g, 20) * 1000.0 / pairs;
}

/* Capture one chain into a graph, replay it, return microseconds per stage. */
static double time_chain(int mode, int grid, int stages, int work, float *b0, float *b1,
                         unsigned *counter)
{
    cudaStream_t st;
    CHECK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g;
    CHECK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    if (mode == 2) {
        CHECK(launch_persistent(st, grid, b0, b1, stages, work, counter));
    } else {
        for (int s = 0; s < stages; s++)
            CHECK(launch_stage(st, grid, (s & 1) ? b1 : b0, (s & 1) ? b0 : b1, work, mode == 1));
    }
    CHECK(cudaStreamEndCapture(st, &g));
    return replay_ms(st, g, 20) * 1000.0 / stages;
}

int main(int argc, char **argv)
{
    const int stages = argc > 1 ? atoi(argv[1]) : 270;
    if (stages <= 0) {
        fprintf(stderr, "usage: step_sync [stages > 0]\n");
        return 2;
    }
    cudaDeviceProp p;
    CHECK(cudaGetDeviceProperties(&p, 0));
    int per_sm = 0;
    CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel, kThreads, 0));
    printf("device %s, %d SMs, %d persistent blocks of %d threads fit per SM; %d stages\n",
           p.name, p.multiProcessorCount, per_sm, kThreads, stages);
    float *b0, *b1;
    unsigned *counter;
    CHECK(cudaMalloc(&b0, kDim * sizeof(float)));
    CHECK(cudaMalloc(&b1, kDim * sizeof(float)));
    CHECK(cudaMalloc(&counter, sizeof(unsigned)));
    CHECK(cudaMemset(b0, 0, kDim * sizeof(float)));
    CHECK(cudaMemset(b1, 0, kDim * sizeof(float)));
    CHECK(cudaDeviceSynchronize()); /* the chains run on non-blocking streams */
    static const char *names[] = {"kernels", "kernels+PDL", "persistent"};
    printf("%-12s %6s %12s %12s\n", "chain", "blocks", "empty us", "vector us");
    for (int mode = 0; mode < 3; mode++) {
        for (int mult = 1; mult <= 2; mult++) {
            const int grid = p.multiProcessorCount * mult;
            if (mode == 2 && mult > per_sm)
                continue;
            const double e = time_chain(mode, grid, stages, 0, b0, b1, counter);
            const double v = time_chain(mode, grid, stages, 1, b0, b1, counter);
            printf("%-12s %6d %12.3f %12.3f\n", names[mode], grid, e, v);
        }
    }
    const int pairs = stages / 2 > 0 ? stages / 2 : 1;
    unsigned *flags;
    CHECK(cudaMalloc(&flags, (size_t)(pairs + 1) * sizeof(unsigned)));
    printf("\nnorm -> GEMV edge: %d pairs of a one-block stage and a grid, with PDL\n", pairs);
    printf("%6s %22s %22s %24s\n", "blocks", "grid waits: us/pair", "flag polled: us/pair",
           "polled, 100 ns back-off");
    const int grids[] = {p.multiProcessorCount, 2 * p.multiProcessorCount, 864};
    for (int i = 0; i < 3; i++)
        for (int r = 0; r < 2; r++) { /* twice, alternated */
            const double wait = time_pairs(0, grids[i], pairs, b0, b1, flags);
            const double poll = time_pairs(1, grids[i], pairs, b0, b1, flags);
            const double back = time_pairs(2, grids[i], pairs, b0, b1, flags);
            printf("%6d %22.3f %22.3f %24.3f\n", grids[i], wait, poll, back);
        }
    CHECK(cudaFree(flags));
    CHECK(cudaFree(b0));
    CHECK(cudaFree(b1));
    CHECK(cudaFree(counter));
    return 0;
}
