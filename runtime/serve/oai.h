/* OpenAI-compatible request decoding and error bodies for the service (server.c).
 *
 * oai_decode turns a parsed JSON body of POST /v1/completions or /v1/chat/completions into an
 * oai_request, checking every field's type and range. Unknown top-level fields, unknown fields
 * inside a message or stream_options, and options this runtime cannot honour (n > 1, echo,
 * logprobs, best_of, suffix, penalties, logit_bias) are refused with 400 and the parameter's
 * name, in OpenAI's error shape, so a client never silently gets something other than what it
 * asked for. One extension: "deadline_ms" (docs/serve.md, "Deadlines"). Pure functions over the
 * document: fuzzed with the HTTP parser (fuzz_http.c). */
#ifndef COLIBRI_OAI_H
#define COLIBRI_OAI_H

#include <stddef.h>
#include <stdint.h>

#include "json.h"

#define OAI_MAX_STOP 4
#define OAI_MAX_DEADLINE_MS 86400000.0  /* a day: beyond that a deadline is a typo */
#define OAI_MAX_MESSAGES 256

typedef struct {
    const char *role;      /* "system", "developer", "user" or "assistant" */
    const char *content;   /* NUL-terminated; text parts joined */
    size_t content_len;
    int has_reasoning;     /* a non-empty "reasoning_content" came with it (assistant) */
} oai_message;

typedef struct {
    int chat;
    const char *model;
    /* completions: the prompt as token ids (ids != NULL) or as text (text != NULL) */
    int32_t *ids;
    int n_ids;
    const char *text;
    size_t text_len;
    /* chat */
    oai_message *messages;
    int n_messages;
    char *joined;          /* owned storage for content given as text parts */
    long long max_tokens;  /* -1 when not given */
    double temperature;    /* default 1.0 (OpenAI's) */
    double top_p;          /* default 1.0 */
    uint64_t seed;
    int seed_set;
    int stream, include_usage;
    const char *stop[OAI_MAX_STOP];
    size_t stop_len[OAI_MAX_STOP];
    int n_stop;
    double deadline_ms;    /* colibri extension: the answer's time budget in ms from arrival; -1 none */
    /* chat, for the template (docs/serve.md "Reasoning models") */
    const char *reasoning_effort; /* NULL, "low", "medium" or "high" */
    int enable_thinking;   /* -1: not given; chat_template_kwargs.enable_thinking */
    /* set when the chat is rendered: how the model's output splits */
    int reasoning;         /* a colibri_reasoning_format (oai.c stays apart from the runtime) */
    int starts_in_reasoning;
} oai_request;

typedef struct {
    int status;            /* HTTP status */
    const char *type;      /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code;      /* NULL or e.g. "context_length_exceeded", "model_not_found" */
    char param[48];        /* "" or the offending parameter */
    char message[320];
} oai_error;

void oai_set_error(oai_error *e, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) __attribute__((format(printf, 6, 7)));

/* 0 when rq is filled (release with oai_request_free), -1 with e filled (status 400). */
int oai_decode(const json_doc *doc, int chat, oai_request *rq, oai_error *e);
void oai_request_free(oai_request *rq);

/* {"error": {"message", "type", "param", "code"}} */
void oai_error_json(json_buf *b, const oai_error *e);

#endif
