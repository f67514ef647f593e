"""Qwen3.5 / Qwen3-Next hybrid layers on the CUDA backend (issue 24), in the GPU's host emulation
(the stand-in libcuda running each launched kernel on the CPU: tests/cuda_emu_support.py):
Gated DeltaNet layers (cb_dn_conv, cb_dn_recur: the state on the device) and gated attention
(cb_qk_rope_partial_kv, cb_sigmoid_gate; head dim 256 through the split-KV kernel, which
prefill takes for heads wider than the tiled kernel's 128) against the CPU backend, within
docs/cuda.md's GPU-vs-CPU tolerance.

Smallest shapes that exercise each path: 2 layers (one of each kind), passes of 8 tokens
(COLIBRI_CUDA_CHUNK=8: the tensor-core linear kernels of the stand-in's sm_90 run the projections
of a pass of more than 4 tokens), a 10-token prompt (an 8-token pass then a 2-token pass) and 3
decode steps through the CUDA graph, in one process.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import hf_models as H
import numpy as np
import pytest
from gen_support import ROOT
from test_cuda_host import _emu_info, _logits
from test_gpu_model import gm
from test_qwen35 import DN, GATED, hybrid_header

from colibri_kit.model.footprint import cuda_arena_bytes, cuda_unsupported
from colibri_kit.model.format import Ffn, LayerRecord, Mixer, MixerFlag, read_model
from colibri_kit.model.tiny import write_random_model

pytestmark = pytest.mark.slow

TOL = 1e-4  # docs/cuda.md: f32 weights, max |gpu - cpu| / max |cpu|
IDS = [(i * 37 + 5) % 300 for i in range(13)]  # 10 prompt tokens, then 3 decode steps
PROMPT, CHUNK = 10, "8"
# Qwen3.5's attention shape in small: head dim 256 (above COLIBRI_CU_FA_MAX_DH), rotary width 64
GATED_256 = LayerRecord(Mixer.ATTENTION, Ffn.MOE, 0,
                        int(MixerFlag.OUTPUT_GATE | MixerFlag.PARTIAL_ROPE), (64, 0, 0, 0))


def _check(build, model: Path, tmp: Path, ids: list[int] = IDS, prompt: int = PROMPT,
           chunk: str = CHUNK) -> None:
    cpu = _logits(build, model, "cpu", ids, "cpu", where=tmp)
    log = tmp / "stub.log"
    gpu = _logits(build, model, "cuda", ids, "cuda", "--decode-from", str(prompt), where=tmp,
                  COLIBRI_CUDA_CHUNK=chunk, STUB_LOG=str(log))
    # the performance model's decode graph is the captured one (benchmarks/gpu_model.py)
    lines = log.read_text().splitlines()
    end = next(i for i, ln in enumerate(lines) if ln.startswith("end capture"))
    captured = sum(ln.startswith("capture ") for ln in lines[:end])
    assert captured == gm.launches_per_token(read_model(model).header).graph_nodes, captured
    for rows in (slice(0, prompt), slice(prompt, None)):  # prefill, decode
        err = np.abs(gpu[rows] - cpu[rows]).max() / np.abs(cpu[rows]).max()
        print(f"{model.stem} rows {rows.start}..: max |gpu - cpu| / max |cpu| = {err:.2g}")
        assert err < TOL, (rows, err)
    # the greedy ids of the prompt's rows and of each decode step are the CPU's
    assert (gpu.argmax(1) == cpu.argmax(1)).all()


# One model of both kinds with Qwen3.5's 256-wide attention heads; the converted checkpoints below
# cover heads of 24 with a rotary width of 6 (the emulation's cost keeps the list short)
@pytest.mark.parametrize("name,layers,kw", [
    ("head256", (GATED_256, DN), dict(n_heads=2, n_kv_heads=1, head_dim=256)),
])
def test_hybrid_model_runs_on_cuda_as_on_the_cpu(cuda_host_build, tmp_path: Path, name: str,
                                                 layers: tuple, kw: dict) -> None:
    """--backend cuda runs the hybrid model (no fallback) with the CPU's logits within the
    tolerance, prefill over two device passes and decode steps through the graph (the DeltaNet
    state and the attention KV carried from the prompt to each step); the footprint's CUDA arena
    (colibri_kit/model/footprint.py: KV for the attention layers only, the mixers' scratch, the
    recurrent state) is what the backend allocates."""
    h = hybrid_header(layers, max_seq_len=64, **kw)
    assert cuda_unsupported(h) == ""
    model = write_random_model(tmp_path / f"{name}.colibri", h, seed=2)
    info = _emu_info(cuda_host_build, model, STUB_INTEGRATED="1", COLIBRI_CUDA_WEIGHTS="map")
    assert info["name"] == "cuda" and info["cuda_device_bytes"] == cuda_arena_bytes(h), info
    _check(cuda_host_build, model, tmp_path)


def test_state_is_carried_across_calls_and_zeroed_by_reset(cuda_host_build, tmp_path: Path) -> None:
    """tests/gpu/hybrid_reset.c on the emulated GPU: after colibri_reset the prompt gives the
    bits of its first run (the device state was zeroed), and a call after the prompt runs on the
    carried state (its logits differ from the same token's at position 0)."""
    model = write_random_model(tmp_path / "r.colibri", hybrid_header((DN, GATED), max_seq_len=64), seed=2)
    dist = cuda_host_build["binary"].parent.parent
    exe = tmp_path / "hybrid_reset"
    subprocess.run(["cc", "-std=c11", "-O1", f"-I{ROOT / 'runtime' / 'include'}", "-o", str(exe),
                    str(ROOT / "tests" / "gpu" / "hybrid_reset.c"), str(dist / "lib" / "libcolibri.a"),
                    "-lm", "-lpthread", "-ldl"], check=True)
    ids = IDS[:5]
    proc = subprocess.run([str(exe), str(model), str(len(ids)), *map(str, ids)], capture_output=True,
                          text=True, timeout=600, env={"COLIBRI_LIBCUDA": str(cuda_host_build["libcuda"]),
                                                       "STUB_SM": "90", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "reset-equal 1" in proc.stdout and "carried-differs 1" in proc.stdout, proc.stdout


@pytest.mark.parametrize("name", H.HYBRID_CASES)
def test_converted_qwen35_and_qwen3_next_run_on_cuda(cuda_host_build, hf_root: Path,
                                                     tmp_path: Path, name: str) -> None:
    """The converter's output of random Qwen3_5MoeForCausalLM and Qwen3NextForCausalLM checkpoints
    (tests/hf_models.py: 7 and 8 layers of both kinds, f32) on the emulated GPU: within the
    tolerance of the CPU backend (which tests/test_qwen35.py holds to transformers). Kept short
    for the emulation's cost: a 5-token prompt in passes of 4 and 1, then 2 decode steps."""
    model = H.converted(hf_root, name, "f32")
    assert cuda_unsupported(read_model(model).header) == ""
    _check(cuda_host_build, model, tmp_path, ids=[3, 41, 7, 200, 99, 12, 5], prompt=5, chunk="4")
