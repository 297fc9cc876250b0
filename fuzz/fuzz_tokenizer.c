/*
 * fuzz_tokenizer.c - encoding and decoding arbitrary text and ids with
 * fixed tokenizers (src/model/tokenizer*.c).
 *
 * Loaded once, from tests/data/tokenizer: bpe.json (byte-level BPE through
 * the tokenizer.json reader, with the LLaMA-3 regex in PCRE2) and spm.gguf
 * (SentencePiece-style BPE with byte fallback, through the GGUF reader).
 * The first input byte picks the tokenizer and the add_bos / parse_special
 * flags; the rest is the text. Each input is
 *   - encoded, and the ids decoded back; without BOS and without special
 *     token parsing decode(encode(x)) == x must hold (tokenizer.h promises
 *     it for SPM, U+2581 in the text aside; byte-level BPE maps every
 *     byte, so it holds there too);
 *   - decoded through the streaming decoder, first into a buffer too small
 *     for most pieces (which must consume nothing) and then into one that
 *     fits;
 *   - read as a sequence of token ids, some out of range, and decoded.
 *
 * Seeds: fuzz/corpus/tokenizer (lines of tests/data/tokenizer/corpus.txt
 * and the reference strings, each behind a flags byte).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "gguf.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

enum { N_TOK = 2 };
/* Kept for the whole run (still reachable, so not a leak). */
static bn_tokenizer *tokenizers[N_TOK];
static bn_gguf *spm_file;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    bn_log_set_level(BN_LOG_ERROR);
    char path[4096];
    bn_error err;
    bn_error_clear(&err);
    fuzz_data_path(path, sizeof path, "tokenizer/bpe.json");
    if (bn_tokenizer_from_hf_json(path, &tokenizers[0], &err) != BN_OK)
        fuzz_die(path, err.message);
    fuzz_data_path(path, sizeof path, "tokenizer/spm.gguf");
    if (bn_gguf_open(path, &spm_file, &err) != BN_OK ||
        bn_tokenizer_from_gguf(spm_file, &tokenizers[1], &err) != BN_OK)
        fuzz_die(path, err.message);
    return 0;
}

/* Streams ids through the decoder: each push first into a 2-byte buffer,
 * which most pieces do not fit (then nothing may be consumed and the
 * length needed is returned), then into a buffer of that length. */
static void stream_decode(const bn_tokenizer *t, const int32_t *ids, size_t n)
{
    bn_detok_stream s;
    bn_detok_stream_init(&s, t);
    for (size_t i = 0; i < n; i++) {
        char small[2];
        size_t need = bn_detok_stream_push(&s, ids[i], small, sizeof small);
        if (need < sizeof small)
            continue;
        char *out = malloc(need + 1);
        if (!out)
            fuzz_die("out of memory", NULL);
        size_t got = bn_detok_stream_push(&s, ids[i], out, need + 1);
        if (got != need)
            fuzz_die("bn_detok_stream_push: length differs between measuring and writing", NULL);
        free(out);
    }
    char tail[8];
    bn_detok_stream_flush(&s, tail, sizeof tail);
}

/* The input bytes read as ids, two bytes each, spread over -1 .. vocab so
 * that both invalid ends come up. */
static void decode_raw_ids(const bn_tokenizer *t, const uint8_t *p, size_t n)
{
    const int32_t vocab = bn_tokenizer_vocab_size(t);
    size_t count = n / 2;
    if (count == 0)
        return;
    int32_t *ids = malloc(count * sizeof *ids);
    if (!ids)
        fuzz_die("out of memory", NULL);
    for (size_t i = 0; i < count; i++)
        ids[i] = (int32_t)((p[2 * i] | (unsigned)p[2 * i + 1] << 8) % (unsigned)(vocab + 2)) - 1;
    char *text = NULL;
    bn_error err;
    bn_error_clear(&err);
    if (bn_detokenize(t, ids, count, &text, &err) == BN_OK)
        free(text);
    stream_decode(t, ids, count);
    for (size_t i = 0; i < count; i++) {
        char buf[16];
        bn_token_to_bytes(t, ids[i], buf, sizeof buf);
    }
    free(ids);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    const unsigned flags = data[0];
    const bn_tokenizer *t = tokenizers[flags % N_TOK];
    const bool add_bos = flags & 2, parse_special = flags & 4;
    /* An exact-size copy: AddressSanitizer then flags any read past the
     * text, which the tokenizer gets as (pointer, length), not a C string. */
    const size_t len = size - 1;
    char *text = malloc(len ? len : 1);
    if (!text)
        fuzz_die("out of memory", NULL);
    memcpy(text, data + 1, len);

    int32_t *ids = NULL;
    size_t n = 0;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_tokenize(t, text, len, add_bos, parse_special, &ids, &n, &err);
    fuzz_check_error(st, &err);
    if (st == BN_OK) {
        char *back = NULL;
        bn_error_clear(&err);
        st = bn_detokenize(t, ids, n, &back, &err);
        if (st != BN_OK)
            fuzz_die("bn_detokenize refused what bn_tokenize produced", err.message);
        /* Not checked: texts with a NUL (it ends the decoded C string
         * early), and for SPM texts holding U+2581 itself, which
         * SentencePiece reads as its space marker and decodes to ' ' (as
         * the sentencepiece library does). */
        const bool spm = bn_tokenizer_kind_of(t) == BN_TOKENIZER_SPM_BPE;
        if (!add_bos && !parse_special && !memchr(text, '\0', len) &&
            !(spm && memmem(text, len, "\xE2\x96\x81", 3)) &&
            (strlen(back) != len || memcmp(back, text, len) != 0))
            fuzz_die("decode(encode(text)) differs from text", spm ? "spm.gguf" : "bpe.json");
        free(back);
        stream_decode(t, ids, n);
    }
    free(ids);
    decode_raw_ids(t, data + 1, len);
    free(text);
    return 0;
}
