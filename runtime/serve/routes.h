/* What a request head may ask, decided as soon as the head is complete and before any body is
 * read (docs/serve.md, "Security"):
 *   1. Host (RFC 9112 3.2: required in HTTP/1.1, once): on a loopback bind only loopback names
 *      (localhost, *.localhost, 127.0.0.0/8, [::1]) and the --allow-host names, so a web page
 *      that rebinds its own DNS name to 127.0.0.1 cannot reach the service; on other binds any
 *      name unless --allow-host narrows it. 400 when missing or malformed, 403 when not allowed.
 *   2. Origin (only browsers send one): refused (403) unless --allow-origin names it; an allowed
 *      one gets CORS headers and its preflight (OPTIONS) is answered.
 *   3. The endpoint and method (404, 405), then the API key (401; /health never needs it).
 *   4. POST bodies: Content-Length (411, 413), then `Content-Type: application/json` (415): a
 *      form or text/plain POST, which browsers send without a preflight, is refused unread.
 * The cheap endpoints are answered here too, in the event loop. */
#ifndef COLIBRI_SERVE_ROUTES_H
#define COLIBRI_SERVE_ROUTES_H

#include <stddef.h>

#include "conn.h"
#include "http.h"
#include "service.h"

/* Split and check the --allow-host and --allow-origin lists into S. 0, or -1 with the reason
 * on stderr. */
int routes_init(server *S);
void routes_free(server *S);

/* Decide on the complete head r of c: answers it (ROUTE_DONE), or stores what the body needs in
 * c and returns ROUTE_COMPLETION or ROUTE_CHAT for a request thread. */
int route_head(conn *c, const http_request *r);

#endif
