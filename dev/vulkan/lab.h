/* lab.h - what the Vulkan labs share: errors, the lab shaders' SPIR-V read
 * from shaders/ beside the program, chains of dispatches timed, buffers,
 * a small random generator. Each lab is one C file including this. */
#ifndef BN_VK_LAB_H
#define BN_VK_LAB_H

#define _POSIX_C_SOURCE 200809L
#include <libgen.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "vk_context.h"

/* Dispatches a timed chain: 1000, or a lab's second argument (a CPU
 * device such as lavapipe takes minutes for 1000). */
static int N_CHAIN = 1000;

static void die(const char *what, const bn_error *err)
{
    fprintf(stderr, "dispatch_chain: %s: %s\n", what, err ? err->message : "");
    exit(1);
}

#define OK(call, what)                                                                     \
    do {                                                                                   \
        if ((call) != BN_OK)                                                               \
            die(what, &err);                                                               \
    } while (0)

static bn_error err;
static char spv_dir[4096]; /* lab_init sets it */

/* A lab shader, compiled by the Makefile next to this program. */
static bn_vk_kernel *lab_kernel(bn_vk *vk, const char *name, int n_buffers, uint32_t push)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/shaders/%s.spv", spv_dir, name);
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "dispatch_chain: no %s (make -C dev/vulkan)\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    const long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *spv = malloc((size_t)len);
    if (!spv || fread(spv, 1, (size_t)len, f) != (size_t)len)
        die("reading SPIR-V", NULL);
    fclose(f);
    bn_vk_kernel *k = NULL;
    OK(bn_vk_kernel_create(vk, name, spv, (size_t)len, n_buffers, push, &k, &err), name);
    free(spv);
    return k;
}

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

/* One case: record(vk, ctx) records one dispatch. */
typedef void (*record_fn)(bn_vk *vk, void *ctx);

static inline double chain_us(bn_vk *vk, record_fn record, void *ctx, int n, bool free_running)
{
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) {
        OK(bn_vk_begin(vk, &err), "begin");
        for (int i = 0; i < n; i++) {
            if (free_running && i > 0)
                bn_vk_next_independent(vk);
            record(vk, ctx);
        }
        const double t0 = now_us();
        OK(bn_vk_submit(vk, &err), "submit");
        const double t = now_us() - t0;
        if (rep > 0 && t < best) /* the first submission warms up */
            best = t;
    }
    return best;
}

static inline void report(bn_vk *vk, const char *name, record_fn record, void *ctx, bool also_free)
{
    const double one = chain_us(vk, record, ctx, 1, false);
    const double chained = (chain_us(vk, record, ctx, N_CHAIN, false) - one) / (N_CHAIN - 1);
    if (also_free) {
        const double fr = (chain_us(vk, record, ctx, N_CHAIN, true) - one) / (N_CHAIN - 1);
        printf("  %-28s %9.2f %9.2f %9.1f\n", name, chained, fr, one);
    } else {
        printf("  %-28s %9.2f %9s %9.1f\n", name, chained, "-", one);
    }
}

static bn_vk_buffer buffer_with(bn_vk *vk, const void *data, size_t bytes)
{
    bn_vk_buffer b;
    OK(bn_vk_buffer_create(vk, bytes, &b, &err), "buffer");
    if (data)
        OK(bn_vk_write(vk, &b, data, bytes, &err), "write");
    return b;
}

static uint32_t rng = 12345u;
static uint32_t next_rand(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

/* A uniform float in [lo, hi] on a grid of 1e-6 of the span. */
static inline float rand_float(float lo, float hi)
{
    return lo + (hi - lo) * (float)(next_rand() % 1000001) / 1000000.0f;
}

/* The program's directory, where shaders/ holds the lab's SPIR-V, and
 * the chains' length (argv[2]). */
static void lab_init(int argc, char **argv)
{
    const char *argv0 = argv[0];
    if (argc > 2)
        N_CHAIN = atoi(argv[2]) >= 2 ? atoi(argv[2]) : 2;
    char self[4096];
    snprintf(self, sizeof self, "%s", argv0);
    snprintf(spv_dir, sizeof spv_dir, "%s", dirname(self));
}

#endif
