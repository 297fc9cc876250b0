/*
 * fmt_tl.c - Microsoft bitnet.cpp's TL1 and TL2 ternary weight encodings,
 * read and written exactly as bitnet.cpp's converter lays them out.
 *
 * ==========================================================================
 * Facts established from the sources (microsoft/BitNet and its llama.cpp
 * fork, Eddie-Wang1120/llama.cpp, as vendored in 3rdparty/llama.cpp)
 * ==========================================================================
 *
 * Type ids and sizes
 *   - ggml type ids: I2_S 36, I8_S 37, TL1 38, TL2 39 (fork's ggml.h enum
 *     ggml_type; gguf-py/gguf/constants.py GGMLQuantizationType).
 *   - ggml.c type_traits: TL1 and TL2 both have blck_size 1, type_size 1.
 *     ggml.c ggml_nbytes(): TL1 = ne0*ne1/4 + 32; TL2 =
 *     (ne0-256)*ne1/3*5/8 + 256*ne1/2*4/8, rounded up to a multiple of 32,
 *     + 32. The "+ 32" (and the rounding) is not tensor data: see "Scale".
 *   - GGUF shape: ne = {K, N} (ne[0] = input features): the kernels' setup
 *     code reads k = ne[0], m = ne[1] (codegen_tl1.py gen_transform_code,
 *     utils/templates/tl2_gen_transform.h) and matches (m, k) against the
 *     kernel configs below.
 *
 * What the converter writes (utils/convert-hf-to-gguf-bitnet.py)
 *   - write_tensors() (LlamaModel and BitnetModel): every 2-D ".weight" that
 *     is not an embedding or a norm (LlamaModel also skips lm_head) goes
 *     through transform_to_tl1() / transform_to_tl2(), which return the
 *     packed bytes and scale = max|W|. The bytes are added with
 *     raw_shape = (N, K), raw_dtype TL1/TL2; then the scale is added as its
 *     own F32 tensor named "<name>_scale" (e.g. "blk.0.attn_q.weight_scale").
 *   - BitnetModel.weight_quant() has already turned W into
 *     {-1, 0, +1} * mean|W| (absmean), so the scale is that multiplier:
 *     W = code * scale. (LlamaModel's path divides packed HF codes by
 *     weight_scale first, so again W = code * scale.)
 *   - preprocess_weights_tl1/tl2(): codes are sign(W), with |W| < 1e-6
 *     counted as 0.
 *
 * Scale
 *   - The tensor data holds codes only. The kernels find the scale by
 *     reading past the end of the data: TL1 at byte K*N/4
 *     (codegen_tl1.py gen_transform_code), TL2 at the TL2 size formula
 *     rounded up to 32 (tl2_gen_transform.h) - which is where the GGUF
 *     writer put the following "<name>_scale" tensor (32-byte alignment).
 *     So, like the HF packed format: unpack returns scale 1.0f, pack ignores
 *     the scale, and the loader multiplies by the "_scale" tensor.
 *
 * Tiling (BM, BK, bm) - not recorded in the file
 *   - preprocess_weights_tl1/tl2() look the matrix up by (m = N, k = K) in
 *     include/kernel_config.ini (sections [Kernels_i] with keys m, k, bm, bk,
 *     bmm; first match wins) and raise NotImplementedError when none
 *     matches. BM = bm, BK = bk, bm = bmm; the compute tile is by = 256/bm
 *     columns wide for TL1 and by = 192/bm for TL2.
 *   - codegen_tl1.py (__main__) asserts M % BM == 0, K % BK == 0,
 *     bm in {32, 64}; codegen_tl2.py asserts M % BM == 0,
 *     (K % BK) % 32 == 0, bm == 32. src/README.md ("Codegen for TL1 and
 *     TL2") adds BM % bm == 0.
 *   - setup_env.py gen_code() runs codegen with, per model (N x K: BM/BK/bm):
 *       TL1 bitnet_b1_58-large   1536x4096 256/128/32  1536x1536 128/64/64
 *                                4096x1536 256/128/32
 *       TL1 Llama3-8B (+Falcon3) 14336x4096 256/128/32 4096x14336 128/64/64
 *                                1024x4096 256/128/32  4096x4096 128/64/64
 *       TL1 bitnet_b1_58-3B      3200x8640 160/64/32   3200x3200 320/128/64
 *                                8640x3200 320/64/32
 *       TL2 large                1536x4096 256/96/32   1536x1536 128/192/32
 *                                4096x1536 256/96/32
 *       TL2 Llama3-8B            14336x4096 256/96/32  4096x14336 128/96/32
 *                                1024x4096 256/96/32   4096x4096 128/96/32
 *       TL2 3B                   3200x8640 160/96/32   3200x3200 320/96/32
 *                                8640x3200 320/96/32
 *     These are the entries of known_tilings[] below.
 *   - BitNet-b1.58-2B-4T: setup_env.py passes the *3B* shapes to codegen for
 *     this model, so kernel_config.ini holds no 2B-4T shape and the
 *     converter raises NotImplementedError (it also does not register the
 *     BitNetForCausalLM architecture; microsoft/BitNet issues #300, #324,
 *     and #239 where a maintainer says the TL parameters were not tuned for
 *     it). bitnet.cpp therefore ships NO TL1/TL2 tiling for the 2B-4T shapes
 *     (2560x2560, 640x2560, 6912x2560, 2560x6912); any such file was made
 *     with a hand-written kernel_config.ini. We fall back on our own rule
 *     (derive_tiling) and offer bn_tl_tiling_from_ini() for the real one.
 *   - preset_kernels/<model>/kernel_config_tl{1,2}.ini do not always agree
 *     with setup_env.py (Llama3-8B TL1 differs; large TL2's third kernel has
 *     bmm = 64, which the TL2 converter cannot process). We follow
 *     setup_env.py, the path that produces files.
 *
 * ==========================================================================
 * TL1 layout (process_tl1 / preprocess_weights_tl1)
 * ==========================================================================
 * Each pair of neighbouring weights in a row, (w[r][2j], w[r][2j+1]), becomes
 * one 4-bit index 3*w0 + w1 + 4 (0..8: a 9-entry table). Two indices share a
 * byte, the lower-numbered pair in the high nibble. Bytes are ordered by a
 * tile hierarchy, outermost first (by = 256/bm, 8 or 4 weights):
 *
 *   for each BM-row block          (N/BM)
 *    for each BK-column block      (K/BK)
 *     for each bm-row tile         (BM/bm)
 *      for each by-column tile     (BK/by)
 *       for each 16-row group      (bm/16)
 *        for each 4 columns        (by/4)  = pairs p, p+1
 *         for each of the 16 rows: one byte  [ idx(p) << 4 | idx(p+1) ]
 *
 *   e.g. bm = 32, by = 8: one compute tile = 32 rows x 8 cols = 64 bytes
 *        cols  0-3    4-7
 *        rows 0-15  [16 B] [16 B]      bytes  0..15, 16..31
 *        rows 16-31 [16 B] [16 B]      bytes 32..47, 48..63
 *
 * Size: exactly N*K/4 bytes, no padding.
 *
 * ==========================================================================
 * TL2 layout (preprocess_weights_tl2 and its two helpers)
 * ==========================================================================
 * K is split into K3 = K - K % BK columns coded in triples and a tail of
 * K2 = K % BK columns coded like TL1 pairs (K2 must be a multiple of 32).
 * The tensor is three consecutive areas, then zero padding:
 *
 *   [ magnitudes: N*K3/6 ][ signs: N*K3/24 ][ tail: N*K2/4 ][ zeros ]
 *
 * A triple (w0, w1, w2) of neighbouring weights has value t = 9*w0 + 3*w1 +
 * w2 in -13..13; the magnitudes area stores |t| (4 bits), the signs area one
 * bit, set when t < 0. Every area is made of 32-byte tiles that cover 32
 * rows; inside a tile, byte position g*8 + e (g = 0..3) belongs to row
 * ROW_GROUP_ORDER[g]*8 + e with ROW_GROUP_ORDER = {0, 2, 1, 3} (so that
 * AVX2's per-lane unpack sees rows 0-15 then 16-31):
 *
 *   tile bytes:  0-7   8-15   16-23  24-31
 *   rows:        0-7   16-23  8-15   24-31
 *
 * Magnitudes, tile order (bm = 32, by = 6 weights = 2 triples per tile):
 *   for each BM-row block, each BK-column block (of K3), each 32-row tile,
 *   each pair of triples (t, t+1): 32 bytes [ |t| << 4 | |t+1| ].
 * Signs, same order but 8 triples (24 weights) per tile: the 32 bytes are 16
 *   little-endian uint16 words; the sign of triple q (0..7) of row s (0..31)
 *   is bit 15 - (2*q + s/16) of word s % 16. (Plain row order: no regroup.)
 * Tail (preprocess_two_weights_tl2 with BK = 32, bm = 32, by = 4): pair
 *   indices 3*w0 + w1 + 4 as in TL1, tiles ordered by BM-row block, 32-column
 *   block, 32-row tile, pair of pairs (p, p+1): 32 regrouped bytes
 *   [ idx(p) << 4 | idx(p+1) ].
 *
 * Size: the converter pads with zeros to (K-256)*N/3*5/8 + 256*N/2*4/8 (the
 * formula assumes a tail of at most 256 columns; with a longer tail the
 * converter fails, so we reject it). The kernels decode a set sign bit on a
 * zero magnitude as 0, and so do we.
 */
#include "fmt_tl.h"

#include <ctype.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* Largest tensor we accept: the same bound as bn_qtype_tensor_size. */
#define MAX_ELEMENTS (INT64_C(1) << 40)

enum {
    PAIR_INDEX_MAX = 8,       /* 3*w0 + w1 + 4 for w in {-1,0,1}        */
    TRIPLE_MAGNITUDE_MAX = 13, /* |9*w0 + 3*w1 + w2|                    */
    TL1_TILE_WEIGHTS = 256,   /* bm * by for TL1                         */
    TL2_TILE_ROWS = 32,       /* the only bm TL2 supports                */
    TL2_TILE_BYTES = 32,      /* every TL2 tile is 32 bytes              */
    TL2_TRIPLES_PER_MAG_TILE = 2,
    TL2_TRIPLES_PER_SIGN_TILE = 8,
    TL2_TAIL_BLOCK_COLS = 32, /* the tail's own BK                       */
    TL2_MAX_TAIL_COLS = 256,  /* what the converter's size formula allows */
    TL2_MIN_COLS = 256,       /* the size formula subtracts 256          */
};

/* Position group g of a 32-byte TL2 tile holds row group ROW_GROUP_ORDER[g]
 * (the map is its own inverse). */
static const int ROW_GROUP_ORDER[4] = {0, 2, 1, 3};

static int tile_row(int position) { return ROW_GROUP_ORDER[position / 8] * 8 + position % 8; }

static const char *tl_name(bn_qtype type) { return type == BN_QTYPE_TL1 ? "TL1" : "TL2"; }

/* ---- the converter's code tables --------------------------------------- */

static int pair_index(int8_t w0, int8_t w1) { return 3 * w0 + w1 + 4; }

static void pair_decode(int index, int8_t *w0, int8_t *w1)
{
    *w0 = (int8_t)(index / 3 - 1);
    *w1 = (int8_t)(index % 3 - 1);
}

static int triple_value(int8_t w0, int8_t w1, int8_t w2) { return 9 * w0 + 3 * w1 + w2; }

/* Writes the weights of a non-negative triple value (0..13). */
static void triple_decode(int magnitude, int8_t *w)
{
    const int shifted = magnitude + TRIPLE_MAGNITUDE_MAX; /* 9*(w0+1)+3*(w1+1)+(w2+1) */
    w[0] = (int8_t)(shifted / 9 - 1);
    w[1] = (int8_t)(shifted / 3 % 3 - 1);
    w[2] = (int8_t)(shifted % 3 - 1);
}

/* ---- shapes and tilings ------------------------------------------------- */

static bn_status check_shape(bn_qtype type, int64_t rows, int64_t cols, bn_error *err)
{
    if (type != BN_QTYPE_TL1 && type != BN_QTYPE_TL2)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "type %d is not TL1 (38) or TL2 (39)", (int)type);
    if (rows <= 0 || cols <= 0 || rows > MAX_ELEMENTS / cols)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "%s tensor shape %lld x %lld is empty or too large", tl_name(type),
                            (long long)rows, (long long)cols);
    if (type == BN_QTYPE_TL2 && cols < TL2_MIN_COLS)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, "use I2_S or TQ2_0 for such narrow matrices",
                            "TL2 tensor %lld x %lld: bitnet.cpp's TL2 size formula needs at "
                            "least %d columns",
                            (long long)rows, (long long)cols, TL2_MIN_COLS);
    return BN_OK;
}

static size_t tl2_data_bytes(int64_t rows, int64_t cols, const bn_tl_tiling *t)
{
    const int64_t tail_cols = cols % t->block_cols;
    const int64_t triple_cols = cols - tail_cols;
    return (size_t)(rows * triple_cols / 6 + rows * triple_cols / 24 + rows * tail_cols / 4);
}

bn_status bn_tl_tiling_check(bn_qtype type, int64_t rows, int64_t cols,
                             const bn_tl_tiling *t, bn_error *err)
{
    bn_status st = check_shape(type, rows, cols, err);
    if (st != BN_OK)
        return st;
    if (!t)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "%s tiling is NULL",
                            tl_name(type));
    const char *name = tl_name(type);
    const int BM = t->block_rows, BK = t->block_cols, bm = t->compute_rows;
    if (BM <= 0 || BK <= 0 || bm <= 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "%s tiling BM=%d BK=%d bm=%d: all must be positive", name, BM, BK, bm);
    const char *hint = "the tiling must be the kernel_config.ini entry the file was converted with";
    if (type == BN_QTYPE_TL1) {
        if (bm != 32 && bm != 64)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, hint,
                                "TL1 compute tile rows (bmm) must be 32 or 64; got %d", bm);
        const int by = TL1_TILE_WEIGHTS / bm;
        if (BK % by != 0)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, hint,
                                "TL1 block columns BK=%d must be a multiple of the %d-column "
                                "compute tile (256/bmm)",
                                BK, by);
    } else {
        if (bm != TL2_TILE_ROWS)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, hint,
                                "TL2 compute tile rows (bmm) must be 32; got %d", bm);
        if (BK % (3 * TL2_TRIPLES_PER_SIGN_TILE) != 0)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, hint,
                                "TL2 block columns BK=%d must be a multiple of 24 (8 triples per "
                                "sign tile)",
                                BK);
    }
    if (BM % bm != 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, hint,
                            "%s block rows BM=%d must be a multiple of bmm=%d", name, BM, bm);
    if (rows % BM != 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, hint,
                            "%s tensor %lld x %lld: rows must be a multiple of BM=%d", name,
                            (long long)rows, (long long)cols, BM);
    if (type == BN_QTYPE_TL1) {
        if (cols % BK != 0)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, hint,
                                "TL1 tensor %lld x %lld: columns must be a multiple of BK=%d",
                                (long long)rows, (long long)cols, BK);
        return BN_OK;
    }
    const int64_t tail_cols = cols % BK;
    if (tail_cols % TL2_TAIL_BLOCK_COLS != 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, hint,
                            "TL2 tensor %lld x %lld: columns %% BK=%d leaves %lld, which must be "
                            "a multiple of 32",
                            (long long)rows, (long long)cols, BK, (long long)tail_cols);
    if (tail_cols > TL2_MAX_TAIL_COLS ||
        tl2_data_bytes(rows, cols, t) > bn_tl2_tensor_bytes(rows, cols))
        return bn_error_set(err, BN_ERR_UNSUPPORTED, NULL,
                            "TL2 tensor %lld x %lld with BK=%d: a %lld-column tail does not fit "
                            "bitnet.cpp's size formula (at most 256)",
                            (long long)rows, (long long)cols, BK, (long long)tail_cols);
    return BN_OK;
}

typedef struct known_tiling {
    bn_qtype type;
    int64_t rows, cols;
    bn_tl_tiling tiling;
} known_tiling;

/* setup_env.py gen_code()'s codegen arguments (see the top of this file). */
static const known_tiling known_tilings[] = {
    /* bitnet_b1_58-large */
    {BN_QTYPE_TL1, 1536, 4096, {256, 128, 32}},
    {BN_QTYPE_TL1, 1536, 1536, {128, 64, 64}},
    {BN_QTYPE_TL1, 4096, 1536, {256, 128, 32}},
    {BN_QTYPE_TL2, 1536, 4096, {256, 96, 32}},
    {BN_QTYPE_TL2, 1536, 1536, {128, 192, 32}},
    {BN_QTYPE_TL2, 4096, 1536, {256, 96, 32}},
    /* Llama3-8B-1.58-100B-tokens (also used for the Falcon3 models) */
    {BN_QTYPE_TL1, 14336, 4096, {256, 128, 32}},
    {BN_QTYPE_TL1, 4096, 14336, {128, 64, 64}},
    {BN_QTYPE_TL1, 1024, 4096, {256, 128, 32}},
    {BN_QTYPE_TL1, 4096, 4096, {128, 64, 64}},
    {BN_QTYPE_TL2, 14336, 4096, {256, 96, 32}},
    {BN_QTYPE_TL2, 4096, 14336, {128, 96, 32}},
    {BN_QTYPE_TL2, 1024, 4096, {256, 96, 32}},
    {BN_QTYPE_TL2, 4096, 4096, {128, 96, 32}},
    /* bitnet_b1_58-3B */
    {BN_QTYPE_TL1, 3200, 8640, {160, 64, 32}},
    {BN_QTYPE_TL1, 3200, 3200, {320, 128, 64}},
    {BN_QTYPE_TL1, 8640, 3200, {320, 64, 32}},
    {BN_QTYPE_TL2, 3200, 8640, {160, 96, 32}},
    {BN_QTYPE_TL2, 3200, 3200, {320, 96, 32}},
    {BN_QTYPE_TL2, 8640, 3200, {320, 96, 32}},
};

/* Our rule for shapes bitnet.cpp has no setting for (BitNet-b1.58-2B-4T among
 * them), in the style of its own choices: 32-row compute tiles; the largest
 * of 256/128/64/32 rows per block that divides N; TL1 blocks of 128 columns
 * (64 if 128 does not divide K), TL2 blocks of 96 columns (every bitnet.cpp
 * TL2 setting but one uses 96). For 2B-4T this gives BM 256 (128 for 640
 * rows) with BK 128 (TL1) or 96 (TL2). */
static bool derive_tiling(bn_qtype type, int64_t rows, int64_t cols, bn_tl_tiling *out)
{
    static const int block_rows[] = {256, 128, 64, 32};
    static const int tl1_block_cols[] = {128, 64};
    for (size_t i = 0; i < sizeof block_rows / sizeof block_rows[0]; i++) {
        if (rows % block_rows[i] != 0)
            continue;
        bn_tl_tiling t = {block_rows[i], 96, 32};
        if (type == BN_QTYPE_TL1) {
            for (size_t j = 0; j < sizeof tl1_block_cols / sizeof tl1_block_cols[0]; j++) {
                t.block_cols = tl1_block_cols[j];
                if (bn_tl_tiling_check(type, rows, cols, &t, NULL) == BN_OK) {
                    *out = t;
                    return true;
                }
            }
            return false;
        }
        if (bn_tl_tiling_check(type, rows, cols, &t, NULL) == BN_OK) {
            *out = t;
            return true;
        }
        return false;
    }
    return false;
}

bn_status bn_tl_tiling_for_shape(bn_qtype type, int64_t rows, int64_t cols,
                                 bn_tl_tiling *tiling, bn_error *err)
{
    bn_status st = check_shape(type, rows, cols, err);
    if (st != BN_OK)
        return st;
    if (!tiling)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "%s tiling output is NULL",
                            tl_name(type));
    for (size_t i = 0; i < sizeof known_tilings / sizeof known_tilings[0]; i++) {
        const known_tiling *k = &known_tilings[i];
        if (k->type == type && k->rows == rows && k->cols == cols) {
            *tiling = k->tiling;
            return BN_OK;
        }
    }
    if (derive_tiling(type, rows, cols, tiling))
        return BN_OK;
    const char *hint = "pass the kernel_config.ini the file was converted with";
    if (type == BN_QTYPE_TL1)
        return bn_error_set(err, BN_ERR_UNSUPPORTED, hint,
                            "TL1 tensor %lld x %lld: bitnet.cpp has no kernel config for this "
                            "shape, and the default rule needs rows a multiple of 32 and columns "
                            "a multiple of 64",
                            (long long)rows, (long long)cols);
    return bn_error_set(err, BN_ERR_UNSUPPORTED, hint,
                        "TL2 tensor %lld x %lld: bitnet.cpp has no kernel config for this shape, "
                        "and the default rule needs rows a multiple of 32 and columns %% 96 a "
                        "multiple of 32",
                        (long long)rows, (long long)cols);
}

/* ---- kernel_config.ini -------------------------------------------------- */

typedef struct ini_section {
    long long m, k, bm, bk, bmm;
    bool has_m, has_k, has_bm, has_bk, has_bmm;
    int line; /* where the section starts, for messages */
} ini_section;

/* ConfigParser's option names are case-insensitive. */
static bool key_is(const char *key, const char *text, size_t len)
{
    if (strlen(key) != len)
        return false;
    for (size_t i = 0; i < len; i++)
        if (tolower((unsigned char)text[i]) != key[i])
            return false;
    return true;
}

static bool parse_ini_int(const char *s, size_t n, long long *out)
{
    char buf[32];
    while (n > 0 && isspace((unsigned char)*s)) {
        s++;
        n--;
    }
    while (n > 0 && isspace((unsigned char)s[n - 1]))
        n--;
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, s, n);
    buf[n] = '\0';
    for (size_t i = (buf[0] == '-' || buf[0] == '+') ? 1 : 0; i < n; i++)
        if (!isdigit((unsigned char)buf[i]))
            return false;
    errno = 0;
    *out = strtoll(buf, NULL, 10);
    return errno == 0;
}

/* Sets *matched when the section is the one for this shape; then also
 * checks its tiling and stores it. */
static bn_status finish_section(bn_qtype type, const ini_section *sec, int64_t rows,
                                int64_t cols, bn_tl_tiling *tiling, bool *matched, bn_error *err)
{
    *matched = false;
    if (!sec->has_m || !sec->has_k || sec->m != rows || sec->k != cols)
        return BN_OK;
    *matched = true;
    if (!sec->has_bm || !sec->has_bk || !sec->has_bmm)
        return bn_error_set(err, BN_ERR_FORMAT, "each section needs m, k, bm, bk and bmm",
                            "kernel_config.ini section at line %d (m = %lld, k = %lld) lacks "
                            "bm, bk or bmm",
                            sec->line, sec->m, sec->k);
    if (sec->bm <= 0 || sec->bm > 65536 || sec->bk <= 0 || sec->bk > 65536 || sec->bmm <= 0 ||
        sec->bmm > 65536)
        return bn_error_set(err, BN_ERR_FORMAT, NULL,
                            "kernel_config.ini section at line %d: bm = %lld, bk = %lld, "
                            "bmm = %lld are out of range",
                            sec->line, sec->bm, sec->bk, sec->bmm);
    bn_tl_tiling t = {(int)sec->bm, (int)sec->bk, (int)sec->bmm};
    bn_status st = bn_tl_tiling_check(type, rows, cols, &t, err);
    if (st == BN_OK)
        *tiling = t;
    return st;
}

bn_status bn_tl_tiling_from_ini(bn_qtype type, const char *ini_text, int64_t rows,
                                int64_t cols, bn_tl_tiling *tiling, bn_error *err)
{
    bn_status st = check_shape(type, rows, cols, err);
    if (st != BN_OK)
        return st;
    if (!ini_text || !tiling)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "kernel_config.ini text or tiling output is NULL");
    ini_section sec = {0};
    bool in_section = false, matched = false;
    int line_no = 0;
    const char *p = ini_text;
    while (*p) {
        const char *end = strchr(p, '\n');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *line = p;
        p = end ? end + 1 : p + len;
        line_no++;
        while (len > 0 && isspace((unsigned char)*line)) {
            line++;
            len--;
        }
        while (len > 0 && isspace((unsigned char)line[len - 1]))
            len--;
        if (len == 0 || line[0] == '#' || line[0] == ';')
            continue;
        if (line[0] == '[') {
            if (in_section) {
                st = finish_section(type, &sec, rows, cols, tiling, &matched, err);
                if (st != BN_OK || matched)
                    return st;
            }
            memset(&sec, 0, sizeof sec);
            sec.line = line_no;
            in_section = true;
            continue;
        }
        /* key = value (ConfigParser also accepts ':'); keys are case-blind */
        size_t key_len = 0;
        while (key_len < len && line[key_len] != '=' && line[key_len] != ':')
            key_len++;
        if (!in_section || key_len == len)
            return bn_error_set(err, BN_ERR_FORMAT, NULL,
                                "kernel_config.ini line %d is not '[section]' or 'key = value' "
                                "inside a section",
                                line_no);
        size_t name_len = key_len;
        while (name_len > 0 && isspace((unsigned char)line[name_len - 1]))
            name_len--;
        static const char *const keys[] = {"m", "k", "bm", "bk", "bmm"};
        long long *values[] = {&sec.m, &sec.k, &sec.bm, &sec.bk, &sec.bmm};
        bool *seen[] = {&sec.has_m, &sec.has_k, &sec.has_bm, &sec.has_bk, &sec.has_bmm};
        for (size_t i = 0; i < 5; i++) {
            if (!key_is(keys[i], line, name_len))
                continue;
            if (!parse_ini_int(line + key_len + 1, len - key_len - 1, values[i]))
                return bn_error_set(err, BN_ERR_FORMAT, NULL,
                                    "kernel_config.ini line %d: '%s' needs an integer value",
                                    line_no, keys[i]);
            *seen[i] = true;
        }
    }
    if (in_section) {
        st = finish_section(type, &sec, rows, cols, tiling, &matched, err);
        if (st != BN_OK || matched)
            return st;
    }
    return bn_error_set(err, BN_ERR_UNSUPPORTED,
                        "the converter itself fails on shapes its kernel_config.ini lacks",
                        "kernel_config.ini has no section with m = %lld, k = %lld for this %s "
                        "tensor",
                        (long long)rows, (long long)cols, tl_name(type));
}

/* ---- shared argument checks --------------------------------------------- */

static bn_status check_unpack_args(bn_qtype type, const void *src, size_t src_bytes,
                                   int64_t rows, int64_t cols, const bn_tl_tiling *tiling,
                                   const int8_t *codes, bn_error *err)
{
    bn_status st = bn_tl_tiling_check(type, rows, cols, tiling, err);
    if (st != BN_OK)
        return st;
    if (!src || !codes)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "%s unpack: NULL buffer",
                            tl_name(type));
    const size_t need = type == BN_QTYPE_TL1 ? bn_tl1_tensor_bytes(rows, cols)
                                             : bn_tl2_tensor_bytes(rows, cols);
    if (src_bytes < need)
        return bn_error_set(err, BN_ERR_FORMAT, "the file is truncated or the shape is wrong",
                            "%s tensor %lld x %lld needs %zu bytes, have %zu", tl_name(type),
                            (long long)rows, (long long)cols, need, src_bytes);
    return BN_OK;
}

static bn_status check_pack_args(bn_qtype type, const int8_t *codes, int64_t rows, int64_t cols,
                                 const bn_tl_tiling *tiling, const void *dst, bn_error *err)
{
    bn_status st = bn_tl_tiling_check(type, rows, cols, tiling, err);
    if (st != BN_OK)
        return st;
    if (!codes || !dst)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "%s pack: NULL buffer",
                            tl_name(type));
    const size_t n = (size_t)rows * (size_t)cols;
    for (size_t i = 0; i < n; i++)
        if (codes[i] < -1 || codes[i] > 1)
            return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                                "%s pack: code %d at row %zu, column %zu is not -1, 0 or 1",
                                tl_name(type), codes[i], i / (size_t)cols, i % (size_t)cols);
    return BN_OK;
}

static bn_status bad_index(bn_qtype type, const char *what, int value, int max, size_t offset,
                           bn_error *err)
{
    return bn_error_set(err, BN_ERR_FORMAT, "the tensor data is corrupt or not this type",
                        "%s %s %d at byte %zu is outside 0..%d", tl_name(type), what, value,
                        offset, max);
}

/* ---- TL1 --------------------------------------------------------------- */

size_t bn_tl1_tensor_bytes(int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols <= 0 || rows > MAX_ELEMENTS / cols)
        return 0;
    return (size_t)(rows * cols / 4);
}

bool bn_tl1_shape_ok(int64_t rows, int64_t cols, bn_error *err)
{
    bn_tl_tiling t;
    return bn_tl_tiling_for_shape(BN_QTYPE_TL1, rows, cols, &t, err) == BN_OK;
}

bn_status bn_unpack_tl1_tiled(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                              const bn_tl_tiling *tiling, int8_t *codes, bn_error *err)
{
    bn_status st = check_unpack_args(BN_QTYPE_TL1, src, src_bytes, rows, cols, tiling, codes, err);
    if (st != BN_OK)
        return st;
    const int64_t BM = tiling->block_rows, BK = tiling->block_cols, bm = tiling->compute_rows;
    const int64_t by = TL1_TILE_WEIGHTS / bm;
    const uint8_t *base = src, *p = src;
    for (int64_t r0 = 0; r0 < rows; r0 += BM)
        for (int64_t c0 = 0; c0 < cols; c0 += BK)
            for (int64_t r1 = r0; r1 < r0 + BM; r1 += bm)
                for (int64_t c1 = c0; c1 < c0 + BK; c1 += by)
                    for (int64_t r2 = r1; r2 < r1 + bm; r2 += 16)
                        for (int64_t c2 = c1; c2 < c1 + by; c2 += 4)
                            for (int64_t v = 0; v < 16; v++, p++) {
                                const int hi = *p >> 4, lo = *p & 15;
                                if (hi > PAIR_INDEX_MAX || lo > PAIR_INDEX_MAX)
                                    return bad_index(BN_QTYPE_TL1, "pair index",
                                                     hi > PAIR_INDEX_MAX ? hi : lo, PAIR_INDEX_MAX,
                                                     (size_t)(p - base), err);
                                int8_t *w = codes + (r2 + v) * cols + c2;
                                pair_decode(hi, &w[0], &w[1]);
                                pair_decode(lo, &w[2], &w[3]);
                            }
    return BN_OK;
}

bn_status bn_pack_tl1_tiled(const int8_t *codes, int64_t rows, int64_t cols,
                            const bn_tl_tiling *tiling, void *dst, bn_error *err)
{
    bn_status st = check_pack_args(BN_QTYPE_TL1, codes, rows, cols, tiling, dst, err);
    if (st != BN_OK)
        return st;
    const int64_t BM = tiling->block_rows, BK = tiling->block_cols, bm = tiling->compute_rows;
    const int64_t by = TL1_TILE_WEIGHTS / bm;
    uint8_t *p = dst;
    for (int64_t r0 = 0; r0 < rows; r0 += BM)
        for (int64_t c0 = 0; c0 < cols; c0 += BK)
            for (int64_t r1 = r0; r1 < r0 + BM; r1 += bm)
                for (int64_t c1 = c0; c1 < c0 + BK; c1 += by)
                    for (int64_t r2 = r1; r2 < r1 + bm; r2 += 16)
                        for (int64_t c2 = c1; c2 < c1 + by; c2 += 4)
                            for (int64_t v = 0; v < 16; v++) {
                                const int8_t *w = codes + (r2 + v) * cols + c2;
                                *p++ = (uint8_t)(pair_index(w[0], w[1]) << 4 |
                                                 pair_index(w[2], w[3]));
                            }
    return BN_OK;
}

bn_status bn_unpack_tl1(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                        int8_t *codes, float *scale, bn_error *err)
{
    bn_tl_tiling t;
    bn_status st = bn_tl_tiling_for_shape(BN_QTYPE_TL1, rows, cols, &t, err);
    if (st == BN_OK)
        st = bn_unpack_tl1_tiled(src, src_bytes, rows, cols, &t, codes, err);
    if (st == BN_OK && scale)
        *scale = 1.0f; /* the real scale is the "<name>_scale" tensor */
    return st;
}

bn_status bn_pack_tl1(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                      bn_error *err)
{
    (void)scale; /* stored by the caller as the "<name>_scale" tensor */
    bn_tl_tiling t;
    bn_status st = bn_tl_tiling_for_shape(BN_QTYPE_TL1, rows, cols, &t, err);
    if (st != BN_OK)
        return st;
    return bn_pack_tl1_tiled(codes, rows, cols, &t, dst, err);
}

/* ---- TL2 --------------------------------------------------------------- */

size_t bn_tl2_tensor_bytes(int64_t rows, int64_t cols)
{
    if (rows <= 0 || cols < TL2_MIN_COLS || rows > MAX_ELEMENTS / cols)
        return 0;
    /* Same operations in the same order as the converter's np.pad target
     * and the fork's ggml_nbytes (all operands non-negative here). */
    return (size_t)((cols - 256) * rows / 3 * 5 / 8 + 256 * rows / 2 * 4 / 8);
}

bool bn_tl2_shape_ok(int64_t rows, int64_t cols, bn_error *err)
{
    bn_tl_tiling t;
    return bn_tl_tiling_for_shape(BN_QTYPE_TL2, rows, cols, &t, err) == BN_OK;
}

/* Where the three areas of a TL2 tensor start. */
typedef struct tl2_areas {
    int64_t triple_cols; /* K3: columns coded in triples */
    int64_t tail_cols;   /* K2: columns coded in pairs   */
    size_t sign_offset, tail_offset;
} tl2_areas;

static tl2_areas tl2_areas_of(int64_t rows, int64_t cols, const bn_tl_tiling *t)
{
    tl2_areas a;
    a.tail_cols = cols % t->block_cols;
    a.triple_cols = cols - a.tail_cols;
    a.sign_offset = (size_t)(rows * a.triple_cols / 6);
    a.tail_offset = a.sign_offset + (size_t)(rows * a.triple_cols / 24);
    return a;
}

bn_status bn_unpack_tl2_tiled(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                              const bn_tl_tiling *tiling, int8_t *codes, bn_error *err)
{
    bn_status st = check_unpack_args(BN_QTYPE_TL2, src, src_bytes, rows, cols, tiling, codes, err);
    if (st != BN_OK)
        return st;
    const int64_t BM = tiling->block_rows;
    const int64_t triples_per_block = tiling->block_cols / 3;
    const tl2_areas a = tl2_areas_of(rows, cols, tiling);
    const int64_t triples = a.triple_cols / 3;
    const uint8_t *base = src;

    /* Magnitudes first, written as non-negative triples... */
    const uint8_t *p = base;
    for (int64_t r0 = 0; r0 < rows; r0 += BM)
        for (int64_t t0 = 0; t0 < triples; t0 += triples_per_block)
            for (int64_t r1 = r0; r1 < r0 + BM; r1 += TL2_TILE_ROWS)
                for (int64_t t1 = t0; t1 < t0 + triples_per_block; t1 += TL2_TRIPLES_PER_MAG_TILE)
                    for (int pos = 0; pos < TL2_TILE_BYTES; pos++, p++) {
                        const int hi = *p >> 4, lo = *p & 15;
                        if (hi > TRIPLE_MAGNITUDE_MAX || lo > TRIPLE_MAGNITUDE_MAX)
                            return bad_index(BN_QTYPE_TL2, "triple magnitude",
                                             hi > TRIPLE_MAGNITUDE_MAX ? hi : lo,
                                             TRIPLE_MAGNITUDE_MAX, (size_t)(p - base), err);
                        int8_t *w = codes + (r1 + tile_row(pos)) * cols + 3 * t1;
                        triple_decode(hi, &w[0]);
                        triple_decode(lo, &w[3]);
                    }

    /* ...then the sign bits negate whole triples (-t is t with every weight
     * negated). */
    p = base + a.sign_offset;
    for (int64_t r0 = 0; r0 < rows; r0 += BM)
        for (int64_t t0 = 0; t0 < triples; t0 += triples_per_block)
            for (int64_t r1 = r0; r1 < r0 + BM; r1 += TL2_TILE_ROWS)
                for (int64_t t1 = t0; t1 < t0 + triples_per_block;
                     t1 += TL2_TRIPLES_PER_SIGN_TILE, p += TL2_TILE_BYTES)
                    for (int q = 0; q < TL2_TRIPLES_PER_SIGN_TILE; q++)
                        for (int s = 0; s < TL2_TILE_ROWS; s++) {
                            const int word = s % 16, bit = 15 - (2 * q + s / 16);
                            const unsigned w16 =
                                (unsigned)p[2 * word] | (unsigned)p[2 * word + 1] << 8;
                            if ((w16 >> bit) & 1u) {
                                int8_t *w = codes + (r1 + s) * cols + 3 * (t1 + q);
                                w[0] = (int8_t)-w[0];
                                w[1] = (int8_t)-w[1];
                                w[2] = (int8_t)-w[2];
                            }
                        }

    /* The tail: TL1-style pair indices in regrouped 32-row tiles. */
    p = base + a.tail_offset;
    const int64_t tail_pairs = a.tail_cols / 2, pairs_per_block = TL2_TAIL_BLOCK_COLS / 2;
    for (int64_t r0 = 0; r0 < rows; r0 += BM)
        for (int64_t p0 = 0; p0 < tail_pairs; p0 += pairs_per_block)
            for (int64_t r1 = r0; r1 < r0 + BM; r1 += TL2_TILE_ROWS)
                for (int64_t p1 = p0; p1 < p0 + pairs_per_block; p1 += 2)
                    for (int pos = 0; pos < TL2_TILE_BYTES; pos++, p++) {
                        const int hi = *p >> 4, lo = *p & 15;
                        if (hi > PAIR_INDEX_MAX || lo > PAIR_INDEX_MAX)
                            return bad_index(BN_QTYPE_TL2, "tail pair index",
                                             hi > PAIR_INDEX_MAX ? hi : lo, PAIR_INDEX_MAX,
                                             (size_t)(p - base), err);
                        int8_t *w = codes + (r1 + tile_row(pos)) * cols + a.triple_cols + 2 * p1;
                        pair_decode(hi, &w[0], &w[1]);
                        pair_decode(lo, &w[2], &w[3]);
                    }
    return BN_OK;
}

bn_status bn_pack_tl2_tiled(const int8_t *codes, int64_t rows, int64_t cols,
                            const bn_tl_tiling *tiling, void *dst, bn_error *err)
{
    bn_status st = check_pack_args(BN_QTYPE_TL2, codes, rows, cols, tiling, dst, err);
    if (st != BN_OK)
        return st;
    const int64_t BM = tiling->block_rows;
    const int64_t triples_per_block = tiling->block_cols / 3;
    const tl2_areas a = tl2_areas_of(rows, cols, tiling);
    const int64_t triples = a.triple_cols / 3;
    uint8_t *base = dst;
    memset(base, 0, bn_tl2_tensor_bytes(rows, cols)); /* sign bits and padding start at 0 */

    uint8_t *p = base;
    for (int64_t r0 = 0; r0 < rows; r0 += BM)
        for (int64_t t0 = 0; t0 < triples; t0 += triples_per_block)
            for (int64_t r1 = r0; r1 < r0 + BM; r1 += TL2_TILE_ROWS)
                for (int64_t t1 = t0; t1 < t0 + triples_per_block; t1 += TL2_TRIPLES_PER_MAG_TILE)
                    for (int pos = 0; pos < TL2_TILE_BYTES; pos++) {
                        const int8_t *w = codes + (r1 + tile_row(pos)) * cols + 3 * t1;
                        const int hi = abs(triple_value(w[0], w[1], w[2]));
                        const int lo = abs(triple_value(w[3], w[4], w[5]));
                        *p++ = (uint8_t)(hi << 4 | lo);
                    }

    p = base + a.sign_offset;
    for (int64_t r0 = 0; r0 < rows; r0 += BM)
        for (int64_t t0 = 0; t0 < triples; t0 += triples_per_block)
            for (int64_t r1 = r0; r1 < r0 + BM; r1 += TL2_TILE_ROWS)
                for (int64_t t1 = t0; t1 < t0 + triples_per_block;
                     t1 += TL2_TRIPLES_PER_SIGN_TILE, p += TL2_TILE_BYTES)
                    for (int q = 0; q < TL2_TRIPLES_PER_SIGN_TILE; q++)
                        for (int s = 0; s < TL2_TILE_ROWS; s++) {
                            const int8_t *w = codes + (r1 + s) * cols + 3 * (t1 + q);
                            if (triple_value(w[0], w[1], w[2]) < 0) {
                                const int word = s % 16, bit = 15 - (2 * q + s / 16);
                                /* little-endian uint16: bits 0-7 in the first byte */
                                p[2 * word + bit / 8] |= (uint8_t)(1u << (bit % 8));
                            }
                        }

    p = base + a.tail_offset;
    const int64_t tail_pairs = a.tail_cols / 2, pairs_per_block = TL2_TAIL_BLOCK_COLS / 2;
    for (int64_t r0 = 0; r0 < rows; r0 += BM)
        for (int64_t p0 = 0; p0 < tail_pairs; p0 += pairs_per_block)
            for (int64_t r1 = r0; r1 < r0 + BM; r1 += TL2_TILE_ROWS)
                for (int64_t p1 = p0; p1 < p0 + pairs_per_block; p1 += 2)
                    for (int pos = 0; pos < TL2_TILE_BYTES; pos++) {
                        const int8_t *w =
                            codes + (r1 + tile_row(pos)) * cols + a.triple_cols + 2 * p1;
                        *p++ = (uint8_t)(pair_index(w[0], w[1]) << 4 | pair_index(w[2], w[3]));
                    }
    return BN_OK;
}

bn_status bn_unpack_tl2(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                        int8_t *codes, float *scale, bn_error *err)
{
    bn_tl_tiling t;
    bn_status st = bn_tl_tiling_for_shape(BN_QTYPE_TL2, rows, cols, &t, err);
    if (st == BN_OK)
        st = bn_unpack_tl2_tiled(src, src_bytes, rows, cols, &t, codes, err);
    if (st == BN_OK && scale)
        *scale = 1.0f; /* the real scale is the "<name>_scale" tensor */
    return st;
}

bn_status bn_pack_tl2(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                      bn_error *err)
{
    (void)scale; /* stored by the caller as the "<name>_scale" tensor */
    bn_tl_tiling t;
    bn_status st = bn_tl_tiling_for_shape(BN_QTYPE_TL2, rows, cols, &t, err);
    if (st != BN_OK)
        return st;
    return bn_pack_tl2_tiled(codes, rows, cols, &t, dst, err);
}
