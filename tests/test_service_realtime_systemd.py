"""The real-time unit under a REAL systemd (the host's systemd 252 as PID 1 of an emulated
device, colibri_kit/sim/systemd.py), running the real `colibri serve` of dist/host: the limits the
unit renders for a profile's realtime section (LimitRTPRIO=, LimitMEMLOCK=, the scheduler calls
back in the seccomp filter, RestrictRealtime=no) are what the service gets, with no capability,
and each of them is needed: without it the service cannot apply its option and says which setting
raises the limit. (The unit's text and its `systemd-analyze security` rating:
tests/test_service_realtime.py.)

systemd raises a service's hard limits with CAP_SYS_RESOURCE. A machine whose root lacks it (a
container such as this sandbox: RLIMIT_RTPRIO hard 0, RLIMIT_MEMLOCK hard 8 MiB) cannot give its
emulated devices more than its own hard limits; a Jetson's systemd can. So where this machine
cannot grant LimitRTPRIO, the test checks the other true outcome: the service refuses to start
and names LimitRTPRIO= (and the granted limits are what systemd could give). Both outcomes are
asserted; nothing is skipped."""

from __future__ import annotations

import json
import os
import resource
import shutil
import tempfile
from pathlib import Path

import pytest
from serve_support import write_load_model

from colibri_kit.model.tiny import write_tiny_model
from colibri_kit.service import (RealtimeOptions, ServiceSpec, device_files, install_commands,
                                 render_unit)
from colibri_kit.sim.systemd import SystemdDevice

pytestmark = [pytest.mark.slow, pytest.mark.root]

CPUS = sorted(os.sched_getaffinity(0))
TWO = tuple(CPUS[-2:]) if len(CPUS) >= 2 else (CPUS[0],)
PRIORITY = 10
FIFO = ServiceSpec(port=8080, backend="cpu", restart_sec=0.3, model_id="m",
                   realtime=RealtimeOptions(cpus=TWO, policy="fifo", priority=PRIORITY,
                                            lock_memory=True, barrier="spin"))
LOCK = ServiceSpec(port=8080, backend="cpu", restart_sec=0.3, model_id="m",
                   realtime=RealtimeOptions(cpus=TWO, lock_memory=True))


def can_raise_limits() -> bool:
    """Whether this machine's root may raise hard limits (CAP_SYS_RESOURCE, bit 24)."""
    eff = next(line for line in Path("/proc/self/status").read_text().splitlines()
               if line.startswith("CapEff:"))
    return bool(int(eff.split()[1], 16) >> 24 & 1)


def granted(limit: int, want: int | None) -> int | None:
    """What systemd can give a service asking for `want` (None: infinity) of `limit`."""
    hard = resource.getrlimit(limit)[1]
    if can_raise_limits():
        return want
    if want is None:
        return None if hard == resource.RLIM_INFINITY else hard
    return want if hard == resource.RLIM_INFINITY else min(want, hard)


def install(dev: SystemdDevice, host_colibri: Path, model: Path, spec: ServiceSpec,
            unit_text: str) -> None:
    top = dev.path("/opt/colibri")
    (top / "releases/r1/bin").mkdir(parents=True, exist_ok=True)
    shutil.copy2(host_colibri, top / "releases/r1/bin/colibri")
    shutil.copy2(model, top / "releases/r1/model.colibri")
    if not (top / "current").is_symlink():
        os.symlink("releases/r1", top / "current")
    files = device_files(spec)
    files["/etc/systemd/system/colibri.service"] = unit_text
    for path, text in files.items():
        dev.write(path, text)
    for argv in install_commands(enable=False):
        dev.run(argv)


def wait(dev: SystemdDevice, pred, tries: int = 1200):
    for _ in range(tries):     # a bound only: returns as soon as it holds
        value = pred()
        if value:
            return value
        dev.run(["sleep", "0.1"])
    return pred()


CURSOR = "/var/tmp/colibri-test-journal-cursor"   # on the device: where the latest start() began


def journal(dev: SystemdDevice) -> str:
    """The unit's journal since the latest start() (an earlier start's lines, e.g. its ready
    event, are not in it: rotating and vacuuming cannot drop entries under a second old)."""
    return dev.run(["sh", "-c", f'exec journalctl -u colibri.service -o cat --no-pager '
                                f'--after-cursor "$(cat {CURSOR})"']).stdout


def mark_journal(dev: SystemdDevice) -> None:
    """Remember the journal's last entry: journal() shows what follows it."""
    out = dev.run(["journalctl", "-n", "1", "--show-cursor", "-q", "-o", "cat", "--no-pager"]).stdout
    cursor = next(l for l in reversed(out.splitlines()) if l.startswith("-- cursor: "))
    dev.write(CURSOR, cursor[len("-- cursor: "):])


@pytest.fixture(scope="module")
def device(host_colibri: Path, tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0:
        pytest.fail("the systemd emulation needs root (namespaces, overlayfs, cgroups); CI runs as root")
    d = tmp_path_factory.mktemp("model")
    models = {"tiny": write_tiny_model(d / "tiny.colibri"),       # well under 8 MiB locked
              "big": write_load_model(d / "big.colibri")}          # ~30 MB: over a default limit
    state = Path(tempfile.mkdtemp(prefix="colibri-rt-systemd-test-"))
    # Real-time scheduling as a real device's root cpu cgroup allows it (the sim's _rt_budget).
    dev = SystemdDevice("rt-00", state / "devices", rt_runtime_us=500_000)
    try:
        dev.boot()
        yield dev, models
    finally:
        dev.kill()
        shutil.rmtree(state, ignore_errors=True)


def start(dev: SystemdDevice, host_colibri: Path, model: Path, spec: ServiceSpec,
          text: str | None = None) -> str:
    """Install and start the unit: 'active' once serve is ready, or 'failed'."""
    dev.systemctl("stop", "colibri.service", check=False)
    dev.systemctl("reset-failed", "colibri.service", check=False)
    mark_journal(dev)
    install(dev, host_colibri, model, spec, text or render_unit(spec))
    dev.systemctl("start", "colibri.service", check=False)

    def settled() -> str | None:
        if '"event": "ready"' in journal(dev):
            return "active"
        state = dev.systemctl("is-failed", "colibri.service", check=False).stdout.strip()
        return "failed" if state == "failed" else None
    return wait(dev, settled) or "neither"


def proc_status(dev: SystemdDevice, pid: int) -> dict[str, str]:
    return dict(line.split(":\t", 1) for line in dev.run(["cat", f"/proc/{pid}/status"]).stdout
                .splitlines() if ":\t" in line)


def limit_of(dev: SystemdDevice, pid: int, name: str) -> str:
    """Soft value of a line of /proc/PID/limits ("Max locked memory" -> "8388608")."""
    line = next(l for l in dev.run(["cat", f"/proc/{pid}/limits"]).stdout.splitlines()
                if l.startswith(name))
    return line[len(name):].split()[0]


def threads(dev: SystemdDevice, pid: int) -> list[tuple[str, str, str]]:
    """(policy, rt_priority, Cpus_allowed_list) of each thread (proc(5) stat fields 41, 40)."""
    out = dev.run(["sh", "-c", f"for t in /proc/{pid}/task/*; do cat $t/stat; echo; "
                               "grep Cpus_allowed_list $t/status; done"], check=False).stdout
    lines = [l for l in out.splitlines() if l.strip()]
    found = []
    for stat, allowed in zip(lines[::2], lines[1::2]):
        f = stat[stat.rindex(")") + 2:].split()
        found.append((f[38], f[37], allowed.split()[-1]))
    return found


def test_memory_locked_and_workers_pinned_with_no_capability(device, host_colibri) -> None:
    dev, models = device
    assert start(dev, host_colibri, models["tiny"], LOCK) == "active", journal(dev)
    ready = json.loads(next(l for l in journal(dev).splitlines() if '"event": "ready"' in l))
    assert ready["realtime"]["memory_locked"] is True
    assert ready["realtime"]["cpus"] == ",".join(map(str, TWO))
    pid = dev.main_pid("colibri.service")
    st = proc_status(dev, pid)
    assert int(st["CapEff"], 16) == 0 and int(st["CapBnd"], 16) == 0
    assert int(st["VmLck"].split()[0]) * 1024 >= models["tiny"].stat().st_size   # mlockall held
    want = granted(resource.RLIMIT_MEMLOCK, None)
    assert limit_of(dev, pid, "Max locked memory") == ("unlimited" if want is None else str(want))
    # The helper (worker 1) is pinned to the second CPU, SCHED_OTHER.
    if len(TWO) == 2:
        assert ("0", "0", str(TWO[1])) in threads(dev, pid)
    answer = dev.run(["curl", "-sS", "--max-time", "30", "http://127.0.0.1:8080/v1/completions",
                      "-H", "Content-Type: application/json",
                      "-d", '{"model": "m", "prompt": [1, 2, 3], "max_tokens": 4}']).stdout
    assert len(json.loads(answer).get("choices", [{}])[0].get("token_ids", [])) == 4, answer


def test_a_real_time_policy_takes_limitrtprio_and_nothing_else(device, host_colibri) -> None:
    dev, models = device
    state = start(dev, host_colibri, models["tiny"], FIFO)
    if granted(resource.RLIMIT_RTPRIO, PRIORITY) == PRIORITY and len(TWO) == 2:
        assert state == "active", journal(dev)
        pid = dev.main_pid("colibri.service")
        assert int(proc_status(dev, pid)["CapEff"], 16) == 0
        assert limit_of(dev, pid, "Max realtime priority") == str(PRIORITY)
        assert ("1", str(PRIORITY), str(TWO[1])) in threads(dev, pid)   # SCHED_FIFO, pinned
    else:
        # This machine's root cannot raise RLIMIT_RTPRIO (see the module): systemd gave the
        # service what it could, and serve refuses to start, naming the setting.
        assert state == "failed", journal(dev)
        assert "LimitRTPRIO= in a systemd unit" in journal(dev)


@pytest.mark.parametrize("line,spec,model,words", [
    ("LimitMEMLOCK=infinity", LOCK, "big", "LimitMEMLOCK=infinity in the systemd unit"),
    (f"LimitRTPRIO={PRIORITY}", FIFO, "tiny", "LimitRTPRIO= in a systemd unit"),
])
def test_each_limit_is_needed(device, host_colibri, line, spec, model, words) -> None:
    dev, models = device
    text = render_unit(spec)
    assert line + "\n" in text
    assert start(dev, host_colibri, models[model], spec, text.replace(line + "\n", "")) == "failed", \
        journal(dev)
    log = journal(dev)
    assert words in log, log.splitlines()
