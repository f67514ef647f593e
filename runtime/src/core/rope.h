/* Rotary position embedding: the per-pair frequencies and the cos/sin factor, computed once at
 * load from the header (plain RoPE, or YaRN when the header's ROPE_YARN flag is set), and the
 * per-token tables the attention kinds rotate q and k with. It lives in core/ because the loader
 * owns it; it knows the header's numbers only, not the model, so nothing here calls back up. */
#ifndef COLIBRI_CORE_ROPE_H
#define COLIBRI_CORE_ROPE_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

/* The YaRN parameters (header bytes 152..175, docs/format.md). */
struct colibri_yarn {
    float factor, beta_fast, beta_slow, attention_factor;
    uint32_t original, truncate;
};

/* What a forward needs: the frequency of pair i (head_dim / 2 values, in double) and the factor
 * cos and sin are multiplied by (1 for plain RoPE; YaRN's attention factor). */
struct colibri_rope {
    double *freq;
    float scale;
    uint32_t head_dim;
};

/* A reason naming the field when one is out of range (factor, betas and attention factor finite
 * and > 0, original context >= 1, truncate 0/1). */
colibri_status colibri_rope_check_yarn(const struct colibri_yarn *y, char *why, size_t len);

/* r->freq (allocated here, freed by colibri_rope_free) and r->scale; yarn NULL: plain RoPE. */
colibri_status colibri_rope_setup(struct colibri_rope *r, uint32_t head_dim, float theta,
                                  const struct colibri_yarn *yarn, char *why, size_t len);
void colibri_rope_free(struct colibri_rope *r);

/* cs[i] = cos, cs[Dh/2 + i] = sin of position p's angle for pair i, times r->scale. */
void colibri_rope_row(const struct colibri_rope *r, int32_t p, float *cs);

#endif
