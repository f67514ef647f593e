/* The state one `colibri serve` process shares between its event loop (connections.c), the
 * request threads (completion.c), the routes (routes.c) and start-up (server.c). One per
 * process. Locks: pool.mu (slots.h) and mu below are never held together. */
#ifndef COLIBRI_SERVE_SERVICE_H
#define COLIBRI_SERVE_SERVICE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "colibri.h"
#include "metrics.h"
#include "options.h"
#include "slots.h"

#define SERVE_MAX_NAMES 64      /* --allow-host / --allow-origin entries, all lists together */

/* Connections from one address (IPv4, or an IPv6 /64) that are still sending their request. */
typedef struct {
    unsigned char key[16];
    int unfinished;
} addr_count;

typedef struct server {
    server_options o;
    char model_id[128];
    char api_key[256];
    size_t api_key_len;
    /* Host and Origin policy (routes.c) */
    int loopback_bind;          /* every listening address is a loopback one */
    int any_host, any_origin;   /* "*" given */
    char *names;                /* storage of the entries below */
    const char *allow_host[SERVE_MAX_NAMES];
    int n_allow_host;
    const char *allow_origin[SERVE_MAX_NAMES];
    int n_allow_origin;
    /* the model */
    colibri_model_info info;
    colibri_tokenizer_info tinfo;
    int has_chat_template;      /* the model file carries chat.template */
    slot_pool pool;
    /* mu guards everything below but cancel_all */
    pthread_mutex_t mu;
    pthread_cond_t conns_cv;    /* a request thread ended (the drain waits on it) */
    metrics m;
    int conns;                  /* open connections: the event loop's and the request threads' */
    int workers, max_workers;   /* request threads (bodies, queue, generation) */
    addr_count *addrs;          /* max_conns + max_workers entries; unused ones have 0 */
    int n_addrs;
    int ready, draining;
    uint64_t id_state;
    atomic_int cancel_all;      /* the drain deadline passed: stop every generation */
} server;

#endif
