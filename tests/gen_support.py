"""Shared by tests/test_sampler.py and tests/test_generate.py: the C test driver (built once per
session from runtime/src with the host cc) and a Python model of the sampler.

The Python model (`sample`) mirrors runtime/src/text/sampler.c operation by operation: float32
repetition penalty, the (logit desc, id asc) order, weights and sums in double with the C
library's exp (Python's math.exp calls it), and splitmix64 draws. For a fixed seed both must
give exactly the same ids."""
from __future__ import annotations

import math
import subprocess
from pathlib import Path

import numpy as np
from kit_support import runtime_library_sources

ROOT = Path(__file__).resolve().parents[1]
MASK = (1 << 64) - 1


def build_driver(out_dir: Path, config_dir: Path, sanitize: bool = False) -> Path:
    """runtime/tests/gen_driver.c linked with every runtime source (CPU only, no kernels);
    with sanitize, under -fsanitize=address,undefined (any finding aborts the run)."""
    rt = ROOT / "runtime"
    srcs = runtime_library_sources()
    exe = out_dir / ("gen_driver_asan" if sanitize else "gen_driver")
    san = ["-g", "-fsanitize=address,undefined", "-fno-sanitize-recover=undefined"] if sanitize else []
    subprocess.run(["cc", "-std=c11", "-O1", *san, "-D_GNU_SOURCE", f"-I{rt / 'include'}", f"-I{rt / 'src'}",
                    f"-I{config_dir}", "-o", str(exe), str(rt / "tests" / "gen_driver.c"), *srcs,
                    "-lm", "-lpthread", "-ldl"], check=True, capture_output=True, text=True)
    return exe


def gen_driver_build(tmp_path_factory, sanitize: bool = False) -> Path:  # noqa: ANN001
    """The driver with the host target's rendered config header, in a fresh temp dir
    (tmp_path_factory: pytest.TempPathFactory)."""
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import write_config

    out = tmp_path_factory.mktemp("gen-driver")
    write_config(load_profile("host"), out / "include")
    return build_driver(out, out / "include", sanitize)


def rng_u64(seed: int, counter: int) -> int:
    z = (seed + (counter + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def rng_uniform(seed: int, counter: int) -> float:
    return (rng_u64(seed, counter) >> 11) * (1.0 / 9007199254740992.0)


def sample(logits: np.ndarray, *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0,
           min_p: float = 0.0, repeat_penalty: float = 1.0, repeat_last_n: int = 0,
           history: list[int] | None = None, seed: int = 0, draw: int = 0) -> int:
    """The id sampler.c picks at draw number `draw` of a sampler seeded with `seed`."""
    l = np.array(logits, dtype=np.float32)
    r = np.float32(repeat_penalty)
    hist = list(history or [])
    if r != np.float32(1.0) and hist:
        window = hist[-repeat_last_n:] if repeat_last_n > 0 else hist
        for t in dict.fromkeys(window):
            if 0 <= t < len(l):
                l[t] = l[t] / r if l[t] > 0 else l[t] * r
    if np.float32(temperature) <= 0:
        return int(np.argmax(l))  # first maximum: the lowest id
    order = sorted(range(len(l)), key=lambda i: (-float(l[i]), i))
    if 0 < top_k < len(l):
        order = order[:top_k]
    t = float(np.float32(temperature))
    top = float(l[order[0]])
    w = [math.exp((float(l[i]) - top) / t) for i in order]
    total = 0.0
    for x in w:
        total += x
    n = len(order)
    if np.float32(top_p) < 1:
        need, run = float(np.float32(top_p)) * total, 0.0
        for i, x in enumerate(w):
            run += x
            if run >= need:
                n = i + 1
                break
    if np.float32(min_p) > 0:
        floor_w = float(np.float32(min_p)) * w[0]
        keep = 1
        while keep < n and w[keep] >= floor_w:
            keep += 1
        n = keep
    kept = 0.0
    for x in w[:n]:
        kept += x
    u, run = rng_uniform(seed, draw) * kept, 0.0
    for i in range(n):
        run += w[i]
        if u < run:
            return order[i]
    return order[n - 1]


def c_sample(driver: Path, logits: np.ndarray, draws: int, history: list[int] | None = None,
             *, temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0,
             repeat_penalty: float = 1.0, repeat_last_n: int = 0, seed: int = 0) -> list[int]:
    hist = list(history or [])
    spec = (f"{len(logits)} {temperature!r} {top_k} {top_p!r} {min_p!r} {repeat_penalty!r} "
            f"{repeat_last_n} {seed} {draws} {len(hist)}\n{' '.join(map(str, hist))}\n"
            + " ".join(float(np.float32(x)).hex() for x in logits) + "\n")
    out = subprocess.run([str(driver), "sample"], input=spec, capture_output=True, text=True,
                         check=True, timeout=60).stdout
    return [int(x) for x in out.split()]


def logits_for_test(vocab: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(vocab) * 2.0).astype(np.float32)
