"""Helpers the unit-file tests share (tests/test_service_unit.py, tests/test_service_realtime.py;
imported by name: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def directives(text: str) -> dict[str, list[str]]:
    """Every `Key=value` of a unit file, by key, in order (a key may repeat)."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        if line and not line.startswith(("#", "[")):
            key, _, value = line.partition("=")
            out.setdefault(key, []).append(value)
    return out


def exposure(text: str, tmp_path: Path) -> tuple[float, str]:
    """The real `systemd-analyze security --offline=yes` on a unit file: its overall exposure
    (0 = locked down .. 10 = unprotected) and its table."""
    path = tmp_path / "colibri.service"
    path.write_text(text)
    proc = subprocess.run(["systemd-analyze", "security", "--offline=yes", "--no-pager", str(path)],
                          capture_output=True, text=True, timeout=60)
    found = re.search(r"Overall exposure level for colibri\.service: (\d+\.\d+)", proc.stdout)
    assert found, proc.stdout + proc.stderr
    return float(found.group(1)), proc.stdout
