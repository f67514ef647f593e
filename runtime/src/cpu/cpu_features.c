/* The CPU probe (see cpu_features.h). */
#include "cpu_features.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#endif
#if defined(__aarch64__) && defined(__linux__)
#include <sys/auxv.h>
#endif

/* COLIBRI_CPU_SIMD caps the kernel level below what the CPU offers (to compare kernels on one
 * machine, or to match an older fleet's CPUs): scalar|avx2 on x86_64, neon|neon-dotprod on
 * aarch64; unset or unknown: no cap. */
__attribute__((unused)) static int simd_allowed(const char *level) {
#if defined(__aarch64__)
    static const char *const order[] = {"neon", "neon-dotprod", "neon-i8mm"};
#else
    static const char *const order[] = {"scalar", "avx2", "avx512"};
#endif
    const char *cap = getenv("COLIBRI_CPU_SIMD");
    int c = -1, l = -1;
    for (int i = 0; i < 3; i++) {
        if (cap && !strcmp(cap, order[i])) c = i;
        if (!strcmp(level, order[i])) l = i;
    }
    return c < 0 || l <= c;
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* CPUID (not __builtin_cpu_supports, which clang 14 lacks "f16c" for): AVX2, FMA and F16C, and
 * the OS saving the YMM state (OSXSAVE + XCR0 bits 1 and 2). */
static int cpu_has_avx2_fma_f16c(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    int fma = (c >> 12) & 1, osxsave = (c >> 27) & 1, avx = (c >> 28) & 1, f16c = (c >> 29) & 1;
    if (!(fma && osxsave && avx && f16c)) return 0;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 6) != 6) return 0;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    return (b >> 5) & 1;
}

/* AVX-512 F/VL/BW/DQ (and VNNI for the integer kernels) with the OS saving the opmask and the
 * upper ZMM state (XCR0 bits 5-7), on top of the AVX2 requirements. */
static int cpu_has_avx512(int *vnni) {
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return 0;
    int f = (b >> 16) & 1, dq = (b >> 17) & 1, bw = (b >> 30) & 1, vl = (b >> 31) & 1;
    *vnni = (c >> 11) & 1;
    unsigned lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return f && dq && bw && vl && (lo & 0xe6) == 0xe6;
}

int colibri_x86_features(void) {
    int f = 0, vnni = 0;
    if (!cpu_has_avx2_fma_f16c() || !simd_allowed("avx2")) return 0;
    f |= COLIBRI_X86_AVX2;
    if (cpu_has_avx512(&vnni) && simd_allowed("avx512")) {
        f |= COLIBRI_X86_AVX512;
        if (vnni) f |= COLIBRI_X86_VNNI;
    }
    return f;
}
#endif

#if defined(__aarch64__)
/* The aarch64 features the kernels use beyond base NEON, less those COLIBRI_CPU_SIMD caps away.
 * Linux reports the CPU's ID registers as HWCAP bits (qemu-user: the emulated CPU's); elsewhere,
 * what -mcpu promised. bf16 (BFDOT/BFMMLA) is not used: see docs/runtime.md "Kernels". */
int colibri_arm_features(void) {
    int f = 0;
#if defined(__linux__)
    unsigned long h = getauxval(AT_HWCAP), h2 = getauxval(AT_HWCAP2);
    if (h & (1UL << 20)) f |= COLIBRI_ARM_DOTPROD; /* HWCAP_ASIMDDP */
    if (h2 & (1UL << 13)) f |= COLIBRI_ARM_I8MM;   /* HWCAP2_I8MM */
#else
#ifdef __ARM_FEATURE_DOTPROD
    f |= COLIBRI_ARM_DOTPROD;
#endif
#ifdef __ARM_FEATURE_MATMUL_INT8
    f |= COLIBRI_ARM_I8MM;
#endif
#endif
    if (!simd_allowed("neon-i8mm")) f &= ~COLIBRI_ARM_I8MM;
    if (!simd_allowed("neon-dotprod")) f = 0;
    return f;
}
#endif
