#version 450
// `phases` rounds of a matrix-vector product's read (stream.comp's) in ONE
// dispatch: the workgroups meet between rounds at a counter in memory (each
// adds one, then waits until all have) where a decode step's dispatches
// meet at a pipeline barrier. With prefetch, a workgroup loads its next
// round's words before it waits (weights do not depend on the round
// before). Every workgroup must be resident at once (the host keeps the
// grid within the device's room and runs it only on GPUs).
//
// Linked (p.wait > 0 or p.phases == 0): one round a dispatch, recorded with
// no barrier between dispatches; a workgroup waits until the counter reaches
// p.wait (every workgroup of the dispatches before has added its one), does
// its round and adds one: a dispatch boundary as a hand-off. With prefetch
// the round's words are loaded before the wait. The wait gives up after
// SPIN_LIMIT polls and counts the give-up in count[1].
#define SPIN_LIMIT 4000000u
layout(local_size_x = 256) in;
layout(std430, binding = 0) readonly buffer In { uvec4 w[]; };
layout(std430, binding = 1) buffer Out { uint o[]; };
layout(std430, binding = 2) coherent buffer Count { uint count[]; };
layout(push_constant) uniform Params {
    uint vec4s;    // uvec4s a workgroup a round (at most 512)
    uint phases;   // rounds
    uint slices;   // distinct slices of In (round r reads slice r % slices)
    uint prefetch; // 1: the next round's words loaded before the wait
    uint first;    // round r reads slice (first + r) % slices
    uint wait;     // linked: wait until the counter reaches this, then add one
} p;
shared uint red[256];

uvec4 load(uint phase, uint i)
{
    const uint n = gl_NumWorkGroups.x;
    return w[((p.first + phase) % p.slices) * n * p.vec4s + gl_WorkGroupID.x * p.vec4s + i];
}

void wait_for(uint target)
{
    if (gl_LocalInvocationID.x == 0u) {
        uint polls = 0u;
        while (atomicOr(count[0], 0u) < target && ++polls < SPIN_LIMIT) {
        }
        if (polls >= SPIN_LIMIT)
            atomicAdd(count[1], 1u);
    }
    barrier();
}

void linked()
{
    const uint g = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    uvec4 a = uvec4(0u), b = uvec4(0u);
    if (p.prefetch != 0u) {
        a = tid < p.vec4s ? load(0u, tid) : uvec4(0u);
        b = tid + 256u < p.vec4s ? load(0u, tid + 256u) : uvec4(0u);
    }
    wait_for(p.wait);
    if (p.prefetch == 0u) {
        a = tid < p.vec4s ? load(0u, tid) : uvec4(0u);
        b = tid + 256u < p.vec4s ? load(0u, tid + 256u) : uvec4(0u);
    }
    red[tid] = a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1u) {
        if (tid < h)
            red[tid] ^= red[tid + h];
        barrier();
    }
    if (tid == 0u) {
        o[g] = red[0];
        memoryBarrierBuffer();
        atomicAdd(count[0], 1u);
    }
}

void main()
{
    if (p.phases == 0u) {
        linked();
        return;
    }
    const uint g = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x, n = gl_NumWorkGroups.x;
    uint acc = 0u;
    uvec4 cur0 = tid < p.vec4s ? load(0u, tid) : uvec4(0u);
    uvec4 cur1 = tid + 256u < p.vec4s ? load(0u, tid + 256u) : uvec4(0u);
    for (uint r = 0u; r < p.phases; r++) {
        acc ^= cur0.x ^ cur0.y ^ cur0.z ^ cur0.w ^ cur1.x ^ cur1.y ^ cur1.z ^ cur1.w;
        uvec4 nxt0 = uvec4(0u), nxt1 = uvec4(0u);
        const bool more = r + 1u < p.phases;
        if (more && p.prefetch != 0u) {
            nxt0 = tid < p.vec4s ? load(r + 1u, tid) : uvec4(0u);
            nxt1 = tid + 256u < p.vec4s ? load(r + 1u, tid + 256u) : uvec4(0u);
        }
        if (more) { // the round's end: every workgroup arrives, then all go on
            barrier();
            if (tid == 0u) {
                atomicAdd(count[0], 1u);
                const uint target = (r + 1u) * n;
                while (atomicOr(count[0], 0u) < target) {
                }
            }
            barrier();
            if (p.prefetch == 0u) {
                nxt0 = tid < p.vec4s ? load(r + 1u, tid) : uvec4(0u);
                nxt1 = tid + 256u < p.vec4s ? load(r + 1u, tid + 256u) : uvec4(0u);
            }
        }
        cur0 = nxt0;
        cur1 = nxt1;
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
