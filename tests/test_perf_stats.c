/* Per-context performance counters (perf_stats.h): exact counts after
 * scripted and concurrent recording. */
#include <inttypes.h>
#include <pthread.h>

#include "bitnet.h"
#include "perf_stats.h"
#include "test_util.h"

enum { THREADS = 8, ITERS = 100000 };

static void *hammer(void *arg)
{
    bn_perf_stats *s = arg;
    for (int i = 0; i < ITERS; i++) {
        bn_perf_record_kernels(s, 3);
        bn_perf_record_h2d(s, 100);
        if (i % 2 == 0)
            bn_perf_record_d2h(s, 7);
        if (i % 1000 == 0) {
            bn_perf_snapshot snap;
            bn_perf_stats_snapshot(s, &snap);
        }
    }
    return NULL;
}

int main(void)
{
    bn_perf_stats *s = NULL;
    bn_error err;
    CHECK(bn_perf_stats_create(&s, &err) == BN_OK && s);
    CHECK(bn_perf_stats_create(NULL, &err) == BN_ERR_INVALID_ARGUMENT);

    bn_perf_snapshot snap;
    memset(&snap, 0xff, sizeof snap);
    bn_perf_stats_snapshot(s, &snap);
    CHECK(snap.kernel_launches == 0 && snap.h2d_transfers == 0 && snap.h2d_bytes == 0 &&
          snap.d2h_transfers == 0 && snap.d2h_bytes == 0);

    bn_perf_record_kernels(s, 3);
    bn_perf_record_kernels(s, 0);
    bn_perf_record_kernels(NULL, 5); /* no statistics: nothing happens */
    bn_perf_stats_snapshot(s, &snap);
    CHECK(snap.kernel_launches == 3);
    bn_perf_record_kernels(s, 240); /* a graph replay */
    bn_perf_record_h2d(s, 12 << 20);
    bn_perf_record_h2d(s, 0);
    bn_perf_record_d2h(s, 1536);
    bn_perf_stats_snapshot(s, &snap);
    CHECK(snap.kernel_launches == 243);
    CHECK(snap.h2d_transfers == 2 && snap.h2d_bytes == 12u << 20);
    CHECK(snap.d2h_transfers == 1 && snap.d2h_bytes == 1536);

    /* Concurrent recording loses nothing. */
    bn_perf_stats_destroy(s);
    CHECK(bn_perf_stats_create(&s, &err) == BN_OK && s);
    pthread_t th[THREADS];
    for (int t = 0; t < THREADS; t++)
        CHECK(pthread_create(&th[t], NULL, hammer, s) == 0);
    for (int t = 0; t < THREADS; t++)
        pthread_join(th[t], NULL);
    bn_perf_stats_snapshot(s, &snap);
    const uint64_t total = (uint64_t)THREADS * ITERS;
    CHECK(snap.kernel_launches == 3 * total);
    CHECK(snap.h2d_transfers == total && snap.h2d_bytes == 100 * total);
    CHECK(snap.d2h_transfers == total / 2 && snap.d2h_bytes == 7 * (total / 2));

    /* NULL stats: recording is a no-op, a snapshot is zeros. */
    bn_perf_record_h2d(NULL, 5);
    bn_perf_record_d2h(NULL, 5);
    bn_perf_stats_snapshot(NULL, &snap);
    CHECK(snap.kernel_launches == 0 && snap.h2d_bytes == 0);

    bn_perf_stats_destroy(s);
    bn_perf_stats_destroy(NULL);
    TEST_EXIT();
}
