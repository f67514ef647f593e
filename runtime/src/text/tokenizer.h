/* The model's tokenizer (format version 2, the `tokenizer.*` metadata blobs; docs/format.md and
 * docs/runtime.md "Tokenizer"). Built once when the model is loaded, immutable afterwards: every
 * function below only reads it, so any number of threads may encode and decode with one loaded
 * model at the same time (each call allocates its own scratch memory).
 *
 * Two families, reproducing the `tokenizers` library's ids exactly:
 *   byte-level BPE (Qwen2/Qwen3-MoE, Qwen3.5, gpt-oss's o200k, OLMoE): NFC or none, the model's
 *   pre-tokenizer regex, BPE on bytes;
 *   SentencePiece-style BPE (Mixtral/Llama): "▁" for spaces, BPE on characters, byte fallback;
 *   from a tokenizer.model alone, SentencePiece's own ids (merges by score, ties leftmost).
 * Added/special tokens are matched before anything else (leftmost, then longest). */
#ifndef COLIBRI_TOKENIZER_H
#define COLIBRI_TOKENIZER_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"


/* tokenizer.config words (colibri_kit/model/tokenizer.py writes them) */
enum { COLIBRI_TOK_MODEL_BYTE_BPE = 1, COLIBRI_TOK_MODEL_SP_BPE = 2 };
/* NORM_SP_MODEL: SentencePiece's normalizer of a tokenizer.model (identity rules): "▁" before the
 * text, spaces -> "▁", each invalid UTF-8 byte -> U+FFFD */
enum { COLIBRI_TOK_NORM_NONE = 0, COLIBRI_TOK_NORM_NFC = 1, COLIBRI_TOK_NORM_SP = 2,
       COLIBRI_TOK_NORM_SP_MODEL = 3 };
/* LLAMA3: the Qwen2 (digits 1) and Llama-3 (digits 3) regexes; O200K: gpt-oss; QWEN35: Qwen3.5 */
enum { COLIBRI_TOK_PRE_NONE = 0, COLIBRI_TOK_PRE_GPT2 = 1, COLIBRI_TOK_PRE_LLAMA3 = 2,
       COLIBRI_TOK_PRE_METASPACE = 3, COLIBRI_TOK_PRE_O200K = 4, COLIBRI_TOK_PRE_QWEN35 = 5 };
/* Metaspace prepend_scheme (config word 4 with COLIBRI_TOK_PRE_METASPACE) */
enum { COLIBRI_TOK_META_ALWAYS = 1, COLIBRI_TOK_META_FIRST = 2, COLIBRI_TOK_META_NEVER = 3 };
enum { COLIBRI_TOK_DEC_BYTE_LEVEL = 1, COLIBRI_TOK_DEC_SP = 2 };
enum {
    COLIBRI_TOK_F_BYTE_FALLBACK = 1, COLIBRI_TOK_F_FUSE_UNK = 2, COLIBRI_TOK_F_ADD_BOS = 4,
    COLIBRI_TOK_F_ADD_EOS = 8, COLIBRI_TOK_F_IGNORE_MERGES = 16,
    /* merges carry their rank (16-byte entries), ranks may repeat: equal ranks merge leftmost
     * first (SentencePiece's equal scores) */
    COLIBRI_TOK_F_RANKED_MERGES = 32
};
enum { COLIBRI_TOK_A_SPECIAL = 1, COLIBRI_TOK_A_LSTRIP = 2, COLIBRI_TOK_A_RSTRIP = 4,
       COLIBRI_TOK_A_NORMALIZED = 8 };
enum { COLIBRI_TOK_V_IN_MODEL = 1, COLIBRI_TOK_V_BYTE = 2, COLIBRI_TOK_V_ADDED = 4,
       COLIBRI_TOK_V_SPECIAL = 8 };
#define COLIBRI_TOK_CONFIG_WORDS 24u
#define COLIBRI_TOK_MAX_PIECE 1024u
#define COLIBRI_TOK_NO_ID 0xFFFFFFFFu

typedef struct {
    uint32_t id, flags, len;
    const uint8_t *text;
} colibri_added_token;

/* a node of the added tokens' byte trie: first child, next sibling, the added token ending
 * here (index into added[], -1 none) for non-normalized [0] and normalized [1] tokens */
typedef struct {
    uint32_t child, sibling;
    int32_t tok[2];
    uint8_t byte;
} colibri_added_node;

typedef struct colibri_tokenizer {
    uint32_t model, normalizer, pretok, digits, decoder, flags, strip;
    uint32_t unk_id, bos_id, eos_id, pad_id;
    uint32_t n_vocab, n_merges, n_added, n_stop;
    uint32_t *vocab_off;          /* n_vocab + 1 offsets into vocab_bytes */
    const uint8_t *vocab_flags;   /* n_vocab (in the mapping) */
    const uint8_t *vocab_bytes;   /* in the mapping */
    uint32_t *stop_ids;
    colibri_added_token *added;   /* in file order */
    colibri_added_node *trie;     /* the added tokens' bytes, [1, n_nodes) */
    uint32_t n_nodes;
    uint32_t trie_root[256];      /* node of the first byte b of some added token, 0 = none */
    uint32_t byte_id[256];        /* id of the piece that is byte b (byte-level) or <0xBB> (SP) */
    /* open-addressing hash tables, built at load */
    uint64_t *merge_key;          /* (left << 32 | right) + 1, 0 = empty */
    uint32_t *merge_rank, *merge_new;
    uint32_t merge_mask;
    uint32_t *vocab_slot;         /* id + 1 of model-vocabulary pieces, 0 = empty */
    uint32_t vocab_mask;
} colibri_tokenizer;

/* The tokenizer.* blobs of a model file (docs/format.md), as the model loader found them in its
 * metadata section: NULL (and 0) for an absent blob. The tokenizer reads nothing else of the
 * model, so it depends on the loader only through this struct. */
typedef struct {
    const uint8_t *config, *vocab, *merges, *added;
    size_t config_len, vocab_len, merges_len, added_len;
    uint32_t file_version; /* for the message when the file has no tokenizer */
} colibri_tokenizer_blobs;

/* Validate the blobs (vocabulary size <= vocab_limit) and build `t`.
 * COLIBRI_E_NO_TOKENIZER when the file has none (version 1, or converted without one). */
colibri_status colibri_tokenizer_load(colibri_tokenizer *t, const colibri_tokenizer_blobs *b,
                                      uint32_t vocab_limit, char *why, size_t why_len);
void colibri_tokenizer_free(colibri_tokenizer *t);

/* Text -> ids. `add_special`: add BOS/EOS as the model's tokenizer does. Writes at most `cap` ids
 * and sets *n_out to the number the text needs (COLIBRI_E_BUFFER_TOO_SMALL when > cap).
 * Any bytes are accepted: invalid UTF-8 goes through the byte rules (docs/runtime.md). */
colibri_status colibri_tokenizer_encode(const colibri_tokenizer *t, const char *text, size_t len,
                                        int add_special, int32_t *ids, size_t cap, size_t *n_out);
/* Ids -> text, as the `tokenizers` library decodes (invalid UTF-8 becomes U+FFFD). Writes at
 * most `cap` bytes (no NUL added) and sets *len_out to the full length. */
colibri_status colibri_tokenizer_decode(const colibri_tokenizer *t, const int32_t *ids, size_t n,
                                        int skip_special, char *out, size_t cap, size_t *len_out);
/* The raw bytes one token stands for (streaming: join them and cut only at UTF-8 boundaries).
 * SentencePiece "▁" is a space; a byte-fallback token is its byte. */
colibri_status colibri_tokenizer_piece(const colibri_tokenizer *t, int32_t id, char *out,
                                       size_t cap, size_t *len_out);

/* Unicode tables (unicode_tables.c, generated) */
extern const char colibri_unicode_version[];     /* of the character classes */
extern const char colibri_unicode_nfc_version[]; /* of the NFC data */
extern const uint8_t colibri_uc_records[][2];
extern const uint16_t colibri_uc_stage1[];
extern const uint8_t colibri_uc_stage2[];
extern const uint32_t colibri_uc_ndecomp, colibri_uc_ncomp;
extern const uint32_t colibri_uc_decomp[][3];
extern const uint32_t colibri_uc_decomp_pool[];
extern const uint64_t colibri_uc_comp[][2];

#endif
