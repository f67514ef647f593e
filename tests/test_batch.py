"""Continuous batching in the C runtime (docs/runtime.md, "Batching"): colibri_forward_batch,
colibri_gen_step and the sequence snapshots, checked by runtime/tests/batch_driver.c.

Batch invariance is checked bit for bit: four sequences of 1, 9, 70 and 200 tokens give the
logits each gives alone (one colibri_forward call) when batched together, when joining one by
one in random-sized chunks (so a token lands at every place in the kernels' tiles and passes of
every size), and with last-token logits only; four sampled generations (own seeds, temperatures,
top-p/top-k, lengths) give colibri_generate's ids whatever the join order, also with the prompts'
share of a step capped at 7 rows while one decodes (colibri_engine_set_prompt_rows: the cap held,
reached, and lifted with nobody decoding); a restored prefix
continues with the bits of computing it again. Over every weight dtype (each kernel family's tile
paths), int8 activations, an f16 KV cache, a model with every flag, sliding-window rings, on 1, 2
and 3 threads and on the AVX2 and scalar kernels as well as the machine's best. The passes carry several sequences at once; a
layer kind that says it has no multi-sequence pass (kinds.h multi_seq 0, the driver's `solo`)
makes the engine give each sequence its own pass, with the same bits and the layer named."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from test_runtime_c import RUNTIME, make, render_host_config

from test_qwen35 import DN, GATED, hybrid_header

from colibri_kit.model.format import ALL_FLAGS, DEFAULT_LAYER, DType, Ffn, Flag, LayerRecord, Mixer, \
    MixerFlag, ModelHeader, Routing, gptoss_moe_params, padded_dim
from colibri_kit.model.tiny import write_random_model

PAD = 64  # the host profile's embed_pad


def header(**kw: object) -> ModelHeader:
    base = dict(num_experts=8, expert_size=64, vocab_size=300, max_seq_len=256, embed_dim=72,
                n_layers=2, n_heads=6, n_kv_heads=2, head_dim=12, top_k=2,
                routing=Routing.RENORMALISE, dtype=int(DType.F32), embed_dim_pad=padded_dim(72, PAD),
                pad_multiple=PAD, norm_eps=1e-6, rope_theta=10000.0, name="batch")
    base.update(kw)
    return ModelHeader(**base)  # type: ignore[arg-type]


GPTOSS_FLAGS = int(MixerFlag.SINKS | MixerFlag.O_BIAS)
GPTOSS_FFN = gptoss_moe_params(1.702, 7.0)
SLIDING = (LayerRecord(Mixer.SLIDING_ATTENTION, Ffn.MOE, 5), DEFAULT_LAYER, LayerRecord(Mixer.SLIDING_ATTENTION, Ffn.MOE, 100))
MODELS = {
    "f32-flags": header(flags=int(ALL_FLAGS & ~Flag.QK_NORM_FULL & ~Flag.ROPE_YARN), shared_expert_size=48, routing=Routing.PLAIN),
    "f16": header(dtype=int(DType.F16)),
    "bf16": header(dtype=int(DType.BF16)),
    "int8": header(dtype=int(DType.INT8), flags=int(Flag.SHARED_EXPERT), shared_expert_size=32),
    "q4": header(dtype=int(DType.Q4)),
    "sliding": header(n_layers=3, layers=SLIDING),
    # Qwen3.5 / Qwen3-Next hybrid: gated_deltanet layers (each sequence its own conv + delta
    # state in one pass; value head dim 14 takes the delta step's scalar tail) around gated
    # attention (output gate, partial RoPE), zero-centred norms, the shared expert's gate
    "hybrid": hybrid_header((DN, GATED, DN), max_seq_len=256),
    # gpt-oss: mxfp4 experts, sinks and output bias on a sliding ring and on full attention,
    # router and expert biases, the clamped SwiGLU
    "gptoss": header(n_layers=2, expert_dtype=int(DType.MXFP4), expert_size=64, norm_eps=1e-5,
                     layers=(LayerRecord(Mixer.SLIDING_ATTENTION, Ffn.MOE, 16, GPTOSS_FLAGS, (0, 0, 0, 0), GPTOSS_FFN),
                             LayerRecord(Mixer.ATTENTION, Ffn.MOE, 0, GPTOSS_FLAGS, (0, 0, 0, 0), GPTOSS_FFN))),
}
# (model, threads, extra driver args, COLIBRI_CPU_SIMD cap)
RUNS = [
    ("f32-flags", 1, (), None), ("f32-flags", 3, (), None), ("f32-flags", 2, ("f16",), None),
    ("f16", 2, (), None), ("bf16", 3, (), None),
    ("int8", 2, (), None), ("int8", 3, ("int8act",), None),
    ("q4", 2, (), None), ("q4", 2, ("int8act",), None),
    ("sliding", 1, (), None), ("sliding", 3, ("f16",), None),
    ("int8", 2, ("int8act",), "avx2"), ("q4", 2, (), "avx2"), ("f32-flags", 2, (), "scalar"),
    ("sliding", 2, ("solo",), None),  # a kind without a multi-sequence pass: one sequence a pass
    ("hybrid", 1, (), None), ("hybrid", 3, ("f16",), None),
    ("gptoss", 2, (), None), ("gptoss", 3, ("int8act",), None),
]


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cfg = render_host_config(tmp_path_factory.mktemp("cfg-batch"))
    out = tmp_path_factory.mktemp("rt-batch")
    make(RUNTIME / "tests", out, cfg, goal=str(out / "bin" / "batch_driver"))
    return out / "bin" / "batch_driver"


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("batch-models")
    return {name: write_random_model(root / f"{name}.colibri", h, seed=5) for name, h in MODELS.items()}


@pytest.mark.parametrize("name,threads,extra,simd", RUNS,
                         ids=[f"{m}-t{t}{''.join('-' + e for e in x)}{'-' + s if s else ''}" for m, t, x, s in RUNS])
def test_batch_invariance(driver: Path, models: dict[str, Path], name: str, threads: int,
                          extra: tuple[str, ...], simd: str | None) -> None:
    env = {**os.environ, **({"COLIBRI_CPU_SIMD": simd} if simd else {})}
    proc = subprocess.run([str(driver), str(models[name]), str(threads), *extra], capture_output=True,
                          text=True, timeout=600, env=env)
    assert proc.returncode == 0 and "batch: 0 failure(s)" in proc.stdout, proc.stdout + proc.stderr
    assert proc.stdout.count("ok   ") == 22, proc.stdout
    # colibri_seq_share reads a full-attention layer's rows in place (every model here has one)
    assert "ok   seq_share: the rows are read in place" in proc.stdout, proc.stdout
    truncates = "a shorter prefix of the snapshot continued" in proc.stdout
    # a ring or a recurrent state restores to its own position only
    assert truncates == (name not in ("sliding", "hybrid", "gptoss")), proc.stdout
