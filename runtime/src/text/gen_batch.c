/* Generations stepped together (colibri.h, "Generations stepped together"): the generation loop
 * of colibri_generate cut into steps, so that one pass can carry the next tokens of several
 * generations (continuous batching, docs/runtime.md "Batching"). colibri_generate is one such
 * generation stepped alone on its own context (generate.c), so a request's ids are those of
 * `colibri generate` whether it runs alone or among others.
 *
 * A step: every generation that is decoding puts its last sampled token in the pass (one row
 * each), then the generations still reading their prompt take the rest of the pass's rows in
 * the order given (a prompt longer than that continues at the next step). After the pass each
 * generation that has logits samples its next token and runs the output side (colibri_out:
 * text, stop strings, reasoning), whose callbacks run on the stepping thread. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "colibri.h"
#include "core/context.h"
#include "generate.h"

struct colibri_gen {
    colibri_ctx *seq;
    colibri_generate_params p;   /* the caller's, copied (colibri_out points at it) */
    int32_t *out;                /* the caller's max_new ids */
    int32_t *hist;               /* prompt + generated (the repetition penalty's history) */
    int nh;
    int fed;                     /* prompt ids in the cache */
    int32_t next;                /* the last sampled id: the next decode step's token */
    float *logits;               /* [vocab] */
    colibri_sampler *smp;
    colibri_out o;
    colibri_generate_result r;
    colibri_status status;
    int finished;
    double t0, t1;
};

double colibri_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static colibri_status check_params(colibri_ctx *ctx, const colibri_generate_params *p,
                                   int32_t *out, char *why, size_t why_len) {
    const struct colibri_model *m = ctx->model;
    const char *bad = colibri_sampling_check(&p->sampling);
    if (bad) return snprintf(why, why_len, "%s", bad), COLIBRI_E_INVALID_ARG;
    if (!p->prompt || p->n_prompt < 1)
        return snprintf(why, why_len, "generate needs a prompt of at least one token"),
               COLIBRI_E_INVALID_ARG;
    if (p->max_new < 0 || (p->max_new > 0 && !out))
        return snprintf(why, why_len, "max_new must be >= 0 with an output buffer"),
               COLIBRI_E_INVALID_ARG;
    if (p->n_stop_ids < 0 || (p->n_stop_ids > 0 && !p->stop_ids) || p->n_stop_strings < 0 ||
        (p->n_stop_strings > 0 && !p->stop_strings))
        return snprintf(why, why_len, "stop ids/strings: count without an array"),
               COLIBRI_E_INVALID_ARG;
    for (int s = 0; s < p->n_stop_strings; s++)
        if (!p->stop_strings[s] || !p->stop_strings[s][0])
            return snprintf(why, why_len, "stop string %d is empty", s), COLIBRI_E_INVALID_ARG;
    if (p->n_stop_strings > 0 && !p->detok)
        return snprintf(why, why_len, "stop strings need a detokenizer (the model's tokenizer)"),
               COLIBRI_E_INVALID_ARG;
    for (int i = 0; i < p->n_prompt; i++)
        if (p->prompt[i] < 0 || (uint32_t)p->prompt[i] >= m->vocab_size)
            return snprintf(why, why_len,
                            "token id %d at index %d is outside the vocabulary (0..%u)",
                            (int)p->prompt[i], i, m->vocab_size - 1),
                   COLIBRI_E_TOKEN_RANGE;
    if ((uint32_t)p->n_prompt > m->max_seq_len)
        return snprintf(why, why_len,
                        "the prompt has %d tokens, more than the context holds (max_seq_len %u)",
                        p->n_prompt, m->max_seq_len),
               COLIBRI_E_SEQ_TOO_LONG;
    return COLIBRI_OK;
}

static int is_stop(const colibri_generate_params *p, const struct colibri_model *m, int32_t id) {
    if (!p->ignore_eos && m->eos_token_id != COLIBRI_NO_INDEX && (uint32_t)id == m->eos_token_id)
        return 1;
    for (int i = 0; i < p->n_stop_ids; i++)
        if (p->stop_ids[i] == id) return 1;
    return 0;
}

void colibri_gen_free(colibri_gen *g) {
    if (!g) return;
    free(g->logits);
    free(g->hist);
    colibri_out_free(&g->o);
    colibri_sampler_free(g->smp);
    free(g);
}

colibri_status colibri_gen_new(colibri_gen **out, colibri_ctx *seq, const colibri_generate_params *p,
                               int32_t *out_ids, int keep) {
    if (!out) return COLIBRI_E_INVALID_ARG;
    *out = NULL;
    if (!seq || !p || seq->engine) return COLIBRI_E_INVALID_ARG;
    seq->err[0] = '\0';
    colibri_status s = check_params(seq, p, out_ids, seq->err, sizeof seq->err);
    if (s) return s;
    if (keep < 0 || keep >= p->n_prompt || (keep > 0 && keep != seq->pos))
        return colibri_ctx_fail(seq, COLIBRI_E_INVALID_ARG,
                                "keep %d: must be below the prompt's %d ids and equal the context's "
                                "position (%d): the prefix restored with colibri_seq_restore",
                                keep, p->n_prompt, seq->pos);
    uint32_t V = seq->model->vocab_size;
    colibri_gen *g = calloc(1, sizeof *g);
    if (!g) return COLIBRI_E_NO_MEMORY;
    g->seq = seq;
    g->p = *p;
    g->out = out_ids;
    g->r.stop_id = -1;
    g->r.stop_string = -1;
    g->hist = malloc(((size_t)p->n_prompt + (size_t)p->max_new) * sizeof *g->hist);
    g->logits = malloc((size_t)V * sizeof *g->logits); /* the last token's row only */
    s = colibri_out_begin(&g->o, seq, &g->p, g->hist ? g->hist + p->n_prompt : NULL, seq->err,
                          sizeof seq->err);
    if (!s && (!g->logits || !g->hist || colibri_sampler_new(&g->smp, V, &p->sampling) != COLIBRI_OK))
        s = colibri_ctx_fail(seq, COLIBRI_E_NO_MEMORY,
                             "cannot allocate generation buffers (vocab %u)", V);
    if (s) {
        colibri_gen_free(g);
        return s;
    }
    memcpy(g->hist, p->prompt, (size_t)p->n_prompt * sizeof *g->hist);
    g->p.prompt = g->hist; /* the caller's prompt may go now */
    g->nh = p->n_prompt;
    g->t0 = colibri_now_ms();
    if (keep == 0) colibri_reset(seq);
    g->fed = keep;
    *out = g;
    return COLIBRI_OK;
}

static void finish(colibri_gen *g) {
    if (g->r.finish == COLIBRI_FINISH_NONE) g->r.finish = COLIBRI_FINISH_LENGTH;
    if (g->t1 == 0) g->t1 = colibri_now_ms();
    /* the end: whatever was held back is final now */
    if (g->r.finish != COLIBRI_FINISH_CANCELLED && !g->status) colibri_out_end(&g->o);
    g->r.prefill_ms = g->t1 - g->t0;
    g->r.decode_ms = colibri_now_ms() - g->t1;
    g->finished = 1;
}

/* The logits of g's last token are in: pick the next id and hand it to the output side. */
static void take(colibri_gen *g) {
    const struct colibri_model *m = g->seq->model;
    colibri_generate_result *r = &g->r;
    int32_t id = colibri_sampler_sample(g->smp, g->logits, g->hist, g->nh);
    if (r->n_new == 0) g->t1 = colibri_now_ms();
    if (is_stop(&g->p, m, id)) {
        r->finish = COLIBRI_FINISH_STOP;
        r->stop_id = id;
        return finish(g);
    }
    g->out[r->n_new++] = id;
    g->hist[g->nh++] = id;
    int found = -1;
    int cancel = colibri_out_push(&g->o, id, &found);
    if (g->o.oom) {
        g->status = colibri_ctx_fail(g->seq, COLIBRI_E_NO_MEMORY,
                                     "cannot grow the generated text buffer");
        return finish(g);
    }
    if (found >= 0) {
        r->finish = COLIBRI_FINISH_STOP;
        r->stop_string = found;
        return finish(g);
    }
    if (g->o.stopped) { /* harmony <|return|> / <|call|> (kept in out_ids: the format's end) */
        r->finish = COLIBRI_FINISH_STOP;
        r->stop_id = id;
        return finish(g);
    }
    if (cancel) {
        r->finish = COLIBRI_FINISH_CANCELLED;
        return finish(g);
    }
    if (r->n_new == g->p.max_new) return finish(g);
    if ((uint32_t)g->seq->pos >= m->max_seq_len) {
        r->finish = COLIBRI_FINISH_CONTEXT;
        return finish(g);
    }
    g->next = id;
}

colibri_status colibri_gen_step_on(colibri_ctx *eng, int cuda, int prompt_rows,
                                   colibri_gen *const *gens, int n) {
    colibri_batch_item it[COLIBRI_CHUNK];
    colibri_gen *who[COLIBRI_CHUNK];
    int wants[COLIBRI_CHUNK]; /* the item ends where its generation samples */
    int ni = 0, budget = cuda ? INT_MAX : eng->b.chunk;
    /* decoding generations first, one token each; then prompts, as much as the pass holds (on
     * CUDA, where each item is its own pass, the whole rest of a prompt at once) */
    for (int i = 0; i < n && ni < COLIBRI_CHUNK && budget > 0; i++) {
        colibri_gen *g = gens[i];
        if (g->finished || g->fed < g->p.n_prompt) continue;
        it[ni] = (colibri_batch_item){g->seq, &g->next, 1, g->logits, 1};
        wants[ni] = 1;
        who[ni++] = g;
        budget--;
    }
    /* with someone decoding, the prompts' share of the step is capped (their bits do not depend
     * on the split: prefill == decode) so a decode waits for at most prompt_rows prompt rows */
    if (ni > 0 && prompt_rows > 0 && budget > prompt_rows) budget = prompt_rows;
    for (int i = 0; i < n && ni < COLIBRI_CHUNK && budget > 0; i++) {
        colibri_gen *g = gens[i];
        if (g->finished || g->fed >= g->p.n_prompt) continue;
        int rest = g->p.n_prompt - g->fed, c = rest < budget ? rest : budget;
        int last = c == rest && g->p.max_new > 0;
        it[ni] = (colibri_batch_item){g->seq, g->hist + g->fed, c, last || cuda ? g->logits : NULL, 0};
        wants[ni] = last;
        who[ni++] = g;
        budget -= c;
    }
    if (!ni) return COLIBRI_OK;
    colibri_status s = colibri_batch_run(eng, cuda, it, ni);
    double t0 = colibri_now_ms();
    for (int k = 0; k < ni; k++) {
        colibri_gen *g = who[k];
        if (s) {
            g->status = s;
            snprintf(g->seq->err, sizeof g->seq->err, "%s", eng->err);
            finish(g);
            continue;
        }
        if (g->fed < g->p.n_prompt) g->fed += it[k].n;
        if (wants[k]) take(g);
        else if (g->fed == g->p.n_prompt && g->p.max_new == 0) finish(g); /* a prefill only */
    }
    if (!cuda) eng->steps.sample_ms += colibri_now_ms() - t0;
    return s;
}

void colibri_engine_step_times(const colibri_engine *e, colibri_step_times *t) {
    if (!t) return;
    memset(t, 0, sizeof *t);
    if (e && !e->cuda) *t = e->ctx->steps;
}

colibri_status colibri_gen_step(colibri_engine *e, colibri_gen *const *gens, int n) {
    if (!e || n < 0 || (n > 0 && !gens)) return COLIBRI_E_INVALID_ARG;
    for (int i = 0; i < n; i++)
        if (!gens[i])
            return colibri_ctx_fail(e->ctx, COLIBRI_E_INVALID_ARG, "generation %d is NULL", i);
    return colibri_gen_step_on(e->ctx, e->cuda, e->prompt_rows, gens, n);
}

colibri_status colibri_engine_set_prompt_rows(colibri_engine *e, int rows) {
    if (!e) return COLIBRI_E_INVALID_ARG;
    if (rows < 0 || rows > COLIBRI_CHUNK)
        return colibri_ctx_fail(e->ctx, COLIBRI_E_INVALID_ARG,
                                "prompt rows %d: must be 0 (no cap) .. %d (a pass)", rows,
                                COLIBRI_CHUNK);
    e->prompt_rows = rows;
    return COLIBRI_OK;
}

int colibri_gen_done(const colibri_gen *g) { return g ? g->finished : 1; }

colibri_status colibri_gen_result(const colibri_gen *g, colibri_generate_result *r) {
    if (!g || !r) return COLIBRI_E_INVALID_ARG;
    *r = g->r;
    return g->status;
}

int colibri_gen_position(const colibri_gen *g) { return g ? g->seq->pos : 0; }
