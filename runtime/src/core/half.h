/* IEEE half <-> f32. half_to_float is exact (subnormals, infinities and NaNs included): the scalar
 * conversion of the f16 kernels (kernels.c) and of the q4 group scales (kernels_q4.c).
 * half_from_float rounds to nearest even: the scalar path of the f16 KV cache (kernels.c). */
#ifndef COLIBRI_HALF_H
#define COLIBRI_HALF_H

#include <stdint.h>
#include <string.h>

static inline float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        if (man == 0) {
            u = sign;
        } else { /* subnormal: renormalise */
            exp = 127 - 15 + 1;
            while (!(man & 0x400)) { man <<= 1; exp--; }
            u = sign | exp << 23 | (man & 0x3ff) << 13;
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | man << 13;
    } else {
        u = sign | (exp - 15 + 127) << 23 | man << 13;
    }
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* f32 -> IEEE half bits, round to nearest even, with the bits F16C (vcvtps2ph) and AArch64 FCVT
 * give in their default modes, so every kernel family stores the same cache: overflow (>= 65520)
 * to infinity, results below 2^-14 as rounded subnormals (2^-25 and below: signed zero), NaN kept
 * as a quiet NaN with the top 9 payload bits. */
static inline uint16_t half_from_float(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    const uint32_t sign = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
    if (a >= 0x7f800000u) /* infinity, or NaN made quiet */
        return (uint16_t)(sign | (a == 0x7f800000u ? 0x7c00u : 0x7e00u | ((a >> 13) & 0x1ffu)));
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* 65520 and up: past the largest half */
    uint32_t h, rest, halfway;
    if (a >= 0x38800000u) { /* normal half: rebias the exponent, keep 10 mantissa bits */
        h = (a >> 13) - ((127u - 15u) << 10);
        rest = a & 0x1fffu;
        halfway = 0x1000u;
    } else if (a > 0x33000000u) { /* subnormal half: the value in units of 2^-24 */
        const uint32_t man = (a & 0x7fffffu) | 0x800000u, shift = 126u - (a >> 23); /* 14..24 */
        h = man >> shift;
        rest = man & ((1u << shift) - 1u);
        halfway = 1u << (shift - 1u);
    } else {
        return (uint16_t)sign; /* <= 2^-25: the tie at 2^-25 goes to the even zero */
    }
    if (rest > halfway || (rest == halfway && (h & 1u))) h++; /* a carry moves up an exponent */
    return (uint16_t)(sign | h);
}

#endif
