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
        fprintf(stderr, "colibri: %s: %s: %s\n", model, colibri_strerror(s), err);
        return 1;
    }
    return 0;
}
