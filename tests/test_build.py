"""The build with real compilers (zig, NVRTC + ptxas, cc), real qemu, real make."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_kit import build as kb
from colibri_kit import elf, paths, profiles, toolchain
from colibri_kit.errors import BuildError, ProfileError, ToolchainError


def _quiet(msg: str) -> None:
    print(msg)


def _tree_bytes(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes()
            for p in sorted(root.rglob("*")) if p.is_file()}


def _mtimes(root: Path) -> dict[str, int]:
    return {p.relative_to(root).as_posix(): p.stat().st_mtime_ns
            for p in sorted(root.rglob("*")) if p.is_file()}


def _max_glibc(binary: Path) -> tuple[int, ...]:
    out = subprocess.run(["readelf", "-V", "-W", str(binary)], capture_output=True, text=True,
                         check=True).stdout
    return max(tuple(map(int, v.split("."))) for v in re.findall(r"GLIBC_(\d+\.\d+)", out))


def _qemu(binary: Path, *args: str) -> str:
    proc = subprocess.run(["qemu-aarch64", "-L", "/usr/aarch64-linux-gnu", str(binary), *args],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


# --------------------------------------------------------------------------- the shipped targets


def test_orin_nx_dist_matches_contract(orin_nx_build: Path):
    dist = orin_nx_build
    manifest = json.loads((dist / "manifest.json").read_text())
    prof = profiles.load_profile("orin-nx")
    assert manifest["target"] == "orin-nx" and manifest["arch"] == "aarch64"
    assert manifest["glibc_floor"] == "2.35"
    assert manifest["profile_hash"] == prof.hash
    assert manifest["cuda"]["version"] == "12.6" and manifest["cuda"]["sms"] == [87]
    assert manifest["toolchain"]["host_cc"] == f"zig {toolchain.ZIG_VERSION}"
    assert manifest["toolchain"]["cuda"]["ptxas"].endswith("V12.6.85")
    assert manifest["source_revision"] != "unknown"
    assert set(manifest["files"]) >= {"bin/colibri", "lib/libcolibri.a", "include/colibri.h",
                                      "include/colibri_config.h"}
    for rel, entry in manifest["files"].items():
        data = (dist / rel).read_bytes()
        assert entry["size"] == len(data)
        assert entry["sha256"] == hashlib.sha256(data).hexdigest(), rel
    # Every file in dist is listed (the manifest itself aside).
    listed = set(manifest["files"]) | {"manifest.json"}
    assert set(_tree_bytes(dist)) == listed
    # ptxas -v per cubin: every kernel of the embedded sm_87 cubin, with the register count the
    # cubin itself carries, and the spill/stack/shared figures
    data = (dist / "bin" / "colibri").read_bytes()
    (cubin,) = elf.find_cubins(data)
    regs = elf.cubin_register_counts(data[cubin.offset:cubin.offset + cubin.size])
    kernels = {k["name"]: k for k in manifest["kernels"]["sm_87"] if k["entry"]}
    assert kernels
    assert {n: k["registers"] for n, k in kernels.items()} == {n: regs[n] for n in kernels}
    assert set(regs) <= {k["name"] for k in manifest["kernels"]["sm_87"]}
    assert all(k["spill_store_bytes"] >= 0 and k["shared_bytes"] >= 0 for k in kernels.values())


def test_orin_nx_binary_is_aarch64_glibc_235_with_sm87(orin_nx_build: Path):
    binary = orin_nx_build / "bin" / "colibri"
    desc = subprocess.run(["file", "-b", str(binary)], capture_output=True, text=True).stdout
    assert "ARM aarch64" in desc and "ELF 64-bit" in desc
    assert _max_glibc(binary) <= (2, 35)
    data = binary.read_bytes()
    assert [c.sm for c in elf.find_cubins(data)] == [87]
    ptx = elf.find_ptx(data)
    assert [p.target for p in ptx] == ["sm_87"]
    # Images are 64-byte aligned in the file too (the section is), so tools find them as-is.
    assert all(c.offset % 64 == 0 for c in elf.find_cubins(data))


def test_orin_nx_runs_under_qemu_and_prints_target_and_macros(orin_nx_build: Path):
    out = _qemu(orin_nx_build / "bin" / "colibri", "--version")
    prof = profiles.load_profile("orin-nx")
    assert "target=orin-nx" in out
    assert f"COLIBRI_EMBED_DIM_PAD={prof.colibri.embed_pad}" in out
    assert f"COLIBRI_TOP_K={prof.colibri.top_k}" in out
    assert f"COLIBRI_STREAM_COUNT={prof.colibri.stream_count}" in out


@pytest.mark.slow
@pytest.mark.parametrize("target,glibc,sm", [("xavier-nx", (2, 31), 72), ("agx-thor", (2, 39), 110)])
def test_other_jetsons(target: str, glibc: tuple[int, int], sm: int):
    r = kb.build(profiles.load_profile(target), where="host", progress=_quiet)
    binary = r.dist_dir / "bin" / "colibri"
    assert _max_glibc(binary) <= glibc
    assert [c.sm for c in elf.find_cubins(binary.read_bytes())] == [sm]
    assert r.manifest.cuda["sms"] == [sm]
    assert r.verify_report.ok and r.verify_report.cubin_sms == (f"sm_{sm}",)
    assert f"target={target}" in _qemu(binary, "--version")


def test_host_build(host_colibri: Path):
    out = subprocess.run([str(host_colibri), "--version"], capture_output=True, text=True)
    assert out.returncode == 0 and "target=host" in out.stdout
    manifest = json.loads((host_colibri.parent.parent / "manifest.json").read_text())
    assert manifest["cuda"] is None and manifest["arch"] == "x86_64"
    assert manifest["toolchain"]["host_cc"].startswith("cc ")


# --------------------------------------------------------------------------- isolated projects


@pytest.mark.slow
def test_two_clean_builds_are_byte_identical(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             copy_project_to):
    """Different checkout paths and a cold vs warm zig cache: same bytes in dist/."""
    copy_project = copy_project_to
    trees = []
    for i, zig_cache in enumerate((tmp_path / "zig-cold", None)):
        root = copy_project(tmp_path / f"checkout-{i}" / ("nested" * i or "p"))
        monkeypatch.setenv("COLIBRI_PROJECT_ROOT", str(root))
        if zig_cache:
            monkeypatch.setenv("COLIBRI_ZIG_CACHE_DIR", str(zig_cache))
        else:
            monkeypatch.delenv("COLIBRI_ZIG_CACHE_DIR", raising=False)
        r = kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)
        assert r.kernels_compiled and r.make_ran_commands
        trees.append(_tree_bytes(r.dist_dir))
    assert trees[0].keys() == trees[1].keys()
    for rel in trees[0]:
        assert trees[0][rel] == trees[1][rel], f"{rel} differs between clean builds"
    # No absolute path of either checkout or of the toolchain cache leaks into the artifacts.
    for rel, data in trees[0].items():
        for needle in (str(tmp_path), str(paths.cache_dir())):
            assert needle.encode() not in data, (rel, needle)


@pytest.mark.slow
def test_host_clean_builds_are_byte_identical(tmp_path: Path, monkeypatch, copy_project_to):
    copy_project = copy_project_to
    trees = []
    for i in range(2):
        monkeypatch.setenv("COLIBRI_PROJECT_ROOT", str(copy_project(tmp_path / f"c{i}")))
        r = kb.build(profiles.load_profile("host"), where="host", progress=_quiet)
        trees.append(_tree_bytes(r.dist_dir))
    assert trees[0] == trees[1]


@pytest.mark.slow
def test_noop_rebuild_compiles_nothing(project_copy: Path):
    first = kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)
    assert first.kernels_compiled and first.make_ran_commands
    out_dir = paths.build_dir("orin-nx")
    before_build, before_dist = _mtimes(out_dir), _mtimes(first.dist_dir)
    second = kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)
    assert not second.kernels_compiled
    assert second.manifest.kernels == first.manifest.kernels   # kept in the kernel stamp
    assert not second.make_ran_commands
    assert "Nothing to be done for 'all'" in second.make_output
    assert _mtimes(first.dist_dir) == before_dist
    after = _mtimes(out_dir)
    changed = {k for k in after if after[k] != before_build.get(k)} - {".lock"}
    assert not changed, changed


@pytest.mark.slow
def test_changes_rebuild_only_what_depends_on_them(project_copy: Path):
    kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)
    # A kernel change: recompiled, re-embedded, relinked; C sources untouched.
    cu = project_copy / "runtime" / "kernels" / "colibri_kernels.cu"
    cu.write_text(cu.read_text()
                  + '\nextern "C" __global__ void colibri_test_extra(float *y) { y[0] = 1.0f; }\n')
    r = kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)
    assert r.kernels_compiled
    assert "-c ../build/orin-nx/embed/kernel_images.S" in r.make_output   # new image hash
    assert "-c src/" not in r.make_output and "-c tools/" not in r.make_output
    # A C source change: that object and the links, nothing else.
    tool = project_copy / "runtime" / "tools" / "main.c"
    tool.write_text(tool.read_text() + "\n/* a change */\n")
    r = kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)
    assert not r.kernels_compiled
    assert "-c tools/main.c" in r.make_output
    assert "-c src/" not in r.make_output
    # A deleted source: the archive and binary are rebuilt without it.
    extra = project_copy / "runtime" / "src" / "core" / "extra_for_test.c"
    extra.write_text("int colibri_extra_for_test(void) { return 7; }\n")
    r = kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)
    assert "-c src/core/extra_for_test.c" in r.make_output
    assert b"colibri_extra_for_test" in (r.dist_dir / "lib" / "libcolibri.a").read_bytes()
    extra.unlink()
    r = kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)
    assert r.make_ran_commands
    assert b"colibri_extra_for_test" not in (r.dist_dir / "lib" / "libcolibri.a").read_bytes()
    # A profile change: the header changes, so every C object and the kernels rebuild.
    prof = project_copy / "targets" / "orin-nx.yaml"
    prof.write_text(prof.read_text().replace("max_first_token_ms_p99: 2000",
                                             "max_first_token_ms_p99: 2001"))
    r = kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)
    assert "-c src/" in r.make_output and r.kernels_compiled


@pytest.mark.slow
def test_debug_build_is_separate(project_copy: Path):
    rel = kb.build(profiles.load_profile("host"), where="host", progress=_quiet)
    dbg = kb.build(profiles.load_profile("host"), where="host", debug=True, progress=_quiet)
    assert dbg.dist_dir == paths.dist_dir("host-debug") and rel.dist_dir == paths.dist_dir("host")
    assert "-O0 -g -DCOLIBRI_DEBUG" in dbg.make_output
    assert dbg.manifest.variant == "debug"
    sections = subprocess.run(["readelf", "-S", "-W", str(dbg.dist_dir / "bin" / "colibri")],
                              capture_output=True, text=True).stdout
    assert ".debug_info" in sections
    # The release build is untouched by the debug one: a rebuild is still a no-op.
    again = kb.build(profiles.load_profile("host"), where="host", progress=_quiet)
    assert not again.make_ran_commands


@pytest.mark.slow
def test_host_with_cuda_archs_embeds_requested_sms(project_copy: Path):
    r = kb.build(profiles.load_profile("host"), where="host", cuda_archs=["sm_90", "sm_87"],
                 progress=_quiet)
    data = (r.dist_dir / "bin" / "colibri").read_bytes()
    assert sorted(c.sm for c in elf.find_cubins(data)) == [87, 90]
    assert r.manifest.cuda == {"version": "12.6", "sms": [87, 90], "images": [
        {"kind": "cubin", "sm": 87}, {"kind": "cubin", "sm": 90}, {"kind": "ptx", "sm": 87}]}
    # Back to no CUDA: the images go away again.
    r = kb.build(profiles.load_profile("host"), where="host", progress=_quiet)
    assert elf.find_cubins((r.dist_dir / "bin" / "colibri").read_bytes()) == []


def test_unsupported_sm_is_refused(project_copy: Path):
    with pytest.raises(ToolchainError, match="CUDA 13.0 cannot compile for sm_72"):
        kb.build(profiles.load_profile("host"), where="host", cuda_archs=["sm_72"],
                 cuda_version="13.0", progress=_quiet)


def test_cuda_version_mismatch_is_refused(project_copy: Path):
    nvcc = toolchain.toolchains_dir() / "cuda-13.0" / "nvidia" / "cu13" / "bin" / "nvcc"
    toolchain.cuda_toolchain("13.0")
    with pytest.raises(ToolchainError, match=r"is CUDA 13.0, but this target needs CUDA 12.6"):
        kb.build(profiles.load_profile("orin-nx"), where="host", nvcc=str(nvcc), progress=_quiet)


def test_profile_pins_cannot_be_overridden(project_copy: Path):
    with pytest.raises(BuildError, match="pins CUDA 12.6 and sm_87"):
        kb.build(profiles.load_profile("orin-nx"), where="host", cuda_archs=["sm_90"],
                 progress=_quiet)
    with pytest.raises(BuildError, match="--cuda-version needs --cuda-archs"):
        kb.build(profiles.load_profile("host"), where="host", cuda_version="12.6", progress=_quiet)


def test_bad_target_names_are_refused(project_copy: Path):
    with pytest.raises(ProfileError, match="target name '../etc' is not valid"):
        kb.build(profiles.load_profile("../etc"), where="host")
    assert not (project_copy / "build").exists()


def test_compile_error_is_reported(project_copy: Path):
    src = project_copy / "runtime" / "src" / "core" / "broken_for_test.c"
    src.write_text("int broken(void) { return undeclared_thing; }\n")
    with pytest.raises(BuildError, match=r"(?s)make -C runtime failed.*undeclared_thing"):
        kb.build(profiles.load_profile("host"), where="host", progress=_quiet)


def test_missing_kernel_source_is_reported(project_copy: Path):
    shutil.rmtree(project_copy / "runtime" / "kernels")
    with pytest.raises(BuildError, match=r"colibri_kernels.cu does not exist.*CUDA 12.6, sm_87"):
        kb.build(profiles.load_profile("orin-nx"), where="host", progress=_quiet)


def test_verify_failure_fails_the_build(project_copy: Path):
    # A profile whose glibc floor is below what the (real) host binary needs: verify refuses.
    host = project_copy / "targets" / "host.yaml"
    host.write_text(host.read_text().replace('glibc: "2.36"', 'glibc: "2.2"'))
    from colibri_kit.verify import VerifyError

    with pytest.raises(VerifyError, match="glibc"):
        kb.build(profiles.load_profile("host"), where="host", progress=_quiet)


# --------------------------------------------------------------------------- where: host/docker


@pytest.fixture
def no_docker_engine(monkeypatch, tmp_path: Path) -> None:
    """Point the docker CLI (when installed) at a socket nothing listens on: `docker info` fails
    for real, whether or not this machine runs an engine."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-engine.sock")


def test_docker_without_engine_is_a_clear_error(no_docker_engine, monkeypatch, tmp_path: Path):
    ok, why = kb.docker_available()
    assert not ok and why
    with pytest.raises(BuildError, match=r"--in docker needs a running Docker engine.*--in host"):
        kb.build(profiles.load_profile("host"), where="docker", progress=_quiet)
    # Without the docker command at all, the reason says so.
    monkeypatch.setenv("PATH", str(tmp_path))
    assert kb.docker_available() == (False, "the docker command is not installed")
    with pytest.raises(BuildError, match="docker command is not installed"):
        kb.choose_where("docker")


def test_auto_picks_host_without_engine_and_inside_docker(no_docker_engine, monkeypatch):
    assert kb.choose_where("auto") == "host"       # `docker info` fails here (or no docker)
    assert kb.choose_where("host") == "host"
    monkeypatch.setenv("COLIBRI_IN_DOCKER", "1")   # already in the image: never nest
    assert kb.choose_where("auto") == "host"
    with pytest.raises(BuildError, match="--in must be auto, host or docker"):
        kb.choose_where("vm")


def test_docker_command_runs_the_same_build_script():
    root = paths.project_root()
    inspect, build_img, run = kb.docker_commands("orin-nx", root, debug=True,
                                                 cuda_archs=None, cuda_version=None, jobs=2)
    tag = kb.image_tag(root)
    assert inspect[-1] == tag and build_img[:4] == ["docker", "build", "-t", tag]
    assert f"{root}:/src" in run and tag in run
    inner = run[run.index(tag) + 1:]
    assert inner == ["python", "-m", "colibri_kit.build", "--target", "orin-nx", "--in", "host",
                     "--jobs", "2", "--debug"]
    # The inner command is a real entry point: run it here the same way Docker would.
    proc = subprocess.run([sys.executable, "-m", "colibri_kit.build", "--target", "host",
                           "--in", "host"], capture_output=True, text=True, cwd=root,
                          env={**os.environ, "COLIBRI_IN_DOCKER": "1"}, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "verify [  ok] run" in proc.stdout


def test_image_tag_follows_the_pins(tmp_path: Path):
    (tmp_path / "Dockerfile").write_text("FROM debian:12-slim\n")
    (tmp_path / "colibri_kit").mkdir()
    (tmp_path / "colibri_kit" / "toolchain.py").write_text("ZIG_VERSION = '1'\n")
    a = kb.image_tag(tmp_path)
    (tmp_path / "colibri_kit" / "toolchain.py").write_text("ZIG_VERSION = '2'\n")
    assert kb.image_tag(tmp_path) != a


@pytest.mark.slow
def test_invoke_build_all_summary():
    proc = subprocess.run([sys.executable, "-m", "invoke", "build", "--all", "--in", "host"],
                          capture_output=True, text=True, cwd=paths.project_root(), timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
    table = proc.stdout[proc.stdout.index("target  "):]
    for name in profiles.list_profiles():
        assert any(line.startswith(name + " ") and " ok " in line for line in table.splitlines())
    assert "sm_110" in table and "sm_72" in table and "sm_87" in table
