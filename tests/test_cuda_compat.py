"""The Jetson loader path (issue 20 item 5) on emulated devices: a JetPack 5 Xavier NX (BSP CUDA
driver 11.4, the xavier-nx build is CUDA 11.8) and an Orin NX on L4T R36.3 (BSP driver 12.2, the
orin-nx build is CUDA 12.6).

The real aarch64 builds run under qemu-user inside the device's mount namespace
(colibri_kit.sim.enter: the device's files at their real paths), with aarch64 stand-in drivers
(tests/gpu/stub_libcuda.c built by zig, one per driver version, and their JIT compiler
tests/gpu/stub_ptxjit.c) installed where L4T and NVIDIA's cuda-compat package put theirs
(device_files.install_cuda_driver). The BSP's directory is on the loader path as
/etc/ld.so.conf.d/nvidia-tegra.conf puts it on a device (LD_LIBRARY_PATH here: qemu's aarch64
loader does not read the host's ld.so.cache).

Checked: without the compat package, colibri loads the BSP's libcuda and says so (`gpuprobe`,
`info`), and deploy's check of that answer refuses the build; with it, colibri loads the compat
libcuda by the path its profile rendered into colibri_config.h (no loader variable) and the check
passes; on a PTX-only GPU the compat driver JIT-compiles with its own JIT compiler (preloaded
beside it) and fails, as a real one would, when only the BSP's older JIT compiler is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_kit import paths, toolchain
from colibri_kit.fleet import release as rel
from colibri_kit.profiles import load_profile
from colibri_kit.sim import device_files

pytestmark = [pytest.mark.slow, pytest.mark.root]

ROOT = paths.project_root()
GPU_TESTS = ROOT / "tests" / "gpu"
QEMU_LD_PREFIX = "/usr/aarch64-linux-gnu"
# L4T release lines as /etc/nv_tegra_release prints them (L4T's own file)
R36_3 = "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: x\n"


@pytest.fixture(scope="module")
def stand_ins(tmp_path_factory: pytest.TempPathFactory) -> dict[int, tuple[Path, Path]]:
    """aarch64 stand-in libcuda + JIT compiler per driver version (cuDriverGetVersion)."""
    out = tmp_path_factory.mktemp("aarch64_drivers")
    zig = str(toolchain.install_zig())
    env = {**os.environ, **toolchain.zig_env()}
    built = {}
    for version in (11040, 11080, 12020, 12060):
        lib, jit = out / f"libcuda_{version}.so", out / f"ptxjit_{version}.so"
        for src, dst, soname in (("stub_libcuda.c", lib, "libcuda.so.1"),
                                 ("stub_ptxjit.c", jit, "libnvidia-ptxjitcompiler.so.1")):
            subprocess.run([zig, "cc", "-target", "aarch64-linux-gnu.2.31", "-shared", "-fPIC",
                            "-O1", f"-DSTUB_DRIVER_VERSION={version}", "-DSTUB_JIT_CHECK",
                            str(GPU_TESTS / src), "-o", str(dst), f"-Wl,-soname,{soname}",
                            "-ldl"], check=True, env=env, timeout=300)
        built[version] = (lib, jit)
    return built


@pytest.fixture(scope="module")
def xavier_build() -> Path:
    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    return build(load_profile("xavier-nx"), where="host", progress=print).dist_dir


def on_device(root: Path, binary: Path, *args: str, sm: int) -> subprocess.CompletedProcess:
    """`binary args` inside the emulated device `root` (its files mounted at their real paths),
    under qemu-user, the stand-in driver presenting a GPU of compute capability `sm`."""
    from colibri_kit.sim.fleet import ensure_binfmt

    ensure_binfmt()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    argv = ["unshare", "-m", "--propagation", "private", sys.executable, "-m",
            "colibri_kit.sim.enter", str(root), "--", "env", f"QEMU_LD_PREFIX={QEMU_LD_PREFIX}",
            f"LD_LIBRARY_PATH=/{device_files.BSP_CUDA_DIR}", f"STUB_SM={sm}",
            "STUB_INTEGRATED=1", str(binary), *args]
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)


def probe(root: Path, binary: Path, sm: int) -> dict:
    proc = on_device(root, binary, "gpuprobe", "--mib", "1", "--iters", "1", "--json", sm=sm)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout)


def device(tmp: Path, sku: str, bsp: tuple[Path, Path]) -> Path:
    root = tmp / sku
    device_files.populate(root, sku)
    device_files.install_cuda_driver(root, *bsp)
    return root


def tiny(tmp: Path, profile_name: str) -> Path:
    from colibri_kit.model.tiny import write_tiny_model

    return Path(write_tiny_model(tmp / f"{profile_name}.colibri",
                                 pad=load_profile(profile_name).colibri.embed_pad))


def test_jetpack5_xavier_loads_the_compat_driver_by_path(tmp_path, stand_ins, xavier_build):
    profile = load_profile("xavier-nx")
    assert profile.cuda.compat_libcuda == "/usr/local/cuda-11.8/compat/libcuda.so.1"
    binary = xavier_build / "bin" / "colibri"
    root = device(tmp_path, "xavier-nx", stand_ins[11040])
    # stock JetPack 5.1.x: the BSP's 11.4 driver is what loads, and deploy's check says no
    answer = probe(root, binary, 72)
    assert answer["libcuda"] == f"/{device_files.BSP_CUDA_DIR}/libcuda.so.1"
    assert answer["driver_version"] == 11040
    verdict = rel.loaded_driver_verdict(answer, profile)
    assert not verdict.runs
    assert f"colibri loaded /{device_files.BSP_CUDA_DIR}/libcuda.so.1 (CUDA driver 11.4)" in \
        verdict.message and "install NVIDIA's cuda-compat package for CUDA 11.8" in verdict.message
    # cuda-compat-11-8 installed: colibri opens it by its rendered path, no loader variable
    compat = device_files.install_cuda_driver(root, *stand_ins[11080], compat="11.8")
    answer = probe(root, binary, 72)
    assert answer["libcuda"] == compat and answer["driver_version"] == 11080
    verdict = rel.loaded_driver_verdict(answer, profile)
    assert verdict.runs and verdict.how == "cubin", verdict.message
    proc = on_device(root, binary, "--backend", "cuda", "info", str(tiny(tmp_path, "xavier-nx")),
                     sm=72)
    assert proc.returncode == 0, proc.stderr
    backend = json.loads(proc.stdout)["backend"]
    assert backend["cuda_libcuda"] == compat and backend["cuda_driver_version"] == 11080
    assert backend["cuda_image"] == "cubin" and backend["cuda_sm"] == 72


def test_r36_3_orin_needs_and_finds_cuda_compat_12_6(tmp_path, stand_ins, orin_nx_build):
    profile = load_profile("orin-nx")
    binary = orin_nx_build / "bin" / "colibri"
    root = device(tmp_path, "orin-nx", stand_ins[12020])
    (root / "etc" / "nv_tegra_release").write_text(R36_3)
    answer = probe(root, binary, 87)
    assert (answer["libcuda"], answer["driver_version"]) == \
        (f"/{device_files.BSP_CUDA_DIR}/libcuda.so.1", 12020)
    assert not rel.loaded_driver_verdict(answer, profile).runs
    compat = device_files.install_cuda_driver(root, *stand_ins[12060], compat="12.6")
    answer = probe(root, binary, 87)
    assert (answer["libcuda"], answer["driver_version"]) == (compat, 12060)
    assert rel.loaded_driver_verdict(answer, profile).runs
    model = tiny(tmp_path, "orin-nx")
    # a GPU the build has no cubin for (sm_89): the compat driver JIT-compiles the compute_87
    # PTX with its own JIT compiler, preloaded from its directory
    proc = on_device(root, binary, "--backend", "cuda", "info", str(model), sm=89)
    assert proc.returncode == 0, proc.stderr
    backend = json.loads(proc.stdout)["backend"]
    assert backend["cuda_image"] == "ptx" and backend["cuda_libcuda"] == compat
    # without its JIT compiler the compat driver would find the BSP's (12.2) by soname: the
    # stand-in refuses it as a mismatched JIT (CUDA_ERROR_INVALID_PTX), and colibri says which
    (root / "usr/local/cuda-12.6/compat/libnvidia-ptxjitcompiler.so.1").unlink()
    proc = on_device(root, binary, "--backend", "cuda", "info", str(model), sm=89)
    assert proc.returncode == 1
    assert "loading the ptx compute_87 kernels on driver 12060" in proc.stderr, proc.stderr
