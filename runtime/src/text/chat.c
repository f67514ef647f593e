/* Rendering a conversation with the model's chat template table (colibri_kit/model/chat.py
 * derives it from the checkpoint's Jinja template and checks it against jinja2):
 *
 *   start.R | content0 | between.R.S (last.R.S for the final message) | content1 ... |
 *   end.R (gen.R with the generation prompt)
 *
 * and, for the templates of gpt-oss and the Qwen3 families (docs/format.md "chat.template"):
 * a text may hold placeholders (NUL name NUL: the date, the reasoning effort), a key may have an
 * enable_thinking variant ("KEY|enable_thinking=false"), a content may be transformed (xf.KEY:
 * strip, lstrip_nl, after_think: each leaves a substring) or refused (refuse.KEY rules), and an
 * empty first message may be left out (empty.KEY = drop).
 *
 * Blob: "CHT1", u32 count, then count x (u32 key length, key, u32 value length, value). Every
 * length is checked against the blob before use; nothing is allocated. */
#include "chat.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

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

typedef struct {
    const uint8_t *p;
    size_t n;
} span;

static int find(const uint8_t *blob, size_t blob_len, const char *key, span *out) {
    return blob_find(blob, blob_len, key, &out->p, &out->n) == 1;
}

static int role_index(const char *r) {
    static const char *names[] = {"system", "developer", "user", "assistant"};
    for (int i = 0; r && i < 4; i++)
        if (!strcmp(r, names[i])) return i;
    return -1;
}

static void put(char *out, size_t cap, size_t *at, const void *src, size_t n) {
    if (*at < cap) memcpy(out + *at, src, n < cap - *at ? n : cap - *at);
    *at += n;
}

void colibri_default_chat_options(colibri_chat_options *o) {
    memset(o, 0, sizeof *o);
    o->add_generation_prompt = 1;
    o->enable_thinking = -1;
}

/* Python's str.isspace() (what Jinja's trim strips): the code points with bidirectional class
 * WS, B or S or category Zs. Returns the UTF-8 length of the whitespace character at s, else 0. */
static size_t py_space_at(const uint8_t *s, size_t n) {
    unsigned c = s[0];
    if ((c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20)) return 1;
    if (c == 0xC2 && n >= 2 && (s[1] == 0x85 || s[1] == 0xA0)) return 2;
    if (n < 3) return 0;
    unsigned cp = ((c & 0x0Fu) << 12) | ((s[1] & 0x3Fu) << 6) | (s[2] & 0x3Fu);
    if ((c & 0xF0) != 0xE0 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    if (cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
        cp == 0x202F || cp == 0x205F || cp == 0x3000)
        return 3;
    return 0;
}

/* The length of the whitespace character ending at s + n (0 when none). */
static size_t py_space_before(const uint8_t *s, size_t n) {
    for (size_t k = 1; k <= 3 && k <= n; k++)
        if (py_space_at(s + n - k, k) == k) return k;
    return 0;
}

static span strip_py(span s) {
    size_t k;
    while (s.n && (k = py_space_at(s.p, s.n)) != 0) s.p += k, s.n -= k;
    while (s.n && (k = py_space_before(s.p, s.n)) != 0) s.n -= k;
    return s;
}

static const uint8_t *find_last(span s, const char *needle) {
    size_t m = strlen(needle);
    const uint8_t *hit = NULL;
    for (size_t i = 0; i + m <= s.n; i++)
        if (!memcmp(s.p + i, needle, m)) hit = s.p + i;
    return hit;
}

static int contains(span s, const uint8_t *needle, size_t m) {
    for (size_t i = 0; i + m <= s.n; i++)
        if (!memcmp(s.p + i, needle, m)) return 1;
    return m == 0;
}

/* One comma-separated list of ops (xf.KEY). 0, or -1 for an op this runtime does not know. */
static int transform(span ops, span *c) {
    size_t i = 0;
    while (i < ops.n) {
        size_t j = i;
        while (j < ops.n && ops.p[j] != ',') j++;
        size_t len = j - i;
        const char *op = (const char *)ops.p + i;
        if (len == 5 && !memcmp(op, "strip", 5)) {
            *c = strip_py(*c);
        } else if (len == 9 && !memcmp(op, "lstrip_nl", 9)) {
            while (c->n && c->p[0] == '\n') c->p++, c->n--;
        } else if (len == 11 && !memcmp(op, "after_think", 11)) {
            const uint8_t *hit = find_last(*c, "</think>");
            if (hit) {
                size_t skip = (size_t)(hit - c->p) + 8;
                c->p += skip, c->n -= skip;
                while (c->n && c->p[0] == '\n') c->p++, c->n--;
            }
        } else {
            return -1;
        }
        i = j + 1;
    }
    return 0;
}

/* The first refusal rule (refuse.KEY: one a line) that the content meets, as (rule, length);
 * NULL when none does. */
static const uint8_t *refused(span rules, span c, size_t *rule_len) {
    size_t i = 0;
    while (i < rules.n) {
        size_t j = i;
        while (j < rules.n && rules.p[j] != '\n') j++;
        const uint8_t *r = rules.p + i;
        size_t len = j - i;
        int hit = 0;
        if (len == 5 && !memcmp(r, "empty", 5)) hit = c.n == 0;
        else if (len > 4 && !memcmp(r, "has:", 4)) hit = contains(c, r + 4, len - 4);
        else if (len > 5 && !memcmp(r, "wrap:", 5)) {
            const uint8_t *bar = memchr(r + 5, '|', len - 5);
            if (bar) {
                size_t a = (size_t)(bar - (r + 5)), b = len - 5 - a - 1;
                hit = c.n >= a && c.n >= b && !memcmp(c.p, r + 5, a) && !memcmp(c.p + c.n - b, bar + 1, b);
            }
        }
        if (hit) { *rule_len = len; return r; }
        i = j + 1;
    }
    return NULL;
}

/* key, or its enable_thinking variant when the caller set one and the table has it */
static int lookup(const uint8_t *blob, size_t blob_len, const char *key, int thinking, span *out) {
    char k[112];
    if (thinking >= 0) {
        snprintf(k, sizeof k, "%s|enable_thinking=%s", key, thinking ? "true" : "false");
        if (find(blob, blob_len, k, out)) return 1;
    }
    return find(blob, blob_len, key, out);
}

/* Copy a fixed text, putting the placeholders in place. -1 (why set) for a bad placeholder. */
static int put_text(const uint8_t *blob, size_t blob_len, span v, const colibri_chat_options *o,
                    char *out, size_t cap, size_t *at, char *why, size_t why_len) {
    size_t i = 0;
    while (i < v.n) {
        const uint8_t *nul = memchr(v.p + i, 0, v.n - i);
        if (!nul) { put(out, cap, at, v.p + i, v.n - i); break; }
        put(out, cap, at, v.p + i, (size_t)(nul - (v.p + i)));
        const uint8_t *name = nul + 1;
        const uint8_t *end = memchr(name, 0, v.n - (size_t)(name - v.p));
        if (!end) { snprintf(why, why_len, "chat.template: unterminated placeholder"); return -1; }
        size_t len = (size_t)(end - name);
        if (len == 16 && !memcmp(name, "reasoning_effort", 16)) {
            span d;
            if (o->reasoning_effort) put(out, cap, at, o->reasoning_effort, strlen(o->reasoning_effort));
            else if (find(blob, blob_len, "default.reasoning_effort", &d)) put(out, cap, at, d.p, d.n);
        } else if (len > 9 && len < 64 && !memcmp(name, "strftime:", 9)) {
            /* transformers' strftime_now: datetime.now().strftime(fmt), the local time */
            char fmt[64], buf[128];
            memcpy(fmt, name + 9, len - 9);
            fmt[len - 9] = '\0';
            time_t t = o->now ? (time_t)o->now : time(NULL);
            struct tm tm;
            size_t w = localtime_r(&t, &tm) ? strftime(buf, sizeof buf, fmt, &tm) : 0;
            put(out, cap, at, buf, w);
        } else {
            snprintf(why, why_len, "chat.template: unknown placeholder (convert the model again)");
            return -1;
        }
        i = (size_t)(end - v.p) + 1;
    }
    return 0;
}

colibri_status colibri_chat_render_blob_ex(const uint8_t *blob, size_t blob_len,
                                           const colibri_chat_message *msgs, int n,
                                           const colibri_chat_options *opt, char *out, size_t cap,
                                           size_t *len, char *why, size_t why_len) {
    static const char *names[] = {"system", "developer", "user", "assistant"};
    colibri_chat_options defaults;
    if (!opt) {
        colibri_default_chat_options(&defaults);
        opt = &defaults;
    }
    if (!blob || !len || (cap && !out) || n < 1 || !msgs)
        return fail(why, why_len, COLIBRI_E_INVALID_ARG,
                    "chat render needs a template, at least one message and an output");
    if (blob_find(blob, blob_len, NULL, NULL, NULL) < 0)
        return fail(why, why_len, COLIBRI_E_BAD_TENSOR, "chat.template blob is malformed");
    if (opt->reasoning_effort && strcmp(opt->reasoning_effort, "low") &&
        strcmp(opt->reasoning_effort, "medium") && strcmp(opt->reasoning_effort, "high"))
        return fail(why, why_len, COLIBRI_E_INVALID_ARG,
                    "reasoning effort must be low, medium or high (openai-harmony's values)");
    if (opt->enable_thinking < -1 || opt->enable_thinking > 1)
        return fail(why, why_len, COLIBRI_E_INVALID_ARG, "enable_thinking must be -1, 0 or 1");
    /* the shape: [system|developer] user assistant user ... */
    int first = 0;
    for (int i = 0; i < n; i++) {
        int r = role_index(msgs[i].role);
        if (r < 0 || !msgs[i].content)
            return fail(why, why_len, COLIBRI_E_INVALID_ARG,
                        "message %d: role must be system, developer, user or assistant, with content", i);
        if (i == 0 && r <= 1) { first = 1; continue; }
        int want = (i - first) % 2 == 0 ? 2 : 3;
        if (r != want)
            return fail(why, why_len, COLIBRI_E_INVALID_ARG,
                        "message %d is %s: expected an optional system or developer message, then "
                        "user and assistant alternating, starting with user", i, names[r]);
    }
    char key[64];
    span v;
    /* an empty first system/developer message that the template leaves out (gpt-oss) */
    if (first && !msgs[0].content[0]) {
        snprintf(key, sizeof key, "empty.start.%s", msgs[0].role);
        if (find(blob, blob_len, key, &v) && v.n == 4 && !memcmp(v.p, "drop", 4)) {
            if (n == 1)
                return fail(why, why_len, COLIBRI_E_UNSUPPORTED,
                            "an empty %s message alone: the chat template leaves it out", msgs[0].role);
            msgs++, n--;
        }
    }
    size_t at = 0;
    for (int i = 0; i <= n; i++) {
        if (i == 0)
            snprintf(key, sizeof key, "start.%s", msgs[0].role);
        else if (i < n)
            snprintf(key, sizeof key, "%s.%s.%s", i == n - 1 ? "last" : "between", msgs[i - 1].role,
                     msgs[i].role);
        else
            snprintf(key, sizeof key, "%s.%s", opt->add_generation_prompt ? "gen" : "end",
                     msgs[n - 1].role);
        if (!lookup(blob, blob_len, key, opt->enable_thinking, &v))
            return fail(why, why_len, COLIBRI_E_UNSUPPORTED,
                        "the model's chat template does not allow this conversation (%s)", key);
        if (put_text(blob, blob_len, v, opt, out, cap, &at, why, why_len))
            return COLIBRI_E_BAD_TENSOR;
        if (i == n) break;
        span c = {(const uint8_t *)msgs[i].content, strlen(msgs[i].content)}, rules;
        char k2[72];
        snprintf(k2, sizeof k2, "xf.%s", key);
        if (find(blob, blob_len, k2, &v) && transform(v, &c))
            return fail(why, why_len, COLIBRI_E_BAD_TENSOR,
                        "chat.template: unknown content transform at %s (convert the model again)", key);
        snprintf(k2, sizeof k2, "refuse.%s", key);
        size_t rl = 0;
        const uint8_t *rule = find(blob, blob_len, k2, &rules) ? refused(rules, c, &rl) : NULL;
        if (rule)
            return fail(why, why_len, COLIBRI_E_UNSUPPORTED,
                        "message %d (%s): the model's chat template treats this content specially "
                        "(%.*s), which colibri does not reproduce; leave that text out",
                        i, msgs[i].role, (int)(rl > 80 ? 80 : rl), (const char *)rule);
        put(out, cap, &at, c.p, c.n);
    }
    if (at < cap) out[at] = '\0';
    *len = at;
    return COLIBRI_OK;
}

colibri_status colibri_chat_render_blob(const uint8_t *blob, size_t blob_len,
                                        const colibri_chat_message *msgs, int n,
                                        int add_generation_prompt, char *out, size_t cap,
                                        size_t *len, char *why, size_t why_len) {
    colibri_chat_options o;
    colibri_default_chat_options(&o);
    o.add_generation_prompt = add_generation_prompt;
    return colibri_chat_render_blob_ex(blob, blob_len, msgs, n, &o, out, cap, len, why, why_len);
}

static colibri_status model_blob(const colibri_model *m, const uint8_t **blob, size_t *blob_len,
                                 char *why, size_t why_len) {
    if (!m) return fail(why, why_len, COLIBRI_E_INVALID_ARG, "model is NULL");
    if (!colibri_model_meta(m, "chat.template", blob, blob_len))
        return fail(why, why_len, COLIBRI_E_UNSUPPORTED,
                    "the model has no chat template: convert it again from a checkpoint whose "
                    "tokenizer_config.json has a chat_template (or pass --chat-template FILE)");
    return COLIBRI_OK;
}

colibri_status colibri_chat_render_ex(const colibri_model *m, const colibri_chat_message *msgs, int n,
                                      const colibri_chat_options *opt, char *out, size_t cap,
                                      size_t *len, char *why, size_t why_len) {
    const uint8_t *blob;
    size_t blob_len;
    colibri_status s = model_blob(m, &blob, &blob_len, why, why_len);
    return s ? s : colibri_chat_render_blob_ex(blob, blob_len, msgs, n, opt, out, cap, len, why, why_len);
}

colibri_status colibri_chat_render(const colibri_model *m, const colibri_chat_message *msgs, int n,
                                   int add_generation_prompt, char *out, size_t cap, size_t *len,
                                   char *why, size_t why_len) {
    colibri_chat_options o;
    colibri_default_chat_options(&o);
    o.add_generation_prompt = add_generation_prompt;
    return colibri_chat_render_ex(m, msgs, n, &o, out, cap, len, why, why_len);
}

int colibri_chat_available(const colibri_model *m) {
    return m && colibri_model_meta(m, "chat.template", NULL, NULL);
}

colibri_reasoning_format colibri_chat_reasoning_format(const colibri_model *m) {
    const uint8_t *blob, *v;
    size_t blob_len, vl;
    if (!m || !colibri_model_meta(m, "chat.template", &blob, &blob_len)) return COLIBRI_REASONING_NONE;
    if (blob_find(blob, blob_len, "output.format", &v, &vl) != 1) return COLIBRI_REASONING_NONE;
    if (vl == 7 && !memcmp(v, "harmony", 7)) return COLIBRI_REASONING_HARMONY;
    if (vl == 5 && !memcmp(v, "think", 5)) return COLIBRI_REASONING_THINK;
    return COLIBRI_REASONING_NONE;
}
