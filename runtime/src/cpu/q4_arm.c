/* The aarch64 q4 kernels (see q4_table.h; the lane layout: kernels_q4.c): NEON, and SDOT for
 * the int8-activation dots (per-function target attribute, chosen at run time from the HWCAPs). */
#include "q4_table.h"
#include "cpu_features.h"

#if defined(__aarch64__)
#include <arm_neon.h>

/* ---- NEON: eight 4-lane accumulators A0..A7 = lanes 0-3, 4-7, ..., 28-31 ------------------- */

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

/* A row dequantised to f32 (exact: (nibble - 8) * d in f32, the scalar q4_nib * d): the prefill's
 * scratch row; the tail past the last full group is left to colibri_q4_row_f32's scalar loop. */
static void neon_q4_row_full_groups(const uint8_t *q, const uint16_t *d, size_t full, float *out) {
    for (size_t b = 0; b < full; b++) {
        int8x16_t lo, hi;
        neon_q4_unpack(q + b * 16, &lo, &hi);
        float dd = vgetq_lane_f32(vcvt_f32_f16(vreinterpret_f16_u16(vdup_n_u16(d[b]))), 0);
        int16x8_t h[4] = {vmovl_s8(vget_low_s8(lo)), vmovl_s8(vget_high_s8(lo)),
                          vmovl_s8(vget_low_s8(hi)), vmovl_s8(vget_high_s8(hi))};
        float *o = out + b * 32;
        for (int k = 0; k < 4; k++) {
            vst1q_f32(o + 8 * k, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_low_s16(h[k]))), dd));
            vst1q_f32(o + 8 * k + 4, vmulq_n_f32(vcvtq_f32_s32(vmovl_s16(vget_high_s16(h[k]))), dd));
        }
    }
}

/* Prefill: two dequantised rows against four tokens, one 4-lane group A_k at a time over all
 * blocks (the layout's lane chains are independent): 8 accumulators, two weight and four token
 * loads per eight fused multiply-adds. Each (row, token, lane) sees exactly neon_f32_dot's
 * operations in its order, so out[r * 4 + j] has its bits (and so decode's neon_q4_dot's). */
static void neon_f32_tile_2x4(const float *const w[2], const float *const x[4], size_t cols,
                              float out[8]) {
    float32x4_t part[2][4][8];
    size_t full = cols / 32;
    for (int k = 0; k < 8; k++) {
        float32x4_t a00 = vdupq_n_f32(0), a01 = a00, a02 = a00, a03 = a00;
        float32x4_t a10 = a00, a11 = a00, a12 = a00, a13 = a00;
        const float *w0 = w[0] + 4 * k, *w1 = w[1] + 4 * k;
        const float *x0 = x[0] + 4 * k, *x1 = x[1] + 4 * k, *x2 = x[2] + 4 * k, *x3 = x[3] + 4 * k;
        for (size_t b = 0; b < full; b++) {
            size_t o = b * 32;
            float32x4_t v0 = vld1q_f32(w0 + o), v1 = vld1q_f32(w1 + o), t = vld1q_f32(x0 + o);
            a00 = vfmaq_f32(a00, v0, t);
            a10 = vfmaq_f32(a10, v1, t);
            t = vld1q_f32(x1 + o);
            a01 = vfmaq_f32(a01, v0, t);
            a11 = vfmaq_f32(a11, v1, t);
            t = vld1q_f32(x2 + o);
            a02 = vfmaq_f32(a02, v0, t);
            a12 = vfmaq_f32(a12, v1, t);
            t = vld1q_f32(x3 + o);
            a03 = vfmaq_f32(a03, v0, t);
            a13 = vfmaq_f32(a13, v1, t);
        }
        part[0][0][k] = a00, part[0][1][k] = a01, part[0][2][k] = a02, part[0][3][k] = a03;
        part[1][0][k] = a10, part[1][1][k] = a11, part[1][2][k] = a12, part[1][3][k] = a13;
    }
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 4; j++) out[r * 4 + j] = neon_reduce(part[r][j]) + f32_tail(w[r], x[j], cols);
}

void colibri_q4_arm(colibri_q4_kernels *q) {
    q->dot = neon_q4_dot;
    q->dot_f32 = neon_f32_dot;
    q->dot3_f32 = neon_f32_dot3;
    q->dot_q8 = neon_q4q8_dot;
    q->row_full_groups = neon_q4_row_full_groups;
    q->f32_tile_2x4 = neon_f32_tile_2x4;
    q->name = "neon";
#ifdef Q4_HAVE_SDOT
    if (colibri_arm_features() & COLIBRI_ARM_DOTPROD) {
        q->dot_q8 = neon_sdot_q4q8_dot;
        q->name = "neon-dotprod";
    }
#endif
}
#else
void colibri_q4_arm(colibri_q4_kernels *q) { (void)q; }
#endif
