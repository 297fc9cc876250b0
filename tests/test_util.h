/*
 * test_util.h - the few macros our C tests need.
 *
 * CHECK records a failure and carries on, so one run reports every broken
 * expectation; TEST_EXIT returns 1 if anything failed. GPU tests call
 * TEST_SKIP (exit code 77, which ctest reports as skipped) with a reason.
 */
#ifndef BN_TEST_UTIL_H
#define BN_TEST_UTIL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int test_failures = 0;
static int test_checks = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        test_checks++;                                                                \
        if (!(cond)) {                                                                \
            test_failures++;                                                          \
            fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond);           \
        }                                                                             \
    } while (0)

#define CHECK_MSG(cond, ...)                                                          \
    do {                                                                              \
        test_checks++;                                                                \
        if (!(cond)) {                                                                \
            test_failures++;                                                          \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
        }                                                                             \
    } while (0)

#define CHECK_STR_CONTAINS(haystack, needle)                                          \
    CHECK_MSG(strstr((haystack), (needle)) != NULL, "'%s' does not contain '%s'",     \
              (haystack), (needle))

#define TEST_SKIP(...)                                                                \
    do {                                                                              \
        fprintf(stderr, "SKIP: ");                                                    \
        fprintf(stderr, __VA_ARGS__);                                                 \
        fputc('\n', stderr);                                                          \
        exit(77);                                                                     \
    } while (0)

#define TEST_EXIT()                                                                   \
    do {                                                                              \
        if (test_checks == 0) {                                                       \
            fprintf(stderr, "FAIL: the test checked nothing\n");                      \
            return 1;                                                                 \
        }                                                                             \
        fprintf(stderr, "%s: %d checks, %d failed\n", test_failures ? "FAILED" : "ok", \
                test_checks, test_failures);                                          \
        return test_failures ? 1 : 0;                                                 \
    } while (0)

/* Test randomness: fresh per run (time-based seed, printed) so repeated
 * runs cover new inputs; BN_TEST_SEED=N repeats a failing run. */
#include <stdint.h>
#include <time.h>

static uint64_t test_rng_state;

static inline uint64_t test_rand_u64(void)
{
    uint64_t z = (test_rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform integer in [lo, hi]. */
static inline int64_t test_rand_range(int64_t lo, int64_t hi)
{
    return lo + (int64_t)(test_rand_u64() % (uint64_t)(hi - lo + 1));
}

/* Uniform float in [lo, hi). */
static inline float test_rand_float(float lo, float hi)
{
    return lo + (hi - lo) * (float)((test_rand_u64() >> 40) * (1.0 / 16777216.0));
}

/* The value of fp8 e4m3 byte b (sign, 4 exponent bits of bias 7, 3
 * mantissa bits; exponent 0 subnormal; 0x7f / 0xff, NaN, not expected). */
static inline float test_e4m3_value(uint8_t b)
{
    const int e = (b >> 3) & 15, m = b & 7;
    const float mag = e == 0 ? ldexpf((float)m, -9) : ldexpf(1.0f + (float)m / 8.0f, e - 7);
    return b & 0x80 ? -mag : mag;
}

static inline uint64_t test_seed_init(void)
{
    const char *env = getenv("BN_TEST_SEED");
    uint64_t seed = env ? strtoull(env, NULL, 10)
                        : (uint64_t)time(NULL) ^ ((uint64_t)clock() << 32);
    test_rng_state = seed;
    printf("seed %llu (repeat with BN_TEST_SEED=%llu)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    return seed;
}

/* BN_TEST_PART=i/n: a long test split over n processes (the racecheck runs
 * of scripts/gpu-check.sh) does in this process only the units of work
 * numbered i, i + n, i + 2n, ... test_in_part(k) says whether unit k is one
 * of them; without the variable every unit is. A malformed value ends the
 * test with exit code 2. */
static inline void test_part(int *index, int *count)
{
    static int part_index = -1, part_count = 1;
    if (part_index < 0) {
        part_index = 0;
        const char *part = getenv("BN_TEST_PART");
        char end = 0;
        if (part && (sscanf(part, "%d/%d%c", &part_index, &part_count, &end) != 2 ||
                     part_count < 1 || part_index < 0 || part_index >= part_count)) {
            fprintf(stderr, "BN_TEST_PART=%s: expected i/n with 0 <= i < n\n", part);
            exit(2);
        }
        if (part)
            printf("part %d of %d\n", part_index, part_count);
    }
    *index = part_index;
    *count = part_count;
}

static inline int test_in_part(int k)
{
    int index, count;
    test_part(&index, &count);
    return k % count == index;
}

#endif
