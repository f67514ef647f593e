#!/usr/bin/env python3
"""The run half of scripts/gpu-check.sh, on the GPU machine: Python standard library only (the
machine has no network and no pip packages). Reads a directory made by `scripts/gpu-check.sh
--prepare DIR` and runs its plan (docs/cuda.md, "GPU check: the run plan"), in two calls that each
fit one device command:

  call 1 (correctness, ~4 min on an H200): env, device, model:<name> (logits + greedy ids of
         every small model against the CPU, one process each), det:<name> (bits run to run,
         graph on/off, fused/unfused routing, 2 streams, a <= 4-token prompt), sanitizer:<tool>
         (compute-sanitizer memcheck, racecheck, synccheck, where it is installed)
  call 2 (speed and coverage, ~5 min): probe (copy bandwidth), bench:<name> (decode tok/s with
         and without the CUDA graph next to the performance model), perf (the per-call cost),
         large (a `colibri synth` model, written and benched once), coverage:<name> (a 1024-
         position context crossing several split-KV ranges, > 16 experts, odd dimensions with 2
         streams)

Every step has its own timeout (the manifest's plan; well under the 600 s a device command may
run) and is appended to OUT/report.jsonl as one JSON line, flushed and fsynced, the moment it
ends; OUT/report.txt is rewritten after every step. A call cut short therefore still returns every
finished step. Exit status: 0 every check passed, 1 a check failed or a step did not finish,
2 the directory is unusable.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import time
from array import array
from pathlib import Path

GOAL_FRACTION = 0.5
# docs/format.md tensor kinds: token embedding (one row read per token) and the routed experts
TOK_EMBED = 1
LM_HEAD = 3
EXPERT_KINDS = (30, 31, 32)
# environment variables of the backend a step may set; every other step runs without them
BACKEND_ENV = ("COLIBRI_CUDA_GRAPH", "COLIBRI_CUDA_WEIGHTS", "COLIBRI_CUDA_FUSE_ROUTE",
               "COLIBRI_CUDA_STREAMS", "COLIBRI_CUDA_CHUNK", "CUDA_LAUNCH_BLOCKING")


# ---------------------------------------------------------------- model files (standard library)

def decode_bytes_per_token(model: Path) -> int:
    """Weight bytes one decoded token reads: every tensor once (+ int8/q4 scales), but one row
    of the token embedding (plus all of it as the LM head when embeddings are tied) and
    top_k / num_experts of the routed experts (docs/cuda.md)."""
    with open(model, "rb") as f:
        head = f.read(256)
        num_experts, top_k = struct.unpack_from("<I", head, 12)[0], struct.unpack_from("<I", head, 52)[0]
        n_tensors, table = struct.unpack_from("<II", head, 88)
        f.seek(table)
        recs = f.read(64 * n_tensors)
    total = experts = embed = 0
    lm_head = False
    for i in range(n_tensors):
        kind, _layer, _expert, _dtype, rows, _cols, _off, nbytes, _soff, sbytes = \
            struct.unpack_from("<6I4Q", recs, 64 * i)
        size = nbytes + sbytes
        if kind == TOK_EMBED:
            embed = size
            total += size // max(rows, 1)
        elif kind in EXPERT_KINDS:
            experts += size
        else:
            lm_head = lm_head or kind == LM_HEAD
            total += size
    if not lm_head:   # tied embeddings: the LM head is the whole embedding, read every token
        total += embed
    return total + experts * top_k // max(num_experts, 1)


def max_seq_len(model: Path) -> int:
    with open(model, "rb") as f:
        return struct.unpack_from("<I", f.read(32), 24)[0]


def read_f32(path: Path) -> array:
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


# ---------------------------------------------------------------- the performance model's numbers

def predict_ms(launches: dict, bytes_per_token: int, copy_gbps: float | None, pm: dict,
               graph: bool) -> tuple[float, str]:
    """The performance model's decode ms/token (docs/cuda.md): the larger of the launch bound
    (every driver call at launch_us; with the graph one launch + a cost per node + the two
    copies) and the bandwidth bound (bytes per token at the measured copy bandwidth)."""
    if graph:
        us = pm["graph_launch_us"] + launches["graph_nodes"] * pm["graph_node_us"] + \
            (launches["graph_calls"] - 1) * pm["launch_us"]
    else:
        us = (launches["kernels"] + launches["copies"]) * pm["launch_us"]
    bw = bytes_per_token / (copy_gbps * 1e9) * 1e6 if copy_gbps else 0.0
    return (bw / 1e3, "bandwidth") if bw > us else (us / 1e3, "launch")


def synth_launches(model: Path, pm: dict) -> dict:
    """Driver calls per token for a `colibri synth` model (Mixtral-shaped) from its header and
    the manifest's fixed + per-layer counts."""
    with open(model, "rb") as f:
        head = f.read(64)
    seq, n_layers = struct.unpack_from("<I", head, 24)[0], struct.unpack_from("<I", head, 36)[0]
    s = pm["synth"]
    kernels = s["fixed"] + s["per_layer"] * n_layers
    merge = s["merge_per_layer"] * n_layers if seq > s["kv_split"] else 0
    return {"kernels": kernels, "copies": s["copies"], "graph_nodes": kernels + merge,
            "graph_calls": s["graph_calls"]}


# ---------------------------------------------------------------- running colibri

class StepTimeout(Exception):
    """The step's deadline passed while one of its commands ran (the command was killed)."""


class Runner:
    """Runs bin/colibri (or another program) with the backend's variables cleared, within the
    current step's deadline."""

    def __init__(self, root: Path, work: Path) -> None:
        self.root = root
        self.work = work
        self.colibri = str(root / "bin" / "colibri")
        self.deadline = float("inf")
        self.commands = 0

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, *args: str, env: dict[str, str] | None = None, prefix: list[str] | None = None,
            program: str | None = None) -> subprocess.CompletedProcess:
        full = {k: v for k, v in os.environ.items() if k not in BACKEND_ENV}
        full.update(env or {})
        argv = [*(prefix or []), program or self.colibri, *args]
        left = self.left()
        if left <= 0:
            raise StepTimeout(f"no time left for {shlex.join(argv[:4])}")
        self.commands += 1
        try:
            return subprocess.run(argv, capture_output=True, text=True, env=full,
                                  timeout=None if left == float("inf") else left)
        except subprocess.TimeoutExpired:
            raise StepTimeout(f"`{shlex.join(argv[:6])} ...` still running at the step's "
                              f"deadline (killed)") from None
        except OSError as exc:
            return subprocess.CompletedProcess(argv, 127, "", str(exc))

    def cuda(self, cmd: str, model: Path, *args: str, env: dict[str, str] | None = None,
             prefix: list[str] | None = None) -> subprocess.CompletedProcess:
        return self.run("--backend", "cuda", cmd, str(model), *args, env=env, prefix=prefix)


def fail_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in (proc.stderr.strip() or proc.stdout.strip()).splitlines() if ln.strip()]
    return (lines or [f"exit status {proc.returncode}"])[-1][:300]


def compare(got: array, want: array, rows: range, vocab: int, tol: float) -> dict:
    """max |got - want| / max |want| over `rows` (NaN/inf in got: infinite error)."""
    lo, hi = rows.start * vocab, rows.stop * vocab
    w, g = want[lo:hi], got[lo:hi]
    scale = max((abs(v) for v in w), default=1.0) or 1.0
    finite = all(v == v and abs(v) != float("inf") for v in g)
    diff = max((abs(a - b) for a, b in zip(g, w)), default=0.0)
    rel = diff / scale if finite else float("inf")
    return {"rel_err": rel, "ok": finite and rel <= tol}


def argmax_rows(logits: array, rows: range, vocab: int) -> list[int]:
    out = []
    for r in rows:
        row = logits[r * vocab:(r + 1) * vocab]
        best = 0
        for i in range(1, vocab):
            if row[i] > row[best]:
                best = i  # ties: the lower id, as colibri's greedy pick
        out.append(best)
    return out


class Models:
    """The manifest's models, with the paths resolved."""

    def __init__(self, root: Path, manifest: dict) -> None:
        self.root = root
        self.by_name = {m["name"]: m for m in manifest["models"]}

    def path(self, m: dict) -> Path:
        return self.root / m["path"]


def forward_rows(r: Runner, m: dict, models: Models, tag: str, env: dict[str, str] | None = None,
                 prompt: list[int] | None = None, decode: bool = True,
                 prefix: list[str] | None = None) -> tuple[array | None, str]:
    """One process: the model's prompt as one forward call, then (decode) its greedy ids but the
    last as one-token decode steps (the CUDA graph's path): every row's logits. Returns (logits,
    "") or (None, the failure)."""
    ids = list(prompt if prompt is not None else m["prompt_ids"])
    start = len(ids)
    if decode and prompt is None:
        ids += m["greedy_new_ids"][:-1]
    out = r.work / f"{m['name']}.{tag}.f32"
    out.unlink(missing_ok=True)
    args = ["--ids", ",".join(map(str, ids)), "--logits-out", str(out)]
    if decode:
        args += ["--decode-from", str(start)]
    proc = r.cuda("forward", models.path(m), *args, env=env, prefix=prefix)
    if proc.returncode != 0:
        return None, fail_line(proc)
    got = read_f32(out)
    if len(got) != len(ids) * m["vocab"]:
        return None, f"{len(got)} logits, expected {len(ids)} x {m['vocab']}"
    return got, ""


def check_logits_and_greedy(r: Runner, m: dict, models: Models, tag: str = "cuda",
                            env: dict[str, str] | None = None) -> tuple[dict, array | None]:
    """Logits of the prompt (prefill passes) and of the decode steps against the CPU's, and the
    greedy ids (the argmax of the last prompt row and of each decode step's row) against the
    CPU's: forward + generate in one process."""
    got, err = forward_rows(r, m, models, tag, env)
    if got is None:
        return {"status": "fail", "logits_ok": False, "greedy_ok": False, "error": err}, None
    want = read_f32(models.root / m["logits"])
    P, V, G = len(m["prompt_ids"]), m["vocab"], len(m["greedy_new_ids"])
    pre = compare(got, want, range(0, P), V, m["tolerance"])
    dec = compare(got, want, range(P, P + G - 1), V, m["tolerance"]) if G > 1 else {"ok": True,
                                                                                   "rel_err": 0.0}
    greedy = argmax_rows(got, range(P - 1, P + G - 1), V)
    res = {"logits_ok": pre["ok"] and dec["ok"], "prefill_rel_err": pre["rel_err"],
           "decode_rel_err": dec["rel_err"], "greedy_ok": greedy == m["greedy_new_ids"],
           "greedy_new_ids": greedy, "greedy_expected": m["greedy_new_ids"],
           "tolerance": m["tolerance"]}
    res["status"] = "pass" if res["logits_ok"] and res["greedy_ok"] else "fail"
    return res, got


# ---------------------------------------------------------------- the steps

def step_env(r: Runner, ctx: dict) -> dict:
    """What runs: the binary, the GPU as nvidia-smi sees it (persistence mode included), the
    tools present. Persistence mode is not changed here (a shared machine's settings stay as they
    are); when it is off, a helper process holds the driver open for the whole call, which keeps
    the per-process CUDA initialisation short the same way (main, hold_driver)."""
    out: dict = {"status": "info", "python": sys.version.split()[0],
                 "version": r.run("--version").stdout.strip()}
    smi = shutil.which("nvidia-smi")
    if smi:
        q = r.run("--query-gpu=name,driver_version,persistence_mode,compute_cap,memory.total,"
                  "clocks.max.sm,clocks.max.mem", "--format=csv,noheader", program=smi)
        out["nvidia_smi"] = q.stdout.strip() or fail_line(q)
        out["persistence_mode"] = (q.stdout.split(",")[2].strip() if q.returncode == 0 and
                                   q.stdout.count(",") >= 2 else "unknown")
    else:
        out["nvidia_smi"] = "not found"
    out["driver_held_by"] = ctx.get("holder") or ""
    out["compute_sanitizer"] = find_sanitizer() or "not found"
    return out


def step_device(r: Runner, ctx: dict) -> dict:
    """`info --backend cuda` opens the GPU; one forward with CUDA_LAUNCH_BLOCKING=1 (every launch
    synchronous, so a faulting kernel is named at its launch) gives the CPU's logits."""
    m = ctx["first"]
    proc = r.cuda("info", ctx["models"].path(m))
    if proc.returncode != 0:
        return {"status": "fail", "ok": False, "error": fail_line(proc)}
    backend = json.loads(proc.stdout)["backend"]
    res, _ = check_logits_and_greedy(r, m, ctx["models"], "blocking", {"CUDA_LAUNCH_BLOCKING": "1"})
    out = {"ok": True, **backend, "blocking_forward": res}
    out["status"] = "pass" if res["status"] == "pass" else "fail"
    ctx["device"] = backend
    return out


def step_model(m: dict):
    def run(r: Runner, ctx: dict) -> dict:
        res, got = check_logits_and_greedy(r, m, ctx["models"])
        if got is not None:
            ctx["logits"][m["name"]] = got
        return {"model": m["name"], "dtype": m["dtype"], **res}
    return run


def same_bits(a: array, b: array) -> bool:
    return a.tobytes() == b.tobytes()


def step_det(m: dict):
    """Bits of the model's forward (its model step's) against: the same run again, plain
    launches instead of the CUDA graph for the decode steps, the routing fusion switched
    (COLIBRI_CUDA_FUSE_ROUTE=0 for <= 16 experts, =1 above), 2 streams (the shared expert on
    the second, as a Jetson build runs); and a prompt of at most 4 tokens (no tensor-core
    kernel: GEMV only) against the CPU within tolerance."""
    def run(r: Runner, ctx: dict) -> dict:
        models = ctx["models"]
        base = ctx["logits"].get(m["name"])
        if base is None:
            base, err = forward_rows(r, m, models, "det0")
            if base is None:
                return {"status": "fail", "error": f"first run: {err}"}
        fuse = "1" if m["experts"] > 16 else "0"
        variants = {"again": {}, "no graph": {"COLIBRI_CUDA_GRAPH": "0"},
                    f"fuse route {fuse}": {"COLIBRI_CUDA_FUSE_ROUTE": fuse},
                    "2 streams": {"COLIBRI_CUDA_STREAMS": "2"}}
        out: dict = {"model": m["name"], "bits": {}}
        for name, env in variants.items():
            got, err = forward_rows(r, m, models, "det-" + name.replace(" ", "_"), env)
            out["bits"][name] = err if got is None else ("same" if same_bits(got, base) else
                                                         "DIFFERENT")
        short = m["prompt_ids"][:min(4, len(m["prompt_ids"]))]
        got, err = forward_rows(r, m, models, "short", prompt=short, decode=False)
        if got is None:
            out["short_prompt"] = {"ok": False, "error": err}
        else:
            c = compare(got, read_f32(models.root / m["logits"]), range(0, len(short)), m["vocab"],
                        m["tolerance"])
            out["short_prompt"] = {"tokens": len(short), **c}
        ok = all(v == "same" for v in out["bits"].values()) and out["short_prompt"]["ok"]
        out["status"] = "pass" if ok else "fail"
        return out
    return run


def find_sanitizer() -> str | None:
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for base in sorted(Path("/usr/local").glob("cuda*"), reverse=True):
        for rel in ("bin/compute-sanitizer", "compute-sanitizer/compute-sanitizer"):
            if (base / rel).is_file():
                return str(base / rel)
    return None


def step_sanitizer(tool: str):
    """compute-sanitizer --tool TOOL over a 6-token prompt (tensor-core passes) and 2 decode
    steps (the graph) of the first model: no error reported."""
    def run(r: Runner, ctx: dict) -> dict:
        san = find_sanitizer()
        if san is None:
            return {"status": "skipped", "reason": "compute-sanitizer not found"}
        m = ctx["first"]
        ids = (m["prompt_ids"] + m["greedy_new_ids"])[:8]
        out = r.work / f"sanitizer-{tool}.f32"
        proc = r.cuda("forward", ctx["models"].path(m), "--ids", ",".join(map(str, ids)),
                      "--decode-from", "6", "--logits-out", str(out),
                      prefix=[san, "--tool", tool, "--error-exitcode", "9", "--print-limit", "20"])
        text = proc.stdout + proc.stderr
        summary = next((ln.strip() for ln in text.splitlines() if "ERROR SUMMARY" in ln), "")
        res = {"tool": tool, "exit": proc.returncode, "summary": summary}
        if proc.returncode != 0:
            res["tail"] = text.strip().splitlines()[-12:]
        res["status"] = "pass" if proc.returncode == 0 else "fail"
        return res
    return run


def suite_python(r: Runner) -> str | None:
    """python3 with numpy (the kernel suite's one dependency), else None."""
    proc = r.run("-c", "import numpy", program=sys.executable)
    return sys.executable if proc.returncode == 0 else None


def step_kernels(r: Runner, ctx: dict) -> dict:
    """The kernel conformance suite (DIR/suite/run_conformance.py: every kernel against NumPy,
    through the driver itself when pycuda is absent) on the image this GPU loads."""
    py = suite_python(r)
    if py is None:
        return {"status": "skipped", "reason": "numpy is not importable by " + sys.executable}
    k = ctx["plan"].get("kernels_k", "")
    proc = r.run(str(r.root / "suite" / "run_conformance.py"), "--binary", r.colibri, "--json",
                 *(["-k", k] if k else []), program=py)
    checks = []
    for line in proc.stdout.splitlines():
        try:
            checks.append(json.loads(line))
        except ValueError:
            pass
    failed = [c for c in checks if not c["ok"]]
    out = {"checks": len(checks), "failed": len(failed),
           "failures": [f"{c['check']}: {c['error']}" for c in failed][:20],
           "slowest": sorted(checks, key=lambda c: -c["seconds"])[:3]}
    if proc.returncode not in (0, 1) or not checks:
        out["error"] = fail_line(proc)
    out["status"] = "pass" if proc.returncode == 0 and checks and not failed else "fail"
    return out


def step_gemv(r: Runner, ctx: dict) -> dict:
    """The decode-GEMV bench (DIR/suite/bench_gemv.py): cb_linear's GB/s per weight dtype on a
    16384 x 8192 matrix against a device copy's."""
    py = suite_python(r)
    if py is None:
        return {"status": "skipped", "reason": "numpy is not importable by " + sys.executable}
    proc = r.run(str(r.root / "suite" / "bench_gemv.py"), "--json", *ctx["plan"]["gemv_args"],
                 env={"COLIBRI_GPU_BINARY": r.colibri}, program=py)
    if proc.returncode != 0:
        return {"status": "fail", "error": fail_line(proc)}
    return {"status": "figure", **json.loads(proc.stdout.strip().splitlines()[-1])}


def step_probe(r: Runner, ctx: dict) -> dict:
    proc = r.run("gpuprobe", "--mib", str(ctx["plan"]["probe_mib"]), "--json")
    if proc.returncode != 0:
        return {"status": "fail", "error": fail_line(proc)}
    probe = json.loads(proc.stdout)
    ctx["copy_gbps"] = probe.get("copy_gbps")
    return {"status": "figure", **probe}


def bench_args(plan: dict, model: Path) -> list[str]:
    """The plan's bench, fitted to the model's context (prompt + generated <= max_seq_len)."""
    b = plan["bench"]
    seq = max_seq_len(model)
    prompt = max(1, min(b["prompt_len"], seq // 4))
    gen = max(1, min(b["gen"], seq - prompt))
    return ["--prompt-len", str(prompt), "--gen", str(gen), "--runs", str(b["runs"])]


def bench_variant(r: Runner, model: Path, args: list[str], env: dict[str, str], launches,
                  bytes_per_token: int, copy_gbps, pm, graph: bool) -> dict:
    proc = r.cuda("bench", model, *args, "--json", env=env)
    if proc.returncode != 0:
        return {"error": fail_line(proc)}
    b = json.loads(proc.stdout)
    tok_s = b["decode_tok_s"]
    v = {"decode_tok_s": tok_s, "load_ms": b["load_ms"], "prefill_ms_p50": b["prefill_ms_p50"],
         "weights": b.get("backend", {}).get("cuda_weights", "")}
    if tok_s > 0 and launches and pm:
        ms, bound = predict_ms(launches, bytes_per_token, copy_gbps, pm, graph)
        v.update(ms_per_token=1e3 / tok_s, model_ms=ms, model_bound=bound,
                 measured_over_model=1e3 / tok_s / ms)
        if not graph:  # launch-bound small models: the cost of one driver call
            v["us_per_call"] = 1e6 / tok_s / (launches["kernels"] + launches["copies"])
    return v


def step_bench(m: dict):
    """decode tok/s with the CUDA graph (the default) and without it (plain launches)."""
    def run(r: Runner, ctx: dict) -> dict:
        model = ctx["models"].path(m)
        args = bench_args(ctx["plan"], model)
        bpt = decode_bytes_per_token(model)
        pm = ctx["manifest"].get("perf_model")
        out = {"model": m["name"], "bench": " ".join(args), "decode": {}}
        for name, env, graph in (("graph", {}, True), ("no graph", {"COLIBRI_CUDA_GRAPH": "0"},
                                                       False)):
            out["decode"][name] = bench_variant(r, model, args, env, m.get("launches"), bpt,
                                                ctx.get("copy_gbps"), pm, graph)
        errors = [f"{k}: {v['error']}" for k, v in out["decode"].items() if "error" in v]
        out["status"] = "fail" if errors else "figure"
        if errors:
            out["error"] = "; ".join(errors)
        ctx["benches"].append(out["decode"])
        return out
    return run


def step_perf(r: Runner, ctx: dict) -> dict:
    """The per-call cost the small models' plain launches imply, against the model's."""
    pm = ctx["manifest"].get("perf_model")
    plain = [d["no graph"] for d in ctx["benches"] if "us_per_call" in d.get("no graph", {})]
    graph = [d["graph"] for d in ctx["benches"] if "measured_over_model" in d.get("graph", {})]
    if not (plain and graph and pm):
        return {"status": "skipped", "reason": "no bench figures in this call"}
    return {"status": "figure", "models": len(plain), "model_launch_us": pm["launch_us"],
            "us_per_call_median": median([v["us_per_call"] for v in plain]),
            "plain_over_model_median": median([v["measured_over_model"] for v in plain]),
            "graph_over_model_median": median([v["measured_over_model"] for v in graph])}


def step_large(r: Runner, ctx: dict) -> dict:
    """`colibri synth` writes the large model here (nothing large is shipped); ONE bench process
    uploads and decodes it (its load_ms is the open: the chunked upload), with the graph; on an
    integrated GPU a second with the weights mapped. Decode tok/s x bytes per token = achieved
    bandwidth, against the goal of >= 50% of the copy bandwidth."""
    plan, pm = ctx["plan"], ctx["manifest"].get("perf_model")
    path = r.work / "large.colibri"
    try:
        t0 = time.monotonic()
        proc = r.run("synth", str(path), *plan["large_args"])
        if proc.returncode != 0:
            return {"status": "fail", "error": f"colibri synth: {fail_line(proc)}"}
        out = {"synth_args": plan["large_args"], "synth_s": round(time.monotonic() - t0, 1),
               "file_bytes": path.stat().st_size, "bytes_per_token": decode_bytes_per_token(path)}
        args = bench_args(plan, path)
        launches = synth_launches(path, pm) if pm else None
        variants = {"graph": {}}
        if ctx.get("device", {}).get("cuda_integrated"):
            variants["mapped, graph"] = {"COLIBRI_CUDA_WEIGHTS": "map"}
        out["decode"] = {}
        for name, env in variants.items():
            v = bench_variant(r, path, args, env, launches, out["bytes_per_token"],
                              ctx.get("copy_gbps"), pm, True)
            if "decode_tok_s" in v:
                v["achieved_gbps"] = v["decode_tok_s"] * out["bytes_per_token"] / 1e9
                v["open_s"] = v["load_ms"] / 1e3
                v["upload_gbps"] = out["file_bytes"] / 1e9 / max(v["open_s"], 1e-9)
                if ctx.get("copy_gbps"):
                    v["fraction_of_copy_bandwidth"] = v["achieved_gbps"] / ctx["copy_gbps"]
            out["decode"][name] = v
        best = out["decode"]["graph"]
        if "error" in best:
            out.update(status="fail", error=f"bench: {best['error']}")
        else:
            out.update(status="figure", decode_tok_s=best["decode_tok_s"],
                       achieved_gbps=best["achieved_gbps"])
            if "fraction_of_copy_bandwidth" in best:
                out["fraction_of_copy_bandwidth"] = best["fraction_of_copy_bandwidth"]
                out["goal_met"] = best["fraction_of_copy_bandwidth"] >= GOAL_FRACTION
        return out
    finally:
        path.unlink(missing_ok=True)


def step_coverage(m: dict):
    """A coverage model: logits and greedy ids against the CPU (its own environment, e.g. 2
    streams), then the same bits under each of its variants (plain launches instead of the
    graph, the routing fusion switched, 1 stream)."""
    def run(r: Runner, ctx: dict) -> dict:
        env = dict(m.get("env", {}))
        res, got = check_logits_and_greedy(r, m, ctx["models"], "cov", env)
        out = {"model": m["name"], "what": m.get("what", ""), "env": env, **res, "bits": {}}
        if got is not None:
            for name, extra in m.get("variants", {}).items():
                other, err = forward_rows(r, m, ctx["models"], "cov-" + name.replace(" ", "_"),
                                          {**env, **extra})
                out["bits"][name] = err if other is None else (
                    "same" if same_bits(other, got) else "DIFFERENT")
        ok = res["status"] == "pass" and all(v == "same" for v in out["bits"].values())
        out["status"] = "pass" if ok else "fail"
        return out
    return run


def plan_steps(manifest: dict) -> list[tuple[int, str, float, object]]:
    """(call, step name, timeout s, function) in run order."""
    plan, t = manifest["plan"], manifest["plan"]["timeouts"]
    small = [m for m in manifest["models"] if m["kind"] == "small"]
    steps: list = [(1, "env", t["env"], step_env), (1, "device", t["device"], step_device)]
    steps += [(1, f"model:{m['name']}", t["model"], step_model(m)) for m in small]
    det = set(plan["det_models"])
    steps += [(1, f"det:{m['name']}", t["det"], step_det(m)) for m in small if m["name"] in det]
    steps += [(1, "kernels", t["kernels"], step_kernels)]
    steps += [(1, f"sanitizer:{tool}", t["sanitizer"], step_sanitizer(tool))
              for tool in plan["sanitizers"]]
    steps += [(2, "probe", t["probe"], step_probe), (2, "gemv", t["gemv"], step_gemv)]
    steps += [(2, f"bench:{m['name']}", t["bench"], step_bench(m)) for m in small]
    steps += [(2, "perf", 5, step_perf)]
    if plan.get("large_args") is not None:
        steps += [(2, "large", t["large"], step_large)]
    steps += [(2, f"coverage:{m['name']}", t["coverage"], step_coverage(m))
              for m in manifest["models"] if m["kind"] == "coverage"]
    return steps


# ---------------------------------------------------------------- the report

class Report:
    """report.jsonl: one JSON line per finished step, flushed and fsynced at once; report.txt:
    the text view of every line so far, rewritten (via a rename) after each step."""

    def __init__(self, out: Path) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.jsonl, self.txt = out / "report.jsonl", out / "report.txt"
        self.records: list[dict] = []
        if self.jsonl.exists():  # a second call appends to the first's report
            for line in self.jsonl.read_text().splitlines():
                try:
                    self.records.append(json.loads(line))
                except ValueError:
                    pass  # a line cut by a kill: the step is run again

    def add(self, rec: dict) -> None:
        self.records.append(rec)
        with open(self.jsonl, "a") as f:
            f.write(json.dumps(rec) + "\n")
            f.flush()
            os.fsync(f.fileno())
        tmp = self.txt.with_suffix(".txt.tmp")
        tmp.write_text(text_report(self.records))
        os.replace(tmp, self.txt)


def fmt(v, spec: str) -> str:
    return "-" if v is None else format(v, spec)


def step_line(rec: dict) -> list[str]:
    name, st = rec["step"], rec["status"]
    head = f"[{st.upper():7}] {name:<28} {rec.get('seconds', 0):6.1f} s"
    lines = [head]
    if "error" in rec:
        lines[0] += f"  {rec['error']}"
    if name.startswith(("model:", "coverage:")) or name == "device":
        r = rec.get("blocking_forward", rec)
        if "prefill_rel_err" in r:
            lines[0] += (f"  prefill {fmt(r['prefill_rel_err'], '.2e')} decode "
                         f"{fmt(r['decode_rel_err'], '.2e')} (tol {r['tolerance']:.0e}) greedy "
                         f"{'ok' if r['greedy_ok'] else 'FAIL'}")
            if not r["greedy_ok"]:
                lines.append(f"    greedy: got {r.get('greedy_new_ids')}, expected "
                             f"{r.get('greedy_expected')}")
        if name == "device":
            lines.append(f"    {rec.get('cuda_device', '')} sm_{rec.get('cuda_sm', 0)} driver "
                         f"{rec.get('cuda_driver_version', 0)} ({rec.get('cuda_libcuda', '')}) "
                         f"image {rec.get('cuda_image', '')} prefill {rec.get('cuda_prefill', '')} "
                         f"chunk {rec.get('cuda_chunk', '')} weights {rec.get('cuda_weights', '')}")
    if "bits" in rec:
        lines.append("    bits: " + ", ".join(f"{k} {v}" for k, v in rec["bits"].items()))
    if "short_prompt" in rec:
        sp = rec["short_prompt"]
        lines.append(f"    {sp.get('tokens', '?')}-token prompt: "
                     f"{fmt(sp.get('rel_err'), '.2e')} {'ok' if sp['ok'] else 'FAIL'}")
    if name == "kernels" and "checks" in rec:
        lines.append(f"    {rec['checks'] - rec['failed']}/{rec['checks']} kernel checks passed")
        lines += [f"    FAIL {f}" for f in rec.get("failures", [])]
    if name == "gemv" and "gemv" in rec:
        lines.append(f"    copy {rec['copy_gbps']:.1f} GB/s; decode GEMV " + ", ".join(
            f"{k} {v['gbps']:.1f} GB/s ({v['fraction_of_copy']:.0%})" for k, v in rec["gemv"].items()))
    if name.startswith("sanitizer:") and rec.get("summary"):
        lines.append(f"    {rec['summary']}")
    if name == "env":
        lines.append(f"    {rec.get('version', '').splitlines()[0] if rec.get('version') else ''}")
        lines.append(f"    nvidia-smi: {rec.get('nvidia_smi', '')}; driver held by: "
                     f"{rec.get('driver_held_by') or 'nothing'}")
    if name == "probe" and "copy_gbps" in rec:
        lines.append(f"    device copy bandwidth: {rec['copy_gbps']:.1f} GB/s (read + write, "
                     f"{rec['iters']} x {rec['bytes'] >> 20} MiB) via {rec.get('libcuda', '')}")
    for vname, v in rec.get("decode", {}).items():
        lines.append(variant_line(vname, v))
    if name == "perf":
        lines.append(f"    {rec['model_launch_us']:g} us per driver call modelled, measured "
                     f"{rec['us_per_call_median']:.2f} us (median of {rec['models']} models); "
                     f"measured/model graph {rec['graph_over_model_median']:.2f}, plain "
                     f"{rec['plain_over_model_median']:.2f}")
    if name == "large" and "decode_tok_s" in rec:
        lines.append(f"    {rec['bytes_per_token'] / 1e9:.3g} GB read per token, file "
                     f"{rec['file_bytes'] / 1e9:.3g} GB (synth {rec['synth_s']} s)")
        if "fraction_of_copy_bandwidth" in rec:
            lines.append(f"    = {rec['fraction_of_copy_bandwidth']:.3%} of copy bandwidth; goal "
                         f">= {GOAL_FRACTION:.0%}: {'met' if rec['goal_met'] else 'NOT met'}")
    return lines


def variant_line(name: str, v: dict) -> str:
    """One decode variant: measured, the model's prediction and their ratio."""
    if "error" in v:
        return f"    {name}: {v['error']}"
    line = f"    {name:<15} {v['decode_tok_s']:10.1f} tok/s"
    if "ms_per_token" in v:
        line += (f" = {v['ms_per_token']:.3g} ms/token; model {v['model_ms']:.3g} ms "
                 f"({v['model_bound']}-bound), measured/model {v['measured_over_model']:.2f}")
    if "us_per_call" in v:
        line += f"; {v['us_per_call']:.2f} us/call"
    if "achieved_gbps" in v:
        line += f"; {v['achieved_gbps']:.3g} GB/s; open {v['open_s']:.2f} s"
    return line


# statuses that are verdicts: a step that did not finish (timeout, error) or was never started
# (not-run: the call's budget was spent) fails the check like a wrong result
CHECKED = ("pass", "fail", "timeout", "error", "not-run")


def summary(records: list[dict]) -> tuple[int, int]:
    """(checks passed, checks) over the steps with a verdict (the latest record of each)."""
    last = {r["step"]: r for r in records if "step" in r}
    checks = [r for r in last.values() if r["status"] in CHECKED]
    return sum(r["status"] == "pass" for r in checks), len(checks)


def text_report(records: list[dict]) -> str:
    passed, total = summary(records)
    verdict = "no checks yet" if total == 0 else "PASS" if passed == total else "FAIL"
    lines = [f"gpu-check: {verdict}  ({passed}/{total} checks)"]
    for rec in records:
        if "step" in rec:
            try:
                lines += step_line(rec)
            except (KeyError, TypeError, ValueError) as exc:  # never lose the report to its view
                lines.append(f"[{rec.get('status', '?').upper():7}] {rec['step']} (see "
                             f"report.jsonl: {type(exc).__name__} {exc})")
        elif "call" in rec:
            lines.append(f"--- call {rec['call']}: {rec.get('event', '')} "
                         f"{rec.get('seconds', '')}".rstrip())
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------- driver holder, main

# Holds one CUDA context open (python3 + ctypes on libcuda.so.1, COLIBRI_LIBCUDA honoured) until
# its stdin closes: with persistence mode off, the driver then keeps the GPU initialised between
# the plan's processes, which is what persistence mode would do, without changing a setting.
HOLDER = r"""
import ctypes, os, sys
lib = ctypes.CDLL(os.environ.get("COLIBRI_LIBCUDA") or "libcuda.so.1")
dev, ctx = ctypes.c_int(), ctypes.c_void_p()
ok = lib.cuInit(0) == 0 and lib.cuDeviceGet(ctypes.byref(dev), 0) == 0 and \
    lib.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
print("held" if ok else "failed", flush=True)
sys.stdin.read()
"""


def hold_driver() -> subprocess.Popen | None:
    try:
        p = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
    except OSError:
        return None
    line = p.stdout.readline().strip()
    if line != "held":
        p.kill()
        p.wait()
        return None
    return p


def run_plan(root: Path, out: Path, calls: set[int], only: str | None = None) -> int:
    manifest = json.loads((root / "manifest.json").read_text())
    work = root / "work"
    work.mkdir(exist_ok=True)
    report = Report(out)
    models = Models(root, manifest)
    small = [m for m in manifest["models"] if m["kind"] == "small"]
    ctx: dict = {"manifest": manifest, "plan": manifest["plan"], "models": models,
                 "first": small[0], "logits": {}, "benches": [], "device": {}}
    # what an earlier call found that a later step uses (call 2 after call 1: the device)
    for rec in report.records:
        if rec.get("step") == "device" and rec.get("ok"):
            ctx["device"] = rec
        if rec.get("step") == "probe" and "copy_gbps" in rec:
            ctx["copy_gbps"] = rec["copy_gbps"]
    holder = hold_driver()
    ctx["holder"] = f"pid {holder.pid}" if holder else ""
    r = Runner(root, work)
    try:
        for call in sorted(calls):
            t_call = time.monotonic()
            report.add({"call": call, "event": "start", "time": time.time()})
            budget = t_call + manifest["plan"]["call_budget_s"][str(call)]
            for c, name, timeout, fn in plan_steps(manifest):
                if c != call or (only and not any(name.startswith(o) for o in only.split(","))):
                    continue
                t0 = time.monotonic()
                timeout = min(timeout, budget - t0)
                if timeout < 1:  # the call's budget is spent: what is left is said, not run
                    report.add({"step": name, "call": call, "status": "not-run",
                                "reason": f"call {call}'s budget of "
                                          f"{manifest['plan']['call_budget_s'][str(call)]} s spent"})
                    continue
                print(f"gpu-check: {name} (timeout {timeout:.0f} s)", flush=True)
                r.deadline = t0 + timeout
                try:
                    rec = fn(r, ctx)
                except StepTimeout as exc:
                    rec = {"status": "timeout", "error": str(exc)}
                except Exception as exc:  # a bug or a malformed output: recorded, the plan goes on
                    rec = {"status": "error", "error": f"{type(exc).__name__}: {exc}"}
                rec = {"step": name, "call": call, "timeout": round(timeout, 1),
                       "seconds": round(time.monotonic() - t0, 2), **rec}
                report.add(rec)
                print(f"gpu-check: {name}: {rec['status']}", flush=True)
            report.add({"call": call, "event": "end",
                        "seconds": round(time.monotonic() - t_call, 1)})
    finally:
        if holder:
            holder.stdin.close()
            holder.wait(timeout=30)
        r.deadline = float("inf")
    passed, total = summary(report.records)
    print(text_report(report.records), end="")
    print(f"gpu-check: report in {report.txt} and {report.jsonl}")
    return 0 if passed == total else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="directory made by scripts/gpu-check.sh --prepare")
    ap.add_argument("--call", choices=("1", "2", "all"), default="all",
                    help="which call of the plan to run (default: both, one after the other)")
    ap.add_argument("--out", type=Path, help="where report.jsonl and report.txt go (default "
                    "DIR; on the device machine: $OUT, so a call cut short still returns them)")
    ap.add_argument("--only", help="only the steps whose names start with one of these "
                    "(comma-separated, e.g. model:,det:)")
    ap.add_argument("--list", action="store_true", help="print the plan (call, step, timeout)")
    args = ap.parse_args(argv)
    root = args.dir.resolve()
    try:
        manifest = json.loads((root / "manifest.json").read_text())
        steps = plan_steps(manifest)
    except (OSError, ValueError, KeyError) as exc:
        print(f"gpu-check: {root} is not a prepared directory ({type(exc).__name__}: {exc}); "
              "make one with `scripts/gpu-check.sh --prepare DIR`", file=sys.stderr)
        return 2
    if args.list:
        for call, name, timeout, _ in steps:
            print(f"{call} {name} {timeout:g}")
        return 0
    calls = {1, 2} if args.call == "all" else {int(args.call)}
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # a kill: the report is on disk
    return run_plan(root, (args.out or root).resolve(), calls, args.only)


if __name__ == "__main__":
    sys.exit(main())
