/* HTTP/1.1 request-head parser (http.h). Every index is checked against len; nothing is
 * written to the buffer, so the fuzzer can hand it any bytes. */
#include "http.h"

#include <string.h>

int http_eq(const char *s, size_t n, const char *lit) {
    size_t m = strlen(lit);
    if (n != m) return 0;
    for (size_t i = 0; i < n; i++) {
        char a = s[i], b = lit[i];
        if (a >= 'A' && a <= 'Z') a = (char)(a - 'A' + 'a');
        if (b >= 'A' && b <= 'Z') b = (char)(b - 'A' + 'a');
        if (a != b) return 0;
    }
    return 1;
}

/* RFC 9110 tchar */
static int is_tchar(unsigned char c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return 1;
    return c && strchr("!#$%&'*+-.^_`|~", c) != NULL;
}

/* Header field value bytes: visible ASCII, space, tab and obs-text (>= 0x80). */
static int is_vchar(unsigned char c) { return c == '\t' || (c >= 0x20 && c != 0x7F); }

/* Offset of the first CRLF at or after i (the CR), or -1. A bare CR or LF is an error (-2). */
static long find_crlf(const char *b, size_t len, size_t i) {
    for (; i < len; i++) {
        if (b[i] == '\r') {
            if (i + 1 >= len) return -1;
            return b[i + 1] == '\n' ? (long)i : -2;
        }
        if (b[i] == '\n') return -2;
    }
    return -1;
}

/* Does a comma-separated header value contain token tok (case-insensitive)? */
static int has_token(const char *v, size_t n, const char *tok) {
    size_t i = 0;
    while (i < n) {
        while (i < n && (v[i] == ' ' || v[i] == '\t' || v[i] == ',')) i++;
        size_t s = i;
        while (i < n && v[i] != ',') i++;
        size_t e = i;
        while (e > s && (v[e - 1] == ' ' || v[e - 1] == '\t')) e--;
        if (e > s && http_eq(v + s, e - s, tok)) return 1;
    }
    return 0;
}

static int parse_request_line(const char *b, size_t n, http_request *r) {
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)b[i])) i++;
    if (i == 0 || i > 16 || i >= n || b[i] != ' ') return -400;
    r->method = b;
    r->method_len = i;
    size_t t = ++i;
    while (i < n && b[i] != ' ') {
        unsigned char c = (unsigned char)b[i];
        if (c <= 0x20 || c >= 0x7F) return -400;
        i++;
    }
    if (i == t || i >= n || b[t] != '/') return -400; /* origin-form only: "/path?query" */
    r->path = b + t;
    const char *q = memchr(b + t, '?', i - t);
    r->path_len = q ? (size_t)(q - (b + t)) : i - t;
    i++;
    if (n - i != 8 || memcmp(b + i, "HTTP/1.", 7)) {
        if (n - i == 8 && !memcmp(b + i, "HTTP/", 5)) return -505;
        return -400;
    }
    char m = b[i + 7];
    if (m != '0' && m != '1') return -505;
    r->minor = m - '0';
    return 0;
}

/* A header that may appear once (http.h): keep its value, or -400 for a second one. */
static int once(const char **value, size_t *len, const char *v, size_t vn) {
    if (*value) return -400;
    *value = v;
    *len = vn;
    return 0;
}

static int parse_header(const char *b, size_t n, http_request *r, int *seen_cl) {
    size_t i = 0;
    while (i < n && is_tchar((unsigned char)b[i])) i++;
    if (i == 0 || i >= n || b[i] != ':') return -400; /* also rejects obs-fold and "name :" */
    const char *name = b;
    size_t name_len = i++;
    while (i < n && (b[i] == ' ' || b[i] == '\t')) i++;
    size_t e = n;
    while (e > i && (b[e - 1] == ' ' || b[e - 1] == '\t')) e--;
    for (size_t k = i; k < e; k++)
        if (!is_vchar((unsigned char)b[k])) return -400;
    const char *v = b + i;
    size_t vn = e - i;
    if (http_eq(name, name_len, "content-length")) {
        if (vn == 0 || vn > 15) return -400; /* 15 digits: far beyond any body limit, no overflow */
        long long x = 0;
        for (size_t k = 0; k < vn; k++) {
            if (v[k] < '0' || v[k] > '9') return -400;
            x = x * 10 + (v[k] - '0');
        }
        if (*seen_cl && x != r->content_length) return -400;
        *seen_cl = 1;
        r->content_length = x;
    } else if (http_eq(name, name_len, "transfer-encoding")) {
        return -501;
    } else if (http_eq(name, name_len, "connection")) {
        if (has_token(v, vn, "close")) r->keep_alive = 0;
        else if (has_token(v, vn, "keep-alive")) r->keep_alive = 1;
    } else if (http_eq(name, name_len, "expect")) {
        if (!http_eq(v, vn, "100-continue")) return -400; /* RFC 9110: 417 also allowed */
        r->expect_continue = 1;
    } else if (http_eq(name, name_len, "authorization")) {
        return once(&r->authorization, &r->authorization_len, v, vn);
    } else if (http_eq(name, name_len, "content-type")) {
        return once(&r->content_type, &r->content_type_len, v, vn);
    } else if (http_eq(name, name_len, "host")) {
        return once(&r->host, &r->host_len, v, vn);
    } else if (http_eq(name, name_len, "origin")) {
        return once(&r->origin, &r->origin_len, v, vn);
    }
    return 0;
}

long http_parse_request(const char *buf, size_t len, size_t max_head, http_request *r) {
    memset(r, 0, sizeof *r);
    r->content_length = -1;
    size_t scan = len < max_head ? len : max_head;
    /* RFC 9112 2.2: ignore at least one empty line before the request line */
    size_t start = 0;
    if (scan >= 2 && buf[0] == '\r' && buf[1] == '\n') start = 2;
    long eol = find_crlf(buf, scan, start);
    if (eol == -2) return -400;
    if (eol < 0) return len >= max_head ? -431 : HTTP_INCOMPLETE;
    int rc = parse_request_line(buf + start, (size_t)eol - start, r);
    if (rc) return rc;
    r->keep_alive = r->minor == 1;
    int seen_cl = 0, headers = 0;
    size_t pos = (size_t)eol + 2;
    for (;;) {
        long e = find_crlf(buf, scan, pos);
        if (e == -2) return -400;
        if (e < 0) return len >= max_head ? -431 : HTTP_INCOMPLETE;
        if ((size_t)e == pos) { /* the blank line */
            r->header_len = pos + 2;
            return (long)r->header_len;
        }
        if (++headers > HTTP_MAX_HEADERS) return -431;
        rc = parse_header(buf + pos, (size_t)e - pos, r, &seen_cl);
        if (rc) return rc;
        pos = (size_t)e + 2;
    }
}

static int name_char(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
           c == '.' || c == '_';
}

int http_split_host(const char *h, size_t n, const char **name, size_t *name_len, int *v6) {
    size_t end;
    *v6 = 0;
    if (n && h[0] == '[') {
        const char *rb = memchr(h, ']', n);
        if (!rb || rb == h + 1) return -1;
        *name = h + 1;
        *name_len = (size_t)(rb - h) - 1;
        *v6 = 1;
        for (size_t i = 0; i < *name_len; i++) {
            char c = (*name)[i];
            if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F') || c == ':' || c == '.'))
                return -1;
        }
        end = (size_t)(rb - h) + 1;
    } else {
        size_t i = 0;
        while (i < n && name_char((unsigned char)h[i])) i++;
        if (i == 0) return -1;
        *name = h;
        *name_len = i;
        end = i;
    }
    if (end == n) return 0;
    if (h[end] != ':' || n - end - 1 > 5) return -1; /* RFC 3986 allows an empty port */
    for (size_t i = end + 1; i < n; i++)
        if (h[i] < '0' || h[i] > '9') return -1;
    return 0;
}

const char *http_status_text(int s) {
    switch (s) {
    case 100: return "Continue";
    case 200: return "OK";
    case 400: return "Bad Request";
    case 204: return "No Content";
    case 401: return "Unauthorized";
    case 403: return "Forbidden";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 411: return "Length Required";
    case 413: return "Content Too Large";
    case 415: return "Unsupported Media Type";
    case 431: return "Request Header Fields Too Large";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 505: return "HTTP Version Not Supported";
    }
    return "Error";
}
