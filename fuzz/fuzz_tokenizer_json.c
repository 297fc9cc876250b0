/*
 * fuzz_tokenizer_json.c - the tokenizer.json reader
 * (bn_tokenizer_from_hf_json in src/model/tokenizer_json.c) on arbitrary
 * bytes.
 *
 * The reader takes a path, so the input goes into a memfd opened as
 * /proc/self/fd/N (its folder, /proc/self/fd, holds no
 * tokenizer_config.json, so only the input is read). When a tokenizer is
 * built from it, it encodes and decodes a short text with special tokens,
 * multi-byte characters and invalid UTF-8, and every token of its
 * vocabulary is decoded (as the streaming decoder and bn_token_to_bytes
 * hand them out).
 *
 * Seeds: fuzz/corpus/tokenizer_json (tests/data/tokenizer/bpe*.json cut
 * down to a few hundred merges, and small hand-written variants).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "tokenizer.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    bn_log_set_level(BN_LOG_ERROR);
    return 0;
}

static void use_tokenizer(const bn_tokenizer *t)
{
    static const char text[] = "<|begin_of_text|>Hi  there\n\n\t1234 <|tool|> w\xC3\xB6rld "
                               "\xE2\x96\x81\xF0\x9F\x98\x80 \xFF\xC3 end<|eot_id|>";
    bn_error err;
    for (int parse_special = 0; parse_special < 2; parse_special++) {
        int32_t *ids = NULL;
        size_t n = 0;
        bn_error_clear(&err);
        bn_status st = bn_tokenize(t, text, sizeof text - 1, true, parse_special, &ids, &n, &err);
        fuzz_check_error(st, &err);
        if (st == BN_OK) {
            char *back = NULL;
            bn_error_clear(&err);
            if (bn_detokenize(t, ids, n, &back, &err) != BN_OK)
                fuzz_die("bn_detokenize refused what bn_tokenize produced", err.message);
            free(back);
        }
        free(ids);
    }
    /* The first pieces of the vocabulary and the last ones, and one id
     * past each end (ids may be sparse, so the vocabulary can be large). */
    bn_detok_stream s;
    bn_detok_stream_init(&s, t);
    const int32_t vocab = bn_tokenizer_vocab_size(t);
    for (int32_t id = -1; id <= vocab; id++) {
        if (id == 4096 && vocab - 4096 > id)
            id = vocab - 4096;
        char buf[256];
        int n = bn_token_to_bytes(t, id, buf, sizeof buf);
        if ((id < 0 || id >= vocab) != (n < 0))
            fuzz_die("bn_token_to_bytes: validity of an id is wrong", NULL);
        bn_detok_stream_push(&s, id, buf, sizeof buf);
        bn_tokenizer_is_eog(t, id);
    }
    char tail[8];
    bn_detok_stream_flush(&s, tail, sizeof tail);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    bn_tokenizer *t = NULL;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_tokenizer_from_hf_json(path, &t, &err);
    close(fd);
    fuzz_check_error(st, &err);
    if (st != BN_OK)
        return 0;
    use_tokenizer(t);
    bn_tokenizer_free(t);
    return 0;
}
