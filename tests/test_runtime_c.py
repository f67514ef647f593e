"""The runtime's C-level checks, built from runtime/tests/Makefile and runtime/fuzz/Makefile:
C unit tests (loader refusals, API errors, selftest), the proof that colibri_forward allocates
nothing, the same plus the CLI's forward and bad-input paths under AddressSanitizer and UBSan,
the COLIBRI_DEBUG routing dump against the NumPy reference's routing, the LINEAR_SCORE routing
build against the SOFTMAX_TOPK one, and a bounded libFuzzer run over the model loader.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from colibri_kit import paths
from colibri_kit.model.format import DType, Flag, ModelHeader
from colibri_kit.model.reference import Reference
from colibri_kit.model.tiny import write_random_model, write_tiny_model

RUNTIME = paths.project_root() / "runtime"
PROMPT = [1, 5, 9, 200, 3, 7, 11, 42, 0, 255]


def render_host_config(dest: Path, routing_mode: str | None = None) -> Path:
    """The host target's rendered colibri_config.h, optionally with another routing mode."""
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import render_config

    text = render_config(load_profile("host"))
    if routing_mode:
        text, n = re.subn(r"#define COLIBRI_ROUTING_MODE COLIBRI_ROUTING_\w+",
                          f"#define COLIBRI_ROUTING_MODE COLIBRI_ROUTING_{routing_mode}", text)
        assert n == 1
        text = re.sub(r'#define COLIBRI_ROUTING_MODE_NAME "\w+"',
                      f'#define COLIBRI_ROUTING_MODE_NAME "{routing_mode.lower()}"', text)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / "colibri_config.h").write_text(text)
    return dest


def make(target_dir: Path, out: Path, config: Path, *extra: str, goal: str = "all") -> Path:
    proc = subprocess.run(["make", "-s", "-j2", "-C", str(target_dir), f"CONFIG_DIR={config}",
                           f"OUT_DIR={out}", *extra, goal], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "warning:" not in proc.stderr, proc.stderr  # warning-free build
    return out


@pytest.fixture(scope="module")
def host_config(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return render_host_config(tmp_path_factory.mktemp("cfg-host"))


@pytest.fixture(scope="module")
def plain_build(tmp_path_factory: pytest.TempPathFactory, host_config: Path) -> Path:
    return make(RUNTIME / "tests", tmp_path_factory.mktemp("rt-plain"), host_config)


@pytest.fixture(scope="module")
def asan_build(tmp_path_factory: pytest.TempPathFactory, host_config: Path) -> Path:
    return make(RUNTIME / "tests", tmp_path_factory.mktemp("rt-asan"), host_config, "SANITIZE=1")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.colibri")


def run(*args: str | Path, env: dict[str, str] | None = None, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


def test_c_unit_tests(plain_build: Path) -> None:
    proc = run(plain_build / "bin/test_runtime")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "passed: 0 failure(s)" in proc.stdout
    assert proc.stdout.count("ok   ") >= 30


def test_forward_allocates_nothing(plain_build: Path, tiny: Path) -> None:
    for model in ([], [str(tiny)]):
        proc = run(plain_build / "bin/test_noalloc", *model)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert proc.stdout.count("allocations during forward=0") == 4  # 1, 2 threads x f32, f16 KV


@pytest.mark.slow
def test_sanitizers_unit_and_noalloc(asan_build: Path) -> None:
    env = {"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    for prog in ("test_runtime", "test_noalloc"):
        proc = run(asan_build / "bin" / prog, env=env, timeout=600)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr


@pytest.mark.slow
def test_sanitizers_cli_forward_and_bad_input(asan_build: Path, tiny: Path, tmp_path: Path) -> None:
    env = {"ASAN_OPTIONS": "detect_leaks=1", "UBSAN_OPTIONS": "print_stacktrace=1"}
    colibri = asan_build / "bin/colibri"
    ids = ",".join(map(str, PROMPT))
    proc = run(colibri, "--threads", "2", "forward", tiny, "--ids", ids, "--logits-out",
               tmp_path / "l.bin", env=env)
    assert proc.returncode == 0, proc.stderr
    got = np.fromfile(tmp_path / "l.bin", dtype="<f4").reshape(len(PROMPT), -1)
    want = Reference(tiny).forward(PROMPT)
    assert np.max(np.abs(got - want)) < 1e-5 * np.max(np.abs(want))
    proc = run(colibri, "generate", tiny, "--ids", "1,2,3", "--max-new", "5", env=env)
    assert proc.returncode == 0 and len(json.loads(proc.stdout)["new_ids"]) == 5, proc.stderr
    raw = tiny.read_bytes()
    bad = {"trunc": raw[: len(raw) - 4096], "magic": b"X" + raw[1:], "short": raw[:64],
           "offset": raw[:280] + (1 << 50).to_bytes(8, "little") + raw[288:]}
    for name, data in bad.items():
        (tmp_path / name).write_bytes(data)
        for cmd in (["info", tmp_path / name], ["forward", tmp_path / name, "--ids", "1"]):
            proc = run(colibri, *cmd, env=env)
            assert proc.returncode == 1, (name, proc.stderr)
            assert "Sanitizer" not in proc.stderr and "runtime error" not in proc.stderr
    for args in (["forward", tiny, "--ids", "256"], ["forward", tiny, "--ids", ",".join(["3"] * 129)]):
        proc = run(colibri, *args, env=env)
        assert proc.returncode == 1 and "Sanitizer" not in proc.stderr, proc.stderr
    proc = run(colibri, "selftest", env=env)
    assert proc.returncode == 0 and "Sanitizer" not in proc.stderr, proc.stdout + proc.stderr


def test_routing_dump_matches_reference(tmp_path_factory: pytest.TempPathFactory, host_config: Path,
                                        tmp_path: Path) -> None:
    """COLIBRI_DEBUG build: colibri_dump_routing lists the reference's experts and weights."""
    build = make(RUNTIME / "tests", tmp_path_factory.mktemp("rt-debug"), host_config, "DEBUG=1")
    h = ModelHeader(num_experts=8, expert_size=32, vocab_size=100, max_seq_len=32, embed_dim=40,
                    n_layers=3, n_heads=4, n_kv_heads=2, head_dim=10, top_k=3, routing=1,
                    dtype=int(DType.F32), embed_dim_pad=64, pad_multiple=64,
                    flags=int(Flag.SHARED_EXPERT), shared_expert_size=16, name="dump")
    model = write_random_model(tmp_path / "m.colibri", h, seed=3)
    ids = [5, 7, 11, 13, 17, 19]
    out = tmp_path / "routing.jsonl"
    proc = run(build / "bin/colibri", "dump-routing", model, "--ids", ",".join(map(str, ids)),
               "--out", out)
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(ids) * h.n_layers
    ref = Reference(model)
    ref.forward(ids)
    for row in rows:
        route = ref.routing[row["pos"]][row["layer"]]
        assert row["experts"] == list(route.experts)
        assert np.allclose(row["weights"], route.weights, rtol=1e-5, atol=1e-6)
        assert len(row["logits"]) == h.num_experts
    # the plain build refuses the dump with a message (exit 1), not a crash
    plain = make(RUNTIME / "tests", tmp_path / "plain", host_config)
    proc = run(plain / "bin/colibri", "dump-routing", model, "--ids", "1", "--out", out)
    assert proc.returncode == 1 and "COLIBRI_DEBUG" in proc.stderr


@pytest.mark.slow
def test_linear_score_routing_equals_softmax_topk(tmp_path_factory: pytest.TempPathFactory,
                                                  plain_build: Path, tmp_path: Path) -> None:
    """Both compile-time routing algorithms pick the same experts and agree within rounding,
    for renormalised and plain weights, and both match the reference."""
    cfg = render_host_config(tmp_path_factory.mktemp("cfg-linear"), "LINEAR_SCORE")
    linear = make(RUNTIME / "tests", tmp_path_factory.mktemp("rt-linear"), cfg)
    assert "COLIBRI_ROUTING_MODE=linear_score" in run(linear / "bin/colibri", "--version").stdout
    proc = run(linear / "bin/colibri", "selftest")
    assert proc.returncode == 0 and "routing (linear_score)" in proc.stdout, proc.stdout
    for routing in (0, 1):
        h = ModelHeader(num_experts=16, expert_size=24, vocab_size=120, max_seq_len=32, embed_dim=50,
                        n_layers=2, n_heads=4, n_kv_heads=2, head_dim=8, top_k=4, routing=routing,
                        dtype=int(DType.F32), embed_dim_pad=64, pad_multiple=64, name="lin")
        model = write_random_model(tmp_path / f"m{routing}.colibri", h, seed=11 + routing)
        ids = ",".join(str(i) for i in [3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
        outs = []
        for build in (plain_build, linear):
            out = tmp_path / f"{build.name}-{routing}.bin"
            proc = run(build / "bin/colibri", "forward", model, "--ids", ids, "--logits-out", out)
            assert proc.returncode == 0, proc.stderr
            outs.append(np.fromfile(out, dtype="<f4").reshape(10, -1))
        want = Reference(model).forward([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
        scale = np.max(np.abs(want))
        assert np.max(np.abs(outs[0] - outs[1])) < 1e-5 * scale
        assert np.max(np.abs(outs[1] - want)) < 1e-5 * scale


@pytest.mark.slow
def test_fuzz_loader_short_run(host_config: Path, tmp_path: Path) -> None:
    """20000 libFuzzer executions over the committed seed corpus: no crash, no sanitizer report."""
    proc = subprocess.run(["make", "-s", "-C", str(RUNTIME / "fuzz"), f"CONFIG_DIR={host_config}",
                           f"OUT_DIR={tmp_path}", "RUNS=20000", "run"], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Done 20000 runs" in proc.stderr
    assert not list(tmp_path.glob("crash-*"))


@pytest.mark.slow
def test_thread_sanitizer_pool(tmp_path_factory: pytest.TempPathFactory, host_config: Path,
                               tiny: Path) -> None:
    """The pool's spin-then-sleep hand-off under ThreadSanitizer: no data race reported."""
    build = make(RUNTIME / "tests", tmp_path_factory.mktemp("rt-tsan"), host_config,
                 "EXTRA_CFLAGS=-fsanitize=thread")
    for args in (["forward", tiny, "--ids", ",".join(map(str, PROMPT))],
                 ["generate", tiny, "--ids", "1,2,3", "--max-new", "12"]):
        proc = run(build / "bin/colibri", "--threads", "3", *args,
                   env={"TSAN_OPTIONS": "halt_on_error=1"})
        assert proc.returncode == 0, proc.stderr
        assert "ThreadSanitizer" not in proc.stderr


@pytest.mark.slow
def test_clang_build_warning_free(tmp_path_factory: pytest.TempPathFactory, host_config: Path) -> None:
    """The runtime builds without warnings with clang too (zig cc is clang) and passes its tests."""
    build = make(RUNTIME / "tests", tmp_path_factory.mktemp("rt-clang"), host_config, "CC=clang-14")
    proc = run(build / "bin/test_runtime")
    assert proc.returncode == 0, proc.stdout + proc.stderr


# qemu 7.2's CPU models stand in for the Jetsons' (docs/runtime.md "Kernels"): neoverse-n1 is
# Armv8.2 with dotprod and no i8mm, as Orin's Cortex-A78AE; max has i8mm (and bf16, SVE2), as
# Thor's Neoverse-V3AE; cortex-a53 has neither. Each build runs on each CPU listed, with the
# kernel level it must pick (COLIBRI_CPU_SIMD caps it): the Orin build takes SMMLA on an i8mm CPU,
# and a build for no CPU in particular ("generic": Orin's triple, -mcpu=generic) takes SDOT and
# SMMLA from the target attributes alone, plain NEON where the CPU has neither.
AARCH64_RUNS = {
    "orin-nx": [("neoverse-n1", None, "neon-dotprod"), ("max", None, "neon-i8mm"),
                ("max", "neon-dotprod", "neon-dotprod")],
    "agx-thor": [("max", None, "neon-i8mm")],
    "generic": [("cortex-a53", None, "neon"), ("neoverse-n1", None, "neon-dotprod"),
                ("max", None, "neon-i8mm")],
}


@pytest.mark.slow
@pytest.mark.parametrize("target", sorted(AARCH64_RUNS))
def test_unit_tests_aarch64_under_qemu(tmp_path_factory: pytest.TempPathFactory, host_config: Path,
                                       target: str) -> None:
    """The C unit tests, kernel bit contracts included (tiles == streams == row splits, exact
    integer dots), cross-compiled by zig for Orin's and Thor's CPUs (cortex-a78ae, neoverse-v3ae)
    and for a generic aarch64, run under qemu-aarch64 on CPUs with and without i8mm and dotprod:
    the SMMLA prefill path where the CPU has it, SDOT where not, the same exact integers."""
    from colibri_kit.profiles import load_profile
    from colibri_kit.toolchain import install_zig, zig_env

    p = load_profile("orin-nx" if target == "generic" else target)
    out = tmp_path_factory.mktemp(f"rt-{target}")
    mcpu = "generic" if target == "generic" else p.zig_mcpu
    cc = f"{install_zig()} cc -target {p.zig_triple} -mcpu={mcpu}"
    proc = subprocess.run(["make", "-s", "-C", str(RUNTIME / "tests"), f"CONFIG_DIR={host_config}",
                           f"OUT_DIR={out}", f"CC={cc}", str(out / "bin" / "test_runtime")],
                          capture_output=True, text=True, timeout=900, env={**os.environ, **zig_env()})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for cpu, cap, simd in AARCH64_RUNS[target]:
        env = {"COLIBRI_CPU_SIMD": cap} if cap else {}
        proc = run("qemu-aarch64", "-cpu", cpu, "-L", "/usr/aarch64-linux-gnu",
                   out / "bin" / "test_runtime", env=env, timeout=600)
        assert proc.returncode == 0, (cpu, proc.stdout + proc.stderr)
        assert "passed: 0 failure(s)" in proc.stdout, (cpu, proc.stdout)
        for line in (f"ok   kernels {simd} dtype 1 cols 1024",
                     f"ok   kernels {simd} int8 x int8 cols 1030: 14 tokens",
                     f"ok   kernels {simd} int8 x int8 cols 10100: 2 and 13 tokens",
                     f"ok   kernels {simd} int8 x int8 cols 22000: 2 and 13 tokens"):
            assert line in proc.stdout, (cpu, cap, line, proc.stdout)
