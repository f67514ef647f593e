/* Loading a `.colibri` file: mmap it, then check every field of docs/format.md before any
 * pointer into the mapping is formed. A bad file is refused with a status and a one-line reason
 * that names the field; nothing here may read outside [base, base + size). */
#include "model.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "colibri_config.h"
#include "le.h"
#include "text/tokenizer.h"

_Static_assert(COLIBRI_EMBED_DIM_PAD > 0 && COLIBRI_EMBED_DIM_PAD % 16 == 0,
               "COLIBRI_EMBED_DIM_PAD must be a positive multiple of 16 (docs/format.md)");
_Static_assert(COLIBRI_TOP_K >= 1 && COLIBRI_TOP_K <= 16, "COLIBRI_TOP_K must be in 1..16");
_Static_assert(COLIBRI_MAX_EXPERTS >= 1 && COLIBRI_MAX_EXPERTS <= 512,
               "COLIBRI_MAX_EXPERTS must be in 1..512");

/* Format limits (docs/format.md, "Limits enforced by readers"). */
#define LIM_D 65536u
#define LIM_E 512u /* Qwen3-Next: 512 routed experts */
#define LIM_TOPK 16u
#define LIM_L 1024u
#define LIM_HEADS 1024u
#define LIM_DH 1024u
#define LIM_V 4194304u
#define LIM_F 262144u
#define LIM_SEQ 1048576u

static float rdf32(const uint8_t *p) {
    uint32_t u = rd32(p);
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

size_t colibri_dtype_size(uint32_t dtype) {
    switch (dtype) {
    case COLIBRI_DT_F32: return 4;
    case COLIBRI_DT_F16: return 2;
    case COLIBRI_DT_BF16: return 2;
    case COLIBRI_DT_INT8: return 1;
    default: return 0;
    }
}

static const char *kind_name(uint32_t kind) {
    switch (kind) {
    case COLIBRI_K_TOK_EMBED: return "TOK_EMBED";
    case COLIBRI_K_OUTPUT_NORM: return "OUTPUT_NORM";
    case COLIBRI_K_LM_HEAD: return "LM_HEAD";
    case COLIBRI_K_ATTN_NORM: return "ATTN_NORM";
    case COLIBRI_K_WQ: return "WQ";
    case COLIBRI_K_WK: return "WK";
    case COLIBRI_K_WV: return "WV";
    case COLIBRI_K_WO: return "WO";
    case COLIBRI_K_BQ: return "BQ";
    case COLIBRI_K_BK: return "BK";
    case COLIBRI_K_BV: return "BV";
    case COLIBRI_K_Q_NORM: return "Q_NORM";
    case COLIBRI_K_K_NORM: return "K_NORM";
    case COLIBRI_K_FFN_NORM: return "FFN_NORM";
    case COLIBRI_K_ROUTER: return "ROUTER";
    case COLIBRI_K_ATTN_SINKS: return "ATTN_SINKS";
    case COLIBRI_K_BO: return "BO";
    case COLIBRI_K_ROUTER_BIAS: return "ROUTER_BIAS";
    case COLIBRI_K_EXPERT_W1: return "EXPERT_W1";
    case COLIBRI_K_EXPERT_W3: return "EXPERT_W3";
    case COLIBRI_K_EXPERT_W2: return "EXPERT_W2";
    case COLIBRI_K_EXPERT_B1: return "EXPERT_B1";
    case COLIBRI_K_EXPERT_B3: return "EXPERT_B3";
    case COLIBRI_K_EXPERT_B2: return "EXPERT_B2";
    case COLIBRI_K_SHARED_W1: return "SHARED_W1";
    case COLIBRI_K_SHARED_W3: return "SHARED_W3";
    case COLIBRI_K_SHARED_W2: return "SHARED_W2";
    case COLIBRI_K_SHARED_GATE: return "SHARED_GATE";
    case COLIBRI_K_ATTN_GATE: return "ATTN_GATE";
    case COLIBRI_K_DN_QKV: return "DN_QKV";
    case COLIBRI_K_DN_Z: return "DN_Z";
    case COLIBRI_K_DN_B: return "DN_B";
    case COLIBRI_K_DN_A: return "DN_A";
    case COLIBRI_K_DN_CONV: return "DN_CONV";
    case COLIBRI_K_DN_A_LOG: return "DN_A_LOG";
    case COLIBRI_K_DN_DT_BIAS: return "DN_DT_BIAS";
    case COLIBRI_K_DN_NORM: return "DN_NORM";
    case COLIBRI_K_DN_OUT: return "DN_OUT";
    default: return NULL;
    }
}

static int is_global(uint32_t kind) { return kind <= COLIBRI_K_LM_HEAD; }
static int is_expert(uint32_t kind) { /* the experts' matrices and their biases */
    return kind >= COLIBRI_K_EXPERT_W1 && kind <= COLIBRI_K_EXPERT_B2;
}
/* Small vectors stay f32 whatever the model dtype (docs/format.md). */
static int must_be_f32(uint32_t kind) {
    switch (kind) {
    case COLIBRI_K_OUTPUT_NORM: case COLIBRI_K_ATTN_NORM: case COLIBRI_K_BQ: case COLIBRI_K_BK:
    case COLIBRI_K_BV: case COLIBRI_K_Q_NORM: case COLIBRI_K_K_NORM: case COLIBRI_K_FFN_NORM:
    case COLIBRI_K_ROUTER: case COLIBRI_K_SHARED_GATE: case COLIBRI_K_ATTN_SINKS: case COLIBRI_K_BO:
    case COLIBRI_K_ROUTER_BIAS: case COLIBRI_K_EXPERT_B1: case COLIBRI_K_EXPERT_B3:
    case COLIBRI_K_EXPERT_B2: return 1;
    /* gated_deltanet: the beta/decay projections feed exp() and the recurrence (as the router
     * feeds top-k), the rest are small vectors */
    case COLIBRI_K_DN_B: case COLIBRI_K_DN_A: case COLIBRI_K_DN_CONV: case COLIBRI_K_DN_A_LOG:
    case COLIBRI_K_DN_DT_BIAS: case COLIBRI_K_DN_NORM: return 1;
    default: return 0;
    }
}

/* Is the tensor kind part of the model (a per-layer kind: of layer `layer`, as its mixer and FFN
 * kinds say, kinds.h), and with which shape? */
static int expected_shape(const struct colibri_model *m, uint32_t layer, uint32_t kind,
                          uint32_t *rows, uint32_t *cols) {
    uint32_t dp = m->embed_dim_pad;
    switch (kind) {
    case COLIBRI_K_TOK_EMBED: *rows = m->vocab_size; *cols = dp; return 1;
    case COLIBRI_K_OUTPUT_NORM: *rows = 1; *cols = dp; return 1;
    case COLIBRI_K_LM_HEAD: *rows = m->vocab_size; *cols = dp;
        return !(m->flags & COLIBRI_FLAG_TIED_EMBEDDINGS);
    default: break;
    }
    const colibri_layer *l = &m->layers[layer];
    return l->mixer->tensor(m, layer, kind, rows, cols) || l->ffn->tensor(m, layer, kind, rows, cols);
}

/* Where the view of (kind, layer, expert) lives in the model struct. */
static colibri_tensor *slot_for(struct colibri_model *m, uint32_t kind, uint32_t layer,
                                uint32_t expert) {
    if (kind == COLIBRI_K_TOK_EMBED) return &m->tok_embed;
    if (kind == COLIBRI_K_OUTPUT_NORM) return &m->output_norm;
    if (kind == COLIBRI_K_LM_HEAD) return &m->lm_head;
    colibri_layer *l = &m->layers[layer];
    switch (kind) {
    case COLIBRI_K_ATTN_NORM: return &l->attn_norm;
    case COLIBRI_K_WQ: return &l->wq;
    case COLIBRI_K_WK: return &l->wk;
    case COLIBRI_K_WV: return &l->wv;
    case COLIBRI_K_WO: return &l->wo;
    case COLIBRI_K_BQ: return &l->bq;
    case COLIBRI_K_BK: return &l->bk;
    case COLIBRI_K_BV: return &l->bv;
    case COLIBRI_K_Q_NORM: return &l->q_norm;
    case COLIBRI_K_K_NORM: return &l->k_norm;
    case COLIBRI_K_FFN_NORM: return &l->ffn_norm;
    case COLIBRI_K_ROUTER: return &l->router;
    case COLIBRI_K_ATTN_SINKS: return &l->attn_sinks;
    case COLIBRI_K_BO: return &l->bo;
    case COLIBRI_K_ROUTER_BIAS: return &l->router_bias;
    case COLIBRI_K_EXPERT_W1: return &l->w1[expert];
    case COLIBRI_K_EXPERT_W3: return &l->w3[expert];
    case COLIBRI_K_EXPERT_W2: return &l->w2[expert];
    case COLIBRI_K_EXPERT_B1: return &l->b1[expert];
    case COLIBRI_K_EXPERT_B3: return &l->b3[expert];
    case COLIBRI_K_EXPERT_B2: return &l->b2[expert];
    case COLIBRI_K_SHARED_W1: return &l->shared_w1;
    case COLIBRI_K_SHARED_W3: return &l->shared_w3;
    case COLIBRI_K_SHARED_W2: return &l->shared_w2;
    case COLIBRI_K_SHARED_GATE: return &l->shared_gate;
    case COLIBRI_K_ATTN_GATE: return &l->attn_gate;
    case COLIBRI_K_DN_QKV: return &l->dn_qkv;
    case COLIBRI_K_DN_Z: return &l->dn_z;
    case COLIBRI_K_DN_B: return &l->dn_b;
    case COLIBRI_K_DN_A: return &l->dn_a;
    case COLIBRI_K_DN_CONV: return &l->dn_conv;
    case COLIBRI_K_DN_A_LOG: return &l->dn_a_log;
    case COLIBRI_K_DN_DT_BIAS: return &l->dn_dt_bias;
    case COLIBRI_K_DN_NORM: return &l->dn_norm;
    case COLIBRI_K_DN_OUT: return &l->dn_out;
    default: return NULL;
    }
}

/* [off, off + n) inside [lo, size)? Written so that no addition can wrap. */
static int range_ok(uint64_t off, uint64_t n, uint64_t lo, uint64_t size) {
    return off >= lo && off <= size && n <= size - off;
}

static colibri_status check_dim(const char *field, uint32_t v, uint32_t lo, uint32_t hi, char *why,
                                size_t len) {
    if (v < lo || v > hi)
        return fail(why, len, COLIBRI_E_ABSURD_DIM, "header field %s = %u is outside %u..%u", field,
                    v, lo, hi);
    return COLIBRI_OK;
}

static colibri_status parse_header(struct colibri_model *m, const uint8_t *b, uint64_t size,
                                   char *why, size_t len) {
    colibri_status s;
    if (size < COLIBRI_HEADER_SIZE)
        return fail(why, len, COLIBRI_E_TRUNCATED,
                    "file is %llu bytes, shorter than the 256-byte header (truncated?)",
                    (unsigned long long)size);
    if (memcmp(b, "COLIBRI\0", 8) != 0)
        return fail(why, len, COLIBRI_E_BAD_MAGIC, "the first 8 bytes are not \"COLIBRI\\0\"");
    m->version = rd32(b + 8);
    if (m->version < 1 || m->version > 3)
        return fail(why, len, COLIBRI_E_BAD_VERSION,
                    "format version %u is not supported (this runtime reads versions 1 to 3)",
                    m->version);
    m->num_experts = rd32(b + 12);
    m->expert_size = rd32(b + 16);
    m->vocab_size = rd32(b + 20);
    m->max_seq_len = rd32(b + 24);
    m->embed_dim = rd32(b + 28);
    uint32_t header_size = rd32(b + 32);
    m->n_layers = rd32(b + 36);
    m->n_heads = rd32(b + 40);
    m->n_kv_heads = rd32(b + 44);
    m->head_dim = rd32(b + 48);
    m->top_k = rd32(b + 52);
    m->routing = rd32(b + 56);
    m->dtype = rd32(b + 60);
    m->embed_dim_pad = rd32(b + 64);
    m->pad_multiple = rd32(b + 68);
    m->flags = rd32(b + 72);
    m->shared_expert_size = rd32(b + 76);
    m->norm_eps = rdf32(b + 80);
    m->rope_theta = rdf32(b + 84);
    m->n_tensors = rd32(b + 88);
    uint32_t table_offset = rd32(b + 92);
    m->data_offset = rd64(b + 96);
    m->file_size = rd64(b + 104);
    m->family = rd32(b + 112);
    m->bos_token_id = rd32(b + 116);
    m->eos_token_id = rd32(b + 120);
    memcpy(m->name, b + 192, 64);
    m->name[64] = '\0';
    if (m->version >= 2) { /* version 1 kept these bytes reserved (zero) */
        m->meta_count = rd32(b + 124);
        m->meta_offset = rd64(b + 128);
        m->meta_size = rd64(b + 136);
    }
    /* Versions 1 and 2 left these bytes unread (reserved), and still do; version 3 reads the
     * layer table's offset, the YaRN parameters when its flag says so (bytes 152..175), and
     * refuses anything in the bytes it keeps reserved. */
    if (m->version >= 3) {
        m->layer_table_offset = rd64(b + 144);
        uint32_t at = 152;
        if (m->flags & COLIBRI_FLAG_ROPE_YARN) {
            m->yarn.factor = rdf32(b + 152);
            m->yarn.beta_fast = rdf32(b + 156);
            m->yarn.beta_slow = rdf32(b + 160);
            m->yarn.attention_factor = rdf32(b + 164);
            m->yarn.original = rd32(b + 168);
            m->yarn.truncate = rd32(b + 172);
            at = 176;
        }
        for (; at < 192; at++)
            if (b[at] != 0)
                return fail(why, len, COLIBRI_E_BAD_VERSION,
                            "header byte %u is reserved in format version 3 and must be 0", at);
    }

    if (header_size != COLIBRI_HEADER_SIZE)
        return fail(why, len, COLIBRI_E_BAD_VERSION, "header_size is %u, expected 256", header_size);
    if (m->file_size > size)
        return fail(why, len, COLIBRI_E_TRUNCATED,
                    "file is %llu bytes but its header says file_size = %llu (truncated)",
                    (unsigned long long)size, (unsigned long long)m->file_size);
    if (m->file_size != size)
        return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                    "file is %llu bytes but its header says file_size = %llu",
                    (unsigned long long)size, (unsigned long long)m->file_size);

    if ((s = check_dim("embed_dim", m->embed_dim, 1, LIM_D, why, len)) ||
        (s = check_dim("embed_dim_pad", m->embed_dim_pad, 1, LIM_D, why, len)) ||
        (s = check_dim("num_experts", m->num_experts, 1, LIM_E, why, len)) ||
        (s = check_dim("top_k", m->top_k, 1, LIM_TOPK, why, len)) ||
        (s = check_dim("n_layers", m->n_layers, 1, LIM_L, why, len)) ||
        (s = check_dim("n_heads", m->n_heads, 1, LIM_HEADS, why, len)) ||
        (s = check_dim("n_kv_heads", m->n_kv_heads, 1, LIM_HEADS, why, len)) ||
        (s = check_dim("head_dim", m->head_dim, 2, LIM_DH, why, len)) ||
        (s = check_dim("vocab_size", m->vocab_size, 1, LIM_V, why, len)) ||
        (s = check_dim("expert_size", m->expert_size, 1, LIM_F, why, len)) ||
        (s = check_dim("shared_expert_size", m->shared_expert_size, 0, LIM_F, why, len)) ||
        (s = check_dim("max_seq_len", m->max_seq_len, 1, LIM_SEQ, why, len)) ||
        (s = check_dim("pad_multiple", m->pad_multiple, 16, LIM_D, why, len)))
        return s;
    if (m->top_k > m->num_experts)
        return fail(why, len, COLIBRI_E_ABSURD_DIM, "top_k = %u exceeds num_experts = %u",
                    m->top_k, m->num_experts);
    if (m->n_heads % m->n_kv_heads != 0)
        return fail(why, len, COLIBRI_E_ABSURD_DIM, "n_heads = %u is not a multiple of n_kv_heads = %u",
                    m->n_heads, m->n_kv_heads);
    if (m->head_dim % 2 != 0)
        return fail(why, len, COLIBRI_E_ABSURD_DIM, "head_dim = %u is odd (RoPE pairs lanes)",
                    m->head_dim);
    if (m->pad_multiple % 16 != 0 || m->embed_dim_pad % m->pad_multiple != 0 ||
        m->embed_dim_pad < m->embed_dim || m->embed_dim_pad >= m->embed_dim + m->pad_multiple)
        return fail(why, len, COLIBRI_E_ABSURD_DIM,
                    "embed_dim_pad = %u is not embed_dim = %u rounded up to pad_multiple = %u",
                    m->embed_dim_pad, m->embed_dim, m->pad_multiple);
    /* docs/format.md: a token id the embedding has, or 0xFFFFFFFF for "unknown". */
    if (m->bos_token_id != 0xFFFFFFFFu && m->bos_token_id >= m->vocab_size)
        return fail(why, len, COLIBRI_E_ABSURD_DIM,
                    "bos_token_id = %u is not < vocab_size = %u (nor 0xFFFFFFFF)", m->bos_token_id,
                    m->vocab_size);
    if (m->eos_token_id != 0xFFFFFFFFu && m->eos_token_id >= m->vocab_size)
        return fail(why, len, COLIBRI_E_ABSURD_DIM,
                    "eos_token_id = %u is not < vocab_size = %u (nor 0xFFFFFFFF)", m->eos_token_id,
                    m->vocab_size);
    if (m->routing > COLIBRI_WEIGHTS_SOFTMAX)
        return fail(why, len, COLIBRI_E_UNSUPPORTED, "routing = %u is not 0 (renormalise) or 1",
                    m->routing);
    if (m->dtype > COLIBRI_DT_MXFP4 || (m->dtype == COLIBRI_DT_Q4 && m->version < 2) ||
        (m->dtype == COLIBRI_DT_MXFP4 && m->version < 3))
        return fail(why, len, COLIBRI_E_UNSUPPORTED,
                    "dtype = %u is not one of 0..5 (4, q4, needs format version 2; 5, mxfp4, "
                    "version 3)", m->dtype);
    if (m->flags & ~COLIBRI_KNOWN_FLAGS)
        return fail(why, len, COLIBRI_E_UNSUPPORTED, "flags = 0x%x has unknown bits", m->flags);
    if ((m->flags & COLIBRI_FLAG_ROPE_YARN) && m->version < 3)
        return fail(why, len, COLIBRI_E_UNSUPPORTED,
                    "flags = 0x%x sets ROPE_YARN, which needs format version 3", m->flags);
    if ((m->flags & COLIBRI_FLAG_ROPE_YARN) &&
        (s = colibri_rope_check_yarn(&m->yarn, why, len)))
        return s;
    if ((m->flags & COLIBRI_FLAG_QK_NORM_HEAD) && (m->flags & COLIBRI_FLAG_QK_NORM_FULL))
        return fail(why, len, COLIBRI_E_ABSURD_DIM, "flags set both QK_NORM_HEAD and QK_NORM_FULL");
    if ((m->flags & COLIBRI_FLAG_SHARED_EXPERT_GATE) && !(m->flags & COLIBRI_FLAG_SHARED_EXPERT))
        return fail(why, len, COLIBRI_E_ABSURD_DIM, "SHARED_EXPERT_GATE without SHARED_EXPERT");
    if (((m->flags & COLIBRI_FLAG_SHARED_EXPERT) != 0) != (m->shared_expert_size != 0))
        return fail(why, len, COLIBRI_E_ABSURD_DIM,
                    "shared_expert_size = %u disagrees with the SHARED_EXPERT flag",
                    m->shared_expert_size);
    if (!(m->norm_eps > 0.0f && m->norm_eps < 1.0f))
        return fail(why, len, COLIBRI_E_ABSURD_DIM, "norm_eps = %g is not in (0, 1)",
                    (double)m->norm_eps);
    if (!(m->rope_theta > 0.0f && isfinite(m->rope_theta)))
        return fail(why, len, COLIBRI_E_ABSURD_DIM, "rope_theta = %g is not positive and finite",
                    (double)m->rope_theta);
    if ((uint64_t)m->n_heads * m->head_dim > LIM_D * 4ull)
        return fail(why, len, COLIBRI_E_ABSURD_DIM, "n_heads * head_dim = %llu is too large",
                    (unsigned long long)m->n_heads * m->head_dim);

    /* What this build can hold. */
    if (m->pad_multiple != COLIBRI_EMBED_DIM_PAD)
        return fail(why, len, COLIBRI_E_PAD_MISMATCH,
                    "model was padded to a multiple of %u (pad_multiple, embed_dim_pad = %u) but this "
                    "binary was built with COLIBRI_EMBED_DIM_PAD = %u for target '%s'; re-convert "
                    "it for this target: `invoke convert --hf-dir <dir> --target %s --out <file>` "
                    "(or `invoke tiny-model --target %s --out <file>`)",
                    m->pad_multiple, m->embed_dim_pad, (unsigned)COLIBRI_EMBED_DIM_PAD,
                    COLIBRI_TARGET_NAME, COLIBRI_TARGET_NAME, COLIBRI_TARGET_NAME);
    if (m->top_k > COLIBRI_TOP_K)
        return fail(why, len, COLIBRI_E_UNSUPPORTED,
                    "top_k = %u exceeds COLIBRI_TOP_K = %d of this build (target '%s')", m->top_k,
                    COLIBRI_TOP_K, COLIBRI_TARGET_NAME);
    if (m->num_experts > COLIBRI_MAX_EXPERTS)
        return fail(why, len, COLIBRI_E_UNSUPPORTED,
                    "num_experts = %u exceeds COLIBRI_MAX_EXPERTS = %d of this build (target '%s')",
                    m->num_experts, COLIBRI_MAX_EXPERTS, COLIBRI_TARGET_NAME);

    if (table_offset != COLIBRI_HEADER_SIZE)
        return fail(why, len, COLIBRI_E_OUT_OF_RANGE, "tensor_table_offset = %u, expected 256",
                    table_offset);
    /* the tensor table, then (version 3) the layer table, then the data */
    uint64_t tables = (uint64_t)m->n_tensors * COLIBRI_RECORD_SIZE;
    if (m->version >= 3) {
        if (m->layer_table_offset != COLIBRI_HEADER_SIZE + tables)
            return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                        "layer_table_offset = %llu, but n_tensors = %u ends the tensor table at %llu, "
                        "where the layer table must start", (unsigned long long)m->layer_table_offset,
                        m->n_tensors, (unsigned long long)(COLIBRI_HEADER_SIZE + tables));
        tables += (uint64_t)m->n_layers * COLIBRI_LAYER_RECORD_SIZE;
    }
    if (m->data_offset % 4096 != 0 || m->data_offset < 4096 || m->data_offset > size ||
        tables > m->data_offset - COLIBRI_HEADER_SIZE)
        return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                    "data_offset = %llu with n_tensors = %u%s does not fit the file (%llu bytes)",
                    (unsigned long long)m->data_offset, m->n_tensors,
                    m->version >= 3 ? " and the layer table" : "", (unsigned long long)size);
    m->tensor_end = m->file_size;
    if (m->meta_count == 0) {
        if (m->meta_offset != 0 || m->meta_size != 0)
            return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                        "meta_offset = %llu, meta_size = %llu with meta_count = 0 (must be 0)",
                        (unsigned long long)m->meta_offset, (unsigned long long)m->meta_size);
        return COLIBRI_OK;
    }
    if (m->meta_count > COLIBRI_META_MAX)
        return fail(why, len, COLIBRI_E_OUT_OF_RANGE, "meta_count = %u is more than %u",
                    m->meta_count, COLIBRI_META_MAX);
    /* the section is the file's tail: [meta_offset, file_size), after the tensor data */
    if (m->meta_offset % 64 != 0 || m->meta_offset < m->data_offset || m->meta_offset > size ||
        m->meta_size != size - m->meta_offset ||
        (uint64_t)m->meta_count * COLIBRI_META_ENTRY_SIZE > m->meta_size)
        return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                    "metadata section meta_offset = %llu, meta_size = %llu, meta_count = %u does not "
                    "fit between data_offset = %llu and the end of the file (%llu bytes)",
                    (unsigned long long)m->meta_offset, (unsigned long long)m->meta_size,
                    m->meta_count, (unsigned long long)m->data_offset, (unsigned long long)size);
    m->tensor_end = m->meta_offset;
    return COLIBRI_OK;
}

static int meta_name_char(uint8_t c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
           c == '.' || c == '_' || c == '-';
}

/* Every entry: a NUL-padded name of allowed characters, names strictly increasing (so unique and
 * binary-searchable), blobs 64-aligned, in entry order, inside the section, not overlapping. */
static colibri_status parse_meta(const struct colibri_model *m, char *why, size_t len) {
    const uint8_t *sec = m->base + m->meta_offset;
    uint64_t prev_end = (uint64_t)m->meta_count * COLIBRI_META_ENTRY_SIZE;
    for (uint32_t i = 0; i < m->meta_count; i++) {
        const uint8_t *e = sec + (size_t)i * COLIBRI_META_ENTRY_SIZE;
        uint32_t n = 0;
        while (n < COLIBRI_META_NAME_SIZE && e[n]) n++;
        int ok = n > 0 && n < COLIBRI_META_NAME_SIZE;
        for (uint32_t k = 0; ok && k < COLIBRI_META_NAME_SIZE; k++)
            ok = k < n ? meta_name_char(e[k]) : e[k] == 0;
        if (!ok)
            return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                        "metadata entry %u: name is not 1..47 NUL-padded characters of "
                        "[A-Za-z0-9._-]", i);
        if (i > 0 && memcmp(e - COLIBRI_META_ENTRY_SIZE, e, COLIBRI_META_NAME_SIZE) >= 0)
            return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                        "metadata entry %u (%.47s): names are not unique and sorted", i,
                        (const char *)e);
        uint64_t off = rd64(e + 48), nb = rd64(e + 56);
        if (off % 64 != 0 || off < prev_end || !range_ok(off, nb, prev_end, m->meta_size))
            return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                        "metadata entry %u (%.47s): blob [%llu, +%llu) is unaligned, overlaps or "
                        "lies outside the %llu-byte section", i, (const char *)e,
                        (unsigned long long)off, (unsigned long long)nb,
                        (unsigned long long)m->meta_size);
        prev_end = off + nb;
    }
    return COLIBRI_OK;
}

int colibri_model_meta(const struct colibri_model *m, const char *name, const uint8_t **data,
                       size_t *len) {
    if (!m || !name || !m->meta_count) return 0;
    size_t n = strlen(name);
    if (n == 0 || n >= COLIBRI_META_NAME_SIZE) return 0;
    uint8_t key[COLIBRI_META_NAME_SIZE] = {0};
    memcpy(key, name, n);
    const uint8_t *sec = m->base + m->meta_offset;
    uint32_t lo = 0, hi = m->meta_count;
    while (lo < hi) { /* names are validated strictly increasing */
        uint32_t mid = lo + (hi - lo) / 2;
        const uint8_t *e = sec + (size_t)mid * COLIBRI_META_ENTRY_SIZE;
        int c = memcmp(key, e, COLIBRI_META_NAME_SIZE);
        if (c == 0) {
            if (data) *data = sec + rd64(e + 48);
            if (len) *len = (size_t)rd64(e + 56);
            return 1;
        }
        if (c < 0) hi = mid;
        else lo = mid + 1;
    }
    return 0;
}

/* The layer table (version 3; every layer of an older file is attention + MoE): each record's
 * kinds must be ones this runtime has, reserved words zero, and each kind checks the rest. */
static colibri_status parse_layers(struct colibri_model *m, char *why, size_t len) {
    for (uint32_t l = 0; l < m->n_layers; l++) {
        colibri_layer_desc *d = &m->layers[l].desc;
        memset(d, 0, sizeof *d);
        if (m->version < 3) {
            d->mixer = COLIBRI_MIXER_ATTENTION;
            d->ffn = COLIBRI_FFN_MOE;
        } else {
            const uint8_t *r = m->base + m->layer_table_offset + (size_t)l * COLIBRI_LAYER_RECORD_SIZE;
            d->mixer = rd32(r);
            d->ffn = rd32(r + 4);
            d->window = rd32(r + 8);
            d->mixer_flags = rd32(r + 12);
            for (int i = 0; i < 4; i++) {
                d->mixer_params[i] = rd32(r + 16 + 4 * i);
                d->ffn_params[i] = rd32(r + 32 + 4 * i);
            }
            for (int i = 48; i < 64; i++)
                if (r[i] != 0)
                    return fail(why, len, COLIBRI_E_BAD_LAYER,
                                "layer %u: record byte %d is reserved and must be 0", l, i);
        }
        colibri_layer *ly = &m->layers[l];
        ly->mixer = colibri_mixer_kind(d->mixer);
        ly->ffn = colibri_ffn_kind(d->ffn);
        if (!ly->mixer || !ly->ffn)
            return fail(why, len, COLIBRI_E_UNSUPPORTED,
                        "layer %u: %s kind %u is not one this runtime has (the model needs a newer "
                        "colibri, or the file is damaged)", l, ly->mixer ? "ffn" : "mixer",
                        ly->mixer ? d->ffn : d->mixer);
        colibri_status s;
        if ((s = ly->mixer->validate(m, l, why, len)) || (s = ly->ffn->validate(m, l, why, len)))
            return s;
    }
    return COLIBRI_OK;
}

static colibri_status parse_record(struct colibri_model *m, const uint8_t *r, uint32_t idx,
                                   char *why, size_t len) {
    uint32_t kind = rd32(r), layer = rd32(r + 4), expert = rd32(r + 8), dtype = rd32(r + 12);
    uint32_t rows = rd32(r + 16), cols = rd32(r + 20);
    uint64_t off = rd64(r + 24), nbytes = rd64(r + 32), soff = rd64(r + 40), sbytes = rd64(r + 48);
    const char *name = kind_name(kind);
    if (!name)
        return fail(why, len, COLIBRI_E_BAD_TENSOR, "tensor record %u: unknown kind %u", idx, kind);
    if (is_global(kind) ? layer != COLIBRI_NO_INDEX : layer >= m->n_layers)
        return fail(why, len, COLIBRI_E_BAD_TENSOR, "tensor %s (record %u): bad layer %u", name,
                    idx, layer);
    if (is_expert(kind) ? expert >= m->num_experts : expert != COLIBRI_NO_INDEX)
        return fail(why, len, COLIBRI_E_BAD_TENSOR, "tensor %s layer %u: bad expert index %u", name,
                    layer, expert);
    uint32_t er, ec;
    if (!expected_shape(m, layer, kind, &er, &ec)) {
        if (is_global(kind))
            return fail(why, len, COLIBRI_E_BAD_TENSOR,
                        "tensor %s is present but the header flags (0x%x) exclude it", name,
                        m->flags);
        return fail(why, len, COLIBRI_E_BAD_TENSOR,
                    "tensor %s layer %u is present but the layer's kinds (%s + %s) and the header "
                    "flags (0x%x) exclude it", name, layer, m->layers[layer].mixer->name,
                    m->layers[layer].ffn->name, m->flags);
    }
    if (rows != er || cols != ec)
        return fail(why, len, COLIBRI_E_BAD_TENSOR,
                    "tensor %s layer %d expert %d has shape [%u, %u], expected [%u, %u]", name,
                    (int)layer, (int)expert, rows, cols, er, ec);
    size_t esz = colibri_dtype_size(dtype);
    if ((esz == 0 && !(dtype == COLIBRI_DT_Q4 && m->version >= 2) &&
         !(dtype == COLIBRI_DT_MXFP4 && m->version >= 3)) ||
        (must_be_f32(kind) && dtype != COLIBRI_DT_F32))
        return fail(why, len, COLIBRI_E_BAD_TENSOR, "tensor %s layer %d: dtype %u not allowed", name,
                    (int)layer, dtype);
    /* rows, cols < 2^32 so rows*cols < 2^64; times esz (<= 4) is checked against the limit.
     * q4, mxfp4: rows * blocks * 16 <= rows * (cols + 31) / 2, also far below 2^64. */
    uint64_t elems = (uint64_t)rows * cols;
    uint64_t want = dtype == COLIBRI_DT_Q4 ? (uint64_t)rows * colibri_q4_groups(cols) * COLIBRI_Q4_BLOCK
                    : dtype == COLIBRI_DT_MXFP4
                        ? (uint64_t)rows * colibri_mx_blocks(cols) * COLIBRI_MX_BLOCK_BYTES
                        : elems * esz;
    uint64_t want_s = dtype == COLIBRI_DT_INT8 ? (uint64_t)rows * 4
                      : dtype == COLIBRI_DT_Q4 ? (uint64_t)rows * colibri_q4_groups(cols) * 2
                      : dtype == COLIBRI_DT_MXFP4 ? (uint64_t)rows * colibri_mx_blocks(cols)
                                                  : 0;
    if (elems > UINT64_MAX / 4 || nbytes != want)
        return fail(why, len, COLIBRI_E_BAD_TENSOR, "tensor %s layer %d: nbytes = %llu, expected %llu",
                    name, (int)layer, (unsigned long long)nbytes, (unsigned long long)want);
    if (off % 64 != 0 || !range_ok(off, nbytes, m->data_offset, m->tensor_end))
        return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                    "tensor %s layer %d: data [%llu, +%llu) is unaligned or outside the data "
                    "section [%llu, %llu)",
                    name, (int)layer, (unsigned long long)off, (unsigned long long)nbytes,
                    (unsigned long long)m->data_offset, (unsigned long long)m->tensor_end);
    if (want_s) {
        if (sbytes != want_s || soff % 64 != 0 ||
            !range_ok(soff, sbytes, m->data_offset, m->tensor_end))
            return fail(why, len, COLIBRI_E_OUT_OF_RANGE,
                        "tensor %s layer %d: %s scales [%llu, +%llu) are unaligned, mis-sized "
                        "(expected %llu bytes) or outside the file",
                        name, (int)layer,
                        dtype == COLIBRI_DT_Q4 ? "q4" : dtype == COLIBRI_DT_MXFP4 ? "mxfp4" : "int8",
                        (unsigned long long)soff, (unsigned long long)sbytes,
                        (unsigned long long)want_s);
    } else if (soff != 0 || sbytes != 0) {
        return fail(why, len, COLIBRI_E_BAD_TENSOR,
                    "tensor %s layer %d: scales on a tensor without them (not int8, q4 or mxfp4)", name,
                    (int)layer);
    }
    colibri_tensor *t = slot_for(m, kind, layer, expert);
    if (t->data)
        return fail(why, len, COLIBRI_E_BAD_TENSOR, "tensor %s layer %d expert %d appears twice",
                    name, (int)layer, (int)expert);
    t->data = m->base + off;
    t->scales = want_s ? (const float *)(const void *)(m->base + soff) : NULL;
    t->dtype = dtype;
    t->rows = rows;
    t->cols = cols;
    if (dtype == COLIBRI_DT_MXFP4) m->has_mxfp4 = 1;
    return COLIBRI_OK;
}

static colibri_status require(const struct colibri_model *m, const colibri_tensor *t, uint32_t kind,
                              int layer, int expert, char *why, size_t len) {
    uint32_t r, c;
    if (!expected_shape(m, layer < 0 ? COLIBRI_NO_INDEX : (uint32_t)layer, kind, &r, &c) || t->data)
        return COLIBRI_OK;
    return fail(why, len, COLIBRI_E_BAD_TENSOR, "tensor %s layer %d expert %d is missing",
                kind_name(kind), layer, expert);
}

/* Every per-layer tensor kind of docs/format.md (the layer's kinds say which ones it has). */
static const uint32_t layer_tensor_kinds[] = {
    COLIBRI_K_ATTN_NORM, COLIBRI_K_WQ, COLIBRI_K_WK, COLIBRI_K_WV, COLIBRI_K_WO, COLIBRI_K_BQ,
    COLIBRI_K_BK, COLIBRI_K_BV, COLIBRI_K_Q_NORM, COLIBRI_K_K_NORM, COLIBRI_K_FFN_NORM,
    COLIBRI_K_ROUTER, COLIBRI_K_ATTN_SINKS, COLIBRI_K_BO, COLIBRI_K_ROUTER_BIAS,
    COLIBRI_K_SHARED_W1, COLIBRI_K_SHARED_W3, COLIBRI_K_SHARED_W2, COLIBRI_K_SHARED_GATE,
    COLIBRI_K_ATTN_GATE, COLIBRI_K_DN_QKV, COLIBRI_K_DN_Z, COLIBRI_K_DN_B, COLIBRI_K_DN_A,
    COLIBRI_K_DN_CONV, COLIBRI_K_DN_A_LOG, COLIBRI_K_DN_DT_BIAS, COLIBRI_K_DN_NORM, COLIBRI_K_DN_OUT,
};

static colibri_status check_complete(struct colibri_model *m, char *why, size_t len) {
    colibri_status s;
    if ((s = require(m, &m->tok_embed, COLIBRI_K_TOK_EMBED, -1, -1, why, len)) ||
        (s = require(m, &m->output_norm, COLIBRI_K_OUTPUT_NORM, -1, -1, why, len)) ||
        (s = require(m, &m->lm_head, COLIBRI_K_LM_HEAD, -1, -1, why, len)))
        return s;
    for (uint32_t i = 0; i < m->n_layers; i++) {
        colibri_layer *l = &m->layers[i];
        int li = (int)i;
        for (size_t k = 0; k < sizeof layer_tensor_kinds / sizeof layer_tensor_kinds[0]; k++) {
            uint32_t kind = layer_tensor_kinds[k];
            if ((s = require(m, slot_for(m, kind, i, 0), kind, li, -1, why, len))) return s;
        }
        for (uint32_t e = 0; e < m->num_experts; e++)
            if ((s = require(m, &l->w1[e], COLIBRI_K_EXPERT_W1, li, (int)e, why, len)) ||
                (s = require(m, &l->w3[e], COLIBRI_K_EXPERT_W3, li, (int)e, why, len)) ||
                (s = require(m, &l->w2[e], COLIBRI_K_EXPERT_W2, li, (int)e, why, len)) ||
                (s = require(m, &l->b1[e], COLIBRI_K_EXPERT_B1, li, (int)e, why, len)) ||
                (s = require(m, &l->b3[e], COLIBRI_K_EXPERT_B3, li, (int)e, why, len)) ||
                (s = require(m, &l->b2[e], COLIBRI_K_EXPERT_B2, li, (int)e, why, len)))
                return s;
    }
    if (m->flags & COLIBRI_FLAG_TIED_EMBEDDINGS) m->lm_head = m->tok_embed;
    return COLIBRI_OK;
}

/* The tokenizer blobs are validated like every other section: a file whose tokenizer is broken
 * is refused; a file without one loads (text calls then say to re-convert it). */
static colibri_status load_tokenizer(struct colibri_model *m, char *why, size_t len) {
    colibri_tokenizer *t = malloc(sizeof *t);
    if (!t) return fail(why, len, COLIBRI_E_NO_MEMORY, "out of memory for the tokenizer");
    colibri_tokenizer_blobs b = {.file_version = m->version};
    colibri_model_meta(m, "tokenizer.config", &b.config, &b.config_len);
    colibri_model_meta(m, "tokenizer.vocab", &b.vocab, &b.vocab_len);
    colibri_model_meta(m, "tokenizer.merges", &b.merges, &b.merges_len);
    colibri_model_meta(m, "tokenizer.added", &b.added, &b.added_len);
    colibri_status s = colibri_tokenizer_load(t, &b, m->vocab_size, why, len);
    if (s == COLIBRI_OK) {
        m->tokenizer = t;
        return COLIBRI_OK;
    }
    free(t);
    if (s == COLIBRI_E_NO_TOKENIZER) {
        if (why && len) why[0] = '\0';
        return COLIBRI_OK;
    }
    return s;
}

static colibri_status validate(struct colibri_model *m, char *why, size_t len) {
    colibri_status s = parse_header(m, m->base, m->size, why, len);
    if (s) return s;
    if ((s = parse_meta(m, why, len))) return s;
    /* per layer at most 19 attention / moe / gpt-oss kinds and 10 Qwen ones (32: a bound),
     * three weights and three biases per expert */
    uint64_t want = (uint64_t)m->n_layers * (32u + 6u * m->num_experts) + 3u;
    if (m->n_tensors > want)
        return fail(why, len, COLIBRI_E_BAD_TENSOR, "n_tensors = %u is more than this geometry has",
                    m->n_tensors);
    m->layers = calloc(m->n_layers, sizeof *m->layers);
    m->expert_views = calloc((size_t)m->n_layers * m->num_experts * 6, sizeof *m->expert_views);
    if (!m->layers || !m->expert_views)
        return fail(why, len, COLIBRI_E_NO_MEMORY, "out of memory for the tensor table");
    for (uint32_t i = 0; i < m->n_layers; i++) {
        colibri_tensor *v = m->expert_views + (size_t)i * m->num_experts * 6;
        size_t e = m->num_experts;
        m->layers[i].w1 = v;
        m->layers[i].w3 = v + e;
        m->layers[i].w2 = v + 2 * e;
        m->layers[i].b1 = v + 3 * e;
        m->layers[i].b3 = v + 4 * e;
        m->layers[i].b2 = v + 5 * e;
    }
    if ((s = parse_layers(m, why, len))) return s;
    if ((s = colibri_rope_setup(&m->rope, m->head_dim, m->rope_theta,
                                (m->flags & COLIBRI_FLAG_ROPE_YARN) ? &m->yarn : NULL, why, len)))
        return s;
    for (uint32_t i = 0; i < m->n_tensors; i++)
        if ((s = parse_record(m, m->base + COLIBRI_HEADER_SIZE + (size_t)i * COLIBRI_RECORD_SIZE, i,
                              why, len)))
            return s;
    if ((s = check_complete(m, why, len))) return s;
    return load_tokenizer(m, why, len);
}

colibri_status colibri_model_from_memory(struct colibri_model *m, const void *buf, size_t len,
                                         char *why, size_t why_len) {
    memset(m, 0, sizeof *m);
    if (!buf || ((uintptr_t)buf % 64) != 0)
        return fail(why, why_len, COLIBRI_E_INVALID_ARG, "model buffer must be 64-byte aligned");
    m->base = buf;
    m->size = len;
    colibri_status s = validate(m, why, why_len);
    if (s) colibri_model_close(m);
    return s;
}

colibri_status colibri_model_open(struct colibri_model *m, const char *path, char *why,
                                  size_t why_len) {
    memset(m, 0, sizeof *m);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return fail(why, why_len, COLIBRI_E_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return fail(why, why_len, COLIBRI_E_IO, "%s is not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    if (size < COLIBRI_HEADER_SIZE) {
        close(fd);
        return fail(why, why_len, COLIBRI_E_TRUNCATED,
                    "%s is %zu bytes, shorter than the 256-byte header (truncated?)", path, size);
    }
    void *p = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (p == MAP_FAILED)
        return fail(why, why_len, COLIBRI_E_IO, "cannot mmap %s: %s", path, strerror(errno));
    /* start reading the weights in ahead of the first forward (asynchronous, advisory) */
    (void)madvise(p, size, MADV_WILLNEED);
    m->base = p;
    m->size = size;
    m->mapped = 1;
    colibri_status s = validate(m, why, why_len);
    if (s) colibri_model_close(m);
    return s;
}

void colibri_model_close(struct colibri_model *m) {
    if (m->mapped && m->base) munmap((void *)m->base, m->size);
    if (m->q4_packed) munmap(m->q4_packed, m->q4_packed_bytes); /* cpu/q4_pack.c's copy */
    free(m->layers);
    free(m->expert_views);
    colibri_rope_free(&m->rope);
    if (m->tokenizer) colibri_tokenizer_free(m->tokenizer);
    free(m->tokenizer);
    memset(m, 0, sizeof *m);
}
