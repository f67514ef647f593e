/* int8 activations (see int8.h). */
#include "int8.h"

#include <math.h>

void colibri_quantize_row_scalar(const float *x, size_t n, int8_t *q, float *scale) {
    float amax = 0.0f;
    for (size_t i = 0; i < n; i++) { /* fmaxf(amax, |x|) without a libm call per element */
        float a = fabsf(x[i]);
        if (a > amax) amax = a;
    }
    float s = amax > 0.0f ? amax / 127.0f : 1.0f, inv = 1.0f / s;
    for (size_t i = 0; i < n; i++) {
        float v = nearbyintf(x[i] * inv);
        q[i] = (int8_t)(v > 127.0f ? 127.0f : v < -127.0f ? -127.0f : v);
    }
    *scale = s;
}
