/* Little-endian writers and f32 -> 16-bit float rounding for the model writers: the selftest's
 * synthetic model (selftest_model.c) and `colibri synth` (tools/cmd_synth.c). */
#ifndef COLIBRI_LE_WRITE_H
#define COLIBRI_LE_WRITE_H

#include <math.h>
#include <stdint.h>
#include <string.h>

static inline void le_put32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static inline void le_put64(uint8_t *p, uint64_t v) {
    le_put32(p, (uint32_t)v);
    le_put32(p + 4, (uint32_t)(v >> 32));
}
static inline void le_putf(uint8_t *p, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    le_put32(p, u);
}

/* f32 -> f16 bits, round to nearest even; no overflow handling (the writers' values are small).
 * Below the smallest normal (2^-14): rounded subnormals when `subnormals`, else signed zero
 * (the selftest model's data, whose bytes its checks were made with). */
static inline uint16_t le_half(float f, int subnormals) {
    uint32_t u;
    memcpy(&u, &f, 4);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const float a = fabsf(f);
    if (a < 6.103515625e-05f)
        return (uint16_t)(subnormals ? sign | (uint32_t)lrintf(a * 16777216.0f) : sign);
    uint32_t h = ((((u >> 23) & 0xffu) - 112u) << 10) | ((u & 0x7fffffu) >> 13);
    const uint32_t rest = u & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* f32 -> bf16 bits, round to nearest even. */
static inline uint16_t le_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
