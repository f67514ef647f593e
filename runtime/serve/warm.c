/* Warm prompts (warm.h): computed once at start-up, before the ready line, into the prefix cache. */
#include "warm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"
#include "json.h"

/* RFC 4648 base64 (with '=' padding, no line breaks) -> bytes; -1 on anything else. */
static long b64_decode(const char *in, char *out) {
    static const char A[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t n = strlen(in);
    long o = 0;
    if (n % 4) return -1;
    for (size_t i = 0; i < n; i += 4) {
        unsigned v = 0;
        int pad = 0;
        for (int k = 0; k < 4; k++) {
            char c = in[i + k];
            const char *p = c ? strchr(A, c) : NULL;
            if (c == '=' && i + 4 == n && k >= 2 && (k == 3 || in[i + 3] == '=')) {
                pad++;
                v <<= 6;
                continue;
            }
            if (!p || pad) return -1;
            v = v << 6 | (unsigned)(p - A);
        }
        out[o++] = (char)(v >> 16);
        if (pad < 2) out[o++] = (char)(v >> 8 & 0xFF);
        if (pad < 1) out[o++] = (char)(v & 0xFF);
    }
    return o;
}

/* The --warm-prompts-b64 list into S->o.warm (the strings live in *keep: the decoded document). */
static int decode_list(server *S, json_doc *doc, char **keep) {
    const char *b64 = S->o.warm_b64;
    char *raw = malloc(strlen(b64) / 4 * 3 + 1);
    long n = raw ? b64_decode(b64, raw) : -1;
    if (n < 0 || json_parse(doc, raw, (size_t)n)) {
        log_event("colibri serve: --warm-prompts-b64 is not base64 of a JSON list: %s",
                  n < 0 ? "bad base64" : doc->err);
        free(raw);
        return -1;
    }
    *keep = raw;
    if (doc->nodes[0].type != JSON_ARRAY) {
        log_event("colibri serve: --warm-prompts-b64: expected a JSON list of {\"system\": TEXT} or "
                  "{\"prompt\": TEXT} objects");
        return -1;
    }
    for (int i = doc->nodes[0].child, k = 0; i != JSON_NONE; i = doc->nodes[i].next, k++) {
        const json_node *it = &doc->nodes[i];
        int sys = it->type == JSON_OBJECT ? json_get(doc, i, "system") : JSON_NONE;
        int pr = it->type == JSON_OBJECT ? json_get(doc, i, "prompt") : JSON_NONE;
        int v = sys != JSON_NONE ? sys : pr;
        if (it->type != JSON_OBJECT || it->count != 1 || v == JSON_NONE ||
            doc->nodes[v].type != JSON_STRING || !doc->nodes[v].len) {
            log_event("colibri serve: --warm-prompts-b64: item %d must be {\"system\": TEXT} or "
                      "{\"prompt\": TEXT} with a non-empty TEXT", k);
            return -1;
        }
        if (S->o.n_warm >= SERVE_MAX_WARM) {
            log_event("colibri serve: more than %d warm prompts", SERVE_MAX_WARM);
            return -1;
        }
        S->o.warm[S->o.n_warm++] = (serve_warm){sys != JSON_NONE, doc->nodes[v].str};
    }
    return 0;
}

/* The ids of a text (add_special as the completions endpoint, or not for a rendered chat). */
static int32_t *tokenize(colibri_ctx *ctx, const char *text, size_t len, int add_special, int *n) {
    size_t need = 0;
    colibri_status st = colibri_tokenize(ctx, text, len, add_special, NULL, 0, &need);
    int32_t *ids = (st == COLIBRI_OK || st == COLIBRI_E_BUFFER_TOO_SMALL) ? malloc((need + 1) * sizeof *ids) : NULL;
    if (!ids || colibri_tokenize(ctx, text, len, add_special, ids, need, &need)) {
        free(ids);
        return NULL;
    }
    *n = (int)need;
    return ids;
}

/* A system prompt's share of every chat that starts with it: the ids two conversations with it
 * and different user messages have in common (the template's head, the system text, up to where
 * the user's turn begins), tokenized as a chat request is. */
static int32_t *system_head(server *S, colibri_ctx *ctx, const char *system, int *n, char *why,
                            size_t why_len) {
    int32_t *ids[2] = {NULL, NULL};
    int len[2] = {0, 0};
    for (int k = 0; k < 2; k++) {
        colibri_chat_message m[2] = {{"system", system}, {"user", k ? "B" : "A"}};
        size_t need = 0;
        colibri_status st = colibri_chat_render(S->pool.model, m, 2, 1, NULL, 0, &need, why, why_len);
        char *text = st ? NULL : malloc(need + 1);
        if (text) st = colibri_chat_render(S->pool.model, m, 2, 1, text, need + 1, &need, why, why_len);
        if (text && !st) ids[k] = tokenize(ctx, text, need, 0, &len[k]);
        free(text);
        if (st || !ids[k]) {
            free(ids[0]);
            if (!st) snprintf(why, why_len, "cannot tokenize the rendered conversation");
            return NULL;
        }
    }
    int same = 0;
    while (same < len[0] && same < len[1] && ids[0][same] == ids[1][same]) same++;
    free(ids[1]);
    *n = same;
    return ids[0];
}

int warm_run(server *S, int *prompts, int *tokens) {
    json_doc doc;
    memset(&doc, 0, sizeof doc);
    char *raw = NULL;
    int rc = 0;
    *prompts = *tokens = 0;
    if (S->o.warm_b64 && decode_list(S, &doc, &raw)) rc = -1;
    slot *s = &S->pool.slots[0]; /* nothing runs yet: the first slot is free */
    for (int i = 0; !rc && i < S->o.n_warm; i++) {
        const serve_warm *w = &S->o.warm[i];
        char why[320] = "";
        int n = 0;
        int32_t *ids = NULL;
        if (!S->tinfo.has_tokenizer) snprintf(why, sizeof why, "the model has no tokenizer");
        else if (w->chat && !S->has_chat_template) snprintf(why, sizeof why, "the model has no chat template");
        else if (w->chat) ids = system_head(S, s->ctx, w->text, &n, why, sizeof why);
        else if (!(ids = tokenize(s->ctx, w->text, strlen(w->text), 1, &n)))
            snprintf(why, sizeof why, "cannot tokenize it");
        if (ids && (n < 1 || (uint32_t)n >= S->info.max_seq_len))
            snprintf(why, sizeof why, "%d tokens: it must be 1..%u", n, S->info.max_seq_len - 1);
        if (!why[0] && slot_warm(s, ids, n, why, sizeof why) == 0) {
            ++*prompts;
            *tokens += n;
        } else {
            log_event("colibri serve: warm prompt %d (%s): %s", i + 1, w->chat ? "system" : "prompt",
                      why[0] ? why : "failed");
            rc = -1;
        }
        free(ids);
    }
    json_free(&doc);
    free(raw);
    return rc;
}
