/* Small helpers shared by the colibri CLI's subcommands (the tools/ directory): number and id-list parsing,
 * a monotonic clock, JSON string output and opening a context with a one-line error. */
#ifndef COLIBRI_TOOLS_CLI_H
#define COLIBRI_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "colibri.h"

/* Decimal integer in [lo, hi], the whole string (NULL is rejected). 0, or -1 when bad. */
int cli_long(const char *s, long lo, long hi, long *out);

/* "1,2,3" -> *out (malloc'd, the caller frees) and *n. 0, or -1 when a field is not an int32
 * or memory runs out. */
int cli_ids(const char *s, int32_t **out, size_t *n);

/* Milliseconds on the monotonic clock. */
double cli_now_ms(void);

/* The n bytes at s as a JSON string: quote and backslash escaped, control bytes as \u00XX,
 * other bytes as they are. */
void cli_json_string(FILE *f, const char *s, size_t n);

/* colibri_init_ex with these options; on failure prints "colibri: MODEL: STATUS: DETAIL" on
 * stderr and returns 1 (0 on success). */
int cli_open(const char *model, colibri_backend backend, int threads, int int8_act,
             colibri_kv_dtype kv, colibri_ctx **ctx);

/* --kv-cache VALUE: "f32" or "f16". 0, or -1 for anything else (the caller prints the usage). */
int cli_kv_dtype(const char *s, colibri_kv_dtype *out);
#define CLI_KV_USAGE "--kv-cache must be f32 or f16"


#endif
