/* `colibri selftest`: checks that need no model file (see colibri.h). Runs on the target device
 * right after a deploy, so it exercises the code paths of this very binary: the bitonic network,
 * both routing algorithms, the SIMD kernels this CPU picked, the loader, the arena and the pool. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colibri.h"
#include "colibri_config.h"
#include "cpu/kernels.h"
#include "cpu/kernels_mxfp4.h"
#include "cpu/kernels_q4.h"
#include "cpu/q4_pack.h"
#include "model.h"
#include "layers/route.h"
#include "selftest_model.h"

typedef struct {
    int verbose, failed;
} report;

static void check(report *r, int ok, const char *what) {
    if (!ok) r->failed++;
    if (r->verbose || !ok) printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

/* xorshift: deterministic test data without libc rand state */
static uint32_t rnd(uint32_t *s) {
    *s ^= *s << 13;
    *s ^= *s >> 17;
    *s ^= *s << 5;
    return *s;
}
static float rndf(uint32_t *s) { return (float)(rnd(s) >> 8) / 16777216.0f * 2.0f - 1.0f; }

/* ---- top-k ---------------------------------------------------------------------------------- */

static void brute_topk(const float *v, int n, int k, int32_t *idx) {
    unsigned char used[COLIBRI_MAX_EXPERTS] = {0};
    for (int i = 0; i < k; i++) {
        int best = -1;
        for (int e = 0; e < n; e++)
            if (!used[e] && (best < 0 || v[e] > v[best])) best = e; /* strict: lower index wins ties */
        used[best] = 1;
        idx[i] = best;
    }
}

static void check_topk(report *r) {
    uint32_t s = 12345;
    int bad = 0, cases = 0;
    float v[COLIBRI_MAX_EXPERTS], got_v[16];
    int32_t got[16], want[16];
    for (int n = 1; n <= COLIBRI_MAX_EXPERTS; n++)
        for (int k = 1; k <= n && k <= COLIBRI_TOP_K; k++)
            for (int rep = 0; rep < 6; rep++) {
                /* rep 0-2: distinct-ish values; 3-5: only 3 distinct values (many ties) */
                for (int e = 0; e < n; e++)
                    v[e] = rep < 3 ? rndf(&s) : (float)(rnd(&s) % 3) - 1.0f;
                if (rep == 5)
                    for (int e = 0; e < n; e++) v[e] = 0.5f; /* all equal */
                colibri_topk_bitonic(v, n, k, got, got_v);
                brute_topk(v, n, k, want);
                cases++;
                for (int i = 0; i < k; i++)
                    if (got[i] != want[i] || got_v[i] != v[want[i]]) {
                        bad++;
                        break;
                    }
            }
    char msg[128];
    snprintf(msg, sizeof msg, "bitonic top-k == brute force (ties to lower index), %d cases", cases);
    check(r, bad == 0, msg);
}

static void check_routing(report *r) {
    uint32_t s = 777;
    int bad = 0;
    for (int rep = 0; rep < 500; rep++) {
        int n = 2 + (int)(rnd(&s) % (COLIBRI_MAX_EXPERTS - 1)), k = 1 + (int)(rnd(&s) % 4);
        if (k > n) k = n;
        if (k > COLIBRI_TOP_K) k = COLIBRI_TOP_K;
        int renorm = rep & 1;
        float logits[COLIBRI_MAX_EXPERTS], w[16];
        int32_t idx[16], want[16];
        for (int e = 0; e < n; e++) logits[e] = 4.0f * rndf(&s);
        colibri_route_token(logits, n, k, renorm, idx, w);
        brute_topk(logits, n, k, want);
        double mx = logits[0], tot = 0, sel = 0;
        for (int e = 1; e < n; e++) mx = fmax(mx, logits[e]);
        for (int e = 0; e < n; e++) tot += exp(logits[e] - mx);
        for (int i = 0; i < k; i++) sel += exp(logits[want[i]] - mx);
        for (int i = 0; i < k; i++) {
            double p = exp(logits[want[i]] - mx) / (renorm ? sel : tot);
            if (idx[i] != want[i] || fabs(w[i] - p) > 1e-6) bad++;
        }
    }
    check(r, bad == 0,
          COLIBRI_ROUTING_MODE == COLIBRI_ROUTING_SOFTMAX_TOPK
              ? "routing (softmax_topk): experts and weights match softmax + top-k in double"
              : "routing (linear_score): experts and weights match softmax + top-k in double");
}

/* ---- kernels -------------------------------------------------------------------------------- */

static uint16_t float_to_half(float f) { /* round to nearest even, normal range only (tests) */
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t sign = (u >> 16) & 0x8000, exp = (u >> 23) & 0xff, man = u & 0x7fffff;
    if (exp == 0) return (uint16_t)sign;
    int e = (int)exp - 127 + 15;
    uint32_t h = sign | (uint32_t)e << 10 | man >> 13, rest = man & 0x1fff;
    if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) h++;
    return (uint16_t)h;
}

static void check_kernels(report *r, const char *simd) {
    uint32_t s = 99;
    enum { COLS = 203, ROWS = 5, N = 3 };
    float wf[ROWS * COLS], x[N * COLS], y[N * ROWS], y1[N * ROWS], scratch[2 * COLS];
    uint16_t wh[ROWS * COLS], wb[ROWS * COLS];
    int8_t wq[ROWS * COLS];
    float scales[ROWS];
    for (int i = 0; i < ROWS * COLS; i++) {
        wh[i] = float_to_half(rndf(&s));
        wb[i] = (uint16_t)(rnd(&s) >> 16 & 0x3fff) | (uint16_t)((rnd(&s) & 1) << 15); /* |v| < 2 */
        wq[i] = (int8_t)((int)(rnd(&s) % 255) - 127);
    }
    for (int i = 0; i < ROWS; i++) scales[i] = 0.01f * (float)(i + 1);
    for (int i = 0; i < N * COLS; i++) x[i] = rndf(&s);
    const void *data[4] = {wf, wh, wb, wq};
    const char *names[4] = {"f32", "f16", "bf16", "int8"};
    for (int i = 0; i < ROWS * COLS; i++) wf[i] = rndf(&s);
    for (int dt = 0; dt < 4; dt++) {
        colibri_tensor t = {data[dt], dt == 3 ? scales : NULL, (uint32_t)dt, ROWS, COLS, NULL};
        colibri_rows_dot(&t, 0, ROWS, x, N, COLS, y, ROWS, scratch);
        int bad = 0, same = 1;
        float row[COLS];
        for (int rr = 0; rr < ROWS; rr++) {
            colibri_row_f32(&t, (uint32_t)rr, row);
            for (int j = 0; j < N; j++) {
                double ref = 0, mag = 0;
                for (int c = 0; c < COLS; c++) {
                    ref += (double)row[c] * x[j * COLS + c];
                    mag += fabs((double)row[c] * x[j * COLS + c]);
                }
                if (fabs(y[j * ROWS + rr] - ref) > 1e-5 * (mag + 1e-30)) bad++;
                /* one token at a time (decode path) gives the same bits as n at once */
                colibri_rows_dot(&t, (uint32_t)rr, (uint32_t)rr + 1, x + j * COLS, 1, COLS,
                                 y1 + j * ROWS, ROWS, scratch);
                same &= memcmp(&y1[j * ROWS + rr], &y[j * ROWS + rr], sizeof(float)) == 0;
            }
        }
        char msg[160];
        snprintf(msg, sizeof msg, "%s rows_dot (%s) == double reference; decode bits == prefill bits",
                 names[dt], simd);
        check(r, bad == 0 && same, msg);
    }
    /* int8 x int8 integer dot: exact against the quantised values, for the N tokens at once
     * (prefill: the SDOT/SMMLA/VNNI tiles) and one at a time (decode streams) */
    int8_t xq[N * COLS];
    float xs[N];
    for (int j = 0; j < N; j++) colibri_quantize_row(x + j * COLS, COLS, xq + j * COLS, &xs[j]);
    colibri_tensor t = {wq, scales, COLIBRI_DT_INT8, ROWS, COLS, NULL};
    colibri_rows_dot_q8(&t, 0, ROWS, xq, xs, N, COLS, y, ROWS);
    for (int j = 0; j < N; j++)
        colibri_rows_dot_q8(&t, 0, ROWS, xq + j * COLS, &xs[j], 1, COLS, y1 + j * ROWS, ROWS);
    int bad = 0;
    for (int rr = 0; rr < ROWS; rr++)
        for (int j = 0; j < N; j++) {
            long acc = 0;
            for (int c = 0; c < COLS; c++) acc += (long)wq[rr * COLS + c] * xq[j * COLS + c];
            float want = (float)acc * (scales[rr] * xs[j]);
            if (y[j * ROWS + rr] != want || y1[j * ROWS + rr] != want) bad++;
        }
    char qmsg[160];
    snprintf(qmsg, sizeof qmsg, "int8 x int8 (%s) integer dot products are exact, %d tokens at "
             "once and one at a time", simd, N);
    check(r, bad == 0, qmsg);
    float hv[4] = {1.0f, -2.5f, 0.333251953125f, 65504.0f};
    int hok = 1;
    for (int i = 0; i < 4; i++) {
        uint16_t h = float_to_half(hv[i]);
        colibri_tensor ht = {&h, NULL, COLIBRI_DT_F16, 1, 1, NULL};
        float back;
        colibri_row_f32(&ht, 0, &back);
        hok &= back == hv[i];
    }
    check(r, hok, "f16 -> f32 conversion of exact values");
}

/* The packed int8 layout (q4_pack.h): 32 rows (two 16-row blocks) x COLS against N tokens, all
 * rows at once, a range split inside a block (13: rows computed and not stored), and one token
 * at a time; every output must be the exact integer dot times the scales, the file layout's
 * expression. COLS 36: a chain tail (9 chunks); 1028: 257 chunks, 16 full 64-column steps; N
 * 11: an 8-token tile and a 3-token rest. Extreme values (-128 and 127 weights, +-127 tokens)
 * check the w + 128 offset and its correction. */
enum { I8P_ROWS = 32, I8P_MAXC = 1028, I8P_MAXN = 11 };

static int i8_packed_case(int cols, int n, uint32_t seed, int extreme) {
    static int8_t w[I8P_ROWS * I8P_MAXC], xq[I8P_MAXN * I8P_MAXC];
    static uint8_t packed[I8P_ROWS * I8P_MAXC];
    static float y[I8P_MAXN * I8P_ROWS], y1[I8P_MAXN * I8P_ROWS], y2[I8P_MAXN * I8P_ROWS];
    float scales[I8P_ROWS], xs[I8P_MAXN];
    uint32_t s = seed;
    for (int i = 0; i < I8P_ROWS * cols; i++)
        w[i] = extreme ? (int8_t)(i % 3 ? -128 : 127) : (int8_t)((int)(rnd(&s) % 256) - 128);
    for (int i = 0; i < n * cols; i++)
        xq[i] = extreme ? (int8_t)(i % 2 ? 127 : -127) : (int8_t)((int)(rnd(&s) % 255) - 127);
    for (int i = 0; i < I8P_ROWS; i++) scales[i] = 0.001f * (float)(i + 3);
    for (int j = 0; j < n; j++) xs[j] = 0.01f * (float)(j + 1);
    colibri_tensor t = {w, scales, COLIBRI_DT_INT8, I8P_ROWS, (uint32_t)cols, NULL};
    if (colibri_i8_packed_bytes(&t) != (size_t)I8P_ROWS * (size_t)cols) return 0;
    colibri_i8_pack(&t, packed);
    t.packed = packed;
    colibri_rows_dot_q8(&t, 0, I8P_ROWS, xq, xs, n, (size_t)cols, y, I8P_ROWS);
    memset(y2, 0xff, sizeof y2);
    colibri_rows_dot_q8(&t, 0, 13, xq, xs, n, (size_t)cols, y2, I8P_ROWS);
    int kept = 1; /* rows outside the range are not stored */
    for (int j = 0; j < n; j++)
        for (int b = 13 * 4; b < I8P_ROWS * 4; b++) kept &= ((uint8_t *)(y2 + j * I8P_ROWS))[b] == 0xff;
    colibri_rows_dot_q8(&t, 13, I8P_ROWS, xq, xs, n, (size_t)cols, y2, I8P_ROWS);
    for (int j = 0; j < n; j++)
        colibri_rows_dot_q8(&t, 0, I8P_ROWS, xq + j * cols, &xs[j], 1, (size_t)cols,
                            y1 + j * I8P_ROWS, I8P_ROWS);
    int ok = kept;
    for (int r = 0; r < I8P_ROWS; r++)
        for (int j = 0; j < n; j++) {
            long acc = 0;
            for (int c = 0; c < cols; c++) acc += (long)w[r * cols + c] * xq[j * cols + c];
            float want = (float)acc * (scales[r] * xs[j]);
            int at = j * I8P_ROWS + r;
            ok &= memcmp(&want, &y[at], 4) == 0 && memcmp(&want, &y1[at], 4) == 0 &&
                  memcmp(&want, &y2[at], 4) == 0;
        }
    return ok;
}

static void check_int8_packed(report *r, const char *simd) {
    int ok = i8_packed_case(36, 5, 7, 0) && i8_packed_case(1028, I8P_MAXN, 11, 0) &&
             i8_packed_case(1028, 3, 13, 1) && i8_packed_case(4, 1, 17, 0);
    char msg[192];
    snprintf(msg, sizeof msg, "int8 x int8 (%s) on the packed layout: the exact integer dots, all "
             "rows, a range split inside a block, token by token%s", simd,
             colibri_int8_kernels_have_packed() ? "" : " (the packed layout: not read on this CPU)");
    check(r, ok, msg);
}

/* ---- f16 KV cache rounding ------------------------------------------------------------------- */

static float from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The conversion this binary uses for the f16 KV cache (F16C / NEON / scalar) against the scalar
 * one and against IEEE facts: every finite half comes back to itself, round-to-nearest-even ties,
 * subnormals, overflow, infinities and NaNs; plus a sweep over the f32 bit patterns. */
static void check_kv_rounding(report *r) {
    static const struct { uint32_t f; uint16_t h; } known[] = {
        {0x3f800000u, 0x3c00u}, /* 1 */
        {0x3f801000u, 0x3c00u}, /* 1 + 2^-11: halfway, to even (down) */
        {0x3f803000u, 0x3c02u}, /* 1 + 3 * 2^-11: halfway, to even (up) */
        {0x3f801001u, 0x3c01u}, /* just above halfway */
        {0x477fe000u, 0x7bffu}, /* 65504, the largest half */
        {0x477fefffu, 0x7bffu}, /* below 65520 */
        {0x477ff000u, 0x7c00u}, /* 65520: halfway to 65536, to even = infinity */
        {0x38800000u, 0x0400u}, /* 2^-14, the smallest normal */
        {0x387fc000u, 0x03ffu}, /* the largest subnormal */
        {0x387fe000u, 0x0400u}, /* halfway between it and 2^-14: up to even */
        {0x33800000u, 0x0001u}, /* 2^-24, the smallest subnormal */
        {0x33000000u, 0x0000u}, /* 2^-25: halfway to 0, to even = 0 */
        {0x33000001u, 0x0001u}, /* just above */
        {0x33c00000u, 0x0002u}, /* 1.5 * 2^-24: halfway, to even (up) */
        {0x00000001u, 0x0000u}, /* f32 subnormal */
        {0x80000000u, 0x8000u}, /* -0 */
        {0xc0200000u, 0xc100u}, /* -2.5 */
        {0x7f800000u, 0x7c00u}, /* inf */
        {0xff800000u, 0xfc00u}, /* -inf */
        {0x7f7fffffu, 0x7c00u}, /* FLT_MAX */
    };
    enum { NK = sizeof known / sizeof known[0], BLOCK = 61 };
    float x[BLOCK];
    uint16_t a[BLOCK], b[BLOCK];
    int bad = 0;
    for (int i = 0; i < NK; i++) x[i] = from_bits(known[i].f);
    colibri_f32_to_f16(x, NK, a);
    colibri_f32_to_f16_scalar(x, NK, b);
    for (int i = 0; i < NK; i++) bad += a[i] != known[i].h || b[i] != known[i].h;
    check(r, bad == 0, "f16 KV rounding: ties to even, subnormals, overflow, infinities");
    /* every finite half widens and rounds back to itself; NaNs stay NaNs with the sign */
    bad = 0;
    for (uint32_t h0 = 0; h0 < 65536u; h0 += BLOCK) {
        int n = 0;
        for (; n < BLOCK && h0 + (uint32_t)n < 65536u; n++) a[n] = (uint16_t)(h0 + (uint32_t)n);
        colibri_f16_to_f32(a, (size_t)n, x);
        colibri_f32_to_f16(x, (size_t)n, b);
        for (int i = 0; i < n; i++) {
            int nan = (a[i] & 0x7c00u) == 0x7c00u && (a[i] & 0x3ffu);
            if (nan ? (b[i] & 0x7e00u) != 0x7e00u || (b[i] ^ a[i]) & 0x81ffu : b[i] != a[i]) bad++;
        }
    }
    check(r, bad == 0, "f16 KV rounding: every half round-trips (NaNs quiet, payload kept)");
    /* f32 bit patterns across the whole range (NaNs included), in blocks that leave SIMD tails */
    bad = 0;
    uint32_t u = 0x9e3779b9u;
    for (int it = 0; it < 20000; it++) {
        for (int i = 0; i < BLOCK; i++) {
            u = u * 2654435761u + 0x6d2b79f5u;
            /* odd: any pattern; even: exponents 2^-31..2^16 (subnormal, normal, overflow) */
            x[i] = from_bits(it & 1 ? u : (u & 0x807fffffu) | ((96u + (u >> 23) % 48u) << 23));
        }
        colibri_f32_to_f16(x, BLOCK, a);
        colibri_f32_to_f16_scalar(x, BLOCK, b);
        bad += memcmp(a, b, sizeof a) != 0;
    }
    char msg[160];
    snprintf(msg, sizeof msg, "f16 KV rounding (%s path) == scalar on 1.2M f32 bit patterns",
             colibri_kernels_init());
    check(r, bad == 0, msg);
}

/* ---- a synthetic model end to end ----------------------------------------------------------- */

static int run_model(const char *path, int threads, colibri_kv_dtype kv, const int32_t *ids, int n,
                     int one_by_one, float *logits, char *err, size_t errlen) {
    colibri_options o;
    colibri_default_options(&o);
    o.threads = threads;
    o.kv_dtype = kv;
    o.backend = COLIBRI_BACKEND_CPU;
    o.error = err;
    o.error_len = errlen;
    colibri_ctx *ctx;
    if (colibri_init_ex(&ctx, path, &o)) return -1;
    colibri_model_info mi;
    colibri_get_model_info(ctx, &mi);
    int rc = 0;
    if (one_by_one) {
        for (int i = 0; i < n && !rc; i++)
            rc = colibri_forward(ctx, ids + i, 1, logits + (size_t)i * mi.vocab_size) ? -1 : 0;
    } else {
        rc = colibri_forward(ctx, ids, n, logits) ? -1 : 0;
    }
    if (rc) snprintf(err, errlen, "%s", colibri_last_error(ctx));
    colibri_free(ctx);
    return rc;
}

static void check_model(report *r) {
    const char *dir = getenv("TMPDIR");
    char path[512];
    snprintf(path, sizeof path, "%s/colibri-selftest-%ld.colibri", dir && *dir ? dir : "/tmp",
             (long)getpid());
    for (uint32_t dt = 0; dt < 4; dt++) {
        char msg[800], err[512] = "";
        if (colibri_selftest_write_model(path, dt, COLIBRI_EMBED_DIM_PAD) != 0) {
            snprintf(msg, sizeof msg, "write synthetic model to %s", path);
            check(r, 0, msg);
            return;
        }
        enum { N = 12, V = COLIBRI_SELFTEST_VOCAB };
        int32_t ids[N];
        for (int i = 0; i < N; i++) ids[i] = (i * 7 + 3) % V;
        static float a[N * V], b[N * V], c[N * V];
        for (int kv = COLIBRI_KV_F32; kv <= COLIBRI_KV_F16; kv++) {
            int ok = run_model(path, 1, kv, ids, N, 0, a, err, sizeof err) == 0 &&
                     run_model(path, 3, kv, ids, N, 0, b, err, sizeof err) == 0 &&
                     run_model(path, 2, kv, ids, N, 1, c, err, sizeof err) == 0;
            int finite = 1;
            for (int i = 0; ok && i < N * V; i++) finite &= isfinite(a[i]) != 0;
            snprintf(msg, sizeof msg,
                     "synthetic %s model (shared expert, gate, qkv bias, q/k norm), %s KV cache: "
                     "finite; 1 vs 3 threads and prefill vs decode bitwise equal%s%s",
                     (const char *[]){"f32", "f16", "bf16", "int8"}[dt], kv ? "f16" : "f32",
                     err[0] ? ": " : "", err);
            check(r, ok && finite && !memcmp(a, b, sizeof a) && !memcmp(a, c, sizeof a), msg);
        }
    }
    unlink(path);
}

int colibri_selftest(int verbose) {
    report r = {verbose, 0};
    const char *simd = colibri_kernels_init();
    check_topk(&r);
    check_routing(&r);
    check_kernels(&r, simd);
    check_int8_packed(&r, simd);
    check_kv_rounding(&r);
    { char qmsg[160]; int ok = colibri_q4_selftest(qmsg, sizeof qmsg); check(&r, ok, qmsg); }
    { char mmsg[192]; int ok = colibri_mxfp4_selftest(mmsg, sizeof mmsg); check(&r, ok, mmsg); }
    check_model(&r);
    if (verbose) printf("%s: %d check(s) failed\n", r.failed ? "FAILED" : "passed", r.failed);
    return r.failed;
}
