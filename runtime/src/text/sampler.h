/* Token sampling (colibri.h, "Sampling"): the internals shared by generate.c and the tests. */
#ifndef COLIBRI_SAMPLER_H
#define COLIBRI_SAMPLER_H

#include <stdint.h>

#include "colibri.h"

/* splitmix64 of (seed, counter): the n-th uniform draw of a request is a pure function of the
 * seed and n, so the same seed gives the same ids on any thread count and any machine. */
uint64_t colibri_rng_u64(uint64_t seed, uint64_t counter);
/* The top 53 bits of colibri_rng_u64 as a double in [0, 1). */
double colibri_rng_uniform(uint64_t seed, uint64_t counter);

#endif
