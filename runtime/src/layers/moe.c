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
#include "route.h"

/* ---- the format side ------------------------------------------------------------------------ */

static float f32_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

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
            float v = f32_of(d->ffn_params[i]);
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

static float silu(float v) { return v / (1.0f + expf(-v)); }

/* gpt-oss's activation (transformers' GptOssExperts._apply_gate): the gate clamped above at
 * `limit`, the up projection to [-limit, limit], (up + 1) * gate * sigmoid(alpha * gate). */
static void clamped_swiglu(float *gate, const float *up, size_t n, float alpha, float limit) {
    for (size_t i = 0; i < n; i++) {
        float g = gate[i] > limit ? limit : gate[i];
        float u = up[i] > limit ? limit : up[i] < -limit ? -limit : up[i];
        float glu = g * (1.0f / (1.0f + expf(-(g * alpha))));
        gate[i] = (u + 1.0f) * glu;
    }
}

/* rows [0, count) of y (stride ld) += bias[0..width) */
static void add_bias(float *y, size_t ld, int count, const float *bias, size_t width) {
    for (int r = 0; r < count; r++)
        for (size_t i = 0; i < width; i++) y[(size_t)r * ld + i] += bias[i];
}

#ifdef COLIBRI_DEBUG
static void record_routing(colibri_ctx *ctx, int l, const colibri_batch *bt) {
    const struct colibri_model *m = ctx->model;
    size_t K = m->top_k, E = m->num_experts, rec = 2 * K + E;
    for (int j = 0; j < bt->n; j++) {
        size_t p = (size_t)bt->pos[j];
        float *d = ctx->b.dump + (p * m->n_layers + (size_t)l) * rec;
        for (size_t i = 0; i < K; i++) {
            d[i] = (float)ctx->b.topk_idx[j * K + i];
            d[K + i] = ctx->b.topk_w[j * K + i];
        }
        memcpy(d + 2 * K, ctx->b.router + j * E, E * sizeof(float));
        ctx->b.dump_calls[p] = ctx->calls;
    }
}
#endif

void colibri_moe_forward(colibri_ctx *ctx, int l, const colibri_batch *bt) {
    const struct colibri_model *m = ctx->model;
    const colibri_layer *ly = &m->layers[l];
    colibri_buffers *b = &ctx->b;
    int n = bt->n;
    size_t dp = m->embed_dim_pad, E = m->num_experts, K = m->top_k, F = m->expert_size;
    size_t Fs = m->shared_expert_size, T = (size_t)b->chunk;

    /* Preprocess: the block input, normalised once for the router and every expert. */
    for (int j = 0; j < n; j++)
        colibri_rmsnorm(b->h + j * dp, b->x + j * dp, ly->ffn_norm.data, m->embed_dim, dp,
                        m->norm_eps);

    /* Route: router logits (f32 weights) then top-k per token. */
    colibri_rows_dot(&ly->router, 0, (uint32_t)E, b->h, n, dp, b->router, E, b->scratch);
    if (ly->router_bias.data) add_bias(b->router, E, n, ly->router_bias.data, E);
    for (int j = 0; j < n; j++)
        colibri_route_token(b->router + j * E, (int)E, (int)K,
                            m->routing == COLIBRI_WEIGHTS_RENORM, b->topk_idx + j * K,
                            b->topk_w + j * K);
#ifdef COLIBRI_DEBUG
    record_routing(ctx, l, bt);
#endif

    /* Dispatch: count per expert, prefix offsets, copy each token's row into its experts'
     * contiguous groups (tokens in ascending order inside a group). */
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
            memcpy(b->xs + (size_t)slot * dp, b->h + j * dp, dp * sizeof(float));
        }

    /* Compute: gate and up projections of every active expert's group (and the shared
     * expert) in one parallel job, SwiGLU, then the down projections in a second job. */
    colibri_mm_job up;
    colibri_mm_init(&up, ctx);
    for (size_t e = 0; e < E; e++) {
        int c = b->counts[e];
        if (!c) continue;
        size_t off = (size_t)b->offsets[e];
        colibri_mm_add(&up, &ly->w1[e], b->xs + off * dp, dp, c, b->gate + off * F, F, off);
        colibri_mm_add(&up, &ly->w3[e], b->xs + off * dp, dp, c, b->up + off * F, F, off);
    }
    if (Fs) {
        colibri_mm_add(&up, &ly->shared_w1, b->h, dp, n, b->sgate, Fs, T * K);
        colibri_mm_add(&up, &ly->shared_w3, b->h, dp, n, b->sup, Fs, T * K);
    }
    colibri_mm_run(&up);

    const uint32_t fp = ly->desc.ffn_params[0];
    for (size_t e = 0; ly->b1[0].data && e < E; e++) { /* expert biases (gpt-oss) */
        size_t off = (size_t)b->offsets[e];
        add_bias(b->gate + off * F, F, b->counts[e], ly->b1[e].data, F);
        add_bias(b->up + off * F, F, b->counts[e], ly->b3[e].data, F);
    }
    if (fp & COLIBRI_MOE_CLAMPED_SWIGLU)
        clamped_swiglu(b->gate, b->up, (size_t)n * K * F, f32_of(ly->desc.ffn_params[1]),
                       f32_of(ly->desc.ffn_params[2]));
    else
        for (size_t i = 0; i < (size_t)n * K * F; i++) b->gate[i] = silu(b->gate[i]) * b->up[i];
    for (size_t i = 0; i < (size_t)n * Fs; i++) b->sgate[i] = silu(b->sgate[i]) * b->sup[i];

    colibri_mm_job down;
    colibri_mm_init(&down, ctx);
    for (size_t e = 0; e < E; e++) {
        int c = b->counts[e];
        if (!c) continue;
        size_t off = (size_t)b->offsets[e];
        colibri_mm_add(&down, &ly->w2[e], b->gate + off * F, F, c, b->ys + off * dp, dp, off);
    }
    if (Fs) colibri_mm_add(&down, &ly->shared_w2, b->sgate, Fs, n, b->sout, dp, T * K);
    colibri_mm_run(&down);
    for (size_t e = 0; ly->b2[0].data && e < E; e++)
        add_bias(b->ys + (size_t)b->offsets[e] * dp, dp, b->counts[e], ly->b2[e].data, dp);

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
}
