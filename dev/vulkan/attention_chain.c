/*
 * attention_chain.c - what the Vulkan backend's decode attention costs, and
 * other forms of it: shaders/attn_lab.glsl is a copy of the shipped shader
 * (src/vulkan/shaders/attention.glsl before its keys were read as vec4s)
 * with switches that stop it after its scores or its softmax, or change
 * how a part is computed (the Makefile's ATTN_VARIANTS; README.md has
 * what each measured).
 *
 * One decode row of the 2B-4T shape (20 query heads of 128, 5 KV heads)
 * over a flat cache of 4096 positions at contexts 160, 576 and 1024. Each
 * form is timed as chains of 1000 dispatches with a barrier before each
 * (lab.h), as the decode step runs it.
 *
 * Check: every form that computes the whole attention, and the shipped
 * kernel, against the CPU's arithmetic (attention_slot, cpu_backend.c)
 * with exp in double rounded to float, as the kernels compute it: how
 * many outputs are bit for bit equal, and the largest difference. (Build
 * with -ffp-contract=off, as the Makefile does.)
 *
 *   make -C dev/vulkan BUILD=../../build   (a build with -DBITNET_VULKAN=ON)
 *   dev/vulkan/attention_chain [device [chain length]]
 */
#include "lab.h"
#include "attn_ref.h"
#include "vk_ops.h"

#define N_HEAD 20
#define N_KV 5
#define HEAD_DIM 128
#define CACHE 4096

/* Prints how many of got equal want bit for bit, and the largest
 * difference; returns whether all do. */
static bool compare(const char *what, int n_pos, const float *got, const float *want)
{
    int same = 0;
    float most = 0.0f;
    for (int i = 0; i < N_HEAD * HEAD_DIM; i++) {
        if (memcmp(&got[i], &want[i], 4) == 0)
            same++;
        const float d = fabsf(got[i] - want[i]);
        most = d > most || isnan(d) ? d : most;
    }
    printf("check %s, context %d: %d of %d outputs the CPU's bits, largest difference %g\n",
           what, n_pos, same, N_HEAD * HEAD_DIM, most);
    return same == N_HEAD * HEAD_DIM;
}

int main(int argc, char **argv)
{
    lab_init(argc, argv);
    bn_vk *vk = NULL;
    OK(bn_vk_open(argc > 1 ? atoi(argv[1]) : 0, &vk, &err), "open");
    const bn_vulkan_device *d = bn_vk_device(vk);
    printf("device: %s; shipped attention %s\n", d->name, d->fp64 ? "fp64" : "float");
    if (!d->fp64) {
        printf("the lab's forms are fp64 ones: nothing to compare on this device\n");
        return 0;
    }
    bn_vk_ops *ops = NULL;
    OK(bn_vk_ops_create(vk, &ops, &err), "ops");

    const size_t kv_floats = (size_t)CACHE * N_KV * HEAD_DIM;
    float *q = malloc(N_HEAD * HEAD_DIM * 4), *kc = malloc(kv_floats * 4),
          *vc = malloc(kv_floats * 4);
    for (int i = 0; i < N_HEAD * HEAD_DIM; i++)
        q[i] = rand_float(-3.0f, 3.0f);
    for (size_t i = 0; i < kv_floats; i++) {
        kc[i] = rand_float(-1.0f, 1.0f);
        vc[i] = rand_float(-1.0f, 1.0f);
    }
    const int32_t table[1] = {0};
    bn_vk_buffer bq = buffer_with(vk, q, N_HEAD * HEAD_DIM * 4);
    bn_vk_buffer bkc = buffer_with(vk, kc, kv_floats * 4), bvc = buffer_with(vk, vc, kv_floats * 4);
    bn_vk_buffer bt = buffer_with(vk, table, sizeof table), binfo = buffer_with(vk, NULL, 8);
    bn_vk_buffer bscr = buffer_with(vk, NULL, (size_t)N_HEAD * CACHE * 4);
    bn_vk_buffer bref = buffer_with(vk, NULL, N_HEAD * HEAD_DIM * 4);
    bn_vk_buffer batt = buffer_with(vk, NULL, N_HEAD * HEAD_DIM * 4);
    static const char *forms[] = {"base",     "stop_scores",      "stop_softmax", "sum8",
                                  "lanes",    "vec4",             "vec4_stop_scores",
                                  "vec4_tmp", "vec4_bits",        "vec4_loads"};
    enum { N_FORMS = sizeof forms / sizeof forms[0] };
    bn_vk_kernel *kernels[N_FORMS];
    for (int f = 0; f < N_FORMS; f++) {
        char name[64];
        snprintf(name, sizeof name, "attn_lab_%s", forms[f]);
        kernels[f] = lab_kernel(vk, name, 7, sizeof(attn_push));
    }
    int failed = 0;
    static const int contexts[] = {160, 576, 1024};
    for (int ci = 0; ci < 3; ci++) {
        const int n_pos = contexts[ci];
        const int32_t info[2] = {0, n_pos - 1};
        OK(bn_vk_write(vk, &binfo, info, sizeof info, &err), "info");
        shipped_attn sc = {ops,
                           {N_HEAD, N_KV, HEAD_DIM, CACHE},
                           {&binfo, &bt, 1, CACHE, 1},
                           &bq,
                           &bkc,
                           &bvc,
                           &bscr,
                           &bref,
                           CACHE};
        OK(bn_vk_begin(vk, &err), "begin");
        record_shipped_exact(vk, &sc);
        OK(bn_vk_submit(vk, &err), "submit");
        float ref[N_HEAD * HEAD_DIM], got[N_HEAD * HEAD_DIM], cpu[N_HEAD * HEAD_DIM];
        OK(bn_vk_read(vk, &bref, ref, sizeof ref, &err), "read");
        cpu_attention(q, kc, vc, n_pos, N_HEAD, N_KV, HEAD_DIM, cpu);
        compare("shipped", n_pos, ref, cpu);
        printf("\ncontext %d: us a dispatch, chains of %d (one: a submission of one)\n", n_pos,
               N_CHAIN);
        printf("  %-28s %9s %9s %9s\n", "form", "chained", "free", "one");
        report(vk, "shipped", record_shipped_exact, &sc, false);
        for (int f = 0; f < N_FORMS; f++) {
            attn_case lc = {kernels[f],
                            {&binfo, &bt, &bq, &bkc, &bvc, &bscr, &batt},
                            flat_attn_push(1, N_HEAD, N_KV, HEAD_DIM, CACHE, CACHE),
                            N_HEAD};
            const bool whole = strstr(forms[f], "stop") == NULL;
            if (whole) {
                const float nan_row[N_HEAD * HEAD_DIM] = {NAN};
                OK(bn_vk_write(vk, &batt, nan_row, sizeof nan_row, &err), "poison");
                OK(bn_vk_begin(vk, &err), "begin");
                record_attn_case(vk, &lc);
                OK(bn_vk_submit(vk, &err), "submit");
                OK(bn_vk_read(vk, &batt, got, sizeof got, &err), "read");
                failed += !compare(forms[f], n_pos, got, cpu);
            }
            report(vk, forms[f], record_attn_case, &lc, false);
        }
    }
    printf("\nchecks: %s\n", failed ? "FAILED" : "every whole form gave the CPU's bits");
    for (int f = 0; f < N_FORMS; f++)
        bn_vk_kernel_free(vk, kernels[f]);
    bn_vk_buffer *all[] = {&bq, &bkc, &bvc, &bt, &binfo, &bscr, &bref, &batt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    bn_vk_ops_free(vk, ops);
    bn_vk_close(vk);
    free(q);
    free(kc);
    free(vc);
    return failed ? 1 : 0;
}
