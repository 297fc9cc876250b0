#version 450
// One workgroup of 256: `rounds` shared-memory tree sums of eight levels,
// each feeding the next (what the norm's reductions cost: a barrier a
// level). Out[0] = the last round's sum.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { uint o[]; };
layout(push_constant) uniform Params { uint rounds; } p;
shared uint red[256];
void main()
{
    const uint tid = gl_LocalInvocationID.x;
    uint v = tid;
    for (uint r = 0u; r < p.rounds; r++) {
        red[tid] = v;
        barrier();
        for (uint h = 128u; h > 0u; h >>= 1u) {
            if (tid < h)
                red[tid] += red[tid + h];
            barrier();
        }
        v = red[0] + tid; // every invocation reads the sum, then the next round
        barrier();
    }
    if (tid == 0u)
        o[0] = red[0];
}
