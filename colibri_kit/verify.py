"""Self-verification of a build: does ``dist/<target>/`` really match its target profile?

Pure Python, no binutils needed. Checks, each reported as one line:

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

import json
import os
import platform
import re
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from colibri_kit.errors import VerifyError
from colibri_kit.hashing import file_sha256
from colibri_kit.profiles import Profile

EM_X86_64 = 62
EM_AARCH64 = 183
EM_CUDA = 190
MACHINES = {"x86_64": EM_X86_64, "aarch64": EM_AARCH64}
MACHINE_NAMES = {EM_X86_64: "x86_64", EM_AARCH64: "aarch64", EM_CUDA: "cuda", 3: "i386",
                 40: "arm", 8: "mips", 21: "ppc64", 243: "riscv"}

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ = 0, 1, 5, 10
DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFE, 0x6FFFFFFF
SHT_DYNSYM, SHT_GNU_VERNEED = 11, 0x6FFFFFFE

# Newest PTX ISA each pinned CUDA version's driver can JIT (PTX ISA release notes).
PTX_ISA_MAX = {"11.8": (7, 8), "12.6": (8, 5), "13.0": (9, 0)}

_GLIBC_VER_RE = re.compile(r"^GLIBC_(\d+)\.(\d+)(?:\.(\d+))?$")
_PTX_RE = re.compile(rb"\.version[ \t]+(\d+)\.(\d+)[ \t]*\r?\n(?:[ \t]*(?://[^\n]*)?\r?\n)*"
                     rb"[ \t]*\.target[ \t]+(sm_\d+[af]?)")
QEMU_TIMEOUT_S = 120


class ElfFormatError(ValueError):
    """The bytes are not a well-formed ELF file (or a part of one we need is out of bounds)."""


# --------------------------------------------------------------------------- ELF parsing


@dataclass(frozen=True)
class ElfHeader:
    elf_class: int      # 32 or 64
    osabi: int
    abi_version: int    # e_ident[EI_ABIVERSION]
    e_type: int
    machine: int
    flags: int
    phoff: int
    shoff: int
    phentsize: int
    phnum: int
    shentsize: int
    shnum: int
    shstrndx: int
    ehsize: int

    @property
    def machine_name(self) -> str:
        return MACHINE_NAMES.get(self.machine, f"e_machine {self.machine}")

    def extent(self) -> int:
        """Bytes the ELF spans from its header (section headers are last in what we embed)."""
        ends = [self.ehsize, self.phoff + self.phnum * self.phentsize,
                self.shoff + self.shnum * self.shentsize]
        return max(ends)


def parse_header(data: bytes, base: int = 0) -> ElfHeader:
    """Parse the ELF header starting at ``data[base:]`` (little-endian only)."""
    if data[base:base + 4] != b"\x7fELF":
        raise ElfFormatError("no ELF magic")
    if len(data) < base + 52:
        raise ElfFormatError("truncated ELF header")
    ei_class, ei_data = data[base + 4], data[base + 5]
    if ei_data != 1:
        raise ElfFormatError(f"not little-endian (EI_DATA={ei_data})")
    if ei_class == 2:
        if len(data) < base + 64:
            raise ElfFormatError("truncated ELF64 header")
        (e_type, machine, _ver, _entry, phoff, shoff, flags, ehsize, phentsize, phnum,
         shentsize, shnum, shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", data, base + 16)
        bits = 64
    elif ei_class == 1:
        (e_type, machine, _ver, _entry, phoff, shoff, flags, ehsize, phentsize, phnum,
         shentsize, shnum, shstrndx) = struct.unpack_from("<HHIIIIIHHHHHH", data, base + 16)
        bits = 32
    else:
        raise ElfFormatError(f"bad EI_CLASS {ei_class}")
    return ElfHeader(bits, data[base + 7], data[base + 8], e_type, machine, flags, phoff, shoff,
                     phentsize, phnum, shentsize, shnum, shstrndx, ehsize)


@dataclass(frozen=True)
class ElfInfo:
    header: ElfHeader
    interpreter: str | None
    needed: tuple[str, ...]                 # DT_NEEDED libraries
    version_needs: tuple[tuple[str, str], ...]  # (library, version name), e.g. (libc.so.6, GLIBC_2.34)
    version_index: tuple[tuple[str, int], ...] = ()  # (version name, index .gnu.version uses)

    @property
    def machine(self) -> int:
        return self.header.machine

    @property
    def is_dynamic(self) -> bool:
        return bool(self.needed) or self.interpreter is not None

    @property
    def glibc_versions(self) -> tuple[tuple[int, ...], ...]:
        found = {_glibc_tuple(ver) for _lib, ver in self.version_needs}
        return tuple(sorted(v for v in found if v is not None))

    @property
    def max_glibc(self) -> tuple[int, ...] | None:
        versions = self.glibc_versions
        return versions[-1] if versions else None


def _glibc_tuple(version_name: str) -> tuple[int, ...] | None:
    """``GLIBC_2.34`` -> (2, 34); ``GLIBC_2.2.5`` -> (2, 2, 5); anything else -> None."""
    m = _GLIBC_VER_RE.match(version_name)
    return tuple(int(g) for g in m.groups() if g is not None) if m else None


def _fmt(fmt64: str, fmt32: str, bits: int) -> str:
    return fmt64 if bits == 64 else fmt32


def _unpack(fmt: str, data: bytes, off: int) -> tuple[int, ...]:
    if off < 0 or off + struct.calcsize(fmt) > len(data):
        raise ElfFormatError(f"structure at offset {off} runs past the end of the file")
    return struct.unpack_from(fmt, data, off)


def _cstr(data: bytes, off: int, limit: int | None = None) -> str:
    end = data.find(b"\0", off, limit if limit is not None else len(data))
    if off < 0 or off >= len(data) or end < 0:
        raise ElfFormatError(f"string at offset {off} is out of bounds")
    return data[off:end].decode("ascii", "replace")


def parse_elf(data: bytes) -> ElfInfo:
    """Header, interpreter, DT_NEEDED and version needs of an ELF executable or library.

    Uses the program headers (``PT_DYNAMIC``), which every dynamically linked executable keeps
    even when its section headers are stripped; falls back to the ``.gnu.version_r`` section.
    """
    h = parse_header(data)
    bits = h.elf_class
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    dynamic: tuple[int, int] | None = None
    interp: str | None = None
    phfmt = _fmt("<IIQQQQQQ", "<IIIIIIII", bits)
    for i in range(h.phnum):
        vals = _unpack(phfmt, data, h.phoff + i * h.phentsize)
        if bits == 64:
            p_type, _flags, p_offset, p_vaddr, _pa, p_filesz = vals[:6]
        else:
            p_type, p_offset, p_vaddr, _pa, p_filesz = vals[:5]
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
        elif p_type == PT_INTERP:
            interp = _cstr(data, p_offset, p_offset + p_filesz)

    def to_offset(vaddr: int) -> int:
        for start, off, size in loads:
            if start <= vaddr < start + size:
                return off + (vaddr - start)
        raise ElfFormatError(f"address {vaddr:#x} is not in any PT_LOAD segment")

    needed: list[str] = []
    needs: list[tuple[str, str, int]] = []
    if dynamic is not None:
        entries: dict[int, int] = {}
        needed_off: list[int] = []
        dfmt = _fmt("<qQ", "<iI", bits)
        dsize = struct.calcsize(dfmt)
        off, size = dynamic
        for pos in range(off, off + size - dsize + 1, dsize):
            tag, val = _unpack(dfmt, data, pos)
            if tag == DT_NULL:
                break
            if tag == DT_NEEDED:
                needed_off.append(val)
            else:
                entries.setdefault(tag, val)
        if DT_STRTAB in entries:
            strtab = to_offset(entries[DT_STRTAB])
            strend = strtab + entries.get(DT_STRSZ, len(data) - strtab)
            needed = [_cstr(data, strtab + n, strend) for n in needed_off]
            if DT_VERNEED in entries:
                needs = _read_verneed(data, to_offset(entries[DT_VERNEED]),
                                      entries.get(DT_VERNEEDNUM, 0), strtab, strend)
    elif h.shnum and h.shoff:
        needs = _verneed_from_sections(data, h)
    return ElfInfo(h, interp, tuple(needed), tuple((lib, ver) for lib, ver, _ in needs),
                   tuple((ver, idx) for _, ver, idx in needs))


SHT_GNU_VERSYM = 0x6FFFFFFF


def symbols_needing(data: bytes, info: ElfInfo, versions: set[str]) -> list[str]:
    """Dynamic symbols bound to any of ``versions`` (e.g. ``pthread_create@GLIBC_2.34``).

    Reads ``.dynsym`` and ``.gnu.version`` through the section headers; returns [] when they
    are stripped (the version check itself does not need them).
    """
    h = info.header
    wanted = {idx: ver for ver, idx in info.version_index if ver in versions}
    if not wanted or not h.shoff or not h.shnum:
        return []
    shfmt = _fmt("<IIQQQQIIQQ", "<IIIIIIIIII", h.elf_class)
    try:
        sections = [_unpack(shfmt, data, h.shoff + i * h.shentsize) for i in range(h.shnum)]
        dynsym = next((sh for sh in sections if sh[1] == SHT_DYNSYM), None)
        versym = next((sh for sh in sections if sh[1] == SHT_GNU_VERSYM), None)
        if dynsym is None or versym is None or dynsym[6] >= len(sections):
            return []
        sym_off, sym_size, link, entsize = dynsym[4], dynsym[5], dynsym[6], dynsym[9]
        str_off = sections[link][4]
        out = []
        for i in range(sym_size // entsize if entsize else 0):
            (ver,) = _unpack("<H", data, versym[4] + 2 * i)
            if (ver & 0x7FFF) in wanted:
                (st_name,) = _unpack("<I", data, sym_off + i * entsize)
                out.append(f"{_cstr(data, str_off + st_name)}@{wanted[ver & 0x7FFF]}")
        return sorted(set(out))
    except ElfFormatError:
        return []


def _read_verneed(data: bytes, off: int, count: int, strtab: int,
                  strend: int) -> list[tuple[str, str, int]]:
    """Walk the Elf_Verneed / Elf_Vernaux chains (same layout for ELF32 and ELF64).

    Returns (library, version name, version index) for every needed version.
    """
    out: list[tuple[str, str, int]] = []
    for _ in range(count):
        _ver, cnt, vn_file, vn_aux, vn_next = _unpack("<HHIII", data, off)
        lib = _cstr(data, strtab + vn_file, strend)
        aux = off + vn_aux
        for _ in range(cnt):
            _hash, _flags, other, name, vna_next = _unpack("<IHHII", data, aux)
            out.append((lib, _cstr(data, strtab + name, strend), other))
            if not vna_next:
                break
            aux += vna_next
        if not vn_next:
            break
        off += vn_next
    return out


def _verneed_from_sections(data: bytes, h: ElfHeader) -> list[tuple[str, str, int]]:
    shfmt = _fmt("<IIQQQQIIQQ", "<IIIIIIIIII", h.elf_class)
    sections = [_unpack(shfmt, data, h.shoff + i * h.shentsize) for i in range(h.shnum)]
    for sh in sections:
        sh_type, sh_offset, sh_link, sh_info = sh[1], sh[4], sh[6], sh[7]
        if sh_type == SHT_GNU_VERNEED and sh_link < len(sections):
            link = sections[sh_link]
            return _read_verneed(data, sh_offset, sh_info, link[4], link[4] + link[5])
    return []


# --------------------------------------------------------------------------- embedded GPU code


@dataclass(frozen=True)
class CubinInfo:
    offset: int        # where the embedded ELF starts in the file
    size: int          # bytes it spans (header .. end of section header table)
    sm: int            # e.g. 87
    abi_version: int   # 7 (CUDA <= 12) or 8 (CUDA 13)
    elf_class: int

    @property
    def arch(self) -> str:
        return f"sm_{self.sm}"


@dataclass(frozen=True)
class PtxInfo:
    offset: int
    isa_version: tuple[int, int]   # from `.version 8.5`
    target: str                    # from `.target sm_87`

    @property
    def sm(self) -> int:
        return int(re.sub(r"[af]$", "", self.target[3:]))


def cubin_sm(header: ElfHeader) -> int:
    """The SM a cubin is compiled for (FACTS.md: the field moved with ELF ABI version 8)."""
    if header.abi_version >= 8:
        return (header.flags >> 8) & 0xFF
    return header.flags & 0xFF


def find_cubins(data: bytes) -> list[CubinInfo]:
    """Every CUDA ELF image embedded in ``data`` (not the file's own header at offset 0)."""
    out: list[CubinInfo] = []
    pos = data.find(b"\x7fELF", 1)
    while pos >= 0:
        nxt = pos + 4
        try:
            h = parse_header(data, pos)
        except ElfFormatError:
            h = None
        if h is not None and h.machine == EM_CUDA:
            size = h.extent()
            if pos + size <= len(data):
                out.append(CubinInfo(pos, size, cubin_sm(h), h.abi_version, h.elf_class))
                nxt = pos + max(size, 4)
        pos = data.find(b"\x7fELF", nxt)
    return out


def find_ptx(data: bytes) -> list[PtxInfo]:
    """Every PTX module embedded as text (its ``.version`` line followed by ``.target``)."""
    return [PtxInfo(m.start(), (int(m.group(1)), int(m.group(2))), m.group(3).decode())
            for m in _PTX_RE.finditer(data)]


# --------------------------------------------------------------------------- static archives


def archive_members(data: bytes) -> list[tuple[str, bytes]]:
    """Members of a System V / GNU ``ar`` archive (symbol and name tables skipped)."""
    if not data.startswith(b"!<arch>\n"):
        raise ElfFormatError("not an ar archive")
    out: list[tuple[str, bytes]] = []
    longnames = b""
    pos = 8
    while pos + 60 <= len(data):
        hdr = data[pos:pos + 60]
        name = hdr[:16].decode("ascii", "replace").rstrip()
        try:
            size = int(hdr[48:58].decode().strip())
        except ValueError:
            raise ElfFormatError(f"bad ar member header at offset {pos}") from None
        body = data[pos + 60:pos + 60 + size]
        if name == "//":
            longnames = body
        elif name not in ("/", "/SYM64/", "__.SYMDEF", "__.SYMDEF SORTED"):
            if name.startswith("/") and name[1:].isdigit():
                start = int(name[1:])
                end = longnames.find(b"/\n", start)
                name = longnames[start:end if end >= 0 else None].decode("ascii", "replace")
            out.append((name.rstrip("/"), body))
        pos += 60 + size + (size & 1)
    return out


# --------------------------------------------------------------------------- the report


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
            too_new = {ver for _, ver in info.version_needs if _glibc_tuple(ver) is not None
                       and _glibc_tuple(ver)[:2] > profile.glibc_tuple}  # type: ignore[index]
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
    too_high = [p for p in ptx if p.sm > min(want)]
    problems = []
    if too_new:
        problems.append(f"PTX ISA {too_new[0].isa_version[0]}.{too_new[0].isa_version[1]} is "
                        f"newer than CUDA {profile.cuda.version} drivers accept "
                        f"({isa_max[0]}.{isa_max[1]})")
    if too_high:
        problems.append(f"PTX targets {too_high[0].target}, above the lowest profile SM "
                        f"sm_{min(want)}")
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
    path = dist_dir / "manifest.json"
    if not path.is_file():
        report.add("manifest", True, "skipped: no manifest.json", skipped=True)
        return
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        report.add("manifest", False, f"{path} is not readable JSON ({exc})")
        return
    problems = []
    for key, want in (("target", profile.name), ("glibc_floor", profile.glibc),
                      ("profile_hash", profile.hash)):
        if doc.get(key) != want:
            problems.append(f"{key} is {doc.get(key)!r}, profile has {want!r}")
    cuda = doc.get("cuda")
    if profile.cuda is None and cuda:
        problems.append("lists CUDA images but the profile has no CUDA")
    elif profile.cuda is not None:
        sms = sorted(cuda.get("sms", [])) if isinstance(cuda, dict) else None
        if sms != sorted(profile.cuda.sm_numbers):
            problems.append(f"cuda.sms is {sms}, profile has {list(profile.cuda.sm_numbers)}")
    files = doc.get("files")
    if not isinstance(files, dict) or "bin/colibri" not in files:
        problems.append("files does not list bin/colibri")
        files = {}
    for rel, meta in sorted(files.items()):
        f = dist_dir / rel
        if not f.is_file():
            problems.append(f"{rel} is listed but missing")
        elif not isinstance(meta, dict) or meta.get("sha256") != file_sha256(f) \
                or meta.get("size") != f.stat().st_size:
            problems.append(f"{rel} does not match its sha256/size")
    present = sorted(p.relative_to(dist_dir).as_posix() for p in dist_dir.rglob("*")
                     if p.is_file() and p != path)
    unlisted = [rel for rel in present if rel not in files]
    if unlisted:
        problems.append(f"not listed: {', '.join(unlisted)}")
    report.add("manifest", not problems, "; ".join(problems) if problems else
               f"{len(files)} files match their sha256; target, profile hash, glibc floor"
               f"{' and SMs' if profile.cuda else ''} agree")


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
        err = VerifyError(
            f"{profile.name}: build does not match targets/{profile.name}.yaml:\n"
            + "\n".join(c.line() for c in report.failures)
        )
        err.report = report  # type: ignore[attr-defined]  # the full report, for callers
        raise err
    return report
