/* A sequence's state, saved and restored (colibri.h, "A sequence's state"): what prompt prefix
 * reuse copies instead of computing a shared prefix again.
 *
 * A snapshot is a header and, per layer, the K rows then the V rows the layer holds at the
 * context's position, in position order (a full cache: positions 0..pos-1; a ring of R rows:
 * the last min(pos, R)), then the layer's recurrent state (state_floats, none for attention).
 * The rows are the cache's own bytes (f32 or f16), so a restored context reads exactly what it
 * would have computed, and continuing from it gives the same bits (prefill == decode). */
#include <string.h>

#include "context.h"

#define SEQ_MAGIC 0x31514553u /* "SEQ1" little-endian */

typedef struct {
    uint32_t magic, n_layers;
    uint32_t row_bytes;       /* one K (or V) row: Hkv * Dh values of the cache's type */
    uint32_t kv_f16;
    uint64_t file_size;       /* the model's identity (with its geometry below) */
    uint32_t max_seq_len, vocab_size;
    int32_t pos;
    uint32_t reserved;
    uint64_t bytes;           /* the whole snapshot */
} seq_header;

/* Positions layer c holds at pos: first..pos-1. */
static int first_held(const colibri_layer_cache *c, int pos) {
    return pos > (int)c->kv_positions ? pos - (int)c->kv_positions : 0;
}

static size_t row_bytes(const colibri_ctx *ctx) {
    const struct colibri_model *m = ctx->model;
    return (size_t)m->n_kv_heads * m->head_dim * (ctx->b.kv_f16 ? sizeof(uint16_t) : sizeof(float));
}

static size_t state_bytes_at(const colibri_ctx *ctx, int pos) {
    size_t n = sizeof(seq_header), row = row_bytes(ctx);
    for (uint32_t l = 0; l < ctx->model->n_layers; l++) {
        const colibri_layer_cache *c = &ctx->b.cache[l];
        if (c->kv_positions) n += 2 * (size_t)(pos - first_held(c, pos)) * row;
        n += c->state_floats * sizeof(float);
    }
    return n;
}

size_t colibri_seq_state_bytes(const colibri_ctx *ctx) {
    if (!ctx || ctx->cuda || ctx->engine) return 0;
    return state_bytes_at(ctx, ctx->pos);
}

int colibri_model_can_truncate(const colibri_model *m) {
    if (!m) return 0;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        colibri_cache_need need, f;
        m->layers[l].mixer->cache(m, l, &need);
        m->layers[l].ffn->cache(m, l, &f);
        if (need.kv_staged || f.kv_staged || need.state_floats || f.state_floats ||
            (need.kv_positions && need.kv_positions < m->max_seq_len))
            return 0;
    }
    return 1;
}

colibri_status colibri_seq_save(const colibri_ctx *cctx, void *buf, size_t cap, size_t *len) {
    colibri_ctx *ctx = (colibri_ctx *)cctx; /* only its error buffer is written */
    if (!ctx || !len) return COLIBRI_E_INVALID_ARG;
    *len = 0;
    if (ctx->cuda || ctx->engine)
        return colibri_ctx_fail(ctx, COLIBRI_E_UNSUPPORTED,
                                "sequence snapshots cover CPU contexts only (this one runs on %s)",
                                ctx->cuda ? "CUDA" : "no cache: an engine");
    const struct colibri_model *m = ctx->model;
    size_t need = state_bytes_at(ctx, ctx->pos), row = row_bytes(ctx);
    *len = need;
    if (!buf || cap < need)
        return colibri_ctx_fail(ctx, COLIBRI_E_BUFFER_TOO_SMALL,
                                "a snapshot at position %d takes %zu bytes (%zu given)", ctx->pos,
                                need, cap);
    seq_header h = {SEQ_MAGIC, m->n_layers, (uint32_t)row, (uint32_t)ctx->b.kv_f16, m->file_size,
                    m->max_seq_len, m->vocab_size, ctx->pos, 0, need};
    uint8_t *o = buf;
    memcpy(o, &h, sizeof h);
    o += sizeof h;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const colibri_layer_cache *c = &ctx->b.cache[l];
        for (int kv = 0; c->kv_positions && kv < 2; kv++) {
            const uint8_t *base = kv ? c->v : c->k;
            for (int p = first_held(c, ctx->pos); p < ctx->pos; p++, o += row)
                memcpy(o, base + (size_t)(p % (int)c->kv_positions) * row, row);
        }
        if (c->state_floats) {
            memcpy(o, c->state, c->state_floats * sizeof(float));
            o += c->state_floats * sizeof(float);
        }
    }
    return COLIBRI_OK;
}

int colibri_seq_state_pos(const void *buf, size_t len) {
    seq_header h;
    if (!buf || len < sizeof h) return -1;
    memcpy(&h, buf, sizeof h);
    return h.magic == SEQ_MAGIC && h.bytes == len ? h.pos : -1;
}

colibri_status colibri_seq_restore(colibri_ctx *ctx, const void *buf, size_t len, int keep) {
    if (!ctx) return COLIBRI_E_INVALID_ARG;
    ctx->err[0] = '\0';
    if (ctx->cuda || ctx->engine)
        return colibri_ctx_fail(ctx, COLIBRI_E_UNSUPPORTED,
                                "sequence snapshots cover CPU contexts only");
    const struct colibri_model *m = ctx->model;
    seq_header h;
    size_t row = row_bytes(ctx);
    if (!buf || len < sizeof h)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "not a sequence snapshot (%zu bytes)", len);
    memcpy(&h, buf, sizeof h);
    if (h.magic != SEQ_MAGIC || h.bytes != len || h.pos < 0 || (uint32_t)h.pos > m->max_seq_len)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "not a sequence snapshot");
    if (h.n_layers != m->n_layers || h.row_bytes != row || h.kv_f16 != (uint32_t)ctx->b.kv_f16 ||
        h.file_size != m->file_size || h.max_seq_len != m->max_seq_len ||
        h.vocab_size != m->vocab_size || state_bytes_at(ctx, h.pos) != len)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG,
                                "the snapshot is of another model or KV cache type");
    if (keep < 0 || keep > h.pos)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG,
                                "keep %d is outside the snapshot's 0..%d positions", keep, h.pos);
    if (keep < h.pos && !colibri_model_can_truncate(m))
        return colibri_ctx_fail(ctx, COLIBRI_E_UNSUPPORTED,
                                "this model keeps a sliding window or a recurrent state: a snapshot "
                                "restores to its own position (%d) only, not %d", h.pos, keep);
    const uint8_t *in = (const uint8_t *)buf + sizeof h;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        colibri_layer_cache *c = &ctx->b.cache[l];
        if (c->kv_positions) {
            int first = first_held(c, h.pos), held = h.pos - first;
            for (int kv = 0; kv < 2; kv++) {
                uint8_t *base = kv ? c->v : c->k;
                /* positions first..keep-1 (keep < pos only for full caches: first is 0) */
                for (int p = first; p < keep; p++)
                    memcpy(base + (size_t)(p % (int)c->kv_positions) * row,
                           in + (size_t)(p - first) * row, row);
                in += (size_t)held * row;
            }
        }
        if (c->state_floats) {
            memcpy(c->state, in, c->state_floats * sizeof(float));
            in += c->state_floats * sizeof(float);
        }
    }
    ctx->pos = keep;
    ctx->calls = 0;
    return COLIBRI_OK;
}
