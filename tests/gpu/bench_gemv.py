"""Decode GEMV bandwidth of the shipped kernels vs this GPU's copy bandwidth (prints figures).

    COLIBRI_GPU_TARGET=host python tests/gpu/bench_gemv.py      # or: invoke gpucheck --bench

Decode is memory-bound: one token reads every weight of the attention, the chosen experts and
the LM head once. This times `cb_linear` with n = 1 (the decode GEMV) on a large matrix of each
weight dtype with CUDA events, and a device-to-device copy of the same size (which reads and
writes each byte: 2 x bytes moved), and prints achieved GB/s and the fraction of the copy's.
A benchmark, not a test: it asserts nothing about speed.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent.parent))  # the checkout, when the kit is not installed

from gpu_images import binary_images, pick  # noqa: E402

from colibri_kit import paths  # noqa: E402

ESIZE = {0: 4, 1: 2, 2: 2, 3: 1}
NAMES = {0: "f32", 1: "f16", 2: "bf16", 3: "int8"}


def _time_ms(cuda, fn, iters: int) -> float:
    start, stop = cuda.Event(), cuda.Event()
    fn()  # warm-up
    start.record()
    for _ in range(iters):
        fn()
    stop.record()
    stop.synchronize()
    return stop.time_since(start) / iters


def main() -> int:
    try:
        import pycuda.driver as cuda
    except ImportError as exc:
        print(f"bench_gemv: pycuda unavailable ({exc}): needs an NVIDIA GPU and the `gpu` extra",
              file=sys.stderr)
        return 2

    cuda.init()
    dev = cuda.Device(0)
    sm = int("".join(map(str, dev.compute_capability())))
    target = os.environ.get("COLIBRI_GPU_TARGET", "host")
    binary = paths.dist_dir(target) / "bin" / "colibri"
    img = pick(binary_images(binary), sm)
    if img is None:
        print(f"{binary}: no kernel image for sm_{sm}", file=sys.stderr)
        return 1
    ctx = dev.make_context()
    try:
        module = cuda.module_from_buffer(img.data)
        linear = module.get_function("cb_linear")
        linear.prepare("PiPiiPPiiiPiP")
        print(f"{dev.name()} sm_{sm}, kernels: {img.kind} from {binary}")

        nbytes = 512 << 20
        a, b = cuda.mem_alloc(nbytes), cuda.mem_alloc(nbytes)
        copy_ms = _time_ms(cuda, lambda: cuda.memcpy_dtod(b, a, nbytes), 10)
        copy_gbs = 2 * nbytes / copy_ms / 1e6
        print(f"device copy: {copy_gbs:8.1f} GB/s (read + write of {nbytes >> 20} MiB)")
        del a, b

        rows, cols = 16384, 8192
        x = cuda.mem_alloc(cols * 4)
        cuda.memcpy_htod(x, np.ones(cols, np.float32))
        y = cuda.mem_alloc(rows * 4)
        scales = cuda.mem_alloc(rows * 4)
        cuda.memcpy_htod(scales, np.full(rows, 0.01, np.float32))
        print(f"decode GEMV {rows} x {cols}, one token:")
        for dt in (0, 1, 2, 3):
            w = cuda.mem_alloc(rows * cols * ESIZE[dt])
            cuda.memset_d8(w, 1, rows * cols * ESIZE[dt])
            grid = ((rows + 3) // 4, 1)

            def run(w=w, dt=dt):
                linear.prepared_call(grid, (128, 1, 1), int(y), np.int32(rows), int(x),
                                     np.int32(cols), np.int32(1), int(w), int(scales),
                                     np.int32(dt), np.int32(rows), np.int32(cols), 0,
                                     np.int32(0), 0)

            ms = _time_ms(cuda, run, 20)
            moved = rows * cols * ESIZE[dt] + cols * 4 + rows * 4 * (2 if dt == 3 else 1)
            gbs = moved / ms / 1e6
            print(f"  {NAMES[dt]:5} {ms * 1e3:9.1f} us  {gbs:8.1f} GB/s  "
                  f"{100 * gbs / copy_gbs:5.1f}% of copy")
            del w
    finally:
        ctx.pop()
        ctx.detach()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
