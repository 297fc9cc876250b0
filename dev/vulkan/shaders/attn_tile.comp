#version 450
#extension GL_GOOGLE_include_directive : require
// The exact attention of a prompt chunk's rows with R consecutive rows of
// one sequence and the G query heads of one KV head a workgroup (a lab
// form, dev/vulkan/prefill_attn.c): every key of a tile of TT positions is
// copied into shared memory once for R x G scores, every value loaded
// once for R rows' weighted sums. Each (row, head)'s arithmetic and order
// are attention.glsl's (and attention_group.glsl's), so the same bits:
// scores in eight lanes in order, each head's e_t summed in position order
// by one invocation, the weighted sums in position order.
//
// The lab's shape: G = 4 query heads of HD = 128 values a KV head (the
// 2B-4T heads), rows r0 .. r0 + R - 1 of one sequence (not checked here:
// the lab makes them so).
#define BN_FP64 1
#ifndef R
#define R 4u
#endif
#define WG 512u
#define G 4u
#define HD 128u
#define TT 32u          // positions a tile
#define PAIRS (R * G)   // (row, head) pairs a workgroup
layout(local_size_x = 512) in;

#include "attention_scratch.glsl"
#include "exact_math.glsl"

shared float q_sh[1];              // attention_keys.glsl's score(), unused
shared float qp_sh[PAIRS][HD];     // pair (row rr, head g) at rr G + g
shared float k_sh[TT][HD + 1u];    // a tile's keys, a row padded: no bank conflicts
shared float e_sh[PAIRS][TT];
shared float red[WG];
shared uint at_sh[TT];
shared float sh_max[PAIRS], sh_inv[PAIRS];
shared uint sh_npos[R];

#include "attention_keys.glsl"

void main()
{
    const uint n_kv = p.n_head / G, item = gl_WorkGroupID.x;
    const uint tiles_r = (p.rows + R - 1u) / R;
    if (item >= tiles_r * n_kv)
        return;
    const uint tid = gl_LocalInvocationID.x, kvh = item % n_kv, r0 = (item / n_kv) * R;
    const uint kv_off = kvh * HD;
    const uint seq = uint(info[2u * r0]);
    if (tid < R)
        sh_npos[tid] = r0 + tid < p.rows ? uint(info[2u * (r0 + tid) + 1u]) + 1u : 0u;
    for (uint e = tid; e < PAIRS * HD; e += WG) {
        const uint pr = e / HD, rr = pr / G, g = pr % G;
        qp_sh[pr][e % HD] =
            r0 + rr < p.rows ? q[((r0 + rr) * p.n_head + kvh * G + g) * HD + e % HD] : 0.0;
    }
    barrier();
    uint n_max = 0u;
    for (uint rr = 0u; rr < R; rr++)
        n_max = max(n_max, sh_npos[rr]);

    // Scores: invocation (pair tid / TT, position tid % TT of the tile).
    const uint pr = tid / TT, tt = tid % TT, prow = pr / G, phead = kvh * G + pr % G;
    const uint my_npos = pr < PAIRS ? sh_npos[prow] : 0u;
    const uint sbase = pr < PAIRS ? ((r0 + prow) * p.n_head + phead) * p.stride : 0u;
    float m = uintBitsToFloat(0xff800000u);
    for (uint t0 = 0u; t0 < n_max; t0 += TT) {
        if (tid < TT && t0 + tid < n_max) {
            bool ok = true;
            at_sh[tid] = kv_at(seq, t0 + tid, ok) + kv_off;
        }
        barrier();
        for (uint v = tid; v < TT * HD / 4u; v += WG) {
            const uint row = v / (HD / 4u), c4 = v % (HD / 4u);
            const vec4 a = t0 + row < n_max ? kc4[at_sh[row] / 4u + c4] : vec4(0.0);
            k_sh[row][4u * c4] = a.x;
            k_sh[row][4u * c4 + 1u] = a.y;
            k_sh[row][4u * c4 + 2u] = a.z;
            k_sh[row][4u * c4 + 3u] = a.w;
        }
        barrier();
        const uint t = t0 + tt;
        if (pr < PAIRS && t < my_npos) {
            precise float acc[8] = float[8](0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
            for (uint i = 0u; i < HD; i += 8u)
                for (uint l = 0u; l < 8u; l++)
                    acc[l] = acc[l] + qp_sh[pr][i + l] * k_sh[tt][i + l];
            precise float s = (((acc[0] + acc[1]) + (acc[2] + acc[3])) +
                               ((acc[4] + acc[5]) + (acc[6] + acc[7]))) *
                              p.scale;
            scratch[sbase + t] = s;
            m = s > m ? s : m;
        }
        barrier(); // the tile's keys are used up
    }
    // Each pair's maximum over its TT invocations.
    red[tid] = m;
    barrier();
    for (uint h = TT / 2u; h > 0u; h >>= 1u) {
        if (tt < h && red[tid + h] > red[tid])
            red[tid] = red[tid + h];
        barrier();
    }
    if (tt == 0u && pr < PAIRS)
        sh_max[pr] = red[tid];
    barrier();

    // e_t, each pair's summed in position order by invocation pr.
    precise float sum = 0.0;
    for (uint t0 = 0u; t0 < n_max; t0 += TT) {
        const uint t = t0 + tt;
        if (pr < PAIRS && t < my_npos) {
            precise float d = scratch[sbase + t] - sh_max[pr];
            const float e = exp_rn(d);
            scratch[sbase + t] = e;
            e_sh[pr][tt] = e;
        }
        barrier();
        if (tid < PAIRS) {
            const uint cnt = min(TT, sh_npos[tid / G] > t0 ? sh_npos[tid / G] - t0 : 0u);
            for (uint k = 0u; k < cnt; k++)
                sum = sum + e_sh[tid][k];
        }
        barrier();
    }
    if (tid < PAIRS)
        sh_inv[tid] = sum > 0.0 && !isinf(sum) ? fdiv_rn(1.0, sum)
                                               : isinf(sum) ? 0.0 : uintBitsToFloat(0x7fc00000u);
    barrier();

    // out = sum over t of (e_t inv) v_t[i]: invocation (head tid / HD,
    // element tid % HD) for the R rows, each value loaded once.
    const uint og = tid / HD, oi = tid % HD;
    precise float o[R];
    for (uint rr = 0u; rr < R; rr++)
        o[rr] = 0.0;
    for (uint t0 = 0u; t0 < n_max; t0 += TT) {
        const uint t = t0 + tt;
        if (tid < TT && t0 + tid < n_max) {
            bool ok = true;
            at_sh[tid] = kv_at(seq, t0 + tid, ok) + kv_off;
        }
        if (pr < PAIRS && t < my_npos) {
            precise float w = scratch[sbase + t] * sh_inv[pr];
            e_sh[pr][tt] = w;
        }
        barrier();
        const uint cnt = min(TT, n_max - t0);
        float vv[TT];
        for (uint k = 0u; k < TT; k++)
            vv[k] = k < cnt ? vc[at_sh[k] + oi] : 0.0;
        for (uint k = 0u; k < cnt; k++)
            for (uint rr = 0u; rr < R; rr++)
                if (t0 + k < sh_npos[rr])
                    o[rr] = o[rr] + e_sh[rr * G + og][k] * vv[k];
        barrier();
    }
    for (uint rr = 0u; rr < R; rr++)
        if (r0 + rr < p.rows)
            att[((r0 + rr) * p.n_head + kvh * G + og) * HD + oi] = o[rr];
}
