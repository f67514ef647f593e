"""sha256 of files, streamed: the one digest the build manifest, verify and deploy agree on."""

from __future__ import annotations

import hashlib
from pathlib import Path

_BLOCK = 4 << 20


def file_sha256(path: Path) -> str:
    """Hex sha256 of a file, read in 4 MiB blocks (memory stays flat for multi-GB models)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(_BLOCK), b""):
            h.update(block)
    return h.hexdigest()
