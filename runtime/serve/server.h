/* `colibri serve`: an OpenAI-compatible HTTP/1.1 service over one model (docs/serve.md).
 *
 * Where things live:
 *   server.c       start-up (options, key, listeners, model and slots), the ready line, shutdown
 *   options.h      server_options (apart, so the other files need not include start-up)
 *   connections.c  the event loop: accept, read every request head without blocking, answer the
 *                  cheap requests there, per-address and total caps with eviction of the slowest;
 *                  a request thread per completion; the drain
 *   routes.c       what a head may ask: Host, Origin, Content-Type, the key, the endpoint; the
 *                  cheap endpoints (/health, /metrics, /v1/models) and the CORS preflight
 *   completion.c   a completion on its request thread: body, JSON, slot, tokenizing, generation,
 *                  the answer or its SSE events
 *   slots.c        the slot pool and its FIFO queue; generation on a slot
 *   text.c         prompt text and chat -> ids, ids -> text, on a slot's context
 *   metrics.c      counters, histograms, the Prometheus page
 *   conn.c         a connection's I/O, answers and log line
 *   http.c, json.c, oai.c: the request head, JSON, the OpenAI shapes (pure functions, fuzzed)
 *
 * Thread model: the main thread runs the event loop (poll over the listening sockets, a
 * self-pipe that SIGTERM/SIGINT write to, and every connection still sending its head or taking
 * a short answer). A slow or idle client costs a descriptor and a 16 KiB buffer there, never a
 * thread, so /health answers whatever they do. A completion request, once its head passed every
 * check, gets a detached request thread that reads its body, takes a slot (or waits in the
 * queue), tokenizes and generates on it, writes the answer, and checks between tokens whether
 * the client has gone. SIGTERM: stop accepting, in-flight requests (queued ones too) finish until
 * the drain deadline, after which remaining generations are cancelled; exit status 0. */
#ifndef COLIBRI_SERVER_H
#define COLIBRI_SERVER_H

#include "options.h"

void server_default_options(server_options *o);

/* Run until SIGTERM/SIGINT. Returns the process exit status: 0 after a clean shutdown, 1 when
 * the service cannot start (model, key file, bind, an --allow-host/--allow-origin entry); the
 * reason is one line on stderr. */
int server_run(const server_options *o);

#endif
