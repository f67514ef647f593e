"""jetson_clocks: pin the clocks (after storing the pre-tuning ones, once) and put them back.

NVIDIA's script [S in docs/jetson-facts.md]: ``--store FILE`` refuses (and asks) when FILE
exists, so the kit stores only when its record has none: the first pre-tuning clocks are what
restore returns to. ``--restore FILE`` exits 0 even after ``Error: Failed to restore PATH``:
the kit reads its output (``restore_failures``), not its status.
"""

from __future__ import annotations

import re

from colibri_kit.fleet.remote import Remote

STORE_NAME = "l4t_dfs.conf"     # in the root-only record directory, never $HOME
CMD_TIMEOUT = 30.0
RESTORE_FAILED_RE = re.compile(r"^Error: Failed to restore (.*)$", re.M)


def restore_failures(output: str) -> list[str]:
    """The paths ``jetson_clocks --restore`` printed ``Error: Failed to restore PATH`` for (it
    still exits 0 after them, as NVIDIA's script does)."""
    return [m.group(1).strip() for m in RESTORE_FAILED_RE.finditer(output)]


def pin(remote: Remote, record_dir: str) -> None:
    """``jetson_clocks`` after ``jetson_clocks --store`` into the record (only if none yet)."""
    store = f"{record_dir}/{STORE_NAME}"
    if remote.read_text(store, sudo=True) is None:   # the first pre-tuning clocks win
        remote.run(["jetson_clocks", "--store", store], sudo=True, timeout=CMD_TIMEOUT)
    remote.run(["jetson_clocks"], sudo=True, timeout=CMD_TIMEOUT)


def restore(remote: Remote, record_dir: str) -> tuple[int, list[str]] | None:
    """``jetson_clocks --restore`` of the record: (exit status, paths that failed), or None when
    nothing was stored."""
    store = f"{record_dir}/{STORE_NAME}"
    if remote.read_text(store, sudo=True) is None:
        return None
    res = remote.run(["jetson_clocks", "--restore", store], sudo=True, timeout=CMD_TIMEOUT)
    return res.exit_code, restore_failures(res.stdout + res.stderr)
