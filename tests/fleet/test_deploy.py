"""Deploy and status over real SSH against emulated Jetsons: the transport (the real aarch64 binary
under qemu, resumed uploads, dropped connections, a full disk, sudo-less logins) and the CLI. The
deploy logic itself (dry run, rollback, prune, corruption, device kind, failure budget) is tested
in-process in test_local.py.

Every test ends by checking the invariant: `current` points at a complete, verified release."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from colibri_kit.fleet import deploy as D
from colibri_kit.fleet import release as rel
from colibri_kit.fleet.connect import SSHRemote
from colibri_kit.fleet.inventory import write_inventory
from colibri_kit.fleet.status import status
from colibri_kit.profiles import load_profile

from fleet_support import FAULTY, MAIN, SMALL_DISK, XAVIER, fleet_of, rebuilt

pytestmark = [pytest.mark.slow, pytest.mark.root]
ROOT = "/opt/colibri"


@pytest.fixture(scope="module")
def profile():
    return load_profile("orin-nx")


def remote(inventory, name) -> SSHRemote:
    return SSHRemote(inventory.hosts[name], known_hosts=inventory.known_hosts,
                     identity_file=inventory.identity_file)


def assert_current_complete(inventory, name) -> str:
    """`current` resolves to releases/<id> whose every file matches its manifest."""
    with remote(inventory, name) as r:
        cur = rel.current_release(r, ROOT)
        assert cur is not None, f"{name}: current missing"
        assert r.run(["readlink", f"{ROOT}/current"]).stdout.strip() == f"releases/{cur}"
        assert rel.verify_release(r, ROOT, cur) == []
        return cur


def by_host(results):
    return {r.host: r for r in results}


def test_deploy_three_devices_then_noop(inventory, sim_fleet, profile, dist_a, tiny_model) -> None:
    art = D.prepare(load_profile("orin-nx"), dist_a, tiny_model)
    results = D.deploy(fleet_of(inventory, MAIN), art, profile, hooks=D.Hooks())
    assert [r.result for r in results] == ["ok"] * 3, D.results_table(results)
    assert all(r.uploaded >= art.release_bytes + art.model_size for r in results)
    for name in MAIN:
        assert assert_current_complete(inventory, name) == art.release_id
        with remote(inventory, name) as r:
            # the real aarch64 binary runs on the emulated device (qemu via binfmt_misc)
            out = r.run([f"{ROOT}/current/bin/colibri", "--version"], timeout=120).stdout
            assert "target=orin-nx" in out
            assert r.run(["sha256sum", f"{ROOT}/current/model.colibri"]).stdout.split()[0] == art.model_sha
        assert not list(sim_fleet.path_in(name, f"{ROOT}/releases").glob("*.partial*"))
    again = D.deploy(fleet_of(inventory, MAIN), art, profile, hooks=D.Hooks())
    assert [(r.result, r.uploaded) for r in again] == [("unchanged", 0)] * 3, D.results_table(again)


def test_status_reports_release_model_and_device(inventory, profile, dist_a, tiny_model) -> None:
    art = D.prepare(load_profile("orin-nx"), dist_a, tiny_model)
    rows = status(fleet_of(inventory, MAIN + [XAVIER]))
    for row in rows[:3]:
        assert row.reachable and row.release == art.release_id and row.model == art.model_sha[:12]
        assert (row.target, row.l4t) == ("orin-nx", "R36.4.0")   # JetPack 6.1 factory image
        assert "Orin NX" in row.device and row.uptime != "-"
    assert rows[3].reachable and rows[3].release == "-" and rows[3].l4t == "R35.5.0"


def test_unreachable_host_among_healthy_ones_exit_code(inventory, sim_fleet, dist_a, tiny_model, tmp_path) -> None:
    """Through the real `invoke deploy` CLI: the dead host fails, the others are ok, exit 1."""
    fleet_hosts = [inventory.hosts[n] for n in MAIN[:2]] + [replace(inventory.hosts[MAIN[2]], name="dead", port=1)]
    fleet = tmp_path / "fleet.yaml"
    write_inventory(fleet, fleet_hosts, known_hosts=str(inventory.known_hosts),
                    identity_file=str(inventory.identity_file))
    proc = subprocess.run([sys.executable, "-m", "invoke", "deploy", "--target", "orin-nx", "--fleet", str(fleet),
                           "--model", str(tiny_model), "--dist", str(dist_a), "--parallel", "2"],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    table = proc.stdout
    assert "dead" in table and "cannot connect to 127.0.0.1:1" in table
    for n in MAIN[:2]:
        line = next(l for l in table.splitlines() if l.startswith(n))
        assert " ok " in line or " unchanged " in line
    assert "failed on 1 of 3 host(s): dead" in proc.stderr


def test_disk_full_is_refused_before_upload(inventory, sim_fleet, profile, dist_a, big_blob) -> None:
    art = D.prepare(load_profile("orin-nx"), dist_a, big_blob)
    [res] = D.deploy(fleet_of(inventory, [SMALL_DISK]), art, profile, hooks=D.Hooks())
    assert res.result == "failed" and "not enough space" in res.detail and res.uploaded == 0


def test_disk_filling_up_during_upload(inventory, sim_fleet, profile, dist_a, tiny_model, big_blob) -> None:
    """Something else fills the disk after the space check: a real ENOSPC, nothing activated."""
    name = SMALL_DISK
    art = D.prepare(load_profile("orin-nx"), dist_a, tiny_model)
    [first] = D.deploy(fleet_of(inventory, [name]), art, profile, hooks=D.Hooks())
    assert first.result == "ok", first.detail
    before = assert_current_complete(inventory, name)
    filler = sim_fleet.path_in(name, f"{ROOT}/filler")

    def fill(host, label, done, total):
        if not filler.exists():
            with open(filler, "wb") as fh:
                try:
                    while True:
                        fh.write(b"\0" * 65536)
                except OSError:
                    pass
    art2 = D.prepare(load_profile("orin-nx"), rebuilt(dist_a, Path(str(big_blob) + ".d"), "full"),
                     tiny_model)
    [res] = D.deploy(fleet_of(inventory, [name]), art2, profile, hooks=D.Hooks(progress=fill))
    assert res.result == "failed"
    assert "disk full" in res.detail or "No space" in res.detail, res.detail
    assert assert_current_complete(inventory, name) == before
    filler.unlink()
    [res] = D.deploy(fleet_of(inventory, [name]), art2, profile, hooks=D.Hooks())
    assert res.result == "ok", res.detail
    assert not list(sim_fleet.path_in(name, f"{ROOT}/releases").glob("*.partial*"))


def test_connection_killed_mid_upload_resumes(inventory, sim_fleet, profile, dist_a, tiny_model, big_blob) -> None:
    name = FAULTY
    base = D.prepare(load_profile("orin-nx"), dist_a, tiny_model)
    [res] = D.deploy(fleet_of(inventory, [name]), base, profile, hooks=D.Hooks())
    assert res.result == "ok", res.detail
    art = D.prepare(load_profile("orin-nx"), dist_a, big_blob)
    killed = []

    def drop(host, label, done, total):
        if label == "model" and done > total // 2 and not killed:
            killed.append(sim_fleet.kill_sessions(name))
    [res] = D.deploy(fleet_of(inventory, [name]), art, profile, hooks=D.Hooks(progress=drop))
    assert killed and killed[0] >= 1
    assert res.result == "failed", res.detail
    assert assert_current_complete(inventory, name) == base.release_id  # old release stays current
    partial = sim_fleet.path_in(name, f"{ROOT}/models/{art.model_sha}.colibri.partial")
    assert 0 < partial.stat().st_size < art.model_size

    # Drop it again, this time during the release upload: leaves a releases/*.partial-* directory.
    killed.clear()

    def drop_release(host, label, done, total):
        if label == "bin/colibri" and not killed:
            killed.append(sim_fleet.kill_sessions(name))
    [res] = D.deploy(fleet_of(inventory, [name]), art, profile, hooks=D.Hooks(progress=drop_release))
    assert res.result == "failed" and killed
    assert list(sim_fleet.path_in(name, f"{ROOT}/releases").glob("*.partial-*"))
    assert assert_current_complete(inventory, name) == base.release_id
    assert sim_fleet.path_in(name, f"{ROOT}/models/{art.model_sha}.colibri").exists()  # model finished (resumed)

    [res] = D.deploy(fleet_of(inventory, [name]), art, profile, hooks=D.Hooks())
    assert res.result == "ok", res.detail
    assert assert_current_complete(inventory, name) == art.release_id
    assert not list(sim_fleet.path_in(name, f"{ROOT}/releases").glob("*.partial*"))
    assert not list(sim_fleet.path_in(name, f"{ROOT}/models").glob("*.partial"))


def test_resumed_model_upload_sends_only_the_rest(inventory, sim_fleet, profile, dist_a, big_blob, tmp_path) -> None:
    name = FAULTY
    blob = tmp_path / "blob2.colibri"
    blob.write_bytes(big_blob.read_bytes()[: 12 << 20] + b"tail")
    art = D.prepare(load_profile("orin-nx"), dist_a, blob)
    killed = []

    def drop(host, label, done, total):
        if label == "model" and done >= 6 << 20 and not killed:
            killed.append(sim_fleet.kill_sessions(name))
    [res] = D.deploy(fleet_of(inventory, [name]), art, profile, hooks=D.Hooks(progress=drop))
    assert res.result == "failed"
    have = sim_fleet.path_in(name, f"{ROOT}/models/{art.model_sha}.colibri.partial").stat().st_size
    [res] = D.deploy(fleet_of(inventory, [name]), art, profile, hooks=D.Hooks())
    assert res.result == "ok", res.detail
    assert res.uploaded <= art.model_size - have + art.release_bytes


def test_local_build_not_matching_its_manifest_is_refused(dist_a, tmp_path) -> None:
    bad = rebuilt(dist_a, tmp_path / "bad", "bad")
    with open(bad / "bin/colibri", "r+b") as fh:
        fh.seek(100)
        fh.write(b"\xde\xad")
    with pytest.raises(Exception, match="does not match its manifest"):
        D.prepare(load_profile("orin-nx"), bad)


def test_non_root_login_without_write_access_fails_with_the_fix(inventory, profile, dist_a, tiny_model) -> None:
    from colibri_kit.sim.fleet import SIM_USER

    host = replace(inventory.hosts[MAIN[0]], user=SIM_USER)
    art = D.prepare(load_profile("orin-nx"), dist_a, tiny_model)
    [res] = D.deploy(fleet_of(inventory, [host]), art, profile, hooks=D.Hooks())
    assert res.result == "failed"
    assert f"chown {SIM_USER} /opt/colibri" in res.detail and "cannot write /opt/colibri" in res.detail


@pytest.mark.parametrize("hostile", ["../../etc", "x;reboot", "$(id)", "-rf"])
def test_rollback_refuses_hostile_release_ids(sim_fleet, hostile) -> None:
    proc = subprocess.run([sys.executable, "-m", "invoke", "rollback", "--fleet", str(sim_fleet.fleet_file),
                           f"--to={hostile}"],
                          capture_output=True, text=True, cwd=Path(__file__).parents[2], timeout=120)
    assert proc.returncode == 1 and "is not a release id" in proc.stderr, proc.stdout + proc.stderr
