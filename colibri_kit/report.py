"""The one table printer for per-host results (deploy, smoke, status, rollback, tune, sim).

Cells often hold what a device said (its model string, an error's stderr): terminal control
characters (C0, DEL, C1, so ESC sequences, carriage returns, OSC titles) are dropped from every
cell, so a device cannot move the cursor, recolour, clear or retitle the operator's terminal."""

from __future__ import annotations

import re

_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def clean(text: object) -> str:
    """``text`` without terminal control characters (a tab or newline becomes a space)."""
    return _CONTROL.sub(lambda m: " " if m.group() in "\t\n" else "", str(text))


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns, a rule under the header row."""
    rows = [[clean(cell) for cell in r] for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)
