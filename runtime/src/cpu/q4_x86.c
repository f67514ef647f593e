/* The x86_64 q4 kernels (see q4_table.h; the lane layout: kernels_q4.c): AVX2+FMA+F16C, with
 * per-function target attributes, chosen at run time from the one CPU probe (cpu_features.c). */
#include "q4_table.h"
#include "cpu_features.h"

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
    }
}
#else
void colibri_q4_x86(colibri_q4_kernels *q) { (void)q; }
#endif
