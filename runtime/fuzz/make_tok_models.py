"""Write the tokenizer fuzzer's models and seed texts (needs the test extra: `tokenizers`).

    python3 runtime/fuzz/make_tok_models.py OUT_DIR

OUT_DIR/models/: one carrier model per family tokenizer trained by tests/hf_models.py (qwen2,
olmoe, mixtral; vocabulary 1000), the Mixtral one with a Metaspace(first) pre-tokenizer, the tiny
model (256 byte pieces) and a byte-level tokenizer without normalizer or added tokens (the fuzzer
checks that its pieces join to the input).
OUT_DIR/corpus/: the exactness corpus (tests/data/tokenizer_corpus.json), one file per text.
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
    corpus = out / "corpus"
    corpus.mkdir(exist_ok=True)
    texts = json.loads(H.TOKENIZER_CORPUS.read_text(encoding="utf-8"))
    for i, text in enumerate(texts):
        (corpus / f"text-{i:03d}").write_bytes(bytes([i % 5, i % 4]) + text.encode())


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "build/fuzz-tok"))
