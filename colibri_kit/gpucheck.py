"""Run the GPU conformance suite (tests/gpu/test_kernels_pycuda.py) against a built target.

The suite loads the exact kernel images embedded in dist/<target>/bin/colibri, checks every
kernel against NumPy, then compares `colibri forward --backend cuda` with the CPU path. Here, a
missing GPU or pycuda is an error (the user asked for a GPU check), not a skip.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from colibri_kit import paths
from colibri_kit.errors import BuildError, KitError

SUITE = Path("tests") / "gpu" / "test_kernels_pycuda.py"

_PROBE = ("import pycuda.driver as d\n"
          "d.init()\n"
          "n = d.Device.count()\n"
          "dev = d.Device(0) if n else None\n"
          "print(n, ''.join(map(str, dev.compute_capability())) if dev else 0,"
          " dev.name() if dev else '')\n")


class GpuCheckError(KitError):
    """The GPU suite could not run, or failed."""


def probe_gpu(python: str = sys.executable) -> tuple[int, str]:
    """-> (SM of device 0, its name); GpuCheckError naming what is missing otherwise."""
    proc = subprocess.run([python, "-c", _PROBE], capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["unknown error"])[-1]
        if "No module named 'pycuda'" in proc.stderr:
            raise GpuCheckError("pycuda is not installed: `pip install 'colibri-kit[gpu]'` on a "
                                "machine with an NVIDIA driver and the CUDA toolkit (pycuda "
                                "builds against cuda.h)")
        raise GpuCheckError(f"no usable CUDA GPU: {last}")
    count, sm, name = proc.stdout.strip().split(" ", 2)
    if int(count) == 0:
        raise GpuCheckError("no CUDA GPU: the driver reports 0 devices")
    return int(sm), name


def run_suite(target: str, pytest_args: list[str] | None = None,
              python: str = sys.executable) -> int:
    """Run the suite for dist/<target>; returns pytest's exit status (0 = all passed)."""
    binary = paths.dist_dir(target) / "bin" / "colibri"
    sm, name = probe_gpu(python)
    if not binary.is_file():
        raise BuildError(f"{binary} does not exist: build it first with `invoke build --target "
                         f"{target}{' --cuda-archs sm_%d' % sm if target == 'host' else ''}`")
    print(f"gpucheck: {name} (sm_{sm}), kernels from {binary}", flush=True)
    env = dict(os.environ, COLIBRI_GPU_TARGET=target)
    argv = [python, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider",
            str(paths.project_root() / SUITE), *(pytest_args or [])]
    return subprocess.run(argv, env=env, cwd=paths.project_root()).returncode


BENCH = Path("tests") / "gpu" / "bench_gemv.py"


def run_bench(target: str, python: str = sys.executable) -> int:
    """Print decode-GEMV bandwidth of dist/<target>'s kernels vs the GPU's copy bandwidth."""
    env = dict(os.environ, COLIBRI_GPU_TARGET=target)
    return subprocess.run([python, str(paths.project_root() / BENCH)], env=env,
                          cwd=paths.project_root()).returncode


# ---------------------------------------------------------------------------------------------
# scripts/gpu-check.sh --prepare: everything a GPU machine without network needs, in one directory

#: Largest prepared directory: what the device tool carries with a working tree.
PREPARED_LIMIT = 64 << 20

#: `max |cuda - cpu| / max |cpu|` allowed per weight type (docs/cuda.md, "Tolerance"): f32 adds in
#: another order; the other types decode the same weights exactly on both sides, but their models'
#: activations are larger relative to the rounding, so the bound is looser. A dtype added to
#: format.DType later gets DEFAULT_TOLERANCE until measured.
TOLERANCE = {"f32": 1e-4}
DEFAULT_TOLERANCE = 1e-3

#: The prompt (34 tokens: two device passes of 32) and the greedy continuation length.
PROMPT = [1, 5, 9, 2, 200, 7, 7, 3, 0, 42, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59,
          61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107]
GREEDY_NEW = 8
#: Vocabulary of the prepared models (the LM head dominates a small model's work).
VOCAB = 256


RUN_SCRIPT = Path("scripts") / "gpu_check_run.py"


def family_shapes() -> dict[str, tuple[int, int, int]]:
    """family name -> (flags, routing, shared expert size): what each family's converter sets
    (colibri_kit/model/families.py) for a config with its usual options."""
    from colibri_kit.model.format import Family, Flag, Routing

    return {
        Family.MIXTRAL.name.lower(): (0, int(Routing.RENORMALISE), 0),
        Family.QWEN2_MOE.name.lower(): (int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE
                                            | Flag.QKV_BIAS), int(Routing.PLAIN), 48),
        Family.QWEN3_MOE.name.lower(): (int(Flag.QK_NORM_HEAD), int(Routing.RENORMALISE), 0),
        Family.OLMOE.name.lower(): (int(Flag.QK_NORM_FULL), int(Routing.PLAIN), 0),
    }


def _small_model(path: Path, family: str, dtype: int, pad: int, seed: int) -> Path:
    from colibri_kit.model.format import Family, ModelHeader, padded_dim
    from colibri_kit.model.tiny import write_random_model

    flags, routing, shared = family_shapes()[family]
    d = 128
    header = ModelHeader(
        num_experts=8, expert_size=64, vocab_size=VOCAB, max_seq_len=64, embed_dim=d, n_layers=2,
        n_heads=4, n_kv_heads=2, head_dim=32, top_k=2, routing=routing, dtype=dtype,
        embed_dim_pad=padded_dim(d, pad), pad_multiple=pad, flags=flags,
        shared_expert_size=shared, norm_eps=1e-5, rope_theta=10000.0,
        family=int(Family[family.upper()]), name=f"gpucheck-{family}")
    return write_random_model(path, header, seed=seed)


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        raise GpuCheckError(f"{' '.join(argv)} failed: {proc.stderr.strip()[-500:]}")
    return proc


def _wide_margins(model: Path, ids: list[int], logits: "np.ndarray", tol: float) -> bool:
    """Routing and greedy choices that rounding cannot flip: every token's k-th router logit
    beats the (k+1)-th by >= 1e-3, and each greedy step's best logit beats the second by more
    than 4 x the tolerance (relative to max |logit|)."""
    import numpy as np
    from colibri_kit.model.reference import Reference

    ref = Reference(model)
    ref.forward(ids)
    if min(r.margin for tok in ref.routing for r in tok) < 1e-3:
        return False
    top2 = np.sort(logits, axis=1)[:, -2:]
    return bool(np.min(top2[:, 1] - top2[:, 0]) > 4 * tol * np.abs(logits).max())


def prepare(out: Path, sm: int = 90, binary: Path | None = None, prompt_len: int = len(PROMPT),
            greedy_new: int = GREEDY_NEW, progress=print) -> dict:
    """Fill `out` for scripts/gpu-check.sh: bin/colibri (host build with the sm_<sm> cubin and
    PTX, unless `binary` is given), a model per family x weight type with its expected CPU logits
    for the first `prompt_len` ids of PROMPT and its `greedy_new` greedy ids, the stdlib-only run
    script, manifest.json. Returns the manifest."""
    if not 1 <= prompt_len <= len(PROMPT) or not 1 <= greedy_new <= 16:
        raise GpuCheckError(f"prompt length must be 1..{len(PROMPT)}, greedy tokens 1..16")
    prompt = PROMPT[:prompt_len]
    import numpy as np

    from colibri_kit.model.format import DType

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("bin", "models", "expected"):
        (out / sub).mkdir(exist_ok=True)
    if binary is None:
        from colibri_kit.build import build

        progress(f"building host with cubin sm_{sm} + PTX")
        binary = build("host", where="host", cuda_archs=[f"sm_{sm}"],
                       progress=progress).dist_dir / "bin" / "colibri"
    colibri = out / "bin" / "colibri"
    shutil.copy2(binary, colibri)
    shutil.copy2(paths.project_root() / RUN_SCRIPT, out / RUN_SCRIPT.name)
    cpu_env = {k: v for k, v in os.environ.items() if k != "COLIBRI_LIBCUDA"}
    pad = _embed_pad(colibri)
    models = []
    ids = ",".join(map(str, prompt))
    for family in family_shapes():
        for dt in DType:
            name = f"{family}-{dt.name.lower()}"
            tol = TOLERANCE.get(dt.name.lower(), DEFAULT_TOLERANCE)
            model = out / "models" / f"{name}.colibri"
            for seed in range(1, 40):
                _small_model(model, family, int(dt), pad, seed)
                gen = json.loads(_run([str(colibri), "--backend", "cpu", "generate", str(model),
                                       "--ids", ids, "--max-new", str(greedy_new)],
                                      cpu_env).stdout)["new_ids"]
                full = prompt + gen[:-1]
                lfile = out / "expected" / f"{name}.f32"
                _run([str(colibri), "--backend", "cpu", "forward", str(model), "--ids",
                      ",".join(map(str, full)), "--logits-out", str(lfile)], cpu_env)
                logits = np.fromfile(lfile, "<f4").reshape(len(full), -1)
                if _wide_margins(model, full, logits[len(prompt) - 1:], tol):
                    break
            else:
                raise GpuCheckError(f"no seed gives {name} wide routing and greedy margins")
            logits[: len(prompt)].astype("<f4").tofile(lfile)
            models.append({"name": name, "family": family, "dtype": dt.name.lower(),
                           "path": f"models/{name}.colibri", "seed": seed,
                           "logits": f"expected/{name}.f32", "tolerance": tol,
                           "greedy_new_ids": gen})
            progress(f"{name}: seed {seed}, {model.stat().st_size} bytes")
    gm = _gpu_model()
    from colibri_kit.model.format import read_model

    for m in models:
        m["launches"] = _launches(gm, read_model(out / m["path"]).header)
    manifest = {"format": 1, "sm": sm, "binary": "bin/colibri", "prompt_ids": prompt,
                "greedy_new": greedy_new, "models": models,
                "perf_model": perf_model(gm, read_model(out / models[0]["path"]).header),
                "default_tolerance": DEFAULT_TOLERANCE,
                "version": _run([str(colibri), "--version"]).stdout.strip()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = dir_size(out)
    if size > PREPARED_LIMIT:
        raise GpuCheckError(f"{out} holds {size} bytes, over the {PREPARED_LIMIT >> 20} MiB the "
                            "device tool carries")
    progress(f"prepared {out}: {len(models)} models, {size / 2**20:.1f} MiB "
             f"(limit {PREPARED_LIMIT >> 20} MiB)")
    return manifest


def _gpu_model():
    """benchmarks/gpu_model.py, the written performance model (docs/cuda.md), as a module."""
    import importlib.util

    path = paths.project_root() / "benchmarks" / "gpu_model.py"
    spec = importlib.util.spec_from_file_location("colibri_gpu_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["colibri_gpu_model"] = mod
    spec.loader.exec_module(mod)
    return mod


def _launches(gm, h) -> dict[str, int]:
    """Driver calls per decoded token by the performance model, for the run script (which has
    only the standard library): kernels and copies without a graph, graph nodes and calls."""
    n = gm.launches_per_token(h)
    return {"kernels": n.kernels, "copies": n.copies, "graph_nodes": n.graph_nodes,
            "graph_calls": n.graph_calls}


def perf_model(gm, h) -> dict:
    """The performance model's constants, and its launches per token for a Mixtral-shaped model
    (flags 0, what `colibri synth` writes for the large model) as fixed + per-layer counts, the
    attention merge added per layer past one KV range, so the run script predicts any
    `--large-args` geometry."""
    from dataclasses import replace

    from colibri_kit.model.footprint import CUDA_KV_SPLIT

    plain = replace(h, flags=0, max_seq_len=CUDA_KV_SPLIT)  # one KV range: no merge
    one, two = gm.launches_per_token(replace(plain, n_layers=1)), \
        gm.launches_per_token(replace(plain, n_layers=2))
    long = gm.launches_per_token(replace(plain, n_layers=1, max_seq_len=plain.max_seq_len + 1))
    per_layer = two.kernels - one.kernels
    return {"launch_us": gm.LAUNCH_US, "graph_launch_us": gm.GRAPH_LAUNCH_US,
            "graph_node_us": gm.GRAPH_NODE_US,
            "synth": {"fixed": one.kernels - per_layer, "per_layer": per_layer,
                      "copies": one.copies, "graph_calls": one.graph_calls,
                      "kv_split": plain.max_seq_len,
                      "merge_per_layer": long.graph_nodes - long.kernels}}


def _embed_pad(colibri: Path) -> int:
    """COLIBRI_EMBED_DIM_PAD of a built binary, from its --version line."""
    import re

    m = re.search(r"COLIBRI_EMBED_DIM_PAD=(\d+)", _run([str(colibri), "--version"]).stdout)
    if not m:
        raise GpuCheckError(f"{colibri} --version does not name COLIBRI_EMBED_DIM_PAD")
    return int(m.group(1))


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def main(argv: list[str] | None = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m colibri_kit.gpucheck",
                                 description="Prepare a directory for scripts/gpu-check.sh")
    ap.add_argument("dir", type=Path)
    ap.add_argument("--sm", type=int, default=90, help="GPU compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--binary", type=Path, help="an already built colibri with that SM's cubin")
    ap.add_argument("--prompt-len", type=int, default=len(PROMPT),
                    help="prompt tokens (default %(default)s: two 32-token device passes)")
    ap.add_argument("--greedy-new", type=int, default=GREEDY_NEW,
                    help="greedy tokens compared (default %(default)s)")
    args = ap.parse_args(argv)
    try:
        prepare(args.dir, args.sm, args.binary, args.prompt_len, args.greedy_new)
    except KitError as exc:
        print(f"gpu-check --prepare: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
