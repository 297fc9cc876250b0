// Causal attention of one query row and one KV head's query heads (the
// group, at most MAX_G) a workgroup, in the CPU's arithmetic: for each
// query head exactly what attention.glsl computes (the same scores, in
// the same eight lanes; the same softmax, its e_t summed in position
// order; the same weighted sums in position order), bit for bit. Each
// key and value is loaded once for the group's heads: a pass of many rows
// (a prompt's chunk) otherwise reads every key and value of its KV head
// once a query head, 5 GB a layer of the 2B-4T shape at 4000 positions
// for 64 rows.
//
// Scores: invocation tid takes positions tid, tid + WG, ..., each key's
// dot with every head of the group, into scratch (each head's row of it,
// as attention.glsl). The e_t of WG positions at a time go through shared
// memory; invocation g adds head g's one after another. The weighted sum
// takes one invocation a (head, element): group * head_dim of them, at
// most WG (the host takes attention.glsl otherwise).
//
// Rounding and exactness as attention.glsl (exact_math.glsl with BN_FP64:
// attention_group_f64.comp; attention_group.comp the float variant).

#define WG 512u
#define MAX_G 4u     // query heads a KV head serves, at most
#define MAX_GHD 512u // the group's query values, at most (= WG)
#define VBATCH 32u   // positions' values loaded at once in the weighted sum

layout(local_size_x = 512) in;

// The scratch (binding 5) and push constants: attention_scratch.glsl.
#include "attention_scratch.glsl"

#include "exact_math.glsl"

shared float qg_sh[MAX_GHD]; // head g's query at g head_dim
shared float q_sh[1];        // attention_keys.glsl's score() is not used
shared float red[WG];
shared float e_sh[MAX_G][WG];
shared uint at_sh[WG];
shared float sh_max[MAX_G], sh_inv[MAX_G];
shared bool bad;

#define TREE_N WG // tree_max over red
#include "attention_keys.glsl"

// The scores of the key at kb against the group's G heads: each the CPU's
// dot_f32 (eight lanes, element i in lane i % 8, each in order, then
// ((0+1)+(2+3))+((4+5)+(6+7))) times scale, as score() in
// attention_keys.glsl; the key's values loaded once for all of them.
void group_scores(uint kb, uint G, out float s[MAX_G])
{
    const uint hd = p.head_dim;
    precise float acc[MAX_G][8];
    for (uint g = 0u; g < MAX_G; g++)
        for (uint l = 0u; l < 8u; l++)
            acc[g][l] = 0.0;
    const bool by_vec4 = keys_by_vec4();
    uint i = 0u;
    for (; i + KEY_CHUNK <= hd; i += KEY_CHUNK) {
        float kv[KEY_CHUNK];
        LOAD_KEY_CHUNK(kv, kb + i, by_vec4)
        for (uint g = 0u; g < MAX_G; g++)
            if (g < G)
                for (uint r = 0u; r < KEY_CHUNK; r += 8u)
                    for (uint l = 0u; l < 8u; l++)
                        acc[g][l] = acc[g][l] + qg_sh[g * hd + i + r + l] * kv[r + l];
    }
    for (; i + 8u <= hd; i += 8u)
        for (uint l = 0u; l < 8u; l++) {
            const float k = kc[kb + i + l];
            for (uint g = 0u; g < MAX_G; g++)
                if (g < G)
                    acc[g][l] = acc[g][l] + qg_sh[g * hd + i + l] * k;
        }
    for (uint l = 0u; i < hd; i++, l++) {
        const float k = kc[kb + i];
        for (uint g = 0u; g < MAX_G; g++)
            if (g < G)
                acc[g][l] = acc[g][l] + qg_sh[g * hd + i] * k;
    }
    for (uint g = 0u; g < MAX_G; g++) {
        precise float v = (((acc[g][0] + acc[g][1]) + (acc[g][2] + acc[g][3])) +
                           ((acc[g][4] + acc[g][5]) + (acc[g][6] + acc[g][7]))) *
                          p.scale;
        s[g] = v;
    }
}

void main()
{
    const uint item = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint n_kv = p.n_head / p.group, G = p.group, hd = p.head_dim;
    if (item >= p.rows * n_kv)
        return; // the whole workgroup: no barrier is left waiting
    const uint row = item / n_kv, kvh = item % n_kv, tid = gl_LocalInvocationID.x;
    const uint h0 = kvh * G;                  // the group's first query head
    const uint out0 = (row * p.n_head + h0) * hd; // head g's output at out0 + g hd
    const uint kv_off = kvh * hd;
    const int seq_i = info[2u * row], pos = info[2u * row + 1u];
    // The same for the whole workgroup, so returning is too.
    if (seq_i < 0 || uint(seq_i) >= p.n_seq || pos < 0 || uint(pos) >= p.stride ||
        uint(pos) / p.block_size >= p.max_blocks) {
        for (uint i = tid; i < G * hd; i += WG)
            att[out0 + i] = uintBitsToFloat(0x7fc00000u);
        return;
    }
    const uint seq = uint(seq_i), n_pos = uint(pos) + 1u;
    const uint sbase = (row * p.n_head + h0) * p.stride; // head g's scores at + g stride

    if (tid == 0u)
        bad = false;
    for (uint i = tid; i < G * hd; i += WG)
        qg_sh[i] = q[out0 + i];
    barrier();

    // Scores and each head's maximum.
    float m[MAX_G];
    for (uint g = 0u; g < MAX_G; g++)
        m[g] = uintBitsToFloat(0xff800000u);
    for (uint t = tid; t < n_pos; t += WG) {
        bool ok = true;
        const uint kb = kv_at(seq, t, ok) + kv_off;
        if (!ok) {
            bad = true;
            continue;
        }
        float s[MAX_G];
        group_scores(kb, G, s);
        for (uint g = 0u; g < MAX_G; g++)
            if (g < G) {
                scratch[sbase + g * p.stride + t] = s[g];
                m[g] = s[g] > m[g] ? s[g] : m[g];
            }
    }
    for (uint g = 0u; g < MAX_G; g++) {
        const float mg = tree_max(m[g]);
        if (tid == 0u)
            sh_max[g] = mg;
    }
    barrier();
    if (bad) { // read after a barrier: the same for every invocation
        for (uint i = tid; i < G * hd; i += WG)
            att[out0 + i] = uintBitsToFloat(0x7fc00000u);
        return;
    }

    // e_t, each head's summed in position order by invocation g.
    precise float sum = 0.0;
    for (uint c = 0u; c < n_pos; c += WG) {
        const uint t = c + tid;
        if (t < n_pos)
            for (uint g = 0u; g < MAX_G; g++)
                if (g < G) {
                    precise float d = scratch[sbase + g * p.stride + t] - sh_max[g];
                    const float e = exp_rn(d);
                    scratch[sbase + g * p.stride + t] = e;
                    e_sh[g][tid] = e;
                }
        barrier();
        if (tid < G) {
            const uint cnt = min(WG, n_pos - c);
            for (uint k = 0u; k < cnt; k++)
                sum = sum + e_sh[tid][k];
        }
        barrier();
    }
    if (tid < G) {
        // sum >= 1 unless a score was NaN or infinite: then what C's 1.0f / sum gives.
        if (sum > 0.0 && !isinf(sum))
            sh_inv[tid] = fdiv_rn(1.0, sum);
        else
            sh_inv[tid] = isinf(sum) ? 0.0 : uintBitsToFloat(0x7fc00000u);
    }
    barrier();

    // out[g][i] = sum over t of (e_t inv) v_t[i], from 0, multiply then add:
    // invocation tid takes head tid / hd's element tid % hd.
    const uint og = tid / hd, oi = tid % hd;
    const bool owns = tid < G * hd;
    precise float o = 0.0;
    for (uint c = 0u; c < n_pos; c += WG) {
        const uint t = c + tid;
        if (t < n_pos) {
            bool ok = true;
            at_sh[tid] = kv_at(seq, t, ok) + kv_off;
            for (uint g = 0u; g < MAX_G; g++)
                if (g < G) {
                    precise float pr = scratch[sbase + g * p.stride + t] * sh_inv[g];
                    e_sh[g][tid] = pr;
                }
        }
        barrier();
        const uint cnt = min(WG, n_pos - c);
        if (owns)
            for (uint k0 = 0u; k0 < cnt; k0 += VBATCH) {
                const uint kn = min(VBATCH, cnt - k0);
                float vv[VBATCH];
                for (uint k = 0u; k < VBATCH; k++)
                    vv[k] = k < kn ? vc[at_sh[k0 + k] + oi] : 0.0;
                for (uint k = 0u; k < kn; k++)
                    o = o + e_sh[og][k0 + k] * vv[k];
            }
        barrier();
    }
    if (owns)
        att[out0 + tid] = o;
}
