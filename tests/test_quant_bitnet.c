/* I2_S, the Hugging Face packed layout and BitNet32-F16, checked against
 * vectors written by hand from the documented bit positions (fmt_bitnet.c),
 * then round trips on random codes and every error path. */
#include "fmt_bitnet.h"
#include "fp16.h"
#include "qtype.h"
#include "test_util.h"

static void test_i2s_vector(void)
{
    /* One 128-element block: e0 = +1, e32 = -1, e64 = 0, e96 = +1, e31 = -1,
     * everything else 0. Byte p = e(p)<<6 | e(p+32)<<4 | e(p+64)<<2 | e(p+96)
     * with codes 0,1,2 for -1,0,+1. */
    int8_t codes[128] = {0};
    codes[0] = 1;
    codes[32] = -1;
    codes[96] = 1;
    codes[31] = -1;
    uint8_t expected[32 + 32];
    memset(expected, 0x55, 32);              /* all four fields code 1 */
    expected[0] = 0x80 | 0x00 | 0x04 | 0x02; /* 2,0,1,2 */
    expected[31] = 0x00 | 0x10 | 0x04 | 0x01; /* 0,1,1,1 */
    memset(expected + 32, 0, 32);
    const float scale = 0.75f;
    memcpy(expected + 32, &scale, 4);

    size_t bytes = 0;
    CHECK(bn_qtype_tensor_size(BN_QTYPE_I2_S, 1, 128, &bytes, NULL) == BN_OK && bytes == 64);
    uint8_t got[64];
    memset(got, 0xee, sizeof got);
    CHECK(bn_pack_i2s(codes, scale, 1, 128, got, NULL) == BN_OK);
    CHECK(memcmp(got, expected, 64) == 0);

    int8_t back[128];
    float s = 0;
    memset(back, 9, sizeof back);
    CHECK(bn_unpack_i2s(expected, 64, 1, 128, back, &s, NULL) == BN_OK);
    CHECK(memcmp(back, codes, 128) == 0 && s == scale);
    /* The trailing padding may be missing; the scale may not. */
    CHECK(bn_unpack_i2s(expected, 36, 1, 128, back, &s, NULL) == BN_OK);
    bn_error e;
    CHECK(bn_unpack_i2s(expected, 35, 1, 128, back, &s, &e) == BN_ERR_FORMAT);
    CHECK_STR_CONTAINS(e.message, "36 bytes");

    /* Code 3 is not ternary. */
    uint8_t corrupt[64];
    memcpy(corrupt, expected, 64);
    corrupt[5] = 0xff;
    CHECK(bn_unpack_i2s(corrupt, 64, 1, 128, back, &s, &e) == BN_ERR_FORMAT);
    CHECK_STR_CONTAINS(e.message, "element 5 ");
    /* A NaN scale is corrupt. */
    memcpy(corrupt, expected, 64);
    const float nan = NAN;
    memcpy(corrupt + 32, &nan, 4);
    CHECK(bn_unpack_i2s(corrupt, 64, 1, 128, back, &s, &e) == BN_ERR_FORMAT);
    /* Rows must be whole blocks. */
    CHECK(bn_qtype_tensor_size(BN_QTYPE_I2_S, 2, 64, &bytes, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "128");
    /* Packing refuses non-ternary codes. */
    codes[3] = 2;
    CHECK(bn_pack_i2s(codes, scale, 1, 128, got, &e) == BN_ERR_INVALID_ARGUMENT);

    /* Unpack through the registry, as the model loader does. */
    float via_scale = 0.0f;
    memset(back, 9, sizeof back);
    CHECK(bn_qtype_get(BN_QTYPE_I2_S)->unpack(expected, 64, 1, 128, back, &via_scale, NULL) ==
          BN_OK);
    CHECK(via_scale == scale && back[0] == 1 && back[32] == -1 && back[64] == 0 && back[31] == -1);
}

static void test_hf_vector(void)
{
    /* 8 rows x 3 cols, R = 2 packed rows: packed[i][c] holds rows i, i+2,
     * i+4, i+6 at bits 0, 2, 4, 6. */
    int8_t codes[8 * 3];
    for (int r = 0; r < 8; r++)
        for (int c = 0; c < 3; c++)
            codes[r * 3 + c] = (int8_t)((r + c) % 3 - 1); /* -1, 0, +1 pattern */
    uint8_t expected[2 * 3];
    for (int i = 0; i < 2; i++)
        for (int c = 0; c < 3; c++) {
            uint8_t v = 0;
            for (int j = 0; j < 4; j++)
                v |= (uint8_t)(((i + 2 * j + c) % 3) << (2 * j)); /* code = value + 1 */
            expected[i * 3 + c] = v;
        }
    /* Row 0 col 0: rows 0,2,4,6 -> values -1,+1,0,-1 -> codes 0,2,1,0 */
    CHECK(expected[0] == (0 | 2 << 2 | 1 << 4 | 0 << 6));
    size_t hf_bytes = 0;
    CHECK(bn_qtype_tensor_size(BN_QTYPE_HF_PACKED, 8, 3, &hf_bytes, NULL) == BN_OK &&
          hf_bytes == 6);
    uint8_t got[6];
    memset(got, 0xee, sizeof got);
    CHECK(bn_pack_hf_packed(codes, 1.0f, 8, 3, got, NULL) == BN_OK);
    CHECK(memcmp(got, expected, 6) == 0);
    int8_t back[24];
    float s = 0;
    CHECK(bn_unpack_hf_packed(expected, 6, 8, 3, back, &s, NULL) == BN_OK);
    CHECK(memcmp(back, codes, 24) == 0 && s == 1.0f);
    bn_error e;
    CHECK(bn_unpack_hf_packed(expected, 5, 8, 3, back, &s, &e) == BN_ERR_FORMAT);
    CHECK(bn_unpack_hf_packed(expected, 6, 6, 3, back, &s, &e) == BN_ERR_INVALID_ARGUMENT);
    uint8_t bad[6];
    memcpy(bad, expected, 6);
    bad[2] = 0x03;
    CHECK(bn_unpack_hf_packed(bad, 6, 8, 3, back, &s, &e) == BN_ERR_FORMAT);
}

static void test_bitnet32_vector(void)
{
    /* Elements 0..3 = -1, 0, +1, 0 -> codes 1, 2, 3, 2 -> byte 0 = 0xB9; the
     * other 28 elements are 0 -> code 2 -> 0xAA. Then fp16 scale. */
    int8_t codes[32] = {-1, 0, 1, 0};
    uint8_t got[10];
    memset(got, 0xee, sizeof got);
    CHECK(bn_pack_bitnet32(codes, 0.5f, 1, 32, got, NULL) == BN_OK);
    CHECK(got[0] == 0xB9);
    int ok = 1;
    for (int i = 1; i < 8; i++)
        ok &= got[i] == 0xAA;
    CHECK(ok);
    CHECK(got[8] == 0x00 && got[9] == 0x38); /* fp16 0.5 = 0x3800 */
    float out[32];
    bn_dequantize_row_bitnet32(got, out, 32);
    CHECK(out[0] == -0.5f && out[1] == 0.0f && out[2] == 0.5f && out[31] == 0.0f);

    /* quantize_row from floats: absmax per block, ternary rounding. */
    float x[32] = {0};
    x[0] = -2.0f;
    x[1] = 0.9f;  /* 0.45 -> 0 */
    x[2] = 1.1f;  /* 0.55 -> 1 */
    uint8_t q[10];
    bn_quantize_row_bitnet32(x, q, 32);
    CHECK(q[0] == (1 | 2 << 2 | 3 << 4 | 2 << 6));
    CHECK(bn_fp16_to_fp32((uint16_t)(q[8] | q[9] << 8)) == 2.0f);

    /* Unpack needs one common scale across non-zero blocks. */
    uint8_t two[20];
    int8_t codes2[64] = {1};
    codes2[40] = -1;
    CHECK(bn_pack_bitnet32(codes2, 0.25f, 1, 64, two, NULL) == BN_OK);
    int8_t back[64];
    float s;
    CHECK(bn_unpack_bitnet32(two, 20, 1, 64, back, &s, NULL) == BN_OK);
    CHECK(memcmp(back, codes2, 64) == 0 && s == 0.25f);
    two[18] ^= 0x01; /* change the second block's scale */
    bn_error e;
    CHECK(bn_unpack_bitnet32(two, 20, 1, 64, back, &s, &e) == BN_ERR_UNSUPPORTED);
    CHECK(bn_unpack_bitnet32(two, 19, 1, 64, back, &s, &e) == BN_ERR_FORMAT);
    two[0] = 0; /* code 0 (-2) is not ternary */
    CHECK(bn_unpack_bitnet32(two, 20, 1, 64, back, &s, &e) == BN_ERR_FORMAT);
}

/* Random round trips through every ternary format with a packer. */
static void test_round_trips(void)
{
    static const bn_qtype ternary[] = {BN_QTYPE_TQ1_0, BN_QTYPE_TQ2_0, BN_QTYPE_I2_S,
                                       BN_QTYPE_TL1,   BN_QTYPE_TL2,   BN_QTYPE_HF_PACKED,
                                       BN_QTYPE_BITNET32_F16};
    for (size_t i = 0; i < sizeof ternary / sizeof ternary[0]; i++) {
        const bn_qtype_info *q = bn_qtype_get(ternary[i]);
        if (!q->ternary || !q->pack)
            continue;
        int tried = 0;
        for (int iter = 0; iter < 40 && tried < 8; iter++) {
            /* Multiples of 32 too: the TL tilings need whole 32-row tiles. */
            int64_t rows = (test_rand_u64() & 1) ? 32 * test_rand_range(1, 4) : 4 * test_rand_range(1, 12);
            int64_t cols = test_rand_range(1, 12) * 128;
            size_t bytes;
            if (bn_qtype_tensor_size(q->type, rows, cols, &bytes, NULL) != BN_OK)
                continue; /* a shape this format does not take */
            tried++;
            const size_t n = (size_t)(rows * cols);
            int8_t *codes = malloc(n), *back = malloc(n);
            uint8_t *packed = malloc(bytes);
            for (size_t j = 0; j < n; j++)
                codes[j] = (int8_t)test_rand_range(-1, 1);
            const float scale = test_rand_float(0.01f, 2.0f);
            memset(packed, 0xcd, bytes);
            memset(back, 7, n);
            bool ok = q->pack(codes, scale, rows, cols, packed, NULL) == BN_OK;
            float s = -1;
            ok = ok && q->unpack(packed, bytes, rows, cols, back, &s, NULL) == BN_OK;
            ok = ok && memcmp(back, codes, n) == 0;
            CHECK_MSG(ok, "%s round trip %lld x %lld", q->name, (long long)rows, (long long)cols);
            free(codes);
            free(back);
            free(packed);
        }
        CHECK_MSG(tried > 0, "%s: no shape tried", q->name);
    }
}

int main(void)
{
    test_seed_init();
    test_i2s_vector();
    test_hf_vector();
    test_bitnet32_vector();
    test_round_trips();
    TEST_EXIT();
}
