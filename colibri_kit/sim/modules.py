"""What each emulated Jetson module looks like: identity, CPUs, clocks and power-mode tables.

Numbers follow the modules' public documentation where it is known (mode names and ids, CPU
count, SoC, L4T) and are plausible otherwise (exact frequency steps). The tables feed
``device_files.populate`` and the ``nvpmodel.conf`` it writes; the stand-in tools read only the
faked files, never this module, just as the real tools read only the device.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PowerMode:
    id: int
    name: str
    cores: int            # CPUs online in this mode (cpu0..cores-1)
    cpu_max_khz: int
    gpu_max_hz: int
    emc_max_hz: int
    tpc_mask: int = 0     # GPU TPC power-gating mask: changing it needs a reboot (nvpmodel asks)


@dataclass(frozen=True)
class Module:
    key: str
    model: str                    # /proc/device-tree/model
    compatible: tuple[str, ...]   # /proc/device-tree/compatible, most specific first
    soc: str
    release: str                  # "R36"
    revision: str                 # "4.3"
    cpus: int
    cpu_khz: tuple[int, ...]      # available CPU frequencies, ascending
    gpu_node: str                 # devfreq node name, e.g. 17000000.gpu
    gpu_dir: str                  # the node's device directory, relative to /sys
    gpu_hz: tuple[int, ...]       # available GPU frequencies, ascending
    emc_hz: tuple[int, int]       # (min, max) memory clock
    modes: tuple[PowerMode, ...]
    default_mode: int
    cpu_governors: tuple[str, ...] = (
        "conservative", "ondemand", "userspace", "powersave", "performance", "schedutil")
    cpu_default_governor: str = "schedutil"
    gpu_governors: tuple[str, ...] = (
        "wmark_active", "nvhost_podgov", "userspace", "performance", "simple_ondemand")
    gpu_default_governor: str = "nvhost_podgov"

    def mode(self, mode_id: int) -> PowerMode:
        for m in self.modes:
            if m.id == mode_id:
                return m
        raise KeyError(mode_id)


_ORIN_CPU = (115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600, 806400,
             883200, 960000, 1036800, 1113600, 1190400, 1267200, 1344000, 1420800, 1497600,
             1574400, 1651200, 1728000, 1804800, 1881600, 1958400, 1984000, 2035200, 2112000,
             2188800, 2201600)
_ORIN_GPU = (306000000, 408000000, 510000000, 612000000, 714000000, 816000000, 918000000,
             1020000000, 1122000000, 1224000000, 1300500000)
_ORIN_GPU_PATH = "devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"


def _upto(freqs: tuple[int, ...], top: int) -> tuple[int, ...]:
    return tuple(f for f in freqs if f <= top)


MODULES: dict[str, Module] = {
    "orin-nx": Module(
        key="orin-nx",
        model="NVIDIA Jetson Orin NX Engineering Reference Developer Kit",
        compatible=("nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000", "nvidia,tegra234"),
        soc="tegra234", release="R36", revision="4.3", cpus=8,
        cpu_khz=_upto(_ORIN_CPU, 1984000),
        gpu_node="17000000.gpu", gpu_dir=_ORIN_GPU_PATH, gpu_hz=_upto(_ORIN_GPU, 918000000),
        emc_hz=(204000000, 3199000000),
        modes=(
            PowerMode(0, "MAXN", 8, 1984000, 918000000, 0),
            PowerMode(1, "10W", 4, 1190400, 612000000, 2133000000, tpc_mask=1),
            PowerMode(2, "15W", 4, 1497600, 714000000, 3199000000),
            PowerMode(3, "25W", 8, 1497600, 918000000, 3199000000),
        ),
        default_mode=2,
    ),
    "orin-nano": Module(
        key="orin-nano",
        model="NVIDIA Jetson Orin Nano Engineering Reference Developer Kit",
        compatible=("nvidia,p3768-0000+p3767-0003", "nvidia,p3767-0003", "nvidia,tegra234"),
        soc="tegra234", release="R36", revision="4.3", cpus=6,
        cpu_khz=_upto(_ORIN_CPU, 1497600),
        gpu_node="17000000.gpu", gpu_dir=_ORIN_GPU_PATH, gpu_hz=_upto(_ORIN_GPU, 714000000),
        emc_hz=(204000000, 2133000000),
        modes=(
            PowerMode(0, "15W", 6, 1497600, 612000000, 0),
            PowerMode(1, "7W", 4, 960000, 408000000, 2133000000, tpc_mask=1),
        ),
        default_mode=0,
    ),
    "agx-orin": Module(
        key="agx-orin",
        model="NVIDIA Jetson AGX Orin Developer Kit",
        compatible=("nvidia,p3737-0000+p3701-0005", "nvidia,p3701-0005", "nvidia,tegra234"),
        soc="tegra234", release="R36", revision="4.3", cpus=12,
        cpu_khz=_ORIN_CPU,
        gpu_node="17000000.gpu", gpu_dir=_ORIN_GPU_PATH, gpu_hz=_ORIN_GPU,
        emc_hz=(204000000, 3199000000),
        modes=(
            PowerMode(0, "MAXN", 12, 2201600, 1300500000, 0),
            PowerMode(1, "15W", 4, 1113600, 408000000, 2133000000, tpc_mask=1),
            PowerMode(2, "30W", 8, 1728000, 612000000, 3199000000),
            PowerMode(3, "50W", 12, 1497600, 816000000, 3199000000),
        ),
        default_mode=2,
    ),
    "xavier-nx": Module(
        key="xavier-nx",
        model="NVIDIA Jetson Xavier NX Developer Kit",
        compatible=("nvidia,p3509-0000+p3668-0001", "nvidia,tegra194"),
        soc="tegra194", release="R35", revision="5.0", cpus=6,
        cpu_khz=(115200, 192000, 268800, 345600, 422400, 499200, 576000, 652800, 729600,
                 806400, 883200, 960000, 1036800, 1113600, 1190400, 1267200, 1344000,
                 1420800, 1497600, 1574400, 1651200, 1728000, 1804800, 1881600, 1907200),
        # JetPack 5 names the Xavier GPU node after its device, under /sys/devices directly.
        gpu_node="17000000.gv11b", gpu_dir="devices/17000000.gv11b/devfreq/17000000.gv11b",
        gpu_hz=(114750000, 204000000, 306000000, 408000000, 510000000, 599250000, 701250000,
                752250000, 803250000, 854250000, 905250000, 956250000, 1007250000, 1058250000,
                1109250000),
        emc_hz=(204000000, 1866000000),
        modes=(
            PowerMode(0, "MODE_15W_2CORE", 2, 1907200, 1109250000, 1600000000),
            PowerMode(1, "MODE_15W_4CORE", 4, 1420800, 1109250000, 1600000000),
            PowerMode(2, "MODE_15W_6CORE", 6, 1420800, 1109250000, 1600000000),
            PowerMode(3, "MODE_10W_2CORE", 2, 1497600, 803250000, 1600000000),
            PowerMode(4, "MODE_10W_4CORE", 4, 1190400, 803250000, 1600000000),
            PowerMode(5, "MODE_10W_DESKTOP", 4, 1190400, 599250000, 1600000000),
            PowerMode(6, "MODE_20W_2CORE", 2, 1907200, 1109250000, 0),
            PowerMode(7, "MODE_20W_4CORE", 4, 1497600, 1109250000, 0),
            PowerMode(8, "MODE_20W_6CORE", 6, 1420800, 1109250000, 0),
        ),
        default_mode=2,
        cpu_governors=("interactive", "conservative", "ondemand", "userspace", "powersave",
                       "performance", "schedutil"),
    ),
    "agx-thor": Module(
        key="agx-thor",
        model="NVIDIA Jetson AGX Thor Developer Kit",
        compatible=("nvidia,p3971-0000+p3834-0008", "nvidia,p3834-0008", "nvidia,tegra264"),
        soc="tegra264", release="R38", revision="2.0", cpus=14,
        cpu_khz=(972000, 1188000, 1404000, 1620000, 1836000, 2052000, 2268000, 2484000,
                 2601000),
        gpu_node="gpu-gpc-0", gpu_dir="devices/platform/bus@0/d0b0000000.gpu/devfreq/gpu-gpc-0",
        gpu_hz=(675000000, 918000000, 1161000000, 1404000000, 1575000000),
        emc_hz=(800000000, 4266000000),
        modes=(
            PowerMode(0, "MAXN", 14, 2601000, 1575000000, 0),
            PowerMode(1, "120W", 14, 2601000, 1575000000, 4266000000),
            PowerMode(2, "90W", 12, 2268000, 1161000000, 4266000000),
            PowerMode(3, "70W", 10, 2052000, 1161000000, 4266000000),
            PowerMode(4, "40W", 8, 1620000, 918000000, 3200000000, tpc_mask=1),
        ),
        default_mode=1,
    ),
}


def module(key: str) -> Module:
    try:
        return MODULES[key]
    except KeyError:
        raise ValueError(f"unknown emulated module {key!r} (known: {', '.join(MODULES)})") from None
