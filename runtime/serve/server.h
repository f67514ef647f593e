/* `colibri serve`: an OpenAI-compatible HTTP/1.1 service over one model (docs/serve.md).
 *
 * Thread model:
 *   - the main thread accepts connections (poll on the listening sockets and a self-pipe that
 *     SIGTERM/SIGINT write to) and starts one detached connection thread per connection, up to
 *     slots + max_queue + 8 at once (beyond that it answers 503 itself and closes);
 *   - a connection thread reads the request head and body under one read deadline (a slow
 *     client is cut off with 408 before it can wait for, let alone hold, a slot), answers the
 *     cheap endpoints itself, and for a completion takes a slot from the slot pool: a free slot
 *     at once, else a place in the bounded FIFO queue (full: 503 + Retry-After);
 *   - a slot is one colibri context (its own KV cache, arena and compute threads) over the
 *     shared, read-only mapped model; the connection thread that holds it runs the generation
 *     on it and writes the answer (or SSE chunks) to its socket, checking between tokens whether
 *     the client has gone (then it stops and frees the slot), and gives it back.
 * SIGTERM: stop accepting, /health turns 503, in-flight requests (queued ones too) finish until
 * the drain deadline, after which remaining generations are cancelled; exit status 0. */
#ifndef COLIBRI_SERVER_H
#define COLIBRI_SERVER_H

#include "colibri.h"

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
    int read_timeout_ms;        /* deadline for the whole request head + body; default 10000 */
    int write_timeout_ms;       /* a client that stops reading for this long is dropped; 30000 */
    int drain_timeout_ms;       /* SIGTERM: wait this long for in-flight requests; default 30000 */
    colibri_backend backend;
    int int8_activations;
    colibri_kv_dtype kv_dtype;  /* --kv-cache; COLIBRI_KV_F32 by default */
} server_options;

void server_default_options(server_options *o);

/* Run until SIGTERM/SIGINT. Returns the process exit status: 0 after a clean shutdown, 1 when
 * the service cannot start (model, key file, bind); the reason is one line on stderr. */
int server_run(const server_options *o);

#endif
