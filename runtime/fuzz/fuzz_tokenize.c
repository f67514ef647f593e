/* libFuzzer harness for the tokenizer itself (runtime/src/text/tokenizer.c): arbitrary bytes (invalid
 * UTF-8 included) are encoded with each family's tokenizer, the ids decoded and every piece read.
 * Checks: no crash or sanitizer report, every id inside the vocabulary, decoded text valid UTF-8,
 * and for byte-level BPE without normalization changes the bytes survive (pieces join to the
 * input). Models: the .colibri files in $COLIBRI_FUZZ_MODELS (make_tok_models.py writes them);
 * the first input byte picks one, the second chooses whether BOS/EOS are added. */
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "text/tokenizer.h"

#define MAX_MODELS 12
static struct colibri_model models[MAX_MODELS];
static int n_models;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    const char *dir = getenv("COLIBRI_FUZZ_MODELS");
    DIR *d = dir ? opendir(dir) : NULL;
    if (!d) {
        fprintf(stderr, "fuzz_tokenize: set COLIBRI_FUZZ_MODELS to a directory of .colibri files\n");
        exit(2);
    }
    struct dirent *e;
    char path[4096], why[512];
    while ((e = readdir(d)) && n_models < MAX_MODELS) {
        size_t l = strlen(e->d_name);
        if (l < 9 || strcmp(e->d_name + l - 8, ".colibri")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (colibri_model_open(&models[n_models], path, why, sizeof why) || !models[n_models].tokenizer) {
            fprintf(stderr, "fuzz_tokenize: %s: %s\n", path, why[0] ? why : "no tokenizer");
            exit(2);
        }
        n_models++;
    }
    closedir(d);
    if (!n_models) { fprintf(stderr, "fuzz_tokenize: no models in %s\n", dir); exit(2); }
    (void)argc;
    (void)argv;
    return 0;
}

static int valid_utf8(const uint8_t *s, size_t n) {
    for (size_t i = 0; i < n;) {
        uint8_t b = s[i];
        size_t len = b < 0x80 ? 1 : b >= 0xC2 && b <= 0xDF ? 2 : b >= 0xE0 && b <= 0xEF ? 3
                   : b >= 0xF0 && b <= 0xF4 ? 4 : 0;
        if (!len || i + len > n) return 0;
        for (size_t k = 1; k < len; k++)
            if ((s[i + k] & 0xC0) != 0x80) return 0;
        i += len;
    }
    return 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 2) return 0;
    const colibri_tokenizer *t = models[data[0] % n_models].tokenizer;
    int special = data[1] & 1;
    const char *text = (const char *)data + 2;
    size_t len = size - 2, n = 0;
    if (colibri_tokenizer_encode(t, text, len, special, NULL, 0, &n) != COLIBRI_E_BUFFER_TOO_SMALL && n)
        abort();
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    size_t n2 = 0;
    if (colibri_tokenizer_encode(t, text, len, special, ids, n, &n2) != COLIBRI_OK || n2 != n) abort();
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab) abort();
    size_t tl = 0;
    colibri_tokenizer_decode(t, ids, n, 0, NULL, 0, &tl);
    char *out = malloc(tl ? tl : 1);
    size_t tl2 = 0;
    if (colibri_tokenizer_decode(t, ids, n, 0, out, tl, &tl2) != COLIBRI_OK || tl2 != tl) abort();
    if (!valid_utf8((const uint8_t *)out, tl)) abort();
    /* byte-level, no NFC, no added tokens: the pieces join to exactly the input */
    if (t->model == COLIBRI_TOK_MODEL_BYTE_BPE && t->normalizer == COLIBRI_TOK_NORM_NONE &&
        t->n_added == 0 && !special) {
        size_t at = 0;
        char piece[COLIBRI_TOK_MAX_PIECE];
        for (size_t i = 0; i < n; i++) {
            size_t pl = 0;
            if (colibri_tokenizer_piece(t, ids[i], piece, sizeof piece, &pl) || at + pl > len ||
                memcmp(text + at, piece, pl))
                abort();
            at += pl;
        }
        if (at != len) abort();
    }
    /* arbitrary ids decode too */
    size_t m = len / 4;
    int32_t *raw = malloc((m ? m : 1) * sizeof *raw);
    for (size_t i = 0; i < m; i++) {
        uint32_t v;
        memcpy(&v, text + 4 * i, 4);
        raw[i] = (int32_t)(v % t->n_vocab);
    }
    colibri_tokenizer_decode(t, raw, m, data[1] & 2, out, tl, &tl2);
    free(raw);
    free(out);
    free(ids);
    return 0;
}
