#version 450
// Nothing but a guarded store no invocation makes: what a dispatch costs
// before any work.
layout(local_size_x = 256) in;
layout(std430, binding = 0) buffer Out { uint o[]; };
layout(push_constant) uniform Params { uint never; } p;
void main()
{
    if (gl_GlobalInvocationID.x == p.never)
        o[0] = 1u;
}
