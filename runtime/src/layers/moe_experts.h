/* The Compute stage of the MoE block (moe.c): the routed experts' SwiGLU FFNs over the dispatched
 * slots, expert-major, and the shared expert. */
#ifndef COLIBRI_LAYERS_MOE_EXPERTS_H
#define COLIBRI_LAYERS_MOE_EXPERTS_H

#include <string.h>

#include "core/context.h"

/* The float whose bits a layer record's u32 parameter holds (the clamped SwiGLU's alpha, limit). */
static inline float colibri_f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* rows [0, count) of y (stride ld) += bias[0..width) (gpt-oss's router and expert biases) */
void colibri_add_bias(float *y, size_t ld, int count, const float *bias, size_t width);

/* After Dispatch (counts, offsets, slot_tok filled for the pass's n tokens): ys[slot] = the
 * slot's expert applied to its token's row of h, for every slot (with the layer's expert biases
 * and its SwiGLU, plain or clamped); sout = the shared expert's on every token when the model
 * has one. */
void colibri_moe_experts(colibri_ctx *ctx, const colibri_layer *ly, int n);

#endif
