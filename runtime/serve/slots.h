/* Slots and the queue: the service's generation capacity (docs/serve.md, "Thread model").
 *
 * A slot is one colibri context (one sequence: its KV cache) over the one mapped, read-only
 * model. A request takes a free slot at once, or waits in a bounded FIFO queue until one is
 * handed to it; it tokenizes its prompt and generates on that slot, then gives it back. The pool
 * has its own mutex and knows nothing of sockets: a waiter passes a callback that says whether
 * it should stop waiting (its client left, or the drain deadline passed).
 *
 * Generation, on the CPU: continuous batching (batch.h): the pool's engine runs one pass per
 * step over every busy slot's next tokens, on the step loop's thread; a slot's own context
 * holds its sequence only (threads 1). The prompt prefix cache (prefix.h) restores a cached
 * prefix into the slot first. On CUDA (and with --no-batching) each slot runs its own passes on
 * its own threads/streams: the documented fallback (docs/serve.md, "Batching"). */
#ifndef COLIBRI_SERVE_SLOTS_H
#define COLIBRI_SERVE_SLOTS_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "batch.h"
#include "colibri.h"
#include "oai.h"
#include "prefix.h"

struct slot_pool;

typedef struct slot {
    int index;
    colibri_ctx *ctx;           /* one sequence over the shared model */
    const void *shared;         /* the prefix cache's snapshot ctx reads in place during a
                                   request (prefix_restore), or NULL */
    struct slot *next_free;
    struct slot_pool *pool;
} slot;

typedef struct slot_waiter slot_waiter;

typedef struct slot_pool {
    colibri_model *model;       /* mapped once, shared by every slot's context */
    slot *slots;
    int n;
    int max_queue;
    colibri_engine *engine;     /* continuous batching; NULL: each slot runs its own passes */
    batcher batch;
    char batch_off[160];        /* why slots do not share passes ("" when they do); with an
                                   engine: a layer kind that runs one sequence per pass */
    int threads;                /* compute threads: the engine's, or each slot's */
    prefix_cache prefix;        /* limit 0: off */
    char prefix_off[200];       /* why it is off ("" when on) */
    pthread_mutex_t mu;         /* everything below */
    slot *free;
    int busy, queued;
    slot_waiter *qhead, *qtail;
} slot_pool;

/* How the pool generates (server_options' batching, prefix cache and threads). */
typedef struct {
    int batching;               /* 1: continuous batching on the CPU engine (default) */
    long prefix_cache_mb;       /* -1: as much as one slot's KV cache; 0: off */
    int prompt_rows;            /* the engine's colibri_engine_set_prompt_rows (0: no cap) */
} pool_config;

/* Map the model and make n contexts over it (and the engine, its step loop and the prefix
 * cache). opt->threads 0: online CPUs (batching) or online CPUs / n (each slot its own). 0, or
 * -1 with the reason in err. */
int pool_open(slot_pool *p, const char *model_path, const colibri_options *opt, int n, int max_queue,
              const pool_config *cfg, char *err, size_t errlen);
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

/* A warm prompt: compute ids[0..n) on slot s (held by the caller) and keep its snapshot pinned in
 * the prefix cache. 0, or -1 with the reason. */
int slot_warm(slot *s, const int32_t *ids, int n, char *err, size_t errlen);
const char *finish_name(int finish);

#endif
