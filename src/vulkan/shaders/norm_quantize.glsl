// RMSNorm then int8 quantization of rows, one a workgroup: norm_row.glsl
// has the rule and how it is made exact on the device.
//
// With SUBGROUP (norm_quantize_f64_sg.comp: devices with subgroup
// arithmetic) 1024 invocations and each reduction by the subgroups'
// operations, then a shared slot a subgroup; else 256 and trees in shared
// memory. The row is read from global memory (it was written by the
// dispatch before: in L2), and the codes by the exact rule, which need
// umax but not inv, are made in the same loop as the normed maximum: two
// passes over the row, not three (NVIDIA's H200, one row of 2560 and of
// 6912: 9.0 and 14.0 us a dispatch staged in three passes, 7.4 and 8.9 in
// this form with SUBGROUP; dev/vulkan/dispatch_chain.c).
#ifdef SUBGROUP
#define THREADS 1024u
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

// Correctly rounded division and square root: div_rn, fdiv_rn, fsqrt_rn;
// REAL, double or float.
#include "exact_math.glsl"

#define NORM_X(i) x[i]
#define NORM_W(i) w[i]
#define NORM_STORE(j, word) q[row * p.words + (j)] = (word)
uint row;
#include "norm_row.glsl"

void main()
{
    row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows)
        return; // the whole workgroup: no barrier is left waiting
    int total;
    const float s = norm_row(row * p.n, p.n, p.words, p.eps, total);
    if (gl_LocalInvocationID.x == 0u) {
        scale[row] = s;
        sums[row] = total;
    }
}
