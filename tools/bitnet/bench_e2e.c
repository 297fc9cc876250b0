/*
 * bench_e2e.c - `bitnet bench e2e`: the whole generation path (engine,
 * backend, sampler) on a model of the real 2B-4T shape whose ternary weights
 * are random and held in memory, so the figures need no download and no
 * file. Random weights cost exactly what real ones cost: every kernel does
 * the same work whatever the codes are.
 *
 * Prefill is timed as one forward pass over the whole prompt; decode as the
 * single-token forward passes that follow. On the CUDA backend the same
 * output also holds the time of one decode step (graph replay and eager),
 * its split by kernel (CUDA events around each stage of an instrumented
 * step), the GPU memory, and the byte floor: the bytes a decode step must
 * move divided by the device-to-device copy bandwidth measured in the same
 * run. Nothing passes or fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "cpu_backend.h"
#include "engine.h"
#if defined(BITNET_HAVE_CUDA)
#include "cuda_backend.h"
#endif
#if defined(BITNET_HAVE_VULKAN)
#include "vk_backend.h"
#endif

#define CMD "bench e2e"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet bench e2e [--shape 2b4t|tiny] [options]\n"
            "\n"
            "Builds a model of the BitNet b1.58 2B-4T shape (30 layers, dim 2560, ffn 6912,\n"
            "vocab 128256) with random ternary weights in memory, then times a prefill of\n"
            "--prompt tokens and --gen generated tokens (greedy unless --temp) through the\n"
            "engine. On the GPU it also prints the time of one decode step (graph and\n"
            "eager), its split by kernel, a prefill chunk's split by stage, the GPU memory\n"
            "and the byte floor (bytes per token / copy bandwidth). The decode step takes\n"
            "the form the GPU and the shape allow; the startup line names it.\n"
            "\n"
            "  --shape S         2b4t (default), tiny (2 layers, dim 256: a quick check) or\n"
            "                    27b (60 layers, dim 5120, ffn 25600, heads 40/8: 27.4 G\n"
            "                    ternary weights, a large model's shape)\n"
            "  --device D        auto, cpu, gpu, cuda[:N], vulkan[:N] (default: BITNET_DEVICE,\n"
            "                    else auto)\n"
            "  --prompt N        prompt tokens (default 512)\n"
            "  --gen N           tokens to generate (default 128)\n"
            "  --threads N       CPU threads (default: BITNET_NUM_THREADS, else every core)\n"
            "  --kv f32|f16      CUDA KV cache precision (default f32, the CPU's)\n"
            "  --tensor-parallel N  split the model across N CUDA GPUs (NCCL; the device\n"
            "                    names them, cuda:0,1, or cuda takes the first N)\n"
            "  --temp T          sample the generated tokens at temperature T (default 0:\n"
            "                    greedy), with --top-k K (default 40) and --top-p P (0.95);\n"
            "                    the CUDA report's sampled step uses them too (else T 0.8,\n"
            "                    top-k 40, top-p 0.95)\n"
            "  --seed S          seed of the random weights, prompt and sampling (default 1)\n"
            "  --warmup          run one untimed request of the same size first (another\n"
            "                    prompt): a GPU idle while the weights were built starts\n"
            "                    the timed prefill at its idle clock otherwise\n"
            "  --help\n");
}

void bench_tiny_shape(bn_hparams *hp)
{
    bn_hparams_2b4t(hp);
    hp->vocab = 1024;
    hp->dim = 256;
    hp->ffn = 512;
    hp->n_layer = 2;
    hp->n_head = 4;
    hp->n_head_kv = 2;
    hp->head_dim = 64;
    hp->rope_dim = 64;
    snprintf(hp->arch, sizeof hp->arch, "bitnet-b1.58");
}

/* A 27B-class ternary shape for the large-model figures (tensor parallelism):
 * 2B-4T's kind of layer, wider and deeper, 27.4 G ternary weights. */
static void large_shape(bn_hparams *hp)
{
    bn_hparams_2b4t(hp);
    hp->dim = 5120;
    hp->ffn = 25600;
    hp->n_layer = 60;
    hp->n_head = 40;
    hp->n_head_kv = 8;
    hp->head_dim = 128;
    hp->rope_dim = 128;
}

/* "1.10 GiB" or "12.5 MiB": tiny shapes would read 0.00 GiB. */
static const char *size_text(uint64_t bytes, char *buf, size_t size)
{
    const double gib = 1024.0 * 1024.0 * 1024.0;
    if ((double)bytes >= gib)
        snprintf(buf, size, "%.2f GiB", (double)bytes / gib);
    else
        snprintf(buf, size, "%.1f MiB", (double)bytes / (1024.0 * 1024.0));
    return buf;
}

static double rate(double count, double seconds) { return seconds > 0.0 ? count / seconds : 0.0; }

#if defined(BITNET_HAVE_CUDA)
/* A stage's name in the prefill's table: its products are GEMMs. */
static const char *prefill_stage_name(bn_cuda_stage s, char *buf, size_t size)
{
    const char *name = bn_cuda_stage_name(s);
    const char *gemv = strstr(name, "GEMV");
    if (!gemv)
        return name;
    snprintf(buf, size, "%.*sGEMM%s", (int)(gemv - name), name, gemv + 4);
    return buf;
}

/* The header and a row per stage that launched anything (a stage done
 * inside another's kernel launches nothing) of a stage table, microseconds
 * per pass (unit names it); the prefill's names its products GEMMs.
 * Returns the launches of the pass. */
int bench_print_stage_rows(const bn_cuda_stage_times *t, const char *unit, bool prefill)
{
    printf("  %-36s %9s %7s %9s\n", "stage", unit, "share", "launches");
    int launches = 0;
    for (int s = 0; s < BN_CUDA_STAGE_COUNT; s++) {
        if (t->launches[s] <= 0)
            continue;
        char buf[64];
        const char *name = prefill ? prefill_stage_name((bn_cuda_stage)s, buf, sizeof buf)
                                   : bn_cuda_stage_name((bn_cuda_stage)s);
        printf("  %-36s %9.1f %6.1f%% %9d\n", name, t->ms[s] * 1000.0,
               t->total_ms > 0.0 ? 100.0 * t->ms[s] / t->total_ms : 0.0, t->launches[s]);
        launches += t->launches[s];
    }
    return launches;
}

/* The stages' split of one prefill chunk (the prompt's first, at most the
 * backend's chunk of rows) from position 0, eagerly with CUDA events. It
 * rewrites the KV cache from position 0. */
static int print_prefill_stages(bn_cuda_backend *cb, int32_t vocab, long long n_prompt)
{
    const int64_t chunk = bn_cuda_backend_prefill_chunk(cb);
    const int64_t n = n_prompt < chunk ? (int64_t)n_prompt : chunk;
    if (n < 2)
        return BN_EXIT_OK;
    int32_t *tokens = malloc((size_t)n * sizeof *tokens);
    if (!tokens) {
        fprintf(stderr, "bitnet: error: out of memory\n");
        return BN_EXIT_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < n; i++)
        tokens[i] = (int32_t)((i * 7919 + 1) % vocab);
    const int reps = 5;
    bn_cuda_stage_times t;
    bn_error err;
    bn_error_clear(&err);
    const bn_status st = bn_cuda_backend_profile_prefill(cb, tokens, n, 0, reps, &t, &err);
    free(tokens);
    if (st != BN_OK)
        return cli_fail(&err);
    printf("per-stage time of an instrumented prefill chunk (%lld tokens from position 0, eager, "
           "CUDA events around each stage, %d chunks averaged):\n",
           (long long)n, reps);
    const int launches = bench_print_stage_rows(&t, "us/chunk", true);
    printf("  %-36s %9.1f %7s %9d (%.0f tok/s)\n\n", "total (instrumented)", t.total_ms * 1000.0,
           "", launches, t.total_ms > 0.0 ? (double)n / (t.total_ms / 1000.0) : 0.0);
    return BN_EXIT_OK;
}

/* The GPU part of the report: step time, per-kernel split, memory, byte
 * floor. The measurements rerun the last decode step (the last generated
 * token at the next position). */
static int cuda_report(bn_cuda_backend *cb, const bn_engine_info *info, int32_t vocab,
                       int32_t token, long long n_prompt, long long n_gen,
                       const bn_cuda_sample_params *asked)
{
    const double mib = 1024.0 * 1024.0;
    bn_error err;
    bn_error_clear(&err);
    int64_t pos = bn_cuda_backend_kv_filled(cb);
    if (pos >= bn_cuda_backend_kv_len(cb))
        pos = bn_cuda_backend_kv_len(cb) - 1;
    const int reps = 50;

    double graph_us = 0.0, eager_us = 0.0, device_us = 0.0;
    const bool graphs = bn_cuda_backend_graphs(cb);
    bn_status st = bn_cuda_backend_time_decode(cb, token, pos, reps, &graph_us, &err);
    int64_t kept = 0;
    if (st == BN_OK)
        st = bn_cuda_backend_head_kept(cb, &kept, &err);
    /* A sampled step as generation runs it where the device picks (its
     * head screened for the top k where greedy steps are screened): with
     * --temp's sampling where the device serves it, else the CLI's
     * defaults. */
    const bn_cuda_sample_params sampling =
        asked->temperature > 0.0f && bn_cuda_backend_sample_supported(cb, asked)
            ? *asked
            : (bn_cuda_sample_params){0.8f, 40, 0.95f, 0.0f};
    double sampled_us = 0.0;
    int64_t kept_sampled = 0;
    if (st == BN_OK)
        st = bn_cuda_backend_time_decode_sample(cb, token, pos, reps, &sampling, 0.5,
                                                &sampled_us, &err);
    if (st == BN_OK)
        st = bn_cuda_backend_head_kept(cb, &kept_sampled, &err);
    if (st == BN_OK && graphs)
        st = bn_cuda_backend_time_decode_device(cb, token, pos, reps, &device_us, &err);
    /* The sampled step's device time, whole and in its two parts. */
    double sampled_dev[3] = {0.0, 0.0, 0.0};
    const bn_cuda_time_part parts[3] = {BN_CUDA_TIME_STEP, BN_CUDA_TIME_PASS,
                                        BN_CUDA_TIME_CHOICE};
    for (int i = 0; i < 3 && st == BN_OK && graphs; i++)
        st = bn_cuda_backend_time_decode_device_sample(cb, token, pos, reps, &sampling, 0.5,
                                                       parts[i], &sampled_dev[i], &err);
    if (st == BN_OK) {
        bn_cuda_backend_set_graphs(cb, false);
        st = bn_cuda_backend_time_decode(cb, token, pos, reps, &eager_us, &err);
        bn_cuda_backend_set_graphs(cb, true);
    }
    /* Chained steps (each queued before the token it reads is known), as
     * generation runs them: at the positions up to pos where those after
     * it do not fit the cache; the cache is left computed up to pos. */
    const int64_t kv_len = bn_cuda_backend_kv_len(cb);
    const int64_t chain_pos = pos + reps + 3 <= kv_len ? pos : kv_len - reps - 3;
    double chained_us = 0.0, chained_sampled_us = 0.0;
    if (st == BN_OK && chain_pos >= 0)
        st = bn_cuda_backend_time_decode_chained(cb, token, chain_pos, reps, NULL, 0.0,
                                                 &chained_us, &err);
    if (st == BN_OK && chain_pos >= 0)
        st = bn_cuda_backend_time_decode_chained(cb, token, chain_pos, reps, &sampling, 0.5,
                                                 &chained_sampled_us, &err);
    bn_cuda_stage_times t;
    if (st == BN_OK)
        st = bn_cuda_backend_profile_decode(cb, token, pos, 20, &t, &err);
    double copy_gbs = 0.0;
    if (st == BN_OK)
        st = bn_cuda_backend_copy_bandwidth(cb, (uint64_t)1 << 30, &copy_gbs, &err);
    if (st != BN_OK)
        return cli_fail(&err);

    printf("gpu       cuda:%d %s, KV cache %s, decode %s\n", info->gpu_device, info->gpu_name,
           info->kv_type, graphs ? "replays a CUDA graph" : "launches kernels one by one");
    bn_cuda_decode_form form;
    bn_cuda_backend_decode_form(cb, &form);
    if (form.head_screen)
        printf("head      greedy steps screen the LM head through its int8 copy: the step "
               "below computed %lld of %d rows in full (a sampled step, top-k %d: %lld)\n",
               (long long)kept, (int)vocab, sampling.top_k, (long long)kept_sampled);
    else
        printf("head      greedy steps read the whole LM head\n");
    printf("step      %8.1f us    one greedy decode step at position %lld, %s (wall time: "
           "token upload, step, argmax, token download)\n",
           graphs ? graph_us : eager_us, (long long)pos, graphs ? "graph replay" : "eager");
    printf("          %8.1f us    the same step sampled on the device (T %.2g, top-k %d, top-p "
           "%.2g: inputs upload, step, sampler, token download)\n",
           sampled_us, (double)sampling.temperature, sampling.top_k, (double)sampling.top_p);
    if (chain_pos >= 0)
        printf("          %8.1f us    chained greedy steps, %.1f us sampled: wall time per step "
               "at positions %lld-%lld, each queued before the token it reads is known (the "
               "device feeds it), as generation runs them\n",
               chained_us, chained_sampled_us, (long long)chain_pos,
               (long long)(chain_pos + reps + 2));
    if (graphs) {
        printf("          %8.1f us    the same step with eager kernel launches\n", eager_us);
        printf("          %8.1f us    device time: graph + argmax replayed back to back (no host "
               "round trip between steps)\n",
               device_us);
        printf("          %8.1f us    device time of the sampled step%s; alone: %.1f us the "
               "greedy step's graph (its head screened for the top %d), %.1f us the sampler "
               "launched by itself (each back to back)\n",
               sampled_dev[0],
               bn_cuda_backend_sample_graph(cb) ? " (one graph: the pass, then the sampler)" : "",
               sampled_dev[1], sampling.top_k, sampled_dev[2]);
    }
    printf("\nper-stage time of an instrumented eager decode step (CUDA events around each "
           "stage, 20 steps averaged):\n");
    const int launches = bench_print_stage_rows(&t, "us/step", false);
    printf("  %-36s %9.1f %7s %9d\n\n", "total (instrumented)", t.total_ms * 1000.0, "",
           launches);

    if (graphs && graph_us > 0.0) {
        /* What each stage costs the replayed chain: the step with that
         * stage's kernels disabled (empty graph nodes), same position. */
        const unsigned norms = 1u << BN_CUDA_STAGE_ATTN_NORM | 1u << BN_CUDA_STAGE_SUB_NORM |
                               1u << BN_CUDA_STAGE_FFN_NORM | 1u << BN_CUDA_STAGE_RELU2;
        const unsigned gemvs = 1u << BN_CUDA_STAGE_QKV | 1u << BN_CUDA_STAGE_O |
                               1u << BN_CUDA_STAGE_GATE_UP | 1u << BN_CUDA_STAGE_DOWN;
        struct {
            unsigned mask;
            const char *name;
        } sets[BN_CUDA_STAGE_COUNT + 2];
        /* Stages that launch kernels in this form, alone, then the two
         * groups. */
        unsigned launching = 0;
        int n_sets = 0;
        for (int s = 0; s < BN_CUDA_STAGE_ARGMAX; s++)
            if (t.launches[s] > 0) {
                launching |= 1u << s;
                sets[n_sets].mask = 1u << s;
                sets[n_sets++].name = bn_cuda_stage_name((bn_cuda_stage)s);
            }
        if (norms & launching) {
            sets[n_sets].mask = norms;
            sets[n_sets++].name = "all norm + int8 stages";
        }
        /* Nodes in clusters of 16 cannot be disabled: the group leaves
         * them out (their own row says so). */
        const bool gu_fixed = bn_cuda_backend_fixed_stages(cb) >> BN_CUDA_STAGE_GATE_UP & 1u;
        sets[n_sets].mask = gu_fixed ? gemvs & ~(1u << BN_CUDA_STAGE_GATE_UP) : gemvs;
        sets[n_sets++].name = gu_fixed ? "ternary GEMVs but gate|up" : "all ternary GEMVs";
        bool header = false;
        for (int i = 0; i < n_sets; i++) {
            double us = 0.0;
            int off = 0;
            bn_error serr;
            bn_error_clear(&serr);
            const bn_status ts = bn_cuda_backend_time_decode_without(cb, sets[i].mask, token, pos,
                                                                     reps, &us, &off, &serr);
            if (ts != BN_OK && !header) {
                printf("\nstage cost in the graph: not measured (%s)\n", serr.message);
                break;
            }
            if (ts != BN_OK) { /* this set only (a node the driver cannot disable) */
                printf("  %-36s not measured: %s%s%s\n", sets[i].name, serr.message,
                       serr.hint[0] ? "; " : "", serr.hint);
                continue;
            }
            if (!header) {
                printf("what each stage costs the graph-replayed step (the step timed again with "
                       "that stage's kernels disabled, results meaningless):\n");
                printf("  %-36s %9s %9s %9s\n", "without", "step us", "saved us", "nodes");
                header = true;
            }
            printf("  %-36s %9.1f %9.1f %9d\n", sets[i].name, us, graph_us - us, off);
        }
        if (header)
            printf("\n");
        /* A normal step at pos again: the KV cache there as it should be. */
        double again = 0.0;
        if (bn_cuda_backend_time_decode(cb, token, pos, 1, &again, &err) != BN_OK)
            return cli_fail(&err);
    }
    const char *trace = getenv("BITNET_DECODE_TRACE");
    if (trace && *trace) {
        int records = 0;
        bn_error terr;
        bn_error_clear(&terr);
        if (bn_cuda_backend_trace_decode(cb, token, pos, trace, &records, &terr) == BN_OK)
            printf("trace     %d block records of one decode step written to %s "
                   "(scripts/decode_trace.py reads them)\n\n",
                   records, trace);
        else
            printf("trace     not written: %s\n\n", terr.message);
    }

    /* Last of the GPU measurements: it rewrites the cache from position 0. */
    const int prc = print_prefill_stages(cb, vocab, n_prompt);
    if (prc != BN_EXIT_OK)
        return prc;

    printf("memory    GPU %.1f MiB: ternary weights %.1f, embedding %.1f, LM head %.1f%s, its "
           "int8 copy %.1f, norms "
           "%.2f, KV cache %.1f (%s, %lld positions), scratch %.1f; peak %.1f MiB (with the "
           "bandwidth test's buffers); %.1f of %.1f GiB free after loading\n",
           (double)info->gpu_total_bytes / mib, (double)info->gpu_weights_bytes / mib,
           (double)info->gpu_embedding_bytes / mib, (double)info->gpu_lm_head_bytes / mib,
           info->gpu_lm_head_bytes ? "" : " (tied: the embedding)",
           (double)info->gpu_lm_head_screen_bytes / mib,
           (double)info->gpu_norms_bytes / mib, (double)info->gpu_kv_bytes / mib, info->kv_type,
           (long long)info->n_ctx, (double)info->gpu_scratch_bytes / mib,
           (double)info->gpu_peak_bytes / mib, (double)info->gpu_device_free_bytes / (1024.0 * mib),
           (double)info->gpu_device_total_bytes / (1024.0 * mib));

    /* The floor at the mean decode context. */
    const int64_t ctx_mean = (int64_t)(n_prompt + n_gen / 2);
    const uint64_t bytes = bn_cuda_backend_bytes_per_token(cb, ctx_mean);
    const uint64_t kv = bytes - bn_cuda_backend_bytes_per_token(cb, 0);
    const double floor_us = copy_gbs > 0.0 ? (double)bytes / (copy_gbs * 1e3) : 0.0;
    const double step_us = graphs ? graph_us : eager_us;
    printf("floor     %.1f MB per token at context %lld (KV cache %.1f MB of it) / device copy "
           "bandwidth %.0f GB/s (read + write, measured now) = %.1f us per token, %.0f tok/s "
           "ceiling; the step above is %.1f us (%.0f%% of the floor's speed)\n",
           (double)bytes / 1e6, (long long)ctx_mean, (double)kv / 1e6, copy_gbs, floor_us,
           floor_us > 0.0 ? 1e6 / floor_us : 0.0, step_us,
           step_us > 0.0 ? 100.0 * floor_us / step_us : 0.0);
    char kernels[512];
    bn_cuda_backend_kernels(cb, kernels, sizeof kernels);
    printf("kernels   %s\n", kernels);
    return BN_EXIT_OK;
}
#endif

/* Where the CPU's decode steps and prompt chunks spent their time, stage
 * by stage, and what the thread pool's hand-offs cost. */
#if defined(BITNET_HAVE_VULKAN)
/* The kernels of one more pass on the Vulkan backend, timed by the
 * device's timestamps (each from the end of the dispatch before): a decode
 * step (n = 1) or a prompt chunk of n rows. */
static void print_vulkan_pass(void *vk, const int32_t *tokens, int64_t n, int64_t pos)
{
    const char *what = n == 1 ? "decode step" : "prompt chunk";
    bn_vk_pass_profile p;
    bn_error err;
    bn_error_clear(&err);
    if (bn_vk_backend_profile_pass(vk, tokens, n, pos, &p, &err) != BN_OK) {
        printf("per-kernel time of a %s: not measured (%s)\n", what, err.message);
        return;
    }
    printf("\nper-kernel time of one %s", what);
    if (n > 1)
        printf(" (%lld rows at positions %lld..%lld)", (long long)n, (long long)pos,
               (long long)(pos + n - 1));
    printf(" (Vulkan timestamps, from the end of the dispatch before):\n");
    printf("  %-24s %9s %7s %10s\n", "kernel", "us/pass", "share", "dispatches");
    for (int k = 0; k < p.n; k++)
        printf("  %-24s %9.1f %6.1f%% %10d\n", p.names[k], p.us[k],
               p.total_us > 0 ? 100.0 * p.us[k] / p.total_us : 0.0, p.dispatches[k]);
    printf("  %-24s %9.1f\n", "total (on the device)", p.total_us);
    if (p.layer_n > 0) {
        printf("  the second layer's dispatches, us:");
        for (int i = 0; i < p.layer_n; i++)
            printf(" %s %.1f", p.layer_names[i], p.layer_us[i]);
        printf("\n");
    }
}
#endif

static void print_cpu_stages(bn_cpu_backend *cpu, const bn_generation *g)
{
    bn_cpu_stage_times t;
    bn_cpu_backend_stage_times(cpu, &t);
    const double steps = t.passes[0] ? (double)t.passes[0] : 1.0;
    const double rows = t.rows[1] ? (double)t.rows[1] : 1.0;
    double sum[2] = {0.0, 0.0};
    for (int s = 0; s < BN_CPU_STAGE_COUNT; s++)
        for (int k = 0; k < 2; k++)
            sum[k] += t.seconds[k][s];
    printf("\nper-stage time on the CPU (%d threads; wall time of each stage, its threads "
           "working inside): %llu decode steps, %llu prompt rows in %llu chunks\n",
           bn_cpu_backend_threads(cpu), (unsigned long long)t.passes[0],
           (unsigned long long)t.rows[1], (unsigned long long)t.passes[1]);
    printf("  %-26s %14s %6s %16s %6s\n", "stage", "decode us/step", "share", "prompt us/token",
           "share");
    for (int s = 0; s < BN_CPU_STAGE_COUNT; s++)
        printf("  %-26s %14.1f %5.1f%% %16.1f %5.1f%%\n", bn_cpu_stage_name((bn_cpu_stage)s),
               1e6 * t.seconds[0][s] / steps,
               sum[0] > 0.0 ? 100.0 * t.seconds[0][s] / sum[0] : 0.0,
               1e6 * t.seconds[1][s] / rows,
               sum[1] > 0.0 ? 100.0 * t.seconds[1][s] / sum[1] : 0.0);
    printf("  %-26s %14.1f %6s %16.1f\n", "all stages", 1e6 * sum[0] / steps, "",
           1e6 * sum[1] / rows);
    if (g->decode_steps > 0)
        printf("  %-26s %14.1f   (the decode step's wall less its stages: sampling, the "
               "engine)\n",
               "outside the forward pass",
               1e6 * (g->decode_seconds / (double)g->decode_steps - sum[0] / steps));
    const double dispatch = bn_cpu_backend_dispatch_seconds(cpu, 2000);
    const double per_step = (double)t.dispatches[0] / steps;
    printf("  thread pool: %.0f jobs a decode step, an empty job costs %.1f us here: ~%.0f us "
           "a step (%.1f%%) in hand-offs\n",
           per_step, 1e6 * dispatch, 1e6 * dispatch * per_step,
           sum[0] > 0.0 ? 100.0 * dispatch * per_step / (sum[0] / steps) : 0.0);
}

int bench_e2e(int argc, char **argv, const bn_config *cfg)
{
    const char *shape = "2b4t", *device = NULL;
    bn_kv_precision kv = BN_KV_F32;
    bool warmup = false;
    float temperature = 0.0f, top_p = 0.95f;
    long long top_k = 40;
    long long n_prompt = 512, n_gen = 128, threads = 0, tensor_parallel = 0;
    uint64_t seed = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return BN_EXIT_OK;
        } else if (strcmp(a, "--shape") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)))
                return BN_EXIT_USAGE;
            if (strcmp(v, "2b4t") != 0 && strcmp(v, "tiny") != 0 && strcmp(v, "27b") != 0) {
                fprintf(stderr, "bitnet bench e2e: error: --shape must be 2b4t, tiny or 27b, "
                                "not '%s'\n", v);
                return BN_EXIT_USAGE;
            }
            shape = v;
        } else if (strcmp(a, "--kv") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)))
                return BN_EXIT_USAGE;
            if (!cli_parse_kv(CMD, v, &kv) || kv == BN_KV_FP8) {
                if (kv == BN_KV_FP8)
                    fprintf(stderr, "bitnet bench e2e: error: --kv fp8 is the batching engine's "
                                    "(bench batch); one sequence decodes over f32 or f16\n");
                return BN_EXIT_USAGE;
            }
        } else if (strcmp(a, "--temp") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)) ||
                !cli_parse_float(CMD, a, v, 0.0, 100.0, &temperature))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--top-k") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)) ||
                !cli_parse_i64(CMD, a, v, 0, 1 << 24, &top_k))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--top-p") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)) ||
                !cli_parse_float(CMD, a, v, 0.0, 1.0, &top_p))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--device") == 0) {
            if (!(device = cli_value(argc, argv, &i, CMD)))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--prompt") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)) ||
                !cli_parse_i64(CMD, a, v, 1, 1 << 20, &n_prompt))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--gen") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)) ||
                !cli_parse_i64(CMD, a, v, 1, 1 << 20, &n_gen))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--threads") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)) ||
                !cli_parse_i64(CMD, a, v, 1, 4096, &threads))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--tensor-parallel") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)) ||
                !cli_parse_i64(CMD, a, v, 1, BN_DEVICE_LIST_MAX, &tensor_parallel))
                return BN_EXIT_USAGE;
        } else if (strcmp(a, "--warmup") == 0) {
            warmup = true;
        } else if (strcmp(a, "--seed") == 0) {
            if (!(v = cli_value(argc, argv, &i, CMD)) || !cli_parse_u64(CMD, a, v, &seed))
                return BN_EXIT_USAGE;
        } else {
            fprintf(stderr, "bitnet bench e2e: error: unknown option '%s'\n", a);
            usage(stderr);
            return BN_EXIT_USAGE;
        }
    }

    bn_hparams hp;
    if (strcmp(shape, "tiny") == 0)
        bench_tiny_shape(&hp);
    else if (strcmp(shape, "27b") == 0)
        large_shape(&hp);
    else
        bn_hparams_2b4t(&hp);
    if (n_prompt + n_gen > hp.n_ctx_train) {
        fprintf(stderr, "bitnet bench e2e: error: --prompt %lld + --gen %lld is more than the "
                        "%d positions of the model's context\n",
                n_prompt, n_gen, (int)hp.n_ctx_train);
        return BN_EXIT_USAGE;
    }

    bn_error err;
    bn_error_clear(&err);
    const double t0 = bn_time_seconds();
    /* The engine checks the device before it builds the random weights. */
    bn_engine_options eo = {.random_shape = &hp,
                            .random_seed = seed,
                            .device = device,
                            .n_threads = (int)threads,
                            .n_ctx = n_prompt + n_gen,
                            .kv = kv,
                            .tensor_parallel = (int)tensor_parallel};
    bn_engine *e = NULL;
    if (bn_engine_open(cfg, &eo, &e, &err) != BN_OK)
        return cli_fail(&err);
    const double build_seconds = bn_time_seconds() - t0;

    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    if (!prompt) {
        bn_engine_free(e);
        fprintf(stderr, "bitnet: error: out of memory\n");
        return BN_EXIT_OUT_OF_MEMORY;
    }
    uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
    for (long long i = 0; i < n_prompt; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17; /* xorshift: any spread of ids will do */
        prompt[i] = (int32_t)(x % (uint64_t)hp.vocab);
    }
    bn_generate_request req = {.prompt_tokens = prompt,
                               .n_prompt_tokens = (size_t)n_prompt,
                               .n_predict = (int)n_gen,
                               .ignore_eog = true};
    bn_sampler_params_default(&req.sampling); /* greedy unless --temp */
    req.sampling.temperature = temperature;
    req.sampling.top_k = (int)top_k;
    req.sampling.top_p = top_p;
    req.sampling.seed = seed;
    bn_generation g;
    double warmup_seconds = 0.0;
    bn_status st = BN_OK;
    if (warmup) { /* the same size, no prefix in common */
        for (long long i = 0; i < n_prompt; i++)
            prompt[i] = (int32_t)((prompt[i] + 1) % hp.vocab);
        warmup_seconds = bn_time_seconds();
        st = bn_engine_generate(e, &req, &g, &err);
        warmup_seconds = bn_time_seconds() - warmup_seconds;
        if (st == BN_OK)
            bn_generation_free(&g);
        for (long long i = 0; i < n_prompt; i++)
            prompt[i] = (int32_t)((prompt[i] + hp.vocab - 1) % hp.vocab);
    }
    if (st == BN_OK)
        st = bn_engine_generate(e, &req, &g, &err);
#if defined(BITNET_HAVE_VULKAN)
    /* The prompt's last rows, for the Vulkan prompt chunk's profile below. */
    int32_t tail[BN_VK_PROFILE_ROWS];
    const long long tail_n = n_prompt < BN_VK_PROFILE_ROWS ? n_prompt : BN_VK_PROFILE_ROWS;
    memcpy(tail, prompt + (n_prompt - tail_n), (size_t)tail_n * sizeof *tail);
#endif
    free(prompt);
    if (st != BN_OK) {
        bn_engine_free(e);
        return cli_fail(&err);
    }

    bn_engine_info info;
    bn_engine_get_info(e, &info);
    bn_host_memory host;
    const bool host_ok = bn_host_memory_query(&host, NULL) == BN_OK;
    printf("bitnet bench e2e: shape %s (%d layers, dim %d, ffn %d, heads %d/%d, vocab %d), "
           "random ternary weights (seed %llu)\n",
           shape, hp.n_layer, hp.dim, hp.ffn, hp.n_head, hp.n_head_kv, hp.vocab,
           (unsigned long long)seed);
    printf("%s\n", bn_engine_startup_line(e));
    printf("build     %8.2f s      random weights generated and packed for the kernels\n",
           build_seconds);
    if (warmup)
        printf("warmup    %8.2f s      one untimed request of the same size first\n",
               warmup_seconds);
    printf("prefill   %8.2f s      %lld tokens, %.1f tok/s\n", g.prompt_seconds, n_prompt,
           rate((double)n_prompt, g.prompt_seconds));
    char picks[96];
    if (temperature > 0.0f)
        snprintf(picks, sizeof picks, "sampled: T %.2g, top-k %lld, top-p %.2g", (double)temperature,
                 top_k, (double)top_p);
    else
        snprintf(picks, sizeof picks, "greedy");
    /* Where the token is picked: by the GPU (its steps chained), by the
     * CPU backend's screened head, among the Vulkan backend's screened
     * head's candidates, or from full logits by the sampler. */
    const bool backend_picks = bn_engine_picks_on_device(e, &req.sampling);
    const bool on_cpu = bn_engine_backend_handle(e, "cpu") != NULL;
    const bool on_vulkan = bn_engine_backend_handle(e, "vulkan") != NULL;
    if (g.decode_steps > 0)
        printf("decode    %8.2f s      %lld tokens, %.1f tok/s (%.2f ms per token; %s, %s)\n",
               g.decode_seconds, (long long)g.decode_steps,
               rate((double)g.decode_steps, g.decode_seconds),
               1000.0 * g.decode_seconds / (double)g.decode_steps, picks,
               !backend_picks ? "picked on the host"
               : on_cpu       ? "picked by the CPU backend (screened head)"
               : on_vulkan    ? "picked on the host from the screened head's candidates"
                              : "picked on the device, steps chained");
    else
        printf("decode    (one token generated: no decode step to time)\n");
    /* The generated tokens' digest (FNV-1a): equal digests across devices
     * and splits mean equal greedy tokens. */
    uint64_t digest = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < g.n_tokens; i++)
        digest = (digest ^ (uint32_t)g.tokens[i]) * 0x100000001b3ull;
    printf("tokens    %zu generated, digest %016llx\n", g.n_tokens, (unsigned long long)digest);
    char a[32], b[32], c[32], d[32], f[32];
#if defined(BITNET_HAVE_CUDA)
    bn_cuda_backend *cb = (bn_cuda_backend *)bn_engine_backend_handle(e, "cuda");
    if (cb) {
        const int32_t last = g.n_tokens > 0 ? g.tokens[g.n_tokens - 1] : 0;
        const bn_cuda_sample_params asked = {req.sampling.temperature, req.sampling.top_k,
                                             req.sampling.top_p, req.sampling.min_p};
        const int rc = cuda_report(cb, &info, hp.vocab, last, n_prompt, n_gen, &asked);
        bn_generation_free(&g);
        bn_engine_free(e);
        return rc;
    }
#endif
    bn_cpu_backend *cpu = (bn_cpu_backend *)bn_engine_backend_handle(e, "cpu");
    if (cpu)
        print_cpu_stages(cpu, &g);
#if defined(BITNET_HAVE_VULKAN)
    void *vk = bn_engine_backend_handle(e, "vulkan");
    if (vk && g.n_tokens > 0)
        print_vulkan_pass(vk, &g.tokens[g.n_tokens - 1], 1, n_prompt + g.n_tokens - 1);
    if (vk && tail_n > 1) /* the prompt's last rows again (forgetting what follows) */
        print_vulkan_pass(vk, tail, tail_n, n_prompt - tail_n);
#endif
    printf("memory    weights %s (packed for the kernels %s + embedding %s), KV cache %s (%lld "
           "positions), scratch %s",
           size_text(info.backend_weight_bytes + info.model_weight_bytes, a, sizeof a),
           size_text(info.backend_weight_bytes, b, sizeof b),
           size_text(info.model_weight_bytes, c, sizeof c),
           size_text(info.backend_kv_bytes, d, sizeof d), (long long)info.n_ctx,
           size_text(info.backend_scratch_bytes, f, sizeof f));
    if (host_ok)
        printf(", process RSS %s (peak %s)", size_text(host.process_resident_bytes, a, sizeof a),
               size_text(host.process_peak_bytes, b, sizeof b));
    printf("\n");
    bn_generation_free(&g);
    bn_engine_free(e);
    return BN_EXIT_OK;
}
