"""Grouped 4-bit weights (q4, docs/format.md and docs/models.md) end to end.

- the quantiser: exact dequantisation, idempotence, zero and tail groups, the range refusal;
- the file: writer/reader sizes and validation, the C loader refusing a mis-sized q4 record;
- the C runtime (dist/host) against the NumPy reference on every HF family, and against
  transformers run at f32 with the same rounded weights (quantise -> dequantise the HF weights),
  plus the cost of the rounding against the f32 model per family (a bound, figures printed);
- bitwise equal across thread counts; colibri_forward allocates nothing with a q4 model;
- the orin-nx build (NEON kernels) under qemu-aarch64: selftest (NEON q4 kernel == scalar lane
  layout, bit for bit), logits against the reference and the x86_64 build, thread invariance.
"""

from __future__ import annotations

import re
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

import hf_models as H
from colibri_kit.errors import ModelError
from colibri_kit.model.format import (
    HEADER_SIZE, RECORD_SIZE, DType, Kind, ModelHeader, dequantize_q4, quantize_q4, read_model,
)
from colibri_kit.model.reference import Reference
from colibri_kit.model.tiny import write_random_model, write_tiny_model

C_VS_REFERENCE = 1e-5  # as tests/test_e2e_hf.py: same stored weights, different summation order
ROUNDED_TOL = 1e-4  # C (q4 file) vs transformers with the same rounded weights at f32
# q4 rounding against the f32 model (max |err| / max |logit|), measured 6e-2..1.1e-1 on these
# random models (docs/models.md, "4-bit weights"); the bound catches a broken quantiser.
Q4_VS_F32_BOUND = 0.15
PROMPT = [1, 5, 9, 200, 3, 7, 11, 42, 0, 255, 17, 99]


def run(binary: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=300)
    if check:
        assert proc.returncode == 0, f"colibri {' '.join(args)}: {proc.stderr}"
    return proc


def c_logits(binary: Path, model: Path, ids: list[int], out: Path, threads: int = 2) -> np.ndarray:
    run(binary, "--backend", "cpu", "--threads", str(threads), "forward", str(model), "--ids",
        ",".join(map(str, ids)), "--logits-out", str(out))
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


# ---- the quantiser ------------------------------------------------------------------------------

def test_quantize_q4_exact_and_idempotent() -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal((7, 203)).astype(np.float32)  # 6 full groups + an 11-column tail
    a[2] = 0.0  # an all-zero row
    a[4, 32:64] = 0.0  # an all-zero group
    packed, d = quantize_q4(a)
    assert packed.shape == (7, 7 * 16) and packed.dtype == np.uint8
    assert d.shape == (7, 7) and d.dtype == np.float16
    w = dequantize_q4(packed, d, 7, 203)
    assert w.dtype == np.float32 and w.shape == a.shape
    # w = q * d exactly (q integer in -8..7)
    df = d[:, :6, None].astype(np.float32)
    q = w[:, :192].reshape(7, 6, 32) / np.where(df == 0, np.float32(1), df)
    assert np.array_equal(q, np.rint(q)) and q.min() >= -8 and q.max() <= 7
    assert not w[2].any() and not w[4, 32:64].any() and d[2].max() == 0
    # each group's largest magnitude maps to -8 * d; elsewhere the error is at most half a step,
    # or one step for values of the other sign clipped at +7 (as llama.cpp's q4_0)
    step = np.repeat(np.abs(d.astype(np.float32)), 32, axis=1)[:, :203]
    err = np.abs(w - a)
    assert np.all(err <= step * 1.0 + np.abs(a) * 1e-3)
    assert np.mean(err <= step * 0.5 + np.abs(a) * 1e-3) > 0.97
    # quantising the dequantised values gives the same bytes (the rounded-weights reference)
    p2, d2 = quantize_q4(w)
    assert np.array_equal(p2, packed) and np.array_equal(d2, d)
    # the nibble layout of docs/format.md: byte j of a group = (q[j] + 8) | (q[j + 16] + 8) << 4
    qi = (np.rint(q).astype(int) + 8)[0, 0]
    assert list(packed[0, :16]) == [int(qi[j] | qi[j + 16] << 4) for j in range(16)]


def test_quantize_q4_refuses_values_beyond_the_scale_range() -> None:
    a = np.zeros((1, 32), np.float32)
    a[0, 5] = 1e6  # d = 1e6 / 8 > 65504
    with pytest.raises(ModelError, match="q4 scale range"):
        quantize_q4(a)


# ---- the file -----------------------------------------------------------------------------------

def _record_field(path: Path, index: int, offset: int, fmt: str, value: int) -> None:
    with open(path, "r+b") as f:
        f.seek(HEADER_SIZE + index * RECORD_SIZE + offset)
        f.write(struct.pack(fmt, value))


def test_q4_records_sizes_and_validation(tmp_path: Path, host_colibri: Path) -> None:
    path = write_tiny_model(tmp_path / "tiny-q4.colibri", pad=64, dtype=DType.Q4)
    m = read_model(path)
    assert DType(m.header.dtype) == DType.Q4
    n_q4 = 0
    for i, r in enumerate(m):
        if r.dtype == DType.Q4:
            n_q4 += 1
            groups = -(-r.cols // 32)
            assert r.nbytes == r.rows * groups * 16 and r.scale_nbytes == r.rows * groups * 2
            assert r.offset % 64 == 0 and r.scale_offset % 64 == 0
        else:
            assert r.dtype == DType.F32 and r.scale_nbytes == 0
    assert n_q4 > 0
    assert read_model(path).tensor(Kind.WQ, 0).shape == (48, 64)
    # a q4 file is about 4.5/32 of the f32 one for the matrices
    f32 = write_tiny_model(tmp_path / "tiny-f32.colibri", pad=64, dtype=DType.F32)
    assert path.stat().st_size < 0.3 * f32.stat().st_size
    # a mis-sized scale vector is refused by both readers, naming the field
    idx = next(i for i, r in enumerate(m) if r.dtype == DType.Q4)
    bad = tmp_path / "bad-scales.colibri"
    bad.write_bytes(path.read_bytes())
    _record_field(bad, idx, 48, "<Q", m.records[list(m.records)[idx]].scale_nbytes - 2)
    with pytest.raises(ModelError, match="scale_nbytes .* expected rows\\*groups\\*2"):
        read_model(bad)
    proc = run(host_colibri, "info", str(bad), check=False)
    assert proc.returncode == 1 and "q4 scales" in proc.stderr and "expected" in proc.stderr
    # and so is a mis-sized nibble block
    bad2 = tmp_path / "bad-nbytes.colibri"
    bad2.write_bytes(path.read_bytes())
    _record_field(bad2, idx, 32, "<Q", m.records[list(m.records)[idx]].nbytes + 16)
    with pytest.raises(ModelError, match="nbytes .* expected rows\\*groups\\*16"):
        read_model(bad2)
    proc = run(host_colibri, "info", str(bad2), check=False)
    assert proc.returncode == 1 and "nbytes" in proc.stderr


# ---- the runtime against the references --------------------------------------------------------

@pytest.mark.parametrize("name", H.FAMILY_CASES)
def test_q4_runtime_matches_numpy_reference(host_colibri: Path, hf_root: Path, tmp_path: Path,
                                            name: str) -> None:
    model = H.converted(hf_root, name, "q4")
    got = c_logits(host_colibri, model, H.LOGIT_PROMPT, tmp_path / "l.bin")
    want = Reference(model).forward(H.LOGIT_PROMPT)
    assert H.rel_err(got, want) <= C_VS_REFERENCE


def rounded_hf_model(path: Path):  # -> transformers model with q4-rounded weights, f32
    """The checkpoint at ``path`` loaded at f32 with every weight the converter stores in the
    model dtype replaced by its q4 rounding (groups along the input axis, as in the file; the
    converter's zero padding of D only appends zeros to the last group)."""
    import torch

    model = H.load_hf(path)
    keep_f32 = ("norm", "bias", "mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() < 2 or any(k in n for k in keep_f32):
                continue
            a = p.detach().numpy().reshape(-1, p.shape[-1])  # experts fused as [E, out, in]
            packed, d = quantize_q4(a)
            p.copy_(torch.from_numpy(dequantize_q4(packed, d, *a.shape).reshape(p.shape)))
    return model


@pytest.mark.slow
@pytest.mark.parametrize("name", H.FAMILY_CASES)
def test_q4_runtime_matches_transformers_with_rounded_weights(
        host_colibri: Path, hf_root: Path, hf_expected: dict, tmp_path: Path, name: str) -> None:
    model = H.converted(hf_root, name, "q4")
    rounded = rounded_hf_model(H.checkpoint(name, hf_root))
    want = H.hf_logits(rounded, H.LOGIT_PROMPT)
    got = c_logits(host_colibri, model, H.LOGIT_PROMPT, tmp_path / "l.bin")
    err = H.rel_err(got, want)
    assert err <= ROUNDED_TOL, f"{name}: C q4 vs transformers(rounded) {err:.2e}"
    # greedy generation: the same tokens as transformers with the same weights
    r = run(host_colibri, "--backend", "cpu", "generate", str(model), "--ids",
            ",".join(map(str, H.GREEDY_PROMPT)), "--max-new", str(H.GREEDY_NEW))
    import json
    assert json.loads(r.stdout)["new_ids"] == H.hf_greedy(rounded, H.GREEDY_PROMPT, H.GREEDY_NEW)
    # the cost of the rounding against the f32 model
    cost = H.rel_err(got, H.expect(hf_expected, hf_root, name).logits)
    print(f"q4 [{name}]: vs transformers with the rounded weights {err:.2e}, vs f32 {cost:.3e}")
    assert 1e-3 < cost <= Q4_VS_F32_BOUND, f"{name}: q4 vs f32 {cost:.2e}"


# ---- determinism, allocation --------------------------------------------------------------------

def test_q4_bitwise_across_threads_and_runs(host_colibri: Path, tmp_path: Path) -> None:
    h = ModelHeader(num_experts=6, expert_size=40, vocab_size=300, max_seq_len=48, embed_dim=72,
                    n_layers=2, n_heads=6, n_kv_heads=2, head_dim=10, top_k=2, routing=0,
                    dtype=int(DType.Q4), embed_dim_pad=128, pad_multiple=64, name="q4-random")
    model = write_random_model(tmp_path / "r.colibri", h, seed=5)
    outs = [c_logits(host_colibri, model, PROMPT, tmp_path / f"{i}.bin", threads=t).tobytes()
            for i, t in enumerate((1, 2, 3, 2))]
    assert all(o == outs[0] for o in outs[1:])
    want = Reference(model).forward(PROMPT)
    got = np.frombuffer(outs[0], dtype="<f4").reshape(len(PROMPT), -1)
    assert H.rel_err(got, want) <= C_VS_REFERENCE


def test_q4_simd_levels_give_the_same_bits(host_colibri: Path, tmp_path: Path) -> None:
    """The AVX-512 and VNNI q4 kernels keep the q4 lane layout (docs/runtime.md, "Kernels"): a q4
    model gives the same logits bit for bit with the kernels capped at AVX2 as with the best this
    CPU has, with f32 and with int8 activations, at 1 and 2 threads. The geometry has rows of more
    than 16 groups (one block of scales), tails past the last full group, and row counts that
    are no multiple of 4. (On a CPU without AVX-512 both runs take the AVX2 kernels; the q4
    self-test still checks them against the scalar layout.)"""
    import os

    h = ModelHeader(num_experts=4, expert_size=200, vocab_size=300, max_seq_len=64, embed_dim=600,
                    n_layers=2, n_heads=6, n_kv_heads=2, head_dim=100, top_k=2, routing=0,
                    dtype=int(DType.Q4), embed_dim_pad=640, pad_multiple=64, name="q4-levels")
    model = write_random_model(tmp_path / "levels.colibri", h, seed=9)
    ids = ",".join(str(i % 300) for i in PROMPT * 2)
    for extra in ([], ["--int8-act"]):
        outs = {}
        for level in ("", "avx2"):
            for threads in ("1", "2"):
                out = tmp_path / f"{level or 'best'}-{threads}.bin"
                subprocess.run([str(host_colibri), "--backend", "cpu", "--threads", threads, *extra,
                                "forward", str(model), "--ids", ids, "--logits-out", str(out)],
                               check=True, timeout=300, env={**os.environ, "COLIBRI_CPU_SIMD": level})
                outs[level, threads] = out.read_bytes()
        assert len(set(outs.values())) == 1, (extra, [k for k, v in outs.items() if v != outs["", "1"]])


def test_q4_selftest_and_forward_allocates_nothing(host_colibri: Path, tmp_path: Path,
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    out = run(host_colibri, "selftest").stdout
    assert "ok   q4 rows_dot" in out and "decode bits == prefill bits == scalar layout bits" in out
    import test_runtime_c as RC

    cfg = RC.render_host_config(tmp_path_factory.mktemp("cfg-q4"))
    build = RC.make(RC.RUNTIME / "tests", tmp_path_factory.mktemp("rt-q4"), cfg)
    model = write_tiny_model(tmp_path / "tiny-q4.colibri", pad=64, dtype=DType.Q4)
    proc = subprocess.run([str(build / "bin/test_noalloc"), str(model)], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "allocations during forward=0" in proc.stdout


# ---- the aarch64 build under qemu ---------------------------------------------------------------

@pytest.mark.slow
def test_q4_aarch64_neon_under_qemu(orin_nx_build: Path, host_colibri: Path, tmp_path: Path) -> None:
    """The orin-nx build (NEON q4 kernels, CPU fallback without a GPU) runs a 4-bit model with the
    logits of the NumPy reference, bitwise equal across thread counts; its q4 kernel gives the
    bits of the scalar lane layout (as the AVX2 one does on x86_64)."""
    qemu = ["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", str(orin_nx_build / "bin" / "colibri")]
    proc = subprocess.run([*qemu, "selftest"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"ok   q4 rows_dot \(neon(-dotprod)?\)", proc.stdout), proc.stdout  # qemu max: SDOT
    model = write_tiny_model(tmp_path / "tiny-q4.colibri", pad=64, dtype=DType.Q4)
    ids = [i % 256 for i in PROMPT]
    outs = []
    for threads in ("1", "2"):
        out = tmp_path / f"arm-{threads}.bin"
        proc = subprocess.run([*qemu, "--backend", "auto", "--threads", threads, "forward",
                               str(model), "--ids", ",".join(map(str, ids)), "--logits-out",
                               str(out)], capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr
        outs.append(out.read_bytes())
    host = c_logits(host_colibri, model, ids, tmp_path / "host.bin")
    got = np.frombuffer(outs[0], dtype="<f4").reshape(len(ids), -1)
    assert outs[0] == outs[1]
    assert H.rel_err(got, Reference(model).forward(ids)) <= C_VS_REFERENCE
    # The q4 kernels give the scalar layout's bits on both CPUs (the selftest line above); the
    # whole model does not (the f32 router and attention use kernels.c's per-ISA lane layouts),
    # so the two builds agree to rounding.
    assert H.rel_err(got, host) <= C_VS_REFERENCE
    # int8 activations (--int8-act): the NEON q4 x int8 kernel against the AVX2 one
    out = tmp_path / "arm-q8.bin"
    proc = subprocess.run([*qemu, "--backend", "cpu", "--int8-act", "forward", str(model), "--ids",
                           ",".join(map(str, ids)), "--logits-out", str(out)], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    arm_q8 = np.fromfile(out, dtype="<f4").reshape(len(ids), -1)
    run(host_colibri, "--backend", "cpu", "--int8-act", "forward", str(model), "--ids",
        ",".join(map(str, ids)), "--logits-out", str(tmp_path / "host-q8.bin"))
    host_q8 = np.fromfile(tmp_path / "host-q8.bin", dtype="<f4").reshape(len(ids), -1)
    assert H.rel_err(arm_q8, host_q8) <= C_VS_REFERENCE
    assert 0 < H.rel_err(host_q8, host) < 5e-2  # int8 activations: close to, not equal to, f32


def test_q4_needs_format_version_2(tmp_path: Path, host_colibri: Path) -> None:
    """q4 is a version-2 dtype: a file that says version 1 with q4 tensors is refused by both
    readers (a version-1 reader would refuse dtype 4 anyway)."""
    h = ModelHeader(num_experts=2, expert_size=40, vocab_size=64, max_seq_len=16, embed_dim=40,
                    n_layers=1, n_heads=2, n_kv_heads=1, head_dim=8, top_k=1, routing=0,
                    dtype=int(DType.Q4), embed_dim_pad=64, pad_multiple=64, name="q4-v1",
                    version=2)  # no layer table (version 3) to drop
    path = write_random_model(tmp_path / "q4.colibri", h, seed=2)  # no metadata section
    assert read_model(path).header.version == 2 and read_model(path).header.meta_count == 0
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, 8, 1)
    bad = tmp_path / "q4-v1.colibri"
    bad.write_bytes(bytes(raw))
    with pytest.raises(ModelError, match="q4.*version 2"):
        read_model(bad)
    proc = run(host_colibri, "info", str(bad), check=False)
    assert proc.returncode == 1 and "needs format version 2" in proc.stderr
