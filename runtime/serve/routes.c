/* Request checks and the cheap endpoints (routes.h). */
#include "routes.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- Host and Origin */

static int is_loopback_name(const char *name, size_t n, int v6) {
    char tmp[64];
    if (n >= sizeof tmp) return 0;
    memcpy(tmp, name, n);
    tmp[n] = '\0';
    if (v6) {
        struct in6_addr a;
        return inet_pton(AF_INET6, tmp, &a) == 1 && IN6_IS_ADDR_LOOPBACK(&a);
    }
    struct in_addr a;
    if (inet_pton(AF_INET, tmp, &a) == 1) return (ntohl(a.s_addr) >> 24) == 127;
    /* RFC 6761 6.3: localhost and names under it are loopback, resolved by the client itself */
    return http_eq(tmp, n, "localhost") || (n > 10 && http_eq(tmp + n - 10, 10, ".localhost"));
}

/* The Host policy: 0 allowed, 400 malformed or missing, 403 refused. */
static int host_verdict(const server *S, const char *host, size_t n, int minor) {
    if (!host) return minor == 1 ? 400 : 0; /* HTTP/1.0 had no Host: nothing to check */
    const char *name;
    size_t len;
    int v6;
    if (http_split_host(host, n, &name, &len, &v6)) return 400;
    if (S->any_host) return 0;
    if (!S->loopback_bind && !S->n_allow_host) return 0; /* reachable by any name it has */
    if (is_loopback_name(name, len, v6)) return 0;
    for (int i = 0; i < S->n_allow_host; i++)
        if (http_eq(name, len, S->allow_host[i])) return 0;
    return 403;
}

static int origin_allowed(const server *S, const char *o, size_t n) {
    if (S->any_origin) return 1;
    for (int i = 0; i < S->n_allow_origin; i++)
        if (http_eq(o, n, S->allow_origin[i])) return 1;
    return 0;
}

/* One --allow-host entry: a host name or IPv4 literal, or an IPv6 literal in brackets. */
static int valid_host_entry(const char *e) {
    const char *name;
    size_t len;
    int v6;
    size_t n = strlen(e);
    return n && n < 256 && !http_split_host(e, n, &name, &len, &v6) && (v6 ? len + 2 : len) == n;
}

/* One --allow-origin entry: "scheme://host[:port]" as browsers send it, or "null". */
static int valid_origin_entry(const char *e) {
    size_t n = strlen(e);
    if (!strcmp(e, "null")) return 1;
    const char *sep = strstr(e, "://");
    if (!sep || sep == e || n >= 256) return 0;
    for (const char *p = e; p < sep; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '+' ||
              *p == '-' || *p == '.'))
            return 0;
    const char *name;
    size_t len;
    int v6;
    const char *h = sep + 3;
    return *h && !http_split_host(h, strlen(h), &name, &len, &v6);
}

static int add_names(const char *const *lists, int n_lists, const char **out, int *n_out,
                     int *any, int (*valid)(const char *), const char *option, char **cursor) {
    for (int i = 0; i < n_lists; i++) {
        const char *p = lists[i];
        for (;;) {
            const char *comma = strchr(p, ',');
            size_t n = comma ? (size_t)(comma - p) : strlen(p);
            while (n && (*p == ' ' || *p == '\t')) { p++; n--; }
            while (n && (p[n - 1] == ' ' || p[n - 1] == '\t')) n--;
            char *e = *cursor;
            memcpy(e, p, n);
            e[n] = '\0';
            *cursor += n + 1;
            if (!strcmp(e, "*")) *any = 1;
            else if (!valid(e)) {
                log_event("colibri serve: %s '%s' is not valid (%s)", option, e,
                          valid == valid_host_entry ? "a host name, an IPv4 address or [an IPv6 address], no port"
                                                    : "an origin as browsers send it: scheme://host[:port], or null");
                return -1;
            } else if (*n_out >= SERVE_MAX_NAMES) {
                log_event("colibri serve: at most %d %s entries", SERVE_MAX_NAMES, option);
                return -1;
            } else out[(*n_out)++] = e;
            if (!comma) break;
            p = comma + 1;
        }
    }
    return 0;
}

int routes_init(server *S) {
    size_t total = 1;
    for (int i = 0; i < S->o.n_allow_host; i++) total += strlen(S->o.allow_host[i]) + 1;
    for (int i = 0; i < S->o.n_allow_origin; i++) total += strlen(S->o.allow_origin[i]) + 1;
    S->names = malloc(total);
    if (!S->names) return -1;
    char *cursor = S->names;
    if (add_names(S->o.allow_host, S->o.n_allow_host, S->allow_host, &S->n_allow_host, &S->any_host,
                  valid_host_entry, "--allow-host", &cursor))
        return -1;
    for (int i = 0; i < S->n_allow_host; i++)
        if (S->allow_host[i][0] == '[') { /* compared without brackets, as http_split_host gives names */
            char *e = (char *)S->allow_host[i] + 1;
            e[strlen(e) - 1] = '\0';
            S->allow_host[i] = e;
        }
    return add_names(S->o.allow_origin, S->o.n_allow_origin, S->allow_origin, &S->n_allow_origin,
                     &S->any_origin, valid_origin_entry, "--allow-origin", &cursor);
}

void routes_free(server *S) {
    free(S->names);
    S->names = NULL;
}

/* ---------------------------------------------------------------- the key */

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

/* ---------------------------------------------------------------- the cheap endpoints */

static void handle_health(conn *c) {
    server *S = c->S;
    int busy, queued;
    pool_counts(&S->pool, &busy, &queued);
    pthread_mutex_lock(&S->mu);
    int draining = S->draining, ready = S->ready;
    pthread_mutex_unlock(&S->mu);
    const char *state = draining ? "draining" : !ready ? "loading"
                        : (busy >= S->pool.n && queued >= S->o.max_queue) ? "full" : "ok";
    json_buf b = {0};
    jb_printf(&b, "{\"status\": \"%s\", \"model\": ", state);
    jb_cstr(&b, S->model_id);
    jb_printf(&b, ", \"slots\": %d, \"slots_busy\": %d, \"queued\": %d, \"max_queue\": %d}", S->pool.n,
              busy, queued, S->o.max_queue);
    int ok = !strcmp(state, "ok");
    respond_json(c, ok ? 200 : 503, &b, ok ? NULL : "Retry-After: 1\r\n");
    jb_free(&b);
}

static void handle_metrics(conn *c) {
    server *S = c->S;
    metrics_gauges g;
    pool_counts(&S->pool, &g.slots_busy, &g.queued);
    g.slots = S->pool.n;
    g.max_queue = S->o.max_queue;
    pthread_mutex_lock(&S->mu);
    metrics m = S->m;
    g.draining = S->draining;
    g.connections = S->conns;
    pthread_mutex_unlock(&S->mu);
    m.by_status[200]++; /* this answer */
    g.batching = S->pool.engine != NULL && !S->pool.batch_off[0];
    g.batch_passes = g.batch_rows = g.batch_seqs = 0;
    g.batch_busy_ms = g.batch_step_ms = 0;
    memset(&g.batch_times, 0, sizeof g.batch_times);
    if (S->pool.engine) {
        pthread_mutex_lock(&S->pool.batch.mu);
        g.batch_passes = S->pool.batch.passes;
        g.batch_rows = S->pool.batch.rows;
        g.batch_seqs = S->pool.batch.seqs;
        g.batch_busy_ms = S->pool.batch.busy_ms;
        g.batch_step_ms = S->pool.batch.step_ms;
        g.batch_times = S->pool.batch.times;
        m.gen_minor_faults += S->pool.batch.minor_faults; /* the engine computes for the slots */
        m.gen_major_faults += S->pool.batch.major_faults;
        pthread_mutex_unlock(&S->pool.batch.mu);
    }
    prefix_stats ps;
    prefix_get_stats(&S->pool.prefix, &ps);
    g.prefix_entries = ps.entries;
    g.prefix_readers = ps.readers;
    g.prefix_bytes = (double)ps.bytes;
    g.prefix_capacity = (double)ps.limit;
    g.prefix_hits = ps.hits;
    g.prefix_misses = ps.misses;
    g.prefix_tokens_saved = ps.tokens_saved;
    g.prefix_evictions = ps.evictions;
    json_buf b = {0};
    metrics_text(&b, &m, &g);
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

/* ---------------------------------------------------------------- the decision */

static int is_json_type(const char *v, size_t n) {
    const char *semi = memchr(v, ';', n);
    size_t m = semi ? (size_t)(semi - v) : n;
    while (m && (v[m - 1] == ' ' || v[m - 1] == '\t')) m--;
    return http_eq(v, m, "application/json");
}

int route_head(conn *c, const http_request *r) {
    server *S = c->S;
    snprintf(c->method, sizeof c->method, "%.*s", (int)r->method_len, r->method);
    snprintf(c->path, sizeof c->path, "%.*s", (int)(r->path_len < 128 ? r->path_len : 128), r->path);
    c->minor = r->minor;

    int hv = host_verdict(S, r->host, r->host_len, r->minor);
    if (hv == 400) {
        fail_with(c, 400, "invalid_request_error", "invalid_host", NULL,
                  r->host ? "the Host header is not a valid host[:port]"
                          : "an HTTP/1.1 request needs a Host header (RFC 9112, section 3.2)");
        return ROUTE_DONE;
    }
    if (hv == 403) {
        char msg[320];
        snprintf(msg, sizeof msg, "Host '%.*s' is not allowed here: this server answers to loopback "
                 "names%s; start it with --allow-host NAME to add one",
                 (int)(r->host_len < 100 ? r->host_len : 100), r->host, S->n_allow_host ? " and its --allow-host names" : "");
        fail_with(c, 403, "permission_error", "host_not_allowed", NULL, msg);
        return ROUTE_DONE;
    }
    if (r->origin) {
        if (r->origin_len >= sizeof c->cors_origin || !origin_allowed(S, r->origin, r->origin_len)) {
            char msg[320];
            snprintf(msg, sizeof msg, "requests from web pages (Origin '%.*s') are refused; start the "
                     "server with --allow-origin ORIGIN to serve that page",
                     (int)(r->origin_len < 100 ? r->origin_len : 100), r->origin);
            fail_with(c, 403, "permission_error", "origin_not_allowed", NULL, msg);
            return ROUTE_DONE;
        }
        memcpy(c->cors_origin, r->origin, r->origin_len);
        c->cors_origin[r->origin_len] = '\0';
    }

    int get = http_eq(r->method, r->method_len, "GET");
    int post = http_eq(r->method, r->method_len, "POST");
    const char *p = c->path;
    int is_models_one = !strncmp(p, "/v1/models/", 11) && p[11];
    int known_get = !strcmp(p, "/health") || !strcmp(p, "/metrics") || !strcmp(p, "/v1/models") || is_models_one;
    int known_post = !strcmp(p, "/v1/completions") || !strcmp(p, "/v1/chat/completions");
    if (!known_get && !known_post) {
        fail_with(c, 404, "invalid_request_error", "not_found", NULL, "no such endpoint");
        return ROUTE_DONE;
    }
    if (c->cors_origin[0] && http_eq(r->method, r->method_len, "OPTIONS")) {
        /* a CORS preflight from an allowed page (Fetch standard, "CORS protocol") */
        respond(c, 204, NULL, NULL, 0,
                known_get ? "Access-Control-Allow-Methods: GET\r\nAccess-Control-Allow-Headers: Authorization\r\n"
                            "Access-Control-Max-Age: 600\r\n"
                          : "Access-Control-Allow-Methods: POST\r\nAccess-Control-Allow-Headers: Authorization, "
                            "Content-Type\r\nAccess-Control-Max-Age: 600\r\n");
        return ROUTE_DONE;
    }
    if ((known_get && !get) || (known_post && !post)) {
        fail_with(c, 405, "invalid_request_error", "method_not_allowed", NULL, known_get ? "use GET" : "use POST");
        return ROUTE_DONE;
    }
    if (strcmp(p, "/health") && !authorized(S, r)) {
        fail_with(c, 401, "invalid_request_error", "invalid_api_key", NULL,
                  "Incorrect or missing API key: send 'Authorization: Bearer <key>'");
        return ROUTE_DONE;
    }
    if (!strcmp(p, "/health")) { handle_health(c); return ROUTE_DONE; }
    if (!strcmp(p, "/metrics")) { handle_metrics(c); return ROUTE_DONE; }
    if (!strcmp(p, "/v1/models")) { handle_models(c, 0); return ROUTE_DONE; }
    if (is_models_one) {
        if (strcmp(p + 11, S->model_id))
            fail_with(c, 404, "invalid_request_error", "model_not_found", "model", "no such model");
        else handle_models(c, 1);
        return ROUTE_DONE;
    }
    if (r->content_length < 0) {
        fail_with(c, 411, "invalid_request_error", NULL, NULL, "a Content-Length is required");
        return ROUTE_DONE;
    }
    if (r->content_length > S->o.max_body) {
        char msg[96];
        snprintf(msg, sizeof msg, "the request body is larger than %ld bytes", S->o.max_body);
        fail_with(c, 413, "invalid_request_error", "request_too_large", NULL, msg);
        return ROUTE_DONE;
    }
    if (!r->content_type || !is_json_type(r->content_type, r->content_type_len)) {
        fail_with(c, 415, "invalid_request_error", "unsupported_media_type", NULL,
                  "the request body must be JSON: send 'Content-Type: application/json'");
        return ROUTE_DONE;
    }
    c->header_len = r->header_len;
    c->content_length = r->content_length;
    c->expect_continue = r->expect_continue;
    return !strcmp(p, "/v1/chat/completions") ? ROUTE_CHAT : ROUTE_COMPLETION;
}
