#version 450
#extension GL_GOOGLE_include_directive : require
// RMSNorm then int8 quantization of one row a workgroup, bit for bit the
// CPU's rule (bn_norm_quantize_row, quant_rules.c):
//
//   ss    = the squares' sum in eight lanes (element i in lane i % 8, each
//           lane in order), the lanes added pairwise;
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
// residuals (products split into halves, Dekker). Needs fp64.
//
// Codes go out four to a word (little end first), the row padded with
// zeros to `words` words, as the W2A8 kernel reads them.

layout(local_size_x = 64) in;

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

const float QUANT_EPS = 1e-5;

shared double lane_sum[8];
shared double dmax[64];
shared float fmax_[64];
shared int isum[64];
shared float sh_inv;

// Correctly rounded division and square root: div_rn, fdiv_rn, fsqrt_rn.
#include "exact_math.glsl"

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

    // The squares' sum, lane by lane in order; max |w x| in double.
    if (tid < 8u) {
        precise double s = 0.0;
        for (uint i = tid; i < n; i += 8u) {
            precise double v = double(x[base + i]);
            s = s + v * v;
        }
        lane_sum[tid] = s;
    }
    double m = 0.0;
    for (uint i = tid; i < n; i += 64u) {
        const double u = abs(double(w[i]) * double(x[base + i]));
        if (u > m)
            m = u;
    }
    dmax[tid] = m;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1u) {
        if (tid < h && dmax[tid + h] > dmax[tid])
            dmax[tid] = dmax[tid + h];
        barrier();
    }
    const double umax = dmax[0];
    if (tid == 0u) {
        precise double ss = ((lane_sum[0] + lane_sum[1]) + (lane_sum[2] + lane_sum[3])) +
                            ((lane_sum[4] + lane_sum[5]) + (lane_sum[6] + lane_sum[7]));
        precise float v = float(div_rn(ss, double(n))) + p.eps;
        // Non-finite sums (a NaN or an infinity in the row) take the plain
        // rule below whatever inv is.
        sh_inv = isnan(v) || isinf(v) ? 1.0 / sqrt(v) : fdiv_rn(1.0, fsqrt_rn(v));
    }
    barrier();
    const float inv = sh_inv;

    // The normed maximum in float.
    float fm = 0.0;
    for (uint i = tid; i < n; i += 64u) {
        precise float a = abs(w[i] * (x[base + i] * inv));
        if (a > fm)
            fm = a;
    }
    fmax_[tid] = fm;
    barrier();
    for (uint h = 32u; h > 0u; h >>= 1u) {
        if (tid < h && fmax_[tid + h] > fmax_[tid])
            fmax_[tid] = fmax_[tid + h];
        barrier();
    }
    const float amax = fmax_[0];
    const bool exact = amax >= QUANT_EPS && umax > 0.0 && !isinf(umax) && !isnan(umax);
    const float s = exact ? 0.0 : fdiv_rn(127.0, amax >= QUANT_EPS ? amax : QUANT_EPS);

    int total = 0;
    for (uint j = tid; j < p.words; j += 64u) {
        uint word = 0u;
        for (uint b = 0u; b < 4u; b++) {
            const uint i = 4u * j + b;
            int c = 0;
            if (i < n) {
                const float xi = x[base + i], wi = w[i];
                if (exact) {
                    precise double pr = double(wi) * double(xi);
                    if (!isnan(pr)) {
                        precise double t = 127.0 * div_rn(pr, umax);
                        c = int(roundEven(t));
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
    for (uint h = 32u; h > 0u; h >>= 1u) {
        if (tid < h)
            isum[tid] += isum[tid + h];
        barrier();
    }
    if (tid == 0u) {
        scale[row] = exact ? fdiv_rn(127.0, amax) : s;
        sums[row] = isum[0];
    }
}
