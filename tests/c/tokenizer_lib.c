/* The runtime's tokenizer alone (runtime/src/text/tokenizer.c + unicode_tables.c) as a shared
 * library for the tests (tests/tokenizer_lib.py loads it with ctypes): the blobs come straight
 * from the kit's TokenizerSpec, no model file, so hundreds of thousands of texts can be compared
 * with the `tokenizers` library in a second. Built with -DCOLIBRI_TOK_COUNT_WORK, it also reports
 * the tokenizer's work counter (the linear-time checks count steps, they do not time). */
#include <stdlib.h>
#include <string.h>

#include "text/tokenizer.h"

#ifdef COLIBRI_TOK_COUNT_WORK
extern unsigned long long colibri_tok_work;
#endif

void *tok_new(const uint8_t *cfg, size_t cl, const uint8_t *voc, size_t vl, const uint8_t *mer,
              size_t ml, const uint8_t *add, size_t al, uint32_t vocab_limit, char *why, size_t wl) {
    colibri_tokenizer_blobs b = {cfg, voc, mer, add, cl, vl, ml, al, 2};
    colibri_tokenizer *t = malloc(sizeof *t);
    if (!t) return NULL;
    if (colibri_tokenizer_load(t, &b, vocab_limit, why, wl) != COLIBRI_OK) {
        free(t);
        return NULL;
    }
    return t;
}

void tok_free(void *t) {
    colibri_tokenizer_free(t);
    free(t);
}

int tok_encode(const void *t, const char *text, size_t len, int special, int32_t *ids, size_t cap,
               size_t *n) {
    return colibri_tokenizer_encode(t, text, len, special, ids, cap, n);
}

int tok_decode(const void *t, const int32_t *ids, size_t n, int skip, char *out, size_t cap,
               size_t *len) {
    return colibri_tokenizer_decode(t, ids, n, skip, out, cap, len);
}

/* the class (bits 0-2) and NFC flag of a code point in the generated tables, as uc_rec reads them */
int tok_class(uint32_t cp) {
    if (cp >= 0x110000) return -1;
    return colibri_uc_records[colibri_uc_stage2[(size_t)colibri_uc_stage1[cp >> 8] * 256 + (cp & 255)]][0];
}

unsigned long long tok_work(int reset) {
#ifdef COLIBRI_TOK_COUNT_WORK
    unsigned long long w = colibri_tok_work;
    if (reset) colibri_tok_work = 0;
    return w;
#else
    (void)reset;
    return 0;
#endif
}
