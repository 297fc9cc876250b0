#version 450
#extension GL_GOOGLE_include_directive : require
// LM head logits: logits[r * ld + first + j] = dot_f32(head row j, x row r)
// for the head rows j < n_rows of this part (row j of the buffer is the
// vocabulary's row first + j) and every x row r, in the CPU's arithmetic
// (head_row_logits, cpu_backend.c): eight lanes, element i in lane i % 8,
// each lane in order (multiply, then add), the lanes added
// ((0+1)+(2+3))+((4+5)+(6+7)).
//
// Eight invocations a head row, one a lane: exactly dot_f32's lanes, and
// neighbouring invocations read neighbouring values. A workgroup takes
// eight head rows and the x rows four at a time (each head value read
// once for four of them). F16 rows: two halves to a 32-bit word, the
// element of even index in the low half, converted exactly (by the bits:
// subnormal halves too, whatever the device does with them).

layout(local_size_x = 64) in;

layout(std430, binding = 0) readonly buffer Head { uint head[]; }; // F32 bits or F16 pairs
layout(std430, binding = 1) readonly buffer X { float x[]; };      // [rows][dim]
layout(std430, binding = 2) writeonly buffer Logits { float logits[]; };

layout(push_constant) uniform Params {
    uint n_rows;   // head rows in this part
    uint dim;
    uint rows;     // x rows
    uint ld;       // logits a row
    uint first;    // vocabulary row of the part's row 0
    uint f16;      // 1: F16 rows, 0: F32 rows
} p;

shared float part[4][64];

#include "half_bits.glsl"

void main()
{
    const uint group = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint tid = gl_LocalInvocationID.x, lane = tid & 7u, slot = tid >> 3;
    const uint j = group * 8u + slot;
    const bool live = j < p.n_rows;
    const uint dim = p.dim;

    for (uint r0 = 0u; r0 < p.rows; r0 += 4u) {
        // Past the last x row, repeat it: the sums are computed, not written.
        const uint last = p.rows - 1u;
        const uint x0 = r0 * dim, x1 = min(r0 + 1u, last) * dim;
        const uint x2 = min(r0 + 2u, last) * dim, x3 = min(r0 + 3u, last) * dim;
        precise float a0 = 0.0, a1 = 0.0, a2 = 0.0, a3 = 0.0;
        if (live) {
            if (p.f16 != 0u) {
                const uint hb = j * (dim / 2u);
                for (uint i = lane; i < dim; i += 8u) {
                    const uint word = head[hb + i / 2u];
                    const float w =
                        half_bits_to_float((i & 1u) != 0u ? word >> 16 : word & 0xffffu);
                    a0 = a0 + w * x[x0 + i];
                    a1 = a1 + w * x[x1 + i];
                    a2 = a2 + w * x[x2 + i];
                    a3 = a3 + w * x[x3 + i];
                }
            } else {
                const uint hb = j * dim;
                for (uint i = lane; i < dim; i += 8u) {
                    const float w = uintBitsToFloat(head[hb + i]);
                    a0 = a0 + w * x[x0 + i];
                    a1 = a1 + w * x[x1 + i];
                    a2 = a2 + w * x[x2 + i];
                    a3 = a3 + w * x[x3 + i];
                }
            }
        }
        part[0][tid] = a0;
        part[1][tid] = a1;
        part[2][tid] = a2;
        part[3][tid] = a3;
        barrier();
        if (live && lane == 0u) {
            for (uint k = 0u; k < 4u && r0 + k < p.rows; k++) {
                const uint b = tid;
                precise float s =
                    ((part[k][b] + part[k][b + 1u]) + (part[k][b + 2u] + part[k][b + 3u])) +
                    ((part[k][b + 4u] + part[k][b + 5u]) + (part[k][b + 6u] + part[k][b + 7u]));
                logits[(r0 + k) * p.ld + p.first + j] = s;
            }
        }
        barrier();
    }
}
