#version 450
// A matrix-vector product's read without the arithmetic: workgroups of 256
// read `words` 32-bit words each, 16 bytes an invocation at a time, and
// fold them into one word a workgroup (so the loads cannot be dropped).
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer In { uvec4 w[]; };
layout(std430, binding = 1) buffer Out { uint o[]; };
layout(push_constant) uniform Params { uint vec4s; } p; // uvec4s a workgroup
shared uint red[256];
void main()
{
    const uint g = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uint acc = 0u;
    for (uint i = tid; i < p.vec4s; i += 256u) {
        const uvec4 v = w[g * p.vec4s + i];
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    red[tid] = acc;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1u) {
        if (tid < h)
            red[tid] ^= red[tid + h];
        barrier();
    }
    if (tid == 0u)
        o[g] = red[0];
}
