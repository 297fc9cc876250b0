/*
 * json_writer.h - streaming JSON output with correct string escaping, for
 * `bitnet devices --json`, run receipts and the server's responses.
 *
 *     bn_json j; bn_json_init(&j, stdout);
 *     bn_json_begin_object(&j);
 *       bn_json_key(&j, "name"); bn_json_string(&j, "H100");
 *     bn_json_end_object(&j);
 *
 * Commas and indentation are handled here; the caller only nests.
 */
#ifndef BN_JSON_WRITER_H
#define BN_JSON_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#define BN_JSON_MAX_DEPTH 32

typedef struct bn_json {
    FILE *out;
    int depth;
    bool has_items[BN_JSON_MAX_DEPTH]; /* does this level already hold a value? */
    bool after_key;                    /* the next value follows a key */
} bn_json;

void bn_json_init(bn_json *j, FILE *out);
void bn_json_begin_object(bn_json *j);
void bn_json_end_object(bn_json *j);
void bn_json_begin_array(bn_json *j);
void bn_json_end_array(bn_json *j);
void bn_json_key(bn_json *j, const char *key);
void bn_json_string(bn_json *j, const char *s);
void bn_json_int(bn_json *j, int64_t v);
void bn_json_uint(bn_json *j, uint64_t v);
void bn_json_double(bn_json *j, double v); /* NaN and inf become null */
void bn_json_bool(bn_json *j, bool v);
void bn_json_null(bn_json *j);

/* Shorthands for "key": value inside an object. */
void bn_json_kv_string(bn_json *j, const char *key, const char *s);
void bn_json_kv_int(bn_json *j, const char *key, int64_t v);
void bn_json_kv_uint(bn_json *j, const char *key, uint64_t v);
void bn_json_kv_double(bn_json *j, const char *key, double v);
void bn_json_kv_bool(bn_json *j, const char *key, bool v);

#endif
