/* A small strict JSON parser (RFC 8259) and writer for the HTTP service (server.c).
 *
 * Parser: the whole text is parsed into a flat array of nodes; containers link to their first
 * child and every node to its next sibling (object children alternate key, value). Strings are
 * decoded (escapes, surrogate pairs) into one buffer owned by the document and are NUL-terminated;
 * "\u0000" is refused so that a decoded string never hides a NUL. Strict means: one value and
 * nothing but whitespace after it, no trailing commas, no comments, no NaN/Infinity, no leading
 * zeros, valid UTF-8 only, no raw control characters in strings, no duplicate object keys, and
 * a nesting limit. Every refusal leaves a one-line reason in doc->err with its byte offset.
 *
 * Writer: a growable byte buffer with helpers that always produce valid JSON: strings are
 * escaped, and bytes that are not valid UTF-8 (a token may end inside a multi-byte character)
 * are written as U+FFFD (one per maximal ill-formed subpart, as Python and Rust decode). A NUL
 * byte is written as \u0000, which this parser refuses in requests. */
#ifndef COLIBRI_JSON_H
#define COLIBRI_JSON_H

#include <stddef.h>
#include <stdint.h>

typedef enum {
    JSON_NULL, JSON_FALSE, JSON_TRUE, JSON_NUMBER, JSON_STRING, JSON_ARRAY, JSON_OBJECT
} json_type;

#define JSON_NONE (-1)      /* "no node" (absent key, end of a sibling chain) */
#define JSON_MAX_DEPTH 64

typedef struct {
    json_type type;
    int child;              /* arrays/objects: first child or JSON_NONE */
    int next;               /* next sibling or JSON_NONE */
    int count;              /* arrays: elements; objects: key/value pairs */
    const char *str;        /* strings: decoded, NUL-terminated (points into the doc) */
    size_t len;             /* strings: decoded byte length */
    double num;             /* numbers */
    int is_int;             /* numbers: written without fraction or exponent */
} json_node;

typedef struct {
    json_node *nodes;
    int n, cap;
    char *strings;          /* decoded string bytes; at most the text's length + 1 per string */
    size_t slen, scap;
    char err[128];
} json_doc;

/* Parse len bytes of text. Returns 0 (root is node 0) or -1 with doc->err set. Always call
 * json_free afterwards (also on failure). */
int json_parse(json_doc *doc, const char *text, size_t len);
void json_free(json_doc *doc);

/* Value of key in object node obj, or JSON_NONE. */
int json_get(const json_doc *doc, int obj, const char *key);
/* 1 when node is a number that is an integer within [lo, hi], storing it in *out. */
int json_int(const json_doc *doc, int node, long long lo, long long hi, long long *out);
const char *json_type_name(json_type t);

/* Writer. On allocation failure the buffer sets `failed` and ignores further writes. */
typedef struct {
    char *buf;
    size_t len, cap;
    int failed;
} json_buf;

void jb_free(json_buf *b);
void jb_reset(json_buf *b);
void jb_raw(json_buf *b, const char *s, size_t n);
void jb_puts(json_buf *b, const char *s);
void jb_printf(json_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* A JSON string literal of n bytes; invalid UTF-8 becomes U+FFFD. */
void jb_str(json_buf *b, const char *s, size_t n);
void jb_cstr(json_buf *b, const char *s);
/* A finite double as a JSON number (non-finite values become null). */
void jb_num(json_buf *b, double v);

/* Length of the longest prefix of s[0..n) that does not end inside an incomplete UTF-8
 * sequence (a streamed token's bytes are held back until their character is complete). */
size_t utf8_complete_prefix(const char *s, size_t n);

#endif
