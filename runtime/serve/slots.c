/* The slot pool, its FIFO queue, and generation on a slot (slots.h). */
#include "slots.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "text.h"

struct slot_waiter {
    slot_waiter *next;
    slot *got;                  /* handed over by pool_release */
    pthread_cond_t cv;
};

int pool_open(slot_pool *p, const char *path, const colibri_options *opt, int n, int max_queue,
              const pool_config *cfg, char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    p->max_queue = max_queue;
    /* The model is mapped and validated once; every slot is a context over it. */
    colibri_status st = colibri_model_load(&p->model, path, opt);
    if (st) {
        snprintf(err, errlen, "%s: %s: %s", path, colibri_strerror(st), opt->error ? opt->error : "");
        return -1;
    }
    p->slots = calloc((size_t)n, sizeof *p->slots);
    if (!p->slots) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    /* Continuous batching: the engine's threads compute every slot's tokens; a slot's context
     * only holds its sequence. A CUDA engine means each slot runs on the GPU as its own pass. */
    colibri_options base = *opt;
    if (cfg->batching) {
        /* real-time mode: opt names each slot's run of n_cpus CPUs, slot after slot; the engine
         * computes for every slot, so its workers take all of them */
        colibri_options eo = *opt;
        if (eo.n_cpus) eo.threads = eo.n_cpus *= n;
        st = colibri_engine_new(&p->engine, p->model, &eo);
        if (st) {
            snprintf(err, errlen, "%s: engine: %s: %s", path, colibri_strerror(st), opt->error ? opt->error : "");
            return -1;
        }
        st = colibri_engine_set_prompt_rows(p->engine, cfg->prompt_rows);
        if (st) {
            snprintf(err, errlen, "%s", colibri_engine_last_error(p->engine));
            return -1;
        }
        colibri_runtime_info ri;
        colibri_engine_get_runtime_info(p->engine, &ri);
        if (!strcmp(ri.backend, "cuda")) {
            colibri_engine_free(p->engine);
            p->engine = NULL;
            snprintf(p->batch_off, sizeof p->batch_off, "the CUDA backend runs each slot as its own pass");
        } else {
            base.threads = 1; /* a slot only holds its sequence: no workers of its own */
            base.cpus = NULL;
            base.n_cpus = 0;
            base.backend = COLIBRI_BACKEND_CPU;
            /* ... and no pass buffers: every pass is the engine's (the unbatched layer kinds' too) */
            base.sequence_only = 1;
            p->threads = ri.threads;
            /* a layer kind without a multi-sequence pass: the step loop still serves every slot
             * (the prefix cache too), each slot's tokens in a pass of their own */
            const char *why = colibri_engine_unbatched(p->engine);
            if (why) snprintf(p->batch_off, sizeof p->batch_off, "%s", why);
        }
    } else {
        snprintf(p->batch_off, sizeof p->batch_off, "--no-batching");
    }
    if (!p->engine) {
        long cpus = sysconf(_SC_NPROCESSORS_ONLN);
        if (!base.threads) base.threads = base.n_cpus ? base.n_cpus : cpus > n ? (int)(cpus / n) : 1;
        if (base.threads > 64) base.threads = 64;
        p->threads = base.threads;
    }
    for (int i = 0; i < n; i++) {
        slot *s = &p->slots[i];
        colibri_options so = base; /* real-time mode without the engine: slot i's workers on the
                                      i-th run of CPUs */
        if (!p->engine && so.cpus) so.cpus += (size_t)i * (size_t)so.n_cpus;
        st = colibri_ctx_new(&s->ctx, p->model, &so);
        if (st) {
            snprintf(err, errlen, "%s: slot %d: %s: %s", path, i, colibri_strerror(st), opt->error ? opt->error : "");
            return -1;
        }
        s->index = i;
        s->pool = p;
        s->next_free = p->free;
        p->free = s;
        p->n = i + 1;
    }
    if (p->engine && batcher_start(&p->batch, p->engine, err, errlen)) return -1;
    /* The prefix cache: by default as much memory as one slot's KV cache. */
    colibri_runtime_info ri;
    colibri_get_runtime_info(p->slots[0].ctx, &ri);
    size_t limit = cfg->prefix_cache_mb < 0 ? ri.kv_cache_bytes : (size_t)cfg->prefix_cache_mb << 20;
    if (!p->engine) {
        snprintf(p->prefix_off, sizeof p->prefix_off, "needs continuous batching (%s)", p->batch_off);
        limit = 0;
    } else if (!limit) {
        snprintf(p->prefix_off, sizeof p->prefix_off, "--prefix-cache-mb 0");
    }
    prefix_init(&p->prefix, limit, colibri_model_can_truncate(p->model));
    return 0;
}

void pool_close(slot_pool *p) {
    batcher_stop(&p->batch);
    for (int i = 0; i < p->n; i++) colibri_free(p->slots[i].ctx);
    free(p->slots);
    colibri_engine_free(p->engine);
    prefix_free(&p->prefix);
    colibri_model_free(p->model);
    p->slots = NULL;
    p->engine = NULL;
    p->model = NULL;
    p->n = 0;
}

int pool_acquire(slot_pool *p, int (*stop)(void *user), void *user, slot **out) {
    pthread_mutex_lock(&p->mu);
    if (p->free && !p->qhead) {
        *out = p->free;
        p->free = (*out)->next_free;
        p->busy++;
        pthread_mutex_unlock(&p->mu);
        return ACQ_OK;
    }
    if (p->queued >= p->max_queue) {
        pthread_mutex_unlock(&p->mu);
        return ACQ_FULL;
    }
    slot_waiter w = {NULL, NULL, PTHREAD_COND_INITIALIZER};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    if (p->qtail) p->qtail->next = &w;
    else p->qhead = &w;
    p->qtail = &w;
    p->queued++;
    int rc = ACQ_OK;
    while (!w.got) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&w.cv, &p->mu, &ts);
        if (!w.got && stop(user)) {
            rc = ACQ_GONE;
            break;
        }
    }
    if (rc == ACQ_GONE) { /* leave the queue */
        slot_waiter **pp = &p->qhead;
        while (*pp && *pp != &w) pp = &(*pp)->next;
        if (*pp) *pp = w.next;
        p->qtail = NULL;
        for (slot_waiter *q = p->qhead; q; q = q->next) p->qtail = q;
        p->queued--;
    } else {
        *out = w.got; /* pool_release unlinked us, counted us busy and decremented queued */
    }
    pthread_mutex_unlock(&p->mu);
    pthread_cond_destroy(&w.cv);
    return rc;
}

void pool_release(slot_pool *p, slot *s) {
    pthread_mutex_lock(&p->mu);
    slot_waiter *w = p->qhead;
    if (w) { /* hand the slot straight to the longest waiter: FIFO, no thundering herd */
        p->qhead = w->next;
        if (!p->qhead) p->qtail = NULL;
        p->queued--;
        w->got = s;
        pthread_cond_signal(&w->cv);
    } else {
        s->next_free = p->free;
        p->free = s;
        p->busy--;
    }
    pthread_mutex_unlock(&p->mu);
}

void pool_counts(slot_pool *p, int *busy, int *queued) {
    pthread_mutex_lock(&p->mu);
    *busy = p->busy;
    *queued = p->queued;
    pthread_mutex_unlock(&p->mu);
}

/* ---------------------------------------------------------------- generation */

static int never(void *user) {
    (void)user;
    return 0;
}

typedef struct {
    const gen_callbacks *cb;
    size_t emitted;             /* text bytes handed to on_token so far */
} bridge;

static int bridge_token(void *user, int32_t id, const char *text, size_t len) {
    bridge *b = user;
    /* A detokenizer whose text for more ids is not an extension of its text for fewer would
     * make the loop's "new bytes" negative: never pass that on (see text_detok). */
    if (len > ((size_t)1 << 30)) len = 0;
    b->emitted += len;
    return b->cb->on_token(b->cb->user, id, text, len);
}

static int bridge_reasoning(void *user, const char *text, size_t len) {
    bridge *b = user;
    return b->cb->on_reasoning ? b->cb->on_reasoning(b->cb->user, text, len) : 0;
}

static int bridge_cancelled(void *user) {
    bridge *b = user;
    return b->cb->cancelled(b->cb->user);
}

/* colibri_generate's callbacks on a slot that runs its own passes (CUDA, --no-batching). */
static int own_token(void *user, int32_t id, const char *text, size_t len) {
    return bridge_token(user, id, text, len) || (id >= 0 && bridge_cancelled(user));
}

static int own_chunk(void *user, const colibri_chunk *c) {
    /* content comes through on_token; a tool call (colibri renders no tools) is not passed on */
    return c->kind == COLIBRI_TEXT_REASONING ? bridge_reasoning(user, c->text, c->len) : 0;
}

static void params_of(const slot *s, const int32_t *ids, int n, const gen_params *p,
                      colibri_generate_params *g) {
    colibri_default_generate_params(g);
    g->prompt = ids;
    g->n_prompt = n;
    g->max_new = p->max_tokens;
    g->sampling = p->sampling;
    g->stop_ids = p->n_stop_ids ? p->stop_ids : NULL;
    g->n_stop_ids = p->n_stop_ids;
    g->stop_strings = p->n_stop ? p->stop : NULL;
    g->n_stop_strings = p->n_stop;
    g->detok = p->text ? text_detok : NULL;
    g->detok_user = s->ctx;
    if (p->text && p->reasoning) {
        /* the split output: the runtime's own detokenizer (it holds a trailing U+FFFD back and
         * makes it final at the end itself) */
        g->detok = colibri_detok_ctx;
        g->reasoning = p->reasoning;
        g->starts_in_reasoning = p->starts_in_reasoning;
    }
}

/* Prompt ids[0..n) from position keep on the step loop, no token sampled (max_new 0). Returns
 * as bjob_run does; st: the generation's status. */
static int prefill_batched(slot *s, const int32_t *ids, int n, int keep, const bjob_sink *sink,
                           colibri_status *st) {
    colibri_generate_params g;
    colibri_default_generate_params(&g);
    g.prompt = ids;
    g.n_prompt = n;
    g.max_new = 0;
    bjob j;
    bjob_init(&j, &s->pool->batch, &g);
    colibri_gen *gen;
    *st = colibri_gen_new(&gen, s->ctx, &g, NULL, keep);
    if (*st) {
        bjob_free(&j);
        return 0;
    }
    int asked = bjob_run(&j, gen, sink);
    colibri_generate_result r;
    *st = colibri_gen_result(gen, &r);
    colibri_gen_free(gen);
    bjob_free(&j);
    return asked;
}

/* The sequence the slot's context holds after a generation, as ids: the prompt, then the
 * generated ids fed back (the last one sampled never was). Into the prefix cache. */
static void remember(slot *s, const int32_t *ids, int n, const int32_t *out, int pos) {
    if (!s->pool->prefix.limit || pos < 1) return;
    int32_t *all = malloc((size_t)pos * sizeof *all);
    if (!all) return;
    int head = pos < n ? pos : n;
    memcpy(all, ids, (size_t)head * sizeof *all);
    if (pos > n) memcpy(all + n, out, (size_t)(pos - n) * sizeof *all);
    prefix_insert(&s->pool->prefix, s->ctx, all, pos, 0);
    free(all);
}

/* Continuous batching: the prefix cache, then the generation on the step loop. */
static int generate_batched(slot *s, const int32_t *ids, int n, const gen_params *p, int32_t *out,
                            bridge *br, colibri_generate_result *r, colibri_status *st, char *err,
                            size_t errlen) {
    slot_pool *pool = s->pool;
    bjob_sink sink = {bridge_token, bridge_reasoning, bridge_cancelled, br};
    int split = 0, asked = 0;
    int keep = prefix_restore(&pool->prefix, s->ctx, ids, n, &split, &s->shared);
    if (split > keep) { /* a prefix other requests share, which this model restores only whole */
        asked = prefill_batched(s, ids, split, keep, &sink, st);
        if (*st || asked) return asked ? FINISH_CANCELLED : (snprintf(err, errlen, "%s: %s",
                                        colibri_strerror(*st), colibri_last_error(s->ctx)), FINISH_ERROR);
        prefix_insert(&pool->prefix, s->ctx, ids, split, 0);
        keep = split;
    }
    colibri_generate_params g;
    params_of(s, ids, n, p, &g);
    bjob j;
    bjob_init(&j, &pool->batch, &g);
    colibri_gen *gen;
    *st = colibri_gen_new(&gen, s->ctx, &g, out, keep);
    if (*st) {
        bjob_free(&j);
        snprintf(err, errlen, "%s: %s", colibri_strerror(*st), colibri_last_error(s->ctx));
        return FINISH_ERROR;
    }
    asked = bjob_run(&j, gen, &sink);
    *st = colibri_gen_result(gen, r);
    if (!*st) remember(s, ids, n, out, colibri_gen_position(gen));
    colibri_gen_free(gen);
    bjob_free(&j);
    if (asked < 0) {
        snprintf(err, errlen, "out of memory (the answer's outbox)");
        return FINISH_ERROR;
    }
    if (*st) {
        snprintf(err, errlen, "%s: %s", colibri_strerror(*st), colibri_last_error(s->ctx));
        return FINISH_ERROR;
    }
    if (asked && (r->finish == COLIBRI_FINISH_NONE || r->finish == COLIBRI_FINISH_CANCELLED)) {
        r->finish = COLIBRI_FINISH_CANCELLED;
        return FINISH_CANCELLED;
    }
    return -1; /* finished by itself: r says how */
}

int slot_generate(slot *s, const int32_t *ids, int n, const gen_params *p, const gen_callbacks *cb,
                  char *err, size_t errlen) {
    if (cb->cancelled(cb->user)) return FINISH_CANCELLED;
    int32_t *out = malloc((size_t)(p->max_tokens > 0 ? p->max_tokens : 1) * sizeof *out);
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return FINISH_ERROR;
    }
    bridge br = {cb, 0};
    colibri_generate_result r;
    memset(&r, 0, sizeof r);
    colibri_status st = COLIBRI_OK;
    int finish = -1;
    if (s->pool->engine) {
        finish = generate_batched(s, ids, n, p, out, &br, &r, &st, err, errlen);
        prefix_release(&s->pool->prefix, s->ctx, &s->shared);
    } else {
        colibri_generate_params g;
        params_of(s, ids, n, p, &g);
        g.on_token = own_token;
        g.user = &br;
        if (g.reasoning) {
            g.on_chunk = own_chunk;
            g.chunk_user = &br;
        }
        st = colibri_generate(s->ctx, &g, out, &r);
        if (st) {
            snprintf(err, errlen, "%s: %s", colibri_strerror(st), colibri_last_error(s->ctx));
            finish = FINISH_ERROR;
        }
    }
    if (finish < 0 && p->text && !p->reasoning && r.finish != COLIBRI_FINISH_CANCELLED && r.stop_string < 0) {
        /* text_detok holds back trailing U+FFFD (they may still become a character); at the
         * end they are final: send what the whole answer decodes to beyond what was sent */
        char *all = NULL;
        size_t len = text_full(s->ctx, out, r.n_new, &all);
        if (all && len > br.emitted) cb->on_token(cb->user, -1, all + br.emitted, len - br.emitted);
        free(all);
    }
    free(out);
    if (finish >= 0) return finish;
    switch (r.finish) {
    case COLIBRI_FINISH_STOP: return FINISH_STOP;
    case COLIBRI_FINISH_CANCELLED: return FINISH_CANCELLED;
    default: return FINISH_LENGTH; /* max_tokens, or the context is full */
    }
}

int slot_warm(slot *s, const int32_t *ids, int n, char *err, size_t errlen) {
    slot_pool *pool = s->pool;
    if (!pool->prefix.limit) {
        snprintf(err, errlen, "warm prompts need the prefix cache, which is off: %s", pool->prefix_off);
        return -1;
    }
    gen_callbacks none = {NULL, NULL, NULL, NULL};
    bridge br = {&none, 0};
    bjob_sink sink = {bridge_token, bridge_reasoning, never, &br};
    colibri_status st;
    prefill_batched(s, ids, n, 0, &sink, &st);
    if (st) {
        snprintf(err, errlen, "%s: %s", colibri_strerror(st), colibri_last_error(s->ctx));
        return -1;
    }
    if (prefix_insert(&pool->prefix, s->ctx, ids, n, 1)) {
        prefix_stats ps;
        prefix_get_stats(&pool->prefix, &ps);
        snprintf(err, errlen, "the warm prompts do not fit the prefix cache (%zu KiB, %zu KiB held; "
                 "this one's %d tokens take %zu KiB): raise --prefix-cache-mb", ps.limit >> 10,
                 ps.bytes >> 10, n, colibri_seq_state_bytes(s->ctx) >> 10);
        return -1;
    }
    return 0;
}

const char *finish_name(int f) {
    return f == FINISH_STOP ? "stop" : f == FINISH_LENGTH ? "length" : f == FINISH_CANCELLED ? "cancelled" : "error";
}
