"""Tasks for the emulated Jetson fleet: `invoke sim.up --count N`, `invoke sim.down`.

The only module under colibri_kit/ that imports colibri_kit.sim: the demo starts its fleet
through ``start`` and ``stop`` here."""

from __future__ import annotations

from pathlib import Path

from invoke import Context

from colibri_kit.report import table
from colibri_kit.sim import fleet as simlib
from colibri_kit.tasks._common import kit_task, user_errors


def start(count: int, target: str, state_dir: Path, disk_mb: int = 512) -> simlib.EmulatedFleet:
    """Start an emulated fleet and print its devices; returns it (``stop`` ends it)."""
    fleet = simlib.EmulatedFleet(count, target, state_dir, disk_mb=disk_mb)
    fleet.up()
    rows = [["device", "module", "address", "pid"]]
    rows += [[d.name, d.module, f"127.0.0.1:{d.port}", str(d.pid)] for d in fleet.devices]
    print(table(rows))
    print(f"\nfleet file: {fleet.fleet_file}")
    return fleet


def stop(fleet: simlib.EmulatedFleet) -> None:
    fleet.down()


def start_service_fleet(count: int, target: str, state_dir: Path, name_prefix: str = "svc"):
    """Start devices that boot a real systemd (sshd as a unit, each its own address;
    colibri_kit/sim/service_fleet.py) and print them; returns the ServiceFleet (``.down()``)."""
    from colibri_kit.sim.service_fleet import ServiceFleet

    fleet = ServiceFleet(count, state_dir, target=target, name_prefix=name_prefix).up()
    rows = [["device", "module", "address", "PID 1"]]
    rows += [[d.name, fleet.module, f"{d.address}:22", str(d.pid)] for d in fleet.devices]
    print(table(rows))
    return fleet


@kit_task(help={
    "count": "how many emulated devices to start (default 3)",
    "target": "target profile whose module the devices emulate (default orin-nx)",
    "state_dir": f"where keys, configs, pids, fleet.yaml and known_hosts go (default "
                 f"{simlib.STATE_DIR}); it must be yours and writable by nobody else",
    "disk_mb": "size of each device's /opt/colibri tmpfs in MiB (default 512)",
})
@user_errors
def up(c: Context, count: int = 3, target: str = "orin-nx", state_dir: str = "", disk_mb: int = 512) -> None:
    """Start N emulated Jetsons (real sshd on 127.0.0.1, faked Jetson files; needs root)."""
    fleet = start(count, target, Path(state_dir or simlib.STATE_DIR), disk_mb)
    print(f"next: invoke deploy --fleet {fleet.fleet_file} --target {target} --model MODEL")


@kit_task(help={"state_dir": f"state directory given to sim.up (default {simlib.STATE_DIR})"})
@user_errors
def down(c: Context, state_dir: str = "") -> None:
    """Stop the emulated Jetsons (kills their sshd and sessions; their mounts vanish with them)."""
    simlib.require_root("sim.down")
    n = simlib.stop_state_dir(Path(state_dir or simlib.STATE_DIR))
    print(f"stopped {n} emulated device(s)" if n else "no emulated devices running")


COLLECTIONS = {"sim": [up, down]}
