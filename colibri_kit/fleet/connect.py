"""Verified SSH connections to fleet hosts, and the ``Remote`` implementation over them.

Fabric's ``Connection`` gives us ``~/.ssh/config``, ssh-agent and identity handling; its paramiko
client is hardened here before it connects: the user's and the project's known_hosts are loaded and
an unknown host key is refused (Fabric would auto-add it). A changed key is always refused; with
``accept_new`` an unknown key is recorded in the project known_hosts file, never a changed one.

Commands run through ``SSHRemote.run``: an argv list quoted with ``shlex.join`` in one place,
standard input closed (except the sudo password, which goes to ``sudo -S`` and nowhere else), and a
deadline after which the channel is closed and an error raised.
"""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
import socket
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Iterable, Sequence, TypeVar

import paramiko
from fabric import Config, Connection

from colibri_kit.errors import FleetError, HostKeyError
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.remote import Result

SUDO_PASSWORD_ENV = "COLIBRI_SUDO_PASSWORD"
DEFAULT_PARALLEL = 8
CONNECT_TIMEOUT_S = 10.0
SFTP_WINDOW = 64 << 20
SFTP_MAX_PACKET = 256 << 10

_known_hosts_lock = threading.Lock()  # serialises appends to the project known_hosts file


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH-style SHA256 fingerprint, as `ssh-keygen -lf` prints it."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_name(address: str, port: int) -> str:
    return address if port == 22 else f"[{address}]:{port}"


class _RefuseOrRecord(paramiko.MissingHostKeyPolicy):
    """Called by paramiko only for hosts with no known key: refuse, or record when allowed."""

    def __init__(self, host: Host, known_hosts: Path | None, accept_new: bool) -> None:
        self.host = host
        self.known_hosts = known_hosts
        self.accept_new = accept_new

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        fp = fingerprint(key)
        if self.accept_new and self.known_hosts is None:
            raise HostKeyError(
                f"{self.host.name}: unknown host key for {hostname} ({key.get_name()} {fp}); "
                f"--accept-new-host-keys records keys in the project file: add "
                f"'known_hosts: fleet_known_hosts' to the fleet file (it never writes ~/.ssh)")
        if not self.accept_new or self.known_hosts is None:
            where = str(self.known_hosts) if self.known_hosts else "~/.ssh/known_hosts"
            raise HostKeyError(
                f"{self.host.name}: unknown host key for {hostname} ({key.get_name()} {fp}); "
                f"check the fingerprint on the device (ssh-keygen -lf /etc/ssh/ssh_host_*_key.pub), "
                f"then rerun with --accept-new-host-keys to record it in {where}"
            )
        line = f"{hostname} {key.get_name()} {key.get_base64()}\n"
        with _known_hosts_lock:
            self.known_hosts.parent.mkdir(parents=True, exist_ok=True)
            with open(self.known_hosts, "a", encoding="ascii") as fh:
                fh.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)


def _sudo_prefix(password: str | None) -> list[str]:
    # -p '' keeps sudo's prompt out of stderr; -k makes sudo always read the password we send.
    return ["sudo", "-S", "-k", "-p", "", "--"] if password else ["sudo", "-n", "--"]


class SSHRemote:
    """A host reached over a verified SSH connection (implements ``remote.Remote``)."""

    def __init__(
        self,
        host: Host,
        *,
        known_hosts: Path | None = None,
        identity_file: Path | None = None,
        accept_new: bool = False,
        connect_timeout: float = CONNECT_TIMEOUT_S,
    ) -> None:
        self.host = host
        self.name = host.name
        self.known_hosts = known_hosts
        self.identity_file = identity_file
        self.accept_new = accept_new
        self.connect_timeout = connect_timeout
        self._conn: Connection | None = None
        self._sftp: paramiko.SFTPClient | None = None

    # -- connection -------------------------------------------------------------------------------
    def connect(self) -> "SSHRemote":
        if self._conn is not None and self._conn.is_connected:
            return self
        connect_kwargs: dict[str, object] = {"banner_timeout": self.connect_timeout,
                                             "auth_timeout": self.connect_timeout}
        if self.identity_file is not None:
            connect_kwargs["key_filename"] = [str(self.identity_file)]
        conn = Connection(
            host=self.host.address,
            user=self.host.user,
            port=self.host.port,
            connect_timeout=self.connect_timeout,
            connect_kwargs=connect_kwargs,
            config=Config(overrides={"load_ssh_configs": True}),
        )
        client = conn.client
        client.load_system_host_keys()  # ~/.ssh/known_hosts (refused if changed, never written)
        if self.known_hosts is not None and self.known_hosts.exists():
            client.load_host_keys(str(self.known_hosts))
        client.set_missing_host_key_policy(_RefuseOrRecord(self.host, self.known_hosts, self.accept_new))
        try:
            conn.open()
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"{self.name}: HOST KEY CHANGED for {self.host.address}:{self.host.port}: device "
                f"offers {exc.key.get_name()} {fingerprint(exc.key)}, known_hosts has "
                f"{exc.expected_key.get_name()} {fingerprint(exc.expected_key)}. This can be a "
                f"reinstalled device or an attack; verify it, then remove the old line with "
                f"ssh-keygen -R '{known_hosts_name(self.host.address, self.host.port)}'"
                + (f" -f {self.known_hosts}" if self.known_hosts else "")
            ) from None
        except HostKeyError:
            raise
        except paramiko.AuthenticationException as exc:
            raise FleetError(
                f"{self.name}: SSH authentication failed for {self.host.user}@{self.host.address}:"
                f"{self.host.port} ({exc}); load the key into ssh-agent, set identity_file in the "
                f"fleet file, or add an IdentityFile to ~/.ssh/config"
            ) from None
        except (OSError, socket.timeout, paramiko.SSHException, EOFError) as exc:
            raise FleetError(
                f"{self.name}: cannot connect to {self.host.address}:{self.host.port}: "
                f"{exc or type(exc).__name__}"
            ) from None
        self._conn = conn
        return self

    def close(self) -> None:
        if self._sftp is not None:
            try:
                self._sftp.close()
            except Exception:  # noqa: BLE001 - closing a dead channel
                pass
            self._sftp = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> "SSHRemote":
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def transport(self) -> paramiko.Transport:
        self.connect()
        assert self._conn is not None
        transport = self._conn.client.get_transport()
        if transport is None or not transport.is_active():
            raise FleetError(f"{self.name}: the SSH connection was lost")
        return transport

    def sftp(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            try:
                # A large window keeps pipelined writes flowing instead of waiting on acks.
                self._sftp = paramiko.SFTPClient.from_transport(
                    self.transport, window_size=SFTP_WINDOW, max_packet_size=SFTP_MAX_PACKET)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise FleetError(f"{self.name}: cannot open SFTP: {exc}") from None
        return self._sftp

    @property
    def is_root(self) -> bool:
        return self.host.user == "root"

    # -- commands ---------------------------------------------------------------------------------
    def command_line(self, argv: Sequence[str], *, sudo: bool = False) -> str:
        """The one place argv becomes a shell command line."""
        argv = [str(a) for a in argv]
        if not argv:
            raise FleetError(f"{self.name}: empty command")
        if sudo and not self.is_root:
            argv = _sudo_prefix(os.environ.get(SUDO_PASSWORD_ENV)) + argv
        return shlex.join(argv)

    def run(
        self,
        argv: Sequence[str],
        *,
        sudo: bool = False,
        timeout: float = 60.0,
        check: bool = True,
    ) -> Result:
        argv = tuple(str(a) for a in argv)
        password = os.environ.get(SUDO_PASSWORD_ENV) if (sudo and not self.is_root) else None
        line = self.command_line(argv, sudo=sudo)
        try:
            chan = self.transport.open_session(timeout=self.connect_timeout)
            chan.settimeout(1.0)
            chan.exec_command(line)
            if password:
                chan.sendall((password + "\n").encode())
            chan.shutdown_write()  # stdin closed: nothing can wait on a prompt
            out, err, code = _drain(chan, time.monotonic() + timeout)
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise FleetError(f"{self.name}: `{shlex.join(argv)}` failed: connection error: {exc}") from None
        if code is None:
            raise FleetError(
                f"{self.name}: `{shlex.join(argv)}` did not finish within {timeout:g}s (stopped)"
            )
        result = Result(argv=argv, exit_code=code, stdout=out, stderr=err)
        if sudo and not self.is_root and code != 0 and _sudo_refused(err):
            raise FleetError(
                f"{self.name}: sudo as {self.host.user} needs a password: set {SUDO_PASSWORD_ENV} "
                f"in the environment, allow NOPASSWD for {self.host.user} in the device's sudoers, "
                f"or log in as root (user: root in the fleet file)"
            )
        if check and code != 0:
            raise FleetError(
                f"{self.name}: `{shlex.join(argv)}` exited {code}: {err.strip() or out.strip()}"
            )
        return result

    def read_text(self, path: str, *, sudo: bool = False) -> str | None:
        if not (sudo and not self.is_root):
            # Over the open SFTP channel: no process per read on the device.
            try:
                with self.sftp().open(path, "rb") as fh:
                    return fh.read().decode(errors="replace")
            except FileNotFoundError:
                return None
            except (OSError, paramiko.SSHException, EOFError) as exc:
                raise FleetError(f"{self.name}: cannot read {path}: {_io_message(exc)}") from None
        res = self.run(["cat", "--", path], sudo=sudo, check=False)
        if res.exit_code != 0:
            if "No such file" in res.stderr:
                return None
            raise FleetError(f"{self.name}: cannot read {path}: {res.stderr.strip()}")
        return res.stdout

    def write_text(self, path: str, text: str, *, sudo: bool = False) -> None:
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        if sudo and not self.is_root:
            staging = f"/tmp/colibri-{uuid.uuid4().hex}"
            self._sftp_write(staging, text.encode())
            self._copy_as_root(staging, tmp)
        else:
            self._sftp_write(tmp, text.encode())
        self.run(["mv", "-f", "--", tmp, path], sudo=sudo)

    def _copy_as_root(self, staging: str, dest: str) -> None:
        """cp as root makes a root-owned file (mv would keep the login user as owner)."""
        try:
            self.run(["cp", "--", staging, dest], sudo=True)
        finally:
            self.run(["rm", "-f", "--", staging], sudo=True, check=False)

    def _sftp_write(self, path: str, data: bytes) -> None:
        try:
            with self.sftp().open(path, "wb") as fh:
                fh.write(data)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self._sftp = None
            raise FleetError(f"{self.name}: cannot write {path}: {_io_message(exc)}") from None

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write a remote file directly over SFTP (no rename; callers use a staging directory)."""
        self._sftp_write(path, data)

    def put(
        self,
        local: str,
        remote: str,
        *,
        sudo: bool = False,
        progress: Callable[[int, int], None] | None = None,
    ) -> None:
        """Upload to ``<remote>.tmp-*`` and rename into place (as root with sudo)."""
        if sudo and not self.is_root:
            staging = f"/tmp/colibri-{uuid.uuid4().hex}"
            self.upload(local, staging, progress=progress)
            tmp = f"{remote}.tmp-{uuid.uuid4().hex[:8]}"
            self._copy_as_root(staging, tmp)
            self.run(["mv", "-f", "--", tmp, remote], sudo=True)
            return
        tmp = f"{remote}.tmp-{uuid.uuid4().hex[:8]}"
        self.upload(local, tmp, progress=progress)
        self.run(["mv", "-f", "--", tmp, remote])

    def upload(
        self,
        local: str | os.PathLike[str],
        remote: str,
        *,
        offset: int = 0,
        progress: Callable[[int, int], None] | None = None,
        chunk: int = 1 << 20,
    ) -> int:
        """Copy ``local`` to ``remote`` from byte ``offset`` (append: resumes a partial file).

        Returns the bytes sent. ``progress(done, total)`` is called after every chunk."""
        total = os.path.getsize(local)
        sent = 0
        try:
            mode = "ab" if offset else "wb"
            with open(local, "rb") as src, self.sftp().open(remote, mode) as dst:
                dst.set_pipelined(True)
                src.seek(offset)
                done = offset
                while True:
                    block = src.read(chunk)
                    if not block:
                        break
                    dst.write(block)
                    done += len(block)
                    sent += len(block)
                    if progress is not None:
                        progress(done, total)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self._sftp = None
            raise FleetError(f"{self.name}: upload of {os.path.basename(local)} to {remote} failed: "
                             f"{_io_message(exc)}") from None
        return sent


def _io_message(exc: BaseException) -> str:
    msg = str(exc) or type(exc).__name__
    # SFTP v3 has no "disk full" status: a full disk arrives as the generic "Failure".
    if "No space left" in msg or getattr(exc, "errno", None) == 28 or msg == "Failure":
        msg += " (is the device's disk full?)"
    return msg


def _drain(chan: paramiko.Channel, deadline: float) -> tuple[str, str, int | None]:
    out: list[bytes] = []
    err: list[bytes] = []
    while True:
        progressed = False
        while chan.recv_ready():
            out.append(chan.recv(65536))
            progressed = True
        while chan.recv_stderr_ready():
            err.append(chan.recv_stderr(65536))
            progressed = True
        if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if chan.closed and not chan.exit_status_ready():
            raise EOFError("channel closed before the command finished")
        if time.monotonic() > deadline:
            chan.close()
            return b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"), None
        if not progressed:
            time.sleep(0.005)
    code = chan.recv_exit_status()
    chan.close()
    return b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"), code


def _sudo_refused(stderr: str) -> bool:
    s = stderr.lower()
    return "a password is required" in s or "no password was provided" in s or (
        "incorrect password" in s) or "a terminal is required" in s


T = TypeVar("T")
R = TypeVar("R")


def for_each(items: Iterable[T], fn: Callable[[T], R], parallel: int = DEFAULT_PARALLEL) -> list[R]:
    """Run fn on every item with at most ``parallel`` at a time; results in input order.

    Fabric's ThreadingGroup starts one thread per host with no bound; a fleet of hundreds would
    open hundreds of connections at once. fn is expected to catch its own per-host failures."""
    items = list(items)
    if parallel < 1:
        raise FleetError(f"--parallel must be at least 1 (got {parallel})")
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(parallel, len(items))) as pool:
        return list(pool.map(fn, items))
