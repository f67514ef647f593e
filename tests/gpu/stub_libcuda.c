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
 *   STUB_LOG         file receiving one line per cuLaunchKernel / memcpy / event call
 * Built with -DSTUB_OMIT_LAUNCH it lacks cuLaunchKernel (a driver missing an entry point).
 * Built with -DSTUB_EMULATE and linked with tests/gpu/emu/cuda_emu.cpp, cuLaunchKernel runs the
 * kernel in the host emulation, so the real binary's `--backend cuda` path runs end to end on a
 * CPU (tests/test_cuda_host.py compares it with `--backend cpu`). */
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
static int g_nstream, g_nevent;
static char g_fn_names[64][32];
static int g_nfn;

CUresult cuInit(unsigned flags) { (void)flags; return env_int("STUB_CUINIT_RC", 0); }
CUresult cuDriverGetVersion(int *v) { *v = 12060; return 0; }
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
    *ctx = &g_ctx;
    return 0;
}
CUresult cuCtxDestroy_v2(void *ctx) { (void)ctx; return 0; }
CUresult cuCtxPushCurrent_v2(void *ctx) { (void)ctx; return 0; }
CUresult cuCtxPopCurrent_v2(void **ctx) { *ctx = &g_ctx; return 0; }
CUresult cuModuleLoadDataEx(void **mod, const void *img, unsigned n, int *o, void **v) {
    (void)img; (void)n; (void)o; (void)v;
    *mod = &g_mod;
    return env_int("STUB_LOAD_RC", 0);
}
CUresult cuModuleUnload(void *mod) { (void)mod; return 0; }
CUresult cuModuleGetFunction(void **fn, void *mod, const char *name) {
    (void)mod;
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
CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr d, const void *s, size_t n, void *st) {
    (void)st;
    memcpy((void *)(uintptr_t)d, s, n);
    return 0;
}
CUresult cuMemcpyDtoHAsync_v2(void *d, CUdeviceptr s, size_t n, void *st) {
    (void)st;
    memcpy(d, (const void *)(uintptr_t)s, n);
    return 0;
}
CUresult cuMemHostRegister_v2(void *p, size_t n, unsigned flags) {
    logf_("register %zu flags %u", n, flags);
    (void)p;
    return 0;
}
CUresult cuMemHostUnregister(void *p) { (void)p; return 0; }
CUresult cuMemHostGetDevicePointer_v2(CUdeviceptr *d, void *p, unsigned flags) {
    (void)flags;
    *d = (CUdeviceptr)(uintptr_t)p;
    return 0;
}
#ifdef STUB_EMULATE
int emu_launch(const char *name, unsigned gx, unsigned gy, unsigned bx, void **args);
#endif

#ifndef STUB_OMIT_LAUNCH
CUresult cuLaunchKernel(void *fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                        unsigned bz, unsigned shmem, void *stream, void **params, void **extra) {
    (void)gz; (void)by; (void)bz; (void)shmem; (void)params; (void)extra;
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
CUresult cuStreamCreate(void **s, unsigned flags) {
    (void)flags;
    *s = &g_stream[g_nstream++ & 7];
    return 0;
}
CUresult cuStreamDestroy_v2(void *s) { (void)s; return 0; }
CUresult cuStreamSynchronize(void *s) { (void)s; return 0; }
CUresult cuStreamWaitEvent(void *s, void *e, unsigned flags) {
    (void)flags;
    logf_("wait stream %d event %d", (int)((char *)s - g_stream), (int)((char *)e - g_event));
    return 0;
}
CUresult cuEventCreate(void **e, unsigned flags) {
    (void)flags;
    *e = &g_event[g_nevent++ & 7];
    return 0;
}
CUresult cuEventDestroy_v2(void *e) { (void)e; return 0; }
CUresult cuEventRecord(void *e, void *s) {
    logf_("record event %d stream %d", (int)((char *)e - g_event), (int)((char *)s - g_stream));
    return 0;
}
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
