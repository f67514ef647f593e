"""gpt-oss (issue 23): random-weight GptOssForCausalLM checkpoints (tests/hf_models.py: `gptoss`,
bf16-style weights saved by transformers, D=56, F=40; `gptoss_mxfp4`, the experts as released:
*_blocks / *_scales) converted and run by the C runtime against transformers on CPU; the released
mxfp4 bytes kept bit for bit; prefill == decode and thread invariance over a prompt many windows
long (f32 and 8-bit activations); YaRN as transformers computes it; the converter's and both
readers' refusals; the footprint; the CUDA backend's fallback with the reason.

Both cases have 3 layers (sliding, full, sliding: more than the pattern's period of 2), a window of
6 over a 40-token prompt (GPTOSS_PROMPT, more than three windows), YaRN with factor 4 over an
original context of 32, random sinks and biases, and a SwiGLU limit of 1.5 so that the clamps act.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import hf_models as H
from colibri_kit.errors import ModelError
from colibri_kit.model.convert import TargetModelLimits, convert
from colibri_kit.model.footprint import (
    cpu_arena_bytes, cuda_arena_bytes, cuda_unsupported, estimate_file_bytes, footprint, kv_cache_bytes,
)
from colibri_kit.model.format import (
    NONE, DType, Ffn, FfnFlag, Flag, Kind, LayerRecord, Mixer, MixerFlag, ModelHeader, Routing, Yarn,
    dequantize_mxfp4, gptoss_moe_params, header_json, padded_dim, quantize_mxfp4, read_model,
)
from colibri_kit.model.reference import Reference, rope_frequencies
from colibri_kit.model.safetensors_io import Checkpoint
from colibri_kit.model.tiny import write_random_model
from colibri_kit.profiles import load_profile

pytestmark = pytest.mark.slow

PAD = 64  # the host profile's embed_pad
LIMITS = TargetModelLimits("host", PAD, 64, 8)
C_VS_REFERENCE = 1e-5  # as tests/test_e2e_hf.py: both f32, different summation orders
GREEDY = (H.GPTOSS_PROMPT[:10], 32)  # 42 positions: seven windows
LONG = [(i * 7919 + 13) % 390 for i in range(150)]  # three 64-token passes, the ring wrapping often


def run(binary: Path, *args: object, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(binary), *map(str, args)], capture_output=True, text=True, timeout=300)
    if check and proc.returncode != 0:
        raise AssertionError(f"colibri {' '.join(map(str, args))} exited {proc.returncode}: {proc.stderr}")
    return proc


def c_logits(binary: Path, model: Path, out: Path, ids: list[int], *opts: object, threads: int = 2,
             glob: tuple[str, ...] = ()) -> np.ndarray:
    run(binary, "--backend", "cpu", "--threads", threads, *glob, "forward", model, "--ids",
        ",".join(map(str, ids)), *opts, "--logits-out", out)
    return np.fromfile(out, "<f4").reshape(-1, read_model(model).header.vocab_size)


def converted(root: Path, name: str, dtype: str, expert_dtype: str | None = None, pad: int = PAD) -> Path:
    """Case ``name`` converted (once per session)."""
    out = root / f"{name}.{dtype}.{expert_dtype or 'same'}.{pad}.colibri"
    if not out.exists():
        convert(H.checkpoint(name, root), out, dtype=dtype, limits=TargetModelLimits("host", pad, 64, 8),
                progress=False, expert_dtype=expert_dtype)
    return out


class Expected:
    """transformers' logits over GPTOSS_PROMPT and greedy ids (GREEDY)."""

    def __init__(self, path: Path) -> None:
        model = H.load_hf(path)
        self.logits = H.hf_logits(model, H.GPTOSS_PROMPT)
        self.greedy = H.hf_greedy(model, *GREEDY)


def expect(cache: dict, root: Path, name: str) -> Expected:
    key = f"gptoss:{name}"
    if key not in cache:
        cache[key] = Expected(H.checkpoint(name, root))
    return cache[key]


# ---- against transformers -----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "bf16", "int8"])
@pytest.mark.parametrize("name", H.GPTOSS_CASES)
def test_colibri_matches_transformers(host_colibri: Path, hf_root: Path, hf_expected: dict,
                                      tmp_path: Path, name: str, dtype: str) -> None:
    """f32: within the bound every family meets (1e-4 of the largest logit) and greedy ids equal;
    the mxfp4 case is transformers run on the same dequantised weights (its Mxfp4Config
    dequantize path reads the blocks itself). bf16 / int8 attention beside the mxfp4 experts:
    the dtype's tolerance (docs/models.md), greedy ids equal."""
    want = expect(hf_expected, hf_root, name)
    model = converted(hf_root, name, dtype)
    got = c_logits(host_colibri, model, tmp_path / "l.f32", H.GPTOSS_PROMPT)
    err = H.rel_err(got, want.logits)
    assert err <= H.TOLERANCE[dtype], f"{name} {dtype}: {err:.2e}"
    doc = json.loads(run(host_colibri, "--backend", "cpu", "generate", model, "--ids",
                         ",".join(map(str, GREEDY[0])), "--max-new", GREEDY[1]).stdout)
    assert doc["new_ids"] == want.greedy


@pytest.mark.parametrize("case", [("gptoss", "f32", None), ("gptoss_mxfp4", "f32", None),
                                  ("gptoss", "bf16", "mxfp4"), ("gptoss", "mxfp4", None)])
def test_runtime_matches_the_numpy_reference(host_colibri: Path, hf_root: Path, tmp_path: Path,
                                             case: tuple[str, str, str | None]) -> None:
    """The NumPy reference (what `invoke smoke` compares a device with) computes gpt-oss too:
    mxfp4 experts (released, or quantised on request), all-mxfp4 matrices, sinks, biases, YaRN."""
    model = converted(hf_root, *case)
    got = c_logits(host_colibri, model, tmp_path / "l.f32", H.GPTOSS_PROMPT)
    err = H.rel_err(got, Reference(model).forward(H.GPTOSS_PROMPT))
    assert err <= C_VS_REFERENCE, (case, err)


def test_mxfp4_experts_on_request_stay_close_to_transformers(host_colibri: Path, hf_root: Path,
                                                             hf_expected: dict, tmp_path: Path) -> None:
    """A bf16-style checkpoint with --expert-dtype mxfp4: the experts quantised (4.25 bits a weight)
    move the logits a little, not the greedy path of these well-separated logits."""
    want = expect(hf_expected, hf_root, "gptoss")
    model = converted(hf_root, "gptoss", "f32", "mxfp4")
    h = read_model(model).header
    assert h.dtype == DType.F32 and h.expert_dtype == DType.MXFP4
    got = c_logits(host_colibri, model, tmp_path / "l.f32", H.GPTOSS_PROMPT)
    assert 1e-4 < H.rel_err(got, want.logits) < 0.15
    assert np.array_equal(np.argmax(got, 1), np.argmax(want.logits, 1))


# ---- the released blocks, bit for bit --------------------------------------------------------------

def _raw(ck: Checkpoint, name: str) -> np.ndarray:
    return np.asarray(ck.get(name).raw())


@pytest.mark.parametrize("pad", [64, 128])
def test_released_blocks_are_copied_bit_for_bit(hf_root: Path, pad: int) -> None:
    """Every expert's blocks and scales in the file are the checkpoint's bytes (gate = even rows
    of gate_up_proj_*, up = odd rows, down as it is), the hidden axis padded with zero blocks /
    rows; the biases split the same way."""
    ck = Checkpoint(H.checkpoint("gptoss_mxfp4", hf_root))
    m = read_model(converted(hf_root, "gptoss_mxfp4", "f32", pad=pad))
    h = m.header
    d, f, dp = h.embed_dim, h.expert_size, h.embed_dim_pad
    for layer in range(h.n_layers):
        ex = f"model.layers.{layer}.mlp.experts"
        gu_b, gu_s = _raw(ck, f"{ex}.gate_up_proj_blocks"), _raw(ck, f"{ex}.gate_up_proj_scales")
        dn_b, dn_s = _raw(ck, f"{ex}.down_proj_blocks"), _raw(ck, f"{ex}.down_proj_scales")
        gu_bias = ck.get(f"{ex}.gate_up_proj_bias").numpy()
        for e in range(h.num_experts):
            for kind, blocks, scales, rows in ((Kind.EXPERT_W1, gu_b[e][0::2], gu_s[e][0::2], f),
                                               (Kind.EXPERT_W3, gu_b[e][1::2], gu_s[e][1::2], f),
                                               (Kind.EXPERT_W2, dn_b[e], dn_s[e], d)):
                rec = m.record(kind, layer, e)
                assert rec.dtype == DType.MXFP4
                nb = -(-rec.cols // 32)
                got = np.asarray(m.raw(kind, layer, e)).reshape(rec.rows, nb, 16)
                got_s = np.asarray(m.scales(kind, layer, e)).reshape(rec.rows, nb)
                src_nb = blocks.shape[1]
                assert np.array_equal(got[:rows, :src_nb], blocks) and np.array_equal(got_s[:rows, :src_nb], scales)
                assert not got[rows:].any() and not got[:, src_nb:].any()  # padding: zero codes
            np.testing.assert_array_equal(m.tensor(Kind.EXPERT_B1, layer, e)[0], gu_bias[e][0::2])
            np.testing.assert_array_equal(m.tensor(Kind.EXPERT_B3, layer, e)[0], gu_bias[e][1::2])
    assert dp == padded_dim(d, pad)


def test_mxfp4_quantiser(hf_root: Path) -> None:
    """--expert-dtype mxfp4 stores colibri's quantisation of the source rows (format.quantize_mxfp4:
    the scale exponent ceil(log2(amax / 6)), round half to even onto E2M1), and the dequantised
    values are exactly E2M1 times a power of two; the tail block (F = 40) is zero-padded."""
    src = H.read_all(H.checkpoint("gptoss", hf_root))
    m = read_model(converted(hf_root, "gptoss", "f32", "mxfp4"))
    gate = src["model.layers.2.mlp.experts.gate_up_proj"][3][:, 0::2].T  # [F, D]
    blocks, scales = quantize_mxfp4(np.pad(gate, ((0, 0), (0, m.header.embed_dim_pad - gate.shape[1]))))
    assert np.array_equal(np.asarray(m.raw(Kind.EXPERT_W1, 2, 3)).reshape(blocks.shape), blocks)
    assert np.array_equal(np.asarray(m.scales(Kind.EXPERT_W1, 2, 3)).reshape(scales.shape), scales)
    down = m.tensor(Kind.EXPERT_W2, 2, 3)  # [Dp, 40]: one full block and a tail of 8
    assert down.shape[1] == 40
    # round half to even, both signs, and the scale: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 2.5 -> 2, 5 -> 4
    x = np.array([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -5.0, -0.75] + [0.0] * 22], np.float32)
    q = dequantize_mxfp4(*quantize_mxfp4(x), 1, 32)[0, :10]
    assert q.tolist() == [6.0, 0.0, 1.0, 1.0, 2.0, 2.0, 4.0, 4.0, -4.0, -1.0]
    assert quantize_mxfp4(x * 2.0 ** -20)[1][0, 0] == 127 - 20
    assert quantize_mxfp4(np.zeros((1, 32), np.float32))[1][0, 0] == 0


# ---- prefill == decode, any thread count -----------------------------------------------------------

@pytest.mark.parametrize("act", ["f32", "int8-act"])
@pytest.mark.parametrize("name,dtype", [("gptoss_mxfp4", "f32"), ("gptoss", "int8")])
def test_prefill_equals_decode_and_threads(host_colibri: Path, hf_root: Path, tmp_path: Path, name: str,
                                           dtype: str, act: str) -> None:
    """150 tokens (3 passes of 64, the window-6 ring wrapping through them): one call, token by
    token and mixed chunks, on 1 and 3 threads: the same bits in every row; `--int8-act` runs the
    mxfp4 kernels' 8-bit path (and int8 x int8 for the int8 attention)."""
    model = converted(hf_root, name, dtype)
    glob = ("--int8-act",) if act == "int8-act" else ()
    want = c_logits(host_colibri, model, tmp_path / "one.f32", LONG, threads=1, glob=glob).tobytes()
    for i, (opts, threads) in enumerate([((), 3), (("--decode-from", 0), 1), (("--decode-from", 0), 3),
                                         (("--decode-from", 37), 3), (("--decode-from", 130), 1)]):
        got = c_logits(host_colibri, model, tmp_path / f"v{i}.f32", LONG, *opts, threads=threads, glob=glob)
        assert got.tobytes() == want, (name, act, opts, threads)
    if act == "int8-act":  # 8-bit activations stay near the f32 path
        f32 = c_logits(host_colibri, model, tmp_path / "f.f32", LONG)
        got = np.frombuffer(want, "<f4").reshape(f32.shape)
        assert 0 < H.rel_err(got, f32) < 5e-2


# ---- every SIMD level, the same bits ----------------------------------------------------------------

SIMD_LEVELS = ("", "avx2", "scalar")  # "" = the best this CPU has (AVX-512 VNNI where present)


def test_mxfp4_kernels_give_the_same_bits_at_every_simd_level(host_colibri: Path, hf_root: Path,
                                                              tmp_path: Path) -> None:
    """The mxfp4 kernels keep one lane layout on every x86 level (kernels_mxfp4.c): the selftest
    (kernel bits == the scalar layout's, decode == prefill) passes under each level and names it,
    and the released-mxfp4 model gives the same logits bit for bit at AVX-512(-VNNI) and AVX2, with
    f32 and with 8-bit activations, over a prompt fed in one call and token by token (the scalar
    level is compared by the selftest alone: other kernels' scalar fallbacks, e.g. the f32 matrices
    of attention, have a layout of their own, as tests/test_runtime_cli.py's SIMD test says)."""
    import os

    names = set()
    for level in SIMD_LEVELS:
        proc = subprocess.run([str(host_colibri), "selftest"], capture_output=True, text=True, timeout=300,
                              env={**os.environ, "COLIBRI_CPU_SIMD": level})
        line = next(ln for ln in proc.stdout.splitlines() if "mxfp4 rows_dot" in ln)
        assert line.startswith("ok"), line
        names.add(line.split("(")[1].split(")")[0])
    assert {"avx2", "scalar"} <= names, names  # the caps took effect
    model = converted(hf_root, "gptoss_mxfp4", "f32")
    ids = H.GPTOSS_PROMPT
    for glob in ((), ("--int8-act",)):
        got = {}
        for level in SIMD_LEVELS[:2]:
            for opts in ((), ("--decode-from", 0)):
                out = tmp_path / f"{level or 'best'}{len(opts)}.f32"
                subprocess.run([str(host_colibri), "--backend", "cpu", "--threads", "2", *glob, "forward",
                                str(model), "--ids", ",".join(map(str, ids)), *map(str, opts), "--logits-out", str(out)],
                               check=True, timeout=300, env={**os.environ, "COLIBRI_CPU_SIMD": level})
                got[(level, opts)] = out.read_bytes()
        assert len(set(got.values())) == 1, (glob, [k for k, v in got.items() if v != got[("", ())]])


# ---- YaRN as transformers computes it ---------------------------------------------------------------

@pytest.mark.parametrize("rope", [
    {"factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096},
    {"factor": 4.0, "original_max_position_embeddings": 64},  # truncate default true, betas default
    {"factor": 8.0, "original_max_position_embeddings": 512, "mscale": 0.7, "mscale_all_dim": 1.0},
    {"factor": 3.0, "original_max_position_embeddings": 100, "attention_factor": 1.25, "truncate": True},
])
def test_yarn_frequencies_equal_transformers(rope: dict) -> None:
    """The converter's YaRN parameters and the reference's (= rope.c's) frequencies against
    transformers' own _compute_yarn_parameters on the same config."""
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from colibri_kit.model.families import read_config

    cfg = dict(model_type="gpt_oss", hidden_size=64, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=4, num_key_value_heads=2, head_dim=64, num_local_experts=4,
               num_experts_per_tok=2, vocab_size=300, max_position_embeddings=131072,
               rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, **rope})
    inv, scale = ROPE_INIT_FUNCTIONS["yarn"](GptOssConfig(**{k: v for k, v in cfg.items() if k != "model_type"}))
    m = read_config(cfg)
    h = ModelHeader(num_experts=4, expert_size=64, vocab_size=300, max_seq_len=256, embed_dim=64,
                    n_layers=2, n_heads=4, n_kv_heads=2, head_dim=64, top_k=2, routing=0, dtype=0,
                    embed_dim_pad=64, pad_multiple=64, rope_theta=m.rope_theta,
                    flags=int(Flag.ROPE_YARN), yarn=Yarn.unpack(m.yarn.pack()))
    freq, ours = rope_frequencies(h)
    assert ours == float(np.float32(scale)) and m.yarn.attention_factor == pytest.approx(scale, rel=1e-12)
    np.testing.assert_allclose(freq, inv.double().numpy(), rtol=2e-7)  # transformers computes in f32


# ---- refusals --------------------------------------------------------------------------------------

def _variant(src: Path, dst: Path, config: dict | None = None, edit=None) -> Path:
    """A copy of an mxfp4 checkpoint with ``edit(tensors)`` applied ({name: (dtype, array)})."""
    ck = Checkpoint(src)
    tensors = {}
    for name in ck.keys():
        entry = ck.entry(name)
        a = np.asarray(ck.get(name).raw()) if entry.dtype == "U8" else ck.get(name).numpy()
        tensors[name] = ("U8" if entry.dtype == "U8" else entry.dtype, a)
    if edit:
        edit(tensors)
    dst.mkdir(parents=True)
    H.write_safetensors_typed(dst / "model.safetensors", tensors)
    cfg = json.loads((src / "config.json").read_text())
    cfg.update(config or {})
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _bad_scale(t: dict) -> None:
    dt, a = t["model.layers.1.mlp.experts.down_proj_scales"]
    a = a.copy()
    a[2, 5, 1] = 255
    t["model.layers.1.mlp.experts.down_proj_scales"] = (dt, a)


@pytest.mark.parametrize("what,config,edit,needle", [
    ("blocks of the wrong shape", None,
     lambda t: t.update({"model.layers.1.mlp.experts.gate_up_proj_blocks":
                         ("U8", t["model.layers.1.mlp.experts.gate_up_proj_blocks"][1][..., :8])}),
     r"tensor model\.layers\.1\.mlp\.experts\.gate_up_proj_blocks has shape \[4, 128, 2, 8\], expected \[4, 128, 2, 16\]"),
    ("scales of the wrong shape", None,
     lambda t: t.update({"model.layers.2.mlp.experts.down_proj_scales":
                         ("U8", t["model.layers.2.mlp.experts.down_proj_scales"][1][:, :, :1])}),
     r"tensor model\.layers\.2\.mlp\.experts\.down_proj_scales has shape \[4, 64, 1\], expected \[4, 64, 2\]"),
    ("blocks as numbers", None,
     lambda t: t.update({"model.layers.0.mlp.experts.down_proj_blocks":
                         ("F32", t["model.layers.0.mlp.experts.down_proj_blocks"][1].astype(np.float32))}),
     r"tensor model\.layers\.0\.mlp\.experts\.down_proj_blocks is F32, expected U8"),
    ("a NaN scale", None, _bad_scale,
     r"model\.layers\.1\.mlp\.experts\.down_proj_blocks\[2\] -> EXPERT_W2 layer 1 expert 2: .*scale byte 255"),
    ("layer_types shorter than the layers", {"layer_types": ["sliding_attention", "full_attention"]}, None,
     r"key layer_types has 2 entries but num_hidden_layers = 3"),
    ("an unknown layer type", {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
     None, r"key layer_types\[1\] = 'chunked_attention' is not supported"),
    ("another quantisation", {"quantization_config": {"quant_method": "gptq"}}, None,
     r"quantization_config\.quant_method = 'gptq' is not supported"),
    ("another RoPE", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 5e5}}, None,
     r"rope_parameters\.rope_type = 'llama3' is not supported"),
])
def test_converter_refuses_naming_the_tensor_or_key(hf_root: Path, tmp_path: Path, what: str, config,
                                                    edit, needle: str) -> None:
    src = _variant(H.checkpoint("gptoss_mxfp4", hf_root), tmp_path / "ck", config, edit)
    out = tmp_path / "out.colibri"
    with pytest.raises(ModelError, match=needle):
        convert(src, out, limits=LIMITS, progress=False)
    assert not out.exists() and not list(tmp_path.glob("*.partial")), what  # nothing left behind


def test_mxfp4_experts_are_never_requantised(hf_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="experts are mxfp4 and are kept as released"):
        convert(H.checkpoint("gptoss_mxfp4", hf_root), tmp_path / "o.colibri", limits=LIMITS,
                progress=False, expert_dtype="int8")


def _gptoss_header(layers: tuple[LayerRecord, ...], **kw: object) -> ModelHeader:
    base = dict(num_experts=4, expert_size=32, vocab_size=300, max_seq_len=64, embed_dim=64,
                n_layers=len(layers), n_heads=4, n_kv_heads=2, head_dim=16, top_k=2,
                routing=Routing.RENORMALISE, dtype=int(DType.F32), embed_dim_pad=64, pad_multiple=PAD,
                norm_eps=1e-5, rope_theta=150000.0, name="gptoss-random", layers=layers)
    base.update(kw)
    return ModelHeader(**base)  # type: ignore[arg-type]


GPTOSS_LAYER = LayerRecord(Mixer.ATTENTION, Ffn.MOE, 0, int(MixerFlag.SINKS | MixerFlag.O_BIAS),
                           (0, 0, 0, 0), gptoss_moe_params(1.702, 7.0))


def _patch(src: Path, dst: Path, at: int, value: bytes) -> Path:
    raw = bytearray(src.read_bytes())
    raw[at: at + len(value)] = value
    dst.write_bytes(bytes(raw))
    return dst


def test_both_readers_refuse_bad_gptoss_fields(host_colibri: Path, tmp_path: Path) -> None:
    h = _gptoss_header((GPTOSS_LAYER,) * 2, flags=int(Flag.ROPE_YARN | Flag.QKV_BIAS),
                       yarn=Yarn(4.0, 32, 32.0, 1.0, 1.1386, False))
    model = write_random_model(tmp_path / "ok.colibri", h, seed=3)
    lt = int.from_bytes(model.read_bytes()[144:152], "little")
    nan = np.array([np.nan], "<f4").tobytes()
    cases = [  # (where, bytes, Python's message, C's message)
        (lt + 64 + 32, (0x80 | 7).to_bytes(4, "little"), r"layer 1 \(moe\): field ffn_params\[0\] 0x87",
         "layer 1 (moe): ffn_params[0] = 0x87 has bits 0x80"),
        (lt + 36, nan, r"layer 0 \(moe\): field ffn_params\[1\] \(SwiGLU alpha\) nan", "SwiGLU alpha) = nan"),
        (lt + 12, (0x40 | 3).to_bytes(4, "little"), r"layer 0 \(attention\): field mixer_flags 0x43",
         "mixer_flags = 0x43 has bits 0x40"),
        (152, np.array([0.0], "<f4").tobytes(), r"rope\.yarn\.factor: 0\.0, must be finite and > 0",
         "rope.yarn.factor = 0 is not finite and > 0"),
        (176, b"\x01", "header field reserved: must be zero", "header byte 176 is reserved"),
    ]
    for i, (at, value, py, c) in enumerate(cases):
        bad = _patch(model, tmp_path / f"bad{i}.colibri", at, value)
        with pytest.raises(ModelError, match=py):
            read_model(bad)
        proc = run(host_colibri, "--backend", "cpu", "info", bad, check=False)
        assert proc.returncode == 1 and c in proc.stderr, (i, proc.stderr)


# ---- footprint, model-info, the CUDA backend's fallback --------------------------------------------

def test_footprint_and_model_info(host_colibri: Path, hf_root: Path) -> None:
    """The converter's size estimate knows mxfp4 experts beside int8 attention; the arena and the
    KV bytes are the runtime's (sliding layers keep their window); model-info names the features."""
    model = converted(hf_root, "gptoss_mxfp4", "int8")
    h = read_model(model).header
    est = estimate_file_bytes(h)
    assert est <= h.tensor_end < est + 64
    info = json.loads(run(host_colibri, "--backend", "cpu", "--threads", 3, "info", model).stdout)
    assert info["backend"]["arena_bytes"] == cpu_arena_bytes(h, 3)
    kvd = h.n_kv_heads * h.head_dim
    assert kv_cache_bytes(h) == info["backend"]["kv_cache_bytes"] == 2 * 4 * kvd * (6 + h.max_seq_len + 6)
    doc = header_json(model)
    assert doc["tensor_dtypes"] == {"f32": 64, "int8": 14, "mxfp4": 36} and doc["rope"]["type"] == "yarn"
    feats = "; ".join(doc["features"])
    for want in ("sliding window 6 in 2 of 3 layers", "attention sinks", "q/k/v/o biases",
                 "YaRN RoPE (factor 4, original context 32", "clamped SwiGLU (alpha 1.702, limit 1.5)",
                 "experts mxfp4"):
        assert want in feats
    # the CUDA backend runs it (#23): mxfp4 experts, sinks, biases, YaRN, sliding layers; its
    # device arena keeps every position of the sliding layers (cb_oss_attention reads the window)
    fp = footprint(h, load_profile("orin-nx"))
    assert fp.backend == "cuda" and fp.cpu_fallback == "" and cuda_unsupported(h) == ""
    assert fp.arena == cuda_arena_bytes(h) and fp.kv_cache == 2 * 4 * kvd * 3 * h.max_seq_len


@pytest.mark.parametrize("what,kw,reason", [
    ("mxfp4 outside the experts", dict(layers=(GPTOSS_LAYER,), dtype=int(DType.MXFP4)),
     "mxfp4 embedding"),
    ("q4 experts with the clamp", dict(layers=(GPTOSS_LAYER,), dtype=int(DType.Q4)),
     "layer 0: q4 experts with gpt-oss's expert biases or clamped SwiGLU"),
])
def test_cuda_backend_falls_back_with_the_reason(host_colibri: Path, tmp_path: Path, what: str, kw: dict,
                                                 reason: str) -> None:
    """What the CUDA kernels do not compute of gpt-oss's parts (tests/test_gptoss_cuda.py runs the
    rest): the backend's model check (cuda_backend.c cb_check_model, before any driver call)
    refuses with `--backend cuda` and falls back to the CPU with `--backend auto`, naming the
    reason; the footprint agrees."""
    h = _gptoss_header(**kw)
    model = write_random_model(tmp_path / "m.colibri", h, seed=5)
    proc = run(host_colibri, "--backend", "cuda", "info", model, check=False)
    assert proc.returncode == 1 and reason in proc.stderr, proc.stderr
    auto = json.loads(run(host_colibri, "--backend", "auto", "info", model).stdout)["backend"]
    assert auto["name"] == "cpu" and reason in auto["fallback_reason"]
    assert reason in cuda_unsupported(read_model(model).header)
    assert footprint(read_model(model).header, load_profile("orin-nx")).backend == "cpu"


def test_tiny_model_in_mxfp4(host_colibri: Path, tmp_path: Path) -> None:
    """`invoke tiny-model --dtype mxfp4`: every matrix mxfp4 (the embedding gathered from it)."""
    from colibri_kit.model.tiny import write_tiny_model

    model = write_tiny_model(tmp_path / "t.colibri", dtype=DType.MXFP4)
    ids = list(range(1, 60, 3))
    got = c_logits(host_colibri, model, tmp_path / "l.f32", ids, threads=3)
    assert H.rel_err(got, Reference(model).forward(ids)) <= C_VS_REFERENCE


# ---- the real checkpoints' geometry on the real Jetsons ------------------------------------------

# openai/gpt-oss-20b's config.json (the fields the converter reads; the released file also carries
# quantization_config.modules_to_not_convert: attention, router, embeddings and LM head stay bf16).
GPT_OSS_20B = {
    "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "attention_bias": True,
    "head_dim": 64, "hidden_act": "silu", "hidden_size": 2880, "intermediate_size": 2880,
    "layer_types": ["sliding_attention", "full_attention"] * 12, "max_position_embeddings": 131072,
    "num_attention_heads": 64, "num_experts_per_tok": 4, "experts_per_token": 4, "num_hidden_layers": 24,
    "num_key_value_heads": 8, "num_local_experts": 32, "eos_token_id": 200002, "pad_token_id": 199999,
    "quantization_config": {"quant_method": "mxfp4"}, "rms_norm_eps": 1e-05,
    "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                     "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
    "rope_theta": 150000, "sliding_window": 128, "swiglu_limit": 7.0, "tie_word_embeddings": False,
    "vocab_size": 201088,
}
# openai/gpt-oss-120b: the same layer shape, 36 layers of 128 experts
GPT_OSS_120B = {**GPT_OSS_20B, "num_hidden_layers": 36, "num_local_experts": 128,
                "layer_types": ["sliding_attention", "full_attention"] * 18}


@pytest.fixture
def jetson_targets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The project's Jetson profiles plus the child profile docs/targets.md's memory rule tells a
    fleet of 16 GB Orin NX modules to write (`extends: orin-nx`, memory.total_mb 16384)."""
    from colibri_kit.paths import targets_dir

    tdir = tmp_path / "proj" / "targets"
    shutil.copytree(targets_dir(), tdir)
    (tdir / "orin-nx-16gb.yaml").write_text("name: orin-nx-16gb\ndescription: Jetson Orin NX 16GB\n"
                                            "extends: orin-nx\nmemory: {total_mb: 16384}\n")
    monkeypatch.setenv("COLIBRI_PROJECT_ROOT", str(tmp_path / "proj"))
    return tdir


def released_header(cfg: dict, dtype: str, target: str) -> ModelHeader:
    """The header `invoke convert` builds for a released checkpoint (experts kept mxfp4)."""
    from colibri_kit.model.convert import build_header, target_limits
    from colibri_kit.model.families import read_config
    from colibri_kit.model.gptoss import expert_dtype

    m = read_config(cfg)
    h = build_header(m, DType.parse(dtype), target_limits(load_profile(target)), None, "gpt-oss")
    h.expert_dtype = expert_dtype(m, None, DType.parse(dtype))
    return h


def test_released_gpt_oss_fits_the_jetsons_that_can_hold_it(jetson_targets: Path, tmp_path: Path) -> None:
    """gpt-oss-20b as released (mxfp4 experts) fits Orin NX 16GB, AGX Orin and Thor, not Orin NX
    8GB (refused by `convert` before a weight is read, with the numbers); gpt-oss-120b fits Thor
    only. The KV cache keeps 128 rows in the 12 sliding layers (docs/models.md, "gpt-oss")."""
    h = released_header(GPT_OSS_20B, "q4", "orin-nx-16gb")
    assert h.expert_dtype == DType.MXFP4 and h.yarn is not None and h.yarn.factor == 32
    kvd = h.n_kv_heads * h.head_dim
    assert kv_cache_bytes(h) == 2 * 4 * kvd * 12 * (128 + h.max_seq_len)
    expert_bytes = 24 * 32 * 3 * 2880 * (2880 // 32) * 17  # 16 bytes + 1 scale per block of 32
    assert expert_bytes < estimate_file_bytes(h) < expert_bytes + 1.2e9  # + embeddings, attention
    for target, dtype, fits in [("orin-nx-16gb", "q4", True), ("orin-nx-16gb", "bf16", True),
                                ("agx-orin", "bf16", True), ("agx-thor", "bf16", True),
                                ("orin-nx", "q4", False)]:
        fp = footprint(released_header(GPT_OSS_20B, dtype, target), load_profile(target))
        assert fp.fits == fits, (target, dtype, fp)
        # the CUDA backend runs it (#23), its device cache holding every position of every layer
        assert fp.backend == "cuda" and fp.cpu_fallback == "", fp
        assert fp.kv_cache == 2 * 4 * kvd * 24 * h.max_seq_len
    for target, fits in [("agx-orin", False), ("agx-thor", True)]:
        fp = footprint(released_header(GPT_OSS_120B, "q4", target), load_profile(target))
        assert fp.fits == fits, target
    hf = tmp_path / "gpt-oss-20b"
    hf.mkdir()
    (hf / "config.json").write_text(json.dumps(GPT_OSS_20B))  # no weights needed to refuse
    with pytest.raises(ModelError, match=r"does not fit target 'orin-nx'.*as q4, experts mxfp4.*"
                                         r"no dtype or context length fits"):
        convert(hf, tmp_path / "m.colibri", dtype="q4", profile=load_profile("orin-nx"), progress=False)
    assert not (tmp_path / "m.colibri").exists()
