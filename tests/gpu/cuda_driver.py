"""The CUDA driver API calls the kernel suite and the GEMV bench use, through ctypes on
libcuda.so.1 itself: no pycuda (which a GPU machine may lack and cannot build without the CUDA
toolkit's headers), no cuda-bindings, no cupy; only the NVIDIA driver the runtime itself loads
(COLIBRI_LIBCUDA overrides the library, as for the runtime: the tests point it at the stand-in
driver, tests/gpu/stub_libcuda.c, to run the suite in the host emulation).

Signatures and values: NVIDIA's cuda.h / CUDA Driver API reference (the same entry points the
runtime declares in runtime/src/cuda/cuda_driver.h): cuInit, cuDeviceGet, cuDeviceGetCount,
cuDeviceGetAttribute (75/76: compute capability major/minor), cuDeviceGetName, cuCtxCreate_v2,
cuCtxDestroy_v2, cuCtxSynchronize, cuModuleLoadData, cuModuleGetFunction, cuModuleUnload,
cuMemAlloc_v2, cuMemFree_v2, cuMemcpyHtoD_v2, cuMemcpyDtoH_v2, cuMemcpyDtoD_v2, cuMemsetD8_v2,
cuLaunchKernel (kernelParams: an array of pointers to each argument's value), cuEventCreate,
cuEventRecord, cuEventSynchronize, cuEventElapsedTime, cuEventDestroy_v2, cuGetErrorString.
"""

from __future__ import annotations

import ctypes
import os

CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75
CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76
CUDA_ERROR_NOT_FOUND = 500


class CudaError(RuntimeError):
    """A driver call failed: its name, the CUresult and the driver's string for it."""

    def __init__(self, call: str, rc: int, text: str) -> None:
        super().__init__(f"{call} failed: {text} (CUresult {rc})")
        self.call, self.rc = call, rc


class Driver:
    """libcuda.so.1 (or COLIBRI_LIBCUDA), initialised."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path or os.environ.get("COLIBRI_LIBCUDA") or "libcuda.so.1"
        self.lib = ctypes.CDLL(self.path)  # OSError when there is no driver
        self.check("cuInit", self.lib.cuInit(0))

    def check(self, call: str, rc: int) -> None:
        if rc != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(s))
            raise CudaError(call, rc, (s.value or b"unknown error").decode(errors="replace"))

    def device_count(self) -> int:
        n = ctypes.c_int()
        self.check("cuDeviceGetCount", self.lib.cuDeviceGetCount(ctypes.byref(n)))
        return n.value

    def device(self, ordinal: int = 0) -> "Device":
        d = ctypes.c_int()
        self.check("cuDeviceGet", self.lib.cuDeviceGet(ctypes.byref(d), ordinal))
        return Device(self, d.value)


class Device:
    def __init__(self, drv: Driver, handle: int) -> None:
        self.drv, self.handle = drv, handle

    def attribute(self, attr: int) -> int:
        v = ctypes.c_int()
        self.drv.check("cuDeviceGetAttribute",
                       self.drv.lib.cuDeviceGetAttribute(ctypes.byref(v), attr, self.handle))
        return v.value

    def compute_capability(self) -> tuple[int, int]:
        return (self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
                self.attribute(CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))

    def name(self) -> str:
        buf = ctypes.create_string_buffer(256)
        self.drv.check("cuDeviceGetName", self.drv.lib.cuDeviceGetName(buf, 256, self.handle))
        return buf.value.decode(errors="replace")

    def make_context(self) -> "Context":
        return Context(self)


class Function:
    def __init__(self, ctx: "Context", handle: ctypes.c_void_p, name: str) -> None:
        self.ctx, self.handle, self.name = ctx, handle, name

    def launch(self, grid: tuple[int, int], block: tuple[int, int, int], fmt: str, args) -> None:
        """fmt: one letter per argument, "P" a device pointer (0 = NULL), "i" int32, "f" f32."""
        make = {"P": lambda v: ctypes.c_uint64(int(v)), "i": lambda v: ctypes.c_int32(int(v)),
                "f": lambda v: ctypes.c_float(float(v))}
        values = [make[c](v) for c, v in zip(fmt, args)]
        params = (ctypes.c_void_p * max(len(values), 1))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        lib = self.ctx.drv.lib
        self.ctx.drv.check(f"cuLaunchKernel({self.name})", lib.cuLaunchKernel(
            self.handle, ctypes.c_uint(grid[0]), ctypes.c_uint(grid[1]), ctypes.c_uint(1),
            ctypes.c_uint(block[0]), ctypes.c_uint(block[1]), ctypes.c_uint(block[2]),
            ctypes.c_uint(0), ctypes.c_void_p(0), params, ctypes.c_void_p(0)))


class Module:
    def __init__(self, ctx: "Context", image: bytes) -> None:
        self.ctx = ctx
        self.handle = ctypes.c_void_p()
        self.image = ctypes.create_string_buffer(image, len(image))  # kept alive with the module
        ctx.drv.check("cuModuleLoadData", ctx.drv.lib.cuModuleLoadData(
            ctypes.byref(self.handle), self.image))

    def get_function(self, name: str) -> Function:
        fn = ctypes.c_void_p()
        self.ctx.drv.check(f"cuModuleGetFunction({name})", self.ctx.drv.lib.cuModuleGetFunction(
            ctypes.byref(fn), self.handle, name.encode()))
        return Function(self.ctx, fn, name)


class Event:
    def __init__(self, ctx: "Context") -> None:
        self.ctx, self.handle = ctx, ctypes.c_void_p()
        ctx.drv.check("cuEventCreate", ctx.drv.lib.cuEventCreate(ctypes.byref(self.handle), 0))

    def record(self) -> None:
        self.ctx.drv.check("cuEventRecord", self.ctx.drv.lib.cuEventRecord(self.handle, None))

    def synchronize(self) -> None:
        self.ctx.drv.check("cuEventSynchronize", self.ctx.drv.lib.cuEventSynchronize(self.handle))

    def destroy(self) -> None:
        if self.handle:
            self.ctx.drv.lib.cuEventDestroy_v2(self.handle)
            self.handle = ctypes.c_void_p()

    def time_since(self, start: "Event") -> float:
        ms = ctypes.c_float()
        self.ctx.drv.check("cuEventElapsedTime", self.ctx.drv.lib.cuEventElapsedTime(
            ctypes.byref(ms), start.handle, self.handle))
        return ms.value


class Context:
    """A context on the device, current on this thread; device memory as plain integers."""

    def __init__(self, dev: Device) -> None:
        self.drv = dev.drv
        self.handle = ctypes.c_void_p()
        self.drv.check("cuCtxCreate", self.drv.lib.cuCtxCreate_v2(ctypes.byref(self.handle), 0,
                                                                  dev.handle))
        self.allocs: list[int] = []

    def module(self, image: bytes) -> Module:
        return Module(self, image)

    def alloc(self, nbytes: int) -> int:
        p = ctypes.c_uint64()
        self.drv.check("cuMemAlloc", self.drv.lib.cuMemAlloc_v2(ctypes.byref(p),
                                                                ctypes.c_size_t(max(nbytes, 4))))
        self.allocs.append(p.value)
        return p.value

    def htod(self, dst: int, data: bytes | memoryview) -> None:
        buf = (ctypes.c_char * len(data)).from_buffer_copy(data)
        self.drv.check("cuMemcpyHtoD", self.drv.lib.cuMemcpyHtoD_v2(
            ctypes.c_uint64(dst), buf, ctypes.c_size_t(len(data))))

    def dtoh(self, src: int, nbytes: int) -> bytes:
        buf = ctypes.create_string_buffer(nbytes)
        self.drv.check("cuMemcpyDtoH", self.drv.lib.cuMemcpyDtoH_v2(
            buf, ctypes.c_uint64(src), ctypes.c_size_t(nbytes)))
        return buf.raw

    def dtod(self, dst: int, src: int, nbytes: int) -> None:
        self.drv.check("cuMemcpyDtoD", self.drv.lib.cuMemcpyDtoD_v2(
            ctypes.c_uint64(dst), ctypes.c_uint64(src), ctypes.c_size_t(nbytes)))

    def memset8(self, dst: int, value: int, nbytes: int) -> None:
        self.drv.check("cuMemsetD8", self.drv.lib.cuMemsetD8_v2(
            ctypes.c_uint64(dst), ctypes.c_ubyte(value), ctypes.c_size_t(nbytes)))

    def synchronize(self) -> None:
        self.drv.check("cuCtxSynchronize", self.drv.lib.cuCtxSynchronize())

    def free_all(self) -> None:
        for p in self.allocs:
            self.drv.lib.cuMemFree_v2(ctypes.c_uint64(p))
        self.allocs.clear()

    def close(self) -> None:
        self.free_all()
        self.drv.lib.cuCtxDestroy_v2(self.handle)
