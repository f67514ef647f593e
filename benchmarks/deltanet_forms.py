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
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import write_config
    sys.path.insert(0, str(ROOT / "tests"))
    from kit_support import runtime_library_sources

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", default="64,512")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dk", type=int, default=128)
    ap.add_argument("--dv", type=int, default=128)
    ap.add_argument("--chunk", type=int, default=64)
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="colibri-deltanet-"))
    write_config(load_profile("host"), work / "include")
    rt = ROOT / "runtime"
    exe = work / "deltanet_forms"
    subprocess.run(["cc", "-std=c11", "-O2", "-D_GNU_SOURCE", f"-I{rt / 'include'}", f"-I{rt / 'src'}",
                    f"-I{work / 'include'}", "-o", str(exe), str(ROOT / "benchmarks" / "deltanet_forms.c"),
                    *runtime_library_sources(), "-lm", "-lpthread", "-ldl"], check=True)
    print(f"{'tokens':>6} {'recurrent us/token':>19} {'chunked us/token':>17} {'max rel diff':>13}")
    for t in a.tokens.split(","):
        out = subprocess.run([str(exe), str(a.heads), str(a.dk), str(a.dv), t, str(a.chunk)],
                             capture_output=True, text=True, check=True).stdout
        r = json.loads(out)
        print(f"{r['tokens']:>6} {r['recurrent_us_per_token']:>19.1f} {r['chunked_us_per_token']:>17.1f} "
              f"{r['max_rel_diff']:>13.2e}")


if __name__ == "__main__":
    main()
