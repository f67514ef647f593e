"""Write the tokenizer fuzzer's models and seed texts (needs the test extra: `tokenizers`).

    python3 runtime/fuzz/make_tok_models.py OUT_DIR

OUT_DIR/models/: one carrier model per family tokenizer trained by tests/hf_models.py (qwen2,
olmoe, mixtral; vocabulary 1000), the Mixtral one with a Metaspace(first) pre-tokenizer, the tiny
model (256 byte pieces), a byte-level tokenizer without normalizer or added tokens (the fuzzer
checks that its pieces join to the input), the Qwen2 one with the o200k and the Qwen3.5
pre-tokenizers, and a SentencePiece tokenizer.model read as SentencePiece encodes (ranked merges,
user-defined pieces; trained here with `sentencepiece`).
OUT_DIR/corpus/: the exactness corpora (tests/data/tokenizer_corpus.json and
tokenizer_corpus_real.json), one file per text.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import hf_models as H  # noqa: E402
from colibri_kit.model import tokenizer as T  # noqa: E402
from colibri_kit.model.tiny import tiny_tokenizer, write_text_model  # noqa: E402


def _sentencepiece(d: Path) -> T.TokenizerSpec:
    import sentencepiece as spm

    from colibri_kit.model.tokenizer_sp import spec_from_sentencepiece

    d.mkdir(parents=True, exist_ok=True)
    (d / "train.txt").write_text("\n".join(t.replace("\n", " ") for t in H.tokenizer_training_texts()), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(d / "train.txt"), model_prefix=str(d / "tokenizer"), model_type="bpe", vocab_size=800,
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
        split_digits=True, character_coverage=0.995, minloglevel=2, allow_whitespace_only_pieces=True,
        user_defined_symbols=["<ref>", "[DOC]"])
    return spec_from_sentencepiece(d / "tokenizer.model")


def main(out: Path) -> None:
    models = out / "models"
    models.mkdir(parents=True, exist_ok=True)
    for fam in ("qwen2", "olmoe", "mixtral"):
        d = out / "hf" / fam
        H.train_tokenizer(fam, 1000, d)
        spec = T.load_tokenizer(d)
        assert spec is not None
        write_text_model(models / f"{fam}.colibri", spec.blobs(), 1024)
    write_text_model(models / "tiny.colibri", tiny_tokenizer().blobs(), 256)
    raw = T.load_tokenizer(out / "hf" / "qwen2")
    assert raw is not None
    raw.normalizer, raw.added = T.NORM_NONE, []
    write_text_model(models / "plain.colibri", raw.blobs(), 1024)
    meta = T.load_tokenizer(out / "hf" / "mixtral")  # as transformers 5 saves it: Metaspace(first)
    assert meta is not None
    meta.normalizer, meta.pre_tokenizer, meta.digits = T.NORM_NONE, T.PRETOK_METASPACE, T.META_FIRST
    write_text_model(models / "metaspace.colibri", meta.blobs(), 1024)
    for name, pre, digits in (("o200k", T.PRETOK_O200K, 3), ("qwen35", T.PRETOK_QWEN35, 1)):
        spec = T.load_tokenizer(out / "hf" / "qwen2")
        assert spec is not None
        spec.pre_tokenizer, spec.digits = pre, digits
        write_text_model(models / f"{name}.colibri", spec.blobs(), 1024)
    write_text_model(models / "spmodel.colibri", _sentencepiece(out / "hf" / "sp").blobs(), 1024)
    corpus = out / "corpus"
    corpus.mkdir(exist_ok=True)
    texts = json.loads(H.TOKENIZER_CORPUS.read_text(encoding="utf-8"))
    texts += json.loads((ROOT / "tests" / "data" / "tokenizer_corpus_real.json").read_text(encoding="utf-8"))
    for i, text in enumerate(texts):
        (corpus / f"text-{i:03d}").write_bytes(bytes([i % 251, i % 4]) + text.encode())


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/fuzz-tok"))
