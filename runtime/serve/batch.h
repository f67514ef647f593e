/* The step loop of continuous batching (issue 26; docs/serve.md, "Thread model").
 *
 * One thread runs colibri_gen_step over every generation that has joined: each step is one pass
 * of the CPU engine over the next token of every decoding request and the next prompt tokens of
 * those still reading theirs, so each expert's weights are read once per step for all of them.
 * Requests join and leave between steps. The step loop never touches a socket: a generation's
 * text goes to its job's outbox, which the request thread that owns the job drains and writes
 * (a slow reader delays only itself). A request thread asks its job to leave (client gone, drain
 * deadline) with `cancel`; the loop lets it go before the next step and says so with `done`,
 * after which the request thread alone owns the generation and its context again. */
#ifndef COLIBRI_SERVE_BATCH_H
#define COLIBRI_SERVE_BATCH_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

#define BATCH_MAX_JOBS 64       /* generations per step (the slots: 1..64) */

typedef struct bjob bjob;

typedef struct batcher {
    colibri_engine *engine;
    pthread_t thread;
    int started;
    pthread_mutex_t mu;         /* everything below and every job's outbox */
    pthread_cond_t cv;          /* a job joined, or stop */
    bjob *jobs;                 /* joined and not let go yet, in join order */
    int stop;
    unsigned long long passes, rows, seqs; /* steps run, token rows and sequences they carried */
    unsigned long long minor_faults, major_faults; /* the engine's threads took, stepping */
    double step_ms;             /* wall time of the steps (colibri_gen_step), summed */
    double busy_ms;             /* the loop's time with jobs: steps + choosing + letting go */
    colibri_step_times times;   /* the engine's split of the steps, after the last step */
} batcher;

/* One generation in the loop, owned by the request thread that made it. */
struct bjob {
    bjob *next;
    batcher *b;
    colibri_gen *gen;
    atomic_int cancel;          /* set by the owner: leave before the next step */
    int done;                   /* set by the loop: let go (finished or cancelled) */
    pthread_cond_t cv;          /* output, or done */
    char *box;                  /* outbox records (batch.c), appended by the loop's callbacks */
    size_t len, cap;
    int oom;
};

/* 0, or -1 with the reason. The engine stays the caller's. */
int batcher_start(batcher *b, colibri_engine *e, char *err, size_t errlen);
/* Stop the loop once no job is left (call after every request thread is done). */
void batcher_stop(batcher *b);

/* The job's callbacks for a generation's params (on_token, on_chunk, their user data): its
 * answer's content and reasoning go to the outbox. */
void bjob_init(bjob *j, batcher *b, colibri_generate_params *p);

/* What the owner does with the outbox, on its own thread. on_token: a generated id (-1 never
 * comes from here) and the content that became final; on_reasoning: reasoning text. Either
 * returning non-zero, or cancelled(user) (polled at least every 100 ms and after each batch of
 * records), makes the job leave. */
typedef struct {
    int (*on_token)(void *user, int32_t id, const char *text, size_t len);
    int (*on_reasoning)(void *user, const char *text, size_t len);
    int (*cancelled)(void *user);
    void *user;
} bjob_sink;

/* Join g to the loop and hand its output to sink until the loop lets it go. Returns 1 when the
 * job was asked to leave (cancelled), 0 when the generation finished by itself, -1 when the
 * outbox could not grow (out of memory; the job left). */
int bjob_run(bjob *j, colibri_gen *g, const bjob_sink *sink);
void bjob_free(bjob *j);

#endif
