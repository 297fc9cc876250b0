/*
 * bench_batch.c - `bitnet bench batch`: many sequences at once through the
 * scheduler (bn_engine_generate_batch) on a model of the 2B-4T shape with
 * random ternary weights in memory. For each count of concurrent sequences
 * it runs that many requests (random prompts, greedy, every token
 * generated) and prints the aggregate decode rate, the rate one sequence
 * sees, the time to first token (p50 / p99), the passes and the paged KV
 * cache; with --shared-prefix P every prompt starts with the same P tokens
 * and the same counts run again with prefix sharing off. Nothing passes or
 * fails.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "engine.h"

#define CMD "bench batch"

static void usage(FILE *out)
{
    fprintf(out,
            "usage: bitnet bench batch [--shape 2b4t|tiny] [options]\n"
            "\n"
            "Runs N requests at once through the batching scheduler, for each N of --seqs,\n"
            "on a model of the BitNet b1.58 2B-4T shape with random ternary weights, and\n"
            "prints the aggregate decode tokens/s, the tokens/s one sequence sees, the time\n"
            "to first token (p50, p99), the forward passes, the KV cache the run held at its\n"
            "peak, and \"tok %%\": the share of the scheduler's time spent handing out the\n"
            "passes' tokens (sampling on the host, callbacks) while the device waits.\n"
            "\n"
            "  --shape S           2b4t (default) or tiny (2 layers, dim 256)\n"
            "  --device D          auto, cpu, gpu, cuda[:N], vulkan[:N]; cuda:N,M,... or\n"
            "                      cuda:all: a replica on each device (default:\n"
            "                      BITNET_DEVICE, else auto)\n"
            "  --seqs LIST         counts of concurrent sequences (default\n"
            "                      1,8,32,64,128,256)\n"
            "  --prompt N          prompt tokens of each request (default 512)\n"
            "  --gen N             tokens each request generates (default 128)\n"
            "  --shared-prefix P   every prompt starts with the same P tokens; each count runs\n"
            "                      with prefix sharing and again without\n"
            "  --batch-tokens N    rows of a pass: one per decoding sequence, then prompt\n"
            "                      chunks up to N in all (default 512; --budget N is the same)\n"
            "  --kv T              KV cache precision on the GPU: f32 (default), f16 or fp8\n"
            "  --threads N         CPU threads (default: BITNET_NUM_THREADS, else every core)\n"
            "  --seed S            seed of the weights and prompts (default 1)\n"
            "  --stages LIST       on CUDA, after the table: the stages' split of one pass\n"
            "                      for each entry: N decode rows of N sequences at position\n"
            "                      --prompt + --gen / 2, or RxL the last L positions of R\n"
            "                      prompts (e.g. 64,256,4x128)\n"
            "  --help\n");
}

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(double *v, size_t n, double p)
{
    qsort(v, n, sizeof *v, cmp_double);
    size_t i = (size_t)(p * (double)(n - 1) + 0.5);
    return v[i < n ? i : n - 1];
}

typedef struct bench_cfg {
    long long prompt, gen, prefix, batch_tokens, threads;
    uint64_t seed;
    const char *device;
    bn_kv_precision kv;
    bn_hparams hp;
    int max_seqs;
    int stage_runs[16], stage_len[16], n_stages; /* --stages: passes of runs x len rows */
} bench_cfg;

/* One engine with room for max_seqs full requests; sharing on or off. */
static bn_engine *open_engine(const bn_config *cfg, const bench_cfg *b, bool sharing,
                              bn_error *err)
{
    const bn_engine_options eo = {.random_shape = &b->hp,
                                  .random_seed = b->seed,
                                  .device = b->device,
                                  .n_threads = (int)b->threads,
                                  .n_ctx = b->prompt + b->gen,
                                  .max_seqs = b->max_seqs,
                                  /* room for every request in whole blocks of 32 */
                                  .kv_positions =
                                      (int64_t)b->max_seqs * ((b->prompt + b->gen + 31) / 32 * 32),
                                  .token_budget = (int)b->batch_tokens,
                                  .no_prefix_sharing = !sharing,
                                  .kv = b->kv};
    bn_engine *e = NULL;
    return bn_engine_open(cfg, &eo, &e, err) == BN_OK ? e : NULL;
}

/* Two short requests before the table, so that what a first pass pays
 * once (loading kernels and libraries, opening cuBLAS) is not counted in
 * the first row's times. */
static int warm_up(bn_engine *e, const bench_cfg *b)
{
    int32_t prompt[32];
    const size_t n = b->prompt < 32 ? (size_t)b->prompt : 32;
    for (size_t t = 0; t < n; t++)
        prompt[t] = (int32_t)((t * 131 + 7) % (size_t)b->hp.vocab);
    bn_batch_request reqs[2];
    bn_batch_result res[2];
    for (int i = 0; i < 2; i++) {
        reqs[i] = (bn_batch_request){.prompt = prompt, .n_prompt = i == 0 || n < 2 ? n : n / 2,
                                     .n_predict = b->gen < 4 ? (int)b->gen : 4,
                                     .ignore_eog = true};
        bn_sampler_params_default(&reqs[i].sampling);
        reqs[i].sampling.temperature = 0.0f;
    }
    bn_error err;
    bn_error_clear(&err);
    if (bn_engine_generate_batch(e, reqs, 2, res, &err) != BN_OK)
        return cli_fail(&err);
    int rc = BN_EXIT_OK;
    for (int i = 0; i < 2; i++) {
        if (res[i].status != BN_OK && rc == BN_EXIT_OK)
            rc = cli_fail(&res[i].error);
        bn_generation_free(&res[i].gen);
    }
    return rc;
}

/* n requests at once: the table's row. */
static int run_count(bn_engine *e, const bench_cfg *b, int n, const char *label)
{
    const int32_t vocab = b->hp.vocab;
    bn_batch_request *reqs = calloc((size_t)n, sizeof *reqs);
    bn_batch_result *res = calloc((size_t)n, sizeof *res);
    int32_t *prompts = malloc((size_t)n * (size_t)b->prompt * sizeof *prompts);
    double *ttft = malloc((size_t)n * sizeof *ttft);
    if (!reqs || !res || !prompts || !ttft) {
        fprintf(stderr, "bitnet: error: out of memory\n");
        free(reqs);
        free(res);
        free(prompts);
        free(ttft);
        return BN_EXIT_OUT_OF_MEMORY;
    }
    uint64_t x = b->seed * 0x9e3779b97f4a7c15ull + (uint64_t)n;
    for (int i = 0; i < n; i++) {
        int32_t *p = prompts + (size_t)i * (size_t)b->prompt;
        for (long long t = 0; t < b->prompt; t++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            /* The shared prefix is the same for every request. */
            p[t] = t < b->prefix ? (int32_t)((t * 7919 + 13) % vocab) : (int32_t)((x >> 33) % vocab);
        }
        reqs[i] = (bn_batch_request){.prompt = p,
                                     .n_prompt = (size_t)b->prompt,
                                     .n_predict = (int)b->gen,
                                     .ignore_eog = true};
        bn_sampler_params_default(&reqs[i].sampling);
        reqs[i].sampling.temperature = 0.0f;
    }
    bn_batch_stats s0, s1;
    /* Each replica's own counters (cuda:N,M,...): their passes run at once,
     * so the decode rate is the sum of their rates. */
    const int n_rep = bn_engine_replica_count(e);
    bn_batch_stats r0[BN_DEVICE_LIST_MAX], r1[BN_DEVICE_LIST_MAX];
    bn_engine_batch_reset_peak(e);
    bn_engine_batch_stats(e, &s0);
    for (int i = 0; i < n_rep && i < BN_DEVICE_LIST_MAX; i++)
        bn_engine_replica_batch_stats(e, i, &r0[i]);
    bn_error err;
    bn_error_clear(&err);
    const double t0 = bn_time_seconds();
    const bn_status st = bn_engine_generate_batch(e, reqs, (size_t)n, res, &err);
    const double wall = bn_time_seconds() - t0;
    bn_engine_batch_stats(e, &s1);
    for (int i = 0; i < n_rep && i < BN_DEVICE_LIST_MAX; i++)
        bn_engine_replica_batch_stats(e, i, &r1[i]);
    int rc = BN_EXIT_OK;
    uint64_t tokens = 0, steps_alone = 0;
    double per_seq = 0.0, seconds_alone = 0.0;
    for (int i = 0; i < n && st == BN_OK; i++) {
        if (res[i].status != BN_OK) {
            rc = cli_fail(&res[i].error);
            break;
        }
        tokens += res[i].gen.n_tokens;
        ttft[i] = res[i].first_token_seconds;
        if (res[i].gen.gen_seconds > 0.0)
            per_seq += (double)(res[i].gen.n_tokens - 1) / res[i].gen.gen_seconds;
        steps_alone += (uint64_t)res[i].gen.decode_steps;
        seconds_alone += res[i].gen.decode_seconds;
        bn_generation_free(&res[i].gen);
    }
    if (st != BN_OK)
        rc = cli_fail(&err);
    if (rc == BN_EXIT_OK) {
        /* Decode rate: rows of the passes that only decode over their
         * time; run one at a time, every sequence's decode steps over
         * their time. */
        double decode_rate = 0.0;
        for (int i = 0; s1.enabled && i < n_rep && i < BN_DEVICE_LIST_MAX; i++)
            if (r1[i].decode_seconds > r0[i].decode_seconds)
                decode_rate += (double)(r1[i].decode_rows - r0[i].decode_rows) /
                               (r1[i].decode_seconds - r0[i].decode_seconds);
        if (!s1.enabled && seconds_alone > 0.0)
            decode_rate = (double)steps_alone / seconds_alone;
        const uint64_t steps = s1.steps - s0.steps, rows = s1.rows - s0.rows;
        /* The KV cache the run held at its peak (keys and values). */
        const double position_mib = 2.0 * b->hp.n_layer * b->hp.n_head_kv * b->hp.head_dim *
                                    (b->kv == BN_KV_FP8   ? 1.0
                                     : b->kv == BN_KV_F16 ? 2.0
                                                          : 4.0) /
                                    (1024.0 * 1024.0);
        const double kv_mib = (double)s1.blocks.peak_held * s1.block_size * position_mib;
        /* The share of the scheduler's time spent handing tokens out
         * after the passes, while the device waits. */
        const double fwd = s1.forward_seconds - s0.forward_seconds,
                     tok = s1.token_seconds - s0.token_seconds;
        printf("%-10s %5d %10.1f %10.1f %11.1f %9.1f %9.1f %8.3f %7llu %7.1f %6llu %8.1f %6.1f\n",
               label, n,
               decode_rate, wall > 0.0 ? (double)tokens / wall : 0.0, per_seq / n,
               percentile(ttft, (size_t)n, 0.5) * 1e3, percentile(ttft, (size_t)n, 0.99) * 1e3,
               wall, (unsigned long long)steps, steps ? (double)rows / (double)steps : 0.0,
               (unsigned long long)(s1.preemptions - s0.preemptions), kv_mib,
               fwd + tok > 0.0 ? 100.0 * tok / (fwd + tok) : 0.0);
        fflush(stdout);
    }
    free(reqs);
    free(res);
    free(prompts);
    free(ttft);
    return rc;
}

/* The stages' split of one batched pass on the CUDA backend: `runs`
 * sequences in blocks of their own, each with `len` rows: one decode row
 * at position P = prompt + gen / 2 (len 1), or a prompt's last len
 * positions (the cache's contents are whatever the runs left: the time
 * does not depend on them). */
static int print_pass_stages(bn_engine *e, const bench_cfg *b, int runs, int len)
{
#if defined(BITNET_HAVE_CUDA)
    bn_cuda_backend *cb = (bn_cuda_backend *)bn_engine_backend_handle(e, "cuda");
    if (!cb) {
        fprintf(stderr, "bitnet bench batch: --stages needs the CUDA backend; skipped\n");
        return BN_EXIT_OK;
    }
    const int block = 32, n = runs * len;
    const int64_t P = len == 1 ? b->prompt + b->gen / 2 : b->prompt - len;
    const int64_t per_seq = (P + len - 1) / block + 1;
    int32_t *tokens = malloc((size_t)n * sizeof *tokens), *seq = malloc((size_t)n * sizeof *seq);
    int64_t *pos = malloc((size_t)n * sizeof *pos), *logit_rows = malloc((size_t)runs * sizeof *logit_rows);
    int32_t *blocks = malloc((size_t)runs * (size_t)per_seq * sizeof *blocks);
    const int32_t **tables = calloc((size_t)b->max_seqs, sizeof *tables);
    int32_t *table_len = calloc((size_t)b->max_seqs, sizeof *table_len);
    int rc = BN_EXIT_OK;
    if (!tokens || !seq || !pos || !logit_rows || !blocks || !tables || !table_len) {
        fprintf(stderr, "bitnet: error: out of memory\n");
        rc = BN_EXIT_OUT_OF_MEMORY;
    }
    for (int i = 0; i < runs && rc == BN_EXIT_OK; i++) {
        for (int k = 0; k < len; k++) {
            tokens[i * len + k] = (int32_t)((i * 7919 + k + 1) % b->hp.vocab);
            seq[i * len + k] = i;
            pos[i * len + k] = P + k;
        }
        logit_rows[i] = (int64_t)i * len + len - 1;
        for (int64_t k = 0; k < per_seq; k++)
            blocks[i * per_seq + k] = (int32_t)(i * per_seq + k);
        tables[i] = blocks + i * per_seq;
        table_len[i] = (int32_t)per_seq;
    }
    const bn_batch_rows rows = {n, tokens, pos, seq, tables, table_len, block, logit_rows, runs};
    bn_cuda_stage_times t;
    bn_error err;
    bn_error_clear(&err);
    const int reps = 5;
    if (rc == BN_EXIT_OK && bn_cuda_backend_profile_rows(cb, &rows, reps, &t, &err) != BN_OK)
        rc = cli_fail(&err);
    if (rc == BN_EXIT_OK) {
        if (len == 1)
            printf("\nper-stage time of an instrumented batched decode pass (%d rows at position "
                   "%lld, every row greedy, eager, CUDA events around each stage, %d passes "
                   "averaged):\n",
                   n, (long long)P, reps);
        else
            printf("\nper-stage time of an instrumented batched prefill pass (%d prompts' "
                   "positions %lld..%lld, eager, CUDA events around each stage, %d passes "
                   "averaged):\n",
                   runs, (long long)P, (long long)(P + len - 1), reps);
        const int launches = bench_print_stage_rows(&t, "us/pass", true);
        printf("  %-36s %9.1f %7s %9d (%.0f tok/s)\n", "total (instrumented)",
               t.total_ms * 1000.0, "", launches,
               t.total_ms > 0.0 ? n / (t.total_ms / 1000.0) : 0.0); /* rows a second */
    }
    free(tokens);
    free(seq);
    free(pos);
    free(logit_rows);
    free(blocks);
    free(tables);
    free(table_len);
    return rc;
#else
    (void)e;
    (void)b;
    (void)runs;
    (void)len;
    fprintf(stderr, "bitnet bench batch: --stages needs a build with CUDA; skipped\n");
    return BN_EXIT_OK;
#endif
}

static bool parse_seqs(const char *text, int *seqs, int *n_seqs)
{
    *n_seqs = 0;
    const char *p = text;
    while (*p && *n_seqs < 16) {
        char *end;
        const long v = strtol(p, &end, 10);
        if (end == p || v < 1 || v > 4096 || (*end != ',' && *end != '\0'))
            return false;
        seqs[(*n_seqs)++] = (int)v;
        p = *end ? end + 1 : end;
    }
    return *n_seqs > 0 && !*p;
}

/* --stages: entries N (N decode rows) or RxL (R prompts' last L rows). */
static bool parse_stages(const char *text, bench_cfg *b)
{
    b->n_stages = 0;
    const char *p = text;
    while (*p && b->n_stages < 16) {
        char *end;
        const long runs = strtol(p, &end, 10);
        long len = 1;
        if (end != p && *end == 'x') {
            const char *q = end + 1;
            len = strtol(q, &end, 10);
            if (end == q)
                return false;
        }
        if (end == p || runs < 1 || runs > 4096 || len < 1 || len > 4096 ||
            (*end != ',' && *end != '\0'))
            return false;
        b->stage_runs[b->n_stages] = (int)runs;
        b->stage_len[b->n_stages++] = (int)len;
        p = *end ? end + 1 : end;
    }
    return b->n_stages > 0 && !*p;
}

int bench_batch(int argc, char **argv, const bn_config *cfg)
{
    bench_cfg b = {.prompt = 512, .gen = 128, .batch_tokens = 512, .seed = 1};
    const char *shape = "2b4t";
    int seqs[16] = {1, 8, 32, 64, 128, 256}, n_seqs = 6;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            usage(stdout);
            return BN_EXIT_OK;
        }
        if (!(v = cli_value(argc, argv, &i, CMD)))
            return BN_EXIT_USAGE;
        bool ok = true;
        if (strcmp(a, "--shape") == 0) {
            ok = strcmp(v, "2b4t") == 0 || strcmp(v, "tiny") == 0;
            shape = v;
        } else if (strcmp(a, "--device") == 0) {
            b.device = v;
        } else if (strcmp(a, "--seqs") == 0) {
            ok = parse_seqs(v, seqs, &n_seqs);
        } else if (strcmp(a, "--prompt") == 0) {
            ok = cli_parse_i64(CMD, a, v, 1, 1 << 20, &b.prompt);
        } else if (strcmp(a, "--gen") == 0) {
            ok = cli_parse_i64(CMD, a, v, 1, 1 << 20, &b.gen);
        } else if (strcmp(a, "--shared-prefix") == 0) {
            ok = cli_parse_i64(CMD, a, v, 1, 1 << 20, &b.prefix);
        } else if (strcmp(a, "--kv") == 0) {
            ok = cli_parse_kv(CMD, v, &b.kv);
        } else if (strcmp(a, "--batch-tokens") == 0 || strcmp(a, "--budget") == 0) {
            ok = cli_parse_i64(CMD, a, v, 1, BN_BATCH_TOKENS_MAX, &b.batch_tokens);
        } else if (strcmp(a, "--threads") == 0) {
            ok = cli_parse_i64(CMD, a, v, 1, 4096, &b.threads);
        } else if (strcmp(a, "--seed") == 0) {
            ok = cli_parse_u64(CMD, a, v, &b.seed);
        } else if (strcmp(a, "--stages") == 0) {
            ok = parse_stages(v, &b);
        } else {
            fprintf(stderr, "bitnet bench batch: error: unknown option '%s'\n", a);
            usage(stderr);
            return BN_EXIT_USAGE;
        }
        if (!ok) {
            fprintf(stderr, "bitnet bench batch: error: bad value '%s' for %s\n", v, a);
            return BN_EXIT_USAGE;
        }
    }
    if (strcmp(shape, "tiny") == 0)
        bench_tiny_shape(&b.hp);
    else
        bn_hparams_2b4t(&b.hp);
    if (b.prefix >= b.prompt || b.prompt + b.gen > b.hp.n_ctx_train) {
        fprintf(stderr, "bitnet bench batch: error: --shared-prefix must be below --prompt, and "
                        "--prompt + --gen within the %d positions of the context\n",
                (int)b.hp.n_ctx_train);
        return BN_EXIT_USAGE;
    }
    for (int i = 0; i < n_seqs; i++)
        b.max_seqs = seqs[i] > b.max_seqs ? seqs[i] : b.max_seqs;
    for (int i = 0; i < b.n_stages; i++) {
        b.max_seqs = b.stage_runs[i] > b.max_seqs ? b.stage_runs[i] : b.max_seqs;
        if (b.stage_len[i] > 1 && b.stage_len[i] > b.prompt) {
            fprintf(stderr, "bitnet bench batch: error: --stages %dx%d: a prompt's run is at most "
                            "--prompt rows\n",
                    b.stage_runs[i], b.stage_len[i]);
            return BN_EXIT_USAGE;
        }
    }
    if (b.max_seqs < 2)
        b.max_seqs = 2; /* one sequence still goes through the scheduler */

    bn_error err;
    bn_error_clear(&err);
    int rc = BN_EXIT_OK;
    for (int sharing = 1; sharing >= (b.prefix ? 0 : 1) && rc == BN_EXIT_OK; sharing--) {
        bn_engine *e = open_engine(cfg, &b, sharing, &err);
        if (!e)
            return cli_fail(&err);
        if (sharing) {
            printf("%s\n", bn_engine_startup_line(e));
            printf("bitnet bench batch: shape %s, %lld-token prompts%s, %lld generated tokens "
                   "each, greedy; KV cache %lld positions in blocks of 32\n",
                   shape, b.prompt, b.prefix ? " (a shared prefix)" : "", b.gen,
                   (long long)b.max_seqs * ((b.prompt + b.gen + 31) / 32 * 32));
            printf("%-10s %5s %10s %10s %11s %9s %9s %8s %7s %7s %6s %8s %6s\n", "prefix",
                   "seqs", "decode t/s", "output t/s", "per-seq t/s", "ttft p50", "ttft p99",
                   "wall s", "passes", "rows/p", "preempt", "KV MiB", "tok %");
        }
        const char *label = !b.prefix ? "-" : sharing ? "shared" : "unshared";
        rc = warm_up(e, &b);
        for (int i = 0; i < n_seqs && rc == BN_EXIT_OK; i++)
            rc = run_count(e, &b, seqs[i], label);
        for (int i = 0; sharing && i < b.n_stages && rc == BN_EXIT_OK; i++)
            rc = print_pass_stages(e, &b, b.stage_runs[i], b.stage_len[i]);
        bn_engine_free(e);
    }
    return rc;
}
