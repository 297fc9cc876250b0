/* Mixed-precision matmul on cuBLASLt / cublasGemmEx; see mixed_matmul.h. */
#include "mixed_matmul.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_context.h"

/* Device buffers kept between calls, grown on demand. */
enum {
    BUF_A32,       /* A uploaded from the host            */
    BUF_B32,       /* B uploaded from the host            */
    BUF_C32,       /* C on the device when it is on host  */
    BUF_A16,       /* A converted to fp16 / bf16          */
    BUF_B16,       /* B converted                         */
    BUF_WORKSPACE, /* cuBLASLt's workspace                */
    BUF_COUNT
};

struct bn_mixed_matmul {
    bn_cuda_context *ctx;
    bn_matmul_engine engine;
    struct {
        void *ptr;
        size_t bytes;
    } buf[BUF_COUNT];
    bn_mixed_matmul_metrics metrics;
    bool fallback_logged; /* say once per matmul why cuBLASLt was not used */
};

const char *bn_matmul_engine_name(bn_matmul_engine engine)
{
    static const char *const names[BN_MATMUL_ENGINE_COUNT] = {"auto", "cublaslt", "gemm-ex"};
    return (unsigned)engine < BN_MATMUL_ENGINE_COUNT ? names[engine] : "?";
}

bn_status bn_mixed_matmul_create(bn_cuda_context *ctx, bn_mixed_matmul **out, bn_error *err)
{
    if (!ctx || !out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "mixed matmul: NULL argument");
    bn_mixed_matmul *mm = calloc(1, sizeof *mm);
    if (!mm)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "mixed matmul: out of host memory");
    mm->ctx = ctx;
    mm->engine = BN_MATMUL_ENGINE_AUTO;
    *out = mm;
    return BN_OK;
}

static void release(bn_mixed_matmul *mm, int which)
{
    if (!mm->buf[which].ptr)
        return;
    bn_cuda_context_free(mm->ctx, mm->buf[which].ptr, mm->buf[which].bytes);
    mm->metrics.device_bytes_current -= mm->buf[which].bytes;
    mm->buf[which].ptr = NULL;
    mm->buf[which].bytes = 0;
}

void bn_mixed_matmul_trim(bn_mixed_matmul *mm)
{
    if (!mm)
        return;
    /* Earlier calls ended with their work finished, so nothing on the GPU
     * still reads these buffers. */
    for (int i = 0; i < BUF_COUNT; i++)
        release(mm, i);
}

void bn_mixed_matmul_destroy(bn_mixed_matmul *mm)
{
    if (!mm)
        return;
    bn_mixed_matmul_trim(mm);
    free(mm);
}

void bn_mixed_matmul_set_engine(bn_mixed_matmul *mm, bn_matmul_engine engine)
{
    if (mm && (unsigned)engine < BN_MATMUL_ENGINE_COUNT)
        mm->engine = engine;
}

void bn_mixed_matmul_get_metrics(const bn_mixed_matmul *mm, bn_mixed_matmul_metrics *out)
{
    if (!out)
        return;
    if (!mm) {
        memset(out, 0, sizeof *out);
        return;
    }
    *out = mm->metrics;
}

void bn_mixed_matmul_reset_metrics(bn_mixed_matmul *mm)
{
    if (!mm)
        return;
    const uint64_t held = mm->metrics.device_bytes_current;
    memset(&mm->metrics, 0, sizeof mm->metrics);
    mm->metrics.device_bytes_current = held;
    mm->metrics.device_bytes_peak = held;
}

/* The buffer `which` with at least `bytes`; a smaller one is replaced (its
 * contents are not kept: every call fills what it uses). */
static bn_status ensure(bn_mixed_matmul *mm, int which, size_t bytes, void **out, bn_error *err)
{
    if (mm->buf[which].bytes < bytes) {
        release(mm, which);
        void *p = NULL;
        const bn_status st = bn_cuda_context_alloc(mm->ctx, bytes, &p, err);
        if (st != BN_OK)
            return st;
        mm->buf[which].ptr = p;
        mm->buf[which].bytes = bytes;
        mm->metrics.device_bytes_current += bytes;
        if (mm->metrics.device_bytes_current > mm->metrics.device_bytes_peak)
            mm->metrics.device_bytes_peak = mm->metrics.device_bytes_current;
    }
    *out = mm->buf[which].ptr;
    return BN_OK;
}

/* Whether p is memory the device can read directly. */
static bn_status locate(const bn_mixed_matmul *mm, const void *p, const char *what,
                        bool *on_device, bn_error *err)
{
    struct cudaPointerAttributes attr;
    const cudaError_t rc = cudaPointerGetAttributes(&attr, p);
    if (rc == cudaErrorInvalidValue) {
        /* What runtimes before 11.0 said for memory CUDA never saw. */
        (void)cudaGetLastError();
        *on_device = false;
        return BN_OK;
    }
    bn_status st = bn_cuda_status_of(err, rc, "cudaPointerGetAttributes", __FILE__, __LINE__);
    if (st != BN_OK)
        return st;
    const int device = bn_cuda_context_device_id(mm->ctx);
    switch (attr.type) {
    case cudaMemoryTypeManaged:
        *on_device = true;
        return BN_OK;
    case cudaMemoryTypeDevice:
        if (attr.device != device)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                "pass host memory, or memory of the context's device",
                                "mixed matmul: %s is on CUDA device %d, the context on device %d",
                                what, attr.device, device);
        *on_device = true;
        return BN_OK;
    default: /* pinned or pageable host memory: uploaded like any host memory */
        *on_device = false;
        return BN_OK;
    }
}

static cudaDataType input_type(bn_precision p)
{
    return p == BN_PRECISION_FP16 ? CUDA_R_16F : p == BN_PRECISION_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* The largest power of two (at most 256) dividing the address: cuBLASLt
 * assumes 256-byte alignment unless told, and would pick vectorised
 * kernels that fault on a less aligned user pointer. */
static uint32_t alignment_of(const void *p)
{
    const uintptr_t v = (uintptr_t)p;
    uint32_t a = 256;
    while (a > 1 && v % a != 0)
        a >>= 1;
    return a;
}

/* Operands as cuBLAS sees them. Row-major X (r x c) is, byte for byte,
 * column-major X^T (c x r); so row-major C = A.B is column-major
 * C^T = B^T.A^T, and cuBLAS gets B first: no transposes, no copies. */
typedef struct operands {
    bn_precision precision;
    int m, n, k;
    float alpha, beta;
    const void *a, *b; /* converted (or fp32) inputs on the device */
    float *c;          /* fp32 on the device                       */
    cudaStream_t stream;
} operands;

/* cuBLASLt's workspace: Hopper's fastest kernels want 32 MiB, older GPUs 4. */
static size_t workspace_bytes(const bn_mixed_matmul *mm)
{
    return bn_cuda_context_device(mm->ctx)->cc_major >= 9 ? (size_t)32 << 20 : (size_t)4 << 20;
}

/* The message names the cuBLASLt function, not the table expression. */
#define LT_STATUS(name, call) bn_cublas_status_of(err, (call), name, __FILE__, __LINE__)

/* Fills *fallback when the failure only means "cuBLASLt cannot do this"
 * (library missing, no algorithm), which cublasGemmEx may still do. */
static bn_status gemm_cublaslt(bn_mixed_matmul *mm, const operands *o, bool *fallback,
                               bn_error *err)
{
    *fallback = false;
    const bn_cublaslt *lt = NULL;
    cublasLtHandle_t handle = NULL;
    bn_status st = bn_cuda_context_cublaslt(mm->ctx, &lt, &handle, err);
    if (st != BN_OK) {
        *fallback = st == BN_ERR_UNSUPPORTED;
        return st;
    }
    const size_t ws_bytes = workspace_bytes(mm);
    void *ws = NULL;
    st = ensure(mm, BUF_WORKSPACE, ws_bytes, &ws, err);
    if (st != BN_OK)
        return st;

    const cudaDataType in = input_type(o->precision);
    cublasLtMatmulDesc_t desc = NULL;
    cublasLtMatrixLayout_t la = NULL, lb = NULL, lc = NULL;
    cublasLtMatmulPreference_t pref = NULL;
    const cublasOperation_t no_transpose = CUBLAS_OP_N;
    const uint64_t ws_limit = ws_bytes;
    /* Preference attributes, in the order cuBLASLt names its operands
     * (its A is our B, see operands). */
    const struct {
        cublasLtMatmulPreferenceAttributes_t attr;
        uint32_t bytes;
    } alignments[] = {{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, alignment_of(o->b)},
                      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, alignment_of(o->a)},
                      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, alignment_of(o->c)},
                      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, alignment_of(o->c)}};

    /* CUBLAS_COMPUTE_32F: fp32 accumulation, and for fp32 inputs no TF32
     * (that would be CUBLAS_COMPUTE_32F_FAST_TF32). */
    st = LT_STATUS("cublasLtMatmulDescCreate",
                   lt->matmul_desc_create(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    if (st == BN_OK)
        st = LT_STATUS("cublasLtMatmulDescSetAttribute",
                       lt->matmul_desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                     &no_transpose, sizeof no_transpose));
    if (st == BN_OK)
        st = LT_STATUS("cublasLtMatmulDescSetAttribute",
                       lt->matmul_desc_set_attribute(desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                     &no_transpose, sizeof no_transpose));
    if (st == BN_OK)
        st = LT_STATUS("cublasLtMatrixLayoutCreate",
                       lt->matrix_layout_create(&la, in, (uint64_t)o->n, (uint64_t)o->k, o->n));
    if (st == BN_OK)
        st = LT_STATUS("cublasLtMatrixLayoutCreate",
                       lt->matrix_layout_create(&lb, in, (uint64_t)o->k, (uint64_t)o->m, o->k));
    if (st == BN_OK)
        st = LT_STATUS("cublasLtMatrixLayoutCreate",
                       lt->matrix_layout_create(&lc, CUDA_R_32F, (uint64_t)o->n, (uint64_t)o->m,
                                                o->n));
    if (st == BN_OK)
        st = LT_STATUS("cublasLtMatmulPreferenceCreate", lt->preference_create(&pref));
    if (st == BN_OK)
        st = LT_STATUS("cublasLtMatmulPreferenceSetAttribute",
                       lt->preference_set_attribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws_limit, sizeof ws_limit));
    for (size_t i = 0; i < sizeof alignments / sizeof alignments[0] && st == BN_OK; i++)
        st = LT_STATUS("cublasLtMatmulPreferenceSetAttribute",
                       lt->preference_set_attribute(pref, alignments[i].attr,
                                                    &alignments[i].bytes,
                                                    sizeof alignments[i].bytes));

    cublasLtMatmulHeuristicResult_t choice;
    memset(&choice, 0, sizeof choice);
    if (st == BN_OK) {
        int found = 0;
        const cublasStatus_t s =
            lt->algo_get_heuristic(handle, desc, la, lb, lc, lc, pref, 1, &choice, &found);
        if (s == CUBLAS_STATUS_NOT_SUPPORTED || (s == CUBLAS_STATUS_SUCCESS && found == 0)) {
            *fallback = true;
            st = bn_error_set(err, BN_ERR_UNSUPPORTED,
                              "use engine auto (falls back to cublasGemmEx) or precision fp32",
                              "cuBLASLt has no algorithm for %s %d x %d x %d",
                              bn_precision_name(o->precision), o->m, o->n, o->k);
        } else {
            st = LT_STATUS("cublasLtMatmulAlgoGetHeuristic", s);
        }
    }
    if (st == BN_OK)
        st = LT_STATUS("cublasLtMatmul",
                       lt->matmul(handle, desc, &o->alpha, o->b, la, o->a, lb, &o->beta, o->c, lc,
                                  o->c, lc, &choice.algo, ws, ws_bytes, o->stream));
    if (pref)
        lt->preference_destroy(pref);
    if (lc)
        lt->matrix_layout_destroy(lc);
    if (lb)
        lt->matrix_layout_destroy(lb);
    if (la)
        lt->matrix_layout_destroy(la);
    if (desc)
        lt->matmul_desc_destroy(desc);
    return st;
}

static bn_status gemm_ex(bn_mixed_matmul *mm, const operands *o, bn_error *err)
{
    const bn_cublas *api = NULL;
    cublasHandle_t handle = NULL;
    bn_status st = bn_cuda_context_cublas(mm->ctx, &api, &handle, err);
    if (st != BN_OK)
        return st;
    /* The handle is bound to the compute stream at creation; rebinding costs
     * nothing and keeps this right if a caller moved it. */
    st = bn_cublas_status_of(err, api->set_stream(handle, o->stream), "cublasSetStream",
                             __FILE__, __LINE__);
    if (st != BN_OK)
        return st;
    const cudaDataType in = input_type(o->precision);
    return bn_cublas_status_of(err,
                               api->gemm_ex(handle, CUBLAS_OP_N, CUBLAS_OP_N, o->n, o->m, o->k,
                                            &o->alpha, o->b, in, o->n, o->a, in, o->k, &o->beta,
                                            o->c, CUDA_R_32F, o->n, CUBLAS_COMPUTE_32F,
                                            CUBLAS_GEMM_DEFAULT),
                               "cublasGemmEx", __FILE__, __LINE__);
}

static bn_status gemm(bn_mixed_matmul *mm, const operands *o, bn_matmul_engine *ran,
                      bn_error *err)
{
    if (mm->engine == BN_MATMUL_ENGINE_GEMM_EX) {
        *ran = BN_MATMUL_ENGINE_GEMM_EX;
        return gemm_ex(mm, o, err);
    }
    bool fallback = false;
    bn_error lt_err;
    bn_error_clear(&lt_err);
    bn_status st = gemm_cublaslt(mm, o, &fallback, &lt_err);
    if (st == BN_OK) {
        *ran = BN_MATMUL_ENGINE_CUBLASLT;
        return BN_OK;
    }
    if (mm->engine == BN_MATMUL_ENGINE_CUBLASLT || !fallback) {
        if (err)
            *err = lt_err;
        return st;
    }
    if (!mm->fallback_logged) {
        bn_log(BN_LOG_INFO, "mixed matmul: using cublasGemmEx: %s", lt_err.message);
        mm->fallback_logged = true;
    }
    *ran = BN_MATMUL_ENGINE_GEMM_EX;
    return gemm_ex(mm, o, err);
}

/* Creates what the engine will use - library handles, cuBLASLt's workspace -
 * before the timed region, so that their one-time cost (loading a library,
 * creating a handle, allocating) is not counted as the product's time. What
 * cannot be had is left for gemm() to report or fall back from. */
static bn_status prepare_engine(bn_mixed_matmul *mm, bn_error *err)
{
    const bn_cublas *api = NULL;
    cublasHandle_t handle = NULL;
    if (mm->engine == BN_MATMUL_ENGINE_GEMM_EX)
        return bn_cuda_context_cublas(mm->ctx, &api, &handle, err);
    const bn_cublaslt *lt = NULL;
    cublasLtHandle_t lt_handle = NULL;
    bn_error lt_err;
    if (bn_cuda_context_cublaslt(mm->ctx, &lt, &lt_handle, &lt_err) != BN_OK) {
        if (mm->engine == BN_MATMUL_ENGINE_AUTO && lt_err.status == BN_ERR_UNSUPPORTED)
            return bn_cuda_context_cublas(mm->ctx, &api, &handle, err);
        return BN_OK; /* gemm() reports it */
    }
    void *ws = NULL;
    return ensure(mm, BUF_WORKSPACE, workspace_bytes(mm), &ws, err);
}

static bn_status convert(bn_precision p, const float *src, void *dst, int64_t n,
                         cudaStream_t stream, bn_error *err)
{
    if (p == BN_PRECISION_FP16)
        BN_CUDA_TRY(err, bn_cuda_convert_f32_to_f16(src, dst, n, stream));
    else
        BN_CUDA_TRY(err, bn_cuda_convert_f32_to_bf16(src, dst, n, stream));
    return BN_OK;
}

static double event_ms(cudaEvent_t from, cudaEvent_t to)
{
    float ms = 0.0f;
    if (cudaEventElapsedTime(&ms, from, to) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0.0;
    }
    return ms;
}

bn_status bn_mixed_matmul_run(bn_mixed_matmul *mm, bn_precision precision, int64_t m, int64_t n,
                              int64_t k, float alpha, const float *a, const float *b, float beta,
                              float *c, bn_matmul_run *run, bn_error *err)
{
    if (!mm || !a || !b || !c)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "mixed matmul: NULL argument");
    if (m < 1 || n < 1 || k < 1 || m > INT32_MAX || n > INT32_MAX || k > INT32_MAX)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "each of m, n, k must be 1 ... 2^31-1",
                            "mixed matmul: bad shape m=%lld n=%lld k=%lld", (long long)m,
                            (long long)n, (long long)k);
    /* Each matrix's bytes must fit a size_t (a product of two int32 values
     * times 4 does on 64-bit hosts; this keeps 32-bit hosts honest). */
    const uint64_t max_elems = SIZE_MAX / sizeof(float);
    if ((uint64_t)m > max_elems / (uint64_t)k || (uint64_t)k > max_elems / (uint64_t)n ||
        (uint64_t)m > max_elems / (uint64_t)n)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "mixed matmul: %lld x %lld x %lld does not fit this host's memory",
                            (long long)m, (long long)n, (long long)k);

    bn_cuda_context *ctx = mm->ctx;
    bn_precision chosen;
    bn_status st = bn_precision_select(bn_cuda_context_device(ctx), precision, &chosen, err);
    if (st != BN_OK)
        return st;
    const bool reduced = chosen != BN_PRECISION_FP32;

    const uint64_t t0 = bn_time_ns();
    st = bn_cuda_context_use(ctx, err);
    if (st != BN_OK)
        return st;
    bool a_dev = false, b_dev = false, c_dev = false;
    st = locate(mm, a, "A", &a_dev, err);
    if (st == BN_OK)
        st = locate(mm, b, "B", &b_dev, err);
    if (st == BN_OK)
        st = locate(mm, c, "C", &c_dev, err);
    if (st != BN_OK)
        return st;

    const cudaStream_t compute = bn_cuda_context_compute_stream(ctx);
    const cudaStream_t copy = bn_cuda_context_copy_stream(ctx);
    const size_t a_elems = (size_t)m * (size_t)k, b_elems = (size_t)k * (size_t)n,
                 c_elems = (size_t)m * (size_t)n;
    uint64_t h2d_count = 0, h2d_bytes = 0, d2h_count = 0, d2h_bytes = 0;
    cudaEvent_t ev[3] = {NULL, NULL, NULL};
    bool queued = false; /* something is on the streams that must finish */
    operands o = {chosen, (int)m, (int)n, (int)k, alpha, beta, a, b, c, compute};
    bn_matmul_engine ran = BN_MATMUL_ENGINE_AUTO;

    /* Uploads on the copy stream. */
    void *dev = NULL;
    if (!a_dev) {
        st = ensure(mm, BUF_A32, a_elems * sizeof(float), &dev, err);
        if (st == BN_OK)
            st = bn_cuda_context_upload_async(ctx, dev, a, a_elems * sizeof(float), copy, err);
        queued = true;
        o.a = dev;
        h2d_count++;
        h2d_bytes += a_elems * sizeof(float);
    }
    if (st == BN_OK && !b_dev) {
        st = ensure(mm, BUF_B32, b_elems * sizeof(float), &dev, err);
        if (st == BN_OK)
            st = bn_cuda_context_upload_async(ctx, dev, b, b_elems * sizeof(float), copy, err);
        queued = true;
        o.b = dev;
        h2d_count++;
        h2d_bytes += b_elems * sizeof(float);
    }
    if (st == BN_OK && !c_dev) {
        st = ensure(mm, BUF_C32, c_elems * sizeof(float), &dev, err);
        o.c = dev;
        if (st == BN_OK && beta != 0.0f) {
            st = bn_cuda_context_upload_async(ctx, dev, c, c_elems * sizeof(float), copy, err);
            queued = true;
            h2d_count++;
            h2d_bytes += c_elems * sizeof(float);
        }
    }
    if (st == BN_OK && h2d_count > 0)
        st = bn_cuda_context_stream_wait(ctx, compute, copy, err);

    if (st == BN_OK)
        st = prepare_engine(mm, err);

    /* Conversions and the product on the compute stream, between events. */
    for (int i = 0; i < 3 && st == BN_OK; i++)
        st = bn_cuda_context_event_acquire(ctx, &ev[i], err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(ev[0], compute));
    if (st == BN_OK && reduced) {
        void *a16 = NULL, *b16 = NULL;
        st = ensure(mm, BUF_A16, a_elems * sizeof(uint16_t), &a16, err);
        if (st == BN_OK)
            st = ensure(mm, BUF_B16, b_elems * sizeof(uint16_t), &b16, err);
        if (st == BN_OK) {
            queued = true;
            st = convert(chosen, o.a, a16, (int64_t)a_elems, compute, err);
        }
        if (st == BN_OK)
            st = convert(chosen, o.b, b16, (int64_t)b_elems, compute, err);
        o.a = a16;
        o.b = b16;
    }
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(ev[1], compute));
    if (st == BN_OK) {
        queued = true;
        st = gemm(mm, &o, &ran, err);
    }
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(ev[2], compute));

    /* The result back to the host on the copy stream, after the product. */
    if (st == BN_OK && !c_dev) {
        st = bn_cuda_context_stream_wait(ctx, copy, compute, err);
        if (st == BN_OK)
            st = bn_cuda_context_download_async(ctx, c, o.c, c_elems * sizeof(float), copy, err);
        if (st == BN_OK)
            st = BN_CUDA_STATUS(err, cudaStreamSynchronize(copy));
        d2h_count = 1;
        d2h_bytes = c_elems * sizeof(float);
    }
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventSynchronize(ev[2]));

    double convert_ms = 0.0, gemm_ms = 0.0;
    if (st == BN_OK) {
        convert_ms = event_ms(ev[0], ev[1]);
        gemm_ms = event_ms(ev[1], ev[2]);
    } else if (queued) {
        /* Leave nothing running that reads the caller's memory or the
         * buffers after an error; the error itself is already recorded. */
        if (cudaStreamSynchronize(copy) != cudaSuccess ||
            cudaStreamSynchronize(compute) != cudaSuccess)
            (void)cudaGetLastError();
    }
    for (int i = 0; i < 3; i++)
        if (ev[i])
            bn_cuda_context_event_release(ctx, ev[i]);
    if (st != BN_OK)
        return st;

    /* Statistics: the context's (what the GPU did) and the matmul's own. */
    if (reduced) {
        bn_cuda_context_record_launch(ctx, (uint64_t)(convert_ms * 1e6)); /* A's and B's  */
        bn_cuda_context_record_launch(ctx, 0);                            /* conversions */
    }
    bn_cuda_context_record_launch(ctx, (uint64_t)(gemm_ms * 1e6));

    const double total_ms = (double)(bn_time_ns() - t0) / 1e6;
    bn_mixed_matmul_metrics *mt = &mm->metrics;
    mt->operations++;
    mt->operations_by_precision[chosen]++;
    mt->flops_by_precision[chosen] += 2 * (uint64_t)m * (uint64_t)n * (uint64_t)k;
    mt->compute_ms_by_precision[chosen] += convert_ms + gemm_ms;
    mt->total_ms_by_precision[chosen] += total_ms;
    if (ran == BN_MATMUL_ENGINE_CUBLASLT)
        mt->cublaslt_runs++;
    else
        mt->gemm_ex_runs++;
    mt->h2d_transfers += h2d_count;
    mt->h2d_bytes += h2d_bytes;
    mt->d2h_transfers += d2h_count;
    mt->d2h_bytes += d2h_bytes;
    if (run) {
        run->precision = chosen;
        run->engine = ran;
        run->compute_ms = convert_ms + gemm_ms;
        run->total_ms = total_ms;
    }
    return BN_OK;
}
