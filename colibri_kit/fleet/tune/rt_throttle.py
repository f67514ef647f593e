"""The kernel's real-time bandwidth limit ("RT throttling"): read it, lift or bound it for a
profile's ``realtime.rt_runtime_us``, and put it back (pure parsers apart from the code that
acts, as the other tune steps).

The files and their rules (the kernel's Documentation/scheduler/sched-rt-group.rst, 2.1
"System wide settings"; kernel/sched/rt.c sched_rt_handler and sched_rt_global_validate):

* ``/proc/sys/kernel/sched_rt_period_us``: the period the budget is refilled in, microseconds,
  1..INT_MAX, default 1000000 (1 s);
* ``/proc/sys/kernel/sched_rt_runtime_us``: how much of each period all SCHED_FIFO/SCHED_RR
  threads of a CPU may run, -1..INT_MAX, default 950000 (0.95 s): an RT thread that runs longer
  without a break is stopped for the rest of the period (50 ms of every second by default).
  ``-1`` means no limit ("runtime == period"). A value above the period is refused (EINVAL).
* With CONFIG_RT_GROUP_SCHED, a value below what the cgroups were given is refused too (EINVAL):
  a Jetson user saw exactly that on a 4.9-tegra kernel with the defaults 1000000 / 950000
  (OE4T/linux-tegra-4.9 issue 37, "When I set sched_rt_runtime_us smaller than 950000, it failed
  with Invalid argument"); the kit only ever raises the budget, and reports what ``tee`` says.
* The values live in the kernel, not in a file: every boot starts from the defaults unless a
  sysctl.d file sets them (the kit writes none), so, like IRQ affinity, the step is live and a
  reboot undoes it (``rollout`` applies it again after a reboot it made, with the IRQs).

Safety: ``-1`` lets a runaway real-time thread (a spin that never ends) hold its CPU forever,
with nothing of lower priority (the ssh session that would kill it included) running there.
Sources that tune real-time Linux disagree on it (the ROS real-time image writes -1 at boot,
ros-realtime/ros-realtime-rpi4-image #28 / #56; RDK's Dobby removed its -1 as dangerous,
rdkcentral/Dobby #272 / #288). The profile therefore says which: ``-1`` (no limit) or a bounded
budget in microseconds, e.g. 990000 (10 ms of every second kept for the rest); docs/runtime.md
("Real-time mode") has the measurement that chose the value of the shipped profile.

Only ``write_runtime`` writes, and only to ``RUNTIME_PATH``, a value ``runtime_refusal`` allowed,
on standard input (``tee``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from colibri_kit.errors import FleetError
from colibri_kit.fleet.remote import Remote
from colibri_kit.fleet.tune.state import read_files

PERIOD_PATH = "/proc/sys/kernel/sched_rt_period_us"
RUNTIME_PATH = "/proc/sys/kernel/sched_rt_runtime_us"
DEFAULT_PERIOD_US = 1000000      # kernel/sched/core.c sysctl_sched_rt_period
DEFAULT_RUNTIME_US = 950000      # kernel/sched/core.c sysctl_sched_rt_runtime
INT_MAX = 2**31 - 1
UNLIMITED = -1
CMD_TIMEOUT = 30.0

_VALUE_RE = re.compile(r"-1|0|[1-9][0-9]{0,9}")      # used with fullmatch only
_TEE_ERROR_RE = re.compile(r"^tee: (?:/proc/sys/kernel/sched_rt_runtime_us): (.+)$", re.M)


# --------------------------------------------------------------------------- pure


@dataclass(frozen=True)
class RtBandwidth:
    """The two files as read: microseconds (runtime -1: no limit)."""

    period_us: int
    runtime_us: int

    @property
    def unlimited(self) -> bool:
        return self.runtime_us == UNLIMITED

    def text(self) -> str:
        return runtime_text(self.runtime_us, self.period_us)


def parse_value(text: str, what: str, lo: int) -> int:
    """One of the files' contents: a decimal integer lo..INT_MAX and a newline."""
    t = text.strip()
    if not _VALUE_RE.fullmatch(t) or not lo <= int(t) <= INT_MAX:
        raise FleetError(f"{what}: unexpected value {text!r} (want an integer {lo}..{INT_MAX})")
    return int(t)


def parse_bandwidth(period: str, runtime: str) -> RtBandwidth:
    return RtBandwidth(parse_value(period, PERIOD_PATH, 1),
                       parse_value(runtime, RUNTIME_PATH, UNLIMITED))


def runtime_text(runtime_us: int, period_us: int) -> str:
    """How the budget reads in a plan line: "950000 of 1000000 us (RT threads stopped 50 ms of
    every 1000 ms)" or "-1 (no limit)"."""
    if runtime_us == UNLIMITED:
        return "-1 (no limit)"
    idle_ms = max(period_us - runtime_us, 0) / 1000
    return (f"{runtime_us} of {period_us} us (RT threads stopped {idle_ms:g} ms of every "
            f"{period_us / 1000:g} ms)")


def runtime_refusal(value: int, period_us: int) -> str | None:
    """Why the kit will not write ``value`` as sched_rt_runtime_us under ``period_us`` (None:
    it will). 0 would stop every real-time thread; above the period the kernel says EINVAL."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"refusing to write {value!r}: not an integer"
    if value == UNLIMITED:
        return None
    if value <= 0:
        return (f"refusing to write {value}: 0 or less (but -1) would stop every real-time "
                f"thread")
    if value > period_us:
        return (f"refusing to write {value}: more than sched_rt_period_us {period_us} (the "
                f"kernel refuses it; -1 is no limit)")
    return None


@dataclass(frozen=True)
class ThrottlePlan:
    before: RtBandwidth
    want: int            # the runtime to write (us, or -1)

    @property
    def change(self) -> bool:
        return self.before.runtime_us != self.want


def plan_runtime(now: RtBandwidth, want: int) -> ThrottlePlan:
    """The step for ``realtime.rt_runtime_us`` = ``want`` on a device that reads ``now``
    (raises FleetError with the reason when the value cannot be written there)."""
    why = runtime_refusal(want, now.period_us)
    if why:
        raise FleetError(f"realtime.rt_runtime_us: {why}")
    return ThrottlePlan(now, want)


def throttle_record(now: RtBandwidth) -> dict[str, Any]:
    """What restore puts back."""
    return {"period_us": now.period_us, "runtime_us": now.runtime_us}


def saved_runtime(saved: Any) -> int:
    """The recorded runtime (raises FleetError when the record is not one the kit wrote)."""
    if not isinstance(saved, dict):
        raise FleetError("the saved RT throttling record is corrupt")
    value = saved.get("runtime_us")
    if isinstance(value, bool) or not isinstance(value, int) or \
            not UNLIMITED <= value <= INT_MAX:
        raise FleetError(f"the saved RT throttling record is corrupt (runtime_us {value!r})")
    return value


def tee_failure(stderr: str) -> str | None:
    m = _TEE_ERROR_RE.search(stderr)
    return m.group(1).strip() if m else None


# --------------------------------------------------------------------------- device


def read_bandwidth(remote: Remote) -> RtBandwidth:
    """Both files in one round trip."""
    values = read_files(remote, [PERIOD_PATH, RUNTIME_PATH], sudo=True)
    missing = [p for p in (PERIOD_PATH, RUNTIME_PATH) if p not in values]
    if missing:
        raise FleetError(f"{remote.name}: {', '.join(missing)} missing (a kernel without "
                         f"CONFIG_RT_GROUP_SCHED still has them: is /proc mounted?)")
    try:
        return parse_bandwidth(values[PERIOD_PATH], values[RUNTIME_PATH])
    except FleetError as exc:
        raise FleetError(f"{remote.name}: {exc}") from None


def write_runtime(remote: Remote, value: int, period_us: int) -> None:
    """The one writer: root ``tee``s ``value`` into RUNTIME_PATH (argv only, the value on
    standard input), after ``runtime_refusal``. The kernel's own refusal (EINVAL: above the
    period, or below the RT cgroups' share) is raised with what it said."""
    why = runtime_refusal(value, period_us)
    if why:
        raise FleetError(f"{remote.name}: {why}")
    res = remote.run(["tee", "--", RUNTIME_PATH], sudo=True, timeout=CMD_TIMEOUT, check=False,
                     input=f"{value}\n".encode())
    if res.exit_code != 0:
        said = tee_failure(res.stderr) or res.stderr.strip() or f"exit {res.exit_code}"
        raise FleetError(f"{remote.name}: writing {value} to {RUNTIME_PATH} failed: {said} (the "
                         f"kernel refuses a value above sched_rt_period_us, and with "
                         f"CONFIG_RT_GROUP_SCHED one below the RT cgroups' cpu.rt_runtime_us)")


def apply(remote: Remote, plan: ThrottlePlan) -> None:
    if plan.change:
        write_runtime(remote, plan.want, plan.before.period_us)


def restore(remote: Remote, saved: Any) -> list[str]:
    """Put the recorded runtime back (a reboot did already, when the value reads it). Notes."""
    want = saved_runtime(saved)
    now = read_bandwidth(remote)
    if now.runtime_us == want:
        return []
    write_runtime(remote, want, now.period_us)
    return [f"RT throttling back to {runtime_text(want, now.period_us)}"]
