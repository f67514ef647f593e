"""The tokenizer's Unicode data against the `tokenizers` library itself: the character classes
of its regex engine (Oniguruma, Unicode 16.0) on every code point, its NFC normalizer (Unicode
9.0 tables) on every code point NFC data describe, and NFC's cost on adversarial input counted
in steps (linear: a 1 MiB run of combining marks costs about 16 times a 64 KiB one; the old
insertion sort cost 256 times). colibri_kit/model/unicode_gen.py says where each version comes from."""

from __future__ import annotations

from pathlib import Path

import pytest

import tokenizer_lib as L
from colibri_kit.model import tokenizer as T
from colibri_kit.model import unicode_gen as U

CLASSES = {"space": (r"\s", U.SPACE), "number": (r"\p{N}", U.NUMBER), "upper": (r"[\p{Lu}\p{Lt}]", U.UPPER),
           "lower": (r"\p{Ll}", U.LOWER), "letter": (r"[\p{Lm}\p{Lo}]", U.LETTER), "mark": (r"\p{M}", U.MARK)}


@pytest.fixture(scope="module")
def lib(tmp_path_factory: pytest.TempPathFactory):
    return L.build(tmp_path_factory.mktemp("toklib"))


def _matches(pattern: str, cps: list[int]) -> set[int]:
    """The code points the `tokenizers` regex engine matches with ``pattern``."""
    from tokenizers import Regex, pre_tokenizers

    split = pre_tokenizers.Split(Regex(pattern), behavior="removed")
    hits: set[int] = set()
    for a in range(0, len(cps), 1 << 16):
        part = cps[a:a + (1 << 16)]
        covered = bytearray(len(part))
        for _, (x, y) in split.pre_tokenize_str("".join(map(chr, part))):
            covered[x:y] = b"\x01" * (y - x)
        hits.update(part[i] for i in range(len(part)) if not covered[i])
    return hits


def test_classes_are_those_of_the_tokenizers_regex_engine(lib) -> None:
    cps = [c for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF]
    table = {c: lib.tok_class(c) & 7 for c in cps}
    for name, (pattern, cls) in CLASSES.items():
        want = _matches(pattern, cps)
        got = {c for c, k in table.items() if k == cls}
        assert got == want, f"{name}: {len(got ^ want)} code points differ, e.g. {sorted(got ^ want)[:5]}"
    # Unicode 16.0, not 17.0: Garay (16.0) is a letter, Sidetic (17.0) is not, for both
    assert table[0x10D50] == U.UPPER and table[0x10D70] == U.LOWER and table[0x10940] == U.OTHER


def _nfc_tokenizer(lib):
    """Byte-level BPE with the NFC normalizer and no merges: the ids are the normalized bytes."""
    vocab = [bytes([b]) for b in range(256)]
    spec = T.TokenizerSpec(model=T.MODEL_BYTE_BPE, normalizer=T.NORM_NFC, pre_tokenizer=T.PRETOK_GPT2, digits=0,
                           decoder=T.DEC_BYTE_LEVEL, flags=0, unk_id=T.NO_ID, bos_id=T.NO_ID, eos_id=T.NO_ID,
                           pad_id=T.NO_ID, vocab=vocab, vocab_flags=[T.V_IN_MODEL] * 256, merges=[], added=[])
    c = L.CTokenizer(lib, spec)
    return lambda text: bytes(c.encode(text)).decode("utf-8"), c


def test_nfc_is_that_of_the_tokenizers_normalizer_on_every_code_point(lib) -> None:
    """Every code point with a combining class, a canonical decomposition or a part in a
    composition (Unicode 16.0 data, so the marks and composites added after 9.0 are probed too),
    alone, between a letter and a low mark, before and after an acute, and every composition pair."""
    from tokenizers import normalizers

    ud = U.unicode_data()
    ref = normalizers.NFC()
    nfc, _ = _nfc_tokenizer(lib)
    probes: list[str] = []
    for cp in range(0x110000):
        if 0xD800 <= cp <= 0xDFFF:
            continue
        c = chr(cp)
        raw = ud.decomposition(c)
        if ud.combining(c) or (raw and not raw.startswith("<")):
            probes += [c, "a" + c + "\u0334", c + "\u0301", "\u0301" + c + "\u0316", "e" + c + "\u0323\u0302"]
            parts = raw.split() if raw and not raw.startswith("<") else []
            if len(parts) == 2:
                probes.append("".join(chr(int(p, 16)) for p in parts))
    probes += ["\u1100\u1161\u11a8", "\uac00\u11a8", "\u1100\u1161\u0301\u11a8", "\ud55c\u11af"]
    assert len(probes) > 10_000
    bad = []
    for k in range(0, len(probes), 500):
        batch = probes[k:k + 500]
        text = "\n".join(batch)
        if nfc(text) != ref.normalize_str(text):
            bad += [p for p in batch if nfc(p) != ref.normalize_str(p)]
    assert not bad, f"{len(bad)} probes differ, e.g. {[p.encode('unicode_escape') for p in bad[:5]]}"


def test_nfc_of_adversarial_marks_is_linear(lib) -> None:
    """A prompt that is one run of combining marks in descending class order (each mark must
    move past all before it in an insertion sort): the work for 1 MiB is about 16 times that for
    64 KiB (generous bound 24x), not 256 times; the output is NFC all the same."""
    from tokenizers import normalizers

    nfc, c = _nfc_tokenizer(lib)
    unit = "\u0301\u0316\u0334\u05b0"  # classes 230, 220, 1, 10: every pair out of order somewhere

    def work(nbytes: int) -> int:
        text = "a" + unit * (nbytes // len(unit.encode()))
        c.work(reset=True)
        out = nfc(text)
        w = c.work(reset=True)
        assert out == normalizers.NFC().normalize_str(text)
        return w

    small, big = work(64 << 10), work(1 << 20)
    assert big < 24 * small, (small, big)
    assert big < 40 * (1 << 20), big  # a few steps per byte
