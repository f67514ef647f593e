/* The x86_64 kernels (see kernel_table.h): AVX2+FMA+F16C and AVX-512 (F/VL/BW/DQ, VNNI),
 * compiled with per-function target attributes, so the host build needs no -march flag, and
 * chosen at run time from the one CPU probe (cpu_features.c). */
#include "kernel_table.h"
#include "cpu_features.h"
#include "q4_pack.h"

#include <math.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* ---- AVX2 + FMA: 4 x 8 lanes over blocks of 32, then blocks of 8, then a scalar tail --------- */

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
    if (i < n) colibri_convert_row_scalar((const uint8_t *)row + i * colibri_dtype_size(dtype), dtype, n - i, out + i);
}

#define AVX2_HSUM(a, t, s)                                                                    \
    do {                                                                                      \
        _mm256_storeu_ps(t, a);                                                               \
        s = ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));               \
    } while (0)

/* The four-row accumulation of AVX2_DOT4 and AVX2_SCORES: AVX2_DOT's lanes per row (a*, b*, c*, d*: rows 0-3; *0
 * and *1: offsets 0 and 8 of each block of 16, then blocks of 8 into *0). PF(i): an optional
 * prefetch statement per block of 16 (decode's weight streams). */
#define AVX2_ACC4(LOAD8, PF)                                                                  \
    for (; i + 16 <= n; i += 16) {                                                            \
        PF(i);                                                                                \
        __m256 x0 = _mm256_loadu_ps(x + i), x1 = _mm256_loadu_ps(x + i + 8);                  \
        a0 = _mm256_fmadd_ps(LOAD8(w0 + i), x0, a0);                                          \
        b0 = _mm256_fmadd_ps(LOAD8(w1 + i), x0, b0);                                          \
        c0 = _mm256_fmadd_ps(LOAD8(w2 + i), x0, c0);                                          \
        d0 = _mm256_fmadd_ps(LOAD8(w3 + i), x0, d0);                                          \
        a1 = _mm256_fmadd_ps(LOAD8(w0 + i + 8), x1, a1);                                      \
        b1 = _mm256_fmadd_ps(LOAD8(w1 + i + 8), x1, b1);                                      \
        c1 = _mm256_fmadd_ps(LOAD8(w2 + i + 8), x1, c1);                                      \
        d1 = _mm256_fmadd_ps(LOAD8(w3 + i + 8), x1, d1);                                      \
    }                                                                                         \
    for (; i + 8 <= n; i += 8) {                                                              \
        __m256 x0 = _mm256_loadu_ps(x + i);                                                   \
        a0 = _mm256_fmadd_ps(LOAD8(w0 + i), x0, a0);                                          \
        b0 = _mm256_fmadd_ps(LOAD8(w1 + i), x0, b0);                                          \
        c0 = _mm256_fmadd_ps(LOAD8(w2 + i), x0, c0);                                          \
        d0 = _mm256_fmadd_ps(LOAD8(w3 + i), x0, d0);                                          \
    }
/* ... and the scalar columns past the last block of 8, added to the four rows' sums in order */
#define AVX2_TAIL4(CVT, s)                                                                    \
    for (; i < n; i++) {                                                                      \
        s[0] += CVT(w0[i]) * x[i];                                                            \
        s[1] += CVT(w1[i]) * x[i];                                                            \
        s[2] += CVT(w2[i]) * x[i];                                                            \
        s[3] += CVT(w3[i]) * x[i];                                                            \
    }
#define AVX2_PF4(i)                                                                           \
    do {                                                                                      \
        __builtin_prefetch((const char *)(w0 + (i)) + PREFETCH_BYTES);                        \
        __builtin_prefetch((const char *)(w1 + (i)) + PREFETCH_BYTES);                        \
        __builtin_prefetch((const char *)(w2 + (i)) + PREFETCH_BYTES);                        \
        __builtin_prefetch((const char *)(w3 + (i)) + PREFETCH_BYTES);                        \
    } while (0)
#define AVX2_NO_PF(i) (void)0

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
        AVX2_ACC4(LOAD8, AVX2_PF4)                                                            \
        float t[8], s[4];                                                                     \
        AVX2_HSUM(_mm256_add_ps(a0, a1), t, s[0]);                                            \
        AVX2_HSUM(_mm256_add_ps(b0, b1), t, s[1]);                                            \
        AVX2_HSUM(_mm256_add_ps(c0, c1), t, s[2]);                                            \
        AVX2_HSUM(_mm256_add_ps(d0, d1), t, s[3]);                                            \
        AVX2_TAIL4(CVT, s)                                                                    \
        memcpy(out, s, sizeof s);                                                             \
    }
AVX2_DOT4(avx2_dot4_f32, float, AVX_LOAD_F32, CVT_F32)
AVX2_DOT4(avx2_dot4_f16, uint16_t, AVX_LOAD_F16, half_to_float)
AVX2_DOT4(avx2_dot4_bf16, uint16_t, AVX_LOAD_BF16, bf16_to_float)
AVX2_DOT4(avx2_dot4_i8, int8_t, AVX_LOAD_I8, CVT_I8)

/* Attention scores (kernel_table.h scores): nx queries against nr key rows, four rows at a time
 * with AVX2_DOT's lanes and order per (query, row); the four horizontal sums are done together
 * by two rounds of hadd (pairs t0+t1, t2+t3, ... then their pairs) and one add of the two
 * 128-bit halves: ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7)), the store-and-add tree of
 * AVX2_DOT, for four rows in six instructions instead of four stores and 28 scalar adds. */
#define AVX2_SCORES(NAME, T, LOAD8, CVT, ONE)                                                 \
    __attribute__((target("avx2,fma,f16c"))) static void NAME(                                \
        const float *xs, size_t ldx, int nx, const void *const *rows, int nr, size_t n,       \
        float *out, size_t ldo) {                                                             \
        for (int h = 0; h < nx; h++) {                                                        \
            const float *x = xs + (size_t)h * ldx;                                            \
            float *o = out + (size_t)h * ldo;                                                 \
            int r = 0;                                                                        \
            for (; r + 4 <= nr; r += 4) {                                                     \
                const T *w0 = (const T *)rows[r], *w1 = (const T *)rows[r + 1],               \
                        *w2 = (const T *)rows[r + 2], *w3 = (const T *)rows[r + 3];           \
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0, \
                       d0 = a0, d1 = a0;                                                      \
                size_t i = 0;                                                                 \
                AVX2_ACC4(LOAD8, AVX2_NO_PF)                                                  \
                __m256 g = _mm256_hadd_ps(                                                    \
                    _mm256_hadd_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(b0, b1)),             \
                    _mm256_hadd_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(d0, d1)));            \
                float s[4];                                                                   \
                _mm_storeu_ps(s, _mm_add_ps(_mm256_castps256_ps128(g),                        \
                                            _mm256_extractf128_ps(g, 1)));                    \
                AVX2_TAIL4(CVT, s)                                                            \
                memcpy(o + r, s, sizeof s);                                                   \
            }                                                                                 \
            for (; r < nr; r++) o[r] = ONE(rows[r], x, n);                                    \
        }                                                                                     \
    }
AVX2_SCORES(avx2_scores_f32, float, AVX_LOAD_F32, CVT_F32, avx2_dot_f32)
AVX2_SCORES(avx2_scores_f16, uint16_t, AVX_LOAD_F16, half_to_float, avx2_dot_f16)

__attribute__((target("avx2,fma,f16c"))) static void avx2_scores(const float *xs, size_t ldx,
                                                                  int nx, const void *const *rows,
                                                                  int nr, size_t n, int f16,
                                                                  float *out, size_t ldo) {
    if (f16) avx2_scores_f16(xs, ldx, nx, rows, nr, n, out, ldo);
    else avx2_scores_f32(xs, ldx, nx, rows, nr, n, out, ldo);
}

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

/* ---- AVX-512: the AVX2 lane layout in 16-lane registers ------------------------------------ */

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

/* ---- int8 x int8 on the packed layout (q4_pack.h): 16 rows per register ----------------------
 * Chunk k of a 16-row block holds columns 4k..4k+3 of the 16 rows as w + 128 (unsigned bytes), so
 * vpdpbusd(acc, chunk, broadcast of the token's dword x[4k..4k+3]) adds sum (w + 128) x to row
 * i's lane, and 128 * sum(x), one value per token, comes off at the end. No per-row weight sum
 * and no horizontal reduction (z_q8_tile spends a vpdpbusd per row and 64 columns on the one and
 * a reduction per row and token on the other). Each token keeps CH chains (chunks k mod CH) in
 * flight: 4 for tiles of up to 4 tokens, 1 above (more accumulators made GCC shuffle registers:
 * 8 tokens took 0.31 ms with 2 chains, 0.14 with 1, for a 2816 x 1024 matrix). No software
 * prefetch: the block is one sequential stream, which the hardware prefetchers follow, and the
 * PREFETCH_BYTES hint the file-layout kernels use cost bandwidth here (64 matrices of 2816 x 1024
 * from DRAM, 1 token: 1 thread 31.6 vs 23.5-25.7 GB/s, 2 threads 34-37.5 vs 25-26; in 4 KiB
 * pages 22 vs 17-19 and 27 vs 24-26). Integer sums are
 * exact (|partial| < 2^31 for up to 2^16 columns), so the bits are the file layout's whatever
 * the tile, chain or thread split. */
#define ZP_I8(NAME, NT, CH)                                                                      \
    __attribute__((target(VNNI_TARGET))) static void NAME(const uint8_t *p, const int8_t *x,       \
                                                          size_t ldx, size_t nk, __m512i out[8]) { \
        __m512i a[NT][CH];                                                                        \
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++)                                     \
            _Pragma("GCC unroll 4") for (int c = 0; c < CH; c++) a[t][c] = _mm512_setzero_si512(); \
        size_t k = 0;                                                                             \
        for (; k + CH <= nk; k += CH, p += 64 * CH) {                                             \
            _Pragma("GCC unroll 4") for (int c = 0; c < CH; c++) {                               \
                __m512i W = _mm512_loadu_si512((const void *)(p + 64 * c));                       \
                _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {                           \
                    int32_t v;                                                                    \
                    memcpy(&v, x + (size_t)t * ldx + 4 * (k + (size_t)c), 4);                     \
                    a[t][c] = _mm512_dpbusd_epi32(a[t][c], W, _mm512_set1_epi32(v));              \
                }                                                                                 \
            }                                                                                     \
        }                                                                                         \
        for (; k < nk; k++, p += 64) {                                                            \
            __m512i W = _mm512_loadu_si512((const void *)p);                                      \
            _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {                               \
                int32_t v;                                                                        \
                memcpy(&v, x + (size_t)t * ldx + 4 * k, 4);                                       \
                a[t][0] = _mm512_dpbusd_epi32(a[t][0], W, _mm512_set1_epi32(v));                  \
            }                                                                                     \
        }                                                                                         \
        _Pragma("GCC unroll 8") for (int t = 0; t < NT; t++) {                                   \
            __m512i s = a[t][0];                                                                  \
            _Pragma("GCC unroll 4") for (int c = 1; c < CH; c++) s = _mm512_add_epi32(s, a[t][c]); \
            out[t] = s;                                                                           \
        }                                                                                         \
    }
ZP_I8(zp_i8_1, 1, 4)
ZP_I8(zp_i8_2, 2, 4)
ZP_I8(zp_i8_3, 3, 4)
ZP_I8(zp_i8_4, 4, 4)
ZP_I8(zp_i8_5, 5, 1)
ZP_I8(zp_i8_6, 6, 1)
ZP_I8(zp_i8_7, 7, 1)
ZP_I8(zp_i8_8, 8, 1)

/* 128 * sum(x): the term the unsigned weight bytes add */
__attribute__((target(VNNI_TARGET))) static int32_t zp_i8_offset(const int8_t *x, size_t n) {
    const __m512i one = _mm512_set1_epi8(1);
    __m512i s = _mm512_setzero_si512();
    size_t i = 0;
    for (; i + 64 <= n; i += 64)
        s = _mm512_dpbusd_epi32(s, one, _mm512_loadu_si512((const void *)(x + i)));
    int32_t v = _mm512_reduce_add_epi32(s);
    for (; i < n; i++) v += x[i];
    return 128 * v;
}

/* Rows [r0, r1) of a packed int8 tensor: the 16-row blocks that overlap them (rows of a block
 * outside the range are computed and not stored; mm_task splits packed tensors at block edges),
 * tiles of up to 8 tokens; y = (float)dot * (scale[row] * xscale[token]), colibri_rows_dot_q8's
 * one expression. */
__attribute__((target(VNNI_TARGET))) static void zp_i8_rows(const colibri_tensor *w, uint32_t r0,
                                                            uint32_t r1, const int8_t *xq,
                                                            const float *xscale, int n, size_t ldx,
                                                            float *y, size_t ldy) {
    size_t cols = w->cols, nk = cols / 4, blk_bytes = (size_t)COLIBRI_Q4P_ROWS * cols;
    for (int j0 = 0; j0 < n; j0 += 8) {
        int nt = n - j0 < 8 ? n - j0 : 8;
        const int8_t *xj = xq + (size_t)j0 * ldx;
        int32_t off[8];
        __m512 xs[8];
        for (int t = 0; t < nt; t++) {
            off[t] = zp_i8_offset(xj + (size_t)t * ldx, cols);
            xs[t] = _mm512_set1_ps(xscale[j0 + t]);
        }
        for (uint32_t blk = r0 / COLIBRI_Q4P_ROWS; blk * COLIBRI_Q4P_ROWS < r1; blk++) {
            const uint8_t *p = w->packed + (size_t)blk * blk_bytes;
            uint32_t base = blk * COLIBRI_Q4P_ROWS;
            const __mmask16 keep = colibri_packed_rows_mask(blk, r0, r1);
            __m512i acc[8];
            switch (nt) {
            case 1: zp_i8_1(p, xj, ldx, nk, acc); break;
            case 2: zp_i8_2(p, xj, ldx, nk, acc); break;
            case 3: zp_i8_3(p, xj, ldx, nk, acc); break;
            case 4: zp_i8_4(p, xj, ldx, nk, acc); break;
            case 5: zp_i8_5(p, xj, ldx, nk, acc); break;
            case 6: zp_i8_6(p, xj, ldx, nk, acc); break;
            case 7: zp_i8_7(p, xj, ldx, nk, acc); break;
            default: zp_i8_8(p, xj, ldx, nk, acc); break;
            }
            const __m512 sc = _mm512_loadu_ps(w->scales + base); /* rows % 16 == 0 when packed */
            for (int t = 0; t < nt; t++) {
                __m512 d = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[t], _mm512_set1_epi32(off[t])));
                _mm512_mask_storeu_ps(y + (size_t)(j0 + t) * ldy + base, keep,
                                      _mm512_mul_ps(d, _mm512_mul_ps(sc, xs[t])));
            }
        }
    }
    _mm256_zeroupper();
}

/* ---- f16 KV cache (kernels.c has the why): F16C rounding and widening ------------------------ */

__attribute__((target("avx2,fma,f16c"))) static void avx2_to_f16(const float *x, size_t n,
                                                                  uint16_t *out) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(void *)(out + i),
                         _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) out[i] = half_from_float(x[i]);
}

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

/* Attention's value sum (kernel_table.h wsum_rows): 64 outputs at a time in eight registers over
 * every row, then blocks of 8, then a scalar tail; per output the multiply-then-add sequence of
 * the portable loop, row by row in order. */
#define AVX2_WSUM_STRIP(LOAD8, T)                                                                 for (; d + 64 <= n; d += 64) {                                                                    __m256 a0 = _mm256_loadu_ps(out + d), a1 = _mm256_loadu_ps(out + d + 8),                             a2 = _mm256_loadu_ps(out + d + 16), a3 = _mm256_loadu_ps(out + d + 24),                       a4 = _mm256_loadu_ps(out + d + 32), a5 = _mm256_loadu_ps(out + d + 40),                       a6 = _mm256_loadu_ps(out + d + 48), a7 = _mm256_loadu_ps(out + d + 56);                for (int i = 0; i < nr; i++) {                                                                    const T *v = (const T *)rows[i] + d;                                                          __m256 vw = _mm256_set1_ps(w[i]);                                                             a0 = _mm256_add_ps(a0, _mm256_mul_ps(vw, LOAD8(v)));                                          a1 = _mm256_add_ps(a1, _mm256_mul_ps(vw, LOAD8(v + 8)));                                      a2 = _mm256_add_ps(a2, _mm256_mul_ps(vw, LOAD8(v + 16)));                                     a3 = _mm256_add_ps(a3, _mm256_mul_ps(vw, LOAD8(v + 24)));                                     a4 = _mm256_add_ps(a4, _mm256_mul_ps(vw, LOAD8(v + 32)));                                     a5 = _mm256_add_ps(a5, _mm256_mul_ps(vw, LOAD8(v + 40)));                                     a6 = _mm256_add_ps(a6, _mm256_mul_ps(vw, LOAD8(v + 48)));                                     a7 = _mm256_add_ps(a7, _mm256_mul_ps(vw, LOAD8(v + 56)));                                 }                                                                                             _mm256_storeu_ps(out + d, a0);                                                                _mm256_storeu_ps(out + d + 8, a1);                                                            _mm256_storeu_ps(out + d + 16, a2);                                                           _mm256_storeu_ps(out + d + 24, a3);                                                           _mm256_storeu_ps(out + d + 32, a4);                                                           _mm256_storeu_ps(out + d + 40, a5);                                                           _mm256_storeu_ps(out + d + 48, a6);                                                           _mm256_storeu_ps(out + d + 56, a7);                                                       }                                                                                             for (; d + 8 <= n; d += 8) {                                                                      __m256 a0 = _mm256_loadu_ps(out + d);                                                         for (int i = 0; i < nr; i++)                                                                      a0 = _mm256_add_ps(a0, _mm256_mul_ps(_mm256_set1_ps(w[i]),                                                                         LOAD8((const T *)rows[i] + d)));                     _mm256_storeu_ps(out + d, a0);                                                            }

__attribute__((target("avx2,fma,f16c"))) static void avx2_wsum_rows(float *out, const float *w,
                                                                     const void *const *rows,
                                                                     int nr, size_t n, int f16) {
    size_t d = 0;
    if (f16) {
        AVX2_WSUM_STRIP(AVX_LOAD_F16, uint16_t)
    } else {
        AVX2_WSUM_STRIP(AVX_LOAD_F32, float)
    }
    wsum_rows_tail(out, w, rows, nr, d, n, f16);
}

/* ---- attention's softmax exponent (kernel_table.h colibri_exp_one, lane by lane) ---------- */

__attribute__((target("avx2,fma"))) static __m256 avx2_exp8(__m256 v) {
    __m256 t = _mm256_mul_ps(v, _mm256_set1_ps(CEXP_LOG2E));
    __m256 n = _mm256_add_ps(t, _mm256_set1_ps(CEXP_SHIFT));
    n = _mm256_sub_ps(n, _mm256_set1_ps(CEXP_SHIFT));
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-CEXP_LN2_HI), v);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-CEXP_LN2_LO), r);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(CEXP_P0), r, _mm256_set1_ps(CEXP_P1));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CEXP_P2));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CEXP_P3));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CEXP_P4));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(CEXP_P5));
    __m256 y = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
    y = _mm256_add_ps(y, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    y = _mm256_mul_ps(y, _mm256_castsi256_ps(e));
    /* the scalar's cases: NaN stays, below the range (and -inf) 0, above it infinity */
    y = _mm256_and_ps(y, _mm256_cmp_ps(v, _mm256_set1_ps(CEXP_LO), _CMP_GE_OQ));
    y = _mm256_blendv_ps(y, _mm256_set1_ps(INFINITY), _mm256_cmp_ps(v, _mm256_set1_ps(CEXP_HI), _CMP_GT_OQ));
    return _mm256_blendv_ps(y, v, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

__attribute__((target("avx2,fma"))) static float avx2_exp_sum(float *x, size_t n, float sub) {
    const __m256 vs = _mm256_set1_ps(sub);
    __m256 acc = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 e = avx2_exp8(_mm256_sub_ps(_mm256_loadu_ps(x + i), vs));
        _mm256_storeu_ps(x + i, e);
        acc = _mm256_add_ps(acc, e);
    }
    float t[8], s;
    AVX2_HSUM(acc, t, s);
    for (; i < n; i++) {
        x[i] = colibri_exp_one(x[i] - sub);
        s += x[i];
    }
    return s;
}

/* ---- int8 activations (int8.h): the scalar quantisation's bits, 16 or 8 values at a time ----
 * max |x| is exact in any order; x * inv, the round to nearest even (vrndscaleps / vroundps with
 * the current rounding mode's nearest, as nearbyintf) and the clamp are elementwise. */
__attribute__((target(AVX512_TARGET))) static void z_quantize(const float *x, size_t n, int8_t *q,
                                                              float *scale) {
    __m512 m = _mm512_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= n; i += 16) m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x + i)), m);
    float amax = _mm512_reduce_max_ps(m);
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    float inv, s = q8_scale(amax, &inv);
    const __m512 vi = _mm512_set1_ps(inv), hi = _mm512_set1_ps(127.0f), lo = _mm512_set1_ps(-127.0f);
    for (i = 0; i + 16 <= n; i += 16) {
        __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), vi),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_max_ps(_mm512_min_ps(v, hi), lo);
        _mm_storeu_si128((__m128i *)(void *)(q + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(v)));
    }
    _mm256_zeroupper();
    for (; i < n; i++) q[i] = q8_one(x[i] * inv);
    *scale = s;
}

__attribute__((target("avx2,fma,f16c"))) static void avx2_quantize(const float *x, size_t n,
                                                                    int8_t *q, float *scale) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 m = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)), m);
    float t[8], amax = 0.0f;
    _mm256_storeu_ps(t, m);
    for (int l = 0; l < 8; l++) amax = t[l] > amax ? t[l] : amax;
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    float inv, s = q8_scale(amax, &inv);
    const __m256 vi = _mm256_set1_ps(inv), hi = _mm256_set1_ps(127.0f), lo = _mm256_set1_ps(-127.0f);
    for (i = 0; i + 8 <= n; i += 8) {
        __m256 v = _mm256_round_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), vi),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm256_max_ps(_mm256_min_ps(v, hi), lo);
        __m256i w = _mm256_cvtps_epi32(v); /* integral values in [-127, 127]: exact */
        __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(w, w), _mm256_setzero_si256());
        int32_t lo4 = _mm_cvtsi128_si32(_mm256_castsi256_si128(b));
        int32_t hi4 = _mm_cvtsi128_si32(_mm256_extracti128_si256(b, 1));
        memcpy(q + i, &lo4, 4);
        memcpy(q + i + 4, &hi4, 4);
    }
    _mm256_zeroupper();
    for (; i < n; i++) q[i] = q8_one(x[i] * inv);
    *scale = s;
}

void colibri_x86_kernels(colibri_cpu_kernels *k) {
    int x86 = colibri_x86_features();
    if (x86 & COLIBRI_X86_AVX2) {
        k->dot[COLIBRI_DT_F32] = avx2_dot_f32;
        k->dot[COLIBRI_DT_F16] = avx2_dot_f16;
        k->dot[COLIBRI_DT_BF16] = avx2_dot_bf16;
        k->dot[COLIBRI_DT_INT8] = avx2_dot_i8;
        k->dot4[COLIBRI_DT_F32] = avx2_dot4_f32;
        k->dot4[COLIBRI_DT_F16] = avx2_dot4_f16;
        k->dot4[COLIBRI_DT_BF16] = avx2_dot4_bf16;
        k->dot4[COLIBRI_DT_INT8] = avx2_dot4_i8;
        k->dot_q8 = avx2_dot_q8;
        k->dot4_q8 = avx2_dot4_q8;
        k->convert = avx2_convert;
        k->tile_2x3 = avx2_tile_2x3;
        k->tile_q8 = avx2_q8_tile; /* AVX-512 VNNI replaces it below */
        k->to_f16 = avx2_to_f16;
        k->axpy_f16 = avx2_axpy_f16;
        k->wsum_rows = avx2_wsum_rows;
        k->scores = avx2_scores;
        k->exp_sum = avx2_exp_sum;
        k->quantize = avx2_quantize;
        k->name = "avx2";
        if (x86 & COLIBRI_X86_AVX512) {
            /* decode keeps the AVX2 streams: bound by memory, the 16-lane version measured
             * the same (f32 16.2 vs 14.8, f16 29.4 vs 32.3 GFLOP/s on L3-resident rows) */
            k->tile = z_tile;
            k->quantize = z_quantize;
            k->name = "avx512";
            if (x86 & COLIBRI_X86_VNNI) { /* prefill only: for one token the weight-sum term makes it slower
                         * than avx2_dot4_q8 (50 vs 60 GOP/s on L3-resident rows, Ice Lake) */
                k->tile_q8 = z_q8_tile;
                k->rows_q8_packed = zp_i8_rows;
                k->name = "avx512-vnni";
            }
        }
    }
}
#else
void colibri_x86_kernels(colibri_cpu_kernels *k) { (void)k; }
#endif
