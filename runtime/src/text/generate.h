/* The generation loop (colibri.h, "Generation"): internals the tests reach. */
#ifndef COLIBRI_GENERATE_H
#define COLIBRI_GENERATE_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"
#include "harmony.h"

/* Bytes at the end of text[0..len) that form an incomplete UTF-8 character (0..3). */
size_t colibri_utf8_incomplete_tail(const char *text, size_t len);

/* Longest k < strlen(stop) with text ending in stop's first k bytes (a stop string that may
 * still complete with the next token). */
size_t colibri_stop_prefix_tail(const char *text, size_t len, const char *stop);

/* Copy in[0..n) to out replacing each maximal invalid UTF-8 subpart by U+FFFD (as Python's
 * bytes.decode("utf-8", "replace") and Rust's from_utf8_lossy, which `tokenizers` uses). out
 * must hold 3 * n bytes. Returns the bytes written. */
size_t colibri_utf8_sanitize(const char *in, size_t n, char *out);

/* The output side of colibri_generate, apart so that a test can feed it ids without a model
 * forward (runtime/tests/chat_driver.c): each generated id in, text out through the params'
 * callbacks, split by p->reasoning. */
enum { THINK_START = 0, THINK_REASONING = 1, THINK_CONTENT = 2 };

typedef struct {
    const colibri_generate_params *p;
    const int32_t *ids;        /* the generated ids (the caller appends, then pushes) */
    int n_ids, seg;            /* ids pushed; where the current text segment starts */
    char *text;                /* the segment's decoded text */
    size_t cap, len, emitted;
    char *clean, *content;     /* a piece with invalid UTF-8 replaced; a step's content text */
    size_t clean_cap, content_cap, content_len;
    int oom, stopped, in_message;
    colibri_detok_fn raw;      /* harmony: decode keeping special tokens (openai-harmony's way) */
    void *raw_user;
    const struct colibri_tokenizer *tok;
    colibri_harmony harmony;
    int think_state, think_skip_nl;
    size_t think_pos;
} colibri_out;

/* ctx: needed for harmony (the tokenizer's marker ids); ids: where the caller keeps the
 * generated ids (ids[k] set before the k-th push). */
colibri_status colibri_out_begin(colibri_out *o, colibri_ctx *ctx, const colibri_generate_params *p,
                                 int32_t *ids, char *why, size_t why_len);
/* One more id (already in ids). Returns non-zero to stop: a callback cancelled, or out of
 * memory (o->oom); *stop_string: the stop string that appeared, else -1; o->stopped: harmony's
 * <|return|> / <|call|>. */
int colibri_out_push(colibri_out *o, int32_t id, int *stop_string);
/* The end of the output: what was held back is final. */
void colibri_out_end(colibri_out *o);
void colibri_out_free(colibri_out *o);

/* gen_batch.c: one step of the generations on eng (an engine's context, or colibri_generate's
 * context running itself; cuda: each its own pass on its CUDA context); prompt_rows:
 * colibri_engine_set_prompt_rows's value (0: no cap). */
colibri_status colibri_gen_step_on(struct colibri_ctx *eng, int cuda, int prompt_rows,
                                   colibri_gen *const *gens, int n);
double colibri_now_ms(void);

#endif
