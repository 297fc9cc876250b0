// out = w * (x * inv) for one row a workgroup, the CPU's rmsnorm bit for
// bit (cpu_backend.c; the final norm before the LM head):
//
//   ss  = sum of x[i]^2 in double, in order i = 0 .. n-1;
//   inv = 1 / sqrtf((float)(ss / n) + eps).
//
// The squares (each exact in double) are added by the workgroup in a tree.
// Any order of these non-negative terms lands within (n - 1) 2^-53 of the
// exact sum, so the tree's and the CPU's in-order sum are within 2 n 2^-53
// of each other, and the float the CPU rounds ss / n to is the tree's
// unless an interval that wide around its quotient holds a float rounding
// boundary (norm_quantize.glsl's test). Only then (a chance of about n
// 2^-28 for a random row) does one invocation add them in the CPU's order,
// loading them into shared memory 256 at a time (the whole step's output
// norm took 46.9 us that way on the H200). ss / n, the square root and the
// division are made correctly rounded as C's are (exact_math.glsl). That
// is the variant with BN_FP64 (rmsnorm_f64.comp); without (rmsnorm.comp,
// devices without fp64) the tree's float sum is the answer, and the
// division and square root the device's: within a few roundings of the
// CPU's.

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Rows { float x[]; };
layout(std430, binding = 1) readonly buffer Weights { float w[]; };
layout(std430, binding = 2) writeonly buffer Out { float y[]; };

layout(push_constant) uniform Params {
    uint rows;
    uint n;       // values a row
    float eps;
} p;

#include "exact_math.glsl"

shared float chunk[256];
shared REAL red[256];
shared REAL sh_ss;
shared bool sh_ordered;
shared float sh_inv;

void main()
{
    const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows)
        return; // the whole workgroup: no barrier is left waiting
    const uint tid = gl_LocalInvocationID.x;
    const uint n = p.n, base = row * n;

    precise REAL part = 0.0;
    for (uint i = tid; i < n; i += 256u) {
        precise REAL v = REAL(x[base + i]);
        part = part + v * v;
    }
    red[tid] = part;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1u) {
        if (tid < h) {
            precise REAL t = red[tid] + red[tid + h];
            red[tid] = t;
        }
        barrier();
    }
    if (tid == 0u) {
#ifdef BN_FP64
        const double mq = div_rn(red[0], double(n));
        const double d = (4.0 * double(n) + 8.0) * 1.1102230246251565e-16; // (4 n + 8) 2^-53
        sh_ordered = float(mq * (1.0 - d)) != float(mq * (1.0 + d)); // (NaN: ordered)
#else
        sh_ordered = false;
#endif
        sh_ss = red[0];
    }
    barrier();
    precise REAL ss = sh_ss; // invocation 0's
    if (sh_ordered) { // a rounding boundary near: the CPU's order (workgroup-uniform)
        ss = 0.0;
        for (uint c = 0u; c < n; c += 256u) {
            chunk[tid] = c + tid < n ? x[base + c + tid] : 0.0;
            barrier();
            if (tid == 0u) {
                const uint m = min(256u, n - c);
                for (uint k = 0u; k < m; k++) {
                    precise REAL v = REAL(chunk[k]);
                    ss = ss + v * v;
                }
            }
            barrier();
        }
    }
    if (tid == 0u) {
        precise float v = float(div_rn(ss, REAL(n))) + p.eps;
        // What C gives where the exact helpers do not apply: sqrtf(+inf)
        // = +inf and 1 / +inf = 0; 1 / +-0 = +-inf; sqrtf of a negative
        // or of NaN is NaN.
        float inv;
        if (v > 0.0 && !isinf(v))
            inv = fdiv_rn(1.0, fsqrt_rn(v));
        else if (isinf(v) && v > 0.0)
            inv = 0.0;
        else if (v == 0.0)
            inv = uintBitsToFloat((floatBitsToUint(v) & 0x80000000u) | 0x7f800000u);
        else
            inv = uintBitsToFloat(0x7fc00000u);
        sh_inv = inv;
    }
    barrier();
    const float inv = sh_inv;
    for (uint i = tid; i < n; i += 256u) {
        precise float v = w[i] * (x[base + i] * inv);
        y[base + i] = v;
    }
}
