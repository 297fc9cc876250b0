/*
 * kv_blocks.c - the paged KV cache's bookkeeping (the contract is in
 * kv_blocks.h): a block pool with a free list, reference counts, keys
 * chained over each sequence's full blocks in a hash table, and the cached
 * blocks evicted by policy when the free list runs out.
 */
#include "kv_blocks.h"

#include <stdlib.h>
#include <string.h>

typedef struct kv_block {
    int32_t refs;        /* sequences holding it                            */
    int32_t filled;      /* positions recorded                              */
    bool keyed;          /* full and in the hash table                      */
    uint64_t key;        /* chained hash: parent_key and the tokens         */
    uint64_t parent_key; /* the key before it (the chain's seed for the first) */
    uint64_t filled_at;  /* tick it became full (FIFO)                      */
    uint64_t used_at;    /* tick of its last release or reuse (LRU)          */
    uint64_t uses;       /* sequences that took it (LFU)                     */
    int32_t next;        /* free list, or the hash bucket's chain            */
} kv_block;

typedef struct kv_seq {
    bool open;
    int64_t len;         /* positions                                       */
    int64_t committed;   /* positions whose KV is computed (commit)         */
    int32_t *table;      /* block ids                                       */
    int32_t n_table, cap_table;
    uint64_t chain;      /* key of its last full block, or the seed         */
} kv_seq;

struct bn_kv_blocks {
    bn_kv_blocks_config cfg;
    kv_block *blocks;
    int32_t *tokens;     /* n_blocks * block_size: each block's tokens      */
    int32_t free_head, n_free, n_cached;
    int32_t *buckets;    /* hash table heads, n_buckets (a power of two)    */
    uint32_t n_buckets;
    kv_seq *seqs;
    uint64_t tick;
    uint64_t reused, evictions, failed;
    int32_t peak_held;
};

static int32_t held_now(const bn_kv_blocks *kv)
{
    return kv->cfg.n_blocks - kv->n_free - kv->n_cached;
}

static void note_held(bn_kv_blocks *kv)
{
    const int32_t h = held_now(kv);
    if (h > kv->peak_held)
        kv->peak_held = h;
}

/* The chain starts from a fixed seed, so equal prefixes give equal keys. */
#define CHAIN_SEED 0x9e3779b97f4a7c15ull

/* FNV-1a over the parent key and the block's tokens, then a final mix. */
static uint64_t chain_key(uint64_t parent, const int32_t *tokens, int32_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (int i = 0; i < 8; i++) {
        h ^= (parent >> (8 * i)) & 0xff;
        h *= 0x100000001b3ull;
    }
    for (int32_t t = 0; t < n; t++) {
        const uint32_t v = (uint32_t)tokens[t];
        for (int i = 0; i < 4; i++) {
            h ^= (v >> (8 * i)) & 0xff;
            h *= 0x100000001b3ull;
        }
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h;
}

static int32_t *block_tokens(const bn_kv_blocks *kv, int32_t b)
{
    return kv->tokens + (size_t)b * (size_t)kv->cfg.block_size;
}

static uint32_t bucket_of(const bn_kv_blocks *kv, uint64_t key)
{
    return (uint32_t)(key & (kv->n_buckets - 1));
}

static void map_insert(bn_kv_blocks *kv, int32_t b)
{
    const uint32_t at = bucket_of(kv, kv->blocks[b].key);
    kv->blocks[b].next = kv->buckets[at];
    kv->buckets[at] = b;
    kv->blocks[b].keyed = true;
}

static void map_remove(bn_kv_blocks *kv, int32_t b)
{
    int32_t *link = &kv->buckets[bucket_of(kv, kv->blocks[b].key)];
    while (*link >= 0 && *link != b)
        link = &kv->blocks[*link].next;
    if (*link == b)
        *link = kv->blocks[b].next;
    kv->blocks[b].keyed = false;
    kv->blocks[b].next = -1;
}

/* The full block of these tokens after `parent`, or -1. */
static int32_t map_find(const bn_kv_blocks *kv, uint64_t key, uint64_t parent,
                        const int32_t *tokens)
{
    const size_t bytes = (size_t)kv->cfg.block_size * sizeof *tokens;
    for (int32_t b = kv->buckets[bucket_of(kv, key)]; b >= 0; b = kv->blocks[b].next)
        if (kv->blocks[b].key == key && kv->blocks[b].parent_key == parent &&
            memcmp(block_tokens(kv, b), tokens, bytes) == 0)
            return b;
    return -1;
}

static void push_free(bn_kv_blocks *kv, int32_t b)
{
    kv_block *k = &kv->blocks[b];
    k->filled = 0;
    k->refs = 0;
    k->next = kv->free_head;
    kv->free_head = b;
    kv->n_free++;
}

/* Whether cached block a should be evicted before b. */
static bool evict_first(const bn_kv_blocks *kv, const kv_block *a, const kv_block *b)
{
    switch (kv->cfg.evict) {
    case BN_KV_EVICT_FIFO:
        return a->filled_at < b->filled_at;
    case BN_KV_EVICT_LFU:
        return a->uses < b->uses || (a->uses == b->uses && a->used_at < b->used_at);
    case BN_KV_EVICT_LRU:
    default:
        return a->used_at < b->used_at;
    }
}

/* A block for new positions: a free one, else the cached block the policy
 * gives up first (a scan: it runs only when the free list is empty). The
 * caller has checked that one is available. */
static int32_t take_block(bn_kv_blocks *kv)
{
    int32_t b = kv->free_head;
    if (b >= 0) {
        kv->free_head = kv->blocks[b].next;
        kv->n_free--;
    } else {
        for (int32_t i = 0; i < kv->cfg.n_blocks; i++) {
            const kv_block *k = &kv->blocks[i];
            if (k->refs == 0 && k->keyed && (b < 0 || evict_first(kv, k, &kv->blocks[b])))
                b = i;
        }
        map_remove(kv, b);
        kv->n_cached--;
        kv->evictions++;
    }
    kv_block *k = &kv->blocks[b];
    memset(k, 0, sizeof *k);
    k->refs = 1;
    k->next = -1;
    k->uses = 1;
    k->used_at = ++kv->tick;
    note_held(kv);
    return b;
}

/* One sequence lets go of block b: cached when keyed and nobody else holds
 * it, free when not keyed. */
static void release_block(bn_kv_blocks *kv, int32_t b)
{
    kv_block *k = &kv->blocks[b];
    if (--k->refs > 0)
        return;
    if (k->keyed) {
        k->used_at = ++kv->tick;
        kv->n_cached++;
    } else {
        push_free(kv, b);
    }
}

static bool table_reserve(kv_seq *s, int32_t n)
{
    if (n <= s->cap_table)
        return true;
    int32_t cap = s->cap_table ? s->cap_table : 8;
    while (cap < n)
        cap *= 2;
    int32_t *t = realloc(s->table, (size_t)cap * sizeof *t);
    if (!t)
        return false;
    s->table = t;
    s->cap_table = cap;
    return true;
}

static kv_seq *open_seq(const bn_kv_blocks *kv, int32_t seq)
{
    return seq >= 0 && seq < kv->cfg.max_seqs && kv->seqs[seq].open ? &kv->seqs[seq] : NULL;
}

/* ---- the pool ------------------------------------------------------------------------- */

bool bn_kv_evict_parse(const char *name, bn_kv_evict *out)
{
    static const char *const names[] = {"lru", "fifo", "lfu"};
    for (int i = 0; i < 3; i++)
        if (name && strcmp(name, names[i]) == 0) {
            *out = (bn_kv_evict)i;
            return true;
        }
    return false;
}

const char *bn_kv_evict_name(bn_kv_evict policy)
{
    switch (policy) {
    case BN_KV_EVICT_LRU: return "lru";
    case BN_KV_EVICT_FIFO: return "fifo";
    case BN_KV_EVICT_LFU: return "lfu";
    }
    return "unknown";
}

bn_status bn_kv_blocks_create(const bn_kv_blocks_config *cfg, bn_kv_blocks **out, bn_error *err)
{
    *out = NULL;
    if (!cfg || cfg->block_size < 1 || cfg->block_size > 1024 || cfg->n_blocks < 1 ||
        cfg->max_seqs < 1 || (unsigned)cfg->evict > BN_KV_EVICT_LFU)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "KV blocks: block_size 1..1024, n_blocks >= 1, max_seqs >= 1 and a "
                            "known eviction policy (got %d, %d, %d)",
                            cfg ? cfg->block_size : 0, cfg ? cfg->n_blocks : 0,
                            cfg ? cfg->max_seqs : 0);
    bn_kv_blocks *kv = calloc(1, sizeof *kv);
    if (!kv)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for the KV block table");
    kv->cfg = *cfg;
    kv->n_buckets = 16;
    while (kv->n_buckets < 2u * (uint32_t)cfg->n_blocks)
        kv->n_buckets *= 2;
    kv->blocks = calloc((size_t)cfg->n_blocks, sizeof *kv->blocks);
    kv->tokens = calloc((size_t)cfg->n_blocks * (size_t)cfg->block_size, sizeof *kv->tokens);
    kv->buckets = malloc(kv->n_buckets * sizeof *kv->buckets);
    kv->seqs = calloc((size_t)cfg->max_seqs, sizeof *kv->seqs);
    if (!kv->blocks || !kv->tokens || !kv->buckets || !kv->seqs) {
        bn_kv_blocks_free(kv);
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                            "no memory for the bookkeeping of %d KV blocks", cfg->n_blocks);
    }
    for (uint32_t i = 0; i < kv->n_buckets; i++)
        kv->buckets[i] = -1;
    kv->free_head = -1;
    for (int32_t b = cfg->n_blocks - 1; b >= 0; b--) /* block 0 first */
        push_free(kv, b);
    *out = kv;
    return BN_OK;
}

void bn_kv_blocks_free(bn_kv_blocks *kv)
{
    if (!kv)
        return;
    for (int32_t i = 0; kv->seqs && i < kv->cfg.max_seqs; i++)
        free(kv->seqs[i].table);
    free(kv->seqs);
    free(kv->blocks);
    free(kv->tokens);
    free(kv->buckets);
    free(kv);
}

int32_t bn_kv_blocks_for(const bn_kv_blocks *kv, int64_t n)
{
    return (int32_t)((n + kv->cfg.block_size - 1) / kv->cfg.block_size);
}

int32_t bn_kv_blocks_available(const bn_kv_blocks *kv)
{
    return kv->n_free + kv->n_cached;
}

void bn_kv_blocks_reset_peak(bn_kv_blocks *kv)
{
    kv->peak_held = held_now(kv);
}

void bn_kv_blocks_get_stats(const bn_kv_blocks *kv, bn_kv_blocks_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n_blocks = kv->cfg.n_blocks;
    out->free = kv->n_free;
    out->cached = kv->n_cached;
    out->held = held_now(kv);
    out->peak_held = kv->peak_held;
    for (int32_t i = 0; i < kv->cfg.max_seqs; i++)
        out->seqs_open += kv->seqs[i].open;
    out->reused_blocks = kv->reused;
    out->evictions = kv->evictions;
    out->failed = kv->failed;
}

/* ---- sequences ------------------------------------------------------------------------- */

bn_status bn_kv_seq_open(bn_kv_blocks *kv, int32_t *seq, bn_error *err)
{
    for (int32_t i = 0; i < kv->cfg.max_seqs; i++) {
        kv_seq *s = &kv->seqs[i];
        if (s->open)
            continue;
        s->open = true;
        s->len = 0;
        s->committed = 0;
        s->n_table = 0;
        s->chain = CHAIN_SEED;
        *seq = i;
        return BN_OK;
    }
    return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, "finish a sequence first",
                        "all %d KV sequences are open", kv->cfg.max_seqs);
}

void bn_kv_seq_close(bn_kv_blocks *kv, int32_t seq)
{
    kv_seq *s = open_seq(kv, seq);
    if (!s)
        return;
    for (int32_t i = 0; i < s->n_table; i++)
        release_block(kv, s->table[i]);
    s->n_table = 0;
    s->len = 0;
    s->open = false;
}

int64_t bn_kv_seq_len(const bn_kv_blocks *kv, int32_t seq)
{
    const kv_seq *s = open_seq(kv, seq);
    return s ? s->len : 0;
}

const int32_t *bn_kv_seq_table(const bn_kv_blocks *kv, int32_t seq, int32_t *n_blocks)
{
    const kv_seq *s = open_seq(kv, seq);
    *n_blocks = s ? s->n_table : 0;
    return s ? s->table : NULL;
}

bn_status bn_kv_seq_reuse_prefix(bn_kv_blocks *kv, int32_t seq, const int32_t *tokens, int64_t n,
                                 int64_t *reused, bn_error *err)
{
    *reused = 0;
    kv_seq *s = open_seq(kv, seq);
    if (!s || s->len != 0 || (!tokens && n > 0) || n < 0)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "KV blocks: a prefix is reused by an open, empty sequence");
    if (!kv->cfg.prefix_sharing)
        return BN_OK;
    const int32_t bs = kv->cfg.block_size;
    /* Whole blocks only, and one token left to compute. */
    const int64_t whole = n > 0 ? (n - 1) / bs : 0;
    if (!table_reserve(s, (int32_t)whole))
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a block table");
    uint64_t chain = CHAIN_SEED;
    for (int64_t i = 0; i < whole; i++) {
        const int32_t *t = tokens + i * bs;
        const uint64_t key = chain_key(chain, t, bs);
        const int32_t b = map_find(kv, key, chain, t);
        if (b < 0)
            break;
        kv_block *k = &kv->blocks[b];
        if (k->refs++ == 0) {
            kv->n_cached--;
            note_held(kv);
        }
        k->uses++;
        k->used_at = ++kv->tick;
        s->table[s->n_table++] = b;
        s->len += bs;
        chain = key;
        kv->reused++;
    }
    s->chain = chain;
    s->committed = s->len;
    *reused = s->len;
    return BN_OK;
}

bn_status bn_kv_seq_append(bn_kv_blocks *kv, int32_t seq, const int32_t *tokens, int64_t n,
                           bn_error *err)
{
    kv_seq *s = open_seq(kv, seq);
    if (!s || n < 0 || (!tokens && n > 0))
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "KV blocks: append to an open sequence");
    const int32_t bs = kv->cfg.block_size;
    const int32_t need = bn_kv_blocks_for(kv, s->len + n) - s->n_table;
    if (need > bn_kv_blocks_available(kv)) {
        kv->failed++;
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY,
                            "fewer sequences at once, shorter ones, or a larger KV cache",
                            "the KV cache has %d free blocks of %d positions; %d more are needed",
                            bn_kv_blocks_available(kv), bs, need);
    }
    if (!table_reserve(s, s->n_table + (need > 0 ? need : 0)))
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a block table");
    for (int64_t i = 0; i < n; i++) {
        if (s->len % bs == 0)
            s->table[s->n_table++] = take_block(kv);
        const int32_t b = s->table[s->n_table - 1];
        kv_block *k = &kv->blocks[b];
        block_tokens(kv, b)[k->filled++] = tokens[i];
        s->len++;
        if (k->filled < bs)
            continue;
        /* Full: its key; it is offered to other sequences once its
         * positions are computed (bn_kv_seq_commit). */
        k->parent_key = s->chain;
        k->key = chain_key(s->chain, block_tokens(kv, b), bs);
        k->filled_at = ++kv->tick;
        s->chain = k->key;
    }
    return BN_OK;
}

void bn_kv_seq_commit(bn_kv_blocks *kv, int32_t seq, int64_t n)
{
    kv_seq *s = open_seq(kv, seq);
    if (!s)
        return;
    if (n > s->len)
        n = s->len;
    const int32_t bs = kv->cfg.block_size;
    /* Full blocks within the computed positions get a place in the table,
     * unless an equal block is there already (two sequences computed the
     * same prefix at once). */
    for (int64_t i = s->committed / bs; i < n / bs && kv->cfg.prefix_sharing; i++) {
        const int32_t b = s->table[i];
        kv_block *k = &kv->blocks[b];
        if (!k->keyed && map_find(kv, k->key, k->parent_key, block_tokens(kv, b)) < 0)
            map_insert(kv, b);
    }
    if (n > s->committed)
        s->committed = n;
}

bn_status bn_kv_seq_truncate(bn_kv_blocks *kv, int32_t seq, int64_t n, int64_t *kept,
                             bn_error *err)
{
    kv_seq *s = open_seq(kv, seq);
    if (!s || n < 0 || n > s->len)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "KV blocks: truncate an open sequence to at most its length");
    const int32_t bs = kv->cfg.block_size;
    int32_t keep = bn_kv_blocks_for(kv, n);
    if (n % bs != 0) {
        /* The last block kept is cut: it is written again from position n
         * on, so it must be this sequence's alone and unkeyed. One that
         * others hold is let go, and the positions it held are the
         * caller's to compute again. */
        const int32_t b = s->table[keep - 1];
        kv_block *k = &kv->blocks[b];
        if (k->refs > 1) {
            keep--;
            n = (int64_t)keep * bs;
        } else {
            if (k->keyed)
                map_remove(kv, b);
            k->filled = (int32_t)(n % bs);
        }
    }
    for (int32_t i = keep; i < s->n_table; i++)
        release_block(kv, s->table[i]);
    s->n_table = keep;
    s->len = n;
    if (s->committed > n)
        s->committed = n;
    /* The chain continues from the last full block kept. */
    s->chain = CHAIN_SEED;
    for (int32_t i = 0; i < (int32_t)(n / bs); i++)
        s->chain = chain_key(s->chain, block_tokens(kv, s->table[i]), bs);
    *kept = n;
    return BN_OK;
}
