#version 450
// RoPE then the KV cache store for one row a workgroup, as the CPU's
// attention_block does: the row's q heads and k heads turned in place by
// rope_heads (rotate-half: pairs (j, j + half), half = rope_dim / 2,
// y0 = x0 cos - x1 sin, y1 = x1 cos + x0 sin, each product rounded, then
// the sum), with the row's cos and sin as the host computed them; then the
// row's k and v copied to its cache row, found through its sequence's
// block table. An invocation owns a pair of a head, reads both values and
// writes both (to k and to the cache), so nothing is read after another
// invocation wrote it.
//
// A row whose sequence, position or block falls outside the tables or the
// cache is rotated but not stored (the host cannot check what lies in
// device buffers; a write past the cache would be undefined).

layout(local_size_x = 128) in;

layout(std430, binding = 0) readonly buffer Info { int info[]; };   // [rows][2]: seq, pos
layout(std430, binding = 1) readonly buffer Tables { int tables[]; }; // [n_seq][max_blocks]
layout(std430, binding = 2) buffer Q { float q[]; };
layout(std430, binding = 3) buffer K { float k[]; };
layout(std430, binding = 4) readonly buffer V { float v[]; };
layout(std430, binding = 5) readonly buffer CosSin { float cs[]; }; // [rows][rope_dim]
layout(std430, binding = 6) writeonly buffer KCache { float kc[]; };
layout(std430, binding = 7) writeonly buffer VCache { float vc[]; };

layout(push_constant) uniform Params {
    uint rows;
    uint n_head;
    uint n_kv;
    uint head_dim;
    uint rope_dim;
    uint block_size;
    uint max_blocks;
    uint n_seq;        // sequences the tables buffer holds
    uint cache_rows;   // rows of one layer's cache
    uint layer_off;    // floats before this layer's cache
} p;

void main()
{
    const uint row = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (row >= p.rows)
        return;
    const uint tid = gl_LocalInvocationID.x;
    const uint hd = p.head_dim, half_ = p.rope_dim / 2u;
    const uint q_dim = p.n_head * hd, kv_dim = p.n_kv * hd;
    const uint cs_base = row * p.rope_dim;

    for (uint e = tid; e < p.n_head * half_; e += 128u) {
        const uint j = e % half_, at = row * q_dim + (e / half_) * hd + j;
        const float x0 = q[at], x1 = q[at + half_];
        const float c = cs[cs_base + j], s = cs[cs_base + half_ + j];
        precise float y0 = x0 * c - x1 * s;
        precise float y1 = x1 * c + x0 * s;
        q[at] = y0;
        q[at + half_] = y1;
    }

    const int seq = info[2u * row], pos = info[2u * row + 1u];
    bool ok = seq >= 0 && uint(seq) < p.n_seq && pos >= 0 &&
              uint(pos) / p.block_size < p.max_blocks;
    uint dst = 0u;
    if (ok) {
        const int block = tables[uint(seq) * p.max_blocks + uint(pos) / p.block_size];
        ok = block >= 0 && uint(block) < p.cache_rows / p.block_size + 1u;
        const uint cr = uint(block) * p.block_size + uint(pos) % p.block_size;
        ok = ok && cr < p.cache_rows;
        dst = p.layer_off + cr * kv_dim;
    }
    for (uint e = tid; e < kv_dim; e += 128u) {
        const uint j = e % hd, at = row * kv_dim + e;
        if (j < half_) {
            const float x0 = k[at], x1 = k[at + half_];
            const float c = cs[cs_base + j], s = cs[cs_base + half_ + j];
            precise float y0 = x0 * c - x1 * s;
            precise float y1 = x1 * c + x0 * s;
            k[at] = y0;
            k[at + half_] = y1;
            if (ok) {
                kc[dst + e] = y0;
                kc[dst + e + half_] = y1;
            }
        } else if (j >= 2u * half_ && ok) {
            kc[dst + e] = k[at];
        }
        if (ok)
            vc[dst + e] = v[at];
    }
}
