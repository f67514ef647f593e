"""CPU and GPU governors: the sysfs paths (pure), and the one function that writes them.

Everything the kit writes to sysfs goes through ``write_governor``: the path must match one of
the fixed patterns below (paths are discovered on the device, then checked), the value must be a
governor name ``[a-z0-9_]+`` that the device lists as available for that path, and root writes it
with ``tee`` (argv only, the value on standard input): no value ever reaches a shell.
"""

from __future__ import annotations

import re

from colibri_kit.errors import FleetError
from colibri_kit.fleet.remote import Remote

CPU_DIR = "/sys/devices/system/cpu"
DEVFREQ_DIR = "/sys/class/devfreq"
CMD_TIMEOUT = 30.0

# Every pattern is used with fullmatch.
GOVERNOR_RE = re.compile(r"[a-z0-9_]{1,32}")
CPU_LIST_RE = re.compile(r"[0-9]{1,4}(?:-[0-9]{1,4})?(?:,[0-9]{1,4}(?:-[0-9]{1,4})?)*")
DEVFREQ_NODE_RE = re.compile(r"[A-Za-z0-9@._-]{1,64}")   # any node name we may read under
CPU_GOV_PATH_RE = re.compile(r"/sys/devices/system/cpu/cpu[0-9]{1,4}/cpufreq/scaling_governor")
GPU_GOV_PATH_RE = re.compile(r"/sys/class/devfreq/[A-Za-z0-9@._-]{1,64}/governor")


def parse_cpu_list(text: str) -> list[int]:
    """A kernel CPU list ("0-3,6") -> [0, 1, 2, 3, 6]."""
    text = text.strip()
    if not CPU_LIST_RE.fullmatch(text):
        raise FleetError(f"unexpected CPU list {text!r}")
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def cpu_path(cpu: int, name: str) -> str:
    return f"{CPU_DIR}/cpu{cpu}/cpufreq/{name}"


def gpu_path(node: str, name: str) -> str:
    return f"{DEVFREQ_DIR}/{node}/{name}"


def refusal(paths: list[str], value: str, allowed: dict[str, list[str]]) -> str | None:
    """Why writing ``value`` to ``paths`` is refused (None: allowed)."""
    if not GOVERNOR_RE.fullmatch(value):
        return f"refusing to write {value!r}: not a governor name"
    for path in paths:
        if not (CPU_GOV_PATH_RE.fullmatch(path) or GPU_GOV_PATH_RE.fullmatch(path)):
            return f"refusing to write {path!r}: not a governor path"
        if value not in allowed.get(path, []):
            return (f"refusing to write {value!r} to {path}: not one of "
                    f"{' '.join(allowed.get(path, [])) or 'nothing listed'}")
    return None


def write_governor(remote: Remote, paths: list[str], value: str,
                   allowed: dict[str, list[str]]) -> None:
    """The one way the kit writes sysfs (``allowed``: path -> the governors the device lists for
    it). Root writes with ``tee PATH...``, the value on standard input: argv only, no shell, no
    file in between, one round trip whatever the CPU count."""
    if not paths:
        return
    why = refusal(paths, value, allowed)
    if why:
        raise FleetError(f"{remote.name}: {why}")
    remote.run(["tee", "--", *paths], sudo=True, timeout=CMD_TIMEOUT,
               input=(value + "\n").encode())
