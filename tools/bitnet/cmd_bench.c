/* bitnet bench <what>: benchmarks that print tables (never pass/fail). */
#include <stdio.h>
#include <string.h>

#include "bench.h"

static void usage(FILE *out)
{
    fprintf(out, "usage: bitnet bench <benchmark> [options]\n"
                 "\n"
                 "benchmarks:\n"
                 "  kernels   W2A8 kernels on the 2B-4T shapes: every CPU provider against the\n"
                 "            machine's streaming-read bandwidth and an F32 matvec, or with\n"
                 "            --device cuda the GPU kernels against copy bandwidth and cuBLAS BF16\n"
                 "  e2e       a whole model of the 2B-4T shape (random ternary weights, no file):\n"
                 "            prefill and decode tokens/s, memory; on the GPU also the decode\n"
                 "            step split by kernel and the byte floor\n"
                 "  batch     many sequences at once through the batching scheduler: aggregate\n"
                 "            and per-sequence decode tokens/s, time to first token, KV cache,\n"
                 "            with and without a shared prompt prefix\n"
                 "\n"
                 "'bitnet bench <benchmark> --help' lists its options.\n");
}

int cmd_bench(int argc, char **argv, const bn_config *cfg)
{
    if (argc < 2 || strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? BN_EXIT_USAGE : BN_EXIT_OK;
    }
    if (strcmp(argv[1], "kernels") == 0)
        return bench_kernels(argc - 1, argv + 1);
    if (strcmp(argv[1], "e2e") == 0)
        return bench_e2e(argc - 1, argv + 1, cfg);
    if (strcmp(argv[1], "batch") == 0)
        return bench_batch(argc - 1, argv + 1, cfg);
    fprintf(stderr, "bitnet bench: error: unknown benchmark '%s'\n", argv[1]);
    usage(stderr);
    return BN_EXIT_USAGE;
}
