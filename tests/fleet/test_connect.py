"""SSH connections against real sshd: host-key verification, sudo handling, quoting, timeouts."""

from __future__ import annotations

import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest

from colibri_kit.errors import FleetError, HostKeyError
from colibri_kit.fleet.connect import SUDO_PASSWORD_ENV, SSHRemote
from colibri_kit.sim.fleet import SIM_USER

pytestmark = [pytest.mark.slow, pytest.mark.root]


def device_fingerprint(sim_fleet, name: str) -> str:
    pub = Path(sim_fleet.device(name).dir) / "ssh_host_ed25519_key.pub"
    return subprocess.run(["ssh-keygen", "-lf", str(pub)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


def remote_for(inventory, name: str, known_hosts: Path | None = None, **kw) -> SSHRemote:
    return SSHRemote(inventory.hosts[name], known_hosts=known_hosts or inventory.known_hosts,
                     identity_file=inventory.identity_file, **kw)


def test_known_host_connects_and_runs(inventory) -> None:
    with remote_for(inventory, "jetson-00") as r:
        res = r.run(["uname", "-m"])
        assert res.ok and res.stdout.strip() == "aarch64"
        assert r.read_text("/no/such/file") is None


def test_unknown_host_key_is_refused_with_fingerprint(inventory, sim_fleet, tmp_path: Path) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    with pytest.raises(HostKeyError) as exc:
        remote_for(inventory, "jetson-01", known_hosts=empty).connect()
    assert device_fingerprint(sim_fleet, "jetson-01") in str(exc.value)
    assert "--accept-new-host-keys" in str(exc.value)
    assert empty.read_text() == ""  # nothing recorded without the flag


def test_accept_new_records_the_key_once(inventory, sim_fleet, tmp_path: Path) -> None:
    kh = tmp_path / "known_hosts"
    with remote_for(inventory, "jetson-01", known_hosts=kh, accept_new=True) as r:
        assert r.run(["true"]).ok
    port = sim_fleet.device("jetson-01").port
    lines = kh.read_text().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"[127.0.0.1]:{port} ssh-ed25519 ")
    # Now known: connecting without the flag works and records nothing more.
    with remote_for(inventory, "jetson-01", known_hosts=kh) as r:
        assert r.run(["true"]).ok
    assert kh.read_text().splitlines() == lines


def test_changed_host_key_is_refused_even_with_accept_new(inventory, sim_fleet, tmp_path: Path) -> None:
    other = tmp_path / "other_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    port = sim_fleet.device("jetson-02").port
    kh = tmp_path / "known_hosts"
    kh.write_text(f"[127.0.0.1]:{port} " + " ".join(Path(f"{other}.pub").read_text().split()[:2]) + "\n")
    before = kh.read_text()
    for accept in (False, True):
        with pytest.raises(HostKeyError) as exc:
            remote_for(inventory, "jetson-02", known_hosts=kh, accept_new=accept).connect()
        msg = str(exc.value)
        assert "CHANGED" in msg
        assert device_fingerprint(sim_fleet, "jetson-02") in msg
        assert device_fingerprint(sim_fleet, "jetson-02") != subprocess.run(
            ["ssh-keygen", "-lf", f"{other}.pub"], capture_output=True, text=True).stdout.split()[1]
    assert kh.read_text() == before


def test_unreachable_host_fails_cleanly(inventory) -> None:
    host = replace(inventory.hosts["jetson-00"], name="gone", port=1)
    with pytest.raises(FleetError, match="gone: cannot connect to 127.0.0.1:1"):
        SSHRemote(host, known_hosts=inventory.known_hosts, identity_file=inventory.identity_file).connect()


def test_arguments_are_quoted_not_interpreted(inventory, sim_fleet) -> None:
    marker = "/tmp/colibri-pwned"
    hostile = [f"; touch {marker}", f"$(touch {marker})", f"`touch {marker}`", f"a' ; touch {marker} '",
               "line\nbreak", "--", "*"]
    with remote_for(inventory, "jetson-00") as r:
        res = r.run(["printf", "%s|", *hostile])
        assert res.stdout == "".join(h + "|" for h in hostile)
        assert not r.run(["test", "-e", marker], check=False).ok
    assert not sim_fleet.path_in("jetson-00", marker).exists()


def test_timeout_stops_a_hanging_command(inventory) -> None:
    with remote_for(inventory, "jetson-00") as r:
        start = time.monotonic()
        with pytest.raises(FleetError, match="did not finish within 1s"):
            r.run(["sleep", "30"], timeout=1)
        assert time.monotonic() - start < 10
        # stdin is closed: a command reading it sees EOF instead of waiting
        assert r.run(["cat"], timeout=10).stdout == ""


def test_failed_command_names_host_command_and_stderr(inventory) -> None:
    with remote_for(inventory, "jetson-00") as r:
        with pytest.raises(FleetError, match=r"jetson-00: `ls /no/such` exited 2: .*No such file"):
            r.run(["ls", "/no/such"])


def test_root_login_needs_no_sudo(inventory) -> None:
    with remote_for(inventory, "jetson-00") as r:
        assert r.command_line(["id", "-u"], sudo=True) == "id -u"
        assert r.run(["id", "-u"], sudo=True).stdout.strip() == "0"


def test_sudo_without_password_fails_fast(inventory, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(SUDO_PASSWORD_ENV, raising=False)
    host = replace(inventory.hosts["jetson-00"], user=SIM_USER)
    with SSHRemote(host, known_hosts=inventory.known_hosts, identity_file=inventory.identity_file) as r:
        assert r.run(["id", "-u"]).stdout.strip() != "0"
        assert r.command_line(["id", "-u"], sudo=True) == "sudo -n -- id -u"
        with pytest.raises(FleetError) as exc:
            r.run(["id", "-u"], sudo=True, timeout=20)  # a prompt would end in a timeout instead
        assert "needs a password" in str(exc.value) and SUDO_PASSWORD_ENV in str(exc.value)


def test_sudo_with_password_from_environment(inventory, sim_fleet, monkeypatch: pytest.MonkeyPatch) -> None:
    host = replace(inventory.hosts["jetson-00"], user=SIM_USER)
    monkeypatch.setenv(SUDO_PASSWORD_ENV, sim_fleet.sudo_password)
    with SSHRemote(host, known_hosts=inventory.known_hosts, identity_file=inventory.identity_file) as r:
        line = r.command_line(["id", "-u"], sudo=True)
        assert sim_fleet.sudo_password not in line  # the password never appears in a command line
        assert r.run(["id", "-u"], sudo=True).stdout.strip() == "0"
        r.write_text("/etc/colibri-sudo-test", "written as root\n", sudo=True)
        assert r.run(["stat", "-c", "%U", "/etc/colibri-sudo-test"]).stdout.strip() == "root"
        r.run(["rm", "-f", "/etc/colibri-sudo-test"], sudo=True)
    monkeypatch.setenv(SUDO_PASSWORD_ENV, "wrong-password")
    with SSHRemote(host, known_hosts=inventory.known_hosts, identity_file=inventory.identity_file) as r:
        with pytest.raises(FleetError, match="needs a password"):
            r.run(["id", "-u"], sudo=True, timeout=30)


def test_accept_new_without_a_project_file_says_where_to_record(inventory, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.ssh/known_hosts either
    r = SSHRemote(inventory.hosts["jetson-00"], known_hosts=None, identity_file=inventory.identity_file,
                  accept_new=True)
    with pytest.raises(HostKeyError, match="add 'known_hosts: fleet_known_hosts' to the fleet file"):
        r.connect()
    assert not (tmp_path / ".ssh").exists()


def test_proxyjump_hops_verify_host_keys(inventory, sim_fleet, tmp_path: Path, monkeypatch) -> None:
    """Low: a ProxyJump host from ~/.ssh/config is verified like the last hop (Fabric gives each
    hop AutoAddPolicy). Two real sshds: jetson-00 is the jump host for jetson-01."""
    jump, target = sim_fleet.device("jetson-00"), sim_fleet.device("jetson-01")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    # Fabric skips a hop whose host equals the target's, so the target is named "localhost".
    (home / ".ssh/config").write_text(
        f"Host via-jump\n  HostName localhost\n  ProxyJump root@127.0.0.1:{jump.port}\n\n"
        f"Host 127.0.0.1\n  IdentityFile {sim_fleet.identity_file}\n")
    monkeypatch.setenv("HOME", str(home))

    def line(name: str, device) -> str:
        key = (Path(device.dir) / "ssh_host_ed25519_key.pub").read_text().split()
        return f"[{name}]:{device.port} {key[0]} {key[1]}\n"
    kh = tmp_path / "known_hosts"
    kh.write_text(line("localhost", target))  # the jump host's key is not known
    host = replace(inventory.hosts["jetson-01"], address="via-jump")
    with pytest.raises(HostKeyError) as exc:
        SSHRemote(host, known_hosts=kh, identity_file=inventory.identity_file).connect()
    assert device_fingerprint(sim_fleet, "jetson-00") in str(exc.value)
    assert kh.read_text() == line("localhost", target)  # nothing recorded
    kh.write_text(line("localhost", target) + line("127.0.0.1", jump))
    with SSHRemote(host, known_hosts=kh, identity_file=inventory.identity_file) as r:
        assert r.run(["cat", "/etc/hostname"]).ok
        # the session runs on jetson-01: its sshd is the one that answered through the jump
        assert r.run(["sh", "-c", "echo $SSH_CONNECTION"]).stdout.split()[-1] == str(target.port)


def test_device_ports_are_outside_the_ephemeral_range(sim_fleet) -> None:
    """A rebooting device's sshd must be able to bind its port again: one in the ephemeral range
    can meanwhile be any outgoing connection's source port (a CI run lost a device so). Each
    device's port lies below the kernel's range, and no two devices share one."""
    low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [d.port for d in sim_fleet.devices]
    assert all(p < low for p in ports), (ports, low, high)
    assert len(set(ports)) == len(ports)
    # A port held as an outgoing connection's source is what sshd met: bind fails with it.
    import socket
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        with socket.create_connection(server.getsockname()) as client:
            taken = client.getsockname()[1]
            assert low <= taken <= high
            with socket.socket() as again:
                again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                with pytest.raises(OSError):
                    again.bind(("127.0.0.1", taken))
