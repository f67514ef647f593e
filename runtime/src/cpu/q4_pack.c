/* The packed q4, mxfp4 and int8 layouts (q4_pack.h): building them from the file's rows, once per model. */
#include "q4_pack.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "q4_table.h"

int colibri_q4_packable(const colibri_tensor *t) {
    return t->dtype == COLIBRI_DT_Q4 && t->data && t->rows && t->rows % COLIBRI_Q4P_ROWS == 0 &&
           t->cols && t->cols % COLIBRI_Q4_GROUP == 0;
}

size_t colibri_q4_packed_bytes(const colibri_tensor *t) {
    if (!colibri_q4_packable(t)) return 0;
    return (size_t)t->rows / COLIBRI_Q4P_ROWS * (t->cols / COLIBRI_Q4_GROUP) * COLIBRI_Q4P_GROUP_BYTES;
}

void colibri_q4_pack(const colibri_tensor *t, uint8_t *dst) {
    size_t ng = t->cols / COLIBRI_Q4_GROUP;
    const uint8_t *q = (const uint8_t *)t->data;
    const uint16_t *d = colibri_q4_scales(t);
    /* Row by row, so the source (a block's 16 rows are contiguous) is read in order: 16 rows
     * read a group at a time missed the cache on nearly every load (perf: 76% of the pack on
     * one load; 0.6 GB/s). The block's output (ng * 288 bytes) stays in the cache meanwhile. */
    for (uint32_t r = 0; r < t->rows; r += COLIBRI_Q4P_ROWS, dst += ng * COLIBRI_Q4P_GROUP_BYTES)
        for (int i = 0; i < COLIBRI_Q4P_ROWS; i++) {
            const uint8_t *row = q + (size_t)(r + (uint32_t)i) * ng * COLIBRI_Q4_BLOCK;
            const uint16_t *rd = d + (size_t)(r + (uint32_t)i) * ng;
            for (size_t b = 0; b < ng; b++) {
                uint8_t *o = dst + b * COLIBRI_Q4P_GROUP_BYTES;
                for (int c = 0; c < 4; c++) memcpy(o + c * 64 + i * 4, row + b * COLIBRI_Q4_BLOCK + c * 4, 4);
                memcpy(o + 256 + i * 2, rd + b, 2);
            }
        }
}

int colibri_mx_packable(const colibri_tensor *t) {
    return t->dtype == COLIBRI_DT_MXFP4 && t->data && t->rows && t->rows % COLIBRI_Q4P_ROWS == 0 &&
           t->cols && t->cols % COLIBRI_MX_BLOCK == 0;
}

size_t colibri_mx_packed_bytes(const colibri_tensor *t) {
    if (!colibri_mx_packable(t)) return 0;
    return (size_t)t->rows / COLIBRI_Q4P_ROWS * (t->cols / COLIBRI_MX_BLOCK) * COLIBRI_MXP_GROUP_BYTES;
}

/* The four nibbles of a 16-bit value, one per byte (the low nibbles of a dword). */
static inline uint32_t spread_nibbles(uint32_t v) {
    v = (v | v << 8) & 0x00ff00ffu;
    return (v | v << 4) & 0x0f0f0f0fu;
}

void colibri_mx_pack(const colibri_tensor *t, uint8_t *dst) {
    size_t nb = t->cols / COLIBRI_MX_BLOCK;
    const uint8_t *q = (const uint8_t *)t->data, *s = colibri_mx_scales(t);
    /* row by row, in the source's order (as colibri_q4_pack). A file dword (bytes 4k..4k+3 of a
     * block) holds elements 8k..8k+7 as its nibbles 0..7, in order (element 2j low in byte j):
     * the packed dword's byte j takes nibble j (low) and nibble j + 4 (high). */
    for (uint32_t r = 0; r < t->rows; r += COLIBRI_Q4P_ROWS, dst += nb * COLIBRI_MXP_GROUP_BYTES)
        for (int i = 0; i < COLIBRI_Q4P_ROWS; i++) {
            const uint8_t *row = q + (size_t)(r + (uint32_t)i) * nb * COLIBRI_MX_BLOCK_BYTES;
            const uint8_t *rs = s + (size_t)(r + (uint32_t)i) * nb;
            for (size_t b = 0; b < nb; b++) {
                uint8_t *o = dst + b * COLIBRI_MXP_GROUP_BYTES;
                for (int k = 0; k < 4; k++) {
                    uint32_t u, v;
                    memcpy(&u, row + b * COLIBRI_MX_BLOCK_BYTES + 4 * k, 4);
                    v = spread_nibbles(u & 0xffffu) | spread_nibbles(u >> 16) << 4;
                    memcpy(o + k * 64 + i * 4, &v, 4);
                }
                o[256 + i] = rs[b];
            }
        }
}

int colibri_i8_packable(const colibri_tensor *t) {
    return t->dtype == COLIBRI_DT_INT8 && t->data && t->scales && t->rows &&
           t->rows % COLIBRI_Q4P_ROWS == 0 && t->cols && t->cols % 4 == 0;
}

size_t colibri_i8_packed_bytes(const colibri_tensor *t) {
    return colibri_i8_packable(t) ? (size_t)t->rows * t->cols : 0;
}

void colibri_i8_pack(const colibri_tensor *t, uint8_t *dst) {
    size_t nk = t->cols / 4;
    const uint8_t *q = (const uint8_t *)t->data;
    /* row by row, in the source's order (as colibri_q4_pack): the block's 16 * cols output bytes
     * stay in the cache meanwhile */
    for (uint32_t r = 0; r < t->rows; r += COLIBRI_Q4P_ROWS, dst += (size_t)COLIBRI_Q4P_ROWS * t->cols)
        for (int i = 0; i < COLIBRI_Q4P_ROWS; i++) {
            const uint8_t *row = q + (size_t)(r + (uint32_t)i) * t->cols;
            for (size_t k = 0; k < nk; k++) {
                uint32_t v;
                memcpy(&v, row + 4 * k, 4);
                v ^= 0x80808080u; /* each byte w + 128 */
                memcpy(dst + k * 64 + (size_t)i * 4, &v, 4);
            }
        }
}

/* Every weight matrix a pass multiplies by (the embedding gather reads tok_embed's own rows and
 * is left alone; a tied lm_head is packed, its source kept for the gather). */
typedef void (*tensor_fn)(colibri_tensor *t, int keep, void *arg);

static void each_matrix(struct colibri_model *m, tensor_fn fn, void *arg) {
    fn(&m->lm_head, m->lm_head.data == m->tok_embed.data, arg);
    for (uint32_t i = 0; i < m->n_layers; i++) {
        colibri_layer *ly = &m->layers[i];
        colibri_tensor *named[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->attn_gate,
                                   &ly->shared_w1, &ly->shared_w3, &ly->shared_w2,
                                   &ly->dn_qkv, &ly->dn_z, &ly->dn_b, &ly->dn_a, &ly->dn_out};
        for (size_t k = 0; k < sizeof named / sizeof named[0]; k++) fn(named[k], 0, arg);
        for (uint32_t e = 0; e < m->num_experts; e++) {
            fn(&ly->w1[e], 0, arg);
            fn(&ly->w3[e], 0, arg);
            fn(&ly->w2[e], 0, arg);
        }
    }
}

typedef struct {
    uint8_t *at;
    size_t bytes;
    int which, keep_source;
    long page;
} pack_walk;

/* t's packed bytes, if its type is one of w's */
static size_t packed_bytes(const colibri_tensor *t, const pack_walk *w) {
    if (w->which & COLIBRI_PACK_Q4 && t->dtype == COLIBRI_DT_Q4) return colibri_q4_packed_bytes(t);
    if (w->which & COLIBRI_PACK_MXFP4 && t->dtype == COLIBRI_DT_MXFP4) return colibri_mx_packed_bytes(t);
    if (w->which & COLIBRI_PACK_INT8 && t->dtype == COLIBRI_DT_INT8) return colibri_i8_packed_bytes(t);
    return 0;
}

static void count(colibri_tensor *t, int keep, void *arg) {
    (void)keep;
    pack_walk *w = arg;
    w->bytes += packed_bytes(t, w);
}

/* Let the file pages wholly inside [p, p + n) go (they are read again from the file if used). */
static void drop_pages(const void *p, size_t n, long page) {
    uintptr_t lo = ((uintptr_t)p + (uintptr_t)page - 1) & ~((uintptr_t)page - 1);
    uintptr_t hi = ((uintptr_t)p + n) & ~((uintptr_t)page - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}

static void pack_one(colibri_tensor *t, int keep, void *arg) {
    pack_walk *w = arg;
    size_t n = packed_bytes(t, w);
    if (!n || t->packed) return;
    if (t->dtype == COLIBRI_DT_INT8) {
        colibri_i8_pack(t, w->at);
    } else if (t->dtype == COLIBRI_DT_Q4) {
        colibri_q4_pack(t, w->at);
    } else {
        colibri_mx_pack(t, w->at);
    }
    t->packed = w->at;
    w->at += n;
    if (w->keep_source || keep) return;
    if (t->dtype == COLIBRI_DT_INT8) { /* the weight bytes; the per-row scales stay in use */
        drop_pages(t->data, n, w->page);
        return;
    }
    /* the file's blocks, then its scales: each exactly n bytes in all */
    int q4 = t->dtype == COLIBRI_DT_Q4;
    size_t groups = q4 ? t->cols / COLIBRI_Q4_GROUP : t->cols / COLIBRI_MX_BLOCK;
    size_t qbytes = (size_t)t->rows * groups * (q4 ? COLIBRI_Q4_BLOCK : COLIBRI_MX_BLOCK_BYTES);
    drop_pages(t->data, qbytes, w->page);
    drop_pages(t->scales, n - qbytes, w->page);
}

int colibri_model_pack(struct colibri_model *m, int which, int keep_source) {
    pack_walk w = {NULL, 0, which, keep_source || !m->mapped, sysconf(_SC_PAGESIZE)};
    each_matrix(m, count, &w);
    size_t bytes = w.bytes;
    if (!bytes) return 0;
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return errno;
#ifdef MADV_HUGEPAGE
    (void)madvise(p, bytes, MADV_HUGEPAGE); /* advisory: fewer TLB misses on the weight stream */
#endif
    w.at = p;
    each_matrix(m, pack_one, &w);
    (void)mprotect(p, bytes, PROT_READ);
    m->q4_packed = p;
    m->q4_packed_bytes = bytes;
    return 0;
}
