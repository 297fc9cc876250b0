/*
 * test_head_screen.c - the CPU backend's greedy picks through the screened
 * LM head (src/kernels/head_screen.h; its kernels and bound are checked in
 * test_kernels.c): on random models, the greedy token of forward_greedy
 * and forward_rows_greedy equals the host's greedy rule over forward()'s
 * full logits, at every step of a prompt and its continuation, one row at
 * a time and several; and the head over many rows of a pass gives each
 * row its logits alone, bit for bit. As test_head_screen_scalar
 * (BITNET_KERNEL=scalar) the same without the screen.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_backend.h"
#include "model.h"
#include "sampler.h"
#include "test_util.h"

/* A random small shape (rows of dim % 8 != 0 among them) of n_ctx positions. */
static bn_hparams random_shape(int n_ctx)
{
    bn_hparams hp;
    memset(&hp, 0, sizeof hp);
    hp.n_head_kv = (int)test_rand_range(1, 2);
    hp.n_head = hp.n_head_kv * (int)test_rand_range(1, 3);
    hp.head_dim = 2 * (int)test_rand_range(2, 10);
    hp.dim = hp.n_head * hp.head_dim;
    hp.ffn = (int)test_rand_range(9, 120);
    hp.vocab = (int)test_rand_range(40, 3000);
    hp.n_layer = (int)test_rand_range(1, 2);
    hp.n_ctx_train = n_ctx;
    hp.rope_dim = hp.head_dim;
    hp.rms_eps = 1e-5f;
    hp.rope_theta = 10000.0f;
    hp.tied_embeddings = test_rand_range(0, 1) != 0;
    return hp;
}

/* The backend's greedy picks against the host's greedy rule on full logits. */
static void test_backend(int round)
{
    bn_hparams hp = random_shape(64);
    bn_checkpoint *m = NULL;
    bn_error err;
    CHECK(bn_checkpoint_create_random(&hp, test_rand_u64(), &m, &err) == BN_OK);
    if (!m)
        return;
    bn_cpu_backend *full = NULL, *screened = NULL;
    const int threads = (int)test_rand_range(1, 3);
    CHECK(bn_cpu_backend_create_paged(m, 0, 64, threads, &full, &err) == BN_OK);
    CHECK(bn_cpu_backend_create_paged(m, 0, 64, threads, &screened, &err) == BN_OK);
    bn_sampler_params sp;
    bn_sampler_params_default(&sp);
    bn_sampler *greedy = NULL;
    CHECK(bn_sampler_create(&sp, hp.vocab, &greedy, &err) == BN_OK);
    float *logits = malloc((size_t)hp.vocab * sizeof *logits);
    if (full && screened && greedy && logits) {
        const int64_t n_prompt = test_rand_range(1, 20);
        int32_t tokens[64];
        for (int64_t i = 0; i < n_prompt; i++)
            tokens[i] = (int32_t)test_rand_range(0, hp.vocab - 1);
        int64_t pos = 0, n = n_prompt;
        int differ = 0, steps = 0;
        while (pos + n <= 40) {
            CHECK(bn_cpu_backend_forward(full, tokens + pos, n, pos, BN_LOGITS_LAST, logits,
                                         &err) == BN_OK);
            const int32_t want = bn_sampler_sample(greedy, logits, NULL, 0);
            int32_t got = -7;
            CHECK(bn_cpu_backend_forward_greedy(screened, tokens + pos, n, pos, &got, &err) ==
                  BN_OK);
            differ += got != want;
            steps++;
            pos += n;
            tokens[pos] = want >= 0 ? want : 0;
            n = 1;
        }
        CHECK_MSG(differ == 0, "round %d (vocab %d, dim %d): %d of %d greedy picks differ",
                  round, hp.vocab, hp.dim, differ, steps);

        /* Batches: two sequences in blocks of 8, the last row of each
         * picked, one at a time (the screen) and both together. */
        int32_t table0[4] = {0, 1, 2, 3}, table1[4] = {4, 5, 6, 7};
        const int32_t *tables[2] = {table0, table1};
        const int32_t table_len[2] = {4, 4};
        int32_t btok[12], bseq[12];
        int64_t bpos[12], logit_rows[2] = {5, 11};
        for (int i = 0; i < 12; i++) {
            btok[i] = (int32_t)test_rand_range(0, hp.vocab - 1);
            bseq[i] = i < 6 ? 0 : 1;
            bpos[i] = i < 6 ? i : i - 6;
        }
        bn_batch_rows rows = {.tokens = btok, .pos = bpos, .seq = bseq, .n_rows = 12,
                              .tables = tables, .table_len = table_len, .block_size = 8,
                              .logit_rows = logit_rows, .n_logits = 2};
        float *two = malloc((size_t)(2 * hp.vocab) * sizeof *two);
        int32_t picked[2] = {-7, -7};
        CHECK(bn_cpu_backend_forward_rows(full, &rows, two, &err) == BN_OK);
        CHECK(bn_cpu_backend_forward_rows_greedy(screened, &rows, picked, &err) == BN_OK);
        for (int k = 0; k < 2; k++)
            CHECK_MSG(picked[k] == bn_sampler_sample(greedy, two + k * hp.vocab, NULL, 0),
                      "round %d: batch row %d picked %d", round, k, picked[k]);
        rows.n_logits = 1;
        rows.logit_rows = &logit_rows[1];
        picked[0] = -7;
        CHECK(bn_cpu_backend_forward_rows_greedy(screened, &rows, picked, &err) == BN_OK);
        CHECK(bn_cpu_backend_forward_rows(full, &rows, two, &err) == BN_OK);
        CHECK(picked[0] == bn_sampler_sample(greedy, two, NULL, 0));
        free(two);
    }
    free(logits);
    bn_sampler_free(greedy);
    bn_cpu_backend_free(full);
    bn_cpu_backend_free(screened);
    bn_checkpoint_free(m);
}

/* The head over many rows at once (a pass's rows in blocks of eight, the
 * greedy picks' groups) gives each row the logits it gets alone, bit for
 * bit, and the greedy picks of every row are the host's rule over them. */
static void test_rows_head(int round)
{
    bn_hparams hp = random_shape(8);
    bn_checkpoint *m = NULL;
    bn_error err;
    CHECK(bn_checkpoint_create_random(&hp, test_rand_u64(), &m, &err) == BN_OK);
    if (!m)
        return;
    enum { MAX_ROWS = 45 };
    bn_cpu_backend *b = NULL;
    CHECK(bn_cpu_backend_create_paged(m, 0, MAX_ROWS, (int)test_rand_range(1, 3), &b, &err) ==
          BN_OK);
    bn_sampler_params sp;
    bn_sampler_params_default(&sp);
    bn_sampler *greedy = NULL;
    CHECK(bn_sampler_create(&sp, hp.vocab, &greedy, &err) == BN_OK);
    /* R sequences of one token each, sequence s in block s. */
    const int R = (int)test_rand_range(1, MAX_ROWS);
    int32_t tok[MAX_ROWS], seq[MAX_ROWS], blocks[MAX_ROWS], table_len[MAX_ROWS];
    int64_t pos[MAX_ROWS], logit_rows[MAX_ROWS];
    const int32_t *tables[MAX_ROWS];
    for (int s = 0; s < R; s++) {
        tok[s] = (int32_t)test_rand_range(0, hp.vocab - 1);
        seq[s] = s;
        pos[s] = 0;
        blocks[s] = s;
        tables[s] = &blocks[s];
        table_len[s] = 1;
        logit_rows[s] = s;
    }
    const size_t row_bytes = (size_t)hp.vocab * sizeof(float);
    float *all = malloc(R * row_bytes), *one = malloc(row_bytes);
    int32_t picked[MAX_ROWS];
    if (b && greedy && all && one) {
        bn_batch_rows rows = {.tokens = tok, .pos = pos, .seq = seq, .n_rows = R,
                              .tables = tables, .table_len = table_len, .block_size = 1,
                              .logit_rows = logit_rows, .n_logits = R};
        CHECK(bn_cpu_backend_forward_rows(b, &rows, all, &err) == BN_OK);
        CHECK(bn_cpu_backend_forward_rows_greedy(b, &rows, picked, &err) == BN_OK);
        int differ = 0, wrong = 0;
        for (int s = 0; s < R; s++) {
            rows.logit_rows = &logit_rows[s];
            rows.n_logits = 1;
            CHECK(bn_cpu_backend_forward_rows(b, &rows, one, &err) == BN_OK);
            differ += memcmp(one, all + (size_t)s * hp.vocab, row_bytes) != 0;
            wrong += picked[s] != bn_sampler_sample(greedy, all + (size_t)s * hp.vocab, NULL, 0);
        }
        CHECK_MSG(differ == 0, "round %d (%d rows, dim %d): %d rows' logits differ from alone",
                  round, R, hp.dim, differ);
        CHECK_MSG(wrong == 0, "round %d (%d rows): %d greedy picks differ", round, R, wrong);
    }
    free(all);
    free(one);
    bn_sampler_free(greedy);
    bn_cpu_backend_free(b);
    bn_checkpoint_free(m);
}

int main(void)
{
    test_seed_init();
    for (int round = 0; round < 12; round++)
        test_backend(round);
    for (int round = 0; round < 8; round++)
        test_rows_head(round);
    TEST_EXIT();
}
