"""What the hardened colibri.service lets a process do, under a REAL systemd (the host's systemd
252 as PID 1 of an emulated device, colibri_kit/sim/systemd.py).

The unit rendered for orin-nx (templates/colibri.service.j2) is installed with its ExecStart
replaced by a probe (python3) and nothing else changed, so the probe runs in exactly the service's
sandbox and reports what it can reach: a Jetson GPU node of the allow-list opens (read-write, as
the service user through group video), a device node that is not on it does not, no capability,
no new privileges, a seccomp filter that refuses changing the CPU affinity with EPERM, no other
user's processes in /proc, no packet sockets. The real `colibri serve` under the same unit (native
and aarch64 through qemu-user) is tests/test_sim_systemd.py and tests/fleet/test_service_*.py.

Device nodes: the emulated device has no Jetson GPU, so two nodes are made with mknod in its own
/dev: /dev/nvhost-gpu with the numbers of /dev/net/tun and /dev/colibri-test-other with those of
/dev/fuse (both open for any user and need no driver state to open), mode 0660 root:video, as
JetPack's 99-tegra-devices.rules make the real ones."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import pytest

from colibri_kit.profiles import load_profile
from colibri_kit.service import render_sysusers, render_unit
from colibri_kit.sim.systemd import SystemdDevice

pytestmark = [pytest.mark.slow, pytest.mark.root]

PROBE_UNIT = "colibri-probe.service"
PROBE = r'''
import errno, json, os, socket
out = {}
def try_open(path):
    try:
        os.close(os.open(path, os.O_RDWR))
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]
out["gpu_node"] = try_open("/dev/nvhost-gpu")
out["other_node"] = try_open("/dev/colibri-test-other")
out["null"] = try_open("/dev/null")
status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
out["uid"] = os.getuid()
out["groups"] = sorted(os.getgroups())
out["cap_eff"], out["cap_bnd"] = status["CapEff"], status["CapBnd"]
out["no_new_privs"], out["seccomp"] = status["NoNewPrivs"], status["Seccomp"]
try:
    os.sched_setaffinity(0, os.sched_getaffinity(0))
    out["setaffinity"] = "ok"
except OSError as exc:
    out["setaffinity"] = errno.errorcode[exc.errno]
out["pid1_visible"] = os.path.exists("/proc/1/status")
try:
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW).close()
    out["packet_socket"] = "ok"
except OSError as exc:
    out["packet_socket"] = errno.errorcode[exc.errno]
try:
    open("/opt/colibri/written", "w").close()
    out["write_root"] = "ok"
except OSError as exc:
    out["write_root"] = errno.errorcode[exc.errno]
print("PROBE " + json.dumps(out, sort_keys=True), flush=True)
'''


def probe_unit() -> str:
    """The orin-nx unit, its ExecStart replaced by the probe; every other line as rendered."""
    profile = load_profile("orin-nx")
    text = render_unit(profile.service, target="orin-nx")
    lines = [("ExecStart=/usr/bin/python3 /usr/local/lib/colibri-probe.py"
              if line.startswith("ExecStart=") else line) for line in text.splitlines()]
    assert sum(line.startswith("ExecStart=") for line in lines) == 1
    return "\n".join(lines).replace("Restart=on-failure", "Restart=no") + "\n"


@pytest.fixture(scope="module")
def probed() -> dict:
    if os.geteuid() != 0:
        pytest.fail("the systemd emulation needs root (namespaces, overlayfs, cgroups); CI runs as root")
    state = Path(tempfile.mkdtemp(prefix="colibri-sandbox-test-"))
    dev = SystemdDevice("sandbox-00", state / "devices")
    try:
        dev.boot()
        video = dev.run(["getent", "group", "video"]).stdout.split(":")[2]
        for node, numbers in (("/dev/nvhost-gpu", ("10", "200")), ("/dev/colibri-test-other", ("10", "229"))):
            dev.run(["mknod", "-m", "0660", node, "c", *numbers])
            dev.run(["chown", f"root:{video}", node])
        dev.run(["mkdir", "-p", "/opt/colibri"])
        dev.write("/usr/local/lib/colibri-probe.py", PROBE)
        dev.write("/etc/sysusers.d/colibri.conf", render_sysusers(load_profile("orin-nx").service))
        dev.write(f"/etc/systemd/system/{PROBE_UNIT}", probe_unit())
        dev.run(["systemd-sysusers", "/etc/sysusers.d/colibri.conf"])
        dev.run(["systemctl", "daemon-reload"])
        dev.run(["systemctl", "start", PROBE_UNIT])
        for _ in range(600):   # Type=exec: started; the probe's line arrives when it has run
            log = dev.run(["journalctl", "-u", PROBE_UNIT, "-o", "cat", "--no-pager"]).stdout
            found = [line for line in log.splitlines() if line.startswith("PROBE ")]
            if found or dev.systemctl("is-active", PROBE_UNIT, check=False).stdout.strip() == "failed":
                break
            dev.run(["sleep", "0.1"])
        assert found, log + dev.systemctl("status", PROBE_UNIT, check=False).stdout
        result = json.loads(found[-1][len("PROBE "):])
        result["service_uid"] = int(dev.run(["id", "-u", "colibri"]).stdout)
        result["video_gid"] = int(video)
        result["journal"] = log
        yield result
    finally:
        dev.kill()
        shutil.rmtree(state, ignore_errors=True)


def test_a_gpu_node_on_the_allow_list_opens_for_the_service_user(probed):
    assert probed["uid"] == probed["service_uid"] != 0
    assert probed["video_gid"] in probed["groups"]
    assert probed["gpu_node"] == "ok", probed
    assert probed["null"] == "ok"


def test_a_node_off_the_allow_list_is_refused(probed):
    assert probed["other_node"] == "EPERM", probed


def test_no_capabilities_no_new_privileges_and_a_syscall_filter(probed):
    assert int(probed["cap_eff"], 16) == 0 and int(probed["cap_bnd"], 16) == 0, probed
    assert probed["no_new_privs"] == "1" and probed["seccomp"] == "2", probed
    assert probed["setaffinity"] == "EPERM", probed          # @resources is filtered
    assert probed["packet_socket"] == "EAFNOSUPPORT", probed  # RestrictAddressFamilies=


def test_other_processes_are_hidden_and_the_install_root_is_read_only(probed):
    assert probed["pid1_visible"] is False, probed
    assert probed["write_root"] == "EROFS", probed
    assert "Couldn't stat device" not in probed["journal"]
