/* The gated delta rule's step (deltanet.c), apart so that benchmarks/deltanet_forms.c times the
 * runtime's own recurrence against the chunked form. */
#ifndef COLIBRI_LAYERS_DELTANET_H
#define COLIBRI_LAYERS_DELTANET_H

#include <stddef.h>

/* One token through one value head's state S [dk, dv] (row r = key lane r):
 *   S *= decay; mem = S^T k; d = (v - mem) * beta; S += k d^T; o = S^T q
 * dv <= 1024. */
void colibri_delta_step(float *restrict S, size_t dk, size_t dv, const float *restrict q,
                        const float *restrict k, const float *restrict v, float beta, float decay,
                        float *restrict o);

#endif
