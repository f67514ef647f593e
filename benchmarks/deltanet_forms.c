/* The gated delta rule over a prompt in its two forms (benchmarks/deltanet_forms.py builds and
 * runs this; not part of the product), for H value heads of Dk x Dv and T tokens:
 *   recurrent: the runtime's colibri_delta_step token after token (what prefill runs: the bits of
 *              decode);
 *   chunked:   transformers' torch_chunk_gated_delta_rule order of work, chunks of C tokens (the
 *              WY form: a unit lower-triangular solve per chunk, then matrix products against the
 *              state), its inner loops four lanes at a time like the runtime's (GCC's vector
 *              extension: at -O2 the compiler leaves plain loops of this shape scalar, which
 *              would make the chunked form look 2x worse than it is).
 * Prints us per token for each, and the largest |difference| of the outputs relative to the
 * largest |output| (the bound a chunked prefill would have to document). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "layers/deltanet.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static unsigned seed = 7u;
static float rnd(void) { return (float)((seed = seed * 1103515245u + 12345u) >> 8) / 16777216.0f * 2.0f - 1.0f; }

static void l2(float *x, int n, float scale) {
    double s = 0;
    for (int i = 0; i < n; i++) s += (double)x[i] * x[i];
    float inv = (float)(1.0 / sqrt(s + 1e-6));
    for (int i = 0; i < n; i++) x[i] *= inv * scale;
}


/* y += a x (the runtime's four lanes, layers/deltanet.h) */
static void axpy(float *restrict y, float a, const float *restrict x, int n) {
    int i = 0;
    for (; i + 4 <= n; i += 4) colibri_st4(y + i, colibri_ld4(y + i) + a * colibri_ld4(x + i));
    for (; i < n; i++) y[i] += a * x[i];
}

static float dot(const float *a, const float *b, int n) {
    colibri_v4f acc = {0, 0, 0, 0};
    int i = 0;
    for (; i + 4 <= n; i += 4) acc += colibri_ld4(a + i) * colibri_ld4(b + i);
    float s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* One head, T tokens, chunks of C: q, k [T, dk], v [T, dv], beta, lg (log decay) [T]; S [dk, dv]. */
static void chunked(int T, int C, int dk, int dv, const float *q, const float *k, const float *v,
                    const float *beta, const float *lg, float *S, float *o, float *work) {
    float *cum = work, *A = cum + C, *U = A + (size_t)C * C, *W = U + (size_t)C * dv;
    float *vn = W + (size_t)C * dk, *qs = vn + (size_t)C * dv;
    for (int t0 = 0; t0 < T; t0 += C) {
        int n = T - t0 < C ? T - t0 : C;
        float acc = 0;
        for (int i = 0; i < n; i++) cum[i] = acc += lg[t0 + i];
        /* A[i][j] = (beta_i k_i . k_j) exp(cum_i - cum_j), j < i */
        for (int i = 0; i < n; i++)
            for (int j = 0; j < i; j++) {
                float d = dot(k + (size_t)(t0 + i) * dk, k + (size_t)(t0 + j) * dk, dk);
                A[i * C + j] = beta[t0 + i] * d * expf(cum[i] - cum[j]);
            }
        /* (I + A) U = beta v, (I + A) W = beta k exp(cum): forward substitution */
        for (int i = 0; i < n; i++) {
            float *u = U + (size_t)i * dv, *w = W + (size_t)i * dk;
            const float *vi = v + (size_t)(t0 + i) * dv, *ki = k + (size_t)(t0 + i) * dk;
            float bi = beta[t0 + i], e = bi * expf(cum[i]);
            for (int c = 0; c < dv; c++) u[c] = bi * vi[c];
            for (int r = 0; r < dk; r++) w[r] = e * ki[r];
            for (int j = 0; j < i; j++) {
                float a = A[i * C + j];
                const float *uj = U + (size_t)j * dv, *wj = W + (size_t)j * dk;
                axpy(u, -a, uj, dv);
                axpy(w, -a, wj, dk);
            }
        }
        /* v_new = U - W S; o = exp(cum) (q S) + sum_{j<=i} (q_i . k_j) exp(cum_i - cum_j) v_new_j */
        for (int i = 0; i < n; i++) {
            float *x = vn + (size_t)i * dv, *y = qs + (size_t)i * dv;
            memcpy(x, U + (size_t)i * dv, dv * sizeof(float));
            memset(y, 0, dv * sizeof(float));
            const float *w = W + (size_t)i * dk, *qi = q + (size_t)(t0 + i) * dk;
            for (int r = 0; r < dk; r++) {
                axpy(x, -w[r], S + (size_t)r * dv, dv);
                axpy(y, qi[r], S + (size_t)r * dv, dv);
            }
        }
        for (int i = 0; i < n; i++) {
            float *out = o + (size_t)(t0 + i) * dv, e = expf(cum[i]);
            const float *qi = q + (size_t)(t0 + i) * dk, *y = qs + (size_t)i * dv;
            for (int c = 0; c < dv; c++) out[c] = e * y[c];
            for (int j = 0; j <= i; j++) {
                float d = dot(qi, k + (size_t)(t0 + j) * dk, dk) * expf(cum[i] - cum[j]);
                axpy(out, d, vn + (size_t)j * dv, dv);
            }
        }
        /* S = exp(cum_last) S + sum_j (k_j exp(cum_last - cum_j)) v_new_j^T */
        float last = cum[n - 1], el = expf(last), *tail = A; /* A is spent: exp(last - cum_j) */
        for (int j = 0; j < n; j++) tail[j] = expf(last - cum[j]);
        for (int r = 0; r < dk; r++) {
            float *row = S + (size_t)r * dv;
            for (int c = 0; c < dv; c++) row[c] *= el;
            for (int j = 0; j < n; j++)
                axpy(row, k[(size_t)(t0 + j) * dk + r] * tail[j], vn + (size_t)j * dv, dv);
        }
    }
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: deltanet_forms H DK DV T C\n");
        return 2;
    }
    int H = atoi(argv[1]), dk = atoi(argv[2]), dv = atoi(argv[3]), T = atoi(argv[4]), C = atoi(argv[5]);
    size_t kv = (size_t)T * dk, vv = (size_t)T * dv;
    float *q = malloc(kv * H * 4), *k = malloc(kv * H * 4), *v = malloc(vv * H * 4);
    float *beta = malloc((size_t)T * H * 4), *lg = malloc((size_t)T * H * 4), *dec = malloc((size_t)T * H * 4);
    float *S1 = calloc((size_t)H * dk * dv, 4), *S2 = calloc((size_t)H * dk * dv, 4);
    float *o1 = malloc(vv * H * 4), *o2 = malloc(vv * H * 4);
    float *work = malloc(((size_t)C + (size_t)C * C + 3 * (size_t)C * (dv > dk ? dv : dk) + (size_t)C * dv) * 4);
    for (int h = 0; h < H; h++)
        for (int t = 0; t < T; t++) {
            float *qt = q + h * kv + (size_t)t * dk, *kt = k + h * kv + (size_t)t * dk;
            for (int i = 0; i < dk; i++) qt[i] = rnd(), kt[i] = rnd();
            l2(qt, dk, 1.0f / sqrtf((float)dk));
            l2(kt, dk, 1.0f);
            for (int i = 0; i < dv; i++) v[h * vv + (size_t)t * dv + i] = rnd();
            beta[h * T + t] = 0.5f + 0.5f * rnd();
            dec[h * T + t] = 0.75f + 0.25f * rnd(); /* decays in 0.5..1 */
            lg[h * T + t] = logf(dec[h * T + t]);
        }
    double best_r = 1e30, best_c = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        memset(S1, 0, (size_t)H * dk * dv * 4);
        memset(S2, 0, (size_t)H * dk * dv * 4);
        double a = now_us();
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                colibri_delta_step(S1 + (size_t)h * dk * dv, dk, dv, q + h * kv + (size_t)t * dk,
                                   k + h * kv + (size_t)t * dk, v + h * vv + (size_t)t * dv,
                                   beta[h * T + t], dec[h * T + t], o1 + h * vv + (size_t)t * dv);
        double b = now_us();
        for (int h = 0; h < H; h++)
            chunked(T, C, dk, dv, q + h * kv, k + h * kv, v + h * vv, beta + h * T, lg + h * T,
                    S2 + (size_t)h * dk * dv, o2 + h * vv, work);
        double c = now_us();
        if (b - a < best_r) best_r = b - a;
        if (c - b < best_c) best_c = c - b;
    }
    double mx = 0, diff = 0;
    for (size_t i = 0; i < vv * H; i++) {
        mx = fmax(mx, fabs(o1[i]));
        diff = fmax(diff, fabs((double)o1[i] - o2[i]));
    }
    printf("{\"heads\": %d, \"dk\": %d, \"dv\": %d, \"tokens\": %d, \"chunk\": %d, "
           "\"recurrent_us_per_token\": %.2f, \"chunked_us_per_token\": %.2f, \"max_rel_diff\": %.3g}\n",
           H, dk, dv, T, C, best_r / T, best_c / T, diff / mx);
    return 0;
}
