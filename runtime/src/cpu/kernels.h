/* CPU kernels: dot products over the weight dtypes (f32, f16, bf16, int8 with per-row scales),
 * with AVX2+FMA (x86_64, chosen at run time), NEON (aarch64) or scalar code.
 *
 * Determinism: every kernel accumulates in a fixed lane layout and reduces the lanes in a fixed
 * order, so one output never depends on how many threads run or on which thread computes it. A
 * row converted to f32 first and then dotted gives the same bits as the fused convert-and-dot
 * (conversions of f16/bf16/int8 to f32 are exact), so prefill and decode agree bit for bit. */
#ifndef COLIBRI_KERNELS_H
#define COLIBRI_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"
#include "int8.h" /* colibri_quantize_row: the int8 activations the q8 kernels take */

/* Pick the best implementation for this CPU (idempotent, thread safe). Returns its name. */
const char *colibri_kernels_init(void);

/* sum_i a[i] * b[i] in the fixed lane order. */
float colibri_dot_f32(const float *a, const float *b, size_t n);

/* y[j * ldy + r] = W[r, :] . x[j * ldx, :] for rows r in [r0, r1) and tokens j < n.
 * `scratch` holds at least 2 * W->cols floats (converted rows, used when n > 1). */
void colibri_rows_dot(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x, int n,
                      size_t ldx, float *y, size_t ldy, float *scratch);

/* 1 when colibri_rows_dot_q8 reads an int8 tensor's packed layout (q4_pack.h) on this CPU. */
int colibri_int8_kernels_have_packed(void);

/* Same with int8 activations (w must be int8): xq rows quantised by colibri_quantize_row; an
 * int8 tensor's packed copy (w->packed) is read where this CPU's kernels read it. */
void colibri_rows_dot_q8(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                         const float *xscale, int n, size_t ldx, float *y, size_t ldy);


/* Row r of W as f32 (dequantised): the embedding gather. */
void colibri_row_f32(const colibri_tensor *w, uint32_t r, float *out);

/* The f16 KV cache (docs/runtime.md, "Memory"). f32 -> IEEE half, round to nearest even
 * (subnormals, overflow to infinity, quiet NaNs): F16C / NEON where the kernels use them, with the
 * bits of the scalar version (which the unit tests compare it with). */
void colibri_f32_to_f16(const float *x, size_t n, uint16_t *out);
void colibri_f32_to_f16_scalar(const float *x, size_t n, uint16_t *out);
/* Half -> f32 (exact) and sum_i h[i] * x[i] in dot[f16]'s lane order (call colibri_kernels_init
 * first; forward runs after it). */
void colibri_f16_to_f32(const uint16_t *h, size_t n, float *out);
float colibri_dot_f16(const uint16_t *h, const float *x, size_t n);
/* out[i] += w * h[i] (h widened), elementwise: the attention value sum over an f16 cache. */
void colibri_axpy_f16(float *out, float w, const uint16_t *h, size_t n);

/* Attention over a block of keys (layers/attention.c). Scores: out[i] = colibri_dot_f32(x,
 * rows[i], n) (f32 rows) or colibri_dot_f16(rows[i], x, n) (f16 rows), bit for bit, for i < nr;
 * four rows share each load of x where the family has a four-row dot (the same operations per
 * row; a product's operands commute exactly). Values: out[d] += w[i] * rows[i][d] for i = 0..nr-1
 * in order, each a multiply then an add, the bits of nr calls of `out[d] += p` with p = w * v
 * (colibri_axpy_f16 for f16 rows), with out held in registers across the rows. */
void colibri_dot_rows(const float *x, const void *const *rows, int nr, size_t n, int f16,
                      float *out);
/* The scores of nx queries (x + h * ldx, e.g. the query heads of one GQA group) against the same
 * nr rows: out[h * ldo + i] has colibri_dot_rows' bits for query h and row i, whichever family
 * kernel computes it (the x86 one reduces four rows' lanes together). */
void colibri_att_scores(const float *x, size_t ldx, int nx, const void *const *rows, int nr,
                        size_t n, int f16, float *out, size_t ldo);
/* Attention's softmax exponent: x[i] = e^(x[i] - sub) in place (kernel_table.h colibri_exp_one:
 * our own exp, not libm's, so that every family's vector version has the same bits) and their
 * sum in a fixed order: eight lanes over blocks of 8 (lane l: elements l, l + 8, ... in order),
 * ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)), then the tail in order. Depends only on
 * x and n, so prefill == decode and any thread count keep their bits. */
float colibri_exp_sum(float *x, size_t n, float sub);
float colibri_exp_sum_scalar(float *x, size_t n, float sub);
void colibri_wsum_rows(float *out, const float *w, const void *const *rows, int nr, size_t n,
                       int f16);

#endif
