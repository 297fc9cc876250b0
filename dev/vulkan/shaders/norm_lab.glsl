// LAB COPY of src/vulkan/shaders/norm_quantize.glsl as it was at commit
// 13c87ee (256 invocations, the row staged in shared memory, three passes,
// trees) with switches, to see what its time was made of and which form
// to ship (dispatch_chain.c; the shipped kernel is now the WG1024 +
// SUBGROUP + MERGED + NO_STAGE form, or MERGED + NO_STAGE with trees):
//   NO_STAGE    the row read from global memory, not staged in shared
//   SUBGROUP    reductions by subgroup operations, a shared slot a subgroup
//   MERGED      the codes by the exact rule in the loop of the normed
//               maximum (they need umax, not inv); the plain rule's codes
//               in a loop of their own only where the exact rule is off
//   SKIP_FMAX   no normed maximum (amax = 1)
//   SKIP_CODES  no codes
// Each variant that writes codes must give the CPU's (the lab checks).
//
// The shipped header follows.
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
#ifdef WG1024 // 1024 invocations a row (with SUBGROUP: no trees' arrays)
#define THREADS 1024u
#else
#define THREADS 256u
#endif
#define STAGED 6912u // floats of a row staged (27 KiB; lavapipe allows 32 KiB)
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

// Correctly rounded division and square root: div_rn, fdiv_rn, fsqrt_rn;
// REAL, double or float.
#include "exact_math.glsl"

const float QUANT_EPS = 1e-5;

shared REAL lane_sum[8];
#ifdef SUBGROUP
shared REAL dsum[1];
shared REAL dmax[1];
#else
shared REAL dsum[THREADS];
shared REAL dmax[THREADS];
#endif
shared REAL sh_mean_sq;
shared bool sh_ordered;
#ifdef SUBGROUP
shared float fmax_[1];
shared int isum[1];
#else
shared float fmax_[THREADS];
shared int isum[THREADS];
#endif
shared float sh_inv;
shared float row_x[STAGED];
#ifdef SUBGROUP
shared REAL sg_sum[THREADS / 4u];
shared REAL sg_max[THREADS / 4u];
#endif

// Value i of the row: from shared memory where the row is staged.
float xv(uint base, uint i)
{
#ifdef NO_STAGE
    return x[base + i];
#else
    return p.n <= STAGED ? row_x[i] : x[base + i];
#endif
}


// round half to even, then clamp to [-128, 127]; NaN gives 0.
int round_clamp(float v)
{
    const float r = roundEven(v);
    if (isnan(r))
        return 0;
    return r > 127.0 ? 127 : r < -128.0 ? -128 : int(r);
}


int exact_code(float xi, float wi, REAL rmax, REAL umax)
{
    precise REAL pr = REAL(wi) * REAL(xi);
    if (isnan(pr))
        return 0;
    precise REAL t0 = 127.0 * (pr * rmax);
#ifdef BN_FP64
    if (abs(t0 - floor(t0) - 0.5) <= 1e-11) {
        precise double t = 127.0 * div_rn(pr, umax);
        return int(roundEven(t));
    }
#endif
    return int(roundEven(t0));
}

// The workgroup's max of fm and sum of total, into both (every invocation).
// Each call site is reached by the whole workgroup.
#ifdef SUBGROUP
shared float sg_fmax[2][THREADS / 4u];
shared int sg_isum[2][THREADS / 4u];
uint reduce_round = 0u;
void reduce_max_sum(inout float fm, inout int total)
{
    const float m = subgroupMax(fm);
    const int t = subgroupAdd(total);
    const uint r = reduce_round & 1u; // alternate slots: no barrier before reuse
    reduce_round++;
    if (subgroupElect()) {
        sg_fmax[r][gl_SubgroupID] = m;
        sg_isum[r][gl_SubgroupID] = t;
    }
    barrier();
    float mm = 0.0;
    int tt = 0;
    for (uint g = 0u; g < gl_NumSubgroups; g++) {
        mm = sg_fmax[r][g] > mm ? sg_fmax[r][g] : mm;
        tt += sg_isum[r][g];
    }
    fm = mm;
    total = tt;
}
#else
void reduce_max_sum(inout float fm, inout int total)
{
    barrier(); // the slots' last readers are done
    fmax_[gl_LocalInvocationID.x] = fm;
    isum[gl_LocalInvocationID.x] = total;
    barrier();
    const uint tid = gl_LocalInvocationID.x;
    for (uint h = THREADS / 2u; h > 0u; h >>= 1u) {
        if (tid < h) {
            if (fmax_[tid + h] > fmax_[tid])
                fmax_[tid] = fmax_[tid + h];
            isum[tid] += isum[tid + h];
        }
        barrier();
    }
    fm = fmax_[0];
    total = isum[0];
}
#endif

void main()
{
    const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows)
        return; // the whole workgroup: no barrier is left waiting
    const uint tid = gl_LocalInvocationID.x;
    const uint n = p.n, base = row * n;

#ifndef NO_STAGE
    if (n <= STAGED) {
        for (uint i = tid; i < n; i += THREADS)
            row_x[i] = x[base + i];
        barrier();
    }
#endif
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
#ifdef SUBGROUP
    {
        const REAL ps = subgroupAdd(part), pm = subgroupMax(m);
        if (subgroupElect()) {
            sg_sum[gl_SubgroupID] = ps;
            sg_max[gl_SubgroupID] = pm;
        }
        barrier();
        precise REAL t = 0.0;
        REAL mx = 0.0;
        for (uint g = 0u; g < gl_NumSubgroups; g++) {
            t = t + sg_sum[g];
            mx = sg_max[g] > mx ? sg_max[g] : mx;
        }
        dsum[0] = t; // only invocation 0 reads it below; all write the same
        m = mx;
    }
    const REAL umax = m;
#else
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
#endif
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

    // Exact-rule codes need umax only; whether the exact rule holds also
    // needs amax >= QUANT_EPS, known after the normed maximum.
    const bool exact_u = umax > 0.0 && !isinf(umax) && !isnan(umax);
    const REAL rmax = exact_u ? 1.0 / umax : 0.0;
    float fm = 0.0;
    int total = 0;
#ifdef MERGED
    for (uint j = tid; j < p.words; j += THREADS) {
        uint word = 0u;
        for (uint b = 0u; b < 4u; b++) {
            const uint i = 4u * j + b;
            int c = 0;
            if (i < n) {
                const float xi = xv(base, i), wi = w[i];
                precise float a = abs(wi * (xi * inv));
                if (a > fm)
                    fm = a;
                if (exact_u)
                    c = exact_code(xi, wi, rmax, umax);
            }
            total += c;
            word |= (uint(c) & 255u) << (8u * b);
        }
        q[row * p.words + j] = word;
    }
    reduce_max_sum(fm, total);
    const float amax = fm;
#else
#ifndef SKIP_FMAX
    for (uint i = tid; i < n; i += THREADS) {
        precise float a = abs(w[i] * (xv(base, i) * inv));
        if (a > fm)
            fm = a;
    }
    int unused = 0;
    reduce_max_sum(fm, unused);
    const float amax = fm;
#else
    const float amax = 1.0;
#endif
#endif
    const bool exact = amax >= QUANT_EPS && exact_u;
    const float s = exact ? 0.0 : fdiv_rn(127.0, amax >= QUANT_EPS ? amax : QUANT_EPS);
#ifdef MERGED
    const bool codes_loop = !exact; // rare: the plain rule's codes
#elif defined(SKIP_CODES)
    const bool codes_loop = false;
#else
    const bool codes_loop = true;
#endif
    if (codes_loop) {
        total = 0;
        for (uint j = tid; j < p.words; j += THREADS) {
            uint word = 0u;
            for (uint b = 0u; b < 4u; b++) {
                const uint i = 4u * j + b;
                int c = 0;
                if (i < n) {
                    const float xi = xv(base, i), wi = w[i];
                    if (exact) {
                        c = exact_code(xi, wi, rmax, umax);
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
    }
#ifdef MERGED
    if (codes_loop) {
        float unused = 0.0;
        reduce_max_sum(unused, total);
    }
#else
    {
        float unused = 0.0;
        reduce_max_sum(unused, total);
    }
#endif
    if (tid == 0u) {
        scale[row] = exact ? fdiv_rn(127.0, amax) : s;
        sums[row] = total;
    }
}
