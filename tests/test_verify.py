"""Build self-verification against real binaries: Debian's cc, zig cc for aarch64 (and 32-bit
ARM), real cubins from the pinned ptxas of CUDA 11.8 / 12.6 / 13.0, and qemu-aarch64 runs."""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from kit_support import zig_command
import yaml

from colibri_kit import toolchain
from colibri_kit.profiles import load_profile
from colibri_kit.elf import (EM_AARCH64, EM_CUDA, EM_X86_64, ElfFormatError, archive_members,
                             find_cubins, find_ptx, parse_elf, parse_header, symbols_needing)
from colibri_kit.verify import VerifyError, verify_build


THREADS_C = r"""
#include <pthread.h>
#include <stdio.h>
static void *work(void *arg) { return arg; }
int main(void) {
    pthread_t t;
    if (pthread_create(&t, NULL, work, NULL) != 0) return 1;
    pthread_join(t, NULL);
    puts("threads ok");
    return 0;
}
"""

PTX = """.version {isa}
.target sm_{sm}
.address_size 64

.visible .entry colibri_noop(.param .u64 p)
{{
\tret;
}}
"""
PTX_ISA = {"11.8": "7.8", "12.6": "8.5", "13.0": "9.0"}

# A stand-in for bin/colibri: embeds kernel images the way the build does (.incbin, raw bytes)
# and prints its target name, like the real CLI.
FAKE_CLI = r"""
#include <stdio.h>
#include <string.h>
#include <pthread.h>
/* The images live in their own section behind a symbol main() reads, so a linker that
 * garbage-collects unreferenced sections (zig's lld) keeps them. */
__asm__(".section .rodata.colibri_images,\"a\"\n"
        ".balign 64\n"
        ".globl colibri_images\n"
        "colibri_images:\n"
        INCBINS
        ".byte 0\n"
        ".previous\n");
extern const unsigned char colibri_images[];
static void *work(void *arg) { return arg; }
int main(int argc, char **argv) {
    pthread_t t;
    pthread_create(&t, NULL, work, NULL);
    pthread_join(t, NULL);
    if (argc > 5) return colibri_images[argc];
    if (argc > 1 && strcmp(argv[1], "--version") == 0) {
        printf("colibri 0.1.0 target=%s\n", PRINTED_NAME);
        return 0;
    }
    return 2;
}
"""


def run(argv: list[str], **kw) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, **kw)
    assert proc.returncode == 0, f"{argv}: {proc.stderr}"
    return proc


def readelf_version_needs(path: Path) -> set[tuple[str, str]]:
    """binutils' view of the version-needs table, to cross-check the pure-Python parser."""
    out = run(["readelf", "-V", "-W", str(path)]).stdout
    needs, lib = set(), None
    in_needs = False
    for line in out.splitlines():
        if "'.gnu.version_r'" in line:
            in_needs = True
            continue
        if in_needs and line.startswith("Version") and "'.gnu.version_r'" not in line:
            in_needs = False
        if not in_needs:
            continue
        m = re.search(r"File: (\S+)", line)
        if m:
            lib = m.group(1)
        m = re.search(r"Name: (\S+)", line)
        if m and lib:
            needs.add((lib, m.group(1)))
    return needs


@pytest.fixture(scope="module")
def bins(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("bins")
    src = d / "threads.c"
    src.write_text(THREADS_C)
    out = {"cc": d / "cc-x86_64", "zig231": d / "zig-a64-231", "zig217": d / "zig-a64-217",
           "arm32": d / "zig-arm32"}
    run(["cc", "-O2", str(src), "-o", str(out["cc"]), "-lpthread"])
    run([*zig_command(), "cc", "-target", "aarch64-linux-gnu.2.31", "-O2", str(src), "-o",
         str(out["zig231"]), "-lpthread"])
    run([*zig_command(), "cc", "-target", "aarch64-linux-gnu.2.17", "-O2", str(src), "-o",
         str(out["zig217"]), "-lpthread"])
    run([*zig_command(), "cc", "-target", "arm-linux-gnueabihf.2.31", "-O2", str(src), "-o",
         str(out["arm32"]), "-lpthread"])
    return out


# --------------------------------------------------------------------------- ELF + glibc


@pytest.mark.slow
def test_debian_cc_binary_needs_glibc_2_34_for_pthread_create(bins):
    info = parse_elf(bins["cc"].read_bytes())
    assert info.machine == EM_X86_64 and info.header.elf_class == 64
    assert info.interpreter == "/lib64/ld-linux-x86-64.so.2"
    assert "libc.so.6" in info.needed
    assert info.max_glibc == (2, 34)          # pthread_create@GLIBC_2.34 since glibc 2.34
    assert set(info.version_needs) == readelf_version_needs(bins["cc"])


@pytest.mark.slow
def test_zig_binaries_need_no_more_than_their_target_glibc(bins):
    new = parse_elf(bins["zig231"].read_bytes())
    old = parse_elf(bins["zig217"].read_bytes())
    assert new.machine == EM_AARCH64 == old.machine
    assert new.interpreter == "/lib/ld-linux-aarch64.so.1"
    assert (2, 17) <= new.max_glibc <= (2, 31)
    assert old.max_glibc == (2, 17)
    assert set(new.version_needs) == readelf_version_needs(bins["zig231"])
    assert set(old.version_needs) == readelf_version_needs(bins["zig217"])


@pytest.mark.slow
def test_elf32_arm_is_parsed(bins):
    info = parse_elf(bins["arm32"].read_bytes())
    assert info.header.elf_class == 32 and info.machine == 40     # EM_ARM
    assert info.max_glibc is not None and info.max_glibc <= (2, 31)
    assert set(info.version_needs) == readelf_version_needs(bins["arm32"])


@pytest.mark.slow
def test_glibc_found_from_program_headers_when_section_headers_are_gone(bins, tmp_path):
    """Stripped-to-the-bone binaries keep PT_DYNAMIC; the parser does not need sections."""
    data = bytearray(bins["cc"].read_bytes())
    data[0x28:0x30] = bytes(8)   # e_shoff = 0
    data[0x3C:0x40] = bytes(4)   # e_shnum = 0, e_shstrndx = 0
    info = parse_elf(bytes(data))
    assert info.max_glibc == (2, 34)
    assert info.version_needs == parse_elf(bins["cc"].read_bytes()).version_needs


@pytest.mark.slow
def test_symbols_needing_a_version_match_readelf(bins):
    data = bins["cc"].read_bytes()
    info = parse_elf(data)
    syms = symbols_needing(data, info, {"GLIBC_2.34"})
    assert "pthread_create@GLIBC_2.34" in syms
    dyn = run(["readelf", "--dyn-syms", "-W", str(bins["cc"])]).stdout
    expected = sorted({m.group(1) + "@GLIBC_2.34"
                       for m in re.finditer(r"\s(\w+)@GLIBC_2\.34\b", dyn)})
    assert syms == expected
    assert symbols_needing(data, info, {"GLIBC_9.99"}) == []


def test_static_binary_needs_no_glibc_versions(tmp_path):
    src = tmp_path / "s.c"
    src.write_text("int main(void) { return 0; }\n")
    exe = tmp_path / "s"
    run(["cc", "-static", str(src), "-o", str(exe)])
    info = parse_elf(exe.read_bytes())
    assert info.machine == EM_X86_64 and info.max_glibc is None and not info.is_dynamic
    assert info.needed == () and info.interpreter is None


def test_malformed_elf_is_reported_not_crashed():
    with pytest.raises(ElfFormatError):
        parse_elf(b"not an elf at all")
    with pytest.raises(ElfFormatError):
        parse_elf(b"\x7fELF\x02\x02" + bytes(60))           # big-endian
    # a header whose program header table lies past the end of the file
    header = b"\x7fELF\x02\x01\x01" + bytes(9) + struct.pack(
        "<HHIQQQIHHHHHH", 2, EM_X86_64, 1, 0, 4096, 0, 0, 64, 56, 1, 64, 0, 0)
    assert parse_header(header).phnum == 1
    with pytest.raises(ElfFormatError, match="past the end"):
        parse_elf(header)


# --------------------------------------------------------------------------- cubins and PTX


def make_cubin(version: str, sm: int, out_dir: Path) -> tuple[bytes, bytes]:
    """A real cubin from the pinned ptxas of CUDA ``version`` (installed on demand)."""
    ptxas = toolchain.cuda_toolchain(version).ptxas
    ptx = out_dir / f"noop_{version}_{sm}.ptx"
    ptx.write_text(PTX.format(isa=PTX_ISA[version], sm=sm))
    cubin = out_dir / f"noop_{version}_{sm}.cubin"
    run([str(ptxas), f"-arch=sm_{sm}", str(ptx), "-o", str(cubin)])
    return cubin.read_bytes(), ptx.read_bytes()


@pytest.fixture(scope="module")
def cubins(tmp_path_factory) -> dict[tuple[str, int], tuple[bytes, bytes]]:
    d = tmp_path_factory.mktemp("cubins")
    return {(v, sm): make_cubin(v, sm, d)
            for v, sm in [("11.8", 72), ("12.6", 72), ("12.6", 87), ("13.0", 87),
                          ("13.0", 110)]}


@pytest.mark.slow
@pytest.mark.parametrize("version,sm,abi", [("11.8", 72, 7), ("12.6", 72, 7), ("12.6", 87, 7),
                                            ("13.0", 87, 8), ("13.0", 110, 8)])
@pytest.mark.slow
def test_sm_of_real_cubins_for_both_elf_abi_versions(cubins, version, sm, abi):
    cubin, ptx = cubins[(version, sm)]
    h = parse_header(cubin)
    assert h.machine == EM_CUDA and h.abi_version == abi
    rng = random.Random(sm)
    prefix = bytes(rng.randrange(256) for _ in range(1000)) + b"\x7fELF junk"
    blob = prefix + cubin + bytes(rng.randrange(256) for _ in range(333)) + ptx
    found = find_cubins(blob)
    assert [(c.offset, c.size, c.sm, c.abi_version) for c in found] == \
        [(len(prefix), len(cubin), sm, abi)]
    ptxs = find_ptx(blob)
    assert [(p.target, p.isa_version) for p in ptxs] == \
        [(f"sm_{sm}", tuple(int(x) for x in PTX_ISA[version].split(".")))]


@pytest.mark.slow
def test_several_cubins_in_one_blob(cubins):
    parts = [cubins[("12.6", 72)][0], cubins[("12.6", 87)][0], cubins[("13.0", 110)][0]]
    blob = b"".join(b"\0" * 16 + c for c in parts)
    assert [c.sm for c in find_cubins(blob)] == [72, 87, 110]
    assert find_cubins(b"\0" * 64 + parts[0][:40]) == []   # a truncated header is not a cubin


# --------------------------------------------------------------------------- verify_build


def write_profile(tdir: Path, name: str, *, arch: str, glibc: str, cuda: dict | None) -> Path:
    doc = yaml.safe_load((Path(__file__).parent.parent / "targets" / "host.yaml").read_text())
    doc.update(name=name, arch=arch, glibc=glibc, cuda=cuda)
    tdir.mkdir(parents=True, exist_ok=True)
    (tdir / f"{name}.yaml").write_text(yaml.safe_dump(doc))
    return tdir


def make_dist(tmp: Path, name: str, *, compiler: list[str], images: list[bytes],
              printed_name: str | None = None, lib_compiler: list[str] | None = None) -> Path:
    """dist/<name>/bin/colibri embedding ``images`` + lib/libcolibri.a, built for real."""
    dist = tmp / "dist" / name
    (dist / "bin").mkdir(parents=True)
    (dist / "lib").mkdir()
    work = tmp / f"work-{name}"
    work.mkdir()
    incbins = ""
    for i, image in enumerate(images):
        f = work / f"image{i}.bin"
        f.write_bytes(image)
        incbins += f'".balign 64\\n.incbin \\"{f}\\"\\n"\n'
    src = work / "colibri.c"
    src.write_text(FAKE_CLI.replace("INCBINS", incbins or '""')
                   .replace("PRINTED_NAME", f'"{printed_name or name}"'))
    run([*compiler, "-O2", str(src), "-o", str(dist / "bin" / "colibri"), "-lpthread"])
    obj = work / "part.o"
    lib_src = work / "part.c"
    lib_src.write_text("int colibri_part(int x) { return x + 1; }\n")
    run([*(lib_compiler or compiler), "-c", str(lib_src), "-o", str(obj)])
    run(["ar", "rc", str(dist / "lib" / "libcolibri.a"), str(obj)])
    return dist


@pytest.mark.slow
def test_verify_passes_for_a_matching_x86_64_build_with_cubin_and_ptx(tmp_path, cubins):
    tdir = write_profile(tmp_path / "t", "box", arch="x86_64", glibc="2.36",
                         cuda={"version": "12.6", "archs": ["sm_87"], "igpu": False})
    cubin, ptx = cubins[("12.6", 87)]
    dist = make_dist(tmp_path, "box", compiler=["cc"], images=[cubin, ptx + b"\0"])
    report = verify_build(load_profile("box", tdir), dist)
    assert report.ok and report.machine == "x86_64" and report.max_glibc == "2.34"
    assert report.cubin_sms == ("sm_87",) and report.ptx_targets == ("sm_87",)
    assert report.version_output == "colibri 0.1.0 target=box"
    names = [c.name for c in report.checks]
    assert names == ["machine", "glibc", "cubins", "ptx", "run", "libcolibri.a", "manifest"]
    assert "native" in report.checks[4].detail and not report.checks[4].skipped
    assert report.checks[6].skipped   # this dist has no manifest.json


def write_manifest(dist: Path, profile, **override) -> dict:
    files = {p.relative_to(dist).as_posix(): {"sha256": hashlib.sha256(p.read_bytes()).hexdigest(),
                                              "size": p.stat().st_size}
             for p in sorted(dist.rglob("*")) if p.is_file() and p.name != "manifest.json"}
    doc = {"target": profile.name, "glibc_floor": profile.glibc, "profile_hash": profile.hash,
           "cuda": {"version": profile.cuda.version, "sms": list(profile.cuda.sm_numbers)}
           if profile.cuda else None, "files": files, **override}
    (dist / "manifest.json").write_text(json.dumps(doc))
    return doc


@pytest.mark.slow
def test_manifest_must_match_the_profile_and_the_files(tmp_path, cubins):
    tdir = write_profile(tmp_path / "t", "box", arch="x86_64", glibc="2.36",
                         cuda={"version": "12.6", "archs": ["sm_87"], "igpu": False})
    profile = load_profile("box", tdir)
    cubin, ptx = cubins[("12.6", 87)]
    dist = make_dist(tmp_path, "box", compiler=["cc"], images=[cubin, ptx])
    write_manifest(dist, profile)
    report = verify_build(profile, dist, run=False)
    assert report.checks[-1].name == "manifest" and report.checks[-1].ok
    assert "2 files match their sha256" in report.checks[-1].detail

    (dist / "lib" / "libcolibri.a").write_bytes(b"!<arch>\n")         # changed after the build
    (dist / "bin" / "stray").write_text("x")                         # not in the manifest
    with pytest.raises(VerifyError) as err:
        verify_build(profile, dist, run=False)
    assert "lib/libcolibri.a does not match its sha256/size" in str(err.value)
    assert "not listed: bin/stray" in str(err.value)
    (dist / "bin" / "stray").unlink()

    write_manifest(dist, profile, profile_hash="0" * 64, cuda={"version": "12.6", "sms": [72]})
    with pytest.raises(VerifyError) as err:
        verify_build(profile, dist, run=False)
    assert f"profile_hash is '{'0' * 64}', profile has '{profile.hash}'" in str(err.value)
    assert "cuda.sms is [72], profile has [87]" in str(err.value)


@pytest.mark.slow
def test_verify_lists_every_failed_check(tmp_path, cubins):
    """Wrong SM, glibc above the floor, PTX too new for the driver: all three named at once."""
    tdir = write_profile(tmp_path / "t", "box", arch="x86_64", glibc="2.17",
                         cuda={"version": "11.8", "archs": ["sm_72"], "igpu": True})
    cubin, ptx = cubins[("12.6", 87)]
    dist = make_dist(tmp_path, "box", compiler=["cc"], images=[cubin, ptx])
    with pytest.raises(VerifyError) as err:
        verify_build(load_profile("box", tdir), dist)
    msg = str(err.value)
    assert msg.startswith("box: build does not match targets/box.yaml:")
    assert "glibc: highest required GLIBC_2.34 > profile floor 2.17 (symbols: " in msg
    assert "pthread_create@GLIBC_2.34" in msg and "puts@" not in msg    # only the too-new ones
    assert "cubins: embedded sm_87 x1; profile wants sm_72" in msg
    assert "PTX ISA 8.5 is newer than CUDA 11.8 drivers accept (7.8)" in msg
    assert "PTX targets sm_87, above the lowest profile SM sm_72" in msg
    assert "machine" not in msg


@pytest.mark.slow
def test_tensor_core_ptx_is_accepted_next_to_the_lowest_sms(tmp_path, cubins):
    """A profile with sm_72 and sm_87 embeds PTX compute_72 and compute_87 (the tensor-core PTX,
    toolchain.ptx_sms): both pass; a PTX above sm_72 without an sm_80+ SM in the profile fails."""
    tdir = write_profile(tmp_path / "t", "box", arch="x86_64", glibc="2.36",
                         cuda={"version": "12.6", "archs": ["sm_72", "sm_87"], "igpu": True})
    (c72, p72), (c87, p87) = cubins[("12.6", 72)], cubins[("12.6", 87)]
    dist = make_dist(tmp_path / "two", "box", compiler=["cc"], images=[c72, c87, p72, p87])
    report = verify_build(load_profile("box", tdir), dist, run=False)
    assert report.ok and report.ptx_targets == ("sm_72", "sm_87"), report.checks
    only72 = write_profile(tmp_path / "t72", "box", arch="x86_64", glibc="2.36",
                           cuda={"version": "12.6", "archs": ["sm_72"], "igpu": True})
    dist = make_dist(tmp_path / "one", "box", compiler=["cc"], images=[c72, p72, p87])
    with pytest.raises(VerifyError, match=r"PTX targets sm_87, above the lowest profile SM sm_72"):
        verify_build(load_profile("box", only72), dist, run=False)


@pytest.mark.slow
def test_cpu_only_profile_refuses_embedded_gpu_code(tmp_path, cubins):
    tdir = write_profile(tmp_path / "t", "box", arch="x86_64", glibc="2.36", cuda=None)
    dist = make_dist(tmp_path, "box", compiler=["cc"], images=[cubins[("12.6", 87)][0]])
    with pytest.raises(VerifyError, match=r"cubins: found sm_87 but the profile has no CUDA"):
        verify_build(load_profile("box", tdir), dist)
    clean = make_dist(tmp_path / "clean", "box", compiler=["cc"], images=[])
    report = verify_build(load_profile("box", tdir), clean)
    assert report.ok and report.cubin_sms == () and report.ptx_targets == ()


@pytest.mark.slow
def test_missing_ptx_fails_a_cuda_profile(tmp_path, cubins):
    tdir = write_profile(tmp_path / "t", "box", arch="x86_64", glibc="2.36",
                         cuda={"version": "12.6", "archs": ["sm_87"], "igpu": False})
    dist = make_dist(tmp_path, "box", compiler=["cc"], images=[cubins[("12.6", 87)][0]])
    with pytest.raises(VerifyError, match=r"ptx: no PTX embedded"):
        verify_build(load_profile("box", tdir), dist)


def test_missing_binary_is_reported(tmp_path):
    tdir = write_profile(tmp_path / "t", "box", arch="x86_64", glibc="2.36", cuda=None)
    with pytest.raises(VerifyError, match=r"binary: .*bin/colibri does not exist"):
        verify_build(load_profile("box", tdir), tmp_path / "dist" / "box")


@pytest.mark.slow
def test_aarch64_build_verified_and_run_under_qemu(tmp_path, cubins):
    """The orin-nx profile itself, a zig-built aarch64 binary with a real sm_87 cubin."""
    assert shutil.which("qemu-aarch64"), "tests need qemu-user (scripts/bootstrap.sh installs it)"
    p = load_profile("orin-nx")
    cubin, ptx = cubins[("12.6", 87)]
    zig = [*zig_command(), "cc", "-target", p.zig_triple, f"-mcpu={p.zig_mcpu}"]
    dist = make_dist(tmp_path, "orin-nx", compiler=zig, images=[cubin, ptx])
    report = verify_build(p, dist)
    assert report.ok and report.machine == "aarch64"
    assert report.checks[4].name == "run" and "qemu-aarch64" in report.checks[4].detail
    assert report.version_output == "colibri 0.1.0 target=orin-nx"
    assert "without the profile hash" in report.checks[4].detail

    # same binary, but it prints another target's name: caught by running it
    wrong = make_dist(tmp_path / "w", "orin-nx", compiler=zig, images=[cubin, ptx],
                      printed_name="orin-nano")
    with pytest.raises(VerifyError, match=r"run: colibri --version \(qemu-aarch64\) does not "
                                          r"print the target name 'orin-nx'"):
        verify_build(p, wrong)

    # qemu not installed: the run is a "skipped" report line, the rest still checked
    env_path = os.environ["PATH"]
    try:
        os.environ["PATH"] = str(tmp_path / "empty-bin")
        report = verify_build(p, dist)
    finally:
        os.environ["PATH"] = env_path
    run_check = [c for c in report.checks if c.name == "run"][0]
    assert run_check.skipped and report.ok
    assert run_check.line() == ("[skip] run: skipped: qemu-aarch64 not installed "
                                "(apt-get install qemu-user)")


@pytest.mark.slow
def test_x86_64_binary_and_objects_for_an_aarch64_target_fail(tmp_path, cubins):
    p = load_profile("orin-nx")
    cubin, ptx = cubins[("12.6", 87)]
    dist = make_dist(tmp_path, "orin-nx", compiler=["cc"], images=[cubin, ptx])
    with pytest.raises(VerifyError) as err:
        verify_build(p, dist)
    assert "machine: ELF64 x86_64 (profile arch aarch64)" in str(err.value)
    assert "libcolibri.a: objects for the wrong machine: part.o (x86_64)" in str(err.value)
    assert "run:" not in str(err.value)   # a wrong-machine binary is not executed


def test_archive_members_parse_a_real_ar_archive(tmp_path):
    objs = []
    for i, name in enumerate(["a_rather_long_object_name_beyond_16.o", "b.o"]):
        src = tmp_path / f"{i}.c"
        src.write_text(f"int f{i}(void) {{ return {i}; }}\n")
        obj = tmp_path / name
        run(["cc", "-c", str(src), "-o", str(obj)])
        objs.append(obj)
    lib = tmp_path / "lib.a"
    run(["ar", "rcs", str(lib), *map(str, objs)])
    members = archive_members(lib.read_bytes())
    assert [n for n, _ in members] == [o.name for o in objs]
    assert all(parse_header(body).machine == EM_X86_64 for _, body in members)
    assert [body for _, body in members] == [o.read_bytes() for o in objs]


@pytest.mark.slow
def test_invoke_verify_exits_nonzero_with_every_failure(tmp_path, cubins):
    root = Path(__file__).parent.parent
    dist = make_dist(tmp_path, "orin-nx", compiler=["cc"], images=[cubins[("12.6", 72)][0]])
    proc = subprocess.run([sys.executable, "-m", "invoke", "-r", str(root), "verify", "--target",
                           "orin-nx", "--dist", str(dist)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("error: orin-nx: build does not match targets/orin-nx.yaml:")
    for fragment in ("machine: ELF64 x86_64 (profile arch aarch64)",
                     "cubins: embedded sm_72 x1; profile wants sm_87", "ptx: no PTX embedded"):
        assert fragment in proc.stderr
    ok = make_dist(tmp_path / "ok", "host", compiler=["cc"], images=[])
    proc = subprocess.run([sys.executable, "-m", "invoke", "-r", str(root), "verify", "--target",
                           "host", "--dist", str(ok), "--json"], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["ok"] is True and doc["machine"] == "x86_64" and doc["cubin_sms"] == []
    assert {c["name"] for c in doc["checks"]} >= {"machine", "glibc", "run", "cubins"}
