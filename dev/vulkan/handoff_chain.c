/* handoff_chain.c - what a decode step's dispatch boundaries would cost as
 * hand-offs inside one dispatch: rounds of a 2560 x 2560 W2A8 product's
 * read (320 workgroups, 1.6 MB a round; 40 slices, 64 MB in all, so the
 * rounds come from memory rather than L2) run
 *   chained   one dispatch a round with a barrier between (as the backend
 *             records a decode step),
 *   handoff   one dispatch whose workgroups meet at a counter in memory
 *             between rounds (shaders/handoff.comp),
 *   prefetch  the same, each workgroup loading its next round's words
 *             before it waits (a step's weights do not depend on its
 *             activations);
 *   linked    one dispatch a round recorded with no barrier between: each
 *             workgroup waits at the counter for every workgroup of the
 *             dispatches before (a dispatch boundary as a hand-off, the
 *             shaders otherwise as they are), with and without the round's
 *             words loaded before the wait. Needs the device to start a
 *             dispatch's workgroups no later than a later dispatch's; the
 *             waits give up after a bounded spin and are counted.
 * Per round = (time of N rounds - time of 1) / (N - 1), the best of five
 * submissions. Every run's output (each workgroup's XOR of the words it
 * read) is checked against the CPU's. The hand-off cases need every
 * workgroup resident at once, so they run on GPUs only: a CPU device such
 * as lavapipe runs a few workgroups at a time, and the waiting ones would
 * hold the threads the others need.
 *
 *   make -C dev/vulkan BUILD=../../build && dev/vulkan/handoff_chain [device [rounds]]
 */
#include "lab.h"

#define GROUPS 320
#define VEC4S 320 /* uvec4s a workgroup a round: 5 KB, 1.6 MB a round */
#define SLICES 40

typedef struct params {
    uint32_t vec4s, phases, slices, prefetch, first, wait;
} params;

static bn_vk_buffer in_buf, out_buf, count_buf;
static uint32_t *host;
static int bad_groups;

/* The CPU's XOR of what workgroup g reads in `rounds` rounds from slice first. */
static uint32_t expect(int g, int rounds, int first)
{
    uint32_t acc = 0;
    for (int r = 0; r < rounds; r++) {
        const uint32_t *s =
            host + ((size_t)((first + r) % SLICES) * GROUPS + (size_t)g) * VEC4S * 4;
        for (int i = 0; i < VEC4S * 4; i++)
            acc ^= s[i];
    }
    return acc;
}

/* After a chained run the output is the last dispatch's round (first =
 * rounds - 1); after a hand-off run, all the rounds' from 0. */
static void check(bn_vk *vk, int rounds, int first)
{
    uint32_t got[GROUPS];
    OK(bn_vk_read(vk, &out_buf, got, sizeof got, &err), "read");
    for (int g = 0; g < GROUPS; g++)
        bad_groups += got[g] != expect(g, rounds, first);
}

/* Seconds of one submission: `rounds` chained dispatches of one round, or
 * one dispatch of `rounds` rounds; the best of five after a first. */
static int gave_up;

static double run_us(bn_vk *vk, bn_vk_kernel *k, int rounds, bool handoff, bool prefetch,
                     bool linked)
{
    bn_vk_buffer *const bufs[3] = {&in_buf, &out_buf, &count_buf};
    double best = 1e30;
    for (int rep = 0; rep < 6; rep++) {
        const uint32_t zero[2] = {0, 0};
        OK(bn_vk_write(vk, &count_buf, zero, sizeof zero, &err), "count");
        OK(bn_vk_begin(vk, &err), "begin");
        if (handoff) {
            const params p = {VEC4S, (uint32_t)rounds, SLICES, prefetch, 0, 0};
            OK(bn_vk_dispatch(vk, k, bufs, &p, GROUPS, 1, &err), "dispatch");
        } else if (linked) {
            for (int r = 0; r < rounds; r++) {
                const params p = {VEC4S, 0, SLICES, prefetch, (uint32_t)r,
                                  (uint32_t)(r * GROUPS)};
                if (r > 0)
                    bn_vk_next_independent(vk);
                OK(bn_vk_dispatch(vk, k, bufs, &p, GROUPS, 1, &err), "dispatch");
            }
        } else {
            for (int r = 0; r < rounds; r++) {
                const params p = {VEC4S, 1, SLICES, 0, (uint32_t)r, 0};
                OK(bn_vk_dispatch(vk, k, bufs, &p, GROUPS, 1, &err), "dispatch");
            }
        }
        const double t0 = now_us();
        OK(bn_vk_submit(vk, &err), "submit");
        const double t = now_us() - t0;
        if (rep > 0 && t < best)
            best = t;
        uint32_t counts[2];
        OK(bn_vk_read(vk, &count_buf, counts, sizeof counts, &err), "count");
        gave_up += (int)counts[1];
    }
    check(vk, handoff ? rounds : 1, handoff ? 0 : rounds - 1);
    return best;
}

static void report_rounds(bn_vk *vk, bn_vk_kernel *k, const char *name, bool handoff,
                          bool prefetch, bool linked)
{
    const double one = run_us(vk, k, 1, handoff, prefetch, linked);
    const double many = run_us(vk, k, N_CHAIN, handoff, prefetch, linked);
    printf("  %-10s %9.2f us a round (one round alone %.1f us)\n", name,
           (many - one) / (N_CHAIN - 1), one);
}

int main(int argc, char **argv)
{
    lab_init(argc, argv);
    if (argc <= 2)
        N_CHAIN = 200;
    const int device = argc > 1 ? atoi(argv[1]) : 0;
    bn_vk *vk = NULL;
    OK(bn_vk_open(device, &vk, &err), "open");
    const bn_vulkan_device *d = bn_vk_device(vk);
    printf("handoff_chain: %s (%s), %d rounds\n", d->name, d->type, N_CHAIN);
    const size_t words = (size_t)SLICES * GROUPS * VEC4S * 4;
    host = malloc(words * 4);
    if (!host)
        die("memory", NULL);
    for (size_t i = 0; i < words; i++)
        host[i] = next_rand();
    in_buf = buffer_with(vk, host, words * 4);
    out_buf = buffer_with(vk, NULL, GROUPS * 4);
    count_buf = buffer_with(vk, NULL, 16);
    bn_vk_kernel *k = lab_kernel(vk, "handoff", 3, sizeof(params));
    report_rounds(vk, k, "chained", false, false, false);
    if (strcmp(d->type, "cpu") != 0) {
        report_rounds(vk, k, "handoff", true, false, false);
        report_rounds(vk, k, "prefetch", true, true, false);
        report_rounds(vk, k, "linked", false, false, true);
        report_rounds(vk, k, "linked+pre", false, true, true);
        printf("  waits that gave up: %d\n", gave_up);
    } else {
        printf("  handoff, prefetch: not run on a CPU device (its workgroups are not all "
               "resident)\n");
    }
    printf("outputs checked against the CPU: %s (%d workgroups differ)\n",
           bad_groups || gave_up ? "FAILED" : "ok", bad_groups);
    bn_vk_kernel_free(vk, k);
    bn_vk_buffer_free(vk, &in_buf);
    bn_vk_buffer_free(vk, &out_buf);
    bn_vk_buffer_free(vk, &count_buf);
    bn_vk_close(vk);
    free(host);
    return bad_groups || gave_up ? 1 : 0;
}
