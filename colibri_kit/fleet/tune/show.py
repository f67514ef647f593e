"""What a device's tuning looks like, for tables: ``--show`` lines and the one-cell summary that
smoke/bench tables print next to latency (a slow device and a mistuned one look different)."""

from __future__ import annotations

from typing import Any

from colibri_kit.errors import KitError
from colibri_kit.fleet.remote import Remote
from colibri_kit.fleet.tune.state import TuningState, read_state


def tuning_summary(remote: Remote) -> dict[str, Any]:
    """A one-line view of a device's tuning, for tables next to latency figures (smoke, bench):
    {"mode": "MAXN", "mode_id": 0, "cpu_governor": ..., "gpu_governor": ...,
    "jetson_clocks": True}. Reads only; never raises for a device without the Jetson tools."""
    try:
        st = read_state(remote, modes=False)
    except KitError as exc:
        return {"mode": None, "mode_id": None, "cpu_governor": None, "gpu_governor": None,
                "jetson_clocks": None, "error": str(exc)}
    return {"mode": st.mode_name, "mode_id": st.mode_id, "cpu_governor": st.cpu_governors(),
            "gpu_governor": st.gpu_governor, "jetson_clocks": st.jetson_clocks_active}


def summary_text(summary: dict[str, Any]) -> str:
    """``tuning_summary`` as one table cell: "MAXN, cpu performance, gpu performance, clocks
    pinned" (or "unknown: <why>")."""
    if summary.get("mode") is None and summary.get("error"):
        return f"unknown: {summary['error']}"
    pinned = {True: "clocks pinned", False: "clocks free"}.get(summary.get("jetson_clocks"),
                                                                "clocks ?")
    return (f"{summary.get('mode') or '?'}, cpu {summary.get('cpu_governor') or '?'}, "
            f"gpu {summary.get('gpu_governor') or '?'}, {pinned}")


def show_lines(st: TuningState) -> list[tuple[str, str]]:
    """(label, value) pairs for ``invoke tune --show``."""
    def mhz(v: int | None, scale: int) -> str:
        return "?" if v is None else f"{v / scale:.0f}"

    cur = [st.cpu_cur.get(c) for c in st.cpus_online]
    top = [st.cpu_max.get(c) for c in st.cpus_online]
    return [
        ("power mode", "?" if st.mode_name is None else f"{st.mode_name} (id {st.mode_id})"),
        ("online cpus", ",".join(map(str, st.cpus_online)) or "?"),
        ("cpu governor", st.cpu_governors()),
        ("cpu MHz cur/max", f"{mhz(max((c for c in cur if c is not None), default=None), 1000)}/"
                            f"{mhz(max((t for t in top if t is not None), default=None), 1000)}"),
        ("gpu governor", ", ".join(f"{st.gpu_governors.get(n)} ({n})" for n in st.gpu_nodes)
         or "? (no GPU node)"),
        ("gpu MHz cur/max", f"{mhz(st.gpu_cur, 10**6)}/{mhz(st.gpu_max, 10**6)}"),
        ("emc MHz cur/max", f"{mhz(st.emc_cur, 10**6)}/{mhz(st.emc_max, 10**6)}"),
        ("jetson_clocks", "active" if st.jetson_clocks_active else "inactive"),
        ("fan pwm", "?" if st.fan_pwm is None else f"{st.fan_pwm}/255"),
    ]
