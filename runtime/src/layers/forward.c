/* The CPU forward pass (docs/format.md, "Forward pass") over a chunk of tokens of one or more
 * sequences (continuous batching: docs/runtime.md, "Batching").
 *
 * The token embeddings, then each layer's mixer and FFN as its kinds say (kinds.h: attention,
 * MoE, ...), then the final norm and the LM head. Every kind splits its parallel work over the
 * pool in fixed partitions, so the logits are bitwise identical for any thread count. */
#include <string.h>
#include <time.h>

#include "core/context.h"
#include "cpu/kernels.h"
#include "kinds.h"
#include "linear.h"
#include "core/rope.h"

/* The stepping thread's clock: stage times (only with stage timing on) and
 * colibri_engine_step_times (two reads per layer part: a few tens of nanoseconds against a pass
 * of milliseconds). */
static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e3 + (double)t.tv_nsec / 1e6;
}

void colibri_stage_clock(colibri_ctx *ctx, int stage) {
    double t = now_ms();
    ctx->stage_ms[stage] += t - ctx->stage_t;
    ctx->stage_t = t;
}

void colibri_set_stage_timing(colibri_ctx *ctx, int on) {
    if (!ctx) return;
    ctx->stage_on = on != 0;
    memset(ctx->stage_ms, 0, sizeof ctx->stage_ms);
}

void colibri_get_stage_times(const colibri_ctx *ctx, double ms[COLIBRI_STAGE_COUNT]) {
    for (int i = 0; i < COLIBRI_STAGE_COUNT; i++) ms[i] = ctx ? ctx->stage_ms[i] : 0.0;
}

const char *colibri_stage_name(int stage) {
    static const char *const names[COLIBRI_STAGE_COUNT] = {
        "embed", "norms", "mixer", "route", "dispatch", "experts", "shared_expert", "combine",
        "head"};
    return stage >= 0 && stage < COLIBRI_STAGE_COUNT ? names[stage] : NULL;
}

/* cos (first Dh/2) and sin (second Dh/2) of each row's position, shared by the attention layers
 * (plain RoPE or YaRN: rope.c) */
static void rope_tables(colibri_ctx *ctx, const colibri_batch *bt) {
    const struct colibri_model *m = ctx->model;
    for (int j = 0; j < bt->n; j++)
        colibri_rope_row(&m->rope, bt->pos[j], ctx->b.rope + (size_t)j * m->head_dim);
}

/* The final norm and the LM head for rows j0..n-1 of a one-sequence pass, straight into the
 * caller's logits. */
static void head_direct(colibri_ctx *eng, int j0, int n, float *logits) {
    const struct colibri_model *m = eng->model;
    colibri_buffers *b = &eng->b;
    size_t dp = m->embed_dim_pad;
    for (int j = j0; j < n; j++)
        colibri_rmsnorm(b->h + j * dp, b->x + j * dp, m->output_norm.data, m->embed_dim, dp,
                        m->norm_eps);
    colibri_stage_mark(eng, COLIBRI_STAGE_NORMS);
    colibri_mm_job head;
    colibri_mm_init(&head, eng);
    colibri_mm_add(&head, &m->lm_head, b->h + (size_t)j0 * dp, dp, n - j0, logits, m->vocab_size, 0);
    colibri_mm_run(&head);
    colibri_stage_mark(eng, COLIBRI_STAGE_HEAD);
}

/* The same for a pass over several sequences: the rows that want logits are normalised into
 * consecutive rows of h and go through the head together (its weights read once per group of
 * lstage_rows), then each row is copied to its sequence's logits. */
static void head_staged(colibri_ctx *eng, const colibri_pass_item *it, int n_items) {
    const struct colibri_model *m = eng->model;
    colibri_buffers *b = &eng->b;
    size_t dp = m->embed_dim_pad, V = m->vocab_size;
    int src[COLIBRI_CHUNK], n = 0;
    float *dst[COLIBRI_CHUNK];
    for (int i = 0, row0 = 0; i < n_items; row0 += it[i].n, i++)
        for (int j = it[i].lrow0; it[i].logits && j < it[i].n; j++, n++) {
            src[n] = row0 + j;
            dst[n] = it[i].logits + (size_t)(j - it[i].lrow0) * V;
        }
    for (int g0 = 0; g0 < n; g0 += b->lstage_rows) {
        int g = n - g0 < b->lstage_rows ? n - g0 : b->lstage_rows;
        for (int k = 0; k < g; k++)
            colibri_rmsnorm(b->h + (size_t)k * dp, b->x + (size_t)src[g0 + k] * dp,
                            m->output_norm.data, m->embed_dim, dp, m->norm_eps);
        colibri_mm_job head;
        colibri_mm_init(&head, eng);
        colibri_mm_add(&head, &m->lm_head, b->h, dp, g, b->lstage, V, 0);
        colibri_mm_run(&head);
        for (int k = 0; k < g; k++) memcpy(dst[g0 + k], b->lstage + (size_t)k * V, V * sizeof(float));
    }
    colibri_stage_mark(eng, COLIBRI_STAGE_HEAD); /* the staged head's norms included */
}

void colibri_cpu_pass(colibri_ctx *eng, const colibri_pass_item *it, int n_items) {
    const struct colibri_model *m = eng->model;
    colibri_buffers *b = &eng->b;
    size_t dp = m->embed_dim_pad;
    colibri_step_times *st = &eng->steps;
    double t0 = now_ms(), t;

    if (eng->stage_on) eng->stage_t = now_ms(); /* the pass starts: nothing before it counts */
    /* the rows: each sequence's tokens in order, after the previous sequence's */
    int n = 0;
    for (int i = 0; i < n_items; i++) {
        colibri_ctx *sq = it[i].seq;
        eng->seqs[i] = (colibri_batch_seq){n, it[i].n, sq->b.cache, sq};
        for (int j = 0; j < it[i].n; j++, n++) {
            b->pos[n] = sq->pos + j;
            eng->row_seq[n] = i;
            colibri_row_f32(&m->tok_embed, (uint32_t)it[i].ids[j], b->x + (size_t)n * dp);
        }
    }
    colibri_batch bt = {n, b->pos, eng->row_seq, n_items, eng->seqs};
    rope_tables(eng, &bt);
    colibri_stage_mark(eng, COLIBRI_STAGE_EMBED);
    for (int l = 0; l < (int)m->n_layers; l++) {
        t = now_ms();
        m->layers[l].mixer->forward(eng, l, &bt);
        double t1 = now_ms();
        colibri_stage_mark(eng, COLIBRI_STAGE_MIXER); /* the kind marks its own norm first, if any */
        m->layers[l].ffn->forward(eng, l, &bt); /* marks its own stages */
        st->mixer_ms += t1 - t;
        st->ffn_ms += now_ms() - t1;
    }
    t = now_ms();
    /* The LM head for the rows that want logits (every token, or the last one: a prompt before
     * sampling). A row's logits have the same bits whichever other rows share the pass
     * (prefill == decode, extended to batches). */
    if (n_items == 1) {
        if (it[0].logits) head_direct(eng, it[0].lrow0, it[0].n, it[0].logits);
    } else {
        head_staged(eng, it, n_items);
    }
    for (int i = 0; i < n_items; i++) it[i].seq->pos += it[i].n;
    double t2 = now_ms();
    st->head_ms += t2 - t;
    st->pass_ms += t2 - t0;
    st->passes++;
    st->rows += (unsigned long long)n;
}
