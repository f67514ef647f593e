"""Emulated Jetsons that boot a real systemd: the fleet the service tests deploy to.

Each device is a ``SystemdDevice`` (colibri_kit/sim/systemd.py): the host's systemd 252 as PID 1
in the device's namespaces, with its own network namespace (an address from 198.18.0.0/15), so
every device serves the profile's port 8080 and runs sshd on port 22 **as a systemd unit**. What
makes it look like a Jetson is the fleet emulation's (colibri_kit/sim/fleet.py,
device_files.py): the faked files of ``device_files.populate(root, module)`` (devicetree model
and compatible bound over ``/sys``, ``/etc/nv_tegra_release``, the nvpmodel/jetson_clocks
stand-ins as read-only layers), the aarch64 ``uname`` qemu-user would report, and aarch64
binaries run through the qemu-user binfmt entry (``ensure_binfmt``) with
``QEMU_LD_PREFIX=/usr/aarch64-linux-gnu`` for systemd's units and for every SSH session.

The kit reaches the devices as it reaches real ones: over SSH, host keys verified against the
state dir's ``known_hosts``, from the ``fleet.yaml`` written there, logging in as root.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from colibri_kit.errors import FleetError
from colibri_kit.fleet.inventory import Host, write_inventory
from colibri_kit.sim.device_files import populate
from colibri_kit.sim.fleet import (BOOT_TIMEOUT, QEMU_LD_PREFIX, FleetFiles, ensure_binfmt,
                                   private_dir, require_root)
from colibri_kit.sim.systemd import SystemdDevice, free_addresses, require_tools, sshd_unit

SSHD_UNIT = "sim-sshd.service"
SIM_ETC = "/etc/colibri-sim"


class ServiceFleet(FleetFiles):
    """``count`` systemd-booted emulated devices of ``module``; a context manager for tests."""

    def __init__(self, count: int, state_dir: Path | str, *, target: str = "orin-nx",
                 module: str | None = None, name_prefix: str = "svc") -> None:
        if not 1 <= count <= 8:
            raise FleetError(f"count must be 1..8 (got {count})")
        self.count = count
        self.module = module or target   # as sim/fleet.py: the target names its module
        self.target = target
        self.state_dir = Path(state_dir).absolute()
        self.name_prefix = name_prefix
        self.devices: list[SystemdDevice] = []

    def device(self, name: str) -> SystemdDevice:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def hosts(self) -> list[Host]:
        return [Host(name=d.name, address=str(d.address), port=22, user="root", target=self.target,
                     tags=(self.module,)) for d in self.devices]

    def __enter__(self) -> "ServiceFleet":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> "ServiceFleet":
        require_root("the systemd-booted emulated fleet")
        require_tools()
        private_dir(self.state_dir)
        ensure_binfmt()
        if not self.identity_file.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "colibri-sim",
                            "-f", str(self.identity_file)], check=True)
        try:
            for i, address in enumerate(free_addresses(self.count)):
                self.devices.append(self._device(f"{self.name_prefix}-{i:02d}", address))
            for d in self.devices:
                d.boot()
            for d in self.devices:
                self.wait_ssh(d)
        except BaseException:
            self.down()
            raise
        lines = []
        for d in self.devices:
            key = (self.state_dir / d.name / "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"{d.address} {key[0]} {key[1]}\n")
        self.known_hosts.write_text("".join(lines))
        write_inventory(self.fleet_file, self.hosts(), known_hosts="known_hosts",
                        identity_file="id_ed25519", groups={"sim": [d.name for d in self.devices]})
        return self

    def down(self) -> None:
        for d in self.devices:
            d.kill()
        self.devices = []

    @staticmethod
    def wait_ssh(dev: SystemdDevice, timeout: float = BOOT_TIMEOUT) -> None:
        """Until sshd (a unit of the device) accepts connections on the device's port 22."""
        end = time.monotonic() + timeout
        while True:
            try:
                with socket.create_connection((str(dev.address), 22), timeout=1):
                    return
            except OSError:
                if time.monotonic() > end:
                    raise FleetError(f"{dev.name}: sshd did not start within {timeout:g}s "
                                     f"({dev.systemctl('status', SSHD_UNIT, check=False).stdout[-500:]})")
                time.sleep(0.1)

    def _device(self, name: str, address: str) -> SystemdDevice:
        top = self.state_dir / name
        if top.exists():
            shutil.rmtree(top)
        fake = top / "fake"
        fake.mkdir(parents=True)
        populate(fake, self.module)
        (fake / "sys/fs/cgroup").mkdir(parents=True, exist_ok=True)  # systemd mounts its cgroups there
        layer = top / "layer"
        etc = layer / SIM_ETC.lstrip("/")
        etc.mkdir(parents=True)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
                        "-f", str(top / "ssh_host_ed25519_key")], check=True)
        shutil.copy2(top / "ssh_host_ed25519_key", etc / "ssh_host_ed25519_key")
        os.chmod(etc / "ssh_host_ed25519_key", 0o600)
        shutil.copy2(str(self.identity_file) + ".pub", etc / "authorized_keys")
        (etc / "sshd_config").write_text("\n".join([
            "Port 22", "ListenAddress 0.0.0.0", f"HostKey {SIM_ETC}/ssh_host_ed25519_key",
            f"AuthorizedKeysFile {SIM_ETC}/authorized_keys", "PermitRootLogin prohibit-password",
            "PasswordAuthentication no", "KbdInteractiveAuthentication no", "UsePAM no",
            "PidFile /run/sshd-sim.pid", "Subsystem sftp internal-sftp", f"SetEnv QEMU_LD_PREFIX={QEMU_LD_PREFIX}",
            "MaxStartups 200:30:400", "MaxSessions 64", "LogLevel ERROR", ""]))
        # qemu-user reports the guest's machine: so does the device's uname (as sim/fleet.py's).
        sim_lib = layer / "usr/lib/colibri-sim"
        sim_lib.mkdir(parents=True)
        shutil.copy2(os.path.realpath("/usr/bin/uname"), sim_lib / "uname")
        (layer / "usr/bin").mkdir(parents=True)
        (layer / "usr/bin/uname").write_text(
            "#!/bin/sh\n# Emulated Jetson: report the guest architecture like qemu-user does.\n"
            "/usr/lib/colibri-sim/uname \"$@\" | sed 's/x86_64/aarch64/g'\n")
        os.chmod(layer / "usr/bin/uname", 0o755)
        # The host's root dotfiles are not the device's (bash reads .bashrc for every ssh command).
        (layer / "root").mkdir(mode=0o700)
        for dotfile in (".bashrc", ".profile"):
            (layer / "root" / dotfile).write_text("# emulated Jetson: root's shell startup file\n")
        layers = {"etc": [fake / "etc", layer / "etc"], "usr": [fake / "usr", layer / "usr"],
                  "root": [layer / "root"]}
        if (fake / "var").is_dir():
            layers["var"] = [fake / "var"]
        return SystemdDevice(
            name, self.state_dir / "devices", units={SSHD_UNIT: sshd_unit(f"{SIM_ETC}/sshd_config")},
            default_environment={"QEMU_LD_PREFIX": QEMU_LD_PREFIX}, layers=layers,
            binds=[(fake / "sys", "/sys")], address=address)
