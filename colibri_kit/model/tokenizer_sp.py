"""A SentencePiece ``tokenizer.model`` (BPE, Llama/Mistral options) as SentencePiece encodes it.

Only where a checkpoint has no tokenizer.json (where both exist, tokenizer.json is read: it is
what transformers' tokenizer uses). What SentencePiece's BPE does (src/bpe_model.cc,
model_interface.cc, normalizer.cc of google/sentencepiece), and how it is stored:

- normalizer (identity rules, add_dummy_prefix, escape_whitespaces): "▁" before a non-empty
  text, each space -> "▁", each invalid UTF-8 byte -> U+FFFD; -> ``NORM_SP_MODEL``;
- the text is cut into characters, except that USER_DEFINED pieces are matched first (longest
  match) and then never merged ("frozen"); -> added tokens matched in the normalized text;
- the adjacent pair whose concatenation is a piece of the highest **score** merges first; equal
  scores merge the leftmost pair first; -> merges with ranks (``F_RANKED_MERGES``): rank = place
  of the merged piece's score among all scores, highest first, so equal scores share a rank and
  the C tokenizer breaks the tie by position as SentencePiece does. (Mistral's whitespace pieces
  ``▁▁``, ``▁▁▁▁``, ... all score -1e9: ranking them by id, as before, split runs differently.);
- CONTROL pieces (``<s>``, ``</s>``, ``[INST]``...) are never matched in text: typed "[INST]" is
  ordinary characters. They are stored as special ids (skipped by --skip-special), BOS is added
  as Llama/Mistral do (tokenizer_config.json ``add_bos_token`` can turn it off);
- a character that is not a piece becomes its UTF-8 bytes' ``<0xHH>`` pieces (byte_fallback),
  else the unknown id.

What transformers does differently with the same file (its LlamaTokenizer converts it to a
`tokenizers` BPE; checked with transformers 5.24 on Mistral's v1 and v3 models): merges get
strictly ordered ranks, so whitespace runs split otherwise (``"a  b"``: ``[1, 264, 259, 28726]``
vs SentencePiece's ``[1, 264, 28705, 287]``); control and user-defined pieces become added tokens
matched in the raw text (``"[INST] hi"`` -> ``[1, 3, ...]``); a text that starts with a space
gets no extra "▁" (``" leading"``: ``[1, 5374]`` vs ``[1, 28705, 5374]``). colibri follows
SentencePiece, whose ids the model was trained on.
"""

from __future__ import annotations

import heapq
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from colibri_kit.errors import ModelError
from colibri_kit.model.checkpoint_files import read_regular
from colibri_kit.model import tokenizer_spec as T

MAX_MODEL_BYTES = 64 << 20  # real SentencePiece models are 0.5-5 MB


def _proto(path: Path) -> Any:
    try:  # optional (the `sentencepiece` extra): only this path needs it
        from sentencepiece import sentencepiece_model_pb2 as pb
    except ImportError:
        raise ModelError(f"{path}: reading a SentencePiece tokenizer.model needs the `sentencepiece` and "
                         "`protobuf` packages (pip install '.[sentencepiece]'), or provide tokenizer.json") from None
    proto = pb.ModelProto()
    try:
        proto.ParseFromString(read_regular(path, MAX_MODEL_BYTES, "SentencePiece model"))
    except ModelError:
        raise
    except Exception as exc:  # noqa: BLE001 (protobuf raises its own DecodeError)
        raise ModelError(f"{path}: not a SentencePiece model ({exc})") from None
    return pb, proto


def _refuse(path: Path, key: str, value: Any, supported: str) -> ModelError:
    return ModelError(f"{path}: tokenizer.model key {key}: {value!r} is not supported; supported: {supported}")


def spec_from_sentencepiece(path: Path, tok_config: dict[str, Any] | None = None,
                            gen_config: dict[str, Any] | None = None) -> T.TokenizerSpec:
    """The spec of a SentencePiece BPE model with the identity normalizer (Llama, Mistral)."""
    pb, proto = _proto(path)
    ts, ns = proto.trainer_spec, proto.normalizer_spec
    kind = pb.ModelProto.SentencePiece
    if ts.model_type != pb.TrainerSpec.BPE:
        raise _refuse(path, "trainer_spec.model_type", pb.TrainerSpec.ModelType.Name(ts.model_type), "BPE")
    if ns.precompiled_charsmap or ns.name not in ("identity", ""):
        raise _refuse(path, "normalizer_spec.name", ns.name, "identity (Llama/Mistral)")
    if not ns.add_dummy_prefix or ns.remove_extra_whitespaces or not ns.escape_whitespaces:
        raise _refuse(path, "normalizer_spec.add_dummy_prefix/remove_extra_whitespaces/escape_whitespaces",
                      (ns.add_dummy_prefix, ns.remove_extra_whitespaces, ns.escape_whitespaces), "(True, False, True)")
    if ts.treat_whitespace_as_suffix:
        raise _refuse(path, "trainer_spec.treat_whitespace_as_suffix", True, "False")
    n = len(proto.pieces)
    if not 0 < n < T.MAX_IDS:
        raise _refuse(path, "pieces", f"{n} pieces", f"1..{T.MAX_IDS - 1}")
    vocab: list[bytes] = []
    vflags: list[int] = []
    added: list[T.AddedToken] = []
    mergeable: dict[str, int] = {}  # NORMAL and USER_DEFINED pieces: what merges look up
    unk_id = T.NO_ID
    for i, p in enumerate(proto.pieces):
        raw = p.piece.encode("utf-8")
        if not raw or len(raw) > T.MAX_TOKEN_BYTES:
            raise _refuse(path, f"pieces[{i}].piece", p.piece[:40], f"1..{T.MAX_TOKEN_BYTES} bytes")
        vocab.append(raw)
        if p.type == kind.NORMAL:
            vflags.append(T.V_IN_MODEL)
            mergeable.setdefault(p.piece, i)
        elif p.type == kind.USER_DEFINED:
            vflags.append(T.V_IN_MODEL | T.V_ADDED)
            mergeable.setdefault(p.piece, i)
            added.append(T.AddedToken(i, p.piece, T.A_NORMALIZED))
        elif p.type == kind.BYTE:
            if not T._is_byte_token(p.piece):
                raise _refuse(path, f"pieces[{i}].piece", p.piece, "<0xHH> for a BYTE piece")
            vflags.append(T.V_IN_MODEL | T.V_BYTE)
        elif p.type in (kind.CONTROL, kind.UNKNOWN):
            vflags.append(T.V_SPECIAL)
            if p.type == kind.UNKNOWN:
                unk_id = i
        else:  # UNUSED pieces are resegmented by SentencePiece; no supported model has any
            raise _refuse(path, f"pieces[{i}].type", kind.Type.Name(p.type),
                          "NORMAL, USER_DEFINED, BYTE, CONTROL, UNKNOWN")
    # every split of a mergeable piece into two mergeable pieces is a merge of that piece's score
    cand: list[tuple[float, int, int, int]] = []
    for piece, i in mergeable.items():
        score = proto.pieces[i].score
        for k in range(1, len(piece)):
            a, b = mergeable.get(piece[:k]), mergeable.get(piece[k:])
            if a is not None and b is not None:
                cand.append((-score, i, a, b))
    cand.sort()
    merges, ranks, rank, last = [], [], -1, None
    for neg, i, a, b in cand:
        if neg != last:
            rank, last = rank + 1, neg
        merges.append((a, b, i))
        ranks.append(rank)
    flags = T.F_RANKED_MERGES | (T.F_BYTE_FALLBACK if ts.byte_fallback else 0)
    bos = ts.bos_id if 0 <= ts.bos_id < n else T.NO_ID
    eos = ts.eos_id if 0 <= ts.eos_id < n else T.NO_ID
    if bos != T.NO_ID:
        flags |= T.F_ADD_BOS  # Llama/Mistral add BOS; tokenizer_config.json add_bos_token decides
    names = {p.piece: i for i, p in reversed(list(enumerate(proto.pieces)))}
    flags, bos, eos, pad, stops = T.special_ids(flags, bos, eos, names, n, tok_config, gen_config)
    return T.TokenizerSpec(model=T.MODEL_SP_BPE, normalizer=T.NORM_SP_MODEL, pre_tokenizer=T.PRETOK_NONE,
                           digits=0, decoder=T.DEC_SP, flags=flags, unk_id=unk_id, bos_id=bos, eos_id=eos,
                           pad_id=pad, vocab=vocab, vocab_flags=vflags, merges=merges, added=added,
                           stop_ids=stops, strip=1, merge_ranks=ranks)


class SentencePieceReference:
    """SentencePiece's BPE in Python on a spec (for the workstation's reference, `invoke smoke`,
    and to check the C tokenizer on its own): ``encode(text).ids`` as sentencepiece's
    ``[bos] + encode(text)``; ``decode`` as the C tokenizer's SentencePiece decoder (pieces with
    "▁" as spaces, runs of byte pieces as their bytes when valid UTF-8, else U+FFFD each, one
    leading space dropped; control pieces shown unless skipped)."""

    def __init__(self, spec: T.TokenizerSpec) -> None:
        self.spec = spec
        self.piece_id = {v: i for i, v in enumerate(spec.vocab)
                         if spec.vocab_flags[i] & T.V_IN_MODEL and not spec.vocab_flags[i] & T.V_BYTE}
        self.byte_id = {int(v[3:5], 16): i for i, v in enumerate(spec.vocab) if spec.vocab_flags[i] & T.V_BYTE}
        ranks = spec.merge_ranks or list(range(len(spec.merges)))
        self.merge = {(a, b): (r, c) for (a, b, c), r in zip(spec.merges, ranks)}
        self.user = sorted((a.content.encode("utf-8"), a.id) for a in spec.added)

    def _match_user(self, s: bytes, i: int) -> tuple[int, int] | None:
        best = None
        for text, tid in self.user:  # few (Mistral v3: 20); longest match at i
            if s.startswith(text, i) and (best is None or len(text) > best[0]):
                best = (len(text), tid)
        return best

    def encode(self, text: str, add_special_tokens: bool = True) -> SimpleNamespace:
        ids: list[int] = []
        if add_special_tokens and self.spec.flags & T.F_ADD_BOS:
            ids.append(self.spec.bos_id)
        if text:
            norm = ("\u2581" + text.replace(" ", "\u2581")).encode("utf-8")
            word, i = [], 0
            while i < len(norm):
                m = self._match_user(norm, i)
                if m:
                    ids += self._bpe(word)
                    word = []
                    ids.append(m[1])
                    i += m[0]
                    continue
                n = 1 if norm[i] < 0x80 else 2 if norm[i] < 0xE0 else 3 if norm[i] < 0xF0 else 4
                word.append(norm[i:i + n])
                i += n
            ids += self._bpe(word)
        if add_special_tokens and self.spec.flags & T.F_ADD_EOS:
            ids.append(self.spec.eos_id)
        return SimpleNamespace(ids=ids)

    def _bpe(self, chars: list[bytes]) -> list[int]:
        sym: list[int] = []
        for c in chars:
            if c in self.piece_id:
                sym.append(self.piece_id[c])
            elif self.spec.flags & T.F_BYTE_FALLBACK and all(b in self.byte_id for b in c):
                sym += [self.byte_id[b] for b in c]
            else:
                sym.append(self.spec.unk_id)
        nxt = list(range(1, len(sym))) + [-1]
        prv = list(range(-1, len(sym) - 1))
        alive = [True] * len(sym)
        heap = []
        for p in range(len(sym) - 1):
            m = self.merge.get((sym[p], sym[p + 1]))
            if m:
                heap.append((m[0], p, m[1]))
        heapq.heapify(heap)
        while heap:
            _, p, new = heapq.heappop(heap)
            q = nxt[p]
            if not alive[p] or q < 0 or self.merge.get((sym[p], sym[q]), (0, None))[1] != new:
                continue
            sym[p], alive[q] = new, False
            nxt[p] = nxt[q]
            if nxt[q] >= 0:
                prv[nxt[q]] = p
            for a, b in ((prv[p], p), (p, nxt[p])):
                if a >= 0 and b >= 0:
                    m = self.merge.get((sym[a], sym[b]))
                    if m:
                        heapq.heappush(heap, (m[0], a, m[1]))
        out, p = [], 0 if sym else -1
        while p >= 0:
            out.append(sym[p])
            p = nxt[p]
        return out

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        out, pending = [], bytearray()

        def flush() -> None:
            try:
                out.append(bytes(pending).decode("utf-8"))
            except UnicodeDecodeError:
                out.append("\ufffd" * len(pending))
            pending.clear()

        for i in ids:
            if not 0 <= i < len(self.spec.vocab):
                continue
            f = self.spec.vocab_flags[i]
            if skip_special_tokens and f & T.V_SPECIAL:
                continue
            if f & T.V_BYTE:
                pending.append(int(self.spec.vocab[i][3:5], 16))
                continue
            if pending:
                flush()
            out.append(self.spec.vocab[i].decode("utf-8").replace("\u2581", " "))
        if pending:
            flush()
        text = "".join(out)
        return text[1:] if text.startswith(" ") else text
