"""GPU tasks: the kernel conformance suite (tests/gpu/test_kernels_gpu.py) and the GEMV bench
(tests/gpu/bench_gemv.py) against a built target, on this machine's GPU.

Both are developer tools that live in the checkout, not in the product package: the task runs
them by path (python -m pytest FILE, python FILE) and imports nothing from tests/ or scripts/.
Here a missing GPU is an error (the user asked for a GPU check), not a skip.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

from invoke import Context, task

from colibri_kit import paths
from colibri_kit.errors import BuildError, KitError
from colibri_kit.tasks._common import user_errors

SUITE = ("tests", "gpu", "test_kernels_gpu.py")
BENCH = ("tests", "gpu", "bench_gemv.py")


class GpuCheckError(KitError):
    """The GPU suite could not run, or failed."""


def probe_gpu() -> tuple[int, str]:
    """(SM of device 0, its name) from the driver (libcuda.so.1, or COLIBRI_LIBCUDA), the library
    the runtime itself loads; GpuCheckError naming what is missing otherwise."""
    name = os.environ.get("COLIBRI_LIBCUDA") or "libcuda.so.1"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise GpuCheckError(f"no NVIDIA driver: {exc}; the GPU check needs a machine with an "
                            f"NVIDIA GPU and its driver") from None
    count, major, minor = ctypes.c_int(), ctypes.c_int(), ctypes.c_int()
    dev = ctypes.c_int()
    rc = lib.cuInit(0)
    if rc == 0:
        rc = lib.cuDeviceGetCount(ctypes.byref(count))
    if rc != 0 or count.value == 0:
        raise GpuCheckError(f"no usable CUDA GPU: cuInit/cuDeviceGetCount returned CUresult {rc}, "
                            f"{count.value} devices")
    buf = ctypes.create_string_buffer(256)
    lib.cuDeviceGet(ctypes.byref(dev), 0)
    lib.cuDeviceGetAttribute(ctypes.byref(major), 75, dev)  # compute capability major
    lib.cuDeviceGetAttribute(ctypes.byref(minor), 76, dev)  # and minor
    lib.cuDeviceGetName(buf, 256, dev)
    return major.value * 10 + minor.value, buf.value.decode(errors="replace")


def run_suite(target: str, pytest_args: list[str] | None = None,
              python: str = sys.executable) -> int:
    """Run the suite for dist/<target>; returns pytest's exit status (0 = all passed)."""
    binary = paths.dist_dir(target) / "bin" / "colibri"
    sm, name = probe_gpu()
    if not binary.is_file():
        raise BuildError(f"{binary} does not exist: build it first with `invoke build --target "
                         f"{target}{' --cuda-archs sm_%d' % sm if target == 'host' else ''}`")
    print(f"gpucheck: {name} (sm_{sm}), kernels from {binary}", flush=True)
    env = dict(os.environ, COLIBRI_GPU_TARGET=target)
    argv = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            str(paths.project_root().joinpath(*SUITE)), *(pytest_args or [])]
    return subprocess.run(argv, env=env, cwd=paths.project_root()).returncode


def run_bench(target: str, python: str = sys.executable) -> int:
    """Print decode-GEMV bandwidth of dist/<target>'s kernels vs the GPU's copy bandwidth."""
    env = dict(os.environ, COLIBRI_GPU_TARGET=target)
    return subprocess.run([python, str(paths.project_root().joinpath(*BENCH))], env=env,
                          cwd=paths.project_root()).returncode


@task(name="gpucheck", aliases=["gpu-check"], help={
    "target": "built target whose dist/TARGET/bin/colibri supplies the kernels (default host)",
    "k": "only the tests matching this pytest -k expression (e.g. linear or attention)",
    "bench": "then print decode-GEMV bandwidth vs the GPU's copy bandwidth (tests/gpu/bench_gemv.py)",
})
@user_errors
def gpucheck_task(c: Context, target: str = "host", k: str = "", bench: bool = False) -> None:
    """Run the kernel suite + CUDA-vs-CPU forward on this machine's GPU (pycuda or the driver)."""
    args = ["-k", k] if k else []
    rc = run_suite(target, args)
    if rc != 0:
        raise GpuCheckError(f"GPU conformance suite failed for {target} "
                            f"(pytest exit status {rc}; details above)")
    print(f"gpucheck: {target} passed")
    if bench and run_bench(target) != 0:
        raise GpuCheckError("the GEMV bandwidth benchmark failed (details above)")


TASKS = [gpucheck_task]
