/*
 * attn_paged_block.cuh - what every block of the paged attention kernels
 * (attn_paged.cu, attn_paged_e4m3.cuh) does alike: find its row and range
 * of positions, turn positions into cache offsets through the sequence's
 * block table, and take base-2 exponentials.
 */
#pragma once

#include <stdint.h>

#include "attn_paged_shares.cuh"
#include "cp_async.cuh"

namespace {

/* The positions block (listed row, kv head, split) of a launch works on:
 * the row, its position, its sequence's table and the range [begin, end);
 * false when the row does not use this split (the merge skips it). */
struct PagedRange {
    int row, pos, begin, end;
    const int32_t *table;
};

__device__ __forceinline__ bool paged_block_range(const int32_t *rows, const int32_t *row_seq,
                                                  const int32_t *row_pos, const int32_t *tables,
                                                  int max_blocks, PagedRange &r)
{
    const int listed = blockIdx.x, split = blockIdx.z;
    r.row = rows ? rows[listed] : listed;
    r.pos = row_pos[r.row];
    int span;
    if (split >= paged_row_splits(r.pos, (int)gridDim.z, &span))
        return false;
    r.table = tables + (int64_t)row_seq[r.row] * max_blocks;
    r.begin = split * span;
    r.end = min(r.begin + span, r.pos + 1);
    return true;
}

/* The table entry of position t (lane i of warp 0 loads position t0 + i of
 * a tile ahead of its use), -1 past end or where the table has none. */
__device__ __forceinline__ int table_entry(const int32_t *table, int bs, int t, int end)
{
    return t < end ? table[t / bs] : -1;
}

/* Offset (elements) of the head's slice of position t's cache row, from
 * its table entry; -1 for none (the row reads as zeros). */
__device__ __forceinline__ int64_t row_offset(int block, int bs, int t, int64_t kv_dim,
                                              int64_t head_off)
{
    return block < 0 ? -1 : ((int64_t)block * bs + t % bs) * kv_dim + head_off;
}

/* Thread i < TILE: rofs[i] = the offset of position t0 + i from its table
 * entry (*ahead, loaded a tile earlier), then the entry of position t0 +
 * TILE + i into *ahead for the next tile. A tile's offsets thus need no
 * global load of their own: the barrier after them does not wait for one. */
template <int TILE>
__device__ __forceinline__ void paged_offsets_ahead(int64_t *rofs, int &ahead,
                                                    const PagedRange &r, int bs, int t0,
                                                    int64_t kv_dim, int64_t head_off)
{
    const int i = threadIdx.x;
    if (i < TILE) {
        rofs[i] = row_offset(ahead, bs, t0 + i, kv_dim, head_off);
        ahead = table_entry(r.table, bs, t0 + TILE + i, r.end);
    }
}

/* The first tile's offsets (from table entries loaded now) and the
 * second tile's entries: the `ahead` a tile loop then carries. */
template <int TILE>
__device__ __forceinline__ int paged_offsets_first(int64_t *rofs, const PagedRange &r, int bs,
                                                   int64_t kv_dim, int64_t head_off)
{
    const int i = threadIdx.x;
    int ahead = i < TILE ? table_entry(r.table, bs, r.begin + i, r.end) : -1;
    paged_offsets_ahead<TILE>(rofs, ahead, r, bs, r.begin, kv_dim, head_off);
    return ahead;
}

/* The top of a tile loop over the range in two buffers, at tile t0 in
 * buffer buf: the next tile's offsets, the barrier that frees its buffer,
 * its copies (copy(b): the copies of the tile whose offsets are at rofs +
 * b TILE into buffer b), then the wait for this tile's copies and the
 * barrier that shows them to every warp. */
template <int TILE, class Copy>
__device__ __forceinline__ void paged_tile_turn(int t0, int buf, int64_t *rofs, int &ahead,
                                                const PagedRange &r, int bs, int64_t kv_dim,
                                                int64_t head_off, Copy &&copy)
{
    const bool more = t0 + TILE < r.end;
    if (more)
        paged_offsets_ahead<TILE>(rofs + (buf ^ 1) * TILE, ahead, r, bs, t0 + TILE, kv_dim,
                                  head_off);
    __syncthreads(); /* those offsets are in place; the other buffer is free */
    if (more)
        copy(buf ^ 1);
    cp_async_commit();
    cp_async_wait<1>(); /* this tile's copies */
    __syncthreads();
}

/* log2(e) and ln(2): the tensor-core kernels' scores are in base 2. */
constexpr float kLog2e = 1.4426950408889634f, kLn2 = 0.6931471805599453f;

/* 2^x by the MUFU (denormal results flushed: such weights add nothing to
 * fp32 sums of weights near 1). */
__device__ __forceinline__ float exp2_approx(float x)
{
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}


/* The tensor-core kernels' results (attn_paged.cu's fp16 kernel, the
 * e4m3 one): lane (gid, tig) holds o[mt][e] of heads 2 tig (e = 0, 2) and
 * 2 tig + 1 (e = 1, 3) at dims dim(mt, e >> 1); the running maximum m (base
 * 2) and weight l of head gid. One split writes the output itself (as
 * paged_merge gives a row of one share), more write this split's share:
 * [sum (HD)][max (natural units, as the FMA kernel's)][weight]. write_ml:
 * the lanes (one a head) that write the maximum and weight. */
template <int HD, int MT, class DimOf>
__device__ __forceinline__ void paged_write_result(const float (&o)[MT][4], float m, float l,
                                                   DimOf dim, bool write_ml, int n_heads,
                                                   int group, int row, int kvh, float *out,
                                                   int64_t ldo, float *part)
{
    const int lane = threadIdx.x & 31, gid = lane >> 2, tig = lane & 3;
    const int listed = blockIdx.x, split = blockIdx.z;
    const float la = __shfl_sync(0xffffffffu, l, 8 * tig);
    const float lb = __shfl_sync(0xffffffffu, l, 8 * tig + 4);
    const int ha = 2 * tig, hb = 2 * tig + 1;
    if (gridDim.z == 1) {
        float *orow = out + (int64_t)row * ldo + (int64_t)kvh * group * HD;
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                if (ha < group)
                    orow[ha * HD + dim(mt, half)] = o[mt][2 * half] / la;
                if (hb < group)
                    orow[hb * HD + dim(mt, half)] = o[mt][2 * half + 1] / lb;
            }
        return;
    }
    auto share = [&](int hg) {
        return part + (((int64_t)listed * n_heads + kvh * group + hg) * gridDim.z + split) *
                          (HD + 4);
    };
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int half = 0; half < 2; half++) {
            if (ha < group)
                share(ha)[dim(mt, half)] = o[mt][2 * half];
            if (hb < group)
                share(hb)[dim(mt, half)] = o[mt][2 * half + 1];
        }
    if (write_ml && tig == 0 && gid < group) {
        share(gid)[HD] = m * kLn2; /* natural units */
        share(gid)[HD + 1] = l;
    }
}

} // namespace
