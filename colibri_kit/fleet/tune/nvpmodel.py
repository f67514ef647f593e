"""The power mode: nvpmodel's output (pure parsers), switching, and the reboot a switch may need.

NVIDIA's rule (docs/jetson-facts.md, "Reboot rule"): a switch needs a reboot exactly when the
target mode's ``TPC_PG_MASK`` differs from the mask the GPU runs (``LIVE_TPC_MASK``, set at boot).
nvpmodel then prints ``NVPM WARN: Reboot required for changing to this power mode: N`` and
``DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:``; without an answer (standard input
closed, as the kit always runs it) it changes nothing. So asking nvpmodel is safe, and its answer
is the device's own: ``switch`` reports it, whatever a plan predicted.

A reboot is confirmed by the kernel's ``boot_id`` (``/proc/sys/kernel/random/boot_id``, a new
random UUID at every boot), not by the device answering again.
"""

from __future__ import annotations

import re
from enum import Enum

from colibri_kit.errors import FleetError
from colibri_kit.fleet.remote import Remote, Result

LIVE_TPC_MASK = "/sys/devices/platform/gpu.0/tpc_pg_mask"   # what the GPU runs (set at boot)
BOOT_ID = "/proc/sys/kernel/random/boot_id"
CMD_TIMEOUT = 30.0     # seconds for any one tool invocation
MODE_TIMEOUT = 90.0    # nvpmodel -m can take a while (clocks, CPU hotplug)

MODE_NAME_RE = re.compile(r"[A-Za-z0-9_]{1,48}")               # fullmatch
POWER_MODEL_RE = re.compile(r"POWER_MODEL:\s*ID=([0-9]+)\s+NAME=(\S+)")
QUERY_RE = re.compile(r"NV Power Mode:\s*(\S+)")                # fullmatch, on one line
REBOOT_RE = re.compile(r"reboot required|do you want to reboot", re.IGNORECASE)
BOOT_ID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


# --------------------------------------------------------------------------- pure parsers


def parse_power_models(text: str) -> dict[str, int]:
    """``nvpmodel -p --verbose`` output -> {name: id}."""
    return {m.group(2): int(m.group(1)) for m in POWER_MODEL_RE.finditer(text)}


def parse_query(text: str) -> tuple[str | None, int | None]:
    """``nvpmodel -q``: "NV Power Mode: NAME" then the id on the next line."""
    name = None
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        m = QUERY_RE.fullmatch(line)
        if m:
            name = m.group(1)
            if i + 1 < len(lines) and lines[i + 1].isdigit():
                return name, int(lines[i + 1])
    return name, None


def asks_for_reboot(output: str) -> bool:
    """nvpmodel's own answer: did it say the switch needs a reboot?"""
    return bool(REBOOT_RE.search(output))


def parse_boot_id(text: str | None) -> str | None:
    value = (text or "").strip()
    return value if BOOT_ID_RE.fullmatch(value) else None


# --------------------------------------------------------------------------- control


def run_nvpmodel(remote: Remote, args: list[str], *, sudo: bool,
                 timeout: float = CMD_TIMEOUT) -> Result:
    """nvpmodel lives in /usr/sbin, which a plain login's PATH may lack (sudo's secure_path has
    it): fall back to the full path when the name is not found."""
    res = remote.run(["nvpmodel", *args], sudo=sudo, timeout=timeout, check=False)
    if res.exit_code == 127:
        res = remote.run(["/usr/sbin/nvpmodel", *args], sudo=sudo, timeout=timeout, check=False)
    return res


def read_boot_id(remote: Remote) -> str | None:
    """This boot's id (None when the device does not say: then a reboot cannot be confirmed)."""
    return parse_boot_id(remote.read_text(BOOT_ID))


class Answer(Enum):
    SWITCHED = "switched"            # nvpmodel switched without asking for a reboot
    ASKS_REBOOT = "asks for reboot"  # nvpmodel wants a reboot; nothing changed
    REBOOTING = "rebooting"          # confirmed: nvpmodel recorded the mode and reboots


def switch(remote: Remote, mode_id: int, *, confirm: bool) -> tuple[Answer, str]:
    """``nvpmodel -m ID`` with standard input closed: the device's answer (and a note). With
    ``confirm``, a reboot question is answered ``YES``: the device records the mode and reboots
    (the connection may drop on the way: that is an answer too)."""
    mode_id = int(mode_id)
    res = remote.run(["nvpmodel", "-m", str(mode_id)], sudo=True, timeout=MODE_TIMEOUT,
                     check=False)
    said = res.stdout + res.stderr
    if not asks_for_reboot(said):
        if res.exit_code == 0:
            return Answer.SWITCHED, f"power mode {mode_id}: switched live"
        raise FleetError(f"{remote.name}: nvpmodel -m {mode_id} failed ({res.exit_code}): "
                         f"{said.strip()}")
    if not confirm:
        return Answer.ASKS_REBOOT, f"power mode {mode_id}: nvpmodel asks for a reboot"
    # Answer the tool's own prompt. The script is a constant; the id is a positional parameter
    # (an integer), never part of the script text.
    try:
        res = remote.run(["sh", "-c", 'echo YES | exec nvpmodel -m "$1"', "sh", str(mode_id)],
                         sudo=True, timeout=MODE_TIMEOUT, check=False)
    except FleetError as exc:  # a real device drops the connection as it goes down
        return Answer.REBOOTING, f"power mode {mode_id}: switched, the device is rebooting ({exc})"
    if res.exit_code == 0:
        return Answer.REBOOTING, f"power mode {mode_id}: switched, the device reboots into it"
    if "NVPM ERROR" not in res.stdout + res.stderr:
        # The session went down with the device before its exit status came (exit -1 over
        # SSH): the answer was taken; whether it really rebooted, the new boot_id tells.
        return Answer.REBOOTING, (f"power mode {mode_id}: switched, the device went down "
                                  f"(exit {res.exit_code})")
    raise FleetError(f"{remote.name}: nvpmodel -m {mode_id} failed ({res.exit_code}): "
                     f"{(res.stderr or res.stdout).strip()}")


def reboot(remote: Remote, why: str) -> str:
    """Reboot the device (its own ``reboot``); a dropped connection is the expected answer."""
    try:
        remote.run(["reboot"], sudo=True, timeout=CMD_TIMEOUT, check=False)
    except FleetError as exc:
        return f"{why}: rebooting ({exc})"
    return f"{why}: rebooting"
