"""Build timings: cold build per target (clean build dir, toolchains installed) and no-op rebuild.

    python benchmarks/build.py [--targets orin-nx,host] [--cold-zig-cache] [--repeat 3]

Builds run in a temporary copy of the project (COLIBRI_PROJECT_ROOT), so the checkout's build/
and dist/ are untouched. "cold" = empty build/ and dist/ (the toolchain cache stays: installing
it is a one-time download; --cold-zig-cache also starts zig's object cache empty). "no-op" =
the same build again with nothing changed, in-process and as a separate `python -m
colibri_kit.build` (what `invoke build` costs, interpreter start included). Goal: no-op < 1 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from colibri_kit import build as kb  # noqa: E402
from colibri_kit import paths, profiles  # noqa: E402


def copy_project(dest: Path) -> None:
    ignore = shutil.ignore_patterns("build", "*.o", "*.a", "__pycache__")
    for name in ("runtime", "targets", "templates"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", default="", help="comma list (default: every target)")
    ap.add_argument("--cold-zig-cache", action="store_true")
    ap.add_argument("--repeat", type=int, default=3, help="no-op rebuilds to time")
    args = ap.parse_args()
    targets = [t for t in args.targets.split(",") if t] or profiles.list_profiles(ROOT / "targets")
    rows = []
    with tempfile.TemporaryDirectory(prefix="colibri-bench-") as tmp:
        proj = Path(tmp) / "proj"
        copy_project(proj)
        os.environ["COLIBRI_PROJECT_ROOT"] = str(proj)
        if args.cold_zig_cache:
            os.environ["COLIBRI_ZIG_CACHE_DIR"] = str(Path(tmp) / "zig-cache")
        for t in targets:
            shutil.rmtree(paths.build_dir(t), ignore_errors=True)
            shutil.rmtree(paths.dist_dir(t), ignore_errors=True)
            t0 = time.perf_counter()
            r = kb.build(profiles.load_profile(t), where="host", progress=lambda m: None)
            cold = time.perf_counter() - t0
            noop_in, noop_cli = [], []
            for _ in range(args.repeat):
                t0 = time.perf_counter()
                again = kb.build(profiles.load_profile(t), where="host", progress=lambda m: None)
                noop_in.append(time.perf_counter() - t0)
                assert not again.make_ran_commands and not again.kernels_compiled
                t0 = time.perf_counter()
                subprocess.run([sys.executable, "-m", "colibri_kit.build", "--target", t,
                                "--in", "host"], check=True, cwd=ROOT, capture_output=True)
                noop_cli.append(time.perf_counter() - t0)
            k = r.steps
            rows.append((t, cold, k.get("kernels", 0.0), k.get("make", 0.0),
                         statistics.median(noop_in), statistics.median(noop_cli)))
    print(f"{'target':10} {'cold s':>7} {'kernels':>8} {'make':>6} {'no-op s':>8} "
          f"{'no-op CLI s':>12}")
    for t, cold, kern, make, noop, cli in rows:
        print(f"{t:10} {cold:7.2f} {kern:8.2f} {make:6.2f} {noop:8.3f} {cli:12.3f}")
    worst = max(r[5] for r in rows)
    print(f"no-op goal < 1 s: {'met' if worst < 1.0 else 'MISSED'} (worst CLI no-op {worst:.3f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
