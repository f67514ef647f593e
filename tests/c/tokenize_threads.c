/* C API check of the text calls (tests/test_tokenizer_api.py): N threads share ONE context and
 * tokenize every text of a case file at the same time; each result must equal the expected ids
 * (from the `tokenizers` library) and decode back to the expected text.
 *
 *   tokenize_threads MODEL CASES THREADS
 * CASES: repeated records  u32 text_len, text, u32 n_ids, n_ids x i32, u32 dec_len, decoded text.
 * Prints "checked N texts x T threads, M mismatches" and exits 1 on any mismatch. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"

typedef struct {
    const char *text;
    uint32_t len, n, dec_len;
    const int32_t *ids;
    const char *dec;
} tcase;

static tcase *cases;
static size_t n_cases;
static colibri_ctx *ctx;

static void *worker(void *arg) {
    long bad = 0;
    for (size_t k = 0; k < n_cases; k++) {
        size_t i = (k + (size_t)(long)arg * 7) % n_cases; /* threads start at different texts */
        const tcase *c = &cases[i];
        int32_t ids[65536];
        size_t n = 0;
        if (colibri_tokenize(ctx, c->text, c->len, 1, ids, 65536, &n) || n != c->n ||
            memcmp(ids, c->ids, n * sizeof *ids)) {
            bad++;
            continue;
        }
        char out[262144];
        size_t len = 0;
        if (colibri_detokenize(ctx, ids, n, 0, out, sizeof out, &len) || len != c->dec_len ||
            memcmp(out, c->dec, len))
            bad++;
    }
    return (void *)bad;
}

static uint32_t rd32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return v; }

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: tokenize_threads MODEL CASES THREADS\n"); return 2; }
    FILE *f = fopen(argv[2], "rb");
    if (!f) return 2;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    if (fread(buf, 1, (size_t)size, f) != (size_t)size) return 2;
    fclose(f);
    cases = calloc(4096, sizeof *cases);
    for (size_t at = 0; at < (size_t)size && n_cases < 4096; n_cases++) {
        tcase *c = &cases[n_cases];
        c->len = rd32(buf + at); c->text = (const char *)buf + at + 4; at += 4 + c->len;
        c->n = rd32(buf + at); c->ids = (const int32_t *)(buf + at + 4); at += 4 + 4 * (size_t)c->n;
        c->dec_len = rd32(buf + at); c->dec = (const char *)buf + at + 4; at += 4 + c->dec_len;
    }
    colibri_options o;
    colibri_default_options(&o);
    o.backend = COLIBRI_BACKEND_CPU;
    o.threads = 1;
    char err[512] = "";
    o.error = err;
    o.error_len = sizeof err;
    if (colibri_init_ex(&ctx, argv[1], &o)) { fprintf(stderr, "init: %s\n", err); return 2; }
    int nt = atoi(argv[3]);
    pthread_t th[16];
    long bad = 0;
    for (long i = 0; i < nt && i < 16; i++) pthread_create(&th[i], NULL, worker, (void *)i);
    for (long i = 0; i < nt && i < 16; i++) {
        void *r;
        pthread_join(th[i], &r);
        bad += (long)r;
    }
    colibri_tokenizer_info ti;
    colibri_get_tokenizer_info(ctx, &ti);
    char piece[64];
    size_t pl = 0;
    int pst = colibri_token_piece(ctx, 0, piece, sizeof piece, &pl);
    printf("checked %zu texts x %d threads, %ld mismatches; kind %s vocab %u stop %d piece0 %d/%zu\n",
           n_cases, nt, bad, ti.kind, ti.vocab, ti.n_stop, pst, pl);
    colibri_free(ctx);
    free(cases);
    free(buf);
    return bad ? 1 : 0;
}
