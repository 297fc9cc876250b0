#version 450
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

// a - c b, with c b exact as a sum of two doubles (Dekker's product).
double residual(double a, double b, double c)
{
    precise double h = c * b;
    precise double tc = 134217729.0 * c;
    precise double ch = tc - (tc - c);
    precise double cl = c - ch;
    precise double tb = 134217729.0 * b;
    precise double bh = tb - (tb - b);
    precise double bl = b - bh;
    precise double l = ((ch * bh - h) + ch * bl + cl * bh) + cl * bl;
    precise double r = (a - h) - l;
    return r;
}

// The double next to positive finite v, one unit up (dir 1) or down (-1).
double step_to(double v, int dir)
{
    uvec2 b = unpackDouble2x32(v);
    if (dir > 0) {
        b.x += 1u;
        if (b.x == 0u)
            b.y += 1u;
    } else {
        if (b.x == 0u)
            b.y -= 1u;
        b.x -= 1u;
    }
    return packDouble2x32(b);
}

// a / b correctly rounded, for finite a and finite b > 0.
double div_rn(double a, double b)
{
    precise double q = abs(a) / b;
    if (q == 0.0 || isinf(q) || isnan(q))
        return a < 0.0 ? -q : q;
    const double aa = abs(a);
    for (int i = 0; i < 4; i++) {
        const double up = step_to(q, 1), down = step_to(q, -1);
        const double r = abs(residual(aa, b, q));
        if (abs(residual(aa, b, up)) < r)
            q = up;
        else if (down > 0.0 && abs(residual(aa, b, down)) < r)
            q = down;
        else
            break;
    }
    return a < 0.0 ? -q : q;
}

// Float division, correctly rounded (b finite and nonzero).
float fdiv_rn(float a, float b)
{
    precise double d = double(a) / double(b);
    return float(d);
}

// sqrtf, correctly rounded, for v >= 0 finite.
float fsqrt_rn(float v)
{
    float r = float(sqrt(double(v)));
    if (r == 0.0 || isinf(r))
        return r;
    // The midpoints around r; their squares are exact in double.
    const double lo = (double(r) + double(uintBitsToFloat(floatBitsToUint(r) - 1u))) * 0.5;
    const double hi = (double(r) + double(uintBitsToFloat(floatBitsToUint(r) + 1u))) * 0.5;
    if (double(v) < lo * lo)
        r = uintBitsToFloat(floatBitsToUint(r) - 1u);
    else if (double(v) > hi * hi)
        r = uintBitsToFloat(floatBitsToUint(r) + 1u);
    return r;
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
