#version 450
#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
// The decode step's split attention (src/vulkan/shaders/attention_split.glsl,
// fp64 with subgroup reductions) with a workgroup a (row, KV head, block of
// BLOCK positions) instead of a (row, query head, block): the KV head's
// group of query heads (four in the 2B-4T shape) share each key and value
// the workgroup loads, so the caches are read once a KV head, not once a
// query head, over a quarter of the workgroups. Each query head's scores,
// maximum, exp sums and weighted sums are the shipped kernel's, in its
// order; the last of a (row, KV head)'s workgroups to finish merges its
// query heads' blocks, each thread a dimension of every head. Partials:
// [rows][n_kv] counters, then the shipped layout [rows][n_head][blocks][2 +
// head_dim]. A lab copy (split_chain.c times it against the shipped one).
#define BN_FP64 1

#define THREADS 128u
#define BLOCK 64u
#define MAX_HD 128u // (the lab's shape)
#define G_MAX 4u    // query heads a KV head serves, at most
#define KEY_CHUNK 16u
#define MERGE_CHUNK 256u
layout(local_size_x = 128) in;

layout(std430, binding = 0) readonly buffer Info { int info[]; };
layout(std430, binding = 1) readonly buffer Tables { int tables[]; };
layout(std430, binding = 2) readonly buffer Q { float q[]; };
layout(std430, binding = 3) readonly buffer KCache4 { vec4 kc4[]; };
layout(std430, binding = 4) readonly buffer VCache { float vc[]; };
layout(std430, binding = 5) coherent buffer Partials { float part[]; };
layout(std430, binding = 5) coherent buffer Counters { uint counts[]; };
layout(std430, binding = 6) writeonly buffer Att { float att[]; };

#define ATTN_EXTENT blocks
#include "attention_params.glsl"

#include "exact_math.glsl"

shared float q_sh[G_MAX][MAX_HD];
shared float red[G_MAX][THREADS / 4u];
shared float p_sh[G_MAX][BLOCK];
shared uint at_sh[BLOCK];
shared float w_sh[G_MAX][MERGE_CHUNK];
shared bool last;

#define NAN_F uintBitsToFloat(0x7fc00000u)
#define NEG_INF uintBitsToFloat(0xff800000u)

uint kv_at(uint seq, uint t)
{
    const int block = tables[seq * p.max_blocks + t / p.block_size];
    return p.layer_off + (uint(block) * p.block_size + t % p.block_size) * p.kv_dim;
}

// The group's maxima (NaN never wins) and sums, every invocation getting
// them: subgroup operations, then a slot a subgroup.
void reduce_max_g(inout float v[G_MAX])
{
    barrier();
    for (uint j = 0u; j < p.group; j++) {
        const float m = subgroupMax(isnan(v[j]) ? NEG_INF : v[j]);
        if (subgroupElect())
            red[j][gl_SubgroupID] = m;
    }
    barrier();
    for (uint j = 0u; j < p.group; j++) {
        float r = red[j][0];
        for (uint g = 1u; g < gl_NumSubgroups; g++)
            r = red[j][g] > r ? red[j][g] : r;
        v[j] = r;
    }
}

void reduce_sum_g(inout float v[G_MAX])
{
    barrier();
    for (uint j = 0u; j < p.group; j++) {
        const float t = subgroupAdd(v[j]);
        if (subgroupElect())
            red[j][gl_SubgroupID] = t;
    }
    barrier();
    for (uint j = 0u; j < p.group; j++) {
        precise float r = 0.0;
        for (uint g = 0u; g < gl_NumSubgroups; g++)
            r = r + red[j][g];
        v[j] = r;
    }
}

// The scores of the key at kb with each of the group's q: the CPU's dot_f32
// (element i in lane i % 8, each lane in order, the lanes added pairwise),
// times scale; the key's values loaded once for all of them.
void scores(uint kb, out float s[G_MAX])
{
    precise float acc[G_MAX][8];
    for (uint j = 0u; j < G_MAX; j++)
        for (uint l = 0u; l < 8u; l++)
            acc[j][l] = 0.0;
    for (uint i = 0u; i < p.head_dim; i += KEY_CHUNK) {
        float kv[KEY_CHUNK];
        for (uint u = 0u; u < KEY_CHUNK / 4u; u++) {
            const vec4 a = kc4[(kb + i) / 4u + u];
            kv[4u * u] = a.x;
            kv[4u * u + 1u] = a.y;
            kv[4u * u + 2u] = a.z;
            kv[4u * u + 3u] = a.w;
        }
        for (uint j = 0u; j < G_MAX; j++)
            if (j < p.group)
                for (uint r = 0u; r < KEY_CHUNK; r += 8u)
                    for (uint l = 0u; l < 8u; l++)
                        acc[j][l] = acc[j][l] + q_sh[j][i + r + l] * kv[r + l];
    }
    for (uint j = 0u; j < G_MAX; j++) {
        precise float t = (((acc[j][0] + acc[j][1]) + (acc[j][2] + acc[j][3])) +
                           ((acc[j][4] + acc[j][5]) + (acc[j][6] + acc[j][7]))) *
                          p.scale;
        s[j] = t;
    }
}

uint part_at() { return p.rows * (p.n_head / p.group); }

// Block b of (row, KV head kvh) into the partials of its group's heads.
void block_partial(uint row, uint kvh, uint b, uint seq, uint n_pos)
{
    const uint tid = gl_LocalInvocationID.x, hd = p.head_dim, G = p.group;
    const uint t0 = b * BLOCK, cnt = min(BLOCK, n_pos - t0), h0 = kvh * G;
    for (uint i = tid; i < G * hd; i += THREADS)
        q_sh[i / hd][i % hd] = q[(row * p.n_head + h0) * hd + i];
    barrier();
    float s[G_MAX];
    for (uint j = 0u; j < G_MAX; j++)
        s[j] = NEG_INF;
    if (tid < cnt) {
        const uint kb = kv_at(seq, t0 + tid) + kvh * hd;
        scores(kb, s);
        at_sh[tid] = kb;
    }
    float m[G_MAX] = s;
    reduce_max_g(m);
    float e[G_MAX];
    for (uint j = 0u; j < G_MAX; j++) {
        e[j] = 0.0;
        if (tid < cnt && j < G) {
            precise float d = s[j] - m[j];
            e[j] = exp_rn(d);
            p_sh[j][tid] = e[j];
        }
    }
    float l[G_MAX] = e;
    reduce_sum_g(l); // its barriers also publish p_sh
    for (uint i = tid; i < hd; i += THREADS) {
        precise float o[G_MAX];
        for (uint j = 0u; j < G_MAX; j++)
            o[j] = 0.0;
        for (uint k0 = 0u; k0 < cnt; k0 += 16u) {
            float vv[16];
            for (uint k = 0u; k < 16u; k++)
                vv[k] = k0 + k < cnt ? vc[at_sh[k0 + k] + i] : 0.0;
            for (uint k = 0u; k < 16u && k0 + k < cnt; k++)
                for (uint j = 0u; j < G_MAX; j++)
                    o[j] = o[j] + p_sh[j][k0 + k] * vv[k];
        }
        for (uint j = 0u; j < G; j++)
            part[part_at() + ((row * p.n_head + h0 + j) * p.blocks + b) * (2u + hd) + 2u + i] =
                o[j];
    }
    if (tid < G) {
        const uint base = part_at() + ((row * p.n_head + h0 + tid) * p.blocks + b) * (2u + hd);
        part[base] = m[tid];
        part[base + 1u] = l[tid];
    }
}

// The nb blocks of (row, KV head kvh)'s query heads merged into att.
void merge(uint row, uint kvh, uint nb)
{
    const uint tid = gl_LocalInvocationID.x, hd = p.head_dim, G = p.group, h0 = kvh * G;
    const uint stride = p.blocks * (2u + hd);
    float m[G_MAX];
    for (uint j = 0u; j < G_MAX; j++) {
        m[j] = NEG_INF;
        if (j < G)
            for (uint b = tid; b < nb; b += THREADS) {
                const float mb = part[part_at() + (row * p.n_head + h0 + j) * stride +
                                      b * (2u + hd)];
                m[j] = mb > m[j] ? mb : m[j];
            }
    }
    reduce_max_g(m);
    float l[G_MAX];
    precise float o[G_MAX];
    for (uint j = 0u; j < G_MAX; j++) {
        l[j] = 0.0;
        o[j] = 0.0;
    }
    for (uint c = 0u; c < nb; c += MERGE_CHUNK) {
        const uint cn = min(MERGE_CHUNK, nb - c);
        barrier(); // the chunk before is used up
        for (uint k = tid; k < cn; k += THREADS)
            for (uint j = 0u; j < G; j++) {
                const uint at = part_at() + (row * p.n_head + h0 + j) * stride + (c + k) * (2u + hd);
                precise float d = part[at] - m[j];
                const float w = exp_rn(d);
                w_sh[j][k] = w;
                l[j] = l[j] + part[at + 1u] * w;
            }
        barrier();
        if (tid < hd)
            for (uint j = 0u; j < G; j++) {
                const uint rb = part_at() + (row * p.n_head + h0 + j) * stride + 2u + tid;
                for (uint k0 = 0u; k0 < cn; k0 += 16u) {
                    float ov[16];
                    for (uint k = 0u; k < 16u; k++)
                        ov[k] = k0 + k < cn ? part[rb + (c + k0 + k) * (2u + hd)] : 0.0;
                    for (uint k = 0u; k < 16u && k0 + k < cn; k++)
                        o[j] = o[j] + ov[k] * w_sh[j][k0 + k];
                }
            }
    }
    reduce_sum_g(l);
    if (tid < hd)
        for (uint j = 0u; j < G; j++) {
            precise float r = o[j] * fdiv_rn(1.0, l[j]);
            att[(row * p.n_head + h0 + j) * hd + tid] = r;
        }
}

void main()
{
    const uint g = gl_WorkGroupID.x, n_kv = p.n_head / p.group;
    const uint item = g / p.blocks, b = g % p.blocks, tid = gl_LocalInvocationID.x;
    if (item >= p.rows * n_kv)
        return;
    const uint row = item / n_kv, kvh = item % n_kv;
    const uint seq = uint(info[2u * row]), n_pos = uint(info[2u * row + 1u]) + 1u;
    const uint nb = (n_pos + BLOCK - 1u) / BLOCK;
    if (b >= nb)
        return;
    block_partial(row, kvh, b, seq, n_pos);
    memoryBarrierBuffer();
    barrier();
    if (tid == 0u) {
        last = atomicAdd(counts[item], 1u) == nb - 1u;
        if (last)
            counts[item] = 0u;
    }
    barrier();
    if (last) {
        memoryBarrierBuffer();
        merge(row, kvh, nb);
    }
}
