"""`invoke deploy` with the service, against emulated Jetsons that boot a REAL systemd
(colibri_kit/sim/service_fleet.py): sshd runs as a unit, the kit logs in over real SSH, the
orin-nx (aarch64) build serves the tiny model under colibri.service through qemu-user, and the
host talks to it with the official `openai` client at the device's own address.

One booted pair of devices for the module; the tests run in order on it: deploy installs the unit
and the service answers; a release whose service cannot start (bad model; port taken) is rolled
back and the old one serves; `kill -9` is answered by systemd; a deploy while requests are in
flight leaves no half-written answer; after a reboot the service is back. The decisions alone
(install, switch, gate, roll back) are also tested in-process in test_service_local.py."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import openai
import pytest

from colibri_kit.fleet import deploy as D
from colibri_kit.fleet import release as rel
from colibri_kit.fleet import service as svc
from colibri_kit.fleet.connect import SSHRemote
from colibri_kit.fleet.inventory import load_inventory
from colibri_kit.fleet.status import status, status_table
from colibri_kit.profiles import load_profile
from colibri_kit.service import ServiceSpec

from fleet_support import fleet_of

pytestmark = [pytest.mark.slow, pytest.mark.root]
ROOT = "/opt/colibri"
API_KEY = "sk-colibri-fleet-test-0123456789"
KEY_FILE = "/etc/colibri/api-key"
# Served beyond the device's loopback (the host is another machine here), so with a key.
SPEC = ServiceSpec(port=8080, bind="0.0.0.0", api_key_file=KEY_FILE, model_id="tiny", slots=2,
                   restart_sec=0.5, start_limit_burst=3, drain_timeout_s=20)


@pytest.fixture(scope="module")
def sfleet():
    if os.geteuid() != 0:
        pytest.fail("the systemd-booted emulated fleet needs root (namespaces, overlayfs, cgroups)")
    from colibri_kit.sim.service_fleet import ServiceFleet

    state = Path(tempfile.mkdtemp(prefix="colibri-svc-fleet-"))
    fleet = ServiceFleet(2, state)
    try:
        with fleet:
            for d in fleet.devices:
                d.write(KEY_FILE, API_KEY + "\n", 0o600)
            yield fleet
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def inv(sfleet):
    return load_inventory(sfleet.fleet_file)


@pytest.fixture(scope="module")
def profile():
    return load_profile("orin-nx")


@pytest.fixture(scope="module")
def bad_model(tmp_path_factory) -> Path:
    """Not a .colibri file: the service exits 1 at every start (serve cannot load it)."""
    path = tmp_path_factory.mktemp("bad") / "bad.colibri"
    path.write_bytes(b"this is not a colibri model\n" * 64)
    return path


def client(dev) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{dev.address}:{SPEC.port}/v1", api_key=API_KEY,
                         max_retries=0, timeout=120)


def health(dev, port: int = SPEC.port) -> int:
    try:
        with urllib.request.urlopen(f"http://{dev.address}:{port}/health", timeout=3) as r:
            return r.status
    except OSError:
        return 0


def listening(dev, port: int) -> bool:
    try:
        with socket.create_connection((str(dev.address), port), timeout=2):
            return True
    except OSError:
        return False


def wait_for(pred, timeout: float = 180.0, step: float = 0.2):
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value or time.monotonic() > end:
            return value
        time.sleep(step)


def remote(inv, name) -> SSHRemote:
    return SSHRemote(inv.hosts[name], known_hosts=inv.known_hosts, identity_file=inv.identity_file)


def current(inv, name) -> str | None:
    with remote(inv, name) as r:
        return rel.current_release(r, ROOT)


def reference(inv, name, prompt: list[int], n: int) -> list[int]:
    """`colibri generate` of the device's current release (greedy): what the service must answer."""
    with remote(inv, name) as r:
        out = r.run([f"{ROOT}/current/bin/colibri", "--threads", "1", "generate",
                     f"{ROOT}/current/model.colibri", "--ids", ",".join(map(str, prompt)),
                     "--max-new", str(n)], timeout=120).stdout
    return json.loads(out)["new_ids"]


def check_answers(inv, dev) -> None:
    prompt = [1, 5, 9, 200]
    got = client(dev).completions.create(model="tiny", prompt=prompt, max_tokens=6, temperature=0)
    want = reference(inv, dev.name, prompt, 6)
    ids = got.choices[0].token_ids
    assert ids and ids == want[:len(ids)], (ids, want)
    assert len(ids) == 6 or got.choices[0].finish_reason == "stop"


def test_deploy_installs_the_unit_and_the_service_answers(sfleet, inv, profile, dist_a, tiny_model):
    art = D.prepare(load_profile("orin-nx"), dist_a, tiny_model)
    names = [d.name for d in sfleet.devices]
    results = D.deploy(fleet_of(inv, names), art, profile, hooks=D.Hooks(), service=SPEC)
    table = D.results_table(results, ["service", "downtime"])
    assert [(r.result, r.service) for r in results] == [("ok", "healthy")] * 2, table
    assert all(r.column("downtime").endswith("s") for r in results), table
    for dev in sfleet.devices:
        assert dev.systemctl("is-enabled", "colibri.service").stdout.strip() == "enabled"
        user = dev.run(["ps", "-o", "user=", "-p", str(dev.main_pid("colibri.service"))]).stdout
        assert user.strip() == "colibri"
        check_answers(inv, dev)
        assert health(dev) == 200
    # a second deploy of the same release changes nothing and restarts nothing
    pids = [d.main_pid("colibri.service") for d in sfleet.devices]
    again = D.deploy(fleet_of(inv, names), art, profile, hooks=D.Hooks(), service=SPEC)
    assert [(r.result, r.service) for r in again] == [("unchanged", "unchanged")] * 2, \
        D.results_table(again, ["service", "downtime"])
    assert [d.main_pid("colibri.service") for d in sfleet.devices] == pids
    # invoke status: service state and the requests the service answered
    rows = status(fleet_of(inv, names))
    assert [r.service for r in rows] == ["active/running"] * 2, status_table(rows)
    assert all(int(r.requests) >= 2 for r in rows), status_table(rows)   # gate + our completion


def test_a_release_that_cannot_start_is_rolled_back(sfleet, inv, profile, dist_a, dist_b, tiny_model,
                                                     bad_model):
    old = D.prepare(load_profile("orin-nx"), dist_a, tiny_model).release_id
    art = D.prepare(load_profile("orin-nx"), dist_b, bad_model)
    dev = sfleet.devices[0]
    results = D.deploy(fleet_of(inv, [dev.name]), art, profile, hooks=D.Hooks(), service=SPEC)
    r = results[0]
    table = D.results_table(results, ["service", "downtime"])
    assert (r.result, r.service) == ("rolled-back", "rolled-back"), table
    assert not r.ok                                      # -> invoke deploy exits 1
    assert "health gate failed" in r.detail and "colibri serve:" in r.detail, table
    assert f"rolled back to {old}, serving" in r.detail, table
    assert current(inv, dev.name) == old
    check_answers(inv, dev)


def test_a_taken_port_is_rolled_back_with_the_old_unit(sfleet, inv, profile, dist_b, tiny_model):
    dev = sfleet.devices[1]
    old = current(inv, dev.name)
    # Something else holds the port the new profile asks for.
    dev.write("/etc/systemd/system/blocker.service",
              "[Service]\nExecStart=/usr/bin/python3 -m http.server --bind 0.0.0.0 8081\n")
    dev.systemctl("daemon-reload")
    dev.systemctl("start", "blocker.service")
    assert wait_for(lambda: listening(dev, 8081))
    moved = ServiceSpec(**{**SPEC.__dict__, "port": 8081})
    art = D.prepare(load_profile("orin-nx"), dist_b, tiny_model)
    try:
        results = D.deploy(fleet_of(inv, [dev.name]), art, profile, hooks=D.Hooks(), service=moved)
    finally:
        dev.systemctl("stop", "blocker.service")
    r = results[0]
    table = D.results_table(results, ["service", "downtime"])
    assert r.result == "rolled-back" and "cannot listen" in r.detail, table
    assert current(inv, dev.name) == old
    unit = dev.path("/etc/systemd/system/colibri.service").read_text()
    assert "--port 8080" in unit and "--port 8081" not in unit     # the old unit is back
    check_answers(inv, dev)


def test_kill_9_is_restarted_by_systemd(sfleet, inv):
    dev = sfleet.devices[0]
    pid = dev.main_pid("colibri.service")
    # MainPID 0 means the service is not running: `kill -9 0` would signal a process group
    assert pid > 0, dev.systemctl("status", "colibri.service", check=False).stdout
    restarts = int(dev.systemctl("show", "-p", "NRestarts", "--value", "colibri.service").stdout)
    dev.run(["kill", "-9", str(pid)])
    assert wait_for(lambda: dev.main_pid("colibri.service") not in (0, pid) and health(dev) == 200)
    assert int(dev.systemctl("show", "-p", "NRestarts", "--value", "colibri.service").stdout) == restarts + 1
    with remote(inv, dev.name) as r:
        st = svc.service_state(r, dev.name)
    assert st.state == "active/running" and st.restarts == str(restarts + 1)
    check_answers(inv, dev)


def test_deploy_while_requests_are_in_flight(sfleet, inv, profile, dist_a, dist_b, tiny_model):
    """Requests keep coming while a new release is switched in: each one either completes in full
    (every token, a finish reason) or fails as a whole (connection refused, 503 draining); none
    is cut in the middle. serve drains on SIGTERM (systemd's stop) before it exits."""
    dev = sfleet.devices[0]
    art = D.prepare(load_profile("orin-nx"), dist_b, tiny_model)
    if current(inv, dev.name) == art.release_id:
        art = D.prepare(load_profile("orin-nx"), dist_a, tiny_model)
    done = threading.Event()
    outcomes: list[tuple[str, str]] = []
    lock = threading.Lock()

    def worker(stream: bool) -> None:
        c = client(dev)
        while not done.is_set():
            try:
                if stream:
                    chunks = list(c.completions.create(model="tiny", prompt=[1, 17, 99], max_tokens=24,
                                                       temperature=0, stream=True))
                    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
                    kind = "complete" if finish and finish[-1] else "HALF"
                else:
                    got = c.completions.create(model="tiny", prompt=[1, 17, 99], max_tokens=24,
                                               temperature=0)
                    kind = "complete" if got.choices[0].finish_reason else "HALF"
            except (openai.APIConnectionError, openai.APIStatusError) as exc:
                kind = f"refused:{type(exc).__name__}"
                time.sleep(0.1)
            with lock:
                outcomes.append((kind, "stream" if stream else "plain"))

    threads = [threading.Thread(target=worker, args=(s,)) for s in (False, True, False, True)]
    for t in threads:
        t.start()
    try:
        assert wait_for(lambda: len(outcomes) >= 4)
        results = D.deploy(fleet_of(inv, [dev.name]), art, profile, hooks=D.Hooks(), service=SPEC)
        after = len(outcomes)
        wait_for(lambda: len(outcomes) >= after + 4)
    finally:
        done.set()
        for t in threads:
            t.join(180)
    assert results[0].result == "ok", D.results_table(results, ["service", "downtime"])
    kinds = [k for k, _ in outcomes]
    assert "HALF" not in kinds, outcomes
    assert kinds.count("complete") >= 8, outcomes
    # the stop drained the requests that were running when the restart came
    log = dev.run(["journalctl", "-u", "colibri", "-o", "cat", "--no-pager"]).stdout
    assert "draining" in log
    assert current(inv, dev.name) == art.release_id
    check_answers(inv, dev)


def test_service_and_logs_tasks(sfleet, inv):
    dev = sfleet.devices[1]
    with remote(inv, dev.name) as r:
        stopped = svc.control(r, dev.name, "stop")
        assert stopped.state.startswith("inactive"), stopped
        assert health(dev) == 0
        started = svc.control(r, dev.name, "restart")
        assert started.state == "active/running" and started.detail.startswith("healthy"), started
        log = svc.journal(r, 50)
    assert health(dev) == 200
    assert "ready" in log


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], capture_output=True, text=True,
                          cwd=Path(__file__).parents[2], timeout=600)


def test_the_cli_rolls_back_exits_1_and_shows_the_service(sfleet, inv, dist_b, bad_model, tiny_model):
    """Through the real `invoke` CLI with the orin-nx profile's own service section (loopback,
    no key): the bad release's unit is replaced, fails, and the old unit and release come back."""
    dev = sfleet.devices[1]
    old, unit = current(inv, dev.name), dev.path("/etc/systemd/system/colibri.service").read_text()
    fleet = str(sfleet.fleet_file)
    proc = invoke("deploy", "--target", "orin-nx", "--fleet", fleet, "--hosts", dev.name,
                  "--dist", str(dist_b), "--model", str(bad_model), "--gate-timeout", "60")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    row = next(l for l in proc.stdout.splitlines() if l.startswith(dev.name))
    assert " rolled-back " in row and "colibri serve:" in row and f"rolled back to {old}" in row, row
    assert "failed on 1 of 1 host(s)" in proc.stderr
    assert current(inv, dev.name) == old
    assert dev.path("/etc/systemd/system/colibri.service").read_text() == unit
    assert health(dev) == 200

    proc = invoke("service", "--fleet", fleet)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = [l.split() for l in proc.stdout.splitlines() if l.startswith("svc-")]
    assert [r[1] for r in rows] == ["active/running"] * 2, proc.stdout
    proc = invoke("logs", "--fleet", fleet, "--hosts", dev.name, "-n", "40")
    assert proc.returncode == 0 and proc.stdout.startswith(f"== {dev.name} ==")
    assert "colibri serve:" in proc.stdout          # the bad release's reason, in the journal
    assert API_KEY not in proc.stdout
    proc = invoke("smoke", "--target", "orin-nx", "--fleet", fleet, "--hosts", dev.name, "--http",
                  "--model", str(tiny_model), "--max-first-token-ms", "100000", "--bench-runs", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    row = next(l for l in proc.stdout.splitlines() if l.startswith(dev.name))
    assert row.split()[3] == "ok" and " same " in row, proc.stdout
    with remote(inv, dev.name) as r:
        assert svc.http_smoke(r, ROOT, [1, 2, 3], 4)[0]
        r.run(["systemctl", "stop", "colibri.service"])
        ok, what = svc.http_smoke(r, ROOT, [1, 2, 3], 4)
        assert not ok and "not running" in what
        r.run(["systemctl", "start", "colibri.service"])
    assert wait_for(lambda: health(dev) == 200)


def test_reboot_brings_the_service_back(sfleet, inv):
    dev = sfleet.devices[1]
    release = current(inv, dev.name)
    dev.reboot()
    sfleet.wait_ssh(dev)
    assert wait_for(lambda: health(dev) == 200)
    assert current(inv, dev.name) == release
    check_answers(inv, dev)
