/* The CUDA backend's recurrent state across calls and colibri_reset (tests/test_cuda_hybrid.py),
 * against the public API: argv = MODEL N IDS... (N prompt ids). On one --backend cuda context:
 *   A = logits of the prompt in one call (the state starts zeroed at open);
 *   B = the prompt continued with its own first token (state and KV carried to position N);
 *   reset, then C = the prompt again: it must give A's bits (reset zeroed the state; the KV rows
 *   are rewritten before they are read), and B's last row must differ from A's first (the call
 *   ran on the carried state). Prints "reset-equal 1|0", "carried-differs 1|0". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

int main(int argc, char **argv) {
    if (argc < 4) return 2;
    const int n = atoi(argv[2]);
    if (n < 1 || argc != 3 + n) return 2;
    int32_t *ids = calloc((size_t)n, sizeof *ids);
    for (int i = 0; i < n; i++) ids[i] = atoi(argv[3 + i]);
    char err[256] = "";
    colibri_options opt;
    memset(&opt, 0, sizeof opt);
    opt.threads = 1;
    opt.backend = COLIBRI_BACKEND_CUDA;
    opt.error = err;
    opt.error_len = sizeof err;
    colibri_ctx *ctx = NULL;
    if (colibri_init_ex(&ctx, argv[1], &opt) != COLIBRI_OK) {
        fprintf(stderr, "init: %s\n", err);
        return 1;
    }
    colibri_model_info mi;
    colibri_get_model_info(ctx, &mi);
    const size_t V = mi.vocab_size;
    float *a = malloc((size_t)n * V * sizeof *a), *b = malloc(V * sizeof *b);
    float *c = malloc((size_t)n * V * sizeof *c);
    if (colibri_forward(ctx, ids, n, a) || colibri_forward(ctx, ids, 1, b) ||
        colibri_reset(ctx) || colibri_forward(ctx, ids, n, c)) {
        fprintf(stderr, "forward: %s\n", colibri_last_error(ctx));
        return 1;
    }
    printf("reset-equal %d\n", memcmp(a, c, (size_t)n * V * sizeof *a) == 0);
    printf("carried-differs %d\n", memcmp(a, b, V * sizeof *a) != 0);
    colibri_free(ctx);
    free(ids);
    free(a);
    free(b);
    free(c);
    return 0;
}
