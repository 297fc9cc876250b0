/*
 * test_kv_blocks.c - the paged KV cache's bookkeeping (src/engine/kv_blocks.h):
 *   - block tables grow a block at a time; blocks are distinct;
 *   - prefix sharing: whole blocks of an equal prefix are taken as they
 *     are (held by a running sequence or cached after it closed), one token
 *     always left to compute, a diverging block ends the reuse;
 *   - eviction order under LRU, FIFO and LFU, each in a scenario where the
 *     three choose differently;
 *   - a request for more blocks than there are fails and changes nothing;
 *   - truncation, also into a block another sequence shares;
 *   - random open / reuse / append / truncate / close against the pool's
 *     invariants.
 */
#include <stdlib.h>
#include <string.h>

#include "kv_blocks.h"
#include "test_util.h"

static bn_kv_blocks *make(int32_t bs, int32_t n_blocks, int32_t max_seqs, bn_kv_evict evict,
                          bool sharing)
{
    const bn_kv_blocks_config cfg = {.block_size = bs,
                                     .n_blocks = n_blocks,
                                     .max_seqs = max_seqs,
                                     .evict = evict,
                                     .prefix_sharing = sharing};
    bn_kv_blocks *kv = NULL;
    bn_error err;
    CHECK_MSG(bn_kv_blocks_create(&cfg, &kv, &err) == BN_OK, "%s", err.message);
    return kv;
}

static int32_t seq_with(bn_kv_blocks *kv, const int32_t *tokens, int64_t n, int64_t *reused)
{
    int32_t s = -1;
    bn_error err;
    CHECK(bn_kv_seq_open(kv, &s, &err) == BN_OK);
    int64_t r = 0;
    CHECK(bn_kv_seq_reuse_prefix(kv, s, tokens, n, &r, &err) == BN_OK);
    CHECK_MSG(bn_kv_seq_append(kv, s, tokens + r, n - r, &err) == BN_OK, "%s", err.message);
    bn_kv_seq_commit(kv, s, n);
    if (reused)
        *reused = r;
    return s;
}

static void check_basics(void)
{
    bn_kv_blocks *kv = make(16, 64, 4, BN_KV_EVICT_LRU, true);
    int32_t t[100];
    for (int i = 0; i < 100; i++)
        t[i] = 1000 + i;
    int64_t r = -1;
    const int32_t a = seq_with(kv, t, 100, &r);
    CHECK(r == 0 && bn_kv_seq_len(kv, a) == 100);
    int32_t n = 0;
    const int32_t *ta = bn_kv_seq_table(kv, a, &n);
    CHECK(n == 7 && bn_kv_blocks_for(kv, 100) == 7);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            CHECK(ta[i] != ta[j]);
    int32_t a_table[7];
    memcpy(a_table, ta, sizeof a_table);

    /* B starts with the same 100 tokens: 6 whole blocks reused (96
     * positions; the 7th is partial and the last token must run). */
    const int32_t b = seq_with(kv, t, 100, &r);
    CHECK(r == 96);
    const int32_t *tb = bn_kv_seq_table(kv, b, &n);
    CHECK(n == 7);
    for (int i = 0; i < 6; i++)
        CHECK(tb[i] == a_table[i]);
    CHECK(tb[6] != a_table[6]);
    bn_kv_blocks_stats st;
    bn_kv_blocks_get_stats(kv, &st);
    CHECK(st.held == 8 && st.free == 56 && st.cached == 0 && st.reused_blocks == 6);
    CHECK(st.peak_held == 8);

    /* Exactly 96 tokens: 5 blocks reused, the last whole block computed
     * again for the logits. */
    const int32_t c = seq_with(kv, t, 96, &r);
    CHECK(r == 80);

    /* Closed, A's and B's full blocks stay cached (B's 7th is partial). */
    bn_kv_seq_close(kv, a);
    bn_kv_seq_close(kv, b);
    bn_kv_seq_close(kv, c);
    bn_kv_blocks_get_stats(kv, &st);
    CHECK_MSG(st.cached == 6 && st.held == 0 && st.free == 58, "cached %d held %d free %d",
              st.cached, st.held, st.free);
    CHECK(st.peak_held == 9); /* A (7), B (1 of its own) and C (1) at once */
    bn_kv_blocks_reset_peak(kv);
    bn_kv_blocks_get_stats(kv, &st);
    CHECK(st.peak_held == 0);

    /* A prompt diverging in its third block reuses two. */
    int32_t d[70];
    memcpy(d, t, sizeof d);
    d[40] = 7;
    const int32_t e = seq_with(kv, d, 70, &r);
    CHECK(r == 32);
    bn_kv_seq_close(kv, e);

    /* Blocks whose positions are not computed are neither shared nor
     * cached: appended and closed uncommitted, they are freed. */
    int32_t u[40];
    for (int i = 0; i < 40; i++)
        u[i] = 5000 + i;
    int32_t us = -1;
    bn_error err;
    CHECK(bn_kv_seq_open(kv, &us, &err) == BN_OK);
    CHECK(bn_kv_seq_append(kv, us, u, 40, &err) == BN_OK);
    bn_kv_seq_commit(kv, us, 16); /* one block computed */
    const int32_t probe = seq_with(kv, u, 40, &r);
    CHECK_MSG(r == 16, "reused %lld of a sequence with 16 positions computed", (long long)r);
    bn_kv_seq_close(kv, probe);
    bn_kv_blocks_get_stats(kv, &st);
    const int32_t cached_before = st.cached;
    bn_kv_seq_close(kv, us);
    bn_kv_blocks_get_stats(kv, &st);
    /* Its first block (computed, shared with the probe) stays cached; the
     * second (full, never computed) and the partial third are freed. */
    CHECK_MSG(st.cached == cached_before + 1, "closing cached %d blocks, not 1",
              st.cached - cached_before);

    /* Without sharing nothing is reused, and closing frees everything. */
    bn_kv_blocks *plain = make(16, 64, 4, BN_KV_EVICT_LRU, false);
    const int32_t p1 = seq_with(plain, t, 100, &r);
    const int32_t p2 = seq_with(plain, t, 100, &r);
    CHECK(r == 0);
    bn_kv_seq_close(plain, p1);
    bn_kv_seq_close(plain, p2);
    bn_kv_blocks_get_stats(plain, &st);
    CHECK(st.free == 64 && st.cached == 0);
    bn_kv_blocks_free(plain);
    bn_kv_blocks_free(kv);
}

/* One full block of 4 tokens starting at v, left cached. */
static void cached_block(bn_kv_blocks *kv, int32_t v)
{
    const int32_t t[4] = {v, v + 1, v + 2, v + 3};
    bn_kv_seq_close(kv, seq_with(kv, t, 4, NULL));
}

/* Whether a sequence starting with that block would reuse it. */
static bool still_cached(bn_kv_blocks *kv, int32_t v)
{
    const int32_t t[5] = {v, v + 1, v + 2, v + 3, 0};
    int32_t s = -1;
    int64_t r = 0;
    bn_error err;
    CHECK(bn_kv_seq_open(kv, &s, &err) == BN_OK);
    CHECK(bn_kv_seq_reuse_prefix(kv, s, t, 5, &r, &err) == BN_OK);
    bn_kv_seq_close(kv, s);
    return r == 4;
}

/* Blocks X, Y, Z cached so that LRU gives up Y (released longest ago),
 * FIFO X (filled first) and LFU Z (used once); then a sequence needing
 * two blocks takes the free one and evicts one. */
static void check_eviction(bn_kv_evict policy, int32_t victim)
{
    bn_kv_blocks *kv = make(4, 4, 2, policy, true);
    enum { X = 10, Y = 20, Z = 30 };
    cached_block(kv, X);
    cached_block(kv, Y);
    CHECK(still_cached(kv, Y)); /* Y: 2 uses */
    for (int i = 0; i < 3; i++)
        CHECK(still_cached(kv, X)); /* X: 4 uses, used last */
    cached_block(kv, Z);            /* Z: 1 use, filled last */
    bn_kv_blocks_stats st;
    bn_kv_blocks_get_stats(kv, &st);
    CHECK(st.cached == 3 && st.free == 1);
    const int32_t w[8] = {90, 91, 92, 93, 94, 95, 96, 97};
    const int32_t s = seq_with(kv, w, 8, NULL);
    bn_kv_blocks_get_stats(kv, &st);
    CHECK(st.evictions == 1 && st.cached == 2 && st.held == 2);
    bn_kv_seq_close(kv, s);
    const int32_t all[3] = {X, Y, Z};
    for (int i = 0; i < 3; i++)
        CHECK_MSG(still_cached(kv, all[i]) == (all[i] != victim), "%s: block %d %s",
                  bn_kv_evict_name(policy), all[i],
                  all[i] == victim ? "should be evicted" : "should stay");
    bn_kv_blocks_free(kv);
}

static void check_out_of_blocks(void)
{
    bn_kv_blocks *kv = make(4, 4, 2, BN_KV_EVICT_LRU, true);
    int32_t t[17];
    for (int i = 0; i < 17; i++)
        t[i] = i;
    int32_t s = -1;
    bn_error err;
    CHECK(bn_kv_seq_open(kv, &s, &err) == BN_OK);
    CHECK(bn_kv_seq_append(kv, s, t, 17, &err) == BN_ERR_OUT_OF_MEMORY);
    CHECK_STR_CONTAINS(err.message, "more are needed");
    bn_kv_blocks_stats st;
    bn_kv_blocks_get_stats(kv, &st);
    CHECK(bn_kv_seq_len(kv, s) == 0 && st.free == 4 && st.failed == 1);
    /* What fits still goes. */
    CHECK(bn_kv_seq_append(kv, s, t, 16, &err) == BN_OK);
    CHECK(bn_kv_seq_append(kv, s, t + 16, 1, &err) == BN_ERR_OUT_OF_MEMORY);
    CHECK(bn_kv_seq_len(kv, s) == 16);
    /* A second sequence gets the blocks back once the first closes. */
    int32_t s2 = -1;
    CHECK(bn_kv_seq_open(kv, &s2, &err) == BN_OK);
    CHECK(bn_kv_seq_append(kv, s2, t, 1, &err) == BN_ERR_OUT_OF_MEMORY);
    bn_kv_seq_close(kv, s);
    CHECK(bn_kv_seq_append(kv, s2, t, 1, &err) == BN_OK);
    /* Sequences are limited too. */
    int32_t s3 = -1, s4 = -1;
    CHECK(bn_kv_seq_open(kv, &s3, &err) == BN_OK);
    CHECK(bn_kv_seq_open(kv, &s4, &err) == BN_ERR_OUT_OF_MEMORY);
    /* Bad configurations and calls. */
    bn_kv_blocks *bad = NULL;
    const bn_kv_blocks_config zero = {0};
    CHECK(bn_kv_blocks_create(&zero, &bad, &err) == BN_ERR_INVALID_ARGUMENT && !bad);
    CHECK(bn_kv_seq_append(kv, 99, t, 1, &err) == BN_ERR_INVALID_ARGUMENT);
    int64_t r = 0;
    CHECK(bn_kv_seq_reuse_prefix(kv, s2, t, 4, &r, &err) == BN_ERR_INVALID_ARGUMENT);
    bn_kv_evict e;
    CHECK(bn_kv_evict_parse("lfu", &e) && e == BN_KV_EVICT_LFU && !bn_kv_evict_parse("mru", &e));
    bn_kv_blocks_free(kv);
}

static void check_truncate(void)
{
    bn_kv_blocks *kv = make(4, 16, 3, BN_KV_EVICT_LRU, true);
    int32_t t[10];
    for (int i = 0; i < 10; i++)
        t[i] = 50 + i;
    const int32_t a = seq_with(kv, t, 10, NULL);
    bn_error err;
    int64_t kept = -1;
    CHECK(bn_kv_seq_truncate(kv, a, 6, &kept, &err) == BN_OK && kept == 6);
    int32_t n = 0;
    (void)bn_kv_seq_table(kv, a, &n);
    CHECK(n == 2 && bn_kv_seq_len(kv, a) == 6);
    /* Writing on from 6 with other tokens: the cut block is A's alone. */
    const int32_t other[4] = {1, 2, 3, 4};
    CHECK(bn_kv_seq_append(kv, a, other, 4, &err) == BN_OK);
    bn_kv_seq_commit(kv, a, 10);
    /* B shares A's first two blocks ([50..53], [54,55,1,2]); cutting B
     * inside the second one lets it go: B keeps 4. */
    int32_t bt[9] = {50, 51, 52, 53, 54, 55, 1, 2, 9};
    int64_t r = 0;
    const int32_t b = seq_with(kv, bt, 9, &r);
    CHECK(r == 8);
    CHECK(bn_kv_seq_truncate(kv, b, 6, &kept, &err) == BN_OK && kept == 4);
    CHECK(bn_kv_seq_len(kv, b) == 4);
    /* A still holds its blocks, and B grows again from 4. */
    CHECK(bn_kv_seq_len(kv, a) == 10);
    CHECK(bn_kv_seq_append(kv, b, bt + 4, 2, &err) == BN_OK && bn_kv_seq_len(kv, b) == 6);
    CHECK(bn_kv_seq_truncate(kv, b, 7, &kept, &err) == BN_ERR_INVALID_ARGUMENT);
    CHECK(bn_kv_seq_truncate(kv, b, 0, &kept, &err) == BN_OK && kept == 0);
    bn_kv_blocks_free(kv);
}

/* Random operations; after each, the pool's counts add up and every open
 * sequence's table has the blocks its length needs, all distinct. */
static void check_random(void)
{
    enum { SEQS = 6, BLOCKS = 20, BS = 8 };
    bn_kv_blocks *kv = make(BS, BLOCKS, SEQS, BN_KV_EVICT_LFU, true);
    int32_t open_seqs[SEQS];
    int n_open = 0;
    unsigned rng = 12345;
    bn_error err;
    for (int step = 0; step < 4000; step++) {
        rng = rng * 1103515245u + 12345u;
        const unsigned op = (rng >> 16) % 5;
        int32_t toks[40];
        const int n = 1 + (int)((rng >> 8) % 40);
        for (int i = 0; i < n; i++) /* few distinct prompts: prefixes repeat */
            toks[i] = (int32_t)((i < 16 ? (rng >> 20) % 3 : rng >> 4) % 7 + i);
        if (op == 0 && n_open < SEQS) {
            int32_t s;
            int64_t r;
            CHECK(bn_kv_seq_open(kv, &s, &err) == BN_OK);
            CHECK(bn_kv_seq_reuse_prefix(kv, s, toks, n, &r, &err) == BN_OK);
            CHECK(r % BS == 0 && r < n);
            if (bn_kv_seq_append(kv, s, toks + r, n - r, &err) != BN_OK)
                CHECK(err.status == BN_ERR_OUT_OF_MEMORY && bn_kv_seq_len(kv, s) == r);
            else if (rng & 1)
                bn_kv_seq_commit(kv, s, n);
            open_seqs[n_open++] = s;
        } else if (op == 1 && n_open > 0) {
            const int k = (int)((rng >> 4) % (unsigned)n_open);
            bn_kv_seq_close(kv, open_seqs[k]);
            open_seqs[k] = open_seqs[--n_open];
        } else if (op == 2 && n_open > 0) {
            const int32_t s = open_seqs[(rng >> 4) % (unsigned)n_open];
            const int64_t before = bn_kv_seq_len(kv, s);
            if (bn_kv_seq_append(kv, s, toks, n, &err) == BN_OK) {
                CHECK(bn_kv_seq_len(kv, s) == before + n);
                bn_kv_seq_commit(kv, s, before + n);
            } else
                CHECK(bn_kv_seq_len(kv, s) == before);
        } else if (op == 3 && n_open > 0) {
            const int32_t s = open_seqs[(rng >> 4) % (unsigned)n_open];
            const int64_t len = bn_kv_seq_len(kv, s);
            const int64_t to = len ? (int64_t)((rng >> 2) % (unsigned)(len + 1)) : 0;
            int64_t kept;
            CHECK(bn_kv_seq_truncate(kv, s, to, &kept, &err) == BN_OK);
            CHECK(kept <= to && to - kept < BS && kept % BS == (kept == to ? to % BS : 0));
        }
        bn_kv_blocks_stats st;
        bn_kv_blocks_get_stats(kv, &st);
        CHECK(st.free + st.cached + st.held == BLOCKS && st.seqs_open == n_open);
        CHECK(bn_kv_blocks_available(kv) == st.free + st.cached);
        int32_t seen[BLOCKS] = {0};
        int distinct_held = 0;
        for (int i = 0; i < n_open; i++) {
            int32_t nb;
            const int32_t *tab = bn_kv_seq_table(kv, open_seqs[i], &nb);
            CHECK(nb == bn_kv_blocks_for(kv, bn_kv_seq_len(kv, open_seqs[i])));
            for (int j = 0; j < nb; j++) {
                CHECK(tab[j] >= 0 && tab[j] < BLOCKS);
                for (int k = 0; k < j; k++)
                    CHECK(tab[j] != tab[k]);
                distinct_held += seen[tab[j]]++ == 0;
            }
        }
        CHECK_MSG(distinct_held == st.held, "step %d: %d blocks in tables, %d held", step,
                  distinct_held, st.held);
        if (test_failures)
            break;
    }
    bn_kv_blocks_stats st;
    bn_kv_blocks_get_stats(kv, &st);
    printf("random: %llu blocks reused, %llu evictions, %llu refused\n",
           (unsigned long long)st.reused_blocks, (unsigned long long)st.evictions,
           (unsigned long long)st.failed);
    CHECK(st.reused_blocks > 0 && st.evictions > 0 && st.failed > 0);
    bn_kv_blocks_free(kv);
}

int main(void)
{
    check_basics();
    check_eviction(BN_KV_EVICT_LRU, 20);
    check_eviction(BN_KV_EVICT_FIFO, 10);
    check_eviction(BN_KV_EVICT_LFU, 30);
    check_out_of_blocks();
    check_truncate();
    check_random();
    TEST_EXIT();
}
