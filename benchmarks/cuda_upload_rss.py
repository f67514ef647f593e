"""Peak resident memory of the CUDA backend's weight upload, measured through the stand-in driver.

    python benchmarks/cuda_upload_rss.py --libcuda LIBCUDA_EMU.so --binary after=dist/host/bin/colibri \
        [--binary before=OLD/colibri] [--dim 512]

LIBCUDA_EMU.so is tests/gpu/stub_libcuda.c built with -DSTUB_EMULATE and linked with
tests/gpu/emu/cuda_emu.cpp (as tests/test_cuda_host.py's cuda_host_build fixture does); the binary
is a host build with an sm_90 cubin. In the stand-in the device arena is host memory, so the
process's VmHWM (`bench --json` peak_rss_mb) holds every copy of the weights that exists at once:
the device copy, the mapped file's pages and any staging buffers. The model is mostly routed
experts (64 experts, top-1: a token computes little in the emulation), f32, about
64 x 3 x dim^2 x 4 bytes (dim 512: ~200 MB).

Prints one line per binary x weights mode: file MB, peak_rss_mb, rss_mb (at the end), and the
peak above the end in copies of the weights. A figure to record, not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
from pathlib import Path

from colibri_kit.model.format import DType, Family, ModelHeader, Routing, padded_dim
from colibri_kit.model.tiny import write_random_model


def expert_heavy_model(path: Path, dim: int) -> Path:
    """Random f32 model whose weights are ~all 64 routed experts of dim x dim."""
    header = ModelHeader(
        num_experts=64, expert_size=dim, vocab_size=64, max_seq_len=8, embed_dim=dim, n_layers=1,
        n_heads=2, n_kv_heads=1, head_dim=32, top_k=1, routing=Routing.RENORMALISE,
        dtype=int(DType.F32), embed_dim_pad=padded_dim(dim, 64), pad_multiple=64, flags=0,
        shared_expert_size=0, norm_eps=1e-5, rope_theta=10000.0, family=Family.OTHER,
        name="upload-rss")
    return write_random_model(path, header, seed=3)


def bench(binary: Path, libcuda: Path, model: Path, env: dict[str, str]) -> dict:
    """One `bench --backend cuda --json` run (1 prompt token, 1 generated) through the stand-in."""
    full = {k: v for k, v in os.environ.items()
            if not k.startswith(("STUB_", "COLIBRI_CUDA_"))}
    full.update({"COLIBRI_LIBCUDA": str(libcuda), "STUB_SM": "90", **env})
    proc = subprocess.run([str(binary), "--backend", "cuda", "bench", str(model), "--prompt-len",
                           "1", "--gen", "1", "--runs", "1", "--json"], capture_output=True,
                          text=True, env=full, timeout=1800, check=True)
    return json.loads(proc.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--libcuda", type=Path, required=True, help="the emulating stand-in driver")
    ap.add_argument("--binary", action="append", required=True, metavar="LABEL=PATH")
    ap.add_argument("--dim", type=int, default=512, help="expert width (file ~ 64 x 3 x dim^2 x 4)")
    args = ap.parse_args()
    modes = {"discrete, default": {},
             "integrated, default": {"STUB_INTEGRATED": "1"},
             "integrated, copy": {"STUB_INTEGRATED": "1", "COLIBRI_CUDA_WEIGHTS": "copy"},
             "integrated, map": {"STUB_INTEGRATED": "1", "COLIBRI_CUDA_WEIGHTS": "map"}}
    with tempfile.TemporaryDirectory() as tmp:
        model = expert_heavy_model(Path(tmp) / "m.colibri", args.dim)
        mb = model.stat().st_size / 2**20
        print(f"model: {mb:.1f} MiB file")
        print(f"{'binary':<8} {'mode':<22} {'weights':<7} {'peak MB':>8} {'end MB':>8} "
              f"{'peak-end (copies)':>18}")
        for item in args.binary:
            label, path = item.split("=", 1)
            for mode, env in modes.items():
                b = bench(Path(path), args.libcuda, model, env)
                over = b["peak_rss_mb"] - b["rss_mb"]
                print(f"{label:<8} {mode:<22} {b['backend']['cuda_weights']:<7} "
                      f"{b['peak_rss_mb']:>8.1f} {b['rss_mb']:>8.1f} {over:>9.1f} ({over / mb:.2f})",
                      flush=True)


if __name__ == "__main__":
    main()
