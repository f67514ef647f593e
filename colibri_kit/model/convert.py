"""Convert a Hugging Face MoE checkpoint (safetensors, single or sharded) to a `.colibri` file.

The converter reads config.json, plans every tensor (name, expected shape, destination record)
before writing anything, so a missing or mis-shaped tensor is refused up front with its name.
It then streams tensor by tensor from memory-mapped safetensors through ModelWriter (row chunks:
peak memory stays near one chunk plus the map's resident pages, not the model). The output
appears only when complete (temporary file, then rename).
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from colibri_kit.errors import KitError, ModelError
from colibri_kit.model.families import HFModel, read_config
from colibri_kit.model.plan import Item, Planner, _experts, unknown_tensors
from colibri_kit.model.format import (
    NONE, DType, Family, Flag, Kind, ModelHeader, ModelWriter, padded_dim, tensor_label,
)
from colibri_kit.model.checkpoint_files import MAX_CONFIG_BYTES, read_json_object
from colibri_kit.model.safetensors_io import Checkpoint
from colibri_kit.model.tokenizer import tokenizer_metadata
from colibri_kit.profiles import Profile, require_profile

DEFAULT_MAX_SEQ = 2048


@dataclass(frozen=True)
class TargetModelLimits:
    """What the target's compiled runtime expects of a model (from its profile)."""

    name: str
    embed_pad: int
    max_experts: int
    top_k: int


def target_limits(profile: Profile) -> TargetModelLimits:
    """The profile's `colibri` block: embed_pad (padding of D), max_experts and top_k."""
    c = require_profile(profile, "target_limits").colibri
    return TargetModelLimits(profile.name, c.embed_pad, c.max_experts, c.top_k)


def build_header(m: HFModel, dtype: DType, limits: TargetModelLimits, max_seq_len: int | None,
                 name: str) -> ModelHeader:
    if m.experts > limits.max_experts:
        raise ModelError(f"config.json: {m.experts} experts per layer, but target {limits.name} is built for at "
                         f"most {limits.max_experts} (profile colibri.max_experts)")
    if m.top_k > limits.top_k:
        raise ModelError(f"config.json: num_experts_per_tok = {m.top_k}, but target {limits.name} is built for "
                         f"top_k <= {limits.top_k} (profile colibri.top_k)")
    cap = DEFAULT_MAX_SEQ if max_seq_len is None else max_seq_len
    if cap < 1:
        raise ModelError(f"--max-seq-len {cap}: must be at least 1")
    seq = min(m.max_positions, cap, 1_048_576)  # a sliding window keeps min(W, seq) rows
    raw_name = name.encode("utf-8")[:64].decode("utf-8", "ignore")
    return ModelHeader(
        num_experts=m.experts, expert_size=m.expert_ffn, vocab_size=m.vocab, max_seq_len=seq,
        embed_dim=m.hidden, n_layers=m.layers, n_heads=m.heads, n_kv_heads=m.kv_heads,
        head_dim=m.head_dim, top_k=m.top_k, routing=int(m.routing), dtype=int(dtype),
        embed_dim_pad=padded_dim(m.hidden, limits.embed_pad), pad_multiple=limits.embed_pad,
        flags=int(m.flags), shared_expert_size=m.shared_ffn, norm_eps=m.norm_eps,
        rope_theta=m.rope_theta, family=int(m.family), bos_token_id=m.bos, eos_token_id=m.eos,
        name=raw_name, layers=m.layer_records(), yarn=m.yarn)


def plan_tensors(m: HFModel, ck: Checkpoint) -> list[Item]:
    """Every tensor of the output, with its checkpoint source; refuses missing/mis-shaped/unknown ones."""
    if m.hybrid is not None:  # Qwen3.5 / Qwen3-Next: their own layout
        from colibri_kit.model.qwen_next import plan_tensors as plan_hybrid

        return plan_hybrid(m, ck)
    p = Planner(ck)
    d, v, e_n = m.hidden, m.vocab, m.experts
    hq, hkv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    items: list[Item] = []
    if m.family == Family.GPT_OSS:
        from colibri_kit.model import gptoss

        gptoss.plan(m, p, items, Item)
        unknown_tensors(m, ck, p.used)
        return items

    def add(kind: Kind, layer: int, expert: int, name: str, shape: tuple[int, ...]) -> None:
        items.append(Item(kind, layer, expert, p.take(name, shape), name))

    for i in range(m.layers):
        pre = f"model.layers.{i}"
        att = f"{pre}.self_attn"
        add(Kind.ATTN_NORM, i, NONE, f"{pre}.input_layernorm.weight", (d,))
        add(Kind.WQ, i, NONE, f"{att}.q_proj.weight", (hq, d))
        add(Kind.WK, i, NONE, f"{att}.k_proj.weight", (hkv, d))
        add(Kind.WV, i, NONE, f"{att}.v_proj.weight", (hkv, d))
        add(Kind.WO, i, NONE, f"{att}.o_proj.weight", (d, hq))
        if m.flags & Flag.QKV_BIAS:
            add(Kind.BQ, i, NONE, f"{att}.q_proj.bias", (hq,))
            add(Kind.BK, i, NONE, f"{att}.k_proj.bias", (hkv,))
            add(Kind.BV, i, NONE, f"{att}.v_proj.bias", (hkv,))
        if m.flags & Flag.QK_NORM_HEAD:
            add(Kind.Q_NORM, i, NONE, f"{att}.q_norm.weight", (m.head_dim,))
            add(Kind.K_NORM, i, NONE, f"{att}.k_norm.weight", (m.head_dim,))
        elif m.flags & Flag.QK_NORM_FULL:
            add(Kind.Q_NORM, i, NONE, f"{att}.q_norm.weight", (hq,))
            add(Kind.K_NORM, i, NONE, f"{att}.k_norm.weight", (hkv,))
        add(Kind.FFN_NORM, i, NONE, f"{pre}.post_attention_layernorm.weight", (d,))
        moe = f"{pre}.{m.moe_prefix}"
        if not p.has(f"{moe}.gate.weight") and p.has(f"{pre}.mlp.gate.weight"):
            moe = f"{pre}.mlp"  # mixtral in transformers 5's own (fused) naming
        add(Kind.ROUTER, i, NONE, f"{moe}.gate.weight", (e_n, d))
        items.extend(_experts(p, m, i, moe))
        if m.flags & Flag.SHARED_EXPERT:
            fs = m.shared_ffn
            add(Kind.SHARED_W1, i, NONE, f"{moe}.shared_expert.gate_proj.weight", (fs, d))
            add(Kind.SHARED_W3, i, NONE, f"{moe}.shared_expert.up_proj.weight", (fs, d))
            add(Kind.SHARED_W2, i, NONE, f"{moe}.shared_expert.down_proj.weight", (d, fs))
            add(Kind.SHARED_GATE, i, NONE, f"{moe}.shared_expert_gate.weight", (1, d))
    add(Kind.TOK_EMBED, NONE, NONE, "model.embed_tokens.weight", (v, d))
    add(Kind.OUTPUT_NORM, NONE, NONE, "model.norm.weight", (d,))
    if not m.flags & Flag.TIED_EMBEDDINGS:
        add(Kind.LM_HEAD, NONE, NONE, "lm_head.weight", (v, d))
    unknown_tensors(m, ck, p.used)
    return items


def _notes(m: HFModel, ck: Checkpoint) -> None:
    """What the converter leaves out of this checkpoint (a vision tower, an MTP head), one line
    each on stderr."""
    if m.hybrid is None:
        return
    from colibri_kit.model.qwen_next import SKIPPED, skipped

    for prefix, n in skipped(ck).items():
        sys.stderr.write(f"convert: note: skipped {n} tensors under {prefix}*: {SKIPPED[prefix]}\n")


class Progress:
    """A bar on a terminal, a plain line per 10% otherwise; silent when disabled."""

    def __init__(self, total: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.total = max(1, total)
        self.done = 0
        self.stream = stream or sys.stderr
        self.enabled = enabled
        self.tty = enabled and self.stream.isatty()
        self._last_decile = -1
        self._start = time.monotonic()

    def step(self, nbytes: int, label: str) -> None:
        if not self.enabled:
            return
        self.done += nbytes
        frac = min(1.0, self.done / self.total)
        if self.tty:
            width = 30
            bar = "#" * int(frac * width)
            self.stream.write(f"\rconvert [{bar:<{width}}] {frac * 100:5.1f}%  {label[:40]:<40}")
            self.stream.flush()
        elif int(frac * 10) > self._last_decile:
            self._last_decile = int(frac * 10)
            self.stream.write(f"convert: {frac * 100:3.0f}% ({self.done / 2**20:.1f} MiB of f32 weights)\n")
            self.stream.flush()

    def finish(self, out: Path) -> None:
        if not self.enabled:
            return
        if self.tty:
            self.stream.write("\n")
        self.stream.write(f"convert: wrote {out} in {time.monotonic() - self._start:.1f} s\n")
        self.stream.flush()


def load_config(hf_dir: Path) -> dict[str, Any]:
    """config.json as a dict: a regular file of at most 16 MiB, plain JSON (ModelError naming
    the file otherwise: a link to /dev/zero, a FIFO, 200k-deep nesting, a 5000-digit number)."""
    path = hf_dir / "config.json"
    if not os.path.lexists(path):
        raise ModelError(f"cannot read {path}: no such file (is {hf_dir} a Hugging Face checkpoint directory?)")
    return read_json_object(path, MAX_CONFIG_BYTES)


def chat_template_blob(hf_dir: Path, override: str | os.PathLike[str] | None) -> bytes | None:
    """The `chat.template` metadata blob (colibri_kit/model/chat.py), None without a template."""
    from colibri_kit.model.chat import from_checkpoint

    ct = from_checkpoint(hf_dir, Path(override) if override else None)
    return ct.blob() if ct else None


def convert(hf_dir: str | os.PathLike[str], out: str | os.PathLike[str], dtype: str = "f32",
            profile: Profile | None = None, max_seq_len: int | None = None, progress: bool = True,
            limits: TargetModelLimits | None = None, slots: int = 1,
            chat_template: str | os.PathLike[str] | None = None, expert_dtype: str | None = None) -> Path:
    """Convert ``hf_dir`` to ``out`` for the target ``profile`` (its embed_pad, max_experts, top_k,
    and its memory: a model whose footprint with ``slots`` contexts does not fit is refused before
    any tensor is written, naming a dtype or context length that fits).

    ``limits`` instead of ``profile`` (tests, or a pad the profiles do not list): those limits,
    and the memory is not checked; one of the two is needed (the caller loads the profile:
    ``profiles.load_profile(name)``). ``chat_template``: a Jinja file used instead of the
    checkpoint's chat template. ``expert_dtype``: the routed experts' dtype when it should
    differ from ``dtype`` (e.g. mxfp4 experts beside bf16 attention); a checkpoint released with
    mxfp4 experts keeps them as they are."""
    hf_dir = Path(hf_dir)
    out = Path(out)
    kind = DType.parse(dtype)
    if profile is not None:
        require_profile(profile, "convert")
    check_memory = limits is None
    if limits is None:
        if profile is None:
            raise TypeError("convert() needs the target's Profile (profile=load_profile('host'), "
                            "colibri_kit.profiles) or limits=TargetModelLimits(...)")
        limits = target_limits(profile)
    m = read_config(load_config(hf_dir))
    header = build_header(m, kind, limits, max_seq_len, hf_dir.resolve().name)
    from colibri_kit.model.gptoss import expert_dtype as experts_as

    header.expert_dtype = experts_as(m, expert_dtype, kind)
    metadata = tokenizer_metadata(hf_dir, header.vocab_size)  # tokenizer.* blobs (format v2)
    if check_memory:  # before any tensor is read: the geometry, dtype and metadata decide
        from colibri_kit.model.footprint import check_fits, estimate_file_bytes

        meta = sum(64 + len(k) + len(v) for k, v in metadata.items())  # table entry + name + blob
        assert profile is not None  # check_memory: the limits came from it
        check_fits(header, profile, estimate_file_bytes(header) + meta, slots=slots)
    ck = Checkpoint(hf_dir)
    items = plan_tensors(m, ck)
    if progress:
        _notes(m, ck)
    chat = chat_template_blob(hf_dir, chat_template)  # refused here, before anything is written
    bar = Progress(sum(it.nbytes for it in items), progress)
    if chat is not None:
        metadata["chat.template"] = chat
    with ModelWriter(out, header, metadata=metadata) as w:
        for it in items:
            try:
                if it.scales is not None:
                    w.add_mxfp4(it.kind, it.layer, it.expert, it.source, it.scales)
                else:
                    w.add(it.kind, it.layer, it.expert, it.source)
            except KitError as exc:
                raise ModelError(f"{it.hf_name} -> {tensor_label(it.kind, it.layer, it.expert)}: {exc}") from None
            bar.step(it.nbytes, it.hf_name)
    bar.finish(out)
    return out

