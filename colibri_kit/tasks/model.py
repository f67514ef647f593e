"""Tasks for model files: convert Hugging Face checkpoints, write the built-in tiny model, inspect."""

from __future__ import annotations

import json
import sys

from invoke import Context

from colibri_kit.errors import ModelError
from colibri_kit.tasks._common import kit_task, user_errors


@kit_task(name="convert", help={
    "hf-dir": "Hugging Face checkpoint directory (config.json + safetensors, single or sharded)",
    "out": "output .colibri file (written to a temporary file, renamed when complete)",
    "dtype": "weight type of the large matrices: f32, f16, bf16, int8 (per-row scales), q4 "
             "(4-bit, one f16 scale per 32 weights) or mxfp4 (OCP MX: E2M1 with one power-of-two "
             "scale per 32 weights)",
    "expert-dtype": "weight type of the routed experts when it should differ from --dtype, e.g. "
                    "mxfp4 (gpt-oss's own); a checkpoint released with mxfp4 experts keeps them "
                    "bit for bit whatever --dtype says",
    "target": "target profile whose embed_pad / max_experts / top_k the model must fit, and whose "
              "memory it must fit (refused before converting, naming a dtype or context that "
              "fits; default host: no memory limit)",
    "max-seq-len": "KV-cache capacity; capped by the model's max_position_embeddings (default 2048)",
    "chat-template": "Jinja chat template file to store instead of the checkpoint's (docs/format.md)",
    "slots": "contexts served at once (colibri serve --slots) for the memory check (default 1)",
})
@user_errors
def convert_task(c: Context, hf_dir: str, out: str = "", dtype: str = "f32", target: str = "host",
                 max_seq_len: int = 0, chat_template: str = "", slots: int = 1,
                 expert_dtype: str = "") -> None:
    """Convert a Hugging Face MoE checkpoint (mixtral, qwen2_moe, qwen3_moe, olmoe, gpt_oss) to .colibri."""
    from colibri_kit.model.convert import convert
    from colibri_kit.profiles import load_profile

    if not out:
        raise ModelError("give the output file: invoke convert --hf-dir DIR --out FILE.colibri")
    path = convert(hf_dir, out, dtype=dtype, profile=load_profile(target), max_seq_len=max_seq_len or None,
                   progress=True, chat_template=chat_template or None, slots=slots,
                   expert_dtype=expert_dtype or None)
    print(path)


@kit_task(name="tiny-model", help={
    "out": "output .colibri file",
    "target": "target profile whose embed_pad is used for padding (default host)",
    "dtype": "f32 (default), f16, bf16, int8, q4 or mxfp4",
})
@user_errors
def tiny_model_task(c: Context, out: str, target: str = "host", dtype: str = "f32") -> None:
    """Write the built-in tiny-moe-4e2r model (deterministic, no download) for demos and smoke tests."""
    from colibri_kit.model.convert import target_limits
    from colibri_kit.model.format import DType
    from colibri_kit.model.tiny import write_tiny_model
    from colibri_kit.profiles import load_profile

    pad = target_limits(load_profile(target)).embed_pad
    print(write_tiny_model(out, pad=pad, dtype=DType.parse(dtype)))


@kit_task(name="model-info", help={
    "file": "a .colibri model file",
    "slots": "contexts served at once, for the footprint (default 1)",
    "kv-cache": "KV cache storage for the footprint: f32 or f16 (colibri --kv-cache; half the "
                "KV bytes, on either backend); default: each target's service.kv_cache",
})
@user_errors
def model_info_task(c: Context, file: str, slots: int = 1, kv_cache: str = "") -> None:
    """Validate a .colibri file and print its header, layer list ("layers": each layer's mixer,
    FFN and window; "layer_pattern": the shortest repeating period), metadata blobs, tokenizer and
    chat template ("chat_template": roles and keys present, the source template's sha256, an
    example rendering; null when none) as JSON, with its memory footprint on every target
    ("footprint": weights + slots x arena incl. KV cache, and whether it fits); the same footprint
    as one line per target on stderr, after a line naming the layers and one naming the tokenizer
    and template."""
    from colibri_kit.model import chat
    from colibri_kit.model.footprint import kv_value_bytes, model_footprint
    from colibri_kit.model.format import header_json, read_model
    from colibri_kit.profiles import load_all

    if not file:
        raise ModelError("give a model file: invoke model-info FILE")
    if kv_cache:
        kv_value_bytes(kv_cache)  # refuse a bad value before reading the file
    doc = header_json(file)
    doc["chat_template"] = chat.describe(read_model(file).metadata("chat.template"))
    fps = [model_footprint(file, p, slots, kv_dtype=kv_cache or None) for p in load_all()]
    doc["footprint"] = [fp.to_json() for fp in fps]
    json.dump(doc, sys.stdout, indent=2)
    print()
    tok, tpl = doc.get("tokenizer"), doc["chat_template"]
    print(f"layers: {doc['layer_pattern']}", file=sys.stderr)
    if doc["features"]:  # gpt-oss: window, sinks, biases, YaRN, clamped SwiGLU, mxfp4 experts
        print("features: " + "; ".join(doc["features"]), file=sys.stderr)
    print("tokenizer: " + (f"{tok['model']}, {tok['vocab']} pieces, {tok['merges']} merges" if tok else
                           "none (--ids commands only)")
          + "; chat template: " + (f"{', '.join(tpl['roles'])} (sha256 {str(tpl['source_sha256'])[:12]})"
                                   if tpl else "none"), file=sys.stderr)
    for fp in fps:
        print(fp.line(), file=sys.stderr)


TASKS = [convert_task, tiny_model_task, model_info_task]
