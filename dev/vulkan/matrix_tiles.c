/*
 * matrix_tiles.c - the W2A8 products of a prompt chunk on the device's int8
 * subgroup matrix products: the shipped matrix kernel
 * (bn_vk_w2a8_matrix_kernel, shaders/w2a8_matrix.comp) and forms of its
 * tile (shaders/matrix_lab.comp: mlab_*), beside the dot-product tiles
 * (bn_vk_w2a8_tiles_kernel), for the 2B-4T shape's four products (q|k|v
 * 3840 x 2560 and Wo 2560 x 2560 stored, gate|up 2 x 6912 x 2560 with the
 * squared-ReLU epilogue, down 2560 x 6912 stored) at 64 and 128 rows, each
 * timed as chains of dispatches with a barrier before each (lab.h).
 *
 * Check: every form's outputs bit for bit the dot-product tiles' (integer
 * sums in any order are the same sums), and those, for the first and last
 * rows, the CPU's: ((float)sum / act_scale) * weight_scale (the gate's
 * squared ReLU times the up for gate|up). Needs fp64 and integer dot
 * products; the matrix forms need int8 matrices (bitnet devices), else
 * only the dot-product tiles are timed.
 *
 *   make -C dev/vulkan BUILD=../../build   (a build with -DBITNET_VULKAN=ON)
 *   dev/vulkan/matrix_tiles [device [chain length]]
 */
#include "lab.h" /* first: it asks for POSIX's clock */

#include <stdint.h>

#include "vk_w2a8.h"

/* The lab forms: name, rows a workgroup (TM). */
static const struct {
    const char *name;
    int tm;
} kForms[] = {
    {"mlab_t32_s8", 32},      /* the shipped tile */
    {"mlab_t32_s4", 32},      /* four subgroups of 16 x 32 */
    {"mlab_t32_s8_kw16", 32}, /* 16 weight words a stage */
    {"mlab_t32_s8_db", 32},   /* two stage buffers */
    {"mlab_t64_s16", 64},     /* 64 rows, sixteen subgroups */
    {"mlab_t16_s4", 16},      /* 16 rows, four subgroups */
};
#define N_FORMS (int)(sizeof kForms / sizeof kForms[0])

/* shaders/w2a8_params.glsl's push constants (vk_w2a8.c's matvec_params). */
typedef struct params {
    uint32_t n, words, act_row;
    float weight_scale;
    uint32_t rows, mode;
    float up_scale, v_scale;
    uint32_t rest[9];
} params;

typedef struct product {
    const char *name;
    int64_t n, k; /* n outputs a row (the gate's for gate|up), rows of k */
    int mode;     /* 0 stored, 2 gate and up */
} product;

typedef struct job {
    bn_vk_kernel *kernel;
    bn_vk_buffer *buffers[9];
    params p;
    uint64_t groups;
} job;

static void record_job(bn_vk *vk, void *ctx)
{
    job *j = ctx;
    OK(bn_vk_dispatch_groups(vk, j->kernel, j->buffers, &j->p, j->groups, &err), "dispatch");
}

/* The library's kernels through its own record functions. */
typedef struct lib_job {
    bn_vk_kernel *kernel;
    bn_vk_buffer *w, *x, *s, *y;
    const product *pr;
    int64_t rows;
} lib_job;

static void record_lib(bn_vk *vk, void *ctx)
{
    lib_job *j = ctx;
    if (j->pr->mode == 2)
        OK(bn_vk_w2a8_record_gate_up(vk, j->kernel, j->w, j->x, j->s, 0, j->rows, j->y, j->pr->n,
                                     j->pr->k, 0.75f, 1.25f, &err),
           "gate_up");
    else
        OK(bn_vk_w2a8_record_rows(vk, j->kernel, j->w, j->x, j->s, 0, j->rows, j->y, j->pr->n,
                                  j->pr->k, 0.75f, BN_VK_W2A8_STORE, &err),
           "rows");
}

static void run_once(bn_vk *vk, record_fn record, void *ctx)
{
    OK(bn_vk_begin(vk, &err), "begin");
    record(vk, ctx);
    OK(bn_vk_submit(vk, &err), "submit");
}

/* The CPU's output of row a, output i (float operations as the epilogue's). */
static float cpu_output(const int8_t *codes, const int8_t *x, const float *scales,
                        const product *pr, int64_t a, int64_t i)
{
    const int64_t k = pr->k;
    float v[2];
    for (int part = 0; part < (pr->mode == 2 ? 2 : 1); part++) {
        const int8_t *w = codes + (part * pr->n + i) * k;
        int32_t sum = 0;
        for (int64_t c = 0; c < k; c++)
            sum += (int32_t)w[c] * (int32_t)x[a * k + c];
        const float q = (float)sum / scales[a];
        v[part] = q * (part == 0 ? 0.75f : 1.25f);
    }
    if (pr->mode != 2)
        return v[0];
    const float g = v[0] > 0.0f ? v[0] : 0.0f;
    return (g * g) * v[1];
}

int main(int argc, char **argv)
{
    lab_init(argc, argv);
    bn_vk *vk = NULL;
    OK(bn_vk_open(argc > 1 ? atoi(argv[1]) : 0, &vk, &err), "open");
    const bn_vulkan_device *d = bn_vk_device(vk);
    printf("matrix_tiles: %s (%s), chains of %d\n", d->name, d->type, N_CHAIN);
    if (!bn_vk_w2a8_rows_kernel_fits(vk)) {
        printf("the tiled products need fp64 and integer dot products: nothing to time here\n");
        return 0;
    }
    const bool matrix = bn_vk_w2a8_matrix_fits(vk);
    if (!matrix)
        printf("no int8 subgroup matrix products here: the dot-product tiles only\n");
    bn_vk_kernel *tiles = NULL, *shipped = NULL, *forms[N_FORMS] = {0};
    OK(bn_vk_w2a8_tiles_kernel(vk, &tiles, &err), "tiles kernel");
    if (matrix) {
        OK(bn_vk_w2a8_matrix_kernel(vk, &shipped, &err), "matrix kernel");
        for (int f = 0; f < N_FORMS; f++)
            forms[f] = lab_kernel(vk, kForms[f].name, 9, sizeof(params));
    }
    static const product kProducts[] = {{"q|k|v 3840 x 2560", 3840, 2560, 0},
                                        {"Wo 2560 x 2560", 2560, 2560, 0},
                                        {"gate|up 2 x 6912 x 2560", 6912, 2560, 2},
                                        {"down 2560 x 6912", 2560, 6912, 0}};
    static const int64_t kRows[] = {64, 128};
    int failed = 0;
    printf("  %-28s %9s %9s %9s\n", "us a dispatch", "chained", "free", "alone");
    for (size_t pi = 0; pi < sizeof kProducts / sizeof kProducts[0]; pi++) {
        const product *pr = &kProducts[pi];
        const int64_t w_rows = pr->mode == 2 ? 2 * pr->n : pr->n, k = pr->k;
        const size_t words = bn_vk_w2a8_words(k);
        int8_t *codes = malloc((size_t)(w_rows * k));
        uint32_t *packed = malloc((size_t)w_rows * words * 4);
        for (int64_t i = 0; i < w_rows * k; i++)
            codes[i] = (int8_t)((int)(next_rand() % 3) - 1);
        bn_vk_w2a8_pack(codes, w_rows, k, packed);
        bn_vk_buffer bw = buffer_with(vk, packed, (size_t)w_rows * words * 4);
        for (size_t ri = 0; ri < sizeof kRows / sizeof kRows[0]; ri++) {
            const int64_t rows = kRows[ri], out_n = rows * pr->n;
            int8_t *x = calloc((size_t)(rows * words * 16), 1);
            float *scales = malloc((size_t)rows * 4), *ref = malloc((size_t)out_n * 4),
                  *got = malloc((size_t)out_n * 4);
            for (int64_t a = 0; a < rows; a++) {
                for (int64_t c = 0; c < k; c++)
                    x[a * (int64_t)words * 16 + c] = (int8_t)((int)(next_rand() % 255) - 127);
                scales[a] = rand_float(10.0f, 100.0f);
            }
            /* the CPU's reference reads x as rows of k */
            int8_t *xk = malloc((size_t)(rows * k));
            for (int64_t a = 0; a < rows; a++)
                memcpy(xk + a * k, x + a * (int64_t)words * 16, (size_t)k);
            bn_vk_buffer bx = buffer_with(vk, x, (size_t)rows * words * 16);
            bn_vk_buffer bs = buffer_with(vk, scales, (size_t)rows * 4);
            bn_vk_buffer by = buffer_with(vk, NULL, (size_t)out_n * 4);
            printf("%s, %lld rows\n", pr->name, (long long)rows);
            lib_job lj = {tiles, &bw, &bx, &bs, &by, pr, rows};
            run_once(vk, record_lib, &lj);
            OK(bn_vk_read(vk, &by, ref, (size_t)out_n * 4, &err), "read");
            int64_t bad = 0;
            for (int64_t a = 0; a < rows; a += rows - 1)
                for (int64_t i = 0; i < pr->n; i++) {
                    const float c = cpu_output(codes, xk, scales, pr, a, i);
                    bad += memcmp(&c, &ref[a * pr->n + i], 4) != 0;
                }
            if (bad) {
                printf("  dot-product tiles: %lld outputs of rows 0 and %lld differ from the "
                       "CPU's\n",
                       (long long)bad, (long long)rows - 1);
                failed++;
            }
            report(vk, "dot-product tiles", record_lib, &lj, false);
            for (int f = -1; matrix && f < N_FORMS; f++) {
                job j = {.kernel = f < 0 ? shipped : forms[f],
                         .buffers = {&bw, &bx, &by, &bs, &by, &by, &by, &by, &by},
                         .p = {.n = (uint32_t)pr->n,
                               .words = (uint32_t)words,
                               .weight_scale = 0.75f,
                               .rows = (uint32_t)rows,
                               .mode = (uint32_t)pr->mode,
                               .up_scale = 1.25f}};
                const int tm = f < 0 ? 32 : kForms[f].tm;
                const uint64_t per_row =
                    (uint64_t)((pr->n + (pr->mode == 2 ? 3 : 7)) / (pr->mode == 2 ? 4 : 8));
                j.groups = (per_row + 7) / 8 * (uint64_t)((rows + tm - 1) / tm);
                const float nan = NAN;
                for (int64_t i = 0; i < out_n; i++)
                    got[i] = nan;
                OK(bn_vk_write(vk, &by, got, (size_t)out_n * 4, &err), "poison");
                run_once(vk, record_job, &j);
                OK(bn_vk_read(vk, &by, got, (size_t)out_n * 4, &err), "read");
                bad = 0;
                for (int64_t i = 0; i < out_n; i++)
                    bad += memcmp(&got[i], &ref[i], 4) != 0;
                const char *name = f < 0 ? "w2a8_matrix (shipped)" : kForms[f].name;
                if (bad) {
                    printf("  %s: %lld of %lld outputs differ from the dot-product tiles'\n", name,
                           (long long)bad, (long long)out_n);
                    failed++;
                }
                report(vk, name, record_job, &j, false);
            }
            bn_vk_buffer_free(vk, &bx);
            bn_vk_buffer_free(vk, &bs);
            bn_vk_buffer_free(vk, &by);
            free(x);
            free(xk);
            free(scales);
            free(ref);
            free(got);
        }
        bn_vk_buffer_free(vk, &bw);
        free(codes);
        free(packed);
    }
    printf(failed ? "FAILED: %d checks\n"
                  : "every form's outputs: the dot-product tiles' bit for "
                    "bit, those the CPU's on rows 0 and last\n",
           failed);
    return failed ? 1 : 0;
}
