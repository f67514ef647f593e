/* The generation loop shared by `colibri generate` and the HTTP server: prefill, sample, stop,
 * stream. Text is produced by decoding all generated ids so far and emitting what became final
 * since the last token, so tokenizers whose pieces merge (byte fallback, multi-byte characters
 * split across tokens) stream correctly; held back are an incomplete trailing UTF-8 character
 * and any tail that could still become a stop string. */
#include "generate.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "colibri.h"
#include "core/context.h"
#include "harmony.h"
#include "tokenizer.h"

size_t colibri_utf8_incomplete_tail(const char *text, size_t len) {
    /* walk back over at most 3 continuation bytes to the lead byte */
    for (size_t back = 1; back <= 4 && back <= len; back++) {
        unsigned char c = (unsigned char)text[len - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte */
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3
                    : (c & 0xF8) == 0xF0 ? 4 : 1; /* an invalid lead byte stands alone */
        return need > back ? back : 0;
    }
    return 0; /* only continuation bytes: invalid, emitted as they are */
}

size_t colibri_utf8_sanitize(const char *in, size_t n, char *out) {
    const unsigned char *s = (const unsigned char *)in;
    size_t o = 0;
    for (size_t i = 0; i < n;) {
        unsigned c = s[i];
        size_t need = 0;
        unsigned lo = 0x80, hi = 0xBF; /* allowed range of the first continuation byte */
        if (c < 0x80) { out[o++] = (char)c; i++; continue; }
        if (c >= 0xC2 && c <= 0xDF) need = 1;
        else if (c >= 0xE0 && c <= 0xEF) { need = 2; lo = c == 0xE0 ? 0xA0 : 0x80; hi = c == 0xED ? 0x9F : 0xBF; }
        else if (c >= 0xF0 && c <= 0xF4) { need = 3; lo = c == 0xF0 ? 0x90 : 0x80; hi = c == 0xF4 ? 0x8F : 0xBF; }
        size_t k = 1;
        while (need && k <= need && i + k < n) {
            unsigned d = s[i + k];
            if (d < (k == 1 ? lo : 0x80) || d > (k == 1 ? hi : 0xBF)) break;
            k++;
        }
        if (need && k == need + 1) { memcpy(out + o, in + i, k); o += k; i += k; continue; }
        memcpy(out + o, "\xEF\xBF\xBD", 3); /* U+FFFD for the maximal subpart s[i..i+k) */
        o += 3;
        i += k;
    }
    return o;
}

size_t colibri_stop_prefix_tail(const char *text, size_t len, const char *stop) {
    size_t n = strlen(stop);
    for (size_t k = n > 0 ? n - 1 : 0; k > 0; k--)
        if (k <= len && memcmp(text + len - k, stop, k) == 0) return k;
    return 0;
}

void colibri_default_generate_params(colibri_generate_params *p) {
    memset(p, 0, sizeof *p);
    p->max_new = 16;
    colibri_default_sampling(&p->sampling);
}

size_t colibri_detok_ctx(void *ctx, const int32_t *ids, int n, char *out, size_t cap) {
    size_t len = 0;
    colibri_status s = colibri_detokenize((const colibri_ctx *)ctx, ids, (size_t)n, 1, out, cap, &len);
    return s == COLIBRI_OK || s == COLIBRI_E_BUFFER_TOO_SMALL ? len : 0;
}

colibri_status colibri_generate_params_for_text(colibri_ctx *ctx, colibri_generate_params *p) {
    if (!ctx || !p) return COLIBRI_E_INVALID_ARG;
    const colibri_tokenizer *t = ctx->model->tokenizer;
    if (!t) return COLIBRI_E_NO_TOKENIZER;
    p->detok = colibri_detok_ctx;
    p->detok_user = ctx;
    /* the stop ids live in the model (immutable), valid as long as the context; signed and
     * unsigned variants of one type may alias */
    p->stop_ids = (const int32_t *)t->stop_ids;
    p->n_stop_ids = (int)t->n_stop;
    return COLIBRI_OK;
}

const char *colibri_finish_name(colibri_finish f) {
    switch (f) {
    case COLIBRI_FINISH_STOP: return "stop";
    case COLIBRI_FINISH_LENGTH: return "length";
    case COLIBRI_FINISH_CONTEXT: return "context";
    case COLIBRI_FINISH_CANCELLED: return "cancelled";
    default: return "none";
    }
}

/* Hand text[from..to) to the callbacks as valid UTF-8, as one kind. The content part of a step
 * is collected for on_token (one call per token). */
static int deliver(colibri_out *g, int32_t id, colibri_text_kind kind, size_t from, size_t to) {
    const colibri_generate_params *p = g->p;
    size_t n = to - from;
    if (n == 0) return 0;
    if (3 * n > g->clean_cap) {
        char *c = realloc(g->clean, 3 * n);
        if (!c) { g->oom = 1; return 1; }
        g->clean = c;
        g->clean_cap = 3 * n;
    }
    size_t m = colibri_utf8_sanitize(g->text + from, n, g->clean);
    if (kind == COLIBRI_TEXT_CONTENT && p->on_token) {
        if (g->content_len + m > g->content_cap) {
            size_t cap = (g->content_len + m) * 2;
            char *c = realloc(g->content, cap);
            if (!c) { g->oom = 1; return 1; }
            g->content = c;
            g->content_cap = cap;
        }
        memcpy(g->content + g->content_len, g->clean, m);
        g->content_len += m;
    }
    if (!p->on_chunk) return 0;
    colibri_chunk c = {id, kind, g->clean, m, 0, "", ""};
    if (p->reasoning == COLIBRI_REASONING_HARMONY) {
        c.message = g->harmony.n_messages - 1;
        c.channel = g->harmony.channel;
        c.recipient = g->harmony.recipient;
    }
    return p->on_chunk(p->chunk_user, &c);
}

/* <think> splitting over the final text: text[think_pos..to) is classified (to: what is final
 * now; at the end everything). A tag cut by `to`, and newlines that may precede </think>, wait
 * for more text. The newlines the chat templates put inside the tags and after </think> are
 * dropped (their reasoning_content.strip('\n') and content.lstrip('\n')). */
static size_t tag_prefix_tail(const char *t, size_t from, size_t to, const char *tag) {
    size_t n = strlen(tag);
    for (size_t k = n - 1; k > 0; k--)
        if (to - from >= k && !memcmp(t + to - k, tag, k)) return k;
    return 0;
}

static int think_split(colibri_out *g, int32_t id, size_t to, int at_end) {
    const char *t = g->text;
    for (;;) {
        size_t pos = g->think_pos;
        if (g->think_skip_nl) {
            while (pos < to && t[pos] == '\n') pos++;
            if (pos < to) g->think_skip_nl = 0;
            g->think_pos = pos;
        }
        if (pos >= to) return 0;
        if (g->think_state == THINK_START) {
            size_t avail = to - pos;
            if (avail >= 7 && !memcmp(t + pos, "<think>", 7)) {
                g->think_pos = pos + 7;
                g->think_state = THINK_REASONING;
                g->think_skip_nl = 1;
                continue;
            }
            if (!at_end && avail < 7 && !memcmp(t + pos, "<think>", avail)) return 0;
            g->think_state = THINK_CONTENT;
            continue;
        }
        if (g->think_state == THINK_CONTENT) {
            g->think_pos = to;
            return deliver(g, id, COLIBRI_TEXT_CONTENT, pos, to);
        }
        /* reasoning */
        const char *close = NULL;
        for (size_t i = pos; i + 8 <= to; i++)
            if (!memcmp(t + i, "</think>", 8)) { close = t + i; break; }
        if (close) {
            size_t e = (size_t)(close - t), f = e;
            while (f > pos && t[f - 1] == '\n') f--;
            if (deliver(g, id, COLIBRI_TEXT_REASONING, pos, f)) return 1;
            g->think_pos = e + 8;
            g->think_state = THINK_CONTENT;
            g->think_skip_nl = 1;
            continue;
        }
        size_t e = to;
        if (!at_end) {
            e -= tag_prefix_tail(t, pos, to, "</think>");
            while (e > pos && t[e - 1] == '\n') e--;
        }
        g->think_pos = e;
        return deliver(g, id, COLIBRI_TEXT_REASONING, pos, e);
    }
}

/* text[from..to) became final: split it by the output format, then call on_token once. */
static int emit(colibri_out *g, int32_t id, size_t from, size_t to, int at_end) {
    const colibri_generate_params *p = g->p;
    g->content_len = 0;
    int cancel = 0;
    if (p->reasoning == COLIBRI_REASONING_THINK)
        cancel = think_split(g, id, to, at_end);
    else if (p->reasoning == COLIBRI_REASONING_HARMONY)
        cancel = g->in_message ? deliver(g, id, colibri_harmony_kind(&g->harmony), from, to) : 0;
    else
        cancel = deliver(g, id, COLIBRI_TEXT_CONTENT, from, to);
    if (g->oom) return 1;
    if (p->on_token)
        cancel |= p->on_token(p->user, id, g->content_len ? g->content : "", g->content_len);
    return cancel;
}

/* Decode the current segment's ids; *found = index of a stop string that appeared (else -1).
 * Returns the end of the text that is final now (>= emitted), or (size_t)-1 when out of memory. */
static size_t advance_text(colibri_out *g, int *found) {
    const colibri_generate_params *p = g->p;
    const int32_t *ids = g->ids + g->seg;
    int n = g->n_ids - g->seg;
    *found = -1;
    size_t len = g->raw ? g->raw(g->raw_user, ids, n, g->text, g->cap)
                        : p->detok(p->detok_user, ids, n, g->text, g->cap);
    if (len > g->cap) {
        size_t cap = len + len / 2 + 64;
        char *t = realloc(g->text, cap);
        if (!t) return (size_t)-1;
        g->text = t;
        g->cap = cap;
        len = g->raw ? g->raw(g->raw_user, ids, n, g->text, g->cap)
                     : p->detok(p->detok_user, ids, n, g->text, g->cap);
        if (len > g->cap) len = g->cap;
    }
    g->len = len;
    /* earliest stop string, searched from where a new match could begin */
    size_t best = len;
    for (int s = 0; s < p->n_stop_strings; s++) {
        size_t sl = strlen(p->stop_strings[s]);
        size_t from = g->emitted >= sl ? g->emitted - sl + 1 : 0;
        if (sl > len) continue;
        for (size_t i = from; i + sl <= len && i < best; i++)
            if (memcmp(g->text + i, p->stop_strings[s], sl) == 0) {
                best = i;
                *found = s;
                break;
            }
    }
    if (*found >= 0) return best < g->emitted ? g->emitted : best;
    size_t safe = len - colibri_utf8_incomplete_tail(g->text, len);
    /* The tokenizer decodes bytes that are not (yet) UTF-8 to U+FFFD, and a trailing U+FFFD may
     * become a character with the next token: the text for more ids need not extend the text for
     * fewer there. Hold trailing U+FFFD back until text follows them (or the end), so what was
     * emitted is never taken back. */
    while (safe >= g->emitted + 3 && !memcmp(g->text + safe - 3, "\xEF\xBF\xBD", 3)) safe -= 3;
    for (int s = 0; s < p->n_stop_strings; s++) {
        size_t k = colibri_stop_prefix_tail(g->text, len, p->stop_strings[s]);
        if (len - k < safe) safe = len - k;
    }
    return safe < g->emitted ? g->emitted : safe;
}

static size_t raw_detok(void *ctx, const int32_t *ids, int n, char *out, size_t cap) {
    size_t len = 0;
    colibri_status s = colibri_detokenize((const colibri_ctx *)ctx, ids, (size_t)n, 0, out, cap, &len);
    return s == COLIBRI_OK || s == COLIBRI_E_BUFFER_TOO_SMALL ? len : 0;
}

colibri_status colibri_out_begin(colibri_out *g, colibri_ctx *ctx, const colibri_generate_params *p,
                                 int32_t *ids, char *why, size_t why_len) {
    memset(g, 0, sizeof *g);
    g->p = p;
    g->ids = ids;
    if (p->reasoning == COLIBRI_REASONING_HARMONY) {
        colibri_harmony_ids hid;
        if (!ctx || colibri_harmony_ids_of(ctx->model->tokenizer, &hid))
            return snprintf(why, why_len, "harmony output needs the model's tokenizer to have the "
                                          "harmony tokens (<|start|>, <|channel|>, <|message|>, "
                                          "<|end|>, <|return|>, <|call|>)"),
                   COLIBRI_E_UNSUPPORTED;
        colibri_harmony_init(&g->harmony, &hid);
        /* the content as openai-harmony decodes it: special tokens inside are text */
        g->raw = raw_detok;
        g->raw_user = ctx;
        g->tok = ctx->model->tokenizer;
    }
    g->think_state = p->starts_in_reasoning ? THINK_REASONING : THINK_START;
    g->think_skip_nl = p->starts_in_reasoning;
    return COLIBRI_OK;
}

/* End the current text segment: what was held back is final. */
static int flush_segment(colibri_out *g, int32_t id) {
    size_t to = g->len > g->emitted ? g->len : g->emitted;
    int c = emit(g, id, g->emitted, to, 1);
    g->emitted = to;
    return c;
}

int colibri_out_push(colibri_out *g, int32_t id, int *stop_string) {
    const colibri_generate_params *p = g->p;
    g->n_ids++;
    *stop_string = -1;
    if (p->reasoning == COLIBRI_REASONING_HARMONY) {
        char piece[COLIBRI_TOK_MAX_PIECE];
        size_t pl = 0;
        if (colibri_tokenizer_piece(g->tok, id, piece, sizeof piece, &pl)) pl = 0;
        colibri_harmony_event ev = colibri_harmony_push(&g->harmony, id, piece, pl);
        if (ev != COLIBRI_HEV_CONTENT) {
            int c = 0;
            if (g->in_message && (ev == COLIBRI_HEV_END || ev == COLIBRI_HEV_STOP)) {
                c = flush_segment(g, id);
                g->in_message = 0;
            } else if (p->on_token) {
                c = p->on_token(p->user, id, "", 0);
            }
            if (ev == COLIBRI_HEV_BEGIN) {
                g->in_message = 1;
                g->seg = g->n_ids; /* the content starts after <|message|> */
                g->emitted = g->len = g->think_pos = 0;
            }
            if (ev == COLIBRI_HEV_STOP) g->stopped = 1;
            return g->oom ? 1 : c;
        }
    }
    size_t safe = g->emitted;
    if (p->detok || g->raw) {
        safe = advance_text(g, stop_string);
        if (safe == (size_t)-1) { g->oom = 1; return 1; }
    }
    int cancel = emit(g, id, g->emitted, safe, 0);
    g->emitted = safe;
    if (*stop_string >= 0) g->len = safe; /* the stop string and what follows it are dropped */
    return g->oom ? 1 : cancel;
}

void colibri_out_end(colibri_out *g) {
    if (g->p->reasoning != COLIBRI_REASONING_HARMONY || g->in_message) flush_segment(g, -1);
    else if (g->p->on_token) g->p->on_token(g->p->user, -1, "", 0);
}

void colibri_out_free(colibri_out *g) {
    free(g->text);
    free(g->clean);
    free(g->content);
}

colibri_status colibri_generate_params_for_chat(colibri_ctx *ctx, colibri_generate_params *p,
                                                const char *prompt, size_t len) {
    colibri_status s = colibri_generate_params_for_text(ctx, p);
    if (s) return s;
    p->reasoning = colibri_chat_reasoning_format(ctx->model);
    p->starts_in_reasoning = 0;
    if (p->reasoning == COLIBRI_REASONING_THINK && prompt) {
        /* the prompt ends inside an open <think> when its last <think> follows its last </think> */
        long open = -1, close = -1;
        for (size_t i = 0; i + 7 <= len; i++) {
            if (!memcmp(prompt + i, "<think>", 7)) open = (long)i;
            if (i + 8 <= len && !memcmp(prompt + i, "</think>", 8)) close = (long)i;
        }
        p->starts_in_reasoning = open > close;
    }
    return COLIBRI_OK;
}

colibri_status colibri_generate(colibri_ctx *ctx, const colibri_generate_params *p,
                                int32_t *out, colibri_generate_result *r) {
    if (!ctx || !p || !r) return COLIBRI_E_INVALID_ARG;
    memset(r, 0, sizeof *r);
    r->stop_id = -1;
    r->stop_string = -1;
    /* one generation stepped alone, the context running itself (gen_batch.c): the loop the
     * service batches, so a request's ids are these whether it is served alone or not */
    colibri_gen *g;
    ctx->err[0] = '\0';
    colibri_status s = colibri_check_runs_itself(ctx);
    if (s) return s;
    s = colibri_gen_new(&g, ctx, p, out, 0);
    if (s) return s;
    while (!colibri_gen_done(g)) colibri_gen_step_on(ctx, ctx->cuda != NULL, 0, &g, 1);
    s = colibri_gen_result(g, r);
    colibri_gen_free(g);
    return s;
}
