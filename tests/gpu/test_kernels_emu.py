"""The kernel conformance checks (conformance.py) on a CPU: runtime/kernels/colibri_kernels.cu
compiled as C++ against tests/gpu/emu/cuda_emu.cpp, a host emulation of the CUDA execution model
(blocks in turn, a block's threads as fibers on one OS thread, real barriers for __syncthreads/__syncwarp/
__shfl_xor_sync).

This checks the kernels' logic where no GPU is available: indexing and strides, token tiling, the
fixed-shape reductions, the bitonic top-k network and its tie rule, the dispatch permutation, the
grouped expert tables. It does not check NVRTC's code generation or the GPU's arithmetic (FMA
contraction, expf): those are the GPU suite's job on a real GPU (test_kernels_gpu.py). Every
call is checked against the kernel signatures of the PTX the real NVRTC produces.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import conformance as C  # noqa: E402
import kernel_reference as ref  # noqa: E402
from gpu_images import ptx_signatures  # noqa: E402

from colibri_kit import paths, profiles, render, toolchain  # noqa: E402
from colibri_kit.model.format import DType  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = paths.project_root()
KERNELS = ROOT / "runtime" / "kernels" / "colibri_kernels.cu"


class EmuGpu:
    """Same interface as gpu_session.Gpu; "device" memory is 256-aligned host memory.
    exact_f32: the kernels' f32 arithmetic is IEEE single operation by operation (built with
    -ffp-contract=off: no FMA contraction on any host), so bit-identity checks against NumPy f32
    expressions hold (a GPU contracts a*b + c into FMAs: those checks are the emulation's)."""

    exact_f32 = True

    def __init__(self, lib: Path, routing_mode: int, signatures: dict[str, str]) -> None:
        self.lib = ctypes.CDLL(str(lib))
        self.lib.emu_launch.argtypes = [ctypes.c_char_p, ctypes.c_uint, ctypes.c_uint,
                                        ctypes.c_uint, ctypes.POINTER(ctypes.c_void_p)]
        self.lib.emu_launch.restype = ctypes.c_int
        self.routing_mode = routing_mode
        self.signatures = signatures
        self.buffers: dict[int, np.ndarray] = {}

    def put(self, a: np.ndarray) -> int:
        raw = np.ascontiguousarray(a).view(np.uint8).reshape(-1)
        base = np.zeros(raw.size + 256 + 4, np.uint8)
        off = (-base.ctypes.data) % 256
        view = base[off:off + max(raw.size, 4)]
        view[:raw.size] = raw
        ptr = view.ctypes.data
        self.buffers[ptr] = view
        return ptr

    def zeros(self, shape, dtype=np.float32) -> int:
        return self.put(np.zeros(shape, dtype))

    def get(self, ptr: int, shape, dtype=np.float32) -> np.ndarray:
        n = int(np.prod(shape))
        return self.buffers[ptr][: n * np.dtype(dtype).itemsize].view(dtype).reshape(shape).copy()

    def run(self, name: str, fmt: str, grid: tuple[int, int], block: int, *args) -> None:
        assert self.signatures.get(name) == fmt, (name, self.signatures.get(name), fmt)
        assert len(args) == len(fmt)
        conv = {"P": lambda v: ctypes.c_void_p(int(v)), "i": lambda v: ctypes.c_int(int(v)),
                "f": lambda v: ctypes.c_float(float(v))}
        values = [conv[c](v) for c, v in zip(fmt, args)]
        argv = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        rc = self.lib.emu_launch(name.encode(), grid[0], grid[1], block, argv)
        assert rc == 0, f"emulator has no kernel {name}"


def _build(tmp: Path, mode: str) -> tuple[Path, dict[str, str]]:
    """Emulator library with the host profile's config (routing mode swapped when asked), plus
    the real NVRTC's kernel signatures for the same source and config."""
    inc = render.write_config(profiles.load_profile("host"), tmp / "inc").parent
    header = inc / "colibri_config.h"
    text = header.read_text()
    header.write_text(text.replace("COLIBRI_ROUTING_MODE COLIBRI_ROUTING_SOFTMAX_TOPK",
                                   f"COLIBRI_ROUTING_MODE COLIBRI_ROUTING_{mode}"))
    lib = tmp / "libcolibri_emu.so"
    cxx = os.environ.get("CXX", "g++")
    subprocess.run([cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-fno-strict-aliasing",
                    "-ffp-contract=off",
                    "-Wall", "-Wextra", "-Werror", "-Wno-unknown-pragmas",
                    "-Wno-unused-function", "-Wno-unused-parameter",
                    f"-I{KERNELS.parent}", f"-I{inc}", str(HERE / "emu" / "cuda_emu.cpp"),
                    "-o", str(lib), "-lpthread"], check=True)
    tc = toolchain.cuda_toolchain("12.6")
    images = toolchain.compile_kernels(tc, KERNELS, [inc], [90], tmp / "ptx")
    return lib, ptx_signatures(images[-1].path.read_text())


@pytest.fixture(scope="module")
def gpu(tmp_path_factory: pytest.TempPathFactory) -> EmuGpu:
    lib, sigs = _build(tmp_path_factory.mktemp("emu_softmax"), "SOFTMAX_TOPK")
    return EmuGpu(lib, ref.SOFTMAX_TOPK, sigs)


@pytest.fixture(scope="module")
def gpu_linear_score(tmp_path_factory: pytest.TempPathFactory) -> EmuGpu:
    lib, sigs = _build(tmp_path_factory.mktemp("emu_linear"), "LINEAR_SCORE")
    return EmuGpu(lib, ref.LINEAR_SCORE, sigs)


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
@pytest.mark.parametrize("rows,cols,n", [(1, 8, 1), (37, 64, 5), (5, 45, 2), (17, 24, 33),
                                         (20, 256, 6)])
def test_linear(gpu, dtype, rows, cols, n):
    C.check_linear(gpu, dtype, rows, cols, n)


def test_linear_strided_rows_into_kv_cache(gpu):
    C.check_linear_strided_rows_into_kv_cache(gpu)


_kv = {"ids": lambda f16: "f16-kv" if f16 else "f32-kv"}


# caches of a few thousand positions at most (the 100000-position shape is the GPU suite's)
@pytest.mark.parametrize("n,H,Hkv,dh,pos0,norm", C.QK_ROPE_SHAPES)
@pytest.mark.parametrize("kv_f16", [False, True], **_kv)
def test_qk_rope_kv(gpu, n, H, Hkv, dh, pos0, norm, kv_f16):
    C.check_qk_rope_kv(gpu, n, H, Hkv, dh, pos0, norm, kv_f16)


def test_f16_kv_store(gpu):
    C.check_f16_kv_store(gpu)


@pytest.mark.parametrize("n,pos0,H,Hkv,dh", C.ATTENTION_SHAPES)
def test_attention(gpu, n, pos0, H, Hkv, dh):
    C.check_attention(gpu, n, pos0, H, Hkv, dh)


@pytest.mark.parametrize("n,pos0,H,Hkv,dh", [(4, 9, 6, 3, 10), (1, 256, 3, 3, 24),
                                           (3, 510, 2, 1, 10)])
def test_attention_f16_cache(gpu, n, pos0, H, Hkv, dh):
    C.check_attention(gpu, n, pos0, H, Hkv, dh, kv_f16=True)


@pytest.mark.parametrize("n,pos0,H,Hkv,dh", C.PREFILL_SHAPES)
@pytest.mark.parametrize("kv_f16", [False, True], **_kv)
def test_attention_prefill(gpu, n, pos0, H, Hkv, dh, kv_f16):
    C.check_attention_prefill(gpu, n, pos0, H, Hkv, dh, kv_f16)


@pytest.mark.parametrize("E,k", C.TOPK_SHAPES)
@pytest.mark.parametrize("renorm", [True, False])
def test_router_topk(gpu, E, k, renorm):
    C.check_router_topk(gpu, E, k, renorm)


@pytest.mark.parametrize("E,k", [(8, 2), (64, 8), (60, 16)])
@pytest.mark.parametrize("renorm", [True, False])
def test_router_topk_linear_score(gpu_linear_score, E, k, renorm):
    C.check_router_topk(gpu_linear_score, E, k, renorm)


@pytest.mark.parametrize("E,k", [(16, 12), (60, 16), (64, 64)])
def test_router_topk_nan_selects_real_experts(gpu, gpu_linear_score, E, k):
    C.check_router_topk_nan(gpu_linear_score, E, k)
    C.check_router_topk_nan(gpu, E, k)


@pytest.mark.parametrize("n,k,E", C.DISPATCH_SHAPES)
def test_dispatch(gpu, n, k, E):
    C.check_dispatch(gpu, n, k, E)


@pytest.mark.parametrize("dtype", C.DTYPES, **_dt)
@pytest.mark.parametrize("n,k,E,F,Dp", C.EXPERT_SHAPES)
def test_grouped_experts(gpu, dtype, n, k, E, F, Dp):
    C.check_grouped_experts(gpu, dtype, n, k, E, F, Dp)


# the fused routing kernel against the three it replaces, bit for bit: every router dtype on a
# few shapes, every shape on the file's router dtype (f32), NaN logits, both routing modes
@pytest.mark.parametrize("dtype", C.DTYPES, **_dt)
@pytest.mark.parametrize("E,k,D,Dp,n", C.FFN_ROUTE_SHAPES)
def test_ffn_route_matches_the_three_kernels(gpu, dtype, E, k, D, Dp, n):
    C.check_ffn_route(gpu, dtype, E, k, D, Dp, n)


@pytest.mark.parametrize("E,k,D,Dp,n", C.FFN_ROUTE_SHAPES)
def test_ffn_route_shapes(gpu, E, k, D, Dp, n):
    C.check_ffn_route(gpu, DType.F32, E, k, D, Dp, n)


@pytest.mark.parametrize("dtype", C.DTYPES, **_dt)
def test_ffn_route_nan_logits(gpu, gpu_linear_score, dtype):
    C.check_ffn_route(gpu, dtype, 60, 8, 100, 112, 3, nan=True)
    C.check_ffn_route(gpu_linear_score, dtype, 60, 8, 100, 112, 3, nan=True)


@pytest.mark.parametrize("E,k,D,Dp,n", C.FFN_ROUTE_SHAPES)
def test_ffn_route_linear_score(gpu_linear_score, E, k, D, Dp, n):
    C.check_ffn_route(gpu_linear_score, DType.F32, E, k, D, Dp, n)


# ---------------------------------------------------------------- gpt-oss kernels (#23)


@pytest.mark.parametrize("dtype", C.OSS_DTYPES, **_dt)
@pytest.mark.parametrize("n,k,E,F,Dp", C.OSS_EXPERT_SHAPES)
def test_oss_experts(gpu, dtype, n, k, E, F, Dp):
    C.check_oss_experts(gpu, dtype, n, k, E, F, Dp)


def test_oss_experts_without_biases_or_clamp(gpu):
    C.check_oss_experts(gpu, DType.MXFP4, 5, 2, 4, 37, 64, biases=False, clamp=False)


@pytest.mark.parametrize("n,pos0,H,Hkv,dh,window,sinks", C.OSS_ATTENTION_SHAPES)
@pytest.mark.parametrize("kv_f16", [False, True], **_kv)
def test_oss_attention(gpu, n, pos0, H, Hkv, dh, window, sinks, kv_f16):
    C.check_oss_attention(gpu, n, pos0, H, Hkv, dh, window, sinks, kv_f16)

# ---------------------------------------------------------------- tensor-core prefill (sm_80+)


@pytest.mark.parametrize("dtype", C.MMA_DTYPES, **_dt)
@pytest.mark.parametrize("n,k,E,F,Dp", C.EXPERT_MMA_SHAPES)
def test_grouped_experts_mma(gpu, dtype, n, k, E, F, Dp):
    C.check_grouped_experts(gpu, dtype, n, k, E, F, Dp, mma=True)


@pytest.mark.parametrize("dtype", C.MMA_DTYPES, **_dt)
@pytest.mark.parametrize("rows,cols,n", C.LINEAR_MMA_SHAPES)
def test_linear_mma(gpu, dtype, rows, cols, n):
    C.check_linear(gpu, dtype, rows, cols, n, mma=True)


def _tf32_model(x: np.ndarray) -> np.ndarray:
    """cvt.rna.tf32.f32 from its definition (PTX ISA, "cvt"): round to the nearest value with
    tf32's 10 explicit mantissa bits and f32's exponent range, ties away from zero; in float64,
    by the quantum of x's binade (subnormals: the fixed quantum 2^-136), not by bit tricks."""
    x64 = x.astype(np.float64)
    _, e = np.frexp(x64)  # x = m 2^e, 0.5 <= |m| < 1
    quantum = np.ldexp(1.0, np.maximum(e, -125) - 11)
    r = np.sign(x64) * np.floor(np.abs(x64) / quantum + 0.5) * quantum
    with np.errstate(over="ignore"):
        return r.astype(np.float32)


def test_tf32_rounding_is_cvt_rna(gpu):
    """The emulation's cb_tf32 (cvt.rna.tf32.f32 on the GPU) against an independent float64
    model, on random values of every magnitude, exact ties (low 13 bits 0x1000: away from zero),
    values that round up into the next binade or to infinity, subnormals, zeros and infinities."""
    rng = np.random.default_rng(7)
    bits = rng.integers(0, 2**32, 20000, dtype=np.uint64).astype(np.uint32)
    bits = bits[(bits & 0x7F800000) != 0x7F800000]  # finite; NaN payloads are not compared
    ties = (bits & ~np.uint32(0x1FFF)) | np.uint32(0x1000)
    special = np.array([0, 0x80000000, 0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x3FFFF000,
                        0x00000001, 0x00001000, 0x80001FFF, 0x007FFFFF, 0x3F800FFF], np.uint32)
    x = np.concatenate([bits, ties, special]).view(np.float32)
    lib = gpu.lib
    lib.emu_tf32.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    out = np.zeros(x.size, np.uint32)
    lib.emu_tf32(x.ctypes.data, out.ctypes.data, x.size)
    assert not np.any(out & 0x1FFF), "tf32 keeps 10 mantissa bits"
    np.testing.assert_array_equal(out.view(np.float32), _tf32_model(x))


def _fragments(A: np.ndarray, B: np.ndarray, C: np.ndarray):
    """Per-lane fragments of mma.m16n8k8 .tf32 from the PTX ISA's tables ("Matrix Fragments for
    mma.m16n8k8"): g = lane // 4, t = lane % 4; a = A[g,t], A[g+8,t], A[g,t+4], A[g+8,t+4];
    b = B[t,g], B[t+4,g]; c[q] = C[g + 8*(q//2), 2t + q%2]."""
    a = np.zeros((32, 4), np.float32)
    b = np.zeros((32, 2), np.float32)
    c = np.zeros((32, 4), np.float32)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        a[lane] = [A[g, t], A[g + 8, t], A[g, t + 4], A[g + 8, t + 4]]
        b[lane] = [B[t, g], B[t + 4, g]]
        c[lane] = [C[g + 8 * (q // 2), 2 * t + q % 2] for q in range(4)]
    return a, b, c


def test_emulated_mma_matches_the_ptx_fragment_layout(gpu):
    """One warp's cb_mma_tf32 in the emulation (the function the kernels call) computes, in the
    PTX ISA's fragment layout, D = C + A B with A 16 x 8 and B 8 x 8 tf32: bit for bit the NumPy
    model (products exact in f32, added to C in k order). Distinct random values with mixed signs
    and magnitudes, so a wrong fragment index or a transposed operand changes the bits."""
    rng = np.random.default_rng(11)
    lib = gpu.lib
    lib.emu_mma_tf32_warp.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    for trial in range(4):
        scale = np.float32(2.0) ** rng.integers(-8, 8, (16, 8))
        A = _tf32_model((rng.standard_normal((16, 8)) * scale).astype(np.float32))
        B = _tf32_model(rng.standard_normal((8, 8)).astype(np.float32) * np.float32(3.0))
        C = rng.standard_normal((16, 8)).astype(np.float32)
        a, b, c = _fragments(A, B, C)
        d = c.copy()
        lib.emu_mma_tf32_warp(a.view(np.uint32).ctypes.data, b.view(np.uint32).ctypes.data,
                              d.ctypes.data)
        want = C.copy()
        for kk in range(8):
            prod = (A[:, kk:kk + 1] * B[kk:kk + 1, :]).astype(np.float32)  # exact: tf32 x tf32
            want = (want + prod).astype(np.float32)
        _, _, want_lanes = _fragments(A, B, want)
        assert d.tobytes() == want_lanes.tobytes(), trial
        # the layout matters: the same call with A's fragments read as row-major lanes fails
        if trial == 0:
            wrong = a.reshape(-1)[np.argsort(np.arange(128) % 4 * 32 + np.arange(128) // 4)]
            d2 = c.copy()
            lib.emu_mma_tf32_warp(wrong.reshape(32, 4).view(np.uint32).ctypes.data,
                                  b.view(np.uint32).ctypes.data, d2.ctypes.data)
            assert d2.tobytes() != want_lanes.tobytes()


# ---- hybrid-family kernels (#24): every case of conformance.hybrid_cases (small shapes) ------

@pytest.mark.parametrize("case", [c for c, _ in C.hybrid_cases()])
def test_hybrid_kernels(gpu, case):
    dict(C.hybrid_cases())[case](gpu)


def test_emulation_barriers(tmp_path: Path):
    """The emulation itself: 6 blocks of 64 fibers run one after another through __syncthreads
    and __syncwarp, and a __syncthreads that half a block skips (a hang on a GPU) aborts with a
    message naming the block instead of hanging the suite."""
    inc = render.write_config(profiles.load_profile("host"), tmp_path / "inc").parent
    exe = tmp_path / "barrier_selftest"
    subprocess.run([os.environ.get("CXX", "g++"), "-std=c++20", "-O1", "-Wall", "-Werror",
                    "-Wno-unknown-pragmas", "-Wno-unused-function", f"-I{KERNELS.parent}",
                    f"-I{inc}", str(HERE / "emu" / "barrier_selftest.cpp"), "-o", str(exe)],
                   check=True)
    ok = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.split() == ["blocks", "384", "1", "done"], ok
    bad = subprocess.run([str(exe), "diverge"], capture_output=True, text=True, timeout=60)
    assert bad.returncode != 0 and bad.stdout.split() == ["blocks", "384", "1"], bad
    assert "deadlock: every thread waits at a barrier no one can open (block 0,0, 64 threads)" \
        in bad.stderr, bad.stderr
