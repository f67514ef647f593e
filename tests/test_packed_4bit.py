"""The packed layouts (runtime/src/cpu/q4_pack.h; docs/runtime.md, "Packed q4, mxfp4 and int8"):
on a CPU whose int8-activation kernels read them (x86 AVX-512 VNNI), the first `--int8-act`
context packs the q4, mxfp4 or int8 matrices once; the logits must be the file layout's bit for
bit.

One random model per type, shaped so that some matrices are packed (rows a multiple of 16,
columns of 32, int8 of 4: the experts, wq, wk, wo) and some are not (the 300-row LM head), run over a
40-token prompt (prefill tiles of 3 tokens and a rest): packed on 1 and 3 threads (the thread
split at 16-row block edges), token by token, against `--q4-file-layout` and against the kernels
capped at AVX2 (which read the file's layout). On a CPU without the packed kernels every run
reads the file's layout and the comparison still holds; the self-test line says which.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

import hf_models as H
from colibri_kit.model.format import DType, ModelHeader
from colibri_kit.model.tiny import write_random_model

PROMPT = [(i * 7919 + 13) % 300 for i in range(40)]


def logits(binary: Path, model: Path, out: Path, *opts: str, threads: int = 2, simd: str = "",
           int8_act: bool = True) -> bytes:
    args = [str(binary), "--backend", "cpu", "--threads", str(threads)]
    args += ["--int8-act"] if int8_act else []
    args += [o for o in opts if o.startswith("--q4")]
    args += ["forward", str(model), "--ids", ",".join(map(str, PROMPT)), "--logits-out", str(out)]
    args += [o for o in opts if not o.startswith("--q4")]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLIBRI_CPU_SIMD": simd})
    assert proc.returncode == 0, f"{' '.join(args)}: {proc.stderr}"
    return out.read_bytes()


# the self-test line that names each type's packed-layout check
SELFTEST_LINE = {"q4": "q4 rows_dot", "mxfp4": "mxfp4 rows_dot", "int8": "int8 x int8 (avx"}


@pytest.mark.parametrize("dtype", ["q4", "mxfp4", "int8"])
def test_packed_layout_gives_the_file_layouts_bits(host_colibri: Path, tmp_path: Path, dtype: str) -> None:
    h = ModelHeader(num_experts=4, expert_size=96, vocab_size=300, max_seq_len=64, embed_dim=120,
                    n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16, top_k=2, routing=0,
                    dtype=int(DType.parse(dtype)), embed_dim_pad=128, pad_multiple=64, name=f"{dtype}-packed")
    model = write_random_model(tmp_path / f"{dtype}.colibri", h, seed=3)
    selftest = subprocess.run([str(host_colibri), "selftest"], capture_output=True, text=True, timeout=300).stdout
    line = next(ln for ln in selftest.splitlines() if SELFTEST_LINE[dtype] in ln and "packed layout" in ln)
    assert line.startswith("ok"), line
    if "avx512-vnni" in line:  # this CPU's kernels read the packed layout: the runs below use it
        assert "not read on this CPU" not in line, line
    want = logits(host_colibri, model, tmp_path / "packed1.f32", threads=1)
    runs = {
        "packed, 3 threads": logits(host_colibri, model, tmp_path / "p3.f32", threads=3),
        "packed, token by token": logits(host_colibri, model, tmp_path / "pd.f32", "--decode-from", "0", threads=3),
        "file layout": logits(host_colibri, model, tmp_path / "file.f32", "--q4-file-layout"),
        "file layout, token by token": logits(host_colibri, model, tmp_path / "fd.f32", "--q4-file-layout",
                                              "--decode-from", "0", threads=1),
        "avx2 kernels": logits(host_colibri, model, tmp_path / "avx2.f32", simd="avx2"),
    }
    assert [k for k, v in runs.items() if v != want] == []
    # the 8-bit activations stay near the f32-activation path (a broken kernel is far off)
    f32 = np.frombuffer(logits(host_colibri, model, tmp_path / "f32.f32", int8_act=False), "<f4")
    got = np.frombuffer(want, "<f4")
    assert 0 < H.rel_err(got, f32) < 5e-2
