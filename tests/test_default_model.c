/*
 * The shipped default model (models/bitnet-kjv-7m) against the record its
 * training run left (reference.json, written by scripts/train/train.py from
 * a float64 PyTorch forward of the exported weights):
 *   - greedy generation from each recorded prompt gives the recorded 32
 *     tokens exactly, from the I2_S and TQ2_0 files (and, on the CPU, the
 *     Hugging Face directory they were converted from);
 *   - the held-out perplexity (test.txt, chunks of 512) is PyTorch's
 *     within 1 %, from both files, and both files give the same value.
 *
 * usage: test_default_model MODEL_DIR cpu|cuda
 * With cuda and no usable CUDA device (or a build without CUDA) the test
 * is skipped (exit code 77) with the reason.
 */
#include <cjson/cJSON.h>

#include "engine.h"
#include "test_util.h"

#define GREEDY_STEPS 32
#define PPL_CTX 512
#define PPL_TOLERANCE 0.01

static char *read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    fseek(f, 0, SEEK_END);
    const long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = n >= 0 ? malloc((size_t)n + 1) : NULL;
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    if (buf) {
        buf[n] = '\0';
        *len = (size_t)n;
    }
    return buf;
}

/* Token ids of a JSON array into ids[] (at most cap); returns the count. */
static int json_ids(const cJSON *arr, int32_t *ids, int cap)
{
    int n = 0;
    const cJSON *v;
    cJSON_ArrayForEach(v, arr)
    {
        if (n < cap && cJSON_IsNumber(v))
            ids[n++] = (int32_t)v->valuedouble;
    }
    return n;
}

static bn_engine *open_engine(const char *path, const char *device, bool *skip)
{
    bn_config cfg;
    bn_config_defaults(&cfg);
    bn_engine_options o = {.model_path = path, .device = device};
    bn_engine *e = NULL;
    bn_error err;
    bn_error_clear(&err);
    const bn_status st = bn_engine_open(&cfg, &o, &e, &err);
    if (st == BN_OK)
        return e;
    if (strcmp(device, "cuda") == 0 &&
        (st == BN_ERR_NO_DEVICE || st == BN_ERR_DRIVER || st == BN_ERR_UNSUPPORTED)) {
        *skip = true;
        fprintf(stderr, "no usable CUDA device: %s\n", err.message);
        return NULL;
    }
    CHECK_MSG(false, "cannot open %s on %s: %s", path, device, err.message);
    return NULL;
}

/* steps: how many of the reference's GREEDY_STEPS tokens a prompt compares. */
static void check_greedy(bn_engine *e, const char *what, const cJSON *greedy, int steps)
{
    const cJSON *g;
    int index = 0;
    cJSON_ArrayForEach(g, greedy)
    {
        if (!test_in_part(index++))
            continue; /* BN_TEST_PART=i/n: another process checks this prompt */
        int32_t prompt[64], want[GREEDY_STEPS];
        const int n_prompt = json_ids(cJSON_GetObjectItem(g, "prompt_ids"), prompt, 64);
        const int n_want = json_ids(cJSON_GetObjectItem(g, "ids"), want, GREEDY_STEPS);
        const char *text = cJSON_GetStringValue(cJSON_GetObjectItem(g, "prompt"));
        CHECK(n_prompt > 0 && n_want == GREEDY_STEPS);
        bn_generate_request req = {.prompt_tokens = prompt,
                                   .n_prompt_tokens = (size_t)n_prompt,
                                   .n_predict = (size_t)steps,
                                   .ignore_eog = true};
        bn_sampler_params_default(&req.sampling);
        req.sampling.temperature = 0.0f;
        bn_generation gen;
        bn_error err;
        bn_error_clear(&err);
        if (bn_engine_generate(e, &req, &gen, &err) != BN_OK) {
            CHECK_MSG(false, "%s: generation failed: %s", what, err.message);
            continue;
        }
        int same = 0;
        while (same < (int)gen.n_tokens && same < steps && gen.tokens[same] == want[same])
            same++;
        CHECK_MSG(same == steps && (int)gen.n_tokens == steps,
                  "%s, prompt \"%s\": %d of %d greedy tokens as PyTorch's (first difference at "
                  "step %d)",
                  what, text, same, steps, same);
        printf("%s, \"%s\": %d/%d greedy tokens as PyTorch's:%s\n", what, text, same, steps,
               gen.text);
        bn_generation_free(&gen);
    }
}

static double check_perplexity(bn_engine *e, const char *what, const char *text, size_t len,
                               double want)
{
    bn_perplexity_result r;
    bn_error err;
    bn_error_clear(&err);
    if (bn_engine_perplexity(e, text, len, PPL_CTX, NULL, NULL, &r, &err) != BN_OK) {
        CHECK_MSG(false, "%s: perplexity failed: %s", what, err.message);
        return -1.0;
    }
    const double rel = r.perplexity / want - 1.0;
    CHECK_MSG(fabs(rel) <= PPL_TOLERANCE, "%s: perplexity %.4f vs PyTorch %.4f (%+.3f %%)", what,
              r.perplexity, want, 100.0 * rel);
    CHECK(r.n_predicted == r.n_text_tokens && r.n_chunks > 1);
    printf("%s: held-out perplexity %.4f over %lld tokens, PyTorch %.4f (%+.4f %%), %.1f s\n",
           what, r.perplexity, (long long)r.n_predicted, want, 100.0 * rel, r.seconds);
    return r.perplexity;
}

int main(int argc, char **argv)
{
    if (argc != 3 || (strcmp(argv[2], "cpu") != 0 && strcmp(argv[2], "cuda") != 0)) {
        fprintf(stderr, "usage: test_default_model MODEL_DIR cpu|cuda\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress shows in a log cut short by a timeout */
    const char *dir = argv[1], *device = argv[2];
    char path[4096];
    size_t len = 0, text_len = 0;
    snprintf(path, sizeof path, "%s/reference.json", dir);
    char *json = read_file(path, &len);
    snprintf(path, sizeof path, "%s/test.txt", dir);
    char *text = read_file(path, &text_len);
    if (!json || !text) {
        fprintf(stderr, "FAIL: %s/reference.json or test.txt is missing\n", dir);
        return 1;
    }
    cJSON *ref = cJSON_Parse(json);
    const cJSON *greedy = cJSON_GetObjectItem(ref, "greedy");
    const double want_ppl = cJSON_GetNumberValue(cJSON_GetObjectItem(ref, "test_ppl_ctx512"));
    CHECK(ref && cJSON_GetArraySize(greedy) >= 3 && want_ppl > 1.0);

    /* BN_TEST_QUICK=1 (the compute-sanitizer runs of scripts/gpu-check.sh):
     * the greedy checks on the first file only and over their first 8 steps
     * (every kernel a longer run launches); the held-out perplexity
     * (hundreds of chunks) is left to the full run. */
    const bool quick = getenv("BN_TEST_QUICK") && strcmp(getenv("BN_TEST_QUICK"), "0") != 0;
    const char *files[] = {"bitnet-kjv-7m-i2_s.gguf", "bitnet-kjv-7m-tq2_0.gguf", "hf"};
    double ppl[2] = {0, 0};
    for (int f = 0; f < 3; f++) {
        const bool hf = strcmp(files[f], "hf") == 0;
        if (hf && strcmp(device, "cpu") != 0)
            continue; /* the same numbers as the files; the CPU run covers the reader */
        if (quick && f > 0)
            continue;
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        bool skip = false;
        bn_engine *e = open_engine(path, device, &skip);
        if (skip) {
            cJSON_Delete(ref);
            free(json);
            free(text);
            return 77;
        }
        if (!e)
            continue;
        char what[256];
        snprintf(what, sizeof what, "%s on %s", files[f], bn_engine_startup_line(e));
        check_greedy(e, what, greedy, quick ? 8 : GREEDY_STEPS);
        if (!hf && !quick)
            ppl[f] = check_perplexity(e, what, text, text_len, want_ppl);
        bn_engine_free(e);
    }
    /* The two files hold the same codes and scales: the same arithmetic. */
    if (!quick)
        CHECK_MSG(ppl[0] == ppl[1], "I2_S %.9g vs TQ2_0 %.9g", ppl[0], ppl[1]);

    cJSON_Delete(ref);
    free(json);
    free(text);
    TEST_EXIT();
}
