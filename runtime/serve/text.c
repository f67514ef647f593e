/* Prompt text -> ids and ids -> answer text on a slot's context (text.h). */
#include "text.h"

#include <stdlib.h>
#include <string.h>

int text_tokenize(const colibri_ctx *ctx, oai_request *rq, int add_special, oai_error *e) {
    size_t need = 0;
    colibri_status st = colibri_tokenize(ctx, rq->text, rq->text_len, add_special, NULL, 0, &need);
    if (st && st != COLIBRI_E_BUFFER_TOO_SMALL) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "tokenizer: %s", colibri_strerror(st));
        return -1;
    }
    rq->ids = malloc((need ? need : 1) * sizeof *rq->ids);
    if (!rq->ids) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    st = colibri_tokenize(ctx, rq->text, rq->text_len, add_special, rq->ids, need, &need);
    if (st) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "tokenizer: %s", colibri_strerror(st));
        return -1;
    }
    rq->n_ids = (int)need;
    return 0;
}

int text_render_chat(colibri_ctx *ctx, const colibri_model *model, oai_request *rq, oai_error *e) {
    colibri_chat_message *msgs = calloc((size_t)rq->n_messages, sizeof *msgs);
    if (!msgs) {
        oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        return -1;
    }
    for (int i = 0; i < rq->n_messages; i++) {
        /* OpenAI's "developer" role is the newer name of "system" */
        msgs[i].role = strcmp(rq->messages[i].role, "developer") ? rq->messages[i].role : "system";
        msgs[i].content = rq->messages[i].content;
    }
    char why[256] = "";
    size_t need = 0;
    char *text = NULL;
    colibri_chat_options o;
    colibri_default_chat_options(&o);
    o.enable_thinking = rq->enable_thinking;
    o.reasoning_effort = rq->reasoning_effort;
    colibri_status st = colibri_chat_render_ex(model, msgs, rq->n_messages, &o, NULL, 0, &need, why, sizeof why);
    if (!st) {
        text = malloc(need + 1);
        st = text ? colibri_chat_render_ex(model, msgs, rq->n_messages, &o, text, need + 1, &need, why, sizeof why)
                  : COLIBRI_E_NO_MEMORY;
    }
    if (!st) { /* how the answer splits: the template's format, and whether it opened <think> */
        colibri_generate_params gp;
        colibri_default_generate_params(&gp);
        colibri_generate_params_for_chat(ctx, &gp, text, need);
        rq->reasoning = gp.reasoning;
        rq->starts_in_reasoning = gp.starts_in_reasoning;
    }
    free(msgs);
    if (st) {
        free(text);
        if (st == COLIBRI_E_NO_MEMORY) oai_set_error(e, 500, "server_error", NULL, NULL, "out of memory");
        else oai_set_error(e, 400, "invalid_request_error", "unsupported_conversation", "messages",
                           "%s", why[0] ? why : colibri_strerror(st));
        return -1;
    }
    rq->text = text;
    rq->text_len = need;
    int rc = text_tokenize(ctx, rq, 0, e);
    rq->text = NULL;
    free(text);
    return rc;
}

size_t text_detok(void *user, const int32_t *ids, int n, char *out, size_t cap) {
    const colibri_ctx *ctx = user;
    size_t len = 0;
    colibri_status st = colibri_detokenize(ctx, ids, (size_t)n, 1, out, cap, &len);
    if (st == COLIBRI_E_BUFFER_TOO_SMALL) return len; /* the loop retries with room for len */
    if (st) return 0;
    while (len >= 3 && !memcmp(out + len - 3, "\xEF\xBF\xBD", 3)) len -= 3;
    return len;
}

size_t text_full(const colibri_ctx *ctx, const int32_t *ids, int n, char **out) {
    size_t len = 0;
    *out = NULL;
    colibri_status st = colibri_detokenize(ctx, ids, (size_t)n, 1, NULL, 0, &len);
    if (st && st != COLIBRI_E_BUFFER_TOO_SMALL) return 0;
    *out = malloc(len + 1);
    if (!*out) return 0;
    if (colibri_detokenize(ctx, ids, (size_t)n, 1, *out, len, &len)) {
        free(*out);
        *out = NULL;
        return 0;
    }
    return len;
}
