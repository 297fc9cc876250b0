// y[a][r] = (sum_k w[r][k] * x[a][k]) / act_scale[a] * weight_scale for 8
// outputs r of one activation row a a workgroup: ternary weights
// (bn_vk_w2a8_pack's layout, 16 codes of weight + 1 to a word) times rows
// of int8 activations (4 to a word, zero-padded to whole words of codes)
// and their scales, both as the norm + int8 kernel writes them (rows
// act_row .. act_row + rows - 1 of many; y row a holds n outputs). 32
// invocations take an output, each its words j = sub, sub + 32, ... (they
// read a row's 128 contiguous bytes at a time), and their partial sums
// meet in a tree, or (the dot-product variants, where a subgroup is those
// 32 invocations) in one subgroup add: integer sums, the same either way
// (H200: 4.24 / 6.61 / 9.35 us a 2560 x 2560 / 2560 x 6912 / gate|up
// dispatch against 4.45 / 6.84 / 9.98 by the tree;
// dev/vulkan/dispatch_chain). The sum is exact in int32, as on the CPU: with
// DOT_PRODUCT by the device's integer dot products (four codes and four
// activations a step), else by portable integer arithmetic. The epilogue
// is the CPU's expression, its division correctly rounded where
// EXACT_DIVISION is defined (vk_w2a8.h says why); the output then goes to
// y as it is (mode 0) or is added to y's value there (mode 1: the residual
// add). Mode 2 is the feed-forward's gate and up at once: w holds the
// gate's n rows, then the up's, a workgroup takes four outputs, its first
// four groups of invocations their gate rows and the last four their up
// rows, and y gets (g g) u (the CPU's relu2_span of the two outputs).
// Mode 3 is the attention's q, k and v at once (qkv_geometry below): w
// holds q's rows, then k's, then v's; q and k are turned by RoPE in the
// epilogue (rope_heads: a workgroup takes four (j, j + half) pairs of a
// head, its first four groups of invocations the j, the last four the
// j + half), q goes to y, k and v to their cache row through the row's
// block table (as rope_store.comp did it, which this mode replaces).
// Each operation is rounded once, in the CPU's order.
// With RB (the _rows variants, for a pass of many rows) a workgroup takes
// its outputs for RB activation rows at once: each weight word is loaded
// (and spread) once for all of them, the sums and epilogues are each
// row's as above.
// Included by w2a8_matvec.comp, w2a8_matvec_f64.comp, w2a8_matvec_dot.comp,
// w2a8_matvec_dot_f64.comp and w2a8_matvec_dot_f64_rows.comp; its epilogue
// (w2a8_epilogue.glsl) also by w2a8_normed.glsl.

#ifdef DOT_PRODUCT
#include "sdot.glsl"
#endif

#define OUTPUTS 8u // a workgroup's outputs (BN_VK_W2A8_OUTPUTS)
#define LANES 32u  // invocations an output
layout(local_size_x = 256) in;

// The bindings and push constants (w2a8_tiles.comp shares them).
#include "w2a8_params.glsl"

#ifndef RB
#define RB 1u // activation rows a workgroup
#endif

shared int partial[RB][OUTPUTS * LANES];

// epilogue_scale, epilogue_store.
#include "w2a8_epilogue.glsl"

// qkv_geometry, qkv_epilogue.
#include "w2a8_qkv.glsl"

// The output of activation row a for the group of invocations slot:
// stored, added, or the gate times the up (mode 2: sum_up the up's sum).
void store_output(uint a, uint row, int sum, int sum_up)
{
    epilogue_store(a * p.n + row, sum, sum_up, act_scales[p.act_row + a]);
}

void main()
{
    const bool gate_up = p.mode == 2u, qkv = p.mode == 3u;
    const uint per = gate_up ? OUTPUTS / 2u : OUTPUTS;  // outputs a workgroup
    uint blocks = (p.n + per - 1u) / per;               // workgroups an activation row
    const uint id = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    const uint tid = gl_LocalInvocationID.x, slot = tid / LANES, sub = tid % LANES;
    uint part = 0u, at = 0u;
    bool pair = false, live = false;
    if (qkv)
        blocks = qkv_geometry(0u, 0u, part, pair, at, live);
    if (id >= blocks * ((p.rows + RB - 1u) / RB))
        return; // the whole workgroup: no barrier is left waiting
    const uint a0 = (id / blocks) * RB; // the workgroup's first activation row
    // The output this group of invocations sums for, and its weight row.
    uint row = (id % blocks) * per + (gate_up ? slot % per : slot);
    uint w_row = gate_up && slot >= per ? p.n + row : row;
    if (qkv) {
        qkv_geometry(id % blocks, slot, part, pair, at, live);
        const uint q_dim = p.n_head * p.head_dim, kv_dim = p.n_kv * p.head_dim;
        row = live ? 0u : p.n; // only whether it is below p.n counts below
        w_row = at + (part == 0u ? 0u : part == 1u ? q_dim : q_dim + kv_dim);
    }
    // Rows past the last repeat it (summed, never stored).
    uint act_base[RB]; // in x4's units: a weight word's activations
    for (uint r = 0u; r < RB; r++)
        act_base[r] = (p.act_row + min(a0 + r, p.rows - 1u)) * p.words;
    // Four sums a row, one a word of activations, so that the adds do not
    // wait on each other (integer sums: the order does not matter).
    int acc[RB][4];
    for (uint r = 0u; r < RB; r++)
        acc[r] = int[4](0, 0, 0, 0);
    if (row < p.n) {
        for (uint j = sub; j < p.words; j += LANES) {
            const uint codes = w[w_row * p.words + j];
            uvec4 acts4[RB];
            for (uint r = 0u; r < RB; r++)
                acts4[r] = x4[act_base[r] + j];
            for (uint q = 0u; q < 4u; q++) {
#ifdef DOT_PRODUCT
                // Codes 4q .. 4q + 3 (0, 1, 2) spread to the bytes of a word,
                // then sum code x - sum x: two dot products of four.
                const int spread = spread_codes((codes >> (8u * q)) & 0xffu);
                for (uint r = 0u; r < RB; r++)
                    acc[r][q] += ternary_dot(spread, int(acts4[r][q]));
#else
                for (uint r = 0u; r < RB; r++) {
                    const int acts = int(acts4[r][q]);
                    for (uint b = 0u; b < 4u; b++) {
                        const int code = int((codes >> (2u * (4u * q + b))) & 3u) - 1;
                        acc[r][q] += code * bitfieldExtract(acts, int(8u * b), 8);
                    }
                }
#endif
            }
        }
    }
#ifdef DOT_PRODUCT
    if (gl_SubgroupSize == LANES) { // an output's lanes are one subgroup
        for (uint r = 0u; r < RB; r++)
            partial[r][tid] = subgroupAdd((acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]));
        barrier();
    } else
#endif
    {
        for (uint r = 0u; r < RB; r++)
            partial[r][tid] = (acc[r][0] + acc[r][1]) + (acc[r][2] + acc[r][3]);
        barrier();
        for (uint h = LANES / 2u; h > 0u; h >>= 1u) {
            if (sub < h)
                for (uint r = 0u; r < RB; r++)
                    partial[r][tid] += partial[r][tid + h];
            barrier();
        }
    }
    for (uint r = 0u; r < RB && a0 + r < p.rows; r++) {
        const uint a = a0 + r;
        if (qkv) {
            if (sub == 0u && live && (!pair || slot < 4u))
                qkv_epilogue(p.act_row + a, a, act_scales[p.act_row + a], part, pair, at,
                             partial[r][tid], pair ? partial[r][tid + 4u * LANES] : 0);
        } else if (sub == 0u && row < p.n && slot < per) {
            store_output(a, row, partial[r][tid], gate_up ? partial[r][tid + per * LANES] : 0);
        }
    }
}
