"""Memory planning (colibri_kit/model/footprint.py, docs/models.md "Memory"): the arena the
planner computes is what the C runtime allocates (`colibri info` arena_bytes; the CUDA device
arena is checked in tests/test_cuda_host.py), the profiles' memory, the refusal of
`invoke convert --target T` with numbers and what would fit, `invoke model-info`'s footprint per
target, and the deploy check."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from colibri_kit.errors import ModelError, ProfileError
from colibri_kit.model.footprint import (
    MIB, check_fits, check_model_fits, cpu_arena_bytes, estimate_file_bytes, footprint,
    kv_cache_bytes, model_footprint,
)
from colibri_kit.model.format import DType, Flag, ModelHeader, padded_dim, read_model
from colibri_kit.model.tiny import write_random_model, write_tiny_model
from colibri_kit.paths import project_root
from colibri_kit.profiles import load_profile

# Mixtral-8x7B's config.json (mistralai/Mixtral-8x7B-v0.1), the fields the converter reads.
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "hidden_size": 4096,
    "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "num_experts_per_tok": 2,
    "vocab_size": 32000, "max_position_embeddings": 32768, "rms_norm_eps": 1e-05,
    "rope_theta": 1000000.0, "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}


def header(**kw: object) -> ModelHeader:
    d = int(kw.pop("embed_dim", 72))  # type: ignore[arg-type]
    base = dict(num_experts=6, expert_size=40, vocab_size=300, max_seq_len=48, embed_dim=d,
                n_layers=2, n_heads=6, n_kv_heads=2, head_dim=10, top_k=2, routing=0,
                dtype=int(DType.F32), embed_dim_pad=padded_dim(d, 64), pad_multiple=64)
    base.update(kw)
    return ModelHeader(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize("threads", [1, 3])
def test_cpu_arena_matches_the_runtime(host_colibri: Path, tmp_path: Path, threads: int) -> None:
    cases = {
        "tiny-q4": write_tiny_model(tmp_path / "t.colibri", dtype=DType.Q4),
        "shared": write_random_model(tmp_path / "s.colibri", header(
            embed_dim=40, shared_expert_size=24, num_experts=8, top_k=3, max_seq_len=100,
            flags=int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS))),
        "int8": write_random_model(tmp_path / "i.colibri", header(dtype=int(DType.INT8),
                                                                   max_seq_len=200)),
    }
    for name, model in cases.items():
        for extra in ([], ["--int8-act"]):
            proc = subprocess.run([str(host_colibri), "--backend", "cpu", "--threads", str(threads),
                                   *extra, "info", str(model)], capture_output=True, text=True,
                                  timeout=60)
            assert proc.returncode == 0, proc.stderr
            got = json.loads(proc.stdout)["backend"]["arena_bytes"]
            h = read_model(model).header
            assert got == cpu_arena_bytes(h, threads, int8_act=bool(extra)), (name, extra)
        # the converter's size estimate is the writer's layout (up to the metadata section)
        est = estimate_file_bytes(h)
        assert est <= h.tensor_end < est + 64 and h.tensor_end <= model.stat().st_size, name


def test_profiles_memory_smallest_module() -> None:
    mem = {t: load_profile(t).memory for t in ("orin-nx", "orin-nano", "agx-orin", "xavier-nx",
                                               "agx-thor", "host")}
    assert {t: (m.total_mb if m else None) for t, m in mem.items()} == {
        "orin-nx": 8192, "orin-nano": 4096, "agx-orin": 32768, "xavier-nx": 8192,
        "agx-thor": 131072, "host": None}
    assert all(m.reserve_mb == 1536 for m in mem.values() if m)


def test_profile_memory_validation(tmp_path: Path) -> None:
    tdir = tmp_path / "targets"
    tdir.mkdir()
    for f in (project_root() / "targets").glob("_*.yaml"):
        (tdir / f.name).write_text(f.read_text())
    base = (project_root() / "targets" / "orin-nx.yaml").read_text()
    (tdir / "orin-nx.yaml").write_text(base.replace("memory: {total_mb: 8192}",
                                                    "memory: {total_mb: 16384}"))
    assert load_profile("orin-nx", tdir).memory.total_mb == 16384  # the override of a fleet
    for bad, needle in (("memory: {total_mb: 1024, reserve_mb: 2048}", "memory.reserve_mb"),
                        ("memory: {total_mb: '8G'}", "memory.total_mb"),
                        ("memory: {total_mb: 8192, swap_mb: 1}", "swap_mb")):
        (tdir / "orin-nx.yaml").write_text(base.replace("memory: {total_mb: 8192}", bad))
        with pytest.raises(ProfileError, match=needle):
            load_profile("orin-nx", tdir)


def test_check_fits_refuses_with_numbers_and_what_fits() -> None:
    # a 4.6 B-parameter MoE: f16 (~9 GB) does not fit an 8 GB Orin NX, int8 and q4 do
    h = header(embed_dim=2048, expert_size=5632, num_experts=8, top_k=2, n_layers=16,
               n_heads=16, n_kv_heads=4, head_dim=128, vocab_size=32000, max_seq_len=4096,
               dtype=int(DType.F16))
    nx = load_profile("orin-nx")
    with pytest.raises(ModelError) as exc:
        check_fits(h, nx)
    msg = str(exc.value)
    fp = footprint(h, nx)
    assert f"needs {fp.total / MIB:,.0f} MiB" in msg and "6,656 MiB available" in msg
    assert "--dtype q4" in msg and "--dtype int8" in msg and "--dtype f32" not in msg
    assert fp.backend == "cuda" and fp.total > 6656 * MIB
    ok = check_fits(replace(h, dtype=int(DType.Q4)), nx)
    assert ok.fits and ok.weights < fp.weights * 0.3
    assert check_fits(h, load_profile("agx-orin")).fits
    assert check_fits(h, load_profile("host")).available is None
    # a long context x many slots: the KV cache is what does not fit; a shorter one is named
    q = replace(h, dtype=int(DType.Q4), max_seq_len=65536)
    assert kv_cache_bytes(q) == 2 * 16 * 65536 * 512 * 4
    with pytest.raises(ModelError, match=r"2 slot\(s\).*would fit: .*--max-seq-len \d+"):
        check_fits(q, nx, slots=2)
    # the CUDA backend copies the weights to the device once, shared by every slot (on a Jetson
    # the same DRAM), and stages the upload through 3 x 16 MiB; the mapped file
    # (COLIBRI_CUDA_WEIGHTS=map) needs no staging
    four = footprint(q, nx, slots=4)
    assert (four.weights_mode, four.upload) == ("copied", 48 * MIB)
    assert four.total == four.weights + 4 * four.arena + 48 * MIB
    mapped = footprint(q, nx, slots=4, cuda_weights="map")
    assert (mapped.weights_mode, mapped.upload) == ("mapped", 0)
    assert mapped.total == four.weights + 4 * four.arena
    with pytest.raises(ModelError, match=r"needs [\d,]+ MiB \(weights [\d,]+ MiB as q4, one "
                                         r"device copy shared by the slots \+ 4 slot\(s\) x arena "
                                         r".* \+ upload staging 48 MiB\)"):
        check_fits(q, nx, slots=4)
    # where only the upload staging is missing, the mapped file is named: the longest context
    # whose copied footprint is within 48 MiB over the limit
    avail = four.available
    lo, hi = 256, q.max_seq_len
    while hi - lo > 1:  # the shortest context that does not fit with the copy
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if footprint(replace(q, max_seq_len=mid), nx).fits else (lo, mid)
    edge = replace(q, max_seq_len=hi)  # one position more than fits: 64 KiB of KV cache over
    assert 0 < footprint(edge, nx).total - avail <= 48 * MIB
    assert footprint(edge, nx, cuda_weights="map").fits
    with pytest.raises(ModelError, match=r"would fit: .*COLIBRI_CUDA_WEIGHTS=map"):
        check_fits(edge, nx)
    assert footprint(q, load_profile("host"), slots=3).weights_mode == "file"  # CPU: the mapped file


def _invoke(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(project_root())}
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=project_root(), env=env,
                          capture_output=True, text=True, timeout=300)


def test_invoke_convert_refuses_oversize_before_reading_weights(tmp_path: Path) -> None:
    hf = tmp_path / "mixtral-8x7b"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(MIXTRAL_8X7B))  # no weights needed to refuse
    out = tmp_path / "m.colibri"
    r = _invoke("convert", "--hf-dir", str(hf), "--out", str(out), "--dtype", "int8",
                "--target", "agx-orin")
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "does not fit target 'agx-orin'" in r.stderr and "31,232 MiB available" in r.stderr
    assert "would fit: --dtype q4" in r.stderr
    assert not out.exists() and not list(tmp_path.glob(".m.colibri*"))
    r = _invoke("convert", "--hf-dir", str(hf), "--out", str(out), "--dtype", "q4",
                "--target", "orin-nx")
    assert r.returncode == 1 and "no dtype or context length fits" in r.stderr


def test_invoke_model_info_footprint_per_target(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "t.colibri", dtype=DType.Q4)
    r = _invoke("model-info", str(model), "--slots", "2")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by = {f["target"]: f for f in doc["footprint"]}
    assert set(by) >= {"host", "orin-nx", "orin-nano", "agx-orin", "xavier-nx", "agx-thor"}
    for t, f in by.items():
        fp = model_footprint(model, load_profile(t), slots=2)
        # one copy of the weights, whatever the slots (the CUDA backend shares its device copy)
        assert f["total_bytes"] == fp.total == f["weights_bytes"] + 2 * f["arena_bytes"] \
            + f["upload_bytes"]
        cuda = f["backend"] == "cuda"
        assert f["upload_bytes"] == (min(48 * MIB, 3 * f["weights_bytes"]) if cuda else 0)
        assert f["fits"] is True and f["slots"] == 2
        assert f"{t}: " in r.stderr
    assert by["orin-nx"]["backend"] == "cuda" and by["host"]["backend"] == "cpu"
    assert by["orin-nano"]["available_bytes"] == (4096 - 1536) * MIB


def test_deploy_check(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "t.colibri", dtype=DType.Q4)
    assert check_model_fits(model, load_profile("orin-nano")).fits
    big = write_random_model(tmp_path / "long.colibri", header(max_seq_len=1_000_000, n_layers=4,
                                                               n_kv_heads=6, head_dim=64, n_heads=6))
    with pytest.raises(ModelError, match=r"long\.colibri: model does not fit target 'orin-nano'.*"
                                         r"--max-seq-len"):
        check_model_fits(big, load_profile("orin-nano"))
