"""colibri_config.h rendering: values reach a real compiler, output is deterministic,
unchanged content is not rewritten, the header's static asserts catch bad hand edits."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from colibri_kit import paths
from colibri_kit.errors import ProfileError
from colibri_kit.profiles import list_profiles, load_profile
from colibri_kit.render import config_path, render_config, write_config

ROOT = paths.project_root()

PRINTER = r"""
#include <stdio.h>
#include "colibri_config.h"
int main(void) {
    printf("name=%s\n", COLIBRI_TARGET_NAME);
    printf("hash=%s\n", COLIBRI_PROFILE_HASH);
    printf("arch=%s\n", COLIBRI_TARGET_ARCH);
    printf("glibc=%s\n", COLIBRI_GLIBC_FLOOR);
    printf("cuda=%s\n", COLIBRI_CUDA_VERSION);
    printf("archs=%s\n", COLIBRI_CUDA_ARCHS);
    printf("igpu=%d\n", COLIBRI_IGPU);
    printf("embed_pad=%d\n", COLIBRI_EMBED_DIM_PAD);
    printf("streams=%d\n", COLIBRI_STREAM_COUNT);
    printf("top_k=%d\n", COLIBRI_TOP_K);
    printf("max_experts=%d\n", COLIBRI_MAX_EXPERTS);
    printf("routing=%d\n", COLIBRI_ROUTING_MODE);
    printf("softmax=%d linear=%d\n", COLIBRI_ROUTING_SOFTMAX_TOPK, COLIBRI_ROUTING_LINEAR_SCORE);
    printf("routing_name=%s\n", COLIBRI_ROUTING_MODE_NAME);
    return 0;
}
"""


def compile_and_run(include_dir: Path, tmp: Path) -> dict[str, str]:
    src = tmp / "printer.c"
    src.write_text(PRINTER)
    exe = tmp / "printer"
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{include_dir}", str(src), "-o",
                    str(exe)], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return dict(line.split("=", 1) for line in out.splitlines() if "=" in line
                and not line.startswith("softmax"))


@pytest.mark.parametrize("name", ["orin-nx", "xavier-nx", "agx-thor", "host"])
def test_rendered_macros_reach_the_compiler_with_the_profile_values(tmp_path, name):
    p = load_profile(name)
    header = write_config(p, tmp_path / "include")
    assert header == tmp_path / "include" / "colibri_config.h"
    got = compile_and_run(header.parent, tmp_path)
    assert got["name"] == p.name
    assert got["hash"] == p.hash[:16]
    assert got["arch"] == p.arch and got["glibc"] == p.glibc
    assert got["cuda"] == (p.cuda.version if p.cuda else "none")
    assert got["archs"] == (",".join(p.cuda.archs) if p.cuda else "")
    assert got["igpu"] == ("1" if p.cuda and p.cuda.igpu else "0")
    assert int(got["embed_pad"]) == p.colibri.embed_pad
    assert int(got["streams"]) == p.colibri.stream_count
    assert int(got["top_k"]) == p.colibri.top_k
    assert int(got["max_experts"]) == p.colibri.max_experts
    assert got["routing"] == {"softmax_topk": "1", "linear_score": "2"}[p.colibri.routing_mode]
    assert got["routing_name"] == p.colibri.routing_mode


def test_linear_score_routing_selects_the_linear_macro(tmp_path):
    shutil.copytree(ROOT / "targets", tmp_path / "targets")
    path = tmp_path / "targets" / "orin-nx.yaml"
    path.write_text(path.read_text() + "colibri: {routing_mode: linear_score, top_k: 2}\n")
    p = load_profile("orin-nx", tmp_path / "targets")
    text = render_config(p)
    assert "#define COLIBRI_ROUTING_MODE COLIBRI_ROUTING_LINEAR_SCORE\n" in text
    assert "#define COLIBRI_TOP_K 2\n" in text
    got = compile_and_run(write_config(p, tmp_path / "inc").parent, tmp_path)
    assert got["routing"] == "2" and got["top_k"] == "2"


def test_render_is_deterministic_and_location_independent(tmp_path):
    """Same profile -> same bytes, wherever the checkout is; no timestamps, no absolute paths."""
    copy_targets = tmp_path / "checkout2" / "targets"
    shutil.copytree(ROOT / "targets", copy_targets)
    for name in list_profiles():
        a = render_config(load_profile(name))
        b = render_config(load_profile(name))
        c = render_config(load_profile(name, copy_targets))
        assert a == b == c
        assert str(ROOT) not in a and str(tmp_path) not in a
        assert not re.search(r"\b20\d\d-\d\d-\d\d\b|\d\d:\d\d:\d\d", a)
        assert a.endswith("#endif /* COLIBRI_CONFIG_H */\n")


def test_every_macro_of_the_contract_is_defined_exactly_once():
    text = render_config(load_profile("orin-nx"))
    for macro in ("COLIBRI_EMBED_DIM_PAD", "COLIBRI_STREAM_COUNT", "COLIBRI_ROUTING_MODE",
                  "COLIBRI_ROUTING_SOFTMAX_TOPK", "COLIBRI_ROUTING_LINEAR_SCORE",
                  "COLIBRI_TOP_K", "COLIBRI_MAX_EXPERTS", "COLIBRI_TARGET_NAME",
                  "COLIBRI_PROFILE_HASH", "COLIBRI_TARGET_ARCH", "COLIBRI_CUDA_VERSION",
                  "COLIBRI_CUDA_ARCHS", "COLIBRI_IGPU", "COLIBRI_GLIBC_FLOOR"):
        assert len(re.findall(rf"^#define {macro} ", text, re.M)) == 1, macro
    assert text.count("#ifndef COLIBRI_CONFIG_H") == 1


def test_write_config_rewrites_only_when_content_changes(tmp_path):
    p = load_profile("orin-nx")
    header = write_config(p, tmp_path)
    old = 1_000_000_000
    os.utime(header, (old, old))
    assert write_config(p, tmp_path) == header
    assert header.stat().st_mtime == old                      # untouched: make sees no change
    header.write_text("/* stale */\n")
    os.utime(header, (old, old))
    write_config(p, tmp_path)
    assert header.read_text() == render_config(p)             # stale content replaced
    assert header.stat().st_mtime != old
    assert [f.name for f in tmp_path.iterdir()] == ["colibri_config.h"]   # no temp files left


def test_default_location_is_build_target_include():
    p = load_profile("host")
    assert config_path(p) == ROOT / "build" / "host" / "include" / "colibri_config.h"


@pytest.mark.parametrize("edit,message", [
    (("#define COLIBRI_EMBED_DIM_PAD 64", "#define COLIBRI_EMBED_DIM_PAD 40"),
     "COLIBRI_EMBED_DIM_PAD must be a positive multiple of 16"),
    (("#define COLIBRI_TOP_K 8", "#define COLIBRI_TOP_K 17"),
     "COLIBRI_TOP_K must be in 1..16 and <= COLIBRI_MAX_EXPERTS"),
    (("#define COLIBRI_MAX_EXPERTS 256", "#define COLIBRI_MAX_EXPERTS 4"),
     "COLIBRI_TOP_K must be in 1..16 and <= COLIBRI_MAX_EXPERTS"),
    (("#define COLIBRI_MAX_EXPERTS 256", "#define COLIBRI_MAX_EXPERTS 48"),
     "COLIBRI_MAX_EXPERTS must be a power of two"),
    (("#define COLIBRI_STREAM_COUNT 2", "#define COLIBRI_STREAM_COUNT 3"),
     "COLIBRI_STREAM_COUNT must be 1 or 2"),
    (("#define COLIBRI_ROUTING_MODE COLIBRI_ROUTING_SOFTMAX_TOPK",
      "#define COLIBRI_ROUTING_MODE 7"), "COLIBRI_ROUTING_MODE must be one of"),
])
def test_static_asserts_reject_a_hand_edited_header(tmp_path, edit, message):
    text = render_config(load_profile("orin-nx"))
    assert edit[0] in text
    (tmp_path / "colibri_config.h").write_text(text.replace(edit[0], edit[1]))
    src = tmp_path / "use.c"
    src.write_text('#include "colibri_config.h"\nint main(void) { return COLIBRI_TOP_K; }\n')
    proc = subprocess.run(["cc", "-std=c11", f"-I{tmp_path}", "-c", str(src), "-o",
                           str(tmp_path / "use.o")], capture_output=True, text=True)
    assert proc.returncode != 0
    assert message in proc.stderr


def test_unedited_header_compiles_as_c_and_as_cxx(tmp_path):
    """Kernels include it through NVRTC, i.e. as C++: static_assert must work there too."""
    write_config(load_profile("agx-thor"), tmp_path)
    src_c = tmp_path / "a.c"
    src_c.write_text('#include "colibri_config.h"\nint f(void) { return COLIBRI_TOP_K; }\n')
    subprocess.run(["cc", "-std=c11", "-Wall", "-Werror", f"-I{tmp_path}", "-c", str(src_c),
                    "-o", str(tmp_path / "a.o")], check=True)
    src_cc = tmp_path / "a.cc"
    src_cc.write_text(src_c.read_text())
    # clang-14 (installed by scripts/bootstrap.sh); the header includes nothing, so no C++
    # standard library is needed
    proc = subprocess.run(["clang-14", "-x", "c++", "-std=c++17", "-Wall", "-Werror",
                           "-fsyntax-only", f"-I{tmp_path}", str(src_cc)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_template_typo_is_an_error_not_an_empty_string(tmp_path):
    (tmp_path / "colibri_config.h.j2").write_text("#define X {{ p.colibri.no_such_field }}\n")
    with pytest.raises(ProfileError, match="no_such_field"):
        render_config(load_profile("host"), tmp_path)
    with pytest.raises(ProfileError, match="template not found"):
        render_config(load_profile("host"), tmp_path / "missing")


def test_invoke_render_writes_the_header(tmp_path):
    shutil.copytree(ROOT / "targets", tmp_path / "targets")
    shutil.copytree(ROOT / "templates", tmp_path / "templates")
    env = {**os.environ, "COLIBRI_PROJECT_ROOT": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), "render", "--target",
                           "xavier-nx"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "rendered build/xavier-nx/include/colibri_config.h"
    out = tmp_path / "build" / "xavier-nx" / "include" / "colibri_config.h"
    assert out.read_text() == render_config(load_profile("xavier-nx", tmp_path / "targets"))
