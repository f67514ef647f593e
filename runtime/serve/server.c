/* `colibri serve` (server.h): listening, connections, slots and queue, generation, metrics,
 * logging, shutdown. HTTP parsing is http.c, JSON json.c, the OpenAI request shapes oai.c. */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "http.h"
#include "json.h"
#include "oai.h"

#define MAX_HEAD 16384          /* request head limit (431 beyond) */
#define MAX_LISTEN 4            /* listening sockets (a host name may resolve to v4 and v6) */
#define CONN_SLACK 8            /* connections beyond slots + queue, for /health and /metrics */
#define CONN_STACK (1024 * 1024) /* the connection thread runs the forward pass (worker 0) and,
                                    on the CUDA backend, driver calls: room to spare */

/* ---------------------------------------------------------------- small helpers */

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* ---------------------------------------------------------------- metrics */

static const double FIRST_TOKEN_BUCKETS[] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30};
static const double TOKEN_BUCKETS[] = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5};
#define N_FT (sizeof FIRST_TOKEN_BUCKETS / sizeof FIRST_TOKEN_BUCKETS[0])
#define N_TOK (sizeof TOKEN_BUCKETS / sizeof TOKEN_BUCKETS[0])

typedef struct {
    unsigned long long count, bucket[16];
    double sum;
} histogram;

static void hist_add(histogram *h, const double *bounds, size_t n, double v) {
    h->count++;
    h->sum += v;
    for (size_t i = 0; i < n; i++)
        if (v <= bounds[i]) { h->bucket[i]++; break; }
}

typedef struct {
    unsigned long long by_status[600];
    unsigned long long prompt_tokens, generated_tokens, cancelled, rejected_queue_full;
    histogram first_token, per_token;
} metrics;

/* ---------------------------------------------------------------- slots and the queue */

typedef struct slot {
    int index;
    colibri_ctx *ctx;           /* one sequence over the shared model */
    struct slot *next_free;
} slot;

typedef struct waiter {
    struct waiter *next;
    slot *got;                  /* handed over by release_slot */
    pthread_cond_t cv;
} waiter;

typedef struct {
    server_options o;
    char model_id[128];
    char api_key[256];
    size_t api_key_len;
    colibri_model_info info;
    colibri_model *model;       /* mapped once, shared by every slot's context */
    colibri_detok_fn detok;     /* NULL when the model carries no tokenizer: ids only */
    colibri_tokenizer_info tinfo;
    int has_chat_template;      /* the model file carries chat.template */
    slot *slots;
    int n_slots;
    pthread_mutex_t mu;         /* everything below */
    pthread_cond_t conns_cv;    /* a connection ended (shutdown waits on it) */
    slot *free_slots;
    int busy, queued, conns, max_conns;
    waiter *qhead, *qtail;
    int ready, draining, cancel_all;
    uint64_t id_state;
    metrics m;
} server;

/* The self-pipe the signal handler writes to (a handler cannot reach a server otherwise). */
static int g_wake_fd = -1;

static void on_signal(int sig) {
    int saved = errno;
    char c = (char)sig;
    if (g_wake_fd >= 0 && write(g_wake_fd, &c, 1) < 0) { /* nothing to do in a handler */ }
    errno = saved;
}

/* ---------------------------------------------------------------- connections: I/O */

typedef struct {
    server *S;
    int fd;
    char remote[64];
    char *buf;                  /* head, then head + body */
    size_t len, cap;
    double t0;                  /* accept time */
    double deadline;            /* read deadline (ms, monotonic) */
    /* for the log line */
    char method[17];
    char path[129];
    int status;
    int prompt_tokens, completion_tokens, stream;
    double queue_ms, first_token_ms;
    const char *finish;
    char err[320];
    int write_failed;
} conn;

static int send_all(conn *c, const char *p, size_t n) {
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

/* Has the client closed its side or reset the connection? (Never blocks.) */
static int client_gone(conn *c) {
    if (c->write_failed) return 1;
    struct pollfd p = {c->fd, POLLIN | POLLRDHUP, 0};
    if (poll(&p, 1, 0) <= 0) return 0;
    return (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

/* Read more bytes before the deadline. 1 read, 0 peer closed, -1 timeout, -2 error. */
static int read_more(conn *c) {
    for (;;) {
        int left = (int)(c->deadline - now_ms());
        if (left <= 0) return -1;
        struct pollfd p = {c->fd, POLLIN, 0};
        int r = poll(&p, 1, left);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -2;
        if (r == 0) return -1;
        ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n < 0) return -2;
        if (n == 0) return 0;
        c->len += (size_t)n;
        return 1;
    }
}

static void respond(conn *c, int status, const char *ctype, const char *body, size_t n,
                    const char *extra) {
    char head[512];
    int h = snprintf(head, sizeof head,
                     "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
                     "Cache-Control: no-store\r\nConnection: close\r\n%s\r\n",
                     status, http_status_text(status), ctype, n, extra ? extra : "");
    c->status = status;
    if (send_all(c, head, (size_t)h) == 0 && n) send_all(c, body, n);
}

static void respond_json(conn *c, int status, const json_buf *b, const char *extra) {
    if (b->failed) {
        static const char oom[] = "{\"error\": {\"message\": \"out of memory\", \"type\": "
                                  "\"server_error\", \"param\": null, \"code\": null}}";
        respond(c, 500, "application/json", oom, sizeof oom - 1, NULL);
        return;
    }
    respond(c, status, "application/json", b->buf, b->len, extra);
}

static void respond_error(conn *c, const oai_error *e) {
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

static void fail_with(conn *c, int status, const char *type, const char *code, const char *param,
                      const char *msg) {
    oai_error e;
    oai_set_error(&e, status, type, code, param, "%s", msg);
    respond_error(c, &e);
}

/* ---------------------------------------------------------------- logging */

/* One JSON line per request on stderr (journald keeps it). The API key and the Authorization
 * header are never part of it. */
static void log_request(conn *c) {
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

static void log_event(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void log_event(const char *fmt, ...) {
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

/* ---------------------------------------------------------------- slot pool */

enum { ACQ_OK = 0, ACQ_FULL = 1, ACQ_GONE = 2 };

/* A free slot now, or a place in the FIFO queue until release_slot hands one over. While
 * queued, the client's connection is watched: a client that leaves gives its place up. */
static int acquire_slot(server *S, conn *c, slot **out) {
    pthread_mutex_lock(&S->mu);
    if (S->free_slots && !S->qhead) {
        *out = S->free_slots;
        S->free_slots = (*out)->next_free;
        S->busy++;
        pthread_mutex_unlock(&S->mu);
        return ACQ_OK;
    }
    if (S->queued >= S->o.max_queue) {
        S->m.rejected_queue_full++;
        pthread_mutex_unlock(&S->mu);
        return ACQ_FULL;
    }
    waiter w = {NULL, NULL, PTHREAD_COND_INITIALIZER};
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&w.cv, &ca);
    pthread_condattr_destroy(&ca);
    if (S->qtail) S->qtail->next = &w;
    else S->qhead = &w;
    S->qtail = &w;
    S->queued++;
    int rc = ACQ_OK;
    while (!w.got) {
        struct timespec ts;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        ts.tv_nsec += 100 * 1000000L;
        if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
        pthread_cond_timedwait(&w.cv, &S->mu, &ts);
        if (!w.got && (S->cancel_all || client_gone(c))) {
            rc = ACQ_GONE;
            break;
        }
    }
    if (rc == ACQ_GONE) { /* leave the queue */
        waiter **pp = &S->qhead;
        while (*pp && *pp != &w) pp = &(*pp)->next;
        if (*pp) *pp = w.next;
        S->qtail = NULL;
        for (waiter *q = S->qhead; q; q = q->next) S->qtail = q;
        S->queued--;
    } else {
        *out = w.got; /* release_slot unlinked us, counted us busy and decremented queued */
    }
    pthread_mutex_unlock(&S->mu);
    pthread_cond_destroy(&w.cv);
    return rc;
}

static void release_slot(server *S, slot *s) {
    pthread_mutex_lock(&S->mu);
    waiter *w = S->qhead;
    if (w) { /* hand the slot straight to the longest waiter: FIFO, no thundering herd */
        S->qhead = w->next;
        if (!S->qhead) S->qtail = NULL;
        S->queued--;
        w->got = s;
        pthread_cond_signal(&w->cv);
    } else {
        s->next_free = S->free_slots;
        S->free_slots = s;
        S->busy--;
    }
    pthread_mutex_unlock(&S->mu);
}

/* ---------------------------------------------------------------- generation
 *
 * The service's use of the runtime's generation loop (colibri_generate: prefill, sampling,
 * EOS/stop ids and stop strings, UTF-8-safe text): prompt ids in, ids and final text out
 * through a callback that also polls for cancellation (client gone, drain deadline). */

typedef struct {
    int max_tokens;
    colibri_sampling sampling;
    const char *stop[OAI_MAX_STOP];
    int n_stop;
} gen_params;

typedef struct {
    /* id >= 0: a generated token; id == -1: the end. text: bytes that became final. Return
     * non-zero to stop (the client went away). */
    int (*on_token)(void *user, int32_t id, const char *text, size_t len);
    int (*cancelled)(void *user);   /* polled between tokens */
    void *user;
} gen_callbacks;

enum { FINISH_LENGTH, FINISH_STOP, FINISH_CANCELLED, FINISH_ERROR };

typedef struct {
    const gen_callbacks *cb;
    size_t emitted;             /* text bytes handed to on_token so far */
} bridge;

static int bridge_token(void *user, int32_t id, const char *text, size_t len) {
    bridge *b = user;
    /* A detokenizer whose text for more ids is not an extension of its text for fewer would
     * make the loop's "new bytes" negative: never pass that on (see serve_detok). */
    if (len > ((size_t)1 << 30)) len = 0;
    b->emitted += len;
    if (b->cb->on_token(b->cb->user, id, text, len)) return 1;
    return id >= 0 && b->cb->cancelled(b->cb->user);
}

static size_t full_text(const server *S, const int32_t *ids, int n, char **out);

static int slot_generate(server *S, slot *s, const int32_t *ids, int n, const gen_params *p,
                         const gen_callbacks *cb, char *err, size_t errlen) {
    if (cb->cancelled(cb->user)) return FINISH_CANCELLED;
    int32_t *out = malloc((size_t)p->max_tokens * sizeof *out);
    if (!out) {
        snprintf(err, errlen, "out of memory");
        return FINISH_ERROR;
    }
    bridge br = {cb, 0};
    colibri_generate_params g;
    colibri_default_generate_params(&g);
    g.prompt = ids;
    g.n_prompt = n;
    g.max_new = p->max_tokens;
    g.sampling = p->sampling;
    g.stop_ids = S->tinfo.n_stop ? S->tinfo.stop_ids : NULL;
    g.n_stop_ids = S->tinfo.n_stop;
    g.stop_strings = p->n_stop ? p->stop : NULL;
    g.n_stop_strings = p->n_stop;
    g.detok = S->detok;
    g.detok_user = (void *)S;
    g.on_token = bridge_token;
    g.user = &br;
    colibri_generate_result r;
    colibri_status st = colibri_generate(s->ctx, &g, out, &r);
    if (!st && S->detok && r.finish != COLIBRI_FINISH_CANCELLED && r.stop_string < 0) {
        /* serve_detok holds back trailing U+FFFD (they may still become a character); at the
         * end they are final: send what the whole answer decodes to beyond what was sent */
        char *all = NULL;
        size_t len = full_text(S, out, r.n_new, &all);
        if (all && len > br.emitted) cb->on_token(cb->user, -1, all + br.emitted, len - br.emitted);
        free(all);
    }
    free(out);
    if (st) {
        snprintf(err, errlen, "%s: %s", colibri_strerror(st), colibri_last_error(s->ctx));
        return FINISH_ERROR;
    }
    switch (r.finish) {
    case COLIBRI_FINISH_STOP: return FINISH_STOP;
    case COLIBRI_FINISH_CANCELLED: return FINISH_CANCELLED;
    default: return FINISH_LENGTH; /* max_tokens, or the context is full */
    }
}

/* ---------------------------------------------------------------- text
 *
 * Text prompts, chat messages, stop strings and the `text` of answers need the model's
 * tokenizer and chat template (format v2 metadata). Until the runtime has them, the service
 * takes prompts as token ids and answers with token ids (`token_ids`, next to an empty text). */

static int text_supported(const server *S) { return S->detok != NULL; }

/* The text of ids as the model's tokenizer decodes it (malloc'd in *out; length returned). The
 * text calls read only the shared model, so every connection thread may use slot 0's context
 * for them at once (colibri.h, "Text"). */
static size_t full_text(const server *S, const int32_t *ids, int n, char **out) {
    size_t len = 0;
    *out = NULL;
    colibri_status st = colibri_detokenize(S->slots[0].ctx, ids, (size_t)n, 1, NULL, 0, &len);
    if (st && st != COLIBRI_E_BUFFER_TOO_SMALL) return 0;
    *out = malloc(len + 1);
    if (!*out) return 0;
    if (colibri_detokenize(S->slots[0].ctx, ids, (size_t)n, 1, *out, len, &len)) {
        free(*out);
        *out = NULL;
        return 0;
    }
    return len;
}

/* colibri_detok_fn for the generation loop. The tokenizer decodes bytes that are not (yet)
 * UTF-8 to U+FFFD, and such a trailing U+FFFD may become a character with the next token, so the
 * text for more ids would not extend the text for fewer. Trailing U+FFFD are held back here
 * (slot_generate sends them at the end): the text the loop sees only ever grows. */
static size_t serve_detok(void *user, const int32_t *ids, int n, char *out, size_t cap) {
    const server *S = user;
    size_t len = 0;
    colibri_status st = colibri_detokenize(S->slots[0].ctx, ids, (size_t)n, 1, out, cap, &len);
    if (st == COLIBRI_E_BUFFER_TOO_SMALL) return len; /* the loop retries with room for len */
    if (st) return 0;
    while (len >= 3 && !memcmp(out + len - 3, "\xEF\xBF\xBD", 3)) len -= 3;
    return len;
}

static int tokenize_text(server *S, oai_request *rq, int add_special, oai_error *e);

/* Chat messages -> the model's chat template text (with the generation prompt) -> rq->ids. The
 * template's text carries its own BOS, so it is tokenized without adding special tokens. */
static int render_chat(server *S, oai_request *rq, oai_error *e) {
    colibri_chat_message *msgs = calloc((size_t)rq->n_messages, sizeof *msgs);
    if (!msgs) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    for (int i = 0; i < rq->n_messages; i++) {
        /* OpenAI's "developer" role is the newer name of "system" */
        msgs[i].role = strcmp(rq->messages[i].role, "developer") ? rq->messages[i].role : "system";
        msgs[i].content = rq->messages[i].content;
    }
    char why[256] = "";
    size_t need = 0;
    char *text = NULL;
    colibri_status st = colibri_chat_render(S->model, msgs, rq->n_messages, 1, NULL, 0, &need, why, sizeof why);
    if (!st) {
        text = malloc(need + 1);
        st = text ? colibri_chat_render(S->model, msgs, rq->n_messages, 1, text, need + 1, &need, why, sizeof why)
                  : COLIBRI_E_NO_MEMORY;
    }
    free(msgs);
    if (st) {
        free(text);
        if (st == COLIBRI_E_NO_MEMORY) oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        else oai_set_error(e, 400, "invalid_request_error", "unsupported_conversation", "messages",
                           "%s", why[0] ? why : colibri_strerror(st));
        return -1;
    }
    rq->text = text;
    rq->text_len = need;
    int rc = tokenize_text(S, rq, 0, e);
    rq->text = NULL;
    free(text);
    return rc;
}

/* The text prompt -> rq->ids, with the special tokens the model's tokenizer adds by default. */
static int tokenize_text(server *S, oai_request *rq, int add_special, oai_error *e) {
    const colibri_ctx *tc = S->slots[0].ctx;
    size_t need = 0;
    colibri_status st = colibri_tokenize(tc, rq->text, rq->text_len, add_special, NULL, 0, &need);
    if (st && st != COLIBRI_E_BUFFER_TOO_SMALL) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "tokenizer: %s", colibri_strerror(st));
        return -1;
    }
    rq->ids = malloc((need ? need : 1) * sizeof *rq->ids);
    if (!rq->ids) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    st = colibri_tokenize(tc, rq->text, rq->text_len, add_special, rq->ids, need, &need);
    if (st) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "tokenizer: %s", colibri_strerror(st));
        return -1;
    }
    rq->n_ids = (int)need;
    return 0;
}

/* ---------------------------------------------------------------- completions */

typedef struct {
    conn *c;
    server *S;
    const oai_request *rq;
    char id[40];
    long created;
    int32_t *out;               /* generated ids (non-streaming and usage) */
    int n_out;
    double t_req, t_last;       /* request read; last token */
    json_buf text;              /* non-streaming: the answer's text */
    json_buf chunk;             /* streaming: one event */
} completion;

static void chunk_head(completion *k) {
    json_buf *b = &k->chunk;
    jb_reset(b);
    jb_printf(b, "data: {\"id\": \"%s\", \"object\": \"%s\", \"created\": %ld, \"model\": ", k->id,
              k->rq->chat ? "chat.completion.chunk" : "text_completion", k->created);
    jb_cstr(b, k->S->model_id);
    jb_puts(b, ", \"choices\": [");
}

static int send_chunk(completion *k) {
    jb_puts(&k->chunk, "\n\n");
    if (k->chunk.failed) return -1;
    return send_all(k->c, k->chunk.buf, k->chunk.len);
}

static void usage_json(json_buf *b, int prompt, int completion) {
    jb_printf(b, "{\"prompt_tokens\": %d, \"completion_tokens\": %d, \"total_tokens\": %d}", prompt,
              completion, prompt + completion);
}

static int on_token(void *user, int32_t id, const char *text, size_t len) {
    completion *k = user;
    server *S = k->S;
    if (id >= 0) {
        double t = now_ms();
        pthread_mutex_lock(&S->mu);
        if (k->n_out == 0) hist_add(&S->m.first_token, FIRST_TOKEN_BUCKETS, N_FT, (t - k->t_req) / 1e3);
        else hist_add(&S->m.per_token, TOKEN_BUCKETS, N_TOK, (t - k->t_last) / 1e3);
        S->m.generated_tokens++;
        pthread_mutex_unlock(&S->mu);
        if (k->n_out == 0) k->c->first_token_ms = t - k->t_req;
        k->t_last = t;
        k->out[k->n_out++] = id;
    }
    if (!k->rq->stream) {
        jb_raw(&k->text, text, len);
        return 0;
    }
    if (id < 0 && len == 0) return 0; /* the end, with no text held back */
    chunk_head(k);
    json_buf *b = &k->chunk;
    jb_puts(b, k->rq->chat ? "{\"index\": 0, \"delta\": {\"content\": " : "{\"index\": 0, \"text\": ");
    jb_str(b, text ? text : "", len);
    jb_puts(b, k->rq->chat ? "}, " : ", ");
    jb_puts(b, "\"logprobs\": null, \"finish_reason\": null, \"token_ids\": [");
    if (id >= 0) jb_printf(b, "%d", (int)id);
    jb_puts(b, "]}]}");
    return send_chunk(k) ? 1 : 0;
}

static int gen_cancelled(void *user) {
    completion *k = user;
    int all;
    pthread_mutex_lock(&k->S->mu);
    all = k->S->cancel_all;
    pthread_mutex_unlock(&k->S->mu);
    return all || client_gone(k->c);
}

static const char *finish_name(int f) {
    return f == FINISH_STOP ? "stop" : f == FINISH_LENGTH ? "length" : f == FINISH_CANCELLED ? "cancelled" : "error";
}

static void stream_start(conn *c) {
    static const char head[] = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
                               "Cache-Control: no-cache\r\nConnection: close\r\n\r\n";
    c->status = 200;
    send_all(c, head, sizeof head - 1);
}

static void stream_finish(completion *k, int finish, const char *err) {
    json_buf *b = &k->chunk;
    if (finish == FINISH_ERROR) { /* mid-stream failure: an error event, and no [DONE] */
        oai_error e;
        oai_set_error(&e, 500, "server_error", NULL, NULL, "%s", err);
        jb_reset(b);
        jb_puts(b, "data: ");
        oai_error_json(b, &e);
        send_chunk(k);
        return;
    }
    chunk_head(k);
    if (k->rq->chat) jb_puts(b, "{\"index\": 0, \"delta\": {}, \"logprobs\": null, \"finish_reason\": ");
    else jb_puts(b, "{\"index\": 0, \"text\": \"\", \"logprobs\": null, \"finish_reason\": ");
    jb_printf(b, "\"%s\", \"token_ids\": []}]}", finish_name(finish));
    if (send_chunk(k)) return;
    if (k->rq->include_usage) {
        chunk_head(k);
        jb_puts(b, "], \"usage\": ");
        usage_json(b, k->c->prompt_tokens, k->n_out);
        jb_puts(b, "}");
        if (send_chunk(k)) return;
    }
    static const char done[] = "data: [DONE]\n\n";
    send_all(k->c, done, sizeof done - 1);
}

static void respond_completion(completion *k, int finish) {
    json_buf b = {0};
    const oai_request *rq = k->rq;
    jb_printf(&b, "{\"id\": \"%s\", \"object\": \"%s\", \"created\": %ld, \"model\": ", k->id,
              rq->chat ? "chat.completion" : "text_completion", k->created);
    jb_cstr(&b, k->S->model_id);
    jb_puts(&b, ", \"choices\": [{\"index\": 0, ");
    if (rq->chat) {
        jb_puts(&b, "\"message\": {\"role\": \"assistant\", \"content\": ");
        jb_str(&b, k->text.buf ? k->text.buf : "", k->text.len);
        jb_puts(&b, "}, ");
    } else {
        jb_puts(&b, "\"text\": ");
        jb_str(&b, k->text.buf ? k->text.buf : "", k->text.len);
        jb_puts(&b, ", ");
    }
    jb_printf(&b, "\"logprobs\": null, \"finish_reason\": \"%s\", \"token_ids\": [", finish_name(finish));
    for (int i = 0; i < k->n_out; i++) jb_printf(&b, "%s%d", i ? ", " : "", (int)k->out[i]);
    jb_puts(&b, "]}], \"usage\": ");
    usage_json(&b, k->c->prompt_tokens, k->n_out);
    jb_puts(&b, "}");
    respond_json(k->c, 200, &b, NULL);
    jb_free(&b);
}

static void handle_completion(conn *c, int chat, const char *body, size_t len) {
    server *S = c->S;
    json_doc doc;
    oai_request rq;
    oai_error e;
    memset(&rq, 0, sizeof rq);
    if (json_parse(&doc, body, len)) {
        oai_set_error(&e, 400, "invalid_request_error", NULL, NULL,
                      "We could not parse the JSON body of your request: %s", doc.err);
        respond_error(c, &e);
        json_free(&doc);
        return;
    }
    if (oai_decode(&doc, chat, &rq, &e)) goto fail;
    c->stream = rq.stream;
    if (strcmp(rq.model, S->model_id)) {
        oai_set_error(&e, 404, "invalid_request_error", "model_not_found", "model",
                      "The model '%.100s' does not exist; this server serves '%s'", rq.model, S->model_id);
        goto fail;
    }
    if (!text_supported(S)) {
        const char *what = chat ? "chat messages" : rq.text ? "a text prompt" : rq.n_stop ? "'stop' strings" : NULL;
        if (what) {
            oai_set_error(&e, 400, "invalid_request_error", "tokenizer_unavailable",
                          chat ? "messages" : rq.text ? "prompt" : "stop",
                          "this server has no tokenizer for model '%s', so it cannot take %s; "
                          "send the prompt as an array of token ids", S->model_id, what);
            goto fail;
        }
    }
    if (chat && !S->has_chat_template) {
        oai_set_error(&e, 400, "invalid_request_error", "chat_template_unavailable", "messages",
                      "model '%s' has no chat template (re-convert it from a checkpoint that has "
                      "one, or give one with --chat-template); use /v1/completions", S->model_id);
        goto fail;
    }
    if (chat && render_chat(S, &rq, &e)) goto fail;
    if (!chat && rq.text && tokenize_text(S, &rq, 1, &e)) goto fail;
    const int32_t *ids = rq.ids;
    int n = rq.n_ids;
    if (n <= 0) {
        oai_set_error(&e, 400, "invalid_request_error", NULL, "prompt", "the prompt is empty");
        goto fail;
    }
    for (int i = 0; i < n; i++)
        if ((uint32_t)ids[i] >= S->info.vocab_size) {
            oai_set_error(&e, 400, "invalid_request_error", NULL, "prompt",
                          "token id %d at index %d is outside the vocabulary (0..%u)", (int)ids[i], i,
                          S->info.vocab_size - 1);
            goto fail;
        }
    long room = (long)S->info.max_seq_len - n;
    long max_tokens = rq.max_tokens >= 0 ? (long)rq.max_tokens : chat ? room : (room < 16 ? room : 16);
    if (room < 1 || max_tokens > room) {
        oai_set_error(&e, 400, "invalid_request_error", "context_length_exceeded", "max_tokens",
                      "This model's maximum context length is %u tokens. However, you requested "
                      "%ld tokens (%d in your prompt; %ld for the completion).",
                      S->info.max_seq_len, n + (max_tokens > 0 ? max_tokens : 1), n,
                      max_tokens > 0 ? max_tokens : 1);
        goto fail;
    }
    c->prompt_tokens = n;

    completion k;
    memset(&k, 0, sizeof k);
    k.c = c;
    k.S = S;
    k.rq = &rq;
    k.t_req = now_ms();
    k.created = (long)time(NULL);
    k.out = malloc((size_t)max_tokens * sizeof *k.out);
    if (!k.out) {
        oai_set_error(&e, 500, "server_error", NULL, NULL, "out of memory");
        goto fail;
    }
    pthread_mutex_lock(&S->mu);
    uint64_t rid = splitmix64(&S->id_state);
    pthread_mutex_unlock(&S->mu);
    snprintf(k.id, sizeof k.id, "%s-%016llx", chat ? "chatcmpl" : "cmpl", (unsigned long long)rid);

    slot *s = NULL;
    int acq = acquire_slot(S, c, &s);
    c->queue_ms = now_ms() - k.t_req;
    if (acq == ACQ_FULL) {
        oai_set_error(&e, 503, "server_error", "queue_full",  NULL,
                      "all %d slots are busy and %d requests are queued; retry later",
                      S->n_slots, S->o.max_queue);
        free(k.out);
        goto fail;
    }
    if (acq == ACQ_GONE) {
        free(k.out);
        if (!client_gone(c)) { /* still there: the drain deadline passed while it waited */
            oai_set_error(&e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
            goto fail;
        }
        c->status = 499; /* nginx's "client closed request": nothing is sent */
        snprintf(c->err, sizeof c->err, "client left while queued");
        oai_request_free(&rq);
        json_free(&doc);
        return;
    }
    pthread_mutex_lock(&S->mu);
    S->m.prompt_tokens += (unsigned long long)n;
    pthread_mutex_unlock(&S->mu);
    gen_params p;
    memset(&p, 0, sizeof p);
    p.max_tokens = (int)max_tokens;
    colibri_default_sampling(&p.sampling);
    p.sampling.temperature = (float)rq.temperature;
    p.sampling.top_p = (float)rq.top_p;
    p.sampling.seed = rq.seed_set ? rq.seed : rid;
    p.n_stop = rq.n_stop;
    for (int i = 0; i < rq.n_stop; i++) p.stop[i] = rq.stop[i];
    gen_callbacks cb = {on_token, gen_cancelled, &k};
    char gerr[256] = "";
    if (rq.stream) {
        stream_start(c);
        if (rq.chat) { /* the first chunk carries the role, as OpenAI's does */
            chunk_head(&k);
            jb_puts(&k.chunk, "{\"index\": 0, \"delta\": {\"role\": \"assistant\", \"content\": \"\"}, "
                              "\"logprobs\": null, \"finish_reason\": null}]}");
            send_chunk(&k);
        }
    }
    int finish = slot_generate(S, s, ids, n, &p, &cb, gerr, sizeof gerr);
    release_slot(S, s);
    c->completion_tokens = k.n_out;
    c->finish = finish_name(finish);
    if (finish == FINISH_CANCELLED) {
        pthread_mutex_lock(&S->mu);
        int shutting_down = S->cancel_all;
        if (!shutting_down) S->m.cancelled++;
        pthread_mutex_unlock(&S->mu);
        if (shutting_down && !client_gone(c)) {
            /* the drain deadline passed: say so instead of cutting the answer off silently */
            oai_set_error(&e, 503, "server_error", "shutting_down", NULL,
                          "the server is shutting down; generation stopped after %d tokens", k.n_out);
            if (rq.stream) {
                jb_reset(&k.chunk);
                jb_puts(&k.chunk, "data: ");
                oai_error_json(&k.chunk, &e);
                send_chunk(&k);
                snprintf(c->err, sizeof c->err, "%s", e.message);
            } else {
                respond_error(c, &e);
            }
        } else {
            if (!rq.stream) c->status = 499; /* nginx's "client closed request": nothing sent */
            snprintf(c->err, sizeof c->err, "client disconnected; generation stopped");
        }
    } else if (rq.stream) {
        stream_finish(&k, finish, gerr);
        if (finish == FINISH_ERROR) snprintf(c->err, sizeof c->err, "%s", gerr);
    } else if (finish == FINISH_ERROR) {
        oai_set_error(&e, 500, "server_error", NULL, NULL, "%s", gerr);
        respond_error(c, &e);
    } else {
        respond_completion(&k, finish);
    }
    free(k.out);
    jb_free(&k.text);
    jb_free(&k.chunk);
    oai_request_free(&rq);
    json_free(&doc);
    return;
fail:
    respond_error(c, &e);
    oai_request_free(&rq);
    json_free(&doc);
}

/* ---------------------------------------------------------------- the cheap endpoints */

static void handle_health(conn *c) {
    server *S = c->S;
    pthread_mutex_lock(&S->mu);
    int busy = S->busy, queued = S->queued, draining = S->draining, ready = S->ready;
    pthread_mutex_unlock(&S->mu);
    const char *state = draining ? "draining" : !ready ? "loading"
                        : (busy >= S->n_slots && queued >= S->o.max_queue) ? "full" : "ok";
    json_buf b = {0};
    jb_printf(&b, "{\"status\": \"%s\", \"model\": ", state);
    jb_cstr(&b, S->model_id);
    jb_printf(&b, ", \"slots\": %d, \"slots_busy\": %d, \"queued\": %d, \"max_queue\": %d}", S->n_slots,
              busy, queued, S->o.max_queue);
    respond_json(c, strcmp(state, "ok") ? 503 : 200, &b, strcmp(state, "ok") ? "Retry-After: 1\r\n" : NULL);
    jb_free(&b);
}

static void hist_text(json_buf *b, const char *name, const char *help, const histogram *h,
                      const double *bounds, size_t n) {
    jb_printf(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    unsigned long long acc = 0;
    for (size_t i = 0; i < n; i++) {
        acc += h->bucket[i];
        jb_printf(b, "%s_bucket{le=\"%g\"} %llu\n", name, bounds[i], acc);
    }
    jb_printf(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, h->count, name,
              h->sum, name, h->count);
}

static void handle_metrics(conn *c) {
    server *S = c->S;
    pthread_mutex_lock(&S->mu);
    metrics m = S->m;
    int busy = S->busy, queued = S->queued, draining = S->draining;
    pthread_mutex_unlock(&S->mu);
    m.by_status[200]++; /* this answer */
    json_buf b = {0};
    jb_puts(&b, "# HELP colibri_requests_total HTTP requests answered, by status code.\n"
                "# TYPE colibri_requests_total counter\n");
    for (int s = 100; s < 600; s++)
        if (m.by_status[s]) jb_printf(&b, "colibri_requests_total{code=\"%d\"} %llu\n", s, m.by_status[s]);
    jb_printf(&b, "# HELP colibri_prompt_tokens_total Prompt tokens processed.\n"
                  "# TYPE colibri_prompt_tokens_total counter\ncolibri_prompt_tokens_total %llu\n"
                  "# HELP colibri_generated_tokens_total Tokens generated.\n"
                  "# TYPE colibri_generated_tokens_total counter\ncolibri_generated_tokens_total %llu\n"
                  "# HELP colibri_requests_cancelled_total Generations stopped because the client left.\n"
                  "# TYPE colibri_requests_cancelled_total counter\ncolibri_requests_cancelled_total %llu\n"
                  "# HELP colibri_requests_rejected_total Requests refused with 503 because the queue was full.\n"
                  "# TYPE colibri_requests_rejected_total counter\ncolibri_requests_rejected_total %llu\n",
              m.prompt_tokens, m.generated_tokens, m.cancelled, m.rejected_queue_full);
    hist_text(&b, "colibri_first_token_seconds", "Time from request to first generated token.",
              &m.first_token, FIRST_TOKEN_BUCKETS, N_FT);
    hist_text(&b, "colibri_token_seconds", "Time between consecutive generated tokens.", &m.per_token,
              TOKEN_BUCKETS, N_TOK);
    jb_printf(&b, "# HELP colibri_queue_depth Requests waiting for a slot.\n"
                  "# TYPE colibri_queue_depth gauge\ncolibri_queue_depth %d\n"
                  "# HELP colibri_queue_capacity Most requests that may wait.\n"
                  "# TYPE colibri_queue_capacity gauge\ncolibri_queue_capacity %d\n"
                  "# HELP colibri_slots_busy Slots generating.\n"
                  "# TYPE colibri_slots_busy gauge\ncolibri_slots_busy %d\n"
                  "# HELP colibri_slots Slots (contexts sharing the model).\n"
                  "# TYPE colibri_slots gauge\ncolibri_slots %d\n"
                  "# HELP colibri_draining 1 after SIGTERM while in-flight requests finish.\n"
                  "# TYPE colibri_draining gauge\ncolibri_draining %d\n",
              queued, S->o.max_queue, busy, S->n_slots, draining);
    if (b.failed) fail_with(c, 500, "server_error", NULL, NULL, "out of memory");
    else respond(c, 200, "text/plain; version=0.0.4; charset=utf-8", b.buf, b.len, NULL);
    jb_free(&b);
}

static void handle_models(conn *c, int one) {
    server *S = c->S;
    json_buf b = {0};
    if (!one) jb_puts(&b, "{\"object\": \"list\", \"data\": [");
    jb_puts(&b, "{\"id\": ");
    jb_cstr(&b, S->model_id);
    jb_printf(&b, ", \"object\": \"model\", \"created\": 0, \"owned_by\": \"colibri\", "
                  "\"max_model_len\": %u, \"vocab_size\": %u}", S->info.max_seq_len, S->info.vocab_size);
    if (!one) jb_puts(&b, "]}");
    respond_json(c, 200, &b, NULL);
    jb_free(&b);
}

/* ---------------------------------------------------------------- one connection */

static int authorized(const server *S, const http_request *r) {
    if (!S->api_key_len) return 1;
    if (!r->authorization || r->authorization_len < 7 || !http_eq(r->authorization, 7, "bearer "))
        return 0;
    const char *k = r->authorization + 7;
    size_t n = r->authorization_len - 7;
    /* constant time in the key's bytes, so timing does not reveal a matching prefix */
    unsigned char diff = n != S->api_key_len;
    for (size_t i = 0; i < S->api_key_len; i++) diff |= (unsigned char)(S->api_key[i] ^ (i < n ? k[i] : 0));
    return diff == 0;
}

static void route(conn *c, const http_request *r) {
    server *S = c->S;
    int get = http_eq(r->method, r->method_len, "GET");
    int post = http_eq(r->method, r->method_len, "POST");
    const char *p = c->path;
    int is_models_one = !strncmp(p, "/v1/models/", 11) && p[11];
    int known_get = !strcmp(p, "/health") || !strcmp(p, "/metrics") || !strcmp(p, "/v1/models") || is_models_one;
    int known_post = !strcmp(p, "/v1/completions") || !strcmp(p, "/v1/chat/completions");
    if (!known_get && !known_post) {
        fail_with(c, 404, "invalid_request_error", "not_found", NULL, "no such endpoint");
        return;
    }
    if ((known_get && !get) || (known_post && !post)) {
        fail_with(c, 405, "invalid_request_error", "method_not_allowed", NULL,
                  known_get ? "use GET" : "use POST");
        return;
    }
    if (strcmp(p, "/health") && !authorized(S, r)) {
        fail_with(c, 401, "invalid_request_error", "invalid_api_key", NULL,
                  "Incorrect or missing API key: send 'Authorization: Bearer <key>'");
        return;
    }
    if (!strcmp(p, "/health")) { handle_health(c); return; }
    if (!strcmp(p, "/metrics")) { handle_metrics(c); return; }
    if (!strcmp(p, "/v1/models")) { handle_models(c, 0); return; }
    if (is_models_one) {
        if (strcmp(p + 11, S->model_id))
            fail_with(c, 404, "invalid_request_error", "model_not_found", "model", "no such model");
        else handle_models(c, 1);
        return;
    }
    /* POST: the body, under the same deadline as the head */
    if (r->content_length < 0) {
        fail_with(c, 411, "invalid_request_error", NULL, NULL, "a Content-Length is required");
        return;
    }
    if (r->content_length > S->o.max_body) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is larger than %ld bytes", S->o.max_body);
        fail_with(c, 413, "invalid_request_error", "request_too_large", NULL, msg);
        return;
    }
    size_t need = r->header_len + (size_t)r->content_length;
    if (need + 1 > c->cap) {
        char *nb = realloc(c->buf, need + 1);
        if (!nb) {
            fail_with(c, 500, "server_error", NULL, NULL, "out of memory");
            return;
        }
        c->buf = nb;
        c->cap = need + 1;
    }
    if (r->expect_continue && c->len < need) {
        static const char cont[] = "HTTP/1.1 100 Continue\r\n\r\n";
        send_all(c, cont, sizeof cont - 1);
    }
    while (c->len < need) {
        int rc = read_more(c);
        if (rc == -1) {
            fail_with(c, 408, "invalid_request_error", "timeout", NULL, "the request body did not arrive in time");
            return;
        }
        if (rc <= 0) {
            c->status = 400;
            snprintf(c->err, sizeof c->err, "connection closed before the body was complete");
            return;
        }
    }
    /* The body starts at header_len inside c->buf; a realloc above moved c->buf, so the body
     * is addressed from the buffer, not from the request's pointers (which are not used now). */
    handle_completion(c, !strcmp(p, "/v1/chat/completions"), c->buf + r->header_len, (size_t)r->content_length);
}

static void serve_connection(conn *c) {
    c->buf = malloc(MAX_HEAD);
    if (!c->buf) return;
    c->cap = MAX_HEAD;
    c->deadline = c->t0 + c->S->o.read_timeout_ms;
    http_request r;
    long rc;
    for (;;) {
        rc = http_parse_request(c->buf, c->len, MAX_HEAD, &r);
        if (rc != HTTP_INCOMPLETE) break;
        int got = read_more(c);
        if (got == -1) {
            if (c->len) fail_with(c, 408, "invalid_request_error", "timeout", NULL, "the request head did not arrive in time");
            else c->status = 408; /* an idle connection: just close it */
            snprintf(c->err, sizeof c->err, "request head not received in time");
            return;
        }
        if (got <= 0) { /* closed before a full head: nothing to answer */
            c->status = 400;
            snprintf(c->err, sizeof c->err, "connection closed before the request head was complete");
            return;
        }
    }
    if (rc < 0) {
        const char *msg = rc == -431 ? "request head too large" : rc == -501 ? "Transfer-Encoding request bodies are not supported; send Content-Length"
                          : rc == -505 ? "HTTP version not supported" : "malformed HTTP request";
        fail_with(c, (int)-rc, "invalid_request_error", NULL, NULL, msg);
        return;
    }
    snprintf(c->method, sizeof c->method, "%.*s", (int)r.method_len, r.method);
    snprintf(c->path, sizeof c->path, "%.*s", (int)(r.path_len < 128 ? r.path_len : 128), r.path);
    route(c, &r);
}

/* Close after the answer without losing it: closing a socket with unread input (a refused
 * oversized head or body) makes the kernel send a reset, which can destroy the response before
 * the client reads it. So: end our side, then read and drop what the client still sends for a
 * short while, until it closes too. */
static void linger_close(int fd) {
    shutdown(fd, SHUT_WR);
    char sink[4096];
    double end = now_ms() + 500;
    size_t dropped = 0;
    while (dropped < (1u << 20)) {
        int left = (int)(end - now_ms());
        struct pollfd p = {fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, left) <= 0) break;
        ssize_t n = recv(fd, sink, sizeof sink, 0);
        if (n <= 0) break;
        dropped += (size_t)n;
    }
    close(fd);
}

static void *conn_main(void *arg) {
    conn *c = arg;
    server *S = c->S;
    serve_connection(c);
    if (c->status) {
        pthread_mutex_lock(&S->mu);
        if (c->status < 600) S->m.by_status[c->status]++;
        pthread_mutex_unlock(&S->mu);
        log_request(c);
    }
    linger_close(c->fd);
    free(c->buf);
    free(c);
    pthread_mutex_lock(&S->mu);
    S->conns--;
    pthread_cond_broadcast(&S->conns_cv);
    pthread_mutex_unlock(&S->mu);
    return NULL;
}

/* ---------------------------------------------------------------- start-up */

void server_default_options(server_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->slots = 1;
    o->max_queue = 16;
    o->max_body = 1 << 20;
    o->read_timeout_ms = 10000;
    o->write_timeout_ms = 30000;
    o->drain_timeout_ms = 30000;
    o->backend = COLIBRI_BACKEND_AUTO;
}

static int is_loopback(const struct sockaddr *sa) {
    if (sa->sa_family == AF_INET)
        return (ntohl(((const struct sockaddr_in *)sa)->sin_addr.s_addr) >> 24) == 127;
    if (sa->sa_family == AF_INET6) {
        const struct in6_addr *a = &((const struct sockaddr_in6 *)sa)->sin6_addr;
        if (IN6_IS_ADDR_LOOPBACK(a)) return 1;
        if (IN6_IS_ADDR_V4MAPPED(a)) return a->s6_addr[12] == 127;
    }
    return 0;
}

/* Read the API key: the file's first line, without surrounding whitespace. */
static int load_key(server *S, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) {
        log_event("colibri serve: cannot read the API key file %s: %s", path, strerror(errno));
        return -1;
    }
    char line[512];
    size_t n = fgets(line, sizeof line, f) ? strlen(line) : 0;
    fclose(f);
    size_t s = 0;
    while (s < n && (line[s] == ' ' || line[s] == '\t')) s++;
    while (n > s && (line[n - 1] == '\n' || line[n - 1] == '\r' || line[n - 1] == ' ' || line[n - 1] == '\t')) n--;
    if (n - s < 8 || n - s >= sizeof S->api_key) {
        log_event("colibri serve: the API key in %s must be 8..255 characters on its first line", path);
        return -1;
    }
    for (size_t i = s; i < n; i++)
        if ((unsigned char)line[i] <= 0x20 || (unsigned char)line[i] >= 0x7F) {
            log_event("colibri serve: the API key in %s must be printable ASCII without spaces", path);
            return -1;
        }
    memcpy(S->api_key, line + s, n - s);
    S->api_key_len = n - s;
    return 0;
}

static int open_listeners(server *S, int *fds, int *nfds, int *port_out) {
    char port[16];
    snprintf(port, sizeof port, "%d", S->o.port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
    int gai = getaddrinfo(S->o.host, port, &hints, &res);
    if (gai) {
        log_event("colibri serve: cannot resolve --host %s: %s", S->o.host, gai_strerror(gai));
        return -1;
    }
    int loop_only = 1;
    for (struct addrinfo *a = res; a; a = a->ai_next) loop_only &= is_loopback(a->ai_addr);
    if (!loop_only && !S->api_key_len) {
        log_event("colibri serve: --host %s is reachable beyond this machine; give --api-key-file "
                  "(clients then send 'Authorization: Bearer <key>')", S->o.host);
        freeaddrinfo(res);
        return -1;
    }
    *nfds = 0;
    for (struct addrinfo *a = res; a && *nfds < MAX_LISTEN; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (a->ai_family == AF_INET6) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
        if (*nfds && *port_out) { /* port 0: the later sockets take the port the first one got */
            if (a->ai_family == AF_INET) ((struct sockaddr_in *)a->ai_addr)->sin_port = htons((uint16_t)*port_out);
            else if (a->ai_family == AF_INET6) ((struct sockaddr_in6 *)a->ai_addr)->sin6_port = htons((uint16_t)*port_out);
        }
        if (bind(fd, a->ai_addr, a->ai_addrlen) || listen(fd, 128)) {
            log_event("colibri serve: cannot listen on %s port %d: %s", S->o.host, S->o.port, strerror(errno));
            close(fd);
            for (int i = 0; i < *nfds; i++) close(fds[i]);
            freeaddrinfo(res);
            return -1;
        }
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (!getsockname(fd, (struct sockaddr *)&ss, &sl))
            *port_out = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                       : ((struct sockaddr_in *)&ss)->sin_port);
        fds[(*nfds)++] = fd;
    }
    freeaddrinfo(res);
    if (!*nfds) {
        log_event("colibri serve: no usable address for --host %s", S->o.host);
        return -1;
    }
    return 0;
}

static int load_slots(server *S) {
    const server_options *o = &S->o;
    colibri_options opt;
    char err[512] = "";
    colibri_default_options(&opt);
    opt.threads = o->threads;
    opt.backend = o->backend;
    opt.int8_activations = o->int8_activations;
    opt.kv_dtype = o->kv_dtype;
    opt.error = err;
    opt.error_len = sizeof err;
    /* The model is mapped and validated once; every slot is a context over it with its own
     * arena (KV cache) and compute threads. */
    colibri_status st = colibri_model_load(&S->model, o->model_path, &opt);
    if (st) {
        log_event("colibri serve: %s: %s: %s", o->model_path, colibri_strerror(st), err);
        return -1;
    }
    colibri_model_get_info(S->model, &S->info);
    S->slots = calloc((size_t)o->slots, sizeof *S->slots);
    if (!S->slots) return -1;
    for (int i = 0; i < o->slots; i++) {
        slot *s = &S->slots[i];
        st = colibri_ctx_new(&s->ctx, S->model, &opt);
        if (st) {
            log_event("colibri serve: %s: slot %d: %s: %s", o->model_path, i, colibri_strerror(st), err);
            return -1;
        }
        s->index = i;
        s->next_free = S->free_slots;
        S->free_slots = s;
        S->n_slots = i + 1;
    }
    return 0;
}

static void free_slots(server *S) {
    for (int i = 0; i < S->n_slots; i++) colibri_free(S->slots[i].ctx);
    free(S->slots);
    colibri_model_free(S->model);
}

static void model_id_from_path(server *S) {
    if (S->o.model_id) {
        snprintf(S->model_id, sizeof S->model_id, "%s", S->o.model_id);
        return;
    }
    const char *base = strrchr(S->o.model_path, '/');
    base = base ? base + 1 : S->o.model_path;
    size_t n = strlen(base);
    if (n > 8 && !strcmp(base + n - 8, ".colibri")) n -= 8;
    snprintf(S->model_id, sizeof S->model_id, "%.*s", (int)n, base);
}

static void reject_busy(int fd) {
    static const char body[] = "{\"error\": {\"message\": \"too many connections; retry later\", "
                               "\"type\": \"server_error\", \"param\": null, \"code\": \"queue_full\"}}";
    char msg[512];
    int n = snprintf(msg, sizeof msg,
                     "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                     "Content-Length: %zu\r\nRetry-After: 1\r\nConnection: close\r\n\r\n%s",
                     sizeof body - 1, body);
    ssize_t w = send(fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)w;
}

/* Accept until a signal arrives on the wake pipe. */
static void accept_loop(server *S, int *lfds, int nl, int wake_rd) {
    struct pollfd p[MAX_LISTEN + 1];
    for (int i = 0; i < nl; i++) p[i] = (struct pollfd){lfds[i], POLLIN, 0};
    p[nl] = (struct pollfd){wake_rd, POLLIN, 0};
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, CONN_STACK);
    for (;;) {
        if (poll(p, (nfds_t)nl + 1, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (p[nl].revents) break;
        for (int i = 0; i < nl; i++) {
            if (!(p[i].revents & POLLIN)) continue;
            struct sockaddr_storage ss;
            socklen_t sl = sizeof ss;
            int fd = accept4(lfds[i], (struct sockaddr *)&ss, &sl, SOCK_CLOEXEC);
            if (fd < 0) {
                if (errno == EMFILE || errno == ENFILE) { /* out of descriptors: do not spin */
                    struct timespec pause = {0, 100 * 1000000L};
                    nanosleep(&pause, NULL);
                }
                continue; /* EAGAIN, ECONNABORTED: try again on the next wake */
            }
            pthread_mutex_lock(&S->mu);
            int over = S->conns >= S->max_conns;
            if (!over) S->conns++;
            else S->m.by_status[503]++;
            pthread_mutex_unlock(&S->mu);
            if (over) {
                reject_busy(fd);
                close(fd);
                continue;
            }
            conn *c = calloc(1, sizeof *c);
            if (!c) goto drop;
            c->S = S;
            c->fd = fd;
            c->t0 = now_ms();
            struct timeval tv = {S->o.write_timeout_ms / 1000, (S->o.write_timeout_ms % 1000) * 1000};
            setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one); /* SSE chunks go out at once */
            char host[INET6_ADDRSTRLEN] = "?";
            if (ss.ss_family == AF_INET) inet_ntop(AF_INET, &((struct sockaddr_in *)&ss)->sin_addr, host, sizeof host);
            else if (ss.ss_family == AF_INET6) inet_ntop(AF_INET6, &((struct sockaddr_in6 *)&ss)->sin6_addr, host, sizeof host);
            snprintf(c->remote, sizeof c->remote, "%s", host);
            pthread_t t;
            if (pthread_create(&t, &attr, conn_main, c) == 0) continue;
            free(c);
        drop:
            close(fd);
            pthread_mutex_lock(&S->mu);
            S->conns--;
            pthread_mutex_unlock(&S->mu);
        }
    }
    pthread_attr_destroy(&attr);
}

/* After SIGTERM: wait for in-flight connections until the drain deadline, then cancel what is
 * still generating and give it a moment to answer. Returns the connections left. */
static int drain(server *S) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    long ms = S->o.drain_timeout_ms;
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) { ts.tv_sec++; ts.tv_nsec -= 1000000000L; }
    pthread_mutex_lock(&S->mu);
    S->draining = 1;
    while (S->conns > 0)
        if (pthread_cond_timedwait(&S->conns_cv, &S->mu, &ts) == ETIMEDOUT) break;
    if (S->conns > 0) {
        S->cancel_all = 1;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 5;
        while (S->conns > 0)
            if (pthread_cond_timedwait(&S->conns_cv, &S->mu, &ts) == ETIMEDOUT) break;
    }
    int left = S->conns;
    pthread_mutex_unlock(&S->mu);
    return left;
}

int server_run(const server_options *o) {
    static server S; /* one per process: the signal handler's pipe is process-wide too */
    memset(&S, 0, sizeof S);
    S.o = *o;
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.conns_cv, NULL);
    S.max_conns = o->slots + o->max_queue + CONN_SLACK;
    S.id_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    model_id_from_path(&S);
    if (o->api_key_file && load_key(&S, o->api_key_file)) return 1;

    int lfds[MAX_LISTEN], nl = 0, port = 0;
    if (open_listeners(&S, lfds, &nl, &port)) return 1;
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC | O_NONBLOCK)) {
        log_event("colibri serve: pipe: %s", strerror(errno));
        return 1;
    }
    g_wake_fd = pipefd[1];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);

    double t0 = now_ms();
    if (load_slots(&S)) {
        free_slots(&S);
        return 1;
    }
    colibri_get_tokenizer_info(S.slots[0].ctx, &S.tinfo);
    if (S.tinfo.n_stop < 0 || S.tinfo.n_stop > 16) S.tinfo.n_stop = 0;
    if (S.tinfo.has_tokenizer) S.detok = serve_detok;
    S.has_chat_template = S.tinfo.has_tokenizer && colibri_chat_available(S.model);
    colibri_runtime_info ri;
    colibri_get_runtime_info(S.slots[0].ctx, &ri);
    S.ready = 1;
    json_buf b = {0};
    jb_puts(&b, "{\"event\": \"ready\", \"host\": ");
    jb_cstr(&b, o->host);
    jb_printf(&b, ", \"port\": %d, \"model\": ", port);
    jb_cstr(&b, S.model_id);
    jb_printf(&b, ", \"slots\": %d, \"threads_per_slot\": %d, \"max_queue\": %d, \"backend\": \"%s\", "
                  "\"kv_cache\": \"%s\", \"api_key\": %s, \"load_ms\": %.1f, \"tokenizer\": %s, \"chat_template\": %s, \"cuda_fallback\": ",
              S.n_slots, ri.threads, o->max_queue, ri.backend, ri.kv_dtype, S.api_key_len ? "true" : "false",
              now_ms() - t0, S.tinfo.has_tokenizer ? "true" : "false", S.has_chat_template ? "true" : "false");
    if (ri.fallback_reason[0]) jb_cstr(&b, ri.fallback_reason);
    else jb_puts(&b, "null");
    jb_puts(&b, "}");
    log_event("%s", b.failed ? "{\"event\": \"ready\"}" : b.buf);
    jb_free(&b);

    accept_loop(&S, lfds, nl, pipefd[0]);
    for (int i = 0; i < nl; i++) close(lfds[i]); /* new connections are refused from here on */
    log_event("{\"event\": \"draining\", \"in_flight\": %d, \"deadline_ms\": %d}", S.conns, o->drain_timeout_ms);
    int left = drain(&S);
    log_event("{\"event\": \"stopped\", \"unfinished\": %d}", left);
    if (left == 0) free_slots(&S); /* a stuck connection thread may still use its slot */
    return 0;
}
