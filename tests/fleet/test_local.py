"""Fleet logic in-process, against a LocalRemote: a directory stands for the device (the faked files
of an emulated Orin NX, the device root under it), commands run with subprocess as the user running
the tests. No sshd, no root, milliseconds per test; the real-sshd tests keep the transport, the
real binary under qemu, sudo and the faults.

The whole module also runs as a non-root user (``test_runs_without_root``): nothing here may need
root."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from colibri_kit.errors import FleetError
from colibri_kit.fleet import deploy as D
from colibri_kit.fleet import release as rel
from colibri_kit.fleet import smoke as smokelib
from colibri_kit.fleet import status as statuslib
from colibri_kit.fleet import tune as tunelib
from colibri_kit.fleet.fleet import Fleet, for_each
from colibri_kit.fleet.inventory import Host
from colibri_kit.profiles import load_profile
from colibri_kit.report import table
from colibri_kit.sim.local import LocalRemote, local_device

ROOT = "/opt/colibri"
HERE = Path(__file__).resolve()
# A stand-in for the runtime binary: deploy runs `bin/colibri --version` before activating; the
# real aarch64 binary under qemu is exercised by the sshd tests.
FAKE_BINARY = "#!/bin/sh\necho 'colibri 0.0.0 target=orin-nx'\n"


def make_dist(where: Path, tag: str) -> Path:
    (where / "bin").mkdir(parents=True)
    (where / "lib").mkdir()
    (where / "bin/colibri").write_text(FAKE_BINARY)
    (where / "bin/colibri").chmod(0o755)
    (where / "lib/libcolibri.a").write_bytes(b"!<arch>\n" + tag.encode())
    files = {rel_: {"sha256": hashlib.sha256((where / rel_).read_bytes()).hexdigest()}
             for rel_ in ("bin/colibri", "lib/libcolibri.a")}
    (where / "manifest.json").write_text(json.dumps(
        {"target": "orin-nx", "profile_hash": load_profile("orin-nx").hash,
         "source_revision": tag, "files": files}, indent=1))
    return where


@pytest.fixture
def device(tmp_path: Path) -> LocalRemote:
    return local_device(tmp_path / "device", "orin-nx", name="cab-01")


@pytest.fixture
def host() -> Host:
    return Host(name="cab-01", address="192.0.2.11", target="orin-nx")


@pytest.fixture
def fleet(device: LocalRemote, host: Host) -> Fleet:
    return Fleet([host], connect=lambda h: device)


@pytest.fixture
def profile():
    return load_profile("orin-nx")


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "model.colibri"
    path.write_bytes(os.urandom(4096))
    return path


def current_complete(device: LocalRemote) -> str:
    cur = rel.current_release(device, ROOT)
    assert cur is not None
    assert os.readlink(device.path(f"{ROOT}/current")) == f"releases/{cur}"
    assert rel.verify_release(device, ROOT, cur) == []
    return cur


def test_deploy_then_noop(device, fleet, profile, tmp_path, model) -> None:
    art = D.prepare(profile, make_dist(tmp_path / "a", "a"), model)
    [res] = D.deploy(fleet, art, profile, hooks=D.Hooks())
    assert res.result == "ok", res.detail
    assert current_complete(device) == art.release_id
    assert device.path(f"{ROOT}/current/model.colibri").read_bytes() == model.read_bytes()
    [again] = D.deploy(fleet, art, profile, hooks=D.Hooks())
    assert (again.result, again.uploaded) == ("unchanged", 0)
    [row] = statuslib.status(fleet)
    assert (row.reachable, row.release, row.l4t, row.target) == (True, art.release_id, "R36.4.0",
                                                                  "orin-nx")


def test_a_dist_built_from_another_profile_is_refused(device, fleet, profile, tmp_path,
                                                       model) -> None:
    """deploy loads targets/orin-nx.yaml; a dist whose manifest records another profile hash (the
    profile changed since the build, or another checkout built it) is refused before anything is
    uploaded, naming both hashes and the command that rebuilds."""
    dist = make_dist(tmp_path / "a", "a")
    manifest = json.loads((dist / "manifest.json").read_text())
    manifest["profile_hash"] = "f" * 64
    (dist / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FleetError) as err:
        D.prepare(profile, dist, model)
    msg = str(err.value)
    assert "f" * 12 in msg and profile.hash in msg and profile.short_hash in msg
    assert "invoke build --target orin-nx" in msg
    del manifest["profile_hash"]                       # not written by invoke build
    (dist / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(FleetError, match="records no profile hash.*invoke build --target orin-nx"):
        D.prepare(profile, dist, model)
    # An artifact prepared from one profile is not deployed as another's.
    art = D.prepare(profile, make_dist(tmp_path / "b", "b"), model)
    with pytest.raises(FleetError, match="prepared from profile orin-nx"):
        D.deploy(fleet, art, load_profile("orin-nano"), hooks=D.Hooks())
    assert not device.path(f"{ROOT}/releases").exists()


def test_dry_run_changes_nothing(device, fleet, profile, tmp_path, model) -> None:
    a = D.prepare(profile, make_dist(tmp_path / "a", "a"), model)
    b = D.prepare(profile, make_dist(tmp_path / "b", "b"), model)
    D.deploy(fleet, a, profile, hooks=D.Hooks())
    [res] = D.deploy(fleet, b, profile, dry_run=True)
    assert res.result == "planned"
    assert f"switch current {a.release_id} -> {b.release_id}" in res.detail
    assert current_complete(device) == a.release_id
    assert not device.path(f"{ROOT}/releases/{b.release_id}").exists()


def test_rollback_and_roll_forward(device, fleet, profile, tmp_path, model) -> None:
    a = D.prepare(profile, make_dist(tmp_path / "a", "a"), model)
    b = D.prepare(profile, make_dist(tmp_path / "b", "b"), model)
    D.deploy(fleet, a, profile, hooks=D.Hooks())
    [res] = D.deploy(fleet, b, profile, hooks=D.Hooks())
    assert res.uploaded < b.release_bytes + model.stat().st_size  # the model was already there
    [back] = D.rollback(fleet)
    assert (back.result, back.release, back.detail) == ("ok", a.release_id, f"was {b.release_id}")
    assert current_complete(device) == a.release_id
    [fwd] = D.rollback(fleet, b.release_id)
    assert fwd.release == b.release_id and current_complete(device) == b.release_id
    [bad] = D.rollback(fleet, "orin-nx-000000000000")
    assert bad.result == "failed" and "no release orin-nx-000000000000" in bad.detail


def test_keep_prunes_old_releases_and_unused_models(device, fleet, profile, tmp_path) -> None:
    ids, models = [], []
    for tag in ("k1", "k2", "k3"):
        m = tmp_path / f"{tag}.colibri"
        m.write_bytes(tag.encode() * 100)
        art = D.prepare(profile, make_dist(tmp_path / tag, tag), m)
        [res] = D.deploy(fleet, art, profile, keep=2, hooks=D.Hooks())
        assert res.result == "ok", res.detail
        ids.append(art.release_id)
        models.append(f"{art.model_sha}.colibri")
    assert sorted(p.name for p in device.path(f"{ROOT}/releases").iterdir()) == sorted(ids[1:])
    assert sorted(p.name for p in device.path(f"{ROOT}/models").iterdir()) == sorted(models[1:])
    assert current_complete(device) == ids[-1]


def test_corrupted_uploads_are_not_activated(device, fleet, profile, tmp_path, model) -> None:
    a = D.prepare(profile, make_dist(tmp_path / "a", "a"), model)
    D.deploy(fleet, a, profile, hooks=D.Hooks())
    b = D.prepare(profile, make_dist(tmp_path / "b", "b"), model)

    def corrupt_release(host, path):
        if ".partial-" in path:
            device.path(f"{path}/bin/colibri").write_text(FAKE_BINARY + "# changed\n")
    [res] = D.deploy(fleet, b, profile, hooks=D.Hooks(uploaded=corrupt_release))
    assert res.result == "failed" and "checksum mismatch" in res.detail and "bin/colibri" in res.detail
    assert current_complete(device) == a.release_id
    assert not list(device.path(f"{ROOT}/releases").glob("*.partial*"))

    other = tmp_path / "other.colibri"
    other.write_bytes(os.urandom(2048))
    c = D.prepare(profile, make_dist(tmp_path / "c", "c"), other)

    def corrupt_model(host, path):
        if path.endswith(".colibri.partial"):
            device.path(path).write_bytes(b"\0" * 2048)
    [res] = D.deploy(fleet, c, profile, hooks=D.Hooks(uploaded=corrupt_model))
    assert res.result == "failed" and "does not verify" in res.detail
    assert current_complete(device) == a.release_id
    assert not device.path(f"{ROOT}/models/{c.model_sha}.colibri").exists()


def test_damaged_installed_release_is_repaired(device, fleet, profile, tmp_path, model) -> None:
    art = D.prepare(profile, make_dist(tmp_path / "a", "a"), model)
    D.deploy(fleet, art, profile, hooks=D.Hooks())
    device.path(f"{ROOT}/releases/{art.release_id}/lib/libcolibri.a").write_bytes(b"damaged")
    assert rel.verify_release(device, ROOT, art.release_id) != []
    [res] = D.deploy(fleet, art, profile, hooks=D.Hooks())
    assert res.result == "ok" and res.uploaded >= art.release_bytes, res.detail
    assert current_complete(device) == art.release_id


def test_wrong_device_kind_is_refused(tmp_path, host, profile, model) -> None:
    xavier = local_device(tmp_path / "xavier", "xavier-nx", name=host.name)
    art = D.prepare(profile, make_dist(tmp_path / "a", "a"), model)
    [res] = D.deploy(Fleet([host], connect=lambda h: xavier), art, profile, hooks=D.Hooks())
    assert res.result == "failed" and "wrong device kind" in res.detail and "R35" in res.detail
    assert not xavier.path(f"{ROOT}/releases").exists()


def test_failure_budget_skips_the_hosts_not_yet_started(device, host, profile, tmp_path, model) -> None:
    def connect(h: Host):
        if h.name.startswith("dead"):
            raise FleetError(f"{h.name}: cannot connect to {h.address}:22: refused")
        return device
    hosts = [Host(name="dead-1", address="192.0.2.1"), Host(name="dead-2", address="192.0.2.2"),
             host]
    art = D.prepare(profile, make_dist(tmp_path / "a", "a"), model)
    results = D.deploy(Fleet(hosts, connect, parallel=1, max_failures=2), art, profile,
                       hooks=D.Hooks())
    assert [r.result for r in results] == ["failed", "failed", "skipped"]
    assert "--max-failures" in results[2].detail
    outcome = Fleet(hosts, connect, parallel=1, max_failures=1).run(lambda r, h: h.name)
    assert [o.host for o in outcome.failed] == ["dead-1"]
    assert [o.host for o in outcome.skipped] == ["dead-2", "cab-01"] and not outcome.ok


def test_for_each_bounds_parallelism() -> None:
    """Waits on events, not on time: the first three items meet at a barrier (so three run at
    once however slow the machine is), and none of the others may join them while they wait."""
    import threading

    active = 0
    peak = 0
    lock = threading.Lock()
    three = threading.Barrier(3, timeout=60)

    def work(i: int) -> int:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        if i < 3:
            three.wait()
        with lock:
            active -= 1
        return i * 2

    assert for_each(range(12), work, parallel=3) == [i * 2 for i in range(12)]
    assert peak == 3
    with pytest.raises(FleetError):
        for_each([1], work, parallel=0)


def test_endless_device_file_fails_that_device_quickly(device, fleet) -> None:
    release = device.path("/etc/nv_tegra_release")
    release.unlink()
    release.symlink_to("/dev/zero")
    [row] = statuslib.status(fleet)
    assert not row.reachable
    assert "/etc/nv_tegra_release holds more than" in row.detail
    with pytest.raises(FleetError, match="printed more than 1000 bytes"):
        device.run(["head", "-c", "5000", "/dev/zero"], max_output=1000)


def test_smoke_model_fetch_is_capped_and_leaves_nothing(device, tmp_path) -> None:
    """Medium: the fetch of a deployed model stops at the size its release records, and no
    ``*.tmp-*`` stays behind, whatever stops it."""
    store = tmp_path / "store"
    data = os.urandom(10_000)
    sha = hashlib.sha256(data).hexdigest()
    device.path("/opt/colibri/m.colibri").write_bytes(data + b"more than recorded")
    refs = smokelib.ReferenceCache(store=store)
    with pytest.raises(FleetError, match="more than 10000 bytes, the size its release records"):
        refs.model_file(device, "/opt/colibri/m.colibri", sha, len(data))
    assert list(store.iterdir()) == []

    class Interrupted(LocalRemote):
        def fetch(self, remote, local, **kw):
            Path(local).write_bytes(data[:100])  # part of it, then the operator presses Ctrl-C
            raise KeyboardInterrupt
    with pytest.raises(KeyboardInterrupt):
        refs.model_file(Interrupted("cab-01", device.root), "/opt/colibri/m.colibri", sha, len(data))
    assert list(store.iterdir()) == []

    device.path("/opt/colibri/m.colibri").write_bytes(data)
    got = refs.model_file(device, "/opt/colibri/m.colibri", sha, len(data))
    assert got.read_bytes() == data and [p.name for p in store.iterdir()] == [f"{sha}.colibri"]


def test_tune_plan_reads_the_device_and_changes_nothing(device) -> None:
    before = {p: p.read_bytes() for p in device.path("/sys").rglob("*") if p.is_file()}
    plan = tunelib.plan(device, load_profile("orin-nx").tune)
    assert plan.steps == [
        "power mode 15W -> MAXN (id 0; MAXN is mode 0 (MAXN_SUPER not on this device)); "
        "needs a reboot (TPC_PG_MASK differs)",
        "jetson_clocks (after --store of the current clocks, once)",
        "cpu governor performance on the online cpus",
        "gpu governor performance on 17000000.gpu"]
    assert {p: p.read_bytes() for p in device.path("/sys").rglob("*") if p.is_file()} == before
    odd = load_profile("orin-nx").tune
    import dataclasses
    with pytest.raises(tunelib.TuneRefused, match="cpu0 has no governor 'interactive'"):
        tunelib.plan(device, dataclasses.replace(odd, cpu_governor="interactive"))
    with pytest.raises(tunelib.TuneRefused, match="not a valid name"):
        tunelib.plan(device, dataclasses.replace(odd, gpu_governor="performance; reboot"))


def test_governors_are_written_from_standard_input(device) -> None:
    st = tunelib.read_state(device)
    paths = {f"/sys/devices/system/cpu/cpu{c}/cpufreq/scaling_governor": st.cpu_available[c]
             for c in st.cpus_online}
    tunelib.write_governor(device, list(paths), "performance", paths)
    assert tunelib.read_state(device).cpu_governors() == "performance"
    with pytest.raises(FleetError, match="not a governor path"):
        tunelib.write_governor(device, ["/etc/sudoers.d/x"], "performance",
                               {"/etc/sudoers.d/x": ["performance"]})


def test_tables_strip_terminal_control_characters() -> None:
    """Low: a device-provided string cannot move the cursor, recolour or retitle the terminal."""
    hostile = "NVIDIA Jetson\x1b]0;owned\x07\x1b[2J\x1b[31mred\rX\x9b1m\x00"
    out = table([["host", "device"], ["cab-01", hostile]])
    assert not any(ord(ch) < 0x20 and ch != "\n" or 0x7f <= ord(ch) < 0xa0 for ch in out)
    assert "NVIDIA Jetson" in out and "red" in out


def test_runs_without_root(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    """This module passes as an unprivileged user (run under ``setpriv`` when the suite is root).
    The host build is made here, as root; the unprivileged run only executes it."""
    if os.geteuid() != 0:
        assert os.access("/etc/shadow", os.R_OK) is False  # really unprivileged
        return
    host_colibri = request.getfixturevalue("host_colibri")
    base = Path(tempfile.mkdtemp(prefix="colibri-local-nonroot-"))
    os.chown(base, 65534, 65534)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(HOME=str(base), XDG_CACHE_HOME=str(base / "cache"), PYTHONDONTWRITEBYTECODE="1",
               COLIBRI_TEST_HOST_BINARY=str(host_colibri))
    proc = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "--",
         sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--basetemp={base}/t",
         str(HERE)],
        cwd=HERE.parents[2], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_product_code_does_not_import_the_emulation() -> None:
    """colibri_kit/sim is test and demo tooling: only the sim tasks import it."""
    package = HERE.parents[2] / "colibri_kit"
    offenders = []
    for path in package.rglob("*.py"):
        if path.is_relative_to(package / "sim") or path == package / "tasks/sim.py":
            continue
        for line in path.read_text().splitlines():
            words = line.split()
            if words[:1] in (["import"], ["from"]) and words[1:2] and (
                    words[1] == "colibri_kit.sim" or words[1].startswith("colibri_kit.sim.")
                    or (words[1] == "colibri_kit" and "sim" in line.split("import", 1)[1])):
                offenders.append(f"{path.relative_to(package)}: {line.strip()}")
    assert offenders == []


def test_compare_logits_tolerance_and_topk() -> None:
    want = np.array([[0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]], np.float32)
    assert smokelib.compare_logits(want + 1e-6, want, "f32")[0] == []
    problems, err = smokelib.compare_logits(want + 0.01, want, "f32")
    assert err > 1e-3 and "rel. error" in problems[0]
    assert smokelib.compare_logits(want + 0.01, want, "int8")[0] == []  # int8 tolerance is wider
    swapped = want.copy()
    swapped[0, [5, 6]] = swapped[0, [6, 5]]
    assert any("top-5" in p for p in smokelib.compare_logits(swapped, want, "int8")[0])
    assert "shape" in smokelib.compare_logits(want[:, :3], want, "f32")[0][0]



def test_progress_lines_for_large_uploads() -> None:
    import io

    out = io.StringIO()
    progress = D._Progress(stream=out, min_bytes=1 << 20)
    total = 8 << 20
    for done in range(0, total + 1, 1 << 20):
        progress("cab-01", "model", done, total)
    progress("cab-01", "bin/colibri", 1000, 5000)  # small files print nothing
    lines = out.getvalue().splitlines()
    assert lines == [f"  cab-01: model {p}% ({p * 8 // 100}/8 MiB)" for p in (0, 25, 50, 75, 100)]



def test_device_checks_without_a_device_tree() -> None:
    info = rel.DeviceInfo(arch="x86_64")
    problems = rel.check_device(info, load_profile("orin-nx"), "pc")
    assert any("architecture is x86_64" in p for p in problems)
    assert any("not a Jetson" in p for p in problems)
    assert any("nv_tegra_release" in p for p in problems)
    ok = rel.DeviceInfo(arch="aarch64", l4t="36.4.3", model="NVIDIA Jetson Orin NX Developer Kit",
                        compatible=("nvidia,p3767-0000", "nvidia,tegra234"))
    assert rel.check_device(ok, load_profile("orin-nx"), "cab") == []
    assert rel.check_device(ok, load_profile("orin-nano"), "cab")  # an NX is not a Nano


# ----------------------------------------------------------------------------------------------
# Smoke with the real runtime: the host build (x86_64, system cc) stands in for the aarch64 one,
# since a LocalRemote runs commands on this machine; the aarch64 binary under qemu is the sshd
# tests' (tests/fleet/test_smoke.py).


@pytest.fixture
def runtime_binary(request: pytest.FixtureRequest) -> Path:
    """dist/host/bin/colibri (built by the host_colibri fixture; the unprivileged rerun of this
    module gets the root run's build through COLIBRI_TEST_HOST_BINARY, as it may not write dist/)."""
    given = os.environ.get("COLIBRI_TEST_HOST_BINARY")
    return Path(given) if given else request.getfixturevalue("host_colibri")


def with_tmp(device: LocalRemote) -> LocalRemote:
    """A real device has /tmp (smoke writes the logits there); the faked file tree has not."""
    device.path("/tmp").mkdir(exist_ok=True)
    return device


def real_dist(where: Path, binary: Path) -> Path:
    """A dist/ for orin-nx whose bin/colibri is the real runtime built for this machine."""
    where.mkdir(parents=True)
    dist = make_dist(where / "d", "host-build")
    (dist / "bin/colibri").write_bytes(binary.read_bytes())
    manifest = json.loads((dist / "manifest.json").read_text())
    manifest["files"]["bin/colibri"]["sha256"] = hashlib.sha256(binary.read_bytes()).hexdigest()
    (dist / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return dist


@pytest.mark.parametrize("dtype", ["f32", "q4"])
def test_smoke_checks_logits_greedy_and_text(device, fleet, profile, tmp_path, runtime_binary,
                                             dtype) -> None:
    """The tiny model (with its byte-level tokenizer) deployed with the real runtime passes smoke,
    4-bit included: logits within the dtype's tolerance, greedy ids, and the text generated from
    TEXT_PROMPT equal to `tokenizers` + the NumPy reference."""
    from colibri_kit.model.format import DType
    from colibri_kit.model.tiny import write_tiny_model

    with_tmp(device)
    model = write_tiny_model(tmp_path / f"tiny-{dtype}.colibri", dtype=DType.parse(dtype))
    art = D.prepare(profile, real_dist(tmp_path / "dist", runtime_binary), model)
    [dep] = D.deploy(fleet, art, profile, hooks=D.Hooks())
    assert dep.result == "ok", dep.detail
    [r] = smokelib.smoke(fleet, profile, model=model, bench_runs=1)
    assert r.result == "ok", r.detail
    assert (r.extra["greedy"], r.extra["text"], r.extra["backend"]) == ("same", "same", "cpu")
    assert float(r.extra["logits"]) <= smokelib.TOLERANCE[dtype]
    want = smokelib.reference_text(model, smokelib.TEXT_PROMPT, smokelib.TEXT_TOKENS)
    assert want is not None and len(want.ids) == smokelib.TEXT_TOKENS  # no stop ids: full length
    assert want.prompt_ids == list(smokelib.TEXT_PROMPT.encode())  # the tiny tokenizer: id = byte
    assert "text" in smokelib.SMOKE_COLUMNS and "text not checked" not in r.detail


@pytest.mark.parametrize("case", [("gptoss_mxfp4", "bf16", None), ("gptoss", "f32", "mxfp4")],
                         ids=["released-mxfp4", "f32+mxfp4-experts"])
def test_smoke_on_a_gptoss_model(device, fleet, profile, tmp_path, runtime_binary, hf_root,
                                 case) -> None:
    """`invoke smoke` on gpt-oss (#23): the NumPy reference (colibri_kit/model/reference.py)
    computes mxfp4 experts, sinks, sliding layers, YaRN and the biases, and the deployed runtime
    agrees with it within the model's dtype tolerance, greedy ids equal."""
    from test_gptoss import converted

    with_tmp(device)
    model = converted(hf_root, *case)
    art = D.prepare(profile, real_dist(tmp_path / "dist", runtime_binary), model)
    [dep] = D.deploy(fleet, art, profile, hooks=D.Hooks())
    assert dep.result == "ok", dep.detail
    [r] = smokelib.smoke(fleet, profile, model=model, bench_runs=1)
    assert r.result == "ok", r.detail
    assert r.extra["greedy"] == "same" and r.extra["backend"] == "cpu"
    assert float(r.extra["logits"]) <= smokelib.TOLERANCE[case[1]]


def test_smoke_without_tokenizer_says_text_was_not_checked(device, fleet, profile, tmp_path,
                                                            runtime_binary) -> None:
    from colibri_kit.model.tiny import tiny_header, write_random_model

    with_tmp(device)
    model = write_random_model(tmp_path / "ids-only.colibri", tiny_header(64))  # no tokenizer.*
    art = D.prepare(profile, real_dist(tmp_path / "dist", runtime_binary), model)
    D.deploy(fleet, art, profile, hooks=D.Hooks())
    [r] = smokelib.smoke(fleet, profile, model=model, bench_runs=1)
    assert r.result == "ok", r.detail
    assert r.extra["greedy"] == "same" and r.extra["text"] == "no tokenizer"
    assert "text not checked: the model file has no tokenizer" in r.detail


def test_text_check_names_what_differs() -> None:
    want = smokelib.ExpectedText([1, 2], [5, 6], "ab")
    assert smokelib.check_text({"prompt_ids": [1, 2], "ids": [5, 6], "text": "ab"}, want) == []
    [p] = smokelib.check_text({"prompt_ids": [1, 3], "ids": [5, 6], "text": "ab"}, want)
    assert "tokenizes to [1, 3] on the device, [1, 2] with `tokenizers`" in p
    assert smokelib.check_text({"prompt_ids": [1, 2], "ids": [5, 7], "text": "ac"}, want) == [
        "text generation ids [5, 7], reference [5, 6]", "generated text 'ac', reference 'ab'"]


@pytest.mark.parametrize("family", ["mixtral", "qwen3"])
def test_smoke_text_check_with_a_family_tokenizer(device, fleet, profile, tmp_path, runtime_binary,
                                                  family) -> None:
    """A tokenizer trained with the real `tokenizers` in the family's configuration (BOS added,
    byte fallback, SentencePiece decoder for mixtral; Qwen2 regex, NFC, special tokens and two
    stop ids for qwen3) stored in a small random-weight model: smoke's text check passes."""
    import hf_models as H
    from colibri_kit.model.tokenizer import load_tokenizer
    from colibri_kit.model.tiny import write_text_model

    with_tmp(device)
    spec = load_tokenizer(H.train_tokenizer(family, 2000, tmp_path / "tok").parent)
    assert spec is not None
    model = write_text_model(tmp_path / f"{family}.colibri", spec.blobs(), 2048)
    art = D.prepare(profile, real_dist(tmp_path / "dist", runtime_binary), model)
    D.deploy(fleet, art, profile, hooks=D.Hooks())
    [r] = smokelib.smoke(fleet, profile, model=model, bench_runs=1)
    assert r.result == "ok", r.detail
    assert (r.extra["greedy"], r.extra["text"]) == ("same", "same")
    want = smokelib.reference_text(model, smokelib.TEXT_PROMPT, smokelib.TEXT_TOKENS)
    assert want is not None and (want.prompt_ids[0] == 1) == (family == "mixtral")  # <s> added
