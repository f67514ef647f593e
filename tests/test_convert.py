"""Hugging Face -> .colibri conversion: geometry, exact tensors, layouts, refusals, streaming."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import hf_models as H
from colibri_kit.errors import ModelError
from colibri_kit.model.convert import Progress, TargetModelLimits, convert
from colibri_kit.model.format import D_COLS, D_ROWS, NONE, DType, Family, Flag, Kind, read_model
from colibri_kit.paths import project_root

HOST = TargetModelLimits("host", 64, 64, 8)


def cfg_of(path: Path) -> dict:
    return json.loads((path / "config.json").read_text())


def conv(src: Path, out: Path, **kw) -> Path:
    kw.setdefault("limits", HOST)
    kw.setdefault("progress", False)
    return convert(src, out, **kw)


# ---------------------------------------------------------------------------------------------
# Geometry and exact tensors

EXPECTED_HEADER = {
    # name: (family, routing, flags, Dh, F, Fs)
    "mixtral": (Family.MIXTRAL, 0, 0, 12, 40, 0),
    "mixtral_tied": (Family.MIXTRAL, 0, Flag.TIED_EMBEDDINGS, 16, 48, 0),
    "qwen2_moe": (Family.QWEN2_MOE, 1, Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS, 14, 32, 48),
    "qwen2_moe_norm": (Family.QWEN2_MOE, 0, Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS
                       | Flag.TIED_EMBEDDINGS, 8, 24, 40),
    "qwen3_moe": (Family.QWEN3_MOE, 0, Flag.QK_NORM_HEAD, 24, 32, 0),
    "olmoe": (Family.OLMOE, 1, Flag.QK_NORM_FULL, 12, 36, 0),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", H.FAMILY_CASES)
def test_header_and_tensors_match_checkpoint(hf_root: Path, tmp_path: Path, name: str) -> None:
    src = H.checkpoint(name, hf_root)
    cfg = cfg_of(src)
    m = read_model(conv(src, tmp_path / "m.colibri"))
    h = m.header
    family, routing, flags, dh, f, fs = EXPECTED_HEADER[name]
    assert (h.family, h.routing, h.flags, h.head_dim, h.expert_size, h.shared_expert_size) == \
        (family, routing, int(flags), dh, f, fs)
    d = cfg["hidden_size"]
    assert h.embed_dim == d and h.embed_dim_pad == -(-d // 64) * 64 and h.pad_multiple == 64
    assert (h.n_layers, h.n_heads, h.n_kv_heads, h.vocab_size) == (
        2, cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["vocab_size"])
    assert h.max_seq_len == 256  # min(max_position_embeddings 256, default 2048)
    assert h.norm_eps == pytest.approx(1e-6) and h.name == name
    # Every tensor equals the checkpoint's, padded with zeros.
    hf = H.read_all(src)
    moe = "block_sparse_moe" if h.family == Family.MIXTRAL else "mlp"
    names = ("w1", "w3", "w2") if h.family == Family.MIXTRAL else ("gate_proj", "up_proj", "down_proj")
    checks = {
        (Kind.TOK_EMBED, NONE, NONE): "model.embed_tokens.weight",
        (Kind.OUTPUT_NORM, NONE, NONE): "model.norm.weight",
        (Kind.WO, 1, NONE): "model.layers.1.self_attn.o_proj.weight",
        (Kind.ROUTER, 0, NONE): f"model.layers.0.{moe}.gate.weight",
        (Kind.EXPERT_W1, 1, 2): f"model.layers.1.{moe}.experts.2.{names[0]}.weight",
        (Kind.EXPERT_W3, 0, 1): f"model.layers.0.{moe}.experts.1.{names[1]}.weight",
        (Kind.EXPERT_W2, 1, 0): f"model.layers.1.{moe}.experts.0.{names[2]}.weight",
    }
    if h.flags & Flag.QKV_BIAS:
        checks[(Kind.BK, 1, NONE)] = "model.layers.1.self_attn.k_proj.bias"
    if h.flags & Flag.SHARED_EXPERT:
        checks[(Kind.SHARED_W2, 0, NONE)] = "model.layers.0.mlp.shared_expert.down_proj.weight"
        checks[(Kind.SHARED_GATE, 1, NONE)] = "model.layers.1.mlp.shared_expert_gate.weight"
    if h.flags & (Flag.QK_NORM_HEAD | Flag.QK_NORM_FULL):
        checks[(Kind.K_NORM, 0, NONE)] = "model.layers.0.self_attn.k_norm.weight"
    if not h.flags & Flag.TIED_EMBEDDINGS:
        checks[(Kind.LM_HEAD, NONE, NONE)] = "lm_head.weight"
    else:
        assert not m.has(Kind.LM_HEAD)
    for (kind, layer, expert), hf_name in checks.items():
        got = m.tensor(kind, layer, expert)
        want = np.atleast_2d(hf[hf_name])
        np.testing.assert_array_equal(m.tensor(kind, layer, expert, unpad=True), want, err_msg=hf_name)
        if kind in D_COLS:
            assert not got[:, d:].any(), hf_name
        if kind in D_ROWS:
            assert not got[d:].any(), hf_name


@pytest.mark.slow
def test_sharded_bf16_checkpoint(hf_root: Path, tmp_path: Path) -> None:
    src = H.checkpoint("mixtral_bf16_sharded", hf_root)
    index = json.loads((src / "model.safetensors.index.json").read_text())
    assert len(set(index["weight_map"].values())) > 2, "the case must really be sharded"
    from colibri_kit.model.safetensors_io import Checkpoint

    ck = Checkpoint(src)
    assert {ck.entry(k).dtype for k in ck.keys()} == {"BF16"}
    m = read_model(conv(src, tmp_path / "m.colibri", dtype="bf16"))
    hf = H.read_all(src)
    # bf16 -> f32 -> bf16 is exact: the stored bits are the checkpoint's.
    np.testing.assert_array_equal(m.tensor(Kind.EXPERT_W2, 1, 3, unpad=True),
                                  hf["model.layers.1.block_sparse_moe.experts.3.w2.weight"])
    assert m.record(Kind.EXPERT_W2, 1, 3).dtype == DType.BF16
    assert m.record(Kind.ROUTER, 1).dtype == DType.F32


@pytest.mark.slow
@pytest.mark.parametrize("name,transposed", [("mixtral", False), ("qwen2_moe", True), ("olmoe", False)])
def test_fused_expert_layout_gives_identical_file(hf_root: Path, tmp_path: Path, name: str,
                                                  transposed: bool) -> None:
    src = H.checkpoint(name, hf_root)
    cfg = cfg_of(src)
    e_n = cfg.get("num_local_experts") or cfg["num_experts"]
    if name == "mixtral":  # transformers 5's own naming: mlp.gate + mlp.experts.gate_up_proj
        tensors = H.fuse_experts(H.read_all(src), 2, e_n, "block_sparse_moe", ("w1", "w3", "w2"),
                                 transposed, fused_prefix="mlp")
    else:
        tensors = H.fuse_experts(H.read_all(src), 2, e_n, "mlp", ("gate_proj", "up_proj", "down_proj"),
                                 transposed)
    assert not any(".experts.0." in k for k in tensors)
    fused = H.copy_with(src, tmp_path / "fused" / name, tensors)
    a = conv(src, tmp_path / "a.colibri", dtype="int8")
    b = conv(fused, tmp_path / "b.colibri", dtype="int8")
    assert a.read_bytes() == b.read_bytes()


@pytest.mark.slow
def test_rope_theta_from_top_level_and_tied_lm_head_ignored(hf_root: Path, tmp_path: Path) -> None:
    src = H.checkpoint("mixtral_tied", hf_root)
    cfg = cfg_of(src)
    cfg["rope_theta"] = cfg.pop("rope_parameters")["rope_theta"] * 2
    tensors = H.read_all(src)
    tensors["lm_head.weight"] = tensors["model.embed_tokens.weight"].copy()  # tied: may be stored
    variant = H.copy_with(src, tmp_path / "v" / "mixtral_tied", tensors, cfg)
    m = read_model(conv(variant, tmp_path / "m.colibri"))
    assert m.header.rope_theta == 2e6 and m.header.flags & Flag.TIED_EMBEDDINGS


@pytest.mark.slow
def test_max_seq_len_caps(hf_root: Path, tmp_path: Path) -> None:
    src = H.checkpoint("mixtral", hf_root)
    assert read_model(conv(src, tmp_path / "a.colibri", max_seq_len=100)).header.max_seq_len == 100
    assert read_model(conv(src, tmp_path / "b.colibri", max_seq_len=100000)).header.max_seq_len == 256
    cfg = cfg_of(src)
    cfg["sliding_window"] = 50  # sliding-window layers (a ring of 50 rows), not a shorter context
    v = H.copy_with(src, tmp_path / "sw" / "mixtral", None, cfg)
    h = read_model(conv(v, tmp_path / "c.colibri")).header
    assert h.max_seq_len == 256 and {(r.mixer_name, r.window) for r in h.layers} == {("sliding_attention", 50)}


@pytest.mark.slow
def test_target_profile_supplies_pad(hf_root: Path, tmp_path: Path) -> None:
    from colibri_kit.profiles import load_profile

    src = H.checkpoint("qwen3_moe", hf_root)
    pad = load_profile("host").colibri.embed_pad
    m = read_model(convert(src, tmp_path / "m.colibri", profile=load_profile("host"), progress=False))
    assert m.header.pad_multiple == pad and m.header.embed_dim_pad % pad == 0
    m16 = read_model(conv(src, tmp_path / "p16.colibri", limits=TargetModelLimits("t", 16, 64, 8)))
    assert (m16.header.embed_dim_pad, m16.header.pad_multiple) == (80, 16)


# ---------------------------------------------------------------------------------------------
# Refusals name the key or tensor, and leave nothing behind


CONFIG_REFUSALS = [
    ("mixtral", {"model_type": "llama"}, "model_type = 'llama'"),
    ("mixtral", {"hidden_act": "gelu"}, "hidden_act"),
    ("mixtral", {"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4}},
     "rope_parameters.rope_type"),
    ("mixtral", {"rope_scaling": {"type": "yarn", "factor": 4.0}}, "rope_scaling.rope_type"),
    ("mixtral", {"num_local_experts": 600}, "num_local_experts = 600"),
    ("mixtral", {"num_experts_per_tok": 5}, "num_experts_per_tok = 5"),
    ("mixtral", {"hidden_size": 70000}, "hidden_size = 70000"),
    ("mixtral", {"num_key_value_heads": 4}, "num_key_value_heads = 4"),
    ("qwen2_moe", {"decoder_sparse_step": 2}, "decoder_sparse_step"),
    ("qwen2_moe", {"mlp_only_layers": [1]}, "mlp_only_layers"),
    ("qwen2_moe", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen3_moe", {"use_sliding_window": True}, "use_sliding_window"),
    ("qwen3_moe", {"attention_bias": True}, "attention_bias"),
    ("qwen3_moe", {"head_dim": 23}, "head_dim = 23"),
    ("olmoe", {"clip_qkv": 8.0}, "clip_qkv"),
]


@pytest.mark.slow
@pytest.mark.parametrize("name,change,message", CONFIG_REFUSALS, ids=[c[2] for c in CONFIG_REFUSALS])
def test_config_refusals_name_the_key(hf_root: Path, tmp_path: Path, name: str, change: dict,
                                      message: str) -> None:
    src = H.checkpoint(name, hf_root)
    cfg = {**cfg_of(src), **change}
    (tmp_path / "v").mkdir()
    (tmp_path / "v" / "config.json").write_text(json.dumps(cfg))
    os.symlink(src / "model.safetensors", tmp_path / "v" / "model.safetensors")
    with pytest.raises(ModelError, match=re.escape(f"config.json: key {message}")):
        conv(tmp_path / "v", tmp_path / "out.colibri")
    assert not (tmp_path / "out.colibri").exists()


@pytest.mark.slow
def test_target_limits_refused(hf_root: Path, tmp_path: Path) -> None:
    src = H.checkpoint("qwen2_moe", hf_root)  # 6 experts, top-2
    with pytest.raises(ModelError, match=r"6 experts per layer, but target small .*colibri.max_experts"):
        conv(src, tmp_path / "o.colibri", limits=TargetModelLimits("small", 64, 4, 8))
    with pytest.raises(ModelError, match=r"num_experts_per_tok = 2, but target small .*colibri.top_k"):
        conv(src, tmp_path / "o.colibri", limits=TargetModelLimits("small", 64, 8, 1))


def _variant(src: Path, dst: Path, edit) -> Path:
    tensors = H.read_all(src)
    edit(tensors)
    return H.copy_with(src, dst, tensors)


@pytest.mark.slow
def test_tensor_refusals_name_the_tensor(hf_root: Path, tmp_path: Path) -> None:
    src = H.checkpoint("qwen2_moe", hf_root)
    out = tmp_path / "o.colibri"
    out.write_bytes(b"previous model")

    missing = _variant(src, tmp_path / "missing", lambda t: t.pop("model.layers.1.mlp.shared_expert_gate.weight"))
    with pytest.raises(ModelError, match=r"tensor model\.layers\.1\.mlp\.shared_expert_gate\.weight is missing"):
        conv(missing, out)

    def misshape(t):
        t["model.layers.0.self_attn.k_proj.weight"] = t["model.layers.0.self_attn.k_proj.weight"][:-1]
    bad = _variant(src, tmp_path / "shape", misshape)
    with pytest.raises(ModelError, match=r"k_proj\.weight has shape \[27, 56\], expected \[28, 56\]"):
        conv(bad, out)

    extra = _variant(src, tmp_path / "extra", lambda t: t.update({"model.layers.0.self_attn.o_proj.bias": np.zeros(56)}))
    with pytest.raises(ModelError, match=r"does not use .*o_proj\.bias"):
        conv(extra, out)

    def nan(t):
        t["model.layers.1.mlp.experts.4.up_proj.weight"][0, 0] = np.nan
    nan_dir = _variant(src, tmp_path / "nan", nan)
    with pytest.raises(ModelError, match=r"experts\.4\.up_proj\.weight -> EXPERT_W3 layer 1 expert 4: .*NaN"):
        conv(nan_dir, out)
    assert out.read_bytes() == b"previous model"
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_file()) == ["o.colibri"]


def _raw_safetensors(path: Path, header: dict, data: bytes) -> None:
    h = json.dumps(header).encode()
    path.write_bytes(len(h).to_bytes(8, "little") + h + data)


@pytest.mark.parametrize("header,data,message", [
    ({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]}}, b"\0" * 8, "tensor a: data_offsets end 16 runs past"),
    ({"a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 12]}}, b"\0" * 16, "tensor a: data_offsets"),
    ({"a": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 16, "tensor a: dtype 'I64' not supported"),
    ({"a": {"dtype": "F16", "shape": [-1], "data_offsets": [0, 0]}}, b"", "tensor a: shape"),
])
def test_safetensors_reader_refusals(tmp_path: Path, header: dict, data: bytes, message: str) -> None:
    from colibri_kit.model.safetensors_io import SafetensorsFile

    p = tmp_path / "model.safetensors"
    _raw_safetensors(p, header, data)
    with pytest.raises(ModelError, match=message):
        SafetensorsFile(p)


def test_safetensors_header_length_and_index_paths(tmp_path: Path) -> None:
    from colibri_kit.model.safetensors_io import Checkpoint, SafetensorsFile

    p = tmp_path / "model.safetensors"
    p.write_bytes((10**6).to_bytes(8, "little") + b"{}")
    with pytest.raises(ModelError, match="header length 1000000 runs past"):
        SafetensorsFile(p)
    p.unlink()
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"a": "../evil.safetensors"}}))
    with pytest.raises(ModelError, match=r"weight_map\['a'\] = '\.\./evil\.safetensors' is not a file name"):
        Checkpoint(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ModelError, match="no model.safetensors or model.safetensors.index.json"):
        Checkpoint(empty)


def test_safetensors_bf16_and_f16_read_exactly(tmp_path: Path) -> None:
    from colibri_kit.model.safetensors_io import SafetensorsFile

    vals = np.array([[1.0, -2.5, 3.140625], [0.0, 65504.0, -1e-3]], np.float32)
    H.write_safetensors(tmp_path / "b.safetensors", {"x": vals}, dtype="BF16")
    got = SafetensorsFile(tmp_path / "b.safetensors").get("x")
    assert got.bf16 and got.shape == (2, 3)
    from colibri_kit.model.format import bf16_bits_to_f32, f32_to_bf16_bits

    np.testing.assert_array_equal(got.numpy(), bf16_bits_to_f32(f32_to_bf16_bits(vals)))
    np.testing.assert_array_equal(got.T.rows(1, 3), bf16_bits_to_f32(f32_to_bf16_bits(vals)).T[1:3])


# ---------------------------------------------------------------------------------------------
# Streaming: peak memory near one tensor, not the model


def _big_mixtral(path: Path) -> tuple[int, int]:
    """A hand-written Mixtral checkpoint of ~13 MB whose largest tensor is 0.8 MB."""
    d, f, e_n, v, layers = 200, 256, 8, 1000, 2
    rng = np.random.default_rng(0)
    t: dict[str, np.ndarray] = {"model.embed_tokens.weight": rng.standard_normal((v, d)),
                                "model.norm.weight": np.ones(d), "lm_head.weight": rng.standard_normal((v, d))}
    for i in range(layers):
        p = f"model.layers.{i}"
        for n, shape in [("self_attn.q_proj", (d, d)), ("self_attn.k_proj", (d, d)), ("self_attn.v_proj", (d, d)),
                         ("self_attn.o_proj", (d, d)), ("block_sparse_moe.gate", (e_n, d))]:
            t[f"{p}.{n}.weight"] = rng.standard_normal(shape)
        t[f"{p}.input_layernorm.weight"] = np.ones(d)
        t[f"{p}.post_attention_layernorm.weight"] = np.ones(d)
        for e in range(e_n):
            for n, shape in [("w1", (f, d)), ("w3", (f, d)), ("w2", (d, f))]:
                t[f"{p}.block_sparse_moe.experts.{e}.{n}.weight"] = rng.standard_normal(shape)
    path.mkdir()
    H.write_safetensors(path / "model.safetensors", t)
    cfg = {"model_type": "mixtral", "hidden_size": d, "intermediate_size": f, "num_hidden_layers": layers,
           "num_attention_heads": 10, "num_key_value_heads": 10, "num_local_experts": e_n,
           "num_experts_per_tok": 2, "vocab_size": v, "max_position_embeddings": 512, "rms_norm_eps": 1e-5}
    (path / "config.json").write_text(json.dumps(cfg))
    total = sum(a.size * 4 for a in t.values())
    largest = max(a.size * 4 for a in t.values())
    return total, largest


def test_conversion_streams_tensor_by_tensor(tmp_path: Path) -> None:
    total, largest = _big_mixtral(tmp_path / "big")
    tracemalloc.start()
    try:
        conv(tmp_path / "big", tmp_path / "big.colibri", dtype="int8")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert total > 12 * 2**20
    assert peak < 5 * largest, f"peak {peak} bytes for a {total}-byte model (largest tensor {largest})"
    assert read_model(tmp_path / "big.colibri").header.embed_dim_pad == 256


# ---------------------------------------------------------------------------------------------
# Progress and the invoke task


def test_progress_bar_on_a_terminal_plain_lines_otherwise(tmp_path: Path) -> None:
    import io

    master, slave = os.openpty()
    try:
        with os.fdopen(slave, "w", closefd=True) as tty:
            bar = Progress(1000, True, tty)
            assert bar.tty
            bar.step(500, "model.layers.0.self_attn.q_proj.weight")
            bar.step(500, "lm_head.weight")
            bar.finish(tmp_path / "m.colibri")
        chunks = []
        while True:  # a pty hands back what was written in pieces; read to the end
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side is closed and drained
                break
            if not chunk:
                break
            chunks.append(chunk)
        out = b"".join(chunks).decode()
    finally:
        os.close(master)
    assert "\r" in out and "[###############               ]  50.0%" in out and "100.0%" in out
    plain = io.StringIO()
    bar = Progress(1000, True, plain)
    for _ in range(4):
        bar.step(250, "x")
    bar.finish(tmp_path / "m.colibri")
    lines = plain.getvalue().splitlines()
    assert "\r" not in plain.getvalue() and lines[-1].startswith("convert: wrote")
    assert [ln.split()[1] for ln in lines[:-1]] == ["25%", "50%", "75%", "100%"]


@pytest.mark.slow
def test_invoke_tasks(hf_root: Path, tmp_path: Path) -> None:
    src = H.checkpoint("olmoe", hf_root)
    env = {**os.environ, "PYTHONPATH": str(project_root())}
    inv = [sys.executable, "-m", "invoke"]
    run = lambda *a: subprocess.run([*inv, *a], cwd=project_root(), env=env, capture_output=True, text=True)  # noqa: E731
    r = run("convert", "--hf-dir", str(src), "--out", str(tmp_path / "o.colibri"), "--dtype", "bf16",
            "--max-seq-len", "64")
    assert r.returncode == 0, r.stderr
    assert "convert: wrote" in r.stderr and "%" in r.stderr
    info = run("model-info", str(tmp_path / "o.colibri"))
    assert info.returncode == 0, info.stderr
    doc = json.loads(info.stdout)
    assert doc["family"] == "olmoe" and doc["dtype"] == "bf16" and doc["max_seq_len"] == 64
    assert doc["flags"] == ["QK_NORM_FULL"] and doc["routing"] == "plain"
    assert doc["eos_token_id"] == 0xFFFFFFFF  # OLMoE's config eos 50279 is outside this vocabulary
    bad = run("convert", "--hf-dir", str(src), "--out", str(tmp_path / "x.colibri"), "--dtype", "fp8")
    assert bad.returncode == 1 and "unknown dtype 'fp8'; allowed: f32, f16, bf16, int8" in bad.stderr
    assert "Traceback" not in bad.stderr
    tiny = run("tiny-model", "--out", str(tmp_path / "t.colibri"))
    assert tiny.returncode == 0 and read_model(tmp_path / "t.colibri").header.name == "tiny-moe-4e2r"


# ---------------------------------------------------------------------------------------------
# A hostile checkpoint directory (#21): every refusal a ModelError naming the file (and key),
# sizes checked before anything is allocated, only regular files opened, rendering bounded.

DEEP = "[" * 200_000 + "]" * 200_000
HUGE = "9" * 5000


@pytest.fixture
def olmoe_copy(hf_root: Path, tmp_path: Path):
    """A fresh copy of a small checkpoint per call (its files are the ones to break)."""
    src = H.checkpoint("olmoe", hf_root)
    n = iter(range(100))
    return lambda: H.copy_with(src, tmp_path / f"c{next(n)}")


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"])
def test_deeply_nested_and_huge_numbers_in_json_are_model_errors(olmoe_copy, tmp_path: Path, name: str) -> None:
    """Was a RecursionError / ValueError traceback (and, for tokenizer_config.json, json.loads
    in chat.py with no check at all)."""
    for text, why in ((DEEP, "nested too deeply"), ('{"x": ' + HUGE + "}", "4300 digits")):
        d = olmoe_copy()
        (d / name).write_text(text)
        with pytest.raises(ModelError, match=re.escape(str(d / name)) + f".*{why}"):
            conv(d, tmp_path / "x.colibri")
    assert not (tmp_path / "x.colibri").exists()


def test_safetensors_header_and_index_nesting_and_types(tmp_path: Path) -> None:
    from colibri_kit.model.safetensors_io import Checkpoint, SafetensorsFile

    p = tmp_path / "model.safetensors"
    raw = ('{"a": ' + DEEP + "}").encode()
    p.write_bytes(len(raw).to_bytes(8, "little") + raw)
    with pytest.raises(ModelError, match="header: JSON nested too deeply"):
        SafetensorsFile(p)
    _raw_safetensors(p, {"a": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 4)
    with pytest.raises(ModelError, match=r"tensor a: dtype \['F32'\] not supported"):  # was TypeError: unhashable
        SafetensorsFile(p)
    p.unlink()
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": ' + DEEP + "}")
    with pytest.raises(ModelError, match="index.json: JSON nested too deeply"):
        Checkpoint(tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text('{"metadata": {}}')
    with pytest.raises(ModelError, match="key weight_map is missing"):
        Checkpoint(tmp_path)


def test_added_token_id_of_2_to_the_40_is_refused_before_allocating(olmoe_copy, tmp_path: Path) -> None:
    """The id sized a Python list of 2**40 entries before any check (MemoryError, or the OOM
    killer); now the key is named at once."""
    d = olmoe_copy()
    tj = json.loads((d / "tokenizer.json").read_text())
    tj["added_tokens"].append({"id": 2**40, "content": "<big>", "special": True})
    (d / "tokenizer.json").write_text(json.dumps(tj))
    k = len(tj["added_tokens"]) - 1
    with pytest.raises(ModelError, match=rf"tokenizer.json key added_tokens\[{k}\].id: {2**40} is not supported"):
        conv(d, tmp_path / "x.colibri")
    tj["added_tokens"][-1]["id"] = 5
    tj["model"]["vocab"]["<huge>"] = 10**20
    (d / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ModelError, match=r"tokenizer.json key model.vocab: .*integer id in 0\.\."):
        conv(d, tmp_path / "x.colibri")


@pytest.mark.parametrize("change,key", [
    (lambda tj: tj.update(normalizer={"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"}, "x"]}),
     "normalizer.normalizers"),
    (lambda tj: tj.update(post_processor={"type": "TemplateProcessing", "single": ["$A"]}), "post_processor.single"),
    (lambda tj: tj.update(added_tokens=["<x>"]), "added_tokens[0].id"),
    (lambda tj: tj["model"].update(merges={"a": "b"}), "model.merges"),
    (lambda tj: tj["model"].update(unk_token=["<unk>"]), "model.unk_token"),
])
def test_malformed_tokenizer_json_structures_name_the_key(olmoe_copy, tmp_path: Path, change, key: str) -> None:
    """Each was an AttributeError / TypeError / KeyError traceback."""
    d = olmoe_copy()
    tj = json.loads((d / "tokenizer.json").read_text())
    change(tj)
    (d / "tokenizer.json").write_text(json.dumps(tj))
    with pytest.raises(ModelError, match=re.escape(f"tokenizer.json key {key}")):
        conv(d, tmp_path / "x.colibri")


def test_generation_config_ids_are_checked(olmoe_copy, tmp_path: Path) -> None:
    d = olmoe_copy()
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [10**20]}))
    with pytest.raises(ModelError, match="generation_config.json key eos_token_id: 'a huge integer' is not a token id"):
        conv(d, tmp_path / "x.colibri")


def test_config_json_that_is_a_device_or_too_big_is_refused(olmoe_copy, tmp_path: Path) -> None:
    """config.json linked to /dev/zero was read until memory ran out."""
    d = olmoe_copy()
    (d / "config.json").unlink()
    (d / "config.json").symlink_to("/dev/zero")
    with pytest.raises(ModelError, match=re.escape(f"{d / 'config.json'}: is a device, not a regular")):
        conv(d, tmp_path / "x.colibri")
    d = olmoe_copy()
    with open(d / "tokenizer_config.json", "ab") as f:
        f.truncate(17 << 20)  # a sparse 17 MiB file: over the 16 MiB cap, refused before reading
    with pytest.raises(ModelError, match=r"tokenizer_config.json: \d+ bytes, larger than the 16 MiB"):
        conv(d, tmp_path / "x.colibri")
    # a link to a regular file is fine (the hub's cache is made of them)
    d = olmoe_copy()
    (d / "real_config.json").write_bytes((d / "config.json").read_bytes())
    (d / "config.json").unlink()
    (d / "config.json").symlink_to(d / "real_config.json")
    assert conv(d, tmp_path / "ok.colibri").is_file()


@pytest.mark.parametrize("name", ["config.json", "tokenizer_config.json", "chat_template.jinja"])
def test_fifo_in_the_checkpoint_does_not_hang_the_converter(olmoe_copy, tmp_path: Path, name: str) -> None:
    """A FIFO config.json blocked open() forever. The conversion runs in a child process with a
    deadline, so the old behaviour fails this test instead of hanging the suite."""
    d = olmoe_copy()
    (d / name).unlink(missing_ok=True)
    os.mkfifo(d / name)
    code = ("import sys; from colibri_kit.model.convert import convert, TargetModelLimits\n"
            "from colibri_kit.errors import ModelError\n"
            f"try:\n    convert({str(d)!r}, {str(tmp_path / 'x.colibri')!r}, limits=TargetModelLimits('host', 64, 64, 8),"
            " progress=False)\nexcept ModelError as e:\n    print(e); sys.exit(3)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=project_root(), env={**os.environ, "PYTHONPATH": str(project_root())})
    assert p.returncode == 3 and f"{d / name}: is a FIFO, not a regular" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("template,why", [
    ("{{ 'x' * 3000000000 }}{% for m in messages %}{{ m.content }}{% endfor %}", "builds a sequence of 3000000000"),
    ("{{ 'x'|center(3000000000) }}{% for m in messages %}{{ m.content }}{% endfor %}", "needs more than"),
    ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
     "{% for m in messages %}{{ m.content }}{% endfor %}", "took longer than 2 s"),
    ("{% for i in range(100000) %}{{ 'abcdefghijklmnopqrstuvwxyz' }}{% endfor %}"
     "{% for m in messages %}{{ m.content }}{% endfor %}", r"gives 26000\d\d characters"),
])
def test_chat_template_rendering_has_time_memory_and_output_limits(olmoe_copy, tmp_path: Path, monkeypatch,
                                                                   template: str, why: str) -> None:
    """A template is rendered in a child process with a memory cap and a deadline, and each
    rendering's text is capped: these took all memory or ran for hours."""
    from colibri_kit.model import chat

    monkeypatch.setattr(chat, "RENDER_SECONDS", 2.0)  # the real limit is 30 s; the child reads it at fork
    d = olmoe_copy()
    (d / "chat_template.jinja").write_text(template)
    with pytest.raises(chat.RenderLimitError, match=why) as exc:
        conv(d, tmp_path / "x.colibri")
    assert "--chat-template FILE" in str(exc.value)
    assert not (tmp_path / "x.colibri").exists()
