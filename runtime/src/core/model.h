/* The validated, mmapped `.colibri` model (docs/format.md). Shared by the CPU path and the CUDA
 * backend: after colibri_model_open succeeds every tensor view below points inside the mapping,
 * has the shape the format requires for this geometry, and lies wholly inside the file. */
#ifndef COLIBRI_MODEL_H
#define COLIBRI_MODEL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "colibri.h"
#include "rope.h"        /* the RoPE table computed at load */
#include "layers/kinds.h" /* the layer record and the kind table (includes nothing of the core) */

#include "../../kernels/colibri_abi.h" /* COLIBRI_DT_* weight dtype codes, shared with the kernels */

enum {
    COLIBRI_FLAG_SHARED_EXPERT = 1u << 0,
    COLIBRI_FLAG_SHARED_EXPERT_GATE = 1u << 1,
    COLIBRI_FLAG_QK_NORM_HEAD = 1u << 2,
    COLIBRI_FLAG_QK_NORM_FULL = 1u << 3,
    COLIBRI_FLAG_TIED_EMBEDDINGS = 1u << 4,
    COLIBRI_FLAG_QKV_BIAS = 1u << 5,
    /* YaRN RoPE (gpt-oss): header bytes 152..175 hold its parameters (colibri_yarn) */
    COLIBRI_FLAG_ROPE_YARN = 1u << 6
};
#define COLIBRI_KNOWN_FLAGS 0x7Fu

/* Header field `routing`: what the k weights are. */
enum { COLIBRI_WEIGHTS_RENORM = 0, COLIBRI_WEIGHTS_SOFTMAX = 1 };

enum {
    COLIBRI_K_TOK_EMBED = 1, COLIBRI_K_OUTPUT_NORM = 2, COLIBRI_K_LM_HEAD = 3,
    COLIBRI_K_ATTN_NORM = 10, COLIBRI_K_WQ = 11, COLIBRI_K_WK = 12, COLIBRI_K_WV = 13,
    COLIBRI_K_WO = 14, COLIBRI_K_BQ = 15, COLIBRI_K_BK = 16, COLIBRI_K_BV = 17,
    COLIBRI_K_Q_NORM = 18, COLIBRI_K_K_NORM = 19, COLIBRI_K_FFN_NORM = 20, COLIBRI_K_ROUTER = 21,
    /* gpt-oss (docs/format.md): per-head sink logits, output bias, router bias, expert biases */
    COLIBRI_K_ATTN_SINKS = 22, COLIBRI_K_BO = 23, COLIBRI_K_ROUTER_BIAS = 24,
    /* Qwen3.5 / Qwen3-Next gated attention: the output gate's projection (mixer flag 8) */
    COLIBRI_K_ATTN_GATE = 25,
    COLIBRI_K_EXPERT_W1 = 30, COLIBRI_K_EXPERT_W3 = 31, COLIBRI_K_EXPERT_W2 = 32,
    COLIBRI_K_EXPERT_B1 = 33, COLIBRI_K_EXPERT_B3 = 34, COLIBRI_K_EXPERT_B2 = 35,
    COLIBRI_K_SHARED_W1 = 40, COLIBRI_K_SHARED_W3 = 41, COLIBRI_K_SHARED_W2 = 42,
    COLIBRI_K_SHARED_GATE = 43,
    /* Gated DeltaNet layers (layers/deltanet.c; docs/format.md) */
    COLIBRI_K_DN_QKV = 50, COLIBRI_K_DN_Z = 51, COLIBRI_K_DN_B = 52, COLIBRI_K_DN_A = 53,
    COLIBRI_K_DN_CONV = 54, COLIBRI_K_DN_A_LOG = 55, COLIBRI_K_DN_DT_BIAS = 56,
    COLIBRI_K_DN_NORM = 57, COLIBRI_K_DN_OUT = 58
};

#define COLIBRI_HEADER_SIZE 256u
#define COLIBRI_RECORD_SIZE 64u
#define COLIBRI_NO_INDEX 0xFFFFFFFFu
/* Format version 3: the layer table, n_layers 64-byte records right after the tensor table. */
#define COLIBRI_LAYER_RECORD_SIZE 64u
/* Metadata section (format version 2, docs/format.md): 64-byte entries, then 64-aligned blobs. */
#define COLIBRI_META_ENTRY_SIZE 64u
#define COLIBRI_META_NAME_SIZE 48u
#define COLIBRI_META_MAX 4096u

/* A view of one tensor in the mapping. data == NULL means "absent" (optional tensor).
 * y[r] = scale[r] * sum_c data[r, c] * x[c] for int8; for q4 `scales` points at the f16 group
 * scales ([rows, groups] uint16_t, read through colibri_q4_scales), for mxfp4 at the E8M0
 * exponent bytes ([rows, blocks] uint8_t, colibri_mx_scales); NULL for other dtypes. */
typedef struct {
    const void *data;
    const float *scales;
    uint32_t dtype;
    uint32_t rows, cols;
    /* q4 and mxfp4 only: the same weights in the CPU's packed layout (cpu/q4_pack.h), built at
     * load for the kernels that read it; NULL when not packed (last: positional initialisers
     * leave it). */
    const uint8_t *packed;
} colibri_tensor;

typedef struct {
    colibri_layer_desc desc;                  /* the layer's record (kinds.h) */
    const colibri_layer_kind *mixer, *ffn;    /* its kinds' table entries, set at validation */
    colibri_tensor attn_norm, wq, wk, wv, wo;
    colibri_tensor bq, bk, bv, q_norm, k_norm; /* optional, per flags */
    colibri_tensor ffn_norm, router;
    colibri_tensor attn_sinks, bo, router_bias; /* optional, per the layer's flags (gpt-oss) */
    colibri_tensor *w1, *w3, *w2;              /* num_experts entries each */
    colibri_tensor *b1, *b3, *b2;              /* num_experts entries each; data NULL without
                                                  the EXPERT_BIAS flag */
    colibri_tensor shared_w1, shared_w3, shared_w2, shared_gate; /* optional */
    colibri_tensor attn_gate;                  /* gated attention (mixer flag OUTPUT_GATE) */
    /* gated_deltanet: input projections (q|k|v, z, beta, decay), the convolution's taps, the
     * decay parameters, the gated norm's weight, the output projection */
    colibri_tensor dn_qkv, dn_z, dn_b, dn_a, dn_conv, dn_a_log, dn_dt_bias, dn_norm, dn_out;
} colibri_layer;

struct colibri_model {
    /* header, in the format's terms */
    uint32_t version, num_experts, expert_size, vocab_size, max_seq_len, embed_dim;
    uint32_t n_layers, n_heads, n_kv_heads, head_dim, top_k, routing, dtype;
    uint32_t embed_dim_pad, pad_multiple, flags, shared_expert_size;
    float norm_eps, rope_theta;
    struct colibri_rope rope;     /* computed at load (core/rope.c) */
    struct colibri_yarn yarn;     /* header bytes 152..175 when ROPE_YARN is set */
    int has_mxfp4;                /* some tensor is mxfp4: --int8-act has a path for it */
    uint32_t n_tensors, family, bos_token_id, eos_token_id;
    uint64_t data_offset, file_size;
    char name[65];
    /* metadata section (version 2; all 0 for version 1): validated entries start at
     * base + meta_offset; tensor data must end by tensor_end (= meta_offset, or file_size) */
    uint32_t meta_count;
    uint64_t meta_offset, meta_size, tensor_end;
    uint64_t layer_table_offset; /* version 3: where the layer records start; 0 before */
    struct colibri_tokenizer *tokenizer; /* built from the tokenizer.* blobs; NULL when none */

    colibri_tensor tok_embed, output_norm, lm_head; /* lm_head == tok_embed when tied */
    colibri_layer *layers;                          /* n_layers entries */

    /* the mapping */
    const uint8_t *base;
    size_t size;
    int mapped;                   /* 1: base came from mmap (unmap on close); 0: caller's buffer */
    colibri_tensor *expert_views; /* backing store of every layer's w1/w3/w2 arrays */

    /* api.c (shared model): the handle plus one reference per context using it; the model is
     * closed and freed when the last reference goes (atomic, contexts live on other threads). */
    int refs;
    /* api.c: the model's GPU (CUDA context, kernels, the one device copy of the weights),
     * opened by its first CUDA context and shared by the rest, closed with the model. gpu_why:
     * why it could not be opened (tried once per model). gpu_mu guards the three. */
    struct colibri_cuda_device *gpu;
    int gpu_tried;
    char gpu_why[192];
    pthread_mutex_t gpu_mu;
    int locked;                   /* lock_memory: the mapping is mlocked (under gpu_mu) */
    /* cpu/q4_pack.c: the q4, mxfp4 and int8 tensors' packed copy (one anonymous mapping), built once by the
     * first CPU context whose kernels read it (under gpu_mu); q4_pack_tried: attempted */
    uint8_t *q4_packed;
    size_t q4_packed_bytes;
    int q4_pack_tried;
};

/* Open, mmap and validate `path`. On failure returns a status with `why` naming the field. */
colibri_status colibri_model_open(struct colibri_model *m, const char *path, char *why,
                                  size_t why_len);
/* Validate a model held in memory (the fuzzer and tests use it). `buf` must stay alive. */
colibri_status colibri_model_from_memory(struct colibri_model *m, const void *buf, size_t len,
                                         char *why, size_t why_len);
void colibri_model_close(struct colibri_model *m);

/* Find metadata blob `name` (e.g. "tokenizer.vocab"). Returns 1 and points *data and *len into the
 * mapping when found, 0 when absent (always 0 for a version-1 file). Reads only validated,
 * immutable state: safe from any number of threads at once. */
int colibri_model_meta(const struct colibri_model *m, const char *name, const uint8_t **data,
                       size_t *len);

size_t colibri_dtype_size(uint32_t dtype);

/* q4 geometry: groups per row, bytes of nibbles per row. */
static inline size_t colibri_q4_groups(uint32_t cols) {
    return ((size_t)cols + COLIBRI_Q4_GROUP - 1) / COLIBRI_Q4_GROUP;
}
static inline const uint16_t *colibri_q4_scales(const colibri_tensor *t) {
    return (const uint16_t *)(const void *)t->scales;
}
/* mxfp4 geometry: blocks per row; the E8M0 scale bytes ([rows, blocks]). */
static inline size_t colibri_mx_blocks(uint32_t cols) {
    return ((size_t)cols + COLIBRI_MX_BLOCK - 1) / COLIBRI_MX_BLOCK;
}
static inline const uint8_t *colibri_mx_scales(const colibri_tensor *t) {
    return (const uint8_t *)(const void *)t->scales;
}

#endif
