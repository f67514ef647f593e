/* The step loop and the jobs' outboxes (batch.h). */
#include "batch.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* An outbox record: kind, id, length, then the bytes. */
enum { REC_CONTENT = 0, REC_REASONING = 1 };
typedef struct {
    int32_t kind, id;
    uint32_t len;
} rec_head;

/* Under b->mu (the loop's callbacks run with it released, and take it here). */
static int put(bjob *j, int kind, int32_t id, const char *text, size_t len) {
    size_t need = j->len + sizeof(rec_head) + len;
    if (need > j->cap) {
        size_t cap = need * 2 < 4096 ? 4096 : need * 2;
        char *p = realloc(j->box, cap);
        if (!p) {
            j->oom = 1;
            return 1;
        }
        j->box = p;
        j->cap = cap;
    }
    rec_head h = {kind, id, (uint32_t)len};
    memcpy(j->box + j->len, &h, sizeof h);
    if (len) memcpy(j->box + j->len + sizeof h, text, len);
    j->len = need;
    return 0;
}

/* Called on the loop's thread by colibri_gen_step (the generation's on_token / on_chunk). */
static int job_token(void *user, int32_t id, const char *text, size_t len) {
    bjob *j = user;
    if (id < 0) return 0; /* the end: the owner finishes the text itself (slots.c) */
    pthread_mutex_lock(&j->b->mu);
    int full = put(j, REC_CONTENT, id, text, len);
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->b->mu);
    return full || atomic_load(&j->cancel);
}

static int job_chunk(void *user, const colibri_chunk *c) {
    bjob *j = user;
    if (c->kind != COLIBRI_TEXT_REASONING) return 0; /* content comes through job_token */
    pthread_mutex_lock(&j->b->mu);
    int full = put(j, REC_REASONING, c->id, c->text, c->len);
    pthread_cond_signal(&j->cv);
    pthread_mutex_unlock(&j->b->mu);
    return full;
}

void bjob_init(bjob *j, batcher *b, colibri_generate_params *p) {
    memset(j, 0, sizeof *j);
    j->b = b;
    atomic_init(&j->cancel, 0);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->cv, &ca);
    pthread_condattr_destroy(&ca);
    p->on_token = job_token;
    p->user = j;
    if (p->reasoning) {
        p->on_chunk = job_chunk;
        p->chunk_user = j;
    }
}

void bjob_free(bjob *j) {
    free(j->box);
    j->box = NULL;
    pthread_cond_destroy(&j->cv);
}

/* Under b->mu: let j go (it is unlinked already). */
static void let_go(bjob *j) {
    j->done = 1;
    pthread_cond_signal(&j->cv);
}

static void *step_main(void *arg) {
    batcher *b = arg;
    colibri_gen *gens[BATCH_MAX_JOBS];
    bjob *js[BATCH_MAX_JOBS];
    int pos0[BATCH_MAX_JOBS];
    pthread_mutex_lock(&b->mu);
    for (;;) {
        while (!b->jobs && !b->stop) pthread_cond_wait(&b->cv, &b->mu);
        if (!b->jobs) break;
        double t_loop = now_ms();
        /* between steps: jobs asked to leave go, the others make this step's batch */
        int n = 0;
        for (bjob **pp = &b->jobs; *pp;) {
            bjob *j = *pp;
            if (atomic_load(&j->cancel) || colibri_gen_done(j->gen)) {
                *pp = j->next;
                let_go(j);
                continue;
            }
            if (n < BATCH_MAX_JOBS) {
                gens[n] = j->gen;
                js[n] = j;
                pos0[n] = colibri_gen_position(j->gen);
                n++;
            }
            pp = &j->next;
        }
        if (!n) continue;
        pthread_mutex_unlock(&b->mu);
        colibri_runtime_info before, after; /* this thread owns the engine: its fault counts */
        colibri_engine_get_runtime_info(b->engine, &before);
        double t_step = now_ms();
        colibri_gen_step(b->engine, gens, n); /* a failure finishes the generations it carried */
        t_step = now_ms() - t_step;
        colibri_engine_get_runtime_info(b->engine, &after);
        colibri_step_times times;
        colibri_engine_step_times(b->engine, &times);
        pthread_mutex_lock(&b->mu);
        b->step_ms += t_step;
        b->times = times;
        b->passes++;
        b->minor_faults += after.minor_faults - before.minor_faults;
        b->major_faults += after.major_faults - before.major_faults;
        for (int k = 0; k < n; k++) {
            int moved = colibri_gen_position(gens[k]) - pos0[k]; /* 0: it waited for room */
            b->rows += (unsigned long long)moved;
            b->seqs += moved > 0;
            if (!colibri_gen_done(gens[k])) continue;
            for (bjob **pp = &b->jobs; *pp; pp = &(*pp)->next) /* finished: let go at once */
                if (*pp == js[k]) {
                    *pp = js[k]->next;
                    let_go(js[k]);
                    break;
                }
        }
        b->busy_ms += now_ms() - t_loop;
    }
    pthread_mutex_unlock(&b->mu);
    return NULL;
}

int batcher_start(batcher *b, colibri_engine *e, char *err, size_t errlen) {
    memset(b, 0, sizeof *b);
    b->engine = e;
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setstacksize(&at, 1 << 20);
    int rc = pthread_create(&b->thread, &at, step_main, b);
    pthread_attr_destroy(&at);
    if (rc) {
        snprintf(err, errlen, "cannot start the step thread: %s", strerror(rc));
        return -1;
    }
    b->started = 1;
    return 0;
}

void batcher_stop(batcher *b) {
    if (!b->started) return;
    pthread_mutex_lock(&b->mu);
    b->stop = 1;
    pthread_cond_signal(&b->cv);
    pthread_mutex_unlock(&b->mu);
    pthread_join(b->thread, NULL);
    b->started = 0;
    pthread_cond_destroy(&b->cv);
    pthread_mutex_destroy(&b->mu);
}

/* Hand the records in box[0..len) to the sink; 1 when it asked to stop. */
static int deliver(const char *box, size_t len, const bjob_sink *s) {
    int stop = 0;
    for (size_t at = 0; at < len;) {
        rec_head h;
        memcpy(&h, box + at, sizeof h);
        const char *text = box + at + sizeof h;
        at += sizeof h + h.len;
        if (stop) continue;
        if (h.kind == REC_CONTENT) stop = s->on_token(s->user, h.id, text, h.len);
        else if (s->on_reasoning) stop = s->on_reasoning(s->user, text, h.len);
    }
    return stop;
}

int bjob_run(bjob *j, colibri_gen *g, const bjob_sink *sink) {
    batcher *b = j->b;
    char *mine = NULL; /* the records being delivered: swapped out of the outbox */
    size_t mine_cap = 0;
    int asked = 0;
    j->gen = g;
    pthread_mutex_lock(&b->mu);
    j->next = NULL;
    bjob **pp = &b->jobs;
    while (*pp) pp = &(*pp)->next;
    *pp = j; /* the tail: prompts are read in the order requests joined */
    pthread_cond_signal(&b->cv);
    for (;;) {
        while (!j->len && !j->done) {
            struct timespec ts;
            clock_gettime(CLOCK_MONOTONIC, &ts);
            ts.tv_nsec += 100 * 1000000L;
            if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
            if (pthread_cond_timedwait(&j->cv, &b->mu, &ts) && !j->len && !j->done) break;
        }
        /* swap the outbox out, so the loop appends to an empty one while we write */
        char *box = j->box;
        size_t len = j->len, cap = j->cap;
        j->box = mine;
        j->cap = mine_cap;
        j->len = 0;
        int done = j->done, oom = j->oom;
        pthread_mutex_unlock(&b->mu);
        mine = box;
        mine_cap = cap;
        int stop = (len && deliver(box, len, sink)) || oom || sink->cancelled(sink->user);
        if (stop && !asked) {
            atomic_store(&j->cancel, 1);
            asked = 1 + oom;
        }
        pthread_mutex_lock(&b->mu);
        if (done && !j->len) break;
    }
    pthread_mutex_unlock(&b->mu);
    free(mine);
    return asked == 2 ? -1 : asked;
}
