"""`scripts/gpu-check.sh --prepare DIR`: everything a GPU machine without network needs for the
GPU check, in one directory (docs/cuda.md, "GPU check"), made here with the kit.

DIR gets bin/colibri (a host build with the sm_N cubin + PTX), models/ (a random model per family
x weight type, and the coverage models), expected/ (each model's CPU logits for its prompt and its
greedy continuation), gpu_check_run.py (the run half, standard library only) and manifest.json:
the models, their greedy ids, the performance model's launch counts and the run plan (bench sizes,
the large model's geometry, the steps' timeouts, each call's time budget). Everything the run half
does is decided here and checked against the models here, so a plan that cannot run on a model
(a bench longer than its context) fails at prepare time, not on the GPU machine.

This is a developer tool (scripts/), not part of the product package: colibri_kit imports nothing
from it, and it may use benchmarks/gpu_model.py (the written performance model).
"""

from __future__ import annotations

import argparse
import fnmatch
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run by path: the checkout's kit
    sys.path.insert(0, str(ROOT))

from colibri_kit import paths  # noqa: E402
from colibri_kit.errors import KitError  # noqa: E402

#: Largest prepared directory: what the device tool carries with a working tree.
PREPARED_LIMIT = 64 << 20

#: `max |cuda - cpu| / max |cpu|` allowed per weight type (docs/cuda.md, "Tolerance"): f32 adds in
#: another order; the other types decode the same weights exactly on both sides, but their models'
#: activations are larger relative to the rounding, so the bound is looser. A dtype added to
#: format.DType later gets DEFAULT_TOLERANCE until measured.
TOLERANCE = {"f32": 1e-4}
DEFAULT_TOLERANCE = 1e-3

#: The small models' prompt (34 tokens: more than one 32-token tensor-core tile) and the greedy
#: continuation length.
PROMPT = [1, 5, 9, 2, 200, 7, 7, 3, 0, 42, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59,
          61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107]
GREEDY_NEW = 8
#: Vocabulary of the prepared models (the LM head dominates a small model's work).
VOCAB = 256
#: The long-context coverage model: 1024 positions, a 520-token prompt whose decode steps read 3
#: split-KV ranges of 256 (the merge kernel, in the graph too) and whose prefill is 3 passes.
LONG_CONTEXT, LONG_PROMPT, LONG_GREEDY = 1024, 520, 4
KV_SPLIT = 256  # runtime/kernels/colibri_abi.h COLIBRI_CU_KV_SPLIT

#: The run plan's defaults (manifest "plan"; docs/cuda.md "the run plan").
BENCH = {"prompt_len": 16, "gen": 32, "runs": 3}
TIMEOUTS = {"env": 30, "device": 60, "model": 45, "det": 120, "kernels": 150, "sanitizer": 80,
            "probe": 60, "gemv": 60, "bench": 90, "large": 300, "coverage": 150}
#: What DIR/suite/ holds: the kernel suite without pytest and the GEMV bench (tests/gpu/), with
#: the three kit modules they import (numpy is their one outside dependency).
SUITE_FILES = [f"tests/gpu/{n}.py" for n in ("run_conformance", "conformance", "kernel_reference",
                                              "gpu_session", "cuda_driver", "gpu_images",
                                              "bench_gemv")]
SUITE_KIT = ["colibri_kit/__init__.py", "colibri_kit/errors.py", "colibri_kit/elf.py",
             "colibri_kit/model/__init__.py", "colibri_kit/model/format.py"]
#: Each call's budget (s): a step gets at most what is left of it, the rest are recorded as
#: skipped, so a call ends with a complete report inside the device tool's 600 s per command.
CALL_BUDGET = {"1": 240, "2": 300}
SANITIZERS = ("memcheck", "racecheck", "synccheck")

RUN_SCRIPT = ROOT / "scripts" / "gpu_check_run.py"


class PrepareError(KitError):
    """The directory could not be prepared."""


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


def small_header(family: str, dtype: int, pad: int):
    from colibri_kit.model.format import Family, ModelHeader, padded_dim

    flags, routing, shared = family_shapes()[family]
    d = 128
    return ModelHeader(
        num_experts=8, expert_size=64, vocab_size=VOCAB, max_seq_len=64, embed_dim=d, n_layers=2,
        n_heads=4, n_kv_heads=2, head_dim=32, top_k=2, routing=routing, dtype=dtype,
        embed_dim_pad=padded_dim(d, pad), pad_multiple=pad, flags=flags,
        shared_expert_size=shared, norm_eps=1e-5, rope_theta=10000.0,
        family=int(Family[family.upper()]), name=f"gpucheck-{family}")


def coverage_models(pad: int) -> list[dict]:
    """What the small models never reach (issue 20): a context of 1024 with a prompt crossing
    several split-KV ranges; more than 16 experts (routing unfused: router GEMV + top-k
    launches); dimensions that are not multiples of 16 with a gated shared expert, qkv bias and
    per-head q/k norm, run on 2 streams as every Jetson build is."""
    from colibri_kit.model.format import DType, Family, Flag, ModelHeader, Routing, padded_dim

    def header(name, d, **kw):
        base = dict(num_experts=8, expert_size=32, vocab_size=VOCAB, max_seq_len=64, embed_dim=d,
                    n_layers=1, n_heads=2, n_kv_heads=1, head_dim=32, top_k=2,
                    routing=int(Routing.RENORMALISE), dtype=int(DType.F32),
                    embed_dim_pad=padded_dim(d, pad), pad_multiple=pad, flags=0,
                    shared_expert_size=0, norm_eps=1e-5, rope_theta=10000.0,
                    family=int(Family.OTHER), name=f"gpucheck-{name}")
        base.update(kw)
        return ModelHeader(**base)

    long_prompt = [(i * 7919 + 13) % VOCAB for i in range(LONG_PROMPT)]
    return [
        {"name": "cov-long-context", "what": f"{LONG_CONTEXT} positions, a {LONG_PROMPT}-token "
         f"prompt: prefill in 3 passes, decode over {-(-LONG_PROMPT // KV_SPLIT)} KV ranges + merge",
         "header": header("long-context", 64, max_seq_len=LONG_CONTEXT, num_experts=4),
         "prompt": long_prompt, "greedy": LONG_GREEDY, "env": {},
         "variants": {"no graph": {"COLIBRI_CUDA_GRAPH": "0"}}},
        {"name": "cov-32-experts", "what": "32 experts top-4: routing unfused (router GEMV + "
         "top-k), and fused on request (COLIBRI_CUDA_FUSE_ROUTE=1): the same bits",
         "header": header("32-experts", 128, num_experts=32, top_k=4, n_layers=2, n_heads=4,
                          n_kv_heads=2, expert_size=64),
         "prompt": PROMPT, "greedy": GREEDY_NEW, "env": {},
         "variants": {"fuse route 1": {"COLIBRI_CUDA_FUSE_ROUTE": "1"}}},
        {"name": "cov-odd-2-streams", "what": "hidden 72, FFN 40, head 12 (6 heads, 2 KV), vocab "
         "300, gated shared expert 24 + qkv bias + q/k norm, 16 experts top-4, on 2 streams; "
         "1 stream: the same bits",
         "header": header("odd", 72, vocab_size=300, num_experts=16, top_k=4, expert_size=40,
                          n_layers=2, n_heads=6, n_kv_heads=2, head_dim=12,
                          flags=int(Flag.SHARED_EXPERT | Flag.SHARED_EXPERT_GATE | Flag.QKV_BIAS
                                    | Flag.QK_NORM_HEAD), shared_expert_size=24),
         "prompt": [i % 300 for i in PROMPT], "greedy": GREEDY_NEW,
         "env": {"COLIBRI_CUDA_STREAMS": "2"}, "variants": {"1 stream": {"COLIBRI_CUDA_STREAMS": "1"}}},
    ]


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode != 0:
        raise PrepareError(f"{shlex.join(argv[:4])} ... failed: {proc.stderr.strip()[-500:]}")
    return proc


def wide_margins(model: Path, ids: list[int], logits, tol: float) -> bool:
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


def expected(colibri: Path, model: Path, header, prompt: list[int], greedy_new: int,
             out: Path, tol: float, seeds=range(1, 40)) -> tuple[int, list[int]]:
    """Write the model with the first seed whose margins are wide (wide_margins), its CPU
    logits for prompt + greedy ids but the last (the rows the run compares) to `out`; returns
    (seed, greedy ids)."""
    import numpy as np

    from colibri_kit.model.tiny import write_random_model

    cpu_env = {k: v for k, v in os.environ.items() if k != "COLIBRI_LIBCUDA"}
    ids = ",".join(map(str, prompt))
    for seed in seeds:
        write_random_model(model, header, seed=seed)
        gen = json.loads(_run([str(colibri), "--backend", "cpu", "generate", str(model), "--ids",
                               ids, "--max-new", str(greedy_new)], cpu_env).stdout)["new_ids"]
        full = prompt + gen[:-1]
        _run([str(colibri), "--backend", "cpu", "forward", str(model), "--ids",
              ",".join(map(str, full)), "--logits-out", str(out)], cpu_env)
        logits = np.fromfile(out, "<f4").reshape(len(full), -1)
        if wide_margins(model, full, logits[len(prompt) - 1:], tol):
            return seed, gen
    raise PrepareError(f"no seed gives {model.name} wide routing and greedy margins")


def gpu_model():
    """benchmarks/gpu_model.py, the written performance model (docs/cuda.md), as a module."""
    path = ROOT / "benchmarks" / "gpu_model.py"
    spec = importlib.util.spec_from_file_location("colibri_gpu_model", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules["colibri_gpu_model"] = mod
    spec.loader.exec_module(mod)
    return mod


def launches(gm, h) -> dict[str, int]:
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


def embed_pad(colibri: Path) -> int:
    """COLIBRI_EMBED_DIM_PAD of a built binary, from its --version line."""
    m = re.search(r"COLIBRI_EMBED_DIM_PAD=(\d+)", _run([str(colibri), "--version"]).stdout)
    if not m:
        raise PrepareError(f"{colibri} --version does not name COLIBRI_EMBED_DIM_PAD")
    return int(m.group(1))


def dir_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def check_plan(plan: dict, models: list[dict]) -> None:
    """Every step of the plan fits every model it runs on: the bench's prompt + generated tokens
    (as the run script fits them) within the context, each prompt + greedy ids within it."""
    b = plan["bench"]
    if b["runs"] < 1 or b["gen"] < 1 or b["prompt_len"] < 1:
        raise PrepareError(f"bench sizes must be >= 1: {b}")
    for m in models:
        seq = m["max_seq_len"]
        prompt = max(1, min(b["prompt_len"], seq // 4))
        gen = max(1, min(b["gen"], seq - prompt))
        if prompt + gen > seq:
            raise PrepareError(f"{m['name']}: bench {prompt} + {gen} tokens > context {seq}")
        if len(m["prompt_ids"]) + len(m["greedy_new_ids"]) > seq:
            raise PrepareError(f"{m['name']}: prompt + greedy ids exceed its context {seq}")
    for call, budget in plan["call_budget_s"].items():
        if budget <= 0:
            raise PrepareError(f"call {call}'s budget must be positive, not {budget} s")
        if budget >= 600:  # a slower stand-in (the emulation) may; the device tool may not
            print(f"gpu-check --prepare: note: call {call}'s budget {budget} s exceeds the 600 s "
                  "one device command may run", file=sys.stderr)


def prepare(out: Path, sm: int = 90, binary: Path | None = None, prompt_len: int = len(PROMPT),
            greedy_new: int = GREEDY_NEW, select: list[str] | None = None,
            bench: dict | None = None, large_args: list[str] | None = (),
            call_budget: dict | None = None, kernels_k: str = "", timeout_scale: float = 1.0,
            gemv_args: list[str] = (), progress=print) -> dict:
    """Fill `out` for scripts/gpu-check.sh (module docstring). `select`: fnmatch patterns of the
    model names to prepare (default all); `large_args`: `colibri synth` options of the large
    model (default its own defaults; None: no large model)."""
    if not 1 <= prompt_len <= len(PROMPT) or not 1 <= greedy_new <= 16:
        raise PrepareError(f"prompt length must be 1..{len(PROMPT)}, greedy tokens 1..16")
    from colibri_kit.model.format import DType, read_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for sub in ("bin", "models", "expected"):
        (out / sub).mkdir(exist_ok=True)
    if binary is None:
        from colibri_kit.build import build
        from colibri_kit.profiles import load_profile

        progress(f"building host with cubin sm_{sm} + PTX")
        binary = build(load_profile("host"), where="host", cuda_archs=[f"sm_{sm}"],
                       progress=progress).dist_dir / "bin" / "colibri"
    colibri = out / "bin" / "colibri"
    shutil.copy2(binary, colibri)
    shutil.copy2(RUN_SCRIPT, out / RUN_SCRIPT.name)
    for rel in SUITE_FILES + SUITE_KIT:
        dest = out / "suite" / (Path(rel).name if rel.startswith("tests/") else rel)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, dest)
    pad = embed_pad(colibri)
    wanted = [(f"{family}-{dt.name.lower()}", "small", small_header(family, int(dt), pad),
               PROMPT[:prompt_len], greedy_new, {}) for family in family_shapes() for dt in DType]
    wanted += [(c["name"], "coverage", c["header"], c["prompt"], c["greedy"], c)
               for c in coverage_models(pad)]
    if select:
        wanted = [w for w in wanted if any(fnmatch.fnmatch(w[0], p) for p in select)]
    # A model the CUDA backend refuses (a dtype or layer kind its kernels do not compute yet, e.g.
    # mxfp4) would only measure the refusal: left out, and said so.
    from colibri_kit.model.footprint import cuda_unsupported

    runnable = []
    for w in wanted:
        why = cuda_unsupported(w[2])
        if why:
            progress(f"left out {w[0]}: the CUDA backend does not run it ({why})")
        else:
            runnable.append(w)
    wanted = runnable
    if not any(w[1] == "small" for w in wanted):
        raise PrepareError("the selection has no small model (the device step runs on one)")
    gm = gpu_model()
    models = []
    for name, kind, header, prompt, greedy, extra in wanted:
        dtype = DType(header.dtype).name.lower()
        tol = TOLERANCE.get(dtype, DEFAULT_TOLERANCE)
        model = out / "models" / f"{name}.colibri"
        lfile = out / "expected" / f"{name}.f32"
        seed, gen = expected(colibri, model, header, list(prompt), greedy, lfile, tol)
        h = read_model(model).header
        entry = {"name": name, "kind": kind, "dtype": dtype, "path": f"models/{name}.colibri",
                 "seed": seed, "logits": f"expected/{name}.f32", "tolerance": tol,
                 "prompt_ids": list(prompt), "greedy_new_ids": gen, "vocab": h.vocab_size,
                 "experts": h.num_experts, "max_seq_len": h.max_seq_len,
                 "launches": launches(gm, h)}
        if kind == "coverage":
            entry.update(what=extra["what"], env=extra["env"], variants=extra["variants"])
        models.append(entry)
        progress(f"{name}: seed {seed}, {model.stat().st_size} bytes")
    small = [m for m in models if m["kind"] == "small"]
    det, seen = [], set()
    for m in small:  # one model per family: the first weight type prepared
        family = m["name"].rsplit("-", 1)[0]
        if family not in seen:
            seen.add(family)
            det.append(m["name"])
    plan = {"bench": dict(bench or BENCH), "large_args": None if large_args is None
            else list(large_args), "probe_mib": 512,
            "timeouts": {k: v * timeout_scale for k, v in TIMEOUTS.items()},
            "call_budget_s": dict(call_budget or CALL_BUDGET), "det_models": det,
            "sanitizers": list(SANITIZERS), "kernels_k": kernels_k,
            "gemv_args": list(gemv_args)}
    check_plan(plan, models)
    manifest = {"format": 2, "sm": sm, "binary": "bin/colibri", "models": models, "plan": plan,
                "perf_model": perf_model(gm, read_model(out / small[0]["path"]).header),
                "default_tolerance": DEFAULT_TOLERANCE,
                "version": _run([str(colibri), "--version"]).stdout.strip()}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    size = dir_size(out)
    if size > PREPARED_LIMIT:
        raise PrepareError(f"{out} holds {size} bytes, over the {PREPARED_LIMIT >> 20} MiB the "
                           "device tool carries")
    progress(f"prepared {out}: {len(models)} models, {size / 2**20:.1f} MiB "
             f"(limit {PREPARED_LIMIT >> 20} MiB)")
    return manifest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/gpu-check.sh --prepare",
                                 description="Prepare a directory for scripts/gpu-check.sh")
    ap.add_argument("dir", type=Path)
    ap.add_argument("--sm", type=int, default=90, help="GPU compute capability, e.g. 90 (H100/H200)")
    ap.add_argument("--binary", type=Path, help="an already built colibri with that SM's cubin")
    ap.add_argument("--prompt-len", type=int, default=len(PROMPT),
                    help="small models' prompt tokens (default %(default)s)")
    ap.add_argument("--greedy-new", type=int, default=GREEDY_NEW,
                    help="greedy tokens compared (default %(default)s)")
    ap.add_argument("--models", help="comma-separated name patterns of the models to prepare "
                    "(e.g. 'mixtral-*,cov-*'; default all)")
    ap.add_argument("--bench", default=None, help="bench sizes 'PROMPT GEN RUNS' (default "
                    f"{BENCH['prompt_len']} {BENCH['gen']} {BENCH['runs']}; fitted to each "
                    "model's context)")
    ap.add_argument("--large-args", default="", help="`colibri synth` options of the large "
                    "model (default: its defaults, ~1.4 GB f16 read per token)")
    ap.add_argument("--no-large", action="store_true", help="no large-model step")
    ap.add_argument("--kernels", default="", help="only the kernel checks whose ids contain "
                    "one of these comma-separated strings (default: all)")
    ap.add_argument("--gemv", default="", help="bench_gemv.py options (default its own: "
                    "16384 x 8192, a 512 MiB copy)")
    ap.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every step's "
                    "timeout (the host emulation is ~100x slower than a GPU; default 1)")
    ap.add_argument("--call-budget", default=None, help="seconds each call may take, 'CALL1 "
                    f"CALL2' (default {CALL_BUDGET['1']} {CALL_BUDGET['2']})")
    args = ap.parse_args(argv)
    try:
        bench = None
        if args.bench:
            p, g, r = (int(v) for v in args.bench.split())
            bench = {"prompt_len": p, "gen": g, "runs": r}
        budget = None
        if args.call_budget:
            a, b = (int(v) for v in args.call_budget.split())
            budget = {"1": a, "2": b}
        prepare(args.dir, args.sm, args.binary, args.prompt_len, args.greedy_new,
                args.models.split(",") if args.models else None, bench,
                None if args.no_large else shlex.split(args.large_args), budget, args.kernels,
                args.timeout_scale, shlex.split(args.gemv))
    except (KitError, ValueError) as exc:
        print(f"gpu-check --prepare: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
