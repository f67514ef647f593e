"""The kernel conformance suite on a GPU: every CUDA kernel, loaded from the exact image a build
shipped, on random inputs of several shapes (odd sizes, E up to 64), compared with NumPy
(tests/gpu/kernel_reference.py), then the whole binary: `colibri forward --backend cuda` against
the CPU path, and run to run.

Run it with `invoke gpucheck --target host` (after `invoke build --target host --cuda-archs sm_XX`
for the GPU at hand) or on a Jetson with its own target. It talks to the GPU through pycuda where
pycuda is installed (the design's interface), else through the driver itself
(tests/gpu/cuda_driver.py: ctypes on libcuda.so.1, what a GPU machine without pycuda, cupy or a
CUDA toolkit has). Environment:
  COLIBRI_GPU_TARGET   which dist/<target>/bin/colibri to take the kernels from (default host)
  COLIBRI_GPU_BINARY   a colibri binary to take them from instead
  COLIBRI_GPU_DRIVER   pycuda | driver | auto (default: pycuda when importable, else driver)
  COLIBRI_LIBCUDA      the driver library (tests: the stand-in, running the kernels emulated)

It skips, saying why, only when there is no GPU (no driver library, or no device). A missing or
wrong build on a machine that has a GPU is a failure, not a skip.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import conformance as C  # noqa: E402
from gpu_session import Gpu, NoGpu  # noqa: E402

from colibri_kit import paths  # noqa: E402
from colibri_kit.model.format import DType  # noqa: E402

pytestmark = pytest.mark.gpu

TARGET = os.environ.get("COLIBRI_GPU_TARGET", "host")
WANT = os.environ.get("COLIBRI_GPU_DRIVER", "auto")


@pytest.fixture(scope="module")
def gpu():
    binary = Path(os.environ.get("COLIBRI_GPU_BINARY") or paths.dist_dir(TARGET) / "bin" / "colibri")
    try:
        g = Gpu(binary, WANT, TARGET)
    except NoGpu as exc:
        pytest.skip(str(exc))
    except RuntimeError as exc:  # a GPU, but no usable build for it: a failure
        pytest.fail(str(exc))
    yield g
    g.close()


# ---------------------------------------------------------------- per-kernel conformance

CASES = C.cases()


@pytest.mark.parametrize("check", [c for _, c in CASES], ids=[name for name, _ in CASES])
def test_kernel(gpu, check):
    """One kernel check of conformance.py at one shape (the id names kernel, dtype, shape)."""
    check(gpu)


# ---------------------------------------------------------------- the whole binary on this GPU


def _forward(gpu: Gpu, model: Path, backend: str, ids: str, out: Path) -> np.ndarray:
    proc = subprocess.run([str(gpu.binary), "--backend", backend, "forward", str(model), "--ids",
                           ids, "--logits-out", str(out)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    return np.fromfile(out, "<f4")


@pytest.mark.parametrize("case", ["tiny-f32", "tiny-int8", "shared-gate-qknorm-bf16"])
def test_binary_cuda_matches_cpu(gpu: Gpu, tmp_path: Path, case: str):
    """`colibri forward --backend cuda` == the CPU path within the documented tolerance
    (docs/cuda.md: 1e-4 x max |logit| for f32 weights, 1e-3 for 16/8-bit weights), and bitwise
    identical run to run on the GPU."""
    from colibri_kit.model.format import Family, ModelHeader, Routing, padded_dim
    from colibri_kit.model.tiny import write_random_model, write_tiny_model

    info = subprocess.run([str(gpu.binary), "--version"], capture_output=True, text=True)
    pad = int(re.search(r"COLIBRI_EMBED_DIM_PAD=(\d+)", info.stdout).group(1))
    model = tmp_path / "m.colibri"
    if case == "tiny-f32":
        write_tiny_model(model, pad=pad)
        tol = 1e-4
    elif case == "tiny-int8":
        write_tiny_model(model, pad=pad, dtype=DType.INT8)
        tol = 1e-3
    else:
        d = 72
        h = ModelHeader(num_experts=16, expert_size=40, vocab_size=300, max_seq_len=64,
                        embed_dim=d, n_layers=2, n_heads=6, n_kv_heads=2, head_dim=12, top_k=4,
                        routing=Routing.RENORMALISE, dtype=int(DType.BF16),
                        embed_dim_pad=padded_dim(d, pad), pad_multiple=pad, flags=0b100111,
                        shared_expert_size=24, family=Family.OTHER, name="gpucheck")
        write_random_model(model, h, seed=11)
        tol = 1e-3
    ids = ",".join(str(i) for i in [1, 5, 9, 2, 200 % 256, 7, 7, 3, 0, 42, 11, 13, 17, 19, 23, 29,
                                    31, 37, 41, 43, 47, 53, 59, 61, 67, 71, 73, 79, 83, 89, 97,
                                    101, 103, 107])  # 34 tokens: more than one device chunk
    cpu = _forward(gpu, model, "cpu", ids, tmp_path / "cpu.f32")
    gpu1 = _forward(gpu, model, "cuda", ids, tmp_path / "gpu1.f32")
    gpu2 = _forward(gpu, model, "cuda", ids, tmp_path / "gpu2.f32")
    assert np.array_equal(gpu1, gpu2), "GPU logits differ run to run"
    err = np.abs(gpu1 - cpu).max() / np.abs(cpu).max()
    print(f"{case}: max |gpu - cpu| / max |logit| = {err:.3g}")
    assert err <= tol, err


def test_binary_reports_the_gpu(gpu: Gpu, tmp_path: Path):
    from colibri_kit.model.tiny import write_tiny_model

    info = subprocess.run([str(gpu.binary), "--version"], capture_output=True, text=True)
    pad = int(re.search(r"COLIBRI_EMBED_DIM_PAD=(\d+)", info.stdout).group(1))
    model = write_tiny_model(tmp_path / "t.colibri", pad=pad)
    proc = subprocess.run([str(gpu.binary), "--backend", "cuda", "info", str(model)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    backend = json.loads(proc.stdout)["backend"]
    assert backend["name"] == "cuda" and backend["cuda_sm"] == gpu.sm
    assert backend["cuda_device"] == gpu.ops.device_name()
