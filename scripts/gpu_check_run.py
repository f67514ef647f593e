#!/usr/bin/env python3
"""The run half of scripts/gpu-check.sh, on the GPU machine: Python standard library only (the
machine may have no network and no pip packages). Reads a directory made by
`scripts/gpu-check.sh --prepare DIR` and writes DIR/report.txt and DIR/report.json.

Checks, each pass/fail in the report:
  device     `colibri --backend cuda info` runs on the GPU (device, SM, image cubin|ptx)
  logits     per model: `forward --backend cuda` vs the CPU logits made at --prepare,
             max |cuda - cpu| / max |cpu| <= the model's tolerance (per weight type, docs/cuda.md)
  greedy     per model: `generate --backend cuda` continues the prompt with the CPU's greedy ids
Figures (reported, no pass/fail): the device copy bandwidth (`colibri gpuprobe`); `bench --backend
cuda` decode tok/s per model with the decode CUDA graph and without it (COLIBRI_CUDA_GRAPH=0),
each next to the performance model's prediction (docs/cuda.md: driver calls per token from the
manifest, made at --prepare by benchmarks/gpu_model.py, x its per-call costs, or bytes per token /
the measured copy bandwidth, whichever is larger), and the per-call cost they imply; on a large
model written here by `colibri synth` (default ~1.4 GB of f16 weights per token): the open's time
(the weight upload) and decode tok/s with and without the graph, and on an integrated GPU also
with the weights device-mapped (COLIBRI_CUDA_WEIGHTS=map) instead of copied; decode tok/s x bytes
read per token = achieved bandwidth, and its fraction of the copy bandwidth against the goal
(>= 0.5).
Exit status: 0 every check passed, 1 a check failed, 2 the directory is unusable.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import struct
import subprocess
import sys
import time
from array import array
from pathlib import Path

GOAL_FRACTION = 0.5
# decode variants: the default (weights copied, one CUDA graph per token) and plain launches
VARIANTS: dict[str, dict[str, str]] = {"graph": {}, "no graph": {"COLIBRI_CUDA_GRAPH": "0"}}
# an integrated GPU can also read the weights from the mapped file (COLIBRI_CUDA_WEIGHTS=map)
MAPPED_VARIANTS: dict[str, dict[str, str]] = {
    "mapped, graph": {"COLIBRI_CUDA_WEIGHTS": "map"},
    "mapped, no graph": {"COLIBRI_CUDA_WEIGHTS": "map", "COLIBRI_CUDA_GRAPH": "0"}}
# docs/format.md tensor kinds: token embedding (one row read per token) and the routed experts
TOK_EMBED = 1
LM_HEAD = 3
EXPERT_KINDS = (30, 31, 32)


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


def read_f32(path: Path) -> array:
    a = array("f")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    if sys.byteorder != "little":
        a.byteswap()
    return a


class Runner:
    def __init__(self, root: Path, timeout: int) -> None:
        self.root = root
        self.colibri = str(root / "bin" / "colibri")
        self.timeout = timeout

    def run(self, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
        full = {k: v for k, v in os.environ.items()
                if k not in ("COLIBRI_CUDA_GRAPH", "COLIBRI_CUDA_WEIGHTS")}
        full.update(env or {})
        try:
            return subprocess.run([self.colibri, *args], capture_output=True, text=True,
                                  timeout=self.timeout, env=full)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([self.colibri, *args], 124, "",
                                               f"timed out after {self.timeout} s")


def fail_line(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1][:300]


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
    max_seq_len, n_layers = struct.unpack_from("<I", head, 24)[0], struct.unpack_from("<I", head, 36)[0]
    s = pm["synth"]
    kernels = s["fixed"] + s["per_layer"] * n_layers
    merge = s["merge_per_layer"] * n_layers if max_seq_len > s["kv_split"] else 0
    return {"kernels": kernels, "copies": s["copies"], "graph_nodes": kernels + merge,
            "graph_calls": s["graph_calls"]}


def bench_variants(r: Runner, model: Path, bench: list[str], variants: dict[str, dict[str, str]],
                   launches: dict | None, bytes_per_token: int, copy_gbps: float | None,
                   pm: dict | None) -> dict:
    """decode tok/s of `bench --backend cuda` per variant, with the model's prediction."""
    out: dict = {}
    for name, env in variants.items():
        proc = r.run("--backend", "cuda", "bench", str(model), *bench, "--json", env=env)
        if proc.returncode != 0:
            out[name] = {"error": fail_line(proc)}
            continue
        b = json.loads(proc.stdout)
        tok_s = b["decode_tok_s"]
        v = {"decode_tok_s": tok_s, "weights": b.get("backend", {}).get("cuda_weights", "")}
        if tok_s > 0 and launches and pm:
            ms, bound = predict_ms(launches, bytes_per_token, copy_gbps, pm, "no graph" not in name)
            v.update(ms_per_token=1e3 / tok_s, model_ms=ms, model_bound=bound,
                     measured_over_model=1e3 / tok_s / ms)
            if "no graph" in name:  # launch-bound small models: the cost of one driver call
                v["us_per_call"] = 1e6 / tok_s / (launches["kernels"] + launches["copies"])
        out[name] = v
    return out


def check_model(r: Runner, m: dict, prompt: list[int], greedy_new: int, work: Path,
                bench: list[str], copy_gbps: float | None = None, pm: dict | None = None) -> dict:
    model = r.root / m["path"]
    out = {"name": m["name"], "family": m["family"], "dtype": m["dtype"],
           "tolerance": m["tolerance"]}
    ids = ",".join(map(str, prompt))
    lfile = work / f"{m['name']}.cuda.f32"
    proc = r.run("--backend", "cuda", "forward", str(model), "--ids", ids, "--logits-out", str(lfile))
    if proc.returncode != 0:
        out.update(logits_ok=False, logits_error=fail_line(proc))
    else:
        want, got = read_f32(r.root / m["logits"]), read_f32(lfile)
        if len(want) != len(got):
            out.update(logits_ok=False, logits_error=f"{len(got)} logits, expected {len(want)}")
        else:
            scale = max(abs(v) for v in want) or 1.0
            diff = max(abs(a - b) for a, b in zip(got, want))  # NaN compares false: caught below
            finite = all(v == v and abs(v) != float("inf") for v in got)
            rel = diff / scale if finite else float("inf")
            out.update(logits_ok=finite and rel <= m["tolerance"], logits_rel_err=rel)
    proc = r.run("--backend", "cuda", "generate", str(model), "--ids", ids, "--max-new", str(greedy_new))
    if proc.returncode != 0:
        out.update(greedy_ok=False, greedy_error=fail_line(proc))
    else:
        new = json.loads(proc.stdout)["new_ids"]
        out.update(greedy_ok=new == m["greedy_new_ids"], greedy_new_ids=new,
                   greedy_expected=m["greedy_new_ids"])
    if not bench:
        return out
    out["decode"] = bench_variants(r, model, bench, VARIANTS, m.get("launches"),
                                   decode_bytes_per_token(model), copy_gbps, pm)
    if "decode_tok_s" in out["decode"]["graph"]:
        out["decode_tok_s"] = out["decode"]["graph"]["decode_tok_s"]
    errors = [f"{k}: {v['error']}" for k, v in out["decode"].items() if "error" in v]
    if errors:
        out["bench_error"] = "; ".join(errors)
    return out


def large_model(r: Runner, work: Path, synth_args: list[str], bench: list[str],
                probe_gbps: float | None, pm: dict | None = None, integrated: bool = False) -> dict:
    path = work / "large.colibri"
    t0 = time.monotonic()
    proc = r.run("synth", str(path), *synth_args)
    if proc.returncode != 0:
        return {"error": f"colibri synth: {fail_line(proc)}"}
    out = {"synth_args": synth_args, "synth_s": round(time.monotonic() - t0, 1),
           "file_bytes": path.stat().st_size, "bytes_per_token": decode_bytes_per_token(path)}
    # the open, timed: the device copy's chunked upload (or the mapping) and the context
    modes = {"copied": {}, **({"mapped": {"COLIBRI_CUDA_WEIGHTS": "map"}} if integrated else {})}
    out["open_s"] = {}
    for mode, env in modes.items():
        t0 = time.monotonic()
        proc = r.run("--backend", "cuda", "info", str(path), env=env)
        if proc.returncode == 0:
            out["open_s"][mode] = time.monotonic() - t0
    launches = synth_launches(path, pm) if pm else None
    variants = {**VARIANTS, **(MAPPED_VARIANTS if integrated else {})}
    out["decode"] = bench_variants(r, path, bench, variants, launches, out["bytes_per_token"],
                                   probe_gbps, pm)
    for v in out["decode"].values():
        if "decode_tok_s" in v:
            v["achieved_gbps"] = v["decode_tok_s"] * out["bytes_per_token"] / 1e9
            if probe_gbps:
                v["fraction_of_copy_bandwidth"] = v["achieved_gbps"] / probe_gbps
    best = out["decode"]["graph"]
    if "error" in best:
        out["error"] = f"bench: {best['error']}"
    else:
        out.update(decode_tok_s=best["decode_tok_s"], achieved_gbps=best["achieved_gbps"])
        if probe_gbps:
            out["fraction_of_copy_bandwidth"] = best["fraction_of_copy_bandwidth"]
            out["goal_met"] = best["fraction_of_copy_bandwidth"] >= GOAL_FRACTION
    path.unlink(missing_ok=True)
    return out


def variant_line(name: str, v: dict) -> str:
    """One decode variant: measured, the model's prediction and their ratio."""
    if "error" in v:
        return f"  {name}: {v['error']}"
    line = f"  {name:<17} {v['decode_tok_s']:10.1f} tok/s"
    if "ms_per_token" in v:
        line += (f" = {v['ms_per_token']:.3g} ms/token; model {v['model_ms']:.3g} ms "
                 f"({v['model_bound']}-bound), measured/model {v['measured_over_model']:.2f}")
    if "achieved_gbps" in v:
        line += f"; {v['achieved_gbps']:.3g} GB/s"
    return line


def median(xs: list[float]) -> float:
    xs = sorted(xs)
    n = len(xs)
    return xs[n // 2] if n % 2 else (xs[n // 2 - 1] + xs[n // 2]) / 2


def text_report(rep: dict) -> str:
    lines = [f"gpu-check: {'PASS' if rep['passed'] else 'FAIL'}  ({rep['checks_passed']}/"
             f"{rep['checks_total']} checks)", f"binary: {rep['version'].splitlines()[0]}"]
    d = rep["device"]
    lines.append(f"device: {'ok' if d['ok'] else 'FAIL'}  {d.get('cuda_device', '')} sm_{d.get('cuda_sm', 0)} "
                 f"driver {d.get('cuda_driver_version', 0)} image {d.get('cuda_image', '')} "
                 f"weights {d.get('cuda_weights', '')} {d.get('error', '')}".rstrip())
    lines.append(f"{'model':<22} {'logits':<6} {'rel err':>10} {'tol':>8} {'greedy':<6} "
                 f"{'tok/s graph':>11} {'no graph':>9} {'us/call':>8} {'meas/model':>10}")

    def fig(m: dict, variant: str, key: str, fmt: str) -> str:
        v = m.get("decode", {}).get(variant, {})
        return format(v[key], fmt) if key in v else "-"

    for m in rep["models"]:
        err = m.get("logits_rel_err")
        ratios = "/".join(fig(m, k, "measured_over_model", ".2f") for k in VARIANTS)
        lines.append(f"{m['name']:<22} {'ok' if m['logits_ok'] else 'FAIL':<6} "
                     f"{'-' if err is None else f'{err:.2e}':>10} {m['tolerance']:>8.0e} "
                     f"{'ok' if m['greedy_ok'] else 'FAIL':<6} {fig(m, 'graph', 'decode_tok_s', '.1f'):>11} "
                     f"{fig(m, 'no graph', 'decode_tok_s', '.1f'):>9} "
                     f"{fig(m, 'no graph', 'us_per_call', '.2f'):>8} {ratios:>10}")
        for key in ("logits_error", "greedy_error", "bench_error"):
            if key in m:
                lines.append(f"    {key}: {m[key]}")
        if m.get("greedy_ok") is False and "greedy_new_ids" in m:
            lines.append(f"    greedy: got {m['greedy_new_ids']}, expected {m['greedy_expected']}")
    p = rep["probe"]
    lines.append(f"device copy bandwidth: {p['copy_gbps']:.1f} GB/s (read + write, {p['iters']} x "
                 f"{p['bytes'] >> 20} MiB)" if "copy_gbps" in p else f"device copy bandwidth: {p.get('error')}")
    perf = rep.get("perf")
    if perf:
        lines.append(f"performance model (docs/cuda.md): {perf['model_launch_us']:g} us per driver "
                     f"call without a graph, measured {perf['us_per_call_median']:.2f} us (median of "
                     f"{perf['models']} small models, ms/token / calls per token); with the graph "
                     f"measured/model {perf['graph_over_model_median']:.2f}, without "
                     f"{perf['plain_over_model_median']:.2f} (medians)")
    lg = rep.get("large")
    if lg:
        if "error" in lg:
            lines.append(f"large model: {lg['error']}")
        else:
            lines.append(f"large model ({lg['bytes_per_token'] / 1e9:.3g} GB read per token, file "
                         f"{lg['file_bytes'] / 1e9:.3g} GB): decode {lg['decode_tok_s']:.1f} tok/s = "
                         f"{lg['achieved_gbps']:.3g} GB/s")
            for mode, sec in lg.get("open_s", {}).items():
                what = "chunked upload included" if mode == "copied" else "no upload"
                lines.append(f"  open, weights {mode}: {sec:.2f} s = {lg['file_bytes'] / 1e9 / sec:.3g} "
                             f"GB of file per second ({what})")
            for name, v in lg.get("decode", {}).items():
                lines.append(variant_line(name, v))
            if "fraction_of_copy_bandwidth" in lg:
                lines.append(f"  = {lg['fraction_of_copy_bandwidth']:.3%} of copy bandwidth; goal "
                             f">= {GOAL_FRACTION:.0%}: {'met' if lg['goal_met'] else 'NOT met'}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path, help="directory made by scripts/gpu-check.sh --prepare")
    ap.add_argument("--skip-large", action="store_true", help="no large-model bandwidth figure")
    ap.add_argument("--large-args", default="", help="options for `colibri synth` (default: its "
                    "defaults, ~1.4 GB f16 per token)")
    ap.add_argument("--bench", default="--prompt-len 16 --gen 64 --runs 3",
                    help="options for every `colibri bench` (default %(default)s)")
    ap.add_argument("--skip-bench", action="store_true", help="no per-model decode tok/s")
    ap.add_argument("--probe-mib", type=int, default=512, help="copy-bandwidth buffer size, MiB")
    ap.add_argument("--timeout", type=int, default=900, help="seconds per colibri command")
    args = ap.parse_args(argv)
    root = args.dir.resolve()
    try:
        manifest = json.loads((root / "manifest.json").read_text())
    except (OSError, ValueError) as exc:
        print(f"gpu-check: {root} is not a prepared directory ({exc}); make one with "
              "`scripts/gpu-check.sh --prepare DIR`", file=sys.stderr)
        return 2
    work = root / "work"
    work.mkdir(exist_ok=True)
    r = Runner(root, args.timeout)
    rep: dict = {"dir": str(root), "version": r.run("--version").stdout.strip() or "?",
                 "prepared_sm": manifest["sm"]}
    first = root / manifest["models"][0]["path"]
    proc = r.run("--backend", "cuda", "info", str(first))
    if proc.returncode == 0:
        rep["device"] = {"ok": True, **json.loads(proc.stdout)["backend"]}
    else:
        rep["device"] = {"ok": False, "error": fail_line(proc)}
    print(f"gpu-check: device {'ok' if rep['device']['ok'] else 'FAILED'}", flush=True)
    # the copy bandwidth first: the performance model's bandwidth bound uses it
    proc = r.run("gpuprobe", "--mib", str(args.probe_mib), "--json")
    rep["probe"] = json.loads(proc.stdout) if proc.returncode == 0 else {"error": fail_line(proc)}
    copy_gbps = rep["probe"].get("copy_gbps")
    pm = manifest.get("perf_model")
    rep["models"] = []
    for m in manifest["models"]:
        res = check_model(r, m, manifest["prompt_ids"], manifest["greedy_new"], work,
                          [] if args.skip_bench else shlex.split(args.bench), copy_gbps, pm)
        rep["models"].append(res)
        print(f"gpu-check: {m['name']}: logits {'ok' if res['logits_ok'] else 'FAIL'}, greedy "
              f"{'ok' if res['greedy_ok'] else 'FAIL'}", flush=True)
    timed = [m["decode"] for m in rep["models"] if "decode" in m]
    plain = [d["no graph"] for d in timed if "us_per_call" in d["no graph"]]
    graph = [d["graph"] for d in timed if "measured_over_model" in d["graph"]]
    if plain and graph and pm:
        rep["perf"] = {"models": len(plain), "model_launch_us": pm["launch_us"],
                       "us_per_call_median": median([v["us_per_call"] for v in plain]),
                       "plain_over_model_median": median([v["measured_over_model"] for v in plain]),
                       "graph_over_model_median": median([v["measured_over_model"] for v in graph])}
    if not args.skip_large:
        print("gpu-check: writing and timing the large model (colibri synth)", flush=True)
        rep["large"] = large_model(r, work, shlex.split(args.large_args), shlex.split(args.bench),
                                   copy_gbps, pm, bool(rep["device"].get("cuda_integrated")))
    checks = [rep["device"]["ok"]] + [m[k] for m in rep["models"] for k in ("logits_ok", "greedy_ok")]
    rep.update(checks_total=len(checks), checks_passed=sum(bool(c) for c in checks),
               passed=all(checks))
    text = text_report(rep)
    (root / "report.json").write_text(json.dumps(rep, indent=1) + "\n")
    (root / "report.txt").write_text(text)
    print(text, end="")
    print(f"gpu-check: report in {root / 'report.txt'} and {root / 'report.json'}")
    return 0 if rep["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
