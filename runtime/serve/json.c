/* Strict JSON parser and writer (json.h). */
#include "json.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    json_doc *d;
    const char *s;
    size_t len, pos;
    int depth;
    int *scratch;           /* duplicate-key check: 2 * scratch_cap key node ids */
    int scratch_cap;
} parser;

static int fail(parser *p, const char *what) {
    snprintf(p->d->err, sizeof p->d->err, "%s at byte %zu", what, p->pos);
    return JSON_NONE;
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

static int new_node(parser *p, json_type t) {
    json_doc *d = p->d;
    if (d->n == d->cap) {
        int cap = d->cap ? d->cap * 2 : 64;
        json_node *nn = realloc(d->nodes, (size_t)cap * sizeof *nn);
        if (!nn) return fail(p, "out of memory");
        d->nodes = nn;
        d->cap = cap;
    }
    json_node *n = &d->nodes[d->n];
    memset(n, 0, sizeof *n);
    n->type = t;
    n->child = n->next = JSON_NONE;
    return d->n++;
}

/* Length of the valid UTF-8 sequence at s[0..n) (1..4), or 0 when invalid (overlong forms,
 * surrogates and code points above U+10FFFF are invalid). */
static int utf8_seq(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    if (c < 0x80) return 1;
    int len;
    unsigned cp;
    if (c >= 0xC2 && c <= 0xDF) { len = 2; cp = c & 0x1F; }
    else if (c >= 0xE0 && c <= 0xEF) { len = 3; cp = c & 0x0F; }
    else if (c >= 0xF0 && c <= 0xF4) { len = 4; cp = c & 0x07; }
    else return 0;
    if ((size_t)len > n) return 0;
    for (int i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3F);
    }
    if ((len == 3 && cp < 0x800) || (len == 4 && (cp < 0x10000 || cp > 0x10FFFF))) return 0;
    if (cp >= 0xD800 && cp <= 0xDFFF) return 0;
    return len;
}

/* Bytes of the longest prefix of s that starts a well-formed sequence but does not complete
 * it (at least 1): the unit that one U+FFFD replaces. */
static size_t utf8_maximal_subpart(const unsigned char *s, size_t n) {
    unsigned c = s[0];
    size_t len;
    unsigned lo = 0x80, hi = 0xBF; /* allowed range of the second byte */
    if (c >= 0xC2 && c <= 0xDF) len = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        len = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        len = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else return 1;
    size_t k = 1;
    if (k < n && k < len && s[k] >= lo && s[k] <= hi) k++;
    else return 1;
    while (k < n && k < len && (s[k] & 0xC0) == 0x80) k++;
    return k;
}

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9') v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f') v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F') v |= (unsigned)(c - 'A' + 10);
        else return -1;
    }
    *out = v;
    return 0;
}

static void put_utf8(char *o, size_t *k, unsigned cp) {
    if (cp < 0x80) o[(*k)++] = (char)cp;
    else if (cp < 0x800) {
        o[(*k)++] = (char)(0xC0 | (cp >> 6));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | (cp >> 12));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        o[(*k)++] = (char)(0xF0 | (cp >> 18));
        o[(*k)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[(*k)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* At the opening quote. Decoded bytes never outnumber the raw ones (an escape of 6 or 12 bytes
 * decodes to at most 3 or 4), so the string buffer sized to the text always has room. */
static int parse_string(parser *p) {
    int id = new_node(p, JSON_STRING);
    if (id < 0) return id;
    json_doc *d = p->d;
    char *o = d->strings + d->slen;
    size_t k = 0;
    p->pos++;
    for (;;) {
        if (p->pos >= p->len) return fail(p, "unterminated string");
        unsigned char c = (unsigned char)p->s[p->pos];
        if (c == '"') { p->pos++; break; }
        if (c < 0x20) return fail(p, "control character in string");
        if (c == '\\') {
            if (p->pos + 1 >= p->len) return fail(p, "unterminated escape");
            char e = p->s[p->pos + 1];
            const char *map = strchr("\"\\/bfnrt", e);
            if (e && map) {
                static const char out[] = "\"\\/\b\f\n\r\t";
                o[k++] = out[map - "\"\\/bfnrt"];
                p->pos += 2;
                continue;
            }
            if (e != 'u') return fail(p, "invalid escape");
            unsigned cp, lo;
            if (p->pos + 6 > p->len || hex4(p->s + p->pos + 2, &cp)) return fail(p, "invalid \\u escape");
            p->pos += 6;
            if (cp >= 0xDC00 && cp <= 0xDFFF) return fail(p, "lone low surrogate");
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (p->pos + 6 > p->len || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u' ||
                    hex4(p->s + p->pos + 2, &lo) || lo < 0xDC00 || lo > 0xDFFF)
                    return fail(p, "lone high surrogate");
                p->pos += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            }
            if (cp == 0) return fail(p, "\\u0000 in string");
            put_utf8(o, &k, cp);
            continue;
        }
        int n = utf8_seq((const unsigned char *)p->s + p->pos, p->len - p->pos);
        if (!n) return fail(p, "invalid UTF-8 in string");
        memcpy(o + k, p->s + p->pos, (size_t)n);
        k += (size_t)n;
        p->pos += (size_t)n;
    }
    o[k] = '\0';
    d->nodes[id].str = NULL; /* set after parsing: the node array may still move, strings not */
    d->nodes[id].len = k;
    d->nodes[id].num = (double)d->slen; /* offset into strings, resolved in json_parse */
    d->slen += k + 1;
    return id;
}

static int parse_number(parser *p) {
    size_t start = p->pos;
    const char *s = p->s;
    int is_int = 1;
    if (p->pos < p->len && s[p->pos] == '-') p->pos++;
    if (p->pos >= p->len) return fail(p, "invalid number");
    if (s[p->pos] == '0') p->pos++;
    else if (s[p->pos] >= '1' && s[p->pos] <= '9')
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9') p->pos++;
    else return fail(p, "invalid number");
    if (p->pos < p->len && s[p->pos] == '.') {
        is_int = 0;
        p->pos++;
        size_t d0 = p->pos;
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9') p->pos++;
        if (p->pos == d0) return fail(p, "invalid number");
    }
    if (p->pos < p->len && (s[p->pos] == 'e' || s[p->pos] == 'E')) {
        is_int = 0;
        p->pos++;
        if (p->pos < p->len && (s[p->pos] == '+' || s[p->pos] == '-')) p->pos++;
        size_t d0 = p->pos;
        while (p->pos < p->len && s[p->pos] >= '0' && s[p->pos] <= '9') p->pos++;
        if (p->pos == d0) return fail(p, "invalid number");
    }
    size_t n = p->pos - start;
    char tmp[64];
    if (n >= sizeof tmp) return fail(p, "number too long");
    memcpy(tmp, s + start, n);
    tmp[n] = '\0';
    double v = strtod(tmp, NULL);
    if (!isfinite(v)) return fail(p, "number out of range");
    int id = new_node(p, JSON_NUMBER);
    if (id < 0) return id;
    p->d->nodes[id].num = v;
    p->d->nodes[id].is_int = is_int;
    return id;
}

static int parse_value(parser *p);

/* Duplicate keys: once an object is complete, its keys are sorted (merge sort: by length, then
 * bytes) and neighbours compared. A comparison reads at most the shorter key, and each of the
 * log2(k) merge passes compares every key about once, so an object of k keys and B key bytes
 * costs O(B log k): a 1 MiB body of keys with long common prefixes stays in milliseconds. (The
 * pairwise check this replaces was O(k^2 * len): 62 s of CPU for such a body, issue 21.) */
static int key_less(const json_doc *d, int a, int b) {
    const json_node *x = &d->nodes[a], *y = &d->nodes[b];
    if (x->len != y->len) return x->len < y->len;
    return memcmp(d->strings + (size_t)x->num, d->strings + (size_t)y->num, x->len) < 0;
}

static int key_equal(const json_doc *d, int a, int b) {
    const json_node *x = &d->nodes[a], *y = &d->nodes[b];
    return x->len == y->len && !memcmp(d->strings + (size_t)x->num, d->strings + (size_t)y->num, x->len);
}

/* Bottom-up merge sort of keys[0..n) with tmp[0..n) as scratch; the result is in keys. */
static void sort_keys(const json_doc *d, int *keys, int *tmp, int n) {
    int *src = keys, *dst = tmp;
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int i = lo, j = mid, k = lo;
            while (i < mid && j < hi) dst[k++] = key_less(d, src[j], src[i]) ? src[j++] : src[i++];
            while (i < mid) dst[k++] = src[i++];
            while (j < hi) dst[k++] = src[j++];
        }
        int *t = src;
        src = dst;
        dst = t;
    }
    if (src != keys) memcpy(keys, src, (size_t)n * sizeof *keys);
}

/* 0 when the complete object obj has no key twice; else -1 with the key named in doc->err. */
static int check_duplicate_keys(parser *p, int obj) {
    json_doc *d = p->d;
    int n = d->nodes[obj].count;
    if (n < 2) return 0;
    if (n > p->scratch_cap) {
        int *a = realloc(p->scratch, 2 * (size_t)n * sizeof *a);
        if (!a) return fail(p, "out of memory");
        p->scratch = a;
        p->scratch_cap = n;
    }
    int *keys = p->scratch, *tmp = p->scratch + n, i = 0;
    for (int k = d->nodes[obj].child; k != JSON_NONE; k = d->nodes[d->nodes[k].next].next) keys[i++] = k;
    sort_keys(d, keys, tmp, n);
    for (i = 1; i < n; i++)
        if (key_equal(d, keys[i - 1], keys[i])) {
            const json_node *k = &d->nodes[keys[i]];
            snprintf(d->err, sizeof d->err, "duplicate key \"%.*s\"%s in the object that ends at byte %zu",
                     (int)(k->len < 40 ? k->len : 40), d->strings + (size_t)k->num, k->len > 40 ? "..." : "",
                     p->pos);
            return JSON_NONE;
        }
    return 0;
}

static int parse_container(parser *p, int is_obj) {
    if (++p->depth > JSON_MAX_DEPTH) return fail(p, "nesting too deep");
    int id = new_node(p, is_obj ? JSON_OBJECT : JSON_ARRAY);
    if (id < 0) return id;
    char close = is_obj ? '}' : ']';
    p->pos++;
    skip_ws(p);
    int last = JSON_NONE;
    if (p->pos < p->len && p->s[p->pos] == close) {
        p->pos++;
        p->depth--;
        return id;
    }
    for (;;) {
        skip_ws(p);
        if (is_obj) {
            if (p->pos >= p->len || p->s[p->pos] != '"') return fail(p, "expected a string key");
            int k = parse_string(p);
            if (k < 0) return k;
            if (last == JSON_NONE) p->d->nodes[id].child = k;
            else p->d->nodes[last].next = k;
            last = k;
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') return fail(p, "expected ':'");
            p->pos++;
            skip_ws(p);
        }
        int v = parse_value(p);
        if (v < 0) return v;
        if (last == JSON_NONE) p->d->nodes[id].child = v;
        else p->d->nodes[last].next = v;
        last = v;
        p->d->nodes[id].count++;
        skip_ws(p);
        if (p->pos >= p->len) return fail(p, is_obj ? "unterminated object" : "unterminated array");
        if (p->s[p->pos] == ',') { p->pos++; continue; }
        if (p->s[p->pos] == close) { p->pos++; break; }
        return fail(p, is_obj ? "expected ',' or '}'" : "expected ',' or ']'");
    }
    if (is_obj && check_duplicate_keys(p, id)) return JSON_NONE;
    p->depth--;
    return id;
}

static int parse_literal(parser *p, const char *word, json_type t) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n)) return fail(p, "invalid literal");
    p->pos += n;
    return new_node(p, t);
}

static int parse_value(parser *p) {
    skip_ws(p);
    if (p->pos >= p->len) return fail(p, "unexpected end of input");
    char c = p->s[p->pos];
    switch (c) {
    case '{': return parse_container(p, 1);
    case '[': return parse_container(p, 0);
    case '"': return parse_string(p);
    case 't': return parse_literal(p, "true", JSON_TRUE);
    case 'f': return parse_literal(p, "false", JSON_FALSE);
    case 'n': return parse_literal(p, "null", JSON_NULL);
    default:
        if (c == '-' || (c >= '0' && c <= '9')) return parse_number(p);
        return fail(p, "unexpected character");
    }
}

int json_parse(json_doc *d, const char *text, size_t len) {
    memset(d, 0, sizeof *d);
    if (len > (size_t)1 << 30) {
        snprintf(d->err, sizeof d->err, "document too large");
        return -1;
    }
    d->scap = len + 1;
    d->strings = malloc(d->scap);
    if (!d->strings) {
        snprintf(d->err, sizeof d->err, "out of memory");
        return -1;
    }
    parser p = {d, text, len, 0, 0, NULL, 0};
    int root = parse_value(&p);
    free(p.scratch);
    if (root < 0) return -1;
    skip_ws(&p);
    if (p.pos != len) {
        fail(&p, "trailing characters after the value");
        return -1;
    }
    for (int i = 0; i < d->n; i++)
        if (d->nodes[i].type == JSON_STRING) {
            d->nodes[i].str = d->strings + (size_t)d->nodes[i].num;
            d->nodes[i].num = 0;
        }
    return 0;
}

void json_free(json_doc *d) {
    free(d->nodes);
    free(d->strings);
    d->nodes = NULL;
    d->strings = NULL;
    d->n = d->cap = 0;
}

int json_get(const json_doc *d, int obj, const char *key) {
    if (obj < 0 || obj >= d->n || d->nodes[obj].type != JSON_OBJECT) return JSON_NONE;
    size_t klen = strlen(key);
    for (int k = d->nodes[obj].child; k != JSON_NONE;) {
        int v = d->nodes[k].next;
        if (d->nodes[k].len == klen && !memcmp(d->nodes[k].str, key, klen)) return v;
        k = d->nodes[v].next;
    }
    return JSON_NONE;
}

int json_int(const json_doc *d, int node, long long lo, long long hi, long long *out) {
    if (node < 0 || node >= d->n) return 0;
    const json_node *n = &d->nodes[node];
    if (n->type != JSON_NUMBER) return 0;
    /* 3 and 3.0 are the same number; 3.5 is not an integer */
    if (n->num != floor(n->num) || n->num < (double)lo || n->num > (double)hi) return 0;
    *out = (long long)n->num;
    return 1;
}

const char *json_type_name(json_type t) {
    static const char *names[] = {"null", "boolean", "boolean", "number", "string", "array", "object"};
    return (unsigned)t < 7 ? names[t] : "unknown";
}

/* ---- writer ---- */

static int jb_grow(json_buf *b, size_t more) {
    if (b->failed) return -1;
    if (b->len + more + 1 <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1) cap *= 2;
    char *nb = realloc(b->buf, cap);
    if (!nb) {
        b->failed = 1;
        return -1;
    }
    b->buf = nb;
    b->cap = cap;
    return 0;
}

void jb_free(json_buf *b) {
    free(b->buf);
    memset(b, 0, sizeof *b);
}

void jb_reset(json_buf *b) {
    b->len = 0;
    if (b->buf) b->buf[0] = '\0';
}

void jb_raw(json_buf *b, const char *s, size_t n) {
    if (jb_grow(b, n)) return;
    memcpy(b->buf + b->len, s, n);
    b->len += n;
    b->buf[b->len] = '\0';
}

void jb_puts(json_buf *b, const char *s) { jb_raw(b, s, strlen(s)); }

void jb_printf(json_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    char tmp[256];
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n < sizeof tmp) {
        jb_raw(b, tmp, (size_t)n);
        return;
    }
    if (jb_grow(b, (size_t)n)) return;
    va_start(ap, fmt);
    vsnprintf(b->buf + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

void jb_str(json_buf *b, const char *s, size_t n) {
    static const char hex[] = "0123456789abcdef";
    jb_raw(b, "\"", 1);
    size_t i = 0;
    while (i < n) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\') {
            char e[2] = {'\\', (char)c};
            jb_raw(b, e, 2);
            i++;
        } else if (c == '\n') { jb_raw(b, "\\n", 2); i++; }
        else if (c == '\r') { jb_raw(b, "\\r", 2); i++; }
        else if (c == '\t') { jb_raw(b, "\\t", 2); i++; }
        else if (c < 0x20 || c == 0x7F) {
            char e[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
            jb_raw(b, e, 6);
            i++;
        } else {
            int k = utf8_seq((const unsigned char *)s + i, n - i);
            if (k) {
                jb_raw(b, s + i, (size_t)k);
                i += (size_t)k;
            } else {
                /* U+FFFD for each maximal subpart of an ill-formed sequence (Unicode's
                 * recommended practice, as Python's and Rust's lossy decoders do) */
                jb_raw(b, "\xEF\xBF\xBD", 3);
                i += utf8_maximal_subpart((const unsigned char *)s + i, n - i);
            }
        }
    }
    jb_raw(b, "\"", 1);
}

void jb_cstr(json_buf *b, const char *s) { jb_str(b, s, strlen(s)); }

void jb_num(json_buf *b, double v) {
    if (!isfinite(v)) jb_puts(b, "null");
    else if (v == floor(v) && fabs(v) < 1e15) jb_printf(b, "%.0f", v);
    else jb_printf(b, "%.17g", v);
}

size_t utf8_complete_prefix(const char *s, size_t n) {
    /* look back at most 3 bytes for a lead byte whose sequence runs past the end */
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)s[n - back];
        if ((c & 0xC0) == 0x80) continue; /* continuation byte: keep looking for the lead */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > back ? n - back : n;
    }
    return n;
}
