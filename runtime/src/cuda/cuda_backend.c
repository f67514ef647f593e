/* CUDA backend through the driver API (docs/cuda.md).
 *
 * libcuda.so.1 is opened with dlopen at run time, so the binary links without any CUDA library
 * and still runs (on the CPU) where there is no driver. The kernels come from the images the build
 * embedded (kernel_images.h): the cubin compiled for exactly the device's SM, else the PTX, which
 * the driver JIT-compiles for a newer SM. Every failure returns a one-line reason.
 *
 * Memory: the model's device (colibri_cuda_device, shared by all its contexts) holds the CUDA
 * context, the kernels and the weights: the model file's data section, copied once to the device
 * in chunks (each chunk's host pages dropped once it is staged, so the peak stays near one copy),
 * however many contexts (serve slots) run on it. Each context has one device arena, sized from
 * the model geometry (colibri_cuda_plan): activations, KV cache, per-expert pointer tables, RoPE
 * table. COLIBRI_CUDA_WEIGHTS=map on an integrated GPU
 * (Jetson: CPU and GPU share DRAM) registers and device-maps the mmapped file itself instead.
 * Either way a weight's device address is its file offset from one base. Logits come down
 * through one page-locked host buffer.
 *
 * Work is issued in chunks of at most plan.chunk tokens. With 2 streams the shared expert (and its
 * gate) of a layer runs on the second stream while the first routes, dispatches and runs the
 * routed experts; events join them before the combine. The kernels and the buffers they write are
 * the same with 1 or 2 streams, and no kernel uses atomics, so the results are identical. */
#include "cuda_backend.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include "../../kernels/colibri_abi.h"
#include "colibri_config.h"
#include "cuda_driver.h"
#include "kernel_images.h"
#include "core/model.h"

#ifndef COLIBRI_IGPU
#define COLIBRI_IGPU 0
#endif

#define CB_ALIGN 256u         /* every arena region starts on this boundary */
#define CB_ROW_THREADS ((unsigned)COLIBRI_CU_ROW_THREADS) /* colibri_abi.h: shared with the .cu */
#define CB_ROW_WARPS ((unsigned)COLIBRI_CU_ROW_WARPS)
#define CB_TOKEN_TILE ((unsigned)COLIBRI_CU_TOKEN_TILE)
#define CB_WIDE ((unsigned)COLIBRI_CU_WIDE_THREADS)
#define CB_HEAD ((unsigned)COLIBRI_CU_HEAD_THREADS)
/* Tokens per device pass (prefill): as many as the activation budget allows, up to CB_MAX_CHUNK
 * (a tensor-core tile reads each weight row once per 32 tokens of an expert, so longer passes
 * read the weights fewer times per prompt); never fewer than CB_MIN_CHUNK for the budget's sake,
 * the chunk the backend had before (issue 20). The logits come down CB_LOGIT_ROWS rows at a time
 * (a prompt's last row only in colibri_cuda_forward_last), so they do not grow with the pass. */
#define CB_MAX_CHUNK 256
#define CB_MIN_CHUNK 32
#define CB_ACT_BUDGET ((size_t)32 << 20) /* a pass's per-token buffers, bytes */
#define CB_LOGIT_ROWS 32
#define CB_PART_BUDGET (64u << 20) /* split-attention partials bound, bytes */
#define CB_KV_SPLIT ((size_t)COLIBRI_CU_KV_SPLIT)
/* The decode graph's parameter block (plan.prm), in ints: the step's token id and position are
 * uploaded together before each graph launch (one copy); the shared expert's slot offsets {0, 1}
 * are constant in decode and written once at open. */
#define CB_PRM_ID 0
#define CB_PRM_POS 1
#define CB_PRM_SHARED_OFF 2
#define CB_PRM_BYTES 256u

/* ---- pure helpers (unit-tested without a GPU: tests/gpu/host_unit.c) ----------------------- */

int colibri_cuda_pick_image(const colibri_kernel_image *images, int count, int sm, char *why,
                            size_t why_len) {
    int ptx = -1;
    for (int i = 0; i < count; i++) {
        if (strcmp(images[i].kind, "cubin") == 0 && images[i].sm == sm) return i;
        if (strcmp(images[i].kind, "ptx") == 0 && images[i].sm <= sm &&
            (ptx < 0 || images[i].sm > images[ptx].sm))
            ptx = i;
    }
    if (ptx >= 0) return ptx;
    /* name what is embedded so the user knows which --cuda-archs to build with */
    char have[160] = "";
    size_t used = 0;
    for (int i = 0; i < count && used + 24 < sizeof have; i++) {
        int w = snprintf(have + used, sizeof have - used, "%s%s %s_%d", used ? ", " : "",
                         images[i].kind, strcmp(images[i].kind, "ptx") == 0 ? "compute" : "sm",
                         images[i].sm);
        if (w > 0) used += (size_t)w;
    }
    if (count == 0)
        snprintf(why, why_len, "no CUDA kernels in this binary (built without CUDA archs); "
                 "GPU is sm_%d", sm);
    else
        snprintf(why, why_len, "no kernel image for sm_%d in this binary (embedded: %s); rebuild "
                 "with the GPU's arch (e.g. --cuda-archs sm_%d)", sm, have, sm);
    return -1;
}

unsigned colibri_cuda_ceil_div(unsigned a, unsigned b) { return (a + b - 1) / b; }

void colibri_cuda_rows_launch(int rows, int n, unsigned grid[3], unsigned block[3]) {
    grid[0] = colibri_cuda_ceil_div((unsigned)rows, CB_ROW_WARPS);
    grid[1] = colibri_cuda_ceil_div((unsigned)n, CB_TOKEN_TILE);
    grid[2] = 1;
    block[0] = CB_ROW_THREADS;
    block[1] = block[2] = 1;
}

static size_t cb_take(size_t *cursor, size_t bytes) {
    size_t at = *cursor;
    *cursor += (bytes + CB_ALIGN - 1) / CB_ALIGN * CB_ALIGN;
    return at;
}

/* Tokens a pass keeps split-KV partials for: decode's one, or the whole chunk when heads are
 * too wide for the tiled prefill kernel (which keeps its softmax state in registers instead). */
static size_t cb_part_tokens(size_t chunk, size_t Dh) {
    return Dh <= (size_t)COLIBRI_CU_FA_MAX_DH ? 1 : chunk;
}

/* ---- hybrid layers (#24): what the plan needs of them ----------------------------------------- */

/* The layer kinds' own cache needs (layers/kinds.h, the CPU arena's source too). */
static colibri_cache_need cb_layer_need(const struct colibri_model *m, uint32_t l) {
    colibri_cache_need need;
    memset(&need, 0, sizeof need);
    if (m->layers[l].mixer) m->layers[l].mixer->cache(m, l, &need);
    else need.kv_positions = m->max_seq_len; /* a model built without the kind table (host_unit.c):
                                                plain attention */
    return need;
}

/* Working floats per token of a pass: the largest mixer scratch over the layers (a DeltaNet
 * layer's [qkv | conv out | z | b | a | o], gated attention's gate), as the CPU arena's `mix`. */
static size_t cb_mix_floats(const struct colibri_model *m) {
    size_t mx = 0;
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const size_t s = cb_layer_need(m, l).scratch_floats;
        if (s > mx) mx = s;
    }
    return mx;
}

/* Where layer l's KV cache is among the layers that have one (-1: none, a recurrent layer). */
static int cb_kv_index(const struct colibri_model *m, uint32_t l) {
    int at = 0;
    for (uint32_t i = 0; i < l; i++) at += cb_layer_need(m, i).kv_positions > 0;
    return cb_layer_need(m, l).kv_positions > 0 ? at : -1;
}

/* Float offset of layer l's recurrent state in the state region (layers in order). */
static size_t cb_state_at(const struct colibri_model *m, uint32_t l) {
    size_t at = 0;
    for (uint32_t i = 0; i < l; i++) at += cb_layer_need(m, i).state_floats;
    return at;
}

/* Bytes of the per-token buffers of a pass (everything colibri_cuda_plan sizes by the chunk but
 * the split-KV partials and the logits): the activation budget's measure. */
static size_t cb_token_bytes(const struct colibri_model *m) {
    const size_t H = m->n_heads, Dh = m->head_dim, Dp = m->embed_dim_pad, E = m->num_experts;
    const size_t k = m->top_k, F = m->expert_size, kvd = (size_t)m->n_kv_heads * Dh;
    size_t b = 2 * Dp + H * Dh + (H * Dh + 2 * kvd) + H * Dh + E + 4 * k + k * F + k * Dp + 2;
    if (m->flags & COLIBRI_FLAG_SHARED_EXPERT) b += m->shared_expert_size + Dp + 1;
    return (b + cb_mix_floats(m)) * 4;
}

/* ---- gpt-oss (#23): the pure helpers (the launches are below cb_swiglu) -------------------- */

/* A layer whose attention runs cb_oss_attention: attention sinks, or a sliding window shorter
 * than the context (a window covering it is full attention and keeps the other kernels). */
static int cb_oss_layer(const struct colibri_model *m, int l) {
    const colibri_layer_desc *d = &m->layers[l].desc;
    return (d->mixer_flags & COLIBRI_MIXER_SINKS) ||
           (d->mixer == COLIBRI_MIXER_SLIDING_ATTENTION && d->window < m->max_seq_len);
}

/* A layer whose routed experts run cb_oss_expert_up/down: mxfp4 experts, expert biases or the
 * clamped SwiGLU (the other families' experts keep cb_expert_up/down and the tensor cores). */
static int cb_oss_experts(const colibri_layer *ly) {
    return ly->w1[0].dtype == COLIBRI_DT_MXFP4 || ly->w2[0].dtype == COLIBRI_DT_MXFP4 ||
           (ly->desc.ffn_params[0] & (COLIBRI_MOE_EXPERT_BIAS | COLIBRI_MOE_CLAMPED_SWIGLU));
}

/* The arena's expert-bias pointer tables: per layer b1[E] b3[E] b2[E] (0 bytes when no layer has
 * expert biases). */
static size_t cb_oss_bias_bytes(const struct colibri_model *m) {
    for (uint32_t l = 0; l < m->n_layers; l++)
        if (m->layers[l].desc.ffn_params[0] & COLIBRI_MOE_EXPERT_BIAS)
            return (size_t)m->n_layers * 3 * m->num_experts * sizeof(CUdeviceptr);
    return 0;
}

/* YaRN: the RoPE table from the CPU's own frequencies and attention factor (m->rope, computed at
 * load by core/rope.c as transformers does), in the kernels' layout [p][i](cos, sin): cos and
 * sin of p * freq[i] in double rounded to f32, then times the factor in f32, which is
 * colibri_rope_row's arithmetic, so both backends rotate by the same f32 values. The factor on
 * both q and k scales the scores by its square, as transformers' attention_scaling does. */
static void cb_oss_rope_table(const struct colibri_model *m, float *cs) {
    const size_t half = m->head_dim / 2;
    const float scale = m->rope.scale;
    for (size_t p = 0; p < m->max_seq_len; p++)
        for (size_t i = 0; i < half; i++) {
            const double a = (double)p * m->rope.freq[i];
            float c = (float)cos(a), sn = (float)sin(a);
            if (scale != 1.0f) {
                c *= scale;
                sn *= scale;
            }
            cs[(p * half + i) * 2] = c;
            cs[(p * half + i) * 2 + 1] = sn;
        }
}

int colibri_cuda_plan(const struct colibri_model *m, int kv_f16, colibri_cuda_plan_t *p) {
    memset(p, 0, sizeof *p);
    const size_t S = m->max_seq_len, H = m->n_heads, Dh = m->head_dim, Dp = m->embed_dim_pad;
    const size_t E = m->num_experts, k = m->top_k, F = m->expert_size, V = m->vocab_size;
    const size_t Fs = m->shared_expert_size, L = m->n_layers, kvd = (size_t)m->n_kv_heads * Dh;
    if (S == 0 || H == 0 || E == 0 || k == 0 || k > 16 || E > COLIBRI_CU_MAX_SORT || m->n_kv_heads == 0 ||
        H % m->n_kv_heads != 0)
        return -1;
    /* tokens per pass: bounded so the split attention's partials (part tokens x H x ranges x
     * (Dh + 2) floats, a range being COLIBRI_CU_KV_SPLIT positions) stay small; only a prefill
     * with heads wider than the tiled kernel's keeps partials per chunk token */
    const size_t ranges = (S + CB_KV_SPLIT - 1) / CB_KV_SPLIT;
    const size_t kv_bytes = kv_f16 ? 2 : 4; /* f16 cache: IEEE half bits */
    size_t c = CB_MAX_CHUNK < S ? CB_MAX_CHUNK : S;
    while (c > CB_MIN_CHUNK && c * cb_token_bytes(m) > CB_ACT_BUDGET) c /= 2;
    while (c > 1 && cb_part_tokens(c, Dh) * H * ranges * (Dh + 2) * sizeof(float) > CB_PART_BUDGET)
        c /= 2;
    p->chunk = (int)c;
    p->logit_rows = (int)(c < CB_LOGIT_ROWS ? c : CB_LOGIT_ROWS);
    p->kv_f16 = kv_f16 != 0;
    size_t at = 0;
    p->x = cb_take(&at, c * Dp * 4);
    p->h = cb_take(&at, c * Dp * 4);
    p->q = cb_take(&at, c * H * Dh * 4);
    p->qkv = cb_take(&at, c * (H * Dh + 2 * kvd) * 4);
    p->att = cb_take(&at, c * H * Dh * 4);
    p->part = cb_take(&at, cb_part_tokens(c, Dh) * H * ranges * (Dh + 2) * 4);
    p->router = cb_take(&at, c * E * 4);
    p->top_idx = cb_take(&at, c * k * 4);
    p->top_w = cb_take(&at, c * k * 4);
    p->offsets = cb_take(&at, (E + 1) * 4);
    p->active = cb_take(&at, E * 4);
    p->perm = cb_take(&at, c * k * 4);
    p->slot_of = cb_take(&at, c * k * 4);
    p->act = cb_take(&at, c * k * F * 4);
    p->expert_out = cb_take(&at, c * k * Dp * 4);
    if (m->flags & COLIBRI_FLAG_SHARED_EXPERT) {
        p->shared_act = cb_take(&at, c * Fs * 4);
        p->shared_out = cb_take(&at, c * Dp * 4);
        p->shared_gate = cb_take(&at, c * 4);
    }
    p->shared_offsets = cb_take(&at, 2 * 4);
    p->logits = cb_take(&at, (size_t)p->logit_rows * V * 4);
    p->ids = cb_take(&at, c * 4);
    p->iota = cb_take(&at, c * 4);
    p->prm = cb_take(&at, CB_PRM_BYTES);
    p->rope = cb_take(&at, S * (Dh / 2) * 2 * 4);
    /* K and V for the layers that keep them (a recurrent layer keeps its state instead) */
    size_t La = 0;
    for (uint32_t l = 0; l < m->n_layers; l++) La += cb_layer_need(m, l).kv_positions > 0;
    p->kv_layers = (int)La;
    p->kv_bytes = 2 * La * S * kvd * kv_bytes;
    p->kcache = cb_take(&at, La * S * kvd * kv_bytes);
    p->vcache = cb_take(&at, La * S * kvd * kv_bytes);
    p->tables = cb_take(&at, L * (6 * E + 6) * sizeof(CUdeviceptr));
    p->mix = cb_take(&at, c * cb_mix_floats(m) * 4);
    p->state_bytes = cb_state_at(m, m->n_layers) * 4;
    p->state = cb_take(&at, p->state_bytes);
    p->oss_bias = cb_take(&at, cb_oss_bias_bytes(m)); /* gpt-oss expert biases' pointers */
    p->total = at;
    return 0;
}

/* ---- the driver ------------------------------------------------------------------------------ */

typedef struct {
    void *lib;
    cuInit_t Init;
    cuDriverGetVersion_t DriverGetVersion;
    cuDeviceGetCount_t DeviceGetCount;
    cuDeviceGet_t DeviceGet;
    cuDeviceGetAttribute_t DeviceGetAttribute;
    cuDeviceGetName_t DeviceGetName;
    cuCtxCreate_v2_t CtxCreate;
    cuCtxDestroy_v2_t CtxDestroy;
    cuCtxPushCurrent_v2_t CtxPushCurrent;
    cuCtxPopCurrent_v2_t CtxPopCurrent;
    cuModuleLoadDataEx_t ModuleLoadDataEx;
    cuModuleUnload_t ModuleUnload;
    cuModuleGetFunction_t ModuleGetFunction;
    cuMemAlloc_v2_t MemAlloc;
    cuMemFree_v2_t MemFree;
    cuMemcpyHtoD_v2_t MemcpyHtoD;
    cuMemcpyHtoDAsync_v2_t MemcpyHtoDAsync;
    cuMemcpyDtoHAsync_v2_t MemcpyDtoHAsync;
    cuMemHostRegister_v2_t MemHostRegister;
    cuMemHostUnregister_t MemHostUnregister;
    cuMemHostGetDevicePointer_v2_t MemHostGetDevicePointer;
    cuLaunchKernel_t LaunchKernel;
    cuStreamCreate_t StreamCreate;
    cuStreamDestroy_v2_t StreamDestroy;
    cuStreamSynchronize_t StreamSynchronize;
    cuStreamWaitEvent_t StreamWaitEvent;
    cuEventCreate_t EventCreate;
    cuEventDestroy_v2_t EventDestroy;
    cuEventRecord_t EventRecord;
    cuEventSynchronize_t EventSynchronize;
    cuMemAllocHost_v2_t MemAllocHost;
    cuMemFreeHost_t MemFreeHost;
    cuGetErrorString_t GetErrorString;
    cuCtxSynchronize_t CtxSynchronize;
    void *companions[2];       /* the cuda-compat driver's JIT/NVVM libraries, preloaded */
    char path[256];            /* the library loaded, as the dynamic loader found it */
    /* optional (CUDA graphs); all set or all NULL */
    cuStreamBeginCapture_v2_t StreamBeginCapture;
    cuStreamEndCapture_t StreamEndCapture;
    cuGraphInstantiateWithFlags_t GraphInstantiate;
    cuGraphLaunch_t GraphLaunch;
    cuGraphExecDestroy_t GraphExecDestroy;
    cuGraphDestroy_t GraphDestroy;
} cb_driver;

/* symbol name -> offset of its slot in cb_driver */
static const struct { const char *name; size_t off; } cb_symbols[] = {
#define CB_SYM(field, sym) {sym, offsetof(cb_driver, field)}
    CB_SYM(Init, "cuInit"), CB_SYM(DriverGetVersion, "cuDriverGetVersion"),
    CB_SYM(DeviceGetCount, "cuDeviceGetCount"), CB_SYM(DeviceGet, "cuDeviceGet"),
    CB_SYM(DeviceGetAttribute, "cuDeviceGetAttribute"), CB_SYM(DeviceGetName, "cuDeviceGetName"),
    CB_SYM(CtxCreate, "cuCtxCreate_v2"), CB_SYM(CtxDestroy, "cuCtxDestroy_v2"),
    CB_SYM(CtxPushCurrent, "cuCtxPushCurrent_v2"), CB_SYM(CtxPopCurrent, "cuCtxPopCurrent_v2"),
    CB_SYM(ModuleLoadDataEx, "cuModuleLoadDataEx"), CB_SYM(ModuleUnload, "cuModuleUnload"),
    CB_SYM(ModuleGetFunction, "cuModuleGetFunction"), CB_SYM(MemAlloc, "cuMemAlloc_v2"),
    CB_SYM(MemFree, "cuMemFree_v2"), CB_SYM(MemcpyHtoD, "cuMemcpyHtoD_v2"),
    CB_SYM(MemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2"),
    CB_SYM(MemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2"),
    CB_SYM(MemHostRegister, "cuMemHostRegister_v2"),
    CB_SYM(MemHostUnregister, "cuMemHostUnregister"),
    CB_SYM(MemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2"),
    CB_SYM(LaunchKernel, "cuLaunchKernel"), CB_SYM(StreamCreate, "cuStreamCreate"),
    CB_SYM(StreamDestroy, "cuStreamDestroy_v2"), CB_SYM(StreamSynchronize, "cuStreamSynchronize"),
    CB_SYM(StreamWaitEvent, "cuStreamWaitEvent"), CB_SYM(EventCreate, "cuEventCreate"),
    CB_SYM(EventDestroy, "cuEventDestroy_v2"), CB_SYM(EventRecord, "cuEventRecord"),
    CB_SYM(EventSynchronize, "cuEventSynchronize"), CB_SYM(MemAllocHost, "cuMemAllocHost_v2"),
    CB_SYM(MemFreeHost, "cuMemFreeHost"),
    CB_SYM(GetErrorString, "cuGetErrorString"), CB_SYM(CtxSynchronize, "cuCtxSynchronize"),
#undef CB_SYM
};

/* The profile's cuda-compat driver (templates/colibri_config.h.j2, `cuda.compat_driver`): a
 * Jetson target whose CUDA is newer than some of its L4T releases' BSP driver (xavier-nx's 11.8 on
 * JetPack 5's 11.4; orin's 12.6 on R36.3's 12.2) names NVIDIA's upgrade driver by its path, so
 * neither the service unit nor a shell needs LD_LIBRARY_PATH. */
#ifndef COLIBRI_CUDA_COMPAT_LIBCUDA
#define COLIBRI_CUDA_COMPAT_LIBCUDA ""
#endif

/* Libraries NVIDIA's cuda-compat package installs beside its libcuda.so.1 (dpkg -L cuda-compat-*:
 * libnvidia-ptxjitcompiler.so.1, libnvidia-nvvm.so.4, libcudadebugger.so.1), which that libcuda
 * opens by soname when it JIT-compiles PTX. NVIDIA's instructions put the compat directory on
 * LD_LIBRARY_PATH; loading libcuda by its path does not, so the companions are loaded first, by
 * path: glibc's dlopen then finds them already loaded under their soname (the approach of
 * CUDA.jl's compat-driver loader, JuliaGPU/CUDA.jl#1859). A missing companion is skipped: the
 * BSP's own is found, as it would be without the compat directory. */
static const char *const cb_compat_companions[] = {"libnvidia-ptxjitcompiler.so.1",
                                                   "libnvidia-nvvm.so.4"};

const char *colibri_cuda_libcuda_choice(const char *env, const char *compat, int compat_present,
                                        int *is_compat) {
    *is_compat = 0;
    if (env && *env) return env; /* tests' stand-in, or an operator's explicit choice */
    if (compat && *compat && compat_present) {
        *is_compat = 1;
        return compat;
    }
    return "libcuda.so.1";
}

static void cb_driver_unload(cb_driver *d) {
    if (d->lib) dlclose(d->lib);
    for (size_t i = 0; i < sizeof d->companions / sizeof d->companions[0]; i++)
        if (d->companions[i]) dlclose(d->companions[i]);
    d->lib = NULL;
    memset(d->companions, 0, sizeof d->companions);
}

/* Preload the companions from the compat driver's directory (see cb_compat_companions). */
static void cb_preload_companions(cb_driver *d, const char *libcuda) {
    const char *slash = strrchr(libcuda, '/');
    if (!slash) return;
    for (size_t i = 0; i < sizeof cb_compat_companions / sizeof cb_compat_companions[0]; i++) {
        char path[320];
        snprintf(path, sizeof path, "%.*s/%s", (int)(slash - libcuda), libcuda,
                 cb_compat_companions[i]);
        if (access(path, R_OK) == 0) d->companions[i] = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    }
}

static int cb_driver_load(cb_driver *d, char *why, size_t why_len) {
    memset(d, 0, sizeof *d);
    const char *compat = COLIBRI_CUDA_COMPAT_LIBCUDA;
    int is_compat = 0;
    const char *name = colibri_cuda_libcuda_choice(getenv("COLIBRI_LIBCUDA"), compat,
                                                   compat[0] && access(compat, R_OK) == 0,
                                                   &is_compat);
    if (is_compat) cb_preload_companions(d, name);
    d->lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!d->lib) {
        if (is_compat) /* present but unusable: say so, never fall back silently to the BSP's */
            snprintf(why, why_len, "cannot load the cuda-compat driver %s: %.160s", name,
                     dlerror());
        else
            snprintf(why, why_len, "%s not found (no NVIDIA driver)", name);
        cb_driver_unload(d);
        return -1;
    }
    for (size_t i = 0; i < sizeof cb_symbols / sizeof cb_symbols[0]; i++) {
        void *fn = dlsym(d->lib, cb_symbols[i].name);
        if (!fn) {
            snprintf(why, why_len, "%s lacks %s (driver too old or not an NVIDIA driver)", name,
                     cb_symbols[i].name);
            cb_driver_unload(d);
            return -1;
        }
        memcpy((char *)d + cb_symbols[i].off, &fn, sizeof fn);
    }
    /* the file the loader opened (a bare name resolves through its search path) */
    Dl_info where;
    void *sym = NULL;
    memcpy(&sym, &d->Init, sizeof sym);
    snprintf(d->path, sizeof d->path, "%s",
             dladdr(sym, &where) && where.dli_fname ? where.dli_fname : name);
    /* CUDA graphs (driver >= 11.4 for cuGraphInstantiateWithFlags): optional, all or none, so
     * an older driver still runs, with one launch per kernel */
    static const struct { const char *name; size_t off; } graph_syms[] = {
        {"cuStreamBeginCapture_v2", offsetof(cb_driver, StreamBeginCapture)},
        {"cuStreamEndCapture", offsetof(cb_driver, StreamEndCapture)},
        {"cuGraphInstantiateWithFlags", offsetof(cb_driver, GraphInstantiate)},
        {"cuGraphLaunch", offsetof(cb_driver, GraphLaunch)},
        {"cuGraphExecDestroy", offsetof(cb_driver, GraphExecDestroy)},
        {"cuGraphDestroy", offsetof(cb_driver, GraphDestroy)},
    };
    void *gfn[sizeof graph_syms / sizeof graph_syms[0]];
    int all = 1;
    for (size_t i = 0; i < sizeof graph_syms / sizeof graph_syms[0]; i++)
        all &= (gfn[i] = dlsym(d->lib, graph_syms[i].name)) != NULL;
    for (size_t i = 0; all && i < sizeof graph_syms / sizeof graph_syms[0]; i++)
        memcpy((char *)d + graph_syms[i].off, &gfn[i], sizeof gfn[i]);
    return 0;
}

/* ---- the backend ----------------------------------------------------------------------------- */

enum { CB_F_EMBED, CB_F_RMSNORM, CB_F_LINEAR, CB_F_QK_ROPE_KV, CB_F_ATTENTION, CB_F_PREFILL,
       CB_F_MERGE, CB_F_TOPK, CB_F_DISPATCH, CB_F_UP, CB_F_DOWN, CB_F_COMBINE, CB_F_ROUTE,
       CB_F_COUNT };

static const char *const cb_kernel_names[CB_F_COUNT] = {
    "cb_embed", "cb_rmsnorm", "cb_linear", "cb_qk_rope_kv", "cb_attention",
    "cb_attention_prefill", "cb_attention_merge", "cb_router_topk", "cb_dispatch",
    "cb_expert_up", "cb_expert_down", "cb_moe_combine", "cb_ffn_route"};

/* Optional kernels: the tensor-core prefill twins of cb_expert_up/down and cb_linear
 * (colibri_kernels.cu, "tensor-core prefill GEMM"). The kernel source compiles them only for
 * __CUDA_ARCH__ >= 800, so an sm_72 cubin or a compute_72 PTX lacks them (cuModuleGetFunction:
 * CUDA_ERROR_NOT_FOUND) and the SIMT kernels run prefill, as they always run decode. All or
 * none. */
enum { CB_T_UP, CB_T_DOWN, CB_T_LINEAR, CB_T_COUNT };
static const char *const cb_tc_names[CB_T_COUNT] = {"cb_expert_up_mma", "cb_expert_down_mma",
                                                    "cb_linear_mma"};

/* The hybrid-family kernels (#24: Gated DeltaNet, gated attention), looked up like cb_kernel_names
 * (every image has them). */
enum { CB_H_DN_CONV, CB_H_DN_RECUR, CB_H_ROPE_PARTIAL, CB_H_GATE, CB_H_ZERO, CB_H_COUNT };
static const char *const cb_hy_names[CB_H_COUNT] = {"cb_dn_conv", "cb_dn_recur",
                                                    "cb_qk_rope_partial_kv", "cb_sigmoid_gate",
                                                    "cb_zero"};
/* gpt-oss's kernels (#23; colibri_kernels.cu "gpt-oss kernels"): mxfp4 / biased / clamped-SwiGLU
 * experts and the attention with sinks and a sliding window. In every image (required). */
enum { CB_O_UP, CB_O_DOWN, CB_O_ATTENTION, CB_O_COUNT };
static const char *const cb_oss_names[CB_O_COUNT] = {"cb_oss_expert_up", "cb_oss_expert_down",
                                                     "cb_oss_attention"};

/* The model's GPU: the driver, one CUDA context, the kernels and the one device copy (or
 * mapping) of the weights. Every context of a model shares it (api.c keeps it with the model and
 * frees it with the model), so serving N slots holds the weights once, not N times. */
struct colibri_cuda_device {
    cb_driver d;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn[CB_F_COUNT];
    CUfunction tc[CB_T_COUNT]; /* tensor-core prefill kernels, all NULL when the image lacks them */
    CUfunction hy[CB_H_COUNT]; /* hybrid-family kernels */
    CUfunction oss[CB_O_COUNT]; /* gpt-oss kernels */
    const struct colibri_model *m;
    CUdeviceptr weights;       /* the device copy of the data section (0 when mapped) */
    size_t weights_bytes;      /* its size */
    CUdeviceptr wbase;         /* device address of the file's byte data_offset */
    void *registered;          /* host range registered with cuMemHostRegister (mapped) */
    colibri_cuda_info info;    /* device, image, weights mode, prefill path */
};

struct colibri_cuda {
    /* copies of the device's driver table, context and kernels, so the launch code reads one
     * struct; owned by dv (released by colibri_cuda_device_close, not by this context) */
    cb_driver d;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn[CB_F_COUNT];
    CUfunction tc[CB_T_COUNT];
    CUfunction hy[CB_H_COUNT];
    int state_dirty;         /* the recurrent state must be zeroed before the next pass (open, reset) */
    CUfunction oss[CB_O_COUNT];
    colibri_cuda_device *dv;
    int owns_dv;             /* colibri_cuda_open's private device: closed with the context */
    CUstream stream[2];
    int nstreams;
    CUevent ev_h, ev_shared; /* FFN input ready (stream 0) / shared expert done (stream 1) */
    const struct colibri_model *m;
    colibri_cuda_plan_t plan;
    CUdeviceptr arena;
    CUdeviceptr wbase;       /* dv->wbase */
    float *host_logits;      /* page-locked (cuMemAllocHost): plan.logit_rows x vocab logits */
    int pass;                /* tokens per device pass: plan.chunk, or COLIBRI_CUDA_CHUNK below it */
    /* decode graph: captured on the first one-token forward, then launched once per token;
     * graph_off: the driver lacks the entry points, or a capture failed (plain launches) */
    CUgraphExec graph;
    int graph_off;
    int fuse_route; /* FFN norm + router + top-k as one cb_ffn_route launch (cb_route_fused) */
    colibri_cuda_info info;
};

static int cb_fail_d(const cb_driver *d, CUresult rc, const char *what, char *why,
                     size_t why_len) {
    const char *s = NULL;
    if (d->GetErrorString) d->GetErrorString(rc, &s);
    snprintf(why, why_len, "%s failed: %s (CUresult %d)", what, s ? s : "unknown error", rc);
    return -1;
}

static int cb_fail(colibri_cuda *cu, CUresult rc, const char *what, char *why, size_t why_len) {
    return cb_fail_d(&cu->d, rc, what, why, why_len);
}

#define CB_CHECK(call, what)                                                                     \
    do {                                                                                          \
        CUresult rc_ = (call);                                                                    \
        if (rc_ != CUDA_SUCCESS) return cb_fail(cu, rc_, what, why, why_len);                      \
    } while (0)

/* Device address of a pointer into the model file (NULL stays 0: absent tensor / no scales). */
static CUdeviceptr cb_dev(const colibri_cuda *cu, const void *host) {
    if (!host) return 0;
    const uint8_t *data = cu->m->base + cu->m->data_offset;
    return cu->wbase + (CUdeviceptr)((const uint8_t *)host - data);
}

static int cb_launch_fn(colibri_cuda *cu, CUfunction fn, const char *name, unsigned gx,
                        unsigned gy, unsigned bx, CUstream s, void **args, char *why,
                        size_t why_len) {
    if (gx == 0 || gy == 0) return 0;
    CB_CHECK(cu->d.LaunchKernel(fn, gx, gy, 1, bx, 1, 1, 0, s, args, NULL), name);
    return 0;
}

static int cb_launch(colibri_cuda *cu, int f, unsigned gx, unsigned gy, unsigned bx, CUstream s,
                     void **args, char *why, size_t why_len) {
    return cb_launch_fn(cu, cu->fn[f], cb_kernel_names[f], gx, gy, bx, s, args, why, why_len);
}

/* y[t, :] (+)= W x[t, :] (+ bias) for t < n */
/* pos_d: 0, or the parameter block's position (y's rows start that many rows further: the K/V
 * cache rows of a captured decode step) */
static int cb_linear_at(colibri_cuda *cu, CUstream s, CUdeviceptr y, int ys, CUdeviceptr x,
                        int xs, int n, const colibri_tensor *w, CUdeviceptr bias, int accumulate,
                        CUdeviceptr pos_d, char *why, size_t why_len) {
    CUdeviceptr wd = cb_dev(cu, w->data), sc = cb_dev(cu, w->scales);
    int dt = (int)w->dtype, rows = (int)w->rows, cols = (int)w->cols;
    void *a[] = {&y, &ys, &x, &xs, &n, &wd, &sc, &dt, &rows, &cols, &bias, &accumulate, &pos_d};
    unsigned grid[3], block[3];
    colibri_cuda_rows_launch(rows, n, grid, block);
    return cb_launch(cu, CB_F_LINEAR, grid[0], grid[1], block[0], s, a, why, why_len);
}

/* Every linear layer but the router (Q/K/V into their staging rows, WO, shared gate, LM head):
 * on the tensor cores in a prefill pass when colibri_cuda_use_mma says so (cb_linear_mma, same
 * arguments; grid 64 rows x 32 tokens), else the GEMV. */
/* n_pass: the tokens of the device pass the n rows belong to, which picks the kernel (the LM head
 * of a prompt's last row alone runs the kernel its whole pass would: the same bits as that row of
 * the full head, since a row's sums never depend on the other rows of its tile). */
static int cb_linear_of(colibri_cuda *cu, CUstream s, CUdeviceptr y, int ys, CUdeviceptr x,
                        int xs, int n, int n_pass, const colibri_tensor *w, CUdeviceptr bias,
                        int accumulate, char *why, size_t why_len) {
    if (colibri_cuda_use_mma(cu->tc[CB_T_LINEAR] != NULL, n_pass, (int)w->dtype)) {
        CUdeviceptr wd = cb_dev(cu, w->data), sc = cb_dev(cu, w->scales), pos_d = 0;
        int dt = (int)w->dtype, rows = (int)w->rows, cols = (int)w->cols;
        void *a[] = {&y, &ys, &x, &xs, &n, &wd, &sc, &dt, &rows, &cols, &bias, &accumulate, &pos_d};
        return cb_launch_fn(cu, cu->tc[CB_T_LINEAR], cb_tc_names[CB_T_LINEAR],
                            colibri_cuda_ceil_div((unsigned)rows, COLIBRI_CU_MMA_ROWS),
                            colibri_cuda_ceil_div((unsigned)n, COLIBRI_CU_MMA_TOKENS),
                            COLIBRI_CU_MMA_THREADS, s, a, why, why_len);
    }
    return cb_linear_at(cu, s, y, ys, x, xs, n, w, bias, accumulate, 0, why, why_len);
}

static int cb_linear(colibri_cuda *cu, CUstream s, CUdeviceptr y, int ys, CUdeviceptr x, int xs,
                     int n, const colibri_tensor *w, CUdeviceptr bias, int accumulate, char *why,
                     size_t why_len) {
    return cb_linear_of(cu, s, y, ys, x, xs, n, n, w, bias, accumulate, why, why_len);
}

/* pos_d, pos_rows: x and y start *pos_d * pos_rows rows further (0: they do not) */
static int cb_rmsnorm_at(colibri_cuda *cu, CUstream s, CUdeviceptr y, int ys, CUdeviceptr x,
                         int xs, int rows, const colibri_tensor *w, int len, int true_len,
                         CUdeviceptr pos_d, int pos_rows, char *why, size_t why_len) {
    CUdeviceptr wd = cb_dev(cu, w->data);
    float eps = cu->m->norm_eps;
    void *a[] = {&y, &ys, &x, &xs, &wd, &len, &true_len, &eps, &pos_d, &pos_rows};
    return cb_launch(cu, CB_F_RMSNORM, (unsigned)rows, 1, CB_WIDE, s, a, why, why_len);
}

static int cb_rmsnorm(colibri_cuda *cu, CUstream s, CUdeviceptr y, int ys, CUdeviceptr x, int xs,
                      int rows, const colibri_tensor *w, int len, int true_len, char *why,
                      size_t why_len) {
    return cb_rmsnorm_at(cu, s, y, ys, x, xs, rows, w, len, true_len, 0, 0, why, why_len);
}

/* q/k norm (the header's flag), RoPE and the KV-cache write of a chunk (cb_qk_rope_kv): reads
 * the Q/K/V projections' staging rows (plan.qkv), writes q (plan.q) and the cache rows of
 * positions pos.. of layer caches kc/vc. pos_d: 0, or the parameter block's position (decode
 * graph; pos is then 0). grid (n, H + Hkv), 256 threads: cb_rmsnorm's reduction shape. */
static int cb_qk_rope_kv(colibri_cuda *cu, CUstream s, int n, int pos, const colibri_layer *ly,
                         CUdeviceptr kc, CUdeviceptr vc, CUdeviceptr pos_d, char *why,
                         size_t why_len) {
    const struct colibri_model *m = cu->m;
    CUdeviceptr q = cu->arena + cu->plan.q, qkv = cu->arena + cu->plan.qkv;
    CUdeviceptr table = cu->arena + cu->plan.rope;
    int H = (int)m->n_heads, Hkv = (int)m->n_kv_heads, Dh = (int)m->head_dim;
    int norm = (m->flags & COLIBRI_FLAG_QK_NORM_HEAD) ? 1
               : (m->flags & COLIBRI_FLAG_QK_NORM_FULL) ? 2
                                                         : 0;
    CUdeviceptr qn = norm ? cb_dev(cu, ly->q_norm.data) : 0;
    CUdeviceptr kn = norm ? cb_dev(cu, ly->k_norm.data) : 0;
    float eps = m->norm_eps;
    int f16 = cu->plan.kv_f16;
    void *a[] = {&q, &qkv, &kc, &vc, &n, &H, &Hkv, &Dh, &pos, &table, &qn, &kn, &norm, &eps, &f16,
                 &pos_d};
    return cb_launch(cu, CB_F_QK_ROPE_KV, (unsigned)n, (unsigned)(H + Hkv), CB_WIDE, s, a, why,
                     why_len);
}

/* Fuse the FFN norm, the router and the top-k into cb_ffn_route? It needs the normed row in its
 * shared memory (Dp <= COLIBRI_CU_ROUTE_MAX_DP; wider models keep the 3 launches) and a router of
 * E rows over Dp columns in every layer (the format's shape). It pays only while every router
 * row gets its own warp (E <= COLIBRI_CU_ROUTE_WARPS): the fused kernel is one block per token,
 * so its router GEMV runs on one SM, while cb_linear spreads E rows over ceil(E/4) blocks; with
 * E = 64 that would read the router with 16 warps instead of 64 and lose more than the 2 saved
 * launches (docs/cuda.md, "Fused routing"). COLIBRI_CUDA_FUSE_ROUTE=0 never fuses, =1 fuses
 * whenever the row fits (to measure both on a GPU); the bits are the same either way. */
static int cb_route_fused(const struct colibri_model *m) {
    const char *env = getenv("COLIBRI_CUDA_FUSE_ROUTE");
    if (env && strcmp(env, "0") == 0) return 0;
    if (m->embed_dim_pad > COLIBRI_CU_ROUTE_MAX_DP) return 0;
    for (uint32_t l = 0; l < m->n_layers; l++)
        if (m->layers[l].router.rows != m->num_experts ||
            m->layers[l].router.cols != m->embed_dim_pad || m->layers[l].router_bias.data)
            return 0; /* (cb_ffn_route adds no router bias: gpt-oss keeps the 3 launches) */
    return (env && strcmp(env, "1") == 0) || m->num_experts <= COLIBRI_CU_ROUTE_WARPS;
}

/* h = FFN norm of x, then the router and the top-k of each token, in one launch: grid (n), one
 * block per token (cb_ffn_route); the same h, top_idx and top_w bits as cb_rmsnorm + cb_linear
 * (router) + cb_router_topk. The router logits buffer is not written. */
static int cb_ffn_route(colibri_cuda *cu, CUstream s, int n, const colibri_layer *ly, char *why,
                        size_t why_len) {
    const struct colibri_model *m = cu->m;
    const CUdeviceptr A = cu->arena;
    CUdeviceptr h = A + cu->plan.h, x = A + cu->plan.x, nw = cb_dev(cu, ly->ffn_norm.data);
    CUdeviceptr w = cb_dev(cu, ly->router.data), sc = cb_dev(cu, ly->router.scales);
    CUdeviceptr ti = A + cu->plan.top_idx, tw = A + cu->plan.top_w;
    int Dp = (int)m->embed_dim_pad, D = (int)m->embed_dim, dt = (int)ly->router.dtype;
    int E = (int)m->num_experts, k = (int)m->top_k, renorm = m->routing == COLIBRI_WEIGHTS_RENORM;
    float eps = m->norm_eps;
    void *a[] = {&h, &x, &Dp, &nw, &D, &eps, &w, &sc, &dt, &E, &k, &renorm, &ti, &tw};
    return cb_launch(cu, CB_F_ROUTE, (unsigned)n, 1, COLIBRI_CU_ROUTE_THREADS, s, a, why,
                     why_len);
}

int colibri_cuda_use_mma(int have_mma, int n, int dtype) {
    return have_mma && n > COLIBRI_CU_TOKEN_TILE && dtype != COLIBRI_DT_Q4;
}

/* SwiGLU over grouped slots: act = silu(W1 h) * (W3 h), out = W2 act, for `experts` experts whose
 * pointer tables start at `tab` (w1[e], w3[e], w2[e], s1[e], s3[e], s2[e]). The grid has `groups`
 * rows of blocks; block row g serves expert active[g] (cb_dispatch's list of experts with slots),
 * or expert g when active is 0 (the shared expert). n: tokens of the device pass; the up and the
 * down projection each run on the tensor cores when colibri_cuda_use_mma says so (a prefill pass
 * of more than 4 tokens, an sm_80+ image, not q4), else on the SIMT GEMV kernels. The choice
 * depends only on n, the dtypes and the image, so the same chunk schedule gives the same bits. */
static int cb_swiglu(colibri_cuda *cu, CUstream s, int n, CUdeviceptr act, int F,
                     CUdeviceptr out, CUdeviceptr perm, CUdeviceptr offsets, CUdeviceptr active,
                     CUdeviceptr tab, int experts, int groups, int dt_up, int dt_down, char *why,
                     size_t why_len) {
    const struct colibri_model *m = cu->m;
    int Dp = (int)m->embed_dim_pad;
    CUdeviceptr h = cu->arena + cu->plan.h;
    const CUdeviceptr step = (CUdeviceptr)experts * sizeof(CUdeviceptr);
    CUdeviceptr w1 = tab, w3 = tab + step, w2 = tab + 2 * step;
    CUdeviceptr s1 = tab + 3 * step, s3 = tab + 4 * step, s2 = tab + 5 * step;
    const int have = cu->tc[CB_T_UP] != NULL;
    void *up[] = {&act, &F, &h, &Dp, &perm, &offsets, &active, &w1, &w3, &s1, &s3, &dt_up};
    if (colibri_cuda_use_mma(have, n, dt_up)) {
        if (cb_launch_fn(cu, cu->tc[CB_T_UP], cb_tc_names[CB_T_UP],
                         colibri_cuda_ceil_div((unsigned)F, COLIBRI_CU_MMA_ROWS), (unsigned)groups,
                         COLIBRI_CU_MMA_THREADS, s, up, why, why_len))
            return -1;
    } else if (cb_launch(cu, CB_F_UP, colibri_cuda_ceil_div((unsigned)F, CB_ROW_WARPS),
                         (unsigned)groups, CB_ROW_THREADS, s, up, why, why_len)) {
        return -1;
    }
    void *down[] = {&out, &Dp, &act, &F, &offsets, &active, &w2, &s2, &dt_down};
    if (colibri_cuda_use_mma(have, n, dt_down))
        return cb_launch_fn(cu, cu->tc[CB_T_DOWN], cb_tc_names[CB_T_DOWN],
                            colibri_cuda_ceil_div((unsigned)Dp, COLIBRI_CU_MMA_ROWS),
                            (unsigned)groups, COLIBRI_CU_MMA_THREADS, s, down, why, why_len);
    return cb_launch(cu, CB_F_DOWN, colibri_cuda_ceil_div((unsigned)Dp, CB_ROW_WARPS),
                     (unsigned)groups, CB_ROW_THREADS, s, down, why, why_len);
}

/* ---- gpt-oss (#23): uploads and launches ----------------------------------------------------- */

/* Layer l's expert-bias pointers into plan.oss_bias: b1[E] b3[E] b2[E] per layer. */
static int cb_oss_upload_biases(colibri_cuda *cu, char *why, size_t why_len) {
    const struct colibri_model *m = cu->m;
    const size_t E = m->num_experts, bytes = cb_oss_bias_bytes(m);
    if (!bytes) return 0;
    CUdeviceptr *t = calloc(bytes / sizeof *t, sizeof *t);
    if (!t) {
        snprintf(why, why_len, "out of host memory for the expert bias tables");
        return -1;
    }
    for (uint32_t l = 0; l < m->n_layers; l++)
        for (size_t e = 0; e < E && m->layers[l].b1[0].data; e++) {
            const colibri_layer *ly = &m->layers[l];
            t[(l * 3 + 0) * E + e] = cb_dev(cu, ly->b1[e].data);
            t[(l * 3 + 1) * E + e] = cb_dev(cu, ly->b3[e].data);
            t[(l * 3 + 2) * E + e] = cb_dev(cu, ly->b2[e].data);
        }
    CUresult rc = cu->d.MemcpyHtoD(cu->arena + cu->plan.oss_bias, t, bytes);
    free(t);
    if (rc != CUDA_SUCCESS) return cb_fail(cu, rc, "cuMemcpyHtoD(expert bias tables)", why, why_len);
    return 0;
}

/* Routed experts of layer l through cb_oss_expert_up/down (the arguments of cb_swiglu's routed
 * launch, plus the bias tables and the SwiGLU's alpha/limit; limit 0: plain SwiGLU). SIMT in
 * decode and prefill. */
static int cb_oss_swiglu(colibri_cuda *cu, CUstream s, int l, CUdeviceptr tab, int groups,
                         char *why, size_t why_len) {
    const struct colibri_model *m = cu->m;
    const colibri_layer *ly = &m->layers[l];
    const CUdeviceptr A = cu->arena, step = (CUdeviceptr)m->num_experts * sizeof(CUdeviceptr);
    CUdeviceptr act = A + cu->plan.act, h = A + cu->plan.h, eo = A + cu->plan.expert_out;
    CUdeviceptr perm = A + cu->plan.perm, off = A + cu->plan.offsets, active = A + cu->plan.active;
    CUdeviceptr w1 = tab, w3 = tab + step, w2 = tab + 2 * step;
    CUdeviceptr s1 = tab + 3 * step, s3 = tab + 4 * step, s2 = tab + 5 * step;
    const int bias = (ly->desc.ffn_params[0] & COLIBRI_MOE_EXPERT_BIAS) != 0;
    const CUdeviceptr bt = A + cu->plan.oss_bias + (CUdeviceptr)l * 3 * step;
    CUdeviceptr b1 = bias ? bt : 0, b3 = bias ? bt + step : 0, b2 = bias ? bt + 2 * step : 0;
    const int clamp = (ly->desc.ffn_params[0] & COLIBRI_MOE_CLAMPED_SWIGLU) != 0;
    float alpha = 0.0f, limit = 0.0f; /* the record's f32 bits (layers/moe.c checked them) */
    if (clamp) {
        memcpy(&alpha, &ly->desc.ffn_params[1], sizeof alpha);
        memcpy(&limit, &ly->desc.ffn_params[2], sizeof limit);
    }
    int F = (int)m->expert_size, Dp = (int)m->embed_dim_pad;
    int dt_up = (int)ly->w1[0].dtype, dt_down = (int)ly->w2[0].dtype;
    void *up[] = {&act, &F, &h, &Dp, &perm, &off, &active, &w1, &w3, &s1, &s3, &dt_up, &b1, &b3,
                  &alpha, &limit};
    void *down[] = {&eo, &Dp, &act, &F, &off, &active, &w2, &s2, &dt_down, &b2};
    if (cb_launch_fn(cu, cu->oss[CB_O_UP], cb_oss_names[CB_O_UP],
                     colibri_cuda_ceil_div((unsigned)F, CB_ROW_WARPS), (unsigned)groups,
                     CB_ROW_THREADS, s, up, why, why_len))
        return -1;
    return cb_launch_fn(cu, cu->oss[CB_O_DOWN], cb_oss_names[CB_O_DOWN],
                        colibri_cuda_ceil_div((unsigned)Dp, CB_ROW_WARPS), (unsigned)groups,
                        CB_ROW_THREADS, s, down, why, why_len);
}

/* Attention of a chunk for a gpt-oss layer (cb_oss_layer): cb_oss_attention over the full cache
 * (every position kept; a sliding layer reads its window of it), sinks from the file. */
static int cb_oss_attention(colibri_cuda *cu, CUstream s, int n, int pos, int l, CUdeviceptr kc,
                            CUdeviceptr vc, CUdeviceptr pos_d, char *why, size_t why_len) {
    const struct colibri_model *m = cu->m;
    const colibri_layer_desc *d = &m->layers[l].desc;
    CUdeviceptr o = cu->arena + cu->plan.att, q = cu->arena + cu->plan.q, pd = pos_d;
    CUdeviceptr sinks = cb_dev(cu, m->layers[l].attn_sinks.data);
    int nn = n, pp = pos, H = (int)m->n_heads, Hkv = (int)m->n_kv_heads, Dh = (int)m->head_dim;
    int f16 = cu->plan.kv_f16;
    int window = d->mixer == COLIBRI_MIXER_SLIDING_ATTENTION && d->window < m->max_seq_len
                     ? (int)d->window : 0;
    void *a[] = {&o, &q, &kc, &vc, &nn, &pp, &H, &Hkv, &Dh, &f16, &window, &sinks, &pd};
    return cb_launch_fn(cu, cu->oss[CB_O_ATTENTION], cb_oss_names[CB_O_ATTENTION], (unsigned)H,
                        (unsigned)n, COLIBRI_CU_HEAD_THREADS, s, a, why, why_len);
}

void colibri_cuda_rope_table(float theta, int Dh, int positions, float *cs) {
    const int half = Dh / 2;
    for (int i = 0; i < half; i++) {
        /* the reference's inv_freq: exponent 2i/Dh in f32, theta^-e in double rounded to f32 */
        const float e = (float)(2 * i) / (float)Dh;
        const float inv_freq = (float)(1.0 / pow((double)theta, (double)e));
        for (int p = 0; p < positions; p++) {
            const float ang = (float)p * inv_freq; /* f32 product, as transformers forms it */
            cs[((size_t)p * half + i) * 2] = (float)cos((double)ang);
            cs[((size_t)p * half + i) * 2 + 1] = (float)sin((double)ang);
        }
    }
}

/* One weight dtype per grouped launch: every expert of a kind must share it. */
static int cb_expert_dtype(const colibri_tensor *a, const colibri_tensor *b, int count,
                           int *dtype) {
    *dtype = (int)a[0].dtype;
    for (int e = 0; e < count; e++)
        if ((int)a[e].dtype != *dtype || (b && (int)b[e].dtype != *dtype)) return -1;
    return 0;
}

/* Per layer: w1[E] w3[E] w2[E] s1[E] s3[E] s2[E], then the shared expert's six. */
static int cb_upload_tables(colibri_cuda *cu, char *why, size_t why_len) {
    const struct colibri_model *m = cu->m;
    const size_t E = m->num_experts, per = 6 * E + 6;
    CUdeviceptr *t = calloc(per * m->n_layers, sizeof *t);
    if (!t) {
        snprintf(why, why_len, "out of host memory for the expert pointer tables");
        return -1;
    }
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const colibri_layer *ly = &m->layers[l];
        CUdeviceptr *row = t + l * per;
        for (size_t e = 0; e < E; e++) {
            row[e] = cb_dev(cu, ly->w1[e].data);
            row[E + e] = cb_dev(cu, ly->w3[e].data);
            row[2 * E + e] = cb_dev(cu, ly->w2[e].data);
            row[3 * E + e] = cb_dev(cu, ly->w1[e].scales);
            row[4 * E + e] = cb_dev(cu, ly->w3[e].scales);
            row[5 * E + e] = cb_dev(cu, ly->w2[e].scales);
        }
        CUdeviceptr *sh = row + 6 * E;
        sh[0] = cb_dev(cu, ly->shared_w1.data);
        sh[1] = cb_dev(cu, ly->shared_w3.data);
        sh[2] = cb_dev(cu, ly->shared_w2.data);
        sh[3] = cb_dev(cu, ly->shared_w1.scales);
        sh[4] = cb_dev(cu, ly->shared_w3.scales);
        sh[5] = cb_dev(cu, ly->shared_w2.scales);
    }
    CUresult rc = cu->d.MemcpyHtoD(cu->arena + cu->plan.tables, t, per * m->n_layers * sizeof *t);
    free(t);
    if (rc != CUDA_SUCCESS) return cb_fail(cu, rc, "cuMemcpyHtoD(expert tables)", why, why_len);
    return 0;
}

/* COLIBRI_CUDA_WEIGHTS=map: register the mmapped data section for device access (no second
 * copy). The device must say it can (CU_DEVICE_ATTRIBUTE_INTEGRATED: the GPU reads the same DRAM,
 * so mapped reads do not cross PCIe; CAN_MAP_HOST_MEMORY; HOST_REGISTER_SUPPORTED, which NVIDIA
 * documents as 0 on some Tegra parts and L4T releases; READ_ONLY_HOST_REGISTER_SUPPORTED, since
 * the mapping is read-only and registering it writable would fail). Returns 0 when mapped;
 * otherwise non-zero, nothing held, and `why` says why the caller copies instead. */
static int cb_map_weights(colibri_cuda_device *cu, char *why, size_t why_len) {
    const struct colibri_model *m = cu->m;
    static const struct { int attr; const char *name; } need[] = {
        {CU_DEVICE_ATTRIBUTE_INTEGRATED, "not an integrated GPU (mapped reads would cross PCIe)"},
        {CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY, "CAN_MAP_HOST_MEMORY is 0"},
        {CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED, "HOST_REGISTER_SUPPORTED is 0"},
        {CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
         "READ_ONLY_HOST_REGISTER_SUPPORTED is 0"},
    };
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        int v = 0;
        if (cu->d.DeviceGetAttribute(&v, need[i].attr, cu->dev) != CUDA_SUCCESS || !v) {
            snprintf(why, why_len, "%s", need[i].name);
            return -1;
        }
    }
    if (!m->mapped) {
        snprintf(why, why_len, "the model is not a mapped file");
        return -1;
    }
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t data = (uintptr_t)(m->base + m->data_offset);
    const uintptr_t lo = data / page * page;
    const uintptr_t hi = ((uintptr_t)(m->base + m->file_size) + page - 1) / page * page;
    if (lo < (uintptr_t)m->base) {
        snprintf(why, why_len, "the data section does not start on a mapped page");
        return -1;
    }
    void *p = (void *)lo;
    CUresult r = cu->d.MemHostRegister(p, hi - lo,
                                       CU_MEMHOSTREGISTER_DEVICEMAP | CU_MEMHOSTREGISTER_READ_ONLY);
    if (r != CUDA_SUCCESS) {
        cb_fail_d(&cu->d, r, "cuMemHostRegister", why, why_len);
        return -1;
    }
    CUdeviceptr dp = 0;
    if ((r = cu->d.MemHostGetDevicePointer(&dp, p, 0)) != CUDA_SUCCESS) {
        cu->d.MemHostUnregister(p);
        cb_fail_d(&cu->d, r, "cuMemHostGetDevicePointer", why, why_len);
        return -1;
    }
    cu->registered = p;
    cu->wbase = dp + (CUdeviceptr)(data - lo);
    return 0;
}

/* The host pages of [lo, hi) of the mapped file, once on the device (or in a staging buffer):
 * the host never reads them again (cb_dev only does address arithmetic on the mapping), so they
 * are dropped to keep one copy resident. MADV_PAGEOUT (Linux 5.4+) first asks the kernel to
 * reclaim the file's page-cache pages of the range that only this process maps (on an integrated
 * GPU they share DRAM with the device copy; best effort: an older kernel refuses it, and they
 * stay clean and reclaimable); MADV_DONTNEED then unmaps them from the process (RSS). A later
 * host read would fault them back in from the file (read-only private mapping), so this is safe
 * whatever happens next. Rounded outward to whole pages: a partly dropped page only refaults. */
#ifndef MADV_PAGEOUT
#define MADV_PAGEOUT 21 /* linux/mman.h, Linux 5.4; absent from older libc headers */
#endif
static void cb_drop_host_range(const struct colibri_model *m, const uint8_t *lo,
                               const uint8_t *hi) {
    if (!m->mapped || hi <= lo) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = (uintptr_t)lo / page * page, b = ((uintptr_t)hi + page - 1) / page * page;
    const uintptr_t base = (uintptr_t)m->base / page * page;
    const uintptr_t end = ((uintptr_t)m->base + m->size + page - 1) / page * page;
    if (a < base) a = base;
    if (b > end) b = end;
    if (b <= a) return;
    (void)madvise((void *)a, b - a, MADV_PAGEOUT);
    (void)madvise((void *)a, b - a, MADV_DONTNEED);
}

/* Upload chunk size: 16 MiB. What the upload adds to the resident peak is three chunks (the two
 * staging buffers and the mapped pages of the chunk being staged), so small chunks matter on a
 * 4-8 GB Jetson; a copy of 16 MiB is long enough that the per-chunk driver calls are noise
 * (gpu-check times the open on the GPU). COLIBRI_CUDA_UPLOAD_KIB overrides it (tests: many chunks
 * on a small model), rounded up to whole pages. colibri_kit/model/footprint.py counts it. */
#define CB_UPLOAD_CHUNK ((size_t)16 << 20)
static size_t cb_upload_chunk(void) {
    const char *env = getenv("COLIBRI_CUDA_UPLOAD_KIB");
    const size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t c = env && atol(env) > 0 ? (size_t)atol(env) << 10 : CB_UPLOAD_CHUNK;
    return (c + page - 1) / page * page;
}

/* Copy the file's data section into the arena at wbase in chunks, so the host never holds more
 * than one chunk of it besides the device copy (on an integrated GPU both are the same DRAM: a
 * whole-file copy would peak at twice the weights). Each chunk is copied from the mapping into
 * one of two page-locked staging buffers (cuMemAllocHost), its pages are dropped, and it is sent
 * with cuMemcpyHtoDAsync, a true DMA that overlaps the next chunk's file read; a buffer is reused
 * once the event recorded after its copy has completed. If the staging buffers cannot be had, the
 * chunks go from the mapping with cuMemcpyHtoD (the driver stages pageable memory itself; the
 * call returns once the source may be reused, so the pages are dropped after it). Errors name
 * the chunk; nothing is left allocated or in flight on failure. */
static int cb_upload_weights(colibri_cuda_device *cu, CUstream s0, CUevent done[2], char *why,
                             size_t why_len) {
    const struct colibri_model *m = cu->m;
    const uint8_t *src = m->base + m->data_offset;
    const size_t total = cu->weights_bytes, step = cb_upload_chunk();
    const size_t nchunks = total ? (total + step - 1) / step : 0;
    uint8_t *stage = NULL;
    if (nchunks && cu->d.MemAllocHost((void **)&stage, 2 * (total < step ? total : step)) !=
                       CUDA_SUCCESS)
        stage = NULL;
    CUresult r = CUDA_SUCCESS;
    size_t i = 0;
    const char *what = "";
    size_t off = 0, len = 0;
    for (; i < nchunks; i++) {
        off = i * step;
        len = total - off < step ? total - off : step;
        if (stage) {
            uint8_t *buf = stage + (i & 1) * step;
            if (i >= 2 && (r = cu->d.EventSynchronize(done[i & 1])) != CUDA_SUCCESS) {
                what = "cuEventSynchronize";
                break;
            }
            memcpy(buf, src + off, len);
            cb_drop_host_range(m, src + off, src + off + len);
            if ((r = cu->d.MemcpyHtoDAsync(cu->wbase + off, buf, len, s0)) != CUDA_SUCCESS) {
                what = "cuMemcpyHtoDAsync";
                break;
            }
            if ((r = cu->d.EventRecord(done[i & 1], s0)) != CUDA_SUCCESS) {
                what = "cuEventRecord";
                break;
            }
        } else {
            if ((r = cu->d.MemcpyHtoD(cu->wbase + off, src + off, len)) != CUDA_SUCCESS) {
                what = "cuMemcpyHtoD";
                break;
            }
            cb_drop_host_range(m, src + off, src + off + len);
        }
    }
    /* wait for every queued copy (also after a failure: the staging buffers are freed next) */
    const CUresult sync = cu->d.StreamSynchronize(s0);
    if (stage) cu->d.MemFreeHost(stage);
    if (r != CUDA_SUCCESS) {
        char where[160];
        snprintf(where, sizeof where, "%s of weights chunk %zu of %zu (bytes %zu..%zu)", what,
                 i + 1, nchunks, off, off + len);
        return cb_fail_d(&cu->d, r, where, why, why_len);
    }
    if (sync != CUDA_SUCCESS)
        return cb_fail_d(&cu->d, sync, "weights upload (cuStreamSynchronize)", why, why_len);
    return 0;
}

/* ---- hybrid layers (#24): the checks, the partial RoPE table, the launches ------------------- */

/* The rotary width of the model's partial-RoPE layers (0: none). One RoPE table serves every
 * attention layer, so all of them must rotate the same width (Qwen3.5 / Qwen3-Next do). */
static int cb_rotary_width(const struct colibri_model *m) {
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const colibri_layer_desc *d = &m->layers[l].desc;
        if (d->mixer != COLIBRI_MIXER_GATED_DELTANET && (d->mixer_flags & COLIBRI_MIXER_FLAG_PARTIAL_ROPE))
            return (int)d->mixer_params[0];
    }
    return 0;
}

/* What the hybrid kernels cannot run: a DeltaNet key head wider than cb_dn_recur's shared q/k
 * (COLIBRI_CU_DN_MAX_DK), a state too large for cb_zero's int count, attention layers with
 * different rotary widths (one table), partial RoPE with a full-width q/k norm (the partial
 * kernel normalises per head, as Qwen does). */
static int cb_check_hybrid_layer(const struct colibri_model *m, uint32_t l, char *why,
                                 size_t why_len) {
    const colibri_layer_desc *d = &m->layers[l].desc;
    if (d->mixer == COLIBRI_MIXER_GATED_DELTANET) {
        if (d->mixer_params[2] > COLIBRI_CU_DN_MAX_DK) {
            snprintf(why, why_len, "layer %u (gated_deltanet): key head dim %u exceeds the CUDA "
                     "kernel's %d (colibri_abi.h COLIBRI_CU_DN_MAX_DK)", l, d->mixer_params[2],
                     COLIBRI_CU_DN_MAX_DK);
            return -1;
        }
        if (cb_state_at(m, m->n_layers) > 0x7fffffffu) {
            snprintf(why, why_len, "recurrent state of %zu floats exceeds 2^31 (cb_zero)",
                     cb_state_at(m, m->n_layers));
            return -1;
        }
        return 0;
    }
    const int partial = (d->mixer_flags & COLIBRI_MIXER_FLAG_PARTIAL_ROPE) != 0;
    const int R = cb_rotary_width(m);
    if ((partial ? (int)d->mixer_params[0] : 0) != R) {
        snprintf(why, why_len, "layer %u rotates %u lanes where another attention layer rotates "
                 "%d: the CUDA backend keeps one RoPE table", l,
                 partial ? d->mixer_params[0] : m->head_dim, R);
        return -1;
    }
    if (partial && (m->flags & COLIBRI_FLAG_QK_NORM_FULL)) {
        snprintf(why, why_len, "layer %u: partial RoPE with a full-width q/k norm, which the CUDA "
                 "kernels do not compute (Qwen's is per head)", l);
        return -1;
    }
    return 0;
}

/* The partial-RoPE table [positions, R/2, (cos, sin)]: angle p * theta^(-2i/R) in double, cos/sin
 * in double rounded to f32: layers/attention.c rope_partial's values. */
void colibri_cuda_rope_table_partial(float theta, int R, int positions, float *cs) {
    const int half = R / 2;
    for (int p = 0; p < positions; p++)
        for (int i = 0; i < half; i++) {
            const double a = (double)p * pow((double)theta, -2.0 * i / R);
            cs[((size_t)p * half + i) * 2] = (float)cos(a);
            cs[((size_t)p * half + i) * 2 + 1] = (float)sin(a);
        }
}

static int cb_check_model(const struct colibri_model *m, char *why, size_t why_len) {
    /* the router kernels sort at most COLIBRI_CU_MAX_SORT experts in shared memory (Qwen3-Next's
     * 512 run on the CPU) */
    if (m->top_k > 16 || m->num_experts > COLIBRI_CU_MAX_SORT || m->num_experts > COLIBRI_MAX_EXPERTS) {
        snprintf(why, why_len, "model routing (E=%u, top_k=%u) exceeds the CUDA kernels' limits "
                 "(E <= %d, top_k <= 16)", m->num_experts, m->top_k, COLIBRI_CU_MAX_SORT);
        return -1;
    }
    for (uint32_t l = 0; l < m->n_layers; l++) {
        /* the kernels compute attention (full, sliding: cb_oss_attention, Qwen's gated attention)
         * and gated_deltanet mixers with moe */
        const colibri_layer_desc *d = &m->layers[l].desc;
        if (!(d->mixer == COLIBRI_MIXER_ATTENTION || d->mixer == COLIBRI_MIXER_GATED_DELTANET ||
              d->mixer == COLIBRI_MIXER_SLIDING_ATTENTION) ||
            d->ffn != COLIBRI_FFN_MOE) {
            const colibri_layer_kind *mk = m->layers[l].mixer, *fk = m->layers[l].ffn;
            snprintf(why, why_len, "layer %u is %s + %s, a layer kind the CUDA backend does not "
                     "run yet (it runs attention or gated_deltanet + moe)", l, mk ? mk->name : "?",
                     fk ? fk->name : "?");
            return -1;
        }
        if (cb_check_hybrid_layer(m, l, why, why_len)) return -1;
        /* gpt-oss (#23): cb_oss_attention holds a head of up to 256 lanes; cb_oss_expert_up/down
         * read f32/f16/bf16/int8/mxfp4 experts (q4 experts keep cb_expert_up, which has no
         * biases or clamp) */
        const colibri_layer *ly = &m->layers[l];
        if (cb_oss_layer(m, (int)l) && m->head_dim > 256) {
            snprintf(why, why_len, "layer %u: attention sinks / a sliding window with head_dim "
                     "%u; the CUDA kernel holds at most 256", l, m->head_dim);
            return -1;
        }
        if (cb_oss_experts(ly) && (ly->w1[0].dtype == COLIBRI_DT_Q4 || ly->w2[0].dtype == COLIBRI_DT_Q4)) {
            snprintf(why, why_len, "layer %u: q4 experts with gpt-oss's expert biases or clamped "
                     "SwiGLU, which the CUDA kernels do not compute (convert the experts to "
                     "mxfp4 or int8)", l);
            return -1;
        }
    }
    if (cb_rotary_width(m) && (m->flags & COLIBRI_FLAG_ROPE_YARN)) { /* one table: not both */
        snprintf(why, why_len, "partial RoPE with YaRN scaling, which the CUDA kernels do not "
                 "compute (one RoPE table: YaRN's full width or the partial one)");
        return -1;
    }
    /* mxfp4 is read by the expert kernels only: an mxfp4 embedding, attention, router or LM
     * head (`--dtype mxfp4`) runs on the CPU; released gpt-oss keeps those bf16 */
    const colibri_tensor *dense[] = {&m->tok_embed, &m->lm_head};
    for (size_t i = 0; i < 2; i++)
        if (dense[i]->data && dense[i]->dtype == COLIBRI_DT_MXFP4) {
            snprintf(why, why_len, "mxfp4 %s, which the CUDA kernels do not read (only mxfp4 "
                     "experts; convert with --expert-dtype mxfp4)", i ? "LM head" : "embedding");
            return -1;
        }
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const colibri_layer *ly = &m->layers[l];
        const colibri_tensor *t[] = {&ly->wq, &ly->wk, &ly->wv, &ly->wo, &ly->router,
                                     &ly->shared_w1, &ly->shared_w3, &ly->shared_w2};
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
            if (t[i]->data && t[i]->dtype == COLIBRI_DT_MXFP4) {
                snprintf(why, why_len, "layer %u has mxfp4 attention/router/shared-expert weights, "
                         "which the CUDA kernels do not read (only mxfp4 experts; convert with "
                         "--expert-dtype mxfp4)", l);
                return -1;
            }
    }
    for (uint32_t l = 0; l < m->n_layers; l++) {
        const colibri_layer *ly = &m->layers[l];
        int dt;
        if (cb_expert_dtype(ly->w1, ly->w3, (int)m->num_experts, &dt) ||
            cb_expert_dtype(ly->w2, NULL, (int)m->num_experts, &dt) ||
            ((m->flags & COLIBRI_FLAG_SHARED_EXPERT) && ly->shared_w1.dtype != ly->shared_w3.dtype)) {
            snprintf(why, why_len, "layer %u mixes weight dtypes across experts; the CUDA backend "
                     "needs one dtype per expert matrix kind (re-convert with one --dtype)", l);
            return -1;
        }
    }
    return 0;
}

int colibri_cuda_device_open(colibri_cuda_device **out, const struct colibri_model *m,
                             char *why, size_t why_len) {
    *out = NULL;
    if (cb_check_model(m, why, why_len)) return -1;
    colibri_cuda_device *cu = calloc(1, sizeof *cu);
    if (!cu) {
        snprintf(why, why_len, "out of host memory for the CUDA backend");
        return -1;
    }
    cu->m = m;
    if (cb_driver_load(&cu->d, why, why_len)) {
        free(cu);
        return -1;
    }
    *out = cu; /* from here colibri_cuda_device_close releases whatever was acquired */
    CUstream up = NULL;
    CUevent done[2] = {NULL, NULL};
    CUresult r = cu->d.Init(0);
    if (r != CUDA_SUCCESS) {
        cb_fail_d(&cu->d, r, "cuInit", why, why_len);
        goto fail;
    }
    int count = 0;
    if ((r = cu->d.DeviceGetCount(&count)) != CUDA_SUCCESS || count < 1) {
        if (r == CUDA_SUCCESS) snprintf(why, why_len, "no CUDA device visible to the driver");
        else cb_fail_d(&cu->d, r, "cuDeviceGetCount", why, why_len);
        goto fail;
    }
    int major = 0, minor = 0, integrated = 0, can_map = 0;
    if ((r = cu->d.DeviceGet(&cu->dev, 0)) != CUDA_SUCCESS ||
        (r = cu->d.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                      cu->dev)) != CUDA_SUCCESS ||
        (r = cu->d.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                      cu->dev)) != CUDA_SUCCESS ||
        (r = cu->d.DeviceGetAttribute(&integrated, CU_DEVICE_ATTRIBUTE_INTEGRATED, cu->dev)) !=
            CUDA_SUCCESS ||
        (r = cu->d.DeviceGetAttribute(&can_map, CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY,
                                      cu->dev)) != CUDA_SUCCESS ||
        (r = cu->d.DeviceGetName(cu->info.device_name, (int)sizeof cu->info.device_name,
                                 cu->dev)) != CUDA_SUCCESS ||
        (r = cu->d.DriverGetVersion(&cu->info.driver_version)) != CUDA_SUCCESS) {
        cb_fail_d(&cu->d, r, "querying CUDA device 0", why, why_len);
        goto fail;
    }
    cu->info.sm = major * 10 + minor;
    cu->info.integrated = integrated;
    snprintf(cu->info.libcuda, sizeof cu->info.libcuda, "%s", cu->d.path);

    int img = colibri_cuda_pick_image(colibri_kernel_images, colibri_kernel_image_count,
                                      cu->info.sm, why, why_len);
    if (img < 0) goto fail;
    const colibri_kernel_image *ki = &colibri_kernel_images[img];
    snprintf(cu->info.image, sizeof cu->info.image, "%s", ki->kind);

    if ((r = cu->d.CtxCreate(&cu->ctx, CU_CTX_MAP_HOST, cu->dev)) != CUDA_SUCCESS) {
        cu->ctx = NULL;
        cb_fail_d(&cu->d, r, "cuCtxCreate", why, why_len);
        goto fail;
    }
    /* cuCtxCreate made ctx current on this thread; every context of the model pushes it on
     * whatever thread calls (a CUDA context may be current on several threads at once) */
    char jit_log[512] = "";
    int opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
    void *vals[] = {jit_log, (void *)(uintptr_t)sizeof jit_log};
    if ((r = cu->d.ModuleLoadDataEx(&cu->mod, ki->data, 2, opts, vals)) != CUDA_SUCCESS) {
        char what[160];
        char *nl = strchr(jit_log, '\n');
        if (nl) *nl = '\0';
        snprintf(what, sizeof what, "loading the %s %s_%d kernels on driver %d%s%.60s", ki->kind,
                 strcmp(ki->kind, "ptx") == 0 ? "compute" : "sm", ki->sm, cu->info.driver_version,
                 jit_log[0] ? ": " : "", jit_log);
        cu->mod = NULL;
        cb_fail_d(&cu->d, r, what, why, why_len);
        goto fail;
    }
    for (int f = 0; f < CB_F_COUNT; f++) {
        if ((r = cu->d.ModuleGetFunction(&cu->fn[f], cu->mod, cb_kernel_names[f])) !=
            CUDA_SUCCESS) {
            cb_fail_d(&cu->d, r, cb_kernel_names[f], why, why_len);
            goto fail;
        }
    }
    for (int f = 0; f < CB_H_COUNT; f++) {
        if ((r = cu->d.ModuleGetFunction(&cu->hy[f], cu->mod, cb_hy_names[f])) != CUDA_SUCCESS) {
            cb_fail_d(&cu->d, r, cb_hy_names[f], why, why_len);
            goto fail;
        }
    }
    {
        int found = 0;
        for (int f = 0; f < CB_T_COUNT; f++)
            found += cu->d.ModuleGetFunction(&cu->tc[f], cu->mod, cb_tc_names[f]) == CUDA_SUCCESS;
        if (found != CB_T_COUNT) memset(cu->tc, 0, sizeof cu->tc); /* all or none */
        snprintf(cu->info.prefill, sizeof cu->info.prefill, "%s",
                 found == CB_T_COUNT ? "mma" : "simt");
    }
    for (int f = 0; f < CB_O_COUNT; f++) {
        if ((r = cu->d.ModuleGetFunction(&cu->oss[f], cu->mod, cb_oss_names[f])) != CUDA_SUCCESS) {
            cb_fail_d(&cu->d, r, cb_oss_names[f], why, why_len);
            goto fail;
        }
    }

    /* weights: one copy on the device, uploaded in chunks, by default on every GPU.
     * COLIBRI_CUDA_WEIGHTS=map opts into the device-mapped file on an integrated GPU (no second
     * copy). Not the default until gpu-check has measured it on a Jetson: GPU reads of registered
     * host memory may take the I/O-coherency path on some Tegra parts, and llama.cpp keeps its
     * weights in device allocations on Jetson. A discrete GPU always copies (mapped reads would
     * cross PCIe). */
    const char *wmode = getenv("COLIBRI_CUDA_WEIGHTS");
    if (wmode && *wmode && strcmp(wmode, "copy") != 0 && strcmp(wmode, "map") != 0) {
        snprintf(why, why_len, "COLIBRI_CUDA_WEIGHTS must be copy or map, got '%.32s'", wmode);
        goto fail;
    }
    const int want_map = wmode && strcmp(wmode, "map") == 0;
    (void)can_map; /* cb_map_weights checks every attribute the mapping needs */
    const int mapped = want_map ? cb_map_weights(cu, cu->info.weights_why,
                                                 sizeof cu->info.weights_why) == 0
                                : 0;
    if (!mapped) {
        cu->weights_bytes = (size_t)(m->file_size - m->data_offset);
        if (cu->weights_bytes &&
            (r = cu->d.MemAlloc(&cu->weights, cu->weights_bytes)) != CUDA_SUCCESS) {
            char what[96];
            cu->weights = 0;
            snprintf(what, sizeof what, "cuMemAlloc(%zu MiB of weights)", cu->weights_bytes >> 20);
            cb_fail_d(&cu->d, r, what, why, why_len);
            goto fail;
        }
        cu->wbase = cu->weights;
        /* the upload's own stream and two events (a context's are not made yet) */
        if ((r = cu->d.StreamCreate(&up, CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS ||
            (r = cu->d.EventCreate(&done[0], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS ||
            (r = cu->d.EventCreate(&done[1], CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
            cb_fail_d(&cu->d, r, "creating the upload stream", why, why_len);
            goto fail;
        }
        if (cb_upload_weights(cu, up, done, why, why_len)) goto fail;
        /* the pageable fallback's cuMemcpyHtoD may return before its DMA has landed (NVIDIA's
         * "API synchronization behavior"): every copy is complete before any kernel runs */
        if ((r = cu->d.CtxSynchronize()) != CUDA_SUCCESS) {
            cb_fail_d(&cu->d, r, "weights upload (cuCtxSynchronize)", why, why_len);
            goto fail;
        }
        cu->d.EventDestroy(done[0]);
        cu->d.EventDestroy(done[1]);
        cu->d.StreamDestroy(up);
        up = NULL;
        done[0] = done[1] = NULL;
    }
    snprintf(cu->info.weights, sizeof cu->info.weights, "%s", mapped ? "mapped" : "copied");
    (void)COLIBRI_IGPU; /* the profile's expectation; the device attribute decides */
    CUcontext popped;
    cu->d.CtxPopCurrent(&popped);
    return 0;
fail:
    if (cu->ctx) {
        for (int i = 0; i < 2; i++)
            if (done[i]) cu->d.EventDestroy(done[i]);
        if (up) cu->d.StreamDestroy(up);
    }
    colibri_cuda_device_close(cu);
    *out = NULL;
    return -1;
}

void colibri_cuda_device_close(colibri_cuda_device *cu) {
    if (!cu) return;
    if (cu->d.lib) {
        if (cu->ctx) {
            cu->d.CtxPushCurrent(cu->ctx);
            if (cu->weights) cu->d.MemFree(cu->weights);
            if (cu->registered) cu->d.MemHostUnregister(cu->registered);
            if (cu->mod) cu->d.ModuleUnload(cu->mod);
            CUcontext popped;
            cu->d.CtxPopCurrent(&popped);
            cu->d.CtxDestroy(cu->ctx);
        }
        cb_driver_unload(&cu->d);
    }
    free(cu);
}

const colibri_cuda_info *colibri_cuda_device_info(const colibri_cuda_device *dv) {
    return &dv->info;
}

int colibri_cuda_open_on(colibri_cuda **out, colibri_cuda_device *dv, int stream_count,
                         int kv_f16, char *why, size_t why_len) {
    *out = NULL;
    colibri_cuda *cu = calloc(1, sizeof *cu);
    if (!cu) {
        snprintf(why, why_len, "out of host memory for the CUDA backend");
        return -1;
    }
    const struct colibri_model *m = dv->m;
    cu->m = m;
    cu->dv = dv;
    cu->d = dv->d;
    cu->dev = dv->dev;
    cu->ctx = dv->ctx;
    cu->mod = dv->mod;
    memcpy(cu->fn, dv->fn, sizeof cu->fn);
    memcpy(cu->tc, dv->tc, sizeof cu->tc);
    memcpy(cu->hy, dv->hy, sizeof cu->hy);
    cu->state_dirty = 1; /* device memory starts undefined: the state is zeroed before the first pass */
    memcpy(cu->oss, dv->oss, sizeof cu->oss);
    cu->wbase = dv->wbase;
    cu->info = dv->info;
    *out = cu; /* from here colibri_cuda_close releases whatever was acquired */
    int rc = -1;
    CUresult r;
    if ((r = cu->d.CtxPushCurrent(cu->ctx)) != CUDA_SUCCESS) {
        cb_fail(cu, r, "cuCtxPushCurrent", why, why_len);
        cu->ctx = NULL; /* not pushed: close must not pop it */
        goto fail;
    }

    cu->nstreams = stream_count >= 2 ? 2 : 1;
    {
        /* COLIBRI_CUDA_STREAMS=1|2 overrides the build's COLIBRI_STREAM_COUNT: gpu-check runs the
         * second stream's path (every Jetson profile's) on a host build, whose profile has 1 */
        const char *env = getenv("COLIBRI_CUDA_STREAMS");
        if (env && (strcmp(env, "1") == 0 || strcmp(env, "2") == 0)) cu->nstreams = atoi(env);
    }
    for (int s = 0; s < cu->nstreams; s++)
        if ((r = cu->d.StreamCreate(&cu->stream[s], CU_STREAM_NON_BLOCKING)) != CUDA_SUCCESS) {
            cb_fail(cu, r, "cuStreamCreate", why, why_len);
            goto fail;
        }
    if ((r = cu->d.EventCreate(&cu->ev_h, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS ||
        (r = cu->d.EventCreate(&cu->ev_shared, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        cb_fail(cu, r, "cuEventCreate", why, why_len);
        goto fail;
    }
    if (colibri_cuda_plan(m, kv_f16, &cu->plan)) {
        snprintf(why, why_len, "model geometry unsupported by the CUDA backend");
        goto fail;
    }
    if ((r = cu->d.MemAlloc(&cu->arena, cu->plan.total)) != CUDA_SUCCESS) {
        char what[96];
        cu->arena = 0;
        snprintf(what, sizeof what, "cuMemAlloc(%zu MiB arena)", cu->plan.total >> 20);
        cb_fail(cu, r, what, why, why_len);
        goto fail;
    }
    {
        const size_t bytes = (size_t)cu->plan.logit_rows * m->vocab_size * sizeof(float);
        if ((r = cu->d.MemAllocHost((void **)&cu->host_logits, bytes)) != CUDA_SUCCESS) {
            cu->host_logits = NULL;
            cb_fail(cu, r, "cuMemAllocHost(logits buffer)", why, why_len);
            goto fail;
        }
    }
    /* what this context keeps on the device: its arena, and the model's weights copy, which
     * every context of the model shares */
    cu->info.device_bytes = cu->plan.total + dv->weights_bytes;
    cu->info.kv_f16 = cu->plan.kv_f16;
    cu->info.kv_cache_bytes = cu->plan.kv_bytes;
    if (cb_upload_tables(cu, why, why_len) || cb_oss_upload_biases(cu, why, why_len)) goto fail;
    {
        const size_t count = (size_t)m->max_seq_len * (m->head_dim / 2) * 2;
        float *cs = malloc(count * sizeof *cs + 1);
        if (!cs) {
            snprintf(why, why_len, "out of host memory for the RoPE table");
            goto fail;
        }
        if (m->flags & COLIBRI_FLAG_ROPE_YARN)
            cb_oss_rope_table(m, cs); /* the CPU's own YaRN table (core/rope.c) */
        else if (cb_rotary_width(m)) /* Qwen's partial RoPE: the table of its rotary width */
            colibri_cuda_rope_table_partial(m->rope_theta, cb_rotary_width(m), (int)m->max_seq_len,
                                            cs);
        else
            colibri_cuda_rope_table(m->rope_theta, (int)m->head_dim, (int)m->max_seq_len, cs);
        r = cu->d.MemcpyHtoD(cu->arena + cu->plan.rope, cs, count * sizeof *cs);
        free(cs);
        if (r != CUDA_SUCCESS) {
            cb_fail(cu, r, "cuMemcpyHtoD(RoPE table)", why, why_len);
            goto fail;
        }
    }
    int *iota = malloc((size_t)cu->plan.chunk * sizeof *iota);
    if (!iota) {
        snprintf(why, why_len, "out of host memory");
        goto fail;
    }
    for (int i = 0; i < cu->plan.chunk; i++) iota[i] = i;
    r = cu->d.MemcpyHtoD(cu->arena + cu->plan.iota, iota, (size_t)cu->plan.chunk * sizeof *iota);
    free(iota);
    if (r != CUDA_SUCCESS) {
        cb_fail(cu, r, "cuMemcpyHtoD(iota)", why, why_len);
        goto fail;
    }
    {
        int prm[CB_PRM_BYTES / 4] = {0};
        prm[CB_PRM_SHARED_OFF] = 0;
        prm[CB_PRM_SHARED_OFF + 1] = 1; /* a decode step's one token is the shared expert's slot */
        if ((r = cu->d.MemcpyHtoD(cu->arena + cu->plan.prm, prm, sizeof prm)) != CUDA_SUCCESS) {
            cb_fail(cu, r, "cuMemcpyHtoD(parameter block)", why, why_len);
            goto fail;
        }
    }
    /* The tables above went up with cuMemcpyHtoD from pageable memory, which may return before
     * the DMA has landed, on the legacy stream, which the kernels' non-blocking streams do not
     * wait for: complete them before any kernel can run. */
    if ((r = cu->d.CtxSynchronize()) != CUDA_SUCCESS) {
        cb_fail(cu, r, "setup copies (cuCtxSynchronize)", why, why_len);
        goto fail;
    }
    /* COLIBRI_CUDA_CHUNK=N: passes of at most N tokens (tests compare chunk schedules) */
    cu->pass = cu->plan.chunk;
    {
        const char *env = getenv("COLIBRI_CUDA_CHUNK");
        if (env && atoi(env) > 0 && atoi(env) < cu->pass) cu->pass = atoi(env);
    }
    cu->info.chunk = cu->pass;
    /* COLIBRI_CUDA_GRAPH=0: plain launches in decode too, to measure what the graph saves */
    const char *gmode = getenv("COLIBRI_CUDA_GRAPH");
    cu->graph_off = cu->d.GraphLaunch == NULL || (gmode && strcmp(gmode, "0") == 0);
    cu->fuse_route = cb_route_fused(m);
    CUcontext popped;
    cu->d.CtxPopCurrent(&popped);
    return 0;
fail:
    if (cu->ctx) {
        CUcontext pushed;
        cu->d.CtxPopCurrent(&pushed);
    }
    colibri_cuda_close(cu);
    *out = NULL;
    return rc;
}


int colibri_cuda_open(colibri_cuda **out, const struct colibri_model *m, int stream_count,
                      int kv_f16, char *why, size_t why_len) {
    colibri_cuda_device *dv;
    *out = NULL;
    if (colibri_cuda_device_open(&dv, m, why, why_len)) return -1;
    if (colibri_cuda_open_on(out, dv, stream_count, kv_f16, why, why_len)) {
        colibri_cuda_device_close(dv);
        return -1;
    }
    (*out)->owns_dv = 1;
    return 0;
}

/* Output norm and LM head of `rows` rows of the pass (from row row0) into the logits buffer's
 * first rows; n_pass picks the LM head's kernel (cb_linear_of). */
static int cb_head(colibri_cuda *cu, int row0, int rows, int n_pass, char *why, size_t why_len) {
    const struct colibri_model *m = cu->m;
    const int Dp = (int)m->embed_dim_pad, D = (int)m->embed_dim, V = (int)m->vocab_size;
    const CUdeviceptr off = (CUdeviceptr)row0 * (CUdeviceptr)Dp * 4;
    const CUdeviceptr x = cu->arena + cu->plan.x + off, h = cu->arena + cu->plan.h + off;
    CUstream s0 = cu->stream[0];
    if (cb_rmsnorm(cu, s0, h, Dp, x, Dp, rows, &m->output_norm, Dp, D, why, why_len) ||
        cb_linear_of(cu, s0, cu->arena + cu->plan.logits, V, h, Dp, rows, n_pass, &m->lm_head, 0,
                     0, why, why_len))
        return -1;
    return 0;
}

static int cb_launch_hy(colibri_cuda *cu, int f, unsigned gx, unsigned gy, unsigned bx, CUstream s,
                        void **args, char *why, size_t why_len) {
    return cb_launch_fn(cu, cu->hy[f], cb_hy_names[f], gx, gy, bx, s, args, why, why_len);
}

/* A Gated DeltaNet mixer over the pass's n tokens (layers/deltanet.c's steps, on stream s):
 * attention norm -> h; the four in-projections (cb_linear) into the mixer scratch, laid out as the
 * CPU's [qkv | conv out | z | b | a | o], `chunk` rows each; the causal convolution + SiLU with
 * the layer's conv state (cb_dn_conv); L2-norm, decay and beta, the delta rule token by token and
 * the gated RMSNorm (cb_dn_recur, one block per value head); x += DN_OUT o. Nothing depends on
 * the position, so the decode graph captures it as it is. */
static int cb_deltanet_layer(colibri_cuda *cu, CUstream s, int n, int l, char *why,
                             size_t why_len) {
    const struct colibri_model *m = cu->m;
    const colibri_layer *ly = &m->layers[l];
    const colibri_cuda_plan_t *p = &cu->plan;
    const uint32_t *mp = ly->desc.mixer_params;
    int Hk = (int)mp[0], Hv = (int)mp[1], Dk = (int)mp[2], Dv = (int)mp[3], W = (int)ly->desc.window;
    int C = 2 * Hk * Dk + Hv * Dv, vd = Hv * Dv, nn = n;
    const int Dp = (int)m->embed_dim_pad, D = (int)m->embed_dim;
    const CUdeviceptr T = (CUdeviceptr)p->chunk * 4, x = cu->arena + p->x, h = cu->arena + p->h;
    CUdeviceptr qkv = cu->arena + p->mix, u = qkv + T * C, z = u + T * C, b = z + T * vd;
    CUdeviceptr a = b + T * Hv, o = a + T * Hv;
    CUdeviceptr conv = cu->arena + p->state + cb_state_at(m, (uint32_t)l) * 4;
    CUdeviceptr rec = conv + (CUdeviceptr)(W - 1) * C * 4;
    if (cb_rmsnorm(cu, s, h, Dp, x, Dp, n, &ly->attn_norm, Dp, D, why, why_len) ||
        cb_linear(cu, s, qkv, C, h, Dp, n, &ly->dn_qkv, 0, 0, why, why_len) ||
        cb_linear(cu, s, z, vd, h, Dp, n, &ly->dn_z, 0, 0, why, why_len) ||
        cb_linear(cu, s, b, Hv, h, Dp, n, &ly->dn_b, 0, 0, why, why_len) ||
        cb_linear(cu, s, a, Hv, h, Dp, n, &ly->dn_a, 0, 0, why, why_len))
        return -1;
    CUdeviceptr cw = cb_dev(cu, ly->dn_conv.data);
    void *ca[] = {&u, &qkv, &conv, &cw, &nn, &C, &W};
    if (cb_launch_hy(cu, CB_H_DN_CONV, colibri_cuda_ceil_div((unsigned)C, CB_WIDE), 1, CB_WIDE, s,
                     ca, why, why_len))
        return -1;
    CUdeviceptr al = cb_dev(cu, ly->dn_a_log.data), dt = cb_dev(cu, ly->dn_dt_bias.data);
    CUdeviceptr nw = cb_dev(cu, ly->dn_norm.data);
    float eps = m->norm_eps;
    void *ra[] = {&o, &rec, &u, &z, &b, &a, &al, &dt, &nw, &nn, &Hk, &Hv, &Dk, &Dv, &eps};
    if (cb_launch_hy(cu, CB_H_DN_RECUR, (unsigned)Hv, 1, CB_HEAD, s, ra, why, why_len)) return -1;
    return cb_linear(cu, s, x, Dp, o, vd, n, &ly->dn_out, 0, 1, why, why_len);
}

/* Qwen's partial RoPE (cb_qk_rope_partial_kv: cb_qk_rope_kv's work on the first R lanes, from
 * the partial table in plan.rope). */
static int cb_qk_rope_partial(colibri_cuda *cu, CUstream s, int n, int pos, const colibri_layer *ly,
                              CUdeviceptr kc, CUdeviceptr vc, CUdeviceptr pos_d, char *why,
                              size_t why_len) {
    const struct colibri_model *m = cu->m;
    CUdeviceptr q = cu->arena + cu->plan.q, qkv = cu->arena + cu->plan.qkv;
    CUdeviceptr table = cu->arena + cu->plan.rope;
    int H = (int)m->n_heads, Hkv = (int)m->n_kv_heads, Dh = (int)m->head_dim;
    int R = (int)ly->desc.mixer_params[0];
    int norm = (m->flags & COLIBRI_FLAG_QK_NORM_HEAD) ? 1 : 0;
    CUdeviceptr qn = norm ? cb_dev(cu, ly->q_norm.data) : 0;
    CUdeviceptr kn = norm ? cb_dev(cu, ly->k_norm.data) : 0;
    float eps = m->norm_eps;
    int f16 = cu->plan.kv_f16;
    void *a[] = {&q, &qkv, &kc, &vc, &H, &Hkv, &Dh, &R, &pos, &table, &qn, &kn, &norm, &eps, &f16,
                 &pos_d};
    return cb_launch_hy(cu, CB_H_ROPE_PARTIAL, (unsigned)n, (unsigned)(H + Hkv), CB_WIDE, s, a,
                        why, why_len);
}

/* The recurrent state zeroed on stream 0 (open and colibri_reset leave it to the next pass). */
static int cb_zero_state(colibri_cuda *cu, char *why, size_t why_len) {
    cu->state_dirty = 0;
    if (!cu->plan.state_bytes) return 0;
    CUdeviceptr st = cu->arena + cu->plan.state;
    int count = (int)(cu->plan.state_bytes / 4);
    void *a[] = {&st, &count};
    unsigned g = colibri_cuda_ceil_div((unsigned)count, CB_WIDE);
    return cb_launch_hy(cu, CB_H_ZERO, g < 1024 ? g : 1024, 1, CB_WIDE, cu->stream[0], a, why,
                        why_len);
}

/* The kernels of one chunk of n <= plan.chunk tokens at positions pos.. pos+n-1, issued on the
 * streams; the ids are already in the arena. graph: a one-token decode step being captured, whose
 * token id and position are read on the device from the parameter block (plan.prm) instead of
 * being kernel arguments or host pointer arithmetic (pos is then 0), and whose attention grid
 * covers every KV range of the cache (blocks past the step's ranges return), so one capture
 * serves every position. With graph 0 the launches are those of a plain forward, and both give
 * the same bits: the same kernels add in the same order over the same addresses. */
static int cb_issue_chunk(colibri_cuda *cu, int n, int pos, int graph, char *why,
                          size_t why_len) {
    const struct colibri_model *m = cu->m;
    const colibri_cuda_plan_t *p = &cu->plan;
    const CUdeviceptr A = cu->arena;
    CUstream s0 = cu->stream[0], s1 = cu->nstreams > 1 ? cu->stream[1] : cu->stream[0];
    const int Dp = (int)m->embed_dim_pad, D = (int)m->embed_dim, H = (int)m->n_heads;
    const int Hkv = (int)m->n_kv_heads, Dh = (int)m->head_dim, E = (int)m->num_experts;
    const int k = (int)m->top_k, S = (int)m->max_seq_len, V = (int)m->vocab_size;
    const int HD = H * Dh, kvd = Hkv * Dh;
    const int shared = (m->flags & COLIBRI_FLAG_SHARED_EXPERT) != 0;
    const int gated = (m->flags & COLIBRI_FLAG_SHARED_EXPERT_GATE) != 0;
    const CUdeviceptr x = A + p->x, h = A + p->h, q = A + p->q, att = A + p->att;
    /* graph: the position on the device (0: none), the token id, the shared-expert offsets */
    const CUdeviceptr pos_d = graph ? A + p->prm + CB_PRM_POS * 4 : 0;
    const CUdeviceptr ids_d = graph ? A + p->prm + CB_PRM_ID * 4 : A + p->ids;
    const CUdeviceptr shared_offsets =
        graph ? A + p->prm + CB_PRM_SHARED_OFF * 4 : A + p->shared_offsets;

    {
        CUdeviceptr ids_a = ids_d, tab = cb_dev(cu, m->tok_embed.data);
        CUdeviceptr sc = cb_dev(cu, m->tok_embed.scales);
        int dt = (int)m->tok_embed.dtype;
        void *a[] = {(void *)&x, (void *)&Dp, &ids_a, &tab, &sc, &dt};
        if (cb_launch(cu, CB_F_EMBED, (unsigned)n, 1, CB_WIDE, s0, a, why, why_len)) return -1;
    }
    for (int l = 0; l < (int)m->n_layers; l++) {
        const colibri_layer *ly = &m->layers[l];
        const int gate_out = (ly->desc.mixer_flags & COLIBRI_MIXER_FLAG_OUTPUT_GATE) != 0;
        const int kvi = cb_kv_index(m, (uint32_t)l); /* -1: a recurrent layer */
        const CUdeviceptr kv_layer = (CUdeviceptr)(kvi < 0 ? 0 : kvi) * S * kvd * (p->kv_f16 ? 2 : 4);
        const CUdeviceptr kc_l = A + p->kcache + kv_layer, vc_l = A + p->vcache + kv_layer;

        /* attention: Q, K, V projections into one staging row per token [q | k | v]; one launch
         * then does the q/k norm, RoPE and the KV-cache write (f32 or f16) per (token, head) */
        const CUdeviceptr qkv = A + p->qkv;
        const int qkv_w = HD + 2 * kvd;
        if (kvi < 0) { /* gated_deltanet */
            if (cb_deltanet_layer(cu, s0, n, l, why, why_len)) return -1;
            goto ffn;
        }
        if (cb_rmsnorm(cu, s0, h, Dp, x, Dp, n, &ly->attn_norm, Dp, D, why, why_len) ||
            cb_linear(cu, s0, qkv, qkv_w, h, Dp, n, &ly->wq, cb_dev(cu, ly->bq.data), 0, why,
                      why_len) ||
            cb_linear(cu, s0, qkv + (CUdeviceptr)HD * 4, qkv_w, h, Dp, n, &ly->wk,
                      cb_dev(cu, ly->bk.data), 0, why, why_len) ||
            cb_linear(cu, s0, qkv + (CUdeviceptr)(HD + kvd) * 4, qkv_w, h, Dp, n, &ly->wv,
                      cb_dev(cu, ly->bv.data), 0, why, why_len) ||
            (gate_out && cb_linear(cu, s0, A + p->mix, HD, h, Dp, n, &ly->attn_gate, 0, 0, why,
                                   why_len)) ||
            ((ly->desc.mixer_flags & COLIBRI_MIXER_FLAG_PARTIAL_ROPE)
                 ? cb_qk_rope_partial(cu, s0, n, pos, ly, kc_l, vc_l, pos_d, why, why_len)
                 : cb_qk_rope_kv(cu, s0, n, pos, ly, kc_l, vc_l, pos_d, why, why_len)))
            return -1;
        if (cb_oss_layer(m, l)) {
            /* gpt-oss: sinks and/or a sliding window, prefill and decode alike */
            if (cb_oss_attention(cu, s0, n, pos, l, kc_l, vc_l, pos_d, why, why_len)) return -1;
        } else if (n > 1 && Dh <= COLIBRI_CU_FA_MAX_DH) {
            /* prefill: the tiled kernel, scores in shared memory (graph capture is n == 1) */
            CUdeviceptr o = att, qq = q, kk = kc_l, vv = vc_l;
            int nn = n, pp = pos, hh = H, hk = Hkv, dh = Dh, f16 = p->kv_f16;
            void *a[] = {&o, &qq, &kk, &vv, &nn, &pp, &hh, &hk, &dh, &f16};
            if (cb_launch(cu, CB_F_PREFILL,
                          colibri_cuda_ceil_div((unsigned)n, COLIBRI_CU_FA_ROWS), (unsigned)H,
                          COLIBRI_CU_FA_THREADS, s0, a, why, why_len))
                return -1;
        } else {
            /* decode (and prefill with heads wider than the tiled kernel's): split-KV. KV
             * ranges of the chunk's last token; earlier tokens' blocks past their own last
             * range return at once. Partials are merged only when some token has two ranges.
             * graph: every range of the cache, and the merge whenever there can be two. */
            CUdeviceptr pt = A + p->part;
            int hh = H, hk = Hkv, dh = Dh, pp = pos, f16 = p->kv_f16;
            const size_t upto = graph ? (size_t)S : (size_t)pos + (size_t)n;
            int ns = (int)((upto + CB_KV_SPLIT - 1) / CB_KV_SPLIT);
            CUdeviceptr o = att, qq = q, kk = kc_l, vv = vc_l, pd = pos_d;
            void *a[] = {&o, &pt, &qq, &kk, &vv, &ns, &pp, &hh, &hk, &dh, &f16, &pd};
            if (cb_launch(cu, CB_F_ATTENTION, (unsigned)(H * ns), (unsigned)n, CB_HEAD, s0, a, why,
                          why_len))
                return -1;
            void *b[] = {&o, &pt, &ns, &pp, &hh, &dh, &pd};
            if (ns > 1 &&
                cb_launch(cu, CB_F_MERGE, (unsigned)H, (unsigned)n, CB_HEAD, s0, b, why, why_len))
                return -1;
        }
        if (gate_out) { /* Qwen's output gate: att *= sigmoid(ATTN_GATE h) before WO */
            CUdeviceptr at = att, g = A + p->mix;
            int hd = HD;
            void *a[] = {&at, &g, &hd};
            if (cb_launch_hy(cu, CB_H_GATE, (unsigned)n, 1, CB_WIDE, s0, a, why, why_len)) return -1;
        }
        if (cb_linear(cu, s0, x, Dp, att, HD, n, &ly->wo, cb_dev(cu, ly->bo.data), 1, why,
                      why_len)) /* + o_proj's bias (gpt-oss) */
            return -1;
    ffn:
        /* FFN norm -> h; fused: the router and top-k in the same launch (cb_ffn_route) */
        if (cu->fuse_route ? cb_ffn_route(cu, s0, n, ly, why, why_len)
                           : cb_rmsnorm(cu, s0, h, Dp, x, Dp, n, &ly->ffn_norm, Dp, D, why,
                                        why_len))
            return -1;

        /* shared expert (second stream when there is one): depends only on h, so ev_h is
         * recorded after the kernel that wrote h (the FFN norm, or the fused routing) */
        const CUdeviceptr tabs = A + p->tables + (CUdeviceptr)l * (6 * E + 6) * sizeof(CUdeviceptr);
        if (shared) {
            if (s1 != s0) {
                CB_CHECK(cu->d.EventRecord(cu->ev_h, s0), "cuEventRecord");
                CB_CHECK(cu->d.StreamWaitEvent(s1, cu->ev_h, 0), "cuStreamWaitEvent");
            }
            const int Fs = (int)m->shared_expert_size;
            if (cb_swiglu(cu, s1, n, A + p->shared_act, Fs, A + p->shared_out, A + p->iota,
                          shared_offsets, 0,
                          tabs + (CUdeviceptr)6 * E * sizeof(CUdeviceptr), 1, 1,
                          (int)ly->shared_w1.dtype, (int)ly->shared_w2.dtype, why, why_len))
                return -1;
            if (gated && cb_linear(cu, s1, A + p->shared_gate, 1, h, Dp, n, &ly->shared_gate, 0, 0,
                                   why, why_len))
                return -1;
            if (s1 != s0) CB_CHECK(cu->d.EventRecord(cu->ev_shared, s1), "cuEventRecord");
        }

        /* routing (unless fused above), dispatch, routed experts. The unfused router stays on
         * the GEMV (cb_linear_at), never the tensor cores: its logits then have the same bits as
         * cb_ffn_route's and as a decode step's, so which experts a token runs does not depend
         * on the fusion switch or on the chunk schedule (the router is E x Dp: nothing to gain) */
        {
            CUdeviceptr rl = A + p->router, ti = A + p->top_idx, tw = A + p->top_w;
            int e = E, kk = k, renorm = m->routing == COLIBRI_WEIGHTS_RENORM;
            void *a[] = {&rl, &e, &kk, &renorm, &ti, &tw};
            if (!cu->fuse_route &&
                (cb_linear_at(cu, s0, rl, E, h, Dp, n, &ly->router, cb_dev(cu, ly->router_bias.data),
                              0, 0, why, why_len) ||
                 cb_launch(cu, CB_F_TOPK, (unsigned)n, 1, COLIBRI_CU_ROUTER_THREADS, s0, a, why,
                           why_len)))
                return -1;
            CUdeviceptr off = A + p->offsets, perm = A + p->perm, so = A + p->slot_of;
            CUdeviceptr act = A + p->active;
            int nn = n;
            void *b[] = {&ti, &nn, &kk, &e, &off, &perm, &so, &act};
            if (cb_launch(cu, CB_F_DISPATCH, 1, 1, CB_WIDE, s0, b, why, why_len)) return -1;
        }
        /* min(E, n*k) groups: at most that many experts have slots (decode: exactly k) */
        const int groups = n * k < E ? n * k : E;
        if (cb_oss_experts(ly)
                ? cb_oss_swiglu(cu, s0, l, tabs, groups, why, why_len)
                : cb_swiglu(cu, s0, n, A + p->act, (int)m->expert_size, A + p->expert_out,
                            A + p->perm, A + p->offsets, A + p->active, tabs, E, groups,
                            (int)ly->w1[0].dtype, (int)ly->w2[0].dtype, why, why_len))
            return -1;
        if (shared && s1 != s0) CB_CHECK(cu->d.StreamWaitEvent(s0, cu->ev_shared, 0), "wait");
        {
            CUdeviceptr xx = x, eo = A + p->expert_out, so = A + p->slot_of, tw = A + p->top_w;
            CUdeviceptr sout = shared ? A + p->shared_out : 0;
            CUdeviceptr gate = shared && gated ? A + p->shared_gate : 0;
            int dp = Dp, kk = k;
            void *a[] = {&xx, &dp, &kk, &eo, &so, &tw, &sout, &gate};
            if (cb_launch(cu, CB_F_COMBINE, (unsigned)n, 1, CB_WIDE, s0, a, why, why_len)) return -1;
        }
    }
    (void)V;
    /* a decode step's graph ends with its one row of logits; a pass leaves them to cb_head */
    return graph ? cb_head(cu, 0, 1, 1, why, why_len) : 0;
}

/* `rows` logits rows of the pass from row row0 (cb_head), down through the page-locked
 * host_logits (a DMA the driver queues; from pageable memory it would stage it through its own
 * buffer), then to `out`. */
static int cb_download(colibri_cuda *cu, int row0, int rows, int n_pass, float *out, char *why,
                       size_t why_len) {
    if (cb_head(cu, row0, rows, n_pass, why, why_len)) return -1;
    CUstream s0 = cu->stream[0];
    const size_t bytes = (size_t)rows * cu->m->vocab_size * sizeof(float);
    CB_CHECK(cu->d.MemcpyDtoHAsync(cu->host_logits, cu->arena + cu->plan.logits, bytes, s0),
             "logits download");
    CB_CHECK(cu->d.StreamSynchronize(s0), "cuStreamSynchronize");
    memcpy(out, cu->host_logits, bytes);
    return 0;
}

/* One device pass of plain launches: upload the ids and the shared-expert offsets, issue the
 * layers, then the logits: every row (out_all, n x vocab, in plan.logit_rows blocks), the last
 * row only (out_last), or none (a prompt pass before its last: nothing to wait for, the next
 * pass follows on the same stream; the uploads' pageable sources are staged before the calls
 * return, NVIDIA's "API synchronization behavior" for asynchronous host-to-device copies). */
static int cb_forward_pass(colibri_cuda *cu, const int32_t *ids, int n, int pos, float *out_all,
                           float *out_last, char *why, size_t why_len) {
    const CUdeviceptr A = cu->arena;
    CUstream s0 = cu->stream[0];
    CB_CHECK(cu->d.MemcpyHtoDAsync(A + cu->plan.ids, ids, (size_t)n * sizeof *ids, s0),
             "ids upload");
    int shared_off[2] = {0, n};
    CB_CHECK(cu->d.MemcpyHtoDAsync(A + cu->plan.shared_offsets, shared_off, sizeof shared_off, s0),
             "offsets upload");
    if (cb_issue_chunk(cu, n, pos, 0, why, why_len)) return -1;
    if (out_last) return cb_download(cu, n - 1, 1, n, out_last, why, why_len);
    const size_t V = cu->m->vocab_size;
    for (int r = 0; out_all && r < n; r += cu->plan.logit_rows) {
        const int rows = n - r < cu->plan.logit_rows ? n - r : cu->plan.logit_rows;
        if (cb_download(cu, r, rows, n, out_all + (size_t)r * V, why, why_len)) return -1;
    }
    return 0;
}

/* Capture the decode step into cu->graph (stream 0 is the origin; stream 1 joins and leaves
 * through the events, as stream capture follows cuEventRecord/cuStreamWaitEvent). A failure of
 * the capture machinery itself leaves graph_off set and the step runs with plain launches; an
 * error from a kernel launch is returned. */
static int cb_capture_decode(colibri_cuda *cu, char *why, size_t why_len) {
    CUstream s0 = cu->stream[0];
    CUgraph g = NULL;
    if (cu->d.StreamBeginCapture(s0, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL) != CUDA_SUCCESS) {
        cu->graph_off = 1;
        return 0;
    }
    const int rc = cb_issue_chunk(cu, 1, 0, 1, why, why_len);
    const CUresult end = cu->d.StreamEndCapture(s0, &g); /* ends the capture whatever happened */
    if (rc == 0 && end == CUDA_SUCCESS && g &&
        cu->d.GraphInstantiate(&cu->graph, g, 0) != CUDA_SUCCESS)
        cu->graph = NULL;
    if (g) cu->d.GraphDestroy(g); /* the executable graph keeps its own copy */
    if (rc) return rc;
    if (!cu->graph) cu->graph_off = 1;
    return 0;
}

/* One-token decode step through the graph: one upload of {id, pos}, one graph launch, the logits
 * download. pageable source: the copy returns once the 8 bytes are staged, so a local is fine. */
static int cb_decode_graph(colibri_cuda *cu, int32_t id, int pos, float *logits, char *why,
                           size_t why_len) {
    const CUdeviceptr A = cu->arena;
    CUstream s0 = cu->stream[0];
    int prm[2];
    prm[CB_PRM_ID] = id;
    prm[CB_PRM_POS] = pos;
    CB_CHECK(cu->d.MemcpyHtoDAsync(A + cu->plan.prm, prm, sizeof prm, s0), "step upload");
    CB_CHECK(cu->d.GraphLaunch(cu->graph, s0), "cuGraphLaunch");
    const size_t bytes = (size_t)cu->m->vocab_size * sizeof(float);
    CB_CHECK(cu->d.MemcpyDtoHAsync(cu->host_logits, A + cu->plan.logits, bytes, s0),
             "logits download");
    CB_CHECK(cu->d.StreamSynchronize(s0), "cuStreamSynchronize");
    memcpy(logits, cu->host_logits, bytes);
    return 0;
}

/* Both forwards: every row of logits, or (last) the last token's only. */
static int cb_forward(colibri_cuda *cu, const int32_t *ids, int n, int pos, float *logits,
                      int last, char *why, size_t why_len) {
    const struct colibri_model *m = cu->m;
    if (n <= 0 || pos < 0 || (uint64_t)pos + (uint64_t)n > m->max_seq_len) {
        snprintf(why, why_len, "positions %d..%d outside the KV cache (%u)", pos, pos + n - 1,
                 m->max_seq_len);
        return -1;
    }
    for (int i = 0; i < n; i++)
        if (ids[i] < 0 || (uint32_t)ids[i] >= m->vocab_size) {
            snprintf(why, why_len, "token id %d out of range (vocab %u)", ids[i], m->vocab_size);
            return -1;
        }
    CB_CHECK(cu->d.CtxPushCurrent(cu->ctx), "cuCtxPushCurrent");
    int rc = cu->state_dirty ? cb_zero_state(cu, why, why_len) : 0;
    /* decode: one graph launch per token, captured on the first step of this context */
    if (rc == 0 && n == 1 && !cu->graph && !cu->graph_off) rc = cb_capture_decode(cu, why, why_len);
    if (n == 1 && cu->graph && rc == 0) {
        rc = cb_decode_graph(cu, ids[0], pos, logits, why, why_len);
        n = 0; /* done */
    }
    for (int t = 0; t < n && rc == 0; t += cu->pass) {
        const int c = n - t < cu->pass ? n - t : cu->pass;
        float *all = last ? NULL : logits + (size_t)t * m->vocab_size;
        float *tail = last && t + c == n ? logits : NULL;
        rc = cb_forward_pass(cu, ids + t, c, pos + t, all, tail, why, why_len);
    }
    CUcontext popped;
    cu->d.CtxPopCurrent(&popped);
    return rc;
}

int colibri_cuda_forward(colibri_cuda *cu, const int32_t *ids, int n, int pos, float *logits,
                         char *why, size_t why_len) {
    return cb_forward(cu, ids, n, pos, logits, 0, why, why_len);
}

int colibri_cuda_forward_last(colibri_cuda *cu, const int32_t *ids, int n, int pos,
                              float *logits, char *why, size_t why_len) {
    return cb_forward(cu, ids, n, pos, logits, 1, why, why_len);
}

/* The KV cache needs no clearing: position p is always written before it is read. The recurrent
 * state does: it is zeroed on the stream before the next pass (no driver call here). */
void colibri_cuda_reset(colibri_cuda *cu) {
    if (cu) cu->state_dirty = 1;
}

void colibri_cuda_get_info(const colibri_cuda *cu, colibri_cuda_info *info) {
    if (cu) *info = cu->info;
    else memset(info, 0, sizeof *info);
}

/* Releases what the context holds; the device (context, kernels, weights) stays with its model
 * unless this context opened a private one (colibri_cuda_open). */
void colibri_cuda_close(colibri_cuda *cu) {
    if (!cu) return;
    if (cu->ctx) {
        cu->d.CtxPushCurrent(cu->ctx);
        for (int s = 0; s < 2; s++)
            if (cu->stream[s]) cu->d.StreamSynchronize(cu->stream[s]);
        if (cu->graph) cu->d.GraphExecDestroy(cu->graph);
        if (cu->ev_h) cu->d.EventDestroy(cu->ev_h);
        if (cu->ev_shared) cu->d.EventDestroy(cu->ev_shared);
        for (int s = 0; s < 2; s++)
            if (cu->stream[s]) cu->d.StreamDestroy(cu->stream[s]);
        if (cu->arena) cu->d.MemFree(cu->arena);
        if (cu->host_logits) cu->d.MemFreeHost(cu->host_logits);
        CUcontext popped;
        cu->d.CtxPopCurrent(&popped);
    }
    if (cu->owns_dv) colibri_cuda_device_close(cu->dv);
    free(cu);
}

/* ---- copy-bandwidth probe ---------------------------------------------------------------------- */

static double cb_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Host clock around queued copies and one cuCtxSynchronize: the launch overhead of a few copies
 * of >= 64 MiB is far below the clock's resolution of the whole. */
static int cb_probe_run(colibri_cuda *cu, size_t bytes, int iters, colibri_cuda_bandwidth *out,
                        char *why, size_t why_len) {
    cuMemcpyDtoD_v2_t dtod = (cuMemcpyDtoD_v2_t)dlsym(cu->d.lib, "cuMemcpyDtoD_v2");
    cuCtxSynchronize_t sync = cu->d.CtxSynchronize;
    if (!dtod || !sync) {
        snprintf(why, why_len, "the driver lacks cuMemcpyDtoD_v2 or cuCtxSynchronize");
        return -1;
    }
    CUdeviceptr a = 0, b = 0;
    CUresult r;
    int rc = -1;
    if ((r = cu->d.MemAlloc(&a, bytes)) != CUDA_SUCCESS ||
        (r = cu->d.MemAlloc(&b, bytes)) != CUDA_SUCCESS) {
        cb_fail(cu, r, "cuMemAlloc (probe buffers)", why, why_len);
        goto done;
    }
    if ((r = dtod(b, a, bytes)) != CUDA_SUCCESS || (r = sync()) != CUDA_SUCCESS) {
        cb_fail(cu, r, "cuMemcpyDtoD (warm-up)", why, why_len);
        goto done;
    }
    double t0 = cb_now();
    for (int i = 0; i < iters; i++)
        if ((r = i % 2 ? dtod(a, b, bytes) : dtod(b, a, bytes)) != CUDA_SUCCESS) {
            cb_fail(cu, r, "cuMemcpyDtoD", why, why_len);
            goto done;
        }
    if ((r = sync()) != CUDA_SUCCESS) {
        cb_fail(cu, r, "cuCtxSynchronize", why, why_len);
        goto done;
    }
    out->seconds = cb_now() - t0;
    out->bytes = bytes;
    out->iters = iters;
    out->gbps = out->seconds > 0 ? 2.0 * (double)bytes * iters / out->seconds / 1e9 : 0.0;
    rc = 0;
done:
    if (a) cu->d.MemFree(a);
    if (b) cu->d.MemFree(b);
    return rc;
}

int colibri_cuda_copy_bandwidth(size_t bytes, int iters, colibri_cuda_bandwidth *out, char *why,
                                size_t why_len) {
    memset(out, 0, sizeof *out);
    if (bytes == 0 || iters < 1) {
        snprintf(why, why_len, "probe size and iterations must be positive");
        return -1;
    }
    colibri_cuda *cu = calloc(1, sizeof *cu);
    if (!cu) {
        snprintf(why, why_len, "out of host memory");
        return -1;
    }
    int rc = -1;
    CUresult r;
    int major = 0, minor = 0;
    if (cb_driver_load(&cu->d, why, why_len)) goto done;
    if ((r = cu->d.Init(0)) != CUDA_SUCCESS) {
        cb_fail(cu, r, "cuInit", why, why_len);
        goto done;
    }
    if ((r = cu->d.DeviceGet(&cu->dev, 0)) != CUDA_SUCCESS ||
        (r = cu->d.DeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                      cu->dev)) != CUDA_SUCCESS ||
        (r = cu->d.DeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR,
                                      cu->dev)) != CUDA_SUCCESS ||
        (r = cu->d.DeviceGetAttribute(&out->integrated, CU_DEVICE_ATTRIBUTE_INTEGRATED,
                                      cu->dev)) != CUDA_SUCCESS ||
        (r = cu->d.DeviceGetName(out->device_name, (int)sizeof out->device_name, cu->dev)) !=
            CUDA_SUCCESS ||
        (r = cu->d.DriverGetVersion(&out->driver_version)) != CUDA_SUCCESS) {
        cb_fail(cu, r, "querying CUDA device 0", why, why_len);
        goto done;
    }
    out->sm = major * 10 + minor;
    snprintf(out->libcuda, sizeof out->libcuda, "%s", cu->d.path);
    if ((r = cu->d.CtxCreate(&cu->ctx, 0, cu->dev)) != CUDA_SUCCESS) {
        cb_fail(cu, r, "cuCtxCreate", why, why_len);
        goto done;
    }
    rc = cb_probe_run(cu, bytes, iters, out, why, why_len);
done:
    if (cu->ctx) cu->d.CtxDestroy(cu->ctx);
    if (cu->d.lib) cb_driver_unload(&cu->d);
    free(cu);
    return rc;
}
