/* CPU kernels for the grouped 4-bit weights (q4, docs/format.md): y = W x with W stored as
 * groups of 32 nibbles and one f16 scale d per group, w = (nibble - 8) * d.
 *
 * The q4 lane layout. Every implementation (scalar, AVX2+FMA+F16C, NEON) computes one row dot as
 * 32 lanes: lane l accumulates w[32b + l] * x[32b + l] over the full groups b in order with a fused
 * multiply-add; then u[l] = (L[l] + L[8 + l]) + (L[16 + l] + L[24 + l]) for l < 8, the sum
 * ((u0 + u1) + (u2 + u3)) + ((u4 + u5) + (u6 + u7)), plus the tail columns past the last full
 * group accumulated one by one (fused) from 0. Dequantising (nibble - 8) * d is exact in f32 (a
 * 4-bit integer times an 11-bit mantissa), so:
 * - decode (weights dequantised in registers) and prefill (a row dequantised once into scratch,
 *   then dotted with each token) give the same bits: prefill == decode;
 * - the x86_64 and aarch64 builds give the same bits too (checked under qemu-aarch64);
 * - each output is computed start to finish by one thread: any thread count, same bits.
 * Kept apart from kernels.c (the f32/f16/bf16/int8 kernels) so that each can change alone. This
 * file is the portable part: the scalar layout (the reference every ISA kernel is checked against),
 * the dispatch, the row loops and the self-test; q4_x86.c and q4_arm.c hold the SIMD kernels. */
#include "kernels_q4.h"

#include "cpu_features.h"
#include "int8.h"
#include "q4_pack.h"
#include "q4_table.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

static colibri_q4_kernels Q;

/* ---- scalar ---------------------------------------------------------------------------------- */

static float scalar_q4_dot(const uint8_t *q, const uint16_t *d, const float *x, size_t cols) {
    float L[32] = {0};
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        float dd = half_to_float(d[b]);
        for (int l = 0; l < 32; l++)
            L[l] = fmaf((float)q4_nib(q + b * 16, (size_t)l) * dd, x[b * 32 + (size_t)l], L[l]);
    }
    return q4_reduce(L) + q4_tail(q, d, x, cols);
}

static float scalar_f32_dot(const float *w, const float *x, size_t cols) {
    float L[32] = {0};
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++)
        for (int l = 0; l < 32; l++) L[l] = fmaf(w[b * 32 + (size_t)l], x[b * 32 + (size_t)l], L[l]);
    return q4_reduce(L) + f32_tail(w, x, cols);
}

/* q4 x int8 activations: the layout of q4q8_tail's comment (q4_table.h). */
static float scalar_q4q8_dot(const uint8_t *q, const uint16_t *d, const int8_t *x, size_t cols) {
    float L[8] = {0};
    size_t full = cols / 32;
    for (size_t b = 0; b < full; b++) {
        float dd = half_to_float(d[b]);
        for (int l = 0; l < 8; l++) {
            int32_t s = 0;
            for (int e = 4 * l; e < 4 * l + 4; e++)
                s += q4_nib(q + b * 16, (size_t)e) * (int32_t)x[b * 32 + (size_t)e];
            L[l] = fmaf(dd, (float)s, L[l]);
        }
    }
    return q4q8_reduce(L) + q4q8_tail(q, d, x, cols);
}

static void scalar_f32_dot3(const float *w, const float *const x[3], size_t cols, float out[3]) {
    for (int j = 0; j < 3; j++) out[j] = Q.dot_f32(w, x[j], cols);
}


/* ---- selection and the row loops ------------------------------------------------------------ */

static pthread_once_t q4_once = PTHREAD_ONCE_INIT;

static void q4_pick(void) {
    Q.dot = scalar_q4_dot;
    Q.dot_f32 = scalar_f32_dot;
    Q.dot3_f32 = scalar_f32_dot3;
    Q.dot_q8 = scalar_q4q8_dot;
    Q.name = "scalar";
#if defined(__x86_64__)
    colibri_q4_x86(&Q);
#elif defined(__aarch64__)
    colibri_q4_arm(&Q);
#endif
}

const char *colibri_q4_kernels_init(void) {
    pthread_once(&q4_once, q4_pick);
    return Q.name;
}

void colibri_q4_row_f32(const colibri_tensor *w, uint32_t r, float *out) {
    colibri_q4_kernels_init();
    size_t cols = w->cols, ng = colibri_q4_groups(w->cols), g0 = 0;
    const uint8_t *q = (const uint8_t *)w->data + (size_t)r * ng * COLIBRI_Q4_BLOCK;
    const uint16_t *d = colibri_q4_scales(w) + (size_t)r * ng;
    if (Q.row_full_groups) {
        g0 = cols / 32;
        Q.row_full_groups(q, d, g0, out);
    }
    for (size_t g = g0; g * 32 < cols; g++) {
        float dd = half_to_float(d[g]);
        size_t m = cols - g * 32 < 32 ? cols - g * 32 : 32;
        for (size_t e = 0; e < m; e++) out[g * 32 + e] = (float)q4_nib(q + g * 16, e) * dd;
    }
}

void colibri_q4_rows_dot(const colibri_tensor *w, uint32_t r0, uint32_t r1, const float *x, int n,
                         size_t ldx, float *y, size_t ldy, float *scratch) {
    colibri_q4_kernels_init();
    size_t cols = w->cols, ng = colibri_q4_groups(w->cols);
    const uint8_t *base = (const uint8_t *)w->data;
    const uint16_t *sc = colibri_q4_scales(w);
    if (Q.rows && Q.rows(w, r0, r1, x, n, ldx, y, ldy)) return;
    if (n == 1) { /* decode: stream each row once, dequantising in registers */
        for (uint32_t r = r0; r < r1; r++)
            y[r] = Q.dot(base + (size_t)r * ng * COLIBRI_Q4_BLOCK, sc + (size_t)r * ng, x, cols);
        return;
    }
    if (Q.f32_tile_2x4) { /* two rows dequantised once (exact), then 2-row x 4-token tiles */
        for (uint32_t r = r0; r < r1; r += 2) {
            uint32_t rows = r1 - r < 2 ? r1 - r : 2;
            const float *wr[2] = {scratch, scratch + cols};
            colibri_q4_row_f32(w, r, scratch);
            if (rows == 2) colibri_q4_row_f32(w, r + 1, scratch + cols);
            else wr[1] = scratch; /* row r again, result unused */
            for (int j = 0; j < n; j += 4) {
                int nt = n - j < 4 ? n - j : 4;
                const float *xs[4];
                for (int t = 0; t < 4; t++) xs[t] = x + (size_t)(j + (t < nt ? t : 0)) * ldx;
                float o[8];
                Q.f32_tile_2x4(wr, xs, cols, o);
                for (uint32_t k = 0; k < rows; k++)
                    for (int t = 0; t < nt; t++) y[(size_t)(j + t) * ldy + r + k] = o[k * 4 + t];
            }
        }
        return;
    }
    /* several tokens: dequantise the row once (exact), then the same lane layout per token,
     * three tokens per pass over the row */
    for (uint32_t r = r0; r < r1; r++) {
        colibri_q4_row_f32(w, r, scratch);
        int j = 0;
        for (; j + 3 <= n; j += 3) {
            const float *xs[3] = {x + (size_t)j * ldx, x + (size_t)(j + 1) * ldx,
                                  x + (size_t)(j + 2) * ldx};
            float o[3];
            Q.dot3_f32(scratch, xs, cols, o);
            for (int t = 0; t < 3; t++) y[(size_t)(j + t) * ldy + r] = o[t];
        }
        for (; j < n; j++) y[(size_t)j * ldy + r] = Q.dot_f32(scratch, x + (size_t)j * ldx, cols);
    }
}

int colibri_q4_kernels_have_packed(void) {
    colibri_q4_kernels_init();
    return Q.reads_packed;
}

void colibri_q4_rows_dot_q8(const colibri_tensor *w, uint32_t r0, uint32_t r1, const int8_t *xq,
                            const float *xscale, int n, size_t ldx, float *y, size_t ldy) {
    colibri_q4_kernels_init();
    size_t cols = w->cols, ng = colibri_q4_groups(w->cols);
    const uint8_t *base = (const uint8_t *)w->data;
    const uint16_t *sc = colibri_q4_scales(w);
    size_t rowbytes = ng * COLIBRI_Q4_BLOCK;
    if (Q.rows_q8 && Q.rows_q8(w, r0, r1, xq, xscale, n, ldx, y, ldy)) return;
    /* the same per-(row, token) operations for one token or many: prefill == decode */
    if (n == 1 && Q.q4q8_4x1) { /* decode: four rows at once */
        for (; r0 + 4 <= r1; r0 += 4) {
            const uint8_t *q[4];
            const uint16_t *d[4];
            for (int k = 0; k < 4; k++) {
                q[k] = base + (size_t)(r0 + k) * rowbytes;
                d[k] = sc + (size_t)(r0 + k) * ng;
            }
            float o[4];
            Q.q4q8_4x1(q, d, &xq, cols, o);
            for (int k = 0; k < 4; k++) y[r0 + k] = o[k] * xscale[0];
        }
    }
    if (n > 1 && Q.q4q8_2x3) { /* several tokens: 2-row x 3-token tiles */
        for (uint32_t r = r0; r < r1; r += 2) {
            uint32_t rows = r1 - r < 2 ? r1 - r : 2;
            const uint8_t *q[2];
            const uint16_t *d[2];
            for (uint32_t k = 0; k < 2; k++) { /* past the end: row r again, result unused */
                uint32_t rr = r + (k < rows ? k : 0);
                q[k] = base + (size_t)rr * rowbytes;
                d[k] = sc + (size_t)rr * ng;
            }
            for (int j = 0; j < n; j += 3) {
                int nt = n - j < 3 ? n - j : 3;
                const int8_t *xs[3];
                for (int t = 0; t < 3; t++) xs[t] = xq + (size_t)(j + (t < nt ? t : 0)) * ldx;
                float o[6];
                Q.q4q8_2x3(q, d, xs, cols, o);
                for (uint32_t k = 0; k < rows; k++)
                    for (int t = 0; t < nt; t++)
                        y[(size_t)(j + t) * ldy + r + k] = o[k * 3 + t] * xscale[j + t];
            }
        }
        return;
    }
    for (uint32_t r = r0; r < r1; r++) {
        const uint8_t *q = base + (size_t)r * rowbytes;
        for (int j = 0; j < n; j++)
            y[(size_t)j * ldy + r] = Q.dot_q8(q, sc + (size_t)r * ng, xq + (size_t)j * ldx, cols) *
                                     xscale[j];
    }
}

/* ---- self-test (`colibri selftest`) ---------------------------------------------------------- */

/* One shape: ROWS x COLS random q4 weights against N tokens. Checks the rows against a double
 * reference, decode (one token at a time) against prefill (N tokens), a split row range (two
 * threads' shares) against one range, and every output against the scalar layout's bits; for f32
 * and int8 activations. Returns 1 when all hold. */
enum { ST_MAXC = 1100, ST_MAXR = 11, ST_MAXN = 14, ST_MAXG = (ST_MAXC + 31) / 32 };

static int q4_check(int COLS, int ROWS, int N, uint32_t seed) {
    const int NG = (COLS + 31) / 32;
    uint8_t q[ST_MAXR * ST_MAXG * 16];
    uint16_t d[ST_MAXR * ST_MAXG];
    float x[ST_MAXN * ST_MAXC], y[ST_MAXN * ST_MAXR], y1[ST_MAXN * ST_MAXR], y2[ST_MAXN * ST_MAXR];
    float scratch[2 * ST_MAXC], row[ST_MAXC];
    uint32_t s = seed;
    for (int i = 0; i < ROWS * NG * 16; i++) q[i] = (uint8_t)((s = s * 1664525u + 1013904223u) >> 24);
    for (int i = 0; i < ROWS * NG; i++) /* f16 scales in [2^-9, 2^-5), and one zero group */
        d[i] = i == 3 ? 0 : (uint16_t)(0x1800 + ((s = s * 1664525u + 1013904223u) >> 20) % 0x1000);
    for (int i = 0; i < N * COLS; i++)
        x[i] = (float)((int)((s = s * 1664525u + 1013904223u) >> 16) % 2001 - 1000) / 500.0f;
    colibri_tensor t = {q, (const float *)(const void *)d, COLIBRI_DT_Q4, (uint32_t)ROWS, (uint32_t)COLS, NULL};
    uint32_t R = (uint32_t)ROWS, half = R / 2;
    colibri_q4_rows_dot(&t, 0, R, x, N, (size_t)COLS, y, R, scratch);
    colibri_q4_rows_dot(&t, 0, half, x, N, (size_t)COLS, y2, R, scratch); /* two threads' shares */
    colibri_q4_rows_dot(&t, half, R, x, N, (size_t)COLS, y2, R, scratch);
    int bad = 0, same = 1, layout = 1;
    for (int j = 0; j < N; j++) /* decode: one token over all rows (4-row tiles + the rest) */
        colibri_q4_rows_dot(&t, 0, R, x + j * COLS, 1, (size_t)COLS, y1 + j * ROWS, R, scratch);
    for (uint32_t r = 0; r < R; r++) {
        colibri_q4_row_f32(&t, r, row);
        for (int j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int c = 0; c < COLS; c++) {
                ref += (double)row[c] * x[j * COLS + c];
                mag += fabs((double)row[c] * x[j * COLS + c]);
            }
            if (fabs(y[j * ROWS + r] - ref) > 1e-5 * (mag + 1e-30)) bad++;
            /* decode (one token) and a split row range give the bits of prefill (n tokens) */
            same &= memcmp(&y1[j * ROWS + r], &y[j * ROWS + r], sizeof(float)) == 0 &&
                    memcmp(&y2[j * ROWS + r], &y[j * ROWS + r], sizeof(float)) == 0;
            /* and the SIMD kernel gives the bits of the scalar one: one layout on every CPU */
            float sc = scalar_q4_dot(q + r * (uint32_t)NG * 16, d + r * (uint32_t)NG, x + j * COLS, (size_t)COLS);
            layout &= memcmp(&sc, &y[j * ROWS + r], sizeof(float)) == 0;
        }
    }
    /* int8 activations: exact integer group sums, the scalar layout's bits, decode == prefill */
    int8_t xq[ST_MAXN * ST_MAXC];
    float xs[ST_MAXN];
    for (int j = 0; j < N; j++) colibri_quantize_row(x + j * COLS, (size_t)COLS, xq + j * COLS, &xs[j]);
    colibri_q4_rows_dot_q8(&t, 0, R, xq, xs, N, (size_t)COLS, y, R);
    colibri_q4_rows_dot_q8(&t, 0, half, xq, xs, N, (size_t)COLS, y2, R);
    colibri_q4_rows_dot_q8(&t, half, R, xq, xs, N, (size_t)COLS, y2, R);
    for (int j = 0; j < N; j++)
        colibri_q4_rows_dot_q8(&t, 0, R, xq + j * COLS, &xs[j], 1, (size_t)COLS, y1 + j * ROWS, R);
    int q8ok = 1;
    for (uint32_t r = 0; r < R; r++)
        for (int j = 0; j < N; j++) {
            double ref = 0, mag = 0;
            for (int g = 0; g < NG; g++) {
                long isum = 0;
                for (int e = 0; e < 32 && g * 32 + e < COLS; e++)
                    isum += (long)q4_nib(q + (r * (uint32_t)NG + (uint32_t)g) * 16, (size_t)e) *
                            xq[j * COLS + g * 32 + e];
                ref += (double)half_to_float(d[r * (uint32_t)NG + (uint32_t)g]) * (double)isum;
                mag += fabs((double)half_to_float(d[r * (uint32_t)NG + (uint32_t)g]) * (double)isum);
            }
            ref *= xs[j];
            mag *= xs[j];
            float sc = scalar_q4q8_dot(q + r * (uint32_t)NG * 16, d + r * (uint32_t)NG, xq + j * COLS, (size_t)COLS) * xs[j];
            q8ok &= fabs(y[j * ROWS + r] - ref) <= 1e-5 * (mag + 1e-30) &&
                    memcmp(&sc, &y[j * ROWS + r], sizeof sc) == 0 &&
                    memcmp(&y1[j * ROWS + r], &y[j * ROWS + r], sizeof sc) == 0 &&
                    memcmp(&y2[j * ROWS + r], &y[j * ROWS + r], sizeof sc) == 0;
        }
    return bad == 0 && same && layout && q8ok;
}

/* The packed layout (q4_pack.h): 32 rows (two blocks) x COLS against N int8 tokens, all rows,
 * a range split inside a block (13: the rows the kernel computes and does not store), and one
 * token at a time; every output must have the scalar layout's bits. */
enum { PK_ROWS = 32, PK_MAXC = 512, PK_MAXN = 7 };

static int q4_packed_check(int COLS, int N, uint32_t seed) {
    const int NG = COLS / 32;
    uint8_t q[PK_ROWS * PK_MAXC / 2], packed[PK_ROWS * PK_MAXC / 32 * 18];
    uint16_t d[PK_ROWS * PK_MAXC / 32];
    int8_t xq[PK_MAXN * PK_MAXC];
    float xs[PK_MAXN], y[PK_MAXN * PK_ROWS], y1[PK_MAXN * PK_ROWS], y2[PK_MAXN * PK_ROWS];
    uint32_t s = seed;
    for (int i = 0; i < PK_ROWS * NG * 16; i++) q[i] = (uint8_t)((s = s * 1664525u + 1013904223u) >> 24);
    for (int i = 0; i < PK_ROWS * NG; i++)
        d[i] = (uint16_t)(0x1800 + ((s = s * 1664525u + 1013904223u) >> 20) % 0x1000);
    for (int i = 0; i < N * COLS; i++) xq[i] = (int8_t)((int)((s = s * 1664525u + 1013904223u) >> 24) - 128);
    for (int j = 0; j < N; j++) xs[j] = 0.001f * (float)(j + 1);
    colibri_tensor t = {q, (const float *)(const void *)d, COLIBRI_DT_Q4, PK_ROWS, (uint32_t)COLS, NULL};
    if (colibri_q4_packed_bytes(&t) != (size_t)PK_ROWS * NG * 18) return 0;
    colibri_q4_pack(&t, packed);
    t.packed = packed;
    colibri_q4_rows_dot_q8(&t, 0, PK_ROWS, xq, xs, N, (size_t)COLS, y, PK_ROWS);
    colibri_q4_rows_dot_q8(&t, 0, 13, xq, xs, N, (size_t)COLS, y2, PK_ROWS);
    colibri_q4_rows_dot_q8(&t, 13, PK_ROWS, xq, xs, N, (size_t)COLS, y2, PK_ROWS);
    for (int j = 0; j < N; j++)
        colibri_q4_rows_dot_q8(&t, 0, PK_ROWS, xq + j * COLS, &xs[j], 1, (size_t)COLS,
                               y1 + j * PK_ROWS, PK_ROWS);
    int ok = 1;
    for (int r = 0; r < PK_ROWS; r++)
        for (int j = 0; j < N; j++) {
            float sc = scalar_q4q8_dot(q + r * NG * 16, d + r * NG, xq + j * COLS, (size_t)COLS) * xs[j];
            ok &= memcmp(&sc, &y[j * PK_ROWS + r], sizeof sc) == 0 &&
                  memcmp(&sc, &y1[j * PK_ROWS + r], sizeof sc) == 0 &&
                  memcmp(&sc, &y2[j * PK_ROWS + r], sizeof sc) == 0;
        }
    return ok;
}

int colibri_q4_selftest(char *msg, size_t len) {
    const char *name = colibri_q4_kernels_init();
    /* 6 full groups + an 11-column tail; 34 full groups (more than one block of 16 scales) + a
     * 12-column tail against 14 tokens (two 6-token tiles and a rest), 11 rows (4-row tiles and
     * a rest); 64 columns, no tail */
    int ok = q4_check(203, 5, 4, 7) && q4_check(1100, 11, 14, 11) && q4_check(64, 7, 13, 5);
    /* packed: 1 group; 16 groups against 7 tokens (3-token tiles and a rest) */
    ok = ok && q4_packed_check(32, 2, 3) && q4_packed_check(512, 7, 9);
    snprintf(msg, len, "q4 rows_dot (%s) == double reference; decode bits == prefill bits == scalar "
             "layout bits (f32 and int8 activations; the packed layout%s)", name,
             Q.reads_packed ? "" : ": not read on this CPU");
    return ok;
}
