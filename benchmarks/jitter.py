"""Benchmark: latency jitter beside noisy neighbours, with and without real-time mode, Colibri
side by side with llama.cpp (issue 27; figures in docs/runtime.md, "Real-time mode").

    python benchmarks/jitter.py [--samples 300] [--prompt-len 32] [--gen 16] [--cpus 1]
                                [--loads idle,cpu,memory] [--llama-cpp DIR] [--work DIR]
                                [--pace-ms 0] [--rt-runtime-us 950000,-1] [--repeats 1]
                                [--trace-dir DIR]

The same prompt and decode run --samples times in each cell of the table:

* loads: ``idle``; ``cpu``: stress-ng ``--cpu`` on every CPU not in --cpus (the other cores);
  ``memory``: stress-ng ``--stream`` (STREAM's copy/scale/add/triad over 4x the L3) on the other
  cores, a memory-bandwidth hog;
* modes: ``normal`` (the engine's defaults, --threads = the number of --cpus, no pinning) and
  ``realtime``: Colibri's ``--cpus LIST --sched fifo:50 --mlock --barrier spin``; llama.cpp's own
  equivalents ``-C MASK --cpu-strict 1 --prio 3`` (its "realtime" priority: SCHED_FIFO), ``--poll
  100`` and ``-lm mmap+mlock``.

Pacing (``--pace-ms MS``): Colibri's runs start every MS ms (``colibri bench --pace-ms``: a fixed
grid, so a sample does not start in the cache, clock or RT-throttling state the one before left;
a run that overran its slot starts at once and is counted). llama-bench has no such option (its
``--delay`` sleeps between tests, not repetitions): its repetitions stay back to back.

RT throttling (``--rt-runtime-us 950000,-1``; root): the real-time cells run once per value of
/proc/sys/kernel/sched_rt_runtime_us, interleaved (value A, value B, value A... with
``--repeats``), the value set just before the cell and the original written back after it and at
exit (``finally``, SIGTERM and SIGINT included). ``--trace-dir`` keeps every Colibri sample with
its start time (``colibri bench --trace``) and prints where the slow ones fall in the 1 s period:
``phase R`` is the length of the mean of exp(2 pi i t / period) over the slow tokens' end times
(1: all end at the same point of the period, as throttled tokens do, since a throttled thread
runs again when the budget is refilled; about 1/sqrt(n) for n times with no relation to it).

Colibri's figures come from ``colibri bench --json`` (the first token of each run: prompt + pick;
every decoded token; minor/major page faults per token). llama.cpp's from ``llama-bench -o
json``'s per-repetition samples: ``-p P -n 0`` (the prompt, its last token's logits: the first
token) and ``-p 0 -n 1 -d P`` (one token decoded after a P-token context, the context restored
from its saved state before each repetition: a per-token sample).

The model is benchmarks/runtime.py's random Mixtral (hidden 1024, 8 layers, 8 experts top-2,
vocab 32000), int8 for Colibri and q8_0 for llama.cpp (the pair FACTS.md measured).

What a 2-core machine cannot show (docs/runtime.md lists it with the table): more than one
inference core beside a hog (one core is the inference core, the other the hog's and the OS's);
kernel isolation (isolcpus/nohz_full need a reboot of this machine's kernel) and IRQ affinity
(/proc/irq is read-only in a container), which `invoke tune` applies on a Jetson; and a quiet
baseline: other work on a shared machine lands on the inference core too. Figures are printed,
not asserted.
"""

from __future__ import annotations

import argparse
import cmath
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import runtime as peer  # noqa: E402  (benchmarks/runtime.py: the model and the llama.cpp helpers)

LOADS = ("idle", "cpu", "memory")
MODES = ("normal", "realtime")
PRIORITY = 50
# Goals of issue 27 (realtime mode): with a CPU hog, p99/p50 <= 1.10 and p99.9/p50 <= 1.25 (first
# token and per token); with a memory-bandwidth hog, p99/p50 <= 1.25.
GOALS = {"cpu": (1.10, 1.25), "memory": (1.25, None)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpu_list(cpus: list[int]) -> str:
    return ",".join(map(str, cpus))


def others(cpus: list[int]) -> list[int]:
    return [c for c in sorted(os.sched_getaffinity(0)) if c not in cpus]


@contextmanager
def hog(load: str, cores: list[int]):
    """stress-ng pinned to ``cores`` for the duration (nothing for idle)."""
    if load == "idle" or not cores:
        yield None
        return
    stress = shutil.which("stress-ng")
    if stress is None:
        raise SystemExit("stress-ng not found: scripts/bootstrap.sh installs it (apt-get install "
                         "stress-ng)")
    kind = {"cpu": ["--cpu", str(len(cores))],
            "memory": ["--stream", str(len(cores))]}[load]
    proc = subprocess.Popen(["taskset", "-c", cpu_list(cores), stress, *kind, "--timeout", "0",
                             "--quiet"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    time.sleep(1.0)              # let it reach its working set (STREAM allocates 4x L3)
    if proc.poll() is not None:
        raise SystemExit(f"stress-ng {' '.join(kind)} exited at once ({proc.returncode})")
    try:
        yield proc
    finally:
        os.killpg(proc.pid, signal.SIGTERM)   # its own session: stress-ng and its workers
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


RT_RUNTIME = Path("/proc/sys/kernel/sched_rt_runtime_us")
RT_PERIOD = Path("/proc/sys/kernel/sched_rt_period_us")


class RtRuntime:
    """This machine's sched_rt_runtime_us, set per cell and always put back: ``restore`` runs
    after every cell, at exit, and on SIGTERM/SIGINT (turned into SystemExit so ``finally``
    blocks run)."""

    def __init__(self) -> None:
        self.original = int(RT_RUNTIME.read_text())
        self.period = int(RT_PERIOD.read_text())

    def set(self, value: int) -> None:
        from colibri_kit.fleet.tune.rt_throttle import runtime_refusal

        why = runtime_refusal(value, self.period)
        if why:
            raise SystemExit(f"--rt-runtime-us: {why}")
        if int(RT_RUNTIME.read_text()) != value:
            RT_RUNTIME.write_text(f"{value}\n")
        if int(RT_RUNTIME.read_text()) != value:
            raise SystemExit(f"{RT_RUNTIME} did not take {value}")

    def restore(self) -> None:
        if int(RT_RUNTIME.read_text()) != self.original:
            RT_RUNTIME.write_text(f"{self.original}\n")


def _raise_exit(signum, _frame) -> None:
    raise SystemExit(128 + signum)


def colibri_cell(binary: Path, model: Path, mode: str, cpus: list[int], args,
                 trace: Path | None = None) -> dict:
    rt = (["--cpus", cpu_list(cpus), "--sched", f"fifo:{PRIORITY}", "--mlock", "--barrier", "spin"]
          if mode == "realtime" else [])
    argv = [str(binary), "--backend", "cpu", "--threads", str(len(cpus)), *rt, "bench", str(model),
            "--prompt-len", str(args.prompt_len), "--gen", str(args.gen), "--runs",
            str(args.samples), "--pace-ms", str(args.pace_ms), "--json"]
    if trace is not None:
        argv += ["--trace", str(trace)]
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    r = json.loads(proc.stdout)
    out = {"first": r["first_token_ms"], "token": r["token_ms"],
           "faults": r["faults_per_token"], "tok_s": r["decode_tok_s"],
           "pace_overruns": r.get("pace_overruns", 0)}
    if trace is not None:
        out["trace"] = trace_phase(trace, 1000.0)
    return out


def trace_phase(path: Path, period_ms: float) -> dict:
    """Where the slow decoded tokens of a ``colibri bench --trace`` file fall in the RT period:
    slow = above the median + 20 ms (a throttling stop is 50 ms at the default budget; other
    disturbances here are a few ms); R of their end times (see the module), the same for all
    tokens, and the median gap between consecutive slow tokens. Also the machine's own drift: each
    run's median token (a run lasts ~0.1 s) as p99/p50 over the runs, and each token against its
    run's median (p99, p99.9): when the runs' medians spread as far as the tokens do, the tail is
    seconds-long phases in which every token is slower (host contention, clocks), not a token
    that the engine delayed."""
    rows = [line.split() for line in path.read_text().splitlines()[1:]]
    toks = [(float(r[3]), float(r[4])) for r in rows if r[0] == "token"]
    if not toks:
        return {}
    per_run: dict[str, list[float]] = {}
    for r in rows:
        if r[0] == "token":
            per_run.setdefault(r[1], []).append(float(r[4]))
    run_median = {k: sorted(v)[len(v) // 2] for k, v in per_run.items()}
    medians = sorted(run_median.values())
    within = sorted(d / run_median[k] for k, v in per_run.items() for d in v)
    ms = sorted(d for _, d in toks)
    cut = ms[len(ms) // 2] + 20.0
    slow = [(t, d) for t, d in toks if d > cut]

    def r_of(ends: list[float]) -> float:
        if not ends:
            return 0.0
        return abs(sum(cmath.exp(2j * math.pi * e / period_ms) for e in ends)) / len(ends)
    ends = [t + d for t, d in slow]
    gaps = sorted(b - a for a, b in zip(ends, ends[1:]))
    return {"tokens": len(toks), "slow": len(slow), "slow_cut_ms": cut,
            "phase_r_slow": r_of(ends), "phase_r_all": r_of([t + d for t, d in toks]),
            "median_gap_ms": gaps[len(gaps) // 2] if gaps else None,
            "span_s": (toks[-1][0] - toks[0][0]) / 1e3,
            "run_medians_p99_p50": pct(medians, 99) / pct(medians, 50),
            "within_run_p99": pct(within, 99), "within_run_p999": pct(within, 99.9)}


def pct(sorted_ms: list[float], p: float) -> float:
    """The p-th percentile as colibri bench computes it (nearest rank on sorted samples)."""
    s = sorted_ms
    return s[min(len(s) - 1, max(0, int(len(s) * p / 100.0 + 0.999999) - 1))]


def distribution(samples_ms: list[float]) -> dict:
    """p50, p99, p99.9 and max as colibri bench computes them."""
    s = sorted(samples_ms)
    return {"p50": pct(s, 50), "p99": pct(s, 99), "p999": pct(s, 99.9), "max": s[-1], "n": len(s)}


def llama_cell(bench: Path, model: Path, mode: str, cpus: list[int], args) -> dict:
    rt = []
    if mode == "realtime":
        mask = sum(1 << c for c in cpus)
        rt = ["-C", f"0x{mask:x}", "--cpu-strict", "1", "--prio", "3", "--poll", "100",
              "-lm", "mmap+mlock"]
    common = [str(bench), "-m", str(model), "-t", str(len(cpus)), "-r", str(args.samples),
              "-o", "json", *rt, *args.llama_bench_args.split()]
    out = {}
    for name, test in (("first", ["-p", str(args.prompt_len), "-n", "0"]),
                       ("token", ["-p", "0", "-n", "1", "-d", str(args.prompt_len)])):
        proc = subprocess.run([*common, *test], capture_output=True, text=True)
        if proc.returncode in (-4, 132) and "--repack" not in common:
            # SIGILL: llama.cpp's repacked q8_0 path on AMX hosts (FACTS.md): without repacking
            common.extend(["--repack", "0"])
            out["note"] = "--repack 0 (SIGILL with repacking on this CPU)"
            proc = subprocess.run([*common, *test], capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"llama-bench {' '.join(test + rt)} failed ({proc.returncode}): "
                             f"{proc.stderr.strip()[-500:]}")
        row = json.loads(proc.stdout)[0]
        out[name] = distribution([ns / 1e6 for ns in row["samples_ns"]])
        out["build"] = row.get("build_commit", "?")
    return out


def ratios(d: dict) -> tuple[float, float]:
    return d["p99"] / d["p50"], d["p999"] / d["p50"]


def summary(r: dict) -> str:
    """One cell in a progress line: p50 and p99/p50 of the first token and of a token."""
    f, t = r["first"], r["token"]
    return (f"  first token p50 {f['p50']:.2f} ms, p99/p50 {ratios(f)[0]:.3f}; token p50 "
            f"{t['p50']:.2f} ms, p99/p50 {ratios(t)[0]:.3f}")


def verdict(load: str, mode: str, d: dict) -> str:
    goal = GOALS.get(load) if mode == "realtime" else None
    if not goal:
        return ""
    r99, r999 = ratios(d)
    ok = r99 <= goal[0] and (goal[1] is None or r999 <= goal[1])
    return " " if ok else "*"


def run_cells(results: dict, load: str, mode: str, rt_us: int | None, rep: int,
              rt_knob: RtRuntime | None, binary: Path, model: Path, llama, cpus: list[int],
              args, loadavg: list[str]) -> None:
    """One row pair (Colibri, then llama.cpp) of the table, with sched_rt_runtime_us = rt_us
    for its duration when given."""
    tag = f"{load}/{mode}" + (f"/rt{rt_us}" if rt_us is not None else "") + f"/{rep}"
    loadavg.append(f"{tag} {Path('/proc/loadavg').read_text().split()[0]}")
    try:
        if rt_us is not None and rt_knob is not None:
            rt_knob.set(rt_us)
        log(f"{tag}: colibri (load average {loadavg[-1].split()[-1]})")
        trace = (args.trace_dir / (tag.replace("/", "_") + ".txt")) if args.trace_dir else None
        r = colibri_cell(binary, model, mode, cpus, args, trace)
        r.update(rt_runtime_us=rt_us, repeat=rep)
        results[f"{load}/{mode}/colibri/{rt_us}/{rep}"] = r
        log(summary(r))
        if llama:
            log(f"{tag}: llama.cpp")
            r = llama_cell(*llama, mode, cpus, args)
            r.update(rt_runtime_us=rt_us, repeat=rep)
            results[f"{load}/{mode}/llama.cpp/{rt_us}/{rep}"] = r
            log(summary(r))
    finally:
        if rt_knob is not None:
            rt_knob.restore()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=300, help="runs per cell (hundreds)")
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--gen", type=int, default=16)
    ap.add_argument("--cpus", default=None,
                    help="inference CPUs, e.g. 1 or 2-5 (default: the last online CPU); the hogs "
                         "run on the others")
    ap.add_argument("--loads", default=",".join(LOADS))
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colibri-bench")
    ap.add_argument("--llama-cpp", type=Path, metavar="DIR",
                    help="llama.cpp tree built by scripts/build-llama-cpp.sh (else Colibri only)")
    ap.add_argument("--llama-bench-args", default="",
                    help="extra llama-bench arguments (e.g. '--repack 0' on AMX hosts)")
    ap.add_argument("--pace-ms", type=int, default=0, metavar="MS",
                    help="Colibri: start a run every MS ms (colibri bench --pace-ms; 0: back to "
                         "back); llama-bench has no per-repetition pacing")
    ap.add_argument("--rt-runtime-us", default="", metavar="LIST",
                    help="real-time cells once per /proc/sys/kernel/sched_rt_runtime_us value, "
                         "e.g. 950000,-1 (root; the original is always written back)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="run every row this many times, interleaved")
    ap.add_argument("--trace-dir", type=Path, default=None,
                    help="keep Colibri's per-sample traces here and print their RT-period phase")
    args = ap.parse_args()
    if not 0 <= args.pace_ms <= 600000:
        raise SystemExit("--pace-ms must be 0..600000")
    if args.repeats < 1:
        raise SystemExit("--repeats must be >= 1")
    try:
        runtimes = [int(x) for x in args.rt_runtime_us.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--rt-runtime-us {args.rt_runtime_us!r}: integers, e.g. 950000,-1") \
            from None
    online = sorted(os.sched_getaffinity(0))
    if args.cpus:
        from colibri_kit.fleet.tune.governors import parse_cpu_list

        cpus = parse_cpu_list(args.cpus)
    else:
        cpus = online[-1:]
    if not set(cpus) <= set(online):
        raise SystemExit(f"--cpus {args.cpus}: not all of them are ours (online: {online})")
    hog_cores = others(cpus)
    loads = [x for x in args.loads.split(",") if x]
    modes = [x for x in args.modes.split(",") if x]
    for x in loads:
        if x not in LOADS:
            raise SystemExit(f"--loads: {x!r} is not one of {', '.join(LOADS)}")
    if any(x != "idle" for x in loads) and not hog_cores:
        raise SystemExit(f"--cpus {cpu_list(cpus)} leaves no CPU for the hogs")
    args.work.mkdir(parents=True, exist_ok=True)

    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    built = build(load_profile("host"), where="host", progress=lambda m: None)
    binary = built.dist_dir / "bin" / "colibri"
    shape = peer.SHAPES["mixtral"]
    hf = peer.hf_checkpoint(args.work, shape, shape.layers)
    model = peer.converted(hf, args.work, "int8")
    llama = None
    if args.llama_cpp:
        root = args.llama_cpp.resolve()
        peer.llama_cpp_tools(root)
        gguf = peer.gguf_model(root, hf, args.work, "q8_0", shape.config["vocab_size"])
        llama = (root / "build" / "bin" / "llama-bench", gguf)

    rt_knob = RtRuntime() if runtimes else None
    if rt_knob is not None:
        for v in runtimes:
            rt_knob.set(v)          # refuse a bad value before any cell runs
        rt_knob.restore()
    if args.trace_dir is not None:
        args.trace_dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _raise_exit)
    results: dict[str, dict] = {}
    loadavg: list[str] = []
    try:
        for rep in range(args.repeats):
            for load in loads:
                with hog(load, hog_cores):
                    for mode in modes:
                        variants = runtimes if (mode == "realtime" and runtimes) else [None]
                        for rt_us in variants:
                            run_cells(results, load, mode, rt_us, rep, rt_knob, binary, model,
                                      llama, cpus, args, loadavg)
    finally:
        if rt_knob is not None:
            rt_knob.restore()

    print(f"machine: {os.cpu_count()} CPUs; inference on CPU {cpu_list(cpus)}, hogs on "
          f"{cpu_list(hog_cores) or '-'}; load average {os.getloadavg()[0]:.1f} (per cell: "
          f"{'; '.join(loadavg)}); {args.samples} samples per cell, prompt {args.prompt_len}, "
          f"decode {args.gen}, Colibri paced {args.pace_ms} ms"
          + (f"; sched_rt_runtime_us {rt_knob.original} (restored), period {rt_knob.period}"
             if rt_knob else f"; sched_rt_runtime_us {RT_RUNTIME.read_text().strip()}"))
    peer_rows = [r for k, r in results.items() if "/llama.cpp/" in k]
    print("model: random Mixtral 1024x8 layers, 8 experts top-2, vocab 32000; colibri int8, "
          "llama.cpp q8_0" + (f" (llama.cpp build {peer_rows[0]['build']}"
                               f"{', ' + peer_rows[0]['note'] if 'note' in peer_rows[0] else ''})"
                               if peer_rows else ""))
    head = (f"{'load':<7}{'mode':<18}{'engine':<10}"
            f"{'first token ms p50/p99/p99.9/max':>34}{'p99/p50':>8}{'p99.9/p50':>10}"
            f"{'token ms p50/p99/p99.9/max':>30}{'p99/p50':>8}{'p99.9/p50':>10}{'faults/tok':>11}")
    print(head)
    for key, r in results.items():
        load, mode, engine = key.split("/")[:3]
        mode = mode + (f" rt={r['rt_runtime_us']}" if r.get("rt_runtime_us") is not None else "")
        mode += f" #{r['repeat'] + 1}" if args.repeats > 1 else ""
        cells = []
        for part in ("first", "token"):
            d = r[part]
            a, b = ratios(d)
            cells.append(f"{d['p50']:>8.2f}/{d['p99']:.2f}/{d['p999']:.2f}/{d['max']:.2f}"
                         f"{a:>8.3f}{b:>9.3f}{verdict(load, mode, d)}")
        faults = r.get("faults")
        ftxt = f"{faults['minor']:.2f}/{faults['major']:.2f}" if faults else "-"
        print(f"{load:<7}{mode:<18}{engine:<10}{cells[0]:>34}{cells[1]:>48}{ftxt:>11}")
    print("* = a goal of issue 27 not met in this run (realtime rows: cpu p99/p50 <= 1.10 and "
          "p99.9/p50 <= 1.25; memory p99/p50 <= 1.25); faults/tok = minor/major page faults per "
          "decoded token after warm-up (colibri bench)")
    for key, r in results.items():
        tr = r.get("trace")
        if tr:
            print(f"trace {key}: {tr['slow']} of {tr['tokens']} tokens slow (> {tr['slow_cut_ms']:.1f}"
                  f" ms) over {tr['span_s']:.0f} s; phase R of their ends {tr['phase_r_slow']:.2f}"
                  f" (all tokens {tr['phase_r_all']:.2f}); median gap "
                  + (f"{tr['median_gap_ms']:.0f} ms" if tr["median_gap_ms"] is not None else "-")
                  + f"; runs' median tokens p99/p50 {tr['run_medians_p99_p50']:.2f}, tokens / their"
                    f" run's median p99 {tr['within_run_p99']:.2f} p99.9 {tr['within_run_p999']:.2f}")
    print(json.dumps({"cpus": cpus, "hog_cores": hog_cores, "samples": args.samples,
                      "prompt_len": args.prompt_len, "gen": args.gen, "results": results}))


if __name__ == "__main__":
    main()
