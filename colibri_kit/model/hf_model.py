"""What the converter knows of a Hugging Face checkpoint's config once read (``HFModel``, and
``Hybrid``: what the Qwen3.5 / Qwen3-Next hybrids add), and the config readers' small checks.
The family modules (families.py, gptoss.py, qwen_next.py) build these; nothing here imports them,
so the families and the converter depend on this module and not on each other."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from colibri_kit.errors import ModelError
from colibri_kit.model import format as fmt
from colibri_kit.model.format import (
    DEFAULT_LAYER, Family, Ffn, LayerRecord, Mixer, MixerFlag, Routing, Yarn,
)


@dataclass(frozen=True)
class Hybrid:
    """What the hybrid families add to HFModel: the layer list and the DeltaNet geometry."""

    layer_types: tuple[str, ...]  # "linear_attention" / "full_attention" per layer
    conv: int                     # linear_conv_kernel_dim
    hk: int                       # linear_num_key_heads
    hv: int                       # linear_num_value_heads
    dk: int                       # linear_key_head_dim
    dv: int                       # linear_value_head_dim
    rotary: int                   # rotated lanes per attention head (head_dim * partial_rotary_factor)
    prefix: str                   # "model" or "model.language_model"
    fused: bool                   # qwen3_next's in_proj_qkvz / in_proj_ba

    def record(self, i: int, head_dim: int) -> LayerRecord:
        if self.layer_types[i] == "linear_attention":
            return LayerRecord(Mixer.GATED_DELTANET, Ffn.MOE, self.conv, 0,
                               (self.hk, self.hv, self.dk, self.dv))
        flags = MixerFlag.OUTPUT_GATE | (MixerFlag.PARTIAL_ROPE if self.rotary < head_dim else 0)
        return LayerRecord(Mixer.ATTENTION, Ffn.MOE, 0, int(flags),
                           (self.rotary if self.rotary < head_dim else 0, 0, 0, 0))


@dataclass(frozen=True)
class HFModel:
    """The geometry and semantics read from config.json (before padding and target limits)."""

    family: Family
    model_type: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    top_k: int
    expert_ffn: int
    shared_ffn: int
    vocab: int
    routing: Routing
    flags: int
    norm_eps: float
    rope_theta: float
    max_positions: int
    sliding_window: int | None
    bos: int
    eos: int
    moe_prefix: str  # "mlp" or "block_sparse_moe" (mixtral's per-expert layout)
    yarn: Yarn | None = None  # gpt-oss: YaRN RoPE
    records: tuple[LayerRecord, ...] | None = None  # gpt-oss: from layer_types, with its flags
    mxfp4: bool = False  # gpt-oss as released: the experts are mxfp4 blocks and scales
    hybrid: Hybrid | None = None  # Qwen3.5 / Qwen3-Next: the layer list and DeltaNet geometry

    def layer_records(self) -> tuple[LayerRecord, ...]:
        """Each layer's kinds for the layer table: Mixtral with ``sliding_window`` W attends to
        the last W positions in every layer (transformers' MixtralModel builds one sliding-window
        mask for all layers); gpt-oss as its layer_types say; Qwen3.5 / Qwen3-Next as theirs say
        (gated_deltanet or gated attention); the rest is attention + moe."""
        if self.records is not None:
            return self.records
        if self.hybrid is not None:
            return tuple(self.hybrid.record(i, self.head_dim) for i in range(self.layers))
        if self.sliding_window is None:
            return (DEFAULT_LAYER,) * self.layers
        return (LayerRecord(Mixer.SLIDING_ATTENTION, Ffn.MOE, self.sliding_window),) * self.layers


def _req(cfg: dict[str, Any], key: str) -> Any:
    if cfg.get(key) is None:
        raise ModelError(f"config.json: key {key} is missing")
    return cfg[key]


def _int(cfg: dict[str, Any], key: str, default: int | None = None) -> int:
    v = cfg.get(key, default) if default is not None else _req(cfg, key)
    if v is None:
        v = default
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        shown = f"an integer of {len(str(v))} digits" if isinstance(v, int) and abs(v) > 10**30 else repr(v)[:80]
        raise ModelError(f"config.json: key {key} = {shown} is not a non-negative integer")
    return v


def _limit(key: str, value: int, lo: int, hi: int) -> int:
    if not lo <= value <= hi:
        shown = f"an integer of {len(str(value))} digits" if value > 10**30 else value
        raise ModelError(f"config.json: key {key} = {shown} is outside what the .colibri format holds ({lo}..{hi})")
    return value


def _token(cfg: dict[str, Any], key: str, vocab: int) -> int:
    """A special token id, or UNKNOWN when absent or outside the vocabulary (configs do that)."""
    v = cfg.get(key)
    if isinstance(v, list):
        v = v[0] if v else None
    if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocab:
        return v
    return fmt.UNKNOWN_TOKEN
