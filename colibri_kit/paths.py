"""Well-known locations. Functions, not module constants, so tests can point them elsewhere."""

from __future__ import annotations

import os
from pathlib import Path


def project_root() -> Path:
    """The checkout holding tasks.py, targets/, templates/ and runtime/."""
    env = os.environ.get("COLIBRI_PROJECT_ROOT")
    return Path(env).resolve() if env else Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Where pinned toolchains are installed: outside the project and the user's environment."""
    env = os.environ.get("COLIBRI_CACHE_DIR")
    if env:
        return Path(env).expanduser().resolve()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "colibri-kit"


def targets_dir() -> Path:
    return project_root() / "targets"


def templates_dir() -> Path:
    return project_root() / "templates"


def runtime_dir() -> Path:
    return project_root() / "runtime"


def build_dir(target: str) -> Path:
    return project_root() / "build" / target


def dist_dir(target: str) -> Path:
    return project_root() / "dist" / target
