/* GPU test: the fp32 block ops of ops_kernels.cu against CPU references
 * written here, on fresh random ragged shapes with NaN-poisoned outputs.
 *
 *   RMSNorm            double-accumulated reference; max relative error
 *                      1e-5 (the GPU sums squares in fp32: a few 1e-7)
 *   fused norm + quant the normed floats equal the plain norm's bit for
 *                      bit; int8 rows, scales and sums equal both the CPU
 *                      quantizer and bn_cuda_quantize_rows on those floats
 *   squared ReLU       bit for bit (same fp32 operations)
 *   residual add       bit for bit
 *   fp16/bf16 stores   bit for bit with bn_fp32_to_fp16/bf16, NaN payloads
 *                      included
 *   RoPE               double reference from the same fp32 angle; error at
 *                      most 2e-6 (|x0| + |x1|) (sincosf is within 2 ulp);
 *                      inverse frequencies bit for bit with the CPU formula
 *   embeddings         bit for bit with bn_dequantize_row_*; a NaN that
 *                      arithmetic produced only needs to be a NaN (x86 and
 *                      the GPU make different default NaNs)
 *
 * Exits 77 without a usable GPU. */
#include <cuda_runtime_api.h>

#include "fmt_dense.h"
#include "fmt_tq.h"
#include "fp16.h"
#include "ops_cuda.h"
#include "quant_rules.h"
#include "read_stream.h"
#include "test_util.h"
#include "test_util_cuda.h"
#include "w2a8_cuda.h"

#define POISON_BYTE 0xff          /* every float becomes a NaN (0xffffffff) */
#define SUM_POISON 0x7f7f7f7f     /* far beyond any |sum| of int8 rows here */

/* The largest errors seen, printed at the end (for the contract's record). */
static double worst_norm, worst_rope;

static uint32_t bits_of(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static bool same_bits(float a, float b) { return bits_of(a) == bits_of(b); }

/* Equal bits, or both NaN (for values produced by arithmetic). */
static bool same_value(float a, float b) { return same_bits(a, b) || (isnan(a) && isnan(b)); }

static void *dev_alloc(size_t bytes)
{
    void *p = NULL;
    CUDA_OK(cudaMalloc(&p, bytes ? bytes : 1));
    return p;
}

static void *dev_upload(const void *host, size_t bytes)
{
    void *p = dev_alloc(bytes);
    CUDA_OK(cudaMemcpy(p, host, bytes, cudaMemcpyHostToDevice));
    return p;
}

static void *dev_poisoned(size_t bytes, int byte)
{
    void *p = dev_alloc(bytes);
    CUDA_OK(cudaMemset(p, byte, bytes));
    return p;
}

static void *host_download(const void *dev, size_t bytes)
{
    void *p = malloc(bytes ? bytes : 1);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(p, dev, bytes, cudaMemcpyDeviceToHost));
    return p;
}

/* A row of values of one random magnitude, signs mixed. */
static void random_row(float *x, int64_t n)
{
    const float range = test_rand_float(0.01f, 100.0f);
    for (int64_t i = 0; i < n; i++)
        x[i] = test_rand_float(-range, range);
}

static int64_t ragged_k(void)
{
    static const int64_t real[] = {1, 2, 31, 32, 33, 255, 256, 257, 640, 2560, 6912};
    if (test_rand_range(0, 2) == 0)
        return real[test_rand_range(0, (int64_t)(sizeof real / sizeof real[0]) - 1)];
    return test_rand_range(1, 9000);
}

/* ---- RMSNorm ------------------------------------------------------------------ */

/* Max relative error of y against w * x / sqrt(mean(x^2) + eps) in double;
 * a zero reference must be matched exactly. */
static double norm_error(const float *x, const float *w, int64_t k, float eps, const float *y)
{
    double ss = 0.0;
    for (int64_t i = 0; i < k; i++)
        ss += (double)x[i] * (double)x[i];
    const double inv = 1.0 / sqrt(ss / (double)k + (double)eps);
    double worst = 0.0;
    for (int64_t i = 0; i < k; i++) {
        const double ref = (double)w[i] * (double)x[i] * inv;
        const double e = ref == 0.0 ? (y[i] == 0.0f ? 0.0 : INFINITY)
                                    : fabs((double)y[i] - ref) / fabs(ref);
        if (!(e <= worst)) /* NaN counts as the worst */
            worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

/* Checks one row of int8 output (ldq wide, zeros past k) against the CPU
 * quantizer run on `normed`. */
static bool quant_row_matches(const float *normed, int64_t k, const int8_t *q, int64_t ldq,
                              float scale, int32_t sum)
{
    int8_t *ref = calloc(1, (size_t)ldq);
    float s;
    int32_t total;
    bn_quantize_activations_row(normed, k, ref, &s, &total);
    const bool ok = memcmp(ref, q, (size_t)ldq) == 0 && same_bits(s, scale) && total == sum;
    free(ref);
    return ok;
}

static void check_rmsnorm(int64_t m, int64_t k, bool special_rows)
{
    const int64_t ldx = k + test_rand_range(0, 40), ldy = k + test_rand_range(0, 40);
    const int64_t ldq = (k + 63) / 64 * 64 + 64 * test_rand_range(0, 1);
    const float eps = test_rand_range(0, 1) ? 1e-5f : 1e-6f;
    float *x = malloc(sizeof(float) * (size_t)(m * ldx));
    float *w = malloc(sizeof(float) * (size_t)k);
    for (int64_t r = 0; r < m; r++)
        random_row(x + r * ldx, ldx);
    for (int64_t i = 0; i < k; i++)
        w[i] = test_rand_float(-2.0f, 2.0f);
    if (special_rows && m >= 3) {
        /* An all-zero row (scale floor 1e-5), a row with a NaN (everything
         * NaN: int8 all 0), and a row with one huge value. */
        memset(x, 0, sizeof(float) * (size_t)k);
        x[ldx + test_rand_range(0, k - 1)] = NAN;
        x[2 * ldx + test_rand_range(0, k - 1)] = 1e15f; /* squares stay finite */
    }

    float *d_x = dev_upload(x, sizeof(float) * (size_t)(m * ldx));
    float *d_w = dev_upload(w, sizeof(float) * (size_t)k);
    float *d_y = dev_poisoned(sizeof(float) * (size_t)(m * ldy), POISON_BYTE);
    float *d_n = dev_poisoned(sizeof(float) * (size_t)(m * ldy), POISON_BYTE);
    int8_t *d_q = dev_poisoned((size_t)(m * ldq), 0x7f);
    int8_t *d_q2 = dev_poisoned((size_t)(m * ldq), 0x7f);
    int8_t *d_q3 = dev_poisoned((size_t)(m * ldq), 0x7f);
    float *d_s = dev_poisoned(sizeof(float) * (size_t)m, POISON_BYTE);
    float *d_s2 = dev_poisoned(sizeof(float) * (size_t)m, POISON_BYTE);
    float *d_s3 = dev_poisoned(sizeof(float) * (size_t)m, POISON_BYTE);
    int32_t *d_sum = dev_poisoned(sizeof(int32_t) * (size_t)m, 0x7f);
    int32_t *d_sum2 = dev_poisoned(sizeof(int32_t) * (size_t)m, 0x7f);
    int32_t *d_sum3 = dev_poisoned(sizeof(int32_t) * (size_t)m, 0x7f);

    CUDA_OK(bn_cuda_rmsnorm_rows(d_x, m, k, ldx, d_w, eps, d_y, ldy, 0));
    CUDA_OK(bn_cuda_rmsnorm_quantize_rows(d_x, m, k, ldx, d_w, eps, d_q, ldq, d_s, d_sum, d_n,
                                          ldy, 0));
    CUDA_OK(bn_cuda_rmsnorm_quantize_rows(d_x, m, k, ldx, d_w, eps, d_q2, ldq, d_s2, d_sum2, NULL,
                                          0, 0));
    /* The stand-alone quantizer on the fused kernel's normed rows. */
    CUDA_OK(bn_cuda_quantize_rows(d_n, m, k, ldy, d_q3, ldq, d_s3, d_sum3, 0));

    float *y = host_download(d_y, sizeof(float) * (size_t)(m * ldy));
    float *nrm = host_download(d_n, sizeof(float) * (size_t)(m * ldy));
    int8_t *q = host_download(d_q, (size_t)(m * ldq));
    int8_t *q2 = host_download(d_q2, (size_t)(m * ldq));
    int8_t *q3 = host_download(d_q3, (size_t)(m * ldq));
    float *s = host_download(d_s, sizeof(float) * (size_t)m);
    float *s2 = host_download(d_s2, sizeof(float) * (size_t)m);
    float *s3 = host_download(d_s3, sizeof(float) * (size_t)m);
    int32_t *sum = host_download(d_sum, sizeof(int32_t) * (size_t)m);
    int32_t *sum2 = host_download(d_sum2, sizeof(int32_t) * (size_t)m);
    int32_t *sum3 = host_download(d_sum3, sizeof(int32_t) * (size_t)m);

    double worst = 0.0;
    for (int64_t r = 0; r < m; r++) {
        const float *yr = y + r * ldy, *nr = nrm + r * ldy;
        const bool nan_row = special_rows && m >= 3 && r == 1;
        if (!nan_row) {
            const double e = norm_error(x + r * ldx, w, k, eps, yr);
            worst = e > worst ? e : worst;
        }
        int64_t differ = 0, gap_written = 0;
        for (int64_t i = 0; i < k; i++)
            differ += !same_bits(yr[i], nr[i]) && !(nan_row && isnan(yr[i]) && isnan(nr[i]));
        for (int64_t i = k; i < ldy; i++) /* the stride gap keeps its poison */
            gap_written += bits_of(yr[i]) != 0xffffffffu || bits_of(nr[i]) != 0xffffffffu;
        CHECK_MSG(differ == 0 && gap_written == 0,
                  "rmsnorm m=%lld k=%lld row %lld: %lld normed values differ between the plain "
                  "and the fused kernel, %lld gap values written",
                  (long long)m, (long long)k, (long long)r, (long long)differ,
                  (long long)gap_written);
        CHECK_MSG(quant_row_matches(nr, k, q + r * ldq, ldq, s[r], sum[r]),
                  "rmsnorm+quantize m=%lld k=%lld ldq=%lld row %lld differs from the CPU "
                  "quantizer on the normed row",
                  (long long)m, (long long)k, (long long)ldq, (long long)r);
    }
    worst_norm = worst > worst_norm ? worst : worst_norm;
    CHECK_MSG(worst <= 1e-5, "rmsnorm m=%lld k=%lld: max relative error %.3g > 1e-5",
              (long long)m, (long long)k, worst);
    CHECK_MSG(memcmp(q, q2, (size_t)(m * ldq)) == 0 && memcmp(q, q3, (size_t)(m * ldq)) == 0 &&
                  memcmp(s, s2, sizeof(float) * (size_t)m) == 0 &&
                  memcmp(s, s3, sizeof(float) * (size_t)m) == 0 &&
                  memcmp(sum, sum2, sizeof(int32_t) * (size_t)m) == 0 &&
                  memcmp(sum, sum3, sizeof(int32_t) * (size_t)m) == 0,
              "rmsnorm+quantize m=%lld k=%lld: results differ with normed=NULL or from "
              "bn_cuda_quantize_rows",
              (long long)m, (long long)k);

    /* In place (y = x) gives the same bits. */
    {
        float *d_xy = dev_upload(x, sizeof(float) * (size_t)(m * ldx));
        CUDA_OK(bn_cuda_rmsnorm_rows(d_xy, m, k, ldx, d_w, eps, d_xy, ldx, 0));
        float *xy = host_download(d_xy, sizeof(float) * (size_t)(m * ldx));
        int64_t differ = 0;
        for (int64_t r = 0; r < m; r++)
            for (int64_t i = 0; i < k; i++)
                differ += !same_value(xy[r * ldx + i], y[r * ldy + i]);
        CHECK_MSG(differ == 0, "rmsnorm in place m=%lld k=%lld: %lld values differ",
                  (long long)m, (long long)k, (long long)differ);
        free(xy);
        CUDA_OK(cudaFree(d_xy));
    }

    void *dev[] = {d_x, d_w, d_y, d_n, d_q, d_q2, d_q3, d_s, d_s2, d_s3, d_sum, d_sum2, d_sum3};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        CUDA_OK(cudaFree(dev[i]));
    void *host[] = {x, w, y, nrm, q, q2, q3, s, s2, s3, sum, sum2, sum3};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

/* ---- squared ReLU ------------------------------------------------------------- */

static float relu2_ref(float g, float u)
{
    const float r = g > 0.0f ? g : 0.0f;
    return (r * r) * u;
}

static void check_relu2(int64_t m, int64_t k)
{
    /* gate and up as the two halves of one fused projection output. */
    const int64_t ld = 2 * k + test_rand_range(0, 16), ldh = k + test_rand_range(0, 16);
    const int64_t ldq = (k + 63) / 64 * 64;
    const float eps = 1e-5f;
    float *gu = malloc(sizeof(float) * (size_t)(m * ld));
    float *w = malloc(sizeof(float) * (size_t)k);
    for (int64_t r = 0; r < m; r++)
        random_row(gu + r * ld, ld);
    for (int64_t i = 0; i < k; i++)
        w[i] = test_rand_float(0.2f, 3.0f);
    gu[test_rand_range(0, k - 1)] = NAN; /* a NaN gate: relu gives 0 */

    float *d_gu = dev_upload(gu, sizeof(float) * (size_t)(m * ld));
    float *d_w = dev_upload(w, sizeof(float) * (size_t)k);
    float *d_h = dev_poisoned(sizeof(float) * (size_t)(m * ldh), POISON_BYTE);
    float *d_hn = dev_poisoned(sizeof(float) * (size_t)(m * ldh), POISON_BYTE);
    float *d_n = dev_poisoned(sizeof(float) * (size_t)(m * ldh), POISON_BYTE);
    int8_t *d_q = dev_poisoned((size_t)(m * ldq), 0x7f);
    float *d_s = dev_poisoned(sizeof(float) * (size_t)m, POISON_BYTE);
    int32_t *d_sum = dev_poisoned(sizeof(int32_t) * (size_t)m, 0x7f);

    CUDA_OK(bn_cuda_relu2_mul(d_gu, ld, d_gu + k, ld, m, k, d_h, ldh, 0));
    /* Plain gate, then the plain norm: the fused kernel must give these bits. */
    CUDA_OK(bn_cuda_rmsnorm_rows(d_h, m, k, ldh, d_w, eps, d_hn, ldh, 0));
    CUDA_OK(bn_cuda_relu2_mul_norm_quantize(d_gu, ld, d_gu + k, ld, m, k, d_w, eps, d_q, ldq, d_s,
                                            d_sum, d_n, ldh, 0));
    float *h = host_download(d_h, sizeof(float) * (size_t)(m * ldh));
    float *hn = host_download(d_hn, sizeof(float) * (size_t)(m * ldh));
    float *nrm = host_download(d_n, sizeof(float) * (size_t)(m * ldh));
    int8_t *q = host_download(d_q, (size_t)(m * ldq));
    float *s = host_download(d_s, sizeof(float) * (size_t)m);
    int32_t *sum = host_download(d_sum, sizeof(int32_t) * (size_t)m);

    int64_t h_differ = 0, n_differ = 0;
    double worst = 0.0;
    float *href = malloc(sizeof(float) * (size_t)k);
    for (int64_t r = 0; r < m; r++) {
        for (int64_t i = 0; i < k; i++) {
            href[i] = relu2_ref(gu[r * ld + i], gu[r * ld + k + i]);
            h_differ += !same_bits(h[r * ldh + i], href[i]);
            n_differ += !same_bits(hn[r * ldh + i], nrm[r * ldh + i]);
        }
        const double e = norm_error(href, w, k, eps, nrm + r * ldh);
        worst = e > worst ? e : worst;
        CHECK_MSG(quant_row_matches(nrm + r * ldh, k, q + r * ldq, ldq, s[r], sum[r]),
                  "relu2+norm+quantize m=%lld k=%lld row %lld differs from the CPU quantizer",
                  (long long)m, (long long)k, (long long)r);
    }
    CHECK_MSG(h_differ == 0, "relu2 m=%lld k=%lld: %lld values differ from (g*g)*u",
              (long long)m, (long long)k, (long long)h_differ);
    CHECK_MSG(n_differ == 0,
              "relu2+norm+quantize m=%lld k=%lld: %lld normed values differ from relu2 then "
              "rmsnorm",
              (long long)m, (long long)k, (long long)n_differ);
    worst_norm = worst > worst_norm ? worst : worst_norm;
    CHECK_MSG(worst <= 1e-5, "relu2+norm m=%lld k=%lld: max relative error %.3g > 1e-5",
              (long long)m, (long long)k, worst);

    /* In place over the gate half. */
    CUDA_OK(bn_cuda_relu2_mul(d_gu, ld, d_gu + k, ld, m, k, d_gu, ld, 0));
    float *gu2 = host_download(d_gu, sizeof(float) * (size_t)(m * ld));
    int64_t differ = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < k; i++)
            differ += !same_bits(gu2[r * ld + i], h[r * ldh + i]);
    CHECK_MSG(differ == 0, "relu2 in place m=%lld k=%lld: %lld values differ", (long long)m,
              (long long)k, (long long)differ);

    void *dev[] = {d_gu, d_w, d_h, d_hn, d_n, d_q, d_s, d_sum};
    for (size_t i = 0; i < sizeof dev / sizeof dev[0]; i++)
        CUDA_OK(cudaFree(dev[i]));
    void *host[] = {gu, w, h, hn, nrm, q, s, sum, href, gu2};
    for (size_t i = 0; i < sizeof host / sizeof host[0]; i++)
        free(host[i]);
}

/* ---- residual add and stores ----------------------------------------------------- */

static void check_add(int64_t m, int64_t k)
{
    const int64_t ldy = k + test_rand_range(0, 9), ldx = k + test_rand_range(0, 9);
    float *y = malloc(sizeof(float) * (size_t)(m * ldy));
    float *x = malloc(sizeof(float) * (size_t)(m * ldx));
    for (int64_t r = 0; r < m; r++) {
        random_row(y + r * ldy, ldy);
        random_row(x + r * ldx, ldx);
    }
    float *d_y = dev_upload(y, sizeof(float) * (size_t)(m * ldy));
    float *d_x = dev_upload(x, sizeof(float) * (size_t)(m * ldx));
    CUDA_OK(bn_cuda_add_rows(d_y, ldy, d_x, ldx, m, k, 0));
    float *got = host_download(d_y, sizeof(float) * (size_t)(m * ldy));
    int64_t differ = 0;
    for (int64_t r = 0; r < m; r++)
        for (int64_t i = 0; i < ldy; i++) {
            const float want = i < k ? y[r * ldy + i] + x[r * ldx + i] : y[r * ldy + i];
            differ += !same_bits(got[r * ldy + i], want);
        }
    CHECK_MSG(differ == 0, "add m=%lld k=%lld: %lld values differ", (long long)m, (long long)k,
              (long long)differ);
    CUDA_OK(cudaFree(d_y));
    CUDA_OK(cudaFree(d_x));
    free(y);
    free(x);
    free(got);
}

/* Values that exercise every branch of the conversions. */
static float special_value(void)
{
    static const uint32_t specials[] = {
        0x7f800000u, 0xff800000u, 0x7fc00000u, 0xffc00000u, /* inf, NaN          */
        0x7f800001u, 0x7fa00000u, 0xff801234u, 0x7fbfffffu, /* signalling NaNs   */
        0x00000000u, 0x80000000u, 0x00000001u, 0x807fffffu, /* zeros, subnormal  */
        0x477fe000u, 0x477fefffu, 0x477ff000u, 0x477fffffu, /* 65504 .. 65536    */
        0x38800000u, 0x33800000u, 0x33000000u, 0x33000001u, /* half min/sub/tie  */
        0x3f808000u, 0x3f818000u, 0x3f80c000u, 0x7f7fffffu, /* bf16 ties, max    */
    };
    return float_of(specials[test_rand_range(0, (int64_t)(sizeof specials / 4) - 1)]);
}

static void check_store(bn_qtype type, int64_t m, int64_t k)
{
    const size_t esize = type == BN_QTYPE_F32 ? 4 : 2;
    const int64_t ldx = k + test_rand_range(0, 5), ld_dst = k + test_rand_range(0, 5);
    const int64_t dst_count = m + test_rand_range(0, 5); /* rows in the "cache" */
    float *x = malloc(sizeof(float) * (size_t)(m * ldx));
    for (int64_t r = 0; r < m; r++)
        random_row(x + r * ldx, ldx);
    for (int64_t i = 0; i < m * ldx / 4 + 1; i++)
        x[test_rand_range(0, m * ldx - 1)] = special_value();
    /* Distinct destination rows in random order; one row skipped (-1). */
    int32_t *rows = malloc(sizeof(int32_t) * (size_t)dst_count);
    for (int64_t i = 0; i < dst_count; i++)
        rows[i] = (int32_t)i;
    for (int64_t i = dst_count - 1; i > 0; i--) {
        const int64_t j = test_rand_range(0, i);
        const int32_t t = rows[i];
        rows[i] = rows[j];
        rows[j] = t;
    }
    if (m > 1)
        rows[test_rand_range(0, m - 1)] = -1;
    const bool indexed = test_rand_range(0, 3) != 0;

    float *d_x = dev_upload(x, sizeof(float) * (size_t)(m * ldx));
    int32_t *d_rows = dev_upload(rows, sizeof(int32_t) * (size_t)dst_count);
    const size_t dst_bytes = esize * (size_t)(dst_count * ld_dst);
    uint8_t *d_dst = dev_poisoned(dst_bytes, 0xa5);
    CUDA_OK(bn_cuda_store_rows(d_x, m, k, ldx, type, d_dst, ld_dst, indexed ? d_rows : NULL, 0));
    uint8_t *got = host_download(d_dst, dst_bytes);

    /* The expected cache: poison, then each stored row converted on the CPU. */
    uint8_t *want = malloc(dst_bytes);
    memset(want, 0xa5, dst_bytes);
    for (int64_t r = 0; r < m; r++) {
        const int64_t d = indexed ? rows[r] : r;
        if (d < 0)
            continue;
        for (int64_t c = 0; c < k; c++) {
            const float v = x[r * ldx + c];
            uint8_t *p = want + esize * (size_t)(d * ld_dst + c);
            if (type == BN_QTYPE_F32) {
                memcpy(p, &v, 4);
            } else {
                const uint16_t h = type == BN_QTYPE_F16 ? bn_fp32_to_fp16(v) : bn_fp32_to_bf16(v);
                memcpy(p, &h, 2);
            }
        }
    }
    CHECK_MSG(memcmp(got, want, dst_bytes) == 0,
              "store type %d m=%lld k=%lld (%s): bytes differ from the CPU conversion", (int)type,
              (long long)m, (long long)k, indexed ? "row index array" : "rows in order");
    CUDA_OK(cudaFree(d_x));
    CUDA_OK(cudaFree(d_rows));
    CUDA_OK(cudaFree(d_dst));
    free(x);
    free(rows);
    free(got);
    free(want);
}

/* ---- RoPE ------------------------------------------------------------------------ */

static void check_rope(void)
{
    static const int head_dims[] = {64, 80, 96, 128, 256};
    const int head_dim = head_dims[test_rand_range(0, 4)];
    int rope_dim = head_dim;
    if (test_rand_range(0, 2) == 0)
        rope_dim = 2 * (int)test_rand_range(1, head_dim / 2);
    const float theta = test_rand_range(0, 1) ? 500000.0f : 10000.0f;
    const int n_heads = (int)test_rand_range(1, 24);
    const int n_kv = test_rand_range(0, 4) == 0 ? 0 : (int)test_rand_range(1, n_heads);
    const int64_t n_tok = test_rand_range(1, 40);
    const int64_t ldq = (int64_t)n_heads * head_dim + test_rand_range(0, 3) * head_dim;
    const int64_t ldk = (int64_t)n_kv * head_dim + test_rand_range(0, 2) * 7;

    bn_rope_freqs f;
    CHECK(bn_rope_freqs_init(&f, theta, rope_dim) == cudaSuccess);
    int bad_freq = 0;
    for (int j = 0; j < rope_dim / 2; j++)
        bad_freq += !same_bits(f.inv_freq[j],
                               1.0f / powf(theta, (float)(2 * j) / (float)rope_dim));
    CHECK_MSG(bad_freq == 0, "rope: %d inverse frequencies differ from the CPU formula", bad_freq);

    int32_t *pos = malloc(sizeof(int32_t) * (size_t)n_tok);
    for (int64_t t = 0; t < n_tok; t++)
        pos[t] = (int32_t)(test_rand_range(0, 3) == 0 ? test_rand_range(0, 16)
                                                      : test_rand_range(0, 131071));
    float *q = malloc(sizeof(float) * (size_t)(n_tok * ldq));
    float *k = malloc(sizeof(float) * (size_t)(n_tok * (ldk > 0 ? ldk : 1)));
    random_row(q, n_tok * ldq);
    if (n_kv > 0)
        random_row(k, n_tok * ldk);

    float *d_q = dev_upload(q, sizeof(float) * (size_t)(n_tok * ldq));
    float *d_k = n_kv > 0 ? dev_upload(k, sizeof(float) * (size_t)(n_tok * ldk)) : NULL;
    int32_t *d_pos = dev_upload(pos, sizeof(int32_t) * (size_t)n_tok);
    CUDA_OK(bn_cuda_rope_neox(d_q, ldq, n_heads, d_k, ldk, n_kv, n_tok, head_dim, d_pos, &f, 0));
    float *gq = host_download(d_q, sizeof(float) * (size_t)(n_tok * ldq));
    float *gk = n_kv > 0 ? host_download(d_k, sizeof(float) * (size_t)(n_tok * ldk)) : NULL;

    const int half = rope_dim / 2;
    double worst = 0.0;
    int64_t untouched_bad = 0;
    for (int pass = 0; pass < 2; pass++) {
        const int heads = pass == 0 ? n_heads : n_kv;
        const int64_t ld = pass == 0 ? ldq : ldk;
        const float *in = pass == 0 ? q : k, *out = pass == 0 ? gq : gk;
        for (int64_t t = 0; t < n_tok && heads > 0; t++) {
            for (int64_t i = (int64_t)heads * head_dim; i < ld; i++) /* stride gap */
                untouched_bad += !same_bits(in[t * ld + i], out[t * ld + i]);
            for (int h = 0; h < heads; h++) {
                const float *x = in + t * ld + (int64_t)h * head_dim;
                const float *y = out + t * ld + (int64_t)h * head_dim;
                for (int j = 0; j < half; j++) {
                    const float angle = (float)pos[t] * f.inv_freq[j];
                    const double c = cos((double)angle), s = sin((double)angle);
                    const double x0 = x[j], x1 = x[j + half];
                    const double r0 = x0 * c - x1 * s, r1 = x1 * c + x0 * s;
                    const double mag = fabs(x0) + fabs(x1);
                    const double e0 = fabs(y[j] - r0) / mag, e1 = fabs(y[j + half] - r1) / mag;
                    const double e = e0 > e1 ? e0 : e1;
                    if (!(e <= worst))
                        worst = isnan(e) ? INFINITY : e;
                }
                for (int i = rope_dim; i < head_dim; i++)
                    untouched_bad += !same_bits(x[i], y[i]);
            }
        }
    }
    worst_rope = worst > worst_rope ? worst : worst_rope;
    CHECK_MSG(worst <= 2e-6,
              "rope head_dim=%d rope_dim=%d theta=%g: max error %.3g of |x0|+|x1| > 2e-6",
              head_dim, rope_dim, (double)theta, worst);
    CHECK_MSG(untouched_bad == 0, "rope: %lld values past rope_dim or in the stride gap changed",
              (long long)untouched_bad);

    CUDA_OK(cudaFree(d_q));
    if (d_k)
        CUDA_OK(cudaFree(d_k));
    CUDA_OK(cudaFree(d_pos));
    free(pos);
    free(q);
    free(k);
    free(gq);
    free(gk);
}

/* ---- embeddings ------------------------------------------------------------------- */

typedef struct embed_type {
    bn_qtype type;
    int block_elems, block_bytes;
    void (*dequantize_row)(const void *, float *, int64_t);
} embed_type;

static const embed_type embed_types[] = {
    {BN_QTYPE_F32, 1, 4, bn_dequantize_row_f32},
    {BN_QTYPE_F16, 1, 2, bn_dequantize_row_f16},
    {BN_QTYPE_BF16, 1, 2, bn_dequantize_row_bf16},
    {BN_QTYPE_Q8_0, 32, 34, bn_dequantize_row_q8_0},
    {BN_QTYPE_Q4_K, 256, 144, bn_dequantize_row_q4_k},
    {BN_QTYPE_Q6_K, 256, 210, bn_dequantize_row_q6_k},
    {BN_QTYPE_TQ2_0, 256, 66, bn_dequantize_row_tq2_0},
};

static void put_half(uint8_t *p, float v)
{
    const uint16_t h = bn_fp32_to_fp16(v);
    p[0] = (uint8_t)(h & 0xff);
    p[1] = (uint8_t)(h >> 8);
}

/* A random table: real encodings of random floats where the format has a
 * quantizer, random bytes with realistic fp16 scales where it has none
 * (every bit pattern of the quants is a valid block), plus special values. */
static uint8_t *random_table(const embed_type *t, int64_t n_rows, int64_t dim, int64_t row_bytes)
{
    uint8_t *table = malloc((size_t)(n_rows * row_bytes));
    float *row = malloc(sizeof(float) * (size_t)dim);
    for (int64_t r = 0; r < n_rows; r++) {
        uint8_t *dst = table + r * row_bytes;
        random_row(row, dim);
        switch (t->type) {
        case BN_QTYPE_F32: bn_quantize_row_f32(row, dst, dim); break;
        case BN_QTYPE_F16: bn_quantize_row_f16(row, dst, dim); break;
        case BN_QTYPE_BF16: bn_quantize_row_bf16(row, dst, dim); break;
        case BN_QTYPE_Q8_0: bn_quantize_row_q8_0(row, dst, dim); break;
        default:
            for (int64_t i = 0; i < row_bytes; i++)
                dst[i] = (uint8_t)test_rand_u64();
            for (int64_t b = 0; b < dim / t->block_elems; b++) {
                uint8_t *blk = dst + b * t->block_bytes;
                const float d = test_rand_float(1e-4f, 0.05f);
                if (t->type == BN_QTYPE_Q4_K) {
                    put_half(blk, d);
                    put_half(blk + 2, test_rand_float(1e-4f, 0.05f));
                } else {
                    put_half(blk + t->block_bytes - 2, d);
                }
            }
            break;
        }
        /* Specials: raw NaN/inf/subnormal elements in the plain formats. */
        if (t->block_elems == 1 && test_rand_range(0, 1)) {
            const int64_t e = test_rand_range(0, dim - 1);
            if (t->type == BN_QTYPE_F32) {
                const float v = special_value();
                memcpy(dst + 4 * e, &v, 4);
            } else {
                static const uint16_t halves[] = {0x7c00, 0xfc00, 0x7c01, 0xfe00, 0x0001,
                                                  0x83ff, 0x7fff, 0x8000, 0x7d55};
                const uint16_t h = halves[test_rand_range(0, 8)];
                dst[2 * e] = (uint8_t)(h & 0xff);
                dst[2 * e + 1] = (uint8_t)(h >> 8);
            }
        }
    }
    free(row);
    return table;
}

static void check_embed(const embed_type *t)
{
    const int64_t dim = t->block_elems == 1 ? test_rand_range(1, 700)
                                            : t->block_elems * test_rand_range(1, 12);
    const int64_t n_rows = test_rand_range(1, 300);
    const int64_t row_bytes = dim / t->block_elems * t->block_bytes;
    const int64_t n = test_rand_range(1, 50), ldy = dim + test_rand_range(0, 4);
    uint8_t *table = random_table(t, n_rows, dim, row_bytes);
    int32_t *ids = malloc(sizeof(int32_t) * (size_t)n);
    for (int64_t i = 0; i < n; i++)
        ids[i] = (int32_t)test_rand_range(0, n_rows - 1);
    const int64_t bad_at = n > 2 ? test_rand_range(0, n - 1) : -1;
    if (bad_at >= 0)
        ids[bad_at] = test_rand_range(0, 1) ? -1 : (int32_t)n_rows;

    uint8_t *d_table = dev_upload(table, (size_t)(n_rows * row_bytes));
    int32_t *d_ids = dev_upload(ids, sizeof(int32_t) * (size_t)n);
    float *d_y = dev_poisoned(sizeof(float) * (size_t)(n * ldy), POISON_BYTE);
    float *d_all = dev_poisoned(sizeof(float) * (size_t)(n_rows * dim), POISON_BYTE);
    CUDA_OK(bn_cuda_embed_rows(d_table, t->type, n_rows, dim, d_ids, n, d_y, ldy, 0));
    CUDA_OK(bn_cuda_embed_rows(d_table, t->type, n_rows, dim, NULL, n_rows, d_all, dim, 0));
    float *y = host_download(d_y, sizeof(float) * (size_t)(n * ldy));
    float *all = host_download(d_all, sizeof(float) * (size_t)(n_rows * dim));

    /* Plain conversions keep NaN payloads; arithmetic NaNs only match as NaN. */
    const bool exact_nan = t->block_elems == 1;
    float *ref = malloc(sizeof(float) * (size_t)dim);
    int64_t differ = 0, gap_written = 0;
    for (int64_t i = 0; i < n; i++) {
        const float *yr = y + i * ldy;
        if (i == bad_at) {
            for (int64_t e = 0; e < dim; e++)
                differ += bits_of(yr[e]) != 0x7fc00000u;
        } else {
            t->dequantize_row(table + ids[i] * row_bytes, ref, dim);
            for (int64_t e = 0; e < dim; e++)
                differ += exact_nan ? !same_bits(yr[e], ref[e]) : !same_value(yr[e], ref[e]);
        }
        for (int64_t e = dim; e < ldy; e++)
            gap_written += bits_of(yr[e]) != 0xffffffffu;
    }
    for (int64_t r = 0; r < n_rows; r++) {
        t->dequantize_row(table + r * row_bytes, ref, dim);
        for (int64_t e = 0; e < dim; e++) {
            const float g = all[r * dim + e];
            differ += exact_nan ? !same_bits(g, ref[e]) : !same_value(g, ref[e]);
        }
    }
    CHECK_MSG(differ == 0 && gap_written == 0,
              "embed type %d dim=%lld rows=%lld: %lld values differ, %lld gap values written",
              (int)t->type, (long long)dim, (long long)n_rows, (long long)differ,
              (long long)gap_written);
    CUDA_OK(cudaFree(d_table));
    CUDA_OK(cudaFree(d_ids));
    CUDA_OK(cudaFree(d_y));
    CUDA_OK(cudaFree(d_all));
    free(table);
    free(ids);
    free(y);
    free(all);
    free(ref);
}

/* ---- the read-only kernel of the benchmark's floor --------------------------------- */

/* Every 32-bit word of the buffer is folded into the sink by XOR, so the
 * XOR of the sink's words is the XOR of the buffer's: a check that each
 * 16-byte chunk was read exactly once (a chunk read twice or skipped
 * changes it unless its words XOR to zero; random data makes that
 * unlikely). */
static void check_read_stream(size_t bytes, int blocks, int pdl)
{
    uint32_t *host = malloc(bytes);
    uint32_t want = 0;
    for (size_t i = 0; i < bytes / 4; i++) {
        host[i] = (uint32_t)test_rand_range(0, 0x7fffffff) * 2654435761u + (uint32_t)i;
        want ^= host[i];
    }
    void *d_buf = dev_upload(host, bytes);
    uint32_t *d_sink = dev_alloc(BN_READ_STREAM_SINK_WORDS * sizeof(uint32_t));
    CUDA_OK(cudaMemset(d_sink, 0, BN_READ_STREAM_SINK_WORDS * sizeof(uint32_t)));
    CUDA_OK(bn_cuda_read_stream(d_buf, bytes, blocks, pdl, d_sink, 0));
    uint32_t *sink = host_download(d_sink, BN_READ_STREAM_SINK_WORDS * sizeof(uint32_t));
    uint32_t got = 0;
    for (int i = 0; i < BN_READ_STREAM_SINK_WORDS; i++)
        got ^= sink[i];
    CHECK_MSG(got == want, "read_stream %zu bytes, %d blocks, pdl %d: fold %08x, want %08x",
              bytes, blocks, pdl, got, want);
    CUDA_OK(cudaFree(d_buf));
    CUDA_OK(cudaFree(d_sink));
    free(host);
    free(sink);
}

/* ---- argument checks ------------------------------------------------------------ */

static void check_invalid_arguments(void)
{
    bn_rope_freqs f;
    CHECK(bn_rope_freqs_init(&f, 10000.0f, 7) == cudaErrorInvalidValue);
    CHECK(bn_rope_freqs_init(&f, 10000.0f, BN_ROPE_MAX_DIM + 2) == cudaErrorInvalidValue);
    CHECK(bn_rope_freqs_init(&f, 0.0f, 64) == cudaErrorInvalidValue);
    CHECK(bn_rope_freqs_init(&f, 10000.0f, 128) == cudaSuccess);
    float *d = dev_alloc(4096);
    int32_t *d_pos = dev_alloc(64);
    /* rope_dim 128 > head_dim 64 */
    CHECK(bn_cuda_rope_neox(d, 64, 1, NULL, 0, 0, 1, 64, d_pos, &f, 0) == cudaErrorInvalidValue);
    CHECK(bn_cuda_rmsnorm_rows(d, 1, 10, 5, d, 1e-5f, d, 10, 0) == cudaErrorInvalidValue);
    CHECK(bn_cuda_embed_rows(d, BN_QTYPE_Q8_0, 1, 33, NULL, 1, d, 33, 0) ==
          cudaErrorInvalidValue);
    CHECK(bn_cuda_embed_rows(d, BN_QTYPE_I2_S, 1, 128, NULL, 1, d, 128, 0) ==
          cudaErrorInvalidValue);
    CHECK(bn_cuda_store_rows(d, 1, 4, 4, BN_QTYPE_Q8_0, d, 4, NULL, 0) == cudaErrorInvalidValue);
    CHECK(bn_cuda_read_stream(d, 4008, 1, 0, (uint32_t *)d, 0) == cudaErrorInvalidValue);
    CHECK(bn_cuda_read_stream(d, 4096, 0, 0, (uint32_t *)d, 0) == cudaErrorInvalidValue);
    /* Nothing to do is not an error. */
    CHECK(bn_cuda_rmsnorm_rows(d, 0, 10, 10, d, 1e-5f, d, 10, 0) == cudaSuccess);
    CHECK(bn_cuda_add_rows(d, 4, d, 4, 0, 4, 0) == cudaSuccess);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(d));
    CUDA_OK(cudaFree(d_pos));
}

int main(void)
{
    const int major = test_require_cuda(8, "this build's kernels").major;

    check_invalid_arguments();
    for (int iter = 0; iter < 30; iter++)
        check_rmsnorm(test_rand_range(1, 9), ragged_k(), iter % 3 == 0);
    check_rmsnorm(70, 2560, true); /* a prefill batch */
    for (int iter = 0; iter < 20; iter++)
        check_relu2(test_rand_range(1, 6), ragged_k());
    check_relu2(33, 6912);
    for (int iter = 0; iter < 10; iter++)
        check_add(test_rand_range(1, 70000 / 100), test_rand_range(1, 3000));
    check_add(70000, 3); /* more rows than one grid dimension holds */
    for (int iter = 0; iter < 30; iter++) {
        static const bn_qtype types[] = {BN_QTYPE_F32, BN_QTYPE_F16, BN_QTYPE_BF16};
        check_store(types[iter % 3], test_rand_range(1, 40), test_rand_range(1, 1000));
    }
    for (int iter = 0; iter < 25; iter++)
        check_rope();
    {
        /* Sizes around the 4-load groups of a grid's stride, one to many
         * blocks, and PDL where this build and device have it. */
        const int pdl = bn_cuda_read_stream_pdl_compiled() && major >= 9;
        for (int iter = 0; iter < 12; iter++)
            check_read_stream(16 * (size_t)test_rand_range(1, 200000), test_rand_range(1, 300),
                              iter % 2 ? pdl : 0);
        check_read_stream(16, 1, 0);
        check_read_stream((size_t)16 * 512 * 4 * 3, 3, pdl); /* exactly whole groups */
    }
    for (int iter = 0; iter < 6; iter++)
        for (size_t t = 0; t < sizeof embed_types / sizeof embed_types[0]; t++)
            check_embed(&embed_types[t]);
    printf("largest errors: rmsnorm %.3g (relative), rope %.3g (of |x0| + |x1|)\n", worst_norm,
           worst_rope);
    TEST_EXIT();
}
