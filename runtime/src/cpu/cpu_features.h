/* What SIMD this CPU offers the kernels, probed once per process (CPUID/XGETBV on x86_64, the
 * Linux HWCAPs on aarch64), less what COLIBRI_CPU_SIMD caps away. The one probe both kernel files
 * (kernels.c and kernels_q4.c) use, so they always agree on the level. */
#ifndef COLIBRI_CPU_FEATURES_H
#define COLIBRI_CPU_FEATURES_H

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
/* AVX2 = AVX2+FMA+F16C with the OS saving YMM; AVX512 = F/VL/BW/DQ with the OS saving ZMM and
 * opmask state; VNNI = AVX512-VNNI on top of AVX512. */
enum { COLIBRI_X86_AVX2 = 1, COLIBRI_X86_AVX512 = 2, COLIBRI_X86_VNNI = 4 };
int colibri_x86_features(void);
#endif

#if defined(__aarch64__)
/* The SDOT (dotprod) and SMMLA (i8mm) kernels are compiled with a per-function target attribute
 * and chosen at run time (getauxval), so one binary uses what the CPU has: an Orin build
 * (-mcpu=cortex-a78ae) gets SMMLA on a Thor, a generic build gets SDOT on an Orin. That needs a
 * compiler whose arm_neon.h declares the intrinsics for such functions (clang >= 16, gcc >= 10;
 * zig 0.17 is clang 22); an older one gets them only when -mcpu already enables the feature. */
#if defined(__clang__)
#if __clang_major__ >= 16
#define COLIBRI_ARM_TARGET_ATTR 1
#endif
#elif defined(__GNUC__) && __GNUC__ >= 10
#define COLIBRI_ARM_TARGET_ATTR 1
#endif
#ifdef COLIBRI_ARM_TARGET_ATTR
#define SDOT_FN __attribute__((target("+dotprod")))
#define I8MM_FN __attribute__((target("+i8mm")))
#else /* used only where -mcpu enables the feature */
#define SDOT_FN
#define I8MM_FN
#endif

/* aarch64 features of this CPU (Linux HWCAPs; elsewhere the build's -mcpu), as flags: */
enum { COLIBRI_ARM_DOTPROD = 1, COLIBRI_ARM_I8MM = 2 };
int colibri_arm_features(void);
#endif

#endif
