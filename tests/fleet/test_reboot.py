"""A rolling, managed reboot over real sshd: four factory Orin NX devices (15W) tuned to `max`
(MAXN: a reboot, TPC_PG_MASK 252 -> 240). One canary first, then at most two at a time; each
device really goes down (its sshd and sessions stop) and must come back in MAXN within the
deadline. One device never returns: the rollout stops after its batch and the devices not yet
started are left as they were.

The deadline is what a device that never returns costs, so it cannot be generous; a fixed one
(20 s) failed on a loaded machine. It is scaled to this machine now: a multiple of how long one
real reboot of these devices takes here, measured just before the rollout.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from colibri_kit.fleet import tune as tunelib
from colibri_kit.fleet.connect import SSHRemote
from colibri_kit.fleet.fleet import Fleet
from colibri_kit.profiles import TuneSpec

pytestmark = [pytest.mark.slow, pytest.mark.root]

MAX = TuneSpec(nvpmodel_mode="max", jetson_clocks=True, cpu_governor="performance",
               gpu_governor="performance")


@pytest.fixture
def fleet():
    if os.geteuid() != 0:
        pytest.fail("this test starts sshd in mount namespaces and needs root (CI runs as root)")
    from colibri_kit.sim.fleet import EmulatedFleet

    state = Path(tempfile.mkdtemp(prefix="colibri-reboot-test-"))
    try:
        with EmulatedFleet(4, "orin-nx", state) as f:
            yield f
    finally:
        shutil.rmtree(state, ignore_errors=True)


def test_rolling_reboot_stops_after_a_device_that_never_returns(fleet) -> None:
    hosts = fleet.hosts()

    def connect(host):
        return SSHRemote(host, known_hosts=fleet.known_hosts, identity_file=fleet.identity_file)

    f = Fleet(hosts, connect, parallel=4)
    dead = hosts[1].name                    # in the second batch, with hosts[2]
    # How long a reboot takes on this machine now (the dead device's last good one): the
    # rollout's deadline is a multiple of it, at least the 20 s it used to be.
    start = time.monotonic()
    fleet.device(dead).reboot()
    deadline = max(20, round(10 * (time.monotonic() - start)))
    plans = {o.host: o.value for o in f.run(lambda r, h: tunelib.plan(r, MAX))}
    assert all(p.needs_reboot and p.mode.target.name == "MAXN" for p in plans.values())
    fleet.device(dead).never_boot_again()
    boot_ids = {h.name: (Path(fleet.device(h.name).dir) / "boot_id").read_text() for h in hosts}

    results, stopped = tunelib.rollout(f, plans, allow_reboot=True, max_unavailable=2,
                                       reboot_timeout=deadline, poll=0.5)
    by = {o.host: o for o in results}
    assert stopped == dead
    # The canary and the dead device's batch-mate: rebooted once, verified in MAXN, tuned.
    for name in (hosts[0].name, hosts[2].name):
        o = by[name]
        log = Path(fleet.device(name).dir) / "sshd.log"
        assert o.ok and o.value.ok, (name, o.error, o.value and o.value.checks,
                                     log.read_text()[-3000:] if log.exists() else "no log")
        assert "rebooted once into MAXN" in o.value.notes[0]
        assert "confirmed by a new boot_id" in o.value.notes[0]
        assert (Path(fleet.device(name).dir) / "boot_id").read_text() != boot_ids[name]
        assert fleet.device(name).boots == 2
        root = fleet.device(name).faked_root
        assert (root / "sys/devices/platform/gpu.0/tpc_pg_mask").read_text() == "240\n"
        assert (root / "sys/devices/system/cpu/online").read_text().strip() == "0-7"
    # The dead one is reported with the deadline; the last host was never started.
    assert f"{dead}: did not come back in MAXN within {deadline}s" in by[dead].error
    last = hosts[3].name
    assert by[last].skipped and fleet.device(last).boots == 1
    assert (fleet.device(last).faked_root / "var/lib/nvpmodel/status").read_text() \
        == "pmode:0002\n"
    assert not (fleet.device(last).faked_root / "var/lib/colibri-tune").exists()
