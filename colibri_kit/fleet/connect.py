"""Verified SSH connections to fleet hosts, and the ``Remote`` implementation over them.

Fabric's ``Connection`` gives us ``~/.ssh/config``, ssh-agent and identity handling; its paramiko
client, and the client of every ProxyJump hop it builds from ``~/.ssh/config``, is hardened here
before it connects: the user's and the project's known_hosts are loaded and an unknown host key is
refused (Fabric would auto-add it). A changed key is always refused; with ``accept_new`` an unknown
key is recorded in the project known_hosts file, never a changed one.

Commands run through ``SSHRemote.run``: an argv list quoted with ``shlex.join`` in one place;
standard input is the sudo password (for ``sudo -S`` only) and the bytes the caller passes, then
EOF; a deadline and an output cap after which the channel is closed and an error raised. Files are
read with ``head -c`` (capped), uploaded and fetched over SFTP with an I/O timeout.
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
from pathlib import Path
from typing import Callable, Sequence

import paramiko
from fabric import Config, Connection

from colibri_kit.errors import FleetError, HostKeyError
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.remote import (
    CONNECT_TIMEOUT_S, IO_TIMEOUT_S, MAX_OUTPUT, MAX_READ, Result, TextReads, TooMuchOutput,
    copy_capped, missing_file)

SUDO_PASSWORD_ENV = "COLIBRI_SUDO_PASSWORD"
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


def _harden(conn: Connection, host: Host, known_hosts: Path | None, accept_new: bool) -> None:
    """Load known_hosts and refuse unknown keys on ``conn`` and on every ProxyJump hop Fabric
    made for it from ``~/.ssh/config`` (Fabric gives each hop AutoAddPolicy: any key accepted)."""
    hop: object = conn
    while isinstance(hop, Connection):
        client = hop.client
        client.load_system_host_keys()  # ~/.ssh/known_hosts (refused if changed, never written)
        if known_hosts is not None and known_hosts.exists():
            client.load_host_keys(str(known_hosts))
        client.set_missing_host_key_policy(_RefuseOrRecord(host, known_hosts, accept_new))
        hop = hop.gateway


class SSHRemote(TextReads):
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
        _harden(conn, self.host, self.known_hosts, self.accept_new)
        try:
            conn.open()
        except paramiko.BadHostKeyException as exc:
            raise HostKeyError(
                f"{self.name}: HOST KEY CHANGED for {self.host.address}:{self.host.port} (or a "
                f"ProxyJump host on the way): device "
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

    def _sftp_client(self) -> paramiko.SFTPClient:
        if self._sftp is None:
            try:
                # A large window keeps pipelined writes flowing instead of waiting on acks.
                self._sftp = paramiko.SFTPClient.from_transport(
                    self.transport, window_size=SFTP_WINDOW, max_packet_size=SFTP_MAX_PACKET)
            except (paramiko.SSHException, EOFError, OSError) as exc:
                raise FleetError(f"{self.name}: cannot open SFTP: {exc}") from None
            # A device that stops answering mid-transfer fails the transfer, not the run.
            self._sftp.get_channel().settimeout(IO_TIMEOUT_S)
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

    def _exec(self, argv: tuple[str, ...], *, sudo: bool, timeout: float, input: bytes | None,
              max_output: int) -> tuple[int, bytes, bytes]:
        password = os.environ.get(SUDO_PASSWORD_ENV) if (sudo and not self.is_root) else None
        line = self.command_line(argv, sudo=sudo)
        try:
            chan = self.transport.open_session(timeout=self.connect_timeout)
            chan.settimeout(1.0)
            chan.exec_command(line)
            if password:
                # sudo -S reads the password a byte at a time up to the newline; the rest is the
                # command's own standard input.
                chan.sendall((password + "\n").encode())
            if input:
                chan.sendall(input)
            chan.shutdown_write()  # stdin closed: nothing can wait on a prompt
            out, err, code = _drain(chan, time.monotonic() + timeout, max_output)
        except TooMuchOutput as exc:
            raise FleetError(f"{self.name}: `{shlex.join(argv)}` printed more than "
                             f"{exc.limit} bytes (stopped)") from None
        except (paramiko.SSHException, EOFError, OSError) as exc:
            raise FleetError(f"{self.name}: `{shlex.join(argv)}` failed: connection error: {exc}") from None
        if code is None:
            raise FleetError(
                f"{self.name}: `{shlex.join(argv)}` did not finish within {timeout:g}s (stopped)"
            )
        if sudo and not self.is_root and code != 0 and _sudo_refused(err.decode(errors="replace")):
            raise FleetError(
                f"{self.name}: sudo as {self.host.user} needs a password: set {SUDO_PASSWORD_ENV} "
                f"in the environment, allow NOPASSWD for {self.host.user} in the device's sudoers, "
                f"or log in as root (user: root in the fleet file)"
            )
        return code, out, err

    def run(
        self,
        argv: Sequence[str],
        *,
        sudo: bool = False,
        timeout: float = IO_TIMEOUT_S,
        check: bool = True,
        input: bytes | None = None,
        max_output: int = MAX_OUTPUT,
    ) -> Result:
        argv = tuple(str(a) for a in argv)
        code, out, err = self._exec(argv, sudo=sudo, timeout=timeout, input=input,
                                    max_output=max_output)
        result = Result(argv=argv, exit_code=code, stdout=out.decode(errors="replace"),
                        stderr=err.decode(errors="replace"))
        if check and code != 0:
            raise FleetError(
                f"{self.name}: `{shlex.join(argv)}` exited {code}: "
                f"{result.stderr.strip() or result.stdout.strip()}"
            )
        return result

    def read_bytes(self, path: str, *, sudo: bool = False, max_bytes: int = MAX_READ,
                   timeout: float = IO_TIMEOUT_S) -> bytes | None:
        # head -c stops after the cap even on an endless file (a link to /dev/zero).
        code, out, err = self._exec(("head", "-c", str(max_bytes + 1), "--", path), sudo=sudo,
                                    timeout=timeout, input=None, max_output=max_bytes + 1)
        text = err.decode(errors="replace")
        if code != 0:
            if missing_file(text):
                return None
            raise FleetError(f"{self.name}: cannot read {path}: {text.strip()}")
        if len(out) > max_bytes:
            raise FleetError(f"{self.name}: {path} holds more than {max_bytes} bytes "
                             f"(stopped reading)")
        return out

    def write_bytes(self, path: str, data: bytes, *, sudo: bool = False) -> None:
        """Write a small file atomically: its bytes go through the command's standard input into
        a temporary file next to ``path``, then a rename. With sudo nothing is staged where the
        login could change it; ``path`` must then be in a directory only root can write (tune's
        state directory), or the login could plant a link under the temporary name."""
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            self.run(["cp", "--", "/dev/stdin", tmp], sudo=sudo, input=data)
            self.run(["mv", "-f", "--", tmp, path], sudo=sudo)
        except FleetError:
            self.run(["rm", "-f", "--", tmp], sudo=sudo, check=False)
            raise

    def write_text(self, path: str, text: str, *, sudo: bool = False) -> None:
        self.write_bytes(path, text.encode(), sudo=sudo)

    def upload(
        self,
        local: str | os.PathLike[str],
        remote: str,
        *,
        offset: int = 0,
        progress: Callable[[int, int], None] | None = None,
        chunk: int = 1 << 20,
    ) -> int:
        """Copy ``local`` to ``remote`` as the login user from byte ``offset`` (append: resumes a
        partial file). Returns the bytes sent. ``progress(done, total)`` after every chunk."""
        total = os.path.getsize(local)
        sent = 0
        try:
            mode = "ab" if offset else "wb"
            with open(local, "rb") as src, self._sftp_client().open(remote, mode) as dst:
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

    def fetch(self, remote: str, local: str | os.PathLike[str], *, max_bytes: int,
              timeout: float) -> None:
        """Copy ``remote`` into the local file ``local``: at most ``max_bytes``, within
        ``timeout`` seconds, else FleetError (the caller removes ``local``)."""
        try:
            with self._sftp_client().open(remote, "rb") as src, open(local, "wb") as dst:
                src.prefetch(max_bytes)
                copy_capped(src, dst, host=self.name, path=remote, max_bytes=max_bytes,
                            timeout=timeout)
        except (OSError, paramiko.SSHException, EOFError) as exc:
            self._sftp = None
            raise FleetError(f"{self.name}: cannot fetch {remote}: {_io_message(exc)}") from None


def _io_message(exc: BaseException) -> str:
    msg = str(exc) or type(exc).__name__
    # SFTP v3 has no "disk full" status: a full disk arrives as the generic "Failure".
    if "No space left" in msg or getattr(exc, "errno", None) == 28 or msg == "Failure":
        msg += " (is the device's disk full?)"
    return msg


def _drain(chan: paramiko.Channel, deadline: float, cap: int) -> tuple[bytes, bytes, int | None]:
    """stdout, stderr and the exit code (None at the deadline); TooMuchOutput past ``cap``."""
    out = bytearray()
    err = bytearray()
    while True:
        progressed = False
        while chan.recv_ready():
            out += chan.recv(65536)
            progressed = True
        while chan.recv_stderr_ready():
            err += chan.recv_stderr(65536)
            progressed = True
        if len(out) + len(err) > cap:
            chan.close()
            raise TooMuchOutput(cap)
        # sshd may send the exit status before the last output it has not yet read from the
        # command's pipes: done only once the output's EOF has arrived too.
        finished = chan.exit_status_ready() and (chan.eof_received or chan.closed)
        if finished and not chan.recv_ready() and not chan.recv_stderr_ready():
            break
        if chan.closed and not chan.exit_status_ready():
            raise EOFError("channel closed before the command finished")
        if time.monotonic() > deadline:
            chan.close()
            return bytes(out), bytes(err), None
        if not progressed:
            time.sleep(0.005)
    code = chan.recv_exit_status()
    chan.close()
    return bytes(out), bytes(err), code


def _sudo_refused(stderr: str) -> bool:
    s = stderr.lower()
    return "a password is required" in s or "no password was provided" in s or (
        "incorrect password" in s) or "a terminal is required" in s
