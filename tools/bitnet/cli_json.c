/* JSON output of the CLI (devices --json, perplexity --json): a streaming
 * writer that places commas, indents two spaces per level and escapes
 * strings; the caller only nests. The CLI is a program on the public API,
 * and bitnet.h offers no JSON writer: this is the CLI's own. */
#include <inttypes.h>
#include <math.h>

#include "cli.h"

void cli_json_init(cli_json *j, FILE *out)
{
    j->out = out;
    j->depth = 0;
    j->has_items[0] = false;
    j->after_key = false;
}

static void indent(cli_json *j)
{
    fputc('\n', j->out);
    for (int i = 0; i < j->depth; i++)
        fputs("  ", j->out);
}

/* Separator and indentation before any value or key. */
static void before_value(cli_json *j)
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

static void open_scope(cli_json *j, char c)
{
    before_value(j);
    fputc(c, j->out);
    if (j->depth + 1 < CLI_JSON_MAX_DEPTH)
        j->depth++;
    j->has_items[j->depth] = false;
}

static void close_scope(cli_json *j, char c)
{
    const bool had = j->has_items[j->depth];
    if (j->depth > 0)
        j->depth--;
    if (had)
        indent(j);
    fputc(c, j->out);
    if (j->depth == 0)
        fputc('\n', j->out);
}

void cli_json_begin_object(cli_json *j) { open_scope(j, '{'); }
void cli_json_end_object(cli_json *j) { close_scope(j, '}'); }
void cli_json_begin_array(cli_json *j) { open_scope(j, '['); }
void cli_json_end_array(cli_json *j) { close_scope(j, ']'); }

/* A JSON string: quotes, backslashes and control characters escaped;
 * other bytes (UTF-8 included) as they are. */
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

void cli_json_key(cli_json *j, const char *key)
{
    before_value(j);
    write_escaped(j->out, key);
    fputs(": ", j->out);
    j->after_key = true;
}

void cli_json_string(cli_json *j, const char *s)
{
    before_value(j);
    write_escaped(j->out, s);
}

void cli_json_int(cli_json *j, int64_t v)
{
    before_value(j);
    fprintf(j->out, "%" PRId64, v);
}

void cli_json_uint(cli_json *j, uint64_t v)
{
    before_value(j);
    fprintf(j->out, "%" PRIu64, v);
}

void cli_json_double(cli_json *j, double v)
{
    before_value(j);
    if (isfinite(v))
        fprintf(j->out, "%.10g", v);
    else
        fputs("null", j->out);
}

void cli_json_bool(cli_json *j, bool v)
{
    before_value(j);
    fputs(v ? "true" : "false", j->out);
}

void cli_json_kv_string(cli_json *j, const char *key, const char *s)
{
    cli_json_key(j, key);
    cli_json_string(j, s);
}

void cli_json_kv_int(cli_json *j, const char *key, int64_t v)
{
    cli_json_key(j, key);
    cli_json_int(j, v);
}

void cli_json_kv_uint(cli_json *j, const char *key, uint64_t v)
{
    cli_json_key(j, key);
    cli_json_uint(j, v);
}

void cli_json_kv_double(cli_json *j, const char *key, double v)
{
    cli_json_key(j, key);
    cli_json_double(j, v);
}

void cli_json_kv_bool(cli_json *j, const char *key, bool v)
{
    cli_json_key(j, key);
    cli_json_bool(j, v);
}
