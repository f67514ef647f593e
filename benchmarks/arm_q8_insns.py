"""Executed aarch64 instructions of the int8 x int8 prefill matmul (--int8-act) per kernel level:
`neon` (vmull/vpadal), `neon-dotprod` (SDOT tiles), `neon-i8mm` (SMMLA tiles), one binary.

Under qemu-aarch64 speed means nothing, so this counts instead: benchmarks/arm_q8_insns.c is
cross-compiled by zig for Orin's CPU (-mcpu=cortex-a78ae: the SDOT and SMMLA kernels are chosen
at run time) and run under `qemu-aarch64 -d in_asm,exec,nochain`, which logs every translated
block and every block executed. Instructions per call = count(REPS=2) - count(REPS=1), so start-up
drops out; SDOT and SMMLA are counted from their encodings. The output hash must be the same on
every line (same bits at every level). qemu's neoverse-n1 has dotprod but not i8mm (Orin's
Cortex-A78AE likewise); `max` has i8mm (Thor's Neoverse-V3AE likewise). Instruction counts say
nothing of the issue rates of a real core: time it on a Thor.

    PYTHONPATH=. python benchmarks/arm_q8_insns.py [--rows 64] [--cols 2048] [--tokens 6,64]
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# (qemu -cpu, COLIBRI_CPU_SIMD): the levels to compare
RUNS = [("max", "neon"), ("neoverse-n1", None), ("max", "neon-dotprod"), ("max", None)]
SDOT = (0xFFE0FC00, 0x4E809400)   # SDOT Vd.4S, Vn.16B, Vm.16B
SMMLA = (0xFFE0FC00, 0x4E80A400)  # SMMLA Vd.4S, Vn.16B, Vm.16B
INSN = re.compile(r"^0x([0-9a-f]+):\s+([0-9a-f]{8})\b")
EXEC = re.compile(r"^Trace \d+: 0x[0-9a-f]+ \[[0-9a-f]+/([0-9a-f]+)/")


def build(work: Path) -> Path:
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import render_config
    from colibri_kit.toolchain import install_zig, zig_env

    p = load_profile("orin-nx")
    (work / "cfg").mkdir(parents=True, exist_ok=True)
    (work / "cfg" / "colibri_config.h").write_text(render_config(load_profile("host")))
    exe = work / "arm_q8_insns"
    rt = ROOT / "runtime"
    srcs = [str(s) for s in sorted((rt / "src").glob("*/*.c"))] + [str(rt / "embed" / "kernel_images_empty.c")]
    subprocess.run([str(install_zig()), "cc", "-target", p.zig_triple, f"-mcpu={p.zig_mcpu}", "-O2",
                    "-std=c11", "-D_GNU_SOURCE", f"-I{rt / 'include'}", f"-I{rt / 'src'}",
                    f"-I{work / 'cfg'}", "-o", str(exe), str(ROOT / "benchmarks" / "arm_q8_insns.c"),
                    *srcs, "-lm", "-lpthread", "-ldl"], check=True, env={**os.environ, **zig_env()})
    return exe


def count(exe: Path, cpu: str, cap: str | None, args: list[str], log: Path) -> tuple[str, dict[str, int]]:
    env = {**os.environ}
    env.pop("COLIBRI_CPU_SIMD", None)
    if cap:
        env["COLIBRI_CPU_SIMD"] = cap
    out = subprocess.run(["qemu-aarch64", "-cpu", cpu, "-L", "/usr/aarch64-linux-gnu", "-d",
                          "in_asm,exec,nochain", "-D", str(log), str(exe), *args], env=env,
                         capture_output=True, text=True, check=True).stdout.strip()
    blocks: dict[str, tuple[int, int, int]] = {}  # block pc -> (instructions, SDOT, SMMLA)
    cur: list[int] | None = None
    pc = ""
    totals = {"insns": 0, "sdot": 0, "smmla": 0}
    with log.open() as f:
        for line in f:
            m = INSN.match(line)
            if m:
                if cur is None:
                    pc, cur = m.group(1).lstrip("0"), [0, 0, 0]
                enc = int(m.group(2), 16)
                cur[0] += 1
                cur[1] += (enc & SDOT[0]) == SDOT[1]
                cur[2] += (enc & SMMLA[0]) == SMMLA[1]
                continue
            if cur is not None:
                blocks[pc] = (cur[0], cur[1], cur[2])
                cur = None
            m = EXEC.match(line)
            if m:
                b = blocks.get(m.group(1).lstrip("0"))
                if b:
                    totals["insns"] += b[0]
                    totals["sdot"] += b[1]
                    totals["smmla"] += b[2]
    log.unlink()
    return out, totals


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--cols", type=int, default=2048)
    ap.add_argument("--tokens", default="6,64")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colibri-arm-q8")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    exe = build(a.work)
    print(f"rows {a.rows} x cols {a.cols}; executed instructions per colibri_rows_dot_q8 call")
    print("| tokens | qemu -cpu | cap | level | output hash | instructions | per 1000 MACs | SDOT | SMMLA |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n in (int(t) for t in a.tokens.split(",")):
        macs = a.rows * a.cols * n
        for cpu, cap in RUNS:
            c = {}
            for reps in (1, 2):
                out, c[reps] = count(exe, cpu, cap, [str(a.rows), str(a.cols), str(n), str(reps)],
                                     a.work / "qemu.log")
            level, digest = out.split()
            d = {k: c[2][k] - c[1][k] for k in c[1]}
            print(f"| {n} | {cpu} | {cap or '-'} | {level} | {digest} | {d['insns']} | "
                  f"{1000 * d['insns'] / macs:.1f} | {d['sdot']} | {d['smmla']} |")


if __name__ == "__main__":
    main()
