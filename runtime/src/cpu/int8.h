/* int8 activations (colibri_options.int8_activations): the per-token quantisation both the
 * int8-weight kernels (kernels.c) and the q4 kernels (kernels_q4.c) consume. */
#ifndef COLIBRI_INT8_H
#define COLIBRI_INT8_H

#include <stddef.h>
#include <stdint.h>

/* Symmetric per-row int8 quantisation: q = round(x * (1 / s)) to nearest even, clamped to
 * [-127, 127], s = max|x| / 127 (s = 1 when x == 0). colibri_quantize_row (kernels.c) runs the
 * kernel family's SIMD version, which gives the bits of the scalar one (elementwise operations
 * and an exact maximum; NaN activations give unspecified bytes). */
void colibri_quantize_row(const float *x, size_t n, int8_t *q, float *scale);
void colibri_quantize_row_scalar(const float *x, size_t n, int8_t *q, float *scale);

#endif
