/* Monotonic timers for benchmarks, receipts and the memory pool's ages. */
#include "bitnet.h"

#include <time.h>

uint64_t bn_time_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double bn_time_seconds(void) { return (double)bn_time_ns() * 1e-9; }
