/* Colibri: a small C runtime for Mixture-of-Experts decoder models stored as `.colibri` files
 * (docs/format.md). Public API.
 *
 * Life cycle: colibri_init (mmap + validate the model, allocate the one arena, start the thread
 * pool, bring up the backend) -> colibri_forward as many times as wanted (each call continues
 * from the KV-cache position left by the previous one) -> colibri_reset to start a new sequence
 * -> colibri_free. Every call returns a colibri_status; colibri_strerror names it and
 * colibri_last_error(ctx) gives the detailed one-line reason of the last failure.
 *
 * Thread contract (serving several requests at once):
 *   - colibri_model (colibri_model_load) is the mmapped, validated file. It is read-only after
 *     load and may be shared by any number of contexts on any threads. It is reference counted:
 *     every context holds a reference, so colibri_model_free may be called as soon as the last
 *     colibri_ctx_new is done; the mapping goes away with the last context.
 *   - colibri_ctx (colibri_ctx_new) is one sequence: its KV cache, arena, worker threads and
 *     (CUDA) device state. One context per thread: a context is not safe to use from two threads
 *     at once without a lock. Different contexts never touch each other's state.
 *   - colibri_model_load and colibri_ctx_new/colibri_free may run on any thread, concurrently
 *     with forward calls on other contexts. Creating a context allocates its arena (the KV cache
 *     is not touched until used) and starts its workers: milliseconds (docs/runtime.md).
 *   - colibri_init/colibri_init_ex are the one-context form: a private model freed with it.
 *   - colibri_engine (colibri_engine_new) runs one pass over the tokens of several contexts
 *     (continuous batching, "Several sequences in one pass" below): during the call the calling
 *     thread owns the engine and every context in the batch. One engine per thread.
 * Functions taking a const colibri_model * only read it and are thread safe. */
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
    COLIBRI_E_NOT_BUILT = 15,      /* feature not compiled in (e.g. routing dump without DEBUG) */
    COLIBRI_E_NO_TOKENIZER = 16,   /* text call on a model without a tokenizer (re-convert it) */
    COLIBRI_E_BAD_TOKENIZER = 17,  /* the model's tokenizer section is invalid */
    COLIBRI_E_BUFFER_TOO_SMALL = 18, /* output buffer too small; the size needed is returned */
    COLIBRI_E_BAD_LAYER = 19,      /* layer table: a record that breaks its kind's rules */
    COLIBRI_E_REALTIME = 20        /* a real-time option cannot be applied here: a CPU not
                                      allowed, a policy or memory lock beyond the process's
                                      limits (the reason names the limit to raise) */
} colibri_status;

typedef enum {
    COLIBRI_BACKEND_AUTO = 0, /* CUDA when it comes up, otherwise CPU (the reason is reported) */
    COLIBRI_BACKEND_CPU = 1,
    COLIBRI_BACKEND_CUDA = 2  /* CUDA or fail with COLIBRI_E_BACKEND */
} colibri_backend;

/* How the context stores its K and V caches (docs/runtime.md, "Memory"). */
typedef enum {
    COLIBRI_KV_F32 = 0, /* float (default) */
    COLIBRI_KV_F16 = 1  /* IEEE half, rounded to nearest even when written, widened when read:
                           half the KV memory; CPU and CUDA backends (the same rounding, so the
                           same cached bits for the same K/V values) */
} colibri_kv_dtype;

/* Real-time mode (docs/runtime.md, "Real-time mode"): the workers' scheduling policy ... */
typedef enum {
    COLIBRI_SCHED_OTHER = 0, /* the default time-sharing policy */
    COLIBRI_SCHED_FIFO = 1,  /* SCHED_FIFO at sched_priority: preempts every SCHED_OTHER thread */
    COLIBRI_SCHED_RR = 2     /* SCHED_RR at sched_priority (FIFO with time slices among equals) */
} colibri_sched;

/* ... and how they wait for each other between the jobs of a forward pass. */
typedef enum {
    COLIBRI_BARRIER_SLEEP = 0, /* spin briefly (~4000 pauses), then sleep in the kernel */
    COLIBRI_BARRIER_SPIN = 1   /* spin while passes keep coming (a core each, no wake-up
                                  latency); sleep only after 5 ms without one; a wait past
                                  100 us also yields (the peer was preempted) */
} colibri_barrier;

typedef struct colibri_ctx colibri_ctx;
typedef struct colibri_model colibri_model;

typedef struct {
    int threads;             /* CPU worker threads including the caller; 0 = online CPUs (max 64) */
    colibri_backend backend;
    int int8_activations;    /* int8 or q4 weights: 1 = quantise activations per token to int8 and use
                                integer dot products (faster, see docs/runtime.md for accuracy);
                                0 = f32 activations (default) */
    char *error;             /* optional: receives the one-line reason when init fails */
    size_t error_len;
    colibri_kv_dtype kv_dtype; /* KV cache storage; COLIBRI_KV_F32 (0) by default. Last, so that
                                  code built before it keeps its field offsets */
    /* Real-time mode; all zero = off (docs/runtime.md, "Real-time mode"). None of it changes a
     * result: the work split is fixed by the worker index, not by where a worker runs. */
    const int *cpus;         /* n_cpus CPUs: worker t runs on cpus[t] only, in order; worker 0 is
                                the thread that calls colibri_forward (pinned at its first call).
                                threads 0 = n_cpus; another threads value must equal it */
    int n_cpus;
    colibri_sched sched;     /* the workers' policy (worker 0 too, from its first forward) */
    int sched_priority;      /* 1..99 with FIFO / RR; 0 with OTHER */
    int lock_memory;         /* 1: mlock the model's mapping and the arena at init (pre-faulting
                                every page), and the top of each worker's stack, so a pass never
                                waits for a page; fails at init when RLIMIT_MEMLOCK is too low */
    colibri_barrier barrier;
    int sequence_only;       /* 1: a context that only holds its sequence (KV rows, recurrent state,
                                position) for a colibri_engine to run (colibri_forward_batch,
                                colibri_gen_step): no chunk buffers or worker scratch of its own,
                                so a served slot costs its caches only. colibri_forward(_last) and
                                colibri_generate on it fail with COLIBRI_E_INVALID_ARG. CPU only
                                (backend cuda refused; auto runs on the CPU); threads must be 0 or
                                1; colibri_engine_new refuses it. */
    int q4_file_layout;      /* 1: q4, mxfp4 and int8 weights are read in the file's layout
                                only. 0 (default): on a CPU whose int8-activation kernels read
                                the packed layouts (x86 AVX-512 VNNI), the first such context
                                packs the model's q4, mxfp4 and int8 matrices once (load time,
                                the same bytes; the file pages are let go), same bits
                                (docs/runtime.md, "Packed q4, mxfp4 and int8"). Last, so that code built before it keeps its field
                                offsets */
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
    char cuda_weights[8];     /* "copied" (one copy in the device arena, the default) or
                                 "mapped" (the mmapped file, device-mapped: integrated GPU with
                                 COLIBRI_CUDA_WEIGHTS=map) */
    int cuda_integrated;      /* 1 when the GPU shares DRAM with the CPU (Jetson) */
    size_t cuda_device_bytes; /* bytes of device memory allocated at init */
    char cuda_prefill[8];     /* "mma": prefill passes of > 4 tokens run the expert projections on
                                 the tensor cores (sm_80+ image); "simt": the GEMV kernels */
    char kv_dtype[4];         /* "f32" or "f16": how the KV cache is stored */
    size_t kv_cache_bytes;    /* K and V caches for max_seq_len positions, inside arena_bytes */
    char cuda_libcuda[256];   /* the driver library loaded (the profile's cuda-compat driver or
                                 the system's libcuda.so.1), as the dynamic loader found it */
    char cuda_weights_why[96];/* COLIBRI_CUDA_WEIGHTS=map given but the weights copied: why */
    int cuda_chunk;           /* tokens per device pass (prefill) */
    size_t state_bytes;       /* recurrent layers' fixed-size state (gated_deltanet: convolution
                                 inputs and delta-rule states), inside arena_bytes; 0 without */
    /* real-time mode (colibri_options): what runs */
    char cpus[96];            /* the workers' CPUs in order ("2,3,4,5"), "" when not pinned */
    char sched[8];            /* "other", "fifo" or "rr" */
    int sched_priority;
    char barrier[8];          /* "sleep" or "spin" */
    int memory_locked;        /* 1: model mapping (CPU backend: and arena) locked in memory */
    size_t locked_bytes;      /* bytes locked by this context (the model's counted once per model) */
    /* page faults taken by this context's workers: the helper threads since init, the calling
     * thread inside colibri_forward (getrusage RUSAGE_THREAD around each call) */
    unsigned long long minor_faults, major_faults;
} colibri_runtime_info;

void colibri_default_options(colibri_options *opt);

/* Load `path` with default options. On failure *ctx is NULL; the reason cannot be retrieved
 * (use colibri_init_ex with an error buffer for that). */
colibri_status colibri_init(colibri_ctx **ctx, const char *path);
colibri_status colibri_init_ex(colibri_ctx **ctx, const char *path, const colibri_options *opt);

/* Shared model: mmap + validate `path` once. Only opt->error/error_len are used (the reason of
 * a failure); opt may be NULL. On failure *m is NULL. */
colibri_status colibri_model_load(colibri_model **m, const char *path, const colibri_options *opt);
/* A new context (sequence) on a loaded model with its own threads/backend options; takes a
 * reference on m. On failure *ctx is NULL and opt->error holds the reason. */
colibri_status colibri_ctx_new(colibri_ctx **ctx, colibri_model *m, const colibri_options *opt);
/* Drop the caller's reference (the model lives on while contexts use it). NULL is a no-op. */
void colibri_model_free(colibri_model *m);
/* The model a context runs (no reference taken). */
colibri_model *colibri_ctx_model(const colibri_ctx *ctx);
void colibri_model_get_info(const colibri_model *m, colibri_model_info *info);

/* One layer of the model, as its record in the file's layer table says (docs/format.md; every
 * layer of a version 1 or 2 file is attention + moe). */
typedef struct {
    char mixer[24];        /* "attention" (full causal), "sliding_attention" */
    char ffn[16];          /* "moe" */
    uint32_t window;       /* sliding_attention: W (a token at p attends to max(0, p-W+1)..p) */
    uint32_t kv_positions; /* K and V rows the layer keeps per context: max_seq_len for full
                              attention, min(W, max_seq_len) for a sliding window (a ring) */
} colibri_layer_info;

/* Layer `layer` (< n_layers): COLIBRI_OK, or COLIBRI_E_INVALID_ARG. Reads only the model. */
colibri_status colibri_model_layer_info(const colibri_model *m, uint32_t layer,
                                        colibri_layer_info *info);

/* Run n tokens starting at the current KV position; write n x vocab_size logits (row-major,
 * host memory). Allocates nothing. On failure the KV position is unchanged. */
colibri_status colibri_forward(colibri_ctx *ctx, const int32_t *ids, int n, float *logits);
/* The same pass, but only the last token's logits (vocab_size floats) are computed and written:
 * what a prompt needs before sampling. The LM head and final norm run for one token instead of
 * n (on the benchmark's Mixtral ~17% of a 64-token prefill). The values have the bits of the last
 * row of colibri_forward's on the CPU backend (prefill == decode); on CUDA the prompt runs in
 * chunks of at most 64 tokens. Allocates nothing; on failure the KV position is unchanged. */
colibri_status colibri_forward_last(colibri_ctx *ctx, const int32_t *ids, int n, float *logits);

/* ---- Several sequences in one pass: continuous batching (docs/runtime.md, "Batching") -----
 * A colibri_engine holds what a pass runs on (worker threads and chunk buffers, no cache of its
 * own); the sequences are ordinary contexts on the same model (colibri_ctx_new with the same
 * options: kv_dtype, int8_activations and backend must agree; their threads are not used, so 1
 * is enough). colibri_forward_batch runs the tokens of every item in passes of up to 512 tokens,
 * so each weight (every routed expert's included) is read once per pass for all the tokens that
 * need it, and each item continues its own context from its own position.
 *
 * Batch invariance: on the CPU every logit and cache value of an item has the bits it would have
 * from colibri_forward / colibri_forward_last on its context alone, whatever the other items,
 * their order and lengths, and the thread count (docs/runtime.md "Batching" says why).
 * On a CUDA engine (a GPU was found for its options) the items run one after the other, each as
 * its own colibri_forward(_last) on its own CUDA context: the documented fallback, which keeps
 * the same bits as alone and reads the weights once per item.
 *
 * Thread contract: during colibri_forward_batch (and colibri_gen_step) the calling thread uses
 * the engine and every context named in the batch; none of them may be used by another thread at
 * the same time. Contexts not in the batch are free for other threads. One engine per thread. */
typedef struct colibri_engine colibri_engine;

typedef struct {
    colibri_ctx *seq;       /* the sequence (each context at most once per batch) */
    const int32_t *ids;     /* n >= 1 tokens continuing it from its position */
    int n;
    float *logits;          /* NULL: none (CPU engine only); else n x vocab floats (all_logits)
                               or vocab floats: the last token's */
    int all_logits;
} colibri_batch_item;

/* opt: threads are the engine's (the pass's workers); backend chosen as colibri_ctx_new does. */
colibri_status colibri_engine_new(colibri_engine **e, colibri_model *m, const colibri_options *opt);
void colibri_engine_free(colibri_engine *e);
/* Checks every item first (a refused batch changes nothing: COLIBRI_E_INVALID_ARG for a context
 * on another model, backend or kv_dtype, or twice; _TOKEN_RANGE; _SEQ_TOO_LONG). Allocates
 * nothing. */
colibri_status colibri_forward_batch(colibri_engine *e, const colibri_batch_item *items, int n_items);
const char *colibri_engine_last_error(const colibri_engine *e);
void colibri_engine_get_runtime_info(const colibri_engine *e, colibri_runtime_info *info);
/* Where a CPU engine's steps spent their time since it was made (milliseconds of the stepping
 * thread's wall clock; docs/serve.md "Where a step's time goes"): inside the passes, the token
 * mixers of every layer (attention, deltanet), the FFNs (routing + experts), the LM head, and
 * the whole pass (those + embeddings, RoPE tables, copies); after the passes, sampling and the
 * output side (text, stop strings, callbacks). All zero on a CUDA engine. */
typedef struct {
    double mixer_ms, ffn_ms, head_ms, pass_ms, sample_ms;
    unsigned long long passes, rows;
} colibri_step_times;
void colibri_engine_step_times(const colibri_engine *e, colibri_step_times *t);
/* NULL when the sequences of a batch share passes; else why each runs as its own pass, one
 * after the other (same bits, the weights read once per sequence): a CUDA engine, or a model
 * with a layer kind that has no multi-sequence pass yet (e.g. "layer 3's gated_deltanet kind
 * runs one sequence per pass"). Valid until the next call on e. */
const char *colibri_engine_unbatched(colibri_engine *e);

/* ---- A sequence's state: save and restore (prompt prefix reuse; docs/runtime.md, "Snapshots")
 * A snapshot is everything a context keeps about its sequence at its position: every layer's K
 * and V rows (all positions for full attention, the ring's last positions for a sliding window)
 * and any recurrent state, in host memory, for contexts on the same model file with the same
 * kv_dtype (any thread count, a new or a used context). Restoring it and continuing gives the
 * bits computing the prefix again would give (prefill == decode). The bytes are self-describing
 * (a 64-byte header: magic "CLBSTATE", version, position, the model's identity with a hash of its
 * file header; then the rows as the cache stores them, f32 or f16, and the f32 states) and hold
 * no pointers. CPU contexts only (COLIBRI_E_UNSUPPORTED on CUDA or an engine). Nothing is
 * allocated. */
/* Bytes a snapshot of ctx at its current position takes. */
size_t colibri_seq_state_bytes(const colibri_ctx *ctx);
/* Write it to buf (cap bytes); *len = the size (COLIBRI_E_BUFFER_TOO_SMALL when cap is less). */
colibri_status colibri_seq_save(const colibri_ctx *ctx, void *buf, size_t cap, size_t *len);
/* Make ctx's sequence the snapshot's first `keep` positions (keep = the snapshot's position, or
 * fewer when colibri_model_can_truncate says the model allows it); ctx continues from keep. A
 * snapshot of another model file, KV dtype or format version, or a damaged or truncated one, is
 * refused (COLIBRI_E_INVALID_ARG, the reason in colibri_last_error) and ctx keeps its sequence. */
colibri_status colibri_seq_restore(colibri_ctx *ctx, const void *buf, size_t len, int keep);
/* colibri_seq_restore, except that the layers whose cache keeps every position (full attention)
 * read the snapshot's rows of positions 0..keep-1 where they are instead of copying them (rings
 * and recurrent states are copied as restore does): the same bits, no copy, and contexts sharing
 * one snapshot read its rows once from memory in a pass that carries them together (a system
 * prompt served to many clients). buf must stay unchanged and allocated until ctx's next
 * colibri_seq_restore, colibri_seq_share or colibri_reset (colibri_gen_new with keep 0 resets),
 * or colibri_free; colibri_seq_save reads through to it. */
colibri_status colibri_seq_share(colibri_ctx *ctx, const void *buf, size_t len, int keep);
/* The position a snapshot is at (-1 when buf is not one). */
int colibri_seq_state_pos(const void *buf, size_t len);
/* 1 when every layer keeps every position and no recurrent state (full attention throughout),
 * so a snapshot can be restored to any shorter prefix; 0 when only to its own position. */
int colibri_model_can_truncate(const colibri_model *m);

/* Forget the sequence: the next forward starts at position 0 (recurrent states are zeroed). */
colibri_status colibri_reset(colibri_ctx *ctx);

void colibri_free(colibri_ctx *ctx);

const char *colibri_strerror(colibri_status s);
/* The detailed reason of the last failed call on ctx ("" when none). */
const char *colibri_last_error(const colibri_ctx *ctx);

void colibri_get_model_info(const colibri_ctx *ctx, colibri_model_info *info);
void colibri_get_runtime_info(const colibri_ctx *ctx, colibri_runtime_info *info);

/* Per-stage CPU times of the forward pass (`colibri bench --stages`, docs/runtime.md "Stage
 * times"). Off by default: then the pass reads no clock. On, every stage boundary reads
 * CLOCK_MONOTONIC and adds the time since the previous boundary to that stage, and the shared
 * expert runs as its own matrix jobs (two more pool hand-offs a layer) so its time can be told
 * apart; the logits keep their bits either way (the jobs only regroup rows). CUDA passes record
 * nothing. Switching it (on or off) zeroes the sums. */
typedef enum {
    COLIBRI_STAGE_EMBED,    /* embedding rows gathered, RoPE tables */
    COLIBRI_STAGE_NORMS,    /* the attention and MoE input RMSNorms, the final norm */
    COLIBRI_STAGE_MIXER,    /* attention (projections, scores, values, output) or DeltaNet */
    COLIBRI_STAGE_ROUTE,    /* router logits, top-k */
    COLIBRI_STAGE_DISPATCH, /* slots per expert */
    COLIBRI_STAGE_EXPERTS,  /* the routed experts' gate/up, SwiGLU, down */
    COLIBRI_STAGE_SHARED,   /* the shared expert */
    COLIBRI_STAGE_COMBINE,  /* the weighted sum back into the residual */
    COLIBRI_STAGE_HEAD,     /* the LM head */
    COLIBRI_STAGE_COUNT
} colibri_stage;
void colibri_set_stage_timing(colibri_ctx *ctx, int on);
/* ms[i]: milliseconds spent in stage i since the last colibri_set_stage_timing */
void colibri_get_stage_times(const colibri_ctx *ctx, double ms[COLIBRI_STAGE_COUNT]);
const char *colibri_stage_name(int stage); /* "embed", "norms", ...; NULL out of range */

/* Write every routing decision made since init/reset (per forward call, token position, layer:
 * the top_k experts and their weights, and the router logits) as JSON lines to `path`.
 * Compiled in only with -DCOLIBRI_DEBUG; otherwise returns COLIBRI_E_NOT_BUILT. */
colibri_status colibri_dump_routing(colibri_ctx *ctx, const char *path);

/* Built-in checks that need no model file: bitonic top-k against brute force (with ties), both
 * routing algorithms, every dot-product kernel against a double-precision reference, and a small
 * synthetic model written to $TMPDIR and run with 1 and 3 threads (bitwise equal) and as prefill
 * versus token-by-token decode (bitwise equal), with an f32 and an f16 KV cache, and the f16 KV
 * rounding in use against the scalar one and IEEE cases. Returns the number of failed checks; with
 * verbose, prints one line per check to stdout. */
int colibri_selftest(int verbose);

/* ---- Sampling (sampler.c) ------------------------------------------------------------------
 * Pipeline per token: repetition penalty on the distinct ids of the history window -> greedy
 * argmax when temperature == 0 -> candidates by logit (ties: lower id) cut to top_k -> weights
 * exp((l - l_max) / temperature) in double -> top-p prefix -> min-p (w >= min_p * w_max) -> one
 * uniform draw from a counter-based generator (splitmix64 of seed and draw number). The logits
 * are bitwise identical on any thread count, so a seed gives the same ids on any thread count. */
typedef struct {
    float temperature;    /* 0 = greedy (default); > 0 samples */
    int top_k;            /* keep the k most likely; 0 = off (default) */
    float top_p;          /* nucleus: (0, 1], 1 = off (default) */
    float min_p;          /* drop ids below min_p x the top probability; 0 = off (default) */
    float repeat_penalty; /* > 0; 1 = off (default); CTRL rule as in transformers */
    int repeat_last_n;    /* history window for the penalty; 0 = the whole context (default) */
    uint64_t seed;        /* same seed + same model + same prompt -> same ids */
} colibri_sampling;

typedef struct colibri_sampler colibri_sampler;

void colibri_default_sampling(colibri_sampling *p);
/* NULL when p is valid, else a message naming the bad field and its range. */
const char *colibri_sampling_check(const colibri_sampling *p);
/* Scratch for `vocab` candidates is allocated here; sampling allocates nothing. A sampler is
 * one request's state (its draw counter): one per thread, like a context. */
colibri_status colibri_sampler_new(colibri_sampler **s, uint32_t vocab, const colibri_sampling *p);
/* Restart the draw counter with a new seed (the other parameters are kept). */
void colibri_sampler_reset(colibri_sampler *s, uint64_t seed);
/* Pick one id from logits[vocab] (modified in place by the repetition penalty). history: the
 * ids so far (prompt + generated), used only by the penalty; may be NULL. */
int32_t colibri_sampler_sample(colibri_sampler *s, float *logits, const int32_t *history,
                               int n_history);
void colibri_sampler_free(colibri_sampler *s);

/* ---- Generation (generate.c) --------------------------------------------------------------
 * colibri_generate: reset the context, prefill the prompt, then sample up to max_new tokens.
 * Stops at the model's EOS id, at any of stop_ids, at any stop string (matched in the decoded
 * text, also across token boundaries; the stop string itself is not emitted), at max_new, when
 * the KV cache is full, or when the callback returns non-zero (cancel). Text needs a detokenizer
 * (`detok`); without one, only ids are produced. */
typedef enum {
    COLIBRI_FINISH_NONE = 0,
    COLIBRI_FINISH_STOP = 1,      /* EOS, a stop id or a stop string */
    COLIBRI_FINISH_LENGTH = 2,    /* max_new tokens produced */
    COLIBRI_FINISH_CONTEXT = 3,   /* the KV cache (max_seq_len) is full */
    COLIBRI_FINISH_CANCELLED = 4  /* the callback asked to stop */
} colibri_finish;

/* Decode ids[0..n) to UTF-8 bytes in out (at most cap bytes written, no NUL needed); return the
 * full length, which may exceed cap (the caller retries with a larger buffer). */
typedef size_t (*colibri_detok_fn)(void *user, const int32_t *ids, int n, char *out, size_t cap);

/* Called once per generated token (id >= 0) and once at the end (id == -1) with the text that
 * became final: never a part of a UTF-8 character, never a part that might still turn out to
 * be a stop string. The text is valid UTF-8: byte sequences the model made that are not are
 * replaced by U+FFFD, as `tokenizers`' decode does. Not NUL-terminated; len may be 0. Return
 * non-zero to cancel (no final call then). */
typedef int (*colibri_token_fn)(void *user, int32_t id, const char *text, size_t len);

/* Reasoning models write more than the answer (docs/runtime.md "Reasoning output"): gpt-oss
 * writes harmony messages on channels (analysis, final, commentary), Qwen3 / Qwen3.5 / Qwen3-Next
 * a <think> block before the answer. With colibri_generate_params.reasoning set, the output is
 * split, as it streams, into what the user reads and the rest: */
typedef enum {
    COLIBRI_REASONING_NONE = 0,    /* all output is content (on_token gets everything) */
    COLIBRI_REASONING_HARMONY = 1, /* harmony messages, parsed from the ids (harmony.c) */
    COLIBRI_REASONING_THINK = 2    /* <think> ... </think> then the answer, parsed from the text */
} colibri_reasoning_format;

typedef enum {
    COLIBRI_TEXT_CONTENT = 0,   /* the answer: harmony's final channel (and commentary without a
                                   recipient: preambles), the text after </think> */
    COLIBRI_TEXT_REASONING = 1, /* harmony's analysis channel, the text inside <think> */
    COLIBRI_TEXT_TOOL_CALL = 2  /* a harmony message to a recipient (to=functions.NAME): its
                                   arguments; colibri renders no tools, so only a model that
                                   calls one unasked writes it */
} colibri_text_kind;

typedef struct {
    int32_t id;              /* the token that made it final (-1: the end) */
    colibri_text_kind kind;
    const char *text;        /* valid UTF-8, not NUL-terminated */
    size_t len;
    int message;             /* harmony: index of the message it belongs to (0, 1, ...); else 0 */
    const char *channel;     /* harmony: the message's channel ("analysis", "final", ...), else "" */
    const char *recipient;   /* harmony: "functions.NAME" for a tool call, else "" */
} colibri_chunk;

/* Called with every piece of parsed output, of any kind, in order (several times per token at
 * most when a boundary falls inside its text). Return non-zero to cancel. */
typedef int (*colibri_chunk_fn)(void *user, const colibri_chunk *c);

typedef struct {
    const int32_t *prompt;            /* n_prompt >= 1 ids */
    int n_prompt;
    int max_new;                      /* >= 0 */
    colibri_sampling sampling;
    const int32_t *stop_ids;          /* besides the model's EOS id; may be NULL */
    int n_stop_ids;
    const char *const *stop_strings;  /* NUL-terminated, non-empty; may be NULL */
    int n_stop_strings;
    int ignore_eos;                   /* 1: do not stop at the model's EOS id */
    colibri_detok_fn detok;           /* NULL: no text (callback gets len 0) */
    void *detok_user;
    colibri_token_fn on_token;        /* may be NULL; with reasoning set: the content text only */
    void *user;
    /* appended (code built before keeps its offsets): */
    colibri_reasoning_format reasoning; /* NONE (default): no splitting */
    int starts_in_reasoning;          /* THINK: the prompt left a <think> block open (Qwen3.5's
                                         and Qwen3-Next-Thinking's generation prompts) */
    colibri_chunk_fn on_chunk;        /* may be NULL: every kind of text, with its kind */
    void *chunk_user;
} colibri_generate_params;

typedef struct {
    int n_new;               /* ids written to out_ids */
    colibri_finish finish;
    int32_t stop_id;         /* the EOS/stop id that ended it (not in out_ids), else -1 */
    int stop_string;         /* index of the stop string that ended it, else -1 */
    double prefill_ms;       /* prompt forward + first pick */
    double decode_ms;        /* the rest */
} colibri_generate_result;

void colibri_default_generate_params(colibri_generate_params *p);
/* The usual text setup for a context whose model has a tokenizer: detok = colibri_detok_ctx
 * (user = ctx), stop_ids = the tokenizer's generation_config eos ids (colibri_tokenizer_info).
 * Returns COLIBRI_E_NO_TOKENIZER (p unchanged) when the model has none. */
colibri_status colibri_generate_params_for_text(colibri_ctx *ctx, colibri_generate_params *p);
/* A colibri_detok_fn over the context's tokenizer (user must be the colibri_ctx *): the text a
 * user sees, special tokens skipped, as transformers' decode(skip_special_tokens=True). */
size_t colibri_detok_ctx(void *ctx, const int32_t *ids, int n, char *out, size_t cap);
/* The chat setup after colibri_generate_params_for_text, for a prompt rendered with the model's
 * chat template (prompt: that text): reasoning = the template's output format
 * (colibri_chat_reasoning_format), starts_in_reasoning = the prompt ends inside <think>; a
 * harmony model also stops at <|return|> and <|call|> whatever generation_config says. */
colibri_status colibri_generate_params_for_chat(colibri_ctx *ctx, colibri_generate_params *p,
                                                const char *prompt, size_t len);
/* out_ids must hold max_new ids. Allocates its working buffers (logits of one prefill chunk,
 * sampler, text) per call and frees them before returning; the forward passes allocate nothing.
 * A prompt longer than max_seq_len fails with COLIBRI_E_SEQ_TOO_LONG naming both numbers. */
colibri_status colibri_generate(colibri_ctx *ctx, const colibri_generate_params *p,
                                int32_t *out_ids, colibri_generate_result *r);
/* "stop", "length", "context", "cancelled" or "none". */
const char *colibri_finish_name(colibri_finish f);

/* ---- Generations stepped together (continuous batching) ------------------------------------
 * colibri_generate cut into steps: colibri_gen_new sets one up on its context (the checks and
 * buffers of colibri_generate), colibri_gen_step advances several at once by one pass of the
 * engine: each decoding generation's next token, then the prompts' next tokens (up to 512 rows in
 * all), so a request may join or leave between any two steps. Every generation gives exactly
 * the ids, text and finish colibri_generate would give it alone, in any company and join order
 * (the pass's batch invariance; sampling draws depend only on the seed and the draw number).
 * Callbacks run on the thread calling colibri_gen_step. The thread contract is the engine's:
 * during a step, the calling thread owns the engine and every generation's context. */
typedef struct colibri_gen colibri_gen;

/* keep: 0 resets seq (as colibri_generate does); k > 0 means the first k prompt ids are already
 * in seq at positions 0..k-1 (a prefix put there by colibri_seq_restore: seq's position must be
 * k, and k < n_prompt). p is copied, and the prompt with it; stop strings and the callbacks'
 * user data must live until colibri_gen_free. out_ids holds max_new ids. */
colibri_status colibri_gen_new(colibri_gen **g, colibri_ctx *seq, const colibri_generate_params *p,
                               int32_t *out_ids, int keep);
/* One pass over the unfinished generations among gens[0..n) (each context at most once). A
 * failed pass finishes the generations it carried with its status. */
colibri_status colibri_gen_step(colibri_engine *e, colibri_gen *const *gens, int n);
/* The most prompt rows one step gives to prompts while at least one generation is decoding
 * (0, the default: whatever the pass holds after the decode rows). A decoding request's next
 * token waits for its whole step, so a joining 511-token prompt would stall it for a 512-row
 * pass; with rows = 64 it waits for at most 64 prompt rows a step, and the prompt takes more
 * steps (its weights read once per step instead of once per 512 rows). With nobody decoding a
 * prompt still takes the whole pass. Bits unchanged: a prompt's values do not depend on how it
 * is split into steps (prefill == decode). 0..512, else COLIBRI_E_INVALID_ARG. */
colibri_status colibri_engine_set_prompt_rows(colibri_engine *e, int rows);
/* 1 once it has finished (the result is final). */
int colibri_gen_done(const colibri_gen *g);
/* Its result so far; returns COLIBRI_OK or the error that ended it (colibri_last_error(seq)). */
colibri_status colibri_gen_result(const colibri_gen *g, colibri_generate_result *r);
/* Its context's position: prompt ids computed so far plus generated ids fed back. */
int colibri_gen_position(const colibri_gen *g);
void colibri_gen_free(colibri_gen *g);

/* ---- Chat (chat.c) -------------------------------------------------------------------------
 * The model's chat template, stored at conversion as a table of the text around each message
 * (colibri_kit/model/chat.py, docs/format.md "chat.template"); the rendering is byte-identical
 * to transformers' apply_chat_template(tokenize=False) for the conversations it accepts: an
 * optional system (or developer) message, then user and assistant alternating, starting with
 * user. Tools, tool calls and images are not rendered. The text
 * already holds the BOS text where the template puts it: tokenize it without adding BOS. */
typedef struct {
    const char *role;     /* "system", "developer" (gpt-oss), "user" or "assistant" */
    const char *content;  /* UTF-8, NUL-terminated */
} colibri_chat_message;

/* What the template gets besides the messages (transformers' apply_chat_template kwargs). A
 * template that does not use one ignores it, as jinja2 does. */
typedef struct {
    int add_generation_prompt; /* 1 (default): end with the assistant's turn opened */
    int enable_thinking;       /* -1 (default): the template's own default; 0 / 1: Qwen3's and
                                  Qwen3.5's switch (the generation prompt closes or opens <think>) */
    const char *reasoning_effort; /* NULL: the template's default (gpt-oss: "medium"); "low",
                                     "medium" or "high" */
    int64_t now;               /* the time of "Current date:" (gpt-oss; strftime_now in the
                                  template, local time): Unix seconds, 0 = the current time */
} colibri_chat_options;

void colibri_default_chat_options(colibri_chat_options *o);

/* Writes at most cap bytes (NUL-terminated when it fits) and sets *len to the full length;
 * when *len >= cap call again with a larger buffer. Reads only the model: thread safe.
 * COLIBRI_E_UNSUPPORTED when the model has no template or the template refuses the
 * conversation; why receives the reason. */
colibri_status colibri_chat_render(const colibri_model *m, const colibri_chat_message *msgs, int n,
                                   int add_generation_prompt, char *out, size_t cap, size_t *len,
                                   char *why, size_t why_len);
/* The same with options (NULL: colibri_default_chat_options). COLIBRI_E_UNSUPPORTED also when a
 * content is one the template treats specially and the table cannot reproduce (why says which:
 * e.g. an assistant message with "</think>" in Qwen3's last turn). */
colibri_status colibri_chat_render_ex(const colibri_model *m, const colibri_chat_message *msgs, int n,
                                      const colibri_chat_options *opt, char *out, size_t cap,
                                      size_t *len, char *why, size_t why_len);
/* 1 when the model carries a chat template (colibri_chat_render can render), else 0. */
int colibri_chat_available(const colibri_model *m);
/* How the model's chat output is split (the template's output.format): NONE without one. */
colibri_reasoning_format colibri_chat_reasoning_format(const colibri_model *m);

/* ---- Text: the model's own tokenizer (format version 2; docs/runtime.md "Tokenizer") --------
 * Ids are exactly those of the Hugging Face `tokenizers` library for the model's tokenizer.json.
 * Thread contract: these calls read only the loaded model (never the context's KV state or error
 * buffer), so any number of threads may call them at once on one context. A model file without a
 * tokenizer (format version 1) gives COLIBRI_E_NO_TOKENIZER: re-convert it (`invoke convert`). */
typedef struct {
    int has_tokenizer;
    char kind[24];            /* "byte_level_bpe" or "sentencepiece_bpe" */
    uint32_t vocab;           /* pieces (<= the model's vocab_size) */
    int add_bos, add_eos;     /* what add_special adds */
    int32_t bos_id, eos_id, pad_id, unk_id; /* -1 when none */
    int n_stop;               /* generation stops at these ids (generation_config.json eos ids) */
    int32_t stop_ids[16];
} colibri_tokenizer_info;

void colibri_get_tokenizer_info(const colibri_ctx *ctx, colibri_tokenizer_info *info);

/* `len` bytes of text (any bytes: invalid UTF-8 goes through the byte rules, never fails) ->
 * ids. add_special: add BOS/EOS as the model's tokenizer does by default. Writes at most `cap`
 * ids; *n_ids is always the number needed (COLIBRI_E_BUFFER_TOO_SMALL when it exceeds cap). */
colibri_status colibri_tokenize(const colibri_ctx *ctx, const char *text, size_t len,
                                int add_special, int32_t *ids, size_t cap, size_t *n_ids);
/* ids -> UTF-8 text (no NUL added), as `tokenizers` decodes; skip_special drops special tokens.
 * *len is the size needed (COLIBRI_E_BUFFER_TOO_SMALL when it exceeds cap). */
colibri_status colibri_detokenize(const colibri_ctx *ctx, const int32_t *ids, size_t n,
                                  int skip_special, char *text, size_t cap, size_t *len);
/* The raw bytes of one token (for streaming: a piece may end inside a UTF-8 character). */
colibri_status colibri_token_piece(const colibri_ctx *ctx, int32_t id, char *buf, size_t cap,
                                   size_t *len);

#ifdef __cplusplus
}
#endif
#endif
