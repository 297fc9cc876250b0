/* Stack capture for debug builds: the memory pool records where a leaked
 * buffer came from. Release builds record nothing and cost nothing. */
#include "bitnet.h"

#include <stdio.h>
#include <string.h>

#if defined(BITNET_DEBUG) && defined(__GLIBC__)
#include <execinfo.h>
#include <stdlib.h>
#define BN_HAVE_BACKTRACE 1
#endif

void bn_backtrace_capture(bn_backtrace *bt, int skip)
{
    if (!bt)
        return;
    bt->depth = 0;
#ifdef BN_HAVE_BACKTRACE
    void *frames[BN_BACKTRACE_MAX + 8];
    int want = BN_BACKTRACE_MAX + 1 + (skip > 0 ? skip : 0);
    if (want > (int)(sizeof frames / sizeof frames[0]))
        want = (int)(sizeof frames / sizeof frames[0]);
    int n = backtrace(frames, want);
    int first = 1 + (skip > 0 ? skip : 0); /* drop this function too */
    for (int i = first; i < n && bt->depth < BN_BACKTRACE_MAX; i++)
        bt->frames[bt->depth++] = frames[i];
#else
    (void)skip;
#endif
}

void bn_backtrace_format(const bn_backtrace *bt, char *buf, size_t size)
{
    if (!buf || size == 0)
        return;
    buf[0] = '\0';
    if (!bt || bt->depth == 0) {
        snprintf(buf, size, "  (no backtrace: build with -DCMAKE_BUILD_TYPE=Debug)\n");
        return;
    }
#ifdef BN_HAVE_BACKTRACE
    char **syms = backtrace_symbols(bt->frames, bt->depth);
    size_t used = 0;
    for (int i = 0; i < bt->depth && used < size; i++) {
        int w = snprintf(buf + used, size - used, "  #%d %s\n", i,
                         syms ? syms[i] : "?");
        if (w < 0)
            break;
        used += (size_t)w;
    }
    free(syms);
#endif
}
