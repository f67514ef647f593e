"""f32 vs f16 KV cache (`colibri --kv-cache f16`): memory, logit difference, decode speed at a long
context. Figures go to docs/runtime.md ("f16 KV cache").

The model is written by `colibri synth` (random Mixtral-shaped weights, noise scaled like a
trained layer's): small weights and a long context, so attention over the cache is a large part
of a decode step. For each cache: `info` (arena and KV bytes), the logits of one long prompt
(`forward --logits-out`: max |f16 - f32| over every position and the greedy top-1 agreement),
and `bench` (prefill the prompt, then decode; each engine's best of --repeat interleaved runs).

    python benchmarks/kv_cache.py [--prompt-len 2000] [--seq 4096] [--threads 2] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

KVS = ("f32", "f16")


def colibri(binary: Path, *args: str) -> str:
    return subprocess.run([str(binary), *args], check=True, capture_output=True, text=True).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompt-len", type=int, default=2000)
    ap.add_argument("--seq", type=int, default=4096, help="the model's max_seq_len (KV capacity)")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repeats; the best is kept")
    ap.add_argument("--geometry", default="--dim 512 --layers 8 --experts 8 --top-k 2 --ffn 1024 "
                    "--heads 8 --kv-heads 2 --head-dim 64 --vocab 8000 --dtype int8",
                    help="colibri synth options")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colibri-bench")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    built = build(load_profile("host"), where="host", progress=lambda m: None)
    binary = built.dist_dir / "bin" / "colibri"
    model = args.work / f"kv-synth-{args.seq}.colibri"
    colibri(binary, "synth", str(model), *args.geometry.split(), "--seq", str(args.seq), "--seed", "7")
    common = ["--backend", "cpu", "--threads", str(args.threads)]

    rng = np.random.default_rng(0)
    vocab = json.loads(colibri(binary, *common, "info", str(model)))["vocab_size"]
    ids = ",".join(str(int(i)) for i in rng.integers(0, vocab, args.prompt_len))
    info, logits = {}, {}
    for kv in KVS:
        info[kv] = json.loads(colibri(binary, *common, "--kv-cache", kv, "info", str(model)))["backend"]
        out = args.work / f"kv-logits-{kv}.bin"
        colibri(binary, *common, "--kv-cache", kv, "forward", str(model), "--ids", ids,
                "--logits-out", str(out))
        logits[kv] = np.fromfile(out, dtype="<f4").reshape(args.prompt_len, -1)
    diff = np.abs(logits["f16"] - logits["f32"])
    per_pos = diff.max(axis=1)
    top1 = float(np.mean(logits["f16"].argmax(1) == logits["f32"].argmax(1)))

    best: dict[str, dict] = {}
    for _ in range(args.repeat):
        for kv in KVS:
            r = json.loads(colibri(binary, *common, "--kv-cache", kv, "bench", str(model),
                                   "--prompt-len", str(args.prompt_len), "--gen", str(args.gen),
                                   "--runs", "1", "--json"))
            if kv not in best or r["decode_tok_s"] > best[kv]["decode_tok_s"]:
                best[kv] = r

    mib = 1 << 20
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; "
          f"cpu_simd {info['f32']['cpu_simd']}; {args.threads} thread(s)")
    print(f"model: colibri synth {args.geometry} --seq {args.seq}; prompt {args.prompt_len}, "
          f"decode {args.gen}; best of {args.repeat}")
    print(f"{'kv':>4}{'arena MiB':>11}{'KV MiB':>9}{'prefill ms':>12}{'decode tok/s':>14}")
    for kv in KVS:
        b = best[kv]
        print(f"{kv:>4}{info[kv]['arena_bytes'] / mib:>11.1f}{info[kv]['kv_cache_bytes'] / mib:>9.1f}"
              f"{b['prefill_ms_p50']:>12.1f}{b['decode_tok_s']:>14.1f}")
    print(f"saved per context: {(info['f32']['arena_bytes'] - info['f16']['arena_bytes']) / mib:.1f} MiB")
    print(f"max |logit f16 - f32| over {args.prompt_len} positions: {diff.max():.3g} "
          f"(max |logit| {np.abs(logits['f32']).max():.3g}; relative {diff.max() / np.abs(logits['f32']).max():.3g}); "
          f"at positions < 64: {per_pos[:64].max():.3g}, >= {args.prompt_len // 2}: "
          f"{per_pos[args.prompt_len // 2:].max():.3g}; greedy top-1 agreement {top1:.1%}")
    # a position's max |difference| is small unless a routing choice flipped somewhere before it
    print(f"per-position max |logit f16 - f32|: median {np.median(per_pos):.3g}, 90th percentile "
          f"{np.percentile(per_pos, 90):.3g}, 99th {np.percentile(per_pos, 99):.3g}; positions "
          f"above 0.1: {np.mean(per_pos > 0.1):.1%}")


if __name__ == "__main__":
    main()
