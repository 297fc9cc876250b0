/* Microsoft bitnet.cpp's lookup-table formats TL1 (ARM) and TL2 (x86), as
 * the bitnet.cpp converter writes them into GGUF files. Layouts, tiling and
 * shape rules are documented in fmt_tl.c.
 *
 * Two things a caller must know:
 *   - The tensor holds codes only. The per-tensor scale is a separate F32
 *     tensor named "<weight name>_scale" (e.g. "blk.0.attn_q.weight_scale"),
 *     so unpack returns scale 1.0f and pack ignores the scale; the loader
 *     multiplies by the scale tensor (as with the HF packed format).
 *   - The byte order depends on the tiling (BM, BK, bm) the converter was
 *     given through bitnet.cpp's include/kernel_config.ini, which the GGUF
 *     file does not record. The registry functions (bn_unpack_tl1, ...) use
 *     bn_tl_tiling_for_shape(); a file converted with another kernel config
 *     needs the *_tiled functions with that config (bn_tl_tiling_from_ini). */
#ifndef BN_FMT_TL_H
#define BN_FMT_TL_H

#include "qtype.h"

/* One [Kernels_N] section of bitnet.cpp's kernel_config.ini. */
typedef struct bn_tl_tiling {
    int block_rows;   /* "bm"  (BM): rows per block; rows % BM == 0         */
    int block_cols;   /* "bk"  (BK): columns per block (TL2: per block of   */
                      /*       the 3-weight part; the rest is the tail)     */
    int compute_rows; /* "bmm" (bm): rows per compute tile: TL1 32 or 64,   */
                      /*       TL2 32; the tile is 256/bm (TL1) or 192/bm   */
                      /*       (TL2) weights wide                           */
} bn_tl_tiling;

/* The tiling used for a rows x cols TL1 or TL2 tensor when the caller has no
 * kernel_config.ini: bitnet.cpp's own setting for the shapes its setup_env.py
 * generates, else this project's rule (see fmt_tl.c). BN_ERR_UNSUPPORTED,
 * naming the shape, when neither applies. */
bn_status bn_tl_tiling_for_shape(bn_qtype type, int64_t rows, int64_t cols,
                                 bn_tl_tiling *tiling, bn_error *err);

/* Checks that a tiling can describe a rows x cols tensor of this type (the
 * rules bitnet.cpp's converter and codegen need). */
bn_status bn_tl_tiling_check(bn_qtype type, int64_t rows, int64_t cols,
                             const bn_tl_tiling *tiling, bn_error *err);

/* Finds the section for m == rows, k == cols in the text of a bitnet.cpp
 * kernel_config.ini (first match, as the converter does) and checks it.
 * BN_ERR_UNSUPPORTED when no section matches, BN_ERR_FORMAT when the
 * matching section is malformed. */
bn_status bn_tl_tiling_from_ini(bn_qtype type, const char *ini_text, int64_t rows,
                                int64_t cols, bn_tl_tiling *tiling, bn_error *err);

/* ---- TL1 --------------------------------------------------------------- */

/* rows * cols / 4: the bytes the converter writes (independent of tiling).
 * The fork's ggml_nbytes() reports 32 more; those 32 bytes are the start of
 * the following "<name>_scale" tensor, not part of this one. */
size_t bn_tl1_tensor_bytes(int64_t rows, int64_t cols);
bool bn_tl1_shape_ok(int64_t rows, int64_t cols, bn_error *err);
bn_status bn_unpack_tl1(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                        int8_t *codes, float *scale, bn_error *err);
bn_status bn_pack_tl1(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                      bn_error *err);
bn_status bn_unpack_tl1_tiled(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                              const bn_tl_tiling *tiling, int8_t *codes, bn_error *err);
/* dst holds bn_tl1_tensor_bytes(rows, cols) bytes. */
bn_status bn_pack_tl1_tiled(const int8_t *codes, int64_t rows, int64_t cols,
                            const bn_tl_tiling *tiling, void *dst, bn_error *err);

/* ---- TL2 --------------------------------------------------------------- */

/* The converter's padded size, (K-256)*N/3*5/8 + 256*N/2*4/8 (integer
 * arithmetic, in that order), independent of tiling; 0 when cols < 256.
 * The fork's ggml_nbytes() rounds this up to 32 and adds 32; that excess is
 * GGUF alignment padding plus the following "<name>_scale" tensor. */
size_t bn_tl2_tensor_bytes(int64_t rows, int64_t cols);
bool bn_tl2_shape_ok(int64_t rows, int64_t cols, bn_error *err);
bn_status bn_unpack_tl2(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                        int8_t *codes, float *scale, bn_error *err);
bn_status bn_pack_tl2(const int8_t *codes, float scale, int64_t rows, int64_t cols, void *dst,
                      bn_error *err);
bn_status bn_unpack_tl2_tiled(const void *src, size_t src_bytes, int64_t rows, int64_t cols,
                              const bn_tl_tiling *tiling, int8_t *codes, bn_error *err);
/* dst holds bn_tl2_tensor_bytes(rows, cols) bytes; the padding is zeroed. */
bn_status bn_pack_tl2_tiled(const int8_t *codes, int64_t rows, int64_t cols,
                            const bn_tl_tiling *tiling, void *dst, bn_error *err);

#endif
