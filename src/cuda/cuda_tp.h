/*
 * cuda_tp.h - tensor parallelism: one model split across several GPUs of a
 * host, a team of CUDA backends (cuda_backend.h), one rank per GPU, joined
 * by NCCL (nccl_loader.h).
 *
 * Each rank holds a slice of the model (bn_checkpoint_slice: its heads and
 * FFN columns, Megatron-LM's split) and runs the whole forward pass over
 * it; the ranks exchange three things a layer's pass needs whole: the sum
 * of their Wo and down products (two all-reduces a layer), the sub-norms'
 * row statistics (two small all-gathers a layer) and, once a pass, the
 * logits of their rows of the LM head (an all-gather). Every rank then
 * holds the same residual stream and logits, picks the same token and
 * keeps its heads' part of the KV cache.
 *
 * The few kilobytes a decode step exchanges go through peer memory where
 * every pair of GPUs reaches the other's (tp_exchange.cu: one small kernel
 * an exchange, a few microseconds over NVLink); larger exchanges (prefill
 * chunks), and every exchange without peer access, through NCCL.
 *
 * Because the collectives wait for every rank, every call is made on all
 * ranks at once: rank 0 on the caller's thread, the others on a host
 * thread each (bn_cuda_tp_run). A request error (a token outside the
 * vocabulary, positions past the cache) is found by every rank alike
 * before anything is queued. Any other failure of one rank aborts the
 * team's NCCL communicators, so that the others' NCCL collectives return
 * instead of waiting forever (a peer-memory exchange whose peer never
 * arrives traps after ~10 s, which fails that rank's step); the team is
 * then broken and refuses every later call.
 *
 * NVLink multicast (NVLS) is kept off: NCCL_NVLS_ENABLE=0 is set before
 * the communicators are made.
 */
#ifndef BN_CUDA_TP_H
#define BN_CUDA_TP_H

#include "cuda_backend.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Ranks of a team at most. */
#define BN_CUDA_TP_MAX 16

typedef struct bn_cuda_tp bn_cuda_tp;

/* A team of n ranks (2 <= n <= BN_CUDA_TP_MAX) on n distinct CUDA devices,
 * each a backend created with *o (its device, rank and communicator set
 * here; no paged cache) over its slice of model, which must outlive the
 * team. Fails with the first rank's error (by rank) and frees everything. */
bn_status bn_cuda_tp_create(const bn_checkpoint *model, const int *devices, int n,
                            const bn_cuda_backend_options *o, bn_cuda_tp **out, bn_error *err);
void bn_cuda_tp_free(bn_cuda_tp *t);

int bn_cuda_tp_size(const bn_cuda_tp *t);
/* Whether the decode step's exchanges go through peer memory (every pair
 * of the team's GPUs reaches the other's), else through NCCL. */
bool bn_cuda_tp_peer_exchange(const bn_cuda_tp *t);
int bn_cuda_tp_device(const bn_cuda_tp *t, int rank);
bn_cuda_backend *bn_cuda_tp_rank(const bn_cuda_tp *t, int rank);
/* A host buffer of vocab floats per rank (rank 0's is the caller's to
 * pass), for outputs that every rank computes alike. */
float *bn_cuda_tp_scratch_logits(const bn_cuda_tp *t, int rank);

/* Runs fn on every rank at once: fn(that rank's backend, rank, arg, err).
 * Returns BN_OK when all succeed, else the lowest failing rank's error. */
typedef bn_status (*bn_cuda_tp_fn)(bn_cuda_backend *b, int rank, void *arg, bn_error *err);
bn_status bn_cuda_tp_run(bn_cuda_tp *t, bn_cuda_tp_fn fn, void *arg, bn_error *err);

#ifdef __cplusplus
}
#endif

#endif
