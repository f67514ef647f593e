/* The CPU kernel table, internal to cpu/: the portable dispatch (kernels.c) fills it with the
 * scalar kernels, then lets the ISA file of this build (x86.c, arm.c) replace what the CPU offers;
 * the row loops of kernels.c only call through it. Dependencies point one way: kernels.c ->
 * x86.c / arm.c -> this header; no ISA file calls back into kernels.c.
 *
 * Every entry computes each (row, token) value with its family's one lane layout and reduction
 * order (docs/runtime.md, "Kernels"), so any entry that replaces another gives the same bits. */
#ifndef COLIBRI_CPU_KERNEL_TABLE_H
#define COLIBRI_CPU_KERNEL_TABLE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/half.h"
#include "core/model.h"

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

typedef struct {
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
    /* colibri_rows_dot_q8 on an int8 tensor's packed layout (q4_pack.h), any n; NULL: not
     * provided (the model is then not packed for it) */
    void (*rows_q8_packed)(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                           const float *xscale, int n, size_t ldx, float *y, size_t ldy);
    const char *name;
    /* the f16 KV cache: f32 -> half rounding (the scalar half_from_float's bits) and the widened
     * value sum out[i] += w * h[i] (a multiply then an add); NULL: the portable loops */
    void (*to_f16)(const float *x, size_t n, uint16_t *out);
    void (*axpy_f16)(float *out, float w, const uint16_t *h, size_t n);
    /* attention's value sum (colibri_wsum_rows): out[d] += w[i] * rows[i][d] for i = 0..nr-1 in
     * order, each term a multiply (of the exactly widened value when f16) then an add, never
     * fused; NULL: the portable loop */
    void (*wsum_rows)(float *out, const float *w, const void *const *rows, int nr, size_t n,
                      int f16);
    /* attention's scores (colibri_att_scores): out[h * ldo + i] = dot[f32 or f16](rows[i],
     * x + h * ldx, n) bit for bit, for h < nx, i < nr; NULL: colibri_dot_rows per query */
    void (*scores)(const float *x, size_t ldx, int nx, const void *const *rows, int nr, size_t n,
                   int f16, float *out, size_t ldo);
    /* attention's softmax exponent (colibri_exp_sum): colibri_exp_sum_scalar's bits, values and
     * sum; NULL: the scalar */
    float (*exp_sum)(float *x, size_t n, float sub);
    /* colibri_quantize_row with colibri_quantize_row_scalar's bits (int8.h); NULL: the scalar */
    void (*quantize)(const float *x, size_t n, int8_t *q, float *scale);
} colibri_cpu_kernels;

/* Replace the entries this CPU has faster versions of (each file compiles to nothing on the
 * other architecture; kernels.c calls the one of its build). */
void colibri_x86_kernels(colibri_cpu_kernels *k);
void colibri_arm_kernels(colibri_cpu_kernels *k);

/* Attention's softmax exponent, one value (kernels.h colibri_exp_sum): e^x by a Cody-Waite
 * reduction x = n ln2 + r (n rounded to nearest even by adding and subtracting 1.5 * 2^23) and
 * Cephes' degree-5 polynomial for (e^r - 1 - r) / r^2, every step a single IEEE operation or an
 * explicit fused multiply-add, each its own statement (so no compiler contracts it: clang fuses
 * within an expression), so the vector versions reproduce it lane by lane. Within 2 ulp of e^x
 * for -87 <= x <= 88 (runtime/tests/test_runtime.c sweeps it); below -87 (e^x < 1.7e-38) and
 * -inf: 0; above 88: infinity; NaN: itself. */
#define CEXP_LO (-87.0f)
#define CEXP_HI 88.0f
#define CEXP_LOG2E 1.44269504088896341f
#define CEXP_SHIFT 12582912.0f
#define CEXP_LN2_HI 0.693145751953125f
#define CEXP_LN2_LO 1.42860682030941723e-6f
#define CEXP_P0 1.9875691500e-4f
#define CEXP_P1 1.3981999507e-3f
#define CEXP_P2 8.3334519073e-3f
#define CEXP_P3 4.1665795894e-2f
#define CEXP_P4 1.6666665459e-1f
#define CEXP_P5 5.0000001201e-1f

static inline float colibri_exp_one(float x) {
    if (!(x >= CEXP_LO)) return x != x ? x : 0.0f;
    if (x > CEXP_HI) return INFINITY;
    float t = x * CEXP_LOG2E;
    float n = t + CEXP_SHIFT;
    n = n - CEXP_SHIFT;
    float r = fmaf(n, -CEXP_LN2_HI, x);
    r = fmaf(n, -CEXP_LN2_LO, r);
    float p = fmaf(CEXP_P0, r, CEXP_P1);
    p = fmaf(p, r, CEXP_P2);
    p = fmaf(p, r, CEXP_P3);
    p = fmaf(p, r, CEXP_P4);
    p = fmaf(p, r, CEXP_P5);
    float r2 = r * r;
    float y = fmaf(p, r2, r);
    y = y + 1.0f;
    uint32_t u = (uint32_t)((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &u, sizeof scale);
    return y * scale;
}

static inline float bf16_to_float(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* A row of any weight dtype as f32 (exact): the scalar conversion, and the tails of the SIMD ones. */
static inline void colibri_convert_row_scalar(const void *row, uint32_t dtype, size_t n, float *out) {
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

/* The SIMD int8 quantisations' scalar steps, as colibri_quantize_row_scalar (int8.c): the scale
 * and its inverse from max |x|, and one value rounded to nearest even and clamped (the tails). */
static inline float q8_scale(float amax, float *inv) {
    float s = amax > 0.0f ? amax / 127.0f : 1.0f;
    *inv = 1.0f / s;
    return s;
}

static inline int8_t q8_one(float v) {
    v = nearbyintf(v);
    return (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
}

/* The SIMD value sums' last outputs d0..n-1: the portable multiply then add, rows in order. */
static inline void wsum_rows_tail(float *out, const float *w, const void *const *rows, int nr,
                                  size_t d0, size_t n, int f16) {
    for (size_t d = d0; d < n; d++)
        for (int i = 0; i < nr; i++) {
            float v = f16 ? half_to_float(((const uint16_t *)rows[i])[d]) : ((const float *)rows[i])[d];
            float p = w[i] * v; /* its own statement: never contracted into an FMA */
            out[d] += p;
        }
}

#define CVT_F32(v) (v)
#define CVT_I8(v) ((float)(v))

#endif
