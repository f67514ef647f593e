"""Pinned toolchains with the real tools: pip installs, NVRTC + ptxas per CUDA version, zig."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from colibri_kit import elf, paths, profiles, toolchain
from colibri_kit.errors import ProfileError, ToolchainError

KERNEL = r"""
#include <cuda_fp16.h>
#include "colibri_config.h"
__device__ __noinline__ float times_top_k(float v) { return v * (float)COLIBRI_TOP_K; }
extern "C" __global__ void scale_half(const __half *x, float *y, float s, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = times_top_k(__half2float(x[i]) * s);
}
"""


@pytest.fixture
def kernel_dir(tmp_path: Path) -> Path:
    (tmp_path / "k.cu").write_text(KERNEL)
    inc = tmp_path / "include"
    inc.mkdir()
    (inc / "colibri_config.h").write_text("#define COLIBRI_TOP_K 2\n")
    return tmp_path


def _cubin_sms(images: list[toolchain.KernelImage]) -> list[int]:
    found = []
    for img in images:
        if img.kind == "cubin":
            cubins = elf.find_cubins(b"\0" + img.path.read_bytes())  # skips offset 0
            assert len(cubins) == 1, img.path
            found.append(cubins[0].sm)
    return found


def test_zig_flags_come_from_the_profile():
    """zig's -target and -mcpu are the Profile's properties (derived once, there)."""
    orin = profiles.load_profile("orin-nx")
    tc = toolchain.host_toolchain(orin)
    assert tc.cc[-2:] == ("-target", orin.zig_triple) and orin.zig_triple.endswith(".2.35")
    assert tc.arch_cflags == (f"-mcpu={orin.zig_mcpu}",) and orin.zig_mcpu == "cortex_a78ae"


def test_sm_number_parsing():
    assert profiles.sm_number("sm_87") == 87
    assert profiles.sm_number("sm_90a") == 90
    assert profiles.sm_number("compute_110") == 110
    with pytest.raises(ProfileError, match="invalid CUDA architecture"):
        profiles.sm_number("sm87x")


@pytest.mark.slow
@pytest.mark.parametrize("version,sms", [("12.6", [72, 87]), ("11.8", [72]), ("13.0", [87, 110])])
def test_nvrtc_ptxas_compile_one_cubin_per_sm(kernel_dir: Path, version: str, sms: list[int]):
    tc = toolchain.cuda_toolchain(version)
    assert tc.source == "wheels"
    assert tc.compiler_version == f"nvrtc {version}"
    assert f"release {version}" in tc.ptxas_version
    out = kernel_dir / "out"
    images = toolchain.compile_kernels(tc, kernel_dir / "k.cu", [kernel_dir / "include"], sms, out)
    assert _cubin_sms(images) == sorted(sms)
    ptx = [i for i in images if i.kind == "ptx"]
    # one PTX for the lowest SM, and a second one for the lowest SM >= 80 when the SMs straddle
    # sm_80 (the tensor-core kernels' PTX: docs/cuda.md "Tensor-core prefill (sm_80+)")
    tc_sms = [s for s in sms if s >= 80]
    want = [min(sms)] + ([min(tc_sms)] if tc_sms and min(sms) < 80 else [])
    assert [p.sm for p in ptx] == want
    for p in ptx[1:]:
        assert f".target sm_{p.sm}" in p.path.read_text()
    text = ptx[0].path.read_text()
    assert f".target sm_{min(sms)}" in text and "scale_half" in text
    # No source paths or line info in what gets embedded (reproducible, location-free).
    assert str(kernel_dir) not in text and ".loc" not in text
    # ptxas -v of this CUDA version, parsed: the kernel with the register count the cubin itself
    # carries (EIATTR_REGCOUNT, read apart from ptxas' report), no spills; the non-inlined
    # device function appears with its frame but is no kernel.
    for img in (i for i in images if i.kind == "cubin"):
        funcs = {f.name: f for f in img.resources}
        kernel = funcs["scale_half"]
        assert kernel.entry and not kernel.spills and kernel.registers > 0
        assert elf.cubin_register_counts(img.path.read_bytes())["scale_half"] == kernel.registers
        helper = [f for f in img.resources if "times_top_k" in f.name]
        assert len(helper) == 1 and not helper[0].entry
    assert all(p.resources == () for p in ptx)


def test_compile_is_deterministic(kernel_dir: Path):
    # Twice in one process: NVRTC numbers call sequences process-wide (`// callseq N` in the
    # PTX), so the kit compiles each time in a fresh process to keep the bytes identical.
    tc = toolchain.cuda_toolchain("12.6")
    a = toolchain.compile_kernels(tc, kernel_dir / "k.cu", [kernel_dir / "include"], [87],
                                  kernel_dir / "a")
    b = toolchain.compile_kernels(tc, kernel_dir / "k.cu", [kernel_dir / "include"], [87],
                                  kernel_dir / "b")
    assert [x.path.read_bytes() for x in a] == [y.path.read_bytes() for y in b]


# A kernel that must spill on sm_87: 48 values live across a loop, but __launch_bounds__(512, 3)
# leaves 65536 / 1536 threads = at most 40 registers per thread.
SPILLING = r"""
extern "C" __global__ void __launch_bounds__(512, 3) many_live(const float *x, float *y, int n) {
    float v[48];
#pragma unroll
    for (int i = 0; i < 48; i++) v[i] = x[threadIdx.x + i * n];
    for (int r = 0; r < n; r++) {
#pragma unroll
        for (int i = 0; i < 48; i++) v[i] = v[i] * v[(i + 1) % 48] + 1.0f;
    }
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 48; i++) s += v[i];
    y[threadIdx.x] = s;
}
"""


def test_spills_are_reported_per_kernel_and_fail_only_when_the_profile_asks(kernel_dir: Path):
    from colibri_kit import build
    from colibri_kit.errors import BuildError

    src = kernel_dir / "spill.cu"
    src.write_text(SPILLING)
    images = toolchain.compile_kernels(toolchain.cuda_toolchain("12.6"), src, [], [87],
                                       kernel_dir / "out")
    (f,) = images[0].resources
    assert f.name == "many_live" and f.entry and f.spills and f.registers <= 40
    assert f.registers == elf.cubin_register_counts(images[0].path.read_bytes())["many_live"]
    said: list[str] = []
    build.report_kernel_resources(images, "warn", said.append)
    table = [s for s in said if s.startswith("kernels ")]
    assert "regs" in table[0] and any("many_live" in s for s in table[2:])
    (warning,) = [s for s in said if s.startswith("warning: ")]
    assert f"sm_87: many_live spills registers ({f.spill_store_bytes} bytes stored" in warning
    with pytest.raises(BuildError, match=r"(?s)cuda.spills: error.*many_live spills"):
        build.report_kernel_resources(images, "error", said.append)


# ptxas -v lines as other toolchains print them (the pinned ones are parsed by the compile tests
# above): sm_20 from the NVIDIA forum thread "-Xptxas -v : analysing" (several cmem banks);
# sm_52 from tpruvot/ccminer#36 (a device function that spills, "cumulative stack size", smem).
PUBLIC_PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6solverPfS_' for 'sm_20'
ptxas info    : Function properties for _Z6solverPfS_
    8 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 40 registers, 128 bytes cmem[0], 128 bytes cmem[14], 56 bytes cmem[16]
ptxas info    : Function properties for _ZN50_INTERNAL_28_cuda_equi9atomicAddEPjj
    8 bytes stack frame, 8 bytes spill stores, 8 bytes spill loads
ptxas info    : Compiling entry function '_Z7digit_6P4equi' for 'sm_52'
ptxas info    : Function properties for _Z7digit_6P4equi
    208 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 69 registers, 216 bytes cumulative stack size, 31372 bytes smem, 324 bytes cmem[0], 4 bytes cmem[2]
ptxas warning : Value of threads per SM for entry _Z7digit_6P4equi is out of range
"""


def test_ptxas_report_parser_on_other_toolchains_output():
    funcs, other = toolchain.parse_ptxas_resources(PUBLIC_PTXAS_LOG)
    by = {f.name: f for f in funcs}
    assert [f.name for f in funcs] == ["_Z6solverPfS_", "_ZN50_INTERNAL_28_cuda_equi9atomicAddEPjj",
                                       "_Z7digit_6P4equi"]
    assert by["_Z6solverPfS_"] == toolchain.FunctionResources(
        "_Z6solverPfS_", True, registers=40, stack_bytes=8)
    helper = by["_ZN50_INTERNAL_28_cuda_equi9atomicAddEPjj"]
    assert not helper.entry and helper.spills and helper.spill_load_bytes == 8
    assert by["_Z7digit_6P4equi"] == toolchain.FunctionResources(
        "_Z7digit_6P4equi", True, registers=69, stack_bytes=208, shared_bytes=31372)
    # what is not resource info is handed back: the build treats it as a warning (an error)
    assert other == ["ptxas warning : Value of threads per SM for entry _Z7digit_6P4equi is out "
                     "of range"]


def test_cuda13_refuses_sm72(kernel_dir: Path):
    tc = toolchain.cuda_toolchain("13.0")
    with pytest.raises(ToolchainError, match=r"CUDA 13.0 cannot compile for sm_72.*supports"):
        toolchain.compile_kernels(tc, kernel_dir / "k.cu", [], [72], kernel_dir / "out")


def test_unpinned_cuda_version_refused():
    with pytest.raises(ToolchainError, match=r"no pinned toolchain for CUDA 12.2.*11.8, 12.6, 13.0"):
        toolchain.cuda_toolchain("12.2")


def test_nvrtc_warning_is_an_error(kernel_dir: Path):
    src = kernel_dir / "warn.cu"
    src.write_text('extern "C" __global__ void k(float *y) { int unused = 3; y[0] = 1.0f; }\n')
    tc = toolchain.cuda_toolchain("12.6")
    with pytest.raises(ToolchainError, match=r"(?s)NVRTC warned.*unused"):
        toolchain.compile_kernels(tc, src, [], [87], kernel_dir / "out")


def test_nvrtc_error_shows_the_log(kernel_dir: Path):
    src = kernel_dir / "bad.cu"
    src.write_text('extern "C" __global__ void k(float *y) { y[0] = undefined_name; }\n')
    tc = toolchain.cuda_toolchain("12.6")
    with pytest.raises(ToolchainError, match=r"(?s)NVRTC could not compile bad.cu.*undefined_name"):
        toolchain.compile_kernels(tc, src, [], [87], kernel_dir / "out")


def test_system_nvcc_with_other_version_is_refused():
    # The CUDA 13.0 wheel set ships a real nvcc: a "system" nvcc of the wrong version for 12.6.
    nvcc = toolchain.toolchains_dir() / "cuda-13.0" / "nvidia" / "cu13" / "bin" / "nvcc"
    toolchain.cuda_toolchain("13.0")
    assert nvcc.is_file()
    with pytest.raises(ToolchainError, match=r"is CUDA 13.0, but this target needs CUDA 12.6"):
        toolchain.cuda_toolchain("12.6", nvcc=nvcc)


def test_missing_nvcc_is_refused(tmp_path: Path):
    with pytest.raises(ToolchainError, match="not found or not executable"):
        toolchain.cuda_toolchain("12.6", nvcc=tmp_path / "nvcc")


def test_pip_failure_is_actionable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("COLIBRI_CACHE_DIR", str(tmp_path / "cache"))
    # A pin that cannot exist (local version labels are never on an index): pip really fails.
    with pytest.raises(ToolchainError) as err:
        toolchain.install_set("broken", ["ziglang==0.0.0+colibri.nosuch"], "a broken set",
                              progress=None)
    msg = str(err.value)
    assert "could not install a broken set" in msg and "ziglang==0.0.0+colibri.nosuch" in msg
    assert "COLIBRI_CACHE_DIR" in msg
    # Nothing half-installed is left to look complete.
    assert toolchain.cached_sets() == []
    assert not (tmp_path / "cache" / "toolchains" / "broken").exists()


def test_install_reports_progress_once_then_is_cached(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("COLIBRI_CACHE_DIR", str(tmp_path / "cache"))
    leftover = tmp_path / "cache" / "toolchains" / ".tiny-interrupted"   # a killed install
    leftover.mkdir(parents=True)
    (leftover / "six.py").write_text("partial")
    said: list[str] = []
    # A tiny real wheel set (no network beyond the index pip is configured with).
    d = toolchain.install_set("tiny", ["six==1.16.0"], "six", said.append)
    assert (d / "six.py").is_file()
    assert said == [f"installing six into {d} (first time only)"]
    assert not leftover.exists()
    toolchain.install_set("tiny", ["six==1.16.0"], "six", said.append)
    assert len(said) == 1
    (entry,) = toolchain.cached_sets()
    assert entry.name == "tiny" and entry.packages == ("six==1.16.0",) and entry.size_bytes > 0


def test_host_toolchain_for_jetson_uses_pinned_zig():
    from colibri_kit import profiles

    tc = toolchain.host_toolchain(profiles.load_profile("xavier-nx"))
    assert tc.kind == "zig" and tc.version == f"zig {toolchain.ZIG_VERSION}"
    assert tc.cc[1:] == ("cc", "-target", "aarch64-linux-gnu.2.31")
    assert tc.arch_cflags == ("-mcpu=carmel",)
    assert Path(tc.cc[0]).is_relative_to(toolchain.toolchains_dir())
    assert tc.env["ZIG_GLOBAL_CACHE_DIR"].startswith(str(toolchain.zig_cache_dir()))


def test_invoke_toolchain_target_and_list():
    proc = subprocess.run([sys.executable, "-m", "invoke", "toolchain", "--target", "orin-nx",
                           "--list"], capture_output=True, text=True, timeout=300,
                          cwd=paths.project_root())
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert f"host_cc             zig {toolchain.ZIG_VERSION}" in out
    assert "cuda_ptxas          Cuda compilation tools, release 12.6, V12.6.85" in out
    assert "sm_87" in out
    assert "cuda-12.6" in out and "MiB" in out and "nvidia-cuda-nvrtc-cu12==12.6.85" in out


def test_invoke_toolchain_needs_an_argument():
    proc = subprocess.run([sys.executable, "-m", "invoke", "toolchain"], capture_output=True,
                          text=True, timeout=60, cwd=paths.project_root())
    assert proc.returncode == 1
    assert "give --target NAME" in proc.stderr


def test_python_without_pip_is_explained(tmp_path: Path):
    # A real interpreter without pip (a venv made --without-pip) running the kit.
    venv = tmp_path / "nopip"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    code = ("from colibri_kit import toolchain\n"
            "toolchain.install_set('x', ['six==1.16.0'], 'six', None)\n")
    proc = subprocess.run([str(venv / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, env={"PYTHONPATH": str(paths.project_root()),
                                          "COLIBRI_CACHE_DIR": str(tmp_path / "cache"),
                                          "PATH": "/usr/bin:/bin"})
    assert proc.returncode != 0
    assert "has no pip, which installs six" in proc.stderr
    assert "scripts/bootstrap.sh" in proc.stderr
