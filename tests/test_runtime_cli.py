"""The C runtime through its CLI (dist/host/bin/colibri, the product build), against the NumPy
reference (colibri_kit.model.reference) on the built-in tiny model and on random models written
with the kit's writer: every dtype, both routing semantics, shared expert with gate, QKV bias,
per-head and full-width q/k norms, tied embeddings, GQA, hidden sizes that are not a multiple of
the pad. Also: bitwise determinism across thread counts, greedy generation, bad input (each a
clean exit 1 with one line, each thing said once), usage errors (exit 2), the command table
(every command's --help, the global options before or after any command), `info` (the layer
list), `bench --json` and `selftest`.
"""

from __future__ import annotations

import json
import re
import struct
import subprocess
from pathlib import Path

import numpy as np
import pytest

from colibri_kit.model.format import DType, Family, Flag, ModelHeader, Routing, padded_dim
from colibri_kit.model.reference import Reference
from colibri_kit.model.tiny import write_random_model, write_tiny_model

PAD = 64  # the host profile's embed_pad (COLIBRI_EMBED_DIM_PAD of dist/host)
F32_TOL = 1e-5  # max |C - reference| relative to max |reference logit|
INT8_ACT_TOL = 5e-2  # --int8-act: activations quantised per token (docs/runtime.md)
PROMPT = [1, 5, 9, 200, 3, 7, 11, 42, 0, 255, 17, 99]


def run(binary: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"colibri {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def c_logits(binary: Path, model: Path, ids: list[int], out: Path, *extra: str) -> np.ndarray:
    run(binary, *extra, "forward", str(model), "--ids", ",".join(map(str, ids)), "--logits-out", str(out))
    return np.fromfile(out, dtype="<f4").reshape(len(ids), -1)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.max(np.abs(got - want)) / np.max(np.abs(want)))


def header(**kw: object) -> ModelHeader:
    d = int(kw.pop("embed_dim", 72))  # type: ignore[arg-type]
    base = dict(num_experts=6, expert_size=40, vocab_size=300, max_seq_len=48, embed_dim=d,
                n_layers=2, n_heads=6, n_kv_heads=2, head_dim=10, top_k=2,
                routing=Routing.RENORMALISE, dtype=int(DType.F32), embed_dim_pad=padded_dim(d, PAD),
                pad_multiple=PAD, flags=0, norm_eps=1e-6, rope_theta=5000.0, family=Family.OTHER,
                name="random")
    base.update(kw)
    return ModelHeader(**base)  # type: ignore[arg-type]


# name -> header: each case turns on features the tiny model lacks.
CASES = {
    "gqa-renorm": header(),
    "shared-gate-bias-plain": header(
        embed_dim=40, routing=Routing.PLAIN, shared_expert_size=24, num_experts=8, top_k=3,
        flags=int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS)),
    "qknorm-head": header(embed_dim=64, head_dim=16, n_heads=4, n_kv_heads=4,
                          flags=int(Flag.QK_NORM_HEAD)),
    "qknorm-full-tied-plain": header(embed_dim=100, routing=Routing.PLAIN, num_experts=16, top_k=4,
                                     flags=int(Flag.QK_NORM_FULL | Flag.TIED_EMBEDDINGS)),
    "shared-nogate-mqa": header(n_heads=4, n_kv_heads=1, head_dim=18, shared_expert_size=32,
                                flags=int(Flag.SHARED_EXPERT)),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("runtime-models")
    out: dict[str, Path] = {}
    for dt in ("f32", "f16", "bf16", "int8"):
        out[f"tiny-{dt}"] = write_tiny_model(root / f"tiny-{dt}.colibri", pad=PAD, dtype=DType.parse(dt))
    for i, (name, h) in enumerate(CASES.items()):
        for dt in ("f32", "int8"):
            hh = ModelHeader(**{**h.__dict__, "dtype": int(DType.parse(dt))})
            out[f"{name}-{dt}"] = write_random_model(root / f"{name}-{dt}.colibri", hh, seed=100 + i)
    return out


# ---- numerics against the reference -----------------------------------------------------------

@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16", "int8"])
def test_tiny_logits_match_reference(host_colibri: Path, models: dict[str, Path], tmp_path: Path,
                                     dtype: str) -> None:
    model = models[f"tiny-{dtype}"]
    want = Reference(model).forward(PROMPT)
    got = c_logits(host_colibri, model, PROMPT, tmp_path / "l.bin")
    # The reference dequantises the same stored weights, so every dtype meets the f32 bound.
    assert got.shape == want.shape
    assert rel_err(got, want) < F32_TOL


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("dtype", ["f32", "int8"])
def test_random_models_match_reference(host_colibri: Path, models: dict[str, Path], tmp_path: Path,
                                       case: str, dtype: str) -> None:
    model = models[f"{case}-{dtype}"]
    ids = [i % 300 for i in PROMPT]
    want = Reference(model).forward(ids)
    got = c_logits(host_colibri, model, ids, tmp_path / "l.bin", "--threads", "2")
    assert rel_err(got, want) < F32_TOL, case
    assert np.array_equal(got.argmax(axis=1), want.argmax(axis=1))


def test_int8_activations_documented_tolerance(host_colibri: Path, models: dict[str, Path],
                                              tmp_path: Path) -> None:
    model = models["tiny-int8"]
    want = Reference(model).forward(PROMPT)
    got = c_logits(host_colibri, model, PROMPT, tmp_path / "l.bin", "--int8-act")
    exact = c_logits(host_colibri, model, PROMPT, tmp_path / "e.bin")
    err = rel_err(got, want)
    assert 0 < err < INT8_ACT_TOL  # different from the f32-activation path, but close
    assert rel_err(exact, want) < F32_TOL
    assert np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.9


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_greedy_generate_matches_reference(host_colibri: Path, models: dict[str, Path],
                                          dtype: str) -> None:
    model = models[f"tiny-{dtype}"]
    prompt = [3, 17, 42, 5, 99, 7, 11, 64]
    want = Reference(model).generate(prompt, 32)
    out = json.loads(run(host_colibri, "generate", str(model), "--ids", ",".join(map(str, prompt)),
                         "--max-new", "32").stdout)
    assert out["new_ids"] == list(want)
    assert out["ids"] == prompt + list(want)


def test_prefill_in_chunks_equals_one_call(host_colibri: Path, tmp_path: Path) -> None:
    """A prompt longer than the runtime's 512-token chunk (runtime/src/core/context.h
    COLIBRI_CHUNK), with top-4 of 6 experts so a chunk's 2048 expert slots go through several
    expert passes (COLIBRI_MOE_SLOTS 1024, layers/moe_experts.c): same logits as the reference,
    and prefill == decode bits."""
    model = write_random_model(tmp_path / "long.colibri", header(max_seq_len=1200, top_k=4), seed=7)
    ids = [(i * 37 + 11) % 300 for i in range(1100)]
    want = Reference(model).forward(ids)
    got = c_logits(host_colibri, model, ids, tmp_path / "l.bin")
    assert rel_err(got, want) < F32_TOL
    # colibri_forward_last (what generate and bench run for a prompt): the LM head for the last
    # token only, three chunks, any thread count: the bits of the full forward's last row
    for threads in ("1", "3"):
        out = tmp_path / f"last{threads}.bin"
        run(host_colibri, "--threads", threads, "forward", str(model), "--ids", ",".join(map(str, ids)),
            "--last", "--logits-out", str(out))
        last = np.fromfile(out, dtype="<f4")
        assert last.shape == (300,) and last.tobytes() == got[-1].tobytes()
    # any thread count, and a 500-token prompt then token-by-token decode past the chunk edge
    two = c_logits(host_colibri, model, ids, tmp_path / "t2.bin", "--threads", "2")
    assert two.tobytes() == got.tobytes()
    out = tmp_path / "dec.bin"
    run(host_colibri, "--threads", "3", "forward", str(model), "--ids", ",".join(map(str, ids[:560])),
        "--decode-from", "500", "--logits-out", str(out))
    assert np.fromfile(out, dtype="<f4").tobytes() == got[:560].tobytes()


def test_attention_key_blocks(host_colibri: Path, tmp_path: Path) -> None:
    """Attention over blocks of 64 keys (layers/attention.c, kernels.h colibri_dot_rows and
    colibri_wsum_rows): head_dim 70 (a 64-lane strip of the value sum, then a tail) and 150
    positions (three key blocks): the reference's logits, and with f32 and f16 caches the same
    bits in one call as token by token, at 1 and 3 threads."""
    model = write_random_model(tmp_path / "hd70.colibri", header(max_seq_len=160, head_dim=70),
                               seed=11)
    ids = [(i * 41 + 3) % 300 for i in range(150)]
    got = c_logits(host_colibri, model, ids, tmp_path / "one.bin")
    assert rel_err(got, Reference(model).forward(ids)) < F32_TOL
    for kv in ("f32", "f16"):
        outs = []
        for threads, extra in (("1", []), ("3", ["--decode-from", "20"])):
            out = tmp_path / f"{kv}-{threads}.bin"
            run(host_colibri, "--threads", threads, "--kv-cache", kv, "forward", str(model), "--ids",
                ",".join(map(str, ids)), *extra, "--logits-out", str(out))
            outs.append(out.read_bytes())
        assert len(outs[0]) == 150 * 300 * 4 and outs[1] == outs[0]


def test_prefill_chunks_int8_activations(host_colibri: Path, tmp_path: Path) -> None:
    """The int8-activation rows of a multi-pass chunk (expert inputs in rows 0..slots-1, the
    shared expert's after them): one call == token-by-token decode, bit for bit, at 1 and 3
    threads, and the same bits as a prompt fed in pieces shorter than a chunk."""
    h = header(max_seq_len=1200, top_k=4, dtype=int(DType.INT8), shared_expert_size=24,
               flags=int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE))
    model = write_random_model(tmp_path / "long8.colibri", h, seed=3)
    ids = [(i * 53 + 5) % 300 for i in range(700)]
    outs = []
    for threads, extra in (("1", []), ("3", []), ("2", ["--decode-from", "480"])):
        out = tmp_path / f"q{threads}.bin"
        run(host_colibri, "--threads", threads, "--int8-act", "forward", str(model), "--ids",
            ",".join(map(str, ids)), *extra, "--logits-out", str(out))
        outs.append(out.read_bytes())
    assert len(outs[0]) == 700 * 300 * 4 and outs[1] == outs[0] and outs[2] == outs[0]


# ---- determinism --------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["shared-gate-bias-plain-f32", "qknorm-full-tied-plain-int8", "tiny-f16"])
def test_bitwise_identical_across_threads_and_runs(host_colibri: Path, models: dict[str, Path],
                                                   tmp_path: Path, name: str) -> None:
    ids = [i % 256 for i in PROMPT]
    outs = []
    for i, threads in enumerate(["1", "2", "2", "3"]):
        c_logits(host_colibri, models[name], ids, tmp_path / f"{i}.bin", "--threads", threads)
        outs.append((tmp_path / f"{i}.bin").read_bytes())
    assert all(o == outs[0] for o in outs[1:])


@pytest.mark.parametrize("name", ["tiny-f32", "tiny-f16", "tiny-bf16", "tiny-int8", "shared-gate-bias-plain-int8"])
def test_simd_levels_give_the_same_bits(host_colibri: Path, models: dict[str, Path], tmp_path: Path,
                                        name: str) -> None:
    """The AVX-512 kernels keep the AVX2 lane layout (docs/runtime.md, "Kernels"): a model gives
    the same logits bit for bit with the kernels capped at AVX2 (COLIBRI_CPU_SIMD=avx2) as with
    the best this CPU has, with f32 and with int8 activations; prefill == decode at both levels."""
    import os

    ids = [i % 256 for i in PROMPT]
    flags = [[], ["--int8-act"]] if name.endswith("int8") else [[]]
    for extra in flags:
        outs = {}
        for level in ("", "avx2"):
            env = {**os.environ, "COLIBRI_CPU_SIMD": level}
            out = tmp_path / f"{level or 'best'}.bin"
            subprocess.run([str(host_colibri), *extra, "forward", str(models[name]), "--ids",
                            ",".join(map(str, ids)), "--logits-out", str(out)], check=True, env=env,
                           timeout=120)
            outs[level] = out.read_bytes()
            gen = subprocess.run([str(host_colibri), *extra, "generate", str(models[name]), "--ids",
                                  ",".join(map(str, ids[:4])), "--max-new", "8"], check=True,
                                 env=env, timeout=120, capture_output=True, text=True)
            outs[level + "gen"] = json.loads(gen.stdout)["ids"]
        assert outs[""] == outs["avx2"], (name, extra)
        assert outs["gen"] == outs["avx2gen"], (name, extra)


# ---- CLI contract -------------------------------------------------------------------------------

def test_version_names_target_and_macros(host_colibri: Path) -> None:
    out = run(host_colibri, "--version").stdout
    assert "target=host" in out
    for macro in ("COLIBRI_EMBED_DIM_PAD=64", "COLIBRI_ROUTING_MODE=", "COLIBRI_TOP_K=",
                  "COLIBRI_MAX_EXPERTS=", "profile="):
        assert macro in out


def test_info_json(host_colibri: Path, models: dict[str, Path]) -> None:
    info = json.loads(run(host_colibri, "info", str(models["tiny-bf16"])).stdout)
    assert info["name"] == "tiny-moe-4e2r"
    assert (info["embed_dim"], info["embed_dim_pad"], info["pad_multiple"]) == (48, 64, 64)
    assert (info["num_experts"], info["top_k"], info["n_layers"], info["vocab_size"]) == (4, 2, 2, 256)
    assert info["dtype"] == "bf16" and info["routing"] == "renormalise"
    backend = info["backend"]
    for key in ("name", "threads", "cpu_simd", "arena_bytes", "fallback_reason", "cuda_device",
                "cuda_sm", "cuda_driver_version", "cuda_image", "cuda_weights", "cuda_integrated",
                "cuda_device_bytes", "cuda_prefill"):
        assert key in backend, key
    if backend["name"] == "cuda":  # a machine with a usable GPU
        assert backend["cuda_image"] in ("cubin", "ptx") and backend["cuda_sm"] > 0
        assert backend["cuda_weights"] in ("mapped", "copied") and backend["cuda_device_bytes"] > 0
    else:
        assert backend["name"] == "cpu" and backend["cuda_image"] == backend["cuda_weights"] == ""
        assert backend["cuda_prefill"] == ""
        assert "libcuda" in backend["fallback_reason"] or "CUDA" in backend["fallback_reason"]


def test_forward_json_summary(host_colibri: Path, models: dict[str, Path]) -> None:
    model = models["tiny-f32"]
    out = json.loads(run(host_colibri, "forward", str(model), "--ids", "1,2,3").stdout)
    want = Reference(model).forward([1, 2, 3])
    assert out["n"] == 3 and out["vocab_size"] == 256
    for pos, row in zip(out["positions"], want):
        assert [t[0] for t in pos["top5"]] == list(np.argsort(-row, kind="stable")[:5])


def test_bench_json_fields(host_colibri: Path, models: dict[str, Path]) -> None:
    out = json.loads(run(host_colibri, "--threads", "2", "bench", str(models["tiny-f32"]),
                         "--prompt-len", "16", "--gen", "8", "--runs", "3", "--json").stdout)
    for key in ("load_ms", "prefill_ms_p50", "prefill_ms_p99", "first_token_ms_p50",
                "first_token_ms_p99", "decode_tok_s", "peak_rss_mb", "backend", "threads"):
        assert key in out
    assert out["threads"] == 2 and out["backend"]["name"] in ("cpu", "cuda")
    assert 0 < out["rss_mb"] <= out["peak_rss_mb"]  # VmRSS / VmHWM of the process
    assert out["decode_tok_s"] > 0 and out["prefill_ms_p99"] >= out["prefill_ms_p50"] > 0


STAGES = ("embed", "norms", "mixer", "route", "dispatch", "experts", "shared_expert", "combine", "head")
STAGE_SUM_TOL = 0.10  # stages + sampling cover at least 90% of the timed total (docs/runtime.md)


def test_bench_stages(host_colibri: Path, models: dict[str, Path]) -> None:
    """bench --stages: every stage is reported for prefill and decode, none negative, and the
    stages with sampling account for the timed total within STAGE_SUM_TOL (what is left is the
    API's checks and the clock reads; nothing here asserts a speed)."""
    out = json.loads(run(host_colibri, "--threads", "2", "bench", str(models["shared-gate-bias-plain-f32"]),
                         "--prompt-len", "24", "--gen", "6", "--runs", "2", "--stages", "--json").stdout)
    for phase in ("prefill", "decode"):
        st = out["stages"][phase]
        assert set(st) == {"total_ms", *STAGES, "sampling", "other"}
        assert all(st[k] >= 0 for k in (*STAGES, "sampling")), st
        parts = sum(st[k] for k in (*STAGES, "sampling"))
        assert st["total_ms"] > 0 and abs(st["total_ms"] - parts) <= STAGE_SUM_TOL * st["total_ms"], st
        assert abs(st["other"] - (st["total_ms"] - parts)) < 1e-3
        # the model has attention, routed and shared experts and a head: each took some time
        for k in ("mixer", "experts", "shared_expert", "head"):
            assert st[k] > 0, (phase, k, st)
    text = run(host_colibri, "bench", str(models["tiny-f32"]), "--prompt-len", "8", "--gen", "2",
               "--runs", "1", "--stages").stdout
    assert "stages, prefill (per run)" in text and "stages, decode (per token)" in text
    plain = run(host_colibri, "bench", str(models["tiny-f32"]), "--prompt-len", "8", "--gen", "2",
                "--runs", "1", "--json").stdout
    assert "stages" not in json.loads(plain)


@pytest.mark.parametrize("threads", ["1", "2"])
def test_stage_timing_keeps_bits(host_colibri: Path, models: dict[str, Path], tmp_path: Path,
                                 threads: str) -> None:
    """With stage timing on the shared expert runs as its own jobs: the same rows, so the same
    logits bit for bit (one call and token by token), and the stage sums come back."""
    model = str(models["shared-gate-bias-plain-int8"])
    for extra in ([], ["--decode-from", "4"]):
        ids = ",".join(map(str, PROMPT))
        run(host_colibri, "--threads", threads, "forward", model, "--ids", ids, "--logits-out",
            str(tmp_path / "off.bin"), *extra)
        want = np.fromfile(tmp_path / "off.bin", dtype="<f4")
        proc = run(host_colibri, "--threads", threads, "forward", model, "--ids", ids,
                   "--logits-out", str(tmp_path / "on.bin"), "--stages", *extra)
        got = np.fromfile(tmp_path / "on.bin", dtype="<f4")
        assert got.size == len(PROMPT) * 300 and got.tobytes() == want.tobytes()
        stages = json.loads(proc.stdout)["stages_ms"]
        assert set(stages) == set(STAGES) and stages["shared_expert"] > 0


def test_selftest_passes(host_colibri: Path) -> None:
    out = run(host_colibri, "selftest").stdout
    assert "passed: 0 check(s) failed" in out
    assert "FAIL" not in out


# ---- bad input ----------------------------------------------------------------------------------

def patched(src: Path, dst: Path, offset: int, fmt: str, value: int) -> Path:
    data = bytearray(src.read_bytes())
    struct.pack_into(fmt, data, offset, value)
    dst.write_bytes(bytes(data))
    return dst


def bad_models(tiny: Path, tmp: Path) -> dict[str, tuple[Path, list[str], str]]:
    """name -> (model, extra args, text the one-line message must contain)."""
    raw = tiny.read_bytes()
    (tmp / "trunc.colibri").write_bytes(raw[: len(raw) // 2])
    (tmp / "short.colibri").write_bytes(raw[:100])
    (tmp / "empty.colibri").write_bytes(b"")
    first_record = 256
    return {
        "truncated": (tmp / "trunc.colibri", [], "truncated"),
        "shorter than the header": (tmp / "short.colibri", [], "256-byte header"),
        "empty file": (tmp / "empty.colibri", [], "truncated"),
        "wrong magic": (patched(tiny, tmp / "magic.colibri", 0, "<I", 0x464C457F), [], "magic"),
        "wrong version": (patched(tiny, tmp / "ver.colibri", 8, "<I", 7), [], "version 7"),
        "offset past the end": (patched(tiny, tmp / "off.colibri", first_record + 24, "<Q", len(raw) + 4096),
                                [], "outside"),
        "absurd embed_dim": (patched(tiny, tmp / "dim.colibri", 28, "<I", 10_000_000), [], "embed_dim"),
        "absurd vocab": (patched(tiny, tmp / "vocab.colibri", 20, "<I", 0xFFFFFFFF), [], "vocab_size"),
        "pad mismatch": (write_tiny_model(tmp / "pad32.colibri", pad=32), [],
                         "invoke convert --hf-dir"),
        "missing file": (tmp / "nope.colibri", [], "cannot open"),
        "directory": (tmp, [], "not a regular file"),
    }


def test_bad_models_exit_1_with_one_line(host_colibri: Path, models: dict[str, Path], tmp_path: Path) -> None:
    for name, (model, extra, needle) in bad_models(models["tiny-f32"], tmp_path).items():
        for cmd in (["info", str(model)], ["forward", str(model), "--ids", "1,2"]):
            proc = run(host_colibri, *extra, *cmd, check=False)
            assert proc.returncode == 1, (name, proc.stderr)
            assert proc.stdout == ""
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and needle in lines[0], (name, proc.stderr)


def test_pad_mismatch_names_both_values(host_colibri: Path, tmp_path: Path) -> None:
    model = write_tiny_model(tmp_path / "pad32.colibri", pad=32)
    proc = run(host_colibri, "info", str(model), check=False)
    assert proc.returncode == 1
    assert "multiple of 32" in proc.stderr and "COLIBRI_EMBED_DIM_PAD = 64" in proc.stderr
    assert "--target host" in proc.stderr


def test_bad_tokens_and_lengths(host_colibri: Path, models: dict[str, Path]) -> None:
    model = str(models["tiny-f32"])  # vocab 256, max_seq_len 128
    cases = {
        "token == vocab": (["forward", model, "--ids", "1,256"], "outside the vocabulary"),
        "negative token": (["forward", model, "--ids", "-1"], "outside the vocabulary"),
        "too long": (["forward", model, "--ids", ",".join(["1"] * 129)], "max_seq_len 128"),
        "generate past the cache": (["generate", model, "--ids", "1,2", "--max-new", "200"], "max_seq_len"),
        "bench past the cache": (["bench", model, "--prompt-len", "100", "--gen", "100"], "max_seq_len"),
    }
    for name, (args, needle) in cases.items():
        proc = run(host_colibri, *args, check=False)
        assert proc.returncode == 1, (name, proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1 and needle in proc.stderr, (name, proc.stderr)
    ok = run(host_colibri, "forward", model, "--ids", ",".join(["1"] * 128))
    assert json.loads(ok.stdout)["n"] == 128


def test_usage_errors_exit_2(host_colibri: Path, models: dict[str, Path]) -> None:
    model = str(models["tiny-f32"])
    for args in ([], ["frobnicate", model], ["forward", model], ["forward", model, "--ids", "1,x"],
                 ["--threads", "0", "info", model], ["--backend", "tpu", "info", model],
                 ["info"], ["generate", model, "--ids", "1"], ["forward", model, "--ids"],
                 ["--bogus", "info", model]):
        proc = run(host_colibri, *args, check=False)
        assert proc.returncode == 2, (args, proc.stderr)
        assert "usage:" in proc.stderr


def commands(binary: Path) -> list[str]:
    """The command table as `colibri --help` lists it (a line "  NAME ARGS" per command)."""
    out = run(binary, "--help").stdout
    body = out.split("commands", 1)[1].split("global options", 1)[0]
    return [ln.split()[0] for ln in body.splitlines()[1:] if ln.startswith("  ") and not ln.startswith("   ")]


def test_every_command_answers_help_with_its_own_usage(host_colibri: Path) -> None:
    names = commands(host_colibri)
    assert {"info", "forward", "generate", "bench", "bench-contexts", "dump-routing", "tokenize",
            "detokenize", "serve", "selftest", "gpuprobe", "synth"} <= set(names)
    for name in names:
        for flag in ("--help", "-h"):
            proc = run(host_colibri, name, flag, check=False)
            assert proc.returncode == 0, (name, proc.stderr)
            assert proc.stdout.startswith("usage: colibri") and proc.stderr == "", (name, proc.stderr)
            assert re.search(rf"colibri {name}\b", proc.stdout), (name, proc.stdout[:200])  # its own synopsis
            # and the global options: what they mean, or that the command does not use them
            assert "--kv-cache f32|f16" in proc.stdout or "global options are accepted" in proc.stdout
    general = run(host_colibri, "--help")
    assert general.stdout.startswith("usage: colibri --version") and general.returncode == 0


def test_global_options_parse_before_or_after_the_command(host_colibri: Path,
                                                          models: dict[str, Path]) -> None:
    """One parser for --backend/--threads/--int8-act/--kv-cache, wherever they stand."""
    model = str(models["tiny-int8"])
    want = run(host_colibri, "tokenize", model, "--text", "hi").stdout
    for args in (["--kv-cache", "f16", "tokenize", model, "--text", "hi"],
                 ["tokenize", model, "--text", "hi", "--threads", "2", "--backend", "cpu"],
                 ["--int8-act", "tokenize", model, "--kv-cache", "f16", "--text", "hi"]):
        assert run(host_colibri, *args).stdout == want, args
    assert run(host_colibri, "tokenize", model, "--text", "--threads").stdout != want  # a value
    for where in ("before", "after"):
        g = ["--backend", "cpu", "--threads", "3", "--kv-cache", "f16", "--int8-act"]
        args = [*g, "info", model] if where == "before" else ["info", model, *g]
        backend = json.loads(run(host_colibri, *args).stdout)["backend"]
        assert (backend["threads"], backend["kv_dtype"]) == (3, "f16"), where
        gen = run(host_colibri, *(g if where == "before" else []), "generate", model, "--ids", "1,2",
                  "--max-new", "3", *(g if where == "after" else []))
        assert len(json.loads(gen.stdout)["new_ids"]) == 3
    for args in (["--threads", "0", "tokenize", model, "--text", "hi"],
                 ["tokenize", model, "--text", "hi", "--kv-cache", "f8"],
                 ["synth", "x.colibri", "--backend", "tpu"], ["gpuprobe", "--threads", "65"]):
        proc = run(host_colibri, *args, check=False)
        assert proc.returncode == 2 and "usage:" in proc.stderr, (args, proc.stderr)


def test_errors_say_each_thing_once(host_colibri: Path, models: dict[str, Path], tmp_path: Path) -> None:
    bad = tmp_path / "bad.colibri"
    bad.write_bytes(b"garbage!" * 64)
    model = str(models["tiny-f32"])  # max_seq_len 128
    cases = {
        "magic": (["info", str(bad)], "bad magic", "not a .colibri model (bad magic): the first 8 bytes"),
        "too long": (["forward", model, "--ids", ",".join(["1"] * 129)], "max_seq_len:",
                     "sequence longer than max_seq_len: 0 cached + 129 new tokens > max_seq_len 128"),
        "no gpu": (["--backend", "cuda", "info", model], "unavailable", "backend unavailable or failed: CUDA"),
    }
    for name, (args, once, text) in cases.items():
        proc = run(host_colibri, *args, check=False)
        if name == "no gpu" and proc.returncode == 0:
            continue  # a machine with a GPU
        assert proc.returncode == 1 and proc.stderr.count("\n") == 1, (name, proc.stderr)
        assert proc.stderr.count(once) == 1 and text in proc.stderr, (name, proc.stderr)


def test_info_lists_the_layers(host_colibri: Path, models: dict[str, Path]) -> None:
    from colibri_kit.model.format import header_json

    info = json.loads(run(host_colibri, "--backend", "cpu", "info", str(models["tiny-f32"])).stdout)
    assert info["layer_pattern"] == "2 x [attention + moe]" == header_json(models["tiny-f32"])["layer_pattern"]
    assert info["layers"] == [{"mixer": "attention", "ffn": "moe", "window": 0, "kv_positions": 128}] * 2


def test_backend_cuda_without_gpu_is_a_clean_error(host_colibri: Path, models: dict[str, Path]) -> None:
    proc = run(host_colibri, "--backend", "cuda", "info", str(models["tiny-f32"]), check=False)
    if proc.returncode == 0:
        assert json.loads(proc.stdout)["backend"]["name"] == "cuda"  # a machine with a GPU
    else:
        assert proc.returncode == 1 and "CUDA" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1


# ---- the aarch64 build (zig cc, NEON kernels) under qemu ------------------------------------------

@pytest.mark.slow
def test_aarch64_neon_build_under_qemu(orin_nx_build: Path, models: dict[str, Path], tmp_path: Path) -> None:
    """The cross-compiled runtime (NEON kernels, CPU fallback without a GPU): selftest passes and
    logits match the reference, bitwise equal across thread counts. qemu's neoverse-n1 stands in
    for Orin's Cortex-A78AE (dotprod, no i8mm: qemu's default `max` would pick the SMMLA path);
    with --int8-act, `max` (i8mm, as Thor) gives the same logit bytes on 1 and 2 threads."""
    qemu = ["qemu-aarch64", "-cpu", "neoverse-n1", "-L", "/usr/aarch64-linux-gnu",
            str(orin_nx_build / "bin" / "colibri")]
    proc = subprocess.run([*qemu, "selftest"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "(neon-dotprod)" in proc.stdout and "passed: 0 check(s) failed" in proc.stdout
    for name in ("tiny-f32", "tiny-int8", "shared-gate-bias-plain-f32"):
        ids = [i % 256 for i in PROMPT]
        want = Reference(models[name]).forward(ids)
        outs = []
        for threads in ("1", "2"):
            out = tmp_path / f"{name}-{threads}.bin"
            proc = subprocess.run([*qemu, "--backend", "auto", "--threads", threads, "forward",
                                   str(models[name]), "--ids", ",".join(map(str, ids)),
                                   "--logits-out", str(out)], capture_output=True, text=True,
                                  timeout=600)
            assert proc.returncode == 0, proc.stderr
            outs.append(out.read_bytes())
        got = np.frombuffer(outs[0], dtype="<f4").reshape(len(ids), -1)
        assert rel_err(got, want) < F32_TOL and outs[0] == outs[1], name
    # --int8-act prefill: the SMMLA tiles (qemu max: i8mm) give the SDOT tiles' bytes (neoverse-n1)
    qmax = [qemu[0], "-cpu", "max", *qemu[3:]]
    for name in ("tiny-int8", "shared-gate-bias-plain-int8"):
        ids = ",".join(str(i % 256) for i in PROMPT)
        outs = []
        for q, threads in ((qemu, "1"), (qmax, "1"), (qmax, "2")):
            out = tmp_path / f"{name}-q8-{q[2]}-{threads}.bin"
            proc = subprocess.run([*q, "--backend", "cpu", "--threads", threads, "--int8-act",
                                   "forward", str(models[name]), "--ids", ids, "--logits-out",
                                   str(out)], capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, proc.stderr
            outs.append(out.read_bytes())
        assert outs[0] == outs[1] == outs[2], name
