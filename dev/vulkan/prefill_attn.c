/*
 * prefill_attn.c - the exact attention of a prompt chunk: the shipped
 * kernel for passes of many rows (bn_vk_attention_record: a workgroup a
 * row and KV head, attention_group.glsl) against shaders/attn_tile.comp,
 * R consecutive rows of one sequence and a KV head's query heads a
 * workgroup, each tile of 32 keys copied into shared memory once for all
 * of their scores and each value loaded once for the R rows' sums
 * (attn_tile_r4: R = 4, attn_tile_r2: R = 2).
 *
 * A chunk of 64 rows at positions P - 64 .. P - 1 of one sequence with the
 * 2B-4T heads (20 query heads of 128, 5 KV heads) over a flat cache, at
 * P = 128, 1000 and 4000 (or the contexts given), each form timed as
 * chains of dispatches with a barrier before each (lab.h).
 *
 * Check: each tiled form against the shipped kernel bit for bit (the same
 * arithmetic in the same order), and the shipped kernel's first and last
 * rows against the CPU's attention with exp in double within 1e-5 of the
 * range. Needs fp64.
 *
 *   make -C dev/vulkan BUILD=../../build   (a build with -DBITNET_VULKAN=ON)
 *   dev/vulkan/prefill_attn [device [chain length [contexts...]]]
 */
#include "lab.h"
#include "attn_ref.h"
#include "vk_ops.h"

#define N_HEAD 20
#define N_KV 5
#define HEAD_DIM 128
#define ROWS 64
#define CACHE 4096
#define Q_DIM (N_HEAD * HEAD_DIM)

int main(int argc, char **argv)
{
    lab_init(argc, argv);
    bn_vk *vk = NULL;
    OK(bn_vk_open(argc > 1 ? atoi(argv[1]) : 0, &vk, &err), "open");
    const bn_vulkan_device *d = bn_vk_device(vk);
    printf("prefill_attn: %s (%s), chains of %d\n", d->name, d->type, N_CHAIN);
    if (!d->fp64) {
        printf("the exact attention's tiled forms need fp64: nothing to compare here\n");
        return 0;
    }
    bn_vk_ops *ops = NULL;
    OK(bn_vk_ops_create(vk, &ops, &err), "ops");
    const size_t kv_floats = (size_t)CACHE * N_KV * HEAD_DIM;
    float *q = malloc((size_t)ROWS * Q_DIM * 4), *kc = malloc(kv_floats * 4),
          *vc = malloc(kv_floats * 4);
    for (int i = 0; i < ROWS * Q_DIM; i++)
        q[i] = rand_float(-3.0f, 3.0f);
    for (size_t i = 0; i < kv_floats; i++) {
        kc[i] = rand_float(-1.0f, 1.0f);
        vc[i] = rand_float(-1.0f, 1.0f);
    }
    const int32_t table[1] = {0};
    bn_vk_buffer bq = buffer_with(vk, q, (size_t)ROWS * Q_DIM * 4);
    bn_vk_buffer bkc = buffer_with(vk, kc, kv_floats * 4), bvc = buffer_with(vk, vc, kv_floats * 4);
    bn_vk_buffer bt = buffer_with(vk, table, sizeof table), binfo = buffer_with(vk, NULL, 8 * ROWS);
    bn_vk_buffer bs = buffer_with(vk, NULL, (size_t)ROWS * N_HEAD * CACHE * 4);
    bn_vk_buffer bref = buffer_with(vk, NULL, (size_t)ROWS * Q_DIM * 4);
    bn_vk_buffer batt = buffer_with(vk, NULL, (size_t)ROWS * Q_DIM * 4);
    static const char *const names[] = {"attn_tile_r4", "attn_tile_r2"};
    static const int rows_a_group[] = {4, 2};
    bn_vk_kernel *tiles[2];
    for (int i = 0; i < 2; i++)
        tiles[i] = lab_kernel(vk, names[i], 7, sizeof(attn_push));
    static float ref[ROWS * Q_DIM], got[ROWS * Q_DIM], cpu[Q_DIM];
    int contexts[8] = {128, 1000, 4000}, n_ctx = 3;
    if (argc > 3) {
        n_ctx = 0;
        for (int i = 3; i < argc && n_ctx < 8; i++)
            contexts[n_ctx++] = atoi(argv[i]) < ROWS ? ROWS : atoi(argv[i]) > CACHE ? CACHE
                                                                                   : atoi(argv[i]);
    }
    int failed = 0;
    for (int ci = 0; ci < n_ctx; ci++) {
        const int P = contexts[ci];
        int32_t info[2 * ROWS];
        for (int r = 0; r < ROWS; r++) {
            info[2 * r] = 0;
            info[2 * r + 1] = P - ROWS + r;
        }
        OK(bn_vk_write(vk, &binfo, info, sizeof info, &err), "info");
        shipped_attn sc = {ops,
                           {N_HEAD, N_KV, HEAD_DIM, CACHE},
                           {&binfo, &bt, ROWS, CACHE, 1},
                           &bq,
                           &bkc,
                           &bvc,
                           &bs,
                           &bref,
                           CACHE};
        OK(bn_vk_begin(vk, &err), "begin");
        record_shipped_exact(vk, &sc);
        OK(bn_vk_submit(vk, &err), "submit");
        OK(bn_vk_read(vk, &bref, ref, sizeof ref, &err), "read");
        float lo = INFINITY, hi = -INFINITY, most = 0.0f;
        for (int r = 0; r < ROWS; r += ROWS - 1) {
            /* row r: n_pos = P - ROWS + r + 1 */
            cpu_attention(q + (size_t)r * Q_DIM, kc, vc, P - ROWS + r + 1, N_HEAD, N_KV, HEAD_DIM,
                          cpu);
            for (int i = 0; i < Q_DIM; i++) {
                lo = cpu[i] < lo ? cpu[i] : lo;
                hi = cpu[i] > hi ? cpu[i] : hi;
                const float dd = fabsf(ref[r * Q_DIM + i] - cpu[i]);
                most = dd > most || isnan(dd) ? dd : most;
            }
        }
        const bool near = most <= 1e-5f * (hi - lo);
        printf("check shipped, context %d: rows 0 and %d within %.2g of the CPU's range: %s\n", P,
               ROWS - 1, most / (hi - lo), near ? "ok" : "FAILED");
        failed += !near;
        printf("context %d, %d rows: us a dispatch, chains of %d (one: a submission of one)\n", P,
               ROWS, N_CHAIN);
        printf("  %-28s %9s %9s %9s\n", "form", "chained", "free", "one");
        report(vk, "shipped (a row, KV head)", record_shipped_exact, &sc, false);
        for (int i = 0; i < 2; i++) {
            const int R = rows_a_group[i];
            attn_case tc = {tiles[i],
                            {&binfo, &bt, &bq, &bkc, &bvc, &bs, &batt},
                            flat_attn_push(ROWS, N_HEAD, N_KV, HEAD_DIM, CACHE, CACHE),
                            (uint32_t)((ROWS + R - 1) / R * N_KV)};
            memset(got, 0xff, sizeof got);
            OK(bn_vk_write(vk, &batt, got, sizeof got, &err), "poison");
            OK(bn_vk_begin(vk, &err), "begin");
            record_attn_case(vk, &tc);
            OK(bn_vk_submit(vk, &err), "submit");
            OK(bn_vk_read(vk, &batt, got, sizeof got, &err), "read");
            int differ = 0;
            for (int k = 0; k < ROWS * Q_DIM; k++)
                differ += memcmp(&got[k], &ref[k], 4) != 0;
            printf("check %s against shipped, context %d: %s (%d of %d differ)\n", names[i], P,
                   differ ? "DIFFERENT" : "bit for bit", differ, ROWS * Q_DIM);
            failed += differ != 0;
            report(vk, names[i], record_attn_case, &tc, false);
        }
    }
    printf("\nchecks: %s\n", failed ? "FAILED" : "ok");
    for (int i = 0; i < 2; i++)
        bn_vk_kernel_free(vk, tiles[i]);
    bn_vk_buffer *all[] = {&bq, &bkc, &bvc, &bt, &binfo, &bs, &bref, &batt};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        bn_vk_buffer_free(vk, all[i]);
    bn_vk_ops_free(vk, ops);
    bn_vk_close(vk);
    free(q);
    free(kc);
    free(vc);
    return failed ? 1 : 0;
}
