"""A GPU session for the kernel conformance checks (conformance.py): device 0, the kernel image
a built colibri ships (chosen by the runtime's rule), device memory and launches, through pycuda
where it is installed (the design's interface) or the driver itself (cuda_driver.py: ctypes on
libcuda.so.1). No pytest here: test_kernels_gpu.py (pytest) and run_conformance.py (a GPU
machine with numpy only) both use it.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np

import cuda_driver
import kernel_reference as ref
from gpu_images import binary_images, pick, ptx_signatures


class _Ops:
    """What both ways share: device 0's SM and name (pycuda's Device and cuda_driver.Device
    answer the same two calls)."""

    dev = None

    def sm(self) -> int:
        major, minor = self.dev.compute_capability()
        return major * 10 + minor

    def device_name(self) -> str:
        return self.dev.name()


class PycudaOps(_Ops):
    """Memory, modules and launches through pycuda."""

    name = "pycuda"

    def __init__(self, cuda) -> None:
        self.cuda = cuda
        self.dev = cuda.Device(0)
        self.ctx = self.dev.make_context()
        self.allocs: list = []

    def load(self, image: bytes):
        return self.cuda.module_from_buffer(image)

    def function(self, module, name: str):
        try:
            return module.get_function(name)
        except self.cuda.LogicError:
            return None

    def put(self, a: np.ndarray) -> int:
        buf = self.cuda.mem_alloc(max(a.nbytes, 4))
        if a.nbytes:
            self.cuda.memcpy_htod(buf, a)
        self.allocs.append(buf)
        return int(buf)

    def get(self, ptr: int, out: np.ndarray) -> None:
        self.cuda.memcpy_dtoh(out, ptr)

    def launch(self, fn, fmt: str, grid, block: int, args) -> None:
        fn.prepare(fmt)
        fn.prepared_call(grid, (block, 1, 1), *args)
        self.cuda.Context.synchronize()

    def close(self) -> None:
        self.allocs.clear()
        self.ctx.pop()
        self.ctx.detach()


class DriverOps(_Ops):
    """The same through the driver API itself (tests/gpu/cuda_driver.py)."""

    name = "driver"

    def __init__(self, drv: cuda_driver.Driver) -> None:
        self.dev = drv.device(0)
        self.ctx = self.dev.make_context()

    def load(self, image: bytes):
        return self.ctx.module(image)

    def function(self, module, name: str):
        try:
            return module.get_function(name)
        except cuda_driver.CudaError as exc:
            if exc.rc == cuda_driver.CUDA_ERROR_NOT_FOUND:
                return None
            raise

    def put(self, a: np.ndarray) -> int:
        ptr = self.ctx.alloc(a.nbytes)
        if a.nbytes:
            self.ctx.htod(ptr, a.tobytes())
        return ptr

    def get(self, ptr: int, out: np.ndarray) -> None:
        out[...] = np.frombuffer(self.ctx.dtoh(ptr, out.nbytes), out.dtype).reshape(out.shape)

    def launch(self, fn, fmt: str, grid, block: int, args) -> None:
        fn.launch(grid, (block, 1, 1), fmt, args)
        self.ctx.synchronize()

    def close(self) -> None:
        self.ctx.close()


class NoGpu(Exception):
    """No GPU to run on (no driver library, or no device): the one reason a caller may skip."""


def open_ops(want: str = "auto"):
    """pycuda where it is importable (and asked for), else the driver; NoGpu naming what is
    missing when there is no GPU at all."""
    if want in ("auto", "pycuda"):
        try:
            import pycuda.driver as cuda
        except ImportError as exc:
            if want == "pycuda":
                raise RuntimeError(f"COLIBRI_GPU_DRIVER=pycuda but pycuda is not importable "
                                   f"({exc})") from None
        else:
            try:
                cuda.init()
                count = cuda.Device.count()
            except Exception as exc:  # pycuda.driver.Error (no device), OSError (no libcuda)
                raise NoGpu(f"no CUDA GPU: pycuda's cuInit failed ({exc})") from None
            if count == 0:
                raise NoGpu("no CUDA GPU: the driver reports 0 devices")
            return PycudaOps(cuda)
    try:
        drv = cuda_driver.Driver()
    except OSError as exc:
        raise NoGpu(f"no NVIDIA driver ({exc}): the suite needs a GPU") from None
    except cuda_driver.CudaError as exc:
        raise NoGpu(f"no CUDA GPU: {exc}") from None
    if drv.device_count() == 0:
        raise NoGpu("no CUDA GPU: the driver reports 0 devices")
    return DriverOps(drv)


# ---------------------------------------------------------------- the GPU and the shipped image


class Gpu:
    """A context on device 0 with the shipped kernel module loaded, plus tiny memory helpers
    (the interface conformance.py calls: put, zeros, get, run, routing_mode)."""

    def __init__(self, binary: Path, want: str = "auto", target: str = "host") -> None:
        self.ops = open_ops(want)
        self.sm = self.ops.sm()
        if not binary.is_file():
            raise RuntimeError(f"{binary} does not exist: build it for this GPU first "
                               f"(invoke build --target {target} --cuda-archs sm_{self.sm})")
        self.binary = binary
        images = binary_images(binary)
        img = pick(images, self.sm)
        if img is None:
            raise RuntimeError(f"{binary} has no image for sm_{self.sm} "
                               f"({', '.join(f'{i.kind} {i.sm}' for i in images) or 'none'}); "
                               f"rebuild with --cuda-archs sm_{self.sm}")
        self.image = img
        ptx = [i for i in images if i.kind == "ptx"]
        assert ptx, "the build embeds PTX next to the cubins"
        # every PTX: the tensor-core kernels are only in the sm_80+ one when there are two
        self.signatures = {}
        for p in ptx:
            self.signatures.update(ptx_signatures(p.data[:-1].decode()))
        self.routing_mode = _routing_mode(binary)
        self.module = self.ops.load(img.data)
        self.functions: dict = {}

    def close(self) -> None:
        self.module = None
        self.ops.close()

    def has_function(self, name: str) -> bool:
        return self.ops.function(self.module, name) is not None

    # memory
    def put(self, a: np.ndarray) -> int:
        return self.ops.put(np.ascontiguousarray(a))

    def zeros(self, shape, dtype=np.float32) -> int:
        return self.put(np.zeros(shape, dtype))

    def get(self, ptr: int, shape, dtype=np.float32) -> np.ndarray:
        out = np.empty(shape, dtype)
        self.ops.get(ptr, out)
        return out

    # launch, with the argument format checked against the compiled PTX signature
    def run(self, name: str, fmt: str, grid: tuple[int, int], block: int, *args) -> None:
        assert self.signatures.get(name) == fmt, (name, self.signatures.get(name), fmt)
        assert len(args) == len(fmt)
        if name not in self.functions:
            self.functions[name] = self.ops.function(self.module, name)
        fn = self.functions[name]
        assert fn is not None, f"{self.image.kind} sm_{self.image.sm} has no kernel {name}"
        self.ops.launch(fn, fmt, grid, block, args)


def _routing_mode(binary: Path) -> int:
    """COLIBRI_ROUTING_MODE the binary was built with (the router kernel follows it)."""
    out = subprocess.run([str(binary), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"COLIBRI_ROUTING_MODE=(\w+)", out)
    assert m, out
    return ref.SOFTMAX_TOPK if m.group(1) == "softmax_topk" else ref.LINEAR_SCORE
