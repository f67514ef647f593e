/* The options of `colibri serve` (server.h; the CLI fills them in tools/cmd_serve.c, and
 * docs/serve.md explains each). Plain data, apart so that the service's own files can read them
 * without depending on its start-up. */
#ifndef COLIBRI_SERVE_OPTIONS_H
#define COLIBRI_SERVE_OPTIONS_H

#include "colibri.h"

#define SERVE_MAX_ALLOW 16      /* --allow-host / --allow-origin given this many times at most */
#define SERVE_MAX_WARM 16       /* warm prompts */

/* A prompt computed at start-up and kept in the prefix cache (docs/serve.md, "Prompt prefix
 * cache"): a chat system prompt (the chat template's head up to where the user's text starts),
 * or a completion prompt's text. */
typedef struct {
    int chat;
    const char *text;
} serve_warm;

typedef struct {
    const char *model_path;
    const char *model_id;       /* name in /v1/models and responses; NULL = file name sans .colibri */
    const char *host;           /* default 127.0.0.1 */
    int port;                   /* default 8080; 0 = any free port (printed on stderr) */
    int slots;                  /* default 1 */
    int threads;                /* compute threads per slot; 0 = online CPUs / slots (min 1) */
    int max_queue;              /* waiting requests beyond the busy slots; default 16 */
    const char *api_key_file;   /* required when host is not a loopback address */
    long max_body;              /* request body limit in bytes; default 1 MiB */
    int head_timeout_ms;        /* deadline for the request head, from accept; default 5000 */
    int read_timeout_ms;        /* deadline for the whole request head + body; default 10000 */
    int write_timeout_ms;       /* a client that stops reading for this long is dropped; 30000 */
    int drain_timeout_ms;       /* SIGTERM: wait this long for in-flight requests; default 30000 */
    int max_conns;              /* connections open at once; default 256 */
    int max_conns_per_addr;     /* of them, still sending their request, per address; default 32 */
    const char *allow_host[SERVE_MAX_ALLOW];   /* comma-separated Host names besides loopback ones; "*" any */
    int n_allow_host;
    const char *allow_origin[SERVE_MAX_ALLOW]; /* comma-separated browser origins; "*" any */
    int n_allow_origin;
    colibri_backend backend;
    int int8_activations;
    colibri_kv_dtype kv_dtype;  /* --kv-cache; COLIBRI_KV_F32 by default */
    int no_batching;            /* --no-batching: each slot runs its own passes (as before #26) */
    int prompt_rows;            /* --prompt-rows: prompts' rows a step while some request decodes;
                                   0 (default): no cap (colibri_engine_set_prompt_rows) */
    long prefix_cache_mb;       /* --prefix-cache-mb; -1 (default): one slot's KV cache; 0: off */
    serve_warm warm[SERVE_MAX_WARM]; /* --warm-system / --warm-prompt, in order */
    int n_warm;
    const char *warm_b64;       /* --warm-prompts-b64: base64 of a JSON list (the unit's form) */
    int deadline_ms;            /* --deadline-ms: a request's budget when it gives none; 0 none */
    /* real-time mode (global options; docs/runtime.md): slot i's workers run on the i-th run of
     * `threads` CPUs of cpus (slots x threads of them) */
    const int *cpus;
    int n_cpus;
    colibri_sched sched;
    int sched_priority;
    int lock_memory;
    colibri_barrier barrier;
} server_options;

#endif
