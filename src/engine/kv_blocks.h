/*
 * kv_blocks.h - the bookkeeping of a paged KV cache: the cache is a pool of
 * blocks of `block_size` positions, and each sequence holds a table of the
 * blocks its positions live in, in order. The backend owns the blocks'
 * memory (n_blocks * block bytes); this module only says which block holds
 * what. It knows nothing of devices, so every backend shares it.
 *
 * Prefix sharing. A full block is identified by its tokens and everything
 * before them: its key is a hash chained over the sequence's blocks (the
 * previous block's key and this block's tokens), and the tokens themselves
 * are kept to rule out collisions. When a sequence starts, the blocks of
 * its longest prefix of full blocks that the pool already holds are taken
 * as they are (their positions need no computing) and counted as reused.
 * Only full, computed blocks (bn_kv_seq_commit) are shared, and a sequence
 * writes only into its last,
 * private block, so no block is ever written while another sequence reads
 * it.
 *
 * A block is free, held (by one or more sequences: a reference count), or
 * cached: full, held by no sequence, and kept for a later sequence with the
 * same prefix. A new block comes from the free list first, else a cached
 * block is evicted by the policy: LRU (least recently released or reused),
 * FIFO (filled longest ago) or LFU (fewest uses, then least recently used).
 * When no block is free or cached, the request fails (BN_ERR_OUT_OF_MEMORY)
 * and changes nothing: the scheduler then preempts a sequence.
 *
 * Not thread safe: the scheduler that owns it calls it from one thread.
 */
#ifndef BN_KV_BLOCKS_H
#define BN_KV_BLOCKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

/* "lru", "fifo", "lfu" -> policy; false when unknown. */
bool bn_kv_evict_parse(const char *name, bn_kv_evict *out);
const char *bn_kv_evict_name(bn_kv_evict policy);

typedef struct bn_kv_blocks_config {
    int32_t block_size;    /* positions per block, 1 .. 1024 (16 to 64 in use) */
    int32_t n_blocks;      /* blocks in the pool, >= 1                         */
    int32_t max_seqs;      /* sequences open at once, >= 1                     */
    bn_kv_evict evict;     /* which cached block goes first                    */
    bool prefix_sharing;   /* reuse cached blocks of equal prefixes            */
} bn_kv_blocks_config;

typedef struct bn_kv_blocks bn_kv_blocks;

typedef struct bn_kv_blocks_stats {
    int32_t n_blocks, free, held, cached;
    int32_t seqs_open;
    uint64_t reused_blocks;   /* blocks a starting sequence took from the pool */
    uint64_t evictions;       /* cached blocks given to another use            */
    uint64_t failed;          /* requests refused for want of blocks           */
    int32_t peak_held;        /* the most blocks held at once since the last
                                 bn_kv_blocks_reset_peak                       */
} bn_kv_blocks_stats;

bn_status bn_kv_blocks_create(const bn_kv_blocks_config *cfg, bn_kv_blocks **out, bn_error *err);
void bn_kv_blocks_free(bn_kv_blocks *kv);

/* Opens a sequence with no positions; *seq is its id (0 .. max_seqs - 1).
 * BN_ERR_OUT_OF_MEMORY when max_seqs are open. */
bn_status bn_kv_seq_open(bn_kv_blocks *kv, int32_t *seq, bn_error *err);
/* Releases every block of the sequence: full blocks it filled stay cached
 * for later sequences (with prefix sharing), the rest become free. */
void bn_kv_seq_close(bn_kv_blocks *kv, int32_t seq);

/* The sequence's first tokens: for an empty sequence, takes the cached
 * blocks of the longest prefix of whole blocks of tokens[0, n) that the
 * pool holds, and returns in *reused the positions they cover (a multiple
 * of block_size, at most n - 1, so at least one token is left to compute
 * for the logits). 0 without prefix sharing. The caller then appends the
 * rest with bn_kv_seq_append. */
bn_status bn_kv_seq_reuse_prefix(bn_kv_blocks *kv, int32_t seq, const int32_t *tokens, int64_t n,
                                 int64_t *reused, bn_error *err);

/* Makes room for tokens[0, n) after the sequence's positions, taking new
 * blocks as needed, and records the tokens (a block that becomes full gets
 * its key). On BN_ERR_OUT_OF_MEMORY nothing changes. */
bn_status bn_kv_seq_append(bn_kv_blocks *kv, int32_t seq, const int32_t *tokens, int64_t n,
                           bn_error *err);
/* The sequence's first n positions are computed (their KV written): its
 * full blocks among them are offered to later sequences (prefix sharing).
 * A block is never offered before, so no sequence reads positions that are
 * not computed, and a block whose tokens were appended but never computed
 * (a sequence preempted within a step) is freed, not cached. */
void bn_kv_seq_commit(bn_kv_blocks *kv, int32_t seq, int64_t n);

/* Keeps the sequence's first n positions (n at most its length): blocks
 * past them are released as by close. When position n falls inside a
 * block another sequence shares, that block is released too (a shared
 * block is never written): *kept is then the start of that block, and the
 * caller appends the tokens from there again; else *kept is n. */
bn_status bn_kv_seq_truncate(bn_kv_blocks *kv, int32_t seq, int64_t n, int64_t *kept,
                             bn_error *err);

/* Positions the sequence holds, and its block table: block ids in order,
 * valid until the next call that changes the sequence. */
int64_t bn_kv_seq_len(const bn_kv_blocks *kv, int32_t seq);
const int32_t *bn_kv_seq_table(const bn_kv_blocks *kv, int32_t seq, int32_t *n_blocks);

/* Blocks a sequence of n positions needs. */
int32_t bn_kv_blocks_for(const bn_kv_blocks *kv, int64_t n);
/* Blocks that a request could take now: free plus cached. */
int32_t bn_kv_blocks_available(const bn_kv_blocks *kv);

void bn_kv_blocks_get_stats(const bn_kv_blocks *kv, bn_kv_blocks_stats *out);
/* Starts peak_held again from the blocks held now. */
void bn_kv_blocks_reset_peak(bn_kv_blocks *kv);

#endif
