/* Chat templates (colibri.h, "Chat"): rendering from a `chat.template` blob. */
#ifndef COLIBRI_CHAT_H
#define COLIBRI_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "colibri.h"

/* Render with a raw blob (the model's "chat.template" metadata); the tests and fuzzers use it. */
colibri_status colibri_chat_render_blob(const uint8_t *blob, size_t blob_len,
                                        const colibri_chat_message *msgs, int n,
                                        int add_generation_prompt, char *out, size_t cap,
                                        size_t *len, char *why, size_t why_len);
/* The same with options (opt NULL: colibri_default_chat_options). */
colibri_status colibri_chat_render_blob_ex(const uint8_t *blob, size_t blob_len,
                                           const colibri_chat_message *msgs, int n,
                                           const colibri_chat_options *opt, char *out, size_t cap,
                                           size_t *len, char *why, size_t why_len);

#endif
