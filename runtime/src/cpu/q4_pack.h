/* The packed q4 layout: the same weights as the file's q4 rows (docs/format.md), rearranged at
 * load for the CPU kernels that read 16 rows at once (q4_x86.c's AVX-512 VNNI kernel).
 *
 * For each block of 16 rows and each group b of 32 columns: four 64-byte chunks c = 0..3, chunk
 * c holding bytes 4c..4c+3 of the 16 rows' group-b nibble blocks (row i at bytes 4i..4i+3),
 * then the 16 rows' f16 scales of group b (32 bytes). 288 bytes per block and group, exactly
 * the bytes its 16 rows take in the file. In a 512-bit register, chunk c's low nibbles are lane
 * c of the q4 x int8 layout (elements 4c..4c+3) for 16 rows, its high nibbles lane c + 4: the
 * kernel runs each (row, lane) chain with the layout's operations in the layout's order, only in
 * another register lane, so the bits are those of the file's layout (the self-test compares).
 *
 * mxfp4 (kernels_mxfp4.c's AVX-512 VNNI int8-activation kernel) has its own packed layout, the
 * same idea: for each block of 16 rows and each block b of 32 columns, four 64-byte chunks
 * k = 0..3, row i's dword at bytes 4i..4i+3 of chunk k holding elements 8k..8k+3 of its block b
 * in the low nibbles of its four bytes (lane 2k of the 8-bit layout) and 8k+4..8k+7 in the high
 * nibbles (lane 2k + 1), then the 16 rows' E8M0 exponents of block b (16 bytes). 272 bytes per
 * block and group, again exactly the file's bytes. The file's bytes hold elements 2j and 2j + 1
 * in byte j, so each dword is a nibble shuffle of two file bytes' pairs, made once here: in the
 * kernel one mask or shift puts a whole lane's four codes in the four bytes of a dword.
 *
 * int8 (x86.c's AVX-512 VNNI int8-activation kernel) too: for each block of 16 rows, chunk k =
 * 0..cols/4 - 1 of 64 bytes holds columns 4k..4k+3 of the 16 rows (row i at bytes 4i..4i+3),
 * each byte w + 128 (w ^ 0x80: the unsigned operand of vpdpbusd, so the activations' dword is
 * broadcast as is and 128 * sum(x) is taken off once per token). rows * cols bytes, the file's
 * weight bytes; the per-row scales stay in the file. Integer sums are exact, so any layout gives
 * the file layout's bits.
 *
 * Only tensors whose rows are a multiple of 16 and whose columns are a multiple of 32 (no tail
 * group; int8: of 4) are packed: every shape the converter writes for the models users run. */
#ifndef COLIBRI_CPU_Q4_PACK_H
#define COLIBRI_CPU_Q4_PACK_H

#include <stddef.h>
#include <stdint.h>

#include "core/model.h"

#define COLIBRI_Q4P_ROWS 16
#define COLIBRI_Q4P_GROUP_BYTES 288 /* 4 chunks of 64 bytes + 16 f16 scales */
#define COLIBRI_MXP_GROUP_BYTES 272 /* 4 chunks of 64 bytes + 16 E8M0 exponents */

/* The rows of 16-row block `blk` inside [r0, r1), as a store mask (bit i: row 16 * blk + i): the
 * packed kernels compute whole blocks and store only these (mm_task splits at block edges, so
 * a partial block is the exception: a caller's own row range). */
static inline uint16_t colibri_packed_rows_mask(uint32_t blk, uint32_t r0, uint32_t r1) {
    uint32_t base = blk * COLIBRI_Q4P_ROWS;
    uint32_t lo = r0 > base ? r0 - base : 0;
    uint32_t hi = r1 - base < COLIBRI_Q4P_ROWS ? r1 - base : COLIBRI_Q4P_ROWS;
    return (uint16_t)(((1u << hi) - 1u) & ~((1u << lo) - 1u));
}

/* 1 when t is q4 with a shape the packed layout holds. */
int colibri_q4_packable(const colibri_tensor *t);

/* Bytes of t in the packed layout (0 when not packable). */
size_t colibri_q4_packed_bytes(const colibri_tensor *t);

/* Write t's packed layout to dst (colibri_q4_packed_bytes(t) bytes). */
void colibri_q4_pack(const colibri_tensor *t, uint8_t *dst);

/* The same for mxfp4 tensors and their packed layout. */
int colibri_mx_packable(const colibri_tensor *t);
size_t colibri_mx_packed_bytes(const colibri_tensor *t);
void colibri_mx_pack(const colibri_tensor *t, uint8_t *dst);

/* The same for int8 tensors and their packed layout. */
int colibri_i8_packable(const colibri_tensor *t);
size_t colibri_i8_packed_bytes(const colibri_tensor *t);
void colibri_i8_pack(const colibri_tensor *t, uint8_t *dst);

/* Which types colibri_model_pack packs: the ones whose kernels read a packed layout on this
 * CPU (colibri_q4_kernels_have_packed, colibri_mxfp4_kernels_have_packed,
 * colibri_int8_kernels_have_packed: the load time buys nothing elsewhere). */
#define COLIBRI_PACK_Q4 1
#define COLIBRI_PACK_MXFP4 2
#define COLIBRI_PACK_INT8 4

/* Pack every packable tensor of the types in `which` of m into one anonymous mapping
 * (m->q4_packed) and point each tensor's `packed` at its copy. Then, unless keep_source (the mapping is mlocked, or the
 * buffer is the caller's), the file pages of the packed bytes are let go (madvise DONTNEED:
 * reading them again reads the file), so the model does not stay resident twice. Returns 0, or
 * an errno when the mapping could not be made (nothing is changed then). Not thread safe: the
 * caller holds the model's lock, before any pass runs on it. */
int colibri_model_pack(struct colibri_model *m, int which, int keep_source);

#endif
