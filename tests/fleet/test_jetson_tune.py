"""Tuning on emulated devices that behave like real Jetsons (issue "behave like real Jetsons"):
real-format nvpmodel confs per SKU, the v2 nvpmodel/jetson_clocks, the reboot rule from the
masks. In-process (LocalRemote, no root): the emulated ``reboot`` boots the tree at once, so the
managed-reboot flow runs here in milliseconds; tests/fleet/test_reboot.py runs it over real sshd
with devices that really go down.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from colibri_kit.fleet import tune as tunelib
from colibri_kit.fleet.fleet import Fleet
from colibri_kit.fleet.inventory import Host
from colibri_kit.profiles import TuneSpec
from colibri_kit.sim import device_files
from colibri_kit.sim.local import LocalRemote, local_device


def spec(mode, jetson_clocks=True) -> TuneSpec:
    return TuneSpec(nvpmodel_mode=mode, jetson_clocks=jetson_clocks, cpu_governor="performance",
                    gpu_governor="performance")


def tree(dev: LocalRemote) -> dict[str, bytes]:
    """Every regular file of the device's faked sysfs and nvpmodel state."""
    out = {}
    for top in ("sys", "var/lib/nvpmodel"):
        for p in sorted((dev.root / top).rglob("*")):
            if p.is_file() and not p.is_symlink():
                out[str(p.relative_to(dev.root))] = p.read_bytes()
    return out


def fleet_of(devices: dict[str, LocalRemote]) -> Fleet:
    hosts = [Host(name=n, address="127.0.0.1", target="orin-nx") for n in devices]
    return Fleet(hosts, connect=lambda h: devices[h.name])


@pytest.fixture
def orin_nx(tmp_path: Path) -> LocalRemote:
    return local_device(tmp_path / "nx", "orin-nx", name="nx")


def test_factory_orin_nx_max_is_maxn_and_needs_a_reboot(orin_nx):
    p = tunelib.plan(orin_nx, spec("max"))
    assert (p.state.mode_name, p.mode.target.name, p.mode.reboot) == ("15W", "MAXN", True)
    assert "max: MAXN has no power budget" in p.steps[0] and "needs a reboot" in p.steps[0]


def test_without_allow_reboot_nothing_changes_and_the_report_says_so(orin_nx):
    before = tree(orin_nx)
    p = tunelib.plan(orin_nx, spec("max"))
    r = tunelib.apply(orin_nx, p, allow_reboot=False)
    assert r.mode is tunelib.ModeSwitch.NEEDS_REBOOT and not r.ok
    assert "needs a reboot: not applied" in r.notes[0]
    assert "jetson_clocks and governors not applied" in r.notes[0]
    assert tree(orin_nx) == before
    assert not orin_nx.path(tunelib.TUNE_DIR).exists()


def test_orin_nx_15w_to_10w_is_live_and_verified(orin_nx):
    p = tunelib.plan(orin_nx, spec("min"))
    assert (p.mode.target.name, p.mode.reboot) == ("10W", False)
    r = tunelib.apply(orin_nx, p, allow_reboot=False)
    assert r.ok, r.checks
    assert r.mode is tunelib.ModeSwitch.DONE
    assert tunelib.read_state(orin_nx).mode_name == "10W"


def test_agx_orin_30w_to_maxn_needs_a_reboot(tmp_path):
    agx = local_device(tmp_path / "agx", "agx-orin", name="agx")
    p = tunelib.plan(agx, spec("MAXN"))
    assert (p.state.mode_name, p.mode.reboot) == ("MODE_30W", True)
    p50 = tunelib.plan(agx, spec("MODE_50W"))
    assert p50.mode.reboot is True          # 240 -> 0 as well


def test_jetpack_62_orin_nx_resolves_the_list_to_maxn_super(tmp_path):
    sup = local_device(tmp_path / "sup", "orin-nx-16gb-super", name="sup")
    p = tunelib.plan(sup, spec(("MAXN_SUPER", "MAXN")))
    assert p.mode.target.name == "MAXN_SUPER"
    assert tunelib.plan(sup, spec("max")).mode.target.name == "MAXN_SUPER"
    # The same list on a JetPack 6.1 conf falls back to MAXN and says why.
    p61 = tunelib.plan(local_device(tmp_path / "61", "orin-nx", name="61"),
                       spec(("MAXN_SUPER", "MAXN")))
    assert p61.mode.target.name == "MAXN" and "MAXN_SUPER not on this device" in p61.mode.reason


def test_an_unknown_name_is_refused_naming_the_modes(orin_nx):
    with pytest.raises(tunelib.TuneRefused, match=r"no mode named MAXN_SUPER .*15W"):
        tunelib.plan(orin_nx, spec("MAXN_SUPER"))


def test_rollout_reboots_once_then_verifies_maxn_and_applies_the_rest(orin_nx):
    f = fleet_of({"nx": orin_nx})
    plans = {"nx": tunelib.plan(orin_nx, spec("max"))}
    results, stopped = tunelib.rollout(f, plans, allow_reboot=True, poll=0.05,
                                       reboot_timeout=20)
    [o] = results.outcomes
    assert stopped is None and o.ok and o.value.ok, (o.error, o.value and o.value.checks)
    assert o.value.mode is tunelib.ModeSwitch.REBOOTING
    assert "rebooted once into MAXN" in o.value.notes[0]
    assert orin_nx.path("/sys/devices/platform/gpu.0/tpc_pg_mask").read_text().strip() == "240"
    st = tunelib.read_state(orin_nx)
    assert st.mode_name == "MAXN" and st.cpus_online == list(range(8))
    assert st.jetson_clocks_active and st.gpu_governors == {"17000000.gpu": "performance"}
    # Tuned again: nothing to do, verified.
    again = tunelib.plan(orin_nx, spec("max"))
    assert not again.mode.change and not again.needs_reboot


def test_thor_tunes_both_gpu_domains(tmp_path):
    thor = local_device(tmp_path / "thor", "agx-thor", name="thor")
    p = tunelib.plan(thor, spec("MAXN"))
    assert p.state.gpu_nodes == ["gpu-gpc-0", "gpu-nvd-0"]    # not the VIC
    assert p.mode.reboot is False                             # 120W -> MAXN: same mask
    r = tunelib.apply(thor, p)
    assert r.ok, r.checks
    labels = {c.what for c in r.checks}
    assert {"gpu governor gpu-gpc-0", "gpu governor gpu-nvd-0", "gpu Hz gpu-gpc-0",
            "gpu Hz gpu-nvd-0"} <= labels
    d = "sys/devices/platform/bus@0/d0b0000000.gpu/devfreq"
    for node in ("gpu-gpc-0", "gpu-nvd-0"):
        assert (thor.root / d / node / "governor").read_text().strip() == "performance"
    vic = thor.root / "sys/devices/platform/15340000.vic/devfreq/15340000.vic/governor"
    assert vic.read_text().strip() == "nvhost_podgov"
    rr = tunelib.restore(thor)
    assert rr.outcome is tunelib.Restored.RESTORED, rr.notes
    for node in ("gpu-gpc-0", "gpu-nvd-0"):
        assert (thor.root / d / node / "governor").read_text().strip() == "nvhost_podgov"


def test_restore_reads_jetson_clocks_failures_despite_exit_0(orin_nx):
    p = tunelib.plan(orin_nx, spec("15W"))
    assert tunelib.apply(orin_nx, p).ok
    store = orin_nx.path(tunelib.TUNE_DIR + "/l4t_dfs.conf")
    store.write_text(store.read_text() + "/sys/does/not/exist:5\n")
    r = tunelib.restore(orin_nx)
    assert r.outcome is tunelib.Restored.INCOMPLETE
    assert "failed to restore /sys/does/not/exist" in r.notes[0]
    assert store.exists()       # kept for a later restore
    assert tunelib.restore_failures("Error: Failed to restore /a\nok\n") == ["/a"]


# ----------------------------------------------------------------------------------------------
# Issue 21 item 2: a pending switch is a reboot; the device's own answer wins over the plan both
# ways; a reboot is confirmed by a new boot_id. Three devices at once in each test.

BOOT_ID = "/proc/sys/kernel/random/boot_id"
MASK = "/sys/devices/platform/gpu.0/tpc_pg_mask"


class Watched:
    """A LocalRemote that counts how many devices are down at once: from the command that
    reboots one (nvpmodel's YES, or ``reboot``) until a read of a new boot_id. The reboot itself
    is made slow (in-process it is instant), so devices allowed to overlap do."""

    down: set[str] = set()
    peak = 0

    def __init__(self, inner: LocalRemote, boot_ids: dict[str, str]) -> None:
        self.inner, self.name, self.boot_ids = inner, inner.name, boot_ids

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def run(self, argv, **kw):
        argv = list(argv)
        going_down = argv[:1] == ["reboot"] or (argv[:2] == ["sh", "-c"] and "YES" in argv[2])
        if going_down:
            Watched.down.add(self.name)
            Watched.peak = max(Watched.peak, len(Watched.down))
        res = self.inner.run(argv, **kw)
        if going_down:
            time.sleep(0.3)
        return res

    def read_text(self, path, **kw):
        text = self.inner.read_text(path, **kw)
        if path == BOOT_ID and text and text.strip() != self.boot_ids[self.name]:
            Watched.down.discard(self.name)
        return text

    def __getattr__(self, attr):
        return getattr(self.inner, attr)


def devices(tmp_path: Path, n: int = 3) -> dict[str, LocalRemote]:
    return {f"nx{i}": local_device(tmp_path / f"nx{i}", "orin-nx", name=f"nx{i}") for i in range(n)}


def boot_ids(devs: dict[str, LocalRemote]) -> dict[str, str]:
    return {n: d.path(BOOT_ID).read_text().strip() for n, d in devs.items()}


def make_pending(dev: LocalRemote, mode_id: int = 0) -> None:
    """A switch accepted earlier whose reboot never happened: nvpmodel's status names the mode,
    the GPU still runs the 15W mask (252)."""
    dev.path("/var/lib/nvpmodel/status").write_text(f"pmode:{mode_id:04d}\n")


def watched_fleet(devs: dict[str, LocalRemote]) -> Fleet:
    ids = boot_ids(devs)
    Watched.down, Watched.peak = set(), 0
    hosts = [Host(name=n, address="127.0.0.1", target="orin-nx") for n in devs]
    return Fleet(hosts, connect=lambda h: Watched(devs[h.name], ids), parallel=len(devs))


def test_a_pending_switch_is_a_reboot_that_needs_consent_and_keeps_the_limit(tmp_path):
    devs = devices(tmp_path)
    for d in devs.values():
        make_pending(d)                                   # status MAXN, live mask 252
    before = boot_ids(devs)
    f = watched_fleet(devs)
    plans = {n: tunelib.plan(d, spec("MAXN")) for n, d in devs.items()}
    assert all(p.needs_reboot and p.mode.pending for p in plans.values())
    assert "accepted earlier and waits for a reboot" in plans["nx0"].steps[0]
    # Without --allow-reboot: none reboots, each is reported, nothing is left behind.
    results, stopped = tunelib.rollout(f, plans, allow_reboot=False)
    assert boot_ids(devs) == before and Watched.peak == 0
    for o in results:
        assert o.value.mode is tunelib.ModeSwitch.NEEDS_REBOOT and not o.value.ok
        assert "waits for its reboot: not applied" in o.value.notes[0], o.value.notes
        assert not devs[o.host].path(tunelib.TUNE_DIR).exists()
    # With it: one at a time (the limit), each confirmed by a new boot_id, MAXN really live.
    results, stopped = tunelib.rollout(watched_fleet(devs), plans, allow_reboot=True,
                                       max_unavailable=1, poll=0.05, reboot_timeout=60)
    assert stopped is None and all(o.ok and o.value.ok for o in results), \
        [(o.host, o.error, o.value and o.value.notes) for o in results]
    assert Watched.peak == 1
    after = boot_ids(devs)
    for n, d in devs.items():
        assert after[n] != before[n]
        assert d.path(MASK).read_text().strip() == "240"
        assert "confirmed by a new boot_id" in [o for o in results if o.host == n][0].value.notes[0]


def test_a_pending_device_takes_a_live_switch_when_its_mask_allows_one(tmp_path):
    """Status MAXN (240) pending, the GPU runs 252: 10W (252) is a live switch, taken as such on
    every device, with or without --allow-reboot: no reboot, the pending MAXN is gone."""
    devs = devices(tmp_path)
    for d in devs.values():
        make_pending(d)
    before = boot_ids(devs)
    plans = {n: tunelib.plan(d, spec("10W")) for n, d in devs.items()}
    assert all(p.mode.pending and not p.needs_reboot for p in plans.values())
    assert "a live switch to 10W, whose mask is the live one, replaces it" in plans["nx1"].steps[0]
    results, _ = tunelib.rollout(watched_fleet(devs), plans, allow_reboot=True, poll=0.05)
    assert all(o.ok and o.value.ok and o.value.mode is tunelib.ModeSwitch.DONE for o in results), \
        [(o.host, o.error, o.value and o.value.checks) for o in results]
    assert boot_ids(devs) == before and Watched.peak == 0
    for d in devs.values():
        st = tunelib.read_state(d)
        assert (st.mode_name, st.live_tpc_mask, st.pending) == ("10W", "252", False)


def test_the_device_asking_for_a_reboot_wins_over_a_live_plan(tmp_path):
    """Planned 15W -> 10W (live); before the apply two devices were rebooted into MAXN (mask
    240) by someone else, so their nvpmodel now asks for a reboot. Without --allow-reboot they
    are reported and untouched; with it they join the rolling reboots (one at a time) and come
    back in 10W, while the third switches live."""
    for allow in (False, True):
        devs = devices(tmp_path / str(allow))
        plans = {n: tunelib.plan(d, spec("10W")) for n, d in devs.items()}
        assert not any(p.needs_reboot for p in plans.values())
        for n in ("nx0", "nx2"):
            make_pending(devs[n])
            device_files.boot(devs[n].root)              # boots into MAXN: mask 240 is live
        before = boot_ids(devs)
        results, stopped = tunelib.rollout(watched_fleet(devs), plans, allow_reboot=allow,
                                           max_unavailable=1, poll=0.05, reboot_timeout=60)
        by = {o.host: o for o in results}
        assert by["nx1"].value.ok and by["nx1"].value.mode is tunelib.ModeSwitch.DONE
        assert tunelib.read_state(devs["nx1"]).mode_name == "10W"
        after = boot_ids(devs)
        assert after["nx1"] == before["nx1"]
        for n in ("nx0", "nx2"):
            if not allow:
                r = by[n].value
                assert r.mode is tunelib.ModeSwitch.NEEDS_REBOOT and r.device_asked and not r.ok
                assert r.notes[0].startswith("the device asked for a reboot, the plan predicted")
                assert tunelib.read_state(devs[n]).mode_name == "MAXN"
                assert after[n] == before[n] and Watched.peak == 0
                assert not devs[n].path(tunelib.TUNE_DIR).exists()
            else:
                assert by[n].ok and by[n].value.ok, (by[n].error, by[n].value and by[n].value.notes)
                assert by[n].value.mode is tunelib.ModeSwitch.REBOOTING and after[n] != before[n]
                st = tunelib.read_state(devs[n])
                assert (st.mode_name, st.live_tpc_mask) == ("10W", "252")
        if allow:
            assert stopped is None and Watched.peak == 1


def test_a_device_that_switches_live_wins_over_a_reboot_plan(tmp_path):
    """Planned 15W -> MAXN (a reboot); before the apply the devices were rebooted into 25W (mask
    240, MAXN's), so nvpmodel switches to MAXN live: no reboot, even without --allow-reboot."""
    devs = devices(tmp_path)
    plans = {n: tunelib.plan(d, spec("MAXN")) for n, d in devs.items()}
    assert all(p.needs_reboot for p in plans.values())
    for d in devs.values():
        make_pending(d, 3)                             # 25W
        device_files.boot(d.root)
    before = boot_ids(devs)
    for allow in (False, True):
        results, _ = tunelib.rollout(watched_fleet(devs), plans, allow_reboot=allow, poll=0.05)
        assert all(o.ok and o.value.ok for o in results), \
            [(o.host, o.error, o.value and o.value.notes) for o in results]
        assert boot_ids(devs) == before and Watched.peak == 0
        for d in devs.values():
            assert tunelib.read_state(d).mode_name == "MAXN"


def test_a_reboot_is_confirmed_by_a_new_boot_id_not_by_the_reported_mode(tmp_path):
    """A device whose reboot does nothing and whose GPU mask cannot be read (so the mode looks
    right once nvpmodel recorded it): without a new boot_id it is not taken as rebooted."""
    devs = devices(tmp_path, 1)
    d = devs["nx0"]
    d.path("/usr/sbin/reboot").write_text("#!/bin/sh\nexit 0\n")     # never goes down
    d.path(MASK).unlink()
    plans = {"nx0": tunelib.plan(d, spec("MAXN"))}
    assert plans["nx0"].needs_reboot                   # 15W (252) -> MAXN (240) by the conf
    results, stopped = tunelib.rollout(watched_fleet(devs), plans, allow_reboot=True, poll=0.05,
                                       reboot_timeout=1)
    [o] = results.outcomes
    assert stopped == "nx0" and not o.ok
    assert "did not come back in MAXN within 1s" in o.error and "has not rebooted yet" in o.error
    assert tunelib.read_state(d).mode_name == "MAXN"  # what nvpmodel reports: not enough


def test_restore_rolls_its_reboots_within_the_limit(tmp_path):
    """Three devices tuned into MAXN (a reboot each); restoring 15W is a reboot again: without
    --allow-reboot the record is kept, with it they go one at a time, each back from a new boot."""
    devs = devices(tmp_path)
    plans = {n: tunelib.plan(d, spec("MAXN")) for n, d in devs.items()}
    results, _ = tunelib.rollout(watched_fleet(devs), plans, allow_reboot=True, max_unavailable=3,
                                 poll=0.05, reboot_timeout=60)
    assert all(o.ok and o.value.ok for o in results)
    tuned = boot_ids(devs)
    results, stopped = tunelib.restore_fleet(watched_fleet(devs), allow_reboot=False)
    assert all(o.value.outcome is tunelib.Restored.INCOMPLETE and o.value.needs_reboot
               for o in results) and boot_ids(devs) == tuned
    results, stopped = tunelib.restore_fleet(watched_fleet(devs), allow_reboot=True,
                                             max_unavailable=1, poll=0.05, reboot_timeout=60)
    assert stopped is None and Watched.peak == 1
    assert all(o.ok and o.value.outcome is tunelib.Restored.RESTORED for o in results), \
        [(o.host, o.error, o.value and o.value.notes) for o in results]
    after = boot_ids(devs)
    for n, d in devs.items():
        assert after[n] != tuned[n] and "rebooted once into 15W" in \
            [o for o in results if o.host == n][0].value.notes[0]
        assert tunelib.read_state(d).mode_name == "15W" and not d.path(tunelib.TUNE_DIR).exists()
