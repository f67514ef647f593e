"""Reading the small files of a checkpoint directory that may be hostile.

A Hugging Face directory is input from elsewhere: a file may be a link to ``/dev/zero``, a FIFO
that never delivers, gigabytes large, nested 200,000 levels deep or hold a 5000-digit number.
Every reader here opens only regular files (links to regular files are fine: the hub's cache is
made of them), without blocking, with a size cap checked before anything is read, and turns every
parse failure into a ``ModelError`` naming the file (and the position or key). Values that size
an allocation are checked by their users against explicit limits (``int_field``).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from colibri_kit.errors import ModelError

# Caps per kind of file: the largest real ones are o200k's and Gemma's tokenizer.json (~30 MB).
MAX_JSON_BYTES = 256 << 20
MAX_CONFIG_BYTES = 16 << 20


def read_regular(path: Path, max_bytes: int, what: str = "file") -> bytes:
    """The bytes of ``path``; ModelError unless it is a regular file of at most ``max_bytes``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                    else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode)
                    else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file")
            raise ModelError(f"{path}: is {kind}, not a regular {what}; give the checkpoint's own file")
        if st.st_size > max_bytes:
            raise ModelError(f"{path}: {st.st_size} bytes, larger than the {max_bytes >> 20} MiB a {what} "
                             "may have; is this the right file?")
        chunks, total = [], 0
        while True:  # read to EOF, never past the cap (the file may grow while it is read)
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - total))
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total > max_bytes:
                raise ModelError(f"{path}: grew past {max_bytes >> 20} MiB while it was read")
        return b"".join(chunks)
    except OSError as exc:
        raise ModelError(f"cannot read {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def parse_json(raw: bytes | str, where: str) -> Any:
    """JSON text -> value; ModelError naming ``where`` for bad UTF-8, bad syntax, nesting deeper
    than the interpreter's recursion limit (the C scanner raises RecursionError, cleanly, at about
    1000 levels; real files nest 6) and integers Python refuses to convert (over 4300 digits)."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise ModelError(f"{where}: not UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ModelError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise ModelError(f"{where}: JSON nested too deeply (thousands of levels); not a checkpoint file") from None
    except ValueError as exc:  # e.g. "Exceeds the limit (4300 digits) for integer string conversion"
        raise ModelError(f"{where}: a value cannot be read ({str(exc).split(';')[0]})") from None


def read_json(path: Path, max_bytes: int = MAX_CONFIG_BYTES, what: str = "JSON file") -> Any:
    """Parse a checkpoint JSON file (regular file, size cap, nesting cap)."""
    return parse_json(read_regular(path, max_bytes, what), str(path))


def read_json_object(path: Path, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    data = read_json(path, max_bytes)
    if not isinstance(data, dict):
        raise ModelError(f"{path}: expected a JSON object, found {type(data).__name__}")
    return data


def read_text(path: Path, max_bytes: int, what: str = "text file") -> str:
    raw = read_regular(path, max_bytes, what)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ModelError(f"{path}: not UTF-8 (byte {exc.start})") from None


def int_field(value: Any, where: str, lo: int, hi: int) -> int:
    """An integer in [lo, hi] (bools refused), else ModelError naming ``where``."""
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        shown = value if not isinstance(value, int) or abs(value) < 10**30 else f"an integer of {len(str(value))} digits"
        raise ModelError(f"{where}: {shown!r} is not an integer in {lo}..{hi}")
    return value
