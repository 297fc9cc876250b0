/* CPU test: the stream-K plan of the warp-specialized wgmma GEMM (its
 * stream-K kernels), walked on the host with the kernel's own partition
 * code (bn_w2a8_cuda_streamk_plan_check), over many tile counts, tile
 * lengths and grids; the kernel table's pick on the measured shapes; the
 * workspace size. The GPU side (bit-exact results over several grids) is
 * test_cuda_kernels. */
#include "test_util.h"
#include "w2a8_cuda.h"

static void check_plan(int64_t n_tiles, int64_t n_kt, int64_t grid)
{
    if (grid > n_tiles * n_kt)
        grid = n_tiles * n_kt; /* the launcher never runs more blocks than k-tiles */
    char why[256] = "";
    const int ok = bn_w2a8_cuda_streamk_plan_check(n_tiles, n_kt, grid, why, sizeof why);
    CHECK_MSG(ok, "%lld tiles x %lld k-tiles over %lld blocks: %s", (long long)n_tiles,
              (long long)n_kt, (long long)grid, why);
}

int main(void)
{
    /* Every small plan, then the measured shapes' (M = 512, 128 x 128 tiles,
     * 128-k tiles) over grids of several sizes. */
    for (int64_t tiles = 1; tiles <= 24; tiles++)
        for (int64_t kts = 1; kts <= 24; kts++)
            for (int64_t grid = 1; grid <= 40; grid++)
                check_plan(tiles, kts, grid);
    const int64_t shapes[][2] = {{80, 20},  {120, 20}, {432, 20},  {80, 54},
                                 {640, 25}, {160, 216}, {1728, 40}, {1, 1}};
    const int64_t grids[] = {1, 2, 3, 7, 13, 64, 114, 132, 1024};
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (size_t g = 0; g < sizeof grids / sizeof grids[0]; g++)
            check_plan(shapes[s][0], shapes[s][1], grids[g]);

    /* A plan the check refuses is reported, not passed. */
    char why[128] = "";
    CHECK(!bn_w2a8_cuda_streamk_plan_check(4, 4, 0, why, sizeof why) && why[0] != '\0');

    /* The table's pick on an H200's 132 SMs with wgmma (docs/KERNELS.md),
     * from 65 rows: 192 x 64 tiles shared by clusters of 4 (rows of 4096
     * or more) or 2 blocks where that fits one wave, the mma-rows kernel
     * (four tiles a warp) up to 128 rows where the 192 x 64 tiles number
     * at most a quarter of the SMs, then 256-row tiles once they fill three
     * quarters of the SMs, else 192-row tiles (stream-K where it pays)
     * once they do or the rows are long, else 192 x 64 where its tiles fit
     * one wave, else 128-row tiles (stream-K where it pays); one row the GEMV; up to 3 rows on matrices
     * of at most 40 Mi weights the GEMV over rows; up to 64 rows the
     * mma-rows kernel (four tiles a warp where columns of two tiles number
     * at least 8 an SM), except above 16 rows where the 192 x 64 tiles fill
     * half the SMs; without wgmma above 64 rows the mma.sync kernels. k is
     * the padded row length. */
#define K(name) BN_W2A8_##name
    static const struct {
        int64_t m, n, k;
        int wgmma, sms;
        bn_w2a8_kernel want;
    } picks[] = {
        /* the seven measured shapes at M = 512 and M = 16 */
        {512, 2560, 2560, 1, 132, K(WGMMA_192X64)},
        {512, 3840, 2560, 1, 132, K(WGMMA_128X128)},
        {512, 13824, 2560, 1, 132, K(WGMMA_256X128)},
        {512, 20480, 3328, 1, 132, K(WGMMA_256X128)},
        {512, 2560, 6912, 1, 132, K(WGMMA_192X64)},
        {512, 5120, 27648, 1, 132, K(WGMMA_192X128_STREAMK)},
        {512, 55296, 5120, 1, 132, K(WGMMA_256X128)},
        {16, 2560, 2560, 1, 132, K(MMA_ROWS_X2)},
        /* 256-row tiles fill three quarters of the SMs */
        {512, 8192, 2560, 1, 132, K(WGMMA_256X128)},
        {256, 13824, 2560, 1, 132, K(WGMMA_256X128)},
        {128, 13824, 2560, 1, 132, K(WGMMA_128X128)},
        /* 192-row tiles fill the SMs, 256-row ones not three quarters
         * of them (172 tiles of 192 rows, 128 of 256, on 172 SMs) */
        {512, 8192, 2560, 1, 172, K(WGMMA_192X128)},
        /* 192 x 64 tiles over one wave; stream-K pays */
        {512, 4608, 6912, 1, 132, K(WGMMA_128X128_STREAMK)},
        /* without wgmma */
        {32, 2560, 2560, 0, 132, K(MMA_ROWS_X2)},
        {512, 2560, 2560, 0, 132, K(TILED)},
        {512, 2560, 27648, 0, 132, K(PIPE_SPLITK)},
        {512, 13824, 2560, 0, 132, K(PIPE)},
        /* one SM: the widest tiles fill it; 160 columns of two tiles */
        {512, 5120, 27648, 1, 1, K(WGMMA_256X128)},
        {16, 2560, 2560, 1, 1, K(MMA_ROWS_X4)},
        /* one row: the GEMV */
        {1, 2560, 2560, 1, 132, K(GEMV)},
        {1, 55296, 5120, 0, 132, K(GEMV)},
        /* up to 3 rows: the GEMV over rows on matrices of at most 40 Mi
         * weights */
        {2, 2560, 2560, 1, 132, K(ROWS)},
        {3, 13824, 2560, 0, 132, K(ROWS)},
        {2, 55296, 5120, 1, 132, K(MMA_ROWS_X4)},
        {3, 20480, 3328, 1, 132, K(MMA_ROWS_X4)},
        {4, 2560, 2560, 1, 132, K(MMA_ROWS_X2)},
        {4, 55296, 5120, 0, 132, K(MMA_ROWS_X4)},
        {8, 13824, 2560, 1, 132, K(MMA_ROWS_X2)},
        {8, 20480, 3328, 1, 132, K(MMA_ROWS_X4)},
        {16, 5120, 27648, 1, 132, K(MMA_ROWS_X2)},
        {16, 55296, 5120, 1, 132, K(MMA_ROWS_X4)},
        /* 17-64 rows: the wgmma 192 x 64 tiles where they fill half the
         * SMs; 65 and up as at M = 512 */
        {17, 13824, 2560, 1, 132, K(WGMMA_192X64)},
        {24, 20480, 3328, 1, 132, K(WGMMA_192X64)},
        {24, 20480, 3328, 0, 132, K(MMA_ROWS_X4)},
        {33, 13824, 2560, 1, 132, K(WGMMA_192X64)},
        {48, 2560, 2560, 1, 132, K(MMA_ROWS_X2)},
        {64, 2560, 6912, 1, 132, K(MMA_ROWS_X2)},
        {64, 5120, 27648, 1, 132, K(MMA_ROWS_X4)},
        {64, 55296, 5120, 1, 132, K(WGMMA_192X64)},
        /* above 32 rows over rows of 16384 weights or more: four tiles a
         * warp */
        {33, 5120, 27648, 1, 132, K(MMA_ROWS_X4)},
        {32, 5120, 27648, 1, 132, K(MMA_ROWS_X2)},
        {48, 2560, 16384, 0, 132, K(MMA_ROWS_X4)},
        {48, 2560, 16128, 0, 132, K(MMA_ROWS_X2)},
        {96, 13824, 2560, 1, 132, K(WGMMA_128X128)},
        /* 65-128 rows where the 192 x 64 tiles number at most a quarter
         * of the SMs: the mma-rows kernel, four tiles a warp */
        {96, 2560, 2560, 1, 132, K(MMA_ROWS_X4)},
        {128, 2560, 2560, 1, 132, K(MMA_ROWS_X4)},
        {128, 55296, 5120, 1, 132, K(WGMMA_256X128)},
        /* from 65 rows, 192 x 64 tiles shared by clusters of 4 blocks
         * where that fits one wave on rows of 4096 values or more, else
         * of 2 where that does */
        {96, 2560, 6912, 1, 132, K(WGMMA_192X64_SPLIT4)},
        {128, 2560, 6912, 1, 132, K(WGMMA_192X64_SPLIT4)},
        {256, 2560, 6912, 1, 132, K(WGMMA_192X64_SPLIT2)},
        {128, 3840, 2560, 1, 132, K(WGMMA_192X64_SPLIT2)},
        {192, 2560, 2560, 1, 132, K(WGMMA_192X64_SPLIT2)},
        {256, 2560, 2560, 1, 132, K(WGMMA_192X64_SPLIT2)},
        {256, 3840, 2560, 1, 132, K(WGMMA_192X64)},
        {48, 2560, 2560, 0, 132, K(MMA_ROWS_X2)},
        {65, 2560, 2560, 0, 132, K(TILED)},
    };
    for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++) {
        const bn_w2a8_kernel got = bn_w2a8_cuda_gemm_pick(
            picks[i].m, picks[i].n, picks[i].k, picks[i].wgmma, picks[i].sms, 1);
        CHECK_MSG(got == picks[i].want,
                  "m %lld n %lld k %lld wgmma %d on %d SMs: %s, want %s", (long long)picks[i].m,
                  (long long)picks[i].n, (long long)picks[i].k, picks[i].wgmma, picks[i].sms,
                  bn_w2a8_cuda_kernel_name(got), bn_w2a8_cuda_kernel_name(picks[i].want));
        /* Without a stream-K workspace, the same tiles whole. */
        const bn_w2a8_kernel whole = bn_w2a8_cuda_gemm_pick(
            picks[i].m, picks[i].n, picks[i].k, picks[i].wgmma, picks[i].sms, 0);
        const bn_w2a8_kernel want = picks[i].want;
        const bn_w2a8_kernel want_whole = want == K(WGMMA_128X128_STREAMK)   ? K(WGMMA_128X128)
                                          : want == K(WGMMA_192X128_STREAMK) ? K(WGMMA_192X128)
                                                                             : want;
        CHECK_MSG(whole == want_whole && !bn_w2a8_cuda_kernel_streamk(whole),
                  "m %lld n %lld k %lld without a workspace: %s", (long long)picks[i].m,
                  (long long)picks[i].n, (long long)picks[i].k, bn_w2a8_cuda_kernel_name(whole));
        /* The backend's question for its workspace, on this device. */
        if (picks[i].wgmma == bn_w2a8_cuda_gemm_wgmma_usable())
            CHECK(bn_w2a8_cuda_gemm_needs_streamk(picks[i].m, picks[i].n, picks[i].k,
                                                  picks[i].sms) ==
                  bn_w2a8_cuda_kernel_streamk(got));
        /* Without wgmma the table never picks a wgmma kernel. */
        CHECK(!bn_w2a8_cuda_kernel_wgmma(bn_w2a8_cuda_gemm_pick(picks[i].m, picks[i].n,
                                                                picks[i].k, 0, picks[i].sms, 1)));
    }
#undef K

    /* Workspace: 1024 counters, then two 192 x 128 int32 slots per block
     * (0 SMs counts as 132; more than 1024 as 1024). */
    CHECK(bn_w2a8_cuda_gemm_streamk_bytes(132) == (1024 + 2 * 132 * 24576) * sizeof(int32_t));
    CHECK(bn_w2a8_cuda_gemm_streamk_bytes(0) == bn_w2a8_cuda_gemm_streamk_bytes(132));
    CHECK(bn_w2a8_cuda_gemm_streamk_bytes(5000) == bn_w2a8_cuda_gemm_streamk_bytes(1024));
    TEST_EXIT();
}
