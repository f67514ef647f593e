/* libFuzzer harness for the service's request path (runtime/serve/http.c, json.c, oai.c): the
 * bytes a client sends, up to the point where a request would take a slot.
 *
 * For every input:
 *   1. http_parse_request on the whole input and on every prefix length the server could see
 *      (incremental reads): the outcome is incomplete, an error status, or a head whose fields
 *      lie inside the buffer; a complete head found on a prefix is found again on the whole; the
 *      Host value split into its name by http_split_host, which must lie inside the value;
 *   2. the body after the head (or the whole input when there is no head) goes through
 *      json_parse and, when it parses, oai_decode as a completion and as a chat request;
 *   3. every error body and every string written by the JSON writer (including the raw input as
 *      a string, invalid UTF-8 and all; NUL excepted, refused by design) must parse back with
 *      the strict parser.
 * The input is copied into an allocation of exactly its size, so AddressSanitizer reports any
 * read past the end; UBSan aborts on the first finding. */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "http.h"
#include "json.h"
#include "oai.h"

static void must_reparse(const json_buf *b) {
    if (b->failed) return;
    json_doc d;
    int rc = json_parse(&d, b->buf, b->len);
    if (rc) {
        /* the writer produced something the parser refuses: a bug in one of them */
        abort();
    }
    json_free(&d);
}

static void check_head(const char *buf, size_t len, const http_request *r, long rc) {
    if (rc <= 0) {
        assert(rc == HTTP_INCOMPLETE || rc == -400 || rc == -431 || rc == -501 || rc == -505);
        return;
    }
    assert((size_t)rc == r->header_len && r->header_len <= len);
    assert(r->method >= buf && r->method + r->method_len <= buf + len);
    assert(r->path >= buf && r->path + r->path_len <= buf + len && r->path[0] == '/');
    if (r->authorization) assert(r->authorization + r->authorization_len <= buf + len);
    if (r->content_type) assert(r->content_type + r->content_type_len <= buf + len);
    if (r->origin) assert(r->origin >= buf && r->origin + r->origin_len <= buf + len);
    if (r->host) {
        assert(r->host >= buf && r->host + r->host_len <= buf + len);
        /* the Host policy (routes.c) reads the name http_split_host gives: inside the value */
        const char *name;
        size_t name_len;
        int v6;
        if (http_split_host(r->host, r->host_len, &name, &name_len, &v6) == 0)
            assert(name >= r->host && name + name_len <= r->host + r->host_len && name_len > 0);
    }
    assert(r->minor == 0 || r->minor == 1);
    assert(r->content_length >= -1);
}

static void decode_body(const char *body, size_t n) {
    json_doc d;
    if (json_parse(&d, body, n) == 0) {
        for (int chat = 0; chat < 2; chat++) {
            oai_request rq;
            oai_error e;
            memset(&e, 0, sizeof e);
            if (oai_decode(&d, chat, &rq, &e)) {
                assert(e.status == 400 || e.status == 500);
                json_buf b = {0};
                oai_error_json(&b, &e);
                must_reparse(&b);
                jb_free(&b);
            } else {
                for (int i = 0; i < rq.n_messages; i++)
                    assert(strlen(rq.messages[i].content) == rq.messages[i].content_len);
            }
            oai_request_free(&rq);
        }
    } else {
        assert(d.err[0]);
    }
    json_free(&d);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *buf = malloc(size ? size : 1);
    if (!buf) return 0;
    memcpy(buf, data, size);

    http_request whole;
    long rc = http_parse_request(buf, size, 16384, &whole);
    check_head(buf, size, &whole, rc);
    /* a server reads in pieces: a few prefixes must agree with the whole */
    for (size_t cut = 1; cut < size && cut < 64; cut += 7) {
        http_request part;
        long prc = http_parse_request(buf, cut, 16384, &part);
        check_head(buf, cut, &part, prc);
        if (prc > 0) assert(prc == rc);
    }
    if (rc > 0) decode_body(buf + rc, size - (size_t)rc);
    else decode_body(buf, size);

    json_buf b = {0};
    /* the writer keeps NUL bytes (\u0000), which the parser refuses by design */
    int has_nul = memchr(buf, 0, size) != NULL;
    jb_puts(&b, "{\"s\": ");
    jb_str(&b, buf, size);
    jb_puts(&b, ", \"n\": ");
    jb_num(&b, size ? (double)(int8_t)buf[0] / 3.0 : 0.0);
    jb_puts(&b, "}");
    if (!has_nul) must_reparse(&b);
    jb_free(&b);
    size_t keep = utf8_complete_prefix(buf, size);
    assert(keep <= size && size - keep <= 3);
    free(buf);
    return 0;
}
