/*
 * engine.c - backend selection, model loading, the CPU fallback, the
 * engine's reports and seeds (the contract is in engine.h; generation is
 * engine_generate.c).
 */
#include "engine.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine_internal.h"
#include "kernel_manager.h"


/* ---- backend selection ------------------------------------------------------ */

static void device_text(const bn_device_request *r, char *buf, size_t size)
{
    switch (r->kind) {
    case BN_DEVICE_AUTO: snprintf(buf, size, "auto"); break;
    case BN_DEVICE_CPU: snprintf(buf, size, "cpu"); break;
    case BN_DEVICE_GPU: snprintf(buf, size, "gpu"); break;
    case BN_DEVICE_CUDA:
    case BN_DEVICE_VULKAN: {
        const char *name = r->kind == BN_DEVICE_CUDA ? "cuda" : "vulkan";
        if (r->count < 0) {
            snprintf(buf, size, "%s:all", name);
        } else if (r->count >= 2) {
            snprintf(buf, size, "%s:", name);
            for (int i = 0; i < r->count; i++) {
                const size_t used = strlen(buf);
                if (used < size)
                    snprintf(buf + used, size - used, "%s%d", i ? "," : "", r->list[i]);
            }
        } else if (r->index >= 0) {
            snprintf(buf, size, "%s:%d", name, r->index);
        } else {
            snprintf(buf, size, "%s", name);
        }
        break;
    }
    }
}

static void append_name(char *buf, size_t size, const char *name)
{
    size_t used = strlen(buf);
    if (used < size)
        snprintf(buf + used, size - used, "%s%s", used ? "," : "", name);
}

/* The GPU family a device request names: CUDA for "cuda[:N]", Vulkan for
 * "vulkan[:N]", and for "gpu" and "auto" the first registered GPU backend
 * (the registry's order). */
static int requested_gpu_kind(const bn_device_request *r)
{
    if (r->kind == BN_DEVICE_CUDA)
        return BN_GPU_CUDA;
    if (r->kind == BN_DEVICE_VULKAN)
        return BN_GPU_VULKAN;
    const bn_backend_entry *list;
    const int n = bn_backend_registry(&list);
    for (int i = 0; i < n; i++)
        if (list[i].gpu_kind >= 0)
            return list[i].gpu_kind;
    return BN_GPU_CUDA; /* a build without GPU backends: CUDA is what it lacks */
}

/* How a GPU family is named in messages. */
static const char *gpu_title(int kind)
{
    static const char *const titles[BN_GPU_BACKEND_COUNT] = {"CUDA", "ROCm", "Metal", "Vulkan",
                                                             "OpenCL"};
    return kind >= 0 && kind < BN_GPU_BACKEND_COUNT ? titles[kind] : "GPU";
}

/* What detection says about one GPU family. */
typedef struct gpu_state {
    bool usable;              /* a real device of this family answered      */
    int device_count;
    bn_status status;         /* why not, as a status (when !usable)        */
    char reason[BN_ERROR_MESSAGE_MAX];
    char hint[BN_ERROR_HINT_MAX];
} gpu_state;

/* Real GPU backends first (fakes never compute, so they are not listed),
 * then the CPU kernel providers this CPU can run, best first; states[kind]:
 * what detection says about each GPU family. */
static bn_status detect(const bn_config *cfg, char *buf, size_t size,
                        gpu_state states[BN_GPU_BACKEND_COUNT], bn_error *err)
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
    memset(states, 0, sizeof(gpu_state) * BN_GPU_BACKEND_COUNT);
    for (int b = 0; b < BN_GPU_BACKEND_COUNT; b++) {
        const bn_gpu_backend_info *bi = &gpu->backends[b];
        if (!bi->available || bi->fake)
            continue;
        append_name(buf, size, bn_gpu_backend_name((bn_gpu_backend)b));
        states[b].usable = true;
        states[b].device_count = bi->device_count;
    }
    for (int kind = 0; kind < BN_GPU_BACKEND_COUNT; kind++) {
        gpu_state *state = &states[kind];
        if (state->usable)
            continue;
        if (gpu->fake_override) {
            state->status = BN_ERR_NO_DEVICE;
            snprintf(state->reason, sizeof state->reason,
                     "BITNET_GPU_FAKE replaces GPU detection, and fake GPUs never compute");
            snprintf(state->hint, sizeof state->hint, "unset BITNET_GPU_FAKE to use a real GPU");
        } else {
            /* CUDA's query says why in detail; other families by their
             * detection's text. */
            const bool cuda = kind == BN_GPU_CUDA;
            const char *reason = cuda ? gpu->cuda.reason : gpu->backends[kind].detail;
            state->status = cuda && gpu->cuda.status != BN_OK ? gpu->cuda.status
                                                              : BN_ERR_NO_DEVICE;
            if (reason[0])
                snprintf(state->reason, sizeof state->reason, "%s", reason);
            else
                snprintf(state->reason, sizeof state->reason, "no %s device found",
                         gpu_title(kind));
            snprintf(state->hint, sizeof state->hint, "%s", cuda ? gpu->cuda.hint : "");
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

/* Under auto, when the first GPU family (the registry's first, `first`)
 * is not taken: the next registered family that detection found and whose
 * backend names a device worth taking (auto_device), else the CPU. */
static bn_status auto_other_gpu(bn_engine *e, const gpu_state *states, int first)
{
    const bn_backend_entry *list;
    const int n = bn_backend_registry(&list);
    for (int i = 0; i < n; i++) {
        const int kind = list[i].gpu_kind;
        if (kind < 0 || kind == first || !list[i].ops->auto_device || !states[kind].usable)
            continue;
        const int device = list[i].ops->auto_device();
        if (device >= 0) {
            e->gpu_entry = &list[i];
            e->gpu_index = device;
            return BN_OK;
        }
    }
    return BN_OK;
}

/* The CUDA devices a request names, each below the count detection found:
 * cuda:N one, cuda:N,M,... those (a replica each), cuda:all every device
 * (at most BN_DEVICE_LIST_MAX). */
static bn_status take_device_list(bn_engine *e, const bn_device_request *req, int found,
                                  bn_error *err)
{
    int n = req->count;
    if (n < 0) {
        n = found < BN_DEVICE_LIST_MAX ? found : BN_DEVICE_LIST_MAX;
        for (int i = 0; i < n; i++)
            e->devices[i] = i;
    } else if (n >= 2) {
        memcpy(e->devices, req->list, (size_t)n * sizeof req->list[0]);
    } else {
        n = req->index >= 0 ? 1 : 0;
        e->devices[0] = req->index;
    }
    for (int i = 0; i < n; i++)
        if (e->devices[i] >= found)
            return bn_error_set(err, BN_ERR_NO_DEVICE, "'bitnet devices' lists the devices",
                                "%s requested, but there %s only %d CUDA device%s",
                                e->requested, found == 1 ? "is" : "are", found,
                                found == 1 ? "" : "s");
    e->n_devices = n;
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
                                "use auto, cpu, gpu, cuda, cuda:N, cuda:N,M,..., cuda:all, "
                                "vulkan or vulkan:N (N a device number)",
                                "unknown device '%s'", device);
        e->requested_from = "flag";
    }
    device_text(&req, e->requested, sizeof e->requested);
    e->strict = cfg->strict_mode;
    e->auto_request = req.kind == BN_DEVICE_AUTO;
    e->gpu_index = -1;

    const int kind = requested_gpu_kind(&req);
    const bn_backend_entry *entry = bn_backend_for_gpu(kind); /* NULL: not in this build */
    const char *title = gpu_title(kind);
    gpu_state states[BN_GPU_BACKEND_COUNT];
    bn_status st = detect(cfg, e->detected, sizeof e->detected, states, err);
    if (st != BN_OK)
        return st;
    const gpu_state gpu = states[kind];
    const bool from_env = strcmp(e->requested_from, "BITNET_DEVICE") == 0;

    switch (req.kind) {
    case BN_DEVICE_CPU:
        break;
    case BN_DEVICE_AUTO:
        if (!gpu.usable)
            return auto_other_gpu(e, states, kind); /* else the CPU: the plan, not a fallback */
        if (entry) {
            const int index = entry->ops->auto_device ? entry->ops->auto_device() : -1;
            if (entry->ops->auto_device && index < 0)
                return auto_other_gpu(e, states, kind);
            e->gpu_entry = entry;
            e->gpu_index = index;
            break;
        }
        if (e->strict)
            return bn_error_set(err, BN_ERR_NO_DEVICE,
                                "rebuild with the CUDA toolkit, or unset BITNET_STRICT_MODE",
                                "a %s GPU is usable but this build has no %s support, and "
                                "BITNET_STRICT_MODE=1 forbids computing on the CPU instead",
                                title, title);
        snprintf(e->fallback, sizeof e->fallback,
                 "a %s GPU is usable but this build has no %s support", title, title);
        bn_log(BN_LOG_WARN, "%s; computing on the CPU", e->fallback);
        break;
    case BN_DEVICE_GPU:
    case BN_DEVICE_CUDA:
    case BN_DEVICE_VULKAN:
        if (!entry)
            return bn_error_set(err, BN_ERR_NO_DEVICE,
                                from_env ? "unset BITNET_DEVICE or set it to cpu or auto"
                                : kind == BN_GPU_VULKAN
                                    ? "rebuild with the Vulkan headers and glslc "
                                      "(scripts/install-deps.sh), or use --device cpu"
                                    : "rebuild with the CUDA toolkit, or use --device cpu",
                                "this build of bitnet has no %s support (requested %s)", title,
                                e->requested);
        /* A Vulkan request may name a device detection does not count as a
         * GPU (lavapipe computes on the CPU): the backend opens the device
         * and says why when it cannot. */
        if (req.kind == BN_DEVICE_VULKAN) {
            e->gpu_entry = entry;
            e->gpu_index = req.index;
            break;
        }
        if (!gpu.usable) {
            char hint[BN_ERROR_HINT_MAX];
            snprintf(hint, sizeof hint, "%.150s%s%s", gpu.hint, gpu.hint[0] ? "; or " : "",
                     from_env ? "unset BITNET_DEVICE or set it to cpu or auto"
                              : "use --device cpu or auto");
            return bn_error_set(err, gpu.status, hint, "%s is not usable (requested %s): %s",
                                title, e->requested, gpu.reason);
        }
        e->gpu_count = kind == BN_GPU_CUDA ? gpu.device_count : 0;
        if (req.kind == BN_DEVICE_CUDA) {
            st = take_device_list(e, &req, gpu.device_count, err);
            if (st != BN_OK)
                return st;
        }
        e->gpu_entry = entry;
        e->gpu_index = req.kind == BN_DEVICE_CUDA ? req.index : -1;
        break;
    }
    return BN_OK;
}

/* Tensor parallelism over the GPUs the request names: exactly n of them
 * (cuda:N,M,...), or the first n CUDA devices (cuda, gpu, auto). */
static bn_status plan_tensor_parallel(bn_engine *e, int n, bn_error *err)
{
    if (n <= 1)
        return BN_OK;
    if (n > BN_DEVICE_LIST_MAX)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "tensor parallelism takes 2 to %d GPUs, not %d", BN_DEVICE_LIST_MAX,
                            n);
    if (!bn_backend_tensor_parallel_ops())
        return bn_error_set(err, BN_ERR_NO_DEVICE, "rebuild with the CUDA toolkit",
                            "tensor parallelism needs CUDA, which this build of bitnet lacks");
    if (!e->gpu_entry || e->gpu_entry->gpu_kind != BN_GPU_CUDA)
        return bn_error_set(err, BN_ERR_NO_DEVICE,
                            "use --device cuda or name the GPUs: --device cuda:0,1",
                            "tensor parallelism over %d GPUs needs CUDA devices (requested %s, "
                            "which gives %s)",
                            n, e->requested, e->gpu_entry ? "no CUDA device" : "the CPU");
    if (e->n_devices >= 2 && e->n_devices != n)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "name as many GPUs as --tensor-parallel asks for",
                            "%s names %d GPUs, but tensor parallelism over %d was asked for",
                            e->requested, e->n_devices, n);
    if (e->n_devices == 1 && e->gpu_index >= 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "name the GPUs (--device cuda:0,1) or use --device cuda",
                            "%s names one GPU; tensor parallelism over %d needs %d", e->requested,
                            n, n);
    if (e->n_devices < 2) {
        if (e->gpu_count < n)
            return bn_error_set(err, BN_ERR_NO_DEVICE, "'bitnet devices' lists the devices",
                                "tensor parallelism over %d GPUs asked for, but there %s only "
                                "%d CUDA device%s",
                                n, e->gpu_count == 1 ? "is" : "are", e->gpu_count,
                                e->gpu_count == 1 ? "" : "s");
        for (int i = 0; i < n; i++)
            e->devices[i] = i;
    }
    e->tensor_parallel = n;
    e->n_devices = 0; /* one backend over all of them: no replicas */
    return BN_OK;
}

/* ---- backends --------------------------------------------------------------- */

/* The block table of the paged cache, where the backend batches. */
static bn_status open_batching(bn_engine *e, bn_error *err)
{
    if (e->kv || e->params.paged_rows <= 0 || !e->backend->ops->forward_rows)
        return BN_OK;
    bn_backend_desc d;
    memset(&d, 0, sizeof d);
    e->backend->ops->describe(e->backend, &d);
    if (!d.batches) /* e.g. an fp16 cache: the requests run one at a time */
        return BN_OK;
    e->kv_cfg.n_blocks = (int32_t)(e->params.paged_rows / e->kv_cfg.block_size);
    return bn_kv_blocks_create(&e->kv_cfg, &e->kv, err);
}

/* Builds the backend of `ops` and takes its names for the reports. */
static bn_status open_backend(bn_engine *e, const bn_backend_ops *ops, bn_error *err)
{
    bn_status st = ops->create(e->model, &e->params, &e->backend, err);
    if (st == BN_OK)
        st = open_batching(e, err);
    if (st != BN_OK)
        return st;
    bn_backend_desc d;
    memset(&d, 0, sizeof d);
    ops->describe(e->backend, &d);
    e->threads = d.threads;
    e->n_ctx = ops->kv_len(e->backend);
    snprintf(e->selected, sizeof e->selected, "%s", d.selected);
    snprintf(e->kernel, sizeof e->kernel, "%s", d.kernel);
    snprintf(e->startup, sizeof e->startup, "requested=%s detected=[%s] selected=%s (%s)",
             e->requested, e->detected, e->selected, d.details);
    return BN_OK;
}

/* A GPU failure where the CPU may take over: allowed under auto without
 * strict mode (the reason is logged and kept for the receipt), an error
 * otherwise (under strict auto, saying that strict mode made it one). */
static bn_status fallback_allowed(bn_engine *e, const char *what, const bn_error *cerr,
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

bn_status engine_step_failed(bn_engine *e, const bn_error *cerr, const int32_t *history,
                             int64_t n_positions, bn_error *err)
{
    char what[96];
    snprintf(what, sizeof what, "a %s step failed at position %lld",
             gpu_title(e->gpu_entry ? e->gpu_entry->gpu_kind : -1), (long long)(n_positions - 1));
    bn_status st = fallback_allowed(e, what, cerr, err);
    if (st != BN_OK)
        return st;
    /* The receipt lists what ran on the device before the CPU took over. */
    bn_engine_info info;
    memset(&info, 0, sizeof info);
    e->backend->ops->report(e->backend, &info);
    snprintf(e->earlier_kernels, sizeof e->earlier_kernels, "%s", info.kernels);
    e->backend->ops->free(e->backend);
    e->backend = NULL;
    e->params.device = -1;
    e->params.kv_len = e->n_ctx; /* the same context as before */
    st = open_backend(e, bn_backend_cpu_ops(), err);
    if (st != BN_OK)
        return st;
    return e->backend->ops->forward(e->backend, history, n_positions, 0, e->logits, err);
}

/* ---- replicas ---------------------------------------------------------------- */

/* One replica on device `device`: the model borrowed from e, the same
 * options, its own backend and paged cache. */
static bn_status open_replica(bn_engine *e, int device, bn_engine **out, bn_error *err)
{
    bn_engine *r = calloc(1, sizeof *r);
    if (!r)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a replica");
    r->model = e->model;
    r->model_borrowed = true;
    snprintf(r->model_path, sizeof r->model_path, "%s", e->model_path);
    snprintf(r->requested, sizeof r->requested, "%s", e->requested);
    r->requested_from = e->requested_from;
    snprintf(r->detected, sizeof r->detected, "%s", e->detected);
    r->gpu_entry = e->gpu_entry;
    r->gpu_index = device;
    r->strict = e->strict;
    r->params = e->params;
    r->params.device = device;
    r->kv_cfg = e->kv_cfg;
    r->token_budget = e->token_budget;
    bn_error rerr;
    bn_error_clear(&rerr);
    bn_status st = open_backend(r, e->gpu_entry->ops, &rerr);
    if (st == BN_OK && !r->kv)
        st = bn_error_set(&rerr, BN_ERR_UNSUPPORTED, NULL, "its backend does not batch");
    if (st == BN_OK) {
        r->logits = malloc((size_t)bn_checkpoint_hparams(e->model)->vocab * sizeof(float));
        if (!r->logits)
            st = bn_error_set(&rerr, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for its logits");
    }
    if (st != BN_OK) {
        bn_engine_free(r);
        return bn_error_set(err, st, rerr.hint[0] ? rerr.hint : NULL,
                            "the replica on cuda:%d could not be opened: %.400s", device,
                            rerr.message);
    }
    *out = r;
    return BN_OK;
}

/* The replicas on devices[1 ..], where this engine batches: one sequence at
 * a time has nothing to spread, so it runs on the first device alone. */
static bn_status open_replicas(bn_engine *e, bn_error *err)
{
    if (!e->kv) {
        bn_log(BN_LOG_WARN,
               "%s names %d devices, but one sequence at a time runs on cuda:%d alone "
               "(replicas need sequences at once: --parallel)",
               e->requested, e->n_devices, e->devices[0]);
        return BN_OK;
    }
    e->replicas = calloc((size_t)e->n_devices - 1, sizeof *e->replicas);
    if (!e->replicas)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the replicas");
    for (int i = 1; i < e->n_devices; i++) {
        const bn_status st = open_replica(e, e->devices[i], &e->replicas[e->n_replicas], err);
        if (st != BN_OK)
            return st;
        e->n_replicas++;
    }
    /* The selection and the startup line name every device computing. */
    for (int i = 0; i < e->n_replicas; i++) {
        const size_t at = strlen(e->selected);
        if (at < sizeof e->selected)
            snprintf(e->selected + at, sizeof e->selected - at, ",%d", e->devices[i + 1]);
    }
    size_t used = strlen(e->startup);
    if (used < sizeof e->startup)
        snprintf(e->startup + used, sizeof e->startup - used, "; replicas on %d devices: %s",
                 e->n_devices, e->requested);
    return BN_OK;
}

/* ---- open / free ------------------------------------------------------------ */

/* The paged cache's shape from the options: params.paged_rows stays 0
 * unless more than one sequence may run at once. */
static bn_status plan_batching(bn_engine *e, const bn_engine_options *opt, const bn_hparams *hp,
                               bn_error *err)
{
    if (opt->max_seqs < 0 || opt->kv_block < 0 || opt->kv_positions < 0 || opt->token_budget < 0 ||
        opt->max_seqs > 4096 || opt->kv_block > 1024 || (unsigned)opt->kv_evict > BN_KV_EVICT_LFU ||
        opt->token_budget > BN_BATCH_TOKENS_MAX)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "batching options out of range: max_seqs %d (0..4096), kv_block %d "
                            "(0..1024), kv_positions %lld, token_budget %d (0..%d)",
                            opt->max_seqs, opt->kv_block, (long long)opt->kv_positions,
                            opt->token_budget, BN_BATCH_TOKENS_MAX);
    if (opt->max_seqs <= 1)
        return BN_OK;
    const int64_t n_ctx = opt->n_ctx > 0 ? opt->n_ctx : hp->n_ctx_train;
    const int32_t block = opt->kv_block > 0 ? opt->kv_block : 32;
    const uint64_t position_bytes =
        2u * (uint64_t)hp->n_layer * (uint64_t)hp->n_head_kv * (uint64_t)hp->head_dim * sizeof(float);
    int64_t positions = opt->kv_positions > 0 ? opt->kv_positions
                        : opt->kv_bytes > 0   ? (int64_t)(opt->kv_bytes / position_bytes)
                                              : (int64_t)opt->max_seqs * n_ctx;
    if (positions < block)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "give the KV cache more room",
                            "a KV cache of %llu bytes holds %lld positions, less than one block "
                            "of %d (%llu bytes a position)",
                            (unsigned long long)opt->kv_bytes, (long long)positions, block,
                            (unsigned long long)position_bytes);
    const int64_t blocks = (positions + block - 1) / block;
    if (blocks > INT32_MAX / 2)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, "ask for a smaller KV cache",
                            "a KV cache of %lld positions is too large", (long long)positions);
    e->kv_cfg = (bn_kv_blocks_config){.block_size = block,
                                      .n_blocks = (int32_t)blocks,
                                      .max_seqs = opt->max_seqs,
                                      .evict = opt->kv_evict,
                                      .prefix_sharing = !opt->no_prefix_sharing};
    e->token_budget = opt->token_budget > 0 ? opt->token_budget : 512;
    e->params.paged_rows = blocks * block;
    e->params.paged_block = block;
    e->params.paged_max_seqs = opt->max_seqs;
    return BN_OK;
}

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
    bn_status st = select_backend(e, cfg, opt->device, err);
    if (st == BN_OK)
        st = plan_tensor_parallel(e, opt->tensor_parallel, err);
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
    e->params = (bn_backend_params){.device = e->gpu_index,
                                    .kv_len = opt->n_ctx,
                                    .threads = opt->n_threads > 0 ? opt->n_threads
                                                                  : cfg->num_threads,
                                    .memory_limit = cfg->memory_limit_bytes,
                                    .kv = opt->kv,
                                    .engine = opt};
    e->params.tp_size = e->tensor_parallel;
    memcpy(e->params.tp_devices, e->devices, sizeof e->params.tp_devices);
    st = plan_batching(e, opt, hp, err);
    if (st != BN_OK) {
        bn_engine_free(e);
        return st;
    }
    if (e->gpu_entry) {
        bn_error gerr;
        bn_error_clear(&gerr);
        st = open_backend(e, e->tensor_parallel ? bn_backend_tensor_parallel_ops()
                                                : e->gpu_entry->ops,
                          &gerr);
        if (st != BN_OK) {
            char what[64];
            snprintf(what, sizeof what, "%s initialisation failed",
                     gpu_title(e->gpu_entry->gpu_kind));
            st = fallback_allowed(e, what, &gerr, err);
        }
        if (st != BN_OK) {
            bn_engine_free(e);
            return st;
        }
    }
    if (st == BN_OK && e->backend && e->n_devices >= 2)
        st = open_replicas(e, err);
    if (st != BN_OK) {
        bn_engine_free(e);
        return st;
    }
    e->params.engine = NULL; /* the caller's options live no longer than this call */
    e->params.device = -1;
    if (!e->backend)
        st = open_backend(e, bn_backend_cpu_ops(), err);
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
    *out = e;
    return BN_OK;
}

void bn_engine_free(bn_engine *e)
{
    if (!e)
        return;
    for (int i = 0; i < e->n_replicas; i++)
        bn_engine_free(e->replicas[i]);
    free(e->replicas);
    if (e->backend)
        e->backend->ops->free(e->backend);
    bn_kv_blocks_free(e->kv);
    if (!e->model_borrowed)
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
    /* generate leaves no step pending */
    return e->backend ? e->backend->ops->kv_filled(e->backend) : 0;
}

void *bn_engine_backend_handle(bn_engine *e, const char *name)
{
    /* A tensor-parallel team is not one backend a tool may drive alone. */
    if (!e || !e->backend || e->backend->ops == bn_backend_tensor_parallel_ops() ||
        strcmp(e->backend->ops->name, name) != 0)
        return NULL;
    return e->backend->impl;
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
    e->backend->ops->report(e->backend, info);
    if (e->earlier_kernels[0]) { /* what ran before a fallback comes first */
        char now[sizeof info->kernels];
        snprintf(now, sizeof now, "%s", info->kernels);
        snprintf(info->kernels, sizeof info->kernels, "%.250s%s%.250s", e->earlier_kernels,
                 now[0] ? "," : "", now);
    }
}

void bn_engine_replica_info(const bn_engine *e, int i, bn_engine_info *info)
{
    if (!e || i < 0 || i > e->n_replicas) {
        memset(info, 0, sizeof *info);
        return;
    }
    bn_engine_get_info(i == 0 ? e : e->replicas[i - 1], info);
}
