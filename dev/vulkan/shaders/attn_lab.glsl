// LAB COPY of src/vulkan/shaders/attention.glsl as it was at commit e972fe2,
// with switches (attention_chain.c):
//   STOP_SCORES   return after the scores and their maximum (att = max)
//   STOP_SOFTMAX  return after the softmax's sum (att = 1 / sum)
//   SUM8          invocation 0 adds the e_t eight loaded at a time (in order)
//   SCORE_VEC4    the keys read 16 bytes a load (where head_dim, kv_dim
//                 and the layer's offset are multiples of 4), not 4
//   VEC4_LOADS    the shipped arithmetic, its 16 values of a key loaded as
//                 four vec4s
//   SCORE_LANES   a score by 8 invocations, one dot_f32 lane each (its
//                 head_dim / 8 values loaded at once), the lanes combined
//                 ((0+1)+(2+3))+((4+5)+(6+7)) by subgroup shuffles
// The variants without STOP_ must give the shipped kernel's bits.
//
// Causal attention of one query row and one head a workgroup, in the CPU's
// arithmetic (attention_slot, cpu_backend.c), over positions 0 .. pos of
// the row's sequence, each at its cache row through the block table:
//
//   s_t = dot_f32(q, k_t) * scale   (eight lanes, element i in lane i % 8,
//                                    each lane in order, then
//                                    ((0+1)+(2+3))+((4+5)+(6+7)))
//   max = the largest s_t;  e_t = exp(s_t - max);  sum = e_0 + e_1 + ...
//   inv = 1 / sum;          out = sum over t in order of (e_t inv) v_t
//
// Scores: invocation tid takes positions tid, tid + 128, ..., a whole dot
// each, into scratch. The float sum of the e_t and the output sums are
// kept in position order: the e_t of 128 positions at a time go through
// shared memory, invocation 0 adds them one after another; then each
// invocation owns output elements and adds (e_t inv) v_t[i] over t.
// Every scratch value is read back by the invocation that wrote it.
// Rounding: precise everywhere (no fused multiply-add), 1 / sum correctly
// rounded through double (exact_math.glsl); exp is exp_rn, not libm's
// expf: that is the one difference from the CPU. That is the variant with
// BN_FP64 (attention_f64.comp); without (attention.comp, devices without
// fp64) 1 / sum and exp are the device's float ones.
//
// A row whose sequence, position or blocks fall outside the tables, the
// cache or the scratch row gets NaN (the host cannot check device data).

#define WG 128u
#define MAX_HD 512u
#define VBATCH 32u // values of positions loaded at once in the weighted sum

layout(local_size_x = 128) in;

layout(std430, binding = 0) readonly buffer Info { int info[]; };   // [rows][2]: seq, pos
layout(std430, binding = 1) readonly buffer Tables { int tables[]; }; // [n_seq][max_blocks]
layout(std430, binding = 2) readonly buffer Q { float q[]; };       // [rows][n_head * head_dim]
#ifdef KC_VEC4_ONLY // the keys' buffer as vec4s only (no aliased views)
layout(std430, binding = 3) readonly buffer KCache4 { vec4 kc4[]; };
#define KC(i) kc4[(i) >> 2][(i) & 3u]
#else
layout(std430, binding = 3) readonly buffer KCache { float kc[]; };
layout(std430, binding = 3) readonly buffer KCache4 { vec4 kc4[]; }; // the same buffer
#define KC(i) kc[i]
#endif
layout(std430, binding = 4) readonly buffer VCache { float vc[]; };
layout(std430, binding = 5) buffer Scratch { float scratch[]; };    // [rows][n_head][stride]
layout(std430, binding = 6) writeonly buffer Att { float att[]; };  // as q

#define ATTN_EXTENT stride // scratch floats a (row, head)
#include "attention_params.glsl"

#include "exact_math.glsl"

shared float q_sh[MAX_HD];
shared float red[WG];
shared float e_sh[WG];
shared uint at_sh[WG];
shared bool bad;
shared float sh_inv;

// Where position t of sequence seq starts in the cache (floats), or
// ok = false when its block is outside the cache.
uint kv_at(uint seq, uint t, inout bool ok)
{
    const int block = tables[seq * p.max_blocks + t / p.block_size];
    if (block < 0 || uint(block) >= p.cache_rows / p.block_size + 1u) {
        ok = false;
        return 0u;
    }
    const uint cr = uint(block) * p.block_size + t % p.block_size;
    ok = ok && cr < p.cache_rows;
    return p.layer_off + cr * p.kv_dim;
}

void write_nan(uint out_base)
{
    for (uint i = gl_LocalInvocationID.x; i < p.head_dim; i += WG)
        att[out_base + i] = uintBitsToFloat(0x7fc00000u);
}

void main()
{
    const uint item = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (item >= p.rows * p.n_head)
        return; // the whole workgroup: no barrier is left waiting
    const uint row = item / p.n_head, h = item % p.n_head;
    const uint tid = gl_LocalInvocationID.x, hd = p.head_dim;
    const uint kv_off = (h / p.group) * hd;
    const uint out_base = item * hd; // = row * n_head * hd + h * hd
    const int seq_i = info[2u * row], pos = info[2u * row + 1u];
    // The same for the whole workgroup, so returning is too.
    if (seq_i < 0 || uint(seq_i) >= p.n_seq || pos < 0 || uint(pos) >= p.stride ||
        uint(pos) / p.block_size >= p.max_blocks) {
        write_nan(out_base);
        return;
    }
    const uint seq = uint(seq_i), n_pos = uint(pos) + 1u;
    const uint sbase = item * p.stride;

    if (tid == 0u)
        bad = false;
    for (uint i = tid; i < hd; i += WG)
        q_sh[i] = q[out_base + i];
    barrier();

    // Scores and their maximum (a NaN score is never the maximum, as in C).
    float m = uintBitsToFloat(0xff800000u);
#ifdef SCORE_LANES
    {
        const uint lane = tid & 7u, slot = tid >> 3;
        for (uint t0 = 0u; t0 < n_pos; t0 += WG / 8u) {
            const uint t = t0 + slot;
            bool ok = true;
            const uint kb = t < n_pos ? kv_at(seq, t, ok) + kv_off : 0u;
            precise float acc = 0.0;
            if (t < n_pos && ok) {
                float kv[MAX_HD / 8u];
                [[unroll]] for (uint j = 0u; j < MAX_HD / 8u; j++)
                    if (lane + 8u * j < hd)
                        kv[j] = KC(kb + lane + 8u * j);
                [[unroll]] for (uint j = 0u; j < MAX_HD / 8u; j++)
                    if (lane + 8u * j < hd)
                        acc = acc + q_sh[lane + 8u * j] * kv[j];
            }
            if (t < n_pos && !ok)
                bad = true;
            // ((0+1)+(2+3))+((4+5)+(6+7)): each step adds the same two
            // operands in both partners (a + b == b + a exactly).
            precise float s1 = acc + subgroupShuffleXor(acc, 1u);
            precise float s2 = s1 + subgroupShuffleXor(s1, 2u);
            precise float s4 = s2 + subgroupShuffleXor(s2, 4u);
            if (lane == 0u && t < n_pos && ok) {
                precise float s = s4 * p.scale;
                scratch[sbase + t] = s;
                m = s > m ? s : m;
            }
        }
    }
#else
    for (uint t = tid; t < n_pos; t += WG) {
        bool ok = true;
        const uint kb = kv_at(seq, t, ok) + kv_off;
        if (!ok) {
            bad = true;
            continue;
        }
        precise float acc[8] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
        uint i = 0u;
#ifdef SCORE_VEC4
        if (hd % 4u == 0u && p.kv_dim % 4u == 0u && p.layer_off % 4u == 0u) {
            // Element i of a vec4 goes to lane i % 8, each lane in order.
            const uint kb4 = kb / 4u;
            for (; i + 16u <= hd; i += 16u) {
                vec4 k4[4];
                [[unroll]] for (uint u = 0u; u < 4u; u++)
                    k4[u] = kc4[kb4 + i / 4u + u];
#if defined(VEC4_TMP)
                // Each product into a precise temporary, then added: every
                // operation rounded on its own, whatever the compiler does
                // with indices computed from the unrolled loops.
                [[unroll]] for (uint u = 0u; u < 4u; u++) {
                    precise vec4 pr = vec4(q_sh[i + 4u * u], q_sh[i + 4u * u + 1u],
                                           q_sh[i + 4u * u + 2u], q_sh[i + 4u * u + 3u]) * k4[u];
                    if ((u & 1u) == 0u) {
                        acc[0] = acc[0] + pr.x;
                        acc[1] = acc[1] + pr.y;
                        acc[2] = acc[2] + pr.z;
                        acc[3] = acc[3] + pr.w;
                    } else {
                        acc[4] = acc[4] + pr.x;
                        acc[5] = acc[5] + pr.y;
                        acc[6] = acc[6] + pr.z;
                        acc[7] = acc[7] + pr.w;
                    }
                }
#elif defined(VEC4_BITS)
                // The product's bits passed through an integer: no fused
                // multiply-add can span the two operations.
                [[unroll]] for (uint u = 0u; u < 4u; u++)
                    [[unroll]] for (uint e = 0u; e < 4u; e++)
                        acc[(4u * u + e) & 7u] =
                            acc[(4u * u + e) & 7u] +
                            uintBitsToFloat(floatBitsToUint(q_sh[i + 4u * u + e] * k4[u][e]));
#else
                [[unroll]] for (uint u = 0u; u < 4u; u++)
                    [[unroll]] for (uint e = 0u; e < 4u; e++)
                        acc[(4u * u + e) & 7u] =
                            acc[(4u * u + e) & 7u] + q_sh[i + 4u * u + e] * k4[u][e];
#endif
            }
            for (; i < hd; i += 4u) { // i % 16 is 0, 4, 8 or 12
                const vec4 k4 = kc4[kb4 + i / 4u];
                if ((i & 4u) == 0u) {
                    [[unroll]] for (uint e = 0u; e < 4u; e++)
                        acc[e] = acc[e] + q_sh[i + e] * k4[e];
                } else {
                    [[unroll]] for (uint e = 0u; e < 4u; e++)
                        acc[4u + e] = acc[4u + e] + q_sh[i + e] * k4[e];
                }
            }
        }
#endif
        // Sixteen of the key's values loaded before any is used (two rounds
        // of the lanes), then the rounds in order.
        for (; i + 16u <= hd; i += 16u) {
            float kv[16];
#ifdef VEC4_LOADS // the same arithmetic, the values loaded 16 bytes at a time
            if (hd % 4u == 0u && p.kv_dim % 4u == 0u && p.layer_off % 4u == 0u) {
                for (uint u = 0u; u < 4u; u++) {
                    const vec4 a = kc4[(kb + i) / 4u + u];
                    kv[4u * u] = a.x;
                    kv[4u * u + 1u] = a.y;
                    kv[4u * u + 2u] = a.z;
                    kv[4u * u + 3u] = a.w;
                }
            } else
#endif
            for (uint l = 0u; l < 16u; l++)
                kv[l] = KC(kb + i + l);
            for (uint l = 0u; l < 8u; l++)
                acc[l] = acc[l] + q_sh[i + l] * kv[l];
            for (uint l = 0u; l < 8u; l++)
                acc[l] = acc[l] + q_sh[i + 8u + l] * kv[8u + l];
        }
        for (; i + 8u <= hd; i += 8u)
            for (uint l = 0u; l < 8u; l++)
                acc[l] = acc[l] + q_sh[i + l] * KC(kb + i + l);
        for (uint l = 0u; i < hd; i++, l++)
            acc[l] = acc[l] + q_sh[i] * KC(kb + i);
        precise float s =
            (((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]))) *
            p.scale;
        scratch[sbase + t] = s;
        m = s > m ? s : m;
    }
#endif
    red[tid] = m;
    barrier();
    for (uint half_n = WG / 2u; half_n > 0u; half_n >>= 1u) {
        if (tid < half_n && red[tid + half_n] > red[tid])
            red[tid] = red[tid + half_n];
        barrier();
    }
    if (bad) { // read after a barrier: the same for every invocation
        write_nan(out_base);
        return;
    }
    const float max_s = red[0];
#ifdef STOP_SCORES
    for (uint i = tid; i < hd; i += WG)
        att[out_base + i] = max_s;
    return;
#endif

    // e_t, summed in position order by invocation 0.
    precise float sum = 0.0;
    for (uint c = 0u; c < n_pos; c += WG) {
        const uint t = c + tid;
        if (t < n_pos) {
            precise float d = scratch[sbase + t] - max_s;
            const float e = exp_rn(d);
            scratch[sbase + t] = e;
            e_sh[tid] = e;
        }
        barrier();
        if (tid == 0u) {
            const uint cnt = min(WG, n_pos - c);
#ifdef SUM8
            uint k = 0u;
            for (; k + 8u <= cnt; k += 8u) {
                float e8[8];
                [[unroll]] for (uint u = 0u; u < 8u; u++)
                    e8[u] = e_sh[k + u];
                [[unroll]] for (uint u = 0u; u < 8u; u++)
                    sum = sum + e8[u];
            }
            for (; k < cnt; k++)
                sum = sum + e_sh[k];
#else
            for (uint k = 0u; k < cnt; k++)
                sum = sum + e_sh[k];
#endif
        }
        barrier();
    }
    if (tid == 0u) {
        // sum >= 1 (the maximum's term is 1) unless a score was NaN or
        // infinite; then what C's 1.0f / sum gives.
        if (sum > 0.0 && !isinf(sum))
            sh_inv = fdiv_rn(1.0, sum);
        else
            sh_inv = isinf(sum) ? 0.0 : uintBitsToFloat(0x7fc00000u);
    }
    barrier();
    const float inv = sh_inv;
#ifdef STOP_SOFTMAX
    for (uint i = tid; i < hd; i += WG)
        att[out_base + i] = inv;
    return;
#endif

    // out[i] = sum over t of (e_t inv) v_t[i], from 0, multiply then add.
    precise float o[MAX_HD / WG];
    for (uint j = 0u; j < MAX_HD / WG; j++)
        o[j] = 0.0;
    for (uint c = 0u; c < n_pos; c += WG) {
        const uint t = c + tid;
        if (t < n_pos) {
            precise float pr = scratch[sbase + t] * inv;
            bool ok = true;
            e_sh[tid] = pr;
            at_sh[tid] = kv_at(seq, t, ok) + kv_off;
        }
        barrier();
        const uint cnt = min(WG, n_pos - c);
        // VBATCH positions' values loaded at once (independent loads in
        // flight together; one after another they took most of a decode
        // step's attention), then added in position order.
        for (uint k0 = 0u; k0 < cnt; k0 += VBATCH) {
            const uint kn = min(VBATCH, cnt - k0);
            for (uint j = 0u; j < MAX_HD / WG; j++) {
                const uint i = tid + j * WG;
                if (i >= hd)
                    continue;
                float vv[VBATCH];
                for (uint k = 0u; k < VBATCH; k++)
                    vv[k] = k < kn ? vc[at_sh[k0 + k] + i] : 0.0;
                for (uint k = 0u; k < kn; k++)
                    o[j] = o[j] + e_sh[k0 + k] * vv[k];
            }
        }
        barrier();
    }
    for (uint j = 0u; j < MAX_HD / WG; j++) {
        const uint i = tid + j * WG;
        if (i < hd)
            att[out_base + i] = o[j];
    }
}
