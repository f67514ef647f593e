"""Faked Jetson device files for the emulated fleet, built from real-format data.

``populate(root, module)`` writes, under ``root``, every file the kit and the Jetson tools read or
write on a real device, at its real path relative to ``/``, for one SKU of ``data/skus.json``
(identity as real devices report it) with that SKU's real-format nvpmodel conf
(``data/nvpmodel/<sku>.conf``, each naming its sources and what is unchecked):

==========================================================  =======================================
``etc/nv_tegra_release``                                    the SKU's L4T release line
``etc/nvpmodel.conf``                                       the SKU's conf (PARAM, POWER_MODEL,
                                                            PM_CONFIG DEFAULT)
``var/lib/nvpmodel/status``                                 written by nvpmodel at boot
``proc/meminfo``                                            MemTotal/MemAvailable of the SKU
                                                            (bound over /proc/meminfo on a device,
                                                            as LXCFS does)
``sys/firmware/devicetree/base/{model,compatible}``         NUL-terminated, as /proc/device-tree
``sys/devices/system/cpu/...``                              CPUs, cpuidle states, cpufreq policies
                                                            per cluster (cpuN/cpufreq links to its
                                                            policy, as on a real kernel)
``sys/devices/.../devfreq/<node>``, ``sys/class/devfreq``   GPU domain(s) with ``device/of_node/
                                                            name`` (Thor: gpu-gpc-0, gpu-nvd-0), a
                                                            VIC node that is not a GPU
``sys/devices/platform/gpu.0/{tpc_pg_mask,railgate_enable}``  the GPU's live TPC mask (set at boot)
``sys/kernel/debug/bpmp/debug/clk/emc/*``, EMC cap, fan PWM
``usr/sbin/nvpmodel``, ``usr/bin/jetson_clocks``            ``tools/nvpmodel_v2.py`` and
                                                            ``tools/jetson_clocks_v2.py``
``usr/sbin/reboot``                                         asks the emulated hardware to reboot
``proc/sys/kernel/random/boot_id``                          a new random UUID at every boot (bound
                                                            over the real file on a device)
``proc/interrupts``, ``proc/irq/N/...``                     the IRQs of a real Orin
                                                            (``data/interrupts/tegra234.txt``) for
                                                            the SKU's CPUs, and their affinity
                                                            files (bound over /proc on a device)
``boot/extlinux/extlinux.conf``                             L4T's (``data/extlinux/``)
``proc/sys/kernel/sched_rt_{period,runtime}_us``            the RT throttling budget, the
                                                            kernel's defaults 1000000 / 950000
                                                            at every boot (sched-rt-group.rst
                                                            2.1; a 4.9-tegra Jetson reads the
                                                            same: OE4T/linux-tegra-4.9 #37);
                                                            bound over /proc/sys on a device
``proc/cmdline``, ``sys/devices/system/cpu/isolated``       written at every boot from it by
                                                            ``usr/sbin/colibri-sim-kernel-boot``
                                                            (``tools/kernel_boot.py``: L4TLauncher's
                                                            and the kernel's rules)
==========================================================  =======================================

A real kernel derives ``effective_affinity_list`` from a write to ``smp_affinity_list`` (a GIC
picks one CPU of the mask); here it is a link to ``smp_affinity_list``, so it follows a write and
stays inside the mask, which is what the kit checks. ``populate(..., nohz_full=True)`` makes a
kernel built with CONFIG_NO_HZ_FULL (it has ``/sys/devices/system/cpu/nohz_full``); L4T's stock
kernel is not (OE4T/linux-tegra-5.10 ``arch/arm64/configs/defconfig``: ``CONFIG_NO_HZ=y`` only).

There is no kernel: a clock's current frequency (``scaling_cur_freq``, devfreq ``cur_freq``) is a
link to its floor (``scaling_min_freq``, ``min_freq``), so it reads the maximum exactly when the
clocks are pinned (jetson_clocks sets floor = ceiling), as on a device.

Boot = ``nvpmodel --sim-boot`` (what L4T's nvpmodel.service does): it applies the status file's
mode, or PM_CONFIG DEFAULT, including the GPU's TPC mask. ``populate`` boots once; an sshd device
(``colibri_kit.sim.fleet``) boots at every start. Outside a device, ``COLIBRI_SIM_ROOT=root``
makes the tools use ``root/<real path>``.

How an emulated device sees the tree: ``colibri_kit.sim.fleet`` binds ``root/sys`` on ``/sys``,
``root/proc/meminfo`` on ``/proc/meminfo`` and layers ``root/etc``, ``root/usr``, ``root/var``
as writable overlays on ``/etc``, ``/usr``, ``/var``; ``enter`` (``python3 -m
colibri_kit.sim.enter ROOT -- CMD`` under ``unshare -m --propagation private``) does the same for
one command (``MOUNTS``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
TOOLS_DIR = HERE / "tools"

# (path relative to the device root, what it is): what ``enter`` puts in place, in order.
MOUNTS: tuple[tuple[str, str], ...] = (
    ("sys", "bind"),
    ("etc", "overlay-ro"),
    ("usr/bin", "overlay-ro"),
    ("usr/sbin", "overlay-ro"),
    ("var/lib", "overlay-ro"),
    ("var/lib/nvpmodel", "bind"),
)

# Mounted only when the device tree has them (install_cuda_driver writes them): the CUDA
# driver's directories.
OPTIONAL_MOUNTS: tuple[tuple[str, str], ...] = (
    ("usr/lib", "overlay-ro"),
    ("usr/local", "overlay-ro"),
)

TOOLS = {"usr/sbin/nvpmodel": "nvpmodel_v2.py", "usr/bin/jetson_clocks": "jetson_clocks_v2.py",
         "usr/sbin/colibri-sim-kernel-boot": "kernel_boot.py"}
KERNEL_BOOT = "usr/sbin/colibri-sim-kernel-boot"   # relative to the device root

# Where a Jetson's CUDA driver lives. L4T's BSP driver: /usr/lib/aarch64-linux-gnu/tegra/
# libcuda.so.1.1 with the libcuda.so.1 link, found through /etc/ld.so.conf.d/nvidia-tegra.conf
# (the paths device logs in public issues show). NVIDIA's cuda-compat-X-Y package:
# /usr/local/cuda-X.Y/compat/ with libcuda.so.1 and the JIT compiler
# libnvidia-ptxjitcompiler.so.1 beside it (dpkg -L cuda-compat-12-2 as pasted in a public issue:
# libcuda.so.<ver> + libcuda.so.1, libnvidia-ptxjitcompiler.so.<ver> + .so.1,
# libnvidia-nvvm.so.4, libcudadebugger.so.1; the Jetson package's file versions are unchecked).
BSP_CUDA_DIR = "usr/lib/aarch64-linux-gnu/tegra"
VIC_NODE = "15340000.vic"
BOOT_ID = "proc/sys/kernel/random/boot_id"     # relative to the device root
# The RT throttling files (relative to the device root): kernel_boot.py writes the kernel's
# defaults into them at every boot; an sshd device binds them over the host's /proc/sys.
RT_BANDWIDTH = ("proc/sys/kernel/sched_rt_period_us", "proc/sys/kernel/sched_rt_runtime_us")

# Short names the fleet and the tests use for the SKU a factory device of that kind is.
ALIASES = {"orin-nx": "orin-nx-16gb", "orin-nano": "orin-nano-8gb", "agx-orin": "agx-orin-64gb"}

# Cluster size per SoC (cpuN/cpufreq links to the policy of its cluster, as on a real kernel).
CLUSTER = {"tegra234": 4, "tegra194": 2, "tegra264": 14}
# CPU frequency tables (kHz) and GPU table (Hz): plausible steps, not read from a device; the kit
# only relies on them being tables with a floor and a ceiling.
CPU_KHZ = {"tegra234": [115200, 729600, 1190400, 1497600, 1984000, 2201600],
           "tegra194": [115200, 1190400, 1420800, 1907200],
           "tegra264": [972000, 1620000, 2268000, 2601000]}
GPU_HZ = [306000000, 408000000, 612000000, 714000000, 918000000, 1173000000, 1300500000]
# GPU device directory under /sys, its devfreq nodes, its of_node name [jtop's jtop/core/gpu.py].
GPU = {"tegra234": ("devices/platform/bus@0/17000000.gpu", ["17000000.gpu"], "gpu"),
       "tegra194": ("devices/17000000.gv11b", ["17000000.gv11b"], "gv11b"),
       "tegra264": ("devices/platform/bus@0/d0b0000000.gpu", ["gpu-gpc-0", "gpu-nvd-0"], "gpu")}
# The kernel lists the governors it was built with (L4T's JetPack 5 kernel for Xavier also has
# interactive); the list ends with a space, as the kernel prints it.
CPU_GOVERNORS = {"": "conservative ondemand userspace powersave performance schedutil",
                 "tegra194": "interactive conservative ondemand userspace powersave performance "
                             "schedutil"}
GPU_GOVERNORS = "wmark_active nvhost_podgov userspace performance simple_ondemand"


def skus() -> dict[str, dict]:
    return {k: v for k, v in json.loads((DATA / "skus.json").read_text()).items()
            if not k.startswith("_")}


def sku_key(module: str) -> str:
    key = ALIASES.get(module, module)
    known = skus()
    if key not in known:
        raise ValueError(f"unknown emulated module {module!r} (known: "
                         f"{', '.join(sorted([*known, *ALIASES]))})")
    return key


def tool_script(source_name: str) -> str:
    """A stand-in as installed on a device (the file as it is: standard library only)."""
    return (TOOLS_DIR / source_name).read_text()


def _put(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink():
        path.unlink()
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    # Root writes the kernel's read-only files (the tools do, as the kernel would); a tree made by
    # another user for in-process tests (LocalRemote) keeps them writable by its owner.
    os.chmod(path, mode if os.geteuid() == 0 else mode | 0o200)


def _link(path: Path, target: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_symlink() or path.exists():
        path.unlink()
    path.symlink_to(target)


REBOOT = """#!/bin/sh
# Emulated Jetson: reboot power-cycles the device through its emulated hardware
# (colibri_kit/sim/power.py watches the file named in /etc/colibri-sim/power-request). Outside a
# device (COLIBRI_SIM_ROOT set: the in-process tests) there is nothing to stop: the boot runs at
# once, with a new boot id as a kernel gives each boot.
if [ -n "$COLIBRI_SIM_ROOT" ]; then
    cat /proc/sys/kernel/random/uuid > "$COLIBRI_SIM_ROOT/proc/sys/kernel/random/boot_id"
    "$COLIBRI_SIM_ROOT/usr/sbin/colibri-sim-kernel-boot" || exit 1
    exec "$COLIBRI_SIM_ROOT/usr/sbin/nvpmodel" --sim-boot
fi
req=$(cat /etc/colibri-sim/power-request 2>/dev/null) || {
    echo "reboot: this emulated device has no power button" >&2; exit 1; }
echo reboot > "$req"
"""


def interrupt_rows(text: str) -> list[tuple[str, list[int], str]]:
    """The rows of a real /proc/interrupts: (label, per-CPU counts, the rest of the line after
    the counts, which keeps the kernel's own spacing of chip, hwirq, type and actions)."""
    rows = []
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    ncpu = len(lines[0].split())
    for line in lines[1:]:
        label, _, rest = line.partition(":")
        fields = rest.split()
        counts = [int(x) for x in fields[:ncpu] if x.isdigit()]
        tail = rest
        for _ in counts:                  # cut the counts off, keep what follows as it was
            tail = tail.lstrip()
            tail = tail[len(tail.split(None, 1)[0]):]
        rows.append((label.strip(), counts, tail))
    return rows


def interrupts_text(ncpus: int, template: str | None = None) -> str:
    """``/proc/interrupts`` for ``ncpus`` CPUs, printed as the kernel does (kernel/irq/proc.c
    show_interrupts: the header "%*s" then "CPU%-8d" per CPU, each row "%*d: " then "%10u " per
    CPU; arch/arm64/kernel/smp.c show_ipi_list: "IPI%u:" rows; arch_show_interrupts' "Err:")."""
    rows = interrupt_rows(template or (DATA / "interrupts/tegra234.txt").read_text())
    prec = 3
    out = [" " * (prec + 8) + "".join(f"CPU{c:<8d}" for c in range(ncpus))]
    for label, counts, tail in rows:
        counts = (counts + [0] * ncpus)[:ncpus]
        if label == "Err":
            out.append(f"{'Err':>{prec}}: {counts[0]:10d}")
            continue
        # "%10u " per CPU: the tail kept from the template starts with the last one's space.
        head = f"{label}:" if label.startswith("IPI") else f"{int(label):{prec}d}: "
        out.append(head + "".join(f"{n:10d} " for n in counts) + tail[1:])
    return "\n".join(out) + "\n"


def _irqs(root: Path, ncpus: int, module: str) -> None:
    """/proc/interrupts and /proc/irq of a booted kernel (kernel-boot sets the affinities)."""
    text = interrupts_text(ncpus)
    _put(root / "proc/interrupts", text, 0o444)
    irq = root / "proc/irq"
    for label, _counts, _tail in interrupt_rows(text):
        if label.isdigit():
            d = irq / label
            _put(d / "smp_affinity_list", f"0-{ncpus - 1}\n")
            _put(d / "smp_affinity", "0\n")
            _put(d / "node", "0\n", 0o444)
            _link(d / "effective_affinity_list", "smp_affinity_list")
    _put(irq / "default_smp_affinity", "0\n")


def populate(root: Path, module: str, *, nohz_full: bool = False) -> None:
    """Write the faked files of one emulated SKU (a key of ``data/skus.json``, or ``orin-nx``,
    ``orin-nano``, ``agx-orin`` for the factory 16GB / 8GB / 64GB modules) under ``root``, and
    boot it once (nvpmodel applies the default mode). ``nohz_full``: its kernel was built with
    CONFIG_NO_HZ_FULL (L4T's stock kernel is not)."""
    s = skus()[sku_key(module)]
    root = Path(root)
    soc = s["soc"]
    _put(root / "etc/nvpmodel.conf", (DATA / "nvpmodel" / s["conf"]).read_text())
    _put(root / "etc/nv_tegra_release", s["nv_tegra_release"] + "\n")
    kb = int(s["memtotal_kb"])
    _put(root / "proc/meminfo", f"MemTotal:       {kb:>8} kB\nMemFree:        {kb * 9 // 10:>8} kB\n"
                                f"MemAvailable:   {kb * 17 // 20:>8} kB\n", 0o444)
    dt = root / "sys/firmware/devicetree/base"
    _put(dt / "model", (s["model"] + "\0").encode(), 0o444)
    _put(dt / "compatible", "".join(c + "\0" for c in s["compatible"]).encode(), 0o444)
    cpu = root / "sys/devices/system/cpu"
    n = int(s["cpus"])
    for name in ("present", "possible", "online"):
        _put(cpu / name, f"0-{n - 1}\n")
    khz = CPU_KHZ[soc]
    for c in range(n):
        _put(cpu / f"cpu{c}/online", "1\n")
        for st, name in ((0, "C1"), (1, "c7")):
            _put(cpu / f"cpu{c}/cpuidle/state{st}/name", name + "\n", 0o444)
            _put(cpu / f"cpu{c}/cpuidle/state{st}/disable", "0\n")
        policy = c - c % CLUSTER[soc]
        pol = cpu / f"cpufreq/policy{policy}"
        if c == policy:
            for name, value, mode in (
                    ("scaling_available_frequencies", " ".join(map(str, khz)) + " ", 0o444),
                    ("scaling_available_governors", CPU_GOVERNORS.get(soc, CPU_GOVERNORS[""])
                     + " ", 0o444),
                    ("scaling_min_freq", khz[0], 0o644), ("scaling_max_freq", khz[-1], 0o644),
                    ("cpuinfo_min_freq", khz[0], 0o444), ("cpuinfo_max_freq", khz[-1], 0o444),
                    ("scaling_governor", "schedutil", 0o644)):
                _put(pol / name, f"{value}\n", mode)
            _link(pol / "scaling_cur_freq", "scaling_min_freq")
        _link(cpu / f"cpu{c}/cpufreq", f"../cpufreq/policy{policy}")
    gdir, nodes, of_name = GPU[soc]
    dev = root / "sys" / gdir
    _put(dev / "of_node/name", of_name + "\0", 0o444)
    cls = root / "sys/class/devfreq"
    for node in nodes:
        d = dev / "devfreq" / node
        _put(d / "available_frequencies", " ".join(map(str, GPU_HZ)) + "\n", 0o444)
        _put(d / "available_governors", GPU_GOVERNORS + "\n", 0o444)
        _put(d / "min_freq", f"{GPU_HZ[0]}\n")
        _put(d / "max_freq", f"{GPU_HZ[-1]}\n")
        _put(d / "governor", "nvhost_podgov\n")
        _link(d / "cur_freq", "min_freq")
        _link(d / "device", "../..")
        _link(cls / node, os.path.relpath(d, cls))
    vic = root / "sys/devices/platform/15340000.vic/devfreq" / VIC_NODE    # not a GPU
    _put(vic / "min_freq", "115200000\n")
    _put(vic / "max_freq", "115200000\n")
    _put(vic / "governor", "nvhost_podgov\n")
    _put(vic / "available_governors", GPU_GOVERNORS + "\n", 0o444)
    _put(vic.parent.parent / "of_node/name", "vic\0", 0o444)
    _link(vic / "device", "../..")
    _link(cls / VIC_NODE, os.path.relpath(vic, cls))
    gpu0 = root / "sys/devices/platform/gpu.0"
    _put(gpu0 / "tpc_pg_mask", "0\n")
    _put(gpu0 / "railgate_enable", "1\n")
    _put(gpu0 / "power/control", "auto\n")
    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    for name, value in (("min_rate", 204000000), ("max_rate", 3199000000), ("rate", 204000000),
                        ("mrq_rate_locked", 0)):
        _put(emc / name, f"{value}\n")
    _put(root / "sys/kernel/nvpmodel_emc_cap/emc_iso_cap", "0\n")
    fan = root / "sys/devices/platform/pwm-fan/hwmon/hwmon0"
    _put(fan / "name", "pwmfan\n", 0o444)
    _put(fan / "pwm1", "64\n")
    (root / "var/lib/nvpmodel").mkdir(parents=True, exist_ok=True)
    (root / "root").mkdir(exist_ok=True)
    for rel, source in TOOLS.items():
        _put(root / rel, tool_script(source), 0o755)
    _put(root / "usr/sbin/reboot", REBOOT, 0o755)
    _irqs(root, n, module)
    _put(root / "boot/extlinux/extlinux.conf", (DATA / "extlinux/extlinux.conf").read_text())
    _put(root / "proc/cmdline", "\n", 0o444)
    for rel in RT_BANDWIDTH:       # root-writable as in procfs (0644); the boot fills them
        _put(root / rel, "\n")
    _put(cpu / "isolated", "\n", 0o444)
    if nohz_full:
        _put(cpu / "nohz_full", "\n", 0o444)
    boot(root)


def new_boot_id(path: Path) -> str:
    """A fresh ``/proc/sys/kernel/random/boot_id``: the kernel draws a random UUID at every boot
    (Documentation/admin-guide/sysctl/kernel.rst, "random"); the kit confirms a reboot by it."""
    value = str(uuid.uuid4())
    _put(path, value + "\n", 0o444)
    return value


def boot(root: Path) -> None:
    """What L4T's nvpmodel.service does at boot, on the tree outside a namespace (and the new
    boot id the kernel would have)."""
    new_boot_id(Path(root) / BOOT_ID)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "COLIBRI_SIM_ROOT": str(root),
           "HOME": "/root"}
    # Run as the device runs them: the scripts through their own #!/usr/bin/env python3.
    for argv in ([str(Path(root) / KERNEL_BOOT)], [str(Path(root) / "usr/sbin/nvpmodel"), "--sim-boot"]):
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                           stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError(f"emulated boot of {root} failed: {r.stderr.strip()}")


def mount_plan(root: Path) -> list[tuple[str, Path, str]]:
    """[(kind, source under root, real path)] in the order ``enter`` mounts them."""
    root = Path(root)
    optional = [(rel, kind) for rel, kind in OPTIONAL_MOUNTS if (root / rel).is_dir()]
    return [(kind, root / rel, Path("/" + rel)) for rel, kind in (*MOUNTS, *optional)]


def install_cuda_driver(root: Path, libcuda: Path, ptxjit: Path | None = None,
                        compat: str | None = None) -> str:
    """Put a (stand-in) CUDA driver library where a Jetson has it: the BSP's (compat None) or
    NVIDIA's cuda-compat package for CUDA ``compat`` (e.g. "11.8"), with its JIT compiler when
    given. Returns the device path of the libcuda.so.1 it installed."""
    if compat is not None and not re.fullmatch(r"\d+\.\d+", compat):
        raise ValueError(f"bad CUDA version {compat!r}")
    rel = BSP_CUDA_DIR if compat is None else f"usr/local/cuda-{compat}/compat"
    d = Path(root) / rel
    d.mkdir(parents=True, exist_ok=True)
    shutil.copy2(libcuda, d / "libcuda.so.1.1")
    _link(d / "libcuda.so.1", "libcuda.so.1.1")
    _link(d / "libcuda.so", "libcuda.so.1")
    if ptxjit is not None:
        shutil.copy2(ptxjit, d / "libnvidia-ptxjitcompiler.so.1.1")
        _link(d / "libnvidia-ptxjitcompiler.so.1", "libnvidia-ptxjitcompiler.so.1.1")
    return f"/{rel}/libcuda.so.1"
