/* CPU dot-product kernels (see kernels.h). One implementation is chosen once per process:
 * AVX2+FMA+F16C when the x86_64 CPU has them (compiled with target attributes, so the host build
 * needs no -march flag), NEON on aarch64, portable scalar code otherwise. */
#include "kernels.h"
#include "cpu_features.h"
#include "kernels_q4.h"
#include "kernels_mxfp4.h"
#include "core/half.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define COLIBRI_HAVE_AVX2 1
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#define COLIBRI_HAVE_NEON 1
#include <arm_neon.h>
#if defined(__ARM_FEATURE_DOTPROD) || defined(COLIBRI_ARM_TARGET_ATTR)
#define COLIBRI_HAVE_SDOT 1
#endif
#if defined(__ARM_FEATURE_MATMUL_INT8) || defined(COLIBRI_ARM_TARGET_ATTR)
#define COLIBRI_HAVE_I8MM 1
#endif
#endif

/* Decode streams each weight row once: ask for the bytes 2 KiB ahead, which also carries the
 * stream across 4 KiB page boundaries where the hardware prefetchers stop (the weights live in
 * the page cache in 4 KiB pages). A prefetch never faults, so reading past a tensor is harmless. */
#ifndef PREFETCH_BYTES
#define PREFETCH_BYTES 2048
#endif

typedef float (*dot_fn)(const void *w, const float *x, size_t n);
typedef int32_t (*dot_q8_fn)(const int8_t *w, const int8_t *x, size_t n);
typedef void (*dot4_fn)(const void *const *w, const float *x, size_t n, float out[4]);
typedef void (*dot4_q8_fn)(const int8_t *const *w, const int8_t *x, size_t n, int32_t out[4]);

static struct {
    dot_fn dot[4]; /* indexed by dtype: f32, f16, bf16, int8 (int8: unscaled sum q * x) */
    dot4_fn dot4[4]; /* four rows at once, bits equal to dot[] per row; NULL: not provided */
    dot_q8_fn dot_q8;
    dot4_q8_fn dot4_q8; /* NULL: not provided */
    void (*convert)(const void *row, uint32_t dtype, size_t n, float *out);
    /* two f32 rows against three tokens at once, each (row, token) with exactly the lane layout
     * and reduction order of dot[F32] (so the bits match the one-token kernel) */
    void (*tile_2x3)(const float *w0, const float *w1, const float *x0, const float *x1,
                     const float *x2, size_t n, float out[6]);
    /* four rows (contiguous from w) against nt <= 6 tokens (x rows ldx apart): out[r * 6 + t],
     * each (row, token) with exactly dot[dtype]'s lane layout and order (prefill == decode bits);
     * NULL: not provided (prefill converts rows and uses tile_2x3) */
    void (*tile)(uint32_t dtype, const void *const *w, const float *x, size_t ldx, int nt,
                 size_t n, float out[24]);
    /* the int8 x int8 counterpart (integer sums: exact, so any layout gives the same result) */
    void (*tile_q8)(const int8_t *const *w, const int8_t *x, size_t ldx, int nt, size_t n,
                    int32_t out[24]);
    /* colibri_rows_dot_q8 for n > 1 (SMMLA): returns 0 for a shape it leaves to tile_q8;
     * NULL: not provided */
    int (*rows_q8)(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                   const float *xscale, int n, size_t ldx, float *y, size_t ldy);
    const char *name;
} K;

/* ---- conversions ---------------------------------------------------------------------------- */

static float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static void convert_row(const void *row, uint32_t dtype, size_t n, float *out) {
    size_t i;
    switch (dtype) {
    case COLIBRI_DT_F32: memcpy(out, row, n * sizeof(float)); break;
    case COLIBRI_DT_F16:
        for (i = 0; i < n; i++) out[i] = half_to_float(((const uint16_t *)row)[i]);
        break;
    case COLIBRI_DT_BF16:
        for (i = 0; i < n; i++) out[i] = bf16_to_float(((const uint16_t *)row)[i]);
        break;
    default:
        for (i = 0; i < n; i++) out[i] = (float)((const int8_t *)row)[i];
        break;
    }
}

/* ---- scalar: 8 accumulators, lane i % 8, reduced pairwise ----------------------------------- */

#define SCALAR_DOT(NAME, T, CVT)                                                              \
    static float NAME(const void *wv, const float *x, size_t n) {                             \
        const T *w = (const T *)wv;                                                           \
        float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                \
        size_t i = 0;                                                                         \
        for (; i + 8 <= n; i += 8)                                                            \
            for (int l = 0; l < 8; l++) a[l] += CVT(w[i + l]) * x[i + l];                     \
        float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));          \
        for (; i < n; i++) s += CVT(w[i]) * x[i];                                             \
        return s;                                                                             \
    }
#define CVT_F32(v) (v)
#define CVT_I8(v) ((float)(v))
SCALAR_DOT(scalar_dot_f32, float, CVT_F32)
SCALAR_DOT(scalar_dot_f16, uint16_t, half_to_float)
SCALAR_DOT(scalar_dot_bf16, uint16_t, bf16_to_float)
SCALAR_DOT(scalar_dot_i8, int8_t, CVT_I8)

static int32_t scalar_dot_q8(const int8_t *w, const int8_t *x, size_t n) {
    int32_t s = 0;
    for (size_t i = 0; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}

/* ---- AVX2 + FMA: 4 x 8 lanes over blocks of 32, then blocks of 8, then a scalar tail --------- */

#ifdef COLIBRI_HAVE_AVX2
#define AVX_LOAD_F32(p) _mm256_loadu_ps((const float *)(p))
#define AVX_LOAD_F16(p) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(p)))
#define AVX_LOAD_BF16(p)                                                                      \
    _mm256_castsi256_ps(_mm256_slli_epi32(                                                    \
        _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))), 16))
#define AVX_LOAD_I8(p)                                                                        \
    _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p))))

/* Lane layout shared by every AVX2 f32-accumulating kernel: two accumulators over blocks of 16
 * (offsets 0 and 8), then blocks of 8 into the first, then a0 + a1, a fixed horizontal sum, then
 * a scalar tail. The multi-row/multi-token kernels below keep exactly this per (row, token). */
#define AVX2_DOT(NAME, T, LOAD8, CVT)                                                         \
    __attribute__((target("avx2,fma,f16c"))) static float NAME(const void *wv, const float *x, \
                                                               size_t n) {                    \
        const T *w = (const T *)wv;                                                           \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0;                                             \
        size_t i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                        \
            __builtin_prefetch((const char *)(w + i) + PREFETCH_BYTES);                       \
            a0 = _mm256_fmadd_ps(LOAD8(w + i), _mm256_loadu_ps(x + i), a0);                   \
            a1 = _mm256_fmadd_ps(LOAD8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);           \
        }                                                                                     \
        for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(LOAD8(w + i), _mm256_loadu_ps(x + i), a0); \
        a0 = _mm256_add_ps(a0, a1);                                                           \
        float t[8];                                                                           \
        _mm256_storeu_ps(t, a0);                                                              \
        float s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));          \
        for (; i < n; i++) s += CVT(w[i]) * x[i];                                             \
        return s;                                                                             \
    }
AVX2_DOT(avx2_dot_f32, float, AVX_LOAD_F32, CVT_F32)
AVX2_DOT(avx2_dot_f16, uint16_t, AVX_LOAD_F16, half_to_float)
AVX2_DOT(avx2_dot_bf16, uint16_t, AVX_LOAD_BF16, bf16_to_float)
AVX2_DOT(avx2_dot_i8, int8_t, AVX_LOAD_I8, CVT_I8)


__attribute__((target("avx2,fma,f16c"))) static void avx2_convert(const void *row, uint32_t dtype,
                                                                   size_t n, float *out) {
    size_t i = 0;
    switch (dtype) {
    case COLIBRI_DT_F16:
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, AVX_LOAD_F16((const uint16_t *)row + i));
        break;
    case COLIBRI_DT_BF16:
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, AVX_LOAD_BF16((const uint16_t *)row + i));
        break;
    case COLIBRI_DT_INT8:
        for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, AVX_LOAD_I8((const int8_t *)row + i));
        break;
    default: break;
    }
    if (i < n) convert_row((const uint8_t *)row + i * colibri_dtype_size(dtype), dtype, n - i, out + i);
}

#define AVX2_HSUM(a, t, s)                                                                    \
    do {                                                                                      \
        _mm256_storeu_ps(t, a);                                                               \
        s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));               \
    } while (0)

/* Four rows (anywhere) against one token, each with exactly AVX2_DOT's operations and order (so
 * the bits equal four calls of it): decode runs four weight streams per thread, a quarter block
 * apart, which keeps more cache-line fetches in flight than one stream and shares the x loads
 * (measured in docs/runtime.md). */
#define AVX2_DOT4(NAME, T, LOAD8, CVT)                                                        \
    __attribute__((target("avx2,fma,f16c"))) static void NAME(                                \
        const void *const *wv, const float *x, size_t n, float out[4]) {                      \
        const T *w0 = (const T *)wv[0], *w1 = (const T *)wv[1], *w2 = (const T *)wv[2],       \
                *w3 = (const T *)wv[3];                                                       \
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, d0 = a0, \
               d1 = a0;                                                                       \
        size_t i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                        \
            __builtin_prefetch((const char *)(w0 + i) + PREFETCH_BYTES);                      \
            __builtin_prefetch((const char *)(w1 + i) + PREFETCH_BYTES);                      \
            __builtin_prefetch((const char *)(w2 + i) + PREFETCH_BYTES);                      \
            __builtin_prefetch((const char *)(w3 + i) + PREFETCH_BYTES);                      \
            __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);              \
            a0 = _mm256_fmadd_ps(LOAD8(w0 + i), x0, a0);                                      \
            b0 = _mm256_fmadd_ps(LOAD8(w1 + i), x0, b0);                                      \
            c0 = _mm256_fmadd_ps(LOAD8(w2 + i), x0, c0);                                      \
            d0 = _mm256_fmadd_ps(LOAD8(w3 + i), x0, d0);                                      \
            a1 = _mm256_fmadd_ps(LOAD8(w0 + i + 8), x1, a1);                                  \
            b1 = _mm256_fmadd_ps(LOAD8(w1 + i + 8), x1, b1);                                  \
            c1 = _mm256_fmadd_ps(LOAD8(w2 + i + 8), x1, c1);                                  \
            d1 = _mm256_fmadd_ps(LOAD8(w3 + i + 8), x1, d1);                                  \
        }                                                                                     \
        for (; i + 8 <= n; i += 8) {                                                          \
            __m256 x0 = _mm256_loadu_ps(x + i);                                               \
            a0 = _mm256_fmadd_ps(LOAD8(w0 + i), x0, a0);                                      \
            b0 = _mm256_fmadd_ps(LOAD8(w1 + i), x0, b0);                                      \
            c0 = _mm256_fmadd_ps(LOAD8(w2 + i), x0, c0);                                      \
            d0 = _mm256_fmadd_ps(LOAD8(w3 + i), x0, d0);                                      \
        }                                                                                     \
        float t[8], s[4];                                                                     \
        AVX2_HSUM(_mm256_add_ps(a0, a1), t, s[0]);                                            \
        AVX2_HSUM(_mm256_add_ps(b0, b1), t, s[1]);                                            \
        AVX2_HSUM(_mm256_add_ps(c0, c1), t, s[2]);                                            \
        AVX2_HSUM(_mm256_add_ps(d0, d1), t, s[3]);                                            \
        for (; i < n; i++) {                                                                  \
            s[0] += CVT(w0[i]) * x[i];                                                        \
            s[1] += CVT(w1[i]) * x[i];                                                        \
            s[2] += CVT(w2[i]) * x[i];                                                        \
            s[3] += CVT(w3[i]) * x[i];                                                        \
        }                                                                                     \
        memcpy(out, s, sizeof s);                                                             \
    }
AVX2_DOT4(avx2_dot4_f32, float, AVX_LOAD_F32, CVT_F32)
AVX2_DOT4(avx2_dot4_f16, uint16_t, AVX_LOAD_F16, half_to_float)
AVX2_DOT4(avx2_dot4_bf16, uint16_t, AVX_LOAD_BF16, bf16_to_float)
AVX2_DOT4(avx2_dot4_i8, int8_t, AVX_LOAD_I8, CVT_I8)

/* Two f32 rows against three tokens: out[r * 3 + j] = w_r . x_j with the one-token lane layout
 * (so the bits equal avx2_dot_f32's). 12 accumulators + 2 weight + 1 activation registers; five
 * loads per six FMAs instead of two per one. */
__attribute__((target("avx2,fma"))) static void avx2_tile_2x3(const float *w0, const float *w1,
                                                              const float *x0, const float *x1,
                                                              const float *x2, size_t n,
                                                              float out[6]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0;
    __m256 d0 = a0, d1 = a0, e0 = a0, e1 = a0, f0 = a0, f1 = a0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m256 wa = _mm256_loadu_ps(w0 + i), wb = _mm256_loadu_ps(w1 + i), x;
        x = _mm256_loadu_ps(x0 + i); a0 = _mm256_fmadd_ps(wa, x, a0); d0 = _mm256_fmadd_ps(wb, x, d0);
        x = _mm256_loadu_ps(x1 + i); b0 = _mm256_fmadd_ps(wa, x, b0); e0 = _mm256_fmadd_ps(wb, x, e0);
        x = _mm256_loadu_ps(x2 + i); c0 = _mm256_fmadd_ps(wa, x, c0); f0 = _mm256_fmadd_ps(wb, x, f0);
        wa = _mm256_loadu_ps(w0 + i + 8);
        wb = _mm256_loadu_ps(w1 + i + 8);
        x = _mm256_loadu_ps(x0 + i + 8); a1 = _mm256_fmadd_ps(wa, x, a1); d1 = _mm256_fmadd_ps(wb, x, d1);
        x = _mm256_loadu_ps(x1 + i + 8); b1 = _mm256_fmadd_ps(wa, x, b1); e1 = _mm256_fmadd_ps(wb, x, e1);
        x = _mm256_loadu_ps(x2 + i + 8); c1 = _mm256_fmadd_ps(wa, x, c1); f1 = _mm256_fmadd_ps(wb, x, f1);
    }
    for (; i + 8 <= n; i += 8) {
        __m256 wa = _mm256_loadu_ps(w0 + i), wb = _mm256_loadu_ps(w1 + i), x;
        x = _mm256_loadu_ps(x0 + i); a0 = _mm256_fmadd_ps(wa, x, a0); d0 = _mm256_fmadd_ps(wb, x, d0);
        x = _mm256_loadu_ps(x1 + i); b0 = _mm256_fmadd_ps(wa, x, b0); e0 = _mm256_fmadd_ps(wb, x, e0);
        x = _mm256_loadu_ps(x2 + i); c0 = _mm256_fmadd_ps(wa, x, c0); f0 = _mm256_fmadd_ps(wb, x, f0);
    }
    float t[8], s[6];
    AVX2_HSUM(_mm256_add_ps(a0, a1), t, s[0]);
    AVX2_HSUM(_mm256_add_ps(b0, b1), t, s[1]);
    AVX2_HSUM(_mm256_add_ps(c0, c1), t, s[2]);
    AVX2_HSUM(_mm256_add_ps(d0, d1), t, s[3]);
    AVX2_HSUM(_mm256_add_ps(e0, e1), t, s[4]);
    AVX2_HSUM(_mm256_add_ps(f0, f1), t, s[5]);
    for (; i < n; i++) {
        s[0] += w0[i] * x0[i];
        s[1] += w0[i] * x1[i];
        s[2] += w0[i] * x2[i];
        s[3] += w1[i] * x0[i];
        s[4] += w1[i] * x1[i];
        s[5] += w1[i] * x2[i];
    }
    memcpy(out, s, sizeof s);
}

/* int8 x int8 -> int32: |w| (unsigned) times x with w's sign, pairs summed to int16 by maddubs
 * (at most 2 * 128 * 127 < 32767, so no saturation), then to int32. Integer sums are exact. */
__attribute__((target("avx2"))) static int32_t avx2_dot_q8(const int8_t *w, const int8_t *x,
                                                           size_t n) {
    __m256i acc = _mm256_setzero_si256();
    const __m256i ones = _mm256_set1_epi16(1);
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i vw = _mm256_loadu_si256((const __m256i *)(const void *)(w + i));
        __m256i vx = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
        __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(vw), _mm256_sign_epi8(vx, vw));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
    }
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)(void *)t, acc);
    int32_t s = t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
    for (; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}

/* Four int8 rows against one int8 token (decode with --int8-act): four streams a quarter block
 * apart, as AVX2_DOT4. Integer sums are exact, so the result equals avx2_dot_q8's per row. */
__attribute__((target("avx2"))) static inline __m256i avx2_q8_step(const int8_t *w, __m256i vx,
                                                                     __m256i ones, __m256i acc) {
    __m256i vw = _mm256_loadu_si256((const __m256i *)(const void *)w);
    __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(vw), _mm256_sign_epi8(vx, vw));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
}

__attribute__((target("avx2"))) static void avx2_dot4_q8(const int8_t *const *w, const int8_t *x,
                                                         size_t n, int32_t out[4]) {
    /* named accumulators: with an array and a loop over the rows GCC kept them in memory (a
     * load and a store in every step); measured in docs/runtime.md */
    __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m256i vx = _mm256_loadu_si256((const __m256i *)(const void *)(x + i));
        __builtin_prefetch(w0 + i + PREFETCH_BYTES);
        __builtin_prefetch(w1 + i + PREFETCH_BYTES);
        __builtin_prefetch(w2 + i + PREFETCH_BYTES);
        __builtin_prefetch(w3 + i + PREFETCH_BYTES);
        a0 = avx2_q8_step(w0 + i, vx, ones, a0);
        a1 = avx2_q8_step(w1 + i, vx, ones, a1);
        a2 = avx2_q8_step(w2 + i, vx, ones, a2);
        a3 = avx2_q8_step(w3 + i, vx, ones, a3);
    }
    int32_t t[4][8];
    _mm256_storeu_si256((__m256i *)(void *)t[0], a0);
    _mm256_storeu_si256((__m256i *)(void *)t[1], a1);
    _mm256_storeu_si256((__m256i *)(void *)t[2], a2);
    _mm256_storeu_si256((__m256i *)(void *)t[3], a3);
    _mm256_zeroupper();
    for (int k = 0; k < 4; k++) {
        int32_t s = t[k][0] + t[k][1] + t[k][2] + t[k][3] + t[k][4] + t[k][5] + t[k][6] + t[k][7];
        for (size_t j = i; j < n; j++) s += (int32_t)w[k][j] * (int32_t)x[j];
        out[k] = s;
    }
}

/* Several int8 tokens against four int8 rows (prefill with --int8-act), two tokens per pass over
 * the rows: a row chunk is loaded and its |w| taken once for both tokens. Integer sums are
 * exact, so acc[k * 6 + t] equals avx2_dot_q8(w[k], x_t) whatever the grouping; the float
 * scaling after it is the caller's, the same for one token or many (prefill == decode). */
__attribute__((target("avx2"))) static inline void avx2_q8_pair(__m256i vw, __m256i x0, __m256i x1,
                                                                __m256i ones, __m256i *a0,
                                                                __m256i *a1) {
    __m256i aw = _mm256_abs_epi8(vw);
    *a0 = _mm256_add_epi32(*a0, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x0, vw)), ones));
    *a1 = _mm256_add_epi32(*a1, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(x1, vw)), ones));
}

__attribute__((target("avx2"))) static int32_t avx2_hsum_i32(__m256i a) {
    int32_t t[8];
    _mm256_storeu_si256((__m256i *)(void *)t, a);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}

__attribute__((target("avx2"))) static void avx2_q8_tile(const int8_t *const *w, const int8_t *x,
                                                         size_t ldx, int nt, size_t n,
                                                         int32_t acc[24]) {
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *w0 = w[0], *w1 = w[1], *w2 = w[2], *w3 = w[3];
    for (int t = 0; t < nt; t += 2) {
        const int8_t *xa = x + (size_t)t * ldx, *xb = t + 1 < nt ? xa + ldx : xa; /* odd: again */
        __m256i a0 = _mm256_setzero_si256(), b0 = a0, a1 = a0, b1 = a0, a2 = a0, b2 = a0, a3 = a0,
                b3 = a0;
        size_t i = 0;
        for (; i + 32 <= n; i += 32) {
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(xa + i));
            __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(xb + i));
            avx2_q8_pair(_mm256_loadu_si256((const __m256i *)(const void *)(w0 + i)), x0, x1, ones, &a0, &b0);
            avx2_q8_pair(_mm256_loadu_si256((const __m256i *)(const void *)(w1 + i)), x0, x1, ones, &a1, &b1);
            avx2_q8_pair(_mm256_loadu_si256((const __m256i *)(const void *)(w2 + i)), x0, x1, ones, &a2, &b2);
            avx2_q8_pair(_mm256_loadu_si256((const __m256i *)(const void *)(w3 + i)), x0, x1, ones, &a3, &b3);
        }
        int32_t s[8] = {avx2_hsum_i32(a0), avx2_hsum_i32(a1), avx2_hsum_i32(a2), avx2_hsum_i32(a3),
                        avx2_hsum_i32(b0), avx2_hsum_i32(b1), avx2_hsum_i32(b2), avx2_hsum_i32(b3)};
        for (int k = 0; k < 4; k++)
            for (size_t j = i; j < n; j++) {
                s[k] += (int32_t)w[k][j] * (int32_t)xa[j];
                s[4 + k] += (int32_t)w[k][j] * (int32_t)xb[j];
            }
        for (int k = 0; k < 4; k++) {
            acc[k * 6 + t] = s[k];
            if (t + 1 < nt) acc[k * 6 + t + 1] = s[4 + k];
        }
    }
    _mm256_zeroupper();
}
#endif

/* ---- AVX-512: the AVX2 lane layout in 16-lane registers ------------------------------------ */

#ifdef COLIBRI_HAVE_AVX2
/* Why the same bits as AVX2: AVX2_DOT's a0 holds lanes 0-7 of every block of 16 and a1 lanes
 * 8-15; one 16-lane accumulator over the same blocks holds a0 in its low half and a1 in its high
 * half, lane for lane, with the same fused multiply-adds. The last block of 8 goes into the low
 * half, then low + high, the same horizontal sum and the same scalar tail. So an AVX-512 machine
 * and an AVX2 machine give identical logits; the gain is half the instructions per weight and
 * 32 registers, which is what lets prefill run 4-row x 6-token tiles (24 accumulators). */
#define AVX512_TARGET "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma,f16c"
#define Z_LOAD_F32(p) _mm512_loadu_ps((const float *)(p))
#define Z_LOAD_F16(p) _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p)))
#define Z_LOAD_BF16(p)                                                                        \
    _mm512_castsi512_ps(_mm512_slli_epi32(                                                    \
        _mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)(const void *)(p))), 16))
#define Z_LOAD_I8(p)                                                                          \
    _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(p))))
#define Z_TILE_MAX 6 /* tokens per tile: 4 x 6 accumulators + 4 weight + 1 activation registers */

/* Four adjacent rows against NT tokens (prefill). Each row is loaded (and converted) once per
 * block of 16 and used for NT tokens: weights read once per 6 tokens, no f32 copy of the row. */
#define Z_TILE(NAME, T, LOAD16, LOAD8, CVT, NT)                                               \
    __attribute__((target(AVX512_TARGET))) static void NAME(                                  \
        const void *const *wv, const float *x, size_t ldx, size_t n, float *out) {            \
        const T *w[4] = {(const T *)wv[0], (const T *)wv[1], (const T *)wv[2],                \
                         (const T *)wv[3]};                                                   \
        __m512 acc[4][NT];                                                                    \
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {                                \
            acc[0][t] = _mm512_setzero_ps();                                                  \
            acc[1][t] = acc[0][t];                                                            \
            acc[2][t] = acc[0][t];                                                            \
            acc[3][t] = acc[0][t];                                                            \
        }                                                                                     \
        size_t i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                        \
            __builtin_prefetch((const char *)(w[0] + i) + PREFETCH_BYTES);                    \
            __builtin_prefetch((const char *)(w[1] + i) + PREFETCH_BYTES);                    \
            __builtin_prefetch((const char *)(w[2] + i) + PREFETCH_BYTES);                    \
            __builtin_prefetch((const char *)(w[3] + i) + PREFETCH_BYTES);                    \
            __m512 wa = LOAD16(w[0] + i), wb = LOAD16(w[1] + i), wc = LOAD16(w[2] + i),       \
                   wd = LOAD16(w[3] + i);                                                     \
            _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {                            \
                __m512 xv = _mm512_loadu_ps(x + (size_t)t * ldx + i);                         \
                acc[0][t] = _mm512_fmadd_ps(wa, xv, acc[0][t]);                               \
                acc[1][t] = _mm512_fmadd_ps(wb, xv, acc[1][t]);                               \
                acc[2][t] = _mm512_fmadd_ps(wc, xv, acc[2][t]);                               \
                acc[3][t] = _mm512_fmadd_ps(wd, xv, acc[3][t]);                               \
            }                                                                                 \
        }                                                                                     \
        for (int r = 0; r < 4; r++)                                                           \
            for (int t = 0; t < NT; t++) {                                                    \
                const float *xt = x + (size_t)t * ldx;                                        \
                __m256 lo = _mm512_castps512_ps256(acc[r][t]);                                \
                __m256 hi = _mm512_extractf32x8_ps(acc[r][t], 1);                             \
                size_t k = i;                                                                 \
                if (k + 8 <= n) {                                                             \
                    lo = _mm256_fmadd_ps(LOAD8(w[r] + k), _mm256_loadu_ps(xt + k), lo);       \
                    k += 8;                                                                   \
                }                                                                             \
                float tv[8], s;                                                               \
                AVX2_HSUM(_mm256_add_ps(lo, hi), tv, s);                                      \
                for (; k < n; k++) s += CVT(w[r][k]) * xt[k];                                 \
                out[r * Z_TILE_MAX + t] = s;                                                  \
            }                                                                                 \
    }
#define Z_TILES(P, T, LOAD16, LOAD8, CVT)                                                     \
    Z_TILE(P##_1, T, LOAD16, LOAD8, CVT, 1)                                                   \
    Z_TILE(P##_2, T, LOAD16, LOAD8, CVT, 2)                                                   \
    Z_TILE(P##_3, T, LOAD16, LOAD8, CVT, 3)                                                   \
    Z_TILE(P##_4, T, LOAD16, LOAD8, CVT, 4)                                                   \
    Z_TILE(P##_5, T, LOAD16, LOAD8, CVT, 5)                                                   \
    Z_TILE(P##_6, T, LOAD16, LOAD8, CVT, 6)                                                   \
    static void P(const void *const *w, const float *x, size_t ldx, int nt, size_t n,         \
                  float *out) {                                                               \
        switch (nt) {                                                                         \
        case 1: P##_1(w, x, ldx, n, out); break;                                              \
        case 2: P##_2(w, x, ldx, n, out); break;                                              \
        case 3: P##_3(w, x, ldx, n, out); break;                                              \
        case 4: P##_4(w, x, ldx, n, out); break;                                              \
        case 5: P##_5(w, x, ldx, n, out); break;                                              \
        default: P##_6(w, x, ldx, n, out); break;                                             \
        }                                                                                     \
    }
Z_TILES(z_tile_f32, float, Z_LOAD_F32, AVX_LOAD_F32, CVT_F32)
Z_TILES(z_tile_f16, uint16_t, Z_LOAD_F16, AVX_LOAD_F16, half_to_float)
Z_TILES(z_tile_bf16, uint16_t, Z_LOAD_BF16, AVX_LOAD_BF16, bf16_to_float)
Z_TILES(z_tile_i8, int8_t, Z_LOAD_I8, AVX_LOAD_I8, CVT_I8)

static void z_tile(uint32_t dtype, const void *const *w, const float *x, size_t ldx, int nt,
                   size_t n, float out[24]) {
    switch (dtype) {
    case COLIBRI_DT_F32: z_tile_f32(w, x, ldx, nt, n, out); break;
    case COLIBRI_DT_F16: z_tile_f16(w, x, ldx, nt, n, out); break;
    case COLIBRI_DT_BF16: z_tile_bf16(w, x, ldx, nt, n, out); break;
    default: z_tile_i8(w, x, ldx, nt, n, out); break;
    }
}

/* int8 x int8 with AVX512-VNNI vpdpbusd (unsigned x signed bytes, four products per int32 lane,
 * no intermediate saturation): x ^ 0x80 is x + 128 as an unsigned byte, so
 * dpbusd(x ^ 0x80, w) = x . w + 128 * sum(w), and the second term comes from dpbusd(0x80, w).
 * All sums are exact integers (|lane| < 2^31 for rows up to 2^16 columns), so the result equals
 * the AVX2 and scalar integer dots bit for bit. */
#define VNNI_TARGET "avx512f,avx512vl,avx512bw,avx512vnni"
#define Z_Q8_TILE(NAME, NT)                                                                   \
    __attribute__((target(VNNI_TARGET))) static void NAME(                                    \
        const int8_t *const *w, const int8_t *x, size_t ldx, size_t n, int32_t *out) {        \
        const __m512i bias = _mm512_set1_epi8((char)0x80);                                    \
        __m512i acc[4][NT], corr[4];                                                          \
        for (int r = 0; r < 4; r++) corr[r] = _mm512_setzero_si512();                        \
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {                                \
            acc[0][t] = _mm512_setzero_si512();                                               \
            acc[1][t] = acc[0][t];                                                            \
            acc[2][t] = acc[0][t];                                                            \
            acc[3][t] = acc[0][t];                                                            \
        }                                                                                     \
        size_t i = 0;                                                                         \
        for (; i + 64 <= n; i += 64) {                                                        \
            __m512i wv[4];                                                                    \
            for (int r = 0; r < 4; r++) {                                                     \
                __builtin_prefetch(w[r] + i + PREFETCH_BYTES);                                \
                wv[r] = _mm512_loadu_si512((const void *)(w[r] + i));                         \
                if (NT < 5) corr[r] = _mm512_dpbusd_epi32(corr[r], bias, wv[r]);              \
            }                                                                                 \
            _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {                            \
                __m512i xv = _mm512_xor_si512(                                                \
                    _mm512_loadu_si512((const void *)(x + (size_t)t * ldx + i)), bias);       \
                acc[0][t] = _mm512_dpbusd_epi32(acc[0][t], xv, wv[0]);                        \
                acc[1][t] = _mm512_dpbusd_epi32(acc[1][t], xv, wv[1]);                        \
                acc[2][t] = _mm512_dpbusd_epi32(acc[2][t], xv, wv[2]);                        \
                acc[3][t] = _mm512_dpbusd_epi32(acc[3][t], xv, wv[3]);                        \
            }                                                                                 \
        }                                                                                     \
        if (NT >= 5) /* out of registers in the main loop: the weight sums in a second pass */ \
            for (size_t j = 0; j + 64 <= n; j += 64)                                          \
                for (int r = 0; r < 4; r++)                                                   \
                    corr[r] = _mm512_dpbusd_epi32(                                            \
                        corr[r], bias, _mm512_loadu_si512((const void *)(w[r] + j)));         \
        for (int r = 0; r < 4; r++) {                                                         \
            int32_t c = _mm512_reduce_add_epi32(corr[r]);                                     \
            for (int t = 0; t < NT; t++) {                                                    \
                const int8_t *xt = x + (size_t)t * ldx;                                       \
                int32_t s = _mm512_reduce_add_epi32(acc[r][t]) - c;                           \
                for (size_t k = i; k < n; k++) s += (int32_t)w[r][k] * (int32_t)xt[k];        \
                out[r * Z_TILE_MAX + t] = s;                                                  \
            }                                                                                 \
        }                                                                                     \
    }
Z_Q8_TILE(z_q8_tile_1, 1)
Z_Q8_TILE(z_q8_tile_2, 2)
Z_Q8_TILE(z_q8_tile_3, 3)
Z_Q8_TILE(z_q8_tile_4, 4)
Z_Q8_TILE(z_q8_tile_5, 5)
Z_Q8_TILE(z_q8_tile_6, 6)

static void z_q8_tile(const int8_t *const *w, const int8_t *x, size_t ldx, int nt, size_t n,
                      int32_t out[24]) {
    switch (nt) {
    case 1: z_q8_tile_1(w, x, ldx, n, out); break;
    case 2: z_q8_tile_2(w, x, ldx, n, out); break;
    case 3: z_q8_tile_3(w, x, ldx, n, out); break;
    case 4: z_q8_tile_4(w, x, ldx, n, out); break;
    case 5: z_q8_tile_5(w, x, ldx, n, out); break;
    default: z_q8_tile_6(w, x, ldx, n, out); break;
    }
}


#endif

/* ---- NEON: 4 x 4 lanes over blocks of 16, then blocks of 4, then a scalar tail -------------- */

#ifdef COLIBRI_HAVE_NEON
#define NEON_LOAD_F32(p) vld1q_f32((const float *)(p))
#define NEON_LOAD_F16(p) vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)(p))))
#define NEON_LOAD_BF16(p) vreinterpretq_f32_u32(vshll_n_u16(vld1_u16((const uint16_t *)(p)), 16))
#define NEON_LOAD_I8(p)                                                                       \
    vcvtq_f32_s32(vmovl_s16(vget_low_s16(vmovl_s8(load4_s8((const int8_t *)(p))))))
static inline int8x8_t load4_s8(const int8_t *p) {
    /* load 4 int8 values into the low half of a vector without reading past p + 4 */
    int32_t v;
    memcpy(&v, p, 4);
    return vreinterpret_s8_s32(vdup_n_s32(v));
}

#define NEON_DOT(NAME, T, LOAD4, CVT)                                                         \
    static float NAME(const void *wv, const float *x, size_t n) {                             \
        const T *w = (const T *)wv;                                                           \
        float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;                           \
        size_t i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                        \
            __builtin_prefetch((const char *)(w + i) + PREFETCH_BYTES);                       \
            a0 = vfmaq_f32(a0, LOAD4(w + i), vld1q_f32(x + i));                               \
            a1 = vfmaq_f32(a1, LOAD4(w + i + 4), vld1q_f32(x + i + 4));                       \
            a2 = vfmaq_f32(a2, LOAD4(w + i + 8), vld1q_f32(x + i + 8));                       \
            a3 = vfmaq_f32(a3, LOAD4(w + i + 12), vld1q_f32(x + i + 12));                     \
        }                                                                                     \
        for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, LOAD4(w + i), vld1q_f32(x + i));        \
        a0 = vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3));                                 \
        float s = (vgetq_lane_f32(a0, 0) + vgetq_lane_f32(a0, 1)) +                           \
                  (vgetq_lane_f32(a0, 2) + vgetq_lane_f32(a0, 3));                            \
        for (; i < n; i++) s += CVT(w[i]) * x[i];                                             \
        return s;                                                                             \
    }
NEON_DOT(neon_dot_f32, float, NEON_LOAD_F32, CVT_F32)
NEON_DOT(neon_dot_f16, uint16_t, NEON_LOAD_F16, half_to_float)
NEON_DOT(neon_dot_bf16, uint16_t, NEON_LOAD_BF16, bf16_to_float)
NEON_DOT(neon_dot_i8, int8_t, NEON_LOAD_I8, CVT_I8)

/* Two f32 rows against three tokens with the one-token NEON lane layout (4 x 4 lanes over blocks
 * of 16, then blocks of 4 into the first, fixed reduction): 24 accumulators of the 32 registers. */
static void neon_tile_2x3(const float *w0, const float *w1, const float *x0, const float *x1,
                          const float *x2, size_t n, float out[6]) {
    float32x4_t acc[6][4];
    const float *xs[3] = {x0, x1, x2};
    for (int p = 0; p < 6; p++)
        for (int k = 0; k < 4; k++) acc[p][k] = vdupq_n_f32(0);
    size_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int k = 0; k < 4; k++) {
            float32x4_t wa = vld1q_f32(w0 + i + 4 * k), wb = vld1q_f32(w1 + i + 4 * k);
            for (int j = 0; j < 3; j++) {
                float32x4_t x = vld1q_f32(xs[j] + i + 4 * k);
                acc[j][k] = vfmaq_f32(acc[j][k], wa, x);
                acc[3 + j][k] = vfmaq_f32(acc[3 + j][k], wb, x);
            }
        }
    for (; i + 4 <= n; i += 4) {
        float32x4_t wa = vld1q_f32(w0 + i), wb = vld1q_f32(w1 + i);
        for (int j = 0; j < 3; j++) {
            float32x4_t x = vld1q_f32(xs[j] + i);
            acc[j][0] = vfmaq_f32(acc[j][0], wa, x);
            acc[3 + j][0] = vfmaq_f32(acc[3 + j][0], wb, x);
        }
    }
    for (int p = 0; p < 6; p++) {
        float32x4_t a = vaddq_f32(vaddq_f32(acc[p][0], acc[p][1]), vaddq_f32(acc[p][2], acc[p][3]));
        float s = (vgetq_lane_f32(a, 0) + vgetq_lane_f32(a, 1)) +
                  (vgetq_lane_f32(a, 2) + vgetq_lane_f32(a, 3));
        const float *w = p < 3 ? w0 : w1, *x = xs[p % 3];
        for (size_t t = i; t < n; t++) s += w[t] * x[t];
        out[p] = s;
    }
}

static void neon_convert(const void *row, uint32_t dtype, size_t n, float *out) {
    size_t i = 0;
    switch (dtype) {
    case COLIBRI_DT_F16:
        for (; i + 4 <= n; i += 4) vst1q_f32(out + i, NEON_LOAD_F16((const uint16_t *)row + i));
        break;
    case COLIBRI_DT_BF16:
        for (; i + 4 <= n; i += 4) vst1q_f32(out + i, NEON_LOAD_BF16((const uint16_t *)row + i));
        break;
    case COLIBRI_DT_INT8:
        for (; i + 4 <= n; i += 4) vst1q_f32(out + i, NEON_LOAD_I8((const int8_t *)row + i));
        break;
    default: break;
    }
    if (i < n) convert_row((const uint8_t *)row + i * colibri_dtype_size(dtype), dtype, n - i, out + i);
}

static int32_t neon_dot_q8(const int8_t *w, const int8_t *x, size_t n) {
    int32x4_t acc = vdupq_n_s32(0);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        int8x16_t vw = vld1q_s8(w + i), vx = vld1q_s8(x + i);
        acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(vw), vget_low_s8(vx)));
        acc = vpadalq_s16(acc, vmull_s8(vget_high_s8(vw), vget_high_s8(vx)));
    }
    int32_t s = vgetq_lane_s32(acc, 0) + vgetq_lane_s32(acc, 1) + vgetq_lane_s32(acc, 2) +
                vgetq_lane_s32(acc, 3);
    for (; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}

/* Four rows (four streams a quarter block apart, as AVX2_DOT4) against one token, each row with
 * exactly NEON_DOT's lanes and order: 16 accumulators, one x load shared by four rows, software
 * prefetch per stream. */
#define NEON_DOT4(NAME, T, LOAD4, CVT)                                                        \
    static void NAME(const void *const *wv, const float *x, size_t n, float out[4]) {         \
        const T *w[4] = {(const T *)wv[0], (const T *)wv[1], (const T *)wv[2],                \
                         (const T *)wv[3]};                                                   \
        float32x4_t a[4][4];                                                                  \
        for (int k = 0; k < 4; k++)                                                           \
            for (int q = 0; q < 4; q++) a[k][q] = vdupq_n_f32(0);                             \
        size_t i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                        \
            for (int k = 0; k < 4; k++)                                                       \
                __builtin_prefetch((const char *)(w[k] + i) + PREFETCH_BYTES);                \
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {                             \
                float32x4_t xv = vld1q_f32(x + i + 4 * q);                                    \
                a[0][q] = vfmaq_f32(a[0][q], LOAD4(w[0] + i + 4 * q), xv);                    \
                a[1][q] = vfmaq_f32(a[1][q], LOAD4(w[1] + i + 4 * q), xv);                    \
                a[2][q] = vfmaq_f32(a[2][q], LOAD4(w[2] + i + 4 * q), xv);                    \
                a[3][q] = vfmaq_f32(a[3][q], LOAD4(w[3] + i + 4 * q), xv);                    \
            }                                                                                 \
        }                                                                                     \
        for (; i + 4 <= n; i += 4) {                                                          \
            float32x4_t xv = vld1q_f32(x + i);                                                \
            for (int k = 0; k < 4; k++) a[k][0] = vfmaq_f32(a[k][0], LOAD4(w[k] + i), xv);    \
        }                                                                                     \
        for (int k = 0; k < 4; k++) {                                                         \
            float32x4_t v = vaddq_f32(vaddq_f32(a[k][0], a[k][1]), vaddq_f32(a[k][2], a[k][3])); \
            float s = (vgetq_lane_f32(v, 0) + vgetq_lane_f32(v, 1)) +                         \
                      (vgetq_lane_f32(v, 2) + vgetq_lane_f32(v, 3));                          \
            for (size_t j = i; j < n; j++) s += CVT(w[k][j]) * x[j];                          \
            out[k] = s;                                                                       \
        }                                                                                     \
    }
NEON_DOT4(neon_dot4_f32, float, NEON_LOAD_F32, CVT_F32)
NEON_DOT4(neon_dot4_f16, uint16_t, NEON_LOAD_F16, half_to_float)
NEON_DOT4(neon_dot4_bf16, uint16_t, NEON_LOAD_BF16, bf16_to_float)
NEON_DOT4(neon_dot4_i8, int8_t, NEON_LOAD_I8, CVT_I8)

#ifdef COLIBRI_HAVE_SDOT
/* int8 x int8 with the Armv8.2 dot-product instruction (SDOT: four products summed into each
 * int32 lane), present on Orin's Cortex-A78AE and Thor's Neoverse-V3AE (HWCAP_ASIMDDP). Exact
 * integer sums, so the result equals the vmull/vpadal kernel's. */
#define NEON_Q8_TILE(NAME, NT)                                                                \
    SDOT_FN static void NAME(const int8_t *const *w, const int8_t *x, size_t ldx, size_t n,   \
                             int32_t *out) {                                                  \
        int32x4_t acc[4][NT];                                                                 \
        for (int r = 0; r < 4; r++)                                                           \
            for (int t = 0; t < NT; t++) acc[r][t] = vdupq_n_s32(0);                          \
        size_t i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                        \
            int8x16_t wv[4];                                                                  \
            for (int r = 0; r < 4; r++) {                                                     \
                __builtin_prefetch(w[r] + i + PREFETCH_BYTES);                                \
                wv[r] = vld1q_s8(w[r] + i);                                                   \
            }                                                                                 \
            _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {                            \
                int8x16_t xv = vld1q_s8(x + (size_t)t * ldx + i);                             \
                acc[0][t] = vdotq_s32(acc[0][t], wv[0], xv);                                  \
                acc[1][t] = vdotq_s32(acc[1][t], wv[1], xv);                                  \
                acc[2][t] = vdotq_s32(acc[2][t], wv[2], xv);                                  \
                acc[3][t] = vdotq_s32(acc[3][t], wv[3], xv);                                  \
            }                                                                                 \
        }                                                                                     \
        for (int r = 0; r < 4; r++)                                                           \
            for (int t = 0; t < NT; t++) {                                                    \
                const int8_t *xt = x + (size_t)t * ldx;                                       \
                int32_t s = vaddvq_s32(acc[r][t]);                                            \
                for (size_t k = i; k < n; k++) s += (int32_t)w[r][k] * (int32_t)xt[k];        \
                out[r * 6 + t] = s;                                                           \
            }                                                                                 \
    }
NEON_Q8_TILE(neon_q8_tile_1, 1)
NEON_Q8_TILE(neon_q8_tile_2, 2)
NEON_Q8_TILE(neon_q8_tile_3, 3)
NEON_Q8_TILE(neon_q8_tile_4, 4)
NEON_Q8_TILE(neon_q8_tile_5, 5)
NEON_Q8_TILE(neon_q8_tile_6, 6)

SDOT_FN static void neon_q8_tile(const int8_t *const *w, const int8_t *x, size_t ldx, int nt,
                                 size_t n, int32_t out[24]) {
    switch (nt) {
    case 1: neon_q8_tile_1(w, x, ldx, n, out); break;
    case 2: neon_q8_tile_2(w, x, ldx, n, out); break;
    case 3: neon_q8_tile_3(w, x, ldx, n, out); break;
    case 4: neon_q8_tile_4(w, x, ldx, n, out); break;
    case 5: neon_q8_tile_5(w, x, ldx, n, out); break;
    default: neon_q8_tile_6(w, x, ldx, n, out); break;
    }
}

SDOT_FN static void neon_dot4_q8(const int8_t *const *w, const int8_t *x, size_t n,
                                 int32_t out[4]) {
    int32_t o[24];
    neon_q8_tile_1(w, x, 0, n, o);
    for (int k = 0; k < 4; k++) out[k] = o[k * 6];
}

SDOT_FN static int32_t neon_sdot_q8(const int8_t *w, const int8_t *x, size_t n) {
    int32x4_t acc = vdupq_n_s32(0);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) acc = vdotq_s32(acc, vld1q_s8(w + i), vld1q_s8(x + i));
    int32_t s = vaddvq_s32(acc);
    for (; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}
#endif

#ifdef COLIBRI_HAVE_I8MM
/* int8 x int8 prefill with the Armv8.6 matrix multiply-accumulate (SMMLA, FEAT_I8MM: Thor's
 * Neoverse-V3AE, HWCAP2_I8MM). One SMMLA multiplies a 2x8 block of int8 (two weight rows, eight
 * columns) by an 8x2 block (eight columns of two tokens) into the 2x2 int32 sums: 32 products
 * per instruction where SDOT does 16. Lane 2i + j of the accumulator is row i . token j.
 *
 * Bits: integer sums are exact (|sum| < 2^31 for rows up to 2^17 columns), so a (row, token) sum is the same integer whatever the grouping: SMMLA's 8-column pairs, SDOT's
 * 4-column lanes or the scalar loop. The float step is colibri_rows_dot_q8's one expression,
 * (float)acc * (scale[r] * xscale[t]), so the output bits equal the SDOT and scalar paths', for
 * one token (decode, which keeps the SDOT streams) or many (prefill).
 *
 * SMMLA wants each operand as two 8-byte rows side by side. The tokens are interleaved once per
 * call into a stack buffer (pairs of tokens, 8 columns of each in turn), so every 4-row block
 * reuses them; the weight rows are paired in registers (ZIP1/ZIP2 on 64-bit lanes). Per 16
 * columns of 4 rows x 6 tokens: 4 zips + 12 SMMLA, where the SDOT tile runs 24 SDOT. */
/* Interleaved tokens on the stack: a 64-token chunk of 2048-column rows in one block (the weights
 * then stream once), 6 tokens up to 21845 columns. More tokens than fit: blocks that each stream
 * the rows again (from cache when the thread's rows fit in it). */
#define I8MM_PACK_BYTES 131072

/* Tokens x[0..nt) (ldx apart) as pairs: pair p at pk + p * 2 * c16, 16-byte block k of it =
 * token 2p's columns 8k'..8k'+7 then token 2p+1's (k' = k), zeros for a missing odd token. Only
 * the full blocks of 16 columns (c16); the tail is summed from x directly. */
static void i8mm_pack(const int8_t *x, size_t ldx, int nt, size_t c16, int8_t *pk) {
    for (int p = 0; 2 * p < nt; p++) {
        const int8_t *x0 = x + (size_t)(2 * p) * ldx, *x1 = x0 + ldx;
        int8_t *d = pk + (size_t)p * 2 * c16;
        for (size_t i = 0; i < c16; i += 16) {
            int64x2_t a = vreinterpretq_s64_s8(vld1q_s8(x0 + i));
            int64x2_t b = 2 * p + 1 < nt ? vreinterpretq_s64_s8(vld1q_s8(x1 + i)) : vdupq_n_s64(0);
            vst1q_s8(d + 2 * i, vreinterpretq_s8_s64(vzip1q_s64(a, b)));
            vst1q_s8(d + 2 * i + 16, vreinterpretq_s8_s64(vzip2q_s64(a, b)));
        }
    }
}

/* Four rows against NP token pairs (packed); out[r * 6 + t] for t < nt (tokens x, ldx apart,
 * for the tail columns past c16). */
#define I8MM_TILE(NAME, NP)                                                                   \
    I8MM_FN static void NAME(const int8_t *const *w, const int8_t *pk, size_t c16,            \
                             const int8_t *x, size_t ldx, int nt, size_t n, int32_t *out) {   \
        int32x4_t acc[2][NP];                                                                 \
        for (int h = 0; h < 2; h++)                                                           \
            for (int p = 0; p < NP; p++) acc[h][p] = vdupq_n_s32(0);                          \
        for (size_t i = 0; i < c16; i += 16) {                                                \
            int8x16_t lo[2], hi[2]; /* rows 2h, 2h+1: columns i..i+7 and i+8..i+15 */         \
            for (int h = 0; h < 2; h++) {                                                     \
                __builtin_prefetch(w[2 * h] + i + PREFETCH_BYTES);                            \
                __builtin_prefetch(w[2 * h + 1] + i + PREFETCH_BYTES);                        \
                int64x2_t a = vreinterpretq_s64_s8(vld1q_s8(w[2 * h] + i));                   \
                int64x2_t b = vreinterpretq_s64_s8(vld1q_s8(w[2 * h + 1] + i));               \
                lo[h] = vreinterpretq_s8_s64(vzip1q_s64(a, b));                               \
                hi[h] = vreinterpretq_s8_s64(vzip2q_s64(a, b));                               \
            }                                                                                 \
            _Pragma("GCC unroll 4") for (int p = 0; p < NP; p++) {                            \
                const int8_t *q = pk + (size_t)p * 2 * c16 + 2 * i;                           \
                int8x16_t xl = vld1q_s8(q), xh = vld1q_s8(q + 16);                            \
                acc[0][p] = vmmlaq_s32(acc[0][p], lo[0], xl);                                 \
                acc[1][p] = vmmlaq_s32(acc[1][p], lo[1], xl);                                 \
                acc[0][p] = vmmlaq_s32(acc[0][p], hi[0], xh);                                 \
                acc[1][p] = vmmlaq_s32(acc[1][p], hi[1], xh);                                 \
            }                                                                                 \
        }                                                                                     \
        for (int h = 0; h < 2; h++)                                                           \
            for (int p = 0; p < NP; p++) {                                                    \
                int32_t v[4];                                                                 \
                vst1q_s32(v, acc[h][p]);                                                      \
                for (int e = 0; e < 4; e++) {                                                 \
                    int r = 2 * h + e / 2, t = 2 * p + e % 2;                                 \
                    if (t >= nt) continue; /* the zero token of an odd count */               \
                    const int8_t *xt = x + (size_t)t * ldx;                                   \
                    int32_t s = v[e];                                                         \
                    for (size_t k = c16; k < n; k++) s += (int32_t)w[r][k] * (int32_t)xt[k];  \
                    out[r * 6 + t] = s;                                                       \
                }                                                                             \
            }                                                                                 \
    }
I8MM_TILE(i8mm_tile_1, 1)
I8MM_TILE(i8mm_tile_2, 2)
I8MM_TILE(i8mm_tile_3, 3)

/* colibri_rows_dot_q8 for n > 1 tokens: blocks of tb tokens (all n when they fit the buffer,
 * else a multiple of 6) interleaved once, then 4-row x 6-token tiles over them. Returns 0
 * (nothing done) when even 6 tokens do not fit: the caller runs the SDOT tiles. */
static int i8mm_rows_dot_q8(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                            const float *xscale, int n, size_t ldx, float *y, size_t ldy) {
    _Alignas(16) int8_t pk[I8MM_PACK_BYTES];
    size_t cols = w->cols, c16 = cols / 16 * 16;
    size_t fit = c16 ? I8MM_PACK_BYTES / c16 : (size_t)n; /* tokens the buffer holds */
    if (fit < 6 && fit < (size_t)n) return 0;
    int tb = fit >= (size_t)n ? n : (int)(fit / 6 * 6);
    const int8_t *base = (const int8_t *)w->data;
    for (int j0 = 0; j0 < n; j0 += tb) {
        int nb = n - j0 < tb ? n - j0 : tb;
        i8mm_pack(xq + (size_t)j0 * ldx, ldx, nb, c16, pk);
        for (uint32_t r = r0; r < r1; r += 4) {
            uint32_t rows = r1 - r < 4 ? r1 - r : 4;
            const int8_t *wr[4];
            for (uint32_t k = 0; k < 4; k++) wr[k] = base + (size_t)(r + (k < rows ? k : 0)) * cols;
            for (int j = 0; j < nb; j += 6) {
                int nt = nb - j < 6 ? nb - j : 6;
                const int8_t *pj = pk + (size_t)j * c16, *xj = xq + (size_t)(j0 + j) * ldx;
                int32_t acc[24];
                switch ((nt + 1) / 2) {
                case 1: i8mm_tile_1(wr, pj, c16, xj, ldx, nt, cols, acc); break;
                case 2: i8mm_tile_2(wr, pj, c16, xj, ldx, nt, cols, acc); break;
                default: i8mm_tile_3(wr, pj, c16, xj, ldx, nt, cols, acc); break;
                }
                for (uint32_t k = 0; k < rows; k++)
                    for (int t = 0; t < nt; t++)
                        y[(size_t)(j0 + j + t) * ldy + r + k] =
                            (float)acc[k * 6 + t] * (w->scales[r + k] * xscale[j0 + j + t]);
            }
        }
    }
    return 1;
}
#endif
#endif

static void generic_tile_2x3(const float *w0, const float *w1, const float *x0, const float *x1,
                             const float *x2, size_t n, float out[6]) {
    const float *w[2] = {w0, w1}, *x[3] = {x0, x1, x2};
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 3; j++) out[r * 3 + j] = K.dot[COLIBRI_DT_F32](w[r], x[j], n);
}


/* ---- selection ------------------------------------------------------------------------------ */

static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;

static void kernels_pick(void) {
    K.dot[COLIBRI_DT_F32] = scalar_dot_f32;
    K.dot[COLIBRI_DT_F16] = scalar_dot_f16;
    K.dot[COLIBRI_DT_BF16] = scalar_dot_bf16;
    K.dot[COLIBRI_DT_INT8] = scalar_dot_i8;
    K.dot_q8 = scalar_dot_q8;
    K.convert = convert_row;
    K.tile_2x3 = generic_tile_2x3;
    K.name = "scalar";
#ifdef COLIBRI_HAVE_AVX2
    int x86 = colibri_x86_features();
    if (x86 & COLIBRI_X86_AVX2) {
        K.dot[COLIBRI_DT_F32] = avx2_dot_f32;
        K.dot[COLIBRI_DT_F16] = avx2_dot_f16;
        K.dot[COLIBRI_DT_BF16] = avx2_dot_bf16;
        K.dot[COLIBRI_DT_INT8] = avx2_dot_i8;
        K.dot4[COLIBRI_DT_F32] = avx2_dot4_f32;
        K.dot4[COLIBRI_DT_F16] = avx2_dot4_f16;
        K.dot4[COLIBRI_DT_BF16] = avx2_dot4_bf16;
        K.dot4[COLIBRI_DT_INT8] = avx2_dot4_i8;
        K.dot_q8 = avx2_dot_q8;
        K.dot4_q8 = avx2_dot4_q8;
        K.convert = avx2_convert;
        K.tile_2x3 = avx2_tile_2x3;
        K.tile_q8 = avx2_q8_tile; /* AVX-512 VNNI replaces it below */
        K.name = "avx2";
        if (x86 & COLIBRI_X86_AVX512) {
            /* decode keeps the AVX2 streams: bound by memory, the 16-lane version measured
             * the same (f32 16.2 vs 14.8, f16 29.4 vs 32.3 GFLOP/s on L3-resident rows) */
            K.tile = z_tile;
            K.name = "avx512";
            if (x86 & COLIBRI_X86_VNNI) { /* prefill only: for one token the weight-sum term makes it slower
                         * than avx2_dot4_q8 (50 vs 60 GOP/s on L3-resident rows, Ice Lake) */
                K.tile_q8 = z_q8_tile;
                K.name = "avx512-vnni";
            }
        }
    }
#endif
#ifdef COLIBRI_HAVE_NEON
    K.dot[COLIBRI_DT_F32] = neon_dot_f32;
    K.dot[COLIBRI_DT_F16] = neon_dot_f16;
    K.dot[COLIBRI_DT_BF16] = neon_dot_bf16;
    K.dot[COLIBRI_DT_INT8] = neon_dot_i8;
    K.dot4[COLIBRI_DT_F32] = neon_dot4_f32;
    K.dot4[COLIBRI_DT_F16] = neon_dot4_f16;
    K.dot4[COLIBRI_DT_BF16] = neon_dot4_bf16;
    K.dot4[COLIBRI_DT_INT8] = neon_dot4_i8;
    K.dot_q8 = neon_dot_q8;
    K.convert = neon_convert;
    K.tile_2x3 = neon_tile_2x3;
    K.name = "neon";
    int feat = colibri_arm_features();
#ifdef COLIBRI_HAVE_SDOT
    if (feat & COLIBRI_ARM_DOTPROD) {
        K.dot_q8 = neon_sdot_q8;
        K.dot4_q8 = neon_dot4_q8;
        K.tile_q8 = neon_q8_tile;
        K.name = "neon-dotprod";
#ifdef COLIBRI_HAVE_I8MM
        if (feat & COLIBRI_ARM_I8MM) {
            /* prefill only: for one token half of each SMMLA's products would be thrown away,
             * so decode keeps the SDOT streams */
            K.rows_q8 = i8mm_rows_dot_q8;
            K.name = "neon-i8mm";
        }
#endif
    }
#endif
    (void)feat;
#endif
}

const char *colibri_kernels_init(void) {
    pthread_once(&kernels_once, kernels_pick);
    return K.name;
}

float colibri_dot_f32(const float *a, const float *b, size_t n) {
    return K.dot[COLIBRI_DT_F32](a, b, n);
}

void colibri_rows_dot(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x, int n,
                      size_t ldx, float *y, size_t ldy, float *scratch) {
    if (w->dtype == COLIBRI_DT_Q4) { /* grouped 4-bit: kernels_q4.c */
        colibri_q4_rows_dot(w, r0, r1, x, n, ldx, y, ldy, scratch);
        return;
    }
    if (w->dtype == COLIBRI_DT_MXFP4) { /* gpt-oss's mxfp4: kernels_mxfp4.c */
        colibri_mxfp4_rows_dot(w, r0, r1, x, n, ldx, y, ldy);
        return;
    }
    size_t cols = w->cols, rowbytes = cols * colibri_dtype_size(w->dtype);
    const uint8_t *base = (const uint8_t *)w->data;
    if (n == 1) { /* decode: stream the rows once, converting in registers */
        dot_fn dot = K.dot[w->dtype];
        dot4_fn dot4 = K.dot4[w->dtype];
        uint32_t r = r0;
        if (dot4) { /* rows r0 + k*q + i for k < 4: four streams a quarter block apart */
            uint32_t q = (r1 - r0) / 4;
            for (uint32_t i = 0; i < q; i++) {
                const void *rows[4];
                float o[4];
                for (uint32_t k = 0; k < 4; k++) rows[k] = base + (size_t)(r0 + k * q + i) * rowbytes;
                dot4(rows, x, cols, o);
                for (uint32_t k = 0; k < 4; k++) {
                    uint32_t rr = r0 + k * q + i;
                    y[rr] = (w->scales ? w->scales[rr] : 1.0f) * o[k];
                }
            }
            r = r0 + 4 * q; /* up to 3 rows left */
        }
        for (; r < r1; r++)
            y[r] = (w->scales ? w->scales[r] : 1.0f) * dot(base + (size_t)r * rowbytes, x, cols);
        return;
    }
    if (K.tile) { /* several tokens: 4-row x 6-token tiles, weights converted in registers */
        for (uint32_t r = r0; r < r1; r += 4) {
            uint32_t rows = r1 - r < 4 ? r1 - r : 4;
            const void *wr[4];
            float sc[4];
            for (uint32_t k = 0; k < 4; k++) { /* past the end: row r again, result unused */
                uint32_t rr = r + (k < rows ? k : 0);
                wr[k] = base + (size_t)rr * rowbytes;
                sc[k] = w->scales ? w->scales[rr] : 1.0f;
            }
            for (int j = 0; j < n; j += 6) {
                int nt = n - j < 6 ? n - j : 6;
                float o[24];
                K.tile(w->dtype, wr, x + (size_t)j * ldx, ldx, nt, cols, o);
                for (uint32_t k = 0; k < rows; k++)
                    for (int t = 0; t < nt; t++) y[(size_t)(j + t) * ldy + r + k] = sc[k] * o[k * 6 + t];
            }
        }
        return;
    }
    /* Several tokens: rows converted to f32 once (exact), then 2-row x 3-token tiles with the
     * one-token kernel's lane order, so every value has the same bits as in decode. */
    for (uint32_t r = r0; r < r1; r += 2) {
        int rows = r + 1 < r1 ? 2 : 1;
        const float *wr[2];
        for (int k = 0; k < rows; k++) {
            const uint8_t *row = base + (size_t)(r + (uint32_t)k) * rowbytes;
            if (w->dtype == COLIBRI_DT_F32) {
                wr[k] = (const float *)(const void *)row;
            } else {
                K.convert(row, w->dtype, cols, scratch + (size_t)k * cols);
                wr[k] = scratch + (size_t)k * cols;
            }
        }
        if (rows == 1) wr[1] = wr[0];
        float sc[2] = {w->scales ? w->scales[r] : 1.0f,
                       w->scales && rows == 2 ? w->scales[r + 1] : 1.0f};
        int j = 0;
        for (; j + 3 <= n; j += 3) {
            float o[6];
            const float *xj = x + (size_t)j * ldx;
            K.tile_2x3(wr[0], wr[1], xj, xj + ldx, xj + 2 * ldx, cols, o);
            for (int k = 0; k < rows; k++)
                for (int t = 0; t < 3; t++) y[(size_t)(j + t) * ldy + r + (uint32_t)k] = sc[k] * o[k * 3 + t];
        }
        for (; j < n; j++)
            for (int k = 0; k < rows; k++)
                y[(size_t)j * ldy + r + (uint32_t)k] =
                    sc[k] * K.dot[COLIBRI_DT_F32](wr[k], x + (size_t)j * ldx, cols);
    }
}

void colibri_rows_dot_q8(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                         const float *xscale, int n, size_t ldx, float *y, size_t ldy) {
    if (w->dtype == COLIBRI_DT_Q4) { /* grouped 4-bit: kernels_q4.c */
        colibri_q4_rows_dot_q8(w, r0, r1, xq, xscale, n, ldx, y, ldy);
        return;
    }
    size_t cols = w->cols;
    const int8_t *base = (const int8_t *)w->data;
    if (n == 1 && K.dot4_q8) { /* decode: four streams a quarter block apart, as colibri_rows_dot */
        uint32_t q = (r1 - r0) / 4;
        for (uint32_t i = 0; i < q; i++) {
            const int8_t *rows[4];
            int32_t acc[4];
            for (uint32_t k = 0; k < 4; k++) rows[k] = base + (size_t)(r0 + k * q + i) * cols;
            K.dot4_q8(rows, xq, cols, acc);
            for (uint32_t k = 0; k < 4; k++) {
                uint32_t rr = r0 + k * q + i;
                y[rr] = (float)acc[k] * (w->scales[rr] * xscale[0]);
            }
        }
        r0 += 4 * q; /* up to 3 rows left */
    }
    if (n > 1 && K.rows_q8 && K.rows_q8(w, r0, r1, xq, xscale, n, ldx, y, ldy)) return;
    if (n > 1 && K.tile_q8) { /* several tokens: 4-row x 6-token integer tiles */
        for (uint32_t r = r0; r < r1; r += 4) {
            uint32_t rows = r1 - r < 4 ? r1 - r : 4;
            const int8_t *wr[4];
            for (uint32_t k = 0; k < 4; k++) wr[k] = base + (size_t)(r + (k < rows ? k : 0)) * cols;
            for (int j = 0; j < n; j += 6) {
                int nt = n - j < 6 ? n - j : 6;
                int32_t acc[24];
                K.tile_q8(wr, xq + (size_t)j * ldx, ldx, nt, cols, acc);
                for (uint32_t k = 0; k < rows; k++)
                    for (int t = 0; t < nt; t++)
                        y[(size_t)(j + t) * ldy + r + k] =
                            (float)acc[k * 6 + t] * (w->scales[r + k] * xscale[j + t]);
            }
        }
        return;
    }
    for (uint32_t r = r0; r < r1; r++) {
        const int8_t *row = base + (size_t)r * cols;
        float sc = w->scales[r];
        for (int j = 0; j < n; j++) {
            int32_t acc = K.dot_q8(row, xq + (size_t)j * ldx, cols);
            y[(size_t)j * ldy + r] = (float)acc * (sc * xscale[j]);
        }
    }
}

void colibri_row_f32(const colibri_tensor *w, uint32_t r, float *out) {
    if (w->dtype == COLIBRI_DT_Q4) { /* grouped 4-bit: kernels_q4.c */
        colibri_q4_row_f32(w, r, out);
        return;
    }
    if (w->dtype == COLIBRI_DT_MXFP4) {
        colibri_mxfp4_row_f32(w, r, out);
        return;
    }
    size_t cols = w->cols;
    convert_row((const uint8_t *)w->data + (size_t)r * cols * colibri_dtype_size(w->dtype), w->dtype,
                cols, out);
    if (w->scales)
        for (size_t i = 0; i < cols; i++) out[i] *= w->scales[r];
}

/* ---- f16 KV cache (forward.c): rounding on write, widening on read ---------------------------
 * The rounding is the scalar half_from_float (half.h) or the hardware instruction with the same
 * bits (F16C vcvtps2ph, AArch64 FCVT; round to nearest even in both default modes), chosen with
 * the kernel family, so any thread count, prefill and decode store the same cache. The reads reuse
 * the f16 weight kernels: the conversions are exact, so a dot against f16 keys has the bits of
 * the f32 dot against the widened keys. */

#ifdef COLIBRI_HAVE_AVX2
__attribute__((target("avx2,fma,f16c"))) static void avx2_to_f16(const float *x, size_t n,
                                                                  uint16_t *out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = half_from_float(x[i]);
}
#endif

void colibri_f32_to_f16(const float *x, size_t n, uint16_t *out) {
    colibri_kernels_init();
#ifdef COLIBRI_HAVE_AVX2
    if (K.convert == avx2_convert) { /* the AVX2 family is in use: the CPU has F16C */
        avx2_to_f16(x, n, out);
        return;
    }
#endif
    size_t i = 0;
#ifdef COLIBRI_HAVE_NEON
    for (; i + 4 <= n; i += 4)
        vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
#endif
    for (; i < n; i++) out[i] = half_from_float(x[i]);
}

void colibri_f32_to_f16_scalar(const float *x, size_t n, uint16_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = half_from_float(x[i]);
}

void colibri_f16_to_f32(const uint16_t *h, size_t n, float *out) {
    K.convert(h, COLIBRI_DT_F16, n, out);
}

/* out[i] += w * widen(h[i]) as a multiply and then an add (two roundings, never fused: forward.c's
 * f32 loop is compiled without contraction under GCC's -std=c11), so every element has the bits
 * of widening the row first. F16C widens in registers; otherwise blocks of 64 go through the
 * family's convert. */
#ifdef COLIBRI_HAVE_AVX2
__attribute__((target("avx2,fma,f16c"))) static void avx2_axpy_f16(float *out, float w,
                                                                    const uint16_t *h, size_t n) {
    const __m256 vw = _mm256_set1_ps(w);
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, _mm256_add_ps(_mm256_loadu_ps(out + i),
                                                _mm256_mul_ps(vw, AVX_LOAD_F16(h + i))));
    for (; i < n; i++) {
        float p = w * half_to_float(h[i]);
        out[i] += p;
    }
}
#endif

void colibri_axpy_f16(float *out, float w, const uint16_t *h, size_t n) {
#ifdef COLIBRI_HAVE_AVX2
    if (K.convert == avx2_convert) {
        avx2_axpy_f16(out, w, h, n);
        return;
    }
#endif
    float row[64];
    for (size_t i = 0; i < n; i += 64) {
        size_t m = n - i < 64 ? n - i : 64;
        K.convert(h + i, COLIBRI_DT_F16, m, row);
        for (size_t d = 0; d < m; d++) out[i + d] += w * row[d];
    }
}

float colibri_dot_f16(const uint16_t *h, const float *x, size_t n) {
    return K.dot[COLIBRI_DT_F16](h, x, n);
}
