/* Driver for benchmarks/arm_q8_insns.py: `reps` calls of colibri_rows_dot_q8 (int8 weights x int8
 * activations, the --int8-act matmul) over rows x cols random weights and n tokens, with the
 * kernel level this CPU and COLIBRI_CPU_SIMD give. Prints the level and a hash of the output
 * bits, so runs at different levels can be compared bit for bit. Built for aarch64 and run under
 * qemu-aarch64, which counts the executed instructions (the script); not a timing tool.
 *
 *   arm_q8_insns ROWS COLS N REPS */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/kernels.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: %s ROWS COLS N REPS\n", argv[0]);
        return 2;
    }
    uint32_t rows = (uint32_t)atoi(argv[1]), cols = (uint32_t)atoi(argv[2]);
    int n = atoi(argv[3]), reps = atoi(argv[4]);
    int8_t *w = malloc((size_t)rows * cols), *x = malloc((size_t)n * cols);
    float *sc = malloc(rows * sizeof *sc), *xs = malloc((size_t)n * sizeof *xs);
    float *y = malloc((size_t)n * rows * sizeof *y);
    if (!w || !x || !sc || !xs || !y) return 1;
    uint32_t s = 1;
    for (size_t i = 0; i < (size_t)rows * cols; i++) w[i] = (int8_t)((s = s * 1664525u + 1013904223u) >> 24);
    for (size_t i = 0; i < (size_t)n * cols; i++)
        x[i] = (int8_t)((int)((s = s * 1664525u + 1013904223u) >> 24) % 255 - 127);
    for (uint32_t r = 0; r < rows; r++) sc[r] = 0.001f * (float)(r % 7 + 1);
    for (int j = 0; j < n; j++) xs[j] = 0.01f * (float)(j % 5 + 1);
    colibri_tensor t = {w, sc, COLIBRI_DT_INT8, rows, cols};
    const char *name = colibri_kernels_init();
    for (int k = 0; k < reps; k++) colibri_rows_dot_q8(&t, 0, rows, x, xs, n, cols, y, rows);
    uint32_t h = 2166136261u; /* FNV-1a over the output bytes */
    const unsigned char *b = (const unsigned char *)y;
    for (size_t i = 0; i < (size_t)n * rows * sizeof *y; i++) h = (h ^ b[i]) * 16777619u;
    printf("%s %08x\n", name, h);
    return 0;
}
