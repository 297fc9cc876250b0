#version 450
// x[i] += y[i] for i < n: the residual add, one float add an element, as
// the CPU's (precise: the sum is rounded once, nothing fused into it).

layout(local_size_x = 256) in;

layout(std430, binding = 0) buffer X { float x[]; };
layout(std430, binding = 1) readonly buffer Y { float y[]; };

layout(push_constant) uniform Params {
    uint n;
} p;

void main()
{
    const uint i = (gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x) * 256u +
                   gl_LocalInvocationID.x;
    if (i >= p.n)
        return;
    precise float v = x[i] + y[i];
    x[i] = v;
}
