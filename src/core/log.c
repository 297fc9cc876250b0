/* The library's only way to print: leveled messages on stderr. */
#include "bitnet.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

/* Warn by default: errors the caller handles are its business to print. */
static _Atomic int current_level = BN_LOG_WARN;

static bool valid_level(bn_log_level level)
{
    return (int)level >= BN_LOG_ERROR && (int)level <= BN_LOG_DEBUG;
}

/* An invalid level is ignored, so the current one is always a valid index. */
void bn_log_set_level(bn_log_level level)
{
    if (valid_level(level))
        atomic_store(&current_level, (int)level);
}

bn_log_level bn_log_get_level(void) { return (bn_log_level)atomic_load(&current_level); }

void bn_log(bn_log_level level, const char *fmt, ...)
{
    static const char *const tags[] = {"error", "warn", "info", "debug"};
    if (!valid_level(level) || !fmt || (int)level > atomic_load(&current_level))
        return;
    /* One fprintf per line so concurrent messages do not interleave. */
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    fprintf(stderr, "bitnet: %s: %s\n", tags[level], line);
}
