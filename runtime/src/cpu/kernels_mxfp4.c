/* CPU kernels for mxfp4 weights (docs/format.md, "mxfp4"): blocks of 32 E2M1 codes, two per byte
 * (element 2j in the low nibble of byte j, 2j + 1 in the high one), and one E8M0 exponent s per
 * block. A weight is W2[code] * 2^(s - 128) with W2 = 2 * E2M1 = {0, 1, 2, 3, 4, 6, 8, 12} and
 * their negatives: a small integer times a power of two, exact in f32 (2^-128 is a subnormal f32;
 * only s >= 253 can overflow, as transformers' own dequantisation does), and equal to
 * transformers' dequantised value (convert_moe_packed_tensors: FP4_VALUES[code] * 2^(s - 127)).
 *
 * The f32 layout (f32 activations). Every implementation (scalar, AVX2, AVX-512, NEON) computes a row dot
 * as 32 lanes: lane l accumulates w[32b + l] * x[32b + l] over the full blocks b in order with a
 * fused multiply-add; then u[l] = (L[l] + L[8 + l]) + (L[16 + l] + L[24 + l]) for l < 8, the sum
 * ((u0 + u1) + (u2 + u3)) + ((u4 + u5) + (u6 + u7)), plus the columns past the last full block
 * accumulated one by one (fused) from 0. The weight is the exact product above wherever it is
 * formed (in registers in decode, in registers per lane group in the prefill tiles), so decode,
 * prefill, any thread count, x86_64 and aarch64 all give the same bits.
 *
 * The 8-bit layout (--int8-act). Each token's activations are quantised per block of 32, as
 * llama.cpp's q8_0 (but with an f32 scale): d = amax / 127, q = round-half-even(x / d) (x * (1 /
 * d)), an all-zero block has d = 0. Per full block b the eight 4-element lane sums S[l] =
 * sum_{e=4l..4l+3} W2[code_e] * q_e are exact int32 (any instruction mix gives them: SDOT,
 * maddubs/madd, plain C), then L[l] = fma(2^(s_b - 128) * d_b, S[l], L[l]) in f32; the result is
 * ((L0 + L1) + (L2 + L3)) + ((L4 + L5) + (L6 + L7)) plus the last partial block's
 * c * (its exact integer sum). Same bits on every CPU, decode or prefill, any thread count.
 * On AVX-512 VNNI the 8-bit kernel reads the packed layout (q4_pack.h) when the model has one:
 * the same per-lane operations for 16 rows per register (zp_mx_rows).
 *
 * Kept apart from kernels.c and kernels_q4.c (another engineer's area): kernels.c calls in here
 * for an mxfp4 tensor, and layers/linear.c for the 8-bit path. */
#include "kernels_mxfp4.h"

#include "cpu_features.h"
#include "q4_pack.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define MX_HAVE_AVX2 1
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#define MX_HAVE_NEON 1
#include <arm_neon.h>
#if defined(__ARM_FEATURE_DOTPROD) || defined(COLIBRI_ARM_TARGET_ATTR)
#define MX_HAVE_SDOT 1
#endif
#endif

/* Decode look-ahead: an mxfp4 row is a quarter of an int8 one (as q4; kernels_q4.c measured
 * 4 KiB best for that density). */
#define MX_PREFETCH_BYTES 4096
/* The 8-bit path quantises the call's tokens into a stack buffer of this many bytes at a time
 * (a token group: as many tokens as fit, at least one row of up to this many columns). */
#define MX_A8_BYTES (48 * 1024)
#define MX_A8_MAX_COLS MX_A8_BYTES
#define MX_A8_BLOCKS (MX_A8_BYTES / 32 + 64)

static const int8_t W2[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};
static float SCALE[256]; /* 2^(s - 128), set once at init */

typedef float (*mx_dot_fn)(const uint8_t *q, const uint8_t *s, const float *x, size_t cols);
/* one row against four tokens (f32): out[t] with mx_dot_fn's bits for token t */
typedef void (*mx_tile_fn)(const uint8_t *q, const uint8_t *s, const float *const x[4], size_t cols,
                           float out[4]);
/* R rows against T tokens (8-bit): out[r * T + t] without the tail */
typedef void (*mx_a8_fn)(const uint8_t *const q[], const uint8_t *const s[], const int8_t *const x[],
                         const float *const d[], size_t full, float out[]);

/* rows [r0, r1) of a packed tensor (q4_pack.h) against m quantised tokens; nc: scratch for the
 * tokens' offsets (m * cols / 4 ints) */
typedef void (*mx_packed_fn)(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                             const float *xd, int32_t *nc, int m, size_t xstride, size_t nb,
                             float *y, size_t ldy);

typedef void (*mx_quantize_fn)(const float *x, size_t cols, int8_t *q, float *d);

static struct {
    mx_packed_fn a8_packed; /* NULL where no kernel reads the packed layout */
    mx_quantize_fn quantize; /* a8_quantize's bits */
    mx_dot_fn dot;
    mx_tile_fn tile;
    mx_a8_fn a8_4x1, a8_2x4; /* decode (4 rows x 1 token), prefill (2 rows x 4 tokens) */
    mx_a8_fn a8_4x4;         /* prefill, 4 rows x 4 tokens where the family has it (else NULL) */
    const char *name;
} M;

static inline int mx_code(const uint8_t *blk, size_t i) {
    return i & 1 ? blk[i >> 1] >> 4 : blk[i >> 1] & 15;
}

/* ---- the layouts, portable ------------------------------------------------------------------ */

static float mx_reduce(const float L[32]) {
    float u[8];
    for (int l = 0; l < 8; l++) u[l] = (L[l] + L[8 + l]) + (L[16 + l] + L[24 + l]);
    return ((u[0] + u[1]) + (u[2] + u[3])) + ((u[4] + u[5]) + (u[6] + u[7]));
}

/* columns past the last full block, one by one from 0 */
static float mx_tail(const uint8_t *q, const uint8_t *s, const float *x, size_t cols) {
    size_t full = cols / 32, i0 = full * 32;
    float t = 0.0f;
    if (i0 == cols) return 0.0f;
    float d = SCALE[s[full]];
    for (size_t i = i0; i < cols; i++) t = fmaf((float)W2[mx_code(q + full * 16, i - i0)] * d, x[i], t);
    return t;
}

static float scalar_dot(const uint8_t *q, const uint8_t *s, const float *x, size_t cols) {
    float L[32] = {0};
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        float d = SCALE[s[b]];
        for (int l = 0; l < 32; l++)
            L[l] = fmaf((float)W2[mx_code(q + b * 16, (size_t)l)] * d, x[b * 32 + (size_t)l], L[l]);
    }
    return mx_reduce(L) + mx_tail(q, s, x, cols);
}

static void scalar_tile(const uint8_t *q, const uint8_t *s, const float *const x[4], size_t cols,
                        float out[4]) {
    for (int t = 0; t < 4; t++) out[t] = scalar_dot(q, s, x[t], cols);
}

static float a8_reduce(const float L[8]) {
    return ((L[0] + L[1]) + (L[2] + L[3])) + ((L[4] + L[5]) + (L[6] + L[7]));
}

/* one (row, token) of the 8-bit layout over the full blocks */
static float scalar_a8_dot(const uint8_t *q, const uint8_t *s, const int8_t *x, const float *d,
                           size_t full) {
    float L[8] = {0};
    for (size_t b = 0; b < full; b++) {
        float c = SCALE[s[b]] * d[b];
        for (int l = 0; l < 8; l++) {
            int32_t S = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++)
                S += W2[mx_code(q + b * 16, (size_t)e)] * (int32_t)x[b * 32 + (size_t)e];
            L[l] = fmaf(c, (float)S, L[l]);
        }
    }
    return a8_reduce(L);
}

static void scalar_a8_4x1(const uint8_t *const q[], const uint8_t *const s[], const int8_t *const x[],
                          const float *const d[], size_t full, float out[]) {
    for (int r = 0; r < 4; r++) out[r] = scalar_a8_dot(q[r], s[r], x[0], d[0], full);
}

static void scalar_a8_2x4(const uint8_t *const q[], const uint8_t *const s[], const int8_t *const x[],
                          const float *const d[], size_t full, float out[]) {
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++) out[r * 4 + t] = scalar_a8_dot(q[r], s[r], x[t], d[t], full);
}

/* the last partial block of the 8-bit layout: c * (exact integer sum) */
static float a8_tail(const uint8_t *q, const uint8_t *s, const int8_t *x, const float *d,
                     size_t cols) {
    size_t full = cols / 32, i0 = full * 32;
    if (i0 == cols) return 0.0f;
    int32_t S = 0;
    for (size_t i = i0; i < cols; i++) S += W2[mx_code(q + full * 16, i - i0)] * (int32_t)x[i];
    return (SCALE[s[full]] * d[full]) * (float)S;
}

/* A token's activations per block of 32 (the last block may be shorter): d = amax / 127
 * (NaNs ignored, as fmaxf does), q = round-half-even(x * (1 / d)) clamped to +-127; d = 0 and
 * q = 0 for an all-zero block. */
static void a8_quantize(const float *x, size_t cols, int8_t *q, float *d) {
    for (size_t b = 0; b * 32 < cols; b++) {
        size_t n = cols - b * 32 < 32 ? cols - b * 32 : 32;
        const float *xb = x + b * 32;
        float amax = 0.0f;
        for (size_t i = 0; i < n; i++) amax = fmaxf(amax, fabsf(xb[i]));
        float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        for (size_t i = 0; i < n; i++) {
            float v = nearbyintf(xb[i] * id);
            v = v != v ? 0.0f : v; /* a NaN (of a non-finite block) as 0, as every kernel does */
            q[b * 32 + i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
        }
    }
}

/* ---- AVX2 (+FMA): four 8-lane accumulators = lanes 0-7, 8-15, 16-23, 24-31 ------------------ */

#ifdef MX_HAVE_AVX2
#define MX_AVX2 __attribute__((target("avx2,fma")))
#define MX_AVX2_INLINE static inline __attribute__((always_inline, target("avx2,fma")))
/* Every AVX2 function ends with vzeroupper before code compiled without AVX runs (the tails, the
 * row loops): kernels_q4.c measured the stall an SSE instruction after dirty upper halves costs. */

MX_AVX2_INLINE float avx2_reduce(__m256 a0, __m256 a1, __m256 a2, __m256 a3) {
    __m256 u = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float t[8];
    _mm256_storeu_ps(t, u);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

/* A block's 32 weights as W2 bytes in element order: e0 = elements 0..15, e1 = 16..31. */
MX_AVX2_INLINE void avx2_codes(const uint8_t *blk, __m128i lut, __m128i *e0, __m128i *e1) {
    const __m128i m4 = _mm_set1_epi8(0x0f);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)blk);
    __m128i lo = _mm_shuffle_epi8(lut, _mm_and_si128(v, m4));
    __m128i hi = _mm_shuffle_epi8(lut, _mm_and_si128(_mm_srli_epi16(v, 4), m4));
    *e0 = _mm_unpacklo_epi8(lo, hi);
    *e1 = _mm_unpackhi_epi8(lo, hi);
}

MX_AVX2_INLINE __m256 avx2_w8(__m128i e, __m256 vd) { /* the low 8 bytes of e, times 2^(s - 128) */
    return _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(e)), vd);
}

static MX_AVX2 float avx2_dot(const uint8_t *q, const uint8_t *s, const float *x, size_t cols) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)(const void *)W2);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __builtin_prefetch(q + b * 16 + MX_PREFETCH_BYTES);
        __m128i e0, e1;
        avx2_codes(q + b * 16, lut, &e0, &e1);
        __m256 vd = _mm256_set1_ps(SCALE[s[b]]);
        const float *xb = x + b * 32;
        a0 = _mm256_fmadd_ps(avx2_w8(e0, vd), _mm256_loadu_ps(xb), a0);
        a1 = _mm256_fmadd_ps(avx2_w8(_mm_srli_si128(e0, 8), vd), _mm256_loadu_ps(xb + 8), a1);
        a2 = _mm256_fmadd_ps(avx2_w8(e1, vd), _mm256_loadu_ps(xb + 16), a2);
        a3 = _mm256_fmadd_ps(avx2_w8(_mm_srli_si128(e1, 8), vd), _mm256_loadu_ps(xb + 24), a3);
    }
    float r = avx2_reduce(a0, a1, a2, a3);
    _mm256_zeroupper();
    return r + mx_tail(q, s, x, cols);
}

/* One row against four tokens, one lane group (8 lanes: bytes 4k..4k+3 of each block) at a time
 * over all blocks: 4 accumulators live, each (token, lane) with exactly avx2_dot's operations. */
static MX_AVX2 void avx2_tile(const uint8_t *q, const uint8_t *s, const float *const x[4],
                              size_t cols, float out[4]) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)(const void *)W2), m4 = _mm_set1_epi8(0x0f);
    __m256 part[4][4];
    size_t full = cols / 32;
    for (int k = 0; k < 4; k++) {
        __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *x0 = x[0] + 8 * k, *x1 = x[1] + 8 * k, *x2 = x[2] + 8 * k, *x3 = x[3] + 8 * k;
        for (size_t b = 0; b < full; b++) {
            uint32_t four;
            memcpy(&four, q + b * 16 + 4 * k, 4);
            __m128i v = _mm_cvtsi32_si128((int)four);
            __m128i c = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
            __m256 w = avx2_w8(_mm_shuffle_epi8(lut, c), _mm256_set1_ps(SCALE[s[b]]));
            size_t o = b * 32;
            a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x0 + o), a0);
            a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x1 + o), a1);
            a2 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x2 + o), a2);
            a3 = _mm256_fmadd_ps(w, _mm256_loadu_ps(x3 + o), a3);
        }
        part[0][k] = a0, part[1][k] = a1, part[2][k] = a2, part[3][k] = a3;
    }
    for (int t = 0; t < 4; t++) out[t] = avx2_reduce(part[t][0], part[t][1], part[t][2], part[t][3]);
    _mm256_zeroupper();
    for (int t = 0; t < 4; t++) out[t] += mx_tail(q, s, x[t], cols);
}

/* 8-bit: weights as unsigned bytes W2 + 12 (0..24) for maddubs; the token's 4-element lane sums
 * times 12, once per block and token, are subtracted: the exact S[l] of the layout. */
static const uint8_t W2U[16] = {12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0};

MX_AVX2_INLINE __m256i a8_codes(const uint8_t *blk, __m128i lut) { /* W2 + 12, element order */
    __m128i e0, e1;
    avx2_codes(blk, lut, &e0, &e1);
    return _mm256_set_m128i(e1, e0);
}

MX_AVX2_INLINE __m256i a8_sums(__m256i u, __m256i x) { /* int32 sums of u * x, 4 bytes each */
    return _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), _mm256_set1_epi16(1));
}

MX_AVX2_INLINE __m256 a8_step(__m256i w, __m256i x, __m256i x12, float c, __m256 acc) {
    return _mm256_fmadd_ps(_mm256_set1_ps(c), _mm256_cvtepi32_ps(_mm256_sub_epi32(a8_sums(w, x), x12)),
                           acc);
}

MX_AVX2_INLINE __m256i a8_x(const int8_t *x) {
    return _mm256_loadu_si256((const __m256i *)(const void *)x);
}

MX_AVX2_INLINE float a8_hsum(__m256 a) { /* the layout's ((L0 + L1) + (L2 + L3)) + ... */
    float t[8];
    _mm256_storeu_ps(t, a);
    return a8_reduce(t);
}

/* Written out with named accumulators (kernels_q4.c: GCC kept arrays of them in memory). */
static MX_AVX2 void avx2_a8_4x1(const uint8_t *const q[], const uint8_t *const s[],
                                const int8_t *const x[], const float *const d[], size_t full,
                                float out[]) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)(const void *)W2U);
    const __m256i twelve = _mm256_set1_epi8(12);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const uint8_t *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    for (size_t b = 0; b < full; b++) {
        __m256i xv = a8_x(x[0] + b * 32);
        __m256i x12 = a8_sums(twelve, xv);
        float db = d[0][b];
        __builtin_prefetch(q0 + b * 16 + MX_PREFETCH_BYTES);
        __builtin_prefetch(q1 + b * 16 + MX_PREFETCH_BYTES);
        __builtin_prefetch(q2 + b * 16 + MX_PREFETCH_BYTES);
        __builtin_prefetch(q3 + b * 16 + MX_PREFETCH_BYTES);
        a0 = a8_step(a8_codes(q0 + b * 16, lut), xv, x12, SCALE[s[0][b]] * db, a0);
        a1 = a8_step(a8_codes(q1 + b * 16, lut), xv, x12, SCALE[s[1][b]] * db, a1);
        a2 = a8_step(a8_codes(q2 + b * 16, lut), xv, x12, SCALE[s[2][b]] * db, a2);
        a3 = a8_step(a8_codes(q3 + b * 16, lut), xv, x12, SCALE[s[3][b]] * db, a3);
    }
    out[0] = a8_hsum(a0);
    out[1] = a8_hsum(a1);
    out[2] = a8_hsum(a2);
    out[3] = a8_hsum(a3);
    _mm256_zeroupper();
}

static MX_AVX2 void avx2_a8_2x4(const uint8_t *const q[], const uint8_t *const s[],
                                const int8_t *const x[], const float *const d[], size_t full,
                                float out[]) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)(const void *)W2U);
    const __m256i twelve = _mm256_set1_epi8(12);
    __m256 a00 = _mm256_setzero_ps(), a01 = a00, a02 = a00, a03 = a00;
    __m256 a10 = a00, a11 = a00, a12 = a00, a13 = a00;
    for (size_t b = 0; b < full; b++) {
        __m256i w0 = a8_codes(q[0] + b * 16, lut), w1 = a8_codes(q[1] + b * 16, lut);
        float s0 = SCALE[s[0][b]], s1 = SCALE[s[1][b]];
        __m256i xv = a8_x(x[0] + b * 32), x12 = a8_sums(twelve, xv);
        a00 = a8_step(w0, xv, x12, s0 * d[0][b], a00);
        a10 = a8_step(w1, xv, x12, s1 * d[0][b], a10);
        xv = a8_x(x[1] + b * 32), x12 = a8_sums(twelve, xv);
        a01 = a8_step(w0, xv, x12, s0 * d[1][b], a01);
        a11 = a8_step(w1, xv, x12, s1 * d[1][b], a11);
        xv = a8_x(x[2] + b * 32), x12 = a8_sums(twelve, xv);
        a02 = a8_step(w0, xv, x12, s0 * d[2][b], a02);
        a12 = a8_step(w1, xv, x12, s1 * d[2][b], a12);
        xv = a8_x(x[3] + b * 32), x12 = a8_sums(twelve, xv);
        a03 = a8_step(w0, xv, x12, s0 * d[3][b], a03);
        a13 = a8_step(w1, xv, x12, s1 * d[3][b], a13);
    }
    out[0] = a8_hsum(a00), out[1] = a8_hsum(a01), out[2] = a8_hsum(a02), out[3] = a8_hsum(a03);
    out[4] = a8_hsum(a10), out[5] = a8_hsum(a11), out[6] = a8_hsum(a12), out[7] = a8_hsum(a13);
    _mm256_zeroupper();
}

/* ---- AVX-512 (F/BW/VL/DQ; VNNI for the 8-bit path): the AVX2 layouts in 16-lane registers ----
 * f32: a 16-lane accumulator holds lanes 0-15 (elements 0..15 of every block), a second one 16-31:
 * each lane has exactly the AVX2 lane's fused multiply-adds, and avx2_reduce over the four 8-lane
 * halves is the layout's reduction. 8-bit: one register holds two rows' eight 4-element lane sums
 * (row A in lanes 0-7, row B in 8-15), the exact S[l] from VPDPBUSD (W2 + 12 as unsigned bytes,
 * the accumulator started at -12 * the token's group sums), then the same f32 fma per lane and
 * block with c = 2^(s - 128) * d rounded once, as the AVX2 code: the bits do not change. */

#define MX_Z __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define MX_ZV __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")))
#define MX_ZI static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma")))
#define MX_ZVI static inline __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma")))

MX_ZI float z_reduce(__m512 lo, __m512 hi) { /* lanes 0-15, 16-31 */
    return avx2_reduce(_mm512_castps512_ps256(lo), _mm512_extractf32x8_ps(lo, 1),
                       _mm512_castps512_ps256(hi), _mm512_extractf32x8_ps(hi, 1));
}

MX_ZI __m512 z_w16(__m128i e, __m512 vd) { /* 16 W2 bytes, times 2^(s - 128) */
    return _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(e)), vd);
}

static MX_Z float z_dot(const uint8_t *q, const uint8_t *s, const float *x, size_t cols) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)(const void *)W2);
    __m512 a0 = _mm512_setzero_ps(), a1 = a0;
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __builtin_prefetch(q + b * 16 + MX_PREFETCH_BYTES);
        __m128i e0, e1;
        avx2_codes(q + b * 16, lut, &e0, &e1);
        __m512 vd = _mm512_set1_ps(SCALE[s[b]]);
        const float *xb = x + b * 32;
        a0 = _mm512_fmadd_ps(z_w16(e0, vd), _mm512_loadu_ps(xb), a0);
        a1 = _mm512_fmadd_ps(z_w16(e1, vd), _mm512_loadu_ps(xb + 16), a1);
    }
    float r = z_reduce(a0, a1);
    _mm256_zeroupper();
    return r + mx_tail(q, s, x, cols);
}

/* One row against four tokens, half a block (16 lanes: bytes 8h..8h+7) at a time over all
 * blocks: the weights dequantised once per half and block for the four tokens. */
static MX_Z void z_tile(const uint8_t *q, const uint8_t *s, const float *const x[4], size_t cols,
                        float out[4]) {
    const __m128i lut = _mm_loadu_si128((const __m128i *)(const void *)W2), m4 = _mm_set1_epi8(0x0f);
    __m512 part[4][2];
    size_t full = cols / 32;
    for (int h = 0; h < 2; h++) {
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        const float *x0 = x[0] + 16 * h, *x1 = x[1] + 16 * h, *x2 = x[2] + 16 * h, *x3 = x[3] + 16 * h;
        for (size_t b = 0; b < full; b++) {
            __m128i v = _mm_loadl_epi64((const __m128i *)(const void *)(q + b * 16 + 8 * h));
            __m128i c = _mm_unpacklo_epi8(_mm_and_si128(v, m4), _mm_and_si128(_mm_srli_epi16(v, 4), m4));
            __m512 w = z_w16(_mm_shuffle_epi8(lut, c), _mm512_set1_ps(SCALE[s[b]]));
            size_t o = b * 32;
            a0 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x0 + o), a0);
            a1 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x1 + o), a1);
            a2 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x2 + o), a2);
            a3 = _mm512_fmadd_ps(w, _mm512_loadu_ps(x3 + o), a3);
        }
        part[0][h] = a0, part[1][h] = a1, part[2][h] = a2, part[3][h] = a3;
    }
    for (int t = 0; t < 4; t++) out[t] = z_reduce(part[t][0], part[t][1]);
    _mm256_zeroupper();
    for (int t = 0; t < 4; t++) out[t] += mx_tail(q, s, x[t], cols);
}

/* Two rows' blocks as W2 + 12 bytes in element order: row A's 32 in bytes 0-31, row B's 32-63. */
MX_ZI __m512i z_codes2(const uint8_t *a, const uint8_t *b, __m256i lut) {
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i v = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)a)),
                                        _mm_loadu_si128((const __m128i *)(const void *)b), 1);
    __m256i lo = _mm256_shuffle_epi8(lut, _mm256_and_si256(v, m4));
    __m256i hi = _mm256_shuffle_epi8(lut, _mm256_and_si256(_mm256_srli_epi16(v, 4), m4));
    __m512i e0 = _mm512_castsi256_si512(_mm256_unpacklo_epi8(lo, hi)); /* A 0..15 | B 0..15 */
    __m512i e1 = _mm512_castsi256_si512(_mm256_unpackhi_epi8(lo, hi)); /* A 16..31 | B 16..31 */
    return _mm512_permutex2var_epi64(e0, _mm512_set_epi64(11, 10, 3, 2, 9, 8, 1, 0), e1);
}

MX_ZI __m512 z_scale2(const uint8_t *sa, const uint8_t *sb) { /* 2^(s - 128): A x8 | B x8 */
    return _mm512_insertf32x8(_mm512_set1_ps(SCALE[*sa]), _mm256_set1_ps(SCALE[*sb]), 1);
}

/* A token's 32 bytes in both halves, and -12 * its 4-element group sums (the W2 + 12 offset). */
MX_ZVI __m512i z_x(const int8_t *x, __m512i *x12n) {
    __m512i xv = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(const void *)x));
    *x12n = _mm512_sub_epi32(_mm512_setzero_si512(),
                             _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(12), xv));
    return xv;
}

MX_ZVI __m512 z_a8_step(__m512i w, __m512i xv, __m512i x12n, __m512 sc, float d, __m512 acc) {
    __m512i S = _mm512_dpbusd_epi32(x12n, w, xv); /* exact: sum of W2 * x over each group of 4 */
    return _mm512_fmadd_ps(_mm512_mul_ps(sc, _mm512_set1_ps(d)), _mm512_cvtepi32_ps(S), acc);
}

MX_ZI void z_a8_out(__m512 acc, float *a, float *b) {
    float t[16];
    _mm512_storeu_ps(t, acc);
    *a = a8_reduce(t);
    *b = a8_reduce(t + 8);
}

static MX_ZV void z_a8_4x1(const uint8_t *const q[], const uint8_t *const s[], const int8_t *const x[],
                           const float *const d[], size_t full, float out[]) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)W2U));
    __m512 a01 = _mm512_setzero_ps(), a23 = a01;
    const uint8_t *q0 = q[0], *q1 = q[1], *q2 = q[2], *q3 = q[3];
    for (size_t b = 0; b < full; b++) {
        __m512i x12n, xv = z_x(x[0] + b * 32, &x12n);
        float db = d[0][b];
        __builtin_prefetch(q0 + b * 16 + MX_PREFETCH_BYTES);
        __builtin_prefetch(q1 + b * 16 + MX_PREFETCH_BYTES);
        __builtin_prefetch(q2 + b * 16 + MX_PREFETCH_BYTES);
        __builtin_prefetch(q3 + b * 16 + MX_PREFETCH_BYTES);
        a01 = z_a8_step(z_codes2(q0 + b * 16, q1 + b * 16, lut), xv, x12n, z_scale2(s[0] + b, s[1] + b), db, a01);
        a23 = z_a8_step(z_codes2(q2 + b * 16, q3 + b * 16, lut), xv, x12n, z_scale2(s[2] + b, s[3] + b), db, a23);
    }
    z_a8_out(a01, &out[0], &out[1]);
    z_a8_out(a23, &out[2], &out[3]);
    _mm256_zeroupper();
}

static MX_ZV void z_a8_2x4(const uint8_t *const q[], const uint8_t *const s[], const int8_t *const x[],
                           const float *const d[], size_t full, float out[]) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)W2U));
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t b = 0; b < full; b++) {
        __m512i w = z_codes2(q[0] + b * 16, q[1] + b * 16, lut), x12n, xv;
        __m512 sc = z_scale2(s[0] + b, s[1] + b);
        xv = z_x(x[0] + b * 32, &x12n), a0 = z_a8_step(w, xv, x12n, sc, d[0][b], a0);
        xv = z_x(x[1] + b * 32, &x12n), a1 = z_a8_step(w, xv, x12n, sc, d[1][b], a1);
        xv = z_x(x[2] + b * 32, &x12n), a2 = z_a8_step(w, xv, x12n, sc, d[2][b], a2);
        xv = z_x(x[3] + b * 32, &x12n), a3 = z_a8_step(w, xv, x12n, sc, d[3][b], a3);
    }
    z_a8_out(a0, &out[0], &out[4]); /* row 0 in lanes 0-7, row 1 in 8-15 */
    z_a8_out(a1, &out[1], &out[5]);
    z_a8_out(a2, &out[2], &out[6]);
    z_a8_out(a3, &out[3], &out[7]);
    _mm256_zeroupper();
}

/* Rows 0-3 x tokens 0-3 (out[r * 4 + t]): a token's bytes and group sums once for two row pairs. */
static MX_ZV void z_a8_4x4(const uint8_t *const q[], const uint8_t *const s[], const int8_t *const x[],
                           const float *const d[], size_t full, float out[]) {
    const __m256i lut = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)(const void *)W2U));
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, b0 = a0, b1 = a0, b2 = a0, b3 = a0;
    for (size_t b = 0; b < full; b++) {
        __m512i wa = z_codes2(q[0] + b * 16, q[1] + b * 16, lut), wb = z_codes2(q[2] + b * 16, q[3] + b * 16, lut);
        __m512 sa = z_scale2(s[0] + b, s[1] + b), sb = z_scale2(s[2] + b, s[3] + b);
        __m512i x12n, xv;
        xv = z_x(x[0] + b * 32, &x12n);
        a0 = z_a8_step(wa, xv, x12n, sa, d[0][b], a0), b0 = z_a8_step(wb, xv, x12n, sb, d[0][b], b0);
        xv = z_x(x[1] + b * 32, &x12n);
        a1 = z_a8_step(wa, xv, x12n, sa, d[1][b], a1), b1 = z_a8_step(wb, xv, x12n, sb, d[1][b], b1);
        xv = z_x(x[2] + b * 32, &x12n);
        a2 = z_a8_step(wa, xv, x12n, sa, d[2][b], a2), b2 = z_a8_step(wb, xv, x12n, sb, d[2][b], b2);
        xv = z_x(x[3] + b * 32, &x12n);
        a3 = z_a8_step(wa, xv, x12n, sa, d[3][b], a3), b3 = z_a8_step(wb, xv, x12n, sb, d[3][b], b3);
    }
    z_a8_out(a0, &out[0], &out[4]), z_a8_out(b0, &out[8], &out[12]);
    z_a8_out(a1, &out[1], &out[5]), z_a8_out(b1, &out[9], &out[13]);
    z_a8_out(a2, &out[2], &out[6]), z_a8_out(b2, &out[10], &out[14]);
    z_a8_out(a3, &out[3], &out[7]), z_a8_out(b3, &out[11], &out[15]);
    _mm256_zeroupper();
}

/* ---- AVX-512 VNNI on the packed layout (q4_pack.h): 16 rows per register ------------------
 * acc[t][l] lane i = the chain of (row i of the 16-row block, token t, layout lane l). Chunk k
 * holds lanes 2k (low nibbles) and 2k + 1 (high nibbles) of all 16 rows: one load, one mask or
 * shift and one byte lookup (to W2 + 12) give the four codes of a lane for 16 rows, where the
 * file's layout (z_codes2) needs two 128-bit loads, an insert, two lookups, two unpacks and a
 * cross-lane permute for two rows. Per block and chain: S by vpdpbusd started from -12 * the
 * token's 4-element sum (z_x's offset, precomputed per token here), c = 2^(s - 128) * d_b (the
 * same f32 product as z_a8_step's), L = fma(c, S, L): the layout's operations in its order, so
 * the file layout's bits (the self-test compares). */

/* a8_quantize with AVX-512, bit for bit: the block's amax as the integer maximum of the
 * magnitudes' bits (the order of non-negative floats; NaNs left out, as fmaxf leaves them), the
 * same scalar d and 1 / d, then per element the same multiply, round-half-even (roundscale),
 * NaN to 0 and clamp; the last partial block in C. Scalar, it cost more than the packed kernel
 * itself in a 32-token prefill (0.4 of 1.05 ms for a 768 x 2048 matrix), once per thread. */
static MX_Z void z_a8_quantize(const float *x, size_t cols, int8_t *q, float *d) {
    const __m512i mag = _mm512_set1_epi32(0x7fffffff), inf = _mm512_set1_epi32(0x7f800000);
    const __m512 lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __m512 x0 = _mm512_loadu_ps(x + b * 32), x1 = _mm512_loadu_ps(x + b * 32 + 16);
        __m512i m0 = _mm512_and_si512(_mm512_castps_si512(x0), mag);
        __m512i m1 = _mm512_and_si512(_mm512_castps_si512(x1), mag);
        m0 = _mm512_maskz_mov_epi32(_mm512_cmple_epu32_mask(m0, inf), m0);
        m1 = _mm512_maskz_mov_epi32(_mm512_cmple_epu32_mask(m1, inf), m1);
        uint32_t bits = _mm512_reduce_max_epu32(_mm512_max_epu32(m0, m1));
        float amax;
        memcpy(&amax, &bits, sizeof amax);
        float db = amax / 127.0f, id = db > 0.0f ? 1.0f / db : 0.0f;
        d[b] = db;
        __m512 vid = _mm512_set1_ps(id);
        __m512 v[2] = {_mm512_mul_ps(x0, vid), _mm512_mul_ps(x1, vid)};
        for (int h = 0; h < 2; h++) {
            __m512 r = _mm512_roundscale_ps(v[h], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            r = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(r, r, _CMP_ORD_Q), r);
            r = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
            _mm_storeu_si128((__m128i *)(void *)(q + b * 32 + 16 * h), _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(r)));
        }
    }
    _mm256_zeroupper();
    if (full * 32 < cols) a8_quantize(x + full * 32, cols - full * 32, q + full * 32, d + full);
}

/* 2^(s - 128) for 16 exponent bytes, bit for bit SCALE[s]: the f32 exponent field is s - 1
 * from s = 2 (2^-126) to 255 (2^127); s = 0 and 1 are the subnormals 2^-128 and 2^-127. */
MX_ZI __m512 zp_scales(const uint8_t *s) {
    __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)s));
    __m512i normal = _mm512_slli_epi32(_mm512_sub_epi32(e, _mm512_set1_epi32(1)), 23);
    __m512i tiny = _mm512_sllv_epi32(_mm512_set1_epi32(0x00200000), e);
    __mmask16 sub = _mm512_cmplt_epu32_mask(e, _mm512_set1_epi32(2));
    return _mm512_castsi512_ps(_mm512_mask_mov_epi32(normal, sub, tiny));
}

MX_ZI int32_t zp_i32(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* NT tokens (x: xstride apart, their block scales d: nb apart, their offsets nc: 8 * full
 * apart) against one 16-row block's packed bytes p, all full blocks. */
#define ZP_MX(NAME, NT)                                                                         \
    MX_ZV static void NAME(const uint8_t *p, const int8_t *x, size_t xstride, const float *d,  \
                           size_t nb, const int32_t *nc, size_t full, __m512 acc[NT][8]) {      \
        const __m512i m4 = _mm512_set1_epi8(0x0f);                                              \
        const __m512i lut = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(const void *)W2U)); \
        __m512 a[NT][8]; /* local: the stores through acc might alias the loads */             \
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                                    \
            _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) a[t][l] = _mm512_setzero_ps();   \
        for (size_t b = 0; b < full; b++, p += COLIBRI_MXP_GROUP_BYTES) {                       \
            const __m512 S = zp_scales(p + 256);                                                \
            __m512 C[NT];                                                                       \
            _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                                \
                C[t] = _mm512_mul_ps(S, _mm512_set1_ps(d[(size_t)t * nb + b]));                \
            _Pragma("GCC unroll 4") for (int k = 0; k < 4; k++) {                               \
                __m512i W = _mm512_loadu_si512((const void *)(p + 64 * k));                     \
                __m512i wl = _mm512_shuffle_epi8(lut, _mm512_and_si512(W, m4));                 \
                __m512i wh = _mm512_shuffle_epi8(lut, _mm512_and_si512(_mm512_srli_epi16(W, 4), m4)); \
                _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++) {                          \
                    const int8_t *xb = x + (size_t)t * xstride + b * 32 + 8 * k;                \
                    const int32_t *cb = nc + (size_t)t * 8 * full + b * 8 + 2 * k;              \
                    __m512i sl = _mm512_dpbusd_epi32(_mm512_set1_epi32(cb[0]), wl,              \
                                                     _mm512_set1_epi32(zp_i32(xb)));            \
                    __m512i sh = _mm512_dpbusd_epi32(_mm512_set1_epi32(cb[1]), wh,              \
                                                     _mm512_set1_epi32(zp_i32(xb + 4)));        \
                    a[t][2 * k] = _mm512_fmadd_ps(C[t], _mm512_cvtepi32_ps(sl), a[t][2 * k]);   \
                    a[t][2 * k + 1] = _mm512_fmadd_ps(C[t], _mm512_cvtepi32_ps(sh), a[t][2 * k + 1]); \
                }                                                                               \
            }                                                                                   \
        }                                                                                       \
        _Pragma("GCC unroll 3") for (int t = 0; t < NT; t++)                                    \
            _Pragma("GCC unroll 8") for (int l = 0; l < 8; l++) acc[t][l] = a[t][l];           \
    }
ZP_MX(zp_mx_1, 1)
ZP_MX(zp_mx_2, 2)
ZP_MX(zp_mx_3, 3)

/* Rows [r0, r1) of a packed tensor against m quantised tokens: the 16-row blocks that overlap
 * them (rows outside the range are computed, not stored; mm_task splits at block edges), token
 * tiles of up to 3 over each block while it is in the cache. */
static MX_ZV void zp_mx_rows(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                             const float *xd, int32_t *nc, int m, size_t xstride, size_t nb,
                             float *y, size_t ldy) {
    size_t full = w->cols / 32, blk_bytes = full * COLIBRI_MXP_GROUP_BYTES;
    int32_t *offs = nc; /* -12 * each token's 4-element sums (z_x's offset), 8 per block */
    for (int t = 0; t < m; t++)
        for (size_t b = 0; b < full; b++) {
            __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)(xq + (size_t)t * xstride + b * 32));
            __m256i s12 = _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(12), xv);
            _mm256_storeu_si256((__m256i *)(void *)(offs + (size_t)t * 8 * full + b * 8),
                                _mm256_sub_epi32(_mm256_setzero_si256(), s12));
        }
    for (uint32_t blk = r0 / COLIBRI_Q4P_ROWS; blk * COLIBRI_Q4P_ROWS < r1; blk++) {
        const uint8_t *p = w->packed + (size_t)blk * blk_bytes;
        uint32_t base = blk * COLIBRI_Q4P_ROWS;
        const __mmask16 keep = colibri_packed_rows_mask(blk, r0, r1);
        for (int j = 0; j < m; j += 3) {
            int nt = m - j < 3 ? m - j : 3;
            const int8_t *xj = xq + (size_t)j * xstride;
            const float *dj = xd + (size_t)j * nb;
            const int32_t *cj = nc + (size_t)j * 8 * full;
            __m512 acc[3][8];
            if (nt == 1) zp_mx_1(p, xj, xstride, dj, nb, cj, full, acc);
            else if (nt == 2) zp_mx_2(p, xj, xstride, dj, nb, cj, full, acc);
            else zp_mx_3(p, xj, xstride, dj, nb, cj, full, acc);
            /* a8_reduce lane-wise for the 16 rows (the same additions in the same order; the
             * build does not contract), + the file path's empty tail (a8_tail's 0.0f) */
            for (int t = 0; t < nt; t++) {
                __m512 *a = acc[t];
                __m512 r = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[1]), _mm512_add_ps(a[2], a[3])),
                                         _mm512_add_ps(_mm512_add_ps(a[4], a[5]), _mm512_add_ps(a[6], a[7])));
                _mm512_mask_storeu_ps(y + (size_t)(j + t) * ldy + base, keep,
                                      _mm512_add_ps(r, _mm512_setzero_ps()));
            }
        }
    }
    _mm256_zeroupper();
}
#endif

/* ---- NEON: eight 4-lane accumulators A0..A7 = lanes 0-3, 4-7, ..., 28-31 ------------------- */

#ifdef MX_HAVE_NEON
/* u[0..3] = (A0 + A2) + (A4 + A6), u[4..7] = (A1 + A3) + (A5 + A7): the layout's reduction. */
static float neon_reduce(float32x4_t a0, float32x4_t a1, float32x4_t a2, float32x4_t a3,
                         float32x4_t a4, float32x4_t a5, float32x4_t a6, float32x4_t a7) {
    float32x4_t ul = vaddq_f32(vaddq_f32(a0, a2), vaddq_f32(a4, a6));
    float32x4_t uh = vaddq_f32(vaddq_f32(a1, a3), vaddq_f32(a5, a7));
    return ((vgetq_lane_f32(ul, 0) + vgetq_lane_f32(ul, 1)) +
            (vgetq_lane_f32(ul, 2) + vgetq_lane_f32(ul, 3))) +
           ((vgetq_lane_f32(uh, 0) + vgetq_lane_f32(uh, 1)) +
            (vgetq_lane_f32(uh, 2) + vgetq_lane_f32(uh, 3)));
}

/* A block's weights as W2 bytes in element order: e0 = elements 0..15, e1 = 16..31. */
static inline void neon_codes(const uint8_t *blk, int8x16_t lut, int8x16_t *e0, int8x16_t *e1) {
    uint8x16_t v = vld1q_u8(blk);
    int8x16_t lo = vqtbl1q_s8(lut, vandq_u8(v, vdupq_n_u8(0x0f)));
    int8x16_t hi = vqtbl1q_s8(lut, vshrq_n_u8(v, 4));
    *e0 = vzip1q_s8(lo, hi);
    *e1 = vzip2q_s8(lo, hi);
}

/* 4 weights (bytes 4j..4j+3 of e, j = 0..3 given as the low/high half and which int32 half) */
static inline float32x4_t neon_w4(int16x8_t h, int upper, float d) {
    int32x4_t i = upper ? vmovl_high_s16(h) : vmovl_s16(vget_low_s16(h));
    return vmulq_n_f32(vcvtq_f32_s32(i), d);
}

static float neon_dot(const uint8_t *q, const uint8_t *s, const float *x, size_t cols) {
    const int8x16_t lut = vld1q_s8(W2);
    float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        __builtin_prefetch(q + b * 16 + MX_PREFETCH_BYTES);
        int8x16_t e0, e1;
        neon_codes(q + b * 16, lut, &e0, &e1);
        float d = SCALE[s[b]];
        const float *xb = x + b * 32;
        int16x8_t h0 = vmovl_s8(vget_low_s8(e0)), h1 = vmovl_high_s8(e0);
        int16x8_t h2 = vmovl_s8(vget_low_s8(e1)), h3 = vmovl_high_s8(e1);
        a0 = vfmaq_f32(a0, neon_w4(h0, 0, d), vld1q_f32(xb));
        a1 = vfmaq_f32(a1, neon_w4(h0, 1, d), vld1q_f32(xb + 4));
        a2 = vfmaq_f32(a2, neon_w4(h1, 0, d), vld1q_f32(xb + 8));
        a3 = vfmaq_f32(a3, neon_w4(h1, 1, d), vld1q_f32(xb + 12));
        a4 = vfmaq_f32(a4, neon_w4(h2, 0, d), vld1q_f32(xb + 16));
        a5 = vfmaq_f32(a5, neon_w4(h2, 1, d), vld1q_f32(xb + 20));
        a6 = vfmaq_f32(a6, neon_w4(h3, 0, d), vld1q_f32(xb + 24));
        a7 = vfmaq_f32(a7, neon_w4(h3, 1, d), vld1q_f32(xb + 28));
    }
    return neon_reduce(a0, a1, a2, a3, a4, a5, a6, a7) + mx_tail(q, s, x, cols);
}

/* One row against four tokens, one lane group (8 lanes: 2 accumulators per token) at a time. */
static void neon_tile(const uint8_t *q, const uint8_t *s, const float *const x[4], size_t cols,
                      float out[4]) {
    const int8x16_t lut = vld1q_s8(W2);
    float32x4_t part[4][8];
    size_t full = cols / 32;
    for (int k = 0; k < 4; k++) {
        float32x4_t l0 = vdupq_n_f32(0), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
        for (size_t b = 0; b < full; b++) {
            int8x16_t e0, e1;
            neon_codes(q + b * 16, lut, &e0, &e1);
            int8x16_t e = k < 2 ? e0 : e1;
            int16x8_t h = k & 1 ? vmovl_high_s8(e) : vmovl_s8(vget_low_s8(e));
            float d = SCALE[s[b]];
            float32x4_t wl = neon_w4(h, 0, d), wh = neon_w4(h, 1, d);
            size_t o = b * 32 + 8 * (size_t)k;
            l0 = vfmaq_f32(l0, wl, vld1q_f32(x[0] + o)), h0 = vfmaq_f32(h0, wh, vld1q_f32(x[0] + o + 4));
            l1 = vfmaq_f32(l1, wl, vld1q_f32(x[1] + o)), h1 = vfmaq_f32(h1, wh, vld1q_f32(x[1] + o + 4));
            l2 = vfmaq_f32(l2, wl, vld1q_f32(x[2] + o)), h2 = vfmaq_f32(h2, wh, vld1q_f32(x[2] + o + 4));
            l3 = vfmaq_f32(l3, wl, vld1q_f32(x[3] + o)), h3 = vfmaq_f32(h3, wh, vld1q_f32(x[3] + o + 4));
        }
        part[0][2 * k] = l0, part[0][2 * k + 1] = h0, part[1][2 * k] = l1, part[1][2 * k + 1] = h1;
        part[2][2 * k] = l2, part[2][2 * k + 1] = h2, part[3][2 * k] = l3, part[3][2 * k + 1] = h3;
    }
    for (int t = 0; t < 4; t++) {
        float32x4_t *A = part[t];
        out[t] = neon_reduce(A[0], A[1], A[2], A[3], A[4], A[5], A[6], A[7]) + mx_tail(q, s, x[t], cols);
    }
}

/* 8-bit without SDOT: widening multiplies, then pairwise adds into the 4-element lane sums. */
static inline int32x4_t neon_sums16(int8x16_t w, int8x16_t x) { /* groups 0..3 of 16 bytes */
    int32x4_t p0 = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(x)));
    int32x4_t p1 = vpaddlq_s16(vmull_high_s8(w, x));
    return vpaddq_s32(p0, p1);
}

static float neon_a8_dot(const uint8_t *q, const uint8_t *s, const int8_t *x, const float *d,
                         size_t full) {
    const int8x16_t lut = vld1q_s8(W2);
    float32x4_t lo = vdupq_n_f32(0), hi = lo;
    for (size_t b = 0; b < full; b++) {
        int8x16_t e0, e1;
        neon_codes(q + b * 16, lut, &e0, &e1);
        float c = SCALE[s[b]] * d[b];
        lo = vfmaq_n_f32(lo, vcvtq_f32_s32(neon_sums16(e0, vld1q_s8(x + b * 32))), c);
        hi = vfmaq_n_f32(hi, vcvtq_f32_s32(neon_sums16(e1, vld1q_s8(x + b * 32 + 16))), c);
    }
    float L[8];
    vst1q_f32(L, lo);
    vst1q_f32(L + 4, hi);
    return a8_reduce(L);
}

static void neon_a8_4x1(const uint8_t *const q[], const uint8_t *const s[], const int8_t *const x[],
                        const float *const d[], size_t full, float out[]) {
    for (int r = 0; r < 4; r++) out[r] = neon_a8_dot(q[r], s[r], x[0], d[0], full);
}

static void neon_a8_2x4(const uint8_t *const q[], const uint8_t *const s[], const int8_t *const x[],
                        const float *const d[], size_t full, float out[]) {
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++) out[r * 4 + t] = neon_a8_dot(q[r], s[r], x[t], d[t], full);
}

#ifdef MX_HAVE_SDOT
/* SDOT: lane l of vdotq_s32(0, e, x) is the sum of bytes 4l..4l+3: the layout's S[l]. */
SDOT_FN static inline float32x4_t sdot_step(float32x4_t acc, int8x16_t e, const int8_t *x, float c) {
    return vfmaq_n_f32(acc, vcvtq_f32_s32(vdotq_s32(vdupq_n_s32(0), e, vld1q_s8(x))), c);
}

SDOT_FN static void sdot_a8_4x1(const uint8_t *const q[], const uint8_t *const s[],
                                const int8_t *const x[], const float *const d[], size_t full,
                                float out[]) {
    const int8x16_t lut = vld1q_s8(W2);
    float32x4_t l0 = vdupq_n_f32(0), h0 = l0, l1 = l0, h1 = l0, l2 = l0, h2 = l0, l3 = l0, h3 = l0;
    for (size_t b = 0; b < full; b++) {
        const int8_t *xb = x[0] + b * 32;
        float db = d[0][b];
        int8x16_t e0, e1;
        __builtin_prefetch(q[0] + b * 16 + MX_PREFETCH_BYTES);
        __builtin_prefetch(q[2] + b * 16 + MX_PREFETCH_BYTES);
        neon_codes(q[0] + b * 16, lut, &e0, &e1);
        float c = SCALE[s[0][b]] * db;
        l0 = sdot_step(l0, e0, xb, c), h0 = sdot_step(h0, e1, xb + 16, c);
        neon_codes(q[1] + b * 16, lut, &e0, &e1);
        c = SCALE[s[1][b]] * db;
        l1 = sdot_step(l1, e0, xb, c), h1 = sdot_step(h1, e1, xb + 16, c);
        neon_codes(q[2] + b * 16, lut, &e0, &e1);
        c = SCALE[s[2][b]] * db;
        l2 = sdot_step(l2, e0, xb, c), h2 = sdot_step(h2, e1, xb + 16, c);
        neon_codes(q[3] + b * 16, lut, &e0, &e1);
        c = SCALE[s[3][b]] * db;
        l3 = sdot_step(l3, e0, xb, c), h3 = sdot_step(h3, e1, xb + 16, c);
    }
    float L[8];
    vst1q_f32(L, l0), vst1q_f32(L + 4, h0), out[0] = a8_reduce(L);
    vst1q_f32(L, l1), vst1q_f32(L + 4, h1), out[1] = a8_reduce(L);
    vst1q_f32(L, l2), vst1q_f32(L + 4, h2), out[2] = a8_reduce(L);
    vst1q_f32(L, l3), vst1q_f32(L + 4, h3), out[3] = a8_reduce(L);
}

SDOT_FN static void sdot_a8_2x4(const uint8_t *const q[], const uint8_t *const s[],
                                const int8_t *const x[], const float *const d[], size_t full,
                                float out[]) {
    const int8x16_t lut = vld1q_s8(W2);
    float32x4_t acc[16];
    for (int i = 0; i < 16; i++) acc[i] = vdupq_n_f32(0);
    for (size_t b = 0; b < full; b++) {
        int8x16_t w[4];
        neon_codes(q[0] + b * 16, lut, &w[0], &w[1]);
        neon_codes(q[1] + b * 16, lut, &w[2], &w[3]);
        float s0 = SCALE[s[0][b]], s1 = SCALE[s[1][b]];
        for (int t = 0; t < 4; t++) {
            const int8_t *xb = x[t] + b * 32;
            float c0 = s0 * d[t][b], c1 = s1 * d[t][b];
            acc[2 * t] = sdot_step(acc[2 * t], w[0], xb, c0);
            acc[2 * t + 1] = sdot_step(acc[2 * t + 1], w[1], xb + 16, c0);
            acc[8 + 2 * t] = sdot_step(acc[8 + 2 * t], w[2], xb, c1);
            acc[8 + 2 * t + 1] = sdot_step(acc[8 + 2 * t + 1], w[3], xb + 16, c1);
        }
    }
    for (int r = 0; r < 2; r++)
        for (int t = 0; t < 4; t++) {
            float L[8];
            vst1q_f32(L, acc[8 * r + 2 * t]);
            vst1q_f32(L + 4, acc[8 * r + 2 * t + 1]);
            out[r * 4 + t] = a8_reduce(L);
        }
}
#endif
#endif

/* ---- selection and the row loops ------------------------------------------------------------ */

static pthread_once_t mx_once = PTHREAD_ONCE_INIT;

static void mx_pick(void) {
    for (int s = 0; s < 256; s++) SCALE[s] = ldexpf(1.0f, s - 128);
    M.dot = scalar_dot;
    M.tile = scalar_tile;
    M.a8_4x1 = scalar_a8_4x1;
    M.a8_2x4 = scalar_a8_2x4;
    M.quantize = a8_quantize;
    M.name = "scalar";
#ifdef MX_HAVE_AVX2
    if (colibri_x86_features() & COLIBRI_X86_AVX2) {
        M.dot = avx2_dot;
        M.tile = avx2_tile;
        M.a8_4x1 = avx2_a8_4x1;
        M.a8_2x4 = avx2_a8_2x4;
        M.name = "avx2";
    }
    if (colibri_x86_features() & COLIBRI_X86_AVX512) {
        M.dot = z_dot;
        M.tile = z_tile;
        M.quantize = z_a8_quantize;
        M.name = "avx512";
        if (colibri_x86_features() & COLIBRI_X86_VNNI) {
            M.a8_4x1 = z_a8_4x1;
            M.a8_2x4 = z_a8_2x4;
            M.a8_4x4 = z_a8_4x4;
            M.a8_packed = zp_mx_rows;
            M.name = "avx512-vnni";
        }
    }
#endif
#ifdef MX_HAVE_NEON
    M.dot = neon_dot;
    M.tile = neon_tile;
    M.a8_4x1 = neon_a8_4x1;
    M.a8_2x4 = neon_a8_2x4;
    M.name = "neon";
#ifdef MX_HAVE_SDOT
    if (colibri_arm_features() & COLIBRI_ARM_DOTPROD) {
        M.a8_4x1 = sdot_a8_4x1;
        M.a8_2x4 = sdot_a8_2x4;
        M.name = "neon-dotprod";
    }
#endif
#endif
}

const char *colibri_mxfp4_kernels_init(void) {
    pthread_once(&mx_once, mx_pick);
    return M.name;
}

int colibri_mxfp4_kernels_have_packed(void) {
    colibri_mxfp4_kernels_init();
    return M.a8_packed != NULL;
}

void colibri_mxfp4_row_f32(const colibri_tensor *w, uint32_t r, float *out) {
    colibri_mxfp4_kernels_init();
    size_t nb = colibri_mx_blocks(w->cols);
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * nb * COLIBRI_MX_BLOCK_BYTES;
    const uint8_t *s = colibri_mx_scales(w) + (size_t)r * nb;
    for (size_t i = 0; i < w->cols; i++)
        out[i] = (float)W2[mx_code(q + (i / 32) * 16, i % 32)] * SCALE[s[i / 32]];
}

void colibri_mxfp4_rows_dot(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x,
                            int n, size_t ldx, float *y, size_t ldy) {
    colibri_mxfp4_kernels_init();
    size_t cols = w->cols, nb = colibri_mx_blocks(w->cols), rowbytes = nb * COLIBRI_MX_BLOCK_BYTES;
    const uint8_t *base = (const uint8_t *)w->data, *sc = colibri_mx_scales(w);
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *q = base + (size_t)r * rowbytes, *s = sc + (size_t)r * nb;
        int j = 0;
        for (; n > 1 && j < n; j += 4) { /* several tokens: the row dequantised in registers once
                                          * per lane group for four of them */
            int nt = n - j < 4 ? n - j : 4;
            const float *xs[4];
            for (int t = 0; t < 4; t++) xs[t] = x + (size_t)(j + (t < nt ? t : 0)) * ldx;
            float o[4];
            M.tile(q, s, xs, cols, o);
            for (int t = 0; t < nt; t++) y[(size_t)(j + t) * ldy + r] = o[t];
        }
        if (n == 1) y[r] = M.dot(q, s, x, cols);
    }
}

/* One call's weights and one group of its quantised tokens, as the 8-bit tiles read them. */
typedef struct {
    const uint8_t *base, *sc; /* the matrix's blocks and scales */
    size_t rowbytes, nb, cols;
    const int8_t *xq;         /* m tokens, xstride bytes apart; xd: their block scales, nb apart */
    const float *xd;
    size_t xstride;
    int m;
} a8_group;

/* rows r..r + rows - 1 (rows <= R; the tile's other rows repeat row r, unused) against the
 * group's tokens, 4 at a time (past the last token: repeats, unused), plus each value's tail */
static void a8_tiles(const a8_group *g, mx_a8_fn tile, uint32_t R, uint32_t rows, uint32_t r,
                     float *y, size_t ldy) {
    const uint8_t *q[4], *s[4];
    for (uint32_t k = 0; k < R; k++) {
        uint32_t rr = r + (k < rows ? k : 0);
        q[k] = g->base + (size_t)rr * g->rowbytes;
        s[k] = g->sc + (size_t)rr * g->nb;
    }
    for (int j = 0; j < g->m; j += 4) {
        int nt = g->m - j < 4 ? g->m - j : 4;
        const int8_t *xs[4];
        const float *ds[4];
        for (int t = 0; t < 4; t++) {
            int tt = j + (t < nt ? t : 0);
            xs[t] = g->xq + (size_t)tt * g->xstride;
            ds[t] = g->xd + (size_t)tt * g->nb;
        }
        float o[16];
        tile(q, s, xs, ds, g->cols / 32, o);
        for (uint32_t k = 0; k < rows; k++)
            for (int t = 0; t < nt; t++)
                y[(size_t)(j + t) * ldy + r + k] = o[k * 4 + t] + a8_tail(q[k], s[k], xs[t], ds[t], g->cols);
    }
}

void colibri_mxfp4_rows_dot_a8(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x,
                               int n, size_t ldx, float *y, size_t ldy) {
    colibri_mxfp4_kernels_init();
    size_t cols = w->cols, nb = colibri_mx_blocks(w->cols), rowbytes = nb * COLIBRI_MX_BLOCK_BYTES;
    size_t full = cols / 32, xstride = nb * 32;
    const uint8_t *base = (const uint8_t *)w->data, *sc = colibri_mx_scales(w);
    if (xstride > MX_A8_MAX_COLS) { /* wider than the stack buffer: the f32 path */
        colibri_mxfp4_rows_dot(w, r0, r1, x, n, ldx, y, ldy);
        return;
    }
    int8_t xq[MX_A8_BYTES];
    float xd[MX_A8_BLOCKS];
    int32_t nc[MX_A8_BYTES / 4]; /* the packed kernel's offsets: 8 per block and token */
    int group = (int)(MX_A8_BYTES / xstride);
    if ((size_t)group * nb > MX_A8_BLOCKS) group = (int)(MX_A8_BLOCKS / nb);
    for (int j0 = 0; j0 < n; j0 += group) {
        int m = n - j0 < group ? n - j0 : group;
        for (int t = 0; t < m; t++)
            M.quantize(x + (size_t)(j0 + t) * ldx, cols, xq + (size_t)t * xstride, xd + (size_t)t * nb);
        if (w->packed && M.a8_packed) { /* full blocks only: the packed layout has no tail */
            M.a8_packed(w, r0, r1, xq, xd, nc, m, xstride, nb, y + (size_t)j0 * ldy, ldy);
            continue;
        }
        uint32_t r = r0;
        if (m == 1) /* decode: four rows at once */
            for (; r + 4 <= r1; r += 4) {
                const uint8_t *q[4], *s[4];
                for (int k = 0; k < 4; k++) {
                    q[k] = base + (size_t)(r + (uint32_t)k) * rowbytes;
                    s[k] = sc + (size_t)(r + (uint32_t)k) * nb;
                }
                const int8_t *xs[1] = {xq};
                const float *ds[1] = {xd};
                float o[4];
                M.a8_4x1(q, s, xs, ds, full, o);
                for (int k = 0; k < 4; k++) y[(size_t)j0 * ldy + r + (uint32_t)k] =
                    o[k] + a8_tail(q[k], s[k], xq, xd, cols);
            }
        a8_group g = {base, sc, rowbytes, nb, cols, xq, xd, xstride, m};
        float *yg = y + (size_t)j0 * ldy;
        for (; M.a8_4x4 && m > 1 && r + 4 <= r1; r += 4) /* 4-row x 4-token tiles, then pairs */
            a8_tiles(&g, M.a8_4x4, 4, 4, r, yg, ldy);
        for (; r < r1; r += 2) /* 2-row x 4-token tiles */
            a8_tiles(&g, M.a8_2x4, 2, r1 - r < 2 ? r1 - r : 2, r, yg, ldy);
    }
}

/* ---- self-test (`colibri selftest`) ---------------------------------------------------------- */

/* The packed layout (q4_pack.h): 32 rows (two blocks) x COLS against N tokens, all rows, rows
 * split inside a block, and one token at a time, against the file layout's bits. */
enum { MXP_ROWS = 32, MXP_MAXC = 512, MXP_N = 7 };
static int mx_packed_check(int COLS, int N, uint32_t seed) {
    int NB = COLS / 32;
    uint8_t q[MXP_ROWS * MXP_MAXC / 2], s[MXP_ROWS * MXP_MAXC / 32], packed[MXP_ROWS * MXP_MAXC / 32 * 17];
    float x[MXP_N * MXP_MAXC], ref[MXP_N * MXP_ROWS], got[MXP_N * MXP_ROWS];
    for (int i = 0; i < MXP_ROWS * NB * 16; i++) q[i] = (uint8_t)((seed = seed * 1664525u + 1013904223u) >> 24);
    for (int i = 0; i < MXP_ROWS * NB; i++) /* the subnormal exponents 0 and 1, 2^-126, and 2^-9 .. 2^2 */
        s[i] = i % 37 == 0 ? 0 : i % 37 == 1 ? 1 : i % 37 == 2 ? 2
                                       : (uint8_t)(119 + ((seed = seed * 1664525u + 1013904223u) >> 24) % 12);
    for (int i = 0; i < N * COLS; i++)
        x[i] = (float)((int)((seed = seed * 1664525u + 1013904223u) >> 16) % 2001 - 1000) / 500.0f;
    colibri_tensor t = {q, (const float *)(const void *)s, COLIBRI_DT_MXFP4, MXP_ROWS, (uint32_t)COLS, NULL};
    if (colibri_mx_packed_bytes(&t) != (size_t)MXP_ROWS * NB * 17) return 0;
    colibri_mxfp4_rows_dot_a8(&t, 0, MXP_ROWS, x, N, (size_t)COLS, ref, MXP_ROWS);
    colibri_mx_pack(&t, packed);
    t.packed = packed;
    memset(got, 0xff, sizeof got);
    colibri_mxfp4_rows_dot_a8(&t, 0, MXP_ROWS, x, N, (size_t)COLS, got, MXP_ROWS);
    int ok = memcmp(got, ref, (size_t)N * MXP_ROWS * sizeof(float)) == 0;
    memset(got, 0xff, sizeof got); /* split inside a block: rows [0, 5), [5, 21), [21, 32) */
    colibri_mxfp4_rows_dot_a8(&t, 0, 5, x, N, (size_t)COLS, got, MXP_ROWS);
    colibri_mxfp4_rows_dot_a8(&t, 5, 21, x, N, (size_t)COLS, got, MXP_ROWS);
    colibri_mxfp4_rows_dot_a8(&t, 21, MXP_ROWS, x, N, (size_t)COLS, got, MXP_ROWS);
    ok &= memcmp(got, ref, (size_t)N * MXP_ROWS * sizeof(float)) == 0;
    for (int j = 0; j < N; j++) { /* decode */
        float one[MXP_ROWS];
        colibri_mxfp4_rows_dot_a8(&t, 0, MXP_ROWS, x + (size_t)j * COLS, 1, (size_t)COLS, one, MXP_ROWS);
        ok &= memcmp(one, ref + (size_t)j * MXP_ROWS, sizeof one) == 0;
    }
    return ok;
}

int colibri_mxfp4_selftest(char *msg, size_t len) {
    enum { COLS = 203, ROWS = 6, N = 5, NB = (COLS + 31) / 32 }; /* 6 full blocks + an 11-column tail */
    uint8_t q[ROWS * NB * 16], s[ROWS * NB];
    float x[N * COLS], y[N * ROWS], y1[N * ROWS], row[COLS];
    uint32_t r = 11;
    for (size_t i = 0; i < sizeof q; i++) q[i] = (uint8_t)((r = r * 1664525u + 1013904223u) >> 24);
    for (size_t i = 0; i < sizeof s; i++) /* exponents around 2^-9 .. 2^2, a subnormal and a large one */
        s[i] = i == 2 ? 0 : i == 5 ? 160 : (uint8_t)(119 + ((r = r * 1664525u + 1013904223u) >> 24) % 12);
    for (int i = 0; i < N * COLS; i++)
        x[i] = (float)((int)((r = r * 1664525u + 1013904223u) >> 16) % 2001 - 1000) / 500.0f;
    colibri_tensor t = {q, (const float *)(const void *)s, COLIBRI_DT_MXFP4, ROWS, COLS, NULL};
    const char *name = colibri_mxfp4_kernels_init();
    int ok = 1;
    for (int pass = 0; pass < 2; pass++) { /* f32, then 8-bit activations */
        void (*dot)(const colibri_tensor *, uint32_t, uint32_t, const float *, int, size_t, float *,
                    size_t) = pass ? colibri_mxfp4_rows_dot_a8 : colibri_mxfp4_rows_dot;
        dot(&t, 0, ROWS, x, N, COLS, y, ROWS);
        for (int j = 0; j < N; j++) { /* decode: one token at a time; rows 1..5 = a 4-row tile + 1 */
            dot(&t, 1, ROWS, x + j * COLS, 1, COLS, y1 + j * ROWS, ROWS);
            dot(&t, 0, 1, x + j * COLS, 1, COLS, y1 + j * ROWS, ROWS);
        }
        int8_t xq[N * NB * 32];
        float xd[N * NB];
        for (int j = 0; j < N; j++) a8_quantize(x + j * COLS, COLS, xq + j * NB * 32, xd + j * NB);
        for (uint32_t i = 0; i < ROWS; i++) {
            colibri_mxfp4_row_f32(&t, i, row);
            for (int j = 0; j < N; j++) {
                double ref = 0, mag = 0;
                for (int c = 0; c < COLS; c++) {
                    double xv = pass ? xd[j * NB + c / 32] * (double)xq[j * NB * 32 + c] : x[j * COLS + c];
                    ref += (double)row[c] * xv;
                    mag += fabs((double)row[c] * xv);
                }
                float got = y[j * ROWS + i];
                /* the scalar layout's bits (one layout on every CPU) */
                float lay = pass ? scalar_a8_dot(q + i * NB * 16, s + i * NB, xq + j * NB * 32, xd + j * NB, COLS / 32) +
                                       a8_tail(q + i * NB * 16, s + i * NB, xq + j * NB * 32, xd + j * NB, COLS)
                                 : scalar_dot(q + i * NB * 16, s + i * NB, x + j * COLS, COLS);
                ok &= fabs(got - ref) <= 1e-5 * (mag + 1e-30) && memcmp(&lay, &got, sizeof got) == 0 &&
                      memcmp(&y1[j * ROWS + i], &got, sizeof got) == 0;
            }
        }
    }
    { /* the quantiser against the scalar one: random, all-zero, ties (d = 1), a subnormal
       * amax (1 / d = inf: 0 * inf is NaN, quantised to 0), a NaN, a 7-column tail */
        enum { QC = 5 * 32 + 7 };
        float xa[QC], da[6], db[6];
        int8_t qa[QC], qb[QC];
        for (int i = 0; i < QC; i++) xa[i] = x[i % (N * COLS)];
        for (int i = 32; i < 64; i++) xa[i] = 0.0f;
        for (int i = 64; i < 96; i++) xa[i] = i == 64 ? 127.0f : (float)(i - 80) + 0.5f;
        for (int i = 96; i < 128; i++) xa[i] = i == 97 ? 1e-40f : i == 98 ? -3e-41f : 0.0f;
        xa[130] = NAN;
        a8_quantize(xa, QC, qa, da);
        M.quantize(xa, QC, qb, db);
        ok &= memcmp(qa, qb, sizeof qa) == 0 && memcmp(da, db, sizeof da) == 0;
    }
    /* packed: 1 block; 16 blocks against 7 tokens (3-token tiles and a rest) */
    ok = ok && mx_packed_check(32, 2, 3) && mx_packed_check(512, MXP_N, 9);
    snprintf(msg, len, "mxfp4 rows_dot (%s) == double reference; decode bits == prefill bits == "
             "scalar layout bits (f32 and 8-bit activations; the vector quantiser; the packed layout%s)", name,
             M.a8_packed ? "" : ": not read on this CPU");
    return ok;
}
