/* One client connection: its buffers, its request's facts, and the I/O and answer helpers that
 * both the event loop (connections.c: heads, cheap answers) and a request thread (completion.c)
 * use. One request per connection; every answer says `Connection: close`.
 *
 * Two ways to answer: `buffered` (the event loop: the bytes go to `out`, and the loop writes them
 * without blocking), or direct (a request thread: blocking sends bounded by SO_SNDTIMEO). */
#ifndef COLIBRI_SERVE_CONN_H
#define COLIBRI_SERVE_CONN_H

#include <stddef.h>

#include "json.h"
#include "oai.h"

#define MAX_HEAD 16384          /* request head limit (431 beyond) */

struct server;

enum { CONN_HEAD, CONN_WRITE, CONN_LINGER };   /* where the event loop has a connection */
enum { ROUTE_DONE, ROUTE_COMPLETION, ROUTE_CHAT }; /* what the head asked for, once answered or not */

typedef struct conn {
    struct server *S;
    int fd;
    char remote[64];
    unsigned char addr[16];     /* the address its per-address count is kept under */
    int counted;                /* counted as one of its address's unfinished requests */
    char *buf;                  /* head, then head + body */
    size_t len, cap;
    size_t scanned;             /* bytes of buf already searched for a line end */
    int peer_eof;               /* the client ended its sending side (read returned 0) */
    double t0;                  /* accept time (ms, monotonic) */
    double head_deadline;       /* the head must be complete by then */
    double deadline;            /* the body must be complete by then (--read-timeout) */
    /* the event loop's part */
    int state;                  /* CONN_* */
    int buffered;
    json_buf out;               /* buffered answer */
    size_t out_off;
    double io_deadline;         /* CONN_WRITE / CONN_LINGER: give up then */
    size_t dropped;             /* CONN_LINGER: bytes read and dropped */
    /* the request, from its head */
    int minor;                  /* HTTP/1.<minor> */
    size_t header_len;
    long long content_length;
    int expect_continue;
    int route;                  /* ROUTE_* */
    char cors_origin[256];      /* an allowed Origin, answered in Access-Control-Allow-Origin */
    int response_started;       /* a status line went out (nothing interim may follow) */
    int probe_sent;             /* the interim 100 that tells a closed client from a half-closed one */
    int write_failed;
    /* for the log line */
    char method[17];
    char path[129];
    int status;
    int prompt_tokens, completion_tokens, stream;
    double queue_ms, first_token_ms;
    const char *finish;
    double deadline_ms;         /* the answer's deadline when one applied, else 0 */
    int deadline_missed;
    char err[320];
} conn;

double now_ms(void);

/* Send all n bytes (direct mode). 0, or -1 when the client is gone (also for later calls). */
int conn_send(conn *c, const char *p, size_t n);

/* Read more bytes into buf before `deadline`. 1 read, 0 peer closed, -1 timeout, -2 error. */
int conn_read_more(conn *c, double deadline);

/* Read the rest of the body (content_length bytes after the head) before c->deadline, sending
 * `100 Continue` first when the client asked for it. 0 when complete; otherwise the connection
 * is answered (408) or marked (client closed) and -1 returned. */
int conn_read_body(conn *c);

/* Has the client gone (reset, or closed before its answer)? Never blocks. A client that only
 * ended its sending side (shutdown(SHUT_WR) after its request) is still there: the first time
 * the end is seen, before any answer, an HTTP/1.1 client is sent an interim `100 Continue`
 * (RFC 9110 15.2: clients must accept it), which a closed socket answers with a reset that the
 * next call sees. */
int client_gone(conn *c);

/* Answers. extra: more header lines ("Name: value\r\n"...), or NULL. */
void respond(conn *c, int status, const char *ctype, const char *body, size_t n, const char *extra);
void respond_json(conn *c, int status, const json_buf *b, const char *extra);
void respond_error(conn *c, const oai_error *e);
void fail_with(conn *c, int status, const char *type, const char *code, const char *param, const char *msg);
/* The CORS lines for an allowed Origin (empty when none), for answers written by hand. */
const char *conn_cors(const conn *c, char *buf, size_t cap);

/* One JSON line per request on stderr (the key and Authorization never part of it). */
void log_request(const conn *c);
void log_event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
