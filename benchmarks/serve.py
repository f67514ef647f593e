"""Benchmark: `colibri serve` under 1, 2, 4 and 8 concurrent streaming clients.

    python benchmarks/serve.py [--dtype int8] [--slots 2] [--threads 1] [--requests 16]
                               [--prompt 32] [--gen 32] [--work /tmp/colibri-bench]

1. the bench model of benchmarks/runtime.py (random Mixtral, hidden 1024, 8 layers, 8 experts
   top-2, vocab 32000), built and converted once into --work (shared with that benchmark);
2. dist/host/bin/colibri (the kit's host build) serving it: `colibri serve --slots S --threads T`;
3. for each concurrency C in 1, 2, 4, 8: C client threads send --requests streaming completions
   in total (token-id prompts of --prompt ids, --gen new tokens, temperature 0, ignore no EOS:
   the random model has none) over plain HTTP, and the time to the first SSE token event and to
   [DONE] is taken per request;
4. prints requests/s, generated tokens/s, first-token p50/p99 and p99/p50 (the jitter the seed
   article promises to keep low), and the server's own /metrics histogram counts as a check,
   next to `colibri bench` (same model, prompt, threads; no HTTP) measured in the same run.

Figures are printed, not asserted: on a shared machine they move +-15-30% between runs. With C
above the slot count, requests wait in the queue and first-token latency grows by design.

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


def one_request(port: int, model_id: str, prompt: list[int], gen: int) -> tuple[float, float, int]:
    """(first-token s, total s, tokens) of one streaming completion."""
    body = json.dumps({"model": model_id, "prompt": prompt, "max_tokens": gen, "temperature": 0,
                       "stream": True})
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    conn.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"HTTP {resp.status}: {resp.read()[:200]!r}")
    first = None
    tokens = 0
    for raw in resp:
        line = raw.strip()
        if not line.startswith(b"data: "):
            continue
        if line == b"data: [DONE]":
            break
        ids = json.loads(line[6:])["choices"]
        if ids and ids[0].get("token_ids"):
            tokens += len(ids[0]["token_ids"])
            if first is None:
                first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    conn.close()
    return first if first is not None else total, total, tokens


def run_level(port: int, model_id: str, clients: int, requests: int, prompt_len: int, gen: int,
              vocab: int) -> dict:
    results: list[tuple[float, float, int]] = []
    lock = threading.Lock()
    next_req = [0]

    def worker() -> None:
        while True:
            with lock:
                i = next_req[0]
                if i >= requests:
                    return
                next_req[0] += 1
            prompt = [(i * 7919 + k * 104729 + 13) % vocab for k in range(prompt_len)]
            r = one_request(port, model_id, prompt, gen)
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
    p50, p99 = pct(firsts, 50), pct(firsts, 99)
    return {"clients": clients, "requests": len(results), "wall_s": wall, "req_s": len(results) / wall,
            "gen_tok_s": toks / wall, "first_ms_p50": p50, "first_ms_p99": p99,
            "p99_over_p50": p99 / p50 if p50 else float("nan"), "tokens": toks}


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

    args.work.mkdir(parents=True, exist_ok=True)
    model = write_chat_model(args.work / "tiny.colibri")
    binary = build("host", where="host", progress=log).dist_dir / "bin" / "colibri"
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
    ap.add_argument("--dtype", default="int8", choices=["f32", "f16", "int8"])
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="compute threads per slot")
    ap.add_argument("--requests", type=int, default=16, help="requests per concurrency level")
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--levels", default="1,2,4,8")
    ap.add_argument("--work", type=Path, default=Path("/tmp/colibri-bench"))
    ap.add_argument("--json", action="store_true", help="one JSON object per level on stdout")
    ap.add_argument("--hostile", action="store_true",
                    help="measure hostile clients instead: 1 MiB adversarial bodies, long text prompts, a slow-client flood")
    ap.add_argument("--flood", type=int, default=40, help="--hostile: slow connections")
    ap.add_argument("--probes", type=int, default=50, help="--hostile: /health probes during the flood")
    ap.add_argument("--prompt-kib", default="16,64,256,1000", help="--hostile: text prompt sizes (UTF-8)")
    args = ap.parse_args()
    if args.hostile:
        hostile(args)
        return

    from runtime import converted, hf_checkpoint  # benchmarks/runtime.py: the bench model

    from colibri_kit.build import build

    args.work.mkdir(parents=True, exist_ok=True)
    model = converted(hf_checkpoint(args.work), args.work, args.dtype)
    binary = build("host", where="host", progress=log).dist_dir / "bin" / "colibri"
    model_id = model.name[: -len(".colibri")]
    info = json.loads(subprocess.run([str(binary), "--backend", "cpu", "info", str(model)],
                                     capture_output=True, text=True, check=True).stdout)
    # the same work without HTTP, in the same run: `colibri bench` on one context
    bench = json.loads(subprocess.run(
        [str(binary), "--backend", "cpu", "--threads", str(args.threads), "bench", str(model),
         "--prompt-len", str(args.prompt), "--gen", str(args.gen), "--runs", "5", "--json"],
        capture_output=True, text=True, check=True).stdout)
    proc, port = start_server(binary, model, args.slots, args.threads, "--max-queue", "64")
    rows = []
    try:
        one_request(port, model_id, [1] * args.prompt, 4)  # warm-up: pages the weights in
        for c in (int(x) for x in args.levels.split(",")):
            log(f"{c} client(s) ...")
            rows.append(run_level(port, model_id, c, args.requests, args.prompt, args.gen,
                                  info["vocab_size"]))
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        conn.request("GET", "/metrics")
        metrics = conn.getresponse().read().decode()
    finally:
        proc.send_signal(signal.SIGTERM)
        rc = proc.wait(120)
    counted = [ln for ln in metrics.splitlines() if ln.startswith("colibri_first_token_seconds_count")]
    print(f"model {model.name} ({info['dtype']}, vocab {info['vocab_size']}), slots {args.slots} x "
          f"{args.threads} thread(s), prompt {args.prompt}, gen {args.gen}, {args.requests} "
          f"requests per level; server exit {rc}; {counted[0] if counted else ''}")
    print(f"colibri bench (no HTTP, one context, same run): first token p50 "
          f"{bench['first_token_ms_p50']:.1f} ms, p99 {bench['first_token_ms_p99']:.1f} ms, "
          f"decode {bench['decode_tok_s']:.1f} tok/s")
    print("| clients | req/s | gen tok/s | first token p50 ms | p99 ms | p99/p50 |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['clients']} | {r['req_s']:.2f} | {r['gen_tok_s']:.1f} | {r['first_ms_p50']:.1f} | "
              f"{r['first_ms_p99']:.1f} | {r['p99_over_p50']:.2f} |")
        if args.json:
            print(json.dumps(r))


if __name__ == "__main__":
    main()
