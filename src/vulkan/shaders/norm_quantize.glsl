// RMSNorm then int8 quantization of one row a workgroup, bit for bit the
// CPU's rule (bn_norm_quantize_row, quant_rules.c):
//
//   ss    = the squares' sum in eight lanes (element i in lane i % 8, each
//           lane in order), the lanes added pairwise (here: a tree, and
//           the lanes only where the tree's sum could round otherwise);
//   inv   = 1 / sqrtf((float)(ss / n) + eps);
//   amax  = max |w (x inv)| in float;  umax = max |w x| in double;
//   codes = rint(127 * ((w x) / umax)) in double where amax >= 1e-5 and
//           umax is finite and positive, else the plain rule on w (x inv);
//   scale = 127 / amax (or 127 / max(amax, 1e-5) on the plain rule).
//
// Vulkan lets divisions and square roots be inexact, so each one here is
// made correctly rounded: a float one through double, then rounded (the
// result of a float division or square root is never close enough to
// halfway between two floats for the double's error to matter; the square
// root is also checked against the midpoints' exact squares), a double
// division by testing the neighbours of the device's quotient with exact
// residuals (products split into halves, Dekker). That is the variant
// with BN_FP64 (norm_quantize_f64.comp). Without (norm_quantize.comp, for
// devices without fp64) the same steps run in float with the device's
// division and square root: scales and codes within a rounding of the
// CPU's, a code at an exact tie possibly one off.
//
// Codes go out four to a word (little end first), the row padded with
// zeros to `words` words, as the W2A8 kernel reads them.

// 256 invocations a row, and the row staged in shared memory where it fits
// (NVIDIA's Vulkan took 55 us a row with 64 invocations reading the eight
// ordered lanes' squares from global memory one load after another).
#define THREADS 256u
#define STAGED 6912u // floats of a row staged (27 KiB; lavapipe allows 32 KiB)
layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Rows { float x[]; };
layout(std430, binding = 1) readonly buffer Weights { float w[]; };
layout(std430, binding = 2) writeonly buffer Codes { uint q[]; };
layout(std430, binding = 3) writeonly buffer Scales { float scale[]; };
layout(std430, binding = 4) writeonly buffer Sums { int sums[]; };

layout(push_constant) uniform Params {
    uint rows;
    uint n;       // values a row
    uint words;   // code words a row (4 codes each)
    float eps;
} p;

// Correctly rounded division and square root: div_rn, fdiv_rn, fsqrt_rn;
// REAL, double or float.
#include "exact_math.glsl"

const float QUANT_EPS = 1e-5;

shared REAL lane_sum[8];
shared REAL dsum[THREADS];
shared REAL dmax[THREADS];
shared REAL sh_mean_sq;
shared bool sh_ordered;
shared float fmax_[THREADS];
shared int isum[THREADS];
shared float sh_inv;
shared float row_x[STAGED];

// Value i of the row: from shared memory where the row is staged.
float xv(uint base, uint i)
{
    return p.n <= STAGED ? row_x[i] : x[base + i];
}


// round half to even, then clamp to [-128, 127]; NaN gives 0.
int round_clamp(float v)
{
    const float r = roundEven(v);
    if (isnan(r))
        return 0;
    return r > 127.0 ? 127 : r < -128.0 ? -128 : int(r);
}

void main()
{
    const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows)
        return; // the whole workgroup: no barrier is left waiting
    const uint tid = gl_LocalInvocationID.x;
    const uint n = p.n, base = row * n;

    if (n <= STAGED) {
        for (uint i = tid; i < n; i += THREADS)
            row_x[i] = x[base + i];
        barrier();
    }
    // The squares' sum and max |w x| in double, each invocation over its
    // strided values, then one tree for both. The CPU adds the squares in
    // eight ordered lanes (chains of n / 8 dependent adds, most of this
    // kernel's time when they ran here); any order of these non-negative
    // terms lands within (n - 1) 2^-53 of the exact sum, so the two sums
    // are within 2 n 2^-53 of each other, and the float the CPU rounds
    // ss / n to is the tree's unless an interval that wide around the
    // tree's quotient holds a float rounding boundary. Only then (a chance
    // of about n 2^-28 for a random row) do eight invocations add the
    // lanes in the CPU's order. Without fp64 the tree's sum is the answer.
    precise REAL part = 0.0;
    REAL m = 0.0;
    for (uint i = tid; i < n; i += THREADS) {
        const float xi = xv(base, i);
        part = fma(REAL(xi), REAL(xi), part);
        const REAL u = abs(REAL(w[i]) * REAL(xi));
        if (u > m)
            m = u;
    }
    dsum[tid] = part;
    dmax[tid] = m;
    barrier();
    for (uint h = THREADS / 2u; h > 0u; h >>= 1u) {
        if (tid < h) {
            precise REAL t = dsum[tid] + dsum[tid + h];
            dsum[tid] = t;
            if (dmax[tid + h] > dmax[tid])
                dmax[tid] = dmax[tid + h];
        }
        barrier();
    }
    const REAL umax = dmax[0];
    if (tid == 0u) {
        const REAL mq = div_rn(dsum[0], REAL(n));
#ifdef BN_FP64
        const double d = (4.0 * double(n) + 8.0) * 1.1102230246251565e-16; // (4 n + 8) 2^-53
        sh_ordered = float(mq * (1.0 - d)) != float(mq * (1.0 + d));
#else
        sh_ordered = false;
#endif
        sh_mean_sq = mq;
    }
    barrier();
    REAL mean_sq = sh_mean_sq;
    if (sh_ordered) { // a rounding boundary near: the CPU's order (workgroup-uniform)
        if (tid < 8u) {
            precise REAL s = 0.0;
            for (uint i = tid; i < n; i += 8u) {
                const REAL v = REAL(xv(base, i));
                s = fma(v, v, s);
            }
            lane_sum[tid] = s;
        }
        barrier();
        precise REAL ss = ((lane_sum[0] + lane_sum[1]) + (lane_sum[2] + lane_sum[3])) +
                          ((lane_sum[4] + lane_sum[5]) + (lane_sum[6] + lane_sum[7]));
        mean_sq = div_rn(ss, REAL(n));
    }
    if (tid == 0u) {
        precise float v = float(mean_sq) + p.eps;
        // Non-finite sums (a NaN or an infinity in the row) take the plain
        // rule below whatever inv is.
        sh_inv = isnan(v) || isinf(v) ? 1.0 / sqrt(v) : fdiv_rn(1.0, fsqrt_rn(v));
    }
    barrier();
    const float inv = sh_inv;

    // The normed maximum in float.
    float fm = 0.0;
    for (uint i = tid; i < n; i += THREADS) {
        precise float a = abs(w[i] * (xv(base, i) * inv));
        if (a > fm)
            fm = a;
    }
    fmax_[tid] = fm;
    barrier();
    for (uint h = THREADS / 2u; h > 0u; h >>= 1u) {
        if (tid < h && fmax_[tid + h] > fmax_[tid])
            fmax_[tid] = fmax_[tid + h];
        barrier();
    }
    const float amax = fmax_[0];
    const bool exact = amax >= QUANT_EPS && umax > 0.0 && !isinf(umax) && !isnan(umax);
    // A product times the reciprocal is within a few ulp of the quotient,
    // as the device's division is, at a fraction of its cost.
    const REAL rmax = exact ? 1.0 / umax : 0.0;
    const float s = exact ? 0.0 : fdiv_rn(127.0, amax >= QUANT_EPS ? amax : QUANT_EPS);

    int total = 0;
    for (uint j = tid; j < p.words; j += THREADS) {
        uint word = 0u;
        for (uint b = 0u; b < 4u; b++) {
            const uint i = 4u * j + b;
            int c = 0;
            if (i < n) {
                const float xi = xv(base, i), wi = w[i];
                if (exact) {
                    precise REAL pr = REAL(wi) * REAL(xi);
                    if (!isnan(pr)) {
                        // pr times the device's reciprocal of umax (each
                        // within 2.5 ulp) is within a few ulp of the
                        // correctly rounded quotient, so t0 is within a few
                        // ulp (|t| <= 127: below 1e-13) of the CPU's t. Away
                        // from a half they round alike; only near one is
                        // the corrected quotient needed (the exact ties).
                        precise REAL t0 = 127.0 * (pr * rmax);
#ifdef BN_FP64
                        if (abs(t0 - floor(t0) - 0.5) > 1e-11) {
                            c = int(roundEven(t0));
                        } else {
                            precise double t = 127.0 * div_rn(pr, umax);
                            c = int(roundEven(t));
                        }
#else
                        c = int(roundEven(t0));
#endif
                    }
                } else {
                    precise float v = (wi * (xi * inv)) * s;
                    c = round_clamp(v);
                }
            }
            total += c;
            word |= (uint(c) & 255u) << (8u * b);
        }
        q[row * p.words + j] = word;
    }
    isum[tid] = total;
    barrier();
    for (uint h = THREADS / 2u; h > 0u; h >>= 1u) {
        if (tid < h)
            isum[tid] += isum[tid + h];
        barrier();
    }
    if (tid == 0u) {
        scale[row] = exact ? fdiv_rn(127.0, amax) : s;
        sums[row] = isum[0];
    }
}
