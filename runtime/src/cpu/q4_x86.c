/* The x86_64 q4 kernels (see q4_table.h; the lane layout: kernels_q4.c): AVX2+FMA+F16C, with
 * per-function target attributes, chosen at run time from the one CPU probe (cpu_features.c). */
#include "q4_table.h"
#include "q4_pack.h"
#include "cpu_features.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* ---- AVX2 + FMA + F16C: four 8-lane accumulators = lanes 0-7, 8-15, 16-23, 24-31 ------------ */

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


/* ---- AVX-512 (F/BW/VL, VNNI for int8 activations): the same layout, four rows per pass ------
 * Each lane chain of the layout is independent of the others and runs over the groups in order,
 * so it may sit in any lane of any register as long as it sees the same operations in the same
 * order; these kernels only rearrange which lane holds which chain:
 * - f32 activations: the 32 lanes of a row in two 16-lane registers (elements 0-15 = the low
 *   nibbles, 16-31 = the high ones). A group's dequantised weights come from a 16-entry table
 *   T[k] = (k - 8) * d (exact, as the scalar q4_nib * d) indexed by the nibbles (vpermps reads
 *   the low 4 bits of each index), then w * x + L fused, as the AVX2 and NEON kernels;
 * - int8 activations: the eight 4-element lane sums of four rows in two registers (lanes 0-3 of
 *   rows 0..3, then lanes 4-7). VNNI's vpdpbusd sums unsigned nibble x signed activation over 4
 *   bytes, exactly; the nibble offset 8 is taken out by starting from -8 * (the activations'
 *   4-element sums, once per call): the same int32 S[l] as the signed form, then fma(d_b, S[l],
 *   L[l]) as every other q4 x int8 kernel.
 * So the bits are those of the scalar layout (the self-test compares them), on any x86 level
 * and on aarch64. */
#define Q4_Z __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))
#define Q4_ZV __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")))
#define Q4_ZI static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

/* Rows [r, r + 4) of w, clamped to the last row (a repeated row's results are not stored). */
static void q4_rows4(const colibri_tensor *w, uint32_t r, uint32_t r1, const uint8_t *q[4],
                     const uint16_t *d[4]) {
    size_t ng = colibri_q4_groups(w->cols);
    for (uint32_t k = 0; k < 4; k++) {
        uint32_t rr = r + k < r1 ? r + k : r1 - 1;
        q[k] = (const uint8_t *)w->data + (size_t)rr * ng * COLIBRI_Q4_BLOCK;
        d[k] = colibri_q4_scales(w) + (size_t)rr * ng;
    }
}

/* The scales of groups [g, g + m) (m <= 16) of a row as f32. */
Q4_ZI __m512 zq_scales(const uint16_t *d, size_t g, size_t m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16((__mmask16)((1u << m) - 1), d + g));
}

/* f32 activations, rows q[0..3] (scales d) against NT tokens, lane half H (0: elements 0-15 of
 * every group, 1: 16-31): acc[r][t] = the half's 16 lane chains of (row r, token t). */
#define ZQ_F32(NAME, NT)                                                                      \
    Q4_Z static void NAME(const uint8_t *const q[4], const uint16_t *const d[4],            \
                           const float *x, size_t ldx, size_t full, int h, __m512 acc[4][6]) { \
        const __m512 iota8 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7); \
        for (int r = 0; r < 4; r++)                                                           \
            for (int t = 0; t < NT; t++) acc[r][t] = _mm512_setzero_ps();                    \
        for (size_t g = 0; g < full; g += 16) {                                               \
            size_t m = full - g < 16 ? full - g : 16;                                         \
            __m512 D[4];                                                                      \
            for (int r = 0; r < 4; r++) D[r] = zq_scales(d[r], g, m);                        \
            for (size_t b = 0; b < m; b++) {                                                  \
                const __m512i bi = _mm512_set1_epi32((int)b);                                 \
                __m512 wv[4];                                                                 \
                _Pragma("GCC unroll 4") for (int r = 0; r < 4; r++) {                         \
                    const uint8_t *blk = q[r] + (g + b) * 16;                                 \
                    if (!h && (b & 3) == 0) __builtin_prefetch(blk + Q4_PREFETCH_BYTES);      \
                    __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)blk)); \
                    if (h) z = _mm512_srli_epi32(z, 4);                                       \
                    __m512 T = _mm512_mul_ps(iota8, _mm512_permutexvar_ps(bi, D[r]));         \
                    wv[r] = _mm512_permutexvar_ps(z, T);                                      \
                }                                                                             \
                const float *xb = x + (g + b) * 32 + 16 * h;                                  \
                _Pragma("GCC unroll 6") for (int t = 0; t < NT; t++) {                        \
                    __m512 xv = _mm512_loadu_ps(xb + (size_t)t * ldx);                        \
                    acc[0][t] = _mm512_fmadd_ps(wv[0], xv, acc[0][t]);                        \
                    acc[1][t] = _mm512_fmadd_ps(wv[1], xv, acc[1][t]);                        \
                    acc[2][t] = _mm512_fmadd_ps(wv[2], xv, acc[2][t]);                        \
                    acc[3][t] = _mm512_fmadd_ps(wv[3], xv, acc[3][t]);                        \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }
ZQ_F32(zq_f32_2, 2)
ZQ_F32(zq_f32_3, 3)
ZQ_F32(zq_f32_4, 4)
ZQ_F32(zq_f32_5, 5)
ZQ_F32(zq_f32_6, 6)

/* Decode (one token): both lane halves in one pass over the rows, so each group's table and
 * nibbles are built once; the same per-lane operations as zq_f32_1 for h = 0 and 1. */
Q4_Z static void zq_f32_decode(const uint8_t *const q[4], const uint16_t *const d[4],
                               const float *x, size_t full, __m512 lo[4][6], __m512 hi[4][6]) {
    const __m512 iota8 = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    __m512 l0 = _mm512_setzero_ps(), l1 = l0, l2 = l0, l3 = l0, h0 = l0, h1 = l0, h2 = l0, h3 = l0;
    for (size_t g = 0; g < full; g += 16) {
        size_t m = full - g < 16 ? full - g : 16;
        /* the scales as f32 in memory: each group's is then a broadcast operand of the table's
         * multiply (a load), not a register permute on the shuffle ports the lookups need */
        float D[4][16];
        for (int r = 0; r < 4; r++) _mm512_storeu_ps(D[r], zq_scales(d[r], g, m));
        for (size_t b = 0; b < m; b++) {
            size_t o = (g + b) * 16;
            if ((b & 3) == 0) {
                __builtin_prefetch(q[0] + o + Q4_PREFETCH_BYTES);
                __builtin_prefetch(q[1] + o + Q4_PREFETCH_BYTES);
                __builtin_prefetch(q[2] + o + Q4_PREFETCH_BYTES);
                __builtin_prefetch(q[3] + o + Q4_PREFETCH_BYTES);
            }
            __m512 xl = _mm512_loadu_ps(x + (g + b) * 32), xh = _mm512_loadu_ps(x + (g + b) * 32 + 16);
#define ZQ_ROW(R, LO, HI)                                                                     \
    do {                                                                                      \
        __m512i z = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)(q[R] + o))); \
        __m512 T = _mm512_mul_ps(iota8, _mm512_set1_ps(D[R][b]));                             \
        LO = _mm512_fmadd_ps(_mm512_permutexvar_ps(z, T), xl, LO);                            \
        HI = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(z, 4), T), xh, HI);      \
    } while (0)
            ZQ_ROW(0, l0, h0);
            ZQ_ROW(1, l1, h1);
            ZQ_ROW(2, l2, h2);
            ZQ_ROW(3, l3, h3);
#undef ZQ_ROW
        }
    }
    lo[0][0] = l0, lo[1][0] = l1, lo[2][0] = l2, lo[3][0] = l3;
    hi[0][0] = h0, hi[1][0] = h1, hi[2][0] = h2, hi[3][0] = h3;
}

/* The layout's reduction of one (row, token): u = (L0-7 + L8-15) + (L16-23 + L24-31), then the
 * fixed horizontal sum, as avx2_reduce. */
Q4_ZI float zq_reduce32(__m512 lo, __m512 hi) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(lo), _mm512_extractf32x8_ps(lo, 1));
    __m256 b = _mm256_add_ps(_mm512_castps512_ps256(hi), _mm512_extractf32x8_ps(hi, 1));
    float t[8];
    _mm256_storeu_ps(t, _mm256_add_ps(a, b));
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

static Q4_Z int z_q4_rows(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x,
                           int n, size_t ldx, float *y, size_t ldy) {
    size_t cols = w->cols, full = cols / 32;
    for (uint32_t r = r0; r < r1; r += 4) {
        const uint8_t *q[4];
        const uint16_t *d[4];
        q4_rows4(w, r, r1, q, d);
        uint32_t rows = r1 - r < 4 ? r1 - r : 4;
        for (int j = 0; j < n; j += 6) {
            int nt = n - j < 6 ? n - j : 6;
            const float *xj = x + (size_t)j * ldx;
            __m512 lo[4][6], hi[4][6];
            switch (nt) {
#define ZQ_F32_CASE(N) case N: zq_f32_##N(q, d, xj, ldx, full, 0, lo); zq_f32_##N(q, d, xj, ldx, full, 1, hi); break;
            case 1: zq_f32_decode(q, d, xj, full, lo, hi); break;
            ZQ_F32_CASE(2) ZQ_F32_CASE(3) ZQ_F32_CASE(4) ZQ_F32_CASE(5)
            default: zq_f32_6(q, d, xj, ldx, full, 0, lo); zq_f32_6(q, d, xj, ldx, full, 1, hi); break;
#undef ZQ_F32_CASE
            }
            float o[4][6];
            for (uint32_t k = 0; k < rows; k++)
                for (int t = 0; t < nt; t++) o[k][t] = zq_reduce32(lo[k][t], hi[k][t]);
            _mm256_zeroupper();
            for (uint32_t k = 0; k < rows; k++)
                for (int t = 0; t < nt; t++)
                    y[(size_t)(j + t) * ldy + r + k] = o[k][t] + q4_tail(q[k], d[k], xj + (size_t)t * ldx, cols);
        }
    }
    return 1;
}

/* int8 activations: -8 * the 4-element sums of each token's full groups, nc[t * 8 * full + 8b + l]. */
#define ZQ8_NC_INTS 16384 /* 64 KiB on the stack: 6 tokens of 10922 columns, 1 of 65536 */

static Q4_ZV void zq8_offsets(const int8_t *x, size_t ldx, int nt, size_t full, int32_t *nc) {
    const __m512i eight = _mm512_set1_epi8(8);
    for (int t = 0; t < nt; t++) {
        const int8_t *xt = x + (size_t)t * ldx;
        int32_t *o = nc + (size_t)t * 8 * full;
        size_t b = 0;
        for (; b + 2 <= full; b += 2) {
            __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), eight,
                                            _mm512_loadu_si512((const void *)(xt + b * 32)));
            _mm512_storeu_si512((void *)(o + b * 8), _mm512_sub_epi32(_mm512_setzero_si512(), s));
        }
        for (; b < full; b++)
            for (int l = 0; l < 8; l++) {
                int32_t s = 0;
                for (int e = 0; e < 4; e++) s += xt[b * 32 + 4 * l + e];
                o[b * 8 + l] = -8 * s;
            }
    }
}

/* Four rows against NT int8 tokens over the full groups: lo[t] lanes 4r..4r+3 = row r's L0-3,
 * hi[t] its L4-7. */
#define ZQ_Q8(NAME, NT)                                                                       \
    Q4_ZV static void NAME(const uint8_t *const q[4], const uint16_t *const d[4],            \
                           const int8_t *x, size_t ldx, const int32_t *nc, size_t full,       \
                           __m512 lo[6], __m512 hi[6]) {                                      \
        const __m512i m4 = _mm512_set1_epi8(0x0f);                                            \
        const __m512i spread = _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3); \
        for (int t = 0; t < NT; t++) lo[t] = hi[t] = _mm512_setzero_ps();                    \
        for (size_t g = 0; g < full; g += 16) {                                               \
            size_t m = full - g < 16 ? full - g : 16;                                         \
            /* D4[b] = (d0, d1, d2, d3) of group g + b: a 4 x 16 transpose of the row scales */ \
            __m512 s0 = zq_scales(d[0], g, m), s1 = zq_scales(d[1], g, m);                    \
            __m512 s2 = zq_scales(d[2], g, m), s3 = zq_scales(d[3], g, m);                    \
            __m512 u01 = _mm512_unpacklo_ps(s0, s1), v01 = _mm512_unpackhi_ps(s0, s1);        \
            __m512 u23 = _mm512_unpacklo_ps(s2, s3), v23 = _mm512_unpackhi_ps(s2, s3);        \
            __m512 T[4] = {                                                                   \
                _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(u01), _mm512_castps_pd(u23))), \
                _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(u01), _mm512_castps_pd(u23))), \
                _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(v01), _mm512_castps_pd(v23))), \
                _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(v01), _mm512_castps_pd(v23)))}; \
            /* T[k] 128-bit chunk c = group 4c + k's (d0, d1, d2, d3) */                       \
            for (size_t b = 0; b < m; b++) {                                                  \
                size_t gb = g + b;                                                            \
                __m512 D = _mm512_permutexvar_ps(                                             \
                    _mm512_add_epi32(spread, _mm512_set1_epi32((int)(b >> 2) * 4)), T[b & 3]); \
                if ((b & 3) == 0)                                                             \
                    for (int r = 0; r < 4; r++) __builtin_prefetch(q[r] + gb * 16 + Q4_PREFETCH_BYTES); \
                __m512i W = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(const void *)(q[0] + gb * 16))); \
                W = _mm512_inserti32x4(W, _mm_loadu_si128((const __m128i *)(const void *)(q[1] + gb * 16)), 1); \
                W = _mm512_inserti32x4(W, _mm_loadu_si128((const __m128i *)(const void *)(q[2] + gb * 16)), 2); \
                W = _mm512_inserti32x4(W, _mm_loadu_si128((const __m128i *)(const void *)(q[3] + gb * 16)), 3); \
                __m512i wl = _mm512_and_si512(W, m4), wh = _mm512_and_si512(_mm512_srli_epi16(W, 4), m4); \
                _Pragma("GCC unroll 6") for (int t = 0; t < NT; t++) {                        \
                    const int8_t *xb = x + (size_t)t * ldx + gb * 32;                         \
                    const int32_t *cb = nc + (size_t)t * 8 * full + gb * 8;                   \
                    __m512i sl = _mm512_dpbusd_epi32(                                         \
                        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)cb)), wl, \
                        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)xb))); \
                    __m512i sh = _mm512_dpbusd_epi32(                                         \
                        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)(cb + 4))), wh, \
                        _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)(xb + 16)))); \
                    lo[t] = _mm512_fmadd_ps(D, _mm512_cvtepi32_ps(sl), lo[t]);                \
                    hi[t] = _mm512_fmadd_ps(D, _mm512_cvtepi32_ps(sh), hi[t]);                \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
    }
ZQ_Q8(zq_q8_1, 1)
ZQ_Q8(zq_q8_2, 2)
ZQ_Q8(zq_q8_3, 3)
ZQ_Q8(zq_q8_4, 4)
ZQ_Q8(zq_q8_5, 5)
ZQ_Q8(zq_q8_6, 6)

static Q4_ZV int z_q4q8_rows(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                             const float *xscale, int n, size_t ldx, float *y, size_t ldy) {
    size_t cols = w->cols, full = cols / 32;
    int32_t nc[ZQ8_NC_INTS];
    int tb = full ? (int)(ZQ8_NC_INTS / (8 * full)) : 6; /* tokens whose offsets fit */
    if (tb < 1) return 0;
    if (tb > 6) tb = 6;
    for (int j = 0; j < n; j += tb) {
        int nb = n - j < tb ? n - j : tb;
        const int8_t *xj = xq + (size_t)j * ldx;
        zq8_offsets(xj, ldx, nb, full, nc);
        for (uint32_t r = r0; r < r1; r += 4) {
            const uint8_t *q[4];
            const uint16_t *d[4];
            q4_rows4(w, r, r1, q, d);
            uint32_t rows = r1 - r < 4 ? r1 - r : 4;
            __m512 lo[6], hi[6];
            switch (nb) {
            case 1: zq_q8_1(q, d, xj, ldx, nc, full, lo, hi); break;
            case 2: zq_q8_2(q, d, xj, ldx, nc, full, lo, hi); break;
            case 3: zq_q8_3(q, d, xj, ldx, nc, full, lo, hi); break;
            case 4: zq_q8_4(q, d, xj, ldx, nc, full, lo, hi); break;
            case 5: zq_q8_5(q, d, xj, ldx, nc, full, lo, hi); break;
            default: zq_q8_6(q, d, xj, ldx, nc, full, lo, hi); break;
            }
            float L[6][2][16];
            for (int t = 0; t < nb; t++) {
                _mm512_storeu_ps(L[t][0], lo[t]);
                _mm512_storeu_ps(L[t][1], hi[t]);
            }
            _mm256_zeroupper();
            for (uint32_t k = 0; k < rows; k++)
                for (int t = 0; t < nb; t++) {
                    float v[8];
                    for (int l = 0; l < 4; l++) {
                        v[l] = L[t][0][4 * k + (uint32_t)l];
                        v[4 + l] = L[t][1][4 * k + (uint32_t)l];
                    }
                    float o = q4q8_reduce(v) + q4q8_tail(q[k], d[k], xj + (size_t)t * ldx, cols);
                    y[(size_t)(j + t) * ldy + r + k] = o * xscale[j + t];
                }
        }
    }
    return 1;
}

/* ---- AVX-512 VNNI on the packed layout (q4_pack.h): 16 rows per register ------------------
 * acc[t][l] lane i = the chain of (row i of the block, token t, layout lane l): chunk c's low
 * nibbles are lane c (elements 4c..4c+3), its high nibbles lane c + 4, for all 16 rows in one
 * 512-bit load. Per group and chain: S = the 4-element sum (vpdpbusd on the unsigned nibbles,
 * started from -8 * the activations' sum, as z_q4q8_rows), then fma(d_b, S, L): the layout's
 * operations in its order, so z_q4q8_rows's bits (the self-test compares). Against z_q4q8_rows
 * it needs no 128-bit inserts or scale transposes per group and keeps eight chains per token
 * in flight instead of two. Measured (2-vCPU EPYC, 1 thread, 64 matrices of 2816 x 1024 from
 * DRAM): 11.2-12.2 GB/s of weights for z_q4q8_rows, 18.5-22.0 for this one; in L2 16 vs 37. */
Q4_ZI int32_t zp_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* q4q8_reduce lane-wise: ((L0 + L1) + (L2 + L3)) + ((L4 + L5) + (L6 + L7)) for each of the 16
 * rows, the same additions in the same order as the scalar form (the build does not contract). */
Q4_ZI __m512 zp_reduce8(const __m512 a[8]) {
    return _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])),
                         _mm512_add_ps(_mm512_add_ps(a[4], a[5]), _mm512_add_ps(a[6], a[7])));
}

#define ZP_Q8(NAME, NT)                                                                       \
    Q4_ZV static void NAME(const uint8_t *p, const int8_t *x, size_t ldx, const int32_t *nc,  \
                           size_t full, __m512 acc[NT][8]) {                                  \
        const __m512i m4 = _mm512_set1_epi8(0x0f);                                            \
        __m512 a[NT][8]; /* local: the stores through acc might alias the loads */           \
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                                  \
            _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) a[t][l] = _mm512_setzero_ps(); \
        for (size_t b = 0; b < full; b++, p += COLIBRI_Q4P_GROUP_BYTES) {                     \
            const __m512 D = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(const void *)(p + 256))); \
            _Pragma("GCC unroll 4") for (int c = 0; c < 4; c++) {                             \
                __m512i W = _mm512_loadu_si512((const void *)(p + 64 * c));                   \
                __m512i wl = _mm512_and_si512(W, m4);                                         \
                __m512i wh = _mm512_and_si512(_mm512_srli_epi16(W, 4), m4);                   \
                _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) {                        \
                    const int8_t *xb = x + (size_t)t * ldx + b * 32;                          \
                    const int32_t *cb = nc + (size_t)t * 8 * full + b * 8;                    \
                    __m512i sl = _mm512_dpbusd_epi32(_mm512_set1_epi32(cb[c]), wl,            \
                                                     _mm512_set1_epi32(zp_i32(xb + 4 * c)));  \
                    __m512i sh = _mm512_dpbusd_epi32(_mm512_set1_epi32(cb[c + 4]), wh,        \
                                                     _mm512_set1_epi32(zp_i32(xb + 16 + 4 * c))); \
                    a[t][c] = _mm512_fmadd_ps(D, _mm512_cvtepi32_ps(sl), a[t][c]);            \
                    a[t][c + 4] = _mm512_fmadd_ps(D, _mm512_cvtepi32_ps(sh), a[t][c + 4]);    \
                }                                                                             \
            }                                                                                 \
        }                                                                                     \
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                                  \
            _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) acc[t][l] = a[t][l];         \
    }
ZP_Q8(zp_q8_1, 1)
ZP_Q8(zp_q8_2, 2)
ZP_Q8(zp_q8_3, 3)

/* Rows [r0, r1) of a packed tensor: the 16-row blocks that overlap them (rows of a block outside
 * the range are computed and not stored; mm_task splits packed tensors at block edges), token
 * tiles of up to 3 inside groups of tokens whose offsets fit the stack, each block's weights
 * read once per group of tokens. */
static Q4_ZV int zp_q4q8_rows(const colibri_tensor *w, uint32_t r0, uint32_t r1,
                              const int8_t *xq, const float *xscale, int n, size_t ldx, float *y,
                              size_t ldy) {
    size_t full = w->cols / 32, blk_bytes = full * COLIBRI_Q4P_GROUP_BYTES;
    int32_t nc[ZQ8_NC_INTS];
    int tb = (int)(ZQ8_NC_INTS / (8 * full)); /* tokens whose offsets fit */
    if (tb < 1) return 0;
    for (int j0 = 0; j0 < n; j0 += tb) {
        int nb = n - j0 < tb ? n - j0 : tb;
        const int8_t *xg = xq + (size_t)j0 * ldx;
        zq8_offsets(xg, ldx, nb, full, nc);
        for (uint32_t blk = r0 / COLIBRI_Q4P_ROWS; blk * COLIBRI_Q4P_ROWS < r1; blk++) {
            const uint8_t *p = w->packed + (size_t)blk * blk_bytes;
            uint32_t base = blk * COLIBRI_Q4P_ROWS;
            const __mmask16 keep = colibri_packed_rows_mask(blk, r0, r1);
            for (int j = 0; j < nb; j += 3) {
                int nt = nb - j < 3 ? nb - j : 3;
                const int8_t *xj = xg + (size_t)j * ldx;
                const int32_t *cj = nc + (size_t)j * 8 * full;
                __m512 acc[3][8];
                if (nt == 1) zp_q8_1(p, xj, ldx, cj, full, acc);
                else if (nt == 2) zp_q8_2(p, xj, ldx, cj, full, acc);
                else zp_q8_3(p, xj, ldx, cj, full, acc);
                for (int t = 0; t < nt; t++) /* q4q8_reduce(L) * s for the 16 rows at once */
                    _mm512_mask_storeu_ps(y + (size_t)(j0 + j + t) * ldy + base, keep,
                                          _mm512_mul_ps(zp_reduce8(acc[t]), _mm512_set1_ps(xscale[j0 + j + t])));
            }
        }
    }
    _mm256_zeroupper();
    return 1;
}

/* The int8-activation rows: the packed layout when the tensor has one. */
static Q4_ZV int z_q4q8_any(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                            const float *xscale, int n, size_t ldx, float *y, size_t ldy) {
    if (w->packed) return zp_q4q8_rows(w, r0, r1, xq, xscale, n, ldx, y, ldy);
    return z_q4q8_rows(w, r0, r1, xq, xscale, n, ldx, y, ldy);
}

void colibri_q4_x86(colibri_q4_kernels *q) {
    if (colibri_x86_features() & COLIBRI_X86_AVX2) {
        q->dot = avx2_q4_dot;
        q->dot_f32 = avx2_f32_dot;
        q->dot3_f32 = avx2_f32_dot3;
        q->dot_q8 = avx2_q4q8_dot;
        q->row_full_groups = avx2_q4_row_full_groups;
        q->f32_tile_2x4 = avx2_f32_tile_2x4;
        q->q4q8_4x1 = avx2_q4q8_tile_4x1;
        q->q4q8_2x3 = avx2_q4q8_tile_2x3;
        q->name = "avx2";
        int f = colibri_x86_features();
        if (f & COLIBRI_X86_AVX512) {
            q->rows = z_q4_rows;
            q->name = "avx512";
        }
        if (f & COLIBRI_X86_VNNI) {
            q->rows_q8 = z_q4q8_any;
            q->reads_packed = 1;
            q->name = "avx512-vnni";
        }
    }
}
#else
void colibri_q4_x86(colibri_q4_kernels *q) { (void)q; }
#endif
