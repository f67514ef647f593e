/* The event loop, the caps and the request threads (connections.h). */
#include "connections.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "completion.h"
#include "conn.h"
#include "http.h"
#include "routes.h"

#define WORKER_SLACK 8          /* request threads beyond slots + queue: bodies being read, refusals */
#define CONN_STACK (1024 * 1024) /* a request thread runs the forward pass (worker 0) and, on the
                                    CUDA backend, driver calls: room to spare */
#define LINGER_MS 500           /* after an answer, how long to drain what the client still sends */
#define LINGER_MAX (1u << 20)
#define ACCEPT_BATCH 64         /* accepts per loop turn, so connections already held get turns */
#define FD_RESERVE 64           /* descriptors kept for the model, logs, listeners, the CUDA driver */

typedef struct {
    conn **c;
    int n, cap;
} conn_set;

/* ---------------------------------------------------------------- per-address counts (S->mu) */

/* IPv4 addresses as themselves (v4-mapped), IPv6 ones by their /64: one host has a /64. */
static void addr_key(const struct sockaddr_storage *ss, unsigned char key[16]) {
    memset(key, 0, 16);
    if (ss->ss_family == AF_INET) {
        key[10] = key[11] = 0xff;
        memcpy(key + 12, &((const struct sockaddr_in *)ss)->sin_addr, 4);
    } else if (ss->ss_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;
        if (IN6_IS_ADDR_V4MAPPED(a)) memcpy(key, a->s6_addr, 16);
        else memcpy(key, a->s6_addr, 8);
    }
}

static addr_count *addr_find(server *S, const unsigned char key[16], int create) {
    addr_count *spare = NULL;
    for (int i = 0; i < S->n_addrs; i++) {
        addr_count *a = &S->addrs[i];
        if (a->unfinished > 0 && !memcmp(a->key, key, 16)) return a;
        if (!a->unfinished && !spare) spare = a;
    }
    if (create && spare) memcpy(spare->key, key, 16);
    return create ? spare : NULL;
}

static int addr_unfinished(server *S, const unsigned char key[16]) {
    pthread_mutex_lock(&S->mu);
    addr_count *a = addr_find(S, key, 0);
    int n = a ? a->unfinished : 0;
    pthread_mutex_unlock(&S->mu);
    return n;
}

/* The request of c is complete (or failed): it no longer counts against its address. */
static void uncount(server *S, conn *c) {
    if (!c->counted) return;
    pthread_mutex_lock(&S->mu);
    addr_count *a = addr_find(S, c->addr, 0);
    if (a) a->unfinished--;
    pthread_mutex_unlock(&S->mu);
    c->counted = 0;
}

/* ---------------------------------------------------------------- the set the loop holds */

static int set_add(conn_set *s, conn *c) {
    if (s->n == s->cap) return -1; /* sized to max_conns: the caller made room */
    s->c[s->n++] = c;
    return 0;
}

/* The oldest connection in state st (from address key, when given), or -1. */
static int set_oldest(const conn_set *s, int st, const unsigned char *key) {
    int best = -1;
    for (int i = 0; i < s->n; i++) {
        const conn *c = s->c[i];
        if (!c || c->state != st || (key && memcmp(c->addr, key, 16))) continue;
        if (best < 0 || c->t0 < s->c[best]->t0) best = i;
    }
    return best;
}

static void set_compact(conn_set *s) {
    int k = 0;
    for (int i = 0; i < s->n; i++)
        if (s->c[i]) s->c[k++] = s->c[i];
    s->n = k;
}

/* ---------------------------------------------------------------- closing */

static void conn_free(conn *c) {
    free(c->buf);
    jb_free(&c->out);
    free(c);
}

/* The loop is done with c: count, log, close. */
static void loop_close(server *S, conn *c, int log) {
    uncount(S, c);
    if (c->status && log) log_request(c);
    pthread_mutex_lock(&S->mu);
    if (c->status) metrics_status(&S->m, c->status);
    S->conns--;
    pthread_mutex_unlock(&S->mu);
    close(c->fd);
    conn_free(c);
}

/* Read and drop what has arrived, so that close() ends with a FIN after our answer: closing
 * with unread input sends a reset, which may destroy the answer before the client reads it. */
static void drop_input(int fd) {
    char sink[4096];
    for (int i = 0; i < 16 && recv(fd, sink, sizeof sink, MSG_DONTWAIT) > 0; i++) {}
}

/* A fixed 503 written without blocking to a socket about to be closed (evicted or refused). */
static void send_503(int fd, const char *code, const char *msg) {
    drop_input(fd);
    char out[600];
    char body[400];
    int b = snprintf(body, sizeof body, "{\"error\": {\"message\": \"%s\", \"type\": \"server_error\", "
                     "\"param\": null, \"code\": \"%s\"}}", msg, code);
    int n = snprintf(out, sizeof out, "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Content-Length: %d\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s", b, body);
    ssize_t w = send(fd, out, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
}

static void evict(server *S, conn_set *set, int i) {
    conn *c = set->c[i];
    send_503(c->fd, "too_many_connections",
             "too many connections; this one was the slowest to send its request: retry");
    c->status = 503;
    pthread_mutex_lock(&S->mu);
    S->m.conns_evicted++;
    pthread_mutex_unlock(&S->mu);
    loop_close(S, c, 0);
    set->c[i] = NULL;
    set_compact(set);
}

static void refuse(server *S, int fd, const char *msg) {
    send_503(fd, "too_many_connections", msg);
    pthread_mutex_lock(&S->mu);
    S->m.conns_refused++;
    metrics_status(&S->m, 503);
    pthread_mutex_unlock(&S->mu);
    close(fd);
}

/* ---------------------------------------------------------------- request threads */

/* Close after the answer without losing it: closing a socket with unread input (a refused
 * oversized body) makes the kernel send a reset, which can destroy the response before the
 * client reads it. So: end our side, then read and drop what the client still sends for a
 * short while, until it closes too. */
static void linger_close(int fd) {
    shutdown(fd, SHUT_WR);
    char sink[4096];
    double end = now_ms() + LINGER_MS;
    size_t dropped = 0;
    while (dropped < LINGER_MAX) {
        int left = (int)(end - now_ms());
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) <= 0) break;
        ssize_t n = recv(fd, sink, sizeof sink, 0);
        if (n <= 0) break;
        dropped += (size_t)n;
    }
    close(fd);
}

static void *request_main(void *arg) {
    conn *c = arg;
    server *S = c->S;
    int ok = conn_read_body(c) == 0;
    uncount(S, c); /* the request is in (or failed): no longer a slow sender */
    if (ok) completion_serve(c, c->route == ROUTE_CHAT);
    if (c->status) {
        pthread_mutex_lock(&S->mu);
        metrics_status(&S->m, c->status);
        pthread_mutex_unlock(&S->mu);
        log_request(c);
    }
    linger_close(c->fd);
    conn_free(c);
    pthread_mutex_lock(&S->mu);
    S->workers--;
    S->conns--;
    pthread_cond_broadcast(&S->conns_cv);
    pthread_mutex_unlock(&S->mu);
    return NULL;
}

/* Hand c to a request thread. 0, or -1 when there is no room (c is still the loop's). */
static int start_request(server *S, conn *c, const pthread_attr_t *attr) {
    pthread_mutex_lock(&S->mu);
    int room = S->workers < S->max_workers;
    if (room) S->workers++;
    pthread_mutex_unlock(&S->mu);
    if (!room) return -1;
    c->buffered = 0;
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) & ~O_NONBLOCK); /* blocking, under SO_SNDTIMEO */
    pthread_t t;
    if (pthread_create(&t, attr, request_main, c) == 0) return 0;
    fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
    c->buffered = 1;
    pthread_mutex_lock(&S->mu);
    S->workers--;
    pthread_mutex_unlock(&S->mu);
    return -1;
}

/* ---------------------------------------------------------------- the loop's connections */

/* Write what is buffered without blocking. 1 all sent, 0 more to send, -1 the client is gone. */
static int flush(conn *c) {
    while (c->out_off < c->out.len) {
        ssize_t w = send(c->fd, c->out.buf + c->out_off, c->out.len - c->out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (w > 0) {
            c->out_off += (size_t)w;
            continue;
        }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
        return -1;
    }
    return 1;
}

/* The answer is in c->out: write it, then linger. 1 when c should be closed now. */
static int start_answer(server *S, conn *c) {
    if (c->out.failed || !c->out.len) return 1;
    c->state = CONN_WRITE;
    c->io_deadline = now_ms() + S->o.write_timeout_ms;
    int f = flush(c);
    if (f < 0) return 1;
    if (f == 0) return 0;
    shutdown(c->fd, SHUT_WR);
    c->state = CONN_LINGER;
    c->io_deadline = now_ms() + LINGER_MS;
    return 0;
}

/* The head of c is complete or malformed (rc from http_parse_request): answer it, or hand it to
 * a request thread. 1 when c should be closed now, 2 when it left the loop. */
static int on_head(server *S, conn *c, long rc, const http_request *r, const pthread_attr_t *attr) {
    if (rc < 0) {
        const char *msg = rc == -431 ? "request head too large" : rc == -501 ? "Transfer-Encoding request bodies are not supported; send Content-Length"
                          : rc == -505 ? "HTTP version not supported" : "malformed HTTP request";
        fail_with(c, (int)-rc, "invalid_request_error", NULL, NULL, msg);
        return start_answer(S, c);
    }
    int route = route_head(c, r);
    if (route == ROUTE_DONE) return start_answer(S, c);
    c->route = route;
    int draining;
    pthread_mutex_lock(&S->mu);
    draining = S->draining;
    pthread_mutex_unlock(&S->mu);
    if (!draining && start_request(S, c, attr) == 0) return 2;
    fail_with(c, 503, "server_error", "queue_full", NULL,
              "too many requests in progress; retry later");
    return start_answer(S, c);
}

/* Read what the client sent; decide once a line end (or the end) arrived. Same returns as on_head. */
static int on_readable_head(server *S, conn *c, const pthread_attr_t *attr) {
    while (c->len < c->cap && !c->peer_eof) {
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (n > 0) c->len += (size_t)n;
        else if (n < 0 && errno == EINTR) continue;
        else if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        else c->peer_eof = 1; /* 0: the client ended its side; < 0: reset */
    }
    /* Parse only when a line ended or nothing more can come: a head dribbled in byte by byte
     * costs one parse per line (at most 101 before 431), not one per byte. */
    int line = memchr(c->buf + c->scanned, '\n', c->len - c->scanned) != NULL;
    c->scanned = c->len;
    if (!line && c->len < c->cap && !c->peer_eof) return 0;
    http_request r;
    long rc = http_parse_request(c->buf, c->len, MAX_HEAD, &r);
    if (rc == HTTP_INCOMPLETE) {
        if (!c->peer_eof) return 0;
        if (c->len) { /* closed before a full head: nothing to answer */
            c->status = 400;
            snprintf(c->err, sizeof c->err, "connection closed before the request head was complete");
        }
        return 1;
    }
    return on_head(S, c, rc, &r, attr);
}

/* After the answer: drop what still arrives until the client closes. 1 when done. */
static int on_readable_linger(conn *c) {
    char sink[4096];
    for (;;) {
        ssize_t n = recv(c->fd, sink, sizeof sink, 0);
        if (n > 0) {
            c->dropped += (size_t)n;
            if (c->dropped >= LINGER_MAX) return 1;
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK) ? 0 : 1;
    }
}

/* Deadlines. 1 when c should be closed now. */
static int on_deadline(server *S, conn *c, double now) {
    if (c->state == CONN_HEAD) {
        if (now < c->head_deadline) return 0;
        snprintf(c->err, sizeof c->err, "request head not received in time");
        if (!c->len) { /* an idle connection: just close it */
            c->status = 408;
            return 1;
        }
        fail_with(c, 408, "invalid_request_error", "timeout", NULL, "the request head did not arrive in time");
        snprintf(c->err, sizeof c->err, "request head not received in time");
        return start_answer(S, c);
    }
    return now >= c->io_deadline;
}

static conn *conn_new(server *S, int fd, const struct sockaddr_storage *ss, const unsigned char key[16]) {
    conn *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->buf = malloc(MAX_HEAD);
    if (!c->buf) {
        free(c);
        return NULL;
    }
    c->cap = MAX_HEAD;
    c->S = S;
    c->fd = fd;
    c->buffered = 1;
    c->state = CONN_HEAD;
    c->t0 = now_ms();
    int head = S->o.head_timeout_ms < S->o.read_timeout_ms ? S->o.head_timeout_ms : S->o.read_timeout_ms;
    c->head_deadline = c->t0 + head;
    c->deadline = c->t0 + S->o.read_timeout_ms;
    c->content_length = -1;
    memcpy(c->addr, key, 16);
    struct timeval tv = {S->o.write_timeout_ms / 1000, (S->o.write_timeout_ms % 1000) * 1000};
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* SSE chunks go out at once */
    char host[INET6_ADDRSTRLEN] = "?";
    if (ss->ss_family == AF_INET) inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, host, sizeof host);
    else if (ss->ss_family == AF_INET6) inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)ss)->sin6_addr, host, sizeof host);
    snprintf(c->remote, sizeof c->remote, "%s", host);
    pthread_mutex_lock(&S->mu);
    addr_count *a = addr_find(S, key, 1);
    if (a) {
        a->unfinished++;
        c->counted = 1;
    }
    S->conns++;
    pthread_mutex_unlock(&S->mu);
    return c;
}

/* New connections on lfd, within the caps (connections.h). */
static void on_accept(server *S, conn_set *set, int lfd) {
    for (int k = 0; k < ACCEPT_BATCH; k++) {
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        int fd = accept4(lfd, (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE) { /* out of descriptors: make room, do not spin */
                int v = set_oldest(set, CONN_HEAD, NULL);
                if (v >= 0) evict(S, set, v);
                else {
                    struct timespec pause = {0, 10 * 1000000L};
                    nanosleep(&pause, NULL);
                }
            }
            return; /* EAGAIN, ECONNABORTED: try again on the next wake */
        }
        unsigned char key[16];
        addr_key(&ss, key);
        if (addr_unfinished(S, key) >= S->o.max_conns_per_addr) {
            int v = set_oldest(set, CONN_HEAD, key);
            if (v < 0) {
                refuse(S, fd, "too many unfinished requests from your address; retry later");
                continue;
            }
            evict(S, set, v);
        }
        if (set->n >= set->cap) {
            int v = set_oldest(set, CONN_HEAD, NULL);
            if (v < 0) v = set_oldest(set, CONN_LINGER, NULL);
            if (v < 0) {
                refuse(S, fd, "too many connections; retry later");
                continue;
            }
            evict(S, set, v);
        }
        conn *c = conn_new(S, fd, &ss, key);
        if (!c) {
            refuse(S, fd, "out of memory");
            continue;
        }
        set_add(set, c);
    }
}

void connections_run(server *S, const int *lfds, int nl, int wake_rd) {
    conn_set set = {calloc((size_t)S->o.max_conns, sizeof(conn *)), 0, S->o.max_conns};
    struct pollfd *p = calloc((size_t)(nl + 1 + S->o.max_conns), sizeof *p);
    if (!set.c || !p) {
        log_event("colibri serve: out of memory for %d connections", S->o.max_conns);
        free(set.c);
        free(p);
        return;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, CONN_STACK);
    for (;;) {
        double now = now_ms(), next = -1;
        int np = 0;
        for (int i = 0; i < nl; i++) p[np++] = (struct pollfd){lfds[i], POLLIN, 0};
        p[np++] = (struct pollfd){wake_rd, POLLIN, 0};
        for (int i = 0; i < set.n; i++) {
            conn *c = set.c[i];
            p[np++] = (struct pollfd){c->fd, c->state == CONN_WRITE ? POLLOUT : POLLIN, 0};
            double d = c->state == CONN_HEAD ? c->head_deadline : c->io_deadline;
            if (next < 0 || d < next) next = d;
        }
        int timeout = next < 0 ? -1 : next <= now ? 0 : (int)(next - now) + 1;
        if (poll(p, (nfds_t)np, timeout) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[nl].revents) break;
        /* the connections already held first: a probe whose head just arrived is answered
         * before new connections could make anyone give up their place */
        now = now_ms();
        for (int i = 0; i < set.n; i++) {
            conn *c = set.c[i];
            short ev = p[nl + 1 + i].revents;
            int close_now = 0;
            if (c->state == CONN_HEAD && ev) close_now = on_readable_head(S, c, &attr);
            else if (c->state == CONN_WRITE && ev) {
                int f = flush(c);
                if (f < 0) close_now = 1;
                else if (f > 0) {
                    shutdown(c->fd, SHUT_WR);
                    c->state = CONN_LINGER;
                    c->io_deadline = now + LINGER_MS;
                }
            } else if (c->state == CONN_LINGER && ev) close_now = on_readable_linger(c);
            if (close_now == 2) { /* a request thread has it now */
                set.c[i] = NULL;
                continue;
            }
            if (!close_now) close_now = on_deadline(S, c, now);
            if (close_now) {
                loop_close(S, c, 1);
                set.c[i] = NULL;
            }
        }
        set_compact(&set);
        for (int i = 0; i < nl; i++)
            if (p[i].revents & POLLIN) on_accept(S, &set, lfds[i]);
    }
    /* SIGTERM: nothing new starts; what the loop holds is closed (requests in threads drain) */
    pthread_mutex_lock(&S->mu);
    S->draining = 1;
    pthread_mutex_unlock(&S->mu);
    for (int i = 0; i < set.n; i++) {
        conn *c = set.c[i];
        if (c->state == CONN_HEAD && c->len) send_503(c->fd, "shutting_down", "the server is shutting down");
        else if (c->state == CONN_WRITE) flush(c);
        loop_close(S, c, 0);
    }
    pthread_attr_destroy(&attr);
    free(set.c);
    free(p);
}

int connections_drain(server *S) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ms = S->o.drain_timeout_ms;
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&S->mu);
    S->draining = 1;
    while (S->workers > 0)
        if (pthread_cond_timedwait(&S->conns_cv, &S->mu, &ts) == ETIMEDOUT) break;
    if (S->workers > 0) {
        atomic_store(&S->cancel_all, 1);
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 5;
        while (S->workers > 0)
            if (pthread_cond_timedwait(&S->conns_cv, &S->mu, &ts) == ETIMEDOUT) break;
    }
    int left = S->workers;
    pthread_mutex_unlock(&S->mu);
    return left;
}

int connections_init(server *S) {
    S->max_workers = S->o.slots + S->o.max_queue + WORKER_SLACK;
    struct rlimit rl;
    if (!getrlimit(RLIMIT_NOFILE, &rl)) {
        rlim_t want = (rlim_t)S->o.max_conns + (rlim_t)S->max_workers + FD_RESERVE;
        if (rl.rlim_cur < want) {
            rl.rlim_cur = want < rl.rlim_max ? want : rl.rlim_max;
            setrlimit(RLIMIT_NOFILE, &rl);
            getrlimit(RLIMIT_NOFILE, &rl);
        }
        if (rl.rlim_cur < want) {
            long fit = (long)rl.rlim_cur - S->max_workers - FD_RESERVE;
            if (fit < 16) {
                log_event("colibri serve: the descriptor limit (%ld) is too low for %d request threads; "
                          "raise LimitNOFILE or lower --max-queue", (long)rl.rlim_cur, S->max_workers);
                return -1;
            }
            log_event("{\"event\": \"limit\", \"max_connections\": %ld, \"was\": %d, \"reason\": "
                      "\"descriptor limit %ld (LimitNOFILE)\"}", fit, S->o.max_conns, (long)rl.rlim_cur);
            S->o.max_conns = (int)fit;
        }
    }
    S->n_addrs = S->o.max_conns + S->max_workers;
    S->addrs = calloc((size_t)S->n_addrs, sizeof *S->addrs);
    return S->addrs ? 0 : -1;
}

void connections_free(server *S) {
    free(S->addrs);
    S->addrs = NULL;
}
