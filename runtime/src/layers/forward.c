/* The CPU forward pass (docs/format.md, "Forward pass") over a chunk of tokens of one sequence.
 *
 * The token embeddings, then each layer's mixer and FFN as its kinds say (kinds.h: attention,
 * MoE, ...), then the final norm and the LM head. Every kind splits its parallel work over the
 * pool in fixed partitions, so the logits are bitwise identical for any thread count. */
#include "core/context.h"
#include "cpu/kernels.h"
#include "kinds.h"
#include "linear.h"
#include "core/rope.h"

/* cos (first Dh/2) and sin (second Dh/2) of each row's position, shared by the attention layers
 * (plain RoPE or YaRN: rope.c) */
static void rope_tables(colibri_ctx *ctx, const colibri_batch *bt) {
    const struct colibri_model *m = ctx->model;
    for (int j = 0; j < bt->n; j++)
        colibri_rope_row(&m->rope, bt->pos[j], ctx->b.rope + (size_t)j * m->head_dim);
}

void colibri_cpu_forward_chunk(colibri_ctx *ctx, const int32_t *ids, int n, float *logits,
                               int all_logits) {
    const struct colibri_model *m = ctx->model;
    colibri_buffers *b = &ctx->b;
    size_t dp = m->embed_dim_pad, V = m->vocab_size;

    for (int j = 0; j < n; j++) b->pos[j] = ctx->pos + j;
    colibri_batch bt = {n, b->pos, b->cache};
    for (int j = 0; j < n; j++) colibri_row_f32(&m->tok_embed, (uint32_t)ids[j], b->x + j * dp);
    rope_tables(ctx, &bt);
    for (int l = 0; l < (int)m->n_layers; l++) {
        m->layers[l].mixer->forward(ctx, l, &bt);
        m->layers[l].ffn->forward(ctx, l, &bt);
    }
    /* The LM head for every token, or for the last one only (a prompt before sampling): one
     * token's row has the same bits either way (prefill == decode). */
    int j0 = all_logits ? 0 : n - 1;
    if (logits) {
        for (int j = j0; j < n; j++)
            colibri_rmsnorm(b->h + j * dp, b->x + j * dp, m->output_norm.data, m->embed_dim, dp,
                            m->norm_eps);
        colibri_mm_job head;
        colibri_mm_init(&head, ctx);
        colibri_mm_add(&head, &m->lm_head, b->h + (size_t)j0 * dp, dp, n - j0, logits, V, 0);
        colibri_mm_run(&head);
    }
    ctx->pos += n;
}
