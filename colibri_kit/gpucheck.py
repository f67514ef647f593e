"""Run the GPU conformance suite (tests/gpu/test_kernels_pycuda.py) against a built target.

The suite loads the exact kernel images embedded in dist/<target>/bin/colibri, checks every
kernel against NumPy, then compares `colibri forward --backend cuda` with the CPU path. Here, a
missing GPU or pycuda is an error (the user asked for a GPU check), not a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from colibri_kit import paths
from colibri_kit.errors import BuildError, KitError

SUITE = Path("tests") / "gpu" / "test_kernels_pycuda.py"

_PROBE = ("import pycuda.driver as d\n"
          "d.init()\n"
          "n = d.Device.count()\n"
          "dev = d.Device(0) if n else None\n"
          "print(n, ''.join(map(str, dev.compute_capability())) if dev else 0,"
          " dev.name() if dev else '')\n")


class GpuCheckError(KitError):
    """The GPU suite could not run, or failed."""


def probe_gpu(python: str = sys.executable) -> tuple[int, str]:
    """-> (SM of device 0, its name); GpuCheckError naming what is missing otherwise."""
    proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        if "No module named 'pycuda'" in proc.stderr:
            raise GpuCheckError("pycuda is not installed: `pip install 'colibri-kit[gpu]'` on a "
                                "machine with an NVIDIA driver and the CUDA toolkit (pycuda "
                                "builds against cuda.h)")
        raise GpuCheckError(f"no usable CUDA GPU: {last}")
    count, sm, name = proc.stdout.strip().split(" ", 2)
    if int(count) == 0:
        raise GpuCheckError("no CUDA GPU: the driver reports 0 devices")
    return int(sm), name


def run_suite(target: str, pytest_args: list[str] | None = None,
              python: str = sys.executable) -> int:
    """Run the suite for dist/<target>; returns pytest's exit status (0 = all passed)."""
    binary = paths.dist_dir(target) / "bin" / "colibri"
    sm, name = probe_gpu(python)
    if not binary.is_file():
        raise BuildError(f"{binary} does not exist: build it first with `invoke build --target "
                         f"{target}{' --cuda-archs sm_%d' % sm if target == 'host' else ''}`")
    print(f"gpucheck: {name} (sm_{sm}), kernels from {binary}", flush=True)
    env = dict(os.environ, COLIBRI_GPU_TARGET=target)
    argv = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            str(paths.project_root() / SUITE), *(pytest_args or [])]
    return subprocess.run(argv, env=env, cwd=paths.project_root()).returncode


BENCH = Path("tests") / "gpu" / "bench_gemv.py"


def run_bench(target: str, python: str = sys.executable) -> int:
    """Print decode-GEMV bandwidth of dist/<target>'s kernels vs the GPU's copy bandwidth."""
    env = dict(os.environ, COLIBRI_GPU_TARGET=target)
    return subprocess.run([python, str(paths.project_root() / BENCH)], env=env,
                          cwd=paths.project_root()).returncode
