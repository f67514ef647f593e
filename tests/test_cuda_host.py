"""CUDA backend checks that need no GPU (issue 4): real NVRTC/ptxas for every pinned toolchain,
the backend's host C (image choice, launch geometry, arena plan, driver loading and its failure
reasons, launch-sequence determinism), and the CPU fallback of the real binary.

What a GPU machine adds is in tests/gpu/test_kernels_gpu.py (`invoke gpucheck`).
"""

from __future__ import annotations

import ctypes.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from colibri_kit import elf, paths, profiles, render, toolchain

ROOT = paths.project_root()
KERNELS = ROOT / "runtime" / "kernels" / "colibri_kernels.cu"
BACKEND = ROOT / "runtime" / "src" / "cuda" / "cuda_backend.c"
GPU_TESTS = ROOT / "tests" / "gpu"

# (profile, CUDA version, SMs): every Jetson class plus the host with a datacenter GPU (sm_90)
TOOLCHAIN_CASES = [
    ("xavier-nx", "11.8", [72]),
    ("orin-nx", "12.6", [87]),
    ("agx-thor", "13.0", [110]),
    ("host", "12.6", [90]),
]


def backend_kernel_names() -> list[str]:
    """The kernel names cuda_backend.c looks up with cuModuleGetFunction."""
    text = BACKEND.read_text()
    block = re.search(r"cb_kernel_names\[CB_F_COUNT\] = \{(.*?)\};", text, re.S)
    assert block, "cb_kernel_names table not found in cuda_backend.c"
    names = re.findall(r'"(cb_\w+)"', block.group(1))
    assert len(names) == 13
    # gpt-oss's kernels (#23): a table of their own, required like these
    oss = re.search(r"cb_oss_names\[CB_O_COUNT\] = \{(.*?)\};", text, re.S)
    assert oss, "cb_oss_names table not found in cuda_backend.c"
    assert re.findall(r'"(cb_\w+)"', oss.group(1)) == ["cb_oss_expert_up", "cb_oss_expert_down",
                                                       "cb_oss_attention"]
    return names + re.findall(r'"(cb_\w+)"', oss.group(1))


def backend_optional_kernel_names() -> list[str]:
    """The tensor-core kernels cuda_backend.c looks up as optional (cb_tc_names): present exactly
    in the images of SMs >= 80."""
    block = re.search(r"cb_tc_names\[CB_T_COUNT\] = \{(.*?)\};", BACKEND.read_text(), re.S)
    assert block, "cb_tc_names table not found in cuda_backend.c"
    names = re.findall(r'"(cb_\w+)"', block.group(1))
    assert names == ["cb_expert_up_mma", "cb_expert_down_mma", "cb_linear_mma"]
    return names


def rendered_config(target: str, dest: Path) -> Path:
    """colibri_config.h of `target`, rendered by the kit into dest/<target>/."""
    profile = profiles.load_profile(target)
    return render.write_config(profile, dest / target).parent


# ---------------------------------------------------------------- kernels: real compilers


@pytest.mark.slow
@pytest.mark.parametrize("target,version,sms", TOOLCHAIN_CASES,
                         ids=[f"{t}-cuda{v}" for t, v, _ in TOOLCHAIN_CASES])
def test_kernels_compile_warning_free(tmp_path: Path, target: str, version: str, sms: list[int]):
    """NVRTC -> PTX -> ptxas cubin with the target's pinned CUDA; any warning fails the build."""
    tc = toolchain.cuda_toolchain(version)
    include = rendered_config(target, tmp_path / "inc")
    images = toolchain.compile_kernels(tc, KERNELS, [include], sms, tmp_path / "out")
    assert [(i.kind, i.sm) for i in images] == [*[("cubin", s) for s in sms], ("ptx", sms[0])]
    ptx = images[-1].path.read_text()
    entries = set(re.findall(r"\.entry\s+(\w+)\(", ptx))
    assert set(backend_kernel_names()) <= entries, entries
    for img in images[:-1]:
        data = img.path.read_bytes()
        assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == 190
        for name in backend_kernel_names():
            assert name.encode() + b"\0" in data, f"{name} missing from sm_{img.sm} cubin"
    # The compile's ptxas -v report: no kernel spills registers to local memory on any SM (a
    # spill would be a silent bandwidth loss in the decode GEMV), and every backend kernel is in
    # it with the register count its cubin carries (EIATTR_REGCOUNT, read apart from ptxas).
    for img in images[:-1]:
        assert img.resources and not [f.name for f in img.resources if f.spills], img.resources
        regs = elf.cubin_register_counts(img.path.read_bytes())
        kernels = {f.name: f.registers for f in img.resources if f.entry}
        assert set(backend_kernel_names()) <= set(kernels)
        assert {n: regs[n] for n in kernels} == kernels
    # the tensor-core kernels: in the sm_80+ cubins and PTX (compiled, no spills: checked above),
    # absent from sm_72's, where the backend keeps the SIMT kernels
    tc = set(backend_optional_kernel_names())
    for img in images:
        data = img.path.read_bytes()
        have = {n for n in tc if n.encode() + (b"\0" if img.kind == "cubin" else b"(") in data}
        assert have == (tc if img.sm >= 80 else set()), (img.kind, img.sm, have)
        assert (b"mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in data) == (
            img.kind == "ptx" and img.sm >= 80)


@pytest.mark.slow
def test_tensor_core_kernels_get_their_own_ptx(tmp_path: Path):
    """A plan spanning sm_72 and sm_80+ (host --cuda-archs sm_72,sm_87): PTX compute_72 (every SM
    JITs it; no tensor-core kernels) and compute_87 (__CUDA_ARCH__ 870: the mma kernels); the
    sm_87 cubin is made from the latter, so it holds them and the sm_72 cubin does not."""
    tc = toolchain.cuda_toolchain("12.6")
    include = rendered_config("host", tmp_path / "inc")
    images = toolchain.compile_kernels(tc, KERNELS, [include], [87, 72], tmp_path / "out")
    assert [(i.kind, i.sm) for i in images] == [("cubin", 72), ("cubin", 87), ("ptx", 72),
                                                ("ptx", 87)]
    names = backend_optional_kernel_names()
    for img in images:
        data = img.path.read_bytes()
        assert all((n.encode() in data) == (img.sm == 87) for n in names), (img.kind, img.sm)
        if img.kind == "cubin":
            kernels = {f.name for f in img.resources if f.entry and not f.spills}
            assert set(backend_kernel_names()) <= kernels
            assert set(names) <= kernels if img.sm == 87 else not set(names) & kernels
    assert toolchain.ptx_sms([72, 87, 90]) == [72, 87] and toolchain.ptx_sms([87, 90]) == [87]
    assert toolchain.ptx_sms([72]) == [72] and toolchain.ptx_for(90, [72, 87]) == 87


@pytest.mark.slow
def test_kernels_compile_in_linear_score_mode(tmp_path: Path):
    """The router kernel follows COLIBRI_ROUTING_MODE like route.c: both modes must compile."""
    include = rendered_config("orin-nx", tmp_path / "inc")
    header = include / "colibri_config.h"
    text = header.read_text()
    assert "COLIBRI_ROUTING_MODE COLIBRI_ROUTING_SOFTMAX_TOPK" in text
    header.write_text(text.replace("COLIBRI_ROUTING_MODE COLIBRI_ROUTING_SOFTMAX_TOPK",
                                   "COLIBRI_ROUTING_MODE COLIBRI_ROUTING_LINEAR_SCORE"))
    tc = toolchain.cuda_toolchain("12.6")
    images = toolchain.compile_kernels(tc, KERNELS, [include], [87], tmp_path / "out")
    assert images[0].kind == "cubin"


def test_kernel_source_uses_no_atomics_and_no_headers():
    """Determinism and NVRTC portability by construction: no atomics, only colibri_config.h."""
    src = KERNELS.read_text()
    code = re.sub(r"/\*.*?\*/", "", src, flags=re.S)
    assert not re.search(r"\batomic\w*\s*\(", code)
    assert re.findall(r'#include\s+[<"]([^>"]+)', code) == ["colibri_config.h", "colibri_abi.h"]
    abi = (KERNELS.parent / "colibri_abi.h").read_text()
    assert "#include" not in re.sub(r"/\*.*?\*/", "", abi, flags=re.S)


def test_abi_header_dtype_codes_match_the_python_format():
    """The C dtype codes (runtime/kernels/colibri_abi.h, used by the loader, CPU kernels, CUDA
    backend, kernels and CLI) are colibri_kit.model.format.DType's, names included."""
    from colibri_kit.model.format import DType

    abi = (KERNELS.parent / "colibri_abi.h").read_text()
    codes = {m[0]: int(m[1]) for m in re.findall(r"#define COLIBRI_DT_([A-Z0-9]+) (\d+)", abi)}
    count = codes.pop("COUNT")
    assert codes == {d.name: int(d) for d in DType} and count == len(DType)
    names = re.search(r"#define COLIBRI_DT_NAMES \{(.*)\}", abi).group(1)
    assert re.findall(r'"(\w+)"', names) == [d.name.lower() for d in DType]


@pytest.mark.slow
@pytest.mark.parametrize("target", ["xavier-nx", "agx-thor"])
def test_backend_c_cross_compiles_warning_free(tmp_path: Path, target: str):
    """cuda_backend.c (no CUDA headers: cuda_driver.h) with the target's pinned zig, -Werror."""
    profile = profiles.load_profile(target)
    tc = toolchain.host_toolchain(profile)
    include = rendered_config(target, tmp_path / "inc")
    proc = subprocess.run([*tc.cc, *tc.arch_cflags, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror",
                           "-Wno-unused-parameter", "-D_GNU_SOURCE",
                           f"-I{ROOT / 'runtime' / 'include'}", f"-I{ROOT / 'runtime' / 'src'}", f"-I{include}", "-c", str(BACKEND),
                           "-o", str(tmp_path / "cuda_backend.o")],
                          capture_output=True, text=True, env={**os.environ, **toolchain.zig_env()})
    assert proc.returncode == 0 and "warning" not in proc.stderr, proc.stderr


# ---------------------------------------------------------------- host C unit tests


@pytest.fixture(scope="module")
def host_unit(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/gpu/host_unit.c + cuda_backend.c, with ASan/UBSan, against the host's config."""
    out = tmp_path_factory.mktemp("cuda_host")
    include = rendered_config("host", out / "inc")
    exe = out / "host_unit"
    cc = os.environ.get("CC", "cc")
    subprocess.run([cc, "-std=c11", "-O1", "-g", "-Wall", "-Wextra", "-Werror",
                    "-Wno-unused-parameter", "-D_GNU_SOURCE", "-fsanitize=address,undefined",
                    "-fno-sanitize-recover=undefined",
                    f"-I{ROOT / 'runtime' / 'include'}", f"-I{ROOT / 'runtime' / 'src'}",
                    f"-I{include}", str(GPU_TESTS / "host_unit.c"), str(BACKEND), "-ldl", "-lm",
                    "-o", str(exe)], check=True)
    return exe


@pytest.fixture(scope="module")
def stub_driver(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Stand-in libcuda.so.1 builds (tests/gpu/stub_libcuda.c) for failure paths and launch logs."""
    out = tmp_path_factory.mktemp("stub_cuda")
    cc = os.environ.get("CC", "cc")
    libs = {}
    for name, extra in (("full", []), ("nolaunch", ["-DSTUB_OMIT_LAUNCH"]),
                        ("nograph", ["-DSTUB_OMIT_GRAPH"])):
        lib = out / f"libcuda_{name}.so"
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-Wall", "-Wextra", "-Werror", *extra,
                        str(GPU_TESTS / "stub_libcuda.c"), "-o", str(lib)], check=True)
        libs[name] = lib
    return libs


def run_unit(exe: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("STUB_", "COLIBRI_LIBCUDA", "COLIBRI_CUDA_"))}
    full["ASAN_OPTIONS"] = "detect_leaks=1"
    full.update(env or {})
    return subprocess.run([str(exe), *args], capture_output=True, text=True, env=full, timeout=60)


@pytest.mark.parametrize("which", ["pick", "launch", "plan"])
def test_host_unit(host_unit: Path, which: str):
    proc = run_unit(host_unit, which)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stdout + proc.stderr
    assert "FAIL" not in proc.stdout


@pytest.mark.parametrize("theta,dh,positions", [(10000.0, 64, 300), (1e6, 10, 50), (500000.0, 128, 4)])
def test_rope_table_is_the_references_angles(host_unit: Path, theta: float, dh: int, positions: int):
    """The host-computed RoPE table cb_rope reads (colibri_cuda_rope_table) holds the reference's
    cos/sin bit for bit (kernel_reference.rope_cos_sin: f32 angle, double cos/sin)."""
    sys.path.insert(0, str(GPU_TESTS))
    try:
        from kernel_reference import rope_cos_sin
    finally:
        sys.path.remove(str(GPU_TESTS))
    proc = run_unit(host_unit, "rope", repr(theta), str(dh), str(positions))
    assert proc.returncode == 0, proc.stderr
    bits = np.array([[int(v, 16) for v in ln.split()] for ln in proc.stdout.splitlines()],
                    np.uint32)
    got = bits.view(np.float32).reshape(positions, dh // 2, 2)
    c, s = rope_cos_sin(np.arange(positions), dh, theta)
    np.testing.assert_array_equal(got[..., 0], c)
    np.testing.assert_array_equal(got[..., 1], s)


def test_open_without_driver_gives_the_reason(host_unit: Path):
    """This machine has no NVIDIA driver: open fails cleanly with the one-line reason."""
    env = {}
    if ctypes.util.find_library("cuda"):  # a GPU machine: point at a library that is not there
        env["COLIBRI_LIBCUDA"] = "libcuda.so.1-absent"
    proc = run_unit(host_unit, "open", "1", "1", env=env)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    name = env.get("COLIBRI_LIBCUDA", "libcuda.so.1")
    assert f"why: {name} not found (no NVIDIA driver)" in proc.stdout


@pytest.mark.parametrize("env,reason", [
    ({"STUB_CUINIT_RC": "100"}, "cuInit failed: no CUDA-capable device is detected (CUresult 100)"),
    ({"STUB_SM": "61"}, "no kernel image for sm_61 in this binary (embedded: cubin sm_87, "
                        "cubin sm_72, ptx compute_72)"),
    ({"STUB_LOAD_RC": "218"}, "loading the cubin sm_87 kernels on driver 12060 failed"),
    ({"STUB_SM": "90", "STUB_LOAD_RC": "218"}, "loading the ptx compute_72 kernels on driver"),
], ids=["cuinit", "no-image", "cubin-load", "ptx-jit"])
def test_driver_failures_give_one_line_reasons(host_unit: Path, stub_driver, env, reason):
    proc = run_unit(host_unit, "open", "1", "1",
                    env={"COLIBRI_LIBCUDA": str(stub_driver["full"]), **env})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("why: ")]
    assert len(line) == 1 and reason in line[0], proc.stdout


def test_driver_missing_an_entry_point(host_unit: Path, stub_driver):
    lib = stub_driver["nolaunch"]
    proc = run_unit(host_unit, "open", "1", "1", env={"COLIBRI_LIBCUDA": str(lib)})
    assert proc.returncode == 3
    assert f"why: {lib} lacks cuLaunchKernel" in proc.stdout


def launch_log(host_unit: Path, lib: Path, tmp: Path, streams: int, tag: str,
               **env: str) -> tuple[str, list[str]]:
    log = tmp / f"{tag}.log"
    proc = run_unit(host_unit, "open", str(streams), "40", "1",
                    env={"COLIBRI_LIBCUDA": str(lib), "STUB_LOG": str(log), **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout, log.read_text().splitlines()


def test_launch_sequence_is_deterministic_and_stream_independent(host_unit, stub_driver,
                                                                 tmp_path: Path):
    """Same kernels, same grids, same order with 1 or 2 streams and run to run; with 2 streams
    only the shared expert moves to stream 1, fenced by events on both sides."""
    lib = stub_driver["full"]
    # passes of 32 (COLIBRI_CUDA_CHUNK; the plan's own chunk covers the fake model's 64 positions)
    out1, one = launch_log(host_unit, lib, tmp_path, 1, "one", COLIBRI_CUDA_CHUNK="32")
    _, one_again = launch_log(host_unit, lib, tmp_path, 1, "again", COLIBRI_CUDA_CHUNK="32")
    out2, two = launch_log(host_unit, lib, tmp_path, 2, "two", COLIBRI_CUDA_CHUNK="32")
    assert one == one_again
    assert "image=cubin" in out1 and "weights=copied" in out1 and "sm=87" in out1

    def launches(lines: list[str]) -> list[str]:
        return [re.sub(r" stream \d+$", "", ln) for ln in lines if ln.startswith("launch ")]

    assert launches(one) == launches(two)
    assert all(ln.endswith("stream 0") for ln in one if ln.startswith("launch "))
    # 40 tokens = chunks of 32 + 8; 2 layers; embed + per layer 15 launches + final 2 per chunk
    # (8 experts: the FFN norm, router and top-k are one cb_ffn_route launch; prefill: the tiled
    # attention kernel, no split-KV partials to merge)
    names = [ln.split()[1] for ln in one if ln.startswith("launch ")]
    assert names.count("cb_embed") == 2 and names.count("cb_moe_combine") == 4
    assert names.count("cb_ffn_route") == 4 and names.count("cb_dispatch") == 4
    assert names.count("cb_router_topk") == 0 and len(names) == 2 * (1 + 2 * 15 + 2)
    # stream 1 work happens between "wait stream 1" and "record ... stream 1"
    on1 = [i for i, ln in enumerate(two) if ln.startswith("launch ") and ln.endswith("stream 1")]
    assert len(on1) == 3 * 4  # shared up, shared down, shared gate; per layer per chunk
    for i in on1:
        before = [ln for ln in two[:i] if ln.startswith(("wait stream 1", "record event 1"))]
        assert before and before[-1].startswith("wait stream 1")
    combines = [i for i, ln in enumerate(two) if ln.startswith("launch cb_moe_combine")]
    for i in combines:
        assert two[i - 1].startswith("wait stream 0 event 1")


def test_decode_launches_only_the_routed_experts(host_unit, stub_driver, tmp_path: Path):
    """One token (decode): the grouped expert kernels get min(E, n*k) = k rows of blocks, one per
    routed expert from cb_dispatch's active list, none for the E - k unselected experts; the
    shared expert keeps its single group. Prefill (40 tokens, 8 experts) gets min(E, n*k) = E."""
    lib = stub_driver["full"]
    log = tmp_path / "decode.log"
    proc = run_unit(host_unit, "open", "1", "1", "1",
                    env={"COLIBRI_LIBCUDA": str(lib), "STUB_LOG": str(log)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # the decode step is captured into the graph: its launches are the "capture" lines
    grids = [ln.split() for ln in log.read_text().splitlines()
             if ln.startswith(("capture cb_expert_up", "capture cb_expert_down"))]
    k, E, layers = 2, 8, 2  # host_unit.c's fake model: top-2 of 8 experts, shared expert, 2 layers
    routed = [g for g in grids if int(g[4]) != 1]
    assert len(grids) == 2 * 2 * layers and len(routed) == 2 * layers
    assert all(int(g[4]) == k for g in routed), routed
    _, lines = launch_log(host_unit, lib, tmp_path, 1, "prefill")
    ys = {int(ln.split()[4]) for ln in lines if ln.startswith("launch cb_expert_up")}
    assert ys == {1, E}


def _decode_log(host_unit: Path, lib: Path, tmp: Path, tag: str, prompt: int,
                steps: int, **env: str) -> list[str]:
    """Stand-in driver log of a prompt of `prompt` tokens then `steps` one-token decode steps
    (host_unit.c's fake model, 1 stream)."""
    log = tmp / f"{tag}.log"
    proc = run_unit(host_unit, "open", "1", str(prompt), "1", str(steps),
                    env={"COLIBRI_LIBCUDA": str(lib), "STUB_LOG": str(log), **env})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return log.read_text().splitlines()


def test_launches_per_decoded_token(host_unit, stub_driver, tmp_path: Path):
    """Kernel launches for one decoded token, kernel by kernel, for host_unit.c's fake model:
    2 layers with q/k bias, per-head q/k norm and a gated shared expert, short context (one KV
    range: no merge). Per layer: attention norm, Q/K/V, q/k norm + RoPE + KV write (one launch),
    attention, WO, FFN norm + router + top-k (one cb_ffn_route: 8 experts), shared up/down + gate,
    dispatch, routed up/down, combine = 15; plus the embedding, output norm and LM head. A plain
    Mixtral-like layer is the same less the shared expert: 12 (8 layers: 99 a token). With the
    fusion off (COLIBRI_CUDA_FUSE_ROUTE=0) the FFN norm, router linear and top-k are 3 launches
    again: 17 a layer.

    A driver without CUDA graphs (stand-in built -DSTUB_OMIT_GRAPH) gets each of them as a host
    call; with graphs they are captured once, on the first decode step, and every decode step
    (the first included) is then ONE host launch, cuGraphLaunch, with no kernel launch after the
    capture. The prompt keeps its plain launches either way."""
    steps, layers = 5, 2
    per_layer = {"cb_rmsnorm": 1, "cb_linear": 3 + 1 + 1, "cb_qk_rope_kv": 1, "cb_attention": 1,
                 "cb_ffn_route": 1, "cb_dispatch": 1, "cb_expert_up": 2, "cb_expert_down": 2,
                 "cb_moe_combine": 1}
    want = {k: v * layers for k, v in per_layer.items()}
    want["cb_embed"] = 1
    want["cb_rmsnorm"] += 1  # output norm
    want["cb_linear"] += 1   # LM head

    split = _decode_log(host_unit, stub_driver["nograph"], tmp_path, "split", 1, 0,
                        COLIBRI_CUDA_FUSE_ROUTE="0")
    names = [ln.split()[1] for ln in split if ln.startswith("launch ")]
    unfused = {**want, "cb_rmsnorm": want["cb_rmsnorm"] + layers,
               "cb_linear": want["cb_linear"] + layers, "cb_router_topk": layers}
    del unfused["cb_ffn_route"]
    assert {k: names.count(k) for k in set(names)} == unfused
    assert len(names) == 3 + 17 * layers

    plain = _decode_log(host_unit, stub_driver["nograph"], tmp_path, "plain", 1, 0)
    names = [ln.split()[1] for ln in plain if ln.startswith("launch ")]
    assert {k: names.count(k) for k in set(names)} == want
    assert len(names) == 3 + 15 * layers
    assert not [ln for ln in plain if ln.startswith(("capture ", "graph ", "begin capture"))]
    plain_steps = _decode_log(host_unit, stub_driver["nograph"], tmp_path, "plain5", 3, steps)
    assert sum(ln.startswith("launch ") for ln in plain_steps) == (3 + 15 * layers) * (1 + steps)

    lines = _decode_log(host_unit, stub_driver["full"], tmp_path, "graph", 3, steps)
    begin = lines.index("begin capture stream 0 mode 1")  # CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
    end = next(i for i, ln in enumerate(lines) if ln.startswith("end capture"))
    captured = [ln.split()[1] for ln in lines[begin:end] if ln.startswith("capture ")]
    assert {k: captured.count(k) for k in set(captured)} == want
    assert lines[end] == f"end capture stream 0 nodes {3 + 15 * layers} rc 0"
    after = lines[end + 1:]
    assert [ln for ln in after if ln.startswith(("launch ", "capture "))] == []
    assert [ln for ln in after if ln.startswith("graph launch")] == \
        [f"graph launch stream 0 nodes {3 + 15 * layers}"] * steps
    # the 3-token prompt before it: plain launches, the same as without graphs
    assert [ln for ln in lines[:begin] if ln.startswith("launch ")] == \
        [ln for ln in plain_steps if ln.startswith("launch ")][:3 + 15 * layers]


def test_decode_graph_captures_the_two_stream_fork_and_join(host_unit, stub_driver,
                                                           tmp_path: Path):
    """With 2 streams the shared expert's kernels are captured on stream 1, which joins the
    capture by waiting on stream 0's event and is joined back before the combine (the stand-in
    refuses to end a capture with an unjoined stream: CUDA_ERROR_STREAM_CAPTURE_UNJOINED); the
    graph holds the same kernels with the same grids as the 1-stream one."""
    def run(streams: int, tag: str) -> list[str]:
        log = tmp_path / f"{tag}.log"
        proc = run_unit(host_unit, "open", str(streams), "1", "1", "2",
                        env={"COLIBRI_LIBCUDA": str(stub_driver["full"]), "STUB_LOG": str(log)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return log.read_text().splitlines()

    one, two = run(1, "g1"), run(2, "g2")
    strip = [re.sub(r" stream \d+$", "", ln) for ln in one if ln.startswith("capture ")]
    assert strip == [re.sub(r" stream \d+$", "", ln) for ln in two if ln.startswith("capture ")]
    on1 = [i for i, ln in enumerate(two) if ln.startswith("capture ") and ln.endswith("stream 1")]
    assert len(on1) == 3 * 2  # shared up, down, gate per layer
    for i in on1:
        before = [ln for ln in two[:i] if ln.startswith(("wait stream 1", "record event 1"))]
        assert before and before[-1].startswith("wait stream 1")
    assert any(ln.startswith("end capture") and ln.endswith("rc 0") for ln in two)
    assert sum(ln.startswith("graph launch") for ln in two) == 3  # 1-token prompt + 2 steps


def test_weights_copied_by_default_and_mapped_on_request(host_unit, stub_driver, tmp_path: Path):
    """The device copy is the default on every GPU, integrated too (until gpu-check has measured
    the mapped path on a Jetson); COLIBRI_CUDA_WEIGHTS=map on an integrated GPU registers the file
    read-only + device-mapped and the arena holds no copy; a discrete GPU copies even then; any
    other value is refused with the reason."""
    lib = stub_driver["full"]
    out_d, disc = launch_log(host_unit, lib, tmp_path, 1, "discrete")
    out_i, integ = launch_log(host_unit, lib, tmp_path, 1, "integrated", STUB_INTEGRATED="1")
    assert "weights=copied" in out_i and "integrated=1" in out_i
    assert not any(ln.startswith("register ") for ln in disc + integ)
    allocs_d = [int(ln.split()[1]) for ln in disc if ln.startswith("alloc ")]
    assert [int(ln.split()[1]) for ln in integ if ln.startswith("alloc ")] == allocs_d
    out_m, mapped = launch_log(host_unit, lib, tmp_path, 1, "mapped", STUB_INTEGRATED="1",
                               COLIBRI_CUDA_WEIGHTS="map")
    assert "weights=mapped" in out_m
    reg = [ln for ln in mapped if ln.startswith("register ")]
    assert len(reg) == 1 and reg[0].endswith("flags 10")  # DEVICEMAP | READ_ONLY
    allocs_m = [int(ln.split()[1]) for ln in mapped if ln.startswith("alloc ")]
    weights = int(reg[0].split()[1])
    # copied: the model's weights allocation, then the context's arena; mapped: the same arena
    # only (the copy is what the mapping saves)
    assert len(allocs_d) == 2 and allocs_m == allocs_d[1:], (allocs_d, allocs_m)
    assert weights - 4096 <= allocs_d[0] <= weights
    assert not any(ln.startswith("htod async") for ln in _opening(mapped))  # nothing uploaded
    out_x, discrete_map = launch_log(host_unit, lib, tmp_path, 1, "discrete_map",
                                     COLIBRI_CUDA_WEIGHTS="map")
    assert "weights=copied" in out_x and not any(ln.startswith("register ") for ln in discrete_map)
    proc = run_unit(host_unit, "open", "1", "4", env={"COLIBRI_LIBCUDA": str(lib),
                                                      "COLIBRI_CUDA_WEIGHTS": "mapped"})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "why: COLIBRI_CUDA_WEIGHTS must be copy or map, got 'mapped'" in proc.stdout


def _opening(lines: list[str]) -> list[str]:
    """The stand-in log of colibri_cuda_open: up to its last call, the logits buffer's allocation
    (the forward's uploads come after it)."""
    first = next(i for i, ln in enumerate(lines) if ln.startswith("launch "))
    return lines[:max(i for i, ln in enumerate(lines[:first]) if ln.startswith("allochost"))]


def _weights_bytes(host_unit: Path, lib: Path, tmp: Path) -> int:
    """host_unit.c's model: its data section, as the mapped path registers it (whole pages)."""
    _, mapped = launch_log(host_unit, lib, tmp, 1, "size", STUB_INTEGRATED="1",
                           COLIBRI_CUDA_WEIGHTS="map")
    return int(next(ln for ln in mapped if ln.startswith("register ")).split()[1])


def test_weights_upload_in_chunks_through_pinned_staging(host_unit, stub_driver, tmp_path: Path):
    """The copy goes up in chunks (16 KiB here, COLIBRI_CUDA_UPLOAD_KIB) through two page-locked
    staging buffers that are freed before the first kernel runs; together the chunks are exactly
    the data section, in order. The logits buffer is page-locked too, allocated at open and freed
    at close, after the last launch. Without staging memory the chunks go from the mapping with
    cuMemcpyHtoD, and the forward runs the same."""
    lib = stub_driver["full"]
    weights = _weights_bytes(host_unit, lib, tmp_path)
    chunk = 16 << 10
    assert weights > 3 * chunk
    _, lines = launch_log(host_unit, lib, tmp_path, 1, "chunked", COLIBRI_CUDA_UPLOAD_KIB="16")
    first_launch = next(i for i, ln in enumerate(lines) if ln.startswith("launch "))
    ups = [int(ln.split()[2]) for ln in _opening(lines) if ln.startswith("htod async")]
    assert sum(ups) == weights and ups[:-1] == [chunk] * (len(ups) - 1) and 0 < ups[-1] <= chunk
    hosts = [(i, ln) for i, ln in enumerate(lines) if ln.startswith(("allochost", "freehost"))]
    assert [ln for _, ln in hosts] == [f"allochost {2 * chunk} rc 0", "freehost",
                                       f"allochost {32 * 50 * 4} rc 0", "freehost"]
    assert hosts[1][0] < first_launch  # staging gone before the first kernel
    last_launch = max(i for i, ln in enumerate(lines) if ln.startswith(("launch ", "graph launch")))
    assert hosts[3][0] > last_launch   # the logits buffer lives until close
    # no staging memory: pageable chunks, same launches, nothing leaked (ASan's leak check)
    out, plain = launch_log(host_unit, lib, tmp_path, 1, "pageable", COLIBRI_CUDA_UPLOAD_KIB="16",
                            STUB_ALLOCHOST_FAIL_AT="1")
    opened = _opening(plain)
    assert "weights=copied" in out and not any(ln.startswith("htod async") for ln in opened)
    assert f"allochost {2 * chunk} rc 2" in opened and sum(ln == "freehost" for ln in plain) == 1

    def launches(ls: list[str]) -> list[str]:
        return [ln for ln in ls if ln.startswith(("launch ", "capture ", "graph launch"))]
    assert launches(plain) == launches(lines)


def test_contexts_of_one_model_share_the_weights_on_the_device(host_unit, stub_driver,
                                                              tmp_path: Path):
    """Two contexts on one device (serve's slots on one model): one CUDA context, one weights
    allocation and one upload, then one arena per context; closing the first leaves the second
    running; everything freed at the end (ASan's leak check). Before, each context opened its own
    device and uploaded its own copy: N slots held the weights N times."""
    lib = stub_driver["full"]
    weights = _weights_bytes(host_unit, lib, tmp_path)
    log = tmp_path / "shared.log"
    proc = run_unit(host_unit, "shared", "4", env={"COLIBRI_LIBCUDA": str(lib),
                                                   "STUB_LOG": str(log)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = log.read_text().splitlines()
    allocs = [int(ln.split()[1]) for ln in lines if ln.startswith("alloc ")]
    assert lines.count("ctx create") == 1 and lines.count("ctx destroy") == 1
    assert len(allocs) == 3 and allocs[0] == weights and allocs[1] == allocs[2] != weights, allocs
    first_launch = next(i for i, ln in enumerate(lines) if ln.startswith(("launch ", "capture ")))
    up = [int(ln.split()[2]) for ln in lines[:first_launch] if ln.startswith("htod async")]
    assert sum(up) == weights + 4 * 4 + 8, up  # the weights once, then the first forward's ids
    # each context reports its arena plus the one shared copy
    assert f"bytes={allocs[1] + weights} {allocs[2] + weights}" in proc.stdout, proc.stdout
    # the device goes last: after both contexts freed their logits buffers
    frees = [i for i, ln in enumerate(lines) if ln == "freehost"]
    assert len(frees) == 3 and lines.index("ctx destroy") > frees[-1]


@pytest.mark.parametrize("fail_at", [1, 3])
def test_weights_upload_failure_names_the_chunk(host_unit, stub_driver, tmp_path: Path,
                                                fail_at: int):
    """A copy failing on chunk N: open fails with one line naming chunk N of the total and its
    byte range, and leaves nothing allocated (ASan's leak check over the backend and the stand-in
    driver, which frees what it hands out; every host allocation freed in the log)."""
    lib = stub_driver["full"]
    weights = _weights_bytes(host_unit, lib, tmp_path)
    chunk = 16 << 10
    total = -(-weights // chunk)
    log = tmp_path / f"fail{fail_at}.log"
    proc = run_unit(host_unit, "open", "1", "4",
                    env={"COLIBRI_LIBCUDA": str(lib), "STUB_LOG": str(log),
                         "COLIBRI_CUDA_UPLOAD_KIB": "16", "STUB_HTOD_FAIL_AT": str(fail_at)})
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lo = (fail_at - 1) * chunk
    assert (f"why: cuMemcpyHtoDAsync of weights chunk {fail_at} of {total} (bytes {lo}..{lo + chunk})"
            f" failed: stub error (CUresult 1)") in proc.stdout, proc.stdout
    lines = log.read_text().splitlines()
    assert sum(ln.startswith("allochost") for ln in lines) == 1
    assert sum(ln == "freehost" for ln in lines) == 1
    assert not any(ln.startswith("launch ") for ln in lines)


# ---------------------------------------------------------------- the real binary, no GPU


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from colibri_kit.model.tiny import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("cuda_model") / "tiny.colibri", pad=64)


def _cli(binary: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "COLIBRI_LIBCUDA"}
    if ctypes.util.find_library("cuda"):
        env["COLIBRI_LIBCUDA"] = "libcuda.so.1-absent"  # keep the no-driver path on a GPU box
    return subprocess.run([str(binary), *args], capture_output=True, text=True, env=env,
                          timeout=120)


@pytest.mark.slow
def test_binary_auto_backend_falls_back_to_cpu_with_reason(host_colibri: Path, tiny_model: Path):
    proc = _cli(host_colibri, "--backend", "auto", "info", str(tiny_model))
    assert proc.returncode == 0, proc.stderr
    info = json.loads(proc.stdout)
    backend = info["backend"]
    assert backend["name"] == "cpu"
    assert "not found (no NVIDIA driver)" in backend["fallback_reason"]
    assert "\n" not in backend["fallback_reason"]
    fwd = _cli(host_colibri, "--backend", "auto", "forward", str(tiny_model), "--ids", "1,2,3")
    assert fwd.returncode == 0, fwd.stderr


FALLBACK_LINE = re.compile(r"^colibri: CUDA unavailable \(.*not found \(no NVIDIA driver\)\); "
                           r"running on CPU$")


@pytest.mark.slow
def test_binary_auto_fallback_says_why_in_one_stderr_line(host_colibri: Path, tiny_model: Path):
    """forward, generate and bench with --backend auto on a GPU-less machine: exactly one stderr
    line with the reason, stdout still parseable JSON; --backend cpu prints no such line."""
    model = str(tiny_model)
    commands = {
        "forward": ["forward", model, "--ids", "1,2,3"],
        "generate": ["generate", model, "--ids", "1,2", "--max-new", "3"],
        "bench": ["bench", model, "--prompt-len", "4", "--gen", "2", "--runs", "1", "--json"],
    }
    for name, args in commands.items():
        auto = _cli(host_colibri, "--backend", "auto", *args)
        assert auto.returncode == 0, auto.stderr
        lines = auto.stderr.splitlines()
        assert len(lines) == 1 and FALLBACK_LINE.match(lines[0]), (name, auto.stderr)
        assert json.loads(auto.stdout)
        cpu = _cli(host_colibri, "--backend", "cpu", *args)
        assert cpu.returncode == 0 and cpu.stderr == "", (name, cpu.stderr)
        if name == "forward":  # generate and bench also carry timings
            assert cpu.stdout == auto.stdout
        elif name == "generate":
            assert json.loads(cpu.stdout)["new_ids"] == json.loads(auto.stdout)["new_ids"]
    bench = json.loads(auto.stdout)
    assert bench["backend"]["name"] == "cpu" and bench["backend"]["cuda_image"] == ""
    assert 0 < bench["rss_mb"] <= bench["peak_rss_mb"]


@pytest.mark.slow
def test_binary_cuda_backend_fails_cleanly(host_colibri: Path, tiny_model: Path):
    proc = _cli(host_colibri, "--backend", "cuda", "info", str(tiny_model))
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "not found (no NVIDIA driver)" in lines[0], proc.stderr
    assert proc.stdout == ""


def test_kernel_suite_skips_only_without_gpu_and_says_why():
    """Without a GPU (no driver library) the conformance suite skips, naming what is missing;
    with one it collects every kernel check (it never skips on a GPU machine, pycuda or not)."""
    from colibri_kit.tasks.gpu import GpuCheckError, probe_gpu

    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
                           str(GPU_TESTS / "test_kernels_gpu.py"), "-k", "embed or reports"],
                          capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={k: v for k, v in os.environ.items() if k != "COLIBRI_LIBCUDA"})
    try:
        probe_gpu()
    except GpuCheckError:
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert re.search(r"SKIPPED \[\d+\] .*(no NVIDIA driver|no CUDA GPU)", proc.stdout), \
            proc.stdout
        return
    assert "skipped" not in proc.stdout, proc.stdout


@pytest.mark.slow
def test_kernel_suite_runs_without_pycuda_through_the_driver(cuda_host_build):
    """The conformance suite through its driver adapter (ctypes on libcuda.so.1, no pycuda) on
    the stand-in driver running the kernels in the host emulation: with pytest, and with the
    pytest-free runner a GPU machine with numpy only uses; every selected check passes, the
    tensor-core ones included (the stand-in presents sm_90)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STUB_")}
    env.update(COLIBRI_LIBCUDA=str(cuda_host_build["libcuda"]), STUB_SM="90",
               COLIBRI_GPU_BINARY=str(cuda_host_build["binary"]), COLIBRI_GPU_DRIVER="driver")
    sel = "embed-F16 or f16_every or linear-F32-37 or linear_mma-INT8-37 or dispatch-5"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(GPU_TESTS / "test_kernels_gpu.py"), "-k", sel],
                          capture_output=True, text=True, cwd=ROOT, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"\b(\d+) passed", proc.stdout) and "skipped" not in proc.stdout, proc.stdout
    proc = subprocess.run([sys.executable, str(GPU_TESTS / "run_conformance.py"), "--binary",
                           str(cuda_host_build["binary"]), "--json", "-k",
                           "ffn_route-F32-8-2-40,attention_prefill-5-0,grouped_experts_mma-F16-6"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = [json.loads(line) for line in proc.stdout.splitlines()]
    assert len(checks) == 5 and all(c["ok"] for c in checks), checks
    # the GEMV bench on the same adapter prints its figures
    proc = subprocess.run([sys.executable, str(GPU_TESTS / "bench_gemv.py"), "--json", "--rows",
                           "64", "--cols", "64", "--mib", "1", "--iters", "2"],
                          capture_output=True, text=True, cwd=ROOT, timeout=900, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    bench = json.loads(proc.stdout)
    assert bench["copy_gbps"] > 0 and set(bench["gemv"]) == {"f32", "f16", "bf16", "int8"}


# ---------------------------------------------------------------- the kernel plan adds up


def _random_model(path: Path, flags: int, dtype: int, shared: int = 0, pad: int = 16,
                  max_seq_len: int = 32):
    from colibri_kit.model.format import Family, ModelHeader, Routing, padded_dim, read_model
    from colibri_kit.model.tiny import write_random_model

    d = 40
    header = ModelHeader(
        num_experts=8, expert_size=24, vocab_size=96, max_seq_len=max_seq_len, embed_dim=d,
        n_layers=2,
        n_heads=4, n_kv_heads=2, head_dim=10, top_k=3, routing=Routing.RENORMALISE,
        dtype=int(dtype), embed_dim_pad=padded_dim(d, pad), pad_multiple=pad, flags=flags,
        shared_expert_size=shared, norm_eps=1e-5, rope_theta=10000.0, family=Family.OTHER,
        name="cuda-plan-check")
    write_random_model(path, header, seed=7)
    return read_model(path)


PLAN_CASES = {
    # qwen2_moe-like: shared expert + sigmoid gate, qkv bias, per-head q/k norm
    "shared-gate-bias-qknorm-head-f32": (0b100111, 0, 20),
    # olmoe-like: full-width q/k norm, tied embeddings, bf16
    "qknorm-full-tied-bf16": (0b011000, 2, 0),
    "plain-f16": (0, 1, 0),
    "shared-int8": (0b000001, 3, 16),
    "shared-q4": (0b000001, 4, 16),
}


@pytest.mark.parametrize("case", list(PLAN_CASES))
def test_backend_kernel_plan_matches_the_reference_forward(tmp_path: Path, case: str):
    """The per-kernel NumPy references, composed in cuda_backend.c's order with its buffer
    layouts (KV cache rows, per-head norms, grouped dispatch, chunking), give the model's forward
    pass as colibri_kit.model.reference computes it: the backend's plan is right, and the pycuda
    suite's references are the right yardstick."""
    import sys

    sys.path.insert(0, str(GPU_TESTS))
    try:
        from kernel_reference import BackendForward
    finally:
        sys.path.remove(str(GPU_TESTS))
    from colibri_kit.model.reference import Reference

    flags, dtype, shared = PLAN_CASES[case]
    model = _random_model(tmp_path / "m.colibri", flags, dtype, shared)
    ids = [3, 17, 95, 0, 42, 42, 7, 64, 5, 11]
    ref = Reference(model, dtype=np.float64)
    want = np.concatenate([ref.forward(ids[:7]), ref.forward(ids[7:])])
    plan = BackendForward(model)
    got = np.concatenate([plan.forward(ids[:7], chunk=4), plan.forward(ids[7:], chunk=4)])
    assert got.shape == want.shape == (10, 96)
    err = np.abs(got - want).max() / np.abs(want).max()
    assert err < 1e-5, err
    # the same experts, token by token and layer by layer
    chosen = np.array([[r.experts for r in tok] for tok in ref.routing])  # [10, L, k]
    # plan.routes: per chunk, per layer: [n, k] -> reorder to [token, layer, k]
    L = model.header.n_layers
    per_chunk = [plan.routes[i:i + L] for i in range(0, len(plan.routes), L)]
    mine = np.concatenate([np.stack(c, axis=1) for c in per_chunk])
    assert np.array_equal(mine, chosen)


# ---------------------------------------------------------------- the real --backend cuda path, emulated


def _emu_cli(build: dict[str, Path], *args: str, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("STUB_")}
    # passes of 32 tokens, as these tests were written for (a prompt of 33+ tokens is two
    # passes, the second a 1-2 token GEMV pass); the plan's own larger passes are tested with
    # COLIBRI_CUDA_CHUNK="" (test_prefill_downloads_the_last_row_in_passes_the_arena_allows)
    full.update({"COLIBRI_LIBCUDA": str(build["libcuda"]), "STUB_SM": "90",
                 "COLIBRI_CUDA_CHUNK": "32"})
    full.update(env)
    return subprocess.run([str(build["binary"]), *args], capture_output=True, text=True,
                          env=full, timeout=600)


def _logits(build, model: Path, backend: str, ids: list[int], name: str, *extra: str,
            where: Path | None = None, **env) -> np.ndarray:
    """`colibri forward` logits of ids (extra: more CLI options), written under `where`."""
    out = (where or build["tmp"]) / f"{name}.f32"
    proc = _emu_cli(build, "--backend", backend, "forward", str(model), "--ids",
                    ",".join(map(str, ids)), *extra, "--logits-out", str(out), **env)
    assert proc.returncode == 0, proc.stderr
    return np.fromfile(out, "<f4").reshape(len(ids), -1)


@pytest.mark.slow
def test_cuda_backend_end_to_end_in_emulation(cuda_host_build, tiny_model: Path):
    """The real binary's --backend cuda path (cuda_backend.c: image pick, arena, weight upload,
    chunked prefill over 2 device passes, every kernel launch) computes the CPU path's logits
    within the documented tolerance (docs/cuda.md: 1e-4 x max |logit|)."""
    info = _emu_cli(cuda_host_build, "--backend", "cuda", "info", str(tiny_model))
    assert info.returncode == 0, info.stderr
    backend = json.loads(info.stdout)["backend"]
    assert backend["name"] == "cuda" and backend["cuda_sm"] == 90
    assert backend["cuda_device"] == "Stub GPU" and backend["fallback_reason"] == ""
    ids = [1, 5, 9, 2, 200, 7, 7, 3, 0, 42, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59,
           61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107]  # 34 > one 32-token device pass
    cpu = _logits(cuda_host_build, tiny_model, "cpu", ids, "tiny_cpu")
    gpu = _logits(cuda_host_build, tiny_model, "cuda", ids, "tiny_cuda")
    err = np.abs(gpu - cpu).max() / np.abs(cpu).max()
    assert err < 1e-4, err


@pytest.mark.slow
def test_cuda_backend_flags_and_mapped_weights_in_emulation(cuda_host_build, tmp_path: Path):
    """Shared expert + gate, qkv bias, per-head q/k norm, bf16 weights, on an "integrated GPU"
    with COLIBRI_CUDA_WEIGHTS=map (weights device-mapped from the mmapped file instead of
    copied): same logits as the CPU."""
    model = tmp_path / "flags.colibri"
    _random_model(model, 0b100111, 2, 20, pad=64)  # the host profile's embed_pad
    ids = [3, 17, 95, 0, 42, 42]
    cpu = _logits(cuda_host_build, model, "cpu", ids, "flags_cpu")
    gpu = _logits(cuda_host_build, model, "cuda", ids, "flags_cuda", STUB_INTEGRATED="1",
                  COLIBRI_CUDA_WEIGHTS="map")
    err = np.abs(gpu - cpu).max() / np.abs(cpu).max()
    assert err < 1e-4, err


@pytest.mark.slow
def test_cuda_backend_q4_in_emulation(cuda_host_build, tmp_path: Path):
    """Grouped 4-bit weights (q4) through the real --backend cuda path: embedding gather, linear
    layers and grouped experts read nibbles + f16 group scales; widths that are not multiples of
    the 32-weight group (D 40 of Dp 64, F 24, shared F 20, H*Dh 40) give partial last groups.
    Same logits as the CPU path."""
    model = tmp_path / "q4.colibri"
    _random_model(model, 0b100111, 4, 20, pad=64)
    ids = [3, 17, 95, 0, 42, 42, 7]
    cpu = _logits(cuda_host_build, model, "cpu", ids, "q4_cpu")
    gpu = _logits(cuda_host_build, model, "cuda", ids, "q4_cuda")
    err = np.abs(gpu - cpu).max() / np.abs(cpu).max()
    assert err < 1e-4, err
    # the memory planner's device arena (colibri_kit/model/footprint.py) is what the backend
    # allocates: weights mapped (integrated GPU, COLIBRI_CUDA_WEIGHTS=map) or copied into it
    from colibri_kit.model.footprint import cuda_arena_bytes
    from colibri_kit.model.format import read_model

    h = read_model(model).header
    mapped = _emu_info(cuda_host_build, model, STUB_INTEGRATED="1", COLIBRI_CUDA_WEIGHTS="map")
    assert mapped["cuda_device_bytes"] == cuda_arena_bytes(h)
    copied = _emu_info(cuda_host_build, model)
    weights = model.stat().st_size - h.data_offset
    assert copied["cuda_device_bytes"] == cuda_arena_bytes(h, copy_weights=True, weights_bytes=weights)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [0, 1, 3], ids=["f32", "f16", "int8"])
def test_tensor_core_prefill_in_emulation(cuda_host_build, tmp_path: Path, dtype: int):
    """Prefill on an sm_90 "GPU" runs the routed and the shared expert projections on the
    tensor-core kernels (sm_90 cubin), the emulation executing their mma fragment by fragment:
    the logits are the CPU's within the GPU-vs-CPU tolerance (docs/cuda.md: the tf32 hi/lo split
    keeps it) and bit-identical on a second run. On sm_72 (its cubin lacks them) and on sm_80 (no
    cubin; the compute_72 PTX) the SIMT kernels run (`info` cuda_prefill; the f16 model also runs
    there, within tolerance); sm_100 JITs the compute_90 PTX and has them. bf16 weights take the
    f16 path of the kernels' tf32 conversion (exact, no split): the conformance suite covers them
    kernel by kernel."""
    model = tmp_path / "m.colibri"
    _random_model(model, 0b100111, dtype, 20, pad=64)  # shared expert + gate, bias, q/k norm
    ids = [3, 17, 95, 0, 42, 42, 7, 8, 9, 10, 11, 12, 13]  # 13 tokens: one prefill pass
    cpu = _logits(cuda_host_build, model, "cpu", ids, f"tc{dtype}_cpu")
    for sm, path in (("90", "mma"), ("72", "simt"), ("80", "simt"), ("100", "mma")):
        assert _emu_info(cuda_host_build, model, STUB_SM=sm)["cuda_prefill"] == path, sm
    log = tmp_path / "launch.log"
    gpu = _logits(cuda_host_build, model, "cuda", ids, f"tc{dtype}_90", STUB_LOG=str(log))
    names = [ln.split()[1] for ln in log.read_text().splitlines() if ln.startswith("launch ")]
    # per layer: routed + shared expert, up and down, all on the tensor cores
    assert names.count("cb_expert_up_mma") == names.count("cb_expert_down_mma") == 2 * 2
    assert "cb_expert_up" not in names and "cb_expert_down" not in names
    # Q, K, V (staging rows), WO and the shared gate per layer, and the LM head (the router is
    # fused into cb_ffn_route: 8 experts)
    assert names.count("cb_linear_mma") == 5 * 2 + 1 and "cb_linear" not in names
    assert names.count("cb_ffn_route") == 2
    assert np.abs(gpu - cpu).max() / np.abs(cpu).max() < 1e-4
    again = _logits(cuda_host_build, model, "cuda", ids, f"tc{dtype}_90b")
    assert gpu.tobytes() == again.tobytes()
    if dtype != 1:
        return
    log.unlink()
    simt = _logits(cuda_host_build, model, "cuda", ids, f"tc{dtype}_72", STUB_SM="72",
                   STUB_LOG=str(log))
    names = [ln.split()[1] for ln in log.read_text().splitlines() if ln.startswith("launch ")]
    assert "cb_expert_up" in names and not [n for n in names if n.endswith("_mma")]
    assert np.abs(simt - cpu).max() / np.abs(cpu).max() < 1e-4


@pytest.mark.slow
def test_cuda_backend_decode_steps_in_emulation(cuda_host_build, tiny_model: Path):
    """generate = prefill, then one-token decode passes at growing KV positions, which run as
    one CUDA graph launch each (captured on the first, replayed through the emulation by the
    stand-in driver): the greedy continuation equals the CPU's."""
    runs = {}
    log = cuda_host_build["tmp"] / "generate.log"
    for backend in ("cpu", "cuda"):
        proc = _emu_cli(cuda_host_build, "--backend", backend, "generate", str(tiny_model),
                        "--ids", "1,2,3,4", "--max-new", "4", STUB_LOG=str(log))
        assert proc.returncode == 0, proc.stderr
        runs[backend] = json.loads(proc.stdout)["new_ids"]
    assert runs["cuda"] == runs["cpu"] and len(runs["cpu"]) == 4
    lines = log.read_text().splitlines()
    end = next(i for i, ln in enumerate(lines) if ln.startswith("end capture"))
    assert lines[end].endswith("rc 0")
    steps = [ln for ln in lines[end + 1:] if ln.startswith(("graph launch", "launch "))]
    assert steps and all(ln.startswith("graph launch") for ln in steps), steps


# prompt in one call, then decode steps at positions 5..8, in a cache of 300 positions: the
# graph's attention grid covers both KV ranges of the cache and its merge is always launched, so
# these one-range steps run the fixed grid's early returns. Steps past position 255 (two ranges,
# the merge computing) are checked kernel by kernel, graph launch vs plain, in the conformance
# suite (tests/gpu/conformance.py check_attention): a 256-token prompt through the CPU emulation
# takes minutes.
GRAPH_PROMPT, GRAPH_STEPS = 5, 4


@pytest.mark.slow
@pytest.mark.parametrize("flags,dtype", [(0b100111, 0), (0b011000, 2)],
                         ids=["shared-gate-bias-qknorm-head-f32", "qknorm-full-bf16"])
def test_decode_graph_gives_the_plain_launches_bits(cuda_host_build, tmp_path: Path, flags: int,
                                                    dtype: int):
    """The determinism contract, "with or without a CUDA graph": decode steps through the graph
    (position and token id from the device parameter block, attention over every KV range of
    the cache, merge always launched) give bit for bit the logits of the same steps launched
    kernel by kernel (a driver without graphs, or COLIBRI_CUDA_GRAPH=0), and both are within
    tolerance of the CPU. The prompt part is the same plain prefill in both."""
    model = tmp_path / "graph.colibri"
    _random_model(model, flags, dtype, 20 if flags & 1 else 0, pad=64, max_seq_len=300)
    ids = [(i * 37 + 11) % 96 for i in range(GRAPH_PROMPT + GRAPH_STEPS)]
    args = ["--decode-from", str(GRAPH_PROMPT)]

    def logits(backend: str, name: str, **env: str) -> np.ndarray:
        return _logits(cuda_host_build, model, backend, ids, name, *args, where=tmp_path, **env)

    log = tmp_path / "graph.log"
    graph = logits("cuda", "graph", STUB_LOG=str(log))
    plain = logits("cuda", "plain", COLIBRI_LIBCUDA=str(cuda_host_build["libcuda_nograph"]))
    off_log = tmp_path / "off.log"
    off = logits("cuda", "off", COLIBRI_CUDA_GRAPH="0", STUB_LOG=str(off_log))  # graph switched off
    assert "graph launch" not in off_log.read_text()
    np.testing.assert_array_equal(off.view(np.uint32), plain.view(np.uint32))
    cpu = logits("cpu", "cpu")
    lines = log.read_text().splitlines()
    assert sum(ln.startswith("graph launch") for ln in lines) == GRAPH_STEPS
    attn = [ln.split() for ln in lines if ln.startswith("capture cb_attention ")]
    assert [int(a[3]) for a in attn] == [4 * 2] * 2  # H x ceil(300 / 256) ranges, both layers
    assert sum(ln.startswith("capture cb_attention_merge") for ln in lines) == 2
    np.testing.assert_array_equal(graph.view(np.uint32), plain.view(np.uint32))
    err = np.abs(graph - cpu).max() / np.abs(cpu).max()
    assert err < 1e-4, err


@pytest.mark.slow
def test_prefill_downloads_the_last_row_in_passes_the_arena_allows(cuda_host_build,
                                                                   tmp_path: Path):
    """Prefill on CUDA (issue 20 item 6): `forward --last` (colibri_forward_last, what generate
    and bench run for a prompt) computes and downloads the last token's logits only (one
    device-to-host copy of vocab floats, one LM head row) and they are bit for bit the last row
    of the full forward; the prompt runs as one pass of 64 (the plan's chunk covers the model's
    context) and its logits, every row, are bit for bit those of passes of 32
    (COLIBRI_CUDA_CHUNK=32: the former schedule), within tolerance of the CPU's."""
    model = tmp_path / "prefill.colibri"
    _random_model(model, 0b100111, 0, 20, pad=64, max_seq_len=64)  # shared expert, bias, q/k norm
    ids = [(i * 29 + 5) % 96 for i in range(64)]
    info = _emu_info(cuda_host_build, model, COLIBRI_CUDA_CHUNK="")
    assert info["cuda_chunk"] == 64
    full = _logits(cuda_host_build, model, "cuda", ids, "full", where=tmp_path,
                   COLIBRI_CUDA_CHUNK="")
    old = _logits(cuda_host_build, model, "cuda", ids, "c32", where=tmp_path,
                  COLIBRI_CUDA_CHUNK="32")
    np.testing.assert_array_equal(full.view(np.uint32), old.view(np.uint32))
    log = tmp_path / "last.log"
    out = tmp_path / "last.f32"
    proc = _emu_cli(cuda_host_build, "--backend", "cuda", "forward", str(model), "--ids",
                    ",".join(map(str, ids)), "--last", "--logits-out", str(out),
                    STUB_LOG=str(log), COLIBRI_CUDA_CHUNK="")
    assert proc.returncode == 0, proc.stderr
    last = np.fromfile(out, "<f4")
    np.testing.assert_array_equal(last.view(np.uint32), full[-1].view(np.uint32))
    lines = log.read_text().splitlines()
    assert [ln for ln in lines if ln.startswith("dtoh async")] == [f"dtoh async {96 * 4}"]
    names = [ln.split()[1] for ln in lines if ln.startswith("launch ")]
    assert names.count("cb_embed") == 1  # one pass of 64 tokens
    heads = [ln for ln in lines if ln.startswith("launch cb_linear_mma") and " grid 2 1 " in ln]
    assert len(heads) == 1, heads  # the LM head (96 rows: 2 blocks of 64) for one token
    cpu = _logits(cuda_host_build, model, "cpu", ids, "cpu", where=tmp_path)
    assert np.abs(full - cpu).max() / np.abs(cpu).max() < 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("flags,dtype", [(0b100111, 0), (0b000000, 4)],
                         ids=["shared-gate-bias-qknorm-head-f32", "plain-q4"])
def test_fused_routing_gives_the_split_launches_bits(cuda_host_build, tmp_path: Path, flags: int,
                                                     dtype: int):
    """cb_ffn_route (FFN norm + router + top-k, one launch per layer) end to end: a prompt over
    two device passes' worth of chunking and decode steps through the CUDA graph give bit for
    bit the logits of the three launches it replaces (COLIBRI_CUDA_FUSE_ROUTE=0), and the CPU's
    within tolerance; the graph holds cb_ffn_route and no router linear or top-k."""
    model = tmp_path / "route.colibri"
    _random_model(model, flags, dtype, 20 if flags & 1 else 0, pad=64, max_seq_len=48)
    ids = [(i * 29 + 5) % 96 for i in range(36)]
    args = ["--decode-from", "33"]  # 33 prompt tokens (passes of 32 + 1), then 3 graph steps

    def logits(backend: str, name: str, **env: str) -> np.ndarray:
        return _logits(cuda_host_build, model, backend, ids, name, *args, where=tmp_path, **env)

    log, split_log = tmp_path / "fused.log", tmp_path / "split.log"
    fused = logits("cuda", "fused", STUB_LOG=str(log))
    split = logits("cuda", "split", STUB_LOG=str(split_log), COLIBRI_CUDA_FUSE_ROUTE="0")
    np.testing.assert_array_equal(fused.view(np.uint32), split.view(np.uint32))
    cpu = logits("cpu", "cpu")
    err = np.abs(fused - cpu).max() / np.abs(cpu).max()
    assert err < (1e-4 if dtype == 0 else 1e-3), err
    lines = log.read_text().splitlines()
    captured = [ln.split()[1] for ln in lines if ln.startswith("capture ")]
    assert captured.count("cb_ffn_route") == 2 and "cb_router_topk" not in captured
    assert sum(ln.startswith("graph launch") for ln in lines) == 3
    names = [ln.split()[1] for ln in split_log.read_text().splitlines()
             if ln.startswith(("launch ", "capture "))]
    assert "cb_ffn_route" not in names and names.count("cb_router_topk") == 2 * (2 + 1)


def test_prefill_bits_follow_the_chunk_schedule(cuda_host_build, tmp_path: Path):
    """The GPU determinism contract (docs/cuda.md): a prompt in multi-token passes (the tiled
    prefill attention) gives the same bits run to run; the same tokens as one-token decode steps
    (split-KV attention, through the CUDA graph) need not have those bits, and both are within
    tolerance of the CPU, whose prefill and decode give identical bits."""
    model = tmp_path / "sched.colibri"
    _random_model(model, 0b100111, 0, 20, pad=64, max_seq_len=64)
    ids = [(i * 37 + 11) % 96 for i in range(12)]

    def logits(backend: str, name: str, *extra: str) -> np.ndarray:
        return _logits(cuda_host_build, model, backend, ids, name, *extra, where=tmp_path)

    prefill, again = logits("cuda", "p1"), logits("cuda", "p2")
    np.testing.assert_array_equal(prefill.view(np.uint32), again.view(np.uint32))
    decode = logits("cuda", "d", "--decode-from", "1")
    cpu, cpu_decode = logits("cpu", "c"), logits("cpu", "cd", "--decode-from", "1")
    np.testing.assert_array_equal(cpu.view(np.uint32), cpu_decode.view(np.uint32))
    for gpu in (prefill, decode):
        assert np.abs(gpu - cpu).max() / np.abs(cpu).max() < 1e-4


def test_invoke_gpucheck_failures_are_actionable():
    """`invoke gpucheck` is an explicit request for a GPU check: without a GPU it fails (exit 1,
    one line naming what is missing); with one, a target never built names the build command."""
    from colibri_kit.tasks.gpu import GpuCheckError, probe_gpu

    try:
        probe_gpu()
        expected = "does not exist: build it first with `invoke build --target no-such-target`"
    except GpuCheckError as exc:
        expected = str(exc)
        assert "no NVIDIA driver" in expected or "CUDA GPU" in expected
    proc = subprocess.run([sys.executable, "-m", "invoke", "gpucheck", "--target", "no-such-target"],
                          capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 1
    assert expected in proc.stderr and "Traceback" not in proc.stderr


def _emu_info(build: dict[str, Path], model: Path, **env: str) -> dict:
    proc = _emu_cli(build, "--backend", "cuda", "info", str(model), **env)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["backend"]


@pytest.mark.slow
def test_cuda_backend_reports_image_weights_and_device_memory(cuda_host_build, tiny_model: Path):
    """info reports what the stand-in driver presents and what the backend chose: the sm_90 cubin
    on an SM 9.0 GPU, the embedded PTX (JIT) on a newer SM with no cubin, weights copied on a
    discrete GPU and by default on an integrated one, device-mapped on an integrated one with
    COLIBRI_CUDA_WEIGHTS=map."""
    discrete = _emu_info(cuda_host_build, tiny_model)
    assert (discrete["cuda_sm"], discrete["cuda_driver_version"]) == (90, 12060)
    assert discrete["cuda_image"] == "cubin" and discrete["cuda_weights"] == "copied"
    assert discrete["cuda_integrated"] is False
    assert discrete["cuda_device_bytes"] == discrete["arena_bytes"] > tiny_model.stat().st_size
    newer = _emu_info(cuda_host_build, tiny_model, STUB_SM="100")
    assert newer["cuda_sm"] == 100 and newer["cuda_image"] == "ptx"
    copied = _emu_info(cuda_host_build, tiny_model, STUB_INTEGRATED="1")
    assert copied["cuda_integrated"] is True and copied["cuda_weights"] == "copied"
    assert copied["cuda_device_bytes"] == discrete["cuda_device_bytes"]
    mapped = _emu_info(cuda_host_build, tiny_model, STUB_INTEGRATED="1", COLIBRI_CUDA_WEIGHTS="map")
    assert mapped["cuda_integrated"] is True and mapped["cuda_weights"] == "mapped"
    assert mapped["cuda_device_bytes"] < discrete["cuda_device_bytes"]  # no weights in the arena
    forced = _emu_info(cuda_host_build, tiny_model, STUB_INTEGRATED="1", COLIBRI_CUDA_WEIGHTS="copy")
    assert forced["cuda_weights"] == "copied"


def _expert_heavy_model(path: Path) -> tuple[Path, int]:
    """A model whose weights are mostly routed experts (64 x 3 x 192 x 192 f32 = 27 MiB), which
    the host uploads in full, while a token computes only its top-1 (routed-experts-only
    launches: ~190 emulated blocks per token). Returns the path and its vocabulary size."""
    from colibri_kit.model.format import DType, Family, ModelHeader, Routing, padded_dim
    from colibri_kit.model.tiny import write_random_model

    d, pad, vocab = 192, 64, 64  # the host profile's embed_pad
    header = ModelHeader(
        num_experts=64, expert_size=192, vocab_size=vocab, max_seq_len=8, embed_dim=d, n_layers=1,
        n_heads=2, n_kv_heads=1, head_dim=32, top_k=1, routing=Routing.RENORMALISE,
        dtype=int(DType.F32), embed_dim_pad=padded_dim(d, pad), pad_multiple=pad, flags=0,
        shared_expert_size=0, norm_eps=1e-5, rope_theta=10000.0, family=Family.OTHER,
        name="rss-check")
    return write_random_model(path, header, seed=3), vocab


@pytest.mark.slow
def test_chunked_upload_keeps_one_weight_copy_resident(cuda_host_build, tmp_path: Path):
    """Integrated GPU, default (copied) weights, uploaded in 1 MiB chunks: each chunk's mapped
    pages are dropped once staged, so bench's peak resident memory (VmHWM) stays within a few
    chunks of where it ends, holding the device copy (in emulation the device arena is host
    memory). The same upload as one file-sized chunk peaks one whole copy above where it ends
    (the mapped file, then the staging buffer, beside the device copy: two copies at once, as the
    single whole-file cuMemcpyHtoD before the chunks did): what the chunks save."""
    model, _ = _expert_heavy_model(tmp_path / "experts.colibri")
    weights_mb = model.stat().st_size / 2**20  # ~27 MiB, almost all of it expert weights
    assert weights_mb > 25

    def bench(**env: str) -> dict:
        proc = _emu_cli(cuda_host_build, "--backend", "cuda", "bench", str(model), "--prompt-len",
                        "1", "--gen", "1", "--runs", "1", "--json", STUB_INTEGRATED="1", **env)
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["backend"]["cuda_weights"] == "copied"
        return out

    fd = os.open(model, os.O_RDONLY)  # start with none of the file in the page cache
    os.fsync(fd)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    os.close(fd)
    chunked = bench(COLIBRI_CUDA_UPLOAD_KIB="1024")
    assert chunked["rss_mb"] > weights_mb  # the device copy
    assert chunked["peak_rss_mb"] - chunked["rss_mb"] < 0.25 * weights_mb, chunked
    # and most of the file's page-cache pages were reclaimed chunk by chunk (MADV_PAGEOUT; with
    # 1 MiB chunks ~12% stay on this machine's kernel, run after run, not investigated; the
    # whole-file copy left all of it): on an integrated GPU they would
    # share DRAM with the device copy. util-linux fincore reads the page cache's residency;
    # without it this part is not checked.
    if shutil.which("fincore"):
        cached = subprocess.run(["fincore", "-b", "-n", "-o", "RES", str(model)], check=True,
                                capture_output=True, text=True).stdout.split()
        assert int(cached[0]) < 0.25 * model.stat().st_size, cached
    whole = bench(COLIBRI_CUDA_UPLOAD_KIB=str(64 << 10))  # 64 MiB: the file in one chunk
    assert whole["peak_rss_mb"] - whole["rss_mb"] > 0.8 * weights_mb, whole


@pytest.mark.slow
def test_chunked_upload_gives_the_same_logits(cuda_host_build, tmp_path: Path):
    """The weights in 4 KiB chunks (hundreds, double-buffered), in one chunk, and through the
    pageable fallback (no staging memory: the stand-in refuses cuMemAllocHost once) give bitwise
    the same logits, on a discrete and an integrated GPU, and the CPU path's within 1e-4."""
    model, vocab = _expert_heavy_model(tmp_path / "experts.colibri")
    ids = [5, vocab - 1, 17]
    cpu = _logits(cuda_host_build, model, "cpu", ids, "chunks_cpu")
    runs = {
        "one": _logits(cuda_host_build, model, "cuda", ids, "chunks_one"),
        "4k": _logits(cuda_host_build, model, "cuda", ids, "chunks_4k",
                      COLIBRI_CUDA_UPLOAD_KIB="4", STUB_INTEGRATED="1"),
        "pageable": _logits(cuda_host_build, model, "cuda", ids, "chunks_pageable",
                            COLIBRI_CUDA_UPLOAD_KIB="4", STUB_ALLOCHOST_FAIL_AT="1"),
    }
    for name, got in runs.items():
        assert np.array_equal(got, runs["one"]), name
    assert np.abs(runs["one"] - cpu).max() / np.abs(cpu).max() < 1e-4


# ---------------------------------------------------------------- scripts/gpu-check.sh


GPU_CHECK = ROOT / "scripts" / "gpu-check.sh"
# small enough for the emulation: the large-model step runs end to end on a ~1 MB model
TINY_SYNTH = ("--dim 64 --layers 1 --experts 4 --top-k 2 --ffn 32 --heads 2 --kv-heads 1 "
              "--head-dim 32 --vocab 256 --seq 32")


def _gpu_check(*args: str | Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith(("STUB_", "COLIBRI_CUDA_"))}
    full.update({"PYTHON": sys.executable, **env})
    return subprocess.run([str(GPU_CHECK), *map(str, args)], capture_output=True, text=True,
                          env=full, timeout=3600)


def _scripts():
    """scripts/gpu_check_prepare.py and gpu_check_run.py as modules (they are run by path)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import gpu_check_prepare
        import gpu_check_run
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return gpu_check_prepare, gpu_check_run


def _records(report: Path) -> list[dict]:
    return [json.loads(line) for line in report.read_text().splitlines()]


def _planned(directory: Path) -> list[str]:
    proc = _gpu_check(directory, "--list")
    assert proc.returncode == 0, proc.stderr
    return [line.split()[1] for line in proc.stdout.splitlines()]


@pytest.fixture(scope="module")
def prepared(cuda_host_build, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """scripts/gpu-check.sh --prepare with its defaults but the large model's geometry (a 4.9 GB
    model is not written here) and the module's sm_72 + sm_90 build (the script's own build step
    is `colibri_kit.build.build(load_profile('host'), cuda_archs=['sm_90'])`)."""
    out = tmp_path_factory.mktemp("gpucheck") / "g"
    proc = _gpu_check("--prepare", out, "--binary", cuda_host_build["binary"], "--large-args",
                      TINY_SYNTH)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert re.search(r"prepared .*: \d+ models, [\d.]+ MiB \(limit 64 MiB\)", proc.stdout), \
        proc.stdout
    return out


@pytest.mark.slow
def test_gpu_check_prepare_is_complete_and_small(prepared: Path):
    """One directory: the binary with the sm_90 cubin, a model per family x weight type the CUDA
    backend reads (the dtype list is format.DType less what footprint.cuda_unsupported names:
    mxfp4 for now) and the coverage models, expected logits and greedy ids, the kernel suite, a
    plan that fits every model, under 64 MiB."""
    from colibri_kit.model.footprint import cuda_unsupported
    from colibri_kit.model.format import DType, read_model

    prep, _ = _scripts()
    manifest = json.loads((prepared / "manifest.json").read_text())
    names = {m["name"] for m in manifest["models"]}
    cuda_dtypes = [d for d in DType if not cuda_unsupported(prep.small_header("mixtral", int(d), 16))]
    assert DType.MXFP4 not in cuda_dtypes and DType.Q4 in cuda_dtypes
    small = {f"{f}-{d.name.lower()}" for f in prep.family_shapes() for d in cuda_dtypes}
    assert names == small | {"cov-long-context", "cov-32-experts", "cov-odd-2-streams"}
    assert set(prep.family_shapes()) == {"mixtral", "qwen2_moe", "qwen3_moe", "olmoe"}
    for m in manifest["models"]:
        rows = len(m["prompt_ids"]) + len(m["greedy_new_ids"]) - 1
        assert (prepared / m["logits"]).stat().st_size == rows * m["vocab"] * 4
        assert m["tolerance"] == (1e-4 if m["dtype"] == "f32" else 1e-3)
    cov = {m["name"]: read_model(prepared / m["path"]).header for m in manifest["models"]
           if m["kind"] == "coverage"}
    long = next(m for m in manifest["models"] if m["name"] == "cov-long-context")
    assert cov["cov-long-context"].max_seq_len >= 1024 and len(long["prompt_ids"]) > 2 * 256
    assert cov["cov-32-experts"].num_experts > 16
    odd = cov["cov-odd-2-streams"]
    assert odd.embed_dim % 16 and odd.expert_size % 16 and odd.head_dim % 16
    assert next(m for m in manifest["models"]
                if m["name"] == "cov-odd-2-streams")["env"] == {"COLIBRI_CUDA_STREAMS": "2"}
    plan = manifest["plan"]
    assert plan["bench"] == prep.BENCH and plan["det_models"] == [
        "mixtral-f32", "qwen2_moe-f32", "qwen3_moe-f32", "olmoe-f32"]
    assert all(t < 600 for t in plan["timeouts"].values())
    assert plan["call_budget_s"] == {"1": 240, "2": 300}
    assert (prepared / "suite" / "run_conformance.py").is_file()
    from colibri_kit.elf import find_cubins

    assert [c.sm for c in find_cubins((prepared / "bin" / "colibri").read_bytes())] == [72, 90]
    assert 0 < prep.dir_size(prepared) <= prep.PREPARED_LIMIT


@pytest.mark.slow
def test_gpu_check_default_plan_runs_every_step_through_the_stand_in(prepared: Path,
                                                                   stub_driver, tmp_path: Path):
    """The run half with its default plan on the default prepared directory, end to end through
    the stand-in driver (every colibri command of both calls runs: info, forward, bench, synth,
    gpuprobe, the kernel suite; the stand-in runs no kernel, so the numbers are wrong and the
    correctness checks fail, as they must). Every planned step is in the report, none timed out,
    errored or was cut by its call's budget, every bench and the large model gave figures, and
    the report says which steps failed."""
    out = tmp_path / "out"
    proc = _gpu_check(prepared, "--out", out, COLIBRI_LIBCUDA=str(stub_driver["full"]),
                      STUB_SM="90")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = [r for r in _records(out / "report.jsonl") if "step" in r]
    assert [r["step"] for r in recs] == _planned(prepared)
    assert not [r for r in recs if r["status"] in ("timeout", "error", "not-run")], \
        [r for r in recs if r["status"] in ("timeout", "error", "not-run")]
    by = {r["step"]: r for r in recs}
    for name, r in by.items():
        if name.startswith("bench:"):
            assert set(r["decode"]) == {"graph", "no graph"}
            assert all(v["decode_tok_s"] > 0 for v in r["decode"].values()), r
    assert by["large"]["status"] == "figure" and by["large"]["decode_tok_s"] > 0
    assert by["probe"]["status"] == "figure" and by["probe"]["libcuda"] == str(stub_driver["full"])
    assert by["device"]["cuda_libcuda"] == str(stub_driver["full"])
    assert by["env"]["driver_held_by"].startswith("pid ")
    assert {r["status"] for n, r in by.items() if n.startswith("sanitizer:")} <= {"skipped",
                                                                                  "pass", "fail"}
    assert by["model:mixtral-f32"]["status"] == "fail"  # nothing computed: zeros
    text = (out / "report.txt").read_text()
    assert text.startswith("gpu-check: FAIL") and "[FAIL   ] model:mixtral-f32" in text


@pytest.mark.slow
def test_gpu_check_killed_midway_keeps_every_finished_step(prepared: Path, stub_driver,
                                                          tmp_path: Path):
    """A call killed part way (SIGKILL, as a device command past its limit is): report.jsonl
    holds one valid JSON line per step finished before the kill, report.txt shows them (but the
    last, when the kill fell between the two writes)."""
    out = tmp_path / "out"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STUB_", "COLIBRI_CUDA_"))}
    env.update(COLIBRI_LIBCUDA=str(stub_driver["full"]), STUB_SM="90")
    p = subprocess.Popen([str(GPU_CHECK), str(prepared), "--call", "1", "--out", str(out)],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         start_new_session=True)
    report = out / "report.jsonl"
    try:
        while p.poll() is None:  # an event, not a deadline: the fifth finished step
            if report.exists() and sum(1 for ln in report.read_text().splitlines()
                                       if '"step"' in ln) >= 5:
                break
            time.sleep(0.05)
        assert p.poll() is None, "the call finished before five steps were seen"
        os.killpg(p.pid, signal.SIGKILL)  # the runner and what it runs (all started here)
    finally:
        p.wait()
    recs = _records(report)  # every line parses: none was half-written
    steps = [r["step"] for r in recs if "step" in r]
    assert len(steps) >= 5 and steps == _planned(prepared)[:len(steps)]
    assert not any(r.get("event") == "end" for r in recs)  # the call did not end
    # report.txt is rewritten after each JSON line is on disk: it may lag by the last step
    text = (out / "report.txt").read_text()
    assert all(f"] {s} " in text for s in steps[:-1])


def test_gpu_check_step_timeout_and_call_budget(tmp_path: Path):
    """A step's command still running at the step's deadline is killed and the step recorded
    as timed out; a plan whose call budget is spent records the rest as not run."""
    _, run = _scripts()
    r = run.Runner(tmp_path, tmp_path)
    r.deadline = time.monotonic() + 0.3
    t0 = time.monotonic()
    with pytest.raises(run.StepTimeout, match="still running at the step's deadline"):
        r.run("5", program="sleep")
    assert time.monotonic() - t0 < 4
    assert run.summary([{"step": "a", "status": "pass"}, {"step": "b", "status": "not-run"},
                        {"step": "c", "status": "figure"}]) == (1, 2)


@pytest.mark.slow
def test_gpu_check_passes_in_emulation_and_flags_wrong_results(cuda_host_build, tmp_path: Path):
    """The run half's whole plan through the stand-in driver executing the kernels in the host
    emulation (slow: a block's threads take turns on one core, so a selection of models, small bench sizes, a few
    kernel checks and scaled step timeouts, all prepare-time settings; the run takes none):
    mixtral-f32 and the three coverage models (1024 positions with a prompt over 3 KV ranges,
    32 experts unfused, odd dimensions on 2 streams) pass every check against the CPU, bit for
    bit equal where the plan compares bits; a copy of mixtral-f32 with one expected logit moved
    by 10x the tolerance and another first greedy id fails exactly its model step."""
    small = tmp_path / "g"
    proc = _gpu_check("--prepare", small, "--binary", cuda_host_build["binary"], "--models",
                      "mixtral-f32,cov-*", "--bench", "4 2 1", "--large-args", TINY_SYNTH,
                      "--kernels", "embed-F16-37,linear-F32-37,linear_mma-F32-37,"
                      "ffn_route-F32-8-2-40,attention_prefill-20", "--gemv",
                      "--rows 64 --cols 64 --mib 1 --iters 2", "--timeout-scale", "40",
                      "--call-budget", "5000 5000")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    manifest = json.loads((small / "manifest.json").read_text())
    good = next(m for m in manifest["models"] if m["name"] == "mixtral-f32")
    # an expected first greedy id the model does not pick (the ids are fed back as the decode
    # steps' inputs, so it must be a valid one)
    bad = dict(good, name="mixtral-f32-wrong", logits="expected/wrong.f32",
               greedy_new_ids=[(good["greedy_new_ids"][0] + 1) % good["vocab"]] +
               good["greedy_new_ids"][1:])
    logits = np.fromfile(small / good["logits"], "<f4")
    logits[7] += 10 * bad["tolerance"] * np.abs(logits).max()
    logits.tofile(small / bad["logits"])
    manifest["models"].insert(1, bad)
    (small / "manifest.json").write_text(json.dumps(manifest))
    proc = _gpu_check(small, COLIBRI_LIBCUDA=str(cuda_host_build["libcuda"]), STUB_SM="90")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    recs = {r["step"]: r for r in _records(small / "report.jsonl") if "step" in r}
    failed = sorted(n for n, r in recs.items() if r["status"] not in ("pass", "info", "figure",
                                                                      "skipped"))
    assert failed == ["model:mixtral-f32-wrong"], {n: recs[n] for n in failed}
    wrong = recs["model:mixtral-f32-wrong"]
    assert not wrong["logits_ok"] and not wrong["greedy_ok"]
    assert recs["model:mixtral-f32"]["prefill_rel_err"] <= 1e-4
    assert recs["device"]["cuda_image"] == "cubin" and recs["device"]["cuda_prefill"] == "mma"
    det = recs["det:mixtral-f32"]
    assert det["bits"] == {"again": "same", "no graph": "same", "fuse route 0": "same",
                           "2 streams": "same"} and det["short_prompt"]["ok"], det
    assert recs["kernels"]["checks"] > 5 and recs["kernels"]["failed"] == 0
    for name, variant in (("cov-long-context", "no graph"), ("cov-32-experts", "fuse route 1"),
                          ("cov-odd-2-streams", "1 stream")):
        r = recs[f"coverage:{name}"]
        assert r["status"] == "pass" and r["bits"] == {variant: "same"}, r
    assert recs["bench:mixtral-f32"]["decode"]["no graph"]["us_per_call"] > 0
    assert recs["large"]["decode_tok_s"] > 0 and isinstance(recs["large"]["goal_met"], bool)
    assert recs["gemv"]["gemv"]["f16"]["gbps"] > 0
    text = (small / "report.txt").read_text()
    assert "greedy: got" in text and "of copy bandwidth; goal >= 50%" in text


def test_gpu_check_bytes_per_token_counts_active_weights(tmp_path: Path):
    """The run script's bytes per decoded token: every tensor once, one embedding row, top_k/E
    of the routed experts (+ int8 row scales), from the tensor table."""
    from colibri_kit.model.format import Kind, read_model

    _, run = _scripts()
    model = tmp_path / "m.colibri"
    _random_model(model, 0b000001, 3, 16)  # shared expert, int8
    m = read_model(model)
    h = m.header
    want = 0
    for (kind, _layer, _expert), rec in m.records.items():
        size = rec.nbytes + rec.scale_nbytes
        if kind == Kind.TOK_EMBED:
            want += size // rec.rows
        elif kind in (Kind.EXPERT_W1, Kind.EXPERT_W2, Kind.EXPERT_W3):
            want += size * h.top_k / h.num_experts
        else:
            want += size
    assert run.decode_bytes_per_token(model) == int(want)


def test_gpu_check_predicts_the_models_launches_for_synth_geometries(tmp_path: Path):
    """The run script predicts the large model's driver calls per token from its header and the
    manifest's fixed + per-layer counts (it has only the standard library); for every layer
    count, with and without the attention merge past one KV range, they are the performance
    model's (benchmarks/gpu_model.py, itself checked against the backend's launches)."""
    from colibri_kit.model.format import DType, ModelHeader, padded_dim

    prep, run = _scripts()
    gm = prep.gpu_model()
    base = ModelHeader(num_experts=8, expert_size=64, vocab_size=256, max_seq_len=32, embed_dim=64,
                       n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32, top_k=2, routing=0,
                       dtype=int(DType.F16), embed_dim_pad=padded_dim(64, 64), pad_multiple=64)
    pm = prep.perf_model(gm, base)
    from dataclasses import replace

    for layers in (1, 2, 8, 32):
        for seq in (32, 256, 257, 4096):
            h = replace(base, n_layers=layers, max_seq_len=seq)
            path = tmp_path / f"h{layers}_{seq}.colibri"
            path.write_bytes(h.pack())  # the run script reads the header only
            assert run.synth_launches(path, pm) == prep.launches(gm, h), (layers, seq)
    # the prediction is the larger bound, as gpu_model.expected_us decides it
    n = prep.launches(gm, replace(base, n_layers=8))
    assert run.predict_ms(n, 0, None, pm, False) == \
        ((n["kernels"] + n["copies"]) * pm["launch_us"] / 1e3, "launch")
    assert run.predict_ms(n, 10**9, 100.0, pm, True) == (10.0, "bandwidth")  # 1 GB at 100 GB/s


def test_gpu_check_run_refuses_an_unprepared_directory(tmp_path: Path):
    proc = _gpu_check(tmp_path)
    assert proc.returncode == 2 and "is not a prepared directory" in proc.stderr


def test_product_package_loads_nothing_from_tests_scripts_or_benchmarks():
    """colibri_kit (the product) runs the GPU check's tools by path; it imports none of them."""
    bad = []
    for path in (ROOT / "colibri_kit").rglob("*.py"):
        text = path.read_text()
        if re.search(r"^\s*(from|import)\s+(tests|scripts|benchmarks)\b", text, re.M) or \
                re.search(r"spec_from_file_location\(", text):
            bad.append(str(path.relative_to(ROOT)))
    assert bad == [], bad


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["f16", "int8"])
def test_synth_writes_a_valid_deterministic_model(host_colibri: Path, tmp_path: Path, dtype: str):
    """`colibri synth` (the GPU check's large model, written on the GPU machine): the kit's reader
    accepts the file, the CPU forward matches the NumPy reference on it, and the same options
    and seed give the same bytes (another seed does not)."""
    from colibri_kit.model.format import read_model
    from colibri_kit.model.reference import Reference

    args = TINY_SYNTH.split() + ["--dtype", dtype]
    paths_ = [tmp_path / f"{name}.colibri" for name in ("a", "b", "c")]
    for path, seed in zip(paths_, ("7", "7", "8")):
        proc = subprocess.run([str(host_colibri), "synth", str(path), *args, "--seed", seed],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout)["file_bytes"] == path.stat().st_size
    a, b, c = (p.read_bytes() for p in paths_)
    assert a == b and a != c
    from colibri_kit.model.format import DType

    model = read_model(paths_[0])
    assert model.header.dtype == int(DType.parse(dtype)) and model.header.n_layers == 1
    ids = [1, 5, 9, 2]
    out = tmp_path / "l.f32"
    proc = subprocess.run([str(host_colibri), "--backend", "cpu", "forward", str(paths_[0]),
                           "--ids", ",".join(map(str, ids)), "--logits-out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    got = np.fromfile(out, "<f4").reshape(len(ids), -1)
    want = Reference(paths_[0]).forward(ids)
    assert np.abs(got - want).max() <= 1e-4 * np.abs(want).max()
