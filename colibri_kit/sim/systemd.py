"""An emulated device that runs a REAL systemd (the host's, Debian 12's systemd 252) as PID 1.

``SystemdDevice.boot()`` starts ``unshare --pid --fork --mount --uts --ipc --mount-proc
--propagation private /bin/sh start.sh``; the start script builds the device's view of the
machine and then ``exec``s ``/lib/systemd/systemd``, which is PID 1 of the new PID namespace.
What the device sees (checked with systemd 252 on Debian 12 under unshare, cgroup v1 hybrid):

* ``/etc``, ``/var`` and ``/opt``: overlayfs, the host's directory below, the device's own upper
  layer on top (``<state>/<name>/upper/{etc,var,opt}``), so what the device writes (users, unit files, its
  journal under ``/var/log/journal``) is its own and survives a reboot;
* ``/etc/systemd/system``: a bind mount of the device's own directory (``<state>/<name>/units``)
  holding only what the sim and the kit put there: the host's enabled services (sshd, a
  database...) are not the device's. Units that have no business in a device emulated inside a
  shared machine (udev, getty, logind, sysctl, binfmt, kernel-module and hugepage mounts, ...)
  are masked there: several of them write kernel-global state;
* ``/opt/colibri``: a bind mount of ``<state>/<name>/opt`` (the install root, kept on reboot);
* ``/tmp``, ``/var/tmp``, ``/run``: fresh tmpfs mounted BEFORE systemd starts, because its boot
  runs ``systemd-tmpfiles``, which empties ``/tmp`` of the filesystem it sees;
* ``/dev``: a tmpfs with bind mounts of the harmless host nodes (null, zero, full, random,
  urandom, tty), its own devpts and ``/dev/shm``: journald links ``/dev/log`` and must not do
  that in the host's ``/dev``;
* cgroups: PID 1 starts in ``colibri-sim/<name>`` of every cgroup hierarchy (cpuset excepted),
  which systemd then takes as its root (a PID 1 outside the root cgroup does), so two devices
  never share ``system.slice/colibri.service``;
* ``container=colibri-sim`` in PID 1's environment: systemd behaves as in a container
  (``ConditionVirtualization=container``; it exits instead of rebooting the machine).

Commands run inside with ``nsenter`` (mount, PID, UTS and IPC namespaces of PID 1). The device
stops through its own ``systemctl poweroff`` (PID 1 ignores SIGTERM); ``kill()`` sends SIGKILL to
PID 1 only (the pid this object started; the kernel then kills the rest of its PID namespace).
The network namespace is the host's: services listen on host ports (pick free ones).

Not imported by the product code.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import time
from pathlib import Path

from colibri_kit.errors import FleetError
from colibri_kit.sim.fleet import BOOT_TIMEOUT

SYSTEMD = "/lib/systemd/systemd"
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
CGROUP_PARENT = "colibri-sim"

# Vendor units a shared machine must not run for each device (kernel-global writes, hardware,
# logins): masked in the device's /etc/systemd/system. What stays: journald, tmpfiles, sysusers,
# the targets, and whatever the kit installs.
MASKED_UNITS = (
    "systemd-binfmt.service", "proc-sys-fs-binfmt_misc.automount", "proc-sys-fs-binfmt_misc.mount",
    "systemd-sysctl.service", "systemd-modules-load.service", "kmod-static-nodes.service",
    "systemd-random-seed.service", "systemd-firstboot.service", "systemd-repart.service",
    "systemd-pcrphase-sysinit.service", "systemd-pcrphase.service",
    "sys-kernel-config.mount", "sys-kernel-debug.mount", "sys-kernel-tracing.mount",
    "sys-fs-fuse-connections.mount", "dev-hugepages.mount", "dev-mqueue.mount",
    "getty.target", "console-getty.service", "systemd-logind.service",
    "dbus.service", "dbus.socket", "systemd-tmpfiles-setup-dev.service",
    "systemd-udevd.service", "systemd-udev-trigger.service", "systemd-udev-settle.service",
    "systemd-udevd-control.socket", "systemd-udevd-kernel.socket",
    "systemd-remount-fs.service", "systemd-ask-password-wall.path",
    "systemd-ask-password-console.path", "systemd-machine-id-commit.service",
    "cryptsetup.target", "veritysetup.target", "integritysetup.target",
    "systemd-hwdb-update.service", "ldconfig.service", "systemd-journald-audit.socket",
    "systemd-tmpfiles-clean.timer", "e2scrub_reap.service", "systemd-update-utmp.service",
    "systemd-update-utmp-runlevel.service",
)
DEV_NODES = ("null", "zero", "full", "random", "urandom", "tty")
_UNSAFE = set(":, \n'\"\\%")


def require_tools() -> None:
    if os.geteuid() != 0:
        raise FleetError("an emulated systemd device needs root (namespaces, overlayfs, cgroups); "
                         "run it as root, e.g. in a container or CI job")
    for tool in ("unshare", "nsenter", "mount"):
        if shutil.which(tool) is None:
            raise FleetError(f"{tool} not found: apt-get install util-linux mount")
    if not Path(SYSTEMD).exists():
        raise FleetError(f"{SYSTEMD} not found: apt-get install systemd")


def _cgroup_hierarchies() -> list[Path]:
    """Mount points of this namespace's cgroup hierarchies, cpuset excepted (a cpuset cgroup
    needs cpus/mems set before a task may join; systemd does not use it on v1)."""
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            fields = line.split()
            sep = fields.index("-")
            fstype, opts = fields[sep + 1], fields[sep + 3] if len(fields) > sep + 3 else ""
            point = fields[4]
            if fstype not in ("cgroup", "cgroup2") or "\\" in point:
                continue
            if fstype == "cgroup" and "cpuset" in opts.split(","):
                continue
            points.append(Path(point))
    return sorted(set(points))


def _pidns_of(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def free_addresses(count: int = 1, network: str = "198.18.0.0/15") -> list[str]:
    """``count`` device addresses whose /31s are unused on this machine (198.18.0.0/15: RFC
    2544's benchmarking range, never routed)."""
    used = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True).stdout
    taken = {ipaddress.IPv4Address(w.split("/")[0]) for w in used.split() if w.count(".") == 3 and "/" in w}
    net = ipaddress.IPv4Network(network)
    found: list[str] = []
    for base in range(int(net.network_address) + 2, int(net.broadcast_address) - 1, 2):
        host, dev = ipaddress.IPv4Address(base), ipaddress.IPv4Address(base + 1)
        if host not in taken and dev not in taken:
            found.append(str(dev))
            if len(found) == count:
                return found
    raise FleetError(f"not enough free address pairs left in {network}")


def stop_devices(state_dir: Path | str) -> int:
    """Stop every device a crashed session left running under ``state_dir`` (from their
    running.json records); returns how many PID 1s were killed."""
    killed = 0
    for record in sorted(Path(state_dir).glob("*/running.json")):
        killed += SystemdDevice(record.parent.name, Path(state_dir))._stop_recorded()
    return killed


def _mountpoints_under(tops: list[str]) -> list[str]:
    """Mount points strictly below any of ``tops`` in this namespace (plain names only)."""
    points = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4]
            if "\\" in point:
                continue  # escaped characters: not a path to pass on
            if any(point.startswith(t + "/") for t in tops) and os.path.exists(point):
                points.append(point)
    return sorted(set(points), key=lambda p: (p.count("/"), p))


def sshd_unit(config: str) -> str:
    """A unit that runs the host's sshd with ``config`` (an absolute path) in the device."""
    if not config.startswith("/") or any(c in _UNSAFE for c in config):
        raise FleetError(f"sshd config path {config!r} must be absolute and plain")
    return ("[Unit]\nDescription=OpenSSH server of the emulated device\nAfter=network.target\n\n"
            f"[Service]\nExecStart=/usr/sbin/sshd -D -e -f {config}\nRestart=on-failure\n"
            "RuntimeDirectory=sshd\nRuntimeDirectoryMode=0755\n\n"
            "[Install]\nWantedBy=multi-user.target\n")


class SystemdDevice:
    """One device: its state lives in ``state_dir/<name>`` and survives ``poweroff``/``reboot``.

    ``units`` are extra unit files (name -> text) installed and enabled in the device before its
    first boot; ``default_environment`` goes to systemd's ``DefaultEnvironment=`` (e.g.
    ``QEMU_LD_PREFIX`` for aarch64 binaries run through qemu-user's binfmt entry).
    ``layers`` adds read-only layers above the host's directory of a top-level directory
    (``{"usr": [sim_layer / "usr"], "etc": [...]}``: the emulated Jetson's tools and files);
    ``binds`` bind-mounts host paths at device paths (``[(faked / "sys", "/sys")]``)
    after the overlays; the device path must exist in the device's view.
    ``address`` (an IPv4 address, e.g. from ``free_addresses()``) gives the device its own network
    namespace: its own loopback (every device may listen on 127.0.0.1:8080 and :22) and an
    ``eth0`` with that address, joined by a veth pair (/31) to the host, which reaches the
    device at ``address``. Without it the device shares the host's network."""

    def __init__(self, name: str, state_dir: Path | str, *, units: dict[str, str] | None = None,
                 default_environment: dict[str, str] | None = None,
                 layers: dict[str, list[Path]] | None = None,
                 binds: list[tuple[Path, str]] | None = None,
                 address: str | None = None, rt_runtime_us: int = 0) -> None:
        if not name or not all(c.isalnum() or c == "-" for c in name) or len(name) > 40:
            raise FleetError(f"device name {name!r}: letters, digits and '-' only")
        self.name = name
        self.dir = Path(state_dir).resolve() / name
        if any(c in _UNSAFE for c in str(self.dir)):
            raise FleetError(f"state dir {self.dir} must not contain ':', ',', '%', quotes or "
                             f"spaces (it is used in overlayfs mount options)")
        self.layers = {k: [Path(p).resolve() for p in v] for k, v in (layers or {}).items()}
        for top in ("/etc", "/var", "/opt", "/run", "/dev", *(f"/{t}" for t in self.layers)):
            if str(self.dir) == top or str(self.dir).startswith(top + "/"):
                raise FleetError(f"state dir {self.dir} must not be under {top}: the device "
                                 f"mounts its own {top} over it")
        for top, lowers in self.layers.items():
            if top in ("tmp", "run", "dev", "proc", "sys") or not top.isidentifier() \
                    or not Path(f"/{top}").is_dir():
                raise FleetError(f"layers: /{top} cannot be overlaid (a top-level host directory "
                                 f"other than /tmp, /run, /dev, /proc, /sys)")
            for p in lowers:
                if any(c in _UNSAFE for c in str(p)) or not p.is_dir():
                    raise FleetError(f"layers: {p} must be an existing directory with a plain name")
        self.binds = [(Path(src).resolve(), dst) for src, dst in (binds or [])]
        for src, dst in self.binds:
            if not src.exists() or not dst.startswith("/") or any(c in _UNSAFE for c in dst):
                raise FleetError(f"binds: {src} -> {dst}: the source must exist and the target "
                                 f"be an absolute plain path")
        self.address = self.host_address = None
        if address is not None:
            try:
                ip = ipaddress.IPv4Address(address)
            except ValueError:
                raise FleetError(f"address {address!r} is not an IPv4 address") from None
            self.address, self.host_address = str(ip), str(ipaddress.IPv4Address(int(ip) ^ 1))
        # the host end of the veth pair: unique per state dir and name, at most 15 characters
        self.host_if = "cs" + hashlib.sha256(str(self.dir).encode()).hexdigest()[:12]
        self.units = dict(units or {})
        for unit in self.units:
            if not re.fullmatch(r"[A-Za-z0-9@_.-]+\.(service|socket|target|timer|path|mount)", unit):
                raise FleetError(f"units: {unit!r} is not a unit file name such as sim-sshd.service")
        self.default_environment = dict(default_environment or {})
        for k, v in self.default_environment.items():
            if not k.isidentifier() or any(c in _UNSAFE or c.isspace() for c in v):
                raise FleetError(f"default environment {k}={v!r}: plain values only "
                                 f"(no spaces, quotes, ':', ',', '%')")
        if not isinstance(rt_runtime_us, int) or not 0 <= rt_runtime_us <= 950_000:
            raise FleetError(f"rt_runtime_us {rt_runtime_us!r}: 0..950000 (of every 1 s)")
        self.rt_runtime_us = rt_runtime_us
        self.proc: subprocess.Popen[bytes] | None = None
        self.pid = 0           # host pid of the device's PID 1
        self.boots = 0

    # -- paths ------------------------------------------------------------------------------------
    @property
    def install_root(self) -> Path:
        """The host directory that the device sees as /opt/colibri."""
        return self.dir / "opt"

    def path(self, path: str) -> Path:
        """A path as the running device sees it, reachable from the host via /proc/<pid>/root."""
        if not self.running():
            raise FleetError(f"{self.name} is not running")
        return Path(f"/proc/{self.pid}/root") / path.lstrip("/")

    # -- lifecycle --------------------------------------------------------------------------------
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None and self.pid > 0

    def boot(self, timeout: float = BOOT_TIMEOUT) -> str:
        """Start the device and wait until systemd reports ``running`` or ``degraded``; returns
        that state. The first boot creates the device's state."""
        require_tools()
        if self.running():
            raise FleetError(f"{self.name} is already running (pid {self.pid})")
        self._stop_recorded()  # a PID 1 left running by a session that died
        if not (self.dir / "start.sh").exists():
            self._prepare()
        self._cgroups_create()
        log = open(self.dir / "boot.log", "ab")
        try:
            self.proc = subprocess.Popen(
                ["unshare", "--pid", "--fork", "--kill-child", "--mount", "--uts", "--ipc", "--mount-proc",
                 *(["--net"] if self.address else []),
                 "--propagation", "private", "/bin/sh", str(self.dir / "start.sh")],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                env={"PATH": PATH})
        finally:
            log.close()
        try:
            # the start script's pid is PID 1's: it execs systemd
            self.pid = self._wait_child(timeout)
            (self.dir / "running.json").write_text(json.dumps(
                {"pid": self.pid, "pidns": _pidns_of(self.pid)}))
            if self.address:
                self._plug_network(self.pid)
            self._wait_pid1(timeout)
        except BaseException:
            self.kill()
            raise
        self.boots += 1
        state = ""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.running():
                break
            res = self.run(["systemctl", "is-system-running"], check=False, timeout=10)
            state = res.stdout.strip()
            if state in ("running", "degraded"):
                return state
            time.sleep(0.2)
        tail = (self.dir / "boot.log").read_text(errors="replace")[-2000:]
        self.kill()
        raise FleetError(f"{self.name}: systemd did not finish booting within {timeout:g}s "
                         f"(state {state or 'unknown'}): {tail}")

    def poweroff(self, timeout: float = 30.0) -> int:
        """``systemctl poweroff`` inside; SIGKILL PID 1 if it is not down in ``timeout``.
        Returns the exit status of the unshare process."""
        if not self.running():
            return self._reap()
        self.run(["systemctl", "--no-block", "poweroff"], check=False, timeout=10)
        assert self.proc is not None
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
        return self._reap()

    def kill(self) -> int:
        """SIGKILL the device's PID 1 (the kernel kills everything else in its PID namespace)."""
        if self.proc is not None and self.proc.poll() is None:
            if self.pid:
                try:
                    os.kill(self.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            else:  # PID 1 not known yet: unshare --kill-child takes its child along
                self.proc.kill()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()   # the unshare process we started, never anything else
                self.proc.wait(10)
        return self._reap()

    def reboot(self, timeout: float = BOOT_TIMEOUT) -> str:
        """Power off (everything stops, state on disk kept) and boot again."""
        self.poweroff()
        return self.boot(timeout)

    def __enter__(self) -> "SystemdDevice":
        self.boot()
        return self

    def __exit__(self, *exc: object) -> None:
        self.poweroff()

    # -- commands ---------------------------------------------------------------------------------
    def run(self, argv: list[str], *, check: bool = True, input: str | None = None,
            timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as root inside the device (its mount, PID, UTS and IPC namespaces)."""
        if not self.running():
            raise FleetError(f"{self.name} is not running")
        cmd = ["nsenter", "-t", str(self.pid), "-m", "-p", "-u", "-i", *(["-n"] if self.address else []), "--",
               "/usr/bin/env", "-i", f"PATH={PATH}", "LANG=C.UTF-8", "SYSTEMD_PAGER=",
               "SYSTEMD_COLORS=0", *argv]
        # A session of its own: a process group is not confined by the PID namespace, so a
        # `kill -9 0` (or `kill -- -1` by a unit) inside the device would otherwise also kill
        # the test runner, which shares the caller's group. It did: a test that sent `kill -9`
        # to MainPID 0 (the service had not been deployed) ended a whole pytest run silently.
        res = subprocess.run(cmd, input=input, capture_output=True, text=True, timeout=timeout,
                             start_new_session=True)
        if check and res.returncode != 0:
            raise FleetError(f"{self.name}: {shlex.join(argv)} exited {res.returncode}: "
                             f"{(res.stderr or res.stdout).strip()[-2000:]}")
        return res

    def sh(self, script: str, **kw: object) -> subprocess.CompletedProcess[str]:
        return self.run(["/bin/sh", "-c", script], **kw)  # type: ignore[arg-type]

    def systemctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(["systemctl", "--no-pager", *args], check=check)

    def write(self, path: str, data: str | bytes, mode: int = 0o644) -> Path:
        """Write a file into the running device's view (parents made 0755), as root."""
        target = self.path(path)
        target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        if isinstance(data, str):
            data = data.encode()
        target.write_bytes(data)
        os.chmod(target, mode)
        return target

    def main_pid(self, unit: str) -> int:
        """The unit's main PID as the device numbers it (0 when not running)."""
        out = self.systemctl("show", "-p", "MainPID", "--value", unit).stdout.strip()
        return int(out or 0)

    # -- internals --------------------------------------------------------------------------------
    def _prepare(self) -> None:
        d = self.dir
        tops = sorted({"etc", "var", "opt", *self.layers})
        for sub in ("units", "opt", "devstage", *(f"{k}/{t}" for t in tops for k in ("upper", "work"))):
            (d / sub).mkdir(parents=True, exist_ok=True)
        etc = d / "upper/etc"
        (etc / "hostname").write_text(self.name + "\n")
        (etc / "machine-id").write_text(secrets.token_hex(16) + "\n")
        units = d / "units"
        for unit in MASKED_UNITS:
            link = units / unit
            if not link.is_symlink():
                link.symlink_to("/dev/null")
        wants = units / "multi-user.target.wants"
        wants.mkdir(exist_ok=True)
        for name, text in self.units.items():
            (units / name).write_text(text)
            if "[Install]" in text:
                link = wants / name
                if not link.is_symlink():
                    link.symlink_to(f"/etc/systemd/system/{name}")
        if self.default_environment:
            conf = etc / "systemd/system.conf.d"
            conf.mkdir(parents=True, exist_ok=True)
            pairs = [f"{k}={v}" for k, v in self.default_environment.items()]
            (conf / "colibri-sim.conf").write_text(
                "# emulated device: environment of every service\n[Manager]\n"
                f"DefaultEnvironment={' '.join(pairs)}\n")
        q = shlex.quote
        stage = d / "devstage"
        cg = [f"{q(str(h / CGROUP_PARENT / self.name / 'cgroup.procs'))}" for h in _cgroup_hierarchies()]
        # Mounts below an overlaid directory (in a container: /etc/hosts, /etc/resolv.conf) would
        # be hidden by the overlay: park them in a stash and put them back on top after.
        stash, park, unpark = d / "stash", [], []
        for n, point in enumerate(_mountpoints_under([f"/{t}" for t in tops])):
            stash.mkdir(exist_ok=True)
            held = stash / str(n)
            if os.path.isdir(point):
                held.mkdir(exist_ok=True)
            else:
                held.touch()
            park.append(f"mount --bind {q(point)} {q(str(held))}")
            unpark.append(f"mount --bind {q(str(held))} {q(point)}")
        overlays = []
        for t in tops:
            lowers = ":".join([*(str(p) for p in reversed(self.layers.get(t, []))), f"/{t}"])
            overlays.append(f"mount -t overlay overlay -o lowerdir={lowers},upperdir={d}/upper/{t},"
                            f"workdir={d}/work/{t} /{t}")
        network = []
        if self.address:
            network = [
                "# own network namespace: loopback up before any service binds 127.0.0.1;",
                "# eth0 arrives from the host (veth), then gets the device address",
                "ip link set lo up",
                "i=0; while ! ip link show eth0 >/dev/null 2>&1; do i=$((i+1)); "
                "[ $i -lt 1000 ] || { echo 'no eth0 from the host' >&2; exit 1; }; sleep 0.02; done",
                f"ip addr add {self.address}/31 dev eth0",
                "ip link set eth0 up",
                f"ip route add default via {self.host_address}",
            ]
        script = [
            "set -e",
            "# join this device's cgroups first: systemd takes PID 1's cgroup as its root",
            *[f"echo $$ > {p}" for p in cg],
            *network,
            *park,
            *overlays,
            *unpark,
            f"mount --bind {q(str(d / 'units'))} /etc/systemd/system",
            "mkdir -p /opt/colibri",
            f"mount --bind {q(str(d / 'opt'))} /opt/colibri",
            *[f"mount --bind {q(str(src))} {q(dst)}" for src, dst in self.binds],
            "# a new boot_id for every boot, as a kernel draws one (procfs is the host kernel's)",
            f"cat /proc/sys/kernel/random/uuid > {q(str(d / 'boot_id'))}",
            f"mount --bind {q(str(d / 'boot_id'))} /proc/sys/kernel/random/boot_id",
            "# a private /dev: journald links /dev/log, which must not land in the host's /dev",
            f"mount -t tmpfs -o mode=0755,nosuid devtmp {q(str(stage))}",
            *[f"touch {q(str(stage / n))} && mount --bind /dev/{n} {q(str(stage / n))}" for n in DEV_NODES],
            f"touch {q(str(stage / 'console'))} && mount --bind /dev/null {q(str(stage / 'console'))}",
            f"mkdir {q(str(stage / 'pts'))} {q(str(stage / 'shm'))}",
            f"ln -s /proc/self/fd {q(str(stage / 'fd'))}",
            f"ln -s /proc/self/fd/0 {q(str(stage / 'stdin'))}",
            f"ln -s /proc/self/fd/1 {q(str(stage / 'stdout'))}",
            f"ln -s /proc/self/fd/2 {q(str(stage / 'stderr'))}",
            f"ln -s pts/ptmx {q(str(stage / 'ptmx'))}",
            f"mount --move {q(str(stage))} /dev",
            "mount -t devpts -o newinstance,ptmxmode=0666,mode=0620 devpts /dev/pts",
            "mount -t tmpfs -o mode=1777,nosuid,nodev shm /dev/shm",
            "# before systemd: its boot runs systemd-tmpfiles, which empties /tmp of the filesystem it sees",
            "mount -t tmpfs -o mode=1777,nosuid,nodev tmp /tmp",
            "mount -t tmpfs -o mode=1777,nosuid,nodev vartmp /var/tmp",
            "mount -t tmpfs -o mode=0755,nosuid,nodev run /run",
            f"hostname {q(self.name)}",
            "# shared inside this namespace (a booted system's default, which systemd leaves to a",
            "# container manager): LoadCredential= and friends move mounts between namespaces",
            "mount --make-rshared /",
            f"exec /usr/bin/env -i container=colibri-sim PATH={PATH} {SYSTEMD} --unit=multi-user.target",
        ]
        (d / "start.sh").write_text("\n".join(script) + "\n")

    def _cgroups_create(self) -> None:
        for h in _cgroup_hierarchies():
            (h / CGROUP_PARENT / self.name).mkdir(parents=True, exist_ok=True)
        if self.rt_runtime_us:
            self._rt_budget()

    def _rt_budget(self) -> None:
        """Real-time scheduling for the device (rt_runtime_us). On a kernel with
        CONFIG_RT_GROUP_SCHED (L4T's defconfig sets it, so does this machine's, cgroup v1 here) a
        task may take SCHED_FIFO/RR only in a cpu cgroup with cpu.rt_runtime_us > 0, and a new
        cgroup has 0. A real device's services sit in its root cpu cgroup (systemd gives a
        service its own only with CPUAccounting, which the unit does not ask for), whose budget
        is the kernel's sched_rt_runtime_us (950000 of each 1000000 us). The device's PID 1 and
        everything it starts sit in colibri-sim/<name> instead: that cgroup gets rt_runtime_us,
        its parent at least as much (a child may not exceed its parent); the other devices'
        cgroups keep theirs."""
        for h in _cgroup_hierarchies():
            parent = h / CGROUP_PARENT
            if not (parent / "cpu.rt_runtime_us").exists():
                continue
            try:
                if int((parent / "cpu.rt_runtime_us").read_text()) < self.rt_runtime_us:
                    (parent / "cpu.rt_runtime_us").write_text(f"{self.rt_runtime_us}\n")
                (parent / self.name / "cpu.rt_runtime_us").write_text(f"{self.rt_runtime_us}\n")
            except OSError as exc:
                raise FleetError(f"{self.name}: cannot give {parent / self.name} a real-time "
                                 f"budget of {self.rt_runtime_us} us: {exc.strerror} (the cgroups "
                                 f"of other devices hold the rest?)") from None

    def _cgroups_remove(self) -> None:
        for h in _cgroup_hierarchies():
            top = h / CGROUP_PARENT / self.name
            if not top.is_dir():
                continue
            if self.rt_runtime_us and (top / "cpu.rt_runtime_us").exists():
                try:
                    (top / "cpu.rt_runtime_us").write_text("0\n")   # the budget back first
                except OSError:
                    pass
            for dirpath, dirnames, _ in sorted(os.walk(top), key=lambda w: -len(w[0])):
                try:
                    os.rmdir(dirpath)  # cgroupfs: rmdir of an empty cgroup (files go with it)
                except OSError:
                    pass
            try:
                os.rmdir(h / CGROUP_PARENT)  # the last device out removes the parent
            except OSError:
                pass

    def _wait_child(self, timeout: float, exe_suffix: str = "") -> int:
        """The pid of unshare's child (the start script, then systemd once it exec'd)."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout
        children = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise FleetError(f"{self.name}: the device exited while starting: "
                                 f"{(self.dir / 'boot.log').read_text(errors='replace')[-2000:]}")
            try:
                kids = children.read_text().split()
            except OSError:
                kids = []
            if kids:
                pid = int(kids[0])
                try:
                    if os.readlink(f"/proc/{pid}/exe").endswith(exe_suffix):
                        return pid
                except OSError:
                    pass
            time.sleep(0.02)
        raise FleetError(f"{self.name}: {'systemd' if exe_suffix else 'the start script'} did not "
                         f"start within {timeout:g}s")

    def _wait_pid1(self, timeout: float) -> int:
        return self._wait_child(timeout, "/systemd")

    def _plug_network(self, pid: int) -> None:
        """The veth pair: eth0 into the device's network namespace (the start script waits for
        it and configures its end), the host end up with the peer address of the /31."""
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)  # a stale one
        for argv in (["ip", "link", "add", self.host_if, "type", "veth", "peer", "name", "eth0",
                      "netns", str(pid)],
                     ["ip", "addr", "add", f"{self.host_address}/31", "dev", self.host_if],
                     ["ip", "link", "set", self.host_if, "up"]):
            res = subprocess.run(argv, capture_output=True, text=True)
            if res.returncode != 0:
                raise FleetError(f"{self.name}: {shlex.join(argv)}: {res.stderr.strip()}")

    def _stop_recorded(self) -> bool:
        """SIGKILL the PID 1 recorded in running.json when it is still that device's PID 1
        (same PID namespace as recorded: a reused pid is never touched). True if one was."""
        record = self.dir / "running.json"
        if not record.exists():
            return False
        try:
            rec = json.loads(record.read_text())
            pid, ns = int(rec["pid"]), str(rec["pidns"])
        except (ValueError, KeyError, TypeError):
            record.unlink()
            return False
        killed = False
        if ns and _pidns_of(pid) == ns:
            try:
                os.kill(pid, signal.SIGKILL)
                killed = True
            except ProcessLookupError:
                pass
            for _ in range(100):
                if _pidns_of(pid) != ns:
                    break
                time.sleep(0.05)
        record.unlink()
        self._cgroups_remove()
        return killed

    def _reap(self) -> int:
        rc = 0
        if self.proc is not None:
            try:
                rc = self.proc.wait(10)
            except subprocess.TimeoutExpired:
                rc = -1
        self.proc = None
        self.pid = 0
        if self.address:  # normally gone with the namespace; a leftover end would block the next boot
            subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        (self.dir / "running.json").unlink(missing_ok=True)
        self._cgroups_remove()
        return rc
