"""Random-weight Hugging Face MoE checkpoints for the converter / reference / runtime tests.

Each case is a real ``transformers`` model (CPU torch) with awkward sizes: hidden sizes that are
not a multiple of the pad, grouped-query attention, explicit head_dim, tied and untied
embeddings, a shared expert. Weights are re-drawn from a seeded generator with scales that keep
activations near unit size and spread router and output logits (no near-ties, so greedy and
top-k choices are stable under f16/bf16/int8 weights).

Checkpoints are written once per test session under pytest's base temp dir and reused by every
module (``checkpoint(name, root)`` returns the existing directory when it is complete).
"""

from __future__ import annotations

import json
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Relative logit error allowed per weight type (docs/models.md, "Accuracy"):
# max |logits - transformers| / max |transformers logits| over every position.
TOLERANCE = {"f32": 1e-4, "f16": 2e-3, "bf16": 1.5e-2, "int8": 3e-2}
GREEDY_PROMPT = [3, 17, 42, 5, 99, 7, 11, 64]
GREEDY_NEW = 32
LOGIT_PROMPT = [1, 2, 3, 250, 7, 19, 200, 33, 90, 4, 141, 5]


@dataclass(frozen=True)
class Case:
    name: str
    model_type: str
    config: dict[str, Any]
    seed: int
    torch_dtype: str = "float32"
    max_shard_size: str | None = None
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


GPTOSS_COMMON: dict[str, Any] = dict(
    num_hidden_layers=3, max_position_embeddings=256, rms_norm_eps=1e-5, vocab_size=400,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, sliding_window=6,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"], swiglu_limit=1.5,
    rope_parameters={"rope_type": "yarn", "rope_theta": 150000.0, "factor": 4.0, "beta_fast": 32.0,
                     "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32},
    tie_word_embeddings=False, bos_token_id=391, eos_token_id=393, pad_token_id=392)
# at least three windows of 6, and over the original context of 32 where YaRN's ramp matters
GPTOSS_PROMPT = [(i * 37 + 11) % 380 for i in range(40)]


def _cases() -> dict[str, Case]:
    common = dict(num_hidden_layers=2, max_position_embeddings=256, rms_norm_eps=1e-6)
    hybrid = dict(max_position_embeddings=256, rms_norm_eps=1e-6, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=24, linear_conv_kernel_dim=4, linear_key_head_dim=10,
                  linear_value_head_dim=14, linear_num_key_heads=2, linear_num_value_heads=4,
                  moe_intermediate_size=40, shared_expert_intermediate_size=32, tie_word_embeddings=False)
    cases = [
        Case("mixtral", "mixtral", dict(
            common, vocab_size=320, hidden_size=72, intermediate_size=40, num_attention_heads=6,
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            tie_word_embeddings=False), seed=11,
             notes="D=72 (pad 64 -> 128), GQA 6/2, untied"),
        Case("mixtral_tied", "mixtral", dict(
            common, vocab_size=288, hidden_size=40, intermediate_size=48, num_attention_heads=4,
            num_key_value_heads=1, head_dim=16, num_local_experts=3, num_experts_per_tok=2,
            tie_word_embeddings=True), seed=12,
             notes="D=40, explicit head_dim 16 (H*Dh=64 != D), MQA, tied embeddings"),
        Case("qwen2_moe", "qwen2_moe", dict(
            common, vocab_size=300, hidden_size=56, intermediate_size=64, moe_intermediate_size=32,
            shared_expert_intermediate_size=48, num_attention_heads=4, num_key_value_heads=2,
            num_experts=6, num_experts_per_tok=2, norm_topk_prob=False, tie_word_embeddings=False),
             seed=13, notes="shared expert + sigmoid gate, qkv bias, no renormalisation"),
        Case("qwen2_moe_norm", "qwen2_moe", dict(
            common, vocab_size=272, hidden_size=48, intermediate_size=64, moe_intermediate_size=24,
            shared_expert_intermediate_size=40, num_attention_heads=6, num_key_value_heads=3,
            num_experts=4, num_experts_per_tok=3, norm_topk_prob=True, tie_word_embeddings=True),
             seed=14, notes="norm_topk_prob (renormalise), tied, top-3"),
        Case("qwen3_moe", "qwen3_moe", dict(
            common, vocab_size=288, hidden_size=80, intermediate_size=64, moe_intermediate_size=32,
            num_attention_heads=4, num_key_value_heads=2, head_dim=24, num_experts=5,
            num_experts_per_tok=3, norm_topk_prob=True, tie_word_embeddings=False), seed=15,
             notes="per-head q/k norm, explicit head_dim 24 (H*Dh=96 != D=80)"),
        Case("olmoe", "olmoe", dict(
            common, vocab_size=304, hidden_size=72, intermediate_size=36, num_attention_heads=6,
            num_key_value_heads=3, num_experts=6, num_experts_per_tok=2, norm_topk_prob=False,
            tie_word_embeddings=False), seed=16, notes="full-width q/k norm, no renormalisation"),
        Case("mixtral_bf16_sharded", "mixtral", dict(
            common, vocab_size=320, hidden_size=72, intermediate_size=40, num_attention_heads=6,
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
            tie_word_embeddings=False), seed=17, torch_dtype="bfloat16", max_shard_size="40KB",
             notes="bf16 weights, sharded safetensors with an index"),
        Case("mixtral_sliding", "mixtral", dict(
            common, vocab_size=304, hidden_size=56, intermediate_size=48, num_attention_heads=4,
            num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2, sliding_window=7,
            tie_word_embeddings=False), seed=18,
             notes="sliding_window 7: every layer attends to the last 7 positions (a ring of 7)"),
        # gpt-oss (GptOssForCausalLM): sinks, q/k/v/o biases, router and expert biases, clamped
        # SwiGLU (a limit of 1.5 so the clamps act on these weights), YaRN with factor 4 over an
        # original context of 32, layer_types sliding/full with a window of 6 (GPTOSS_PROMPT is
        # several windows long) over 3 layers (more than the pattern's period of 2)
        Case("gptoss", "gpt_oss", dict(
            GPTOSS_COMMON, hidden_size=56, intermediate_size=40, num_local_experts=5,
            num_experts_per_tok=3), seed=19,
             notes="D=56 (not a multiple of 16), F=40 (an mxfp4 tail block when quantised), 5 experts top-3"),
        Case("gptoss_mxfp4", "gpt_oss", dict(
            GPTOSS_COMMON, hidden_size=64, intermediate_size=64, num_local_experts=4,
            num_experts_per_tok=2), seed=20, extra={"mxfp4": True},
             notes="experts as released: *_blocks / *_scales (uint8), bf16 everything else"),
        # The hybrids (Gated DeltaNet + gated attention, tests/test_qwen35.py): hidden 72 (not a
        # multiple of 16), 7-8 layers so both kinds appear several times, DeltaNet heads 2 key /
        # 4 value of 10 / 14 lanes (not multiples of the 4-lane kernel), attention heads of 24
        # with a rotary width of 6, a shared expert with its sigmoid gate.
        Case("qwen3_5_moe", "qwen3_5_moe_text", dict(
            hybrid, vocab_size=300, hidden_size=72, num_hidden_layers=7, num_experts=6,
            num_experts_per_tok=2, layer_types=["linear_attention"] * 3 + ["full_attention"]
            + ["linear_attention"] * 2 + ["full_attention"]), seed=19,
             notes="Qwen3_5MoeForCausalLM, explicit layer_types (L L L F L L F)"),
        Case("qwen3_next", "qwen3_next", dict(
            hybrid, vocab_size=288, hidden_size=72, num_hidden_layers=8, num_experts=7,
            num_experts_per_tok=3, full_attention_interval=4, norm_topk_prob=True), seed=20,
             notes="Qwen3NextForCausalLM, full_attention_interval 4, fused in_proj_qkvz/ba, top-3"),
    ]
    return {c.name: c for c in cases}


CASES = _cases()
FAMILY_CASES = ["mixtral", "mixtral_tied", "qwen2_moe", "qwen2_moe_norm", "qwen3_moe", "olmoe"]
SLIDING_CASES = ["mixtral_sliding"]  # sliding-window attention layers (docs/models.md)
HYBRID_CASES = ["qwen3_5_moe", "qwen3_next"]  # Gated DeltaNet + gated attention (tests/test_qwen35.py)
# Their prompt: longer than the DeltaNet chunk transformers' chunked rule uses (64) and than the
# runtime's pass (64), so both cross a chunk boundary.
HYBRID_PROMPT = [(i * 37 + 5) % 251 + 1 for i in range(80)]
# Their bounds against transformers' f32 logits: f32 is every family's; a rounded weight type
# moves these 7-8 layer models more than the 2-layer ones above (its error passes through every
# layer and the recurrence, and routes flip in the deeper layers, whose router margins the planted
# structure no longer spreads). Measured (docs/models.md, "Accuracy"): qwen3_5_moe f16 3.9e-3,
# bf16 3.5e-2, int8 1.2e-1; qwen3_next 8.4e-4, 1.3e-2, 3.3e-2. That the runtime computes exactly
# what the rounded weights give is checked against the NumPy reference (1e-5) for every type.
HYBRID_TOLERANCE = {"f32": 1e-4, "f16": 6e-3, "bf16": 5e-2, "int8": 1.8e-1}
ZERO_CENTRED_TYPES = ("qwen3_5_moe_text", "qwen3_next")  # RMSNorm computes x * (1 + w)
ALL_CASES = FAMILY_CASES + ["mixtral_bf16_sharded"] + SLIDING_CASES
GPTOSS_CASES = ["gptoss", "gptoss_mxfp4"]  # tests/test_gptoss.py
DTYPES = ["f32", "f16", "bf16", "int8"]


def _config(case: Case):  # -> transformers.PretrainedConfig
    from transformers import AutoConfig

    return AutoConfig.for_model(case.model_type, **case.config)


def _reinit(model: Any, seed: int) -> None:
    """Redraw every parameter with well-conditioned scales (see the module docstring).

    Random weights alone put near-ties in routing and in greedy choices, which any rounding of
    the weights (f16/bf16/int8) can flip. So two structures are planted on top of the noise:
    - routing: E orthonormal directions U; each token's embedding carries a distinct score per
      expert along U (a permutation of evenly spaced levels), and the router reads U. Expert
      ranks then differ by a whole level for every token instead of by chance.
    - output (untied models): lm_head maps each token's embedding to a permuted token plus noise,
      so greedy paths wander through the vocabulary with clear top-1 margins.
    """
    import torch

    gen = torch.Generator().manual_seed(seed)
    cfg = model.config
    zero_centred = cfg.model_type in ZERO_CENTRED_TYPES
    d, v = cfg.hidden_size, cfg.vocab_size
    gpt_oss = cfg.model_type == "gpt_oss"  # experts fused and transposed: [E, D, 2F], [E, F, D]
    e_n = getattr(cfg, "num_local_experts", None) or cfg.num_experts

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, dtype=torch.float32)

    u, _ = torch.linalg.qr(randn(d, e_n))  # [D, E], orthonormal columns
    u = u.T.contiguous()  # [E, D]
    noise = randn(v, d)
    noise = noise - (noise @ u.T) @ u  # no accidental component along the routing directions
    levels = torch.arange(e_n, dtype=torch.float32) - (e_n - 1) / 2
    scores = torch.stack([levels[torch.randperm(e_n, generator=gen)] for _ in range(v)])  # [V, E]
    embed = noise + 2.0 * scores @ u
    perm = torch.randperm(v, generator=gen)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()):
            n = randn(*p.shape)
            if gpt_oss and name.endswith("experts.gate_up_proj"):
                val = n / math.sqrt(d)
            elif gpt_oss and name.endswith("experts.down_proj"):
                val = n * (0.5 / math.sqrt(p.shape[-2]))
            elif gpt_oss and name.endswith("_proj_bias"):  # the experts' biases
                val = 0.2 * n
            elif name.endswith("self_attn.sinks"):  # a logit per head, of attention scores' size
                val = 1.5 * n
            elif name.endswith("mlp.router.bias"):  # small: the planted expert ranks stay
                val = 0.1 * n
            elif name.endswith("linear_attn.norm.weight"):  # the gated norm multiplies by w
                val = 1.0 + 0.1 * n
            elif name.endswith("norm.weight") or "layernorm" in name:
                val = (0.0 if zero_centred else 1.0) + 0.1 * n
            elif name.endswith("A_log"):  # decays exp(-A * softplus(a + dt)) over a useful range
                val = torch.log(0.5 + 4.0 * torch.rand(p.shape, generator=gen))
            elif name.endswith("dt_bias"):
                val = 0.5 * n
            elif name.endswith("conv1d.weight"):
                val = n * (1.0 / math.sqrt(p.shape[-1]))
            elif name.endswith("out_proj.weight"):
                val = n * (0.5 / math.sqrt(p.shape[-1]))
            elif "embed_tokens" in name:
                val = embed
            elif name.endswith(".bias"):
                val = 0.2 * n
            elif (name.endswith("mlp.gate.weight") or name.endswith("block_sparse_moe.gate.weight")
                  or name.endswith("mlp.router.weight")):
                val = 3.0 * u + 0.1 * n / math.sqrt(d)
            elif name.endswith("lm_head.weight"):
                val = torch.empty_like(embed)
                val[perm] = embed * (3.0 / math.sqrt(d))
                val = val + n / math.sqrt(d)
            elif name.endswith("q_proj.weight") or name.endswith("k_proj.weight"):
                val = n * (1.5 / math.sqrt(p.shape[-1]))
            elif name.endswith("o_proj.weight") or "down_proj" in name:
                val = n * (0.5 / math.sqrt(p.shape[-1]))
            else:  # v_proj, gate/up projections, shared_expert_gate
                val = n / math.sqrt(p.shape[-1])
            p.copy_(val.to(p.dtype))


def build_model(case: Case):  # -> transformers model, eval mode, in the case's dtype
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(case.seed)
    model = AutoModelForCausalLM.from_config(_config(case), dtype=torch.float32)
    _reinit(model, case.seed)
    if case.torch_dtype == "bfloat16":
        model = model.to(torch.bfloat16)
    return model.eval()


def checkpoint(name: str, root: Path) -> Path:
    """The saved checkpoint directory of case ``name`` under ``root`` (built on first use)."""
    case = CASES[name]
    out = root / name
    if (out / ".complete").exists():
        return out
    if out.exists():
        shutil.rmtree(out)
    model = build_model(case)
    kwargs: dict[str, Any] = {}
    if case.max_shard_size:
        kwargs["max_shard_size"] = case.max_shard_size
    model.save_pretrained(out, **kwargs)
    if case.extra.get("mxfp4"):
        write_mxfp4_checkpoint(model, out)
    # a tokenizer of the family's real configuration, sized to the model's vocabulary
    train_tokenizer(TOKENIZER_FAMILY[name], int(case.config["vocab_size"]), out)
    (out / ".complete").write_text("ok\n")
    return out


def write_mxfp4_checkpoint(model: Any, out: Path) -> None:
    """Rewrite a saved gpt-oss checkpoint as openai/gpt-oss-20b is released: every layer's experts
    as ``mlp.experts.gate_up_proj_blocks`` [E, 2F, D/32, 16] + ``_scales`` [E, 2F, D/32] and
    ``down_proj_blocks`` [E, D, F/32, 16] + ``_scales`` [E, D, F/32] (uint8: two E2M1 codes a byte,
    element 2j low; one E8M0 exponent per 32 values), every other tensor bf16, and
    ``quantization_config`` {"quant_method": "mxfp4", "modules_to_not_convert": [...]} in
    config.json. Names, shapes, dtypes and the config block are those of the released files
    (huggingface.co/openai/gpt-oss-20b: model.safetensors.index.json, config.json; the blocks'
    layout is transformers' integrations/mxfp4.py convert_moe_packed_tensors, which reads them
    back). The blocks come from the kit's own quantiser (colibri_kit.model.format.quantize_mxfp4).
    The model's expert weights are replaced by the dequantised values, so transformers (loading
    this directory) and the model object agree."""
    import torch

    from colibri_kit.model.format import dequantize_mxfp4, quantize_mxfp4

    tensors: dict[str, tuple[str, np.ndarray]] = {}
    with torch.no_grad():
        for name, p in model.state_dict().items():
            a = p.detach().float().numpy()
            if name.endswith("experts.gate_up_proj") or name.endswith("experts.down_proj"):
                w = np.ascontiguousarray(a.transpose(0, 2, 1))  # [E, out, in]
                e_n, rows, cols = w.shape
                blocks, scales = quantize_mxfp4(w.reshape(e_n * rows, cols))
                nb = scales.shape[1]
                tensors[name + "_blocks"] = ("U8", blocks.reshape(e_n, rows, nb, 16))
                tensors[name + "_scales"] = ("U8", scales.reshape(e_n, rows, nb))
                deq = dequantize_mxfp4(blocks, scales, e_n * rows, cols).reshape(e_n, rows, cols)
                p.copy_(torch.from_numpy(deq.transpose(0, 2, 1).copy()))
            else:
                tensors[name] = ("BF16", a)
    (out / "model.safetensors").unlink()
    write_safetensors_typed(out / "model.safetensors", tensors)
    cfg = json.loads((out / "config.json").read_text())
    cfg["quantization_config"] = {"modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"],
        "quant_method": "mxfp4"}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))


def write_safetensors_typed(path: Path, tensors: dict[str, tuple[str, np.ndarray]]) -> None:
    """A safetensors file of F32, BF16 (from f32 values) and U8 tensors, written by hand."""
    from colibri_kit.model.format import f32_to_bf16_bits

    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    blobs = []
    pos = 0
    for name, (dt, arr) in tensors.items():
        if dt == "U8":
            blob = np.ascontiguousarray(arr, dtype=np.uint8).tobytes()
        elif dt == "BF16":
            blob = f32_to_bf16_bits(np.ascontiguousarray(arr, np.float32)).astype("<u2").tobytes()
        else:
            blob = np.ascontiguousarray(arr, dtype="<f4").tobytes()
        header[name] = {"dtype": dt, "shape": list(arr.shape), "data_offsets": [pos, pos + len(blob)]}
        blobs.append(blob)
        pos += len(blob)
    hjson = json.dumps(header).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as f:
        f.write(len(hjson).to_bytes(8, "little"))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def load_hf(path: Path):
    """Load a saved checkpoint with transformers in float32 (the numerical reference). An mxfp4
    checkpoint (gpt-oss as released) is dequantised by transformers itself (Mxfp4Config
    dequantize=True: its CPU path without the triton kernels)."""
    import torch
    from transformers import AutoModelForCausalLM

    cfg = json.loads((Path(path) / "config.json").read_text())
    kwargs: dict[str, Any] = {}
    if (cfg.get("quantization_config") or {}).get("quant_method") == "mxfp4":
        from transformers import Mxfp4Config

        kwargs["quantization_config"] = Mxfp4Config(dequantize=True)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kwargs).eval()


def hf_logits(model: Any, ids: list[int]) -> np.ndarray:
    import torch

    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float().numpy()


def hf_greedy(model: Any, ids: list[int], n: int) -> list[int]:
    """Greedy continuation with transformers' KV cache; never stops early (no EOS handling)."""
    import warnings

    import torch

    out: list[int] = []
    with torch.no_grad(), warnings.catch_warnings():
        # transformers 5.2x renames forward's past_key_values to cache; accept either release.
        warnings.simplefilter("ignore", FutureWarning)
        res = model(torch.tensor([ids]), use_cache=True)
        for _ in range(n):
            tok = int(torch.argmax(res.logits[0, -1]))
            out.append(tok)
            res = model(torch.tensor([[tok]]), past_key_values=res.past_key_values, use_cache=True)
    return out


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |got - want| / max |want| over every position and vocabulary entry."""
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def write_safetensors(path: Path, tensors: dict[str, np.ndarray], dtype: str = "F32") -> None:
    """A safetensors file written by hand (NumPy arrays, F32 or BF16 from f32 values)."""
    write_safetensors_typed(path, {name: (dtype, arr) for name, arr in tensors.items()})


def read_all(directory: Path) -> dict[str, np.ndarray]:
    """Every tensor of a checkpoint as f32 (through the kit's own torch-free reader)."""
    from colibri_kit.model.safetensors_io import Checkpoint

    return {name: view.numpy() for name, view in Checkpoint(directory)}


def copy_with(src: Path, dst: Path, tensors: dict[str, np.ndarray] | None = None,
              config: dict[str, Any] | None = None) -> Path:
    """A variant of a checkpoint: same config (or ``config``), tensors replaced by ``tensors``."""
    dst.mkdir(parents=True, exist_ok=True)
    cfg = config if config is not None else json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps(cfg, indent=1))
    write_safetensors(dst / "model.safetensors", tensors if tensors is not None else read_all(src))
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json", "tokenizer.model"):
        if (src / name).is_file():  # the tokenizer belongs to the variant too
            shutil.copyfile(src / name, dst / name)
    return dst


def fuse_experts(tensors: dict[str, np.ndarray], n_layers: int, n_experts: int, prefix: str,
                 names: tuple[str, str, str], transposed: bool = False,
                 fused_prefix: str | None = None) -> dict[str, np.ndarray]:
    """Rewrite per-expert tensors into the fused gate_up_proj / down_proj layout.

    ``transposed`` writes [E, D, 2F] / [E, F, D] instead of transformers' [E, 2F, D] / [E, D, F]."""
    out = dict(tensors)
    for i in range(n_layers):
        base = f"model.layers.{i}.{prefix}.experts"
        g = [out.pop(f"{base}.{e}.{names[0]}.weight") for e in range(n_experts)]
        u = [out.pop(f"{base}.{e}.{names[1]}.weight") for e in range(n_experts)]
        d = [out.pop(f"{base}.{e}.{names[2]}.weight") for e in range(n_experts)]
        gate_up = np.stack([np.concatenate([g[e], u[e]], axis=0) for e in range(n_experts)])
        down = np.stack(d)
        if transposed:
            gate_up, down = gate_up.transpose(0, 2, 1), down.transpose(0, 2, 1)
        fbase = f"model.layers.{i}.{fused_prefix or prefix}.experts"
        out[f"{fbase}.gate_up_proj"] = gate_up
        out[f"{fbase}.down_proj"] = down
        if fused_prefix and fused_prefix != prefix:
            out[f"model.layers.{i}.{fused_prefix}.gate.weight"] = out.pop(f"model.layers.{i}.{prefix}.gate.weight")
    return out


class Expected:
    """transformers' answers for one checkpoint: prompt logits, greedy ids, routed experts."""

    def __init__(self, path: Path, prompt: list[int] = LOGIT_PROMPT, threads: int | None = None) -> None:
        import torch

        model = load_hf(path)
        before = torch.get_num_threads()
        if threads:  # the hybrids' per-token torch.conv1d costs 26 ms on 2 busy threads, 1 ms on one
            torch.set_num_threads(threads)
        try:
            self.logits = hf_logits(model, prompt)
            self.greedy = hf_greedy(model, GREEDY_PROMPT, GREEDY_NEW)
            with torch.no_grad():
                out = model(torch.tensor([prompt]), output_router_logits=True)
        finally:
            torch.set_num_threads(before)
        top_k = model.config.num_experts_per_tok
        self.experts = [torch.topk(torch.softmax(r.float(), -1), top_k, -1).indices.numpy()
                        for r in out.router_logits]  # per layer [tokens, k]


def expect(cache: dict[str, Expected], root: Path, name: str) -> Expected:
    """transformers' answers for case ``name``, computed once per session (``cache`` is the
    session fixture ``hf_expected``)."""
    if name not in cache:
        hybrid = name in HYBRID_CASES
        cache[name] = Expected(checkpoint(name, root), HYBRID_PROMPT if hybrid else LOGIT_PROMPT,
                               threads=1 if hybrid else None)
    return cache[name]


def converted(root: Path, name: str, dtype: str) -> Path:
    """Case ``name`` converted to ``dtype`` for a pad of 64 (built once per session)."""
    from colibri_kit.model.convert import TargetModelLimits, convert

    out = root / f"{name}.{dtype}.colibri"
    if not out.exists():
        convert(checkpoint(name, root), out, dtype=dtype, limits=TargetModelLimits("host", 64, 64, 8),
                progress=False)
    return out


def session_root(tmp_path_factory: Any) -> Path:
    """One directory per pytest session shared by every module that builds checkpoints."""
    root = Path(tmp_path_factory.getbasetemp()) / "hf_models"
    root.mkdir(exist_ok=True)
    return root


os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# ----------------------------------------------------------------------------------------------
# Tokenizers trained here with the real `tokenizers` library, in each family's real configuration
# (pre_tokenizer / normalizer / decoder / post_processor / added tokens as in the published
# tokenizer.json files: Qwen/Qwen1.5-MoE-A2.7B and Qwen/Qwen3-30B-A3B (byte-level BPE, NFC, Split
# with the Qwen2 regex, Isolated), allenai/OLMoE-1B-7B-0924 (GPT-NeoX style: NFC, ByteLevel with
# use_regex, whitespace-run added tokens with normalized=true), mistralai/Mixtral-8x7B-v0.1
# (Prepend/Replace normalizer, no pre-tokenizer, byte_fallback + fuse_unk, decoder Replace/
# ByteFallback/Fuse/Strip, TemplateProcessing "<s> $A"); the regexes are in
# colibri_kit/model/tokenizer.py). Nothing is downloaded.

TOKENIZER_FAMILY = {"mixtral": "mixtral", "mixtral_tied": "mixtral", "mixtral_bf16_sharded": "mixtral",
                    "mixtral_sliding": "mixtral", "gptoss": "gptoss", "gptoss_mxfp4": "gptoss",
                    "qwen2_moe": "qwen2", "qwen2_moe_norm": "qwen2", "qwen3_moe": "qwen3", "olmoe": "olmoe",
                    "qwen3_5_moe": "qwen3", "qwen3_next": "qwen3"}
TOKENIZER_CORPUS = Path(__file__).resolve().parent / "data" / "tokenizer_corpus.json"
_PROSE = (
    "The engineers deploy the model to every device in the fleet. Each device answers a prompt, "
    "and the answer must match the reference exactly. We measure latency, throughput and memory. "
    "def main():\n    return 0\n\n"
)


def tokenizer_training_texts() -> list[str]:
    corpus = json.loads(TOKENIZER_CORPUS.read_text(encoding="utf-8"))
    return [t for t in corpus if t] + [_PROSE] * 20


def _added(content: str, i: int, special: bool = True, normalized: bool = False) -> dict[str, Any]:
    return {"id": i, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": normalized, "special": special}


def train_tokenizer(family: str, vocab_size: int, out_dir: Path, texts: list[str] | None = None) -> Path:
    """Write tokenizer.json, tokenizer_config.json and generation_config.json of ``family``
    ("qwen2", "qwen3", "olmoe" or "mixtral") with at most ``vocab_size`` ids into ``out_dir``."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    from colibri_kit.model.tokenizer import GPT2_REGEX, QWEN2_REGEX

    texts = texts if texts is not None else tokenizer_training_texts()
    out_dir.mkdir(parents=True, exist_ok=True)
    if family in ("qwen2", "qwen3", "olmoe"):
        if family == "olmoe":
            specials = ["<|endoftext|>", "<|padding|>"]
            extra = [("|||EMAIL_ADDRESS|||", False, True), ("|||PHONE_NUMBER|||", False, True),
                     ("|||IP_ADDRESS|||", False, True), ("  ", False, True), ("   ", False, True),
                     ("    ", False, True), ("\t\t", False, True)]
        else:
            specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
            extra = [("<think>", False, False), ("</think>", False, False)] if family == "qwen3" else []
        tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
        tok.normalizer = normalizers.NFC()
        if family == "olmoe":
            tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True, trim_offsets=True)
            assert GPT2_REGEX  # the regex ByteLevel(use_regex=True) applies
        else:
            tok.pre_tokenizer = pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)])
        tok.decoder = decoders.ByteLevel()
        n_added = len(specials) + len(extra)
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - n_added, min_frequency=1, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
        tok.train_from_iterator(texts, trainer)
        tj = json.loads(tok.to_str())
        base = len(tj["model"]["vocab"])
        tj["added_tokens"] = [_added(s, base + k) for k, s in enumerate(specials)]
        for k, (content, special, normalized) in enumerate(extra):
            tj["added_tokens"].append(_added(content, base + len(specials) + k, special, normalized))
        tj["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                "use_regex": False}
        eos = "<|endoftext|>" if family == "olmoe" else "<|im_end|>"
        config = {"add_bos_token": False, "bos_token": None, "eos_token": eos,
                  "pad_token": "<|padding|>" if family == "olmoe" else "<|endoftext|>",
                  "model_max_length": 4096, "clean_up_tokenization_spaces": False,
                  "tokenizer_class": "GPTNeoXTokenizer" if family == "olmoe" else "Qwen2Tokenizer"}
        ids = {s: base + k for k, s in enumerate(specials)}
        gen = {"eos_token_id": [ids["<|endoftext|>"]] if family == "olmoe"
               else [ids["<|im_end|>"], ids["<|endoftext|>"]]}
    elif family == "gptoss":
        # openai/gpt-oss-20b's tokenizer.json in small (tests/real_tokenizers.py builds the real one):
        # byte-level BPE with ignore_merges, o200k's regex (Split, Isolated) then ByteLevel without
        # its regex, no normalizer, the harmony special tokens as the last ids (the real ones sit at
        # 199998..200012 with reserved ids between; here the ids left over are reserved tokens too)
        from colibri_kit.model.tokenizer import O200K_REGEX

        harmony = ["<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>", "<|channel|>",
                   "<|start|>", "<|end|>", "<|message|>", "<|call|>"]
        tok = Tokenizer(models.BPE(unk_token=None, byte_fallback=False, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(O200K_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False, trim_offsets=False)])
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size - len(harmony), min_frequency=1, show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
        tok.train_from_iterator(texts, trainer)
        tj = json.loads(tok.to_str())
        tj["model"]["ignore_merges"] = True
        base = len(tj["model"]["vocab"])
        first = vocab_size - len(harmony)
        tj["added_tokens"] = [_added(f"<|reserved_{i}|>", i) for i in range(base, first)]
        tj["added_tokens"] += [_added(c, first + k) for k, c in enumerate(harmony)]
        tj["post_processor"] = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                                "use_regex": False}
        from chat_templates import template_text

        config = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>",
                  "model_max_length": 4096, "tokenizer_class": "PreTrainedTokenizerFast",
                  "chat_template": template_text("gpt-oss")}
        ids = {c: first + k for k, c in enumerate(harmony)}
        gen = {"bos_token_id": ids["<|startoftext|>"],
               "eos_token_id": [ids["<|return|>"], ids["<|endoftext|>"], ids["<|call|>"]]}
    elif family == "mixtral":
        sp = "\u2581"
        tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
        tok.normalizer = normalizers.Sequence([normalizers.Prepend(sp), normalizers.Replace(" ", sp)])
        # train with the words split at "▁" (as SentencePiece does), then store no pre-tokenizer
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement=sp, prepend_scheme="never", split=True)
        budget = vocab_size - 3 - 256
        trainer = trainers.BpeTrainer(vocab_size=budget, min_frequency=1, show_progress=False,
                                      limit_alphabet=min(120, budget // 2), special_tokens=[])
        tok.train_from_iterator(texts, trainer)
        tj = json.loads(tok.to_str())
        trained = sorted(tj["model"]["vocab"].items(), key=lambda kv: kv[1])
        vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
        for b in range(256):
            vocab[f"<0x{b:02X}>"] = len(vocab)
        for piece, _ in trained:
            vocab.setdefault(piece, len(vocab))
        tj["model"]["vocab"] = vocab
        tj["model"].update(unk_token="<unk>", byte_fallback=True, fuse_unk=True)
        tj["pre_tokenizer"] = None
        tj["added_tokens"] = [_added("<unk>", 0), _added("<s>", 1), _added("</s>", 2)]
        tj["post_processor"] = {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                     {"SpecialToken": {"id": "<s>", "type_id": 1}}, {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
        tj["decoder"] = {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": sp}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
        config = {"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>",
                  "unk_token": "<unk>", "pad_token": None, "model_max_length": 4096,
                  "clean_up_tokenization_spaces": False, "legacy": True, "tokenizer_class": "LlamaTokenizer"}
        gen = {"bos_token_id": 1, "eos_token_id": 2}
    else:
        raise ValueError(f"unknown tokenizer family {family!r}")
    total = 1 + max(list(tj["model"]["vocab"].values()) + [a["id"] for a in tj["added_tokens"]])
    assert total <= vocab_size, (family, total, vocab_size)
    text = json.dumps(tj, ensure_ascii=False)
    Tokenizer.from_str(text)  # the library itself accepts it
    (out_dir / "tokenizer.json").write_text(text, encoding="utf-8")
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=1))
    gpath = out_dir / "generation_config.json"  # keep what save_pretrained wrote; ids from here
    saved = json.loads(gpath.read_text()) if gpath.is_file() else {}
    gpath.write_text(json.dumps({**saved, **gen}, indent=1))
    return out_dir / "tokenizer.json"
