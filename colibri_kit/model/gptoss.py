"""gpt-oss (transformers' ``GptOssForCausalLM``, model_type ``gpt_oss``): its config.json mapped to
the `.colibri` header and layer records, and where its tensors live in a checkpoint.

What the family adds to the format (docs/format.md): attention sinks and an output-projection
bias per layer (mixer flags), q/k/v biases (header flag QKV_BIAS), YaRN RoPE (header flag
ROPE_YARN), sliding-window and full layers as ``layer_types`` says, a router bias, expert biases
and the clamped SwiGLU (moe ffn_params), and mxfp4 experts.

Two checkpoint layouts are read:
- as released (openai/gpt-oss-20b, -120b; ``quantization_config.quant_method = "mxfp4"``): each
  layer's experts as ``mlp.experts.gate_up_proj_blocks`` [E, 2F, D/32, 16] and ``_scales``
  [E, 2F, D/32] (uint8), ``down_proj_blocks`` [E, D, F/32, 16] and ``_scales`` [E, D, F/32],
  with bf16 ``gate_up_proj_bias`` [E, 2F] and ``down_proj_bias`` [E, D]. Those bytes are copied
  into the file as they are (mxfp4, never re-quantised). Gate and up rows are interleaved
  (transformers' ``gate_up[..., ::2]`` / ``[..., 1::2]``): even rows are the gate, odd the up;
- as transformers saves a bf16/f32 model: ``gate_up_proj`` [E, D, 2F] (interleaved columns) and
  ``down_proj`` [E, F, D]; converted to --dtype, or to mxfp4 with ``--expert-dtype mxfp4``.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from colibri_kit.errors import ModelError
from colibri_kit.model import format as fmt
from colibri_kit.model.format import (
    DType, Family, Ffn, Flag, Kind, LayerRecord, Mixer, MixerFlag, Routing, Yarn, gptoss_moe_params,
)

# GptOssConfig's defaults (transformers 5.24 configuration_gpt_oss.py)
DEFAULT_THETA = 150000.0
DEFAULT_ALPHA = 1.702
DEFAULT_LIMIT = 7.0
LAYER_TYPES = {"sliding_attention": Mixer.SLIDING_ATTENTION, "full_attention": Mixer.ATTENTION}


def yarn_params(cfg: dict[str, Any], block: dict[str, Any], key: str, max_positions: int) -> Yarn:
    """YaRN's parameters as transformers' _compute_yarn_parameters derives them (factor from the
    context ratio when absent; attention_factor from mscale/mscale_all_dim or 0.1 ln(factor) + 1;
    beta_fast/beta_slow default 32/1; truncate default true; original context from the config's
    top-level original_max_position_embeddings first, as standardize_rope_params does)."""
    def num(name: str, value: Any) -> float:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value) or value <= 0:
            raise ModelError(f"config.json: key {key}.{name} = {value!r} is not a positive number")
        return float(value)

    orig = cfg.get("original_max_position_embeddings", block.get("original_max_position_embeddings", max_positions))
    if not isinstance(orig, int) or isinstance(orig, bool) or not 1 <= orig <= fmt.MAX_SEQ * 1024:
        raise ModelError(f"config.json: key {key}.original_max_position_embeddings = {orig!r} is not a "
                         f"positive integer up to {fmt.MAX_SEQ * 1024}")
    factor = block.get("factor")
    factor = num("factor", max_positions / orig if factor is None else factor)

    def mscale_of(scale: float, m: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0

    af = block.get("attention_factor")
    if af is None:
        ms, msa = block.get("mscale"), block.get("mscale_all_dim")
        af = mscale_of(factor, num("mscale", ms)) / mscale_of(factor, num("mscale_all_dim", msa)) \
            if ms and msa else mscale_of(factor)
    truncate = block.get("truncate", True)
    if not isinstance(truncate, bool):
        raise ModelError(f"config.json: key {key}.truncate = {truncate!r} is not true or false")
    return Yarn(factor=factor, original_max_position=orig,
                beta_fast=num("beta_fast", block.get("beta_fast") or 32),
                beta_slow=num("beta_slow", block.get("beta_slow") or 1),
                attention_factor=num("attention_factor", af), truncate=truncate)


def rope(cfg: dict[str, Any], max_positions: int) -> tuple[float, Yarn | None]:
    """rope_theta and YaRN (or None: plain RoPE) from ``rope_parameters`` (transformers 5) or
    ``rope_scaling`` (the released config.json) and the top level."""
    theta: Any = cfg.get("rope_theta")
    yarn = None
    for key in ("rope_parameters", "rope_scaling"):
        block = cfg.get(key)
        if block is None:
            continue
        if not isinstance(block, dict):
            raise ModelError(f"config.json: key {key} = {block!r} is not an object")
        rtype = block.get("rope_type", block.get("type", "default"))
        if rtype not in ("default", "yarn"):
            raise ModelError(f"config.json: key {key}.rope_type = {rtype!r} is not supported for gpt_oss "
                             "(default or yarn)")
        prf = block.get("partial_rotary_factor", 1.0)
        if prf != 1.0:
            raise ModelError(f"config.json: key {key}.partial_rotary_factor = {prf!r} is not supported (only 1.0)")
        if block.get("rope_theta") is not None:
            theta = block["rope_theta"]
        if rtype == "yarn":
            yarn = yarn_params(cfg, block, key, max_positions)
    if theta is None:
        theta = DEFAULT_THETA
    if (not isinstance(theta, (int, float)) or isinstance(theta, bool) or not math.isfinite(float(theta))
            or theta <= 0):
        raise ModelError(f"config.json: key rope_theta = {theta!r} is not a positive number")
    return float(theta), yarn


def layer_records(cfg: dict[str, Any], n_layers: int, attention_bias: bool, alpha: float,
                  limit: float) -> tuple[LayerRecord, ...]:
    """``layer_types`` (default: sliding, full, sliding, ... as GptOssConfig fills it) -> records
    with sinks, the output bias (attention_bias) and the MoE's biases and clamped SwiGLU."""
    types = cfg.get("layer_types")
    if types is None:
        types = ["sliding_attention" if (i + 1) % 2 else "full_attention" for i in range(n_layers)]
    if not isinstance(types, list):
        raise ModelError(f"config.json: key layer_types = {str(types)[:80]!r} is not a list")
    if len(types) != n_layers:
        raise ModelError(f"config.json: key layer_types has {len(types)} entries but num_hidden_layers "
                         f"= {n_layers}: one per layer is needed")
    for i, t in enumerate(types):
        if t not in LAYER_TYPES:
            raise ModelError(f"config.json: key layer_types[{i}] = {str(t)[:60]!r} is not supported "
                             f"(allowed: {', '.join(LAYER_TYPES)})")
    window = 0
    if "sliding_attention" in types:
        sw = cfg.get("sliding_window", 128)
        if not isinstance(sw, int) or isinstance(sw, bool) or not 1 <= sw <= 0xFFFFFFFF:
            raise ModelError(f"config.json: key sliding_window = {sw!r} is not a positive integer "
                             "(layer_types has sliding_attention layers)")
        window = sw
    flags = int(MixerFlag.SINKS | (MixerFlag.O_BIAS if attention_bias else 0))
    ffn = gptoss_moe_params(alpha, limit)
    return tuple(LayerRecord(LAYER_TYPES[t], Ffn.MOE, window if t == "sliding_attention" else 0, flags,
                             (0, 0, 0, 0), ffn) for t in types)


def is_mxfp4(cfg: dict[str, Any]) -> bool:
    """Whether the checkpoint's experts are mxfp4 blocks (quantization_config.quant_method)."""
    q = cfg.get("quantization_config")
    if q is None:
        return False
    method = q.get("quant_method") if isinstance(q, dict) else None
    if method != "mxfp4":
        raise ModelError(f"config.json: key quantization_config.quant_method = {method!r} is not "
                         "supported for gpt_oss (mxfp4 as released, or no quantization_config)")
    return True


def read_gptoss(cfg: dict[str, Any], base: Any) -> Any:
    """The HFModel of a gpt_oss config.json; ``base`` is families.read_config's geometry for
    the keys every family shares (hidden size, heads, vocabulary, ...)."""
    def positive(key: str, default: float) -> float:
        v = cfg.get(key, default)
        if v is None:
            v = default
        if not isinstance(v, (int, float)) or isinstance(v, bool) or not math.isfinite(v) or v <= 0:
            raise ModelError(f"config.json: key {key} = {v!r} is not a positive number")
        return float(v)

    alpha, limit = positive("swiglu_alpha", DEFAULT_ALPHA), positive("swiglu_limit", DEFAULT_LIMIT)
    bias = cfg.get("attention_bias", True)
    if not isinstance(bias, bool):
        raise ModelError(f"config.json: key attention_bias = {bias!r} is not true or false")
    theta, yarn = rope(cfg, base.max_positions)
    flags = base.flags | (Flag.QKV_BIAS if bias else 0) | (Flag.ROPE_YARN if yarn else 0)
    return replace(base, routing=Routing.RENORMALISE, flags=int(flags), rope_theta=theta, yarn=yarn,
                   records=layer_records(cfg, base.layers, bias, alpha, limit), mxfp4=is_mxfp4(cfg),
                   moe_prefix="mlp")


def plan(m: Any, p: Any, items: list[Any], item: Any) -> None:
    """Append the tensors of a gpt_oss checkpoint to ``items`` (``p``: convert.Planner; ``item``:
    convert.Item's constructor), refusing a missing tensor or a wrong shape by name."""
    d, v, e_n, f = m.hidden, m.vocab, m.experts, m.expert_ffn
    hq, hkv = m.heads * m.head_dim, m.kv_heads * m.head_dim

    def add(kind: Kind, layer: int, expert: int, name: str, shape: tuple[int, ...]) -> None:
        items.append(item(kind, layer, expert, p.take(name, shape), name))

    for i in range(m.layers):
        pre = f"model.layers.{i}"
        att = f"{pre}.self_attn"
        add(Kind.ATTN_NORM, i, fmt.NONE, f"{pre}.input_layernorm.weight", (d,))
        add(Kind.WQ, i, fmt.NONE, f"{att}.q_proj.weight", (hq, d))
        add(Kind.WK, i, fmt.NONE, f"{att}.k_proj.weight", (hkv, d))
        add(Kind.WV, i, fmt.NONE, f"{att}.v_proj.weight", (hkv, d))
        add(Kind.WO, i, fmt.NONE, f"{att}.o_proj.weight", (d, hq))
        if m.flags & Flag.QKV_BIAS:
            add(Kind.BQ, i, fmt.NONE, f"{att}.q_proj.bias", (hq,))
            add(Kind.BK, i, fmt.NONE, f"{att}.k_proj.bias", (hkv,))
            add(Kind.BV, i, fmt.NONE, f"{att}.v_proj.bias", (hkv,))
            add(Kind.BO, i, fmt.NONE, f"{att}.o_proj.bias", (d,))
        add(Kind.ATTN_SINKS, i, fmt.NONE, f"{att}.sinks", (m.heads,))
        add(Kind.FFN_NORM, i, fmt.NONE, f"{pre}.post_attention_layernorm.weight", (d,))
        add(Kind.ROUTER, i, fmt.NONE, f"{pre}.mlp.router.weight", (e_n, d))
        add(Kind.ROUTER_BIAS, i, fmt.NONE, f"{pre}.mlp.router.bias", (e_n,))
        ex = f"{pre}.mlp.experts"
        gu_b = p.take(f"{ex}.gate_up_proj_bias", (e_n, 2 * f))
        dn_b = p.take(f"{ex}.down_proj_bias", (e_n, d))
        if m.mxfp4:
            gu, gu_s = _blocks(p, f"{ex}.gate_up_proj", (e_n, 2 * f), d)
            dn, dn_s = _blocks(p, f"{ex}.down_proj", (e_n, d), f)
            for e in range(e_n):  # even rows: gate, odd rows: up (interleaved)
                items.append(item(Kind.EXPERT_W1, i, e, gu[e][0::2], f"{ex}.gate_up_proj_blocks[{e}] gate",
                                  gu_s[e][0::2]))
                items.append(item(Kind.EXPERT_W3, i, e, gu[e][1::2], f"{ex}.gate_up_proj_blocks[{e}] up",
                                  gu_s[e][1::2]))
                items.append(item(Kind.EXPERT_W2, i, e, dn[e], f"{ex}.down_proj_blocks[{e}]", dn_s[e]))
        else:
            gu = p.take(f"{ex}.gate_up_proj", (e_n, d, 2 * f))  # [E, D, 2F], interleaved columns
            dn = p.take(f"{ex}.down_proj", (e_n, f, d))
            for e in range(e_n):
                items.append(item(Kind.EXPERT_W1, i, e, gu[e][:, 0::2].T, f"{ex}.gate_up_proj[{e}] gate"))
                items.append(item(Kind.EXPERT_W3, i, e, gu[e][:, 1::2].T, f"{ex}.gate_up_proj[{e}] up"))
                items.append(item(Kind.EXPERT_W2, i, e, dn[e].T, f"{ex}.down_proj[{e}]"))
        for e in range(e_n):
            items.append(item(Kind.EXPERT_B1, i, e, gu_b[e][0::2], f"{ex}.gate_up_proj_bias[{e}] gate"))
            items.append(item(Kind.EXPERT_B3, i, e, gu_b[e][1::2], f"{ex}.gate_up_proj_bias[{e}] up"))
            items.append(item(Kind.EXPERT_B2, i, e, dn_b[e], f"{ex}.down_proj_bias[{e}]"))
    add(Kind.TOK_EMBED, fmt.NONE, fmt.NONE, "model.embed_tokens.weight", (v, d))
    add(Kind.OUTPUT_NORM, fmt.NONE, fmt.NONE, "model.norm.weight", (d,))
    if not m.flags & Flag.TIED_EMBEDDINGS:
        add(Kind.LM_HEAD, fmt.NONE, fmt.NONE, "lm_head.weight", (v, d))


def _blocks(p: Any, stem: str, rows: tuple[int, int], cols: int) -> tuple[Any, Any]:
    """``stem``_blocks [*rows, cols/32, 16] and ``stem``_scales [*rows, cols/32], both uint8."""
    if cols % fmt.MX_BLOCK:
        raise ModelError(f"checkpoint {p.ck.dir}: tensor {stem}_blocks: {cols} columns are not a "
                         f"multiple of the mxfp4 block ({fmt.MX_BLOCK})")
    nb = cols // fmt.MX_BLOCK
    blocks = p.take_u8(f"{stem}_blocks", (*rows, nb, fmt.MX_BLOCK_BYTES))
    scales = p.take_u8(f"{stem}_scales", (*rows, nb))
    return blocks, scales


def expert_dtype(m: Any, requested: str | None, dtype: DType) -> int | None:
    """The experts' dtype in the file when it differs from ``dtype`` (None: the same): an mxfp4
    checkpoint keeps its experts as they are; otherwise ``--expert-dtype`` chooses."""
    if getattr(m, "mxfp4", False):
        if requested not in (None, "mxfp4"):
            raise ModelError(f"--expert-dtype {requested}: this checkpoint's experts are mxfp4 and are kept "
                             "as released, bit for bit (never re-quantised); leave --expert-dtype out or "
                             "give mxfp4")
        return None if dtype == DType.MXFP4 else int(DType.MXFP4)
    if requested is None:
        return None
    want = DType.parse(requested)
    return None if want == dtype else int(want)


FAMILY = Family.GPT_OSS
