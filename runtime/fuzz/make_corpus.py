"""Write the loader fuzzer's seed corpus: small valid models (pad 64, the host build's
COLIBRI_EMBED_DIM_PAD) with different dtypes and flags, two with a metadata section holding a
small tokenizer (byte-level BPE and SentencePiece-style), one of format version 2 (no layer
table), and corrupted variants (header fields, tensor records, layer records).

    python3 runtime/fuzz/make_corpus.py runtime/fuzz/corpus
"""

from __future__ import annotations

import struct
import sys
from pathlib import Path

from colibri_kit.model import tokenizer as T
from colibri_kit.model.format import VERSION, DType, Family, Flag, ModelHeader, Routing
from colibri_kit.model.tiny import write_random_model


def micro(dtype: DType, flags: int = 0, shared: int = 0, version: int = VERSION) -> ModelHeader:
    return ModelHeader(num_experts=2, expert_size=4, vocab_size=8, max_seq_len=4, embed_dim=12,
                       n_layers=1, n_heads=2, n_kv_heads=1, head_dim=4, top_k=1,
                       routing=Routing.RENORMALISE, dtype=int(dtype), embed_dim_pad=64,
                       pad_multiple=64, flags=flags, shared_expert_size=shared,
                       family=Family.OTHER, name="fuzz-seed", version=version)


def micro_tokenizer(sentencepiece: bool) -> T.TokenizerSpec:
    """A 64-id tokenizer exercising every table: pieces, merges, added tokens with each flag."""
    if sentencepiece:
        vocab = [b"<unk>", b"<s>", b"</s>"] + [f"<0x{b:02X}>".encode() for b in range(0x20, 0x40)]
        flags = [T.V_IN_MODEL | T.V_ADDED | T.V_SPECIAL] * 3 + [T.V_IN_MODEL | T.V_BYTE] * 32
        pieces = ["\u2581", "a", "b", "\u2581a", "ab", "\u2581ab", "\u00e9", "\u4f60"]
    else:
        vocab, flags = [], []
        pieces = [" ", "a", "b", " a", "ab", " ab", "\n", "\n\n", "1", "2", "12", "\u00e9".encode().decode()]
    for p in pieces:
        vocab.append(p.encode())
        flags.append(T.V_IN_MODEL)
    ids = {v: i for i, v in enumerate(vocab)}
    merge_list = [(" ", "a"), ("a", "b"), (" a", "b"), ("\n", "\n"), ("1", "2")] if not sentencepiece else \
        [("\u2581", "a"), ("a", "b"), ("\u2581a", "b")]
    merges = [(ids[a.encode()], ids[b.encode()], ids[(a + b).encode()]) for a, b in merge_list]
    added = []
    for content, af in (("<|x|>", T.A_SPECIAL), ("<m>", T.A_LSTRIP | T.A_SPECIAL), ("[r]", T.A_RSTRIP),
                        ("  ", T.A_NORMALIZED)):
        added.append(T.AddedToken(len(vocab), content, af))
        vocab.append(content.encode())
        flags.append(T.V_ADDED | (T.V_SPECIAL if af & T.A_SPECIAL else 0))
    return T.TokenizerSpec(
        model=T.MODEL_SP_BPE if sentencepiece else T.MODEL_BYTE_BPE,
        normalizer=T.NORM_SP if sentencepiece else T.NORM_NFC,
        pre_tokenizer=T.PRETOK_NONE if sentencepiece else T.PRETOK_LLAMA3, digits=0 if sentencepiece else 3,
        decoder=T.DEC_SP if sentencepiece else T.DEC_BYTE_LEVEL,
        flags=(T.F_BYTE_FALLBACK | T.F_FUSE_UNK | T.F_ADD_BOS) if sentencepiece else T.F_IGNORE_MERGES,
        unk_id=0 if sentencepiece else T.NO_ID, bos_id=1 if sentencepiece else T.NO_ID,
        eos_id=2 if sentencepiece else len(vocab) - 4, pad_id=T.NO_ID, vocab=vocab, vocab_flags=flags,
        merges=merges, added=added, stop_ids=[2] if sentencepiece else [], strip=1 if sentencepiece else 0)


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    seeds = {
        "f32": micro(DType.F32),
        "int8": micro(DType.INT8),
        "q4": micro(DType.Q4),
        "f16-shared-gate-bias": micro(DType.F16, int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE
                                                     | Flag.QKV_BIAS), shared=4),
        "bf16-qknorm-tied": micro(DType.BF16, int(Flag.QK_NORM_FULL | Flag.TIED_EMBEDDINGS)),
        "v2-f32": micro(DType.F32, version=2),
    }
    for name, h in seeds.items():
        write_random_model(out / f"{name}.colibri", h, seed=1)
    for name, sp in (("v2-tokenizer-bytelevel", False), ("v2-tokenizer-sentencepiece", True)):
        h = micro(DType.F32)
        h.vocab_size = 64
        write_random_model(out / f"{name}.colibri", h, seed=2, metadata=micro_tokenizer(sp).blobs())
    raw = (out / "int8.colibri").read_bytes()

    def patch(name: str, offset: int, fmt: str, value: int) -> None:
        data = bytearray(raw)
        struct.pack_into(fmt, data, offset, value)
        (out / name).write_bytes(bytes(data))

    (out / "bad-truncated.colibri").write_bytes(raw[: len(raw) - 100])
    (out / "bad-header-only.colibri").write_bytes(raw[:256])
    patch("bad-magic.colibri", 0, "<I", 0)
    patch("bad-version.colibri", 8, "<I", 4)
    patch("bad-offset.colibri", 256 + 24, "<Q", 1 << 40)
    patch("bad-scale-offset.colibri", 256 + 40, "<Q", len(raw))
    patch("bad-dims.colibri", 12, "<I", 1 << 20)
    patch("bad-pad.colibri", 68, "<I", 32)
    # the layer table (version 3): where it is, and what a record may hold
    layers = struct.unpack_from("<Q", raw, 144)[0]
    patch("bad-layer-table-offset.colibri", 144, "<Q", layers + 64)
    patch("bad-layer-mixer.colibri", layers, "<I", 0)
    patch("bad-layer-ffn.colibri", layers + 4, "<I", 7)
    patch("bad-layer-window.colibri", layers + 8, "<I", 5)  # full attention has none
    patch("bad-layer-flags.colibri", layers + 12, "<I", 1)
    patch("bad-layer-reserved.colibri", layers + 48, "<I", 1)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "corpus"))
