#version 450
// The W2A8 product for a pass of many activation rows (a prompt's chunk,
// batched rows) as a tiled matrix product: a workgroup takes TM rows times
// 64 weight rows (eight of w2a8_matvec.glsl's groups of eight outputs, so
// that every epilogue finds a group's outputs together: the gate and up
// of mode 2, the RoPE pairs of mode 3), walks K a stage of KW weight words
// at a time through shared memory, and each invocation keeps MR x 4 sums
// in registers, four codes times four activations a dot product. Each
// weight word is spread once for TM rows and each activation word met by
// 64 outputs, where w2a8_matvec.glsl's rows variant loads a row's
// activations again for every eight outputs.
//
// The sums are exact in int32, so they are the other kernels' bit for bit
// in any order: sum code x over the stage's words by the device's integer
// dot products (codes 0, 1, 2), less sum x (the row's codes summed once,
// by the invocations that load them). The epilogues are
// w2a8_matvec.glsl's, with the exact division. Same bindings, push
// constants and modes as w2a8_matvec.glsl (w2a8_params.glsl); the host
// sizes the grid as tiles of 64 slots along the groups times tiles of TM
// rows (vk_w2a8.c).
//
// H200, the 2B-4T shape's prompt chunks of 64 rows (bitnet bench e2e
// --prompt 128): with 2 x 4 sums an invocation (256 invocations) prefill
// 4418-4444 tok/s against 3219-3221 with the rows kernel and 4155-4178
// with 64 rows a workgroup (4 x 4 sums), in one call; 4795-4825 against
// 4017-4227 with 16 rows a workgroup (twice the workgroups), in another;
// 4 x 4 sums of 32 rows (128 invocations, as here) 4946-4947 against
// 4751-4755 with 2 x 4, and 3873-4024 with sixteen words a stage, in a
// third.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
#define EXACT_DIVISION 1

#include "sdot.glsl"

#define TM 32u       // activation rows a workgroup (vk_w2a8.c's TILE_ROWS)
#define MR 4u        // rows an invocation sums for
#define THREADS 128u // TM / MR groups of rows x 16 groups of four slots
#define SLOTS 64u    // weight rows a workgroup: eight groups of eight
#define KW 8u        // weight words a stage
#define KQ (4u * KW) // dot products of four a stage (a row's or a slot's)
layout(local_size_x = 128) in;

#include "w2a8_params.glsl"

// epilogue_scale, epilogue_store.
#include "w2a8_epilogue.glsl"
// qkv_geometry, qkv_epilogue.
#include "w2a8_qkv.glsl"

// One pool (12 KiB; lavapipe's devices have 32): a stage's activation
// words, ints [kq][row], and spread weight words, ivec4s [kq][slot / 4];
// after the last stage the tile's sums, ints [row][slot].
shared ivec4 pool[KQ * (TM + SLOTS) / 4u];
#define A_AT(kq, r) ((kq) * TM + (r))                      // an int's index
#define B_AT(kq, s4) (KQ * TM / 4u + (kq) * (SLOTS / 4u) + (s4)) // an ivec4's
#define SUM_AT(r, sl) ((r) * SLOTS + (sl))                 // an int's index
int pool_int(uint i) { return pool[i / 4u][i % 4u]; }
void pool_set(uint i, int v) { pool[i / 4u][i % 4u] = v; }
shared int row_sum[TM]; // the rows' codes summed

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

// The global loads of stage st into registers: the activation words this
// invocation copies (TM KW of them over the workgroup: two an invocation)
// and the weight words (SLOTS KW: four an invocation).
#define A_PER ((TM * KW + THREADS - 1u) / THREADS)
#define B_PER (SLOTS * KW / THREADS)

void main()
{
    const uint tid = gl_LocalInvocationID.x;
    const uint tiles_n = (groups_a_row() + 7u) / 8u;
    const uint id = gl_WorkGroupID.x + gl_WorkGroupID.y * gl_NumWorkGroups.x;
    if (id >= tiles_n * ((p.rows + TM - 1u) / TM))
        return; // the whole workgroup: no barrier is left waiting
    const uint g0 = (id % tiles_n) * 8u, a0 = (id / tiles_n) * TM;

    // The weight rows of the slots this invocation loads (B_PER of them,
    // each a word of a stage): slot (tid + THREADS i) / KW.
    uint b_row[B_PER];
    bool b_live[B_PER];
    for (uint i = 0u; i < B_PER; i++) {
        const uint e = tid + THREADS * i, sl = e / KW;
        uint part, at;
        bool pair;
        b_live[i] = group_slot(g0 + sl / 8u, sl % 8u, b_row[i], part, pair, at);
    }
    if (tid < TM)
        row_sum[tid] = 0;

    const uint tr = tid / 16u, ts = tid % 16u; // rows tr MR .., slots ts 4 ..
    int acc[MR][4];
    for (uint r = 0u; r < MR; r++)
        acc[r] = int[4](0, 0, 0, 0);
    int my_sum[A_PER];
    for (uint i = 0u; i < A_PER; i++)
        my_sum[i] = 0;

    uvec4 a_reg[A_PER];
    uint b_reg[B_PER];
    const uint stages = (p.words + KW - 1u) / KW;
    for (uint st = 0u; st <= stages; st++) {
        // Stage st's words into registers (loaded while stage st - 1 is
        // summed below).
        if (st < stages) {
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
        if (st > 0u) { // stage st - 1, in shared memory
            for (uint kq = 0u; kq < KQ; kq++) {
                const ivec4 a = pool[A_AT(kq, tr * MR) / 4u]; // rows tr MR .. + 3
                const ivec4 b = pool[B_AT(kq, ts)];
                for (uint r = 0u; r < MR; r++)
                    for (uint c = 0u; c < 4u; c++)
                        acc[r][c] += sdot_packed(b[c], a[r], 0);
            }
        }
        barrier(); // stage st - 1 is summed: its shared words may go
        if (st < stages) {
            for (uint i = 0u; i < A_PER; i++) {
                const uint e = tid + THREADS * i;
                if (e < TM * KW) {
                    const uint r = e / KW, q0 = 4u * (e % KW);
                    for (uint q = 0u; q < 4u; q++) {
                        pool_set(A_AT(q0 + q, r), int(a_reg[i][q]));
                        my_sum[i] += sdot_packed(0x01010101, int(a_reg[i][q]), 0);
                    }
                }
            }
            for (uint i = 0u; i < B_PER; i++) {
                const uint e = tid + THREADS * i, sl = e / KW, q0 = 4u * (e % KW);
                for (uint q = 0u; q < 4u; q++)
                    pool[B_AT(q0 + q, sl / 4u)][sl % 4u] =
                        spread_codes((b_reg[i] >> (8u * q)) & 0xffu);
            }
        }
        barrier(); // stage st is in shared memory
    }

    // sum x of each row, then the tile's sums less it.
    for (uint i = 0u; i < A_PER; i++) {
        const uint e = tid + THREADS * i;
        if (e < TM * KW)
            atomicAdd(row_sum[e / KW], my_sum[i]);
    }
    barrier();
    for (uint r = 0u; r < MR; r++)
        for (uint c = 0u; c < 4u; c++)
            pool_set(SUM_AT(tr * MR + r, ts * 4u + c), acc[r][c] - row_sum[tr * MR + r]);
    barrier();

    // The epilogues: each (row, slot) of the tile by one invocation; a
    // gate's or a RoPE pair's first slot also takes the slot four on.
    for (uint e = tid; e < TM * SLOTS; e += THREADS) {
        const uint r = e / SLOTS, sl = e % SLOTS, s = sl % 8u, a = a0 + r;
        uint w_row, part, at;
        bool pair;
        if (a >= p.rows || !group_slot(g0 + sl / 8u, s, w_row, part, pair, at))
            continue;
        const float act_scale = act_scales[p.act_row + a];
        if (p.mode == 3u) {
            if (!pair || s < 4u)
                qkv_epilogue(p.act_row + a, a, act_scale, part, pair, at, pool_int(SUM_AT(r, sl)),
                             pair ? pool_int(SUM_AT(r, sl + 4u)) : 0);
        } else if (p.mode == 2u) {
            if (s < 4u)
                epilogue_store(a * p.n + w_row, pool_int(SUM_AT(r, sl)),
                               pool_int(SUM_AT(r, sl + 4u)), act_scale);
        } else {
            epilogue_store(a * p.n + w_row, pool_int(SUM_AT(r, sl)), 0, act_scale);
        }
    }
}
