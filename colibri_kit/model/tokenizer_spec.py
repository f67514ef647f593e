"""The tokenizer spec: what the `tokenizer.*` blobs of a `.colibri` file hold (docs/format.md),
the constants of their fields, and the pieces both readers of a checkpoint's tokenizer share
(tokenizer.py for tokenizer.json, tokenizer_sp.py for a SentencePiece tokenizer.model)."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import Any

from colibri_kit.errors import ModelError

# The pre-tokenizer regexes the families use, as they appear in tokenizer.json
# (pre_tokenizer.pretokenizers[0].pattern.Regex).
# Qwen2 / Qwen3-MoE (Qwen/Qwen1.5-MoE-A2.7B, Qwen/Qwen3-30B-A3B tokenizer.json); Llama-3 style differs
# only in \p{N}{1,3}.
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = QWEN2_REGEX.replace(r"|\p{N}|", r"|\p{N}{1,3}|")
# Qwen3.5 / Qwen3.6 (transformers' models/qwen3_5/tokenization_qwen3_5.py PRETOKENIZE_REGEX, the
# Split of the Qwen/Qwen3.5-* tokenizer.json): marks join letters, and leave the punctuation class.
QWEN35_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# o200k_base / o200k_harmony (tiktoken's openai_public.py pat_str; the Split of openai/gpt-oss-*
# tokenizer.json): an upper-case run then a lower-case run, contractions as a suffix, 1-3 digits.
O200K_REGEX = "|".join([
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"\p{N}{1,3}", r" ?[^\s\p{L}\p{N}]+[\r\n/]*", r"\s*[\r\n]+", r"\s+(?!\S)", r"\s+"])
# GPT-2's regex, which ByteLevel(use_regex=true) applies (OLMoE's GPT-NeoX-derived tokenizer).
GPT2_REGEX = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

MODEL_BYTE_BPE, MODEL_SP_BPE = 1, 2
# NORM_SP_MODEL: SentencePiece's own normalizer of a tokenizer.model (identity rules): "▁" before
# the text, spaces -> "▁", each invalid UTF-8 byte -> U+FFFD
NORM_NONE, NORM_NFC, NORM_SP, NORM_SP_MODEL = 0, 1, 2, 3
PRETOK_NONE, PRETOK_GPT2, PRETOK_LLAMA3, PRETOK_METASPACE, PRETOK_O200K, PRETOK_QWEN35 = 0, 1, 2, 3, 4, 5
SPLIT_REGEXES = {QWEN2_REGEX: (PRETOK_LLAMA3, 1), LLAMA3_REGEX: (PRETOK_LLAMA3, 3),
                 O200K_REGEX: (PRETOK_O200K, 3), QWEN35_REGEX: (PRETOK_QWEN35, 1)}  # -> (kind, digits)
BYTE_LEVEL_PRETOKS = (PRETOK_GPT2, PRETOK_LLAMA3, PRETOK_O200K, PRETOK_QWEN35)
META_ALWAYS, META_FIRST, META_NEVER = 1, 2, 3  # Metaspace prepend_scheme (config word 4)
DEC_BYTE_LEVEL, DEC_SP = 1, 2
# F_RANKED_MERGES: each merge carries its rank and ranks may repeat (SentencePiece: the pair of the
# higher score first, equal scores leftmost first); the merges blob then has 16-byte entries.
F_BYTE_FALLBACK, F_FUSE_UNK, F_ADD_BOS, F_ADD_EOS, F_IGNORE_MERGES, F_RANKED_MERGES = 1, 2, 4, 8, 16, 32
A_SPECIAL, A_LSTRIP, A_RSTRIP, A_NORMALIZED, A_SINGLE_WORD = 1, 2, 4, 8, 16
V_IN_MODEL, V_BYTE, V_ADDED, V_SPECIAL = 1, 2, 4, 8
NO_ID = 0xFFFFFFFF
CONFIG_VERSION = 1
CONFIG_WORDS = 24  # fixed part of tokenizer.config, then n_stop stop ids
MAX_TOKEN_BYTES = 1024  # longest vocabulary entry / added token accepted (C checks the same)
MAX_IDS = 1 << 22  # token ids are below this (Gemma's 262,144 is the largest vocabulary today)
MAX_ADDED = 65536  # added tokens (C checks the same)
SP = "\u2581"  # ▁

NAMES = {
    "model": {MODEL_BYTE_BPE: "byte_level_bpe", MODEL_SP_BPE: "sentencepiece_bpe"},
    "normalizer": {NORM_NONE: "none", NORM_NFC: "nfc", NORM_SP: "prepend_replace_space",
                   NORM_SP_MODEL: "sentencepiece"},
    "pre_tokenizer": {PRETOK_NONE: "none", PRETOK_GPT2: "gpt2_regex", PRETOK_LLAMA3: "qwen2_llama3_regex",
                      PRETOK_METASPACE: "metaspace", PRETOK_O200K: "o200k_regex", PRETOK_QWEN35: "qwen3_5_regex"},
    "decoder": {DEC_BYTE_LEVEL: "byte_level", DEC_SP: "sentencepiece"},
}


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map (the ByteLevel pre-tokenizer's alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


_B2U = bytes_to_unicode()
_U2B = {c: b for b, c in _B2U.items()}


@dataclass
class AddedToken:
    id: int
    content: str
    flags: int


@dataclass
class TokenizerSpec:
    """Everything the runtime needs, in the form the blobs store it."""

    model: int
    normalizer: int
    pre_tokenizer: int
    digits: int  # max digits per number piece (pre_tokenizer qwen2_llama3_regex)
    decoder: int
    flags: int
    unk_id: int
    bos_id: int
    eos_id: int
    pad_id: int
    vocab: list[bytes]  # per id: the bytes the piece stands for (byte-level: un-mapped)
    vocab_flags: list[int]
    merges: list[tuple[int, int, int]]  # (left, right, merged), in rank order
    added: list[AddedToken]
    stop_ids: list[int] = field(default_factory=list)
    strip: int = 0  # decoder Strip: leading spaces removed
    merge_ranks: list[int] | None = None  # with F_RANKED_MERGES: non-decreasing, may repeat

    def blobs(self) -> dict[str, bytes]:
        cfg = [CONFIG_VERSION, self.model, self.normalizer, self.pre_tokenizer, self.digits, self.decoder,
               self.flags, self.unk_id, self.bos_id, self.eos_id, self.pad_id, len(self.vocab),
               len(self.merges), len(self.added), len(self.stop_ids), self.strip]
        cfg += [0] * (CONFIG_WORDS - len(cfg))
        config = struct.pack(f"<{CONFIG_WORDS}I", *cfg) + struct.pack(f"<{len(self.stop_ids)}I", *self.stop_ids)
        offs = [0]
        for v in self.vocab:
            offs.append(offs[-1] + len(v))
        vocab = (struct.pack("<I", len(self.vocab)) + struct.pack(f"<{len(offs)}I", *offs)
                 + bytes(self.vocab_flags) + b"".join(self.vocab))
        if self.flags & F_RANKED_MERGES:
            ranks = self.merge_ranks or []
            if len(ranks) != len(self.merges) or any(a > b for a, b in zip(ranks, ranks[1:])):
                raise ModelError("tokenizer: ranked merges need one non-decreasing rank per merge")
            merges = b"".join(struct.pack("<4I", *m, r) for m, r in zip(self.merges, ranks))
        else:
            merges = b"".join(struct.pack("<3I", *m) for m in self.merges)
        table, text, at = [], [], 0
        for a in self.added:
            raw = a.content.encode("utf-8")
            table.append(struct.pack("<4I", a.id, a.flags, at, len(raw)))
            text.append(raw)
            at += len(raw)
        added = b"".join(table) + b"".join(text)
        return {"tokenizer.config": config, "tokenizer.vocab": vocab, "tokenizer.merges": merges,
                "tokenizer.added": added}

    def describe(self) -> dict[str, Any]:
        return {
            "model": NAMES["model"][self.model], "normalizer": NAMES["normalizer"][self.normalizer],
            "pre_tokenizer": NAMES["pre_tokenizer"][self.pre_tokenizer], "decoder": NAMES["decoder"][self.decoder],
            "vocab": len(self.vocab), "merges": len(self.merges), "added_tokens": len(self.added),
            "special_tokens": [a.content for a in self.added if a.flags & A_SPECIAL][:8],
            "byte_fallback": bool(self.flags & F_BYTE_FALLBACK), "add_bos": bool(self.flags & F_ADD_BOS),
            "add_eos": bool(self.flags & F_ADD_EOS),
            "bos_id": _opt(self.bos_id), "eos_id": _opt(self.eos_id), "unk_id": _opt(self.unk_id),
            "stop_ids": self.stop_ids,
        }


def _opt(v: int) -> int | None:
    return None if v == NO_ID else v


def _is_byte_token(s: str) -> bool:
    if len(s) != 6 or not s.startswith("<0x") or not s.endswith(">"):
        return False
    try:
        int(s[3:5], 16)
    except ValueError:
        return False
    return True


def special_ids(flags: int, bos_id: int, eos_id: int, vocab_of: dict[str, int], n: int,
                tok_config: dict[str, Any] | None, gen_config: dict[str, Any] | None
                ) -> tuple[int, int, int, int, list[int]]:
    """BOS/EOS/PAD and the stop ids from tokenizer_config.json and generation_config.json, over
    what the tokenizer itself says: -> (flags, bos, eos, pad, stop ids)."""
    tc = tok_config or {}
    gc = gen_config or {}

    def token_id(value: Any, key: str) -> int:
        if isinstance(value, dict):
            value = value.get("content")
        if value is None:
            return NO_ID
        if not isinstance(value, str) or value not in vocab_of:
            raise ModelError(f"tokenizer_config.json key {key}: {str(value)[:80]!r} is not a token of the tokenizer")
        return vocab_of[value]

    if bos_id == NO_ID:
        bos_id = token_id(tc.get("bos_token"), "bos_token")
    if eos_id == NO_ID:
        eos_id = token_id(tc.get("eos_token"), "eos_token")
    pad_id = token_id(tc.get("pad_token"), "pad_token")
    # transformers lets tokenizer_config.json switch BOS/EOS on or off over the post-processor
    for key, bit in (("add_bos_token", F_ADD_BOS), ("add_eos_token", F_ADD_EOS)):
        if tc.get(key) is not None:
            if not isinstance(tc[key], bool):
                raise ModelError(f"tokenizer_config.json key {key}: {str(tc[key])[:40]!r} is not true or false")
            flags = (flags | bit) if tc[key] else (flags & ~bit)
    stops: list[int] = []
    v = gc.get("eos_token_id")
    for s in (v if isinstance(v, list) else [v] if v is not None else []):
        if not isinstance(s, int) or isinstance(s, bool) or not 0 <= s < n:
            shown = s if not isinstance(s, int) or abs(s) < 10**12 else "a huge integer"
            raise ModelError(f"generation_config.json key eos_token_id: {shown!r} is not a token id below {n}")
        if s not in stops:
            stops.append(s)
        if len(stops) > 1024:
            raise ModelError("generation_config.json key eos_token_id: more than 1024 stop ids")
    if not stops and eos_id != NO_ID:
        stops.append(eos_id)
    g_bos = gc.get("bos_token_id")
    if bos_id == NO_ID and isinstance(g_bos, int) and not isinstance(g_bos, bool):
        if not 0 <= g_bos < n:
            raise ModelError(f"generation_config.json key bos_token_id: {g_bos if abs(g_bos) < 10**12 else 'huge'} "
                             f"is not a token id below {n}")
        bos_id = g_bos
    if flags & F_ADD_BOS and bos_id == NO_ID:
        raise ModelError("tokenizer_config.json key add_bos_token: true, but there is no bos_token")
    if flags & F_ADD_EOS and eos_id == NO_ID:
        raise ModelError("tokenizer_config.json key add_eos_token: true, but there is no eos_token")
    return flags, bos_id, eos_id, pad_id, stops
