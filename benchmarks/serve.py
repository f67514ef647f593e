"""Benchmark: `colibri serve` with 1, 2, 4 and 8 concurrent streaming clients, beside llama.cpp's
`llama-server` on the same checkpoint, threads and slots (continuous batching on in both).

    python benchmarks/serve.py [--shape mixtral] [--dtype int8|q4] [--int8-act] [--threads 2] [--slots 8] [--requests 16]
                               [--levels 1,2,4,8] [--kinds short,unique,shared] [--system 512]
                               [--prompt 32] [--gen 64] [--rounds 3] [--llama-cpp DIR] [--llama-server-args A]
                               [--no-batching]
                               [--work /tmp/colibri-bench]

1. a bench model of benchmarks/runtime.py (--shape: random Mixtral, hidden 1024, 8 layers, 8
   experts top-2, FFN 2816, vocab 32000; or Qwen3-30B-A3B's geometry, --layers of it), converted once into --work (shared with that benchmark) for
   colibri (--dtype) and, with --llama-cpp DIR (a tree built by scripts/build-llama-cpp.sh, which
   builds llama-server), to GGUF q8_0 (int8), q4_0 (q4: llama-quantize --pure from the q8_0),
   f16 or f32 by DIR/convert_hf_to_gguf.py;
2. dist/host/bin/colibri (the kit's host build) serving it (`colibri serve --slots S --threads T`)
   and `llama-server -m GGUF -t T -tb T -np S -c S*1024` (its defaults otherwise: continuous
   batching, prompt caching);
3. per prompt kind and concurrency C: C client threads send --requests streaming completions in
   total (token-id prompts, --gen new tokens, temperature 0, usage included), timing the first
   token event and the end per request. Prompt kinds: `short` (--prompt ids, each request its
   own), `unique` (--system + --prompt ids, each request its own: every prefix cold), `shared`
   (one --system-id prefix shared by every request, then --prompt ids of its own; one untimed
   request computes the prefix first, as a warm prompt or an earlier client would have);
   With --llama-cpp both servers stay up and the rows interleave: each (kind, C) row runs on one
   engine then the other (the order swapped each round), --rounds times, with /proc/loadavg
   printed before every row, so both engines see the same load; the best round is kept;
4. prints every round's row with its load, then, per engine, kind and C (the best round): requests/s, generated tokens/s (all tokens / wall time,
   prefills included), decode tokens/s (C x the median request's tokens after the first / its
   time after the first), the weight-read bound for C tokens a step and the share of it reached,
   and first-token p50/p99; then time-to-first-token shared / unique (the prefix cache's goal: <=
   0.2 at one client for a 512-token system prompt).

The bound: on a CPU bound by memory bandwidth, a step that decodes N tokens reads the dense
weights once (attention, router, norms, LM head) and the union of the experts the N tokens chose,
for top-k of E about E * (1 - (1 - k/E)^N) experts per layer (independent choices), so N tokens
take bytes(N) = dense + experts_of_one_layer * layers * (1 - (1 - k/E)^N) and the bound is
N * bandwidth / bytes(N) tokens/s, with the read bandwidth measured here on the same threads
(benchmarks/runtime.py's probe). KV-cache reads and prefill are not in it, so the share
understates the engine at long contexts.

Figures are printed, not asserted: on a shared machine they move +-15-30% between runs.

    python benchmarks/serve.py --stall [--stall-prompt 511] [--rounds 3] [--prompt-rows 0,64]
                               [--llama-cpp DIR]

measures the trade of one pass for every slot instead: a decoding request's token gap, and the
longest gap while another slot's 511-id prompt is read (with the decode row, one 512-row pass:
the decode waits for the whole prefill step), engines interleaved per round.

    python benchmarks/serve.py --hostile [--flood 40] [--probes 50] [--prompt-kib 16,64,256,1000]

measures what hostile clients cost instead (issue 21), on the tiny chat model (`--slots 1
--threads 1`, every limit at its default): the server's CPU seconds (from /proc/PID/stat) per adversarial request body of 1 MiB
(tests/serve_support.adversarial_bodies), per text prompt of combining marks (what the
tokenizer's NFC normalisation reorders; the prompt is longer than the model's context, so the
cost is tokenizing alone), and how /health answers (share of 200, latency p50/p99/max) while
--flood connections each send a byte of a never-ending head every half second.
"""

from __future__ import annotations

import argparse
import http.client
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
sys.path.insert(0, str(ROOT / "tests"))  # serve_support: the tiny chat model, the slow-client flood


def gguf_type(dtype: str) -> str:
    """llama.cpp's type for a colibri dtype: q8_0 for int8, q4_0 for q4 (llama-quantize --pure
    from the q8_0 GGUF, benchmarks/runtime.py's gguf_model), f16 and f32 as they are."""
    return {"int8": "q8_0", "q4": "q4_0"}.get(dtype, dtype)


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(values: list[float], p: float) -> float:
    """Nearest-rank percentile (as `colibri bench`)."""
    v = sorted(values)
    return v[max(1, math.ceil(p / 100 * len(v))) - 1]


def start_server(binary: Path, model: Path, slots: int, threads: int,
                 *extra: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([str(binary), "--backend", "cpu", "serve", str(model), "--port", "0",
                             "--slots", str(slots), "--threads", str(threads), *extra],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert proc.stderr
    for line in proc.stderr:
        if '"event": "ready"' in line:
            port = json.loads(line)["port"]
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()
            return proc, port
    raise SystemExit(f"colibri serve exited {proc.wait()} before it was ready")


def one_request(port: int, model_id: str, prompt: list[int], gen: int,
                extra: dict | None = None) -> tuple[float, float, int]:
    """(first-token s, total s, generated tokens) of one streaming completion. The token count is
    the usage event's (both servers send it with stream_options.include_usage), else one per
    event that carries text or ids. extra: fields only one server takes."""
    body = json.dumps({"model": model_id, "prompt": prompt, "max_tokens": gen, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}, **(extra or {})})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    first = None
    events = usage = 0
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        ev = json.loads(line[6:])
        if ev.get("usage"):
            usage = ev["usage"].get("completion_tokens", 0)
        ch = ev.get("choices") or []
        if ch and (ch[0].get("token_ids") or ch[0].get("text")):
            events += 1
            if first is None:
                first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    conn.close()
    return first if first is not None else total, total, usage or events


def prompt_of(kind: str, i: int, args: argparse.Namespace, vocab: int) -> list[int]:
    """Request i's ids: its own part, after the --system prefix (shared, or its own)."""
    own = [(i * 7919 + k * 104729 + 13) % vocab for k in range(args.prompt)]
    if kind == "short":
        return own
    seed = 0 if kind == "shared" else i + 1
    return [(seed * 15485863 + k * 2654435761 + 7) % vocab for k in range(args.system)] + own


def run_level(port: int, model_id: str, clients: int, kind: str, args: argparse.Namespace,
              vocab: int, base: int, extra: dict | None = None) -> dict:
    results: list[tuple[float, float, int]] = []
    lock = threading.Lock()
    next_req = [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_req[0]
                if i >= args.requests:
                    return
                next_req[0] += 1
            r = one_request(port, model_id, prompt_of(kind, base + i, args, vocab), args.gen, extra)
            with lock:
                results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=worker) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    firsts = [r[0] * 1e3 for r in results]
    toks = sum(r[2] for r in results)
    rates = sorted((r[2] - 1) / (r[1] - r[0]) for r in results if r[2] > 1 and r[1] > r[0])
    p50, p99 = pct(firsts, 50), pct(firsts, 99)
    return {"clients": clients, "kind": kind, "requests": len(results), "wall_s": wall,
            "req_s": len(results) / wall, "gen_tok_s": toks / wall,
            "decode_tok_s": clients * rates[len(rates) // 2] if rates else float("nan"),
            "first_ms_p50": p50, "first_ms_p99": p99, "tokens": toks}


def weight_split(model: Path) -> tuple[int, int, int, int]:
    """(dense bytes a decode step reads, bytes of all routed experts of all layers, E, k) of a
    .colibri file: what the weight-read bound needs."""
    from colibri_kit.model.format import Kind, read_model

    m = read_model(model)
    h = m.header
    dense = experts = 0
    for rec in m:
        size = rec.nbytes + rec.scale_nbytes
        if rec.kind in (Kind.EXPERT_W1, Kind.EXPERT_W3, Kind.EXPERT_W2):
            experts += size
        elif rec.kind == Kind.TOK_EMBED:
            dense += size // h.vocab_size + (size if h.flags & 16 else 0)  # a row (tied: the head)
        else:
            dense += size
    return dense, experts, h.num_experts, h.top_k


def bound_tok_s(split: tuple[int, int, int, int], n: int, gbs: float) -> float:
    """N tokens a step: dense once + the expected union of their experts, at gbs GB/s."""
    dense, experts, e, k = split
    return n * gbs * 1e9 / (dense + experts * (1 - (1 - k / e) ** n))


class Engine:
    """One server process: colibri serve or llama-server, on a free port."""

    def __init__(self, name: str, argv: list[str], log_path: Path, ready,  # noqa: ANN001
                 extra: dict | None = None) -> None:
        self.name = name
        self.extra = extra  # request fields for this server only
        self.log = open(log_path, "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, text=True)
        self.port = ready(self)

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(120)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self.log.close()


def amx_host() -> bool:
    """AMX in /proc/cpuinfo's flags: this llama.cpp build crashes with repacked weights there
    (scripts/build-llama-cpp.sh)."""
    try:
        return " amx_int8" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def colibri_engine(binary: Path, model: Path, args: argparse.Namespace, log_path: Path,
                   prompt_rows: int = 0) -> Engine:
    argv = [str(binary), "--backend", "cpu", *(["--int8-act"] if args.int8_act else []), "serve",
            str(model), "--port", "0", "--slots", str(args.slots), "--threads", str(args.threads),
            "--max-queue", "64"]
    name = "colibri --int8-act" if args.int8_act else "colibri"
    if args.no_batching:
        argv.append("--no-batching")
        name += " --no-batching"
    if prompt_rows:
        argv += ["--prompt-rows", str(prompt_rows)]
        name += f" --prompt-rows {prompt_rows}"

    def ready(e: Engine) -> int:
        end = time.monotonic() + 300
        while time.monotonic() < end and e.proc.poll() is None:
            for line in log_path.read_text().splitlines():
                if '"event": "ready"' in line:
                    log(f"colibri ready: {line}")
                    return json.loads(line)["port"]
            time.sleep(0.2)
        raise SystemExit(f"colibri serve did not start: {log_path.read_text()[-2000:]}")
    return Engine(name, argv, log_path, ready)


def llama_engine(server: Path, gguf: Path, args: argparse.Namespace, log_path: Path) -> Engine:
    port = free_port()
    argv = [str(server), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-t",
            str(args.threads), "-tb", str(args.threads), "-np", str(args.slots), "-c",
            str(args.slots * 1024), *args.llama_server_args.split()]

    def ready(e: Engine) -> int:
        end = time.monotonic() + 300
        while time.monotonic() < end and e.proc.poll() is None:
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                conn.request("GET", "/health")
                if conn.getresponse().status == 200:
                    return port
            except OSError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"llama-server did not start: {log_path.read_text()[-2000:]}")
    # the random checkpoint's EOS id may come up: llama-server can be told to go on (colibri's
    # converted file has no EOS id, so it always generates --gen tokens)
    return Engine("llama-server", argv, log_path, ready, {"ignore_eos": True})


def loadavg() -> str:
    """/proc/loadavg's 1, 5 and 15 minute figures (the other engineers' load on a shared host)."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def measure(engines: list[Engine], model_id: str, args: argparse.Namespace, vocab: int) -> list[dict]:
    """Every row of every engine, --rounds times, the engines interleaved row by row (their order
    swapped each round) so that both see the same load; each row's /proc/loadavg before it is
    kept. Each round's requests have ids of their own (no engine's prompt cache helps across
    rounds); within a round both engines get the same ids."""
    rows = []
    for e in engines:
        one_request(e.port, model_id, [1] * args.prompt, 4, e.extra)  # pages the weights in
    levels = [int(x) for x in args.levels.split(",")]
    for kind in args.kinds.split(","):
        if kind == "shared":  # the prefix computed once, untimed (a warm prompt would have)
            for e in engines:
                one_request(e.port, model_id, prompt_of("shared", 10 ** 6, args, vocab), 1, e.extra)
        for rnd in range(args.rounds):
            order = engines if rnd % 2 == 0 else engines[::-1]
            for n, c in enumerate(levels):
                for e in order:
                    load = loadavg()
                    log(f"round {rnd + 1}/{args.rounds} {e.name}: {kind}, {c} client(s), load {load} ...")
                    ours = e.name.startswith("colibri")
                    before = step_split(e.port) if ours else None
                    r = run_level(e.port, model_id, c, kind, args, vocab,
                                  1000 * (n + 1) + 100000 * rnd, e.extra)
                    if before:  # where colibri's step time went in this row
                        r["split"] = split_line(before, step_split(e.port), r["wall_s"])
                        log(f"  steps: {r['split']}")
                    rows.append({"engine": e.name, "round": rnd + 1, "load": load, **r})
                    log(f"  {r['gen_tok_s']:.1f} gen tok/s, decode {r['decode_tok_s']:.1f}, "
                        f"first token p50 {r['first_ms_p50']:.0f} ms")
    return rows


SPLIT = ("busy", "step", "pass", "mixer", "ffn", "head", "sample")


def step_split(port: int) -> dict[str, float]:
    """colibri serve's step-loop seconds (/metrics colibri_batch_*_seconds_total) and passes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    vals = dict(line.split() for line in text.splitlines() if line and not line.startswith("#"))
    out = {k: float(vals.get(f"colibri_batch_{k}_seconds_total", "nan")) for k in SPLIT}
    out["passes"] = float(vals.get("colibri_batch_passes_total", "nan"))
    out["rows"] = float(vals.get("colibri_batch_rows_total", "nan"))
    return out


def split_line(before: dict[str, float], after: dict[str, float], wall: float) -> str:
    """A row's step time split: per pass (ms) and as shares of the row's wall time."""
    d = {k: after[k] - before[k] for k in after}
    n = d["passes"] or float("nan")
    parts = [f"{k} {1e3 * d[k] / n:.1f} ms/pass ({d[k] / wall:.0%})" for k in SPLIT]
    return f"{n:.0f} passes, {d['rows'] / n:.1f} rows/pass; " + ", ".join(parts)


def best_rows(rows: list[dict]) -> list[dict]:
    """Per engine, kind and client count: the round with the most generated tokens/s, with the
    loads of all its rounds (best of several: the least disturbed round)."""
    best: dict[tuple, dict] = {}
    for r in rows:
        key = (r["engine"], r["kind"], r["clients"])
        loads = best.get(key, {}).get("loads", []) + [r["load"].split()[0]]
        if key not in best or r["gen_tok_s"] > best[key]["gen_tok_s"]:
            best[key] = dict(r)
        best[key]["loads"] = loads
    return list(best.values())


def concurrency(args: argparse.Namespace) -> None:
    from runtime import SHAPES, bandwidth_gbs, converted, geometry, gguf_model, hf_checkpoint

    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    args.work.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[args.shape]
    layers = args.layers or shape.layers
    hf = hf_checkpoint(args.work, shape, layers)
    model = converted(hf, args.work, args.dtype)
    binary = build(load_profile("host"), where="host", progress=log).dist_dir / "bin" / "colibri"
    model_id = model.name[: -len(".colibri")]
    info = json.loads(subprocess.run([str(binary), "--backend", "cpu", "info", str(model)],
                                     capture_output=True, text=True, check=True).stdout)
    vocab = info["vocab_size"]
    engines = [lambda rows=rows: colibri_engine(binary, model, args,
                                                args.work / f"serve-colibri-{rows}.log", rows)
               for rows in args.prompt_rows]
    if args.llama_cpp:
        server = args.llama_cpp / "build" / "bin" / "llama-server"
        if not server.exists():
            raise SystemExit(f"--llama-cpp {args.llama_cpp}: {server} is missing; build it with "
                             f"scripts/build-llama-cpp.sh")
        gguf = gguf_model(args.llama_cpp, hf, args.work, gguf_type(args.dtype),
                          geometry(shape, layers)["vocab_size"], q4_from="q8_0")
        engines.append(lambda: llama_engine(server, gguf, args, args.work / "serve-llama.log"))
    started: list[Engine] = []
    try:  # both servers up at once (an idle one takes no CPU), so rows can interleave
        for start in engines:
            started.append(start())
        rows = measure(started, model_id, args, vocab)
        load_bw = loadavg()
        gbs = bandwidth_gbs(args.threads)
    finally:
        for e in started:
            log(f"{e.name} exit {e.stop()}")
    split = weight_split(model)
    dense, experts, E, k = split
    print(f"model {model.name} ({info['dtype']}; llama-server: GGUF "
          f"{gguf_type(args.dtype)}), {args.slots} slots, {args.threads} "
          f"thread(s), {args.requests} requests per row, prompt: --system {args.system} + "
          f"--prompt {args.prompt} ids, gen {args.gen}"
          + (f", llama-server {args.llama_server_args}" if args.llama_cpp and args.llama_server_args else "")
          + f", best of {args.rounds} interleaved round(s)")
    print(f"bandwidth probe after the rows, load {load_bw}")
    print(f"weight-read bound: dense {dense / 1e6:.1f} MB + experts {experts / 1e6:.1f} MB "
          f"(E={E}, k={k}) at {gbs:.1f} GB/s read bandwidth ({args.threads} thread(s)); "
          + ", ".join(f"N={n}: {E * (1 - (1 - k / E) ** n):.2f} experts/layer, "
                      f"{bound_tok_s(split, n, gbs):.0f} tok/s" for n in (1, 2, 4, 8)))
    print("\nevery round (loadavg 1/5/15 min before the row):")
    print("| round | engine | prompts | clients | gen tok/s | decode tok/s | first token p50 ms | load |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['round']} | {r['engine']} | {r['kind']} | {r['clients']} | {r['gen_tok_s']:.1f} | "
              f"{r['decode_tok_s']:.1f} | {r['first_ms_p50']:.1f} | {r['load']} |")
    print(f"\nbest of {args.rounds} round(s) (by generated tokens/s; the 1-minute load of each round):")
    print("| engine | prompts | clients | req/s | gen tok/s | decode tok/s | bound tok/s | of bound "
          "| first token p50 ms | p99 ms | load (rounds) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        if r.get("split"):
            print(f"colibri step split, {r['kind']}, {r['clients']} client(s), round {r['round']}: {r['split']}")
    rows = best_rows(rows)
    for r in rows:
        b = bound_tok_s(split, r["clients"], gbs)
        print(f"| {r['engine']} | {r['kind']} | {r['clients']} | {r['req_s']:.2f} | "
              f"{r['gen_tok_s']:.1f} | {r['decode_tok_s']:.1f} | {b:.0f} | "
              f"{r['decode_tok_s'] / b:.0%} | {r['first_ms_p50']:.1f} | {r['first_ms_p99']:.1f} | "
              f"{' / '.join(r['loads'])} |")
        if args.json:
            print(json.dumps({**r, "bound_tok_s": b}))
    for name in dict.fromkeys(r["engine"] for r in rows):
        for c in (int(x) for x in args.levels.split(",")):
            pick = {r["kind"]: r for r in rows if r["engine"] == name and r["clients"] == c}
            if "shared" in pick and "unique" in pick:
                print(f"{name}, {c} client(s): first token with a warm shared {args.system}-id "
                      f"prefix / cold: {pick['shared']['first_ms_p50']:.1f} / "
                      f"{pick['unique']['first_ms_p50']:.1f} ms = "
                      f"{pick['shared']['first_ms_p50'] / pick['unique']['first_ms_p50']:.2f} (p50)")


def token_times(port: int, model_id: str, prompt: list[int], gen: int, extra: dict | None,
                out: list[float], started: threading.Event | None = None, at: int = 0) -> None:
    """Stream one completion, appending each token event's time (perf_counter) to `out`; set
    `started` once `at` tokens have come."""
    body = json.dumps({"model": model_id, "prompt": prompt, "max_tokens": gen, "temperature": 0,
                       "stream": True, **(extra or {})})
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3600)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    for raw in resp:
        line = raw.strip()
        if line == b"data: [DONE]":
            break
        if line.startswith(b"data: {"):
            ch = json.loads(line[6:]).get("choices") or []
            if ch and (ch[0].get("token_ids") or ch[0].get("text")):
                out.append(time.perf_counter())
                if started and len(out) == at:
                    started.set()
    conn.close()


def prefill_stall(engine: Engine, model_id: str, args: argparse.Namespace, vocab: int, rnd: int) -> dict:
    """How long a decoding request's next token waits while another slot's --stall-prompt-id
    prompt is read: request A decodes; after its 16th token request B sends its prompt (one
    token out); A's median token gap before B, and its longest gap while B's prompt is read
    (B sent .. B's first token), with how many A tokens came in that window."""
    a_times: list[float] = []
    b_times: list[float] = []
    go = threading.Event()
    own = [(rnd * 7919 + k * 104729 + 3) % vocab for k in range(args.prompt)]
    a = threading.Thread(target=token_times, args=(engine.port, model_id, own, 16 + 48, engine.extra,
                                                   a_times, go, 16))
    a.start()
    go.wait(3600)
    b_prompt = [(rnd * 15485863 + k * 2654435761 + 11) % vocab for k in range(args.stall_prompt)]
    t_b = time.perf_counter()
    token_times(engine.port, model_id, b_prompt, 1, engine.extra, b_times)
    a.join()
    before = sorted(y - x for x, y in zip(a_times[:16], a_times[1:16]))
    inside = [t for t in a_times if t_b <= t <= b_times[0]]
    edges = [t_b] + inside + [next((t for t in a_times if t > b_times[0]), b_times[0])]
    longest = max(y - x for x, y in zip(edges, edges[1:]))
    return {"engine": engine.name, "round": rnd + 1, "gap_ms": 1e3 * before[len(before) // 2],
            "stall_ms": 1e3 * longest, "prefill_ms": 1e3 * (b_times[0] - t_b),
            "a_tokens_inside": len(inside), "load": loadavg()}


def stall(args: argparse.Namespace) -> None:
    """--stall: prefill_stall on each engine, interleaved, --rounds times."""
    from runtime import SHAPES, converted, geometry, gguf_model, hf_checkpoint

    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    args.work.mkdir(parents=True, exist_ok=True)
    shape = SHAPES[args.shape]
    layers = args.layers or shape.layers
    hf = hf_checkpoint(args.work, shape, layers)
    model = converted(hf, args.work, args.dtype)
    binary = build(load_profile("host"), where="host", progress=log).dist_dir / "bin" / "colibri"
    model_id = model.name[: -len(".colibri")]
    vocab = geometry(shape, layers)["vocab_size"]
    starts = [lambda rows=rows: colibri_engine(binary, model, args,
                                               args.work / f"stall-colibri-{rows}.log", rows)
              for rows in args.prompt_rows]
    if args.llama_cpp:
        gguf = gguf_model(args.llama_cpp, hf, args.work, gguf_type(args.dtype), vocab, q4_from="q8_0")
        server = args.llama_cpp / "build" / "bin" / "llama-server"
        starts.append(lambda: llama_engine(server, gguf, args, args.work / "stall-llama.log"))
    engines: list[Engine] = []
    rows = []
    try:
        for st in starts:
            engines.append(st())
        for e in engines:
            one_request(e.port, model_id, [1] * args.prompt, 4, e.extra)  # pages the weights in
        for rnd in range(args.rounds):
            for e in engines if rnd % 2 == 0 else engines[::-1]:
                rows.append(prefill_stall(e, model_id, args, vocab, rnd))
                log(str(rows[-1]))
    finally:
        for e in engines:
            log(f"{e.name} exit {e.stop()}")
    print(f"model {model.name}, {args.slots} slots, {args.threads} thread(s): a decoding request "
          f"(prompt {args.prompt}) while another slot's {args.stall_prompt}-id prompt is read")
    print("| round | engine | decode gap p50 ms | longest gap during the prompt ms | prompt to first token ms "
          "| decode tokens during it | load |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['round']} | {r['engine']} | {r['gap_ms']:.1f} | {r['stall_ms']:.1f} | "
              f"{r['prefill_ms']:.1f} | {r['a_tokens_inside']} | {r['load']} |")


def server_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (proc(5): fields 14 and 15 of /proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def post(port: int, body: bytes, timeout: float = 3600) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    status = conn.getresponse().status
    conn.close()
    return status


def hostile(args: argparse.Namespace) -> None:
    from serve_support import SlowFlood, adversarial_bodies, write_chat_model

    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    args.work.mkdir(parents=True, exist_ok=True)
    model = write_chat_model(args.work / "tiny.colibri")
    binary = build(load_profile("host"), where="host", progress=log).dist_dir / "bin" / "colibri"
    proc, port = start_server(binary, model, 1, 1)
    try:
        print("| 1 MiB request body | status | server CPU s |")
        print("|---|---|---|")
        for kind, body in adversarial_bodies((1 << 20) - 256).items():
            cpu0 = server_cpu_s(proc.pid)
            status = post(port, body)
            print(f"| {kind} ({len(body)} bytes) | {status} | {server_cpu_s(proc.pid) - cpu0:.3f} |")
        print("\n| text prompt of combining marks | status | server CPU s |")
        print("|---|---|---|")
        for kib in (int(x) for x in args.prompt_kib.split(",")):
            # "a" then marks of falling combining class (U+0345 240, U+0301 230, U+0316 220), over
            # and over: NFC sorts all the marks of one starter by class (canonical ordering)
            marks = "\u0345\u0301\u0316" * (kib * 1024 // 6)
            body = json.dumps({"model": "tiny", "prompt": "a" + marks, "max_tokens": 1}, ensure_ascii=False).encode()
            cpu0 = server_cpu_s(proc.pid)
            status = post(port, body)
            print(f"| {kib} KiB ({len(body)} bytes of JSON) | {status} | {server_cpu_s(proc.pid) - cpu0:.3f} |")
        lat: list[float] = []
        ok = 0
        with SlowFlood(port, n=args.flood, step=0.5) as flood:
            for _ in range(args.probes):
                t0 = time.perf_counter()
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                    conn.request("GET", "/health")
                    ok += conn.getresponse().status == 200
                    conn.close()
                except OSError:
                    pass
                lat.append((time.perf_counter() - t0) * 1e3)
                time.sleep(0.1)
            connects = flood.connects
        print(f"\n/health under a flood of {args.flood} slow connections ({connects} connects): "
              f"{ok}/{args.probes} answered 200; latency p50 {pct(lat, 50):.1f} ms, p99 {pct(lat, 99):.1f} ms, "
              f"max {max(lat):.1f} ms")
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="int8", choices=["f32", "f16", "int8", "q4"],
                    help="colibri's weight type (llama-server: q8_0 for int8, q4_0 for q4)")
    ap.add_argument("--int8-act", action="store_true",
                    help="colibri serve --int8-act: 8-bit activations, integer dot products (as "
                         "llama.cpp's q8_0 / q4_0 kernels)")
    from runtime import SHAPES

    ap.add_argument("--shape", default="mixtral", choices=sorted(SHAPES),
                    help="benchmarks/runtime.py's geometry (shared checkpoints in --work)")
    ap.add_argument("--layers", type=int, help="decoder layers (default: the shape's bench default)")
    ap.add_argument("--slots", type=int, default=8, help="both servers' slots (parallel sequences)")
    ap.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1),
                    help="compute threads of each server")
    ap.add_argument("--requests", type=int, default=16, help="requests per row")
    ap.add_argument("--system", type=int, default=512, help="ids of the system prefix (unique/shared)")
    ap.add_argument("--prompt", type=int, default=32, help="each request's own ids")
    ap.add_argument("--gen", type=int, default=64)
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of every row; engines interleaved row by row, best round kept")
    ap.add_argument("--kinds", default="short,unique,shared")
    ap.add_argument("--llama-cpp", type=Path, help="a llama.cpp tree built by scripts/build-llama-cpp.sh")
    ap.add_argument("--llama-server-args", default="--no-repack" if amx_host() else "",
                    help="more llama-server arguments (default on an AMX host: --no-repack, which "
                         "this llama.cpp build needs there)")
    ap.add_argument("--no-batching", action="store_true", help="colibri's per-slot passes instead")
    ap.add_argument("--prompt-rows", default="0", type=lambda v: [int(x) for x in v.split(",")],
                    help="colibri serve --prompt-rows, comma-separated: one colibri server per value "
                         "(0: no cap, the default), e.g. 0,64 with --stall")
    ap.add_argument("--work", type=Path, default=Path("/tmp/colibri-bench"))
    ap.add_argument("--json", action="store_true", help="one JSON object per row on stdout too")
    ap.add_argument("--hostile", action="store_true",
                    help="measure hostile clients instead: 1 MiB adversarial bodies, long text prompts, a slow-client flood")
    ap.add_argument("--flood", type=int, default=40, help="--hostile: slow connections")
    ap.add_argument("--probes", type=int, default=50, help="--hostile: /health probes during the flood")
    ap.add_argument("--prompt-kib", default="16,64,256,1000", help="--hostile: text prompt sizes (UTF-8)")
    ap.add_argument("--stall", action="store_true",
                    help="measure how long a decoding request waits behind another slot's prompt instead")
    ap.add_argument("--stall-prompt", type=int, default=511,
                    help="--stall: the other request's prompt ids (511 + one decode row: one 512-row pass)")
    args = ap.parse_args()
    if args.stall:
        stall(args)
    elif args.hostile:
        hostile(args)
    else:
        concurrency(args)


if __name__ == "__main__":
    main()
