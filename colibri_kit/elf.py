"""Readers of the binary formats a build produces, apart from any build policy (verify.py):
ELF headers, program headers, the dynamic section and its GLIBC version needs; CUDA ELF images
("cubins", ``e_machine`` 190) and PTX modules embedded in a file; ``ar`` archive members.

Pure Python, no binutils needed; every offset is bounds-checked (:class:`ElfFormatError`).
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

EM_X86_64 = 62
EM_AARCH64 = 183
EM_CUDA = 190
MACHINE_NAMES = {EM_X86_64: "x86_64", EM_AARCH64: "aarch64", EM_CUDA: "cuda", 3: "i386",
                 40: "arm", 8: "mips", 21: "ppc64", 243: "riscv"}

PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_STRSZ = 0, 1, 5, 10
DT_VERNEED, DT_VERNEEDNUM = 0x6FFFFFFE, 0x6FFFFFFF
SHT_DYNSYM, SHT_GNU_VERNEED = 11, 0x6FFFFFFE


_GLIBC_VER_RE = re.compile(r"^GLIBC_(\d+)\.(\d+)(?:\.(\d+))?$")
_PTX_RE = re.compile(rb"\.version[ \t]+(\d+)\.(\d+)[ \t]*\r?\n(?:[ \t]*(?://[^\n]*)?\r?\n)*"
                     rb"[ \t]*\.target[ \t]+(sm_\d+[af]?)")


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
        found = {glibc_version(ver) for _lib, ver in self.version_needs}
        return tuple(sorted(v for v in found if v is not None))

    @property
    def max_glibc(self) -> tuple[int, ...] | None:
        versions = self.glibc_versions
        return versions[-1] if versions else None


def glibc_version(version_name: str) -> tuple[int, ...] | None:
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
    """The SM a cubin is compiled for (the field moved with ELF ABI version 8, CUDA 13's ptxas:
    e_flags & 0xff up to version 7, bits 8..15 from version 8)."""
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


# CUDA ELF ".nv.info*" sections hold attribute records: u8 format, u8 attribute, u16 (a value,
# or for format EIFMT_SVAL the size of the payload that follows). EIATTR_REGCOUNT (0x2f, SVAL)
# carries (u32 symbol index, u32 registers per thread). Layout as nvdisasm lists it, e.g. the
# disassembled cubins in mikex86/LibreCuda tests/kernel_struct_param/read_from_struct.asm
# ("nvinfo : EIATTR_REGCOUNT ... .byte 0x04, 0x2f / .short 8 / .word index@(fn) / .word 8").
EIFMT_SVAL = 0x04
EIATTR_REGCOUNT = 0x2F
SHT_SYMTAB = 2


def cubin_register_counts(cubin: bytes) -> dict[str, int]:
    """Function name -> registers per thread, as the driver reads them from the cubin itself
    (independent of ptxas' console report). 64-bit cubins only."""
    h = parse_header(cubin)
    if h.machine != EM_CUDA or h.elf_class != 64:
        raise ElfFormatError("not a 64-bit CUDA ELF image")
    shfmt = "<IIQQQQIIQQ"
    secs = [_unpack(shfmt, cubin, h.shoff + i * h.shentsize) for i in range(h.shnum)]
    names_off = secs[h.shstrndx][4]
    symtab = next((s for s in secs if s[1] == SHT_SYMTAB), None)
    if symtab is None:
        raise ElfFormatError("cubin has no symbol table")
    strtab = secs[symtab[6]][4]

    def symbol(index: int) -> str:
        st_name = _unpack("<I", cubin, symtab[4] + index * 24)[0]
        return _cstr(cubin, strtab + st_name)

    out: dict[str, int] = {}
    for sh in secs:
        if not _cstr(cubin, names_off + sh[0]).startswith(".nv.info"):
            continue
        pos, end = sh[4], sh[4] + sh[5]
        while pos + 4 <= end:
            fmt, attr, value = _unpack("<BBH", cubin, pos)
            pos += 4
            if fmt != EIFMT_SVAL:
                continue
            if attr == EIATTR_REGCOUNT and value >= 8:
                index, regs = _unpack("<II", cubin, pos)
                out[symbol(index)] = regs
            pos += value
    return out


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
