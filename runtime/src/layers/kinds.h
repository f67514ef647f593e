/* Layer kinds: what each layer of a model is, and the table the loader, the arena planner and the
 * forward pass consult (docs/runtime.md, "Layer kinds"; docs/format.md, "Layer table").
 *
 * A layer is a token mixer (attention, later recurrent kinds) followed by a feed-forward block
 * (MoE, later dense). Each kind is one entry of a table: its name, a check of its layer record,
 * the tensors a layer of this kind has, the per-sequence cache it needs, and its forward step.
 * A new kind is its own file (the functions below), one row of the table in kinds.c and one
 * enum value here; nothing else in the runtime changes.
 *
 * This header includes nothing of the runtime (the structs it names are forward-declared), so the
 * model loader, the CUDA backend and the kinds' own files can all include it without a circle. */
#ifndef COLIBRI_LAYERS_KINDS_H
#define COLIBRI_LAYERS_KINDS_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

/* Layer record field `mixer` (docs/format.md). 0 is never a kind: a zeroed record is refused. */
enum {
    COLIBRI_MIXER_ATTENTION = 1,         /* causal grouped-query attention over every position */
    COLIBRI_MIXER_SLIDING_ATTENTION = 2, /* the same over the last `window` positions */
    COLIBRI_MIXER_GATED_DELTANET = 3     /* Gated DeltaNet linear attention (Qwen3.5, Qwen3-Next):
                                            a short causal convolution over the last `window`
                                            positions and a fixed-size recurrent state */
};
/* Layer record field `mixer_flags` of the attention kinds: bits 0..7 gpt-oss (bit 0 sinks),
 * bits 8..15 Qwen3.5 / Qwen3-Next (docs/format.md, "Layer table"). */
enum {
    COLIBRI_MIXER_FLAG_OUTPUT_GATE = 1u << 8,  /* attention output times sigmoid(ATTN_GATE h) */
    COLIBRI_MIXER_FLAG_PARTIAL_ROPE = 1u << 9  /* RoPE on the first mixer_params[0] lanes of a
                                                  head only, frequencies over that width */
};
/* Layer record field `ffn`. */
enum { COLIBRI_FFN_MOE = 1 /* routed experts (+ the shared expert when the header says so) */ };

/* mixer_flags of the attention kinds (bits 0..7: gpt-oss; docs/format.md, "Layer table"). */
enum {
    COLIBRI_MIXER_SINKS = 1u << 0,  /* ATTN_SINKS [1, H]: one logit per head in the softmax */
    COLIBRI_MIXER_O_BIAS = 1u << 1  /* BO [1, Dp]: output-projection bias */
};
#define COLIBRI_MIXER_KNOWN_FLAGS 0x3u
/* ffn_params[0] of the moe kind (bits 0..7: gpt-oss); with CLAMPED_SWIGLU, ffn_params[1] and
 * [2] are the f32 bits of its alpha and limit. */
enum {
    COLIBRI_MOE_ROUTER_BIAS = 1u << 0,   /* ROUTER_BIAS [1, E] added to the router logits */
    COLIBRI_MOE_EXPERT_BIAS = 1u << 1,   /* EXPERT_B1/B3 [1, F], EXPERT_B2 [1, Dp] per expert */
    COLIBRI_MOE_CLAMPED_SWIGLU = 1u << 2 /* (clamp(up) + 1) * g * sigmoid(alpha * g), g = min(gate, limit) */
};
#define COLIBRI_MOE_KNOWN_FLAGS 0x7u

/* One layer's record, as validated (docs/format.md, "Layer table"). Version 1 and 2 files, which
 * have no table, read as {ATTENTION, MOE, 0, ...} for every layer. */
typedef struct {
    uint32_t mixer, ffn;
    uint32_t window;          /* sliding kinds: W positions (a token at p sees max(0, p-W+1)..p);
                                 gated_deltanet: the convolution's kernel width (p-W+1..p) */
    uint32_t mixer_flags;     /* attention kinds: COLIBRI_MIXER_* bits 0..7 (sinks, output bias),
                                 COLIBRI_MIXER_FLAG_* bits 8..15 (Qwen's gate, partial RoPE) */
    uint32_t mixer_params[4]; /* per-kind parameters: attention: [0] the rotary width with
                                 PARTIAL_ROPE; gated_deltanet: key heads, value heads, key head
                                 dim, value head dim (`window` is its convolution's width) */
    uint32_t ffn_params[4];   /* MOE: [0] COLIBRI_MOE_* bits, [1..2] SwiGLU alpha/limit (f32) */
} colibri_layer_desc;

/* What a layer keeps per sequence, planned into the context's arena (core/arena.c) and counted
 * by the kit's footprint (colibri_kit/model/footprint.py), byte for byte. */
typedef struct {
    uint32_t kv_positions; /* rows of K and of V (Hkv*Dh values each); 0: none */
    int kv_staged;         /* 1: the rows are a ring shorter than the context; a pass writes its
                              tokens' K/V to the arena's stage first and commits them after
                              attention (so a chunk never overwrites rows it still reads) */
    size_t state_floats;   /* a fixed-size recurrent state (f32); 0 for the attention kinds */
    /* What a pass of the kind needs besides the chunk buffers (not per sequence, shared by every
     * layer: the arena holds the largest): */
    size_t scratch_floats; /* working floats per token of a pass (the arena's `mix` buffer) */
    size_t in_cols;        /* the widest input row of its matrices (0: none wider than the
                              chunk buffers'; sizes the per-thread weight-row scratch) */
} colibri_cache_need;

/* One layer's cache in one sequence: views into the arena. */
typedef struct {
    void *k, *v;           /* [kv_positions, Hkv*Dh], float or IEEE half (--kv-cache f16);
                              position p lives in row p % kv_positions */
    uint32_t kv_positions;
    int kv_staged;
    /* positions 0..shared_positions-1 are read from a snapshot's rows (colibri_seq_share) and
     * not from k/v: [shared_positions, Hkv*Dh] each, of the cache's type, owned by the caller */
    const void *shared_k, *shared_v;
    uint32_t shared_positions;
    float *state;          /* [state_floats], or NULL */
    size_t state_floats;
} colibri_layer_cache;

struct colibri_ctx;

/* One sequence's part of a pass: rows row0..row0+n-1 of the chunk buffers, at consecutive
 * positions pos[row0].. of that sequence. */
typedef struct {
    int row0, n;
    colibri_layer_cache *cache;  /* [n_layers] the sequence's caches */
    struct colibri_ctx *owner;   /* the sequence's context (the routing dump writes into it) */
} colibri_batch_seq;

/* The tokens of one pass: rows 0..n-1 of the running context's chunk buffers (x, h, q, ...),
 * from one or more sequences (continuous batching, docs/runtime.md "Batching"), each sequence's
 * rows contiguous and in position order. Every per-row value a kind computes must depend only on
 * that row and its own sequence's cache, never on the other rows (batch invariance): a kind
 * that keeps state across tokens walks bt->seqs, one sequence at a time. */
typedef struct {
    int n;
    const int32_t *pos;              /* [n] each row's position in its sequence */
    const int32_t *seq;              /* [n] each row's index into seqs */
    int n_seqs;
    const colibri_batch_seq *seqs;   /* [n_seqs] */
} colibri_batch;

/* Row j's cache of layer l. */
static inline colibri_layer_cache *colibri_batch_cache(const colibri_batch *bt, int j, int l) {
    return &bt->seqs[bt->seq[j]].cache[l];
}

struct colibri_model;

typedef struct {
    uint32_t kind;
    const char *name; /* as `colibri info`, docs and the kit spell it */
    /* The layer record of layer `l` against the header; a reason naming the field on failure. */
    colibri_status (*validate)(const struct colibri_model *m, uint32_t l, char *why, size_t len);
    /* 1 when a layer of this kind has tensor kind `tk` (docs/format.md), with its shape. */
    int (*tensor)(const struct colibri_model *m, uint32_t l, uint32_t tk, uint32_t *rows,
                  uint32_t *cols);
    /* The per-sequence cache of layer `l`. */
    void (*cache)(const struct colibri_model *m, uint32_t l, colibri_cache_need *need);
    /* Layer `l` on the batch: reads and updates the residual stream ctx->b.x. */
    void (*forward)(struct colibri_ctx *ctx, int l, const colibri_batch *bt);
    /* 1: forward takes a pass over several sequences and keeps every row's bits as alone (its
     * per-row values depend only on the row and its own sequence's cache; a recurrent kind walks
     * bt->seqs). 0, also what a row that leaves the field out gets: the batch engine gives each
     * sequence a pass of its own on models with a layer of this kind (slower, never other bits;
     * colibri_engine_unbatched names the layer). Set it only with the kind in tests/test_batch.py. */
    int multi_seq;
} colibri_layer_kind;

/* The table's entry for a mixer / FFN kind value, or NULL when this runtime has none. */
const colibri_layer_kind *colibri_mixer_kind(uint32_t kind);
const colibri_layer_kind *colibri_ffn_kind(uint32_t kind);

/* ---- the kinds (one file each; the table in kinds.c points at these) ---- */

/* attention.c: full and sliding-window causal grouped-query attention */
colibri_status colibri_attention_validate(const struct colibri_model *m, uint32_t l, char *why,
                                          size_t len);
colibri_status colibri_sliding_validate(const struct colibri_model *m, uint32_t l, char *why,
                                        size_t len);
int colibri_attention_tensor(const struct colibri_model *m, uint32_t l, uint32_t tk,
                             uint32_t *rows, uint32_t *cols);
void colibri_attention_cache(const struct colibri_model *m, uint32_t l, colibri_cache_need *need);
void colibri_sliding_cache(const struct colibri_model *m, uint32_t l, colibri_cache_need *need);
void colibri_attention_forward(struct colibri_ctx *ctx, int l, const colibri_batch *bt);
/* Query heads of one KV group that a thread's attention unit holds at most, and the score rows
 * (of max_seq_len floats) the arena keeps per thread for them: min(n_heads / n_kv_heads, 8). */
#define COLIBRI_ATT_HEADS 8
size_t colibri_attention_score_rows(const struct colibri_model *m);

/* deltanet.c: Gated DeltaNet (Qwen3.5 / Qwen3-Next linear attention, docs/runtime.md) */
colibri_status colibri_deltanet_validate(const struct colibri_model *m, uint32_t l, char *why,
                                         size_t len);
int colibri_deltanet_tensor(const struct colibri_model *m, uint32_t l, uint32_t tk,
                            uint32_t *rows, uint32_t *cols);
void colibri_deltanet_cache(const struct colibri_model *m, uint32_t l, colibri_cache_need *need);
void colibri_deltanet_forward(struct colibri_ctx *ctx, int l, const colibri_batch *bt);

/* moe.c: the four MoE stages (preprocess, route, dispatch, compute) */
colibri_status colibri_moe_validate(const struct colibri_model *m, uint32_t l, char *why,
                                    size_t len);
int colibri_moe_tensor(const struct colibri_model *m, uint32_t l, uint32_t tk, uint32_t *rows,
                       uint32_t *cols);
void colibri_moe_cache(const struct colibri_model *m, uint32_t l, colibri_cache_need *need);
void colibri_moe_forward(struct colibri_ctx *ctx, int l, const colibri_batch *bt);

#endif
