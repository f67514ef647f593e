#!/usr/bin/env python3
"""The boot of an emulated Jetson's kernel: what the bootloader and the kernel leave in /proc and
/sys that ``invoke tune``'s real-time steps read (standard library only; never imports
colibri_kit: it is copied onto the emulated device as /usr/sbin/colibri-sim-kernel-boot and runs at
every boot, before nvpmodel's). COLIBRI_SIM_ROOT, when set, prefixes every path (the in-process
devices); on an sshd device the paths are the real ones, bound over the host's.

What it does, and where each rule comes from:

* The kernel command line (/proc/cmdline) from /boot/extlinux/extlinux.conf, as UEFI's L4TLauncher
  builds it (NVIDIA/edk2-nvidia, Silicon/NVIDIA/Application/L4TLauncher/L4TLauncher.c,
  ProcessExtLinuxConfig and CleanExtLinuxLine): a '#' starts a comment anywhere on a line;
  leading and trailing spaces and tabs are dropped; keys (TIMEOUT, DEFAULT, MENU TITLE, LABEL,
  MENU LABEL, LINUX, INITRD, FDT, OVERLAYS, APPEND) match the start of the line, case sensitive;
  at most 10 LABELs; the entry booted is the LABEL equal to DEFAULT, else the first; in its APPEND
  the text "${cbootargs}" and the spaces after it are removed; the platform then appends its own
  arguments. Those (bl_prof_dataptr=..., bl_prof_ro_ptr=...) are copied from a JetPack 6 device's
  /proc/cmdline (csantanapr/k8s-nvidia README.md, kernel 5.15.136-tegra), for every module.
* /sys/devices/system/cpu/isolated from isolcpus= (kernel/sched/isolation.c,
  housekeeping_isolcpus_setup: optional flags "nohz,", "domain,", "managed_irq," then a CPU list;
  an unknown flag makes the kernel ignore the parameter; a list naming every present CPU keeps the
  boot CPU for housekeeping; drivers/base/cpu.c prints the non-housekeeping CPUs of the domain
  type, "\\n" when none).
* /sys/devices/system/cpu/nohz_full, only on a kernel built with CONFIG_NO_HZ_FULL (the emulated
  device says so by having that file; L4T's stock defconfig has CONFIG_NO_HZ=y only,
  OE4T/linux-tegra-5.10 arch/arm64/configs/defconfig): the nohz_full= list without the boot CPU
  (kernel/time/tick-sched.c: "NO_HZ: Clearing 0 from nohz_full range for timekeeping").
* IRQ affinity as a new boot leaves it: every /proc/irq/N/smp_affinity_list and smp_affinity and
  /proc/irq/default_smp_affinity name every CPU present (Documentation/core-api/irq/
  irq-affinity.rst: "Default mask is 0xffffffff"; kernel/irq/irqdesc.c sets it to all CPUs), or
  the irqaffinity= list.
* The RT throttling budget: /proc/sys/kernel/sched_rt_period_us 1000000 and sched_rt_runtime_us
  950000, the kernel's defaults (kernel/sched/core.c sysctl_sched_rt_period / _runtime;
  Documentation/scheduler/sched-rt-group.rst 2.1; a 4.9-tegra Jetson reads the same,
  OE4T/linux-tegra-4.9 issue 37): a sysctl lives in the kernel, so every boot starts from them.
  Only where the device has the files (on an sshd device: its own, bound over the host's).
"""
import os
import re
import sys

SIM_ROOT = os.environ.get("COLIBRI_SIM_ROOT", "").rstrip("/")
EXTLINUX = "/boot/extlinux/extlinux.conf"
CMDLINE = "/proc/cmdline"
IRQ_DIR = "/proc/irq"
CPU_DIR = "/sys/devices/system/cpu"
PLATFORM_ARGS = "bl_prof_dataptr=2031616@0x471E10000 bl_prof_ro_ptr=65536@0x471E00000"
KEYS = ("TIMEOUT", "DEFAULT", "MENU TITLE", "LABEL", "MENU LABEL", "LINUX", "INITRD", "FDT",
        "OVERLAYS", "APPEND")
MAX_OPTIONS = 10
RT_PERIOD = "/proc/sys/kernel/sched_rt_period_us"
RT_RUNTIME = "/proc/sys/kernel/sched_rt_runtime_us"
RT_DEFAULTS = ((RT_PERIOD, "1000000"), (RT_RUNTIME, "950000"))


def sim(path):
    return SIM_ROOT + path if SIM_ROOT else path


def read(path, default=""):
    try:
        with open(sim(path)) as f:
            return f.read()
    except OSError:
        return default


def write(path, text):
    with open(sim(path), "w") as f:
        f.write(text)


def clean(line):
    return line.split("#", 1)[0].strip(" \t\r\n")


def boot_args(conf):
    """The kernel arguments L4TLauncher passes for ``conf`` (None: no LABEL to boot)."""
    default, options = None, []
    for raw in conf.splitlines():
        line = clean(raw)
        for key in KEYS:
            if not line.startswith(key):
                continue
            value = clean(line[len(key):])
            if key == "DEFAULT":
                default = value
            elif key == "LABEL" and len(options) < MAX_OPTIONS:
                options.append({"label": value, "append": ""})
            elif key == "APPEND" and options:
                at = value.find("${cbootargs}")
                if at >= 0:
                    value = value[:at] + value[at + len("${cbootargs}"):].lstrip(" ")
                options[-1]["append"] = value
            break
    if not options:
        return None
    chosen = next((o for o in options if o["label"] == default), options[0])
    return chosen["append"]


def cpu_list(text):
    out = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:-(\d+))?", part.strip())
        if not m:
            return None
        lo, hi = int(m.group(1)), int(m.group(2) or m.group(1))
        if hi < lo:
            return None
        out.extend(range(lo, hi + 1))
    return out


def list_text(cpus):
    cpus, out, i = sorted(set(cpus)), [], 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else "%d-%d" % (cpus[i], cpus[j]))
        i = j + 1
    return ",".join(out)


def mask_text(cpus, nbits):
    """lib/vsprintf.c bitmap_string ("%*pb"): 32-bit chunks, most significant first, the first
    chunk as wide as its bits need, the others 8 digits."""
    value = sum(1 << c for c in cpus)
    chunks = []
    for low in range(0, max(nbits, 1), 32):
        width = (min(32, nbits - low) + 3) // 4
        chunks.append("%0*x" % (width, (value >> low) & 0xFFFFFFFF))
    return ",".join(reversed(chunks))


def params(cmdline):
    out = {}
    for token in cmdline.split():
        key, eq, value = token.partition("=")
        if eq:
            out[key] = value          # the last occurrence wins, as for these __setup handlers
    return out


def isolated(value, present):
    if value is None:
        return []
    flags = []
    while value[:1].isalpha():
        flag, comma, rest = value.partition(",")
        if not comma or flag not in ("nohz", "domain", "managed_irq"):
            return []                 # "isolcpus: Error, unknown flag": parameter ignored
        flags.append(flag)
        value = rest
    cpus = cpu_list(value)
    if cpus is None or any(c not in present for c in cpus):
        return []
    if flags and "domain" not in flags:
        return []                     # nohz / managed_irq only: no domain isolation
    if set(cpus) >= set(present):
        cpus = [c for c in cpus if c != 0]   # "Housekeeping: must include one present CPU"
    return cpus


def main():
    present = cpu_list(read(CPU_DIR + "/present").strip()) or [0]
    args = boot_args(read(EXTLINUX))
    cmdline = " ".join(x for x in ((args or "").strip(), PLATFORM_ARGS) if x)
    write(CMDLINE, cmdline + "\n")
    p = params(cmdline)
    write(CPU_DIR + "/isolated", list_text(isolated(p.get("isolcpus"), present)) + "\n")
    if os.path.exists(sim(CPU_DIR + "/nohz_full")):
        nohz = [c for c in (cpu_list(p.get("nohz_full", "")) or []) if c in present and c != 0]
        write(CPU_DIR + "/nohz_full", list_text(nohz) + "\n")
    # Every CPU the kernel knows, online or not (nvpmodel may take some offline after boot).
    default = [c for c in (cpu_list(p.get("irqaffinity", "")) or []) if c in present] or present
    nbits = len(present)
    write(IRQ_DIR + "/default_smp_affinity", mask_text(default, nbits) + "\n")
    for entry in sorted(os.listdir(sim(IRQ_DIR)) if os.path.isdir(sim(IRQ_DIR)) else []):
        if entry.isdigit():
            write("%s/%s/smp_affinity_list" % (IRQ_DIR, entry), list_text(default) + "\n")
            write("%s/%s/smp_affinity" % (IRQ_DIR, entry), mask_text(default, nbits) + "\n")
    if SIM_ROOT:                  # in-process: the tree's own files, when it has them
        for path, value in RT_DEFAULTS:
            if os.path.exists(sim(path)):
                write(path, value + "\n")
    elif os.environ.get("COLIBRI_SIM_RT_BOUND") == "1":
        # an sshd device: its os.sh bound the device's own files over /proc/sys first (set -e:
        # it stops before this runs if a bind fails), so this never writes the host's kernel
        for path, value in RT_DEFAULTS:
            write(path, value + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
