#!/usr/bin/env python3
"""The run half of scripts/gpu-check.sh, on the GPU machine: Python standard library only (the
machine may have no network and no pip packages). Reads a directory made by
`scripts/gpu-check.sh --prepare DIR` and writes DIR/report.txt and DIR/report.json.

Checks, each pass/fail in the report:
  device     `colibri --backend cuda info` runs on the GPU (device, SM, image cubin|ptx)
  logits     per model: `forward --backend cuda` vs the CPU logits made at --prepare,
             max |cuda - cpu| / max |cpu| <= the model's tolerance (per weight type, docs/cuda.md)
  greedy     per model: `generate --backend cuda` continues the prompt with the CPU's greedy ids
Figures (reported, no pass/fail): `bench --backend cuda` decode tok/s per model; the device copy
bandwidth (`colibri gpuprobe`); on a large model written here by `colibri synth` (default ~1.4 GB
of f16 weights per token): decode tok/s x bytes read per token = achieved bandwidth, and its
fraction of the copy bandwidth against the goal (>= 0.5).
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

    def run(self, *args: str) -> subprocess.CompletedProcess:
        try:
            return subprocess.run([self.colibri, *args], capture_output=True, text=True,
                                  timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess([self.colibri, *args], 124, "",
                                               f"timed out after {self.timeout} s")


def fail_line(proc: subprocess.CompletedProcess) -> str:
    return (proc.stderr.strip().splitlines() or [f"exit status {proc.returncode}"])[-1][:300]


def check_model(r: Runner, m: dict, prompt: list[int], greedy_new: int, work: Path,
                bench: list[str]) -> dict:
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
    proc = r.run("--backend", "cuda", "bench", str(model), *bench, "--json")
    if proc.returncode == 0:
        out["decode_tok_s"] = json.loads(proc.stdout)["decode_tok_s"]
    else:
        out["bench_error"] = fail_line(proc)
    return out


def large_model(r: Runner, work: Path, synth_args: list[str], bench: list[str],
                probe_gbps: float | None) -> dict:
    path = work / "large.colibri"
    t0 = time.monotonic()
    proc = r.run("synth", str(path), *synth_args)
    if proc.returncode != 0:
        return {"error": f"colibri synth: {fail_line(proc)}"}
    out = {"synth_args": synth_args, "synth_s": round(time.monotonic() - t0, 1),
           "file_bytes": path.stat().st_size, "bytes_per_token": decode_bytes_per_token(path)}
    proc = r.run("--backend", "cuda", "bench", str(path), *bench, "--json")
    if proc.returncode != 0:
        out["error"] = f"bench: {fail_line(proc)}"
    else:
        tok_s = json.loads(proc.stdout)["decode_tok_s"]
        gbps = tok_s * out["bytes_per_token"] / 1e9
        out.update(decode_tok_s=tok_s, achieved_gbps=gbps)
        if probe_gbps:
            out["fraction_of_copy_bandwidth"] = gbps / probe_gbps
            out["goal_met"] = gbps / probe_gbps >= GOAL_FRACTION
    path.unlink(missing_ok=True)
    return out


def text_report(rep: dict) -> str:
    lines = [f"gpu-check: {'PASS' if rep['passed'] else 'FAIL'}  ({rep['checks_passed']}/"
             f"{rep['checks_total']} checks)", f"binary: {rep['version'].splitlines()[0]}"]
    d = rep["device"]
    lines.append(f"device: {'ok' if d['ok'] else 'FAIL'}  {d.get('cuda_device', '')} sm_{d.get('cuda_sm', 0)} "
                 f"driver {d.get('cuda_driver_version', 0)} image {d.get('cuda_image', '')} "
                 f"weights {d.get('cuda_weights', '')} {d.get('error', '')}".rstrip())
    lines.append(f"{'model':<22} {'logits':<6} {'rel err':>10} {'tol':>8} {'greedy':<6} {'decode tok/s':>12}")
    for m in rep["models"]:
        err = m.get("logits_rel_err")
        lines.append(f"{m['name']:<22} {'ok' if m['logits_ok'] else 'FAIL':<6} "
                     f"{'-' if err is None else f'{err:.2e}':>10} {m['tolerance']:>8.0e} "
                     f"{'ok' if m['greedy_ok'] else 'FAIL':<6} {m.get('decode_tok_s', '-'):>12}")
        for key in ("logits_error", "greedy_error", "bench_error"):
            if key in m:
                lines.append(f"    {key}: {m[key]}")
        if m.get("greedy_ok") is False and "greedy_new_ids" in m:
            lines.append(f"    greedy: got {m['greedy_new_ids']}, expected {m['greedy_expected']}")
    p = rep["probe"]
    lines.append(f"device copy bandwidth: {p['copy_gbps']:.1f} GB/s (read + write, {p['iters']} x "
                 f"{p['bytes'] >> 20} MiB)" if "copy_gbps" in p else f"device copy bandwidth: {p.get('error')}")
    lg = rep.get("large")
    if lg:
        if "error" in lg:
            lines.append(f"large model: {lg['error']}")
        else:
            lines.append(f"large model ({lg['bytes_per_token'] / 1e9:.3g} GB read per token, file "
                         f"{lg['file_bytes'] / 1e9:.3g} GB): decode {lg['decode_tok_s']:.1f} tok/s = "
                         f"{lg['achieved_gbps']:.3g} GB/s")
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
    rep["models"] = []
    for m in manifest["models"]:
        res = check_model(r, m, manifest["prompt_ids"], manifest["greedy_new"], work,
                          [] if args.skip_bench else shlex.split(args.bench))
        rep["models"].append(res)
        print(f"gpu-check: {m['name']}: logits {'ok' if res['logits_ok'] else 'FAIL'}, greedy "
              f"{'ok' if res['greedy_ok'] else 'FAIL'}", flush=True)
    proc = r.run("gpuprobe", "--mib", str(args.probe_mib), "--json")
    rep["probe"] = json.loads(proc.stdout) if proc.returncode == 0 else {"error": fail_line(proc)}
    if not args.skip_large:
        print("gpu-check: writing and timing the large model (colibri synth)", flush=True)
        rep["large"] = large_model(r, work, shlex.split(args.large_args), shlex.split(args.bench),
                                   rep["probe"].get("copy_gbps"))
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
