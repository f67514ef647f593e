/* The aarch64 kernels (see kernel_table.h): NEON, SDOT (dotprod) and SMMLA (i8mm), the last two
 * compiled with per-function target attributes and chosen at run time from the HWCAPs
 * (cpu_features.c), so one binary uses what the CPU has. */
#include "kernel_table.h"
#include "cpu_features.h"

#include <math.h>

#if defined(__aarch64__)
#include <arm_neon.h>
#if defined(__ARM_FEATURE_DOTPROD) || defined(COLIBRI_ARM_TARGET_ATTR)
#define COLIBRI_HAVE_SDOT 1
#endif
#if defined(__ARM_FEATURE_MATMUL_INT8) || defined(COLIBRI_ARM_TARGET_ATTR)
#define COLIBRI_HAVE_I8MM 1
#endif

/* ---- NEON: 4 x 4 lanes over blocks of 16, then blocks of 4, then a scalar tail -------------- */

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

/* 16 consecutive weights as four f32 vectors (exact). int8: one 16-byte load widened twice per
 * half (the 4-at-a-time NEON_LOAD_I8 widened each group of 4 from a 32-bit load: 1297 executed
 * instructions per 1000 multiply-accumulates of an Orin-build decode, now fewer; same values). */
#define NEON_L16(LOAD4, p, v)                                                                 \
    do {                                                                                      \
        v[0] = LOAD4(p);                                                                      \
        v[1] = LOAD4((p) + 4);                                                                \
        v[2] = LOAD4((p) + 8);                                                                \
        v[3] = LOAD4((p) + 12);                                                               \
    } while (0)
#define NEON_L16_F32(p, v) NEON_L16(NEON_LOAD_F32, p, v)
#define NEON_L16_F16(p, v) NEON_L16(NEON_LOAD_F16, p, v)
#define NEON_L16_BF16(p, v) NEON_L16(NEON_LOAD_BF16, p, v)
#define NEON_L16_I8(p, v)                                                                     \
    do {                                                                                      \
        int8x16_t b16 = vld1q_s8((const int8_t *)(p));                                        \
        int16x8_t l8 = vmovl_s8(vget_low_s8(b16)), h8 = vmovl_high_s8(b16);                   \
        v[0] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(l8)));                                    \
        v[1] = vcvtq_f32_s32(vmovl_high_s16(l8));                                             \
        v[2] = vcvtq_f32_s32(vmovl_s16(vget_low_s16(h8)));                                    \
        v[3] = vcvtq_f32_s32(vmovl_high_s16(h8));                                             \
    } while (0)

#define NEON_DOT(NAME, T, LOAD4, LOAD16, CVT)                                                 \
    static float NAME(const void *wv, const float *x, size_t n) {                             \
        const T *w = (const T *)wv;                                                           \
        float32x4_t a0 = vdupq_n_f32(0), a1 = a0, a2 = a0, a3 = a0;                           \
        size_t i = 0;                                                                         \
        for (; i + 16 <= n; i += 16) {                                                        \
            __builtin_prefetch((const char *)(w + i) + PREFETCH_BYTES);                       \
            float32x4_t wv[4];                                                                \
            LOAD16(w + i, wv);                                                                \
            a0 = vfmaq_f32(a0, wv[0], vld1q_f32(x + i));                                      \
            a1 = vfmaq_f32(a1, wv[1], vld1q_f32(x + i + 4));                                  \
            a2 = vfmaq_f32(a2, wv[2], vld1q_f32(x + i + 8));                                  \
            a3 = vfmaq_f32(a3, wv[3], vld1q_f32(x + i + 12));                                 \
        }                                                                                     \
        for (; i + 4 <= n; i += 4) a0 = vfmaq_f32(a0, LOAD4(w + i), vld1q_f32(x + i));        \
        a0 = vaddq_f32(vaddq_f32(a0, a1), vaddq_f32(a2, a3));                                 \
        float s = (vgetq_lane_f32(a0, 0) + vgetq_lane_f32(a0, 1)) +                           \
                  (vgetq_lane_f32(a0, 2) + vgetq_lane_f32(a0, 3));                            \
        for (; i < n; i++) s += CVT(w[i]) * x[i];                                             \
        return s;                                                                             \
    }
NEON_DOT(neon_dot_f32, float, NEON_LOAD_F32, NEON_L16_F32, CVT_F32)
NEON_DOT(neon_dot_f16, uint16_t, NEON_LOAD_F16, NEON_L16_F16, half_to_float)
NEON_DOT(neon_dot_bf16, uint16_t, NEON_LOAD_BF16, NEON_L16_BF16, bf16_to_float)
NEON_DOT(neon_dot_i8, int8_t, NEON_LOAD_I8, NEON_L16_I8, CVT_I8)

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
        for (; i + 16 <= n; i += 16) {
            float32x4_t v[4];
            NEON_L16_I8((const int8_t *)row + i, v);
            for (int k = 0; k < 4; k++) vst1q_f32(out + i + 4 * k, v[k]);
        }
        for (; i + 4 <= n; i += 4) vst1q_f32(out + i, NEON_LOAD_I8((const int8_t *)row + i));
        break;
    default: break;
    }
    if (i < n) colibri_convert_row_scalar((const uint8_t *)row + i * colibri_dtype_size(dtype), dtype, n - i, out + i);
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
#define NEON_DOT4(NAME, T, LOAD4, LOAD16, CVT)                                                \
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
            float32x4_t w0[4], w1[4], w2[4], w3[4];                                           \
            LOAD16(w[0] + i, w0);                                                             \
            LOAD16(w[1] + i, w1);                                                             \
            LOAD16(w[2] + i, w2);                                                             \
            LOAD16(w[3] + i, w3);                                                             \
            _Pragma("GCC unroll 4") for (int q = 0; q < 4; q++) {                             \
                float32x4_t xv = vld1q_f32(x + i + 4 * q);                                    \
                a[0][q] = vfmaq_f32(a[0][q], w0[q], xv);                                      \
                a[1][q] = vfmaq_f32(a[1][q], w1[q], xv);                                      \
                a[2][q] = vfmaq_f32(a[2][q], w2[q], xv);                                      \
                a[3][q] = vfmaq_f32(a[3][q], w3[q], xv);                                      \
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
NEON_DOT4(neon_dot4_f32, float, NEON_LOAD_F32, NEON_L16_F32, CVT_F32)
NEON_DOT4(neon_dot4_f16, uint16_t, NEON_LOAD_F16, NEON_L16_F16, half_to_float)
NEON_DOT4(neon_dot4_bf16, uint16_t, NEON_LOAD_BF16, NEON_L16_BF16, bf16_to_float)
NEON_DOT4(neon_dot4_i8, int8_t, NEON_LOAD_I8, NEON_L16_I8, CVT_I8)

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

/* ---- f16 KV cache: AArch64 FCVT rounding (round to nearest even, the scalar bits) ------------ */

static void neon_to_f16(const float *x, size_t n, uint16_t *out) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4)
        vst1_u16(out + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) out[i] = half_from_float(x[i]);
}

/* ---- int8 activations (int8.h): the scalar quantisation's bits, four values at a time -------
 * max |x| is exact in any order; x * inv, FRINTN (round to nearest even, as nearbyintf in the
 * default mode) and the clamp are elementwise. */
static void neon_quantize(const float *x, size_t n, int8_t *q, float *scale) {
    float32x4_t m = vdupq_n_f32(0);
    size_t i = 0;
    for (; i + 4 <= n; i += 4) m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(x + i))); /* FMAXNM: a NaN is skipped, as in the scalar loop */
    float amax = vmaxnmvq_f32(m);
    for (; i < n; i++) {
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    float inv, s = q8_scale(amax, &inv);
    for (i = 0; i + 4 <= n; i += 4) {
        float32x4_t v = vrndnq_f32(vmulq_n_f32(vld1q_f32(x + i), inv));
        v = vmaxq_f32(vminq_f32(v, vdupq_n_f32(127.0f)), vdupq_n_f32(-127.0f));
        int16x4_t h = vmovn_s32(vcvtq_s32_f32(v));
        int8x8_t b = vmovn_s16(vcombine_s16(h, h));
        int32_t w = vget_lane_s32(vreinterpret_s32_s8(b), 0);
        memcpy(q + i, &w, 4);
    }
    for (; i < n; i++) q[i] = q8_one(x[i] * inv);
    *scale = s;
}

/* Attention's value sum (kernel_table.h wsum_rows): 32 outputs at a time in eight registers over
 * every row, then blocks of 4, then a scalar tail; per output a multiply then an add (vmulq,
 * vaddq: never fused), row by row in order, as the portable loop. */
#define NEON_WSUM_STRIP(LOAD4, T)                                                             \
    for (; d + 32 <= n; d += 32) {                                                            \
        float32x4_t a[8];                                                                     \
        for (int k = 0; k < 8; k++) a[k] = vld1q_f32(out + d + 4 * k);                        \
        for (int i = 0; i < nr; i++) {                                                        \
            const T *v = (const T *)rows[i] + d;                                              \
            float32x4_t vw = vdupq_n_f32(w[i]);                                               \
            for (int k = 0; k < 8; k++) a[k] = vaddq_f32(a[k], vmulq_f32(vw, LOAD4(v + 4 * k))); \
        }                                                                                     \
        for (int k = 0; k < 8; k++) vst1q_f32(out + d + 4 * k, a[k]);                         \
    }                                                                                         \
    for (; d + 4 <= n; d += 4) {                                                              \
        float32x4_t a0 = vld1q_f32(out + d);                                                  \
        for (int i = 0; i < nr; i++)                                                          \
            a0 = vaddq_f32(a0, vmulq_f32(vdupq_n_f32(w[i]), LOAD4((const T *)rows[i] + d)));  \
        vst1q_f32(out + d, a0);                                                               \
    }

static void neon_wsum_rows(float *out, const float *w, const void *const *rows, int nr, size_t n,
                           int f16) {
    size_t d = 0;
    if (f16) {
        NEON_WSUM_STRIP(NEON_LOAD_F16, uint16_t)
    } else {
        NEON_WSUM_STRIP(NEON_LOAD_F32, float)
    }
    wsum_rows_tail(out, w, rows, nr, d, n, f16);
}

/* Attention's softmax exponent (kernel_table.h colibri_exp_one, lane by lane; vfmaq_f32 is the
 * fused fmaf) and its sum in eight lanes: two accumulators, lanes 0-3 and 4-7 of each block. */
static float32x4_t neon_exp4(float32x4_t v) {
    float32x4_t t = vmulq_f32(v, vdupq_n_f32(CEXP_LOG2E));
    float32x4_t n = vaddq_f32(t, vdupq_n_f32(CEXP_SHIFT));
    n = vsubq_f32(n, vdupq_n_f32(CEXP_SHIFT));
    float32x4_t r = vfmaq_f32(v, n, vdupq_n_f32(-CEXP_LN2_HI));
    r = vfmaq_f32(r, n, vdupq_n_f32(-CEXP_LN2_LO));
    float32x4_t p = vfmaq_f32(vdupq_n_f32(CEXP_P1), vdupq_n_f32(CEXP_P0), r);
    p = vfmaq_f32(vdupq_n_f32(CEXP_P2), p, r);
    p = vfmaq_f32(vdupq_n_f32(CEXP_P3), p, r);
    p = vfmaq_f32(vdupq_n_f32(CEXP_P4), p, r);
    p = vfmaq_f32(vdupq_n_f32(CEXP_P5), p, r);
    float32x4_t y = vfmaq_f32(r, p, vmulq_f32(r, r));
    y = vaddq_f32(y, vdupq_n_f32(1.0f));
    int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    y = vmulq_f32(y, vreinterpretq_f32_s32(e));
    /* the scalar's cases: NaN stays, below the range (and -inf) 0, above it infinity */
    y = vbslq_f32(vcgeq_f32(v, vdupq_n_f32(CEXP_LO)), y, vdupq_n_f32(0.0f));
    y = vbslq_f32(vcgtq_f32(v, vdupq_n_f32(CEXP_HI)), vdupq_n_f32(INFINITY), y);
    return vbslq_f32(vceqq_f32(v, v), y, v);
}

static float neon_exp_sum(float *x, size_t n, float sub) {
    const float32x4_t vs = vdupq_n_f32(sub);
    float32x4_t a0 = vdupq_n_f32(0.0f), a1 = a0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        float32x4_t e0 = neon_exp4(vsubq_f32(vld1q_f32(x + i), vs));
        float32x4_t e1 = neon_exp4(vsubq_f32(vld1q_f32(x + i + 4), vs));
        vst1q_f32(x + i, e0);
        vst1q_f32(x + i + 4, e1);
        a0 = vaddq_f32(a0, e0);
        a1 = vaddq_f32(a1, e1);
    }
    float s = ((vgetq_lane_f32(a0, 0) + vgetq_lane_f32(a0, 1)) +
               (vgetq_lane_f32(a0, 2) + vgetq_lane_f32(a0, 3))) +
              ((vgetq_lane_f32(a1, 0) + vgetq_lane_f32(a1, 1)) +
               (vgetq_lane_f32(a1, 2) + vgetq_lane_f32(a1, 3)));
    for (; i < n; i++) {
        x[i] = colibri_exp_one(x[i] - sub);
        s += x[i];
    }
    return s;
}

void colibri_arm_kernels(colibri_cpu_kernels *k) {
    k->dot[COLIBRI_DT_F32] = neon_dot_f32;
    k->dot[COLIBRI_DT_F16] = neon_dot_f16;
    k->dot[COLIBRI_DT_BF16] = neon_dot_bf16;
    k->dot[COLIBRI_DT_INT8] = neon_dot_i8;
    k->dot4[COLIBRI_DT_F32] = neon_dot4_f32;
    k->dot4[COLIBRI_DT_F16] = neon_dot4_f16;
    k->dot4[COLIBRI_DT_BF16] = neon_dot4_bf16;
    k->dot4[COLIBRI_DT_INT8] = neon_dot4_i8;
    k->dot_q8 = neon_dot_q8;
    k->convert = neon_convert;
    k->tile_2x3 = neon_tile_2x3;
    k->name = "neon";
    int feat = colibri_arm_features();
#ifdef COLIBRI_HAVE_SDOT
    if (feat & COLIBRI_ARM_DOTPROD) {
        k->dot_q8 = neon_sdot_q8;
        k->dot4_q8 = neon_dot4_q8;
        k->tile_q8 = neon_q8_tile;
        k->name = "neon-dotprod";
#ifdef COLIBRI_HAVE_I8MM
        if (feat & COLIBRI_ARM_I8MM) {
            /* prefill only: for one token half of each SMMLA's products would be thrown away,
             * so decode keeps the SDOT streams */
            k->rows_q8 = i8mm_rows_dot_q8;
            k->name = "neon-i8mm";
        }
#endif
    }
#endif
    (void)feat;
    k->to_f16 = neon_to_f16;
    k->wsum_rows = neon_wsum_rows;
    k->exp_sum = neon_exp_sum;
    k->quantize = neon_quantize;
}
#else
void colibri_arm_kernels(colibri_cpu_kernels *k) { (void)k; }
#endif
