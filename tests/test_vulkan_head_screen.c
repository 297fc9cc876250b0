/* The Vulkan screened LM head (src/vulkan/vk_head_screen.h) on the first
 * Vulkan device (lavapipe here and in CI), against the full head's logits
 * from bn_vk_head_record (the CPU's arithmetic bit for bit: test_vulkan_ops)
 * and the CPU sampler's greedy rule:
 *   - the greedy rule over a candidate list (NaN, +inf, -inf, ties, rows
 *     out of order) is the sampler's over the full logits;
 *   - random F16 and F32 heads (widths 16 to 2560, vocabularies that are
 *     no multiple of a workgroup's rows): the candidates are distinct rows,
 *     their logits the full head's bit for bit, every row holding the
 *     largest logit among them, the pick the full head's greedy token; on
 *     Gaussian rows and x the list is short (the bound narrows);
 *   - narrow rows (width 16, where the int8 estimate often ranks rows
 *     otherwise than their logits) over many seeds: the pick never misses;
 *   - planted rows: two rows whose int8 estimates rank them against their
 *     logits (the best row only found through its bound), two equal best
 *     rows (the lower index wins), rows of zeros and a NaN weight (always
 *     candidates), a +inf weight (its +inf logit wins);
 *   - x of zeros (every row a candidate, all tied: token 0) and x holding a
 *     NaN (every row a candidate: past the list's room the pick is left to
 *     the full head).
 * Exits 77 (skipped) when no Vulkan device with fp64 can be opened. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fp16.h"
#include "sampler.h"
#include "test_util.h"
#include "test_util_vulkan.h"
#include "vk_head_screen.h"
#include "vk_ops.h"

/* A head as the tests build it: rows of floats (F16 ones already rounded
 * to half), given to the screen's builder row by row. */
typedef struct test_head {
    int64_t vocab, dim;
    bool f16;
    float *w; /* [vocab][dim] */
} test_head;

static void head_row(void *ctx, int64_t r, float *out)
{
    const test_head *h = ctx;
    memcpy(out, h->w + r * h->dim, (size_t)h->dim * sizeof(float));
}

static uint64_t rng_state = 88172645463325252ull;
static double uniform(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (double)(rng_state >> 11) / 9007199254740992.0;
}
static float gaussian(void)
{
    const double u1 = uniform() + 1e-300, u2 = uniform();
    return (float)(sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2));
}

/* The CPU sampler's greedy token of n logits (a copy: it rewrites them). */
static int32_t sampler_greedy(const float *logits, int64_t n)
{
    bn_sampler_params p;
    bn_sampler_params_default(&p);
    p.temperature = 0.0f;
    bn_sampler *s = NULL;
    bn_error err;
    float *copy = malloc((size_t)n * sizeof *copy);
    int32_t t = -2;
    if (copy && bn_sampler_create(&p, (int32_t)n, &s, &err) == BN_OK) {
        memcpy(copy, logits, (size_t)n * sizeof *copy);
        t = bn_sampler_sample(s, copy, NULL, 0);
    }
    bn_sampler_free(s);
    free(copy);
    return t;
}

/* bn_vk_greedy_pick over a list against the sampler over the full logits
 * (the others -inf). */
static void check_rule(const float *vals, const uint32_t *rows, int n, int64_t vocab)
{
    float *full = malloc((size_t)vocab * sizeof *full);
    if (!full)
        return;
    for (int64_t i = 0; i < vocab; i++)
        full[i] = -INFINITY;
    for (int k = 0; k < n; k++)
        full[rows ? rows[k] : (uint32_t)k] = vals[k];
    const int32_t want = sampler_greedy(full, vocab), got = bn_vk_greedy_pick(vals, rows, n);
    CHECK_MSG(got == want, "greedy rule over %d values: %d, the sampler's %d", n, got, want);
    free(full);
}

static void check_greedy_rule(void)
{
    const float ties[] = {1, 3, 3, 2};
    check_rule(ties, NULL, 4, 4);
    const float none[] = {NAN, -INFINITY};
    check_rule(none, NULL, 2, 2);
    CHECK(bn_vk_greedy_pick(none, NULL, 2) == BN_SAMPLER_NO_TOKEN);
    const float infs[] = {1, INFINITY, 2, INFINITY};
    check_rule(infs, NULL, 4, 4);
    const float nan_first[] = {NAN, 5, 5};
    check_rule(nan_first, NULL, 3, 3);
    /* A list out of order: the tie goes to the lower token, not the
     * earlier place. */
    const uint32_t rows[] = {9, 4, 7, 2};
    const float listed[] = {5, 5, 1, NAN};
    check_rule(listed, rows, 4, 12);
    CHECK(bn_vk_greedy_pick(listed, rows, 4) == 4);
    const float listed_inf[] = {INFINITY, 0, INFINITY, 1};
    check_rule(listed_inf, rows, 4, 12);
    CHECK(bn_vk_greedy_pick(listed_inf, rows, 0) == BN_SAMPLER_NO_TOKEN);
}

typedef struct run_result {
    uint32_t count;
    bool picked;   /* the list held every candidate */
    int32_t token; /* its pick */
    int32_t full;  /* the full head's greedy token */
} run_result;

/* The screen of x against h beside the full head, checked; false when the
 * device could not run it. */
static bool run_case(bn_vk *vk, bn_vk_ops *ops, const test_head *h, const float *x,
                     const char *what, run_result *out)
{
    memset(out, 0, sizeof *out);
    bn_error err;
    bn_vk_head_screen *s = NULL;
    if (bn_vk_head_screen_create(vk, h->vocab, h->dim, head_row, (void *)h, 1, &s, &err) != BN_OK) {
        CHECK_MSG(false, "%s: create: %s", what, err.message);
        return false;
    }
    const size_t n = (size_t)(h->vocab * h->dim);
    const size_t head_bytes = h->f16 ? n * 2 : n * 4;
    void *head_host = malloc(head_bytes);
    float *logits = malloc((size_t)h->vocab * sizeof *logits);
    bn_vk_buffer head = {0}, bx = {0}, bl = {0}, dst = {0};
    void *dst_map = NULL;
    bool ok = head_host && logits;
    if (ok) {
        for (size_t i = 0; i < n; i++)
            if (h->f16)
                ((uint16_t *)head_host)[i] = bn_fp32_to_fp16(h->w[i]);
            else
                ((float *)head_host)[i] = h->w[i];
        ok = bn_vk_buffer_create(vk, head_bytes, &head, &err) == BN_OK &&
             bn_vk_buffer_create(vk, (size_t)h->dim * 4, &bx, &err) == BN_OK &&
             bn_vk_buffer_create(vk, (size_t)h->vocab * 4, &bl, &err) == BN_OK &&
             bn_vk_host_buffer_create(vk, 256 + BN_VK_SCREEN_RESULT_BYTES, &dst, &dst_map, &err) ==
                 BN_OK &&
             bn_vk_write(vk, &head, head_host, head_bytes, &err) == BN_OK &&
             bn_vk_write(vk, &bx, x, (size_t)h->dim * 4, &err) == BN_OK;
    }
    if (ok) {
        /* Poison: a result the dispatches did not write shows. */
        memset(dst_map, 0xa5, 256 + BN_VK_SCREEN_RESULT_BYTES);
        const bn_vk_head_type type = h->f16 ? BN_VK_HEAD_F16 : BN_VK_HEAD_F32;
        bn_error closing;
        ok = bn_vk_begin(vk, &err) == BN_OK;
        bn_status st =
            ok ? bn_vk_head_screen_record(vk, s, &head, type, &bx, &dst, 256, &err) : BN_ERR_GPU;
        if (st == BN_OK)
            st = bn_vk_head_record(vk, ops, &head, type, 0, h->vocab, h->dim, &bx, 1, &bl, h->vocab,
                                   &err);
        if (ok)
            ok = bn_vk_submit(vk, st == BN_OK ? &err : &closing) == BN_OK && st == BN_OK;
        ok = ok && bn_vk_read(vk, &bl, logits, (size_t)h->vocab * 4, &err) == BN_OK;
    }
    CHECK_MSG(ok, "%s: %s", what, err.message);
    if (ok) {
        const uint32_t *res = (const uint32_t *)(const void *)((const char *)dst_map + 256);
        const uint32_t count = res[0];
        out->count = count;
        out->full = sampler_greedy(logits, h->vocab);
        out->picked = bn_vk_head_screen_pick(res, &out->token);
        CHECK_MSG(count <= (uint32_t)h->vocab, "%s: %u candidates of %lld rows", what, count,
                  (long long)h->vocab);
        if (out->picked) {
            /* Distinct rows, their logits the full head's, every largest
             * logit's row among them. */
            char *seen = calloc((size_t)h->vocab, 1);
            int bad_rows = 0, bad_logits = 0;
            for (uint32_t k = 0; seen && k < count; k++) {
                const uint32_t r = res[1 + k];
                if (r >= (uint32_t)h->vocab || seen[r]) {
                    bad_rows++;
                    continue;
                }
                seen[r] = 1;
                if (memcmp(&res[1 + BN_VK_SCREEN_CAP + k], &logits[r], 4) != 0)
                    bad_logits++;
            }
            CHECK_MSG(bad_rows == 0, "%s: %d listed rows repeated or out of range", what, bad_rows);
            CHECK_MSG(bad_logits == 0, "%s: %d candidates' logits differ from the full head's",
                      what, bad_logits);
            float best = -INFINITY;
            for (int64_t r = 0; r < h->vocab; r++)
                if (!isnan(logits[r]) && logits[r] > best)
                    best = logits[r];
            int missed = 0;
            for (int64_t r = 0; seen && r < h->vocab && best > -INFINITY; r++)
                missed += logits[r] == best && !seen[r];
            CHECK_MSG(missed == 0, "%s: %d rows holding the largest logit are not candidates", what,
                      missed);
            CHECK_MSG(out->token == out->full, "%s: picked %d, the full head's greedy token %d",
                      what, out->token, out->full);
            free(seen);
        }
    }
    bn_vk_buffer_free(vk, &head);
    bn_vk_buffer_free(vk, &bx);
    bn_vk_buffer_free(vk, &bl);
    bn_vk_buffer_free(vk, &dst);
    bn_vk_head_screen_free(vk, s);
    free(head_host);
    free(logits);
    return ok;
}

static bool make_head(test_head *h, int64_t vocab, int64_t dim, bool f16)
{
    h->vocab = vocab;
    h->dim = dim;
    h->f16 = f16;
    h->w = malloc((size_t)(vocab * dim) * sizeof *h->w);
    if (!h->w)
        return false;
    for (int64_t i = 0; i < vocab * dim; i++) {
        const float v = 0.05f * gaussian();
        h->w[i] = f16 ? bn_fp16_to_fp32(bn_fp32_to_fp16(v)) : v;
    }
    return true;
}

static void gaussian_x(float *x, int64_t dim)
{
    for (int64_t i = 0; i < dim; i++)
        x[i] = gaussian();
}

/* Every case on device 0 as it is opened now: 1 when its bounds took the
 * device's integer dot products, 0 the portable sums, -1 when it has no
 * fp64 (nothing ran). */
static int check_device(void)
{
    int count = 0;
    bn_vk *vk = test_require_vulkan(&count);
    if (!bn_vk_head_screen_fits(vk, 64)) {
        bn_vk_close(vk);
        return -1;
    }
    printf("bounds by %s integer sums\n",
           bn_vk_device(vk)->integer_dot_product ? "the device's dot-product" : "portable");
    bn_error err;
    bn_vk_ops *ops = NULL;
    CHECK(bn_vk_ops_create(vk, &ops, &err) == BN_OK);
    float *x = malloc(2560 * sizeof *x);
    if (!ops || !x)
        exit(1);
    CHECK(!bn_vk_head_screen_fits(vk, 12) && !bn_vk_head_screen_fits(vk, 0));

    /* Gaussian heads: the pick, and a short list. */
    const struct {
        int64_t vocab, dim;
        bool f16;
    } shapes[] = {{5000, 256, true}, {4099, 64, false}, {2053, 2560, true}, {333, 8, false}};
    for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
        test_head h;
        if (!make_head(&h, shapes[c].vocab, shapes[c].dim, shapes[c].f16))
            exit(1);
        gaussian_x(x, h.dim);
        char what[96];
        snprintf(what, sizeof what, "%s head %lld x %lld", h.f16 ? "F16" : "F32",
                 (long long)h.vocab, (long long)h.dim);
        run_result r;
        if (run_case(vk, ops, &h, x, what, &r)) {
            printf("%-28s %5u candidates, token %d\n", what, r.count, r.token);
            CHECK_MSG(r.picked && r.count <= (uint32_t)h.vocab / 10,
                      "%s: %u candidates: the bound does not narrow", what, r.count);
        }
        free(h.w);
    }

    /* Narrow rows over many seeds: the int8 estimate alone often ranks the
     * best rows otherwise; the pick must still be the full head's. */
    int runs = 0, short_lists = 0;
    for (int seed = 0; seed < 24; seed++) {
        test_head h;
        if (!make_head(&h, 3000, 16, seed % 2 == 0))
            exit(1);
        gaussian_x(x, h.dim);
        run_result r;
        runs += run_case(vk, ops, &h, x, "narrow rows", &r);
        short_lists += r.picked;
        free(h.w);
    }
    printf("narrow rows: %d runs, %d picked from the list\n", runs, short_lists);
    CHECK(runs == 24 && short_lists == 24);

    /* Planted rows. */
    test_head h;
    if (!make_head(&h, 4500, 64, false))
        exit(1);
    /* x = 1 on four values (exact in its codes); row 100 = (1, 0.00393),
     * row 50 = (1, 0, 0.004, -0.0001): int8 steps of 1/127 give row 100
     * the estimate 1 and row 50 1 + 1/127, while their logits are 1.00393
     * and 1.0039: only row 100's bound keeps it. */
    memset(x, 0, (size_t)h.dim * sizeof *x);
    for (int i = 0; i < 4; i++)
        x[i] = 1.0f;
    for (int64_t i = 0; i < h.dim; i++)
        h.w[100 * h.dim + i] = h.w[50 * h.dim + i] = 0.0f;
    h.w[100 * h.dim] = h.w[50 * h.dim] = 1.0f;
    h.w[100 * h.dim + 1] = 0.00393f;
    h.w[50 * h.dim + 2] = 0.004f;
    h.w[50 * h.dim + 3] = -0.0001f;
    run_result r;
    if (run_case(vk, ops, &h, x, "estimates against logits", &r))
        CHECK_MSG(r.picked && r.token == 100, "estimates against logits: token %d, want 100",
                  r.token);
    gaussian_x(x, h.dim);
    for (int64_t i = 0; i < h.dim; i++) { /* rows 7 and 3001: equal, the best by far */
        h.w[7 * h.dim + i] = x[i] > 0 ? 0.5f : -0.5f;
        h.w[3001 * h.dim + i] = h.w[7 * h.dim + i];
        h.w[20 * h.dim + i] = 0.0f; /* zeros: never bounded */
        h.w[4499 * h.dim + i] = 0.0f;
    }
    h.w[33 * h.dim + 5] = NAN; /* a NaN logit: never chosen */
    if (run_case(vk, ops, &h, x, "planted tie", &r))
        CHECK_MSG(r.picked && r.token == 7, "planted tie: token %d, want 7", r.token);
    x[3] = fabsf(x[3]) + 1.0f;
    h.w[4000 * h.dim + 3] = INFINITY; /* a +inf logit wins */
    if (run_case(vk, ops, &h, x, "planted +inf", &r))
        CHECK_MSG(r.picked && r.token == 4000, "planted +inf: token %d, want 4000", r.token);

    /* x of zeros: every row a candidate, all tied at 0 (the NaN row aside). */
    test_head small;
    if (!make_head(&small, 1000, 64, true))
        exit(1);
    memset(x, 0, 64 * sizeof *x);
    if (run_case(vk, ops, &small, x, "x of zeros", &r))
        CHECK_MSG(r.picked && r.count == 1000 && r.token == 0,
                  "x of zeros: %u candidates, token %d", r.count, r.token);
    /* x holding a NaN: every row a candidate; 4500 do not fit the list. */
    gaussian_x(x, h.dim);
    x[10] = NAN;
    if (run_case(vk, ops, &h, x, "x with a NaN", &r))
        CHECK_MSG(!r.picked && r.count == 4500, "x with a NaN: %u candidates, picked %d", r.count,
                  (int)r.picked);
    free(small.w);
    free(h.w);
    free(x);
    const int dot = bn_vk_device(vk)->integer_dot_product ? 1 : 0;
    bn_vk_ops_free(vk, ops);
    bn_vk_close(vk);
    return dot;
}

int main(void)
{
    check_greedy_rule();
    const int dot = check_device();
    if (dot < 0)
        TEST_SKIP("Vulkan device 0 has no fp64: the screened head needs it");
    if (dot == 1) { /* the portable sums too */
        setenv("BITNET_VULKAN_DOT", "0", 1);
        check_device();
    }
    TEST_EXIT();
}
