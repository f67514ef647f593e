/* C unit tests of the runtime: loader refusals on corrupted in-memory models (every status and
 * the field named in the message), API argument and state errors, the kernels' bit-exactness
 * contracts (prefill tiles == decode streams == any row split), and the built-in selftest. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "colibri.h"
#include "colibri_config.h"
#include "cpu/kernels.h"
#include "core/model.h"
#include "layers/route.h"
#include "core/selftest_model.h"

static int failures;

#define EXPECT(cond, ...)                                                                     \
    do {                                                                                      \
        if (cond) {                                                                           \
            printf("ok   ");                                                                  \
        } else {                                                                              \
            printf("FAIL ");                                                                  \
            failures++;                                                                       \
        }                                                                                     \
        printf(__VA_ARGS__);                                                                  \
        printf("\n");                                                                         \
    } while (0)

static uint8_t *orig;
static size_t orig_len;

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> 8 * i); }
static void put64(uint8_t *p, uint64_t v) { put32(p, (uint32_t)v); put32(p + 4, (uint32_t)(v >> 32)); }

/* Load a mutated copy; expect `want` and `needle` in the message. */
static void refuse(const char *what, size_t len, void (*mutate)(uint8_t *), colibri_status want,
                   const char *needle) {
    uint8_t *buf = aligned_alloc(4096, (orig_len + 4095) / 4096 * 4096);
    memcpy(buf, orig, orig_len);
    if (mutate) mutate(buf);
    struct colibri_model m;
    char why[512] = "";
    colibri_status s = colibri_model_from_memory(&m, buf, len, why, sizeof why);
    EXPECT(s == want && strstr(why, needle) != NULL, "%s -> %d (%s): %s", what, (int)s,
           colibri_strerror(s), why);
    if (s == COLIBRI_OK) colibri_model_close(&m);
    free(buf);
}

static uint8_t *rec(uint8_t *b, int i) { return b + 256 + 64 * i; }
static void m_magic(uint8_t *b) { b[0] = 'X'; }
static void m_version(uint8_t *b) { put32(b + 8, 4); }
static void m_experts(uint8_t *b) { put32(b + 12, 100000); }
static void m_vocab0(uint8_t *b) { put32(b + 20, 0); }
static void m_heads(uint8_t *b) { put32(b + 40, 5); } /* 5 % 2 kv heads */
static void m_pad(uint8_t *b) { put32(b + 68, 32); put32(b + 64, 64); }
static void m_offset(uint8_t *b) { put64(rec(b, 1) + 24, 1ull << 62); }
static void m_offset_wrap(uint8_t *b) { put64(rec(b, 1) + 24, UINT64_MAX - 63); }
static void m_shape(uint8_t *b) { put32(rec(b, 1) + 16, 7); }
static void m_dup(uint8_t *b) { memcpy(rec(b, 2), rec(b, 1), 64); }
static void m_kind(uint8_t *b) { put32(rec(b, 3), 99); }
static void m_ntensors(uint8_t *b) { put32(b + 88, 5); }
static void m_flags(uint8_t *b) { put32(b + 72, 1u << 9); }
static void m_data_off(uint8_t *b) { put64(b + 96, 0); }
static void m_bos(uint8_t *b) { put32(b + 116, 0xFFFFFFFEu); }
static void m_eos(uint8_t *b) { memcpy(b + 120, b + 20, 4); } /* eos = vocab_size: one past */
static void m_bos_unknown(uint8_t *b) { put32(b + 116, 0xFFFFFFFFu); put32(b + 120, 0xFFFFFFFFu); }

static void test_loader(void) {
    refuse("valid model", orig_len, NULL, COLIBRI_OK, "");
    refuse("truncated to 100 bytes", 100, NULL, COLIBRI_E_TRUNCATED, "256-byte header");
    refuse("truncated by one byte", orig_len - 1, NULL, COLIBRI_E_TRUNCATED, "truncated");
    refuse("wrong magic", orig_len, m_magic, COLIBRI_E_BAD_MAGIC, "first 8 bytes");
    refuse("wrong version", orig_len, m_version, COLIBRI_E_BAD_VERSION, "version 4");
    refuse("absurd num_experts", orig_len, m_experts, COLIBRI_E_ABSURD_DIM, "num_experts");
    refuse("zero vocab", orig_len, m_vocab0, COLIBRI_E_ABSURD_DIM, "vocab_size");
    refuse("heads not a multiple of kv heads", orig_len, m_heads, COLIBRI_E_ABSURD_DIM, "n_kv_heads");
    refuse("pad mismatch", orig_len, m_pad, COLIBRI_E_PAD_MISMATCH, "invoke convert");
    refuse("tensor offset past the end", orig_len, m_offset, COLIBRI_E_OUT_OF_RANGE, "outside");
    refuse("tensor offset + size wraps", orig_len, m_offset_wrap, COLIBRI_E_OUT_OF_RANGE, "outside");
    refuse("tensor shape", orig_len, m_shape, COLIBRI_E_BAD_TENSOR, "shape");
    refuse("duplicate tensor", orig_len, m_dup, COLIBRI_E_BAD_TENSOR, "twice");
    refuse("unknown kind", orig_len, m_kind, COLIBRI_E_BAD_TENSOR, "unknown kind 99");
    refuse("missing tensors", orig_len, m_ntensors, COLIBRI_E_BAD_TENSOR, "missing");
    refuse("unknown flag", orig_len, m_flags, COLIBRI_E_UNSUPPORTED, "flags");
    refuse("data_offset 0", orig_len, m_data_off, COLIBRI_E_OUT_OF_RANGE, "data_offset");
    refuse("bos_token_id past the vocabulary", orig_len, m_bos, COLIBRI_E_ABSURD_DIM, "bos_token_id");
    refuse("eos_token_id == vocab_size", orig_len, m_eos, COLIBRI_E_ABSURD_DIM, "eos_token_id");
    refuse("bos/eos unknown (0xFFFFFFFF)", orig_len, m_bos_unknown, COLIBRI_OK, "");
}

/* Router logits with NaN (a corrupted or overflowing model): the first k of the bitonic top-k are
 * still experts < n, numbers first (larger first), then the NaN experts in index order. With a
 * plain `>` the network could leave a padding lane (index >= n) among them for k > 8. */
static void test_topk_nan(void) {
    float v[COLIBRI_MAX_EXPERTS], out[COLIBRI_MAX_EXPERTS];
    int32_t idx[COLIBRI_MAX_EXPERTS];
    for (int n = 2; n <= COLIBRI_MAX_EXPERTS; n++)
        for (int pattern = 0; pattern < 4; pattern++) {
            int nan_count = 0;
            for (int e = 0; e < n; e++) {
                int is_nan = pattern == 0 ? 1 : pattern == 1 ? e % 2 == 0 : pattern == 2 ? e % 3 != 1
                                                                                         : e >= n / 2;
                v[e] = is_nan ? NAN : (float)((e * 7) % 5) - 2.0f;
                nan_count += is_nan;
            }
            int k = n, bad = 0;
            colibri_topk_bitonic(v, n, k, idx, out);
            for (int i = 0; i < k; i++) {
                if (idx[i] < 0 || idx[i] >= n) bad = 1;
                else if (i >= k - nan_count && !isnan(v[idx[i]])) bad = 1; /* NaN last */
                else if (i > 0 && !bad && idx[i - 1] >= 0 && idx[i - 1] < n) {
                    float a = v[idx[i - 1]], b = v[idx[i]];
                    int ordered = isnan(a) ? (isnan(b) && idx[i - 1] < idx[i])
                                           : (isnan(b) || a > b || (a == b && idx[i - 1] < idx[i]));
                    if (!ordered) bad = 1;
                }
            }
            if (bad)
                EXPECT(0, "top-k with NaN: n=%d pattern %d gives an index out of 0..%d or out of order",
                       n, pattern, n - 1);
        }
    EXPECT(1, "top-k with NaN router logits: every k <= n selects experts < n in total order");
}

/* Format version 2: the selftest model (version 1) plus a metadata section of two blobs
 * ("a.x" = 5 bytes, "b" = 3 bytes) appended at `orig_len` (a multiple of 64). */
static size_t with_meta(uint8_t *buf) {
    size_t at = orig_len, sec = 64 * 2 + 64 + 64;
    memcpy(buf, orig, orig_len);
    memset(buf + at, 0, sec);
    put32(buf + 8, 2);
    put32(buf + 124, 2);
    put64(buf + 128, at);
    put64(buf + 136, sec);
    put64(buf + 104, at + sec);
    memcpy(buf + at, "a.x", 3);
    put64(buf + at + 48, 128);
    put64(buf + at + 56, 5);
    memcpy(buf + at + 64, "b", 1);
    put64(buf + at + 64 + 48, 192);
    put64(buf + at + 64 + 56, 3);
    memcpy(buf + at + 128, "hello", 5);
    memcpy(buf + at + 192, "abc", 3);
    return at + sec;
}

static void meta_case(const char *what, void (*mutate)(uint8_t *, size_t), colibri_status want,
                      const char *needle) {
    uint8_t *buf = aligned_alloc(4096, (orig_len + 256 + 4095) / 4096 * 4096);
    size_t len = with_meta(buf);
    if (mutate) mutate(buf, orig_len);
    struct colibri_model m;
    char why[512] = "";
    colibri_status s = colibri_model_from_memory(&m, buf, len, why, sizeof why);
    EXPECT(s == want && strstr(why, needle) != NULL, "metadata: %s -> %d: %s", what, (int)s, why);
    if (s == COLIBRI_OK) {
        const uint8_t *d = NULL;
        size_t n = 0;
        EXPECT(colibri_model_meta(&m, "a.x", &d, &n) == 1 && n == 5 && !memcmp(d, "hello", 5),
               "metadata: a.x found");
        EXPECT(colibri_model_meta(&m, "b", &d, &n) == 1 && n == 3 && !memcmp(d, "abc", 3),
               "metadata: b found");
        EXPECT(colibri_model_meta(&m, "a", &d, &n) == 0 && colibri_model_meta(&m, "c", &d, &n) == 0
                   && colibri_model_meta(&m, "", &d, &n) == 0,
               "metadata: absent names are not found");
        colibri_model_close(&m);
    }
    free(buf);
}

static void mm_name_order(uint8_t *b, size_t at) { b[at + 64] = 'a'; b[at + 65] = '.'; b[at + 66] = 'w'; }
static void mm_name_char(uint8_t *b, size_t at) { b[at + 1] = '/'; }
static void mm_name_pad(uint8_t *b, size_t at) { b[at + 40] = 'z'; }
static void mm_blob_past(uint8_t *b, size_t at) { put64(b + at + 64 + 56, 100); }
static void mm_blob_wrap(uint8_t *b, size_t at) { put64(b + at + 64 + 48, UINT64_MAX - 63); }
static void mm_blob_overlap(uint8_t *b, size_t at) { put64(b + at + 56, 70); }
static void mm_blob_table(uint8_t *b, size_t at) { put64(b + at + 48, 64); }
static void mm_count(uint8_t *b, size_t at) { put32(b + 124, 5); }
static void mm_offset(uint8_t *b, size_t at) { put64(b + 128, at - 64); }
static void mm_v1(uint8_t *b, size_t at) { put32(b + 8, 1); }
static void mm_tensor_in_meta(uint8_t *b, size_t at) { put64(rec(b, 1) + 24, at); }

static void test_meta(void) {
    meta_case("valid section", NULL, COLIBRI_OK, "");
    meta_case("names out of order", mm_name_order, COLIBRI_E_OUT_OF_RANGE, "sorted");
    meta_case("bad name character", mm_name_char, COLIBRI_E_OUT_OF_RANGE, "name");
    meta_case("garbage after the name", mm_name_pad, COLIBRI_E_OUT_OF_RANGE, "name");
    meta_case("blob past the section", mm_blob_past, COLIBRI_E_OUT_OF_RANGE, "outside");
    meta_case("blob offset wraps", mm_blob_wrap, COLIBRI_E_OUT_OF_RANGE, "outside");
    meta_case("blobs overlap", mm_blob_overlap, COLIBRI_E_OUT_OF_RANGE, "overlaps");
    meta_case("blob inside the entry table", mm_blob_table, COLIBRI_E_OUT_OF_RANGE, "entry 0");
    meta_case("meta_count too large", mm_count, COLIBRI_E_OUT_OF_RANGE, "meta_count");
    meta_case("section not at the file's end", mm_offset, COLIBRI_E_OUT_OF_RANGE, "metadata section");
    meta_case("tensor data inside the metadata section", mm_tensor_in_meta, COLIBRI_E_OUT_OF_RANGE,
              "outside the data section");
    struct colibri_model m;
    char why[256] = "";
    uint8_t *v1 = aligned_alloc(4096, (orig_len + 4095) / 4096 * 4096);
    memcpy(v1, orig, orig_len);
    EXPECT(colibri_model_from_memory(&m, v1, orig_len, why, sizeof why) == COLIBRI_OK &&
               m.version == 1 && colibri_model_meta(&m, "a.x", NULL, NULL) == 0,
           "version 1 file loads and has no metadata: %s", why);
    colibri_model_close(&m);
    /* a version-1 header's bytes 124..143 are reserved: a section there is not read */
    size_t len = with_meta(v1);
    mm_v1(v1, orig_len);
    put64(v1 + 104, orig_len);
    EXPECT(colibri_model_from_memory(&m, v1, orig_len, why, sizeof why) == COLIBRI_OK &&
               colibri_model_meta(&m, "a.x", NULL, NULL) == 0 && len > orig_len,
           "version 1 ignores the metadata fields: %s", why);
    colibri_model_close(&m);
    free(v1);
}

static void test_api(const char *path) {
    colibri_ctx *ctx = NULL;
    char err[512] = "";
    colibri_options o;
    colibri_default_options(&o);
    o.error = err;
    o.error_len = sizeof err;
    colibri_status s = colibri_init_ex(&ctx, "/nonexistent/model.colibri", &o);
    EXPECT(s == COLIBRI_E_IO && ctx == NULL && strstr(err, "cannot open"), "missing file: %s", err);
    o.backend = COLIBRI_BACKEND_CUDA;
    s = colibri_init_ex(&ctx, path, &o);
    EXPECT(s == COLIBRI_OK || (s == COLIBRI_E_BACKEND && strstr(err, "CUDA")),
           "--backend cuda without a GPU fails with a reason (or runs on a GPU): %s", err);
    colibri_free(ctx);
    ctx = NULL;
    o.backend = COLIBRI_BACKEND_CPU;
    o.kv_dtype = (colibri_kv_dtype)7;
    s = colibri_init_ex(&ctx, path, &o);
    EXPECT(s == COLIBRI_E_INVALID_ARG && ctx == NULL && strstr(err, "kv_dtype must be"),
           "unknown kv_dtype refused: %s", err);
    o.kv_dtype = COLIBRI_KV_F16;
    o.backend = COLIBRI_BACKEND_CUDA;
    s = colibri_init_ex(&ctx, path, &o);
    /* the CUDA backend stores an f16 cache too: it fails here only for want of a GPU */
    EXPECT(s == COLIBRI_OK || (s == COLIBRI_E_BACKEND && ctx == NULL && strstr(err, "CUDA") &&
                               !strstr(err, "f16")),
           "f16 KV cache with backend cuda: runs, or fails only for want of a GPU: %s", err);
    colibri_free(ctx);
    ctx = NULL;
    o.backend = COLIBRI_BACKEND_CPU;
    s = colibri_init_ex(&ctx, path, &o);
    if (s == COLIBRI_OK) {
        colibri_runtime_info fi;
        colibri_get_runtime_info(ctx, &fi);
        colibri_model_info fm;
        colibri_get_model_info(ctx, &fm);
        size_t kv16 = 2 * (size_t)fm.n_layers * fm.max_seq_len * fm.n_kv_heads * fm.head_dim * 2;
        EXPECT(!strcmp(fi.kv_dtype, "f16") && fi.kv_cache_bytes == kv16,
               "f16 KV cache: runtime info %s, %zu bytes (want %zu)", fi.kv_dtype, fi.kv_cache_bytes,
               kv16);
    } else {
        EXPECT(0, "f16 KV cache on the CPU: %s", err);
    }
    colibri_free(ctx);
    ctx = NULL;
    o.kv_dtype = COLIBRI_KV_F32;
    o.backend = COLIBRI_BACKEND_AUTO;
    o.threads = 2;
    s = colibri_init_ex(&ctx, path, &o);
    EXPECT(s == COLIBRI_OK, "init auto: %s", err);
    if (s) return;
    colibri_runtime_info ri;
    colibri_get_runtime_info(ctx, &ri);
    EXPECT(strcmp(ri.backend, "cuda") == 0 || ri.fallback_reason[0] != '\0',
           "auto backend reports why CUDA is not used: backend=%s reason=%s", ri.backend,
           ri.fallback_reason);
    colibri_model_info mi;
    colibri_get_model_info(ctx, &mi);
    float *logits = malloc((size_t)(mi.max_seq_len + 1) * mi.vocab_size * sizeof(float));
    int32_t ids[3] = {1, 2, (int32_t)mi.vocab_size};
    s = colibri_forward(ctx, ids, 3, logits);
    EXPECT(s == COLIBRI_E_TOKEN_RANGE && strstr(colibri_last_error(ctx), "index 2"),
           "token id == vocab: %s", colibri_last_error(ctx));
    ids[2] = -5;
    s = colibri_forward(ctx, ids, 3, logits);
    EXPECT(s == COLIBRI_E_TOKEN_RANGE, "negative token id: %s", colibri_last_error(ctx));
    colibri_get_runtime_info(ctx, &ri);
    EXPECT(ri.position == 0, "failed forward leaves the KV position unchanged (%d)", ri.position);
    s = colibri_forward(ctx, ids, 0, logits);
    EXPECT(s == COLIBRI_E_INVALID_ARG, "n = 0: %s", colibri_last_error(ctx));
    int32_t *many = calloc(mi.max_seq_len + 1, sizeof *many);
    s = colibri_forward(ctx, many, (int)mi.max_seq_len + 1, logits);
    EXPECT(s == COLIBRI_E_SEQ_TOO_LONG, "max_seq_len + 1 tokens: %s", colibri_last_error(ctx));
    s = colibri_forward(ctx, many, (int)mi.max_seq_len, logits);
    EXPECT(s == COLIBRI_OK, "exactly max_seq_len tokens run");
    s = colibri_forward(ctx, many, 1, logits);
    EXPECT(s == COLIBRI_E_SEQ_TOO_LONG, "one more token after a full cache: %s",
           colibri_last_error(ctx));
    colibri_reset(ctx);
    s = colibri_forward(ctx, many, 1, logits);
    EXPECT(s == COLIBRI_OK, "after reset the cache is free again");
    s = colibri_dump_routing(ctx, "/tmp/colibri-test-routing.jsonl");
#ifdef COLIBRI_DEBUG
    EXPECT(s == COLIBRI_OK, "routing dump (debug build)");
    unlink("/tmp/colibri-test-routing.jsonl");
#else
    EXPECT(s == COLIBRI_E_NOT_BUILT, "routing dump without COLIBRI_DEBUG: %s", colibri_last_error(ctx));
#endif
    EXPECT(colibri_forward(NULL, ids, 1, logits) == COLIBRI_E_INVALID_ARG, "NULL context");
    free(many);
    free(logits);
    colibri_free(ctx);
}

/* ---- kernels: every multi-token tile and multi-row stream gives the one-token bits --------- */

static uint32_t kseed = 12345;
static float krand(void) { /* uniform in [-1, 1) */
    kseed = kseed * 1664525u + 1013904223u;
    return (float)(kseed >> 8) / 8388608.0f - 1.0f;
}

/* Rows x cols weights of each dtype against N tokens, with row counts that leave remainders for
 * the 4-row tiles and streams and token counts that leave remainders for the 6-token tiles:
 * (a) all tokens at once (prefill), (b) one token at a time over all rows (decode streams),
 * (c) the rows split in two uneven ranges (another thread count) give identical bits, and the
 * values are within 1e-5 of a double-precision dot of the converted row. */
static void test_kernels(void) {
    const char *simd = colibri_kernels_init();
    enum { ROWS = 11, N = 14, MAXC = 1030 };
    static const size_t colsv[] = {1024, 203, 72, 1030};
    static float wf[ROWS * MAXC], x[N * MAXC], ya[N * ROWS], yb[N * ROWS], yc[N * ROWS];
    static float scratch[2 * MAXC], row[MAXC];
    static uint16_t wh[ROWS * MAXC], wb[ROWS * MAXC];
    static int8_t wq[ROWS * MAXC], xq[N * MAXC];
    float scales[ROWS], xs[N];
    for (size_t ci = 0; ci < sizeof colsv / sizeof colsv[0]; ci++) {
        size_t C = colsv[ci];
        for (size_t i = 0; i < ROWS * C; i++) {
            wf[i] = krand();
            uint32_t u;
            memcpy(&u, &wf[i], 4);
            wb[i] = (uint16_t)(u >> 16);                   /* bf16: truncated f32 */
            wh[i] = (uint16_t)(0x3800 | (u >> 13 & 0x3ff)); /* f16 in [0.5, 1) */
            wq[i] = (int8_t)(krand() * 127.0f);
        }
        for (int r = 0; r < ROWS; r++) scales[r] = 0.01f * (float)(r + 1);
        for (size_t i = 0; i < N * C; i++) x[i] = krand();
        const void *data[4] = {wf, wh, wb, wq};
        for (uint32_t dt = 0; dt < 4; dt++) {
            colibri_tensor t = {data[dt], dt == 3 ? scales : NULL, dt, ROWS, (uint32_t)C, NULL};
            colibri_rows_dot(&t, 0, ROWS, x, N, C, ya, ROWS, scratch);
            for (int j = 0; j < N; j++) colibri_rows_dot(&t, 0, ROWS, x + j * C, 1, C, yb + j * ROWS, 1, scratch);
            colibri_rows_dot(&t, 0, 5, x, N, C, yc, ROWS, scratch);
            colibri_rows_dot(&t, 5, ROWS, x, N, C, yc, ROWS, scratch);
            int same = 1, close = 1;
            for (int r = 0; r < ROWS; r++) {
                colibri_row_f32(&t, (uint32_t)r, row);
                for (int j = 0; j < N; j++) {
                    double ref = 0, mag = 0;
                    for (size_t c = 0; c < C; c++) {
                        ref += (double)row[c] * x[j * C + c];
                        mag += fabs((double)row[c] * x[j * C + c]);
                    }
                    float a = ya[j * ROWS + r];
                    close &= fabs(a - ref) <= 1e-5 * mag;
                    same &= !memcmp(&a, &yb[j * ROWS + r], 4) && !memcmp(&a, &yc[j * ROWS + r], 4);
                }
            }
            EXPECT(same && close, "kernels %s dtype %u cols %zu: %d tokens at once == one at a time"
                   " == rows split 5/6, within 1e-5 of double", simd, dt, C, N);
        }
        /* int8 x int8: exact integers whatever the tiling */
        for (int j = 0; j < N; j++) colibri_quantize_row(x + j * C, C, xq + j * C, &xs[j]);
        colibri_tensor t = {wq, scales, COLIBRI_DT_INT8, ROWS, (uint32_t)C, NULL};
        colibri_rows_dot_q8(&t, 0, ROWS, xq, xs, N, C, ya, ROWS);
        for (int j = 0; j < N; j++) colibri_rows_dot_q8(&t, 0, ROWS, xq + j * C, xs + j, 1, C, yb + j * ROWS, 1);
        int exact = 1;
        for (int r = 0; r < ROWS; r++)
            for (int j = 0; j < N; j++) {
                long acc = 0;
                for (size_t c = 0; c < C; c++) acc += (long)wq[r * C + c] * xq[j * C + c];
                float want = (float)acc * (scales[r] * xs[j]);
                exact &= ya[j * ROWS + r] == want && yb[j * ROWS + r] == want;
            }
        EXPECT(exact, "kernels %s int8 x int8 cols %zu: %d tokens at once and one at a time exact", simd,
               C, N);
    }
}

/* int8 x int8 shapes at the edges of the prefill paths (SMMLA on neon-i8mm: token pairs packed
 * on the stack in blocks that fit 128 KiB, else the SDOT tiles): odd token counts (a zero
 * partner token), rows split unevenly, rows with no full block of 16 (8, 15), a 1-column tail
 * (33), rows whose 13 tokens need two packed blocks (10100: 12 + 1) and rows too long to pack 6
 * tokens (22000). Every value must equal the exact integer sum times the same scale product. */
static void test_kernels_q8_shapes(void) {
    const char *simd = colibri_kernels_init();
    enum { ROWS = 11, N = 13, MAXC = 22000 };
    static const size_t colsv[] = {8, 15, 33, 10100, 22000};
    static int8_t wq[ROWS * MAXC], xq[N * MAXC];
    static float x[MAXC], ya[N * ROWS], yb[N * ROWS];
    float scales[ROWS], xs[N];
    for (int r = 0; r < ROWS; r++) scales[r] = 0.01f * (float)(r + 1);
    for (size_t ci = 0; ci < sizeof colsv / sizeof colsv[0]; ci++) {
        size_t C = colsv[ci];
        for (size_t i = 0; i < ROWS * C; i++) wq[i] = (int8_t)(krand() * 127.0f);
        for (int j = 0; j < N; j++) {
            for (size_t c = 0; c < C; c++) x[c] = krand();
            colibri_quantize_row(x, C, xq + j * C, &xs[j]);
        }
        colibri_tensor t = {wq, scales, COLIBRI_DT_INT8, ROWS, (uint32_t)C, NULL};
        int ok = 1;
        for (int n = 2; n <= N; n += N - 2) { /* 2 tokens (one pair), 13 (odd: a zero partner) */
            colibri_rows_dot_q8(&t, 0, 5, xq, xs, n, C, ya, ROWS);
            colibri_rows_dot_q8(&t, 5, ROWS, xq, xs, n, C, ya, ROWS);
            for (int j = 0; j < n; j++)
                colibri_rows_dot_q8(&t, 0, ROWS, xq + j * C, xs + j, 1, C, yb + j * ROWS, 1);
            for (int r = 0; r < ROWS; r++)
                for (int j = 0; j < n; j++) {
                    long acc = 0;
                    for (size_t c = 0; c < C; c++) acc += (long)wq[r * C + c] * xq[j * C + c];
                    float want = (float)acc * (scales[r] * xs[j]);
                    ok &= ya[j * ROWS + r] == want && yb[j * ROWS + r] == want;
                }
        }
        EXPECT(ok, "kernels %s int8 x int8 cols %zu: 2 and %d tokens, rows split 5/6, exact", simd, C,
               N);
    }
}

/* The family's int8 quantisation gives the scalar one's bytes and scale: random rows of every
 * length class (SIMD blocks, tails), ties at k + 0.5 (round to even), values past the clamp
 * after rounding, and an all-zero row. */
static void test_quantize_bits(void) {
    const char *simd = colibri_kernels_init();
    static const size_t lens[] = {1, 7, 8, 15, 16, 17, 33, 64, 2049};
    static float x[2049];
    static int8_t a[2049], b[2049];
    int ok = 1;
    for (size_t li = 0; li < sizeof lens / sizeof lens[0]; li++)
        for (int kind = 0; kind < 3; kind++) {
            size_t n = lens[li];
            for (size_t i = 0; i < n; i++)
                x[i] = kind == 0 ? krand() * 3.0f /* random */
                       : kind == 1 ? (float)((int)(i % 255) - 127) + (i % 2 ? 0.5f : -0.5f) /* ties */
                                   : 0.0f;
            if (kind == 1) x[n / 2] = 127.0f; /* max |x| = 127: scale 1, so x * inv = x */
            float sa = -1, sb = -2;
            colibri_quantize_row(x, n, a, &sa);
            colibri_quantize_row_scalar(x, n, b, &sb);
            ok &= memcmp(a, b, n) == 0 && memcmp(&sa, &sb, sizeof sa) == 0;
        }
    EXPECT(ok, "kernels %s int8 quantisation == scalar bytes and scale (9 lengths, ties, zeros)", simd);
}

/* Greedy sampling is the first index of the largest logit, as the plain loop
 * `if (l[i] > l[best]) best = i` gives it: ties, +0 / -0, NaNs (never chosen; a NaN at 0 is never
 * beaten), the maximum at the start, the end, in the tail past the last 8-lane block, and every
 * vocabulary size from 1 to 40. */
static uint32_t plain_argmax(const float *l, uint32_t V) {
    uint32_t best = 0;
    for (uint32_t i = 1; i < V; i++)
        if (l[i] > l[best]) best = i;
    return best;
}

static void test_greedy_argmax(void) {
    enum { MAXV = 40 };
    float l[MAXV], copy[MAXV];
    uint32_t seed = 12345u;
    int bad = 0, cases = 0;
    for (uint32_t V = 1; V <= MAXV; V++) {
        colibri_sampling p;
        colibri_default_sampling(&p);
        p.temperature = 0.0f;
        colibri_sampler *smp = NULL;
        if (colibri_sampler_new(&smp, V, &p) != COLIBRI_OK) {
            bad++;
            continue;
        }
        for (int pattern = 0; pattern < 64; pattern++) {
            for (uint32_t i = 0; i < V; i++) {
                seed = seed * 1664525u + 1013904223u;
                int r = (int)(seed >> 24) % 16;
                /* few distinct values, so ties are common; some zeros of both signs and NaNs */
                l[i] = r < 2 ? NAN : r < 4 ? 0.0f : r < 6 ? -0.0f : (float)(r % 5) - 2.0f;
            }
            if (pattern == 1) l[0] = NAN;
            if (pattern == 2) l[V - 1] = 9.0f;
            if (pattern == 3 && V > 1) l[V / 2] = l[V - 1] = 8.0f;
            if (pattern == 4)
                for (uint32_t i = 0; i < V; i++) l[i] = -INFINITY;
            memcpy(copy, l, sizeof l);
            uint32_t want = plain_argmax(l, V);
            int32_t got = colibri_sampler_sample(smp, copy, NULL, 0);
            bad += got != (int32_t)want;
            cases++;
        }
        colibri_sampler_free(smp);
    }
    EXPECT(bad == 0, "greedy sampling: %d of %d cases differ from the first-maximum loop", bad, cases);
}

/* Attention scores of a GQA group's queries against a block of keys (colibri_att_scores, the
 * x86 kernel reduces four rows' lanes together): each (query, row) has the bits of the one-row
 * dot, for f32 and f16 rows, head sizes with and without 16- and 8-lane tails, row counts that
 * are not multiples of four, 1..8 queries. */
static void test_att_scores(void) {
    enum { MAXN = 130, MAXR = 13, MAXX = 8 };
    static float x[MAXX * MAXN], kf[MAXR * MAXN], got[MAXX * MAXR], want;
    static uint16_t kh[MAXR * MAXN];
    colibri_kernels_init();
    uint32_t seed = 777u;
    for (int i = 0; i < MAXR * MAXN; i++) {
        seed = seed * 1664525u + 1013904223u;
        kf[i] = (float)((int)(seed >> 9) % 20001 - 10000) * 1e-4f;
        kh[i] = (uint16_t)(0x3000u + (seed >> 20) % 0x1800u) | (uint16_t)((seed & 1u) << 15);
    }
    for (int i = 0; i < MAXX * MAXN; i++) {
        seed = seed * 1664525u + 1013904223u;
        x[i] = (float)((int)(seed >> 9) % 20001 - 10000) * 3e-4f;
    }
    const size_t sizes[] = {3, 8, 16, 24, 64, 70, 128, 130};
    int bad = 0, cases = 0;
    for (int f16 = 0; f16 < 2; f16++)
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (int nr = 1; nr <= MAXR; nr++)
                for (int nx = 1; nx <= MAXX; nx++) {
                    size_t n = sizes[si];
                    const void *rows[MAXR];
                    for (int r = 0; r < nr; r++)
                        rows[r] = f16 ? (const void *)(kh + (size_t)r * MAXN) : (const void *)(kf + (size_t)r * MAXN);
                    memset(got, 0xff, sizeof got);
                    colibri_att_scores(x, MAXN, nx, rows, nr, n, f16, got, MAXR);
                    for (int h = 0; h < nx; h++)
                        for (int r = 0; r < nr; r++) {
                            colibri_dot_rows(x + (size_t)h * MAXN, &rows[r], 1, n, f16, &want);
                            bad += memcmp(&want, &got[h * MAXR + r], sizeof want) != 0;
                            cases++;
                        }
                }
    EXPECT(bad == 0, "attention scores: %d of %d (query, row) pairs differ from the one-row dot", bad, cases);
}

/* Attention's softmax exponent (colibri_exp_sum): the family's vector version has the scalar's
 * bits, values and sum, for every length 0..40 and 544 over random inputs with NaN, +-inf, +-0
 * and the range edges; and a sweep of every 61st float in [-87, 0] (the softmax's inputs) is
 * within 2 ulp of e^x in double. */
static void test_exp_sum(void) {
    colibri_kernels_init();
    enum { MAXN = 544 };
    static float a[MAXN], b[MAXN];
    const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -87.0f, -87.0001f, 88.0f,
                             88.0001f, -1e-30f, 1e-30f, -103.0f, -0.3465736f, 0.3465736f};
    uint32_t seed = 4242u;
    int bad = 0, cases = 0;
    for (int n = 0; n <= MAXN; n = n < 40 ? n + 1 : MAXN + (n == MAXN)) {
        for (int i = 0; i < n; i++) {
            seed = seed * 1664525u + 1013904223u;
            a[i] = (seed >> 28) == 0 ? special[(seed >> 8) % (sizeof special / sizeof special[0])]
                                     : (float)((int)(seed >> 8) % 1900001 - 1000000) * 1e-4f;
        }
        float sub = n % 3 ? 0.0f : 1.5f;
        memcpy(b, a, sizeof a);
        float s1 = colibri_exp_sum(a, (size_t)n, sub), s2 = colibri_exp_sum_scalar(b, (size_t)n, sub);
        bad += memcmp(a, b, (size_t)n * sizeof(float)) != 0 || memcmp(&s1, &s2, sizeof s1) != 0;
        cases++;
        if (n == MAXN) break;
    }
    double worst = 0.0;
    float block[64];
    uint32_t lo = 0x80000000u, hi = 0xc2ae0000u; /* -0 .. -87 */
    for (uint32_t u = lo; u <= hi; u += 61 * 64) {
        int m = 0;
        for (; m < 64 && u + (uint32_t)m * 61u <= hi; m++) {
            uint32_t v = u + (uint32_t)m * 61u;
            memcpy(&block[m], &v, sizeof v);
        }
        float in[64];
        memcpy(in, block, sizeof in);
        colibri_exp_sum(block, (size_t)m, 0.0f);
        for (int i = 0; i < m; i++) {
            double want = exp((double)in[i]);
            double ulp = ldexp(1.0, ilogb(want) - 23);
            double err = fabs((double)block[i] - want) / ulp;
            worst = err > worst ? err : worst;
        }
    }
    EXPECT(bad == 0 && worst <= 2.0,
           "softmax exponent: vector == scalar bits in %d of %d lengths; worst error %.2f ulp over [-87, 0]",
           cases - bad, cases, worst);
}

int main(void) {
    char path[256];
    snprintf(path, sizeof path, "/tmp/colibri-unit-%ld.colibri", (long)getpid());
    if (colibri_selftest_write_model(path, 0, COLIBRI_EMBED_DIM_PAD)) return 2;
    FILE *f = fopen(path, "rb");
    fseek(f, 0, SEEK_END);
    orig_len = (size_t)ftell(f);
    fseek(f, 0, SEEK_SET);
    orig = malloc(orig_len);
    if (fread(orig, 1, orig_len, f) != orig_len) return 2;
    fclose(f);
    test_loader();
    test_meta();
    test_topk_nan();
    test_greedy_argmax();
    test_att_scores();
    test_exp_sum();
    test_api(path);
    test_kernels();
    test_kernels_q8_shapes();
    test_quantize_bits();
    int st = colibri_selftest(0);
    EXPECT(st == 0, "selftest (%d failed)", st);
    unlink(path);
    free(orig);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "passed", failures);
    return failures ? 1 : 0;
}
