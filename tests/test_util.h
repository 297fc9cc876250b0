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

#endif
