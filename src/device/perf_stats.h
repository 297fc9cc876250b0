/*
 * perf_stats.h - per-context GPU performance counters: kernel launches,
 * host->device and device->host transfers (bitnet run --verbose shows them,
 * through bn_cuda_backend_work).
 *
 * Recording is a relaxed atomic add per counter, so any thread may record
 * without a lock and it costs next to nothing on the decode path. A snapshot
 * reads each counter atomically but not all of them at one instant: a
 * snapshot taken during a copy may count the transfer without its bytes
 * yet. That is fine for monitoring, which is all these are for; exact figures
 * come from quiescent points (after a synchronise).
 */
#ifndef BN_PERF_STATS_H
#define BN_PERF_STATS_H

#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct bn_perf_stats bn_perf_stats; /* opaque: the atomics stay C-only */

typedef struct bn_perf_snapshot {
    uint64_t kernel_launches;
    uint64_t h2d_transfers;
    uint64_t h2d_bytes;
    uint64_t d2h_transfers;
    uint64_t d2h_bytes;
} bn_perf_snapshot;

bn_status bn_perf_stats_create(bn_perf_stats **out, bn_error *err);
void bn_perf_stats_destroy(bn_perf_stats *stats);

/* Recording into NULL does nothing, so callers without a context need no
 * test. `count` launches: a pass's kernels, or those a graph replays. */
void bn_perf_record_kernels(bn_perf_stats *stats, uint64_t count);
void bn_perf_record_h2d(bn_perf_stats *stats, uint64_t bytes);
void bn_perf_record_d2h(bn_perf_stats *stats, uint64_t bytes);

/* Zeroes out for NULL stats. */
void bn_perf_stats_snapshot(const bn_perf_stats *stats, bn_perf_snapshot *out);

#ifdef __cplusplus
}
#endif

#endif
