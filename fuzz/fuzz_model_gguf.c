/*
 * fuzz_model_gguf.c - the whole model loader (bn_checkpoint_load in
 * src/model/model_load.c and model_gguf.c) on a GGUF file made of
 * arbitrary bytes.
 *
 * The input goes into a memfd and is loaded as /proc/self/fd/N, exactly as
 * `bitnet run -m FILE` loads a file: bn_checkpoint_load, then the GGUF reader,
 * hyperparameters, every tensor's type and shape, norms, the tokenizer.
 * When a model comes out of it, the weights are used the way a backend
 * uses them: every projection unpacked to codes (up to a budget, so one
 * input stays fast), embedding rows at both ends of the vocabulary, the
 * LM head's rows, every norm vector, and the tokenizer on a short text.
 *
 * Seeds: fuzz/corpus/model_gguf (the model fixtures in tests/data/models:
 * I2_S, TQ1_0 and TQ2_0 projections with a byte-level BPE tokenizer).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "model.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Codes unpacked per input at most: the fixtures need about 1 M; a file
 * can describe more only by being larger, and that is slow, not a bug. */
#define CODE_BUDGET ((int64_t)16 << 20)

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    bn_log_set_level(BN_LOG_ERROR); /* "no tokenizer metadata" and the like */
    return 0;
}

static void use_projections(const bn_checkpoint *m, const bn_hparams *hp)
{
    int64_t budget = CODE_BUDGET;
    for (int l = 0; l < hp->n_layer; l++)
        for (int p = 0; p < BN_PROJ_COUNT; p++) {
            int64_t n, k;
            bn_hparams_proj_shape(hp, (bn_proj)p, &n, &k);
            if (n <= 0 || k <= 0 || n > budget / k)
                return;
            budget -= n * k;
            int8_t *codes = malloc((size_t)(n * k));
            if (!codes)
                fuzz_die("out of memory", NULL);
            float scale = 0.0f;
            bn_error err;
            bn_error_clear(&err);
            bn_status st = bn_checkpoint_projection_codes(m, l, (bn_proj)p, codes, &scale, &err);
            fuzz_check_error(st, &err);
            if (st == BN_OK)
                for (int64_t i = 0; i < n * k; i++)
                    if (codes[i] < -1 || codes[i] > 1)
                        fuzz_die("a projection code outside {-1, 0, +1}", bn_proj_name((bn_proj)p));
            (void)bn_checkpoint_projection_type(m, l, (bn_proj)p);
            free(codes);
        }
}

static void use_dense(const bn_dense_matrix *d)
{
    if (!d || d->rows <= 0)
        return;
    /* Whole first and last rows: row_bytes must really be there. */
    fuzz_touch(d->data, d->row_bytes);
    fuzz_touch((const uint8_t *)d->data + (size_t)(d->rows - 1) * d->row_bytes, d->row_bytes);
}

static void use_norms(const bn_checkpoint *m, const bn_hparams *hp)
{
    fuzz_touch(bn_checkpoint_output_norm(m), (size_t)hp->dim * sizeof(float));
    for (int l = 0; l < hp->n_layer; l++)
        for (int w = 0; w < BN_NORM_COUNT; w++)
            fuzz_touch(bn_checkpoint_norm(m, l, (bn_norm)w),
                       (size_t)bn_hparams_norm_size(hp, (bn_norm)w) * sizeof(float));
}

static void use_tokenizer(const bn_checkpoint *m)
{
    const struct bn_tokenizer *t = bn_checkpoint_tokenizer(m);
    if (!t)
        return;
    static const char text[] = "<|begin_of_text|>Hello w\xC3\xB6rld<|eot_id|>";
    int32_t *ids = NULL;
    size_t n = 0;
    bn_error err;
    bn_error_clear(&err);
    if (bn_tokenize(t, text, sizeof text - 1, true, true, &ids, &n, &err) == BN_OK) {
        /* The loader promised the vocabulary fits the embedding. */
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= bn_checkpoint_hparams(m)->vocab)
                fuzz_die("the tokenizer produced an id the model has no row for", NULL);
        char *back = NULL;
        bn_error_clear(&err);
        if (bn_detokenize(t, ids, n, &back, &err) == BN_OK)
            free(back);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    bn_checkpoint *m = NULL;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_checkpoint_load(path, &m, &err);
    close(fd); /* the model keeps its own mapping */
    fuzz_check_error(st, &err);
    if (st != BN_OK)
        return 0;

    const bn_hparams *hp = bn_checkpoint_hparams(m);
    bn_error_clear(&err);
    if (bn_hparams_validate(hp, &err) != BN_OK)
        fuzz_die("the loader returned a model with invalid hyperparameters", err.message);
    if (!memchr(hp->arch, '\0', sizeof hp->arch) || !memchr(hp->flavour, '\0', sizeof hp->flavour))
        fuzz_die("hparams strings not terminated", NULL);

    use_projections(m, hp);
    float *row = malloc((size_t)hp->dim * sizeof *row);
    if (!row)
        fuzz_die("out of memory", NULL);
    const int32_t tokens[] = {0, hp->vocab - 1};
    for (int i = 0; i < 2; i++) {
        bn_error_clear(&err);
        if (bn_checkpoint_embedding_row(m, tokens[i], row, &err) != BN_OK)
            fuzz_die("bn_checkpoint_embedding_row refused a token inside the vocabulary",
                     err.message);
    }
    free(row);
    use_dense(bn_checkpoint_embedding(m));
    use_dense(bn_checkpoint_lm_head(m));
    use_norms(m, hp);
    use_tokenizer(m);
    (void)bn_checkpoint_weight_bytes(m);
    bn_checkpoint_free(m);
    return 0;
}
