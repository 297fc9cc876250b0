/*
 * dispatch_chain.c - what a dispatch costs on a Vulkan device, for the
 * backend's decode step (docs/VULKAN.md, "Speed"), whose ~360 dispatches
 * run one after another with a barrier between each.
 *
 * Each case is a chain of N dispatches recorded into one command buffer
 * and submitted once: "chained" with a barrier before each (as the step
 * records them), "free" without (bn_vk_next_independent: the device may
 * overlap them). Per dispatch = (time(N) - time(1)) / (N - 1), the best of
 * five submissions, so the submission's own cost drops out.
 *
 *   empty 1 / 320      workgroups of 256 that do nothing
 *   tree R             one workgroup of 256, R rounds of 8-level
 *                      shared-memory tree sums (a barrier a level)
 *   chase L            one invocation, L dependent loads from a buffer
 *                      larger than the caches
 *   stream             320 workgroups reading 1.6 MB (a 2560 x 2560 W2A8
 *                      matrix), 16 bytes an invocation at a time
 *   norm n             the shipped norm + int8 of one row of n (vk_norm.h)
 *   norm lab_V, n      shaders/norm_lab.glsl's variants of it (a copy of
 *                      the shader at 13c87ee with switches: what its time
 *                      was made of, and faster forms)
 *   norm phase_V, n    shaders/norm_phase.glsl's: the shipped shader
 *                      stopped after each phase, its codes from float
 *                      products, with 256 invocations
 *   product n x k      the shipped W2A8 product of one row (vk_w2a8.h);
 *                      gate|up the feed-forward's pair in one dispatch
 *   normed n x k       the shipped product that norms its float row itself
 *                      (bn_vk_w2a8_record_normed, the residual add): what
 *                      norm + product cost as one dispatch
 *
 * Checks: the tree's and the chase's results against the CPU's; each norm
 * variant that writes codes against the CPU's bn_norm_quantize_row, bit for
 * bit, on rows of 2560 and 6912 (one of values too small for the exact
 * rule); the shipped kernels are checked by tests/test_vulkan_*.c.
 *
 *   make -C dev/vulkan BUILD=../../build   (a build with -DBITNET_VULKAN=ON)
 *   dev/vulkan/dispatch_chain [device [chain length]]
 */
#include "lab.h"
#include "quant_rules.h"
#include "vk_norm.h"
#include "vk_w2a8.h"

/* ---- the cases ----------------------------------------------------------------- */

typedef struct {
    bn_vk_kernel *k;
    bn_vk_buffer *bufs[7];
    uint32_t push[4];
    uint32_t groups;
} plain_case;

static void record_plain(bn_vk *vk, void *ctx)
{
    plain_case *c = ctx;
    OK(bn_vk_dispatch(vk, c->k, c->bufs, c->push, c->groups, 1, &err), "dispatch");
}

typedef struct {
    bn_vk_kernel *k;
    bn_vk_buffer *x, *w, *codes, *scales, *sums;
    int64_t n;
} norm_case;

static void record_norm(bn_vk *vk, void *ctx)
{
    norm_case *c = ctx;
    OK(bn_vk_norm_record(vk, c->k, c->x, c->w, c->codes, c->scales, c->sums, 1, c->n, 1e-5f, &err),
       "norm");
}

typedef struct {
    bn_vk_kernel *k;
    bn_vk_buffer *w, *x, *scales, *y;
    int64_t n, k_dim;
    bool gate_up;
} product_case;

typedef struct {
    bn_vk_kernel *k;
    bn_vk_buffer *w, *x, *norm_w, *y;
    int64_t n, k_dim;
} normed_case;

/* The row is normed again each time and its product added to y: the
 * values grow, the work does not. */
static void record_normed(bn_vk *vk, void *ctx)
{
    normed_case *c = ctx;
    OK(bn_vk_w2a8_record_normed(vk, c->k, c->w, c->x, c->norm_w, 1e-5f, c->y, c->n, c->k_dim, 1.0f,
                                BN_VK_W2A8_ADD, &err),
       "normed product");
}

static void record_product(bn_vk *vk, void *ctx)
{
    product_case *c = ctx;
    if (c->gate_up)
        OK(bn_vk_w2a8_record_gate_up(vk, c->k, c->w, c->x, c->scales, 0, 1, c->y, c->n, c->k_dim,
                                     0.5f, 0.25f, &err),
           "gate|up");
    else
        OK(bn_vk_w2a8_record_rows(vk, c->k, c->w, c->x, c->scales, 0, 1, c->y, c->n, c->k_dim, 0.5f,
                                  BN_VK_W2A8_STORE, &err),
           "product");
}

int main(int argc, char **argv)
{
    const int device = argc > 1 ? atoi(argv[1]) : 0;
    lab_init(argc, argv);
    bn_vk *vk = NULL;
    OK(bn_vk_open(device, &vk, &err), "open");
    const bn_vulkan_device *d = bn_vk_device(vk);
    printf("device %d: %s (%s), fp64 %s, integer dot products %s\n", device, d->name, d->type,
           d->fp64 ? "yes" : "no", d->integer_dot_product ? "yes" : "no");
    int failed = 0;

    /* The checks. */
    bn_vk_kernel *tree = lab_kernel(vk, "tree", 1, 4), *chase = lab_kernel(vk, "chase", 1, 8);
    bn_vk_kernel *empty = lab_kernel(vk, "empty", 1, 4), *stream = lab_kernel(vk, "stream", 2, 4);
    bn_vk_buffer out = buffer_with(vk, NULL, 4096 * 4);
    {
        plain_case c = {tree, {&out}, {3}, 1};
        OK(bn_vk_begin(vk, &err), "begin");
        record_plain(vk, &c);
        OK(bn_vk_submit(vk, &err), "submit");
        uint32_t got;
        OK(bn_vk_read(vk, &out, &got, 4, &err), "read");
        uint32_t v[256];
        for (uint32_t t = 0; t < 256; t++)
            v[t] = t;
        uint32_t sum = 0;
        for (int r = 0; r < 3; r++) {
            sum = 0;
            for (int t = 0; t < 256; t++)
                sum += v[t];
            for (uint32_t t = 0; t < 256; t++)
                v[t] = sum + t;
        }
        printf("check tree: %u, want %u: %s\n", got, sum, got == sum ? "ok" : "FAILED");
        failed += got != sum;
    }
    /* A random cycle through 32 M entries (128 MiB, past the caches). */
    const uint32_t n_next = 1u << 25;
    uint32_t *next = malloc((size_t)n_next * 4), *perm = malloc((size_t)n_next * 4);
    if (!next || !perm)
        die("no memory", NULL);
    for (uint32_t i = 0; i < n_next; i++)
        perm[i] = i;
    for (uint32_t i = n_next - 1; i > 1; i--) {
        const uint32_t j = 1 + next_rand() % i; /* keep 0 first */
        const uint32_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (uint32_t i = 0; i + 1 < n_next; i++)
        next[perm[i]] = perm[i + 1];
    next[perm[n_next - 1]] = perm[0];
    bn_vk_buffer chain_buf = buffer_with(vk, next, (size_t)n_next * 4 + 4);
    {
        plain_case c = {chase, {&chain_buf}, {100, n_next}, 1};
        OK(bn_vk_begin(vk, &err), "begin");
        record_plain(vk, &c);
        OK(bn_vk_submit(vk, &err), "submit");
        uint32_t got, want = 0;
        OK(bn_vk_read_at(vk, &chain_buf, (size_t)n_next * 4, &got, 4, &err), "read");
        for (int s = 0; s < 100; s++)
            want = next[want];
        printf("check chase: %u, want %u: %s\n", got, want, got == want ? "ok" : "FAILED");
        failed += got != want;
    }

    printf("\nus a dispatch, chains of %d in one submission (one: a submission of one)\n", N_CHAIN);
    printf("  %-28s %9s %9s %9s\n", "case", "chained", "free", "one");
    plain_case e1 = {empty, {&out}, {~0u}, 1}, e320 = {empty, {&out}, {~0u}, 320};
    report(vk, "empty, 1 workgroup", record_plain, &e1, true);
    report(vk, "empty, 320 workgroups", record_plain, &e320, true);
    static const uint32_t rounds[] = {1, 3, 10};
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "tree, %u rounds of 8", rounds[i]);
        plain_case c = {tree, {&out}, {rounds[i]}, 1};
        report(vk, name, record_plain, &c, false);
    }
    static const uint32_t steps[] = {1, 10, 40};
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "chase, %u loads", steps[i]);
        plain_case c = {chase, {&chain_buf}, {steps[i], n_next}, 1};
        report(vk, name, record_plain, &c, false);
    }
    /* 1.6 MB over 320 workgroups, from a 512 MiB pool walked through so the
     * reads come from memory (the step's weights do not fit L2 either). */
    {
        const size_t pool = (size_t)512 << 20, slice = 2560 * 2560 / 4;
        bn_vk_buffer big = buffer_with(vk, NULL, pool);
        plain_case c = {stream, {&big, &out}, {(uint32_t)(slice / 16 / 320)}, 320};
        report(vk, "stream 1.6 MB, 320 wg", record_plain, &c, true);
        bn_vk_buffer_free(vk, &big);
    }
    if (d->fp64) {
        bn_vk_kernel *nk = NULL;
        OK(bn_vk_norm_kernel(vk, bn_vk_norm_subgroups(vk), &nk, &err), "norm kernel");
        static const int64_t ns[] = {2560, 6912};
        for (int i = 0; i < 2; i++) {
            const int64_t n = ns[i];
            float *x = malloc((size_t)n * 4), *w = malloc((size_t)n * 4);
            for (int64_t j = 0; j < n; j++) {
                x[j] = (float)((int)(next_rand() % 2001) - 1000) / 250.0f;
                w[j] = (float)(next_rand() % 1000) / 500.0f;
            }
            bn_vk_buffer bx = buffer_with(vk, x, (size_t)n * 4),
                         bw = buffer_with(vk, w, (size_t)n * 4);
            bn_vk_buffer codes = buffer_with(vk, NULL, bn_vk_w2a8_words(n) * 16);
            bn_vk_buffer sc = buffer_with(vk, NULL, 4), sums = buffer_with(vk, NULL, 4);
            norm_case c = {nk, &bx, &bw, &codes, &sc, &sums, n};
            char name[64];
            snprintf(name, sizeof name, "norm + int8, 1 x %lld", (long long)n);
            report(vk, name, record_norm, &c, false);
            bn_vk_buffer *all[] = {&bx, &bw, &codes, &sc, &sums};
            for (int j = 0; j < 5; j++)
                bn_vk_buffer_free(vk, all[j]);
            free(x);
            free(w);
        }
        bn_vk_kernel_free(vk, nk);
    }
    if (d->fp64) {
        /* norm_lab.glsl's variants, then norm_phase.glsl's (the shipped
         * kernel stopped after each phase; the forms that do not give the
         * CPU's codes are not checked). */
        static const struct {
            const char *name;
            bool checked;
        } variants[] = {
            {"lab_base", true},           {"lab_nostage", true},         {"lab_subgroup", true},
            {"lab_merged", true},         {"lab_subgroup_merged", true}, {"lab_skip_fmax", false},
            {"lab_skip_codes", false},    {"lab_skip_both", false},      {"lab_wg1024", true},
            {"lab_wg1024_nostage", true}, {"phase_full", true},          {"phase_stop1", false},
            {"phase_stop2", false},       {"phase_stop3", false},        {"phase_stop4", false},
            {"phase_float_codes", false}, {"phase_t256", true}};
        static const int64_t ns[] = {2560, 6912};
        for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
            char name[64];
            snprintf(name, sizeof name, "norm_%s", variants[v].name);
            bn_vk_kernel *k = lab_kernel(vk, name, 5, 16);
            const bool writes_codes = variants[v].checked;
            for (int i = 0; i < 2; i++) {
                const int64_t n = ns[i], rows = 3;
                const size_t words = bn_vk_w2a8_words(n);
                float *x = malloc((size_t)(rows * n) * 4), *w = malloc((size_t)n * 4);
                /* Row 2's values (~1e-9) norm to below QUANT_EPS: the plain rule. */
                for (int64_t j = 0; j < rows * n; j++)
                    x[j] =
                        (float)((int)(next_rand() % 2001) - 1000) / (j / n == 2 ? 1e12f : 250.0f);
                for (int64_t j = 0; j < n; j++)
                    w[j] = (float)(next_rand() % 1000) / 500.0f;
                bn_vk_buffer bx = buffer_with(vk, x, (size_t)(rows * n) * 4);
                bn_vk_buffer bw = buffer_with(vk, w, (size_t)n * 4);
                bn_vk_buffer codes = buffer_with(vk, NULL, (size_t)rows * words * 16);
                bn_vk_buffer sc = buffer_with(vk, NULL, (size_t)rows * 4);
                bn_vk_buffer sums = buffer_with(vk, NULL, (size_t)rows * 4);
                bn_vk_buffer *bufs[5] = {&bx, &bw, &codes, &sc, &sums};
                if (writes_codes) {
                    const struct {
                        uint32_t rows, n, words;
                        float eps;
                    } push = {(uint32_t)rows, (uint32_t)n, (uint32_t)(words * 4), 1e-5f};
                    OK(bn_vk_begin(vk, &err), "begin");
                    OK(bn_vk_dispatch(vk, k, bufs, &push, (uint32_t)rows, 1, &err), "dispatch");
                    OK(bn_vk_submit(vk, &err), "submit");
                    int8_t *got = malloc((size_t)rows * words * 16), *want = malloc((size_t)n);
                    float gs[3];
                    int32_t gsum[3];
                    OK(bn_vk_read(vk, &codes, got, (size_t)rows * words * 16, &err), "read");
                    OK(bn_vk_read(vk, &sc, gs, sizeof gs, &err), "read");
                    OK(bn_vk_read(vk, &sums, gsum, sizeof gsum, &err), "read");
                    int bad = 0;
                    for (int64_t r = 0; r < rows; r++) {
                        float ws;
                        int32_t wsum;
                        bn_norm_quantize_row(x + r * n, w, n, 1e-5f, want, &ws, &wsum);
                        bad += memcmp(got + r * words * 16, want, (size_t)n) != 0 ||
                               memcmp(&gs[r], &ws, 4) != 0 || gsum[r] != wsum;
                    }
                    printf("check %s, n %lld: %s\n", name, (long long)n,
                           bad ? "FAILED" : "ok (codes, scales, sums as the CPU's)");
                    failed += bad != 0;
                    free(got);
                    free(want);
                }
                plain_case c = {k,
                                {&bx, &bw, &codes, &sc, &sums},
                                {1, (uint32_t)n, (uint32_t)(words * 4), 0},
                                1};
                const float eps = 1e-5f;
                memcpy(&c.push[3], &eps, 4);
                char label[64];
                snprintf(label, sizeof label, "norm %s, %lld", variants[v].name, (long long)n);
                report(vk, label, record_plain, &c, false);
                for (int j = 0; j < 5; j++)
                    bn_vk_buffer_free(vk, bufs[j]);
                free(x);
                free(w);
            }
            bn_vk_kernel_free(vk, k);
        }
    }
    {
        bn_vk_kernel *pk = NULL;
        OK(bn_vk_w2a8_kernel(vk, d->fp64, bn_vk_w2a8_dot_fits(vk), &pk, &err), "product kernel");
        static const struct {
            int64_t n, k;
            bool gate_up;
        } shapes[] = {
            {2560, 2560, false}, {640, 2560, false}, {2560, 6912, false}, {6912, 2560, true}};
        for (int i = 0; i < 4; i++) {
            const int64_t n = shapes[i].n, k = shapes[i].k, rows = shapes[i].gate_up ? 2 * n : n;
            const size_t words = bn_vk_w2a8_words(k);
            uint32_t *wp = malloc((size_t)rows * words * 4);
            int8_t *xq = calloc(words * 16, 1);
            for (size_t j = 0; j < (size_t)rows * words; j++)
                wp[j] = next_rand();
            for (int64_t j = 0; j < k; j++)
                xq[j] = (int8_t)(next_rand() % 255 - 127);
            const float one = 1.0f;
            bn_vk_buffer bw = buffer_with(vk, wp, (size_t)rows * words * 4);
            bn_vk_buffer bx = buffer_with(vk, xq, words * 16), bs = buffer_with(vk, &one, 4);
            bn_vk_buffer by = buffer_with(vk, NULL, (size_t)n * 4);
            product_case c = {pk, &bw, &bx, &bs, &by, n, k, shapes[i].gate_up};
            char name[64];
            snprintf(name, sizeof name, "%s %lld x %lld", shapes[i].gate_up ? "gate|up" : "product",
                     (long long)n, (long long)k);
            report(vk, name, record_product, &c, false);
            bn_vk_buffer *all[] = {&bw, &bx, &bs, &by};
            for (int j = 0; j < 4; j++)
                bn_vk_buffer_free(vk, all[j]);
            free(wp);
            free(xq);
        }
        bn_vk_kernel_free(vk, pk);
    }
    if (bn_vk_w2a8_normed_fits(vk)) {
        bn_vk_kernel *nk = NULL;
        OK(bn_vk_w2a8_normed_kernel(vk, &nk, &err), "normed kernel");
        static const int64_t shapes[][2] = {{2560, 2560}, {2560, 6912}};
        for (int i = 0; i < 2; i++) {
            const int64_t n = shapes[i][0], k = shapes[i][1];
            const size_t words = bn_vk_w2a8_words(k);
            uint32_t *wp = malloc((size_t)n * words * 4);
            float *x = malloc((size_t)k * 4), *w = malloc((size_t)k * 4);
            for (size_t j = 0; j < (size_t)n * words; j++)
                wp[j] = next_rand();
            for (int64_t j = 0; j < k; j++) {
                x[j] = (float)((int)(next_rand() % 2001) - 1000) / 250.0f;
                w[j] = (float)(next_rand() % 1000) / 500.0f;
            }
            normed_case c = {nk, NULL, NULL, NULL, NULL, n, k};
            bn_vk_buffer bw = buffer_with(vk, wp, (size_t)n * words * 4);
            bn_vk_buffer bx = buffer_with(vk, x, (size_t)k * 4),
                         bn = buffer_with(vk, w, (size_t)k * 4);
            bn_vk_buffer by = buffer_with(vk, NULL, (size_t)n * 4);
            c.w = &bw;
            c.x = &bx;
            c.norm_w = &bn;
            c.y = &by;
            char name[64];
            snprintf(name, sizeof name, "normed %lld x %lld", (long long)n, (long long)k);
            report(vk, name, record_normed, &c, false);
            bn_vk_buffer *all[] = {&bw, &bx, &bn, &by};
            for (int j = 0; j < 4; j++)
                bn_vk_buffer_free(vk, all[j]);
            free(wp);
            free(x);
            free(w);
        }
        bn_vk_kernel_free(vk, nk);
    }
    bn_vk_buffer_free(vk, &out);
    bn_vk_buffer_free(vk, &chain_buf);
    bn_vk_kernel *ks[] = {tree, chase, empty, stream};
    for (int i = 0; i < 4; i++)
        bn_vk_kernel_free(vk, ks[i]);
    bn_vk_close(vk);
    free(next);
    free(perm);
    return failed ? 1 : 0;
}
