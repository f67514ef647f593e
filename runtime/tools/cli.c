/* Shared CLI helpers (cli.h). */
#include "cli.h"

#include <errno.h>
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

int cli_open(const char *model, colibri_backend backend, int threads, int int8_act,
             colibri_kv_dtype kv, colibri_ctx **ctx) {
    colibri_options opt;
    char err[512] = "";
    colibri_default_options(&opt);
    opt.backend = backend;
    opt.threads = threads;
    opt.int8_activations = int8_act;
    opt.kv_dtype = kv;
    opt.error = err;
    opt.error_len = sizeof err;
    colibri_status s = colibri_init_ex(ctx, model, &opt);
    if (s) {
        cli_report(model, s, err);
        return 1;
    }
    return 0;
}

int cli_open_globals(const char *model, const cli_globals *g, colibri_ctx **ctx) {
    return cli_open(model, g->backend, g->threads, g->int8_act, g->kv, ctx);
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
    int takes_value = !strcmp(a, "--backend") || !strcmp(a, "--threads") || !strcmp(a, "--kv-cache");
    if (!strcmp(a, "--int8-act")) {
        g->int8_act = 1;
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
