/* The Compute stage of the MoE block (moe.c): the routed experts' SwiGLU FFNs over the dispatched
 * slots, expert-major, and the shared expert. */
#ifndef COLIBRI_LAYERS_MOE_EXPERTS_H
#define COLIBRI_LAYERS_MOE_EXPERTS_H

#include "core/context.h"

/* After Dispatch (counts, offsets, slot_tok filled for the pass's n tokens): ys[slot] = the
 * slot's expert applied to its token's row of h, for every slot; sgate/sout = the shared
 * expert's on every token when the model has one. */
void colibri_moe_experts(colibri_ctx *ctx, const colibri_layer *ly, int n);

#endif
