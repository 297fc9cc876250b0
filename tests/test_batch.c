/*
 * test_batch.c - many sequences at once (bn_engine_generate_batch, the
 * scheduler over the CPU backend's paged cache), on the shipped model:
 *   - 12 requests (greedy and seeded sampling, different prompt and output
 *     lengths) at up to 4 at a time, with a small token budget so prompts
 *     are prefilled in chunks beside other sequences' decode rows: every
 *     request gives exactly the tokens and text it gives alone, and its
 *     streamed pieces add up to its text;
 *   - prompts sharing a long prefix reuse its blocks (and give the same
 *     tokens as without sharing);
 *   - a cache too small for all of them at once preempts sequences, which
 *     come back with the same tokens;
 *   - a request longer than the whole cache fails alone, with a clear
 *     error, and the others finish; bad requests fail alone too;
 *   - without batching options the requests run one after another;
 *   - on CUDA, the fp8 (e4m3) paged cache: the batch against the fp32
 *     references within the 8-bit cache's error (logits after each prompt
 *     within 5e-2 of their range; at most half the greedy texts parting),
 *     the worst error printed; and the held-out perplexity of the model's
 *     test text scored through the batched passes (every prefix of its
 *     first tokens a request, its next token's probability from the
 *     logits after the prompt) with f32, f16 and fp8 caches: fp8 within
 *     2 % of f32.
 * usage: test_batch DEVICE (cpu, or cuda: the CUDA backend's paged pass
 * against its own single-sequence path; skipped without a usable GPU).
 * BN_TEST_NO_CUBLAS=1 (with cuBLAS hidden, test_batch_cuda_no_cublas): the
 * batched head must have run as the GEMV.
 */
#include <stdlib.h>
#include <string.h>

#include "engine.h"
#include "test_util.h"
#include "tokenizer.h"

enum { N_REQ = 12 };

static const char *const prompts[N_REQ] = {
    "In the beginning God created the heaven and the earth.",
    "The LORD is my shepherd",
    "And it came to pass",
    "Blessed are the meek: for they shall inherit the earth.",
    "For God so loved the world",
    "Let there be light",
    "I am the way, the truth, and the life",
    "Vanity of vanities, saith the Preacher",
    "And the earth was without form, and void; and darkness was upon the face of the deep.",
    "Thou shalt not",
    "Love is patient",
    "The heavens declare the glory of God; and the firmament sheweth his handywork.",
};

typedef struct streamed {
    char text[4096];
    size_t len;
} streamed;

static bool on_piece(void *ctx, int32_t token, const char *text, size_t len)
{
    (void)token;
    streamed *s = ctx;
    if (s->len + len < sizeof s->text) {
        memcpy(s->text + s->len, text, len);
        s->len += len;
        s->text[s->len] = '\0';
    }
    return true;
}

static char model_path[4096];
static const char *device = "cpu";
/* The batched engines' KV cache, and how far their logits and greedy
 * texts may be from the references' (GPU only; the CPU is exact). */
static bn_kv_precision engine_kv = BN_KV_F32;
static double logit_tol = 1e-2; /* of the logits' range */
static int parted_den = 4;      /* at most 1 / parted_den of greedy texts part */
static double worst_seen;       /* the largest logit difference / range */

static bn_engine *open_engine(int max_seqs, int64_t positions, int block, int budget, bool share)
{
    bn_config cfg;
    bn_config_defaults(&cfg);
    bn_engine_options eo = {.model_path = model_path,
                            .device = device,
                            .n_threads = 2,
                            .n_ctx = 256,
                            .max_seqs = max_seqs,
                            .kv_positions = positions,
                            .kv_block = block,
                            .token_budget = budget,
                            .no_prefix_sharing = !share,
                            .kv = max_seqs > 1 ? engine_kv : BN_KV_F32};
    bn_engine *e = NULL;
    bn_error err;
    CHECK_MSG(bn_engine_open(&cfg, &eo, &e, &err) == BN_OK, "engine: %s", err.message);
    return e;
}

typedef struct request_set {
    int32_t *ids[N_REQ];
    size_t n_ids[N_REQ];
    bn_batch_request req[N_REQ];
    streamed pieces[N_REQ];
    float *logits[N_REQ]; /* each request's logits after its prompt */
} request_set;

/* The logits after each prompt, alone (the references') and in the batch. */
static float *want_logits[2][N_REQ];
static int32_t vocab;

/* The requests: prompt i (or `prefix` before it), i % 3 == 2 sampled with
 * seed i, others greedy; 4 to 37 tokens each. */
static void make_requests(const bn_engine *e, request_set *rs, const char *prefix)
{
    const bn_tokenizer *t = bn_checkpoint_tokenizer(bn_engine_model(e));
    memset(rs, 0, sizeof *rs);
    for (int i = 0; i < N_REQ; i++) {
        char text[1024];
        snprintf(text, sizeof text, "%s%s", prefix ? prefix : "", prompts[i]);
        CHECK(bn_tokenize(t, text, strlen(text), true, true, &rs->ids[i], &rs->n_ids[i], NULL) ==
              BN_OK);
        bn_batch_request *r = &rs->req[i];
        r->prompt = rs->ids[i];
        r->n_prompt = rs->n_ids[i];
        r->n_predict = 4 + (i * 11) % 34;
        r->ignore_eog = i % 4 != 1; /* some may stop at end of generation */
        bn_sampler_params_default(&r->sampling);
        r->sampling.temperature = i % 3 == 2 ? 0.9f : 0.0f;
        r->sampling.seed = (uint64_t)i;
        r->on_token = on_piece;
        r->ctx = &rs->pieces[i];
        rs->logits[i] = malloc((size_t)vocab * sizeof(float));
        r->prompt_logits = rs->logits[i];
    }
}

static void free_requests(request_set *rs)
{
    for (int i = 0; i < N_REQ; i++) {
        free(rs->ids[i]);
        free(rs->logits[i]);
    }
}

/* Each request alone, through bn_engine_generate; its logits after the
 * prompt kept in want_logits[set]. */
static void references(bn_generation *want, const char *prefix, int set)
{
    bn_engine *e = open_engine(1, 0, 0, 0, true);
    if (!e)
        return;
    request_set rs;
    make_requests(e, &rs, prefix);
    for (int i = 0; i < N_REQ; i++) {
        const bn_batch_request *r = &rs.req[i];
        const bn_generate_request g = {.prompt_tokens = r->prompt,
                                       .n_prompt_tokens = r->n_prompt,
                                       .n_predict = r->n_predict,
                                       .ignore_eog = r->ignore_eog,
                                       .sampling = r->sampling,
                                       .prompt_logits = rs.logits[i]};
        bn_error err;
        CHECK_MSG(bn_engine_generate(e, &g, &want[i], &err) == BN_OK, "alone %d: %s", i,
                  err.message);
        want_logits[set][i] = rs.logits[i];
        rs.logits[i] = NULL;
    }
    free_requests(&rs);
    bn_engine_free(e);
}

/* The batch's results against the references; returns the preemptions. */
/* The batch's results against the references; returns the preemptions.
 * On the CPU every row computes the numbers it computes alone, so every
 * token and text is equal. On the GPU the batched pass sums attention in
 * another order than the single-sequence step; an activation within that
 * difference of an int8 rounding boundary then takes the other code, which
 * moves logits by ~1e-3 of their range (the CUDA backend's contract,
 * tests/test_cuda_backend.c's TOL_F32): the logits after each prompt must
 * agree within 1e-2 of their range, greedy texts may part only where two
 * tokens were that close (at most a quarter of them), and sampled texts,
 * which part at the first such draw, are checked for being whole. */
static int compare(const char *what, const request_set *rs, bn_batch_result *got,
                   const bn_generation *want, int set)
{
    const bool exact = strcmp(device, "cpu") == 0;
    int preemptions = 0, greedy = 0, parted = 0;
    for (int i = 0; i < N_REQ; i++) {
        const bn_generation *g = &got[i].gen;
        const bool sampled = rs->req[i].sampling.temperature > 0.0f;
        CHECK_MSG(got[i].status == BN_OK, "%s: request %d failed: %s", what, i,
                  got[i].error.message);
        const bool same = g->n_tokens == want[i].n_tokens &&
                          memcmp(g->tokens, want[i].tokens, g->n_tokens * sizeof(int32_t)) == 0;
        if (exact) {
            CHECK_MSG(same, "%s: request %d: %zu tokens, alone %zu, or other ids", what, i,
                      g->n_tokens, want[i].n_tokens);
            CHECK_MSG(g->text && want[i].text && strcmp(g->text, want[i].text) == 0,
                      "%s: request %d: text differs from its own run", what, i);
            CHECK(g->stopped_at_eog == want[i].stopped_at_eog);
        } else if (!sampled) {
            greedy++;
            parted += !same;
        }
        if (want_logits[set][i]) {
            double worst = 0.0, range = 0.0;
            for (int32_t v = 0; v < vocab && want_logits[set][i]; v++) {
                const double d = fabs((double)rs->logits[i][v] - want_logits[set][i][v]);
                worst = isnan(d) ? INFINITY : d > worst ? d : worst;
                range = fmax(range, fabs(want_logits[set][i][v]));
            }
            CHECK_MSG(worst <= (exact ? 0.0 : logit_tol * (range + 1.0)),
                      "%s: request %d: logits after the prompt differ by %g (range %g)", what, i,
                      worst, range);
            worst_seen = fmax(worst_seen, worst / (range + 1.0));
        }
        CHECK_MSG(strcmp(rs->pieces[i].text, g->text ? g->text : "") == 0,
                  "%s: request %d: streamed pieces differ from the text", what, i);
        CHECK(g->n_prompt == rs->n_ids[i] && g->n_tokens >= 1 &&
              g->n_tokens <= (size_t)rs->req[i].n_predict);
        CHECK(got[i].first_token_seconds >= 0.0);
        preemptions += got[i].preemptions;
        bn_generation_free(&got[i].gen);
    }
    CHECK_MSG(parted * parted_den <= greedy, "%s: %d of %d greedy texts part from their own run",
              what, parted, greedy);
    if (parted)
        printf("%s: %d of %d greedy texts part from the single-sequence run (near ties)\n", what,
               parted, greedy);
    return preemptions;
}

/* The perplexity of tokens [from, n) of the model's held-out text
 * (test.txt beside it), each predicted by a request of the tokens before
 * it through the batched passes (prefixes shared, so each block of the
 * text is computed once, through the cache under test). */
static double held_out_perplexity(bn_engine *e, int from, int n)
{
    char path[sizeof model_path + 16];
    snprintf(path, sizeof path, "%s", model_path);
    char *slash = strrchr(path, '/');
    snprintf(slash ? slash + 1 : path, sizeof path - (size_t)(slash ? slash + 1 - path : 0),
             "test.txt");
    FILE *f = fopen(path, "rb");
    CHECK_MSG(f != NULL, "no held-out text at %s", path);
    if (!f)
        return 0.0;
    char text[8192];
    const size_t len = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[len] = '\0';
    int32_t *ids = NULL;
    size_t n_ids = 0;
    const bn_tokenizer *t = bn_checkpoint_tokenizer(bn_engine_model(e));
    CHECK(bn_tokenize(t, text, len, true, false, &ids, &n_ids, NULL) == BN_OK);
    CHECK_MSG(n_ids >= (size_t)n, "%zu tokens of held-out text", n_ids);
    const int count = n - from;
    bn_batch_request *req = calloc((size_t)count, sizeof *req);
    bn_batch_result *got = calloc((size_t)count, sizeof *got);
    float *logits = malloc(sizeof(float) * (size_t)count * (size_t)vocab);
    CHECK(req && got && logits);
    for (int i = 0; i < count; i++) {
        req[i].prompt = ids;
        req[i].n_prompt = (size_t)(from + i);
        req[i].n_predict = 1;
        req[i].ignore_eog = true;
        bn_sampler_params_default(&req[i].sampling);
        req[i].sampling.temperature = 0.0f;
        req[i].prompt_logits = logits + (size_t)i * (size_t)vocab;
    }
    bn_error err;
    CHECK_MSG(bn_engine_generate_batch(e, req, count, got, &err) == BN_OK, "%s", err.message);
    double nll = 0.0;
    for (int i = 0; i < count; i++) {
        CHECK_MSG(got[i].status == BN_OK, "prefix %d: %s", from + i, got[i].error.message);
        const float *l = logits + (size_t)i * (size_t)vocab;
        double mx = -INFINITY, sum = 0.0;
        for (int32_t v = 0; v < vocab; v++)
            mx = fmax(mx, l[v]);
        for (int32_t v = 0; v < vocab; v++)
            sum += exp(l[v] - mx);
        nll += mx + log(sum) - l[ids[from + i]];
        bn_generation_free(&got[i].gen);
    }
    free(req);
    free(got);
    free(logits);
    free(ids);
    return exp(nll / count);
}

static void run_batch(const char *what, bn_engine *e, const char *prefix, const bn_generation *want,
                      int set, int *preemptions, int64_t *reused)
{
    request_set rs;
    make_requests(e, &rs, prefix);
    bn_batch_result got[N_REQ];
    bn_error err;
    CHECK_MSG(bn_engine_generate_batch(e, rs.req, N_REQ, got, &err) == BN_OK, "%s: %s", what,
              err.message);
    *reused = 0;
    for (int i = 0; i < N_REQ; i++)
        *reused += got[i].reused;
    *preemptions = compare(what, &rs, got, want, set);
    bn_batch_stats st;
    bn_engine_batch_stats(e, &st);
    printf("%s: %llu steps, %llu rows, %d preemptions, %lld positions reused, %d of %d blocks "
           "cached\n",
           what, (unsigned long long)st.steps, (unsigned long long)st.rows, *preemptions,
           (long long)*reused, st.blocks.cached, st.blocks.n_blocks);
    CHECK(st.enabled && st.blocks.held == 0 && st.blocks.seqs_open == 0);
    free_requests(&rs);
}

int main(int argc, char **argv)
{
    device = argc > 1 ? argv[1] : "cpu";
    bn_error err;
    CHECK_MSG(bn_default_model_path(model_path, sizeof model_path, &err) == BN_OK, "%s",
              err.message);
    if (strcmp(device, "cpu") != 0) {
        bn_config cfg;
        bn_config_defaults(&cfg);
        const bn_engine_options probe = {.model_path = model_path, .device = device};
        bn_engine *pe = NULL;
        const bn_status pst = bn_engine_open(&cfg, &probe, &pe, &err);
        bn_engine_free(pe);
        if (pst == BN_ERR_NO_DEVICE || pst == BN_ERR_DRIVER)
            TEST_SKIP("no usable CUDA device: %s", err.message);
    }
    bn_generation want[N_REQ], want_prefixed[N_REQ];
    memset(want, 0, sizeof want);
    memset(want_prefixed, 0, sizeof want_prefixed);
    const char *system = "Hear, O Israel: The LORD our God is one LORD: And thou shalt love the "
                         "LORD thy God with all thine heart, and with all thy soul. ";
    {
        bn_engine *probe = open_engine(1, 0, 0, 0, true);
        vocab = probe ? bn_checkpoint_hparams(bn_engine_model(probe))->vocab : 1;
        bn_engine_free(probe);
    }
    references(want, NULL, 0);
    references(want_prefixed, system, 1);

    int pre = 0;
    int64_t reused = 0;
    /* Up to 4 at once, 16 rows a step: prompts in chunks beside decodes. */
    bn_engine *e = open_engine(4, 0, 16, 16, true);
    if (e)
        run_batch("4 at once", e, NULL, want, 0, &pre, &reused);
    if (e && strncmp(device, "cuda", 4) == 0) {
        /* The head the batched passes took: the cuBLAS GEMM; with cuBLAS
         * hidden (test_batch_cuda_no_cublas), the GEMV row by row. */
        bn_engine_info info;
        bn_engine_get_info(e, &info);
        const bool hidden = getenv("BN_TEST_NO_CUBLAS") != NULL;
        if (hidden)
            CHECK_MSG(strstr(info.kernels, "lm_head_gemv") && !strstr(info.kernels, "lm_head_rows"),
                      "cuBLAS hidden, yet the kernels were %s", info.kernels);
        else
            CHECK_MSG(strstr(info.kernels, "lm_head_rows_gemm"),
                      "the batched head's GEMM did not run: %s", info.kernels);
        printf("4 at once: the head %s; kernels %s\n",
               hidden ? "as the GEMV, row by row (cuBLAS hidden)" : "as the cuBLAS GEMM",
               info.kernels);
    }
    bn_engine_free(e);

    /* The fp8 paged cache (CUDA): the batch against the fp32 references. */
    if (strncmp(device, "cuda", 4) == 0) {
        engine_kv = BN_KV_FP8;
        logit_tol = 5e-2;
        parted_den = 2;
        worst_seen = 0.0;
        e = open_engine(4, 0, 16, 16, true);
        if (e) {
            run_batch("4 at once, fp8 cache", e, NULL, want, 0, &pre, &reused);
            bn_engine_info info;
            bn_engine_get_info(e, &info);
            CHECK_MSG(info.kv_type && strcmp(info.kv_type, "fp8") == 0, "kv type %s",
                      info.kv_type ? info.kv_type : "(none)");
        }
        printf("fp8 cache: logits after the prompts within %.3g of their range of the fp32 "
               "references'\n",
               worst_seen);
        bn_engine_free(e);
        /* Held-out perplexity through the batched passes, by cache. */
        double ppl[3] = {0.0, 0.0, 0.0};
        const bn_kv_precision kinds[3] = {BN_KV_F32, BN_KV_F16, BN_KV_FP8};
        for (int k = 0; k < 3; k++) {
            engine_kv = kinds[k];
            e = open_engine(32, 0, 32, 256, true);
            if (e) {
                ppl[k] = held_out_perplexity(e, 16, 240);
                /* The prompts' runs on the tiled kernel, the other rows on
                 * the paged one, each over the cache's own element. */
                bn_engine_info info;
                bn_engine_get_info(e, &info);
                static const char *const prefill[3] = {"attention_prefill_f32",
                                                       "attention_prefill_f16",
                                                       "attention_prefill_e4m3"};
                for (int j = 0; j < 3; j++)
                    CHECK_MSG((strstr(info.kernels, prefill[j]) != NULL) == (j == k),
                              "%s cache: kernels %s", info.kv_type, info.kernels);
                CHECK_MSG(strstr(info.kernels, "attention_paged"), "kernels %s", info.kernels);
            }
            bn_engine_free(e);
        }
        printf("held-out perplexity over 224 tokens through the batched passes: f32 cache %.4f, "
               "f16 %.4f (%+.2f %%), fp8 %.4f (%+.2f %%)\n",
               ppl[0], ppl[1], 100.0 * (ppl[1] / ppl[0] - 1.0), ppl[2],
               100.0 * (ppl[2] / ppl[0] - 1.0));
        CHECK_MSG(ppl[0] > 1.0 && ppl[2] <= 1.02 * ppl[0] && ppl[2] >= 0.98 * ppl[0],
                  "fp8 cache perplexity %.4f against f32's %.4f", ppl[2], ppl[0]);
        engine_kv = BN_KV_F32;
        logit_tol = 1e-2;
        parted_den = 4;
    }

    /* A shared prefix: later requests take its blocks from the cache. */
    e = open_engine(4, 0, 16, 64, true);
    if (e) {
        run_batch("shared prefix", e, system, want_prefixed, 1, &pre, &reused);
        CHECK_MSG(reused >= 16 * 2 * (N_REQ - 1), "only %lld prompt positions reused",
                  (long long)reused);
    }
    bn_engine_free(e);
    e = open_engine(4, 0, 16, 64, false);
    if (e) {
        run_batch("no sharing", e, system, want_prefixed, 1, &pre, &reused);
        CHECK(reused == 0);
    }
    bn_engine_free(e);

    /* A cache of 9 blocks of 16 for 6 at once: sequences are preempted
     * and come back with the same tokens. */
    e = open_engine(6, 9 * 16, 16, 64, true);
    if (e) {
        run_batch("small cache", e, NULL, want, 0, &pre, &reused);
        CHECK_MSG(pre > 0, "a cache of 9 blocks for 6 sequences preempted none");
    }
    bn_engine_free(e);

    /* One request longer than the whole cache fails alone; a bad one too. */
    e = open_engine(3, 4 * 16, 16, 64, true);
    if (e) {
        request_set rs;
        make_requests(e, &rs, NULL);
        rs.req[1].n_predict = 80; /* > 64 positions */
        const int32_t bad_tok = 1 << 30;
        rs.req[2].prompt = &bad_tok;
        rs.req[2].n_prompt = 1;
        bn_batch_result got[N_REQ];
        CHECK(bn_engine_generate_batch(e, rs.req, 6, got, &err) == BN_OK);
        CHECK(got[1].status == BN_ERR_OUT_OF_MEMORY);
        CHECK_STR_CONTAINS(got[1].error.message, "more than the whole KV cache holds");
        CHECK(got[2].status == BN_ERR_INVALID_ARGUMENT);
        for (int i = 0; i < 6; i++) {
            if (i == 1 || i == 2)
                continue;
            CHECK_MSG(got[i].status == BN_OK && got[i].gen.n_tokens >= 1,
                      "request %d beside the failing ones", i);
            bn_generation_free(&got[i].gen);
        }
        free_requests(&rs);
    }
    bn_engine_free(e);

    /* Replicas: one on every GPU (cuda:all) where there are several, else
     * two on one GPU (cuda:0,0); each request on the one with fewer
     * requests, every one computing; the tokens those of the single runs. */
    if (strcmp(device, "cpu") != 0) {
        const char *one = device;
        device = "cuda:all";
        e = open_engine(3, 0, 16, 16, true);
        if (e && bn_engine_replica_count(e) < 2) {
            bn_engine_free(e);
            device = "cuda:0,0";
            e = open_engine(3, 0, 16, 16, true);
        }
        const bool same_gpu = strcmp(device, "cuda:0,0") == 0;
        device = one;
        if (e) {
            const int n = bn_engine_replica_count(e);
            CHECK(n >= 2);
            run_batch(same_gpu ? "two replicas on one GPU" : "a replica a GPU", e, NULL, want, 0,
                      &pre, &reused);
            char selected[64] = "cuda:";
            for (int i = 0; i < n; i++) {
                bn_batch_stats rs;
                bn_engine_replica_batch_stats(e, i, &rs);
                CHECK_MSG(rs.enabled && rs.rows > 0, "replica %d computed no rows", i);
                bn_engine_info info;
                bn_engine_replica_info(e, i, &info);
                const int dev = same_gpu ? 0 : i;
                CHECK_MSG(info.gpu && info.gpu_device == dev, "replica %d: %s", i, info.selected);
                const size_t at = strlen(selected);
                snprintf(selected + at, sizeof selected - at, "%s%d", i ? "," : "", dev);
            }
            char line[96];
            snprintf(line, sizeof line, "replicas on %d devices: %s", n,
                     same_gpu ? "cuda:0,0" : "cuda:all");
            CHECK_STR_CONTAINS(bn_engine_startup_line(e), line);
            bn_engine_info all;
            bn_engine_get_info(e, &all);
            CHECK_MSG(strcmp(all.selected, selected) == 0, "selected %s, want %s", all.selected,
                      selected);
        }
        bn_engine_free(e);
    }
    {
        /* A device past the count fails at once, naming the request. */
        const char *one = device;
        device = "cuda:0,63";
        bn_config cfg;
        bn_config_defaults(&cfg);
        const bn_engine_options eo = {.model_path = model_path, .device = device, .max_seqs = 4};
        bn_engine *none = NULL;
        CHECK(bn_engine_open(&cfg, &eo, &none, &err) != BN_OK && !none);
        CHECK_STR_CONTAINS(err.message, "cuda:0,63");
        device = one;
    }

    /* No batching: one after another, the same tokens. */
    e = open_engine(0, 0, 0, 0, true);
    if (e) {
        request_set rs;
        make_requests(e, &rs, NULL);
        bn_batch_result got[N_REQ];
        CHECK(bn_engine_generate_batch(e, rs.req, N_REQ, got, &err) == BN_OK);
        compare("one by one", &rs, got, want, 0);
        bn_batch_stats st;
        bn_engine_batch_stats(e, &st);
        CHECK(!st.enabled);
        free_requests(&rs);
    }
    bn_engine_free(e);

    /* Options out of range. */
    bn_config cfg;
    bn_config_defaults(&cfg);
    const bn_engine_options bad = {.model_path = model_path, .device = device, .max_seqs = -2};
    bn_engine *none = NULL;
    CHECK(bn_engine_open(&cfg, &bad, &none, &err) == BN_ERR_INVALID_ARGUMENT && !none);

    for (int i = 0; i < N_REQ; i++) {
        bn_generation_free(&want[i]);
        bn_generation_free(&want_prefixed[i]);
        free(want_logits[0][i]);
        free(want_logits[1][i]);
    }
    TEST_EXIT();
}
