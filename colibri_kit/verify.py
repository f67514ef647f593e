"""Self-verification of a build: does ``dist/<target>/`` really match its target profile?

The build policy; the formats are read by colibri_kit.elf. Checks, each reported as one line:

* the binary is an ELF executable for the profile's architecture (``e_machine``);
* the highest ``GLIBC_x.y`` it requires (from the dynamic section's version-needs table,
  ``DT_VERNEED``) is at most the profile's glibc floor;
* the CUDA ELF images (``e_machine`` 190, "cubins") embedded in it are exactly the profile's
  SMs, and a PTX module is embedded that the target's driver can JIT (ISA version and target);
* the objects in ``lib/libcolibri.a`` are for the same architecture;
* ``manifest.json`` (when present) names this target, profile hash, glibc floor and SMs, and
  lists every file in the dist with its sha256;
* ``bin/colibri --version`` runs (under ``qemu-<arch>`` when the build machine differs) and
  prints the target name.

``verify_build`` raises :class:`VerifyError` listing every failed check.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from colibri_kit.elf import (EM_AARCH64, EM_X86_64, ElfFormatError, archive_members, find_cubins,
                             find_ptx, glibc_version, parse_elf, parse_header, symbols_needing)
from colibri_kit.errors import KitError
from colibri_kit.hashing import file_sha256
from colibri_kit.manifest import MANIFEST_NAME, Manifest, ManifestError
from colibri_kit.profiles import Profile
from colibri_kit.toolchain import ptx_sms

MACHINES = {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}
# Newest PTX ISA each pinned CUDA version's driver can JIT (PTX ISA release notes).
PTX_ISA_MAX = {"11.8": (7, 8), "12.6": (8, 5), "13.0": (9, 0)}
QEMU_TIMEOUT_S = 120


# --------------------------------------------------------------------------- the report


class VerifyError(KitError):
    """A built artifact does not match its target profile; ``report`` has every check."""

    def __init__(self, message: str, report: VerifyReport | None = None) -> None:
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    skipped: bool = False

    def line(self) -> str:
        mark = "skip" if self.skipped else ("ok" if self.ok else "FAIL")
        return f"[{mark:>4}] {self.name}: {self.detail}"


@dataclass
class VerifyReport:
    target: str
    binary: Path
    checks: list[Check] = field(default_factory=list)
    machine: str | None = None
    max_glibc: str | None = None
    cubin_sms: tuple[str, ...] = ()
    ptx_targets: tuple[str, ...] = ()
    version_output: str | None = None

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if not c.ok]

    def add(self, name: str, ok: bool, detail: str, skipped: bool = False) -> None:
        self.checks.append(Check(name, ok, detail, skipped))

    def lines(self) -> list[str]:
        return [c.line() for c in self.checks]

    def format(self) -> str:
        return "\n".join([f"verify {self.target}: {self.binary}", *self.lines()])

    def to_dict(self) -> dict[str, object]:
        return {"target": self.target, "ok": self.ok, "machine": self.machine,
                "max_glibc": self.max_glibc, "cubin_sms": list(self.cubin_sms),
                "ptx_targets": list(self.ptx_targets),
                "checks": [{"name": c.name, "ok": c.ok, "skipped": c.skipped,
                            "detail": c.detail} for c in self.checks]}


def _vstr(v: tuple[int, ...] | None) -> str:
    return ".".join(map(str, v)) if v else "none"


def check_binary(profile: Profile, binary: Path, report: VerifyReport) -> bytes | None:
    """ELF machine and glibc checks; returns the file's bytes for the GPU-code checks."""
    try:
        data = binary.read_bytes()
    except OSError as exc:
        report.add("binary", False, f"cannot read {binary}: {exc.strerror}")
        return None
    try:
        info = parse_elf(data)
    except ElfFormatError as exc:
        report.add("elf", False, f"{binary.name} is not a valid ELF executable ({exc})")
        return None
    want = MACHINES[profile.arch]
    report.machine = info.header.machine_name
    report.add("machine", info.machine == want and info.header.elf_class == 64,
               f"ELF{info.header.elf_class} {info.header.machine_name}"
               f" (profile arch {profile.arch})")
    top = info.max_glibc
    report.max_glibc = _vstr(top) if top else None
    if top is None:
        detail = ("no GLIBC_ symbol versions required" +
                  (" (statically linked)" if not info.is_dynamic else ""))
        report.add("glibc", True, f"{detail}; floor {profile.glibc}")
    else:
        ok = top[:2] <= profile.glibc_tuple
        detail = (f"highest required GLIBC_{_vstr(top)} {'<=' if ok else '>'} profile floor "
                  f"{profile.glibc}")
        if not ok:
            too_new = {ver for _, ver in info.version_needs if glibc_version(ver) is not None
                       and glibc_version(ver)[:2] > profile.glibc_tuple}  # type: ignore[index]
            syms = symbols_needing(data, info, too_new)
            shown = ", ".join(syms[:8]) + (f" and {len(syms) - 8} more" if len(syms) > 8 else "")
            detail += (f" ({'symbols: ' + shown + '; ' if syms else ''}build with zig cc "
                       f"-target {profile.zig_triple} so the floor's glibc is linked against)")
        report.add("glibc", ok, detail)
    return data


def check_gpu_code(profile: Profile, data: bytes, report: VerifyReport) -> None:
    """Embedded cubins must be exactly the profile's SMs; PTX must be JIT-able on the target."""
    cubins = find_cubins(data)
    found = sorted({c.sm for c in cubins})
    report.cubin_sms = tuple(f"sm_{s}" for s in found)
    ptx = find_ptx(data)
    report.ptx_targets = tuple(sorted({p.target for p in ptx}))
    if profile.cuda is None:
        report.add("cubins", not cubins,
                   "none embedded (profile has no CUDA)" if not cubins else
                   f"found {', '.join(report.cubin_sms)} but the profile has no CUDA")
        report.add("ptx", not ptx, "none embedded" if not ptx else
                   f"found PTX for {', '.join(report.ptx_targets)} but the profile has no CUDA")
        return
    want = sorted(set(profile.cuda.sm_numbers))
    counts = ", ".join(f"sm_{s} x{sum(1 for c in cubins if c.sm == s)}" for s in found)
    report.add("cubins", found == want,
               f"embedded {counts or 'none'}; profile wants "
               f"{', '.join(profile.cuda.archs)}")
    if not ptx:
        report.add("ptx", False, "no PTX embedded (needed so newer drivers can JIT the kernels)")
        return
    isa_max = PTX_ISA_MAX[profile.cuda.version]
    too_new = [p for p in ptx if p.isa_version > isa_max]
    # the lowest SM's PTX, and the tensor-core one (lowest SM >= 80) when the plan spans sm_80
    allowed = set(ptx_sms(want))
    too_high = [p for p in ptx if p.sm > min(want) and p.sm not in allowed]
    problems = []
    if too_new:
        problems.append(f"PTX ISA {too_new[0].isa_version[0]}.{too_new[0].isa_version[1]} is "
                        f"newer than CUDA {profile.cuda.version} drivers accept "
                        f"({isa_max[0]}.{isa_max[1]})")
    if too_high:
        problems.append(f"PTX targets {too_high[0].target}, above the lowest profile SM "
                        f"sm_{min(want)} (and not the tensor-core PTX of "
                        f"{', '.join(f'compute_{s}' for s in sorted(allowed))})")
    isas = sorted({f"{p.isa_version[0]}.{p.isa_version[1]}" for p in ptx})
    report.add("ptx", not problems,
               "; ".join(problems) if problems else
               f"{len(ptx)} module(s), ISA {', '.join(isas)}, "
               f"targets {', '.join(report.ptx_targets)}")


def check_archive(profile: Profile, lib: Path, report: VerifyReport) -> None:
    try:
        members = archive_members(lib.read_bytes())
    except (OSError, ElfFormatError) as exc:
        report.add("libcolibri.a", False, f"cannot read {lib}: {exc}")
        return
    want = MACHINES[profile.arch]
    wrong = []
    objs = 0
    for name, body in members:
        try:
            h = parse_header(body)
        except ElfFormatError:
            continue  # not every member need be ELF (e.g. a kernel blob); not our business
        objs += 1
        if h.machine != want:
            wrong.append(f"{name} ({h.machine_name})")
    report.add("libcolibri.a", objs > 0 and not wrong,
               f"{objs} {profile.arch} objects" if objs and not wrong else
               (f"objects for the wrong machine: {', '.join(wrong)}" if wrong
                else "no ELF objects inside"))


def check_manifest(profile: Profile, dist_dir: Path, report: VerifyReport) -> None:
    """manifest.json agrees with the profile and with the files actually in ``dist_dir``."""
    path = dist_dir / MANIFEST_NAME
    if not path.is_file():
        report.add("manifest", True, "skipped: no manifest.json", skipped=True)
        return
    try:
        manifest = Manifest.load(dist_dir)
    except ManifestError as exc:
        report.add("manifest", False, str(exc))
        return
    problems = manifest.profile_problems(profile)
    for rel, entry in sorted(manifest.files.items()):
        f = dist_dir / rel
        if not f.is_file():
            problems.append(f"{rel} is listed but missing")
        elif entry.sha256 != file_sha256(f) or entry.size != f.stat().st_size:
            problems.append(f"{rel} does not match its sha256/size")
    present = sorted(p.relative_to(dist_dir).as_posix() for p in dist_dir.rglob("*")
                     if p.is_file() and p != path)
    unlisted = [rel for rel in present if rel not in manifest.files]
    if unlisted:
        problems.append(f"not listed: {', '.join(unlisted)}")
    report.add("manifest", not problems, "; ".join(problems) if problems else
               f"{len(manifest.files)} files match their sha256; target, profile hash, glibc "
               f"floor{' and SMs' if profile.cuda else ''} agree")


def run_command(profile: Profile, binary: Path) -> tuple[list[str] | None, str]:
    """argv that runs ``binary`` here (directly or under qemu), or None and why not."""
    here = platform.machine().lower()
    here = {"amd64": "x86_64", "arm64": "aarch64"}.get(here, here)
    if here == profile.arch:
        return [str(binary)], "native"
    qemu = shutil.which(f"qemu-{profile.arch}")
    if qemu is None:
        return None, f"skipped: qemu-{profile.arch} not installed (apt-get install qemu-user)"
    sysroot = os.environ.get("QEMU_LD_PREFIX") or f"/usr/{profile.arch}-linux-gnu"
    if not Path(sysroot).is_dir():
        return None, (f"skipped: no {profile.arch} sysroot at {sysroot} "
                      f"(apt-get install libc6-{'arm64' if profile.arch == 'aarch64' else 'amd64'}"
                      f"-cross, or set QEMU_LD_PREFIX)")
    return [qemu, "-L", sysroot, str(binary)], f"qemu-{profile.arch}"


def check_runs(profile: Profile, binary: Path, report: VerifyReport) -> None:
    argv, how = run_command(profile, binary)
    if argv is None:
        report.add("run", True, how, skipped=True)
        return
    try:
        proc = subprocess.run([*argv, "--version"], capture_output=True, text=True,
                              timeout=QEMU_TIMEOUT_S, check=False,
                              env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                                   "LC_ALL": "C"})
    except subprocess.TimeoutExpired:
        report.add("run", False, f"{binary.name} --version ({how}) did not finish in "
                                 f"{QEMU_TIMEOUT_S} s")
        return
    except OSError as exc:
        report.add("run", False, f"cannot execute {binary} ({how}): {exc.strerror}")
        return
    out = proc.stdout.strip()
    report.version_output = out
    first = out.splitlines()[0] if out else ""
    if proc.returncode != 0:
        err = (proc.stderr.strip().splitlines() or ["(no output)"])[-1]
        report.add("run", False, f"{binary.name} --version ({how}) exited {proc.returncode}: "
                                 f"{err}")
    elif not re.search(rf"(?<![\w-]){re.escape(profile.name)}(?![\w-])", out):
        report.add("run", False, f"{binary.name} --version ({how}) does not print the target "
                                 f"name {profile.name!r}: {first!r}")
    else:
        hashed = "with" if profile.short_hash in out else "without"
        report.add("run", True, f"--version ({how}) prints {first!r} "
                                f"({hashed} the profile hash)")


def verify_build(profile: Profile, dist_dir: Path, *, run: bool = True) -> VerifyReport:
    """Check ``dist_dir`` (``dist/<target>``) against ``profile``; raise VerifyError on failure.

    Returns the report (every check as a line) when everything passes. ``run=False`` leaves
    out executing the binary (for callers that only want the static checks).
    """
    dist_dir = Path(dist_dir)
    binary = dist_dir / "bin" / "colibri"
    report = VerifyReport(profile.name, binary)
    if not binary.is_file():
        report.add("binary", False, f"{binary} does not exist (did the build finish?)")
    else:
        data = check_binary(profile, binary, report)
        if data is not None:
            check_gpu_code(profile, data, report)
            if run and report.ok:
                check_runs(profile, binary, report)
    lib = dist_dir / "lib" / "libcolibri.a"
    if lib.is_file():
        check_archive(profile, lib, report)
    if dist_dir.is_dir():
        check_manifest(profile, dist_dir, report)
    if not report.ok:
        raise VerifyError(f"{profile.name}: build does not match targets/{profile.name}.yaml:\n"
                          + "\n".join(c.line() for c in report.failures), report)
    return report
