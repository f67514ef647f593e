"""``LocalRemote``: the ``Remote`` protocol on this machine, as the user running it, for tests.

A device here is a directory ``root``: every absolute path the kit names (in a command's argv or a
file operation) lands under it (``/opt/colibri/current`` is ``root/opt/colibri/current``), and
paths the device prints come back without the prefix. Commands run with ``subprocess`` (argv, no
shell), ``root/usr/sbin`` and ``root/usr/bin`` first on PATH and ``COLIBRI_SIM_ROOT=root`` so the
nvpmodel/jetson_clocks stand-ins act on the faked files. ``sudo`` runs the command as the same
user: there is no second identity here, which is what the real-sshd tests are for. Deadlines and
output caps hold as over SSH.

``local_device(root, module)`` makes such a directory look like one emulated Jetson module (the
faked files of ``device_files.populate`` and a ``uname`` that reports aarch64, as qemu-user does).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import uuid
from pathlib import Path
from typing import Callable, Sequence

from colibri_kit.errors import FleetError
from colibri_kit.fleet.remote import (
    IO_TIMEOUT_S, MAX_OUTPUT, MAX_READ, Result, TextReads, copy_capped, missing_file)
from colibri_kit.sim.device_files import populate

UNAME = ("#!/bin/sh\n# Emulated Jetson: report the guest architecture like qemu-user does.\n"
         "/usr/bin/uname \"$@\" | sed 's/x86_64/aarch64/g'\n")


class LocalRemote(TextReads):
    """A device whose filesystem is ``root`` on this machine (implements ``Remote``)."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.root = Path(root).resolve()
        self._prefix = str(self.root)

    def __enter__(self) -> "LocalRemote":
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def path(self, device_path: str | os.PathLike[str]) -> Path:
        """Where a device path lives on this machine."""
        p = str(device_path)
        return self.root / p.lstrip("/") if p.startswith("/") else Path(p)

    def _arg(self, arg: str) -> str:
        if arg.startswith("/") and not arg.startswith("/dev/"):
            return self._prefix + arg
        return arg

    def _unmap(self, data: bytes) -> str:
        return data.decode(errors="replace").replace(self._prefix, "")

    def run(self, argv: Sequence[str], *, sudo: bool = False, timeout: float = IO_TIMEOUT_S,
            check: bool = True, input: bytes | None = None,
            max_output: int = MAX_OUTPUT) -> Result:
        argv = tuple(str(a) for a in argv)
        if not argv:
            raise FleetError(f"{self.name}: empty command")
        env = {**os.environ, "COLIBRI_SIM_ROOT": self._prefix,
               "PATH": f"{self.root}/usr/sbin:{self.root}/usr/bin:{os.environ.get('PATH', '')}"}
        try:
            proc = subprocess.run([self._arg(a) for a in argv], input=input or b"",
                                  capture_output=True, timeout=timeout, env=env)
        except subprocess.TimeoutExpired:
            raise FleetError(f"{self.name}: `{shlex.join(argv)}` did not finish within "
                             f"{timeout:g}s (stopped)") from None
        except OSError as exc:
            return Result(argv, 127, "", str(exc))
        if len(proc.stdout) + len(proc.stderr) > max_output:
            raise FleetError(f"{self.name}: `{shlex.join(argv)}` printed more than "
                             f"{max_output} bytes (stopped)")
        result = Result(argv, proc.returncode, self._unmap(proc.stdout), self._unmap(proc.stderr))
        if check and not result.ok:
            raise FleetError(f"{self.name}: `{shlex.join(argv)}` exited {result.exit_code}: "
                             f"{result.stderr.strip() or result.stdout.strip()}")
        return result

    def read_bytes(self, path: str, *, sudo: bool = False, max_bytes: int = MAX_READ,
                   timeout: float = IO_TIMEOUT_S) -> bytes | None:
        try:
            with open(self.path(path), "rb") as fh:
                data = fh.read(max_bytes + 1)
        except FileNotFoundError:
            return None
        except OSError as exc:
            if missing_file(str(exc)):
                return None
            raise FleetError(f"{self.name}: cannot read {path}: {exc.strerror}") from None
        if len(data) > max_bytes:
            raise FleetError(f"{self.name}: {path} holds more than {max_bytes} bytes "
                             f"(stopped reading)")
        return data

    def write_bytes(self, path: str, data: bytes, *, sudo: bool = False) -> None:
        dest = self.path(path)
        tmp = dest.with_name(f"{dest.name}.tmp-{uuid.uuid4().hex[:8]}")
        try:
            tmp.write_bytes(data)
            os.replace(tmp, dest)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise FleetError(f"{self.name}: cannot write {path}: {exc.strerror}") from None

    def upload(self, local: str | os.PathLike[str], remote: str, *, offset: int = 0,
               progress: Callable[[int, int], None] | None = None) -> int:
        total = os.path.getsize(local)
        with open(local, "rb") as src, open(self.path(remote), "ab" if offset else "wb") as dst:
            src.seek(offset)
            sent = 0
            while block := src.read(1 << 20):
                dst.write(block)
                sent += len(block)
                if progress is not None:
                    progress(offset + sent, total)
        return sent

    def fetch(self, remote: str, local: str | os.PathLike[str], *, max_bytes: int,
              timeout: float) -> None:
        try:
            with open(self.path(remote), "rb") as src, open(local, "wb") as dst:
                copy_capped(src, dst, host=self.name, path=remote, max_bytes=max_bytes,
                            timeout=timeout)
        except OSError as exc:
            raise FleetError(f"{self.name}: cannot fetch {remote}: {exc.strerror}") from None


def local_device(root: Path, module: str, name: str = "local") -> LocalRemote:
    """A LocalRemote whose ``root`` holds one emulated ``module``'s faked Jetson files."""
    populate(root, module)
    uname = root / "usr/bin/uname"
    uname.write_text(UNAME)
    uname.chmod(0o755)
    (root / "opt/colibri").mkdir(parents=True, exist_ok=True)
    return LocalRemote(name, root)
