/* The public calls on model files, on the fixtures of tests/data:
 * bn_inspect (each kind of file, text and JSON, refusals, a stream that
 * cannot be written), bn_convert_hf_to_gguf (reports, progress, refusals,
 * the temporary file removed from a handler's call) and the converted file
 * inspected and opened by bn_model_open. Argument checks are in
 * test_public_api.c; the CLI's use of them in test_cli_model.sh, where the
 * reports' every field is checked. Usage: test_model_files DATA_DIR */
#include <dirent.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bitnet.h"
#include "test_util.h"

static char data_dir[1024];
static char tmp_dir[64];

static void data_path(char *buf, size_t size, const char *rel)
{
    snprintf(buf, size, "%s/%s", data_dir, rel);
}

static void tmp_path(char *buf, size_t size, const char *name)
{
    snprintf(buf, size, "%s/%s", tmp_dir, name);
}

static uint64_t file_size(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 ? (uint64_t)sb.st_size : 0;
}

/* Entries of the scratch directory ("." and ".." left out). */
static int tmp_entries(void)
{
    DIR *d = opendir(tmp_dir);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));)
        n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
    if (d)
        closedir(d);
    return n;
}

/* ---- inspect -------------------------------------------------------------------- */

/* bn_inspect's report on path, malloc'd (NULL when empty); its status in
 * *st and error in *e. */
static char *inspect(const char *path, bool json, bn_status *st, bn_error *e)
{
    FILE *f = tmpfile();
    CHECK(f != NULL);
    if (!f)
        return NULL;
    const bn_inspect_options o = {.json = json};
    bn_error_clear(e);
    *st = bn_inspect(path, &o, f, e);
    const long n = ftell(f);
    char *text = n > 0 ? malloc((size_t)n + 1) : NULL;
    if (text) {
        rewind(f);
        text[fread(text, 1, (size_t)n, f)] = '\0';
    }
    fclose(f);
    return text;
}

static void check_report(const char *rel, bool json, const char *const *expected)
{
    char path[1100];
    data_path(path, sizeof path, rel);
    bn_status st;
    bn_error e;
    char *text = inspect(path, json, &st, &e);
    CHECK_MSG(st == BN_OK && text, "%s: %s", rel, e.message);
    CHECK(!text || strncmp(text, json ? "{\n" : path, json ? 2 : strlen(path)) == 0);
    for (const char *const *x = expected; text && *x; x++)
        CHECK_MSG(strstr(text, *x) != NULL, "%s%s: no '%s' in the report", rel,
                  json ? " (json)" : "", *x);
    free(text);
}

static void test_inspect(void)
{
    check_report("models/i2s.gguf", false,
                 (const char *const[]){"GGUF version 3", "general.architecture",
                                       "\"bitnet-25\"", "token_embd.weight",
                                       "runnable      yes", "byte-level BPE", NULL});
    check_report("models/tq1_0.gguf", true,
                 (const char *const[]){"\"format\": \"gguf\"", "\"metadata\": {",
                                       "\"type\": \"tq1_0\"", "\"runnable\": true", NULL});
    check_report("models/hf_packed", false,
                 (const char *const[]){"Hugging Face directory", "hidden_size",
                                       "model.layers.0.self_attn.q_proj.weight",
                                       "runnable      yes", NULL});
    check_report("models/hf_bf16", true,
                 (const char *const[]){"\"format\": \"huggingface\"",
                                       "\"quant_method\": \"bitnet\"", "\"runnable\": true",
                                       NULL});
    check_report("models/hf_packed/model.safetensors", false,
                 (const char *const[]){"format        safetensors",
                                       "runnable      no: a lone .safetensors file", NULL});
    /* A GGUF bitnet cannot run: reported, not an error. */
    check_report("gguf/fixture.gguf", true,
                 (const char *const[]){"\"runnable\": false", "\"reason\": ", NULL});

    /* Refusals write nothing. */
    char path[1100];
    bn_status st;
    bn_error e;
    tmp_path(path, sizeof path, "missing.gguf");
    char *text = inspect(path, false, &st, &e);
    CHECK(st == BN_ERR_IO && text == NULL);
    CHECK_STR_CONTAINS(e.message, "no such file or directory");
    free(text);
    data_path(path, sizeof path, "models/hf_packed/config.json");
    text = inspect(path, true, &st, &e);
    CHECK(st == BN_ERR_FORMAT && text == NULL && e.message[0] != '\0');
    free(text);
    text = inspect(tmp_dir, false, &st, &e); /* a directory without config.json */
    CHECK(st != BN_OK && text == NULL);
    CHECK_STR_CONTAINS(e.message, "config.json");
    free(text);

    /* A stream that cannot be written. */
    FILE *ro = fopen("/dev/null", "r");
    CHECK(ro != NULL);
    if (ro) {
        data_path(path, sizeof path, "models/i2s.gguf");
        CHECK(bn_inspect(path, NULL, ro, &e) == BN_ERR_IO);
        CHECK_STR_CONTAINS(e.message, "cannot write the report");
        fclose(ro);
    }
}

/* ---- convert -------------------------------------------------------------------- */

typedef struct progress_log {
    int packing_calls, writing_calls;
    bool in_order;          /* packing, then writing, never back     */
    bool bounded;           /* done <= total, done never goes back   */
    uint64_t last_done, packing_total, writing_total, packing_done, writing_done;
    bool remove_while_writing;
} progress_log;

static void on_progress(void *user, const char *stage, uint64_t done, uint64_t total)
{
    progress_log *p = user;
    const bool writing = strcmp(stage, "writing") == 0;
    if (!writing && strcmp(stage, "packing") != 0)
        p->in_order = false;
    if (writing && p->writing_calls == 0)
        p->last_done = 0;
    if (!writing && p->writing_calls > 0)
        p->in_order = false;
    if (done > total || done < p->last_done)
        p->bounded = false;
    p->last_done = done;
    if (writing) {
        p->writing_calls++;
        p->writing_total = total;
        p->writing_done = done;
        if (p->remove_while_writing)
            bn_convert_remove_temp_files();
    } else {
        p->packing_calls++;
        p->packing_total = total;
        p->packing_done = done;
    }
}

static void test_convert(void)
{
    char hf[1100], out[128];
    data_path(hf, sizeof hf, "models/hf_packed");
    tmp_path(out, sizeof out, "packed-i2_s.gguf");

    bn_convert_options o;
    bn_convert_options_default(&o);
    progress_log log = {.in_order = true, .bounded = true};
    o.progress = on_progress;
    o.user = &log;
    bn_convert_report r;
    bn_error e;
    bn_error_clear(&e);
    CHECK_MSG(bn_convert_hf_to_gguf(hf, out, &o, &r, &e) == BN_OK, "%s", e.message);
    CHECK(strcmp(r.architecture, "bitnet-25") == 0);
    CHECK(r.n_tensors > 0 && r.n_ternary > 0 && r.n_f16_fallback == 0);
    CHECK(r.file_bytes > 0 && r.file_bytes == file_size(out));
    CHECK(log.in_order && log.bounded);
    CHECK(log.packing_calls > 0 && log.packing_done == log.packing_total);
    CHECK(log.writing_calls > 0 && log.writing_done == log.writing_total);
    CHECK(log.writing_total == r.file_bytes);
    CHECK(tmp_entries() == 1); /* the output, no temporary file left */
    bn_status st;
    char *text = inspect(out, true, &st, &e);
    CHECK(st == BN_OK && text && strstr(text, "\"general.architecture\": \"bitnet-25\""));
    CHECK(text && strstr(text, "\"type\": \"i2_s\"") && strstr(text, "\"runnable\": true"));
    free(text);

    /* The file opens as a model with the source's shape. */
    bn_model_options mo;
    bn_model_options_default(&mo);
    mo.path = out;
    mo.device = "cpu";
    mo.n_threads = 1;
    bn_model *m = NULL;
    CHECK_MSG(bn_model_open(&mo, &m, &e) == BN_OK, "%s", e.message);
    bn_model_info info;
    if (m && bn_model_get_info(m, &info, &e) == BN_OK)
        CHECK(info.n_layer > 0 && r.n_ternary == 7 * info.n_layer && info.has_tokenizer);
    bn_model_close(m);
    unlink(out);

    /* bf16 master weights whose rows of 64 do not fit TQ2_0's blocks of
     * 256: those projections are written as F16. No progress asked for. */
    data_path(hf, sizeof hf, "models/hf_bf16");
    tmp_path(out, sizeof out, "bf16-tq2_0.gguf");
    bn_convert_options_default(&o);
    o.type = BN_CONVERT_TQ2_0;
    CHECK_MSG(bn_convert_hf_to_gguf(hf, out, &o, &r, &e) == BN_OK, "%s", e.message);
    CHECK(strcmp(r.architecture, "bitnet") == 0 && r.n_f16_fallback > 0);
    CHECK(r.file_bytes == file_size(out));
    unlink(out);
}

static void test_convert_refusals(void)
{
    char hf[1100], path[1100], out[128];
    data_path(hf, sizeof hf, "models/hf_packed");
    tmp_path(out, sizeof out, "x.gguf");
    bn_error e;
    bn_convert_report r;

    tmp_path(path, sizeof path, "missing");
    CHECK(bn_convert_hf_to_gguf(path, out, NULL, &r, &e) == BN_ERR_IO);
    CHECK_STR_CONTAINS(e.message, "cannot open");
    data_path(path, sizeof path, "models/hf_packed/config.json");
    CHECK(bn_convert_hf_to_gguf(path, out, NULL, &r, &e) == BN_ERR_INVALID_ARGUMENT);
    CHECK_STR_CONTAINS(e.message, "not a directory");
    /* An output that is a directory is refused before any work. */
    CHECK(bn_convert_hf_to_gguf(hf, tmp_dir, NULL, &r, &e) == BN_ERR_IO);
    CHECK(r.n_tensors == 0 && r.file_bytes == 0);
    /* A directory that is not a model. */
    CHECK(bn_convert_hf_to_gguf(tmp_dir, out, NULL, &r, &e) != BN_OK);
    CHECK(e.message[0] != '\0');
    CHECK(tmp_entries() == 0);
}

/* A signal handler's call while the file is being written removes the
 * temporary file: the conversion fails and leaves nothing behind. */
static void test_convert_remove_temp_files(void)
{
    char hf[1100], out[128];
    data_path(hf, sizeof hf, "models/hf_packed");
    tmp_path(out, sizeof out, "interrupted.gguf");
    bn_convert_options o;
    bn_convert_options_default(&o);
    progress_log log = {.in_order = true, .bounded = true, .remove_while_writing = true};
    o.progress = on_progress;
    o.user = &log;
    bn_error e;
    CHECK(bn_convert_hf_to_gguf(hf, out, &o, NULL, &e) == BN_ERR_IO);
    CHECK(log.writing_calls > 0);
    CHECK(access(out, F_OK) != 0);
    CHECK(tmp_entries() == 0);
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: test_model_files DATA_DIR\n");
        return 2;
    }
    snprintf(data_dir, sizeof data_dir, "%s", argv[1]);
    snprintf(tmp_dir, sizeof tmp_dir, "/tmp/bn_test_model_files_XXXXXX");
    if (!mkdtemp(tmp_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_inspect();
    test_convert();
    test_convert_refusals();
    test_convert_remove_temp_files();
    rmdir(tmp_dir);
    TEST_EXIT();
}
