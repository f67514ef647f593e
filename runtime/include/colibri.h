/* Colibri: a small C runtime for Mixture-of-Experts decoder models stored as `.colibri` files
 * (docs/format.md). Public API.
 *
 * Life cycle: colibri_init (mmap + validate the model, allocate the one arena, start the thread
 * pool, bring up the backend) -> colibri_forward as many times as wanted (each call continues
 * from the KV-cache position left by the previous one) -> colibri_reset to start a new sequence
 * -> colibri_free. Every call returns a colibri_status; colibri_strerror names it and
 * colibri_last_error(ctx) gives the detailed one-line reason of the last failure.
 *
 * One context per thread: a context is not safe to share between threads without a lock
 * (the runtime's own worker threads live inside the context). */
#ifndef COLIBRI_H
#define COLIBRI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define COLIBRI_VERSION_STRING "0.1.0"

typedef enum {
    COLIBRI_OK = 0,
    COLIBRI_E_INVALID_ARG = 1,     /* NULL pointer, n <= 0, bad option value */
    COLIBRI_E_IO = 2,              /* open/stat/mmap failed */
    COLIBRI_E_BAD_MAGIC = 3,       /* not a .colibri file */
    COLIBRI_E_BAD_VERSION = 4,     /* a format version this runtime does not read */
    COLIBRI_E_TRUNCATED = 5,       /* file shorter than its header says */
    COLIBRI_E_OUT_OF_RANGE = 6,    /* a tensor offset/size points past the end of the file */
    COLIBRI_E_ABSURD_DIM = 7,      /* a dimension beyond the format's limits or inconsistent */
    COLIBRI_E_BAD_TENSOR = 8,      /* tensor table: missing, duplicate or mis-shaped tensor */
    COLIBRI_E_PAD_MISMATCH = 9,    /* model pad_multiple != COLIBRI_EMBED_DIM_PAD of this build */
    COLIBRI_E_UNSUPPORTED = 10,    /* valid file, but beyond what this build supports */
    COLIBRI_E_NO_MEMORY = 11,      /* arena or thread pool could not be allocated */
    COLIBRI_E_TOKEN_RANGE = 12,    /* a token id < 0 or >= vocab_size */
    COLIBRI_E_SEQ_TOO_LONG = 13,   /* position + n would exceed max_seq_len */
    COLIBRI_E_BACKEND = 14,        /* the requested backend is unavailable or failed */
    COLIBRI_E_NOT_BUILT = 15       /* feature not compiled in (e.g. routing dump without DEBUG) */
} colibri_status;

typedef enum {
    COLIBRI_BACKEND_AUTO = 0, /* CUDA when it comes up, otherwise CPU (the reason is reported) */
    COLIBRI_BACKEND_CPU = 1,
    COLIBRI_BACKEND_CUDA = 2  /* CUDA or fail with COLIBRI_E_BACKEND */
} colibri_backend;

typedef struct colibri_ctx colibri_ctx;

typedef struct {
    int threads;             /* CPU worker threads including the caller; 0 = online CPUs (max 64) */
    colibri_backend backend;
    int int8_activations;    /* int8 weights: 1 = quantise activations per token to int8 and use
                                integer dot products (faster, see docs/runtime.md for accuracy);
                                0 = f32 activations (default) */
    char *error;             /* optional: receives the one-line reason when init fails */
    size_t error_len;
} colibri_options;

/* Geometry and identity of the loaded model. */
typedef struct {
    uint32_t vocab_size, embed_dim, embed_dim_pad, pad_multiple;
    uint32_t n_layers, n_heads, n_kv_heads, head_dim;
    uint32_t num_experts, top_k, expert_size, shared_expert_size;
    uint32_t max_seq_len, routing, dtype, flags, family;
    uint32_t bos_token_id, eos_token_id;
    float norm_eps, rope_theta;
    char name[65];
    uint64_t file_size;
} colibri_model_info;

/* What actually runs. */
typedef struct {
    char backend[8];          /* "cpu" or "cuda" */
    int threads;
    char cpu_simd[16];        /* "avx512-vnni", "avx512", "avx2", "neon-dotprod", "neon" or "scalar" */
    char fallback_reason[192];/* why CUDA was not used (backend auto), else "" */
    char cuda_device[128];    /* when backend is cuda */
    int cuda_sm, cuda_driver_version;
    size_t arena_bytes;       /* working memory allocated once at init (device arena on cuda) */
    int position;             /* tokens currently in the KV cache */
    /* when backend is cuda (else empty / 0): */
    char cuda_image[8];       /* "cubin" (built for this SM) or "ptx" (JIT-compiled by the driver) */
    char cuda_weights[8];     /* "mapped" (the mmapped file, device-mapped: integrated GPU) or
                                 "copied" (one copy in the device arena) */
    int cuda_integrated;      /* 1 when the GPU shares DRAM with the CPU (Jetson) */
    size_t cuda_device_bytes; /* bytes of device memory allocated at init */
} colibri_runtime_info;

void colibri_default_options(colibri_options *opt);

/* Load `path` with default options. On failure *ctx is NULL; the reason cannot be retrieved
 * (use colibri_init_ex with an error buffer for that). */
colibri_status colibri_init(colibri_ctx **ctx, const char *path);
colibri_status colibri_init_ex(colibri_ctx **ctx, const char *path, const colibri_options *opt);

/* Run n tokens starting at the current KV position; write n x vocab_size logits (row-major,
 * host memory). Allocates nothing. On failure the KV position is unchanged. */
colibri_status colibri_forward(colibri_ctx *ctx, const int32_t *ids, int n, float *logits);

/* Forget the sequence: the next forward starts at position 0. */
colibri_status colibri_reset(colibri_ctx *ctx);
void colibri_free(colibri_ctx *ctx);

const char *colibri_strerror(colibri_status s);
/* The detailed reason of the last failed call on ctx ("" when none). */
const char *colibri_last_error(const colibri_ctx *ctx);

void colibri_get_model_info(const colibri_ctx *ctx, colibri_model_info *info);
void colibri_get_runtime_info(const colibri_ctx *ctx, colibri_runtime_info *info);

/* Write every routing decision made since init/reset (per forward call, token position, layer:
 * the top_k experts and their weights, and the router logits) as JSON lines to `path`.
 * Compiled in only with -DCOLIBRI_DEBUG; otherwise returns COLIBRI_E_NOT_BUILT. */
colibri_status colibri_dump_routing(colibri_ctx *ctx, const char *path);

/* Built-in checks that need no model file: bitonic top-k against brute force (with ties), both
 * routing algorithms, every dot-product kernel against a double-precision reference, and a small
 * synthetic model written to $TMPDIR and run with 1 and 3 threads (bitwise equal) and as prefill
 * versus token-by-token decode (bitwise equal). Returns the number of failed checks; with
 * verbose, prints one line per check to stdout. */
int colibri_selftest(int verbose);

#ifdef __cplusplus
}
#endif
#endif
