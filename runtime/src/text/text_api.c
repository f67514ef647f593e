/* The public text calls of colibri.h (tokenize, detokenize, token piece, tokenizer info): thin
 * wrappers over tokenizer.c on the context's loaded model. They read only immutable model state,
 * so they are safe to call from several threads at once (see colibri.h). */
#include <string.h>

#include "colibri.h"
#include "core/context.h"
#include "tokenizer.h"

static const colibri_tokenizer *tok_of(const colibri_ctx *ctx) {
    return ctx ? ctx->model->tokenizer : NULL;
}

void colibri_get_tokenizer_info(const colibri_ctx *ctx, colibri_tokenizer_info *info) {
    if (!info) return;
    memset(info, 0, sizeof *info);
    info->bos_id = info->eos_id = info->pad_id = info->unk_id = -1;
    const colibri_tokenizer *t = tok_of(ctx);
    if (!t) return;
    info->has_tokenizer = 1;
    strcpy(info->kind, t->model == COLIBRI_TOK_MODEL_BYTE_BPE ? "byte_level_bpe" : "sentencepiece_bpe");
    info->vocab = t->n_vocab;
    info->add_bos = (t->flags & COLIBRI_TOK_F_ADD_BOS) != 0;
    info->add_eos = (t->flags & COLIBRI_TOK_F_ADD_EOS) != 0;
    info->bos_id = t->bos_id == COLIBRI_TOK_NO_ID ? -1 : (int32_t)t->bos_id;
    info->eos_id = t->eos_id == COLIBRI_TOK_NO_ID ? -1 : (int32_t)t->eos_id;
    info->pad_id = t->pad_id == COLIBRI_TOK_NO_ID ? -1 : (int32_t)t->pad_id;
    info->unk_id = t->unk_id == COLIBRI_TOK_NO_ID ? -1 : (int32_t)t->unk_id;
    int n = t->n_stop < 16 ? (int)t->n_stop : 16;
    for (int i = 0; i < n; i++) info->stop_ids[i] = (int32_t)t->stop_ids[i];
    info->n_stop = n;
}

colibri_status colibri_tokenize(const colibri_ctx *ctx, const char *text, size_t len,
                                int add_special, int32_t *ids, size_t cap, size_t *n_ids) {
    if (!ctx) return COLIBRI_E_INVALID_ARG;
    if (!tok_of(ctx)) return COLIBRI_E_NO_TOKENIZER;
    return colibri_tokenizer_encode(tok_of(ctx), text, len, add_special, ids, cap, n_ids);
}

colibri_status colibri_detokenize(const colibri_ctx *ctx, const int32_t *ids, size_t n,
                                  int skip_special, char *text, size_t cap, size_t *len) {
    if (!ctx) return COLIBRI_E_INVALID_ARG;
    if (!tok_of(ctx)) return COLIBRI_E_NO_TOKENIZER;
    colibri_status s = colibri_tokenizer_decode(tok_of(ctx), ids, n, skip_special, text, cap, len);
    if (s == COLIBRI_E_TOKEN_RANGE) return s;
    /* ids the tokenizer has no piece for but the model's vocabulary has are skipped (as
     * `tokenizers` does); beyond the model's vocabulary they are an error */
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= ctx->model->vocab_size) return COLIBRI_E_TOKEN_RANGE;
    return s;
}

colibri_status colibri_token_piece(const colibri_ctx *ctx, int32_t id, char *buf, size_t cap,
                                   size_t *len) {
    if (!ctx) return COLIBRI_E_INVALID_ARG;
    if (!tok_of(ctx)) return COLIBRI_E_NO_TOKENIZER;
    if (id < 0 || (uint32_t)id >= ctx->model->vocab_size) return COLIBRI_E_TOKEN_RANGE;
    return colibri_tokenizer_piece(tok_of(ctx), id, buf, cap, len);
}
