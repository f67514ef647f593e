"""Fixtures for the fleet tests: one emulated fleet (real sshd processes in mount namespaces) for
the whole session, the real orin-nx build, and the built-in tiny model.

Devices (all orin-nx unless said): jetson-00..02 the healthy fleet the main flow runs on,
jetson-03 a Xavier NX (wrong kind), jetson-04 a 16 MiB disk (disk full: two releases of the
orin-nx binary, 2.2 MB with its cubins, fit in it; the 24 MiB blob does not), jetson-05 for
injected faults (dropped connection, corruption)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from colibri_kit.fleet.inventory import Inventory, load_inventory

from fleet_support import rebuilt


@pytest.fixture(scope="session")
def sim_fleet(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0:
        pytest.fail("the fleet tests start sshd in mount namespaces and need root (CI runs as root)")
    from colibri_kit.sim.fleet import EmulatedFleet

    # Not under pytest's basetemp: a concurrent pytest run rotates old basetemps away, and sshd
    # re-reads its config (in the state dir) for every connection.
    state = Path(tempfile.mkdtemp(prefix="colibri-fleet-test-"))
    fleet = EmulatedFleet(6, "orin-nx", state,
                          modules=["orin-nx", "orin-nx", "orin-nx", "xavier-nx", "orin-nx", "orin-nx"],
                          disk_mb=[256, 256, 256, 256, 16, 256])
    try:
        with fleet:
            yield fleet
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def inventory(sim_fleet) -> Inventory:
    return load_inventory(sim_fleet.fleet_file)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from colibri_kit.model.tiny import write_tiny_model

    return Path(write_tiny_model(tmp_path_factory.mktemp("model") / "tiny-moe-4e2r.colibri", pad=64))


@pytest.fixture(scope="session")
def big_blob(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """24 MiB of deterministic bytes standing in for a large model (deploy does not parse models)."""
    path = tmp_path_factory.mktemp("blob") / "big.colibri"
    block = bytes(range(256)) * 4096
    with open(path, "wb") as fh:
        for i in range(24):
            fh.write(bytes([i]) + block[1:])
    return path


@pytest.fixture(scope="session")
def dist_a(orin_nx_build: Path) -> Path:
    return orin_nx_build


@pytest.fixture(scope="session")
def dist_b(orin_nx_build: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same binaries as a second build (another source revision): a different release id."""
    return rebuilt(orin_nx_build, tmp_path_factory.mktemp("dist") / "b", "b")
