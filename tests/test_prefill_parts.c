/* CPU test: how many parts the fp32-cache prefill attention splits a chunk
 * into (bn_cb_attn_prefill_parts, host code): the picks on the shapes
 * measured in docs/PERFORMANCE.md, and over many chunks, contexts, GPU
 * sizes and workspaces the rule's bounds: a power of two up to
 * BN_CB_PREFILL_MAX_PARTS, no more parts than the last row block has tiles
 * of 64 positions, a grid of at most four waves of two blocks an SM (or one
 * part), a workspace that fits, one part where the tiled kernel does not
 * take the head size or the arguments say nothing to split. The kernels'
 * results in parts are test_cuda_prefill_attn's. */
#include "cuda_backend_kernels.h"
#include "test_util.h"

static void check_bounds(const bn_cb_attn_shape *s, int n, int64_t visible, int sms, size_t ws)
{
    const int p = bn_cb_attn_prefill_parts(s, n, visible, sms, ws);
    const int64_t tiles = (visible + 63) / 64, row_blocks = (n + 63) / 64;
    CHECK_MSG(p == 1 || p == 2 || p == 4 || p == 8, "n %d visible %lld sms %d: %d parts", n,
              (long long)visible, sms, p);
    if (p > 1) {
        CHECK_MSG(p <= tiles, "n %d visible %lld: %d parts over %lld tiles", n,
                  (long long)visible, p, (long long)tiles);
        CHECK_MSG(row_blocks * s->n_heads * p <= 8 * (int64_t)sms,
                  "n %d visible %lld sms %d: %d parts, %lld blocks", n, (long long)visible, sms,
                  p, (long long)(row_blocks * s->n_heads * p));
        CHECK_MSG(bn_cb_attn_prefill_workspace_bytes(s, n, p) <= ws,
                  "n %d: %d parts need %zu bytes, %zu given", n, p,
                  bn_cb_attn_prefill_workspace_bytes(s, n, p), ws);
    }
    /* Maximal: the next power of two would break a bound. */
    if (p < BN_CB_PREFILL_MAX_PARTS && s->head_dim % 64 == 0 && s->head_dim <= 128)
        CHECK_MSG(2 * p > tiles || row_blocks * s->n_heads * 2 * p > 8 * (int64_t)sms ||
                      bn_cb_attn_prefill_workspace_bytes(s, n, 2 * p) > ws,
                  "n %d visible %lld sms %d: %d parts where %d fit", n, (long long)visible, sms,
                  p, 2 * p);
}

int main(void)
{
    const bn_cb_attn_shape s2b = {20, 5, 128, 4096};
    const size_t big = (size_t)1 << 40;
    /* The measured shapes (an H100's 132 SMs): a first 512-token chunk, 512
     * tokens after 1536 positions, 32 after 1000; the 2B-4T backend's
     * workspace (512 rows of gate|up outputs, 13824 floats each). */
    const size_t gu = (size_t)512 * 13824 * sizeof(float);
    CHECK(bn_cb_attn_prefill_parts(&s2b, 512, 512, 132, gu) == 4);
    CHECK(bn_cb_attn_prefill_parts(&s2b, 512, 2048, 132, gu) == 4);
    CHECK(bn_cb_attn_prefill_parts(&s2b, 32, 1032, 132, gu) == 8);
    CHECK(bn_cb_attn_prefill_parts(&s2b, 40, 40, 132, gu) == 1);  /* one tile */
    CHECK(bn_cb_attn_prefill_parts(&s2b, 40, 80, 132, gu) == 2);  /* two */
    CHECK(bn_cb_attn_prefill_parts(&s2b, 72, 72, 132, gu) == 2);
    /* Bounded by the workspace: 4 parts of 512 rows need 21.3 MB. */
    CHECK(bn_cb_attn_prefill_parts(&s2b, 512, 2048, 132, (size_t)12 << 20) == 2);
    CHECK(bn_cb_attn_prefill_parts(&s2b, 512, 2048, 132, 0) == 1);
    /* Nothing to split, or not the tiled kernel's head sizes. */
    const bn_cb_attn_shape hd36 = {4, 2, 36, 4096}, hd256 = {4, 2, 256, 4096};
    CHECK(bn_cb_attn_prefill_parts(&hd36, 32, 1032, 132, big) == 1);
    CHECK(bn_cb_attn_prefill_parts(&hd256, 32, 1032, 132, big) == 1);
    CHECK(bn_cb_attn_prefill_parts(&s2b, 0, 1032, 132, big) == 1);
    CHECK(bn_cb_attn_prefill_parts(&s2b, 32, 0, 132, big) == 1);
    CHECK(bn_cb_attn_prefill_parts(&s2b, 32, 1032, 0, big) == 1);
    CHECK(bn_cb_attn_prefill_parts(NULL, 32, 1032, 132, big) == 1);

    const bn_cb_attn_shape shapes[] = {s2b, {8, 8, 64, 4096}, {32, 8, 128, 4096}, {1, 1, 64, 64}};
    const int ns[] = {1, 2, 31, 63, 64, 65, 128, 200, 512, 2048};
    const int64_t extra[] = {0, 1, 63, 64, 100, 500, 1536, 4000, 100000};
    const int sms[] = {1, 16, 78, 114, 132, 148};
    const size_t wss[] = {0, (size_t)1 << 20, (size_t)64 << 20, big};
    for (size_t a = 0; a < sizeof shapes / sizeof shapes[0]; a++)
        for (size_t b = 0; b < sizeof ns / sizeof ns[0]; b++)
            for (size_t c = 0; c < sizeof extra / sizeof extra[0]; c++)
                for (size_t d = 0; d < sizeof sms / sizeof sms[0]; d++)
                    for (size_t e = 0; e < sizeof wss / sizeof wss[0]; e++)
                        check_bounds(&shapes[a], ns[b], ns[b] + extra[c], sms[d], wss[e]);
    TEST_EXIT();
}
