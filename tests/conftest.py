"""Shared fixtures: built runtimes for end-to-end tests, and an isolated copy of the project.

The build fixtures use the real build (colibri_kit.build) into the checkout's dist/, once per
session; the build is incremental, so a session after the first costs well under a second each.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kit_support import copy_project


@pytest.fixture(scope="session")
def hf_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where tests/hf_models.py builds its random-weight checkpoints (once per session)."""
    import hf_models

    return hf_models.session_root(tmp_path_factory)


@pytest.fixture(scope="session")
def hf_expected() -> dict:
    """Cache of transformers' answers per checkpoint, filled by hf_models.expect()."""
    return {}


def _quiet(msg: str) -> None:
    """Build progress goes to the captured output (shown when a test fails)."""
    print(msg)


@pytest.fixture(scope="session")
def host_colibri() -> Path:
    """Path to dist/host/bin/colibri, built (and verified) with the system cc for this machine."""
    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    result = build(load_profile("host"), where="host", progress=_quiet)
    binary = result.dist_dir / "bin" / "colibri"
    assert binary.is_file()
    return binary


@pytest.fixture(scope="session")
def orin_nx_build() -> Path:
    """dist/orin-nx/: aarch64 (zig, glibc 2.35) runtime with CUDA 12.6 sm_87 cubin + PTX, verified."""
    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    result = build(load_profile("orin-nx"), where="host", progress=_quiet)
    assert (result.dist_dir / "manifest.json").is_file()
    return result.dist_dir


@pytest.fixture
def copy_project_to():
    """copy_project as a fixture (test modules need not import conftest)."""
    return copy_project


@pytest.fixture
def project_copy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private project root (COLIBRI_PROJECT_ROOT) whose build/ and dist/ tests may wreck."""
    root = copy_project(tmp_path / "proj")
    monkeypatch.setenv("COLIBRI_PROJECT_ROOT", str(root))
    return root


@pytest.fixture(scope="session")
def cuda_host_build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The emulated-GPU build (tests/cuda_emu_support.py), built once for every module that
    runs the CUDA path: {"binary", "tmp", "libcuda", "libcuda_nograph"}."""
    from cuda_emu_support import build_cuda_host

    return build_cuda_host(tmp_path_factory.mktemp("cuda_host_build"))
