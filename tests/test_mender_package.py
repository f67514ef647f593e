"""`invoke package --format mender` without a device: the release payload (deterministic, every
file listed with its sha256, the release id deploy computes), the real mender-artifact's type
info, and clear errors. The real Mender client installs these artifacts in
tests/fleet/test_mender.py."""

from __future__ import annotations

import ast
import hashlib
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from colibri_kit import mender
from colibri_kit.errors import FleetError
from colibri_kit.fleet.deploy import prepare
from colibri_kit.paths import project_root
from colibri_kit.profiles import load_profile



@pytest.fixture
def dist(tmp_path: Path) -> Path:
    """A small dist tree with a manifest as invoke build writes it (files: sha256 + size)."""
    d = tmp_path / "dist"
    (d / "bin").mkdir(parents=True)
    (d / "lib").mkdir()
    (d / "bin/colibri").write_bytes(b"\x7fELF not really\n")
    (d / "bin/colibri").chmod(0o755)
    (d / "lib/libcolibri.a").write_bytes(b"!<arch>\n")
    files = {r: {"sha256": hashlib.sha256((d / r).read_bytes()).hexdigest(), "size": (d / r).stat().st_size}
             for r in ("bin/colibri", "lib/libcolibri.a")}
    (d / "manifest.json").write_text(json.dumps({"target": "orin-nx", "files": files,
                                                 "profile_hash": load_profile("orin-nx").hash},
                                                indent=2) + "\n")
    return d


@pytest.fixture
def model(tmp_path: Path) -> Path:
    path = tmp_path / "m.colibri"
    path.write_bytes(bytes(range(256)) * 64)
    return path


def test_payload_is_deterministic_and_lists_every_file(tmp_path, dist, model):
    art = prepare(load_profile("orin-nx"), dist, model)
    a, b = tmp_path / "a.tar", tmp_path / "b.tar"
    mender.write_payload(art, a)
    model.touch()                      # a newer mtime changes nothing
    mender.write_payload(prepare(load_profile("orin-nx"), dist, model), b)
    assert a.read_bytes() == b.read_bytes()
    with tarfile.open(a) as tar:
        names = tar.getnames()
        data = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
        modes = {m.name: m.mode for m in tar.getmembers()}
        assert {m.mtime for m in tar.getmembers()} == {0} and {m.uid for m in tar.getmembers()} == {0}
    assert names == ["SHA256SUMS", "model.colibri", "release.env", "release/bin/colibri",
                     "release/lib/libcolibri.a", "release/manifest.json", "release/release.json"]
    sums = dict(reversed(line.split("  ")) for line in data["SHA256SUMS"].decode().splitlines())
    assert sorted(sums) == names[1:]
    assert all(hashlib.sha256(data[n]).hexdigest() == sha for n, sha in sums.items())
    assert data["release.env"].decode() == \
        f"id={art.release_id}\nmodel_sha256={art.model_sha}\ntarget=orin-nx\n"
    assert data["release/release.json"] == art.release_json()
    assert modes["release/bin/colibri"] == 0o755 and modes["release/lib/libcolibri.a"] == 0o644


def test_a_model_is_required_and_values_are_checked(tmp_path, dist, model):
    with pytest.raises(FleetError, match="needs a model"):
        mender.write_payload(prepare(load_profile("orin-nx"), dist), tmp_path / "x.tar")
    art = prepare(load_profile("orin-nx"), dist, model)
    with pytest.raises(FleetError, match="device type"):
        mender.write_artifact(art, tmp_path / "x.mender", device_type="orin nx; rm -rf /")
    # "$" alone would let a trailing newline through into device_type=... and the artifact name.
    with pytest.raises(FleetError, match="device type"):
        mender.write_artifact(art, tmp_path / "x.mender", device_type="colibri-orin-nx\n")
    with pytest.raises(FleetError, match="artifact name"):
        mender.write_artifact(art, tmp_path / "x.mender", device_type="colibri-orin-nx",
                              artifact_name="r1\n")
    with pytest.raises(FleetError, match="signing key"):
        mender.write_artifact(art, tmp_path / "x.mender", device_type="colibri-orin-nx",
                              sign_key=tmp_path / "missing.pem")


def test_type_info_and_a_pkcs8_key_gets_an_actionable_error(tmp_path, dist, model):
    art = prepare(load_profile("orin-nx"), dist, model)
    out = mender.write_artifact(art, tmp_path / "a.mender", device_type="colibri-orin-nx")
    info = subprocess.run(["mender-artifact", "read", str(out)], capture_output=True, text=True,
                          check=True).stdout
    assert "Compatible devices: '[colibri-orin-nx]'" in info
    assert f"rootfs-image.colibri.version: {art.release_id}" in info
    assert "colibri.target: orin-nx" in info and f"colibri.model_sha256: {art.model_sha}" in info
    assert "Type:   colibri" in info and "colibri-release.tar" in info
    key = tmp_path / "k.pem"   # OpenSSL 3 writes PKCS#8, which mender-artifact 3.9 cannot read
    subprocess.run(["openssl", "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
                    "-out", str(key)], check=True, capture_output=True)
    with pytest.raises(FleetError, match="-traditional"):
        mender.write_artifact(art, tmp_path / "s.mender", device_type="colibri-orin-nx", sign_key=key)
    assert not (tmp_path / "s.mender").exists() and not (tmp_path / "s.mender.partial").exists()


def test_invoke_package_refuses_other_formats(tmp_path, dist, model):
    proc = subprocess.run([sys.executable, "-m", "invoke", "package", "--target", "orin-nx", "--model",
                           str(model), "--dist", str(dist), "--format", "deb"],
                          cwd=project_root(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "unknown --format 'deb'" in proc.stderr, proc.stderr


def test_the_update_module_is_python_38_and_says_it_supports_rollback(tmp_path):
    """The module runs with the device's python3: Ubuntu 20.04's 3.8 on JetPack 5. Its syntax is
    checked against 3.8's grammar and it uses no call newer than 3.8 (the ones this code would
    reach for); the state answers Mender asks first need no root."""
    script = project_root() / "colibri_kit/data/mender/colibri"
    source = script.read_text()
    assert source.startswith("#!/usr/bin/python3 -I\n")   # isolated: no PYTHON* variables, no user site
    ast.parse(source, feature_version=(3, 8))
    for newer in ("removeprefix", "removesuffix", "waitstatus_to_exitcode", "file_digest", "zip(strict",
                  "extraction_filter", "functools.cache(", "user=", "group=", "extra_groups="):
        assert newer not in source, newer
    for state, want in (("SupportsRollback", "Yes"), ("NeedsArtifactReboot", "No")):
        assert subprocess.run([sys.executable, "-I", str(script), state, "/nonexistent"],
                              capture_output=True, text=True).stdout.strip() == want


def test_the_module_conf_names_the_service_user():
    conf = mender.module_conf(root="/opt/colibri", unit="colibri.service",
                              health_url="http://127.0.0.1:8080/health", api_key_file=None,
                              model_id=None, gate_timeout=90, user="colibri")
    assert "USER=colibri\n" in conf and "ROOT=/opt/colibri\n" in conf
    with pytest.raises(FleetError, match="service user"):
        mender.module_conf(root="/opt/colibri", unit="colibri.service", health_url="http://x/health",
                           api_key_file=None, model_id=None, gate_timeout=90, user="root")
