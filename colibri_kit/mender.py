"""Package a verified release as a Mender artifact, and install the ``colibri`` update module.

The artifact (``mender-artifact write module-image -T colibri``) carries one payload file,
``colibri-release.tar``: the same release the SSH deploy installs (release id from
``colibri_kit.fleet.deploy.prepare``: manifest + model sha) plus the model, with a checksum list
the update module (colibri_kit/data/mender/colibri) verifies on the device before anything there
changes. The tar is deterministic (sorted names, mtime 0, uid/gid 0, fixed modes), so two
packagings of the same inputs differ only where mender-artifact itself stamps the file (the
gzip headers it writes; see docs/fleet.md, "Mender").

Type info: ``device_type`` is ``colibri-<profile name>`` (e.g. ``colibri-orin-nx``) unless the
caller names one; provides ``rootfs-image.colibri.version: <release id>``,
``colibri.target: <profile>`` and ``colibri.model_sha256: <sha>``.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from importlib import resources
from pathlib import Path

from colibri_kit.errors import FleetError
from colibri_kit.fleet.deploy import Artifact

MODULE_TYPE = "colibri"
MODULE_PATH = "/usr/share/mender/modules/v3/colibri"
MODULE_CONF = "/etc/colibri/mender-module.conf"
PAYLOAD_NAME = "colibri-release.tar"
_DEVICE_TYPE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def module_script() -> bytes:
    """The ``colibri`` update module (a Python 3.8+ script, stdlib only: the python3 of every
    supported JetPack), as shipped in the kit."""
    return resources.files("colibri_kit").joinpath("data/mender/colibri").read_bytes()


def device_type_for(profile_name: str) -> str:
    return f"colibri-{profile_name}"


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, *, path: Path | None = None,
         mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if data is None:
        assert path is not None
        info.size = path.stat().st_size
        with open(path, "rb") as fh:
            tar.addfile(info, fh)
    else:
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))


def write_payload(art: Artifact, dest: Path) -> None:
    """The deterministic release tar: release.env, SHA256SUMS, release/..., model.colibri."""
    if art.model is None or art.model_sha is None:
        raise FleetError("a Mender artifact needs a model (--model): the release serves it")
    sums: dict[str, str] = {}
    entries: list[tuple[str, bytes | None, Path | None, int]] = []
    for relpath in sorted(art.files):
        local = art.dist / relpath
        mode = 0o755 if local.stat().st_mode & 0o100 else 0o644
        entries.append((f"release/{relpath}", None, local, mode))
        sums[f"release/{relpath}"] = art.files[relpath]
    for name, data in (("release/manifest.json", art.manifest_bytes),
                       ("release/release.json", art.release_json())):
        entries.append((name, data, None, 0o644))
        sums[name] = hashlib.sha256(data).hexdigest()
    env = f"id={art.release_id}\nmodel_sha256={art.model_sha}\ntarget={art.target}\n".encode()
    entries.append(("release.env", env, None, 0o644))
    sums["release.env"] = hashlib.sha256(env).hexdigest()
    entries.append(("model.colibri", None, art.model, 0o644))
    sums["model.colibri"] = art.model_sha
    listing = "".join(f"{sha}  {name}\n" for name, sha in sorted(sums.items())).encode()
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, "SHA256SUMS", listing)
        for name, data, path, mode in sorted(entries, key=lambda e: e[0]):
            _add(tar, name, data, path=path, mode=mode)


def mender_artifact_tool() -> str:
    tool = shutil.which("mender-artifact")
    if tool is None:
        raise FleetError("mender-artifact not found: apt-get install mender-artifact "
                         "(scripts/bootstrap.sh installs it)")
    return tool


def write_artifact(art: Artifact, out: Path, *, device_type: str, sign_key: Path | None = None,
                   artifact_name: str | None = None) -> Path:
    """Write ``out`` (a .mender file) for ``art``; signed with ``sign_key`` (PEM private key:
    RSA or ECDSA, as mender-artifact accepts) when given."""
    if not _DEVICE_TYPE_RE.fullmatch(device_type):
        raise FleetError(f"device type {device_type!r}: letters, digits, '.', '_' and '-' only")
    if sign_key is not None and not Path(sign_key).is_file():
        raise FleetError(f"signing key {sign_key} not found")
    name = artifact_name or art.release_id
    if not _DEVICE_TYPE_RE.fullmatch(name):
        raise FleetError(f"artifact name {name!r}: letters, digits, '.', '_' and '-' only")
    tool = mender_artifact_tool()
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="colibri-mender-"))
    try:
        payload = work / PAYLOAD_NAME
        write_payload(art, payload)
        os.utime(payload, (0, 0))
        partial = out.with_name(out.name + ".partial")
        argv = [tool, "write", "module-image", "-T", MODULE_TYPE, "-n", name, "-t", device_type,
                "-o", str(partial), "-f", str(payload),
                "--software-name", MODULE_TYPE, "--software-version", art.release_id,
                "--provides", f"colibri.target:{art.target}",
                "--provides", f"colibri.model_sha256:{art.model_sha}"]
        if sign_key is not None:
            argv += ["-k", str(sign_key)]
        res = subprocess.run(argv, capture_output=True, text=True, cwd=work)
        if res.returncode != 0:
            partial.unlink(missing_ok=True)
            err = (res.stderr or res.stdout).strip()
            hint = ""
            if sign_key is not None and "private key" in err:
                hint = (f"; mender-artifact reads PKCS#1 RSA or EC keys: convert with "
                        f"openssl rsa -in {sign_key} -out {sign_key}.rsa -traditional")
            raise FleetError(f"mender-artifact failed (exit {res.returncode}): {err[-1000:]}{hint}")
        partial.replace(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return out


def module_conf(*, root: str, unit: str, health_url: str, api_key_file: str | None,
                model_id: str | None, gate_timeout: int, keep: int = 3, user: str = "colibri") -> str:
    """The update module's settings file (the service spec the SSH deploy uses; ``keep``
    releases kept after a commit, as deploy's --keep; ``user``, the service user the new
    binary's self-check runs as)."""
    if int(keep) < 1:
        raise FleetError(f"keep must be at least 1 (got {keep})")
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", user) or user == "root":
        raise FleetError(f"user {user!r} is not a service user name (never root)")
    lines = ["# colibri Mender update module settings (written by invoke mender-module)",
             f"ROOT={root}", f"UNIT={unit}", f"USER={user}", f"HEALTH_URL={health_url}",
             f"MODEL_ID={model_id or 'model'}", f"GATE_TIMEOUT={int(gate_timeout)}",
             f"KEEP={int(keep)}"]
    if api_key_file:
        lines.append(f"API_KEY_FILE={api_key_file}")
    return "\n".join(lines) + "\n"


def install_module(remote, conf: str) -> None:
    """Install the update module and its settings on a device (as root: sudo when the login is
    not root). ``remote`` is a colibri_kit.fleet.remote.Remote."""
    remote.run(["mkdir", "-p", "--", MODULE_PATH.rsplit("/", 1)[0], MODULE_CONF.rsplit("/", 1)[0]],
               sudo=True)
    remote.write_bytes(MODULE_PATH, module_script(), sudo=True)
    remote.run(["chmod", "0755", "--", MODULE_PATH], sudo=True)
    remote.write_bytes(MODULE_CONF, conf.encode(), sudo=True)
    remote.run(["chmod", "0644", "--", MODULE_CONF], sudo=True)
