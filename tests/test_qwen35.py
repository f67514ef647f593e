"""Qwen3.5 / Qwen3.6 MoE and Qwen3-Next (issue 24): the converter, the gated_deltanet layer kind,
gated attention, the recurrent-state cache and its save/restore, against transformers on CPU.

The checkpoints are random Qwen3_5MoeForCausalLM and Qwen3NextForCausalLM models
(tests/hf_models.py HYBRID_CASES: hidden 72, 7 and 8 layers of both kinds, DeltaNet heads of
10/14 lanes, attention heads of 24 with a rotary width of 6, random norms, gates and decays),
built once per session. The prompt is 80 tokens: longer than transformers' DeltaNet chunk (64)
and than the runtime's pass (64). The runtime's contract (docs/runtime.md, "Recurrent state"):
a prompt runs the same recurrence as decode, so prefill == token-by-token decode bit for bit, on
any thread count; transformers' prompt path is the chunked form, within the f32 bound.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from test_cuda_host import _emu_cli
from test_sliding import _patched  # one u32 of a layer record rewritten

import hf_models as H
from colibri_kit.errors import ModelError
from colibri_kit.model.convert import TargetModelLimits, convert
from colibri_kit.model.families import read_config
from colibri_kit.model.footprint import cpu_arena_bytes, footprint, kv_cache_bytes, state_bytes
from colibri_kit.model.format import (
    DType, Ffn, Flag, Kind, LayerRecord, Mixer, MixerFlag, ModelHeader, Routing, header_json,
    padded_dim, read_model,
)
from colibri_kit.model.reference import Reference
from colibri_kit.model.tiny import write_random_model
from colibri_kit.profiles import load_profile
from gen_support import ROOT
from kit_support import runtime_library_sources

pytestmark = pytest.mark.slow

C_VS_REFERENCE = 1e-5  # as tests/test_e2e_hf.py: f32, different summation orders
IDS = ",".join(map(str, H.HYBRID_PROMPT))


def run(binary: Path, *args: object, threads: int = 2, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([str(binary), "--backend", "cpu", "--threads", str(threads), *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    if check:
        assert r.returncode == 0, f"colibri {args} failed ({r.returncode}): {r.stderr}"
    return r


def logits(binary: Path, model: Path, out: Path, *extra: object, threads: int = 2,
           ids: str = IDS) -> bytes:
    run(binary, "forward", model, "--ids", ids, *extra, "--logits-out", out, threads=threads)
    return out.read_bytes()


def as_array(raw: bytes, n: int) -> np.ndarray:
    return np.frombuffer(raw, dtype="<f4").reshape(n, -1)


# ---- against transformers -------------------------------------------------------------------

@pytest.mark.parametrize("dtype", H.DTYPES)
@pytest.mark.parametrize("name", H.HYBRID_CASES)
def test_hybrid_matches_transformers(host_colibri: Path, hf_root: Path, hf_expected: dict,
                                     tmp_path: Path, name: str, dtype: str) -> None:
    """f32 logits within the bound every family meets (1e-4 of the largest logit), the rounded
    weight types within the hybrids' measured bounds (tests/hf_models.py HYBRID_TOLERANCE); the
    32-token greedy continuation equal to transformers' (its decode runs the recurrent form with
    its cache) for every type."""
    want = H.expect(hf_expected, hf_root, name)
    model = H.converted(hf_root, name, dtype)
    got = as_array(logits(host_colibri, model, tmp_path / "l.f32"), len(H.HYBRID_PROMPT))
    err = H.rel_err(got, want.logits)
    assert err <= H.HYBRID_TOLERANCE[dtype], f"{name} {dtype}: max abs err / max |logit| = {err:.2e}"
    r = run(host_colibri, "generate", model, "--ids", ",".join(map(str, H.GREEDY_PROMPT)),
            "--max-new", H.GREEDY_NEW)
    assert json.loads(r.stdout)["new_ids"] == want.greedy


@pytest.mark.parametrize("dtype", H.DTYPES)
@pytest.mark.parametrize("name", H.HYBRID_CASES)
def test_hybrid_matches_numpy_reference(host_colibri: Path, hf_root: Path, tmp_path: Path,
                                        name: str, dtype: str) -> None:
    model = H.converted(hf_root, name, dtype)
    got = as_array(logits(host_colibri, model, tmp_path / "l.f32"), len(H.HYBRID_PROMPT))
    ref = Reference(model).forward(H.HYBRID_PROMPT)
    assert H.rel_err(got, ref) <= C_VS_REFERENCE


@pytest.mark.parametrize("name", H.HYBRID_CASES)
def test_prefill_equals_decode_on_any_thread_count(host_colibri: Path, hf_root: Path, tmp_path: Path,
                                                   name: str) -> None:
    """One 80-token call (a 64-token pass, then 16), token by token from position 1, and a
    prefix then decode steps from 70: the same bytes, on 1 and 3 threads, f32 and f16 KV cache."""
    model = H.converted(hf_root, name, "int8")
    for kv in ("f32", "f16"):
        ref = logits(host_colibri, model, tmp_path / "a.f32", "--kv-cache", kv, threads=1)
        for threads in (1, 3):
            for how in (("--decode-from", 1), ("--decode-from", 70), ()):
                got = logits(host_colibri, model, tmp_path / "b.f32", "--kv-cache", kv, *how,
                             threads=threads)
                assert got == ref, (name, kv, threads, how)
    last = logits(host_colibri, model, tmp_path / "c.f32", "--last", threads=3)
    full = logits(host_colibri, model, tmp_path / "d.f32", threads=3)
    assert last == full[-len(last):]


def test_conditional_generation_layout_is_the_text_model(host_colibri: Path, hf_root: Path,
                                                         tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    """Qwen3.5-35B-A3B's released layout (Qwen3_5MoeForConditionalGeneration): text_config and a
    vision_config, tensors under model.language_model., a vision tower (model.visual.) and an MTP
    head (mtp.): the converter takes the text model, says what it skipped, and the result runs
    with the bits of the text checkpoint's."""
    src = H.checkpoint("qwen3_5_moe", hf_root)
    cfg = json.loads((src / "config.json").read_text())
    text = {**cfg, "model_type": "qwen3_5_moe_text", "mtp_num_hidden_layers": 1}
    top = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
           "text_config": text, "tie_word_embeddings": False,
           "vision_config": {"depth": 2, "hidden_size": 16, "model_type": "qwen3_5_moe"}}
    tensors = {(k.replace("model.", "model.language_model.", 1) if k.startswith("model.") else k): v
               for k, v in H.read_all(src).items()}
    rng = np.random.default_rng(5)
    tensors["model.visual.blocks.0.attn.qkv.weight"] = rng.standard_normal((48, 16))
    tensors["model.visual.merger.linear_fc2.weight"] = rng.standard_normal((72, 16))
    tensors["mtp.fc.weight"] = rng.standard_normal((72, 144))
    tensors["mtp.layers.0.self_attn.q_proj.weight"] = rng.standard_normal((192, 72))
    wrapped = H.copy_with(src, tmp_path / "Qwen3.5-cg", tensors, top)
    out = convert(wrapped, tmp_path / "cg.colibri", limits=TargetModelLimits("host", 64, 64, 8))
    err = capfd.readouterr().err
    assert "skipped 2 tensors under model.visual.*: the vision tower" in err, err
    assert "skipped 2 tensors under mtp.*: the multi-token-prediction head" in err, err
    a = logits(host_colibri, out, tmp_path / "a.f32")
    b = logits(host_colibri, H.converted(hf_root, "qwen3_5_moe", "f32"), tmp_path / "b.f32")
    assert a == b
    assert read_model(out).header.family == 6  # qwen3_5_moe


def test_zero_centred_norms_are_stored_as_one_plus_w_exactly(hf_root: Path) -> None:
    """transformers' Qwen3NextRMSNorm multiplies by (1.0 + w) in f32; the file holds that f32 sum
    (so the product is the same), q_proj is split per head into query and gate, and the
    DeltaNet's gated norm (a plain w) is kept as it is."""
    tensors = H.read_all(H.checkpoint("qwen3_5_moe", hf_root))
    m = read_model(H.converted(hf_root, "qwen3_5_moe", "f32"))
    one = np.float32(1.0)
    for kind, name in ((Kind.ATTN_NORM, "input_layernorm"), (Kind.FFN_NORM, "post_attention_layernorm")):
        w = tensors[f"model.layers.0.{name}.weight"]
        assert np.array_equal(m.tensor(kind, 0, unpad=True)[0], one + w)
    assert np.array_equal(m.tensor(Kind.Q_NORM, 3)[0], one + tensors["model.layers.3.self_attn.q_norm.weight"])
    assert np.array_equal(m.tensor(Kind.OUTPUT_NORM, unpad=True)[0], one + tensors["model.norm.weight"])
    assert np.array_equal(m.tensor(Kind.DN_NORM, 0)[0], tensors["model.layers.0.linear_attn.norm.weight"])
    q = tensors["model.layers.3.self_attn.q_proj.weight"].reshape(4, 2, 24, 72)  # [H, query|gate, Dh, D]
    assert np.array_equal(m.tensor(Kind.WQ, 3, unpad=True), q[:, 0].reshape(96, 72))
    assert np.array_equal(m.tensor(Kind.ATTN_GATE, 3, unpad=True), q[:, 1].reshape(96, 72))


def test_qwen3_next_fused_projections_reordered(hf_root: Path) -> None:
    """Qwen3-Next's in_proj_qkvz / in_proj_ba are per key head [q | k | v | z] and [b | a]
    (transformers' fix_query_key_value_ordering); the file holds Qwen3.5's order."""
    t = H.read_all(H.checkpoint("qwen3_next", hf_root))
    m = read_model(H.converted(hf_root, "qwen3_next", "f32"))
    hk, dk, r, dv = 2, 10, 2, 14
    qkvz = t["model.layers.0.linear_attn.in_proj_qkvz.weight"].reshape(hk, 2 * dk + 2 * r * dv, 72)
    q, k = qkvz[:, :dk], qkvz[:, dk:2 * dk]
    v, z = qkvz[:, 2 * dk:2 * dk + r * dv], qkvz[:, 2 * dk + r * dv:]
    want = np.concatenate([q.reshape(-1, 72), k.reshape(-1, 72), v.reshape(-1, 72)])
    assert np.array_equal(m.tensor(Kind.DN_QKV, 0, unpad=True), want)
    assert np.array_equal(m.tensor(Kind.DN_Z, 0, unpad=True), z.reshape(-1, 72))
    ba = t["model.layers.0.linear_attn.in_proj_ba.weight"].reshape(hk, 2 * r, 72)
    assert np.array_equal(m.tensor(Kind.DN_B, 0, unpad=True), ba[:, :r].reshape(-1, 72))
    assert np.array_equal(m.tensor(Kind.DN_A, 0, unpad=True), ba[:, r:].reshape(-1, 72))


# ---- the recurrent-state cache ------------------------------------------------------------------

@pytest.fixture(scope="module")
def state_driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """runtime/tests/state_driver.c with the host target's config header."""
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import write_config

    out = tmp_path_factory.mktemp("state-driver")
    write_config(load_profile("host"), out / "include")
    rt = ROOT / "runtime"
    exe = out / "state_driver"
    subprocess.run(["cc", "-std=c11", "-O1", "-D_GNU_SOURCE", f"-I{rt / 'include'}", f"-I{rt / 'src'}",
                    f"-I{out / 'include'}", "-o", str(exe), str(rt / "tests" / "state_driver.c"),
                    *runtime_library_sources(), "-lm", "-lpthread", "-ldl"], check=True)
    return exe


@pytest.mark.parametrize("name,other", [("qwen3_5_moe", "qwen3_next"), ("qwen3_next", "qwen3_5_moe")])
def test_state_save_restore_continues_with_the_same_bits(state_driver: Path, hf_root: Path,
                                                          name: str, other: str) -> None:
    """colibri_seq_save after a 50-token prefix, continue; colibri_seq_restore into a fresh context
    (3 threads instead of 1) and into the used one, continue again: the same bits. The size is
    the header, the K/V rows of the 50 positions of the attention layers and the fixed states; bad buffers, a shorter prefix
    (the recurrent state cannot be cut), an f16 cache and another model are refused with the
    reason and leave the context where it was."""
    model = H.converted(hf_root, name, "int8")
    proc = subprocess.run([str(state_driver), str(model), IDS, "50", "1", "3",
                           str(H.converted(hf_root, other, "int8"))], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for line in ("saved equal", "fresh equal", "reused equal", "too-small refused-with-size", "\npos 50\n",
                 "snapshot-pos 50\n"):
        assert line in out, out
    for what, why in (("damaged", "damaged"), ("truncated", "truncated"), ("magic", "not a sequence snapshot"),
                      ("f16-cache", "f32 KV cache, this context an f16"), ("other-model", "another model file")):
        assert re.search(rf"refuse {what} invalid argument pos-kept \(.*{why}", out), out
    # a recurrent state holds the whole prefix: the snapshot restores to its own position only
    assert re.search(r"refuse shorter-prefix model not supported by this build pos-kept \(this model keeps a"
                     r" sliding window or a recurrent state", out), out
    h = read_model(model).header
    attention = sum(1 for r in h.layer_records() if r.mixer == Mixer.ATTENTION)
    want = 64 + attention * 2 * 50 * h.n_kv_heads * h.head_dim * 4 + state_bytes(h)
    assert f"bytes {want}\n" in out, out


# ---- the layer table, the arena, the footprint ---------------------------------------------------

@pytest.mark.parametrize("name", H.HYBRID_CASES)
def test_layer_list_arena_and_state_as_colibri_info_says(host_colibri: Path, hf_root: Path,
                                                         name: str) -> None:
    model = H.converted(hf_root, name, "f16")
    h = read_model(model).header
    hy = read_config(json.loads((H.checkpoint(name, hf_root) / "config.json").read_text())).hybrid
    assert hy is not None
    want = ["gated_deltanet" if t == "linear_attention" else "attention" for t in hy.layer_types]
    assert [r.mixer_name for r in h.layer_records()] == want
    assert want.count("attention") >= 2 and want.count("gated_deltanet") >= 5
    for r in h.layer_records():
        if r.mixer == Mixer.ATTENTION:
            assert r.mixer_flags == MixerFlag.OUTPUT_GATE | MixerFlag.PARTIAL_ROPE and r.mixer_params[0] == 6
        else:
            assert (r.window, r.mixer_params) == (4, (2, 4, 10, 14))
    for threads, kv in ((1, "f32"), (3, "f16")):
        info = json.loads(run(host_colibri, "--kv-cache", kv, "info", model, threads=threads).stdout)
        b = info["backend"]
        assert b["arena_bytes"] == cpu_arena_bytes(h, threads, kv_dtype=kv)
        assert b["state_bytes"] == state_bytes(h) > 0
        assert b["kv_cache_bytes"] == kv_cache_bytes(h, kv)
        assert info["layer_pattern"] == header_json(model)["layer_pattern"]
        assert [li["mixer"] for li in info["layers"]] == want
        assert all(li["kv_positions"] == (0 if m == "gated_deltanet" else h.max_seq_len)
                   for li, m in zip(info["layers"], want))
    fp = footprint(h, load_profile("host"))
    assert fp.state == state_bytes(h) and "recurrent state" in fp.line()
    # the state does not grow with the context, the attention layers' rows do
    longer = replace(h, max_seq_len=2 * h.max_seq_len)
    assert state_bytes(longer) == state_bytes(h) and kv_cache_bytes(longer) == 2 * kv_cache_bytes(h)


def hybrid_header(layers: tuple[LayerRecord, ...], **kw: object) -> ModelHeader:
    base = dict(num_experts=6, expert_size=40, vocab_size=300, max_seq_len=160, embed_dim=72,
                n_layers=len(layers), n_heads=4, n_kv_heads=2, head_dim=24, top_k=2,
                routing=Routing.RENORMALISE, dtype=int(DType.F32), embed_dim_pad=padded_dim(72, 64),
                pad_multiple=64, norm_eps=1e-6, rope_theta=10000.0, shared_expert_size=32,
                flags=int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QK_NORM_HEAD),
                name="hybrid", layers=layers)
    base.update(kw)
    return ModelHeader(**base)  # type: ignore[arg-type]


DN = LayerRecord(Mixer.GATED_DELTANET, Ffn.MOE, 4, 0, (2, 4, 10, 14))
GATED = LayerRecord(Mixer.ATTENTION, Ffn.MOE, 0, int(MixerFlag.OUTPUT_GATE | MixerFlag.PARTIAL_ROPE), (6, 0, 0, 0))


@pytest.mark.parametrize("layer,offset,value,py_needle,c_needle", [
    (0, 8, 0, "window 0, the convolution width must be in 1..64", "window = 0, the convolution width"),
    (0, 16 + 4, 3, "3 value heads are not a multiple of 2 key heads", "3 value heads are not a multiple of 2"),
    (0, 16 + 8, 0, "mixer_params[2] (key head dim) 0", "mixer_params[2] (key head dim) = 0"),
    (0, 12, 1, "mixer_flags 0x1, none are defined", "mixer_flags = 0x1, none are defined"),
    (1, 16, 7, "rotary width of PARTIAL_ROPE must be even", "rotary width of PARTIAL_ROPE must be even"),
    (1, 12, 0x700, "mixer_flags 0x700, bits 0x400 are not defined", "mixer_flags = 0x700 has bits 0x400"),
])
def test_both_readers_refuse_bad_hybrid_records(host_colibri: Path, tmp_path: Path, layer: int,
                                                offset: int, value: int, py_needle: str, c_needle: str) -> None:
    good = write_random_model(tmp_path / "good.colibri", hybrid_header((DN, GATED)), seed=3)
    bad = _patched(good, tmp_path / "bad.colibri", layer, offset, value)
    with pytest.raises(ModelError, match=rf"layer {layer}\b.*" + re.escape(py_needle)):
        read_model(bad)
    proc = run(host_colibri, "info", bad, check=False)
    assert proc.returncode == 1 and c_needle in proc.stderr and f"layer {layer}" in proc.stderr, proc.stderr


def test_512_experts_top_10_run_as_the_reference(host_colibri: Path, tmp_path: Path) -> None:
    """Qwen3-Next's routing (512 experts, top-10: the host build's limits) through the 512-lane
    bitonic network, on a small model of both layer kinds."""
    h = hybrid_header((DN, GATED), num_experts=512, top_k=10, expert_size=8, max_seq_len=64)
    model = write_random_model(tmp_path / "e512.colibri", h, seed=9)
    ids = H.HYBRID_PROMPT[:40]
    got = as_array(logits(host_colibri, model, tmp_path / "l.f32", ids=",".join(map(str, ids))), len(ids))
    ref_model = Reference(model)
    ref = ref_model.forward(ids)
    assert H.rel_err(got, ref) <= C_VS_REFERENCE
    margins = [r.margin for token in ref_model.routing for r in token]
    assert len(margins) == 80 and min(margins) > 1e-4  # no near-tie the two could break differently


@pytest.mark.parametrize("edit,needle", [
    ({"layer_types": ["linear_attention", "sliding_attention"]}, "layer_types must list one type per layer"),
    ({"decoder_sparse_step": 2}, "decoder_sparse_step = 2 is not supported"),
    ({"mlp_only_layers": [1]}, "mlp_only_layers = [1] is not supported"),
    ({"attention_bias": True}, "attention_bias = true is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6}}, "rope_type = 'yarn' is not supported"),
    ({"linear_num_value_heads": 3}, "linear_num_value_heads = 3 is not a multiple of linear_num_key_heads = 2"),
    ({"hidden_act": "gelu"}, "hidden_act = 'gelu' is not supported"),
])
def test_config_refusals_name_the_key(hf_root: Path, edit: dict, needle: str) -> None:
    cfg = json.loads((H.checkpoint("qwen3_next", hf_root) / "config.json").read_text())
    with pytest.raises(ModelError, match=re.escape(needle)):
        read_config({**cfg, **edit})


# ---- text: generate --chat and serve ------------------------------------------------------------

def test_generate_chat_and_serve(host_colibri: Path, hf_root: Path, tmp_path: Path) -> None:
    """The Qwen3.5 checkpoint converted with Qwen3.5's published chat template: `generate --chat`
    renders it (thinking off) and generates, and `colibri serve` answers a chat completion with
    the same greedy text."""
    from chat_templates import template_text
    from serve_support import Server

    tpl = tmp_path / "qwen3_5.jinja"
    tpl.write_text(template_text("qwen3_5-moe"), encoding="utf-8")
    model = convert(H.checkpoint("qwen3_5_moe", hf_root), tmp_path / "chat.colibri", dtype="int8",
                    limits=TargetModelLimits("host", 64, 64, 8), progress=False, chat_template=tpl)
    r = run(host_colibri, "generate", model, "--prompt", "Hello there", "--chat", "--thinking", "off",
            "--max-new", 12, "--json", threads=1)
    doc = json.loads(r.stdout)
    assert doc["new_tokens"] >= 1 and doc["finish_reason"] in ("stop", "length")
    srv = Server(host_colibri, model, "--threads", "1").start()
    try:
        status, _, body = srv.call("POST", "/v1/chat/completions", {
            "model": "chat", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 12,
            "chat_template_kwargs": {"enable_thinking": False}})
        assert status == 200, body
        reply = json.loads(body)
        assert reply["usage"]["prompt_tokens"] == doc["prompt_tokens"]
        assert reply["usage"]["completion_tokens"] == doc["new_tokens"]
        assert reply["choices"][0]["message"]["content"] == doc["text"]
    finally:
        assert srv.stop() == 0


# ---- the CUDA backend falls back (emulated GPU) ---------------------------------------------------

def test_cuda_backend_falls_back_for_what_it_does_not_run(cuda_host_build, tmp_path: Path) -> None:
    """In the GPU's host emulation (tests/test_cuda_host.py): --backend cuda refuses, naming the
    reason, 512 experts (its router sorts 256) and attention layers of two rotary widths (one RoPE
    table); --backend auto runs each on the CPU with the reason, and the footprint says the same.
    (The hybrid layers themselves run on CUDA: tests/test_cuda_hybrid.py.)"""
    cases = {
        "widths": (hybrid_header((GATED, replace(GATED, mixer_params=(8, 0, 0, 0)))),
                   "layer 1 rotates 8 lanes where another attention layer rotates 6"),
        "e512": (hybrid_header((LayerRecord(),), num_experts=512, top_k=10, expert_size=8,
                               flags=0, shared_expert_size=0), "E=512"),
    }
    for name, (h, needle) in cases.items():
        model = write_random_model(tmp_path / f"{name}.colibri", h, seed=2)
        proc = _emu_cli(cuda_host_build, "--backend", "cuda", "info", str(model))
        assert proc.returncode == 1 and needle in proc.stderr, (name, proc.stderr)
        auto = _emu_cli(cuda_host_build, "--backend", "auto", "info", str(model))
        assert auto.returncode == 0, auto.stderr
        backend = json.loads(auto.stdout)["backend"]
        assert backend["name"] == "cpu" and needle in backend["fallback_reason"], backend
        fp = footprint(h, load_profile("orin-nx" if h.num_experts <= 256 else "agx-thor"))
        assert fp.backend == "cpu" and fp.cpu_fallback, (name, fp)
