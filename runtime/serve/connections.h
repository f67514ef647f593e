/* Connections: the event loop and the request threads (docs/serve.md, "Limits and behaviour
 * under load", "Thread model").
 *
 * The main thread polls the listening sockets, the wake pipe and every connection it holds:
 * those still sending their head (under --head-timeout), and those taking a short answer (the
 * cheap endpoints and every refusal are answered here, without blocking). A slow or idle client
 * therefore costs a descriptor and a 16 KiB buffer, never a thread, and /health is answered the
 * moment its head arrives.
 *
 * Caps, and what happens at them (so that a flood of slow connections cannot shut out a probe):
 *   - per address (IPv4, or IPv6 /64): at most --max-connections-per-address connections still
 *     sending their request (head or body); a new one beyond that closes the address's oldest
 *     connection still in its head (503), or is refused when it has none;
 *   - in all: at most --max-connections held by the loop; a new one beyond that closes the oldest
 *     connection still in its head (or lingering after its answer), or is refused;
 *   - request threads: slots + max_queue + 8 (reading bodies, queued, generating); beyond,
 *     `503 queue_full`.
 * Eviction closes the oldest, which is the one nearest its head deadline: a client sending a
 * normal request (one segment) is answered before it could be chosen. */
#ifndef COLIBRI_SERVE_CONNECTIONS_H
#define COLIBRI_SERVE_CONNECTIONS_H

#include "service.h"

/* Size the caps and the per-address table (and the descriptor limit they need). 0, or -1. */
int connections_init(server *S);
void connections_free(server *S);

/* Serve until a byte arrives on wake_rd; then close what the loop holds (a connection still
 * sending its head gets 503 shutting_down). The listening sockets stay the caller's. */
void connections_run(server *S, const int *lfds, int nl, int wake_rd);

/* After run: wait for the request threads until the drain deadline, then cancel what still
 * generates and give it a moment to answer. Returns the request threads left. */
int connections_drain(server *S);

#endif
