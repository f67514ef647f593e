"""Benchmark: the Colibri CPU runtime against Hugging Face transformers and llama.cpp on random
checkpoints of real layer shapes.

    python benchmarks/runtime.py [--threads 2] [--dtypes f32,f16,int8] [--work /tmp/colibri-bench]
    python benchmarks/runtime.py --shape qwen3-30b-a3b --dtypes int8,q4 --prompt-lens 64,512 \
        --skip-transformers --llama-cpp /work/llama-build/llama.cpp

1. builds (once, cached in --work) a random-weight checkpoint with transformers and saves it:
   `--shape mixtral` (default) a MixtralForCausalLM (hidden 1024, 8 layers, 8 experts top-2,
   FFN 2816, 16 heads / 4 KV heads, vocab 32000); `--shape qwen3-30b-a3b` a Qwen3MoeForCausalLM
   with Qwen3-30B-A3B's published config.json (hidden 2048, 32 / 4 heads of 128, q/k norm, 128
   experts top-8, expert FFN 768, vocab 151,936, rope 1e6) and `--layers` of its 48 layers (4 by
   default: what a 23 GiB, 2-core machine converts in minutes), saved in bf16 as published;
   `--shape gpt-oss-20b` a GptOssForCausalLM with gpt-oss-20b's released config.json and layout
   (mxfp4 expert blocks, bf16 elsewhere, the o200k_harmony tokenizer; gptoss_checkpoint), compared
   with llama.cpp's MXFP4_MOE types (`--dtypes int8`; docs/runtime.md, "gpt-oss-20b shape");
   `--shape qwen3.5-35b-a3b` a Qwen3_5MoeForConditionalGeneration checkpoint with Qwen3.5-35B-A3B's
   released text config and layout (3 Gated DeltaNet : 1 gated attention, 256 experts top-8 +
   shared expert, bf16, the Qwen3.5 tokenizer; qwen35_checkpoint), compared at int8 / q8_0 and
   q4 / q4_0 (docs/runtime.md, "Qwen3.5-35B-A3B shape"); `--checkpoint-root`, `--drop-checkpoint`
   and `--q4-from q8_0` keep its disk footprint to the converted files;
2. converts it with `colibri_kit.model.convert` for the host target, once per dtype;
3. builds dist/host/bin/colibri (the kit's host build) and runs `colibri bench --json`;
4. runs transformers on the same checkpoint, prompt and thread count (f32, KV cache, greedy);
5. measures the memory read bandwidth of this machine with the same thread count (a small C
   program streaming a 1 GiB buffer) and prints the decode roofline: bytes of weights one decode
   token touches / bandwidth, and the share of it the runtime reaches.

With `--llama-cpp DIR` (DIR = a llama.cpp source tree built by scripts/build-llama-cpp.sh) it
also converts the same checkpoint to GGUF with DIR/convert_hf_to_gguf.py (f32, f16, q8_0; q4_0 by
DIR/build/bin/llama-quantize when the colibri converter offers a 4-bit dtype), runs
`llama-bench` on each in the same interleaved repeats, and prints the ratio table: colibri /
llama.cpp decode and prefill tok/s per weight type and prompt length (`--prompt-lens`, e.g.
64,512), against the goals of the speed issues, and each figure's share of the decode roofline.

Speed figures are printed, not asserted (they vary +-15-30% on a shared machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


@dataclass(frozen=True)
class Shape:
    """One benchmark geometry: the transformers class that builds it and its config."""
    name: str
    model_class: str  # transformers class name
    config_class: str
    config: dict
    layers: int  # default --layers
    dtype: str  # torch dtype the checkpoint is saved in
    # "" = built and saved by transformers; "mxfp4" = written as the family releases it (gpt-oss:
    # mxfp4 expert blocks, bf16 elsewhere; see gptoss_checkpoint)
    released: str = ""
    # the shape's own colibri -> llama.cpp pairs (label, GGUF type, decode goal, prefill goal);
    # None: pairs() by weight type
    llama_pairs: tuple[tuple[str, str, float, float], ...] | None = None
    # extra convert_hf_to_gguf.py arguments the shape's checkpoint needs
    llama_convert_args: tuple[str, ...] = ()


SHAPES = {
    "mixtral": Shape("mixtral", "MixtralForCausalLM", "MixtralConfig", dict(
        hidden_size=1024, num_hidden_layers=8, num_local_experts=8, num_experts_per_tok=2,
        intermediate_size=2816, num_attention_heads=16, num_key_value_heads=4, vocab_size=32000,
        max_position_embeddings=4096, rope_theta=10000.0, rms_norm_eps=1e-5,
        tie_word_embeddings=False), layers=8, dtype="float32"),
    # Qwen/Qwen3-30B-A3B's config.json as published (model card: 48 layers, 32 Q / 4 KV heads,
    # 128 experts, 8 activated; the same values in the public configs quoted by vLLM's and
    # others' tests): every field that shapes the compute, only the layer count is ours.
    "qwen3-30b-a3b": Shape("qwen3-30b-a3b", "Qwen3MoeForCausalLM", "Qwen3MoeConfig", dict(
        hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_hidden_layers=48,
        num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
        num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
        vocab_size=151936, max_position_embeddings=40960, rope_theta=1000000.0,
        rms_norm_eps=1e-6, attention_bias=False, tie_word_embeddings=False,
        bos_token_id=151643, eos_token_id=151645), layers=4, dtype="bfloat16"),
    # openai/gpt-oss-20b's config.json as released (hidden 2880, 64 Q / 8 KV heads of 64, 32
    # experts top-4 of width 2880, sliding window 128 on alternate layers, attention sinks, q/k/v/o
    # biases, YaRN x32 over 4096, clamped SwiGLU, o200k_harmony vocabulary 201,088; the same values
    # as tests/test_gptoss.py's GPT_OSS_20B): only the layer count is ours (24 released; each
    # layer is ~0.45 GB of mxfp4 experts, the embedding and LM head 2.3 GB in bf16).
    "gpt-oss-20b": Shape("gpt-oss-20b", "GptOssForCausalLM", "GptOssConfig", dict(
        architectures=["GptOssForCausalLM"], model_type="gpt_oss", attention_bias=True, head_dim=64,
        hidden_act="silu", hidden_size=2880, intermediate_size=2880, max_position_embeddings=131072,
        num_attention_heads=64, num_key_value_heads=8, num_local_experts=32, num_experts_per_tok=4,
        experts_per_token=4, num_hidden_layers=24, eos_token_id=200002, pad_token_id=199999,
        rms_norm_eps=1e-05, rope_theta=150000, sliding_window=128, swiglu_limit=7.0,
        rope_scaling={"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                      "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        tie_word_embeddings=False, vocab_size=201088), layers=4, dtype="bfloat16", released="mxfp4",
        # colibri int8 (experts kept mxfp4) against llama.cpp's MXFP4_MOE assignment (experts
        # MXFP4 as released, every other matrix q8_0): decode >= 1.2x, prefill >= 1.0x (issue 23)
        llama_pairs=(("int8 int8-act", "mxfp4_moe", 1.2, 1.0), ("int8", "mxfp4_moe", 1.2, 1.0))),
    # Qwen/Qwen3.5-35B-A3B's text_config as released (the defaults of transformers 5.24's
    # Qwen3_5MoeTextConfig, documented as that checkpoint's, and its config.json's rope_parameters
    # and token ids): hidden 2048, 40 layers of 3 Gated DeltaNet (linear_attention: 16 key / 32
    # value heads of 128, conv kernel 4) then 1 gated full attention (16 Q / 2 KV heads of 256,
    # partial RoPE 0.25 = 64 lanes, theta 1e7), 256 experts top-8 of width 512 plus the
    # sigmoid-gated shared expert of 512, vocabulary 248,320 (the Qwen3.5 tokenizer, 248,077
    # tokens: tests/real_tokenizers.py "qwen3_5"). Only the layer count is ours: 4 = one full
    # 3:1 pattern (~0.84 G parameters a layer, 1.0 G for the embedding and the LM head).
    "qwen3.5-35b-a3b": Shape("qwen3.5-35b-a3b", "Qwen3_5MoeForConditionalGeneration", "Qwen3_5MoeConfig", dict(
        model_type="qwen3_5_moe_text", attention_bias=False, attention_dropout=0.0, attn_output_gate=True,
        bos_token_id=248044, eos_token_id=248044, full_attention_interval=4, head_dim=256,
        hidden_act="silu", hidden_size=2048, initializer_range=0.02, linear_conv_kernel_dim=4,
        linear_key_head_dim=128, linear_num_key_heads=16, linear_num_value_heads=32,
        linear_value_head_dim=128, max_position_embeddings=262144, moe_intermediate_size=512,
        mtp_num_hidden_layers=1, num_attention_heads=16, num_experts=256, num_experts_per_tok=8,
        num_hidden_layers=40, num_key_value_heads=2, rms_norm_eps=1e-06,
        rope_parameters={"mrope_interleaved": True, "mrope_section": [11, 11, 10], "rope_type": "default",
                         "rope_theta": 10000000, "partial_rotary_factor": 0.25},
        router_aux_loss_coef=0.001, shared_expert_intermediate_size=512, tie_word_embeddings=False,
        vocab_size=248320), layers=4, dtype="bfloat16", released="qwen3_5",
        # issue 24's goals: decode >= 1.2x, prefill >= 1.0x at 8 and 4 bits
        llama_pairs=(("int8 int8-act", "q8_0", 1.2, 1.0), ("int8", "q8_0", 1.2, 1.0),
                     ("q4 int8-act", "q4_0", 1.2, 1.0), ("q4", "q4_0", 1.2, 1.0)),
        # no mtp.* tensors are written (neither engine decodes with the MTP head)
        llama_convert_args=("--no-mtp",)),
}

BANDWIDTH_C = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>
#define BYTES (1u << 30)
static uint32_t *buf; static int nt; static uint32_t sums[64];
/* integer sums vectorise at -O3 without -ffast-math: the loop is bound by memory, not by adds */
static void *rd(void *a) {
    long t = (long)a; size_t n = BYTES / 4 / nt, lo = n * t; uint32_t s = 0;
    for (size_t i = lo; i < lo + n; i++) s += buf[i];
    sums[t] = s; return NULL;
}
static double now(void) { struct timespec ts; clock_gettime(CLOCK_MONOTONIC, &ts); return ts.tv_sec + ts.tv_nsec * 1e-9; }
int main(int argc, char **argv) {
    nt = atoi(argv[1]);
    if (argc > 2 && !strcmp(argv[2], "thp")) { /* anonymous memory in 2 MiB pages */
        buf = aligned_alloc(2u << 20, BYTES); madvise(buf, BYTES, MADV_HUGEPAGE); memset(buf, 1, BYTES);
    } else if (argc > 2) { /* a file's page-cache pages, mapped the way the runtime maps a model */
        int fd = open(argv[2], O_RDONLY);
        buf = mmap(NULL, BYTES, PROT_READ, MAP_PRIVATE, fd, 0);
        if (fd < 0 || buf == MAP_FAILED) return 2;
        rd((void *)0); /* page it in */
    } else {
        buf = aligned_alloc(4096, BYTES); memset(buf, 1, BYTES);
    }
    double best = 0;
    for (int rep = 0; rep < 5; rep++) {
        pthread_t th[64]; double a = now();
        for (long t = 0; t < nt; t++) pthread_create(&th[t], NULL, rd, (void *)t);
        for (int t = 0; t < nt; t++) pthread_join(th[t], NULL);
        double gbs = BYTES / (now() - a) / 1e9; if (gbs > best) best = gbs;
    }
    printf("%.3f\n", best); return sums[0] == 12345u;
}
"""


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def geometry(shape: Shape, layers: int) -> dict:
    geo = {**shape.config, "num_hidden_layers": layers}
    if "sliding_window" in geo and shape.config.get("model_type") == "gpt_oss":  # the released pattern
        geo["layer_types"] = ["sliding_attention" if i % 2 == 0 else "full_attention" for i in range(layers)]
    if "full_attention_interval" in geo:  # Qwen3.5: every 4th layer full attention, as released
        n = geo["full_attention_interval"]
        geo["layer_types"] = ["full_attention" if (i + 1) % n == 0 else "linear_attention" for i in range(layers)]
    return geo


def hf_checkpoint(work: Path, shape: Shape, layers: int) -> Path:
    out = work / (f"hf-{shape.name}" if shape.name == "mixtral" else f"hf-{shape.name}-{layers}l")
    if (out / ".complete").exists():
        return out
    if shape.released == "mxfp4":
        return gptoss_checkpoint(out, geometry(shape, layers))
    if shape.released == "qwen3_5":
        return qwen35_checkpoint(out, geometry(shape, layers))
    import torch
    import transformers

    geo = geometry(shape, layers)
    log(f"building random {shape.model_class} {geo} ...")
    torch.manual_seed(0)
    torch.set_default_dtype(getattr(torch, shape.dtype))  # bf16: half the memory and disk
    try:
        config = getattr(transformers, shape.config_class)(**geo)
        model = getattr(transformers, shape.model_class)(config).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    with torch.no_grad():  # unit-scale activations, spread router logits
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
            elif "embed_tokens" in name:
                p.copy_(torch.randn_like(p))
            else:
                router = ".gate." in name or name.endswith("mlp.gate.weight")
                p.copy_(torch.randn_like(p) / p.shape[-1] ** 0.5 * (3.0 if router else 1.0))
    model.save_pretrained(out)
    if shape.name != "mixtral":
        qwen_tokenizer(out)
    (out / ".complete").write_text("ok\n")
    return out


def write_safetensors_streamed(path: Path, tensors: list[tuple[str, str, tuple[int, ...]]], fill) -> None:
    """One safetensors file written tensor by tensor (the header first, from the names, dtypes
    and shapes), each tensor's bytes from fill(rng, name, dtype, shape) in pieces: memory stays
    at one piece, whatever the checkpoint's size. One seeded generator in file order, so the
    same call writes the same bits."""
    import numpy as np

    rng = np.random.default_rng(0)
    header: dict = {"__metadata__": {"format": "pt"}}
    pos = 0
    for name, dt, shp in tensors:
        n = int(np.prod(shp)) * {"U8": 1, "BF16": 2, "F32": 4}[dt]
        header[name] = {"dtype": dt, "shape": list(shp), "data_offsets": [pos, pos + n]}
        pos += n
    hjson = json.dumps(header).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as fh:
        fh.write(len(hjson).to_bytes(8, "little") + hjson)
        for name, dt, shp in tensors:
            written = 0
            for piece in fill(rng, name, dt, shp):
                fh.write(piece)
                written += len(piece)
            if written != header[name]["data_offsets"][1] - header[name]["data_offsets"][0]:
                raise AssertionError(f"{name}: {written} bytes written for {dt} {shp}")


def bf16_normal_rows(rng, shp: tuple[int, ...], scale: float):
    """N(0, scale^2) values of a matrix (or a stack of them) as bf16 bytes, in pieces of 64 Mi
    values: bounded memory for the 248k-row embeddings and the [256, 1024, 2048] expert stacks."""
    import numpy as np

    from colibri_kit.model.format import f32_to_bf16_bits

    rows, cols = int(np.prod(shp[:-1])), shp[-1]
    step = max(1, (64 << 20) // cols)
    for r in range(0, rows, step):
        a = rng.standard_normal((min(step, rows - r), cols), dtype=np.float32) * np.float32(scale)
        yield f32_to_bf16_bits(a).tobytes()


def gptoss_tensors(geo: dict) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, safetensors dtype, shape) of openai/gpt-oss-20b's tensors, in its
    model.safetensors.index.json names: experts as mxfp4 blocks (U8 [E, rows, cols/32, 16], two
    E2M1 codes a byte) and E8M0 scales (U8 [E, rows, cols/32]), every other tensor bf16."""
    d, f, e_n, v = geo["hidden_size"], geo["intermediate_size"], geo["num_local_experts"], geo["vocab_size"]
    hq, hkv = geo["num_attention_heads"] * geo["head_dim"], geo["num_key_value_heads"] * geo["head_dim"]
    out: list[tuple[str, str, tuple[int, ...]]] = [("model.embed_tokens.weight", "BF16", (v, d))]
    for i in range(geo["num_hidden_layers"]):
        pre, att, ex = f"model.layers.{i}", f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp.experts"
        out += [(f"{pre}.input_layernorm.weight", "BF16", (d,)),
                (f"{pre}.post_attention_layernorm.weight", "BF16", (d,)),
                (f"{att}.q_proj.weight", "BF16", (hq, d)), (f"{att}.q_proj.bias", "BF16", (hq,)),
                (f"{att}.k_proj.weight", "BF16", (hkv, d)), (f"{att}.k_proj.bias", "BF16", (hkv,)),
                (f"{att}.v_proj.weight", "BF16", (hkv, d)), (f"{att}.v_proj.bias", "BF16", (hkv,)),
                (f"{att}.o_proj.weight", "BF16", (d, hq)), (f"{att}.o_proj.bias", "BF16", (d,)),
                (f"{att}.sinks", "BF16", (geo["num_attention_heads"],)),
                (f"{pre}.mlp.router.weight", "BF16", (e_n, d)), (f"{pre}.mlp.router.bias", "BF16", (e_n,)),
                (f"{ex}.gate_up_proj_blocks", "U8", (e_n, 2 * f, d // 32, 16)),
                (f"{ex}.gate_up_proj_scales", "U8", (e_n, 2 * f, d // 32)),
                (f"{ex}.gate_up_proj_bias", "BF16", (e_n, 2 * f)),
                (f"{ex}.down_proj_blocks", "U8", (e_n, d, f // 32, 16)),
                (f"{ex}.down_proj_scales", "U8", (e_n, d, f // 32)),
                (f"{ex}.down_proj_bias", "BF16", (e_n, d))]
    return out + [("model.norm.weight", "BF16", (d,)), ("lm_head.weight", "BF16", (v, d))]


def gptoss_checkpoint(out: Path, geo: dict) -> Path:
    """A random gpt-oss checkpoint written the way openai/gpt-oss-20b is released (config.json with
    quantization_config mxfp4, one safetensors file, the o200k_harmony tokenizer), streamed tensor
    by tensor: transformers would build the experts in bf16 first (1.6 GB a layer). Expert codes
    are uniform random bytes (every E2M1 value equally likely) with E8M0 exponents 2^-8 / 2^-7,
    so a weight's RMS is ~1/sqrt(2880) as the other shapes' 1/sqrt(fan-in); matrices are
    N(0, 1/fan-in) (the router x3: spread logits), norms 1 + N(0, 0.1), biases N(0, 0.1)."""
    import numpy as np

    from colibri_kit.model.format import f32_to_bf16_bits

    log(f"writing random {geo['architectures'][0]} {geo['num_hidden_layers']} layers (mxfp4 experts) ...")

    def fill(rng, name: str, dt: str, shp: tuple[int, ...]):  # -> the tensor's bytes, in pieces
        if name.endswith("_blocks"):
            yield rng.integers(0, 256, size=shp, dtype=np.uint8).tobytes()
        elif name.endswith("_scales"):
            yield rng.integers(119, 121, size=shp, dtype=np.uint8).tobytes()
        elif len(shp) == 1 or name.endswith("_bias"):
            base = 1.0 if name.endswith("norm.weight") else 0.0
            a = base + 0.1 * rng.standard_normal(shp, dtype=np.float32) if "sinks" not in name \
                else rng.standard_normal(shp, dtype=np.float32)
            yield f32_to_bf16_bits(a).tobytes()
        else:
            gain = 3.0 if name.endswith("router.weight") else 1.0
            yield from bf16_normal_rows(rng, shp, 1.0 if "embed_tokens" in name else gain / shp[-1] ** 0.5)

    out.mkdir(parents=True, exist_ok=True)
    write_safetensors_streamed(out / "model.safetensors", gptoss_tensors(geo), fill)
    cfg = {**geo, "quantization_config": {
        "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                   "model.embed_tokens", "lm_head"], "quant_method": "mxfp4"}}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    real_tokenizer(out, "o200k_harmony")
    (out / ".complete").write_text("ok\n")
    return out


def qwen35_tensors(geo: dict) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, safetensors dtype, shape) of Qwen/Qwen3.5-35B-A3B's text tensors in its released
    names (Qwen3_5MoeForConditionalGeneration: model.language_model.*, lm_head at the top, the
    experts fused as gate_up_proj [E, 2F, D] (gate rows first) and down_proj [E, D, F]), all bf16.
    The vision tower (model.visual.*) and the MTP head (mtp.*) are not written: colibri's
    converter skips them, llama.cpp's puts the tower in a separate mmproj file and is told
    --no-mtp, and neither engine runs them for text decode."""
    d, v, e_n = geo["hidden_size"], geo["vocab_size"], geo["num_experts"]
    f, fs = geo["moe_intermediate_size"], geo["shared_expert_intermediate_size"]
    hq, hkv, dh = geo["num_attention_heads"] * geo["head_dim"], geo["num_key_value_heads"] * geo["head_dim"], geo["head_dim"]
    kd = geo["linear_num_key_heads"] * geo["linear_key_head_dim"]
    hv = geo["linear_num_value_heads"]
    vd = hv * geo["linear_value_head_dim"]
    lm = "model.language_model"
    out: list[tuple[str, str, tuple[int, ...]]] = [(f"{lm}.embed_tokens.weight", "BF16", (v, d))]
    for i, kind in enumerate(geo["layer_types"]):
        pre = f"{lm}.layers.{i}"
        out.append((f"{pre}.input_layernorm.weight", "BF16", (d,)))
        if kind == "linear_attention":
            la = f"{pre}.linear_attn"
            out += [(f"{la}.in_proj_qkv.weight", "BF16", (2 * kd + vd, d)),
                    (f"{la}.in_proj_z.weight", "BF16", (vd, d)),
                    (f"{la}.in_proj_b.weight", "BF16", (hv, d)), (f"{la}.in_proj_a.weight", "BF16", (hv, d)),
                    (f"{la}.conv1d.weight", "BF16", (2 * kd + vd, 1, geo["linear_conv_kernel_dim"])),
                    (f"{la}.dt_bias", "BF16", (hv,)), (f"{la}.A_log", "BF16", (hv,)),
                    (f"{la}.norm.weight", "BF16", (geo["linear_value_head_dim"],)),
                    (f"{la}.out_proj.weight", "BF16", (d, vd))]
        else:
            att = f"{pre}.self_attn"
            out += [(f"{att}.q_proj.weight", "BF16", (2 * hq, d)),  # per head [query | gate]
                    (f"{att}.k_proj.weight", "BF16", (hkv, d)), (f"{att}.v_proj.weight", "BF16", (hkv, d)),
                    (f"{att}.o_proj.weight", "BF16", (d, hq)),
                    (f"{att}.q_norm.weight", "BF16", (dh,)), (f"{att}.k_norm.weight", "BF16", (dh,))]
        moe = f"{pre}.mlp"
        out += [(f"{pre}.post_attention_layernorm.weight", "BF16", (d,)),
                (f"{moe}.gate.weight", "BF16", (e_n, d)),
                (f"{moe}.experts.gate_up_proj", "BF16", (e_n, 2 * f, d)),
                (f"{moe}.experts.down_proj", "BF16", (e_n, d, f)),
                (f"{moe}.shared_expert.gate_proj.weight", "BF16", (fs, d)),
                (f"{moe}.shared_expert.up_proj.weight", "BF16", (fs, d)),
                (f"{moe}.shared_expert.down_proj.weight", "BF16", (d, fs)),
                (f"{moe}.shared_expert_gate.weight", "BF16", (1, d))]
    return out + [(f"{lm}.norm.weight", "BF16", (d,)), ("lm_head.weight", "BF16", (v, d))]


def qwen35_checkpoint(out: Path, geo: dict) -> Path:
    """A random Qwen3.5-35B-A3B-shaped checkpoint written as Qwen releases it (config.json of
    Qwen3_5MoeForConditionalGeneration with the text_config, one safetensors file, the Qwen3.5
    tokenizer), streamed tensor by tensor: ~1.7 GB of bf16 a layer, which transformers would
    build in memory first. Matrices N(0, 1/fan-in) (the router x3: spread logits), the embedding
    N(0, 1); the zero-centred RMSNorms (layer norms, final norm, q/k norm: x * (1 + w)) N(0, 0.1),
    the DeltaNet's gated norm 1 + N(0, 0.1); A_log = log U(1, 16) and dt_bias 1 + N(0, 0.1)
    (transformers' Qwen3_5Moe init draws A from U(0, 16) and dt_bias ones)."""
    import numpy as np

    from colibri_kit.model.format import f32_to_bf16_bits

    layers = geo["num_hidden_layers"]
    log(f"writing random Qwen3_5MoeForConditionalGeneration {layers} layers {geo['layer_types']} ...")

    def fill(rng, name: str, dt: str, shp: tuple[int, ...]):
        if name.endswith("A_log"):
            a = np.log(rng.uniform(1.0, 16.0, size=shp)).astype(np.float32)
        elif name.endswith("linear_attn.norm.weight") or name.endswith("dt_bias"):
            a = 1.0 + 0.1 * rng.standard_normal(shp, dtype=np.float32)
        elif len(shp) == 1:  # zero-centred norms
            a = 0.1 * rng.standard_normal(shp, dtype=np.float32)
        else:
            if "embed_tokens" in name:
                scale = 1.0
            else:  # fan-in = the last axis (conv1d [C, 1, W]: the kernel width)
                scale = (3.0 if name.endswith("mlp.gate.weight") else 1.0) / shp[-1] ** 0.5
            yield from bf16_normal_rows(rng, shp, scale)
            return
        yield f32_to_bf16_bits(a).tobytes()

    out.mkdir(parents=True, exist_ok=True)
    write_safetensors_streamed(out / "model.safetensors", qwen35_tensors(geo), fill)
    text = dict(geo)
    # transformers 5.24's Qwen3_5MoeVisionConfig defaults (the released vision tower), its output
    # width the text model's hidden size; no vision tensors are written (see qwen35_tensors)
    vision = {"model_type": "qwen3_5_moe_vision", "depth": 27, "hidden_size": 1152, "hidden_act": "gelu_pytorch_tanh",
              "intermediate_size": 4304, "num_heads": 16, "in_channels": 3, "patch_size": 16,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "out_hidden_size": geo["hidden_size"],
              "num_position_embeddings": 2304, "initializer_range": 0.02}
    cfg = {"architectures": ["Qwen3_5MoeForConditionalGeneration"], "model_type": "qwen3_5_moe",
           "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
           "vision_end_token_id": 248054, "tie_word_embeddings": False, "text_config": text,
           "vision_config": vision, "transformers_version": "5.24.0"}
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    real_tokenizer(out, "qwen3_5")
    (out / ".complete").write_text("ok\n")
    return out


def real_tokenizer(hf: Path, family: str) -> None:
    """A family's real tokenizer.json (tests/real_tokenizers.py: "o200k_harmony" = gpt-oss's
    o200k_base ranks from the `bpe-openai` package with the harmony special tokens up to id
    201,087; "qwen3_5" = Qwen3.5's 248,044 ranks from `qwen-tokenizer` with its 33 added tokens),
    made by the test suite's real-tokenizer helper. llama.cpp's converter recognises them by their
    hash ("gpt-4o", "qwen35") as it does the released ones."""
    import shutil

    sys.path.insert(0, str(ROOT / "tests"))
    import real_tokenizers

    (hf / "tok-src").mkdir(exist_ok=True)
    src = real_tokenizers.tiktoken_dir(family, hf / "tok-src")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(src / name, hf / name)
    shutil.rmtree(hf / "tok-src")


def hf_tokenizer(hf: Path, vocab: int) -> None:
    """A Llama-style byte-fallback BPE tokenizer.json of exactly `vocab` entries (made with the
    `tokenizers` library, nothing downloaded), so llama.cpp's converter accepts the checkpoint.
    The benchmark feeds token ids, so the pieces only need to be distinct."""
    if (hf / "tokenizer.json").exists():
        return
    from tokenizers import Tokenizer, decoders, models, normalizers

    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    pieces += [f"\u2581w{i}" for i in range(vocab - len(pieces))]
    tok = Tokenizer(models.BPE(vocab={p: i for i, p in enumerate(pieces)}, merges=[],
                               unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"),
                                           normalizers.Replace(" ", "\u2581")])
    tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "LlamaTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
         "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False}))


def qwen_tokenizer(hf: Path) -> None:
    """Qwen's real byte-level BPE (151,643 ranks, shipped in the `dashscope` package as
    qwen.tiktoken, dashscope 2.0.2) with Qwen2's pre-tokenizer regex, turned into a tokenizer.json by
    transformers' TikTokenConverter. llama.cpp's converter recognises it as "qwen2" by its hash
    of a test text's token ids, as it does the published Qwen tokenizers; the embedding has
    151,936 rows, the tail padding as in the published model."""
    if (hf / "tokenizer.json").exists():
        return
    import importlib.util

    from transformers.convert_slow_tokenizer import TikTokenConverter

    spec = importlib.util.find_spec("dashscope")  # not imported: only its data file is needed
    if spec is None or spec.origin is None:
        raise SystemExit("the qwen3 shapes need Qwen's tokenizer ranks: pip install --no-deps dashscope==2.0.2")
    ranks = Path(spec.origin).parent / "resources" / "qwen.tiktoken"
    pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok = TikTokenConverter(vocab_file=str(ranks), pattern=pattern,
                            extra_special_tokens=specials).converted()
    tok.save(str(hf / "tokenizer.json"))
    (hf / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "Qwen2TokenizerFast", "eos_token": "<|im_end|>",
         "pad_token": "<|endoftext|>", "bos_token": None}))


def llama_cpp_tools(root: Path) -> tuple[Path, Path, Path]:
    """convert_hf_to_gguf.py, llama-bench and llama-quantize of a build made by
    scripts/build-llama-cpp.sh (DIR is its llama.cpp source tree)."""
    conv, bench, quant = (root / "convert_hf_to_gguf.py", root / "build" / "bin" / "llama-bench",
                          root / "build" / "bin" / "llama-quantize")
    for path in (conv, bench, quant):
        if not path.exists():
            raise SystemExit(f"--llama-cpp {root}: {path} is missing; build it with "
                             f"scripts/build-llama-cpp.sh (see its header)")
    return conv, bench, quant


def gguf_model(root: Path, hf: Path, work: Path, gtype: str, vocab: int,
               convert_args: tuple[str, ...] = (), q4_from: str = "f16") -> Path:
    """The checkpoint as GGUF: f32/f16/q8_0 straight from the converter, q4_0 quantised by
    llama-quantize --pure (every matrix q4_0, as colibri's q4 file; without --pure the LM head and
    the embedding would be q6_K) from the f16 GGUF, or with q4_from="q8_0" requantised from the
    q8_0 GGUF (--allow-requantize: the same q4_0 tensors and speed, the weights rounded twice;
    half the disk of an f16 intermediate)."""
    conv, quant = root / "convert_hf_to_gguf.py", root / "build" / "bin" / "llama-quantize"
    out = work / f"{hf.name.removeprefix('hf-')}-{gtype}.gguf"
    if out.exists():
        return out
    if not (hf / "tokenizer.json").exists():
        hf_tokenizer(hf, vocab)
    log(f"converting to {out.name} ...")
    tmp = out.with_suffix(".part")
    if gtype in ("f32", "f16", "q8_0", "mxfp4_moe"):
        # mxfp4_moe: a checkpoint released with mxfp4 experts (gpt-oss) converted with --outtype
        # q8_0: the converter repacks the released blocks as GGML MXFP4 (bit for bit, its
        # GptOssModel.repack_mxfp4) and writes every other matrix q8_0 -- the types llama-quantize's
        # MXFP4_MOE assigns (MoE tensors MXFP4, the rest q8_0, the output q8_0), in one pass
        env = {**os.environ, "PYTHONPATH": str(root / "gguf-py")}
        outtype = "q8_0" if gtype == "mxfp4_moe" else gtype
        subprocess.run([sys.executable, str(conv), str(hf), "--outtype", outtype, "--outfile", str(tmp),
                        *convert_args], check=True, env=env, stdout=subprocess.DEVNULL)
    else:
        source = gguf_model(root, hf, work, q4_from, vocab, convert_args)
        requant = ["--allow-requantize"] if q4_from != "f16" else []
        subprocess.run([str(quant), *requant, "--pure", str(source), str(tmp), gtype], check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    tmp.rename(out)
    return out


def llama_bench(binary: Path, model: Path, threads: int, prompts: list[int], gen: int, runs: int,
                extra: list[str]) -> dict:
    """llama-bench's prompt (pp) and generation (tg) tests as tok/s, one pp test per prompt
    length. Its pp computes the logits of the last prompt token only, as colibri bench does."""
    proc = subprocess.run([str(binary), "-m", str(model), "-t", str(threads), "-p",
                           ",".join(map(str, prompts)), "-n", str(gen), "-r", str(runs), "-o",
                           "json", *extra], capture_output=True, text=True, check=True)
    rows = json.loads(proc.stdout)
    tg = next(r for r in rows if r["n_gen"] and not r["n_prompt"])
    out = {"decode_tok_s": tg["avg_ts"], "build": f"{rows[0].get('build_commit', '?')}",
           "cpu_info": rows[0].get("cpu_info", "")}
    for r in rows:
        if r["n_prompt"] and not r["n_gen"]:
            out[f"prefill_tok_s_{r['n_prompt']}"] = r["avg_ts"]
    return out


def four_bit_dtypes() -> list[str]:
    """The 4-bit weight types the colibri converter offers (none before the 4-bit format)."""
    from colibri_kit.model.format import DType

    return [d.name.lower() for d in DType if "4" in d.name]


# colibri dtype (and flags) -> the llama.cpp weight type it is compared with, and the goal ratios
# (decode, prefill) of the speed issue.
def pairs(dtypes: list[str]) -> list[tuple[str, str, float, float]]:
    out = []
    for d in dtypes:
        if d in ("f32", "f16"):
            out.append((d, d, 1.2, 1.0))
        elif d == "int8":
            out.append(("int8 int8-act", "q8_0", 1.5, 1.0))
            out.append(("int8", "q8_0", 1.5, 1.0))
        elif "4" in d:
            out.append((d + " int8-act", "q4_0", 1.2, 1.0))  # llama.cpp's q4_0 quantises activations too
            out.append((d, "q4_0", 1.2, 1.0))
    return out


def converted(hf: Path, work: Path, dtype: str) -> Path:
    from colibri_kit.model.convert import convert
    from colibri_kit.profiles import load_profile

    out = work / f"{hf.name.removeprefix('hf-')}-{dtype}.colibri"
    if not out.exists():
        log(f"converting to {out.name} ...")
        convert(hf, out, dtype=dtype, profile=load_profile("host"), max_seq_len=1024, progress=False)
    return out


def weight_bytes_per_decode_token(model: Path) -> int:
    """Bytes of weights (and int8 scales) one decode token reads: attention, router, top_k
    routed experts, shared expert, final norm, LM head, one embedding row."""
    from colibri_kit.model.format import NONE, Kind, read_model

    m = read_model(model)
    h = m.header
    total = 0
    for rec in m:
        size = rec.nbytes + rec.scale_nbytes
        if rec.kind in (Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2, Kind.EXPERT_B1, Kind.EXPERT_B3,
                        Kind.EXPERT_B2):
            total += size * h.top_k / h.num_experts  # top_k of E experts per layer
        elif rec.kind == Kind.TOK_EMBED:
            total += size // h.vocab_size  # one row
            if h.flags & 16:  # tied: the LM head reads the whole matrix
                total += size
        else:
            total += size
    del NONE
    return int(total)


def bandwidth_gbs(threads: int, source: str | None = None) -> float:
    """Read bandwidth over 1 GiB of anonymous memory (4 KiB pages; "thp": 2 MiB pages), or of a
    file's page cache through mmap (source = its path)."""
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "bw.c", Path(d) / "bw"
        src.write_text(BANDWIDTH_C)
        subprocess.run(["cc", "-O3", "-o", str(exe), str(src), "-lpthread"], check=True)
        argv = [str(exe), str(threads)] + ([source] if source else [])
        return float(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)


def drop_page_cache(path: Path) -> None:
    """Evict one file's clean page-cache pages (POSIX_FADV_DONTNEED; no other file is touched), so
    the runtime's mmap reads it back as on a freshly booted device: reproducible runs. A file just
    written by the converter sits in the page cache in the writer's small folios; read back
    through a mapping, a recent kernel (ext4 large folios, Linux >= 6.x) caches it in up to 2 MiB
    folios mapped with 2 MiB entries. The bandwidth probe over the mapping sees the difference;
    the runtime's decode, measured, does not (docs/runtime.md)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def file_pmd_mapped_kb(path: Path) -> int:
    """How much of `path` a fresh mapping gets in 2 MiB page-table entries (smaps FilePmdMapped),
    after touching every page once."""
    import mmap

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        for off in range(0, len(m), 4096):
            m[off]
        kb, inside, name = 0, False, str(path.resolve())
        for line in Path("/proc/self/smaps").read_text().splitlines():
            head = line.split()
            if head and "-" in head[0] and not head[0].endswith(":"):
                inside = head[-1] == name  # a mapping's first line ends with its file
            elif inside and line.startswith("FilePmdMapped:"):
                kb += int(head[1])
        return kb


def colibri_bench(binary: Path, model: Path, threads: int, prompts: list[int], gen: int,
                  runs: int, *flags: str) -> dict:
    """`colibri bench --json` once per prompt length: decode after the first prompt, prefill
    tok/s of every prompt (the last token's logits, as llama-bench's pp)."""
    out: dict = {}
    for k, prompt in enumerate(prompts):
        proc = subprocess.run([str(binary), "--backend", "cpu", "--threads", str(threads), *flags,
                               "bench", str(model), "--prompt-len", str(prompt), "--gen",
                               str(gen if k == 0 else 0), "--runs", str(runs), "--json"],
                              capture_output=True, text=True, check=True)
        doc = json.loads(proc.stdout)
        if k == 0:
            out.update(doc)
        out[f"prefill_tok_s_{prompt}"] = prompt * 1e3 / doc["prefill_ms_p50"]
    return out


class Transformers:
    """The same checkpoint in transformers (f32, KV cache, greedy), loaded once."""

    def __init__(self, hf: Path, threads: int, vocab: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(threads)
        t0 = time.perf_counter()
        self.model = AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32).eval()
        self.load_ms = (time.perf_counter() - t0) * 1e3
        self.vocab = vocab

    def bench(self, prompt: int, gen: int, runs: int) -> dict:
        import torch

        ids = torch.tensor([[(i * 7919 + 13) % self.vocab for i in range(prompt)]])
        prefill, decode = [], []
        with torch.no_grad():
            for r in range(runs + 1):  # run 0 warms up, like colibri bench
                a = time.perf_counter()
                out = self.model(ids, use_cache=True)
                b = time.perf_counter()
                past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                for _ in range(gen):
                    out = self.model(nxt, past_key_values=past, use_cache=True)
                    past, nxt = out.past_key_values, out.logits[:, -1:].argmax(-1)
                c = time.perf_counter()
                if r:
                    prefill.append((b - a) * 1e3)
                    decode.append(c - b)
        prefill.sort()
        return {"load_ms": self.load_ms, "prefill_ms_p50": prefill[len(prefill) // 2],
                "decode_tok_s": gen * runs / sum(decode)}


def best(samples: list[dict]) -> dict:
    """The least disturbed of the interleaved repeats: fastest decode, its own other figures."""
    return max(samples, key=lambda r: r["decode_tok_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="mixtral")
    ap.add_argument("--layers", type=int, help="decoder layers (default: the shape's bench default)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--dtypes", default="f32,f16,int8")
    ap.add_argument("--prompt-lens", default="64",
                    help="comma-separated prompt lengths; decode follows the first")
    ap.add_argument("--prompt-len", type=int, help="one prompt length (same as --prompt-lens N)")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colibri-bench")
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repeats; the best is kept")
    ap.add_argument("--skip-transformers", action="store_true")
    ap.add_argument("--cold-cache", action="store_true",
                    help="evict the .colibri files from the page cache first (see drop_page_cache)")
    ap.add_argument("--llama-cpp", type=Path, metavar="DIR",
                    help="llama.cpp tree built by scripts/build-llama-cpp.sh: also run llama-bench "
                         "on the same checkpoint as GGUF and print the ratio table")
    ap.add_argument("--checkpoint-root", type=Path, metavar="DIR",
                    help="where the random HF checkpoint is written (default: --work), e.g. a tmpfs "
                         "when the disk cannot hold it beside the converted files")
    ap.add_argument("--drop-checkpoint", action="store_true",
                    help="delete the HF checkpoint (and a GGUF made only as llama-quantize's source) "
                         "once every model is converted; a later run writes the same bits again")
    ap.add_argument("--q4-from", choices=["f16", "q8_0"], default="f16",
                    help="llama-quantize's source for q4_0 (q8_0: --allow-requantize, half the disk)")
    ap.add_argument("--llama-bench-args", default="",
                    help="extra llama-bench arguments (e.g. '--repack 0' where q8_0 hits SIGILL on AMX hosts)")
    args = ap.parse_args()
    shape = SHAPES[args.shape]
    if shape.llama_pairs:  # the pairs of the weight types asked for
        wanted = args.dtypes.split(",")
        shape = dataclasses.replace(shape, llama_pairs=tuple(
            pr for pr in shape.llama_pairs if pr[0].split()[0] in wanted))
    layers = args.layers or shape.layers
    geo = geometry(shape, layers)
    vocab = geo["vocab_size"]
    prompts = [args.prompt_len] if args.prompt_len else [int(p) for p in args.prompt_lens.split(",")]
    if args.llama_cpp:
        args.llama_cpp = args.llama_cpp.resolve()
        llama_cpp_tools(args.llama_cpp)  # fail before the long work
        extra_dtypes = [] if shape.llama_pairs else [d for d in four_bit_dtypes() if d not in args.dtypes.split(",")]
        if extra_dtypes:
            args.dtypes = ",".join(args.dtypes.split(",") + extra_dtypes)
    args.work.mkdir(parents=True, exist_ok=True)

    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    built = build(load_profile("host"), where="host", progress=lambda m: None)
    binary = built.dist_dir / "bin" / "colibri"
    hf = hf_checkpoint(args.checkpoint_root or args.work, shape, layers)
    variants = [(d, ()) for d in args.dtypes.split(",")]
    for d in args.dtypes.split(","):  # int8 activations + integer dot products
        if d == "int8" or "4" in d:
            variants.append((d, ("--int8-act",)))
    models = {d: converted(hf, args.work, d) for d in args.dtypes.split(",")}
    if shape.released and not args.skip_transformers:  # it would dequantise every expert to f32
        log(f"--shape {shape.name}: transformers skipped (its f32 model would not fit this machine)")
        args.skip_transformers = True
    hf_model = None if args.skip_transformers else Transformers(hf, args.threads, vocab)
    ggufs: dict[str, Path] = {}
    if args.llama_cpp:
        for _, gtype, _, _ in shape.llama_pairs or pairs(args.dtypes.split(",")):
            ggufs[gtype] = gguf_model(args.llama_cpp, hf, args.work, gtype, vocab,
                                      shape.llama_convert_args, args.q4_from)
    if args.drop_checkpoint:
        import shutil

        log(f"deleting {hf} (--drop-checkpoint)")
        shutil.rmtree(hf)
        source = args.work / f"{hf.name.removeprefix('hf-')}-{args.q4_from}.gguf"
        if "q4_0" in ggufs and args.q4_from not in ggufs and source.exists():
            source.unlink()
    if args.cold_cache:
        for path in models.values():
            drop_page_cache(path)

    # Other work on a shared machine slows any engine at any moment: run every engine (and the
    # bandwidth probe) in turn, --repeat times, and keep each one's least disturbed repeat.
    samples: dict[str, list[dict]] = {}
    bws, thp_bws, file_bws, loads = [], [], [], []
    big = max(models.values(), key=lambda p: p.stat().st_size)
    for rep in range(args.repeat):
        log(f"repeat {rep + 1}/{args.repeat}")
        loads.append(os.getloadavg()[0])
        bws.append(bandwidth_gbs(args.threads))
        thp_bws.append(bandwidth_gbs(args.threads, "thp"))
        if big.stat().st_size >= 1 << 30:
            file_bws.append(bandwidth_gbs(args.threads, str(big)))
        for dtype, flags in variants:
            label = dtype + (" int8-act" if flags else "")
            samples.setdefault(label, []).append(
                colibri_bench(binary, models[dtype], args.threads, prompts, args.gen, args.runs,
                              *flags))
        if hf_model:
            samples.setdefault("transformers f32", []).append(
                hf_model.bench(prompts[0], args.gen, args.runs))
        for gtype, path in ggufs.items():
            samples.setdefault(f"llama.cpp {gtype}", []).append(
                llama_bench(args.llama_cpp / "build" / "bin" / "llama-bench", path, args.threads,
                            prompts, args.gen, args.runs, args.llama_bench_args.split()))
    # The roofline takes the best read bandwidth any of the three layouts reached: what the
    # memory can deliver to a streaming reader on this machine, whatever the page size.
    bw = max(bws + thp_bws + file_bws)
    print(f"machine: {os.cpu_count()} CPUs, {args.threads} threads, load average "
          f"{min(loads):.1f}..{max(loads):.1f} (other work on the machine skews every figure)")
    print(f"read bandwidth, best of {args.repeat}: anonymous 4 KiB pages {max(bws):.1f} GB/s, "
          f"anonymous 2 MiB pages {max(thp_bws):.1f} GB/s"
          + (f", mmapped {big.name} {max(file_bws):.1f} GB/s "
             f"({file_pmd_mapped_kb(big) >> 10} MiB of it in 2 MiB mappings)" if file_bws else "")
          + f"; roofline bandwidth {bw:.1f} GB/s")
    experts = geo.get("num_local_experts") or geo.get("num_experts")
    ffn = geo.get("moe_intermediate_size") or geo["intermediate_size"]
    print(f"model: random {shape.model_class} hidden {geo['hidden_size']}, {layers} layers, "
          f"{experts} experts top-{geo['num_experts_per_tok']}, expert FFN {ffn}, "
          f"{geo['num_attention_heads']}/{geo['num_key_value_heads']} heads, vocab {vocab}; "
          f"prompts {prompts}, generate {args.gen}, runs {args.runs}, best of {args.repeat}")
    print(f"{'engine':<22}{'load ms':>9}{'prefill ms':>12}{'decode tok/s':>14}"
          f"{'MB/token':>10}{'roofline tok/s':>16}{'of roofline':>13}")
    results: dict[str, dict] = {"bandwidth_gbs": {"best": bw, "anonymous": bws, "anonymous_thp": thp_bws,
                                                  "mmapped_file": file_bws},
                                "shape": shape.name, "layers": layers, "prompts": prompts}
    for dtype, flags in variants:
        label = dtype + (" int8-act" if flags else "")
        r = best(samples[label])
        per_tok = weight_bytes_per_decode_token(models[dtype])
        roof = bw * 1e9 / per_tok
        results[f"colibri {label}"] = {**r, "bytes_per_token": per_tok, "roofline_tok_s": roof,
                                       "all_decode_tok_s": [x["decode_tok_s"] for x in samples[label]]}
        print(f"{'colibri ' + label:<22}{r['load_ms']:>9.1f}{r['prefill_ms_p50']:>12.1f}"
              f"{r['decode_tok_s']:>14.2f}{per_tok / 1e6:>10.1f}{roof:>16.2f}"
              f"{100 * r['decode_tok_s'] / roof:>12.1f}%")
    if hf_model:
        t = best(samples["transformers f32"])
        results["transformers f32"] = {**t, "all_decode_tok_s": [x["decode_tok_s"] for x in samples["transformers f32"]]}
        per_tok = weight_bytes_per_decode_token(models.get("f32") or converted(hf, args.work, "f32"))
        print(f"{'transformers f32':<22}{t['load_ms']:>9.1f}{t['prefill_ms_p50']:>12.1f}"
              f"{t['decode_tok_s']:>14.2f}{per_tok / 1e6:>10.1f}{bw * 1e9 / per_tok:>16.2f}"
              f"{100 * t['decode_tok_s'] * per_tok / (bw * 1e9):>12.1f}%")
        c = results.get("colibri f32")
        if c:
            print(f"colibri f32 vs transformers f32: decode x{c['decode_tok_s'] / t['decode_tok_s']:.2f}, "
                  f"prefill x{t['prefill_ms_p50'] / c['prefill_ms_p50']:.2f}")
    if ggufs:
        ratio_table(samples, models, results, args, bw, prompts, shape)
    print(json.dumps(results))


def ratio_table(samples: dict[str, list[dict]], models: dict[str, Path], results: dict,
                args: argparse.Namespace, bw: float, prompts: list[int], shape: Shape) -> None:
    """colibri / llama.cpp per weight type: each engine's best decode and best prefill (per
    prompt length) over the interleaved repeats, the goal, and each figure's share of the
    roofline: decode tok/s over bandwidth / bytes per token (the colibri model's; q8_0 / q4_0
    blocks carry 6% / 12% more scale bytes), prefill tok/s over the same bound times the tokens
    per chunk a full weight pass serves (colibri reads the weights once per 64-token chunk)."""
    first = samples[next(k for k in samples if k.startswith("llama.cpp"))][0]
    print(f"llama.cpp {first['build']} ({first['cpu_info']}) vs colibri, {args.threads} threads, "
          f"decode {args.gen} after {prompts[0]}, best of {args.repeat} interleaved repeats")
    head = f"{'colibri':<16}{'llama.cpp':<10}{'decode tok/s c / l':>22}{'ratio':>7}{'goal':>6}"
    for p in prompts:
        head += f"{f'pp{p} tok/s c / l':>22}{'ratio':>7}"
    print(head + f"{'decode roofline c / l':>23}{'ft p99/p50':>12}")
    table = []
    mark = lambda ok: " " if ok else "*"  # noqa: E731
    for label, gtype, dgoal, pgoal in shape.llama_pairs or pairs(args.dtypes.split(",")):
        c, lc = samples[label], samples[f"llama.cpp {gtype}"]
        cd = max(x["decode_tok_s"] for x in c)
        ld = max(x["decode_tok_s"] for x in lc)
        roof = bw * 1e9 / weight_bytes_per_decode_token(models[label.split()[0]])
        ft = best(c)["first_token_ms_p99"] / best(c)["first_token_ms_p50"]  # goal <= 1.06
        row = {"colibri": label, "llama_cpp": gtype, "decode": [cd, ld], "decode_ratio": cd / ld,
               "decode_goal": dgoal, "prefill_goal": pgoal, "roofline_tok_s": roof,
               "decode_roofline_share": [cd / roof, ld / roof], "first_token_p99_over_p50": ft}
        line = f"{label:<16}{gtype:<10}{cd:>12.1f} / {ld:>7.1f}{cd / ld:>7.2f}{dgoal:>5.1f}{mark(cd / ld >= dgoal)}"
        for p in prompts:
            cp = max(x[f"prefill_tok_s_{p}"] for x in c)
            lp = max(x[f"prefill_tok_s_{p}"] for x in lc)
            row[f"prefill_{p}"] = [cp, lp]
            row[f"prefill_{p}_ratio"] = cp / lp
            line += f"{cp:>12.1f} / {lp:>7.1f}{cp / lp:>6.2f}{mark(cp / lp >= pgoal)}"
        table.append(row)
        print(line + f"{100 * cd / roof:>13.0f}% / {100 * ld / roof:>3.0f}%{ft:>11.3f}{mark(ft <= 1.06)}")
    print("* = goal not met in this run (prefill goal: 1.0x)")
    results["llama_cpp_ratios"] = table


if __name__ == "__main__":
    main()
