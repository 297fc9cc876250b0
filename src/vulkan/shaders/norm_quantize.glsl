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

// A workgroup a row. With SUBGROUP (norm_quantize_f64_sg.comp: devices
// with subgroup arithmetic) 512 invocations and each reduction by the
// subgroups' operations, then a shared slot a subgroup; else 256 and trees
// in shared memory. The row is read from global memory (it was written by
// the dispatch before: in L2), and the codes by the exact rule, which need
// umax but not inv, are made in the same loop as the normed maximum: two
// passes over the row, not three (NVIDIA's H200, one row of 2560 and of
// 6912: 9.0 and 14.0 us a dispatch staged in three passes, 7.4 and 8.9 in
// this form with SUBGROUP and 1024 invocations; dev/vulkan/dispatch_chain.c).
// 512 invocations: the decode step's 120 norms 1052-1058 us against
// 1168-1179 with 1024, and 1177-1185 with 256 (docs/VULKAN.md, "Speed").
//
// With NORM_FUNCTION the including shader (w2a8_normed.glsl) calls
// norm_quantize_row from workgroups of its own THREADS, with the buffers
// (or shared arrays) the NORM_* macros name; without, this is the kernel
// of a row a workgroup.
#ifndef NORM_FUNCTION
#ifdef SUBGROUP
#define THREADS 512u
#else
#define THREADS 256u
#endif
layout(local_size_x = THREADS) in;

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

#define NORM_X(i) x[i]
#define NORM_W(i) w[i]
#define NORM_CODES q
#define NORM_SCALES scale
#define NORM_SUMS sums
#endif

// Correctly rounded division and square root: div_rn, fdiv_rn, fsqrt_rn;
// REAL, double or float.
#include "exact_math.glsl"

const float QUANT_EPS = 1e-5;

shared REAL lane_sum[8];
shared REAL sh_mean_sq;
shared bool sh_ordered;
shared float sh_inv;

// ---- the workgroup's reductions: every invocation gets the result; each
// call is reached by the whole workgroup.
#ifdef SUBGROUP
// A slot a subgroup (at least 4 invocations each), two sets used in turn,
// so a set is written again only after the barrier of the call between.
shared REAL red_sum[2][THREADS / 4u], red_dmax[2][THREADS / 4u];
shared float red_fmax[2][THREADS / 4u];
shared int red_isum[2][THREADS / 4u];
uint red_set = 0u;

// The sum of squares and max |w x| (doubles).
void reduce_sum_dmax(inout REAL sum, inout REAL dmax)
{
    const REAL s = subgroupAdd(sum), d = subgroupMax(dmax);
    const uint r = red_set;
    red_set ^= 1u;
    if (subgroupElect()) {
        red_sum[r][gl_SubgroupID] = s;
        red_dmax[r][gl_SubgroupID] = d;
    }
    barrier();
    precise REAL ts = 0.0;
    REAL td = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; g++) {
        ts = ts + red_sum[r][g];
        td = red_dmax[r][g] > td ? red_dmax[r][g] : td;
    }
    sum = ts;
    dmax = td;
}

// The normed maximum and the codes' sum.
void reduce_fmax_isum(inout float fmax, inout int isum)
{
    const float f = subgroupMax(fmax);
    const int t = subgroupAdd(isum);
    const uint r = red_set;
    red_set ^= 1u;
    if (subgroupElect()) {
        red_fmax[r][gl_SubgroupID] = f;
        red_isum[r][gl_SubgroupID] = t;
    }
    barrier();
    float tf = 0.0;
    int ti = 0;
    for (uint g = 0u; g < gl_NumSubgroups; g++) {
        tf = red_fmax[r][g] > tf ? red_fmax[r][g] : tf;
        ti += red_isum[r][g];
    }
    fmax = tf;
    isum = ti;
}
#else
shared REAL red_sum[THREADS], red_dmax[THREADS];
shared float red_fmax[THREADS];
shared int red_isum[THREADS];

void reduce_sum_dmax(inout REAL sum, inout REAL dmax)
{
    const uint tid = gl_LocalInvocationID.x;
    red_sum[tid] = sum; // each set is used once: no barrier before
    red_dmax[tid] = dmax;
    barrier();
    for (uint h = THREADS / 2u; h > 0u; h >>= 1u) {
        if (tid < h) {
            precise REAL t = red_sum[tid] + red_sum[tid + h];
            red_sum[tid] = t;
            red_dmax[tid] = red_dmax[tid + h] > red_dmax[tid] ? red_dmax[tid + h] : red_dmax[tid];
        }
        barrier();
    }
    sum = red_sum[0];
    dmax = red_dmax[0];
}

void reduce_fmax_isum(inout float fmax, inout int isum)
{
    const uint tid = gl_LocalInvocationID.x;
    barrier(); // a second call: the first one's results have been read
    red_fmax[tid] = fmax;
    red_isum[tid] = isum;
    barrier();
    for (uint h = THREADS / 2u; h > 0u; h >>= 1u) {
        if (tid < h) {
            red_fmax[tid] = red_fmax[tid + h] > red_fmax[tid] ? red_fmax[tid + h] : red_fmax[tid];
            red_isum[tid] += red_isum[tid + h];
        }
        barrier();
    }
    fmax = red_fmax[0];
    isum = red_isum[0];
}
#endif

// round half to even (round_even.glsl), then clamp to [-128, 127]; NaN gives 0.
int round_clamp(float v)
{
    const float r = round_even(v);
    if (isnan(r))
        return 0;
    return r > 127.0 ? 127 : r < -128.0 ? -128 : int(r);
}

// The exact rule's code of w x: rint(127 (w x) / umax), rmax = 1 / umax
// as the device computes it, rf = fl32(127 / fl32(umax)) or 0.
int exact_code(float xi, float wi, float rf, REAL rmax, REAL umax)
{
#ifdef BN_FP64
    // First in float, as the CUDA kernel does (norm_quantize.cu, where the
    // proof is): t = fl32(fl32(w x) rf) lies within 3.1e-5 of the CPU's
    // double expression, so wherever t is more than 2^-12 from a half,
    // rint(t) is its code. Vulkan rounds float products correctly, as the
    // proof needs; rf is 0 where umax lies outside [2^-100, 2^100] (fl32
    // of it then not a normal float), and a NaN product fails the test.
    if (rf != 0.0) {
        precise float tf = (wi * xi) * rf;
        const float nf = round_even(tf);
        precise float off = tf - nf;
        if (abs(off) < 0.499755859375) // 1/2 - 2^-12
            return int(nf);
    }
#endif
    precise REAL pr = REAL(wi) * REAL(xi);
    if (isnan(pr))
        return 0;
    // pr times the device's reciprocal of umax (each within 2.5 ulp) is
    // within a few ulp of the correctly rounded quotient, so t0 is within
    // a few ulp (|t| <= 127: below 1e-13) of the CPU's t. Away from a half
    // they round alike; only near one is the corrected quotient needed
    // (the exact ties).
    precise REAL t0 = 127.0 * (pr * rmax);
#ifdef BN_FP64
    if (abs(t0 - floor(t0) - 0.5) <= 1e-11) {
        precise double t = 127.0 * div_rn(pr, umax);
        return int(round_even(t));
    }
#endif
    return int(round_even(t0));
}

// Row `row` of n values (row * n on in NORM_X) into its `words` words of
// codes, its scale and its codes' sum. Reached by the whole workgroup.
void norm_quantize_row(uint row, uint n, uint words, float eps)
{
    const uint tid = gl_LocalInvocationID.x;
    const uint base = row * n;

    // The squares' sum and max |w x| in double, each invocation over its
    // strided values, then one reduction for both. The CPU adds the
    // squares in eight ordered lanes (chains of n / 8 dependent adds, most
    // of this kernel's time when they ran here); any order of these
    // non-negative terms lands within (n - 1) 2^-53 of the exact sum, so
    // the two sums are within 2 n 2^-53 of each other, and the float the
    // CPU rounds ss / n to is this sum's unless an interval that wide
    // around its quotient holds a float rounding boundary. Only then (a
    // chance of about n 2^-28 for a random row) do eight invocations add
    // the lanes in the CPU's order. Without fp64 this sum is the answer.
    precise REAL ss = 0.0;
    REAL umax = 0.0;
    for (uint i = tid; i < n; i += THREADS) {
        const float xi = NORM_X(base + i);
        ss = fma(REAL(xi), REAL(xi), ss);
        const REAL u = abs(REAL(NORM_W(i)) * REAL(xi));
        if (u > umax)
            umax = u;
    }
    reduce_sum_dmax(ss, umax);
    if (tid == 0u) {
        const REAL mq = div_rn(ss, REAL(n));
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
                const REAL v = REAL(NORM_X(base + i));
                s = fma(v, v, s);
            }
            lane_sum[tid] = s;
        }
        barrier();
        precise REAL lanes = ((lane_sum[0] + lane_sum[1]) + (lane_sum[2] + lane_sum[3])) +
                             ((lane_sum[4] + lane_sum[5]) + (lane_sum[6] + lane_sum[7]));
        mean_sq = div_rn(lanes, REAL(n));
    }
    if (tid == 0u) {
        precise float v = float(mean_sq) + eps;
        // Non-finite sums (a NaN or an infinity in the row) take the plain
        // rule below whatever inv is.
        sh_inv = isnan(v) || isinf(v) ? 1.0 / sqrt(v) : fdiv_rn(1.0, fsqrt_rn(v));
    }
    barrier();
    const float inv = sh_inv;

    // The normed maximum in float, and the exact rule's codes with it. The
    // exact rule holds where umax is finite and positive and amax >= 1e-5;
    // amax is known only after this pass, so where it turns out smaller
    // (a row of values near zero) the codes are made again by the plain
    // rule below.
    const bool exact_u = umax > 0.0 && !isinf(umax) && !isnan(umax);
    // A product times the reciprocal is within a few ulp of the quotient,
    // as the device's division is, at a fraction of its cost.
    const REAL rmax = exact_u ? 1.0 / umax : 0.0;
#ifdef BN_FP64
    const bool fast = exact_u && umax >= ldexp(1.0lf, -100) && umax <= ldexp(1.0lf, 100);
    const float rf = fast ? fdiv_rn(127.0, float(umax)) : 0.0;
#else
    const float rf = 0.0;
#endif
    float amax = 0.0;
    int total = 0;
    for (uint j = tid; j < words; j += THREADS) {
        uint word = 0u;
        for (uint b = 0u; b < 4u; b++) {
            const uint i = 4u * j + b;
            int c = 0;
            if (i < n) {
                const float xi = NORM_X(base + i), wi = NORM_W(i);
                precise float a = abs(wi * (xi * inv));
                if (a > amax)
                    amax = a;
                if (exact_u)
                    c = exact_code(xi, wi, rf, rmax, umax);
            }
            total += c;
            word |= (uint(c) & 255u) << (8u * b);
        }
        NORM_CODES[row * words + j] = word;
    }
    reduce_fmax_isum(amax, total);
    const bool exact = exact_u && amax >= QUANT_EPS;
    const float s = exact ? 0.0 : fdiv_rn(127.0, amax >= QUANT_EPS ? amax : QUANT_EPS);
    if (!exact) { // the plain rule (workgroup-uniform)
        total = 0;
        for (uint j = tid; j < words; j += THREADS) {
            uint word = 0u;
            for (uint b = 0u; b < 4u; b++) {
                const uint i = 4u * j + b;
                int c = 0;
                if (i < n) {
                    precise float v = (NORM_W(i) * (NORM_X(base + i) * inv)) * s;
                    c = round_clamp(v);
                }
                total += c;
                word |= (uint(c) & 255u) << (8u * b);
            }
            NORM_CODES[row * words + j] = word;
        }
        float unused = 0.0;
        reduce_fmax_isum(unused, total);
    }
    if (tid == 0u) {
        NORM_SCALES[row] = exact ? fdiv_rn(127.0, amax) : s;
        NORM_SUMS[row] = total;
    }
}

#ifndef NORM_FUNCTION
void main()
{
    const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows)
        return; // the whole workgroup: no barrier is left waiting
    norm_quantize_row(row, p.n, p.words, p.eps);
}
#endif
