/* The CPU forward pass (docs/format.md, "Forward pass") over a chunk of tokens.
 *
 * Per layer: attention (RMSNorm, Q/K/V projections, optional bias and q/k norm, RoPE, KV cache,
 * causal grouped-query attention, output projection), then the MoE block in the four stages of
 * the design: Preprocess (normalise the block input), Route (router logits, top-k), Dispatch
 * (tokens grouped contiguously per expert) and Compute (grouped SwiGLU FFN per expert, weighted
 * sum back in a fixed order), plus the shared expert when the model has one.
 *
 * Parallel work (matrix rows, attention heads) is split over the pool in fixed partitions and
 * each output value is computed start to finish by one thread, so results are bitwise identical
 * for any thread count. Everything else runs on the calling thread in a fixed order. */
#include <math.h>
#include <string.h>

#include "core/context.h"
#include "cpu/kernels.h"
#include "route.h"

/* ---- matrix jobs ----------------------------------------------------------------------------- */

/* One weight matrix applied to a group of token rows: y[j, r] = W[r, :] . x[j, :]. */
typedef struct {
    const colibri_tensor *w;
    const float *x;
    size_t ldx;
    const int8_t *xq; /* int8 activations instead of x (int8 weights with use_q8) */
    const float *xqs;
    size_t ldq;
    int n;
    float *y;
    size_t ldy;
} mm_seg;

typedef struct {
    colibri_ctx *ctx;
    int nseg;
    mm_seg seg[2 * COLIBRI_MAX_EXPERTS + 4];
} mm_job;

static void mm_task(void *arg, int t, int nt) {
    mm_job *job = arg;
    colibri_buffers *b = &job->ctx->b;
    float *scratch = b->scratch + (size_t)t * 2 * b->max_cols;
    for (int s = 0; s < job->nseg; s++) {
        const mm_seg *g = &job->seg[s];
        unsigned long lo, hi;
        colibri_split(g->w->rows, t, nt, &lo, &hi);
        if (lo == hi) continue;
        if (g->xq)
            colibri_rows_dot_q8(g->w, (uint32_t)lo, (uint32_t)hi, g->xq, g->xqs, g->n, g->ldq, g->y,
                                g->ldy);
        else
            colibri_rows_dot(g->w, (uint32_t)lo, (uint32_t)hi, g->x, g->n, g->ldx, g->y, g->ldy,
                             scratch);
    }
}

/* Add a segment; with int8 activations, quantise its input rows into xq rows [qrow, qrow+n). */
static void add_seg(mm_job *job, const colibri_tensor *w, const float *x, size_t ldx, int n,
                    float *y, size_t ldy, size_t qrow) {
    colibri_ctx *ctx = job->ctx;
    mm_seg *g = &job->seg[job->nseg++];
    memset(g, 0, sizeof *g);
    g->w = w;
    g->x = x;
    g->ldx = ldx;
    g->n = n;
    g->y = y;
    g->ldy = ldy;
    if (ctx->use_q8 && (w->dtype == COLIBRI_DT_INT8 || w->dtype == COLIBRI_DT_Q4) && n > 0) {
        colibri_buffers *b = &ctx->b;
        g->ldq = b->max_cols;
        g->xq = b->xq + qrow * g->ldq;
        g->xqs = b->xqs + qrow;
        for (int j = 0; j < n; j++)
            colibri_quantize_row(x + (size_t)j * ldx, w->cols, b->xq + (qrow + (size_t)j) * g->ldq,
                                 b->xqs + qrow + (size_t)j);
    }
}

static void run_job(mm_job *job) { colibri_pool_run(&job->ctx->pool, mm_task, job); }

/* ---- small per-token operations (calling thread) ---------------------------------------------- */

/* out[i] = w[i] * x[i] / sqrt(mean_{j<d} x[j]^2 + eps) for i < n (n >= d; lanes past d are padding). */
static void rmsnorm(float *out, const float *x, const float *w, size_t d, size_t n, float eps) {
    double ss = 0.0;
    for (size_t i = 0; i < d; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss / (double)d + (double)eps));
    for (size_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * inv);
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

static void rope_tables(colibri_ctx *ctx, int n) {
    const struct colibri_model *m = ctx->model;
    int half = (int)m->head_dim / 2;
    for (int j = 0; j < n; j++) {
        float *cs = ctx->b.rope + (size_t)j * m->head_dim;
        double p = (double)(ctx->pos + j);
        for (int i = 0; i < half; i++) {
            double a = p * pow((double)m->rope_theta, -2.0 * i / (double)m->head_dim);
            cs[i] = (float)cos(a);
            cs[half + i] = (float)sin(a);
        }
    }
}

/* Rotate-half RoPE on each head of one token: pair lane i with lane i + Dh/2. */
static void rope_apply(float *v, int heads, int dh, const float *cs) {
    int half = dh / 2;
    for (int hh = 0; hh < heads; hh++) {
        float *x = v + (size_t)hh * dh;
        for (int i = 0; i < half; i++) {
            float x1 = x[i], x2 = x[i + half], c = cs[i], s = cs[half + i];
            x[i] = x1 * c - x2 * s;
            x[i + half] = x2 * c + x1 * s;
        }
    }
}

static void qk_norm(float *v, int heads, int dh, const colibri_tensor *w, int per_head, float eps) {
    const float *g = w->data;
    if (per_head)
        for (int hh = 0; hh < heads; hh++)
            rmsnorm(v + (size_t)hh * dh, v + (size_t)hh * dh, g, (size_t)dh, (size_t)dh, eps);
    else
        rmsnorm(v, v, g, (size_t)heads * dh, (size_t)heads * dh, eps);
}

/* ---- attention ------------------------------------------------------------------------------ */

typedef struct {
    colibri_ctx *ctx;
    int layer, n;
} att_job;

static void att_task(void *arg, int t, int nt) {
    att_job *job = arg;
    colibri_ctx *ctx = job->ctx;
    const struct colibri_model *m = ctx->model;
    colibri_buffers *b = &ctx->b;
    size_t dh = m->head_dim, H = m->n_heads, qd = H * dh, kvd = (size_t)m->n_kv_heads * dh;
    size_t S = m->max_seq_len, group = H / m->n_kv_heads, layer = (size_t)job->layer * S * kvd;
    const float *kc = (const float *)b->kcache + layer, *vc = (const float *)b->vcache + layer;
    const uint16_t *kh = (const uint16_t *)b->kcache + layer;
    const uint16_t *vh = (const uint16_t *)b->vcache + layer;
    float *sc = b->scores + (size_t)t * S;
    float scale = 1.0f / sqrtf((float)dh);
    unsigned long lo, hi;
    colibri_split((unsigned long)job->n * H, t, nt, &lo, &hi);
    for (unsigned long pair = lo; pair < hi; pair++) {
        size_t j = pair / H, hh = pair % H, g = hh / group;
        int p = ctx->pos + (int)j; /* causal: positions 0..p */
        const float *q = b->q + j * qd + hh * dh;
        float mx = -INFINITY;
        for (int s = 0; s <= p; s++) {
            size_t at = (size_t)s * kvd + g * dh;
            sc[s] = (b->kv_f16 ? colibri_dot_f16(kh + at, q, dh) : colibri_dot_f32(q, kc + at, dh)) *
                    scale;
            mx = fmaxf(mx, sc[s]);
        }
        float sum = 0.0f;
        for (int s = 0; s <= p; s++) {
            sc[s] = expf(sc[s] - mx);
            sum += sc[s];
        }
        float inv = 1.0f / sum;
        float *out = b->att + j * qd + hh * dh;
        memset(out, 0, dh * sizeof(float));
        for (int s = 0; s <= p; s++) {
            const float *v = vc + (size_t)s * kvd + g * dh;
            float w = sc[s] * inv;
            if (b->kv_f16) /* widened exactly, same multiply-then-add per element */
                colibri_axpy_f16(out, w, vh + (size_t)s * kvd + g * dh, dh);
            else
                for (size_t d = 0; d < dh; d++) out[d] += w * v[d];
        }
    }
}

static void attention_block(colibri_ctx *ctx, int l, int n) {
    const struct colibri_model *m = ctx->model;
    const colibri_layer *ly = &m->layers[l];
    colibri_buffers *b = &ctx->b;
    size_t dp = m->embed_dim_pad, dh = m->head_dim, H = m->n_heads, Hkv = m->n_kv_heads;
    size_t qd = H * dh, kvd = Hkv * dh, S = m->max_seq_len;

    for (int j = 0; j < n; j++)
        rmsnorm(b->h + j * dp, b->x + j * dp, ly->attn_norm.data, m->embed_dim, dp, m->norm_eps);

    mm_job job = {.ctx = ctx};
    add_seg(&job, &ly->wq, b->h, dp, n, b->q, qd, 0);
    add_seg(&job, &ly->wk, b->h, dp, n, b->k, kvd, 0);
    add_seg(&job, &ly->wv, b->h, dp, n, b->v, kvd, 0);
    run_job(&job);

    for (int j = 0; j < n; j++) {
        float *q = b->q + j * qd, *k = b->k + j * kvd, *v = b->v + j * kvd;
        if (ly->bq.data) {
            const float *bq = ly->bq.data, *bk = ly->bk.data, *bv = ly->bv.data;
            for (size_t i = 0; i < qd; i++) q[i] += bq[i];
            for (size_t i = 0; i < kvd; i++) k[i] += bk[i];
            for (size_t i = 0; i < kvd; i++) v[i] += bv[i];
        }
        if (ly->q_norm.data) {
            int per_head = (m->flags & COLIBRI_FLAG_QK_NORM_HEAD) != 0;
            qk_norm(q, (int)H, (int)dh, &ly->q_norm, per_head, m->norm_eps);
            qk_norm(k, (int)Hkv, (int)dh, &ly->k_norm, per_head, m->norm_eps);
        }
        const float *cs = b->rope + j * dh;
        rope_apply(q, (int)H, (int)dh, cs);
        rope_apply(k, (int)Hkv, (int)dh, cs);
        /* The cache holds what attention reads, for this token too, so prefill and decode
         * see the same (rounded) keys and values. */
        size_t at = ((size_t)l * S + (size_t)(ctx->pos + j)) * kvd;
        if (b->kv_f16) {
            colibri_f32_to_f16(k, kvd, (uint16_t *)b->kcache + at);
            colibri_f32_to_f16(v, kvd, (uint16_t *)b->vcache + at);
        } else {
            memcpy((float *)b->kcache + at, k, kvd * sizeof(float));
            memcpy((float *)b->vcache + at, v, kvd * sizeof(float));
        }
    }

    att_job aj = {ctx, l, n};
    colibri_pool_run(&ctx->pool, att_task, &aj);

    mm_job out = {.ctx = ctx};
    add_seg(&out, &ly->wo, b->att, qd, n, b->tmp, dp, 0);
    run_job(&out);
    for (size_t i = 0; i < (size_t)n * dp; i++) b->x[i] += b->tmp[i];
}

/* ---- MoE block ------------------------------------------------------------------------------ */

#ifdef COLIBRI_DEBUG
static void record_routing(colibri_ctx *ctx, int l, int n) {
    const struct colibri_model *m = ctx->model;
    size_t K = m->top_k, E = m->num_experts, rec = 2 * K + E;
    for (int j = 0; j < n; j++) {
        size_t p = (size_t)ctx->pos + j;
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

static void moe_block(colibri_ctx *ctx, int l, int n) {
    const struct colibri_model *m = ctx->model;
    const colibri_layer *ly = &m->layers[l];
    colibri_buffers *b = &ctx->b;
    size_t dp = m->embed_dim_pad, E = m->num_experts, K = m->top_k, F = m->expert_size;
    size_t Fs = m->shared_expert_size, T = (size_t)b->chunk;

    /* Preprocess: the block input, normalised once for the router and every expert. */
    for (int j = 0; j < n; j++)
        rmsnorm(b->h + j * dp, b->x + j * dp, ly->ffn_norm.data, m->embed_dim, dp, m->norm_eps);

    /* Route: router logits (f32 weights) then top-k per token. */
    colibri_rows_dot(&ly->router, 0, (uint32_t)E, b->h, n, dp, b->router, E, b->scratch);
    for (int j = 0; j < n; j++)
        colibri_route_token(b->router + j * E, (int)E, (int)K,
                            m->routing == COLIBRI_WEIGHTS_RENORM, b->topk_idx + j * K,
                            b->topk_w + j * K);
#ifdef COLIBRI_DEBUG
    record_routing(ctx, l, n);
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
    mm_job up = {.ctx = ctx};
    for (size_t e = 0; e < E; e++) {
        int c = b->counts[e];
        if (!c) continue;
        size_t off = (size_t)b->offsets[e];
        add_seg(&up, &ly->w1[e], b->xs + off * dp, dp, c, b->gate + off * F, F, off);
        add_seg(&up, &ly->w3[e], b->xs + off * dp, dp, c, b->up + off * F, F, off);
    }
    if (Fs) {
        add_seg(&up, &ly->shared_w1, b->h, dp, n, b->sgate, Fs, T * K);
        add_seg(&up, &ly->shared_w3, b->h, dp, n, b->sup, Fs, T * K);
    }
    run_job(&up);

    for (size_t i = 0; i < (size_t)n * K * F; i++) b->gate[i] = silu(b->gate[i]) * b->up[i];
    for (size_t i = 0; i < (size_t)n * Fs; i++) b->sgate[i] = silu(b->sgate[i]) * b->sup[i];

    mm_job down = {.ctx = ctx};
    for (size_t e = 0; e < E; e++) {
        int c = b->counts[e];
        if (!c) continue;
        size_t off = (size_t)b->offsets[e];
        add_seg(&down, &ly->w2[e], b->gate + off * F, F, c, b->ys + off * dp, dp, off);
    }
    if (Fs) add_seg(&down, &ly->shared_w2, b->sgate, Fs, n, b->sout, dp, T * K);
    run_job(&down);

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

/* ---- the pass ------------------------------------------------------------------------------- */

void colibri_cpu_forward_chunk(colibri_ctx *ctx, const int32_t *ids, int n, float *logits,
                               int all_logits) {
    const struct colibri_model *m = ctx->model;
    colibri_buffers *b = &ctx->b;
    size_t dp = m->embed_dim_pad, V = m->vocab_size;

    for (int j = 0; j < n; j++) colibri_row_f32(&m->tok_embed, (uint32_t)ids[j], b->x + j * dp);
    rope_tables(ctx, n);
    for (int l = 0; l < (int)m->n_layers; l++) {
        attention_block(ctx, l, n);
        moe_block(ctx, l, n);
    }
    /* The LM head for every token, or for the last one only (a prompt before sampling): one
     * token's row has the same bits either way (prefill == decode). */
    int j0 = all_logits ? 0 : n - 1;
    if (logits) {
        for (int j = j0; j < n; j++)
            rmsnorm(b->h + j * dp, b->x + j * dp, m->output_norm.data, m->embed_dim, dp, m->norm_eps);
        mm_job head = {.ctx = ctx};
        add_seg(&head, &m->lm_head, b->h + (size_t)j0 * dp, dp, n - j0, logits, V, 0);
        run_job(&head);
    }
    ctx->pos += n;
}
