/* Route stage (see route.h). */
#include "route.h"

#include <math.h>
#include <string.h>

/* The sorted order ("before"): larger value first, NaN after every number, then the lower index.
 * Each lane is one 64-bit key whose unsigned order is exactly that: the upper half maps the float
 * to an integer that grows as the value falls (-0 taken as +0, as `==` does; every NaN the largest),
 * the lower half is the index. A strict total order even with NaN (a plain `>` on floats is not
 * one, and the network could then leave a padding lane, index >= n, among the first k), and the
 * network's compare-exchange is then a branch-free min/max on integers. */
static uint64_t sort_key(float v, int32_t i) {
    uint32_t u;
    if (v == 0.0f) v = 0.0f;
    memcpy(&u, &v, sizeof u);
    uint32_t asc = (u & 0x80000000u) ? ~u : u | 0x80000000u; /* grows with the value */
    uint32_t desc = isnan(v) ? 0xFFFFFFFFu : ~asc;
    return (uint64_t)desc << 32 | (uint32_t)i;
}

/* Lanes of the network for n values: the smallest power of two >= n. The result does not depend
 * on it (the order is strict and total, so the sorted order is unique and padding sorts last),
 * only the cost does: a 512-lane network for an 8-expert model would run 45 stages of 512 lanes
 * per token and layer instead of 6 of 8. */
static int network_lanes(int n) {
    int lanes = 1;
    while (lanes < n) lanes <<= 1;
    return lanes;
}

void colibri_topk_bitonic(const float *vals, int n, int k, int32_t *idx, float *out) {
    uint64_t key[COLIBRI_MAX_EXPERTS];
    const int N = network_lanes(n); /* <= COLIBRI_MAX_EXPERTS: a power of two >= n */
    for (int i = 0; i < N; i++) key[i] = sort_key(i < n ? vals[i] : NAN, i); /* padding: NaN */
    /* Bitonic sort: blocks of `size` alternate direction until the last merge sorts all lanes
     * into ascending key order. The schedule depends on N (so on n) only, never on the values. */
    for (int size = 2; size <= N; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = 0; i < N; i++) {
                if (i & stride) continue; /* i is the lower lane of the pair (i, i + stride) */
                int j = i + stride;
                uint64_t a = key[i], b = key[j];
                uint64_t lo = a < b ? a : b, hi = a < b ? b : a;
                int ascending = (i & size) == 0; /* this block ends in "before" order */
                key[i] = ascending ? lo : hi;
                key[j] = ascending ? hi : lo;
            }
        }
    }
    for (int i = 0; i < k; i++) {
        idx[i] = (int32_t)(uint32_t)key[i];
        out[i] = vals[idx[i]];
    }
}

void colibri_route_token(const float *logits, int n_experts, int k, int renorm, int32_t *idx,
                         float *weight) {
    float mx = logits[0];
    for (int e = 1; e < n_experts; e++) mx = fmaxf(mx, logits[e]);
    double total = 0.0;
#if COLIBRI_ROUTING_MODE == COLIBRI_ROUTING_SOFTMAX_TOPK
    /* each exp once (the same double values as computing it again: identical probabilities) */
    double ex[COLIBRI_MAX_EXPERTS];
    for (int e = 0; e < n_experts; e++) total += ex[e] = exp((double)logits[e] - mx);
    float prob[COLIBRI_MAX_EXPERTS];
    for (int e = 0; e < n_experts; e++) prob[e] = (float)(ex[e] / total);
    colibri_topk_bitonic(prob, n_experts, k, idx, weight);
    if (renorm) {
        double s = 0.0;
        for (int i = 0; i < k; i++) s += weight[i];
        for (int i = 0; i < k; i++) weight[i] = (float)(weight[i] / s);
    }
#else
    for (int e = 0; e < n_experts; e++) total += exp((double)logits[e] - mx);
    float sel[COLIBRI_TOP_K > 16 ? COLIBRI_TOP_K : 16];
    colibri_topk_bitonic(logits, n_experts, k, idx, sel);
    if (renorm) {
        /* softmax over the k selected logits == renormalised top-k probabilities */
        double s = 0.0;
        for (int i = 0; i < k; i++) s += exp((double)sel[i] - sel[0]);
        for (int i = 0; i < k; i++) weight[i] = (float)(exp((double)sel[i] - sel[0]) / s);
    } else {
        for (int i = 0; i < k; i++) weight[i] = (float)(exp((double)sel[i] - mx) / total);
    }
#endif
}
