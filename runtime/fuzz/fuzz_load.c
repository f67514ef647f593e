/* libFuzzer harness for the model loader (runtime/src/model.c): any byte string must either be
 * refused with a status and a message, or yield tensor views that lie wholly inside the buffer.
 * The buffer is copied to a 64-byte aligned allocation of exactly `size` bytes, so AddressSanitizer
 * reports any read past the end; every byte of every accepted view is read. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

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
        colibri_model_close(&m);
    } else if (!why[0]) {
        abort(); /* a refusal must always say why */
    }
    free(buf);
    return 0;
}
