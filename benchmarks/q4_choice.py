"""Measure the candidate grouped 4-bit (and 8-bit) weight encodings on the random HF models.

For each family case of tests/hf_models.py and each candidate (group size x scale type x with or
without a per-group minimum), every weight matrix the converter quantises (embeddings, lm_head,
attention and expert/shared-expert projections; norms, biases, routers and the shared-expert
gate stay f32) is quantised and dequantised, loaded into transformers at f32, and the logits are
compared with the f32 model's: max |logits - f32| / max |f32 logits| over the prompt (the
measure of tests/hf_models.TOLERANCE). Prints one table (docs/models.md, "4-bit weights").

    PYTHONPATH=. python benchmarks/q4_choice.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def grouped(a: np.ndarray, group: int, bits: int, scale: str, offset: bool) -> np.ndarray:
    """Quantise rows of ``a`` in groups of ``group`` columns, return the dequantised f32 values."""
    rows, cols = a.shape
    ng = -(-cols // group)
    x = np.zeros((rows, ng * group), np.float32)
    x[:, :cols] = a
    x = x.reshape(rows, ng, group)
    sdt = np.float16 if scale == "f16" else np.float32
    levels = (1 << bits) - 1
    if offset:
        lo, hi = x.min(axis=2), x.max(axis=2)
        d = ((hi - lo) / levels).astype(sdt).astype(np.float32)
        m = lo.astype(sdt).astype(np.float32)
        d[d == 0] = 1.0
        q = np.clip(np.rint((x - m[..., None]) / d[..., None]), 0, levels)
        out = (q.astype(np.float64) * d[..., None] + m[..., None]).astype(np.float32)
    else:
        half = 1 << (bits - 1)
        idx = np.argmax(np.abs(x), axis=2)
        big = np.take_along_axis(x, idx[..., None], axis=2)[..., 0]
        d = (big / -half).astype(sdt).astype(np.float32)
        d[d == 0] = 1.0
        q = np.clip(np.rint(x / d[..., None]), -half, half - 1)
        out = (q * d[..., None]).astype(np.float32)
    return out.reshape(rows, ng * group)[:, :cols]


def per_row_int8(a: np.ndarray) -> np.ndarray:
    from colibri_kit.model.format import quantize_int8

    q, s = quantize_int8(a)
    return q.astype(np.float32) * s[:, None]


def quantised_names(name: str) -> bool:
    """Weights the converter stores in the model dtype (transformers fuses the experts in memory
    as [E, out, in] `experts.gate_up_proj` / `experts.down_proj`)."""
    keep_f32 = ("norm", "bias", "mlp.gate.weight", "block_sparse_moe.gate.weight", "shared_expert_gate")
    return (name.endswith("weight") or ".experts." in name) and not any(k in name for k in keep_f32)


def main() -> None:
    import torch

    import hf_models as H

    cands: list[tuple[str, object]] = [("int8 per-row (existing)", per_row_int8)]
    for bits in (4,):
        for group in (32, 64, 128):
            for scale in ("f16", "f32"):
                for offset in (False, True):
                    label = f"q{bits} g{group} {scale} scale{' + min' if offset else ''}"
                    cands.append((label, (group, bits, scale, offset)))
    cands.append(("q8 g32 f16 scale", (32, 8, "f16", False)))
    cands.append(("q8 g64 f16 scale", (64, 8, "f16", False)))
    fams = H.FAMILY_CASES
    table: dict[str, list[float]] = {c[0]: [] for c in cands}
    for fam in fams:
        model = H.build_model(H.CASES[fam])
        ref = H.hf_logits(model, H.LOGIT_PROMPT)
        orig = {n: p.detach().clone() for n, p in model.named_parameters()}
        for label, how in cands:
            with torch.no_grad():
                for n, p in model.named_parameters():
                    if not quantised_names(n) or p.dim() < 2:
                        p.copy_(orig[n])
                        continue
                    a = orig[n].numpy()
                    a2 = a.reshape(-1, a.shape[-1])  # rows of the stored [out, in] matrices
                    deq = how(a2) if callable(how) else grouped(a2, *how)
                    p.copy_(torch.from_numpy(deq.reshape(a.shape)))
            table[label].append(H.rel_err(H.hf_logits(model, H.LOGIT_PROMPT), ref))
        print(f"# {fam} done", file=sys.stderr, flush=True)
    print("| candidate | bits/weight | " + " | ".join(fams) + " | mean |")
    print("|---|---|" + "---|" * (len(fams) + 1))
    for label, how in cands:
        if callable(how):
            bpw = 8 + 32 / 4096
        else:
            group, bits, scale, offset = how
            bpw = bits + (16 if scale == "f16" else 32) * (2 if offset else 1) / group
        errs = table[label]
        print(f"| {label} | {bpw:.3f} | " + " | ".join(f"{e:.2e}" for e in errs) + f" | {np.mean(errs):.2e} |")


if __name__ == "__main__":
    main()
