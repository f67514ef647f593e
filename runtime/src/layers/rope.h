/* Rotary position embedding: the per-pair frequencies and the cos/sin factor, computed once at
 * load from the header (plain RoPE, or YaRN when the header's ROPE_YARN flag is set), and the
 * per-token tables the attention kinds rotate q and k with. */
#ifndef COLIBRI_LAYERS_ROPE_H
#define COLIBRI_LAYERS_ROPE_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

struct colibri_model;

/* The YaRN parameters of a header (docs/format.md): a reason naming the field when one is out of
 * range (factor, betas and attention factor finite and > 0, original context >= 1, truncate 0/1). */
colibri_status colibri_rope_check_yarn(float factor, float beta_fast, float beta_slow,
                                       float attention_factor, uint32_t original,
                                       uint32_t truncate, char *why, size_t len);

/* m->rope_freq (head_dim / 2 doubles, allocated here, freed by colibri_model_close) and
 * m->rope_scale from the header. */
colibri_status colibri_rope_setup(struct colibri_model *m, char *why, size_t len);

/* cs[i] = cos, cs[Dh/2 + i] = sin of position p's angle for pair i, times m->rope_scale. */
void colibri_rope_row(const struct colibri_model *m, int32_t p, float *cs);

#endif
