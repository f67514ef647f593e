"""The kernel conformance checks (conformance.cases()) without pytest: for a GPU machine that has
python3 and numpy but nothing else (no pytest, no pycuda). Each check runs on the kernel image a
built colibri ships, through pycuda when importable, else the driver itself (gpu_session.py).

    python3 tests/gpu/run_conformance.py --binary DIR/bin/colibri [-k linear,attention] [--json]

Prints one line per check (or one JSON object per line with --json: {"check", "ok", "seconds",
"error"}) as it finishes, then a summary. Exit status 0: every check passed; 1: one failed;
2: no GPU (says why).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(1, str(HERE.parent.parent))  # the checkout (colibri_kit.model.format, elf)

import conformance as C  # noqa: E402
from gpu_session import Gpu, NoGpu  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--binary", type=Path, required=True, help="a colibri with this GPU's image")
    ap.add_argument("-k", default="", help="comma-separated substrings: only matching checks")
    ap.add_argument("--driver", choices=("auto", "pycuda", "driver"), default="auto")
    ap.add_argument("--json", action="store_true", help="one JSON object per check")
    args = ap.parse_args(argv)
    try:
        gpu = Gpu(args.binary, args.driver)
    except NoGpu as exc:
        print(f"run_conformance: {exc}", file=sys.stderr)
        return 2
    keys = [k for k in args.k.split(",") if k]
    passed = failed = 0
    try:
        for name, check in C.cases():
            if keys and not any(k in name for k in keys):
                continue
            t0 = time.monotonic()
            try:
                check(gpu)
                ok, err = True, ""
            except Exception as exc:  # AssertionError from a check, or a driver error
                ok = False
                err = f"{type(exc).__name__}: {exc}"[:400] or traceback.format_exc(limit=2)
            passed += ok
            failed += not ok
            dt = time.monotonic() - t0
            if args.json:
                print(json.dumps({"check": name, "ok": ok, "seconds": round(dt, 3),
                                  "error": err}), flush=True)
            else:
                print(f"{'ok  ' if ok else 'FAIL'} {name} ({dt:.2f} s){'  ' + err if err else ''}",
                      flush=True)
    finally:
        gpu.close()
    print(f"{passed} passed, {failed} failed ({gpu.ops.name}, sm_{gpu.sm}, "
          f"{gpu.image.kind} {gpu.image.sm})", file=sys.stderr if args.json else sys.stdout)
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
