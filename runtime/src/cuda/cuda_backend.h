/* Boundary between the runtime core and the CUDA backend (runtime/src/cuda/cuda_backend.c).
 *
 * The core never includes CUDA headers: the backend loads libcuda.so.1 with dlopen at run time and
 * launches kernels from the cubins/PTX embedded in the binary (see kernel_images.h). When the GPU
 * cannot be used, colibri_cuda_open fails with a one-line reason and the core runs on the CPU
 * (backend "auto") or reports the error (backend "cuda"). */
#ifndef COLIBRI_CUDA_BACKEND_H
#define COLIBRI_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "kernel_images.h"

struct colibri_model; /* runtime/src/core/model.h: the validated, mmapped model */

typedef struct colibri_cuda colibri_cuda;
typedef struct colibri_cuda_device colibri_cuda_device;

typedef struct {
    char device_name[128];
    int sm;               /* compute capability as major*10+minor, e.g. 87 */
    int driver_version;   /* cuDriverGetVersion(), e.g. 12060 */
    char image[8];        /* "cubin" or "ptx": what was loaded */
    int integrated;       /* 1 when the GPU shares DRAM with the CPU (Jetson) */
    size_t device_bytes;  /* the context's arena (activations, KV cache, tables) plus the
                             model's weights copy when "copied" (shared by its contexts) */
    char weights[8];      /* "copied": uploaded once to the device, in chunks (the default);
                             "mapped": the mmapped file is device-mapped (integrated GPU with
                             COLIBRI_CUDA_WEIGHTS=map, no second copy) */
    char prefill[8];      /* "mma": the image has the tensor-core kernels (sm_80+: expert
                             projections and cb_linear but K/V), used for device passes of more
                             than 4 tokens; "simt": it has not */
    int kv_f16;           /* 1: the KV cache holds IEEE half bits (--kv-cache f16), else f32 */
    size_t kv_cache_bytes;/* K and V caches for max_seq_len positions, inside device_bytes */
    char libcuda[256];    /* the driver library loaded (its path as the dynamic loader found
                             it): the profile's cuda-compat libcuda.so.1, or the system's */
    char weights_why[96]; /* why the weights were copied when COLIBRI_CUDA_WEIGHTS=map asked
                             for a mapping (a device attribute, or cuMemHostRegister's error);
                             "" when mapped or not asked */
    int chunk;            /* tokens per device pass (prefill) */
} colibri_cuda_info;

/* The model's GPU, shared by all its contexts: the driver, one CUDA context, the kernels and the
 * weights on the device (one chunked copy, or the mapped file with COLIBRI_CUDA_WEIGHTS=map on an
 * integrated GPU). 0 on success; otherwise non-zero with `why` set to one line. Close it after
 * every context opened on it is closed. Contexts on it may run on different threads at once
 * (each has its own streams, arena and graph). */
int colibri_cuda_device_open(colibri_cuda_device **out, const struct colibri_model *model,
                             char *why, size_t why_len);
void colibri_cuda_device_close(colibri_cuda_device *dv);
const colibri_cuda_info *colibri_cuda_device_info(const colibri_cuda_device *dv);

/* A context on the model's device: its streams, events, arena (activations, KV cache, expert
 * tables, RoPE table), pinned logits buffer and decode graph. 0 on success, else `why`.
 * kv_f16: store K and V as IEEE half (rounded to nearest even, as the CPU's f16 cache; the
 * context's colibri_options.kv_dtype == COLIBRI_KV_F16), else f32. */
int colibri_cuda_open_on(colibri_cuda **out, colibri_cuda_device *dv, int stream_count,
                         int kv_f16, char *why, size_t why_len);

/* Both at once, for a single context: the context owns its private device and closes it. */
int colibri_cuda_open(colibri_cuda **out, const struct colibri_model *model, int stream_count,
                      int kv_f16, char *why, size_t why_len);

/* n tokens from KV position pos; logits (n x vocab floats) to host memory. 0 on success. */
int colibri_cuda_forward(colibri_cuda *cu, const int32_t *ids, int n, int pos, float *logits,
                         char *why, size_t why_len);
/* The same, but only the last token's logits (vocab floats) are computed and come down: the
 * output norm and the LM head run for that one row (with the kernel a pass of its size picks, so
 * its bits are colibri_cuda_forward's last row), the passes before it end at the last layer with
 * no download and no synchronisation (colibri_forward_last, a prompt). */
int colibri_cuda_forward_last(colibri_cuda *cu, const int32_t *ids, int n, int pos,
                              float *logits, char *why, size_t why_len);

void colibri_cuda_reset(colibri_cuda *cu);
void colibri_cuda_get_info(const colibri_cuda *cu, colibri_cuda_info *info);
void colibri_cuda_close(colibri_cuda *cu);

/* Device memory bandwidth as a device-to-device copy sees it (`colibri gpuprobe`): one warm-up
 * copy of `bytes`, then `iters` timed copies between two device buffers, synchronised once.
 * gbps counts the bytes read plus the bytes written (2 x bytes per copy), the figure a
 * memory-bound kernel that reads its weights once is measured against. Same driver loading
 * (dlopen, COLIBRI_LIBCUDA) as the backend. 0 on success, else -1 with `why` set. */
typedef struct {
    char device_name[128];
    int sm, driver_version, integrated;
    char libcuda[256]; /* the driver library loaded (colibri_cuda_info.libcuda) */
    size_t bytes;
    int iters;
    double seconds; /* the timed copies together */
    double gbps;    /* 2 * bytes * iters / seconds / 1e9 */
} colibri_cuda_bandwidth;

int colibri_cuda_copy_bandwidth(size_t bytes, int iters, colibri_cuda_bandwidth *out, char *why,
                                size_t why_len);

/* ---- pure helpers (no GPU needed; unit-tested by tests/gpu/host_unit.c) ---- */

/* Which embedded image serves a GPU of compute capability `sm` (e.g. 87): the cubin built for
 * exactly that SM, else the PTX with the highest SM <= sm (JIT-compiled by the driver), else -1
 * with `why` naming the GPU's SM and what is embedded. */
int colibri_cuda_pick_image(const colibri_kernel_image *images, int count, int sm, char *why,
                            size_t why_len);

unsigned colibri_cuda_ceil_div(unsigned a, unsigned b);
/* The RoPE table cb_qk_rope_kv reads: for positions p < `positions` and pairs i < Dh/2, cs[(p*Dh/2 +
 * i)*2] = cos and [.. + 1] = sin of the f32 angle p * f32(theta^(-2i/Dh)), in double rounded to
 * f32 (the CPU reference's values). */
void colibri_cuda_rope_table(float theta, int Dh, int positions, float *cs);
/* Launch shape of the row kernels (cb_linear): one warp per output row, 4 tokens per warp. */
void colibri_cuda_rows_launch(int rows, int n, unsigned grid[3], unsigned block[3]);

/* Do the expert projections of a device pass of n tokens with weights of `dtype` run on the
 * tensor-core kernels? Only when the loaded image has them (have_mma: sm_80+), n is more than one
 * 4-token GEMV tile (with <= 4 tokens the GEMV already reads each weight row once per expert, so
 * the GEMM saves no traffic; decode, n = 1, and its CUDA graph keep the GEMV) and the dtype is
 * not q4 (no tensor-core q4 kernel). A function of n, not of the routing, so the same chunk
 * schedule always takes the same path. */
int colibri_cuda_use_mma(int have_mma, int n, int dtype);

/* The device arena: byte offsets of every buffer (256-byte aligned) and the total. prm is the
 * decode graph's parameter block (CB_PRM_*: the step's token id and position, written before
 * each graph launch, and the constant shared-expert offsets {0, 1}). */
typedef struct {
    int chunk;                 /* tokens per device pass: up to 256, bounded by a 32 MiB
                                  activation budget (never below 32 for it) and the partials' */
    int logit_rows;            /* rows of the logits buffer: min(chunk, 32) */
    int kv_f16;                /* K/V cache values are IEEE half (2 bytes), else f32 */
    size_t qkv;                /* Q/K/V projections' staging rows [chunk, H*Dh + 2*Hkv*Dh] */
    size_t kv_bytes;           /* K and V caches together */
    size_t x, h, q, att, part, router, top_idx, top_w, offsets, active, perm, slot_of, act,
        expert_out;
    size_t shared_act, shared_out, shared_gate, shared_offsets, logits, ids, iota, prm,
        rope;
    size_t kcache, vcache, tables;
    /* hybrid layers (#24): the mixers' per-token scratch [chunk, mix_floats] (a DeltaNet layer's
     * projections, convolution output and gated output; gated attention's gate values), and the
     * recurrent layers' state (one region, layer after layer, zeroed at open and by reset) */
    size_t mix, state, state_bytes;
    int kv_layers;             /* layers with a KV cache (the attention kinds) */
    size_t oss_bias;           /* gpt-oss: per layer the b1[E] b3[E] b2[E] pointers (0 bytes without) */
    size_t total;
} colibri_cuda_plan_t;

/* Which driver library to open: `env` (COLIBRI_LIBCUDA) when set, else the profile's cuda-compat
 * driver `compat` (COLIBRI_CUDA_COMPAT_LIBCUDA) when that file exists (compat_present), else the
 * system's "libcuda.so.1". Returns the name for dlopen; *is_compat says whether its companion
 * libraries (cb_compat_companions) must be preloaded from its directory. */
const char *colibri_cuda_libcuda_choice(const char *env, const char *compat, int compat_present,
                                        int *is_compat);

/* Qwen's partial-RoPE table [positions, R/2, (cos, sin)] f32 (angle p * theta^(-2i/R) in double,
 * as layers/attention.c rope_partial); in plan.rope in place of the full-width table. */
void colibri_cuda_rope_table_partial(float theta, int R, int positions, float *cs);

/* Lay out a context's arena for model m (the weights are the device's, not in it; an f16 KV
 * cache when kv_f16). -1: geometry the kernels cannot run (E > 256, top_k > 16, H not a
 * multiple of Hkv, zero sizes). */
int colibri_cuda_plan(const struct colibri_model *m, int kv_f16, colibri_cuda_plan_t *p);

#endif
