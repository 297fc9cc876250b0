#version 450
// The W2A8 product for a pass of many activation rows (a prompt's chunk,
// batched rows) as a tiled matrix product (w2a8_tile.glsl: TM rows times 64
// weight rows a workgroup, K a stage of KW weight words through shared
// memory), each invocation keeping MR x 4 sums in registers, four codes
// times four activations a dot product. Each weight word is spread once for
// TM rows and each activation word met by 64 outputs, where
// w2a8_matvec.glsl's rows variant loads a row's activations again for
// every eight outputs. Devices with int8 subgroup matrix products take
// w2a8_matrix.comp instead.
//
// The sums are exact in int32, so they are the other kernels' bit for bit
// in any order: sum code x over the stage's words by the device's integer
// dot products (codes 0, 1, 2), less sum x (the row's codes summed once,
// by the invocations that load them). The epilogues are
// w2a8_matvec.glsl's, with the exact division. Same bindings, push
// constants and modes as w2a8_matvec.glsl (w2a8_params.glsl).
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

int tile_sum(uint r, uint sl) { return pool_int(SUM_AT(r, sl)); }

// group_slot, tile_origin, tile_weight_rows, tile_load_stage, tile_epilogues.
#include "w2a8_tile.glsl"

void main()
{
    const uint tid = gl_LocalInvocationID.x;
    uint g0, a0;
    if (!tile_origin(g0, a0))
        return; // the whole workgroup: no barrier is left waiting
    uint b_row[B_PER];
    bool b_live[B_PER];
    tile_weight_rows(tid, g0, b_row, b_live);
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
        if (st < stages)
            tile_load_stage(st, tid, a0, b_row, b_live, a_reg, b_reg);
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

    tile_epilogues(tid, g0, a0);
}
