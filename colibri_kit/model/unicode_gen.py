"""Generate the tokenizer's Unicode tables (runtime/src/text/unicode_tables.c).

    python -m colibri_kit.model.unicode_gen            # rewrite the C file
    python -m colibri_kit.model.unicode_gen --check    # exit 1 when the committed file is stale

The C tokenizer must split and normalise text exactly as the pinned `tokenizers` 0.23.3 does, and
that library takes its Unicode data from two places of two different ages:

- **The pre-tokenizer regexes** run on Oniguruma (the Rust crate `onig` 6.5.3, compiled into the
  wheel; its bundled Oniguruma is 6.9.10, whose release notes say "Update Unicode version
  16.0.0"). Checked on the installed wheel: letters added in 15.0 (Kawi), 15.1 (CJK Extension I)
  and 16.0 (Garay, Todhri, Sunuwar) are ``\\p{L}``; those added in 17.0 (Sidetic, CJK Extension J)
  are not. So the classes are **Unicode 16.0.0**: ``\\p{L}`` = Lu Ll Lt Lm Lo, ``\\p{M}`` = Mn Mc
  Me, ``\\p{N}`` = Nd Nl No, ``\\s`` = U+0009..U+000D, U+0085 and Zs Zl Zp (Oniguruma's ``\\s``
  for Unicode encodings). o200k's case classes need Lu/Lt, Ll and Lm/Lo apart, so a code point is
  one of seven classes (OTHER, SPACE, NUMBER, UPPER = Lu Lt, LOWER = Ll, LETTER = Lm Lo, MARK).
- **The NFC normalizer** is the crate `unicode-normalization-alignments` 0.1.12 (a 2019 fork of
  `unicode-normalization`), whose tables are **Unicode 9.0.0**: it composes and reorders every
  mark of 9.0 and none added in 10.0 or later (U+0D3B of 10.0 and U+1E4EC of 15.0 are left in
  place). NFC data (combining class, canonical decomposition, composition exclusion) never change
  for an assigned character (Unicode's normalization stability policy), so the 9.0 tables are the
  16.0 data of the code points whose Age is 9.0 or earlier.

The source is `unicodedataplus` 16.0.0.post1 (PyPI, the test extra): CPython's ``unicodedata``
rebuilt from the Unicode 16.0.0 database, plus the Age property. Characters newer than these
versions: a letter, digit or mark added after 16.0 is OTHER (as Oniguruma 6.9.10 sees it), and NFC
leaves every character added after 9.0 as it is (as the crate does). Tests compare the committed
file with a fresh generation, and the C NFC with `tokenizers`' own NFC on every code point these
tables describe (tests/test_tokenizer_unicode.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[2] / "runtime" / "src" / "text" / "unicode_tables.c"
CLASS_VERSION = "16.0.0"  # Oniguruma 6.9.10 (tokenizers' regex engine)
NFC_VERSION = "9.0.0"     # unicode-normalization-alignments 0.1.12 (tokenizers' NFC)
MAX_CP = 0x110000
HANGUL_S0, HANGUL_SN = 0xAC00, 11172

# class values (bits 0-2 of the property byte); keep in step with runtime/src/text/tokenizer.c
OTHER, SPACE, NUMBER, UPPER, LOWER, LETTER, MARK = 0, 1, 2, 3, 4, 5, 6
NFC_MAYBE = 8  # may change under NFC (9.0 data): decomposes, ccc != 0, or composes with a previous char
_CATEGORY_CLASS = {"Lu": UPPER, "Lt": UPPER, "Ll": LOWER, "Lm": LETTER, "Lo": LETTER,
                   "Mn": MARK, "Mc": MARK, "Me": MARK, "Nd": NUMBER, "Nl": NUMBER, "No": NUMBER,
                   "Zs": SPACE, "Zl": SPACE, "Zp": SPACE}


def unicode_data() -> Any:
    """`unicodedataplus` of Unicode 16.0.0 (pyproject.toml's test extra installs it)."""
    try:
        import unicodedataplus
    except ImportError:
        raise SystemExit("unicode_gen needs unicodedataplus==16.0.0.post1 (pip install '.[test]')") from None
    if unicodedataplus.unidata_version != CLASS_VERSION:
        raise SystemExit(f"unicode_gen needs the Unicode {CLASS_VERSION} database; unicodedataplus has "
                         f"{unicodedataplus.unidata_version} (pip install unicodedataplus==16.0.0.post1)")
    return unicodedataplus


def _version(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in v.split("."))


def char_class(ud: Any, cp: int) -> int:
    if 0x09 <= cp <= 0x0D or cp == 0x85:
        return SPACE
    return _CATEGORY_CLASS.get(ud.category(chr(cp)), OTHER)


def nfc_code_points(ud: Any) -> bytearray:
    """1 for each code point assigned in Unicode NFC_VERSION or earlier (its Age)."""
    limit = _version(NFC_VERSION)
    mask = bytearray(MAX_CP)
    for cp in range(MAX_CP):
        age = ud.age(chr(cp))
        if age != "Unassigned" and _version(age) <= limit:
            mask[cp] = 1
    return mask


def canonical_decomposition(ud: Any, cp: int) -> list[int]:
    """Full canonical decomposition (no compatibility mappings), Hangul excluded."""
    raw = ud.decomposition(chr(cp))
    if not raw or raw.startswith("<") or HANGUL_S0 <= cp < HANGUL_S0 + HANGUL_SN:
        return []
    out: list[int] = []
    for part in raw.split():
        c = int(part, 16)
        sub = canonical_decomposition(ud, c)
        out.extend(sub if sub else [c])
    return out


def compositions(ud: Any, in_nfc: bytearray) -> dict[tuple[int, int], int]:
    """Primary composites among the NFC code points: a two-character canonical decomposition
    that NFC recomposes (composition exclusions and singletons fail ``NFC(c) == c``)."""
    pairs: dict[tuple[int, int], int] = {}
    for cp in range(MAX_CP):
        if not in_nfc[cp]:
            continue
        raw = ud.decomposition(chr(cp))
        if not raw or raw.startswith("<"):
            continue
        parts = [int(p, 16) for p in raw.split()]
        if len(parts) == 2 and ud.normalize("NFC", chr(cp)) == chr(cp):
            pairs[(parts[0], parts[1])] = cp
    return pairs


def generate() -> str:
    ud = unicode_data()
    in_nfc = nfc_code_points(ud)
    comps = compositions(ud, in_nfc)
    seconds = {b for (_, b) in comps}
    records: dict[tuple[int, int], int] = {}
    per_cp = bytearray(MAX_CP)
    decomp: list[tuple[int, list[int]]] = []
    for cp in range(MAX_CP):
        flags = char_class(ud, cp)
        ccc = 0
        if in_nfc[cp]:
            ccc = ud.combining(chr(cp))
            d = canonical_decomposition(ud, cp)
            if d:
                decomp.append((cp, d))
            if (d or ccc or cp in seconds or HANGUL_S0 <= cp < HANGUL_S0 + HANGUL_SN
                    or 0x1161 <= cp <= 0x11C2):
                flags |= NFC_MAYBE
        key = (flags, ccc)
        if key not in records:
            records[key] = len(records)
        per_cp[cp] = records[key]
    assert len(records) <= 256
    # two-stage table: stage1[cp >> 8] -> block, stage2[block * 256 + (cp & 255)] -> record
    blocks: dict[bytes, int] = {}
    stage1: list[int] = []
    for hi in range(MAX_CP >> 8):
        blk = bytes(per_cp[hi << 8: (hi + 1) << 8])
        if blk not in blocks:
            blocks[blk] = len(blocks)
        stage1.append(blocks[blk])
    lines = [
        "/* GENERATED by colibri_kit/model/unicode_gen.py from unicodedataplus: do not edit. Regenerate:",
        " *     python -m colibri_kit.model.unicode_gen",
        f" * Character classes: Unicode {CLASS_VERSION}, as the `tokenizers` regex engine (Oniguruma 6.9.10).",
        f" * NFC data: Unicode {NFC_VERSION}, as the `tokenizers` NFC normalizer (unicode-normalization-alignments).",
        " * docs/runtime.md \"Tokenizer\" says what characters newer than these versions do. */",
        "#include <stdint.h>",
        "",
        '#include "tokenizer.h"',
        "",
        f'const char colibri_unicode_version[] = "{CLASS_VERSION}";',
        f'const char colibri_unicode_nfc_version[] = "{NFC_VERSION}";',
        "",
        "/* record: class (bits 0-2: 0 other, 1 space, 2 number, 3 upper Lu/Lt, 4 lower Ll, 5 letter Lm/Lo,",
        " * 6 mark) | 8 (may change under NFC), then the canonical combining class */",
        f"const uint8_t colibri_uc_records[{len(records)}][2] = {{",
    ]
    for (flags, ccc), _ in sorted(records.items(), key=lambda kv: kv[1]):
        lines.append(f"    {{{flags}, {ccc}}},")
    lines.append("};")
    lines.append(f"const uint16_t colibri_uc_stage1[{len(stage1)}] = {{")
    lines += _wrap(stage1)
    lines.append("};")
    lines.append(f"const uint8_t colibri_uc_stage2[{len(blocks) * 256}] = {{")
    for blk in blocks:
        lines += _wrap(list(blk))
    lines.append("};")
    pool: list[int] = []
    lines.append(f"const uint32_t colibri_uc_ndecomp = {len(decomp)};")
    lines.append("/* code point, offset into the pool, length; sorted by code point */")
    lines.append(f"const uint32_t colibri_uc_decomp[{len(decomp)}][3] = {{")
    for cp, d in decomp:
        lines.append(f"    {{0x{cp:X}, {len(pool)}, {len(d)}}},")
        pool += d
    lines.append("};")
    lines.append(f"const uint32_t colibri_uc_decomp_pool[{len(pool)}] = {{")
    lines += _wrap([f"0x{x:X}" for x in pool])
    lines.append("};")
    lines.append(f"const uint32_t colibri_uc_ncomp = {len(comps)};")
    lines.append("/* (first << 21 | second), composite; sorted by key */")
    lines.append(f"const uint64_t colibri_uc_comp[{len(comps)}][2] = {{")
    for (a, b), c in sorted(comps.items(), key=lambda kv: (kv[0][0] << 21) | kv[0][1]):
        lines.append(f"    {{0x{(a << 21) | b:X}ull, 0x{c:X}}},")
    lines.append("};")
    return "\n".join(lines) + "\n"


def _wrap(values: list[object], per_line: int = 16) -> list[str]:
    return ["    " + ", ".join(str(v) for v in values[i: i + per_line]) + ","
            for i in range(0, len(values), per_line)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the committed file, do not write")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args(argv)
    text = generate()
    if args.check:
        same = args.out.exists() and args.out.read_text() == text
        print(f"{args.out}: {'up to date' if same else 'STALE (regenerate it)'}")
        return 0 if same else 1
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out} (classes Unicode {CLASS_VERSION}, NFC Unicode {NFC_VERSION})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
