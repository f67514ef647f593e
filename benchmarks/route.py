"""The route stage's cost per token and layer as the expert count grows (docs/runtime.md, "MoE
routing for 512 experts"): the router's f32 logits (E x D dot products) and the bitonic top-k
with its softmax, for the expert counts of the families (OLMoE 64, Qwen3 128, Qwen3.5 256,
Qwen3-Next 512), one thread, the host build's kernels.

    python benchmarks/route.py [--dim 2048] [--iters 20000]

It compiles benchmarks/route_bench.c against runtime/src with a colibri_config.h rendered for
the host target (max_experts 512) and prints ns per token; figures vary with the machine and its
load: compare within a run.
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
CASES = [(64, 8), (128, 8), (256, 8), (512, 8), (512, 10)]


def build_against_runtime(name: str) -> Path:
    """benchmarks/NAME.c compiled with the runtime's library sources and a colibri_config.h
    rendered for the host target, -O2 as the product (also benchmarks/deltanet_forms.py)."""
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import write_config
    sys.path.insert(0, str(ROOT / "tests"))
    from kit_support import runtime_library_sources

    work = Path(tempfile.mkdtemp(prefix=f"colibri-{name}-"))
    write_config(load_profile("host"), work / "include")
    rt = ROOT / "runtime"
    exe = work / name
    subprocess.run(["cc", "-std=c11", "-O2", "-D_GNU_SOURCE", f"-I{rt / 'include'}", f"-I{rt / 'src'}",
                    f"-I{work / 'include'}", "-o", str(exe), str(ROOT / "benchmarks" / f"{name}.c"),
                    *runtime_library_sources(), "-lm", "-lpthread", "-ldl"], check=True)
    return exe


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dim", type=int, default=2048, help="hidden size D (Qwen3.5-35B-A3B, Qwen3-Next: 2048)")
    ap.add_argument("--iters", type=int, default=20000)
    a = ap.parse_args()
    exe = build_against_runtime("route_bench")
    print(f"{'E':>4} {'k':>3} {'router logits ns':>17} {'top-k + softmax ns':>19}")
    for e, k in CASES:
        out = subprocess.run([str(exe), str(e), str(k), str(a.dim), str(a.iters)], capture_output=True,
                             text=True, check=True).stdout
        r = json.loads(out)
        print(f"{e:>4} {k:>3} {r['router_logits_ns']:>17.0f} {r['topk_ns']:>19.0f}")


if __name__ == "__main__":
    main()
