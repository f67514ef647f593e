/* `colibri synth`: write a random Mixtral-shaped `.colibri` model of any size, deterministically
 * from a seed, streamed to disk (docs/format.md layout, version 1). It exists so a speed check on
 * a machine without Python or network (scripts/gpu-check.sh on a GPU machine) can make a model
 * whose per-token weights are gigabytes instead of shipping it. The numbers are noise scaled like
 * a trained layer's (uniform, 1.7 / sqrt(fan-in)); padded lanes are zero, as the converter writes.
 *
 *   colibri synth OUT [--dim D] [--layers L] [--experts E] [--top-k K] [--ffn F] [--heads H]
 *                     [--kv-heads H] [--head-dim N] [--vocab V] [--seq S] [--pad P]
 *                     [--dtype f32|f16|bf16|int8] [--seed N]
 *
 * Exit status: 0 written, 1 I/O error, 2 usage. */
#include <errno.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "colibri_config.h"
#include "core/le_write.h"
#include "core/model.h"

typedef struct {
    uint32_t kind, layer, expert, rows, cols, dtype;
    uint64_t off, nbytes, soff;
} synth_tensor;

typedef struct {
    uint32_t D, L, E, K, F, H, HKV, DH, V, S, pad, dtype;
    uint64_t seed;
} synth_geom;

static float synth_uniform(uint64_t *s) { /* xorshift64*: [-1, 1) */
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    return (float)((*s * 2685821657736338717ull) >> 40) / 16777216.0f * 2.0f - 1.0f;
}

static int synth_layout(const synth_geom *g, synth_tensor *t) {
    const uint32_t DP = (g->D + g->pad - 1) / g->pad * g->pad, G = COLIBRI_NO_INDEX;
    int n = 0;
#define T(k, l, e, r, c, big) t[n++] = (synth_tensor){(k), (l), (e), (r), (c), (big) ? g->dtype : COLIBRI_DT_F32, 0, 0, 0}
    for (uint32_t l = 0; l < g->L; l++) {
        T(COLIBRI_K_ATTN_NORM, l, G, 1, DP, 0);
        T(COLIBRI_K_WQ, l, G, g->H * g->DH, DP, 1);
        T(COLIBRI_K_WK, l, G, g->HKV * g->DH, DP, 1);
        T(COLIBRI_K_WV, l, G, g->HKV * g->DH, DP, 1);
        T(COLIBRI_K_WO, l, G, DP, g->H * g->DH, 1);
        T(COLIBRI_K_FFN_NORM, l, G, 1, DP, 0);
        T(COLIBRI_K_ROUTER, l, G, g->E, DP, 0);
        for (uint32_t e = 0; e < g->E; e++) T(COLIBRI_K_EXPERT_W1, l, e, g->F, DP, 1);
        for (uint32_t e = 0; e < g->E; e++) T(COLIBRI_K_EXPERT_W3, l, e, g->F, DP, 1);
        for (uint32_t e = 0; e < g->E; e++) T(COLIBRI_K_EXPERT_W2, l, e, DP, g->F, 1);
    }
    T(COLIBRI_K_TOK_EMBED, G, G, g->V, DP, 1);
    T(COLIBRI_K_OUTPUT_NORM, G, G, 1, DP, 0);
    T(COLIBRI_K_LM_HEAD, G, G, g->V, DP, 1);
#undef T
    return n;
}

/* One tensor's rows (and int8 row scales) at their offsets; `row` holds max(cols) floats and
 * `bytes` 4 * max(cols). */
static int synth_tensor_data(FILE *f, const synth_geom *g, const synth_tensor *t, uint64_t *seed,
                             float *row, uint8_t *bytes) {
    const uint32_t DP = (g->D + g->pad - 1) / g->pad * g->pad;
    const int vec = t->rows == 1, in_padded = t->cols == DP;
    const int out_padded = t->rows == DP && t->kind != COLIBRI_K_TOK_EMBED;
    const float scale = 1.7f / sqrtf((float)(in_padded ? g->D : t->cols));
    const size_t esz = colibri_dtype_size(t->dtype);
    if (fseeko(f, (off_t)t->off, SEEK_SET)) return -1;
    float *scales = t->dtype == COLIBRI_DT_INT8 ? malloc(sizeof(float) * t->rows) : NULL;
    if (t->dtype == COLIBRI_DT_INT8 && !scales) return -1;
    for (uint32_t r = 0; r < t->rows; r++) {
        float amax = 0.0f;
        for (uint32_t c = 0; c < t->cols; c++) {
            float u = synth_uniform(seed);
            float v = vec ? 1.0f + 0.2f * u : scale * u;
            if ((in_padded && c >= g->D) || (out_padded && r >= g->D)) v = 0.0f;
            row[c] = v;
            amax = fmaxf(amax, fabsf(v));
        }
        for (uint32_t c = 0; c < t->cols; c++) {
            if (t->dtype == COLIBRI_DT_F32) {
                le_putf(bytes + 4 * c, row[c]);
            } else if (t->dtype == COLIBRI_DT_F16 || t->dtype == COLIBRI_DT_BF16) {
                uint16_t h = t->dtype == COLIBRI_DT_F16 ? le_half(row[c], 1) : le_bf16(row[c]);
                bytes[2 * c] = (uint8_t)h;
                bytes[2 * c + 1] = (uint8_t)(h >> 8);
            } else {
                float sc = amax > 0.0f ? amax / 127.0f : 1.0f;
                bytes[c] = (uint8_t)(int8_t)lrintf(row[c] / sc);
                if (c == 0) scales[r] = sc;
            }
        }
        if (fwrite(bytes, esz, t->cols, f) != t->cols) { free(scales); return -1; }
    }
    int rc = 0;
    if (scales) {
        uint8_t b[4];
        rc = fseeko(f, (off_t)t->soff, SEEK_SET) ? -1 : 0;
        for (uint32_t r = 0; r < t->rows && rc == 0; r++) {
            le_putf(b, scales[r]);
            if (fwrite(b, 1, 4, f) != 4) rc = -1;
        }
        free(scales);
    }
    return rc;
}

static int synth_write(const char *path, const synth_geom *g) {
    const uint32_t DP = (g->D + g->pad - 1) / g->pad * g->pad;
    const int cap = (int)(g->L * (7 + 3 * g->E) + 3);
    synth_tensor *t = calloc((size_t)cap, sizeof *t);
    if (!t) return -1;
    const int n = synth_layout(g, t);
    uint64_t at = (256 + (uint64_t)n * 64 + 4095) / 4096 * 4096, data_offset = at;
    uint32_t maxc = 0;
    for (int i = 0; i < n; i++) {
        t[i].nbytes = (uint64_t)t[i].rows * t[i].cols * colibri_dtype_size(t[i].dtype);
        t[i].off = at;
        at = (at + t[i].nbytes + 63) / 64 * 64;
        if (t[i].dtype == COLIBRI_DT_INT8) {
            t[i].soff = at;
            at = (at + t[i].rows * 4ull + 63) / 64 * 64;
        }
        if (t[i].cols > maxc) maxc = t[i].cols;
    }
    uint8_t *head = calloc(1, data_offset);
    float *row = malloc(sizeof(float) * maxc);
    uint8_t *bytes = malloc(4u * maxc);
    FILE *f = fopen(path, "wb");
    int rc = head && row && bytes && f ? 0 : -1;
    if (rc == 0) {
        memcpy(head, "COLIBRI\0", 8);
        const uint32_t hv[] = {1, g->E, g->F, g->V, g->S, g->D, 256, g->L, g->H, g->HKV, g->DH,
                               g->K, 0, g->dtype, DP, g->pad, 0, 0};
        for (size_t i = 0; i < sizeof hv / sizeof hv[0]; i++) le_put32(head + 8 + 4 * i, hv[i]);
        le_putf(head + 80, 1e-5f);
        le_putf(head + 84, 10000.0f);
        le_put32(head + 88, (uint32_t)n);
        le_put32(head + 92, 256);
        le_put64(head + 96, data_offset);
        le_put64(head + 104, at);
        le_put32(head + 112, 255); /* family: other */
        le_put32(head + 116, 0xFFFFFFFFu);
        le_put32(head + 120, 0xFFFFFFFFu);
        snprintf((char *)head + 192, 64, "colibri-synth-seed-%llu", (unsigned long long)g->seed);
        for (int i = 0; i < n; i++) {
            uint8_t *rec = head + 256 + 64 * (size_t)i;
            le_put32(rec, t[i].kind); le_put32(rec + 4, t[i].layer);
            le_put32(rec + 8, t[i].expert); le_put32(rec + 12, t[i].dtype);
            le_put32(rec + 16, t[i].rows); le_put32(rec + 20, t[i].cols);
            le_put64(rec + 24, t[i].off); le_put64(rec + 32, t[i].nbytes);
            if (t[i].dtype == COLIBRI_DT_INT8) {
                le_put64(rec + 40, t[i].soff);
                le_put64(rec + 48, t[i].rows * 4ull);
            }
        }
        if (fwrite(head, 1, data_offset, f) != data_offset) rc = -1;
    }
    uint64_t seed = g->seed * 0x9E3779B97F4A7C15ull + 1;
    for (int i = 0; i < n && rc == 0; i++) {
        rc = synth_tensor_data(f, g, &t[i], &seed, row, bytes);
        if (i % 64 == 63) fprintf(stderr, "colibri synth: %d/%d tensors\n", i + 1, n);
    }
    /* the file ends where the last tensor's 64-byte-aligned region ends */
    if (rc == 0 && (fseeko(f, (off_t)at - 1, SEEK_SET) || fputc(0, f) == EOF)) rc = -1;
    if (f && fclose(f) != 0) rc = -1;
    if (rc == 0) printf("{\"path\": \"%s\", \"file_bytes\": %llu, \"tensors\": %d}\n", path,
                        (unsigned long long)at, n);
    free(head); free(row); free(bytes); free(t);
    return rc;
}

/* On stdout for --help, on stderr after a usage error (then exit 2). */
static int synth_usage_to(FILE *f, const char *msg) {
    if (msg) fprintf(stderr, "colibri synth: %s\n", msg);
    fprintf(f,
            "usage: colibri synth OUT [options]   random Mixtral-shaped model (no shared expert)\n"
            "  --dim D (2048) --layers L (8) --experts E (8) --top-k K (2) --ffn F (5632)\n"
            "  --heads H (16) --kv-heads H (4) --head-dim N (128) --vocab V (32000) --seq S (256)\n"
            "  --pad P (this build's COLIBRI_EMBED_DIM_PAD) --dtype f32|f16|bf16|int8 (f16)\n"
            "  --seed N (1): same options and seed, same bytes\n"
            "  The defaults read ~1.4 GB of f16 weights per decoded token (file ~4.9 GB).\n"
            "  It writes format version 1: every layer attention + moe.\n"
            "  (the global options are accepted and unused)\n");
    return 2;
}

static int synth_usage(const char *msg) { return synth_usage_to(stderr, msg); }

/* argv[0] is "synth" */
int cmd_synth(const cli_globals *gl, int argc, char **argv) {
    cli_globals globals = *gl;
    synth_geom g = {2048, 8, 8, 2, 5632, 16, 4, 128, 32000, 256, COLIBRI_EMBED_DIM_PAD,
                    COLIBRI_DT_F16, 1};
    const char *out = NULL;
    static const struct { const char *opt; size_t off; unsigned long lo, hi; } nums[] = {
        {"--dim", offsetof(synth_geom, D), 1, 65536},
        {"--layers", offsetof(synth_geom, L), 1, 1024},
        {"--experts", offsetof(synth_geom, E), 1, COLIBRI_MAX_EXPERTS},
        {"--top-k", offsetof(synth_geom, K), 1, COLIBRI_TOP_K},
        {"--ffn", offsetof(synth_geom, F), 1, 1u << 20},
        {"--heads", offsetof(synth_geom, H), 1, 1024},
        {"--kv-heads", offsetof(synth_geom, HKV), 1, 1024},
        {"--head-dim", offsetof(synth_geom, DH), 2, 1024},
        {"--vocab", offsetof(synth_geom, V), 1, 1u << 22},
        {"--seq", offsetof(synth_geom, S), 1, 1u << 20},
        {"--pad", offsetof(synth_geom, pad), 16, 65536},
    };
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int done = 0;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            synth_usage_to(stdout, NULL);
            return 0;
        }
        int r = cli_global(&globals, argc, argv, &i);
        if (r < 0) return synth_usage(NULL);
        if (r) continue;
        for (size_t j = 0; j < sizeof nums / sizeof nums[0] && !done; j++) {
            if (strcmp(a, nums[j].opt)) continue;
            char *end;
            errno = 0;
            unsigned long x = v ? strtoul(v, &end, 10) : 0;
            if (!v || errno || end == v || *end || x < nums[j].lo || x > nums[j].hi) {
                fprintf(stderr, "colibri synth: %s must be %lu..%lu\n", a, nums[j].lo, nums[j].hi);
                return 2;
            }
            *(uint32_t *)((char *)&g + nums[j].off) = (uint32_t)x;
            done = 1;
            i++;
        }
        if (done) continue;
        if (!strcmp(a, "--dtype") && v) {
            static const char *names[] = COLIBRI_DT_NAMES;
            g.dtype = COLIBRI_DT_COUNT;
            for (uint32_t d = 0; d < COLIBRI_DT_COUNT; d++)
                if (!strcmp(v, names[d])) g.dtype = d;
            /* this writer rounds to the per-row types only */
            if (g.dtype > COLIBRI_DT_INT8) return synth_usage("--dtype must be f32, f16, bf16 or int8");
            i++;
        } else if (!strcmp(a, "--seed") && v) {
            char *end;
            errno = 0;
            g.seed = strtoull(v, &end, 10);
            if (errno || end == v || *end) return synth_usage("--seed must be an integer");
            i++;
        } else if (a[0] != '-' && !out) {
            out = a;
        } else {
            return synth_usage("unknown or incomplete argument");
        }
    }
    if (!out) return synth_usage("OUT is required");
    if (g.K > g.E || g.H % g.HKV || g.DH % 2 || g.pad % 16)
        return synth_usage("need top-k <= experts, heads a multiple of kv-heads, even head-dim, "
                           "pad a multiple of 16");
    if (synth_write(out, &g)) {
        fprintf(stderr, "colibri synth: cannot write %s: %s\n", out, strerror(errno));
        return 1;
    }
    return 0;
}
