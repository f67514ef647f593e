"""Decode GEMV bandwidth of the shipped kernels vs this GPU's copy bandwidth (prints figures).

    COLIBRI_GPU_TARGET=host python tests/gpu/bench_gemv.py      # or: invoke gpucheck --bench
    COLIBRI_GPU_BINARY=DIR/bin/colibri python3 tests/gpu/bench_gemv.py [--mib N] [--rows R --cols C]

Decode is memory-bound: one token reads every weight of the attention, the chosen experts and
the LM head once. This times `cb_linear` with n = 1 (the decode GEMV) on a large matrix of each
weight dtype with CUDA events, and a device-to-device copy of the same size (which reads and
writes each byte: 2 x bytes moved), and prints achieved GB/s and the fraction of the copy's.
A benchmark, not a test: it asserts nothing about speed. It talks to the driver itself
(tests/gpu/cuda_driver.py: ctypes on libcuda.so.1, or COLIBRI_LIBCUDA), so it runs on a GPU
machine without pycuda; with --json it prints one JSON object (gpu-check keeps it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent.parent))  # the checkout, when the kit is not installed

import cuda_driver  # noqa: E402
from gpu_images import binary_images, pick  # noqa: E402

ESIZE = {0: 4, 1: 2, 2: 2, 3: 1}
NAMES = {0: "f32", 1: "f16", 2: "bf16", 3: "int8"}


def _time_ms(ctx, fn, iters: int) -> float:
    start, stop = cuda_driver.Event(ctx), cuda_driver.Event(ctx)
    try:
        fn()  # warm-up
        start.record()
        for _ in range(iters):
            fn()
        stop.record()
        stop.synchronize()
        return stop.time_since(start) / iters
    finally:
        start.destroy()
        stop.destroy()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mib", type=int, default=512, help="copy size, MiB (default 512)")
    ap.add_argument("--rows", type=int, default=16384)
    ap.add_argument("--cols", type=int, default=8192)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    try:
        drv = cuda_driver.Driver()
    except (OSError, cuda_driver.CudaError) as exc:
        print(f"bench_gemv: no usable NVIDIA driver ({exc}): needs an NVIDIA GPU", file=sys.stderr)
        return 2
    dev = drv.device(0)
    major, minor = dev.compute_capability()
    sm = major * 10 + minor
    if os.environ.get("COLIBRI_GPU_BINARY"):
        binary = Path(os.environ["COLIBRI_GPU_BINARY"])
    else:
        from colibri_kit import paths

        binary = paths.dist_dir(os.environ.get("COLIBRI_GPU_TARGET", "host")) / "bin" / "colibri"
    img = pick(binary_images(binary), sm)
    if img is None:
        print(f"{binary}: no kernel image for sm_{sm}", file=sys.stderr)
        return 1
    ctx = dev.make_context()
    out = {"device": dev.name(), "sm": sm, "image": img.kind, "binary": str(binary), "gemv": {}}
    try:
        linear = ctx.module(img.data).get_function("cb_linear")
        if not args.json:
            print(f"{out['device']} sm_{sm}, kernels: {img.kind} from {binary}")
        nbytes = args.mib << 20
        a, b = ctx.alloc(nbytes), ctx.alloc(nbytes)
        copy_ms = _time_ms(ctx, lambda: ctx.dtod(b, a, nbytes), 10)
        out["copy_gbps"] = copy_gbs = 2 * nbytes / copy_ms / 1e6
        if not args.json:
            print(f"device copy: {copy_gbs:8.1f} GB/s (read + write of {nbytes >> 20} MiB)")
        rows, cols = args.rows, args.cols
        x = ctx.alloc(cols * 4)
        ctx.htod(x, np.ones(cols, np.float32).tobytes())
        y = ctx.alloc(rows * 4)
        scales = ctx.alloc(rows * 4)
        ctx.htod(scales, np.full(rows, 0.01, np.float32).tobytes())
        if not args.json:
            print(f"decode GEMV {rows} x {cols}, one token:")
        grid = ((rows + 3) // 4, 1)
        for dt in (0, 1, 2, 3):
            w = ctx.alloc(rows * cols * ESIZE[dt])
            ctx.memset8(w, 1, rows * cols * ESIZE[dt])
            argv_ = (y, rows, x, cols, 1, w, scales, dt, rows, cols, 0, 0, 0)

            def run(argv_=argv_):
                linear.launch(grid, (128, 1, 1), "PiPiiPPiiiPiP", argv_)

            ms = _time_ms(ctx, run, args.iters)
            moved = rows * cols * ESIZE[dt] + cols * 4 + rows * 4 * (2 if dt == 3 else 1)
            gbs = moved / ms / 1e6 if ms > 0 else 0.0
            out["gemv"][NAMES[dt]] = {"us": ms * 1e3, "gbps": gbs,
                                      "fraction_of_copy": gbs / copy_gbs if copy_gbs else 0.0}
            if not args.json:
                print(f"  {NAMES[dt]:5} {ms * 1e3:9.1f} us  {gbs:8.1f} GB/s  "
                      f"{100 * gbs / copy_gbs:5.1f}% of copy")
    finally:
        ctx.close()
    if args.json:
        print(json.dumps(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
