/* The route stage per token (benchmarks/route.py builds and runs this; not part of the product):
 * the router's f32 logits (colibri_rows_dot, E x D) and the bitonic top-k with its softmax
 * (colibri_route_token) for E experts, k chosen, hidden D; ns per token, best of REPS. */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "cpu/kernels.h"
#include "layers/route.h"

static double now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: route_bench E K D ITERS\n");
        return 2;
    }
    int E = atoi(argv[1]), K = atoi(argv[2]), D = atoi(argv[3]), iters = atoi(argv[4]);
    colibri_kernels_init();
    float *w = malloc((size_t)E * D * sizeof(float)), *x = malloc((size_t)D * sizeof(float));
    float *logits = malloc((size_t)E * sizeof(float)), *scratch = malloc(2 * (size_t)D * sizeof(float));
    unsigned s = 12345u;
    for (size_t i = 0; i < (size_t)E * D; i++) w[i] = (float)((s = s * 1103515245u + 12345u) >> 9) * 1e-9f - 4e-3f;
    for (int i = 0; i < D; i++) x[i] = (float)((s = s * 1103515245u + 12345u) >> 9) * 2e-7f - 0.8f;
    colibri_tensor t = {w, NULL, COLIBRI_DT_F32, (uint32_t)E, (uint32_t)D};
    int32_t idx[16];
    float wt[16];
    double best_dot = 1e30, best_route = 1e30;
    volatile float sink = 0;
    for (int rep = 0; rep < 7; rep++) {
        double a = now_ns();
        for (int i = 0; i < iters; i++) {
            x[i % D] += 1e-7f; /* a new input each time */
            colibri_rows_dot(&t, 0, (uint32_t)E, x, 1, (size_t)D, logits, (size_t)E, scratch);
        }
        double b = now_ns();
        for (int i = 0; i < iters; i++) {
            logits[i % E] += 1e-6f;
            colibri_route_token(logits, E, K, 1, idx, wt);
            sink += wt[0];
        }
        double c = now_ns();
        if ((b - a) / iters < best_dot) best_dot = (b - a) / iters;
        if ((c - b) / iters < best_route) best_route = (c - b) / iters;
    }
    printf("{\"E\": %d, \"K\": %d, \"D\": %d, \"router_logits_ns\": %.0f, \"topk_ns\": %.0f}\n", E, K,
           D, best_dot, best_route);
    return sink == 12345.0f;
}
