/* Decode-speed probe for the grouped 4-bit candidates (benchmarks/q4_choice.py measures their
 * accuracy): one matrix-vector product y = W x over a matrix larger than the last-level cache,
 * one thread, with the runtime's decode kernel shape (weights dequantised exactly to f32 in
 * registers, then fused multiply-add into two 8-lane accumulators, as kernels.c's AVX2_DOT).
 * Candidates: group 32/64/128, f16 or f32 scales, with or without a per-group minimum; the
 * existing int8 per-row and f16 kernels of the same shape are the baselines.
 *
 *   cc -O2 -o /tmp/q4_gemv benchmarks/q4_gemv.c -lm && /tmp/q4_gemv [rows] [cols] [reps]
 * x86_64 with AVX2+FMA+F16C only (this is a measurement tool, not part of the runtime). */
#include <immintrin.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define T __attribute__((target("avx2,fma,f16c")))

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One row: ng groups of G weights; nibbles of 32-weight blocks: byte j = w[j] | w[j+16] << 4. */
static inline __attribute__((always_inline)) T float q4_row(const uint8_t *q, const void *sc, const void *mn, int ng, int G,
                             int f16, int hasmin, const float *x) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    const __m128i lo4 = _mm_set1_epi8(0x0f);
    const __m256i eight = _mm256_set1_epi32(8);
    for (int g = 0; g < ng; g++) {
        float d = f16 ? _cvtsh_ss(((const uint16_t *)sc)[g]) : ((const float *)sc)[g];
        float m = hasmin ? (f16 ? _cvtsh_ss(((const uint16_t *)mn)[g]) : ((const float *)mn)[g]) : 0;
        __m256 vd = _mm256_set1_ps(d), vm = _mm256_set1_ps(m);
        for (int b = 0; b < G / 32; b++) {
            const uint8_t *p = q + (size_t)g * (G / 2) + b * 16;
            const float *xx = x + (size_t)g * G + b * 32;
            __builtin_prefetch(p + 1024);
            __m128i v = _mm_loadu_si128((const __m128i *)p);
            __m128i l = _mm_and_si128(v, lo4), h = _mm_and_si128(_mm_srli_epi16(v, 4), lo4);
            __m128i parts[4] = {l, _mm_srli_si128(l, 8), h, _mm_srli_si128(h, 8)};
            for (int k = 0; k < 4; k++) {
                __m256i qi = _mm256_cvtepu8_epi32(parts[k]);
                __m256 w;
                if (hasmin) w = _mm256_fmadd_ps(_mm256_cvtepi32_ps(qi), vd, vm);
                else w = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(qi, eight)), vd);
                if (k & 1) a1 = _mm256_fmadd_ps(w, _mm256_loadu_ps(xx + 8 * k), a1);
                else a0 = _mm256_fmadd_ps(w, _mm256_loadu_ps(xx + 8 * k), a0);
            }
        }
    }
    a0 = _mm256_add_ps(a0, a1);
    float t[8];
    _mm256_storeu_ps(t, a0);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

/* one instantiation per candidate, so group size and scale type are compile-time constants */
#define Q4C(G, F, M) return q4_row(q, s0, s1, ng, G, F, M, x)
static T float q4_dispatch(int c, const uint8_t *q, const void *s0, const void *s1, int ng, const float *x) {
    switch (c) {
    case 0: Q4C(32, 1, 0); case 1: Q4C(32, 1, 1); case 2: Q4C(32, 0, 0); case 3: Q4C(32, 0, 1);
    case 4: Q4C(64, 1, 0); case 5: Q4C(64, 1, 1); case 6: Q4C(64, 0, 0); case 7: Q4C(64, 0, 1);
    case 8: Q4C(128, 1, 0); case 9: Q4C(128, 1, 1); case 10: Q4C(128, 0, 0); default: Q4C(128, 0, 1);
    }
}

static T float i8_row(const int8_t *w, const float *x, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int i = 0; i < n; i += 16) {
        __builtin_prefetch(w + i + 2048);
        a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)(w + i)))), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const void *)(w + i + 8)))), _mm256_loadu_ps(x + i + 8), a1);
    }
    a0 = _mm256_add_ps(a0, a1);
    float t[8];
    _mm256_storeu_ps(t, a0);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

static T float f16_row(const uint16_t *w, const float *x, int n) {
    __m256 a0 = _mm256_setzero_ps(), a1 = a0;
    for (int i = 0; i < n; i += 16) {
        __builtin_prefetch(w + i + 1024);
        a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const void *)(w + i))), _mm256_loadu_ps(x + i), a0);
        a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const void *)(w + i + 8))), _mm256_loadu_ps(x + i + 8), a1);
    }
    a0 = _mm256_add_ps(a0, a1);
    float t[8];
    _mm256_storeu_ps(t, a0);
    return ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
}

int main(int argc, char **argv) {
    int rows = argc > 1 ? atoi(argv[1]) : 16384, cols = argc > 2 ? atoi(argv[2]) : 4096;
    int reps = argc > 3 ? atoi(argv[3]) : 20;
    size_t n = (size_t)rows * cols;
    uint8_t *buf = aligned_alloc(64, n * 2 + 64);
    float *x = aligned_alloc(64, cols * 4), *y = aligned_alloc(64, rows * 4);
    for (size_t i = 0; i < n * 2; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
    for (int i = 0; i < cols; i++) x[i] = (float)((i % 17) - 8) * 0.01f;
    uint16_t *sc16 = malloc((size_t)rows * (cols / 32) * 2 * 2);
    float *sc32 = malloc((size_t)rows * (cols / 32) * 4 * 2);
    for (size_t i = 0; i < (size_t)rows * (cols / 32) * 2; i++) { sc16[i] = 0x2000 + (i & 255); sc32[i] = 0.01f; }
    printf("| kernel | bytes/weight | GB/s | Mweights/s | relative to int8 |\n|---|---|---|---|---|\n");
    /* candidates interleaved within each repetition, best time each: the machine is shared */
    double best[14];
    for (int c = 0; c < 14; c++) best[c] = 1e30;
    for (int r = 0; r < reps; r++)
        for (int c = -2; c < 12; c++) {
            double t0 = now();
            for (int i = 0; i < rows; i++) {
                if (c == -2) y[i] = i8_row((const int8_t *)buf + (size_t)i * cols, x, cols);
                else if (c == -1) y[i] = f16_row((const uint16_t *)buf + (size_t)i * cols, x, cols);
                else {
                    int f16 = !(c & 2), G = 32 << (c / 4), ng = cols / G;
                    size_t sb = (size_t)ng * (f16 ? 2 : 4);
                    const uint8_t *s = f16 ? (const uint8_t *)sc16 : (const uint8_t *)sc32;
                    const uint8_t *q = buf + (size_t)i * cols / 2, *s0 = s + i * sb * 2, *s1 = s0 + sb;
                    y[i] = q4_dispatch(c, q, s0, s1, ng, x);
                }
            }
            double dt = now() - t0;
            if (dt < best[c + 2]) best[c + 2] = dt;
        }
    double base = n / best[0] / 1e6;
    for (int c = -2; c < 12; c++) {
        char name[64];
        double bytes;
        if (c == -2) { snprintf(name, sizeof name, "int8 per-row"); bytes = 1 + 4.0 / cols; }
        else if (c == -1) { snprintf(name, sizeof name, "f16"); bytes = 2; }
        else {
            int f16 = !(c & 2), hasmin = c & 1, G = 32 << (c / 4);
            snprintf(name, sizeof name, "q4 g%d %s%s", G, f16 ? "f16" : "f32", hasmin ? " + min" : "");
            bytes = 0.5 + (f16 ? 2.0 : 4.0) * (hasmin ? 2 : 1) / G;
        }
        double mw = n / best[c + 2] / 1e6;
        printf("| %s | %.3f | %.1f | %.0f | %.2f |\n", name, bytes, n * bytes / best[c + 2] / 1e9, mw, mw / base);
    }
    volatile float sink = y[0];
    (void)sink;
    return 0;
}
