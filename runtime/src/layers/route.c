/* Route stage (see route.h). */
#include "route.h"

#include <math.h>

/* a before b in the sorted order: larger value first, NaN after every number, then lower index.
 * A strict total order even with NaN (a plain `>` is not one, and the network could then leave a
 * padding lane, index >= n, among the first k). */
static int before(float va, int32_t ia, float vb, int32_t ib) {
    int na = isnan(va), nb = isnan(vb);
    if (na != nb) return nb;
    if (!na && va != vb) return va > vb;
    return ia < ib;
}

/* Lanes of the network for n values: the smallest power of two >= n. The result does not depend
 * on it (before() is a strict total order, so the sorted order is unique and padding sorts
 * last), only the cost does: a 256-lane network for an 8-expert model would run 36 stages of 256
 * lanes per token and layer instead of 6 of 8. */
static int network_lanes(int n) {
    int lanes = 1;
    while (lanes < n) lanes <<= 1;
    return lanes;
}

void colibri_topk_bitonic(const float *vals, int n, int k, int32_t *idx, float *out) {
    float v[COLIBRI_MAX_EXPERTS];
    int32_t ix[COLIBRI_MAX_EXPERTS];
    const int N = network_lanes(n); /* <= COLIBRI_MAX_EXPERTS: a power of two >= n */
    for (int i = 0; i < N; i++) {
        v[i] = i < n ? vals[i] : NAN; /* padding sorts last: NaN, and a higher index than any */
        ix[i] = i;
    }
    /* Bitonic sort: blocks of `size` alternate direction until the last merge sorts all lanes
     * into "before" order. The schedule depends on N (so on n) only, never on the values. */
    for (int size = 2; size <= N; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = 0; i < N; i++) {
                int j = i ^ stride;
                if (j <= i) continue;
                int want_first = (i & size) == 0; /* this block ends in "before" order */
                int swap = want_first ? before(v[j], ix[j], v[i], ix[i])
                                      : before(v[i], ix[i], v[j], ix[j]);
                if (swap) {
                    float tv = v[i]; v[i] = v[j]; v[j] = tv;
                    int32_t ti = ix[i]; ix[i] = ix[j]; ix[j] = ti;
                }
            }
        }
    }
    for (int i = 0; i < k; i++) {
        idx[i] = ix[i];
        out[i] = v[i];
    }
}

void colibri_route_token(const float *logits, int n_experts, int k, int renorm, int32_t *idx,
                         float *weight) {
    float mx = logits[0];
    for (int e = 1; e < n_experts; e++) mx = fmaxf(mx, logits[e]);
    double total = 0.0;
    for (int e = 0; e < n_experts; e++) total += exp((double)logits[e] - mx);
#if COLIBRI_ROUTING_MODE == COLIBRI_ROUTING_SOFTMAX_TOPK
    float prob[COLIBRI_MAX_EXPERTS];
    for (int e = 0; e < n_experts; e++) prob[e] = (float)(exp((double)logits[e] - mx) / total);
    colibri_topk_bitonic(prob, n_experts, k, idx, weight);
    if (renorm) {
        double s = 0.0;
        for (int i = 0; i < k; i++) s += weight[i];
        for (int i = 0; i < k; i++) weight[i] = (float)(weight[i] / s);
    }
#else
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
