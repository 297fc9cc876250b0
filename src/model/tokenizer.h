/*
 * tokenizer.h - text <-> token ids.
 *
 * Two models:
 *   - byte-level BPE as GPT-2 / LLaMA-3 use it ("gpt2" in GGUF,
 *     "BPE" with a ByteLevel pre-tokenizer in tokenizer.json): the text is
 *     split by the pre-tokenizer regex (LLaMA-3's by default, compiled with
 *     PCRE2 and Unicode properties), each piece is mapped through GPT-2's
 *     byte-to-unicode table, and merges are applied by rank. As llama-bpe
 *     does ("ignore_merges"), a whole piece that is itself in the vocabulary
 *     is emitted directly.
 *   - SentencePiece-style BPE ("llama" in GGUF, older BitNet files): spaces
 *     become U+2581, pieces merge by score, unknown bytes fall back to
 *     <0xXX> tokens.
 * Special tokens (CONTROL / USER_DEFINED types, or tokenizer.json's
 * added_tokens) are matched verbatim in the input when parse_special is set.
 */
#ifndef BN_TOKENIZER_H
#define BN_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "bitnet.h"
#include "gguf.h"

typedef struct bn_tokenizer bn_tokenizer;

typedef enum bn_tokenizer_kind {
    BN_TOKENIZER_BYTE_BPE, /* GGUF "gpt2" */
    BN_TOKENIZER_SPM_BPE   /* GGUF "llama" */
} bn_tokenizer_kind;

/* From GGUF tokenizer.ggml.* metadata. */
bn_status bn_tokenizer_from_gguf(const bn_gguf *g, bn_tokenizer **out, bn_error *err);
/* From a Hugging Face tokenizer.json (model.vocab, model.merges,
 * added_tokens, pre_tokenizer). */
bn_status bn_tokenizer_from_hf_json(const char *path, bn_tokenizer **out, bn_error *err);
void bn_tokenizer_free(bn_tokenizer *t);

bn_tokenizer_kind bn_tokenizer_kind_of(const bn_tokenizer *t);
int32_t bn_tokenizer_vocab_size(const bn_tokenizer *t);
int32_t bn_tokenizer_bos(const bn_tokenizer *t); /* -1 when none */
int32_t bn_tokenizer_eos(const bn_tokenizer *t);
int32_t bn_tokenizer_eot(const bn_tokenizer *t);
bool bn_tokenizer_add_bos_default(const bn_tokenizer *t);
/* Byte-level BPE: the pre-tokenizer's split regex (PCRE2 syntax), and the
 * GGUF tokenizer.ggml.pre name whose readers split text with that same
 * regex: "llama-bpe" for LLaMA-3's, which bitnet, llama.cpp and
 * bitnet.cpp all read as LLaMA-3. NULL when no name stands for the regex
 * (GPT-2's, a custom Split): a GGUF file could not say how to split. Both
 * NULL for SentencePiece tokenizers. */
const char *bn_tokenizer_pre_regex(const bn_tokenizer *t);
const char *bn_tokenizer_pre_name(const bn_tokenizer *t);
/* Whether a whole pre-token found in the vocabulary is that token, without
 * merges (llama-bpe's ignore_merges; tokenizer.json's model.ignore_merges). */
bool bn_tokenizer_ignore_merges(const bn_tokenizer *t);
/* Token id of an exact token string (e.g. "<|eot_id|>"), or -1. */
int32_t bn_tokenizer_find(const bn_tokenizer *t, const char *text);
/* Whether generation should stop at this token (EOS, EOT, or any token the
 * metadata marks as end of generation). */
bool bn_tokenizer_is_eog(const bn_tokenizer *t, int32_t id);

/* Encodes text[0..len). *tokens is malloc'ed (caller frees). add_bos
 * prepends BOS when the vocabulary has one. parse_special matches CONTROL
 * tokens (e.g. "<|eot_id|>") in the text; USER_DEFINED ones are always
 * matched (Hugging Face's non-special added tokens). A byte-level
 * pre-tokenizer regex gets a work budget proportional to len: one that
 * backtracks catastrophically (a hostile tokenizer.json) exhausts it and
 * gives BN_ERR_FORMAT, in time proportional to len. */
bn_status bn_tokenize(const bn_tokenizer *t, const char *text, size_t len, bool add_bos,
                      bool parse_special, int32_t **tokens, size_t *n_tokens, bn_error *err);

/* The bytes of one token (special tokens as their text); returns the
 * number of bytes, or -1 for an invalid id. May be a partial UTF-8
 * sequence: bn_detok_stream reassembles those. Copies at most size bytes
 * (no NUL added) and still returns the token's full length. */
int bn_token_to_bytes(const bn_tokenizer *t, int32_t id, char *buf, size_t size);

/* Streaming decoder: push ids, get back only complete UTF-8 text. */
typedef struct bn_detok_stream {
    const bn_tokenizer *tok;
    char pending[8];
    int n_pending;
} bn_detok_stream;
void bn_detok_stream_init(bn_detok_stream *s, const bn_tokenizer *t);
/* Writes complete characters to out (NUL-terminated); returns its length.
 * Bytes that cannot form UTF-8 become U+FFFD. When the text does not fit
 * (length >= size), nothing is consumed and the length needed is returned:
 * call again with a larger buffer. Invalid ids give "". */
size_t bn_detok_stream_push(bn_detok_stream *s, int32_t id, char *out, size_t size);
/* Flushes what is left (as U+FFFD for incomplete sequences). */
size_t bn_detok_stream_flush(bn_detok_stream *s, char *out, size_t size);

/* Decodes a whole sequence into a malloc'ed NUL-terminated string: the
 * tokens' bytes as they are (special tokens as their text). For SPM, the
 * space of the dummy prefix (at the start and after each CONTROL token)
 * is dropped, so decode(encode(x)) == x; the streaming decoder keeps it. */
bn_status bn_detokenize(const bn_tokenizer *t, const int32_t *ids, size_t n, char **text,
                        bn_error *err);

/* A chat message's content as the chat formats take it: without the
 * leading and trailing whitespace (Unicode's, as Python's str.strip, which
 * the Hugging Face template applies). Returns the start, *len its length. */
const char *bn_chat_trim(const char *text, size_t *len);

#endif
