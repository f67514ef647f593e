"""Sliding-window attention layers (docs/models.md "Sliding window", docs/runtime.md "Layer kinds").

A token at position p of a `sliding_attention` layer with window W attends to positions
max(0, p-W+1)..p (transformers' masking_utils.sliding_window_overlay: kv_idx > q_idx - W); the
layer keeps a ring of min(W, max_seq_len) K/V rows. Checked here: the C runtime against
transformers (a random Mixtral with sliding_window) over a prompt many windows long; prefill ==
decode == mixed chunks, on 1 and 3 threads, f32 and f16 caches, across the ring's wrap and the
64-token chunk boundaries; the C runtime against the NumPy reference; rows before the window
fills equal full attention bit for bit, a window that covers the context is full attention; the
arena, the KV bytes and the footprint from the layer list; the layer table in both readers; the
CUDA backend's fallback naming the layer kind (in the host emulation of the GPU).
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_cuda_host import _emu_cli

import hf_models as H
from colibri_kit.errors import ModelError
from colibri_kit.model.footprint import (
    cpu_arena_bytes, cuda_arena_bytes, cuda_kv_cache_bytes, footprint, kv_cache_bytes,
)
from colibri_kit.model.format import (
    DEFAULT_LAYER, DType, Ffn, LayerRecord, Mixer, ModelHeader, Routing, header_json, padded_dim,
    read_model,
)
from colibri_kit.model.reference import Reference
from colibri_kit.model.tiny import write_random_model
from colibri_kit.profiles import load_profile

PAD = 64  # the host profile's embed_pad
PROMPT = [(i * 7919 + 13) % 300 for i in range(200)]  # > 3 chunks of 64, many windows
C_VS_REFERENCE = 1e-5  # as tests/test_e2e_hf.py: f32, different summation orders
# K/V rounded to half on both sides (tests/test_kv_f16.py explains the half-ulp flips). Measured on
# these 200-token prompts: 3.6e-5..6.1e-5 (a window of 5 averages fewer values than full
# attention, so one flipped half moves a row more); the f32-cache reference is 2.9e-4..6.3e-4
# away, so the bound still tells the two apart (asserted).
F16_KV_TOL = 1e-4


def sliding(w: int) -> LayerRecord:
    return LayerRecord(Mixer.SLIDING_ATTENTION, Ffn.MOE, w)


def header(layers: tuple[LayerRecord, ...], **kw: object) -> ModelHeader:
    base = dict(num_experts=6, expert_size=40, vocab_size=300, max_seq_len=256, embed_dim=72,
                n_layers=len(layers), n_heads=6, n_kv_heads=2, head_dim=10, top_k=2,
                routing=Routing.RENORMALISE, dtype=int(DType.F32), embed_dim_pad=padded_dim(72, PAD),
                pad_multiple=PAD, norm_eps=1e-6, rope_theta=5000.0, name="sliding", layers=layers)
    base.update(kw)
    return ModelHeader(**base)  # type: ignore[arg-type]


# name -> layer list. ring5: a ring far shorter than a pass; alternating: gpt-oss's pattern
# (sliding, full, ...); ring100: a ring longer than a pass that still wraps; covering: a window
# longer than the context (= full attention).
LAYERS = {
    "ring5": (sliding(5),) * 3,
    "alternating": (sliding(24), DEFAULT_LAYER) * 2,
    "ring100": (sliding(100), sliding(100)),
    "covering": (sliding(300), sliding(300)),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("sliding")
    out = {name: write_random_model(root / f"{name}.colibri", header(layers), seed=31)
           for name, layers in LAYERS.items()}
    out["ring100-int8"] = write_random_model(root / "ring100-int8.colibri",
                                             header(LAYERS["ring100"], dtype=int(DType.INT8)), seed=31)
    # the same weights with every layer full attention (write_random_model draws in table order)
    for name in ("ring5", "covering"):
        out[f"{name}-full"] = write_random_model(root / f"{name}-full.colibri",
                                                 header((DEFAULT_LAYER,) * len(LAYERS[name])), seed=31)
    return out


def run(binary: Path, *args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"colibri {' '.join(map(str, args))} exited {proc.returncode}: {proc.stderr}")
    return proc


def c_logits(binary: Path, model: Path, out: Path, *opts: object, ids: list[int] = PROMPT,
             threads: int = 1, kv: str = "f32") -> bytes:
    run(binary, "--backend", "cpu", "--threads", threads, "--kv-cache", kv, "forward", model,
        "--ids", ",".join(map(str, ids)), *opts, "--logits-out", out)
    return out.read_bytes()


def as_array(raw: bytes, rows: int) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4").reshape(rows, -1)


# ---- the runtime ------------------------------------------------------------------------------

@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("name", ["ring5", "alternating", "ring100", "ring100-int8"])
def test_prefill_equals_decode_across_the_ring(host_colibri: Path, models: dict[str, Path],
                                               tmp_path: Path, name: str, kv: str) -> None:
    """One call (chunks 64, 64, 64, 8), token by token, and mixed (37 then single tokens; 130 =
    64 + 64 + 2 then single tokens), on 1 and 3 threads: the same bits in every row."""
    model = models[name]
    want = c_logits(host_colibri, model, tmp_path / "one.f32", kv=kv)
    for i, (opts, threads) in enumerate([((), 3), (("--decode-from", 0), 1), (("--decode-from", 0), 3),
                                         (("--decode-from", 37), 3), (("--decode-from", 130), 1)]):
        got = c_logits(host_colibri, model, tmp_path / f"v{i}.f32", *opts, threads=threads, kv=kv)
        assert got == want, (name, kv, opts, threads)
    last = c_logits(host_colibri, model, tmp_path / "last.f32", "--last", threads=3, kv=kv)
    assert last == want[-len(last):]


@pytest.mark.parametrize("kv", ["f32", "f16"])
@pytest.mark.parametrize("name", ["ring5", "alternating", "ring100"])
def test_runtime_matches_the_reference(host_colibri: Path, models: dict[str, Path], tmp_path: Path,
                                       name: str, kv: str) -> None:
    got = as_array(c_logits(host_colibri, models[name], tmp_path / "c.f32", kv=kv), len(PROMPT))
    want = Reference(models[name], kv_dtype=kv).forward(PROMPT)
    err = H.rel_err(got, want)
    assert err <= (C_VS_REFERENCE if kv == "f32" else F16_KV_TOL), (name, kv, err)
    if kv == "f16":  # the f16 rounding is what the bound checks: the f32 cache is further away
        assert H.rel_err(got, Reference(models[name]).forward(PROMPT)) > 2 * F16_KV_TOL


def test_the_window_is_the_only_difference(host_colibri: Path, models: dict[str, Path],
                                           tmp_path: Path) -> None:
    """Before the window fills, a sliding layer is full attention bit for bit (positions < W);
    after, the logits move. A window that covers the context is full attention everywhere, with
    the same arena."""
    sw = as_array(c_logits(host_colibri, models["ring5"], tmp_path / "sw.f32"), len(PROMPT))
    full = as_array(c_logits(host_colibri, models["ring5-full"], tmp_path / "full.f32"), len(PROMPT))
    assert np.array_equal(sw[:5], full[:5])
    assert H.rel_err(sw[5:], full[5:]) > 1e-2  # a window of 5 forgets most of a 200-token prompt
    cov = c_logits(host_colibri, models["covering"], tmp_path / "cov.f32", threads=3)
    assert cov == c_logits(host_colibri, models["covering-full"], tmp_path / "covf.f32", threads=3)
    infos = [json.loads(run(host_colibri, "--backend", "cpu", "info", models[n]).stdout)
             for n in ("covering", "covering-full")]
    assert infos[0]["backend"]["arena_bytes"] == infos[1]["backend"]["arena_bytes"]


@pytest.mark.parametrize("threads", [1, 3])
def test_arena_and_footprint_follow_the_layer_list(host_colibri: Path, models: dict[str, Path],
                                                   threads: int) -> None:
    for name in ("ring5", "alternating", "ring100", "covering"):
        h = read_model(models[name]).header
        for kv in ("f32", "f16"):
            info = json.loads(run(host_colibri, "--backend", "cpu", "--threads", threads,
                                  "--kv-cache", kv, "info", models[name]).stdout)
            assert info["backend"]["arena_bytes"] == cpu_arena_bytes(h, threads, kv_dtype=kv), (name, kv)
            assert info["backend"]["kv_cache_bytes"] == kv_cache_bytes(h, kv), (name, kv)
        rows = [layer["kv_positions"] for layer in info["layers"]]
        assert rows == [min(r.window or h.max_seq_len, h.max_seq_len) for r in h.layer_records()]
        assert info["layer_pattern"] == header_json(models[name])["layer_pattern"]
    # the ring's rows, not the context's: 3 layers x 5 rows x (Hkv * Dh = 20) x K and V x 4 bytes
    assert kv_cache_bytes(read_model(models["ring5"]).header) == 3 * 5 * 20 * 2 * 4
    assert header_json(models["alternating"])["layer_pattern"] == \
        "2 x [sliding_attention(24) + moe, attention + moe]"


# ---- the layer table ---------------------------------------------------------------------------

def test_layer_records_round_trip(models: dict[str, Path]) -> None:
    for name, layers in LAYERS.items():
        h = read_model(models[name]).header
        assert h.version == 3 and h.layers == layers
        doc = header_json(models[name])
        assert [(d["mixer"], d["window"]) for d in doc["layers"]] == \
            [(r.mixer_name, r.window) for r in layers]


def _patched(src: Path, dst: Path, layer: int, offset: int, value: int) -> Path:
    raw = bytearray(src.read_bytes())
    at = int.from_bytes(raw[144:152], "little") + 64 * layer + offset
    raw[at: at + 4] = value.to_bytes(4, "little")
    dst.write_bytes(bytes(raw))
    return dst


@pytest.mark.parametrize("what,offset,value,py_needle,c_needle", [
    ("no window", 8, 0, "window 0, must be at least 1", "window = 0, must be at least 1"),
    ("unknown mixer", 0, 9, "field mixer 9", "mixer kind 9 is not one this runtime has"),
    ("undefined mixer flag", 12, 0x80, "field mixer_flags 0x80", "mixer_flags = 0x80"),
    ("mixer parameter", 16, 3, "field mixer_params[0] 3", "mixer_params[0] = 3"),
    ("reserved", 48, 1, "field reserved must be zero", "record byte 48 is reserved"),
])
def test_both_readers_refuse_a_bad_layer_record(host_colibri: Path, models: dict[str, Path],
                                                tmp_path: Path, what: str, offset: int, value: int,
                                                py_needle: str, c_needle: str) -> None:
    bad = _patched(models["ring5"], tmp_path / "bad.colibri", 1, offset, value)
    with pytest.raises(ModelError, match=r"layer 1\b.*" + py_needle.replace("[", r"\[").replace("]", r"\]")):
        read_model(bad)
    proc = run(host_colibri, "--backend", "cpu", "info", bad, check=False)
    assert proc.returncode == 1 and c_needle in proc.stderr and "layer 1" in proc.stderr, proc.stderr
    assert proc.stderr.count("\n") == 1  # one line


def test_full_attention_has_no_window_and_old_versions_no_kinds(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="window 4, must be 0 for full attention"):
        write_random_model(tmp_path / "a.colibri", header((LayerRecord(window=4),)))
    with pytest.raises(ModelError, match="need format version 3"):
        write_random_model(tmp_path / "b.colibri", header((sliding(8),), version=2))
    v2 = read_model(write_random_model(tmp_path / "c.colibri", header((DEFAULT_LAYER,), version=2)))
    assert v2.header.version == 2 and v2.header.layer_records() == (DEFAULT_LAYER,)


# ---- the CUDA backend follows the layer list -------------------------------------------------

def test_cuda_footprint_of_sliding_layers(models: dict[str, Path]) -> None:
    """A CUDA target runs sliding layers on the GPU (#23: cb_oss_attention), whose device arena
    keeps every position of the layer (no ring on the GPU): the plan's cache, not the CPU's."""
    h = read_model(models["ring5"]).header
    fp = footprint(h, load_profile("orin-nx"))
    assert fp.backend == "cuda" and fp.cpu_fallback == "" and fp.arena == cuda_arena_bytes(h)
    assert fp.kv_cache == cuda_kv_cache_bytes(h) > kv_cache_bytes(h)
    covering = footprint(read_model(models["covering"]).header, load_profile("orin-nx"))
    assert covering.backend == "cuda" and covering.cpu_fallback == ""
    assert replace(covering, slots=2).to_json()["cpu_fallback"] == ""


@pytest.mark.slow
def test_cuda_backend_runs_sliding_layers(cuda_host_build, models: dict[str, Path],
                                          tmp_path: Path) -> None:
    """In the GPU's host emulation (tests/test_cuda_host.py): a window of 5 under a 70-token
    prompt (cb_oss_attention over the window of the full device cache) and a window that covers
    the context (full attention's kernels) give the CPU's logits within docs/cuda.md's bound."""
    ids = ",".join(map(str, PROMPT[:70]))
    for name in ("ring5", "covering"):
        out = {}
        for backend_name in ("cuda", "cpu"):
            f = tmp_path / f"{name}-{backend_name}.f32"
            p = _emu_cli(cuda_host_build, "--backend", backend_name, "forward", str(models[name]),
                         "--ids", ids, "--logits-out", str(f))
            assert p.returncode == 0 and "running on CPU" not in p.stderr, p.stderr
            out[backend_name] = as_array(f.read_bytes(), 70)
        assert H.rel_err(out["cuda"], out["cpu"]) <= 1e-4, name  # docs/cuda.md's bound


# ---- against transformers ---------------------------------------------------------------------

@pytest.mark.slow
def test_sliding_mixtral_matches_transformers_over_many_windows(host_colibri: Path, hf_root: Path,
                                                                tmp_path: Path) -> None:
    """A random MixtralForCausalLM with sliding_window 7, a 150-token prompt (two 64-token chunks
    and a tail, 21 windows): f32 logits within the bound of the other families, the NumPy
    reference too; a greedy continuation that wraps the ring again, token by token, equal."""
    ck = H.checkpoint("mixtral_sliding", hf_root)
    model = H.converted(hf_root, "mixtral_sliding", "f32")
    h = read_model(model).header
    assert h.max_seq_len == 256 and set(h.layers) == {sliding(7)}
    hf = H.load_hf(ck)
    ids = [(i * 7919 + 13) % h.vocab_size for i in range(150)]
    want = H.hf_logits(hf, ids)
    got = as_array(c_logits(host_colibri, model, tmp_path / "c.f32", ids=ids, threads=2), len(ids))
    assert H.rel_err(got, want) <= H.TOLERANCE["f32"]
    assert H.rel_err(Reference(model).forward(ids), want) <= H.TOLERANCE["f32"]
    gen = json.loads(run(host_colibri, "--backend", "cpu", "generate", model, "--ids",
                         ",".join(map(str, ids[:20])), "--max-new", 30).stdout)
    assert gen["new_ids"] == H.hf_greedy(hf, ids[:20], 30)
