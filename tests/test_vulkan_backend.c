/* The Vulkan backend (src/vulkan/vk_backend.c) against the CPU backend on
 * the first Vulkan device (lavapipe here and in CI), through the engine's
 * backend interface, for every fixture (hf_packed, hf_bf16, i2s.gguf,
 * tq2_0.gguf, tq1_0.gguf) and the shipped model:
 *   - the logits after a prompt longer than one pass (the rows run in
 *     chunks, the last row alone) and after each of the steps that follow,
 *     fed the CPU's greedy tokens: within 1e-5 of the largest logit (only
 *     the attention's exp differs from the CPU's) and the same argmax;
 *   - greedy decoding on its own gives the CPU's tokens, from the logits
 *     and from the backend's own picks (forward_pick: the screened LM head,
 *     vk_head_screen.h), which it takes for greedy steps only, and not at
 *     all with BITNET_VULKAN_SCREEN=0;
 *   - decode steps past 256 positions (the shipped model: the fixtures hold
 *     256), whose attention is split over positions: the CPU's logits
 *     within 1e-5 of the largest, its argmax;
 *   - rows of three sequences through the paged cache (forward_rows, the
 *     batching engine's pass): the CPU backend's logits; their greedy
 *     tokens picked on the device (forward_rows_pick) the host's rule's
 *     over those logits and the CPU backend's picks;
 *   - a greedy step whose screen lists more candidates than it holds: the
 *     full head's pick, the CPU's;
 *   - going back to an earlier position recomputes the same logits;
 *   - what it reports: the device it selected, its kernels, its memory;
 *   - bad requests: a token outside the vocabulary, positions past the
 *     cache or skipping positions, a device that does not exist, an fp16
 *     cache, a cache larger than the device holds - each a clear error.
 * Exits 77 (skipped) when no Vulkan device can be opened, saying why.
 * usage: test_vulkan_backend MODELS_DIR SHIPPED_MODEL */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend.h"
#include "engine.h"
#include "fp16.h"
#include "model.h"
#include "qtype.h"
#include "test_util.h"
#include "test_util_vulkan.h"
#include "vk_head_screen.h"

extern const bn_backend_ops bn_vulkan_backend_ops;

enum { N_STEPS = 12 }; /* decode steps after each prompt */

static int screened_models; /* models whose greedy steps the backend picked */

static int argmax(const float *x, int64_t n)
{
    int best = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[best])
            best = (int)i;
    return best;
}

/* Whether logit `best` of x leads every other by at most gap x max |x|. */
static bool near_tie(const float *x, int64_t n, int best, double gap)
{
    double big = 0.0, second = -INFINITY;
    for (int64_t i = 0; i < n; i++) {
        big = fmax(big, fabs(x[i]));
        if (i != best)
            second = fmax(second, x[i]);
    }
    return (double)x[best] - second <= gap * big;
}

/* max |a - b| over max |a|. */
static double rel_diff(const float *a, const float *b, int64_t n)
{
    double big = 0.0, worst = 0.0;
    for (int64_t i = 0; i < n; i++) {
        big = fmax(big, fabs(a[i]));
        const double d = fabs((double)a[i] - (double)b[i]);
        worst = !(d <= worst) ? d : worst; /* NaN wins */
    }
    return big > 0.0 ? worst / big : worst;
}

static bn_backend *make(const bn_backend_ops *ops, const bn_checkpoint *m, int device,
                        int64_t kv_len, bool kv_f16, bn_error *err)
{
    const bn_backend_params p = {
        .device = device, .kv_len = kv_len, .threads = 1, .kv = kv_f16 ? BN_KV_F16 : BN_KV_F32};
    bn_backend *b = NULL;
    bn_error_clear(err);
    if (ops->create(m, &p, &b, err) != BN_OK)
        return NULL;
    return b;
}

/* exact: the fp64 kernels, the CPU's logits within 1e-5 of the largest,
 * the same greedy tokens; else the float kernels (BITNET_VULKAN_FP64=0, as
 * on a device without fp64): within FLOAT_TOL of the largest (the bound
 * the CUDA backend's fp16 cache keeps; lavapipe: ~5e-7 on the fixtures,
 * 1.6e-2 on the shipped model, whose int8 codes meet exact ties that float
 * arithmetic may round the other way), the same argmax wherever the CPU's
 * best two logits are further apart than twice that. */
#define FLOAT_TOL 3e-2

static void check_model(const char *path, bool exact)
{
    bn_checkpoint *m = NULL;
    bn_error err;
    bn_error_clear(&err);
    CHECK_MSG(bn_checkpoint_load(path, &m, &err) == BN_OK, "load %s: %s", path, err.message);
    if (!m)
        return;
    const bn_hparams *hp = bn_checkpoint_hparams(m);
    const int64_t V = hp->vocab;
    /* A prompt of more than one pass of the Vulkan backend (64 rows). */
    const int n_prompt = hp->n_ctx_train >= 100 + N_STEPS ? 90 : hp->n_ctx_train / 2;
    const int64_t kv_len = n_prompt + N_STEPS + 1;
    bn_backend *cpu = make(bn_backend_cpu_ops(), m, -1, kv_len, false, &err);
    CHECK_MSG(cpu, "%s: cpu create: %s", path, err.message);
    bn_backend *vk = make(&bn_vulkan_backend_ops, m, 0, kv_len, false, &err);
    CHECK_MSG(vk, "%s: vulkan create: %s (%s)", path, err.message, err.hint);
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    if (!cpu || !vk || !prompt || !want || !got) {
        CHECK(prompt && want && got);
        goto out;
    }
    for (int i = 0; i < n_prompt; i++)
        prompt[i] = (int32_t)((i * 7 + 3) % V);

    /* Teacher-forced: both fed the CPU's greedy tokens. */
    double worst = 0.0;
    int argmax_diff = 0, steps = 0, near_ties = 0;
    int32_t cpu_tok[N_STEPS];
    bool ok = cpu->ops->forward(cpu, prompt, n_prompt, 0, want, &err) == BN_OK;
    CHECK_MSG(ok, "%s: cpu forward: %s", path, err.message);
    ok = ok && vk->ops->forward(vk, prompt, n_prompt, 0, got, &err) == BN_OK;
    CHECK_MSG(ok || steps > 0, "%s: vulkan forward: %s", path, err.message);
    for (int s = 0; ok && s < N_STEPS; s++) {
        worst = fmax(worst, rel_diff(want, got, V));
        cpu_tok[s] = argmax(want, V);
        if (argmax(got, V) != cpu_tok[s]) {
            if (!exact && near_tie(want, V, cpu_tok[s], 2.0 * FLOAT_TOL))
                near_ties++;
            else
                argmax_diff++;
        }
        steps++;
        if (s + 1 == N_STEPS)
            break;
        ok = cpu->ops->forward(cpu, &cpu_tok[s], 1, n_prompt + s, want, &err) == BN_OK &&
             vk->ops->forward(vk, &cpu_tok[s], 1, n_prompt + s, got, &err) == BN_OK;
        CHECK_MSG(ok, "%s: step %d: %s", path, s, err.message);
    }
    printf("%-44s %s, prompt %d, %d steps: worst rel %.2e, argmax differs at %d (%d near "
           "ties)\n",
           path, exact ? "fp64" : "float", n_prompt, steps, worst, argmax_diff, near_ties);
    CHECK_MSG(steps == N_STEPS, "%s: %d of %d steps ran", path, steps, N_STEPS);
    CHECK_MSG(worst <= (exact ? 1e-5 : FLOAT_TOL),
              "%s: logits differ from the CPU's by %.3g of the largest", path, worst);
    CHECK_MSG(argmax_diff == 0, "%s: the argmax differs from the CPU's at %d steps", path,
              argmax_diff);

    /* Greedy on its own, from a rewound cache: the CPU's tokens (exact
     * kernels; the float ones may part at a near tie and then go on
     * elsewhere). */
    vk->ops->reset(vk);
    CHECK(vk->ops->kv_filled(vk) == 0);
    ok = vk->ops->forward(vk, prompt, n_prompt, 0, got, &err) == BN_OK;
    int first_diff = -1;
    for (int s = 0; exact && ok && s < N_STEPS && first_diff < 0; s++) {
        const int32_t t = argmax(got, V);
        if (t != cpu_tok[s])
            first_diff = s;
        else if (s + 1 < N_STEPS)
            ok = vk->ops->forward(vk, &t, 1, n_prompt + s, got, &err) == BN_OK;
    }
    CHECK_MSG(ok, "%s: greedy run: %s", path, err.message);
    CHECK_MSG(first_diff < 0, "%s: greedy tokens differ from the CPU's at step %d", path,
              first_diff);

    /* The same through the backend's picks, where it screens its head. */
    const bn_pick_params greedy = {0.0f, 0, 1.0f, 0.0f}, sampled = {0.8f, 40, 0.95f, 0.05f};
    const bool picks = vk->ops->pick_supported(vk, &greedy);
    CHECK(!vk->ops->pick_supported(vk, &sampled));
    if (picks && exact) {
        screened_models++;
        vk->ops->reset(vk);
        int32_t t = -1;
        ok = vk->ops->forward_pick(vk, prompt, n_prompt, 0, &greedy, 0.0, &t, &err) == BN_OK;
        first_diff = -1;
        for (int s = 0; ok && s < N_STEPS && first_diff < 0; s++) {
            if (t != cpu_tok[s])
                first_diff = s;
            else if (s + 1 < N_STEPS)
                ok = vk->ops->forward_pick(vk, &cpu_tok[s], 1, n_prompt + s, &greedy, 0.0, &t,
                                           &err) == BN_OK;
        }
        CHECK_MSG(ok, "%s: picks: %s", path, err.message);
        CHECK_MSG(first_diff < 0, "%s: picked tokens differ from the CPU's at step %d", path,
                  first_diff);
        CHECK(vk->ops->forward_pick(vk, &cpu_tok[0], 1, vk->ops->kv_filled(vk), &sampled, 0.5, &t,
                                    &err) == BN_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(err.message, "greedy tokens only");
    }

    /* Back to position 5: the same logits as a fresh run of those tokens. */
    float *again = malloc((size_t)V * sizeof *again);
    if (again) {
        bn_backend *fresh = make(&bn_vulkan_backend_ops, m, 0, kv_len, false, &err);
        ok = fresh && vk->ops->forward(vk, prompt + 5, 3, 5, got, &err) == BN_OK &&
             fresh->ops->forward(fresh, prompt, 8, 0, again, &err) == BN_OK;
        CHECK_MSG(ok, "%s: rewind: %s", path, err.message);
        CHECK_MSG(!ok || memcmp(got, again, (size_t)V * sizeof *got) == 0,
                  "%s: logits after going back differ from a fresh run's", path);
        CHECK(vk->ops->kv_filled(vk) == 8);
        if (fresh)
            fresh->ops->free(fresh);
        free(again);
    }

    /* What it says of itself. */
    bn_backend_desc d;
    memset(&d, 0, sizeof d);
    vk->ops->describe(vk, &d);
    CHECK(strcmp(d.selected, "vulkan:0") == 0 && strcmp(d.kernel, "vulkan") == 0);
    CHECK_STR_CONTAINS(d.details, exact ? "exact (fp64) kernels" : "float (no fp64) kernels");
    CHECK(picks == (strstr(d.details, "(greedy steps screened)") != NULL));
    CHECK(!d.batches && d.threads == 0);
    bn_engine_info info;
    memset(&info, 0, sizeof info);
    vk->ops->report(vk, &info);
    CHECK(info.gpu && info.gpu_device == 0 && strcmp(info.kv_type, "f32") == 0);
    CHECK_STR_CONTAINS(info.kernels, "vulkan_w2a8");
    /* Decode steps after the first ran the kept step again. */
    CHECK_STR_CONTAINS(info.kernels, "vulkan_decode_replay");
    CHECK_STR_CONTAINS(info.kernels, "vulkan_attention");
    CHECK((picks && exact) == (strstr(info.kernels, "vulkan_head_screen") != NULL));
    CHECK(info.gpu_weights_bytes > 0 && info.gpu_lm_head_bytes > 0 && info.gpu_kv_bytes > 0);
    CHECK(info.gpu_total_bytes >= info.gpu_weights_bytes + info.gpu_kv_bytes);
    CHECK(info.gpu_kernel_launches > 0 && info.gpu_h2d_bytes > 0 && info.gpu_d2h_transfers > 0);

    /* Bad requests: refused, and the backend still works after them. */
    const int32_t bad_tok = (int32_t)V;
    CHECK(vk->ops->forward(vk, &bad_tok, 1, 0, got, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "outside the vocabulary");
    CHECK(vk->ops->forward(vk, prompt, 2, kv_len - 1, got, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "do not fit");
    CHECK(vk->ops->forward(vk, prompt, 1, vk->ops->kv_filled(vk) + 1, got, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "skip positions");
    CHECK(vk->ops->forward(vk, prompt, 8, 0, got, &err) == BN_OK);
    CHECK(cpu->ops->forward(cpu, prompt, 8, 0, want, &err) == BN_OK);
    CHECK(argmax(got, V) == argmax(want, V));
out:
    if (vk)
        vk->ops->free(vk);
    if (cpu)
        cpu->ops->free(cpu);
    free(prompt);
    free(want);
    free(got);
    bn_checkpoint_free(m);
}

/* Rows of three sequences through the paged cache (forward_rows), the
 * Vulkan backend beside the CPU backend: a pass of every prompt's rows
 * (95 rows: two chunks; blocks scattered over the cache), then a decode
 * row of each; the logits of each sequence's last row within 1e-5 of the
 * largest, with the same argmax; each pass again through forward_rows_pick
 * (the greedy rule over those logits, the CPU's picks; a sampled pick
 * refused). */
static void check_rows(const char *path)
{
    bn_checkpoint *m = NULL;
    bn_error err;
    bn_error_clear(&err);
    CHECK(bn_checkpoint_load(path, &m, &err) == BN_OK);
    if (!m)
        return;
    const int64_t V = bn_checkpoint_hparams(m)->vocab;
    enum { SEQS = 3, BLOCK = 16, BLOCKS = 12 };
    const bn_backend_params p = {.device = 0, .kv_len = 128, .threads = 1,
                                 .paged_rows = BLOCK * BLOCKS, .paged_block = BLOCK,
                                 .paged_max_seqs = SEQS};
    bn_backend *cpu = NULL, *vk = NULL;
    CHECK(bn_backend_cpu_ops()->create(m, &p, &cpu, &err) == BN_OK);
    CHECK_MSG(bn_vulkan_backend_ops.create(m, &p, &vk, &err) == BN_OK, "vulkan paged: %s",
              err.message);
    bn_backend_desc d;
    memset(&d, 0, sizeof d);
    if (vk)
        vk->ops->describe(vk, &d);
    CHECK(d.batches);
    static const int32_t blocks[SEQS][6] = {{7, 2, 11, 0, 5, 9}, {3, 10, 1}, {8, 4}};
    static const int32_t table_len[SEQS] = {6, 3, 2};
    const int32_t *tables[SEQS] = {blocks[0], blocks[1], blocks[2]};
    static const int prompt[SEQS] = {70, 20, 5};
    int32_t tokens[96];
    int64_t pos[96], logit_rows[SEQS];
    int32_t seq[96];
    int n = 0;
    for (int s = 0; s < SEQS; s++) {
        for (int t = 0; t < prompt[s]; t++, n++) {
            tokens[n] = (int32_t)((t * 13 + s * 5 + 1) % V);
            pos[n] = t;
            seq[n] = s;
        }
        logit_rows[s] = n - 1;
    }
    float *want = malloc((size_t)(SEQS * V) * sizeof *want);
    float *got = malloc((size_t)(SEQS * V) * sizeof *got);
    for (int pass = 0; pass < 2 && cpu && vk && want && got; pass++) {
        const bn_batch_rows r = {n, tokens, pos, seq, tables, table_len, BLOCK, logit_rows, SEQS};
        CHECK(cpu->ops->forward_rows(cpu, &r, want, &err) == BN_OK);
        CHECK_MSG(vk->ops->forward_rows(vk, &r, got, &err) == BN_OK, "vulkan forward_rows: %s",
                  err.message);
        for (int s = 0; s < SEQS; s++) {
            const double rel = rel_diff(want + s * V, got + s * V, V);
            printf("forward_rows pass %d, sequence %d: rel %.2e\n", pass, s, rel);
            CHECK(rel <= 1e-5);
            CHECK(argmax(want + s * V, V) == argmax(got + s * V, V));
        }
        /* The same rows again with their greedy tokens picked on the device
         * (the cache rows rewritten with the same values): the host's rule
         * over the logits above, and the CPU backend's picks. */
        const bn_pick_params greedy[SEQS] = {
            {0.0f, 0, 1.0f, 0.0f}, {0.0f, 0, 1.0f, 0.0f}, {0.0f, 0, 1.0f, 0.0f}};
        int32_t picked[SEQS] = {-5, -5, -5}, cpu_picked[SEQS] = {-6, -6, -6};
        if (vk->ops->pick_supported(vk, &greedy[0])) {
            CHECK_MSG(vk->ops->forward_rows_pick(vk, &r, greedy, NULL, picked, &err) == BN_OK,
                      "vulkan forward_rows_pick: %s", err.message);
            CHECK(cpu->ops->forward_rows_pick(cpu, &r, greedy, NULL, cpu_picked, &err) == BN_OK);
            for (int s = 0; s < SEQS; s++)
                CHECK_MSG(picked[s] == bn_vk_greedy_pick(got + s * V, NULL, V) &&
                              picked[s] == cpu_picked[s],
                          "forward_rows_pick pass %d, sequence %d: %d, logits' %d, CPU %d", pass, s,
                          picked[s], bn_vk_greedy_pick(got + s * V, NULL, V), cpu_picked[s]);
            const bn_pick_params sampled[SEQS] = {
                {0.0f, 0, 1.0f, 0.0f}, {0.8f, 40, 0.95f, 0.05f}, {0.0f, 0, 1.0f, 0.0f}};
            CHECK(vk->ops->forward_rows_pick(vk, &r, sampled, NULL, picked, &err) ==
                  BN_ERR_INVALID_ARGUMENT);
            CHECK_STR_CONTAINS(err.message, "greedy tokens only");
        }
        /* Next: one decode row a sequence, the CPU's tokens, in reverse order. */
        n = 0;
        for (int s = SEQS - 1; s >= 0; s--, n++) {
            tokens[n] = argmax(want + s * V, V);
            pos[n] = prompt[s];
            seq[n] = s;
        }
        for (int s = 0; s < SEQS; s++) /* the logits come in row order */
            logit_rows[s] = s;
    }
    /* A row with no block in the cache is refused. */
    if (vk) {
        const int32_t t0 = 1;
        const int64_t far = 100;
        const int32_t s0 = 2;
        const int64_t l0 = 0;
        const bn_batch_rows bad = {1, &t0, &far, &s0, tables, table_len, BLOCK, &l0, 1};
        CHECK(vk->ops->forward_rows(vk, &bad, got, &err) == BN_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(err.message, "no block");
        vk->ops->free(vk);
    }
    if (cpu)
        cpu->ops->free(cpu);
    free(want);
    free(got);
    bn_checkpoint_free(m);
}

/* Decode steps from position 290 on (a 290-token prompt, then 12 steps fed
 * the CPU's greedy tokens), where the backend splits a step's attention
 * over its positions: the CPU's logits within 1e-5 of the largest, the
 * same argmax, and the receipt names the split attention. */
static void check_split_steps(const char *path)
{
    bn_checkpoint *m = NULL;
    bn_error err;
    CHECK(bn_checkpoint_load(path, &m, &err) == BN_OK);
    if (!m)
        return;
    const int64_t V = bn_checkpoint_hparams(m)->vocab, n_prompt = 290, steps = 12;
    bn_backend *cpu = make(bn_backend_cpu_ops(), m, -1, 320, false, &err);
    bn_backend *vk = make(&bn_vulkan_backend_ops, m, 0, 320, false, &err);
    int32_t *prompt = malloc((size_t)n_prompt * sizeof *prompt);
    float *want = malloc((size_t)V * sizeof *want), *got = malloc((size_t)V * sizeof *got);
    CHECK_MSG(cpu && vk && prompt && want && got, "%s: backends for 320 positions", path);
    double worst = 0.0;
    int argmax_diff = 0, ran = 0;
    if (cpu && vk && prompt && want && got) {
        for (int64_t i = 0; i < n_prompt; i++)
            prompt[i] = (int32_t)((i * 11 + 5) % V);
        bool ok = cpu->ops->forward(cpu, prompt, n_prompt, 0, want, &err) == BN_OK &&
                  vk->ops->forward(vk, prompt, n_prompt, 0, got, &err) == BN_OK;
        for (int64_t s = 0; ok && s < steps; s++) {
            worst = fmax(worst, rel_diff(want, got, V));
            const int32_t t = argmax(want, V);
            argmax_diff += argmax(got, V) != t;
            ran++;
            ok = cpu->ops->forward(cpu, &t, 1, n_prompt + s, want, &err) == BN_OK &&
                 vk->ops->forward(vk, &t, 1, n_prompt + s, got, &err) == BN_OK;
        }
        CHECK_MSG(ok, "%s: steps past 256: %s", path, err.message);
        bn_engine_info info;
        memset(&info, 0, sizeof info);
        vk->ops->report(vk, &info);
        CHECK_STR_CONTAINS(info.kernels, "vulkan_attention_split");
    }
    printf("%-44s steps at positions 290..301 (split attention): worst rel %.2e, argmax "
           "differs at %d\n",
           path, worst, argmax_diff);
    CHECK(ran == steps && worst <= 1e-5 && argmax_diff == 0);
    if (vk)
        vk->ops->free(vk);
    if (cpu)
        cpu->ops->free(cpu);
    free(prompt);
    free(want);
    free(got);
    bn_checkpoint_free(m);
}

/* BITNET_VULKAN_SCREEN=0: no int8 copy, the host picks from the logits. */
static void check_no_screen(const char *path)
{
    bn_checkpoint *m = NULL;
    bn_error err;
    CHECK(bn_checkpoint_load(path, &m, &err) == BN_OK);
    if (!m)
        return;
    setenv("BITNET_VULKAN_SCREEN", "0", 1);
    bn_backend *vk = make(&bn_vulkan_backend_ops, m, 0, 64, false, &err);
    unsetenv("BITNET_VULKAN_SCREEN");
    CHECK_MSG(vk, "BITNET_VULKAN_SCREEN=0: %s", err.message);
    if (vk) {
        const bn_pick_params greedy = {0.0f, 0, 1.0f, 0.0f};
        CHECK(!vk->ops->pick_supported(vk, &greedy));
        bn_backend_desc d;
        vk->ops->describe(vk, &d);
        CHECK(strstr(d.details, "screened") == NULL);
        vk->ops->free(vk);
    }
    bn_checkpoint_free(m);
}

/* A greedy step whose screen lists more candidates than it holds
 * (BN_VK_SCREEN_CAP): a random model of 6000 tokens whose LM head rows are
 * all one row r but row 5500 (r (1 + 1/16)) and row 5600 (r (1 - 1/16)),
 * so every row's bound reaches the best and the winner lies past the
 * first 4096 (5500 where r's logit is positive, 5600 where negative).
 * The backend takes the full head then: its picks are the host's greedy
 * rule over the CPU backend's logits, step after step, and its receipt
 * does not name the screen (no pick came from it). */
static void check_screen_overflow(void)
{
    bn_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.vocab = 6000;
    hp.dim = 64;
    hp.ffn = 96;
    hp.n_layer = 1;
    hp.n_head = 4;
    hp.n_head_kv = 2;
    hp.head_dim = 16;
    hp.rope_dim = 16;
    hp.n_ctx_train = 64;
    hp.rms_eps = 1e-5f;
    hp.rope_theta = 10000.0f;
    hp.tied_embeddings = false;
    bn_checkpoint *m = NULL;
    bn_error err;
    CHECK(bn_checkpoint_create_random(&hp, 11, &m, &err) == BN_OK);
    if (!m)
        return;
    /* The random model's head lives in memory it owns: rewritten here
     * before any backend copies it. */
    const bn_dense_matrix *h = bn_checkpoint_lm_head(m);
    CHECK(h->type == BN_QTYPE_F16 && h->rows == hp.vocab && h->cols == hp.dim);
    unsigned char *rows = (unsigned char *)(uintptr_t)h->data;
    float r0[64];
    for (int64_t i = 0; i < hp.dim; i++)
        r0[i] = bn_fp16_to_fp32(((const uint16_t *)(const void *)rows)[i]);
    for (int64_t t = 1; t < hp.vocab; t++) {
        uint16_t *row = (uint16_t *)(void *)(rows + (size_t)t * h->row_bytes);
        const float scale = t == 5500 ? 1.0625f : t == 5600 ? 0.9375f : 1.0f;
        for (int64_t i = 0; i < hp.dim; i++)
            row[i] = bn_fp32_to_fp16(r0[i] * scale);
    }
    bn_backend *cpu = make(bn_backend_cpu_ops(), m, 0, 64, false, &err);
    bn_backend *vk = make(&bn_vulkan_backend_ops, m, 0, 64, false, &err);
    CHECK_MSG(cpu && vk, "backends: %s", err.message);
    const bn_pick_params greedy = {0.0f, 0, 1.0f, 0.0f};
    if (cpu && vk && vk->ops->pick_supported(vk, &greedy)) {
        float *logits = malloc((size_t)hp.vocab * sizeof *logits);
        int32_t tok[8] = {1, 2, 3, 4, 5, 6, 7, 8}, next = -9;
        CHECK(logits != NULL);
        CHECK(cpu->ops->forward(cpu, tok, 8, 0, logits, &err) == BN_OK);
        CHECK(vk->ops->forward_pick(vk, tok, 8, 0, &greedy, 0.0, &next, &err) == BN_OK);
        for (int s = 0; s < 6; s++) {
            const int32_t want = bn_vk_greedy_pick(logits, NULL, hp.vocab);
            CHECK_MSG(next == want && (want == 5500 || want == 5600),
                      "screen overflow, step %d: picked %d, the CPU's logits give %d", s, next,
                      want);
            /* The next step: a token whose embedding moves the hidden state. */
            const int32_t t = (int32_t)(100 + 37 * s);
            CHECK(cpu->ops->forward(cpu, &t, 1, 8 + s, logits, &err) == BN_OK);
            CHECK(vk->ops->forward_pick(vk, &t, 1, 8 + s, &greedy, 0.0, &next, &err) == BN_OK);
        }
        bn_engine_info info;
        memset(&info, 0, sizeof info);
        vk->ops->report(vk, &info);
        CHECK_MSG(strstr(info.kernels, "vulkan_head_screen") == NULL,
                  "screen overflow: the receipt names the screen (%s)", info.kernels);
        free(logits);
    } else if (vk) {
        CHECK_MSG(false, "screen overflow: the backend does not pick greedy tokens");
    }
    if (vk)
        vk->ops->free(vk);
    if (cpu)
        cpu->ops->free(cpu);
    bn_checkpoint_free(m);
}

/* Requests the backend refuses at creation, each with a clear error. */
static void check_refusals(const char *path, int n_devices)
{
    bn_checkpoint *m = NULL;
    bn_error err;
    bn_error_clear(&err);
    CHECK(bn_checkpoint_load(path, &m, &err) == BN_OK);
    if (!m)
        return;
    CHECK(make(&bn_vulkan_backend_ops, m, n_devices, 0, false, &err) == NULL);
    CHECK(err.status == BN_ERR_NO_DEVICE);
    printf("device %d: %s\n", n_devices, err.message);
    CHECK(make(&bn_vulkan_backend_ops, m, 0, 0, true, &err) == NULL);
    CHECK(err.status == BN_ERR_UNSUPPORTED);
    CHECK_STR_CONTAINS(err.message, "fp32 KV cache only");
    /* A cache of 2^40 bytes a layer: more than any device holds. */
    const bn_hparams *hp = bn_checkpoint_hparams(m);
    const int64_t huge = ((int64_t)1 << 40) / ((int64_t)hp->n_head_kv * hp->head_dim * 4);
    CHECK(make(&bn_vulkan_backend_ops, m, 0, huge, false, &err) == NULL);
    printf("a cache of %lld positions: %s\n", (long long)huge, err.message);
    CHECK(err.status == BN_ERR_GPU_OUT_OF_MEMORY);
    bn_checkpoint_free(m);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: %s MODELS_DIR SHIPPED_MODEL\n", argv[0]);
        return 2;
    }
    int count = 0;
    bn_vk *probe = test_require_vulkan(&count);
    const bool fp64 = bn_vk_device(probe)->fp64;
    bn_vk_close(probe);
    static const char *const fixtures[] = {"hf_packed", "hf_bf16", "i2s.gguf", "tq2_0.gguf",
                                           "tq1_0.gguf"};
    char path[1024];
    /* The exact kernels where the device has fp64, then the float ones
     * (as on a device without) on every model. */
    for (int pass = fp64 ? 0 : 1; pass < 2; pass++) {
        if (pass == 1)
            setenv("BITNET_VULKAN_FP64", "0", 1);
        for (size_t i = 0; i < sizeof fixtures / sizeof fixtures[0]; i++) {
            /* The float kernels where the exact ones ran too: on one HF
             * and one GGUF fixture (the weights' formats meet the same
             * device layout) and the shipped model. */
            if (pass == 1 && fp64 && i != 0 && i != 2)
                continue;
            snprintf(path, sizeof path, "%s/%s", argv[1], fixtures[i]);
            check_model(path, pass == 0);
        }
        check_model(argv[2], pass == 0);
    }
    unsetenv("BITNET_VULKAN_FP64");
    if (fp64) {
        printf("%d models picked greedy tokens through the screened head\n", screened_models);
        CHECK(screened_models > 0);
        check_no_screen(argv[2]);
        check_screen_overflow();
        check_split_steps(argv[2]); /* the fixtures' context is 256 */
    }
    if (fp64)
        check_rows(argv[2]);
    snprintf(path, sizeof path, "%s/i2s.gguf", argv[1]);
    check_refusals(path, count);
    TEST_EXIT();
}
