"""`invoke tune` against emulated Jetsons: real sshd per device, the faked sysfs/etc tree bind- and
overlay-mounted at the real paths in the device's mount namespace, and the nvpmodel/jetson_clocks
stand-ins doing the work. Every test starts its own small fleet (a fraction of a second), so
tuning in one test never leaks into another.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from fleet_support import Recording

from colibri_kit.errors import FleetError
from colibri_kit.fleet import tune as tunelib
from colibri_kit.fleet.connect import SUDO_PASSWORD_ENV, SSHRemote
from colibri_kit.fleet.inventory import Host, write_inventory
from colibri_kit.profiles import TuneSpec, load_profile
from colibri_kit.sim.fleet import BOOT_TIMEOUT

pytestmark = pytest.mark.slow
PROJECT = Path(__file__).resolve().parents[2]
# The faked files a round trip must give back byte for byte (the whole faked sysfs, plus these).
FAKED_EXTRA = ("etc/nvpmodel.conf", "etc/nv_tegra_release", "var/lib/nvpmodel/status",
               "usr/sbin/nvpmodel", "usr/bin/jetson_clocks")
WRITING_TOOLS = {"cp", "xargs", "jetson_clocks", "sh", "tee", "rm", "mv"}
STATE = tunelib.TUNE_DIR
EMC_RATE = "sys/kernel/debug/bpmp/debug/clk/emc/rate"   # the kernel's to set: no kernel here
# A mode the factory Orin NX (15W) switches to live (10W: same TPC_PG_MASK); the profile's own
# [MAXN_SUPER, MAXN] needs a reboot there (tests of that: test_tune_with_reboot_* below).
LIVE = TuneSpec(nvpmodel_mode="min", jetson_clocks=True, cpu_governor="performance",
                gpu_governor="performance")


def wait_booted(fleet, name: str, boots: int, timeout: float = BOOT_TIMEOUT) -> None:
    """Until the device has booted again after ``boots`` boots and answers SSH (``timeout`` is
    only a bound: the wait returns as soon as it has)."""
    import time
    device = fleet.device(name)
    deadline = time.monotonic() + timeout
    while device.boots <= boots:
        assert time.monotonic() < deadline, f"{name} did not reboot"
        time.sleep(0.1)
    from colibri_kit.sim.fleet import _wait_port
    _wait_port(device.port, None, Path(device.dir) / "sshd.log", timeout)


@pytest.fixture
def fleet():
    """jetson-00: Orin NX (JP6 GPU path), jetson-01: Xavier NX (JP5 GPU path, other mode ids).

    The state dir (which holds the faked device files) lives outside pytest's temp dirs: another
    pytest session prunes old basetemp dirs and would delete it under running devices."""
    if os.geteuid() != 0:
        pytest.fail("the tune tests start sshd in mount namespaces and need root (CI runs as root)")
    from colibri_kit.sim.fleet import EmulatedFleet

    state = Path(tempfile.mkdtemp(prefix="colibri-tune-test-"))
    try:
        with EmulatedFleet(2, "orin-nx", state, modules=["orin-nx", "xavier-nx"]) as f:
            yield f
    finally:
        shutil.rmtree(state, ignore_errors=True)


def hosts(fleet, user: str = "root", target: str | None = None) -> list[Host]:
    """The fleet's hosts with each device's own module as its target (or ``target``)."""
    return [dataclasses.replace(h, target=target or d.module)
            for h, d in zip(fleet.hosts(user), fleet.devices)]


def fleet_file(fleet, path: Path, user: str = "root", target: str | None = None) -> Path:
    write_inventory(path, hosts(fleet, user, target), known_hosts=str(fleet.known_hosts),
                    identity_file=str(fleet.identity_file))
    return path


def connect(fleet, host: Host) -> SSHRemote:
    return SSHRemote(host, known_hosts=fleet.known_hosts, identity_file=fleet.identity_file).connect()


def faked(fleet, name: str) -> dict[str, bytes]:
    root = fleet.device(name).faked_root
    out: dict[str, bytes] = {}
    for path in sorted((root / "sys").rglob("*")):
        rel = str(path.relative_to(root))
        if rel == EMC_RATE:
            continue
        if path.is_symlink():
            out[rel] = b"-> " + os.readlink(path).encode()
        elif path.is_file():
            out[rel] = path.read_bytes()
    for rel in FAKED_EXTRA:
        out[rel] = (root / rel).read_bytes()
    return out


def invoke(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    # timeout: a prompt waiting on stdin would hang here and fail the test instead (a bound, not
    # a speed target: a reboot under --reboot-timeout fits in it on a loaded machine).
    return subprocess.run([sys.executable, "-m", "invoke", "tune", *args], cwd=PROJECT, env=full,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=900)


def test_tune_with_reboot_show_verify_restore_round_trip(fleet, tmp_path: Path) -> None:
    """Both modules through the real CLI. The factory Orin NX (15W) wants MAXN: without
    --allow-reboot it is reported and nothing changes there; with it the device really reboots
    once (sshd goes down, it comes back in MAXN), then clocks and governors are applied and
    verified. The Xavier switches live. Restore (with --allow-reboot: back to 15W is a reboot
    again) gives every faked file its original bytes."""
    ff = fleet_file(fleet, tmp_path / "fleet.yaml")
    before = {d.name: faked(fleet, d.name) for d in fleet.devices}

    dry = invoke("--fleet", str(ff), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "power mode 15W -> MAXN (id 0; MAXN is mode 0 (MAXN_SUPER not on this device)); " \
           "needs a reboot" in dry.stdout
    assert "power mode MODE_15W_6CORE -> MODE_20W_6CORE (id 8; MODE_20W_6CORE is mode 8); live" \
        in dry.stdout
    assert "needs a reboot (power mode or CPU isolation): jetson-00 (not allowed" in dry.stdout
    assert {d.name: faked(fleet, d.name) for d in fleet.devices} == before

    refused = invoke("--fleet", str(ff))
    assert refused.returncode == 1
    assert "needs a reboot: not applied" in refused.stdout and "nothing was changed" in refused.stdout
    assert faked(fleet, "jetson-00") == before["jetson-00"]
    assert not fleet.path_in("jetson-00", STATE).exists()
    assert fleet.device("jetson-00").boots == 1
    invoke("--fleet", str(ff), "--restore")           # the Xavier was tuned: put it back
    assert faked(fleet, "jetson-01") == before["jetson-01"]

    run = invoke("--fleet", str(ff), "--allow-reboot", "--reboot-timeout", str(int(BOOT_TIMEOUT)))
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [r for r in run.stdout.splitlines() if re.match(r"^jetson-\d+\s", r)]
    assert len(rows) == 12 and all(r.endswith(" ok") for r in rows), run.stdout
    assert "jetson-00: rebooted once into MAXN" in run.stdout
    assert fleet.device("jetson-00").boots == 2 and fleet.device("jetson-01").boots == 1
    for d in fleet.devices:
        assert faked(fleet, d.name) != before[d.name]
        assert fleet.path_in(d.name, f"{STATE}/l4t_dfs.conf").is_file()
        assert fleet.path_in(d.name, f"{STATE}/state.json").is_file()
    orin = fleet.device("jetson-00").faked_root
    assert (orin / "sys/devices/system/cpu/online").read_text() == "0-7\n"
    assert (orin / "sys/devices/system/cpu/cpu7/cpufreq/scaling_governor").read_text() == "performance\n"
    assert (orin / "sys/class/devfreq/17000000.gpu/governor").read_text() == "performance\n"
    xavier = fleet.device("jetson-01").faked_root
    assert (xavier / "sys/devices/17000000.gv11b/devfreq/17000000.gv11b/governor").read_text() \
        == "performance\n"

    tuned = {d.name: faked(fleet, d.name) for d in fleet.devices}
    show = invoke("--fleet", str(ff), "--show")
    assert show.returncode == 0, show.stderr
    lines = {l.split()[0]: l for l in show.stdout.splitlines()[2:]}
    assert "MAXN (id 0)" in lines["jetson-00"] and "MODE_20W_6CORE (id 8)" in lines["jetson-01"]
    # jetson_clocks leaves the fan alone unless asked (--fan), as NVIDIA's script does.
    assert all(" active " in lines[h] and "64/255" in lines[h] for h in lines)
    assert {d.name: faked(fleet, d.name) for d in fleet.devices} == tuned  # --show changed nothing

    back = invoke("--fleet", str(ff), "--restore", "--allow-reboot")
    assert back.returncode == 0, back.stdout + back.stderr
    wait_booted(fleet, "jetson-00", 2)
    for d in fleet.devices:
        assert faked(fleet, d.name) == before[d.name], d.name
        assert not fleet.path_in(d.name, STATE).exists()
    again = invoke("--fleet", str(ff), "--restore")
    assert again.returncode == 0 and "nothing saved" in again.stdout


def test_second_tune_changes_nothing_and_still_verifies(fleet) -> None:
    host = hosts(fleet)[0]
    spec = LIVE
    with connect(fleet, host) as remote:
        first = tunelib.apply(remote, tunelib.plan(remote, spec))
        assert first.ok, first.checks
        tuned = faked(fleet, host.name)
        saved = fleet.path_in(host.name, f"{STATE}/l4t_dfs.conf").read_bytes()

        rec = Recording(remote)
        plan = tunelib.plan(rec, spec)
        assert len(plan.steps) == 1 and plan.steps[0].startswith("power mode 10W already (min:")
        second = tunelib.apply(rec, plan)
        assert second.ok, second.checks
        writes = [c for c in rec.calls if c[0] in WRITING_TOOLS or c[0] in ("write_bytes", "upload")
                  or c[:2] == ("nvpmodel", "-m")]
        assert writes == []
        assert faked(fleet, host.name) == tuned
        # The first pre-tuning clock state is still what restore will return to.
        assert fleet.path_in(host.name, f"{STATE}/l4t_dfs.conf").read_bytes() == saved
        tunelib.restore(remote)


def test_governor_the_device_lacks_is_refused_before_anything_changes(fleet, tmp_path: Path) -> None:
    """Xavier NX has the mode and lists `interactive`, Orin NX has neither: the whole run stops
    before the Xavier (which alone would pass) is touched."""
    project = tmp_path / "project"
    shutil.copytree(PROJECT / "targets", project / "targets")
    (project / "targets" / "odd-gov.yaml").write_text(
        "name: odd-gov\nextends: orin-nx\ndescription: asks for a governor Orin lacks\n"
        "tune: {nvpmodel_mode: MODE_20W_6CORE, cpu_governor: interactive}\n")
    ff = fleet_file(fleet, tmp_path / "fleet.yaml", target="odd-gov")
    before = {d.name: faked(fleet, d.name) for d in fleet.devices}
    run = invoke("--fleet", str(ff), env={"COLIBRI_PROJECT_ROOT": str(project)})
    assert run.returncode == 1
    assert "nothing was changed" in run.stdout + run.stderr
    assert "cpu0 has no governor 'interactive'" in run.stdout
    assert "no mode named MODE_20W_6CORE on this device (it has: 0 MAXN" in run.stdout
    assert "jetson-01" not in run.stdout  # the Xavier passed the checks, and was still left alone
    assert {d.name: faked(fleet, d.name) for d in fleet.devices} == before
    for d in fleet.devices:
        assert not fleet.path_in(d.name, STATE).exists()


def test_tune_with_reboot_through_the_library_then_restore(fleet) -> None:
    """apply() answers nvpmodel's prompt only with allow_reboot; the device goes down (its SSH
    session with it) and boots in MAXN; restore needs a reboot back, and keeps its record
    without permission."""
    host = hosts(fleet)[0]
    spec = dataclasses.replace(LIVE, nvpmodel_mode="MAXN")
    before = faked(fleet, host.name)
    status = fleet.device(host.name).faked_root / "var/lib/nvpmodel/status"
    with connect(fleet, host) as remote:
        out = tunelib.apply(remote, tunelib.plan(remote, spec))
        assert not out.ok and out.mode is tunelib.ModeSwitch.NEEDS_REBOOT
        assert tunelib.Check("power mode", "MAXN", "15W (2)", False) in out.checks
        assert "nothing was changed" in out.notes[0]
        assert faked(fleet, host.name) == before
        out = tunelib.apply(remote, tunelib.plan(remote, spec), allow_reboot=True)
        assert out.checks == [tunelib.Check("power mode", "MAXN", "rebooting", False)]
        assert out.mode is tunelib.ModeSwitch.REBOOTING
    wait_booted(fleet, host.name, 1)
    assert status.read_text() == "pmode:0000\n"
    root = fleet.device(host.name).faked_root
    assert (root / "sys/devices/platform/gpu.0/tpc_pg_mask").read_text() == "240\n"
    with connect(fleet, host) as remote:
        assert tunelib.mode_now(remote) == ("MAXN", True)
        done = tunelib.apply(remote, tunelib.plan(remote, spec))
        assert done.ok, done.checks
        back = tunelib.restore(remote)        # to 15W: a reboot again, not allowed
        assert back.outcome is tunelib.Restored.INCOMPLETE and not back.ok
        assert "reboot required" in back.notes[0] and "saved state is kept" in back.notes[0]
        assert fleet.path_in(host.name, f"{STATE}/state.json").is_file()
        back = tunelib.restore(remote, allow_reboot=True)
        assert back.outcome is tunelib.Restored.RESTORED, back.notes
    wait_booted(fleet, host.name, 2)
    assert faked(fleet, host.name) == before


def test_missing_sudo_fails_fast_and_a_given_password_works(fleet, tmp_path: Path,
                                                            monkeypatch) -> None:
    ff = fleet_file(fleet, tmp_path / "fleet.yaml", user="colibri")
    before = {d.name: faked(fleet, d.name) for d in fleet.devices}
    env = {k: v for k, v in os.environ.items() if k != SUDO_PASSWORD_ENV}
    proc = subprocess.run([sys.executable, "-m", "invoke", "tune", "--fleet", str(ff)], cwd=PROJECT,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1
    assert SUDO_PASSWORD_ENV in proc.stdout and "nothing was changed" in proc.stdout + proc.stderr
    assert {d.name: faked(fleet, d.name) for d in fleet.devices} == before
    # --show needs no privilege: without sudo it reads as the login user.
    show = subprocess.run([sys.executable, "-m", "invoke", "tune", "--fleet", str(ff), "--show"],
                          cwd=PROJECT, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=120)
    assert show.returncode == 0, show.stdout + show.stderr
    assert "15W (id 2)" in show.stdout and "MODE_15W_6CORE (id 2)" in show.stdout

    # The same login with the password in the environment: sudo -S, a full round trip.
    monkeypatch.setenv(SUDO_PASSWORD_ENV, fleet.sudo_password)
    host = hosts(fleet, user="colibri")[0]
    with connect(fleet, host) as remote:
        out = tunelib.apply(remote, tunelib.plan(remote, LIVE))
        assert out.ok, out.checks
        tunelib.restore(remote)
    assert faked(fleet, host.name) == before[host.name]


HOSTILE = ["performance; touch /tmp/colibri-pwned", "$(touch /tmp/colibri-pwned)",
           "`touch /tmp/colibri-pwned`", "performance\ntouch /tmp/colibri-pwned",
           "../../../../tmp/colibri-pwned", "x' || touch /tmp/colibri-pwned '", "performance\n"]


def test_hostile_values_never_reach_a_shell(fleet) -> None:
    host = hosts(fleet)[0]
    root = fleet.device(host.name).faked_root
    marker_in_device = fleet.path_in(host.name, "/tmp/colibri-pwned")
    # Hostile values on the device side: a governor list entry, a mode name, a devfreq node.
    gov = root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors"
    gov.write_text(gov.read_text().strip() + " x;touch${IFS}/tmp/colibri-pwned\n")
    conf = root / "etc/nvpmodel.conf"
    conf.write_text(conf.read_text().replace(
        "< PM_CONFIG", "< POWER_MODEL ID=9 NAME=$(touch${IFS}/tmp/colibri-pwned) >\n"
                       "CPU MAX_FREQ 1\n\n< PM_CONFIG"))
    (root / "sys/class/devfreq/17000000.gpu;touch${IFS}x").symlink_to("17000000.gpu")
    before = faked(fleet, host.name)
    good = LIVE
    with connect(fleet, host) as remote:
        for value in HOSTILE + ["x;touch${IFS}/tmp/colibri-pwned"]:
            for spec in (dataclasses.replace(good, cpu_governor=value),
                         dataclasses.replace(good, gpu_governor=value),
                         dataclasses.replace(good, nvpmodel_mode=value)):
                with pytest.raises(tunelib.TuneRefused, match="not a valid name"):
                    tunelib.plan(remote, spec)
        assert faked(fleet, host.name) == before
        # The sysfs writer itself refuses anything but a governor path and a listed name.
        ok_path = "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
        for path in [ok_path + "; touch /tmp/colibri-pwned",
                     "/sys/devices/system/cpu/cpu0/cpufreq/../../../../../etc/passwd",
                     "/sys/class/devfreq/17000000.gpu;touch /tmp/colibri-pwned/governor"]:
            with pytest.raises(FleetError, match="not a governor path"):
                tunelib.write_governor(remote, [path], "performance", {path: ["performance"]})
        for value in HOSTILE:
            with pytest.raises(FleetError, match="refusing"):
                tunelib.write_governor(remote, [ok_path], value, {ok_path: [value]})
        # A normal tune on this device still works: the hostile entries are never used.
        plan = tunelib.plan(remote, good)
        assert plan.state.modes["$(touch${IFS}/tmp/colibri-pwned)"] == 9
        assert plan.state.gpu_node == "17000000.gpu"
        out = tunelib.apply(remote, plan)
        assert out.ok, out.checks
        # jetson_clocks stored the hostile link too (its of_node says GPU) and cannot write it
        # back; it exits 0 anyway: the kit reads its output, reports it, restores the rest.
        back = tunelib.restore(remote)
        assert back.outcome is tunelib.Restored.INCOMPLETE
        assert "failed to restore /sys/class/devfreq/17000000.gpu;touch${IFS}x/min_freq" \
            in back.notes[0]
    assert faked(fleet, host.name) == before
    assert not marker_in_device.exists() and not Path("/tmp/colibri-pwned").exists()


def test_tuning_summary_for_smoke_tables(fleet) -> None:
    host = hosts(fleet)[1]
    with connect(fleet, host) as remote:
        assert tunelib.tuning_summary(remote) == {
            "mode": "MODE_15W_6CORE", "mode_id": 2, "cpu_governor": "schedutil",
            "gpu_governor": "nvhost_podgov", "jetson_clocks": False}
        tunelib.apply(remote, tunelib.plan(remote, load_profile("xavier-nx").tune))
        tuned = tunelib.tuning_summary(remote)
        assert tuned == {
            "mode": "MODE_20W_6CORE", "mode_id": 8, "cpu_governor": "performance",
            "gpu_governor": "performance", "jetson_clocks": True}
        assert tunelib.summary_text(tuned) == \
            "MODE_20W_6CORE, cpu performance, gpu performance, clocks pinned"
        tunelib.restore(remote)


def faked_realtime(fleet, name: str) -> dict[str, bytes]:
    """faked() plus what the real-time steps read and write: /proc's IRQs and command line (bound
    over the host's on the device) and the boot configuration."""
    root = fleet.device(name).faked_root
    out = faked(fleet, name)
    for top in ("proc/irq", "proc/cmdline", "proc/interrupts", "boot",
                "proc/sys/kernel/sched_rt_period_us", "proc/sys/kernel/sched_rt_runtime_us"):
        for path in sorted([root / top, *(root / top).rglob("*")]):
            rel = str(path.relative_to(root))
            if path.is_symlink():
                out[rel] = b"-> " + os.readlink(path).encode()
            elif path.is_file():
                out[rel] = path.read_bytes()
    return out


def test_realtime_profile_isolates_and_moves_irqs_over_ssh_then_restores(fleet, tmp_path) -> None:
    """orin-nx-rt through the real CLI on a factory Orin NX: without --allow-reboot nothing
    changes; with it one real reboot (sshd goes down) takes MAXN and isolcpus together, the
    device comes back with CPUs 2-7 isolated, then the IRQs leave them; restore takes it all
    back with one more reboot, every faked file as it was."""
    host = hosts(fleet, target="orin-nx-rt")[0]
    ff = tmp_path / "fleet.yaml"
    write_inventory(ff, [host], known_hosts=str(fleet.known_hosts),
                    identity_file=str(fleet.identity_file))
    before = faked_realtime(fleet, host.name)
    root = fleet.device(host.name).faked_root

    dry = invoke("--fleet", str(ff), "--dry-run")
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "isolate CPUs 2-7: isolcpus=managed_irq,domain,2-7 on the APPEND line of label primary" \
        in dry.stdout and "IRQ affinity: 22 IRQs off CPUs 2-7 onto 0-1" in dry.stdout
    refused = invoke("--fleet", str(ff))
    assert refused.returncode == 1 and "nothing was changed" in refused.stdout
    assert faked_realtime(fleet, host.name) == before

    run = invoke("--fleet", str(ff), "--allow-reboot", "--reboot-timeout", str(int(BOOT_TIMEOUT)))
    assert run.returncode == 0, run.stdout + run.stderr
    assert fleet.device(host.name).boots == 2           # one reboot for the mode and the isolation
    for setting in ("irq affinity", "irq default", "kernel cmdline", "isolated cpus"):
        assert re.search(rf"^{host.name}\s+{setting}\s.*\sok$", run.stdout, re.M), run.stdout
    with connect(fleet, host) as remote:
        assert "isolcpus=managed_irq,domain,2-7" in remote.read_text("/proc/cmdline")
        assert remote.read_text("/sys/devices/system/cpu/isolated") == "2-7\n"
        assert remote.read_text("/proc/irq/70/smp_affinity_list") == "0-1\n"
        assert remote.read_text("/proc/irq/default_smp_affinity") == "03\n"
        # The RT throttling files are the device's own, bound over /proc/sys: a write over ssh
        # lands in its tree, never in this machine's kernel (restore's reboot resets it).
        host_rt = Path("/proc/sys/kernel/sched_rt_runtime_us").read_text()
        assert remote.read_text("/proc/sys/kernel/sched_rt_runtime_us") == "950000\n"
        try:
            remote.run(["tee", "--", "/proc/sys/kernel/sched_rt_runtime_us"], sudo=True,
                       input=b"990000\n")
            assert Path("/proc/sys/kernel/sched_rt_runtime_us").read_text() == host_rt
        finally:
            if Path("/proc/sys/kernel/sched_rt_runtime_us").read_text() != host_rt:
                Path("/proc/sys/kernel/sched_rt_runtime_us").write_text(host_rt)
        assert (root / "proc/sys/kernel/sched_rt_runtime_us").read_text() == "990000\n"
    assert (root / "proc/irq/70/smp_affinity_list").read_text() == "0-1\n"   # the bound files

    back = invoke("--fleet", str(ff), "--restore", "--allow-reboot", "--reboot-timeout",
                  str(int(BOOT_TIMEOUT)))
    assert back.returncode == 0, back.stdout + back.stderr
    wait_booted(fleet, host.name, 2)
    assert faked_realtime(fleet, host.name) == before
    assert not fleet.path_in(host.name, STATE).exists()
