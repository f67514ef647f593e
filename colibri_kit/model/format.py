"""The `.colibri` model file (docs/format.md): constants, a streaming writer and a validating reader.

The writer streams one tensor at a time to disk (header and tensor table are reserved first and
written at close), so converting a checkpoint needs memory for one tensor chunk, not the model.
The reader maps the file with ``np.memmap`` and checks every header field and tensor record against
the geometry and the real file size before any tensor is touched.
"""

from __future__ import annotations

import enum
import math
from collections import Counter
import os
import struct
import tempfile
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Iterator, Protocol

import numpy as np

from colibri_kit.errors import ModelError

MAGIC = b"COLIBRI\0"
VERSION = 3  # written; readers accept every version in READ_VERSIONS
# version 2 = version 3 without the layer table (every layer attention + MoE);
# version 1 = version 2 without a metadata section
READ_VERSIONS = (1, 2, 3)
HEADER_SIZE = 256
RECORD_SIZE = 64
ALIGN = 64  # every tensor and scale vector
PAGE = 4096  # data_offset, and tensors of LARGE_TENSOR bytes or more
LARGE_TENSOR = 64 * 1024
NONE = 0xFFFFFFFF  # layer / expert index of tensors that have none
UNKNOWN_TOKEN = 0xFFFFFFFF


class DType(enum.IntEnum):
    F32 = 0
    F16 = 1
    BF16 = 2
    INT8 = 3
    Q4 = 4  # grouped 4-bit: Q4_GROUP weights share one f16 scale (docs/format.md, "q4")
    # OCP MXFP4 as gpt-oss releases it: blocks of 32 E2M1 values (two per byte) sharing one E8M0
    # exponent (docs/format.md, "mxfp4"); format version 3
    MXFP4 = 5

    @property
    def itemsize(self) -> int:
        """Bytes per element; q4 and mxfp4 have none (two weights per byte plus scales): see
        data_nbytes."""
        return {0: 4, 1: 2, 2: 2, 3: 1, 4: 0, 5: 0}[int(self)]

    @classmethod
    def parse(cls, name: str) -> "DType":
        try:
            return cls[name.upper()]
        except KeyError:
            allowed = ", ".join(d.name.lower() for d in cls)
            raise ModelError(f"unknown dtype {name!r}; allowed: {allowed}") from None


class Kind(enum.IntEnum):
    TOK_EMBED = 1
    OUTPUT_NORM = 2
    LM_HEAD = 3
    ATTN_NORM = 10
    WQ = 11
    WK = 12
    WV = 13
    WO = 14
    BQ = 15
    BK = 16
    BV = 17
    Q_NORM = 18
    K_NORM = 19
    FFN_NORM = 20
    ROUTER = 21
    ATTN_SINKS = 22  # [1, H]: one learned logit per head joining the softmax (mixer flag SINKS)
    BO = 23  # [1, Dp]: output-projection bias (mixer flag O_BIAS)
    ROUTER_BIAS = 24  # [1, E] (ffn flag ROUTER_BIAS)
    ATTN_GATE = 25  # gated attention's output gate projection (mixer flag OUTPUT_GATE; Qwen3.5/Next)
    EXPERT_W1 = 30
    EXPERT_W3 = 31
    EXPERT_W2 = 32
    EXPERT_B1 = 33  # [1, F] per expert: gate, up and down biases (ffn flag EXPERT_BIAS)
    EXPERT_B3 = 34
    EXPERT_B2 = 35  # [1, Dp]
    SHARED_W1 = 40
    SHARED_W3 = 41
    SHARED_W2 = 42
    SHARED_GATE = 43
    # gated_deltanet layers (runtime/src/layers/deltanet.c)
    DN_QKV = 50  # in_proj_qkv: q | k | v, the convolution's channels
    DN_Z = 51  # in_proj_z: the output gate
    DN_B = 52  # in_proj_b: beta (the write strength) per value head
    DN_A = 53  # in_proj_a: the decay's input per value head
    DN_CONV = 54  # conv1d taps [channels, width]
    DN_A_LOG = 55
    DN_DT_BIAS = 56
    DN_NORM = 57  # the gated RMSNorm's weight [value head dim]
    DN_OUT = 58  # out_proj


class Flag(enum.IntFlag):
    SHARED_EXPERT = 1 << 0
    SHARED_EXPERT_GATE = 1 << 1
    QK_NORM_HEAD = 1 << 2
    QK_NORM_FULL = 1 << 3
    TIED_EMBEDDINGS = 1 << 4
    QKV_BIAS = 1 << 5
    ROPE_YARN = 1 << 6  # YaRN RoPE: its parameters are header bytes 152..175 (Yarn)


ALL_FLAGS = int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QK_NORM_HEAD
                | Flag.QK_NORM_FULL | Flag.TIED_EMBEDDINGS | Flag.QKV_BIAS | Flag.ROPE_YARN)


class MixerFlag(enum.IntFlag):
    """Layer record field ``mixer_flags`` of the attention kinds: bits 0..7 gpt-oss, bits 8..15
    Qwen3.5 / Qwen3-Next."""

    SINKS = 1 << 0  # ATTN_SINKS [1, H]: a learned logit per head in the softmax, dropped after
    O_BIAS = 1 << 1  # BO [1, Dp]: a bias on the output projection
    OUTPUT_GATE = 1 << 8  # attention output times sigmoid(ATTN_GATE h) before WO
    PARTIAL_ROPE = 1 << 9  # RoPE on the first mixer_params[0] lanes of each head only


class FfnFlag(enum.IntFlag):
    """Bits of the moe kind's ``ffn_params[0]`` (bits 0..7: gpt-oss)."""

    ROUTER_BIAS = 1 << 0  # ROUTER_BIAS [1, E] added to the router logits
    EXPERT_BIAS = 1 << 1  # EXPERT_B1/B3 [1, F] and EXPERT_B2 [1, Dp] per expert
    # gpt-oss's activation: gate clamped above at limit, up clamped to [-limit, limit],
    # (up + 1) * gate * sigmoid(alpha * gate); alpha and limit are f32 bits in ffn_params[1], [2]
    CLAMPED_SWIGLU = 1 << 2


MIXER_FLAGS = int(MixerFlag.SINKS | MixerFlag.O_BIAS | MixerFlag.OUTPUT_GATE
                  | MixerFlag.PARTIAL_ROPE)
FFN_FLAGS = int(FfnFlag.ROUTER_BIAS | FfnFlag.EXPERT_BIAS | FfnFlag.CLAMPED_SWIGLU)


class Family(enum.IntEnum):
    MIXTRAL = 0
    QWEN2_MOE = 1
    QWEN3_MOE = 2
    OLMOE = 3
    GPT_OSS = 4
    QWEN3_NEXT = 5
    QWEN3_5_MOE = 6  # Qwen3.5 and Qwen3.6 MoE
    OTHER = 255


class Routing(enum.IntEnum):
    RENORMALISE = 0  # softmax over E, top-k, weights divided by their sum
    PLAIN = 1  # softmax over E, top-k, weights used as they are


class Mixer(enum.IntEnum):
    """Layer record field ``mixer`` (runtime/src/layers/kinds.h): how a layer mixes positions."""

    ATTENTION = 1  # causal grouped-query attention over every position
    SLIDING_ATTENTION = 2  # the same over the last `window` positions (a ring of W rows)
    GATED_DELTANET = 3  # Gated DeltaNet linear attention: a conv over `window` positions + a state


QWEN_ATTENTION_FLAGS = int(MixerFlag.OUTPUT_GATE | MixerFlag.PARTIAL_ROPE)


class Ffn(enum.IntEnum):
    """Layer record field ``ffn``: the block after the mixer."""

    MOE = 1  # routed experts (+ the shared expert when the header's flags say so)


# Limits enforced by readers (docs/format.md, "Limits"): beyond them a file is refused as absurd.
MAX_EMBED = 65536
MAX_EXPERTS = 512  # Qwen3-Next: 512 routed experts
MAX_TOP_K = 16
MAX_LAYERS = 1024
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_VOCAB = 4_194_304
MAX_FFN = 262_144
MAX_SEQ = 1_048_576
MAX_META = 4096  # metadata entries

# Metadata section (version 2): a table of 64-byte entries, then the blobs (docs/format.md).
META_ENTRY_SIZE = 64
META_NAME_SIZE = 48  # NUL-padded, so a name has 1..47 bytes
_META_ENTRY = struct.Struct("<48sQQ")
_META_NAME_CHARS = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")

# q4: each row is split into groups of Q4_GROUP columns (the last one zero-padded); a group is
# 16 bytes of nibbles (byte j = (q[j] + 8) | (q[j + 16] + 8) << 4, q in -8..7) and one f16 scale d,
# so w = q * d. Chosen by measurement (docs/models.md, "4-bit weights").
Q4_GROUP = 32
Q4_BLOCK_BYTES = Q4_GROUP // 2


def q4_groups(cols: int) -> int:
    return (cols + Q4_GROUP - 1) // Q4_GROUP


# mxfp4 (OCP Microscaling v1.0, MXFP4): blocks of MX_BLOCK columns (the last one zero-padded);
# a block is 16 bytes, byte j holding element 2j in its low nibble and 2j + 1 in its high nibble
# (E2M1 codes), and one E8M0 scale byte s: w = E2M1[code] * 2^(s - 127). The bytes are the
# released checkpoints' *_blocks / *_scales, copied as they are.
MX_BLOCK = 32
MX_BLOCK_BYTES = MX_BLOCK // 2
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def mx_blocks(cols: int) -> int:
    return (cols + MX_BLOCK - 1) // MX_BLOCK


def data_nbytes(dtype: int, rows: int, cols: int) -> int:
    """Bytes of a tensor's data (not its scales) in the file."""
    if dtype == DType.Q4:
        return rows * q4_groups(cols) * Q4_BLOCK_BYTES
    if dtype == DType.MXFP4:
        return rows * mx_blocks(cols) * MX_BLOCK_BYTES
    return rows * cols * DType(dtype).itemsize


def scale_bytes(dtype: int, rows: int, cols: int) -> int:
    """Bytes of a tensor's scale vector: f32 per row for int8, f16 per group for q4, one E8M0
    byte per block for mxfp4, else 0."""
    if dtype == DType.INT8:
        return rows * 4
    if dtype == DType.Q4:
        return rows * q4_groups(cols) * 2
    if dtype == DType.MXFP4:
        return rows * mx_blocks(cols)
    return 0


SCALED_DTYPES = (DType.INT8, DType.Q4, DType.MXFP4)


# Kinds whose tensors are always f32 (small vectors and the router: routing stays exact).
F32_KINDS = frozenset({Kind.OUTPUT_NORM, Kind.ATTN_NORM, Kind.BQ, Kind.BK, Kind.BV, Kind.Q_NORM,
                       Kind.K_NORM, Kind.FFN_NORM, Kind.ROUTER, Kind.SHARED_GATE, Kind.ATTN_SINKS,
                       Kind.BO, Kind.ROUTER_BIAS, Kind.EXPERT_B1, Kind.EXPERT_B3, Kind.EXPERT_B2,
                       # gated_deltanet: beta and decay inputs feed the recurrence (kept exact,
                       # like the router), the rest are small vectors
                       Kind.DN_B, Kind.DN_A, Kind.DN_CONV, Kind.DN_A_LOG, Kind.DN_DT_BIAS,
                       Kind.DN_NORM})
# Kinds whose column axis is the hidden size D (padded to Dp with zeros).
D_COLS = frozenset({Kind.TOK_EMBED, Kind.OUTPUT_NORM, Kind.LM_HEAD, Kind.ATTN_NORM, Kind.WQ,
                    Kind.WK, Kind.WV, Kind.FFN_NORM, Kind.ROUTER, Kind.EXPERT_W1, Kind.EXPERT_W3,
                    Kind.SHARED_W1, Kind.SHARED_W3, Kind.SHARED_GATE, Kind.BO, Kind.EXPERT_B2,
                    Kind.ATTN_GATE, Kind.DN_QKV, Kind.DN_Z, Kind.DN_B, Kind.DN_A})
# Kinds whose row axis is D (the outputs of WO and the down projections).
D_ROWS = frozenset({Kind.WO, Kind.EXPERT_W2, Kind.SHARED_W2, Kind.DN_OUT})
EXPERT_KINDS = (Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2)  # the routed experts' matrices
GLOBAL_KINDS = frozenset({Kind.TOK_EMBED, Kind.OUTPUT_NORM, Kind.LM_HEAD})

_HEADER = struct.Struct("<8s" + "I" * 18 + "ff" + "II" + "QQ" + "III" + "IQQ" + "Q40s" + "64s")
# header bytes 152..175 with the ROPE_YARN flag (version 3): factor, beta_fast, beta_slow,
# attention_factor (f32), original_max_position_embeddings, truncate (u32)
_YARN = struct.Struct("<ffffII")
YARN_OFFSET = 152
_RECORD = struct.Struct("<IIIIII" + "QQQQ" + "II")
LAYER_RECORD_SIZE = 64  # version 3: one per layer, right after the tensor table
_LAYER = struct.Struct("<IIII" + "4I" + "4I" + "16s")
assert _HEADER.size == HEADER_SIZE and _RECORD.size == RECORD_SIZE and _LAYER.size == LAYER_RECORD_SIZE


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def data_start(h: "ModelHeader") -> int:
    """Where the writer puts the tensor data: after the tensor table and (version 3) the layer
    table, on a page boundary."""
    tables = HEADER_SIZE + RECORD_SIZE * len(expected_tensors(h))
    if h.version >= 3:
        tables += LAYER_RECORD_SIZE * h.n_layers
    return align_up(tables, PAGE)


def padded_dim(dim: int, pad: int) -> int:
    """D rounded up to a multiple of the profile's embed_pad (the Dp of docs/format.md)."""
    if pad <= 0 or pad % 16:
        raise ModelError(f"embed_pad must be a positive multiple of 16, got {pad}")
    return align_up(dim, pad)


def pad_to(a: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Zero-pad a 2-D array at the bottom/right to [rows, cols]."""
    if a.shape == (rows, cols):
        return a
    out = np.zeros((rows, cols), dtype=a.dtype)
    out[: a.shape[0], : a.shape[1]] = a
    return out


# ----------------------------------------------------------------------------------------------
# Header


@dataclass(frozen=True)
class Yarn:
    """YaRN RoPE (transformers' ``_compute_yarn_parameters``, modeling_rope_utils.py), header bytes
    152..175 when the ROPE_YARN flag is set. ``attention_factor`` is the value transformers
    multiplies cos and sin by (the converter derives it from the config as transformers does)."""

    factor: float
    original_max_position: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 1.0
    truncate: bool = True

    def pack(self) -> bytes:
        try:
            return _YARN.pack(self.factor, self.beta_fast, self.beta_slow, self.attention_factor,
                              self.original_max_position, int(self.truncate))
        except struct.error as exc:
            raise ModelError(f"header field rope.yarn does not fit the format: {exc}") from None

    @classmethod
    def unpack(cls, buf: bytes) -> "Yarn":
        f, bf, bs, af, orig, trunc = _YARN.unpack(buf[:_YARN.size])
        return cls(f, orig, bf, bs, af, bool(trunc) if trunc in (0, 1) else trunc)  # type: ignore[arg-type]

    def validate(self) -> None:
        for name in ("factor", "beta_fast", "beta_slow", "attention_factor"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v > 0):
                raise ModelError(f"header field rope.yarn.{name}: {v}, must be finite and > 0")
        if not 1 <= self.original_max_position <= MAX_SEQ * 1024:
            raise ModelError(f"header field rope.yarn.original_max_position: {self.original_max_position}, "
                             f"allowed 1..{MAX_SEQ * 1024}")
        if self.truncate not in (0, 1):
            raise ModelError(f"header field rope.yarn.truncate: {self.truncate}, allowed 0 or 1")

    def to_json(self) -> dict[str, Any]:
        return {"type": "yarn", "factor": self.factor, "original_max_position": self.original_max_position,
                "beta_fast": self.beta_fast, "beta_slow": self.beta_slow,
                "attention_factor": self.attention_factor, "truncate": bool(self.truncate)}


@dataclass
class ModelHeader:
    """Every field of the 256-byte header, in file order (docs/format.md, "Header")."""

    num_experts: int
    expert_size: int
    vocab_size: int
    max_seq_len: int
    embed_dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    top_k: int
    routing: int
    dtype: int
    embed_dim_pad: int
    pad_multiple: int
    flags: int = 0
    shared_expert_size: int = 0
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    family: int = Family.OTHER
    bos_token_id: int = UNKNOWN_TOKEN
    eos_token_id: int = UNKNOWN_TOKEN
    name: str = ""
    # Filled in by the writer; checked by the reader.
    n_tensors: int = 0
    data_offset: int = 0
    file_size: int = 0
    magic: bytes = MAGIC
    version: int = VERSION
    header_size: int = HEADER_SIZE
    tensor_table_offset: int = HEADER_SIZE
    # Metadata section (version 2; docs/format.md "Metadata section"): filled in by the writer.
    meta_count: int = 0
    meta_offset: int = 0
    meta_size: int = 0
    # Layer table (version 3; docs/format.md "Layer table"): the offset is filled in by the writer.
    layer_table_offset: int = 0
    reserved: bytes = field(default=b"\0" * 40, repr=False)
    # The layer records (not header bytes: the table the offset points at). Empty: every layer
    # is attention + MoE, as in version 1 and 2 files.
    layers: tuple["LayerRecord", ...] = field(default=(), repr=False)
    # YaRN RoPE parameters (header bytes 152..175, with the ROPE_YARN flag); None: plain RoPE
    yarn: Yarn | None = None
    # Not header bytes: the dtype the routed experts' matrices are stored in when it differs
    # from ``dtype`` (gpt-oss's native mxfp4 experts beside bf16/int8 attention); the writer and
    # the footprint read it, read_model sets it from the file's expert records.
    expert_dtype: int | None = field(default=None, repr=False)

    def has(self, flag: Flag) -> bool:
        return bool(self.flags & flag)

    def layer(self, i: int) -> "LayerRecord":
        """Layer ``i``'s record (attention + MoE when the header carries none)."""
        return self.layers[i] if self.layers else DEFAULT_LAYER

    def layer_records(self) -> tuple["LayerRecord", ...]:
        return self.layers or (DEFAULT_LAYER,) * self.n_layers

    def pack(self) -> bytes:
        name = self.name.encode("utf-8")
        if len(name) > 64:
            raise ModelError(f"header field name: {len(name)} bytes, at most 64")
        reserved = self.reserved
        if self.yarn is not None:  # its bytes come first in the reserved area (offset 152)
            yb = self.yarn.pack()
            reserved = yb + reserved[len(yb):]
        try:
            return _HEADER.pack(
                self.magic, self.version, self.num_experts, self.expert_size, self.vocab_size,
                self.max_seq_len, self.embed_dim, self.header_size, self.n_layers, self.n_heads,
                self.n_kv_heads, self.head_dim, self.top_k, self.routing, self.dtype,
                self.embed_dim_pad, self.pad_multiple, self.flags, self.shared_expert_size,
                self.norm_eps, self.rope_theta, self.n_tensors, self.tensor_table_offset,
                self.data_offset, self.file_size, self.family, self.bos_token_id,
                self.eos_token_id, self.meta_count, self.meta_offset, self.meta_size,
                self.layer_table_offset, reserved, name)
        except struct.error as exc:
            raise ModelError(f"header does not fit the format: {exc}") from None

    @classmethod
    def unpack(cls, buf: bytes) -> "ModelHeader":
        v = _HEADER.unpack(buf[:HEADER_SIZE])
        reserved, yarn = v[32], None
        if v[17] & Flag.ROPE_YARN and v[1] >= 3:
            yarn = Yarn.unpack(reserved)
            reserved = bytes(_YARN.size) + reserved[_YARN.size:]
        return cls(
            magic=v[0], version=v[1], num_experts=v[2], expert_size=v[3], vocab_size=v[4],
            max_seq_len=v[5], embed_dim=v[6], header_size=v[7], n_layers=v[8], n_heads=v[9],
            n_kv_heads=v[10], head_dim=v[11], top_k=v[12], routing=v[13], dtype=v[14],
            embed_dim_pad=v[15], pad_multiple=v[16], flags=v[17], shared_expert_size=v[18],
            norm_eps=v[19], rope_theta=v[20], n_tensors=v[21], tensor_table_offset=v[22],
            data_offset=v[23], file_size=v[24], family=v[25], bos_token_id=v[26],
            eos_token_id=v[27], meta_count=v[28], meta_offset=v[29], meta_size=v[30],
            layer_table_offset=v[31], reserved=reserved, name=_decode_name(v[33]), yarn=yarn)

    def to_json(self) -> dict[str, Any]:
        """A JSON-friendly view (names for enums and flags) for `invoke model-info`."""
        d = {f.name: getattr(self, f.name) for f in fields(self)
             if f.name not in ("magic", "reserved", "layers", "yarn", "expert_dtype")}
        d["routing"] = Routing(self.routing).name.lower() if self.routing in (0, 1) else self.routing
        d["dtype"] = DType(self.dtype).name.lower() if self.dtype in DType._value2member_map_ else self.dtype
        d["family"] = Family(self.family).name.lower() if self.family in Family._value2member_map_ else self.family
        d["flags"] = [f.name for f in Flag if self.flags & f]
        d["layers"] = [r.to_json() for r in self.layer_records()]
        d["layer_pattern"] = layer_pattern(self.layer_records())
        d["rope"] = self.yarn.to_json() if self.yarn else {"type": "default"}
        return d

    def validate_geometry(self) -> None:
        """Check every field that does not depend on the file (magic, version, limits, flags)."""
        if self.magic != MAGIC:
            raise ModelError(f"header field magic: {self.magic!r}, expected {MAGIC!r} (not a .colibri file)")
        if self.version not in READ_VERSIONS:
            raise ModelError(f"header field version: {self.version}, this reader supports "
                             + " and ".join(str(v) for v in READ_VERSIONS))
        if self.version < 2 and (self.meta_count or self.meta_offset or self.meta_size):
            raise ModelError("header field reserved: must be zero (a version-1 file has no metadata section)")
        if self.version < 3 and self.layer_table_offset:
            raise ModelError(f"header field reserved: must be zero (a version-{self.version} file has no "
                             "layer table)")
        if self.header_size != HEADER_SIZE:
            raise ModelError(f"header field header_size: {self.header_size}, expected {HEADER_SIZE}")
        if self.tensor_table_offset != HEADER_SIZE:
            raise ModelError(f"header field tensor_table_offset: {self.tensor_table_offset}, expected {HEADER_SIZE}")
        _in_range("num_experts", self.num_experts, 1, MAX_EXPERTS)
        _in_range("expert_size", self.expert_size, 1, MAX_FFN)
        _in_range("vocab_size", self.vocab_size, 1, MAX_VOCAB)
        _in_range("max_seq_len", self.max_seq_len, 1, MAX_SEQ)
        _in_range("embed_dim", self.embed_dim, 1, MAX_EMBED)
        _in_range("n_layers", self.n_layers, 1, MAX_LAYERS)
        _in_range("n_heads", self.n_heads, 1, MAX_HEADS)
        _in_range("n_kv_heads", self.n_kv_heads, 1, MAX_HEADS)
        if self.n_heads % self.n_kv_heads:
            raise ModelError(f"header field n_kv_heads: {self.n_kv_heads} does not divide n_heads {self.n_heads}")
        _in_range("head_dim", self.head_dim, 2, MAX_HEAD_DIM)
        if self.head_dim % 2:
            raise ModelError(f"header field head_dim: {self.head_dim} is odd (RoPE pairs need it even)")
        _in_range("top_k", self.top_k, 1, min(MAX_TOP_K, self.num_experts))
        if self.routing not in (0, 1):
            raise ModelError(f"header field routing: {self.routing}, allowed 0 (renormalise) or 1 (plain)")
        if self.dtype not in DType._value2member_map_:
            raise ModelError(f"header field dtype: {self.dtype}, allowed 0 f32, 1 f16, 2 bf16, 3 int8, 4 q4, 5 mxfp4")
        if self.dtype == DType.Q4 and self.version < 2:
            raise ModelError("header field dtype: 4 (q4) needs format version 2, the file says 1")
        for what, dt in (("dtype", self.dtype), ("expert dtype", self.expert_dtype)):
            if dt == DType.MXFP4 and self.version < 3:
                raise ModelError(f"header field {what}: 5 (mxfp4) needs format version 3, the header says {self.version}")
        if self.expert_dtype is not None and self.expert_dtype not in DType._value2member_map_:
            raise ModelError(f"expert dtype {self.expert_dtype}: allowed 0..5")
        if self.pad_multiple <= 0 or self.pad_multiple % 16 or self.pad_multiple > MAX_EMBED:
            raise ModelError(f"header field pad_multiple: {self.pad_multiple}, must be a positive multiple of 16")
        dp = self.embed_dim_pad
        if (dp % self.pad_multiple or dp < self.embed_dim or dp >= self.embed_dim + self.pad_multiple
                or dp > MAX_EMBED):
            raise ModelError(
                f"header field embed_dim_pad: {dp} is not embed_dim {self.embed_dim} rounded up to a "
                f"multiple of pad_multiple {self.pad_multiple}")
        if self.flags & ~ALL_FLAGS:
            raise ModelError(f"header field flags: unknown bits {self.flags & ~ALL_FLAGS:#x}")
        if self.has(Flag.ROPE_YARN):
            if self.version < 3:
                raise ModelError(f"header field flags: ROPE_YARN needs format version 3, the header says {self.version}")
            if self.yarn is None:
                raise ModelError("header field flags: ROPE_YARN set but no YaRN parameters given")
            self.yarn.validate()
        elif self.yarn is not None:
            raise ModelError("header field flags: YaRN parameters given without the ROPE_YARN flag")
        if self.has(Flag.QK_NORM_HEAD) and self.has(Flag.QK_NORM_FULL):
            raise ModelError("header field flags: QK_NORM_HEAD and QK_NORM_FULL are exclusive")
        if self.has(Flag.SHARED_EXPERT_GATE) and not self.has(Flag.SHARED_EXPERT):
            raise ModelError("header field flags: SHARED_EXPERT_GATE without SHARED_EXPERT")
        if self.has(Flag.SHARED_EXPERT):
            _in_range("shared_expert_size", self.shared_expert_size, 1, MAX_FFN)
        elif self.shared_expert_size != 0:
            raise ModelError(f"header field shared_expert_size: {self.shared_expert_size} without the SHARED_EXPERT flag")
        if not (math.isfinite(self.norm_eps) and 0.0 < self.norm_eps < 1.0):
            raise ModelError(f"header field norm_eps: {self.norm_eps}, must be in (0, 1)")
        if not (math.isfinite(self.rope_theta) and self.rope_theta > 0.0):
            raise ModelError(f"header field rope_theta: {self.rope_theta}, must be finite and > 0")
        if self.family not in Family._value2member_map_:
            raise ModelError(f"header field family: {self.family}, allowed "
                             + ", ".join(str(int(f)) for f in Family))
        for key in ("bos_token_id", "eos_token_id"):
            tok = getattr(self, key)
            if tok != UNKNOWN_TOKEN and tok >= self.vocab_size:
                raise ModelError(f"header field {key}: {tok}, must be < vocab_size {self.vocab_size} or 0xFFFFFFFF")
        if any(self.reserved):
            raise ModelError("header field reserved: must be zero")
        self.validate_layers()

    def validate_layers(self) -> None:
        """Each layer record against its kinds' rules (the table in LAYER_KINDS)."""
        if self.layers and len(self.layers) != self.n_layers:
            raise ModelError(f"layer table: {len(self.layers)} records for n_layers {self.n_layers}")
        if self.version < 3 and any(r != DEFAULT_LAYER for r in self.layers):
            raise ModelError(f"layer table: layers other than attention + moe need format version 3, "
                             f"the header says {self.version}")
        for i, r in enumerate(self.layers):
            where = f"layer {i}"
            mixer, ffn = MIXERS.get(r.mixer), FFNS.get(r.ffn)
            if mixer is None:
                raise ModelError(f"{where}: field mixer {r.mixer}, allowed "
                                 + ", ".join(f"{int(k)} ({k.name.lower()})" for k in Mixer))
            if ffn is None:
                raise ModelError(f"{where}: field ffn {r.ffn}, allowed "
                                 + ", ".join(f"{int(k)} ({k.name.lower()})" for k in Ffn))
            if any(r.reserved):
                raise ModelError(f"{where}: field reserved must be zero")
            mixer.check(self, i, r)
            ffn.check(self, i, r)

    def validate(self, actual_size: int) -> None:
        """Check every header field, including the table and data placement against the file size."""
        self.validate_geometry()
        if self.file_size != actual_size:
            raise ModelError(f"header field file_size: {self.file_size}, but the file has {actual_size} bytes (truncated or padded?)")
        expected = len(expected_tensors(self))
        if self.n_tensors != expected:
            raise ModelError(f"header field n_tensors: {self.n_tensors}, the geometry needs {expected}")
        table_end = HEADER_SIZE + self.n_tensors * RECORD_SIZE
        if table_end > actual_size:
            raise ModelError(f"header field n_tensors: table of {self.n_tensors} records ends past the file ({actual_size} bytes)")
        if self.version >= 3:
            _check_layer_table(self, actual_size)
            table_end += self.n_layers * LAYER_RECORD_SIZE
        if self.data_offset % PAGE or self.data_offset < table_end or self.data_offset > actual_size:
            raise ModelError(
                f"header field data_offset: {self.data_offset}, must be 4096-aligned, >= {table_end} "
                f"(end of the table) and <= file size {actual_size}")
        if self.meta_count == 0:
            if self.meta_offset or self.meta_size:
                raise ModelError(f"header field meta_offset: {self.meta_offset} (meta_size {self.meta_size}), "
                                 "both must be 0 when meta_count is 0")
            return
        if self.meta_count > MAX_META:
            raise ModelError(f"header field meta_count: {self.meta_count}, allowed 0..{MAX_META}")
        if (self.meta_offset % ALIGN or self.meta_offset < self.data_offset
                or self.meta_offset > actual_size or self.meta_size != actual_size - self.meta_offset):
            raise ModelError(
                f"header field meta_offset: {self.meta_offset} (meta_size {self.meta_size}), the section "
                f"must start {ALIGN}-aligned at or after data_offset {self.data_offset} and end at the "
                f"end of the file ({actual_size} bytes)")
        if self.meta_count * META_ENTRY_SIZE > self.meta_size:
            raise ModelError(f"header field meta_count: {self.meta_count} entries do not fit the "
                             f"{self.meta_size}-byte metadata section")

    @property
    def tensor_end(self) -> int:
        """Where tensor data must end: the metadata section (if any) follows it."""
        return self.meta_offset if self.meta_count else self.file_size


# ----------------------------------------------------------------------------------------------
# Layer table (version 3): what each layer is


@dataclass(frozen=True)
class LayerRecord:
    """One layer's 64-byte record (docs/format.md, "Layer table")."""

    mixer: int = Mixer.ATTENTION
    ffn: int = Ffn.MOE
    window: int = 0  # sliding kinds: the positions a token sees; gated_deltanet: the conv width
    mixer_flags: int = 0  # MixerFlag bits (attention sinks, output bias; Qwen's gate, partial RoPE)
    mixer_params: tuple[int, int, int, int] = (0, 0, 0, 0)
    ffn_params: tuple[int, int, int, int] = (0, 0, 0, 0)
    reserved: bytes = field(default=bytes(16), repr=False)

    def pack(self) -> bytes:
        try:
            return _LAYER.pack(self.mixer, self.ffn, self.window, self.mixer_flags,
                               *self.mixer_params, *self.ffn_params, self.reserved)
        except struct.error as exc:
            raise ModelError(f"layer record does not fit the format: {exc}") from None

    @classmethod
    def unpack(cls, buf: bytes) -> "LayerRecord":
        v = _LAYER.unpack(buf)
        return cls(v[0], v[1], v[2], v[3], tuple(v[4:8]), tuple(v[8:12]), v[12])  # type: ignore[arg-type]

    @property
    def mixer_name(self) -> str:
        kind = MIXERS.get(self.mixer)
        return kind.name if kind else f"mixer {self.mixer}"

    @property
    def ffn_name(self) -> str:
        kind = FFNS.get(self.ffn)
        return kind.name if kind else f"ffn {self.ffn}"

    def label(self) -> str:
        """``attention + moe``, ``sliding_attention(128) + moe``."""
        w = f"({self.window})" if self.window else ""
        return f"{self.mixer_name}{w} + {self.ffn_name}"

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"mixer": self.mixer_name, "ffn": self.ffn_name, "window": self.window}
        if self.mixer_flags:
            d["mixer_flags"] = [f.name.lower() for f in MixerFlag if self.mixer_flags & f]
        if self.ffn_params[0]:
            d["ffn_flags"] = [f.name.lower() for f in FfnFlag if self.ffn_params[0] & f]
        if self.ffn_params[0] & FfnFlag.CLAMPED_SWIGLU:
            d["swiglu_alpha"], d["swiglu_limit"] = self.swiglu
        return d

    @property
    def swiglu(self) -> tuple[float, float]:
        """(alpha, limit) of the clamped SwiGLU (f32 bits in ffn_params[1], [2])."""
        return f32_from_bits(self.ffn_params[1]), f32_from_bits(self.ffn_params[2])


def f32_bits(v: float) -> int:
    """The IEEE bits of ``v`` rounded to f32 (how a layer record stores a float parameter)."""
    return int(np.array([v], "<f4").view("<u4")[0])


def f32_from_bits(u: int) -> float:
    return float(np.array([u], "<u4").view("<f4")[0])


def gptoss_moe_params(alpha: float, limit: float, router_bias: bool = True,
                      expert_bias: bool = True) -> tuple[int, int, int, int]:
    """ffn_params of a gpt-oss MoE layer: router bias, expert biases, clamped SwiGLU."""
    flags = FfnFlag.CLAMPED_SWIGLU | (FfnFlag.ROUTER_BIAS if router_bias else 0) \
        | (FfnFlag.EXPERT_BIAS if expert_bias else 0)
    return (int(flags), f32_bits(alpha), f32_bits(limit), 0)


DEFAULT_LAYER = LayerRecord()  # every layer of a version 1 or 2 file


@dataclass(frozen=True)
class LayerKind:
    """One row of the layer-kind table, as runtime/src/layers/kinds.c has it: the name, the check
    of a record, the tensors of a layer of this kind (kind, expert, rows, cols) and what it keeps
    per context (the footprint's cache: K/V rows, recurrent state floats) and needs in a pass
    (mixer scratch floats per token, the widest matrix input), as its `cache` reports them."""

    name: str
    check: Callable[["ModelHeader", int, LayerRecord], None]
    tensors: Callable[["ModelHeader", LayerRecord], list[tuple["Kind", int, int, int]]]
    kv_positions: Callable[["ModelHeader", LayerRecord], int]
    state_floats: Callable[["ModelHeader", LayerRecord], int] = lambda h, r: 0
    scratch_floats: Callable[["ModelHeader", LayerRecord], int] = lambda h, r: 0
    in_cols: Callable[["ModelHeader", LayerRecord], int] = lambda h, r: 0


def _params_zero(where: str, values: tuple[int, ...], field_name: str) -> None:
    for i, v in enumerate(values):
        if v:
            raise ModelError(f"{where}: field {field_name}[{i}] {v}, must be 0")


def _check_mixer(h: "ModelHeader", where: str, r: LayerRecord) -> None:
    """What both attention kinds require: only the defined flags (MixerFlag: gpt-oss's sinks and
    output bias, Qwen's gate and partial RoPE), a parameter only where a flag defines one
    (PARTIAL_ROPE: mixer_params[0], the rotary width)."""
    partial = bool(r.mixer_flags & MixerFlag.PARTIAL_ROPE)
    _params_zero(where, r.mixer_params[1:] if partial else r.mixer_params, "mixer_params")
    if r.mixer_flags & ~MIXER_FLAGS:
        raise ModelError(f"{where}: field mixer_flags {r.mixer_flags:#x}, bits {r.mixer_flags & ~MIXER_FLAGS:#x} "
                         "are not defined (a newer format feature: update the kit)")
    rw = r.mixer_params[0]
    if partial and (rw < 2 or rw > h.head_dim or rw % 2):
        raise ModelError(f"{where}: field mixer_params[0] {rw}, the rotary width of PARTIAL_ROPE must "
                         f"be even and in 2..head_dim ({h.head_dim})")


def rotary_width(h: "ModelHeader", r: LayerRecord) -> int:
    """Lanes of each head that RoPE rotates (all of them unless PARTIAL_ROPE)."""
    return r.mixer_params[0] if r.mixer_flags & MixerFlag.PARTIAL_ROPE else h.head_dim


def _check_attention(h: "ModelHeader", i: int, r: LayerRecord) -> None:
    where = f"layer {i} (attention)"
    _check_mixer(h, where, r)
    if r.window:
        raise ModelError(f"{where}: field window {r.window}, must be 0 for full attention")


def _check_sliding(h: "ModelHeader", i: int, r: LayerRecord) -> None:
    where = f"layer {i} (sliding_attention)"
    _check_mixer(h, where, r)
    if r.window < 1:
        raise ModelError(f"{where}: field window {r.window}, must be at least 1")


def _attention_tensors(h: "ModelHeader", r: LayerRecord) -> list[tuple["Kind", int, int, int]]:
    dp, hq, hkv = h.embed_dim_pad, h.n_heads * h.head_dim, h.n_kv_heads * h.head_dim
    out = [(Kind.ATTN_NORM, NONE, 1, dp), (Kind.WQ, NONE, hq, dp), (Kind.WK, NONE, hkv, dp),
           (Kind.WV, NONE, hkv, dp), (Kind.WO, NONE, dp, hq)]
    if r.mixer_flags & MixerFlag.SINKS:
        out.append((Kind.ATTN_SINKS, NONE, 1, h.n_heads))
    if r.mixer_flags & MixerFlag.O_BIAS:
        out.append((Kind.BO, NONE, 1, dp))
    if h.has(Flag.QKV_BIAS):
        out += [(Kind.BQ, NONE, 1, hq), (Kind.BK, NONE, 1, hkv), (Kind.BV, NONE, 1, hkv)]
    if h.has(Flag.QK_NORM_HEAD):
        out += [(Kind.Q_NORM, NONE, 1, h.head_dim), (Kind.K_NORM, NONE, 1, h.head_dim)]
    elif h.has(Flag.QK_NORM_FULL):
        out += [(Kind.Q_NORM, NONE, 1, hq), (Kind.K_NORM, NONE, 1, hkv)]
    if r.mixer_flags & MixerFlag.OUTPUT_GATE:
        out.append((Kind.ATTN_GATE, NONE, hq, dp))
    return out


def _attention_scratch(h: "ModelHeader", r: LayerRecord) -> int:
    """The output gate's values of a pass (runtime attention.c: the arena's mixer scratch)."""
    return h.n_heads * h.head_dim if r.mixer_flags & MixerFlag.OUTPUT_GATE else 0


# gated_deltanet (runtime/src/layers/deltanet.c): window = the convolution's width,
# mixer_params = (key heads, value heads, key head dim, value head dim).
DELTANET_LIMITS = {"conv width": 64, "heads": 1024, "head dim": 1024, "width": 262_144}


@dataclass(frozen=True)
class DeltaNetGeometry:
    hk: int
    hv: int
    dk: int
    dv: int
    width: int

    @classmethod
    def of(cls, r: LayerRecord) -> "DeltaNetGeometry":
        return cls(*r.mixer_params, r.window)

    @property
    def kd(self) -> int:
        return self.hk * self.dk

    @property
    def vd(self) -> int:
        return self.hv * self.dv

    @property
    def channels(self) -> int:  # the convolution's: q | k | v
        return 2 * self.kd + self.vd

    @property
    def state_floats(self) -> int:  # the conv's last width-1 inputs, then Hv states [Dk, Dv]
        return (self.width - 1) * self.channels + self.hv * self.dk * self.dv


def _check_deltanet(h: "ModelHeader", i: int, r: LayerRecord) -> None:
    where = f"layer {i} (gated_deltanet)"
    if not 1 <= r.window <= DELTANET_LIMITS["conv width"]:
        raise ModelError(f"{where}: field window {r.window}, the convolution width must be in "
                         f"1..{DELTANET_LIMITS['conv width']}")
    if r.mixer_flags:
        raise ModelError(f"{where}: field mixer_flags {r.mixer_flags:#x}, none are defined")
    names = ("key heads", "value heads", "key head dim", "value head dim")
    for k, (name, v) in enumerate(zip(names, r.mixer_params)):
        lim = DELTANET_LIMITS["heads" if k < 2 else "head dim"]
        if not 1 <= v <= lim:
            raise ModelError(f"{where}: field mixer_params[{k}] ({name}) {v}, must be in 1..{lim}")
    g = DeltaNetGeometry.of(r)
    if g.hv % g.hk:
        raise ModelError(f"{where}: {g.hv} value heads are not a multiple of {g.hk} key heads")
    if max(g.kd, g.vd) > DELTANET_LIMITS["width"]:
        raise ModelError(f"{where}: key width {g.kd} or value width {g.vd} exceeds {DELTANET_LIMITS['width']}")


def _deltanet_tensors(h: "ModelHeader", r: LayerRecord) -> list[tuple["Kind", int, int, int]]:
    g, dp = DeltaNetGeometry.of(r), h.embed_dim_pad
    return [(Kind.ATTN_NORM, NONE, 1, dp), (Kind.DN_QKV, NONE, g.channels, dp), (Kind.DN_Z, NONE, g.vd, dp),
            (Kind.DN_B, NONE, g.hv, dp), (Kind.DN_A, NONE, g.hv, dp), (Kind.DN_CONV, NONE, g.channels, g.width),
            (Kind.DN_A_LOG, NONE, 1, g.hv), (Kind.DN_DT_BIAS, NONE, 1, g.hv), (Kind.DN_NORM, NONE, 1, g.dv),
            (Kind.DN_OUT, NONE, dp, g.vd)]


def _deltanet_scratch(h: "ModelHeader", r: LayerRecord) -> int:
    """Per token of a pass: projections and conv output [C] each, z and o [Vd] each, b and a."""
    g = DeltaNetGeometry.of(r)
    return 2 * g.channels + 2 * g.vd + 2 * g.hv


def _check_moe(h: "ModelHeader", i: int, r: LayerRecord) -> None:
    """ffn_params[0]: FfnFlag bits; [1], [2]: the clamped SwiGLU's alpha and limit (finite, > 0)
    with CLAMPED_SWIGLU, else 0; [3]: 0."""
    where = f"layer {i} (moe)"
    flags = r.ffn_params[0]
    if flags & ~FFN_FLAGS:
        raise ModelError(f"{where}: field ffn_params[0] {flags:#x}, bits {flags & ~FFN_FLAGS:#x} are not "
                         "defined (a newer format feature: update the kit)")
    if flags & FfnFlag.CLAMPED_SWIGLU:
        for k, name in ((1, "alpha"), (2, "limit")):
            v = f32_from_bits(r.ffn_params[k])
            if not (math.isfinite(v) and v > 0):
                raise ModelError(f"{where}: field ffn_params[{k}] (SwiGLU {name}) {v}, must be finite and > 0")
        _params_zero(where, r.ffn_params[3:], "ffn_params[3:]")
    else:
        _params_zero(where, r.ffn_params[1:], "ffn_params[1:]")


def _moe_tensors(h: "ModelHeader", r: LayerRecord) -> list[tuple["Kind", int, int, int]]:
    dp, e_n, f = h.embed_dim_pad, h.num_experts, h.expert_size
    out = [(Kind.FFN_NORM, NONE, 1, dp), (Kind.ROUTER, NONE, e_n, dp)]
    if r.ffn_params[0] & FfnFlag.ROUTER_BIAS:
        out.append((Kind.ROUTER_BIAS, NONE, 1, e_n))
    out += [(Kind.EXPERT_W1, e, f, dp) for e in range(e_n)]
    out += [(Kind.EXPERT_W3, e, f, dp) for e in range(e_n)]
    out += [(Kind.EXPERT_W2, e, dp, f) for e in range(e_n)]
    if r.ffn_params[0] & FfnFlag.EXPERT_BIAS:
        out += [(Kind.EXPERT_B1, e, 1, f) for e in range(e_n)]
        out += [(Kind.EXPERT_B3, e, 1, f) for e in range(e_n)]
        out += [(Kind.EXPERT_B2, e, 1, dp) for e in range(e_n)]
    if h.has(Flag.SHARED_EXPERT):
        fs = h.shared_expert_size
        out += [(Kind.SHARED_W1, NONE, fs, dp), (Kind.SHARED_W3, NONE, fs, dp),
                (Kind.SHARED_W2, NONE, dp, fs)]
        if h.has(Flag.SHARED_EXPERT_GATE):
            out.append((Kind.SHARED_GATE, NONE, 1, dp))
    return out


MIXERS: dict[int, LayerKind] = {
    Mixer.ATTENTION: LayerKind("attention", _check_attention, _attention_tensors,
                               lambda h, r: h.max_seq_len, scratch_floats=_attention_scratch),
    # a ring of W rows (a window that covers the context is a full cache)
    Mixer.SLIDING_ATTENTION: LayerKind("sliding_attention", _check_sliding, _attention_tensors,
                                       lambda h, r: min(r.window, h.max_seq_len),
                                       scratch_floats=_attention_scratch),
    # no K/V rows: a fixed-size state (the conv's inputs and the delta-rule states)
    Mixer.GATED_DELTANET: LayerKind("gated_deltanet", _check_deltanet, _deltanet_tensors,
                                    lambda h, r: 0, lambda h, r: DeltaNetGeometry.of(r).state_floats,
                                    _deltanet_scratch, lambda h, r: DeltaNetGeometry.of(r).vd),
}
FFNS: dict[int, LayerKind] = {
    Ffn.MOE: LayerKind("moe", _check_moe, _moe_tensors, lambda h, r: 0),
}


def layer_kv_positions(h: "ModelHeader", i: int) -> int:
    """K and V rows layer ``i`` keeps per context (runtime/src/core/arena.c)."""
    r = h.layer(i)
    return MIXERS[r.mixer].kv_positions(h, r) + FFNS[r.ffn].kv_positions(h, r)


def layer_state_floats(h: "ModelHeader", i: int) -> int:
    """The recurrent state layer ``i`` keeps per context, in f32 values (runtime arena.c)."""
    r = h.layer(i)
    return MIXERS[r.mixer].state_floats(h, r) + FFNS[r.ffn].state_floats(h, r)


def pass_needs(h: "ModelHeader") -> tuple[int, int]:
    """(mixer scratch floats per token, widest matrix input) over every layer's kinds: what the
    runtime's arena adds for a pass (arena.c colibri_arena_plan)."""
    scratch = cols = 0
    for i in range(h.n_layers):
        r = h.layer(i)
        for lk in (MIXERS[r.mixer], FFNS[r.ffn]):
            scratch, cols = max(scratch, lk.scratch_floats(h, r)), max(cols, lk.in_cols(h, r))
    return scratch, cols


def layer_window(h: "ModelHeader", i: int) -> int | None:
    """The positions a token of layer ``i`` attends to (None: all before it)."""
    r = h.layer(i)
    return r.window if r.mixer == Mixer.SLIDING_ATTENTION else None


def kv_staged(h: "ModelHeader") -> bool:
    """Does some layer keep a ring shorter than the context? (Then the runtime's arena has a
    stage for a pass's K/V rows, runtime/src/layers/attention.c.)"""
    return any(layer_kv_positions(h, i) < h.max_seq_len for i in range(h.n_layers)
               if h.layer(i).mixer == Mixer.SLIDING_ATTENTION)


def layer_pattern(records: tuple[LayerRecord, ...] | list[LayerRecord]) -> str:
    """The layer list in short: its shortest repeating period, e.g. ``2 x [attention + moe]``
    or ``12 x [sliding_attention(128) + moe, attention + moe]``."""
    n = len(records)
    for p in range(1, n + 1):
        if n % p == 0 and all(records[i] == records[i % p] for i in range(n)):
            return f"{n // p} x [{', '.join(r.label() for r in records[:p])}]"
    return ""  # n == 0


def _check_layer_table(h: "ModelHeader", actual_size: int) -> None:
    """The layer table starts right after the tensor records and ends by the data."""
    at, end = h.layer_table_offset, h.layer_table_offset + h.n_layers * LAYER_RECORD_SIZE
    want = HEADER_SIZE + h.n_tensors * RECORD_SIZE
    if at != want:
        raise ModelError(f"header field layer_table_offset: {at}, but field n_tensors {h.n_tensors} "
                         f"ends the tensor table at {want}, where the layer table must start")
    if end > min(actual_size, h.data_offset):
        raise ModelError(f"header field layer_table_offset: the {h.n_layers}-record layer table "
                         f"[{at}, {end}) runs past data_offset {h.data_offset} or the end of the file "
                         f"({actual_size} bytes)")


def _in_range(name: str, value: int, lo: int, hi: int) -> None:
    if not lo <= value <= hi:
        raise ModelError(f"header field {name}: {value}, allowed {lo}..{hi}")


def _decode_name(raw: bytes) -> str:
    try:
        return raw.split(b"\0", 1)[0].decode("utf-8")
    except UnicodeDecodeError:
        raise ModelError("header field name: not valid UTF-8") from None


# ----------------------------------------------------------------------------------------------
# Tensor records


@dataclass(frozen=True)
class TensorRecord:
    kind: int
    layer: int
    expert: int
    dtype: int
    rows: int
    cols: int
    offset: int
    nbytes: int
    scale_offset: int = 0
    scale_nbytes: int = 0
    reserved: tuple[int, int] = (0, 0)

    @property
    def key(self) -> tuple[int, int, int]:
        return (self.kind, self.layer, self.expert)

    def label(self) -> str:
        return tensor_label(self.kind, self.layer, self.expert)

    def pack(self) -> bytes:
        return _RECORD.pack(self.kind, self.layer, self.expert, self.dtype, self.rows, self.cols,
                            self.offset, self.nbytes, self.scale_offset, self.scale_nbytes,
                            *self.reserved)

    @classmethod
    def unpack(cls, buf: bytes) -> "TensorRecord":
        v = _RECORD.unpack(buf)
        return cls(*v[:10], reserved=(v[10], v[11]))


def tensor_label(kind: int, layer: int = NONE, expert: int = NONE) -> str:
    name = Kind(kind).name if kind in Kind._value2member_map_ else f"kind {kind}"
    parts = [name]
    if layer != NONE:
        parts.append(f"layer {layer}")
    if expert != NONE:
        parts.append(f"expert {expert}")
    return " ".join(parts)


@dataclass(frozen=True)
class TensorSpec:
    """What the geometry requires of one tensor: its stored shape, whether it must be f32, and
    the dtype the writer stores it in (f32, the header's dtype, or the experts' own)."""

    kind: Kind
    layer: int
    expert: int
    rows: int
    cols: int
    f32_only: bool
    dtype: int = DType.F32

    @property
    def key(self) -> tuple[int, int, int]:
        return (int(self.kind), self.layer, self.expert)


def expected_tensors(h: ModelHeader) -> dict[tuple[int, int, int], TensorSpec]:
    """Every tensor the header's geometry and flags require, keyed by (kind, layer, expert),
    in table order (layer, kind, expert)."""
    dp = h.embed_dim_pad
    specs: list[TensorSpec] = []

    def add(kind: Kind, rows: int, cols: int, layer: int = NONE, expert: int = NONE) -> None:
        f32 = kind in F32_KINDS
        dt = DType.F32 if f32 else h.expert_dtype if (kind in EXPERT_KINDS and h.expert_dtype is not None) \
            else h.dtype
        specs.append(TensorSpec(kind, layer, expert, rows, cols, f32, int(dt)))

    for layer in range(h.n_layers):  # each layer's tensors, as its kinds say
        r = h.layer(layer)
        for lk in (MIXERS.get(r.mixer), FFNS.get(r.ffn)):  # unknown kinds: validate_layers refuses
            for kind, expert, rows, cols in (lk.tensors(h, r) if lk else ()):
                add(kind, rows, cols, layer, expert)
    add(Kind.TOK_EMBED, h.vocab_size, dp)
    add(Kind.OUTPUT_NORM, 1, dp)
    if not h.has(Flag.TIED_EMBEDDINGS):
        add(Kind.LM_HEAD, h.vocab_size, dp)
    specs.sort(key=lambda s: (s.layer, int(s.kind), s.expert))
    return {s.key: s for s in specs}


# ----------------------------------------------------------------------------------------------
# Dtype conversion (NumPy only)


def f32_to_bf16_bits(a: np.ndarray) -> np.ndarray:
    """Round f32 to bf16 (nearest, ties to even) and return the 16-bit patterns."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    rounding = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))
    return ((bits + rounding) >> np.uint32(16)).astype(np.uint16)


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def quantize_int8(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-row int8: scale = max|row| / 127 (1.0 for an all-zero row),
    q = round-half-even(row / scale), so q is in [-127, 127]."""
    a = np.asarray(a, dtype=np.float32)
    amax = np.max(np.abs(a), axis=1)
    scale = (amax / np.float32(127.0)).astype(np.float32)
    scale[amax == 0] = np.float32(1.0)
    q = np.clip(np.rint(a / scale[:, None]), -127, 127).astype(np.int8)
    return q, scale


def _row_blocks(a: np.ndarray, n: int, block: int, dtype: type) -> np.ndarray:
    """a [rows, cols] as [rows, n, block] in ``dtype``, each row zero-padded to n * block columns
    (the quantisers' groups and blocks along a row)."""
    rows, cols = a.shape
    x = np.zeros((rows, n * block), dtype)
    x[:, :cols] = a
    return x.reshape(rows, n, block)


def quantize_q4(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Grouped symmetric 4-bit: f32 [rows, cols] -> (nibbles uint8 [rows, groups * 16], scales
    f16 [rows, groups]). Per group of Q4_GROUP columns (zero-padded): m = the value of largest
    magnitude (first one on ties), d = f16(m / -8), q = clip(round-half-even(x / d), -8, 7)
    (q = 0 for an all-zero group, d = 0); w = q * d is exact in f32."""
    a = np.asarray(a, dtype=np.float32)
    rows, cols = a.shape
    ng = q4_groups(cols)
    x = _row_blocks(a, ng, Q4_GROUP, np.float32)
    idx = np.argmax(np.abs(x), axis=2)
    big = np.take_along_axis(x, idx[..., None], axis=2)[..., 0]
    with np.errstate(over="ignore"):
        d = (big / np.float32(-8.0)).astype(np.float16)
    if not np.all(np.isfinite(d)):
        raise ModelError("values beyond the q4 scale range (|w| > 8 * 65504); use --dtype int8 or f32")
    df = d.astype(np.float32)
    safe = np.where(df == 0, np.float32(1.0), df)
    q = np.clip(np.rint(x / safe[..., None]), -8, 7).astype(np.int16)
    q[df == 0] = 0
    nib = (q + 8).astype(np.uint8).reshape(rows, ng, 2, Q4_BLOCK_BYTES)
    packed = nib[:, :, 0, :] | (nib[:, :, 1, :] << np.uint8(4))
    return packed.reshape(rows, ng * Q4_BLOCK_BYTES), d


def dequantize_q4(packed: np.ndarray, scales: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """Inverse of quantize_q4: nibbles uint8 [rows, groups * 16] + f16 scales -> f32 [rows, cols]."""
    ng = q4_groups(cols)
    p = np.asarray(packed, dtype=np.uint8).reshape(rows, ng, Q4_BLOCK_BYTES)
    q = np.concatenate([p & np.uint8(15), p >> np.uint8(4)], axis=2).astype(np.float32) - np.float32(8)
    d = np.asarray(scales).view("<f2").reshape(rows, ng).astype(np.float32)
    return (q * d[..., None]).reshape(rows, ng * Q4_GROUP)[:, :cols]


# E2M1 magnitudes' midpoints: a value on one of them rounds to the even code (round half to even)
_E2M1_MIDS = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])


def quantize_mxfp4(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """f32 [rows, cols] -> (blocks uint8 [rows, nb * 16], E8M0 scales uint8 [rows, nb]), blocks of
    MX_BLOCK columns (the last zero-padded). Per block: the scale exponent e = ceil(log2(amax / 6))
    (the largest magnitude lands on E2M1's 6 or below, never clamped: the rounding of
    triton_kernels' downcast_to_mxfp, which transformers' Mxfp4Quantize calls), clamped to
    -127..127 (s = e + 127; an all-zero block has s = 0); each value x / 2^e rounded to the
    nearest E2M1 value, ties to the even code, with x's sign."""
    a = np.asarray(a, dtype=np.float32)
    rows, cols = a.shape
    nb = mx_blocks(cols)
    x = _row_blocks(a, nb, MX_BLOCK, np.float64)
    amax = np.max(np.abs(x), axis=2)
    m, ex = np.frexp(amax / 6.0)  # amax / 6 = m * 2^ex, m in [0.5, 1): ceil(log2) = ex, or ex - 1 at m = 0.5
    e = np.where(amax > 0, ex - (m == 0.5), -127)
    e = np.clip(e, -127, 127)
    mag = np.abs(x) / np.ldexp(1.0, e)[..., None]
    idx = np.searchsorted(_E2M1_MIDS, mag, side="left")
    tie = (idx < len(_E2M1_MIDS)) & (mag == _E2M1_MIDS[np.minimum(idx, len(_E2M1_MIDS) - 1)])
    idx = np.minimum(idx + (tie & (idx % 2 == 1)), 7)
    code = (idx + 8 * (x < 0)).astype(np.uint8)
    packed = code[..., 0::2] | (code[..., 1::2] << np.uint8(4))
    return packed.reshape(rows, nb * MX_BLOCK_BYTES), (e + 127).astype(np.uint8)


def dequantize_mxfp4(packed: np.ndarray, scales: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """mxfp4 blocks uint8 [rows, nb * 16] + E8M0 scales [rows, nb] -> f32 [rows, cols] (exact:
    an E2M1 value times a power of two; as transformers' convert_moe_packed_tensors)."""
    nb = mx_blocks(cols)
    p = np.asarray(packed, dtype=np.uint8).reshape(rows, nb, MX_BLOCK_BYTES)
    codes = np.stack([p & np.uint8(15), p >> np.uint8(4)], axis=3).reshape(rows, nb, MX_BLOCK)
    e = np.asarray(scales, dtype=np.uint8).reshape(rows, nb).astype(np.int32) - 127
    return np.ldexp(E2M1[codes], e[..., None]).reshape(rows, nb * MX_BLOCK)[:, :cols].astype(np.float32)


def encode(a: np.ndarray, dtype: DType) -> tuple[bytes, bytes]:
    """f32 rows -> (data bytes, scale bytes) in the file's little-endian encoding."""
    if dtype == DType.F32:
        return np.ascontiguousarray(a, dtype="<f4").tobytes(), b""
    if dtype == DType.F16:
        return np.ascontiguousarray(a.astype("<f2")).tobytes(), b""
    if dtype == DType.BF16:
        return f32_to_bf16_bits(a).astype("<u2").tobytes(), b""
    if dtype == DType.Q4:
        packed, d = quantize_q4(a)
        return packed.tobytes(), d.astype("<f2").tobytes()
    if dtype == DType.MXFP4:
        blocks, sc = quantize_mxfp4(a)
        return blocks.tobytes(), sc.tobytes()
    q, scale = quantize_int8(a)
    return q.tobytes(), scale.astype("<f4").tobytes()


def decode(raw: np.ndarray, dtype: int, rows: int, cols: int, scales: np.ndarray | None = None) -> np.ndarray:
    """Stored bytes (a uint8 view) -> f32 [rows, cols]."""
    if dtype == DType.F32:
        return raw.view("<f4").reshape(rows, cols).astype(np.float32)
    if dtype == DType.F16:
        return raw.view("<f2").reshape(rows, cols).astype(np.float32)
    if dtype == DType.BF16:
        return bf16_bits_to_f32(raw.view("<u2")).reshape(rows, cols)
    if dtype == DType.Q4:
        assert scales is not None
        return dequantize_q4(raw, scales, rows, cols)
    if dtype == DType.MXFP4:
        assert scales is not None
        return dequantize_mxfp4(raw, scales, rows, cols)
    q = raw.view(np.int8).reshape(rows, cols).astype(np.float32)
    assert scales is not None
    return q * scales.view("<f4").astype(np.float32)[:, None]


# ----------------------------------------------------------------------------------------------
# Writer


class RowSource(Protocol):
    """Anything the writer can stream: a shape and f32 rows on demand (e.g. a safetensors view)."""

    shape: tuple[int, ...]

    def rows(self, start: int, stop: int) -> np.ndarray: ...


CHUNK_BYTES = 8 << 20  # rows are converted and written this many f32 bytes at a time


def _source_rows(src: Any, start: int, stop: int) -> np.ndarray:
    if hasattr(src, "rows") and not isinstance(src, np.ndarray):
        out = src.rows(start, stop)
    else:
        out = src[start:stop]
    return np.asarray(out, dtype=np.float32)


class ModelWriter:
    """Write a `.colibri` file tensor by tensor.

    ``with ModelWriter(path, header) as w: w.add(Kind.WQ, layer, NONE, array) ...``

    Tensors are given in their checkpoint shape (``[out, in]``, 1-D for norms and biases, the
    hidden axis D unpadded, or already padded to Dp); the writer pads D to Dp with zeros, converts
    to the model dtype (f32-only kinds stay f32) and appends the bytes at an aligned offset. The
    output is written to a temporary file in the same directory and renamed into place only after
    every tensor the geometry requires has been added: a failure leaves nothing half-written.
    """

    def __init__(self, path: str | os.PathLike[str], header: ModelHeader,
                 metadata: dict[str, bytes] | None = None) -> None:
        self.path = Path(path)
        self.header = header
        self.metadata: dict[str, bytes] = {}
        for name, blob in (metadata or {}).items():
            self.add_metadata(name, blob)
        if header.version >= 3:  # the layer table is written even when every layer is the default
            header.layers = header.layer_records()
        header.validate_geometry()
        self.specs = expected_tensors(header)
        header.n_tensors = len(self.specs)
        header.layer_table_offset = HEADER_SIZE + RECORD_SIZE * header.n_tensors if header.version >= 3 else 0
        header.data_offset = data_start(header)
        self.records: dict[tuple[int, int, int], TensorRecord] = {}
        self._pos = header.data_offset
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".partial", dir=self.path.parent)
        self._tmp = Path(tmp)
        self._f = os.fdopen(fd, "w+b")
        self._closed = False

    def __enter__(self) -> "ModelWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def _align(self, nbytes: int) -> int:
        self._pos = align_up(self._pos, PAGE if nbytes >= LARGE_TENSOR else ALIGN)
        return self._pos

    def _spec(self, key: tuple[int, int, int]) -> TensorSpec:
        label = tensor_label(*key)
        spec = self.specs.get(key)
        if spec is None:
            raise ModelError(f"tensor {label}: not part of this model's geometry")
        if key in self.records:
            raise ModelError(f"tensor {label}: added twice")
        return spec

    def _write_scales(self, dtype: int, rows: int, cols: int, scales: list[bytes]) -> tuple[int, int]:
        if dtype not in SCALED_DTYPES:
            return 0, 0
        scale_nbytes = scale_bytes(dtype, rows, cols)
        scale_offset = self._align(scale_nbytes)
        self._f.seek(scale_offset)
        self._f.write(b"".join(scales))
        self._pos = scale_offset + scale_nbytes
        return scale_offset, scale_nbytes

    def add_mxfp4(self, kind: Kind, layer: int, expert: int, blocks: Any, scales: Any) -> TensorRecord:
        """Append an mxfp4 tensor from its blocks and scales as stored (a released checkpoint's
        ``*_blocks`` [rows, cols / 32, 16] and ``*_scales`` [rows, cols / 32], uint8 arrays or
        views): the bytes are copied, never re-quantised; the hidden axis is padded to Dp with
        zero blocks / rows."""
        key = (int(kind), layer, expert)
        label = tensor_label(*key)
        spec = self._spec(key)
        if spec.dtype != DType.MXFP4:
            raise ModelError(f"tensor {label}: mxfp4 blocks given, but this model stores it as "
                             f"{DType(spec.dtype).name.lower()}")
        b_shape, s_shape = tuple(blocks.shape), tuple(scales.shape)
        d = self.header.embed_dim
        src_rows = d if kind in D_ROWS else spec.rows
        src_cols = d if kind in D_COLS else spec.cols
        want_b = (src_rows, src_cols // MX_BLOCK, MX_BLOCK_BYTES)
        if src_cols % MX_BLOCK or b_shape != want_b or s_shape != want_b[:2]:
            raise ModelError(f"tensor {label}: mxfp4 blocks {list(b_shape)} and scales {list(s_shape)}, "
                             f"expected {list(want_b)} and {list(want_b[:2])} (rows x {src_cols} "
                             f"columns in blocks of {MX_BLOCK})")
        rows, cols = spec.rows, spec.cols
        nb, nb_src = mx_blocks(cols), want_b[1]
        nbytes = data_nbytes(DType.MXFP4, rows, cols)
        offset = self._align(nbytes)
        self._f.seek(offset)
        step = max(1, CHUNK_BYTES // max(1, nb * MX_BLOCK_BYTES))
        out_scales: list[bytes] = []
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            blk = np.zeros((r1 - r0, nb, MX_BLOCK_BYTES), np.uint8)
            sc = np.zeros((r1 - r0, nb), np.uint8)
            if r0 < src_rows:
                s1 = min(r1, src_rows)
                blk[: s1 - r0, :nb_src] = np.asarray(blocks[r0:s1], dtype=np.uint8)
                sc[: s1 - r0, :nb_src] = np.asarray(scales[r0:s1], dtype=np.uint8)
            if np.any(sc == 255):
                raise ModelError(f"tensor {label}: scale byte 255 (E8M0 NaN) in rows {r0}..{r1}")
            self._f.write(blk.tobytes())
            out_scales.append(sc.tobytes())
        self._pos = offset + nbytes
        soff, snb = self._write_scales(DType.MXFP4, rows, cols, out_scales)
        rec = TensorRecord(int(kind), layer, expert, int(DType.MXFP4), rows, cols, offset, nbytes, soff, snb)
        self.records[key] = rec
        return rec

    def add(self, kind: Kind, layer: int, expert: int, data: Any) -> TensorRecord:
        """Append one tensor. ``data``: an array (any float dtype) or a RowSource, 1-D or 2-D."""
        key = (int(kind), layer, expert)
        label = tensor_label(*key)
        spec = self._spec(key)
        shape = tuple(int(s) for s in data.shape)
        if len(shape) == 1:
            shape = (1, shape[0])
            data = data.reshape(1, shape[1])
        if len(shape) != 2:
            raise ModelError(f"tensor {label}: shape {shape}, expected 2-D")
        d, dp = self.header.embed_dim, self.header.embed_dim_pad
        want_rows = d if kind in D_ROWS else spec.rows
        want_cols = d if kind in D_COLS else spec.cols
        ok_rows = shape[0] in (want_rows, spec.rows)
        ok_cols = shape[1] in (want_cols, spec.cols)
        if not (ok_rows and ok_cols):
            raise ModelError(f"tensor {label}: shape {list(shape)}, expected {[want_rows, want_cols]}"
                             + (f" (or padded {[spec.rows, spec.cols]})" if dp != d else ""))
        dtype = DType(spec.dtype)
        rows, cols = spec.rows, spec.cols
        nbytes = data_nbytes(dtype, rows, cols)
        offset = self._align(nbytes)
        self._f.seek(offset)
        scales: list[bytes] = []
        step = max(1, CHUNK_BYTES // max(1, 4 * cols))
        for r0 in range(0, rows, step):
            r1 = min(rows, r0 + step)
            src_r1 = min(r1, shape[0])
            if r0 < shape[0]:
                chunk = _source_rows(data, r0, src_r1)
                if chunk.shape != (src_r1 - r0, shape[1]):
                    raise ModelError(f"tensor {label}: source rows {r0}..{src_r1} have shape {chunk.shape}")
                if not np.all(np.isfinite(chunk)):
                    raise ModelError(f"tensor {label}: contains NaN or infinity")
                chunk = pad_to(chunk, r1 - r0, cols)
            else:
                chunk = np.zeros((r1 - r0, cols), dtype=np.float32)
            if dtype == DType.F16 and chunk.size and np.max(np.abs(chunk)) > 65504.0:
                raise ModelError(f"tensor {label}: values beyond the f16 range (±65504); use --dtype bf16 or f32")
            blob, scale = encode(chunk, dtype)
            self._f.write(blob)
            scales.append(scale)
        self._pos = offset + nbytes
        scale_offset, scale_nbytes = self._write_scales(dtype, rows, cols, scales)
        rec = TensorRecord(int(kind), layer, expert, int(dtype), rows, cols, offset, nbytes,
                           scale_offset, scale_nbytes)
        self.records[key] = rec
        return rec

    def add_metadata(self, name: str, data: bytes) -> None:
        """Store a named blob in the metadata section (written at close)."""
        check_meta_name(name)
        if name in self.metadata:
            raise ModelError(f"metadata {name!r}: added twice")
        if len(self.metadata) >= MAX_META:
            raise ModelError(f"metadata {name!r}: more than {MAX_META} entries")
        self.metadata[name] = bytes(data)

    def _write_meta(self, at: int) -> int:
        """Write the metadata section at ``at`` (64-aligned); return its end."""
        names = sorted(self.metadata, key=lambda n: n.encode("ascii"))
        table_end = len(names) * META_ENTRY_SIZE
        pos = table_end
        entries = []
        for n in names:
            pos = align_up(pos, ALIGN)
            entries.append((n, pos, len(self.metadata[n])))
            pos += len(self.metadata[n])
        self._f.seek(at)
        for n, off, nbytes in entries:
            self._f.write(_META_ENTRY.pack(n.encode("ascii"), off, nbytes))
        for n, off, _ in entries:
            self._f.seek(at + off)
            self._f.write(self.metadata[n])
        self.header.meta_count = len(names)
        self.header.meta_offset = at
        self.header.meta_size = pos
        return at + pos

    def missing(self) -> list[str]:
        return [tensor_label(*k) for k in self.specs if k not in self.records]

    def close(self) -> Path:
        """Write table and header, flush, and rename the file into place."""
        if self._closed:
            return self.path
        try:
            missing = self.missing()
            if missing:
                more = f" (and {len(missing) - 5} more)" if len(missing) > 5 else ""
                raise ModelError("model incomplete, missing tensors: " + ", ".join(missing[:5]) + more)
            end = max(self.header.data_offset, self._pos)
            if self.metadata:
                end = self._write_meta(align_up(end, ALIGN))
            self._f.truncate(end)
            self.header.file_size = end
            self._f.seek(0)
            self._f.write(self.header.pack())
            for key in self.specs:  # table order = expected_tensors order (layer, kind, expert)
                self._f.write(self.records[key].pack())
            if self.header.version >= 3:  # the layer table follows the tensor table
                for layer in self.header.layers:
                    self._f.write(layer.pack())
            self._f.flush()
            os.fsync(self._f.fileno())
            self._f.close()
            os.chmod(self._tmp, 0o644)
            os.replace(self._tmp, self.path)
            self._closed = True
        except BaseException:
            self.abort()
            raise
        return self.path

    def abort(self) -> None:
        """Drop the partial output (nothing is left at ``path``)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._f.close()
        finally:
            self._tmp.unlink(missing_ok=True)


# ----------------------------------------------------------------------------------------------
# Reader


class ColibriModel:
    """A validated, memory-mapped `.colibri` file."""

    def __init__(self, path: Path, header: ModelHeader, records: dict[tuple[int, int, int], TensorRecord],
                 data: np.ndarray, meta: dict[str, tuple[int, int]] | None = None) -> None:
        self.path = path
        self.header = header
        self.records = records
        self._data = data
        self._meta = meta or {}

    def metadata(self, name: str) -> bytes | None:
        """The bytes of metadata blob ``name`` (None when absent; always None for version 1)."""
        span = self._meta.get(name)
        if span is None:
            return None
        return bytes(self._data[span[0]: span[0] + span[1]])

    def metadata_names(self) -> list[str]:
        return list(self._meta)

    def record(self, kind: Kind, layer: int = NONE, expert: int = NONE) -> TensorRecord:
        key = (int(kind), layer, expert)
        try:
            return self.records[key]
        except KeyError:
            raise ModelError(f"tensor {tensor_label(*key)}: not in {self.path}") from None

    def has(self, kind: Kind, layer: int = NONE, expert: int = NONE) -> bool:
        return (int(kind), layer, expert) in self.records

    def raw(self, kind: Kind, layer: int = NONE, expert: int = NONE) -> np.ndarray:
        """The stored bytes of one tensor (a uint8 view into the map, no copy)."""
        r = self.record(kind, layer, expert)
        return self._data[r.offset: r.offset + r.nbytes]

    def scales(self, kind: Kind, layer: int = NONE, expert: int = NONE) -> np.ndarray | None:
        r = self.record(kind, layer, expert)
        if r.dtype == DType.Q4:
            return self._data[r.scale_offset: r.scale_offset + r.scale_nbytes].view("<f2").astype(np.float32)
        if r.dtype == DType.MXFP4:  # E8M0 exponent bytes
            return self._data[r.scale_offset: r.scale_offset + r.scale_nbytes]
        if r.dtype != DType.INT8:
            return None
        return self._data[r.scale_offset: r.scale_offset + r.scale_nbytes].view("<f4").astype(np.float32)

    def tensor(self, kind: Kind, layer: int = NONE, expert: int = NONE, *, unpad: bool = False) -> np.ndarray:
        """One tensor as f32 ``[rows, cols]`` (dequantised; padded shape unless ``unpad``)."""
        r = self.record(kind, layer, expert)
        sc = None
        if r.dtype in SCALED_DTYPES:
            sc = self._data[r.scale_offset: r.scale_offset + r.scale_nbytes]
        out = decode(self._data[r.offset: r.offset + r.nbytes], r.dtype, r.rows, r.cols, sc)
        if unpad:
            d = self.header.embed_dim
            if kind in D_ROWS:
                out = out[:d]
            if kind in D_COLS:
                out = out[:, :d]
        return out

    def __iter__(self) -> Iterator[TensorRecord]:
        return iter(self.records.values())


def read_model(path: str | os.PathLike[str]) -> ColibriModel:
    """Map and validate a `.colibri` file; raise ModelError naming the first bad field."""
    path = Path(path)
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise ModelError(f"cannot read model {path}: {exc.strerror}") from None
    if size < HEADER_SIZE:
        raise ModelError(f"{path}: {size} bytes, shorter than the {HEADER_SIZE}-byte header (truncated?)")
    data = np.memmap(path, dtype=np.uint8, mode="r")
    header = ModelHeader.unpack(bytes(data[:HEADER_SIZE]))
    try:
        if header.magic == MAGIC and header.version == 3:  # first: a layer's kinds decide its tensors
            header.layers = _read_layers(header, data, size)
        header.validate(size)
        records = _read_table(header, data, size)
        meta = _read_meta(header, data)
        w1 = records.get((int(Kind.EXPERT_W1), 0, 0))
        if w1 is not None and w1.dtype != header.dtype:  # e.g. native mxfp4 experts
            header.expert_dtype = w1.dtype
    except ModelError as exc:
        raise ModelError(f"{path}: {exc}") from None
    return ColibriModel(path, header, records, data, meta)


def _read_layers(h: ModelHeader, data: np.ndarray, size: int) -> tuple[LayerRecord, ...]:
    """The version-3 layer records (placement checked first; contents by validate_layers)."""
    _in_range("n_layers", h.n_layers, 1, MAX_LAYERS)
    _check_layer_table(h, size)
    at = h.layer_table_offset
    return tuple(LayerRecord.unpack(bytes(data[at + i * LAYER_RECORD_SIZE: at + (i + 1) * LAYER_RECORD_SIZE]))
                 for i in range(h.n_layers))


def check_meta_name(name: str) -> bytes:
    """A metadata name as stored: 1..47 ASCII bytes of [A-Za-z0-9._-]."""
    raw = name.encode("ascii", "replace")
    if not 1 <= len(raw) < META_NAME_SIZE or any(c not in _META_NAME_CHARS for c in raw):
        raise ModelError(f"metadata name {name!r}: must be 1..{META_NAME_SIZE - 1} characters of "
                         "A-Z a-z 0-9 . _ -")
    return raw


def _read_meta(h: ModelHeader, data: np.ndarray) -> dict[str, tuple[int, int]]:
    """Validate the metadata table (names sorted and unique, blobs in order, inside the section)
    and return name -> (absolute offset, size)."""
    out: dict[str, tuple[int, int]] = {}
    table_end = h.meta_count * META_ENTRY_SIZE
    prev_name = b""
    prev_end = table_end
    for i in range(h.meta_count):
        at = h.meta_offset + i * META_ENTRY_SIZE
        raw_name, off, nbytes = _META_ENTRY.unpack(bytes(data[at: at + META_ENTRY_SIZE]))
        name = raw_name.split(b"\0", 1)[0]
        where = f"metadata entry {i}"
        if (not name or raw_name[len(name):] != b"\0" * (META_NAME_SIZE - len(name))
                or any(c not in _META_NAME_CHARS for c in name)):
            raise ModelError(f"{where}: field name {raw_name!r} is not 1..{META_NAME_SIZE - 1} "
                             "NUL-padded characters of A-Z a-z 0-9 . _ -")
        where = f"metadata entry {i} ({name.decode()})"
        if name <= prev_name:
            raise ModelError(f"{where}: names must be unique and sorted (follows {prev_name.decode()!r})")
        if off % ALIGN or off < prev_end or off > h.meta_size or nbytes > h.meta_size - off:
            raise ModelError(f"{where}: field offset/size {off}/{nbytes} must be {ALIGN}-aligned, at or "
                             f"after {prev_end} and inside the {h.meta_size}-byte section")
        out[name.decode()] = (h.meta_offset + off, nbytes)
        prev_name, prev_end = name, off + nbytes
    return out


def _read_table(h: ModelHeader, data: np.ndarray, size: int) -> dict[tuple[int, int, int], TensorRecord]:
    specs = expected_tensors(h)
    order = list(specs)
    records: dict[tuple[int, int, int], TensorRecord] = {}
    spans: list[tuple[int, int, str]] = []
    for i in range(h.n_tensors):
        at = HEADER_SIZE + i * RECORD_SIZE
        r = TensorRecord.unpack(bytes(data[at: at + RECORD_SIZE]))
        where = f"tensor record {i}"
        spec = specs.get(r.key)
        if spec is None:
            raise ModelError(f"{where} ({tensor_label(r.kind, r.layer, r.expert) if r.kind in Kind._value2member_map_ else 'kind ' + str(r.kind)}): field kind/layer/expert is not part of this model's geometry")
        where = f"{where} ({r.label()})"
        if r.key in records:
            raise ModelError(f"{where}: appears twice")
        if r.key != order[i]:
            raise ModelError(f"{where}: table not sorted by layer, kind, expert (expected {tensor_label(*order[i])})")
        if (r.dtype not in DType._value2member_map_ or (r.dtype == DType.Q4 and h.version < 2)
                or (r.dtype == DType.MXFP4 and h.version < 3)):
            raise ModelError(f"{where}: field dtype {r.dtype}, allowed 0..5 (4, q4: version 2 and "
                             "later; 5, mxfp4: version 3)")
        if spec.f32_only and r.dtype != DType.F32:
            raise ModelError(f"{where}: field dtype {DType(r.dtype).name.lower()}, this kind must be f32")
        if (r.rows, r.cols) != (spec.rows, spec.cols):
            raise ModelError(f"{where}: field rows/cols [{r.rows}, {r.cols}], the geometry needs [{spec.rows}, {spec.cols}]")
        want = data_nbytes(r.dtype, r.rows, r.cols)
        if r.nbytes != want:
            how = ("rows*groups*16" if r.dtype in (DType.Q4, DType.MXFP4) else f"rows*cols*{DType(r.dtype).itemsize}")
            raise ModelError(f"{where}: field nbytes {r.nbytes}, expected {how} = {want}")
        _check_span(where, "offset", r.offset, r.nbytes, h.data_offset, h.tensor_end)
        spans.append((r.offset, r.offset + r.nbytes, where))
        if r.dtype in SCALED_DTYPES:
            want = scale_bytes(r.dtype, r.rows, r.cols)
            if r.scale_nbytes != want:
                how = {DType.Q4: "rows*groups*2", DType.MXFP4: "rows*blocks"}.get(DType(r.dtype), "rows*4")
                raise ModelError(f"{where}: field scale_nbytes {r.scale_nbytes}, expected {how} = {want}")
            _check_span(where, "scale_offset", r.scale_offset, r.scale_nbytes, h.data_offset, h.tensor_end)
            spans.append((r.scale_offset, r.scale_offset + r.scale_nbytes, where + " scales"))
        elif r.scale_offset or r.scale_nbytes:
            raise ModelError(f"{where}: fields scale_offset/scale_nbytes must be 0 for a tensor without scales (not int8, q4 or mxfp4)")
        if any(r.reserved):
            raise ModelError(f"{where}: field reserved must be zero")
        records[r.key] = r
    spans.sort()
    for (a0, a1, wa), (b0, b1, wb) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ModelError(f"{wb}: data overlaps {wa}")
    return records


def _check_span(where: str, name: str, offset: int, nbytes: int, data_offset: int, size: int) -> None:
    if offset % ALIGN:
        raise ModelError(f"{where}: field {name} {offset} is not {ALIGN}-byte aligned")
    if offset < data_offset:
        raise ModelError(f"{where}: field {name} {offset} lies before data_offset {data_offset}")
    if offset > size or nbytes > size - offset:
        raise ModelError(f"{where}: field {name} {offset} + {nbytes} bytes runs past the end of the tensor data ({size} bytes)")


def features(h: ModelHeader) -> list[str]:
    """What the model computes beyond attention + moe, in words (model-info's "features" line):
    sliding windows, attention sinks, biases, YaRN, the clamped SwiGLU, the experts' dtype."""
    recs = h.layer_records()
    out = []
    windows = sorted({r.window for r in recs if r.mixer == Mixer.SLIDING_ATTENTION})
    if windows:
        n = sum(r.mixer == Mixer.SLIDING_ATTENTION for r in recs)
        out.append(f"sliding window {'/'.join(map(str, windows))} in {n} of {len(recs)} layers")
    if any(r.mixer_flags & MixerFlag.SINKS for r in recs):
        out.append("attention sinks")
    if h.has(Flag.QKV_BIAS) or any(r.mixer_flags & MixerFlag.O_BIAS for r in recs):
        out.append("q/k/v" + ("/o" if any(r.mixer_flags & MixerFlag.O_BIAS for r in recs) else "") + " biases")
    if h.yarn is not None:
        y = h.yarn
        out.append(f"YaRN RoPE (factor {y.factor:g}, original context {y.original_max_position}, beta "
                   f"{y.beta_fast:g}/{y.beta_slow:g}, attention factor {y.attention_factor:.6g})")
    if any(r.ffn_params[0] & FfnFlag.ROUTER_BIAS for r in recs):
        out.append("router bias")
    if any(r.ffn_params[0] & FfnFlag.EXPERT_BIAS for r in recs):
        out.append("expert biases")
    swi = {r.swiglu for r in recs if r.ffn_params[0] & FfnFlag.CLAMPED_SWIGLU}
    for alpha, limit in sorted(swi):
        out.append(f"clamped SwiGLU (alpha {alpha:.6g}, limit {limit:.6g})")
    if h.expert_dtype is not None:
        out.append(f"experts {DType(h.expert_dtype).name.lower()}")
    return out


def header_json(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Validated header of a model file as a dict (for `invoke model-info`)."""
    from colibri_kit.model.tokenizer import describe_blobs

    m = read_model(path)
    d = m.header.to_json()
    d["tensors"] = len(m.records)
    d["tensor_dtypes"] = {DType(dt).name.lower(): n for dt, n in
                          sorted(Counter(r.dtype for r in m.records.values()).items())}
    d["features"] = features(m.header)
    d["metadata"] = {name: m._meta[name][1] for name in m.metadata_names()}  # name -> bytes
    d["tokenizer"] = describe_blobs(m.metadata("tokenizer.config"))  # None: no tokenizer (--ids only)
    return d

