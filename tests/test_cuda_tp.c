/*
 * test_cuda_tp.c - tensor parallelism (cuda_tp.h).
 *
 * On one GPU:
 *   - the split norm (bn_cb_norm_part_stats / _quantize): a row cut into
 *     1 to 4 parts, each part's statistics gathered and each part coded,
 *     gives the whole-row kernel's codes exactly, code sums that add up to
 *     its sum and a scale within a few ulp, for plain rows and the relu2
 *     source, on random data with poisoned outputs;
 *   - the requests a team refuses: one GPU named twice (cuda:0,0), more
 *     GPUs than the machine has, a model whose heads do not divide, the
 *     CPU; and --tensor-parallel 1, which is the one-GPU path.
 * On two GPUs or more (else that part says it is skipped): sums and
 * gathers through peer memory (tp_exchange.cu) between devices 0 and 1,
 * exact, both slots, in place; every test
 * model, the shipped one and a random model of 2B-4T's head groups (split
 * unequally, its LM head large enough to screen by rows) split two ways
 * give the CPU's greedy tokens and logits within the fp32 tolerance; a
 * sampled run gives the one-GPU CUDA run's tokens; the receipt names the
 * team; a failing call fails on every rank and the team serves the next
 * request.
 */
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_kernels.h"
#include "engine.h"
#include "model.h"
#include "test_util.h"
#include "test_util_cuda.h"

/* ---- the split norm ------------------------------------------------------------- */

static void check_split_norm(int64_t m, int64_t k, int parts, bool relu2)
{
    const int64_t kp = k / parts, ldq = k;
    float *h_x = malloc((size_t)(m * k) * 2 * sizeof(float)), *h_w = malloc((size_t)k * 4);
    for (int64_t i = 0; i < m * k * 2; i++)
        h_x[i] = test_rand_float(-2.0f, 2.0f);
    for (int64_t i = 0; i < k; i++)
        h_w[i] = test_rand_float(0.5f, 1.5f);
    float *x, *w, *scale, *pscale;
    int8_t *q, *pq;
    int32_t *sum, *psum;
    double *stats;
    CUDA_OK(cudaMalloc((void **)&x, (size_t)(m * k) * 2 * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&w, (size_t)k * sizeof(float)));
    CUDA_OK(cudaMalloc((void **)&q, (size_t)(m * ldq)));
    CUDA_OK(cudaMalloc((void **)&pq, (size_t)(m * ldq)));
    CUDA_OK(cudaMalloc((void **)&scale, (size_t)m * 4 * (size_t)(parts + 1)));
    CUDA_OK(cudaMalloc((void **)&sum, (size_t)m * 4 * (size_t)(parts + 1)));
    CUDA_OK(cudaMalloc((void **)&stats, (size_t)(parts * m * 2) * sizeof(double)));
    pscale = scale + m;
    psum = sum + m;
    CUDA_OK(cudaMemcpy(x, h_x, (size_t)(m * k) * 2 * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(w, h_w, (size_t)k * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemset(q, 0x5a, (size_t)(m * ldq)));
    CUDA_OK(cudaMemset(pq, 0x5b, (size_t)(m * ldq)));
    CUDA_OK(cudaMemset(scale, 0xff, (size_t)m * 4 * (size_t)(parts + 1)));
    CUDA_OK(cudaMemset(stats, 0xff, (size_t)(parts * m * 2) * sizeof(double)));
    /* relu2: gate in the first k of each 2k row, up in the second. */
    const float sg = 0.75f, su = 1.25f;
    const float eps = 1e-5f;
    if (relu2)
        CUDA_OK(bn_cb_relu2_norm_quantize(x, x + k, 2 * k, sg, su, m, k, w, eps, q, ldq, scale,
                                          sum, 0, 0));
    else
        CUDA_OK(bn_cb_norm_quantize(x, k, m, k, w, eps, q, ldq, scale, sum, 0, 0));
    /* Every part's statistics, then every part's codes (into its columns
     * of pq, its scale and sum at pscale / psum + p * m). */
    for (int p = 0; p < parts; p++) {
        const bn_cb_norm_source src = {relu2 ? NULL : x + p * kp, k, x + p * kp,
                                       x + k + p * kp, 2 * k, sg, su};
        CUDA_OK(bn_cb_norm_part_stats(&src, m, kp, w + p * kp, stats + p * m * 2, 0));
    }
    for (int p = 0; p < parts; p++) {
        const bn_cb_norm_source src = {relu2 ? NULL : x + p * kp, k, x + p * kp,
                                       x + k + p * kp, 2 * k, sg, su};
        /* Each part writes ldq = kp codes; rows are ldq apart in pq here by
         * using a strided copy afterwards: code into a scratch of m * kp. */
        int8_t *part_q;
        CUDA_OK(cudaMalloc((void **)&part_q, (size_t)(m * kp)));
        CUDA_OK(cudaMemset(part_q, 0x5c, (size_t)(m * kp)));
        CUDA_OK(bn_cb_norm_part_quantize(&src, m, kp, k, w + p * kp, eps, stats, parts, part_q,
                                         kp, pscale + p * m, psum + p * m, 0));
        CUDA_OK(cudaMemcpy2D(pq + p * kp, (size_t)ldq, part_q, (size_t)kp, (size_t)kp,
                             (size_t)m, cudaMemcpyDeviceToDevice));
        CUDA_OK(cudaFree(part_q));
    }
    CUDA_OK(cudaDeviceSynchronize());
    int8_t *hq = malloc((size_t)(m * ldq)), *hpq = malloc((size_t)(m * ldq));
    float *hs = malloc((size_t)m * 4 * (size_t)(parts + 1));
    int32_t *hsum = malloc((size_t)m * 4 * (size_t)(parts + 1));
    CUDA_OK(cudaMemcpy(hq, q, (size_t)(m * ldq), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hpq, pq, (size_t)(m * ldq), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hs, scale, (size_t)m * 4 * (size_t)(parts + 1), cudaMemcpyDeviceToHost));
    CUDA_OK(cudaMemcpy(hsum, sum, (size_t)m * 4 * (size_t)(parts + 1), cudaMemcpyDeviceToHost));
    int bad_codes = 0, bad_sums = 0, bad_scales = 0;
    for (int64_t r = 0; r < m; r++) {
        for (int64_t i = 0; i < k; i++)
            bad_codes += hq[r * ldq + i] != hpq[r * ldq + i];
        int64_t total = 0;
        for (int p = 0; p < parts; p++) {
            total += hsum[m + p * m + r];
            /* Every part holds the same scale, within a few ulp of the whole row's. */
            const float ps = hs[m + p * m + r], s = hs[r];
            bad_scales += !(fabsf(ps - s) <= 4e-7f * fabsf(s)) || ps != hs[m + r];
        }
        bad_sums += total != hsum[r];
    }
    CHECK_MSG(bad_codes == 0 && bad_sums == 0 && bad_scales == 0,
              "%s m %lld k %lld in %d parts: %d codes, %d sums, %d scales differ",
              relu2 ? "relu2" : "plain", (long long)m, (long long)k, parts, bad_codes, bad_sums,
              bad_scales);
    free(hq);
    free(hpq);
    free(hs);
    free(hsum);
    free(h_x);
    free(h_w);
    CUDA_OK(cudaFree(x));
    CUDA_OK(cudaFree(w));
    CUDA_OK(cudaFree(q));
    CUDA_OK(cudaFree(pq));
    CUDA_OK(cudaFree(scale));
    CUDA_OK(cudaFree(sum));
    CUDA_OK(cudaFree(stats));
}

/* ---- exchanges through peer memory (two GPUs) ------------------------------------- */

/* Two ranks on devices 0 and 1 with buffers laid out as the team lays them
 * out; n floats summed and n doubles gathered, several times over (both
 * slots, growing counts), against the host's a + b, outputs poisoned. */
static void check_exchanges(void)
{
    int can01 = 0, can10 = 0;
    CUDA_OK(cudaDeviceCanAccessPeer(&can01, 0, 1));
    CUDA_OK(cudaDeviceCanAccessPeer(&can10, 1, 0));
    if (!can01 || !can10) {
        printf("devices 0 and 1 cannot reach each other's memory: exchanges not checked\n");
        return;
    }
    const size_t slot = (size_t)64 << 10, flags_at = 2 * slot;
    void *mem[2];
    cudaStream_t st[2];
    bn_cb_exchange x[2];
    for (int r = 0; r < 2; r++) {
        CUDA_OK(cudaSetDevice(r));
        const cudaError_t rc = cudaDeviceEnablePeerAccess(1 - r, 0);
        if (rc == cudaErrorPeerAccessAlreadyEnabled)
            (void)cudaGetLastError();
        else
            CUDA_OK(rc);
        CUDA_OK(cudaMalloc(&mem[r], flags_at + 3 * sizeof(unsigned long long)));
        CUDA_OK(cudaMemset(mem[r], 0, flags_at + 3 * sizeof(unsigned long long)));
        CUDA_OK(cudaStreamCreateWithFlags(&st[r], cudaStreamNonBlocking));
    }
    for (int r = 0; r < 2; r++) {
        memset(&x[r], 0, sizeof x[r]);
        x[r].rank = r;
        x[r].ranks = 2;
        x[r].slot_bytes = slot;
        for (int q = 0; q < 2; q++) {
            x[r].slots[q] = mem[q];
            x[r].flags[q] = (unsigned long long *)((char *)mem[q] + flags_at);
        }
        x[r].count = x[r].flags[r] + 2;
    }
    /* Floats summed and doubles gathered: up to a whole slot of each. */
    const int64_t sizes[] = {1, 7, 2560, 5120, 16384};
    int bad = 0;
    for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++) {
        const int64_t n = sizes[si], ng = n < (int64_t)(slot / 8) ? n : (int64_t)(slot / 8);
        float *h[2], *hs[2], *d[2];
        double *g[2], *dm[2], *dall[2], *hall[2];
        for (int r = 0; r < 2; r++) {
            h[r] = malloc((size_t)n * 4);
            hs[r] = malloc((size_t)n * 4);
            g[r] = malloc((size_t)ng * 8);
            hall[r] = malloc((size_t)ng * 16);
            for (int64_t i = 0; i < n; i++)
                h[r][i] = test_rand_float(-3.0f, 3.0f);
            for (int64_t i = 0; i < ng; i++)
                g[r][i] = test_rand_float(-1e6f, 1e6f);
            CUDA_OK(cudaSetDevice(r));
            CUDA_OK(cudaMalloc((void **)&d[r], (size_t)n * 4));
            CUDA_OK(cudaMalloc((void **)&dm[r], (size_t)ng * 8));
            CUDA_OK(cudaMalloc((void **)&dall[r], (size_t)ng * 16));
            CUDA_OK(cudaMemcpy(d[r], h[r], (size_t)n * 4, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemcpy(dm[r], g[r], (size_t)ng * 8, cudaMemcpyHostToDevice));
            CUDA_OK(cudaMemset(dall[r], 0xff, (size_t)ng * 16));
        }
        /* Both ranks' kernels are queued before either is waited for: each
         * waits on the device for the other. A sum, then a gather, twice
         * (the sums in place: the second adds the first's results). */
        for (int rep = 0; rep < 2; rep++)
            for (int r = 0; r < 2; r++) {
                CUDA_OK(cudaSetDevice(r));
                CUDA_OK(bn_cb_exchange_sum(&x[r], d[r], n, st[r]));
                CUDA_OK(bn_cb_exchange_gather(&x[r], dm[r], dall[r], ng, st[r]));
            }
        for (int r = 0; r < 2; r++) {
            CUDA_OK(cudaSetDevice(r));
            CUDA_OK(cudaStreamSynchronize(st[r]));
            CUDA_OK(cudaMemcpy(hs[r], d[r], (size_t)n * 4, cudaMemcpyDeviceToHost));
            CUDA_OK(cudaMemcpy(hall[r], dall[r], (size_t)ng * 16, cudaMemcpyDeviceToHost));
        }
        for (int r = 0; r < 2; r++) {
            for (int64_t i = 0; i < n; i++) {
                const float once = h[0][i] + h[1][i];
                bad += hs[r][i] != once + once;
            }
            for (int64_t i = 0; i < ng; i++)
                bad += hall[r][i] != g[0][i] || hall[r][ng + i] != g[1][i];
        }
        for (int r = 0; r < 2; r++) {
            CUDA_OK(cudaSetDevice(r));
            CUDA_OK(cudaFree(d[r]));
            CUDA_OK(cudaFree(dm[r]));
            CUDA_OK(cudaFree(dall[r]));
            free(h[r]);
            free(hs[r]);
            free(g[r]);
            free(hall[r]);
        }
    }
    CHECK_MSG(bad == 0, "exchanges through peer memory: %d values differ", bad);
    /* Too much for a slot: refused. */
    float *big = NULL;
    CUDA_OK(cudaSetDevice(0));
    CUDA_OK(cudaMalloc((void **)&big, slot + 4));
    CHECK(bn_cb_exchange_sum(&x[0], big, (int64_t)(slot / 4) + 1, st[0]) ==
          cudaErrorInvalidValue);
    (void)cudaGetLastError();
    CUDA_OK(cudaFree(big));
    for (int r = 0; r < 2; r++) {
        CUDA_OK(cudaSetDevice(r));
        CUDA_OK(cudaStreamDestroy(st[r]));
        CUDA_OK(cudaFree(mem[r]));
    }
    CUDA_OK(cudaSetDevice(0));
    printf("exchanges through peer memory: sums of 1 to 16384 floats, gathers of 1 to 8192 "
           "doubles, exact\n");
}

/* ---- teams ------------------------------------------------------------------------ */

static const char *models_dir;
/* A random model of 2B-4T's head groups (20 heads over 5), which two
 * ranks share unequally (3 kv heads and 2), and a head whose halves are
 * large enough to screen (64 MiB of f16 rows each): team_matches("random"). */
static bn_hparams uneven;

static bn_engine *open_team(const char *model, const char *device, int tp, int fail_call,
                            bn_status *st, bn_error *err)
{
    bn_config cfg;
    bn_config_defaults(&cfg);
    const bool random = strcmp(model, "random") == 0;
    const bn_engine_options o = {.model_path = random ? NULL : model,
                                 .random_shape = random ? &uneven : NULL,
                                 .random_seed = 3,
                                 .device = device,
                                 .n_ctx = 128,
                                 .tensor_parallel = tp,
                                 .test_cuda_fail_call = fail_call};
    bn_engine *e = NULL;
    *st = bn_engine_open(&cfg, &o, &e, err);
    return e;
}

/* n greedy (temperature 0) or sampled tokens after a fixed prompt, and
 * the logits after the prompt. */
static bn_status generate_k(bn_engine *e, int n, float temperature, int top_k,
                            bn_generation *g, float *logits, bn_error *err)
{
    const int32_t vocab = bn_checkpoint_hparams(bn_engine_model(e))->vocab;
    int32_t prompt[40];
    for (int i = 0; i < 40; i++)
        prompt[i] = (int32_t)((i * 37 + 11) % vocab);
    bn_generate_request req = {.prompt_tokens = prompt,
                               .n_prompt_tokens = 40,
                               .n_predict = n,
                               .ignore_eog = true,
                               .prompt_logits = logits};
    bn_sampler_params_default(&req.sampling);
    req.sampling.temperature = temperature;
    req.sampling.top_k = top_k;
    req.sampling.seed = 5;
    memset(g, 0, sizeof *g);
    return bn_engine_generate(e, &req, g, err);
}

static bn_status generate(bn_engine *e, int n, float temperature, bn_generation *g,
                          float *logits, bn_error *err)
{
    return generate_k(e, n, temperature, 20, g, logits, err);
}

static void refusals(int gpus)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/i2s.gguf", models_dir);
    bn_status st;
    bn_error err;
    bn_engine *e = open_team(path, "cuda:0,0", 2, 0, &st, &err);
    CHECK(!e && st == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "named twice");
    bn_engine_free(e);
    e = open_team(path, "cpu", 2, 0, &st, &err);
    CHECK(!e && st == BN_ERR_NO_DEVICE);
    CHECK_STR_CONTAINS(err.message, "needs CUDA devices");
    bn_engine_free(e);
    e = open_team(path, "cuda:0", 2, 0, &st, &err);
    CHECK(!e && st == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "names one GPU");
    bn_engine_free(e);
    e = open_team(path, "cuda", gpus + 1, 0, &st, &err);
    CHECK(!e && st == BN_ERR_NO_DEVICE);
    CHECK_STR_CONTAINS(err.message, "CUDA device");
    bn_engine_free(e);
    if (gpus >= 3) { /* 2 kv heads cannot be split 3 ways */
        e = open_team(path, "cuda", 3, 0, &st, &err);
        CHECK(!e && st == BN_ERR_INVALID_ARGUMENT);
        CHECK_STR_CONTAINS(err.message, "cannot be split 3 ways");
        bn_engine_free(e);
    }
    /* --tensor-parallel 1 is the one-GPU path itself. */
    bn_engine *one = open_team(path, "cuda", 1, 0, &st, &err);
    CHECK_MSG(one, "cuda with --tensor-parallel 1: %s", err.message);
    if (one) {
        bn_engine_info info;
        bn_engine_get_info(one, &info);
        CHECK(info.tensor_parallel == 0 && strcmp(info.selected, "cuda:0") == 0);
        CHECK(bn_engine_backend_handle(one, "cuda") != NULL);
    }
    bn_engine_free(one);
}

/* A model split two ways: the CPU's greedy tokens, logits within the fp32
 * tolerance of the CPU's, the one-GPU run's sampled tokens. */
static void team_matches(const char *path)
{
    bn_status st;
    bn_error err;
    bn_engine *cpu = open_team(path, "cpu", 0, 0, &st, &err);
    bn_engine *one = open_team(path, "cuda:0", 0, 0, &st, &err);
    bn_engine *team = open_team(path, "cuda:0,1", 2, 0, &st, &err);
    CHECK_MSG(cpu && one && team, "%s: %s", path, err.message);
    if (!cpu || !one || !team) {
        bn_engine_free(cpu);
        bn_engine_free(one);
        bn_engine_free(team);
        return;
    }
    const int32_t vocab = bn_checkpoint_hparams(bn_engine_model(cpu))->vocab;
    float *lc = malloc((size_t)vocab * 4), *lt = malloc((size_t)vocab * 4);
    bn_generation gc, gt, so, stm;
    CHECK(generate(cpu, 24, 0.0f, &gc, lc, &err) == BN_OK);
    CHECK_MSG(generate(team, 24, 0.0f, &gt, lt, &err) == BN_OK, "%s", err.message);
    float worst = 0.0f, big = 0.0f;
    for (int32_t i = 0; i < vocab; i++) {
        worst = fmaxf(worst, fabsf(lc[i] - lt[i]));
        big = fmaxf(big, fabsf(lc[i]));
    }
    /* test_cuda_backend's fp32 tolerance: summation order alone moves logits
     * ~1e-6 relative, ~1e-3 where an activation sits at a rounding
     * boundary; a structural error moves them O(1). */
    const float rel = worst / (big > 1.0f ? big : 1.0f);
    CHECK_MSG(rel <= 1e-2f, "%s: logits differ by %g (max %g)", path, (double)worst,
              (double)big);
    CHECK(gc.n_tokens == 24 && gt.n_tokens == 24);
    int differ = -1;
    for (size_t i = 0; i < gc.n_tokens && i < gt.n_tokens && differ < 0; i++)
        if (gc.tokens[i] != gt.tokens[i])
            differ = (int)i;
    CHECK_MSG(differ < 0, "%s: greedy token %d differs from the CPU's", path, differ);
    CHECK(generate(one, 16, 0.9f, &so, NULL, &err) == BN_OK);
    CHECK(generate(team, 16, 0.9f, &stm, NULL, &err) == BN_OK);
    CHECK_MSG(so.n_tokens == stm.n_tokens &&
                  memcmp(so.tokens, stm.tokens, so.n_tokens * sizeof(int32_t)) == 0,
              "%s: sampled tokens differ from one GPU's", path);
    /* A sampler of top-k 1 picks the greedy token (it reads the gathered
     * logits, not the screened head's key). */
    bn_generation k1;
    CHECK(generate_k(team, 24, 0.9f, 1, &k1, NULL, &err) == BN_OK);
    CHECK_MSG(k1.n_tokens == gc.n_tokens &&
                  memcmp(k1.tokens, gc.tokens, gc.n_tokens * sizeof(int32_t)) == 0,
              "%s: top-k 1 sampling differs from greedy", path);
    bn_generation_free(&k1);
    bn_engine_info info;
    bn_engine_get_info(team, &info);
    CHECK(info.tensor_parallel == 2 && strcmp(info.selected, "cuda:0,1") == 0);
    CHECK_STR_CONTAINS(bn_engine_startup_line(team), "tensor parallel over 2 GPUs");
    CHECK(bn_engine_backend_handle(team, "cuda") == NULL);
    if (strcmp(path, "random") == 0) /* its greedy steps take the split screened head */
        CHECK_STR_CONTAINS(bn_engine_startup_line(team), "greedy head screened");
    printf("%-60s split 2 ways: 24 greedy tokens equal the CPU's, logits within %.2e rel\n",
           path, (double)rel);
    bn_generation_free(&gc);
    bn_generation_free(&gt);
    bn_generation_free(&so);
    bn_generation_free(&stm);
    free(lc);
    free(lt);
    bn_engine_free(cpu);
    bn_engine_free(one);
    bn_engine_free(team);
}

/* An injected failure at the team's 3rd call: every rank fails it (no
 * rank waits for another), the request reports it, the team serves the
 * next one. */
static void team_failure(const char *path)
{
    bn_status st;
    bn_error err;
    bn_engine *team = open_team(path, "cuda:0,1", 2, 3, &st, &err);
    CHECK_MSG(team, "%s", err.message);
    if (!team)
        return;
    bn_generation g;
    st = generate(team, 8, 0.0f, &g, NULL, &err);
    CHECK_MSG(st == BN_ERR_GPU, "injected failure: %d %s", (int)st, err.message);
    CHECK_STR_CONTAINS(err.message, "injected");
    st = generate(team, 8, 0.0f, &g, NULL, &err);
    CHECK_MSG(st == BN_OK && g.n_tokens == 8, "after the failure: %s", err.message);
    if (st == BN_OK)
        bn_generation_free(&g);
    bn_engine_free(team);
}

int main(int argc, char **argv)
{
    models_dir = argc > 1 ? argv[1] : "tests/data/models";
    test_require_cuda(8, "the CUDA backend");
    int gpus = 0;
    CUDA_OK(cudaGetDeviceCount(&gpus));
    bn_log_set_level(BN_LOG_ERROR);

    const int64_t widths[] = {128, 1280, 2560, 3456, 6912, 9000};
    for (size_t i = 0; i < sizeof widths / sizeof widths[0]; i++)
        for (int parts = 1; parts <= 4; parts *= 2)
            for (int relu2 = 0; relu2 < 2; relu2++) {
                check_split_norm(1, widths[i], parts, relu2);
                check_split_norm(7, widths[i], parts, relu2);
            }
    refusals(gpus);

    if (gpus < 2) {
        printf("one CUDA device: the two-GPU checks (a model split across GPUs) are skipped\n");
        TEST_EXIT();
    }
    check_exchanges();
    static const char *const models[] = {"i2s.gguf", "tq2_0.gguf", "tq1_0.gguf", "hf_packed",
                                         "hf_bf16"};
    char path[4096];
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", models_dir, models[i]);
        team_matches(path);
    }
    bn_hparams_2b4t(&uneven);
    uneven.vocab = 131072;
    uneven.dim = 512;
    uneven.ffn = 864;
    uneven.n_layer = 3;
    uneven.n_head = 20;
    uneven.n_head_kv = 5;
    uneven.head_dim = 16;
    uneven.rope_dim = 16;
    uneven.n_ctx_train = 256;
    team_matches("random");
    char shipped[4096];
    bn_error err;
    if (bn_default_model_path(shipped, sizeof shipped, &err) == BN_OK)
        team_matches(shipped);
    snprintf(path, sizeof path, "%s/i2s.gguf", models_dir);
    team_failure(path);
    TEST_EXIT();
}
