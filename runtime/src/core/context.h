/* The inside of a colibri_ctx: the model, the one arena and its carving, the thread pool. */
#ifndef COLIBRI_CONTEXT_H
#define COLIBRI_CONTEXT_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"
#include "cuda/cuda_backend.h"
#include "model.h"
#include "pool.h"

/* Tokens processed together by one pass over the weights (prefill is split into chunks). 512:
 * with 128 experts top-8 a 64-token chunk gave each expert ~4 tokens, so every chunk streamed
 * nearly all of a layer's expert weights again; at 512 each routed expert's weights are read once
 * for ~32 tokens (docs/runtime.md, "Prefill"). Only the per-token buffers scale with it. */
#define COLIBRI_CHUNK 512
/* Expert input rows in flight at once (moe_experts.c): the MoE Compute stage runs in passes of
 * whole experts whose slots fit this budget (never fewer than a chunk, so one expert, which a
 * token chooses at most once, always fits), so the copied inputs and the gate/up activations
 * need not grow with chunk x top_k. */
#define COLIBRI_MOE_SLOTS 1024

/* Every working buffer, carved from the one arena at init (arena.c). */
typedef struct {
    int chunk;                /* tokens per pass (<= COLIBRI_CHUNK, <= max_seq_len) */
    float *x;                 /* [chunk, Dp] residual stream */
    float *h;                 /* [chunk, Dp] normalised input of a block */
    float *q, *k, *v;         /* [chunk, H*Dh], [chunk, Hkv*Dh] x2 */
    float *att;               /* [chunk, H*Dh] attention output */
    float *tmp;               /* [chunk, Dp] block output before the residual add */
    float *rope;              /* [chunk, Dh] cos (first Dh/2) and sin (second Dh/2) per token */
    int32_t *pos;             /* [chunk] the position of each row of a pass (colibri_batch) */
    float *mix;               /* [chunk, mix_floats] a mixer kind's own working values (gated
                                 attention's gate, gated_deltanet's projections), the largest
                                 any layer's kind asks for (kinds.h scratch_floats) */
    size_t mix_floats;
    /* The layers' caches (kinds.h), planned from the layer list: every layer's K rows in one
     * region, then every layer's V rows, float or uint16_t half when kv_f16; cache[l] views
     * layer l's part. */
    void *kcache, *vcache;
    void *kstage, *vstage;    /* [chunk, Hkv*Dh] a pass's K/V rows for layers whose ring is shorter
                                 than the context (kv_staged); none when no layer is */
    float *state;             /* recurrent kinds' fixed-size states (zeroed at init and reset):
                                 every layer's state_floats, in layer order */
    size_t state_bytes;
    colibri_layer_cache *cache; /* [L], allocated with the context (not in the arena) */
    int kv_f16;               /* COLIBRI_KV_F16: rounded on write, widened on read (attention.c) */
    size_t kv_bytes;          /* both K/V regions */
    float *router;            /* [chunk, E] router logits */
    int32_t *topk_idx;        /* [chunk, K] */
    float *topk_w;            /* [chunk, K] */
    int32_t *counts;          /* [E] tokens per expert */
    int32_t *offsets;         /* [E + 1] prefix sums: expert e owns slots offsets[e].. */
    int32_t *fill;            /* [E] */
    int32_t *slot_of;         /* [chunk, K] dispatch slot of (token, choice) */
    int32_t *slot_tok;        /* [chunk*K] the token row of each slot */
    int slots;                /* min(chunk*K, max(chunk, COLIBRI_MOE_SLOTS)): rows of xs/gate/up */
    float *xs;                /* [slots, Dp] one expert pass's slots, grouped per expert */
    float *gate, *up;         /* [slots, F] */
    float *ys;                /* [chunk*K, Dp] expert outputs, in slot order */
    float *sgate, *sup;       /* [chunk, Fs] shared expert */
    float *sout;              /* [chunk, Dp] */
    int8_t *xq;               /* [slots + chunk, max_cols] int8 activations (int8_activations):
                                 rows 0..slots-1 an expert pass's inputs, slots.. the rest */
    float *xqs;               /* [slots + chunk] their scales */
    float *scratch;           /* [threads, 2 * max_cols] converted weight rows */
    float *scores;            /* [threads, max_seq_len] attention scores */
    size_t max_cols;
    float *lstage;            /* engine: [lstage_rows, V] the LM head's rows of a pass over several
                                 sequences, copied out to each one's logits (else NULL) */
    int lstage_rows;
    float *dump;              /* COLIBRI_DEBUG: [max_seq_len, L, 2K + E] routing records */
    int32_t *dump_calls;      /* COLIBRI_DEBUG: [max_seq_len] forward call index per position */
} colibri_buffers;

struct colibri_ctx {
    struct colibri_model *model; /* shared, read-only after load; one reference held */
    colibri_options opt;
    colibri_pool pool;
    int pool_started;
    void *arena;
    size_t arena_bytes;
    colibri_buffers b;
    int pos;                  /* tokens in the KV cache */
    int engine;               /* a batch engine's context (colibri_engine): buffers and threads,
                                 no caches of its own */
    /* one pass's sequences (colibri_batch): outside the arena, so a sequence context's arena
     * is what the kit's footprint counts */
    int32_t row_seq[COLIBRI_CHUNK];
    colibri_batch_seq seqs[COLIBRI_CHUNK];
    int calls;                /* forward calls since reset (routing dump) */
    int use_q8;               /* int8 activations for int8 weights */
    int mx_a8;                /* 8-bit block activations for mxfp4 weights (--int8-act) */
    int q4_packed;            /* the kernels may read the model's packed copy (cpu/q4_pack.h) */
    const char *simd;
    colibri_cuda *cuda;       /* non-NULL when the CUDA backend runs this context */
    char fallback[192];
    char err[512];
    /* real-time mode (colibri_options) */
    int cpus[64];             /* opt.cpus, owned (opt.cpus points here) */
    int memory_locked;
    size_t locked_bytes;
    unsigned long long caller_minflt, caller_majflt; /* worker 0's faults inside forward */
    colibri_step_times steps; /* an engine's: where its passes' time went (forward.c, gen_batch.c) */
    /* stage times (colibri_set_stage_timing): read only when stage_on */
    int stage_on;
    double stage_t;                           /* the last stage boundary, ms */
    double stage_ms[COLIBRI_STAGE_COUNT];
};

struct colibri_engine {
    colibri_ctx *ctx;         /* engine == 1: the pool and chunk buffers every batch runs on */
    int cuda;                 /* the sequences run on CUDA: each its own pass (the fallback) */
    char unbatched[160];      /* colibri_engine_unbatched's reason */
    int prompt_rows;          /* colibri_engine_set_prompt_rows: 0, or the prompts' rows a step
                                 while some generation decodes */
};

/* api.c: COLIBRI_OK, or the error of running a sequence_only context's passes on itself. */
colibri_status colibri_check_runs_itself(colibri_ctx *ctx);

/* arena.c: size and carve the buffers for this model, thread count and KV storage. With base
 * NULL only the size is computed; with base, b->cache (n_layers entries) is filled too. An
 * engine's arena has no caches (its sequences bring theirs) and the LM head's stage instead; a
 * sequence_only context's has the caches and no pass buffers (chunk 0, no thread scratch). */
size_t colibri_arena_plan(const struct colibri_model *m, int threads, int q8, int kv_f16,
                          int engine, int sequence_only, colibri_buffers *b, uint8_t *base);

/* forward.c: one CPU pass over the tokens of one or more sequences (sum of n <= chunk, each
 * sequence once), run on eng's pool and buffers; each sequence's position advances by its n.
 * logits: NULL, or rows lrow0..n-1 of that item (vocab floats each; lrow0 = n - 1: the last
 * token only). A pass over several sequences needs eng's LM head stage (an engine). */
typedef struct {
    colibri_ctx *seq;
    const int32_t *ids;
    int n;
    float *logits;
    int lrow0;
} colibri_pass_item;

void colibri_cpu_pass(colibri_ctx *eng, const colibri_pass_item *items, int n_items);

/* api.c: a batch (colibri_forward_batch's items, checked first) run on eng's buffers and pool,
 * or, cuda, each item as its own colibri_forward(_last) on its CUDA context. eng is an engine's
 * context, or a sequence context running itself (colibri_generate). */
colibri_status colibri_batch_run(colibri_ctx *eng, int cuda, const colibri_batch_item *it, int n);

/* forward.c: a stage boundary: the time since the previous one goes to `stage`. The test of
 * stage_on is the whole cost when timing is off. */
void colibri_stage_clock(colibri_ctx *ctx, int stage);
static inline void colibri_stage_mark(colibri_ctx *ctx, int stage) {
    if (ctx->stage_on) colibri_stage_clock(ctx, stage);
}

/* api.c: set ctx's last error (printf format) and return s. */
/* seq_state.c: every layer reads its own cache again (colibri_reset, a restore) */
void colibri_seq_unshare(colibri_ctx *ctx);

colibri_status colibri_ctx_fail(colibri_ctx *ctx, colibri_status s, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

#endif
