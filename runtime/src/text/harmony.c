/* The harmony output parser (harmony.h). Header rules as openai-harmony's
 * parse_header_from_tokens (src/encoding.rs): the channel is the text after <|channel|> up to
 * whitespace or '<', removed from the header; the rest, trimmed and with a space put before
 * <|constrain|>, splits at whitespace into [role] [to=]RECIPIENT [CONTENT_TYPE]. */
#include "harmony.h"

#include <ctype.h>
#include <string.h>

static int32_t added_id(const colibri_tokenizer *t, const char *text) {
    size_t n = strlen(text);
    for (uint32_t i = 0; i < t->n_added; i++)
        if (t->added[i].len == n && !memcmp(t->added[i].text, text, n)) return (int32_t)t->added[i].id;
    return -1;
}

int colibri_harmony_ids_of(const colibri_tokenizer *t, colibri_harmony_ids *ids) {
    if (!t) return -1;
    ids->start = added_id(t, "<|start|>");
    ids->end = added_id(t, "<|end|>");
    ids->message = added_id(t, "<|message|>");
    ids->channel = added_id(t, "<|channel|>");
    ids->constrain = added_id(t, "<|constrain|>");
    ids->ret = added_id(t, "<|return|>");
    ids->call = added_id(t, "<|call|>");
    return ids->start < 0 || ids->end < 0 || ids->message < 0 || ids->channel < 0 || ids->ret < 0 ||
                   ids->call < 0
               ? -1
               : 0;
}

void colibri_harmony_init(colibri_harmony *h, const colibri_harmony_ids *ids) {
    memset(h, 0, sizeof *h);
    h->ids = *ids;
    h->state = COLIBRI_HARMONY_HEADER;
    h->role_given = 1;
    strcpy(h->role, "assistant");
}

static void copy_field(char *dst, size_t cap, const char *src, size_t n) {
    if (n >= cap) n = cap - 1;
    memcpy(dst, src, n);
    dst[n] = '\0';
}

static int is_role(const char *s, size_t n) {
    static const char *roles[] = {"user", "assistant", "system", "developer", "tool"};
    for (int i = 0; i < 5; i++)
        if (strlen(roles[i]) == n && !memcmp(roles[i], s, n)) return 1;
    return 0;
}

static void parse_header(colibri_harmony *h) {
    char buf[sizeof h->header + 64];
    size_t n = h->header_len;
    memcpy(buf, h->header, n);
    h->channel[0] = h->recipient[0] = h->content_type[0] = '\0';
    /* the channel: after <|channel|>, to whitespace or '<'; cut out of the header */
    char *mark = NULL;
    for (size_t i = 0; i + 11 <= n; i++)
        if (!memcmp(buf + i, "<|channel|>", 11)) { mark = buf + i; break; }
    if (mark) {
        char *v = mark + 11, *e = v;
        while (e < buf + n && !isspace((unsigned char)*e) && *e != '<') e++;
        copy_field(h->channel, sizeof h->channel, v, (size_t)(e - v));
        memmove(mark, e, (size_t)(buf + n - e));
        n -= (size_t)(e - mark);
    }
    /* a space before <|constrain|> so that the content type is a part of its own */
    char work[sizeof buf * 2];
    size_t w = 0;
    for (size_t i = 0; i < n && w + 2 < sizeof work; i++) {
        if (i + 13 <= n && !memcmp(buf + i, "<|constrain|>", 13)) work[w++] = ' ';
        work[w++] = buf[i];
    }
    /* split at whitespace */
    const char *part[8];
    size_t plen[8];
    int np = 0;
    for (size_t i = 0; i < w;) {
        while (i < w && isspace((unsigned char)work[i])) i++;
        size_t s = i;
        while (i < w && !isspace((unsigned char)work[i])) i++;
        if (i > s && np < 8) { part[np] = work + s; plen[np] = i - s; np++; }
    }
    int first = 0;
    if (!h->role_given && np > 0) {
        copy_field(h->role, sizeof h->role, part[0], plen[0]);
        if (!is_role(part[0], plen[0])) strcpy(h->role, "tool");
        first = 1;
    } else if (np > 0 && strlen(h->role) == plen[0] && !memcmp(part[0], h->role, plen[0])) {
        first = 1;
    }
    int rest = np - first;
    if (rest <= 0) return;
    const char *last = part[np - 1];
    size_t ll = plen[np - 1];
    if (ll > 3 && !memcmp(last, "to=", 3)) {
        copy_field(h->recipient, sizeof h->recipient, last + 3, ll - 3);
    } else if (rest == 1) {
        copy_field(h->recipient, sizeof h->recipient, last, ll);
    } else {
        copy_field(h->content_type, sizeof h->content_type, last, ll);
        const char *r = part[np - 2];
        size_t rl = plen[np - 2];
        if (rl > 3 && !memcmp(r, "to=", 3)) r += 3, rl -= 3;
        copy_field(h->recipient, sizeof h->recipient, r, rl);
    }
}

colibri_harmony_event colibri_harmony_push(colibri_harmony *h, int32_t id, const char *piece,
                                           size_t piece_len) {
    switch (h->state) {
    case COLIBRI_HARMONY_EXPECT_START:
        if (id == h->ids.start) {
            h->state = COLIBRI_HARMONY_HEADER;
            h->role_given = 0;
            h->header_len = 0;
            h->header_overflow = 0;
            h->role[0] = '\0';
        }
        return COLIBRI_HEV_SKIP; /* anything else outside a message is skipped */
    case COLIBRI_HARMONY_HEADER:
        if (id == h->ids.message) {
            parse_header(h);
            h->state = COLIBRI_HARMONY_CONTENT;
            h->n_messages++;
            return COLIBRI_HEV_BEGIN;
        }
        if (id == h->ids.ret || id == h->ids.call) { h->state = COLIBRI_HARMONY_DONE; return COLIBRI_HEV_SKIP; }
        if (h->header_len + piece_len <= sizeof h->header) {
            memcpy(h->header + h->header_len, piece, piece_len);
            h->header_len += piece_len;
        } else {
            h->header_overflow = 1; /* a runaway header: the rest is dropped */
        }
        return COLIBRI_HEV_SKIP;
    case COLIBRI_HARMONY_CONTENT:
        if (id == h->ids.end) { h->state = COLIBRI_HARMONY_EXPECT_START; return COLIBRI_HEV_END; }
        if (id == h->ids.ret || id == h->ids.call) { h->state = COLIBRI_HARMONY_DONE; return COLIBRI_HEV_STOP; }
        return COLIBRI_HEV_CONTENT;
    default:
        return COLIBRI_HEV_SKIP;
    }
}

colibri_text_kind colibri_harmony_kind(const colibri_harmony *h) {
    if (h->recipient[0]) return COLIBRI_TEXT_TOOL_CALL;
    if (!strcmp(h->channel, "analysis")) return COLIBRI_TEXT_REASONING;
    return COLIBRI_TEXT_CONTENT;
}
