"""Mender delivery with the REAL Mender client (Debian's mender-client 3.4, standalone mode) inside
an emulated Jetson that boots a real systemd (colibri_kit/sim/service_fleet.py).

One booted device for the module: an SSH deploy installs release A and colibri.service (the
fleet's starting point), the kit's `colibri` update module is installed over SSH, and then
artifacts written by `invoke package --format mender` (colibri_kit/mender.py, with the real
mender-artifact 3.9) are installed with `mender install` / `mender commit` / `mender rollback`:
install + commit switches the release and the service answers; a health-gate failure rolls back
with the old release serving; an artifact for another device type, a corrupted one, and with
signing an unsigned or wrongly signed one are refused; the installed release equals an SSH
deploy's (same id, same files, same model by sha). Setup: docs/fleet.md, "Mender" (the device's Mender files)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
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
from colibri_kit.service import ServiceSpec, health_gate
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
    client set up as docs/fleet.md, "Mender", says, and the colibri update module installed over SSH."""
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
            profile = load_profile("orin-nx")
            results = D.deploy(fleet_of(inv, [dev.name]), D.prepare(profile, dist_a, tiny_model),
                               profile, hooks=D.Hooks(), service=SPEC)
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
    art = D.prepare(load_profile("orin-nx"), dist, model)
    kw.setdefault("device_type", mender.device_type_for("orin-nx"))
    return art, mender.write_artifact(art, tmp / f"{art.release_id}-{time.monotonic_ns()}.mender", **kw)


def said(stderr: str) -> str:
    """The update module's own lines in the Mender client's log (for assertion messages)."""
    return "\n".join(re.findall(r"colibri update module: ([^\"]*)", stderr)) or stderr[-2000:]


def with_binary(dest: Path, dist: Path, data: bytes) -> Path:
    """A copy of ``dist`` whose bin/colibri is ``data`` (its manifest updated to match)."""
    shutil.copytree(dist, dest)
    binary = dest / "bin" / "colibri"
    binary.write_bytes(data)
    binary.chmod(0o755)
    manifest = json.loads((dest / "manifest.json").read_text())
    entry = manifest["files"]["bin/colibri"]
    sha = hashlib.sha256(data).hexdigest()
    manifest["files"]["bin/colibri"] = {**entry, "sha256": sha} if isinstance(entry, dict) else sha
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return dest


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
    art = D.prepare(load_profile("orin-nx"), dist_a, tiny_model)
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
    # the SSH deploy's release
    assert old == D.prepare(load_profile("orin-nx"), dist_a, tiny_model).release_id
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
    # /bin/false runs, but exits 1 like a binary that cannot start
    dist = with_binary(tmp_path / "x86", dist_b, Path("/bin/false").read_bytes())
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
    stale = D.prepare(load_profile("orin-nx"), dist_b, bad_model)
    assert stale.release_id in ls("releases") and f"{stale.model_sha}.colibri" in ls("models")
    commits = 0
    for dist in (dist_a, dist_b):   # two commits: the stale one is then older than KEEP newest
        art, artifact = package(tmp_path, dist, tiny_model)
        if art.release_id == current(mdev):
            continue
        res = mender_cmd(mdev, "install", push(mdev, artifact))
        assert res.returncode == 0, said(res.stderr)
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


# ---------------------------------------------------------------- hostile payloads and an unprivileged login
# The review of issue #21 (finding 1): the module runs as root; docs/fleet.md has the login own the
# install root (`sudo chown jetson /opt/colibri`), so the login can rename anything in it at any
# moment. Each attack below is made by a process of that login (setpriv to its uid, no groups).

LOGIN = "jetson"
MARKS = "/var/tmp/colibri-test-marks"   # who ran what: one uid per line, appended by probes


def fresh_model(tmp: Path, tag: str) -> Path:
    """Model bytes no other test uses, so the release id and models/<sha> are new (the install
    checks only sha256; these tests never commit them)."""
    path = tmp / f"{tag}.colibri"
    path.write_bytes(f"colibri test model {tag} {time.monotonic_ns()}\n".encode() * 64)
    return path


def reset_marks(dev) -> None:
    # root's file in the sticky /var/tmp, writable by everyone: fs.protected_regular lets other
    # users append to it because its owner owns the directory
    dev.run(["install", "-m", "0666", "/dev/null", MARKS])


def marks(dev) -> list[str]:
    return dev.run(["cat", MARKS]).stdout.split()


def probe(tag: str) -> bytes:
    """A bin/colibri that records the uid it runs as, then answers --version."""
    return f"#!/bin/sh\nid -u >> {MARKS}\necho 'colibri {tag}'\n".encode()


def as_login(dev, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return dev.run(["setpriv", f"--reuid={LOGIN}", f"--regid={LOGIN}", "--clear-groups", "--",
                    "python3", "-c", script, *args], timeout=120)


def start_as_login(dev, script: str, *args: str) -> int:
    """Start ``script`` in the background as the login; its pid in the device."""
    path = f"/var/tmp/colibri-attack-{time.monotonic_ns()}.py"
    dev.write(path, script, 0o644)
    argv = " ".join(shlex.quote(a) for a in args)
    res = dev.sh(f"setpriv --reuid={LOGIN} --regid={LOGIN} --clear-groups -- python3 {path} {argv} "
                 f">{path}.log 2>&1 & echo $!")
    return int(res.stdout.strip())


def stop(dev, pid: int) -> None:
    dev.run(["kill", str(pid)], check=False)
    for _ in range(200):
        if dev.run(["kill", "-0", str(pid)], check=False).returncode != 0:
            return
        time.sleep(0.05)


def test_the_self_check_runs_as_the_service_user_never_as_root(mdev, tmp_path, dist_b):
    """Finding 1(a), first half: ArtifactInstall ran the payload's bin/colibri --version as root.
    Here that binary records its uid: it must be the service user's."""
    reset_marks(mdev)
    dist = with_binary(tmp_path / "probe", dist_b, probe("self-check"))
    _, artifact = package(tmp_path, dist, fresh_model(tmp_path, "self-check"))
    res = mender_cmd(mdev, "install", push(mdev, artifact))
    assert res.returncode == 0, res.stderr[-3000:]
    service_uid = mdev.run(["id", "-u", SPEC.user]).stdout.strip()
    assert marks(mdev) == [service_uid], (marks(mdev), service_uid)
    assert mender_cmd(mdev, "rollback").returncode == 0


def test_a_payload_name_with_a_newline_is_refused(mdev, tmp_path, dist_b, monkeypatch):
    """Finding 1, last sentence: a payload file named "release/lib/libcolibri.a<newline>release/
    lib/libcolibri.a" reads as two names that SHA256SUMS can list (the real file's line, three
    times), so the old module installed it without a checksum. Names are now a closed set."""
    lib = "release/lib/libcolibri.a"
    real = mender.write_payload

    def smuggle(art, dest: Path) -> None:
        real(art, dest)
        with tarfile.open(dest) as tar:
            members = [(m, tar.extractfile(m).read()) for m in tar.getmembers()]
        sums = next(data for m, data in members if m.name == "SHA256SUMS").decode()
        line = next(ln for ln in sums.splitlines() if ln.endswith("  " + lib))
        sums += f"{line}\n{line}\n"
        with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
            for m, data in members:
                if m.name == "SHA256SUMS":
                    data = sums.encode()
                    m.size = len(data)
                tar.addfile(m, io.BytesIO(data))
            evil = tarfile.TarInfo(f"{lib}\n{lib}")
            evil.size = 5
            tar.addfile(evil, io.BytesIO(b"evil\n"))

    monkeypatch.setattr(mender, "write_payload", smuggle)
    _, artifact = package(tmp_path, dist_b, fresh_model(tmp_path, "newline"))
    err = _refused(mdev, artifact, "a payload name with a newline")
    assert "name is not allowed: 'release/lib/libcolibri.a" in err, said(err)
    odd = mdev.run(["find", ROOT, "-name", "*\n*"]).stdout
    assert odd == "", odd


@pytest.fixture(scope="module")
def login(mdev):
    """The docs' setup where the operator logs in as a user: the install root is the login's
    (here the whole tree, as if that login had deployed it)."""
    if mdev.run(["id", "-u", LOGIN], check=False).returncode != 0:
        mdev.run(["useradd", "-M", "-d", "/nonexistent", "-s", "/usr/sbin/nologin", LOGIN])
    mdev.run(["chown", "-R", f"{LOGIN}:{LOGIN}", ROOT])
    yield LOGIN
    mdev.run(["chown", "-R", "root:root", ROOT])


def test_a_root_writable_by_others_is_refused(mdev, login, tmp_path, dist_b):
    mdev.run(["chmod", "0775", ROOT])
    try:
        _, artifact = package(tmp_path, dist_b, fresh_model(tmp_path, "group-writable"))
        err = _refused(mdev, artifact, "a group-writable root")
        assert f"{ROOT} is writable by its group or others" in err and "chmod go-w" in err, err[-2000:]
    finally:
        mdev.run(["chmod", "0755", ROOT])


SWAP_STAGE = r'''
import os, sys, time
root, evil_file, stop = sys.argv[1:4]
evil = open(evil_file).read()
rel = os.path.join(root, "releases")
done = 0
while not os.path.exists(stop):
    try:
        names = os.listdir(rel)
    except OSError:
        continue
    for name in names:
        if name != ".mender-stage" and ".partial-" not in name or name.startswith(".evil"):
            continue
        stage = os.path.join(rel, name)
        try:
            if os.stat(stage).st_uid == os.getuid():     # ours: overwrite the staged binary
                for sub in ("bin", "release/bin"):
                    if os.path.isdir(os.path.join(stage, sub)):
                        tmp = os.path.join(stage, sub, ".evil")
                        with open(tmp, "w") as f:
                            f.write(evil)
                        os.chmod(tmp, 0o755)
                        os.rename(tmp, os.path.join(stage, sub, "colibri"))
                        done += 1
            else:                                         # root's: swap the directory for ours
                mine = os.path.join(rel, ".evil-%d" % done)
                for sub in ("bin", "release/bin"):
                    os.makedirs(os.path.join(mine, sub))
                    with open(os.path.join(mine, sub, "colibri"), "w") as f:
                        f.write(evil)
                    os.chmod(os.path.join(mine, sub, "colibri"), 0o755)
                os.rename(stage, os.path.join(rel, ".evil-old-%d" % done))
                os.rename(mine, stage)
                done += 1
        except OSError:
            pass
print("swaps", done, flush=True)
'''


def test_a_login_swapping_the_staged_release_never_gets_root_to_run_it(mdev, login, tmp_path, dist_b):
    """Finding 1(a): the login renames the staging directory (or rewrites what it stages) during
    ArtifactInstall, as fast as it can, so that the self-check runs the login's binary. Whatever
    it wins, that binary must never run as root (as the service user it gains nothing: the
    service runs the login's files anyway)."""
    reset_marks(mdev)
    stop_file = f"/var/tmp/colibri-stop-{time.monotonic_ns()}"
    art, artifact = package(tmp_path, dist_b, fresh_model(tmp_path, "swap"))
    evil = "/var/tmp/colibri-test-evil"
    mdev.write(evil, probe("evil"), 0o644)
    pid = start_as_login(mdev, SWAP_STAGE, ROOT, evil, stop_file)
    try:
        res = mender_cmd(mdev, "install", push(mdev, artifact))
    finally:
        mdev.run(["touch", stop_file])
        stop(mdev, pid)
    assert "0" not in marks(mdev), f"root ran the login's binary: {marks(mdev)}\n{res.stderr[-2000:]}"
    if res.returncode == 0:
        assert mender_cmd(mdev, "rollback").returncode == 0
    mdev.sh(f"rm -rf {ROOT}/releases/.evil* {ROOT}/releases/.mender-stage {ROOT}/releases/*.partial-*")
    if art.release_id != current(mdev):
        mdev.run(["rm", "-rf", f"{ROOT}/releases/{art.release_id}"])


def test_a_model_link_planted_by_the_login_never_redirects_roots_writes(mdev, login, tmp_path, dist_b):
    """Finding 1(c): the login plants links where the model goes: models/<sha>.colibri -> a
    root-only file, and models/<sha>.colibri.partial -> a root-only directory (the old module's
    `mv` then moved the model into it and `chmod 0644` followed the link, opening it)."""
    victim_dir, victim_file = "/var/lib/colibri-test-victim", "/etc/colibri/colibri-test-secret"
    mdev.run(["install", "-d", "-m", "0700", victim_dir])
    mdev.run(["install", "-m", "0600", "/dev/null", victim_file])
    model = fresh_model(tmp_path, "link")
    art, artifact = package(tmp_path, dist_b, model)
    name = f"{ROOT}/models/{art.model_sha}.colibri"
    as_login(mdev, "import os, sys; os.symlink(sys.argv[1], sys.argv[3]); "
                   "os.symlink(sys.argv[2], sys.argv[3] + '.partial')", victim_file, victim_dir, name)
    res = mender_cmd(mdev, "install", push(mdev, artifact))
    try:
        assert mdev.run(["stat", "-c", "%a %U", victim_dir]).stdout.split() == ["700", "root"]
        assert mdev.run(["stat", "-c", "%a %U", victim_file]).stdout.split() == ["600", "root"]
        assert mdev.run(["ls", "-A", victim_dir]).stdout == ""
        assert res.returncode == 0, res.stderr[-3000:]
        # the link was replaced by the model itself, the login's file like the rest of the root
        assert mdev.run(["stat", "-c", "%F %a %U", name]).stdout.split() == ["regular", "file", "644", LOGIN]
        assert mdev.run(["sha256sum", name]).stdout.split()[0] == art.model_sha
        assert mender_cmd(mdev, "rollback").returncode == 0
    finally:
        mdev.run(["rm", "-rf", victim_dir, victim_file, name + ".partial"])


FAKE_GATE = r'''
import http.server, json, os, sys
root, victim, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
class Gate(http.server.BaseHTTPRequestHandler):
    def answer(self, body):
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):   # the gate's /health: now point releases elsewhere, then say healthy
        rel = os.path.join(root, "releases")
        if self.path == "/health" and not os.path.islink(rel):
            os.rename(rel, rel + ".moved")
            os.symlink(victim, rel)
            print("swapped", flush=True)
        self.answer(b'{"status": "ok"}')
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.answer(json.dumps({"choices": [{"text": "x", "index": 0}]}).encode())
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Gate).serve_forever()
'''


def test_releases_pointed_elsewhere_during_the_gate_prunes_nothing_of_roots(mdev, login, tmp_path, dist_a,
                                                                            dist_b, tiny_model):
    """Finding 1(b): during ArtifactCommit's health gate the login points `releases` at a
    directory of root's; the old prune then deleted root's directories there and every model
    (no release in the new `releases` links to one), the current one included. To hit the gate
    every time, the gate's health URL here is a server of the login's that makes the swap when
    the gate first asks (a real login races the gate instead)."""
    victim = "/var/lib/colibri-test-victim"
    for d in ("orin-nx-000000000001", "orin-nx-000000000002"):
        mdev.run(["install", "-d", "-m", "0755", f"{victim}/{d}"])
        mdev.run(["install", "-m", "0600", "/dev/null", f"{victim}/{d}/data"])
    port = 8099
    old_conf = mdev.path(mender.MODULE_CONF).read_text()
    mdev.write(mender.MODULE_CONF, mender.module_conf(
        root=ROOT, unit="colibri.service", health_url=f"http://127.0.0.1:{port}/health",
        api_key_file=None, model_id=SPEC.model_id, gate_timeout=60, keep=KEEP))
    b_id = D.prepare(load_profile("orin-nx"), dist_b, tiny_model).release_id
    dist = dist_a if b_id == current(mdev) else dist_b
    art, artifact = package(tmp_path, dist, tiny_model)
    pid = start_as_login(mdev, FAKE_GATE, ROOT, victim, str(port))
    try:
        for _ in range(200):   # until the login's server listens
            if mdev.run(["curl", "-s", "-o", "/dev/null", f"http://127.0.0.1:{port}/nothing"],
                        check=False).returncode == 0:
                break
            time.sleep(0.05)
        res = mender_cmd(mdev, "install", push(mdev, artifact))
        assert res.returncode == 0, said(res.stderr)
        res = mender_cmd(mdev, "commit")
        assert mdev.run(["readlink", f"{ROOT}/releases"], check=False).stdout.strip() == victim, \
            "the login's server never swapped: " + said(res.stderr)
        assert res.returncode == 0, said(res.stderr)
        assert "not pruning" in res.stderr, said(res.stderr)
        for d in ("orin-nx-000000000001", "orin-nx-000000000002"):
            assert mdev.run(["test", "-f", f"{victim}/{d}/data"], check=False).returncode == 0, d
        assert mdev.run(["test", "-f", f"{ROOT}/models/{art.model_sha}.colibri"],
                        check=False).returncode == 0, "the current model was deleted"
    finally:
        stop(mdev, pid)
        mdev.sh(f"if [ -L {ROOT}/releases ]; then rm -f {ROOT}/releases && "
                f"mv {ROOT}/releases.moved {ROOT}/releases; fi")
        mdev.write(mender.MODULE_CONF, old_conf)
        mdev.run(["rm", "-rf", victim])
    assert current(mdev) == art.release_id
    # the login's server said healthy at once: wait for the real service before asking it
    gate = health_gate(lambda argv: (lambda r: (r.returncode, r.stdout))(mdev.run(argv, check=False)),
                       SPEC, timeout=120)
    assert gate.ok, gate.detail
    assert answers(mdev)
