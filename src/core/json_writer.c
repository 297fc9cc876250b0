#include "bitnet.h"

#include <inttypes.h>
#include <math.h>

void bn_json_init(bn_json *j, FILE *out)
{
    j->out = out;
    j->depth = 0;
    j->has_items[0] = false;
    j->after_key = false;
}

static void indent(bn_json *j)
{
    fputc('\n', j->out);
    for (int i = 0; i < j->depth; i++)
        fputs("  ", j->out);
}

/* Separator and indentation before any value or key. */
static void before_value(bn_json *j)
{
    if (j->after_key) {
        j->after_key = false;
        return;
    }
    if (j->depth > 0) {
        if (j->has_items[j->depth])
            fputc(',', j->out);
        indent(j);
    }
    j->has_items[j->depth] = true;
}

static void open_scope(bn_json *j, char c)
{
    before_value(j);
    fputc(c, j->out);
    if (j->depth + 1 < BN_JSON_MAX_DEPTH)
        j->depth++;
    j->has_items[j->depth] = false;
}

static void close_scope(bn_json *j, char c)
{
    bool had = j->has_items[j->depth];
    if (j->depth > 0)
        j->depth--;
    if (had)
        indent(j);
    fputc(c, j->out);
    if (j->depth == 0)
        fputc('\n', j->out);
}

void bn_json_begin_object(bn_json *j) { open_scope(j, '{'); }
void bn_json_end_object(bn_json *j) { close_scope(j, '}'); }
void bn_json_begin_array(bn_json *j) { open_scope(j, '['); }
void bn_json_end_array(bn_json *j) { close_scope(j, ']'); }

static void write_escaped(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\r': fputs("\\r", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (*p < 0x20)
                fprintf(out, "\\u%04x", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

void bn_json_key(bn_json *j, const char *key)
{
    before_value(j);
    write_escaped(j->out, key);
    fputs(": ", j->out);
    j->after_key = true;
}

void bn_json_string(bn_json *j, const char *s)
{
    before_value(j);
    write_escaped(j->out, s);
}

void bn_json_int(bn_json *j, int64_t v)
{
    before_value(j);
    fprintf(j->out, "%" PRId64, v);
}

void bn_json_uint(bn_json *j, uint64_t v)
{
    before_value(j);
    fprintf(j->out, "%" PRIu64, v);
}

void bn_json_double(bn_json *j, double v)
{
    before_value(j);
    if (isfinite(v))
        fprintf(j->out, "%.10g", v);
    else
        fputs("null", j->out);
}

void bn_json_bool(bn_json *j, bool v)
{
    before_value(j);
    fputs(v ? "true" : "false", j->out);
}

void bn_json_null(bn_json *j)
{
    before_value(j);
    fputs("null", j->out);
}

void bn_json_kv_string(bn_json *j, const char *key, const char *s)
{
    bn_json_key(j, key);
    bn_json_string(j, s);
}
void bn_json_kv_int(bn_json *j, const char *key, int64_t v)
{
    bn_json_key(j, key);
    bn_json_int(j, v);
}
void bn_json_kv_uint(bn_json *j, const char *key, uint64_t v)
{
    bn_json_key(j, key);
    bn_json_uint(j, v);
}
void bn_json_kv_double(bn_json *j, const char *key, double v)
{
    bn_json_key(j, key);
    bn_json_double(j, v);
}
void bn_json_kv_bool(bn_json *j, const char *key, bool v)
{
    bn_json_key(j, key);
    bn_json_bool(j, v);
}
