/* Shared CLI helpers (cli.h). */
#include "cli.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

int cli_long(const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = s ? strtol(s, &end, 10) : 0;
    if (!s || errno || end == s || *end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

int cli_ids(const char *s, int32_t **out, size_t *n_out) {
    size_t n = 1;
    for (const char *p = s; *p; p++) n += *p == ',';
    int32_t *ids = malloc(n * sizeof *ids);
    if (!ids) return -1;
    const char *p = s;
    for (size_t i = 0; i < n; i++) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (errno || end == p || (*end != ',' && *end != '\0') || v < INT32_MIN || v > INT32_MAX) {
            free(ids);
            return -1;
        }
        ids[i] = (int32_t)v;
        p = end + 1;
    }
    *out = ids;
    *n_out = n;
    return 0;
}

double cli_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

void cli_json_string(FILE *f, const char *s, size_t n) {
    fputc('"', f);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
        else if (c < 0x20) fprintf(f, "\\u%04x", c);
        else fputc(c, f);
    }
    fputc('"', f);
}

int cli_kv_dtype(const char *s, colibri_kv_dtype *out) {
    if (s && !strcmp(s, "f32")) *out = COLIBRI_KV_F32;
    else if (s && !strcmp(s, "f16")) *out = COLIBRI_KV_F16;
    else return -1;
    return 0;
}

static int open_with(const char *model, colibri_options *opt, colibri_ctx **ctx) {
    char err[512] = "";
    opt->error = err;
    opt->error_len = sizeof err;
    colibri_status s = colibri_init_ex(ctx, model, opt);
    if (s) {
        cli_report(model, s, err);
        return 1;
    }
    return 0;
}

int cli_open(const char *model, colibri_backend backend, int threads, int int8_act,
             colibri_kv_dtype kv, colibri_ctx **ctx) {
    colibri_options opt;
    colibri_default_options(&opt);
    opt.backend = backend;
    opt.threads = threads;
    opt.int8_activations = int8_act;
    opt.kv_dtype = kv;
    return open_with(model, &opt, ctx);
}

void cli_options(const cli_globals *g, colibri_options *opt) {
    colibri_default_options(opt);
    opt->backend = g->backend;
    opt->threads = g->threads;
    opt->int8_activations = g->int8_act;
    opt->q4_file_layout = g->q4_file_layout;
    opt->kv_dtype = g->kv;
    opt->cpus = g->n_cpus ? g->cpus : NULL;
    opt->n_cpus = g->n_cpus;
    opt->sched = g->sched;
    opt->sched_priority = g->sched_priority;
    opt->lock_memory = g->lock_memory;
    opt->barrier = g->barrier;
}

/* RLIMIT_MEMLOCK's soft value as text ("8192 KiB", "unlimited"). */
static void memlock_text(char *out, size_t len, struct rlimit *rl) {
    snprintf(out, len, "unknown");
    if (getrlimit(RLIMIT_MEMLOCK, rl) != 0) return;
    if (rl->rlim_cur == RLIM_INFINITY) snprintf(out, len, "unlimited");
    else snprintf(out, len, "%llu KiB", (unsigned long long)rl->rlim_cur / 1024);
}

/* CAP_IPC_LOCK (bit 14 of CapEff in /proc/self/status): mlock beyond RLIMIT_MEMLOCK. */
static int has_ipc_lock(void) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long eff = 0;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "CapEff: %llx", &eff) == 1) break;
    if (f) fclose(f);
    return (int)(eff >> 14 & 1);
}

#define MEMLOCK_FIX "raise it, e.g. LimitMEMLOCK=infinity in the systemd unit (the kit renders " \
                    "it from the profile's realtime.lock_memory), or give the process CAP_IPC_LOCK"

int cli_lock_process(const cli_globals *g, const char *model) {
    if (!g->lock_memory) return 0;
    struct rlimit rl;
    char limit[48];
    memlock_text(limit, sizeof limit, &rl);
    struct stat st;
    /* Fail before loading with the reason, not with mmap's EAGAIN under MCL_FUTURE. */
    if (model && !stat(model, &st) && rl.rlim_cur != RLIM_INFINITY &&
        (unsigned long long)st.st_size > (unsigned long long)rl.rlim_cur && !has_ipc_lock()) {
        fprintf(stderr, "colibri: --mlock: the model (%.1f MiB) is larger than RLIMIT_MEMLOCK "
                        "%s (ulimit -l): " MEMLOCK_FIX "\n", (double)st.st_size / (1 << 20), limit);
        return 1;
    }
    /* The process owns its memory policy (a library does not): every page it has and will map
     * stays resident, thread stacks and heaps included. Without MCL_FUTURE a request thread's
     * recycled stack (glibc frees it when a thread exits) faults again in its first pass. */
    if (mlockall(MCL_CURRENT | MCL_FUTURE) == 0) return 0;
    fprintf(stderr, "colibri: --mlock: mlockall: %s; RLIMIT_MEMLOCK is %s (ulimit -l): "
                    MEMLOCK_FIX "\n", strerror(errno), limit);
    return 1;
}

int cli_open_globals(const char *model, const cli_globals *g, colibri_ctx **ctx) {
    colibri_options opt;
    cli_options(g, &opt);
    if (cli_lock_process(g, model)) return 1;
    return open_with(model, &opt, ctx);
}

int cli_cpu_list(const char *s, int *out, int cap) {
    int n = 0;
    const char *p = s;
    if (!s || !*s) return -1;
    for (;;) {
        char *end;
        errno = 0;
        long lo = strtol(p, &end, 10), hi = lo;
        if (errno || end == p || *p == '-' || *p == '+' || lo < 0 || lo > 1023) return -1;
        p = end;
        if (*p == '-') {
            const char *q = p + 1;
            if (*q < '0' || *q > '9') return -1;
            hi = strtol(q, &end, 10);
            if (errno || end == q || hi < lo || hi > 1023) return -1;
            p = end;
        }
        for (long c = lo; c <= hi; c++) {
            if (n >= cap) return -1;
            for (int k = 0; k < n; k++)
                if (out[k] == (int)c) return -1;
            out[n++] = (int)c;
        }
        if (*p == '\0') return n;
        if (*p != ',') return -1;
        p++;
    }
}

void cli_report(const char *what, colibri_status s, const char *detail) {
    if (detail && detail[0])
        fprintf(stderr, "colibri: %s: %s: %s\n", what, colibri_strerror(s), detail);
    else
        fprintf(stderr, "colibri: %s: %s\n", what, colibri_strerror(s));
}

void cli_default_globals(cli_globals *g) {
    memset(g, 0, sizeof *g);
    g->backend = COLIBRI_BACKEND_AUTO;
    g->kv = COLIBRI_KV_F32;
}

int cli_global(cli_globals *g, int argc, char **argv, int *i) {
    const char *a = argv[*i], *v = *i + 1 < argc ? argv[*i + 1] : NULL;
    int takes_value = !strcmp(a, "--backend") || !strcmp(a, "--threads") || !strcmp(a, "--kv-cache") ||
                      !strcmp(a, "--cpus") || !strcmp(a, "--sched") || !strcmp(a, "--barrier");
    if (!strcmp(a, "--int8-act")) {
        g->int8_act = 1;
        return 1;
    }
    if (!strcmp(a, "--mlock")) {
        g->lock_memory = 1;
        return 1;
    }
    if (!strcmp(a, "--q4-file-layout")) {
        g->q4_file_layout = 1;
        return 1;
    }
    if (!takes_value) return 0;
    if (!v) {
        fprintf(stderr, "colibri: %s needs a value\n", a);
        return -1;
    }
    ++*i;
    long n;
    if (!strcmp(a, "--backend")) {
        if (!strcmp(v, "cpu")) g->backend = COLIBRI_BACKEND_CPU;
        else if (!strcmp(v, "cuda")) g->backend = COLIBRI_BACKEND_CUDA;
        else if (!strcmp(v, "auto")) g->backend = COLIBRI_BACKEND_AUTO;
        else {
            fprintf(stderr, "colibri: --backend must be cpu, cuda or auto\n");
            return -1;
        }
        g->backend_given = 1;
    } else if (!strcmp(a, "--cpus")) {
        int nc = cli_cpu_list(v, g->cpus, 64);
        if (nc < 1) {
            fprintf(stderr, "colibri: --cpus must list 1..64 distinct CPUs 0..1023 such as 2-5 "
                            "or 4,2,3 (got '%s')\n", v);
            return -1;
        }
        g->n_cpus = nc;
    } else if (!strcmp(a, "--sched")) {
        long prio = 0;
        const char *colon = strchr(v, ':');
        size_t head = colon ? (size_t)(colon - v) : strlen(v);
        if (head == 5 && !strncmp(v, "other", 5) && !colon) g->sched = COLIBRI_SCHED_OTHER;
        else if (((head == 4 && !strncmp(v, "fifo", 4)) || (head == 2 && !strncmp(v, "rr", 2))) &&
                 colon && !cli_long(colon + 1, 1, 99, &prio))
            g->sched = head == 4 ? COLIBRI_SCHED_FIFO : COLIBRI_SCHED_RR;
        else {
            fprintf(stderr, "colibri: --sched must be other, fifo:N or rr:N with N 1..99 (got "
                            "'%s')\n", v);
            return -1;
        }
        g->sched_priority = (int)prio;
    } else if (!strcmp(a, "--barrier")) {
        if (!strcmp(v, "sleep")) g->barrier = COLIBRI_BARRIER_SLEEP;
        else if (!strcmp(v, "spin")) g->barrier = COLIBRI_BARRIER_SPIN;
        else {
            fprintf(stderr, "colibri: --barrier must be sleep or spin\n");
            return -1;
        }
    } else if (!strcmp(a, "--threads")) {
        if (cli_long(v, 1, 64, &n)) {
            fprintf(stderr, "colibri: --threads must be 1..64\n");
            return -1;
        }
        g->threads = (int)n;
    } else if (cli_kv_dtype(v, &g->kv)) {
        fprintf(stderr, "colibri: " CLI_KV_USAGE "\n");
        return -1;
    }
    return 1;
}
