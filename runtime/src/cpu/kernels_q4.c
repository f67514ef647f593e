/* CPU kernels for the grouped 4-bit weights (q4, docs/format.md): y = W x with W stored as
 * groups of 32 nibbles and one f16 scale d per group, w = (nibble - 8) * d.
 *
 * The q4 lane layout. Every implementation (scalar, AVX2+FMA+F16C, NEON) computes one row dot as
 * 32 lanes: lane l accumulates w[32b + l] * x[32b + l] over the full groups b in order with a fused
 * multiply-add; then u[l] = (L[l] + L[8 + l]) + (L[16 + l] + L[24 + l]) for l < 8, the sum
 * ((u0 + u1) + (u2 + u3)) + ((u4 + u5) + (u6 + u7)), plus the tail columns past the last full
 * group accumulated one by one (fused) from 0. Dequantising (nibble - 8) * d is exact in f32 (a
 * 4-bit integer times an 11-bit mantissa), so:
 * - decode (weights dequantised in registers) and prefill (a row dequantised once into scratch,
 *   then dotted with each token) give the same bits: prefill == decode;
 * - the x86_64 and aarch64 builds give the same bits too (checked under qemu-aarch64);
 * - each output is computed start to finish by one thread: any thread count, same bits.
 * Kept apart from kernels.c (the f32/f16/bf16/int8 kernels) so that each can change alone. */
#include "kernels_q4.h"

#include "core/half.h"
#include "cpu_features.h"
#include "int8.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define Q4_HAVE_AVX2 1
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#define Q4_HAVE_NEON 1
#include <arm_neon.h>
#endif

/* Decode look-ahead (a prefetch never faults). Farther than kernels.c's 2 KiB: a q4 row is a
 * quarter of an int8 one, so the same bytes ahead cover four times fewer cycles of work.
 * Measured (2-vCPU EPYC, int8-act q4 decode, interleaved A/B): 1 KiB 111-119 tok/s, 4 KiB
 * 135-144. */
#define Q4_PREFETCH_BYTES 4096

typedef float (*q4_dot_fn)(const uint8_t *q, const uint16_t *d, const float *x, size_t cols);
typedef float (*f32_dot_fn)(const float *w, const float *x, size_t cols);
typedef void (*f32_dot3_fn)(const float *w, const float *const x[3], size_t cols, float out[3]);
typedef float (*q4q8_dot_fn)(const uint8_t *q, const uint16_t *d, const int8_t *x, size_t cols);

static struct {
    q4_dot_fn dot;     /* one q4 row . x */
    f32_dot_fn dot_f32; /* one dequantised row . x, same lane layout */
    f32_dot3_fn dot3_f32; /* one dequantised row . three tokens: each with dot_f32's operations */
    q4q8_dot_fn dot_q8; /* one q4 row . int8 activations (without the activation scale) */
    /* Optional faster shapes (NULL: the loops use the functions above); each gives, per output,
     * the bits of the one-row function it replaces. */
    void (*row_full_groups)(const uint8_t *q, const uint16_t *d, size_t full, float *out);
    void (*f32_tile_2x4)(const float *const w[2], const float *const x[4], size_t cols, float out[8]);
    void (*q4q8_4x1)(const uint8_t *const q[4], const uint16_t *const d[4], const int8_t *const x[1],
                     size_t cols, float out[4]);
    void (*q4q8_2x3)(const uint8_t *const q[2], const uint16_t *const d[2], const int8_t *const x[3],
                     size_t cols, float out[6]);
    const char *name;
} Q;

/* Element i (< 32) of a group's 16 nibble bytes, as the signed 4-bit value. */
static int q4_nib(const uint8_t *blk, size_t i) {
    return i < 16 ? (blk[i] & 15) - 8 : (blk[i - 16] >> 4) - 8;
}

/* The layout's fixed reduction of the 32 lanes. */
static float q4_reduce(const float L[32]) {
    float u[8];
    for (int l = 0; l < 8; l++) u[l] = (L[l] + L[8 + l]) + (L[16 + l] + L[24 + l]);
    return ((u[0] + u[1]) + (u[2] + u[3])) + ((u[4] + u[5]) + (u[6] + u[7]));
}

/* Tail columns (past the last full group) of a q4 row: dequantise and accumulate one by one. */
static float q4_tail(const uint8_t *q, const uint16_t *d, const float *x, size_t cols) {
    size_t full = cols / 32, i0 = full * 32;
    float t = 0.0f;
    if (i0 == cols) return 0.0f;
    float dd = half_to_float(d[full]);
    for (size_t i = i0; i < cols; i++)
        t = fmaf((float)q4_nib(q + full * 16, i - i0) * dd, x[i], t);
    return t;
}

static float f32_tail(const float *w, const float *x, size_t cols) {
    float t = 0.0f;
    for (size_t i = cols / 32 * 32; i < cols; i++) t = fmaf(w[i], x[i], t);
    return t;
}

/* ---- scalar ---------------------------------------------------------------------------------- */

static float scalar_q4_dot(const uint8_t *q, const uint16_t *d, const float *x, size_t cols) {
    float L[32] = {0};
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        float dd = half_to_float(d[b]);
        for (int l = 0; l < 32; l++)
            L[l] = fmaf((float)q4_nib(q + b * 16, (size_t)l) * dd, x[b * 32 + (size_t)l], L[l]);
    }
    return q4_reduce(L) + q4_tail(q, d, x, cols);
}

static float scalar_f32_dot(const float *w, const float *x, size_t cols) {
    float L[32] = {0};
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++)
        for (int l = 0; l < 32; l++) L[l] = fmaf(w[b * 32 + (size_t)l], x[b * 32 + (size_t)l], L[l]);
    return q4_reduce(L) + f32_tail(w, x, cols);
}

/* q4 x int8 activations (--int8-act). Integer sums are exact, so the layout is: per full group
 * b, eight lane sums S[l] = sum of q * x over elements 4l..4l+3 (int32), L[l] = fma(d_b, S[l],
 * L[l]); then ((L0 + L1) + (L2 + L3)) + ((L4 + L5) + (L6 + L7)) plus d_tail * (the tail's
 * integer sum). The caller multiplies by the activation scale. */
static float q4q8_tail(const uint8_t *q, const uint16_t *d, const int8_t *x, size_t cols) {
    size_t full = cols / 32, i0 = full * 32;
    if (i0 == cols) return 0.0f;
    int32_t t = 0;
    for (size_t i = i0; i < cols; i++) t += q4_nib(q + full * 16, i - i0) * (int32_t)x[i];
    return half_to_float(d[full]) * (float)t;
}

static float q4q8_reduce(const float L[8]) {
    return ((L[0] + L[1]) + (L[2] + L[3])) + ((L[4] + L[5]) + (L[6] + L[7]));
}

static float scalar_q4q8_dot(const uint8_t *q, const uint16_t *d, const int8_t *x, size_t cols) {
    float L[8] = {0};
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        float dd = half_to_float(d[b]);
        for (int l = 0; l < 8; l++) {
            int32_t s = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++)
                s += q4_nib(q + b * 16, (size_t)e) * (int32_t)x[b * 32 + (size_t)e];
            L[l] = fmaf(dd, (float)s, L[l]);
        }
    }
    return q4q8_reduce(L) + q4q8_tail(q, d, x, cols);
}

static void scalar_f32_dot3(const float *w, const float *const x[3], size_t cols, float out[3]) {
    for (int j = 0; j < 3; j++) out[j] = Q.dot_f32(w, x[j], cols);
}

/* ---- AVX2 + FMA + F16C: four 8-lane accumulators = lanes 0-7, 8-15, 16-23, 24-31 ------------ */

#ifdef Q4_HAVE_AVX2
#define Q4_AVX2 __attribute__((target("avx2,fma,f16c")))
/* Every AVX2 function clears the upper register halves (vzeroupper) before it calls or returns
 * to code compiled without AVX (the tails, the row loops): the compiler does not insert it
 * here, and the first SSE instruction after 256-bit work with dirty upper halves stalled for
 * the whole function's worth of time (perf: 22% of an int8-act q4 run in q4q8_tail's first
 * instruction, 27% on avx2_q4q8_dot's ret). */

static inline Q4_AVX2 float avx2_reduce(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 u = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float t[8];
    _mm256_storeu_ps(t, u);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

static Q4_AVX2 float avx2_q4_dot(const uint8_t *q, const uint16_t *d, const float *x, size_t cols) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const __m128i m4 = _mm_set1_epi8(0x0f), k8 = _mm_set1_epi8(8);
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __builtin_prefetch(q + b * 16 + Q4_PREFETCH_BYTES);
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(q + b * 16));
        __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m4), k8);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m4), k8);
        __m256 vd = _mm256_set1_ps(_cvtsh_ss(d[b]));
        const float *xb = x + b * 32;
        __m256 w0 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), vd);
        __m256 w1 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), vd);
        __m256 w2 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), vd);
        __m256 w3 = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), vd);
        a0 = _mm256_fmadd_ps(w0, _mm256_loadu_ps(xb), a0);
        a1 = _mm256_fmadd_ps(w1, _mm256_loadu_ps(xb + 8), a1);
        a2 = _mm256_fmadd_ps(w2, _mm256_loadu_ps(xb + 16), a2);
        a3 = _mm256_fmadd_ps(w3, _mm256_loadu_ps(xb + 24), a3);
    }
    float s = avx2_reduce(a0, a1, a2, a3);
    _mm256_zeroupper();
    return s + q4_tail(q, d, x, cols);
}

static Q4_AVX2 float avx2_f32_dot(const float *w, const float *x, size_t cols) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        const float *wb = w + b * 32, *xb = x + b * 32;
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(wb), _mm256_loadu_ps(xb), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(wb + 8), _mm256_loadu_ps(xb + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(wb + 16), _mm256_loadu_ps(xb + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(wb + 24), _mm256_loadu_ps(xb + 24), a3);
    }
    float s = avx2_reduce(a0, a1, a2, a3);
    _mm256_zeroupper();
    return s + f32_tail(w, x, cols);
}

/* Prefill: the row's weights loaded once for three tokens; 12 accumulators, each (token, lane
 * group) with exactly avx2_f32_dot's operations, so the bits equal three calls of it. */
static Q4_AVX2 void avx2_f32_dot3(const float *w, const float *const x[3], size_t cols,
                                  float out[3]) {
    __m256 a[3][4];
    for (int j = 0; j < 3; j++)
        for (int k = 0; k < 4; k++) a[j][k] = _mm256_setzero_ps();
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++)
        for (int k = 0; k < 4; k++) {
            __m256 wv = _mm256_loadu_ps(w + b * 32 + 8 * k);
            for (int j = 0; j < 3; j++)
                a[j][k] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x[j] + b * 32 + 8 * k), a[j][k]);
        }
    for (int j = 0; j < 3; j++) out[j] = avx2_reduce(a[j][0], a[j][1], a[j][2], a[j][3]);
    _mm256_zeroupper();
    for (int j = 0; j < 3; j++) out[j] += f32_tail(w, x[j], cols);
}

/* q4 x int8: the 32 nibbles of a group as signed bytes in element order, then maddubs/madd
 * (|q| <= 8, |x| <= 127: no int16 saturation) give the eight 4-element lane sums. */
static Q4_AVX2 float avx2_q4q8_dot(const uint8_t *q, const uint16_t *d, const int8_t *x,
                                   size_t cols) {
    __m256 acc = _mm256_setzero_ps();
    const __m128i m4 = _mm_set1_epi8(0x0f);
    const __m256i k8 = _mm256_set1_epi8(8), ones = _mm256_set1_epi16(1);
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __builtin_prefetch(q + b * 16 + Q4_PREFETCH_BYTES);
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(q + b * 16));
        __m256i qv = _mm256_sub_epi8(
            _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4)), k8);
        __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(x + b * 32));
        __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(qv), _mm256_sign_epi8(xv, qv));
        __m256 sums = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(d[b])), sums, acc);
    }
    float t[8];
    _mm256_storeu_ps(t, acc);
    _mm256_zeroupper();
    return q4q8_reduce(t) + q4q8_tail(q, d, x, cols);
}

/* A row dequantised to f32 (exact, the same values as the scalar q4_nib * d): the prefill's
 * scratch row. The tail past the last full group is left to colibri_q4_row_f32's scalar loop. */
static Q4_AVX2 void avx2_q4_row_full_groups(const uint8_t *q, const uint16_t *d, size_t full,
                                            float *out) {
    const __m128i m4 = _mm_set1_epi8(0x0f), k8 = _mm_set1_epi8(8);
    for (size_t b = 0; b < full; b++) {
        __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(q + b * 16));
        __m128i lo = _mm_sub_epi8(_mm_and_si128(v, m4), k8);
        __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(v, 4), m4), k8);
        __m256 vd = _mm256_set1_ps(_cvtsh_ss(d[b]));
        float *o = out + b * 32;
        _mm256_storeu_ps(o, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), vd));
        _mm256_storeu_ps(o + 8, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8))), vd));
        _mm256_storeu_ps(o + 16, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), vd));
        _mm256_storeu_ps(o + 24, _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8))), vd));
    }
    _mm256_zeroupper();
}

/* Prefill: two dequantised rows against four tokens. The layout's lane group k (lanes 8k..8k+7)
 * accumulates independently of the others, so the loop runs one lane group at a time over all
 * blocks: 8 accumulators live instead of 32, two weight and four token loads per eight fused
 * multiply-adds. Each (row, token, lane) sees exactly avx2_f32_dot's operations in its order, so
 * out[r * 4 + j] has the bits of avx2_f32_dot(w[r], x[j]) (and so of decode's avx2_q4_dot). */
static Q4_AVX2 void avx2_f32_tile_2x4(const float *const w[2], const float *const x[4],
                                      size_t cols, float out[8]) {
    __m256 part[2][4][4];
    size_t full = cols / 32;
    for (int k = 0; k < 4; k++) {
        __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
        __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        const float *w0 = w[0] + 8 * k, *w1 = w[1] + 8 * k;
        const float *x0 = x[0] + 8 * k, *x1 = x[1] + 8 * k, *x2 = x[2] + 8 * k, *x3 = x[3] + 8 * k;
        for (size_t b = 0; b < full; b++) {
            size_t o = b * 32;
            __m256 v0 = _mm256_loadu_ps(w0 + o), v1 = _mm256_loadu_ps(w1 + o);
            __m256 t = _mm256_loadu_ps(x0 + o);
            a00 = _mm256_fmadd_ps(v0, t, a00);
            a10 = _mm256_fmadd_ps(v1, t, a10);
            t = _mm256_loadu_ps(x1 + o);
            a01 = _mm256_fmadd_ps(v0, t, a01);
            a11 = _mm256_fmadd_ps(v1, t, a11);
            t = _mm256_loadu_ps(x2 + o);
            a02 = _mm256_fmadd_ps(v0, t, a02);
            a12 = _mm256_fmadd_ps(v1, t, a12);
            t = _mm256_loadu_ps(x3 + o);
            a03 = _mm256_fmadd_ps(v0, t, a03);
            a13 = _mm256_fmadd_ps(v1, t, a13);
        }
        part[0][0][k] = a00, part[0][1][k] = a01, part[0][2][k] = a02, part[0][3][k] = a03;
        part[1][0][k] = a10, part[1][1][k] = a11, part[1][2][k] = a12, part[1][3][k] = a13;
    }
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++)
            out[r * 4 + j] = avx2_reduce(part[r][j][0], part[r][j][1], part[r][j][2], part[r][j][3]);
    _mm256_zeroupper();
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++) out[r * 4 + j] += f32_tail(w[r], x[j], cols);
}

/* q4 x int8, several rows and tokens at once. Per group the nibbles are used unsigned (0..15)
 * by maddubs, and 8 * (the token's 4-element lane sums), computed once per token and group, is
 * subtracted: the same exact int32 lane sums as avx2_q4q8_dot's signed form, then the same
 * fma(d_b, S, L) chain per (row, token), so every output has avx2_q4q8_dot's bits. Several rows
 * give several independent chains (one row alone waits on the FMA latency every group) and
 * share the token loads; several tokens share the row's unpacking. Written out with named
 * accumulators: with arrays and loops GCC kept them in memory (a store and a reload in every
 * chain step). */
#define Q4Q8_INLINE static inline __attribute__((always_inline, target("avx2,fma,f16c")))

Q4Q8_INLINE __m256i q4q8_unpack(const uint8_t *blk) { /* 32 nibbles 0..15, element order */
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)blk);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m4), _mm_and_si128(v, m4));
}

Q4Q8_INLINE __m256i q4q8_lane_sums(__m256i u, __m256i x) { /* int32 sums of u * x, 4 bytes each */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

Q4Q8_INLINE __m256 q4q8_step(__m256i w, __m256i x, __m256i x8, __m256 vd, __m256 acc) {
    return _mm256_fmadd_ps(vd, _mm256_cvtepi32_ps(_mm256_sub_epi32(q4q8_lane_sums(w, x), x8)), acc);
}

Q4Q8_INLINE __m256 q4q8_scale(const uint16_t *d, size_t b) {
    return _mm256_set1_ps(_cvtsh_ss(d[b]));
}

static Q4_AVX2 void avx2_q4q8_tile_4x1(const uint8_t *const q[4], const uint16_t *const d[4],
                                       const int8_t *const x[1], size_t cols, float out[4]) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const __m256i eight = _mm256_set1_epi8(8);
    const uint8_t *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(x[0] + b * 32));
        __m256i x8 = q4q8_lane_sums(eight, xv);
        __builtin_prefetch(q0 + b * 16 + Q4_PREFETCH_BYTES);
        __builtin_prefetch(q2 + b * 16 + Q4_PREFETCH_BYTES);
        a0 = q4q8_step(q4q8_unpack(q0 + b * 16), xv, x8, q4q8_scale(d[0], b), a0);
        a1 = q4q8_step(q4q8_unpack(q1 + b * 16), xv, x8, q4q8_scale(d[1], b), a1);
        a2 = q4q8_step(q4q8_unpack(q2 + b * 16), xv, x8, q4q8_scale(d[2], b), a2);
        a3 = q4q8_step(q4q8_unpack(q3 + b * 16), xv, x8, q4q8_scale(d[3], b), a3);
    }
    float t[4][8];
    _mm256_storeu_ps(t[0], a0);
    _mm256_storeu_ps(t[1], a1);
    _mm256_storeu_ps(t[2], a2);
    _mm256_storeu_ps(t[3], a3);
    _mm256_zeroupper();
    for (int r = 0; r < 4; r++) out[r] = q4q8_reduce(t[r]) + q4q8_tail(q[r], d[r], x[0], cols);
}

static Q4_AVX2 void avx2_q4q8_tile_2x3(const uint8_t *const q[2], const uint16_t *const d[2],
                                       const int8_t *const x[3], size_t cols, float out[6]) {
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a10 = a00, a11 = a00, a12 = a00;
    const __m256i eight = _mm256_set1_epi8(8);
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __m256i x0 = _mm256_loadu_si256((const __m256i *)(const void *)(x[0] + b * 32));
        __m256i x1 = _mm256_loadu_si256((const __m256i *)(const void *)(x[1] + b * 32));
        __m256i x2 = _mm256_loadu_si256((const __m256i *)(const void *)(x[2] + b * 32));
        __m256i s0 = q4q8_lane_sums(eight, x0), s1 = q4q8_lane_sums(eight, x1),
                s2 = q4q8_lane_sums(eight, x2);
        __m256i w = q4q8_unpack(q[0] + b * 16);
        __m256 vd = q4q8_scale(d[0], b);
        a00 = q4q8_step(w, x0, s0, vd, a00);
        a01 = q4q8_step(w, x1, s1, vd, a01);
        a02 = q4q8_step(w, x2, s2, vd, a02);
        w = q4q8_unpack(q[1] + b * 16);
        vd = q4q8_scale(d[1], b);
        a10 = q4q8_step(w, x0, s0, vd, a10);
        a11 = q4q8_step(w, x1, s1, vd, a11);
        a12 = q4q8_step(w, x2, s2, vd, a12);
    }
    float t[6][8];
    _mm256_storeu_ps(t[0], a00);
    _mm256_storeu_ps(t[1], a01);
    _mm256_storeu_ps(t[2], a02);
    _mm256_storeu_ps(t[3], a10);
    _mm256_storeu_ps(t[4], a11);
    _mm256_storeu_ps(t[5], a12);
    _mm256_zeroupper();
    for (int k = 0; k < 6; k++) out[k] = q4q8_reduce(t[k]) + q4q8_tail(q[k / 3], d[k / 3], x[k % 3], cols);
}

#endif

/* ---- NEON: eight 4-lane accumulators A0..A7 = lanes 0-3, 4-7, ..., 28-31 ------------------- */

#ifdef Q4_HAVE_NEON
/* u[0..3] = (A0 + A2) + (A4 + A6), u[4..7] = (A1 + A3) + (A5 + A7): the layout's reduction. */
static float neon_reduce(const float32x4_t A[8]) {
    float32x4_t ul = vaddq_f32(vaddq_f32(A[0], A[2]), vaddq_f32(A[4], A[6]));
    float32x4_t uh = vaddq_f32(vaddq_f32(A[1], A[3]), vaddq_f32(A[5], A[7]));
    return ((vgetq_lane_f32(ul, 0) + vgetq_lane_f32(ul, 1)) +
            (vgetq_lane_f32(ul, 2) + vgetq_lane_f32(ul, 3))) +
           ((vgetq_lane_f32(uh, 0) + vgetq_lane_f32(uh, 1)) +
            (vgetq_lane_f32(uh, 2) + vgetq_lane_f32(uh, 3)));
}

/* A group's 16 nibble bytes as signed 4-bit values: lo = elements 0..15, hi = 16..31. */
static inline void neon_q4_unpack(const uint8_t *blk, int8x16_t *lo, int8x16_t *hi) {
    const uint8x16_t v = vld1q_u8(blk);
    *lo = vsubq_s8(vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(0x0f))), vdupq_n_s8(8));
    *hi = vsubq_s8(vreinterpretq_s8_u8(vshrq_n_u8(v, 4)), vdupq_n_s8(8));
}

static float neon_q4_dot(const uint8_t *q, const uint16_t *d, const float *x, size_t cols) {
    float32x4_t A[8];
    for (int k = 0; k < 8; k++) A[k] = vdupq_n_f32(0);
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __builtin_prefetch(q + b * 16 + Q4_PREFETCH_BYTES);
        int8x16_t lo, hi;
        neon_q4_unpack(q + b * 16, &lo, &hi);
        float dd = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(d[b]))), 0);
        int16x8_t h[4] = {vmovl_s8(vget_low_s8(lo)), vmovl_s8(vget_high_s8(lo)),
                          vmovl_s8(vget_low_s8(hi)), vmovl_s8(vget_high_s8(hi))};
        const float *xb = x + b * 32;
        for (int k = 0; k < 4; k++) {
            float32x4_t wl = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(h[k]))), dd);
            float32x4_t wh = vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(h[k]))), dd);
            A[2 * k] = vfmaq_f32(A[2 * k], wl, vld1q_f32(xb + 8 * k));
            A[2 * k + 1] = vfmaq_f32(A[2 * k + 1], wh, vld1q_f32(xb + 8 * k + 4));
        }
    }
    return neon_reduce(A) + q4_tail(q, d, x, cols);
}

/* Prefill: three tokens per row load; 24 accumulators, each as in neon_f32_dot. */
static void neon_f32_dot3(const float *w, const float *const x[3], size_t cols, float out[3]) {
    float32x4_t A[3][8];
    for (int j = 0; j < 3; j++)
        for (int k = 0; k < 8; k++) A[j][k] = vdupq_n_f32(0);
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++)
        for (int k = 0; k < 8; k++) {
            float32x4_t wv = vld1q_f32(w + b * 32 + 4 * k);
            for (int j = 0; j < 3; j++)
                A[j][k] = vfmaq_f32(A[j][k], wv, vld1q_f32(x[j] + b * 32 + 4 * k));
        }
    for (int j = 0; j < 3; j++) out[j] = neon_reduce(A[j]) + f32_tail(w, x[j], cols);
}

/* q4 x int8, shared by the vmull and SDOT kernels: a group's eight integer lane sums S[l] (s0:
 * lanes 0-3, s1: 4-7) scaled into the lane accumulators, L[l] = fma(d_b, S[l], L[l]) ... */
static inline void neon_q4q8_scale_add(int32x4_t s0, int32x4_t s1, uint16_t d, float32x4_t *lo,
                                       float32x4_t *hi) {
    float dd = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(d))), 0);
    *lo = vfmaq_n_f32(*lo, vcvtq_f32_s32(s0), dd);
    *hi = vfmaq_n_f32(*hi, vcvtq_f32_s32(s1), dd);
}

/* ... then the layout's fixed reduction and the tail. */
static inline float neon_q4q8_finish(float32x4_t lo, float32x4_t hi, const uint8_t *q,
                                     const uint16_t *d, const int8_t *x, size_t cols) {
    float t[8];
    vst1q_f32(t, lo);
    vst1q_f32(t + 4, hi);
    return q4q8_reduce(t) + q4q8_tail(q, d, x, cols);
}

/* q4 x int8: products widened to 16 bits, then pairwise adds give the 4-element lane sums. */
static float neon_q4q8_dot(const uint8_t *q, const uint16_t *d, const int8_t *x, size_t cols) {
    float32x4_t lo = vdupq_n_f32(0), hi = lo;
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __builtin_prefetch(q + b * 16 + Q4_PREFETCH_BYTES);
        int8x16_t ql, qh;
        neon_q4_unpack(q + b * 16, &ql, &qh);
        int8x16_t xl = vld1q_s8(x + b * 32), xh = vld1q_s8(x + b * 32 + 16);
        int32x4_t s0 = vpaddq_s32(vpaddlq_s16(vmull_s8(vget_low_s8(ql), vget_low_s8(xl))),
                                  vpaddlq_s16(vmull_s8(vget_high_s8(ql), vget_high_s8(xl))));
        int32x4_t s1 = vpaddq_s32(vpaddlq_s16(vmull_s8(vget_low_s8(qh), vget_low_s8(xh))),
                                  vpaddlq_s16(vmull_s8(vget_high_s8(qh), vget_high_s8(xh))));
        neon_q4q8_scale_add(s0, s1, d[b], &lo, &hi);
    }
    return neon_q4q8_finish(lo, hi, q, d, x, cols);
}

#if defined(__ARM_FEATURE_DOTPROD) || defined(COLIBRI_ARM_TARGET_ATTR)
#define Q4_HAVE_SDOT 1
/* The same with SDOT (chosen at run time, as in kernels.c): lane l of vdotq_s32 is the sum of
 * products 4l..4l+3, exactly the layout's integer lane sums S[l] (exact: the same integers as
 * the vmull/vpaddl route), so the bits equal neon_q4q8_dot's and the scalar layout's. */
SDOT_FN static float neon_sdot_q4q8_dot(const uint8_t *q, const uint16_t *d, const int8_t *x,
                                        size_t cols) {
    float32x4_t lo = vdupq_n_f32(0), hi = lo;
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __builtin_prefetch(q + b * 16 + Q4_PREFETCH_BYTES);
        int8x16_t ql, qh;
        neon_q4_unpack(q + b * 16, &ql, &qh);
        int32x4_t s0 = vdotq_s32(vdupq_n_s32(0), ql, vld1q_s8(x + b * 32));
        int32x4_t s1 = vdotq_s32(vdupq_n_s32(0), qh, vld1q_s8(x + b * 32 + 16));
        neon_q4q8_scale_add(s0, s1, d[b], &lo, &hi);
    }
    return neon_q4q8_finish(lo, hi, q, d, x, cols);
}
#endif

static float neon_f32_dot(const float *w, const float *x, size_t cols) {
    float32x4_t A[8];
    for (int k = 0; k < 8; k++) A[k] = vdupq_n_f32(0);
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++)
        for (int k = 0; k < 8; k++)
            A[k] = vfmaq_f32(A[k], vld1q_f32(w + b * 32 + 4 * k), vld1q_f32(x + b * 32 + 4 * k));
    return neon_reduce(A) + f32_tail(w, x, cols);
}
#endif

/* ---- selection and the row loops ------------------------------------------------------------ */

static pthread_once_t q4_once = PTHREAD_ONCE_INIT;

static void q4_pick(void) {
    Q.dot = scalar_q4_dot;
    Q.dot_f32 = scalar_f32_dot;
    Q.dot3_f32 = scalar_f32_dot3;
    Q.dot_q8 = scalar_q4q8_dot;
    Q.name = "scalar";
#ifdef Q4_HAVE_AVX2
    if (colibri_x86_features() & COLIBRI_X86_AVX2) {
        Q.dot = avx2_q4_dot;
        Q.dot_f32 = avx2_f32_dot;
        Q.dot3_f32 = avx2_f32_dot3;
        Q.dot_q8 = avx2_q4q8_dot;
        Q.row_full_groups = avx2_q4_row_full_groups;
        Q.f32_tile_2x4 = avx2_f32_tile_2x4;
        Q.q4q8_4x1 = avx2_q4q8_tile_4x1;
        Q.q4q8_2x3 = avx2_q4q8_tile_2x3;
        Q.name = "avx2";
    }
#endif
#ifdef Q4_HAVE_NEON
    Q.dot = neon_q4_dot;
    Q.dot_f32 = neon_f32_dot;
    Q.dot3_f32 = neon_f32_dot3;
    Q.dot_q8 = neon_q4q8_dot;
    Q.name = "neon";
#ifdef Q4_HAVE_SDOT
    if (colibri_arm_features() & COLIBRI_ARM_DOTPROD) {
        Q.dot_q8 = neon_sdot_q4q8_dot;
        Q.name = "neon-dotprod";
    }
#endif
#endif
}

const char *colibri_q4_kernels_init(void) {
    pthread_once(&q4_once, q4_pick);
    return Q.name;
}

void colibri_q4_row_f32(const colibri_tensor *w, uint32_t r, float *out) {
    colibri_q4_kernels_init();
    size_t cols = w->cols, ng = colibri_q4_groups(w->cols), g0 = 0;
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * ng * COLIBRI_Q4_BLOCK;
    const uint16_t *d = colibri_q4_scales(w) + (size_t)r * ng;
    if (Q.row_full_groups) {
        g0 = cols / 32;
        Q.row_full_groups(q, d, g0, out);
    }
    for (size_t g = g0; g * 32 < cols; g++) {
        float dd = half_to_float(d[g]);
        size_t m = cols - g * 32 < 32 ? cols - g * 32 : 32;
        for (size_t e = 0; e < m; e++) out[g * 32 + e] = (float)q4_nib(q + g * 16, e) * dd;
    }
}

void colibri_q4_rows_dot(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x, int n,
                         size_t ldx, float *y, size_t ldy, float *scratch) {
    colibri_q4_kernels_init();
    size_t cols = w->cols, ng = colibri_q4_groups(w->cols);
    const uint8_t *base = (const uint8_t *)w->data;
    const uint16_t *sc = colibri_q4_scales(w);
    if (n == 1) { /* decode: stream each row once, dequantising in registers */
        for (uint32_t r = r0; r < r1; r++)
            y[r] = Q.dot(base + (size_t)r * ng * COLIBRI_Q4_BLOCK, sc + (size_t)r * ng, x, cols);
        return;
    }
    if (Q.f32_tile_2x4) { /* two rows dequantised once (exact), then 2-row x 4-token tiles */
        for (uint32_t r = r0; r < r1; r += 2) {
            uint32_t rows = r1 - r < 2 ? r1 - r : 2;
            const float *wr[2] = {scratch, scratch + cols};
            colibri_q4_row_f32(w, r, scratch);
            if (rows == 2) colibri_q4_row_f32(w, r + 1, scratch + cols);
            else wr[1] = scratch; /* row r again, result unused */
            for (int j = 0; j < n; j += 4) {
                int nt = n - j < 4 ? n - j : 4;
                const float *xs[4];
                for (int t = 0; t < 4; t++) xs[t] = x + (size_t)(j + (t < nt ? t : 0)) * ldx;
                float o[8];
                Q.f32_tile_2x4(wr, xs, cols, o);
                for (uint32_t k = 0; k < rows; k++)
                    for (int t = 0; t < nt; t++) y[(size_t)(j + t) * ldy + r + k] = o[k * 4 + t];
            }
        }
        return;
    }
    /* several tokens: dequantise the row once (exact), then the same lane layout per token,
     * three tokens per pass over the row */
    for (uint32_t r = r0; r < r1; r++) {
        colibri_q4_row_f32(w, r, scratch);
        int j = 0;
        for (; j + 3 <= n; j += 3) {
            const float *xs[3] = {x + (size_t)j * ldx, x + (size_t)(j + 1) * ldx,
                                  x + (size_t)(j + 2) * ldx};
            float o[3];
            Q.dot3_f32(scratch, xs, cols, o);
            for (int t = 0; t < 3; t++) y[(size_t)(j + t) * ldy + r] = o[t];
        }
        for (; j < n; j++) y[(size_t)j * ldy + r] = Q.dot_f32(scratch, x + (size_t)j * ldx, cols);
    }
}

void colibri_q4_rows_dot_q8(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                            const float *xscale, int n, size_t ldx, float *y, size_t ldy) {
    colibri_q4_kernels_init();
    size_t cols = w->cols, ng = colibri_q4_groups(w->cols);
    const uint8_t *base = (const uint8_t *)w->data;
    const uint16_t *sc = colibri_q4_scales(w);
    size_t rowbytes = ng * COLIBRI_Q4_BLOCK;
    /* the same per-(row, token) operations for one token or many: prefill == decode */
    if (n == 1 && Q.q4q8_4x1) { /* decode: four rows at once */
        for (; r0 + 4 <= r1; r0 += 4) {
            const uint8_t *q[4];
            const uint16_t *d[4];
            for (int k = 0; k < 4; k++) {
                q[k] = base + (size_t)(r0 + k) * rowbytes;
                d[k] = sc + (size_t)(r0 + k) * ng;
            }
            float o[4];
            Q.q4q8_4x1(q, d, &xq, cols, o);
            for (int k = 0; k < 4; k++) y[r0 + k] = o[k] * xscale[0];
        }
    }
    if (n > 1 && Q.q4q8_2x3) { /* several tokens: 2-row x 3-token tiles */
        for (uint32_t r = r0; r < r1; r += 2) {
            uint32_t rows = r1 - r < 2 ? r1 - r : 2;
            const uint8_t *q[2];
            const uint16_t *d[2];
            for (uint32_t k = 0; k < 2; k++) { /* past the end: row r again, result unused */
                uint32_t rr = r + (k < rows ? k : 0);
                q[k] = base + (size_t)rr * rowbytes;
                d[k] = sc + (size_t)rr * ng;
            }
            for (int j = 0; j < n; j += 3) {
                int nt = n - j < 3 ? n - j : 3;
                const int8_t *xs[3];
                for (int t = 0; t < 3; t++) xs[t] = xq + (size_t)(j + (t < nt ? t : 0)) * ldx;
                float o[6];
                Q.q4q8_2x3(q, d, xs, cols, o);
                for (uint32_t k = 0; k < rows; k++)
                    for (int t = 0; t < nt; t++)
                        y[(size_t)(j + t) * ldy + r + k] = o[k * 3 + t] * xscale[j + t];
            }
        }
        return;
    }
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *q = base + (size_t)r * rowbytes;
        for (int j = 0; j < n; j++)
            y[(size_t)j * ldy + r] = Q.dot_q8(q, sc + (size_t)r * ng, xq + (size_t)j * ldx, cols) *
                                     xscale[j];
    }
}

/* ---- self-test (`colibri selftest`) ---------------------------------------------------------- */

int colibri_q4_selftest(char *msg, size_t len) {
    enum { COLS = 203, ROWS = 5, N = 4, NG = (COLS + 31) / 32 }; /* 6 full groups + an 11-column tail */
    uint8_t q[ROWS * NG * 16];
    uint16_t d[ROWS * NG];
    float x[N * COLS], y[N * ROWS], y1[N * ROWS], scratch[2 * COLS], row[COLS];
    uint32_t s = 7;
    for (size_t i = 0; i < sizeof q; i++) q[i] = (uint8_t)((s = s * 1664525u + 1013904223u) >> 24);
    for (int i = 0; i < ROWS * NG; i++) /* f16 scales in [2^-9, 2^-5), and one zero group */
        d[i] = i == 3 ? 0 : (uint16_t)(0x1800 + ((s = s * 1664525u + 1013904223u) >> 20) % 0x1000);
    for (int i = 0; i < N * COLS; i++)
        x[i] = (float)((int)((s = s * 1664525u + 1013904223u) >> 16) % 2001 - 1000) / 500.0f;
    colibri_tensor t = {q, (const float *)(const void *)d, COLIBRI_DT_Q4, ROWS, COLS};
    const char *name = colibri_q4_kernels_init();
    colibri_q4_rows_dot(&t, 0, ROWS, x, N, COLS, y, ROWS, scratch);
    int bad = 0, same = 1, layout = 1;
    for (int j = 0; j < N; j++) /* decode: one token over all rows (4-row tiles + the rest) */
        colibri_q4_rows_dot(&t, 0, ROWS, x + j * COLS, 1, COLS, y1 + j * ROWS, ROWS, scratch);
    for (uint32_t r = 0; r < ROWS; r++) {
        colibri_q4_row_f32(&t, r, row);
        for (int j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int c = 0; c < COLS; c++) {
                ref += (double)row[c] * x[j * COLS + c];
                mag += fabs((double)row[c] * x[j * COLS + c]);
            }
            if (fabs(y[j * ROWS + r] - ref) > 1e-5 * (mag + 1e-30)) bad++;
            /* decode (one token) gives the bits of prefill (n tokens) */
            same &= memcmp(&y1[j * ROWS + r], &y[j * ROWS + r], sizeof(float)) == 0;
            /* and the SIMD kernel gives the bits of the scalar one: one layout on every CPU */
            float sc = scalar_q4_dot(q + r * NG * 16, d + r * NG, x + j * COLS, COLS);
            layout &= memcmp(&sc, &y[j * ROWS + r], sizeof(float)) == 0;
        }
    }
    /* int8 activations: exact integer group sums, the scalar layout's bits, decode == prefill */
    int8_t xq[N * COLS];
    float xs[N];
    for (int j = 0; j < N; j++) colibri_quantize_row(x + j * COLS, COLS, xq + j * COLS, &xs[j]);
    colibri_q4_rows_dot_q8(&t, 0, ROWS, xq, xs, N, COLS, y, ROWS);
    for (int j = 0; j < N; j++)
        colibri_q4_rows_dot_q8(&t, 0, ROWS, xq + j * COLS, &xs[j], 1, COLS, y1 + j * ROWS, ROWS);
    int q8ok = 1;
    for (uint32_t r = 0; r < ROWS; r++)
        for (int j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int g = 0; g < NG; g++) {
                long isum = 0;
                for (int e = 0; e < 32 && g * 32 + e < COLS; e++)
                    isum += (long)q4_nib(q + (r * NG + (uint32_t)g) * 16, (size_t)e) *
                            xq[j * COLS + g * 32 + e];
                ref += (double)half_to_float(d[r * NG + (uint32_t)g]) * (double)isum;
                mag += fabs((double)half_to_float(d[r * NG + (uint32_t)g]) * (double)isum);
            }
            ref *= xs[j];
            mag *= xs[j];
            float sc = scalar_q4q8_dot(q + r * NG * 16, d + r * NG, xq + j * COLS, COLS) * xs[j];
            q8ok &= fabs(y[j * ROWS + r] - ref) <= 1e-5 * (mag + 1e-30) &&
                    memcmp(&sc, &y[j * ROWS + r], sizeof sc) == 0 &&
                    memcmp(&y1[j * ROWS + r], &y[j * ROWS + r], sizeof sc) == 0;
        }
    snprintf(msg, len, "q4 rows_dot (%s) == double reference; decode bits == prefill bits == scalar "
             "layout bits (f32 and int8 activations)", name);
    return bad == 0 && same && layout && q8ok;
}
