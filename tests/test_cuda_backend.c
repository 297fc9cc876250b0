/*
 * test_cuda_backend.c - the CUDA backend (src/cuda/cuda_backend.h) against
 * the CPU backend, the numerical reference, and the engine's device
 * selection and fallback. Label gpu: exits 77 without a usable CUDA device.
 *
 * usage: test_cuda_backend [DIR]   (DIR = tests/data/models, the default)
 * BN_TEST_QUICK=1 (the compute-sanitizer runs of scripts/gpu-check.sh) checks
 * two fixtures and skips the 2B-4T model; BN_TEST_STEPS=n (3 to 32) sets the
 * steps a run compares (32, or 8 in quick mode).
 *
 * For every fixture (hf_packed, hf_bf16, i2s.gguf, tq2_0.gguf, tq1_0.gguf):
 *   - CPU greedy run of 32 tokens after an 8-token prompt: the reference
 *     tokens, the logits of every step and the smallest top-2 gap;
 *   - GPU, eager launches, fed the CPU's tokens: every step's logits within
 *     TOL_F32 x max(1, max|logit|) of the CPU's, and the same argmax;
 *   - GPU, decode graph replayed, same feed: logits bit-identical to eager;
 *   - GPU greedy on the device (graph, submit/wait), free-running: the same
 *     32 tokens as the CPU; and eagerly: the same tokens again;
 *   - fp16 KV cache: logits within TOL_F16 (tokens reported, not required);
 *   - the decode step's fallback forms, as on a device or model that offers
 *     less (bn_cuda_backend_create_as): without clusters or PDL against the
 *     CPU; the q|k|v GEMV, gate|up staged as the other GEMVs and raw gate|up
 *     values bit for bit the default's; the screened head's greedy tokens
 *     the default's, its logits bit for bit.
 * Then: i2s.gguf rewritten in every other projection encoding (TQ2_0 with
 * .scale tensors, F16 with a separate head, F32, TL1, TL2), each file's GPU
 * logits and greedy tokens against the CPU's on that file; prefill in
 * chunks of 3 equals one chunk; the stage profiles of a
 * prefill chunk and a decode step (the next step bit for bit a plain run's;
 * bad requests refused); a ragged random model (no
 * fused products, head_dim 36, untied F16 head of odd width); a random
 * 2B-4T-shaped model for a few decode steps after a short and a long prompt
 * (long: graph equals eager bit for bit; logits within 10x of the CPU's own
 * change for a 1-ulp input change: the untrained deep model amplifies
 * rounding; the same tokens, except where the CPU's top logit leads the
 * GPU's choice by less than that change); request errors and out of
 * memory (the process stays usable; the hint's --ctx fits); the engine:
 * GPU selection and receipt, fallback to the CPU on an impossible memory
 * limit and on a failing step under auto, errors under strict mode and
 * explicit cuda requests.
 *
 * Tolerances. With the fp32 KV cache the GPU makes the CPU's int8 rounding
 * decisions (cuda_backend_kernels.h); logits differ by fp32 summation order
 * only, ~1e-6 relative, unless an activation sits within that distance of a
 * rounding boundary, which moves a logit by ~1e-3 relative. TOL_F32 = 1e-2
 * still catches any structural error (those are O(1)). The fp16 cache
 * rounds every key and value (2^-11 relative); on these tiny models that
 * moves logits by up to ~2.5% of max|logit| (measured on the CPU by
 * rounding its cache), so TOL_F16 = 6e-2.
 *
 * Every check prints what it measured, so one run on the GPU machine is
 * enough to diagnose a failure.
 */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu_backend.h"
#include "cuda_backend.h"
#include "cuda_backend_kernels.h"
#include "engine.h"
#include "model.h"
#include "repack_gguf.h"
#include "test_util.h"
#include "w2a8_cuda.h"

#define TOL_F32 1e-2
#define TOL_F16 6e-2
#define N_STEPS 32 /* greedy steps compared (the arrays' size) */
/* Steps a run compares: N_STEPS, or 8 with BN_TEST_QUICK=1 (the sanitizer
 * runs, where each kernel launch costs far more and 8 steps launch every
 * kernel the 32 do); BN_TEST_STEPS=n sets it (3 to N_STEPS: the chained
 * checks drop the third step), for a racecheck run that must be shorter. */
static int n_steps = N_STEPS;
#define PROMPT_LEN 8

static const int32_t PROMPT[PROMPT_LEN] = {297, 33, 264, 45, 281, 220, 265, 64};
static const char *const FIXTURES[] = {"hf_packed", "hf_bf16", "i2s.gguf", "tq2_0.gguf",
                                       "tq1_0.gguf"};

static const char *data_dir;

/* ---- helpers ------------------------------------------------------------------ */

static bool gpu_usable(char *why, size_t size)
{
    bn_cuda_report *r = calloc(1, sizeof *r);
    if (!r)
        return false;
    bn_cuda_query(r);
    const bool ok = r->status == BN_OK && r->device_count > 0;
    snprintf(why, size, "%s", ok ? "" : r->reason);
    free(r);
    return ok;
}

static int32_t argmax(const float *l, int32_t n)
{
    int32_t best = 0;
    for (int32_t i = 1; i < n; i++)
        if (l[i] > l[best])
            best = i;
    return best;
}

/* Whether the comma-separated list names the kernel family (whole names). */
static bool has_kernel(const char *list, const char *name)
{
    const size_t n = strlen(name);
    for (const char *p = strstr(list, name); p; p = strstr(p + 1, name))
        if ((p == list || p[-1] == ',') && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

static double max_abs(const float *a, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

static double max_diff(const float *a, const float *b, int64_t n)
{
    double m = 0.0;
    for (int64_t i = 0; i < n; i++) {
        const double d = fabs((double)a[i] - b[i]);
        m = d > m || d != d ? d : m; /* a NaN shows as NaN */
    }
    return m;
}

/* max|a - b| / max(1, max|a|). */
static double rel_diff(const float *ref, const float *got, int64_t n)
{
    return max_diff(ref, got, n) / fmax(1.0, max_abs(ref, n));
}

static double top2_gap(const float *l, int32_t n)
{
    const int32_t t = argmax(l, n);
    double second = -INFINITY;
    for (int32_t i = 0; i < n; i++)
        if (i != t && l[i] > second)
            second = l[i];
    return l[t] - second;
}

static void print_tokens(const char *what, const int32_t *t, int n)
{
    printf("    %-6s", what);
    for (int i = 0; i < n; i++)
        printf(" %d", t[i]);
    printf("\n");
}

static bn_checkpoint *load_fixture(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", data_dir, name);
    bn_checkpoint *m = NULL;
    bn_error err;
    bn_error_clear(&err);
    CHECK_MSG(bn_checkpoint_load(path, &m, &err) == BN_OK, "load %s: %s", path, err.message);
    return m;
}

static bn_cuda_backend *make_cuda(const bn_checkpoint *m, int64_t kv_len, bn_cuda_kv_type kv,
                                  int chunk)
{
    bn_cuda_backend_options o;
    bn_cuda_backend_options_default(&o);
    o.kv_len = kv_len;
    o.kv_type = kv;
    o.prefill_chunk = chunk;
    bn_cuda_backend *b = NULL;
    bn_error err;
    bn_error_clear(&err);
    CHECK_MSG(bn_cuda_backend_create(m, &o, &b, &err) == BN_OK, "cuda create: %s (%s)",
              err.message, err.hint);
    return b;
}

/* The CPU's greedy run: tokens[N_STEPS], logits[N_STEPS][V] (row s: the
 * logits that chose token s). */
static bool cpu_greedy(const bn_checkpoint *m, const int32_t *prompt, int n_prompt, int32_t *tokens,
                       float *logits)
{
    const int32_t V = bn_checkpoint_hparams(m)->vocab;
    bn_cpu_backend *c = NULL;
    bn_error err;
    bn_error_clear(&err);
    CHECK_MSG(bn_cpu_backend_create(m, 0, 0, &c, &err) == BN_OK, "cpu create: %s", err.message);
    if (!c)
        return false;
    bool ok = bn_cpu_backend_forward(c, prompt, n_prompt, 0, BN_LOGITS_LAST, logits, &err) ==
              BN_OK;
    for (int s = 0; ok && s < n_steps; s++) {
        tokens[s] = argmax(logits + (int64_t)s * V, V);
        if (s + 1 < n_steps)
            ok = bn_cpu_backend_forward(c, &tokens[s], 1, n_prompt + s, BN_LOGITS_LAST,
                                        logits + (int64_t)(s + 1) * V, &err) == BN_OK;
    }
    CHECK_MSG(ok, "cpu forward: %s", err.message);
    bn_cpu_backend_free(c);
    return ok;
}

/* ---- per fixture -------------------------------------------------------------- */

/* n_steps greedy tokens on the device from PROMPT at position 0 (the
 * cache reset first): graph replay through submit/wait, or eager steps. */
static bool device_greedy(bn_cuda_backend *b, bool graph, int32_t *tokens, bn_error *err)
{
    bn_cuda_backend_set_graphs(b, graph);
    bn_cuda_backend_reset(b);
    int32_t next;
    bool ok = bn_cuda_backend_forward_greedy(b, PROMPT, PROMPT_LEN, 0, &next, err) == BN_OK;
    for (int s = 0; ok && s < n_steps; s++) {
        tokens[s] = next;
        if (s + 1 == n_steps)
            break;
        if (graph)
            ok = bn_cuda_backend_submit_greedy(b, next, PROMPT_LEN + s, err) == BN_OK &&
                 bn_cuda_backend_wait_greedy(b, &next, err) == BN_OK;
        else
            ok = bn_cuda_backend_forward_greedy(b, &tokens[s], 1, PROMPT_LEN + s, &next, err) ==
                 BN_OK;
    }
    return ok;
}

/* The prompt, then n_steps - 1 single-token steps fed the CPU's greedy
 * tokens (teacher forcing): n_steps rows of V logits into out. */
static bool teacher_forced(bn_cuda_backend *b, const int32_t *tokens, int32_t V, float *out,
                           bn_error *err)
{
    bool ok = out && bn_cuda_backend_forward(b, PROMPT, PROMPT_LEN, 0, out, err) == BN_OK;
    for (int s = 1; ok && s < n_steps; s++)
        ok = bn_cuda_backend_forward(b, &tokens[s - 1], 1, PROMPT_LEN + s - 1,
                                     out + (size_t)s * V, err) == BN_OK;
    return ok;
}

/* The units of work of a fixture (BN_TEST_PART): each runs the CPU
 * reference and the default backend's teacher-forced logits, which the
 * others compare against, then its own share: (0) the default's greedy
 * runs, stage-cost timing, fp16 KV cache and summary; (1) the form of a
 * device without clusters (the attention merged through its ticket); (2)
 * the q|k|v GEMV and the gate|up GEMV staged as the others; (3) the raw
 * gate|up values and the screened LM head. */
enum { FIXTURE_UNITS = 4 };

static void check_fixture(const char *name, int unit)
{
    const bool part_default = test_in_part(unit), part_ticket = test_in_part(unit + 1),
               part_staging = test_in_part(unit + 2), part_head = test_in_part(unit + 3);
    if (!part_default && !part_ticket && !part_staging && !part_head)
        return;
    bn_checkpoint *m = load_fixture(name);
    if (!m)
        return;
    const int32_t V = bn_checkpoint_hparams(m)->vocab;
    const size_t row = (size_t)V * sizeof(float);
    float *ref = malloc(N_STEPS * row), *eager = malloc(N_STEPS * row),
          *graph = malloc(N_STEPS * row), *half = malloc(N_STEPS * row);
    int32_t ref_tok[N_STEPS], gpu_tok[N_STEPS], eager_tok[N_STEPS];
    memset(gpu_tok, 0, sizeof gpu_tok);
    memset(eager_tok, 0, sizeof eager_tok);
    bn_error err;
    bn_error_clear(&err);
    if (!cpu_greedy(m, PROMPT, PROMPT_LEN, ref_tok, ref)) {
        bn_checkpoint_free(m);
        free(ref), free(eager), free(graph), free(half);
        return;
    }
    double min_gap = INFINITY;
    for (int s = 0; s < n_steps; s++)
        min_gap = fmin(min_gap, top2_gap(ref + (size_t)s * V, V));

    bn_cuda_backend *b = make_cuda(m, 0, BN_CUDA_KV_F32, 0);
    if (!b) {
        bn_checkpoint_free(m);
        free(ref), free(eager), free(graph), free(half);
        return;
    }
    /* Teacher-forced logits, eager then graph. */
    float *outs[2] = {eager, graph};
    for (int pass = 0; pass < 2; pass++) {
        bn_cuda_backend_set_graphs(b, pass == 1);
        bn_cuda_backend_reset(b);
        const bool ok = teacher_forced(b, ref_tok, V, outs[pass], &err);
        CHECK_MSG(ok, "%s: gpu forward (%s): %s", name, pass ? "graph" : "eager", err.message);
        if (!ok)
            goto out;
    }
    CHECK_MSG(bn_cuda_backend_graphs(b), "%s: the decode graph was not captured", name);

    double prefill_rel = rel_diff(ref, eager, V), worst_rel = 0.0;
    int worst_step = 0, argmax_diff = 0;
    for (int s = 0; s < n_steps; s++) {
        const double r = rel_diff(ref + (size_t)s * V, eager + (size_t)s * V, V);
        if (r > worst_rel || r != r) {
            worst_rel = r;
            worst_step = s;
        }
        if (argmax(eager + (size_t)s * V, V) != ref_tok[s])
            argmax_diff++;
    }
    const double graph_vs_eager = max_diff(eager, graph, (int64_t)n_steps * V);

    /* Free-running greedy on the device: graph (submit/wait), then eager
     * (for the units that use the tokens). */
    int32_t *runs[2] = {gpu_tok, eager_tok};
    for (int pass = 0; pass < 2 && (part_default || part_head); pass++) {
        const bool ok = device_greedy(b, pass == 0, runs[pass], &err);
        CHECK_MSG(ok, "%s: gpu greedy (%s): %s", name, pass ? "eager" : "graph", err.message);
        if (!ok)
            goto out;
    }
    /* The stage-cost timing (bench e2e) disables graph nodes and enables
     * them again: a graph greedy run from the prompt afterwards gives the
     * same tokens as before it. */
    bn_cuda_backend_set_graphs(b, true);
    CHECK_MSG(bn_cuda_backend_graphs(b), "%s: no decode graph was captured", name);
    if (part_default && bn_cuda_backend_graphs(b)) {
        printf("%s: stage-cost timing then graph greedy: checked\n", name);
        double us = 0.0;
        int off = 0;
        unsigned mask = ~0u;
        bn_status st = bn_cuda_backend_time_decode_without(b, mask, gpu_tok[0], PROMPT_LEN, 2,
                                                           &us, &off, &err);
        const unsigned fixed = bn_cuda_backend_fixed_stages(b);
        if (st != BN_OK && fixed != 0) {
            /* Clusters of 16 (the attention's, the gate|up GEMV's): the
             * driver refuses to disable their nodes, which must be said as
             * such; the other stages still time. */
            CHECK_MSG(st == BN_ERR_UNSUPPORTED && strstr(err.message, "clusters of") != NULL,
                      "%s: time_decode_without with stages %#x in clusters of 16: %s", name,
                      fixed, err.message);
            mask &= ~fixed;
            st = bn_cuda_backend_time_decode_without(b, mask, gpu_tok[0], PROMPT_LEN, 2, &us,
                                                     &off, &err);
        }
        bool ok = st == BN_OK;
        CHECK_MSG(ok && off > 0 && us > 0.0, "%s: time_decode_without: %s (%d nodes off, %g us)",
                  name, ok ? "ok" : err.message, off, us);
        /* The device-time timing replays the graph back to back (bench e2e);
         * without graphs it says so, and a greedy run afterwards is as before. */
        double dev_us = 0.0;
        st = bn_cuda_backend_time_decode_device(b, gpu_tok[0], PROMPT_LEN, 3, &dev_us, &err);
        CHECK_MSG(st == BN_OK && dev_us > 0.0, "%s: time_decode_device: %s (%g us)", name,
                  st == BN_OK ? "ok" : err.message, dev_us);
        /* ... and a sampled step's, whole and in parts; a bad part is refused. */
        const bn_cuda_sample_params sp = {0.8f, 8, 0.95f, 0.05f};
        for (int part = BN_CUDA_TIME_STEP; part <= BN_CUDA_TIME_CHOICE; part++) {
            st = bn_cuda_backend_time_decode_device_sample(
                b, gpu_tok[0], PROMPT_LEN, 3, &sp, 0.25, (bn_cuda_time_part)part, &dev_us, &err);
            CHECK_MSG(st == BN_OK && dev_us > 0.0,
                      "%s: time_decode_device_sample part %d: %s (%g us)", name, part,
                      st == BN_OK ? "ok" : err.message, dev_us);
        }
        st = bn_cuda_backend_time_decode_device_sample(b, gpu_tok[0], PROMPT_LEN, 3, &sp, 0.25,
                                                       (bn_cuda_time_part)7, &dev_us, &err);
        CHECK_MSG(st == BN_ERR_INVALID_ARGUMENT, "%s: time_decode_device_sample, bad part: %s",
                  name, bn_status_str(st));
        bn_cuda_backend_set_graphs(b, false);
        st = bn_cuda_backend_time_decode_device(b, gpu_tok[0], PROMPT_LEN, 3, &dev_us, &err);
        CHECK_MSG(st == BN_ERR_UNSUPPORTED, "%s: time_decode_device without graphs: %s", name,
                  bn_status_str(st));
        bn_cuda_backend_set_graphs(b, true);
        int32_t again[N_STEPS];
        ok = ok && device_greedy(b, true, again, &err);
        CHECK_MSG(ok && memcmp(again, gpu_tok, (size_t)n_steps * sizeof *again) == 0,
                  "%s: graph greedy after the stage-cost and device timings differs (%s)", name,
                  ok ? "tokens" : err.message);
    }
    int first_diff = -1;
    for (int s = 0; s < n_steps && first_diff < 0; s++)
        if (gpu_tok[s] != ref_tok[s])
            first_diff = s;
    const bool eager_same = memcmp(gpu_tok, eager_tok, (size_t)n_steps * sizeof *gpu_tok) == 0;

    char kernels[512];
    bn_cuda_backend_kernels(b, kernels, sizeof kernels);
    bn_cuda_decode_form form;
    bn_cuda_backend_decode_form(b, &form);
    /* Every fixture's ffn is whole tiles: gate|up runs in pairs. */
    CHECK_MSG(form.gate_up_pair == has_kernel(kernels, "w2a8_gemv_gate_up_relu2") &&
                  form.gate_up_pair,
              "%s: the form's gate|up pair is %d, the kernels that ran: %s", name,
              (int)form.gate_up_pair, kernels);
    CHECK_MSG(form.attn_qkv == has_kernel(kernels, "attention_decode_f32_cluster_qkv"),
              "%s: the form's q|k|v inside the attention is %d, the kernels that ran: %s", name,
              (int)form.attn_qkv, kernels);
    bn_cuda_backend_free(b);
    b = NULL;

    /* As on a device without thread-block clusters or programmatic
     * dependent launch (compute capability 8.x): the attention's ranges
     * merged through the ticket, a q|k|v GEMV before it, every GEMV block
     * staging its own row. Another summation order in the attention, so
     * the logits agree with the CPU's within the tolerance and the argmax
     * is the CPU's. */
    if (part_ticket) {
        const bn_cuda_as_if sm80 = {.no_clusters = true, .no_pdl = true};
        double rel = NAN;
        int alt_argmax_diff = -1;
        bn_cuda_backend *u = NULL;
        CHECK_MSG(bn_cuda_backend_create_as(m, NULL, &sm80, &u, &err) == BN_OK,
                  "%s: cuda create (no clusters, no PDL): %s", name, err.message);
        if (u) {
            bn_cuda_decode_form f;
            bn_cuda_backend_decode_form(u, &f);
            CHECK_MSG(!f.pdl && f.attn_cluster == 0 && !f.attn_qkv && f.gemv_cluster == 0 &&
                          f.gate_up_cluster == 0 && f.gate_up_pair,
                      "%s: without clusters: pdl %d, attention cluster %d, q|k|v inside %d, "
                      "gemv cluster %d, gate|up cluster %d",
                      name, (int)f.pdl, f.attn_cluster, (int)f.attn_qkv, f.gemv_cluster,
                      f.gate_up_cluster);
            float *alt = malloc(N_STEPS * row);
            const bool ok = alt && teacher_forced(u, ref_tok, V, alt, &err);
            CHECK_MSG(ok, "%s: gpu forward (no clusters): %s", name, err.message);
            if (ok) {
                rel = 0.0;
                alt_argmax_diff = 0;
                for (int s = 0; s < n_steps; s++) {
                    rel = fmax(rel, rel_diff(ref + (size_t)s * V, alt + (size_t)s * V, V));
                    alt_argmax_diff += argmax(alt + (size_t)s * V, V) != ref_tok[s];
                }
            }
            char ks[512];
            bn_cuda_backend_kernels(u, ks, sizeof ks);
            CHECK_MSG(has_kernel(ks, "attention_decode_f32") &&
                          !has_kernel(ks, "attention_decode_f32_cluster") &&
                          !has_kernel(ks, "attention_decode_f32_cluster_qkv"),
                      "%s: the ticket-merge attention did not run (%s)", name, ks);
            free(alt);
            bn_cuda_backend_free(u);
        }
        printf("%-11s no clusters    : worst rel %.2e, argmax differs at %d\n", name, rel,
               alt_argmax_diff);
        CHECK_MSG(rel <= TOL_F32, "%s: logits without clusters differ from the CPU by %.3g",
                  name, rel);
        CHECK_MSG(alt_argmax_diff == 0,
                  "%s: argmax without clusters differs from the CPU's at %d steps", name,
                  alt_argmax_diff);
    }

    /* Fallbacks that change no bit of the logits (integer sums, the same
     * fp32 operations on the same values), each against the default's run:
     * as where the attention's clusters cannot hold the q|k|v weights (a
     * GEMV before it) and the device holds no cluster of 16 gate|up blocks
     * (that GEMV staged as the others); then as where gate and up are not
     * whole tiles (their raw values, the squared ReLU in the norm after). */
    const bn_cuda_as_if same_bits[2] = {{.no_attn_qkv = true, .no_cluster16 = true},
                                        {.no_gate_up_pairs = true}};
    for (int k = 0; k < 2; k++) {
        if (!(k == 0 ? part_staging : part_head))
            continue;
        const char *what = k == 0 ? "q|k|v GEMV, gate|up staged as the GEMVs"
                                  : "gate|up raw values";
        bn_cuda_backend *u = NULL;
        CHECK_MSG(bn_cuda_backend_create_as(m, NULL, &same_bits[k], &u, &err) == BN_OK,
                  "%s: cuda create (%s): %s", name, what, err.message);
        if (!u)
            continue;
        bn_cuda_decode_form f;
        bn_cuda_backend_decode_form(u, &f);
        const bool form_ok = k == 0 ? !f.attn_qkv && f.gate_up_cluster == f.gemv_cluster &&
                                          f.gate_up_pair && f.gemv_cluster == form.gemv_cluster
                                    : !f.gate_up_pair && f.gate_up_cluster == f.gemv_cluster;
        CHECK_MSG(form_ok, "%s, %s: q|k|v inside %d, gate|up pair %d, its cluster %d, gemv "
                           "cluster %d",
                  name, what, (int)f.attn_qkv, (int)f.gate_up_pair, f.gate_up_cluster,
                  f.gemv_cluster);
        CHECK_MSG(((bn_cuda_backend_fixed_stages(u) >> BN_CUDA_STAGE_GATE_UP) & 1u) ==
                      (f.gate_up_cluster > 8),
                  "%s, %s: gate|up in clusters of %d, fixed stages %#x", name, what,
                  f.gate_up_cluster, bn_cuda_backend_fixed_stages(u));
        float *alt = malloc(N_STEPS * row);
        const bool ok = alt && teacher_forced(u, ref_tok, V, alt, &err);
        CHECK_MSG(ok, "%s: gpu forward (%s): %s", name, what, err.message);
        const bool same = ok && memcmp(alt, eager, (size_t)n_steps * row) == 0;
        CHECK_MSG(same, "%s: logits with %s differ from the default's", name, what);
        char ks[512];
        bn_cuda_backend_kernels(u, ks, sizeof ks);
        CHECK_MSG(!has_kernel(ks, k == 0 ? "attention_decode_f32_cluster_qkv"
                                         : "w2a8_gemv_gate_up_relu2"),
                  "%s, %s: ran %s", name, what, ks);
        printf("%-11s %-40s: %d steps of logits %s the default's\n", name, what, n_steps,
               same ? "bit for bit as" : "NOT as");
        free(alt);
        bn_cuda_backend_free(u);
    }

    /* The screened LM head, as for a head large enough to screen (these are
     * below the size): greedy tokens, graph and eager, are the default's,
     * which are the CPU's; steps that return logits use the full head, bit
     * for bit the default's. */
    if (part_head) {
        const bn_cuda_as_if large_head = {.screen_any_head = true};
        bn_cuda_backend *u = NULL;
        CHECK_MSG(bn_cuda_backend_create_as(m, NULL, &large_head, &u, &err) == BN_OK,
                  "%s: cuda create (screened head): %s", name, err.message);
        if (u) {
            bn_cuda_decode_form f;
            bn_cuda_backend_decode_form(u, &f);
            CHECK_MSG(f.head_screen, "%s: a head as if large is not screened", name);
            int32_t scr[2][N_STEPS];
            bool ok = true;
            for (int pass = 0; pass < 2 && ok; pass++) {
                ok = device_greedy(u, pass == 0, scr[pass], &err);
                CHECK_MSG(ok, "%s: screened greedy (%s): %s", name, pass ? "eager" : "graph",
                          err.message);
            }
            int64_t kept = -1;
            if (ok)
                CHECK(bn_cuda_backend_head_kept(u, &kept, &err) == BN_OK);
            const bool same = ok && memcmp(scr[0], gpu_tok, (size_t)n_steps * 4) == 0 &&
                              memcmp(scr[1], gpu_tok, (size_t)n_steps * 4) == 0;
            CHECK_MSG(same, "%s: greedy tokens with the screened head differ", name);
            float *alt = malloc(N_STEPS * row);
            bn_cuda_backend_set_graphs(u, true);
            bn_cuda_backend_reset(u);
            ok = alt && teacher_forced(u, ref_tok, V, alt, &err);
            CHECK_MSG(ok, "%s: gpu forward (screened head): %s", name, err.message);
            if (ok)
                CHECK_MSG(memcmp(alt, graph, (size_t)n_steps * row) == 0,
                          "%s: logits with the screened head differ from the default's", name);
            char ks[512];
            bn_cuda_backend_kernels(u, ks, sizeof ks);
            CHECK_MSG(strstr(ks, "lm_head_screen_int8") && strstr(ks, "lm_head_gemv"),
                      "%s: the screened backend ran %s", name, ks);
            printf("%-11s screened head : %d greedy tokens %s the default's (graph, eager), "
                   "last step kept %lld of %d rows; logits bit for bit\n",
                   name, n_steps, same ? "as" : "NOT as", (long long)kept, (int)V);
            free(alt);
            bn_cuda_backend_free(u);
        }
    }

    if (!part_default)
        goto out; /* the rest is unit 0's */
    /* The fp16 KV cache, fed the CPU's tokens. Its attention kernels take
     * head_dim 64, 128 or 256; other models must be refused clearly. */
    double half_rel = NAN;
    int half_argmax_diff = -1;
    const int head_dim = bn_checkpoint_hparams(m)->head_dim;
    const bool half_supported = head_dim == 64 || head_dim == 128 || head_dim == 256;
    bn_cuda_backend *h = NULL;
    if (half_supported) {
        h = make_cuda(m, 0, BN_CUDA_KV_F16, 0);
    } else {
        bn_cuda_backend_options o;
        bn_cuda_backend_options_default(&o);
        o.kv_type = BN_CUDA_KV_F16;
        bn_error herr;
        bn_error_clear(&herr);
        CHECK(bn_cuda_backend_create(m, &o, &h, &herr) != BN_OK && h == NULL);
        CHECK_STR_CONTAINS(herr.message, "head_dim");
        half_rel = 0.0; /* nothing to compare: refused as it should be */
    }
    if (h) {
        const bool ok = teacher_forced(h, ref_tok, V, half, &err);
        CHECK_MSG(ok, "%s: gpu forward (fp16 KV): %s", name, err.message);
        if (ok) {
            half_rel = 0.0;
            half_argmax_diff = 0;
            for (int s = 0; s < n_steps; s++) {
                half_rel = fmax(half_rel, rel_diff(ref + (size_t)s * V, half + (size_t)s * V, V));
                half_argmax_diff += argmax(half + (size_t)s * V, V) != ref_tok[s];
            }
        }
        bn_cuda_backend_free(h);
    }

    printf("%-11s prefill rel %.2e | %d steps: worst rel %.2e (step %d), argmax differs at %d | "
           "graph-eager max|d| %g | greedy gpu==cpu %s, eager==graph %s | cpu min top-2 gap "
           "%.4f | fp16 KV: rel %.2e, argmax differs at %d\n",
           name, prefill_rel, n_steps, worst_rel, worst_step, argmax_diff, graph_vs_eager,
           first_diff < 0 ? "yes" : "NO", eager_same ? "yes" : "NO", min_gap, half_rel,
           half_argmax_diff);
    CHECK_MSG(worst_rel <= TOL_F32, "%s: logits differ from the CPU by %.3g x max|logit| at step "
                                    "%d (tolerance %g)",
              name, worst_rel, worst_step, TOL_F32);
    CHECK_MSG(argmax_diff == 0, "%s: the GPU's argmax differs from the CPU's at %d steps", name,
              argmax_diff);
    CHECK_MSG(graph_vs_eager == 0.0, "%s: graph replay logits differ from eager by %g", name,
              graph_vs_eager);
    CHECK_MSG(first_diff < 0, "%s: greedy tokens differ from step %d (cpu top-2 gap there %.4g)",
              name, first_diff,
              first_diff >= 0 ? top2_gap(ref + (size_t)first_diff * V, V) : 0.0);
    CHECK_MSG(eager_same, "%s: eager greedy tokens differ from the graph's", name);
    if (first_diff >= 0 || !eager_same) {
        print_tokens("cpu", ref_tok, n_steps);
        print_tokens("graph", gpu_tok, n_steps);
        print_tokens("eager", eager_tok, n_steps);
    }
    CHECK_MSG(half_rel <= TOL_F16, "%s: fp16-KV logits differ from the CPU by %.3g x max|logit| "
                                   "(tolerance %g)",
              name, half_rel, TOL_F16);
    CHECK_STR_CONTAINS(kernels, "w2a8_gemv");
    CHECK_STR_CONTAINS(kernels, "w2a8_gemm");
    /* The decode attention merges through a cluster wherever the device
     * has them (bn_cb_attn_decode_cluster), else through its ticket. */
    const bn_hparams *hp = bn_checkpoint_hparams(m);
    const bn_cb_attn_shape as = {hp->n_head, hp->n_head_kv, hp->head_dim, 64};
    const char *attn = !bn_cb_attn_decode_cluster(&as, 0) ? "attention_decode_f32"
                       : form.attn_qkv                 ? "attention_decode_f32_cluster_qkv"
                                                       : "attention_decode_f32_cluster";
    CHECK_MSG(has_kernel(kernels, attn), "%s: %s did not run (%s)", name, attn, kernels);
    CHECK_STR_CONTAINS(kernels, "attention_prefill_f32");
    CHECK_STR_CONTAINS(kernels, "cuda_graph_replay");
    CHECK_STR_CONTAINS(kernels, "argmax");
out:
    bn_cuda_backend_free(b);
    bn_checkpoint_free(m);
    free(ref), free(eager), free(graph), free(half);
}

/* ---- other shapes and paths ------------------------------------------------------ */

/* Logits after a prompt of n tokens and `steps` forced decode steps, GPU vs
 * CPU; returns the worst relative difference. */
/* The CPU and the GPU over the same prompt and forced steps: returns the
 * worst relative logit difference (rel_diff), counts the steps whose
 * argmaxes differ, and (swap_margin, may be NULL) the largest gap, relative
 * as in rel_diff, between the CPU's best logit and the CPU's logit of the
 * GPU's choice at those steps (-1 where none differs). */
static double compare_run(const char *what, const bn_checkpoint *m, bn_cuda_backend *b,
                          const int32_t *tokens, int n_prompt, int steps, int *argmax_diff,
                          double *swap_margin)
{
    const int32_t V = bn_checkpoint_hparams(m)->vocab;
    float *a = malloc((size_t)V * sizeof(float)), *g = malloc((size_t)V * sizeof(float));
    bn_cpu_backend *c = NULL;
    bn_error err;
    bn_error_clear(&err);
    double worst = -1.0;
    *argmax_diff = 0;
    if (swap_margin)
        *swap_margin = -1.0;
    CHECK_MSG(bn_cpu_backend_create(m, bn_cuda_backend_kv_len(b), 0, &c, &err) == BN_OK,
              "%s: cpu create: %s", what, err.message);
    bn_cuda_backend_reset(b);
    for (int s = 0; c && s <= steps; s++) {
        const int32_t *t = s == 0 ? tokens : tokens + n_prompt + s - 1;
        const int64_t n = s == 0 ? n_prompt : 1, pos = s == 0 ? 0 : n_prompt + s - 1;
        const bool ok = bn_cpu_backend_forward(c, t, n, pos, BN_LOGITS_LAST, a, &err) == BN_OK &&
                        bn_cuda_backend_forward(b, t, n, pos, g, &err) == BN_OK;
        CHECK_MSG(ok, "%s: forward at %lld: %s", what, (long long)pos, err.message);
        if (!ok)
            break;
        worst = fmax(worst, rel_diff(a, g, V));
        const int32_t ta = argmax(a, V), tg = argmax(g, V);
        if (ta != tg) {
            ++*argmax_diff;
            if (swap_margin)
                *swap_margin = fmax(*swap_margin, (a[ta] - a[tg]) / fmax(1.0, max_abs(a, V)));
        }
    }
    bn_cpu_backend_free(c);
    free(a);
    free(g);
    return worst;
}

/* ---- the backend's work counters --------------------------------------------- */

/* bn_cuda_backend_work: the uploads at creation are counted (at least the
 * weights, embedding and norms), a pass that returns logits copies exactly
 * the vocabulary's floats back, a greedy pass a token, and a decode step
 * counts the same kernels replayed from the graph as launched eagerly. */
static void check_work(void)
{
    bn_checkpoint *m = load_fixture("hf_packed");
    if (!m)
        return;
    const int32_t V = bn_checkpoint_hparams(m)->vocab;
    bn_cuda_backend *b = make_cuda(m, 0, BN_CUDA_KV_F32, 0);
    float *logits = malloc((size_t)V * sizeof(float));
    if (b && logits) {
        bn_error err;
        bn_error_clear(&err);
        bn_cuda_memory mem;
        bn_cuda_backend_memory(b, &mem);
        bn_cuda_work w0, w1, w2, w3;
        bn_cuda_backend_work(b, &w0);
        CHECK_MSG(w0.h2d_bytes >= mem.weights + mem.embedding + mem.norms &&
                      w0.kernel_launches > 0,
                  "uploads at creation: %llu bytes counted for %llu of weights, embedding and "
                  "norms; %llu launches",
                  (unsigned long long)w0.h2d_bytes,
                  (unsigned long long)(mem.weights + mem.embedding + mem.norms),
                  (unsigned long long)w0.kernel_launches);
        bn_cuda_backend_reset(b);
        CHECK(bn_cuda_backend_forward(b, PROMPT, PROMPT_LEN, 0, logits, &err) == BN_OK);
        bn_cuda_backend_work(b, &w1);
        CHECK(w1.d2h_transfers == w0.d2h_transfers + 1 &&
              w1.d2h_bytes == w0.d2h_bytes + (uint64_t)V * sizeof(float));
        CHECK(w1.kernel_launches > w0.kernel_launches && w1.h2d_bytes > w0.h2d_bytes);
        /* One decode step eagerly, the same step from the graph. */
        int32_t next = -1;
        bn_cuda_backend_set_graphs(b, false);
        CHECK(bn_cuda_backend_forward_greedy(b, PROMPT, 1, PROMPT_LEN, &next, &err) == BN_OK);
        bn_cuda_backend_work(b, &w2);
        bn_cuda_backend_set_graphs(b, true);
        CHECK(bn_cuda_backend_forward_greedy(b, PROMPT, 1, PROMPT_LEN, &next, &err) == BN_OK);
        bn_cuda_backend_work(b, &w3);
        const uint64_t eager = w2.kernel_launches - w1.kernel_launches,
                       graph = w3.kernel_launches - w2.kernel_launches;
        CHECK_MSG(bn_cuda_backend_graphs(b) && eager == graph && eager > 0,
                  "a decode step counted %llu launches eagerly, %llu from the graph",
                  (unsigned long long)eager, (unsigned long long)graph);
        CHECK(w3.d2h_transfers == w2.d2h_transfers + 1 && w3.d2h_bytes - w2.d2h_bytes <= 8);
        printf("work counters: uploads %.1f KiB at creation; a decode step %llu kernels "
               "(eager and graph alike)\n",
               (double)w0.h2d_bytes / 1024.0, (unsigned long long)eager);
    }
    free(logits);
    if (b)
        bn_cuda_backend_free(b);
    bn_checkpoint_free(m);
}

/* ---- every projection encoding -------------------------------------------------- */

/* i2s.gguf rewritten in another projection encoding the loader reads
 * (repack_gguf.h: TQ2_0 with upstream .scale tensors, F16 with a separate
 * output head and a rope_freqs tensor that must be ignored, F32, TL1, TL2;
 * index: which of test_encodings, one unit of BN_TEST_PART each), run on
 * the GPU against the CPU on the same file: teacher-forced logits within
 * TOL_F32 with the same argmax, and the device's greedy tokens (graph
 * replay) the CPU's. */
static void check_encoding(int index)
{
    char dir[512], src[1024], dst[1024];
    snprintf(dir, sizeof dir, "%s/bitnet_test_cuda_enc_XXXXXX",
             getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
    if (!mkdtemp(dir)) {
        CHECK_MSG(false, "mkdtemp %s: %s", dir, strerror(errno));
        return;
    }
    snprintf(src, sizeof src, "%s/i2s.gguf", data_dir);
    snprintf(dst, sizeof dst, "%s/repacked.gguf", dir);
    printf("i2s.gguf re-encoded, the GPU against the CPU on the same file:\n");
    do {
        const test_encoding *enc = &test_encodings[index];
        if (!test_write_repacked_gguf(src, dst, enc->type, enc->scale_suffix, enc->extras)) {
            printf("  %-34s skipped (shape not supported by the format)\n", enc->label);
            CHECK(enc->type == BN_QTYPE_TL1 || enc->type == BN_QTYPE_TL2);
            unlink(dst);
            break;
        }
        bn_checkpoint *m = NULL;
        bn_error err;
        bn_error_clear(&err);
        CHECK_MSG(bn_checkpoint_load(dst, &m, &err) == BN_OK, "%s: load: %s", enc->label,
                  err.message);
        const int32_t V = m ? bn_checkpoint_hparams(m)->vocab : 0;
        float *ref = m ? malloc(N_STEPS * (size_t)V * sizeof(float)) : NULL;
        float *gpu = m ? malloc(N_STEPS * (size_t)V * sizeof(float)) : NULL;
        int32_t ref_tok[N_STEPS], dev_tok[N_STEPS];
        memset(dev_tok, 0, sizeof dev_tok);
        bn_cuda_backend *b = NULL;
        if (ref && gpu && cpu_greedy(m, PROMPT, PROMPT_LEN, ref_tok, ref))
            b = make_cuda(m, 0, BN_CUDA_KV_F32, 0);
        if (b) {
            bn_cuda_backend_set_graphs(b, false);
            bn_cuda_backend_reset(b);
            const bool forced = teacher_forced(b, ref_tok, V, gpu, &err);
            CHECK_MSG(forced, "%s: gpu forward: %s", enc->label, err.message);
            double worst = 0.0;
            int argmax_diff = 0;
            for (int s = 0; forced && s < n_steps; s++) {
                const double r = rel_diff(ref + (size_t)s * V, gpu + (size_t)s * V, V);
                worst = r > worst || r != r ? r : worst;
                argmax_diff += argmax(gpu + (size_t)s * V, V) != ref_tok[s];
            }
            CHECK_MSG(worst <= TOL_F32, "%s: logits differ from the CPU's by %.3g x max|logit|",
                      enc->label, worst);
            CHECK_MSG(argmax_diff == 0, "%s: argmax differs from the CPU's at %d of %d steps",
                      enc->label, argmax_diff, n_steps);
            const bool greedy = device_greedy(b, true, dev_tok, &err);
            CHECK_MSG(greedy, "%s: gpu greedy: %s", enc->label, err.message);
            const bool same = greedy && memcmp(dev_tok, ref_tok, (size_t)n_steps * 4) == 0;
            CHECK_MSG(same, "%s: the device's greedy tokens differ from the CPU's", enc->label);
            if (!same) {
                print_tokens("cpu", ref_tok, n_steps);
                print_tokens("gpu", dev_tok, n_steps);
            }
            printf("  %-34s logits within %.2e x max|logit| of the CPU's, %d greedy tokens %s\n",
                   enc->label, worst, n_steps, same ? "the CPU's" : "DIFFER");
            bn_cuda_backend_free(b);
        }
        free(ref);
        free(gpu);
        bn_checkpoint_free(m);
        unlink(dst);
    } while (0);
    rmdir(dir);
}

/* Prefill in chunks of 3 against one chunk, and both against the CPU, on a
 * prompt long enough to cross several chunk boundaries. */
static void check_chunks(void)
{
    bn_checkpoint *m = load_fixture("hf_packed");
    if (!m)
        return;
    const int32_t V = bn_checkpoint_hparams(m)->vocab;
    int32_t tokens[48];
    for (int i = 0; i < 48; i++)
        tokens[i] = (int32_t)((i * 37 + 11) % V);
    bn_cuda_backend *one = make_cuda(m, 64, BN_CUDA_KV_F32, 0);
    bn_cuda_backend *three = make_cuda(m, 64, BN_CUDA_KV_F32, 3);
    float *a = malloc((size_t)V * sizeof(float)), *b = malloc((size_t)V * sizeof(float));
    bn_error err;
    if (one && three) {
        CHECK(bn_cuda_backend_forward(one, tokens, 40, 0, a, &err) == BN_OK);
        CHECK(bn_cuda_backend_forward(three, tokens, 40, 0, b, &err) == BN_OK);
        const double d = rel_diff(a, b, V);
        int ad;
        const double vs_cpu = compare_run("chunks of 3", m, three, tokens, 40, 6, &ad, NULL);
        printf("prefill chunks: 40 tokens in chunks of 3 vs one chunk rel %.2e; chunked run vs "
               "cpu (prompt + 6 steps) worst rel %.2e, argmax differs at %d\n",
               d, vs_cpu, ad);
        CHECK_MSG(d <= TOL_F32, "chunked prefill differs by %.3g", d);
        CHECK_MSG(vs_cpu >= 0.0 && vs_cpu <= TOL_F32, "chunked run vs cpu %.3g", vs_cpu);
    }
    bn_cuda_backend_free(one);
    bn_cuda_backend_free(three);
    free(a);
    free(b);
    bn_checkpoint_free(m);
}

/* The stage profiles bench e2e prints: a prefill chunk and a decode step,
 * each with CUDA events around its stages, leave the backend as the same
 * passes run plainly would (the next step's logits bit for bit), and
 * refuse what is not one chunk or not a reachable position. */
static void check_profile(void)
{
    bn_checkpoint *m = load_fixture("hf_packed");
    if (!m)
        return;
    const int32_t V = bn_checkpoint_hparams(m)->vocab;
    int32_t tokens[42];
    for (int i = 0; i < 42; i++)
        tokens[i] = (int32_t)((i * 53 + 7) % V);
    bn_cuda_backend *b = make_cuda(m, 64, BN_CUDA_KV_F32, 0);
    float *ref = malloc((size_t)V * sizeof(float)), *got = malloc((size_t)V * sizeof(float));
    bn_error err;
    bn_error_clear(&err);
    if (b && ref && got) {
        bool ok = bn_cuda_backend_forward(b, tokens, 40, 0, ref, &err) == BN_OK &&
                  bn_cuda_backend_forward(b, tokens + 40, 1, 40, ref, &err) == BN_OK &&
                  bn_cuda_backend_forward(b, tokens + 41, 1, 41, ref, &err) == BN_OK;
        CHECK_MSG(ok, "profile: plain run: %s", err.message);
        bn_cuda_backend_reset(b);
        bn_cuda_stage_times pt, dt;
        ok = ok && bn_cuda_backend_forward(b, tokens, 40, 0, got, &err) == BN_OK &&
             bn_cuda_backend_profile_prefill(b, tokens, 40, 0, 3, &pt, &err) == BN_OK &&
             bn_cuda_backend_forward(b, tokens + 40, 1, 40, got, &err) == BN_OK &&
             bn_cuda_backend_profile_decode(b, tokens[41], 41, 3, &dt, &err) == BN_OK;
        CHECK_MSG(ok, "profile: %s", err.message);
        if (ok) {
            CHECK(bn_cuda_backend_kv_filled(b) == 42);
            CHECK(bn_cuda_backend_forward(b, tokens + 41, 1, 41, got, &err) == BN_OK);
            CHECK_MSG(memcmp(ref, got, (size_t)V * sizeof(float)) == 0,
                      "profile: the step after the profiles differs from a plain run's");
            const bn_cuda_stage_times *t[2] = {&pt, &dt};
            for (int k = 0; k < 2; k++) {
                double sum = 0.0;
                for (int s = 0; s < BN_CUDA_STAGE_COUNT; s++) {
                    CHECK(t[k]->ms[s] >= 0.0 && t[k]->launches[s] >= 0);
                    sum += t[k]->ms[s];
                }
                const int layers = bn_checkpoint_hparams(m)->n_layer;
                printf("profile (%s): %.1f us, stages summed %.1f us, attention launches %d\n",
                       k ? "decode step" : "prefill chunk of 40", 1000.0 * t[k]->total_ms,
                       1000.0 * sum, t[k]->launches[BN_CUDA_STAGE_ATTENTION]);
                CHECK(t[k]->total_ms > 0.0 && sum <= t[k]->total_ms * 1.001 + 1e-6);
                /* A decode step's first norm reads the embedding row
                 * itself where the table's type allows. */
                char list[1024];
                bn_cuda_backend_kernels(b, list, sizeof list);
                const bool fused = k == 1 && has_kernel(list, "embed_norm_quantize");
                CHECK(t[k]->launches[BN_CUDA_STAGE_EMBED] == (fused ? 0 : 1));
                CHECK(t[k]->launches[BN_CUDA_STAGE_ATTN_NORM] >= 1);
                CHECK(t[k]->launches[BN_CUDA_STAGE_ATTENTION] >= layers);
                CHECK(t[k]->launches[BN_CUDA_STAGE_DOWN] >= layers);
            }
        }
        /* Not one chunk (1 token, more than the chunk), a skipped position. */
        bn_cuda_stage_times t;
        CHECK(bn_cuda_backend_profile_prefill(b, tokens, 1, 0, 1, &t, &err) ==
              BN_ERR_INVALID_ARGUMENT);
        CHECK(bn_cuda_backend_profile_prefill(b, tokens, 65, 0, 1, &t, &err) ==
              BN_ERR_INVALID_ARGUMENT);
        CHECK(bn_cuda_backend_profile_prefill(b, tokens, 2, 50, 1, &t, &err) ==
              BN_ERR_INVALID_ARGUMENT);
        CHECK(bn_cuda_backend_profile_prefill(b, tokens, 2, 0, 0, &t, &err) ==
              BN_ERR_INVALID_ARGUMENT);
    }
    bn_cuda_backend_free(b);
    free(ref);
    free(got);
    bn_checkpoint_free(m);
}

/* A shape where nothing fuses (q_dim 108, ffn 90: not whole 8-row tiles),
 * head_dim 36, RoPE over part of the head, an untied F16 head of width 100
 * (no 16-byte rows). */
static void check_ragged(void)
{
    bn_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.vocab = 301;
    hp.dim = 100;
    hp.ffn = 90;
    hp.n_layer = 2;
    hp.n_head = 3;
    hp.n_head_kv = 1;
    hp.head_dim = 36;
    hp.n_ctx_train = 96;
    hp.rope_dim = 20;
    hp.rms_eps = 1e-5f;
    hp.rope_theta = 10000.0f;
    hp.tied_embeddings = false;
    snprintf(hp.arch, sizeof hp.arch, "bitnet-b1.58");
    bn_checkpoint *m = NULL;
    bn_error err;
    CHECK_MSG(bn_checkpoint_create_random(&hp, 1234, &m, &err) == BN_OK, "random model: %s",
              err.message);
    if (!m)
        return;
    int32_t tokens[64];
    for (int i = 0; i < 64; i++)
        tokens[i] = (int32_t)((i * 53 + 7) % hp.vocab);
    bn_cuda_backend *b = make_cuda(m, 0, BN_CUDA_KV_F32, 16);
    if (b) {
        int ad;
        const double w = compare_run("ragged", m, b, tokens, 37, 20, &ad, NULL);
        printf("ragged shape (dim 100, ffn 90, heads 3/1 x 36, rope 20, untied): prompt 37 + 20 "
               "steps, worst rel %.2e, argmax differs at %d\n",
               w, ad);
        CHECK_MSG(w >= 0.0 && w <= TOL_F32, "ragged shape: logits differ by %.3g", w);
        bn_cuda_backend_free(b);
    }
    bn_checkpoint_free(m);
}

/* How far the CPU's own logits move when one embedding value changes by
 * its last bit (the same prompt and steps as compare_run): the scale of
 * rounding noise after the model has amplified it. An untrained 30-layer
 * model amplifies a 1-ulp change to percent-level logit changes (seen: 0.25 %
 * at once, 1.8 % three steps later), so fixed fp32 tolerances do not apply to
 * it; its GPU deviation is judged against this measured sensitivity. */
static double cpu_sensitivity(bn_checkpoint *m, const int32_t *tokens, int n_prompt, int steps)
{
    const int32_t V = bn_checkpoint_hparams(m)->vocab;
    float *a = malloc((size_t)V * (size_t)(steps + 1) * sizeof(float));
    float *b = malloc((size_t)V * (size_t)(steps + 1) * sizeof(float));
    double worst = -1.0;
    bn_error err;
    for (int pass = 0; pass < 2; pass++) {
        /* Flip the lowest bit of one value of the first prompt token's
         * embedding row (restored below). */
        const bn_dense_matrix *e = bn_checkpoint_embedding(m);
        unsigned char *row = (unsigned char *)e->data + (size_t)tokens[0] * e->row_bytes;
        if (pass == 1)
            row[10] ^= 1;
        bn_cpu_backend *c = NULL;
        bn_error_clear(&err);
        const int64_t kv = n_prompt + steps + 1 > 64 ? n_prompt + steps + 1 : 64;
        bool ok = bn_cpu_backend_create(m, kv, 0, &c, &err) == BN_OK;
        float *out = pass ? b : a;
        for (int s = 0; ok && s <= steps; s++) {
            const int32_t *t = s == 0 ? tokens : tokens + n_prompt + s - 1;
            const int64_t n = s == 0 ? n_prompt : 1, pos = s == 0 ? 0 : n_prompt + s - 1;
            ok = bn_cpu_backend_forward(c, t, n, pos, BN_LOGITS_LAST, out + (size_t)s * V,
                                        &err) == BN_OK;
        }
        CHECK_MSG(ok, "cpu sensitivity run: %s", err.message);
        bn_cpu_backend_free(c);
        if (pass == 1)
            row[10] ^= 1;
        if (!ok)
            break;
        if (pass == 1)
            for (int s = 0; s <= steps; s++)
                worst = fmax(worst, rel_diff(a + (size_t)s * V, b + (size_t)s * V, V));
    }
    free(a);
    free(b);
    return worst;
}

/* The real 2B-4T shape with random weights: a few decode steps, after a
 * short prompt (one attention range; the prefill attention in one part),
 * after a long one (several ranges of 32 positions, merged by the last
 * block: 4 query heads per block; the prefill attention in two parts), the
 * long one also graph against eager, bit for bit, and after a longer one
 * (the prefill attention in four parts). */
static void check_2b4t(void)
{
    bn_hparams hp;
    bn_hparams_2b4t(&hp);
    bn_checkpoint *m = NULL;
    bn_error err;
    const double t0 = bn_time_seconds();
    CHECK_MSG(bn_checkpoint_create_random(&hp, 1, &m, &err) == BN_OK, "2b4t model: %s",
              err.message);
    if (!m)
        return;
    bn_cuda_backend *b = make_cuda(m, 256, BN_CUDA_KV_F32, 0);
    const double t1 = bn_time_seconds();
    if (b) {
        enum { LONG_PROMPT = 72, LONG_STEPS = 3, LONGER_PROMPT = 200 };
        int32_t tokens[LONGER_PROMPT + LONG_STEPS];
        for (int i = 0; i < LONGER_PROMPT + LONG_STEPS; i++)
            tokens[i] = (int32_t)((i * 7919 + 128000) % hp.vocab);
        const int runs[3][2] = {{8, 4}, {LONG_PROMPT, LONG_STEPS}, {LONGER_PROMPT, 2}};
        for (int r = 0; r < 3; r++) {
            const int np = runs[r][0], ns = runs[r][1];
            int ad;
            double margin;
            const double w = compare_run("2b4t", m, b, tokens, np, ns, &ad, &margin);
            const double sens = cpu_sensitivity(m, tokens, np, ns);
            if (r == 0) {
                bn_cuda_memory mem;
                bn_cuda_backend_memory(b, &mem);
                printf("2B-4T shape (random weights): cuda backend built in %.1f s (%.0f MiB on "
                       "%s)\n",
                       t1 - t0, (double)mem.total / 1048576.0, bn_cuda_backend_device_name(b));
            }
            printf("2B-4T: prompt %d + %d steps vs cpu worst rel %.2e, argmax differs at %d "
                   "steps (the cpu's margin over the gpu's choice there: %.2e); the cpu's own "
                   "change for a 1-ulp input change: %.2e\n",
                   np, ns, w, ad, margin, sens);
            /* Bounded: the deviation is of the size rounding noise reaches
             * in this (chaotic, untrained) model, within 10x of what one
             * last-bit input change does on the CPU. The same token at every
             * step, but for a near tie: the GPU may pick another token only
             * where the CPU's own logits rank the two closer than a last-bit
             * change of its input moves them. */
            CHECK_MSG(ad == 0 || (margin >= 0.0 && margin <= sens),
                      "2b4t: the gpu's argmax differs from the cpu's at %d steps, where the "
                      "cpu's best logit leads the gpu's choice by %.3g (relative), more than "
                      "the cpu's 1-ulp sensitivity %.3g",
                      ad, margin, sens);
            CHECK_MSG(w >= 0.0 && sens > 0.0 && w <= 10.0 * sens,
                      "2b4t: logits differ by %.3g, more than 10x the cpu's 1-ulp sensitivity "
                      "%.3g",
                      w, sens);
        }
        /* Graph against eager after the long prompt: the ranges' merge does
         * not depend on which block finishes last. */
        float *out[2];
        for (int pass = 0; pass < 2; pass++)
            out[pass] = malloc((size_t)hp.vocab * sizeof(float));
        for (int pass = 0; pass < 2 && out[0] && out[1]; pass++) {
            bn_cuda_backend_set_graphs(b, pass == 0);
            bn_cuda_backend_reset(b);
            bool ok = bn_cuda_backend_forward(b, tokens, LONG_PROMPT, 0, out[pass], &err) == BN_OK;
            for (int s = 0; ok && s < LONG_STEPS; s++)
                ok = bn_cuda_backend_forward(b, tokens + LONG_PROMPT + s, 1, LONG_PROMPT + s,
                                             out[pass], &err) == BN_OK;
            CHECK_MSG(ok, "2b4t: gpu forward (%s): %s", pass ? "eager" : "graph", err.message);
        }
        bn_cuda_backend_set_graphs(b, true);
        if (out[0] && out[1])
            CHECK_MSG(memcmp(out[0], out[1], (size_t)hp.vocab * sizeof(float)) == 0,
                      "2b4t: graph and eager logits differ after %d positions",
                      LONG_PROMPT + LONG_STEPS);
        free(out[0]);
        free(out[1]);
        /* The default screens this head (656 MB): greedy steps from the
         * long prompt give the tokens of the full head's argmax. */
        bn_cuda_decode_form form;
        bn_cuda_backend_decode_form(b, &form);
        CHECK_MSG(form.head_screen, "2b4t: the default does not screen the head");
        enum { GREEDY_STEPS = 16 };
        int32_t scr[GREEDY_STEPS], full[GREEDY_STEPS];
        int64_t kept_max = 0;
        bn_cuda_backend_reset(b);
        bool ok = bn_cuda_backend_forward_greedy(b, tokens, LONG_PROMPT, 0, &scr[0], &err) ==
                  BN_OK;
        for (int s = 1; ok && s < GREEDY_STEPS; s++) {
            int64_t kept = 0;
            ok = bn_cuda_backend_head_kept(b, &kept, &err) == BN_OK &&
                 bn_cuda_backend_submit_greedy(b, scr[s - 1], LONG_PROMPT + s - 1, &err) ==
                     BN_OK &&
                 bn_cuda_backend_wait_greedy(b, &scr[s], &err) == BN_OK;
            kept_max = kept > kept_max ? kept : kept_max;
        }
        CHECK_MSG(ok, "2b4t: screened greedy: %s", err.message);
        /* The full head's argmax over the same positions, fed the same tokens. */
        float *l = malloc((size_t)hp.vocab * sizeof(float));
        bn_cuda_backend_reset(b);
        ok = ok && l && bn_cuda_backend_forward(b, tokens, LONG_PROMPT, 0, l, &err) == BN_OK;
        if (ok)
            full[0] = argmax(l, hp.vocab);
        for (int s = 1; ok && s < GREEDY_STEPS; s++) {
            ok = bn_cuda_backend_forward(b, &scr[s - 1], 1, LONG_PROMPT + s - 1, l, &err) == BN_OK;
            if (ok)
                full[s] = argmax(l, hp.vocab);
        }
        CHECK_MSG(ok, "2b4t: full-head steps: %s", err.message);
        if (ok)
            CHECK_MSG(memcmp(scr, full, sizeof scr) == 0,
                      "2b4t: greedy tokens with the screened head differ from the full head's");
        printf("2B-4T: %d greedy steps with the screened head: %s the full head's argmax; at "
               "most %lld of %d rows computed in full\n",
               GREEDY_STEPS, ok && memcmp(scr, full, sizeof scr) == 0 ? "as" : "NOT as",
               (long long)kept_max, (int)hp.vocab);
        free(l);
        bn_cuda_backend_free(b);
    }
    bn_checkpoint_free(m);
}

/* ---- errors and memory ------------------------------------------------------------ */

static void check_errors(void)
{
    bn_checkpoint *m = load_fixture("i2s.gguf");
    if (!m)
        return;
    const int32_t V = bn_checkpoint_hparams(m)->vocab;
    float *logits = malloc((size_t)V * sizeof(float));
    bn_error err;
    bn_cuda_backend_options o;
    bn_cuda_backend *b = NULL;

    bn_cuda_backend_options_default(&o);
    o.kv_len = bn_checkpoint_hparams(m)->n_ctx_train + 1;
    CHECK(bn_cuda_backend_create(m, &o, &b, &err) == BN_ERR_INVALID_ARGUMENT && !b);
    bn_cuda_backend_options_default(&o);
    o.kv_type = (bn_cuda_kv_type)7;
    CHECK(bn_cuda_backend_create(m, &o, &b, &err) == BN_ERR_INVALID_ARGUMENT && !b);
    CHECK_STR_CONTAINS(err.message, "KV cache type");
    bn_cuda_backend_options_default(&o);
    o.prefill_chunk = -1;
    CHECK(bn_cuda_backend_create(m, &o, &b, &err) == BN_ERR_INVALID_ARGUMENT && !b);

    /* An impossible limit: out of memory, named, and the device still works. */
    bn_cuda_backend_options_default(&o);
    o.memory_limit = 1 << 20;
    const bn_status st = bn_cuda_backend_create(m, &o, &b, &err);
    printf("1 MiB limit: %s: %s | hint: %s\n", bn_status_str(st), err.message, err.hint);
    CHECK(st == BN_ERR_GPU_OUT_OF_MEMORY && !b);
    CHECK_STR_CONTAINS(err.message, "BITNET_MEMORY_LIMIT");
    CHECK_STR_CONTAINS(err.message, "KV cache");

    b = make_cuda(m, 0, BN_CUDA_KV_F32, 0);
    if (!b)
        goto out;
    bn_cuda_memory mem;
    bn_cuda_backend_memory(b, &mem);
    CHECK(mem.total > mem.kv_cache && mem.kv_cache > 0 && mem.peak >= mem.total);
    /* A limit that needs a shorter context: the hint says which fits. */
    const uint64_t limit = mem.total - mem.kv_cache / 2;
    const int64_t kv_len = bn_cuda_backend_kv_len(b);
    CHECK(bn_cuda_backend_forward(b, PROMPT, PROMPT_LEN, 0, logits, &err) == BN_OK);
    /* Misuse is refused with nothing computed. */
    CHECK(bn_cuda_backend_forward(b, PROMPT, 1, PROMPT_LEN + 1, logits, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "skip");
    const int32_t bad = V;
    CHECK(bn_cuda_backend_forward(b, &bad, 1, 0, logits, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cuda_backend_forward(b, PROMPT, PROMPT_LEN, kv_len - 4, logits, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    int32_t next;
    CHECK(bn_cuda_backend_wait_greedy(b, &next, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cuda_backend_submit_chained(b, NULL, 0.0, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "submitted step");
    CHECK(bn_cuda_backend_submit_greedy(b, 5, PROMPT_LEN, &err) == BN_OK);
    CHECK(bn_cuda_backend_forward(b, PROMPT, 1, 0, logits, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cuda_backend_submit_greedy(b, 5, PROMPT_LEN + 1, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cuda_backend_submit_chained(b, NULL, 0.0, &err) == BN_OK);
    CHECK(bn_cuda_backend_submit_chained(b, NULL, 0.0, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cuda_backend_pending(b) == 2);
    CHECK(bn_cuda_backend_wait_greedy(b, &next, &err) == BN_OK && next >= 0 && next < V);
    CHECK(bn_cuda_backend_kv_filled(b) == PROMPT_LEN + 1);
    CHECK(bn_cuda_backend_wait_greedy(b, &next, &err) == BN_OK && next >= 0 && next < V);
    CHECK(bn_cuda_backend_kv_filled(b) == PROMPT_LEN + 2);
    /* A chained step past the cache: refused, the step before it kept. */
    {
        int32_t *fill = calloc((size_t)kv_len, sizeof *fill);
        CHECK(fill && bn_cuda_backend_forward(b, fill, kv_len - 1, 0, logits, &err) == BN_OK);
        CHECK(bn_cuda_backend_submit_greedy(b, 5, kv_len - 1, &err) == BN_OK);
        CHECK(bn_cuda_backend_submit_chained(b, NULL, 0.0, &err) == BN_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(err.message, "KV cache");
        CHECK(bn_cuda_backend_pending(b) == 1);
        CHECK(bn_cuda_backend_wait_greedy(b, &next, &err) == BN_OK && next >= 0 && next < V);
        CHECK(bn_cuda_backend_kv_filled(b) == kv_len);
        free(fill);
    }
    bn_cuda_backend_free(b);
    /* A chained step that fails (the third call of a fresh backend): both
     * steps' positions forgotten, and the backend goes on. */
    b = make_cuda(m, 0, BN_CUDA_KV_F32, 0);
    if (!b)
        goto out;
    bn_cuda_backend_fail_at(b, 3);
    CHECK(bn_cuda_backend_forward(b, PROMPT, PROMPT_LEN, 0, logits, &err) == BN_OK);
    CHECK(bn_cuda_backend_submit_greedy(b, 5, PROMPT_LEN, &err) == BN_OK);
    CHECK(bn_cuda_backend_submit_chained(b, NULL, 0.0, &err) == BN_ERR_GPU);
    CHECK(bn_cuda_backend_pending(b) == 0 && bn_cuda_backend_kv_filled(b) == PROMPT_LEN);
    CHECK(bn_cuda_backend_wait_greedy(b, &next, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cuda_backend_submit_greedy(b, 5, PROMPT_LEN, &err) == BN_OK);
    CHECK(bn_cuda_backend_wait_greedy(b, &next, &err) == BN_OK && next >= 0 && next < V);
    bn_cuda_backend_free(b);
    b = NULL;

    bn_cuda_backend_options_default(&o);
    o.memory_limit = limit;
    CHECK(bn_cuda_backend_create(m, &o, &b, &err) == BN_ERR_GPU_OUT_OF_MEMORY);
    printf("limit of %.2f MiB: %s | hint: %s\n", (double)limit / 1048576.0, err.message, err.hint);
    const char *ctx = strstr(err.hint, "--ctx ");
    CHECK_MSG(ctx != NULL, "the hint names --ctx: %s", err.hint);
    if (ctx) {
        o.kv_len = atoll(ctx + 6);
        CHECK_MSG(o.kv_len > 0 && o.kv_len < kv_len, "suggested context %lld", (long long)o.kv_len);
        const bn_status fit = bn_cuda_backend_create(m, &o, &b, &err);
        CHECK_MSG(fit == BN_OK, "the suggested --ctx %lld does not fit: %s", (long long)o.kv_len,
                  err.message);
        if (b)
            CHECK(bn_cuda_backend_forward(b, PROMPT, PROMPT_LEN, 0, logits, &err) == BN_OK);
    }
out:
    bn_cuda_backend_free(b);
    free(logits);
    bn_checkpoint_free(m);
}

/* ---- the engine ------------------------------------------------------------------- */

typedef struct engine_run {
    bn_status open, gen;
    bn_error err;
    int32_t tokens[N_STEPS];
    size_t n_tokens;
    bn_engine_info info;
    char startup[512];
    char receipt[16384];
} engine_run;

/* sampling NULL: greedy. */
static void run_engine_sampled(const char *fixture, const char *device, bool strict,
                               uint64_t limit, int fail_call, const bn_sampler_params *sampling,
                               engine_run *r)
{
    memset(r, 0, sizeof *r);
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", data_dir, fixture);
    bn_config cfg;
    bn_config_defaults(&cfg);
    cfg.strict_mode = strict;
    cfg.memory_limit_bytes = limit;
    bn_engine_options eo = {.model_path = path, .device = device,
                            .test_cuda_fail_call = fail_call};
    bn_engine *e = NULL;
    r->open = bn_engine_open(&cfg, &eo, &e, &r->err);
    r->gen = BN_ERR_INTERNAL;
    if (r->open != BN_OK)
        return;
    snprintf(r->startup, sizeof r->startup, "%s", bn_engine_startup_line(e));
    bn_generate_request req = {.prompt_tokens = PROMPT,
                               .n_prompt_tokens = PROMPT_LEN,
                               .n_predict = (size_t)n_steps,
                               .ignore_eog = true};
    bn_sampler_params_default(&req.sampling); /* greedy */
    if (sampling)
        req.sampling = *sampling;
    bn_generation g;
    r->gen = bn_engine_generate(e, &req, &g, &r->err);
    if (r->gen == BN_OK) {
        r->n_tokens = g.n_tokens < (size_t)n_steps ? g.n_tokens : (size_t)n_steps;
        memcpy(r->tokens, g.tokens, r->n_tokens * sizeof(int32_t));
        FILE *f = tmpfile();
        if (f) {
            bn_receipt_info ri = {.command = "test", .req = &req, .gen = &g};
            CHECK(bn_engine_write_receipt(e, &ri, f, NULL) == BN_OK);
            rewind(f);
            const size_t n = fread(r->receipt, 1, sizeof r->receipt - 1, f);
            r->receipt[n] = '\0';
            fclose(f);
        }
        bn_generation_free(&g);
    }
    bn_engine_get_info(e, &r->info);
    bn_engine_free(e);
}

static void run_engine(const char *fixture, const char *device, bool strict, uint64_t limit,
                       int fail_call, engine_run *r)
{
    run_engine_sampled(fixture, device, strict, limit, fail_call, NULL, r);
}

/* ---- sampling on the device -------------------------------------------------- */

/* The device's sampled token against the CPU sampler on the same logits
 * (sample_cuda.h: equal given the same uniform number, unless it lands
 * within ~1e-7 of a boundary between two tokens): at every step of a run
 * the GPU's logits go to the CPU sampler, whose next uniform number the
 * device's pick then gets, by forward_sample and by submit / wait (graph);
 * unsupported requests are refused and leave the backend usable; the
 * engine samples on the device (its receipt names the kernel) and gives
 * the CPU run's tokens for the same seed. */
static void check_sampling_on(bn_checkpoint *m, bool screened, bool copy_tokens, int piece);
static void check_sampling_engine(void);

/* The sampling checks, one unit of BN_TEST_PART each (racecheck runs a
 * unit in minutes): for each of the four backends - the full or the
 * screened head, tokens stored by the kernels or copied - the greedy picks
 * with the refused requests (piece 0), then each of the four settings of
 * SAMPLE_SETTINGS (pieces 1-4); last, the engine's sampled run. */
enum { SAMPLING_PIECES = 5, SAMPLING_UNITS = 4 * SAMPLING_PIECES + 1 };

static void check_sampling(int unit)
{
    if (unit == SAMPLING_UNITS - 1) {
        check_sampling_engine();
        return;
    }
    bn_checkpoint *m = load_fixture("i2s.gguf");
    if (!m)
        return;
    const int backend = unit / SAMPLING_PIECES;
    check_sampling_on(m, (backend & 1) != 0, (backend & 2) != 0, unit % SAMPLING_PIECES);
    bn_checkpoint_free(m);
}

/* The picks of a run from the prompt, fed the CPU's tokens, through
 * submit / wait, with the uniform numbers us: into out[n]. */
static bool picks_by_submit(bn_cuda_backend *b, const bn_cuda_sample_params *cp,
                            const double *us, const int32_t *cpu_tok, int32_t *out, int n,
                            bn_error *err)
{
    bn_cuda_backend_reset(b);
    bool ok =
        bn_cuda_backend_forward_sample(b, PROMPT, PROMPT_LEN, 0, cp, us[0], &out[0], err) == BN_OK;
    for (int t = 1; ok && t < n; t++)
        ok = bn_cuda_backend_submit_sample(b, cpu_tok[t - 1], PROMPT_LEN + t - 1, cp, us[t],
                                           err) == BN_OK &&
             bn_cuda_backend_wait_greedy(b, &out[t], err) == BN_OK;
    return ok;
}

/* The picks of a free-running run from the prompt into out[n], each step
 * fed the token the step before picked, chosen by cp (NULL: greedy) with
 * the uniform numbers us. chained: every step after the first decode step
 * is queued by submit_chained before the host has the token it reads (two
 * steps in flight); else submit / wait with the host's token. */
static bool picks_self_fed(bn_cuda_backend *b, const bn_cuda_sample_params *cp,
                           const double *us, bool chained, int32_t *out, int n, bn_error *err)
{
    bn_cuda_backend_reset(b);
    bool ok =
        bn_cuda_backend_forward_sample(b, PROMPT, PROMPT_LEN, 0, cp, us[0], &out[0], err) == BN_OK;
    if (!chained) {
        for (int t = 1; ok && t < n; t++)
            ok = bn_cuda_backend_submit_sample(b, out[t - 1], PROMPT_LEN + t - 1, cp, us[t],
                                               err) == BN_OK &&
                 bn_cuda_backend_wait_greedy(b, &out[t], err) == BN_OK;
        return ok;
    }
    ok = ok && (n < 2 || bn_cuda_backend_submit_sample(b, out[0], PROMPT_LEN, cp, us[1], err) ==
                             BN_OK);
    for (int t = 1; ok && t < n; t++) {
        if (t + 1 < n)
            ok = bn_cuda_backend_submit_chained(b, cp, us[t + 1], err) == BN_OK &&
                 bn_cuda_backend_pending(b) == 2;
        ok = ok && bn_cuda_backend_wait_greedy(b, &out[t], err) == BN_OK;
    }
    CHECK(!ok || (bn_cuda_backend_pending(b) == 0 &&
                  bn_cuda_backend_kv_filled(b) == PROMPT_LEN + n - 1));
    return ok;
}

/* Chained steps pick what submit / wait picks (greedy: cp NULL), graph or
 * eager as set; what: the case, for the messages. */
static void check_chained(bn_cuda_backend *b, const bn_cuda_sample_params *cp, const double *us,
                          const char *what)
{
    int32_t plain[N_STEPS], chain[N_STEPS];
    bn_error err;
    bn_error_clear(&err);
    bool ok = picks_self_fed(b, cp, us, false, plain, n_steps, &err);
    CHECK_MSG(ok, "%s, submit/wait: %s", what, err.message);
    ok = ok && picks_self_fed(b, cp, us, true, chain, n_steps, &err);
    CHECK_MSG(ok, "%s, chained: %s", what, err.message);
    const bool same = ok && memcmp(plain, chain, (size_t)n_steps * sizeof(int32_t)) == 0;
    CHECK_MSG(same, "%s: chained picks differ from submit/wait's", what);
    if (ok && !same) {
        print_tokens("submit/wait", plain, n_steps);
        print_tokens("chained", chain, n_steps);
    }
    /* A chained step dropped when the token before it ends the run: its
     * position is forgotten and decoding goes on from there. */
    int32_t t1 = -1, t2 = -1;
    bn_cuda_backend_reset(b);
    ok = ok && bn_cuda_backend_forward_sample(b, PROMPT, PROMPT_LEN, 0, cp, us[0], &t1, &err) ==
                   BN_OK;
    ok = ok && bn_cuda_backend_submit_sample(b, t1, PROMPT_LEN, cp, us[1], &err) == BN_OK &&
         bn_cuda_backend_submit_chained(b, cp, us[2], &err) == BN_OK &&
         bn_cuda_backend_wait_greedy(b, &t1, &err) == BN_OK && bn_cuda_backend_pending(b) == 1 &&
         bn_cuda_backend_drop_pending(b, &err) == BN_OK && bn_cuda_backend_pending(b) == 0 &&
         bn_cuda_backend_kv_filled(b) == PROMPT_LEN + 1;
    ok = ok && bn_cuda_backend_submit_sample(b, t1, PROMPT_LEN + 1, cp, us[2], &err) == BN_OK &&
         bn_cuda_backend_wait_greedy(b, &t2, &err) == BN_OK;
    CHECK_MSG(ok && t1 == plain[1] && t2 == plain[2],
              "%s, a dropped chained step: tokens %d %d, want %d %d; %s", what, t1, t2, plain[1],
              plain[2], err.message);
    printf("  %s: %d chained picks %s submit/wait's; a dropped step %s\n", what, n_steps,
           same ? "equal" : "DIFFER FROM", ok && t2 == plain[2] ? "forgotten" : "NOT forgotten");
}

/* Greedy picks, eager and from the graph, against the argmax of the
 * step's logits, and chained greedy steps against submit / wait. */
static void check_greedy_picks(bn_cuda_backend *b, int32_t V, float *logits)
{
    for (int graphs = 0; graphs < 2; graphs++) {
        bn_error err;
        bn_error_clear(&err);
        bn_cuda_backend_set_graphs(b, graphs == 1);
        bn_cuda_backend_reset(b);
        int32_t tok = -1, want = -1;
        int bad = 0;
        bool ok = bn_cuda_backend_forward(b, PROMPT, PROMPT_LEN, 0, logits, &err) == BN_OK &&
                  bn_cuda_backend_forward_greedy(b, PROMPT, PROMPT_LEN, 0, &tok, &err) == BN_OK;
        for (int t = 0; ok && t < 8; t++) {
            want = argmax(logits, V);
            bad += tok != want;
            const int64_t pos = PROMPT_LEN + t;
            ok = bn_cuda_backend_forward(b, &want, 1, pos, logits, &err) == BN_OK &&
                 bn_cuda_backend_submit_greedy(b, want, pos, &err) == BN_OK &&
                 bn_cuda_backend_wait_greedy(b, &tok, &err) == BN_OK;
        }
        CHECK_MSG(ok && bad == 0, "greedy picks (%s): %d differ from the argmax; %s",
                  graphs ? "graph" : "eager", bad, err.message);
        const double zeros[N_STEPS] = {0};
        check_chained(b, NULL, zeros, graphs ? "greedy, graph" : "greedy, eager");
    }
    bn_cuda_backend_set_graphs(b, true);
}

/* The settings the sampling checks draw with. */
static const struct {
    float temperature, top_p, min_p;
    int top_k;
} SAMPLE_SETTINGS[] = {{0.8f, 0.95f, 0.0f, 40},
                       {1.5f, 1.0f, 0.05f, 64},
                       {0.6f, 0.5f, 0.0f, 8},
                       {1.0f, 1.0f, 0.0f, 1}};

/* Setting c of SAMPLE_SETTINGS: at every step the device's pick, through
 * forward_sample and through submit / wait (graph and eager), is the CPU
 * sampler's on the GPU's logits with the same uniform number; chained
 * steps pick what submit / wait picks. */
static void check_sample_setting(bn_cuda_backend *b, int32_t V, float *logits, size_t c)
{
    bn_sampler_params sp;
    bn_sampler_params_default(&sp);
    sp.temperature = SAMPLE_SETTINGS[c].temperature;
    sp.top_k = SAMPLE_SETTINGS[c].top_k;
    sp.top_p = SAMPLE_SETTINGS[c].top_p;
    sp.min_p = SAMPLE_SETTINGS[c].min_p;
    sp.seed = 1000 + c;
    const bn_cuda_sample_params cp = {sp.temperature, sp.top_k, sp.top_p, sp.min_p};
    CHECK(bn_cuda_backend_sample_supported(b, &cp));
    bn_sampler *s = NULL;
    bn_error err;
    bn_error_clear(&err);
    CHECK(bn_sampler_create(&sp, V, &s, &err) == BN_OK);
    int32_t cpu_tok[N_STEPS], dev_tok[N_STEPS], graph_tok[N_STEPS], eager_tok[N_STEPS];
    double us[N_STEPS];
    int differ = 0, distinct = 0;
    bool ok = s != NULL;
    bn_cuda_backend_set_graphs(b, true);
    bn_cuda_backend_reset(b);
    for (int t = 0; ok && t < n_steps; t++) {
        const int32_t *in = t == 0 ? PROMPT : &cpu_tok[t - 1];
        const int64_t n = t == 0 ? PROMPT_LEN : 1, pos = t == 0 ? 0 : PROMPT_LEN + t - 1;
        /* The same position twice: the logits, then the device's pick. */
        ok = bn_cuda_backend_forward(b, in, n, pos, logits, &err) == BN_OK;
        us[t] = bn_sampler_next_uniform(s);
        cpu_tok[t] = ok ? bn_sampler_sample(s, logits, NULL, 0) : -1;
        ok = ok && bn_cuda_backend_forward_sample(b, in, n, pos, &cp, us[t], &dev_tok[t], &err) ==
                       BN_OK;
        differ += ok && dev_tok[t] != cpu_tok[t];
        distinct += t > 0 && cpu_tok[t] != cpu_tok[t - 1];
    }
    CHECK_MSG(ok, "case %zu: %s", c, err.message);
    /* The same picks through submit / wait (the decode graph). */
    ok = ok && picks_by_submit(b, &cp, us, cpu_tok, graph_tok, n_steps, &err);
    CHECK_MSG(ok, "case %zu, submit/wait: %s", c, err.message);
    /* The graph's steps draw inside the replay (bn_cuda_backend_sample_graph);
     * launched one by one, the sampler follows the step: the same picks. */
    CHECK_MSG(bn_cuda_backend_sample_graph(b), "case %zu: no sampled decode graph", c);
    bn_cuda_backend_set_graphs(b, false);
    CHECK(!bn_cuda_backend_sample_graph(b));
    ok = ok && picks_by_submit(b, &cp, us, cpu_tok, eager_tok, n_steps, &err);
    CHECK_MSG(ok, "case %zu, eager submit/wait: %s", c, err.message);
    char what[64];
    snprintf(what, sizeof what, "case %zu, eager", c); /* graphs still off */
    check_chained(b, &cp, us, what);
    bn_cuda_backend_set_graphs(b, true);
    snprintf(what, sizeof what, "case %zu, graph", c);
    check_chained(b, &cp, us, what);
    const bool same_eager = ok && memcmp(eager_tok, dev_tok, (size_t)n_steps * 4) == 0;
    CHECK_MSG(same_eager, "case %zu: eager picks differ from the graph's", c);
    const bool same_graph = ok && memcmp(graph_tok, dev_tok, (size_t)n_steps * 4) == 0;
    CHECK_MSG(differ == 0, "case %zu: %d of %d device picks differ from the CPU sampler's", c,
              differ, n_steps);
    CHECK_MSG(same_graph, "case %zu: submit/wait picks differ from forward_sample's", c);
    if (differ || !same_graph) {
        print_tokens("cpu", cpu_tok, n_steps);
        print_tokens("device", dev_tok, n_steps);
        print_tokens("graph", graph_tok, n_steps);
    }
    if (!same_eager)
        print_tokens("eager", eager_tok, n_steps);
    printf("  T %.2g top-k %d top-p %.2g min-p %.2g: %d picks (%d changes of token) the "
           "CPU sampler's: %s\n",
           (double)sp.temperature, sp.top_k, (double)sp.top_p, (double)sp.min_p, n_steps,
           distinct, differ == 0 && same_graph && same_eager ? "yes" : "NO");
    bn_sampler_free(s);
}

/* Requests the device cannot serve: refused, and the backend still works. */
static void check_sample_refusals(bn_cuda_backend *b, int32_t V)
{
    bn_error err;
    bn_error_clear(&err);
    const bn_cuda_sample_params off = {0.8f, 0, 0.95f, 0.0f}; /* top-k off, 300 tokens */
    CHECK(!bn_cuda_backend_sample_supported(b, &off));
    int32_t tok = -7;
    CHECK(bn_cuda_backend_forward_sample(b, PROMPT, PROMPT_LEN, 0, &off, 0.5, &tok, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "top-k");
    const bn_cuda_sample_params ok_p = {0.8f, 40, 0.95f, 0.0f};
    CHECK(bn_cuda_backend_forward_sample(b, PROMPT, PROMPT_LEN, 0, &ok_p, 1.0, &tok, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cuda_backend_submit_sample(b, 5, 0, &ok_p, -0.25, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_cuda_backend_forward_sample(b, PROMPT, PROMPT_LEN, 0, &ok_p, 0.25, &tok, &err) ==
              BN_OK &&
          tok >= 0 && tok < V);
}

/* screened: the LM head screened through its int8 copy (as for a head large
 * enough: this one is below the size), its exact pass computing every row
 * that can be among the top-k. copy_tokens: as on a device that does not
 * address pinned host memory, the tokens reach the host by copies instead
 * of the kernels' stores into mapped pinned memory. piece
 * 0: the greedy picks (checked against the argmax of the step's logits)
 * and the refused requests; piece 1 + c: setting c of SAMPLE_SETTINGS. */
static void check_sampling_on(bn_checkpoint *m, bool screened, bool copy_tokens, int piece)
{
    printf("sampling on the device (i2s.gguf, %s head, tokens %s), %s:\n",
           screened ? "screened" : "full", copy_tokens ? "copied" : "stored by the kernels",
           piece == 0 ? "greedy and refusals" : "a sampling setting");
    const int32_t V = bn_checkpoint_hparams(m)->vocab;
    const bn_cuda_as_if as_if = {.screen_any_head = screened, .no_mapped_pinned = copy_tokens};
    bn_cuda_backend *b = NULL;
    bn_error cerr;
    bn_error_clear(&cerr);
    CHECK_MSG(bn_cuda_backend_create_as(m, NULL, &as_if, &b, &cerr) == BN_OK, "cuda create: %s",
              cerr.message);
    bn_cuda_decode_form form;
    if (b)
        bn_cuda_backend_decode_form(b, &form);
    CHECK(!b || (form.head_screen == screened && form.copy_token == copy_tokens));
    float *logits = malloc((size_t)V * sizeof(float));
    CHECK(logits != NULL);
    if (b && logits) {
        if (piece == 0) {
            check_greedy_picks(b, V, logits);
            check_sample_refusals(b, V);
        } else {
            check_sample_setting(b, V, logits, (size_t)piece - 1);
        }
    }
    free(logits);
    if (b)
        bn_cuda_backend_free(b);
}

/* The engine: the default CLI sampling picks on the device, and the tokens
 * are the CPU run's for the same seed. */
static void check_sampling_engine(void)
{
    bn_sampler_params sp;
    bn_sampler_params_default(&sp);
    sp.temperature = 0.8f;
    sp.top_k = 40;
    sp.top_p = 0.95f;
    sp.seed = 4242;
    engine_run *gpu = calloc(1, sizeof *gpu), *cpu = calloc(1, sizeof *cpu);
    if (gpu && cpu) {
        run_engine_sampled("i2s.gguf", "cuda", false, 0, 0, &sp, gpu);
        run_engine_sampled("i2s.gguf", "cpu", false, 0, 0, &sp, cpu);
        CHECK_MSG(gpu->gen == BN_OK && cpu->gen == BN_OK, "sampled runs: %s / %s",
                  gpu->err.message, cpu->err.message);
        CHECK(gpu->n_tokens == (size_t)n_steps && cpu->n_tokens == (size_t)n_steps);
        const bool same = memcmp(gpu->tokens, cpu->tokens, (size_t)n_steps * 4) == 0;
        CHECK_MSG(same, "the engine's sampled tokens on the GPU differ from the CPU's");
        if (!same) {
            print_tokens("cpu", cpu->tokens, n_steps);
            print_tokens("gpu", gpu->tokens, n_steps);
        }
        CHECK_MSG(strstr(gpu->receipt, "sample_top_k_top_p") != NULL,
                  "the receipt does not name the device sampler");
        printf("  engine, T 0.8 top-k 40 top-p 0.95 seed 4242: %d tokens on the GPU %s the "
               "CPU's\n",
               n_steps, same ? "equal" : "DIFFER FROM");
    }
    free(gpu);
    free(cpu);
}

static void check_engine(void)
{
    const char *fx = "i2s.gguf";
    engine_run *cpu = calloc(1, sizeof *cpu), *r = calloc(1, sizeof *r);
    run_engine(fx, "cpu", false, 0, 0, cpu);
    CHECK_MSG(cpu->gen == BN_OK && cpu->n_tokens == (size_t)n_steps, "cpu engine: %s",
              cpu->err.message);

    /* auto on a usable GPU: CUDA, the CPU's tokens, the receipt says so. */
    run_engine(fx, NULL, false, 0, 0, r);
    printf("engine auto: %s\n", r->startup);
    CHECK_MSG(r->gen == BN_OK, "auto engine: %s", r->err.message);
    CHECK_STR_CONTAINS(r->startup, "selected=cuda:");
    CHECK(r->info.gpu && strncmp(r->info.selected, "cuda:", 5) == 0 && !r->info.fallback[0]);
    CHECK(r->info.gpu_total_bytes > 0 && r->info.gpu_kv_bytes > 0);
    CHECK_MSG(r->n_tokens == cpu->n_tokens &&
                  memcmp(r->tokens, cpu->tokens, r->n_tokens * sizeof(int32_t)) == 0,
              "engine on the GPU generates other tokens than on the CPU");
    CHECK_STR_CONTAINS(r->receipt, "\"selected\": \"cuda:");
    CHECK_STR_CONTAINS(r->receipt, "\"gpu\": {");
    CHECK_STR_CONTAINS(r->receipt, "cuda_graph_replay");
    CHECK_STR_CONTAINS(r->receipt, "w2a8_gemv");
    printf("engine kernels: %s\n", r->info.kernels);

    /* An impossible memory limit under auto: the CPU, with the reason. */
    run_engine(fx, "auto", false, 1 << 20, 0, r);
    printf("auto, 1 MiB limit: %s | fallback: %s\n", r->startup, r->info.fallback);
    CHECK_MSG(r->open == BN_OK && r->gen == BN_OK, "auto with a 1 MiB limit: %s",
              r->err.message);
    CHECK(strcmp(r->info.selected, "cpu") == 0 && !r->info.gpu);
    CHECK_STR_CONTAINS(r->info.fallback, "CUDA initialisation failed");
    CHECK_STR_CONTAINS(r->info.fallback, "BITNET_MEMORY_LIMIT");
    CHECK_STR_CONTAINS(r->receipt, "\"fallback_reason\": \"CUDA initialisation failed");
    CHECK(r->n_tokens == cpu->n_tokens &&
          memcmp(r->tokens, cpu->tokens, r->n_tokens * sizeof(int32_t)) == 0);

    /* ... an error under strict mode, and for an explicit cuda request. */
    run_engine(fx, "auto", true, 1 << 20, 0, r);
    printf("strict auto, 1 MiB limit: %s: %s\n", bn_status_str(r->open), r->err.message);
    CHECK(r->open == BN_ERR_GPU_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(r->err.message, "BITNET_STRICT_MODE");
    run_engine(fx, "cuda", false, 1 << 20, 0, r);
    CHECK(r->open == BN_ERR_GPU_OUT_OF_MEMORY);
    run_engine(fx, "cuda:63", false, 0, 0, r); /* a valid index no machine here has */
    CHECK_MSG(r->open == BN_ERR_NO_DEVICE, "cuda:63: %s: %s", bn_status_str(r->open),
              r->err.message);

    /* A step failing mid-generation (call 3: the second decode step) under
     * auto: the CPU recomputes and finishes, with the same tokens. */
    run_engine(fx, "auto", false, 0, 3, r);
    printf("auto, failing step: gen %s | fallback: %s\n", bn_status_str(r->gen), r->info.fallback);
    CHECK_MSG(r->gen == BN_OK, "generation after a failed step: %s", r->err.message);
    CHECK_STR_CONTAINS(r->info.fallback, "CUDA step failed");
    CHECK(strcmp(r->info.selected, "cpu") == 0);
    CHECK_MSG(r->n_tokens == cpu->n_tokens &&
                  memcmp(r->tokens, cpu->tokens, r->n_tokens * sizeof(int32_t)) == 0,
              "tokens after the fallback differ from the CPU's");
    CHECK_STR_CONTAINS(r->receipt, "CUDA step failed");
    CHECK_STR_CONTAINS(r->info.kernels, "w2a8_gemv"); /* the GPU's part is remembered */
    /* ... and under strict mode, an error. */
    run_engine(fx, "auto", true, 0, 3, r);
    printf("strict auto, failing step: %s: %s\n", bn_status_str(r->gen), r->err.message);
    CHECK(r->open == BN_OK && r->gen == BN_ERR_GPU);
    CHECK_STR_CONTAINS(r->err.message, "BITNET_STRICT_MODE");
    /* ... and for an explicit request. */
    run_engine(fx, "cuda", false, 0, 1, r);
    CHECK(r->open == BN_OK && r->gen == BN_ERR_GPU);
    free(cpu);
    free(r);
}

int main(int argc, char **argv)
{
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows in a log cut short by a timeout */
    /* scripts/gpu-check.sh runs gpu tests without arguments (under
     * compute-sanitizer): the build knows where the fixtures are. */
#if defined(BN_TEST_MODELS_DIR)
    data_dir = argc >= 2 ? argv[1] : BN_TEST_MODELS_DIR;
#else
    if (argc < 2) {
        fprintf(stderr, "usage: test_cuda_backend DIR (tests/data/models)\n");
        return 2;
    }
    data_dir = argv[1];
#endif
    /* BN_TEST_QUICK=1 (the sanitizer runs): two fixtures (a packed HF
     * directory and a Q8_0-embedding GGUF) and no 2B-4T model.
     * BN_TEST_PART=i/n: every n-th of the units below (racecheck runs them
     * as separate processes; a fixture is FIXTURE_UNITS of them, an
     * encoding one, the sampling checks SAMPLING_UNITS: 40 units in quick
     * mode). */
    const bool quick = getenv("BN_TEST_QUICK") && strcmp(getenv("BN_TEST_QUICK"), "0") != 0;
    if (quick)
        n_steps = 8;
    const char *steps = getenv("BN_TEST_STEPS");
    if (steps) {
        char *end = NULL;
        const long v = strtol(steps, &end, 10);
        if (end == steps || *end || v < 3 || v > N_STEPS) {
            fprintf(stderr, "BN_TEST_STEPS=%s: expected a whole number from 3 to %d\n", steps,
                    N_STEPS);
            return 2;
        }
        n_steps = (int)v;
        printf("%d steps a run (BN_TEST_STEPS)\n", n_steps);
    }
    char why[BN_ERROR_MESSAGE_MAX];
    if (!gpu_usable(why, sizeof why))
        TEST_SKIP("no usable CUDA device: %s", why);
    int unit = 0;
    for (size_t i = 0; i < sizeof FIXTURES / sizeof FIXTURES[0]; i++)
        if (!quick || strcmp(FIXTURES[i], "hf_packed") == 0 ||
            strcmp(FIXTURES[i], "tq2_0.gguf") == 0) {
            check_fixture(FIXTURES[i], unit);
            unit += FIXTURE_UNITS;
        }
    for (int i = 0; i < test_encoding_count; i++)
        if (test_in_part(unit++))
            check_encoding(i);
    void (*const checks[])(void) = {check_chunks, check_ragged, check_profile, check_work,
                                    check_errors};
    for (size_t i = 0; i < sizeof checks / sizeof checks[0]; i++)
        if (test_in_part(unit++))
            checks[i]();
    for (int i = 0; i < SAMPLING_UNITS; i++)
        if (test_in_part(unit++))
            check_sampling(i);
    if (test_in_part(unit++))
        check_engine();
    if (!quick && test_in_part(unit++))
        check_2b4t();
    TEST_EXIT();
}
