"""Root's record of the pre-tuning state: ``TUNE_DIR`` (``/var/lib/colibri-tune``).

With a login that is not root, nothing root does may depend on a file the login can write (it
could swap the file between two steps). So root keeps its record only in ``TUNE_DIR``: created by
root, mode 0700, checked to be root's own before every use; never under the device root (which
the login owns). The values root writes reach it on the command's standard input.
"""

from __future__ import annotations

import json
from typing import Any

from colibri_kit.errors import FleetError
from colibri_kit.fleet.remote import Remote

TUNE_DIR = "/var/lib/colibri-tune"
STATE_NAME = "state.json"
CMD_TIMEOUT = 30.0


def require_privilege(remote: Remote) -> None:
    """Fail fast, before anything changes, when the kit cannot act as root on the device."""
    try:
        remote.run(["true"], sudo=True, timeout=CMD_TIMEOUT)
    except FleetError as exc:
        raise FleetError(f"{exc} (tuning needs root on the device: nvpmodel -m, jetson_clocks "
                         f"and sysfs writes)") from None


def exists(remote: Remote) -> bool:
    return remote.run(["test", "-e", TUNE_DIR], sudo=True, check=False, timeout=CMD_TIMEOUT).ok


def root_dir(remote: Remote) -> str:
    """Create ``TUNE_DIR`` as root and check it is root's own (owner root, mode 0700, a real
    directory): refuse to keep state anywhere another user could have prepared."""
    remote.run(["mkdir", "-p", "-m", "0700", "--", TUNE_DIR], sudo=True, timeout=CMD_TIMEOUT)
    uid = remote.run(["id", "-u"], sudo=True, timeout=CMD_TIMEOUT).stdout.strip()
    got = remote.run(["stat", "-c", "%u %a %F", "--", TUNE_DIR], sudo=True,
                     timeout=CMD_TIMEOUT).stdout.strip()
    if got != f"{uid} 700 directory":
        raise FleetError(f"{remote.name}: {TUNE_DIR} is not a root-only directory (owner, mode, "
                         f"type: {got!r}); someone else made it: inspect and remove it")
    return TUNE_DIR


def saved(remote: Remote, tdir: str = TUNE_DIR) -> str | None:
    return remote.read_text(f"{tdir}/{STATE_NAME}", sudo=True)


def save(remote: Remote, tdir: str, data: dict[str, Any]) -> bool:
    """Record the pre-tuning state, once. Returns False when a record was there already."""
    if saved(remote, tdir) is not None:
        return False
    remote.write_bytes(f"{tdir}/{STATE_NAME}",
                       (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), sudo=True)
    return True


def extend(remote: Remote, tdir: str, sections: dict[str, Any]) -> list[str]:
    """Add to the record the sections it lacks (a later tune with more to record, e.g. the
    realtime section's IRQs), never replacing one: restore returns to the first pre-tuning
    state of each. Returns the sections added."""
    text = saved(remote, tdir)
    if text is None:
        return []
    try:
        data = json.loads(text)
    except ValueError:
        raise FleetError(f"{remote.name}: {tdir}/{STATE_NAME} is corrupt; inspect and remove "
                         f"it") from None
    added = [k for k in sections if k not in data]
    if added:
        data.update({k: sections[k] for k in added})
        remote.write_bytes(f"{tdir}/{STATE_NAME}",
                           (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(), sudo=True)
    return added


def remove(remote: Remote, tdir: str = TUNE_DIR) -> None:
    remote.run(["rm", "-rf", "--", tdir], sudo=True, timeout=CMD_TIMEOUT)
