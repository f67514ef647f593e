"""scripts/bootstrap.sh's first contact (issue #21, item 9): it waits for a package manager that
holds its locks instead of failing with apt's exit 100, says for whom and for how long, and
stops with what to do after its limit; and it puts `colibri` (the host build) on the .venv's PATH.

The lock is taken the way apt and dpkg take theirs (a POSIX fcntl lock, what /proc/locks lists)
on a file named by COLIBRI_APT_LOCKS, so no real package manager is touched. The script is
sourced: its functions only, not the setup."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from colibri_kit.paths import project_root

SCRIPT = project_root() / "scripts" / "bootstrap.sh"
HOLD = ("import fcntl, os, sys\n"
        "fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)\n"
        "fcntl.lockf(fd, fcntl.LOCK_EX)\n"
        "print('locked', flush=True)\n"
        "sys.stdin.read()\n")   # held until the test closes our stdin


def hold(path: Path) -> subprocess.Popen:
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "locked"
    return holder


def sourced(call: str, lock: Path, wait_s: int) -> subprocess.Popen:
    env = {**os.environ, "COLIBRI_APT_LOCKS": f"{lock.parent / 'absent-lock'} {lock}",
           "COLIBRI_APT_WAIT_S": str(wait_s)}
    # the script as $1 ($0 is "bash"): sourced, so only its functions are defined, main is not run
    return subprocess.Popen(["bash", "-c", f'set -euo pipefail; . "$1"; {call}', "bash", str(SCRIPT)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_it_waits_for_the_lock_and_goes_on_when_it_is_free(tmp_path):
    lock = tmp_path / "lock-frontend"
    holder = hold(lock)
    try:
        proc = sourced("wait_for_apt && echo free", lock, 600)
        line = proc.stderr.readline()   # the event: it says it waits, and for whom
        name = Path(f"/proc/{holder.pid}/comm").read_text().strip()
        assert line.startswith(f"bootstrap: waiting for the package manager: {lock} is held by "
                               f"{name} (pid {holder.pid})"), line
        assert "of at most 600 s" in line
        assert proc.poll() is None     # still waiting while the lock is held
    finally:
        holder.stdin.close()           # the other apt finishes
        holder.wait(timeout=60)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0 and out.strip() == "free", (out, err)


def test_it_stops_with_what_to_do_after_its_limit(tmp_path):
    lock = tmp_path / "lock"
    holder = hold(lock)
    try:
        name = Path(f"/proc/{holder.pid}/comm").read_text().strip()
        proc = sourced("wait_for_apt", lock, 0)
        out, err = proc.communicate(timeout=120)
    finally:
        holder.stdin.close()
        holder.wait(timeout=60)
    assert proc.returncode == 1, (out, err)
    assert f"{lock} is still held by {name} (pid {holder.pid}) after 0 s" in err
    assert "run scripts/bootstrap.sh again" in err and "COLIBRI_APT_WAIT_S" in err


def test_free_locks_do_not_wait(tmp_path):
    lock = tmp_path / "lock"
    lock.touch()                       # exists, nobody holds it
    proc = sourced("wait_for_apt && apt_lock_holder && echo none-held", lock, 600)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == "none-held" and err == "", (out, err)


def test_the_colibri_wrapper_runs_the_host_build_or_says_how_to_get_it(tmp_path):
    (tmp_path / ".venv/bin").mkdir(parents=True)
    run = lambda *a: subprocess.run(  # noqa: E731
        ["bash", "-c", f'set -eu; . "$1"; here={tmp_path}; cd "$here"; write_colibri_wrapper',
         "bash", str(SCRIPT)], check=True)
    run()
    wrapper = tmp_path / ".venv/bin/colibri"
    res = subprocess.run([str(wrapper), "--version"], capture_output=True, text=True)
    assert res.returncode == 127
    assert f"{tmp_path}/dist/host/bin/colibri is not built yet: run 'invoke build --target host'" in res.stderr
    exe = tmp_path / "dist/host/bin/colibri"
    exe.parent.mkdir(parents=True)
    exe.write_text('#!/bin/sh\nprintf "<%s>" "$@"\n')
    exe.chmod(0o755)
    res = subprocess.run([str(wrapper), "generate", "a model.colibri", "--prompt", "it's"],
                         capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout == "<generate><a model.colibri><--prompt><it's>"
