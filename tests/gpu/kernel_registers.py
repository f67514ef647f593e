"""Registers, spills and stack of every kernel on every pinned SM, from the real ptxas -v.

    PYTHONPATH=$PWD python tests/gpu/kernel_registers.py [KERNELS.cu]

Compiles the kernel source (default: runtime/kernels/colibri_kernels.cu; pass another copy, e.g.
an older revision, to compare) exactly as tests/test_cuda_host.py does (NVRTC -> PTX for the SM,
then ptxas -v), for the profiles of TOOLCHAIN_CASES there, and prints one row per kernel:
registers per thread on each SM, then the largest spill store/load and stack frame over all SMs.
A figure for the build log, not a test: the tests assert zero spills.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from pathlib import Path

from colibri_kit import paths, profiles, render, toolchain

CASES = [("xavier-nx", "11.8", 72), ("orin-nx", "12.6", 87), ("host", "12.6", 90),
         ("agx-thor", "13.0", 110)]

_FUNC = re.compile(r"Compiling entry function '(\w+)'")
_USED = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


def ptxas_report(source: Path, target: str, version: str, sm: int, tmp: Path) -> dict[str, tuple]:
    """kernel -> (registers, stack bytes, spill store bytes, spill load bytes) on sm."""
    tc = toolchain.cuda_toolchain(version)
    inc = render.write_config(profiles.load_profile(target), tmp / target / "inc").parent
    images = toolchain.compile_kernels(tc, source, [inc], [sm], tmp / target / "out")
    proc = subprocess.run([str(tc.ptxas), f"-arch=sm_{sm}", "-v", "-o", "/dev/null",
                           str(images[-1].path)], capture_output=True, text=True, check=True)
    out: dict[str, tuple] = {}
    name = None
    stack = (0, 0, 0)
    for line in proc.stderr.splitlines():
        if m := _FUNC.search(line):
            name = m.group(1)
        elif m := _SPILL.search(line):
            stack = tuple(int(v) for v in m.groups())
        elif (m := _USED.search(line)) and name:
            out[name] = (int(m.group(1)), *stack)
            name = None
    return out


def main(argv: list[str]) -> int:
    source = Path(argv[1]).resolve() if len(argv) > 1 else (
        paths.project_root() / "runtime" / "kernels" / "colibri_kernels.cu")
    with tempfile.TemporaryDirectory() as d:
        reports = {sm: ptxas_report(source, t, v, sm, Path(d)) for t, v, sm in CASES}
    kernels = sorted({k for r in reports.values() for k in r})
    print(f"{'kernel':<22}" + "".join(f"{'sm_' + str(sm):>8}" for _, _, sm in CASES)
          + f"{'stack':>7}{'spill':>7}")
    for k in kernels:
        regs = [reports[sm].get(k, (0, 0, 0, 0)) for _, _, sm in CASES]
        print(f"{k:<22}" + "".join(f"{r[0]:>8}" for r in regs)
              + f"{max(r[1] for r in regs):>7}{max(r[2] + r[3] for r in regs):>7}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
