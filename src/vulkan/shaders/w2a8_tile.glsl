// What the tiled W2A8 products (w2a8_tiles.comp: integer dot products;
// w2a8_matrix.comp: subgroup matrix products) share: a workgroup takes TM
// activation rows times SLOTS = 64 weight rows (eight of
// w2a8_matvec.glsl's groups of eight outputs, so that every epilogue finds
// a group's outputs together: the gate and up of mode 2, the RoPE pairs of
// mode 3), walks K a stage of KW weight words at a time, and ends with
// every (row, slot) of the tile through the epilogues. The including
// shader defines TM, SLOTS, THREADS and KW, includes w2a8_params.glsl,
// w2a8_epilogue.glsl and w2a8_qkv.glsl first, and has the function
// tile_sum(r, sl): the exact sum of weight x activation of the tile's row
// r and slot sl once every stage is summed. The host sizes the grid as
// tiles of 64 slots along the groups times tiles of TM rows (vk_w2a8.c).

// Slot s (0 .. 7) of group g: whether it has an output, its weight row,
// and in mode 3 its part, whether it is a RoPE pair's and its index.
bool group_slot(uint g, uint s, out uint w_row, out uint part, out bool pair, out uint at)
{
    part = 0u;
    pair = false;
    at = 0u;
    if (p.mode == 3u) {
        bool live;
        qkv_geometry(g, s, part, pair, at, live);
        const uint q_dim = p.n_head * p.head_dim, kv_dim = p.n_kv * p.head_dim;
        w_row = at + (part == 0u ? 0u : part == 1u ? q_dim : q_dim + kv_dim);
        return live;
    }
    if (p.mode == 2u) { // four gate rows, then the same four of the up
        const uint row = g * 4u + s % 4u;
        w_row = s < 4u ? row : p.n + row;
        return row < p.n;
    }
    w_row = g * 8u + s;
    return w_row < p.n;
}

// Activation rows handled by this workgroup, weight rows by the groups.
uint groups_a_row()
{
    if (p.mode == 3u) {
        uint part, at;
        bool pair, live;
        return qkv_geometry(0u, 0u, part, pair, at, live);
    }
    return p.mode == 2u ? (p.n + 3u) / 4u : (p.n + 7u) / 8u;
}

// The global loads of a stage into registers: the activation words an
// invocation copies (TM KW of them over the workgroup) and the weight
// words (SLOTS KW).
#define A_PER ((TM * KW + THREADS - 1u) / THREADS)
#define B_PER (SLOTS * KW / THREADS)

// This workgroup's first group g0 and first activation row a0; false
// for a workgroup past the grid's tiles.
bool tile_origin(out uint g0, out uint a0)
{
    const uint tiles_n = (groups_a_row() + 7u) / 8u;
    const uint id = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    g0 = (id % tiles_n) * 8u;
    a0 = (id / tiles_n) * TM;
    return id < tiles_n * ((p.rows + TM - 1u) / TM);
}

// The weight rows of the slots invocation tid loads (B_PER of them, each a
// word of a stage): slot (tid + THREADS i) / KW.
void tile_weight_rows(uint tid, uint g0, out uint b_row[B_PER], out bool b_live[B_PER])
{
    for (uint i = 0u; i < B_PER; i++) {
        const uint e = tid + THREADS * i, sl = e / KW;
        uint part, at;
        bool pair;
        b_live[i] = group_slot(g0 + sl / 8u, sl % 8u, b_row[i], part, pair, at);
    }
}

// Stage st's words into registers: activation word e (row e / KW, word e
// % KW of the stage) and weight word e (slot e / KW), for e = tid +
// THREADS i; zeros past the rows or k, weight 0 (code 1) for dead slots.
void tile_load_stage(uint st, uint tid, uint a0, uint b_row[B_PER], bool b_live[B_PER],
                     out uvec4 a_reg[A_PER], out uint b_reg[B_PER])
{
    for (uint i = 0u; i < A_PER; i++) {
        const uint e = tid + THREADS * i, r = e / KW, j = st * KW + e % KW;
        const bool inside = e < TM * KW && a0 + r < p.rows && j < p.words;
        a_reg[i] = inside ? x4[(p.act_row + a0 + r) * p.words + j] : uvec4(0u);
    }
    for (uint i = 0u; i < B_PER; i++) {
        const uint j = st * KW + (tid + THREADS * i) % KW;
        b_reg[i] = b_live[i] && j < p.words ? w[b_row[i] * p.words + j] : 0x55555555u;
    }
}

// The epilogues: each (row, slot) of the tile by one invocation; a gate's
// or a RoPE pair's first slot also takes the slot four on.
void tile_epilogues(uint tid, uint g0, uint a0)
{
    for (uint e = tid; e < TM * SLOTS; e += THREADS) {
        const uint r = e / SLOTS, sl = e % SLOTS, s = sl % 8u, a = a0 + r;
        uint w_row, part, at;
        bool pair;
        if (a >= p.rows || !group_slot(g0 + sl / 8u, s, w_row, part, pair, at))
            continue;
        const float act_scale = act_scales[p.act_row + a];
        if (p.mode == 3u) {
            if (!pair || s < 4u)
                qkv_epilogue(p.act_row + a, a, act_scale, part, pair, at, tile_sum(r, sl),
                             pair ? tile_sum(r, sl + 4u) : 0);
        } else if (p.mode == 2u) {
            if (s < 4u)
                epilogue_store(a * p.n + w_row, tile_sum(r, sl), tile_sum(r, sl + 4u),
                               act_scale);
        } else {
            epilogue_store(a * p.n + w_row, tile_sum(r, sl), 0, act_scale);
        }
    }
}
