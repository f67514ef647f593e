/* Placeholder until the driver-API backend lands: every open fails with a reason, so the core
 * falls back to the CPU (--backend auto) or reports the reason (--backend cuda). */
#include "cuda_backend.h"

#include <stdio.h>

int colibri_cuda_open(colibri_cuda **out, const struct colibri_model *model, int stream_count,
                      char *why, size_t why_len) {
    (void)model; (void)stream_count;
    *out = NULL;
    snprintf(why, why_len, "CUDA backend not built into this binary");
    return -1;
}

int colibri_cuda_forward(colibri_cuda *cu, const int32_t *ids, int n, int pos, float *logits,
                         char *why, size_t why_len) {
    (void)cu; (void)ids; (void)n; (void)pos; (void)logits;
    snprintf(why, why_len, "CUDA backend not built into this binary");
    return -1;
}

void colibri_cuda_reset(colibri_cuda *cu) { (void)cu; }
void colibri_cuda_get_info(const colibri_cuda *cu, colibri_cuda_info *info) { (void)cu; (void)info; }
void colibri_cuda_close(colibri_cuda *cu) { (void)cu; }
