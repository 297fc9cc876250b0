#version 450
// The W2A8 product for a pass of many activation rows on the device's
// subgroup matrix products (VK_NV_cooperative_matrix: int8 operands, int32
// sums, 16 x 32 by 32 x 16 a product): the tiles of w2a8_tile.glsl, 32
// activation rows times 64 weight rows a workgroup of eight subgroups of
// 32, K a stage of eight weight words (128 values) at a time. Each stage's
// activation codes are copied into shared memory as they are, its weight
// words spread to one int8 a weight (-1, 0, +1); each subgroup then
// multiplies its 16 rows times 16 slots of the tile over the stage, and
// after the last stage stores its sums into shared memory for the
// epilogues.
//
// The sums are exact in int32 (|sum| <= 127 k), so they equal the other
// kernels' bit for bit whatever order the hardware adds in: the same
// outputs as w2a8_matvec.glsl through the same epilogues (exact division).
// Same bindings, push constants and modes as w2a8_matvec.glsl
// (w2a8_params.glsl).
//
// H200 (NVIDIA 580.159.04), a 64-row prompt chunk of the 2B-4T shape, us a
// layer's q|k|v, Wo, gate|up and down, one call: 28.1, 21.3, 41.2, 42.3 as
// here; four subgroups of 16 rows x 32 slots 38.9, 26.6, 49.2, 51.1; 16
// words a stage 25.6, 18.6, 56.3, 33.4; two stage buffers (one barrier a
// stage) 27.8, 20.6, 61.3, 42.1; 64 rows and sixteen subgroups 32.0, 23.8,
// 43.6, 48.4; 16 rows and four subgroups 28.8, 22.3, 58.7, 44.1; two
// subgroups of 32 x 32 (2 x 2 products) 66.8, 44.4, 75.7, 86.0; the weights
// spread through a 256-entry table in shared memory slower than the
// arithmetic (39.3, 27.1, 54.6, 53.6 against four subgroups' 38.0, 26.4,
// 49.6, 50.9). The stage's loads, spreading and barriers bound it, not the
// products: more invocations to share them win while the shared memory
// still lets the many workgroups of gate|up stay resident.
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_spirv_intrinsics : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_NV_cooperative_matrix : require
#extension GL_NV_integer_cooperative_matrix : require
#extension GL_EXT_shader_explicit_arithmetic_types_int8 : require
#define EXACT_DIVISION 1

#include "sdot.glsl" // spread_codes

#define TM 32u       // activation rows a workgroup (vk_w2a8.c's TILE_ROWS)
#define THREADS 256u // eight subgroups of 32 (vk_context.c asks for 32)
#define SLOTS 64u    // weight rows a workgroup: eight groups of eight
#define KW 8u        // weight words a stage: 128 values of K
// A row's (or a slot's) 128 stage values take KW uvec4s of shared memory;
// rows lie RS uvec4s apart, one more than that, so that the eight rows a
// matrix load reads at once start on different banks.
#define RS (KW + 1u)
#define CM 16u // a subgroup's rows and slots: one 16 x 16 product's
#define CK 32u // K a product
layout(local_size_x = 256) in;

#include "w2a8_params.glsl"

// epilogue_scale, epilogue_store.
#include "w2a8_epilogue.glsl"
// qkv_geometry, qkv_epilogue.
#include "w2a8_qkv.glsl"

shared uvec4 a_tile[TM * RS];    // the stage's activation codes, row r at r RS
shared uvec4 b_tile[SLOTS * RS]; // its weights, one int8 each, slot s at s RS
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

    // Subgroup sg: rows (sg / 4) 16 .. + 15 of the tile, slots (sg % 4) 16 ...
    const uint sg = tid / 32u, row0 = (sg / (SLOTS / CM)) * CM, slot0 = (sg % (SLOTS / CM)) * CM;
    icoopmatNV<32, gl_ScopeSubgroup, CM, CM> acc = icoopmatNV<32, gl_ScopeSubgroup, CM, CM>(0);

    uvec4 a_reg[A_PER];
    uint b_reg[B_PER];
    const uint stages = (p.words + KW - 1u) / KW;
    for (uint st = 0u; st <= stages; st++) {
        // Stage st's words into registers (loaded while stage st - 1 is
        // multiplied below).
        if (st < stages)
            tile_load_stage(st, tid, a0, b_row, b_live, a_reg, b_reg);
        if (st > 0u) { // stage st - 1, in shared memory
            for (uint at = 0u; at < KW; at += CK / 16u) { // uvec4s into a row
                icoopmatNV<8, gl_ScopeSubgroup, CM, CK> a;
                icoopmatNV<8, gl_ScopeSubgroup, CK, CM> b;
                coopMatLoadNV(a, a_tile, row0 * RS + at, RS, false);
                coopMatLoadNV(b, b_tile, slot0 * RS + at, RS, true);
                acc = coopMatMulAddNV(a, b, acc);
            }
        }
        barrier(); // stage st - 1 is multiplied: its shared words may go
        if (st < stages) {
            for (uint i = 0u; i < A_PER; i++) {
                const uint e = tid + THREADS * i;
                if (e < TM * KW)
                    a_tile[(e / KW) * RS + e % KW] = a_reg[i];
            }
            for (uint i = 0u; i < B_PER; i++) {
                const uint e = tid + THREADS * i;
                const uint c = b_reg[i];
                b_tile[(e / KW) * RS + e % KW] =
                    uvec4(weights_of(c & 0xffu), weights_of((c >> 8u) & 0xffu),
                          weights_of((c >> 16u) & 0xffu), weights_of(c >> 24u));
            }
        }
        barrier(); // stage st is in shared memory
    }

    coopMatStoreNV(acc, sums, row0 * SLOTS + slot0, SLOTS, false);
    barrier();

    tile_epilogues(tid, g0, a0);
}
