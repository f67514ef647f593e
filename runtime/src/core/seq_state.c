/* A sequence's state, saved and restored (colibri.h, "A sequence's state"; docs/runtime.md,
 * "Snapshots"): what prompt prefix reuse copies instead of computing a shared prefix again, and
 * what an application saves after a prompt to restore into other contexts. The bytes,
 * little-endian:
 *
 *   0   char[8]  "CLBSTATE"
 *   8   u32      version (2)
 *   12  u32      pos: tokens the sequence has run
 *   16  u32      n_layers
 *   20  u32      kv_f16: 1 when the K/V rows are IEEE half (--kv-cache f16)
 *   24  u64      the model's file_size
 *   32  u64      total bytes (this header included)
 *   40  u64      state bytes (every recurrent layer's state_floats x 4)
 *   48  u32      bytes of one K (or V) row: Hkv * Dh values of the cache's type
 *   52  u32      reserved (0)
 *   56  u64      FNV-1a of the model file's 256-byte header (its geometry, dtype and name)
 *   64  ...      per layer: its K rows then its V rows at pos, in position order (a full cache:
 *                positions 0..pos-1; a ring of R rows: the last min(pos, R)), then the layer's
 *                recurrent state (state_floats f32, none for attention)
 *
 * The rows are the cache's own bytes (f32 or f16), so a restored context reads exactly what it
 * would have computed, and continuing from it gives the same bits (prefill == decode). Position
 * order (not slot order) is what lets a full cache restore any shorter prefix (`keep`), and
 * what lets colibri_seq_share point a full cache's first `keep` positions at the snapshot's rows
 * instead of copying them (per layer, K rows then V rows, each position's at `row` bytes). A
 * restore checks everything before it writes: a refused one leaves the context as it was. */
#include <string.h>

#include "context.h"
#include "le.h"
#include "le_write.h"

#define SEQ_MAGIC "CLBSTATE"
#define SEQ_VERSION 2u
#define SEQ_HEADER 64u

static uint64_t fnv1a(const uint8_t *p, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 1099511628211ull;
    return h;
}

/* Positions layer c holds at pos: first..pos-1. */
static int first_held(const colibri_layer_cache *c, int pos) {
    return pos > (int)c->kv_positions ? pos - (int)c->kv_positions : 0;
}

static size_t row_bytes(const colibri_ctx *ctx) {
    const struct colibri_model *m = ctx->model;
    return (size_t)m->n_kv_heads * m->head_dim * (ctx->b.kv_f16 ? sizeof(uint16_t) : sizeof(float));
}

static size_t state_bytes_at(const colibri_ctx *ctx, int pos) {
    size_t n = SEQ_HEADER, row = row_bytes(ctx);
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
    uint8_t *o = buf;
    memset(o, 0, SEQ_HEADER);
    memcpy(o, SEQ_MAGIC, 8);
    le_put32(o + 8, SEQ_VERSION);
    le_put32(o + 12, (uint32_t)ctx->pos);
    le_put32(o + 16, m->n_layers);
    le_put32(o + 20, (uint32_t)ctx->b.kv_f16);
    le_put64(o + 24, m->file_size);
    le_put64(o + 32, need);
    le_put64(o + 40, ctx->b.state_bytes);
    le_put32(o + 48, (uint32_t)row);
    le_put64(o + 56, fnv1a(m->base, COLIBRI_HEADER_SIZE));
    o += SEQ_HEADER;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const colibri_layer_cache *c = &ctx->b.cache[l];
        for (int kv = 0; c->kv_positions && kv < 2; kv++) {
            const uint8_t *base = kv ? c->v : c->k, *shared = kv ? c->shared_v : c->shared_k;
            for (int p = first_held(c, ctx->pos); p < ctx->pos; p++, o += row)
                memcpy(o, p < (int)c->shared_positions ? shared + (size_t)p * row
                                                       : base + (size_t)(p % (int)c->kv_positions) * row,
                       row);
        }
        if (c->state_floats) {
            memcpy(o, c->state, c->state_floats * sizeof(float));
            o += c->state_floats * sizeof(float);
        }
    }
    return COLIBRI_OK;
}

int colibri_seq_state_pos(const void *buf, size_t len) {
    const uint8_t *p = buf;
    if (!buf || len < SEQ_HEADER || memcmp(p, SEQ_MAGIC, 8) != 0 || rd32(p + 8) != SEQ_VERSION ||
        rd64(p + 32) != len || rd32(p + 12) > (uint32_t)INT32_MAX)
        return -1;
    return (int)rd32(p + 12);
}

/* Why buf cannot be restored into ctx (NULL when it can), checked in the order a user fixes them:
 * not a snapshot at all, another format, another model, another KV type, damaged. */
static const char *refusal(const colibri_ctx *ctx, const uint8_t *p, size_t len) {
    const struct colibri_model *m = ctx->model;
    if (len < SEQ_HEADER || memcmp(p, SEQ_MAGIC, 8) != 0)
        return "not a sequence snapshot (no \"CLBSTATE\" header)";
    if (rd32(p + 8) != SEQ_VERSION)
        return "a snapshot of another format version (this runtime reads version 2)";
    if (rd32(p + 16) != m->n_layers || rd64(p + 24) != m->file_size ||
        rd64(p + 56) != fnv1a(m->base, COLIBRI_HEADER_SIZE))
        return "a snapshot of another model file";
    if (rd32(p + 20) != (uint32_t)ctx->b.kv_f16)
        return ctx->b.kv_f16 ? "the snapshot has an f32 KV cache, this context an f16 one"
                             : "the snapshot has an f16 KV cache, this context an f32 one";
    const uint32_t pos = rd32(p + 12);
    if (pos > m->max_seq_len || rd64(p + 40) != ctx->b.state_bytes ||
        rd32(p + 48) != row_bytes(ctx) || rd32(p + 52) != 0 || rd64(p + 32) != len ||
        state_bytes_at(ctx, (int)pos) != len)
        return "the snapshot is damaged or truncated (its sizes do not match its header)";
    return NULL;
}

/* A layer whose cache holds every position (no ring): what colibri_seq_share reads in place. */
static int full_cache(const colibri_ctx *ctx, const colibri_layer_cache *c) {
    return c->kv_positions >= ctx->model->max_seq_len && !c->kv_staged;
}

void colibri_seq_unshare(colibri_ctx *ctx) {
    for (uint32_t l = 0; l < ctx->model->n_layers; l++) {
        colibri_layer_cache *c = &ctx->b.cache[l];
        c->shared_k = c->shared_v = NULL;
        c->shared_positions = 0;
    }
}

static colibri_status restore(colibri_ctx *ctx, const void *buf, size_t len, int keep, int share) {
    if (!ctx) return COLIBRI_E_INVALID_ARG;
    ctx->err[0] = '\0';
    if (ctx->cuda || ctx->engine)
        return colibri_ctx_fail(ctx, COLIBRI_E_UNSUPPORTED,
                                "sequence snapshots cover CPU contexts only");
    if (!buf) return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "no snapshot given (NULL)");
    const char *why = refusal(ctx, buf, len);
    if (why) return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG, "%s", why);
    const struct colibri_model *m = ctx->model;
    const int pos = (int)rd32((const uint8_t *)buf + 12);
    const size_t row = row_bytes(ctx);
    if (keep < 0 || keep > pos)
        return colibri_ctx_fail(ctx, COLIBRI_E_INVALID_ARG,
                                "keep %d is outside the snapshot's 0..%d positions", keep, pos);
    if (keep < pos && !colibri_model_can_truncate(m))
        return colibri_ctx_fail(ctx, COLIBRI_E_UNSUPPORTED,
                                "this model keeps a sliding window or a recurrent state: a snapshot "
                                "restores to its own position (%d) only, not %d", pos, keep);
    colibri_seq_unshare(ctx);
    const uint8_t *in = (const uint8_t *)buf + SEQ_HEADER;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        colibri_layer_cache *c = &ctx->b.cache[l];
        if (c->kv_positions && share && full_cache(ctx, c)) {
            /* positions 0..keep-1 read where they are: K rows, then V rows (first is 0) */
            c->shared_k = in;
            c->shared_v = in + (size_t)pos * row;
            c->shared_positions = (uint32_t)keep;
            in += 2 * (size_t)pos * row;
        } else if (c->kv_positions) {
            int first = first_held(c, pos), held = pos - first;
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

colibri_status colibri_seq_restore(colibri_ctx *ctx, const void *buf, size_t len, int keep) {
    return restore(ctx, buf, len, keep, 0);
}

colibri_status colibri_seq_share(colibri_ctx *ctx, const void *buf, size_t len, int keep) {
    return restore(ctx, buf, len, keep, 1);
}
