"""Helpers for test modules (imported by name; pytest puts tests/ on sys.path).

Kept out of conftest.py because tests/fleet/ has a conftest of its own: two modules named
`conftest` cannot both be imported by name.
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

from colibri_kit import paths


def copy_project(dest: Path) -> Path:
    """Copy what a build reads (runtime/, targets/, templates/) to `dest`, without outputs."""
    root = paths.project_root()
    dest.mkdir(parents=True, exist_ok=True)
    ignore = shutil.ignore_patterns("build", "*.o", "*.a", "__pycache__", "corpus-work")
    for name in ("runtime", "targets", "templates"):
        shutil.copytree(root / name, dest / name, ignore=ignore)
    return dest


@functools.lru_cache(maxsize=None)
def zig_command() -> tuple[str, ...]:
    """The kit's pinned zig (installed into the toolchain cache on first use), as an argv prefix."""
    from colibri_kit import toolchain

    return (str(toolchain.install_zig()),)


def runtime_library_sources() -> list[str]:
    """Every source of libcolibri.a (runtime/Makefile's LIB_SRCS: the .c files one folder below
    runtime/src/) plus the empty kernel table, for tests that compile the library themselves."""
    rt = paths.project_root() / "runtime"
    return [str(p) for p in sorted((rt / "src").glob("*/*.c"))] + [str(rt / "embed" / "kernel_images_empty.c")]
