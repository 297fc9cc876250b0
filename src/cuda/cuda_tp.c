/*
 * cuda_tp.c - a tensor-parallel team of CUDA backends (cuda_tp.h): the
 * slices, the NCCL communicators, one host thread per rank beyond the
 * first, and the rule that runs every call on all ranks at once.
 */
#include "cuda_tp.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cuda_backend_kernels.h"
#include "nccl_loader.h"

/* A decode step's exchanges fit (a row of 5120 floats is 20 KiB); larger
 * ones (prefill chunks) go through NCCL. */
#define EXCHANGE_SLOT_BYTES ((size_t)64 << 10)

struct bn_cuda_tp {
    int n;
    int devices[BN_CUDA_TP_MAX];
    bn_checkpoint *slices[BN_CUDA_TP_MAX];
    bn_cuda_backend *ranks[BN_CUDA_TP_MAX];
    bn_nccl_comm comms[BN_CUDA_TP_MAX];
    float *scratch[BN_CUDA_TP_MAX];
    const bn_nccl *nccl;
    /* The small exchanges through peer memory (tp_exchange.cu): each rank's
     * view, and what each rank allocated (slots, flags, count); off where
     * some pair of GPUs cannot reach each other's memory. */
    bool peer_exchange;
    bn_cb_exchange exchange[BN_CUDA_TP_MAX];
    void *exchange_mem[BN_CUDA_TP_MAX];

    /* The workers (ranks 1 ..): a job is fn(arg) of generation `job`. */
    pthread_t threads[BN_CUDA_TP_MAX];
    int n_threads;
    pthread_mutex_t lock;
    pthread_cond_t wake, done;
    unsigned long long job;
    int running; /* ranks still in fn */
    bool stop;
    bn_cuda_tp_fn fn;
    void *arg;
    bn_status status[BN_CUDA_TP_MAX];
    bn_error errors[BN_CUDA_TP_MAX];

    /* Creation's barrier (team_ready): all_ready once every rank passed
     * it; and the broken state. */
    int arrived;
    bool arrived_rank[BN_CUDA_TP_MAX], all_ready;
    bool aborted;
    char broken[BN_ERROR_MESSAGE_MAX];

    const bn_cuda_backend_options *create_opt; /* during creation */
};

/* After a failure other than a request error, the other ranks may wait in
 * a collective for this one forever. They are given a moment to finish
 * (they fail alike, or they finish queueing their pass and wait on the
 * device); whichever still run then are released by aborting the
 * communicators, which makes NCCL's kernels return. The team is broken
 * from then on. Not before every rank passed creation's barrier: no
 * collective runs until then. Called with t->lock held. */
static void abort_if_stuck(bn_cuda_tp *t, const bn_error *why)
{
    if (!t->all_ready || t->aborted)
        return;
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_nsec += 200 * 1000 * 1000;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    while (t->running > 0 && pthread_cond_timedwait(&t->done, &t->lock, &until) == 0) {
    }
    if (t->running == 0 || t->aborted)
        return;
    t->aborted = true;
    snprintf(t->broken, sizeof t->broken, "%.400s", why->message);
    for (int r = 0; r < t->n; r++)
        if (t->comms[r])
            (void)t->nccl->comm_abort(t->comms[r]);
}

/* Runs the current job on `rank`. */
static void run_rank(bn_cuda_tp *t, int rank)
{
    bn_error_clear(&t->errors[rank]);
    const bn_status st = t->fn(t->ranks[rank], rank, t->arg, &t->errors[rank]);
    pthread_mutex_lock(&t->lock);
    t->status[rank] = st;
    t->running--;
    pthread_cond_broadcast(&t->done);
    if (st != BN_OK && st != BN_ERR_INVALID_ARGUMENT)
        abort_if_stuck(t, &t->errors[rank]);
    pthread_mutex_unlock(&t->lock);
}

typedef struct worker_arg {
    bn_cuda_tp *t;
    int rank;
} worker_arg;

static void *worker(void *p)
{
    worker_arg *w = p;
    bn_cuda_tp *t = w->t;
    const int rank = w->rank;
    free(w);
    unsigned long long seen = 0;
    pthread_mutex_lock(&t->lock);
    for (;;) {
        while (!t->stop && t->job == seen)
            pthread_cond_wait(&t->wake, &t->lock);
        if (t->stop)
            break;
        seen = t->job;
        pthread_mutex_unlock(&t->lock);
        run_rank(t, rank);
        pthread_mutex_lock(&t->lock);
    }
    pthread_mutex_unlock(&t->lock);
    return NULL;
}

bn_status bn_cuda_tp_run(bn_cuda_tp *t, bn_cuda_tp_fn fn, void *arg, bn_error *err)
{
    if (t->aborted)
        return bn_error_set(err, BN_ERR_GPU, "open the model again",
                            "the tensor-parallel team is broken after an earlier failure: %s",
                            t->broken);
    pthread_mutex_lock(&t->lock);
    t->fn = fn;
    t->arg = arg;
    t->running = t->n;
    t->job++;
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->lock);
    run_rank(t, 0);
    pthread_mutex_lock(&t->lock);
    while (t->running > 0)
        pthread_cond_wait(&t->done, &t->lock);
    pthread_mutex_unlock(&t->lock);
    for (int r = 0; r < t->n; r++)
        if (t->status[r] != BN_OK) {
            if (err)
                *err = t->errors[r];
            return t->status[r];
        }
    return BN_OK;
}

/* ---- creation ----------------------------------------------------------------- */

/* The backends' tp_ready: waits for every rank; true when all got there. */
static bool team_ready(void *team, int rank, bool ok)
{
    bn_cuda_tp *t = team;
    pthread_mutex_lock(&t->lock);
    if (!t->arrived_rank[rank]) {
        t->arrived_rank[rank] = true;
        t->arrived++;
        t->all_ready = t->all_ready && ok;
        if (t->arrived == t->n)
            pthread_cond_broadcast(&t->done);
    }
    while (t->arrived < t->n)
        pthread_cond_wait(&t->done, &t->lock);
    const bool all = t->all_ready;
    pthread_mutex_unlock(&t->lock);
    return all;
}

static bn_status create_rank(bn_cuda_backend *unused, int rank, void *arg, bn_error *err)
{
    (void)unused;
    bn_cuda_tp *t = arg;
    bn_cuda_backend_options o = *t->create_opt;
    o.device = t->devices[rank];
    o.paged_rows = 0;
    o.tp_size = t->n;
    o.tp_rank = rank;
    o.tp_comm = t->comms[rank];
    o.tp_exchange = t->peer_exchange ? &t->exchange[rank] : NULL;
    o.tp_ready = team_ready;
    o.tp_team = t;
    const bn_status st = bn_cuda_backend_create(t->slices[rank], &o, &t->ranks[rank], err);
    /* A rank that failed before the barrier still lets the others pass it. */
    if (st != BN_OK)
        (void)team_ready(t, rank, false);
    return st;
}

static bn_status check_devices(const int *devices, int n, bn_error *err)
{
    if (n < 2 || n > BN_CUDA_TP_MAX)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "tensor parallelism takes 2 to %d GPUs, not %d", BN_CUDA_TP_MAX, n);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++)
            if (devices[i] == devices[j])
                return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                                    "name each GPU once (NCCL runs one rank per GPU)",
                                    "tensor parallelism needs %d distinct GPUs; cuda:%d is named "
                                    "twice",
                                    n, devices[i]);
    return BN_OK;
}

/* Peer access between every pair of the team's GPUs and, on each, two
 * slots, a flag word per rank and a count, zeroed. Without peer access
 * between some pair, nothing: NCCL carries every exchange. */
static bn_status open_exchange(bn_cuda_tp *t, bn_error *err)
{
    for (int r = 0; r < t->n; r++)
        for (int q = 0; q < t->n; q++) {
            int can = 0;
            if (q != r && (cudaDeviceCanAccessPeer(&can, t->devices[r], t->devices[q]) !=
                               cudaSuccess ||
                           !can)) {
                (void)cudaGetLastError();
                return BN_OK;
            }
        }
    const size_t flags_at = 2 * EXCHANGE_SLOT_BYTES;
    const size_t bytes = flags_at + (size_t)(t->n + 1) * sizeof(unsigned long long);
    int current = 0; /* the calling thread's device, given back at the end */
    if (cudaGetDevice(&current) != cudaSuccess)
        current = -1;
    for (int r = 0; r < t->n; r++) {
        cudaError_t rc = cudaSetDevice(t->devices[r]);
        for (int q = 0; q < t->n && rc == cudaSuccess; q++)
            if (q != r) {
                rc = cudaDeviceEnablePeerAccess(t->devices[q], 0);
                if (rc == cudaErrorPeerAccessAlreadyEnabled) {
                    (void)cudaGetLastError();
                    rc = cudaSuccess;
                }
            }
        if (rc == cudaSuccess)
            rc = cudaMalloc(&t->exchange_mem[r], bytes);
        if (rc == cudaSuccess)
            rc = cudaMemset(t->exchange_mem[r], 0, bytes);
        if (rc != cudaSuccess) {
            if (current >= 0)
                (void)cudaSetDevice(current);
            return bn_error_set(err, BN_ERR_GPU, NULL,
                                "cuda:%d: the team's exchange buffers: %s", t->devices[r],
                                cudaGetErrorString(rc));
        }
    }
    if (current >= 0)
        (void)cudaSetDevice(current);
    for (int r = 0; r < t->n; r++) {
        bn_cb_exchange *x = &t->exchange[r];
        x->rank = r;
        x->ranks = t->n;
        x->slot_bytes = EXCHANGE_SLOT_BYTES;
        for (int q = 0; q < t->n; q++) {
            x->slots[q] = t->exchange_mem[q];
            x->flags[q] = (unsigned long long *)((char *)t->exchange_mem[q] + flags_at);
        }
        x->count = x->flags[r] + t->n;
    }
    t->peer_exchange = true;
    return BN_OK;
}

static bn_status start_workers(bn_cuda_tp *t, bn_error *err)
{
    for (int r = 1; r < t->n; r++) {
        worker_arg *w = malloc(sizeof *w);
        if (!w)
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a rank's thread");
        *w = (worker_arg){t, r};
        if (pthread_create(&t->threads[r], NULL, worker, w) != 0) {
            free(w);
            return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL,
                                "could not start a host thread for rank %d", r);
        }
        t->n_threads = r;
    }
    return BN_OK;
}

bn_status bn_cuda_tp_create(const bn_checkpoint *model, const int *devices, int n,
                            const bn_cuda_backend_options *o, bn_cuda_tp **out, bn_error *err)
{
    *out = NULL;
    bn_status st = check_devices(devices, n, err);
    if (st != BN_OK)
        return st;
    bn_cuda_tp *t = calloc(1, sizeof *t);
    if (!t)
        return bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a team");
    t->n = n;
    memcpy(t->devices, devices, (size_t)n * sizeof *devices);
    pthread_mutex_init(&t->lock, NULL);
    pthread_cond_init(&t->wake, NULL);
    pthread_cond_init(&t->done, NULL);
    t->all_ready = true;
    const int64_t vocab = bn_checkpoint_hparams(model)->vocab;
    for (int r = 0; r < n && st == BN_OK; r++) {
        st = bn_checkpoint_slice(model, r, n, &t->slices[r], err);
        if (st == BN_OK && !(t->scratch[r] = malloc((size_t)vocab * sizeof(float))))
            st = bn_error_set(err, BN_ERR_OUT_OF_MEMORY, NULL, "no memory for a rank's logits");
    }
    if (st == BN_OK)
        st = bn_nccl_get(&t->nccl, err);
    if (st == BN_OK) {
        /* Multicast objects can leave a shared host's GPUs unusable for a
         * long time after a crash; the small collectives here gain nothing
         * from them. */
        setenv("NCCL_NVLS_ENABLE", "0", 1);
        const int rc = t->nccl->comm_init_all(t->comms, n, devices);
        if (rc != 0) {
            memset(t->comms, 0, sizeof t->comms);
            st = bn_error_set(err, BN_ERR_GPU, "'bitnet devices' lists the GPUs and their links",
                              "NCCL could not join %d GPUs: %s", n, t->nccl->error_string(rc));
        }
    }
    if (st == BN_OK)
        st = open_exchange(t, err);
    if (st == BN_OK)
        st = start_workers(t, err);
    if (st == BN_OK) {
        t->create_opt = o;
        st = bn_cuda_tp_run(t, create_rank, t, err);
        t->create_opt = NULL;
    }
    if (st != BN_OK) {
        bn_cuda_tp_free(t);
        return st;
    }
    *out = t;
    return BN_OK;
}

void bn_cuda_tp_free(bn_cuda_tp *t)
{
    if (!t)
        return;
    pthread_mutex_lock(&t->lock);
    t->stop = true;
    pthread_cond_broadcast(&t->wake);
    pthread_mutex_unlock(&t->lock);
    for (int r = 1; r <= t->n_threads; r++)
        pthread_join(t->threads[r], NULL);
    for (int r = 0; r < t->n; r++)
        bn_cuda_backend_free(t->ranks[r]);
    if (!t->aborted)
        for (int r = 0; r < t->n; r++)
            if (t->comms[r])
                (void)t->nccl->comm_destroy(t->comms[r]);
    for (int r = 0; r < t->n; r++) {
        if (t->exchange_mem[r] && cudaSetDevice(t->devices[r]) == cudaSuccess)
            (void)cudaFree(t->exchange_mem[r]);
        bn_checkpoint_free(t->slices[r]);
        free(t->scratch[r]);
    }
    (void)cudaGetLastError();
    pthread_cond_destroy(&t->done);
    pthread_cond_destroy(&t->wake);
    pthread_mutex_destroy(&t->lock);
    free(t);
}

int bn_cuda_tp_size(const bn_cuda_tp *t) { return t->n; }
bool bn_cuda_tp_peer_exchange(const bn_cuda_tp *t) { return t->peer_exchange; }
int bn_cuda_tp_device(const bn_cuda_tp *t, int rank) { return t->devices[rank]; }
bn_cuda_backend *bn_cuda_tp_rank(const bn_cuda_tp *t, int rank) { return t->ranks[rank]; }
float *bn_cuda_tp_scratch_logits(const bn_cuda_tp *t, int rank) { return t->scratch[rank]; }
