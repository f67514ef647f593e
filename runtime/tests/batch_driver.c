/* Checks of continuous batching (docs/runtime.md, "Batching"), run by tests/test_batch.py on
 * several models (built with the host cc; not part of the product):
 *
 *   batch_driver MODEL THREADS [f16] [int8act] [solo]
 *
 * 1. colibri_forward_batch: four sequences of different lengths (1, 9, 70, 200 tokens) give
 *    bitwise the logits each gives alone (one colibri_forward call), batched all at once, joined
 *    one by one in random-sized chunks in a rotating order, and with last-token logits only.
 * 2. colibri_gen_step: four sampled generations (their own seeds, temperatures, lengths), on
 *    sequence_only contexts (which refuse passes of their own), give the ids colibri_generate
 *    gives each alone, joining at different steps in two orders; the
 *    same with colibri_engine_set_prompt_rows(7), where no step while a generation decodes
 *    feeds more than 7 prompt ids, some step feeds exactly 7, and (reverse order: the 200-id
 *    prompt first, alone) a step with nobody decoding still feeds more; 0..512 only.
 * 3. colibri_seq_save / restore: a prefix restored into another context and continued gives the
 *    bits of computing everything (also a shorter prefix of it, where the model allows).
 *    colibri_seq_share: two contexts continuing one shared snapshot in one batch, the same bits;
 *    the rows read in place, let go of at a reset.
 * 4. Refusals: one context twice, another KV type, past max_seq_len; nothing changes.
 * 5. Passes carried several sequences at once (layer 0's mixer counts them). With `solo` the
 *    last layer's mixer is a copy of its kind that says it has no multi-sequence pass (kinds.h
 *    multi_seq 0, as a new kind's row that leaves the field out): every check above must still
 *    pass, no pass may carry two sequences, and colibri_engine_unbatched names that layer.
 * Prints "ok   ..." or "FAIL ..." per check, then "batch: N failure(s)". */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "core/model.h" /* the layers' kind pointers: the driver wraps them (check 5) */

#define NSEQ 4
static const int LENS[NSEQ] = {1, 9, 70, 200}; /* 280 rows: more than a 256-position model's pass */
static int failures;
static uint32_t rng = 2463534242u;

static uint32_t next_rand(void) { /* xorshift32: the same sequences on every run */
    rng ^= rng << 13;
    rng ^= rng >> 17;
    rng ^= rng << 5;
    return rng;
}

static void check(int ok, const char *what) {
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (!ok) failures++;
}

static colibri_options options(int threads, int f16, int int8act) {
    colibri_options o;
    colibri_default_options(&o);
    o.threads = threads;
    o.backend = COLIBRI_BACKEND_CPU;
    o.kv_dtype = f16 ? COLIBRI_KV_F16 : COLIBRI_KV_F32;
    o.int8_activations = int8act;
    return o;
}

/* Sequence i's ids and the logits of each alone (one colibri_forward on a fresh context). */
static int32_t *ids[NSEQ];
static float *alone[NSEQ];

static void reference(colibri_model *m, const colibri_options *o, uint32_t V, int S) {
    colibri_ctx *c;
    if (colibri_ctx_new(&c, m, o)) exit(3);
    for (int i = 0; i < NSEQ; i++) {
        int n = LENS[i] < S ? LENS[i] : S;
        ids[i] = malloc(sizeof(int32_t) * (size_t)n);
        alone[i] = malloc(sizeof(float) * (size_t)n * V);
        for (int j = 0; j < n; j++) ids[i][j] = (int32_t)(next_rand() % V);
        colibri_reset(c);
        if (colibri_forward(c, ids[i], n, alone[i])) exit(4);
    }
    colibri_free(c);
}

static int len_of(int i, int S) { return LENS[i] < S ? LENS[i] : S; }

static void check_forward_batch(colibri_model *m, const colibri_options *o, uint32_t V, int S) {
    colibri_engine *e;
    colibri_ctx *c[NSEQ];
    colibri_options one = *o;
    one.threads = 1; /* a sequence's own threads are never used by the engine */
    if (colibri_engine_new(&e, m, o)) exit(5);
    for (int i = 0; i < NSEQ; i++)
        if (colibri_ctx_new(&c[i], m, &one)) exit(6);
    float *got[NSEQ];
    for (int i = 0; i < NSEQ; i++) got[i] = malloc(sizeof(float) * (size_t)len_of(i, S) * V);

    /* all at once: 280 rows, cut where a pass (256 rows: min(max_seq_len, 512)) is full */
    colibri_batch_item it[NSEQ];
    for (int i = 0; i < NSEQ; i++) it[i] = (colibri_batch_item){c[i], ids[i], len_of(i, S), got[i], 1};
    int ok = colibri_forward_batch(e, it, NSEQ) == COLIBRI_OK;
    for (int i = 0; ok && i < NSEQ; i++)
        ok = !memcmp(got[i], alone[i], sizeof(float) * (size_t)len_of(i, S) * V);
    check(ok, "forward_batch: four sequences in one call == each alone, bitwise");

    /* joined one by one, each step a random-sized chunk of each active sequence, the items in a
     * rotating order */
    for (int i = 0; i < NSEQ; i++) colibri_reset(c[i]);
    int done[NSEQ] = {0}, step = 0, active;
    do {
        int ni = 0;
        active = 0;
        for (int k = 0; k < NSEQ; k++) {
            int i = (k + step) % NSEQ;
            if (i > step || done[i] >= len_of(i, S)) continue;
            int rest = len_of(i, S) - done[i], n = 1 + (int)(next_rand() % 20);
            if (n > rest) n = rest;
            it[ni++] = (colibri_batch_item){c[i], ids[i] + done[i], n, got[i] + (size_t)done[i] * V, 1};
            done[i] += n;
            active = 1;
        }
        if (ni && colibri_forward_batch(e, it, ni) != COLIBRI_OK) ok = 0;
        step++;
    } while (active || step < NSEQ);
    for (int i = 0; ok && i < NSEQ; i++)
        ok = !memcmp(got[i], alone[i], sizeof(float) * (size_t)len_of(i, S) * V);
    check(ok, "forward_batch: joining one by one in random chunks, rotating order == alone");

    /* last-token logits only, in reverse order */
    for (int i = 0; i < NSEQ; i++) {
        colibri_reset(c[i]);
        it[NSEQ - 1 - i] = (colibri_batch_item){c[i], ids[i], len_of(i, S), got[i], 0};
    }
    ok = colibri_forward_batch(e, it, NSEQ) == COLIBRI_OK;
    for (int i = 0; ok && i < NSEQ; i++)
        ok = !memcmp(got[i], alone[i] + (size_t)(len_of(i, S) - 1) * V, sizeof(float) * V);
    check(ok, "forward_batch: last-token logits, reverse order == the last row alone");

    /* refusals change nothing */
    colibri_runtime_info ri;
    colibri_get_runtime_info(c[0], &ri);
    int pos0 = ri.position;
    colibri_batch_item twice[2] = {{c[0], ids[0], 1, got[0], 0}, {c[0], ids[0], 1, got[0], 0}};
    colibri_status st = colibri_forward_batch(e, twice, 2);
    colibri_get_runtime_info(c[0], &ri);
    check(st == COLIBRI_E_INVALID_ARG && ri.position == pos0 &&
          strstr(colibri_engine_last_error(e), "twice"), "forward_batch: one context twice is refused");
    colibri_options other = one;
    other.kv_dtype = o->kv_dtype == COLIBRI_KV_F16 ? COLIBRI_KV_F32 : COLIBRI_KV_F16;
    colibri_ctx *odd;
    if (colibri_ctx_new(&odd, m, &other)) exit(7);
    colibri_batch_item mixed[2] = {{c[0], ids[0], 1, got[0], 0}, {odd, ids[0], 1, got[1], 0}};
    st = colibri_forward_batch(e, mixed, 2);
    colibri_get_runtime_info(c[0], &ri);
    check(st == COLIBRI_E_INVALID_ARG && ri.position == pos0,
          "forward_batch: a context with another KV type is refused, nothing computed");
    int32_t *many = calloc((size_t)S + 1, sizeof *many);
    colibri_get_runtime_info(c[1], &ri);
    int pos1 = ri.position;
    colibri_batch_item longer[2] = {{c[1], ids[0], 1, got[1], 0}, {c[2], many, S + 1, NULL, 0}};
    st = colibri_forward_batch(e, longer, 2);
    colibri_get_runtime_info(c[1], &ri);
    check(st == COLIBRI_E_SEQ_TOO_LONG && ri.position == pos1,
          "forward_batch: an item past max_seq_len is refused, nothing computed");
    free(many);
    colibri_free(odd);
    for (int i = 0; i < NSEQ; i++) {
        colibri_free(c[i]);
        free(got[i]);
    }
    colibri_engine_free(e);
}

/* Four sampled generations: their own seeds, temperatures and lengths. */
static void gen_params(int i, colibri_generate_params *p, int S) {
    colibri_default_generate_params(p);
    p->prompt = ids[i];
    p->n_prompt = len_of(i, S) < S - 48 ? len_of(i, S) : S - 48;
    p->max_new = 12 + 9 * i;
    p->sampling.temperature = i == 0 ? 0.0f : 0.5f + 0.3f * (float)i;
    p->sampling.top_p = i == 2 ? 0.9f : 1.0f;
    p->sampling.top_k = i == 3 ? 20 : 0;
    p->sampling.seed = 1000u + (unsigned)i;
    p->ignore_eos = 1;
}

static void check_gen_step(colibri_model *m, const colibri_options *o, int S) {
    int32_t want[NSEQ][64], got[NSEQ][64];
    colibri_generate_result wr[NSEQ];
    colibri_ctx *c[NSEQ];
    colibri_options one = *o;
    one.threads = 1;
    one.sequence_only = 1; /* the engine runs every pass: the generations' contexts hold caches */
    for (int i = 0; i < NSEQ; i++) {
        colibri_generate_params p;
        gen_params(i, &p, S);
        if (colibri_ctx_new(&c[i], m, o)) exit(8);
        if (colibri_generate(c[i], &p, want[i], &wr[i])) exit(9);
        colibri_free(c[i]);
        if (colibri_ctx_new(&c[i], m, &one)) exit(10);
    }
    { /* a sequence-only context runs no pass of its own, and is smaller than one that does */
        colibri_generate_params p;
        gen_params(0, &p, S);
        colibri_generate_result r;
        float lg[1];
        colibri_ctx *full;
        colibri_runtime_info a, b;
        if (colibri_ctx_new(&full, m, o)) exit(14);
        colibri_get_runtime_info(c[0], &a);
        colibri_get_runtime_info(full, &b);
        colibri_free(full);
        colibri_options two = one;
        two.threads = 2;
        colibri_ctx *bad = NULL;
        colibri_engine *bad_engine = NULL;
        check(colibri_forward(c[0], p.prompt, 1, lg) == COLIBRI_E_INVALID_ARG &&
                  strstr(colibri_last_error(c[0]), "sequence_only") != NULL &&
                  colibri_generate(c[0], &p, got[0], &r) == COLIBRI_E_INVALID_ARG &&
                  colibri_ctx_new(&bad, m, &two) == COLIBRI_E_INVALID_ARG && !bad &&
                  colibri_engine_new(&bad_engine, m, &one) == COLIBRI_E_INVALID_ARG && !bad_engine &&
                  a.arena_bytes < b.arena_bytes,
              "gen_step: a sequence_only context refuses passes of its own, holds less");
    }
    colibri_engine *e;
    if (colibri_engine_new(&e, m, o)) exit(11);
    check(colibri_engine_set_prompt_rows(e, -1) == COLIBRI_E_INVALID_ARG &&
              colibri_engine_set_prompt_rows(e, 513) == COLIBRI_E_INVALID_ARG &&
              strstr(colibri_engine_last_error(e), "prompt rows 513") != NULL,
          "gen_step: prompt rows outside 0..512 refused with a message");
    enum { CAP = 7 };
    for (int variant = 0; variant < 4; variant++) {
        const int order = variant & 1, cap = variant >= 2 ? CAP : 0;
        if (colibri_engine_set_prompt_rows(e, cap) != COLIBRI_OK) exit(13);
        colibri_gen *g[NSEQ] = {0};
        int ok = 1, steps = 0, live, capped_ok = 1, hit_cap = 0, over_alone = 0;
        do { /* generation i joins at step 3 * i (order 1: in reverse) */
            colibri_gen *run[NSEQ];
            int n = 0, before[NSEQ], n_prompt[NSEQ], decoding = 0;
            live = 0;
            for (int k = 0; k < NSEQ; k++) {
                int i = order ? NSEQ - 1 - k : k;
                if (!g[i] && steps >= 3 * k) {
                    colibri_generate_params p;
                    gen_params(i, &p, S);
                    if (colibri_gen_new(&g[i], c[i], &p, got[i], 0)) exit(12);
                }
                if (g[i] && !colibri_gen_done(g[i])) {
                    colibri_generate_params p;
                    gen_params(i, &p, S);
                    before[n] = colibri_gen_position(g[i]);
                    n_prompt[n] = p.n_prompt;
                    decoding += before[n] >= p.n_prompt;
                    run[n++] = g[i];
                }
                if (!g[i] || !colibri_gen_done(g[i])) live = 1;
            }
            if (n && colibri_gen_step(e, run, n) != COLIBRI_OK) ok = 0;
            int fed = 0; /* prompt ids this step put in the caches */
            for (int k = 0; k < n; k++)
                if (before[k] < n_prompt[k]) {
                    int after = colibri_gen_position(run[k]);
                    fed += (after < n_prompt[k] ? after : n_prompt[k]) - before[k];
                }
            if (cap && decoding) capped_ok &= fed <= cap, hit_cap |= fed == cap;
            if (cap && !decoding) over_alone |= fed > cap;
            steps++;
        } while (live && steps < 10000);
        if (cap)
            check(capped_ok && hit_cap && (order == 0 || over_alone),
                  order ? "gen_step: prompt rows 7: at most 7 prompt ids a step while one decodes, "
                          "the whole pass with nobody decoding"
                        : "gen_step: prompt rows 7: at most 7 prompt ids a step while one decodes");
        for (int i = 0; i < NSEQ; i++) {
            colibri_generate_result r;
            ok &= colibri_gen_result(g[i], &r) == COLIBRI_OK && r.n_new == wr[i].n_new &&
                  r.finish == wr[i].finish && !memcmp(got[i], want[i], sizeof(int32_t) * (size_t)r.n_new);
            colibri_gen_free(g[i]);
        }
        if (!cap)
            check(ok, order ? "gen_step: sampled generations joining in reverse order == colibri_generate alone"
                            : "gen_step: sampled generations joining one by one == colibri_generate alone");
        else
            check(ok, order ? "gen_step: prompt rows 7, joining in reverse order == colibri_generate alone"
                            : "gen_step: prompt rows 7, joining one by one == colibri_generate alone");
    }
    for (int i = 0; i < NSEQ; i++) colibri_free(c[i]);
    colibri_engine_free(e);
}

static void check_seq_state(colibri_model *m, const colibri_options *o, uint32_t V, int S) {
    int n = len_of(3, S), cut = n * 2 / 3;
    colibri_ctx *a, *b;
    if (colibri_ctx_new(&a, m, o) || colibri_ctx_new(&b, m, o)) exit(13);
    float *got = malloc(sizeof(float) * (size_t)n * V);
    colibri_forward(a, ids[3], cut, got);
    size_t len = colibri_seq_state_bytes(a), wrote = 0;
    void *snap = malloc(len);
    int ok = colibri_seq_save(a, snap, len, &wrote) == COLIBRI_OK && wrote == len &&
             colibri_seq_state_pos(snap, len) == cut;
    ok = ok && colibri_seq_restore(b, snap, len, cut) == COLIBRI_OK &&
         colibri_forward(b, ids[3] + cut, n - cut, got + (size_t)cut * V) == COLIBRI_OK &&
         !memcmp(got + (size_t)cut * V, alone[3] + (size_t)cut * V, sizeof(float) * (size_t)(n - cut) * V);
    check(ok, "seq_save/restore: a restored prefix continued == computed at once, bitwise");
    int keep = cut / 2;
    colibri_status st = colibri_seq_restore(b, snap, len, keep);
    if (colibri_model_can_truncate(m)) {
        ok = st == COLIBRI_OK &&
             colibri_forward(b, ids[3] + keep, n - keep, got + (size_t)keep * V) == COLIBRI_OK &&
             !memcmp(got + (size_t)keep * V, alone[3] + (size_t)keep * V,
                     sizeof(float) * (size_t)(n - keep) * V);
        check(ok, "seq_restore: a shorter prefix of the snapshot continued == computed at once");
    } else {
        check(st == COLIBRI_E_UNSUPPORTED, "seq_restore: a shorter prefix is refused (ring or state)");
    }
    ((unsigned char *)snap)[0] ^= 1;
    check(colibri_seq_restore(b, snap, len, cut) == COLIBRI_E_INVALID_ARG,
          "seq_restore: a damaged snapshot is refused");
    free(snap);
    free(got);
    colibri_free(a);
    colibri_free(b);
}

/* Check 3b: colibri_seq_share. Two contexts share one snapshot of a prefix and continue in one
 * batch: the bits of computing everything, and a snapshot of a sharing context is byte for byte
 * the one of a context that computed it all. The rows are read in place (a snapshot changed
 * after the share changes what a model with a full-attention layer computes), and a reset lets
 * go of them (the changed snapshot no longer matters). */
static int full_layers(const colibri_model *m) {
    int n = 0;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        colibri_cache_need need;
        m->layers[l].mixer->cache(m, l, &need);
        n += need.kv_positions >= m->max_seq_len && !need.kv_staged;
    }
    return n;
}

static void check_seq_share(colibri_model *m, const colibri_options *o, uint32_t V, int S) {
    int n = len_of(3, S), cut = n * 2 / 3, rest = n - cut;
    colibri_engine *e;
    colibri_ctx *a, *b[2];
    colibri_options one = *o;
    one.threads = 1;
    if (colibri_engine_new(&e, m, o) || colibri_ctx_new(&a, m, o) || colibri_ctx_new(&b[0], m, &one) ||
        colibri_ctx_new(&b[1], m, &one))
        exit(14);
    float *got[2], *prefix = malloc(sizeof(float) * (size_t)n * V);
    for (int i = 0; i < 2; i++) got[i] = malloc(sizeof(float) * (size_t)rest * V);
    colibri_forward(a, ids[3], cut, prefix);
    size_t len = colibri_seq_state_bytes(a), wrote = 0;
    uint8_t *snap = malloc(len), *keep = malloc(len);
    int ok = colibri_seq_save(a, snap, len, &wrote) == COLIBRI_OK;
    memcpy(keep, snap, len);
    colibri_batch_item it[2];
    for (int i = 0; i < 2; i++) {
        ok = ok && colibri_seq_share(b[i], snap, len, cut) == COLIBRI_OK;
        it[i] = (colibri_batch_item){b[i], ids[3] + cut, rest, got[i], 1};
    }
    ok = ok && colibri_forward_batch(e, it, 2) == COLIBRI_OK;
    for (int i = 0; i < 2; i++)
        ok = ok && !memcmp(got[i], alone[3] + (size_t)cut * V, sizeof(float) * (size_t)rest * V);
    check(ok, "seq_share: two contexts sharing one snapshot, continued in one batch == computed at once");
    colibri_forward(a, ids[3] + cut, rest, prefix);
    size_t full = colibri_seq_state_bytes(a);
    uint8_t *sa = malloc(full), *sb = malloc(full);
    ok = full == colibri_seq_state_bytes(b[0]) && colibri_seq_save(a, sa, full, &wrote) == COLIBRI_OK &&
         colibri_seq_save(b[0], sb, full, &wrote) == COLIBRI_OK && !memcmp(sa, sb, full);
    check(ok, "seq_share: a sharing context's snapshot == the one of a context that computed it all");
    /* the rows after the header, changed: a shared layer reads them in place */
    ok = colibri_seq_share(b[0], snap, len, cut) == COLIBRI_OK;
    for (size_t i = 64; i < len; i++) snap[i] ^= 0x40;
    ok = ok && colibri_forward(b[0], ids[3] + cut, rest, got[0]) == COLIBRI_OK;
    int same = !memcmp(got[0], alone[3] + (size_t)cut * V, sizeof(float) * (size_t)rest * V);
    check(ok && same == !full_layers(m),
          full_layers(m) ? "seq_share: the rows are read in place (a changed snapshot changes the logits)"
                         : "seq_share: no full-attention layer, nothing read in place");
    ok = colibri_reset(b[0]) == COLIBRI_OK && colibri_forward(b[0], ids[3], n, prefix) == COLIBRI_OK &&
         !memcmp(prefix, alone[3], sizeof(float) * (size_t)n * V);
    check(ok, "seq_share: after a reset the snapshot is not read (the changed one changes nothing)");
    memcpy(snap, keep, len);
    free(sa);
    free(sb);
    free(snap);
    free(keep);
    free(prefix);
    for (int i = 0; i < 2; i++) {
        free(got[i]);
        colibri_free(b[i]);
    }
    colibri_free(a);
    colibri_engine_free(e);
}

/* Check 5: layer 0's mixer through a counting copy of its kind; with solo, the last layer's
 * mixer a copy that has no multi-sequence pass. */
static colibri_layer_kind counted, unbatched;
static void (*layer0_forward)(struct colibri_ctx *, int, const colibri_batch *);
static int multi_passes;

static void counted_forward(struct colibri_ctx *ctx, int l, const colibri_batch *bt) {
    multi_passes += bt->n_seqs > 1;
    layer0_forward(ctx, l, bt);
}

static void wrap_kinds(colibri_model *m, int solo) {
    colibri_layer *first = &m->layers[0], *last = &m->layers[m->n_layers - 1];
    if (solo) {
        unbatched = *last->mixer;
        unbatched.multi_seq = 0;
        last->mixer = &unbatched;
    }
    counted = *first->mixer;
    layer0_forward = counted.forward;
    counted.forward = counted_forward;
    first->mixer = &counted;
}

static void check_unbatched(colibri_model *m, const colibri_options *o, int solo) {
    colibri_engine *e;
    if (colibri_engine_new(&e, m, o)) exit(14);
    const char *why = colibri_engine_unbatched(e);
    if (solo) {
        char want[96];
        snprintf(want, sizeof want, "layer %u's %s kind", m->n_layers - 1, unbatched.name);
        check(why && strstr(why, want) && multi_passes == 0,
              "solo: a kind without a multi-sequence pass: one sequence per pass, named");
    } else {
        check(!why && multi_passes > 0, "passes carried several sequences at once");
    }
    colibri_engine_free(e);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: batch_driver MODEL THREADS [f16] [int8act] [solo]\n");
        return 2;
    }
    int f16 = 0, int8act = 0, solo = 0;
    for (int i = 3; i < argc; i++) {
        f16 |= !strcmp(argv[i], "f16");
        int8act |= !strcmp(argv[i], "int8act");
        solo |= !strcmp(argv[i], "solo");
    }
    colibri_options o = options(atoi(argv[2]), f16, int8act);
    char err[512] = "";
    o.error = err;
    o.error_len = sizeof err;
    colibri_model *m;
    if (colibri_model_load(&m, argv[1], &o)) {
        fprintf(stderr, "%s\n", err);
        return 3;
    }
    colibri_model_info mi;
    colibri_model_get_info(m, &mi);
    wrap_kinds(m, solo);
    reference(m, &o, mi.vocab_size, (int)mi.max_seq_len);
    check_forward_batch(m, &o, mi.vocab_size, (int)mi.max_seq_len);
    check_gen_step(m, &o, (int)mi.max_seq_len);
    check_unbatched(m, &o, solo); /* before check_seq_state: its passes are one sequence's */
    check_seq_state(m, &o, mi.vocab_size, (int)mi.max_seq_len);
    check_seq_share(m, &o, mi.vocab_size, (int)mi.max_seq_len);
    for (int i = 0; i < NSEQ; i++) {
        free(ids[i]);
        free(alone[i]);
    }
    colibri_model_free(m);
    printf("batch: %d failure(s)\n", failures);
    return failures != 0;
}
