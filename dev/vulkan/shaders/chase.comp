#version 450
// One invocation follows `steps` indices through a buffer, each load
// waiting on the one before: global memory's latency, one load at a time.
layout(local_size_x = 1) in;
layout(std430, binding = 0) buffer Next { uint next[]; };
layout(push_constant) uniform Params { uint steps; uint out_at; } p;
void main()
{
    uint i = 0u;
    for (uint s = 0u; s < p.steps; s++)
        i = next[i];
    next[p.out_at] = i;
}
