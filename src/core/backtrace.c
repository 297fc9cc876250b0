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
    const int room = (int)(sizeof frames / sizeof frames[0]);
    /* skip is clamped before any sum, so a huge one cannot overflow. */
    if (skip < 0)
        skip = 0;
    if (skip > room)
        skip = room;
    int want = BN_BACKTRACE_MAX + 1 + skip;
    if (want > room)
        want = room;
    int n = backtrace(frames, want);
    int first = 1 + skip; /* drop this function too */
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
    /* depth is clamped to [0, BN_BACKTRACE_MAX], never trusted. */
    int depth = bt ? bt->depth : 0;
    if (depth < 0)
        depth = 0;
    if (depth > BN_BACKTRACE_MAX)
        depth = BN_BACKTRACE_MAX;
#ifndef BN_HAVE_BACKTRACE
    depth = 0; /* this build cannot name frames */
#endif
    if (depth == 0) {
        snprintf(buf, size, "  (no backtrace: build with -DCMAKE_BUILD_TYPE=Debug)\n");
        return;
    }
#ifdef BN_HAVE_BACKTRACE
    char **syms = backtrace_symbols(bt->frames, depth);
    size_t used = 0;
    for (int i = 0; i < depth && used < size; i++) {
        int w = snprintf(buf + used, size - used, "  #%d %s\n", i,
                         syms ? syms[i] : "?");
        if (w < 0)
            break;
        used += (size_t)w;
    }
    free(syms);
#endif
}
