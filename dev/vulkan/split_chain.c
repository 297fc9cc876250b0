/*
 * split_chain.c - the decode step's split attention (bn_vk_attention_split_record)
 * against a form with a workgroup a KV head instead of a query head
 * (shaders/split_gqa.comp: the KV head's four query heads share each key and
 * value loaded, over a quarter of the workgroups).
 *
 * One decode row of the 2B-4T shape (20 query heads of 128, 5 KV heads)
 * over a flat cache of 4096 positions at contexts 384, 1000 and 4000; each
 * form timed as chains of dispatches with a barrier before each (lab.h), as
 * the decode step runs it.
 *
 * Check: the GQA form against the shipped kernel bit for bit (the same
 * arithmetic in the same order), and both against the CPU's attention with
 * exp in double (within 1e-5 of the outputs' range: the split sums are
 * grouped by block). Needs fp64 and subgroup arithmetic.
 *
 *   make -C dev/vulkan BUILD=../../build   (a build with -DBITNET_VULKAN=ON)
 *   dev/vulkan/split_chain [device [chain length]]
 */
#include "lab.h"
#include "attn_ref.h"
#include "vk_ops.h"

#define N_HEAD 20
#define N_KV 5
#define HEAD_DIM 128
#define CACHE 4096
#define OUT (N_HEAD * HEAD_DIM)

/* Whether every output of got lies within 1e-5 of want's range of want's;
 * prints the largest difference and how many are want's bits. */
static bool close_to(const char *what, int n_pos, const float *got, const float *want)
{
    float lo = INFINITY, hi = -INFINITY, most = 0.0f;
    int same = 0;
    for (int i = 0; i < OUT; i++) {
        lo = want[i] < lo ? want[i] : lo;
        hi = want[i] > hi ? want[i] : hi;
    }
    for (int i = 0; i < OUT; i++) {
        same += memcmp(&got[i], &want[i], 4) == 0;
        const float d = fabsf(got[i] - want[i]);
        most = d > most || isnan(d) ? d : most;
    }
    printf("check %s, context %d: largest difference %g (%.2g of the range), %d of %d the same "
           "bits\n",
           what, n_pos, most, most / (hi - lo), same, OUT);
    return most <= 1e-5f * (hi - lo);
}

int main(int argc, char **argv)
{
    lab_init(argc, argv);
    bn_vk *vk = NULL;
    OK(bn_vk_open(argc > 1 ? atoi(argv[1]) : 0, &vk, &err), "open");
    const bn_vulkan_device *d = bn_vk_device(vk);
    printf("split_chain: %s (%s), chains of %d\n", d->name, d->type, N_CHAIN);
    if (!d->fp64 || !d->subgroup_arithmetic) {
        printf("the shipped split attention's fp64 subgroup form needs fp64 and subgroup "
               "arithmetic: nothing to compare on this device\n");
        return 0;
    }
    bn_vk_ops *ops = NULL;
    OK(bn_vk_ops_create(vk, &ops, &err), "ops");

    const size_t kv_floats = (size_t)CACHE * N_KV * HEAD_DIM;
    float *q = malloc(OUT * 4), *kc = malloc(kv_floats * 4), *vc = malloc(kv_floats * 4);
    for (int i = 0; i < OUT; i++)
        q[i] = rand_float(-3.0f, 3.0f);
    for (size_t i = 0; i < kv_floats; i++) {
        kc[i] = rand_float(-1.0f, 1.0f);
        vc[i] = rand_float(-1.0f, 1.0f);
    }
    const bn_vk_attn_shape shape = {N_HEAD, N_KV, HEAD_DIM, CACHE};
    const size_t part_floats = (size_t)bn_vk_attention_split_floats(&shape, 1, CACHE);
    float *zero = calloc(part_floats, 4);
    const int32_t table[1] = {0};
    bn_vk_buffer bq = buffer_with(vk, q, OUT * 4);
    bn_vk_buffer bkc = buffer_with(vk, kc, kv_floats * 4), bvc = buffer_with(vk, vc, kv_floats * 4);
    bn_vk_buffer bt = buffer_with(vk, table, sizeof table), binfo = buffer_with(vk, NULL, 8);
    /* Zero: the merges' counters start so (and each dispatch leaves them so). */
    bn_vk_buffer bpart = buffer_with(vk, zero, part_floats * 4);
    bn_vk_buffer bpart2 = buffer_with(vk, zero, part_floats * 4);
    bn_vk_buffer bref = buffer_with(vk, NULL, OUT * 4), batt = buffer_with(vk, NULL, OUT * 4);
    bn_vk_kernel *gqa = lab_kernel(vk, "split_gqa", 7, sizeof(attn_push));
    int failed = 0;
    static const int contexts[] = {384, 1000, 4000};
    for (int ci = 0; ci < 3; ci++) {
        const int n_pos = contexts[ci];
        const int32_t info[2] = {0, n_pos - 1};
        OK(bn_vk_write(vk, &binfo, info, sizeof info, &err), "info");
        shipped_attn sc = {ops,   shape, {&binfo, &bt, 1, CACHE, 1}, &bq, &bkc, &bvc, &bpart,
                           &bref, CACHE};
        attn_case gc = {gqa,
                        {&binfo, &bt, &bq, &bkc, &bvc, &bpart2, &batt},
                        flat_attn_push(1, N_HEAD, N_KV, HEAD_DIM, CACHE, (CACHE + 63) / 64),
                        N_KV * ((CACHE + 63) / 64)};
        static float ref[OUT], got[OUT], cpu[OUT];
        OK(bn_vk_begin(vk, &err), "begin");
        record_shipped_split(vk, &sc);
        record_attn_case(vk, &gc);
        OK(bn_vk_submit(vk, &err), "submit");
        OK(bn_vk_read(vk, &bref, ref, sizeof ref, &err), "read");
        OK(bn_vk_read(vk, &batt, got, sizeof got, &err), "read");
        cpu_attention(q, kc, vc, n_pos, N_HEAD, N_KV, HEAD_DIM, cpu);
        failed += !close_to("shipped", n_pos, ref, cpu);
        failed += !close_to("gqa", n_pos, got, cpu);
        const bool same = memcmp(ref, got, sizeof ref) == 0;
        printf("check gqa against shipped, context %d: %s\n", n_pos,
               same ? "bit for bit" : "DIFFERENT");
        failed += !same;
        printf("context %d: us a dispatch, chains of %d (one: a submission of one)\n", n_pos,
               N_CHAIN);
        printf("  %-28s %9s %9s %9s\n", "form", "chained", "free", "one");
        report(vk, "shipped split", record_shipped_split, &sc, false);
        report(vk, "gqa split", record_attn_case, &gc, false);
    }
    printf("\nchecks: %s\n", failed ? "FAILED" : "ok");
    bn_vk_kernel_free(vk, gqa);
    bn_vk_buffer *all[] = {&bq, &bkc, &bvc, &bt, &binfo, &bpart, &bpart2, &bref, &batt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    bn_vk_ops_free(vk, ops);
    bn_vk_close(vk);
    free(q);
    free(kc);
    free(vc);
    free(zero);
    return failed ? 1 : 0;
}
