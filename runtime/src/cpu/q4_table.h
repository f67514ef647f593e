/* The q4 kernel table, internal to cpu/ (kernels_q4.c has the lane layout every entry keeps):
 * kernels_q4.c fills it with the scalar kernels, then the ISA file of this build (q4_x86.c,
 * q4_arm.c) replaces what the CPU offers. The layout's helpers below (element access, the fixed
 * reductions, the tails past the last full group) are shared by every file, so the tails and
 * reductions are the same code on every ISA. */
#ifndef COLIBRI_CPU_Q4_TABLE_H
#define COLIBRI_CPU_Q4_TABLE_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "core/half.h"
#include "core/model.h"

/* Decode look-ahead (a prefetch never faults). Farther than kernel_table.h's 2 KiB: a q4 row is a
 * quarter of an int8 one, so the same bytes ahead cover four times fewer cycles of work.
 * Measured (2-vCPU EPYC, int8-act q4 decode, interleaved A/B): 1 KiB 111-119 tok/s, 4 KiB
 * 135-144. */
#define Q4_PREFETCH_BYTES 4096

typedef float (*q4_dot_fn)(const uint8_t *q, const uint16_t *d, const float *x, size_t cols);
typedef float (*f32_dot_fn)(const float *w, const float *x, size_t cols);
typedef void (*f32_dot3_fn)(const float *w, const float *const x[3], size_t cols, float out[3]);
typedef float (*q4q8_dot_fn)(const uint8_t *q, const uint16_t *d, const int8_t *x, size_t cols);

typedef struct {
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
    /* Whole row ranges (colibri_q4_rows_dot / _q8 for rows [r0, r1)), for kernels that want
     * their own tiling; each returns 0 for a shape it leaves to the loops above. */
    int (*rows)(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x, int n,
                size_t ldx, float *y, size_t ldy);
    int (*rows_q8)(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                   const float *xscale, int n, size_t ldx, float *y, size_t ldy);
    /* 1: rows_q8 reads a tensor's packed layout (q4_pack.h) when it has one; the model packs
     * its q4 tensors only for such kernels. */
    int reads_packed;
    const char *name;
} colibri_q4_kernels;

/* Replace the entries this CPU has faster versions of (each file compiles to nothing on the
 * other architecture). */
void colibri_q4_x86(colibri_q4_kernels *q);
void colibri_q4_arm(colibri_q4_kernels *q);

/* Element i (< 32) of a group's 16 nibble bytes, as the signed 4-bit value. */
static inline int q4_nib(const uint8_t *blk, size_t i) {
    return i < 16 ? (blk[i] & 15) - 8 : (blk[i - 16] >> 4) - 8;
}

/* The layout's fixed reduction of the 32 lanes. */
static inline float q4_reduce(const float L[32]) {
    float u[8];
    for (int l = 0; l < 8; l++) u[l] = (L[l] + L[8 + l]) + (L[16 + l] + L[24 + l]);
    return ((u[0] + u[1]) + (u[2] + u[3])) + ((u[4] + u[5]) + (u[6] + u[7]));
}

/* Tail columns (past the last full group) of a q4 row: dequantise and accumulate one by one. */
static inline float q4_tail(const uint8_t *q, const uint16_t *d, const float *x, size_t cols) {
    size_t full = cols / 32, i0 = full * 32;
    float t = 0.0f;
    if (i0 == cols) return 0.0f;
    float dd = half_to_float(d[full]);
    for (size_t i = i0; i < cols; i++)
        t = fmaf((float)q4_nib(q + full * 16, i - i0) * dd, x[i], t);
    return t;
}

static inline float f32_tail(const float *w, const float *x, size_t cols) {
    float t = 0.0f;
    for (size_t i = cols / 32 * 32; i < cols; i++) t = fmaf(w[i], x[i], t);
    return t;
}

/* q4 x int8 activations (--int8-act). Integer sums are exact, so the layout is: per full group
 * b, eight lane sums S[l] = sum of q * x over elements 4l..4l+3 (int32), L[l] = fma(d_b, S[l],
 * L[l]); then ((L0 + L1) + (L2 + L3)) + ((L4 + L5) + (L6 + L7)) plus d_tail * (the tail's
 * integer sum). The caller multiplies by the activation scale. */
static inline float q4q8_tail(const uint8_t *q, const uint16_t *d, const int8_t *x, size_t cols) {
    size_t full = cols / 32, i0 = full * 32;
    if (i0 == cols) return 0.0f;
    int32_t t = 0;
    for (size_t i = i0; i < cols; i++) t += q4_nib(q + full * 16, i - i0) * (int32_t)x[i];
    return half_to_float(d[full]) * (float)t;
}

static inline float q4q8_reduce(const float L[8]) {
    return ((L[0] + L[1]) + (L[2] + L[3])) + ((L[4] + L[5]) + (L[6] + L[7]));
}


#endif
