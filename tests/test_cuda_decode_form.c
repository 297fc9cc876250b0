/*
 * test_cuda_decode_form.c - the table from what a device and a model allow
 * to the CUDA decode step's form (src/cuda/cuda_decode_form.h), without a
 * GPU: the form on a device that offers everything (an H200 with the 2B-4T
 * model), on one without clusters and programmatic dependent launch
 * (compute capability 8.x), with the fp16 cache, and each piece's own
 * fallback; its words for the startup line; and the tests' limits
 * (bn_cuda_as_if), which only take away (or make a head large enough to
 * screen).
 */
#include <string.h>

#include "cuda_decode_form.h"
#include "test_util.h"

/* An H200 running the 2B-4T shape: every fact true, attention clusters of 8
 * resident, a 656 MB head whose copy fits. */
static bn_cuda_decode_caps everything(void)
{
    bn_cuda_decode_caps c;
    memset(&c, 0, sizeof c);
    c.pdl = true;
    c.gemv_clusters = true;
    c.attn_cluster = 8;
    c.attn_qkv = true;
    c.gate_up_pairs = true;
    c.gate_up_cluster16 = true;
    c.embed_norm = true;
    c.head_bytes = (uint64_t)128256 * 2560 * 2;
    c.head_copy_fits = true;
    c.mapped_pinned = true;
    return c;
}

static void describe(const bn_cuda_decode_caps *c, char *buf, size_t size)
{
    bn_cuda_decode_form f;
    bn_cuda_decode_form_choose(c, &f);
    bn_cuda_decode_form_describe(&f, c->kv_f16, buf, size);
}

static void check_full_device(void)
{
    const bn_cuda_decode_caps c = everything();
    bn_cuda_decode_form f;
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(f.pdl && f.attn_cluster == 8 && f.attn_qkv);
    CHECK(f.gemv_cluster == BN_CUDA_GEMV_CLUSTER && f.gate_up_pair);
    CHECK(f.gate_up_cluster == BN_CUDA_GATE_UP_CLUSTER);
    CHECK(f.embed_norm && f.head_screen && !f.copy_token);
    char words[256];
    describe(&c, words, sizeof words);
    CHECK_MSG(strcmp(words, "attention merge cluster 8 with q|k|v, gemv stage cluster 8 "
                            "(gate|up cluster 16), greedy head screened") == 0,
              "%s", words);
}

/* Compute capability 8.x: no clusters, no programmatic dependent launch. */
static void check_no_clusters(void)
{
    bn_cuda_decode_caps c = everything();
    c.pdl = false;
    c.gemv_clusters = false;
    c.attn_cluster = 0;
    c.gate_up_cluster16 = false;
    /* Shared memory would hold the q|k|v weights, but there is no cluster
     * to compute them in. */
    c.attn_qkv = true;
    bn_cuda_decode_form f;
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(!f.pdl && f.attn_cluster == 0 && !f.attn_qkv);
    CHECK(f.gemv_cluster == 0 && f.gate_up_pair && f.gate_up_cluster == 0);
    CHECK(f.head_screen && f.embed_norm);
    char words[256];
    describe(&c, words, sizeof words);
    CHECK_MSG(strcmp(words, "attention merge ticket, gemv stage block, greedy head screened") == 0,
              "%s", words);
}

/* The fp16 cache's attention is the attention module's, with its own
 * merge: no clusters, no q|k|v inside, whatever the device offers. */
static void check_fp16_cache(void)
{
    bn_cuda_decode_caps c = everything();
    c.kv_f16 = true;
    bn_cuda_decode_form f;
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(f.attn_cluster == 0 && !f.attn_qkv && f.gemv_cluster == BN_CUDA_GEMV_CLUSTER);
    char words[256];
    describe(&c, words, sizeof words);
    CHECK_STR_CONTAINS(words, "attention merge kernel, gemv stage cluster 8");
}

/* Each piece falls back by itself. */
static void check_pieces(void)
{
    bn_cuda_decode_form f;
    bn_cuda_decode_caps c = everything();
    c.attn_qkv = false; /* the weights beyond the cluster's shared memory */
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(f.attn_cluster == 8 && !f.attn_qkv);

    c = everything();
    c.gate_up_cluster16 = false; /* no cluster of 16 resident: as the other GEMVs */
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(f.gate_up_pair && f.gate_up_cluster == f.gemv_cluster);
    char words[256];
    describe(&c, words, sizeof words);
    CHECK_MSG(strstr(words, "gate|up") == NULL, "%s", words);

    c = everything();
    c.gate_up_pairs = false; /* gate and up not whole tiles: raw values, staged as the others */
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(!f.gate_up_pair && f.gate_up_cluster == BN_CUDA_GEMV_CLUSTER);

    c = everything();
    c.embed_norm = false; /* e.g. a Q8_0 embedding: its own kernel first */
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(!f.embed_norm);

    c = everything();
    c.mapped_pinned = false;
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(f.copy_token);

    /* The screened head: from 64 MiB of head up, where its copy fits. */
    c = everything();
    c.head_bytes = BN_CUDA_HEAD_SCREEN_MIN;
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(f.head_screen);
    c.head_bytes = BN_CUDA_HEAD_SCREEN_MIN - 1;
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(!f.head_screen);
    c = everything();
    c.head_copy_fits = false;
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(!f.head_screen);
    describe(&c, words, sizeof words);
    CHECK_STR_CONTAINS(words, "greedy head full");
}

/* The tests' limits take away what they name and nothing else; a head as
 * if large is screened where its copy fits. */
static void check_limits(void)
{
    const bn_cuda_decode_caps all = everything();
    bn_cuda_decode_caps c = all;
    bn_cuda_decode_caps_limit(&c, NULL);
    CHECK(memcmp(&c, &all, sizeof c) == 0);
    const bn_cuda_as_if none = {0};
    bn_cuda_decode_caps_limit(&c, &none);
    CHECK(memcmp(&c, &all, sizeof c) == 0);

    const bn_cuda_as_if sm80 = {.no_clusters = true, .no_pdl = true};
    c = all;
    bn_cuda_decode_caps_limit(&c, &sm80);
    CHECK(!c.pdl && !c.gemv_clusters && c.attn_cluster == 0 && !c.attn_qkv &&
          !c.gate_up_cluster16);
    CHECK(c.gate_up_pairs && c.embed_norm && c.mapped_pinned && c.head_copy_fits);

    const bn_cuda_as_if qkv = {.no_attn_qkv = true, .no_cluster16 = true};
    c = all;
    bn_cuda_decode_caps_limit(&c, &qkv);
    CHECK(!c.attn_qkv && !c.gate_up_cluster16 && c.attn_cluster == 8 && c.gemv_clusters &&
          c.pdl);

    const bn_cuda_as_if raw = {.no_gate_up_pairs = true, .no_mapped_pinned = true};
    c = all;
    bn_cuda_decode_caps_limit(&c, &raw);
    CHECK(!c.gate_up_pairs && !c.gate_up_cluster16 && !c.mapped_pinned && c.attn_qkv);

    const bn_cuda_as_if large = {.screen_any_head = true};
    c = all;
    c.head_bytes = 1 << 20;
    bn_cuda_decode_caps_limit(&c, &large);
    bn_cuda_decode_form f;
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(c.head_bytes == BN_CUDA_HEAD_SCREEN_MIN && f.head_screen);
    c.head_copy_fits = false; /* no room for the copy: still the whole head */
    bn_cuda_decode_form_choose(&c, &f);
    CHECK(!f.head_screen);
    c = all;
    bn_cuda_decode_caps_limit(&c, &large); /* a large head stays as it is */
    CHECK(c.head_bytes == all.head_bytes);
}

int main(void)
{
    check_full_device();
    check_no_clusters();
    check_fp16_cache();
    check_pieces();
    check_limits();
    TEST_EXIT();
}
