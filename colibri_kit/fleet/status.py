"""`invoke status`: what each device runs and whether it answers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from colibri_kit import jetson
from colibri_kit.errors import KitError
from colibri_kit.fleet import release as rel
from colibri_kit.fleet import service as svc
from colibri_kit.fleet.fleet import Fleet
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.remote import Remote
from colibri_kit.profiles import Profile
from colibri_kit.report import table


@dataclass
class HostStatus:
    host: str
    reachable: bool
    release: str = "-"
    model: str = "-"
    target: str = "-"
    l4t: str = "-"
    uptime: str = "-"
    device: str = "-"
    detail: str = ""
    service: str = "-"        # colibri.service ActiveState/SubState ("-": none installed)
    requests: str = "-"       # requests the running service has answered (its /metrics)
    driver: str = ""     # the CUDA driver check for the deployed target ("" when not known)


def _uptime(text: str | None) -> str:
    try:
        s = int(float((text or "").split()[0]))
    except (IndexError, ValueError):
        return "-"
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m = s // 60
    return f"{d}d {h}h{m:02d}m" if d else f"{h}h{m:02d}m"


ProfileFor = Callable[[str], Profile | None]


def _driver_note(info: rel.DeviceInfo, profile: Profile | None) -> str:
    """The deployed target's CUDA driver verdict on this device: "" when fine or unknown, else
    a warning naming the driver, where its version comes from, and the fixes."""
    if profile is None:
        return ""
    try:
        verdict = rel.driver_verdict(info, profile)
    except KitError:
        return ""
    return "" if verdict is None or verdict.runs else f"WARNING: {verdict.message}"


def host_status(remote: Remote, host: Host, profile_for: ProfileFor | None = None) -> HostStatus:
    """One device's row. ``profile_for`` maps the target a release names to its Profile (the
    task passes the profile loader) for the CUDA driver check; None: no driver check."""
    info = rel.identify(remote)
    st = HostStatus(host=host.name, reachable=True,
                    l4t=str(info.l4t_version) if info.l4t_version else
                    (f"R{info.l4t}" if info.l4t else "-"),
                    device=info.shown,
                    uptime=_uptime(remote.read_text("/proc/uptime")))
    current = rel.current_release(remote, host.root)
    if current:
        st.release = current
        meta = rel.release_meta(remote, host.root, current) or {}
        st.target = jetson.clean(str(meta.get("target", "-")))
        st.model = jetson.clean(str(meta.get("model_sha256") or "-"))[:12]
        st.driver = _driver_note(info, profile_for(st.target) if profile_for else None)
    else:
        st.detail = "nothing deployed"
    if svc.systemd_running(remote):
        state = svc.service_state(remote, host.name)
        if state.installed:
            st.service, st.requests = state.state, state.requests
            if state.state.startswith("failed") and state.detail:
                st.detail = state.detail
    return st


def status(fleet: Fleet, profile_for: ProfileFor | None = None) -> list[HostStatus]:
    return [o.value if o.value is not None else
            HostStatus(host=o.host, reachable=False, detail=o.error or "skipped")
            for o in fleet.run(lambda r, h: host_status(r, h, profile_for))]


def status_table(rows: list[HostStatus]) -> str:
    out = [["host", "reachable", "release", "model", "target", "L4T", "uptime", "service",
            "requests", "device / detail"]]
    for r in rows:
        out.append([r.host, "yes" if r.reachable else "NO", r.release, r.model, r.target, r.l4t,
                     r.uptime, r.service, r.requests,
                     jetson.clean("; ".join(x for x in (r.device, r.detail, r.driver) if x),
                                  limit=400)])
    return table(out)
