/*
 * cuda_backend_decode.c - the CUDA backend's decode step: its inputs in
 * device memory (d_dec), the captured graphs that serve it and their replay,
 * the hand-off of the chosen token to the host and to a chained step, the
 * submitted steps (submit, chained, wait, drop_pending) and the capture of
 * the graphs at creation, with the greedy graph's stage map.
 */
#include <stdlib.h>
#include <string.h>

#include "cuda_backend_internal.h"

/* The pinned image of the decode inputs the step being queued reads (its
 * parity's tail: cb_h_tail), with the sampler's uniform number and
 * parameters in it. */
static int32_t *h_dec(bn_cuda_backend *b) { return cb_h_tail(b, b->par); }
static double *h_uniform(bn_cuda_backend *b) { return (double *)(void *)(h_dec(b) + DEC_UNIFORM); }
static bn_cuda_sample_params *h_params(bn_cuda_backend *b)
{
    return (bn_cuda_sample_params *)(void *)(h_dec(b) + DEC_PARAMS);
}

/* Where a kernel stores a result for the host: `host` (inside h_io) as the
 * device addresses it, or NULL where pinned memory is not mapped (the
 * result is then copied: cb_publish_token). */
static void *dev_alias(bn_cuda_backend *b, void *host)
{
    return b->h_io_dev ? b->h_io_dev + ((char *)host - (char *)b->h_io) : NULL;
}

/* The decode step's inputs (its parity's d_dec image, which its graphs
 * read): the token, its position, the KV length after it, the top k that
 * the screened LM head must compute exactly (bn_cb_head_exact's *d_k), then
 * the uniform number and the parameters a sampled step's sampler draws
 * with (zeros when p is NULL), so that a step needs one upload. A chained
 * step's token, position and length are on the device already (the step
 * before wrote them: cb_queue_handoff), and the rest is uploaded only when it
 * differs from what that image holds (a greedy chain uploads nothing). */
enum { DEC_BYTES = DEC_INTS * sizeof(int32_t) };
bn_status cb_upload_dec(bn_cuda_backend *b, int32_t token, int64_t pos, int top_k, double u,
                        const bn_cuda_sample_params *p, bool chained, bn_error *err)
{
    int32_t *dec = h_dec(b);
    dec[0] = token;
    dec[1] = (int32_t)pos;
    dec[2] = (int32_t)(pos + 1);
    dec[3] = top_k;
    *h_uniform(b) = u;
    if (p)
        *h_params(b) = *p;
    else
        memset(h_params(b), 0, sizeof *h_params(b));
    const int first = chained ? 3 : 0;
    const size_t rest = (size_t)(DEC_INTS - 3) * sizeof(int32_t);
    int32_t *sent = b->dec_sent[b->par];
    if (chained && b->dec_valid[b->par] && memcmp(sent + 3, dec + 3, rest) == 0)
        return BN_OK;
    const size_t bytes = (size_t)(DEC_INTS - first) * sizeof(int32_t);
    BN_CUDA_TRY(err, cudaMemcpyAsync(cb_dec_dev(b) + first, dec + first, bytes,
                                     cudaMemcpyHostToDevice, b->cs));
    cb_count_h2d(b, bytes);
    memcpy(sent, dec, DEC_BYTES);
    b->dec_valid[b->par] = true;
    return BN_OK;
}

/* Queues a captured step (the inputs uploaded). */
bn_status cb_replay(bn_cuda_backend *b, const step_graph *g, bn_error *err)
{
    BN_CUDA_TRY(err, cudaGraphLaunch(g->exec, b->cs));
    cb_count_launches(b, g->launches);
    b->ran |= g->kernels | 1u << K_GRAPH;
    return BN_OK;
}

/* The captured decode step that serves a pass: with a screened head, steps
 * that return logits (top_k 0) have a graph of their own, and so do sampled
 * steps; the greedy and sampled ones come in two copies, one per d_dec
 * image (steps that return logits are never chained: parity 0). */
const step_graph *cb_pass_graph(const bn_cuda_backend *b, bool screen,
                                const bn_cuda_sample_params *sample)
{
    const bool odd = b->par == 1;
    if (sample && b->graph_sample.exec)
        return odd ? &b->graph_sample1 : &b->graph_sample;
    if (b->form.head_screen && !screen)
        return &b->graph_logits;
    return odd ? &b->graph1 : &b->graph;
}

/* The step's chosen token, in d_best as a key (key) or in d_next, handed
 * on by the step's last kernel: stored for the host in its parity's pinned
 * tail where pinned memory is mapped (cb_publish_token copies it otherwise),
 * and as the token, position and length of a step chained after it in the
 * other d_dec image. Launched eagerly, or captured as a graph's last node. */
bn_status cb_queue_handoff(bn_cuda_backend *b, bool key, bn_error *err)
{
    void *host = key ? (void *)cb_h_key_at(b, b->par) : (void *)cb_h_next_at(b, b->par);
    int32_t *feed = b->d_dec + (b->par ^ 1) * DEC_STRIDE;
    BN_CUDA_TRY(err, bn_cb_decode_handoff(key ? b->d_best : NULL, key ? NULL : b->d_next,
                                          b->hp.vocab, dev_alias(b, host), cb_dec_dev(b), feed,
                                          b->form.pdl && !b->prof, b->cs));
    b->ran |= 1u << K_HANDOFF;
    if (b->capture_stages)
        return cb_mark(b, BN_CUDA_STAGE_ARGMAX, 1, err);
    cb_count_launches(b, 1);
    return BN_OK;
}

/* The token the step just queued handed off (the key in d_best, key) on its
 * way to the host: stored there already where pinned memory is mapped,
 * else copied. Either way one transfer of its bytes for the statistics. */
bn_status cb_publish_token(bn_cuda_backend *b, bool key, bn_error *err)
{
    const size_t bytes = key ? sizeof *b->d_best : sizeof(int32_t);
    if (!b->h_io_dev)
        BN_CUDA_TRY(err, cudaMemcpyAsync(key ? (void *)cb_h_key_at(b, b->par)
                                             : (void *)cb_h_next_at(b, b->par),
                                         key ? (const void *)b->d_best : (const void *)b->d_next,
                                         bytes, cudaMemcpyDeviceToHost, b->cs));
    cb_count_d2h(b, bytes);
    return BN_OK;
}

/* Queues one decode step at pos (reading d_dec image b->par; chained: its
 * token is the one the pending step picks) and notes it as pending. */
static bn_status submit_step(bn_cuda_backend *b, int32_t token, int64_t pos,
                             const bn_cuda_sample_params *p, double u, bool chained,
                             bn_error *err)
{
    const int par = b->par;
    bn_status st = cb_queue_step(b, &token, 1, pos, p, u, chained, err);
    if (st == BN_OK)
        st = BN_CUDA_STATUS(err, cudaEventRecord(b->step_done[par], b->cs));
    b->par = 0;
    if (st != BN_OK)
        return cb_fail_pass(b, b->n_pending ? b->pend[0].pos : pos, st);
    b->pend[b->n_pending++] = (struct pending_step){pos, cb_choice_greedy(p), par};
    return BN_OK;
}

bn_status bn_cuda_backend_submit_sample(bn_cuda_backend *b, int32_t token, int64_t pos,
                                        const bn_cuda_sample_params *p, double u, bn_error *err)
{
    if (!b)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda submit: NULL backend");
    bn_status st = cb_check_request(b, &token, 1, pos, err);
    if (st == BN_OK)
        st = cb_check_choice(b, p, u, err);
    if (st == BN_OK)
        st = cb_begin_call(b, err);
    if (st != BN_OK)
        return st;
    b->par = 0;
    return submit_step(b, token, pos, p, u, false, err);
}

bn_status bn_cuda_backend_submit_greedy(bn_cuda_backend *b, int32_t token, int64_t pos,
                                        bn_error *err)
{
    return bn_cuda_backend_submit_sample(b, token, pos, NULL, 0.0, err);
}

bn_status bn_cuda_backend_submit_chained(bn_cuda_backend *b, const bn_cuda_sample_params *p,
                                         double u, bn_error *err)
{
    if (!b)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda submit: NULL backend");
    if (b->n_pending != 1)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            b->n_pending ? "wait for the older step first"
                                         : "submit a step with its token first",
                            "cuda submit_chained: needs exactly one submitted step not yet "
                            "waited for (there are %d)",
                            b->n_pending);
    const int64_t pos = b->pend[0].pos + 1;
    if (pos >= b->kv_len)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT,
                            "start a new context or create the backend with a longer kv_len",
                            "position %lld does not fit a KV cache of %lld positions",
                            (long long)pos, (long long)b->kv_len);
    bn_status st = cb_check_choice(b, p, u, err);
    if (st != BN_OK)
        return st; /* the request: the pending step is left as it is */
    st = cb_begin_call(b, err);
    if (st != BN_OK) /* the device: nothing is left pending, as for a failed step */
        return cb_fail_pass(b, b->pend[0].pos, st);
    b->par = b->pend[0].par ^ 1;
    return submit_step(b, -1, pos, p, u, true, err);
}

bn_status bn_cuda_backend_wait_greedy(bn_cuda_backend *b, int32_t *next, bn_error *err)
{
    if (!b || !next || !b->n_pending)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL,
                            "cuda wait: no submitted step to wait for");
    const struct pending_step step = b->pend[0];
    bn_status st = BN_CUDA_STATUS(err, cudaEventSynchronize(b->step_done[step.par]));
    if (st != BN_OK)
        return cb_fail_pass(b, step.pos, st);
    b->pend[0] = b->pend[1];
    b->n_pending--;
    *next = cb_chosen_token(b, step.greedy, step.par);
    b->kv_filled = step.pos + 1;
    return BN_OK;
}

int bn_cuda_backend_pending(const bn_cuda_backend *b) { return b ? b->n_pending : 0; }

bn_status bn_cuda_backend_drop_pending(bn_cuda_backend *b, bn_error *err)
{
    if (!b)
        return bn_error_set(err, BN_ERR_INVALID_ARGUMENT, NULL, "cuda drop: NULL backend");
    if (!b->n_pending)
        return BN_OK;
    const int64_t pos = b->pend[0].pos;
    const bn_status st = BN_CUDA_STATUS(err, cudaStreamSynchronize(b->cs));
    /* The steps ran (or failed) but their tokens were never taken: their
     * positions are forgotten either way. */
    (void)cb_fail_pass(b, pos, st);
    return st;
}

/* ---- creation: graph ------------------------------------------------------------ */

/* Records the decode step once. A failure is not fatal: decode then
 * launches eagerly, which computes the same thing. A capture with
 * programmatic dependent launch that fails (a driver that cannot put it in
 * a graph) is retried without it. */
typedef enum { STEP_GREEDY, STEP_LOGITS, STEP_SAMPLED } step_kind;
static bool capture_graph_once(bn_cuda_backend *b, bool log_failure, step_kind kind, int par);

void cb_free_stage_map(bn_cuda_backend *b)
{
    free(b->graph_nodes);
    free(b->graph_node_stage);
    b->graph_nodes = NULL;
    b->graph_node_stage = NULL;
    b->n_graph_nodes = 0;
    if (b->graph_src)
        cudaGraphDestroy(b->graph_src);
    b->graph_src = NULL;
}

/* Names the stage of every kernel node of the captured decode graph: the
 * capture is one chain, so walking it from its root meets the kernels in
 * launch order, and cb_mark() logged how many each stage launched. False (no
 * map, nothing kept) when the graph is not such a chain or the counts
 * disagree: only the skip timing needs the map. */
static bool map_graph_stages(bn_cuda_backend *b, cudaGraph_t graph)
{
    cb_free_stage_map(b);
    int total = 0;
    for (int i = 1; i < b->n_capture; i += 2)
        total += b->capture_stages[i];
    if (!b->capture_stages || total <= 0)
        return false;
    b->graph_nodes = calloc((size_t)total, sizeof *b->graph_nodes);
    b->graph_node_stage = calloc((size_t)total, 1);
    if (!b->graph_nodes || !b->graph_node_stage) {
        cb_free_stage_map(b);
        return false;
    }
    cudaGraphNode_t node = NULL;
    size_t n = 1;
    bool ok = cudaGraphGetRootNodes(graph, &node, &n) == cudaSuccess && n == 1;
    int found = 0, entry = 0, left = b->n_capture > 1 ? b->capture_stages[1] : 0;
    while (ok && node) {
        enum cudaGraphNodeType type;
        ok = cudaGraphNodeGetType(node, &type) == cudaSuccess;
        if (ok && type == cudaGraphNodeTypeKernel) {
            while (left == 0 && entry + 3 < b->n_capture) {
                entry += 2;
                left = b->capture_stages[entry + 1];
            }
            ok = found < total && left > 0;
            if (ok) {
                b->graph_nodes[found] = node;
                b->graph_node_stage[found++] = (unsigned char)b->capture_stages[entry];
                left--;
            }
        }
        /* With edge data: programmatic (PDL) edges carry some, and a query
         * without it fails as lossy. */
        cudaGraphNode_t next[2];
        cudaGraphEdgeData edges[2];
        n = 2;
        ok = ok && cudaGraphNodeGetDependentNodes(node, next, edges, &n) == cudaSuccess && n <= 1;
        node = ok && n == 1 ? next[0] : NULL;
    }
    (void)cudaGetLastError();
    b->stage_map_why = !ok ? "the decode graph is not one chain of kernels in launch order"
                           : "the decode graph's kernels and the stages' launches differ in number";
    if (!ok || found != total) {
        cb_free_stage_map(b);
        return false;
    }
    b->n_graph_nodes = found;
    return true;
}

/* The greedy step's graph (with the stage map), then, when the head is
 * screened, the graph of a step that returns logits, and the sampled
 * step's; the greedy and sampled ones again reading the second d_dec image
 * (chained steps alternate between the two). */
void cb_capture_graph(bn_cuda_backend *b)
{
    if (!capture_graph_once(b, !b->form.pdl, STEP_GREEDY, 0) && b->form.pdl) {
        bn_log(BN_LOG_WARN, "cuda backend: capturing the decode step with programmatic dependent "
                            "launch failed; capturing it without");
        b->form.pdl = false;
        (void)capture_graph_once(b, true, STEP_GREEDY, 0);
    }
    if (b->graph.exec && b->form.head_screen)
        (void)capture_graph_once(b, true, STEP_LOGITS, 0);
    if (b->graph.exec)
        (void)capture_graph_once(b, true, STEP_SAMPLED, 0);
    if (b->graph.exec)
        (void)capture_graph_once(b, true, STEP_GREEDY, 1);
    if (b->graph_sample.exec)
        (void)capture_graph_once(b, true, STEP_SAMPLED, 1);
}

/* The step of `kind` into its graph: the greedy step (screened head when
 * b->form.head_screen, then the hand-off of its key) into b->graph, with the
 * stage map; the step with the full LM head into b->graph_logits; the
 * greedy step's kernels, then the sampler, which reads its parameters and
 * uniform number from d_dec, and the hand-off of its token into
 * b->graph_sample. par 1: the same reading the second d_dec image, into
 * graph1 / graph_sample1. */
static bool capture_graph_once(bn_cuda_backend *b, bool log_failure, step_kind kind, int par)
{
    const bool logits = kind == STEP_LOGITS;
    step_graph *g = kind == STEP_GREEDY ? (par ? &b->graph1 : &b->graph)
                    : logits            ? &b->graph_logits
                                        : (par ? &b->graph_sample1 : &b->graph_sample);
    cudaGraphExec_t *exec = &g->exec;
    bn_error cerr;
    bn_error_clear(&cerr);
    cudaGraph_t graph = NULL;
    cudaError_t rc = cudaStreamBeginCapture(b->cs, cudaStreamCaptureModeRelaxed);
    bn_status st = BN_ERR_GPU;
    const unsigned before = b->ran;
    /* The stages in launch order, for bn_cuda_backend_time_decode_without. */
    b->cap_capture = 4 * (b->hp.n_layer * 16 + 8);
    b->capture_stages = calloc((size_t)b->cap_capture, sizeof *b->capture_stages);
    b->n_capture = 0;
    b->capture_launches = 0;
    if (rc == cudaSuccess) {
        b->ran = 0;
        b->par = par;
        int32_t *dec = cb_dec_dev(b);
        const bool screen = cb_pass_screens(b, logits ? 0 : 1, kind == STEP_SAMPLED);
        st = cb_enqueue_rows(b, 1, dec, dec + 1, dec + 2, 0, screen, &cerr);
        if (st == BN_OK && kind == STEP_SAMPLED)
            st = cb_queue_sampler(b, &cerr);
        /* The choice's hand-off, where the graph makes the choice. */
        if (st == BN_OK && (kind == STEP_SAMPLED || (kind == STEP_GREEDY && b->form.head_screen)))
            st = cb_queue_handoff(b, kind == STEP_GREEDY, &cerr);
        b->par = 0;
        g->kernels = b->ran;
        g->launches = b->capture_launches;
        b->ran = before;
        const cudaError_t end = cudaStreamEndCapture(b->cs, &graph);
        if (end != cudaSuccess && st == BN_OK) {
            st = BN_ERR_GPU;
            rc = end;
        }
    }
    if (st == BN_OK && graph) {
        rc = cudaGraphInstantiate(exec, graph, 0);
        if (rc != cudaSuccess) {
            *exec = NULL;
            st = BN_ERR_GPU;
        }
    }
    if (st == BN_OK && kind == STEP_GREEDY && par == 0 && map_graph_stages(b, graph)) {
        b->graph_src = graph; /* kept: its nodes name the exec graph's nodes */
        graph = NULL;
    }
    free(b->capture_stages);
    b->capture_stages = NULL;
    if (graph)
        cudaGraphDestroy(graph);
    if (st != BN_OK || !*exec) {
        *exec = NULL;
        (void)cudaGetLastError();
        static const char *const what[] = {"decode", "the full-head decode",
                                           "the sampled decode"};
        static const char *const steps[] = {"decode steps", "decode steps that return logits",
                                            "sampled decode steps"};
        if (log_failure)
            bn_log(BN_LOG_WARN, "cuda backend: %s graph%s capture failed (%s); %s%s launch "
                                "their kernels one by one",
                   what[kind], par ? " (second input image)" : "",
                   cerr.message[0] ? cerr.message : cudaGetErrorString(rc), steps[kind],
                   par ? " chained onto that image" : "");
        return false;
    }
    return true;
}
