/*
 * cpu_features.c - which SIMD paths this CPU can run, detected at run time
 * so that one binary picks the best kernels on any machine.
 *
 * x86: a feature needs both the cpuid bit and the OS saving the registers
 * (xgetbv: XMM|YMM for AVX2, plus opmask|ZMM for AVX-512).
 * aarch64: ASIMD (NEON) is architectural; SDOT/UDOT comes from hwcaps.
 */
#include "bitnet.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define BN_X86 1
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

static bn_cpu_features features;
static pthread_once_t features_once = PTHREAD_ONCE_INIT;

#ifdef BN_X86
static unsigned long long read_xcr0(void)
{
    unsigned eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

static void detect_x86(bn_cpu_features *f)
{
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d))
        return;
    bool osxsave = (c >> 27) & 1;
    bool avx = (c >> 28) & 1;
    f->fma = (c >> 12) & 1;
    f->f16c = (c >> 29) & 1;
    unsigned long long xcr0 = osxsave ? read_xcr0() : 0;
    bool os_ymm = (xcr0 & 0x6) == 0x6;    /* XMM and YMM state          */
    bool os_zmm = (xcr0 & 0xe6) == 0xe6;  /* plus opmask, ZMM_Hi256, Hi16 */
    if (!avx || !os_ymm) {
        f->fma = f->f16c = false;
        return;
    }
    unsigned max_leaf = __get_cpuid_max(0, NULL);
    if (max_leaf < 7)
        return;
    __cpuid_count(7, 0, a, b, c, d);
    f->avx2 = (b >> 5) & 1;
    if (os_zmm) {
        f->avx512f = (b >> 16) & 1;
        f->avx512bw = (b >> 30) & 1;
        f->avx512vl = (b >> 31) & 1;
        f->avx512vnni = (c >> 11) & 1;
    }
    __cpuid_count(7, 1, a, b, c, d);
    f->avxvnni = (a >> 4) & 1;

    /* Brand string from leaves 0x80000002..4. */
    unsigned brand[12];
    if (__get_cpuid_max(0x80000000u, NULL) >= 0x80000004u) {
        for (unsigned i = 0; i < 3; i++)
            __get_cpuid(0x80000002u + i, &brand[4 * i], &brand[4 * i + 1], &brand[4 * i + 2],
                        &brand[4 * i + 3]);
        char text[49];
        memcpy(text, brand, 48);
        text[48] = '\0';
        const char *s = text;
        while (*s == ' ')
            s++;
        snprintf(f->model, sizeof f->model, "%s", s);
    }
}
#endif

static void detect(void)
{
    bn_cpu_features *f = &features;
    memset(f, 0, sizeof *f);
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    f->logical_cores = n > 0 ? (int)n : 1;
#if defined(__x86_64__)
    snprintf(f->arch, sizeof f->arch, "x86_64");
#elif defined(__aarch64__)
    snprintf(f->arch, sizeof f->arch, "aarch64");
#elif defined(__i386__)
    snprintf(f->arch, sizeof f->arch, "x86");
#else
    snprintf(f->arch, sizeof f->arch, "other");
#endif
#ifdef BN_X86
    detect_x86(f);
#endif
#if defined(__aarch64__)
    f->neon = true;
#if defined(__linux__)
    unsigned long hw = getauxval(AT_HWCAP);
    f->dotprod = (hw >> 20) & 1; /* HWCAP_ASIMDDP */
#endif
#endif
}

const bn_cpu_features *bn_cpu_features_get(void)
{
    pthread_once(&features_once, detect);
    return &features;
}
