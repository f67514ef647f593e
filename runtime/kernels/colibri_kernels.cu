/* Colibri GPU kernels: the single NVRTC translation unit (docs/cuda.md).
 *
 * The build compiles this file with NVRTC to PTX for the profile's lowest SM, then ptxas makes one
 * cubin per SM; the runtime loads them through the driver API (runtime/src/cuda_backend.c). When
 * that SM is below sm_80 and the plan also has SMs >= 80, a second PTX for the lowest SM >= 80
 * is compiled and the cubins of those SMs come from it (colibri_kit/toolchain.py, ptx_sms). So:
 *   - no standard or CUDA headers (NVRTC ships none); inline PTX only behind __CUDA_ARCH__
 *     (cvt.f32.f16 and cvt.rn.f16.f32, the hardware f16 conversions; the tensor-core section's
 *     cvt.rna.tf32.f32 and mma), so tests/gpu/emu can also compile this file as plain C++ and run
 *     it on a CPU (it supplies exact emulations of those instructions);
 *   - every kernel is extern "C" so its name in the cubin is the name the backend looks up;
 *   - everything but the tensor-core section ("tensor-core prefill GEMM", __CUDA_ARCH__ >= 800,
 *     optional for the backend) uses nothing newer than sm_72 (Xavier).
 *
 * Determinism: no atomics anywhere. Every reduction has a fixed shape (per-lane partial sums in
 * index order, then an xor-butterfly across the warp, then warp partials in warp order), so a
 * kernel gives the same bits run to run and with 1 or 2 streams. Activations are f32; weights are
 * f32, f16, bf16 or int8 with one f32 scale per output row, or grouped 4-bit (q4) with one f16
 * scale per 32 weights (docs/format.md).
 *
 * Layouts: a linear layer's weight is W[rows=out, cols=in] row-major, y[t, r] = W[r, :] . x[t, :].
 * Tensors with a D-sized axis are padded to Dp with zeros, so padded lanes stay exactly zero. */
#include "colibri_config.h"
#include "colibri_abi.h"

typedef unsigned long long cb_u64;
typedef unsigned int cb_u32;
typedef unsigned short cb_u16;

/* short names for the values colibri_abi.h defines */
#define CB_DT_F32 COLIBRI_DT_F32
#define CB_DT_F16 COLIBRI_DT_F16
#define CB_DT_BF16 COLIBRI_DT_BF16
#define CB_DT_INT8 COLIBRI_DT_INT8
/* grouped 4-bit (docs/format.md, "q4"): per row ceil(cols / 32) groups of 16 nibble bytes
 * (byte j = (q[j] + 8) | (q[j + 16] + 8) << 4) and one f16 scale d each ("scales" points at the
 * [rows, groups] f16 array); w = q * d, exact in f32 */
#define CB_DT_Q4 COLIBRI_DT_Q4
#define CB_Q4_GROUP COLIBRI_Q4_GROUP

#define CB_WARP COLIBRI_CU_WARP
#define CB_FULL_MASK 0xffffffffu
#define CB_ROW_WARPS COLIBRI_CU_ROW_WARPS
#define CB_TOKEN_TILE COLIBRI_CU_TOKEN_TILE
#define CB_MAX_SORT COLIBRI_CU_MAX_SORT

#if !defined(COLIBRI_ROUTING_MODE) || !defined(COLIBRI_ROUTING_SOFTMAX_TOPK)
#error "colibri_config.h must define COLIBRI_ROUTING_MODE and COLIBRI_ROUTING_SOFTMAX_TOPK"
#endif
/* A build for more experts than CB_MAX_SORT (Qwen3-Next: 512) keeps these kernels; the host
 * (cuda_backend.c cb_check_model) runs such a model on the CPU instead. */

/* ---- element decoding -------------------------------------------------------------------- */

/* f16 bits -> f32 (exact), by the hardware: one cvt.f32.f16 per element instead of ~16 integer
 * ops and branches. Inline PTX (like cb_float_to_half below), so it is compiled for the GPU only
 * (__CUDA_ARCH__: NVRTC's device pass); the host emulation (tests/gpu/emu/cuda_emu.cpp) runs the
 * same kernels as plain C++ and provides cb_emu_half_to_float, an independent exact conversion
 * (float rescaling, not this file's former integer decode). */
#ifdef __CUDA_ARCH__
__device__ __forceinline__ float cb_half_to_float(cb_u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
#else
#define cb_half_to_float cb_emu_half_to_float
#endif

__device__ __forceinline__ float cb_bf16_to_float(cb_u16 h) {
    return __uint_as_float(((cb_u32)h) << 16);
}

/* One element of a weight tensor as f32 (int8 without its row scale). */
template <int DT>
__device__ __forceinline__ float cb_load1(const void *w, cb_u64 i) {
    if (DT == CB_DT_F32) return ((const float *)w)[i];
    if (DT == CB_DT_F16) return cb_half_to_float(((const cb_u16 *)w)[i]);
    if (DT == CB_DT_BF16) return cb_bf16_to_float(((const cb_u16 *)w)[i]);
    return (float)((const signed char *)w)[i];
}

/* A lane's chunk of a weight row for the vector path, raw: CB_CW(DT) consecutive elements, 8 for
 * f32 (32 bytes, two 128-bit loads), f16/bf16 (16 bytes) and 16 for int8 (16 bytes): every load
 * is 128 bits. Decoded element by element where it is used, so few registers hold decoded
 * weights. */
#define CB_CW(DT) ((DT) == CB_DT_INT8 ? 16 : 8)
struct cb_chunk {
    uint4 a, b; /* b: f32 only */
};

template <int DT>
__device__ __forceinline__ void cb_chunk_load(const void *row, int c, cb_chunk &k) {
    if (DT == CB_DT_F32) {
        const uint4 *p = (const uint4 *)((const float *)row + c);
        k.a = p[0];
        k.b = p[1];
    } else if (DT == CB_DT_INT8) {
        k.a = *(const uint4 *)((const signed char *)row + c);
    } else {
        k.a = *(const uint4 *)((const cb_u16 *)row + c);
    }
}

__device__ __forceinline__ cb_u32 cb_word(const uint4 &v, int i) {
    return i == 0 ? v.x : (i == 1 ? v.y : (i == 2 ? v.z : v.w));
}

/* Element e (a constant after unrolling) of a chunk as f32. */
template <int DT>
__device__ __forceinline__ float cb_chunk_elem(const cb_chunk &k, int e) {
    if (DT == CB_DT_F32) return __uint_as_float(e < 4 ? cb_word(k.a, e) : cb_word(k.b, e - 4));
    if (DT == CB_DT_INT8)
        return (float)(signed char)((cb_word(k.a, e >> 2) >> (8 * (e & 3))) & 0xffu);
    const cb_u32 w = cb_word(k.a, e >> 1);
    if (DT == CB_DT_BF16) return __uint_as_float((e & 1) ? (w & 0xffff0000u) : (w << 16));
    return cb_half_to_float((cb_u16)((e & 1) ? (w >> 16) : (w & 0xffffu)));
}

template <int DT>
__device__ __forceinline__ const void *cb_row_ptr(const void *w, int r, int cols) {
    cb_u64 off = (cb_u64)r * (cb_u64)cols;
    if (DT == CB_DT_F32) return (const float *)w + off;
    if (DT == CB_DT_INT8) return (const signed char *)w + off;
    return (const cb_u16 *)w + off;
}

/* ---- grouped 4-bit rows ---------------------------------------------------------------------- */

__device__ __forceinline__ int cb_q4_groups(int cols) { return (cols + CB_Q4_GROUP - 1) / CB_Q4_GROUP; }

/* Element e (< 32) of a group whose 16 bytes are the words b[0..3], as the signed 4-bit value. */
__device__ __forceinline__ int cb_q4_nib(const cb_u32 *b, int e) {
    const cb_u32 byte = (b[(e & 15) >> 2] >> (8 * (e & 3))) & 0xffu;
    return (int)(e < 16 ? byte & 15u : byte >> 4) - 8;
}

/* Element c of row r, dequantised (the embedding gather). */
__device__ __forceinline__ float cb_q4_load1(const void *w, const float *scales, int r, int cols,
                                             int c) {
    const cb_u64 g = (cb_u64)r * (cb_u64)cb_q4_groups(cols) + (cb_u64)(c / CB_Q4_GROUP);
    const unsigned char *blk = (const unsigned char *)w + g * 16u;
    const int e = c % CB_Q4_GROUP;
    const cb_u32 byte = blk[e & 15];
    const int q = (int)(e < 16 ? byte & 15u : byte >> 4) - 8;
    return (float)q * cb_half_to_float(((const cb_u16 *)scales)[g]);
}

/* acc[m][i] (lane partial) += row r of tensor m . x[i], for NR q4 tensors of the same shape
 * (W1 and W3 of an expert in one pass). The lane's share is fixed: groups lane, lane + 32, ...;
 * each group of each tensor is one 16-byte load (the tensor and every row of groups are 16-byte
 * aligned: 64-byte aligned tensors, 16-byte groups), and its elements are added in index order
 * (the last group stops at cols). Unrolled over the 32 elements so the nibbles stay in
 * registers. */
template <int NR>
__device__ __forceinline__ void cb_rows_dot_q4(const void *const *w, const float *const *scales,
                                               int r, int cols, const float *const *x, int nt,
                                               float (*acc)[CB_TOKEN_TILE]) {
    const int lane = threadIdx.x & (CB_WARP - 1);
    const int ng = cb_q4_groups(cols);
    for (int g = lane; g < ng; g += CB_WARP) {
        cb_u32 b[NR][4];
        float s[NR];
#pragma unroll
        for (int m = 0; m < NR; m++) {
            const cb_u64 at = (cb_u64)r * (cb_u64)ng + (cb_u64)g;
            const uint4 v = ((const uint4 *)w[m])[at];
            b[m][0] = v.x; b[m][1] = v.y; b[m][2] = v.z; b[m][3] = v.w;
            s[m] = cb_half_to_float(((const cb_u16 *)scales[m])[at]);
        }
        const int c0 = g * CB_Q4_GROUP, len = cols - c0 < CB_Q4_GROUP ? cols - c0 : CB_Q4_GROUP;
#pragma unroll
        for (int e = 0; e < CB_Q4_GROUP; e++) {
            if (e < len) {
#pragma unroll
                for (int m = 0; m < NR; m++) {
                    const float wv = (float)cb_q4_nib(b[m], e) * s[m];
#pragma unroll
                    for (int i = 0; i < CB_TOKEN_TILE; i++)
                        if (i < nt) acc[m][i] += wv * x[i][c0 + e];
                }
            }
        }
    }
}

/* ---- reductions with a fixed shape ------------------------------------------------------- */

__device__ __forceinline__ float cb_warp_sum(float v) {
    for (int o = CB_WARP / 2; o > 0; o >>= 1) v += __shfl_xor_sync(CB_FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ float cb_warp_max(float v) {
    for (int o = CB_WARP / 2; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(CB_FULL_MASK, v, o));
    return v;
}

/* Block-wide sum; every thread gets the result. `scratch` holds >= 32 floats. blockDim.x must be
 * a multiple of 32. Warp partials are added by warp 0 in a butterfly (fixed order). */
__device__ float cb_block_sum(float v, float *scratch) {
    const int lane = threadIdx.x & (CB_WARP - 1), warp = threadIdx.x / CB_WARP;
    const int nwarps = blockDim.x / CB_WARP;
    v = cb_warp_sum(v);
    __syncthreads(); /* scratch may still be read by a previous call */
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : 0.0f;
    v = cb_warp_sum(v);
    return v;
}

__device__ float cb_block_max(float v, float *scratch) {
    const int lane = threadIdx.x & (CB_WARP - 1), warp = threadIdx.x / CB_WARP;
    const int nwarps = blockDim.x / CB_WARP;
    v = cb_warp_max(v);
    __syncthreads();
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    v = lane < nwarps ? scratch[lane] : -__int_as_float(0x7f800000);
    v = cb_warp_max(v);
    return v;
}

/* ---- dot products of weight rows with up to CB_TOKEN_TILE activation rows ---------------- */

/* acc[m][i] (lane partial) += chunk k[m] . x[i][c .. c + CW), elements in index order. */
template <int DT, int NR>
__device__ __forceinline__ void cb_chunk_fma(const cb_chunk *k, int c, const float *const *x,
                                             int nt, float (*acc)[CB_TOKEN_TILE]) {
    const int CW = CB_CW(DT);
#pragma unroll
    for (int i = 0; i < CB_TOKEN_TILE; i++) {
        if (i < nt) {
            float xv[CB_CW(DT)];
            const float4 *xp = (const float4 *)(x[i] + c);
#pragma unroll
            for (int q = 0; q < CW / 4; q++) {
                const float4 v = xp[q];
                xv[4 * q] = v.x; xv[4 * q + 1] = v.y; xv[4 * q + 2] = v.z; xv[4 * q + 3] = v.w;
            }
#pragma unroll
            for (int m = 0; m < NR; m++) {
                float s = acc[m][i];
#pragma unroll
                for (int e = 0; e < CW; e++) s += cb_chunk_elem<DT>(k[m], e) * xv[e];
                acc[m][i] = s;
            }
        }
    }
}

/* acc[m][i] (lane partial) += rows[m] . x[i] over the lane's share of columns, for NR rows of
 * the same length read in one pass (W1 and W3 of an expert: NR = 2). The share is fixed:
 * vector path: lane takes columns [CW*lane + 32*CW*j, +CW) for j = 0, 1, ... in order
 * (CW = 8, or 16 for int8); scalar path: columns lane + 32*j. The vector path keeps two chunks
 * per row in flight (f32: one chunk, already two 128-bit loads): both are loaded before the
 * first is used; the sums still run chunk by chunk in column order. */
template <int DT, int NR>
__device__ __forceinline__ void cb_rows_dot(const void *const *rows, int cols,
                                            const float *const *x, int nt, int vec,
                                            float (*acc)[CB_TOKEN_TILE]) {
    const int lane = threadIdx.x & (CB_WARP - 1);
    if (vec) {
        const int step = CB_WARP * CB_CW(DT);
        if (DT == CB_DT_F32) {
            for (int c = lane * CB_CW(DT); c < cols; c += step) {
                cb_chunk k[NR];
#pragma unroll
                for (int m = 0; m < NR; m++) cb_chunk_load<DT>(rows[m], c, k[m]);
                cb_chunk_fma<DT, NR>(k, c, x, nt, acc);
            }
        } else {
            for (int c = lane * CB_CW(DT); c < cols; c += 2 * step) {
                const int c1 = c + step;
                const int cl = c1 < cols ? c1 : c; /* past the row: reload c (cached, unused) */
                cb_chunk k0[NR], k1[NR];
#pragma unroll
                for (int m = 0; m < NR; m++) {
                    cb_chunk_load<DT>(rows[m], c, k0[m]);
                    cb_chunk_load<DT>(rows[m], cl, k1[m]);
                }
                cb_chunk_fma<DT, NR>(k0, c, x, nt, acc);
                if (c1 < cols) cb_chunk_fma<DT, NR>(k1, c1, x, nt, acc);
            }
        }
    } else {
        for (int c = lane; c < cols; c += CB_WARP) {
            float w[NR];
#pragma unroll
            for (int m = 0; m < NR; m++) w[m] = cb_load1<DT>(rows[m], (cb_u64)c);
#pragma unroll
            for (int i = 0; i < CB_TOKEN_TILE; i++) {
                if (i < nt) {
                    const float xv = x[i][c];
#pragma unroll
                    for (int m = 0; m < NR; m++) acc[m][i] += w[m] * xv;
                }
            }
        }
    }
}

/* May the vector path be used? Needs CW | cols and 16-byte aligned bases (checked per launch:
 * every row then starts aligned because cols is a multiple of CW). */
__device__ __forceinline__ int cb_can_vec(const void *w, int dtype, int cols, const float *x,
                                          int x_stride) {
    const int cw = dtype == CB_DT_INT8 ? 16 : 8;
    return (cols % cw) == 0 && (x_stride % 4) == 0 && ((cb_u64)w % 16) == 0 &&
           ((cb_u64)x % 16) == 0;
}

/* ---- embedding ----------------------------------------------------------------------------- */

template <int DT>
__device__ void cb_embed_row(float *xo, const void *table, const float *scales, int id, int Dp) {
    const float s = DT == CB_DT_INT8 ? scales[id] : 1.0f;
    const cb_u64 base = (cb_u64)id * (cb_u64)Dp;
    for (int i = threadIdx.x; i < Dp; i += blockDim.x) {
        float v = DT == CB_DT_Q4 ? cb_q4_load1(table, scales, id, Dp, i)
                                 : cb_load1<DT>(table, base + (cb_u64)i);
        xo[i] = DT == CB_DT_INT8 ? v * s : v;
    }
}

/* x[t, :] = dequant(table[ids[t], :]). grid (n), any block size. ids were range-checked on the
 * host. */
extern "C" __global__ void cb_embed(float *x, int Dp, const int *ids, const void *table,
                                    const float *scales, int dtype) {
    const int t = blockIdx.x;
    float *xo = x + (cb_u64)t * (cb_u64)Dp;
    const int id = ids[t];
    switch (dtype) {
    case CB_DT_F32: cb_embed_row<CB_DT_F32>(xo, table, scales, id, Dp); break;
    case CB_DT_F16: cb_embed_row<CB_DT_F16>(xo, table, scales, id, Dp); break;
    case CB_DT_BF16: cb_embed_row<CB_DT_BF16>(xo, table, scales, id, Dp); break;
    case CB_DT_Q4: cb_embed_row<CB_DT_Q4>(xo, table, scales, id, Dp); break;
    default: cb_embed_row<CB_DT_INT8>(xo, table, scales, id, Dp); break;
    }
}

/* ---- RMSNorm ------------------------------------------------------------------------------- */

/* y[r, i] = w[i] * (x[r, i] / sqrt(sum_{j<true_len} x[r, j]^2 / true_len + eps)), i < len.
 * grid (rows), blockDim a multiple of 32. In place (y == x) is allowed: each thread reads and
 * writes only its own elements, after the block-wide sum. Used for the attention/FFN/output
 * norms (len = Dp, true_len = D), per-head q/k norm (rows = n*heads, len = true_len = Dh) and
 * full-width q/k norm (len = true_len = heads*Dh).
 * pos_d (the decode graph's parameter block, cb_param_pos; NULL otherwise): x and y start
 * *pos_d * pos_rows rows further, so the k-norm of a captured decode step runs on the cache rows
 * of the step's position, which changes per token while the kernel arguments cannot. */
extern "C" __global__ void cb_rmsnorm(float *y, int y_stride, const float *x, int x_stride,
                                      const float *w, int len, int true_len, float eps,
                                      const int *pos_d, int pos_rows) {
    __shared__ float scratch[CB_WARP];
    const cb_u64 r = (cb_u64)blockIdx.x + (pos_d ? (cb_u64)*pos_d * (cb_u64)pos_rows : 0u);
    const float *xr = x + r * (cb_u64)x_stride;
    float *yr = y + r * (cb_u64)y_stride;
    float ss = 0.0f;
    for (int i = threadIdx.x; i < true_len; i += blockDim.x) ss += xr[i] * xr[i];
    ss = cb_block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)true_len + eps);
    for (int i = threadIdx.x; i < len; i += blockDim.x) yr[i] = w[i] * (xr[i] * inv);
}

/* ---- linear layers ------------------------------------------------------------------------- */

template <int DT>
__device__ void cb_linear_impl(float *y, int y_stride, const float *x, int x_stride, int n,
                               const void *w, const float *scales, int rows, int cols,
                               const float *bias, int accumulate, int y_row0) {
    const int lane = threadIdx.x & (CB_WARP - 1);
    const int r = blockIdx.x * CB_ROW_WARPS + threadIdx.x / CB_WARP;
    const int t0 = blockIdx.y * CB_TOKEN_TILE;
    if (r >= rows || t0 >= n) return; /* whole warp leaves together: no shuffle is left half */
    const int nt = n - t0 < CB_TOKEN_TILE ? n - t0 : CB_TOKEN_TILE;
    const float *xs[CB_TOKEN_TILE];
    for (int i = 0; i < CB_TOKEN_TILE; i++)
        xs[i] = x + (cb_u64)(t0 + (i < nt ? i : 0)) * (cb_u64)x_stride;
    float acc[1][CB_TOKEN_TILE] = {{0.0f, 0.0f, 0.0f, 0.0f}};
    if (DT == CB_DT_Q4) {
        cb_rows_dot_q4<1>(&w, &scales, r, cols, xs, nt, acc);
    } else {
        const int vec = cb_can_vec(w, DT, cols, x, x_stride);
        const void *row = cb_row_ptr<DT>(w, r, cols);
        cb_rows_dot<DT, 1>(&row, cols, xs, nt, vec, acc);
    }
    const float s = DT == CB_DT_INT8 ? scales[r] : 1.0f;
    /* only the tile's nt tokens are reduced: nt is the same for the whole warp, so every lane
     * takes the same shuffles, and a decode step does one butterfly per row instead of four */
#pragma unroll
    for (int i = 0; i < CB_TOKEN_TILE; i++) {
        if (i < nt) {
            float v = cb_warp_sum(acc[0][i]);
            if (lane == 0) {
                if (DT == CB_DT_INT8) v *= s;
                if (bias) v += bias[r];
                float *yp = y + (cb_u64)(y_row0 + t0 + i) * (cb_u64)y_stride + r;
                *yp = accumulate ? *yp + v : v;
            }
        }
    }
}

/* y[t, r] (+)= W[r, :] . x[t, :] (+ bias[r]) for t < n, r < rows.
 * grid (ceil(rows / 4), ceil(n / 4)), block 128: one warp per output row, 4 tokens per warp.
 * pos_d (the decode graph's parameter block; NULL otherwise): y's rows start *pos_d rows
 * further, i.e. the K/V projection of a captured decode step writes the cache row of the step's
 * position (read on the device: a graph's kernel arguments are fixed at capture). */
extern "C" __global__ void cb_linear(float *y, int y_stride, const float *x, int x_stride, int n,
                                     const void *w, const float *scales, int dtype, int rows,
                                     int cols, const float *bias, int accumulate,
                                     const int *pos_d) {
    const int y_row0 = pos_d ? *pos_d : 0;
    switch (dtype) {
    case CB_DT_F32:
        cb_linear_impl<CB_DT_F32>(y, y_stride, x, x_stride, n, w, scales, rows, cols, bias,
                                  accumulate, y_row0);
        break;
    case CB_DT_F16:
        cb_linear_impl<CB_DT_F16>(y, y_stride, x, x_stride, n, w, scales, rows, cols, bias,
                                  accumulate, y_row0);
        break;
    case CB_DT_BF16:
        cb_linear_impl<CB_DT_BF16>(y, y_stride, x, x_stride, n, w, scales, rows, cols, bias,
                                   accumulate, y_row0);
        break;
    case CB_DT_Q4:
        cb_linear_impl<CB_DT_Q4>(y, y_stride, x, x_stride, n, w, scales, rows, cols, bias,
                                 accumulate, y_row0);
        break;
    default:
        cb_linear_impl<CB_DT_INT8>(y, y_stride, x, x_stride, n, w, scales, rows, cols, bias,
                                   accumulate, y_row0);
        break;
    }
}

/* ---- q/k norm + RoPE + KV-cache write ------------------------------------------------------- */

/* f32 -> f16 bits, rounded to nearest even, by the hardware (cvt.rn.f16.f32): the f16 KV cache's
 * store. The CPU's f16 cache (runtime/src/half.h half_from_float, F16C/FCVT) rounds the same way,
 * so both caches hold the same bits for the same f32 value (NaN: some quiet NaN). Inline PTX, GPU
 * pass only, like cb_half_to_float; the host emulation supplies cb_emu_float_to_half. */
#ifdef __CUDA_ARCH__
__device__ __forceinline__ cb_u16 cb_float_to_half(float f) {
    cb_u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
#define cb_float_to_half cb_emu_float_to_half
#endif

/* One element of a KV cache: f32, or f16 bits (kv_f16) read with the hardware conversion. */
__device__ __forceinline__ float cb_kv_load(const void *c, cb_u64 i, int kv_f16) {
    return kv_f16 ? cb_half_to_float(((const cb_u16 *)c)[i]) : ((const float *)c)[i];
}

__device__ __forceinline__ void cb_kv_store(void *c, cb_u64 i, float v, int kv_f16) {
    if (kv_f16) ((cb_u16 *)c)[i] = cb_float_to_half(v);
    else ((float *)c)[i] = v;
}

/* The attention block's small steps in one launch, per (token, head): the optional q/k RMSNorm,
 * rotate-half RoPE, and the KV-cache write (f32, or f16 rounded to nearest even).
 * qkv: the Q, K and V projections' output (with bias), rows of HD + 2*kvd floats
 * [q heads | k heads | v heads], HD = H*Dh, kvd = Hkv*Dh; nothing is done in place, so a
 * full-width norm can read its whole row while other blocks write theirs.
 * Block (t, y), y < H: query head y -> q[t, y*Dh ..] (f32). y >= H: kv head j = y - H -> the cache
 * row of position p = pos0 (+ *pos_d) + t: K rotated, V copied, both converted when kv_f16.
 * norm (the header's flags): 0 none; 1 per head (RMSNorm over the head's Dh values, weights
 * qn/kn [Dh]); 2 full width (over the row's HD or kvd values, weights [HD] / [kvd]). The sum of
 * squares is cb_rmsnorm's, element for element: threads i, i + blockDim.x, ... in order, then
 * cb_block_sum, so with blockDim = 256 (cb_rmsnorm's launch) the normalised values are the bits
 * the separate norm launch wrote, and the rotation is cb_rope's expression: the f32 results equal
 * the former rmsnorm + rope + in-cache sequence bit for bit.
 * cs: the host's RoPE table [max_seq_len, Dh/2, (cos, sin)] (colibri_cuda_rope_table).
 * pos_d (the decode graph's parameter block; NULL otherwise) adds *pos_d to pos0: RoPE angles and
 * the cache row follow the step's position read on the device.
 * grid (n, H + Hkv), block 256 (a multiple of 32). */
extern "C" __global__ void cb_qk_rope_kv(float *q, const float *qkv, void *kc, void *vc, int n,
                                         int H, int Hkv, int Dh, int pos0, const float *cs,
                                         const float *qn, const float *kn, int norm, float eps,
                                         int kv_f16, const int *pos_d) {
    __shared__ float scratch[CB_WARP];
    const int t = blockIdx.x, y = blockIdx.y;
    const int HD = H * Dh, kvd = Hkv * Dh, half = Dh / 2;
    const int is_q = y < H, head = is_q ? y : y - H;
    const int p = pos0 + (pos_d ? *pos_d : 0) + t;
    const float *row = qkv + (cb_u64)t * (cb_u64)(HD + 2 * kvd) + (is_q ? 0 : HD);
    const float *src = row + (cb_u64)head * (cb_u64)Dh;
    const float *w = is_q ? qn : kn;
    float inv = 1.0f;
    if (norm) {
        const float *xr = norm == 1 ? src : row;
        const int true_len = norm == 1 ? Dh : (is_q ? HD : kvd);
        float ss = 0.0f;
        for (int i = threadIdx.x; i < true_len; i += blockDim.x) ss += xr[i] * xr[i];
        ss = cb_block_sum(ss, scratch);
        inv = 1.0f / sqrtf(ss / (float)true_len + eps);
    }
    const int w0 = norm == 2 ? head * Dh : 0; /* the head's weights in a full-width norm */
    const float *cp = cs + (cb_u64)p * (cb_u64)half * 2u;
    const cb_u64 at = (cb_u64)p * (cb_u64)kvd + (cb_u64)head * (cb_u64)Dh;
    float *qo = q + (cb_u64)t * (cb_u64)HD + (cb_u64)head * (cb_u64)Dh;
    for (int i = threadIdx.x; i < half; i += blockDim.x) {
        float a = src[i], b = src[i + half];
        if (norm) {
            a = w[w0 + i] * (a * inv);
            b = w[w0 + i + half] * (b * inv);
        }
        const float c = cp[2 * i], s = cp[2 * i + 1];
        const float ra = a * c - b * s, rb = b * c + a * s;
        if (is_q) {
            qo[i] = ra;
            qo[i + half] = rb;
        } else {
            cb_kv_store(kc, at + (cb_u64)i, ra, kv_f16);
            cb_kv_store(kc, at + (cb_u64)(i + half), rb, kv_f16);
        }
    }
    if (!is_q) {
        const float *vs = row + kvd + (cb_u64)head * (cb_u64)Dh;
        for (int i = threadIdx.x; i < Dh; i += blockDim.x)
            cb_kv_store(vc, at + (cb_u64)i, vs[i], kv_f16);
    }
}

/* ---- attention over the KV cache ---------------------------------------------------------- */

#define CB_KV_SPLIT COLIBRI_CU_KV_SPLIT

/* Causal grouped-query attention, split over the KV range (flash-decoding style, no atomics).
 * Token t is at position last = pos0 + t and attends to positions 0..last with kv head
 * h / (H / Hkv) (cache rows of kv_stride = Hkv*Dh values, f32 or f16 bits when kv_f16). Its
 * positions are split into ranges of CB_KV_SPLIT, range s = [s*CB_KV_SPLIT, min((s+1)*CB_KV_SPLIT,
 * last+1)); block (h, s) of token t computes over its range, in position order:
 *   m_s = max_j q.k_j / sqrt(Dh),  l_s = sum_j e_j,  acc_s = sum_j e_j v_j,  e_j = exp(score - m_s)
 * A token with one range (last < CB_KV_SPLIT) writes out = acc / l at once; otherwise the block
 * writes (m_s, l_s, acc_s[Dh]) to part[((t*H + h)*nsplit + s)*(Dh+2) ..] and cb_attention_merge
 * combines the ranges in order. The scores stay in shared memory.
 * grid (H * nsplit, n) with nsplit >= the chunk's largest range count (blocks past a token's last
 * range return), block 128 (4 warps). Decode (n == 1) uses it; so does prefill with heads wider
 * than cb_attention_prefill's COLIBRI_CU_FA_MAX_DH.
 * pos_d (the decode graph's parameter block; NULL otherwise) adds *pos_d to pos0: the graph is
 * launched with nsplit = every range of the cache, and the blocks past the step's ranges return. */
extern "C" __global__ void cb_attention(float *out, float *part, const float *q, const void *kc,
                                        const void *vc, int nsplit, int pos0, int H, int Hkv,
                                        int Dh, int kv_f16, const int *pos_d) {
    __shared__ float sc[CB_KV_SPLIT];
    __shared__ float scratch[CB_WARP];
    const int h = blockIdx.x / nsplit, split = blockIdx.x % nsplit, t = blockIdx.y;
    const int lane = threadIdx.x & (CB_WARP - 1), warp = threadIdx.x / CB_WARP;
    const int nwarps = blockDim.x / CB_WARP;
    const int last = pos0 + (pos_d ? *pos_d : 0) + t;
    const int j0 = split * CB_KV_SPLIT;
    if (j0 > last) return; /* the whole block leaves: no barrier is left half */
    const int len = last + 1 - j0 < CB_KV_SPLIT ? last + 1 - j0 : CB_KV_SPLIT;
    const int kvh = h / (H / Hkv);
    const cb_u64 kv_stride = (cb_u64)Hkv * (cb_u64)Dh;
    const float *qh = q + ((cb_u64)t * (cb_u64)H + (cb_u64)h) * (cb_u64)Dh;
    const cb_u64 base = (cb_u64)j0 * kv_stride + (cb_u64)kvh * (cb_u64)Dh;
    const float scale = 1.0f / sqrtf((float)Dh);

    for (int j = warp; j < len; j += nwarps) {
        const cb_u64 kj = base + (cb_u64)j * kv_stride;
        float d = 0.0f;
        for (int c = lane; c < Dh; c += CB_WARP)
            d += qh[c] * cb_kv_load(kc, kj + (cb_u64)c, kv_f16);
        d = cb_warp_sum(d);
        if (lane == 0) sc[j] = d * scale;
    }
    __syncthreads();

    float m = -__int_as_float(0x7f800000);
    for (int j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, sc[j]);
    m = cb_block_max(m, scratch);
    float sum = 0.0f;
    for (int j = threadIdx.x; j < len; j += blockDim.x) {
        const float e = expf(sc[j] - m);
        sc[j] = e; /* this thread owns j: no other thread touches sc[j] until the barrier */
        sum += e;
    }
    sum = cb_block_sum(sum, scratch); /* its barriers come after every sc[j] write */
    __syncthreads();

    const int ranges = last / CB_KV_SPLIT + 1;
    const cb_u64 th = (cb_u64)t * (cb_u64)H + (cb_u64)h;
    float *oh = out + th * (cb_u64)Dh;
    float *ph = part + (th * (cb_u64)nsplit + (cb_u64)split) * (cb_u64)(Dh + 2);
    for (int c = threadIdx.x; c < Dh; c += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < len; j++)
            acc += sc[j] * cb_kv_load(vc, base + (cb_u64)j * kv_stride + (cb_u64)c, kv_f16);
        if (ranges == 1) oh[c] = acc / sum;
        else ph[2 + c] = acc;
    }
    if (ranges > 1 && threadIdx.x == 0) {
        ph[0] = m;
        ph[1] = sum;
    }
}

/* ---- tiled (flash-style) prefill attention ------------------------------------------------- */

#define CB_FA_ROWS COLIBRI_CU_FA_ROWS
#define CB_FA_KEYS COLIBRI_CU_FA_KEYS
#define CB_FA_DH COLIBRI_CU_FA_MAX_DH
#define CB_FA_RPW (CB_FA_ROWS / 4)      /* query rows per warp (4 warps) */
#define CB_FA_CPL (CB_FA_DH / CB_WARP)  /* output columns per lane */
#define CB_FA_KSTRIDE (CB_FA_DH + 1)   /* K tile row stride: lane j reads row j, no bank conflict */
#if CB_FA_KEYS != CB_WARP || CB_FA_ROWS % 4 != 0 || CB_FA_DH % CB_WARP != 0
#error "cb_attention_prefill: one KV position per lane, 4 warps of rows, Dh tiles of whole warps"
#endif

/* Causal GQA attention for a chunk of n > 1 tokens (prefill), scores never in global memory.
 * Block (b, h): query rows (tokens) t0 = b*16 .. min(t0 + 16, n) - 1 of head h, kv head
 * h / (H / Hkv). The KV positions 0 .. (the block's last position) go through shared memory in
 * tiles of 32 (f16 caches widened on load), always from position 0 in tile order. Warp w owns
 * rows 4w .. 4w+3; per row and tile, lane j scores position j0 + j (q.k in column order, times
 * 1/sqrt(Dh)), and the row's online softmax runs:
 *   m' = max(m, max_j s_j),  p_j = exp(s_j - m'),  c = exp(m - m'),
 *   l = l*c + sum_j p_j (butterfly),  acc[col] = acc[col]*c + sum_j p_j v_j[col] (j in order).
 * A row uses only its own positions (j0 + j <= its position): tiles past it are skipped and a
 * partial tile stops at it. So a row's bits depend only on its position and the inputs, not on
 * the other rows of its block or on how the prompt was chunked; they differ from the split-KV
 * kernel's (another summation order): docs/cuda.md "GPU determinism contract".
 * No atomics; every sum has a fixed order. Dh <= CB_FA_DH. grid (ceil(n / 16), H), block 128. */
template <int F16>
__device__ void cb_attention_prefill_impl(float *out, const float *q, const void *kc,
                                          const void *vc, int n, int pos0, int H, int Hkv, int Dh,
                                          float *qs, float *ks, float *vs, float *ps) {
    const int t0 = blockIdx.x * CB_FA_ROWS, h = blockIdx.y;
    const int rows = n - t0 < CB_FA_ROWS ? n - t0 : CB_FA_ROWS;
    const int lane = threadIdx.x & (CB_WARP - 1), warp = threadIdx.x / CB_WARP;
    const int kvh = h / (H / Hkv);
    const cb_u64 kv_stride = (cb_u64)Hkv * (cb_u64)Dh;
    const float scale = 1.0f / sqrtf((float)Dh);
    for (int i = threadIdx.x; i < CB_FA_ROWS * Dh; i += blockDim.x) {
        const int r = i / Dh, c = i % Dh;
        const cb_u64 at = ((cb_u64)(t0 + r) * (cb_u64)H + (cb_u64)h) * (cb_u64)Dh + (cb_u64)c;
        qs[r * CB_FA_DH + c] = r < rows ? q[at] : 0.0f;
    }
    float m[CB_FA_RPW], l[CB_FA_RPW], acc[CB_FA_RPW][CB_FA_CPL];
#pragma unroll
    for (int rr = 0; rr < CB_FA_RPW; rr++) {
        m[rr] = -__int_as_float(0x7f800000);
        l[rr] = 0.0f;
#pragma unroll
        for (int cc = 0; cc < CB_FA_CPL; cc++) acc[rr][cc] = 0.0f;
    }
    const int last = pos0 + t0 + rows - 1; /* the block's last position */
    for (int j0 = 0; j0 <= last; j0 += CB_FA_KEYS) {
        const int len = last + 1 - j0 < CB_FA_KEYS ? last + 1 - j0 : CB_FA_KEYS;
        __syncthreads(); /* the previous tile is no longer read (first tile: q is loaded) */
        for (int i = threadIdx.x; i < len * Dh; i += blockDim.x) {
            const int j = i / Dh, c = i % Dh;
            const cb_u64 at = (cb_u64)(j0 + j) * kv_stride + (cb_u64)kvh * (cb_u64)Dh + (cb_u64)c;
            ks[j * CB_FA_KSTRIDE + c] = cb_kv_load(kc, at, F16);
            vs[j * CB_FA_DH + c] = cb_kv_load(vc, at, F16);
        }
        __syncthreads();
#pragma unroll
        for (int rr = 0; rr < CB_FA_RPW; rr++) {
            const int r = warp * CB_FA_RPW + rr;
            const int pos = pos0 + t0 + r;
            if (r >= rows || j0 > pos) continue; /* warp-uniform: every lane skips together */
            const int rl = pos + 1 - j0 < CB_FA_KEYS ? pos + 1 - j0 : CB_FA_KEYS;
            float s = -__int_as_float(0x7f800000);
            if (lane < rl) {
                const float *qr = qs + r * CB_FA_DH, *kr = ks + lane * CB_FA_KSTRIDE;
                float d = 0.0f;
                for (int c = 0; c < Dh; c++) d += qr[c] * kr[c];
                s = d * scale;
            }
            const float mn = fmaxf(m[rr], cb_warp_max(s));
            const float p = lane < rl ? expf(s - mn) : 0.0f;
            const float corr = expf(m[rr] - mn); /* first tile: exp(-inf) = 0 */
            l[rr] = l[rr] * corr + cb_warp_sum(p);
            m[rr] = mn;
            float *pr = ps + r * CB_FA_KEYS;
            pr[lane] = p;
            __syncwarp();
#pragma unroll
            for (int cc = 0; cc < CB_FA_CPL; cc++) {
                const int c = lane + cc * CB_WARP;
                if (c < Dh) {
                    float a = acc[rr][cc] * corr;
                    for (int j = 0; j < rl; j++) a += pr[j] * vs[j * CB_FA_DH + c];
                    acc[rr][cc] = a;
                }
            }
        }
    }
#pragma unroll
    for (int rr = 0; rr < CB_FA_RPW; rr++) {
        const int r = warp * CB_FA_RPW + rr;
        if (r >= rows) continue;
        float *o = out + ((cb_u64)(t0 + r) * (cb_u64)H + (cb_u64)h) * (cb_u64)Dh;
#pragma unroll
        for (int cc = 0; cc < CB_FA_CPL; cc++) {
            const int c = lane + cc * CB_WARP;
            if (c < Dh) o[c] = acc[rr][cc] / l[rr];
        }
    }
}

extern "C" __global__ void cb_attention_prefill(float *out, const float *q, const void *kc,
                                                const void *vc, int n, int pos0, int H, int Hkv,
                                                int Dh, int kv_f16) {
    /* the tiles live here, not in the template: one allocation whichever cache type runs */
    __shared__ float qs[CB_FA_ROWS * CB_FA_DH];
    __shared__ float ks[CB_FA_KEYS * CB_FA_KSTRIDE];
    __shared__ float vs[CB_FA_KEYS * CB_FA_DH];
    __shared__ float ps[CB_FA_ROWS * CB_FA_KEYS];
    if (kv_f16)
        cb_attention_prefill_impl<1>(out, q, kc, vc, n, pos0, H, Hkv, Dh, qs, ks, vs, ps);
    else
        cb_attention_prefill_impl<0>(out, q, kc, vc, n, pos0, H, Hkv, Dh, qs, ks, vs, ps);
}

/* out[t, h, :] from the partials of token t's ranges s = 0 .. ranges-1, in that order:
 *   M = max_s m_s,  w_s = exp(m_s - M),  out = (sum_s w_s acc_s) / (sum_s w_s l_s).
 * Tokens with one range were written by cb_attention itself. grid (H, n), any block size.
 * pos_d: as in cb_attention (the decode graph always launches the merge; one-range steps return). */
extern "C" __global__ void cb_attention_merge(float *out, const float *part, int nsplit, int pos0,
                                              int H, int Dh, const int *pos_d) {
    const int h = blockIdx.x, t = blockIdx.y;
    const int ranges = (pos0 + (pos_d ? *pos_d : 0) + t) / CB_KV_SPLIT + 1;
    if (ranges == 1) return;
    const cb_u64 th = (cb_u64)t * (cb_u64)H + (cb_u64)h, pstride = (cb_u64)(Dh + 2);
    const float *ph = part + th * (cb_u64)nsplit * pstride;
    float M = ph[0];
    for (int s = 1; s < ranges; s++) M = fmaxf(M, ph[(cb_u64)s * pstride]);
    float den = 0.0f;
    for (int s = 0; s < ranges; s++)
        den += expf(ph[(cb_u64)s * pstride] - M) * ph[(cb_u64)s * pstride + 1];
    float *oh = out + th * (cb_u64)Dh;
    for (int c = threadIdx.x; c < Dh; c += blockDim.x) {
        float num = 0.0f;
        for (int s = 0; s < ranges; s++)
            num += expf(ph[(cb_u64)s * pstride] - M) * ph[(cb_u64)s * pstride + 2 + (cb_u64)c];
        oh[c] = num / den;
    }
}

/* ---- routing ------------------------------------------------------------------------------- */

/* Does expert a (logit ka) come before expert b in the routing order? Higher logit first, NaN
 * after every number, ties to the lower index: a strict total order even with NaN (`>` alone is
 * not one), so the sort below has exactly one result and padding never reaches the first k. */
__device__ __forceinline__ int cb_before(float ka, int ia, float kb, int ib) {
    const int na = ka != ka, nb = kb != kb;
    if (na != nb) return nb;
    if (!na && ka != kb) return ka > kb;
    return ia < ib;
}

/* Route one token with one warp (lane = threadIdx.x & 31; every lane of the warp calls it),
 * mirroring the CPU path (runtime/src/route.c) step by step so that both make the same choices
 * on the same logits lr[0..E):
 *   m = max logit, total = sum_e exp((double)(l_e - m)) in index order (double, one lane);
 *   SOFTMAX_TOPK: p_e = (float)(exp(l_e - m) / total); top-k on p;
 *   LINEAR_SCORE: top-k on the logits; weights from the selected logits.
 * Ties go to the lower expert index. renorm != 0 (header `routing` 0) makes the k weights sum
 * to 1. Outputs in rank order: io[j], wo[j], j < k.
 * The sort is a bitonic network over the next power of two >= E in shared memory (key, id:
 * CB_MAX_SORT entries; total_s, max_s: one each); padding entries (NaN, index >= 2^30) sort
 * last. Shared by cb_router_topk and cb_ffn_route, so both give the same bits. */
__device__ __forceinline__ void cb_topk_warp(const float *lr, int E, int k, int renorm, int *io,
                                             float *wo, float *key, int *id, double *total_s,
                                             float *max_s) {
    const int lane = threadIdx.x & (CB_WARP - 1);
    if (lane == 0) {
        float mx = lr[0];
        for (int e = 1; e < E; e++) mx = fmaxf(mx, lr[e]);
        double total = 0.0;
        for (int e = 0; e < E; e++) total += exp((double)lr[e] - mx);
        *max_s = mx;
        *total_s = total;
    }
    __syncwarp();
    const float mx = *max_s;
    const double total = *total_s;
    int npow = 2;
    while (npow < E) npow <<= 1;
    for (int i = lane; i < npow; i += CB_WARP) {
        float v = __int_as_float(0x7fc00000); /* NaN: padding sorts after every expert */
        if (i < E) {
#if COLIBRI_ROUTING_MODE == COLIBRI_ROUTING_SOFTMAX_TOPK
            v = (float)(exp((double)lr[i] - mx) / total);
#else
            v = lr[i];
#endif
        }
        key[i] = v;
        id[i] = i < E ? i : (1 << 30) + i;
    }
    __syncwarp();
    for (int size = 2; size <= npow; size <<= 1) {
        for (int stride = size >> 1; stride > 0; stride >>= 1) {
            for (int i = lane; i < npow; i += CB_WARP) {
                const int j = i ^ stride;
                if (j > i) {
                    /* blocks with (i & size) == 0 end in routing order, the others reversed */
                    const int fwd = (i & size) == 0;
                    const int swap = fwd ? cb_before(key[j], id[j], key[i], id[i])
                                         : cb_before(key[i], id[i], key[j], id[j]);
                    if (swap) {
                        const float tk = key[i]; key[i] = key[j]; key[j] = tk;
                        const int ti = id[i]; id[i] = id[j]; id[j] = ti;
                    }
                }
            }
            __syncwarp();
        }
    }
    if (lane == 0) {
        for (int j = 0; j < k; j++) io[j] = id[j];
#if COLIBRI_ROUTING_MODE == COLIBRI_ROUTING_SOFTMAX_TOPK
        if (renorm) {
            double s = 0.0;
            for (int j = 0; j < k; j++) s += key[j];
            for (int j = 0; j < k; j++) wo[j] = (float)(key[j] / s);
        } else {
            for (int j = 0; j < k; j++) wo[j] = key[j];
        }
#else
        if (renorm) {
            /* softmax over the k selected logits == renormalised top-k probabilities */
            double s = 0.0;
            for (int j = 0; j < k; j++) s += exp((double)key[j] - key[0]);
            for (int j = 0; j < k; j++) wo[j] = (float)(exp((double)key[j] - key[0]) / s);
        } else {
            for (int j = 0; j < k; j++) wo[j] = (float)(exp((double)key[j] - mx) / total);
        }
#endif
    }
}

/* Route one token per block (grid (n), block 32 = one warp) from router logits in global memory
 * (logits[t*E + e]): cb_topk_warp. Outputs idx[t*k + j], wts[t*k + j]. Used when the FFN norm,
 * router and top-k are not fused (cb_ffn_route below). */
extern "C" __global__ void cb_router_topk(const float *logits, int E, int k, int renorm,
                                          int *idx, float *wts) {
    __shared__ float key[CB_MAX_SORT];
    __shared__ int id[CB_MAX_SORT];
    __shared__ double total_s;
    __shared__ float max_s;
    const int t = blockIdx.x;
    cb_topk_warp(logits + (cb_u64)t * (cb_u64)E, E, k, renorm, idx + (cb_u64)t * (cb_u64)k,
                 wts + (cb_u64)t * (cb_u64)k, key, id, &total_s, &max_s);
}

/* ---- fused FFN norm + router + top-k (issue 15) ------------------------------------------- */

#define CB_WIDE COLIBRI_CU_WIDE_THREADS
#define CB_ROUTE_THREADS COLIBRI_CU_ROUTE_THREADS
#define CB_ROUTE_MAX_DP COLIBRI_CU_ROUTE_MAX_DP

/* lg[r] = W[r, :] . hs for r < E, warp w taking rows w, w + nwarps, ...: per row exactly
 * cb_linear_impl's work for one token (the same lane shares in the same order, the same
 * butterfly, the int8 row scale after it), with the activation row read from shared memory. */
template <int DT>
__device__ __forceinline__ void cb_route_rows(float *lg, const float *hs, const void *w,
                                              const float *scales, int E, int cols, int vec) {
    const int lane = threadIdx.x & (CB_WARP - 1);
    const float *xs[CB_TOKEN_TILE] = {hs, hs, hs, hs};
    for (int r = threadIdx.x / CB_WARP; r < E; r += blockDim.x / CB_WARP) {
        float acc[1][CB_TOKEN_TILE] = {{0.0f, 0.0f, 0.0f, 0.0f}};
        if (DT == CB_DT_Q4) {
            cb_rows_dot_q4<1>(&w, &scales, r, cols, xs, 1, acc);
        } else {
            const void *row = cb_row_ptr<DT>(w, r, cols);
            cb_rows_dot<DT, 1>(&row, cols, xs, 1, vec, acc);
        }
        float v = cb_warp_sum(acc[0][0]);
        if (lane == 0) lg[r] = DT == CB_DT_INT8 ? v * scales[r] : v;
    }
}

/* One token's FFN input and routing in one block, replacing cb_rmsnorm (FFN norm), cb_linear
 * (router, E rows) and cb_router_topk with the same bits:
 *   h[t, :] = norm_w * x[t, :] / sqrt(sum_{j<D} x[t, j]^2 / D + eps)   (the experts' input, to
 *             global memory, and to shared memory for the router);
 *   logits  = W_router h[t, :] (kept in shared memory, never written out);
 *   idx[t*k ..], wts[t*k ..] = cb_topk_warp(logits) on warp 0.
 * Same bits as the 3 kernels because each stage is their code with their reduction shape: the
 * sum of squares runs over CB_WIDE threads with cb_rmsnorm's stride (the other threads add
 * nothing, so the block sum's warp partials past CB_WIDE / 32 are +0 exactly where cb_rmsnorm's
 * are the 0 padding of its butterfly); each router row is one warp as in cb_linear, the vector
 * path chosen by cb_linear's own test on the global h; the top-k is the shared function.
 * grid (n), block CB_ROUTE_THREADS (any multiple of 32 from CB_WIDE to 1024). Needs Dp <=
 * CB_ROUTE_MAX_DP (the normed row in static shared memory: a block may declare 48 KiB) and
 * E <= CB_MAX_SORT; the host keeps the 3 launches otherwise (cuda_backend.c cb_route_fused).
 * Router weight dtypes as cb_linear: f32 (the file's), f16, bf16, int8 (row scales), q4. */
extern "C" __global__ void __launch_bounds__(CB_ROUTE_THREADS)
    cb_ffn_route(float *h, const float *x, int Dp, const float *norm_w, int D, float eps,
                 const void *w, const float *scales, int dtype, int E, int k, int renorm,
                 int *idx, float *wts) {
    __shared__ float4 hs4[CB_ROUTE_MAX_DP / 4]; /* float4: 16-byte aligned for the vector path */
    __shared__ float lg[CB_MAX_SORT];
    __shared__ float key[CB_MAX_SORT];
    __shared__ int id[CB_MAX_SORT];
    __shared__ float scratch[CB_WARP];
    __shared__ double total_s;
    __shared__ float max_s;
    float *hs = (float *)hs4;
    const int t = blockIdx.x;
    const float *xr = x + (cb_u64)t * (cb_u64)Dp;
    float *hr = h + (cb_u64)t * (cb_u64)Dp;
    float ss = 0.0f;
    if (threadIdx.x < CB_WIDE)
        for (int i = threadIdx.x; i < D; i += CB_WIDE) ss += xr[i] * xr[i];
    ss = cb_block_sum(ss, scratch);
    const float inv = 1.0f / sqrtf(ss / (float)D + eps);
    for (int i = threadIdx.x; i < Dp; i += blockDim.x) {
        const float v = norm_w[i] * (xr[i] * inv);
        hr[i] = v;
        hs[i] = v;
    }
    __syncthreads();
    const int vec = cb_can_vec(w, dtype, Dp, h, Dp);
    switch (dtype) {
    case CB_DT_F32: cb_route_rows<CB_DT_F32>(lg, hs, w, scales, E, Dp, vec); break;
    case CB_DT_F16: cb_route_rows<CB_DT_F16>(lg, hs, w, scales, E, Dp, vec); break;
    case CB_DT_BF16: cb_route_rows<CB_DT_BF16>(lg, hs, w, scales, E, Dp, vec); break;
    case CB_DT_Q4: cb_route_rows<CB_DT_Q4>(lg, hs, w, scales, E, Dp, vec); break;
    default: cb_route_rows<CB_DT_INT8>(lg, hs, w, scales, E, Dp, vec); break;
    }
    __syncthreads();
    if (threadIdx.x < CB_WARP)
        cb_topk_warp(lg, E, k, renorm, idx + (cb_u64)t * (cb_u64)k, wts + (cb_u64)t * (cb_u64)k,
                     key, id, &total_s, &max_s);
}

/* ---- dispatch ------------------------------------------------------------------------------- */

/* Group the n*k (token, rank) assignments by expert, deterministically and without atomics:
 * offsets[e] .. offsets[e+1] are expert e's slots (offsets has E+1 entries), filled in
 * assignment order (token, then rank); perm[slot] = token; slot_of[t*k + j] = slot;
 * active[g] = the g-th expert with at least one slot, in index order, and -1 for g past the
 * last one (active has E entries). The expert kernels are launched over min(E, n*k) groups and
 * block g serves active[g]: a decode step (n = 1, k distinct experts) launches exactly k groups,
 * so no block exists for an unselected expert.
 * grid (1), block 256: thread e counts and places expert e's assignments by itself. */
extern "C" __global__ void cb_dispatch(const int *idx, int n, int k, int E, int *offsets,
                                       int *perm, int *slot_of, int *active) {
    __shared__ int base[CB_MAX_SORT + 1];
    const int total = n * k;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int c = 0;
        for (int a = 0; a < total; a++) c += idx[a] == e;
        base[e + 1] = c;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        base[0] = 0;
        int g = 0;
        for (int e = 0; e < E; e++) {
            if (base[e + 1] > 0) active[g++] = e; /* base[e + 1] is still expert e's count */
            base[e + 1] += base[e];
        }
        for (; g < E; g++) active[g] = -1;
    }
    __syncthreads();
    for (int e = threadIdx.x; e <= E; e += blockDim.x) offsets[e] = base[e];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        int slot = base[e];
        for (int a = 0; a < total; a++) {
            if (idx[a] == e) {
                perm[slot] = a / k;
                slot_of[a] = slot;
                slot++;
            }
        }
    }
}

/* ---- grouped expert SwiGLU ------------------------------------------------------------------ */

__device__ __forceinline__ float cb_silu(float g) { return g / (1.0f + expf(-g)); }

template <int DT>
__device__ void cb_expert_up_impl(float *act, int F, const float *h, int Dp, const int *perm,
                                  int begin, int end, const void *w1, const void *w3,
                                  const float *s1, const float *s3) {
    const int lane = threadIdx.x & (CB_WARP - 1);
    const int r = blockIdx.x * CB_ROW_WARPS + threadIdx.x / CB_WARP;
    if (r >= F) return;
    const int vec = cb_can_vec(w1, DT, Dp, h, Dp) && cb_can_vec(w3, DT, Dp, h, Dp);
    const void *rows[2] = {cb_row_ptr<DT>(w1, r, Dp), cb_row_ptr<DT>(w3, r, Dp)};
    const void *q4w[2] = {w1, w3};
    const float *q4s[2] = {s1, s3};
    const float sc1 = DT == CB_DT_INT8 ? s1[r] : 1.0f, sc3 = DT == CB_DT_INT8 ? s3[r] : 1.0f;
    for (int s0 = begin; s0 < end; s0 += CB_TOKEN_TILE) {
        const int nt = end - s0 < CB_TOKEN_TILE ? end - s0 : CB_TOKEN_TILE;
        const float *xs[CB_TOKEN_TILE];
        for (int i = 0; i < CB_TOKEN_TILE; i++)
            xs[i] = h + (cb_u64)perm[s0 + (i < nt ? i : 0)] * (cb_u64)Dp;
        /* W1 (gate, acc[0]) and W3 (up, acc[1]) rows in one pass over h: each sum in the same
         * order as a pass of its own */
        float acc[2][CB_TOKEN_TILE] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}};
        if (DT == CB_DT_Q4)
            cb_rows_dot_q4<2>(q4w, q4s, r, Dp, xs, nt, acc);
        else
            cb_rows_dot<DT, 2>(rows, Dp, xs, nt, vec, acc);
#pragma unroll
        for (int i = 0; i < CB_TOKEN_TILE; i++) {
            if (i < nt) { /* warp-uniform, as in cb_linear_impl */
                const float gv = cb_warp_sum(acc[0][i]) * sc1;
                const float uv = cb_warp_sum(acc[1][i]) * sc3;
                if (lane == 0) act[(cb_u64)(s0 + i) * (cb_u64)F + r] = cb_silu(gv) * uv;
            }
        }
    }
}

/* The expert a block of the grouped kernels serves: active[blockIdx.y] (cb_dispatch's list of
 * experts with slots; -1: none, the block returns), or blockIdx.y itself when active is NULL
 * (the shared expert: one group). */
__device__ __forceinline__ int cb_group_expert(const int *active) {
    return active ? active[blockIdx.y] : (int)blockIdx.y;
}

/* act[slot, r] = silu(W1_e[r] . h[perm[slot]]) * (W3_e[r] . h[perm[slot]]) for every slot of
 * expert e = cb_group_expert(active) (offsets[e] .. offsets[e+1]). w1/w3/s1/s3 are device arrays
 * of per-expert pointers (s* unused unless int8/q4). grid (ceil(F / 4), min(E, n*k)), block 128:
 * only experts with tokens get blocks, so decode (one token, k experts) launches k groups and
 * reads only the chosen experts' weights. The shared expert is the same kernel with one group,
 * active NULL and perm = 0..n-1. */
extern "C" __global__ void cb_expert_up(float *act, int F, const float *h, int Dp, const int *perm,
                                        const int *offsets, const int *active,
                                        const void *const *w1, const void *const *w3,
                                        const float *const *s1, const float *const *s3,
                                        int dtype) {
    const int e = cb_group_expert(active);
    if (e < 0) return;
    const int begin = offsets[e], end = offsets[e + 1];
    if (begin == end) return;
    const int scaled = dtype == CB_DT_INT8 || dtype == CB_DT_Q4;
    const float *sc1 = scaled ? s1[e] : 0, *sc3 = scaled ? s3[e] : 0;
    switch (dtype) {
    case CB_DT_F32:
        cb_expert_up_impl<CB_DT_F32>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3);
        break;
    case CB_DT_F16:
        cb_expert_up_impl<CB_DT_F16>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3);
        break;
    case CB_DT_BF16:
        cb_expert_up_impl<CB_DT_BF16>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3);
        break;
    case CB_DT_Q4:
        cb_expert_up_impl<CB_DT_Q4>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3);
        break;
    default:
        cb_expert_up_impl<CB_DT_INT8>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3);
        break;
    }
}

template <int DT>
__device__ void cb_expert_down_impl(float *eo, int Dp, const float *act, int F, int begin,
                                    int end, const void *w2, const float *s2) {
    const int lane = threadIdx.x & (CB_WARP - 1);
    const int r = blockIdx.x * CB_ROW_WARPS + threadIdx.x / CB_WARP;
    if (r >= Dp) return;
    const int vec = cb_can_vec(w2, DT, F, act, F);
    const void *row = cb_row_ptr<DT>(w2, r, F);
    const float sc = DT == CB_DT_INT8 ? s2[r] : 1.0f;
    for (int s0 = begin; s0 < end; s0 += CB_TOKEN_TILE) {
        const int nt = end - s0 < CB_TOKEN_TILE ? end - s0 : CB_TOKEN_TILE;
        const float *xs[CB_TOKEN_TILE];
        for (int i = 0; i < CB_TOKEN_TILE; i++)
            xs[i] = act + (cb_u64)(s0 + (i < nt ? i : 0)) * (cb_u64)F;
        float acc[1][CB_TOKEN_TILE] = {{0.0f, 0.0f, 0.0f, 0.0f}};
        if (DT == CB_DT_Q4)
            cb_rows_dot_q4<1>(&w2, &s2, r, F, xs, nt, acc);
        else
            cb_rows_dot<DT, 1>(&row, F, xs, nt, vec, acc);
#pragma unroll
        for (int i = 0; i < CB_TOKEN_TILE; i++) {
            if (i < nt) { /* warp-uniform, as in cb_linear_impl */
                const float v = cb_warp_sum(acc[0][i]) * sc;
                if (lane == 0) eo[(cb_u64)(s0 + i) * (cb_u64)Dp + r] = v;
            }
        }
    }
}

/* eo[slot, r] = W2_e[r] . act[slot, :] for the slots of expert e = cb_group_expert(active).
 * grid (ceil(Dp / 4), min(E, n*k)), block 128. */
extern "C" __global__ void cb_expert_down(float *eo, int Dp, const float *act, int F,
                                          const int *offsets, const int *active,
                                          const void *const *w2, const float *const *s2,
                                          int dtype) {
    const int e = cb_group_expert(active);
    if (e < 0) return;
    const int begin = offsets[e], end = offsets[e + 1];
    if (begin == end) return;
    const float *sc = dtype == CB_DT_INT8 || dtype == CB_DT_Q4 ? s2[e] : 0;
    switch (dtype) {
    case CB_DT_F32: cb_expert_down_impl<CB_DT_F32>(eo, Dp, act, F, begin, end, w2[e], sc); break;
    case CB_DT_F16: cb_expert_down_impl<CB_DT_F16>(eo, Dp, act, F, begin, end, w2[e], sc); break;
    case CB_DT_BF16:
        cb_expert_down_impl<CB_DT_BF16>(eo, Dp, act, F, begin, end, w2[e], sc);
        break;
    case CB_DT_Q4: cb_expert_down_impl<CB_DT_Q4>(eo, Dp, act, F, begin, end, w2[e], sc); break;
    default: cb_expert_down_impl<CB_DT_INT8>(eo, Dp, act, F, begin, end, w2[e], sc); break;
    }
}

/* ---- combine ------------------------------------------------------------------------------- */

/* x[t, i] += (sum_j wts[t, j] * eo[slot_of[t, j], i]) + g_t * s[t, i], the routed sum in rank
 * order j = 0..k-1, then the shared expert (g_t = sigmoid(gate[t]) when gate is given, else 1;
 * skipped when s is NULL). grid (n), any block size. */
extern "C" __global__ void cb_moe_combine(float *x, int Dp, int k, const float *eo,
                                          const int *slot_of, const float *wts, const float *s,
                                          const float *gate) {
    const int t = blockIdx.x;
    float *xr = x + (cb_u64)t * (cb_u64)Dp;
    const float g = gate ? 1.0f / (1.0f + expf(-gate[t])) : 1.0f;
    for (int i = threadIdx.x; i < Dp; i += blockDim.x) {
        float acc = 0.0f;
        for (int j = 0; j < k; j++)
            acc += wts[t * k + j] * eo[(cb_u64)slot_of[t * k + j] * (cb_u64)Dp + (cb_u64)i];
        if (s) acc += g * s[(cb_u64)t * (cb_u64)Dp + (cb_u64)i];
        xr[i] += acc;
    }
}

/* ---- tensor-core prefill GEMM (sm_80+): grouped expert SwiGLU and linear layers ---------- */

/* The prefill twins of cb_expert_up / cb_expert_down (same arguments, same grid rows of experts,
 * same outputs) and of cb_linear on the tensor cores:
 * mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32, one warp per 16 weight rows (M = weight
 * rows, N = the expert's (or the pass's) tokens in tiles of 8, K = the input dimension in steps
 * of 8). Compiled only for __CUDA_ARCH__ >= 800 (mma with .tf32 needs sm_80): the PTX for a
 * lower SM (Xavier's compute_72) and every cubin made from it lack these three kernels, and the
 * backend then keeps the SIMT kernels (it looks them up as optional). The host emulation
 * (tests/gpu/emu, no __CUDA_ARCH__) compiles them with an exact emulation of the mma.
 *
 * Precision: the GPU-vs-CPU tolerance of the SIMT kernels is kept. tf32 has an 11-bit
 * significand (f32's exponent range). f16, bf16 and int8 weights are exact in tf32 (the int8 row
 * scale is applied after the dot, as in the SIMT kernels); an f32 weight is split into
 * w_hi = rna_tf32(w) and w_lo = rna_tf32(w - w_hi). Every f32 activation is split likewise
 * (x_hi + x_lo, |x - x_hi - x_lo| <= 2^-22 |x|), so each product is carried to ~2^-22: exact
 * weights take 2 mma per tile (w x_lo, then w x_hi), f32 weights 3 (w_lo x_hi, w_hi x_lo,
 * w_hi x_hi; the w_lo x_lo term, <= 2^-22 of the product, is dropped). The products are exact in
 * the mma and accumulate in f32 in the fragment registers; the small terms first.
 * q4 is not built here (each 32-weight group has its own f16 scale, which would need per-group
 * partial sums): q4 experts stay on the SIMT kernels.
 *
 * Determinism: no atomics; an output element's sum runs over k-steps 0, 8, 16, ... in order, and
 * within a step the mma sums its 8 products in the hardware's fixed way. The element depends only
 * on its weight row and its token's activations, never on which tokens share its tile, so the
 * same inputs give the same bits on any run. It is not the GEMV's order: on the GPU a prefill
 * pass (these kernels) and a decode step (the GEMV) give different last bits for the same token
 * (docs/cuda.md, "Tensor-core prefill (sm_80+)"). */
#define CB_MMA_WARPS COLIBRI_CU_MMA_WARPS /* warps per block: 64 weight rows */
#define CB_MMA_NT (COLIBRI_CU_MMA_TOKENS / 8) /* 8-token tiles per pass: 32 tokens */

#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800

/* f32 -> tf32 (bits of an f32 whose low 13 mantissa bits are 0), round to nearest, ties away
 * from zero: cvt.rna.tf32.f32 (PTX ISA, "cvt"). The emulation supplies the same rounding. */
#ifdef __CUDA_ARCH__
__device__ __forceinline__ cb_u32 cb_tf32(float f) {
    cb_u32 r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(f));
    return r;
}

/* d += A (16 x 8, tf32) . B (8 x 8, tf32), f32 accumulate, for the whole warp. Fragments (PTX ISA,
 * "Matrix Fragments for mma.m16n8k8", .tf32): with g = lane / 4, t = lane % 4, a[0] = A[g][t],
 * a[1] = A[g + 8][t], a[2] = A[g][t + 4], a[3] = A[g + 8][t + 4]; b[0] = B[t][g],
 * b[1] = B[t + 4][g]; d[q] = D[g + 8 (q / 2)][2 t + q % 2]. */
__device__ __forceinline__ void cb_mma_tf32(float *d, const cb_u32 *a, const cb_u32 *b) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
#else
#define cb_tf32 cb_emu_tf32
#define cb_mma_tf32 cb_emu_mma_tf32
#endif

/* x as hi + lo, both tf32 (the lo part of a tf32-exact value is 0) */
__device__ __forceinline__ void cb_tf32_split(float x, cb_u32 &hi, cb_u32 &lo) {
    hi = cb_tf32(x);
    lo = cb_tf32(x - __uint_as_float(hi));
}

/* Element c of a weight row as tf32 hi/lo parts: f16/bf16/int8 exactly (lo unused), f32 split. */
template <int DT>
__device__ __forceinline__ void cb_w_tf32(const void *row, int c, cb_u32 &hi, cb_u32 &lo) {
    if (DT == CB_DT_F32) cb_tf32_split(((const float *)row)[c], hi, lo);
    else { hi = __float_as_uint(cb_load1<DT>(row, (cb_u64)c)); lo = 0u; }
}

/* d[m][j] += W_m[rows r0 .. r0 + 15] . x[tokens of tile j], over all K columns, for NW weight
 * matrices of the same shape (W1 and W3: NW = 2). Tile j's token for this lane's B fragment is
 * xb[j] (column g of the tile), valid when vt[j]; tiles j >= ntiles are skipped (warp-uniform).
 * The logical k index t of the fragment tables is column k0 + 2t and t + 4 is k0 + 2t + 1 (the
 * same permutation for A and B leaves the sum's terms unchanged, and a lane's two columns are
 * adjacent in memory). Rows >= M and columns >= K read as 0. */
template <int DT, int NW>
__device__ __forceinline__ void cb_mma_rows(const void *const *w, int r0, int M, int K,
                                            const float *const *xb, const int *vt, int ntiles,
                                            float (*d)[CB_MMA_NT][4]) {
    const int lane = threadIdx.x & (CB_WARP - 1), g = lane >> 2, t = lane & 3;
    const int ra = r0 + g, rb = r0 + g + 8;
    const void *rowa[NW], *rowb[NW];
#pragma unroll
    for (int m = 0; m < NW; m++) {
        rowa[m] = cb_row_ptr<DT>(w[m], ra < M ? ra : r0, K);
        rowb[m] = cb_row_ptr<DT>(w[m], rb < M ? rb : r0, K);
    }
    for (int k0 = 0; k0 < K; k0 += 8) {
        const int ka = k0 + 2 * t, kb = ka + 1;
        const int oka = ka < K, okb = kb < K;
        cb_u32 ah[NW][4], al[NW][4];
#pragma unroll
        for (int m = 0; m < NW; m++) {
            ah[m][0] = ah[m][1] = ah[m][2] = ah[m][3] = 0u;
            al[m][0] = al[m][1] = al[m][2] = al[m][3] = 0u;
            if (ra < M && oka) cb_w_tf32<DT>(rowa[m], ka, ah[m][0], al[m][0]);
            if (rb < M && oka) cb_w_tf32<DT>(rowb[m], ka, ah[m][1], al[m][1]);
            if (ra < M && okb) cb_w_tf32<DT>(rowa[m], kb, ah[m][2], al[m][2]);
            if (rb < M && okb) cb_w_tf32<DT>(rowb[m], kb, ah[m][3], al[m][3]);
        }
#pragma unroll
        for (int j = 0; j < CB_MMA_NT; j++) {
            if (j < ntiles) { /* warp-uniform: every lane takes part in each mma */
                cb_u32 bh[2] = {0u, 0u}, bl[2] = {0u, 0u};
                if (vt[j] && oka) cb_tf32_split(xb[j][ka], bh[0], bl[0]);
                if (vt[j] && okb) cb_tf32_split(xb[j][kb], bh[1], bl[1]);
#pragma unroll
                for (int m = 0; m < NW; m++) {
                    if (DT == CB_DT_F32) cb_mma_tf32(d[m][j], al[m], bh);
                    cb_mma_tf32(d[m][j], ah[m], bl);
                    cb_mma_tf32(d[m][j], ah[m], bh);
                }
            }
        }
    }
}

template <int DT>
__device__ void cb_expert_up_mma_impl(float *act, int F, const float *h, int Dp, const int *perm,
                                      int begin, int end, const void *w1, const void *w3,
                                      const float *s1, const float *s3) {
    const int lane = threadIdx.x & (CB_WARP - 1), g = lane >> 2, t = lane & 3;
    const int r0 = (blockIdx.x * CB_MMA_WARPS + threadIdx.x / CB_WARP) * 16;
    if (r0 >= F) return; /* whole warp */
    const void *w[2] = {w1, w3};
    for (int s0 = begin; s0 < end; s0 += 8 * CB_MMA_NT) {
        const int left = end - s0;
        const int ntiles = left >= 8 * CB_MMA_NT ? CB_MMA_NT : (left + 7) / 8;
        const float *xb[CB_MMA_NT];
        int vt[CB_MMA_NT];
#pragma unroll
        for (int j = 0; j < CB_MMA_NT; j++) {
            const int slot = s0 + 8 * j + g;
            vt[j] = slot < end;
            xb[j] = h + (cb_u64)perm[vt[j] ? slot : begin] * (cb_u64)Dp;
        }
        float d[2][CB_MMA_NT][4];
#pragma unroll
        for (int m = 0; m < 2; m++)
#pragma unroll
            for (int j = 0; j < CB_MMA_NT; j++)
                d[m][j][0] = d[m][j][1] = d[m][j][2] = d[m][j][3] = 0.0f;
        cb_mma_rows<DT, 2>(w, r0, F, Dp, xb, vt, ntiles, d);
#pragma unroll
        for (int j = 0; j < CB_MMA_NT; j++) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = r0 + g + 8 * (q >> 1), slot = s0 + 8 * j + 2 * t + (q & 1);
                if (j < ntiles && r < F && slot < end) {
                    const float gv = d[0][j][q] * (DT == CB_DT_INT8 ? s1[r] : 1.0f);
                    const float uv = d[1][j][q] * (DT == CB_DT_INT8 ? s3[r] : 1.0f);
                    act[(cb_u64)slot * (cb_u64)F + r] = cb_silu(gv) * uv;
                }
            }
        }
    }
}

/* cb_expert_up on the tensor cores: same arguments and result (within tf32-split rounding), for
 * dtype f32/f16/bf16/int8 (q4: the backend launches cb_expert_up). grid (ceil(F / 64),
 * min(E, n*k)), block 128: warp w of block x serves rows 64x + 16w .. +15 of expert
 * cb_group_expert(active), all its slots in passes of 32. */
extern "C" __global__ void cb_expert_up_mma(float *act, int F, const float *h, int Dp,
                                            const int *perm, const int *offsets,
                                            const int *active, const void *const *w1,
                                            const void *const *w3, const float *const *s1,
                                            const float *const *s3, int dtype) {
    const int e = cb_group_expert(active);
    if (e < 0) return;
    const int begin = offsets[e], end = offsets[e + 1];
    if (begin == end) return;
    const float *sc1 = dtype == CB_DT_INT8 ? s1[e] : 0, *sc3 = dtype == CB_DT_INT8 ? s3[e] : 0;
    switch (dtype) {
    case CB_DT_F32:
        cb_expert_up_mma_impl<CB_DT_F32>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3);
        break;
    case CB_DT_F16:
        cb_expert_up_mma_impl<CB_DT_F16>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3);
        break;
    case CB_DT_BF16:
        cb_expert_up_mma_impl<CB_DT_BF16>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3);
        break;
    case CB_DT_INT8:
        cb_expert_up_mma_impl<CB_DT_INT8>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3);
        break;
    default: break; /* q4: never launched (the backend uses cb_expert_up) */
    }
}

template <int DT>
__device__ void cb_expert_down_mma_impl(float *eo, int Dp, const float *act, int F, int begin,
                                        int end, const void *w2, const float *s2) {
    const int lane = threadIdx.x & (CB_WARP - 1), g = lane >> 2, t = lane & 3;
    const int r0 = (blockIdx.x * CB_MMA_WARPS + threadIdx.x / CB_WARP) * 16;
    if (r0 >= Dp) return; /* whole warp */
    for (int s0 = begin; s0 < end; s0 += 8 * CB_MMA_NT) {
        const int left = end - s0;
        const int ntiles = left >= 8 * CB_MMA_NT ? CB_MMA_NT : (left + 7) / 8;
        const float *xb[CB_MMA_NT];
        int vt[CB_MMA_NT];
#pragma unroll
        for (int j = 0; j < CB_MMA_NT; j++) {
            const int slot = s0 + 8 * j + g;
            vt[j] = slot < end;
            xb[j] = act + (cb_u64)(vt[j] ? slot : begin) * (cb_u64)F;
        }
        float d[1][CB_MMA_NT][4];
#pragma unroll
        for (int j = 0; j < CB_MMA_NT; j++)
            d[0][j][0] = d[0][j][1] = d[0][j][2] = d[0][j][3] = 0.0f;
        cb_mma_rows<DT, 1>(&w2, r0, Dp, F, xb, vt, ntiles, d);
#pragma unroll
        for (int j = 0; j < CB_MMA_NT; j++) {
#pragma unroll
            for (int q = 0; q < 4; q++) {
                const int r = r0 + g + 8 * (q >> 1), slot = s0 + 8 * j + 2 * t + (q & 1);
                if (j < ntiles && r < Dp && slot < end)
                    eo[(cb_u64)slot * (cb_u64)Dp + r] =
                        d[0][j][q] * (DT == CB_DT_INT8 ? s2[r] : 1.0f);
            }
        }
    }
}

/* cb_expert_down on the tensor cores (f32/f16/bf16/int8). grid (ceil(Dp / 64), min(E, n*k)),
 * block 128. */
extern "C" __global__ void cb_expert_down_mma(float *eo, int Dp, const float *act, int F,
                                              const int *offsets, const int *active,
                                              const void *const *w2, const float *const *s2,
                                              int dtype) {
    const int e = cb_group_expert(active);
    if (e < 0) return;
    const int begin = offsets[e], end = offsets[e + 1];
    if (begin == end) return;
    const float *sc = dtype == CB_DT_INT8 ? s2[e] : 0;
    switch (dtype) {
    case CB_DT_F32:
        cb_expert_down_mma_impl<CB_DT_F32>(eo, Dp, act, F, begin, end, w2[e], sc);
        break;
    case CB_DT_F16:
        cb_expert_down_mma_impl<CB_DT_F16>(eo, Dp, act, F, begin, end, w2[e], sc);
        break;
    case CB_DT_BF16:
        cb_expert_down_mma_impl<CB_DT_BF16>(eo, Dp, act, F, begin, end, w2[e], sc);
        break;
    case CB_DT_INT8:
        cb_expert_down_mma_impl<CB_DT_INT8>(eo, Dp, act, F, begin, end, w2[e], sc);
        break;
    default: break; /* q4: never launched */
    }
}

template <int DT>
__device__ void cb_linear_mma_impl(float *y, int y_stride, const float *x, int x_stride, int n,
                                   const void *w, const float *scales, int rows, int cols,
                                   const float *bias, int accumulate, int y_row0) {
    const int lane = threadIdx.x & (CB_WARP - 1), g = lane >> 2, t = lane & 3;
    const int r0 = (blockIdx.x * CB_MMA_WARPS + threadIdx.x / CB_WARP) * 16;
    const int t0 = blockIdx.y * 8 * CB_MMA_NT;
    if (r0 >= rows || t0 >= n) return; /* whole warp */
    const int left = n - t0;
    const int ntiles = left >= 8 * CB_MMA_NT ? CB_MMA_NT : (left + 7) / 8;
    const float *xb[CB_MMA_NT];
    int vt[CB_MMA_NT];
#pragma unroll
    for (int j = 0; j < CB_MMA_NT; j++) {
        const int tok = t0 + 8 * j + g;
        vt[j] = tok < n;
        xb[j] = x + (cb_u64)(vt[j] ? tok : t0) * (cb_u64)x_stride;
    }
    float d[1][CB_MMA_NT][4];
#pragma unroll
    for (int j = 0; j < CB_MMA_NT; j++) d[0][j][0] = d[0][j][1] = d[0][j][2] = d[0][j][3] = 0.0f;
    cb_mma_rows<DT, 1>(&w, r0, rows, cols, xb, vt, ntiles, d);
#pragma unroll
    for (int j = 0; j < CB_MMA_NT; j++) {
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int r = r0 + g + 8 * (q >> 1), tok = t0 + 8 * j + 2 * t + (q & 1);
            if (j < ntiles && r < rows && tok < n) {
                float v = d[0][j][q];
                if (DT == CB_DT_INT8) v *= scales[r];
                if (bias) v += bias[r];
                float *yp = y + (cb_u64)(y_row0 + tok) * (cb_u64)y_stride + r;
                *yp = accumulate ? *yp + v : v;
            }
        }
    }
}

/* cb_linear on the tensor cores (f32/f16/bf16/int8; q4: the backend launches cb_linear): same
 * arguments and result (within the tf32-split rounding). grid (ceil(rows / 64), ceil(n / 32)),
 * block 128: warp w of block (x, y) computes rows 64x + 16w .. +15 for tokens 32y .. 32y + 31. */
extern "C" __global__ void cb_linear_mma(float *y, int y_stride, const float *x, int x_stride,
                                         int n, const void *w, const float *scales, int dtype,
                                         int rows, int cols, const float *bias, int accumulate,
                                         const int *pos_d) {
    const int y_row0 = pos_d ? *pos_d : 0;
    switch (dtype) {
    case CB_DT_F32:
        cb_linear_mma_impl<CB_DT_F32>(y, y_stride, x, x_stride, n, w, scales, rows, cols, bias,
                                      accumulate, y_row0);
        break;
    case CB_DT_F16:
        cb_linear_mma_impl<CB_DT_F16>(y, y_stride, x, x_stride, n, w, scales, rows, cols, bias,
                                      accumulate, y_row0);
        break;
    case CB_DT_BF16:
        cb_linear_mma_impl<CB_DT_BF16>(y, y_stride, x, x_stride, n, w, scales, rows, cols, bias,
                                       accumulate, y_row0);
        break;
    case CB_DT_INT8:
        cb_linear_mma_impl<CB_DT_INT8>(y, y_stride, x, x_stride, n, w, scales, rows, cols, bias,
                                       accumulate, y_row0);
        break;
    default: break; /* q4: never launched */
    }
}

#endif /* tensor cores: __CUDA_ARCH__ >= 800 */

/* ---------------------------------------------------------------------------------------------
 * gpt-oss kernels (#23): mxfp4 experts, attention sinks, sliding-window ring, biases, clamped
 * SwiGLU. Kept in one block so the family's kernels read together.
 * ------------------------------------------------------------------------------------------- */

/* Heads up to this wide in cb_oss_attention (two output lanes per thread of its 128). */
#define CB_OSS_MAX_DH 256
/* Keys a tile of cb_oss_attention: one per thread of its block. */
#define CB_OSS_KEYS COLIBRI_CU_HEAD_THREADS

/* mxfp4 (docs/format.md "mxfp4", the CPU's kernels_mxfp4.c): rows of ceil(cols / 32) blocks of
 * 16 bytes, element 2j of a block in the low nibble of byte j and 2j + 1 in the high one (E2M1
 * codes), one E8M0 scale byte s per block. The CPU forms the weight as W2[code] * 2^(s - 128)
 * with W2 = 2 * E2M1 = {0, 1, 2, 3, 4, 6, 8, 12}, an exact f32 (a small integer times a power of
 * two); so do these kernels, so both sides multiply the same f32 weight values. W2 by integer
 * arithmetic (codes 4..7 are 4 or 6 shifted by 0 or 1), no table in constant memory. */
__device__ __forceinline__ float cb_mx_w2(int code) {
    const int m = code & 7;
    const int mag = m < 4 ? m : (4 + 2 * (m & 1)) << ((m >> 1) - 2);
    return (code & 8) ? -(float)mag : (float)mag;
}

/* 2^(s - 128) as f32 bits: normal for s >= 2 (exponent field s - 1), subnormal 2^-127 and
 * 2^-128 for s = 1 and 0 (the CPU's SCALE table holds the same values). */
__device__ __forceinline__ float cb_mx_scale(int s) {
    return __uint_as_float(s >= 2 ? (cb_u32)(s - 1) << 23 : 0x00200000u << s);
}

/* Element c of row r of a weight (cols wide) as f32, the int8 row scale not applied (the caller
 * multiplies the dot by it, as cb_linear does); mxfp4 with its block scale (sc: the E8M0 bytes). */
template <int DT>
__device__ __forceinline__ float cb_oss_w(const void *w, const void *sc, int r, int cols, int c) {
    if (DT == COLIBRI_DT_MXFP4) {
        const int nb = (cols + COLIBRI_MX_BLOCK - 1) / COLIBRI_MX_BLOCK, b = c / COLIBRI_MX_BLOCK;
        const unsigned char *blk = (const unsigned char *)w +
                                   ((cb_u64)r * (cb_u64)nb + (cb_u64)b) * COLIBRI_MX_BLOCK_BYTES;
        const int byte = blk[(c % COLIBRI_MX_BLOCK) >> 1];
        const int code = (c & 1) ? byte >> 4 : byte & 15;
        return cb_mx_w2(code) * cb_mx_scale(((const unsigned char *)sc)[(cb_u64)r * nb + b]);
    }
    return cb_load1<DT>(w, (cb_u64)r * (cb_u64)cols + (cb_u64)c);
}

/* One warp: W[r, :] . x (cols wide), lane l adding columns l, l + 32, ... in order, then the
 * warp's butterfly (cb_warp_sum); every lane gets the sum, times the int8 row scale. */
template <int DT>
__device__ __forceinline__ float cb_oss_row_dot(const void *w, const void *sc, int r, int cols,
                                                const float *x) {
    const int lane = threadIdx.x & (CB_WARP - 1);
    float acc = 0.0f;
    for (int c = lane; c < cols; c += CB_WARP) acc += cb_oss_w<DT>(w, sc, r, cols, c) * x[c];
    acc = cb_warp_sum(acc);
    return DT == COLIBRI_DT_INT8 ? acc * ((const float *)sc)[r] : acc;
}

/* gpt-oss's activation, as the CPU's clamped_swiglu (layers/moe_experts.c; transformers'
 * GptOssExperts): gate clamped above at limit, up to [-limit, limit], (up + 1) * g * sigmoid(alpha
 * g). limit <= 0: the plain silu(g) * u of the other families. */
__device__ __forceinline__ float cb_oss_act(float g, float u, float alpha, float limit) {
    if (limit <= 0.0f) return cb_silu(g) * u;
    g = g > limit ? limit : g;
    u = u > limit ? limit : (u < -limit ? -limit : u);
    return (u + 1.0f) * (g * (1.0f / (1.0f + expf(-(g * alpha)))));
}

template <int DT>
__device__ void cb_oss_up_impl(float *act, int F, const float *h, int Dp, const int *perm,
                               int begin, int end, const void *w1, const void *w3,
                               const void *s1, const void *s3, const float *b1, const float *b3,
                               float alpha, float limit) {
    const int r = blockIdx.x * CB_ROW_WARPS + threadIdx.x / CB_WARP;
    if (r >= F) return;
    for (int s = begin; s < end; s++) {
        const float *x = h + (cb_u64)perm[s] * (cb_u64)Dp;
        float g = cb_oss_row_dot<DT>(w1, s1, r, Dp, x), u = cb_oss_row_dot<DT>(w3, s3, r, Dp, x);
        if (b1) { /* the CPU adds the expert biases to the finished dots, then activates */
            g += b1[r];
            u += b3[r];
        }
        if ((threadIdx.x & (CB_WARP - 1)) == 0)
            act[(cb_u64)s * (cb_u64)F + r] = cb_oss_act(g, u, alpha, limit);
    }
}

/* The routed experts' up projection for gpt-oss (and any model whose experts are mxfp4):
 * act[slot, r] = act(W1_e[r] . h[perm[slot]] + b1_e[r], W3_e[r] . h[perm[slot]] + b3_e[r]) for the
 * slots of expert e = cb_group_expert(active), act = cb_oss_act (clamped SwiGLU when limit > 0).
 * Same tables and grid as cb_expert_up (w1/w3/s1/s3: per-expert pointers; s* the int8 row scales
 * or the mxfp4 E8M0 bytes), plus per-expert bias pointers b1/b3 (NULL: no biases). SIMT: one warp
 * per weight row, the expert's slots one after another (the row stays in L1/L2 for the next).
 * grid (ceil(F / 4), min(E, n*k)), block 128. f32/f16/bf16/int8/mxfp4 (q4: cb_expert_up). */
extern "C" __global__ void cb_oss_expert_up(float *act, int F, const float *h, int Dp,
                                            const int *perm, const int *offsets,
                                            const int *active, const void *const *w1,
                                            const void *const *w3, const void *const *s1,
                                            const void *const *s3, int dtype,
                                            const float *const *b1, const float *const *b3,
                                            float alpha, float limit) {
    const int e = cb_group_expert(active);
    if (e < 0) return;
    const int begin = offsets[e], end = offsets[e + 1];
    if (begin == end) return;
    const int scaled = dtype == COLIBRI_DT_INT8 || dtype == COLIBRI_DT_MXFP4;
    const void *sc1 = scaled ? s1[e] : 0, *sc3 = scaled ? s3[e] : 0;
    const float *bb1 = b1 ? b1[e] : 0, *bb3 = b3 ? b3[e] : 0;
#define CB_OSS_UP(DT) cb_oss_up_impl<DT>(act, F, h, Dp, perm, begin, end, w1[e], w3[e], sc1, sc3, \
                                         bb1, bb3, alpha, limit)
    switch (dtype) {
    case COLIBRI_DT_F32: CB_OSS_UP(COLIBRI_DT_F32); break;
    case COLIBRI_DT_F16: CB_OSS_UP(COLIBRI_DT_F16); break;
    case COLIBRI_DT_BF16: CB_OSS_UP(COLIBRI_DT_BF16); break;
    case COLIBRI_DT_INT8: CB_OSS_UP(COLIBRI_DT_INT8); break;
    default: CB_OSS_UP(COLIBRI_DT_MXFP4); break;
    }
#undef CB_OSS_UP
}

template <int DT>
__device__ void cb_oss_down_impl(float *eo, int Dp, const float *act, int F, int begin, int end,
                                 const void *w2, const void *s2, const float *b2) {
    const int r = blockIdx.x * CB_ROW_WARPS + threadIdx.x / CB_WARP;
    if (r >= Dp) return;
    for (int s = begin; s < end; s++) {
        float v = cb_oss_row_dot<DT>(w2, s2, r, F, act + (cb_u64)s * (cb_u64)F);
        if (b2) v += b2[r];
        if ((threadIdx.x & (CB_WARP - 1)) == 0) eo[(cb_u64)s * (cb_u64)Dp + r] = v;
    }
}

/* eo[slot, r] = W2_e[r] . act[slot, :] + b2_e[r] for the slots of expert e, as cb_expert_down
 * (same grid) with per-expert bias pointers b2 (NULL: none) and the dtypes of cb_oss_expert_up. */
extern "C" __global__ void cb_oss_expert_down(float *eo, int Dp, const float *act, int F,
                                              const int *offsets, const int *active,
                                              const void *const *w2, const void *const *s2,
                                              int dtype, const float *const *b2) {
    const int e = cb_group_expert(active);
    if (e < 0) return;
    const int begin = offsets[e], end = offsets[e + 1];
    if (begin == end) return;
    const void *sc = dtype == COLIBRI_DT_INT8 || dtype == COLIBRI_DT_MXFP4 ? s2[e] : 0;
    const float *bb = b2 ? b2[e] : 0;
    switch (dtype) {
    case COLIBRI_DT_F32: cb_oss_down_impl<COLIBRI_DT_F32>(eo, Dp, act, F, begin, end, w2[e], sc, bb); break;
    case COLIBRI_DT_F16: cb_oss_down_impl<COLIBRI_DT_F16>(eo, Dp, act, F, begin, end, w2[e], sc, bb); break;
    case COLIBRI_DT_BF16: cb_oss_down_impl<COLIBRI_DT_BF16>(eo, Dp, act, F, begin, end, w2[e], sc, bb); break;
    case COLIBRI_DT_INT8: cb_oss_down_impl<COLIBRI_DT_INT8>(eo, Dp, act, F, begin, end, w2[e], sc, bb); break;
    default: cb_oss_down_impl<COLIBRI_DT_MXFP4>(eo, Dp, act, F, begin, end, w2[e], sc, bb); break;
    }
}

/* Causal GQA attention with gpt-oss's attention sinks and sliding window, for prefill and
 * decode alike. Token t is at position p = pos0 (+ *pos_d: the decode graph) + t and attends to
 * positions first..p, first = max(0, p - window + 1) (window 0: every position; transformers'
 * sliding_window_overlay, as layers/attention.c). The cache holds every position (row p), so a
 * sliding layer is the full cache read through the window, not the CPU's ring (docs/cuda.md).
 * sinks (NULL: none): head h's logit joins the softmax and has no value row. The softmax is
 * online over tiles of 128 keys from `first` in order: the state starts at (m, l, acc) =
 * (sink, 1, 0) (the sink's own term exp(sink - m) = 1), or (-inf, 0, 0) without one; per tile
 * thread j scores key first + j (q . k in index order, times 1/sqrt(Dh) as the CPU scales),
 * m' = max(m, tile max), c = exp(m - m'), l = l c + sum_j exp(s_j - m'), acc = acc c +
 * sum_j p_j v_j in position order. out = acc / l. A token's bits depend only on its position
 * and the cache, so a token gives the same bits in a prefill pass and decoded alone.
 * grid (H, n), block 128 (CB_OSS_KEYS), Dh <= CB_OSS_MAX_DH. */
extern "C" __global__ void cb_oss_attention(float *out, const float *q, const void *kc,
                                            const void *vc, int n, int pos0, int H, int Hkv,
                                            int Dh, int kv_f16, int window, const float *sinks,
                                            const int *pos_d) {
    __shared__ float qs[CB_OSS_MAX_DH];
    __shared__ float ps[CB_OSS_KEYS];
    __shared__ float scratch[CB_WARP];
    const int h = blockIdx.x, t = blockIdx.y, tid = threadIdx.x;
    const int p = pos0 + (pos_d ? *pos_d : 0) + t;
    const int first = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
    const int kvd = Hkv * Dh, kvh = h / (H / Hkv);
    const float *qr = q + ((cb_u64)t * (cb_u64)H + (cb_u64)h) * (cb_u64)Dh;
    for (int d = tid; d < Dh; d += blockDim.x) qs[d] = qr[d];
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)Dh);
    float m = sinks ? sinks[h] : -__int_as_float(0x7f800000), l = sinks ? 1.0f : 0.0f;
    float acc[2] = {0.0f, 0.0f}; /* output lanes tid and tid + 128 */
    for (int j0 = first; j0 <= p; j0 += CB_OSS_KEYS) {
        const int nk = p + 1 - j0 < CB_OSS_KEYS ? p + 1 - j0 : CB_OSS_KEYS;
        float s = -__int_as_float(0x7f800000);
        if (tid < nk) {
            const cb_u64 at = (cb_u64)(j0 + tid) * (cb_u64)kvd + (cb_u64)kvh * (cb_u64)Dh;
            float dot = 0.0f;
            for (int d = 0; d < Dh; d++) dot += qs[d] * cb_kv_load(kc, at + (cb_u64)d, kv_f16);
            s = dot * scale;
        }
        const float mn = fmaxf(m, cb_block_max(s, scratch));
        const float c = expf(m - mn);
        const float e = tid < nk ? expf(s - mn) : 0.0f;
        ps[tid] = e;
        l = l * c + cb_block_sum(e, scratch); /* its barriers also publish ps */
        for (int i = 0; i < 2; i++) {
            const int d = tid + i * CB_OSS_KEYS;
            if (d >= Dh) break;
            float a = acc[i] * c;
            for (int j = 0; j < nk; j++)
                a += ps[j] * cb_kv_load(vc, (cb_u64)(j0 + j) * (cb_u64)kvd +
                                                (cb_u64)kvh * (cb_u64)Dh + (cb_u64)d, kv_f16);
            acc[i] = a;
        }
        m = mn;
        __syncthreads(); /* ps is rewritten by the next tile */
    }
    float *o = out + ((cb_u64)t * (cb_u64)H + (cb_u64)h) * (cb_u64)Dh;
    for (int i = 0; i < 2; i++) {
        const int d = tid + i * CB_OSS_KEYS;
        if (d < Dh) o[d] = acc[i] / l;
    }
}

/* end of the gpt-oss kernels */

/* ---------------------------------------------------------------------------------------------
 * Hybrid-family kernels (#24, Qwen3.5 / Qwen3-Next): Gated DeltaNet (causal conv + conv state,
 * L2-normalised q/k, the gated delta rule over a per-head state, gated RMSNorm) and gated
 * attention (sigmoid output gate, partial RoPE). Kept in one block so the family reads together.
 * ------------------------------------------------------------------------------------------- */

/* Largest key head dim of a DeltaNet layer (q and k of the token live in shared memory; Qwen:
 * 128); the backend refuses wider (cb_check_model). */
#define CB_DN_MAX_DK COLIBRI_CU_DN_MAX_DK

/* Depthwise causal convolution of a DeltaNet layer over a pass of n tokens, then SiLU:
 *   u[j, c] = silu(sum_{i<W} w[c, i] * in(j - (W-1) + i, c))
 * where in(s, c) is qkv[s, c] for s >= 0 (this pass) and conv state row s + W-1 for s < 0 (the
 * layer's last W-1 inputs before the pass, oldest first); the taps are added in order
 * i = 0..W-1 from 0, as layers/deltanet.c conv_task does. Afterwards the state holds the last
 * W-1 inputs (row i <- input n-(W-1)+i; rows are read before they are overwritten since the
 * source row i + n > i). One thread per channel walks the tokens in order, so a token's value
 * does not depend on how the tokens were cut into passes (prefill == decode bit for bit).
 * grid ceil(C / blockDim), block 256. */
extern "C" __global__ void cb_dn_conv(float *u, const float *qkv, float *state, const float *w,
                                      int n, int C, int W) {
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    const float *wc = w + (cb_u64)c * (cb_u64)W;
    for (int j = 0; j < n; j++) {
        float acc = 0.0f;
        for (int i = 0; i < W; i++) {
            const int s = j - (W - 1) + i;
            const float in = s >= 0 ? qkv[(cb_u64)s * C + c] : state[(cb_u64)(s + W - 1) * C + c];
            acc += wc[i] * in;
        }
        u[(cb_u64)j * C + c] = cb_silu(acc);
    }
    for (int i = 0; i + 1 < W; i++) {
        const int s = n - (W - 1) + i;
        state[(cb_u64)i * C + c] = s >= 0 ? qkv[(cb_u64)s * C + c] : state[(cb_u64)(i + n) * C + c];
    }
}

/* torch.nn.functional.softplus (beta 1, threshold 20), as layers/deltanet.c */
__device__ __forceinline__ float cb_softplus(float v) { return v > 20.0f ? v : log1pf(expf(v)); }

/* The gated delta rule of one value head over a pass of n tokens, token after token, then the
 * gated RMSNorm of its output (layers/deltanet.c prepare + colibri_delta_step + recur_task):
 *   q, k = l2norm of the head's key head (x / sqrt(sum x^2 + 1e-6)), q *= 1 / sqrt(Dk)
 *   beta = sigmoid(b), decay = exp(-exp(a_log) * softplus(a + dt_bias))
 *   S *= decay;  d = (v - S^T k) * beta;  S += k d^T;  o = S^T q
 *   o = nw * rmsnorm(o) * silu(z)   (eps)
 * u: the convolution's output rows [n, C] = [q (Hk*Dk) | k (Hk*Dk) | v (Hv*Dv)]; z [n, Hv*Dv];
 * b, a [n, Hv]; S: the layer's Hv states of [Dk, Dv] (block h owns state h). Thread i owns the
 * state's columns i, i + blockDim.x, ...: its sums run over the key index r = 0..Dk-1 in order
 * and nothing of a column is shared, so no barrier guards the state. The l2 and RMS sums are
 * cb_block_sum's fixed shape. Every token runs the same code whatever n is: a prompt's pass
 * gives the bits of the same tokens decoded one by one.
 * grid (Hv), block 128 (a multiple of 32). */
extern "C" __global__ void cb_dn_recur(float *o, float *S, const float *u, const float *z,
                                       const float *b, const float *a, const float *a_log,
                                       const float *dt_bias, const float *nw, int n, int Hk,
                                       int Hv, int Dk, int Dv, float eps) {
    __shared__ float qs[CB_DN_MAX_DK], ks[CB_DN_MAX_DK], scratch[CB_WARP];
    const int h = blockIdx.x, kh = h / (Hv / Hk);
    const int kd = Hk * Dk, vd = Hv * Dv, C = 2 * kd + vd;
    float *Sh = S + (cb_u64)h * (cb_u64)Dk * (cb_u64)Dv;
    const float scale = 1.0f / sqrtf((float)Dk);
    const float ea = expf(a_log[h]), dt = dt_bias[h];
    for (int j = 0; j < n; j++) {
        const float *row = u + (cb_u64)j * C;
        const float *qr = row + kh * Dk, *kr = row + kd + kh * Dk, *vr = row + 2 * kd + h * Dv;
        float sq = 0.0f, sk = 0.0f;
        for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
            sq += qr[i] * qr[i];
            sk += kr[i] * kr[i];
        }
        sq = cb_block_sum(sq, scratch);
        sk = cb_block_sum(sk, scratch);
        const float iq = 1.0f / sqrtf(sq + 1e-6f), ik = 1.0f / sqrtf(sk + 1e-6f);
        for (int i = threadIdx.x; i < Dk; i += blockDim.x) {
            qs[i] = qr[i] * iq * scale;
            ks[i] = kr[i] * ik;
        }
        __syncthreads();
        const float beta = 1.0f / (1.0f + expf(-b[(cb_u64)j * Hv + h]));
        const float decay = expf(-ea * cb_softplus(a[(cb_u64)j * Hv + h] + dt));
        float *oj = o + (cb_u64)j * vd + (cb_u64)h * Dv;
        float ss = 0.0f;
        for (int i = threadIdx.x; i < Dv; i += blockDim.x) {
            float mem = 0.0f;
            for (int r = 0; r < Dk; r++) {
                const float s = Sh[(cb_u64)r * Dv + i] * decay;
                Sh[(cb_u64)r * Dv + i] = s;
                mem += s * ks[r];
            }
            const float d = (vr[i] - mem) * beta;
            float acc = 0.0f;
            for (int r = 0; r < Dk; r++) {
                const float s = Sh[(cb_u64)r * Dv + i] + ks[r] * d;
                Sh[(cb_u64)r * Dv + i] = s;
                acc += s * qs[r];
            }
            oj[i] = acc;
            ss += acc * acc;
        }
        ss = cb_block_sum(ss, scratch); /* also the barrier before qs/ks are rewritten */
        const float inv = 1.0f / sqrtf(ss / (float)Dv + eps);
        const float *zj = z + (cb_u64)j * vd + (cb_u64)h * Dv;
        for (int i = threadIdx.x; i < Dv; i += blockDim.x)
            oj[i] = nw[i] * (oj[i] * inv) * cb_silu(zj[i]);
    }
}

/* Qwen's partial RoPE attention step per (token, head), cb_qk_rope_kv's work with a rotary width
 * R < Dh: the optional per-head q/k RMSNorm (norm 1; cb_qk_rope_kv's sum of squares), rotate-half
 * on the head's first R lanes only (lane i < R/2 with i + R/2; lanes R.. pass through normed),
 * q to q[t], K and V to the cache row of position pos0 (+ *pos_d) + t (f32 or f16).
 * cs: the partial table [max_seq_len, R/2, (cos, sin)] (colibri_cuda_rope_table_partial: the
 * angle p * theta^(-2i/R) in double, as layers/attention.c rope_partial).
 * grid (n, H + Hkv), block 256; the token count is the grid's (16 arguments: what the stand-in
 * driver's graph capture holds). */
extern "C" __global__ void cb_qk_rope_partial_kv(float *q, const float *qkv, void *kc, void *vc,
                                                 int H, int Hkv, int Dh, int R, int pos0,
                                                 const float *cs, const float *qn,
                                                 const float *kn, int norm, float eps, int kv_f16,
                                                 const int *pos_d) {
    __shared__ float scratch[CB_WARP];
    const int t = blockIdx.x, y = blockIdx.y;
    const int HD = H * Dh, kvd = Hkv * Dh, half = R / 2;
    const int is_q = y < H, head = is_q ? y : y - H;
    const int p = pos0 + (pos_d ? *pos_d : 0) + t;
    const float *row = qkv + (cb_u64)t * (cb_u64)(HD + 2 * kvd) + (is_q ? 0 : HD);
    const float *src = row + (cb_u64)head * (cb_u64)Dh;
    const float *w = is_q ? qn : kn;
    float inv = 1.0f;
    if (norm) {
        float ss = 0.0f;
        for (int i = threadIdx.x; i < Dh; i += blockDim.x) ss += src[i] * src[i];
        ss = cb_block_sum(ss, scratch);
        inv = 1.0f / sqrtf(ss / (float)Dh + eps);
    }
    const float *cp = cs + (cb_u64)p * (cb_u64)half * 2u;
    const cb_u64 at = (cb_u64)p * (cb_u64)kvd + (cb_u64)head * (cb_u64)Dh;
    float *qo = q + (cb_u64)t * (cb_u64)HD + (cb_u64)head * (cb_u64)Dh;
    for (int i = threadIdx.x; i < Dh - half; i += blockDim.x) {
        /* i < half: the pair (i, i + half); i >= half: lane i + half passes through */
        const int lo = i < half ? i : i + half;
        float va = src[lo];
        if (norm) va = w[lo] * (va * inv);
        float ra = va, rb = 0.0f;
        if (i < half) {
            float vb = src[i + half];
            if (norm) vb = w[i + half] * (vb * inv);
            const float c = cp[2 * i], s = cp[2 * i + 1];
            ra = va * c - vb * s;
            rb = vb * c + va * s;
        }
        if (is_q) {
            qo[lo] = ra;
            if (i < half) qo[i + half] = rb;
        } else {
            cb_kv_store(kc, at + (cb_u64)lo, ra, kv_f16);
            if (i < half) cb_kv_store(kc, at + (cb_u64)(i + half), rb, kv_f16);
        }
    }
    if (!is_q) {
        const float *vs = row + kvd + (cb_u64)head * (cb_u64)Dh;
        for (int i = threadIdx.x; i < Dh; i += blockDim.x)
            cb_kv_store(vc, at + (cb_u64)i, vs[i], kv_f16);
    }
}

/* Qwen's attention output gate: att[t, i] *= sigmoid(gate[t, i]) for i < HD, before WO
 * (layers/attention.c). grid (n), block 256. */
extern "C" __global__ void cb_sigmoid_gate(float *att, const float *gate, int HD) {
    float *r = att + (cb_u64)blockIdx.x * HD;
    const float *g = gate + (cb_u64)blockIdx.x * HD;
    for (int i = threadIdx.x; i < HD; i += blockDim.x) r[i] *= 1.0f / (1.0f + expf(-g[i]));
}

/* count floats at p set to 0 (the recurrent state at open and after colibri_reset; the backend
 * keeps count below 2^31). grid any, block 256: a grid-stride loop. */
extern "C" __global__ void cb_zero(float *p, int count) {
    const int step = (int)(gridDim.x * blockDim.x);
    for (int i = (int)(blockIdx.x * blockDim.x + threadIdx.x); i < count; i += step) p[i] = 0.0f;
}

/* end of the hybrid-family kernels */
