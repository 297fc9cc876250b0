#version 450
// matrix_lab.comp - the W2A8 matrix kernel (src/vulkan/shaders/w2a8_matrix.comp,
// the shipped form with TM 32, SUBGROUPS 8, SG_ROWS 16, KW 8) with its tile
// as switches, for matrix_tiles.c: TM activation rows a workgroup,
// SUBGROUPS subgroups of 32 each taking SG_ROWS rows of it (and the slots
// that leaves: TM 64 / (SUBGROUPS SG_ROWS)), KW weight words a stage, and
// DOUBLE_BUFFER: two stage buffers, one barrier a stage. The Makefile
// builds the variants (mlab_*.spv).
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#extension GL_NV_integer_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#define EXACT_DIVISION 1

#include "sdot.glsl" // spread_codes

#ifndef TM
#define TM 32u
#endif
#ifndef SUBGROUPS
#define SUBGROUPS 8
#endif
#ifndef SG_ROWS
#define SG_ROWS 16u
#endif
#ifndef KW
#define KW 8u
#endif
#define THREADS (32u * SUBGROUPS)
#define SLOTS 64u
#define RS (KW + 1u)
#define CM 16u // one product's rows and slots
#define CK 32u // its K
#define SG_SLOTS (TM * SLOTS / (SUBGROUPS * SG_ROWS))
#define FRAGS_M (SG_ROWS / CM)
#define FRAGS_N (SG_SLOTS / CM)
#ifdef DOUBLE_BUFFER
#define BUFS 2u
#else
#define BUFS 1u
#endif
layout(local_size_x = 32 * SUBGROUPS) in;

#include "w2a8_params.glsl"

// epilogue_scale, epilogue_store.
#include "w2a8_epilogue.glsl"
// qkv_geometry, qkv_epilogue.
#include "w2a8_qkv.glsl"

shared uvec4 a_tile[BUFS * TM * RS];
shared uvec4 b_tile[BUFS * SLOTS * RS];
shared int sums[TM * SLOTS];     // the tile's sums, [row][slot]

int tile_sum(uint r, uint sl) { return sums[r * SLOTS + sl]; }

// group_slot, tile_origin, tile_weight_rows, tile_load_stage, tile_epilogues.
#include "w2a8_tile.glsl"

// Four codes (0, 1, 2; two bits each, lowest first) as four int8 weights
// (code - 1) in the bytes of a word: each byte's high bit set first, so
// that subtracting 1 from every byte borrows from none.
uint weights_of(uint codes)
{
    return ((uint(spread_codes(codes)) | 0x80808080u) - 0x01010101u) ^ 0x80808080u;
}

void main()
{
    const uint tid = gl_LocalInvocationID.x;
    uint g0, a0;
    if (!tile_origin(g0, a0))
        return; // the whole workgroup: no barrier is left waiting
    uint b_row[B_PER];
    bool b_live[B_PER];
    tile_weight_rows(tid, g0, b_row, b_live);

    const uint sg = tid / 32u, across = SLOTS / SG_SLOTS;
    const uint row0 = (sg / across) * SG_ROWS, slot0 = (sg % across) * SG_SLOTS;
    icoopmatNV<32, gl_ScopeSubgroup, CM, CM> acc[FRAGS_M][FRAGS_N];
    for (uint i = 0u; i < FRAGS_M; i++)
        for (uint f = 0u; f < FRAGS_N; f++)
            acc[i][f] = icoopmatNV<32, gl_ScopeSubgroup, CM, CM>(0);

    uvec4 a_reg[A_PER];
    uint b_reg[B_PER];
    const uint stages = (p.words + KW - 1u) / KW;
    for (uint st = 0u; st <= stages; st++) {
        // Stage st's words into registers (loaded while stage st - 1 is
        // multiplied below).
        if (st < stages)
            tile_load_stage(st, tid, a0, b_row, b_live, a_reg, b_reg);
        if (st > 0u) { // stage st - 1, in shared memory
            const uint ab = ((st - 1u) % BUFS) * TM * RS, bb = ((st - 1u) % BUFS) * SLOTS * RS;
            for (uint at = 0u; at < KW; at += CK / 16u) {
                icoopmatNV<8, gl_ScopeSubgroup, CM, CK> a[FRAGS_M];
                for (uint i = 0u; i < FRAGS_M; i++)
                    coopMatLoadNV(a[i], a_tile, ab + (row0 + i * CM) * RS + at, RS, false);
                for (uint f = 0u; f < FRAGS_N; f++) {
                    icoopmatNV<8, gl_ScopeSubgroup, CK, CM> b;
                    coopMatLoadNV(b, b_tile, bb + (slot0 + f * CM) * RS + at, RS, true);
                    for (uint i = 0u; i < FRAGS_M; i++)
                        acc[i][f] = coopMatMulAddNV(a[i], b, acc[i][f]);
                }
            }
        }
#ifndef DOUBLE_BUFFER // (two buffers: the other one is written, read a stage before)
        barrier(); // stage st - 1 is multiplied: its shared words may go
#endif
        if (st < stages) {
            const uint ab = (st % BUFS) * TM * RS, bb = (st % BUFS) * SLOTS * RS;
            for (uint i = 0u; i < A_PER; i++) {
                const uint e = tid + THREADS * i;
                if (e < TM * KW)
                    a_tile[ab + (e / KW) * RS + e % KW] = a_reg[i];
            }
            for (uint i = 0u; i < B_PER; i++) {
                const uint e = tid + THREADS * i;
                const uint c = b_reg[i];
                b_tile[bb + (e / KW) * RS + e % KW] =
                    uvec4(weights_of(c & 0xffu), weights_of((c >> 8u) & 0xffu),
                          weights_of((c >> 16u) & 0xffu), weights_of(c >> 24u));
            }
        }
        barrier(); // stage st is in shared memory
    }

    for (uint i = 0u; i < FRAGS_M; i++)
        for (uint f = 0u; f < FRAGS_N; f++)
            coopMatStoreNV(acc[i][f], sums, (row0 + i * CM) * SLOTS + slot0 + f * CM, SLOTS,
                           false);
    barrier();

    tile_epilogues(tid, g0, a0);
}
