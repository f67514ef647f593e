"""Pinned toolchains: zig for host C, NVRTC + ptxas (+ CUDA headers) for device code.

Everything is installed on demand with ``python -m pip install --target <dir> --no-deps`` into
``paths.cache_dir()/toolchains/<set>/`` -- never into the user's environment -- so a target's
build uses exactly the versions its profile pins, whatever else the machine has. A system
``nvcc`` may stand in for the CUDA wheels, but only when its version equals the profile's.

Device code goes source -> PTX (NVRTC through ctypes, or the system nvcc) -> one cubin per SM
(that CUDA version's ptxas). Warnings from either step are errors: the kernels must compile
clean with every pinned toolchain.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Sequence

from colibri_kit import paths
from colibri_kit.errors import ToolchainError

if TYPE_CHECKING:  # toolchain runs on a bare interpreter (no PyYAML) to install the rest
    from colibri_kit.profiles import Profile

Progress = Callable[[str], None]

ZIG_VERSION = "0.17.1"


@dataclass(frozen=True)
class CudaPins:
    """The PyPI wheels that make one CUDA version's device toolchain."""

    version: str
    packages: tuple[str, ...]


CUDA_PINS: dict[str, CudaPins] = {
    "11.8": CudaPins("11.8", (
        "nvidia-cuda-nvrtc-cu11==11.8.89",
        "nvidia-cuda-nvcc-cu11==11.8.89",      # ptxas
        "nvidia-cuda-runtime-cu11==11.8.89",   # include/ (cuda_fp16.h)
    )),
    "12.6": CudaPins("12.6", (
        "nvidia-cuda-nvrtc-cu12==12.6.85",
        "nvidia-cuda-nvcc-cu12==12.6.85",
        "nvidia-cuda-runtime-cu12==12.6.77",
    )),
    "13.0": CudaPins("13.0", (
        "nvidia-cuda-nvrtc==13.0.88",
        "nvidia-cuda-nvcc==13.0.88",
        "nvidia-cuda-runtime==13.0.96",
        "nvidia-cuda-crt==13.0.88",
    )),
}

MARKER = ".colibri-toolchain.json"


def _say(progress: Progress | None, msg: str) -> None:
    if progress is not None:
        progress(msg)


def toolchains_dir() -> Path:
    return paths.cache_dir() / "toolchains"


def zig_cache_dir() -> Path:
    """zig's own object cache; outside the project, overridable (Docker mounts a writable one)."""
    env = os.environ.get("COLIBRI_ZIG_CACHE_DIR")
    return Path(env) if env else paths.cache_dir() / "zig-cache"


def _display(path: Path) -> str:
    home = str(Path.home())
    s = str(path)
    return "~" + s[len(home):] if home != "/" and s.startswith(home + "/") else s


# ---------------------------------------------------------------------------------------------
# Installing pinned wheel sets


def _marker_matches(marker: Path, want: dict) -> bool:
    try:
        return json.loads(marker.read_text()) == want
    except (OSError, ValueError):
        return False


def install_set(name: str, packages: Sequence[str], what: str, progress: Progress | None) -> Path:
    """Install `packages` into toolchains/<name>/ once; return that directory.

    The install goes into a temporary sibling and is renamed into place, so an interrupted
    install never leaves a half-populated set that later looks complete; a lock file keeps two
    processes (parallel builds, test sessions) from installing the same set at once.
    """
    dest = toolchains_dir() / name
    marker = dest / MARKER
    want = {"name": name, "packages": list(packages)}
    if _marker_matches(marker, want):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest.parent / f".{name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _marker_matches(marker, want):   # another process finished it while we waited
            return dest
        for stale in dest.parent.glob(f".{name}-*"):   # an interrupted install's leftovers
            shutil.rmtree(stale, ignore_errors=True)
        _pip_install(dest, packages, what, progress)
    return dest


def _pip_install(dest: Path, packages: Sequence[str], what: str, progress: Progress | None) -> None:
    name = dest.name
    _say(progress, f"installing {what} into {_display(dest)} (first time only)")
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=dest.parent))
    cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--quiet",
           "--no-input", "--no-deps", "--no-compile", "--target", str(tmp), *packages]
    # --target must not be vetoed by a user's pip settings meant for their own environment.
    env = {**os.environ, "PIP_REQUIRE_VIRTUALENV": "0", "PIP_USER": "0", "PIP_NO_INPUT": "1"}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise ToolchainError(f"cannot run pip to install {what}: {exc}") from None
    if proc.returncode != 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tail = "\n".join((proc.stderr or proc.stdout).strip().splitlines()[-6:])
        if "No module named pip" in tail:
            raise ToolchainError(
                f"{sys.executable} has no pip, which installs {what}: run the kit from its "
                "virtual environment (scripts/bootstrap.sh makes .venv) or install python3-pip")
        raise ToolchainError(
            f"could not install {what} ({' '.join(packages)}) with pip:\n{tail}\n"
            "Check network access to PyPI (or a configured index/proxy) and the free space in "
            f"{_display(dest.parent)}, then retry; COLIBRI_CACHE_DIR moves the cache.")
    (tmp / MARKER).write_text(json.dumps({"name": name, "packages": list(packages)}, indent=2)
                              + "\n")
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)


@dataclass(frozen=True)
class CachedSet:
    name: str
    path: Path
    packages: tuple[str, ...]
    size_bytes: int


def cached_sets() -> list[CachedSet]:
    """What is installed in the toolchain cache (complete sets only)."""
    out = []
    root = toolchains_dir()
    if not root.is_dir():
        return out
    for d in sorted(root.iterdir()):
        marker = d / MARKER
        if d.name.startswith(".") or not marker.is_file():
            continue
        try:
            pkgs = tuple(json.loads(marker.read_text()).get("packages", ()))
        except (OSError, ValueError):
            pkgs = ()
        size = sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())
        out.append(CachedSet(d.name, d, pkgs, size))
    return out


def _run_version(argv: Sequence[str], env: dict[str, str] | None = None) -> str:
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, env=env, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"cannot run {shlex.join(argv)}: {exc}") from None
    if proc.returncode != 0:
        raise ToolchainError(f"{shlex.join(argv)} failed: {(proc.stderr or proc.stdout).strip()}")
    return proc.stdout.strip() or proc.stderr.strip()


# ---------------------------------------------------------------------------------------------
# Host C toolchain


@dataclass(frozen=True)
class HostToolchain:
    """What `make -C runtime` gets as CC/AR/RANLIB/TARGET_ARCH_CFLAGS (+ environment)."""

    kind: str                  # "zig" or "system"
    cc: tuple[str, ...]
    ar: tuple[str, ...]
    ranlib: tuple[str, ...]
    arch_cflags: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)
    version: str = ""

    def make_vars(self) -> dict[str, str]:
        return {
            "CC": shlex.join(self.cc),
            "AR": shlex.join(self.ar),
            "RANLIB": shlex.join(self.ranlib),
            "TARGET_ARCH_CFLAGS": shlex.join(self.arch_cflags),
        }


def install_zig(progress: Progress | None = None) -> Path:
    d = install_set(f"zig-{ZIG_VERSION}", (f"ziglang=={ZIG_VERSION}",), f"zig {ZIG_VERSION}",
                    progress)
    zig = d / "ziglang" / "zig"
    if not zig.is_file():
        raise ToolchainError(f"zig is missing from {d}: remove that directory and retry")
    return zig


def zig_env() -> dict[str, str]:
    cache = zig_cache_dir()
    return {"ZIG_GLOBAL_CACHE_DIR": str(cache / "global"),
            "ZIG_LOCAL_CACHE_DIR": str(cache / "local")}


def host_toolchain(profile: Profile, progress: Progress | None = None) -> HostToolchain:
    """The C toolchain for a profile: zig cc for a Jetson (glibc floor pinned), system cc for host."""
    mcpu = profile.cpu_mcpu
    if profile.name == "host":
        cc = os.environ.get("CC", "cc")
        flags: tuple[str, ...] = ()
        if mcpu:
            flags = (f"-march={mcpu}",) if profile.arch == "x86_64" else (f"-mcpu={mcpu}",)
        version = _run_version([*shlex.split(cc), "--version"]).splitlines()[0]
        return HostToolchain("system", tuple(shlex.split(cc)), ("ar",), ("ranlib", "-D"), flags,
                             {}, version)
    zig = install_zig(progress)
    env = zig_env()
    flags = (f"-mcpu={profile.zig_mcpu}",) if profile.zig_mcpu else ()
    version = "zig " + _run_version([str(zig), "version"], {**os.environ, **env})
    return HostToolchain("zig", (str(zig), "cc", "-target", profile.zig_triple), (str(zig), "ar"),
                         (str(zig), "ranlib"), flags, env, version)


# ---------------------------------------------------------------------------------------------
# CUDA device toolchain


@dataclass(frozen=True)
class CudaToolchain:
    version: str                 # "12.6"
    source: str                  # "wheels" or "system nvcc <path>"
    ptxas: Path
    include_dir: Path            # holds cuda_fp16.h
    nvrtc_lib: Path | None       # wheels: libnvrtc; system: None (nvcc makes the PTX)
    nvcc: Path | None
    compiler_version: str        # "nvrtc 12.6" or nvcc's release line
    ptxas_version: str           # "Cuda compilation tools, release 12.6, V12.6.85"

    def versions(self) -> dict[str, str]:
        return {"cuda": self.version, "source": self.source,
                "ptx_compiler": self.compiler_version, "ptxas": self.ptxas_version}


def _find_one(root: Path, pattern: str, what: str) -> Path:
    hits = sorted(p for p in root.glob(pattern) if ".alt." not in p.name)
    if not hits:
        raise ToolchainError(f"{what} not found under {root} ({pattern}); remove {root} and retry")
    return hits[0]


def _release_of(version_text: str) -> str | None:
    m = re.search(r"release (\d+\.\d+)", version_text)
    return m.group(1) if m else None


def _ptxas_version(ptxas: Path) -> str:
    return _run_version([str(ptxas), "--version"]).splitlines()[-2].strip()


def cuda_toolchain(version: str, *, nvcc: str | os.PathLike | None = None,
                   progress: Progress | None = None) -> CudaToolchain:
    """CUDA `version`'s NVRTC/ptxas/headers from the pinned wheels, or from a matching `nvcc`.

    `nvcc` (or env COLIBRI_NVCC) selects a system toolkit; its release must equal `version`.
    """
    nvcc = nvcc or os.environ.get("COLIBRI_NVCC") or None
    if nvcc is not None:
        return _system_cuda(version, Path(nvcc))
    pins = CUDA_PINS.get(version)
    if pins is None:
        raise ToolchainError(f"no pinned toolchain for CUDA {version}; the kit pins "
                             f"{', '.join(sorted(CUDA_PINS))} (set cuda.version in the profile)")
    d = install_set(f"cuda-{version}", pins.packages, f"CUDA {version} NVRTC + ptxas", progress)
    nv = d / "nvidia"
    lib = _find_one(nv, "*/lib/libnvrtc.so.*", "libnvrtc")
    ptxas = _find_one(nv, "*/bin/ptxas", "ptxas")
    include = _find_one(nv, "*/include/cuda_fp16.h", "cuda_fp16.h").parent
    if not os.access(ptxas, os.X_OK):
        ptxas.chmod(0o755)
    major, minor = Nvrtc(lib).version()
    if f"{major}.{minor}" != version:
        raise ToolchainError(f"{lib} is NVRTC {major}.{minor}, expected {version}; remove {d}")
    return CudaToolchain(version, "wheels", ptxas, include, lib, None, f"nvrtc {major}.{minor}",
                         _ptxas_version(ptxas))


def _system_cuda(version: str, nvcc: Path) -> CudaToolchain:
    exe = shutil.which(str(nvcc))
    if exe is None:
        raise ToolchainError(f"nvcc {nvcc} not found or not executable (COLIBRI_NVCC / --nvcc)")
    text = _run_version([exe, "--version"])
    release = _release_of(text)
    if release != version:
        raise ToolchainError(
            f"{exe} is CUDA {release or '(unknown version)'}, but this target needs CUDA {version}: "
            f"use an nvcc from CUDA {version}, or drop COLIBRI_NVCC/--nvcc to use the pinned "
            f"CUDA {version} wheels")
    # nvcc may be a wrapper script: ask it where its toolkit lives.
    dry = subprocess.run([exe, "--dryrun", "-E", "-x", "cu", os.devnull], capture_output=True,
                         text=True)
    m = re.search(r"^#\$ TOP=(.*)$", dry.stderr + dry.stdout, re.M)
    top = Path(m.group(1).strip()).resolve() if m else Path(exe).resolve().parent.parent
    ptxas = top / "bin" / "ptxas"
    include = top / "include"
    if not ptxas.is_file() or not (include / "cuda_fp16.h").is_file():
        raise ToolchainError(f"toolkit of {exe} ({top}) lacks bin/ptxas or include/cuda_fp16.h")
    return CudaToolchain(version, f"system nvcc {exe}", ptxas, include, None, Path(exe),
                         text.splitlines()[-2].strip(), _ptxas_version(ptxas))


class Nvrtc:
    """The few NVRTC entry points the build needs, through ctypes."""

    def __init__(self, lib: Path):
        try:
            # libnvrtc dlopens libnvrtc-builtins by soname, and the CUDA 13 wheel has no RPATH to
            # find it: load the sibling first so the soname is already resolved.
            for builtins in sorted(lib.parent.glob("libnvrtc-builtins.so.*")):
                if ".alt." not in builtins.name:
                    ctypes.CDLL(str(builtins), mode=ctypes.RTLD_GLOBAL)
            self.lib = ctypes.CDLL(str(lib))
        except OSError as exc:
            raise ToolchainError(f"cannot load {lib}: {exc}") from None
        self.lib.nvrtcGetErrorString.restype = ctypes.c_char_p

    def _check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.nvrtcGetErrorString(rc).decode()
            raise ToolchainError(f"NVRTC {what} failed: {msg}")

    def version(self) -> tuple[int, int]:
        a, b = ctypes.c_int(), ctypes.c_int()
        self._check(self.lib.nvrtcVersion(ctypes.byref(a), ctypes.byref(b)), "nvrtcVersion")
        return a.value, b.value

    def supported_sms(self) -> list[int]:
        n = ctypes.c_int()
        self._check(self.lib.nvrtcGetNumSupportedArchs(ctypes.byref(n)), "GetNumSupportedArchs")
        arr = (ctypes.c_int * n.value)()
        self._check(self.lib.nvrtcGetSupportedArchs(arr), "GetSupportedArchs")
        return list(arr)

    def compile_ptx(self, source: str, name: str, options: Sequence[str]) -> tuple[str, str]:
        """-> (ptx, log). Raises ToolchainError with the log when compilation fails."""
        prog = ctypes.c_void_p()
        self._check(self.lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(),
                                                name.encode(), 0, None, None), "CreateProgram")
        try:
            opts = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
            rc = self.lib.nvrtcCompileProgram(prog, len(options), opts)
            size = ctypes.c_size_t()
            self._check(self.lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "GetLogSize")
            buf = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetProgramLog(prog, buf), "GetProgramLog")
            log = buf.value.decode(errors="replace").strip()
            if rc != 0:
                raise ToolchainError(f"NVRTC could not compile {name}:\n{log}")
            self._check(self.lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "GetPTXSize")
            ptx = ctypes.create_string_buffer(size.value)
            self._check(self.lib.nvrtcGetPTX(prog, ptx), "GetPTX")
            return ptx.value.decode(), log
        finally:
            self.lib.nvrtcDestroyProgram(ctypes.byref(prog))


def nvrtc_in_subprocess(lib: Path, source: Path, ptx_path: Path, options: Sequence[str]) -> str:
    """Compile in a fresh process: NVRTC keeps counters across compilations in one process
    (the PTX's `callseq N` comments), so in-process the second build's PTX would differ."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(__file__).resolve().parent.parent), os.environ.get("PYTHONPATH", "")])}
    argv = [sys.executable, "-m", "colibri_kit.toolchain", "nvrtc-ptx", str(lib), str(source),
            str(ptx_path), *options]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise ToolchainError(proc.stderr.strip().removeprefix("error: "))
    return proc.stdout


def _nvrtc_main(lib: str, source: str, ptx_path: str, options: Sequence[str]) -> int:
    try:
        ptx, log = Nvrtc(Path(lib)).compile_ptx(Path(source).read_text(), Path(source).name,
                                                list(options))
    except ToolchainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    Path(ptx_path).write_text(ptx)
    sys.stdout.write(log)
    return 0


def supported_sms(tc: CudaToolchain) -> list[int]:
    if tc.nvrtc_lib is not None:
        return Nvrtc(tc.nvrtc_lib).supported_sms()
    text = _run_version([str(tc.nvcc), "--list-gpu-code"])
    return sorted({int(m) for m in re.findall(r"sm_(\d+)", text)})


@dataclass(frozen=True)
class FunctionResources:
    """What ptxas -v reports for one function of one cubin (registers per thread, bytes)."""

    name: str
    entry: bool                # a __global__ kernel ("Compiling entry function"), else a
                               # non-inlined device function (properties only, no registers)
    registers: int = 0
    stack_bytes: int = 0       # per-thread stack frame
    spill_store_bytes: int = 0
    spill_load_bytes: int = 0
    shared_bytes: int = 0      # static shared memory (smem)
    barriers: int = 0          # "used N barriers" (CUDA 12.x+ prints it)

    @property
    def spills(self) -> bool:
        return self.spill_store_bytes > 0 or self.spill_load_bytes > 0

    def to_json(self) -> dict[str, int | str | bool]:
        return {"name": self.name, "entry": self.entry, "registers": self.registers,
                "stack_bytes": self.stack_bytes, "spill_store_bytes": self.spill_store_bytes,
                "spill_load_bytes": self.spill_load_bytes, "shared_bytes": self.shared_bytes,
                "barriers": self.barriers}

    @classmethod
    def from_json(cls, d: dict) -> "FunctionResources":
        return cls(**d)


@dataclass(frozen=True)
class KernelImage:
    kind: str      # "cubin" or "ptx"
    sm: int
    path: Path
    # cubins: ptxas -v's report of every function, in ptxas' order; () for PTX
    resources: tuple[FunctionResources, ...] = ()


# ptxas -v (--verbose) output, one cubin. Its format is not specified by NVIDIA; these patterns
# follow real logs: the NVIDIA forum thread "-Xptxas -v : analysing" (sm_20: "Used 40 registers,
# 128 bytes cmem[0], ..."), ccminer PR tpruvot/ccminer#36 (sm_52: "Used 45 registers, 11688
# bytes cumulative stack size, 64 bytes smem, 328 bytes cmem[0]"), GaloisGPU issue #1 (device
# functions' "Function properties" without a "Used" line, "0 bytes gmem"), and the pinned
# ptxas 11.8 / 12.6 / 13.0 themselves (tests/test_toolchain.py parses their output). A line this
# parser does not know is returned as is: the build treats it like a warning.
_PTXAS_INFO = re.compile(r"^ptxas info\s*:\s*(.*)$")
_PTXAS_ENTRY = re.compile(r"^Compiling entry function '([^']+)' for '(sm_\d+[af]?)'$")
_PTXAS_PROPS = re.compile(r"^Function properties for (.+)$")
_PTXAS_FRAME = re.compile(r"^(\d+) bytes stack frame, (\d+) bytes spill stores, "
                          r"(\d+) bytes spill loads$")
_PTXAS_USED = re.compile(r"^Used (\d+) registers\b(.*)$")
_PTXAS_QUIET = re.compile(r"^(\d+ bytes gmem.*|Compile time = .*)$")


def parse_ptxas_resources(log: str) -> tuple[list[FunctionResources], list[str]]:
    """ptxas -v output -> (functions in report order, lines that are not resource info)."""
    found: dict[str, dict] = {}
    order: list[str] = []
    other: list[str] = []
    entry: str | None = None      # the kernel the next "Used N registers" line belongs to
    props: str | None = None      # the function the next "N bytes stack frame" line belongs to

    def rec(name: str) -> dict:
        if name not in found:
            found[name] = {"name": name, "entry": False}
            order.append(name)
        return found[name]

    for raw in log.splitlines():
        line = raw.strip()
        if not line:
            continue
        m = _PTXAS_INFO.match(line)
        if m is None:
            f = _PTXAS_FRAME.match(line)
            if f and props is not None:
                r = rec(props)
                r["stack_bytes"], r["spill_store_bytes"], r["spill_load_bytes"] = map(int,
                                                                                      f.groups())
                props = None
            else:
                other.append(raw)
            continue
        info = m.group(1).strip()
        if (e := _PTXAS_ENTRY.match(info)):
            entry = e.group(1)
            rec(entry)["entry"] = True
        elif (p := _PTXAS_PROPS.match(info)):
            props = p.group(1)
            rec(props)
        elif (u := _PTXAS_USED.match(info)) and entry is not None:
            r = rec(entry)
            r["registers"] = int(u.group(1))
            rest = u.group(2)
            if (b := re.search(r"used (\d+) barriers", rest)):
                r["barriers"] = int(b.group(1))
            if (s := re.search(r"(\d+) bytes smem", rest)):
                r["shared_bytes"] = int(s.group(1))
            entry = None
        elif not _PTXAS_QUIET.match(info):
            other.append(raw)
    return [FunctionResources(**found[n]) for n in order], other


def resources_table(images: Sequence[KernelImage]) -> str:
    """One compact table of every cubin's kernels: the build prints it."""
    rows = [["sm", "kernel", "regs", "spill st/ld B", "stack B", "smem B"]]
    for img in images:
        for f in img.resources:
            if f.entry:
                rows.append([f"sm_{img.sm}", f.name, str(f.registers),
                             f"{f.spill_store_bytes}/{f.spill_load_bytes}", str(f.stack_bytes),
                             str(f.shared_bytes)])
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.rjust(w) if i >= 2 else c.ljust(w)
                       for i, (c, w) in enumerate(zip(r, widths))).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def spill_warnings(images: Sequence[KernelImage]) -> list[str]:
    """One line per function that spills registers to local memory, naming it and the SM."""
    return [f"sm_{img.sm}: {f.name} spills registers ({f.spill_store_bytes} bytes stored, "
            f"{f.spill_load_bytes} bytes loaded per thread; {f.registers} registers)"
            for img in images for f in img.resources if f.spills]


def kernel_options(tc: CudaToolchain, ptx_sm: int, include_dirs: Iterable[Path]) -> list[str]:
    """NVRTC options (no -lineinfo: line info would tie the cubin to source paths)."""
    opts = [f"--gpu-architecture=compute_{ptx_sm}", "--std=c++17", "-default-device",
            f"-I{tc.include_dir}"]
    opts += [f"-I{d}" for d in include_dirs]
    return opts


def _fail_on_warnings(tool: str, log: str, name: str) -> None:
    if re.search(r"warning", log, re.I):
        raise ToolchainError(f"{tool} warned while compiling {name} (warnings are errors; the "
                             f"kernels must compile clean with every pinned CUDA):\n{log}")


# The first SM with the tensor-core instructions the kernels use (mma.sync ... .tf32, sm_80): the
# kernel source compiles its tensor-core section only for __CUDA_ARCH__ >= 800.
TENSOR_CORE_SM = 80


def ptx_sms(sms: Sequence[int]) -> list[int]:
    """The PTX modules a plan compiles, ascending: the lowest SM's (every SM of the plan, and any
    newer GPU, can JIT it), plus, when that SM is below sm_80 and the plan also has SMs >= 80,
    the lowest such SM's: its __CUDA_ARCH__ is >= 800, so it holds the tensor-core kernels a
    compute_72 PTX cannot (mma needs sm_80), and the cubins of SMs >= 80 are made from it."""
    sms = sorted(set(sms))
    tc = [s for s in sms if s >= TENSOR_CORE_SM]
    return [sms[0], tc[0]] if sms and sms[0] < TENSOR_CORE_SM and tc else sms[:1]


def ptx_for(sm: int, ptxs: Sequence[int]) -> int:
    """The PTX a cubin for `sm` is made from: the highest of `ptxs` <= sm."""
    return max(p for p in ptxs if p <= sm)


def compile_kernels(tc: CudaToolchain, source: Path, include_dirs: Sequence[Path],
                    sms: Sequence[int], out_dir: Path) -> list[KernelImage]:
    """source -> PTX for compute_XX of each of ptx_sms(sms) -> one cubin per SM (from the highest
    of those PTX <= its SM), written into out_dir.

    Returns the images in table order: cubins by ascending SM, then the PTX by ascending SM.
    """
    sms = sorted(set(sms))
    if not sms:
        raise ToolchainError("no CUDA architectures to compile for")
    supported = supported_sms(tc)
    bad = [s for s in sms if s not in supported]
    if bad:
        raise ToolchainError(
            f"CUDA {tc.version} cannot compile for {', '.join(f'sm_{s}' for s in bad)}; it supports "
            f"{', '.join(f'sm_{s}' for s in supported)}. Pick a CUDA version that supports it "
            "(CUDA 13 dropped sm_72 and older: Xavier needs 11.8 or 12.x)")
    out_dir.mkdir(parents=True, exist_ok=True)
    ptxs = {p: _compile_ptx(tc, source, include_dirs, p, out_dir) for p in ptx_sms(sms)}
    images = []
    for sm in sms:
        cubin = out_dir / f"{source.stem}.sm_{sm}.cubin"
        ptx_path = ptxs[ptx_for(sm, list(ptxs))]
        # -v reports registers, stack, spills and shared memory per function; it changes no
        # byte of the cubin. Anything else ptxas prints is a warning, and warnings are errors.
        argv = [str(tc.ptxas), f"-arch=sm_{sm}", "-O3", "--warning-as-error", "-v", "-o",
                str(cubin), str(ptx_path)]
        proc = subprocess.run(argv, capture_output=True, text=True)
        log = (proc.stdout + proc.stderr).strip()
        resources, other = parse_ptxas_resources(log)
        if proc.returncode != 0 or other:
            cubin.unlink(missing_ok=True)
            raise ToolchainError(f"ptxas -arch=sm_{sm} failed on {ptx_path.name} "
                                 f"(warnings are errors):\n" + "\n".join(other or [log]))
        images.append(KernelImage("cubin", sm, cubin, tuple(resources)))
    images += [KernelImage("ptx", p, path) for p, path in ptxs.items()]
    return images


def _compile_ptx(tc: CudaToolchain, source: Path, include_dirs: Sequence[Path], ptx_sm: int,
                 out_dir: Path) -> Path:
    """source -> out_dir/<stem>.compute_<ptx_sm>.ptx with NVRTC (or nvcc); warnings fail."""
    ptx_path = out_dir / f"{source.stem}.compute_{ptx_sm}.ptx"
    if tc.nvrtc_lib is not None:
        opts = kernel_options(tc, ptx_sm, [source.parent, *include_dirs])
        log = nvrtc_in_subprocess(tc.nvrtc_lib, source, ptx_path, opts)
        _fail_on_warnings("NVRTC", log, source.name)
    else:
        argv = [str(tc.nvcc), "--ptx", f"-arch=compute_{ptx_sm}", "--std=c++17",
                "-Werror", "all-warnings", f"-I{source.parent}",
                *[f"-I{d}" for d in include_dirs], "-o", str(ptx_path), str(source)]
        proc = subprocess.run(argv, capture_output=True, text=True)
        log = (proc.stdout + proc.stderr).strip()
        if proc.returncode != 0:
            raise ToolchainError(f"nvcc could not compile {source.name}:\n{log}")
        _fail_on_warnings("nvcc", log, source.name)
    return ptx_path



# ---------------------------------------------------------------------------------------------
# Whole-profile helpers (the `invoke toolchain` task and the Dockerfile use these)


def install_for_profile(profile: Profile, progress: Progress | None = None,
                        cuda_version: str | None = None) -> dict[str, str]:
    """Install what `profile` builds with; return the tool versions it will use."""
    host = host_toolchain(profile, progress)
    versions = {"host_cc": host.version}
    version = cuda_version or (profile.cuda.version if profile.cuda else None)
    if version:
        cuda = cuda_toolchain(version, progress=progress)
        versions.update({f"cuda_{k}": v for k, v in cuda.versions().items()})
        versions["cuda_sms_supported"] = " ".join(f"sm_{s}" for s in supported_sms(cuda))
    return versions


def install_all(progress: Progress | None = None) -> None:
    """zig + every pinned CUDA set (the Docker image bakes these in)."""
    install_zig(progress)
    for version in sorted(CUDA_PINS):
        cuda_toolchain(version, progress=progress)


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["nvrtc-ptx"]:   # internal: one NVRTC compilation (see nvrtc_in_subprocess)
        return _nvrtc_main(argv[1], argv[2], argv[3], argv[4:])

    ap = argparse.ArgumentParser(prog="python -m colibri_kit.toolchain")
    ap.add_argument("command", choices=("install-all", "list"))
    args = ap.parse_args(argv)
    try:
        if args.command == "install-all":
            install_all(progress=lambda m: print(m, flush=True))
        for s in cached_sets():
            print(f"{s.name:12} {s.size_bytes / 2**20:8.1f} MiB  {s.path}")
    except ToolchainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
