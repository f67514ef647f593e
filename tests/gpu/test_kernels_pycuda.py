"""pycuda conformance suite: every CUDA kernel, loaded from the exact image a build shipped, on
random inputs of several shapes (odd sizes, E up to 64), compared with NumPy
(tests/gpu/kernel_reference.py), then the whole binary: `colibri forward --backend cuda` against
the CPU path, and run to run.

Run it with `invoke gpucheck --target host` (after `invoke build --target host --cuda-archs sm_XX`
for the GPU at hand) or on a Jetson with its own target. Environment:
  COLIBRI_GPU_TARGET   which dist/<target>/bin/colibri to take the kernels from (default host)

It skips, saying why, only when pycuda or a GPU is missing. A missing or wrong build on a machine
that has a GPU is a failure, not a skip.
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
import kernel_reference as ref  # noqa: E402
from gpu_images import binary_images, pick, ptx_signatures  # noqa: E402

try:
    import pycuda.driver as cuda
except Exception as exc:  # ImportError, or OSError when libcuda.so.1 is missing
    pytest.skip(f"pycuda unavailable ({type(exc).__name__}: {exc}); install the `gpu` extra on a "
                "machine with an NVIDIA GPU and the CUDA toolkit", allow_module_level=True)

try:
    cuda.init()
    _NDEV = cuda.Device.count()
except Exception as exc:  # pycuda.driver.Error, e.g. CUDA_ERROR_NO_DEVICE
    pytest.skip(f"no CUDA GPU: cuInit failed ({exc})", allow_module_level=True)
if _NDEV == 0:
    pytest.skip("no CUDA GPU: the driver reports 0 devices", allow_module_level=True)

from colibri_kit import paths  # noqa: E402
from colibri_kit.model.format import DType  # noqa: E402

pytestmark = pytest.mark.gpu

TARGET = os.environ.get("COLIBRI_GPU_TARGET", "host")


# ---------------------------------------------------------------- the GPU and the shipped image


class Gpu:
    """A context on device 0 with the shipped kernel module loaded, plus tiny memory helpers."""

    def __init__(self, target: str) -> None:
        self.dev = cuda.Device(0)
        major, minor = self.dev.compute_capability()
        self.sm = major * 10 + minor
        binary = paths.dist_dir(target) / "bin" / "colibri"
        if not binary.is_file():
            pytest.fail(f"{binary} does not exist: build it for this GPU first "
                        f"(invoke build --target {target} --cuda-archs sm_{self.sm})")
        self.binary = binary
        images = binary_images(binary)
        img = pick(images, self.sm)
        if img is None:
            pytest.fail(f"{binary} has no image for sm_{self.sm} "
                        f"({', '.join(f'{i.kind} {i.sm}' for i in images) or 'none'}); rebuild "
                        f"with --cuda-archs sm_{self.sm}")
        self.image = img
        ptx = [i for i in images if i.kind == "ptx"]
        assert ptx, "the build embeds PTX next to the cubins"
        # every PTX: the tensor-core kernels are only in the sm_80+ one when there are two
        self.signatures = {}
        for p in ptx:
            self.signatures.update(ptx_signatures(p.data[:-1].decode()))
        self.routing_mode = _routing_mode(target)
        self.ctx = self.dev.make_context()
        self.module = cuda.module_from_buffer(img.data)
        self.allocs: list = []

    def close(self) -> None:
        self.allocs.clear()
        self.module = None
        self.ctx.pop()
        self.ctx.detach()

    # memory
    def put(self, a: np.ndarray) -> int:
        a = np.ascontiguousarray(a)
        buf = cuda.mem_alloc(max(a.nbytes, 4))
        if a.nbytes:
            cuda.memcpy_htod(buf, a)
        self.allocs.append(buf)
        return int(buf)

    def zeros(self, shape, dtype=np.float32) -> int:
        return self.put(np.zeros(shape, dtype))

    def get(self, ptr: int, shape, dtype=np.float32) -> np.ndarray:
        out = np.empty(shape, dtype)
        cuda.memcpy_dtoh(out, ptr)
        return out

    # launch, with the argument format checked against the compiled PTX signature
    def run(self, name: str, fmt: str, grid: tuple[int, int], block: int, *args) -> None:
        assert self.signatures.get(name) == fmt, (name, self.signatures.get(name), fmt)
        assert len(args) == len(fmt)
        fn = self.module.get_function(name)
        fn.prepare(fmt)
        fn.prepared_call(grid, (block, 1, 1), *args)
        cuda.Context.synchronize()


@pytest.fixture(scope="module")
def gpu():
    g = Gpu(TARGET)
    yield g
    g.close()


def _routing_mode(target: str) -> int:
    """COLIBRI_ROUTING_MODE the target was built with (the router kernel follows it)."""
    header = paths.build_dir(target) / "include" / "colibri_config.h"
    m = re.search(r"#define COLIBRI_ROUTING_MODE (\w+)", header.read_text())
    assert m, header
    return ref.SOFTMAX_TOPK if m.group(1) == "COLIBRI_ROUTING_SOFTMAX_TOPK" else ref.LINEAR_SCORE


# ---------------------------------------------------------------- per-kernel conformance

_dt = {"ids": lambda d: d.name}


@pytest.mark.parametrize("dtype", C.DTYPES, **_dt)
@pytest.mark.parametrize("V,Dp,n", C.EMBED_SHAPES)
def test_embed(gpu, dtype, V, Dp, n):
    C.check_embed(gpu, dtype, V, Dp, n)


def test_f16_every_value(gpu):
    C.check_f16_every_value(gpu)


@pytest.mark.parametrize("rows,length,true_len,stride", C.RMSNORM_SHAPES)
@pytest.mark.parametrize("in_place", [False, True])
def test_rmsnorm(gpu, rows, length, true_len, stride, in_place):
    C.check_rmsnorm(gpu, rows, length, true_len, stride, in_place)


@pytest.mark.parametrize("dtype", C.DTYPES, **_dt)
@pytest.mark.parametrize("rows,cols,n", C.LINEAR_SHAPES)
def test_linear(gpu, dtype, rows, cols, n):
    C.check_linear(gpu, dtype, rows, cols, n)


def test_linear_strided_rows_into_kv_cache(gpu):
    C.check_linear_strided_rows_into_kv_cache(gpu)


@pytest.mark.parametrize("n,H,Hkv,dh,pos0,norm", C.QK_ROPE_SHAPES)
@pytest.mark.parametrize("kv_f16", [False, True])
def test_qk_rope_kv(gpu, n, H, Hkv, dh, pos0, norm, kv_f16):
    C.check_qk_rope_kv(gpu, n, H, Hkv, dh, pos0, norm, kv_f16)


def test_f16_kv_store(gpu):
    C.check_f16_kv_store(gpu)


@pytest.mark.parametrize("n,pos0,H,Hkv,dh", C.ATTENTION_SHAPES)
@pytest.mark.parametrize("kv_f16", [False, True])
def test_attention(gpu, n, pos0, H, Hkv, dh, kv_f16):
    C.check_attention(gpu, n, pos0, H, Hkv, dh, kv_f16)


@pytest.mark.parametrize("n,pos0,H,Hkv,dh", C.PREFILL_SHAPES)
@pytest.mark.parametrize("kv_f16", [False, True])
def test_attention_prefill(gpu, n, pos0, H, Hkv, dh, kv_f16):
    C.check_attention_prefill(gpu, n, pos0, H, Hkv, dh, kv_f16)


@pytest.mark.parametrize("E,k", C.TOPK_SHAPES)
@pytest.mark.parametrize("renorm", [True, False])
def test_router_topk(gpu, E, k, renorm):
    C.check_router_topk(gpu, E, k, renorm)


@pytest.mark.parametrize("E,k", [(16, 12), (60, 16)])
def test_router_topk_nan_selects_real_experts(gpu, E, k):
    C.check_router_topk_nan(gpu, E, k)


@pytest.mark.parametrize("dtype", C.DTYPES, **_dt)
@pytest.mark.parametrize("E,k,D,Dp,n", C.FFN_ROUTE_SHAPES)
@pytest.mark.parametrize("nan", [False, True])
def test_ffn_route_matches_the_three_kernels(gpu, dtype, E, k, D, Dp, n, nan):
    C.check_ffn_route(gpu, dtype, E, k, D, Dp, n, nan=nan)


@pytest.mark.parametrize("n,k,E", C.DISPATCH_SHAPES)
def test_dispatch(gpu, n, k, E):
    C.check_dispatch(gpu, n, k, E)


@pytest.mark.parametrize("dtype", C.DTYPES, **_dt)
@pytest.mark.parametrize("n,k,E,F,Dp", C.EXPERT_SHAPES)
def test_grouped_experts(gpu, dtype, n, k, E, F, Dp):
    C.check_grouped_experts(gpu, dtype, n, k, E, F, Dp)


@pytest.mark.parametrize("dtype", C.MMA_DTYPES, **_dt)
@pytest.mark.parametrize("n,k,E,F,Dp", C.EXPERT_MMA_SHAPES)
def test_grouped_experts_mma(gpu, dtype, n, k, E, F, Dp):
    """The tensor-core expert kernels on the real mma (sm_80+); below sm_80 the image must not
    have them (the backend then keeps the SIMT kernels)."""
    if gpu.sm < 80:
        with pytest.raises(cuda.LogicError):
            gpu.module.get_function("cb_expert_up_mma")
        return
    C.check_grouped_experts(gpu, dtype, n, k, E, F, Dp, mma=True)


@pytest.mark.parametrize("dtype", C.MMA_DTYPES, **_dt)
@pytest.mark.parametrize("rows,cols,n", C.LINEAR_MMA_SHAPES)
def test_linear_mma(gpu, dtype, rows, cols, n):
    if gpu.sm < 80:
        with pytest.raises(cuda.LogicError):
            gpu.module.get_function("cb_linear_mma")
        return
    C.check_linear(gpu, dtype, rows, cols, n, mma=True)


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
    assert backend["cuda_device"] == gpu.dev.name()
