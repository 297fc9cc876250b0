/*
 * bench_cuda.c - `bitnet bench kernels --device cuda`: the CUDA W2A8
 * kernels the library ships (for M > 1 the one its kernel table picks, or
 * any other with --kernel) against the device's ceilings measured in the
 * same run:
 *   - device-to-device copy bandwidth (bytes read + bytes written);
 *   - cuBLAS BF16 (cublasGemmEx, fp32 accumulation) on the same shape.
 *
 * Weight buffers are rotated over several copies whose total exceeds the
 * L2 cache several times, so every call streams its weights from memory.
 * Launches are captured in a CUDA graph and the graph is replayed, so the
 * per-call time excludes CPU launch overhead (the same for both sides; if
 * cuBLAS refuses capture, both are timed as plain launch loops instead).
 */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "cublas_loader.h"
#include "cuda_layout.h"
#include "read_stream.h"
#include "w2a8_cuda.h"

#define MAX_LIST 16
#define CK(call)                                                                             \
    do {                                                                                     \
        cudaError_t rc_ = (call);                                                            \
        if (rc_ != cudaSuccess) {                                                            \
            fprintf(stderr, "bitnet bench: CUDA error at %s:%d: %s: %s\n", __FILE__,        \
                    __LINE__, #call, cudaGetErrorString(rc_));                               \
            return false;                                                                    \
        }                                                                                    \
    } while (0)

typedef struct cuda_bench_opts {
    int64_t shapes[MAX_LIST][2];
    int n_shapes;
    int64_t ms[MAX_LIST];
    int n_ms;
    double rotate_mib;
    int launches, reps;
    int kernel; /* M > 1: >= 0 this table kernel, -1 the table's pick, -2 all (--kernel) */
    int split;  /* > 0: the GEMV's K split (--split) */
} cuda_bench_opts;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint64_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

/* The programmatic edges of a captured graph (a kernel launched with
 * programmatic dependent launch after another one of the capture): their
 * number; with `strip`, each is replaced by a full dependency, so the
 * downstream kernel starts only once the upstream one has completed. This
 * lets the bench report whether a library (cuBLAS) chains its own calls that
 * way, and time it both ways. -1 if the graph cannot be read or changed. */
static int programmatic_edges(cudaGraph_t g, bool strip)
{
    size_t n = 0;
    if (cudaGraphGetEdges(g, NULL, NULL, NULL, &n) != cudaSuccess)
        return -1;
    if (n == 0)
        return 0;
    cudaGraphNode_t *from = malloc(n * sizeof *from), *to = malloc(n * sizeof *to);
    cudaGraphEdgeData *data = malloc(n * sizeof *data);
    int count = -1;
    if (from && to && data && cudaGraphGetEdges(g, from, to, data, &n) == cudaSuccess) {
        count = 0;
        for (size_t i = 0; i < n && count >= 0; i++) {
            if (data[i].type != cudaGraphDependencyTypeProgrammatic)
                continue;
            count++;
            if (strip && (cudaGraphRemoveDependencies(g, &from[i], &to[i], &data[i], 1) !=
                              cudaSuccess ||
                          cudaGraphAddDependencies(g, &from[i], &to[i], NULL, 1) != cudaSuccess))
                count = -1;
        }
    }
    free(from);
    free(to);
    free(data);
    return count;
}

/* Times `launches` calls of fn (call index i) per replay, best effort as a
 * graph; returns microseconds per call, or < 0 on failure. edges: if not
 * NULL, receives the captured graph's programmatic edges (-1: unknown, or
 * not graphed); strip: replace them by full dependencies before timing. */
typedef bool (*launch_fn)(void *ctx, int i, cudaStream_t s);
static double time_calls_edges(launch_fn fn, void *ctx, cudaStream_t s, int launches, int reps,
                               bool *used_graph, int *edges, bool strip)
{
    cudaGraph_t graph = NULL;
    cudaGraphExec_t exec = NULL;
    bool graph_ok = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal) == cudaSuccess;
    for (int i = 0; graph_ok && i < launches; i++)
        graph_ok = fn(ctx, i, s);
    if (graph_ok)
        graph_ok = cudaStreamEndCapture(s, &graph) == cudaSuccess && graph;
    else {
        cudaStreamEndCapture(s, &graph); /* abandon a broken capture */
    }
    if (edges)
        *edges = graph_ok ? programmatic_edges(graph, strip) : -1;
    if (strip && (!edges || *edges < 0)) { /* cannot be timed as asked */
        if (graph)
            cudaGraphDestroy(graph);
        cudaGetLastError();
        *used_graph = false;
        return -1.0;
    }
    if (graph_ok)
        graph_ok = cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess;
    cudaGetLastError();
    *used_graph = graph_ok;

    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    /* Warm up (module load, clocks), then time. */
    for (int w = 0; w < 2; w++) {
        if (graph_ok)
            cudaGraphLaunch(exec, s);
        else
            for (int i = 0; i < launches; i++)
                fn(ctx, i, s);
    }
    cudaEventRecord(start, s);
    for (int r = 0; r < reps; r++) {
        if (graph_ok)
            cudaGraphLaunch(exec, s);
        else
            for (int i = 0; i < launches; i++)
                fn(ctx, i, s);
    }
    cudaEventRecord(stop, s);
    float ms = -1.0f;
    bool ok = cudaEventSynchronize(stop) == cudaSuccess &&
              cudaEventElapsedTime(&ms, start, stop) == cudaSuccess;
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (exec)
        cudaGraphExecDestroy(exec);
    if (graph)
        cudaGraphDestroy(graph);
    if (!ok || cudaGetLastError() != cudaSuccess)
        return -1.0;
    return (double)ms * 1e3 / ((double)launches * reps);
}

static double time_calls(launch_fn fn, void *ctx, cudaStream_t s, int launches, int reps,
                         bool *used_graph)
{
    return time_calls_edges(fn, ctx, s, launches, reps, used_graph, NULL, false);
}

/* ---- the two sides of a comparison ---------------------------------------- */

typedef struct w2a8_side {
    void **copies;
    int n_copies;
    bn_w2a8_cuda_args args;
    int split;
    int decode;             /* M = 1: the decode step's GEMV (bn_w2a8_cuda_gemv_pdl) */
    int pdl;                /* launched with programmatic dependent launch */
    bn_w2a8_kernel kernel;  /* M > 1: this kernel (bn_w2a8_cuda_gemm_run) */
} w2a8_side;

static bool launch_w2a8(void *p, int i, cudaStream_t s)
{
    w2a8_side *w = p;
    bn_w2a8_cuda_args a = w->args;
    a.weights = w->copies[i % w->n_copies];
    a.pdl = w->pdl;
    cudaError_t rc;
    if (a.m == 1 && w->decode)
        rc = bn_w2a8_cuda_gemv_pdl(&a, w->split, w->pdl, s);
    else if (a.m == 1)
        rc = bn_w2a8_cuda_gemv(&a, w->split, s);
    else
        rc = bn_w2a8_cuda_gemm_run(&a, w->kernel, s);
    return rc == cudaSuccess;
}

typedef struct quant_side {
    const float *x;
    int64_t m, k, ldq;
    int8_t *q;
    float *scale;
    int32_t *sum;
} quant_side;

static bool launch_quant(void *p, int i, cudaStream_t s)
{
    (void)i;
    quant_side *q = p;
    return bn_cuda_quantize_rows(q->x, q->m, q->k, q->k, q->q, q->ldq, q->scale, q->sum, s) ==
           cudaSuccess;
}

typedef struct cublas_side {
    const bn_cublas *api;
    cublasHandle_t handle;
    void **copies;
    int n_copies;
    const void *x;
    void *y;
    int64_t n, k, m;
} cublas_side;

static bool launch_cublas(void *p, int i, cudaStream_t s)
{
    cublas_side *c = p;
    const float one = 1.0f, zero = 0.0f;
    (void)s; /* the handle is bound to the stream */
    /* Row-major W (n x k) is column-major k x n: y (n x m) = W^T-view x. */
    return c->api->gemm_ex(c->handle, CUBLAS_OP_T, CUBLAS_OP_N, (int)c->n, (int)c->m, (int)c->k,
                           &one, c->copies[i % c->n_copies], CUDA_R_16BF, (int)c->k, c->x,
                           CUDA_R_16BF, (int)c->k, &zero, c->y, CUDA_R_16BF, (int)c->n,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) == CUBLAS_STATUS_SUCCESS;
}

typedef struct read_side {
    void **copies;
    int n_copies;
    size_t bytes;
    int blocks, pdl;
    uint32_t *sink;
} read_side;

static bool launch_read(void *p, int i, cudaStream_t s)
{
    read_side *r = p;
    return bn_cuda_read_stream(r->copies[i % r->n_copies], r->bytes, r->blocks, r->pdl, r->sink,
                               s) == cudaSuccess;
}

/* ---- measurements ---------------------------------------------------------- */

static double copy_bandwidth_gbs(cudaStream_t s)
{
    const size_t bytes = (size_t)1 << 30;
    void *a = NULL, *b = NULL;
    if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) {
        cudaFree(a);
        return 0.0;
    }
    cudaMemsetAsync(a, 1, bytes, s);
    cudaEvent_t start, stop;
    cudaEventCreate(&start);
    cudaEventCreate(&stop);
    cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s); /* warm up */
    const int reps = 10;
    cudaEventRecord(start, s);
    for (int r = 0; r < reps; r++)
        cudaMemcpyAsync(r & 1 ? a : b, r & 1 ? b : a, bytes, cudaMemcpyDeviceToDevice, s);
    cudaEventRecord(stop, s);
    float ms = 0.0f;
    cudaEventSynchronize(stop);
    cudaEventElapsedTime(&ms, start, stop);
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    cudaFree(a);
    cudaFree(b);
    return ms > 0 ? 2.0 * (double)bytes * reps / ((double)ms * 1e-3) / 1e9 : 0.0;
}

/* Uploads `copies` copies of host[0..bytes). */
static int upload_copies(const void *host, size_t bytes, int copies, void ***out)
{
    void **list = calloc((size_t)copies, sizeof *list);
    int made = 0;
    for (; list && made < copies; made++) {
        if (cudaMalloc(&list[made], bytes) != cudaSuccess ||
            cudaMemcpy(list[made], host, bytes, cudaMemcpyHostToDevice) != cudaSuccess) {
            cudaFree(list[made]);
            cudaGetLastError();
            break;
        }
    }
    *out = list;
    return made;
}

static void free_copies(void **list, int n)
{
    for (int i = 0; i < n; i++)
        cudaFree(list[i]);
    free(list);
}

static int copies_for(size_t bytes, double rotate_bytes)
{
    int n = (int)(rotate_bytes / (double)bytes) + 1;
    return n < 2 ? 2 : n > 512 ? 512 : n;
}

/* cuBLAS's captured graphs: [0] edges unknown, [1] no programmatic edge,
 * [2] some (reported in the footer). */
static int cublas_graphs[3];

static bool bench_shape(const cuda_bench_opts *o, int64_t n, int64_t k, int sm_count, bool pdl,
                        double copy_gbs, const bn_cublas *api, cublasHandle_t handle,
                        uint32_t *d_floor_sink, cudaStream_t s)
{
    bn_cuda_layout l;
    bn_cuda_layout_init(&l, n, k);
    int8_t *codes = malloc((size_t)(n * k));
    uint8_t *packed = malloc(l.bytes);
    uint16_t *bf16 = malloc((size_t)(n * k) * 2);
    if (!codes || !packed || !bf16) {
        free(codes);
        free(packed);
        free(bf16);
        fprintf(stderr, "bitnet bench: no host memory for %lldx%lld\n", (long long)n,
                (long long)k);
        return false;
    }
    for (int64_t i = 0; i < n * k; i++) {
        codes[i] = (int8_t)(next_rand() % 3) - 1;
        bf16[i] = (uint16_t)(0x3c00 + (next_rand() & 0xff)); /* small positive bf16 values */
    }
    bn_cuda_layout_pack(&l, codes, packed);
    free(codes);

    w2a8_side w = {0};
    cublas_side c = {api, handle, NULL, 0, NULL, NULL, n, k, 0};
    w.n_copies = upload_copies(packed, l.bytes, copies_for(l.bytes, o->rotate_mib * 1048576.0),
                               &w.copies);
    c.n_copies = upload_copies(bf16, (size_t)(n * k) * 2,
                               copies_for((size_t)(n * k) * 2, o->rotate_mib * 1048576.0),
                               &c.copies);
    free(packed);
    free(bf16);
    if (w.n_copies < 1 || c.n_copies < 1) {
        free_copies(w.copies, w.n_copies);
        free_copies(c.copies, c.n_copies);
        printf("| %lldx%lld | - | - | out of GPU memory | | | | | | |\n", (long long)n,
               (long long)k);
        return true;
    }

    for (int mi = 0; mi < o->n_ms; mi++) {
        const int64_t m = o->ms[mi];
        int8_t *d_x = NULL;
        float *d_xf = NULL, *d_scale = NULL, *d_y = NULL;
        int32_t *d_sum = NULL, *d_streamk = NULL;
        void *d_xb = NULL, *d_yb = NULL;
        CK(cudaMalloc((void **)&d_x, (size_t)(m * l.k_padded)));
        CK(cudaMalloc((void **)&d_xf, (size_t)(m * k) * sizeof(float)));
        CK(cudaMalloc((void **)&d_scale, (size_t)m * sizeof(float)));
        CK(cudaMalloc((void **)&d_sum, (size_t)m * sizeof(int32_t)));
        CK(cudaMalloc((void **)&d_y, (size_t)(m * n) * sizeof(float)));
        const size_t streamk_bytes = bn_w2a8_cuda_gemm_streamk_bytes(sm_count);
        CK(cudaMalloc((void **)&d_streamk, streamk_bytes));
        CK(cudaMemset(d_streamk, 0, streamk_bytes));
        CK(cudaMalloc(&d_xb, (size_t)(m * k) * 2));
        CK(cudaMalloc(&d_yb, (size_t)(m * n) * 2));
        CK(cudaMemset(d_xf, 0x3f, (size_t)(m * k) * sizeof(float))); /* ~0.75: real values */
        CK(cudaMemset(d_xb, 0x3f, (size_t)(m * k) * 2));

        /* Quantize once for real inputs, and time it on its own. */
        quant_side q = {d_xf, m, k, l.k_padded, d_x, d_scale, d_sum};
        bool graph_q;
        const double quant_us = time_calls(launch_quant, &q, s, o->launches, o->reps, &graph_q);

        w.args = (bn_w2a8_cuda_args){.n = n,
                                     .tiles = l.tiles,
                                     .groups = l.groups,
                                     .weight_scale = 0.02f,
                                     .x = d_x,
                                     .m = m,
                                     .ldx = l.k_padded,
                                     .act_scale = d_scale,
                                     .act_sum = d_sum,
                                     .y = d_y,
                                     .ldy = n,
                                     .sm_count = sm_count,
                                     .streamk = d_streamk};
        w.split = bn_w2a8_cuda_gemv_split(l.tiles, l.groups, sm_count);
        c.x = d_xb;
        c.y = d_yb;
        c.m = m;
        bool graph_c;
        int c_edges = -1;
        const double c_us = time_calls_edges(launch_cublas, &c, s, o->launches, o->reps, &graph_c,
                                             &c_edges, false);
        cublas_graphs[c_edges > 0 ? 2 : c_edges == 0 ? 1 : 0]++;
        if (c_edges > 0) {
            /* cuBLAS chained its calls by programmatic dependent launch: its
             * time with each call waiting for the one before to complete,
             * as the W2A8 rows without "PDL-chained" run. */
            bool graph_a;
            int edges_a = -1;
            const double a_us = time_calls_edges(launch_cublas, &c, s, o->launches, o->reps,
                                                 &graph_a, &edges_a, true);
            if (a_us > 0)
                printf("| %lldx%lld | %lld | cublas bf16, its %d PDL edges made full "
                       "dependencies | | | | | %.2f | | |\n",
                       (long long)n, (long long)k, (long long)m, c_edges, a_us);
        }

        /* Bytes that must move: packed weights, int8 activations and their
         * scales/sums in, float outputs out. */
        const double bytes =
            (double)l.bytes + (double)(m * l.k_padded) + 8.0 * (double)m + 4.0 * (double)(m * n);
        /* For M = 1 first the floor: a kernel that only reads the packed
         * weights (read_stream.h; the better of one and two blocks per
         * SM), alone and chained like the GEMVs below. */
        if (m == 1 && d_floor_sink) {
            read_side r = {w.copies, w.n_copies, l.bytes, 0, 0, d_floor_sink};
            const bool read_pdl = pdl && bn_cuda_read_stream_pdl_compiled();
            for (int chained = 0; chained <= (read_pdl ? 1 : 0); chained++) {
                double best = -1.0;
                bool graph_r = true;
                r.pdl = chained;
                for (int per_sm = 1; per_sm <= 2; per_sm++) {
                    r.blocks = sm_count * per_sm;
                    bool graphed;
                    const double us =
                        time_calls(launch_read, &r, s, o->launches, o->reps, &graphed);
                    if (us > 0 && (best < 0 || us < best)) {
                        best = us;
                        graph_r = graphed;
                    }
                }
                const char *name = chained ? "read only (floor), PDL-chained" : "read only (floor)";
                if (best > 0) {
                    const double gbs = (double)l.bytes / (best * 1e-6) / 1e9;
                    printf("| %lldx%lld | 1 | %s | %.1f | %.2f | %.0f | %.0f%% | %.2f | - | - |%s\n",
                           (long long)n, (long long)k, name, (double)l.bytes / 1048576.0, best,
                           gbs, 100.0 * gbs / copy_gbs, c_us, graph_r ? "" : " (not graphed)");
                } else {
                    printf("| %lldx%lld | 1 | %s | launch failed | | | | | | |\n", (long long)n,
                           (long long)k, name);
                }
            }
        }
        /* The rows of this M: for M = 1 the GEMV alone, then as the decode
         * step runs it, launched with programmatic dependent launch (in the
         * replayed sequence each call's weight loads start while the
         * previous call finishes; the calls still complete in order), its
         * activations staged per block and, where the device has clusters,
         * per cluster of 8. For M > 1 the table's kernel (or --kernel's),
         * alone and, where it is a wgmma one (its weight copies start
         * before the wait), chained the same way. */
        w2a8_side runs[2 * BN_W2A8_KERNELS + 3];
        int n_runs = 0;
        w.split = o->split > 0 ? o->split : w.split;
        if (m == 1) {
            runs[n_runs++] = w;
            for (int cluster = 0; pdl && cluster <= 8; cluster += 8) {
                if (cluster && !bn_w2a8_cuda_gemv_cluster_usable())
                    break;
                w2a8_side d = w;
                d.decode = d.pdl = 1;
                d.args.cluster = cluster;
                runs[n_runs++] = d;
            }
        } else {
            const bn_w2a8_kernel pick = bn_w2a8_cuda_gemm_pick(
                m, n, l.k_padded, bn_w2a8_cuda_gemm_wgmma_usable(), sm_count, 1);
            for (int kernel = 0; kernel < BN_W2A8_KERNELS; kernel++) {
                if (kernel == BN_W2A8_GEMV ||
                    (o->kernel == -1 ? kernel != (int)pick : o->kernel >= 0 && kernel != o->kernel))
                    continue;
                w2a8_side g = w;
                g.kernel = (bn_w2a8_kernel)kernel;
                runs[n_runs++] = g;
                if (pdl && bn_w2a8_cuda_kernel_wgmma(g.kernel)) {
                    g.pdl = 1;
                    runs[n_runs++] = g;
                }
            }
        }
        for (int r = 0; r < n_runs; r++) {
            w2a8_side *run = &runs[r];
            char kernel[80];
            if (m > 1) {
                char name[48];
                bn_w2a8_cuda_gemm_describe(&run->args, run->kernel, name, sizeof name);
                snprintf(kernel, sizeof kernel, "gemm %s%s", name,
                         run->pdl ? " PDL-chained" : "");
            } else {
                snprintf(kernel, sizeof kernel, "gemv%s%s split %d",
                         run->pdl ? " PDL-chained" : "",
                         run->args.cluster ? " cluster-staged" : "", run->split);
            }
            bool graph_w;
            const double w_us = time_calls(launch_w2a8, run, s, o->launches, o->reps, &graph_w);
            if (w_us > 0) {
                const double gbs = bytes / (w_us * 1e-6) / 1e9;
                printf("| %lldx%lld | %lld | %s | %.1f | %.2f | %.0f | %.0f%% | %.2f | %.2fx | "
                       "%.2f |%s\n",
                       (long long)n, (long long)k, (long long)m, kernel,
                       (double)l.bytes / 1048576.0, w_us, gbs, 100.0 * gbs / copy_gbs, c_us,
                       c_us > 0 ? c_us / w_us : 0.0, quant_us,
                       graph_w && graph_c ? "" : " (not graphed)");
            } else {
                printf("| %lldx%lld | %lld | %s | cannot run here | | | | | | |\n", (long long)n,
                       (long long)k, (long long)m, kernel);
            }
            fflush(stdout);
        }
        cudaFree(d_x);
        cudaFree(d_xf);
        cudaFree(d_scale);
        cudaFree(d_sum);
        cudaFree(d_y);
        cudaFree(d_streamk);
        cudaFree(d_xb);
        cudaFree(d_yb);
    }
    free_copies(w.copies, w.n_copies);
    free_copies(c.copies, c.n_copies);
    return true;
}

static bool parse_int_list(const char *text, int64_t *out, int *count)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", text);
    *count = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t && *count < MAX_LIST;
         t = strtok_r(NULL, ",", &save)) {
        char *end;
        long long v = strtoll(t, &end, 10);
        if (*end || v <= 0 || v > 65536)
            return false;
        out[(*count)++] = v;
    }
    return *count > 0;
}

static bool parse_shape_list(const char *text, cuda_bench_opts *o)
{
    char buf[512];
    snprintf(buf, sizeof buf, "%s", text);
    o->n_shapes = 0;
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t && o->n_shapes < MAX_LIST;
         t = strtok_r(NULL, ",", &save)) {
        long long n, k;
        char tail;
        if (sscanf(t, "%lldx%lld%c", &n, &k, &tail) != 2 || n <= 0 || k <= 0 || n > (1 << 20) ||
            k > (1 << 22))
            return false;
        o->shapes[o->n_shapes][0] = n;
        o->shapes[o->n_shapes][1] = k;
        o->n_shapes++;
    }
    return o->n_shapes > 0;
}

/* --kernel: a GEMM kernel of the table by its name with '-' for spaces
 * ("wgmma-192x64"), or "all"; -2 for all, -3 for no such kernel. */
static int parse_kernel(const char *text)
{
    if (strcmp(text, "all") == 0)
        return -2;
    for (int kernel = 0; kernel < BN_W2A8_KERNELS; kernel++) {
        char name[48];
        snprintf(name, sizeof name, "%s", bn_w2a8_cuda_kernel_name((bn_w2a8_kernel)kernel));
        for (char *c = name; *c; c++)
            if (*c == ' ')
                *c = '-';
        if (kernel != BN_W2A8_GEMV && strcmp(name, text) == 0)
            return kernel;
    }
    return -3;
}

int bench_kernels_cuda(int argc, char **argv, int device);
int bench_kernels_cuda(int argc, char **argv, int device)
{
    cuda_bench_opts o = {.shapes = {{2560, 2560},
                                    {3840, 2560},
                                    {13824, 2560},
                                    {2560, 6912},
                                    {20480, 3200},
                                    {5120, 27648},
                                    {55296, 5120}},
                         .n_shapes = 7,
                         .ms = {1, 16, 512},
                         .n_ms = 3,
                         .rotate_mib = 1024,
                         .launches = 50,
                         .reps = 10,
                         .kernel = -1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool ok = v != NULL;
        if (strcmp(a, "--device") == 0) {
            /* handled by the caller */
        } else if (ok && strcmp(a, "--shapes") == 0) {
            ok = parse_shape_list(v, &o);
        } else if (ok && strcmp(a, "--m") == 0) {
            ok = parse_int_list(v, o.ms, &o.n_ms);
        } else if (ok && strcmp(a, "--kernel") == 0) {
            o.kernel = parse_kernel(v);
            ok = o.kernel != -3;
        } else if (ok && strcmp(a, "--split") == 0) {
            o.split = atoi(v);
            ok = o.split == 1 || o.split == 2 || o.split == 4 || o.split == 8;
        } else if (ok && strcmp(a, "--rotate-mib") == 0) {
            o.rotate_mib = atof(v);
            ok = o.rotate_mib >= 0 && o.rotate_mib <= 65536;
        } else {
            fprintf(stderr, "bitnet bench kernels --device cuda: error: bad option '%s'\n", a);
            return BN_EXIT_USAGE;
        }
        if (!ok) {
            fprintf(stderr, "bitnet bench kernels: error: bad or missing value for %s\n", a);
            return BN_EXIT_USAGE;
        }
        i++;
    }

    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        fprintf(stderr, "bitnet bench: error: no usable CUDA device ('bitnet devices' says why)\n");
        return BN_EXIT_DEVICE;
    }
    if (device >= count) {
        fprintf(stderr, "bitnet bench: error: no device cuda:%d (%d CUDA device%s: cuda:0%s)\n",
                device, count, count == 1 ? "" : "s", count == 1 ? "" : " and up");
        return BN_EXIT_DEVICE;
    }
    struct cudaDeviceProp p;
    if (cudaSetDevice(device) != cudaSuccess ||
        cudaGetDeviceProperties(&p, device) != cudaSuccess) {
        fprintf(stderr, "bitnet bench: error: cannot use cuda:%d: %s\n", device,
                cudaGetErrorString(cudaGetLastError()));
        return BN_EXIT_DEVICE;
    }
    const bn_cublas *api = NULL;
    bn_error err;
    if (bn_cublas_get(&api, &err) != BN_OK)
        return cli_fail(&err);
    cudaStream_t s;
    cublasHandle_t handle;
    void *workspace = NULL;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess ||
        api->create(&handle) != CUBLAS_STATUS_SUCCESS ||
        cudaMalloc(&workspace, 64u << 20) != cudaSuccess ||
        api->set_workspace(handle, workspace, 64u << 20) != CUBLAS_STATUS_SUCCESS ||
        api->set_stream(handle, s) != CUBLAS_STATUS_SUCCESS) {
        fprintf(stderr, "bitnet bench: error: could not set up CUDA stream and cuBLAS\n");
        return BN_EXIT_FAILURE;
    }
    const double copy_gbs = copy_bandwidth_gbs(s);
    uint32_t *floor_sink = NULL; /* without it the floor rows are left out */
    if (cudaMalloc((void **)&floor_sink, BN_READ_STREAM_SINK_WORDS * sizeof(uint32_t)) !=
        cudaSuccess) {
        cudaGetLastError();
        floor_sink = NULL;
    }
    const bool pdl = p.major >= 9 && bn_w2a8_cuda_gemv_pdl_compiled();
    printf("# bitnet bench kernels --device cuda\n\n"
           "device: cuda:%d %s (compute %d.%d, %d SMs, L2 %.0f MiB); cuBLAS: %s\n"
           "device-to-device copy: %.0f GB/s (read + write)\n\n",
           device, p.name, p.major, p.minor, p.multiProcessorCount,
           (double)p.l2CacheSize / 1048576.0, api->library, copy_gbs);
    printf("| N x K | M | kernel | packed MB | W2A8 us | GB/s | %% of copy | cuBLAS BF16 us | "
           "speedup | quantize us |\n|---|---|---|---|---|---|---|---|---|---|\n");
    fflush(stdout);
    int rc = BN_EXIT_OK;
    for (int si = 0; si < o.n_shapes; si++) {
        if (!bench_shape(&o, o.shapes[si][0], o.shapes[si][1], p.multiProcessorCount, pdl,
                         copy_gbs, api, handle, floor_sink, s))
            rc = BN_EXIT_FAILURE;
        fflush(stdout);
    }
    printf("\nW2A8: the GEMV for M = 1, for M > 1 the GEMM its kernel table picks (w2a8_select.c;\n"
           "--kernel NAME or all: that kernel instead); 'PDL-chained': launched with programmatic\n"
           "dependent launch, each call starting while the one before it finishes, as the decode\n"
           "step and the prefill chain their kernels ('cluster-staged': the activations staged\n"
           "once per cluster of 8 blocks, the decode step's default); GB/s counts packed weights\n"
           "+ int8 activations + float outputs once per call; speedup = cuBLAS time / W2A8 time;\n"
           "'quantize' is the activation quantization of the M rows (not included in W2A8 us).\n"
           "'read only (floor)': a kernel that only reads the packed weights, the least time any\n"
           "kernel streaming them once takes (its GB/s over those bytes).\n"
           "'cublas bf16, its N PDL edges made full dependencies': where cuBLAS's own captured "
           "calls\nare chained by programmatic dependent launch, its time with each call "
           "waiting for the one\nbefore to complete (the speedup column uses cuBLAS as "
           "captured).\n"
           "Weights rotated over >= %.0f MiB of copies; times per call from replayed CUDA graphs "
           "of %d calls x %d.\n",
           o.rotate_mib, o.launches, o.reps);
    printf("cuBLAS's captured calls chained by programmatic dependent launch: in %d of %d "
           "timings (not: %d, unknown: %d).\n",
           cublas_graphs[2], cublas_graphs[0] + cublas_graphs[1] + cublas_graphs[2],
           cublas_graphs[1], cublas_graphs[0]);
    api->destroy(handle);
    cudaFree(floor_sink);
    cudaFree(workspace);
    cudaStreamDestroy(s);
    return rc;
}
