/*
 * nccl_collectives.cu - lab: what the collectives of a tensor-parallel
 * decode step cost, on the GPUs of one host, one process.
 *
 * Tensor parallelism over N GPUs splits each layer's products and joins
 * their outputs with collectives. Two designs:
 *
 *   all-reduce: attention heads and FFN columns split; after the output
 *               projection and after the down projection each GPU holds a
 *               partial sum of the whole dim-wide row: an all-reduce (sum)
 *               of `dim` floats, twice a layer;
 *   all-gather: every product's rows split; after each product every GPU
 *               gathers the others' slices of its output (q|k|v, Wo,
 *               gate|up, down): four all-gathers a layer, the rest of the
 *               step (norms, attention) computed whole on every GPU, so
 *               the numbers are the one-GPU step's bit for bit.
 *
 * At batch 1 every collective is latency: a decode step of the 2B-4T shape
 * runs 60 or 120 of them in a chain, so what a chained collective costs
 * decides whether a split step can beat one GPU's ~765 us. This lab times,
 * for the 2B-4T sizes and a 27B-class shape, each collective alone and
 * chained (a CUDA graph of one step's collectives on every GPU, replayed),
 * and checks every result against the sum / concatenation on the CPU.
 *
 * NVLink multicast (NVLS) stays off: NCCL_NVLS_ENABLE=0 is set before the
 * communicators are made (the machines' notes say why).
 *
 *   make -C dev/cuda nccl_collectives NCCL_LIB=<dir of libnccl.so.2>
 *   dev/cuda/nccl_collectives [gpus]      (default: every visible GPU)
 */
#include <nccl.h>

#include "common.cuh"

#define NCCL_CHECK(call)                                                                          \
    do {                                                                                          \
        const ncclResult_t r_ = (call);                                                           \
        if (r_ != ncclSuccess) {                                                                  \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call,                         \
                    ncclGetErrorString(r_));                                                      \
            exit(1);                                                                              \
        }                                                                                         \
    } while (0)

namespace {

enum Kind { ALL_REDUCE, ALL_GATHER };

/* One collective of a step: kind and floats of the whole row (an
 * all-gather's: the gathered row, each GPU sending count / N). */
struct Op {
    Kind kind;
    size_t count;
};

/* A shape's decode step: its layers and the collectives of one layer. */
struct Step {
    const char *name;
    int layers;
    std::vector<Op> per_layer;
};

struct Gpu {
    int dev;
    cudaStream_t stream;
    ncclComm_t comm;
    float *send, *recv;
};

/* Each GPU's input for one collective: value i of GPU g is a small
 * integer, so every sum is exact in float and the check is bit for bit. */
float input_value(int g, size_t i)
{
    return (float)((int)((i * 131 + (size_t)g * 17) % 61) - 30);
}

void launch(std::vector<Gpu> &gpus, const Op &op)
{
    const int n = (int)gpus.size();
    NCCL_CHECK(ncclGroupStart());
    for (Gpu &g : gpus) {
        if (op.kind == ALL_REDUCE)
            NCCL_CHECK(ncclAllReduce(g.send, g.recv, op.count, ncclFloat, ncclSum, g.comm,
                                     g.stream));
        else
            NCCL_CHECK(ncclAllGather(g.send, g.recv, op.count / (size_t)n, ncclFloat, g.comm,
                                     g.stream));
    }
    NCCL_CHECK(ncclGroupEnd());
}

void sync_all(std::vector<Gpu> &gpus)
{
    for (Gpu &g : gpus) {
        CUDA_CHECK(cudaSetDevice(g.dev));
        CUDA_CHECK(cudaStreamSynchronize(g.stream));
    }
}

/* Runs op once on fresh inputs and compares every GPU's result with the
 * CPU's sum or concatenation. */
bool check(std::vector<Gpu> &gpus, const Op &op)
{
    const int n = (int)gpus.size();
    const size_t send = op.kind == ALL_REDUCE ? op.count : op.count / (size_t)n;
    std::vector<float> host(send), want(op.count, 0.0f);
    for (int g = 0; g < n; g++) {
        for (size_t i = 0; i < send; i++) {
            host[i] = input_value(g, i);
            if (op.kind == ALL_REDUCE)
                want[i] += host[i];
            else
                want[(size_t)g * send + i] = host[i];
        }
        CUDA_CHECK(cudaSetDevice(gpus[g].dev));
        CUDA_CHECK(cudaMemcpy(gpus[g].send, host.data(), send * sizeof(float),
                              cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemset(gpus[g].recv, 0xff, op.count * sizeof(float))); /* NaN */
    }
    launch(gpus, op);
    sync_all(gpus);
    bool ok = true;
    std::vector<float> got(op.count);
    for (int g = 0; g < n && ok; g++) {
        CUDA_CHECK(cudaSetDevice(gpus[g].dev));
        CUDA_CHECK(cudaMemcpy(got.data(), gpus[g].recv, op.count * sizeof(float),
                              cudaMemcpyDeviceToHost));
        ok = memcmp(got.data(), want.data(), op.count * sizeof(float)) == 0;
    }
    printf("check %-10s %7zu floats on %d GPU%s: %s\n",
           op.kind == ALL_REDUCE ? "all-reduce" : "all-gather", op.count, n, n > 1 ? "s" : "",
           ok ? "ok" : "FAIL");
    return ok;
}

/* Microseconds a collective of ops takes, the ops replayed `reps` times
 * as one CUDA graph a GPU (captured together, as NCCL requires). */
double time_chain(std::vector<Gpu> &gpus, const std::vector<Op> &ops, int reps)
{
    std::vector<cudaGraph_t> graphs(gpus.size());
    std::vector<cudaGraphExec_t> execs(gpus.size());
    for (Gpu &g : gpus) {
        CUDA_CHECK(cudaSetDevice(g.dev));
        CUDA_CHECK(cudaStreamBeginCapture(g.stream, cudaStreamCaptureModeRelaxed));
    }
    for (const Op &op : ops)
        launch(gpus, op);
    for (size_t i = 0; i < gpus.size(); i++) {
        CUDA_CHECK(cudaSetDevice(gpus[i].dev));
        CUDA_CHECK(cudaStreamEndCapture(gpus[i].stream, &graphs[i]));
        CUDA_CHECK(cudaGraphInstantiate(&execs[i], graphs[i], 0));
    }
    auto replay = [&](int times) {
        for (int r = 0; r < times; r++)
            for (size_t i = 0; i < gpus.size(); i++) {
                CUDA_CHECK(cudaSetDevice(gpus[i].dev));
                CUDA_CHECK(cudaGraphLaunch(execs[i], gpus[i].stream));
            }
        sync_all(gpus);
    };
    replay(2); /* warm */
    double best = 1e30;
    for (int round = 0; round < 3; round++) {
        cudaEvent_t e0, e1;
        CUDA_CHECK(cudaSetDevice(gpus[0].dev));
        CUDA_CHECK(cudaEventCreate(&e0));
        CUDA_CHECK(cudaEventCreate(&e1));
        CUDA_CHECK(cudaEventRecord(e0, gpus[0].stream));
        for (int r = 0; r < reps; r++)
            for (size_t i = 0; i < gpus.size(); i++) {
                CUDA_CHECK(cudaSetDevice(gpus[i].dev));
                CUDA_CHECK(cudaGraphLaunch(execs[i], gpus[i].stream));
            }
        CUDA_CHECK(cudaSetDevice(gpus[0].dev));
        CUDA_CHECK(cudaEventRecord(e1, gpus[0].stream));
        sync_all(gpus);
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
        const double us = (double)ms * 1e3 / (double)reps;
        best = us < best ? us : best;
        CUDA_CHECK(cudaEventDestroy(e0));
        CUDA_CHECK(cudaEventDestroy(e1));
    }
    for (size_t i = 0; i < gpus.size(); i++) {
        CUDA_CHECK(cudaSetDevice(gpus[i].dev));
        CUDA_CHECK(cudaGraphExecDestroy(execs[i]));
        CUDA_CHECK(cudaGraphDestroy(graphs[i]));
    }
    return best;
}

} // namespace

int main(int argc, char **argv)
{
    setenv("NCCL_NVLS_ENABLE", "0", 1); /* no NVLink multicast, ever */
    int visible = 0;
    CUDA_CHECK(cudaGetDeviceCount(&visible));
    const int n = argc > 1 ? atoi(argv[1]) : visible;
    if (n < 1 || n > visible || (n & (n - 1)) != 0 || n > 8) {
        fprintf(stderr, "usage: %s [gpus]: 1, 2, 4 or 8, at most the %d visible\n", argv[0],
                visible);
        return 2;
    }
    /* The 2B-4T shape (dim 2560, q|k|v 3840, gate|up 13824, vocab 128256)
     * and a 27B-class one (dim 5120, q|k|v 7168, gate|up 55296, vocab
     * 152064), each count a multiple of 8 GPUs. */
    const Step steps[] = {
        {"2B-4T all-reduce", 30, {{ALL_REDUCE, 2560}, {ALL_REDUCE, 2560}}},
        {"2B-4T all-gather", 30,
         {{ALL_GATHER, 3840}, {ALL_GATHER, 2560}, {ALL_GATHER, 13824}, {ALL_GATHER, 2560}}},
        {"27B all-reduce", 64, {{ALL_REDUCE, 5120}, {ALL_REDUCE, 5120}}},
        {"27B all-gather", 64,
         {{ALL_GATHER, 7168}, {ALL_GATHER, 5120}, {ALL_GATHER, 55296}, {ALL_GATHER, 5120}}},
    };
    size_t most = 152064;
    std::vector<Gpu> gpus((size_t)n);
    std::vector<int> devs((size_t)n);
    for (int g = 0; g < n; g++)
        devs[(size_t)g] = g;
    std::vector<ncclComm_t> comms((size_t)n);
    NCCL_CHECK(ncclCommInitAll(comms.data(), n, devs.data()));
    for (int g = 0; g < n; g++) {
        Gpu &x = gpus[(size_t)g];
        x.dev = g;
        x.comm = comms[(size_t)g];
        CUDA_CHECK(cudaSetDevice(g));
        CUDA_CHECK(cudaStreamCreateWithFlags(&x.stream, cudaStreamNonBlocking));
        CUDA_CHECK(cudaMalloc((void **)&x.send, most * sizeof(float)));
        CUDA_CHECK(cudaMalloc((void **)&x.recv, most * sizeof(float)));
    }
    int version = 0;
    NCCL_CHECK(ncclGetVersion(&version));
    printf("NCCL %d, %d GPU%s, NCCL_NVLS_ENABLE=%s\n", version, n, n > 1 ? "s" : "",
           getenv("NCCL_NVLS_ENABLE"));
    for (int g = 0; g < n; g++)
        for (int h = 0; h < n; h++) {
            int can = 0;
            if (g != h && cudaDeviceCanAccessPeer(&can, g, h) == cudaSuccess)
                printf("peer access %d -> %d: %s\n", g, h, can ? "yes" : "no");
        }

    bool ok = true;
    for (const Step &s : steps)
        for (const Op &op : s.per_layer)
            ok &= check(gpus, op);
    ok &= check(gpus, {ALL_GATHER, 128256});
    ok &= check(gpus, {ALL_GATHER, 152064});
    if (!ok) {
        printf("FAILED\n");
        return 1;
    }

    /* Alone: one collective a replay; chained: one step's collectives. */
    for (const Step &s : steps) {
        for (const Op &op : s.per_layer)
            printf("time %-18s %-10s %7zu floats alone: %7.2f us\n", s.name,
                   op.kind == ALL_REDUCE ? "all-reduce" : "all-gather", op.count,
                   time_chain(gpus, {op}, 200));
        std::vector<Op> chain;
        for (int l = 0; l < s.layers; l++)
            chain.insert(chain.end(), s.per_layer.begin(), s.per_layer.end());
        const double us = time_chain(gpus, chain, 20);
        printf("time %-18s a step's %zu collectives chained: %8.1f us (%.2f us each)\n", s.name,
               chain.size(), us, us / (double)chain.size());
    }
    for (Gpu &g : gpus) {
        CUDA_CHECK(cudaSetDevice(g.dev));
        NCCL_CHECK(ncclCommDestroy(g.comm));
        CUDA_CHECK(cudaFree(g.send));
        CUDA_CHECK(cudaFree(g.recv));
        CUDA_CHECK(cudaStreamDestroy(g.stream));
    }
    return 0;
}
