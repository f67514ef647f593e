"""The one way the kit runs things on a device.

Every remote command is an argv list; it is quoted here with ``shlex.join`` and nowhere else, so no
value from a profile, an inventory or a device can reach a shell unquoted. Commands run with no
standard input and a timeout, so nothing can wait on a prompt.

Implementations: ``SSHRemote`` (colibri_kit/fleet/connect.py, over a verified Fabric connection).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence


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
        timeout: float = 60.0,
        check: bool = True,
    ) -> Result:
        """Run argv (quoted with shlex.join), stdin closed. With check, a non-zero exit raises
        FleetError naming the host, the command and its stderr. sudo: as root directly when the
        login is root, else ``sudo -n`` (or ``sudo -S`` with the password from the environment)."""
        ...

    def read_text(self, path: str, *, sudo: bool = False) -> str | None:
        """A remote file's text, or None when it does not exist."""
        ...

    def write_text(self, path: str, text: str, *, sudo: bool = False) -> None:
        """Write a small remote file (temp file + rename)."""
        ...

    def put(self, local: str, remote: str, *, sudo: bool = False) -> None:
        """Upload a file (to a temporary path, then move into place; with sudo, move as root)."""
        ...
