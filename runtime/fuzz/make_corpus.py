"""Write the loader fuzzer's seed corpus: small valid models (pad 64, the host build's
COLIBRI_EMBED_DIM_PAD) with different dtypes and flags, and corrupted variants of them.

    python3 runtime/fuzz/make_corpus.py runtime/fuzz/corpus
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from colibri_kit.model.format import DType, Family, Flag, ModelHeader, Routing
from colibri_kit.model.tiny import write_random_model


def micro(dtype: DType, flags: int = 0, shared: int = 0) -> ModelHeader:
    return ModelHeader(num_experts=2, expert_size=4, vocab_size=8, max_seq_len=4, embed_dim=12,
                       n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, top_k=1,
                       routing=Routing.RENORMALISE, dtype=int(dtype), embed_dim_pad=64,
                       pad_multiple=64, flags=flags, shared_expert_size=shared,
                       family=Family.OTHER, name="fuzz-seed")


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    seeds = {
        "f32": micro(DType.F32),
        "int8": micro(DType.INT8),
        "q4": micro(DType.Q4),
        "f16-shared-gate-bias": micro(DType.F16, int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE
                                                     | Flag.QKV_BIAS), shared=4),
        "bf16-qknorm-tied": micro(DType.BF16, int(Flag.QK_NORM_FULL | Flag.TIED_EMBEDDINGS)),
    }
    for name, h in seeds.items():
        write_random_model(out / f"{name}.colibri", h, seed=1)
    raw = (out / "int8.colibri").read_bytes()

    def patch(name: str, offset: int, fmt: str, value: int) -> None:
        data = bytearray(raw)
        struct.pack_into(fmt, data, offset, value)
        (out / name).write_bytes(bytes(data))

    (out / "bad-truncated.colibri").write_bytes(raw[: len(raw) - 100])
    (out / "bad-header-only.colibri").write_bytes(raw[:256])
    patch("bad-magic.colibri", 0, "<I", 0)
    patch("bad-version.colibri", 8, "<I", 2)
    patch("bad-offset.colibri", 256 + 24, "<Q", 1 << 40)
    patch("bad-scale-offset.colibri", 256 + 40, "<Q", len(raw))
    patch("bad-dims.colibri", 12, "<I", 1 << 20)
    patch("bad-pad.colibri", 68, "<I", 32)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "corpus"))
