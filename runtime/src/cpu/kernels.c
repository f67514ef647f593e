/* CPU dot-product kernels (see kernels.h): the portable dispatch. One family is chosen once per
 * process: the scalar kernels below, with what the ISA file of this build (x86.c: AVX2, AVX-512;
 * arm.c: NEON, SDOT, SMMLA) replaces for this CPU (kernel_table.h). The row loops here are the
 * same for every family; each (row, token) value keeps its family's lane layout and order. */
#include "kernels.h"
#include "kernel_table.h"
#include "kernels_q4.h"
#include "kernels_mxfp4.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

static colibri_cpu_kernels K;

/* ---- scalar: 8 accumulators, lane i % 8, reduced pairwise ----------------------------------- */

#define SCALAR_DOT(NAME, T, CVT)                                                              \
    static float NAME(const void *wv, const float *x, size_t n) {                             \
        const T *w = (const T *)wv;                                                           \
        float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                \
        size_t i = 0;                                                                         \
        for (; i + 8 <= n; i += 8)                                                            \
            for (int l = 0; l < 8; l++) a[l] += CVT(w[i + l]) * x[i + l];                     \
        float s = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));          \
        for (; i < n; i++) s += CVT(w[i]) * x[i];                                             \
        return s;                                                                             \
    }
SCALAR_DOT(scalar_dot_f32, float, CVT_F32)
SCALAR_DOT(scalar_dot_f16, uint16_t, half_to_float)
SCALAR_DOT(scalar_dot_bf16, uint16_t, bf16_to_float)
SCALAR_DOT(scalar_dot_i8, int8_t, CVT_I8)

static int32_t scalar_dot_q8(const int8_t *w, const int8_t *x, size_t n) {
    int32_t s = 0;
    for (size_t i = 0; i < n; i++) s += (int32_t)w[i] * (int32_t)x[i];
    return s;
}


static void generic_tile_2x3(const float *w0, const float *w1, const float *x0, const float *x1,
                             const float *x2, size_t n, float out[6]) {
    const float *w[2] = {w0, w1}, *x[3] = {x0, x1, x2};
    for (int r = 0; r < 2; r++)
        for (int j = 0; j < 3; j++) out[r * 3 + j] = K.dot[COLIBRI_DT_F32](w[r], x[j], n);
}

/* ---- selection ------------------------------------------------------------------------------ */

static pthread_once_t kernels_once = PTHREAD_ONCE_INIT;

static void kernels_pick(void) {
    K.dot[COLIBRI_DT_F32] = scalar_dot_f32;
    K.dot[COLIBRI_DT_F16] = scalar_dot_f16;
    K.dot[COLIBRI_DT_BF16] = scalar_dot_bf16;
    K.dot[COLIBRI_DT_INT8] = scalar_dot_i8;
    K.dot_q8 = scalar_dot_q8;
    K.convert = colibri_convert_row_scalar;
    K.tile_2x3 = generic_tile_2x3;
    K.name = "scalar";
#if defined(__x86_64__)
    colibri_x86_kernels(&K);
#elif defined(__aarch64__)
    colibri_arm_kernels(&K);
#endif
}

const char *colibri_kernels_init(void) {
    pthread_once(&kernels_once, kernels_pick);
    return K.name;
}

int colibri_int8_kernels_have_packed(void) {
    colibri_kernels_init();
    return K.rows_q8_packed != NULL;
}

float colibri_dot_f32(const float *a, const float *b, size_t n) {
    return K.dot[COLIBRI_DT_F32](a, b, n);
}

void colibri_rows_dot(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x, int n,
                      size_t ldx, float *y, size_t ldy, float *scratch) {
    if (w->dtype == COLIBRI_DT_Q4) { /* grouped 4-bit: kernels_q4.c */
        colibri_q4_rows_dot(w, r0, r1, x, n, ldx, y, ldy, scratch);
        return;
    }
    if (w->dtype == COLIBRI_DT_MXFP4) { /* gpt-oss's mxfp4: kernels_mxfp4.c */
        colibri_mxfp4_rows_dot(w, r0, r1, x, n, ldx, y, ldy);
        return;
    }
    size_t cols = w->cols, rowbytes = cols * colibri_dtype_size(w->dtype);
    const uint8_t *base = (const uint8_t *)w->data;
    if (n == 1) { /* decode: stream the rows once, converting in registers */
        dot_fn dot = K.dot[w->dtype];
        dot4_fn dot4 = K.dot4[w->dtype];
        uint32_t r = r0;
        if (dot4) { /* rows r0 + k*q + i for k < 4: four streams a quarter block apart */
            uint32_t q = (r1 - r0) / 4;
            for (uint32_t i = 0; i < q; i++) {
                const void *rows[4];
                float o[4];
                for (uint32_t k = 0; k < 4; k++) rows[k] = base + (size_t)(r0 + k * q + i) * rowbytes;
                dot4(rows, x, cols, o);
                for (uint32_t k = 0; k < 4; k++) {
                    uint32_t rr = r0 + k * q + i;
                    y[rr] = (w->scales ? w->scales[rr] : 1.0f) * o[k];
                }
            }
            r = r0 + 4 * q; /* up to 3 rows left */
        }
        for (; r < r1; r++)
            y[r] = (w->scales ? w->scales[r] : 1.0f) * dot(base + (size_t)r * rowbytes, x, cols);
        return;
    }
    if (K.tile) { /* several tokens: 4-row x 6-token tiles, weights converted in registers */
        for (uint32_t r = r0; r < r1; r += 4) {
            uint32_t rows = r1 - r < 4 ? r1 - r : 4;
            const void *wr[4];
            float sc[4];
            for (uint32_t k = 0; k < 4; k++) { /* past the end: row r again, result unused */
                uint32_t rr = r + (k < rows ? k : 0);
                wr[k] = base + (size_t)rr * rowbytes;
                sc[k] = w->scales ? w->scales[rr] : 1.0f;
            }
            for (int j = 0; j < n; j += 6) {
                int nt = n - j < 6 ? n - j : 6;
                float o[24];
                K.tile(w->dtype, wr, x + (size_t)j * ldx, ldx, nt, cols, o);
                for (uint32_t k = 0; k < rows; k++)
                    for (int t = 0; t < nt; t++) y[(size_t)(j + t) * ldy + r + k] = sc[k] * o[k * 6 + t];
            }
        }
        return;
    }
    /* Several tokens: rows converted to f32 once (exact), then 2-row x 3-token tiles with the
     * one-token kernel's lane order, so every value has the same bits as in decode. */
    for (uint32_t r = r0; r < r1; r += 2) {
        int rows = r + 1 < r1 ? 2 : 1;
        const float *wr[2];
        for (int k = 0; k < rows; k++) {
            const uint8_t *row = base + (size_t)(r + (uint32_t)k) * rowbytes;
            if (w->dtype == COLIBRI_DT_F32) {
                wr[k] = (const float *)(const void *)row;
            } else {
                K.convert(row, w->dtype, cols, scratch + (size_t)k * cols);
                wr[k] = scratch + (size_t)k * cols;
            }
        }
        if (rows == 1) wr[1] = wr[0];
        float sc[2] = {w->scales ? w->scales[r] : 1.0f,
                       w->scales && rows == 2 ? w->scales[r + 1] : 1.0f};
        int j = 0;
        for (; j + 3 <= n; j += 3) {
            float o[6];
            const float *xj = x + (size_t)j * ldx;
            K.tile_2x3(wr[0], wr[1], xj, xj + ldx, xj + 2 * ldx, cols, o);
            for (int k = 0; k < rows; k++)
                for (int t = 0; t < 3; t++) y[(size_t)(j + t) * ldy + r + (uint32_t)k] = sc[k] * o[k * 3 + t];
        }
        for (; j < n; j++)
            for (int k = 0; k < rows; k++)
                y[(size_t)j * ldy + r + (uint32_t)k] =
                    sc[k] * K.dot[COLIBRI_DT_F32](wr[k], x + (size_t)j * ldx, cols);
    }
}

void colibri_rows_dot_q8(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                         const float *xscale, int n, size_t ldx, float *y, size_t ldy) {
    if (w->dtype == COLIBRI_DT_Q4) { /* grouped 4-bit: kernels_q4.c */
        colibri_q4_rows_dot_q8(w, r0, r1, xq, xscale, n, ldx, y, ldy);
        return;
    }
    if (w->packed && K.rows_q8_packed) { /* the packed layout (q4_pack.h): 16 rows at once */
        K.rows_q8_packed(w, r0, r1, xq, xscale, n, ldx, y, ldy);
        return;
    }
    size_t cols = w->cols;
    const int8_t *base = (const int8_t *)w->data;
    if (n == 1 && K.dot4_q8) { /* decode: four streams a quarter block apart, as colibri_rows_dot */
        uint32_t q = (r1 - r0) / 4;
        for (uint32_t i = 0; i < q; i++) {
            const int8_t *rows[4];
            int32_t acc[4];
            for (uint32_t k = 0; k < 4; k++) rows[k] = base + (size_t)(r0 + k * q + i) * cols;
            K.dot4_q8(rows, xq, cols, acc);
            for (uint32_t k = 0; k < 4; k++) {
                uint32_t rr = r0 + k * q + i;
                y[rr] = (float)acc[k] * (w->scales[rr] * xscale[0]);
            }
        }
        r0 += 4 * q; /* up to 3 rows left */
    }
    if (n > 1 && K.rows_q8 && K.rows_q8(w, r0, r1, xq, xscale, n, ldx, y, ldy)) return;
    if (n > 1 && K.tile_q8) { /* several tokens: 4-row x 6-token integer tiles */
        for (uint32_t r = r0; r < r1; r += 4) {
            uint32_t rows = r1 - r < 4 ? r1 - r : 4;
            const int8_t *wr[4];
            for (uint32_t k = 0; k < 4; k++) wr[k] = base + (size_t)(r + (k < rows ? k : 0)) * cols;
            for (int j = 0; j < n; j += 6) {
                int nt = n - j < 6 ? n - j : 6;
                int32_t acc[24];
                K.tile_q8(wr, xq + (size_t)j * ldx, ldx, nt, cols, acc);
                for (uint32_t k = 0; k < rows; k++)
                    for (int t = 0; t < nt; t++)
                        y[(size_t)(j + t) * ldy + r + k] =
                            (float)acc[k * 6 + t] * (w->scales[r + k] * xscale[j + t]);
            }
        }
        return;
    }
    for (uint32_t r = r0; r < r1; r++) {
        const int8_t *row = base + (size_t)r * cols;
        float sc = w->scales[r];
        for (int j = 0; j < n; j++) {
            int32_t acc = K.dot_q8(row, xq + (size_t)j * ldx, cols);
            y[(size_t)j * ldy + r] = (float)acc * (sc * xscale[j]);
        }
    }
}

void colibri_row_f32(const colibri_tensor *w, uint32_t r, float *out) {
    if (w->dtype == COLIBRI_DT_Q4) { /* grouped 4-bit: kernels_q4.c */
        colibri_q4_row_f32(w, r, out);
        return;
    }
    if (w->dtype == COLIBRI_DT_MXFP4) {
        colibri_mxfp4_row_f32(w, r, out);
        return;
    }
    size_t cols = w->cols;
    colibri_convert_row_scalar((const uint8_t *)w->data + (size_t)r * cols * colibri_dtype_size(w->dtype), w->dtype,
                cols, out);
    if (w->scales)
        for (size_t i = 0; i < cols; i++) out[i] *= w->scales[r];
}

/* ---- f16 KV cache (forward.c): rounding on write, widening on read ---------------------------
 * The rounding is the scalar half_from_float (half.h) or the hardware instruction with the same
 * bits (F16C vcvtps2ph, AArch64 FCVT; round to nearest even in both default modes), chosen with
 * the kernel family, so any thread count, prefill and decode store the same cache. The reads reuse
 * the f16 weight kernels: the conversions are exact, so a dot against f16 keys has the bits of
 * the f32 dot against the widened keys. */


void colibri_f32_to_f16(const float *x, size_t n, uint16_t *out) {
    colibri_kernels_init();
    if (K.to_f16) {
        K.to_f16(x, n, out);
        return;
    }
    colibri_f32_to_f16_scalar(x, n, out);
}

void colibri_f32_to_f16_scalar(const float *x, size_t n, uint16_t *out) {
    for (size_t i = 0; i < n; i++) out[i] = half_from_float(x[i]);
}

void colibri_f16_to_f32(const uint16_t *h, size_t n, float *out) {
    K.convert(h, COLIBRI_DT_F16, n, out);
}

/* out[i] += w * widen(h[i]) as a multiply and then an add (two roundings, never fused: forward.c's
 * f32 loop is compiled without contraction under GCC's -std=c11), so every element has the bits
 * of widening the row first. F16C widens in registers (K.axpy_f16); otherwise blocks of 64 go
 * through the family's convert. */
void colibri_axpy_f16(float *out, float w, const uint16_t *h, size_t n) {
    if (K.axpy_f16) {
        K.axpy_f16(out, w, h, n);
        return;
    }
    float row[64];
    for (size_t i = 0; i < n; i += 64) {
        size_t m = n - i < 64 ? n - i : 64;
        K.convert(h + i, COLIBRI_DT_F16, m, row);
        for (size_t d = 0; d < m; d++) out[i + d] += w * row[d];
    }
}

void colibri_dot_rows(const float *x, const void *const *rows, int nr, size_t n, int f16,
                      float *out) {
    uint32_t dt = f16 ? COLIBRI_DT_F16 : COLIBRI_DT_F32;
    int i = 0;
    if (K.dot4[dt])
        for (; i + 4 <= nr; i += 4) K.dot4[dt](rows + i, x, n, out + i);
    for (; i < nr; i++) out[i] = K.dot[dt](rows[i], x, n);
}

void colibri_att_scores(const float *x, size_t ldx, int nx, const void *const *rows, int nr,
                        size_t n, int f16, float *out, size_t ldo) {
    if (K.scores) {
        K.scores(x, ldx, nx, rows, nr, n, f16, out, ldo);
        return;
    }
    for (int h = 0; h < nx; h++) colibri_dot_rows(x + (size_t)h * ldx, rows, nr, n, f16, out + (size_t)h * ldo);
}

float colibri_exp_sum_scalar(float *x, size_t n, float sub) {
    float s8[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int l = 0; l < 8; l++) {
            float e = colibri_exp_one(x[i + l] - sub);
            x[i + l] = e;
            s8[l] += e;
        }
    float s = ((s8[0] + s8[1]) + (s8[2] + s8[3])) + ((s8[4] + s8[5]) + (s8[6] + s8[7]));
    for (; i < n; i++) {
        x[i] = colibri_exp_one(x[i] - sub);
        s += x[i];
    }
    return s;
}

float colibri_exp_sum(float *x, size_t n, float sub) {
    return K.exp_sum ? K.exp_sum(x, n, sub) : colibri_exp_sum_scalar(x, n, sub);
}

void colibri_wsum_rows(float *out, const float *w, const void *const *rows, int nr, size_t n,
                       int f16) {
    if (K.wsum_rows) {
        K.wsum_rows(out, w, rows, nr, n, f16);
        return;
    }
    for (int i = 0; i < nr; i++) {
        if (f16) {
            colibri_axpy_f16(out, w[i], (const uint16_t *)rows[i], n);
            continue;
        }
        const float *v = (const float *)rows[i];
        for (size_t d = 0; d < n; d++) {
            float p = w[i] * v[d]; /* its own statement: never contracted into an FMA */
            out[d] += p;
        }
    }
}

/* The int8 activations (int8.h): the family's version, else the scalar one. */
void colibri_quantize_row(const float *x, size_t n, int8_t *q, float *scale) {
    colibri_kernels_init();
    if (K.quantize) K.quantize(x, n, q, scale);
    else colibri_quantize_row_scalar(x, n, q, scale);
}

float colibri_dot_f16(const uint16_t *h, const float *x, size_t n) {
    return K.dot[COLIBRI_DT_F16](h, x, n);
}
