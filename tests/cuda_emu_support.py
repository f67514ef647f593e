"""The emulated-GPU build the CUDA-path tests share (one per session: conftest.py's
`cuda_host_build` fixture): a host build with device code for sm_72 and sm_90, and libcuda
stand-ins that run each launched kernel in the host emulation."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from kit_support import copy_project

from colibri_kit import paths
from colibri_kit.build import build
from colibri_kit.profiles import load_profile

KERNELS = paths.project_root() / "runtime" / "kernels" / "colibri_kernels.cu"
GPU_TESTS = paths.project_root() / "tests" / "gpu"


def build_cuda_host(tmp: Path) -> dict[str, Path]:
    """A private project copy built for `host --cuda-archs sm_72,sm_90` (real NVRTC/ptxas: cubins
    sm_72 and sm_90, PTX compute_72 and compute_90, the latter and the sm_90 cubin with the
    tensor-core kernels), and a libcuda stand-in that runs each launched kernel in the host
    emulation (tests/gpu/stub_libcuda.c -DSTUB_EMULATE + tests/gpu/emu/cuda_emu.cpp) and finds a
    kernel only if the image the backend loaded defines it."""
    root = copy_project(tmp / "proj")
    old = os.environ.get("COLIBRI_PROJECT_ROOT")
    os.environ["COLIBRI_PROJECT_ROOT"] = str(root)
    try:
        result = build(load_profile("host"), where="host", cuda_archs=["sm_72", "sm_90"], progress=print)
    finally:
        if old is None:
            os.environ.pop("COLIBRI_PROJECT_ROOT", None)
        else:
            os.environ["COLIBRI_PROJECT_ROOT"] = old
    include = root / "build" / "host" / "include"
    cc, cxx = os.environ.get("CC", "cc"), os.environ.get("CXX", "g++")
    subprocess.run([cxx, "-std=c++20", "-O2", "-c", "-fPIC", "-fno-strict-aliasing",
                    "-Wno-unknown-pragmas", f"-I{KERNELS.parent}", f"-I{include}",
                    str(GPU_TESTS / "emu" / "cuda_emu.cpp"), "-o", str(tmp / "emu.o")],
                   check=True)
    libs = {}
    # "libcuda": with CUDA graphs (decode captured once, replayed per token); "libcuda_nograph":
    # a driver without them (every kernel a host launch)
    for key, extra in (("libcuda", []), ("libcuda_nograph", ["-DSTUB_OMIT_GRAPH"])):
        subprocess.run([cc, "-c", "-fPIC", "-O1", "-Wall", "-Werror", "-DSTUB_EMULATE", *extra,
                        str(GPU_TESTS / "stub_libcuda.c"), "-o", str(tmp / f"{key}.o")],
                       check=True)
        libs[key] = tmp / f"{key}_emu.so"
        subprocess.run([cxx, "-shared", "-o", str(libs[key]), str(tmp / f"{key}.o"),
                        str(tmp / "emu.o"), "-lpthread"], check=True)
    return {"binary": result.dist_dir / "bin" / "colibri", "tmp": tmp, **libs}
