/* Helpers of the file readers (model.c, tokenizer.c, chat.c): a refusal with a one-line reason,
 * and little-endian integer reads (the .colibri format is little-endian on any host). */
#ifndef COLIBRI_LE_H
#define COLIBRI_LE_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "colibri.h"

/* Writes the reason (printf-style) into why[0..len) when given; returns s. */
static inline colibri_status fail(char *why, size_t len, colibri_status s, const char *fmt, ...) {
    if (why && len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(why, len, fmt, ap);
        va_end(ap);
    }
    return s;
}

static inline uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static inline uint64_t rd64(const uint8_t *p) {
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

#endif
