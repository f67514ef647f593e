"""Drive the runtime build for one target: header -> kernels -> embedding -> make -> dist -> verify.

    build(load_profile("orin-nx"))   # -> BuildResult, dist/orin-nx/{bin,lib,include,manifest.json}

Every step is incremental: the header and generated files are rewritten only when their bytes
change, kernels are recompiled only when the hash of their inputs changes (stamp file), and make
only rebuilds what is older than its inputs, so a rebuild with nothing changed compiles nothing.
Nothing written depends on the time or on where the checkout lives, so two clean builds of a
target are bit-identical (and identical inside and outside Docker).

Also a script, so Docker can run exactly this inside the image:
    python -m colibri_kit.build --target orin-nx --in host
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from colibri_kit import paths, profiles, toolchain
from colibri_kit.errors import BuildError, KitError, ToolchainError
from colibri_kit.hashing import file_sha256
from colibri_kit.manifest import MANIFEST_NAME, FileEntry, Manifest
from colibri_kit.profiles import CudaSpec, Profile
from colibri_kit.verify import VerifyReport

Progress = Callable[[str], None]

DEFAULT_HOST_CUDA = "12.6"   # --cuda-archs on the host profile (cuda: null) without --cuda-version
KERNEL_SOURCE = Path("kernels") / "colibri_kernels.cu"   # relative to runtime/
IMAGE_ALIGN = 64


@dataclass(frozen=True)
class CudaPlan:
    version: str
    sms: tuple[int, ...]


@dataclass
class BuildResult:
    target: str
    where: str                     # "host" or "docker"
    dist_dir: Path
    manifest: Manifest
    kernels_compiled: bool         # False when the kernel stamp matched (or no CUDA)
    make_ran_commands: bool        # False when make found everything up to date
    make_output: str
    seconds: float
    steps: dict[str, float] = field(default_factory=dict)
    verify_report: VerifyReport | None = None   # host builds; None when built in docker


# ---------------------------------------------------------------------------------------------
# Where to build


def docker_available(timeout: float = 15.0) -> tuple[bool, str]:
    """(True, "") when a Docker engine answers `docker info`; else (False, why)."""
    exe = shutil.which("docker")
    if exe is None:
        return False, "the docker command is not installed"
    try:
        proc = subprocess.run([exe, "info", "--format", "{{.ServerVersion}}"],
                              capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"`docker info` did not answer: {exc}"
    if proc.returncode != 0:
        lines = (proc.stderr or proc.stdout).strip().splitlines()
        return False, f"`docker info` failed: {lines[-1] if lines else 'exit %d' % proc.returncode}"
    return True, ""


def choose_where(where: str) -> str:
    """auto -> docker when an engine answers (and we are not already inside it), else host."""
    if where not in ("auto", "host", "docker"):
        raise BuildError(f"--in must be auto, host or docker (got {where!r})")
    if where == "host" or os.environ.get("COLIBRI_IN_DOCKER") == "1":
        return "host"
    ok, why = docker_available()
    if where == "docker" and not ok:
        raise BuildError(f"--in docker needs a running Docker engine, but {why}. Start it "
                         "(e.g. `sudo systemctl start docker`) or build with --in host.")
    return "docker" if ok else "host"


# ---------------------------------------------------------------------------------------------
# Small helpers


def _write_if_changed(path: Path, data: bytes) -> bool:
    """Write `data` unless the file already holds exactly it (keeps mtimes for make)."""
    try:
        if path.read_bytes() == data:
            return False
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
    return True


@contextlib.contextmanager
def _target_lock(target: str, progress: Progress):
    """One build per target at a time (several shells or test sessions may share a checkout)."""
    lock = paths.build_dir(target) / ".lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(f"waiting for another build of {target} in this checkout to finish")
            fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _git(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-c", "safe.directory=*", "-C", str(root), *args],
                          capture_output=True, text=True)


def source_revision(root: Path) -> str:
    """HEAD's commit id, + "+dirty" when tracked files differ from it; "unknown" outside git."""
    try:
        head = _git(root, "rev-parse", "HEAD")
    except OSError:
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    dirty = _git(root, "diff", "--quiet", "HEAD", "--").returncode != 0
    return head.stdout.strip() + ("+dirty" if dirty else "")


def source_date_epoch(root: Path) -> str:
    """The HEAD commit's time: a fixed clock for anything that insists on a date."""
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        return env
    try:
        out = _git(root, "log", "-1", "--format=%ct")
    except OSError:
        return "0"
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else "0"


def _rel(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


# ---------------------------------------------------------------------------------------------
# Kernels


def cuda_plan(profile: Profile, cuda_archs: Sequence[str] | None,
              cuda_version: str | None) -> CudaPlan | None:
    """What device code to build: the profile's pins, or --cuda-archs for a profile without CUDA."""
    cuda = profile.cuda
    if cuda is not None:
        if cuda_archs or (cuda_version and cuda_version != cuda.version):
            raise BuildError(
                f"target {profile.name} pins CUDA {cuda.version} and "
                f"{', '.join(cuda.archs)} in its profile; --cuda-archs/--cuda-version only add "
                "device code to a profile without CUDA (e.g. host). Edit the profile instead.")
        return CudaPlan(cuda.version, tuple(sorted(cuda.sm_numbers)))
    if not cuda_archs:
        if cuda_version:
            raise BuildError("--cuda-version needs --cuda-archs (e.g. --cuda-archs sm_90)")
        return None
    sms = tuple(sorted({profiles.sm_number(a) for a in cuda_archs}))
    return CudaPlan(cuda_version or DEFAULT_HOST_CUDA, sms)


def _kernel_inputs_digest(kernel_src: Path, header: Path, plan: CudaPlan, tc_versions: dict,
                          options: list[str]) -> str:
    h = hashlib.sha256()
    files = sorted(p for p in kernel_src.parent.iterdir()
                   if p.is_file() and p.suffix in (".cu", ".cuh", ".h"))
    for p in [*files, header]:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    h.update(json.dumps({"sms": plan.sms, "toolchain": tc_versions, "options": options},
                        sort_keys=True).encode())
    return h.hexdigest()


def compile_kernels_cached(plan: CudaPlan, kernel_src: Path, config_dir: Path, out_dir: Path,
                           *, nvcc: str | None, progress: Progress
                           ) -> tuple[list[toolchain.KernelImage], bool, toolchain.CudaToolchain]:
    """Compile unless the stamp says the same inputs produced the files already there."""
    if not kernel_src.is_file():
        raise BuildError(f"{kernel_src} does not exist, but this build needs device code "
                         f"(CUDA {plan.version}, {', '.join(f'sm_{s}' for s in plan.sms)})")
    tc = toolchain.cuda_toolchain(plan.version, nvcc=nvcc, progress=progress)
    # Options without paths, so the stamp does not change when the cache moves.
    ptxs = toolchain.ptx_sms(plan.sms)  # the lowest SM's, + the tensor-core one (sm_80+)
    options = ["--std=c++17", "-default-device", *[f"compute_{p}" for p in ptxs],
               tc.source.split()[0]]
    digest = _kernel_inputs_digest(kernel_src, config_dir / "colibri_config.h", plan,
                                   tc.versions(), options)
    stamp = out_dir / "stamp.json"
    try:
        # The stamp also keeps ptxas -v's report of each cubin, so an up-to-date build prints
        # and records the same resources without running ptxas again.
        saved = json.loads(stamp.read_text())
        if saved.get("inputs") == digest and "resources" in saved:
            expected = [toolchain.KernelImage(
                "cubin", s, out_dir / f"{kernel_src.stem}.sm_{s}.cubin",
                tuple(toolchain.FunctionResources.from_json(f)
                      for f in saved["resources"][f"sm_{s}"])) for s in plan.sms]
            expected += [toolchain.KernelImage(
                "ptx", p, out_dir / f"{kernel_src.stem}.compute_{p}.ptx") for p in ptxs]
            if all(i.path.is_file() for i in expected):
                return expected, False, tc
    except (OSError, ValueError, KeyError, TypeError):
        pass
    progress(f"compiling kernels with CUDA {plan.version} ({tc.source}): PTX "
             f"{' '.join(f'compute_{p}' for p in ptxs)} + cubin "
             f"{' '.join(f'sm_{s}' for s in plan.sms)}")
    stamp.unlink(missing_ok=True)
    for old in [*out_dir.glob("*.cubin"), *out_dir.glob("*.ptx")]:
        old.unlink()
    images = toolchain.compile_kernels(tc, kernel_src, [config_dir], plan.sms, out_dir)
    stamp.write_text(json.dumps({"inputs": digest, "resources": kernels_section(images)},
                                indent=2) + "\n")
    return images, True, tc


def kernels_section(images: Sequence[toolchain.KernelImage]) -> dict[str, list[dict]]:
    """The manifest's `kernels`: per cubin SM, every function ptxas reported, in its order."""
    return {f"sm_{i.sm}": [f.to_json() for f in i.resources] for i in images if i.kind == "cubin"}


def report_kernel_resources(images: Sequence[toolchain.KernelImage], spills: str,
                            progress: Progress) -> None:
    """Print the per-SM register/spill table; a spill is a warning line naming the kernel, or
    the build's failure when the profile says `cuda.spills: error`."""
    for line in toolchain.resources_table(images).splitlines():
        progress(f"kernels  {line}")
    warnings = toolchain.spill_warnings(images)
    if warnings and spills == "error":
        raise BuildError("kernels spill registers to local memory (profile cuda.spills: error):\n"
                         + "\n".join(warnings))
    for w in warnings:
        progress(f"warning: {w}")


def embed_sources(images: Sequence[toolchain.KernelImage], embed_dir: Path,
                  runtime_dir: Path) -> list[Path]:
    """Write the .S (.incbin per image, 64-byte aligned in .rodata) and the C table.

    .incbin paths are relative to runtime/ (make's working directory), so no absolute path
    reaches the objects. Each image's sha256 is in the .S, so new kernels change the .S and make
    re-assembles it.
    """
    asm = ["/* Generated by colibri_kit/build.py: kernel images, embedded as they are. */",
           '\t.section .rodata.colibri_kernels,"a"']
    table = ["/* Generated by colibri_kit/build.py: the table runtime/src/cuda/kernel_images.h "
             "declares. */", '#include "cuda/kernel_images.h"', ""]
    entries = []
    for i, img in enumerate(images):
        sym = f"colibri_kernel_image_{i}"
        size = img.path.stat().st_size
        asm += [f"\t/* {img.kind} sm {img.sm}: {size} bytes, sha256 {file_sha256(img.path)} */",
                f"\t.balign {IMAGE_ALIGN}", f"\t.globl {sym}", f"\t.type {sym}, %object",
                f"{sym}:", f'\t.incbin "{_rel(img.path, runtime_dir)}"']
        if img.kind == "ptx":
            asm.append("\t.byte 0")   # the driver wants NUL-terminated PTX text
            size += 1
        asm.append(f"\t.size {sym}, {size}")
        table.append(f"extern const unsigned char {sym}[];")
        entries.append(f'    {{"{img.kind}", {img.sm}, {sym}, {size}}},')
    asm.append('\t.section .note.GNU-stack,"",%progbits')
    table += ["", "const colibri_kernel_image colibri_kernel_images[] = {", *entries, "};",
              f"const int colibri_kernel_image_count = {len(images)};", ""]
    s_path, c_path = embed_dir / "kernel_images.S", embed_dir / "kernel_images.c"
    _write_if_changed(s_path, ("\n".join(asm) + "\n").encode())
    _write_if_changed(c_path, "\n".join(table).encode())
    return [s_path, c_path]


# ---------------------------------------------------------------------------------------------
# make, dist, manifest


def run_make(runtime_dir: Path, make_vars: dict[str, str], env: dict[str, str], jobs: int
             ) -> tuple[str, bool]:
    argv = ["make", "--no-print-directory", "-C", str(runtime_dir), f"-j{jobs}", "all"]
    argv += [f"{k}={v}" for k, v in make_vars.items()]
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=env)
    except OSError as exc:
        raise BuildError(f"cannot run make: {exc} (install make)") from None
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0:
        tail = "\n".join(out.splitlines()[-40:])
        raise BuildError(f"make -C runtime failed (exit {proc.returncode}):\n{tail}")
    ran = any(line.strip() and not line.startswith("make") for line in out.splitlines())
    return out, ran


def publish(out_dir: Path, config_header: Path, runtime_dir: Path, dist: Path) -> list[str]:
    """Copy the artifacts into dist/, touching only files whose bytes changed; drop stale ones."""
    wanted: dict[str, Path] = {
        "bin/colibri": out_dir / "bin" / "colibri",
        "lib/libcolibri.a": out_dir / "lib" / "libcolibri.a",
        "include/colibri_config.h": config_header,
    }
    for h in sorted((runtime_dir / "include").glob("*.h")):
        wanted[f"include/{h.name}"] = h
    for rel, src in wanted.items():
        dst = dist / rel
        _write_if_changed(dst, src.read_bytes())
        mode = 0o755 if rel.startswith("bin/") else 0o644
        if (dst.stat().st_mode & 0o777) != mode:
            dst.chmod(mode)
    keep = set(wanted) | {MANIFEST_NAME}
    if dist.is_dir():
        for f in sorted(dist.rglob("*")):
            rel = f.relative_to(dist).as_posix()
            if f.is_file() and rel not in keep:
                f.unlink()
    return sorted(wanted)


def _config_header_path(profile: Profile) -> Path:
    from colibri_kit import render

    bdir = paths.build_dir(profile.name) / "include" / "colibri_config.h"
    before = bdir.read_bytes() if bdir.is_file() else None
    stat = bdir.stat() if before is not None else None
    header = Path(render.write_config(profile))
    # Keep the old mtime when rendering produced the same bytes, so make rebuilds nothing.
    if stat is not None and header == bdir and header.read_bytes() == before:
        os.utime(header, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    return header


def built_profile(profile: Profile, plan: CudaPlan | None) -> Profile:
    """What was built: the profile, plus the device code --cuda-archs added to one without CUDA
    (host), so verify checks the SMs actually embedded."""
    if plan is None or profile.cuda is not None:
        return profile
    return dataclasses.replace(profile, cuda=CudaSpec(
        version=plan.version, archs=tuple(f"sm_{s}" for s in plan.sms), igpu=False))


def _verify(profile: Profile, dist: Path, progress: Progress) -> VerifyReport:
    from colibri_kit import verify   # raises VerifyError on any mismatch

    report = verify.verify_build(profile, dist)
    for line in report.lines():
        progress(f"verify {line}")
    return report


# ---------------------------------------------------------------------------------------------
# The build


def build(profile: Profile, *, where: str = "auto", debug: bool = False,
          cuda_archs: Sequence[str] | None = None, cuda_version: str | None = None,
          nvcc: str | None = None, kernel_source: Path | None = None, jobs: int = 2,
          progress: Progress | None = None) -> BuildResult:
    """Build ``profile`` into dist/<name>/ (dist/<name>-debug/ with debug=True) and verify it.

    where: "host" builds here, "docker" inside the image from Dockerfile, "auto" picks docker
    when an engine answers. cuda_archs/cuda_version add device code to a profile without CUDA
    (host). nvcc: a system nvcc to use instead of the CUDA wheels (its version must match).
    kernel_source: another .cu to compile (tests); default runtime/kernels/colibri_kernels.cu.

    The caller resolves the target name (``profiles.load_profile``: the tasks, ``main`` below)
    and passes the Profile; the build and its verification use that one Profile. A name is
    refused with a TypeError that says so (``profiles.require_profile``).
    """
    profile = profiles.require_profile(profile, "build")
    say = progress or (lambda msg: print(f"[build {profile.name}] {msg}", flush=True))
    chosen = choose_where(where)
    if chosen == "docker":
        if kernel_source is not None:
            raise BuildError("kernel_source cannot be used with --in docker")
        return build_in_docker(profile.name, debug=debug, cuda_archs=cuda_archs,
                               cuda_version=cuda_version, jobs=jobs, progress=say)
    with _target_lock(profile.name, say):
        return _build_here(profile, debug=debug, cuda_archs=cuda_archs, cuda_version=cuda_version,
                           nvcc=nvcc, kernel_source=kernel_source, jobs=jobs, progress=say)


def _build_here(profile: Profile, *, debug: bool, cuda_archs: Sequence[str] | None,
                cuda_version: str | None, nvcc: str | None, kernel_source: Path | None,
                jobs: int, progress: Progress) -> BuildResult:
    t0 = time.monotonic()
    steps: dict[str, float] = {}

    def step(name: str, since: float) -> float:
        now = time.monotonic()
        steps[name] = round(now - since, 3)
        return now

    root = paths.project_root()
    runtime_dir = paths.runtime_dir()
    target = profile.name
    plan = cuda_plan(profile, cuda_archs, cuda_version)
    bdir = paths.build_dir(target)
    variant = "debug" if debug else "release"
    dist = paths.dist_dir(f"{target}-debug" if debug else target)
    progress(f"profile {profile.name}: {profile.arch}, glibc {profile.glibc}, "
             + (f"CUDA {plan.version} {' '.join(f'sm_{s}' for s in plan.sms)}" if plan
                else "no CUDA") + (", debug" if debug else ""))
    t = time.monotonic()

    header = _config_header_path(profile)
    config_dir = header.parent
    progress(f"config header {_rel(header, root)}")
    t = step("render", t)

    host_tc = toolchain.host_toolchain(profile, progress=progress)
    progress(f"host compiler: {host_tc.version}")
    t = step("toolchain", t)

    kernels_compiled = False
    cuda_versions: dict[str, str] | None = None
    embed_dir = bdir / "embed"
    if plan is not None:
        src = kernel_source or runtime_dir / KERNEL_SOURCE
        images, kernels_compiled, cuda_tc = compile_kernels_cached(
            plan, src, config_dir, bdir / "kernels", nvcc=nvcc, progress=progress)
        if not kernels_compiled:
            progress("kernels up to date")
        cuda_versions = cuda_tc.versions()
        report_kernel_resources(images, profile.cuda.spills if profile.cuda else "warn",
                                progress)
        embed = embed_sources(images, embed_dir, runtime_dir)
    else:
        images = []
        embed = [runtime_dir / "embed" / "kernel_images_empty.c"]
        for stale in ("kernel_images.S", "kernel_images.c"):
            (embed_dir / stale).unlink(missing_ok=True)
    t = step("kernels", t)

    out_dir = bdir / ("out-debug" if debug else "out")
    extra = "-O0 -g -DCOLIBRI_DEBUG" if debug else ""
    make_vars = {
        **host_tc.make_vars(),
        "CONFIG_DIR": _rel(config_dir, runtime_dir),
        "OUT_DIR": _rel(out_dir, runtime_dir),
        "KERNEL_EMBED": " ".join(_rel(p, runtime_dir) for p in embed),
        "EXTRA_CFLAGS": extra,
        # zig builds its crt objects with debug info naming the cache and the checkout: release
        # binaries drop debug sections so they do not depend on where either lives.
        "EXTRA_LDFLAGS": "" if debug else "-Wl,--strip-debug",
        "FLAGS_STAMP": _rel(out_dir / "flags.stamp", runtime_dir),
    }
    # Any change of compiler, flags or embedded files rewrites the stamp -> full rebuild.
    # The source list too: a deleted .c leaves nothing newer than the archive, yet it must go.
    sources = sorted(p.relative_to(runtime_dir).as_posix()
                     for p in [*runtime_dir.glob("src/*/*.c"), *runtime_dir.glob("serve/*.c"),
                               *runtime_dir.glob("tools/*.c")])
    _write_if_changed(out_dir / "flags.stamp",
                      (json.dumps({**make_vars, "cc": host_tc.version, "sources": sources},
                                  sort_keys=True, indent=1) + "\n").encode())
    env = {**os.environ, **host_tc.env, "SOURCE_DATE_EPOCH": source_date_epoch(root),
           "LC_ALL": "C", "TZ": "UTC", "ZERO_AR_DATE": "1"}
    make_out, ran = run_make(runtime_dir, make_vars, env, jobs)
    progress("make: compiled/linked" if ran else "make: nothing to do")
    t = step("make", t)

    files = publish(out_dir, header, runtime_dir, dist)
    manifest = Manifest(
        target=profile.name, variant=variant, arch=profile.arch,
        glibc_floor=str(profile.glibc), profile_hash=profile.hash,
        source_revision=source_revision(root),
        toolchain={"host_cc": host_tc.version, **({"cuda": cuda_versions} if cuda_versions else {})},
        cuda=({"version": plan.version, "sms": list(plan.sms),
               "images": [{"kind": i.kind, "sm": i.sm} for i in images]} if plan else None),
        # ptxas -v per cubin: registers, stack, spill stores/loads, static shared memory
        kernels=kernels_section(images) if plan else None,
        files={rel: FileEntry(file_sha256(dist / rel), (dist / rel).stat().st_size)
               for rel in files},
    ).with_raw()
    _write_if_changed(dist / MANIFEST_NAME, manifest.raw)
    progress(f"dist {_rel(dist, root)}/ (bin/colibri {manifest.files['bin/colibri'].size} bytes)")
    t = step("publish", t)

    report = _verify(built_profile(profile, plan), dist, progress)
    step("verify", t)
    return BuildResult(profile.name, "host", dist, manifest, kernels_compiled, ran, make_out,
                       round(time.monotonic() - t0, 3), steps, report)


# ---------------------------------------------------------------------------------------------
# Docker: the same script, inside the pinned image


def image_tag(root: Path) -> str:
    """Tag from the files that define the image, so a changed pin builds a new image."""
    h = hashlib.sha256()
    for rel in ("Dockerfile", "pyproject.toml", "colibri_kit/toolchain.py"):
        p = root / rel
        h.update(rel.encode() + b"\0" + (p.read_bytes() if p.is_file() else b"") + b"\0")
    return f"colibri-kit-build:{h.hexdigest()[:12]}"


def docker_commands(target: str, root: Path, *, debug: bool, cuda_archs, cuda_version,
                    jobs: int) -> tuple[list[str], list[str], list[str]]:
    """(inspect, build, run) argv lists for building `target` in the image."""
    tag = image_tag(root)
    inspect = ["docker", "image", "inspect", tag]
    build_img = ["docker", "build", "-t", tag, "-f", str(root / "Dockerfile"), str(root)]
    inner = ["python", "-m", "colibri_kit.build", "--target", target, "--in", "host",
             "--jobs", str(jobs)]
    if debug:
        inner.append("--debug")
    if cuda_archs:
        inner += ["--cuda-archs", ",".join(cuda_archs)]
    if cuda_version:
        inner += ["--cuda-version", cuda_version]
    run = ["docker", "run", "--rm", "--user", f"{os.getuid()}:{os.getgid()}",
           "-v", f"{root}:/src", "-w", "/src", "-e", "HOME=/tmp",
           "-e", "COLIBRI_ZIG_CACHE_DIR=/src/build/.zig-cache", tag, *inner]
    return inspect, build_img, run


def build_in_docker(target: str, *, debug: bool, cuda_archs, cuda_version, jobs: int,
                    progress: Progress) -> BuildResult:
    t0 = time.monotonic()
    root = paths.project_root()
    inspect, build_img, run = docker_commands(target, root, debug=debug, cuda_archs=cuda_archs,
                                              cuda_version=cuda_version, jobs=jobs)
    if subprocess.run(inspect, capture_output=True).returncode != 0:
        progress(f"building image {inspect[-1]} from Dockerfile (first time only)")
        if subprocess.run(build_img).returncode != 0:
            raise BuildError(f"`{shlex.join(build_img)}` failed (see its output above)")
    progress(f"running the build in {inspect[-1]}")
    proc = subprocess.run(run)
    if proc.returncode != 0:
        raise BuildError(f"the build inside Docker failed (exit {proc.returncode}); rerun with "
                         "--in host to see it without Docker")
    dist = paths.dist_dir(f"{target}-debug" if debug else target)
    return BuildResult(target, "docker", dist, Manifest.load(dist), False, False, "",
                       round(time.monotonic() - t0, 3))


# ---------------------------------------------------------------------------------------------
# Script entry (used inside Docker)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m colibri_kit.build", description=__doc__.split(
        "\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--in", dest="where", default="host", choices=("auto", "host", "docker"))
    ap.add_argument("--debug", action="store_true")
    ap.add_argument("--cuda-archs", default="")
    ap.add_argument("--cuda-version", default=None)
    ap.add_argument("--nvcc", default=None)
    ap.add_argument("--jobs", type=int, default=2)
    args = ap.parse_args(argv)
    archs = [a for a in args.cuda_archs.split(",") if a.strip()] or None
    try:
        build(profiles.load_profile(args.target), where=args.where, debug=args.debug,
              cuda_archs=archs, cuda_version=args.cuda_version, nvcc=args.nvcc, jobs=args.jobs)
    except (KitError, ToolchainError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
