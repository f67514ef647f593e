"""The C tokenizer as a ctypes library (tests/c/tokenizer_lib.c), loaded from a TokenizerSpec's
blobs: the same code `colibri tokenize` runs, without a model file or a process per text."""

from __future__ import annotations

import ctypes
import subprocess
from pathlib import Path

from colibri_kit import paths
from colibri_kit.model.tokenizer import TokenizerSpec

ROOT = paths.project_root()
SOURCES = [ROOT / "runtime" / "src" / "text" / "tokenizer.c", ROOT / "runtime" / "src" / "text" / "unicode_tables.c",
           ROOT / "tests" / "c" / "tokenizer_lib.c"]


def build(out_dir: Path, count_work: bool = True) -> ctypes.CDLL:
    """Compile the library with the system cc, -O2 as the runtime (with the work counter unless
    ``count_work`` is false: the benchmark measures the product's code)."""
    out = out_dir / ("libtok_test.so" if count_work else "libtok_bench.so")
    subprocess.run(["cc", "-std=c11", "-O2", "-shared", "-fPIC", "-D_GNU_SOURCE",
                    *(["-DCOLIBRI_TOK_COUNT_WORK"] if count_work else []),
                    "-Wall", "-Werror", f"-I{ROOT / 'runtime' / 'include'}", f"-I{ROOT / 'runtime' / 'src'}",
                    "-o", str(out), *map(str, SOURCES)], check=True, capture_output=True, timeout=300)
    lib = ctypes.CDLL(str(out))
    b, sz = ctypes.c_char_p, ctypes.c_size_t
    lib.tok_new.argtypes = [b, sz, b, sz, b, sz, b, sz, ctypes.c_uint32, ctypes.c_char_p, sz]
    lib.tok_new.restype = ctypes.c_void_p
    lib.tok_free.argtypes = [ctypes.c_void_p]
    lib.tok_encode.argtypes = [ctypes.c_void_p, b, sz, ctypes.c_int, ctypes.POINTER(ctypes.c_int32), sz,
                               ctypes.POINTER(sz)]
    lib.tok_decode.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), sz, ctypes.c_int, ctypes.c_char_p,
                               sz, ctypes.POINTER(sz)]
    lib.tok_work.argtypes = [ctypes.c_int]
    lib.tok_work.restype = ctypes.c_ulonglong
    lib.tok_class.argtypes = [ctypes.c_uint32]
    return lib


class CTokenizer:
    """One loaded C tokenizer; encode/decode as colibri_tokenize / colibri_detokenize."""

    def __init__(self, lib: ctypes.CDLL, spec: TokenizerSpec) -> None:
        self.lib = lib
        self.blobs = spec.blobs()  # kept alive: the C tables point into them
        why = ctypes.create_string_buffer(512)
        bl = [self.blobs[k] for k in ("tokenizer.config", "tokenizer.vocab", "tokenizer.merges", "tokenizer.added")]
        self.t = lib.tok_new(bl[0], len(bl[0]), bl[1], len(bl[1]), bl[2], len(bl[2]), bl[3], len(bl[3]),
                             len(spec.vocab), why, len(why))
        if not self.t:
            raise RuntimeError(f"the C tokenizer refused the blobs: {why.value.decode()}")

    def encode(self, text: str | bytes, special: bool = True) -> list[int]:
        raw = text.encode("utf-8") if isinstance(text, str) else text
        n = ctypes.c_size_t()
        cap = len(raw) * 3 + 16
        ids = (ctypes.c_int32 * cap)()
        st = self.lib.tok_encode(self.t, raw, len(raw), int(special), ids, cap, ctypes.byref(n))
        if st:
            raise RuntimeError(f"encode: status {st}")
        return ids[: n.value]

    def decode(self, ids: list[int], skip: bool = False) -> str:
        arr = (ctypes.c_int32 * max(1, len(ids)))(*ids)
        n = ctypes.c_size_t()
        self.lib.tok_decode(self.t, arr, len(ids), int(skip), None, 0, ctypes.byref(n))
        out = ctypes.create_string_buffer(n.value + 1)
        st = self.lib.tok_decode(self.t, arr, len(ids), int(skip), out, n.value, ctypes.byref(n))
        if st:
            raise RuntimeError(f"decode: status {st}")
        return out.raw[: n.value].decode("utf-8")

    def work(self, reset: bool = True) -> int:
        return int(self.lib.tok_work(int(reset)))

    def __del__(self) -> None:
        if getattr(self, "t", None):
            self.lib.tok_free(self.t)
            self.t = None
