/* The gated delta rule's step (deltanet.c), apart so that benchmarks/deltanet_forms.c times the
 * runtime's own recurrence against the chunked form. */
#ifndef COLIBRI_LAYERS_DELTANET_H
#define COLIBRI_LAYERS_DELTANET_H

#include <stddef.h>
#include <string.h>

/* Four lanes at a time (GCC/Clang vector extension: one SSE register on x86_64, one NEON register
 * on aarch64; element-wise IEEE operations, the same as a scalar tail's); unaligned loads
 * through memcpy. */
typedef float colibri_v4f __attribute__((vector_size(16)));
static inline colibri_v4f colibri_ld4(const float *p) {
    colibri_v4f v;
    memcpy(&v, p, sizeof v);
    return v;
}
static inline void colibri_st4(float *p, colibri_v4f v) { memcpy(p, &v, sizeof v); }

/* One token through one value head's state S [dk, dv] (row r = key lane r):
 *   S *= decay; mem = S^T k; d = (v - mem) * beta; S += k d^T; o = S^T q
 * dv <= 1024. */
void colibri_delta_step(float *restrict S, size_t dk, size_t dv, const float *restrict q,
                        const float *restrict k, const float *restrict v, float beta, float decay,
                        float *restrict o);

#endif
