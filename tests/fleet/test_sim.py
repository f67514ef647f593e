"""The emulated Jetsons: Jetson files at their real paths inside each device only, a real size-
limited disk, and sim.up / sim.down through the invoke CLI leaving nothing running."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from colibri_kit.errors import FleetError
from colibri_kit.sim import fleet as simlib
from colibri_kit.fleet.connect import SSHRemote

from fleet_support import FAULTY, MAIN, SMALL_DISK, XAVIER

pytestmark = [pytest.mark.slow, pytest.mark.root]


def remote(inventory, name) -> SSHRemote:
    return SSHRemote(inventory.hosts[name], known_hosts=inventory.known_hosts,
                     identity_file=inventory.identity_file)


def test_jetson_files_at_real_paths_inside_the_device_only(inventory, sim_fleet) -> None:
    with remote(inventory, MAIN[0]) as r:
        assert r.read_text("/etc/nv_tegra_release").startswith("# R36 (release)")
        model = r.read_text("/sys/firmware/devicetree/base/model")
        assert model.endswith("\0") and "Orin NX" in model
        assert "nvidia,tegra234" in r.read_text("/sys/firmware/devicetree/base/compatible").split("\0")
        gov = r.read_text("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").strip()
        assert gov in r.read_text("/sys/devices/system/cpu/cpu0/cpufreq/scaling_available_governors").split()
        assert r.run(["test", "-x", "/usr/sbin/nvpmodel", "-a", "-x", "/usr/bin/jetson_clocks"], check=False).ok
        assert r.run(["uname", "-m"]).stdout.strip() == "aarch64"
        assert r.read_text("/etc/os-release") == Path("/etc/os-release").read_text()  # the rest is the host's
    with remote(inventory, XAVIER) as r:
        assert "Xavier NX" in r.read_text("/sys/firmware/devicetree/base/model")
        assert r.read_text("/etc/nv_tegra_release").startswith("# R35 (release)")
    # none of it leaks to the host
    assert not Path("/etc/nv_tegra_release").exists()
    assert not Path("/sys/firmware/devicetree/base/model").exists() or "Orin" not in Path(
        "/sys/firmware/devicetree/base/model").read_text(errors="replace")


def test_each_device_has_its_own_size_limited_disk(inventory, sim_fleet) -> None:
    with remote(inventory, SMALL_DISK) as r:
        total_kb = int(r.run(["df", "-Pk", "/opt/colibri"]).stdout.splitlines()[-1].split()[1])
        assert total_kb == 16 * 1024
        r.write_text("/opt/colibri/marker", "small\n")
    assert sim_fleet.path_in(SMALL_DISK, "/opt/colibri/marker").read_text() == "small\n"
    assert not sim_fleet.path_in(MAIN[0], "/opt/colibri/marker").exists()
    sim_fleet.path_in(SMALL_DISK, "/opt/colibri/marker").unlink()


def test_aarch64_binaries_run_through_binfmt(inventory, orin_nx_build) -> None:
    entry = simlib.ensure_binfmt()
    flags = Path("/proc/sys/fs/binfmt_misc", entry).read_text().split("flags:")[1].split("\n")[0]
    assert "F" in flags  # interpreter opened at registration: works inside every mount namespace
    with remote(inventory, MAIN[0]) as r:
        r.upload(orin_nx_build / "bin/colibri", "/tmp/colibri-binfmt-test")
        r.run(["chmod", "+x", "/tmp/colibri-binfmt-test"])
        assert r.run(["/tmp/colibri-binfmt-test", "--version"], timeout=120).stdout.startswith("colibri ")
        r.run(["rm", "-f", "/tmp/colibri-binfmt-test"])


def test_sim_up_and_down_through_invoke(tmp_path: Path) -> None:
    state = tmp_path / "state"
    cwd = Path(__file__).parents[2]
    up = subprocess.run([sys.executable, "-m", "invoke", "sim.up", "--count", "2", "--state-dir", str(state)],
                        capture_output=True, text=True, cwd=cwd, timeout=120)
    assert up.returncode == 0, up.stderr
    assert "jetson-01" in up.stdout and (state / "fleet.yaml").is_file()

    devices = json.loads((state / "state.json").read_text())["devices"]
    ports = [d["port"] for d in devices]
    for port in ports:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    status = subprocess.run([sys.executable, "-m", "invoke", "status", "--fleet", str(state / "fleet.yaml")],
                            capture_output=True, text=True, cwd=cwd, timeout=120)
    assert status.returncode == 0 and "nothing deployed" in status.stdout, status.stdout + status.stderr
    down = subprocess.run([sys.executable, "-m", "invoke", "sim.down", "--state-dir", str(state)],
                          capture_output=True, text=True, cwd=cwd, timeout=120)
    assert down.returncode == 0 and "stopped 2" in down.stdout
    for d in devices:
        assert simlib._ns_of(d["pid"]) != d["ns"]  # no process left in the device's namespace
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", d["port"]), timeout=2).close()
    again = subprocess.run([sys.executable, "-m", "invoke", "sim.down", "--state-dir", str(state)],
                           capture_output=True, text=True, cwd=cwd, timeout=120)
    assert again.returncode == 0 and "no emulated devices running" in again.stdout


def test_without_root_it_says_what_it_would_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(FleetError, match="needs root: it mounts overlayfs/tmpfs .* starts sshd"):
        simlib.EmulatedFleet(1).up()


def test_device_reboot_keeps_its_files_disk_port_and_host_key(inventory, sim_fleet) -> None:
    """A device's reset button: every process of its OS stops (sshd and the sessions), its mounts
    go, a fresh OS boots on the same disk: /etc, /var and /opt/colibri survive, sysfs starts
    from power-on and nvpmodel's boot applies the recorded mode."""
    device = sim_fleet.device(FAULTY)
    with remote(inventory, FAULTY) as r:
        r.write_bytes("/var/lib/nvpmodel/status", b"pmode:0001\n")      # 10W, live mask 252
        r.write_bytes("/opt/colibri/marker", b"kept across a reboot\n")
        sleeper = int(r.run(["sh", "-c", "sleep 300 </dev/null >/dev/null 2>&1 & echo $!"])
                      .stdout.strip())
        assert Path(f"/proc/{sleeper}").exists()
        r.write_bytes("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor", b"powersave\n")
        boot_id = r.read_text("/proc/sys/kernel/random/boot_id")
    assert boot_id != Path("/proc/sys/kernel/random/boot_id").read_text()   # the device's own
    boots = device.boots
    sim_fleet.reboot(FAULTY)
    assert device.running and device.boots == boots + 1
    # Every process of the old OS is gone (host pids: there is no pid namespace).
    assert not Path(f"/proc/{sleeper}").exists() or \
        b"sleep" not in Path(f"/proc/{sleeper}/cmdline").read_bytes()
    with remote(inventory, FAULTY) as r:  # same port, and the known host key still matches
        # a new boot, as a kernel says it: a new random boot_id (the kit confirms reboots by it)
        assert r.read_text("/proc/sys/kernel/random/boot_id") not in (boot_id, None)
        assert r.read_text("/opt/colibri/marker") == "kept across a reboot\n"
        assert r.read_text("/var/lib/nvpmodel/status").startswith("pmode:0001")
        assert r.read_text("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") == \
            "schedutil\n"                            # sysfs is volatile
        assert r.read_text("/sys/devices/system/cpu/online").strip() == "0-3"   # 10W applied
        r.run(["rm", "-f", "/opt/colibri/marker"])
        r.write_bytes("/var/lib/nvpmodel/status", b"pmode:0002\n")
    sim_fleet.reboot(FAULTY)
    saved = json.loads((sim_fleet.state_dir / "state.json").read_text())["devices"]
    assert [d["pid"] for d in saved if d["name"] == FAULTY] == [device.pid]  # sim.down finds it


def test_a_pinned_namespace_name_is_not_handed_to_a_new_namespace() -> None:
    # Devices are stopped by killing every process of a mount namespace, found by its name
    # ("mnt:[inode]"). The kernel hands a freed inode number to the next namespace at once, so a
    # kill by name that outlives its namespace kills another device's new OS (a rolling reboot
    # lost a device that way in CI). The kill holds the namespace open for as long as it runs.
    def in_new_ns():
        proc = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sleep", "60"])
        for _ in range(500):
            name = simlib._ns_of(proc.pid)
            if name and name != simlib._ns_of(os.getpid()):
                return proc, name
            time.sleep(0.01)
        proc.kill()
        raise AssertionError("unshare did not enter a new mount namespace")

    first, name = in_new_ns()
    try:
        with simlib._pinned_ns(first.pid, "mnt:[0]") as other:
            assert other is None                # a name that is not the process's: nothing held
        with simlib._pinned_ns(first.pid, name) as held:
            assert held == name
            first.kill()
            first.wait()
            assert simlib._pids_in_ns(name) == []
            names = []
            for _ in range(3):
                proc, new = in_new_ns()
                proc.kill()
                proc.wait()
                names.append(new)
            assert name not in names, (name, names)
        with simlib._pinned_ns(first.pid, name) as gone:
            assert gone is None                 # the process is gone: nothing to hold
    finally:
        first.kill()
        first.wait()
