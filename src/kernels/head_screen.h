/*
 * head_screen.h - the CPU's screened LM head: the token a greedy step
 * picks from the full head's logits, reading half the head's bytes.
 *
 * The head (vocab rows of dim weights, F16 for the 2B-4T shape: 656 MB a
 * token, more than all the ternary projections together) gets an int8
 * copy, one scale a row. A greedy step quantizes the normed hidden state to
 * int8 too and computes, for every row r, an estimate a_r of the logit from
 * exact integer sums and a bound b_r with |logit_r - a_r| <= b_r, where
 * logit_r is what the exact head computes in fp32 from the row's own
 * weights. With T the largest a_r - b_r, a row with a_r + b_r < T is below
 * another row's logit: it can be neither the argmax nor tie with it. The
 * other rows (the candidates, a handful on a trained model) get their exact
 * logits; the rest -inf. The greedy rule over that is the rule over the
 * full logits, ties and NaN included.
 *
 * The bound (w the row's weights as the exact head reads them, m = max |w|,
 * s = m / 127 in fp32, q = rint(w / s) clamped to +-127, x the hidden
 * state, sx = max |x| / 127, y = rint(x / sx), L = sum |x|, ex = sum
 * |x - sx y|, n = dim, u = 2^-24, g = (n + 8) u / (1 - (n + 8) u)):
 *   sum x w - s sx sum q y = sum x (w - s q) + s sum q (x - sx y), with
 *   |w - s q| <= s (1/2 + 128 u) <= 0.501 s and |q| <= 127, so it is at
 *   most 0.501 s L + 127 s ex; the fp32 dot product of the exact head errs
 *   from the real sum by at most g sum |x w| <= g m L.
 * So b = L (0.501 s + g m) + 127 s ex, computed in double and widened by a
 * relative 1e-9 for the double roundings. Rows whose scale is not a
 * positive normal number (all-zero, tiny, inf or NaN weights) are always
 * candidates, and so is every row when x holds a NaN or inf.
 */
#ifndef BN_HEAD_SCREEN_H
#define BN_HEAD_SCREEN_H

#include <stdbool.h>
#include <stdint.h>

#include "bitnet.h"

typedef struct bn_head_screen {
    int64_t vocab, dim, lda; /* lda: a row's bytes, dim rounded up to 64  */
    int8_t *codes;           /* [vocab][lda], zero past dim               */
    float *scale;            /* [vocab] s; 0: the row is always a candidate */
    double *err;             /* [vocab] 0.501 s + g m                      */
    int32_t *code_sum;       /* [vocab] sum q (the VNNI form's offset)     */
    int kernel;              /* the integer dot product this CPU runs      */
} bn_head_screen;

/* A row's weights as the exact head computes with them. */
typedef void (*bn_head_row_fn)(void *ctx, int64_t row, float *out);

/* Builds the int8 copy of a vocab x dim head, rows [begin, end) at a time
 * (the caller spreads the rows over its threads: bn_head_screen_fill). */
bn_status bn_head_screen_alloc(bn_head_screen *s, int64_t vocab, int64_t dim, bn_error *err);
void bn_head_screen_fill(bn_head_screen *s, int64_t begin, int64_t end, bn_head_row_fn row,
                         void *ctx, float *scratch /* dim floats */);
void bn_head_screen_free(bn_head_screen *s);
uint64_t bn_head_screen_bytes(const bn_head_screen *s);

/* A hidden state in the screen's terms. */
typedef struct bn_head_screen_x {
    int8_t *y;      /* [lda] codes, zero past dim                        */
    uint8_t *y_u8;  /* [lda] y + 128 (the VNNI form)                      */
    float sx;
    double l1, ex;  /* L and ex above; NaN when x is not finite            */
} bn_head_screen_x;

/* Quantizes x (dim floats) into hx, whose buffers hold lda bytes each. */
void bn_head_screen_quantize(const bn_head_screen *s, const float *x, bn_head_screen_x *hx);

/* The bounds of rows [begin, end): lo[r] = a_r - b_r, hi[r] = a_r + b_r
 * (lo -inf and hi +inf for a row that is always a candidate). */
void bn_head_screen_bounds(const bn_head_screen *s, const bn_head_screen_x *hx, int64_t begin,
                           int64_t end, double *lo, double *hi);

/* The integer dot product of row r's codes with hx's, exactly (every
 * kernel gives the same number): for the tests. */
int32_t bn_head_screen_dot(const bn_head_screen *s, int64_t r, const bn_head_screen_x *hx);
/* Whether this CPU has a vector kernel (else the screen would cost more
 * than the full head's vector code, and the backend does without it). */
bool bn_head_screen_has_vector_kernel(void);
/* The kernel in use ("avx512vnni", "avx2", "neondot", "neon", "scalar");
 * force picks one the
 * CPU has (tests), false when it lacks it. */
const char *bn_head_screen_kernel_name(const bn_head_screen *s);
bool bn_head_screen_force_kernel(bn_head_screen *s, const char *name);

#endif
