/* Warm prompts (docs/serve.md, "Prompt prefix cache"): prompts computed at start-up, before the
 * ready line, and kept pinned in the prefix cache, so the first request after a deploy or a
 * restart that starts with one does not compute it. A chat system prompt (--warm-system, or
 * {"system": TEXT} in --warm-prompts-b64: the profile's service.warm_prompts as the unit passes
 * them) warms the chat template's head with that system message, up to where the user's text
 * starts; a completion prompt (--warm-prompt, {"prompt": TEXT}) its ids as the completions
 * endpoint tokenizes them. */
#ifndef COLIBRI_SERVE_WARM_H
#define COLIBRI_SERVE_WARM_H

#include "service.h"

/* Compute every warm prompt of S->o (decoding --warm-prompts-b64 first). 0, or -1 after one
 * line on stderr saying which prompt and why (the service then does not start). */
int warm_run(server *S, int *prompts, int *tokens);

#endif
