/* The harmony response format of gpt-oss (openai-harmony, docs/runtime.md "Reasoning output"):
 * the model's output is a sequence of messages
 *
 *     [<|start|>ROLE] HEADER <|message|> CONTENT (<|end|> | <|return|> | <|call|>)
 *
 * where HEADER holds <|channel|>NAME, an optional " to=RECIPIENT" and a content type. The prompt
 * ends with "<|start|>assistant", so the output begins inside the first header. This parser
 * reads token ids (the markers are special tokens the text decoder skips) and says, per id,
 * what it is; the caller decodes each message's content ids. It follows openai-harmony's
 * StreamableParser (its header parsing rules included) on well-formed output; where that parser
 * raises (text outside a message, a header that never ends) this one skips the tokens: a
 * generation never fails on what the model wrote. Fixed size, no allocation. */
#ifndef COLIBRI_HARMONY_H
#define COLIBRI_HARMONY_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"
#include "tokenizer.h"

typedef struct {
    int32_t start, end, message, channel, constrain, ret, call;
} colibri_harmony_ids;

/* The ids of the harmony markers in the model's tokenizer (its added tokens). -1 when one is
 * missing (the model is not a harmony model). */
int colibri_harmony_ids_of(const colibri_tokenizer *t, colibri_harmony_ids *ids);

enum { COLIBRI_HARMONY_HEADER = 0, COLIBRI_HARMONY_CONTENT = 1, COLIBRI_HARMONY_EXPECT_START = 2,
       COLIBRI_HARMONY_DONE = 3 };

/* what one id was */
typedef enum {
    COLIBRI_HEV_SKIP = 0,    /* a header token or a marker; nothing to show */
    COLIBRI_HEV_BEGIN = 1,   /* <|message|>: the header is parsed, content follows */
    COLIBRI_HEV_CONTENT = 2, /* a token of the current message's content */
    COLIBRI_HEV_END = 3,     /* <|end|>: the message is complete, another may follow */
    COLIBRI_HEV_STOP = 4     /* <|return|> or <|call|>: the message and the output end */
} colibri_harmony_event;

typedef struct {
    colibri_harmony_ids ids;
    int state, role_given, n_messages;
    char header[512];       /* the header's text so far (markers as their text) */
    size_t header_len;
    int header_overflow;
    char role[16], channel[32], recipient[128], content_type[64];
} colibri_harmony;

/* After a prompt that ends in "<|start|>assistant": in the header, the role known. */
void colibri_harmony_init(colibri_harmony *h, const colibri_harmony_ids *ids);
/* piece: the token's bytes (colibri_tokenizer_piece), used for the header text. */
colibri_harmony_event colibri_harmony_push(colibri_harmony *h, int32_t id, const char *piece,
                                           size_t piece_len);
/* What the current (or last) message's content is for a reader: the analysis channel is
 * reasoning, a message with a recipient a tool call, anything else content. */
colibri_text_kind colibri_harmony_kind(const colibri_harmony *h);

#endif
