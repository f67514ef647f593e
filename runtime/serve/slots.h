/* Slots and the queue: the service's generation capacity (docs/serve.md, "Thread model").
 *
 * A slot is one colibri context (its own KV cache, arena and compute threads) over the one
 * mapped, read-only model. A request takes a free slot at once, or waits in a bounded FIFO queue
 * until one is handed to it; it tokenizes its prompt and generates on that slot, then gives it
 * back. The pool has its own mutex and knows nothing of sockets: a waiter passes a callback that
 * says whether it should stop waiting (its client left, or the drain deadline passed).
 *
 * Continuous batching (issue 26) replaces slot_generate's one-context-per-request loop with a
 * step loop over all busy slots; acquire/release, the queue and the callbacks stay as they are. */
#ifndef COLIBRI_SERVE_SLOTS_H
#define COLIBRI_SERVE_SLOTS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "colibri.h"
#include "oai.h"

typedef struct slot {
    int index;
    colibri_ctx *ctx;           /* one sequence over the shared model */
    struct slot *next_free;
} slot;

typedef struct slot_waiter slot_waiter;

typedef struct {
    colibri_model *model;       /* mapped once, shared by every slot's context */
    slot *slots;
    int n;
    int max_queue;
    pthread_mutex_t mu;         /* everything below */
    slot *free;
    int busy, queued;
    slot_waiter *qhead, *qtail;
} slot_pool;

/* Map the model and make n contexts over it. 0, or -1 with the reason in err. */
int pool_open(slot_pool *p, const char *model_path, const colibri_options *opt, int n, int max_queue,
              char *err, size_t errlen);
void pool_close(slot_pool *p);

enum { ACQ_OK = 0, ACQ_FULL = 1, ACQ_GONE = 2 };

/* A free slot now (ACQ_OK), or a place in the queue until release hands one over; ACQ_FULL when
 * the queue is full; ACQ_GONE when stop(user) said so while waiting (polled every 100 ms). */
int pool_acquire(slot_pool *p, int (*stop)(void *user), void *user, slot **out);
void pool_release(slot_pool *p, slot *s);
void pool_counts(slot_pool *p, int *busy, int *queued);

/* ---- generation on a slot: the runtime's loop (colibri_generate: prefill, sampling, EOS/stop
 * ids and stop strings, UTF-8-safe text) with the answer's text streamed through a callback */

typedef struct {
    int max_tokens;
    colibri_sampling sampling;
    const char *stop[OAI_MAX_STOP];
    int n_stop;
    const int32_t *stop_ids;    /* the tokenizer's end ids (generation config) */
    int n_stop_ids;
    int text;                   /* the model has a tokenizer: stream text, not only ids */
    colibri_reasoning_format reasoning; /* chat: split the answer (on_token gets the content) */
    int starts_in_reasoning;
} gen_params;

typedef struct {
    /* id >= 0: a generated token; id == -1: the end. text: bytes that became final. Return
     * non-zero to stop (the client went away). */
    int (*on_token)(void *user, int32_t id, const char *text, size_t len);
    int (*cancelled)(void *user);   /* polled between tokens */
    void *user;
    /* with gen_params.reasoning: the reasoning text (harmony's analysis channel, the <think>
     * block) as it becomes final, before the same step's on_token; may be NULL */
    int (*on_reasoning)(void *user, const char *text, size_t len);
} gen_callbacks;

enum { FINISH_LENGTH, FINISH_STOP, FINISH_CANCELLED, FINISH_ERROR };

int slot_generate(slot *s, const int32_t *ids, int n, const gen_params *p, const gen_callbacks *cb,
                  char *err, size_t errlen);
const char *finish_name(int finish);

#endif
