"""The one way the kit acts on a device: the ``Remote`` protocol.

Every remote command is an argv list; an implementation quotes it in one place, so no value from a
profile, an inventory or a device can reach a shell unquoted. Commands run with a deadline and a
cap on what they print; files are read with a byte cap. So a device that hangs or answers without
end (``/etc/nv_tegra_release`` linked to ``/dev/zero``) fails alone, quickly, in bounded memory.

Implementations: ``SSHRemote`` (colibri_kit/fleet/connect.py, over a verified SSH connection) and,
for in-process tests, ``LocalRemote`` (colibri_kit/sim/local.py).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import BinaryIO, Callable, Protocol, Sequence

from colibri_kit.errors import FleetError

CONNECT_TIMEOUT_S = 10.0
IO_TIMEOUT_S = 60.0          # any one command or transfer step, unless the caller says otherwise
MAX_OUTPUT = 4 << 20         # bytes a command may print (stdout + stderr)
MAX_READ = 1 << 20           # bytes read_text/read_bytes accept from one small device file


class TooMuchOutput(Exception):
    """A command printed more than its cap (raised inside an implementation, reported as
    FleetError naming the host and the command)."""

    def __init__(self, limit: int) -> None:
        super().__init__(limit)
        self.limit = limit


def missing_file(stderr: str) -> bool:
    return "No such file or directory" in stderr


def copy_capped(src: BinaryIO, dst: BinaryIO, *, host: str, path: str, max_bytes: int,
                timeout: float) -> None:
    """Copy ``src`` (the device's ``path``) to ``dst``: FleetError past ``max_bytes`` bytes or
    ``timeout`` seconds. The fetch of every Remote goes through here."""
    deadline = time.monotonic() + timeout
    got = 0
    while block := src.read(1 << 20):
        got += len(block)
        if got > max_bytes:
            raise FleetError(f"{host}: {path} holds more than {max_bytes} bytes, the size its "
                             f"release records (stopped)")
        if time.monotonic() > deadline:
            raise FleetError(f"{host}: fetching {path} took longer than {timeout:g}s (stopped)")
        dst.write(block)


class TextReads:
    """``read_text`` for a Remote that has ``read_bytes``."""

    def read_text(self, path: str, *, sudo: bool = False, max_bytes: int = MAX_READ) -> str | None:
        data = self.read_bytes(path, sudo=sudo, max_bytes=max_bytes)  # type: ignore[attr-defined]
        return None if data is None else data.decode(errors="replace")


@dataclass(frozen=True)
class Result:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


class Remote(Protocol):
    """A device the kit can act on."""

    name: str  # inventory name, for messages and tables

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
        """Run argv (quoted with shlex.join). Standard input is ``input`` then EOF. With check, a
        non-zero exit raises FleetError naming the host, the command and its stderr; so does a
        command past ``timeout`` seconds or printing more than ``max_output`` bytes. sudo: as
        root directly when the login is root, else ``sudo -n`` (or ``sudo -S`` with the
        password from the environment)."""
        ...

    def read_bytes(self, path: str, *, sudo: bool = False, max_bytes: int = MAX_READ,
                   timeout: float = IO_TIMEOUT_S) -> bytes | None:
        """A remote file's bytes, None when it does not exist; FleetError past ``max_bytes``."""
        ...

    def read_text(self, path: str, *, sudo: bool = False, max_bytes: int = MAX_READ) -> str | None:
        ...

    def write_bytes(self, path: str, data: bytes, *, sudo: bool = False) -> None:
        """Write a small file atomically (temporary file next to it, then rename)."""
        ...

    def upload(self, local: str | os.PathLike[str], remote: str, *, offset: int = 0,
               progress: Callable[[int, int], None] | None = None) -> int:
        """Copy a local file to ``remote`` as the login user from byte ``offset``; bytes sent."""
        ...

    def fetch(self, remote: str, local: str | os.PathLike[str], *, max_bytes: int,
              timeout: float) -> None:
        """Copy a remote file to ``local``: at most ``max_bytes`` within ``timeout`` seconds."""
        ...
