/* The MoE block in the four stages of the design: Preprocess (normalise the block input), Route
 * (router logits, top-k), Dispatch (tokens grouped contiguously per expert) and Compute (grouped
 * SwiGLU FFN per expert, weighted sum back in a fixed order), plus the shared expert when the
 * model has one. Matrix jobs run on the pool in fixed partitions (linear.h); everything else
 * runs on the calling thread in a fixed order, so results are the same on any thread count. */
#include <math.h>
#include <string.h>

#include "core/context.h"
#include "core/le.h"
#include "cpu/kernels.h"
#include "kinds.h"
#include "linear.h"
#include "moe_experts.h"
#include "route.h"

/* ---- the format side ------------------------------------------------------------------------ */

/* ffn_params[0]: the COLIBRI_MOE_* bits this runtime has; [1], [2]: the clamped SwiGLU's alpha
 * and limit (finite, > 0) when its bit is set, else 0; [3]: 0. */
colibri_status colibri_moe_validate(const struct colibri_model *m, uint32_t l, char *why,
                                    size_t len) {
    const colibri_layer_desc *d = &m->layers[l].desc;
    uint32_t f = d->ffn_params[0];
    if (f & ~COLIBRI_MOE_KNOWN_FLAGS)
        return fail(why, len, COLIBRI_E_UNSUPPORTED,
                    "layer %u (moe): ffn_params[0] = 0x%x has bits 0x%x this runtime does not "
                    "define (a newer format feature: update the runtime)", l, f,
                    f & ~COLIBRI_MOE_KNOWN_FLAGS);
    int swiglu = (f & COLIBRI_MOE_CLAMPED_SWIGLU) != 0;
    for (int i = 1; i < 4; i++) {
        if (swiglu && i < 3) {
            float v = colibri_f32_of(d->ffn_params[i]);
            if (!(isfinite(v) && v > 0.0f))
                return fail(why, len, COLIBRI_E_BAD_LAYER,
                            "layer %u (moe): ffn_params[%d] (SwiGLU %s) = %g, must be finite and > 0",
                            l, i, i == 1 ? "alpha" : "limit", (double)v);
        } else if (d->ffn_params[i]) {
            return fail(why, len, COLIBRI_E_BAD_LAYER, "layer %u (moe): ffn_params[%d] = %u, must be 0",
                        l, i, d->ffn_params[i]);
        }
    }
    return COLIBRI_OK;
}

int colibri_moe_tensor(const struct colibri_model *m, uint32_t l, uint32_t tk, uint32_t *rows,
                       uint32_t *cols) {
    uint32_t dp = m->embed_dim_pad, f = m->flags, p = m->layers[l].desc.ffn_params[0];
    int shared = (f & COLIBRI_FLAG_SHARED_EXPERT) != 0, eb = (p & COLIBRI_MOE_EXPERT_BIAS) != 0;
    switch (tk) {
    case COLIBRI_K_FFN_NORM: *rows = 1; *cols = dp; return 1;
    case COLIBRI_K_ROUTER: *rows = m->num_experts; *cols = dp; return 1;
    case COLIBRI_K_ROUTER_BIAS: *rows = 1; *cols = m->num_experts;
        return (p & COLIBRI_MOE_ROUTER_BIAS) != 0;
    case COLIBRI_K_EXPERT_B1: case COLIBRI_K_EXPERT_B3: *rows = 1; *cols = m->expert_size; return eb;
    case COLIBRI_K_EXPERT_B2: *rows = 1; *cols = dp; return eb;
    case COLIBRI_K_EXPERT_W1: case COLIBRI_K_EXPERT_W3: *rows = m->expert_size; *cols = dp; return 1;
    case COLIBRI_K_EXPERT_W2: *rows = dp; *cols = m->expert_size; return 1;
    case COLIBRI_K_SHARED_W1: case COLIBRI_K_SHARED_W3:
        *rows = m->shared_expert_size; *cols = dp; return shared;
    case COLIBRI_K_SHARED_W2: *rows = dp; *cols = m->shared_expert_size; return shared;
    case COLIBRI_K_SHARED_GATE: *rows = 1; *cols = dp;
        return (f & COLIBRI_FLAG_SHARED_EXPERT_GATE) != 0;
    default: return 0;
    }
}

void colibri_moe_cache(const struct colibri_model *m, uint32_t l, colibri_cache_need *need) {
    (void)m;
    (void)l;
    memset(need, 0, sizeof *need); /* stateless across tokens */
}

/* ---- the forward step ----------------------------------------------------------------------- */

#ifdef COLIBRI_DEBUG
static void record_routing(colibri_ctx *ctx, int l, const colibri_batch *bt) {
    const struct colibri_model *m = ctx->model;
    size_t K = m->top_k, E = m->num_experts, rec = 2 * K + E;
    for (int j = 0; j < bt->n; j++) {
        size_t p = (size_t)bt->pos[j];
        colibri_ctx *own = bt->seqs[bt->seq[j]].owner; /* the row's sequence keeps its record */
        float *d = own->b.dump + (p * m->n_layers + (size_t)l) * rec;
        for (size_t i = 0; i < K; i++) {
            d[i] = (float)ctx->b.topk_idx[j * K + i];
            d[K + i] = ctx->b.topk_w[j * K + i];
        }
        memcpy(d + 2 * K, ctx->b.router + j * E, E * sizeof(float));
        own->b.dump_calls[p] = own->calls;
    }
}
#endif

void colibri_moe_forward(colibri_ctx *ctx, int l, const colibri_batch *bt) {
    const struct colibri_model *m = ctx->model;
    const colibri_layer *ly = &m->layers[l];
    colibri_buffers *b = &ctx->b;
    int n = bt->n;
    size_t dp = m->embed_dim_pad, E = m->num_experts, K = m->top_k;
    size_t Fs = m->shared_expert_size;

    /* Preprocess: the block input, normalised once for the router and every expert. */
    for (int j = 0; j < n; j++)
        colibri_rmsnorm(b->h + j * dp, b->x + j * dp, ly->ffn_norm.data, m->embed_dim, dp,
                        m->norm_eps);
    colibri_stage_mark(ctx, COLIBRI_STAGE_NORMS);

    /* Route: router logits (f32 weights) then top-k per token. */
    colibri_rows_dot(&ly->router, 0, (uint32_t)E, b->h, n, dp, b->router, E, b->scratch);
    if (ly->router_bias.data) colibri_add_bias(b->router, E, n, ly->router_bias.data, E);
    for (int j = 0; j < n; j++)
        colibri_route_token(b->router + j * E, (int)E, (int)K,
                            m->routing == COLIBRI_WEIGHTS_RENORM, b->topk_idx + j * K,
                            b->topk_w + j * K);
#ifdef COLIBRI_DEBUG
    record_routing(ctx, l, bt);
#endif
    colibri_stage_mark(ctx, COLIBRI_STAGE_ROUTE);

    /* Dispatch: count per expert, prefix offsets, each (token, choice) its slot in its
     * expert's contiguous group (tokens in ascending order inside a group). */
    memset(b->counts, 0, E * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)n * K; i++) b->counts[b->topk_idx[i]]++;
    b->offsets[0] = 0;
    for (size_t e = 0; e < E; e++) {
        b->offsets[e + 1] = b->offsets[e] + b->counts[e];
        b->fill[e] = 0;
    }
    for (int j = 0; j < n; j++)
        for (size_t i = 0; i < K; i++) {
            int32_t e = b->topk_idx[j * K + i];
            int32_t slot = b->offsets[e] + b->fill[e]++;
            b->slot_of[j * K + i] = slot;
            b->slot_tok[slot] = j;
        }
    colibri_stage_mark(ctx, COLIBRI_STAGE_DISPATCH);

    /* Compute: every active expert's SwiGLU FFN over its group, expert-major (moe_experts.c),
     * and the shared expert; the outputs land in ys (slot order) and sout. */
    colibri_moe_experts(ctx, ly, n); /* marks the experts and the shared expert */

    /* Combine in a fixed order: choice 0..K-1 of each token, then the shared expert. */
    for (int j = 0; j < n; j++) {
        float *x = b->x + j * dp;
        const float *w = b->topk_w + j * K;
        const int32_t *slot = b->slot_of + j * K;
        float sg = 1.0f;
        if (Fs && ly->shared_gate.data)
            sg = 1.0f / (1.0f + expf(-colibri_dot_f32(ly->shared_gate.data, b->h + j * dp, dp)));
        for (size_t d = 0; d < dp; d++) {
            float acc = 0.0f;
            for (size_t i = 0; i < K; i++) acc += w[i] * b->ys[(size_t)slot[i] * dp + d];
            if (Fs) acc += sg * b->sout[j * dp + d];
            x[d] += acc;
        }
    }
    colibri_stage_mark(ctx, COLIBRI_STAGE_COMBINE);
}
