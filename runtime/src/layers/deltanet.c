/* Gated DeltaNet layers: the linear-attention mixer of Qwen3.5 / Qwen3.6 and Qwen3-Next, as
 * transformers' Qwen3_5MoeGatedDeltaNet and Qwen3NextGatedDeltaNet compute it (their torch
 * paths: causal_conv1d_update, l2norm, torch_recurrent_gated_delta_rule, RMSNormGated). Per token:
 *
 *   h = rmsnorm(x, ATTN_NORM)
 *   [q | k | v] = DN_QKV h    (Hk*Dk, Hk*Dk, Hv*Dv values: the C "conv channels")
 *   z = DN_Z h, b = DN_B h, a = DN_A h    (Hv*Dv, Hv, Hv values)
 *   [q | k | v] = silu(depthwise causal convolution over the last W positions, taps DN_CONV)
 *   q, k = l2norm per key head (x / sqrt(sum x^2 + 1e-6)); q *= 1 / sqrt(Dk)
 *   beta = sigmoid(b), decay = exp(-exp(DN_A_LOG) * softplus(a + DN_DT_BIAS))  per value head
 *   per value head (key head hv / (Hv / Hk)), state S [Dk, Dv]:
 *       S *= decay;  d = (v - S^T k) * beta;  S += k d^T;  o = S^T q
 *   o = DN_NORM * rmsnorm(o) * silu(z)  per value head (eps = norm_eps)
 *   x += DN_OUT o
 *
 * The record (kinds.h): window = W (the convolution's width), mixer_params = {Hk, Hv, Dk, Dv}.
 * The layer's state per sequence (kinds.h state_floats; zeroed at init and by colibri_reset):
 * the convolution's last W-1 inputs ([W-1, C], oldest first), then Hv recurrent states of
 * [Dk, Dv] floats. Nothing else of a sequence is kept: the cache does not grow with the context.
 *
 * Determinism contract (docs/runtime.md, "Recurrent state"): a prompt runs the same recurrence
 * as decode, token after token, with the same operations in the same order, so prefill == decode
 * bit for bit (transformers uses the chunked form for prompts, which differs in the last bits).
 * Work is split over the pool in fixed partitions (convolution channels, value heads), each value
 * computed start to finish by one thread, so any thread count gives the same bits.
 *
 * Continuous batching (kinds.h multi_seq 1): a pass may carry the rows of several sequences. The
 * projections read each weight once for every row of the pass (their rows are independent); the
 * convolution and the recurrence walk bt->seqs, each sequence's rows through its own state, so
 * a row's bits are those it has alone. */
#include <math.h>
#include <string.h>

#include "core/context.h"
#include "core/le.h"
#include "cpu/kernels.h"
#include "deltanet.h"
#include "kinds.h"
#include "linear.h"

#define LIM_CONV 64u        /* convolution width (Qwen: 4) */
#define LIM_HEAD_DIM 1024u  /* Dk, Dv (Qwen: 128) */
#define LIM_HEADS 1024u
#define LIM_WIDTH 262144u   /* Hk*Dk, Hv*Dv (as n_heads * head_dim in model.c) */
#define L2_EPS 1e-6         /* transformers' l2norm(eps=1e-6) of q and k */

/* One layer's geometry, from its record. */
typedef struct {
    size_t hk, hv, dk, dv, w; /* key heads, value heads, their dims, convolution width */
    size_t kd, vd, c;         /* Hk*Dk, Hv*Dv, conv channels 2*kd + vd */
} dn_geo;

static dn_geo geo(const struct colibri_model *m, uint32_t l) {
    const colibri_layer_desc *d = &m->layers[l].desc;
    dn_geo g = {d->mixer_params[0], d->mixer_params[1], d->mixer_params[2], d->mixer_params[3],
                d->window, 0, 0, 0};
    g.kd = g.hk * g.dk;
    g.vd = g.hv * g.dv;
    g.c = 2 * g.kd + g.vd;
    return g;
}

/* ---- the format side ------------------------------------------------------------------------ */

colibri_status colibri_deltanet_validate(const struct colibri_model *m, uint32_t l, char *why,
                                         size_t len) {
    const colibri_layer_desc *d = &m->layers[l].desc;
    const uint32_t *p = d->mixer_params;
    static const char *names[4] = {"key heads", "value heads", "key head dim", "value head dim"};
    static const uint32_t lim[4] = {LIM_HEADS, LIM_HEADS, LIM_HEAD_DIM, LIM_HEAD_DIM};
    if (d->window < 1 || d->window > LIM_CONV)
        return fail(why, len, COLIBRI_E_BAD_LAYER,
                    "layer %u (gated_deltanet): window = %u, the convolution width must be in 1..%u",
                    l, d->window, LIM_CONV);
    if (d->mixer_flags)
        return fail(why, len, COLIBRI_E_UNSUPPORTED,
                    "layer %u (gated_deltanet): mixer_flags = 0x%x, none are defined in this "
                    "runtime (a newer format feature: update the runtime)", l, d->mixer_flags);
    for (int i = 0; i < 4; i++)
        if (p[i] < 1 || p[i] > lim[i])
            return fail(why, len, COLIBRI_E_BAD_LAYER,
                        "layer %u (gated_deltanet): mixer_params[%d] (%s) = %u, must be in 1..%u",
                        l, i, names[i], p[i], lim[i]);
    if (p[1] % p[0])
        return fail(why, len, COLIBRI_E_BAD_LAYER,
                    "layer %u (gated_deltanet): %u value heads are not a multiple of %u key heads",
                    l, p[1], p[0]);
    if ((uint64_t)p[0] * p[2] > LIM_WIDTH || (uint64_t)p[1] * p[3] > LIM_WIDTH)
        return fail(why, len, COLIBRI_E_BAD_LAYER,
                    "layer %u (gated_deltanet): key width %llu or value width %llu exceeds %u", l,
                    (unsigned long long)p[0] * p[2], (unsigned long long)p[1] * p[3], LIM_WIDTH);
    return COLIBRI_OK;
}

int colibri_deltanet_tensor(const struct colibri_model *m, uint32_t l, uint32_t tk,
                            uint32_t *rows, uint32_t *cols) {
    dn_geo g = geo(m, l);
    uint32_t dp = m->embed_dim_pad;
    switch (tk) {
    case COLIBRI_K_ATTN_NORM: *rows = 1; *cols = dp; return 1;
    case COLIBRI_K_DN_QKV: *rows = (uint32_t)g.c; *cols = dp; return 1;
    case COLIBRI_K_DN_Z: *rows = (uint32_t)g.vd; *cols = dp; return 1;
    case COLIBRI_K_DN_B: case COLIBRI_K_DN_A: *rows = (uint32_t)g.hv; *cols = dp; return 1;
    case COLIBRI_K_DN_CONV: *rows = (uint32_t)g.c; *cols = (uint32_t)g.w; return 1;
    case COLIBRI_K_DN_A_LOG: case COLIBRI_K_DN_DT_BIAS: *rows = 1; *cols = (uint32_t)g.hv; return 1;
    case COLIBRI_K_DN_NORM: *rows = 1; *cols = (uint32_t)g.dv; return 1;
    case COLIBRI_K_DN_OUT: *rows = dp; *cols = (uint32_t)g.vd; return 1;
    default: return 0;
    }
}

/* Per sequence: the convolution's W-1 inputs per channel and Hv states of Dk x Dv. Per token of a
 * pass (the arena's mixer scratch): the projections [C], the convolution's output [C], z [Vd],
 * b and a [Hv each], the output o [Vd]. The output projection reads Vd-wide rows. */
void colibri_deltanet_cache(const struct colibri_model *m, uint32_t l, colibri_cache_need *need) {
    dn_geo g = geo(m, l);
    memset(need, 0, sizeof *need);
    need->state_floats = (g.w - 1) * g.c + g.hv * g.dk * g.dv;
    need->scratch_floats = 2 * g.c + 2 * g.vd + 2 * g.hv;
    need->in_cols = g.vd;
}

/* ---- the forward step ----------------------------------------------------------------------- */

/* A pass's views into the mixer scratch (rows of `chunk` tokens each) and the layer's state. */
typedef struct {
    colibri_ctx *ctx;
    const colibri_layer *ly;
    dn_geo g;
    const colibri_batch *bt;          /* the pass's sequences: each row's state is its own */
    int n;
    float *qkv, *u, *z, *bb, *aa, *o; /* [T, C], [T, C], [T, Vd], [T, Hv] x2, [T, Vd] */
    int l;                            /* the layer: bt->seqs[s].cache[l].state is sequence s's */
} dn_pass;

/* Sequence s's convolution state [W-1, C], then its Hv recurrent states [Hv, Dk, Dv]. */
static float *conv_state(const dn_pass *p, int s) { return p->bt->seqs[s].cache[p->l].state; }
static float *rec_state(const dn_pass *p, int s) {
    return conv_state(p, s) + (p->g.w - 1) * p->g.c;
}

static float silu(float v) { return v / (1.0f + expf(-v)); }

/* The convolution on channels [lo, hi) of one sequence's rows r0..r0+n-1: u[j, c] =
 * silu(sum_i w[c, i] * in(j - (W-1) + i, c)), where inputs before the pass come from the
 * sequence's state; then the state keeps its last W-1 inputs. Each output sums its W taps in
 * order i = 0..W-1, whatever the chunking and whichever other sequences share the pass. */
static void conv_seq(const dn_pass *p, float *st, int r0, int n, unsigned long lo, unsigned long hi) {
    const size_t C = p->g.c, W = p->g.w;
    const float *w = p->ly->dn_conv.data;
    const float *qkv = p->qkv + (size_t)r0 * C;
    for (int j = 0; j < n; j++) {
        float *out = p->u + (size_t)(r0 + j) * C;
        for (size_t c = lo; c < hi; c++) out[c] = 0.0f;
        for (size_t i = 0; i < W; i++) {
            long s = (long)j - (long)(W - 1) + (long)i; /* the input's row in this sequence's rows */
            const float *in = s >= 0 ? qkv + (size_t)s * C : st + (size_t)(s + (long)(W - 1)) * C;
            for (size_t c = lo; c < hi; c++) out[c] += w[c * W + i] * in[c];
        }
        for (size_t c = lo; c < hi; c++) out[c] = silu(out[c]);
    }
    /* state row i <- the input W-1-i positions before the next token (rows shift up by n) */
    for (size_t i = 0; i + 1 < W; i++) {
        long s = (long)n - (long)(W - 1) + (long)i;
        const float *in = s >= 0 ? qkv + (size_t)s * C : st + (i + (size_t)n) * C;
        memcpy(st + i * C + lo, in + lo, (hi - lo) * sizeof(float));
    }
}

/* Channels split over the pool, the same split for every sequence of the pass. */
static void conv_task(void *arg, int t, int nt) {
    dn_pass *p = arg;
    unsigned long lo, hi;
    colibri_split(p->g.c, t, nt, &lo, &hi);
    for (int s = 0; s < p->bt->n_seqs; s++)
        conv_seq(p, conv_state(p, s), p->bt->seqs[s].row0, p->bt->seqs[s].n, lo, hi);
}

/* x / sqrt(sum x^2 + eps) (sum in double, in index order), then times `scale`. */
static void l2norm(float *x, size_t n, float scale) {
    double ss = 0.0;
    for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(ss + L2_EPS));
    for (size_t i = 0; i < n; i++) x[i] = x[i] * inv * scale;
}

/* torch.nn.functional.softplus (beta 1, threshold 20) */
static float softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

/* Per token of the pass, on the calling thread: q and k normalised per key head, beta and the
 * decay per value head (written over b and a). */
static void prepare(dn_pass *p) {
    const dn_geo *g = &p->g;
    const float *a_log = p->ly->dn_a_log.data, *dt = p->ly->dn_dt_bias.data;
    const float scale = (float)(1.0 / sqrt((double)g->dk));
    for (int j = 0; j < p->n; j++) {
        float *u = p->u + (size_t)j * g->c;
        for (size_t h = 0; h < g->hk; h++) {
            l2norm(u + h * g->dk, g->dk, scale);           /* q */
            l2norm(u + g->kd + h * g->dk, g->dk, 1.0f);     /* k */
        }
        float *b = p->bb + (size_t)j * g->hv, *a = p->aa + (size_t)j * g->hv;
        for (size_t h = 0; h < g->hv; h++) {
            b[h] = 1.0f / (1.0f + expf(-b[h]));
            a[h] = expf(-expf(a_log[h]) * softplus(a[h] + dt[h]));
        }
    }
}

/* Four lanes at a time: deltanet.h's colibri_v4f. */
#define DV_MAX LIM_HEAD_DIM

/* deltanet.h: one token through one value head's state. Each lane's sums run over the key index
 * in order 0..Dk-1. */
void colibri_delta_step(float *restrict S, size_t dk, size_t dv, const float *restrict q,
                        const float *restrict k, const float *restrict v, float beta, float decay,
                        float *restrict o) {
    colibri_v4f mem[DV_MAX / 4], acc[DV_MAX / 4];
    float mem_t[4], acc_t[4], d[DV_MAX];
    const size_t v4 = dv / 4 * 4;
    const colibri_v4f zero = {0, 0, 0, 0};
    for (size_t i = 0; i < v4 / 4; i++) mem[i] = acc[i] = zero;
    for (size_t i = v4; i < dv; i++) mem_t[i - v4] = acc_t[i - v4] = 0.0f;
    for (size_t r = 0; r < dk; r++) {
        float *row = S + r * dv;
        const float kr = k[r];
        for (size_t i = 0; i < v4; i += 4) {
            colibri_v4f s = colibri_ld4(row + i) * decay;
            colibri_st4(row + i, s);
            mem[i / 4] += s * kr;
        }
        for (size_t i = v4; i < dv; i++) {
            row[i] *= decay;
            mem_t[i - v4] += row[i] * kr;
        }
    }
    for (size_t i = 0; i < v4; i += 4) colibri_st4(d + i, (colibri_ld4(v + i) - mem[i / 4]) * beta);
    for (size_t i = v4; i < dv; i++) d[i] = (v[i] - mem_t[i - v4]) * beta;
    for (size_t r = 0; r < dk; r++) {
        float *row = S + r * dv;
        const float kr = k[r], qr = q[r];
        for (size_t i = 0; i < v4; i += 4) {
            colibri_v4f s = colibri_ld4(row + i) + kr * colibri_ld4(d + i);
            colibri_st4(row + i, s);
            acc[i / 4] += s * qr;
        }
        for (size_t i = v4; i < dv; i++) {
            row[i] += kr * d[i];
            acc_t[i - v4] += row[i] * qr;
        }
    }
    for (size_t i = 0; i < v4; i += 4) colibri_st4(o + i, acc[i / 4]);
    for (size_t i = v4; i < dv; i++) o[i] = acc_t[i - v4];
}

/* Value heads [lo, hi): for each sequence of the pass, its tokens in order through the head's
 * state in that sequence (the state stays in this thread's cache for the sequence's rows), then
 * the gated norm of each output. A row's bits depend only on its sequence's state and rows. */
static void recur_task(void *arg, int t, int nt) {
    dn_pass *p = arg;
    const dn_geo *g = &p->g;
    const struct colibri_model *m = p->ctx->model;
    const float *nw = p->ly->dn_norm.data;
    const size_t per_key = g->hv / g->hk;
    unsigned long lo, hi;
    colibri_split(g->hv, t, nt, &lo, &hi);
    for (int s = 0; s < p->bt->n_seqs; s++) {
        const int r0 = p->bt->seqs[s].row0, r1 = r0 + p->bt->seqs[s].n;
        for (size_t h = lo; h < hi; h++) {
            float *S = rec_state(p, s) + h * g->dk * g->dv;
            size_t kh = h / per_key;
            for (int j = r0; j < r1; j++) {
                const float *u = p->u + (size_t)j * g->c;
                float *o = p->o + (size_t)j * g->vd + h * g->dv;
                const float *z = p->z + (size_t)j * g->vd + h * g->dv;
                colibri_delta_step(S, g->dk, g->dv, u + kh * g->dk, u + g->kd + kh * g->dk,
                                   u + 2 * g->kd + h * g->dv, p->bb[(size_t)j * g->hv + h],
                                   p->aa[(size_t)j * g->hv + h], o);
                colibri_rmsnorm(o, o, nw, g->dv, g->dv, m->norm_eps);
                for (size_t i = 0; i < g->dv; i++) o[i] *= silu(z[i]);
            }
        }
    }
}

void colibri_deltanet_forward(colibri_ctx *ctx, int l, const colibri_batch *bt) {
    const struct colibri_model *m = ctx->model;
    const colibri_layer *ly = &m->layers[l];
    colibri_buffers *b = &ctx->b;
    const int n = bt->n;
    const size_t dp = m->embed_dim_pad, T = (size_t)b->chunk;
    dn_pass p = {.ctx = ctx, .ly = ly, .g = geo(m, (uint32_t)l), .bt = bt, .n = n, .l = l};
    const dn_geo *g = &p.g;
    p.qkv = b->mix;
    p.u = p.qkv + T * g->c;
    p.z = p.u + T * g->c;
    p.bb = p.z + T * g->vd;
    p.aa = p.bb + T * g->hv;
    p.o = p.aa + T * g->hv;

    for (int j = 0; j < n; j++)
        colibri_rmsnorm(b->h + j * dp, b->x + j * dp, ly->attn_norm.data, m->embed_dim, dp,
                        m->norm_eps);
    colibri_mm_job in;
    colibri_mm_init(&in, ctx);
    colibri_mm_add(&in, &ly->dn_qkv, b->h, dp, n, p.qkv, g->c, 0);
    colibri_mm_add(&in, &ly->dn_z, b->h, dp, n, p.z, g->vd, 0);
    colibri_mm_add(&in, &ly->dn_b, b->h, dp, n, p.bb, g->hv, 0);
    colibri_mm_add(&in, &ly->dn_a, b->h, dp, n, p.aa, g->hv, 0);
    colibri_mm_run(&in);

    colibri_pool_run(&ctx->pool, conv_task, &p);
    prepare(&p);
    colibri_pool_run(&ctx->pool, recur_task, &p);

    colibri_mm_job out;
    colibri_mm_init(&out, ctx);
    colibri_mm_add(&out, &ly->dn_out, p.o, g->vd, n, b->tmp, dp, 0);
    colibri_mm_run(&out);
    for (size_t i = 0; i < (size_t)n * dp; i++) b->x[i] += b->tmp[i];
}
