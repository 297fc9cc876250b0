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
// Scores: invocation tid takes positions tid, tid + WG, ..., a whole dot
// each, into scratch. The float sum of the e_t and the output sums are
// kept in position order: the e_t of WG positions at a time go through
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

// 512 invocations for a decode step's row (its positions up to 512 scored
// in one round; the weighted sum takes one invocation an output element,
// so those past head_dim wait there). H200, 2B-4T heads: at context 1000
// 2862-2864 us a step against 3043-3057 with 256 (and 4262 with 128); at
// context 160 the same as 256 (659-664). A pass of many rows has
// workgroups enough to fill the device without them: WG_SIZE 128
// (attention_rows.comp, attention_f64_rows.comp), the same arithmetic.
#ifndef WG_SIZE
#define WG_SIZE 512
#endif
#define WG uint(WG_SIZE)
#define MAX_HD 512u
// Values of positions loaded at once in the weighted sum (H200, 2B-4T
// heads, the step's attention against 32: 2719-2724 us against 2867-2870
// at context 1000, 9341 against 9969 at 4000, 656 against 661 at 160;
// 128 gave 2676-2687, 9086 and 675-680).
#define VBATCH 64u

layout(local_size_x = WG_SIZE) in;

// The scratch (binding 5) and push constants: attention_scratch.glsl.
#include "attention_scratch.glsl"

#include "exact_math.glsl"

shared float q_sh[MAX_HD];
shared float red[WG];
shared float e_sh[WG];
shared uint at_sh[WG];
shared bool bad;
shared float sh_inv;

#include "attention_keys.glsl"

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
    for (uint t = tid; t < n_pos; t += WG) {
        bool ok = true;
        const uint kb = kv_at(seq, t, ok) + kv_off;
        if (!ok) {
            bad = true;
            continue;
        }
        const float s = score(kb);
        scratch[sbase + t] = s;
        m = s > m ? s : m;
    }
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
            for (uint k = 0u; k < cnt; k++)
                sum = sum + e_sh[k];
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
