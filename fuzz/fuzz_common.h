/*
 * fuzz_common.h - helpers shared by the libFuzzer targets in fuzz/.
 *
 * Every target treats its input as an untrusted file and checks only that
 * the library never crashes, leaks or hits undefined behaviour on it
 * (AddressSanitizer, LeakSanitizer and UBSan report those); a rejected
 * input is a normal outcome. See docs/TESTING.md, "Sanitizers and fuzzing".
 */
#ifndef BN_FUZZ_COMMON_H
#define BN_FUZZ_COMMON_H

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "bitnet.h"

/* Compiled in by fuzz/CMakeLists.txt; BN_FUZZ_DATA overrides it, so a
 * fuzzer binary still finds its fixed inputs when the tree moves. */
#ifndef BN_FUZZ_DATA_DIR
#define BN_FUZZ_DATA_DIR "tests/data"
#endif

/* A setup failure (a fixture missing, no memfd) means the target would
 * test nothing: say so and stop rather than report a clean run. */
static inline void fuzz_die(const char *what, const char *detail)
{
    fprintf(stderr, "fuzz: %s: %s\n", what, detail ? detail : "");
    abort();
}

/* path (of size cap) = the test data folder joined with rel. */
static inline void fuzz_data_path(char *path, size_t cap, const char *rel)
{
    const char *dir = getenv("BN_FUZZ_DATA");
    if (!dir || !*dir)
        dir = BN_FUZZ_DATA_DIR;
    if ((size_t)snprintf(path, cap, "%s/%s", dir, rel) >= cap)
        fuzz_die("path too long", rel);
}

/* Puts data in an anonymous in-memory file, so that readers which take a
 * path (safetensors, config.json, tokenizer.json, the model loader) read
 * the fuzz input without touching the disk and without temp files left
 * behind by a crash. path (of size cap) receives "/proc/self/fd/N", which
 * open(), stat() and fopen() all accept. Returns the descriptor; the
 * caller closes it. */
static inline int fuzz_memfile(const uint8_t *data, size_t size, char *path, size_t cap)
{
    int fd = memfd_create("bitnet-fuzz", MFD_CLOEXEC);
    if (fd < 0)
        fuzz_die("memfd_create", strerror(errno));
    for (size_t done = 0; done < size;) {
        ssize_t n = write(fd, data + done, size - done);
        if (n <= 0)
            fuzz_die("write to memfd", strerror(errno));
        done += (size_t)n;
    }
    snprintf(path, cap, "/proc/self/fd/%d", fd);
    return fd;
}

/* Reads every byte of buf, so that AddressSanitizer checks that a pointer
 * the library handed out really covers `size` bytes; the sum keeps the
 * reads from being optimised away. */
static inline unsigned fuzz_touch(const void *buf, size_t size)
{
    const volatile unsigned char *p = buf;
    unsigned sum = 0;
    for (size_t i = 0; i < size; i++)
        sum += p[i];
    return sum;
}

/* A library error must leave a terminated, non-empty message behind. */
static inline void fuzz_check_error(bn_status st, const bn_error *err)
{
    if (st == BN_OK)
        return;
    if (!memchr(err->message, '\0', sizeof err->message) ||
        !memchr(err->hint, '\0', sizeof err->hint))
        fuzz_die("error record not terminated", bn_status_str(st));
    if (err->message[0] == '\0')
        fuzz_die("error without a message", bn_status_str(st));
}

#endif
