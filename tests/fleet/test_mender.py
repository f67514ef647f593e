"""Mender delivery with the REAL Mender client (Debian's mender-client 3.4, standalone mode) inside
an emulated Jetson that boots a real systemd (colibri_kit/sim/service_fleet.py).

One booted device for the module: an SSH deploy installs release A and colibri.service (the
fleet's starting point), the kit's `colibri` update module is installed over SSH, and then
artifacts written by `invoke package --format mender` (colibri_kit/mender.py, with the real
mender-artifact 3.9) are installed with `mender install` / `mender commit` / `mender rollback`:
install + commit switches the release and the service answers; a health-gate failure rolls back
with the old release serving; an artifact for another device type, a corrupted one, and with
signing an unsigned or wrongly signed one are refused; the installed release equals an SSH
deploy's (same id, same files, same model by sha). Setup facts: ../shared FACTS.md, "Mender"."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import openai
import pytest

from colibri_kit import mender
from colibri_kit.fleet import deploy as D
from colibri_kit.fleet import release as rel
from colibri_kit.fleet.connect import SSHRemote
from colibri_kit.fleet.inventory import load_inventory
from colibri_kit.paths import project_root
from colibri_kit.profiles import load_profile
from colibri_kit.service import ServiceSpec
from colibri_kit.sim.fleet import QEMU_LD_PREFIX

from fleet_support import fleet_of

pytestmark = [pytest.mark.slow, pytest.mark.root]
ROOT = "/opt/colibri"
API_KEY = "sk-colibri-mender-test-0123456789"
KEY_FILE = "/etc/colibri/api-key"
VERIFY_KEY = "/etc/mender/artifact-verify-key.pem"
KEEP = 1   # releases the module keeps after a commit, besides current and previous
SPEC = ServiceSpec(port=8080, bind="0.0.0.0", api_key_file=KEY_FILE, model_id="tiny", slots=1,
                   restart_sec=0.5, start_limit_burst=3, drain_timeout_s=5)


@pytest.fixture(scope="module")
def mdev(dist_a, tiny_model):
    """One emulated orin-nx with systemd, release A + colibri.service (SSH deploy), the mender
    client set up as FACTS.md says, and the colibri update module installed over SSH."""
    if os.geteuid() != 0:
        pytest.fail("the systemd-booted emulated device needs root (namespaces, overlayfs, cgroups)")
    if shutil.which("mender") is None or shutil.which("mender-artifact") is None:
        pytest.fail("mender-client / mender-artifact missing: scripts/bootstrap.sh installs them")
    from colibri_kit.sim.service_fleet import ServiceFleet

    state = Path(tempfile.mkdtemp(prefix="colibri-mender-"))
    fleet = ServiceFleet(1, state, name_prefix="mender")
    try:
        with fleet:
            dev = fleet.devices[0]
            dev.write(KEY_FILE, API_KEY + "\n", 0o600)
            # Debian links /var/lib/mender to /data/mender: the device keeps its own state in /var.
            dev.sh("rm -f /var/lib/mender && mkdir -p /var/lib/mender")
            dev.write("/var/lib/mender/device_type", "device_type=colibri-orin-nx\n")
            dev.write("/etc/mender/mender.conf", "{}\n")
            dev.write("/etc/mender/artifact_info", "artifact_name=factory\n")
            inv = load_inventory(fleet.fleet_file)
            results = D.deploy(fleet_of(inv, [dev.name]), D.prepare("orin-nx", dist_a, tiny_model),
                               load_profile("orin-nx"), hooks=D.Hooks(), service=SPEC)
            assert results[0].result == "ok", D.results_table(results, ["service"])
            # the module over SSH, as an operator installs it (settings from the profile's service)
            proc = invoke("mender-module", "--target", "orin-nx", "--fleet", str(fleet.fleet_file),
                          "--gate-timeout", "60")
            assert proc.returncode == 0 and f"{dev.name}: installed" in proc.stdout, proc.stdout + proc.stderr
            # read through the device's root (its /tmp is private: a checkout under /tmp is not there)
            assert dev.path(mender.MODULE_PATH).read_bytes() == module_file().read_bytes()
            profile_spec = load_profile("orin-nx").service
            assert dev.path(mender.MODULE_CONF).read_text() == mender.module_conf(
                root=ROOT, unit="colibri.service", health_url=profile_spec.health_url,
                api_key_file=profile_spec.api_key_file, model_id=profile_spec.model_id, gate_timeout=60,
                keep=3)
            # this device serves beyond its loopback with a key (SPEC): the gate must use it too
            with remote(inv, dev.name) as r:
                mender.install_module(r, mender.module_conf(
                    root=ROOT, unit="colibri.service", health_url=SPEC.health_url,
                    api_key_file=KEY_FILE, model_id=SPEC.model_id, gate_timeout=60, keep=KEEP))
            dev.inv = inv
            yield dev
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, Path]:
    """Two RSA key pairs made with openssl: the fleet's and a stranger's."""
    d = tmp_path_factory.mktemp("keys")
    out = {}
    for name in ("fleet", "other"):
        key = d / f"{name}.pem"
        subprocess.run(["openssl", "genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:3072",
                        "-out", str(key)], check=True, capture_output=True)
        # mender-artifact 3.9 reads PKCS#1 ("BEGIN RSA PRIVATE KEY"), not OpenSSL 3's PKCS#8 default
        subprocess.run(["openssl", "rsa", "-in", str(key), "-out", str(key), "-traditional"],
                       check=True, capture_output=True)
        subprocess.run(["openssl", "pkey", "-in", str(key), "-pubout", "-out", str(d / f"{name}.pub")],
                       check=True, capture_output=True)
        out[name] = key
    return out


@pytest.fixture(scope="module")
def bad_model(tmp_path_factory) -> Path:
    """Not a .colibri file: colibri serve exits 1 at every start, the health gate fails."""
    path = tmp_path_factory.mktemp("bad") / "bad.colibri"
    path.write_bytes(b"this is not a colibri model\n" * 64)
    return path


def invoke(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "invoke", *args], cwd=project_root(),
                          capture_output=True, text=True, timeout=300)


def module_file() -> Path:
    return project_root() / "colibri_kit" / "data" / "mender" / "colibri"


def remote(inv, name) -> SSHRemote:
    return SSHRemote(inv.hosts[name], known_hosts=inv.known_hosts, identity_file=inv.identity_file)


def current(dev) -> str:
    return dev.run(["readlink", f"{ROOT}/current"]).stdout.strip().removeprefix("releases/")


def mender_cmd(dev, *args: str) -> subprocess.CompletedProcess[str]:
    # The emulated device runs aarch64 binaries through qemu-user: its services and SSH sessions
    # get QEMU_LD_PREFIX (sim/service_fleet.py), and so does the client here.
    return dev.run(["env", f"QEMU_LD_PREFIX={QEMU_LD_PREFIX}", "mender", "--no-syslog", *args],
                   check=False, timeout=240)


def push(dev, artifact: Path) -> str:
    """Copy an artifact into the device; the path it has there."""
    path = f"/var/tmp/{artifact.name}"
    dev.write(path, artifact.read_bytes())
    return path


def package(tmp: Path, dist: Path, model: Path, **kw) -> tuple[D.Artifact, Path]:
    art = D.prepare("orin-nx", dist, model)
    kw.setdefault("device_type", mender.device_type_for("orin-nx"))
    return art, mender.write_artifact(art, tmp / f"{art.release_id}-{time.monotonic_ns()}.mender", **kw)


def answers(dev) -> list[int]:
    client = openai.OpenAI(base_url=f"http://{dev.address}:{SPEC.port}/v1", api_key=API_KEY,
                           max_retries=0, timeout=120)
    got = client.completions.create(model="tiny", prompt=[1, 5, 9, 200], max_tokens=4, temperature=0)
    return got.choices[0].token_ids


def test_artifacts_are_reproducible_apart_from_mender_artifacts_own_stamps(tmp_path, dist_a, tiny_model):
    a, b = tmp_path / "a.mender", tmp_path / "b.mender"
    for out in (a, b):
        proc = invoke("package", "--target", "orin-nx", "--model", str(tiny_model), "--format", "mender",
                      "--dist", str(dist_a), "--out", str(out))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        time.sleep(1.1)   # mender-artifact stamps the wall clock (seconds) on its own entries
    art = D.prepare("orin-nx", dist_a, tiny_model)
    assert f"release {art.release_id}, model {art.model_sha[:12]}, device type colibri-orin-nx" in proc.stdout
    with tarfile.open(a) as ta, tarfile.open(b) as tb:
        ma, mb = ta.getmembers(), tb.getmembers()
        assert [m.name for m in ma] == [m.name for m in mb] == \
            ["version", "manifest", "header.tar.gz", "data/0000.tar.gz"]
        for x, y in zip(ma, mb):
            assert ta.extractfile(x).read() == tb.extractfile(y).read(), x.name
            assert (x.mode, x.uid, x.gid, x.size) == (y.mode, y.uid, y.gid, y.size), x.name
        # what differs: the mtime mender-artifact gives its two gzip members
        assert [x.name for x, y in zip(ma, mb) if x.mtime != y.mtime] == ["header.tar.gz", "data/0000.tar.gz"]


def test_install_and_commit_switch_the_release_and_the_service_answers(mdev, tmp_path, dist_a, dist_b,
                                                                      tiny_model):
    old = current(mdev)
    assert old == D.prepare("orin-nx", dist_a, tiny_model).release_id   # the SSH deploy's release
    before = answers(mdev)
    art, artifact = package(tmp_path, dist_b, tiny_model)
    res = mender_cmd(mdev, "install", push(mdev, artifact))
    assert res.returncode == 0, res.stderr[-3000:]
    assert current(mdev) == old                       # installed, not switched before the commit
    res = mender_cmd(mdev, "commit")
    assert res.returncode == 0, res.stderr[-3000:]
    assert current(mdev) == art.release_id
    assert mender_cmd(mdev, "show-artifact").stdout.strip() == art.release_id
    assert answers(mdev) == before                    # same model, same greedy answer
    # the same release an SSH deploy installs: same id, files that pass the deploy's own
    # verification, the content-addressed model by sha256
    with remote(mdev.inv, mdev.name) as r:
        assert rel.verify_release(r, ROOT, art.release_id) == []
        meta = rel.release_meta(r, ROOT, art.release_id)
    assert meta == json.loads(art.release_json())
    link = mdev.run(["readlink", f"{ROOT}/releases/{art.release_id}/model.colibri"]).stdout.strip()
    assert link == f"../../models/{art.model_sha}.colibri"
    assert mdev.run(["sha256sum", f"{ROOT}/models/{art.model_sha}.colibri"]).stdout.split()[0] == art.model_sha


def test_a_health_gate_failure_rolls_back_and_the_old_release_serves(mdev, tmp_path, dist_a, bad_model):
    old = current(mdev)
    before = answers(mdev)
    art, artifact = package(tmp_path, dist_a, bad_model)
    res = mender_cmd(mdev, "install", push(mdev, artifact))
    assert res.returncode == 0, res.stderr[-3000:]
    res = mender_cmd(mdev, "commit")
    assert res.returncode != 0
    assert "not healthy" in res.stderr or "failed" in res.stderr, res.stderr[-3000:]
    assert "rolled back to " + old in res.stderr, res.stderr[-3000:]
    assert current(mdev) == old
    assert mender_cmd(mdev, "show-artifact").stdout.strip() == old
    assert mdev.systemctl("is-active", "colibri.service", check=False).stdout.strip() == "active"
    assert answers(mdev) == before


def _refused(dev, artifact: Path, why: str) -> str:
    old = current(dev)
    name = mender_cmd(dev, "show-artifact").stdout.strip()
    releases = sorted(dev.run(["ls", f"{ROOT}/releases"]).stdout.split())
    res = mender_cmd(dev, "install", push(dev, artifact))
    assert res.returncode != 0, f"{why}: installed:\n{res.stderr[-2000:]}"
    assert current(dev) == old, why
    assert sorted(dev.run(["ls", f"{ROOT}/releases"]).stdout.split()) == releases, why
    assert mender_cmd(dev, "show-artifact").stdout.strip() == name, why
    return res.stderr


def test_wrong_device_type_and_corrupted_artifacts_are_refused(mdev, tmp_path, dist_b, bad_model, tiny_model):
    # a release for xavier-nx never installs on an orin-nx
    _, xavier = package(tmp_path, dist_b, bad_model, device_type=mender.device_type_for("xavier-nx"))
    err = _refused(mdev, xavier, "wrong device type")
    assert "colibri-xavier-nx" in err and "colibri-orin-nx" in err, err[-2000:]
    # a byte flipped in the middle of the payload (the model's bytes)
    _, good = package(tmp_path, dist_b, bad_model)
    data = bytearray(good.read_bytes())
    data[len(data) // 2] ^= 0xFF
    broken = tmp_path / "broken.mender"
    broken.write_bytes(bytes(data))
    _refused(mdev, broken, "corrupted")
    # truncated
    short = tmp_path / "short.mender"
    short.write_bytes(good.read_bytes()[: len(data) * 2 // 3])
    _refused(mdev, short, "truncated")


def test_with_signing_unsigned_and_wrongly_signed_artifacts_are_refused(mdev, tmp_path, keys, dist_a,
                                                                       dist_b, tiny_model):
    mdev.write(VERIFY_KEY, (keys["fleet"].parent / "fleet.pub").read_bytes())
    mdev.write("/etc/mender/mender.conf", f'{{"ArtifactVerifyKey": "{VERIFY_KEY}"}}\n')
    try:
        _, unsigned = package(tmp_path, dist_a, tiny_model)
        err = _refused(mdev, unsigned, "unsigned")
        assert "signature" in err.lower(), err[-2000:]
        _, stranger = package(tmp_path, dist_a, tiny_model, sign_key=keys["other"])
        err = _refused(mdev, stranger, "wrong key")
        assert "signature" in err.lower() or "verif" in err.lower(), err[-2000:]
        old, name = current(mdev), mender_cmd(mdev, "show-artifact").stdout.strip()
        art, signed = package(tmp_path, dist_a, tiny_model, sign_key=keys["fleet"])
        res = mender_cmd(mdev, "install", push(mdev, signed))
        assert res.returncode == 0, res.stderr[-3000:]
        # an installed but uncommitted release: `mender rollback` leaves the old one current
        res = mender_cmd(mdev, "rollback")
        assert res.returncode == 0, res.stderr[-3000:]
        assert current(mdev) == old
        assert mender_cmd(mdev, "show-artifact").stdout.strip() == name
    finally:
        mdev.write("/etc/mender/mender.conf", "{}\n")


def test_a_release_that_fails_the_modules_checks_is_not_installed(mdev, tmp_path, dist_b, tiny_model):
    """The module's own ArtifactInstall checks (here: bin/colibri does not run on the device, as
    a build for another CPU would not) fail the install; the old release stays current."""
    dist = tmp_path / "x86"
    shutil.copytree(dist_b, dist)
    binary = dist / "bin" / "colibri"
    shutil.copy2("/bin/false", binary)   # runs, but exits 1 like a binary that cannot start
    manifest = json.loads((dist / "manifest.json").read_text())
    entry = manifest["files"]["bin/colibri"]
    sha = hashlib.sha256(binary.read_bytes()).hexdigest()
    manifest["files"]["bin/colibri"] = {**entry, "sha256": sha} if isinstance(entry, dict) else sha
    (dist / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    _, artifact = package(tmp_path, dist, tiny_model)
    err = _refused(mdev, artifact, "binary that does not run")
    assert "bin/colibri does not run on this device" in err, err[-2000:]
    assert mdev.systemctl("is-active", "colibri.service", check=False).stdout.strip() == "active"


def test_a_commit_prunes_old_releases_and_unused_models(mdev, tmp_path, dist_a, dist_b, tiny_model,
                                                       bad_model):
    """After a healthy commit the module keeps current, previous and the newest KEEP releases, and
    the models they link to (as deploy's --keep); here the gate-failed release goes."""
    ls = lambda d: sorted(mdev.run(["ls", f"{ROOT}/{d}"]).stdout.split())  # noqa: E731
    # a release that will be neither current nor previous nor among the newest
    _, extra = package(tmp_path, dist_b, bad_model)
    assert mender_cmd(mdev, "install", push(mdev, extra)).returncode == 0
    assert mender_cmd(mdev, "rollback").returncode == 0
    stale = D.prepare("orin-nx", dist_b, bad_model)
    assert stale.release_id in ls("releases") and f"{stale.model_sha}.colibri" in ls("models")
    commits = 0
    for dist in (dist_a, dist_b):   # two commits: the stale one is then older than KEEP newest
        art, artifact = package(tmp_path, dist, tiny_model)
        if art.release_id == current(mdev):
            continue
        assert mender_cmd(mdev, "install", push(mdev, artifact)).returncode == 0
        res = mender_cmd(mdev, "commit")
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"pruned release {stale.release_id}" in res.stderr or commits == 1, res.stderr[-3000:]
        commits += 1
    now, releases = current(mdev), ls("releases")
    assert commits >= 1 and now == art.release_id
    assert stale.release_id not in releases and f"{stale.model_sha}.colibri" not in ls("models")
    assert now in releases and len(releases) <= KEEP + 2, releases
    linked = {mdev.run(["readlink", f"{ROOT}/releases/{r}/model.colibri"]).stdout.strip().rsplit("/", 1)[1]
              for r in releases}
    assert set(ls("models")) == linked
    assert answers(mdev)
