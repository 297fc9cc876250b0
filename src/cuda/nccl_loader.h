/*
 * nccl_loader.h - NCCL opened at run time (dlopen), as cuBLAS is
 * (cublas_loader.h): a binary built with CUDA starts without NCCL and needs
 * it only for tensor parallelism. The few types used here are NCCL's ABI
 * (nccl.h): a communicator is an opaque pointer, results and enums are ints.
 */
#ifndef BN_NCCL_LOADER_H
#define BN_NCCL_LOADER_H

#include <cuda_runtime.h>
#include <stddef.h>

#include "bitnet.h"

typedef struct bn_nccl_comm_s *bn_nccl_comm; /* ncclComm_t */

/* nccl.h's values of ncclDataType_t and ncclRedOp_t that are used here. */
enum { BN_NCCL_UINT64 = 5, BN_NCCL_FLOAT32 = 7, BN_NCCL_FLOAT64 = 8 };
enum { BN_NCCL_SUM = 0, BN_NCCL_MAX = 2 };

typedef struct bn_nccl {
    int (*comm_init_all)(bn_nccl_comm *comms, int n, const int *devices);
    int (*comm_destroy)(bn_nccl_comm comm);
    int (*comm_abort)(bn_nccl_comm comm);
    int (*all_reduce)(const void *send, void *recv, size_t count, int type, int op,
                      bn_nccl_comm comm, cudaStream_t stream);
    int (*all_gather)(const void *send, void *recv, size_t count, int type, bn_nccl_comm comm,
                      cudaStream_t stream);
    const char *(*error_string)(int result);
    char library[64]; /* the file that was opened                          */
} bn_nccl;

/* Loads libnccl once per process; BN_ERR_UNSUPPORTED with the loader's
 * message when it is not installed. */
bn_status bn_nccl_get(const bn_nccl **out, bn_error *err);

#endif
