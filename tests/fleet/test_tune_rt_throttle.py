"""`invoke tune`'s RT throttling step (a profile's ``realtime.rt_runtime_us``): the parsers and the
guard (pure), and the step on emulated Jetsons in-process (LocalRemote): planned without a change,
applied live, verified, applied again after the reboot a power-mode switch takes (the kernel's
defaults come back at every boot), and restored byte for byte. The emulated files are the kernel's
/proc/sys/kernel/sched_rt_{period,runtime}_us with its defaults 1000000 / 950000
(Documentation/scheduler/sched-rt-group.rst 2.1; a 4.9-tegra Jetson reads the same,
OE4T/linux-tegra-4.9 issue 37); tests/fleet/test_tune.py's sshd devices bind them over /proc/sys.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fleet_support import Recording

from colibri_kit.errors import FleetError
from colibri_kit.fleet import tune as tunelib
from colibri_kit.fleet.fleet import Fleet
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.remote import Result
from colibri_kit.fleet.tune import rt_throttle
from colibri_kit.profiles import RealtimeSpec, TuneSpec
from colibri_kit.sim.local import LocalRemote, local_device

LIVE = TuneSpec(nvpmodel_mode="10W", jetson_clocks=True, cpu_governor="performance",
                gpu_governor="performance")          # 15W -> 10W: a live switch on an Orin NX
MAXN = dataclasses.replace(LIVE, nvpmodel_mode="MAXN")   # 15W -> MAXN: needs a reboot
RT = RealtimeSpec(cpus=(2, 3), policy="fifo", priority=50, rt_runtime_us=990000)
RUNTIME, PERIOD = rt_throttle.RUNTIME_PATH, rt_throttle.PERIOD_PATH


@pytest.fixture
def nx(tmp_path: Path) -> LocalRemote:
    return local_device(tmp_path / "nx", "orin-nx", name="nx")


def proc_tree(dev: LocalRemote) -> dict[str, str]:
    """Every faked /proc file (the RT files, IRQs, cmdline), except the new boot's id."""
    return {str(p.relative_to(dev.root)): p.read_text()
            for p in sorted((dev.root / "proc").rglob("*"))
            if p.is_file() and not p.is_symlink() and p.name != "boot_id"}


# --------------------------------------------------------------------------- pure


def test_values_parse_strictly() -> None:
    assert rt_throttle.parse_bandwidth("1000000\n", "950000\n") == \
        rt_throttle.RtBandwidth(1000000, 950000)
    assert rt_throttle.parse_bandwidth("1000000", "-1").unlimited
    for bad in ("", "abc", "-2", "1e6", "95 0000", "2147483648", "0x10", "+5"):
        with pytest.raises(FleetError, match="sched_rt_runtime_us: unexpected value"):
            rt_throttle.parse_bandwidth("1000000", bad)
    with pytest.raises(FleetError, match="sched_rt_period_us: unexpected value"):
        rt_throttle.parse_bandwidth("-1", "950000")            # the period has no "no limit"
    assert rt_throttle.runtime_text(950000, 1000000) == \
        "950000 of 1000000 us (RT threads stopped 50 ms of every 1000 ms)"
    assert rt_throttle.runtime_text(-1, 1000000) == "-1 (no limit)"


def test_the_guard_refuses_what_would_stop_rt_threads_or_the_kernel_refuses() -> None:
    assert rt_throttle.runtime_refusal(-1, 1000000) is None
    assert rt_throttle.runtime_refusal(1, 1000000) is None
    assert rt_throttle.runtime_refusal(1000000, 1000000) is None
    assert "would stop every real-time thread" in rt_throttle.runtime_refusal(0, 1000000)
    assert "would stop every real-time thread" in rt_throttle.runtime_refusal(-5, 1000000)
    assert "more than sched_rt_period_us 500000" in rt_throttle.runtime_refusal(990000, 500000)
    assert "not an integer" in rt_throttle.runtime_refusal(True, 1000000)     # type: ignore
    assert "not an integer" in rt_throttle.runtime_refusal("-1; reboot", 1000000)  # type: ignore
    with pytest.raises(FleetError, match="realtime.rt_runtime_us: refusing to write 990000: "
                                         "more than sched_rt_period_us 500000"):
        rt_throttle.plan_runtime(rt_throttle.RtBandwidth(500000, 475000), 990000)
    for corrupt in (None, {}, {"runtime_us": "950000"}, {"runtime_us": True},
                    {"runtime_us": -2}):
        with pytest.raises(FleetError, match="saved RT throttling record is corrupt"):
            rt_throttle.saved_runtime(corrupt)
    # GNU tee's message for a refused write (the kernel's EINVAL)
    assert rt_throttle.tee_failure(f"tee: {RUNTIME}: Invalid argument\n") == "Invalid argument"


# --------------------------------------------------------------------------- emulated devices


def test_every_boot_starts_from_the_kernel_defaults(nx) -> None:
    assert (nx.read_text(PERIOD), nx.read_text(RUNTIME)) == ("1000000\n", "950000\n")
    assert rt_throttle.read_bandwidth(nx) == rt_throttle.RtBandwidth(1000000, 950000)
    nx.path(RUNTIME).write_text("-1\n")
    nx.run(["reboot"], sudo=True)
    assert nx.read_text(RUNTIME) == "950000\n"


def test_live_round_trip_plan_apply_verify_again_restore(nx) -> None:
    before = proc_tree(nx)
    p = tunelib.plan(nx, LIVE, RT)
    assert ("RT throttling: /proc/sys/kernel/sched_rt_runtime_us 950000 of 1000000 us (RT "
            "threads stopped 50 ms of every 1000 ms) -> 990000 of 1000000 us (RT threads stopped "
            "10 ms of every 1000 ms) (live; a reboot restores the kernel default)") in p.steps
    assert proc_tree(nx) == before                            # a plan changes nothing
    report = tunelib.apply(nx, p)
    assert report.ok, report.checks
    got = {c.what: c for c in report.checks}["rt throttling"]
    assert got.ok and got.actual == "990000 of 1000000 us (RT threads stopped 10 ms of every " \
                                    "1000 ms)"
    assert nx.read_text(RUNTIME) == "990000\n"

    rec = Recording(nx)                                       # again: nothing written
    again = tunelib.plan(rec, LIVE, RT)
    assert "RT throttling 990000 of 1000000 us (RT threads stopped 10 ms of every 1000 ms) " \
           "already" in again.steps
    assert tunelib.apply(rec, again).ok
    assert not [c for c in rec.calls if c[0] == "tee" and RUNTIME in c]

    back = tunelib.restore(nx)
    assert back.outcome is tunelib.Restored.RESTORED, back.notes
    assert "RT throttling back to 950000 of 1000000 us (RT threads stopped 50 ms of every " \
           "1000 ms)" in back.notes
    assert proc_tree(nx) == before and not nx.path(tunelib.TUNE_DIR).exists()


def test_unlimited_is_applied_after_the_mode_switch_reboot_and_restored(nx) -> None:
    """-1 with a mode switch that reboots: the reboot brings the default back, so the rollout
    applies the step after it; the record keeps the value from before the first run."""
    before = proc_tree(nx)
    rt = dataclasses.replace(RT, rt_runtime_us=-1)
    hosts = [Host(name="nx", address="127.0.0.1", target="orin-nx-rt")]
    f = Fleet(hosts, connect=lambda h: nx, parallel=1)
    run = tunelib.tune_fleet(f, lambda h: MAXN, realtime_for=lambda h: rt, allow_reboot=True,
                             poll=0.05, reboot_timeout=30)
    o = run.results.succeeded[0]
    assert o.value.ok, o.value.checks
    assert {c.what: c for c in o.value.checks}["rt throttling"].actual == "-1 (no limit)"
    assert nx.read_text(RUNTIME) == "-1\n"
    back, _stopped = tunelib.restore_fleet(f, allow_reboot=True, poll=0.05, reboot_timeout=30)
    (done,) = list(back)
    assert done.value.outcome is tunelib.Restored.RESTORED, done.value.notes
    assert proc_tree(nx) == before


def test_values_the_device_cannot_take_are_refused_before_anything_changes(nx) -> None:
    nx.path(PERIOD).write_text("500000\n")                    # a device with a shorter period
    nx.path(RUNTIME).write_text("475000\n")
    before = proc_tree(nx)
    with pytest.raises(tunelib.TuneRefused, match="nx: realtime.rt_runtime_us: refusing to write "
                                                  "990000: more than sched_rt_period_us 500000"):
        tunelib.plan(nx, LIVE, RT)
    nx.path(RUNTIME).write_text("lots\n")
    with pytest.raises(tunelib.TuneRefused, match="sched_rt_runtime_us: unexpected value 'lots'"):
        tunelib.plan(nx, LIVE, RT)
    nx.path(RUNTIME).write_text("475000\n")
    assert proc_tree(nx) == before and not nx.path(tunelib.TUNE_DIR).exists()


def test_the_kernels_own_refusal_is_reported_with_what_it_said(nx) -> None:
    """With CONFIG_RT_GROUP_SCHED the kernel refuses a budget below its RT cgroups' (EINVAL;
    seen on a Jetson, OE4T/linux-tegra-4.9 issue 37). The emulated file cannot refuse a write,
    so this wrapper answers as tee does there."""
    class Refusing(Recording):
        def run(self, argv, **kw):
            if list(argv) == ["tee", "--", RUNTIME]:
                return Result(tuple(argv), 1, "", f"tee: {RUNTIME}: Invalid argument\n")
            return super().run(argv, **kw)

    with pytest.raises(FleetError, match="nx: writing 990000 to /proc/sys/kernel/"
                                         "sched_rt_runtime_us failed: Invalid argument"):
        tunelib.apply(Refusing(nx), tunelib.plan(nx, LIVE, RT))
    assert nx.read_text(RUNTIME) == "950000\n"
