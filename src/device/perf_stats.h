/*
 * perf_stats.h - per-context GPU performance counters: kernel launches and
 * their execution time, host->device and device->host transfers.
 *
 * Recording is a relaxed atomic add per counter, so any thread may record
 * without a lock and it costs next to nothing on the decode path. A snapshot
 * reads each counter atomically but not all of them at one instant: a
 * snapshot taken during a launch may count the launch without its time yet.
 * That is fine for monitoring, which is all these are for; exact figures
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
    uint64_t kernel_time_ns;  /* total execution time of the recorded kernels */
    uint64_t h2d_transfers;
    uint64_t h2d_bytes;
    uint64_t d2h_transfers;
    uint64_t d2h_bytes;
} bn_perf_snapshot;

bn_status bn_perf_stats_create(bn_perf_stats **out, bn_error *err);
void bn_perf_stats_destroy(bn_perf_stats *stats);

/* Recording into NULL does nothing, so callers without a context need no
 * test. Kernel time is what the caller measured (e.g. between two CUDA
 * events); a launch whose time is unknown records 0. */
void bn_perf_record_kernel(bn_perf_stats *stats, uint64_t elapsed_ns);
/* `count` launches whose time is not measured (a pass or a graph replay). */
void bn_perf_record_kernels(bn_perf_stats *stats, uint64_t count);
void bn_perf_record_h2d(bn_perf_stats *stats, uint64_t bytes);
void bn_perf_record_d2h(bn_perf_stats *stats, uint64_t bytes);

/* Zeroes out for NULL stats. */
void bn_perf_stats_snapshot(const bn_perf_stats *stats, bn_perf_snapshot *out);
void bn_perf_stats_reset(bn_perf_stats *stats);

/* One line, e.g.
 *   "kernels 12 in 3.456 ms (avg 0.288 ms), h2d 3 transfers 12.00 MiB, d2h 2 transfers 1.50 KiB"
 * Always NUL-terminated; returns what snprintf returns. */
int bn_perf_snapshot_format(const bn_perf_snapshot *snap, char *buf, size_t size);

#ifdef __cplusplus
}
#endif

#endif
