"""Executed instructions of the CPU matmul kernels per call, counted under qemu: aarch64 builds for
Orin (-mcpu=cortex-a78ae) and Thor-class (-mcpu=neoverse-v2) CPUs next to the x86_64 build.

Under qemu speed means nothing, so this counts instead: benchmarks/kernel_insns.c is built with
the runtime's CPU sources (zig for aarch64, the host cc for x86_64) and run under
`qemu-aarch64` / `qemu-x86_64` with `-d in_asm,exec,nochain`, which logs every translated block
and every block executed. Instructions per call = count(REPS=2) - count(REPS=1), so start-up
drops out; SDOT and SMMLA are counted from their encodings. Kernels: int8 weights x int8
activations (`q8`, --int8-act), int8 x f32 (`i8`), 4-bit x f32 (`q4`), 4-bit x int8 (`q4q8`).

The levels: qemu's neoverse-n1 has dotprod but not i8mm (as Orin's Cortex-A78AE), `max` has
i8mm (as Thor's Neoverse-V3AE, a V2-class core); `COLIBRI_CPU_SIMD=neon` caps a run at plain
NEON. qemu-x86_64 (7.2) emulates AVX2+FMA+F16C but not AVX-512, so the x86 column is the AVX2
kernels. The output hash is printed per run: the same for every level of an integer kernel
(`q8`) and, the q4 layout's contract, for `q4`/`q4q8` on both architectures. Instruction counts
say nothing of issue rates or memory: they compare the work per multiply-accumulate.

    PYTHONPATH=. python benchmarks/kernel_insns.py [--rows 64] [--cols 2048] [--tokens 1,6,64]
        [--kinds q8,i8,q4,q4q8]
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

# (build, qemu binary, qemu -cpu, COLIBRI_CPU_SIMD): the runs to compare
RUNS = [("orin", "qemu-aarch64", "neoverse-n1", "neon"), ("orin", "qemu-aarch64", "neoverse-n1", None),
        ("thor", "qemu-aarch64", "max", None), ("x86_64", "qemu-x86_64", "max", None)]
BUILDS = {"orin": "cortex_a78ae", "thor": "neoverse_v2", "x86_64": None}
SDOT = (0xFFE0FC00, 0x4E809400)   # SDOT Vd.4S, Vn.16B, Vm.16B
SMMLA = (0xFFE0FC00, 0x4E80A400)  # SMMLA Vd.4S, Vn.16B, Vm.16B
INSN = re.compile(r"^0x([0-9a-f]+):\s+(([0-9a-f]{2} )+|[0-9a-f]{8}\b)")
EXEC = re.compile(r"^Trace \d+: 0x[0-9a-f]+ \[[0-9a-f]+/([0-9a-f]+)/")


def build(work: Path, name: str) -> Path:
    from colibri_kit.profiles import load_profile
    from colibri_kit.render import render_config
    from colibri_kit.toolchain import install_zig, zig_env

    (work / "cfg").mkdir(parents=True, exist_ok=True)
    (work / "cfg" / "colibri_config.h").write_text(render_config(load_profile("host")))
    exe = work / f"kernel_insns-{name}"
    rt = ROOT / "runtime"
    srcs = [str(s) for s in sorted((rt / "src").glob("*/*.c"))] + [str(rt / "embed" / "kernel_images_empty.c")]
    flags = ["-O2", "-std=c11", "-D_GNU_SOURCE", f"-I{rt / 'include'}", f"-I{rt / 'src'}",
             f"-I{work / 'cfg'}", "-o", str(exe), str(ROOT / "benchmarks" / "kernel_insns.c"), *srcs,
             "-lm", "-lpthread", "-ldl"]
    if BUILDS[name] is None:
        subprocess.run(["cc", *flags], check=True)
    else:
        p = load_profile("orin-nx")
        subprocess.run([str(install_zig()), "cc", "-target", p.zig_triple, f"-mcpu={BUILDS[name]}", *flags],
                       check=True, env={**os.environ, **zig_env()})
    return exe


def count(qemu: str, exe: Path, cpu: str, cap: str | None, args: list[str], log: Path) -> tuple[str, dict[str, int]]:
    env = {**os.environ}
    env.pop("COLIBRI_CPU_SIMD", None)
    if cap:
        env["COLIBRI_CPU_SIMD"] = cap
    argv = [qemu, "-cpu", cpu] + (["-L", "/usr/aarch64-linux-gnu"] if qemu == "qemu-aarch64" else [])
    out = subprocess.run([*argv, "-d", "in_asm,exec,nochain", "-D", str(log), str(exe), *args], env=env,
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
                cur[0] += 1
                if qemu == "qemu-aarch64":
                    enc = int(m.group(2), 16)
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
    ap.add_argument("--tokens", default="1,6,64")
    ap.add_argument("--kinds", default="q8,i8,q4,q4q8")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "colibri-kernel-insns")
    a = ap.parse_args()
    a.work.mkdir(parents=True, exist_ok=True)
    exes = {name: build(a.work, name) for name in BUILDS}
    print(f"rows {a.rows} x cols {a.cols}; executed instructions per call (orin: -mcpu=cortex-a78ae, "
          f"thor: -mcpu=neoverse-v2, x86_64: the host build)")
    print("| kernel | tokens | build | qemu -cpu | cap | level | output hash | instructions | per 1000 MACs | SDOT | SMMLA |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in a.kinds.split(","):
        for n in (int(t) for t in a.tokens.split(",")):
            macs = a.rows * a.cols * n
            for bname, qemu, cpu, cap in RUNS:
                c = {}
                for reps in (1, 2):
                    out, c[reps] = count(qemu, exes[bname], cpu, cap,
                                         [kind, str(a.rows), str(a.cols), str(n), str(reps)], a.work / "qemu.log")
                level, digest = out.split()
                d = {k: c[2][k] - c[1][k] for k in c[1]}
                print(f"| {kind} | {n} | {bname} | {cpu} | {cap or '-'} | {level} | {digest} | {d['insns']} | "
                      f"{1000 * d['insns'] / macs:.1f} | {d['sdot']} | {d['smmla']} |", flush=True)


if __name__ == "__main__":
    main()
