/* OpenAI request decoding and error bodies (oai.h). */
#include "oai.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void oai_set_error(oai_error *e, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) {
    e->status = status;
    e->type = type;
    e->code = code;
    snprintf(e->param, sizeof e->param, "%s", param ? param : "");
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
}

void oai_error_json(json_buf *b, const oai_error *e) {
    jb_puts(b, "{\"error\": {\"message\": ");
    jb_cstr(b, e->message);
    jb_puts(b, ", \"type\": ");
    jb_cstr(b, e->type ? e->type : "invalid_request_error");
    jb_puts(b, ", \"param\": ");
    if (e->param[0]) jb_cstr(b, e->param);
    else jb_puts(b, "null");
    jb_puts(b, ", \"code\": ");
    if (e->code) jb_cstr(b, e->code);
    else jb_puts(b, "null");
    jb_puts(b, "}}");
}

static int bad(oai_error *e, const char *param, const char *fmt, const char *detail) {
    char msg[256];
    snprintf(msg, sizeof msg, fmt, detail);
    oai_set_error(e, 400, "invalid_request_error", NULL, param, "%s", msg);
    return -1;
}

static int wrong_type(oai_error *e, const json_doc *d, int node, const char *param, const char *want) {
    oai_set_error(e, 400, "invalid_request_error", NULL, param, "'%s' must be %s, not %s", param,
                  want, json_type_name(d->nodes[node].type));
    return -1;
}

static int get_number(const json_doc *d, int node, const char *param, double lo, double hi,
                      double *out, oai_error *e) {
    if (d->nodes[node].type != JSON_NUMBER) return wrong_type(e, d, node, param, "a number");
    double v = d->nodes[node].num;
    if (v < lo || v > hi) {
        oai_set_error(e, 400, "invalid_request_error", NULL, param, "'%s' must be between %g and %g",
                      param, lo, hi);
        return -1;
    }
    *out = v;
    return 0;
}

static int get_bool(const json_doc *d, int node, const char *param, int *out, oai_error *e) {
    json_type t = d->nodes[node].type;
    if (t != JSON_TRUE && t != JSON_FALSE) return wrong_type(e, d, node, param, "a boolean");
    *out = t == JSON_TRUE;
    return 0;
}

/* prompt: a string, an array of token ids, or a one-element array of either. */
static int decode_prompt(const json_doc *d, int node, oai_request *rq, oai_error *e) {
    const json_node *p = &d->nodes[node];
    if (p->type == JSON_STRING) {
        rq->text = p->str;
        rq->text_len = p->len;
        return 0;
    }
    if (p->type != JSON_ARRAY)
        return wrong_type(e, d, node, "prompt", "a string or an array of token ids");
    if (p->count == 0) return bad(e, "prompt", "'prompt' must not be empty%s", "");
    const json_node *first = &d->nodes[p->child];
    if (first->type == JSON_STRING || first->type == JSON_ARRAY) {
        if (p->count != 1)
            return bad(e, "prompt", "only one prompt per request is supported (got a batch)%s", "");
        return decode_prompt(d, p->child, rq, e);
    }
    rq->ids = malloc((size_t)p->count * sizeof *rq->ids);
    if (!rq->ids) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    int i = 0;
    for (int k = p->child; k != JSON_NONE; k = d->nodes[k].next) {
        long long v;
        if (!json_int(d, k, 0, INT32_MAX, &v))
            return bad(e, "prompt", "'prompt' token ids must be integers >= 0%s", "");
        rq->ids[i++] = (int32_t)v;
    }
    rq->n_ids = i;
    return 0;
}

static int decode_stop(const json_doc *d, int node, oai_request *rq, oai_error *e) {
    const json_node *s = &d->nodes[node];
    if (s->type == JSON_NULL) return 0;
    if (s->type == JSON_STRING) {
        if (s->len == 0) return bad(e, "stop", "'stop' strings must not be empty%s", "");
        rq->stop[0] = s->str;
        rq->stop_len[0] = s->len;
        rq->n_stop = 1;
        return 0;
    }
    if (s->type != JSON_ARRAY) return wrong_type(e, d, node, "stop", "a string or an array of strings");
    if (s->count > OAI_MAX_STOP) return bad(e, "stop", "at most 4 'stop' sequences%s", "");
    for (int k = s->child; k != JSON_NONE; k = d->nodes[k].next) {
        if (d->nodes[k].type != JSON_STRING || d->nodes[k].len == 0)
            return bad(e, "stop", "'stop' must hold non-empty strings%s", "");
        rq->stop[rq->n_stop] = d->nodes[k].str;
        rq->stop_len[rq->n_stop++] = d->nodes[k].len;
    }
    return 0;
}

static int decode_stream_options(const json_doc *d, int node, oai_request *rq, oai_error *e) {
    if (d->nodes[node].type == JSON_NULL) return 0;
    if (d->nodes[node].type != JSON_OBJECT) return wrong_type(e, d, node, "stream_options", "an object");
    for (int k = d->nodes[node].child; k != JSON_NONE; k = d->nodes[d->nodes[k].next].next) {
        int v = d->nodes[k].next;
        if (!strcmp(d->nodes[k].str, "include_usage")) {
            if (get_bool(d, v, "stream_options.include_usage", &rq->include_usage, e)) return -1;
        } else {
            return bad(e, "stream_options", "unknown field in 'stream_options': '%s'", d->nodes[k].str);
        }
    }
    return 0;
}

/* content: a string, or an array of {"type": "text", "text": "..."} parts (joined). */
static int decode_content(const json_doc *d, int node, oai_request *rq, oai_message *m, size_t *used,
                          oai_error *e) {
    const json_node *c = &d->nodes[node];
    if (c->type == JSON_STRING) {
        m->content = c->str;
        m->content_len = c->len;
        return 0;
    }
    if (c->type == JSON_NULL && !strcmp(m->role, "assistant")) {
        m->content = "";
        return 0;
    }
    if (c->type != JSON_ARRAY) return wrong_type(e, d, node, "messages.content", "a string or an array of text parts");
    char *out = rq->joined + *used;
    size_t k = 0;
    for (int part = c->child; part != JSON_NONE; part = d->nodes[part].next) {
        if (d->nodes[part].type != JSON_OBJECT) return bad(e, "messages.content", "content parts must be objects%s", "");
        int type = JSON_NONE, text = JSON_NONE;
        for (int f = d->nodes[part].child; f != JSON_NONE; f = d->nodes[d->nodes[f].next].next) {
            const char *name = d->nodes[f].str;
            if (!strcmp(name, "type")) type = d->nodes[f].next;
            else if (!strcmp(name, "text")) text = d->nodes[f].next;
            else return bad(e, "messages.content", "unknown field in a content part: '%s'", name);
        }
        if (type == JSON_NONE || d->nodes[type].type != JSON_STRING || strcmp(d->nodes[type].str, "text"))
            return bad(e, "messages.content", "only content parts of type 'text' are supported%s", "");
        if (text == JSON_NONE || d->nodes[text].type != JSON_STRING)
            return bad(e, "messages.content", "a text part needs a string 'text'%s", "");
        memcpy(out + k, d->nodes[text].str, d->nodes[text].len);
        k += d->nodes[text].len;
    }
    out[k] = '\0';
    m->content = out;
    m->content_len = k;
    *used += k + 1;
    return 0;
}

static int decode_messages(const json_doc *d, int node, oai_request *rq, oai_error *e) {
    const json_node *a = &d->nodes[node];
    if (a->type != JSON_ARRAY) return wrong_type(e, d, node, "messages", "an array");
    if (a->count == 0) return bad(e, "messages", "'messages' must not be empty%s", "");
    if (a->count > OAI_MAX_MESSAGES) return bad(e, "messages", "at most 256 messages%s", "");
    rq->messages = calloc((size_t)a->count, sizeof *rq->messages);
    /* joined text parts never exceed the document's total string bytes */
    rq->joined = malloc(d->slen + 1);
    if (!rq->messages || !rq->joined) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    size_t used = 0;
    for (int k = a->child; k != JSON_NONE; k = d->nodes[k].next) {
        if (d->nodes[k].type != JSON_OBJECT) return bad(e, "messages", "each message must be an object%s", "");
        oai_message *m = &rq->messages[rq->n_messages];
        int role = JSON_NONE, content = JSON_NONE;
        for (int f = d->nodes[k].child; f != JSON_NONE; f = d->nodes[d->nodes[f].next].next) {
            const char *name = d->nodes[f].str;
            int v = d->nodes[f].next;
            if (!strcmp(name, "role")) role = v;
            else if (!strcmp(name, "content")) content = v;
            else if (!strcmp(name, "name")) {
                if (d->nodes[v].type != JSON_STRING) return wrong_type(e, d, v, "messages.name", "a string");
            } else if (!strcmp(name, "reasoning_content")) {
                /* what this server returned as reasoning, sent back with the history: the
                 * templates drop it from earlier turns (checked against the role below) */
                if (d->nodes[v].type == JSON_NULL) continue;
                if (d->nodes[v].type != JSON_STRING)
                    return wrong_type(e, d, v, "messages.reasoning_content", "a string");
                m->has_reasoning = d->nodes[v].len > 0;
            } else return bad(e, "messages", "unknown field in a message: '%s'", name);
        }
        if (role == JSON_NONE || d->nodes[role].type != JSON_STRING)
            return bad(e, "messages.role", "each message needs a string 'role'%s", "");
        const char *r = d->nodes[role].str;
        if (strcmp(r, "system") && strcmp(r, "developer") && strcmp(r, "user") && strcmp(r, "assistant"))
            return bad(e, "messages.role", "unsupported role '%s' (system, developer, user, assistant)", r);
        m->role = r;
        if (content == JSON_NONE) return bad(e, "messages.content", "each message needs 'content'%s", "");
        if (decode_content(d, content, rq, m, &used, e)) return -1;
        if (m->has_reasoning && strcmp(r, "assistant"))
            return bad(e, "messages.reasoning_content", "only assistant messages carry 'reasoning_content'%s", "");
        rq->n_messages++;
    }
    /* the chat templates put reasoning back only into a final assistant turn, which colibri's
     * stored templates cannot: refuse rather than drop it silently */
    if (rq->n_messages && rq->messages[rq->n_messages - 1].has_reasoning)
        return bad(e, "messages.reasoning_content", "'reasoning_content' in the last message (an "
                   "assistant turn to continue) is not supported; send it in earlier turns only%s", "");
    return 0;
}

static int decode_effort(const json_doc *d, int v, const char *param, oai_request *rq, oai_error *e) {
    if (d->nodes[v].type == JSON_NULL) return 0;
    const char *s = d->nodes[v].type == JSON_STRING ? d->nodes[v].str : NULL;
    if (!s || (strcmp(s, "low") && strcmp(s, "medium") && strcmp(s, "high")))
        return bad(e, param, "'%s' must be \"low\", \"medium\" or \"high\"", param);
    rq->reasoning_effort = s;
    return 0;
}

/* vLLM's chat_template_kwargs: the template variables colibri's stored templates know */
static int decode_template_kwargs(const json_doc *d, int v, oai_request *rq, oai_error *e) {
    if (d->nodes[v].type == JSON_NULL) return 0;
    if (d->nodes[v].type != JSON_OBJECT) return wrong_type(e, d, v, "chat_template_kwargs", "an object");
    for (int f = d->nodes[v].child; f != JSON_NONE; f = d->nodes[d->nodes[f].next].next) {
        const char *name = d->nodes[f].str;
        int x = d->nodes[f].next;
        if (!strcmp(name, "enable_thinking")) {
            if (d->nodes[x].type == JSON_NULL) continue;
            if (d->nodes[x].type != JSON_TRUE && d->nodes[x].type != JSON_FALSE)
                return wrong_type(e, d, x, "chat_template_kwargs.enable_thinking", "a boolean");
            rq->enable_thinking = d->nodes[x].type == JSON_TRUE;
        } else if (!strcmp(name, "reasoning_effort")) {
            if (decode_effort(d, x, "chat_template_kwargs.reasoning_effort", rq, e)) return -1;
        } else {
            return bad(e, "chat_template_kwargs", "unsupported template variable '%s' (enable_thinking, "
                       "reasoning_effort)", name);
        }
    }
    return 0;
}

/* A field this runtime accepts only at its neutral value (so nothing is silently ignored). */
static int neutral_only(const json_doc *d, int v, const char *name, oai_error *e) {
    const json_node *n = &d->nodes[v];
    int neutral = n->type == JSON_NULL;
    if (!strcmp(name, "n") || !strcmp(name, "best_of")) neutral |= n->type == JSON_NUMBER && n->num == 1;
    else if (!strcmp(name, "echo") || !strcmp(name, "logprobs")) neutral |= n->type == JSON_FALSE;
    else if (!strcmp(name, "presence_penalty") || !strcmp(name, "frequency_penalty"))
        neutral |= n->type == JSON_NUMBER && n->num == 0;
    else if (!strcmp(name, "logit_bias")) neutral |= n->type == JSON_OBJECT && n->count == 0;
    if (!neutral)
        return bad(e, name, "'%s' is not supported by this server (only its default)", name);
    return 0;
}

int oai_decode(const json_doc *d, int chat, oai_request *rq, oai_error *e) {
    memset(rq, 0, sizeof *rq);
    rq->chat = chat;
    rq->max_tokens = -1;
    rq->deadline_ms = -1;
    rq->enable_thinking = -1;
    rq->temperature = 1.0;
    rq->top_p = 1.0;
    if (d->n == 0 || d->nodes[0].type != JSON_OBJECT)
        return bad(e, NULL, "the request body must be a JSON object%s", "");
    int have_input = 0;
    for (int k = d->nodes[0].child; k != JSON_NONE; k = d->nodes[d->nodes[k].next].next) {
        const char *name = d->nodes[k].str;
        int v = d->nodes[k].next;
        int rc = 0;
        if (!strcmp(name, "model")) {
            if (d->nodes[v].type != JSON_STRING) return wrong_type(e, d, v, "model", "a string");
            rq->model = d->nodes[v].str;
        } else if (!chat && !strcmp(name, "prompt")) {
            rc = decode_prompt(d, v, rq, e);
            have_input = 1;
        } else if (chat && !strcmp(name, "messages")) {
            rc = decode_messages(d, v, rq, e);
            have_input = 1;
        } else if (!strcmp(name, "max_tokens") || (chat && !strcmp(name, "max_completion_tokens"))) {
            if (d->nodes[v].type == JSON_NULL) continue;
            long long mt;
            if (!json_int(d, v, 1, 1 << 24, &mt))
                return bad(e, name, "'%s' must be an integer >= 1", name);
            rq->max_tokens = mt;
        } else if (!strcmp(name, "temperature")) {
            if (d->nodes[v].type == JSON_NULL) continue;
            rc = get_number(d, v, "temperature", 0, 2, &rq->temperature, e);
        } else if (!strcmp(name, "top_p")) {
            if (d->nodes[v].type == JSON_NULL) continue;
            rc = get_number(d, v, "top_p", 0, 1, &rq->top_p, e);
            /* the sampler takes a 32-bit float: a value that rounds to 0 there (1e-300) is
             * as much the client's mistake as 0 itself, so 400, not the sampler's 500 */
            if (!rc && (float)rq->top_p <= 0)
                return bad(e, "top_p", "'top_p' must be > 0 and at least 1e-45 (a 32-bit float)%s", "");
        } else if (!strcmp(name, "seed")) {
            if (d->nodes[v].type == JSON_NULL) continue;
            long long s;
            if (!json_int(d, v, INT64_MIN / 2, INT64_MAX / 2, &s))
                return bad(e, "seed", "'seed' must be an integer%s", "");
            rq->seed = (uint64_t)s;
            rq->seed_set = 1;
        } else if (!strcmp(name, "stream")) {
            if (d->nodes[v].type == JSON_NULL) continue;
            rc = get_bool(d, v, "stream", &rq->stream, e);
        } else if (!strcmp(name, "stream_options")) {
            rc = decode_stream_options(d, v, rq, e);
        } else if (!strcmp(name, "stop")) {
            rc = decode_stop(d, v, rq, e);
        } else if (!strcmp(name, "deadline_ms")) {
            if (d->nodes[v].type == JSON_NULL) continue;
            rc = get_number(d, v, "deadline_ms", 0, OAI_MAX_DEADLINE_MS, &rq->deadline_ms, e);
            if (!rc && !(rq->deadline_ms > 0))
                return bad(e, "deadline_ms", "'deadline_ms' must be > 0 (milliseconds)%s", "");
        } else if (chat && !strcmp(name, "reasoning_effort")) {
            rc = decode_effort(d, v, "reasoning_effort", rq, e);
        } else if (chat && !strcmp(name, "chat_template_kwargs")) {
            rc = decode_template_kwargs(d, v, rq, e);
        } else if (!strcmp(name, "user")) {
            if (d->nodes[v].type != JSON_STRING) return wrong_type(e, d, v, "user", "a string");
        } else if (!strcmp(name, "n") || !strcmp(name, "presence_penalty") ||
                   !strcmp(name, "frequency_penalty") || !strcmp(name, "logit_bias") ||
                   !strcmp(name, "logprobs") || (!chat && (!strcmp(name, "echo") ||
                   !strcmp(name, "best_of") || !strcmp(name, "suffix")))) {
            rc = neutral_only(d, v, name, e);
        } else {
            return bad(e, name, "Unrecognized request argument supplied: %s", name);
        }
        if (rc) return -1;
    }
    if (!rq->model) return bad(e, "model", "'model' is required%s", "");
    if (!have_input) return bad(e, chat ? "messages" : "prompt", "'%s' is required", chat ? "messages" : "prompt");
    if (rq->include_usage && !rq->stream)
        return bad(e, "stream_options", "'stream_options' is only allowed with stream: true%s", "");
    return 0;
}

void oai_request_free(oai_request *rq) {
    free(rq->ids);
    free(rq->messages);
    free(rq->joined);
    memset(rq, 0, sizeof *rq);
}
