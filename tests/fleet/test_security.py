"""The security review's findings (issue 12), each shown against emulated Jetsons: real sshd, real
sudo, a real login user who is not root."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from colibri_kit.errors import FleetError
from colibri_kit.fleet import tune as tunelib
from colibri_kit.profiles import TuneSpec

# A live mode on the factory Orin NX (15W -> 10W keeps the TPC mask): no reboot in these tests.
LIVE = TuneSpec(nvpmodel_mode="min", jetson_clocks=True, cpu_governor="performance",
                gpu_governor="performance")
from colibri_kit.fleet.connect import SUDO_PASSWORD_ENV, SSHRemote
from colibri_kit.fleet.inventory import write_inventory
from colibri_kit.profiles import load_profile
from colibri_kit.sim.fleet import SIM_UID, SIM_USER, EmulatedFleet, stop_state_dir

pytestmark = [pytest.mark.slow, pytest.mark.root]
PROJECT = Path(__file__).resolve().parents[2]
PWN = "/etc/sudoers.d/colibri-pwn"
# The login user's move, played before every step the kit takes: wherever it can write a file
# that a root command will read (a value to copy, a list of targets), it puts its own content.
ATTACK = r"""
for d in /opt/colibri/tune/values /opt/colibri/tune /var/lib/colibri-tune /etc/colibri/tune; do
  for f in "$d"/*; do
    [ -f "$f" ] || continue
    case "$f" in
      *.targets) printf '%s\n' /etc/sudoers.d/colibri-pwn > "$f.new" ;;
      *.json|*.conf) continue ;;
      *) printf 'colibri ALL=(ALL) NOPASSWD: ALL\n' > "$f.new" ;;
    esac
    mv -f "$f.new" "$f"
  done
done 2>/dev/null
true
"""


@pytest.fixture(scope="module")
def fleet():
    """jetson-00: the tune attack, jetson-01: a planted state dir, jetson-02: an endless file."""
    state = Path(tempfile.mkdtemp(prefix="colibri-security-test-"))
    try:
        with EmulatedFleet(3, "orin-nx", state) as f:
            yield f
    finally:
        shutil.rmtree(state, ignore_errors=True)


def _remote(fleet, index: int, user: str) -> SSHRemote:
    host = fleet.hosts(user)[index]
    return SSHRemote(host, known_hosts=fleet.known_hosts, identity_file=fleet.identity_file)


class Racing:
    """A Remote that lets an attacker act before every call the kit makes (the attacker wins
    every race, so the test does not depend on timing)."""

    def __init__(self, inner: SSHRemote, attack) -> None:
        self.inner, self.attack, self.name = inner, attack, inner.name

    def __getattr__(self, name: str):
        value = getattr(self.inner, name)
        if not callable(value):
            return value

        def call(*args, **kw):
            self.attack()
            return value(*args, **kw)
        return call


def test_tune_as_a_login_user_never_lets_it_write_as_root(fleet, monkeypatch) -> None:
    """High: the login owns the device root; tune and restore run as that login with sudo while
    it rewrites every file it can reach between the kit's steps. Nothing it wrote reaches root."""
    name = fleet.devices[0].name
    os.chown(fleet.path_in(name, "/opt/colibri"), SIM_UID, SIM_UID)
    monkeypatch.setenv(SUDO_PASSWORD_ENV, fleet.sudo_password)
    spec = LIVE
    with _remote(fleet, 0, SIM_USER) as login, _remote(fleet, 0, SIM_USER) as attacker:
        attacker.run(["mkdir", "-p", "/opt/colibri/tune/values"])
        racing = Racing(login, lambda: attacker.run(["sh", "-c", ATTACK], timeout=30))
        report = tunelib.apply(racing, tunelib.plan(racing, spec))
        assert not fleet.path_in(name, PWN).exists()
        assert report.ok, report.checks
        tunelib.restore(racing)
    assert not fleet.path_in(name, PWN).exists()
    state = fleet.path_in(name, tunelib.TUNE_DIR)
    assert not state.exists()  # restore removed it
    # Where the kit keeps root's state: root's own directory, closed to the login.
    with _remote(fleet, 0, SIM_USER) as login:
        tunelib.apply(login, tunelib.plan(login, spec))
        st = os.stat(fleet.path_in(name, tunelib.TUNE_DIR))
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o700)
        assert not login.run(["touch", f"{tunelib.TUNE_DIR}/x"], check=False).ok
        tunelib.restore(login)


def test_tune_refuses_a_state_directory_it_does_not_own(fleet, monkeypatch) -> None:
    name = fleet.devices[1].name
    planted = fleet.path_in(name, tunelib.TUNE_DIR)
    planted.mkdir(parents=True)
    os.chown(planted, SIM_UID, SIM_UID)
    with _remote(fleet, 1, "root") as r:
        with pytest.raises(FleetError, match="not a root-only directory"):
            tunelib.apply(r, tunelib.plan(r, LIVE))


def test_a_device_serving_endless_files_fails_alone(fleet, tmp_path: Path) -> None:
    """Medium: /etc/nv_tegra_release -> /dev/zero on one device: status and deploy's identify
    fail on that device only, quickly, with a clear message, and memory stays bounded."""
    bad = fleet.devices[2]
    release = bad.faked_root / "etc/nv_tegra_release"
    release.unlink()
    release.symlink_to("/dev/zero")
    ff = tmp_path / "fleet.yaml"
    write_inventory(ff, fleet.hosts(), known_hosts=str(fleet.known_hosts),
                    identity_file=str(fleet.identity_file))
    limit = 3 << 30  # a run that slurped /dev/zero would hit this instead of the machine's memory

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "invoke", "status", "--fleet", str(ff)],
                          cwd=PROJECT, capture_output=True, text=True, timeout=120,
                          preexec_fn=cap)
    took = time.monotonic() - start
    assert proc.returncode == 1, proc.stdout + proc.stderr
    rows = {line.split()[0]: line for line in proc.stdout.splitlines()[2:] if line.strip()}
    good = [d.name for d in fleet.devices if d.name != bad.name]
    for g in good:
        assert " yes " in rows[g], proc.stdout
    assert " NO " in rows[bad.name]
    assert "/etc/nv_tegra_release" in rows[bad.name] and "more than" in rows[bad.name]
    assert took < 60, took


def test_sim_state_dir_must_be_private(tmp_path: Path) -> None:
    """Medium: sim.up refuses a state directory another user made or others can write; the
    default one is private."""
    foreign = tmp_path / "foreign"
    foreign.mkdir(mode=0o700)
    os.chown(foreign, 12345, 12345)
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    os.chmod(open_dir, 0o777)
    group_dir = tmp_path / "group"
    group_dir.mkdir()
    os.chmod(group_dir, 0o770)
    link = tmp_path / "link"
    link.symlink_to(foreign)
    for state, why in ((foreign, "owned by uid 12345"), (open_dir, "writable by others"),
                       (group_dir, "writable by its group"), (link, "a symbolic link")):
        f = EmulatedFleet(1, "orin-nx", state)
        try:
            with pytest.raises(FleetError, match=why):
                f.up()
        finally:
            f.down()
        assert not (state / "id_ed25519").exists()
    # sim.down believes a state.json (which processes to kill) only in a private directory.
    (foreign / "state.json").write_text('{"devices": [{"name": "x", "module": "orin-nx", '
                                        '"port": 1, "dir": "/", "pid": 1, "ns": "mnt:[1]"}]}')
    with pytest.raises(FleetError, match="owned by uid 12345"):
        stop_state_dir(foreign)
    fresh = tmp_path / "fresh" / "state"
    with EmulatedFleet(1, "orin-nx", fresh):
        st = os.stat(fresh)
        assert (st.st_uid, st.st_mode & 0o777) == (os.geteuid(), 0o700)
