/* Driver for benchmarks/kernel_insns.py: `reps` calls of one CPU matmul kernel over rows x cols
 * random weights and n tokens, at the kernel level this CPU and COLIBRI_CPU_SIMD give. Prints the
 * level and a hash of the output bits, so runs at different levels (and on the two
 * architectures) can be compared bit for bit. Built for aarch64 or x86_64 and run under qemu,
 * which counts the executed instructions (the script); not a timing tool.
 *
 *   kernel_insns KIND ROWS COLS N REPS
 * KIND: q8 (int8 weights x int8 activations, --int8-act), i8 (int8 weights x f32 activations),
 *       q4 (4-bit weights x f32 activations), q4q8 (4-bit weights x int8 activations). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"
#include "cpu/kernels_q4.h"

static uint32_t lcg(uint32_t *s) { return *s = *s * 1664525u + 1013904223u; }

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: %s q8|i8|q4|q4q8 ROWS COLS N REPS\n", argv[0]);
        return 2;
    }
    const char *kind = argv[1];
    uint32_t rows = (uint32_t)atoi(argv[2]), cols = (uint32_t)atoi(argv[3]);
    int n = atoi(argv[4]), reps = atoi(argv[5]);
    int q4 = !strncmp(kind, "q4", 2), q8act = !strcmp(kind, "q8") || !strcmp(kind, "q4q8");
    size_t ng = colibri_q4_groups(cols);
    size_t wbytes = q4 ? (size_t)rows * ng * COLIBRI_Q4_BLOCK : (size_t)rows * cols;
    uint8_t *w = malloc(wbytes);
    uint16_t *d = malloc((size_t)rows * ng * sizeof *d);
    int8_t *xq = malloc((size_t)n * cols);
    float *x = malloc((size_t)n * cols * sizeof *x), *sc = malloc(rows * sizeof *sc);
    float *xs = malloc((size_t)n * sizeof *xs), *y = malloc((size_t)n * rows * sizeof *y);
    float *scratch = malloc(2 * (size_t)cols * sizeof *scratch);
    if (!w || !d || !xq || !x || !sc || !xs || !y || !scratch) return 1;
    uint32_t s = 1;
    for (size_t i = 0; i < wbytes; i++) w[i] = (uint8_t)(lcg(&s) >> 24);
    for (size_t i = 0; i < (size_t)rows * ng; i++) d[i] = (uint16_t)(0x1800 + (lcg(&s) >> 20) % 0x1000);
    for (size_t i = 0; i < (size_t)n * cols; i++) x[i] = (float)((int)(lcg(&s) >> 16) % 2001 - 1000) / 500.0f;
    for (int j = 0; j < n; j++) colibri_quantize_row(x + (size_t)j * cols, cols, xq + (size_t)j * cols, &xs[j]);
    for (uint32_t r = 0; r < rows; r++) sc[r] = 0.001f * (float)(r % 7 + 1);
    colibri_tensor t = {w, q4 ? (const float *)(const void *)d : sc,
                        q4 ? COLIBRI_DT_Q4 : COLIBRI_DT_INT8, rows, cols};
    const char *name = q4 ? colibri_q4_kernels_init() : colibri_kernels_init();
    colibri_kernels_init();
    for (int k = 0; k < reps; k++) {
        if (q8act) colibri_rows_dot_q8(&t, 0, rows, xq, xs, n, cols, y, rows);
        else colibri_rows_dot(&t, 0, rows, x, n, cols, y, rows, scratch);
    }
    uint32_t h = 2166136261u; /* FNV-1a over the output bytes */
    const unsigned char *b = (const unsigned char *)y;
    for (size_t i = 0; i < (size_t)n * rows * sizeof *y; i++) h = (h ^ b[i]) * 16777619u;
    printf("%s %08x\n", name, h);
    return 0;
}
