/*
 * receipt.c - the JSON record of one run: what was asked, what the engine
 * chose and why, what it computed and how fast, and the memory it held.
 * The field list is documented in docs/CLI.md ("Receipts"); keep the two
 * together.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine.h"
#include "bitnet.h"
#include "tokenizer.h"

/* A float setting as the user wrote it (0.95, not 0.949999988): the
 * shortest decimal that reads back as the same float. */
static void kv_float(bn_json *j, const char *key, float v)
{
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)v);
        if (strtof(buf, NULL) == v)
            break;
    }
    bn_json_kv_double(j, key, strtod(buf, NULL));
}

static void kv_rate(bn_json *j, const char *key, double count, double seconds)
{
    bn_json_kv_double(j, key, seconds > 0.0 ? count / seconds : 0.0);
}

static void token_array(bn_json *j, const char *key, const int32_t *ids, size_t n)
{
    bn_json_key(j, key);
    bn_json_begin_array(j);
    for (size_t i = 0; i < n; i++)
        bn_json_int(j, ids[i]);
    bn_json_end_array(j);
}

/* "cuda,avx512,scalar" as a JSON array. */
static void name_list(bn_json *j, const char *key, const char *csv)
{
    bn_json_key(j, key);
    bn_json_begin_array(j);
    char buf[512];
    snprintf(buf, sizeof buf, "%s", csv);
    char *save = NULL;
    for (char *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save))
        bn_json_string(j, t);
    bn_json_end_array(j);
}

static void write_model(bn_json *j, const bn_engine *e, const bn_engine_info *info)
{
    const bn_checkpoint *m = bn_engine_model(e);
    const bn_hparams *hp = bn_checkpoint_hparams(m);
    bn_json_key(j, "model");
    bn_json_begin_object(j);
    bn_json_kv_string(j, "path", info->model_path);
    bn_json_kv_string(j, "architecture", hp->arch);
    bn_json_kv_string(j, "flavour", hp->flavour);
    const bn_qtype_info *q = bn_qtype_get(bn_checkpoint_projection_type(m, 0, BN_PROJ_Q));
    bn_json_kv_string(j, "projection_type", q ? q->name : "unknown");
    bn_json_kv_bool(j, "has_tokenizer", bn_checkpoint_tokenizer(m) != NULL);
    bn_json_key(j, "hparams");
    bn_json_begin_object(j);
    bn_json_kv_int(j, "vocab", hp->vocab);
    bn_json_kv_int(j, "dim", hp->dim);
    bn_json_kv_int(j, "ffn", hp->ffn);
    bn_json_kv_int(j, "n_layer", hp->n_layer);
    bn_json_kv_int(j, "n_head", hp->n_head);
    bn_json_kv_int(j, "n_head_kv", hp->n_head_kv);
    bn_json_kv_int(j, "head_dim", hp->head_dim);
    bn_json_kv_int(j, "n_ctx_train", hp->n_ctx_train);
    bn_json_kv_int(j, "rope_dim", hp->rope_dim);
    kv_float(j, "rms_eps", hp->rms_eps);
    kv_float(j, "rope_theta", hp->rope_theta);
    bn_json_kv_bool(j, "tied_embeddings", hp->tied_embeddings);
    bn_json_end_object(j);
    bn_json_end_object(j);
}

/* With replicas: each engine's device, memory and batched work (the
 * backend's other fields are the first device's; the scheduler's counters
 * in a run's stats are their sums). */
static void replicas(bn_json *j, const bn_engine *e)
{
    bn_json_key(j, "replicas");
    bn_json_begin_array(j);
    for (int i = 0; i < bn_engine_replica_count(e); i++) {
        bn_engine_info r;
        bn_batch_stats b;
        bn_engine_replica_info(e, i, &r);
        bn_engine_replica_batch_stats(e, i, &b);
        bn_json_begin_object(j);
        bn_json_kv_string(j, "selected", r.selected);
        bn_json_kv_int(j, "gpu_device", r.gpu ? r.gpu_device : -1);
        bn_json_kv_uint(j, "gpu_total_bytes", r.gpu_total_bytes);
        bn_json_kv_uint(j, "gpu_kv_cache_bytes", r.gpu_kv_bytes);
        bn_json_kv_uint(j, "gpu_peak_bytes", r.gpu_peak_bytes);
        bn_json_kv_uint(j, "kernel_launches", r.gpu_kernel_launches);
        bn_json_kv_uint(j, "passes", b.steps);
        bn_json_kv_uint(j, "rows", b.rows);
        bn_json_kv_uint(j, "preemptions", b.preemptions);
        bn_json_end_object(j);
    }
    bn_json_end_array(j);
}

bn_status bn_engine_write_receipt(const bn_engine *e, const bn_receipt_info *ri, FILE *out,
                                  bn_error *err)
{
    bn_engine_info info;
    bn_engine_get_info(e, &info);
    const bn_generation *g = ri->gen;
    const bn_generate_request *req = ri->req;

    bn_json j;
    bn_json_init(&j, out);
    bn_json_begin_object(&j);
    bn_json_kv_string(&j, "bitnet_version", bn_version());
    bn_json_kv_string(&j, "command", ri->command ? ri->command : "");
    char when[32] = "";
    const time_t now = time(NULL);
    struct tm tm;
    if (gmtime_r(&now, &tm))
        strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    bn_json_kv_string(&j, "time_utc", when);
    /* Every number below comes from the model's own weights on a real
     * device; fake GPUs never compute. */
    bn_json_kv_string(&j, "compute_path", "real");
    bn_json_kv_string(&j, "startup_line", bn_engine_startup_line(e));

    write_model(&j, e, &info);

    bn_json_key(&j, "backend");
    bn_json_begin_object(&j);
    bn_json_kv_string(&j, "requested", info.requested);
    bn_json_kv_string(&j, "requested_from", info.requested_from);
    name_list(&j, "detected", info.detected);
    bn_json_kv_string(&j, "selected", info.selected);
    bn_json_kv_string(&j, "kernel_provider", info.kernel);
    bn_json_kv_int(&j, "threads", info.threads);
    bn_json_kv_string(&j, "fallback_reason", info.fallback);
    bn_json_kv_int(&j, "n_ctx", info.n_ctx);
    name_list(&j, "kernels", info.kernels);
    if (info.gpu) {
        bn_json_kv_int(&j, "gpu_device", info.gpu_device);
        bn_json_kv_string(&j, "gpu_name", info.gpu_name);
        bn_json_kv_bool(&j, "cuda_graphs", info.cuda_graphs);
        bn_json_kv_string(&j, "kv_cache_type", info.kv_type);
        bn_json_kv_int(&j, "tensor_parallel", info.tensor_parallel);
        bn_json_key(&j, "gpu_work");
        bn_json_begin_object(&j);
        bn_json_kv_uint(&j, "kernel_launches", info.gpu_kernel_launches);
        bn_json_kv_uint(&j, "h2d_transfers", info.gpu_h2d_transfers);
        bn_json_kv_uint(&j, "h2d_bytes", info.gpu_h2d_bytes);
        bn_json_kv_uint(&j, "d2h_transfers", info.gpu_d2h_transfers);
        bn_json_kv_uint(&j, "d2h_bytes", info.gpu_d2h_bytes);
        bn_json_end_object(&j);
    }
    if (bn_engine_replica_count(e) > 1)
        replicas(&j, e);
    bn_json_end_object(&j);

    bn_json_key(&j, "prompt");
    bn_json_begin_object(&j);
    bn_json_kv_bool(&j, "chat", req && req->chat);
    bn_json_kv_int(&j, "tokens", (int64_t)(g ? g->n_prompt : 0));
    token_array(&j, "token_ids", g ? g->prompt_tokens : NULL, g ? g->n_prompt : 0);
    bn_json_end_object(&j);

    bn_json_key(&j, "generation");
    bn_json_begin_object(&j);
    bn_json_kv_int(&j, "max_tokens", req ? req->n_predict : 0);
    bn_json_kv_int(&j, "tokens", (int64_t)(g ? g->n_tokens : 0));
    token_array(&j, "token_ids", g ? g->tokens : NULL, g ? g->n_tokens : 0);
    bn_json_kv_string(&j, "text", g && g->text ? g->text : "");
    bn_json_kv_string(&j, "stop_reason", g && g->stopped_at_eog ? "eog" : "length");
    if (g && g->stopped_at_eog)
        bn_json_kv_int(&j, "eog_token", g->eog_token);
    bn_json_end_object(&j);

    bn_json_key(&j, "sampling");
    bn_json_begin_object(&j);
    if (req) {
        const bn_sampler_params *p = &req->sampling;
        bn_json_kv_bool(&j, "greedy", p->temperature <= 0.0f);
        kv_float(&j, "temperature", p->temperature);
        bn_json_kv_int(&j, "top_k", p->top_k);
        kv_float(&j, "top_p", p->top_p);
        kv_float(&j, "min_p", p->min_p);
        kv_float(&j, "repeat_penalty", p->repeat_penalty);
        bn_json_kv_int(&j, "repeat_last_n", p->repeat_last_n);
        bn_json_kv_uint(&j, "seed", p->seed);
        bn_json_kv_bool(&j, "seed_fixed", ri->seed_fixed);
    }
    bn_json_end_object(&j);

    bn_json_key(&j, "timings");
    bn_json_begin_object(&j);
    bn_json_kv_double(&j, "load_seconds", info.load_seconds);
    if (g) {
        bn_json_kv_double(&j, "prompt_seconds", g->prompt_seconds);
        kv_rate(&j, "prompt_tokens_per_second", (double)g->n_prompt, g->prompt_seconds);
        bn_json_kv_double(&j, "generation_seconds", g->gen_seconds);
        kv_rate(&j, "generation_tokens_per_second", (double)g->n_tokens, g->gen_seconds);
        bn_json_kv_int(&j, "decode_steps", g->decode_steps);
        bn_json_kv_double(&j, "decode_seconds", g->decode_seconds);
        kv_rate(&j, "decode_tokens_per_second", (double)g->decode_steps, g->decode_seconds);
    }
    bn_json_end_object(&j);

    bn_json_key(&j, "memory");
    bn_json_begin_object(&j);
    bn_json_kv_uint(&j, "model_weight_bytes", info.model_weight_bytes);
    bn_json_key(&j, "backend");
    bn_json_begin_object(&j);
    bn_json_kv_uint(&j, "weights_bytes", info.backend_weight_bytes);
    bn_json_kv_uint(&j, "kv_cache_bytes", info.backend_kv_bytes);
    bn_json_kv_uint(&j, "scratch_bytes", info.backend_scratch_bytes);
    bn_json_kv_uint(&j, "total_bytes", info.backend_total_bytes);
    bn_json_end_object(&j);
    if (info.gpu) {
        /* The device footprint, part by part (docs/CLI.md). */
        bn_json_key(&j, "gpu");
        bn_json_begin_object(&j);
        bn_json_kv_uint(&j, "weights_bytes", info.gpu_weights_bytes);
        bn_json_kv_uint(&j, "embedding_bytes", info.gpu_embedding_bytes);
        bn_json_kv_uint(&j, "lm_head_bytes", info.gpu_lm_head_bytes);
        bn_json_kv_uint(&j, "lm_head_screen_bytes", info.gpu_lm_head_screen_bytes);
        bn_json_kv_uint(&j, "norms_bytes", info.gpu_norms_bytes);
        bn_json_kv_uint(&j, "kv_cache_bytes", info.gpu_kv_bytes);
        bn_json_kv_uint(&j, "scratch_bytes", info.gpu_scratch_bytes);
        bn_json_kv_uint(&j, "total_bytes", info.gpu_total_bytes);
        bn_json_kv_uint(&j, "peak_bytes", info.gpu_peak_bytes);
        bn_json_kv_uint(&j, "device_total_bytes", info.gpu_device_total_bytes);
        bn_json_kv_uint(&j, "device_free_bytes", info.gpu_device_free_bytes);
        bn_json_key(&j, "pool");
        bn_json_begin_object(&j);
        bn_json_kv_uint(&j, "reserved_bytes", info.gpu_pool_reserved_bytes);
        bn_json_kv_uint(&j, "peak_reserved_bytes", info.gpu_pool_peak_reserved_bytes);
        bn_json_kv_uint(&j, "limit_bytes", info.gpu_pool_limit_bytes);
        bn_json_kv_uint(&j, "buffers", info.gpu_pool_buffers);
        bn_json_kv_uint(&j, "allocations", info.gpu_pool_allocations);
        bn_json_kv_uint(&j, "failures", info.gpu_pool_failures);
        bn_json_end_object(&j);
        bn_json_end_object(&j);
    }
    bn_host_memory host;
    if (bn_host_memory_query(&host, NULL) == BN_OK) {
        bn_json_kv_uint(&j, "process_resident_bytes", host.process_resident_bytes);
        bn_json_kv_uint(&j, "process_peak_bytes", host.process_peak_bytes);
    }
    bn_json_end_object(&j);

    bn_json_end_object(&j);
    fputc('\n', out);
    if (ferror(out))
        return bn_error_set(err, BN_ERR_IO, "check the disk space and the path",
                            "could not write the receipt");
    return BN_OK;
}
