"""Packaging tasks: a release as a Mender artifact, and the `colibri` update module on devices
(docs/fleet.md, "Mender")."""

from __future__ import annotations

from pathlib import Path

from invoke import Context
from invoke.exceptions import Exit

from colibri_kit.paths import dist_dir, project_root
from colibri_kit.tasks._common import kit_task, user_errors
from colibri_kit.fleet.fleet import DEFAULT_KEEP
from colibri_kit.tasks.fleet import SELECT_HELP, _cfg, select_fleet


@kit_task(help={
    "target": "target profile (dist/<target>/ must be built and verify against its manifest)",
    "model": "the .colibri model the release serves (shipped content-addressed, by sha256)",
    "format": "package format: mender (the only one so far)",
    "sign_key": "PEM private key to sign with (PKCS#1 RSA or EC, as mender-artifact reads); devices "
                "verify it with ArtifactVerifyKey in mender.conf",
    "out": "output file (default dist/<release id>.mender, e.g. dist/orin-nx-0123456789ab.mender)",
    "device_type": "Mender device_type the artifact is for (default colibri-<target>)",
    "dist": "package this dist directory instead of dist/<target>/",
})
@user_errors
def package(c: Context, target: str, model: str = "", format: str = "mender", sign_key: str = "",
            out: str = "", device_type: str = "", dist: str = "") -> None:
    """Write the verified dist/<target>/ release + model as a Mender artifact (`colibri` module).

    Same release id and model sha256 as `invoke deploy` of the same build; the artifact provides
    rootfs-image.colibri.version=<release id>, colibri.target and colibri.model_sha256, and
    installs only on devices whose device_type is colibri-<target> (or --device-type)."""
    from colibri_kit import mender
    from colibri_kit.fleet.deploy import prepare
    from colibri_kit.profiles import load_profile

    if not model:
        raise Exit("error: give the model the release serves: --model FILE.colibri", code=1)
    if format != "mender":
        raise Exit(f"error: unknown --format {format!r} (supported: mender)", code=1)
    profile = load_profile(target)
    art = prepare(profile, Path(dist) if dist else dist_dir(target), Path(model))
    dest = Path(out) if out else project_root() / "dist" / f"{art.release_id}.mender"
    mender.write_artifact(art, dest, device_type=device_type or mender.device_type_for(profile.name),
                          sign_key=Path(sign_key) if sign_key else None)
    print(f"{dest}: release {art.release_id}, model {art.model_sha[:12] if art.model_sha else '-'}, "
          f"device type {device_type or mender.device_type_for(profile.name)}"
          f"{', signed' if sign_key else ', unsigned'}")


@kit_task(help={
    **SELECT_HELP,
    "target": "profile whose service settings (port, API key file, model id) the module's health "
              "gate uses; also selects hosts whose target is T, or hosts with no target",
    "gate_timeout": "seconds the module's health gate waits after a restart (default 90)",
    "keep": "releases the module keeps after a commit, besides current and previous (default: "
            "fleet.keep in invoke.yaml, else 3)",
})
@user_errors
def mender_module(c: Context, target: str, fleet: str = "", hosts: str = "", group: str = "",
                  tags: str = "", parallel: int = 0, accept_new_host_keys: bool = False,
                  gate_timeout: int = 90, keep: int = 0) -> None:
    """Install the `colibri` Mender update module (+ its settings) on devices over SSH."""
    from colibri_kit import mender
    from colibri_kit.profiles import load_profile
    from colibri_kit.service import ServiceSpec, UNIT_NAME

    profile = load_profile(target)
    f = select_fleet(c, fleet, hosts, group, target, tags, parallel, accept_new_host_keys)

    def one(remote, host) -> str:
        spec = (profile.service or ServiceSpec()).with_root(host.root)
        mender.install_module(remote, mender.module_conf(
            root=host.root, unit=UNIT_NAME, health_url=spec.health_url,
            api_key_file=spec.api_key_file, model_id=spec.model_id, gate_timeout=gate_timeout,
            user=spec.user, keep=keep or int(_cfg(c, "keep", DEFAULT_KEEP))))
        return "installed"

    failed = []
    for o in f.run(one):
        print(f"{o.host}: {o.value if o.value is not None else 'FAILED: ' + str(o.error)}")
        if o.value is None:
            failed.append(o.host)
    if failed:
        raise Exit(f"failed on {len(failed)} host(s): {', '.join(failed)}", code=1)


TASKS = [package, mender_module]
