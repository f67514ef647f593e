"""An emulated Jetson fleet: real ``sshd`` processes on loopback, each in its own mount namespace.

Each device is ``unshare -m --propagation private`` + a start script that mounts the device's view
of the machine, then ``exec``s ``/usr/sbin/sshd -D`` with its own config, host key and port on
127.0.0.1. Inside that namespace (and nowhere else):

* ``/sys`` is a bind mount of the device's faked sysfs tree (devicetree model/compatible, cpufreq,
  GPU devfreq), written by ``device_files.populate(root, module)``;
* ``/etc``, ``/usr`` (and any other top-level directory the faked tree has, e.g. ``/var``) are
  overlayfs mounts: the host directory is the bottom layer, the sim's own additions (a ``colibri``
  user with a sudo password, the authorized keys, a ``uname`` that reports aarch64) are the middle
  layer, and the faked tree's directory is the writable top layer, so ``/etc/nv_tegra_release``,
  ``/usr/bin/nvpmodel`` and ``/usr/bin/jetson_clocks`` appear at their real paths and whatever the
  stand-ins write lands in the faked tree, visible from the host. Nothing on the host is created
  or changed (no empty mount-point files are needed: overlays and the /sys bind provide the paths).
* ``/opt/colibri`` is a size-limited tmpfs (``disk_mb``): a real "disk full" fault.

aarch64 binaries run through ``qemu-aarch64`` registered in binfmt_misc with the F flag (the
interpreter is opened at registration, so it works inside any mount namespace); the aarch64 loader
and libc come from ``/usr/aarch64-linux-gnu`` via ``QEMU_LD_PREFIX``, which sshd sets for every
session (``SetEnv``). The registration is left in place by ``down`` (it is not a mount and other
fleets may use it); remove it with ``echo -1 > /proc/sys/fs/binfmt_misc/colibri-aarch64``.

``/proc/device-tree`` cannot be faked (procfs); the kit reads its sysfs twin
``/sys/firmware/devicetree/base`` as a real Jetson provides both.
"""

from __future__ import annotations

import json
import os
import secrets
import shlex
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

from colibri_kit.errors import FleetError
from colibri_kit.fleet.inventory import Host, write_inventory
from colibri_kit.sim.device_files import RT_BANDWIDTH, populate

POWER = Path(__file__).resolve().parent / "power.py"
STATE_DIR = Path("/run/colibri-sim")  # root's own /run: no other user can create it first
SIM_USER = "colibri"
SIM_UID = 4242
QEMU_LD_PREFIX = "/usr/aarch64-linux-gnu"
# The most a device may take to boot and answer SSH. Only a bound: every wait returns as soon as
# the device is up, so it costs nothing on a fast machine and keeps a loaded one (a CPU hog beside
# the tests, many devices booting at once on two cores) from failing a healthy boot.
BOOT_TIMEOUT = 180.0
BINFMT_DIR = Path("/proc/sys/fs/binfmt_misc")
BINFMT_NAME = "colibri-aarch64"
AARCH64_MAGIC = (r"\x7f\x45\x4c\x46\x02\x01\x01\x00\x00\x00\x00\x00\x00\x00\x00\x00\x02\x00\xb7\x00")
AARCH64_MASK = (r"\xff\xff\xff\xff\xff\xff\xff\x00\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff\xff\xff")


def private_dir(path: Path) -> Path:
    """``path`` as a directory only this user can enter: created 0700 when missing; an existing
    one must be a real directory owned by this user and writable by nobody else. The state dir
    holds the client key that logs into every device as root, so a directory another local user
    made (or can write) first would hand them root on the devices, i.e. on this machine."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = path.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise FleetError(f"state dir {path} is a symbolic link: use a directory of your own")
    if not stat.S_ISDIR(st.st_mode):
        raise FleetError(f"state dir {path} exists and is not a directory")
    if st.st_uid != os.geteuid():
        raise FleetError(f"state dir {path} is owned by uid {st.st_uid}, not by you "
                         f"(uid {os.geteuid()}): someone else made it; remove it or pick another")
    if st.st_mode & 0o002:
        raise FleetError(f"state dir {path} is writable by others: remove it or pick another")
    if st.st_mode & 0o020:
        raise FleetError(f"state dir {path} is writable by its group: remove it or pick another")
    os.chmod(path, 0o700)
    return path


@dataclass
class Device:
    """One emulated Jetson: its files under ``dir`` (``root/`` the faked tree, ``os.sh`` the
    mounts and sshd), and the process whose mount namespace is the running device's hardware
    (``power.py``). ``start``, ``stop`` and ``reboot`` are its power button; the files, host key,
    port and the disk (``/opt/colibri``) survive a reboot; a power-off loses the disk."""

    name: str
    module: str
    port: int
    dir: str
    pid: int = 0
    ns: str = ""        # mount namespace of pid when started: guards against a reused pid
    disk_mb: int = 512  # size of the device's disk (its /opt/colibri)

    @property
    def faked_root(self) -> Path:
        return Path(self.dir) / "root"

    @property
    def running(self) -> bool:
        return bool(self.pid) and _ns_of(self.pid) == self.ns and self.ns != _ns_of(os.getpid())

    def start(self) -> None:
        """Power on: the emulated hardware (``power.py``, its own mount namespace holding the
        disk) boots the OS (``os.sh``: mounts, nvpmodel's boot, sshd on ``port``)."""
        dev = Path(self.dir)
        log = dev / "sshd.log"
        env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "QEMU_LD_PREFIX": QEMU_LD_PREFIX}
        for stale in ("os.ns", "os.pid", "boots", "power-request"):
            (dev / stale).unlink(missing_ok=True)
        with open(log, "ab") as fh:
            proc = subprocess.Popen(
                ["unshare", "-m", "--propagation", "private", sys.executable, "-I", "-S",
                 str(POWER), str(dev), str(self.disk_mb), self.name],
                stdin=subprocess.DEVNULL, stdout=fh, stderr=fh, env=env, start_new_session=True)
        _wait_port(self.port, proc, log)
        self.pid, self.ns = proc.pid, _ns_of(proc.pid) or ""

    @property
    def boots(self) -> int:
        """How many times the OS has booted since ``start``."""
        try:
            return int((Path(self.dir) / "boots").read_text())
        except (OSError, ValueError):
            return 0

    @property
    def os_pid(self) -> int:
        """The running OS's first process (its sshd), whose root shows the device's mounts."""
        try:
            return int((Path(self.dir) / "os.pid").read_text())
        except (OSError, ValueError):
            return 0

    def _os_ns(self) -> str | None:
        try:
            return (Path(self.dir) / "os.ns").read_text().strip() or None
        except OSError:
            return None

    def stop(self) -> None:
        """Power off: the hardware stops every process of the OS and exits; whatever is left in
        either namespace is killed. The namespaces and their mounts (the disk too) go with the
        last process (they were never visible outside them)."""
        if self.running:
            with _pinned_ns(self.pid, self.ns) as hardware, \
                    _pinned_ns(self.os_pid, self._os_ns()) as os_ns:
                try:
                    os.kill(self.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
                for ns in (hardware, os_ns):
                    if ns and ns != _ns_of(os.getpid()):
                        _kill_ns(ns)
            try:
                os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:
                pass
        self.pid, self.ns = 0, ""

    def reboot(self, timeout: float = BOOT_TIMEOUT) -> None:
        """Press reset: the OS goes down (sshd and every process it started) and boots again on
        the same disk, in the mode nvpmodel recorded."""
        if not self.running:
            self.start()
            return
        before = self.boots
        (Path(self.dir) / "power-request").write_text("reboot\n")
        deadline = time.monotonic() + timeout
        while self.boots == before:
            if time.monotonic() > deadline:
                raise FleetError(f"{self.name} did not reboot within {timeout:g}s")
            time.sleep(0.05)
        _wait_port(self.port, None, Path(self.dir) / "sshd.log", timeout)

    def never_boot_again(self) -> None:
        """Fault: after its next power-off (a reboot) the device stays down."""
        (Path(self.dir) / "no-boot").write_text("1\n")


def _kill_ns(ns: str) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = _pids_in_ns(ns)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        for _ in range(50):
            if not _pids_in_ns(ns):
                break
            time.sleep(0.02)


def require_root(action: str) -> None:
    if os.geteuid() != 0:
        raise FleetError(
            f"{action} needs root: it mounts overlayfs/tmpfs in new mount namespaces, registers "
            f"qemu-aarch64 in binfmt_misc and starts sshd processes on 127.0.0.1. Run it as root "
            f"(e.g. in a container or CI job), or point --fleet at real devices instead"
        )


def ensure_binfmt() -> str:
    """Make sure aarch64 ELF files run through qemu-aarch64; returns the entry used."""
    if not (BINFMT_DIR / "register").exists():
        subprocess.run(["mount", "-t", "binfmt_misc", "binfmt_misc", str(BINFMT_DIR)], check=True)
    magic = AARCH64_MAGIC.replace(r"\x", "").lower()
    for entry in BINFMT_DIR.iterdir():
        if entry.name in ("register", "status"):
            continue
        text = entry.read_text()
        if text.startswith("enabled") and f"magic {magic}" in text and "flags: " in text \
                and "F" in text.split("flags: ", 1)[1].split("\n", 1)[0]:
            return entry.name
    qemu = shutil.which("qemu-aarch64")
    if qemu is None:
        raise FleetError("qemu-aarch64 not found: apt-get install qemu-user libc6-arm64-cross")
    (BINFMT_DIR / "register").write_text(
        f":{BINFMT_NAME}:M::{AARCH64_MAGIC}:{AARCH64_MASK}:{os.path.realpath(qemu)}:F\n")
    return BINFMT_NAME


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")


def _free_port(taken: set[int] | None = None) -> int:
    """A free port for a device's sshd, below the kernel's ephemeral range. A device's port
    must stay bindable while it reboots: a port in the ephemeral range can meanwhile become the
    source port of any outgoing connection on this machine (or its TIME_WAIT, for a minute), and
    sshd's bind then fails with EADDRINUSE even with SO_REUSEADDR, so the device never comes back
    (a CI run failed so). A real Jetson's sshd listens on 22, which is never ephemeral."""
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768                   # Linux's default range is 32768-60999
    first = 10000 if low > 12000 else 1024
    rng = secrets.SystemRandom()
    for _ in range(200):
        port = rng.randrange(first, low)
        if taken and port in taken:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise FleetError(f"no free port for an emulated device's sshd in {first}-{low - 1} "
                     f"(below the ephemeral range in {EPHEMERAL_RANGE})")


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None, log: Path,
               timeout: float = BOOT_TIMEOUT) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise FleetError(f"emulated device on port {port} exited: {log.read_text()[-2000:]}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
                if s.recv(4).startswith(b"SSH-"):
                    return
        except OSError:
            time.sleep(0.05)
    raise FleetError(f"emulated device on port {port} did not answer within {timeout:g}s: "
                     f"{log.read_text()[-2000:]}")


def _mountpoints_under(tops: list[str]) -> list[str]:
    """Mount points strictly below any of ``tops`` in this namespace (plain names only)."""
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4]
            if "\\" in point:
                continue  # escaped characters: not a path we can pass back safely
            if any(point.startswith(t + "/") for t in tops) and os.path.exists(point):
                points.append(point)
    return sorted(set(points), key=lambda p: (p.count("/"), p))


def _ns_of(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


@contextmanager
def _pinned_ns(pid: int, name: str | None) -> Iterator[str | None]:
    """``name`` while it is pid's mount namespace, held open so that the kernel cannot give its
    inode number (the name) to a namespace made meanwhile; None if pid is gone or elsewhere.
    Processes are killed by namespace name: a name freed in the middle of a kill was once taken
    by another device's new OS, which was then killed too (two devices rebooting in one batch,
    CI of 2026-12-03). power.py holds its OS's namespace the same way."""
    fd = None
    if pid and name:
        try:
            fd = os.open(f"/proc/{pid}/ns/mnt", os.O_RDONLY)
        except OSError:
            fd = None
    try:
        yield name if fd is not None and os.readlink(f"/proc/self/fd/{fd}") == name else None
    finally:
        if fd is not None:
            os.close(fd)


def _pids_in_ns(ns: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and _ns_of(int(entry)) == ns:
            pids.append(int(entry))
    return pids


class FleetFiles:
    """The files an emulated fleet writes for the kit to read, in its private state directory."""

    state_dir: Path

    @property
    def fleet_file(self) -> Path:
        return self.state_dir / "fleet.yaml"

    @property
    def known_hosts(self) -> Path:
        return self.state_dir / "known_hosts"

    @property
    def identity_file(self) -> Path:
        return self.state_dir / "id_ed25519"


class EmulatedFleet(FleetFiles):
    """``count`` emulated Jetsons of ``target``'s module; a context manager for tests.

    ``modules`` overrides the module per device (e.g. a Xavier among Orins); ``disk_mb`` sizes
    each device's /opt/colibri tmpfs (one value or a list)."""

    def __init__(
        self,
        count: int = 3,
        target: str = "orin-nx",
        state_dir: Path | str = STATE_DIR,
        *,
        modules: list[str] | None = None,
        disk_mb: int | list[int] = 512,
        name_prefix: str = "jetson",
        device_files_fn: Callable[[Path, str], None] = populate,
    ) -> None:
        if count < 1:
            raise FleetError(f"--count must be at least 1 (got {count})")
        self.count = count
        self.target = target
        self.state_dir = Path(state_dir).absolute()
        if any(c in str(self.state_dir) for c in ":, \n'\"\\"):
            raise FleetError(f"state dir {self.state_dir} must not contain ':', ',', quotes or spaces "
                             f"(it is used in overlayfs mount options)")
        self.modules = modules or [target] * count
        if len(self.modules) != count:
            raise FleetError("modules must name one module per device")
        self.disk_mb = disk_mb if isinstance(disk_mb, list) else [disk_mb] * count
        self.name_prefix = name_prefix
        self.device_files_fn = device_files_fn
        self.devices: list[Device] = []

    # -- files the kit reads ----------------------------------------------------------------------

    @property
    def sudo_password(self) -> str:
        return (self.state_dir / "sudo_password").read_text().strip()

    def hosts(self, user: str = "root") -> list[Host]:
        return [Host(name=d.name, address="127.0.0.1", port=d.port, user=user, target=self.target,
                     tags=(d.module,)) for d in self.devices]

    def device(self, name: str) -> Device:
        for d in self.devices:
            if d.name == name:
                return d
        raise KeyError(name)

    def path_in(self, name: str, path: str) -> Path:
        """A path as the device sees it, reachable from the host through /proc/<pid>/root."""
        return Path(f"/proc/{self.device(name).os_pid}/root") / path.lstrip("/")

    # -- lifecycle --------------------------------------------------------------------------------
    def __enter__(self) -> "EmulatedFleet":
        return self.up()

    def __exit__(self, *exc: object) -> None:
        self.down()

    def up(self) -> "EmulatedFleet":
        require_root("the emulated fleet")
        for tool in ("unshare", "ssh-keygen", "openssl"):
            if shutil.which(tool) is None:
                raise FleetError(f"{tool} not found (apt-get install util-linux openssh-client openssl)")
        if not Path("/usr/sbin/sshd").exists():
            raise FleetError("/usr/sbin/sshd not found: apt-get install openssh-server")
        private_dir(self.state_dir)
        if (self.state_dir / "state.json").exists():
            stop_state_dir(self.state_dir)
        ensure_binfmt()
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
        self._client_key()
        try:
            for i in range(self.count):
                self.devices.append(self._start_device(i))
                self._save()
        except BaseException:
            self.down()
            raise
        self._write_fleet_files()
        return self

    def down(self) -> None:
        for d in self.devices:
            d.stop()
        self.devices = []
        if (self.state_dir / "state.json").exists():
            (self.state_dir / "state.json").unlink()

    def reboot(self, name: str) -> None:
        """Reboot one device (see ``Device.reboot``) and record its pid for ``sim.down``."""
        self.device(name).reboot()
        self._save()

    def kill_sessions(self, name: str) -> int:
        """Kill every SSH session on the device but keep it listening (a dropped connection)."""
        d = self.device(name)
        killed = 0
        if not d.running:
            return killed
        with _pinned_ns(d.os_pid, d._os_ns()) as ns:
            for pid in _pids_in_ns(ns) if ns else []:
                if pid != d.os_pid:
                    try:
                        os.kill(pid, signal.SIGKILL)
                        killed += 1
                    except ProcessLookupError:
                        pass
        return killed

    # -- internals --------------------------------------------------------------------------------
    def _client_key(self) -> None:
        if not self.identity_file.exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "colibri-sim",
                            "-f", str(self.identity_file)], check=True)
        pw_file = self.state_dir / "sudo_password"
        if not pw_file.exists():
            pw_file.write_text(secrets.token_urlsafe(18) + "\n")
            os.chmod(pw_file, 0o600)

    def _layer(self, dev: Path) -> Path:
        """The sim's middle layer: user, sudoers, authorized keys, uname reporting aarch64."""
        layer = dev / "layer"
        etc = layer / "etc"
        (etc / "sudoers.d").mkdir(parents=True, exist_ok=True)
        (etc / "ssh").mkdir(parents=True, exist_ok=True)
        pw_hash = subprocess.run(["openssl", "passwd", "-6", "-stdin"], input=self.sudo_password,
                                 capture_output=True, text=True, check=True).stdout.strip()
        home = f"/home/{SIM_USER}"
        with open("/etc/passwd") as fh:
            passwd = [l for l in fh if not l.startswith(f"{SIM_USER}:")]
        with open("/etc/shadow") as fh:
            shadow = [l for l in fh if not l.startswith(f"{SIM_USER}:")]
        with open("/etc/group") as fh:
            group = [l for l in fh if not l.startswith(f"{SIM_USER}:")]
        (etc / "passwd").write_text("".join(passwd) + f"{SIM_USER}:x:{SIM_UID}:{SIM_UID}::{home}:/bin/sh\n")
        (etc / "shadow").write_text("".join(shadow) + f"{SIM_USER}:{pw_hash}:20000:0:99999:7:::\n")
        os.chmod(etc / "shadow", 0o640)
        (etc / "group").write_text("".join(group) + f"{SIM_USER}:x:{SIM_UID}:\n")
        (etc / "sudoers.d/colibri-sim").write_text(f"{SIM_USER} ALL=(ALL:ALL) ALL\n")
        os.chmod(etc / "sudoers.d/colibri-sim", 0o440)
        pub = Path(str(self.identity_file) + ".pub").read_text()
        (etc / "ssh/colibri_authorized_keys").write_text(pub)
        os.chmod(etc / "ssh/colibri_authorized_keys", 0o644)
        # pam_loginuid cannot write /proc/self/loginuid in every container: make it optional here.
        pam = etc / "pam.d"
        pam.mkdir(exist_ok=True)
        sshd_pam = Path("/etc/pam.d/sshd").read_text().replace(
            "session    required     pam_loginuid.so", "session    optional     pam_loginuid.so")
        (pam / "sshd").write_text(sshd_pam)
        (layer / "home" / SIM_USER).mkdir(parents=True, exist_ok=True)
        os.chown(layer / "home" / SIM_USER, SIM_UID, SIM_UID)
        (layer / "opt/colibri").mkdir(parents=True, exist_ok=True)
        # The device's reboot writes its request where the emulated hardware watches (power.py).
        (etc / "colibri-sim").mkdir(exist_ok=True)
        (etc / "colibri-sim/power-request").write_text(f"{dev / 'power-request'}\n")
        # The host's root dotfiles (e.g. a slow pyenv init in .bashrc, which bash reads for every
        # ssh command) are not the device's: shadow them with a stock-like, quiet pair.
        (layer / "root").mkdir(exist_ok=True)
        os.chmod(layer / "root", 0o700)
        for dotfile in (".bashrc", ".profile"):
            (layer / "root" / dotfile).write_text("# emulated Jetson: root's shell startup file\n")
        sim_lib = layer / "usr/lib/colibri-sim"
        sim_lib.mkdir(parents=True, exist_ok=True)
        shutil.copy2(os.path.realpath("/usr/bin/uname"), sim_lib / "uname")
        uname = layer / "usr/bin/uname"
        uname.parent.mkdir(parents=True, exist_ok=True)
        uname.write_text("#!/bin/sh\n# Emulated Jetson: report the guest architecture like qemu-user does.\n"
                         "/usr/lib/colibri-sim/uname \"$@\" | sed 's/x86_64/aarch64/g'\n")
        os.chmod(uname, 0o755)
        return layer

    def _start_device(self, i: int) -> Device:
        name = f"{self.name_prefix}-{i:02d}"
        module = self.modules[i]
        dev = self.state_dir / name
        if dev.exists():
            shutil.rmtree(dev)
        dev.mkdir(parents=True)
        root = dev / "root"
        root.mkdir()
        self.device_files_fn(root, module)
        # sysfs is volatile: every boot starts from the power-on tree (then nvpmodel's boot
        # applies the recorded mode); /etc, /var and the disk persist.
        shutil.copytree(root / "sys", dev / "sys-power-on", symlinks=True)
        layer = self._layer(dev)
        port = _free_port({d.port for d in self.devices})
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", name,
                        "-f", str(dev / "ssh_host_ed25519_key")], check=True)
        config = dev / "sshd_config"
        config.write_text("\n".join([
            f"Port {port}",
            "ListenAddress 127.0.0.1",
            f"HostKey {dev}/ssh_host_ed25519_key",
            f"PidFile {dev}/sshd.pid",
            "AuthorizedKeysFile /etc/ssh/colibri_authorized_keys",
            "PermitRootLogin prohibit-password",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM yes",
            "PrintMotd no",
            "Subsystem sftp internal-sftp",
            f"SetEnv QEMU_LD_PREFIX={QEMU_LD_PREFIX}",
            "MaxStartups 200:30:400",
            "MaxSessions 64",
            "LogLevel ERROR",
            "",
        ]))
        script = ["set -e"]
        top_dirs = sorted({p.name for p in root.iterdir()
                           if p.is_dir() and p.name not in ("sys", "proc")}
                          | {p.name for p in layer.iterdir() if p.is_dir()})
        # Mounts under a directory we overlay (in a container: /etc/hosts, /etc/resolv.conf) would
        # be hidden by the overlay: park them in a stash first and put them back on top after.
        restore = []
        stash = dev / "stash"
        for n, point in enumerate(_mountpoints_under([f"/{d}" for d in top_dirs])):
            stash.mkdir(exist_ok=True)
            held = stash / str(n)
            if os.path.isdir(point):
                held.mkdir()
            else:
                held.touch()
            script.append(shlex.join(["mount", "--bind", point, str(held)]))
            restore.append(shlex.join(["mount", "--bind", str(held), point]))
        for d in top_dirs:
            upper = root / d
            upper.mkdir(exist_ok=True)
            work = dev / "work" / d
            work.mkdir(parents=True, exist_ok=True)
            lowers = ([str(layer / d)] if (layer / d).is_dir() else []) + [f"/{d}"]
            if not Path(f"/{d}").is_dir():
                raise FleetError(f"emulated device files need /{d} on the host to exist")
            opts = f"lowerdir={':'.join(lowers)},upperdir={upper},workdir={work}"
            script.append(shlex.join(["mount", "-t", "overlay", "overlay", "-o", opts, f"/{d}"]))
        script += restore
        if (root / "sys").is_dir():
            script.append(shlex.join(["rm", "-rf", "--", str(root / "sys")]))
            script.append(shlex.join(["cp", "-a", "--", str(dev / "sys-power-on"),
                                      str(root / "sys")]))
            script.append(shlex.join(["mount", "--bind", str(root / "sys"), "/sys"]))
        # As LXCFS does: files (and the IRQ directory) of the device over the host's procfs.
        for rel in ("proc/meminfo", "proc/interrupts", "proc/cmdline", "proc/irq"):
            if (root / rel).exists():
                script.append(shlex.join(["mount", "--bind", str(root / rel), "/" + rel]))
        # A kernel draws a new boot_id at every boot (the kit confirms a reboot by it); procfs
        # here is the host's, so each boot binds its own (as /proc/meminfo above).
        boot_id = dev / "boot_id"
        script.append(f"cat /proc/sys/kernel/random/uuid > {shlex.quote(str(boot_id))}")
        script.append(shlex.join(["mount", "--bind", str(boot_id),
                                  "/proc/sys/kernel/random/boot_id"]))
        # The RT throttling files likewise (the kernel's values are the device's own: tune
        # writes them); kernel-boot fills them only when told they are bound (never the host's).
        rt_bound = []
        for rel in RT_BANDWIDTH:
            if (root / rel).exists():
                script.append(shlex.join(["mount", "--bind", str(root / rel), "/" + rel]))
                rt_bound.append(rel)
        script.append(shlex.join(["mount", "--bind", str(dev / "disk"), "/opt/colibri"]))
        # The kernel's boot (its command line from extlinux.conf, isolated CPUs, IRQ affinity),
        # then what L4T's nvpmodel.service does at every boot: apply the recorded mode, masks too.
        script.append(("COLIBRI_SIM_RT_BOUND=1 " if len(rt_bound) == 2 else "") +
                      "/usr/sbin/colibri-sim-kernel-boot || echo 'kernel boot failed' >&2")
        script.append("/usr/sbin/nvpmodel --sim-boot || echo 'nvpmodel boot failed' >&2")
        script.append('echo $$ > ' + shlex.quote(str(dev / "os.pid")))
        script.append(shlex.join(["exec", "/usr/sbin/sshd", "-D", "-e", "-f", str(config)]))
        (dev / "os.sh").write_text("\n".join(script) + "\n")
        device = Device(name=name, module=module, port=port, dir=str(dev),
                        disk_mb=self.disk_mb[i])
        device.start()
        return device

    def _save(self) -> None:
        (self.state_dir / "state.json").write_text(json.dumps(
            {"target": self.target, "devices": [asdict(d) for d in self.devices]}, indent=1))

    def _write_fleet_files(self) -> None:
        lines = []
        for d in self.devices:
            key = Path(d.dir, "ssh_host_ed25519_key.pub").read_text().split()
            lines.append(f"[127.0.0.1]:{d.port} {key[0]} {key[1]}\n")
        self.known_hosts.write_text("".join(lines))
        write_inventory(self.fleet_file, self.hosts(), known_hosts="known_hosts",
                        identity_file="id_ed25519",
                        groups={"sim": [d.name for d in self.devices]})


def stop_state_dir(state_dir: Path) -> int:
    """Stop the devices a previous ``up`` recorded in ``state_dir``; returns how many. The
    record says which processes to kill: only one in a private directory is believed."""
    state = state_dir / "state.json"
    if not state.exists():
        return 0
    private_dir(state_dir)
    devices = [Device(**d) for d in json.loads(state.read_text())["devices"]]
    for d in devices:
        d.stop()
    state.unlink()
    return len(devices)
