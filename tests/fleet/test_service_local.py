"""The deploy's service decisions in-process (LocalRemote, no root, no systemd): which files are
written, what is run, when `current` goes back, what the table says. systemd and the service are
stand-ins here (small scripts on the device's PATH whose unit is "failed" when the current
release's model is bad); the real systemd, sshd and `colibri serve` are in test_service_deploy.py."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from colibri_kit.fleet import deploy as D
from colibri_kit.fleet import release as rel
from colibri_kit.fleet import service as svc
from colibri_kit.fleet.fleet import Fleet
from colibri_kit.fleet.inventory import Host
from colibri_kit.profiles import load_profile
from colibri_kit.service import ServiceSpec, render_unit
from colibri_kit.sim.local import LocalRemote, local_device

from test_local import make_dist

ROOT = "/opt/colibri"
SPEC = ServiceSpec(port=8080, model_id="tiny", restart_sec=0.5)

# Stand-ins: the unit becomes "failed" (start limit hit) when current/model.colibri starts with
# BAD, as `colibri serve` exits 1 on a model it cannot load; otherwise it is "active".
SYSTEMCTL = r"""#!/bin/sh
S="$COLIBRI_SIM_ROOT/var/lib/stand-in-systemd"; mkdir -p "$S"; echo "$*" >> "$S/calls"
state() { cat "$S/state" 2>/dev/null || echo inactive; }
case "$1" in
  restart|start)
    if head -c 3 "$COLIBRI_SIM_ROOT/opt/colibri/current/model.colibri" | grep -q BAD
    then echo failed > "$S/state"; else echo active > "$S/state"; fi ;;
  stop) echo inactive > "$S/state" ;;
  disable) [ "$2" = --now ] && echo inactive > "$S/state"; true ;;
  reset-failed) [ "$(state)" = failed ] && echo inactive > "$S/state"; true ;;
  is-failed) state; [ "$(state)" = failed ] ;;
  is-active) [ "$(state)" = active ] ;;
  *) true ;;
esac
"""
CURL = r"""#!/bin/sh
st=$(cat "$COLIBRI_SIM_ROOT/var/lib/stand-in-systemd/state" 2>/dev/null)
case " $* " in
  *" -d "*) [ "$st" = active ] && echo '{"choices": [{"token_ids": [5]}]}' || exit 7 ;;
  *) if [ "$st" = active ]; then printf 200; else printf 000; exit 7; fi ;;
esac
"""
JOURNALCTL = "#!/bin/sh\necho 'colibri serve: cannot load /opt/colibri/current/model.colibri: bad magic'\n"


def stand_in(root: Path, name: str, text: str) -> None:
    path = root / "usr/bin" / name
    path.write_text(text)
    path.chmod(0o755)


@pytest.fixture
def device(tmp_path: Path) -> LocalRemote:
    dev = local_device(tmp_path / "device", "orin-nx", name="cab-01")
    (dev.root / "run/systemd/system").mkdir(parents=True)     # sd_booted(): systemd is PID 1
    for name, text in (("systemctl", SYSTEMCTL), ("curl", CURL), ("journalctl", JOURNALCTL),
                       ("systemd-sysusers", "#!/bin/sh\nexit 0\n")):
        stand_in(dev.root, name, text)
    return dev


@pytest.fixture
def fleet(device: LocalRemote) -> Fleet:
    return Fleet([Host(name="cab-01", address="192.0.2.11", target="orin-nx", root=ROOT)],
                 connect=lambda h: device)


@pytest.fixture
def profile():
    return load_profile("orin-nx")


def model(tmp_path: Path, name: str, good: bool) -> Path:
    path = tmp_path / f"{name}.colibri"
    path.write_bytes((b"GOOD" if good else b"BAD!") + name.encode() * 16)
    return path


def calls(dev: LocalRemote) -> list[str]:
    path = dev.root / "var/lib/stand-in-systemd/calls"
    return path.read_text().splitlines() if path.exists() else []


def deploy(fleet, tmp_path, profile, tag: str, good: bool, service=SPEC) -> D.HostResult:
    dist = tmp_path / f"dist-{tag}"
    art = D.prepare(profile, dist if dist.exists() else make_dist(dist, tag), model(tmp_path, tag, good))
    return D.deploy(fleet, art, profile, hooks=D.Hooks(), service=service, gate_timeout=5)[0]


def test_healthy_deploy_installs_restarts_and_gates(device, fleet, tmp_path, profile):
    r = deploy(fleet, tmp_path, profile, "a", good=True)
    assert (r.result, r.service) == ("ok", "healthy"), r
    assert r.column("downtime").endswith("s") and "service healthy after" in r.detail
    unit = device.path("/etc/systemd/system/colibri.service")
    assert unit.read_text() == render_unit(SPEC.with_root(ROOT), target="orin-nx")
    assert stat.S_IMODE(unit.stat().st_mode) == 0o644
    assert device.path("/etc/sysusers.d/colibri.conf").exists()
    assert calls(device) == ["daemon-reload", "enable colibri.service", "reset-failed colibri.service",
                             "restart colibri.service", "is-failed colibri.service"]
    # the same release again: nothing written, no restart, "unchanged"
    before = len(calls(device))
    again = deploy(fleet, tmp_path, profile, "a", good=True)
    assert (again.result, again.service) == ("unchanged", "unchanged"), again
    assert "restart colibri.service" not in calls(device)[before:]


def test_a_failing_release_is_switched_back_and_restarted(device, fleet, tmp_path, profile):
    first = deploy(fleet, tmp_path, profile, "a", good=True)
    r = deploy(fleet, tmp_path, profile, "b", good=False)
    assert (r.result, r.service, r.ok) == ("rolled-back", "rolled-back", False), r
    assert r.detail.startswith("health gate failed: colibri serve: cannot load")
    assert f"rolled back to {first.release}, serving" in r.detail
    assert rel.current_release(device, ROOT) == first.release
    assert calls(device).count("restart colibri.service") == 3     # a, b, a again
    assert D.results_table([r], ["service", "downtime"]).splitlines()[2].split()[3] == "rolled-back"


def test_a_changed_unit_is_put_back_on_rollback(device, fleet, tmp_path, profile):
    deploy(fleet, tmp_path, profile, "a", good=True)
    old = device.path("/etc/systemd/system/colibri.service").read_text()
    r = deploy(fleet, tmp_path, profile, "b", good=False, service=ServiceSpec(port=9000))
    assert r.result == "rolled-back", r
    assert device.path("/etc/systemd/system/colibri.service").read_text() == old
    assert calls(device).count("daemon-reload") == 3      # install a, install b, restore a


def test_a_first_release_that_fails_leaves_no_unit_behind(device, fleet, tmp_path, profile):
    r = deploy(fleet, tmp_path, profile, "b", good=False)
    assert (r.result, r.service) == ("failed", "failed"), r
    assert "colibri serve: cannot load" in r.detail
    assert not device.path("/etc/systemd/system/colibri.service").exists()
    assert "disable --now colibri.service" in calls(device)


def test_no_service_and_no_systemd_deploy_files_only(device, fleet, tmp_path, profile):
    r = deploy(fleet, tmp_path, profile, "a", good=True, service=None)
    assert r.result == "ok" and r.service is None and calls(device) == []
    (device.root / "run/systemd/system").rmdir()                # not booted with systemd
    r = deploy(fleet, tmp_path, profile, "b", good=True)
    assert (r.result, r.service) == ("ok", "skipped"), r
    assert "not booted with systemd" in r.detail
    assert rel.current_release(device, ROOT) == r.release
    assert calls(device) == [] and not device.path("/etc/systemd/system/colibri.service").exists()


def test_spec_of_unit_and_requests_served():
    unit = render_unit(ServiceSpec(port=9001, bind="0.0.0.0", api_key_file="/etc/colibri/key",
                                   model_id="m1"))
    spec = svc.spec_of_unit(unit, ServiceSpec())
    assert (spec.port, spec.bind, spec.api_key_file, spec.model_id) == (9001, "0.0.0.0",
                                                                        "/etc/colibri/key", "m1")
    assert svc.spec_of_unit(None, SPEC) == SPEC
    metrics = ('# TYPE colibri_requests_total counter\ncolibri_requests_total{code="200"} 7\n'
               'colibri_requests_total{code="401"} 2\ncolibri_generated_tokens_total 40\n')
    assert svc.requests_served(metrics) == 9
    assert svc.requests_served("colibri_generated_tokens_total 0\n") == 0
    assert svc.requests_served("<html>not metrics</html>") is None


def test_dry_run_says_what_the_service_step_will_do(device, fleet, tmp_path, profile):
    art = D.prepare(profile, make_dist(tmp_path / "dist-p", "p"), model(tmp_path, "p", True))
    plan = D.deploy(fleet, art, profile, dry_run=True, service=SPEC)[0]
    assert plan.result == "planned" and "service: install/refresh colibri.service" in plan.detail
    assert calls(device) == [] and not device.path("/etc/systemd/system/colibri.service").exists()
    (device.root / "run/systemd/system").rmdir()
    plan = D.deploy(fleet, art, profile, dry_run=True, service=SPEC)[0]
    assert "service: none (device not booted with systemd)" in plan.detail
