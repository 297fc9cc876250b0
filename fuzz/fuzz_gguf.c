/*
 * fuzz_gguf.c - the GGUF reader (src/model/gguf.c) on arbitrary bytes.
 *
 * The input is parsed in place with bn_gguf_open_memory: libFuzzer hands
 * each input over in a heap buffer of exactly its size, so AddressSanitizer
 * sees a read even one byte past the end (a file mapping's last page would
 * hide it). When the file is accepted, everything the reader hands out is
 * used the way callers use it: every key through every typed getter, array
 * elements at both ends and one past the end, every tensor's data read in
 * full, lookups by name; and a tokenizer is built from tokenizer.ggml.*
 * metadata when there is any (bn_tokenizer_from_gguf), and run on a short
 * text.
 *
 * Seeds: fuzz/corpus/gguf (tests/data/gguf and the tokenizer GGUFs).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_common.h"
#include "gguf.h"
#include "tokenizer.h"

/* In gguf.c, not in gguf.h (tests and fuzzers use it): parses an image in
 * memory that must outlive the bn_gguf. */
bn_status bn_gguf_open_memory(const void *data, uint64_t size, const char *name, bn_gguf **out,
                              bn_error *err);

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    bn_log_set_level(BN_LOG_ERROR); /* rejected files are normal here */
    return 0;
}

/* Array elements through the accessor that matches the element type, at
 * the first and last index and one past the end (which must be refused). */
static void use_array(const bn_gguf_kv *kv)
{
    bn_error err;
    const uint64_t idx[3] = {0, kv->count ? kv->count - 1 : 0, kv->count};
    for (int j = 0; j < 3; j++) {
        bn_gguf_str s;
        int64_t i64;
        float f;
        bn_error_clear(&err);
        if (bn_gguf_array_str(kv, idx[j], &s, &err) == BN_OK)
            fuzz_touch(s.ptr, (size_t)s.len);
        bn_error_clear(&err);
        bn_gguf_array_i64(kv, idx[j], &i64, &err);
        bn_error_clear(&err);
        bn_gguf_array_f32(kv, idx[j], &f, &err);
    }
    /* Every string of a string array, as the tokenizer reads vocabularies. */
    if (kv->elem_type == BN_GGUF_STRING)
        for (uint64_t i = 0; i < kv->count; i++) {
            bn_gguf_str s;
            bn_error_clear(&err);
            if (bn_gguf_array_str(kv, i, &s, &err) == BN_OK)
                fuzz_touch(s.ptr, (size_t)s.len);
        }
}

/* Every typed getter on one key (most must refuse the type politely). */
static void use_key(const bn_gguf *g, const bn_gguf_kv *kv)
{
    fuzz_touch(kv->key.ptr, (size_t)kv->key.len);
    char key[256];
    if (kv->key.len >= sizeof key || memchr(kv->key.ptr, '\0', (size_t)kv->key.len))
        return; /* cannot be named as a C string */
    memcpy(key, kv->key.ptr, (size_t)kv->key.len);
    key[kv->key.len] = '\0';
    if (bn_gguf_find(g, key) == NULL)
        fuzz_die("bn_gguf_find misses a key the file has", key);

    bn_error err;
    uint32_t u32;
    int64_t i64;
    float f;
    bool b;
    bn_gguf_str s;
    bn_error_clear(&err);
    bn_gguf_get_u32(g, key, &u32, &err);
    bn_error_clear(&err);
    bn_gguf_get_i64(g, key, &i64, &err);
    bn_error_clear(&err);
    bn_gguf_get_f32(g, key, &f, &err);
    bn_error_clear(&err);
    bn_gguf_get_bool(g, key, &b, &err);
    bn_error_clear(&err);
    if (bn_gguf_get_str(g, key, &s, &err) == BN_OK)
        fuzz_touch(s.ptr, (size_t)s.len);
    if (kv->type == BN_GGUF_ARRAY)
        use_array(kv);
}

/* The tokenizer from the file's metadata, on a text with a special token,
 * multi-byte characters and spaces; then decoded back. */
static void use_tokenizer(const bn_gguf *g)
{
    if (!bn_gguf_find(g, "tokenizer.ggml.model"))
        return;
    bn_tokenizer *t = NULL;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_tokenizer_from_gguf(g, &t, &err);
    fuzz_check_error(st, &err);
    if (st != BN_OK)
        return;
    static const char text[] = "<|begin_of_text|>Hello  w\xC3\xB6rld\n\t 12345 <s>\xE2\x96\x81x";
    int32_t *ids = NULL;
    size_t n = 0;
    bn_error_clear(&err);
    if (bn_tokenize(t, text, sizeof text - 1, true, true, &ids, &n, &err) == BN_OK) {
        char *back = NULL;
        bn_error_clear(&err);
        if (bn_detokenize(t, ids, n, &back, &err) == BN_OK)
            free(back);
    }
    free(ids);
    const int32_t specials[] = {bn_tokenizer_bos(t), bn_tokenizer_eos(t), bn_tokenizer_eot(t),
                                bn_tokenizer_vocab_size(t) - 1};
    for (size_t i = 0; i < sizeof specials / sizeof specials[0]; i++) {
        char buf[64];
        bn_token_to_bytes(t, specials[i], buf, sizeof buf);
        bn_tokenizer_is_eog(t, specials[i]);
    }
    bn_tokenizer_free(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    bn_gguf *g = NULL;
    bn_error err;
    bn_error_clear(&err);
    bn_status st = bn_gguf_open_memory(data, size, "fuzz.gguf", &g, &err);
    fuzz_check_error(st, &err);
    if (st != BN_OK)
        return 0;

    (void)bn_gguf_version(g);
    (void)bn_gguf_alignment(g);
    for (uint64_t i = 0; i < bn_gguf_kv_count(g); i++)
        use_key(g, bn_gguf_kv_at(g, i));
    for (uint64_t i = 0; i < bn_gguf_tensor_count(g); i++) {
        const bn_gguf_tensor *t = bn_gguf_tensor_at(g, i);
        if (!memchr(t->name, '\0', sizeof t->name))
            fuzz_die("tensor name not terminated", NULL);
        if (t->bytes)
            fuzz_touch(t->data, (size_t)t->bytes);
        if (bn_gguf_tensor_by_name(g, t->name) == NULL)
            fuzz_die("bn_gguf_tensor_by_name misses a tensor the file has", t->name);
    }
    use_tokenizer(g);
    bn_gguf_close(g);
    return 0;
}
