// Causal attention of decode rows with the positions split over
// workgroups (split-K, as flash-decoding does), in one dispatch:
//
//   partials  a workgroup a (row, head, block of BLOCK positions): the
//             block's scores s_t = dot_f32(q, k_t) * scale (each the CPU's
//             bits, as attention.glsl computes them), their maximum m_b,
//             p_t = exp(s_t - m_b), l_b = sum p_t and o_b[i] = sum p_t
//             v_t[i], into the partials buffer;
//   merge     by the last of a (row, head)'s workgroups to finish its
//             block (a counter a row and head): m = max m_b, l = sum l_b
//             e^(m_b - m), out[i] = (sum o_b[i] e^(m_b - m)) / l.
//
// The merge as a dispatch of its own cost its boundary (6.3 us a layer at
// context 384 on the H200 with the dispatch; the last workgroup's merge
// adds a fraction of that to the partials'). A counter is reset to zero by
// the workgroup that merges, so the counters (the partials buffer's first
// rows * n_head words) are zero before and after every dispatch; the
// blocks' partials follow them, read by the merging workgroup through
// coherent loads after its counter's atomic.
//
// attention.glsl keeps the CPU's order (the e_t summed in position order,
// each output summed over the positions in order: one workgroup a row and
// head walking every position in turn, 35 us a layer at context 384 and 93
// at 1000 on the H200, where twenty workgroups cover a decode row's heads).
// Here the sums are grouped by block, so the outputs differ from the CPU's
// by roundings (within 1e-6 of the largest, tests/test_vulkan_ops.c); the
// backend takes this form for decode steps and the exact one for prompt
// rows, which already spread over a workgroup a row and head.
//
// A row whose sequence, position or blocks fall outside the tables, the
// cache or the partials gets NaN, as attention.glsl's.

#define THREADS 128u
#define BLOCK 64u // positions a partials workgroup (BN_VK_SPLIT_BLOCK)
#define MAX_HD 512u
#define MERGE_CHUNK 512u // blocks whose weights the merge holds at once

layout(local_size_x = 128) in;

// Bindings 0 to 4 and 6 (the rows, the tables, q, the caches, att):
// attention_keys.glsl.
// [rows][n_head] counters, then [rows][n_head][blocks][2 + head_dim]: m_b,
// l_b, o_b (at part_at)
layout(std430, binding = 5) coherent buffer Partials { float part[]; };
layout(std430, binding = 5) coherent buffer Counters { uint counts[]; }; // the same buffer

#define ATTN_EXTENT blocks // partial blocks a (row, head): positions up to blocks BLOCK
#include "attention_params.glsl"

#include "exact_math.glsl"

shared float q_sh[MAX_HD];
shared float red[THREADS];
shared float p_sh[BLOCK];
shared uint at_sh[BLOCK];
shared float w_sh[MERGE_CHUNK];
shared bool bad, last;

#define NAN_F uintBitsToFloat(0x7fc00000u)
#define NEG_INF uintBitsToFloat(0xff800000u)

#define KEY_CHUNK 64u // a key's values loaded at once (attention_keys.glsl)
#define TREE_N THREADS // its tree_max over red
#include "attention_keys.glsl"

// The row's sequence and position count, or false when it falls outside
// (the same for the whole workgroup).
bool row_ok(uint row, out uint seq, out uint n_pos)
{
    const int seq_i = info[2u * row], pos = info[2u * row + 1u];
    seq = 0u;
    n_pos = 0u;
    if (seq_i < 0 || uint(seq_i) >= p.n_seq || pos < 0 || uint(pos) >= p.blocks * BLOCK ||
        uint(pos) / p.block_size >= p.max_blocks)
        return false;
    seq = uint(seq_i);
    n_pos = uint(pos) + 1u;
    return true;
}

// Workgroup-wide maximum (NaN never wins, as the CPU's s > m) and sum.
#ifdef SUBGROUP
// By the subgroups' operations, then a slot a subgroup (NaN made -inf
// first: the subgroup maximum's NaN rule is the driver's).
shared float red_sg[THREADS];
float reduce_max(float v)
{
    const float m = subgroupMax(isnan(v) ? NEG_INF : v);
    barrier(); // red_sg's last use is over
    if (subgroupElect())
        red_sg[gl_SubgroupID] = m;
    barrier();
    float r = red_sg[0];
    for (uint g = 1u; g < gl_NumSubgroups; g++)
        r = red_sg[g] > r ? red_sg[g] : r;
    return r;
}

float reduce_sum(float v)
{
    const float t = subgroupAdd(v);
    barrier();
    if (subgroupElect())
        red_sg[gl_SubgroupID] = t;
    barrier();
    precise float r = 0.0;
    for (uint g = 0u; g < gl_NumSubgroups; g++)
        r = r + red_sg[g];
    return r;
}
#else
float reduce_max(float v) { return tree_max(v); }

float reduce_sum(float v)
{
    const uint tid = gl_LocalInvocationID.x;
    barrier();
    red[tid] = v;
    barrier();
    for (uint h = THREADS / 2u; h > 0u; h >>= 1u) {
        if (tid < h)
            red[tid] = red[tid] + red[tid + h];
        barrier();
    }
    return red[0];
}
#endif

// Where the partials start in the buffer (after the counters).
uint part_at() { return p.rows * p.n_head; }

// Block b of item (row, head) into the partials: row_ok has held, the
// block holds positions.
void block_partial(uint item, uint b, uint seq, uint n_pos)
{
    const uint tid = gl_LocalInvocationID.x;
    const uint h = item % p.n_head, hd = p.head_dim, kv_off = (h / p.group) * hd;
    const uint t0 = b * BLOCK, cnt = min(BLOCK, n_pos - t0);
    if (tid == 0u)
        bad = false;
    for (uint i = tid; i < hd; i += THREADS)
        q_sh[i] = q[item * hd + i];
    barrier();
    float s = NEG_INF;
    if (tid < cnt) {
        bool ok = true;
        const uint kb = kv_at(seq, t0 + tid, ok) + kv_off;
        if (ok)
            s = score(kb);
        else
            bad = true;
        at_sh[tid] = kb;
    }
    const float m = reduce_max(s);
    const uint base = part_at() + (item * p.blocks + b) * (2u + hd);
    if (bad) { // read after reduce_max's barriers: the same for everyone
        if (tid == 0u)
            part[base] = NAN_F;
        return;
    }
    float e = 0.0;
    if (tid < cnt) {
        precise float d = s - m;
        e = exp_rn(d);
        p_sh[tid] = e;
    }
    const float l = reduce_sum(e); // its barriers also publish p_sh
    for (uint i = tid; i < hd; i += THREADS) {
        // Sixteen positions' values loaded at a time, then added (all 64 at
        // once: 13.8-14.0 us a layer against 15.2 at context 384, but 53.7
        // against 32.4 at 4000, where 1260 workgroups want the SMs' room).
        precise float o = 0.0;
        for (uint k0 = 0u; k0 < cnt; k0 += 16u) {
            float vv[16];
            for (uint k = 0u; k < 16u; k++)
                vv[k] = k0 + k < cnt ? vc[at_sh[k0 + k] + i] : 0.0;
            for (uint k = 0u; k < 16u && k0 + k < cnt; k++)
                o = o + p_sh[k0 + k] * vv[k];
        }
        part[base + 2u + i] = o;
    }
    if (tid == 0u) {
        part[base] = m;
        part[base + 1u] = l;
    }
}

// Item (row, head)'s nb blocks merged into att (a bad block, NaN, makes
// the row NaN).
void merge(uint item, uint nb)
{
    const uint tid = gl_LocalInvocationID.x, hd = p.head_dim;
    const uint rbase = part_at() + item * p.blocks * (2u + hd);
    // The largest block maximum; a bad block (NaN) makes the row NaN.
    float m = NEG_INF;
    bool nan_block = false;
    for (uint b = tid; b < nb; b += THREADS) {
        const float mb = part[rbase + b * (2u + hd)];
        nan_block = nan_block || isnan(mb);
        m = mb > m ? mb : m;
    }
    if (tid == 0u)
        bad = false;
    barrier();
    if (nan_block)
        bad = true;
    m = reduce_max(m);
    if (bad) {
        for (uint i = tid; i < hd; i += THREADS)
            att[item * hd + i] = NAN_F;
        return;
    }
    // l = sum l_b w_b and out = sum o_b w_b, w_b = e^(m_b - m), a chunk of
    // blocks' weights in shared memory at a time.
    float l_part = 0.0;
    precise float o[MAX_HD / THREADS];
    for (uint j = 0u; j < MAX_HD / THREADS; j++)
        o[j] = 0.0;
    for (uint c = 0u; c < nb; c += MERGE_CHUNK) {
        const uint cn = min(MERGE_CHUNK, nb - c);
        barrier(); // the chunk before is used up
        for (uint k = tid; k < cn; k += THREADS) {
            const uint at = rbase + (c + k) * (2u + hd);
            precise float d = part[at] - m;
            const float w = exp_rn(d);
            w_sh[k] = w;
            l_part = l_part + part[at + 1u] * w;
        }
        barrier();
        for (uint j = 0u; j < MAX_HD / THREADS; j++) {
            const uint i = tid + j * THREADS;
            if (i >= hd)
                continue;
            // Sixteen blocks' values loaded at a time, then added in block
            // order, the same sums (one at a time, each load waited for:
            // 16.5 us a layer at context 4000 on the H200, 10.0 this way).
            for (uint k0 = 0u; k0 < cn; k0 += 16u) {
                float ov[16];
                for (uint k = 0u; k < 16u; k++)
                    ov[k] = k0 + k < cn ? part[rbase + (c + k0 + k) * (2u + hd) + 2u + i] : 0.0;
                for (uint k = 0u; k < 16u && k0 + k < cn; k++)
                    o[j] = o[j] + ov[k] * w_sh[k0 + k];
            }
        }
    }
    const float l = reduce_sum(l_part);
    const float inv = fdiv_rn(1.0, l);
    for (uint j = 0u; j < MAX_HD / THREADS; j++) {
        const uint i = tid + j * THREADS;
        if (i < hd) {
            precise float r = o[j] * inv;
            att[item * hd + i] = r;
        }
    }
}

void main()
{
    const uint g = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint item = g / p.blocks, b = g % p.blocks, tid = gl_LocalInvocationID.x;
    uint seq, n_pos;
    if (item >= p.rows * p.n_head)
        return; // the whole workgroup
    if (!row_ok(item / p.n_head, seq, n_pos)) { // no blocks to merge: NaN
        if (b == 0u)
            for (uint i = tid; i < p.head_dim; i += THREADS)
                att[item * p.head_dim + i] = NAN_F;
        return;
    }
    const uint nb = (n_pos + BLOCK - 1u) / BLOCK; // the row's blocks
    if (b >= nb)
        return; // no positions here; the merge reads only the row's blocks
    block_partial(item, b, seq, n_pos);
    // The last of the item's blocks to finish merges them: every
    // invocation's writes before the count, the merge's reads after it.
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) {
        last = atomicAdd(counts[item], 1u) == nb - 1u;
        if (last)
            counts[item] = 0u; // every block has counted: ready for the next dispatch
    }
    barrier();
    if (last) {
        memoryBarrierBuffer();
        merge(item, nb);
    }
}
