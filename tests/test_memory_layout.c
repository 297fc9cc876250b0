/* Access-pattern classification and alignment arithmetic (memory_layout.h). */
#include <inttypes.h>
#include <stdint.h>

#include "bitnet.h"
#include "memory_layout.h"
#include "test_util.h"

static bn_access_analysis analyze(const int64_t *idx, size_t n)
{
    bn_access_analysis a;
    bn_error err;
    bn_status st = bn_layout_analyze_access(idx, n, &a, &err);
    CHECK_MSG(st == BN_OK, "analyze: %s", err.message);
    return a;
}

static void test_patterns(void)
{
    bn_access_analysis a = analyze(NULL, 0);
    CHECK(a.pattern == BN_ACCESS_SEQUENTIAL && a.stride == 1 && a.count == 0);
    CHECK(a.min_index == 0 && a.max_index == 0);

    const int64_t one[] = {42};
    a = analyze(one, 1);
    CHECK(a.pattern == BN_ACCESS_SEQUENTIAL && a.stride == 1 && a.min_index == 42 &&
          a.max_index == 42);

    const int64_t seq[] = {5, 6, 7, 8, 9};
    a = analyze(seq, 5);
    CHECK(a.pattern == BN_ACCESS_SEQUENTIAL && a.stride == 1 && a.min_index == 5 &&
          a.max_index == 9 && a.count == 5);

    const int64_t strided[] = {0, 32, 64, 96};
    a = analyze(strided, 4);
    CHECK(a.pattern == BN_ACCESS_STRIDED && a.stride == 32);

    const int64_t backwards[] = {9, 8, 7, 6};
    a = analyze(backwards, 4);
    CHECK(a.pattern == BN_ACCESS_STRIDED && a.stride == -1 && a.min_index == 6 &&
          a.max_index == 9);

    const int64_t neg[] = {100, 50, 0, -50};
    a = analyze(neg, 4);
    CHECK(a.pattern == BN_ACCESS_STRIDED && a.stride == -50 && a.min_index == -50);

    const int64_t same[] = {7, 7, 7};
    a = analyze(same, 3);
    CHECK(a.pattern == BN_ACCESS_STRIDED && a.stride == 0);

    const int64_t pair[] = {3, 1000};
    a = analyze(pair, 2);
    CHECK(a.pattern == BN_ACCESS_STRIDED && a.stride == 997);

    const int64_t almost[] = {0, 2, 4, 7};
    a = analyze(almost, 4);
    CHECK(a.pattern == BN_ACCESS_RANDOM && a.stride == 0 && a.max_index == 7);

    const int64_t seq_then_jump[] = {0, 1, 2, 3, 100};
    a = analyze(seq_then_jump, 5);
    CHECK(a.pattern == BN_ACCESS_RANDOM);

    const int64_t perm[] = {3, 0, 2, 1};
    a = analyze(perm, 4);
    CHECK(a.pattern == BN_ACCESS_RANDOM && a.min_index == 0 && a.max_index == 3);

    /* Differences that do not fit in int64 are never a stride. */
    const int64_t wide[] = {INT64_MIN, INT64_MAX};
    a = analyze(wide, 2);
    CHECK(a.pattern == BN_ACCESS_RANDOM);
    const int64_t edge[] = {INT64_MAX - 2, INT64_MAX - 1, INT64_MAX};
    a = analyze(edge, 3);
    CHECK(a.pattern == BN_ACCESS_SEQUENTIAL && a.max_index == INT64_MAX);

    /* Random long strided runs, and the same with one index disturbed. */
    enum { N = 1000 };
    static int64_t idx[N];
    for (int round = 0; round < 50; round++) {
        const int64_t start = test_rand_range(-1000000, 1000000);
        int64_t stride = test_rand_range(-1000, 1000);
        const size_t n = (size_t)test_rand_range(3, N);
        for (size_t i = 0; i < n; i++)
            idx[i] = start + (int64_t)i * stride;
        a = analyze(idx, n);
        if (stride == 1)
            CHECK(a.pattern == BN_ACCESS_SEQUENTIAL);
        else
            CHECK_MSG(a.pattern == BN_ACCESS_STRIDED && a.stride == stride,
                      "stride %" PRId64 " seen as %s %" PRId64, stride,
                      bn_access_pattern_name(a.pattern), a.stride);
        idx[test_rand_range(0, (int64_t)n - 1)] += 1 + test_rand_range(0, 5);
        a = analyze(idx, n);
        CHECK(a.pattern == BN_ACCESS_RANDOM);
    }

    bn_error err;
    CHECK(bn_layout_analyze_access(NULL, 3, &a, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_layout_analyze_access(seq, 5, NULL, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(strcmp(bn_access_pattern_name(BN_ACCESS_SEQUENTIAL), "sequential") == 0);
    CHECK(strcmp(bn_access_pattern_name(BN_ACCESS_STRIDED), "strided") == 0);
    CHECK(strcmp(bn_access_pattern_name(BN_ACCESS_RANDOM), "random") == 0);
}

static void test_alignment(void)
{
    CHECK(!bn_layout_is_power_of_two(0));
    CHECK(bn_layout_is_power_of_two(1) && bn_layout_is_power_of_two(128));
    CHECK(bn_layout_is_power_of_two(1ull << 63));
    CHECK(!bn_layout_is_power_of_two(96) && !bn_layout_is_power_of_two(UINT64_MAX));

    uint64_t out = 12345;
    CHECK(bn_layout_align_up(0, 128, &out) && out == 0);
    CHECK(bn_layout_align_up(1, 128, &out) && out == 128);
    CHECK(bn_layout_align_up(128, 128, &out) && out == 128);
    CHECK(bn_layout_align_up(129, 128, &out) && out == 256);
    CHECK(bn_layout_align_up(7, 1, &out) && out == 7);
    out = 5;
    CHECK(!bn_layout_align_up(10, 96, &out) && out == 5);
    CHECK(!bn_layout_align_up(10, 0, &out));
    CHECK(!bn_layout_align_up(UINT64_MAX, 128, &out));
    CHECK(bn_layout_align_up(UINT64_MAX - 127, 128, &out) && out == UINT64_MAX - 127);
    CHECK(!bn_layout_align_up(UINT64_MAX - 126, 128, &out));

    bn_error err;
    CHECK(bn_layout_aligned_size(1, 0, &out, &err) == BN_OK && out == 128);
    CHECK(bn_layout_aligned_size(1, 16, &out, &err) == BN_OK && out == 128); /* at least 128 */
    CHECK(bn_layout_aligned_size(300, 256, &out, &err) == BN_OK && out == 512);
    CHECK(bn_layout_aligned_size(0, 256, &out, &err) == BN_OK && out == 0);
    CHECK(bn_layout_aligned_size(4096, 4096, &out, &err) == BN_OK && out == 4096);
    CHECK(bn_layout_aligned_size(100, 100, &out, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "power of two");
    CHECK(bn_layout_aligned_size(UINT64_MAX - 10, 128, &out, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "does not fit");
    CHECK(bn_layout_aligned_size(1, 128, NULL, &err) == BN_ERR_INVALID_ARGUMENT);

    /* Random values: aligned, not smaller, less than one alignment more. */
    for (int i = 0; i < 10000; i++) {
        const uint64_t v = test_rand_u64() >> (test_rand_u64() % 64);
        const uint64_t a = 1ull << test_rand_range(0, 20);
        uint64_t r;
        if (bn_layout_aligned_size(v, a, &r, NULL) == BN_OK) {
            const uint64_t eff = a < 128 ? 128 : a;
            CHECK(r % eff == 0 && r >= v && r - v < eff);
        } else {
            CHECK(v > UINT64_MAX - ((a < 128 ? 128 : a) - 1));
        }
    }
}

static void test_recommended(void)
{
    CHECK(bn_layout_recommended_alignment(1, 1000000) == 128);
    CHECK(bn_layout_recommended_alignment(2, 1000000) == 128);
    CHECK(bn_layout_recommended_alignment(4, 1000000) == 128);
    CHECK(bn_layout_recommended_alignment(8, 1000000) == 256);
    CHECK(bn_layout_recommended_alignment(16, 1000000) == 512);
    CHECK(bn_layout_recommended_alignment(12, 1000000) == 512); /* 384 rounds up */
    CHECK(bn_layout_recommended_alignment(16, 4) == 128);      /* fewer than a warp */
    CHECK(bn_layout_recommended_alignment(64, 16) == 1024);
    CHECK(bn_layout_recommended_alignment(1024, 1000) == 4096); /* clamped */
    CHECK(bn_layout_recommended_alignment(UINT64_MAX, 1) == 4096);
    CHECK(bn_layout_recommended_alignment(0, 10) == 128);
    CHECK(bn_layout_recommended_alignment(4, 0) == 128);
    for (uint64_t e = 1; e <= 5000; e += 7) {
        const uint64_t a = bn_layout_recommended_alignment(e, UINT64_MAX);
        CHECK(bn_layout_is_power_of_two(a) && a >= 128 && a <= 4096);
    }

    bn_error err;
    uint64_t bytes = 0, align = 0;
    CHECK(bn_layout_array_bytes(2, 1000, &bytes, &align, &err) == BN_OK);
    CHECK(bytes == 2048 && align == 128);
    CHECK(bn_layout_array_bytes(8, 33, &bytes, &align, &err) == BN_OK);
    CHECK(bytes == 512 && align == 256);
    CHECK(bn_layout_array_bytes(4, 0, &bytes, NULL, &err) == BN_OK && bytes == 0);
    CHECK(bn_layout_array_bytes(1ull << 40, 1ull << 30, &bytes, &align, &err) ==
          BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(err.message, "do not fit");
    CHECK(bn_layout_array_bytes(1, UINT64_MAX, &bytes, &align, &err) == BN_ERR_INVALID_ARGUMENT);
}

int main(void)
{
    test_seed_init();
    test_patterns();
    test_alignment();
    test_recommended();
    TEST_EXIT();
}
