"""The checkpoint's tokenizer -> the `tokenizer.*` blobs of a `.colibri` file (docs/format.md).

Reads ``tokenizer.json`` (the `tokenizers` library's serialisation), or, where only a
SentencePiece ``tokenizer.model`` exists, that (colibri_kit/model/tokenizer_sp.py), plus
``tokenizer_config.json`` and ``generation_config.json``. When a checkpoint has both,
tokenizer.json wins: it is what transformers' tokenizer (and so its generation) uses. Only the
configurations the supported families really use are accepted; anything else fails naming the key
and the supported values:

- byte-level BPE: NFC (or none) + Split(regex, Isolated) + ByteLevel, with the regex of Qwen2 /
  Qwen3-MoE, Llama-3, o200k (gpt-oss, o200k_harmony: case classes, contractions as a suffix,
  ``\\p{N}{1,3}``) or Qwen3.5 (``\\p{M}`` inside words); OLMoE, GPT-NeoX style: NFC +
  ByteLevel(use_regex) with the GPT-2 regex; decoder ByteLevel;
- SentencePiece-style BPE (Mixtral / Llama): normalizer Prepend("▁") + Replace(" ", "▁") or a
  Metaspace pre-tokenizer, byte_fallback, fuse_unk, decoder Replace("▁", " ") + ByteFallback +
  Fuse + Strip(" ", 1, 0).

The C tokenizer (runtime/src/text/tokenizer.c) reproduces the `tokenizers` library's ids exactly on
these configurations, and SentencePiece's own ids for a tokenizer.model (tests/test_tokenizer*.py).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any

from colibri_kit.errors import ModelError
from colibri_kit.model.checkpoint_files import MAX_JSON_BYTES, read_json_object
from colibri_kit.model.tokenizer_spec import *  # noqa: F403 (the spec's names are this module's API too)
from colibri_kit.model.tokenizer_spec import _B2U, _U2B, _is_byte_token, _opt, special_ids
from colibri_kit.model.tokenizer_sp import SentencePieceReference, spec_from_sentencepiece

# ----------------------------------------------------------------------------------------------
# tokenizer.json


def _bad(key: str, value: Any, supported: str) -> ModelError:
    try:
        shown = json.dumps(value)[:120]
    except (ValueError, RecursionError):  # a huge integer or a deep value: say what it is
        shown = type(value).__name__
    return ModelError(f"tokenizer.json key {key}: {shown} is not supported; supported: {supported}")


def _parse_normalizer(n: Any) -> int:
    sup = 'null, {"type": "NFC"}, or Sequence[Prepend("▁"), Replace(" " -> "▁")]'
    if n is None:
        return NORM_NONE
    if not isinstance(n, dict):
        raise _bad("normalizer", n, sup)
    if n.get("type") == "NFC":
        return NORM_NFC
    if n.get("type") == "Sequence":
        steps = n.get("normalizers")
        if isinstance(steps, list) and len(steps) == 1:
            return _parse_normalizer(steps[0])
        if (isinstance(steps, list) and len(steps) == 2 and steps[0] == {"type": "Prepend", "prepend": SP}
                and isinstance(steps[1], dict) and steps[1].get("type") == "Replace" and steps[1].get("pattern") == {"String": " "}
                and steps[1].get("content") == SP):
            return NORM_SP
        raise _bad("normalizer.normalizers", steps, sup)
    raise _bad("normalizer.type", n.get("type"), sup)


def _byte_level_ok(b: dict[str, Any], key: str, use_regex: bool) -> None:
    if b.get("add_prefix_space", False):
        raise _bad(f"{key}.add_prefix_space", True, "false")
    if bool(b.get("use_regex", True)) != use_regex:
        raise _bad(f"{key}.use_regex", b.get("use_regex", True), str(use_regex).lower() + " here")


def _parse_pre_tokenizer(p: Any) -> tuple[int, int]:
    sup = ("null (SentencePiece-style), Metaspace(\"▁\", split=false), ByteLevel(use_regex=true, "
           "add_prefix_space=false) (GPT-2 regex), or Sequence[Split(Regex=<the Qwen2, Llama-3, o200k "
           "or Qwen3.5 regex>, behavior=Isolated), ByteLevel(use_regex=false)]")
    if p is None:
        return PRETOK_NONE, 0
    if not isinstance(p, dict):
        raise _bad("pre_tokenizer", p, sup)
    if p.get("type") == "Metaspace":  # what transformers 5 writes for Llama/Mixtral tokenizers
        if p.get("replacement") != SP:
            raise _bad("pre_tokenizer.replacement", p.get("replacement"), '"▁"')
        if p.get("split", True):
            raise _bad("pre_tokenizer.split", p.get("split", True), "false")
        scheme = p.get("prepend_scheme")
        if scheme is None:  # tokenizers < 0.15 wrote add_prefix_space
            scheme = "always" if p.get("add_prefix_space", True) else "never"
        schemes = {"always": META_ALWAYS, "first": META_FIRST, "never": META_NEVER}
        if scheme not in schemes:
            raise _bad("pre_tokenizer.prepend_scheme", scheme, "always, first, never")
        return PRETOK_METASPACE, schemes[scheme]
    if p.get("type") == "ByteLevel":
        _byte_level_ok(p, "pre_tokenizer", True)
        return PRETOK_GPT2, 0
    if p.get("type") == "Sequence":
        steps = p.get("pretokenizers")
        if not (isinstance(steps, list) and len(steps) == 2 and isinstance(steps[0], dict)
                and isinstance(steps[1], dict)):
            raise _bad("pre_tokenizer.pretokenizers", steps, sup)
        split, bl = steps
        if split.get("type") != "Split":
            raise _bad("pre_tokenizer.pretokenizers[0].type", split.get("type"), "Split")
        pattern = split.get("pattern")
        regex = pattern.get("Regex") if isinstance(pattern, dict) else None
        if not isinstance(regex, str) or regex not in SPLIT_REGEXES:
            raise _bad("pre_tokenizer.pretokenizers[0].pattern", pattern,
                       "the Qwen2, Llama-3, o200k or Qwen3.5 regex (colibri_kit/model/tokenizer.py)")
        if split.get("behavior") != "Isolated" or split.get("invert", False):
            raise _bad("pre_tokenizer.pretokenizers[0].behavior", split.get("behavior"), "Isolated, invert false")
        if bl.get("type") != "ByteLevel":
            raise _bad("pre_tokenizer.pretokenizers[1].type", bl.get("type"), "ByteLevel")
        _byte_level_ok(bl, "pre_tokenizer.pretokenizers[1]", False)
        return SPLIT_REGEXES[regex]
    raise _bad("pre_tokenizer.type", p.get("type"), sup)


SP_DECODER = [{"type": "Replace", "pattern": {"String": SP}, "content": " "}, {"type": "ByteFallback"},
              {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]


def _parse_decoder(d: Any) -> int:
    sup = "ByteLevel, or Sequence[Replace(\"▁\" -> \" \"), ByteFallback, Fuse, Strip(\" \", 1, 0)]"
    if isinstance(d, dict) and d.get("type") == "ByteLevel":
        return DEC_BYTE_LEVEL
    if isinstance(d, dict) and d.get("type") == "Sequence":
        if d.get("decoders") == SP_DECODER:
            return DEC_SP
        raise _bad("decoder.decoders", d.get("decoders"), sup)
    raise _bad("decoder" if not isinstance(d, dict) else "decoder.type",
               d if not isinstance(d, dict) else d.get("type"), sup)


def _parse_post(p: Any, vocab_of: dict[str, int]) -> tuple[int, int, int]:
    """-> (flags F_ADD_BOS/F_ADD_EOS, bos id, eos id) from the post-processor."""
    sup = "null, ByteLevel, TemplateProcessing(single = [special?] $A [special?]), or a Sequence of them"
    if p is None or (isinstance(p, dict) and p.get("type") == "ByteLevel"):
        return 0, NO_ID, NO_ID
    if not isinstance(p, dict):
        raise _bad("post_processor", p, sup)
    if p.get("type") == "Sequence":
        flags, bos, eos = 0, NO_ID, NO_ID
        for sub in p.get("processors") or []:
            f, b, e = _parse_post(sub, vocab_of)
            flags |= f
            bos = b if b != NO_ID else bos
            eos = e if e != NO_ID else eos
        return flags, bos, eos
    if p.get("type") != "TemplateProcessing":
        raise _bad("post_processor.type", p.get("type"), sup)
    single = p.get("single") or []
    if not isinstance(single, list) or not all(
            isinstance(x, dict) and (isinstance(x.get("Sequence"), dict) or isinstance(x.get("SpecialToken"), dict))
            for x in single):
        raise _bad("post_processor.single", single, sup)
    kinds = ["A" if "Sequence" in s else "S" for s in single]
    if kinds not in (["A"], ["S", "A"], ["A", "S"], ["S", "A", "S"]):
        raise _bad("post_processor.single", single, sup)
    flags, bos, eos = 0, NO_ID, NO_ID
    specials = p.get("special_tokens") or {}
    if not isinstance(specials, dict):
        raise _bad("post_processor.special_tokens", specials, "an object name -> {ids}")

    def sid(item: dict[str, Any]) -> int:
        name = item["SpecialToken"].get("id")
        entry = specials.get(name) if isinstance(name, str) else None
        ids = (entry.get("ids") if isinstance(entry, dict) else None) or []
        if not isinstance(ids, list) or len(ids) != 1:
            if isinstance(name, str) and name in vocab_of:
                return vocab_of[name]
            raise _bad("post_processor.special_tokens", name, "one id per special token")
        if not isinstance(ids[0], int) or isinstance(ids[0], bool) or not 0 <= ids[0] < MAX_IDS:
            raise _bad(f"post_processor.special_tokens[{name!r}].ids", ids, f"one id below {MAX_IDS}")
        return ids[0]

    if kinds[0] == "S":
        flags |= F_ADD_BOS
        bos = sid(single[0])
    if kinds[-1] == "S":
        flags |= F_ADD_EOS
        eos = sid(single[-1])
    return flags, bos, eos


def _piece_bytes(s: str, byte_level: bool) -> bytes:
    if byte_level and all(c in _U2B for c in s):
        return bytes(_U2B[c] for c in s)
    return s.encode("utf-8")


def spec_from_tokenizer_json(tj: dict[str, Any], tok_config: dict[str, Any] | None = None,
                             gen_config: dict[str, Any] | None = None) -> TokenizerSpec:
    """Validate a parsed tokenizer.json and build the spec; ModelError names the first bad key."""
    if not isinstance(tj, dict):
        raise ModelError("tokenizer.json: not a JSON object")
    m = tj.get("model")
    if not isinstance(m, dict):
        raise _bad("model", m, "an object with type BPE")
    if m.get("type", "BPE") != "BPE":
        raise _bad("model.type", m.get("type"), "BPE")
    if m.get("dropout") not in (None, 0, 0.0):
        raise _bad("model.dropout", m.get("dropout"), "null")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if m.get(key) not in (None, ""):
            raise _bad(f"model.{key}", m.get(key), 'null or ""')
    norm = _parse_normalizer(tj.get("normalizer"))
    pre, digits = _parse_pre_tokenizer(tj.get("pre_tokenizer"))
    dec = _parse_decoder(tj.get("decoder"))
    if pre in BYTE_LEVEL_PRETOKS:
        model_kind = MODEL_BYTE_BPE
        if norm not in (NORM_NONE, NORM_NFC):
            raise _bad("normalizer", tj.get("normalizer"), "null or NFC with a ByteLevel pre-tokenizer")
        if dec != DEC_BYTE_LEVEL:
            raise _bad("decoder", tj.get("decoder"), "ByteLevel with a ByteLevel pre-tokenizer")
        if m.get("byte_fallback"):
            raise _bad("model.byte_fallback", True, "false with a ByteLevel pre-tokenizer")
    else:
        model_kind = MODEL_SP_BPE
        if pre == PRETOK_NONE and norm != NORM_SP:
            raise _bad("normalizer", tj.get("normalizer"),
                       'Sequence[Prepend("▁"), Replace(" " -> "▁")] without a pre-tokenizer')
        if pre == PRETOK_METASPACE and norm != NORM_NONE:
            raise _bad("normalizer", tj.get("normalizer"), "null with a Metaspace pre-tokenizer")
        if dec != DEC_SP:
            raise _bad("decoder", tj.get("decoder"), "the SentencePiece decoder sequence")
    vocab_in = m.get("vocab")
    if not isinstance(vocab_in, dict) or not vocab_in:
        raise _bad("model.vocab", type(vocab_in).__name__, "a non-empty object piece -> id")
    byte_level = model_kind == MODEL_BYTE_BPE
    added_in = tj.get("added_tokens") or []
    if not isinstance(added_in, list):
        raise _bad("added_tokens", added_in, "a list")
    # every id is checked before anything is sized by it (an id of 2**40 must not allocate)
    for piece, i in vocab_in.items():
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < MAX_IDS or not isinstance(piece, str):
            raise _bad("model.vocab", {str(piece)[:40]: i if not isinstance(i, int) or abs(i) < 10**30 else "huge"},
                       f"string -> integer id in 0..{MAX_IDS - 1}")
    if len(added_in) > MAX_ADDED:
        raise _bad("added_tokens", f"{len(added_in)} entries", f"at most {MAX_ADDED} added tokens")
    for k, a in enumerate(added_in):
        i = a.get("id") if isinstance(a, dict) else None
        if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < MAX_IDS:
            raise _bad(f"added_tokens[{k}].id", i if not isinstance(i, int) or abs(i) < 10**30 else "huge",
                       f"an integer id in 0..{MAX_IDS - 1}")
    n = 1 + max(list(vocab_in.values()) + [a["id"] for a in added_in])
    vocab: list[bytes] = [b""] * n
    vflags = [0] * n
    names: list[str | None] = [None] * n
    for piece, i in vocab_in.items():
        if names[i] is not None:
            raise _bad("model.vocab", {piece: i}, "one piece per id")
        names[i] = piece
        vocab[i] = _piece_bytes(piece, byte_level)
        vflags[i] = V_IN_MODEL | (V_BYTE if (not byte_level and _is_byte_token(piece)) else 0)
    added: list[AddedToken] = []
    for k, a in enumerate(added_in):
        if not isinstance(a.get("content"), str) or not a["content"]:
            raise _bad(f"added_tokens[{k}].content", a.get("content"), "a non-empty string")
        if a.get("single_word"):
            raise _bad(f"added_tokens[{k}].single_word", True, "false (no supported family uses it)")
        i, content = a["id"], a["content"]
        if names[i] is not None and names[i] != content:
            raise _bad(f"added_tokens[{k}]", a, "an id that is free or holds the same piece")
        flags = ((A_SPECIAL if a.get("special") else 0) | (A_LSTRIP if a.get("lstrip") else 0)
                 | (A_RSTRIP if a.get("rstrip") else 0) | (A_NORMALIZED if a.get("normalized", not a.get("special")) else 0))
        added.append(AddedToken(i, content, flags))
        if names[i] is None:
            names[i] = content
            vocab[i] = _piece_bytes(content, byte_level)
        vflags[i] |= V_ADDED | (V_SPECIAL if a.get("special") else 0)
    for i, v in enumerate(vocab):
        if len(v) > MAX_TOKEN_BYTES:
            raise _bad("model.vocab", names[i], f"pieces of at most {MAX_TOKEN_BYTES} bytes")
    vocab_of = {s: i for i, s in enumerate(names) if s is not None}
    merges: list[tuple[int, int, int]] = []
    merges_in = m.get("merges") or []
    if not isinstance(merges_in, list):
        raise _bad("model.merges", type(merges_in).__name__, "a list")
    for k, mg in enumerate(merges_in):
        if isinstance(mg, str):
            parts = mg.split(" ")
        elif isinstance(mg, list):
            parts = mg
        else:
            parts = []
        if len(parts) != 2 or any(not isinstance(p, str) for p in parts):
            raise _bad(f"model.merges[{k}]", mg, '"left right" or ["left", "right"]')
        left, right = parts
        try:
            ids = (vocab_in[left], vocab_in[right], vocab_in[left + right])
        except (KeyError, TypeError) as exc:
            raise _bad(f"model.merges[{k}]", mg, f"pieces that are in model.vocab (missing {exc})") from None
        merges.append(ids)
    flags = 0
    if m.get("byte_fallback"):
        flags |= F_BYTE_FALLBACK
    if m.get("fuse_unk"):
        flags |= F_FUSE_UNK
    if m.get("ignore_merges"):
        flags |= F_IGNORE_MERGES
    unk = m.get("unk_token")
    unk_id = NO_ID
    if unk is not None:
        if not isinstance(unk, str) or unk not in vocab_in:
            raise _bad("model.unk_token", unk, "a piece of model.vocab")
        unk_id = vocab_in[unk]
    pflags, bos_id, eos_id = _parse_post(tj.get("post_processor"), vocab_of)
    flags |= pflags
    flags, bos_id, eos_id, pad_id, stops = special_ids(flags, bos_id, eos_id, vocab_of, n, tok_config, gen_config)
    return TokenizerSpec(model=model_kind, normalizer=norm, pre_tokenizer=pre, digits=digits, decoder=dec,
                         flags=flags, unk_id=unk_id, bos_id=bos_id, eos_id=eos_id, pad_id=pad_id, vocab=vocab,
                         vocab_flags=vflags, merges=merges, added=added, stop_ids=stops,
                         strip=1 if dec == DEC_SP else 0)


def _read_json(path: Path, max_bytes: int = 16 << 20) -> dict[str, Any] | None:
    """An optional checkpoint JSON file: None when absent; refused when not a regular file."""
    if not os.path.lexists(path):
        return None
    return read_json_object(path, max_bytes)


def load_tokenizer(hf_dir: str | Path) -> TokenizerSpec | None:
    """The spec of the checkpoint's tokenizer, or None when it has neither tokenizer.json nor
    tokenizer.model (the model is then converted without one: `--ids` commands only).
    tokenizer.json wins when both exist (transformers' fast tokenizer reads it); a
    tokenizer.model alone is read as SentencePiece itself encodes (tokenizer_sp.py)."""
    d = Path(hf_dir)
    tok_config = _read_json(d / "tokenizer_config.json")
    gen_config = _read_json(d / "generation_config.json")
    tj = _read_json(d / "tokenizer.json", MAX_JSON_BYTES)
    try:
        if tj is None:
            if not os.path.lexists(d / "tokenizer.model"):
                return None
            return spec_from_sentencepiece(d / "tokenizer.model", tok_config, gen_config)
        return spec_from_tokenizer_json(tj, tok_config, gen_config)
    except ModelError as exc:
        raise ModelError(f"{d}: {exc}") from None


def describe_blobs(config: bytes | None) -> dict[str, Any] | None:
    """A short description of a stored tokenizer (for `invoke model-info`)."""
    if config is None or len(config) < 4 * CONFIG_WORDS:
        return None
    w = struct.unpack_from(f"<{CONFIG_WORDS}I", config)
    stops = list(struct.unpack_from(f"<{w[14]}I", config, 4 * CONFIG_WORDS)) if len(config) >= 4 * (CONFIG_WORDS + w[14]) else []
    return {"model": NAMES["model"].get(w[1], w[1]), "normalizer": NAMES["normalizer"].get(w[2], w[2]),
            "pre_tokenizer": NAMES["pre_tokenizer"].get(w[3], w[3]), "decoder": NAMES["decoder"].get(w[5], w[5]),
            "vocab": w[11], "merges": w[12], "added_tokens": w[13], "add_bos": bool(w[6] & F_ADD_BOS),
            "bos_id": _opt(w[8]), "eos_id": _opt(w[9]), "stop_ids": stops}


def tokenizer_metadata(hf_dir: str | Path, vocab_size: int) -> dict[str, bytes]:
    """The tokenizer.* blobs for a checkpoint whose model has ``vocab_size`` ids ({} when the
    checkpoint has no tokenizer: the file then runs `--ids` commands only)."""
    spec = load_tokenizer(hf_dir)
    if spec is None:
        return {}
    if len(spec.vocab) > vocab_size:
        raise ModelError(f"{hf_dir}: the tokenizer has {len(spec.vocab)} ids but the model's vocab_size is "
                         f"{vocab_size} (config.json); they must belong together")
    return spec.blobs()


# ----------------------------------------------------------------------------------------------
# Back from the blobs to a tokenizer.json (the `tokenizers` library as the workstation's reference)


def spec_from_blobs(blobs: dict[str, bytes]) -> TokenizerSpec:
    """Parse the ``tokenizer.*`` blobs back into a spec (ModelError naming the blob when one is
    missing, truncated or inconsistent)."""
    def blob(name: str) -> bytes:
        data = blobs.get(name)
        if data is None:
            raise ModelError(f"the model file has no {name} blob (no tokenizer: re-convert with one)")
        return data

    def bad(name: str, why: str) -> ModelError:
        return ModelError(f"{name}: {why}")

    cfg = blob("tokenizer.config")
    if len(cfg) < 4 * CONFIG_WORDS:
        raise bad("tokenizer.config", f"{len(cfg)} bytes, need at least {4 * CONFIG_WORDS}")
    w = struct.unpack_from(f"<{CONFIG_WORDS}I", cfg)
    if w[0] != CONFIG_VERSION:
        raise bad("tokenizer.config", f"version {w[0]}, this kit reads {CONFIG_VERSION}")
    n_vocab, n_merges, n_added, n_stop = w[11], w[12], w[13], w[14]
    if len(cfg) != 4 * (CONFIG_WORDS + n_stop):
        raise bad("tokenizer.config", f"{len(cfg)} bytes for {n_stop} stop ids")
    stops = list(struct.unpack_from(f"<{n_stop}I", cfg, 4 * CONFIG_WORDS))
    voc = blob("tokenizer.vocab")
    head = 4 + 4 * (n_vocab + 1) + n_vocab
    if len(voc) < head or struct.unpack_from("<I", voc)[0] != n_vocab:
        raise bad("tokenizer.vocab", f"does not hold the {n_vocab} pieces tokenizer.config names")
    offs = struct.unpack_from(f"<{n_vocab + 1}I", voc, 4)
    vflags = list(voc[4 + 4 * (n_vocab + 1):head])
    text = voc[head:]
    if offs[0] != 0 or offs[-1] != len(text) or any(a > b for a, b in zip(offs, offs[1:])):
        raise bad("tokenizer.vocab", "offsets are not 0..size, non-decreasing")
    vocab = [text[offs[i]:offs[i + 1]] for i in range(n_vocab)]
    mg = blob("tokenizer.merges")
    entry = 16 if w[6] & F_RANKED_MERGES else 12
    if len(mg) != entry * n_merges:
        raise bad("tokenizer.merges", f"{len(mg)} bytes for {n_merges} merges")
    rows = [struct.unpack_from(f"<{entry // 4}I", mg, entry * k) for k in range(n_merges)]
    merges = [r[:3] for r in rows]
    ranks = [r[3] for r in rows] if entry == 16 else None
    if ranks is not None and any(a > b for a, b in zip(ranks, ranks[1:])):
        raise bad("tokenizer.merges", "ranks are not non-decreasing")
    if any(i >= n_vocab for m in merges for i in m):
        raise bad("tokenizer.merges", f"an id is not below n_vocab {n_vocab}")
    ad = blob("tokenizer.added")
    if len(ad) < 16 * n_added:
        raise bad("tokenizer.added", f"{len(ad)} bytes for {n_added} added tokens")
    contents = ad[16 * n_added:]
    added = []
    for k in range(n_added):
        i, flags, at, ln = struct.unpack_from("<4I", ad, 16 * k)
        if i >= n_vocab or at + ln > len(contents) or not 1 <= ln <= MAX_TOKEN_BYTES:
            raise bad("tokenizer.added", f"entry {k} (id {i}, {at}+{ln}) is out of range")
        try:
            added.append(AddedToken(i, contents[at:at + ln].decode("utf-8"), flags))
        except UnicodeDecodeError:
            raise bad("tokenizer.added", f"entry {k} is not UTF-8") from None
    return TokenizerSpec(model=w[1], normalizer=w[2], pre_tokenizer=w[3], digits=w[4], decoder=w[5],
                         flags=w[6], unk_id=w[7], bos_id=w[8], eos_id=w[9], pad_id=w[10], vocab=vocab,
                         vocab_flags=vflags, merges=[tuple(m) for m in merges], added=added, merge_ranks=ranks,
                         stop_ids=stops, strip=w[15])


def tokenizer_json_from_blobs(blobs: dict[str, bytes]) -> dict[str, Any]:
    """The tokenizer.json (for ``tokenizers.Tokenizer.from_str``) that the stored blobs stand for.

    The inverse of :func:`spec_from_tokenizer_json` for the configurations it accepts: the
    library built from this encodes and decodes as the checkpoint's own tokenizer.json did, so
    the workstation can tokenize a prompt for a model file alone (``invoke smoke``). Pieces come
    back from bytes (byte-level: GPT-2's byte-to-character map again; SentencePiece: UTF-8)."""
    s = spec_from_blobs(blobs)
    byte_level = s.model == MODEL_BYTE_BPE
    if s.model not in (MODEL_BYTE_BPE, MODEL_SP_BPE):
        raise ModelError(f"tokenizer.config: model {s.model} is not one this kit knows")

    def piece(b: bytes) -> str:
        if byte_level:
            return "".join(_B2U[x] for x in b)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError:
            raise ModelError("tokenizer.vocab: a SentencePiece piece is not UTF-8") from None

    names = {i: piece(v) for i, v in enumerate(s.vocab) if s.vocab_flags[i] & V_IN_MODEL}
    added_of = {a.id: a.content for a in s.added}
    # a tokenizer.model's control pieces (<s>, [INST]) are in no table the encoder matches; as
    # special added tokens here they decode (and are skipped) as the C tokenizer does
    controls = [AddedToken(i, piece(v), A_SPECIAL) for i, v in enumerate(s.vocab)
                if s.vocab_flags[i] & V_SPECIAL and not s.vocab_flags[i] & (V_IN_MODEL | V_ADDED) and v]
    added_of.update({a.id: a.content for a in controls})

    def name(i: int) -> str:
        if i in added_of:
            return added_of[i]
        if i in names:
            return names[i]
        raise ModelError(f"tokenizer.config: id {i} is not a stored token")

    if s.normalizer == NORM_NFC:
        normalizer: Any = {"type": "NFC"}
    elif s.normalizer in (NORM_SP, NORM_SP_MODEL):  # SP_MODEL: decoding only (see reference_tokenizer)
        normalizer = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": SP}, {"type": "Replace", "pattern": {"String": " "}, "content": SP}]}
    elif s.normalizer == NORM_NONE:
        normalizer = None
    else:
        raise ModelError(f"tokenizer.config: normalizer {s.normalizer} is not one this kit knows")
    byte_pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    if s.pre_tokenizer == PRETOK_GPT2:
        pre: Any = byte_pre
    elif s.pre_tokenizer in (PRETOK_LLAMA3, PRETOK_O200K, PRETOK_QWEN35):
        regex = {v: k for k, v in SPLIT_REGEXES.items()}.get((s.pre_tokenizer, s.digits))
        if regex is None:
            raise ModelError(f"tokenizer.config: pre-tokenizer {s.pre_tokenizer} with digits {s.digits} is not "
                             "one of the Qwen2 (1), Llama-3 (3), o200k (3) or Qwen3.5 (1) regexes")
        pre = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False},
            {**byte_pre, "trim_offsets": False, "use_regex": False}]}
    elif s.pre_tokenizer == PRETOK_METASPACE:
        scheme = {META_ALWAYS: "always", META_FIRST: "first", META_NEVER: "never"}.get(s.digits)
        if scheme is None:
            raise ModelError(f"tokenizer.config: Metaspace prepend scheme {s.digits} is not 1, 2 or 3")
        pre = {"type": "Metaspace", "replacement": SP, "prepend_scheme": scheme, "split": False}
    elif s.pre_tokenizer == PRETOK_NONE:
        pre = None
    else:
        raise ModelError(f"tokenizer.config: pre_tokenizer {s.pre_tokenizer} is not one this kit knows")
    decoder = ({"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}
               if s.decoder == DEC_BYTE_LEVEL else {"type": "Sequence", "decoders": SP_DECODER})
    post: Any = ({"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
                 if byte_level else None)
    if s.flags & (F_ADD_BOS | F_ADD_EOS):
        bos = [name(s.bos_id)] if s.flags & F_ADD_BOS else []
        eos = [name(s.eos_id)] if s.flags & F_ADD_EOS else []

        def template(seq: str, type_id: int) -> list[Any]:
            return ([{"SpecialToken": {"id": t, "type_id": type_id}} for t in bos]
                    + [{"Sequence": {"id": seq, "type_id": type_id}}]
                    + [{"SpecialToken": {"id": t, "type_id": type_id}} for t in eos])
        ids = {name(i): i for i in (s.bos_id, s.eos_id) if i != NO_ID}
        post = {"type": "TemplateProcessing", "single": template("A", 0),
                "pair": template("A", 0) + template("B", 1),
                "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in bos + eos}}
    added = [{"id": a.id, "content": a.content, "single_word": False, "lstrip": bool(a.flags & A_LSTRIP),
              "rstrip": bool(a.flags & A_RSTRIP), "normalized": bool(a.flags & A_NORMALIZED),
              "special": bool(a.flags & A_SPECIAL)} for a in s.added + controls]
    return {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": normalizer, "pre_tokenizer": pre, "post_processor": post, "decoder": decoder,
        "model": {"type": "BPE", "dropout": None, "unk_token": None if s.unk_id == NO_ID else name(s.unk_id),
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": bool(s.flags & F_FUSE_UNK), "byte_fallback": bool(s.flags & F_BYTE_FALLBACK),
                  "ignore_merges": bool(s.flags & F_IGNORE_MERGES),
                  "vocab": {names[i]: i for i in sorted(names)},
                  "merges": [[name_in(names, a), name_in(names, b)] for a, b, _ in s.merges]},
    }


def name_in(names: dict[int, str], i: int) -> str:
    """The model-vocabulary piece of id ``i`` (ModelError when a merge names another id)."""
    if i not in names:
        raise ModelError(f"tokenizer.merges: id {i} is not in the BPE model's vocabulary")
    return names[i]


def reference_tokenizer(blobs: dict[str, bytes]) -> Any:
    """A tokenizer with the `tokenizers` interface (``encode(text).ids``, ``decode(ids,
    skip_special_tokens)``) equivalent to the stored one: a ``tokenizers.Tokenizer`` for what came
    from a tokenizer.json; for a SentencePiece tokenizer.model (ranked merges, which `tokenizers`
    cannot express) the kit's own implementation of SentencePiece's algorithm (tokenizer_sp.py)."""
    try:
        from tokenizers import Tokenizer
    except ImportError:
        raise ModelError("the text check needs the `tokenizers` package (pip install tokenizers)") from None
    spec = spec_from_blobs(blobs)
    if spec.flags & F_RANKED_MERGES or spec.normalizer == NORM_SP_MODEL:
        return SentencePieceReference(spec)
    return Tokenizer.from_str(json.dumps(tokenizer_json_from_blobs(blobs), ensure_ascii=False))
