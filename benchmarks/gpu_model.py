"""Decode performance model of the CUDA backend: what one decoded token costs, before any GPU ran.

    python benchmarks/gpu_model.py                  # the four models below, every weight dtype
    python benchmarks/gpu_model.py --context 4096   # KV cache read at another context length
    python benchmarks/gpu_model.py --fraction 0.8   # another achievable share of peak bandwidth

For a model header it prints (docs/cuda.md, "Performance model"):
- the kernels and driver calls one decoded token issues, counted from the launch sequence of
  runtime/src/cuda/cuda_backend.c (cb_forward_chunk), today (one cuLaunchKernel each) and as one CUDA
  graph (the plan of issue 15);
- the bytes one token reads, by kind: embedding row, attention weights, norms, router, the top-k
  routed experts, the shared expert, LM head, and the f32 KV cache at the given context;
- the expected time per token on each device = max(bandwidth bound, launch bound):
    bandwidth bound = bytes / (datasheet bandwidth x achievable fraction)
    launch bound    = driver calls x per-call cost (no graph), or
                      graph launch + nodes x per-node cost (graph).
Every device and launch figure below names its public source. The byte counts use this file's own
per-dtype sizes, and tests/test_gpu_model.py checks them against what the .colibri writer lays
out. A model, not a measurement: the first GPU run (scripts/gpu-check.sh) is judged against it.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri_kit.model.convert import TargetModelLimits, build_header  # noqa: E402
from colibri_kit.model.families import read_config  # noqa: E402
from colibri_kit.model.format import (  # noqa: E402
    DType, FfnFlag, Flag, Mixer, MixerFlag, ModelHeader, data_nbytes, scale_bytes)

# ---------------------------------------------------------------------------------------------
# Sources. Datasheet peak DRAM bandwidth and memory size of each device.


@dataclass(frozen=True)
class Device:
    name: str
    bandwidth_gbs: float     # peak, GB/s (1e9 bytes)
    memory_gb: float         # what a model's weights must fit into (shared with the OS on Jetson)
    source: str


DEVICES: tuple[Device, ...] = (
    Device("Orin Nano 8GB", 68.0, 8, "NVIDIA Jetson Orin Nano Series data sheet: 128-bit LPDDR5, "
           "68 GB/s (102 GB/s in JetPack 6.1+'s 'Super' mode: Jetson Orin Nano Super Developer "
           "Kit data sheet)"),
    Device("Orin NX 16GB", 102.4, 16, "NVIDIA Jetson Orin NX Series Modules data sheet "
           "DS-10712-001: 128-bit LPDDR5, 102.4 GB/s"),
    Device("AGX Orin 64GB", 204.8, 64, "NVIDIA Jetson AGX Orin Series technical brief v1.2: "
           "256-bit LPDDR5, 204.8 GB/s"),
    Device("AGX Thor T5000", 273.0, 128, "NVIDIA Jetson T5000 module data sheet (as reproduced "
           "in RidgeRun's 'NVIDIA Jetson AGX Thor SoM overview'): 128 GB 256-bit LPDDR5X, "
           "273 GB/s"),
    Device("H200 SXM", 4800.0, 141, "NVIDIA H200 Tensor Core GPU data sheet: 141 GB HBM3e, "
           "4.8 TB/s"),
)

# Per-call host cost of cuLaunchKernel / cuMemcpy*Async without graphs. Meta's
# HolisticTraceAnalysis docs ("CUDA kernel launch statistics"): "Usually, the launch time on the
# CPU side is between 5-20 microseconds" (PyTorch traces); the backend calls the driver directly,
# so the low end. CUDA.jl's "Graphs" page measures 80 small kernels at 260 us, 3.25 us each,
# the same order. Jetson's Cortex-A78AE cores are slower than the x86 hosts of both: the first
# Jetson run measures it (gpu-check's decode tok/s on the small models is launch-bound).
LAUNCH_US = 5.0
# With one CUDA graph per token. CUDA.jl "Graphs": the 80 kernels as a graph take 70 us, "with
# the CPU being busy for just 3.5 us". 70/80 = 0.875 us per node includes those kernels' own run
# time, so it is an upper bound of the GPU-side cost of a node boundary.
GRAPH_LAUNCH_US = 3.5
GRAPH_NODE_US = 70.0 / 80.0
# Stated assumption, not a datasheet figure: the share of peak DRAM bandwidth a well-built
# streaming GEMV reaches. gpu-check measures the device's copy bandwidth; judge against that.
DEFAULT_FRACTION = 0.7
DEFAULT_CONTEXT = 1024
KV_BYTES = 4   # the CUDA backend's KV cache is f32 (an f16 cache, issue 15 item 3, halves it)

# ---------------------------------------------------------------------------------------------
# Models (their config.json fields the converter reads: colibri_kit.model.families).

BENCH_MIXTRAL: dict[str, Any] = {   # benchmarks/runtime.py GEOMETRY: the runtime benchmark's model
    "model_type": "mixtral", "hidden_size": 1024, "num_hidden_layers": 8,
    "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 2816,
    "num_attention_heads": 16, "num_key_value_heads": 4, "vocab_size": 32000,
    "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False}
GPUCHECK_LARGE: dict[str, Any] = {  # `colibri synth` defaults (runtime/tools/cmd_synth.c)
    **BENCH_MIXTRAL, "hidden_size": 2048, "intermediate_size": 5632, "head_dim": 128}
MIXTRAL_8X7B: dict[str, Any] = {    # mistralai/Mixtral-8x7B-v0.1 config.json
    "model_type": "mixtral", "hidden_size": 4096, "num_hidden_layers": 32,
    "num_local_experts": 8, "num_experts_per_tok": 2, "intermediate_size": 14336,
    "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
    "max_position_embeddings": 32768, "rope_theta": 1e6, "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False}
QWEN15_MOE_A27B: dict[str, Any] = {  # Qwen/Qwen1.5-MoE-A2.7B config.json
    "model_type": "qwen2_moe", "hidden_size": 2048, "num_hidden_layers": 24,
    "num_experts": 60, "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632, "num_attention_heads": 16,
    "num_key_value_heads": 16, "vocab_size": 151936, "max_position_embeddings": 8192,
    "rope_theta": 1e6, "rms_norm_eps": 1e-6, "tie_word_embeddings": False,
    "norm_topk_prob": False}
# Qwen/Qwen3.5-35B-A3B's text config as benchmarks/runtime.py states it (transformers 5.24's
# Qwen3_5MoeTextConfig defaults + the checkpoint's rope_parameters), its 40 layers: 3 Gated
# DeltaNet (16 key / 32 value heads of 128, conv 4) to 1 gated attention (16 / 2 heads of 256,
# rotary 64); 256 experts top-8 of 512 + the gated shared expert of 512
QWEN35_35B_A3B: dict[str, Any] = {
    "model_type": "qwen3_5_moe_text", "attn_output_gate": True, "full_attention_interval": 4,
    "head_dim": 256, "hidden_size": 2048, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128,
    "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_value_head_dim": 128,
    "max_position_embeddings": 262144, "moe_intermediate_size": 512, "num_attention_heads": 16,
    "num_experts": 256, "num_experts_per_tok": 8, "num_hidden_layers": 40,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-6,
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000000,
                        "partial_rotary_factor": 0.25},
    "shared_expert_intermediate_size": 512, "tie_word_embeddings": False, "vocab_size": 248320}
MODELS: dict[str, dict[str, Any]] = {
    "bench-mixtral": BENCH_MIXTRAL, "gpucheck-large": GPUCHECK_LARGE,
    "mixtral-8x7b": MIXTRAL_8X7B, "qwen1.5-moe-a2.7b": QWEN15_MOE_A27B,
    "qwen3.5-35b-a3b": QWEN35_35B_A3B}
PAD = 64   # COLIBRI_EMBED_DIM_PAD of every shipped profile


def header_for(cfg: dict[str, Any], dtype: DType, pad: int = PAD) -> ModelHeader:
    """The header `invoke convert --dtype` would write for this config.json."""
    limits = TargetModelLimits("model", pad, 256, 16)
    return build_header(read_config(cfg), dtype, limits, None, "model")


# ---------------------------------------------------------------------------------------------
# Bytes


def tensor_bytes(dtype: DType, rows: int, cols: int) -> int:
    """Bytes a kernel reads for a rows x cols weight: its data and its scales as the writer
    stores them (docs/format.md, "Tensor data"): f32 4 per weight, f16/bf16 2, int8 1 plus one f32
    scale per row, q4 16 bytes of nibbles plus one f16 scale per group of 32 weights along a row,
    mxfp4 16 bytes of E2M1 pairs plus one E8M0 byte per block of 32 (last group/block padded)."""
    return data_nbytes(dtype, rows, cols) + scale_bytes(dtype, rows, cols)


def f32(n: int) -> int:
    """Norm weights, biases, router and shared gate are f32 in every .colibri (format.F32_KINDS)."""
    return 4 * n


def deltanet_layer_bytes(h: ModelHeader, i: int) -> tuple[int, int]:
    """(weights, state traffic) of gated_deltanet layer i for one token: DN_QKV, DN_Z and DN_OUT in
    the model's dtype, DN_B, DN_A, the conv taps, A_log, dt_bias and the norm in f32
    (format.F32_KINDS); the state as cuda_backend.c's kernels touch it: cb_dn_conv reads and
    writes the W-1 conv rows, cb_dn_recur passes over the Hv x Dk x Dv state twice (decay +
    S^T k, then the update + S^T q), reading and writing it each time."""
    r = h.layer(i)
    hk, hv, dk, dv = r.mixer_params
    kd, vd, w, dt, dp = hk * dk, hv * dv, r.window, DType(h.dtype), h.embed_dim_pad
    c = 2 * kd + vd
    weights = (tensor_bytes(dt, c, dp) + tensor_bytes(dt, vd, dp) + tensor_bytes(dt, dp, vd)
               + f32(2 * hv * dp) + f32(c * w) + f32(2 * hv) + f32(dv))
    state = 2 * f32((w - 1) * c) + 4 * f32(hv * dk * dv)
    return weights, state


def bytes_per_token(h: ModelHeader, context: int) -> dict[str, int]:
    """DRAM bytes one decoded token reads, by kind (weights once; KV cache at `context`). Hybrid
    models (Qwen3.5 / Qwen3-Next): attention weights and KV for the attention layers (+ the output
    gate's projection), the DeltaNet layers' weights and state traffic apart."""
    dt, dp, L = DType(h.dtype), h.embed_dim_pad, h.n_layers
    hq, kvd = h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim
    F, Fs = h.expert_size, h.shared_expert_size
    attn = tensor_bytes(dt, hq, dp) + 2 * tensor_bytes(dt, kvd, dp) + tensor_bytes(dt, dp, hq)
    if h.has(Flag.QKV_BIAS):
        attn += f32(hq + 2 * kvd)
    if h.has(Flag.QK_NORM_HEAD):
        attn += f32(2 * h.head_dim)
    elif h.has(Flag.QK_NORM_FULL):
        attn += f32(hq + kvd)
    recs = [h.layer(i) for i in range(L)]
    dn = [deltanet_layer_bytes(h, i) for i, r in enumerate(recs) if r.mixer == Mixer.GATED_DELTANET]
    n_att = L - len(dn)
    gates = sum(1 for r in recs if r.mixer != Mixer.GATED_DELTANET
                and r.mixer_flags & MixerFlag.OUTPUT_GATE)
    edt = DType(h.expert_dtype) if h.expert_dtype is not None else dt  # mxfp4 experts (gpt-oss)
    expert = 2 * tensor_bytes(edt, F, dp) + tensor_bytes(edt, dp, F)
    # gpt-oss (#23), counted with their kinds: sinks and o_proj bias (attention), router bias,
    # each chosen expert's biases (all f32); a sliding layer reads only its window of the (full)
    # device cache; a DeltaNet layer reads no cache (its state is counted below)
    oss_attn = oss_router = oss_expert = kv_rows = 0
    for r in recs:
        oss_attn += f32(h.n_heads) if r.mixer_flags & MixerFlag.SINKS else 0
        oss_attn += f32(dp) if r.mixer_flags & MixerFlag.O_BIAS else 0
        oss_router += f32(h.num_experts) if r.ffn_params[0] & FfnFlag.ROUTER_BIAS else 0
        oss_expert += h.top_k * f32(2 * F + dp) if r.ffn_params[0] & FfnFlag.EXPERT_BIAS else 0
        if r.mixer == Mixer.GATED_DELTANET:
            continue
        sliding = r.mixer == Mixer.SLIDING_ATTENTION and r.window < h.max_seq_len
        kv_rows += min(context, r.window) if sliding else context
    shared = 0
    if h.has(Flag.SHARED_EXPERT):
        shared = 2 * tensor_bytes(dt, Fs, dp) + tensor_bytes(dt, dp, Fs)
        shared += f32(dp) if h.has(Flag.SHARED_EXPERT_GATE) else 0
    out = {
        "embedding row": tensor_bytes(dt, 1, dp),
        "attention weights": n_att * attn + gates * tensor_bytes(dt, hq, dp) + oss_attn,
        "norms": L * f32(2 * dp) + f32(dp),
        "router": L * f32(h.num_experts * dp) + oss_router,
        "routed experts (top-k)": L * h.top_k * expert + oss_expert,
        "shared expert": L * shared,
        # tied embeddings: the LM head is the whole token embedding, read once per token
        "LM head": tensor_bytes(dt, h.vocab_size, dp),
        "KV cache": 2 * kv_rows * kvd * KV_BYTES,
    }
    if dn:
        out["deltanet weights"] = sum(w for w, _ in dn)
        out["recurrent state"] = sum(st for _, st in dn)
    return out


def weights_in_file(h: ModelHeader) -> int:
    """Every weight byte of the model (all experts; the LM head once when tied)."""
    b = bytes_per_token(h, 0)
    dt = DType(h.dtype)
    edt = DType(h.expert_dtype) if h.expert_dtype is not None else dt
    per_expert = 2 * tensor_bytes(edt, h.expert_size, h.embed_dim_pad) + tensor_bytes(
        edt, h.embed_dim_pad, h.expert_size)
    total = sum(b.values()) - b["embedding row"] - b["routed experts (top-k)"]
    total -= b.get("recurrent state", 0)  # state traffic, not weights
    if any(r.ffn_params[0] & FfnFlag.EXPERT_BIAS for r in h.layer_records()):  # every expert's
        total += h.n_layers * h.num_experts * f32(2 * h.expert_size + h.embed_dim_pad)
    total += h.n_layers * h.num_experts * per_expert
    if not h.has(Flag.TIED_EMBEDDINGS):
        total += tensor_bytes(dt, h.vocab_size, h.embed_dim_pad)
    return total


# ---------------------------------------------------------------------------------------------
# Launches


@dataclass(frozen=True)
class Launches:
    kernels: int      # kernel launches per token without a graph (context <= 256)
    copies: int       # cuMemcpy*Async calls per token without a graph
    per_layer: int
    graph_nodes: int  # kernels in the decode graph (+ the attention merge per layer when the
                      # cache has > 256 positions: the graph's grid is fixed)
    graph_calls: int  # driver calls per token with the graph: {id, pos} up, cuGraphLaunch,
                      # logits down


# cuda_backend.c cb_route_fused (runtime/kernels/colibri_abi.h): the FFN norm, router and top-k
# are one cb_ffn_route launch when every router row gets a warp of its block (E <= 16) and the
# normed row fits its shared memory (Dp <= 8192)
ROUTE_WARPS = 16      # COLIBRI_CU_ROUTE_WARPS
ROUTE_MAX_DP = 8192   # COLIBRI_CU_ROUTE_MAX_DP


def route_fused(h: ModelHeader) -> bool:
    # cb_ffn_route adds no router bias: gpt-oss keeps the three launches
    return (h.num_experts <= ROUTE_WARPS and h.embed_dim_pad <= ROUTE_MAX_DP
            and not any(r.ffn_params[0] & FfnFlag.ROUTER_BIAS for r in h.layer_records()))


def launches_per_token(h: ModelHeader) -> Launches:
    """cuda_backend.c cb_forward_chunk for one token: cb_embed; per layer rmsnorm, Q, K, V,
    q/k norm + RoPE + KV write (one launch, with or without q/k norm), attention, WO, then FFN
    rmsnorm + router + top-k as one cb_ffn_route (route_fused) or three launches, [shared up +
    down, gate], dispatch, expert up + down, combine; then rmsnorm and LM head. Copies: the ids
    and the shared-expert offsets up, the logits down (then one cuStreamSynchronize). With the
    decode graph (cb_decode_graph) the kernels are its nodes and a token costs 3 driver calls."""
    per_layer = 12 if route_fused(h) else 14
    if h.has(Flag.SHARED_EXPERT):
        per_layer += 2 + (1 if h.has(Flag.SHARED_EXPERT_GATE) else 0)
    # hybrid layers (cb_deltanet_layer): a DeltaNet mixer is 8 launches (norm, 4 in-projections,
    # conv, recurrence, out-projection) where attention's is 7; Qwen's output gate adds its
    # projection and cb_sigmoid_gate. per_layer stays a plain attention layer's.
    recs = [h.layer(i) for i in range(h.n_layers)]
    n_dn = sum(1 for r in recs if r.mixer == Mixer.GATED_DELTANET)
    gates = sum(1 for r in recs if r.mixer != Mixer.GATED_DELTANET
                and r.mixer_flags & MixerFlag.OUTPUT_GATE)
    kernels = 1 + h.n_layers * per_layer + n_dn + 2 * gates + 2
    # COLIBRI_CU_KV_SPLIT; gpt-oss layers (sinks / a short window) run cb_oss_attention, one
    # launch at any context; a DeltaNet layer has no attention merge
    oss = sum(1 for r in recs if r.mixer_flags & MixerFlag.SINKS or (
        r.mixer == Mixer.SLIDING_ATTENTION and r.window < h.max_seq_len))
    merge = h.n_layers - n_dn - oss if h.max_seq_len > 256 else 0
    return Launches(kernels, 3, per_layer, kernels + merge, 3)


def launch_bound_us(n: Launches, graph: bool) -> float:
    """Host-side issue time per token: every call at LAUNCH_US, or one graph launch plus its
    nodes' GPU-side boundaries (the two copies stay outside the graph)."""
    if graph:
        return GRAPH_LAUNCH_US + n.graph_nodes * GRAPH_NODE_US + (n.graph_calls - 1) * LAUNCH_US
    return (n.kernels + n.copies) * LAUNCH_US


def bandwidth_bound_us(total_bytes: int, d: Device, fraction: float) -> float:
    return total_bytes / (d.bandwidth_gbs * 1e9 * fraction) * 1e6


def expected_us(h: ModelHeader, d: Device, context: int, fraction: float, graph: bool
                ) -> tuple[float, str]:
    """(microseconds per token, which bound decides: "bw" or "launch")."""
    bw = bandwidth_bound_us(sum(bytes_per_token(h, context).values()), d, fraction)
    la = launch_bound_us(launches_per_token(h), graph)
    return (bw, "bw") if bw >= la else (la, "launch")


# ---------------------------------------------------------------------------------------------
# Printing


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f}" if n < 10e9 else f"{n / 1e9:.2f}G"


def table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in
                     enumerate(zip(r, widths))).rstrip() for r in rows]
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def describe(name: str, h: ModelHeader) -> str:
    n = launches_per_token(h)
    return (f"{name}: hidden {h.embed_dim} (padded {h.embed_dim_pad}), {h.n_layers} layers, "
            f"{h.num_experts} experts top-{h.top_k}, FFN {h.expert_size}"
            + (f" + shared {h.shared_expert_size}" if h.shared_expert_size else "")
            + f", {h.n_heads}/{h.n_kv_heads} heads x {h.head_dim}, vocab {h.vocab_size}; "
            f"{n.kernels} kernels ({n.per_layer} per layer) + {n.copies} copies per token "
            f"without a graph; with it {n.graph_calls} driver calls (1 graph launch of "
            f"{n.graph_nodes} nodes)")


def bytes_table(cfg: dict[str, Any], context: int) -> str:
    heads = {dt: header_for(cfg, dt) for dt in DType}
    kinds = list(bytes_per_token(heads[DType.F32], context))
    rows = [["MB read per token", *[dt.name.lower() for dt in DType]]]
    for k in kinds:
        label = f"{k} @ {context}" if k == "KV cache" else k
        rows.append([label, *[_mb(bytes_per_token(h, context)[k]) for h in heads.values()]])
    rows.append(["total", *[_mb(sum(bytes_per_token(h, context).values()))
                            for h in heads.values()]])
    rows.append(["(weights in the file)", *[_mb(weights_in_file(h)) for h in heads.values()]])
    return table(rows)


def time_table(cfg: dict[str, Any], context: int, fraction: float, graph: bool) -> str:
    rows = [["ms/token (bound)", *[d.name for d in DEVICES]]]
    for dt in DType:
        h = header_for(cfg, dt)
        cells = []
        for d in DEVICES:
            if weights_in_file(h) > d.memory_gb * 1e9:
                cells.append("no fit")
                continue
            us, bound = expected_us(h, d, context, fraction, graph)
            cells.append(f"{us / 1e3:.3g} ({bound})")
        rows.append([dt.name.lower(), *cells])
    return table(rows)


# gpu-check's small models (scripts/gpu-check.sh --prepare: hidden 128, 2 layers, 8 experts
# top-2, vocab 512, one per family): their weights are tiny, so decode is launch-bound and
# ms/token / driver calls per token measures the per-call cost.
SMALL_FAMILIES: dict[str, int] = {
    "mixtral": 0,
    "qwen2_moe": int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS),
    "qwen3_moe": int(Flag.QK_NORM_HEAD),
    "olmoe": int(Flag.QK_NORM_FULL),
}


def first_run(fraction: float) -> str:
    """What the first `scripts/gpu-check.sh` run on an H200 is judged against."""
    h200 = next(d for d in DEVICES if d.name.startswith("H200"))
    h = header_for(GPUCHECK_LARGE, DType.F16)
    total = sum(bytes_per_token(h, 80).values())    # --bench "--prompt-len 16 --gen 64"
    n = launches_per_token(h)
    lines = ["First GPU run (scripts/gpu-check.sh on an H200):"]
    for fam, flags in SMALL_FAMILIES.items():
        per_layer = launches_per_token(replace(h, n_layers=2, flags=flags)).per_layer
        calls = 1 + 2 * per_layer + 2 + n.copies
        lines.append(f"- small {fam}, COLIBRI_CUDA_GRAPH=0: {calls} driver calls per token -> "
                     f"{calls * LAUNCH_US / 1e3:.3g} ms/token at {LAUNCH_US:g} us per call; "
                     "measured ms/token / calls = the per-call cost (with the graph: 3 calls)")
    for graph in (False, True):
        us, bound = expected_us(h, h200, 80, fraction, graph)
        lines.append(f"- gpucheck-large f16 ({total / 1e9:.2f} GB per token), "
                     f"{'one graph' if graph else 'no graph'}: {us / 1e3:.3g} ms/token ({bound}-bound)"
                     f" = {total / us / 1e3:.0f} GB/s, {total / us / 1e3 / h200.bandwidth_gbs:.0%} "
                     "of the datasheet bandwidth")
    even = bandwidth_bound_us(total, h200, fraction) / (n.kernels + n.copies)
    lines.append(f"- without a graph, launches stop being the bound below {even:.2g} us per call")
    return "\n".join(lines)


def report(context: int, fraction: float) -> str:
    out = [f"Decode performance model (docs/cuda.md): KV cache at context {context}, "
           f"{fraction:.0%} of datasheet bandwidth achievable (assumption), "
           f"{LAUNCH_US:g} us per driver call without a graph; graph: {GRAPH_LAUNCH_US:g} us + "
           f"{GRAPH_NODE_US:.3g} us per node.", ""]
    for name, cfg in MODELS.items():
        h = header_for(cfg, DType.F16)
        out += [describe(name, h), "", bytes_table(cfg, context), ""]
        out += ["today (one cuLaunchKernel per kernel):", time_table(cfg, context, fraction, False),
                "", "one CUDA graph per token:", time_table(cfg, context, fraction, True), ""]
    out += [first_run(fraction), ""]
    out.append("Sources:")
    out += [f"- {d.name}: {d.source}" for d in DEVICES]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--context", type=int, default=DEFAULT_CONTEXT,
                    help="positions already in the KV cache (default %(default)s)")
    ap.add_argument("--fraction", type=float, default=DEFAULT_FRACTION,
                    help="achievable share of datasheet bandwidth (default %(default)s)")
    args = ap.parse_args(argv)
    print(report(args.context, args.fraction))
    return 0


if __name__ == "__main__":
    sys.exit(main())
