/* GPU test: kernels loaded at run time. A hand-written PTX "add one" kernel
 * (no NVRTC needed), the same kernel from CUDA C++ source through NVRTC (when
 * libnvrtc is installed), and from a PTX file; launched on the context's
 * streams with runtime-allocated memory; results checked exactly. Errors:
 * bad PTX (with the JIT log), a missing kernel, a source that does not
 * compile (with the compiler log), a missing file, an impossible launch
 * (the context stays usable). NVRTC compilation is checked first, without a
 * GPU; the rest exits 77 when no GPU is usable. */
#include <cuda_runtime_api.h>
#include <unistd.h>

#include "cuda_context.h"
#include "nvrtc_loader.h"
#include "perf_stats.h"
#include "ptx_loader.h"
#include "test_util.h"

/* data[i] += 1 for i < count. Written by hand for PTX ISA 7.0 / sm_52, so
 * any driver since CUDA 11.0 JIT-compiles it for any newer GPU. */
static const char add_one_ptx[] =
    ".version 7.0\n"
    ".target sm_52\n"
    ".address_size 64\n"
    "\n"
    ".visible .entry add_one(\n"
    "    .param .u64 data,\n"
    "    .param .u32 count\n"
    ")\n"
    "{\n"
    "    .reg .pred  %p<2>;\n"
    "    .reg .b32   %r<6>;\n"
    "    .reg .f32   %f<3>;\n"
    "    .reg .b64   %rd<5>;\n"
    "\n"
    "    ld.param.u64        %rd1, [data];\n"
    "    ld.param.u32        %r1, [count];\n"
    "    mov.u32             %r2, %ctaid.x;\n"
    "    mov.u32             %r3, %ntid.x;\n"
    "    mov.u32             %r4, %tid.x;\n"
    "    mad.lo.s32          %r5, %r2, %r3, %r4;\n"
    "    setp.ge.u32         %p1, %r5, %r1;\n"
    "    @%p1 bra            DONE;\n"
    "    cvta.to.global.u64  %rd2, %rd1;\n"
    "    mul.wide.u32        %rd3, %r5, 4;\n"
    "    add.s64             %rd4, %rd2, %rd3;\n"
    "    ld.global.f32       %f1, [%rd4];\n"
    "    add.rn.f32          %f2, %f1, 0f3F800000;\n"
    "    st.global.f32       [%rd4], %f2;\n"
    "DONE:\n"
    "    ret;\n"
    "}\n";

/* The same kernel as CUDA C++; extern "C" keeps the name unmangled. */
static const char add_one_source[] =
    "extern \"C\" __global__ void add_one(float *data, unsigned count)\n"
    "{\n"
    "    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i < count)\n"
    "        data[i] = __fadd_rn(data[i], 1.0f);\n"
    "}\n";

static bool nvrtc_present;

/* ---- without a GPU: NVRTC to PTX ------------------------------------------------ */

static void check_nvrtc_offline(void)
{
    const bn_nvrtc *api;
    bn_error err;
    nvrtc_present = bn_nvrtc_get(&api, &err) == BN_OK;
    if (!nvrtc_present) {
        printf("NVRTC not installed, its checks are skipped: %s\n", err.message);
        CHECK_STR_CONTAINS(err.message, "libnvrtc");
        CHECK(err.status == BN_ERR_UNSUPPORTED);
        return;
    }
    printf("NVRTC %d.%d (%s)\n", api->major, api->minor, api->library);
    char *ptx = NULL, *log = NULL;
    CHECK(bn_nvrtc_compile(add_one_source, "add_one.cu", 9, 0, NULL, 0, &ptx, &log, &err) ==
          BN_OK);
    CHECK(ptx && strstr(ptx, ".entry add_one") != NULL);
    CHECK(log != NULL);
    free(ptx);
    free(log);

    /* Options pass through (a macro the source needs). */
    const char *opts[] = {"-DSTEP=2.0f"};
    CHECK(bn_nvrtc_compile("extern \"C\" __global__ void k(float *p) { *p += STEP; }", "k.cu", 8,
                           0, opts, 1, &ptx, NULL, &err) == BN_OK);
    CHECK(ptx && strstr(ptx, ".entry k") != NULL);
    free(ptx);

    /* A compile error: BN_ERR_FORMAT with the compiler's log. */
    ptx = (char *)&ptx;
    CHECK(bn_nvrtc_compile("extern \"C\" __global__ void k(float *p) { *p += undefined_name; }",
                           "broken.cu", 9, 0, NULL, 0, &ptx, &log, &err) == BN_ERR_FORMAT);
    CHECK(ptx == NULL);
    CHECK_STR_CONTAINS(err.message, "broken.cu");
    CHECK_STR_CONTAINS(err.message, "undefined_name");
    CHECK(log && strstr(log, "undefined_name") != NULL);
    free(log);

    /* Architecture: the device's own when supported, never a newer one. */
    int arch = 0;
    CHECK(bn_nvrtc_pick_arch(9, 0, &arch, &err) == BN_OK && arch == 90);
    CHECK(bn_nvrtc_pick_arch(8, 0, &arch, &err) == BN_OK && arch == 80);
    CHECK(bn_nvrtc_pick_arch(99, 9, &arch, &err) == BN_OK && arch > 90 && arch <= 999);
    CHECK(bn_nvrtc_pick_arch(1, 0, &arch, &err) == BN_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "1.0");
}

/* ---- on the GPU --------------------------------------------------------------------- */

/* Runs f over n floats of x (on the device, through the context) and checks
 * every result is x + times exactly. */
static void run_add_one(bn_cuda_context *ctx, bn_ptx_module *mod, CUfunction f, unsigned n,
                        int times, cudaStream_t stream, const char *what)
{
    bn_error err;
    float *x = malloc(sizeof(float) * n), *y = malloc(sizeof(float) * n);
    for (unsigned i = 0; i < n; i++)
        x[i] = test_rand_float(-1000.0f, 1000.0f);
    void *d = NULL;
    CHECK(bn_cuda_context_alloc(ctx, sizeof(float) * n, &d, &err) == BN_OK);
    CHECK(bn_cuda_context_upload(ctx, d, x, sizeof(float) * n, &err) == BN_OK);
    const cudaStream_t s = stream ? stream : bn_cuda_context_compute_stream(ctx);
    /* The upload ran on the copy stream; order the kernels after it. */
    CHECK(bn_cuda_context_stream_wait(ctx, s, bn_cuda_context_copy_stream(ctx), &err) == BN_OK);
    void *args[] = {&d, &n};
    bn_ptx_launch_config cfg = {{(n + 127) / 128, 0, 0}, {128, 0, 0}, 0, stream};
    for (int t = 0; t < times; t++) {
        const bn_status st = bn_ptx_launch(mod, f, &cfg, args, &err);
        CHECK_MSG(st == BN_OK, "%s launch: %s", what, err.message);
    }
    CHECK(cudaStreamSynchronize(s) == cudaSuccess);
    CHECK(bn_cuda_context_download(ctx, y, d, sizeof(float) * n, &err) == BN_OK);
    size_t bad = 0;
    for (unsigned i = 0; i < n; i++) {
        float want = x[i];
        for (int t = 0; t < times; t++)
            want += 1.0f;
        if (memcmp(&want, &y[i], sizeof want) != 0 && bad++ < 3)
            fprintf(stderr, "  %s: [%u] %g + %d -> %g\n", what, i, x[i], times, y[i]);
    }
    CHECK_MSG(bad == 0, "%s: %zu of %u wrong", what, bad, n);
    printf("%s: %u elements ok\n", what, n);
    bn_cuda_context_free(ctx, d, sizeof(float) * n);
    free(x);
    free(y);
}

typedef struct timed_launch {
    bn_ptx_module *mod;
    CUfunction f;
    void **args;
    bn_ptx_launch_config cfg;
} timed_launch;

static bn_status launch_on(void *user, cudaStream_t stream, bn_error *err)
{
    timed_launch *t = user;
    t->cfg.stream = stream;
    return bn_ptx_launch(t->mod, t->f, &t->cfg, t->args, err);
}

int main(void)
{
    check_nvrtc_offline();

    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        if (test_failures)
            TEST_EXIT();
        TEST_SKIP("no usable CUDA device (see 'bitnet devices'); NVRTC compilation %s",
                  nvrtc_present ? "passed" : "was not available");
    }
    test_seed_init();

    bn_error err;
    bn_cuda_context *ctx = NULL;
    if (bn_cuda_context_create(0, &ctx, &err) != BN_OK) {
        fprintf(stderr, "FAIL: context: %s (%s)\n", err.message, err.hint);
        return 1;
    }
    const bn_cuda_device *dev = bn_cuda_context_device(ctx);
    printf("device: %s, cc %d.%d\n", dev->name, dev->cc_major, dev->cc_minor);
    bn_perf_stats_reset(bn_cuda_context_stats(ctx));

    /* 1. Hand-written PTX. */
    bn_ptx_module *hand = NULL;
    CUfunction f_hand = NULL;
    bn_status st = bn_ptx_module_load(ctx, add_one_ptx, &hand, &err);
    CHECK_MSG(st == BN_OK, "hand PTX: %s (%s)", err.message, err.hint);
    if (hand) {
        CHECK(bn_ptx_get_function(hand, "add_one", &f_hand, &err) == BN_OK && f_hand);
        printf("JIT info: %s\n", bn_ptx_module_info_log(hand));
        run_add_one(ctx, hand, f_hand, 1000, 1, NULL, "hand-written PTX");
        run_add_one(ctx, hand, f_hand, 1u << 20, 3, bn_cuda_context_copy_stream(ctx),
                    "hand-written PTX x3 on the copy stream");

        /* A missing kernel names itself. */
        CUfunction none = NULL;
        CHECK(bn_ptx_get_function(hand, "add_two", &none, &err) == BN_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(err.message, "add_two");
        CHECK_STR_CONTAINS(err.hint, "extern \"C\"");

        /* An impossible launch (more threads per block than any GPU has)
         * fails with the launch hint, and the module still works after. */
        float *dummy = NULL;
        unsigned n1 = 1;
        void *args[] = {&dummy, &n1};
        bn_ptx_launch_config too_big = {{1, 1, 1}, {4096, 1, 1}, 0, NULL};
        st = bn_ptx_launch(hand, f_hand, &too_big, args, &err);
        CHECK_MSG(st != BN_OK, "a 4096-thread block launched");
        CHECK_STR_CONTAINS(err.hint, "launch parameters");
        CHECK_STR_CONTAINS(err.message, "cuLaunchKernel(grid 1x1x1, block 4096x1x1");
        printf("impossible launch: %s\n", err.message);
        bn_ptx_launch_config zero = {{0, 1, 1}, {32, 1, 1}, 0, NULL};
        CHECK(bn_ptx_launch(hand, f_hand, &zero, args, &err) == BN_ERR_INVALID_ARGUMENT);
        run_add_one(ctx, hand, f_hand, 77, 1, NULL, "hand-written PTX after a failed launch");

        /* Timed through the context: time > 0, counted once more. */
        const unsigned n = 1u << 24;
        void *d = NULL;
        CHECK(bn_cuda_context_alloc(ctx, sizeof(float) * n, &d, &err) == BN_OK);
        CHECK(cudaMemsetAsync(d, 0, sizeof(float) * n, bn_cuda_context_compute_stream(ctx)) ==
              cudaSuccess);
        unsigned nn = n;
        void *targs[] = {&d, &nn};
        timed_launch tl = {hand, f_hand, targs, {{(n + 255) / 256, 1, 1}, {256, 1, 1}, 0, NULL}};
        double ms = 0.0;
        CHECK(bn_cuda_context_time(ctx, NULL, launch_on, &tl, &ms, &err) == BN_OK);
        CHECK_MSG(ms > 0.0, "timed %f ms", ms);
        printf("add_one over %u floats: %.3f ms\n", n, ms);
        bn_cuda_context_free(ctx, d, sizeof(float) * n);
    }

    /* 2. The same from source through NVRTC. */
    if (nvrtc_present) {
        bn_ptx_module *compiled = NULL;
        st = bn_ptx_module_compile(ctx, add_one_source, "add_one.cu", NULL, 0, &compiled, &err);
        CHECK_MSG(st == BN_OK, "NVRTC module: %s (%s)", err.message, err.hint);
        if (compiled) {
            CUfunction f = NULL;
            CHECK(bn_ptx_get_function(compiled, "add_one", &f, &err) == BN_OK);
            run_add_one(ctx, compiled, f, 4099, 2, NULL, "NVRTC-compiled");
            bn_ptx_module_destroy(compiled);
        }
        st = bn_ptx_module_compile(ctx, "extern \"C\" __global__ void k() { syntax error }",
                                   "broken.cu", NULL, 0, &compiled, &err);
        CHECK(st == BN_ERR_FORMAT && compiled == NULL);
        CHECK_STR_CONTAINS(err.message, "broken.cu");
    } else {
        printf("NVRTC not installed: source compilation skipped\n");
    }

    /* 3. From a file. */
    char path[] = "/tmp/bitnet_ptx_XXXXXX";
    const int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd >= 0) {
        CHECK(write(fd, add_one_ptx, sizeof add_one_ptx - 1) == (ssize_t)(sizeof add_one_ptx - 1));
        close(fd);
        bn_ptx_module *from_file = NULL;
        st = bn_ptx_module_load_file(ctx, path, &from_file, &err);
        CHECK_MSG(st == BN_OK, "PTX file: %s", err.message);
        if (from_file) {
            CUfunction f = NULL;
            CHECK(bn_ptx_get_function(from_file, "add_one", &f, &err) == BN_OK);
            run_add_one(ctx, from_file, f, 333, 1, NULL, "PTX file");
            bn_ptx_module_destroy(from_file);
        }
        unlink(path);
        CHECK(bn_ptx_module_load_file(ctx, path, &from_file, &err) == BN_ERR_IO);
        CHECK_STR_CONTAINS(err.message, path);
    }

    /* 4. PTX the JIT rejects: BN_ERR_FORMAT with the JIT log. */
    bn_ptx_module *bad = (bn_ptx_module *)&bad;
    st = bn_ptx_module_load(ctx, "this is not ptx\n", &bad, &err);
    CHECK_MSG(st == BN_ERR_FORMAT, "bad PTX gave %s: %s", bn_status_str(st), err.message);
    CHECK(bad == NULL);
    CHECK_STR_CONTAINS(err.message, "cuModuleLoadDataEx");
    printf("bad PTX: %s\n", err.message);
    /* The JIT log follows the driver's error text: "...(CUDA_ERROR_...): log". */
    const char *after = strstr(err.message, "): ");
    CHECK_MSG(after && after[3] != '\0', "no JIT log in '%s'", err.message);
    /* Well-formed but wrong: an undeclared register. */
    static const char undeclared[] = ".version 7.0\n.target sm_52\n.address_size 64\n"
                                     ".visible .entry k()\n{\n    mov.u32 %r1, 1;\n    ret;\n}\n";
    st = bn_ptx_module_load(ctx, undeclared, &bad, &err);
    CHECK_MSG(st == BN_ERR_FORMAT, "undeclared register gave %s: %s", bn_status_str(st),
              err.message);
    CHECK_STR_CONTAINS(err.message, "%r1");
    printf("undeclared register: %s\n", err.message);
    CHECK(bn_ptx_module_load(ctx, "", &bad, &err) == BN_ERR_FORMAT);
    CHECK(bn_ptx_module_load(ctx, NULL, &bad, &err) == BN_ERR_INVALID_ARGUMENT);

    /* The hand module still works after all those failures. */
    if (hand) {
        run_add_one(ctx, hand, f_hand, 5000, 1, NULL, "hand-written PTX at the end");
        bn_ptx_module_destroy(hand);
    }

    bn_perf_snapshot snap;
    bn_perf_stats_snapshot(bn_cuda_context_stats(ctx), &snap);
    CHECK(snap.kernel_launches >= 10);
    char line[256];
    bn_perf_snapshot_format(&snap, line, sizeof line);
    printf("stats: %s\n", line);
    bn_ptx_module_destroy(NULL);
    bn_cuda_context_destroy(ctx);
    TEST_EXIT();
}
