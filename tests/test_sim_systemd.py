"""colibri.service under a REAL systemd (the host's systemd 252 as PID 1 of an emulated device,
colibri_kit/sim/systemd.py), serving with the real `colibri serve` of dist/host and the tiny model.

One device is booted for the module; the tests run in order on it: the service starts and
answers /health (curl), its request log is in the journal, `kill -9` is answered by a restart,
a release with a bad model ends `failed` (what the deploy's health gate reads), and after a
reboot the enabled service is back. The install steps here are the ones the deploy will run on a
device (docs/service.md, "What a deploy does")."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from colibri_kit.errors import FleetError
from colibri_kit.model.tiny import write_tiny_model
from colibri_kit.service import ServiceSpec, device_files, health_gate, install_commands
from colibri_kit.sim.systemd import (CGROUP_PARENT, SystemdDevice, free_addresses, sshd_unit,
                                     stop_devices)

pytestmark = [pytest.mark.slow, pytest.mark.root]

API_KEY = "sk-colibri-test-0123456789"
# /proc/device-tree/model of an Orin NX devkit (NVIDIA's devkit device tree, as /proc/device-tree/model prints it)
ORIN_NX_MODEL = b"NVIDIA Jetson Orin NX Engineering Reference Developer Kit"


def install_release(dev: SystemdDevice, root: str, binary: Path, model: bytes, rel: str) -> None:
    """What deploy leaves on a device: releases/<id>/{bin/colibri, model.colibri ->
    ../../models/<sha>.colibri}, models/<sha>.colibri, current -> releases/<id>."""
    top = dev.path(root)
    sha = hashlib.sha256(model).hexdigest()
    (top / "models").mkdir(parents=True, exist_ok=True)
    (top / "models" / f"{sha}.colibri").write_bytes(model)
    bin_dir = top / "releases" / rel / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(binary, bin_dir / "colibri")
    os.symlink(f"../../models/{sha}.colibri", top / "releases" / rel / "model.colibri")
    os.symlink(f"releases/{rel}", top / "current")


def install_unit(dev: SystemdDevice, spec: ServiceSpec, unit: str, *, enable: bool) -> None:
    """What the deploy will do: write device_files (the verified unit, the service user's
    sysusers.d entry), then run install_commands (systemd-sysusers, daemon-reload, enable)."""
    for path, text in device_files(spec, unit=unit).items():
        dev.write(path, text)
    for argv in install_commands(unit, enable=enable):
        dev.run(argv)


def health(dev: SystemdDevice, url: str) -> str:
    """HTTP status of /health as curl on the device reports it ('000': no answer)."""
    res = dev.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", url],
                  check=False)
    return res.stdout.strip()


def runner(dev: SystemdDevice):
    """SystemdDevice.run in the shape health_gate takes (the deploy adapts its remote the same way)."""
    def run(argv: list[str]) -> tuple[int, str]:
        res = dev.run(argv, check=False)
        return res.returncode, res.stdout
    return run


# Bounds for waits that end as soon as what they wait for happens: generous, so a loaded machine
# (a CPU hog beside the suite) does not fail a healthy device; they cost nothing otherwise.
GATE_S = 120.0


def wait_for(pred, timeout: float = 120.0, step: float = 0.1):
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > end:
            return value
        time.sleep(step)


@pytest.fixture(scope="module")
def device(host_colibri: Path, tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0:
        pytest.fail("the systemd emulation needs root (namespaces, overlayfs, cgroups); CI runs as root")
    model = write_tiny_model(tmp_path_factory.mktemp("model") / "tiny.colibri").read_bytes()
    # A marker in the host's /tmp: the device's boot (systemd-tmpfiles) must not touch it.
    marker = tmp_path_factory.mktemp("marker") / "kept"
    marker.write_text("host file\n")
    had_dev_log = os.path.lexists("/dev/log")
    state = Path(tempfile.mkdtemp(prefix="colibri-systemd-test-"))
    # The fleet emulation's shape: a faked sysfs tree bound over /sys (it needs an fs/cgroup
    # directory, where systemd finds or mounts its cgroups) and a read-only layer over /usr.
    fake = state / "fake"
    (fake / "sys/fs/cgroup").mkdir(parents=True)
    (fake / "sys/firmware/devicetree/base").mkdir(parents=True)
    (fake / "sys/firmware/devicetree/base/model").write_bytes(ORIN_NX_MODEL + b"\0")
    (fake / "usr/lib/colibri-sim").mkdir(parents=True)
    (fake / "usr/lib/colibri-sim/layer").write_text("sim layer\n")
    # aarch64 services run through qemu-user's binfmt entry, which needs the loader prefix
    dev = SystemdDevice("sysd-00", state / "devices",
                        default_environment={"QEMU_LD_PREFIX": "/usr/aarch64-linux-gnu"},
                        layers={"usr": [fake / "usr"]}, binds=[(fake / "sys", "/sys")],
                        address=free_addresses()[0])
    try:
        dev.boot()
        # its own network namespace: the profile's port, whatever the host runs
        spec = ServiceSpec(port=8080, cpu_affinity="0", memory_max="256M", nice=5,
                           restart_sec=0.3, api_key_file="/etc/colibri/api-key", model_id="tiny")
        dev.write("/etc/colibri/api-key", API_KEY + "\n", 0o600)
        install_release(dev, "/opt/colibri", host_colibri, model, "r1")
        install_unit(dev, spec, "colibri.service", enable=True)
        dev.systemctl("start", "colibri.service")
        yield dev, spec, marker, had_dev_log
    finally:
        dev.kill()
        shutil.rmtree(state, ignore_errors=True)


def test_device_boots_its_own_systemd_without_touching_the_host(device):
    dev, _, marker, had_dev_log = device
    assert dev.run(["cat", "/proc/1/comm"]).stdout.strip() == "systemd"
    assert dev.run(["hostname"]).stdout.strip() == "sysd-00"
    assert dev.systemctl("is-system-running", check=False).stdout.strip() in ("running", "degraded")
    # own /tmp, emptied by its tmpfiles; the host's /tmp file is still there
    assert marker.read_text() == "host file\n"
    assert not dev.path(str(marker)).exists()
    # journald's /dev/log link is in the device's /dev only
    assert dev.path("/dev/log").is_symlink()
    assert os.path.lexists("/dev/log") == had_dev_log
    # its faked sysfs and its /usr layer are the device's only; its writes land in its own layer
    assert dev.path("/sys/firmware/devicetree/base/model").read_bytes() == ORIN_NX_MODEL + b"\0"
    assert dev.run(["cat", "/usr/lib/colibri-sim/layer"]).stdout == "sim layer\n"
    assert not os.path.exists("/usr/lib/colibri-sim/layer")
    dev.run(["touch", "/usr/lib/colibri-sim/written"])
    assert (dev.dir / "upper/usr/lib/colibri-sim/written").exists()
    assert not os.path.exists("/usr/lib/colibri-sim/written")
    # its own network: the host reaches its address; its loopback-only service stays private
    assert dev.run(["ip", "-o", "-4", "addr", "show", "eth0"]).stdout.split()[3] == f"{dev.address}/31"
    ping = subprocess.run(["curl", "-sS", "--max-time", "5", f"http://{dev.address}:8080/health"],
                          capture_output=True, text=True)
    assert ping.returncode == 7, ping   # no answer: bound to its own 127.0.0.1 (the arm test reaches 0.0.0.0)
    # its unit directory is its own: none of the host's enabled services
    wants = sorted(p.name for p in dev.path("/etc/systemd/system/multi-user.target.wants").iterdir())
    assert wants == ["colibri.service"]


def test_service_serves_health_with_its_limits(device):
    dev, spec, _, _ = device
    assert wait_for(lambda: health(dev, spec.health_url) == "200"), \
        dev.run(["journalctl", "-u", "colibri", "--no-pager", "-n", "20"], check=False).stdout
    assert dev.systemctl("is-active", "colibri.service").stdout.strip() == "active"
    pid = dev.main_pid("colibri.service")
    status = dev.run(["cat", f"/proc/{pid}/status"]).stdout
    assert "Cpus_allowed_list:\t0\n" in status and "NoNewPrivs:\t1" in status
    assert dev.run(["ps", "-o", "user=,ni=", "-p", str(pid)]).stdout.split() == ["colibri", "5"]
    cmdline = dev.run(["cat", f"/proc/{pid}/cmdline"]).stdout
    assert API_KEY not in cmdline and "/run/credentials/colibri.service/api-key" in cmdline
    environ = dev.run(["cat", f"/proc/{pid}/environ"]).stdout
    assert API_KEY not in environ
    # the key is required beyond /health
    models = dev.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}",
                      spec.health_url.replace("/health", "/v1/models")]).stdout
    assert models == "401"
    authed = dev.run(["curl", "-sS", "-H", f"Authorization: Bearer {API_KEY}",
                      spec.health_url.replace("/health", "/v1/models")]).stdout
    assert '"id": "tiny"' in authed


def test_request_log_line_is_in_the_journal(device):
    dev, spec, _, _ = device
    assert health(dev, spec.health_url) == "200"

    def logged():
        out = dev.run(["journalctl", "-u", "colibri", "--no-pager", "-o", "cat"]).stdout
        return [l for l in out.splitlines() if '"path": "/health"' in l and '"status": 200' in l]

    assert wait_for(logged)


def test_kill_9_is_answered_by_a_restart(device):
    dev, spec, _, _ = device
    before = dev.main_pid("colibri.service")
    assert before > 0, "colibri.service is not running"  # `kill -9 0` would signal a group
    restarts = int(dev.systemctl("show", "-p", "NRestarts", "--value", "colibri.service").stdout)
    dev.run(["kill", "-9", str(before)])
    assert wait_for(lambda: dev.main_pid("colibri.service") not in (0, before))
    assert wait_for(lambda: health(dev, spec.health_url) == "200")
    after = int(dev.systemctl("show", "-p", "NRestarts", "--value", "colibri.service").stdout)
    assert after == restarts + 1


def test_a_group_kill_inside_the_device_does_not_reach_the_caller(device):
    """`kill -9 0` inside the device signals the process group of `kill`. A process group is not
    confined by a PID namespace, so before commands got a session of their own it also killed
    whoever ran dev.run: a whole pytest run once ended silently that way. The call is made from
    a forked child in a session of its own, so the old behaviour kills only that child."""
    dev = device[0]
    child = os.fork()
    if child == 0:  # pragma: no cover - runs in the child
        status = 3
        try:
            os.setsid()
            # the forked copy does not own the device's Popen (poll() would see ECHILD and call
            # it exited), so it takes the parent's word that the device runs
            dev.running = lambda: True
            res = dev.run(["/bin/sh", "-c", "kill -9 0"], check=False)
            status = 0 if res.returncode == -9 else 4
        finally:
            os._exit(status)
    _, status = os.waitpid(child, 0)
    assert not os.WIFSIGNALED(status), "dev.run's caller was killed by a group kill in the device"
    assert os.WEXITSTATUS(status) == 0, "the command inside was not itself killed (-9)"


def test_health_gate_passes_with_the_api_key(device):
    dev, spec, _, _ = device
    gate = health_gate(runner(dev), spec, timeout=GATE_S)
    assert gate.ok and gate.state == "healthy", gate
    # the one-token completion went through with the key, which never was in an argv
    log = dev.run(["journalctl", "-u", "colibri", "--no-pager", "-o", "cat"]).stdout
    lines = [json.loads(l) for l in log.splitlines() if l.startswith('{"ts"')]
    assert any(e["path"] == "/v1/completions" and e["status"] == 200 for e in lines)


def test_a_bad_model_ends_failed(device, host_colibri):
    dev, _, _, _ = device
    bad = ServiceSpec(port=8081, restart_sec=0.2, start_limit_burst=3, root="/opt/colibri-bad")
    install_release(dev, "/opt/colibri-bad", host_colibri, b"this is not a model\n" * 8, "bad")
    install_unit(dev, bad, "colibri-bad.service", enable=False)
    # Type=exec: the job ends once exec succeeded, but a process that dies at once may fail the
    # job itself (a race), so the verdict is read from the unit state, as the deploy gate will.
    dev.systemctl("start", "--no-block", "colibri-bad.service")

    def failed() -> bool:
        return dev.systemctl("is-failed", "colibri-bad.service", check=False).stdout.strip() == "failed"

    gate = health_gate(runner(dev), bad, unit="colibri-bad.service", timeout=GATE_S)
    assert not gate.ok and gate.state == "failed" and gate.waited_s < GATE_S, gate   # not the timeout
    assert "model.colibri" in gate.detail
    assert failed()
    # retried (Restart=on-failure); the restart that would exceed the burst is refused: failed
    show = dev.systemctl("show", "-p", "Result", "-p", "NRestarts", "colibri-bad.service").stdout
    assert "Result=exit-code" in show and f"NRestarts={bad.start_limit_burst}" in show, show
    log = dev.run(["journalctl", "-u", "colibri-bad", "--no-pager", "-o", "cat"]).stdout
    assert "colibri serve: /opt/colibri-bad/current/model.colibri:" in log
    assert health(dev, bad.health_url) == "000"
    # the good service is untouched
    assert dev.systemctl("is-failed", "colibri.service", check=False).stdout.strip() == "active"


def test_the_orin_nx_binary_serves_under_the_same_unit(device, orin_nx_build, tmp_path):
    """The aarch64 product build, run by the hardened unit through qemu-user (binfmt F flag)."""
    try:  # the fleet emulation's registration (moving from colibri_kit/fleet/sim.py)
        from colibri_kit.sim.fleet import ensure_binfmt  # type: ignore[import-not-found]
    except ImportError:
        from colibri_kit.fleet.sim import ensure_binfmt
    ensure_binfmt()
    dev, _, _, _ = device
    # bound beyond loopback (so with a key): the host reaches it at the device's address
    arm = ServiceSpec(port=8082, bind="0.0.0.0", api_key_file="/etc/colibri/api-key", restart_sec=0.5,
                      model_id="tiny", root="/opt/colibri-arm")
    model = write_tiny_model(tmp_path / "tiny.colibri", pad=64).read_bytes()   # orin-nx embed_pad
    install_release(dev, "/opt/colibri-arm", orin_nx_build / "bin" / "colibri", model, "r1")
    install_unit(dev, arm, "colibri-arm.service", enable=False)
    dev.systemctl("start", "--no-block", "colibri-arm.service")
    assert wait_for(lambda: health(dev, arm.health_url) == "200", 300), \
        dev.run(["journalctl", "-u", "colibri-arm", "--no-pager", "-o", "cat"], check=False).stdout
    out = subprocess.run(["curl", "-sS", "--max-time", "60", "-H", "Content-Type: application/json",
                          "-H", f"Authorization: Bearer {API_KEY}", "-d",
                          '{"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 4, "temperature": 0}',
                          f"http://{dev.address}:8082/v1/completions"],
                         capture_output=True, text=True).stdout
    assert '"completion_tokens": 4' in out, out
    pid = dev.main_pid("colibri-arm.service")
    assert dev.run(["readlink", f"/proc/{pid}/exe"]).stdout.strip().endswith("qemu-aarch64")
    dev.systemctl("stop", "colibri-arm.service")
    assert dev.systemctl("is-active", "colibri-arm.service", check=False).stdout.strip() == "inactive"


def test_sshd_runs_as_a_unit_and_logs_in_to_the_device(device, tmp_path):
    dev, _, _, _ = device
    port = 22
    for key in ("host", "client"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / key)], check=True)
    dev.write("/etc/colibri-sim/ssh_host_ed25519_key", (tmp_path / "host").read_text(), 0o600)
    dev.write("/etc/colibri-sim/authorized_keys", (tmp_path / "client.pub").read_text())
    dev.write("/etc/colibri-sim/sshd_config", "\n".join([
        f"Port {port}", "ListenAddress 0.0.0.0", "HostKey /etc/colibri-sim/ssh_host_ed25519_key",
        "AuthorizedKeysFile /etc/colibri-sim/authorized_keys", "PermitRootLogin prohibit-password",
        "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
        "PidFile /run/sshd-sim.pid", "LogLevel ERROR", ""]))
    dev.write("/etc/systemd/system/sim-sshd.service", sshd_unit("/etc/colibri-sim/sshd_config"))
    dev.systemctl("daemon-reload")
    dev.systemctl("start", "sim-sshd.service")
    pub = (tmp_path / "host.pub").read_text().split()
    (tmp_path / "known_hosts").write_text(f"{dev.address} {pub[0]} {pub[1]}\n")
    ssh = ["ssh", "-i", str(tmp_path / "client"), "-p", str(port), "-o", "BatchMode=yes",
           "-o", f"UserKnownHostsFile={tmp_path / 'known_hosts'}", "-o", "StrictHostKeyChecking=yes",
           f"root@{dev.address}", "cat /proc/1/comm; hostname; systemctl is-active colibri.service"]
    res = wait_for(lambda: (r := subprocess.run(ssh, capture_output=True, text=True, timeout=30))
                   .returncode == 0 and r, 15)
    assert res and res.stdout.split() == ["systemd", "sysd-00", "active"]
    dev.systemctl("stop", "sim-sshd.service")


def test_a_taken_port_ends_failed(device):
    dev, spec, _, _ = device
    taken = ServiceSpec(port=spec.port, restart_sec=0.2, start_limit_burst=3)   # the good one's port
    install_unit(dev, taken, "colibri-taken.service", enable=False)
    dev.systemctl("start", "--no-block", "colibri-taken.service")
    gate = health_gate(runner(dev), taken, unit="colibri-taken.service", timeout=GATE_S)
    assert not gate.ok and gate.state == "failed", gate
    assert "cannot listen" in gate.detail
    assert health(dev, spec.health_url) == "200"    # the running service kept its port


def test_reboot_brings_the_enabled_service_back(device):
    dev, spec, _, _ = device
    old_pid1 = dev.pid
    boot_id = dev.run(["cat", "/proc/sys/kernel/random/boot_id"]).stdout
    assert boot_id != Path("/proc/sys/kernel/random/boot_id").read_text()   # the device's own
    dev.reboot()
    assert dev.pid != old_pid1
    assert dev.run(["cat", "/proc/sys/kernel/random/boot_id"]).stdout not in (boot_id, "")
    assert dev.systemctl("is-enabled", "colibri.service").stdout.strip() == "enabled"
    assert wait_for(lambda: health(dev, spec.health_url) == "200")
    # state on disk kept: the release, the user, and the previous boot's journal
    assert dev.path("/opt/colibri/current").readlink() == Path("releases/r1")
    boots = dev.run(["journalctl", "--list-boots", "--no-pager"]).stdout.strip().splitlines()
    assert len(boots) >= 2
    # a failed unit does not outlive the boot; a disabled one stays down
    assert dev.systemctl("is-active", "colibri-bad.service", check=False).stdout.strip() == "inactive"


def test_poweroff_and_kill_leave_nothing_behind(device):
    dev, _, _, _ = device
    pid1 = dev.pid
    rc = dev.poweroff()
    assert rc in (0, -2)                                  # exit, or SIGINT: the namespace's poweroff
    assert not os.path.exists(f"/proc/{pid1}")
    cg = Path("/sys/fs/cgroup/systemd") / CGROUP_PARENT / dev.name
    assert not cg.exists()
    dev.boot()
    pid1 = dev.pid
    dev.kill()
    assert not os.path.exists(f"/proc/{pid1}") and not dev.running()
    # a device a crashed session left running is found from its record and stopped
    dev.boot()
    pid1 = dev.pid
    assert stop_devices(dev.dir.parent) == 1
    assert wait_for(lambda: not os.path.exists(f"/proc/{pid1}"))
    dev.kill()                                             # reaps the unshare process
    assert stop_devices(dev.dir.parent) == 0 and not cg.exists()


@pytest.mark.parametrize("kw,words", [
    (dict(state_dir="/etc/x"), "must not be under /etc"),
    (dict(state_dir="/usr/lib/x", layers={"usr": [Path("/tmp")]}), "must not be under /usr"),
    (dict(state_dir="/tmp/a b"), "must not contain"),
    (dict(state_dir="/tmp/x", address="1.2.3"), "not an IPv4 address"),
    (dict(state_dir="/tmp/x", layers={"proc": [Path("/tmp")]}), "cannot be overlaid"),
    (dict(state_dir="/tmp/x", binds=[(Path("/nonexistent"), "/sys")]), "the source must exist"),
    (dict(state_dir="/tmp/x", default_environment={"A": "b c"}), "plain values only"),
    (dict(state_dir="/tmp/x", default_environment={"A B": "c"}), "plain values only"),
    (dict(state_dir="/tmp/x", units={"../x.service": ""}), "not a unit file name"),
])
def test_device_settings_are_checked(kw, words):
    with pytest.raises(FleetError, match=words):
        SystemdDevice("chk", **kw)
    with pytest.raises(FleetError, match="letters, digits and '-' only"):
        SystemdDevice("a/b", "/tmp/x")
