"""The f16 KV cache option (`colibri --kv-cache f16`, colibri_options.kv_dtype; docs/runtime.md
"Memory"): logits against the NumPy reference that rounds K and V to float16, bitwise equal on
any thread count, greedy generation (prefill then decode) equal to the reference's, the arena and
footprint numbers, the profile's service key, the CLI flag on every command, bad values refused,
and the CUDA backend storing it too (the emulated GPU against the CPU's f16 cache).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from serve_support import Server
from test_cuda_host import _emu_cli

from colibri_kit.errors import ModelError, ProfileError
from colibri_kit.model.footprint import (
    cpu_arena_bytes, cuda_arena_bytes, footprint, kv_cache_bytes, model_footprint,
)
from colibri_kit.model.format import DType, Flag, ModelHeader, Routing, padded_dim, read_model
from colibri_kit.model.reference import Reference
from colibri_kit.model.tiny import write_random_model, write_tiny_model
from colibri_kit.paths import project_root
from colibri_kit.profiles import load_profile
from colibri_kit.service import ServiceError, ServiceSpec, parse_service

PAD = 64  # the host profile's embed_pad
# max |C - reference| / max |reference logit|, both with K/V rounded to float16. Looser than the
# f32 path's 1e-5: the runtime and NumPy compute K and V in f32 with different summation orders,
# so a value within ~1e-7 of a half-way point between two halves may round the other way in one of
# them (one half ulp, 2^-11 relative, on that element). Measured on these models: 1.9e-7..7.4e-6
# (the 150-token one is the largest); the f32-cache reference is 1.8e-4..3.2e-4 away, so the bound
# tells the two apart (asserted below).
F16_KV_TOL = 3e-5
PROMPT = [1, 5, 9, 200, 3, 7, 11, 42, 0, 255, 17, 99]


def header(**kw: object) -> ModelHeader:
    d = int(kw.pop("embed_dim", 72))  # type: ignore[arg-type]
    base = dict(num_experts=6, expert_size=40, vocab_size=300, max_seq_len=48, embed_dim=d,
                n_layers=2, n_heads=6, n_kv_heads=2, head_dim=10, top_k=2,
                routing=Routing.RENORMALISE, dtype=int(DType.F32), embed_dim_pad=padded_dim(d, PAD),
                pad_multiple=PAD, flags=0, norm_eps=1e-6, rope_theta=5000.0, name="random")
    base.update(kw)
    return ModelHeader(**base)  # type: ignore[arg-type]


def run(binary: Path, *args: str, check: bool = True, env: dict | None = None
        ) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=300, env=env)
    if check and proc.returncode != 0:
        raise AssertionError(f"colibri {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def c_logits(binary: Path, model: Path, ids: list[int], out: Path, *extra: str) -> np.ndarray:
    run(binary, "--backend", "cpu", *extra, "forward", str(model), "--ids", ",".join(map(str, ids)),
        "--logits-out", str(out))
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("kv-f16-models")
    return {
        "tiny-f16": write_tiny_model(root / "tiny.colibri", pad=PAD, dtype=DType.F16),
        "gqa-int8": write_random_model(root / "gqa.colibri", header(dtype=int(DType.INT8)), seed=3),
        "shared-bias-qknorm": write_random_model(root / "sb.colibri", header(
            embed_dim=40, routing=Routing.PLAIN, shared_expert_size=24, num_experts=8, top_k=3,
            flags=int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS
                      | Flag.QK_NORM_FULL)), seed=4),
        # 150 tokens: three prefill chunks of the runtime (64), head_dim 18 (SIMD tails)
        "long-mqa": write_random_model(root / "long.colibri", header(
            max_seq_len=160, n_heads=4, n_kv_heads=1, head_dim=18), seed=5),
    }


def prompt_for(name: str) -> list[int]:
    if name == "long-mqa":
        return [(i * 37 + 11) % 300 for i in range(150)]
    return [i % 256 for i in PROMPT]


# ---- numerics -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["tiny-f16", "gqa-int8", "shared-bias-qknorm", "long-mqa"])
def test_f16_kv_matches_the_reference_that_rounds_kv(host_colibri: Path, models: dict[str, Path],
                                                     tmp_path: Path, name: str) -> None:
    ids = prompt_for(name)
    got = c_logits(host_colibri, models[name], ids, tmp_path / "h.bin", "--kv-cache", "f16",
                   "--threads", "2")
    want = Reference(models[name], kv_dtype="f16").forward(ids)
    assert got.shape == want.shape
    assert rel_err(got, want) < F16_KV_TOL, name
    assert rel_err(got, Reference(models[name]).forward(ids)) > 3 * F16_KV_TOL, name  # rounding seen
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1)), name
    # the option does something: the f32 cache gives other logits
    f32 = c_logits(host_colibri, models[name], ids, tmp_path / "f.bin", "--threads", "2")
    assert not np.array_equal(got, f32)


@pytest.mark.parametrize("name", ["shared-bias-qknorm", "long-mqa"])
def test_f16_kv_bitwise_identical_across_threads(host_colibri: Path, models: dict[str, Path],
                                                 tmp_path: Path, name: str) -> None:
    ids = prompt_for(name)
    outs = []
    for i, threads in enumerate(["1", "2", "3"]):
        c_logits(host_colibri, models[name], ids, tmp_path / f"{i}.bin", "--kv-cache", "f16",
                 "--threads", threads)
        outs.append((tmp_path / f"{i}.bin").read_bytes())
    assert outs[1] == outs[0] and outs[2] == outs[0]


def test_f16_kv_greedy_generation_matches_the_reference(host_colibri: Path, models: dict[str, Path]
                                                        ) -> None:
    """generate prefills the prompt in one call, then decodes one token per call: the ids are the
    reference's (which runs one token at a time) on 1 and 3 threads."""
    model = models["gqa-int8"]
    prompt = [3, 14, 15, 92, 65]
    want = Reference(model, kv_dtype="f16").generate(prompt, 24)
    for threads in ("1", "3"):
        out = json.loads(run(host_colibri, "--backend", "cpu", "--threads", threads, "--kv-cache",
                             "f16", "generate", str(model), "--ids", ",".join(map(str, prompt)),
                             "--max-new", "24").stdout)
        assert out["new_ids"] == want, threads


def test_selftest_checks_rounding_and_prefill_equals_decode(host_colibri: Path) -> None:
    """`colibri selftest` (also run on every device after a deploy): the f32 -> f16 rounding of
    the kernel family in use against the scalar one and IEEE cases, and the synthetic models with
    an f16 cache, 1 vs 3 threads and prefill vs decode bitwise equal; under each SIMD level."""
    for level in ("", "avx2", "scalar"):
        proc = run(host_colibri, "selftest", env={**os.environ, "COLIBRI_CPU_SIMD": level})
        lines = proc.stdout.splitlines()
        kv = [ln for ln in lines if "f16 KV" in ln]
        assert len([ln for ln in kv if "rounding" in ln]) == 3, lines
        assert len([ln for ln in lines if "f16 KV cache: finite" in ln]) == 4, lines
        assert all(ln.startswith("ok") for ln in kv), kv


# ---- memory -------------------------------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 3])
def test_arena_shrinks_by_half_the_kv_cache(host_colibri: Path, models: dict[str, Path],
                                            threads: int) -> None:
    for name in ("tiny-f16", "long-mqa", "shared-bias-qknorm"):
        h = read_model(models[name]).header
        got = {}
        for kv in ("f32", "f16"):
            info = json.loads(run(host_colibri, "--backend", "cpu", "--threads", str(threads),
                                  "--kv-cache", kv, "info", str(models[name])).stdout)["backend"]
            assert info["kv_dtype"] == kv
            assert info["arena_bytes"] == cpu_arena_bytes(h, threads, kv_dtype=kv), (name, kv)
            assert info["kv_cache_bytes"] == kv_cache_bytes(h, kv), (name, kv)
            got[kv] = info
        assert got["f16"]["kv_cache_bytes"] * 2 == got["f32"]["kv_cache_bytes"]
        saved = got["f32"]["arena_bytes"] - got["f16"]["arena_bytes"]
        half = kv_cache_bytes(h) // 2
        assert half - 128 <= saved <= half + 128, (name, saved, half)  # 64-byte alignment of two buffers


def test_footprint_with_an_f16_cache(tmp_path: Path) -> None:
    # Mixtral-8x7B-like geometry at 32K context: the KV cache is what f16 halves
    h = header(embed_dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
               num_experts=8, top_k=2, expert_size=14336, vocab_size=32000, max_seq_len=32768,
               dtype=int(DType.Q4))
    f32 = footprint(h, load_profile("host"), slots=2)
    f16 = footprint(h, load_profile("host"), slots=2, kv_dtype="f16")
    assert f32.kv_dtype == "f32" and f16.kv_dtype == "f16"
    assert f32.kv_cache == 2 * 32 * 32768 * 8 * 128 * 4 and f16.kv_cache * 2 == f32.kv_cache
    assert f32.total - f16.total == 2 * (f32.arena - f16.arena)
    assert f32.arena - f16.arena == f16.kv_cache
    assert f16.to_json()["kv_dtype"] == "f16" and "f16" in f16.line()
    # a CUDA target plans an f16 cache in the device arena: half the cache's bytes saved there
    nx = footprint(h, load_profile("agx-orin"), kv_dtype="f16")
    assert nx.backend == "cuda" and nx.arena == cuda_arena_bytes(h, kv_dtype="f16")
    assert footprint(h, load_profile("agx-orin")).arena - nx.arena == kv_cache_bytes(h, "f16")
    with pytest.raises(ModelError, match="kv_dtype must be one of f32, f16, got 'q8'"):
        footprint(h, load_profile("host"), kv_dtype="q8")
    with pytest.raises(ModelError, match="kv_dtype must be one of f32, f16"):
        Reference(write_tiny_model(tmp_path / "t.colibri", pad=PAD), kv_dtype="bf16")


def test_invoke_model_info_kv_cache(tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "t.colibri", pad=PAD, dtype=DType.Q4)
    cmd = [sys.executable, "-m", "invoke", "model-info", str(model), "--kv-cache", "f16"]
    env = {**os.environ, "PYTHONPATH": str(project_root())}
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=project_root(), env=env)
    assert r.returncode == 0, r.stderr
    by = {f["target"]: f for f in json.loads(r.stdout)["footprint"]}
    for t, f in by.items():
        fp = model_footprint(model, load_profile(t), kv_dtype="f16")
        assert f["kv_dtype"] == "f16" and f["backend"] == fp.backend
        assert f["kv_cache_bytes"] == fp.kv_cache == kv_cache_bytes(read_model(model).header) // 2
        assert f["total_bytes"] == fp.total
    bad = subprocess.run([*cmd[:-1], "f8"], capture_output=True, text=True, timeout=300,
                         cwd=project_root(), env=env)
    assert bad.returncode != 0 and "kv_dtype must be one of f32, f16, got 'f8'" in bad.stderr


def test_service_kv_cache_key() -> None:
    spec = parse_service({"kv_cache": "f16", "backend": "cpu"})
    args = spec.serve_args()
    assert args[args.index("--kv-cache") + 1] == "f16"
    assert "--kv-cache" not in ServiceSpec().serve_args()  # default: the unit is unchanged
    auto = parse_service({"kv_cache": "f16"}).serve_args()  # any backend: CUDA stores f16 too
    assert auto[auto.index("--kv-cache") + 1] == "f16"
    with pytest.raises(ProfileError, match="service.kv_cache: 'q8' is not one of f32, f16"):
        parse_service({"kv_cache": "q8", "backend": "cpu"})
    with pytest.raises(ServiceError, match="kv_cache: 'f8' is not one of f32, f16"):
        ServiceSpec(kv_cache="f8")


# ---- CLI ---------------------------------------------------------------------------------------

def test_bad_kv_cache_values_are_usage_errors(host_colibri: Path, models: dict[str, Path]) -> None:
    model = str(models["tiny-f16"])
    for args in (["--kv-cache", "f8", "info", model], ["--kv-cache", "F16", "forward", model, "--ids", "1"],
                 ["generate", model, "--ids", "1", "--max-new", "1", "--kv-cache", "bf16"],
                 ["serve", model, "--kv-cache", "q4"], ["bench-contexts", model, "--kv-cache", ""],
                 ["info", model, "--kv-cache"]):
        proc = run(host_colibri, *args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "usage:" in proc.stderr
        if args[-1] != "--kv-cache":
            assert "--kv-cache must be f32 or f16" in proc.stderr, (args, proc.stderr)


def test_every_command_takes_the_flag(host_colibri: Path, models: dict[str, Path]) -> None:
    model = str(models["gqa-int8"])
    bench = json.loads(run(host_colibri, "--backend", "cpu", "--kv-cache", "f16", "bench", model,
                           "--prompt-len", "8", "--gen", "4", "--runs", "1", "--json").stdout)
    assert bench["backend"]["kv_dtype"] == "f16"
    bc = run(host_colibri, "bench-contexts", model, "--contexts", "2", "--gen", "2", "--kv-cache",
             "f16", "--json")
    assert bc.returncode == 0
    prompt = [3, 14, 15, 92, 65]
    srv = Server(host_colibri, models["gqa-int8"], "--backend", "cpu", "--kv-cache", "f16").start()
    try:
        ready = next(json.loads(ln) for ln in srv.lines if '"event": "ready"' in ln)
        assert ready["kv_cache"] == "f16" and ready["backend"] == "cpu"
        status, _, body = srv.call("POST", "/v1/completions", {
            "model": "gqa", "prompt": prompt, "max_tokens": 6, "temperature": 0})
        assert status == 200, body
    finally:
        assert srv.stop() == 0
    assert json.loads(body)["choices"][0]["token_ids"] == \
        Reference(models["gqa-int8"], kv_dtype="f16").generate(prompt, 6)


def test_f16_cache_without_a_driver_runs_on_the_cpu(host_colibri: Path, models: dict[str, Path]
                                                    ) -> None:
    """No NVIDIA driver here: --backend cuda with an f16 cache fails for that reason only (one
    line), auto runs the f16 cache on the CPU and says why CUDA was not used."""
    model = str(models["tiny-f16"])
    env = {k: v for k, v in os.environ.items() if k != "COLIBRI_LIBCUDA"}
    env["COLIBRI_LIBCUDA"] = "libcuda.so.1-absent"  # the no-driver path, on a GPU box too
    proc = run(host_colibri, "--backend", "cuda", "--kv-cache", "f16", "info", model, check=False,
               env=env)
    assert proc.returncode == 1
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "not found (no NVIDIA driver)" in proc.stderr and "KV cache" not in proc.stderr
    info = json.loads(run(host_colibri, "--kv-cache", "f16", "info", model, env=env).stdout)["backend"]
    assert info["name"] == "cpu" and info["kv_dtype"] == "f16"
    assert "not found (no NVIDIA driver)" in info["fallback_reason"]


def test_deploy_memory_check_counts_the_service_kv_cache(tmp_path: Path) -> None:
    """The deploy's lower bound on the device (weights + KV cache) uses the service's kv_cache, so
    an f16 service is not refused for memory only an f32 cache would need."""
    from colibri_kit.fleet.deploy import model_footprint as device_parts

    model = write_tiny_model(tmp_path / "t.colibri", pad=PAD)
    h = read_model(model).header
    size = model.stat().st_size
    f32, f16 = device_parts(model, size), device_parts(model, size, "f16")
    key = f"KV cache at {h.max_seq_len} tokens"
    assert f32 == {"weights": size, key: kv_cache_bytes(h)}
    assert f16 == {"weights": size, key: kv_cache_bytes(h, "f16")}


def _emu_logits(build, model: Path, ids: list[int], out: Path, *extra: str, **env: str
                ) -> np.ndarray:
    proc = _emu_cli(build, *extra, "forward", str(model), "--ids", ",".join(map(str, ids)),
                    "--logits-out", str(out), **env)
    assert proc.returncode == 0, proc.stderr
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


# max |GPU - CPU| / max |CPU logit|, both with an f16 cache: the documented f32 tolerance
# (docs/cuda.md); a K or V element within rounding of a half-way point may round the other way
# on one side (one half ulp on that element), which is far inside it on these models.
GPU_F16_TOL = 1e-4


@pytest.mark.slow
def test_f16_cache_on_the_emulated_gpu_matches_the_cpus(cuda_host_build, models: dict[str, Path],
                                                        tmp_path: Path) -> None:
    """The emulated GPU of tests/test_cuda_host.py (a real sm_90 build, libcuda stand-in with CUDA
    thread emulation) stores K and V as f16 with --kv-cache f16 on --backend cuda and auto: info
    reports it, the device arena is the planner's (the cache at 2 bytes a value, half the f32
    one's), the logits (prefill over two device passes: tiled attention over f16 tiles) are the
    CPU f16 cache's within tolerance, not the f32 cache's bits, and the same bits run to run."""
    model = models["shared-bias-qknorm"]
    h = read_model(model).header
    weights = model.stat().st_size - h.data_offset
    infos = {}
    for kv in ("f32", "f16"):
        proc = _emu_cli(cuda_host_build, "--backend", "auto", "--kv-cache", kv, "info", str(model))
        assert proc.returncode == 0, proc.stderr
        infos[kv] = json.loads(proc.stdout)["backend"]
        assert infos[kv]["name"] == "cuda" and infos[kv]["kv_dtype"] == kv
        assert infos[kv]["kv_cache_bytes"] == kv_cache_bytes(h, kv)
        assert infos[kv]["cuda_device_bytes"] == cuda_arena_bytes(h, True, weights, kv)
    assert infos["f32"]["cuda_device_bytes"] - infos["f16"]["cuda_device_bytes"] == \
        kv_cache_bytes(h, "f16")
    ids = [(i * 37 + 11) % 300 for i in range(34)]  # 34 tokens: device passes of 32 + 2
    cpu = c_logits(cuda_host_build["binary"], model, ids, tmp_path / "c.bin", "--kv-cache", "f16")
    gpu = _emu_logits(cuda_host_build, model, ids, tmp_path / "g.bin", "--backend", "cuda",
                      "--kv-cache", "f16")
    assert rel_err(gpu, cpu) < GPU_F16_TOL
    assert np.array_equal(gpu.argmax(axis=1), cpu.argmax(axis=1))
    again = _emu_logits(cuda_host_build, model, ids, tmp_path / "g2.bin", "--backend", "cuda",
                        "--kv-cache", "f16")
    assert np.array_equal(gpu.view(np.uint32), again.view(np.uint32))
    f32 = _emu_logits(cuda_host_build, model, ids, tmp_path / "g32.bin", "--backend", "cuda")
    # the option reaches the GPU's cache: its f32 cache is much further from the CPU's f16 one
    # (measured: 2.8e-5 with f16 on both sides, 2.6e-4 with the GPU's f32 cache)
    assert rel_err(f32, cpu) > 3 * rel_err(gpu, cpu)


@pytest.mark.slow
def test_f16_cache_decode_graph_on_the_emulated_gpu(cuda_host_build, models: dict[str, Path]
                                                    ) -> None:
    """generate with an f16 cache on the emulated GPU: prefill, then one CUDA-graph launch per
    decoded token reading the f16 cache; the greedy ids are the CPU f16 cache's."""
    model = str(models["gqa-int8"])
    prompt = [3, 14, 15, 92, 65]
    got = {}
    for backend in ("cpu", "cuda"):
        proc = _emu_cli(cuda_host_build, "--backend", backend, "--kv-cache", "f16", "generate",
                        model, "--ids", ",".join(map(str, prompt)), "--max-new", "6")
        assert proc.returncode == 0, proc.stderr
        got[backend] = json.loads(proc.stdout)["new_ids"]
    assert got["cuda"] == got["cpu"] and len(got["cpu"]) == 6
