/* CPU kernels for mxfp4 weights (kernels_mxfp4.c; the lane layouts and why they give the same
 * bits everywhere are described there). */
#ifndef COLIBRI_KERNELS_MXFP4_H
#define COLIBRI_KERNELS_MXFP4_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"

/* Pick the implementation for this CPU (idempotent, thread safe). Returns its name. */
const char *colibri_mxfp4_kernels_init(void);

/* 1 when this CPU's 8-bit kernel reads the packed mxfp4 layout (q4_pack.h; x86 AVX-512 VNNI):
 * then colibri_mxfp4_rows_dot_a8 reads a tensor's `packed` copy when it has one, same bits. */
int colibri_mxfp4_kernels_have_packed(void);

/* y[j * ldy + r] = W[r, :] . x[j * ldx, :] for rows r in [r0, r1), tokens j < n; W is mxfp4,
 * x is f32: every product is exact in f32 (an E2M1 value times a power of two), so the result is
 * the f32 dot with transformers' dequantised weights, in the layout's summation order. */
void colibri_mxfp4_rows_dot(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x,
                            int n, size_t ldx, float *y, size_t ldy);

/* The same with 8-bit activations (--int8-act): each token's x quantised per block of 32 (an f32
 * scale amax / 127 per block, as llama.cpp's q8_0), exact integer block sums, one f32 multiply-add
 * per block and lane group. Quantised here, per call (n * cols bytes; negligible next to the
 * rows' work), so the caller passes f32 x. */
void colibri_mxfp4_rows_dot_a8(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x,
                               int n, size_t ldx, float *y, size_t ldy);

/* Row r of an mxfp4 W dequantised to f32 (exact): the embedding gather. */
void colibri_mxfp4_row_f32(const colibri_tensor *w, uint32_t r, float *out);

/* Kernel self-check for `colibri selftest`: 1 when it passes; `msg` says what was checked. */
int colibri_mxfp4_selftest(char *msg, size_t len);

#endif
