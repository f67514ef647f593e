"""Decode and prefill speed of q4 against f16 and int8 in the CPU runtime (dist/host), one run.

A random Mixtral-shaped model (hidden 1024, 4 layers, 8 experts top-2, FFN 1408, 16/4 heads,
vocab 32000; ~200 M parameters) is written with the kit's writer once per dtype, then
`colibri bench --json` runs on each, interleaved, `--repeat` times; the best of each is printed
with the bytes of weights one decode token reads. The machine may be shared: compare within a
run only.

    PYTHONPATH=. python benchmarks/q4_speed.py [--threads 2] [--repeat 3] [--work DIR]
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
    from colibri_kit.build import build
    from colibri_kit.profiles import load_profile
    from colibri_kit.model.format import DType, ModelHeader, padded_dim, read_model
    from colibri_kit.model.tiny import write_random_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dtypes", default="f16,int8,q4")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colibri-q4-speed")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    built = build(load_profile("host"), where="host", progress=lambda m: None)
    binary = built.dist_dir / "bin" / "colibri"
    models = {}
    for dt in a.dtypes.split(","):
        path = a.work / f"m-{dt}.colibri"
        if not path.exists():
            h = ModelHeader(num_experts=8, expert_size=1408, vocab_size=32000, max_seq_len=256,
                            embed_dim=1024, n_layers=4, n_heads=16, n_kv_heads=4, head_dim=64,
                            top_k=2, routing=0, dtype=int(DType.parse(dt)),
                            embed_dim_pad=padded_dim(1024, 64), pad_multiple=64, name=f"speed-{dt}")
            write_random_model(path, h, seed=1)
        models[dt] = path
    runs = [(dt, []) for dt in models]
    runs += [(dt, ["--int8-act"]) for dt in models if dt in ("int8", "q4")]
    best: dict[str, dict] = {}
    for _ in range(a.repeat):
        for dt, extra in runs:
            r = subprocess.run([str(binary), "--backend", "cpu", "--threads", str(a.threads), *extra,
                                "bench", str(models[dt]), "--prompt-len", "64", "--gen", "32",
                                "--runs", "2", "--json"], capture_output=True, text=True, check=True)
            doc = json.loads(r.stdout)
            label = " ".join([dt, *extra])
            if label not in best or doc["decode_tok_s"] > best[label]["decode_tok_s"]:
                best[label] = doc
    print(f"| weights | decode tok/s | prefill ms p50 (64 tokens) | weights read per decode token |")
    print("|---|---|---|---|")
    for label, doc in best.items():
        dt = label.split()[0]
        m = read_model(models[dt])
        per_tok = 0
        for r in m:  # attention + the router + top-2 of 8 experts + lm_head (embedding: one row)
            share = 2 / 8 if r.kind in (30, 31, 32) else (0 if r.kind == 1 else 1)
            per_tok += (r.nbytes + r.scale_nbytes) * share
        print(f"| {label} | {doc['decode_tok_s']:.1f} | {doc['prefill_ms_p50']:.1f} | "
              f"{per_tok / 2**20:.1f} MiB |")


if __name__ == "__main__":
    main()
