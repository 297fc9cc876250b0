// out = w * (x * inv) for one row a workgroup, the CPU's rmsnorm bit for
// bit (cpu_backend.c; the final norm before the LM head):
//
//   ss  = sum of x[i]^2 in double, in order i = 0 .. n-1;
//   inv = 1 / sqrtf((float)(ss / n) + eps).
//
// The order of a double sum decides its rounding, so one invocation adds
// the squares (each exact in double) one after another; the workgroup
// loads them into shared memory 256 at a time. ss / n, the square root and
// the division are made correctly rounded as C's are (exact_math.glsl).
// That is the variant with BN_FP64 (rmsnorm_f64.comp); without
// (rmsnorm.comp, devices without fp64) the sum is float and the division
// and square root the device's: within a few roundings of the CPU's.

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
shared float sh_inv;

void main()
{
    const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows)
        return; // the whole workgroup: no barrier is left waiting
    const uint tid = gl_LocalInvocationID.x;
    const uint n = p.n, base = row * n;

    precise REAL ss = 0.0; // invocation 0's
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
