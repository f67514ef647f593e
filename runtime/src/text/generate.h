/* The generation loop (colibri.h, "Generation"): internals the tests reach. */
#ifndef COLIBRI_GENERATE_H
#define COLIBRI_GENERATE_H

#include <stddef.h>

/* Bytes at the end of text[0..len) that form an incomplete UTF-8 character (0..3). */
size_t colibri_utf8_incomplete_tail(const char *text, size_t len);

/* Longest k < strlen(stop) with text ending in stop's first k bytes (a stop string that may
 * still complete with the next token). */
size_t colibri_stop_prefix_tail(const char *text, size_t len, const char *stop);

/* Copy in[0..n) to out replacing each maximal invalid UTF-8 subpart by U+FFFD (as Python's
 * bytes.decode("utf-8", "replace") and Rust's from_utf8_lossy, which `tokenizers` uses). out
 * must hold 3 * n bytes. Returns the bytes written. */
size_t colibri_utf8_sanitize(const char *in, size_t n, char *out);

#endif
