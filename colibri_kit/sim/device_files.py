"""Faked Jetson device files for the emulated fleet.

``populate(root, module)`` writes, under ``root``, every file the kit and the Jetson tools read or
write on a real device, at its real path relative to ``/``:

====================================================  =============================================
``etc/nv_tegra_release``                              L4T release line (``# R36 (release), ...``)
``etc/nvpmodel.conf``                                 power models of the module (ID, NAME, caps)
``var/lib/nvpmodel/status``                           nvpmodel's current mode (``pmode:0002``)
``sys/firmware/devicetree/base/{model,compatible}``   NUL-terminated, as ``/proc/device-tree/*``
``sys/devices/system/cpu/{present,possible,online}``  CPU lists; ``cpuN/online``,
                                                      ``cpuN/cpufreq/{scaling_governor,
                                                      scaling_available_governors, scaling_*_freq,
                                                      cpuinfo_{min,max}_freq, ...}``
``sys/class/devfreq/<gpu>`` -> ``sys/devices/...``    GPU devfreq node (JP6 ``17000000.gpu``; JP5
                                                      Xavier ``17000000.gv11b`` under
                                                      ``sys/devices/17000000.gv11b/devfreq/``), plus
                                                      a non-GPU node (``15340000.vic``)
``sys/kernel/debug/bpmp/debug/clk/emc/*``             EMC clock (``rate``, ``min_rate``,
                                                      ``max_rate``, ``mrq_rate_locked``)
``sys/kernel/nvpmodel_emc_cap/emc_iso_cap``           the EMC cap nvpmodel sets
``sys/devices/platform/pwm-fan/hwmon/hwmon0/pwm1``    fan PWM (0-255)
``usr/sbin/nvpmodel``, ``usr/bin/jetson_clocks``      the stand-in tools (python3 scripts)
====================================================  =============================================

How an emulated device sees them. Inside the device's own mount namespace (never the host's),
these real paths must show the tree:

* ``/sys``                        <- ``root/sys`` (bind the whole tree: the class links point
  into ``/sys/devices``, and ``/sys/class/devfreq`` does not exist on a PC to mount onto);
* ``/etc/nv_tegra_release``, ``/etc/nvpmodel.conf`` <- ``root/etc/...``;
* ``/usr/sbin/nvpmodel``, ``/usr/bin/jetson_clocks`` <- ``root/usr/...``;
* ``/var/lib/nvpmodel/`` (writable) <- ``root/var/lib/nvpmodel``.

The files do not exist on the host, so file binds have nothing to mount onto: overlays provide
the paths. ``colibri_kit.sim.fleet`` layers ``root/etc``, ``root/usr``, ``root/var`` as writable
upper layers over ``/etc``, ``/usr``, ``/var``. ``enter`` (``python3 -m
colibri_kit.sim.enter ROOT -- CMD`` under ``unshare -m --propagation private``) does
it for one command (``MOUNTS``): a writable bind of ``root/sys``, read-only overlays of
``root/etc``, ``root/usr/bin``, ``root/usr/sbin``, ``root/var/lib``, then a writable bind of
``root/var/lib/nvpmodel`` (mounts that were under a covered directory, e.g. ``/etc/hosts`` in a
container, are put back on top).

The stand-ins then work on the real paths. Outside a namespace, set ``COLIBRI_SIM_ROOT=root`` and
they use ``root/<real path>`` instead (the tests do that).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from colibri_kit.sim import _devlib
from colibri_kit.sim.modules import Module, module as get_module

HERE = Path(__file__).resolve().parent
_ROOT_LOCK = threading.Lock()

# (path relative to the device root, what it is): what ``enter`` puts in place, in order.
MOUNTS: tuple[tuple[str, str], ...] = (
    ("sys", "bind"),
    ("etc", "overlay-ro"),
    ("usr/bin", "overlay-ro"),
    ("usr/sbin", "overlay-ro"),
    ("var/lib", "overlay-ro"),
    ("var/lib/nvpmodel", "bind"),
)

TOOLS = {"usr/sbin/nvpmodel": "nvpmodel.py", "usr/bin/jetson_clocks": "jetson_clocks.py"}
VIC_NODE = "15340000.vic"


def tool_script(source_name: str) -> str:
    """A stand-in as installed on a device: _devlib inlined, nothing imported from the kit."""
    lib = (HERE / "_devlib.py").read_text()
    tool = (HERE / source_name).read_text()
    body = "\n".join(line for line in tool.splitlines()
                     if not line.startswith("from colibri_kit.sim._devlib import"))
    return "#!/usr/bin/env python3\n" + lib + "\n" + body + "\n"


def nvpmodel_conf(mod: Module) -> str:
    out = [f"# nvpmodel.conf for the emulated {mod.model} ({mod.key}, colibri-kit simulator)",
           "# Power models as on the module: the id differs between modules, the name is stable.",
           ""]
    for m in mod.modes:
        out.append(f"< POWER_MODEL ID={m.id} NAME={m.name} >")
        out += [f"CPU_ONLINE CORE_{c} {1 if c < m.cores else 0}" for c in range(mod.cpus)]
        out.append(f"CPU MAX_FREQ {m.cpu_max_khz}")
        out.append(f"GPU MAX_FREQ {m.gpu_max_hz}")
        out.append(f"EMC MAX_FREQ {m.emc_max_hz}")
        out.append(f"TPC_POWER_GATING TPC_PG_MASK {m.tpc_mask}")
        out.append("")
    out.append(f"< PM_CONFIG DEFAULT={mod.default_mode} >")
    return "\n".join(out) + "\n"


def _write(path: Path, text: str | bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)
    # Root writes the kernel's read-only files (the stand-ins do, as the kernel would); a tree
    # made by another user for in-process tests (LocalRemote) keeps them writable by its owner.
    os.chmod(path, mode if os.geteuid() == 0 else mode | 0o200)


@contextmanager
def _sim_root(root: Path) -> Iterator[None]:
    """Point the shared tool core at ``root`` for the duration (one populate at a time)."""
    with _ROOT_LOCK:
        saved = _devlib.SIM_ROOT
        _devlib.SIM_ROOT = str(root)
        try:
            yield
        finally:
            _devlib.SIM_ROOT = saved


def populate(root: Path, module: str) -> None:
    """Write the faked files of one emulated ``module`` ("orin-nx", "orin-nano", "agx-orin",
    "xavier-nx", "agx-thor") under ``root``, in the state the module boots in (default power
    mode applied by nvpmodel, default governors, fan idle)."""
    mod = get_module(module)
    root = Path(root)
    _write(root / "etc/nv_tegra_release",
           f"# {mod.release} (release), REVISION: {mod.revision}, GCID: 38968081, BOARD: generic, "
           f"EABI: aarch64, DATE: Tue Jan  7 17:11:37 UTC 2025\n"
           f"# KERNEL_VARIANT: oot\nTARGET_USERSPACE_LIB_DIR=nvidia\n"
           f"TARGET_USERSPACE_LIB_DIR_PATH=usr/lib/aarch64-linux-gnu/nvidia\n")
    _write(root / "etc/nvpmodel.conf", nvpmodel_conf(mod))
    _write(root / "var/lib/nvpmodel/status", f"pmode:{mod.default_mode:04d}\n")
    dt = root / "sys/firmware/devicetree/base"
    _write(dt / "model", (mod.model + "\0").encode())
    _write(dt / "compatible", "".join(c + "\0" for c in mod.compatible).encode())

    cpu_dir = root / "sys/devices/system/cpu"
    every = f"0-{mod.cpus - 1}"
    for name in ("present", "possible", "online"):
        _write(cpu_dir / name, every + "\n")
    for c in range(mod.cpus):
        _write(cpu_dir / f"cpu{c}/online", "1\n")
        fq = cpu_dir / f"cpu{c}/cpufreq"
        # The kernel prints the governor list with a trailing space; keep that quirk.
        _write(fq / "scaling_available_governors", " ".join(mod.cpu_governors) + " \n", 0o444)
        _write(fq / "scaling_available_frequencies",
               " ".join(str(f) for f in mod.cpu_khz) + " \n", 0o444)
        _write(fq / "scaling_governor", mod.cpu_default_governor + "\n")
        _write(fq / "scaling_driver", "tegra194\n" if mod.soc == "tegra194" else "cppc_cpufreq\n",
               0o444)
        _write(fq / "cpuinfo_max_freq", f"{mod.cpu_khz[-1]}\n", 0o444)
        _write(fq / "cpuinfo_min_freq", f"{mod.cpu_khz[0]}\n", 0o444)
        for name in ("scaling_max_freq", "scaling_min_freq"):
            _write(fq / name, f"{mod.cpu_khz[0]}\n")
        _write(fq / "scaling_cur_freq", f"{mod.cpu_khz[0]}\n", 0o444)

    gpu = root / "sys" / mod.gpu_dir
    _write(gpu / "available_governors", " ".join(mod.gpu_governors) + "\n", 0o444)
    _write(gpu / "available_frequencies", " ".join(str(f) for f in mod.gpu_hz) + "\n", 0o444)
    _write(gpu / "governor", mod.gpu_default_governor + "\n")
    for name in ("max_freq", "min_freq", "cur_freq"):
        _write(gpu / name, f"{mod.gpu_hz[0]}\n", 0o444 if name == "cur_freq" else 0o644)
    vic = root / "sys/devices/platform/bus@0" / VIC_NODE / "devfreq" / VIC_NODE
    _write(vic / "governor", "nvhost_podgov\n")
    _write(vic / "available_governors", " ".join(mod.gpu_governors) + "\n", 0o444)
    _write(vic / "cur_freq", "115200000\n", 0o444)
    cls = root / "sys/class/devfreq"
    cls.mkdir(parents=True, exist_ok=True)
    for node, target in ((mod.gpu_node, gpu), (VIC_NODE, vic)):
        link = cls / node
        if link.is_symlink():
            link.unlink()
        link.symlink_to(os.path.relpath(target, cls))

    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    _write(emc / "min_rate", f"{mod.emc_hz[0]}\n")
    _write(emc / "max_rate", f"{mod.emc_hz[1]}\n")
    _write(emc / "rate", f"{mod.emc_hz[0]}\n")
    _write(emc / "mrq_rate_locked", "0\n")
    _write(root / "sys/kernel/nvpmodel_emc_cap/emc_iso_cap", "0\n")
    fan = root / "sys/devices/platform/pwm-fan/hwmon/hwmon0"
    _write(fan / "name", "pwmfan\n", 0o444)
    _write(fan / "pwm1", "64\n")

    for rel, source in TOOLS.items():
        _write(root / rel, tool_script(source), 0o755)

    # Boot: nvpmodel applies the default mode (online CPUs, caps), the kernel settles clocks.
    with _sim_root(root):
        modes, default = _devlib.load_conf()
        _devlib.apply_mode(default, modes[default])


def mount_plan(root: Path) -> list[tuple[str, Path, str]]:
    """[(kind, source under root, real path)] in the order ``enter`` mounts them."""
    root = Path(root)
    return [(kind, root / rel, Path("/" + rel)) for rel, kind in MOUNTS]
