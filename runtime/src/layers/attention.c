/* Attention layers: RMSNorm, Q/K/V projections (optional bias and q/k norm), RoPE, the layer's KV
 * cache, causal grouped-query attention, the output projection added to the residual stream.
 * Two kinds share this file:
 *   attention          a token at position p attends to positions 0..p; the cache keeps
 *                      max_seq_len rows (row = position);
 *   sliding_attention  it attends to max(0, p-W+1)..p, W = the layer's window (transformers'
 *                      sliding_window_overlay: kv_idx > q_idx - sliding_window, masking_utils.py);
 *                      the cache is a ring of min(W, max_seq_len) rows (position p in row p % R).
 *
 * Attention is split over the pool in (token, KV group, query heads) units, a fixed partition;
 * each (token, head) pair is computed start to finish by one thread with the same arithmetic
 * whichever unit holds it, so results are bitwise identical for any thread count. A pass's K
 * and V are stored before any attention reads them, and every read goes through the cache's
 * representation (f32, or f16 with --kv-cache f16), so a token attends to the same
 * bits whether it came in a long prompt or alone (prefill == decode). A ring shorter than the
 * context cannot take a whole pass first (a 64-token chunk would overwrite rows its own first
 * tokens still read), so such a layer stores the pass's rows in the arena's stage, reads positions
 * of this pass from there (the same bytes) and commits them to the ring after attention. */
#include <math.h>
#include <string.h>

#include "core/context.h"
#include "core/le.h"
#include "cpu/kernels.h"
#include "kinds.h"
#include "linear.h"

/* head_dim <= 1024 (model.c): at most 512 rotary pairs */
#define LIM_ROPE_PAIRS 512

/* ---- the format side ------------------------------------------------------------------------ */

/* ---- Qwen3.5 / Qwen3-Next gated attention (mixer flags 8..15) ------------------------------ *
 * OUTPUT_GATE: the attention output is multiplied by sigmoid(ATTN_GATE h) before WO (transformers'
 * Qwen3NextAttention: q_proj's second half per head, stored apart by the converter).
 * PARTIAL_ROPE: only the first R = mixer_params[0] lanes of each head rotate, pairing lane i with
 * i + R/2 at frequency theta^(-2i/R) (partial_rotary_factor; Qwen3.5 and Qwen3-Next: R = Dh/4). */
#define QWEN_ATTENTION_FLAGS (COLIBRI_MIXER_FLAG_OUTPUT_GATE | COLIBRI_MIXER_FLAG_PARTIAL_ROPE)

static uint32_t rotary_width(const struct colibri_model *m, const colibri_layer_desc *d) {
    return (d->mixer_flags & COLIBRI_MIXER_FLAG_PARTIAL_ROPE) ? d->mixer_params[0] : m->head_dim;
}

/* The rotary width of PARTIAL_ROPE: even, 2..Dh. */
static colibri_status qwen_check(const struct colibri_model *m, const colibri_layer_desc *d,
                                 uint32_t l, const char *name, char *why, size_t len) {
    uint32_t r = d->mixer_params[0];
    if ((d->mixer_flags & COLIBRI_MIXER_FLAG_PARTIAL_ROPE) && (r < 2 || r > m->head_dim || r % 2))
        return fail(why, len, COLIBRI_E_BAD_LAYER,
                    "layer %u (%s): mixer_params[0] = %u, the rotary width of PARTIAL_ROPE must be "
                    "even and in 2..head_dim (%u)", l, name, r, m->head_dim);
    return COLIBRI_OK;
}
/* ---- end of the Qwen block ------------------------------------------------------------------ */

/* What both attention kinds require of their record: only the flags this runtime defines
 * (gpt-oss's sinks and output bias, Qwen's gate and partial RoPE), parameters only where a flag
 * defines them, a window only for the sliding kind. */
static colibri_status check_mixer(const struct colibri_model *m, const colibri_layer_desc *d,
                                  uint32_t l, const char *name, int window_allowed, char *why,
                                  size_t len) {
    const uint32_t known = COLIBRI_MIXER_KNOWN_FLAGS | QWEN_ATTENTION_FLAGS;
    colibri_status s;
    for (int i = 0; i < 4; i++) {
        int used = i == 0 && (d->mixer_flags & COLIBRI_MIXER_FLAG_PARTIAL_ROPE);
        if (d->mixer_params[i] && !used)
            return fail(why, len, COLIBRI_E_BAD_LAYER,
                        "layer %u (%s): mixer_params[%d] = %u, must be 0", l, name, i,
                        d->mixer_params[i]);
    }
    if (d->mixer_flags & ~known)
        return fail(why, len, COLIBRI_E_UNSUPPORTED,
                    "layer %u (%s): mixer_flags = 0x%x has bits 0x%x this runtime does not define "
                    "(a newer format feature: update the runtime)", l, name, d->mixer_flags,
                    d->mixer_flags & ~known);
    if ((s = qwen_check(m, d, l, name, why, len))) return s;
    if (!window_allowed && d->window)
        return fail(why, len, COLIBRI_E_BAD_LAYER,
                    "layer %u (%s): window = %u, must be 0 for full attention", l, name, d->window);
    return COLIBRI_OK;
}

colibri_status colibri_attention_validate(const struct colibri_model *m, uint32_t l, char *why,
                                          size_t len) {
    return check_mixer(m, &m->layers[l].desc, l, "attention", 0, why, len);
}

colibri_status colibri_sliding_validate(const struct colibri_model *m, uint32_t l, char *why,
                                        size_t len) {
    const colibri_layer_desc *d = &m->layers[l].desc;
    if (d->window == 0)
        return fail(why, len, COLIBRI_E_BAD_LAYER,
                    "layer %u (sliding_attention): window = 0, must be at least 1", l);
    return check_mixer(m, d, l, "sliding_attention", 1, why, len);
}

int colibri_attention_tensor(const struct colibri_model *m, uint32_t l, uint32_t tk,
                             uint32_t *rows, uint32_t *cols) {
    uint32_t dp = m->embed_dim_pad, qd = m->n_heads * m->head_dim, kvd = m->n_kv_heads * m->head_dim;
    uint32_t f = m->flags, mf = m->layers[l].desc.mixer_flags;
    switch (tk) {
    case COLIBRI_K_ATTN_SINKS: *rows = 1; *cols = m->n_heads; return (mf & COLIBRI_MIXER_SINKS) != 0;
    case COLIBRI_K_BO: *rows = 1; *cols = dp; return (mf & COLIBRI_MIXER_O_BIAS) != 0;
    case COLIBRI_K_ATTN_NORM: *rows = 1; *cols = dp; return 1;
    case COLIBRI_K_ATTN_GATE: *rows = qd; *cols = dp;
        return (m->layers[l].desc.mixer_flags & COLIBRI_MIXER_FLAG_OUTPUT_GATE) != 0;
    case COLIBRI_K_WQ: *rows = qd; *cols = dp; return 1;
    case COLIBRI_K_WK: case COLIBRI_K_WV: *rows = kvd; *cols = dp; return 1;
    case COLIBRI_K_WO: *rows = dp; *cols = qd; return 1;
    case COLIBRI_K_BQ: *rows = 1; *cols = qd; return (f & COLIBRI_FLAG_QKV_BIAS) != 0;
    case COLIBRI_K_BK: case COLIBRI_K_BV: *rows = 1; *cols = kvd;
        return (f & COLIBRI_FLAG_QKV_BIAS) != 0;
    case COLIBRI_K_Q_NORM: case COLIBRI_K_K_NORM:
        *rows = 1;
        if (f & COLIBRI_FLAG_QK_NORM_HEAD) { *cols = m->head_dim; return 1; }
        if (f & COLIBRI_FLAG_QK_NORM_FULL) { *cols = tk == COLIBRI_K_Q_NORM ? qd : kvd; return 1; }
        return 0;
    default: return 0;
    }
}

/* The output gate's values of a pass live in the arena's mixer scratch (H*Dh per token). */
static size_t gate_floats(const struct colibri_model *m, uint32_t l) {
    return (m->layers[l].desc.mixer_flags & COLIBRI_MIXER_FLAG_OUTPUT_GATE)
               ? (size_t)m->n_heads * m->head_dim
               : 0;
}

void colibri_attention_cache(const struct colibri_model *m, uint32_t l, colibri_cache_need *need) {
    memset(need, 0, sizeof *need);
    need->kv_positions = m->max_seq_len;
    need->scratch_floats = gate_floats(m, l);
}

/* A ring of W rows; a window that covers the context is a full cache (and computes as one). */
void colibri_sliding_cache(const struct colibri_model *m, uint32_t l, colibri_cache_need *need) {
    uint32_t w = m->layers[l].desc.window;
    memset(need, 0, sizeof *need);
    need->kv_positions = w < m->max_seq_len ? w : m->max_seq_len;
    need->kv_staged = w < m->max_seq_len;
    need->scratch_floats = gate_floats(m, l);
}

/* ---- the forward step ----------------------------------------------------------------------- */

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

/* PARTIAL_ROPE: rotate-half on the first r lanes of each head (pair i with i + r/2), angle
 * p * inv[i] in double as the full-width tables (forward.c); lanes r.. pass through. */
static void rope_partial(float *v, int heads, int dh, int r, const double *inv, int32_t p) {
    int half = r / 2;
    for (int i = 0; i < half; i++) {
        double a = (double)p * inv[i];
        float c = (float)cos(a), s = (float)sin(a);
        for (int hh = 0; hh < heads; hh++) {
            float *x = v + (size_t)hh * dh;
            float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * c - x2 * s;
            x[i + half] = x2 * c + x1 * s;
        }
    }
}

static void qk_norm(float *v, int heads, int dh, const colibri_tensor *w, int per_head, float eps) {
    const float *g = w->data;
    if (per_head)
        for (int hh = 0; hh < heads; hh++)
            colibri_rmsnorm(v + (size_t)hh * dh, v + (size_t)hh * dh, g, (size_t)dh, (size_t)dh, eps);
    else
        colibri_rmsnorm(v, v, g, (size_t)heads * dh, (size_t)heads * dh, eps);
}

typedef struct {
    colibri_ctx *ctx;
    const colibri_batch *bt;
    int layer;
    uint32_t window; /* 0: every position */
} att_job;

/* Where a query of this pass reads the K or V row of position s: a shared snapshot's row for
 * its first positions (colibri_seq_share: a full cache, never staged); the stage holds this
 * pass's rows (positions p0..) when the layer is staged; otherwise, and for earlier positions,
 * the cache's row `slot` (= s % R, walked by the caller as a slot that wraps). */
typedef struct {
    const uint8_t *cache, *stage, *shared;
    int staged, p0, n_shared;
    size_t row; /* bytes of a row */
} kv_rows;

static inline const void *kv_row(const kv_rows *r, int s, int slot) {
    if (s < r->n_shared) return r->shared + (size_t)s * r->row;
    return r->staged && s >= r->p0 ? r->stage + (size_t)(s - r->p0) * r->row
                                   : r->cache + (size_t)slot * r->row;
}

static inline int wrap(int slot, int R) { return slot == R ? 0 : slot; }

#define ATT_BLOCK 64 /* keys per block: their K or V row pointers, gathered on the stack */

/* kinds.h: the score rows of max_seq_len floats a thread's unit needs */
size_t colibri_attention_score_rows(const struct colibri_model *m) {
    size_t group = m->n_kv_heads ? m->n_heads / m->n_kv_heads : 1;
    return group < 1 ? 1 : group < COLIBRI_ATT_HEADS ? group : COLIBRI_ATT_HEADS;
}

/* Query heads of one KV group per work unit: at most COLIBRI_ATT_HEADS (kinds.h; the arena
 * keeps that many score rows per thread), fewer when the pass has too few (token, group) units
 * to give every thread two, so that a one-token decode on 8 cores still spreads its heads. A
 * head's arithmetic does not depend on which heads share its unit, so any split has the same
 * bits. */
static int unit_heads(int tokens, int kv_heads, int group, int nt) {
    int chunks = (group + COLIBRI_ATT_HEADS - 1) / COLIBRI_ATT_HEADS;
    while (chunks < group && (long)tokens * kv_heads * chunks < 2L * nt) chunks++;
    return (group + chunks - 1) / chunks;
}

/* softmax(scale * sc[0..keys-1]) in place, with an attention sink's logit (NULL: none) in the
 * max and the sum. The max is order-free (NaN skipped as fmaxf does; only the sign of a zero
 * maximum can differ, and x - (+0) == x - (-0) for the exp below), so it runs in eight lanes;
 * the exps and their sum: colibri_exp_sum (kernels.h), vectorised, in a fixed order. */
static void softmax_scaled(float *sc, int keys, float scale, const float *sink) {
    float m8[8] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY,
                   -INFINITY, -INFINITY, -INFINITY, -INFINITY};
    int i = 0;
    for (; i + 8 <= keys; i += 8)
        for (int l = 0; l < 8; l++) {
            float v = sc[i + l] * scale;
            sc[i + l] = v;
            m8[l] = v > m8[l] ? v : m8[l];
        }
    float mx = -INFINITY;
    for (int l = 0; l < 8; l++) mx = m8[l] > mx ? m8[l] : mx;
    for (; i < keys; i++) {
        sc[i] *= scale;
        mx = sc[i] > mx ? sc[i] : mx;
    }
    if (sink) mx = *sink > mx ? *sink : mx;
    float sum = colibri_exp_sum(sc, (size_t)keys, mx);
    if (sink) {
        float e = *sink;
        sum += colibri_exp_sum(&e, 1, mx);
    }
    float inv = 1.0f / sum;
    for (i = 0; i < keys; i++) sc[i] *= inv;
}

static void att_task(void *arg, int t, int nt) {
    att_job *job = arg;
    colibri_ctx *ctx = job->ctx;
    const struct colibri_model *m = ctx->model;
    colibri_buffers *b = &ctx->b;
    const colibri_batch *bt = job->bt;
    size_t dh = m->head_dim, H = m->n_heads, Hkv = m->n_kv_heads, qd = H * dh, kvd = Hkv * dh;
    int group = (int)(H / Hkv);
    size_t row = kvd * (b->kv_f16 ? sizeof(uint16_t) : sizeof(float));
    size_t S = m->max_seq_len;
    float *sc = b->scores + (size_t)t * colibri_attention_score_rows(m) * S;
    float scale = 1.0f / sqrtf((float)dh);
    size_t esz = b->kv_f16 ? sizeof(uint16_t) : sizeof(float);
    /* attention sinks (gpt-oss): head h's learned logit joins the softmax's max and sum, and
     * gets no value row (transformers' eager_attention_forward drops its column) */
    const float *sinks = m->layers[job->layer].attn_sinks.data;
    const int hc = unit_heads(bt->n, (int)Hkv, group, nt), chunks = (group + hc - 1) / hc;
    unsigned long lo, hi;
    colibri_split((unsigned long)bt->n * Hkv * (unsigned long)chunks, t, nt, &lo, &hi);
    for (unsigned long unit = lo; unit < hi; unit++) {
        size_t j = unit / (Hkv * (size_t)chunks), g = unit / (size_t)chunks % Hkv;
        int c = (int)(unit % (size_t)chunks), nh = group - c * hc < hc ? group - c * hc : hc;
        size_t h0 = g * (size_t)group + (size_t)c * (size_t)hc;
        /* the row's own sequence: its cache, and its rows of this pass (positions p0..) in the
         * stage from its first row on */
        const colibri_batch_seq *sq = &bt->seqs[bt->seq[j]];
        const colibri_layer_cache *lc = &sq->cache[job->layer];
        const int R = (int)lc->kv_positions, p0 = bt->pos[sq->row0];
        const size_t st = (size_t)sq->row0 * row;
        const int ns = (int)lc->shared_positions;
        const kv_rows ks = {lc->k, (const uint8_t *)b->kstage + st, lc->shared_k, lc->kv_staged, p0, ns, row};
        const kv_rows vs = {lc->v, (const uint8_t *)b->vstage + st, lc->shared_v, lc->kv_staged, p0, ns, row};
        int p = bt->pos[j]; /* causal: positions first..p */
        int first = job->window && (int64_t)p - job->window + 1 > 0 ? p - (int)job->window + 1 : 0;
        int keys = p - first + 1, slot0 = first % R;
        const float *q = b->q + j * qd + h0 * dh;
        /* Blocks of keys (kernels.h colibri_att_scores / colibri_wsum_rows), each block's rows
         * read by the unit's nh heads while they are in L1: each score is the one-key dot, bit
         * for bit, and each output the same multiply-then-add sequence over the keys in order,
         * so only the loads are shared (prefill == decode). */
        const void *rp[ATT_BLOCK];
        const size_t off = g * dh * esz;
        for (int i0 = 0, s = first, slot = slot0; i0 < keys; i0 += ATT_BLOCK) {
            int nb = keys - i0 < ATT_BLOCK ? keys - i0 : ATT_BLOCK;
            for (int i = 0; i < nb; i++, s++, slot = wrap(slot + 1, R))
                rp[i] = (const uint8_t *)kv_row(&ks, s, slot) + off;
            colibri_att_scores(q, dh, nh, rp, nb, dh, b->kv_f16, sc + i0, S);
        }
        for (int h = 0; h < nh; h++)
            softmax_scaled(sc + (size_t)h * S, keys, scale, sinks ? &sinks[h0 + (size_t)h] : NULL);
        float *out = b->att + j * qd + h0 * dh;
        memset(out, 0, (size_t)nh * dh * sizeof(float));
        for (int i0 = 0, s = first, slot = slot0; i0 < keys; i0 += ATT_BLOCK) {
            int nb = keys - i0 < ATT_BLOCK ? keys - i0 : ATT_BLOCK;
            for (int i = 0; i < nb; i++, s++, slot = wrap(slot + 1, R))
                rp[i] = (const uint8_t *)kv_row(&vs, s, slot) + off;
            for (int h = 0; h < nh; h++)
                colibri_wsum_rows(out + (size_t)h * dh, sc + (size_t)h * S + i0, rp, nb, dh,
                                  b->kv_f16);
        }
    }
}

void colibri_attention_forward(colibri_ctx *ctx, int l, const colibri_batch *bt) {
    const struct colibri_model *m = ctx->model;
    const colibri_layer *ly = &m->layers[l];
    colibri_buffers *b = &ctx->b;
    int n = bt->n;
    size_t dp = m->embed_dim_pad, dh = m->head_dim, H = m->n_heads, Hkv = m->n_kv_heads;
    size_t qd = H * dh, kvd = Hkv * dh, row = kvd * (b->kv_f16 ? sizeof(uint16_t) : sizeof(float));

    for (int j = 0; j < n; j++)
        colibri_rmsnorm(b->h + j * dp, b->x + j * dp, ly->attn_norm.data, m->embed_dim, dp,
                        m->norm_eps);
    colibri_stage_mark(ctx, COLIBRI_STAGE_NORMS);

    colibri_mm_job job;
    colibri_mm_init(&job, ctx);
    colibri_mm_add(&job, &ly->wq, b->h, dp, n, b->q, qd, 0);
    colibri_mm_add(&job, &ly->wk, b->h, dp, n, b->k, kvd, 0);
    colibri_mm_add(&job, &ly->wv, b->h, dp, n, b->v, kvd, 0);
    const int gated = (ly->desc.mixer_flags & COLIBRI_MIXER_FLAG_OUTPUT_GATE) != 0;
    if (gated) colibri_mm_add(&job, &ly->attn_gate, b->h, dp, n, b->mix, qd, 0); /* Qwen */
    colibri_mm_run(&job);
    /* Qwen's partial RoPE: the frequencies of the rotary width, once per pass */
    const int rw = (int)rotary_width(m, &ly->desc);
    double inv[LIM_ROPE_PAIRS];
    for (int i = 0; rw < (int)dh && i < rw / 2; i++) inv[i] = pow((double)m->rope_theta, -2.0 * i / rw);

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
        if (rw < (int)dh) {
            rope_partial(q, (int)H, (int)dh, rw, inv, bt->pos[j]);
            rope_partial(k, (int)Hkv, (int)dh, rw, inv, bt->pos[j]);
        } else {
            const float *cs = b->rope + j * dh;
            rope_apply(q, (int)H, (int)dh, cs);
            rope_apply(k, (int)Hkv, (int)dh, cs);
        }
        /* The cache holds what attention reads, for this token too, so prefill and decode
         * see the same (rounded) keys and values: its row, or its row of the stage. */
        const colibri_layer_cache *c = colibri_batch_cache(bt, j, l);
        size_t at = c->kv_staged ? (size_t)j : (size_t)bt->pos[j] % c->kv_positions;
        uint8_t *kd = (uint8_t *)(c->kv_staged ? b->kstage : c->k) + at * row;
        uint8_t *vd = (uint8_t *)(c->kv_staged ? b->vstage : c->v) + at * row;
        if (b->kv_f16) {
            colibri_f32_to_f16(k, kvd, (uint16_t *)(void *)kd);
            colibri_f32_to_f16(v, kvd, (uint16_t *)(void *)vd);
        } else {
            memcpy(kd, k, row);
            memcpy(vd, v, row);
        }
    }

    att_job aj = {ctx, bt, l, ly->desc.mixer == COLIBRI_MIXER_SLIDING_ATTENTION ? ly->desc.window : 0};
    colibri_pool_run(&ctx->pool, att_task, &aj);
    /* A staged ring takes the pass's rows now, in order (with more rows than the ring, the last
     * R remain: all that later positions can still see). */
    for (int j = 0; j < n; j++) {
        const colibri_layer_cache *c = colibri_batch_cache(bt, j, l);
        if (!c->kv_staged) continue;
        size_t slot = (size_t)bt->pos[j] % c->kv_positions;
        memcpy((uint8_t *)c->k + slot * row, (const uint8_t *)b->kstage + (size_t)j * row, row);
        memcpy((uint8_t *)c->v + slot * row, (const uint8_t *)b->vstage + (size_t)j * row, row);
    }

    /* Qwen's output gate: attention output times sigmoid(gate), per value, before WO */
    for (size_t i = 0; gated && i < (size_t)n * qd; i++)
        b->att[i] *= 1.0f / (1.0f + expf(-b->mix[i]));

    colibri_mm_job out;
    colibri_mm_init(&out, ctx);
    colibri_mm_add(&out, &ly->wo, b->att, qd, n, b->tmp, dp, 0);
    colibri_mm_run(&out);
    if (ly->bo.data) { /* o_proj's bias (gpt-oss): x += (WO a + bo) */
        const float *bo = ly->bo.data;
        for (int j = 0; j < n; j++)
            for (size_t d = 0; d < dp; d++) b->x[j * dp + d] += b->tmp[j * dp + d] + bo[d];
    } else {
        for (size_t i = 0; i < (size_t)n * dp; i++) b->x[i] += b->tmp[i];
    }
}
