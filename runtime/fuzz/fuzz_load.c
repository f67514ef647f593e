/* libFuzzer harness for the model loader (runtime/src/core/model.c, and the metadata section and the
 * tokenizer tables it builds, runtime/src/text/tokenizer.c): any byte string must either be
 * refused with a status and a message, or yield tensor views that lie wholly inside the buffer
 * and a tokenizer that encodes and decodes a fixed text using only what it validated.
 * The buffer is copied to a 64-byte aligned allocation of exactly `size` bytes, so AddressSanitizer
 * reports any read past the end; every byte of every accepted view is read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/model.h"
#include "text/tokenizer.h"

static volatile uint32_t sink;

static void touch(const colibri_tensor *t) {
    if (!t->data) return;
    size_t n = (size_t)t->rows * t->cols * colibri_dtype_size(t->dtype);
    const uint8_t *p = t->data;
    uint32_t acc = 0;
    for (size_t i = 0; i < n; i++) acc += p[i];
    if (t->scales)
        for (uint32_t r = 0; r < t->rows; r++) {
            uint32_t bits;
            memcpy(&bits, &t->scales[r], sizeof bits);
            acc += bits;
        }
    sink = acc;
}

/* Whatever an accepted tokenizer section holds, using it stays inside its tables. */
static void use_tokenizer(const colibri_tokenizer *t) {
    static const char text[] = "<|x|> ab  a\n\n12 <m> [r]  \xc3\xa9\xe4\xbd\xa0\xff <s>x";
    int32_t ids[256];
    size_t n = 0;
    if (colibri_tokenizer_encode(t, text, sizeof text - 1, 1, ids, 256, &n) != COLIBRI_OK) return;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= t->n_vocab) abort();
    char out[4096];
    size_t len = 0;
    colibri_tokenizer_decode(t, ids, n, 0, out, sizeof out, &len);
    for (uint32_t id = 0; id < t->n_vocab && id < 512; id++)
        colibri_tokenizer_piece(t, (int32_t)id, out, sizeof out, &len);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    size_t cap = (size + 63) / 64 * 64;
    uint8_t *buf = aligned_alloc(64, cap ? cap : 64);
    if (!buf) return 0;
    memcpy(buf, data, size);
    struct colibri_model m;
    char why[512];
    if (colibri_model_from_memory(&m, buf, size, why, sizeof why) == COLIBRI_OK) {
        touch(&m.tok_embed);
        touch(&m.output_norm);
        touch(&m.lm_head);
        for (uint32_t l = 0; l < m.n_layers; l++) {
            const colibri_layer *ly = &m.layers[l];
            const colibri_tensor *all[] = {&ly->attn_norm, &ly->wq, &ly->wk, &ly->wv, &ly->wo,
                                           &ly->bq, &ly->bk, &ly->bv, &ly->q_norm, &ly->k_norm,
                                           &ly->ffn_norm, &ly->router, &ly->shared_w1,
                                           &ly->shared_w3, &ly->shared_w2, &ly->shared_gate};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) touch(all[i]);
            for (uint32_t e = 0; e < m.num_experts; e++) {
                touch(&ly->w1[e]);
                touch(&ly->w3[e]);
                touch(&ly->w2[e]);
            }
        }
        const uint8_t *blob;
        size_t blen;
        if (colibri_model_meta(&m, "tokenizer.vocab", &blob, &blen))
            for (size_t i = 0; i < blen; i++) sink += blob[i];
        if (m.tokenizer) use_tokenizer(m.tokenizer);
        colibri_model_close(&m);
    } else if (!why[0]) {
        abort(); /* a refusal must always say why */
    }
    free(buf);
    return 0;
}
