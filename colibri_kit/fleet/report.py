"""Plain-text tables for per-host results."""

from __future__ import annotations


def table(rows: list[list[str]]) -> str:
    """Left-aligned columns, a rule under the header row."""
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def seconds(s: float) -> str:
    return f"{s:.1f}s"
