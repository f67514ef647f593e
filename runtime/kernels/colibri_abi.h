/* Numbers the host C (runtime/src, runtime/tools) and the CUDA kernels (colibri_kernels.cu) must
 * agree on, defined here once. Plain #defines only and no includes: NVRTC compiles the kernels
 * without any standard header and finds this file through the kernel source's own directory
 * (-I runtime/kernels); the C sources include it as "../kernels/colibri_abi.h", and
 * tests/gpu/emu compiles the .cu with the same -I. */
#ifndef COLIBRI_ABI_H
#define COLIBRI_ABI_H

/* Weight dtype codes: the header's `dtype` and each tensor record's (docs/format.md). Python's
 * single source is colibri_kit.model.format.DType (tests/test_cuda_host.py compares them). */
#define COLIBRI_DT_F32 0
#define COLIBRI_DT_F16 1
#define COLIBRI_DT_BF16 2
#define COLIBRI_DT_INT8 3
/* Grouped 4-bit (docs/format.md, "q4"): rows of ceil(cols / 32) groups, each 16 bytes of nibbles
 * (byte j = (q[j] + 8) | (q[j + 16] + 8) << 4) and one f16 scale d; w = q * d. */
#define COLIBRI_DT_Q4 4
/* OCP MXFP4 (docs/format.md, "mxfp4"; gpt-oss's released experts): rows of ceil(cols / 32) blocks,
 * each 16 bytes of E2M1 codes (byte j = code[2j] | code[2j + 1] << 4) and one E8M0 scale byte s;
 * w = E2M1[code] * 2^(s - 127). Format version 3. */
#define COLIBRI_DT_MXFP4 5
#define COLIBRI_DT_COUNT 6
#define COLIBRI_DT_NAMES {"f32", "f16", "bf16", "int8", "q4", "mxfp4"}
#define COLIBRI_Q4_GROUP 32
#define COLIBRI_Q4_BLOCK 16
#define COLIBRI_MX_BLOCK 32
#define COLIBRI_MX_BLOCK_BYTES 16

/* Launch geometry (docs/cuda.md, "Kernels"). */
#define COLIBRI_CU_WARP 32
/* Row kernels (cb_linear, cb_expert_up/down): one warp per output row, this many warps a block,
 * each warp carrying COLIBRI_CU_TOKEN_TILE tokens (the weight row is read once per tile). */
#define COLIBRI_CU_ROW_WARPS 4
#define COLIBRI_CU_ROW_THREADS (COLIBRI_CU_ROW_WARPS * COLIBRI_CU_WARP)
#define COLIBRI_CU_TOKEN_TILE 4
/* Tensor-core expert kernels (cb_expert_up_mma / cb_expert_down_mma, sm_80+): 4 warps a block,
 * each warp 16 weight rows (one mma.m16n8k8 row tile), so 64 rows per block. */
#define COLIBRI_CU_MMA_WARPS 4
#define COLIBRI_CU_MMA_THREADS (COLIBRI_CU_MMA_WARPS * COLIBRI_CU_WARP)
#define COLIBRI_CU_MMA_ROWS (COLIBRI_CU_MMA_WARPS * 16)
/* ... and each warp up to this many tokens at once (4 mma tiles of 8; cb_linear_mma: per block
 * row, the grid's y) */
#define COLIBRI_CU_MMA_TOKENS 32
/* cb_router_topk: one warp per token, sorting at most this many experts (format caps E at 256). */
#define COLIBRI_CU_ROUTER_THREADS COLIBRI_CU_WARP
#define COLIBRI_CU_MAX_SORT 256
/* cb_ffn_route: the FFN RMSNorm, the router GEMV and the top-k of one token in one block of this
 * many threads (one warp per router row; the norm's sum still runs over COLIBRI_CU_WIDE_THREADS
 * of them, the width cb_rmsnorm is launched with, so h has cb_rmsnorm's bits). The normed row is
 * kept in shared memory, which bounds Dp: 8192 floats = 32 KiB of the 48 KiB a block may declare
 * statically (with the logits and the sort arrays, ~35 KiB); a wider model keeps the 3 launches.
 * The backend fuses only when E <= COLIBRI_CU_ROUTE_WARPS (docs/cuda.md, "Fused routing"). */
#define COLIBRI_CU_ROUTE_THREADS 512
#define COLIBRI_CU_ROUTE_WARPS (COLIBRI_CU_ROUTE_THREADS / COLIBRI_CU_WARP)
#define COLIBRI_CU_ROUTE_MAX_DP 8192
/* Kernels that loop over blockDim (any multiple of 32): per-element work over Dp (embed,
 * rmsnorm, combine, dispatch) and per-head work (rope, attention). */
#define COLIBRI_CU_WIDE_THREADS 256
#define COLIBRI_CU_HEAD_THREADS 128
/* cb_attention: the KV positions of one (token, head) are split into ranges of this many, one
 * block each (scores in shared memory); cb_attention_merge combines the ranges' partial
 * (max, sum, acc) in range order. A token's split depends only on its own position, so its bits
 * do not depend on how the tokens were chunked. */
#define COLIBRI_CU_KV_SPLIT 256
/* cb_attention_prefill (chunks of n > 1 tokens, flash-style): a block takes this many query rows
 * (tokens) of one head and walks the KV positions in tiles of COLIBRI_CU_FA_KEYS from position 0,
 * in order, through shared memory with an online softmax. 4 warps of COLIBRI_CU_FA_ROWS / 4 rows.
 * Heads up to COLIBRI_CU_FA_MAX_DH (the shared tiles' width); a wider head keeps the split-KV
 * kernel in prefill too. */
#define COLIBRI_CU_FA_ROWS 16
#define COLIBRI_CU_FA_KEYS 32
#define COLIBRI_CU_FA_MAX_DH 128
#define COLIBRI_CU_FA_THREADS 128

/* Hybrid-family kernels (#24): cb_dn_recur keeps the token's normalised q and k of one key head
 * in shared memory, which bounds a DeltaNet layer's key head dim (Qwen3.5 / Qwen3-Next: 128). */
#define COLIBRI_CU_DN_MAX_DK 256

#endif
