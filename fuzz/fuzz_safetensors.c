/*
 * fuzz_safetensors.c - the safetensors reader (src/model/safetensors.c) on
 * arbitrary bytes.
 *
 * The reader only opens paths (it maps the file), so the input goes into a
 * memfd opened as /proc/self/fd/N. A mapping rounds up to whole pages, so
 * a read just past the end of the file is not caught here; the header
 * itself is copied to an exact-size heap buffer before cJSON parses it,
 * and that copy is checked byte for byte. When the file is accepted,
 * every tensor is used as a caller would: name, dtype, shape, its data
 * read in full, found again by name; and the "__metadata__" lookup.
 *
 * Seeds: fuzz/corpus/safetensors (tests/data/hf: the valid small files and
 * every malformed case).
 */
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"
#include "safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[64];
    int fd = fuzz_memfile(data, size, path, sizeof path);
    bn_safetensors *st = NULL;
    bn_error err;
    bn_error_clear(&err);
    bn_status s = bn_safetensors_open(path, &st, &err);
    close(fd); /* the reader keeps its own mapping */
    fuzz_check_error(s, &err);
    if (s != BN_OK)
        return 0;

    for (size_t i = 0; i < bn_safetensors_count(st); i++) {
        const bn_st_tensor *t = bn_safetensors_at(st, i);
        fuzz_touch(t->name, strlen(t->name));
        if ((unsigned)t->dtype >= BN_ST_DTYPE_COUNT || t->n_dims < 0 || t->n_dims > BN_ST_MAX_DIMS)
            fuzz_die("tensor with an impossible dtype or rank", t->name);
        (void)bn_st_dtype_name(t->dtype);
        /* bytes must be what the shape says: callers size buffers from it */
        uint64_t elems = 1;
        for (int d = 0; d < t->n_dims; d++)
            elems *= (uint64_t)t->shape[d]; /* the reader refused overflow */
        if (elems * bn_st_dtype_size(t->dtype) != t->bytes)
            fuzz_die("tensor bytes differ from its shape", t->name);
        if (t->bytes)
            fuzz_touch(t->data, (size_t)t->bytes);
        if (bn_safetensors_find(st, t->name) != t)
            fuzz_die("bn_safetensors_find misses a tensor the file has", t->name);
    }
    const char *format = bn_safetensors_metadata(st, "format");
    if (format)
        fuzz_touch(format, strlen(format));
    bn_safetensors_close(st);
    return 0;
}
