/* Per-context performance counters; see perf_stats.h. */
#include "perf_stats.h"

#include <stdatomic.h>
#include <stdlib.h>

struct bn_perf_stats {
    atomic_uint_least64_t kernel_launches;
    atomic_uint_least64_t h2d_transfers;
    atomic_uint_least64_t h2d_bytes;
    atomic_uint_least64_t d2h_transfers;
    atomic_uint_least64_t d2h_bytes;
};

bn_status bn_perf_stats_create(bn_perf_stats **out, bn_error *err)
{
    if (!out)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "perf stats: NULL output");
    *out = NULL;
    bn_perf_stats *s = malloc(sizeof *s);
    if (!s)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "perf stats: out of host memory");
    atomic_init(&s->kernel_launches, 0);
    atomic_init(&s->h2d_transfers, 0);
    atomic_init(&s->h2d_bytes, 0);
    atomic_init(&s->d2h_transfers, 0);
    atomic_init(&s->d2h_bytes, 0);
    *out = s;
    return BN_OK;
}

void bn_perf_stats_destroy(bn_perf_stats *stats) { free(stats); }

/* Counters only ever add up; no other memory is published through them, so
 * relaxed ordering is enough. */
static void add(atomic_uint_least64_t *counter, uint64_t v)
{
    atomic_fetch_add_explicit(counter, v, memory_order_relaxed);
}

static uint64_t load(const atomic_uint_least64_t *counter)
{
    /* C11 atomic_load takes a non-const pointer in some libcs' macros. */
    return atomic_load_explicit((atomic_uint_least64_t *)counter, memory_order_relaxed);
}

void bn_perf_record_kernels(bn_perf_stats *stats, uint64_t count)
{
    if (!stats)
        return;
    add(&stats->kernel_launches, count);
}

void bn_perf_record_h2d(bn_perf_stats *stats, uint64_t bytes)
{
    if (!stats)
        return;
    add(&stats->h2d_transfers, 1);
    add(&stats->h2d_bytes, bytes);
}

void bn_perf_record_d2h(bn_perf_stats *stats, uint64_t bytes)
{
    if (!stats)
        return;
    add(&stats->d2h_transfers, 1);
    add(&stats->d2h_bytes, bytes);
}

void bn_perf_stats_snapshot(const bn_perf_stats *stats, bn_perf_snapshot *out)
{
    if (!out)
        return;
    if (!stats) {
        *out = (bn_perf_snapshot){0};
        return;
    }
    out->kernel_launches = load(&stats->kernel_launches);
    out->h2d_transfers = load(&stats->h2d_transfers);
    out->h2d_bytes = load(&stats->h2d_bytes);
    out->d2h_transfers = load(&stats->d2h_transfers);
    out->d2h_bytes = load(&stats->d2h_bytes);
}
