/* CPU kernels for grouped 4-bit weights (kernels_q4.c; lane layout and determinism there). */
#ifndef COLIBRI_KERNELS_Q4_H
#define COLIBRI_KERNELS_Q4_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"

/* Pick the implementation for this CPU (idempotent, thread safe). Returns its name. */
const char *colibri_q4_kernels_init(void);

/* y[j * ldy + r] = W[r, :] . x[j * ldx, :] for rows r in [r0, r1), tokens j < n; W is q4.
 * `scratch` holds at least W->cols floats (one dequantised row, used when n > 1). */
void colibri_q4_rows_dot(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x, int n,
                         size_t ldx, float *y, size_t ldy, float *scratch);

/* Same with int8 activations (--int8-act): xq rows quantised by colibri_quantize_row, one scale
 * per token; y = (the q4 x int8 layout of kernels_q4.c) * xscale[j]. */
void colibri_q4_rows_dot_q8(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                            const float *xscale, int n, size_t ldx, float *y, size_t ldy);

/* 1 when this CPU's q4 x int8 kernel reads the packed layout (q4_pack.h). */
int colibri_q4_kernels_have_packed(void);

/* Row r of a q4 W dequantised to f32 (exact): the embedding gather. */
void colibri_q4_row_f32(const colibri_tensor *w, uint32_t r, float *out);

/* Kernel self-check for `colibri selftest`: 1 when it passes; `msg` says what was checked. */
int colibri_q4_selftest(char *msg, size_t len);

#endif
