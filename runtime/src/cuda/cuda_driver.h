/* The few CUDA driver API types, constants and entry points the backend uses, declared here
 * instead of including cuda.h: the host C is cross-compiled by zig without any CUDA headers, and
 * the functions are looked up at run time with dlsym in libcuda.so.1 (cuda_backend.c).
 *
 * Values are those of the driver API ABI (stable since CUDA 4; the _v2 symbols are the 64-bit
 * ones every driver since CUDA 3.2 exports and still exports for old binaries). */
#ifndef COLIBRI_CUDA_DRIVER_H
#define COLIBRI_CUDA_DRIVER_H

#include <stddef.h>

typedef int CUresult;               /* CUDA_SUCCESS == 0 */
typedef int CUdevice;
typedef unsigned long long CUdeviceptr; /* 64-bit hosts only (x86_64, aarch64) */
typedef struct CUctx_st *CUcontext;
typedef struct CUmod_st *CUmodule;
typedef struct CUfunc_st *CUfunction;
typedef struct CUstream_st *CUstream;
typedef struct CUevent_st *CUevent;

#define CUDA_SUCCESS 0
#define CUDA_ERROR_NO_DEVICE 100

/* CUdevice_attribute */
#define CU_DEVICE_ATTRIBUTE_INTEGRATED 18
#define CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY 19
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR 75
#define CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR 76
/* cuMemHostRegister at all / with CU_MEMHOSTREGISTER_READ_ONLY (cuda.h of CUDA 11.1+: 99, 113) */
#define CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED 99
#define CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED 113

/* cuCtxCreate flags */
#define CU_CTX_MAP_HOST 0x08

/* cuMemHostRegister flags */
#define CU_MEMHOSTREGISTER_DEVICEMAP 0x02
#define CU_MEMHOSTREGISTER_READ_ONLY 0x08

/* cuStreamCreate / cuEventCreate flags */
#define CU_STREAM_NON_BLOCKING 0x1
#define CU_EVENT_DISABLE_TIMING 0x2

/* CUjit_option for cuModuleLoadDataEx: where the PTX JIT writes its error log */
#define CU_JIT_ERROR_LOG_BUFFER 5
#define CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES 6

/* Entry points, as function-pointer types named after the symbol they are loaded from. */
typedef CUresult (*cuInit_t)(unsigned int flags);
typedef CUresult (*cuDriverGetVersion_t)(int *version);
typedef CUresult (*cuDeviceGetCount_t)(int *count);
typedef CUresult (*cuDeviceGet_t)(CUdevice *dev, int ordinal);
typedef CUresult (*cuDeviceGetAttribute_t)(int *value, int attrib, CUdevice dev);
typedef CUresult (*cuDeviceGetName_t)(char *name, int len, CUdevice dev);
typedef CUresult (*cuCtxCreate_v2_t)(CUcontext *ctx, unsigned int flags, CUdevice dev);
typedef CUresult (*cuCtxDestroy_v2_t)(CUcontext ctx);
typedef CUresult (*cuCtxPushCurrent_v2_t)(CUcontext ctx);
typedef CUresult (*cuCtxPopCurrent_v2_t)(CUcontext *ctx);
typedef CUresult (*cuModuleLoadDataEx_t)(CUmodule *mod, const void *image, unsigned int n_opts,
                                         int *opts, void **values);
typedef CUresult (*cuModuleUnload_t)(CUmodule mod);
typedef CUresult (*cuModuleGetFunction_t)(CUfunction *fn, CUmodule mod, const char *name);
typedef CUresult (*cuMemAlloc_v2_t)(CUdeviceptr *ptr, size_t bytes);
typedef CUresult (*cuMemFree_v2_t)(CUdeviceptr ptr);
typedef CUresult (*cuMemcpyHtoD_v2_t)(CUdeviceptr dst, const void *src, size_t bytes);
typedef CUresult (*cuMemcpyHtoDAsync_v2_t)(CUdeviceptr dst, const void *src, size_t bytes,
                                           CUstream stream);
typedef CUresult (*cuMemcpyDtoHAsync_v2_t)(void *dst, CUdeviceptr src, size_t bytes,
                                           CUstream stream);
typedef CUresult (*cuMemHostRegister_v2_t)(void *p, size_t bytes, unsigned int flags);
typedef CUresult (*cuMemHostUnregister_t)(void *p);
typedef CUresult (*cuMemHostGetDevicePointer_v2_t)(CUdeviceptr *dptr, void *p,
                                                    unsigned int flags);
typedef CUresult (*cuLaunchKernel_t)(CUfunction fn, unsigned int gx, unsigned int gy,
                                     unsigned int gz, unsigned int bx, unsigned int by,
                                     unsigned int bz, unsigned int shared_bytes, CUstream stream,
                                     void **params, void **extra);
typedef CUresult (*cuStreamCreate_t)(CUstream *stream, unsigned int flags);
typedef CUresult (*cuStreamDestroy_v2_t)(CUstream stream);
typedef CUresult (*cuStreamSynchronize_t)(CUstream stream);
typedef CUresult (*cuStreamWaitEvent_t)(CUstream stream, CUevent ev, unsigned int flags);
typedef CUresult (*cuEventCreate_t)(CUevent *ev, unsigned int flags);
typedef CUresult (*cuEventDestroy_v2_t)(CUevent ev);
typedef CUresult (*cuEventRecord_t)(CUevent ev, CUstream stream);
typedef CUresult (*cuEventSynchronize_t)(CUevent ev);
/* Page-locked host memory (the weight upload's staging buffers, the logits buffer): as in the
 * CUDA driver API reference (cuMemAllocHost / cuMemFreeHost, "Memory Management") and the driver
 * bindings on docs.rs (cuda_driver_sys::cuMemAllocHost_v2(pp: *mut *mut c_void, bytesize: usize),
 * NVIDIA's cuda-python driver.cuMemFreeHost(p)); cuMemAllocHost is a macro for the _v2 symbol
 * since CUDA 3.2. */
typedef CUresult (*cuMemAllocHost_v2_t)(void **pp, size_t bytes);
typedef CUresult (*cuMemFreeHost_t)(void *p);
typedef CUresult (*cuGetErrorString_t)(CUresult err, const char **str);
/* CUDA graphs by stream capture (decode, docs/cuda.md "CUDA-graph decode"). Optional: looked up
 * apart from the entry points above, and a driver without them keeps plain launches. Names and
 * signatures as in NVIDIA's cuda.h of CUDA 11.8+ (cuStreamBeginCapture is a macro for the _v2
 * symbol since CUDA 10.1; cuGraphInstantiateWithFlags exists since 11.4 and is what
 * cuGraphInstantiate maps to in CUDA 12), cross-checked against the driver bindings on docs.rs
 * (cudarc::driver::sys, cust_raw): cuStreamBeginCapture_v2(CUstream, CUstreamCaptureMode),
 * cuStreamEndCapture(CUstream, CUgraph *), cuGraphInstantiateWithFlags(CUgraphExec *, CUgraph,
 * unsigned long long), cuGraphLaunch(CUgraphExec, CUstream), cuGraphExecDestroy(CUgraphExec),
 * cuGraphDestroy(CUgraph). CUstreamCaptureMode: GLOBAL 0, THREAD_LOCAL 1, RELAXED 2. */
typedef struct CUgraph_st *CUgraph;
typedef struct CUgraphExec_st *CUgraphExec;
#define CU_STREAM_CAPTURE_MODE_THREAD_LOCAL 1
typedef CUresult (*cuStreamBeginCapture_v2_t)(CUstream stream, int mode);
typedef CUresult (*cuStreamEndCapture_t)(CUstream stream, CUgraph *graph);
typedef CUresult (*cuGraphInstantiateWithFlags_t)(CUgraphExec *exec, CUgraph graph,
                                                  unsigned long long flags);
typedef CUresult (*cuGraphLaunch_t)(CUgraphExec exec, CUstream stream);
typedef CUresult (*cuGraphExecDestroy_t)(CUgraphExec exec);
typedef CUresult (*cuGraphDestroy_t)(CUgraph graph);
/* used only by the copy-bandwidth probe (colibri_cuda_copy_bandwidth) */
typedef CUresult (*cuMemcpyDtoD_v2_t)(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
typedef CUresult (*cuCtxSynchronize_t)(void);

#endif
