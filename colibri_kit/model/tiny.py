"""The built-in `tiny-moe-4e2r` model: a deterministic random MoE for demos and smoke tests.

4 routed experts, top-2 with renormalised weights, 2 layers, hidden 48 (not a multiple of 64, so
padding is exercised), 4 query heads sharing 2 key/value heads of 12 values, FFN 64, vocabulary
256, 128 positions. Weights come from a fixed NumPy seed (PCG64), so the file is bit-identical
on every machine. Scales keep activations near unit size and spread the router and output logits
so top-k and greedy choices are not near-ties.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from colibri_kit.model.format import (
    NONE, DType, Family, Kind, ModelHeader, ModelWriter, Routing, padded_dim,
)

TINY_NAME = "tiny-moe-4e2r"
TINY_SEED = 20261129


def tiny_header(pad: int = 64, dtype: DType = DType.F32) -> ModelHeader:
    d = 48
    return ModelHeader(
        num_experts=4, expert_size=64, vocab_size=256, max_seq_len=128, embed_dim=d,
        n_layers=2, n_heads=4, n_kv_heads=2, head_dim=12, top_k=2,
        routing=Routing.RENORMALISE, dtype=int(dtype), embed_dim_pad=padded_dim(d, pad),
        pad_multiple=pad, flags=0, norm_eps=1e-5, rope_theta=10000.0, family=Family.OTHER,
        bos_token_id=1, eos_token_id=2, name=TINY_NAME)


def write_tiny_model(path: str | os.PathLike[str], pad: int = 64, dtype: DType = DType.F32) -> Path:
    """Write `tiny-moe-4e2r` to ``path`` (padded to a multiple of ``pad``); returns the path."""
    h = tiny_header(pad, dtype)
    rng = np.random.default_rng(TINY_SEED)
    d, f, v = h.embed_dim, h.expert_size, h.vocab_size
    hq, hkv = h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim

    def linear(out: int, inp: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((out, inp)) * (gain / np.sqrt(inp))).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    with ModelWriter(path, h) as w:
        for layer in range(h.n_layers):
            w.add(Kind.ATTN_NORM, layer, NONE, norm(d))
            w.add(Kind.WQ, layer, NONE, linear(hq, d, 1.5))
            w.add(Kind.WK, layer, NONE, linear(hkv, d, 1.5))
            w.add(Kind.WV, layer, NONE, linear(hkv, d))
            w.add(Kind.WO, layer, NONE, linear(d, hq, 0.5))
            w.add(Kind.FFN_NORM, layer, NONE, norm(d))
            # A large router gain spreads the expert probabilities (no near-ties in top-k).
            w.add(Kind.ROUTER, layer, NONE, linear(h.num_experts, d, 4.0))
            for e in range(h.num_experts):
                w.add(Kind.EXPERT_W1, layer, e, linear(f, d))
            for e in range(h.num_experts):
                w.add(Kind.EXPERT_W3, layer, e, linear(f, d))
            for e in range(h.num_experts):
                w.add(Kind.EXPERT_W2, layer, e, linear(d, f, 0.5))
        w.add(Kind.TOK_EMBED, NONE, NONE, rng.standard_normal((v, d)).astype(np.float32))
        w.add(Kind.OUTPUT_NORM, NONE, NONE, norm(d))
        w.add(Kind.LM_HEAD, NONE, NONE, linear(v, d, 4.0))
    return Path(path)


def write_random_model(path: str | os.PathLike[str], header: ModelHeader, seed: int = 0) -> Path:
    """Fill every tensor ``header``'s geometry and flags require with seeded random values
    (norm weights near 1, projections scaled by 1/sqrt(fan-in)): for format and runtime tests of
    features the tiny model lacks (shared expert, q/k norms, biases, tied embeddings)."""
    from colibri_kit.model.format import D_COLS, D_ROWS, F32_KINDS, expected_tensors

    rng = np.random.default_rng(seed)
    d = header.embed_dim
    with ModelWriter(path, header) as w:
        for spec in expected_tensors(header).values():
            rows = d if spec.kind in D_ROWS else spec.rows
            cols = d if spec.kind in D_COLS else spec.cols
            if spec.kind in (Kind.ATTN_NORM, Kind.FFN_NORM, Kind.OUTPUT_NORM, Kind.Q_NORM, Kind.K_NORM):
                a = 1.0 + 0.1 * rng.standard_normal((rows, cols))
            elif spec.kind == Kind.TOK_EMBED:
                a = rng.standard_normal((rows, cols))
            elif spec.kind in F32_KINDS:  # biases, router, shared gate
                a = rng.standard_normal((rows, cols)) * (3.0 / np.sqrt(cols) if spec.kind == Kind.ROUTER else 0.2)
            else:
                a = rng.standard_normal((rows, cols)) / np.sqrt(cols)
            w.add(spec.kind, spec.layer, spec.expert, a.astype(np.float32))
    return Path(path)
