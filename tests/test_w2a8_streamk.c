/* CPU test: the stream-K plan of the warp-specialized wgmma GEMM (variants
 * 11, 13 and 15), walked on the host with the kernel's own partition code
 * (bn_w2a8_cuda_streamk_plan_check), over many tile counts, tile lengths
 * and grids; the GEMM's default-variant rule on the measured shapes; the
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

    /* The default variant on an H200's 132 SMs with wgmma
     * (docs/PERFORMANCE.md), from 65 rows: 256-row tiles (16) once they fill
     * the SMs, else 192-row tiles (14, stream-K 15) once they do or the
     * rows are long, else 192 x 64 (17) where its tiles fit one wave, else
     * 128-row tiles (12, stream-K 13); stream-K where it spares the busiest
     * SM >= BN_W2A8_STREAMK_MIN_SAVED k-tiles; up to 3 rows on matrices of
     * at most 40 Mi weights the GEMV over rows (18); up to 64 rows the
     * mma-rows kernel (19, or 20 where columns of two tiles number at least
     * 8 an SM), except above 16 rows where the 192 x 64 tiles (17) fill half
     * the SMs; without wgmma above 64 rows the mma.sync kernels (0, 2, 3). k
     * is the padded row length. */
    static const struct {
        int64_t m, n, k;
        int wgmma, sms, want;
    } picks[] = {
        {512, 2560, 2560, 1, 132, 17},   {512, 3840, 2560, 1, 132, 12},
        {512, 13824, 2560, 1, 132, 16},  {512, 20480, 3328, 1, 132, 16},
        {512, 2560, 6912, 1, 132, 17},   {512, 5120, 27648, 1, 132, 15},
        {512, 55296, 5120, 1, 132, 16},  {16, 2560, 2560, 1, 132, 19},
        {512, 8192, 2560, 1, 132, 14}, /* 192-row tiles fill the SMs, 256-row ones not */
        {512, 4608, 6912, 1, 132, 13}, /* 192 x 64 tiles over one wave; stream-K pays */
        {32, 2560, 2560, 0, 132, 19},    {512, 2560, 2560, 0, 132, 0},
        {512, 2560, 27648, 0, 132, 2},   {512, 13824, 2560, 0, 132, 3},
        {512, 5120, 27648, 1, 1, 16}, /* one SM: the widest tiles fill it */
        {16, 2560, 2560, 1, 1, 20},   /* one SM: 160 columns of two tiles */
        /* up to 3 rows: the GEMV over rows on matrices of at most 40 Mi
         * weights */
        {2, 2560, 2560, 1, 132, 18},     {3, 13824, 2560, 0, 132, 18},
        {2, 55296, 5120, 1, 132, 20},    {3, 20480, 3328, 1, 132, 20},
        {4, 2560, 2560, 1, 132, 19},     {4, 55296, 5120, 0, 132, 20},
        {8, 13824, 2560, 1, 132, 19},    {8, 20480, 3328, 1, 132, 20},
        {16, 5120, 27648, 1, 132, 19},   {16, 55296, 5120, 1, 132, 20},
        /* 17-64 rows: the wgmma 192 x 64 tiles where they fill half the
         * SMs; 65 and up as at M = 512 */
        {17, 13824, 2560, 1, 132, 17},   {24, 20480, 3328, 1, 132, 17},
        {24, 20480, 3328, 0, 132, 20},   {33, 13824, 2560, 1, 132, 17},
        {48, 2560, 2560, 1, 132, 19},    {64, 2560, 6912, 1, 132, 19},
        {64, 5120, 27648, 1, 132, 20},   {64, 55296, 5120, 1, 132, 17},
        /* above 32 rows over rows of 16384 weights or more: four tiles a warp */
        {33, 5120, 27648, 1, 132, 20},   {32, 5120, 27648, 1, 132, 19},
        {48, 2560, 16384, 0, 132, 20},   {48, 2560, 16128, 0, 132, 19},
        {96, 13824, 2560, 1, 132, 12},   {96, 2560, 6912, 1, 132, 17},
        {128, 2560, 2560, 1, 132, 17},   {128, 55296, 5120, 1, 132, 16},
        {256, 2560, 2560, 1, 132, 17},   {48, 2560, 2560, 0, 132, 19},
        {65, 2560, 2560, 0, 132, 0},
    };
    for (size_t i = 0; i < sizeof picks / sizeof picks[0]; i++) {
        const int got = bn_w2a8_cuda_gemm_default_variant(picks[i].m, picks[i].n, picks[i].k,
                                                          picks[i].wgmma, picks[i].sms);
        CHECK_MSG(got == picks[i].want,
                  "m %lld n %lld k %lld wgmma %d on %d SMs: variant %d, want %d",
                  (long long)picks[i].m, (long long)picks[i].n, (long long)picks[i].k,
                  picks[i].wgmma, picks[i].sms, got, picks[i].want);
    }

    /* Workspace: 1024 counters, then two 192 x 128 int32 slots per block
     * (0 SMs counts as 132; more than 1024 as 1024). */
    CHECK(bn_w2a8_cuda_gemm_streamk_bytes(132) == (1024 + 2 * 132 * 24576) * sizeof(int32_t));
    CHECK(bn_w2a8_cuda_gemm_streamk_bytes(0) == bn_w2a8_cuda_gemm_streamk_bytes(132));
    CHECK(bn_w2a8_cuda_gemm_streamk_bytes(5000) == bn_w2a8_cuda_gemm_streamk_bytes(1024));
    TEST_EXIT();
}
