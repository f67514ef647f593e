/* The slot pool, its FIFO queue, and generation on a slot (slots.h). */
#include "slots.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "text.h"

struct slot_waiter {
    slot_waiter *next;
    slot *got;                  /* handed over by pool_release */
    pthread_cond_t cv;
};

int pool_open(slot_pool *p, const char *path, const colibri_options *opt, int n, int max_queue,
              char *err, size_t errlen) {
    memset(p, 0, sizeof *p);
    pthread_mutex_init(&p->mu, NULL);
    p->max_queue = max_queue;
    /* The model is mapped and validated once; every slot is a context over it with its own
     * arena (KV cache) and compute threads. */
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
    for (int i = 0; i < n; i++) {
        slot *s = &p->slots[i];
        colibri_options so = *opt;  /* real-time mode: slot i's workers on the i-th run of CPUs */
        if (so.cpus) so.cpus += (size_t)i * (size_t)so.n_cpus;
        st = colibri_ctx_new(&s->ctx, p->model, &so);
        if (st) {
            snprintf(err, errlen, "%s: slot %d: %s: %s", path, i, colibri_strerror(st), opt->error ? opt->error : "");
            return -1;
        }
        s->index = i;
        s->next_free = p->free;
        p->free = s;
        p->n = i + 1;
    }
    return 0;
}

void pool_close(slot_pool *p) {
    for (int i = 0; i < p->n; i++) colibri_free(p->slots[i].ctx);
    free(p->slots);
    colibri_model_free(p->model);
    p->slots = NULL;
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
    if (b->cb->on_token(b->cb->user, id, text, len)) return 1;
    return id >= 0 && b->cb->cancelled(b->cb->user);
}

static int bridge_chunk(void *user, const colibri_chunk *c) {
    bridge *b = user;
    /* content comes through on_token; a tool call (colibri renders no tools) is not passed on */
    if (c->kind != COLIBRI_TEXT_REASONING || !b->cb->on_reasoning) return 0;
    return b->cb->on_reasoning(b->cb->user, c->text, c->len);
}

int slot_generate(slot *s, const int32_t *ids, int n, const gen_params *p, const gen_callbacks *cb,
                  char *err, size_t errlen) {
    if (cb->cancelled(cb->user)) return FINISH_CANCELLED;
    int32_t *out = malloc((size_t)p->max_tokens * sizeof *out);
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return FINISH_ERROR;
    }
    bridge br = {cb, 0};
    colibri_generate_params g;
    colibri_default_generate_params(&g);
    g.prompt = ids;
    g.n_prompt = n;
    g.max_new = p->max_tokens;
    g.sampling = p->sampling;
    g.stop_ids = p->n_stop_ids ? p->stop_ids : NULL;
    g.n_stop_ids = p->n_stop_ids;
    g.stop_strings = p->n_stop ? p->stop : NULL;
    g.n_stop_strings = p->n_stop;
    g.detok = p->text ? text_detok : NULL;
    g.detok_user = s->ctx;
    g.on_token = bridge_token;
    g.user = &br;
    if (p->text && p->reasoning) {
        /* the split output: the runtime's own detokenizer (it holds a trailing U+FFFD back and
         * makes it final at the end itself), reasoning through on_chunk */
        g.detok = colibri_detok_ctx;
        g.reasoning = p->reasoning;
        g.starts_in_reasoning = p->starts_in_reasoning;
        g.on_chunk = bridge_chunk;
        g.chunk_user = &br;
    }
    colibri_generate_result r;
    colibri_status st = colibri_generate(s->ctx, &g, out, &r);
    if (!st && p->text && !p->reasoning && r.finish != COLIBRI_FINISH_CANCELLED && r.stop_string < 0) {
        /* text_detok holds back trailing U+FFFD (they may still become a character); at the
         * end they are final: send what the whole answer decodes to beyond what was sent */
        char *all = NULL;
        size_t len = text_full(s->ctx, out, r.n_new, &all);
        if (all && len > br.emitted) cb->on_token(cb->user, -1, all + br.emitted, len - br.emitted);
        free(all);
    }
    free(out);
    if (st) {
        snprintf(err, errlen, "%s: %s", colibri_strerror(st), colibri_last_error(s->ctx));
        return FINISH_ERROR;
    }
    switch (r.finish) {
    case COLIBRI_FINISH_STOP: return FINISH_STOP;
    case COLIBRI_FINISH_CANCELLED: return FINISH_CANCELLED;
    default: return FINISH_LENGTH; /* max_tokens, or the context is full */
    }
}

const char *finish_name(int f) {
    return f == FINISH_STOP ? "stop" : f == FINISH_LENGTH ? "length" : f == FINISH_CANCELLED ? "cancelled" : "error";
}
