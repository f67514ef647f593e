/* A small synthetic `.colibri` model written by C (selftest, unit tests, fuzz seeds): every
 * optional feature on (shared expert with gate, QKV bias, per-head q/k norm), hidden size 40
 * padded to `pad`, deterministic weights of the given dtype. */
#ifndef COLIBRI_SELFTEST_MODEL_H
#define COLIBRI_SELFTEST_MODEL_H

#include <stdint.h>

#define COLIBRI_SELFTEST_VOCAB 61

int colibri_selftest_write_model(const char *path, uint32_t dtype, uint32_t pad);

#endif
