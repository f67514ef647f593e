/* A completion on its request thread (docs/serve.md, "Endpoints", "Text"): the body as JSON, the
 * OpenAI request, a slot (or a place in the queue), the prompt's text tokenized on that slot,
 * generation, and the answer or its SSE events. The body is complete when it is called. */
#ifndef COLIBRI_SERVE_COMPLETION_H
#define COLIBRI_SERVE_COMPLETION_H

#include "conn.h"

void completion_serve(conn *c, int chat);

#endif
