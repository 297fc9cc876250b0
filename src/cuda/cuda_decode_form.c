/*
 * cuda_decode_form.c - the table from what the device and the model allow
 * to the CUDA decode step's form (cuda_decode_form.h).
 */
#include "cuda_decode_form.h"

#include <stdio.h>
#include <string.h>

void bn_cuda_decode_form_choose(const bn_cuda_decode_caps *c, bn_cuda_decode_form *f)
{
    memset(f, 0, sizeof *f);
    f->pdl = c->pdl;
    /* The fp32 cache's attention in clusters (no workspace, no ticket),
     * computing the q|k|v product itself where the clusters hold the
     * weights: one kernel fewer a layer. The fp16 cache's attention is the
     * attention module's. */
    f->attn_cluster = c->kv_f16 ? 0 : c->attn_cluster;
    f->attn_qkv = f->attn_cluster > 0 && c->attn_qkv;
    f->gemv_cluster = c->gemv_clusters ? BN_CUDA_GEMV_CLUSTER : 0;
    f->gate_up_pair = c->gate_up_pairs;
    f->gate_up_cluster = f->gate_up_pair && f->gemv_cluster > 0 && c->gate_up_cluster16
                             ? BN_CUDA_GATE_UP_CLUSTER
                             : f->gemv_cluster;
    f->embed_norm = c->embed_norm;
    f->head_screen = c->head_bytes >= BN_CUDA_HEAD_SCREEN_MIN && c->head_copy_fits;
    f->copy_token = !c->mapped_pinned;
}

/* "cluster N", or `none` where n is 0. */
static void cluster_or(char *buf, size_t size, int n, const char *none)
{
    if (n > 0)
        snprintf(buf, size, "cluster %d", n);
    else
        snprintf(buf, size, "%s", none);
}

void bn_cuda_decode_form_describe(const bn_cuda_decode_form *f, bool kv_f16, char *buf,
                                  size_t size)
{
    char merge[32], stage[32], gate_up[48] = "";
    cluster_or(merge, sizeof merge, f->attn_cluster, kv_f16 ? "kernel" : "ticket");
    cluster_or(stage, sizeof stage, f->gemv_cluster, "block");
    if (f->gate_up_cluster != f->gemv_cluster) { /* the gate|up GEMV's own */
        char own[32];
        cluster_or(own, sizeof own, f->gate_up_cluster, "block");
        snprintf(gate_up, sizeof gate_up, " (gate|up %s)", own);
    }
    snprintf(buf, size, "attention merge %s%s, gemv stage %s%s, greedy head %s", merge,
             f->attn_qkv ? " with q|k|v" : "", stage, gate_up,
             f->head_screen ? "screened" : "full");
}

void bn_cuda_decode_caps_limit(bn_cuda_decode_caps *c, const bn_cuda_as_if *a)
{
    if (!a)
        return;
    if (a->no_clusters) {
        c->gemv_clusters = false;
        c->attn_cluster = 0;
        c->gate_up_cluster16 = false;
    }
    if (a->no_clusters || a->no_attn_qkv)
        c->attn_qkv = false;
    if (a->no_pdl)
        c->pdl = false;
    if (a->no_gate_up_pairs)
        c->gate_up_pairs = false;
    if (a->no_gate_up_pairs || a->no_cluster16)
        c->gate_up_cluster16 = false;
    if (a->no_mapped_pinned)
        c->mapped_pinned = false;
    if (a->screen_any_head && c->head_bytes < BN_CUDA_HEAD_SCREEN_MIN)
        c->head_bytes = BN_CUDA_HEAD_SCREEN_MIN;
}
