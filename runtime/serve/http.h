/* A small, strict HTTP/1.1 request-head parser for the service (server.c), and status texts.
 *
 * Why our own and not an embeddable library: the service needs a request line, a handful of
 * headers and Content-Length bodies from well-behaved clients (the OpenAI SDK, curl, a health
 * probe); a pure function over a byte buffer is about 200 lines, is fuzzed as it is
 * (runtime/fuzz/fuzz_http.c), needs no download, pin or second build system, and keeps the one
 * reproducible zig build with its glibc floor (docs/serve.md, "HTTP layer").
 *
 * What it accepts (RFC 9112, strictly): `METHOD SP origin-form-target SP HTTP/1.0|1.1 CRLF`,
 * then `name: value CRLF` header lines (token names, no space before the colon, no obsolete line
 * folding, no bare CR or LF), then CRLF. Content-Length must be digits and agree when repeated;
 * Transfer-Encoding request bodies are refused (501): every client we serve sends a length.
 * Host, Origin, Authorization and Content-Type may appear once each (a second one is 400: two
 * values would let two readers of the request disagree); what they must say is the server's
 * policy (routes.c), not syntax. */
#ifndef COLIBRI_HTTP_H
#define COLIBRI_HTTP_H

#include <stddef.h>

#define HTTP_MAX_HEADERS 100

typedef struct {
    const char *method;         /* points into the parsed buffer; not NUL-terminated */
    size_t method_len;
    const char *path;           /* target without the query string */
    size_t path_len;
    int minor;                  /* HTTP/1.<minor>: 0 or 1 */
    size_t header_len;          /* bytes of the head, blank line included */
    long long content_length;   /* -1 when absent */
    int keep_alive;             /* 1.1 without "Connection: close", or 1.0 with keep-alive */
    int expect_continue;        /* "Expect: 100-continue" */
    const char *authorization;  /* value of Authorization, or NULL */
    size_t authorization_len;
    const char *content_type;   /* value of Content-Type, or NULL */
    size_t content_type_len;
    const char *host;           /* value of Host, or NULL (RFC 9112 3.2: at most one) */
    size_t host_len;
    const char *origin;         /* value of Origin, or NULL (a browser's request) */
    size_t origin_len;
} http_request;

/* The outcome of http_parse_request. */
#define HTTP_INCOMPLETE 0       /* no blank line yet: read more (unless the head is too long) */

/* Parse the request head at buf[0..len). Returns HTTP_INCOMPLETE, the head's length (> 0) when
 * complete (r filled), or minus an HTTP status when malformed: -400 bad syntax, -431 head longer
 * than max_head, -501 a Transfer-Encoding body, -505 a version other than 1.0/1.1. */
long http_parse_request(const char *buf, size_t len, size_t max_head, http_request *r);

/* Split a Host value (RFC 3986: host [":" port]; a name as DNS spells it: letters, digits, '-',
 * '.', '_'; an IP-literal in brackets) into its name, without brackets, and whether it was an
 * IP-literal. 0, or -1 when malformed (empty, other characters, a port that is not 0..5 digits). */
int http_split_host(const char *h, size_t n, const char **name, size_t *name_len, int *v6);

/* "OK", "Bad Request", ... for the statuses the service sends. */
const char *http_status_text(int status);

/* Case-insensitive equality of a counted string and a C string. */
int http_eq(const char *s, size_t n, const char *lit);

#endif
