/* Connection I/O, answers and the log line (conn.h). */
#include "conn.h"

#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "http.h"

double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

int conn_send(conn *c, const char *p, size_t n) {
    while (n > 0 && !c->write_failed) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) { /* EPIPE, ECONNRESET, or SO_SNDTIMEO expired: the client is gone */
            c->write_failed = 1;
            return -1;
        }
        p += w;
        n -= (size_t)w;
    }
    return c->write_failed ? -1 : 0;
}

int client_gone(conn *c) {
    if (c->write_failed) return 1;
    struct pollfd p = {c->fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    if (p.revents & (POLLHUP | POLLERR)) return 1; /* reset (we never shut our side before the end) */
    if (!(p.revents & POLLRDHUP)) return 0;
    /* The client ended its sending side: it closed the socket, or it half-closed and waits for
     * the answer; the two look the same from here. Once an answer has started, its writes tell
     * (a closed socket resets them). Before, send an HTTP/1.1 client an interim 100, once; an
     * HTTP/1.0 client cannot take one (RFC 9110 15.2), so it is taken to be waiting. */
    if (!c->response_started && !c->probe_sent && c->minor == 1) {
        static const char probe[] = "HTTP/1.1 100 Continue\r\n\r\n";
        c->probe_sent = 1;
        if (send(c->fd, probe, sizeof probe - 1, MSG_NOSIGNAL | MSG_DONTWAIT) < 0 && errno != EAGAIN)
            c->write_failed = 1;
    }
    return c->write_failed;
}

int conn_read_more(conn *c, double deadline) {
    for (;;) {
        int left = (int)(deadline - now_ms());
        if (left <= 0) return -1;
        struct pollfd p = {c->fd, POLLIN, 0};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -2;
        if (r == 0) return -1;
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return -2;
        if (n == 0) {
            c->peer_eof = 1;
            return 0;
        }
        c->len += (size_t)n;
        return 1;
    }
}

int conn_read_body(conn *c) {
    size_t need = c->header_len + (size_t)c->content_length;
    if (need + 1 > c->cap) { /* the head's buffer, grown to head + body (--max-body bounds it) */
        char *nb = realloc(c->buf, need + 1);
        if (!nb) {
            fail_with(c, 500, "server_error", NULL, NULL, "out of memory");
            return -1;
        }
        c->buf = nb;
        c->cap = need + 1;
    }
    if (c->expect_continue && c->len < need) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        conn_send(c, cont, sizeof cont - 1);
    }
    while (c->len < need) {
        int rc = c->peer_eof ? 0 : conn_read_more(c, c->deadline);
        if (rc == -1) {
            fail_with(c, 408, "invalid_request_error", "timeout", NULL, "the request body did not arrive in time");
            return -1;
        }
        if (rc <= 0) {
            c->status = 400;
            snprintf(c->err, sizeof c->err, "connection closed before the body was complete");
            return -1;
        }
    }
    return 0;
}

const char *conn_cors(const conn *c, char *buf, size_t cap) {
    buf[0] = '\0';
    if (c->cors_origin[0]) snprintf(buf, cap, "Access-Control-Allow-Origin: %s\r\nVary: Origin\r\n", c->cors_origin);
    return buf;
}

static void emit(conn *c, const char *p, size_t n) {
    if (c->buffered) jb_raw(&c->out, p, n);
    else conn_send(c, p, n);
}

void respond(conn *c, int status, const char *ctype, const char *body, size_t n, const char *extra) {
    char head[1024], cors[320], framing[128] = "";
    if (status != 204) /* RFC 9110 8.6: no Content-Length (and no body) in a 204 */
        snprintf(framing, sizeof framing, "Content-Type: %s\r\nContent-Length: %zu\r\n", ctype, n);
    int h = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\n%sCache-Control: no-store\r\nConnection: close\r\n%s%s\r\n",
                     status, http_status_text(status), framing, conn_cors(c, cors, sizeof cors),
                     extra ? extra : "");
    if (h < 0 || (size_t)h >= sizeof head) h = 0; /* cannot happen: every part is bounded */
    c->status = status;
    c->response_started = 1;
    emit(c, head, (size_t)h);
    if (n) emit(c, body, n);
}

void respond_json(conn *c, int status, const json_buf *b, const char *extra) {
    if (b->failed) {
        static const char oom[] = "{\"error\": {\"message\": \"out of memory\", \"type\": "
                                  "\"server_error\", \"param\": null, \"code\": null}}";
        respond(c, 500, "application/json", oom, sizeof oom - 1, NULL);
        return;
    }
    respond(c, status, "application/json", b->buf, b->len, extra);
}

void respond_error(conn *c, const oai_error *e) {
    json_buf b = {0};
    oai_error_json(&b, e);
    const char *extra = NULL;
    if (e->status == 503) extra = "Retry-After: 1\r\n";
    else if (e->status == 401) extra = "WWW-Authenticate: Bearer\r\n";
    else if (e->status == 405) extra = !strcmp(c->path, "/health") || !strcmp(c->path, "/metrics") ||
                                               !strncmp(c->path, "/v1/models", 10)
                                           ? "Allow: GET\r\n" : "Allow: POST\r\n";
    snprintf(c->err, sizeof c->err, "%s", e->message);
    respond_json(c, e->status, &b, extra);
    jb_free(&b);
}

void fail_with(conn *c, int status, const char *type, const char *code, const char *param, const char *msg) {
    oai_error e;
    oai_set_error(&e, status, type, code, param, "%s", msg);
    respond_error(c, &e);
}

void log_request(const conn *c) {
    json_buf b = {0};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    char when[40];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    jb_printf(&b, "{\"ts\": \"%s.%03ldZ\", \"remote\": ", when, ts.tv_nsec / 1000000);
    jb_cstr(&b, c->remote);
    jb_puts(&b, ", \"method\": ");
    jb_cstr(&b, c->method);
    jb_puts(&b, ", \"path\": ");
    jb_cstr(&b, c->path);
    jb_printf(&b, ", \"status\": %d, \"ms\": %.3f", c->status, now_ms() - c->t0);
    if (c->prompt_tokens || c->completion_tokens || c->finish)
        jb_printf(&b, ", \"queue_ms\": %.3f, \"first_token_ms\": %.3f, \"prompt_tokens\": %d, "
                      "\"completion_tokens\": %d, \"stream\": %s",
                  c->queue_ms, c->first_token_ms, c->prompt_tokens, c->completion_tokens,
                  c->stream ? "true" : "false");
    if (c->finish) {
        jb_puts(&b, ", \"finish_reason\": ");
        jb_cstr(&b, c->finish);
    }
    if (c->deadline_ms > 0)
        jb_printf(&b, ", \"deadline_ms\": %g, \"deadline_missed\": %s", c->deadline_ms,
                  c->deadline_missed ? "true" : "false");
    if (c->err[0]) {
        jb_puts(&b, ", \"error\": ");
        jb_cstr(&b, c->err);
    }
    jb_puts(&b, "}\n");
    if (!b.failed) {
        /* one write(2) per line, so lines from concurrent connections never interleave */
        ssize_t w = write(STDERR_FILENO, b.buf, b.len);
        (void)w;
    }
    jb_free(&b);
}

void log_event(const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    ssize_t w = write(STDERR_FILENO, line, (size_t)n);
    (void)w;
}
