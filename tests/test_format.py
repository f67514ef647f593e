"""The .colibri format: byte layout as documented, writer/reader round trips, refusals."""

from __future__ import annotations

import hashlib
import struct
from pathlib import Path

import numpy as np
import pytest

from colibri_kit.errors import ModelError
from colibri_kit.model import format as fmt
from colibri_kit.model.format import (
    NONE, DType, Flag, Kind, ModelWriter, bf16_bits_to_f32, expected_tensors, f32_to_bf16_bits,
    quantize_int8, read_model,
)
from colibri_kit.model.tiny import TINY_NAME, tiny_header, write_random_model, write_tiny_model

# sha256 of tiny-moe-4e2r (pad 64, f32; with its chat template since issue #21, and the layer table
# of format version 3). Pinned: C tests and device smoke tests rely on the same bytes everywhere;
# a change to tiny.py or the writer must be deliberate.
TINY_SHA256 = "baf3ce06aa3b02cfdb0306cf780b181d248c26948042647cf4d2a4dad6e73654"

ALL_FEATURES = int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS | Flag.QK_NORM_HEAD
                   | Flag.TIED_EMBEDDINGS)


def featured_header(dtype: DType = DType.F32, flags: int = ALL_FEATURES, pad: int = 64) -> fmt.ModelHeader:
    h = tiny_header(pad, dtype)
    h.flags = flags
    h.shared_expert_size = 40 if flags & Flag.SHARED_EXPERT else 0
    h.routing = 1
    h.name = "featured"
    return h


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# ---------------------------------------------------------------------------------------------
# Layout


def test_tiny_model_is_bit_identical_and_pinned(tmp_path: Path) -> None:
    a = write_tiny_model(tmp_path / "a.colibri")
    b = write_tiny_model(tmp_path / "b.colibri")
    assert a.read_bytes() == b.read_bytes()
    assert sha(a) == TINY_SHA256


def test_header_bytes_at_documented_offsets(tmp_path: Path) -> None:
    path = write_tiny_model(tmp_path / "t.colibri", pad=32)
    raw = path.read_bytes()
    assert raw[:8] == b"COLIBRI\0"
    # seed part: version, num_experts, expert_size, vocab_size, max_seq_len, embed_dim
    assert struct.unpack_from("<6I", raw, 8) == (3, 4, 64, 256, 128, 48)
    # header_size, n_layers, n_heads, n_kv_heads, head_dim, top_k, routing, dtype, Dp, pad, flags, Fs
    assert struct.unpack_from("<12I", raw, 32) == (256, 2, 4, 2, 12, 2, 0, 0, 64, 32, 0, 0)
    eps, theta = struct.unpack_from("<ff", raw, 80)
    assert eps == pytest.approx(1e-5) and theta == 10000.0
    n_tensors, table = struct.unpack_from("<II", raw, 88)
    data_offset, file_size = struct.unpack_from("<QQ", raw, 96)
    assert table == 256 and n_tensors == 41 and file_size == len(raw)
    assert data_offset % 4096 == 0 and data_offset >= 256 + 64 * n_tensors
    assert struct.unpack_from("<III", raw, 112) == (255, 1, 2)  # family other, bos, eos
    meta_count, meta_offset, meta_size = struct.unpack_from("<IQQ", raw, 124)
    if meta_count:  # metadata section (version 2): 64-aligned, after the tensors, at the file's end
        assert meta_offset % 64 == 0 and meta_offset >= data_offset and meta_offset + meta_size == len(raw)
        name, off, size = struct.unpack_from("<48sQQ", raw, meta_offset)
        assert name.rstrip(b"\0") and off >= 64 * meta_count and off + size <= meta_size
    else:
        assert meta_offset == meta_size == 0
    # version 3: the layer table right after the tensor table, one 64-byte record per layer
    layer_table = struct.unpack_from("<Q", raw, 144)[0]
    assert layer_table == 256 + 64 * n_tensors and layer_table + 2 * 64 <= data_offset
    assert raw[152:192] == bytes(40)
    for layer in range(2):  # mixer 1 (attention), ffn 1 (moe), window 0, the rest zero
        rec = raw[layer_table + 64 * layer: layer_table + 64 * (layer + 1)]
        assert struct.unpack_from("<4I", rec) == (1, 1, 0, 0) and rec[16:] == bytes(48)
    assert raw[192:256].rstrip(b"\0") == TINY_NAME.encode()
    # First record: ATTN_NORM of layer 0 (table sorted by layer, kind, expert; globals last).
    kind, layer, expert, dtype, rows, cols = struct.unpack_from("<6I", raw, 256)
    offset, nbytes, soff, snb = struct.unpack_from("<4Q", raw, 256 + 24)
    assert (kind, layer, expert, dtype, rows, cols) == (10, 0, NONE, 0, 1, 64)
    assert offset == data_offset and nbytes == 256 and soff == snb == 0
    last = struct.unpack_from("<3I", raw, 256 + 64 * (n_tensors - 1))
    assert last == (int(Kind.LM_HEAD), NONE, NONE)


def test_table_order_alignment_and_padding(tmp_path: Path) -> None:
    m = read_model(write_tiny_model(tmp_path / "t.colibri"))
    recs = list(m)
    order = [(r.layer, r.kind, r.expert) for r in recs]
    assert order == sorted(order)
    for r in recs:
        assert r.offset % 64 == 0
        if r.nbytes >= 64 * 1024:
            assert r.offset % 4096 == 0
    h = m.header
    assert (h.embed_dim, h.embed_dim_pad) == (48, 64)
    # Padded lanes are zero wherever the hidden axis appears.
    assert not m.tensor(Kind.TOK_EMBED)[:, 48:].any()
    assert not m.tensor(Kind.OUTPUT_NORM)[:, 48:].any()
    assert not m.tensor(Kind.WQ, 0)[:, 48:].any()
    assert not m.tensor(Kind.WO, 1)[48:].any()
    assert not m.tensor(Kind.EXPERT_W2, 1, 3)[48:].any()
    assert not m.tensor(Kind.ROUTER, 0)[:, 48:].any()
    assert m.tensor(Kind.WO, 1, unpad=True).shape == (48, 48)
    assert m.tensor(Kind.WO, 1)[:48].any()


# ---------------------------------------------------------------------------------------------
# Round trips


@pytest.mark.parametrize("dtype", list(DType))
def test_round_trip_every_kind(tmp_path: Path, dtype: DType) -> None:
    h = featured_header(dtype)
    rng = np.random.default_rng(5)
    data = {}
    with ModelWriter(tmp_path / "m.colibri", h) as w:
        for spec in expected_tensors(h).values():
            rows = 48 if spec.kind in fmt.D_ROWS else spec.rows
            cols = 48 if spec.kind in fmt.D_COLS else spec.cols
            a = rng.standard_normal((rows, cols)).astype(np.float32)
            if rows == 1 and spec.kind != Kind.SHARED_GATE:
                a = a[0]  # 1-D like a checkpoint's norm weight or bias
            w.add(spec.kind, spec.layer, spec.expert, a)
            data[spec.key] = np.atleast_2d(a)
    m = read_model(tmp_path / "m.colibri")
    assert m.header.flags == ALL_FEATURES and m.header.shared_expert_size == 40
    assert not m.has(Kind.LM_HEAD)  # tied
    for key, want in data.items():
        rec = m.records[key]
        got = m.tensor(Kind(key[0]), key[1], key[2], unpad=True)
        assert got.shape == want.shape
        if key[0] in {int(k) for k in fmt.F32_KINDS} or dtype == DType.F32:
            assert rec.dtype == DType.F32
            np.testing.assert_array_equal(got, want)
        elif dtype == DType.F16:
            np.testing.assert_array_equal(got, want.astype(np.float16).astype(np.float32))
        elif dtype == DType.BF16:
            np.testing.assert_allclose(got, want, rtol=2.0 ** -8, atol=0)
        elif dtype == DType.Q4:  # groups of 32 columns, one f16 scale each (tests/test_q4.py)
            groups = -(-rec.cols // 32)
            assert rec.scale_nbytes == rec.rows * groups * 2 and rec.nbytes == rec.rows * groups * 16
            step = np.max(np.abs(want), axis=1, keepdims=True) / 8
            assert np.all(np.abs(got - want) <= step * 1.001)
        elif dtype == DType.MXFP4:  # blocks of 32 columns, one E8M0 exponent each (tests/test_gptoss.py)
            blocks = -(-rec.cols // 32)
            assert rec.scale_nbytes == rec.rows * blocks and rec.nbytes == rec.rows * blocks * 16
            np.testing.assert_array_equal(got, fmt.dequantize_mxfp4(*fmt.quantize_mxfp4(want), *want.shape))
            # the largest magnitude lands on E2M1's 4..6 times 2^e: an error of at most 2^e < amax / 3
            assert np.all(np.abs(got - want) <= np.max(np.abs(want), axis=1, keepdims=True) / 3)
        else:
            assert rec.scale_nbytes == rec.rows * 4 and rec.scale_offset % 64 == 0
            step = np.max(np.abs(want), axis=1, keepdims=True) / 127
            assert np.all(np.abs(got - want) <= step * 0.5 + 1e-7)


def test_bf16_rounds_to_nearest_even() -> None:
    one = 1.0
    ulp = 2.0 ** -7
    x = np.array([one + ulp / 2, one + 1.5 * ulp, one + 0.6 * ulp, -3.0, 0.0], dtype=np.float32)
    got = bf16_bits_to_f32(f32_to_bf16_bits(x))
    np.testing.assert_array_equal(got, np.array([1.0, 1.0 + 2 * ulp, 1.0 + ulp, -3.0, 0.0], np.float32))


def test_int8_quantisation_rules() -> None:
    a = np.array([[0.0, 0.0, 0.0], [1.27, -0.635, 0.0], [-2.54, 1.0, 0.5]], dtype=np.float32)
    q, scale = quantize_int8(a)
    assert scale[0] == 1.0 and not q[0].any()
    assert q[1, 0] == 127 and q[2, 0] == -127
    assert q.min() >= -127
    np.testing.assert_allclose(scale[1:], [0.01, 0.02], rtol=1e-6)
    assert q[1, 1] == -64  # -63.5 rounds half to even


def test_random_model_helper_covers_olmoe_style_full_qk_norm(tmp_path: Path) -> None:
    h = featured_header(DType.BF16, flags=int(Flag.QK_NORM_FULL))
    m = read_model(write_random_model(tmp_path / "o.colibri", h, seed=2))
    assert m.tensor(Kind.Q_NORM, 1).shape == (1, 48)  # H*Dh
    assert m.tensor(Kind.K_NORM, 1).shape == (1, 24)  # Hkv*Dh
    assert m.has(Kind.LM_HEAD)


# ---------------------------------------------------------------------------------------------
# Writer refusals: nothing half-written is left behind


def _leftovers(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir())


def test_writer_refuses_incomplete_model_and_leaves_nothing(tmp_path: Path) -> None:
    h = tiny_header()
    with pytest.raises(ModelError, match="missing tensors: ATTN_NORM layer 0"):
        with ModelWriter(tmp_path / "x.colibri", h) as w:
            w.add(Kind.TOK_EMBED, NONE, NONE, np.zeros((256, 48), np.float32))
    assert _leftovers(tmp_path) == []


def test_writer_refusals_name_the_tensor(tmp_path: Path) -> None:
    h = tiny_header(dtype=DType.F16)
    with ModelWriter(tmp_path / "x.colibri", h) as w:
        with pytest.raises(ModelError, match=r"tensor WQ layer 1: shape \[47, 48\], expected \[48, 48\]"):
            w.add(Kind.WQ, 1, NONE, np.zeros((47, 48), np.float32))
        with pytest.raises(ModelError, match="tensor EXPERT_W1 layer 0 expert 9: not part"):
            w.add(Kind.EXPERT_W1, 0, 9, np.zeros((64, 48), np.float32))
        with pytest.raises(ModelError, match="LM_HEAD: contains NaN"):
            bad = np.zeros((256, 48), np.float32)
            bad[3, 3] = np.nan
            w.add(Kind.LM_HEAD, NONE, NONE, bad)
        with pytest.raises(ModelError, match="TOK_EMBED: values beyond the f16 range"):
            w.add(Kind.TOK_EMBED, NONE, NONE, np.full((256, 48), 1e6, np.float32))
        w.add(Kind.WK, 0, NONE, np.zeros((24, 48), np.float32))
        with pytest.raises(ModelError, match="WK layer 0: added twice"):
            w.add(Kind.WK, 0, NONE, np.zeros((24, 48), np.float32))
        w.abort()
    assert _leftovers(tmp_path) == []


def test_writer_replaces_only_when_complete(tmp_path: Path) -> None:
    out = write_tiny_model(tmp_path / "t.colibri")
    before = out.read_bytes()
    with pytest.raises(RuntimeError):
        with ModelWriter(out, tiny_header()) as w:
            w.add(Kind.TOK_EMBED, NONE, NONE, np.zeros((256, 48), np.float32))
            raise RuntimeError("interrupted")
    assert out.read_bytes() == before
    assert _leftovers(tmp_path) == ["t.colibri"]


# ---------------------------------------------------------------------------------------------
# Reader refusals: every corruption names the field


@pytest.fixture(scope="module")
def good_model(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    d = tmp_path_factory.mktemp("fmt")
    h = featured_header(DType.INT8)
    return write_random_model(d / "good.colibri", h, seed=1).read_bytes()


def _put(raw: bytes, offset: int, fmt_: str, *values: object) -> bytes:
    b = bytearray(raw)
    struct.pack_into(fmt_, b, offset, *values)
    return bytes(b)


def _record_offset(raw: bytes, kind: Kind, layer: int = NONE, expert: int = NONE) -> int:
    n = struct.unpack_from("<I", raw, 88)[0]
    for i in range(n):
        at = 256 + 64 * i
        if struct.unpack_from("<3I", raw, at) == (int(kind), layer, expert):
            return at
    raise AssertionError("record not found")


HEADER_CASES = [
    ("magic", 0, "<8s", b"COLIBRX\0"),
    ("version", 8, "<I", 4),
    ("version", 8, "<I", 0),
    ("reserved", 8, "<I", 2),  # a version-2 header with a layer table offset
    ("num_experts", 12, "<I", 0),
    ("num_experts", 12, "<I", 100000),
    ("expert_size", 16, "<I", 10**7),
    ("vocab_size", 20, "<I", 0),
    ("max_seq_len", 24, "<I", 2**31),
    ("embed_dim", 28, "<I", 70000),
    ("header_size", 32, "<I", 512),
    ("n_layers", 36, "<I", 5000),
    ("n_heads", 40, "<I", 0),
    ("n_kv_heads", 44, "<I", 3),
    ("head_dim", 48, "<I", 13),
    ("top_k", 52, "<I", 5),
    ("routing", 56, "<I", 7),
    ("dtype", 60, "<I", 9),
    ("embed_dim_pad", 64, "<I", 128),
    ("pad_multiple", 68, "<I", 24),
    ("flags", 72, "<I", 1 << 9),
    ("shared_expert_size", 76, "<I", 0),
    ("norm_eps", 80, "<f", float("nan")),
    ("rope_theta", 84, "<f", -1.0),
    ("n_tensors", 88, "<I", 7),
    ("tensor_table_offset", 92, "<I", 320),
    ("data_offset", 96, "<Q", 4096 + 64),
    ("data_offset", 96, "<Q", 2**63),
    ("file_size", 104, "<Q", 123),
    ("family", 112, "<I", 9),
    ("bos_token_id", 116, "<I", 256),
    ("reserved", 160, "<B", 1),
    ("layer_table_offset", 144, "<Q", 4096),
    ("layer_table_offset", 144, "<Q", 2880 + 64),
    ("meta_offset", 128, "<Q", 4096),
    ("name", 192, "<2s", b"\xff\xfe"),
]


@pytest.mark.parametrize("field,offset,fmt_,value", HEADER_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(HEADER_CASES)])
def test_reader_refuses_corrupt_header_field(tmp_path: Path, good_model: bytes, field: str, offset: int,
                                             fmt_: str, value: object) -> None:
    p = tmp_path / "bad.colibri"
    p.write_bytes(_put(good_model, offset, fmt_, value))
    with pytest.raises(ModelError, match=rf"field {field}\b"):
        read_model(p)


RECORD_CASES = [
    # (tensor, field offset in record, format, value, message)
    ((Kind.WQ, 0), 0, "<I", 99, "kind/layer/expert"),
    ((Kind.WQ, 0), 4, "<I", 7, "kind/layer/expert"),
    ((Kind.ROUTER, 1), 12, "<I", int(DType.INT8), "must be f32"),
    ((Kind.WQ, 0), 12, "<I", 6, "field dtype"),
    ((Kind.WK, 1), 16, "<I", 25, "field rows/cols"),
    ((Kind.WK, 1), 20, "<I", 48, "field rows/cols"),
    ((Kind.WV, 0), 24, "<Q", 2**64 - 64, "field offset"),  # offset + nbytes overflows u64
    ((Kind.WV, 0), 24, "<Q", 100, "not 64-byte aligned"),
    ((Kind.WV, 0), 24, "<Q", 0, "before data_offset"),
    ((Kind.WV, 0), 32, "<Q", 10**12, "field nbytes"),
    ((Kind.EXPERT_W2, 1, 3), 40, "<Q", 2**40, "field scale_offset"),
    ((Kind.EXPERT_W2, 1, 3), 48, "<Q", 4, "field scale_nbytes"),
    ((Kind.ATTN_NORM, 0), 40, "<Q", 4096, "scale_offset/scale_nbytes must be 0"),
    ((Kind.WQ, 0), 56, "<I", 1, "field reserved"),
]


@pytest.mark.parametrize("tensor,at,fmt_,value,message", RECORD_CASES,
                         ids=[f"{c[4]}-{i}" for i, c in enumerate(RECORD_CASES)])
def test_reader_refuses_corrupt_tensor_record(tmp_path: Path, good_model: bytes, tensor: tuple, at: int,
                                              fmt_: str, value: object, message: str) -> None:
    rec = _record_offset(good_model, *tensor)
    p = tmp_path / "bad.colibri"
    p.write_bytes(_put(good_model, rec + at, fmt_, value))
    with pytest.raises(ModelError, match=message):
        read_model(p)


def test_reader_refuses_overlapping_and_unsorted_records(tmp_path: Path, good_model: bytes) -> None:
    wk = _record_offset(good_model, Kind.WK, 0)
    wv = _record_offset(good_model, Kind.WV, 0)
    wk_offset = struct.unpack_from("<Q", good_model, wk + 24)[0]
    p = tmp_path / "bad.colibri"
    p.write_bytes(_put(good_model, wv + 24, "<Q", wk_offset))
    with pytest.raises(ModelError, match="overlaps"):
        read_model(p)
    raw = bytearray(good_model)
    raw[wk:wk + 64], raw[wv:wv + 64] = good_model[wv:wv + 64], good_model[wk:wk + 64]
    p.write_bytes(bytes(raw))
    with pytest.raises(ModelError, match="not sorted"):
        read_model(p)


@pytest.mark.parametrize("size", [0, 100, 256, 4096, -1])
def test_reader_refuses_truncated_file(tmp_path: Path, good_model: bytes, size: int) -> None:
    p = tmp_path / "short.colibri"
    p.write_bytes(good_model[:size])
    with pytest.raises(ModelError, match="truncated|file_size|shorter"):
        read_model(p)


def test_reader_reports_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="cannot read model"):
        read_model(tmp_path / "nope.colibri")


def test_model_info_json(tmp_path: Path) -> None:
    info = fmt.header_json(write_tiny_model(tmp_path / "t.colibri"))
    assert info["name"] == TINY_NAME and info["routing"] == "renormalise" and info["dtype"] == "f32"
    assert info["tensors"] == 41 and info["flags"] == [] and info["family"] == "other"
