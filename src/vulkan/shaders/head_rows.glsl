// LM head logits as head_matvec.comp computes them (dot_f32: eight lanes,
// element i in lane i % 8, each lane in order, multiply then add, the
// lanes added ((0+1)+(2+3))+((4+5)+(6+7))), for dims that are a multiple
// of 8: one invocation a head row and XROWS x rows holds all eight lanes
// of each, so each step loads eight of the head row's values at once (16
// bytes of F16, 32 of F32). head_matvec_row1.comp takes one x row, for a
// decode step's single row, with a quarter of the accumulators (NVIDIA's
// H200, 128256 F16 rows of 2560: 665 us for one row through the four-row
// kernel, which computed it four times, 385 us through this one);
// head_matvec_rows.comp four, each head value read once for four.
// head_matvec_rows16.comp spreads a head row over XGROUPS neighbouring
// invocations, each four x rows of sixteen: they read the same head values
// together, so the head is read once for sixteen x rows, not four. Each
// logit's sums are the same in every form.

#ifndef XGROUPS
#define XGROUPS 1u
#endif
const uint kHeadRows = 64u / XGROUPS; // head rows a workgroup

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Head { uvec4 head4[]; }; // F32 bits or F16 pairs
layout(std430, binding = 1) readonly buffer X { vec4 x4[]; };        // [rows][dim]
layout(std430, binding = 2) writeonly buffer Logits { float logits[]; };

layout(push_constant) uniform Params {
    uint n_rows;   // head rows in this part
    uint dim;      // a multiple of 8
    uint rows;     // x rows
    uint ld;       // logits a row
    uint first;    // vocabulary row of the part's row 0
    uint f16;      // 1: F16 rows, 0: F32 rows
} p;

#include "half_bits.glsl"

void main()
{
    const uint j = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * kHeadRows +
                   gl_LocalInvocationID.x / XGROUPS;
    const uint group = gl_LocalInvocationID.x % XGROUPS; // x rows 4 group .. of each 16
    if (j >= p.n_rows)
        return; // no barriers here
    const uint steps = p.dim / 8u, d4 = p.dim / 4u;
    // Step s of row j in uvec4s: (j * steps + s) * per.
    const uint per = p.f16 != 0u ? 1u : 2u;
    for (uint r0 = group * XROWS; r0 < p.rows; r0 += XROWS * XGROUPS) {
        const uint last = p.rows - 1u;
        uint xr[XROWS];
        for (uint k = 0u; k < XROWS; k++)
            xr[k] = min(r0 + k, last) * d4; // past the last x row, repeat it (not written)
        precise float acc[XROWS][8];
        for (uint k = 0u; k < XROWS; k++)
            for (uint l = 0u; l < 8u; l++)
                acc[k][l] = 0.0;
        for (uint s = 0u; s < steps; s++) {
            const uint at = (j * steps + s) * per;
            float w[8];
            if (p.f16 != 0u) {
                const uvec4 h = head4[at]; // 8 halves, even index low
                for (uint e = 0u; e < 4u; e++) {
                    w[2u * e] = half_bits_to_float(h[e] & 0xffffu);
                    w[2u * e + 1u] = half_bits_to_float(h[e] >> 16);
                }
            } else {
                const uvec4 a = head4[at], b = head4[at + 1u];
                for (uint e = 0u; e < 4u; e++) {
                    w[e] = uintBitsToFloat(a[e]);
                    w[4u + e] = uintBitsToFloat(b[e]);
                }
            }
            for (uint k = 0u; k < XROWS; k++) {
                const vec4 lo = x4[xr[k] + 2u * s], hi = x4[xr[k] + 2u * s + 1u];
                for (uint e = 0u; e < 4u; e++) {
                    acc[k][e] = acc[k][e] + w[e] * lo[e];
                    acc[k][4u + e] = acc[k][4u + e] + w[4u + e] * hi[e];
                }
            }
        }
        for (uint k = 0u; k < XROWS && r0 + k < p.rows; k++) {
            precise float sum = ((acc[k][0] + acc[k][1]) + (acc[k][2] + acc[k][3])) +
                                ((acc[k][4] + acc[k][5]) + (acc[k][6] + acc[k][7]));
            logits[(r0 + k) * p.ld + p.first + j] = sum;
        }
    }
}
