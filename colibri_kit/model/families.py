"""Hugging Face MoE families the converter accepts: how each one's config.json maps to the
`.colibri` header, and where its tensors live in the checkpoint.

Each family is refused outright when its config asks for something the runtime does not compute
(another activation, rope scaling, Qwen's sliding-window layers, clipped qkv, dense layers between
MoE layers, attention output bias), with a message naming the config key. Mixtral's
``sliding_window`` becomes sliding-window attention layers (docs/models.md, "Sliding window").
gpt-oss (its sinks, biases, YaRN, layer_types and mxfp4 experts) is colibri_kit/model/gptoss.py.
"""

from __future__ import annotations

import math
from typing import Any

from colibri_kit.errors import ModelError
from colibri_kit.model import format as fmt
from colibri_kit.model.format import Family, Flag, Routing

# HFModel and the readers' checks live in hf_model.py, which the family modules share
from colibri_kit.model.hf_model import HFModel, _int, _limit, _token

MODEL_TYPES = {"mixtral": Family.MIXTRAL, "qwen2_moe": Family.QWEN2_MOE,
               "qwen3_moe": Family.QWEN3_MOE, "olmoe": Family.OLMOE, "gpt_oss": Family.GPT_OSS,
               # hybrids: Gated DeltaNet + gated attention (colibri_kit/model/qwen_next.py)
               "qwen3_next": Family.QWEN3_NEXT, "qwen3_5_moe": Family.QWEN3_5_MOE,
               "qwen3_5_moe_text": Family.QWEN3_5_MOE}


def rope_theta(cfg: dict[str, Any]) -> float:
    """rope_theta from ``rope_parameters`` (transformers 5) or the top level; only plain RoPE."""
    params = cfg.get("rope_parameters")
    scaling = cfg.get("rope_scaling")
    theta: Any = None
    for key, block in (("rope_parameters", params), ("rope_scaling", scaling)):
        if block is None:
            continue
        if not isinstance(block, dict):
            raise ModelError(f"config.json: key {key} = {block!r} is not an object")
        rtype = block.get("rope_type", block.get("type", "default"))
        if rtype != "default":
            raise ModelError(f"config.json: key {key}.rope_type = {rtype!r} is not supported (only default RoPE)")
        prf = block.get("partial_rotary_factor", 1.0)
        if prf != 1.0:
            raise ModelError(f"config.json: key {key}.partial_rotary_factor = {prf!r} is not supported (only 1.0)")
        if block.get("rope_theta") is not None:
            theta = block["rope_theta"]
    if cfg.get("partial_rotary_factor", 1.0) not in (1.0, None):
        raise ModelError(f"config.json: key partial_rotary_factor = {cfg['partial_rotary_factor']!r} is not supported (only 1.0)")
    if theta is None:
        theta = cfg.get("rope_theta", 10000.0)
    if (not isinstance(theta, (int, float)) or isinstance(theta, bool)
            or (isinstance(theta, int) and not 0 < theta < 10**30) or not math.isfinite(theta) or theta <= 0):
        raise ModelError(f"config.json: key rope_theta = {theta!r} is not a positive number")
    return float(theta)


def read_config(cfg: dict[str, Any]) -> HFModel:
    """Map a config.json dict to an HFModel, refusing what the runtime cannot compute."""
    model_type = cfg.get("model_type")
    if model_type not in MODEL_TYPES:
        allowed = ", ".join(MODEL_TYPES)
        raise ModelError(f"config.json: key model_type = {model_type!r} is not supported (supported: {allowed})")
    family = MODEL_TYPES[model_type]
    if family in (Family.QWEN3_NEXT, Family.QWEN3_5_MOE):
        from colibri_kit.model.qwen_next import read_hybrid

        return read_hybrid(cfg)
    gpt_oss = family == Family.GPT_OSS
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise ModelError(f"config.json: key hidden_act = {act!r} is not supported (experts use SwiGLU with silu)")
    hidden = _limit("hidden_size", _int(cfg, "hidden_size"), 1, fmt.MAX_EMBED)
    heads = _limit("num_attention_heads", _int(cfg, "num_attention_heads"), 1, fmt.MAX_HEADS)
    kv_heads = _limit("num_key_value_heads", _int(cfg, "num_key_value_heads", heads), 1, fmt.MAX_HEADS)
    if heads % kv_heads:
        raise ModelError(f"config.json: key num_key_value_heads = {kv_heads} does not divide num_attention_heads = {heads}")
    if cfg.get("head_dim") is not None or gpt_oss:  # GptOssConfig's head_dim defaults to 64
        head_dim = _int(cfg, "head_dim", 64) if gpt_oss else _int(cfg, "head_dim")
    else:
        if hidden % heads:
            raise ModelError(f"config.json: key hidden_size = {hidden} is not a multiple of num_attention_heads = {heads}")
        head_dim = hidden // heads
    _limit("head_dim", head_dim, 2, fmt.MAX_HEAD_DIM)
    if head_dim % 2:
        raise ModelError(f"config.json: key head_dim = {head_dim} is odd (RoPE needs an even head dimension)")
    layers = _limit("num_hidden_layers", _int(cfg, "num_hidden_layers"), 1, fmt.MAX_LAYERS)
    vocab = _limit("vocab_size", _int(cfg, "vocab_size"), 1, fmt.MAX_VOCAB)
    top_k = _int(cfg, "num_experts_per_tok")
    eps = cfg.get("rms_norm_eps", 1e-5 if gpt_oss else 1e-6)
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not 0 < eps < 1:
        raise ModelError(f"config.json: key rms_norm_eps = {eps!r} is not in (0, 1)")
    for key in ("attention_bias",) if not gpt_oss else ():  # gpt-oss: biases (gptoss.py)
        if cfg.get(key):
            raise ModelError(f"config.json: key {key} = true is not supported (no attention output bias in .colibri)")
    flags = 0
    shared = 0
    sliding: int | None = None
    moe_prefix = "mlp"
    if gpt_oss:  # top-k on the router logits, softmax over the chosen: renormalised weights
        experts_key, ffn_key = "num_local_experts", "intermediate_size"
        routing = Routing.RENORMALISE
    elif family == Family.MIXTRAL:
        experts_key, ffn_key = "num_local_experts", "intermediate_size"
        routing = Routing.RENORMALISE
        moe_prefix = "block_sparse_moe"
        sw = cfg.get("sliding_window")
        if sw is not None:
            sliding = _limit("sliding_window", _int(cfg, "sliding_window"), 1, 0xFFFFFFFF)
    else:
        experts_key = "num_experts"
        ffn_key = "intermediate_size" if family == Family.OLMOE else "moe_intermediate_size"
        routing = Routing.RENORMALISE if cfg.get("norm_topk_prob", False) else Routing.PLAIN
        if family in (Family.QWEN2_MOE, Family.QWEN3_MOE):
            if cfg.get("use_sliding_window"):
                raise ModelError("config.json: key use_sliding_window = true is not supported (sliding-window layers)")
            step = cfg.get("decoder_sparse_step", 1)
            if step != 1:
                raise ModelError(f"config.json: key decoder_sparse_step = {step!r} is not supported (every layer must be MoE: 1)")
            if cfg.get("mlp_only_layers"):
                raise ModelError(f"config.json: key mlp_only_layers = {cfg['mlp_only_layers']!r} is not supported (every layer must be MoE: [])")
        if family == Family.QWEN2_MOE:
            shared = _limit("shared_expert_intermediate_size", _int(cfg, "shared_expert_intermediate_size"), 0, fmt.MAX_FFN)
            if shared:
                flags |= Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE
            if cfg.get("qkv_bias", True):
                flags |= Flag.QKV_BIAS
        elif family == Family.QWEN3_MOE:
            flags |= Flag.QK_NORM_HEAD
        else:  # olmoe
            if cfg.get("clip_qkv") is not None:
                raise ModelError(f"config.json: key clip_qkv = {cfg['clip_qkv']!r} is not supported (only null)")
            if heads * head_dim != hidden:
                raise ModelError(f"config.json: key hidden_size = {hidden} must equal num_attention_heads * head_dim for olmoe")
            flags |= Flag.QK_NORM_FULL
    if cfg.get(experts_key) is None:  # transformers' attribute_map aliases the two names
        alias = "num_experts" if experts_key == "num_local_experts" else "num_local_experts"
        if cfg.get(alias) is not None:
            experts_key = alias
    experts = _limit(experts_key, _int(cfg, experts_key), 1, fmt.MAX_EXPERTS)
    _limit("num_experts_per_tok", top_k, 1, min(fmt.MAX_TOP_K, experts))
    ffn = _limit(ffn_key, _int(cfg, ffn_key), 1, fmt.MAX_FFN)
    if cfg.get("tie_word_embeddings", False):
        flags |= Flag.TIED_EMBEDDINGS
    model = HFModel(
        family=family, model_type=model_type, hidden=hidden, layers=layers, heads=heads,
        kv_heads=kv_heads, head_dim=head_dim, experts=experts, top_k=top_k, expert_ffn=ffn,
        shared_ffn=shared, vocab=vocab, routing=routing, flags=flags, norm_eps=float(eps),
        rope_theta=0.0 if gpt_oss else rope_theta(cfg),
        max_positions=_limit("max_position_embeddings", _int(cfg, "max_position_embeddings"), 1, 1 << 40),
        sliding_window=sliding, bos=_token(cfg, "bos_token_id", vocab), eos=_token(cfg, "eos_token_id", vocab),
        moe_prefix=moe_prefix)
    if gpt_oss:
        from colibri_kit.model.gptoss import read_gptoss

        return read_gptoss(cfg, model)
    return model
