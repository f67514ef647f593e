/* Route stage: router logits -> top_k experts and their weights, one token at a time.
 *
 * Top-k is a fixed bitonic compare-exchange network over the smallest power of two >= E lanes
 * (at most COLIBRI_MAX_EXPERTS; unused lanes hold NaN): the same compare-exchange sequence runs
 * whatever the values, NaN sorts after every number, and ties go to the lower expert index, so
 * the first k are always < n. The compile-time COLIBRI_ROUTING_MODE picks the algorithm:
 *   SOFTMAX_TOPK  softmax over all E logits, then top-k on the probabilities;
 *   LINEAR_SCORE  top-k on the raw logits, then weights from the logits.
 * Softmax is monotonic, so both select the same experts (except where two distinct logits round
 * to the same probability) and give weights equal within float rounding. Whether the k weights
 * are renormalised to sum 1 comes from the model header, never from the build. */
#ifndef COLIBRI_ROUTE_H
#define COLIBRI_ROUTE_H

#include <stdint.h>

#include "colibri_config.h"

_Static_assert((COLIBRI_MAX_EXPERTS & (COLIBRI_MAX_EXPERTS - 1)) == 0,
               "COLIBRI_MAX_EXPERTS must be a power of two (bitonic network lanes)");
_Static_assert(COLIBRI_ROUTING_MODE == COLIBRI_ROUTING_SOFTMAX_TOPK ||
                   COLIBRI_ROUTING_MODE == COLIBRI_ROUTING_LINEAR_SCORE,
               "COLIBRI_ROUTING_MODE must be COLIBRI_ROUTING_SOFTMAX_TOPK or _LINEAR_SCORE");

/* The k best of vals[0..n) (n <= COLIBRI_MAX_EXPERTS, k <= n): indices and values, best first,
 * NaN last, ties to the lower index. */
void colibri_topk_bitonic(const float *vals, int n, int k, int32_t *idx, float *out);

/* Route one token: logits[E] -> idx[k], weight[k]. renorm: weights sum to 1. */
void colibri_route_token(const float *logits, int n_experts, int k, int renorm, int32_t *idx,
                         float *weight);

#endif
