"""Names and helpers the fleet tests share (the device roles are described in conftest.py)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

MAIN = ["jetson-00", "jetson-01", "jetson-02"]
XAVIER, SMALL_DISK, FAULTY = "jetson-03", "jetson-04", "jetson-05"


def rebuilt(src: Path, dest: Path, tag: str) -> Path:
    shutil.copytree(src, dest)
    manifest = json.loads((dest / "manifest.json").read_text())
    manifest["source_revision"] = f"{manifest.get('source_revision', '')}-{tag}"
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    return dest


def fleet_of(inventory, hosts, **kw):
    """A Fleet over SSH of these hosts (names or Host objects) of the emulated fleet."""
    from colibri_kit.fleet.fleet import Fleet, ssh_connector

    chosen = [inventory.hosts[h] if isinstance(h, str) else h for h in hosts]
    return Fleet(chosen, ssh_connector(inventory), **kw)


class Recording:
    """A remote (SSHRemote, LocalRemote) that passes every call on and records it, to prove what
    a run did not do: run's argv, and the name and first argument of every other method."""

    def __init__(self, inner) -> None:
        self.inner, self.name, self.calls = inner, inner.name, []

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass

    def run(self, argv, **kw):
        self.calls.append(tuple(argv))
        return self.inner.run(argv, **kw)

    def __getattr__(self, name: str):
        method = getattr(self.inner, name)

        def call(*args, **kw):
            self.calls.append((name, *args[:1]))
            return method(*args, **kw)
        return call
