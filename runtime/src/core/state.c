/* Saving and restoring a context's sequence (colibri.h, "Sequence state"; docs/runtime.md,
 * "Recurrent state"). The bytes, little-endian:
 *
 *   0   char[8]  "CLBSTATE"
 *   8   u32      version (1)
 *   12  u32      pos: tokens the sequence has run
 *   16  u32      n_layers
 *   20  u32      kv_f16: 1 when the K/V rows are IEEE half (--kv-cache f16)
 *   24  u64      the model's file_size
 *   32  u64      total bytes (this header included)
 *   40  u64      state bytes (every recurrent layer's state_floats x 4)
 *   48  u32      bytes of one K (or V) row
 *   52  u32      reserved (0)
 *   56  u64      FNV-1a of the model file's 256-byte header (its geometry, dtype and name)
 *   64  ...      per layer: its K rows, then its V rows, slots 0..min(pos, kv_positions)-1 in
 *                slot order (full attention: slot = position; a ring: position % rows); then the
 *                state region of the arena (the layers' states in layer order)
 *
 * Only rows that later tokens read are kept, so the size grows with pos; the states are fixed. */
#include <stdio.h>
#include <string.h>

#include "context.h"
#include "le.h"
#include "le_write.h"

#define STATE_MAGIC "CLBSTATE"
#define STATE_VERSION 1u
#define STATE_HEADER 64u

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

static size_t row_bytes(const colibri_ctx *ctx) {
    const struct colibri_model *m = ctx->model;
    return (size_t)m->n_kv_heads * m->head_dim * (ctx->b.kv_f16 ? 2u : 4u);
}

/* Rows of layer l that the sequence at position pos still reads. */
static size_t live_rows(const colibri_ctx *ctx, uint32_t l, uint32_t pos) {
    uint32_t r = ctx->b.cache[l].kv_positions;
    return pos < r ? pos : r;
}

static size_t total_bytes(const colibri_ctx *ctx, uint32_t pos) {
    size_t n = STATE_HEADER, row = row_bytes(ctx);
    for (uint32_t l = 0; l < ctx->model->n_layers; l++) n += 2 * live_rows(ctx, l, pos) * row;
    return n + ctx->b.state_bytes;
}

static colibri_status refuse(colibri_ctx *ctx, colibri_status s, const char *why) {
    snprintf(ctx->err, sizeof ctx->err, "%s", why);
    return s;
}

colibri_status colibri_state_size(const colibri_ctx *ctx, size_t *bytes) {
    if (!ctx || !bytes) return COLIBRI_E_INVALID_ARG;
    if (ctx->cuda) return COLIBRI_E_UNSUPPORTED;
    *bytes = total_bytes(ctx, (uint32_t)ctx->pos);
    return COLIBRI_OK;
}

colibri_status colibri_state_save(colibri_ctx *ctx, void *buf, size_t cap, size_t *len) {
    if (!ctx || !len || (!buf && cap)) return COLIBRI_E_INVALID_ARG;
    ctx->err[0] = '\0';
    if (ctx->cuda)
        return refuse(ctx, COLIBRI_E_UNSUPPORTED,
                      "state save/restore covers the CPU backend only (this context runs on CUDA)");
    const struct colibri_model *m = ctx->model;
    const uint32_t pos = (uint32_t)ctx->pos;
    const size_t need = total_bytes(ctx, pos), row = row_bytes(ctx);
    *len = need;
    if (cap < need) {
        snprintf(ctx->err, sizeof ctx->err, "state needs %zu bytes, the buffer has %zu", need, cap);
        return COLIBRI_E_BUFFER_TOO_SMALL;
    }
    uint8_t *p = buf;
    memset(p, 0, STATE_HEADER);
    memcpy(p, STATE_MAGIC, 8);
    le_put32(p + 8, STATE_VERSION);
    le_put32(p + 12, pos);
    le_put32(p + 16, m->n_layers);
    le_put32(p + 20, (uint32_t)ctx->b.kv_f16);
    le_put64(p + 24, m->file_size);
    le_put64(p + 32, need);
    le_put64(p + 40, ctx->b.state_bytes);
    le_put32(p + 48, (uint32_t)row);
    le_put64(p + 56, fnv1a(m->base, COLIBRI_HEADER_SIZE));
    p += STATE_HEADER;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        size_t n = live_rows(ctx, l, pos) * row;
        memcpy(p, ctx->b.cache[l].k, n);
        memcpy(p + n, ctx->b.cache[l].v, n);
        p += 2 * n;
    }
    if (ctx->b.state_bytes) memcpy(p, ctx->b.state, ctx->b.state_bytes);
    return COLIBRI_OK;
}

colibri_status colibri_state_restore(colibri_ctx *ctx, const void *buf, size_t len) {
    if (!ctx || !buf) return COLIBRI_E_INVALID_ARG;
    ctx->err[0] = '\0';
    if (ctx->cuda)
        return refuse(ctx, COLIBRI_E_UNSUPPORTED,
                      "state save/restore covers the CPU backend only (this context runs on CUDA)");
    const struct colibri_model *m = ctx->model;
    const uint8_t *p = buf;
    if (len < STATE_HEADER || memcmp(p, STATE_MAGIC, 8) != 0)
        return refuse(ctx, COLIBRI_E_INVALID_ARG, "not a saved colibri state (no \"CLBSTATE\" header)");
    if (rd32(p + 8) != STATE_VERSION)
        return refuse(ctx, COLIBRI_E_INVALID_ARG,
                      "saved state of another format version (this runtime reads version 1)");
    const uint32_t pos = rd32(p + 12);
    if (rd32(p + 16) != m->n_layers || rd64(p + 24) != m->file_size ||
        rd64(p + 56) != fnv1a(m->base, COLIBRI_HEADER_SIZE))
        return refuse(ctx, COLIBRI_E_INVALID_ARG, "saved state of another model file");
    if (rd32(p + 20) != (uint32_t)ctx->b.kv_f16)
        return refuse(ctx, COLIBRI_E_INVALID_ARG,
                      ctx->b.kv_f16 ? "saved state has an f32 KV cache, this context an f16 one"
                                    : "saved state has an f16 KV cache, this context an f32 one");
    if (pos > m->max_seq_len || rd64(p + 40) != ctx->b.state_bytes ||
        rd32(p + 48) != row_bytes(ctx) || rd32(p + 52) != 0 || rd64(p + 32) != len ||
        total_bytes(ctx, pos) != len)
        return refuse(ctx, COLIBRI_E_INVALID_ARG,
                      "saved state is damaged (its sizes do not match its header)");
    const size_t row = row_bytes(ctx);
    p += STATE_HEADER;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        size_t n = live_rows(ctx, l, pos) * row;
        memcpy(ctx->b.cache[l].k, p, n);
        memcpy(ctx->b.cache[l].v, p + n, n);
        p += 2 * n;
    }
    if (ctx->b.state_bytes) memcpy(ctx->b.state, p, ctx->b.state_bytes);
    ctx->pos = (int)pos;
    ctx->calls = 0;
    return COLIBRI_OK;
}
