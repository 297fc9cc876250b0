#version 450
// The greedy token of each of `rows` logit rows (vk_ops.h,
// bn_vk_argmax_record): the sampler's greedy rule as bn_vk_greedy_pick
// applies it on the host - the largest finite logit, the lowest token
// among equal ones; any +infinity wins over them (the lowest such token);
// NaN and -infinity never; -1 where nothing is left. A workgroup a row:
// each invocation scans its tokens t = tid, tid + 256, ... in order, then
// the candidates meet in a tree. Comparisons only: exact.

layout(local_size_x = 256) in;

layout(std430, binding = 0) readonly buffer Logits { float logits[]; };
layout(std430, binding = 1) writeonly buffer Picks { int picks[]; };

layout(push_constant) uniform Params {
    uint rows;
    uint vocab; // logits a row
    uint first; // the first row's index in logits
} p;

shared float best_v[256];
shared int best_t[256], inf_t[256];

// Whether candidate (v, t) beats (bv, bt): a larger value, or an equal
// one at a lower token (bt < 0: none yet).
bool beats(float v, int t, float bv, int bt)
{
    return bt < 0 || v > bv || (v == bv && t < bt);
}

void main()
{
    const uint row = gl_WorkGroupID.x, tid = gl_LocalInvocationID.x;
    if (row >= p.rows)
        return; // the whole workgroup
    const uint base = (p.first + row) * p.vocab;
    float bv = 0.0;
    int bt = -1, it = -1;
    for (uint t = tid; t < p.vocab; t += 256u) {
        const float v = logits[base + t];
        if (isnan(v) || (isinf(v) && v < 0.0))
            continue;
        if (isinf(v)) {
            if (it < 0)
                it = int(t); // the first in this invocation's order is its lowest
            continue;
        }
        if (beats(v, int(t), bv, bt)) {
            bv = v;
            bt = int(t);
        }
    }
    best_v[tid] = bv;
    best_t[tid] = bt;
    inf_t[tid] = it;
    barrier();
    for (uint h = 128u; h > 0u; h >>= 1u) {
        if (tid < h) {
            const int ot = best_t[tid + h], oi = inf_t[tid + h];
            if (ot >= 0 && beats(best_v[tid + h], ot, best_v[tid], best_t[tid])) {
                best_v[tid] = best_v[tid + h];
                best_t[tid] = ot;
            }
            if (oi >= 0 && (inf_t[tid] < 0 || oi < inf_t[tid]))
                inf_t[tid] = oi;
        }
        barrier();
    }
    if (tid == 0u)
        picks[row] = inf_t[0] >= 0 ? inf_t[0] : best_t[0];
}
