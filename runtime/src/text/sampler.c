/* Sampling one token from a row of logits. The pipeline (the same order as transformers'
 * logits processors, documented in colibri.h and mirrored by the Python model in
 * tests/test_sampler.py, which must give the same ids for the same seed):
 *   1. repetition penalty on every distinct id of the history window (CTRL rule: a positive
 *      logit is divided by r, a negative one multiplied by r);
 *   2. temperature <= 0: argmax (ties: the lowest id) and stop here;
 *   3. candidates sorted by logit descending, ties by id ascending (a total order, so the
 *      result does not depend on the sort algorithm), kept to the first top_k;
 *   4. weights w_i = exp((l_i - l_0) / T) in double, summed in candidate order;
 *   5. top-p: the shortest prefix whose weight reaches top_p of the total (at least one);
 *   6. min-p: drop candidates with w_i < min_p * w_0 (w_0 = 1 is the most likely);
 *   7. one uniform draw u in [0, 1) (colibri_rng_uniform(seed, draw counter)) scaled by the
 *      kept weight; the first candidate whose running sum exceeds it wins.
 * All working memory is allocated by colibri_sampler_new; sampling allocates nothing. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct colibri_sampler {
    colibri_sampling p;
    uint32_t vocab;
    uint64_t draws;     /* counter of uniform draws made with p.seed */
    int32_t *idx;       /* [vocab] candidate ids */
    double *w;          /* [vocab] candidate weights */
    uint8_t *seen;      /* [vocab] repetition-penalty marks, all 0 between calls */
};

uint64_t colibri_rng_u64(uint64_t seed, uint64_t counter) {
    uint64_t z = seed + (counter + 1) * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

double colibri_rng_uniform(uint64_t seed, uint64_t counter) {
    return (double)(colibri_rng_u64(seed, counter) >> 11) * (1.0 / 9007199254740992.0);
}

void colibri_default_sampling(colibri_sampling *p) {
    memset(p, 0, sizeof *p);
    p->temperature = 0.0f;
    p->top_k = 0;
    p->top_p = 1.0f;
    p->min_p = 0.0f;
    p->repeat_penalty = 1.0f;
    p->repeat_last_n = 0;
    p->seed = 0;
}

static int valid(const colibri_sampling *p) {
    return isfinite(p->temperature) && p->temperature >= 0 && p->top_k >= 0 &&
           isfinite(p->top_p) && p->top_p > 0 && p->top_p <= 1 && isfinite(p->min_p) &&
           p->min_p >= 0 && p->min_p <= 1 && isfinite(p->repeat_penalty) &&
           p->repeat_penalty > 0 && p->repeat_last_n >= 0;
}

const char *colibri_sampling_check(const colibri_sampling *p) {
    if (!p) return "sampling parameters are NULL";
    if (!(isfinite(p->temperature) && p->temperature >= 0)) return "temperature must be >= 0";
    if (p->top_k < 0) return "top_k must be >= 0 (0 = off)";
    if (!(isfinite(p->top_p) && p->top_p > 0 && p->top_p <= 1)) return "top_p must be in (0, 1]";
    if (!(isfinite(p->min_p) && p->min_p >= 0 && p->min_p <= 1)) return "min_p must be in [0, 1]";
    if (!(isfinite(p->repeat_penalty) && p->repeat_penalty > 0))
        return "repeat_penalty must be > 0 (1 = off)";
    if (p->repeat_last_n < 0) return "repeat_last_n must be >= 0 (0 = the whole context)";
    return NULL;
}

colibri_status colibri_sampler_new(colibri_sampler **out, uint32_t vocab, const colibri_sampling *p) {
    if (!out) return COLIBRI_E_INVALID_ARG;
    *out = NULL;
    if (vocab == 0 || !p || !valid(p)) return COLIBRI_E_INVALID_ARG;
    colibri_sampler *s = calloc(1, sizeof *s);
    if (!s) return COLIBRI_E_NO_MEMORY;
    s->p = *p;
    s->vocab = vocab;
    s->idx = malloc((size_t)vocab * sizeof *s->idx);
    s->w = malloc((size_t)vocab * sizeof *s->w);
    s->seen = calloc(vocab, 1);
    if (!s->idx || !s->w || !s->seen) {
        colibri_sampler_free(s);
        return COLIBRI_E_NO_MEMORY;
    }
    *out = s;
    return COLIBRI_OK;
}

void colibri_sampler_free(colibri_sampler *s) {
    if (!s) return;
    free(s->idx);
    free(s->w);
    free(s->seen);
    free(s);
}

void colibri_sampler_reset(colibri_sampler *s, uint64_t seed) {
    s->p.seed = seed;
    s->draws = 0;
}

static void penalise(colibri_sampler *s, float *logits, const int32_t *hist, int n) {
    float r = s->p.repeat_penalty;
    if (r == 1.0f || !hist || n <= 0) return;
    int from = s->p.repeat_last_n > 0 && n > s->p.repeat_last_n ? n - s->p.repeat_last_n : 0;
    for (int i = from; i < n; i++) {
        int32_t t = hist[i];
        if (t < 0 || (uint32_t)t >= s->vocab || s->seen[t]) continue;
        s->seen[t] = 1;
        logits[t] = logits[t] > 0 ? logits[t] / r : logits[t] * r;
    }
    for (int i = from; i < n; i++)
        if (hist[i] >= 0 && (uint32_t)hist[i] < s->vocab) s->seen[hist[i]] = 0;
}

/* Heap sift for the top-k selection: a min-heap in the candidate order (root = worst kept). */
static int worse(const float *l, int32_t a, int32_t b) { /* a after b in the order */
    return l[a] != l[b] ? l[a] < l[b] : a > b;
}
static void sift_down(int32_t *h, int n, int i, const float *l) {
    for (;;) {
        int c = 2 * i + 1, m = i;
        if (c < n && worse(l, h[c], h[m])) m = c;
        if (c + 1 < n && worse(l, h[c + 1], h[m])) m = c + 1;
        if (m == i) return;
        int32_t t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

/* Fill s->idx with the first k candidates in order (descending logit, then ascending id: a
 * total order, so the result does not depend on the sort algorithm); returns k. C11 qsort has
 * no context pointer, so the comparator reads the logits through a thread-local pointer. */
static _Thread_local const float *t_logits;
static int cmp_cand_tl(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    float lx = t_logits[x], ly = t_logits[y];
    if (lx != ly) return lx > ly ? -1 : 1;
    return x < y ? -1 : x > y;
}

static int sort_candidates(colibri_sampler *s, const float *l, int k) {
    int V = (int)s->vocab;
    if (k <= 0 || k > V) k = V;
    if (k < V) {
        /* keep the best k in a min-heap, then sort those k */
        for (int i = 0; i < k; i++) s->idx[i] = i;
        for (int i = k / 2 - 1; i >= 0; i--) sift_down(s->idx, k, i, l);
        for (int i = k; i < V; i++)
            if (worse(l, s->idx[0], i)) {
                s->idx[0] = i;
                sift_down(s->idx, k, 0, l);
            }
    } else {
        for (int i = 0; i < V; i++) s->idx[i] = i;
    }
    t_logits = l;
    qsort(s->idx, (size_t)k, sizeof *s->idx, cmp_cand_tl);
    t_logits = NULL;
    return k;
}

/* Greedy: the first index of the largest logit, i.e. what `if (l[i] > l[best]) best = i` over
 * i = 1..V-1 returns (a NaN never wins; a NaN at 0 is never beaten, so 0; +0 and -0 tie), in
 * eight interleaved lanes: that loop compiles to a compare and a conditional move that the next
 * element's load of l[best] waits for (~10 cycles an element: 0.5 ms for Qwen's 151,936 ids,
 * 7% of an 8-client serve step). Every lane starts from l[0] and keeps the first index of its
 * running maximum; the lanes are merged by value, ties to the lower index. */
static uint32_t argmax_first(const float *l, uint32_t V) {
    enum { LANES = 8 };
    float bv[LANES];
    uint32_t bi[LANES];
    for (int k = 0; k < LANES; k++) {
        bv[k] = l[0];
        bi[k] = 0;
    }
    uint32_t i = 1;
    for (; i + LANES <= V; i += LANES)
        for (int k = 0; k < LANES; k++)
            if (l[i + (uint32_t)k] > bv[k]) {
                bv[k] = l[i + (uint32_t)k];
                bi[k] = i + (uint32_t)k;
            }
    for (; i < V; i++)
        if (l[i] > bv[0]) {
            bv[0] = l[i];
            bi[0] = i;
        }
    uint32_t best = bi[0];
    float top = bv[0];
    for (int k = 1; k < LANES; k++)
        if (bv[k] > top || (bv[k] == top && bi[k] < best)) {
            top = bv[k];
            best = bi[k];
        }
    return best;
}

int32_t colibri_sampler_sample(colibri_sampler *s, float *logits, const int32_t *history,
                               int n_history) {
    penalise(s, logits, history, n_history);
    uint32_t V = s->vocab;
    if (s->p.temperature <= 0.0f) return (int32_t)argmax_first(logits, V);
    int n = sort_candidates(s, logits, s->p.top_k);
    double T = s->p.temperature, top = logits[s->idx[0]], total = 0;
    for (int i = 0; i < n; i++) {
        s->w[i] = exp(((double)logits[s->idx[i]] - top) / T);
        total += s->w[i];
    }
    if (s->p.top_p < 1.0f) {
        double need = (double)s->p.top_p * total, run = 0;
        int keep = n;
        for (int i = 0; i < n; i++) {
            run += s->w[i];
            if (run >= need) { keep = i + 1; break; }
        }
        n = keep;
    }
    if (s->p.min_p > 0.0f) {
        double floor_w = (double)s->p.min_p * s->w[0];
        int keep = 1;
        while (keep < n && s->w[keep] >= floor_w) keep++;
        n = keep; /* weights fall along the order, so the kept ones are a prefix */
    }
    double kept = 0;
    for (int i = 0; i < n; i++) kept += s->w[i];
    double u = colibri_rng_uniform(s->p.seed, s->draws++) * kept, run = 0;
    for (int i = 0; i < n; i++) {
        run += s->w[i];
        if (u < run) return s->idx[i];
    }
    return s->idx[n - 1];
}
