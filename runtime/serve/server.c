/* `colibri serve` start-up and shutdown (server.h): options, the API key, the listening
 * sockets, the model and its slots, the ready line; then the event loop (connections.c) until
 * SIGTERM/SIGINT, and the drain. */
#include "server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "connections.h"
#include "routes.h"
#include "service.h"
#include "warm.h"

#define MAX_LISTEN 4            /* listening sockets (a host name may resolve to v4 and v6) */

void server_default_options(server_options *o) {
    memset(o, 0, sizeof *o);
    o->host = "127.0.0.1";
    o->port = 8080;
    o->slots = 1;
    o->max_queue = 16;
    o->max_body = 1 << 20;
    o->head_timeout_ms = 5000;
    o->read_timeout_ms = 10000;
    o->write_timeout_ms = 30000;
    o->drain_timeout_ms = 30000;
    o->max_conns = 256;
    o->max_conns_per_addr = 32;
    o->backend = COLIBRI_BACKEND_AUTO;
    o->prefix_cache_mb = -1;
}

/* The self-pipe the signal handler writes to (a handler cannot reach a server otherwise). */
static int g_wake_fd = -1;

static void on_signal(int sig) {
    int saved = errno;
    char c = (char)sig;
    if (g_wake_fd >= 0 && write(g_wake_fd, &c, 1) < 0) { /* nothing to do in a handler */ }
    errno = saved;
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
    S->loopback_bind = loop_only;
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

static int load_model(server *S) {
    const server_options *o = &S->o;
    colibri_options opt;
    char err[512] = "", why[700];
    colibri_default_options(&opt);
    opt.threads = o->threads;
    opt.backend = o->backend;
    opt.int8_activations = o->int8_activations;
    opt.kv_dtype = o->kv_dtype;
    opt.cpus = o->n_cpus ? o->cpus : NULL;   /* slot i takes its own run (slots.c) */
    opt.n_cpus = o->n_cpus ? o->threads : 0;
    opt.sched = o->sched;
    opt.sched_priority = o->sched_priority;
    opt.lock_memory = o->lock_memory;
    opt.barrier = o->barrier;
    opt.error = err;
    opt.error_len = sizeof err;
    pool_config cfg = {!o->no_batching, o->prefix_cache_mb, o->prompt_rows};
    if (pool_open(&S->pool, o->model_path, &opt, o->slots, o->max_queue, &cfg, why, sizeof why)) {
        log_event("colibri serve: %s", why);
        return -1;
    }
    colibri_model_get_info(S->pool.model, &S->info);
    colibri_get_tokenizer_info(S->pool.slots[0].ctx, &S->tinfo);
    if (S->tinfo.n_stop < 0 || S->tinfo.n_stop > 16) S->tinfo.n_stop = 0;
    S->has_chat_template = S->tinfo.has_tokenizer && colibri_chat_available(S->pool.model);
    return 0;
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

static void log_ready(server *S, int port, double load_ms, int warm, int warm_tokens) {
    const server_options *o = &S->o;
    colibri_runtime_info ri;
    colibri_get_runtime_info(S->pool.slots[0].ctx, &ri);
    prefix_stats ps;
    prefix_get_stats(&S->pool.prefix, &ps);
    json_buf b = {0};
    jb_puts(&b, "{\"event\": \"ready\", \"host\": ");
    jb_cstr(&b, o->host);
    jb_printf(&b, ", \"port\": %d, \"model\": ", port);
    jb_cstr(&b, S->model_id);
    jb_printf(&b, ", \"slots\": %d, \"threads\": %d, \"max_queue\": %d, \"backend\": \"%s\", "
                  "\"kv_cache\": \"%s\", \"api_key\": %s, \"load_ms\": %.1f, \"tokenizer\": %s, \"chat_template\": %s, "
                  "\"max_connections\": %d, \"max_connections_per_address\": %d, \"cuda_fallback\": ",
              S->pool.n, S->pool.threads, o->max_queue, ri.backend, ri.kv_dtype, S->api_key_len ? "true" : "false",
              load_ms, S->tinfo.has_tokenizer ? "true" : "false", S->has_chat_template ? "true" : "false",
              o->max_conns, o->max_conns_per_addr);
    if (ri.fallback_reason[0]) jb_cstr(&b, ri.fallback_reason);
    else jb_puts(&b, "null");
    /* continuous batching, or why not; the prefix cache's size (MiB), or why it is off */
    jb_puts(&b, ", \"batching\": ");
    if (S->pool.engine && !S->pool.batch_off[0]) jb_puts(&b, "true");
    else jb_cstr(&b, S->pool.batch_off);
    jb_printf(&b, ", \"prompt_rows\": %d", S->pool.engine ? o->prompt_rows : 0);
    jb_puts(&b, ", \"prefix_cache_mb\": ");
    if (ps.limit) jb_num(&b, (double)ps.limit / (1 << 20));
    else jb_cstr(&b, S->pool.prefix_off);
    jb_printf(&b, ", \"warm_prompts\": %d, \"warm_tokens\": %d", warm, warm_tokens);
    /* working memory besides the weights: the engine's per-step buffers (0 without batching) and
     * each slot's context (its KV rows and state); the kit's footprint.serve_arena_bytes */
    colibri_runtime_info ei = {0};
    if (S->pool.engine) colibri_engine_get_runtime_info(S->pool.engine, &ei);
    jb_printf(&b, ", \"memory\": {\"engine_arena_bytes\": %zu, \"slot_arena_bytes\": %zu}",
              S->pool.engine ? ei.arena_bytes : (size_t)0, ri.arena_bytes);
    jb_puts(&b, ", \"realtime\": {\"cpus\": ");
    if (o->n_cpus) {
        jb_puts(&b, "\"");
        for (int i = 0; i < o->n_cpus; i++) jb_printf(&b, "%s%d", i ? "," : "", o->cpus[i]);
        jb_puts(&b, "\"");
    } else {
        jb_puts(&b, "null");
    }
    jb_printf(&b, ", \"sched\": \"%s\", \"priority\": %d, \"barrier\": \"%s\", \"memory_locked\": %s}}",
              ri.sched, ri.sched_priority, ri.barrier, ri.memory_locked ? "true" : "false");
    log_event("%s", b.failed ? "{\"event\": \"ready\"}" : b.buf);
    jb_free(&b);
}

int server_run(const server_options *o) {
    static server S; /* one per process: the signal handler's pipe is process-wide too */
    memset(&S, 0, sizeof S);
    S.o = *o;
    pthread_mutex_init(&S.mu, NULL);
    pthread_cond_init(&S.conns_cv, NULL);
    atomic_init(&S.cancel_all, 0);
    S.id_state = (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 32);
    model_id_from_path(&S);
    if (routes_init(&S)) return 1;
    if (o->api_key_file && load_key(&S, o->api_key_file)) return 1;
    if (connections_init(&S)) return 1;

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
    if (load_model(&S)) {
        pool_close(&S.pool);
        return 1;
    }
    int warm = 0, warm_tokens = 0;
    if (warm_run(&S, &warm, &warm_tokens)) {
        pool_close(&S.pool);
        return 1;
    }
    S.ready = 1;
    log_ready(&S, port, now_ms() - t0, warm, warm_tokens);

    connections_run(&S, lfds, nl, pipefd[0]);
    for (int i = 0; i < nl; i++) close(lfds[i]); /* new connections are refused from here on */
    pthread_mutex_lock(&S.mu);
    int in_flight = S.workers;
    pthread_mutex_unlock(&S.mu);
    log_event("{\"event\": \"draining\", \"in_flight\": %d, \"deadline_ms\": %d}", in_flight, o->drain_timeout_ms);
    int left = connections_drain(&S);
    log_event("{\"event\": \"stopped\", \"unfinished\": %d}", left);
    if (left == 0) { /* a stuck request thread may still use its slot */
        pool_close(&S.pool);
        connections_free(&S);
        routes_free(&S);
    }
    return 0;
}
