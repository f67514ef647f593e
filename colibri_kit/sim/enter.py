"""Mount an emulated Jetson's faked files at their real paths, then exec a command.

    unshare -m --propagation private \\
        python3 -m colibri_kit.sim.enter ROOT -- /usr/sbin/sshd -D -f CONFIG

ROOT is a tree written by ``device_files.populate``. Refuses to run in the host's own mount
namespace: these mounts would cover the machine's real /sys and /etc.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from colibri_kit.sim.device_files import mount_plan

# Writable state the host keeps under paths that the read-only overlays cover.
KEEP_WRITABLE = ("/var/lib/sudo",)


def _mount(*argv: str) -> None:
    subprocess.run(["mount", *argv], check=True)


def _mountpoints_under(top: str) -> list[str]:
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point.startswith(top + "/"):
                points.append(point)
    return points


def in_private_namespace() -> bool:
    """True when this process's mount namespace differs from its parent's or init's."""
    mine = os.readlink("/proc/self/ns/mnt")
    for other in ("/proc/1/ns/mnt", f"/proc/{os.getppid()}/ns/mnt"):
        try:
            if os.readlink(other) != mine:
                return True
        except OSError:
            continue
    return False


def mount_all(root: Path, stash: Path) -> None:
    """Apply ``mount_plan(root)``. ``stash``: an empty directory for mounts that the overlays
    would hide (``/etc/hosts`` in a container) and that are put back on top."""
    for kind, src, dst in mount_plan(root):
        if kind == "bind":
            _mount("--bind", str(src), str(dst))
            continue
        kept = []
        for point in _mountpoints_under(str(dst)) + [p for p in KEEP_WRITABLE
                                                      if p.startswith(str(dst) + "/")
                                                      and os.path.isdir(p)]:
            hold = stash / f"{len(list(stash.iterdir()))}"
            if os.path.isdir(point):
                hold.mkdir()
            else:
                hold.touch()
            _mount("--bind", point, str(hold))
            kept.append((hold, point))
        _mount("-t", "overlay", "overlay", "-o", f"ro,lowerdir={src}:{dst}", str(dst))
        for hold, point in kept:
            if os.path.exists(point):
                _mount("--bind", str(hold), point)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python3 -m colibri_kit.sim.enter ROOT -- COMMAND [ARG...]",
              file=sys.stderr)
        return 2
    if not in_private_namespace():
        print("enter: refusing to mount over the host's /sys and /etc: run me under "
              "`unshare -m --propagation private`", file=sys.stderr)
        return 2
    root = Path(argv[0]).resolve()
    stash = root.parent / f".{root.name}.stash"
    stash.mkdir(exist_ok=True)
    mount_all(root, stash)
    os.execvp(argv[2], argv[2:])
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
