"""Prefill cost of the two forms of the gated delta rule (docs/runtime.md, "Recurrent state: the
determinism contract"): the runtime's recurrence token after token (prefill == decode bits) and
the chunked form transformers runs for prompts, on Qwen3.5-35B-A3B's DeltaNet heads (32 value
heads of 128 x 128, chunks of 64), one thread.

    python benchmarks/deltanet_forms.py [--tokens 64,512] [--heads 32] [--dk 128] [--dv 128]

It compiles benchmarks/deltanet_forms.c with the runtime's library sources (-O2, as the product)
and prints us per token and layer for each form and how far their outputs differ.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from route import build_against_runtime

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="64,512", help="prompt lengths, comma-separated")
    ap.add_argument("--heads", type=int, default=32, help="value heads (Qwen3.5-35B-A3B: 32)")
    ap.add_argument("--dk", type=int, default=128, help="key head dim")
    ap.add_argument("--dv", type=int, default=128, help="value head dim")
    ap.add_argument("--chunk", type=int, default=64, help="chunk length of the chunked form (transformers: 64)")
    a = ap.parse_args()
    exe = build_against_runtime("deltanet_forms")
    print(f"{'tokens':>6} {'recurrent us/token':>19} {'chunked us/token':>17} {'max rel diff':>13}")
    for t in a.tokens.split(","):
        out = subprocess.run([str(exe), str(a.heads), str(a.dk), str(a.dv), t, str(a.chunk)],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out)
        print(f"{r['tokens']:>6} {r['recurrent_us_per_token']:>19.1f} {r['chunked_us_per_token']:>17.1f} "
              f"{r['max_rel_diff']:>13.2e}")


if __name__ == "__main__":
    main()
