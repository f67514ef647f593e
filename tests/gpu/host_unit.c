/* CPU-side unit tests of the CUDA backend's host code (runtime/src/cuda/cuda_backend.c), built and run
 * by tests/test_cuda_host.py with the host C compiler. No GPU is needed:
 *   host_unit pick          image selection (cubin for the exact SM, else PTX, else a reason)
 *   host_unit launch        launch geometry of the row kernels
 *   host_unit plan          device arena layout (alignment, no overlap, chunk bound)
 *   host_unit rope T D P    the RoPE table (colibri_cuda_rope_table) for theta T, head dim D,
 *                           P positions: one line per (position, pair), "cos sin" as f32 bits
 *   host_unit open S N [DT] [STEPS] [KV16]  colibri_cuda_open with S streams on a small
 *                           in-memory model (weight dtype DT; an f16 KV cache when KV16 is 1),
 *                           then a forward of N tokens and STEPS one-token decode steps after
 *                           them; prints the reason and exits 3 when open fails.
 *                           With the real libcuda absent this is the no-driver path; with
 *                           COLIBRI_LIBCUDA pointing at tests/gpu/stub_libcuda.c's library it
 *                           records the launch sequence (see that file).
 *   host_unit shared N      one device (colibri_cuda_device_open), two contexts on it, a
 *                           forward of N tokens on each, then one closed while the other runs
 * Each check that fails prints "FAIL <what>" and the program exits 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_backend.h"
#include "core/model.h"

static int failures;
#define CHECK(cond, ...)                                                                          \
    do {                                                                                          \
        if (!(cond)) {                                                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                           \
            printf(__VA_ARGS__);                                                                  \
            printf("\n");                                                                         \
            failures++;                                                                           \
        }                                                                                         \
    } while (0)

/* The table the backend loads from; the bytes are never run here. */
static const unsigned char fake_cubin[64] = {0x7f, 'E', 'L', 'F'};
static const unsigned char fake_ptx[] = ".version 7.8\n.target sm_72\n";
const colibri_kernel_image colibri_kernel_images[3] = {
    {"cubin", 87, fake_cubin, sizeof fake_cubin},
    {"cubin", 72, fake_cubin, sizeof fake_cubin},
    {"ptx", 72, fake_ptx, sizeof fake_ptx},
};
const int colibri_kernel_image_count = 3;

static int test_pick(void) {
    char why[256];
    const colibri_kernel_image *t = colibri_kernel_images;
    CHECK(colibri_cuda_pick_image(t, 3, 87, why, sizeof why) == 0, "sm_87 -> cubin 87");
    CHECK(colibri_cuda_pick_image(t, 3, 72, why, sizeof why) == 1, "sm_72 -> cubin 72");
    CHECK(colibri_cuda_pick_image(t, 3, 90, why, sizeof why) == 2, "sm_90 -> ptx 72 (JIT)");
    CHECK(colibri_cuda_pick_image(t, 3, 86, why, sizeof why) == 2, "sm_86 -> ptx, not cubin 87");
    why[0] = '\0';
    CHECK(colibri_cuda_pick_image(t, 3, 61, why, sizeof why) == -1, "sm_61 -> none");
    CHECK(strstr(why, "sm_61") && strstr(why, "cubin sm_87") && strstr(why, "ptx compute_72"),
          "reason names the GPU and the images: %s", why);
    printf("reason: %s\n", why);
    /* two PTX: the highest one the device can JIT */
    const colibri_kernel_image two[2] = {{"ptx", 72, fake_ptx, 1}, {"ptx", 87, fake_ptx, 1}};
    CHECK(colibri_cuda_pick_image(two, 2, 90, why, sizeof why) == 1, "ptx 87 over ptx 72");
    CHECK(colibri_cuda_pick_image(two, 2, 80, why, sizeof why) == 0, "sm_80 -> ptx 72");
    CHECK(colibri_cuda_pick_image(two, 0, 80, why, sizeof why) == -1, "empty table -> none");
    CHECK(strstr(why, "no CUDA kernels in this binary") != NULL, "empty-table reason: %s", why);
    /* a cubin never serves another SM, even a newer one of the same major */
    const colibri_kernel_image cub[1] = {{"cubin", 80, fake_cubin, 1}};
    CHECK(colibri_cuda_pick_image(cub, 1, 86, why, sizeof why) == -1, "cubin 80 !-> sm_86");
    return 0;
}

static int test_launch(void) {
    unsigned g[3], b[3];
    colibri_cuda_rows_launch(1, 1, g, b);
    CHECK(g[0] == 1 && g[1] == 1 && g[2] == 1 && b[0] == 128, "1x1 -> %u %u / %u", g[0], g[1], b[0]);
    colibri_cuda_rows_launch(4, 4, g, b);
    CHECK(g[0] == 1 && g[1] == 1, "4x4 -> %u %u", g[0], g[1]);
    colibri_cuda_rows_launch(5, 5, g, b);
    CHECK(g[0] == 2 && g[1] == 2, "5x5 -> %u %u", g[0], g[1]);
    colibri_cuda_rows_launch(151936, 32, g, b);
    CHECK(g[0] == 37984 && g[1] == 8, "vocab rows -> %u %u", g[0], g[1]);
    /* every (row, token) pair is covered exactly once: warps*grid >= rows, and no more than a tile */
    for (int rows = 1; rows < 300; rows += 7)
        for (int n = 1; n < 40; n += 3) {
            colibri_cuda_rows_launch(rows, n, g, b);
            CHECK(g[0] * (b[0] / 32) >= (unsigned)rows && (g[0] - 1) * (b[0] / 32) < (unsigned)rows,
                  "rows %d", rows);
            CHECK(g[1] * 4 >= (unsigned)n && (g[1] - 1) * 4 < (unsigned)n, "n %d", n);
        }
    CHECK(colibri_cuda_ceil_div(0, 4) == 0 && colibri_cuda_ceil_div(9, 4) == 3, "ceil_div");
    /* tensor-core expert kernels: only with them in the image, past one 4-token GEMV tile
     * (decode keeps the GEMV), and not for q4 */
    CHECK(colibri_cuda_use_mma(1, 5, COLIBRI_DT_F16) && colibri_cuda_use_mma(1, 32, COLIBRI_DT_F32),
          "mma for prefill");
    CHECK(colibri_cuda_use_mma(1, 32, COLIBRI_DT_BF16), "mma for bf16");
    CHECK(colibri_cuda_use_mma(1, 9, COLIBRI_DT_INT8), "mma for int8");
    CHECK(!colibri_cuda_use_mma(1, 1, COLIBRI_DT_F16), "GEMV for decode");
    CHECK(!colibri_cuda_use_mma(1, 4, COLIBRI_DT_F16), "GEMV for <= 4 tokens");
    CHECK(!colibri_cuda_use_mma(0, 32, COLIBRI_DT_F16), "no mma kernels in the image");
    CHECK(!colibri_cuda_use_mma(1, 32, COLIBRI_DT_Q4), "q4 stays SIMT");
    return 0;
}

/* ---- a small in-memory model ------------------------------------------------------------------ */

typedef struct {
    struct colibri_model m;
    colibri_layer layers[2];
    colibri_tensor experts[2 * 3 * 8];
    unsigned char *buf;
    size_t used;
} fake_model;

static void tensor(fake_model *f, colibri_tensor *t, uint32_t dtype, uint32_t rows, uint32_t cols) {
    static const size_t esize[4] = {4, 2, 2, 1};
    f->used = (f->used + 63) / 64 * 64;
    t->data = f->buf + f->used;
    t->dtype = dtype;
    t->rows = rows;
    t->cols = cols;
    f->used += (size_t)rows * cols * esize[dtype];
    t->scales = NULL;
    if (dtype == COLIBRI_DT_INT8) {
        f->used = (f->used + 63) / 64 * 64;
        t->scales = (const float *)(f->buf + f->used);
        f->used += (size_t)rows * 4;
    }
}

static void fake_model_init(fake_model *f, uint32_t dtype) {
    memset(f, 0, sizeof *f);
    struct colibri_model *m = &f->m;
    m->num_experts = 8; m->top_k = 2; m->expert_size = 20; m->vocab_size = 50;
    m->max_seq_len = 64; m->embed_dim = 24; m->embed_dim_pad = 32; m->pad_multiple = 32;
    m->n_layers = 2; m->n_heads = 4; m->n_kv_heads = 2; m->head_dim = 8;
    m->shared_expert_size = 12; m->norm_eps = 1e-6f; m->rope_theta = 10000.0f;
    m->routing = COLIBRI_WEIGHTS_RENORM; m->dtype = dtype;
    m->flags = COLIBRI_FLAG_SHARED_EXPERT | COLIBRI_FLAG_SHARED_EXPERT_GATE |
               COLIBRI_FLAG_QK_NORM_HEAD | COLIBRI_FLAG_QKV_BIAS | COLIBRI_FLAG_TIED_EMBEDDINGS;
    const size_t cap = 1u << 20;
    f->buf = aligned_alloc(4096, cap);
    memset(f->buf, 0, cap);
    m->base = f->buf;
    m->data_offset = 4096;
    m->mapped = 1;
    f->used = 4096;
    const uint32_t Dp = 32, HD = 32, kvd = 16, E = 8;
    tensor(f, &m->tok_embed, dtype, 50, Dp);
    tensor(f, &m->output_norm, 0, 1, Dp);
    m->lm_head = m->tok_embed;
    m->layers = f->layers;
    for (int l = 0; l < 2; l++) {
        colibri_layer *ly = &f->layers[l];
        ly->desc.mixer = COLIBRI_MIXER_ATTENTION; /* what the loader reads from a layer table */
        ly->desc.ffn = COLIBRI_FFN_MOE;
        tensor(f, &ly->attn_norm, 0, 1, Dp);
        tensor(f, &ly->wq, dtype, HD, Dp);
        tensor(f, &ly->wk, dtype, kvd, Dp);
        tensor(f, &ly->wv, dtype, kvd, Dp);
        tensor(f, &ly->wo, dtype, Dp, HD);
        tensor(f, &ly->bq, 0, 1, HD);
        tensor(f, &ly->bk, 0, 1, kvd);
        tensor(f, &ly->bv, 0, 1, kvd);
        tensor(f, &ly->q_norm, 0, 1, 8);
        tensor(f, &ly->k_norm, 0, 1, 8);
        tensor(f, &ly->ffn_norm, 0, 1, Dp);
        tensor(f, &ly->router, 0, E, Dp);
        ly->w1 = &f->experts[(l * 3 + 0) * 8];
        ly->w3 = &f->experts[(l * 3 + 1) * 8];
        ly->w2 = &f->experts[(l * 3 + 2) * 8];
        for (uint32_t e = 0; e < E; e++) {
            tensor(f, &ly->w1[e], dtype, 20, Dp);
            tensor(f, &ly->w3[e], dtype, 20, Dp);
            tensor(f, &ly->w2[e], dtype, Dp, 20);
        }
        tensor(f, &ly->shared_w1, dtype, 12, Dp);
        tensor(f, &ly->shared_w3, dtype, 12, Dp);
        tensor(f, &ly->shared_w2, dtype, Dp, 12);
        tensor(f, &ly->shared_gate, 0, 1, Dp);
    }
    m->file_size = (f->used + 4095) / 4096 * 4096;
    m->size = m->file_size;
}

static int test_plan(void) {
    fake_model f;
    fake_model_init(&f, COLIBRI_DT_F16);
    colibri_cuda_plan_t p;
    CHECK(colibri_cuda_plan(&f.m, 0, &p) == 0, "plan ok");
    /* a 64-position cache: one pass covers it (the activation budget allows 256 tokens), and
     * the logits come down 32 rows at a time */
    CHECK(p.chunk == 64 && p.logit_rows == 32, "chunk %d, logit rows %d", p.chunk, p.logit_rows);
    const size_t c = 64;
    /* the buffers in layout order: each aligned, each at or after the end of the previous one */
    const size_t at[] = {p.x, p.h, p.q, p.qkv, p.att, p.part, p.router, p.top_idx, p.top_w, p.offsets,
                         p.active, p.perm, p.slot_of, p.act, p.expert_out, p.shared_act,
                         p.shared_out, p.shared_gate, p.shared_offsets, p.logits, p.ids, p.iota,
                         p.prm, p.rope, p.kcache,
                         p.vcache, p.tables};
    /* qkv staging: c tokens x (H*Dh 32 + 2 x Hkv*Dh 16) floats; partials: decode's 1 token (the
     * tiled prefill kernel keeps none) x 4 heads x 1 KV range (64 positions) x (Dh 8 + 2) */
    const size_t need[] = {c * 32 * 4, c * 32 * 4, c * 32 * 4, c * 64 * 4, c * 32 * 4,
                           1 * 4 * 1 * 10 * 4,
                           c * 8 * 4, c * 2 * 4, c * 2 * 4, 9 * 4, 8 * 4, c * 2 * 4, c * 2 * 4,
                           c * 2 * 20 * 4, c * 2 * 32 * 4, c * 12 * 4, c * 32 * 4, c * 4, 8,
                           32 * 50 * 4, c * 4, c * 4, 256, 64 * 8 * 4, 2 * 64 * 16 * 4, 2 * 64 * 16 * 4,
                           2 * (6 * 8 + 6) * 8};
    const int nb = (int)(sizeof at / sizeof at[0]);
    for (int i = 0; i < nb; i++) {
        CHECK(at[i] % 256 == 0, "buffer %d aligned", i);
        if (i + 1 < nb) CHECK(at[i] + need[i] <= at[i + 1], "buffer %d fits before %d", i, i + 1);
    }
    /* the weights are the model's device's, never in a context's arena */
    CHECK(at[nb - 1] + need[nb - 1] <= p.total &&
              p.total < at[nb - 1] + need[nb - 1] + 256,
          "total ends at the tables (no weights in the arena)");
    CHECK(p.kv_f16 == 0 && p.kv_bytes == 2 * 2 * 64 * 16 * 4, "f32 cache bytes %zu", p.kv_bytes);
    /* f16 KV cache: half the bytes per cached value, the rest of the plan unchanged */
    colibri_cuda_plan_t ph;
    CHECK(colibri_cuda_plan(&f.m, 1, &ph) == 0 && ph.kv_f16 == 1 &&
              ph.kv_bytes * 2 == p.kv_bytes && ph.vcache - ph.kcache == 2 * 64 * 16 * 2 &&
              ph.kcache == p.kcache && p.total - ph.total == p.kv_bytes / 2,
          "f16 cache: %zu bytes, total %zu vs %zu", ph.kv_bytes, ph.total, p.total);
    /* long context, many heads, Dh 128: the tiled prefill keeps no partials, decode's one token's
     * (32 heads x 128 KV ranges x 130 floats) fit 64 MiB; this small model's per-token buffers fit
     * the activation budget at the 256-token maximum */
    f.m.max_seq_len = 32768; f.m.n_heads = 32; f.m.n_kv_heads = 8; f.m.head_dim = 128;
    CHECK(colibri_cuda_plan(&f.m, 0, &p) == 0, "long plan");
    CHECK(p.chunk == 256 && p.router - p.part >= (size_t)32 * 128 * 130 * 4 &&
              p.router - p.part < (size_t)2 * 32 * 128 * 130 * 4,
          "chunk %d, partials %zu bytes", p.chunk, p.router - p.part);
    /* heads wider than the tiled kernel's 128: prefill runs split-KV, the partials are per chunk
     * token (chunk x H x 128 ranges x (Dh + 2) floats) and the chunk shrinks to fit 64 MiB */
    f.m.head_dim = 256;
    CHECK(colibri_cuda_plan(&f.m, 0, &p) == 0, "wide-head plan");
    CHECK(p.chunk == 8 && (size_t)p.chunk * 32 * 128 * 258 * 4 <= (64u << 20) &&
              (size_t)(2 * p.chunk) * 32 * 128 * 258 * 4 > (64u << 20),
          "chunk %d", p.chunk);
    /* a wide model's per-token buffers (Dp 7168, 8 of 64 experts of 2048, 64 heads of 128) pass
     * the 32 MiB budget at 256 and 128 tokens: 64 */
    {
        colibri_model wide = f.m;
        wide.head_dim = 128; wide.n_heads = 64; wide.n_kv_heads = 8; wide.embed_dim_pad = 7168;
        wide.num_experts = 64; wide.top_k = 8; wide.expert_size = 2048;
        CHECK(colibri_cuda_plan(&wide, 0, &p) == 0 && p.chunk == 64, "wide model chunk %d",
              p.chunk);
    }
    f.m.head_dim = 8;
    f.m.max_seq_len = 8; f.m.n_heads = 4; f.m.n_kv_heads = 2;
    CHECK(colibri_cuda_plan(&f.m, 0, &p) == 0 && p.chunk == 8, "short cache chunk %d", p.chunk);
    f.m.top_k = 17;
    CHECK(colibri_cuda_plan(&f.m, 0, &p) == -1, "top_k 17 refused");
    f.m.top_k = 2; f.m.n_kv_heads = 3;
    CHECK(colibri_cuda_plan(&f.m, 0, &p) == -1, "H %% Hkv != 0 refused");
    free(f.buf);
    return 0;
}

static int run_open(int streams, int n, uint32_t dtype, int steps, int kv_f16) {
    fake_model f;
    fake_model_init(&f, dtype);
    colibri_cuda *cu = NULL;
    char why[256] = "";
    if (colibri_cuda_open(&cu, &f.m, streams, kv_f16, why, sizeof why) != 0) {
        CHECK(cu == NULL && why[0], "failed open leaves nothing and says why");
        printf("why: %s\n", why);
        free(f.buf);
        return failures ? 1 : 3;
    }
    colibri_cuda_info info;
    colibri_cuda_get_info(cu, &info);
    printf("info: device=%s sm=%d driver=%d image=%s integrated=%d weights=%s bytes=%zu "
           "kv=%s kv_bytes=%zu\n",
           info.device_name, info.sm, info.driver_version, info.image, info.integrated,
           info.weights, info.device_bytes, info.kv_f16 ? "f16" : "f32", info.kv_cache_bytes);
    int32_t ids[80];
    for (int i = 0; i < 80; i++) ids[i] = (i * 7) % 50;
    float *logits = calloc((size_t)n * 50, sizeof *logits);
    int rc = colibri_cuda_forward(cu, ids, n, 0, logits, why, sizeof why);
    CHECK(rc == 0, "forward: %s", why);
    for (int i = 0; i < steps && rc == 0; i++) {
        rc = colibri_cuda_forward(cu, &ids[i % 80], 1, n + i, logits, why, sizeof why);
        CHECK(rc == 0, "decode step %d: %s", i, why);
    }
    ids[0] = 50;
    rc = colibri_cuda_forward(cu, ids, 1, 0, logits, why, sizeof why);
    CHECK(rc != 0 && strstr(why, "token id 50 out of range"), "bad id refused: %s", why);
    ids[0] = 1;
    rc = colibri_cuda_forward(cu, ids, 2, 63, logits, why, sizeof why);
    CHECK(rc != 0 && strstr(why, "outside the KV cache"), "past the cache refused: %s", why);
    free(logits);
    colibri_cuda_close(cu);
    free(f.buf);
    return failures ? 1 : 0;
}

/* Two contexts on one device (what colibri_ctx_new does for the contexts of a shared model, e.g.
 * serve's slots): the weights go to the device once, each context has its own arena; closing one
 * leaves the other working; the device is closed last. The launch log shows the rest. */
static int run_shared(int n) {
    fake_model f;
    fake_model_init(&f, COLIBRI_DT_F16);
    colibri_cuda_device *dv = NULL;
    colibri_cuda *a = NULL, *b = NULL;
    char why[256] = "";
    if (colibri_cuda_device_open(&dv, &f.m, why, sizeof why) != 0) {
        CHECK(dv == NULL && why[0], "failed device open leaves nothing and says why");
        printf("why: %s\n", why);
        free(f.buf);
        return failures ? 1 : 3;
    }
    CHECK(colibri_cuda_open_on(&a, dv, 1, 0, why, sizeof why) == 0, "context a: %s", why);
    CHECK(colibri_cuda_open_on(&b, dv, 2, 0, why, sizeof why) == 0, "context b: %s", why);
    if (!a || !b) {
        colibri_cuda_close(a);
        colibri_cuda_close(b);
        colibri_cuda_device_close(dv);
        free(f.buf);
        return 1;
    }
    colibri_cuda_info ia, ib;
    colibri_cuda_get_info(a, &ia);
    colibri_cuda_get_info(b, &ib);
    printf("info: weights=%s bytes=%zu %zu\n", ia.weights, ia.device_bytes, ib.device_bytes);
    CHECK(strcmp(ia.weights, colibri_cuda_device_info(dv)->weights) == 0, "weights mode shared");
    int32_t ids[32];
    for (int i = 0; i < 32; i++) ids[i] = (i * 7) % 50;
    float *la = calloc((size_t)n * 50, sizeof *la), *lb = calloc((size_t)n * 50, sizeof *lb);
    CHECK(colibri_cuda_forward(a, ids, n, 0, la, why, sizeof why) == 0, "forward a: %s", why);
    CHECK(colibri_cuda_forward(b, ids, n, 0, lb, why, sizeof why) == 0, "forward b: %s", why);
    colibri_cuda_close(a);
    /* b still runs after a is gone: a released only what was its own */
    CHECK(colibri_cuda_forward(b, ids, 1, n, lb, why, sizeof why) == 0, "b after a: %s", why);
    colibri_cuda_close(b);
    colibri_cuda_device_close(dv);
    free(la);
    free(lb);
    free(f.buf);
    return failures ? 1 : 0;
}

static int print_rope(float theta, int Dh, int positions) {
    float *cs = malloc((size_t)positions * (size_t)Dh * sizeof *cs + 1);
    if (!cs) return 1;
    colibri_cuda_rope_table(theta, Dh, positions, cs);
    for (int i = 0; i < positions * (Dh / 2); i++) {
        uint32_t c, s;
        memcpy(&c, &cs[2 * i], 4);
        memcpy(&s, &cs[2 * i + 1], 4);
        printf("%08x %08x\n", c, s);
    }
    free(cs);
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: host_unit pick|launch|plan|rope T D P|open STREAMS N [DTYPE] [STEPS] [KV16]|shared N\n");
        return 2;
    }
    if (strcmp(argv[1], "pick") == 0) test_pick();
    else if (strcmp(argv[1], "launch") == 0) test_launch();
    else if (strcmp(argv[1], "plan") == 0) test_plan();
    else if (strcmp(argv[1], "rope") == 0 && argc == 5)
        return print_rope((float)atof(argv[2]), atoi(argv[3]), atoi(argv[4]));
    else if (strcmp(argv[1], "shared") == 0 && argc == 3)
        return run_shared(atoi(argv[2]));
    else if (strcmp(argv[1], "open") == 0 && argc >= 4)
        return run_open(atoi(argv[2]), atoi(argv[3]), argc > 4 ? (uint32_t)atoi(argv[4]) : 1,
                        argc > 5 ? atoi(argv[5]) : 0, argc > 6 ? atoi(argv[6]) : 0);
    else {
        fprintf(stderr, "unknown test %s\n", argv[1]);
        return 2;
    }
    if (failures) return 1;
    printf("ok\n");
    return 0;
}
