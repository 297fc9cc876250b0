// Mode 3 of the W2A8 products (w2a8_matvec.glsl, w2a8_normed.glsl): the
// attention's q, k and v at once, q and k turned by RoPE, k and v stored
// into their cache row. The including shader has the output buffer y,
// the buffers info, tables, cs, kc and vc, and push constants p with
// weight_scale (q's), up_scale (k's), v_scale, n_head, n_kv, head_dim,
// rope_dim, block_size, max_blocks, n_seq, cache_rows and layer_off
// (w2a8_matvec.glsl describes them).

// Mode 3's workgroups for one activation row, in this order: q's rotated
// pairs (four a workgroup), q's values past rope_dim in each head (eight),
// k's pairs, k's values past rope_dim, v's values. For workgroup g of the
// row and group of invocations slot: the part (0 q, 1 k, 2 v), whether it
// is a pair's, the value's index in its part's row (head h's j at h
// head_dim + j; for a pair's, j its first, the + half one at slot >= 4),
// and whether there is such a value. Returns the workgroups a row.
uint qkv_geometry(uint g, uint slot, out uint part, out bool pair, out uint at, out bool live)
{
    const uint hd = p.head_dim, half_ = p.rope_dim / 2u, rest = hd - 2u * half_;
    const uint kv_dim = p.n_kv * hd;
    uint first = 0u;
    part = 0u;
    pair = false;
    at = 0u;
    live = false;
    for (uint s = 0u; s < 3u; s++) {
        const uint heads = s == 0u ? p.n_head : p.n_kv;
        // Pairs (none for v) then the values not rotated (all of v's).
        const uint n_pairs = s < 2u ? heads * half_ : 0u;
        const uint n_plain = s < 2u ? heads * rest : kv_dim;
        const uint g_pairs = (n_pairs + 3u) / 4u, g_plain = (n_plain + 7u) / 8u;
        if (g >= first && g < first + g_pairs) {
            const uint i = (g - first) * 4u + slot % 4u;
            part = s;
            pair = true;
            live = i < n_pairs;
            at = live ? (i / half_) * hd + i % half_ + (slot >= 4u ? half_ : 0u) : 0u;
        } else if (g >= first + g_pairs && g < first + g_pairs + g_plain) {
            const uint i = (g - first - g_pairs) * 8u + slot;
            part = s;
            live = i < n_plain;
            at = !live ? 0u : s == 2u ? i : (i / rest) * hd + 2u * half_ + i % rest;
        }
        first += g_pairs + g_plain;
    }
    return first;
}

// Mode 3's epilogue for the row whose positions and cos / sin are row r of
// info and cs, its outputs row a of y, its activations' scale act_scale:
// the value at `at` of its part (sum), and for a pair's the value half a
// head on (sum2): q into y, k and v into their cache row, q and k pairs
// turned by RoPE.
void qkv_epilogue(uint r, uint a, float act_scale, uint part, bool pair, uint at, int sum,
                  int sum2)
{
    const float scale = part == 0u ? p.weight_scale : part == 1u ? p.up_scale : p.v_scale;
    const uint half_ = p.rope_dim / 2u, kv_dim = p.n_kv * p.head_dim;
    float v0 = epilogue_scale(sum, act_scale, scale), v1 = 0.0;
    if (pair) { // y0 = x0 cos - x1 sin, y1 = x1 cos + x0 sin (rope_heads)
        const float x0 = v0, x1 = epilogue_scale(sum2, act_scale, scale);
        const uint j = at % p.head_dim;
        const float c = cs[r * p.rope_dim + j], s = cs[r * p.rope_dim + half_ + j];
        precise float y0 = x0 * c - x1 * s;
        precise float y1 = x1 * c + x0 * s;
        v0 = y0;
        v1 = y1;
    }
    if (part == 0u) {
        const uint o = a * p.n_head * p.head_dim + at;
        y[o] = v0;
        if (pair)
            y[o + half_] = v1;
        return;
    }
    // The row's cache row, as rope_store.comp found it: nothing is stored
    // for a row whose sequence, position or block falls outside.
    const int seq = info[2u * r], pos = info[2u * r + 1u];
    if (seq < 0 || uint(seq) >= p.n_seq || pos < 0 || uint(pos) / p.block_size >= p.max_blocks)
        return;
    const int block = tables[uint(seq) * p.max_blocks + uint(pos) / p.block_size];
    if (block < 0 || uint(block) >= p.cache_rows / p.block_size + 1u)
        return;
    const uint cr = uint(block) * p.block_size + uint(pos) % p.block_size;
    if (cr >= p.cache_rows)
        return;
    const uint dst = p.layer_off + cr * kv_dim + at;
    if (part == 1u) {
        kc[dst] = v0;
        if (pair)
            kc[dst + half_] = v1;
    } else {
        vc[dst] = v0;
    }
}
