"""Shared-model contexts: context creation time and decode throughput with 1, 2 and 4 contexts.

One process loads the bench model once (colibri_model_load) and creates N contexts
(colibri_ctx_new), then N threads decode at the same time (`colibri bench-contexts`). The model
is the random Mixtral of benchmarks/runtime.py (same checkpoint and conversion, cached in
--work). Figures go to docs/runtime.md ("Several contexts on one model").

    python benchmarks/contexts.py [--dtype int8] [--contexts 1,2,4] [--threads 1] [--gen 32]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from runtime import converted, hf_checkpoint  # noqa: E402  (benchmarks/runtime.py)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dtype", default="int8")
    ap.add_argument("--contexts", default="1,2,4")
    ap.add_argument("--threads", type=int, default=1, help="worker threads per context")
    ap.add_argument("--gen", type=int, default=32)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--repeat", type=int, default=3, help="interleaved repeats; the best is kept")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colibri-bench")
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)

    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile

    built = build(load_profile("host"), where="host", progress=lambda m: None)
    binary = built.dist_dir / "bin" / "colibri"
    model = converted(hf_checkpoint(args.work), args.work, args.dtype)
    counts = [int(n) for n in args.contexts.split(",")]
    best: dict[int, dict] = {}
    for _ in range(args.repeat):
        for n in counts:
            out = subprocess.run([str(binary), "bench-contexts", str(model), "--contexts", str(n),
                                  "--threads", str(args.threads), "--gen", str(args.gen),
                                  "--prompt-len", str(args.prompt_len), "--json"],
                                 check=True, capture_output=True, text=True).stdout
            r = json.loads(out)
            if n not in best or r["decode_tok_s_total"] > best[n]["decode_tok_s_total"]:
                best[n] = r
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}; model "
          f"{model.name}; {args.threads} thread(s) per context; best of {args.repeat}")
    print(f"{'contexts':>8}{'create ms (mean)':>18}{'create ms (max)':>17}"
          f"{'decode tok/s total':>20}{'per context':>13}")
    for n in counts:
        r = best[n]
        print(f"{n:>8}{r['ctx_create_ms_mean']:>18.3f}{r['ctx_create_ms_max']:>17.3f}"
              f"{r['decode_tok_s_total']:>20.2f}{r['decode_tok_s_per_context']:>13.2f}")
    print(json.dumps(best))


if __name__ == "__main__":
    main()
