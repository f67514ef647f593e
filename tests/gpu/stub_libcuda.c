/* A stand-in libcuda.so.1 for tests/test_cuda_host.py on machines without an NVIDIA GPU.
 *
 * It is used ONLY for the driver failure paths a GPU-less machine cannot produce with the real
 * driver (cuInit failing, a GPU whose SM has no image, a module that will not load, a driver
 * lacking a symbol), and to record the launch sequence the host code issues so its determinism
 * (run to run, 1 vs 2 streams) can be checked. No kernel runs here; the numbers are checked on a
 * real GPU by tests/gpu/test_kernels_pycuda.py.
 *
 * Behaviour from the environment:
 *   STUB_CUINIT_RC   cuInit's result (default 0)
 *   STUB_SM          compute capability, e.g. 87 (default 87)
 *   STUB_INTEGRATED  CU_DEVICE_ATTRIBUTE_INTEGRATED (default 0)
 *   STUB_LOAD_RC     cuModuleLoadDataEx's result (default 0)
 *   STUB_DTOD_RC     cuMemcpyDtoD_v2's result (default 0; colibri gpuprobe)
 *   STUB_HTOD_FAIL_AT  the Nth cuMemcpyHtoDAsync_v2 call (1-based) returns 1 (INVALID_VALUE)
 *                      and copies nothing (an upload failing part way)
 *   STUB_ALLOCHOST_FAIL_AT  the Nth cuMemAllocHost_v2 call (1-based) returns 2 (OUT_OF_MEMORY)
 *   STUB_HOST_REGISTER / STUB_RO_REGISTER  CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED (99) /
 *                    READ_ONLY_HOST_REGISTER_SUPPORTED (113), default 1 (0 on some Tegra parts)
 *   STUB_REGISTER_RC cuMemHostRegister_v2's result (default 0)
 *   STUB_LOG         file receiving one line per cuLaunchKernel / memcpy / event call
 * Built with -DSTUB_DRIVER_VERSION=N, cuDriverGetVersion answers N (default 12060): two builds
 * stand for a JetPack BSP driver and NVIDIA's cuda-compat upgrade of it. With -DSTUB_JIT_CHECK,
 * loading a PTX image opens "libnvidia-ptxjitcompiler.so.1" by soname, as the real driver's JIT
 * does: absent, CUDA_ERROR_JIT_COMPILER_NOT_FOUND (221); a JIT compiler of another driver version
 * (its stub_ptxjit_version(), tests/gpu/stub_ptxjit.c), CUDA_ERROR_INVALID_PTX (218), so a
 * compat libcuda loaded without its own JIT library fails as it would on a device.
 * Built with -DSTUB_OMIT_LAUNCH it lacks cuLaunchKernel (a driver missing an entry point); with
 * -DSTUB_OMIT_GRAPH it lacks the CUDA-graph entry points (a driver older than CUDA 11.4).
 *
 * Stream capture (CUDA graphs), as NVIDIA's CUDA Programming Guide ("Creating a Graph Using
 * Stream Capture", "Cross-stream Dependencies and Events") and the driver API reference of
 * cuStreamBeginCapture / cuStreamEndCapture describe it: between cuStreamBeginCapture_v2 and
 * cuStreamEndCapture on the origin stream, work issued to a capturing stream is recorded, not run;
 * another stream joins the capture by waiting on an event recorded in a capturing stream, and
 * must be joined back into the origin (the origin waits on an event recorded after its last
 * work) before the capture ends, else CUDA_ERROR_STREAM_CAPTURE_UNJOINED (904); a memcpy or a
 * synchronize on a capturing stream is CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED (900) here (the
 * real driver refuses synchronizing and pageable copies). A captured cuLaunchKernel copies the
 * argument bytes, as the driver does (sizes from the emulation's kernel signatures with
 * -DSTUB_EMULATE; without it the arguments are not kept, nothing is replayed), and logs
 * "capture <kernel> grid .. block .. stream ..". cuGraphLaunch logs "graph launch stream S
 * nodes N" and, with -DSTUB_EMULATE, replays the nodes in capture order (an order that keeps
 * every captured dependency, since the capture saw them issued in it).
 * Built with -DSTUB_EMULATE and linked with tests/gpu/emu/cuda_emu.cpp, cuLaunchKernel runs the
 * kernel in the host emulation, so the real binary's `--backend cuda` path runs end to end on a
 * CPU (tests/test_cuda_host.py compares it with `--backend cpu`). */
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

static int env_int(const char *name, int dflt) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : dflt;
}

static void logf_(const char *fmt, ...) {
    const char *path = getenv("STUB_LOG");
    if (!path) return;
    FILE *f = fopen(path, "a");
    if (!f) return;
    va_list ap;
    va_start(ap, fmt);
    vfprintf(f, fmt, ap);
    va_end(ap);
    fputc('\n', f);
    fclose(f);
}

/* handles: small distinct non-NULL values */
static char g_ctx, g_mod, g_stream[8], g_event[8];
static char g_fn_names[64][32];
static int g_nfn;

/* ---- stream capture state (see the top of the file) ---- */
#define STUB_MAX_ARGS 16
typedef struct {
    const char *fn;
    unsigned gx, gy, bx;
    int stream, nargs;
    unsigned long long args[STUB_MAX_ARGS]; /* each argument's bytes, one 8-byte slot each */
} stub_node;
typedef struct {
    stub_node *nodes;
    int count, cap;
} stub_graph;
static int g_capturing[8];   /* stream i records instead of running */
static int g_origin = -1;    /* the stream cuStreamBeginCapture_v2 was called on; -1: none */
static int g_ops[8];         /* nodes captured on stream i */
static int g_joined[8];      /* nodes of stream i the origin has waited for */
static int g_ev_stream[8];   /* event i: stream it was recorded on in the capture, else -1 */
static int g_ev_ops[8];      /* event i: g_ops of that stream when recorded */
static stub_graph *g_graph;  /* the graph being captured */

static int stream_index(void *s) { return s ? (int)((char *)s - g_stream) : -1; }
static int capturing(void *s) { int i = stream_index(s); return i >= 0 && g_capturing[i]; }

CUresult cuInit(unsigned flags) { (void)flags; return env_int("STUB_CUINIT_RC", 0); }
#ifndef STUB_DRIVER_VERSION
#define STUB_DRIVER_VERSION 12060
#endif
CUresult cuDriverGetVersion(int *v) { *v = STUB_DRIVER_VERSION; return 0; }
CUresult cuDeviceGetCount(int *n) { *n = 1; return 0; }
CUresult cuDeviceGet(int *d, int i) { *d = i; return 0; }
CUresult cuDeviceGetAttribute(int *v, int attr, int dev) {
    (void)dev;
    int sm = env_int("STUB_SM", 87);
    switch (attr) {
    case 75: *v = sm / 10; break;
    case 76: *v = sm % 10; break;
    case 18: *v = env_int("STUB_INTEGRATED", 0); break;
    case 19: *v = 1; break;
    case 99: *v = env_int("STUB_HOST_REGISTER", 1); break;
    case 113: *v = env_int("STUB_RO_REGISTER", 1); break;
    case 16: *v = 132; break; /* multiprocessors (an H200's) */
    default: *v = 0;
    }
    return 0;
}
CUresult cuDeviceGetName(char *name, int len, int dev) {
    (void)dev;
    snprintf(name, (size_t)len, "Stub GPU");
    return 0;
}
CUresult cuCtxCreate_v2(void **ctx, unsigned flags, int dev) {
    (void)flags; (void)dev;
    logf_("ctx create");
    *ctx = &g_ctx;
    return 0;
}
CUresult cuCtxDestroy_v2(void *ctx) { (void)ctx; logf_("ctx destroy"); return 0; }
CUresult cuCtxPushCurrent_v2(void *ctx) { (void)ctx; return 0; }
CUresult cuCtxPopCurrent_v2(void **ctx) { *ctx = &g_ctx; return 0; }
static const unsigned char *g_image; /* the module's image, as cuModuleLoadDataEx got it */

CUresult cuModuleLoadDataEx(void **mod, const void *img, unsigned n, int *o, void **v) {
    (void)n; (void)o; (void)v;
    *mod = &g_mod;
    g_image = img;
#ifdef STUB_JIT_CHECK
    if (memcmp(img, "\x7f" "ELF", 4) != 0) { /* PTX: the JIT compiler library, by soname */
        void *jit = dlopen("libnvidia-ptxjitcompiler.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!jit) return 221; /* CUDA_ERROR_JIT_COMPILER_NOT_FOUND */
        int (*version)(void) = (int (*)(void))dlsym(jit, "stub_ptxjit_version");
        const int same = version && version() == STUB_DRIVER_VERSION;
        dlclose(jit);
        if (!same) return 218; /* CUDA_ERROR_INVALID_PTX */
    }
#endif
    return env_int("STUB_LOAD_RC", 0);
}
CUresult cuModuleLoadData(void **mod, const void *img) { return cuModuleLoadDataEx(mod, img, 0, 0, 0); }
CUresult cuModuleUnload(void *mod) { (void)mod; return 0; }

/* Does the loaded image define kernel `name`? As the driver answers cuModuleGetFunction
 * (CUDA_ERROR_NOT_FOUND, 500, when not): a cubin (ELF64) holds the name NUL-terminated in its
 * string table, which lies before the section header table that ends the file (e_shoff + e_shnum
 * x e_shentsize bytes: the ELF64 header fields at offsets 0x28, 0x3c, 0x3a); PTX text declares
 * it as ".entry name(". The backend's optional tensor-core kernels are absent from an sm_72 /
 * compute_72 image, and this is how the stand-in sees it. */
static int image_defines(const char *name) {
    const unsigned char *p = g_image;
    if (memcmp(p, "\x7f" "ELF", 4) == 0) {
        uint64_t shoff;
        uint16_t shentsize, shnum;
        memcpy(&shoff, p + 0x28, 8);
        memcpy(&shentsize, p + 0x3a, 2);
        memcpy(&shnum, p + 0x3c, 2);
        const size_t size = (size_t)shoff + (size_t)shnum * shentsize, len = strlen(name) + 1;
        for (size_t i = 0; i + len <= size; i++)
            if (memcmp(p + i, name, len) == 0) return 1;
        return 0;
    }
    if (strstr((const char *)p, ".version") != NULL) { /* PTX text (NUL-terminated) */
        char want[96];
        snprintf(want, sizeof want, ".entry %s(", name);
        return strstr((const char *)p, want) != NULL;
    }
    return 0;
}

/* host_unit.c's fake images (an ELF magic with no sections, two lines of PTX header) define no
 * kernel at all: for them every name is found, as before this check existed. */
static int image_has(const char *name) {
    return g_image == NULL || !image_defines("cb_embed") || image_defines(name);
}

CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
    (void)mod;
    if (!image_has(name)) return 500; /* CUDA_ERROR_NOT_FOUND */
    if (g_nfn >= 64) return 500;
    snprintf(g_fn_names[g_nfn], sizeof g_fn_names[g_nfn], "%s", name);
    *fn = (void *)g_fn_names[g_nfn++];
    return 0;
}
/* device memory is host memory here: the backend only computes addresses and copies */
CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    void *m = calloc(1, n ? n : 1);
    *p = (CUdeviceptr)(uintptr_t)m;
    logf_("alloc %zu", n);
    return m ? 0 : 2;
}
CUresult cuMemFree_v2(CUdeviceptr p) { free((void *)(uintptr_t)p); return 0; }
CUresult cuMemcpyHtoD_v2(CUdeviceptr d, const void *s, size_t n) {
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
CUresult cuMemcpyDtoH_v2(void *d, CUdeviceptr s, size_t n) {
    memcpy(d, (const void *)(uintptr_t)s, n);
    return 0;
}
CUresult cuMemsetD8_v2(CUdeviceptr d, unsigned char v, size_t n) {
    memset((void *)(uintptr_t)d, v, n);
    return 0;
}
static int g_htod_async; /* cuMemcpyHtoDAsync_v2 calls so far */
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) {
    if (capturing(st)) return 900; /* CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED */
    logf_("htod async %zu", n);
    if (++g_htod_async == env_int("STUB_HTOD_FAIL_AT", 0)) return 1;
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
/* Page-locked host memory: plain host memory here. Signatures as in the CUDA driver API reference
 * (cuMemAllocHost(void **pp, size_t bytesize), exported as cuMemAllocHost_v2 since CUDA 3.2;
 * cuMemFreeHost(void *p)), cross-checked against docs.rs cuda_driver_sys::cuMemAllocHost_v2. */
static int g_allochost; /* cuMemAllocHost_v2 calls so far */
CUresult cuMemAllocHost_v2(void **pp, size_t n) {
    const int rc = ++g_allochost == env_int("STUB_ALLOCHOST_FAIL_AT", 0) ? 2 : 0;
    *pp = rc ? NULL : malloc(n ? n : 1);
    logf_("allochost %zu rc %d", n, rc);
    return rc ? rc : *pp ? 0 : 2;
}
CUresult cuMemFreeHost(void *p) {
    logf_("freehost");
    free(p);
    return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) {
    if (capturing(st)) return 900;
    logf_("dtoh async %zu", n);
    memcpy(d, (const void *)(uintptr_t)s, n);
    return 0;
}
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    logf_("register %zu flags %u", n, flags);
    (void)p;
    return env_int("STUB_REGISTER_RC", 0);
}
CUresult cuMemHostUnregister(void *p) { (void)p; return 0; }
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    (void)flags;
    *d = (CUdeviceptr)(uintptr_t)p;
    return 0;
}
#ifdef STUB_EMULATE
int emu_launch(const char *name, unsigned gx, unsigned gy, unsigned bx, void **args);
int emu_param_sizes(const char *name, size_t *sizes, int max);
#endif


#ifndef STUB_OMIT_LAUNCH
static CUresult capture_node(void *fn, unsigned gx, unsigned gy, unsigned bx, void *stream,
                             void **params) {
    stub_graph *g = g_graph;
    if (g->count == g->cap) {
        int cap = g->cap ? 2 * g->cap : 64;
        stub_node *n = realloc(g->nodes, (size_t)cap * sizeof *n);
        if (!n) return 2;
        g->nodes = n;
        g->cap = cap;
    }
    stub_node *n = &g->nodes[g->count++];
    memset(n, 0, sizeof *n);
    n->fn = (const char *)fn;
    n->gx = gx, n->gy = gy, n->bx = bx;
    n->stream = stream_index(stream);
#ifdef STUB_EMULATE
    size_t sizes[STUB_MAX_ARGS];
    n->nargs = emu_param_sizes(n->fn, sizes, STUB_MAX_ARGS);
    if (n->nargs < 0) return 500;
    for (int i = 0; i < n->nargs; i++) {
        if (sizes[i] > sizeof n->args[i]) return 1;
        memcpy(&n->args[i], params[i], sizes[i]);
    }
#else
    (void)params;
#endif
    g_ops[n->stream]++;
    logf_("capture %s grid %u %u block %u stream %d", n->fn, gx, gy, bx, n->stream);
    return 0;
}
#endif

#ifndef STUB_OMIT_LAUNCH
CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
    (void)gz; (void)by; (void)bz; (void)shmem; (void)params; (void)extra;
    if (capturing(stream)) return capture_node(fn, gx, gy, bx, stream, params);
    const char *path = getenv("STUB_LOG");
    if (path) {
        FILE *f = fopen(path, "a");
        if (f) {
            int s = stream ? (int)((char *)stream - g_stream) : -1;
            fprintf(f, "launch %s grid %u %u block %u stream %d\n", (const char *)fn, gx, gy, bx,
                    s);
            fclose(f);
        }
    }
#ifdef STUB_EMULATE
    if (gy > 65535 || bx > 1024) return 1; /* CUDA_ERROR_INVALID_VALUE, as the driver would */
    if (emu_launch((const char *)fn, gx, gy, bx, params) != 0) return 500; /* NOT_FOUND */
#endif
    return 0;
}
#endif
/* Streams and events: the lowest free handle, given back on destroy (so the backend's short-lived
 * upload stream does not shift the numbers of the streams the launch logs name). The real driver
 * hands out opaque pointers (CUstream, CUevent in the driver API reference) and says nothing of
 * their values; the backend never depends on them, only these logs do. */
static int take_slot(unsigned char *used) {
    for (int i = 0; i < 8; i++)
        if (!used[i]) {
            used[i] = 1;
            return i;
        }
    return -1;
}
static unsigned char g_stream_used[8], g_event_used[8];
CUresult cuStreamCreate(void **s, unsigned flags) {
    (void)flags;
    const int i = take_slot(g_stream_used);
    if (i < 0) return 2; /* CUDA_ERROR_OUT_OF_MEMORY */
    *s = &g_stream[i];
    return 0;
}
CUresult cuStreamDestroy_v2(void *s) {
    const int i = stream_index(s);
    if (i >= 0 && i < 8) g_stream_used[i] = 0;
    return 0;
}
CUresult cuStreamSynchronize(void *s) { return capturing(s) ? 900 : 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
    (void)flags;
    const int si = stream_index(s), ei = (int)((char *)e - g_event);
    logf_("wait stream %d event %d", si, ei);
    if (g_origin >= 0 && g_ev_stream[ei] >= 0) {
        g_capturing[si] = 1; /* joins the capture (or stays in it) */
        if (si == g_origin) g_joined[g_ev_stream[ei]] = g_ev_ops[ei];
    }
    return 0;
}
CUresult cuEventCreate(void **e, unsigned flags) {
    (void)flags;
    const int i = take_slot(g_event_used);
    if (i < 0) return 2;
    *e = &g_event[i];
    return 0;
}
CUresult cuEventDestroy_v2(void *e) {
    const int i = (int)((char *)e - g_event);
    if (i >= 0 && i < 8) g_event_used[i] = 0;
    return 0;
}
/* copies and launches complete before the call returns here, so an event is always reached */
CUresult cuEventSynchronize(void *e) { (void)e; return 0; }
/* the host clock between two records (the emulation runs each launch before the call returns) */
#include <time.h>
static double g_ev_time[8];
static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}
CUresult cuEventElapsedTime(float *ms, void *start, void *stop) {
    *ms = (float)(g_ev_time[(char *)stop - g_event] - g_ev_time[(char *)start - g_event]);
    return 0;
}
CUresult cuEventRecord(void *e, void *s) {
    const int si = stream_index(s), ei = (int)((char *)e - g_event);
    logf_("record event %d stream %d", ei, si);
    g_ev_time[ei] = now_ms();
    g_ev_stream[ei] = capturing(s) ? si : -1;
    g_ev_ops[ei] = capturing(s) ? g_ops[si] : 0;
    return 0;
}

#ifndef STUB_OMIT_GRAPH
CUresult cuStreamBeginCapture_v2(void *s, int mode) {
    const int si = stream_index(s);
    if (si < 0 || g_origin >= 0 || mode < 0 || mode > 2) return 1; /* INVALID_VALUE */
    g_graph = calloc(1, sizeof *g_graph);
    if (!g_graph) return 2;
    memset(g_capturing, 0, sizeof g_capturing);
    memset(g_ops, 0, sizeof g_ops);
    memset(g_joined, 0, sizeof g_joined);
    for (int i = 0; i < 8; i++) g_ev_stream[i] = -1;
    g_origin = si;
    g_capturing[si] = 1;
    logf_("begin capture stream %d mode %d", si, mode);
    return 0;
}
CUresult cuStreamEndCapture(void *s, void **graph) {
    const int si = stream_index(s);
    if (si != g_origin) return 903; /* CUDA_ERROR_STREAM_CAPTURE_UNMATCHED */
    CUresult rc = 0;
    for (int i = 0; i < 8; i++)
        if (i != si && g_capturing[i] && g_ops[i] > g_joined[i]) rc = 904; /* UNJOINED */
    memset(g_capturing, 0, sizeof g_capturing);
    g_origin = -1;
    logf_("end capture stream %d nodes %d rc %d", si, g_graph->count, rc);
    if (rc) {
        free(g_graph->nodes);
        free(g_graph);
        *graph = NULL;
    } else {
        *graph = g_graph;
    }
    g_graph = NULL;
    return rc;
}
CUresult cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    (void)flags;
    const stub_graph *g = graph;
    stub_graph *x = calloc(1, sizeof *x);
    if (!x) return 2;
    x->nodes = malloc((size_t)(g->count ? g->count : 1) * sizeof *x->nodes);
    if (!x->nodes) { free(x); return 2; }
    memcpy(x->nodes, g->nodes, (size_t)g->count * sizeof *x->nodes);
    x->count = x->cap = g->count;
    *exec = x;
    return 0;
}
CUresult cuGraphLaunch(void *exec, void *s) {
    const stub_graph *x = exec;
    if (capturing(s)) return 900;
    logf_("graph launch stream %d nodes %d", stream_index(s), x->count);
#ifdef STUB_EMULATE
    for (int i = 0; i < x->count; i++) {
        const stub_node *n = &x->nodes[i];
        void *args[STUB_MAX_ARGS];
        for (int a = 0; a < n->nargs; a++) args[a] = (void *)&n->args[a];
        if (n->gy > 65535 || n->bx > 1024) return 1;
        if (emu_launch(n->fn, n->gx, n->gy, n->bx, args) != 0) return 500;
    }
#endif
    return 0;
}
CUresult cuGraphExecDestroy(void *exec) {
    stub_graph *x = exec;
    if (x) free(x->nodes);
    free(x);
    return 0;
}
CUresult cuGraphDestroy(void *graph) { return cuGraphExecDestroy(graph); }
#endif
/* colibri gpuprobe: device memory is host memory here, so the copy is a memcpy */
CUresult cuMemcpyDtoD_v2(CUdeviceptr d, CUdeviceptr s, size_t n) {
    memcpy((void *)(uintptr_t)d, (const void *)(uintptr_t)s, n);
    return env_int("STUB_DTOD_RC", 0);
}
CUresult cuCtxSynchronize(void) { return 0; }
CUresult cuGetErrorString(CUresult rc, const char **s) {
    *s = rc == 100 ? "no CUDA-capable device is detected"
                   : rc == 218 ? "a PTX JIT compilation failed" : "stub error";
    return 0;
}
