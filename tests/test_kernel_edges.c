/* Kernel providers at the edges that the random problems of test_kernels.c
 * do not reach:
 *  - worst-case sums: every weight +1 or -1 against activations of -128 or
 *    127 (the quantizer never makes -128), up to the largest k
 *    bn_w2a8_pack accepts, so an accumulator that is too narrow somewhere
 *    (int16 partial sums, say) overflows and shows;
 *  - activation rows that end right before an inaccessible page, so a
 *    kernel that reads past k crashes instead of reading padding;
 *  - row ranges that start and end anywhere, with the outputs outside the
 *    range left untouched;
 *  - the activation quantizer on ties, infinities, NaNs (quiet and
 *    signalling), -0, subnormals and FLT_MAX.
 * Every available provider must give exactly the direct integer result. */
#include <float.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kernel_manager.h"
#include "quant_rules.h"
#include "test_util.h"
#include "w2a8.h"

static const float POISON = -12345.678f;

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

/* size bytes whose last byte sits just before a PROT_NONE page. */
typedef struct guarded {
    uint8_t *map;
    size_t map_len;
    uint8_t *data;
} guarded;

static bool guarded_alloc(guarded *g, size_t size)
{
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    const size_t usable = (size + page - 1) / page * page;
    g->map_len = usable + page;
    void *map = mmap(NULL, g->map_len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return false;
    g->map = map;
    if (mprotect(g->map + usable, page, PROT_NONE) != 0) {
        munmap(g->map, g->map_len);
        return false;
    }
    g->data = g->map + usable - size;
    return true;
}

static void guarded_free(guarded *g) { munmap(g->map, g->map_len); }

/* The direct definition, in int64 so that it cannot overflow itself. */
static int64_t direct_dot(const int8_t *codes, int64_t k, const int8_t *xq)
{
    int64_t acc = 0;
    for (int64_t c = 0; c < k; c++)
        acc += codes[c] * xq[c];
    return acc;
}

/* Activation rows m x k at x (row stride k), scales and sums filled in. */
static void fill_rows(bn_q8_rows *rows, int8_t *q, int64_t m, int64_t k, float *scale,
                      int32_t *sum)
{
    rows->m = m;
    rows->k = k;
    rows->lda = k;
    rows->q = q;
    rows->scale = scale;
    rows->sum = sum;
    for (int64_t i = 0; i < m; i++) {
        int64_t total = 0;
        for (int64_t c = 0; c < k; c++)
            total += q[i * k + c];
        sum[i] = (int32_t)total;
        scale[i] = 1.0f + 0.25f * (float)i;
    }
}

/* Every available provider on codes [n][k] against rows: the full range
 * through matmul (or matvec for one row), then a range [begin, end) that
 * starts and ends off any tile boundary, which must leave the rest alone. */
static void check_providers(const char *what, const int8_t *codes, int64_t n, int64_t k,
                            const bn_q8_rows *rows)
{
    const float ws = 0.75f;
    const int64_t m = rows->m;
    float *want = malloc((size_t)(m * n) * sizeof *want);
    float *y = malloc((size_t)(m * n) * sizeof *y);
    for (int64_t i = 0; i < m; i++)
        for (int64_t r = 0; r < n; r++) {
            const int64_t acc = direct_dot(codes + r * k, k, rows->q + i * rows->lda);
            CHECK(acc >= INT32_MIN && acc <= INT32_MAX);
            want[i * n + r] = bn_w2a8_epilogue((int32_t)acc, rows->scale[i], ws);
        }

    const bn_kernel_provider *const *list;
    const int count = bn_kernel_providers(&list);
    for (int p = 0; p < count; p++) {
        const bn_kernel_provider *prov = list[p];
        if (!prov->is_available())
            continue;
        bn_w2a8_weights w;
        if (bn_w2a8_pack(prov, codes, n, k, ws, &w, NULL) != BN_OK) {
            CHECK_MSG(false, "%s: %s cannot pack %lld x %lld", what, prov->name, (long long)n,
                      (long long)k);
            continue;
        }
        const int64_t ranges[2][2] = {{0, n}, {n > 2 ? 1 : 0, n > 6 ? n - 2 : n}};
        for (int t = 0; t < 2; t++) {
            const int64_t begin = ranges[t][0], end = ranges[t][1];
            for (int64_t j = 0; j < m * n; j++)
                y[j] = POISON;
            if (m == 1)
                prov->matvec(&w, rows->q, rows->scale[0], rows->sum[0], begin, end, y);
            else
                prov->matmul(&w, rows, begin, end, y, n);
            int diff = 0;
            for (int64_t i = 0; i < m; i++)
                for (int64_t r = 0; r < n; r++) {
                    const bool inside = r >= begin && r < end;
                    diff += !same_bits(y[i * n + r], inside ? want[i * n + r] : POISON);
                }
            CHECK_MSG(diff == 0, "%s: %s rows [%lld, %lld): %d of %lld outputs wrong (n=%lld "
                      "k=%lld m=%lld)", what, prov->name, (long long)begin, (long long)end, diff,
                      (long long)(m * n), (long long)n, (long long)k, (long long)m);
        }
        bn_w2a8_weights_free(&w);
    }
    free(want);
    free(y);
}

/* Uniform weights against uniform activations: the largest sums there are. */
static void test_worst_case_sums(void)
{
    const int64_t ks[] = {64 * 8, 64 * 8 + 1, 64 * 17 + 63, 64 * 40, 1 << 22};
    const int8_t xs[] = {-128, 127};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        const int64_t k = ks[ki];
        /* Few rows for the largest k: the scalar reference is slow under qemu. */
        const int64_t n = k > 100000 ? 2 : 7, m = k > 100000 ? 2 : 5;
        int8_t *codes = malloc((size_t)(n * k));
        int8_t *q = malloc((size_t)(m * k));
        float scale[5];
        int32_t sum[5];
        for (int64_t r = 0; r < n; r++)
            memset(codes + r * k, r % 2 ? -1 : 1, (size_t)k);
        for (size_t xi = 0; xi < sizeof xs / sizeof xs[0]; xi++) {
            memset(q, xs[xi], (size_t)(m * k));
            bn_q8_rows rows;
            char what[64];
            snprintf(what, sizeof what, "worst case x=%d", xs[xi]);
            fill_rows(&rows, q, m, k, scale, sum);
            check_providers(what, codes, n, k, &rows);
            fill_rows(&rows, q, 1, k, scale, sum);
            check_providers(what, codes, n, k, &rows);
        }
        free(codes);
        free(q);
    }
}

/* Activation rows that end at an inaccessible page, for every tail length. */
static void test_no_read_past_k(void)
{
    const int64_t ks[] = {1, 2, 15, 16, 17, 31, 48, 63, 64, 65, 100, 127, 129, 200, 255, 257};
    for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
        const int64_t k = ks[ki], n = 9;
        for (int64_t m = 1; m <= 7; m += 2) {
            guarded g;
            if (!guarded_alloc(&g, (size_t)(m * k))) {
                CHECK_MSG(false, "mmap failed");
                return;
            }
            int8_t *q = (int8_t *)g.data;
            int8_t *codes = malloc((size_t)(n * k));
            for (int64_t i = 0; i < m * k; i++)
                q[i] = (int8_t)((i * 37 + 11) % 255 - 127);
            for (int64_t i = 0; i < n * k; i++)
                codes[i] = (int8_t)((i * 7 + 3) % 3 - 1);
            float scale[7];
            int32_t sum[7];
            bn_q8_rows rows;
            fill_rows(&rows, q, m, k, scale, sum);
            check_providers("guard page", codes, n, k, &rows);
            free(codes);
            guarded_free(&g);
        }
    }
}

static float float_from_bits(uint32_t bits)
{
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void check_quantizers(const char *what, const float *x, int64_t k)
{
    int8_t *want = malloc((size_t)k), *q = malloc((size_t)k);
    float want_scale, scale;
    int32_t want_sum, sum;
    bn_quantize_activations_row(x, k, want, &want_scale, &want_sum);
    const bn_kernel_provider *const *list;
    const int count = bn_kernel_providers(&list);
    for (int p = 0; p < count; p++) {
        if (!list[p]->is_available())
            continue;
        memset(q, 0x5a, (size_t)k);
        scale = POISON;
        sum = -999;
        list[p]->quantize_activations(x, k, q, &scale, &sum);
        CHECK_MSG(memcmp(q, want, (size_t)k) == 0 && same_bits(scale, want_scale) &&
                      sum == want_sum,
                  "%s: %s quantizer differs (k=%lld)", what, list[p]->name, (long long)k);
    }
    free(want);
    free(q);
}

static void test_quantizer_edges(void)
{
    /* amax 127 makes the scale exactly 1, so x * s = x and the .5 values
     * are exact ties: they must round to even. */
    const float ties[] = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, -126.5f,
                          3.5f,   -3.5f, 0.49999997f, -0.49999997f, 64.5f, -64.5f, 0.0f};
    const float specials[] = {INFINITY, -INFINITY, NAN, -NAN, float_from_bits(0x7f800001u),
                              float_from_bits(0xffa00000u), -0.0f, 1e-40f, -1e-40f, FLT_MAX,
                              -FLT_MAX, 3.0f, -7.0f, 1e-6f};
    enum { K_MAX = 80 };
    float x[K_MAX];
    /* Tie values at every position and length, so they land both in the
     * vector body and in the scalar tail. */
    const int nt = (int)(sizeof ties / sizeof ties[0]);
    for (int k = 1; k <= K_MAX; k++) {
        for (int i = 0; i < k; i++)
            x[i] = ties[(i * 5 + k) % nt];
        x[(k * 7 + 3) % k] = 127.0f; /* the max, anywhere */
        check_quantizers("ties", x, k);
    }
    /* One special value at a time, at each position, among ordinary ones;
     * the largest value sits 16 places away, in the same SIMD lane for
     * vectors of 4, 8 or 16 floats: before the special value when there is
     * room (a signalling NaN must not wipe it out, as FMAXNM would), else
     * after it (a NaN must not stick in the lane, as with FMAX). */
    const int ns = (int)(sizeof specials / sizeof specials[0]);
    for (int s = 0; s < ns; s++)
        for (int k = 1; k <= 40; k += 3)
            for (int at = 0; at < k; at++) {
                for (int i = 0; i < k; i++)
                    x[i] = (float)((i * 13) % 29 - 14) * 0.37f;
                if (at >= 16)
                    x[at - 16] = 100.0f;
                else if (at + 16 < k)
                    x[at + 16] = 100.0f;
                x[at] = specials[s];
                check_quantizers("special value", x, k);
            }
    /* All NaN, all zero, all subnormal: the 1e-5 floor. */
    for (int i = 0; i < K_MAX; i++)
        x[i] = NAN;
    check_quantizers("all NaN", x, K_MAX);
    for (int i = 0; i < K_MAX; i++)
        x[i] = 0.0f;
    check_quantizers("all zero", x, K_MAX);
    for (int i = 0; i < K_MAX; i++)
        x[i] = (i % 2 ? -1e-39f : 1e-39f) * (float)(i + 1);
    check_quantizers("subnormal", x, K_MAX);
}

int main(void)
{
    const bn_kernel_provider *chosen = NULL;
    if (bn_kernel_select(&chosen, NULL) == BN_OK)
        printf("providers: %s; selected %s\n", bn_kernel_compiled_names(), chosen->name);
    test_quantizer_edges();
    test_no_read_past_k();
    test_worst_case_sums();
    TEST_EXIT();
}
