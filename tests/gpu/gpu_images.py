"""The kernel images a built `colibri` carries, extracted from the binary itself.

The pycuda suite loads exactly what ships: it scans dist/<target>/bin/colibri with the kit's
verify scanner (colibri_kit.elf.find_cubins / find_ptx: the build stores each image raw and
64-byte aligned in .rodata) rather than the build directory's intermediate files. The image is
chosen with the runtime's rule (cuda_backend.c, colibri_cuda_pick_image): the cubin for exactly
the GPU's SM, else the highest PTX <= that SM.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from colibri_kit import elf


@dataclass(frozen=True)
class Image:
    kind: str    # "cubin" or "ptx"
    sm: int
    data: bytes  # cubin ELF bytes, or PTX text with its trailing NUL


def binary_images(binary: Path) -> list[Image]:
    data = binary.read_bytes()
    out = [Image("cubin", c.sm, data[c.offset:c.offset + c.size])
           for c in elf.find_cubins(data)]
    for p in elf.find_ptx(data):
        end = data.index(b"\0", p.offset)
        out.append(Image("ptx", p.sm, data[p.offset:end + 1]))
    return out


def pick(images: list[Image], sm: int) -> Image | None:
    for img in images:
        if img.kind == "cubin" and img.sm == sm:
            return img
    ptx = [i for i in images if i.kind == "ptx" and i.sm <= sm]
    return max(ptx, key=lambda i: i.sm) if ptx else None


_PARAM = {".u64": "P", ".u32": "i", ".s32": "i", ".f32": "f"}


def ptx_signatures(ptx: str) -> dict[str, str]:
    """Kernel name -> pycuda prepare() format ("P" pointer, "i" int, "f" float), from the PTX
    `.entry` parameter lists, so every call in the suite is checked against the compiled ABI."""
    sigs = {}
    for m in re.finditer(r"\.entry\s+(\w+)\s*\((.*?)\)", ptx, re.S):
        types = re.findall(r"\.param\s+(\.\w+)", m.group(2))
        sigs[m.group(1)] = "".join(_PARAM[t] for t in types)
    return sigs
