"""Format version 2: the metadata section (named byte blobs) in the Python writer and reader.

The C loader's side (colibri_model_meta, refusals of every corrupted field) is in
runtime/tests/test_runtime.c (`test_meta`), run by tests/test_runtime_c.py::test_c_unit_tests.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from colibri_kit.errors import ModelError
from colibri_kit.model import format as fmt
from colibri_kit.model.format import ModelWriter, read_model
from colibri_kit.model.tiny import tiny_header, write_tiny_model

BLOBS = {"tokenizer.vocab": b"\x00\x01abc" * 10, "chat.template": "{{ x }} é".encode(), "a": b"",
         "z-last_1.2": bytes(range(256)) * 3}


def _write_with_meta(path: Path, blobs: dict[str, bytes]) -> Path:
    """The tiny model's tensors plus ``blobs`` (copied from a tiny model file; same bytes)."""
    src = read_model(write_tiny_model(path.with_suffix(".src")))
    with ModelWriter(path, tiny_header(64), metadata=blobs) as w:
        for rec in src:
            w.add(rec.kind, rec.layer, rec.expert, src.tensor(rec.kind, rec.layer, rec.expert))
    return path


@pytest.fixture(scope="module")
def meta_model(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return _write_with_meta(tmp_path_factory.mktemp("meta") / "m.colibri", BLOBS).read_bytes()


def test_round_trip_and_layout(meta_model: bytes, tmp_path: Path) -> None:
    p = tmp_path / "m.colibri"
    p.write_bytes(meta_model)
    m = read_model(p)
    assert m.header.version == fmt.VERSION >= 2  # the writer's version (3 adds the layer table)
    for name, blob in BLOBS.items():
        assert m.metadata(name) == blob
    assert m.metadata("absent") is None
    assert m.metadata_names() == sorted(BLOBS)
    count, off, size = struct.unpack_from("<IQQ", meta_model, 124)
    assert count == len(BLOBS) and off % 64 == 0 and off + size == len(meta_model)
    # entries sorted by name, blobs 64-aligned after the table, in entry order
    prev = 64 * count
    for i, name in enumerate(sorted(BLOBS)):
        raw, boff, bsize = struct.unpack_from("<48sQQ", meta_model, off + 64 * i)
        assert raw.rstrip(b"\0") == name.encode() and boff % 64 == 0 and boff >= prev
        assert meta_model[off + boff: off + boff + bsize] == BLOBS[name]
        prev = boff + bsize
    # the tensors end before the section
    assert all(r.offset + r.nbytes <= off for r in m)


def test_version_1_file_still_reads(tmp_path: Path) -> None:
    """A version-1 file is a version-2 file without the section and with version 1."""
    raw = bytearray(write_tiny_model(tmp_path / "t.colibri").read_bytes())
    count = struct.unpack_from("<I", raw, 124)[0]
    if count:  # the tiny model carries a tokenizer: rebuild it without one
        off = struct.unpack_from("<Q", raw, 128)[0]
        raw = raw[:off]
        struct.pack_into("<IQQ", raw, 124, 0, 0, 0)
        struct.pack_into("<Q", raw, 104, len(raw))
    struct.pack_into("<I", raw, 8, 1)
    struct.pack_into("<Q", raw, 144, 0)  # nor a layer table (version 3)
    p = tmp_path / "v1.colibri"
    p.write_bytes(bytes(raw))
    m = read_model(p)
    assert m.header.version == 1 and m.metadata("tokenizer.vocab") is None
    # version 1 keeps bytes 124..191 reserved: metadata fields there are refused
    struct.pack_into("<I", raw, 124, 1)
    p.write_bytes(bytes(raw))
    with pytest.raises(ModelError, match="version-1 file has no metadata"):
        read_model(p)


def _corrupt(raw: bytes, at: int, fmt_: str, value: object) -> bytes:
    b = bytearray(raw)
    struct.pack_into(fmt_, b, at, value)
    return bytes(b)


@pytest.mark.parametrize("where,fmt_,value,message", [
    ("entry0+0", "<B", ord("/"), "field name"),
    ("entry0+40", "<B", ord("x"), "field name"),
    ("entry1+0", "<B", 0, "field name"),
    ("entry1+0", "<B", ord("z"), "unique and sorted"),
    ("entry1+48", "<Q", 8, "64-aligned"),
    ("entry1+56", "<Q", 1 << 40, "inside the"),
    ("entry0+48", "<Q", 0, "at or after"),
    ("header+124", "<I", 100000, "meta_count"),
    ("header+128", "<Q", 64, "meta_offset"),
    ("header+136", "<Q", 1, "meta_offset"),
])
def test_reader_refuses_corrupt_metadata(meta_model: bytes, tmp_path: Path, where: str, fmt_: str,
                                         value: object, message: str) -> None:
    off = struct.unpack_from("<Q", meta_model, 128)[0]
    base, plus = where.split("+")
    at = (0 if base == "header" else off + 64 * int(base[-1])) + int(plus)
    p = tmp_path / "bad.colibri"
    p.write_bytes(_corrupt(meta_model, at, fmt_, value))
    with pytest.raises(ModelError, match=message):
        read_model(p)


@pytest.mark.parametrize("name", ["", "x" * 48, "a/b", "ü", "a b"])
def test_writer_refuses_bad_names(tmp_path: Path, name: str) -> None:
    w = ModelWriter(tmp_path / "x.colibri", tiny_header(64))
    try:
        with pytest.raises(ModelError, match="metadata name"):
            w.add_metadata(name, b"x")
        w.add_metadata("ok", b"1")
        with pytest.raises(ModelError, match="added twice"):
            w.add_metadata("ok", b"2")
    finally:
        w.abort()
    assert not (tmp_path / "x.colibri").exists()


def test_max_entries_constant_matches_c() -> None:
    src = (Path(__file__).resolve().parents[1] / "runtime/src/core/model.h").read_text()
    assert f"#define COLIBRI_META_MAX {fmt.MAX_META}u" in src
    assert f"#define COLIBRI_META_ENTRY_SIZE {fmt.META_ENTRY_SIZE}u" in src
    assert f"#define COLIBRI_META_NAME_SIZE {fmt.META_NAME_SIZE}u" in src
