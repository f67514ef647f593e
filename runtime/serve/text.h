/* Text for the service: a request's text prompt or chat messages -> token ids, and the ids of an
 * answer -> its text, through the model's own tokenizer and chat template (colibri.h, "Text").
 *
 * These run on the context of the slot the request holds (slots.c), so a request's tokenizing
 * costs CPU only inside a slot: `--slots` bounds how many run at once, and a client that leaves
 * while queued never gets its prompt tokenized. */
#ifndef COLIBRI_SERVE_TEXT_H
#define COLIBRI_SERVE_TEXT_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"
#include "oai.h"

/* rq->text -> rq->ids (malloc'd; rq owns them), adding the special tokens the tokenizer adds by
 * default when add_special. 0, or -1 with e set. */
int text_tokenize(const colibri_ctx *ctx, oai_request *rq, int add_special, oai_error *e);

/* rq->messages -> the model's chat template (with the generation prompt) -> rq->ids. The
 * template's text carries its own BOS, so it is tokenized without adding special tokens. A
 * conversation the template refuses is 400 unsupported_conversation. */
int text_render_chat(colibri_ctx *ctx, const colibri_model *model, oai_request *rq, oai_error *e);

/* colibri_detok_fn for the generation loop (user = the slot's colibri_ctx). The tokenizer
 * decodes bytes that are not (yet) UTF-8 to U+FFFD, and such a trailing U+FFFD may become a
 * character with the next token, so the text for more ids would not extend the text for fewer:
 * trailing U+FFFD are held back here (slot_generate sends them at the end), so the text the loop
 * sees only ever grows. */
size_t text_detok(void *user, const int32_t *ids, int n, char *out, size_t cap);

/* The whole text of ids (malloc'd in *out, length returned; *out NULL on failure). */
size_t text_full(const colibri_ctx *ctx, const int32_t *ids, int n, char **out);

#endif
