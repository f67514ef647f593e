"""Tuning on emulated devices that behave like real Jetsons (issue "behave like real Jetsons"):
real-format nvpmodel confs per SKU, the v2 nvpmodel/jetson_clocks, the reboot rule from the
masks. In-process (LocalRemote, no root): the emulated ``reboot`` boots the tree at once, so the
managed-reboot flow runs here in milliseconds; tests/fleet/test_reboot.py runs it over real sshd
with devices that really go down.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from colibri_kit.fleet import tune as tunelib
from colibri_kit.fleet.fleet import Fleet
from colibri_kit.fleet.inventory import Host
from colibri_kit.profiles import TuneSpec
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
