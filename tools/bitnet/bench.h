/* The `bitnet bench` benchmarks (bench_*.c): they measure the library's
 * own kernels and engine, so unlike the other commands they use its
 * internal headers. */
#ifndef BITNET_BENCH_H
#define BITNET_BENCH_H

#include "cli.h"
#include "model.h"

int bench_kernels(int argc, char **argv);
int bench_e2e(int argc, char **argv, const bn_config *cfg);
int bench_batch(int argc, char **argv, const bn_config *cfg);

/* The 2B-4T block at a toy size (2 layers, dim 256, vocab 1024): quick runs
 * and tests. */
void bench_tiny_shape(bn_hparams *hp);

#if defined(BITNET_HAVE_CUDA)
#include "cuda_backend.h"
/* A stage table (bench_e2e.c): the header and a row per stage that
 * launched anything, microseconds per pass (unit names it); the prefill's
 * names its products GEMMs. Returns the launches of the pass. */
int bench_print_stage_rows(const bn_cuda_stage_times *t, const char *unit, bool prefill);
#endif

#endif
