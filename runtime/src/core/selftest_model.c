/* Writer of the selftest's synthetic model (see selftest_model.h), following docs/format.md. */
#include "selftest_model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri_config.h"
#include "le_write.h"
#include "model.h"

typedef struct {
    uint32_t kind, layer, expert, rows, cols, dtype;
    uint64_t off, nbytes, soff;
} spec;

int colibri_selftest_write_model(const char *path, uint32_t dtype, uint32_t pad) {
    enum { D = 40, E = 4, L = 2, H = 4, HKV = 2, DH = 8, F = 24, FS = 16, S = 32 };
    const uint32_t V = COLIBRI_SELFTEST_VOCAB, DP = (D + pad - 1) / pad * pad;
    const uint32_t K = COLIBRI_TOP_K < 2 ? COLIBRI_TOP_K : 2;
    const uint32_t NE = COLIBRI_MAX_EXPERTS < E ? COLIBRI_MAX_EXPERTS : E;
    const uint32_t flags = COLIBRI_FLAG_SHARED_EXPERT | COLIBRI_FLAG_SHARED_EXPERT_GATE |
                           COLIBRI_FLAG_QK_NORM_HEAD | COLIBRI_FLAG_QKV_BIAS;
    spec sp[3 + L * (16 + 3 * E)];
    int n = 0;
#define ADD(k, l, e, r, c, big)                                                              \
    sp[n++] = (spec){(k), (l), (e), (r), (c), (big) ? dtype : COLIBRI_DT_F32, 0, 0, 0}
    const uint32_t G = COLIBRI_NO_INDEX;
    for (uint32_t l = 0; l < L; l++) {
        ADD(COLIBRI_K_ATTN_NORM, l, G, 1, DP, 0);
        ADD(COLIBRI_K_WQ, l, G, H * DH, DP, 1);
        ADD(COLIBRI_K_WK, l, G, HKV * DH, DP, 1);
        ADD(COLIBRI_K_WV, l, G, HKV * DH, DP, 1);
        ADD(COLIBRI_K_WO, l, G, DP, H * DH, 1);
        ADD(COLIBRI_K_BQ, l, G, 1, H * DH, 0);
        ADD(COLIBRI_K_BK, l, G, 1, HKV * DH, 0);
        ADD(COLIBRI_K_BV, l, G, 1, HKV * DH, 0);
        ADD(COLIBRI_K_Q_NORM, l, G, 1, DH, 0);
        ADD(COLIBRI_K_K_NORM, l, G, 1, DH, 0);
        ADD(COLIBRI_K_FFN_NORM, l, G, 1, DP, 0);
        ADD(COLIBRI_K_ROUTER, l, G, NE, DP, 0);
        for (uint32_t e = 0; e < NE; e++) ADD(COLIBRI_K_EXPERT_W1, l, e, F, DP, 1);
        for (uint32_t e = 0; e < NE; e++) ADD(COLIBRI_K_EXPERT_W3, l, e, F, DP, 1);
        for (uint32_t e = 0; e < NE; e++) ADD(COLIBRI_K_EXPERT_W2, l, e, DP, F, 1);
        ADD(COLIBRI_K_SHARED_W1, l, G, FS, DP, 1);
        ADD(COLIBRI_K_SHARED_W3, l, G, FS, DP, 1);
        ADD(COLIBRI_K_SHARED_W2, l, G, DP, FS, 1);
        ADD(COLIBRI_K_SHARED_GATE, l, G, 1, DP, 0);
    }
    ADD(COLIBRI_K_TOK_EMBED, G, G, V, DP, 1);
    ADD(COLIBRI_K_OUTPUT_NORM, G, G, 1, DP, 0);
    ADD(COLIBRI_K_LM_HEAD, G, G, V, DP, 1);
#undef ADD
    uint64_t at = (256 + (uint64_t)n * 64 + 4095) / 4096 * 4096, data_offset = at;
    for (int i = 0; i < n; i++) {
        sp[i].nbytes = (uint64_t)sp[i].rows * sp[i].cols * colibri_dtype_size(sp[i].dtype);
        sp[i].off = at;
        at = (at + sp[i].nbytes + 63) / 64 * 64;
        if (sp[i].dtype == COLIBRI_DT_INT8) {
            sp[i].soff = at;
            at = (at + sp[i].rows * 4ull + 63) / 64 * 64;
        }
    }
    uint64_t size = at;
    uint8_t *buf = calloc(1, size);
    if (!buf) return -1;
    memcpy(buf, "COLIBRI\0", 8);
    uint32_t hv[] = {1, NE, F, V, S, D, 256, L, H, HKV, DH, K, 0, dtype, DP, pad, flags, FS};
    for (size_t i = 0; i < sizeof hv / sizeof hv[0]; i++) le_put32(buf + 8 + 4 * i, hv[i]);
    le_putf(buf + 80, 1e-5f);
    le_putf(buf + 84, 10000.0f);
    le_put32(buf + 88, (uint32_t)n);
    le_put32(buf + 92, 256);
    le_put64(buf + 96, data_offset);
    le_put64(buf + 104, size);
    le_put32(buf + 112, 255);
    le_put32(buf + 116, 1);
    le_put32(buf + 120, 2);
    memcpy(buf + 192, "colibri-selftest", 16);

    uint32_t seed = 2463534242u;
    float *row = malloc(sizeof(float) * (DP > H * DH ? DP : H * DH) * 2);
    if (!row) { free(buf); return -1; }
    for (int i = 0; i < n; i++) {
        spec *t = &sp[i];
        uint8_t *rec = buf + 256 + 64 * (size_t)i;
        le_put32(rec, t->kind); le_put32(rec + 4, t->layer); le_put32(rec + 8, t->expert);
        le_put32(rec + 12, t->dtype); le_put32(rec + 16, t->rows); le_put32(rec + 20, t->cols);
        le_put64(rec + 24, t->off); le_put64(rec + 32, t->nbytes);
        if (t->dtype == COLIBRI_DT_INT8) { le_put64(rec + 40, t->soff); le_put64(rec + 48, t->rows * 4ull); }
        int vec = t->rows == 1, out_padded = t->rows == DP && t->kind != COLIBRI_K_TOK_EMBED;
        int in_padded = t->cols == DP;
        float gain = t->kind == COLIBRI_K_ROUTER ? 3.0f : 1.0f;
        for (uint32_t r = 0; r < t->rows; r++) {
            for (uint32_t c = 0; c < t->cols; c++) {
                seed ^= seed << 13; seed ^= seed >> 17; seed ^= seed << 5;
                float u = (float)(seed >> 8) / 16777216.0f * 2.0f - 1.0f;
                float v = vec ? (t->kind == COLIBRI_K_BQ || t->kind == COLIBRI_K_BK ||
                                 t->kind == COLIBRI_K_BV || t->kind == COLIBRI_K_SHARED_GATE
                                     ? 0.2f * u : 1.0f + 0.2f * u)
                              : gain * 1.7f * u / sqrtf((float)(in_padded ? D : t->cols));
                if ((in_padded && c >= D) || (out_padded && r >= D)) v = 0.0f;
                row[c] = v;
            }
            uint8_t *dst = buf + t->off + (uint64_t)r * t->cols * colibri_dtype_size(t->dtype);
            if (t->dtype == COLIBRI_DT_F32) {
                for (uint32_t c = 0; c < t->cols; c++) le_putf(dst + 4 * c, row[c]);
            } else if (t->dtype == COLIBRI_DT_F16 || t->dtype == COLIBRI_DT_BF16) {
                for (uint32_t c = 0; c < t->cols; c++) {
                    uint16_t h = t->dtype == COLIBRI_DT_F16 ? le_half(row[c], 0) : le_bf16(row[c]);
                    dst[2 * c] = (uint8_t)h;
                    dst[2 * c + 1] = (uint8_t)(h >> 8);
                }
            } else {
                float amax = 0;
                for (uint32_t c = 0; c < t->cols; c++) amax = fmaxf(amax, fabsf(row[c]));
                float sc = amax > 0 ? amax / 127.0f : 1.0f;
                for (uint32_t c = 0; c < t->cols; c++) dst[c] = (uint8_t)(int8_t)lrintf(row[c] / sc);
                le_putf(buf + t->soff + 4ull * r, sc);
            }
        }
    }
    free(row);
    FILE *f = fopen(path, "wb");
    int ok = f && fwrite(buf, 1, size, f) == size;
    if (f && fclose(f) != 0) ok = 0;
    free(buf);
    return ok ? 0 : -1;
}
