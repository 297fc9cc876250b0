/*
 * engine.c - backend selection, model loading, the CPU fallback, the
 * engine's reports and seeds (the contract is in engine.h; generation is
 * engine_generate.c).
 */
#include "engine.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__linux__)
#include <sys/random.h>
#endif

#include "cpu_backend.h"
#include "kernel_manager.h"
#include "tokenizer.h"
#if defined(BITNET_HAVE_CUDA)
#include "cuda_backend.h"
#endif
#include "engine_internal.h"


/* ---- backend selection ------------------------------------------------------ */

static void device_text(const bn_device_request *r, char *buf, size_t size)
{
    switch (r->kind) {
    case BN_DEVICE_AUTO: snprintf(buf, size, "auto"); break;
    case BN_DEVICE_CPU: snprintf(buf, size, "cpu"); break;
    case BN_DEVICE_GPU: snprintf(buf, size, "gpu"); break;
    case BN_DEVICE_CUDA:
        if (r->index >= 0)
            snprintf(buf, size, "cuda:%d", r->index);
        else
            snprintf(buf, size, "cuda");
        break;
    }
}

static void append_name(char *buf, size_t size, const char *name)
{
    size_t used = strlen(buf);
    if (used < size)
        snprintf(buf + used, size - used, "%s%s", used ? "," : "", name);
}

/* What detection says about CUDA. */
typedef struct cuda_state {
    bool usable;              /* a real CUDA device answered                */
    int device_count;
    bn_status status;         /* why not, as a status (when !usable)        */
    char reason[BN_ERROR_MESSAGE_MAX];
    char hint[BN_ERROR_HINT_MAX];
} cuda_state;

/* Real GPU backends first (fakes never compute, so they are not listed),
 * then the CPU kernel providers this CPU can run, best first. */
static bn_status detect(const bn_config *cfg, char *buf, size_t size, cuda_state *cuda,
                        bn_error *err)
{
    bn_gpu_info *gpu = calloc(1, sizeof *gpu); /* large: keep it off the stack */
    if (!gpu)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for GPU detection");
    bn_status st = bn_gpu_detect(cfg, gpu, err);
    if (st != BN_OK) {
        free(gpu);
        return st;
    }
    buf[0] = '\0';
    memset(cuda, 0, sizeof *cuda);
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++) {
        const bn_gpu_backend_info *bi = &gpu->backends[b];
        if (!bi->available || bi->fake)
            continue;
        append_name(buf, size, bn_gpu_backend_name((bn_gpu_backend)b));
        if (b == BN_GPU_CUDA) {
            cuda->usable = true;
            cuda->device_count = bi->device_count;
        }
    }
    if (!cuda->usable) {
        if (gpu->fake_override) {
            cuda->status = BN_ERR_NO_DEVICE;
            snprintf(cuda->reason, sizeof cuda->reason,
                     "BITNET_GPU_FAKE replaces GPU detection, and fake GPUs never compute");
            snprintf(cuda->hint, sizeof cuda->hint, "unset BITNET_GPU_FAKE to use a real GPU");
        } else {
            cuda->status = gpu->cuda.status != BN_OK ? gpu->cuda.status : BN_ERR_NO_DEVICE;
            snprintf(cuda->reason, sizeof cuda->reason, "%s",
                     gpu->cuda.reason[0] ? gpu->cuda.reason : "no CUDA device found");
            snprintf(cuda->hint, sizeof cuda->hint, "%s", gpu->cuda.hint);
        }
    }
    if (gpu->fake_override)
        bn_log(BN_LOG_INFO, "BITNET_GPU_FAKE is set: fake GPUs are reported by 'bitnet devices' "
                            "but never used to compute");
    free(gpu);

    const bn_kernel_provider *const *list;
    const int n = bn_kernel_providers(&list);
    for (int i = 0; i < n; i++)
        if (!list[i]->runs_on_device && list[i]->is_available())
            append_name(buf, size, list[i]->name);
    return BN_OK;
}

/* Decides the backend before anything heavy is read, so that a request the
 * build or the machine cannot serve fails at once. */
static bn_status select_backend(bn_engine *e, const bn_config *cfg, const char *device,
                                bn_error *err)
{
    bn_device_request req = cfg->device;
    /* Only whether the variable is present, for the receipt and the hint;
     * its value was parsed and validated by bn_config. */
    e->requested_from = getenv("BITNET_DEVICE") ? "BITNET_DEVICE" : "default";
    if (device) {
        if (!bn_parse_device_request(device, &req))
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                "use auto, cpu, gpu, cuda or cuda:N (N a device number)",
                                "unknown device '%s'", device);
        e->requested_from = "flag";
    }
    device_text(&req, e->requested, sizeof e->requested);
    e->strict = cfg->strict_mode;
    e->auto_request = req.kind == BN_DEVICE_AUTO;
    e->cuda_index = -1;

    cuda_state cuda;
    bn_status st = detect(cfg, e->detected, sizeof e->detected, &cuda, err);
    if (st != BN_OK)
        return st;
    const bool from_env = strcmp(e->requested_from, "BITNET_DEVICE") == 0;

    switch (req.kind) {
    case BN_DEVICE_CPU:
        break;
    case BN_DEVICE_AUTO:
        if (!cuda.usable)
            break; /* the CPU is the plan, not a fallback */
#if defined(BITNET_HAVE_CUDA)
        e->want_cuda = true;
#else
        if (e->strict)
            return bn_error_set(err, BN_ERR_NO_DEVICE,
                                "rebuild with the CUDA toolkit, or unset BITNET_STRICT_MODE",
                                "a CUDA GPU is usable but this build has no CUDA support, and "
                                "BITNET_STRICT_MODE=1 forbids computing on the CPU instead");
        snprintf(e->fallback, sizeof e->fallback,
                 "a CUDA GPU is usable but this build has no CUDA support");
        bn_log(BN_LOG_WARN, "%s; computing on the CPU", e->fallback);
#endif
        break;
    case BN_DEVICE_GPU:
    case BN_DEVICE_CUDA:
#if defined(BITNET_HAVE_CUDA)
        if (!cuda.usable) {
            char hint[BN_ERROR_HINT_MAX];
            snprintf(hint, sizeof hint, "%.150s%s%s", cuda.hint, cuda.hint[0] ? "; or " : "",
                     from_env ? "unset BITNET_DEVICE or set it to cpu or auto"
                              : "use --device cpu or auto");
            return bn_error_set(err, cuda.status, hint,
                                "CUDA is not usable (requested %s): %s", e->requested,
                                cuda.reason);
        }
        if (req.kind == BN_DEVICE_CUDA && req.index >= cuda.device_count)
            return bn_error_set(err, BN_ERR_NO_DEVICE, "'bitnet devices' lists the devices",
                                "%s requested, but there %s only %d CUDA device%s",
                                e->requested, cuda.device_count == 1 ? "is" : "are",
                                cuda.device_count, cuda.device_count == 1 ? "" : "s");
        e->want_cuda = true;
        e->cuda_index = req.kind == BN_DEVICE_CUDA ? req.index : -1;
#else
        return bn_error_set(err, BN_ERR_NO_DEVICE,
                            from_env ? "unset BITNET_DEVICE or set it to cpu or auto"
                                     : "rebuild with the CUDA toolkit, or use --device cpu",
                            "this build of bitnet has no CUDA support (requested %s)",
                            e->requested);
#endif
        break;
    }
    snprintf(e->selected, sizeof e->selected, "cpu");
    return BN_OK;
}

/* ---- backends --------------------------------------------------------------- */

static bn_status open_cpu(bn_engine *e, bn_error *err)
{
    bn_status st = bn_cpu_backend_create(e->model, e->n_ctx, e->threads_req, &e->cpu, err);
    if (st != BN_OK)
        return st;
    e->threads = bn_cpu_backend_threads(e->cpu);
    e->n_ctx = bn_cpu_backend_kv_len(e->cpu);
    snprintf(e->selected, sizeof e->selected, "cpu");
    snprintf(e->kernel, sizeof e->kernel, "%s", bn_cpu_backend_kernel_name(e->cpu));
    return BN_OK;
}

#if defined(BITNET_HAVE_CUDA)
/* A CUDA failure where the CPU may take over: allowed under auto without
 * strict mode (the reason is logged and kept for the receipt), an error
 * otherwise (under strict auto, saying that strict mode made it one). */
static bn_status cuda_fallback_allowed(bn_engine *e, const char *what, const bn_error *cerr,
                                       bn_error *err)
{
    /* The model is fine (the CPU runs it); the requested device cannot:
     * a device refusal, not an unsupported input. */
    const bn_status status = cerr->status == BN_ERR_UNSUPPORTED ? BN_ERR_NO_DEVICE : cerr->status;
    if (!e->auto_request) {
        if (err) {
            *err = *cerr;
            err->status = status;
        }
        return status;
    }
    if (e->strict)
        return bn_error_set(err, status,
                            "unset BITNET_STRICT_MODE to let auto fall back to the CPU",
                            "%s and BITNET_STRICT_MODE=1 forbids falling back to the CPU: %.380s",
                            what, cerr->message);
    snprintf(e->fallback, sizeof e->fallback, "%.100s: %.440s", what, cerr->message);
    bn_log(BN_LOG_WARN, "%s; computing on the CPU", e->fallback);
    return BN_OK;
}

static bn_status open_cuda(bn_engine *e, const bn_config *cfg, const bn_engine_options *opt,
                           bn_error *err)
{
    bn_cuda_backend_options o;
    bn_cuda_backend_options_default(&o);
    o.device = e->cuda_index;
    o.kv_len = opt->n_ctx;
    o.memory_limit = cfg->memory_limit_bytes;
    o.kv_type = opt->kv_f16 ? BN_CUDA_KV_F16 : BN_CUDA_KV_F32;
    o.fusion = (bn_cuda_fusion)opt->cuda_fusion;
    o.attn_cluster = opt->cuda_attn_cluster;
    o.gemv_cluster = opt->cuda_gemv_cluster;
    o.head_screen = opt->cuda_head_screen;
    o.attn_qkv = opt->cuda_attn_qkv;
    o.gate_up_pair = opt->cuda_gate_up_pair;
    o.gate_up_cluster = opt->cuda_gate_up_cluster;
    o.threads = e->threads_req;
    bn_status st = bn_cuda_backend_create(e->model, &o, &e->cuda, err);
    if (st != BN_OK)
        return st;
    bn_cuda_backend_fail_at(e->cuda, opt->test_cuda_fail_call);
    e->n_ctx = bn_cuda_backend_kv_len(e->cuda);
    e->threads = 0;
    snprintf(e->selected, sizeof e->selected, "cuda:%d", bn_cuda_backend_device(e->cuda));
    snprintf(e->kernel, sizeof e->kernel, "cuda");
    return BN_OK;
}

/* A CUDA step failed at a point where positions [0, n_positions) of
 * `history` were being computed: when the CPU may take over, build it and
 * recompute those positions there, leaving the logits of the last one in
 * e->logits. */
bn_status engine_cuda_step_failed(bn_engine *e, const bn_error *cerr, const int32_t *history,
                                  int64_t n_positions, bn_error *err)
{
    char what[96];
    snprintf(what, sizeof what, "a CUDA step failed at position %lld",
             (long long)(n_positions - 1));
    bn_status st = cuda_fallback_allowed(e, what, cerr, err);
    if (st != BN_OK)
        return st;
    bn_cuda_backend_kernels(e->cuda, e->cuda_kernels, sizeof e->cuda_kernels);
    bn_cuda_backend_free(e->cuda);
    e->cuda = NULL;
    st = open_cpu(e, err);
    if (st != BN_OK)
        return st;
    return bn_cpu_backend_forward(e->cpu, history, n_positions, 0, BN_LOGITS_LAST, e->logits,
                                  err);
}
#endif

/* ---- open / free ------------------------------------------------------------ */

#if defined(BITNET_HAVE_CUDA)
/* The startup line's name of a cluster choice: "cluster N", or `none`
 * where n is 0. */
static void cluster_or(char *buf, size_t size, int n, const char *none)
{
    if (n > 0)
        snprintf(buf, size, "cluster %d", n);
    else
        snprintf(buf, size, "%s", none);
}
#endif

bn_status bn_engine_open(const bn_config *cfg_in, const bn_engine_options *opt, bn_engine **out,
                         bn_error *err)
{
    *out = NULL;
    if (!opt || (!opt->random_shape && (!opt->model_path || !opt->model_path[0])))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "name a GGUF file or a model directory",
                            "no model given");
    bn_config env_cfg;
    const bn_config *cfg = cfg_in;
    if (!cfg) {
        bn_status st = bn_config_from_env(&env_cfg, err);
        if (st != BN_OK)
            return st;
        cfg = &env_cfg;
    }
    if (opt->n_ctx < 0 || opt->n_threads < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "context and thread counts cannot be negative");

    bn_engine *e = calloc(1, sizeof *e);
    if (!e)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the engine");
    e->host_picks = opt->host_picks;
    e->no_chain = opt->no_chain;
    bn_status st = select_backend(e, cfg, opt->device, err);
    if (st != BN_OK) {
        bn_engine_free(e);
        return st;
    }

    const double t0 = bn_time_seconds();
    if (opt->random_shape) {
        st = bn_checkpoint_create_random(opt->random_shape, opt->random_seed, &e->model, err);
    } else {
        snprintf(e->model_path, sizeof e->model_path, "%s", opt->model_path);
        st = bn_checkpoint_load(opt->model_path, &e->model, err);
    }
    if (st != BN_OK) {
        bn_engine_free(e);
        return st;
    }
    const bn_hparams *hp = bn_checkpoint_hparams(e->model);
    if (opt->n_ctx > hp->n_ctx_train) {
        bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                     "ask for a context of at most the training context",
                     "a context of %lld positions is more than the %d this model was trained for",
                     (long long)opt->n_ctx, (int)hp->n_ctx_train);
        bn_engine_free(e);
        return BN_ERR_INVALID_ARGUMENT;
    }
    e->threads_req = opt->n_threads > 0 ? opt->n_threads : cfg->num_threads;
    e->n_ctx = opt->n_ctx;
#if defined(BITNET_HAVE_CUDA)
    if (e->want_cuda) {
        bn_error cerr;
        bn_error_clear(&cerr);
        st = open_cuda(e, cfg, opt, &cerr);
        if (st != BN_OK)
            st = cuda_fallback_allowed(e, "CUDA initialisation failed", &cerr, err);
        if (st != BN_OK) {
            bn_engine_free(e);
            return st;
        }
    }
    if (!e->cuda)
#endif
        st = open_cpu(e, err);
    if (st != BN_OK) {
        bn_engine_free(e);
        return st;
    }
    e->logits = malloc((size_t)hp->vocab * sizeof(float));
    if (!e->logits) {
        bn_engine_free(e);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for %d logits",
                            (int)hp->vocab);
    }
    e->load_seconds = bn_time_seconds() - t0;
#if defined(BITNET_HAVE_CUDA)
    if (e->cuda) {
        /* The fp16 cache's attention merges its ranges in a second kernel. */
        const bool f16 = bn_cuda_backend_kv_type(e->cuda) == BN_CUDA_KV_F16;
        char merge[32];
        cluster_or(merge, sizeof merge, f16 ? 0 : bn_cuda_backend_attn_cluster(e->cuda),
                   f16 ? "kernel" : "ticket");
        /* Who stages the decode GEMVs' activations. */
        char stage[64];
        cluster_or(stage, sizeof stage, bn_cuda_backend_gemv_cluster(e->cuda), "block");
        const int gu = bn_cuda_backend_gate_up_cluster(e->cuda);
        if (gu != bn_cuda_backend_gemv_cluster(e->cuda)) { /* the gate|up GEMV's own */
            char gu_stage[32];
            cluster_or(gu_stage, sizeof gu_stage, gu, "block");
            const size_t used = strlen(stage);
            snprintf(stage + used, sizeof stage - used, " (gate|up %s)", gu_stage);
        }
        snprintf(e->startup, sizeof e->startup,
                 "requested=%s detected=[%s] selected=%s (%s, %s, kv %s, fusion %s, "
                 "attention merge %s%s, gemv stage %s, greedy head %s)",
                 e->requested, e->detected, e->selected, bn_cuda_backend_device_name(e->cuda),
                 bn_cuda_backend_graphs(e->cuda) ? "graphs" : "no graphs",
                 f16 ? "f16" : "f32",
                 bn_cuda_fusion_name(bn_cuda_backend_fusion(e->cuda)), merge,
                 bn_cuda_backend_attn_qkv(e->cuda) ? " with q|k|v" : "", stage,
                 bn_cuda_backend_head_screen(e->cuda) ? "screened" : "full");
        *out = e;
        return BN_OK;
    }
#endif
    snprintf(e->startup, sizeof e->startup, "requested=%s detected=[%s] selected=%s (%s, %d %s)",
             e->requested, e->detected, e->selected, e->kernel, e->threads,
             e->threads == 1 ? "thread" : "threads");
    *out = e;
    return BN_OK;
}

void bn_engine_free(bn_engine *e)
{
    if (!e)
        return;
    bn_cpu_backend_free(e->cpu);
#if defined(BITNET_HAVE_CUDA)
    bn_cuda_backend_free(e->cuda);
#endif
    bn_checkpoint_free(e->model);
    free(e->logits);
    free(e);
}

const bn_checkpoint *bn_engine_model(const bn_engine *e)
{
    return e->model;
}
const char *bn_engine_startup_line(const bn_engine *e) { return e->startup; }
int64_t bn_engine_n_ctx(const bn_engine *e) { return e->n_ctx; }

int64_t bn_engine_kv_filled(const bn_engine *e)
{
#if defined(BITNET_HAVE_CUDA)
    if (e->cuda)
        return bn_cuda_backend_kv_filled(e->cuda); /* generate leaves no step pending */
#endif
    return e->cpu ? bn_cpu_backend_kv_filled(e->cpu) : 0;
}

struct bn_cuda_backend *bn_engine_cuda(bn_engine *e)
{
#if defined(BITNET_HAVE_CUDA)
    return e->cuda;
#else
    (void)e;
    return NULL;
#endif
}

void bn_engine_get_info(const bn_engine *e, bn_engine_info *info)
{
    memset(info, 0, sizeof *info);
    info->model_path = e->model_path;
    info->requested = e->requested;
    info->requested_from = e->requested_from;
    info->detected = e->detected;
    info->selected = e->selected;
    info->kernel = e->kernel;
    info->fallback = e->fallback;
    info->threads = e->threads;
    info->n_ctx = e->n_ctx;
    info->load_seconds = e->load_seconds;
    info->model_weight_bytes = bn_checkpoint_weight_bytes(e->model);
    info->kv_type = "f32";
    snprintf(info->kernels, sizeof info->kernels, "%s", e->cuda_kernels);
#if defined(BITNET_HAVE_CUDA)
    if (e->cuda) {
        bn_cuda_memory mem;
        bn_cuda_backend_memory(e->cuda, &mem);
        info->gpu = true;
        info->gpu_device = bn_cuda_backend_device(e->cuda);
        info->gpu_name = bn_cuda_backend_device_name(e->cuda);
        info->cuda_graphs = bn_cuda_backend_graphs(e->cuda);
        info->kv_type = bn_cuda_backend_kv_type(e->cuda) == BN_CUDA_KV_F16 ? "f16" : "f32";
        info->gpu_weights_bytes = mem.weights;
        info->gpu_embedding_bytes = mem.embedding;
        info->gpu_lm_head_bytes = mem.lm_head;
        info->gpu_lm_head_screen_bytes = mem.lm_head_screen;
        info->gpu_norms_bytes = mem.norms;
        info->gpu_kv_bytes = mem.kv_cache;
        info->gpu_scratch_bytes = mem.scratch;
        info->gpu_total_bytes = mem.total;
        info->gpu_peak_bytes = mem.peak;
        info->gpu_device_total_bytes = mem.device_total;
        info->gpu_device_free_bytes = mem.device_free;
        bn_cuda_work work;
        bn_cuda_backend_work(e->cuda, &work);
        info->gpu_kernel_launches = work.kernel_launches;
        info->gpu_h2d_transfers = work.h2d_transfers;
        info->gpu_h2d_bytes = work.h2d_bytes;
        info->gpu_d2h_transfers = work.d2h_transfers;
        info->gpu_d2h_bytes = work.d2h_bytes;
        /* What the backend computes with: its weights are everything on
         * the device but the KV cache and the scratch. */
        info->backend_weight_bytes =
            mem.weights + mem.embedding + mem.lm_head + mem.lm_head_screen + mem.norms;
        info->backend_kv_bytes = mem.kv_cache;
        info->backend_scratch_bytes = mem.scratch;
        info->backend_total_bytes = mem.total;
        bn_cuda_backend_kernels(e->cuda, info->kernels, sizeof info->kernels);
        return;
    }
#endif
    bn_cpu_memory mem;
    bn_cpu_backend_memory(e->cpu, &mem);
    info->backend_weight_bytes = mem.weights;
    info->backend_kv_bytes = mem.kv_cache;
    info->backend_scratch_bytes = mem.scratch;
    info->backend_total_bytes = mem.total;
    const size_t used = strlen(info->kernels);
    snprintf(info->kernels + used, sizeof info->kernels - used, "%sw2a8_%s", used ? "," : "",
             e->kernel);
}

/* ---- seeds ------------------------------------------------------------------ */

uint64_t bn_engine_choose_seed(const bn_config *cfg, bool have_seed, uint64_t seed, bool *fixed)
{
    *fixed = true;
    if (have_seed)
        return seed;
    if (cfg && cfg->seed_set)
        return cfg->seed;
    if (cfg && cfg->deterministic)
        return BN_ENGINE_DETERMINISTIC_SEED;
    *fixed = false;
    uint64_t r = 0;
#if defined(__linux__)
    if (getrandom(&r, sizeof r, 0) == (ssize_t)sizeof r)
        return r;
#endif
    /* No entropy source: the clock and the process id still differ per run. */
    r = bn_time_ns() ^ ((uint64_t)getpid() << 32) ^ (uint64_t)time(NULL);
    return r;
}
