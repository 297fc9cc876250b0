#version 450
// gate[i] = (g * g) * up[i] with g = max(gate[i], 0) for i < n, the CPU's
// relu2_span: NaN and -0 give g = +0. The test is on the bits (positive,
// at most +infinity), not a compare a driver could turn into a max() that
// keeps a NaN; the products are rounded one at a time, in that order.

layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer Gate { float gate[]; };
layout(std430, binding = 1) readonly buffer Up { float up[]; };

layout(push_constant) uniform Params {
    uint n;
} p;

void main()
{
    const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * 256u +
                   gl_LocalInvocationID.x;
    if (i >= p.n)
        return;
    const float x = gate[i];
    const int bits = floatBitsToInt(x);
    const float g = bits > 0 && bits <= 0x7f800000 ? x : 0.0;
    precise float v = (g * g) * up[i];
    gate[i] = v;
}
