"""Read safetensors checkpoints with NumPy only (no torch): single files or sharded directories.

A safetensors file is ``u64 header_len | JSON header | data``; the header maps each tensor name to
``{"dtype", "shape", "data_offsets": [begin, end]}`` (offsets relative to the data start). Tensors
are mapped with ``np.memmap`` and only read when a converter asks for rows, so memory stays near
the size of the chunk being converted. Every offset and shape is checked against the file size.
"""

from __future__ import annotations

import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from colibri_kit.errors import ModelError
from colibri_kit.model.checkpoint_files import MAX_CONFIG_BYTES, parse_json, read_json_object
from colibri_kit.model.format import bf16_bits_to_f32

INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"
MAX_HEADER = 100 << 20  # the reference implementation refuses larger headers too

# safetensors dtype -> (NumPy dtype of the stored bits, is_bf16). U8: gpt-oss's mxfp4 blocks and
# scales (read as bytes through TensorView.raw, never as numbers).
_DTYPES: dict[str, tuple[str, bool]] = {"F32": ("<f4", False), "F16": ("<f2", False), "BF16": ("<u2", True),
                                        "U8": ("u1", False)}
FLOAT_DTYPES = ("F32", "F16", "BF16")


class TensorView:
    """A lazy view of a stored tensor: NumPy indexing and ``.T`` give new views (no copy);
    ``rows(a, b)`` and ``numpy()`` return float32 copies (bf16 widened exactly)."""

    def __init__(self, raw: np.ndarray, bf16: bool, name: str) -> None:
        self._raw = raw
        self.bf16 = bf16
        self.name = name

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self._raw.shape)

    @property
    def ndim(self) -> int:
        return self._raw.ndim

    def __getitem__(self, idx: Any) -> "TensorView":
        return TensorView(self._raw[idx], self.bf16, self.name)

    @property
    def T(self) -> "TensorView":  # noqa: N802 (NumPy's name)
        return TensorView(self._raw.T, self.bf16, self.name)

    def reshape(self, *shape: int) -> "TensorView":
        return TensorView(self._raw.reshape(*shape), self.bf16, self.name)

    def _f32(self, raw: np.ndarray) -> np.ndarray:
        if self.bf16:
            return bf16_bits_to_f32(np.ascontiguousarray(raw))
        return np.array(raw, dtype=np.float32)  # a copy: never a view into the read-only map

    def rows(self, start: int, stop: int) -> np.ndarray:
        return self._f32(self._raw[start:stop])

    def raw(self) -> np.ndarray:
        """The stored elements as they are (a view into the map; uint8 for U8 tensors)."""
        return self._raw

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """np.asarray(view): the stored elements (bf16 as its bits); used for U8 blocks."""
        return np.asarray(self._raw, dtype=dtype)

    def numpy(self) -> np.ndarray:
        return self._f32(self._raw)


@dataclass(frozen=True)
class Entry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsFile:
    """One validated ``.safetensors`` file, memory-mapped."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            st = self.path.stat()
        except OSError as exc:
            raise ModelError(f"cannot read {self.path}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ModelError(f"{self.path}: not a regular file (a device, FIFO or directory); give the checkpoint's own file")
        size = st.st_size
        if size < 8:
            raise ModelError(f"{self.path}: {size} bytes, too short for a safetensors header")
        with open(self.path, "rb") as f:
            hlen = int.from_bytes(f.read(8), "little")
            if hlen > MAX_HEADER or hlen > size - 8:
                raise ModelError(f"{self.path}: header length {hlen} runs past the file ({size} bytes)")
            raw_header = f.read(hlen)
        header = parse_json(raw_header, f"{self.path}: header")
        if not isinstance(header, dict):
            raise ModelError(f"{self.path}: header is not a JSON object")
        self.metadata = header.pop("__metadata__", None) or {}
        self.data_start = 8 + hlen
        data_len = size - self.data_start
        self.entries: dict[str, Entry] = {}
        for name, info in header.items():
            self.entries[name] = _entry(self.path, name, info, data_len)
        self._map: np.memmap | None = None

    def _data(self) -> np.ndarray:
        if self._map is None:
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        return self._map

    def keys(self) -> list[str]:
        return list(self.entries)

    def get(self, name: str) -> TensorView:
        e = self.entries[name]
        np_dtype, bf16 = _DTYPES[e.dtype]
        start = self.data_start + e.begin
        raw = self._data()[start: self.data_start + e.end]
        return TensorView(raw.view(np_dtype).reshape(e.shape), bf16, name)


def _entry(path: Path, name: str, info: Any, data_len: int) -> Entry:
    where = f"{path.name}: tensor {name[:200]}"
    if not isinstance(info, dict):
        raise ModelError(f"{where}: header entry is not an object")
    dtype = info.get("dtype")
    if not isinstance(dtype, str) or dtype not in _DTYPES:
        raise ModelError(f"{where}: dtype {repr(dtype)[:40]} not supported (F32, F16, BF16; U8 for mxfp4 blocks)")
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                              for s in shape):
        raise ModelError(f"{where}: shape {repr(shape)[:120]} is not a list of non-negative integers")
    offs = info.get("data_offsets")
    if (not isinstance(offs, list) or len(offs) != 2
            or not all(isinstance(o, int) and not isinstance(o, bool) and o >= 0 for o in offs)):
        raise ModelError(f"{where}: data_offsets {repr(offs)[:120]} is not [begin, end]")
    begin, end = offs
    nbytes = math.prod(shape) * np.dtype(_DTYPES[dtype][0]).itemsize
    if end < begin or end - begin != nbytes:
        raise ModelError(f"{where}: data_offsets {offs} hold {end - begin} bytes, shape {shape} {dtype} needs {nbytes}")
    if end > data_len:
        raise ModelError(f"{where}: data_offsets end {end} runs past the data ({data_len} bytes; truncated file?)")
    return Entry(name, dtype, tuple(shape), begin, end)


class Checkpoint:
    """All tensors of a Hugging Face checkpoint directory (one file or an index of shards)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.files: dict[str, SafetensorsFile] = {}
        self.where: dict[str, str] = {}
        index = self.dir / INDEX_NAME
        single = self.dir / SINGLE_NAME
        if os.path.lexists(index):
            self._load_index(index)
        elif os.path.lexists(single):
            f = SafetensorsFile(single)
            self.files[single.name] = f
            self.where = {k: single.name for k in f.keys()}
        else:
            raise ModelError(f"{self.dir}: no {SINGLE_NAME} or {INDEX_NAME} (only safetensors checkpoints are supported)")

    def _load_index(self, index: Path) -> None:
        doc = read_json_object(index, MAX_CONFIG_BYTES)
        weight_map = doc.get("weight_map")
        if not isinstance(weight_map, dict):
            raise ModelError(f"{index}: key weight_map is missing or not an object")
        for name, fname in weight_map.items():
            if not isinstance(fname, str) or Path(fname).name != fname or fname in ("", ".", ".."):
                raise ModelError(f"{index}: key weight_map[{name[:80]!r}] = {str(fname)[:80]!r} is not a file name "
                                 f"in {self.dir}")
            if fname not in self.files:
                self.files[fname] = SafetensorsFile(self.dir / fname)
            if name not in self.files[fname].entries:
                raise ModelError(f"{index}: tensor {name} is mapped to {fname}, which does not hold it")
            self.where[name] = fname

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def keys(self) -> list[str]:
        return list(self.where)

    def entry(self, name: str) -> Entry:
        return self.files[self.where[name]].entries[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entry(name).shape

    def get(self, name: str) -> TensorView:
        if name not in self.where:
            raise ModelError(f"checkpoint {self.dir}: tensor {name} is missing")
        return self.files[self.where[name]].get(name)

    def __iter__(self) -> Iterator[tuple[str, TensorView]]:
        """Tensor by tensor, in file order (each one a lazy view)."""
        for fname, f in self.files.items():
            for name in f.keys():
                if self.where.get(name) == fname:
                    yield name, f.get(name)
