/* The routed experts of a pass, expert-major (moe_experts.h).
 *
 * Dispatch grouped the pass's n x top_k (token, choice) slots contiguously per expert, experts
 * ascending. Compute walks that order in passes of whole experts whose slots fit the arena's
 * budget (b->slots, at least a chunk: an expert holds at most n slots, since a token chooses it
 * at most once): each pass copies its slots' token rows into xs, runs the gate and up
 * projections of its experts as one parallel job, SwiGLU, then the down projections into ys. So
 * every active expert's weights are read once per chunk, for all the tokens that chose it (with
 * 512-token chunks and 128 experts top-8, ~32 tokens per expert rather than ~4 per 64-token
 * chunk), and the arena holds one pass's inputs and activations, not the whole chunk's.
 *
 * Bits: each output value y[slot, r] is one weight row's dot with one input row, and the kernels
 * give it the same bits whatever the other rows of its call (prefill == decode rests on that);
 * which pass or call a slot falls into only regroups rows, so the logits are those of the
 * one-job form, for any chunk, budget and thread count. */
#include <math.h>
#include <string.h>

#include "cpu/kernels.h"
#include "kinds.h"
#include "linear.h"
#include "moe_experts.h"

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

void colibri_add_bias(float *y, size_t ld, int count, const float *bias, size_t width) {
    for (int r = 0; r < count; r++)
        for (size_t i = 0; i < width; i++) y[(size_t)r * ld + i] += bias[i];
}

/* The shared expert's gate and up projections over the pass's n tokens, into a job. */
static void shared_up(colibri_mm_job *job, const colibri_layer *ly, colibri_buffers *b, size_t dp,
                      int n, size_t Fs, size_t qrest) {
    colibri_mm_add(job, &ly->shared_w1, b->h, dp, n, b->sgate, Fs, qrest);
    colibri_mm_add(job, &ly->shared_w3, b->h, dp, n, b->sup, Fs, qrest);
}

/* The activation gate[i] = act(gate[i], up[i]) over n values, elementwise: split over the pool
 * when there are enough of them (a 64-token pass of Mixtral's shape has 360k, ~1 ms of expf on one
 * thread while the others wait), inline below that (a barrier costs more than the work). Each
 * value is the same scalar expression wherever it runs, so the bits do not depend on the split. */
typedef struct {
    float *gate;
    const float *up;
    size_t n;
    int clamped;
    float alpha, limit;
} act_job;

#define ACT_POOL_MIN 16384

static void act_range(const act_job *a, size_t lo, size_t hi) {
    if (a->clamped) {
        clamped_swiglu(a->gate + lo, a->up + lo, hi - lo, a->alpha, a->limit);
        return;
    }
    for (size_t i = lo; i < hi; i++) a->gate[i] = silu(a->gate[i]) * a->up[i];
}

static void act_task(void *arg, int t, int nt) {
    const act_job *a = arg;
    unsigned long lo, hi;
    colibri_split(a->n, t, nt, &lo, &hi);
    act_range(a, lo, hi);
}

static void run_act(colibri_ctx *ctx, act_job *a) {
    if (a->n >= ACT_POOL_MIN) colibri_pool_run(&ctx->pool, act_task, a);
    else act_range(a, 0, a->n);
}

static void shared_act(colibri_ctx *ctx, int n, size_t Fs) {
    act_job a = {ctx->b.sgate, ctx->b.sup, (size_t)n * Fs, 0, 0.0f, 0.0f};
    run_act(ctx, &a);
}

/* Experts [e0, e1): their slots [offsets[e0], offsets[e1]) (at most b->slots of them), and the
 * shared expert over the pass's n tokens when `shared`. */
static void expert_pass(colibri_ctx *ctx, const colibri_layer *ly, size_t e0, size_t e1,
                        int shared, int n) {
    const struct colibri_model *m = ctx->model;
    colibri_buffers *b = &ctx->b;
    size_t dp = m->embed_dim_pad, F = m->expert_size, Fs = shared ? m->shared_expert_size : 0;
    size_t s0 = (size_t)b->offsets[e0], ns = (size_t)b->offsets[e1] - s0;
    size_t qrest = (size_t)b->slots; /* int8 rows past the pass's slots (the shared expert) */
    /* with stage timing on, the shared expert runs after the routed ones in jobs of its own
     * (its time told apart); its rows and the routed rows are the same either way */
    int split = Fs && ctx->stage_on;

    for (size_t s = 0; s < ns; s++)
        memcpy(b->xs + s * dp, b->h + (size_t)b->slot_tok[s0 + s] * dp, dp * sizeof(float));

    colibri_mm_job up;
    colibri_mm_init(&up, ctx);
    for (size_t e = e0; e < e1; e++) {
        int c = b->counts[e];
        if (!c) continue;
        size_t off = (size_t)b->offsets[e] - s0; /* the expert's first row in this pass */
        colibri_mm_add(&up, &ly->w1[e], b->xs + off * dp, dp, c, b->gate + off * F, F, off);
        colibri_mm_add(&up, &ly->w3[e], b->xs + off * dp, dp, c, b->up + off * F, F, off);
    }
    if (Fs && !split) shared_up(&up, ly, b, dp, n, Fs, qrest);
    colibri_mm_run(&up);

    const uint32_t fp = ly->desc.ffn_params[0];
    for (size_t e = e0; ly->b1[0].data && e < e1; e++) { /* expert biases (gpt-oss) */
        size_t off = (size_t)b->offsets[e] - s0;
        colibri_add_bias(b->gate + off * F, F, b->counts[e], ly->b1[e].data, F);
        colibri_add_bias(b->up + off * F, F, b->counts[e], ly->b3[e].data, F);
    }
    act_job act = {b->gate, b->up, ns * F, (fp & COLIBRI_MOE_CLAMPED_SWIGLU) != 0, 0.0f, 0.0f};
    if (act.clamped) {
        act.alpha = colibri_f32_of(ly->desc.ffn_params[1]);
        act.limit = colibri_f32_of(ly->desc.ffn_params[2]);
    }
    run_act(ctx, &act);
    if (!split) shared_act(ctx, n, Fs);

    colibri_mm_job down;
    colibri_mm_init(&down, ctx);
    for (size_t e = e0; e < e1; e++) {
        int c = b->counts[e];
        if (!c) continue;
        size_t off = (size_t)b->offsets[e] - s0;
        colibri_mm_add(&down, &ly->w2[e], b->gate + off * F, F, c, b->ys + (s0 + off) * dp, dp,
                       off);
    }
    if (Fs && !split) colibri_mm_add(&down, &ly->shared_w2, b->sgate, Fs, n, b->sout, dp, qrest);
    colibri_mm_run(&down);
    for (size_t e = e0; ly->b2[0].data && e < e1; e++)
        colibri_add_bias(b->ys + (size_t)b->offsets[e] * dp, dp, b->counts[e], ly->b2[e].data, dp);
    colibri_stage_mark(ctx, COLIBRI_STAGE_EXPERTS); /* with the shared expert when not split */
    if (!split) return;
    colibri_mm_job sup, sdown;
    colibri_mm_init(&sup, ctx);
    shared_up(&sup, ly, b, dp, n, Fs, qrest);
    colibri_mm_run(&sup);
    shared_act(ctx, n, Fs);
    colibri_mm_init(&sdown, ctx);
    colibri_mm_add(&sdown, &ly->shared_w2, b->sgate, Fs, n, b->sout, dp, qrest);
    colibri_mm_run(&sdown);
    colibri_stage_mark(ctx, COLIBRI_STAGE_SHARED);
}

void colibri_moe_experts(colibri_ctx *ctx, const colibri_layer *ly, int n) {
    const colibri_buffers *b = &ctx->b;
    size_t E = ctx->model->num_experts;
    int shared = ctx->model->shared_expert_size != 0;
    for (size_t e0 = 0; e0 < E;) {
        /* the longest run of experts from e0 whose slots fit the budget (one always does) */
        size_t e1 = e0 + 1;
        while (e1 < E && b->offsets[e1 + 1] - b->offsets[e0] <= b->slots) e1++;
        if (b->offsets[e1] > b->offsets[e0] || shared) expert_pass(ctx, ly, e0, e1, shared, n);
        shared = 0; /* the shared expert runs with the first pass */
        e0 = e1;
    }
}
