/* The one arena: every working buffer of a context is carved from a single allocation made at
 * init, sized from the model geometry and the thread count. colibri_forward allocates nothing.
 * The same function computes the size (base == NULL) and carves the buffers (base != NULL), so
 * the two can never disagree. */
#include "context.h"
#include "layers/kinds.h"

#include "colibri_config.h"

typedef struct {
    uint8_t *base;
    size_t used;
} carver;

/* Reserve `n` elements of `size` bytes, 64-byte aligned (a cache line; every row of Dp floats
 * is also 64-byte aligned because Dp is a multiple of 16). */
static void *take(carver *c, size_t n, size_t size) {
    size_t at = (c->used + 63) & ~(size_t)63;
    c->used = at + n * size;
    return c->base ? c->base + at : NULL;
}

static size_t max3(size_t a, size_t b, size_t c) {
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }

/* What layer l keeps per sequence: its mixer's cache plus its FFN's (none has one yet); what a
 * pass needs: the larger of the two (they run one after the other). */
static void layer_need(const struct colibri_model *m, uint32_t l, colibri_cache_need *need) {
    colibri_cache_need f;
    m->layers[l].mixer->cache(m, l, need);
    m->layers[l].ffn->cache(m, l, &f);
    need->kv_positions += f.kv_positions;
    need->kv_staged |= f.kv_staged;
    need->state_floats += f.state_floats;
    need->scratch_floats = max2(need->scratch_floats, f.scratch_floats);
    need->in_cols = max2(need->in_cols, f.in_cols);
}

/* Rows of the LM head an engine computes at once for a pass over several sequences: the head is
 * read once per group of this many sequences' last tokens. */
#define LSTAGE_ROWS 16

size_t colibri_arena_plan(const struct colibri_model *m, int threads, int q8, int kv_f16,
                          int engine, int sequence_only, colibri_buffers *b, uint8_t *base) {
    carver c = {base, 0};
    /* a sequence-only context never runs a pass itself (api.c refuses it): every per-row buffer
     * and the threads' scratch are empty, the regions keep their order */
    size_t T = sequence_only ? 0 : m->max_seq_len < COLIBRI_CHUNK ? m->max_seq_len : COLIBRI_CHUNK;
    if (sequence_only) threads = 0;
    size_t dp = m->embed_dim_pad, qd = (size_t)m->n_heads * m->head_dim;
    size_t kvd = (size_t)m->n_kv_heads * m->head_dim, E = m->num_experts, K = m->top_k;
    size_t F = m->expert_size, Fs = m->shared_expert_size, S = m->max_seq_len, L = m->n_layers;
    size_t kv_size = kv_f16 ? sizeof(uint16_t) : sizeof(float); /* f16: half the bytes */
    size_t max_cols = max3(dp, qd, max3(F, Fs, 16)), mix = 0;
    for (uint32_t l = 0; l < L; l++) { /* the kinds' pass needs (kinds.h) */
        colibri_cache_need need;
        layer_need(m, l, &need);
        max_cols = max2(max_cols, need.in_cols);
        mix = max2(mix, need.scratch_floats);
    }

    b->chunk = (int)T;
    b->max_cols = max_cols;
    b->x = take(&c, T * dp, sizeof(float));
    b->h = take(&c, T * dp, sizeof(float));
    b->q = take(&c, T * qd, sizeof(float));
    b->k = take(&c, T * kvd, sizeof(float));
    b->v = take(&c, T * kvd, sizeof(float));
    b->att = take(&c, T * qd, sizeof(float));
    b->tmp = take(&c, T * dp, sizeof(float));
    b->rope = take(&c, T * m->head_dim, sizeof(float));
    b->pos = take(&c, T, sizeof(int32_t));
    b->mix = take(&c, T * mix, sizeof(float));
    b->mix_floats = mix;
    /* Each layer's cache as its kinds ask (kinds.h): K rows of every layer, then V rows, then
     * the fixed-size states (recurrent kinds). */
    size_t rows = 0, states = 0;
    int staged = 0;
    for (uint32_t l = 0; l < L; l++) {
        colibri_cache_need need;
        layer_need(m, l, &need);
        rows += engine ? 0 : need.kv_positions; /* an engine's sequences bring their caches */
        states += engine ? 0 : need.state_floats;
        staged |= need.kv_staged;
    }
    /* a pass's K/V rows on their way to a ring shorter than the context (one for every layer) */
    b->kstage = take(&c, staged ? T * kvd : 0, kv_size);
    b->vstage = take(&c, staged ? T * kvd : 0, kv_size);
    b->kv_f16 = kv_f16;
    b->kv_bytes = 2 * rows * kvd * kv_size;
    b->kcache = take(&c, rows * kvd, kv_size);
    b->vcache = take(&c, rows * kvd, kv_size);
    b->state = take(&c, states, sizeof(float));
    b->state_bytes = states * sizeof(float);
    for (size_t l = 0, at = 0, st = 0; base && !engine && l < L; l++) {
        colibri_cache_need need;
        layer_need(m, (uint32_t)l, &need);
        b->cache[l] = (colibri_layer_cache){.k = (uint8_t *)b->kcache + at * kvd * kv_size,
                                            .v = (uint8_t *)b->vcache + at * kvd * kv_size,
                                            .kv_positions = need.kv_positions,
                                            .kv_staged = need.kv_staged,
                                            .state = need.state_floats ? b->state + st : NULL,
                                            .state_floats = need.state_floats};
        at += need.kv_positions;
        st += need.state_floats;
    }
    b->router = take(&c, T * E, sizeof(float));
    b->topk_idx = take(&c, T * K, sizeof(int32_t));
    b->topk_w = take(&c, T * K, sizeof(float));
    b->counts = take(&c, E, sizeof(int32_t));
    b->offsets = take(&c, E + 1, sizeof(int32_t));
    b->fill = take(&c, E, sizeof(int32_t));
    b->slot_of = take(&c, T * K, sizeof(int32_t));
    b->slot_tok = take(&c, T * K, sizeof(int32_t));
    size_t budget = T > COLIBRI_MOE_SLOTS ? T : COLIBRI_MOE_SLOTS; /* one expert always fits */
    size_t slots = T * K < budget ? T * K : budget;
    b->slots = (int)slots;
    b->xs = take(&c, slots * dp, sizeof(float));
    b->gate = take(&c, slots * F, sizeof(float));
    b->up = take(&c, slots * F, sizeof(float));
    b->ys = take(&c, T * K * dp, sizeof(float));
    b->sgate = take(&c, T * Fs, sizeof(float));
    b->sup = take(&c, T * Fs, sizeof(float));
    b->sout = take(&c, T * dp, sizeof(float));
    /* int8 activations: rows 0..slots-1 for an expert pass's inputs, slots.. for the rest */
    b->xq = take(&c, q8 ? (slots + T) * max_cols : 0, sizeof(int8_t));
    b->xqs = take(&c, q8 ? slots + T : 0, sizeof(float));
    b->scratch = take(&c, (size_t)threads * 2 * max_cols, sizeof(float)); /* two rows each */
    /* a thread's attention unit: up to COLIBRI_ATT_HEADS query heads' scores (layers/kinds.h) */
    b->scores = take(&c, (size_t)threads * colibri_attention_score_rows(m) * S, sizeof(float));
    /* an engine's LM head stage (LSTAGE_ROWS x vocab floats); a sequence context has none, so
     * its arena is what it was before batching (the kit's footprint counts it byte for byte) */
    b->lstage_rows = engine ? (int)(T < LSTAGE_ROWS ? T : LSTAGE_ROWS) : 0;
    b->lstage = engine ? take(&c, (size_t)b->lstage_rows * m->vocab_size, sizeof(float)) : NULL;
#ifdef COLIBRI_DEBUG
    b->dump = take(&c, engine ? 0 : S * L * (2 * K + E), sizeof(float));
    b->dump_calls = take(&c, engine ? 0 : S, sizeof(int32_t));
#else
    b->dump = NULL;
    b->dump_calls = NULL;
#endif
    return (c.used + 63) & ~(size_t)63;
}
