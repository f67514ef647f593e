"""The tensor plan's parts every family uses: an ``Item`` (one `.colibri` tensor and its
source), the ``Planner`` that takes checkpoint tensors by name and shape, the routed experts'
lookup, and the refusal of tensors no plan took. convert.py and the family modules use these."""

from __future__ import annotations

from dataclasses import dataclass

from colibri_kit.errors import ModelError
from colibri_kit.model.format import Flag, Kind
from colibri_kit.model.hf_model import HFModel
from colibri_kit.model.safetensors_io import FLOAT_DTYPES, Checkpoint, TensorView


@dataclass(frozen=True)
class Item:
    """One `.colibri` tensor and where its data comes from."""

    kind: Kind
    layer: int
    expert: int
    source: TensorView  # f32/f16/bf16 values, or mxfp4 blocks (uint8) when scales is given
    hf_name: str
    scales: TensorView | None = None  # mxfp4: the E8M0 scales; the blocks are copied as they are

    @property
    def nbytes(self) -> int:
        """The progress bar's unit: bytes as f32 (an mxfp4 block byte holds two weights)."""
        n = 1
        for s in self.source.shape:
            n *= s
        return n * (8 if self.scales is not None else 4)


class Planner:
    """Looks tensors up by name and checks their shapes; remembers which names were used."""

    def __init__(self, ck: Checkpoint) -> None:
        self.ck = ck
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.ck

    def take(self, name: str, shape: tuple[int, ...]) -> TensorView:
        """A tensor of numbers (F32, F16 or BF16) of exactly ``shape``."""
        return self._take(name, shape, FLOAT_DTYPES)

    def take_u8(self, name: str, shape: tuple[int, ...]) -> TensorView:
        """A tensor of bytes (U8: mxfp4 blocks or scales) of exactly ``shape``."""
        return self._take(name, shape, ("U8",))

    def _take(self, name: str, shape: tuple[int, ...], dtypes: tuple[str, ...]) -> TensorView:
        if name not in self.ck:
            raise ModelError(f"checkpoint {self.ck.dir}: tensor {name} is missing")
        got = self.ck.shape(name)
        if got != shape:
            raise ModelError(f"checkpoint {self.ck.dir}: tensor {name} has shape {list(got)}, expected {list(shape)}")
        dt = self.ck.entry(name).dtype
        if dt not in dtypes:
            raise ModelError(f"checkpoint {self.ck.dir}: tensor {name} is {dt}, expected {' or '.join(dtypes)}")
        self.used.add(name)
        return self.ck.get(name)

    def take_any(self, name: str, shapes: list[tuple[int, ...]]) -> tuple[TensorView, int]:
        """Take a tensor that may come in one of several layouts; returns (view, layout index)."""
        if name not in self.ck:
            raise ModelError(f"checkpoint {self.ck.dir}: tensor {name} is missing")
        got = self.ck.shape(name)
        if got not in shapes:
            want = " or ".join(str(list(s)) for s in shapes)
            raise ModelError(f"checkpoint {self.ck.dir}: tensor {name} has shape {list(got)}, expected {want}")
        self.used.add(name)
        return self.ck.get(name), shapes.index(got)


def unknown_tensors(m: HFModel, ck: Checkpoint, used: set[str], skip: tuple[str, ...] = ()) -> None:
    """Refuse a checkpoint with tensors the plan did not take (an unsupported variant), apart from
    those under the ``skip`` prefixes (parts the runtime does not run, e.g. a vision tower)."""
    ignorable = {"lm_head.weight"} if m.flags & Flag.TIED_EMBEDDINGS else set()
    unknown = sorted(k for k in ck.keys()
                     if k not in used and k not in ignorable and not k.endswith("rotary_emb.inv_freq")
                     and not k.startswith(skip))
    if unknown:
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise ModelError(f"checkpoint {ck.dir}: tensors the {m.model_type} converter does not use "
                         f"(unsupported variant?): {', '.join(unknown[:5])}{more}")


def _experts(p: Planner, m: HFModel, layer: int, moe: str) -> list[Item]:
    """Routed experts from per-expert keys, or sliced per expert from the fused tensors."""
    d, f, e_n = m.hidden, m.expert_ffn, m.experts
    fused_gu, fused_down = f"{moe}.experts.gate_up_proj", f"{moe}.experts.down_proj"
    w1: list[Item] = []
    w3: list[Item] = []
    w2: list[Item] = []
    if p.has(fused_gu) or p.has(fused_down):
        # transformers 5 in memory: gate_up [E, 2F, D] (gate rows first), down [E, D, F].
        # Some exporters store the transposed [E, D, 2F] / [E, F, D]; the gate_up layout decides.
        gu, gu_layout = p.take_any(fused_gu, [(e_n, 2 * f, d), (e_n, d, 2 * f)])
        down_shapes = [(e_n, d, f), (e_n, f, d)]
        if gu_layout == 1:
            down_shapes.reverse()
        dn, _ = p.take_any(fused_down, down_shapes)
        # [E, F, D] is the transposed down layout; when D == F only gate_up's layout can tell.
        down_transposed = gu_layout == 1 if d == f else dn.shape == (e_n, f, d)
        for e in range(e_n):
            g = gu[e]
            if gu_layout == 0:
                gate, up = g[:f], g[f:]
            else:
                gate, up = g[:, :f].T, g[:, f:].T
            down = dn[e].T if down_transposed else dn[e]
            w1.append(Item(Kind.EXPERT_W1, layer, e, gate, f"{fused_gu}[{e}] gate"))
            w3.append(Item(Kind.EXPERT_W3, layer, e, up, f"{fused_gu}[{e}] up"))
            w2.append(Item(Kind.EXPERT_W2, layer, e, down, f"{fused_down}[{e}]"))
        return w1 + w3 + w2
    names = ("w1", "w3", "w2") if moe.endswith("block_sparse_moe") else ("gate_proj", "up_proj", "down_proj")
    for e in range(e_n):
        base = f"{moe}.experts.{e}"
        w1.append(Item(Kind.EXPERT_W1, layer, e, p.take(f"{base}.{names[0]}.weight", (f, d)), f"{base}.{names[0]}.weight"))
        w3.append(Item(Kind.EXPERT_W3, layer, e, p.take(f"{base}.{names[1]}.weight", (f, d)), f"{base}.{names[1]}.weight"))
        w2.append(Item(Kind.EXPERT_W2, layer, e, p.take(f"{base}.{names[2]}.weight", (d, f)), f"{base}.{names[2]}.weight"))
    return w1 + w3 + w2
