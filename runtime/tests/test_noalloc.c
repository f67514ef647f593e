/* Proof that colibri_forward allocates nothing: every malloc-family call in the process goes
 * through the __wrap_ functions below (linked with -Wl,--wrap=malloc,...), which count calls
 * while `armed`. Init may allocate (model tables, the arena, the pool); forward must not. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colibri.h"
#include "colibri_config.h"
#include "core/selftest_model.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t a, size_t b);
void *__real_realloc(void *p, size_t n);
int __real_posix_memalign(void **p, size_t a, size_t n);
void *__real_aligned_alloc(size_t a, size_t n);
void __real_free(void *p);

static volatile int armed;
static volatile long calls;

void *__wrap_malloc(size_t n) { if (armed) calls++; return __real_malloc(n); }
void *__wrap_calloc(size_t a, size_t b) { if (armed) calls++; return __real_calloc(a, b); }
void *__wrap_realloc(void *p, size_t n) { if (armed) calls++; return __real_realloc(p, n); }
int __wrap_posix_memalign(void **p, size_t a, size_t n) {
    if (armed) calls++;
    return __real_posix_memalign(p, a, n);
}
void *__wrap_aligned_alloc(size_t a, size_t n) { if (armed) calls++; return __real_aligned_alloc(a, n); }
void __wrap_free(void *p) { if (armed) calls++; __real_free(p); }

int main(int argc, char **argv) {
    const char *model = argc > 1 ? argv[1] : NULL;
    char path[256];
    if (!model) {
        snprintf(path, sizeof path, "/tmp/colibri-noalloc-%ld.colibri", (long)getpid());
        if (colibri_selftest_write_model(path, 0, COLIBRI_EMBED_DIM_PAD)) return 2;
        model = path;
    }
    int fails = 0;
    for (int run = 0; run < 4; run++) { /* 1 and 2 threads, f32 and f16 KV cache */
        int threads = 1 + run % 2;
        colibri_kv_dtype kv = run < 2 ? COLIBRI_KV_F32 : COLIBRI_KV_F16;
        colibri_options o;
        char err[512] = "";
        colibri_default_options(&o);
        o.threads = threads;
        o.kv_dtype = kv;
        o.backend = COLIBRI_BACKEND_CPU;
        o.error = err;
        o.error_len = sizeof err;
        colibri_ctx *ctx;
        if (colibri_init_ex(&ctx, model, &o)) {
            fprintf(stderr, "init: %s\n", err);
            return 2;
        }
        colibri_model_info mi;
        colibri_get_model_info(ctx, &mi);
        int n = mi.max_seq_len < 20 ? (int)mi.max_seq_len / 2 : 10;
        int32_t ids[64];
        float *logits = malloc((size_t)n * mi.vocab_size * sizeof(float));
        for (int i = 0; i < n; i++) ids[i] = (int32_t)((i * 5 + 1) % mi.vocab_size);
        calls = 0;
        armed = 1;
        colibri_status s = colibri_forward(ctx, ids, n, logits);           /* prefill */
        for (int i = 0; i < 4 && !s; i++) s = colibri_forward(ctx, ids + i, 1, logits); /* decode */
        colibri_status bad = colibri_forward(ctx, (int32_t[]){-1}, 1, logits); /* error path */
        armed = 0;
        long seen = calls;
        printf("threads=%d kv=%s forward status=%d error-path status=%d allocations during forward=%ld\n",
               threads, kv == COLIBRI_KV_F16 ? "f16" : "f32", (int)s, (int)bad, seen);
        if (s != COLIBRI_OK || bad != COLIBRI_E_TOKEN_RANGE || seen != 0) fails++;
        free(logits);
        colibri_free(ctx);
    }
    if (!argc || argc <= 1) unlink(path);
    puts(fails ? "FAIL" : "ok: colibri_forward made no allocation");
    return fails ? 1 : 0;
}
