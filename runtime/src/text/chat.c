/* Rendering a conversation with the model's chat template table (colibri_kit/model/chat.py
 * derives it from the checkpoint's Jinja template and checks it against jinja2):
 *
 *   start.R | content0 | between.R.S (last.R.S for the final message) | content1 ... |
 *   end.R (gen.R with the generation prompt)
 *
 * Blob: "CHT1", u32 count, then count x (u32 key length, key, u32 value length, value). Every
 * length is checked against the blob before use; nothing is allocated. */
#include "chat.h"

#include <stdio.h>
#include <string.h>

#include "core/model.h"
#include "core/le.h"

/* Walk the blob; with key != NULL find it (1 found, 0 absent), else only validate. -1: bad. */
static int blob_find(const uint8_t *b, size_t n, const char *key, const uint8_t **val,
                     size_t *val_len) {
    if (n < 8 || memcmp(b, "CHT1", 4) != 0) return -1;
    uint32_t count = rd32(b + 4);
    size_t pos = 8, klen = key ? strlen(key) : 0;
    for (uint32_t i = 0; i < count; i++) {
        if (n - pos < 4) return -1;
        size_t kl = rd32(b + pos);
        pos += 4;
        if (kl > n - pos) return -1;
        const uint8_t *k = b + pos;
        pos += kl;
        if (n - pos < 4) return -1;
        size_t vl = rd32(b + pos);
        pos += 4;
        if (vl > n - pos) return -1;
        if (key && kl == klen && memcmp(k, key, kl) == 0) {
            *val = b + pos;
            *val_len = vl;
            return 1;
        }
        pos += vl;
    }
    return 0;
}

static int role_index(const char *r) {
    if (!r) return -1;
    if (!strcmp(r, "system")) return 0;
    if (!strcmp(r, "user")) return 1;
    if (!strcmp(r, "assistant")) return 2;
    return -1;
}

static void put(char *out, size_t cap, size_t *at, const void *src, size_t n) {
    if (*at < cap) memcpy(out + *at, src, n < cap - *at ? n : cap - *at);
    *at += n;
}

colibri_status colibri_chat_render_blob(const uint8_t *blob, size_t blob_len,
                                        const colibri_chat_message *msgs, int n,
                                        int add_generation_prompt, char *out, size_t cap,
                                        size_t *len, char *why, size_t why_len) {
    static const char *names[] = {"system", "user", "assistant"};
    if (!blob || !len || (cap && !out) || n < 1 || !msgs)
        return fail(why, why_len, COLIBRI_E_INVALID_ARG,
                    "chat render needs a template, at least one message and an output");
    if (blob_find(blob, blob_len, NULL, NULL, NULL) < 0)
        return fail(why, why_len, COLIBRI_E_BAD_TENSOR, "chat.template blob is malformed");
    /* the shape: [system] user assistant user ... */
    int first_user = 0;
    for (int i = 0; i < n; i++) {
        int r = role_index(msgs[i].role);
        if (r < 0 || !msgs[i].content)
            return fail(why, why_len, COLIBRI_E_INVALID_ARG,
                        "message %d: role must be system, user or assistant, with content", i);
        if (i == 0 && r == 0) { first_user = 1; continue; }
        int want = (i - first_user) % 2 == 0 ? 1 : 2;
        if (r != want)
            return fail(why, why_len, COLIBRI_E_INVALID_ARG,
                        "message %d is %s: expected an optional system message, then user and "
                        "assistant alternating, starting with user", i, names[r]);
    }
    size_t at = 0;
    char key[48];
    for (int i = 0; i <= n; i++) {
        if (i == 0)
            snprintf(key, sizeof key, "start.%s", msgs[0].role);
        else if (i < n)
            snprintf(key, sizeof key, "%s.%s.%s", i == n - 1 ? "last" : "between", msgs[i - 1].role,
                     msgs[i].role);
        else
            snprintf(key, sizeof key, "%s.%s", add_generation_prompt ? "gen" : "end",
                     msgs[n - 1].role);
        const uint8_t *v;
        size_t vl;
        if (blob_find(blob, blob_len, key, &v, &vl) != 1)
            return fail(why, why_len, COLIBRI_E_UNSUPPORTED,
                        "the model's chat template does not allow this conversation (%s)", key);
        put(out, cap, &at, v, vl);
        if (i < n) put(out, cap, &at, msgs[i].content, strlen(msgs[i].content));
    }
    if (at < cap) out[at] = '\0';
    *len = at;
    return COLIBRI_OK;
}

colibri_status colibri_chat_render(const colibri_model *m, const colibri_chat_message *msgs, int n,
                                   int add_generation_prompt, char *out, size_t cap, size_t *len,
                                   char *why, size_t why_len) {
    const uint8_t *blob;
    size_t blob_len;
    if (!m) return fail(why, why_len, COLIBRI_E_INVALID_ARG, "model is NULL");
    if (!colibri_model_meta(m, "chat.template", &blob, &blob_len))
        return fail(why, why_len, COLIBRI_E_UNSUPPORTED,
                    "the model has no chat template: convert it again from a checkpoint whose "
                    "tokenizer_config.json has a chat_template (or pass --chat-template FILE)");
    return colibri_chat_render_blob(blob, blob_len, msgs, n, add_generation_prompt, out, cap, len,
                                    why, why_len);
}

int colibri_chat_available(const colibri_model *m) {
    return m && colibri_model_meta(m, "chat.template", NULL, NULL);
}
