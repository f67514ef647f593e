"""Qwen3.5 / Qwen3.6 MoE and Qwen3-Next: their config.json and checkpoint layouts, mapped to
`.colibri` layers (docs/models.md, "Qwen3.5 and Qwen3-Next").

Both are hybrids: layer_types (or every full_attention_interval-th layer) is gated full
attention, the rest Gated DeltaNet linear attention; every layer is MoE with a sigmoid-gated
shared expert. The released layouts, as transformers 5 loads them:

- ``qwen3_5_moe`` (Qwen3_5MoeForConditionalGeneration, Qwen3.5/3.6-35B-A3B ...): config.json
  holds a ``text_config`` (and a ``vision_config``); tensors under ``model.language_model.``,
  the vision tower under ``model.visual.`` (skipped: the runtime runs the text model), the
  multi-token-prediction head under ``mtp.`` (skipped: the runtime decodes one token at a time;
  speculative decoding with it is not built). ``qwen3_5_moe_text`` (Qwen3_5MoeForCausalLM, what
  transformers saves for the text model) is the same without the wrapper: tensors under
  ``model.``. DeltaNet projections ``in_proj_qkv`` / ``in_proj_z`` / ``in_proj_b`` /
  ``in_proj_a``.
- ``qwen3_next`` (Qwen3NextForCausalLM, Qwen3-Next-80B-A3B, Qwen3-Coder-Next): tensors under
  ``model.``, the DeltaNet projections fused per key head (``in_proj_qkvz``: q, k, then that
  head's value heads' v and z; ``in_proj_ba``: their b, then a), which the converter reorders
  into Qwen3.5's layout (transformers' fix_query_key_value_ordering), so the runtime has one.

Conversions that keep the bits: the zero-centred RMSNorm weights (``x * (1 + w)``: the layer
norms, the final norm, q/k norm) are stored as ``1 + w`` computed in f32, the product
transformers forms (Qwen3NextRMSNorm); the DeltaNet's gated norm is a plain ``w`` and stays.
q_proj's per-head [query | gate] halves become WQ and ATTN_GATE; conv1d's [C, 1, W] becomes
[C, W].
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from colibri_kit.errors import ModelError
from colibri_kit.model import format as fmt
from colibri_kit.model.format import NONE, Family, Flag, Kind, Routing

from colibri_kit.model.hf_model import HFModel, Hybrid, _int, _limit, _token
from colibri_kit.model.plan import Item, Planner, _experts, unknown_tensors

if TYPE_CHECKING:
    from colibri_kit.model.safetensors_io import Checkpoint, TensorView

HYBRID_TYPES = {"qwen3_next": Family.QWEN3_NEXT, "qwen3_5_moe": Family.QWEN3_5_MOE,
                "qwen3_5_moe_text": Family.QWEN3_5_MOE}
LAYER_TYPES = ("linear_attention", "full_attention")
# prefixes of tensors the runtime does not use, and why (printed by the converter)
SKIPPED = {"model.visual.": "the vision tower (the runtime runs the text model)",
           "mtp.": "the multi-token-prediction head (no speculative decoding in the runtime)"}


def text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    """The text model's config: a ConditionalGeneration's ``text_config`` with the top level's
    keys it lacks (its vision_config is not used), or the config itself."""
    inner = cfg.get("text_config")
    if inner is None:
        return dict(cfg)
    if not isinstance(inner, dict):
        raise ModelError("config.json: key text_config is not an object")
    text = {**{k: v for k, v in cfg.items() if k not in ("text_config", "vision_config")}, **inner}
    text["model_type"] = cfg.get("model_type")
    return text


def read_hybrid(cfg: dict[str, Any]) -> "HFModel":
    """config.json of a qwen3_5_moe / qwen3_5_moe_text / qwen3_next checkpoint -> HFModel."""
    model_type = cfg["model_type"]
    family = HYBRID_TYPES[model_type]
    t = text_config(cfg)
    act = t.get("hidden_act", "silu")
    if act != "silu":
        raise ModelError(f"config.json: key hidden_act = {act!r} is not supported (silu only)")
    if t.get("attention_bias"):
        raise ModelError("config.json: key attention_bias = true is not supported (no attention biases)")
    if t.get("attn_output_gate") is False:
        raise ModelError("config.json: key attn_output_gate = false is not supported (transformers' "
                         f"{model_type} attention always gates its output)")
    if family == Family.QWEN3_NEXT:
        step = t.get("decoder_sparse_step", 1)
        if step != 1:
            raise ModelError(f"config.json: key decoder_sparse_step = {step!r} is not supported (every layer must be MoE: 1)")
        if t.get("mlp_only_layers"):
            raise ModelError(f"config.json: key mlp_only_layers = {t['mlp_only_layers']!r} is not supported (every layer must be MoE: [])")
        if t.get("use_sliding_window"):
            raise ModelError("config.json: key use_sliding_window = true is not supported")
    hidden = _limit("hidden_size", _int(t, "hidden_size"), 1, fmt.MAX_EMBED)
    layers = _limit("num_hidden_layers", _int(t, "num_hidden_layers"), 1, fmt.MAX_LAYERS)
    heads = _limit("num_attention_heads", _int(t, "num_attention_heads"), 1, fmt.MAX_HEADS)
    kv_heads = _limit("num_key_value_heads", _int(t, "num_key_value_heads", heads), 1, fmt.MAX_HEADS)
    if heads % kv_heads:
        raise ModelError(f"config.json: key num_key_value_heads = {kv_heads} does not divide num_attention_heads = {heads}")
    head_dim = _limit("head_dim", _int(t, "head_dim", 256), 2, fmt.MAX_HEAD_DIM)
    if head_dim % 2:
        raise ModelError(f"config.json: key head_dim = {head_dim} is odd (RoPE needs an even head dimension)")
    theta, factor = _rope(t)
    rotary = int(head_dim * factor)
    if rotary < 2 or rotary % 2:
        raise ModelError(f"config.json: partial_rotary_factor {factor} x head_dim {head_dim} = {rotary} rotary "
                         "lanes; RoPE needs an even number of at least 2")
    types = _layer_types(t, layers)
    lim = fmt.DELTANET_LIMITS
    hybrid = Hybrid(
        types, _limit("linear_conv_kernel_dim", _int(t, "linear_conv_kernel_dim", 4), 1, lim["conv width"]),
        _limit("linear_num_key_heads", _int(t, "linear_num_key_heads", 16), 1, lim["heads"]),
        _limit("linear_num_value_heads", _int(t, "linear_num_value_heads", 32), 1, lim["heads"]),
        _limit("linear_key_head_dim", _int(t, "linear_key_head_dim", 128), 1, lim["head dim"]),
        _limit("linear_value_head_dim", _int(t, "linear_value_head_dim", 128), 1, lim["head dim"]),
        rotary, "model.language_model" if "text_config" in cfg else "model", family == Family.QWEN3_NEXT)
    if hybrid.hv % hybrid.hk:
        raise ModelError(f"config.json: key linear_num_value_heads = {hybrid.hv} is not a multiple of "
                         f"linear_num_key_heads = {hybrid.hk}")
    experts = _limit("num_experts", _int(t, "num_experts"), 1, fmt.MAX_EXPERTS)
    top_k = _limit("num_experts_per_tok", _int(t, "num_experts_per_tok"), 1, min(fmt.MAX_TOP_K, experts))
    ffn = _limit("moe_intermediate_size", _int(t, "moe_intermediate_size"), 1, fmt.MAX_FFN)
    shared = _limit("shared_expert_intermediate_size", _int(t, "shared_expert_intermediate_size"), 1, fmt.MAX_FFN)
    # Qwen3.5's router always renormalises (Qwen3_5MoeTopKRouter); Qwen3-Next's follows the config
    renorm = family == Family.QWEN3_5_MOE or t.get("norm_topk_prob", True)
    eps = t.get("rms_norm_eps", 1e-6)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < 1:
        raise ModelError(f"config.json: key rms_norm_eps = {eps!r} is not in (0, 1)")
    vocab = _limit("vocab_size", _int(t, "vocab_size"), 1, fmt.MAX_VOCAB)
    flags = Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QK_NORM_HEAD
    if t.get("tie_word_embeddings", False):
        flags |= Flag.TIED_EMBEDDINGS
    return HFModel(
        family=family, model_type=model_type, hidden=hidden, layers=layers, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, experts=experts, top_k=top_k, expert_ffn=ffn, shared_ffn=shared, vocab=vocab,
        routing=Routing.RENORMALISE if renorm else Routing.PLAIN, flags=int(flags), norm_eps=float(eps),
        rope_theta=theta,
        max_positions=_limit("max_position_embeddings", _int(t, "max_position_embeddings", 32768), 1, 1 << 40),
        sliding_window=None, bos=_token(t, "bos_token_id", vocab), eos=_token(t, "eos_token_id", vocab),
        moe_prefix="mlp", hybrid=hybrid)


def _layer_types(t: dict[str, Any], layers: int) -> tuple[str, ...]:
    """layer_types as given, else every full_attention_interval-th layer full attention
    (transformers' Qwen3NextConfig default: 4)."""
    given = t.get("layer_types")
    if given is None:
        interval = t.get("full_attention_interval", 4)
        if not isinstance(interval, int) or isinstance(interval, bool) or interval < 1:
            raise ModelError(f"config.json: key full_attention_interval = {interval!r} is not a positive integer")
        return tuple("linear_attention" if (i + 1) % interval else "full_attention" for i in range(layers))
    if not isinstance(given, list) or len(given) != layers:
        raise ModelError(f"config.json: key layer_types must list one type per layer ({layers})")
    for i, v in enumerate(given):
        if v not in LAYER_TYPES:
            raise ModelError(f"config.json: key layer_types[{i}] = {v!r} is not supported ({', '.join(LAYER_TYPES)})")
    return tuple(given)


def _rope(t: dict[str, Any]) -> tuple[float, float]:
    """(rope_theta, partial_rotary_factor) from rope_parameters (transformers 5) or the top
    level. mrope_section / mrope_interleaved (Qwen3.5) are accepted: for text every position id of
    the three mRoPE axes is the same, and the recomposition then gives plain RoPE (transformers'
    Qwen3_5MoeTextRotaryEmbedding)."""
    params = t.get("rope_parameters") or t.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise ModelError(f"config.json: key rope_parameters = {params!r} is not an object")
    rtype = params.get("rope_type", params.get("type", "default"))
    if rtype not in ("default", "mrope"):
        raise ModelError(f"config.json: key rope_parameters.rope_type = {rtype!r} is not supported (only default RoPE)")
    theta = params.get("rope_theta", t.get("rope_theta", 10000.0))
    factor = params.get("partial_rotary_factor", t.get("partial_rotary_factor", 0.25))
    for key, v in (("rope_theta", theta), ("partial_rotary_factor", factor)):
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not 0 < v < 1e30:
            raise ModelError(f"config.json: key {key} = {v!r} is not a positive number")
    if factor > 1:
        raise ModelError(f"config.json: key partial_rotary_factor = {factor!r} is above 1")
    return float(theta), float(factor)


# ---- tensors --------------------------------------------------------------------------------


class PlusOne:
    """A norm weight ``w`` stored as ``1 + w`` (f32 addition, the value transformers' zero-centred
    RMSNorm multiplies by), as a row source for the writer."""

    def __init__(self, view: "TensorView") -> None:
        self.view = view

    @property
    def shape(self) -> tuple[int, ...]:
        return self.view.shape

    def reshape(self, *shape: int) -> "PlusOne":
        return PlusOne(self.view.reshape(*shape))

    def rows(self, start: int, stop: int) -> np.ndarray:
        return np.float32(1.0) + self.view.rows(start, stop)


def skipped(ck: "Checkpoint") -> dict[str, int]:
    """Tensors of the checkpoint the runtime does not use, counted per SKIPPED prefix."""
    out: dict[str, int] = {}
    for name in ck.keys():
        for prefix in SKIPPED:
            if name.startswith(prefix):
                out[prefix] = out.get(prefix, 0) + 1
    return out


def plan_tensors(m: "HFModel", ck: "Checkpoint") -> list["Item"]:
    """Every tensor of a hybrid model with its source (see the module docstring)."""
    assert m.hybrid is not None
    hy, p = m.hybrid, Planner(ck)
    d, pre0 = m.hidden, hy.prefix
    hq, hkv, dh = m.heads * m.head_dim, m.kv_heads * m.head_dim, m.head_dim
    items: list[Item] = []

    def emit(kind: Kind, layer: int, source: Any, label: str) -> None:
        items.append(Item(kind, layer, NONE, source, label))

    def add(kind: Kind, layer: int, name: str, shape: tuple[int, ...], plus_one: bool = False) -> None:
        view = p.take(name, shape)
        emit(kind, layer, PlusOne(view) if plus_one else view, name)

    def rows_of(kind: Kind, layer: int, name: str, view: "TensorView", idx: np.ndarray, what: str) -> None:
        emit(kind, layer, view[idx], f"{name} ({what})")

    for i in range(m.layers):
        pre = f"{pre0}.layers.{i}"
        add(Kind.ATTN_NORM, i, f"{pre}.input_layernorm.weight", (d,), plus_one=True)
        if hy.layer_types[i] == "linear_attention":
            _plan_deltanet(p, hy, d, i, f"{pre}.linear_attn", emit, add, rows_of)
        else:
            att = f"{pre}.self_attn"
            q = p.take(f"{att}.q_proj.weight", (2 * hq, d))  # per head: [query Dh | gate Dh]
            heads = np.arange(m.heads)[:, None] * 2 * dh
            rows_of(Kind.WQ, i, f"{att}.q_proj.weight", q, (heads + np.arange(dh)).ravel(), "query halves")
            rows_of(Kind.ATTN_GATE, i, f"{att}.q_proj.weight", q, (heads + dh + np.arange(dh)).ravel(), "gate halves")
            add(Kind.WK, i, f"{att}.k_proj.weight", (hkv, d))
            add(Kind.WV, i, f"{att}.v_proj.weight", (hkv, d))
            add(Kind.WO, i, f"{att}.o_proj.weight", (d, hq))
            add(Kind.Q_NORM, i, f"{att}.q_norm.weight", (dh,), plus_one=True)
            add(Kind.K_NORM, i, f"{att}.k_norm.weight", (dh,), plus_one=True)
        add(Kind.FFN_NORM, i, f"{pre}.post_attention_layernorm.weight", (d,), plus_one=True)
        moe = f"{pre}.mlp"
        add(Kind.ROUTER, i, f"{moe}.gate.weight", (m.experts, d))
        items.extend(_experts(p, m, i, moe))
        fs = m.shared_ffn
        add(Kind.SHARED_W1, i, f"{moe}.shared_expert.gate_proj.weight", (fs, d))
        add(Kind.SHARED_W3, i, f"{moe}.shared_expert.up_proj.weight", (fs, d))
        add(Kind.SHARED_W2, i, f"{moe}.shared_expert.down_proj.weight", (d, fs))
        add(Kind.SHARED_GATE, i, f"{moe}.shared_expert_gate.weight", (1, d))
    add(Kind.TOK_EMBED, NONE, f"{pre0}.embed_tokens.weight", (m.vocab, d))
    add(Kind.OUTPUT_NORM, NONE, f"{pre0}.norm.weight", (d,), plus_one=True)
    if not m.flags & Flag.TIED_EMBEDDINGS:
        add(Kind.LM_HEAD, NONE, "lm_head.weight", (m.vocab, d))
    unknown_tensors(m, ck, p.used, tuple(SKIPPED))
    return items


def _plan_deltanet(p: Any, hy: Hybrid, d: int, i: int, la: str, emit: Any, add: Any, rows_of: Any) -> None:
    """One linear_attn block's tensors (emit / add / rows_of: plan_tensors' helpers)."""
    kd, vd, r = hy.hk * hy.dk, hy.hv * hy.dv, hy.hv // hy.hk
    c = 2 * kd + vd
    if hy.fused:  # qwen3_next: per key head g, rows [q dk | k dk | v r*dv | z r*dv] and [b r | a r]
        name = f"{la}.in_proj_qkvz.weight"
        qkvz = p.take(name, (2 * kd + 2 * vd, d))
        group = 2 * hy.dk + 2 * r * hy.dv
        g0 = np.arange(hy.hk)[:, None] * group
        q = (g0 + np.arange(hy.dk)).ravel()
        k = (g0 + hy.dk + np.arange(hy.dk)).ravel()
        v = (g0 + 2 * hy.dk + np.arange(r * hy.dv)).ravel()
        z = (g0 + 2 * hy.dk + r * hy.dv + np.arange(r * hy.dv)).ravel()
        rows_of(Kind.DN_QKV, i, name, qkvz, np.concatenate([q, k, v]), "q, k, v in Qwen3.5's order")
        rows_of(Kind.DN_Z, i, name, qkvz, z, "z")
        name = f"{la}.in_proj_ba.weight"
        ba = p.take(name, (2 * hy.hv, d))
        b0 = np.arange(hy.hk)[:, None] * 2 * r
        rows_of(Kind.DN_B, i, name, ba, (b0 + np.arange(r)).ravel(), "b")
        rows_of(Kind.DN_A, i, name, ba, (b0 + r + np.arange(r)).ravel(), "a")
    else:
        add(Kind.DN_QKV, i, f"{la}.in_proj_qkv.weight", (c, d))
        add(Kind.DN_Z, i, f"{la}.in_proj_z.weight", (vd, d))
        add(Kind.DN_B, i, f"{la}.in_proj_b.weight", (hy.hv, d))
        add(Kind.DN_A, i, f"{la}.in_proj_a.weight", (hy.hv, d))
    conv = p.take(f"{la}.conv1d.weight", (c, 1, hy.conv))  # depthwise: [channels, 1, width]
    emit(Kind.DN_CONV, i, conv.reshape(c, hy.conv), f"{la}.conv1d.weight")
    add(Kind.DN_A_LOG, i, f"{la}.A_log", (hy.hv,))
    add(Kind.DN_DT_BIAS, i, f"{la}.dt_bias", (hy.hv,))
    add(Kind.DN_NORM, i, f"{la}.norm.weight", (hy.dv,))
    add(Kind.DN_OUT, i, f"{la}.out_proj.weight", (d, vd))
