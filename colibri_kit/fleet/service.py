"""The device service in a deploy: install the unit, switch, restart, gate, roll back.

``colibri_kit/service.py`` renders and checks the unit and polls a device's health
(``health_gate``); this module is the deploy's use of it on one host, through the ``Remote``
protocol, as root (``sudo=True``: direct when the login is root):

1. write ``device_files(spec)`` (unit, sysusers.d entry; 0644, unchanged files skipped) and run
   ``install_commands()`` (systemd-sysusers, daemon-reload, enable);
2. switch ``current`` (the caller's function), ``systemctl reset-failed`` + ``restart`` (with
   ``Type=exec`` the restart's exit status is not the verdict: the gate is);
3. ``health_gate``: ``/health`` 200 and a one-token completion, or the unit ``failed``, or a
   timeout; downtime = from the restart until the gate passes;
4. on failure: the previous unit files back, ``current`` back, reset-failed, restart, gate again.

A device not booted with systemd (no ``/run/systemd/system``, the test sd_booted() makes, as a
Debian package's maintainer scripts do) gets no service step: the deploy installs files only and
says so.
"""

from __future__ import annotations

import json
import posixpath
import time
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Callable

from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet.remote import Remote
from colibri_kit.service import (UNIT_NAME, GateResult, ServiceSpec, device_files, health_gate,
                                 install_commands, unit_path)

GATE_TIMEOUT_S = 90.0      # a model load on a Jetson (mmap of GBs) + the first token
SYSTEMCTL_TIMEOUT_S = 120.0  # a restart waits for the old process to drain (TimeoutStopSec)


class ServiceStep(StrEnum):
    """What the service step of a deploy did on one host (the deploy table's service column)."""

    HEALTHY = "healthy"            # restarted into the new release, gate passed
    UNCHANGED = "unchanged"        # same release and unit, already healthy: not restarted
    SKIPPED = "skipped"            # the device does not run systemd: files only
    ROLLED_BACK = "rolled-back"    # the gate failed; the previous release serves again
    FAILED = "failed"              # the gate failed and there was nothing healthy to go back to


@dataclass
class ServiceOutcome:
    """What the service step did on one host, for the deploy table."""

    state: ServiceStep
    detail: str
    downtime_s: float | None = None   # restart -> gate passed (the new release)
    gate: GateResult | None = None

    @property
    def ok(self) -> bool:
        return self.state in (ServiceStep.HEALTHY, ServiceStep.SKIPPED, ServiceStep.UNCHANGED)


def runner(remote: Remote, timeout: float = 30.0) -> Callable[[list[str]], tuple[int, str]]:
    """``remote.run`` as root in the shape ``health_gate`` takes: argv -> (exit status, stdout)."""
    def run(argv: list[str]) -> tuple[int, str]:
        res = remote.run(argv, sudo=True, check=False, timeout=timeout)
        return res.exit_code, res.stdout
    return run


def systemd_running(remote: Remote) -> bool:
    """sd_booted(): is the device's PID 1 systemd?"""
    return remote.run(["test", "-d", "/run/systemd/system"], check=False).ok


def install_files(remote: Remote, spec: ServiceSpec, target: str,
                  unit: str = UNIT_NAME) -> dict[str, bytes | None]:
    """Write the unit files that differ, run the install commands. Returns the previous content
    (None: did not exist) of every file written, for ``restore_files``."""
    files = device_files(spec, target=target, unit=unit)
    before: dict[str, bytes | None] = {}
    for path, text in files.items():
        old = remote.read_bytes(path, sudo=True)
        if old == text.encode():
            continue
        before[path] = old
        remote.run(["mkdir", "-p", "--", path.rsplit("/", 1)[0]], sudo=True)
        remote.write_bytes(path, text.encode(), sudo=True)
        remote.run(["chmod", "0644", "--", path], sudo=True)
    for argv in install_commands(unit):
        remote.run(argv, sudo=True, timeout=SYSTEMCTL_TIMEOUT_S)
    return before


def restore_files(remote: Remote, before: dict[str, bytes | None]) -> None:
    """Put back what ``install_files`` replaced (a file that did not exist is removed)."""
    if not before:
        return
    for path, old in before.items():
        if old is None:
            if path.endswith(".service"):   # a first install: no unit left enabled or running
                remote.run(["systemctl", "disable", "--now", path.rsplit("/", 1)[1]], sudo=True,
                           check=False, timeout=SYSTEMCTL_TIMEOUT_S)
            remote.run(["rm", "-f", "--", path], sudo=True)
        else:
            remote.write_bytes(path, old, sudo=True)
            remote.run(["chmod", "0644", "--", path], sudo=True)
    remote.run(["systemctl", "daemon-reload"], sudo=True, timeout=SYSTEMCTL_TIMEOUT_S)


def spec_of_unit(text: str | None, spec: ServiceSpec) -> ServiceSpec:
    """Where a unit file (one the kit rendered) serves: ``spec`` with the bind, port, model id
    and key file of the unit's ``ExecStart=``/``LoadCredential=``. The gate of a rolled-back unit
    asks the old port, not the new one."""
    if not text:
        return spec
    kw: dict[str, object] = {"api_key_file": None}
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            args = line.split()
            for flag, key in (("--host", "bind"), ("--port", "port"), ("--model-id", "model_id")):
                if flag in args[:-1]:
                    value = args[args.index(flag) + 1]
                    kw[key] = int(value) if key == "port" else value
        elif line.startswith("LoadCredential=api-key:"):
            kw["api_key_file"] = line.split(":", 1)[1].strip()
    try:
        return replace(spec, **kw)  # type: ignore[arg-type]
    except KitError:
        return spec


def restart(remote: Remote, unit: str = UNIT_NAME) -> None:
    """Start the unit afresh: a failed unit (start limit hit) must be reset before it starts."""
    remote.run(["systemctl", "reset-failed", unit], sudo=True, check=False)
    # Type=exec: the exit status says only whether the binary could be executed; the gate decides.
    remote.run(["systemctl", "restart", unit], sudo=True, check=False, timeout=SYSTEMCTL_TIMEOUT_S)


def restart_and_gate(remote: Remote, spec: ServiceSpec, *, unit: str = UNIT_NAME,
                     timeout: float = GATE_TIMEOUT_S) -> tuple[GateResult, float]:
    """Restart, wait for the gate; returns the gate and the downtime (restart -> gate passed)."""
    start = time.monotonic()
    restart(remote, unit)
    gate = health_gate(runner(remote), spec, unit=unit, timeout=timeout)
    return gate, time.monotonic() - start


def is_active(remote: Remote, unit: str = UNIT_NAME) -> bool:
    return remote.run(["systemctl", "is-active", "--quiet", unit], sudo=True, check=False).ok


def activate(remote: Remote, spec: ServiceSpec, *, target: str, switch: Callable[[], None],
             switch_back: Callable[[], str] | None, changed: bool, unit: str = UNIT_NAME,
             timeout: float = GATE_TIMEOUT_S) -> ServiceOutcome:
    """The service half of a deploy on one host. ``switch()`` points ``current`` at the new
    release; ``switch_back()`` points it at the previous one and returns its id (None: there is
    none). ``changed``: the release changes (else the unit is only refreshed)."""
    if not systemd_running(remote):
        switch()
        return ServiceOutcome(ServiceStep.SKIPPED,
                              "service: device not booted with systemd (files only)")
    before = install_files(remote, spec, target, unit)
    if not changed and not before and is_active(remote, unit):
        gate = health_gate(runner(remote), spec, unit=unit, timeout=timeout)
        if gate.ok:
            return ServiceOutcome(ServiceStep.UNCHANGED, "service healthy", None, gate)
    switch()
    gate, downtime = restart_and_gate(remote, spec, unit=unit, timeout=timeout)
    if gate.ok:
        return ServiceOutcome(ServiceStep.HEALTHY, f"service healthy after {downtime:.1f}s",
                              downtime, gate)
    reason = f"health gate {gate.state}: {gate.detail}"
    old_unit = before.get(unit_path(unit))
    old_spec = spec if unit_path(unit) not in before else spec_of_unit(
        old_unit.decode(errors="replace") if old_unit else None, spec)
    if switch_back is None or not changed:
        restore_files(remote, before)
        if before.get(unit_path(unit)):
            back, _ = restart_and_gate(remote, old_spec, unit=unit, timeout=timeout)
            reason += f"; previous unit restored ({back.state})"
        return ServiceOutcome(ServiceStep.FAILED, reason, None, gate)
    restore_files(remote, before)
    try:
        previous = switch_back()
    except FleetError as exc:
        remote.run(["systemctl", "stop", unit], sudo=True, check=False, timeout=SYSTEMCTL_TIMEOUT_S)
        return ServiceOutcome(ServiceStep.FAILED,
                              f"{reason}; cannot roll back ({exc}); service stopped", None, gate)
    back, _ = restart_and_gate(remote, old_spec, unit=unit, timeout=timeout)
    if back.ok:
        return ServiceOutcome(ServiceStep.ROLLED_BACK,
                              f"{reason}; rolled back to {previous}, serving", None, gate)
    return ServiceOutcome(ServiceStep.FAILED, f"{reason}; rolled back to {previous}, which is not "
                                              f"healthy either ({back.state}: {back.detail})",
                          None, gate)


# --------------------------------------------------------------------------- invoke service/logs/status

# Runs on the device as root: an HTTP GET of the service, with the key (when the unit has one)
# read from its root-only file and handed to curl on stdin, so it is in no argv. $1 key file
# ("" for none), $2 the URL.
_GET_SH = (
    'if [ -n "$1" ]; then key=$(head -n 1 -- "$1") && '
    'printf "Authorization: Bearer %s\\n" "$key" | curl -sS --max-time 5 -H @- -- "$2"; '
    'else curl -sS --max-time 5 -- "$2"; fi'
)
MAX_LOG_LINES = 10000


@dataclass
class ServiceState:
    host: str
    installed: bool = False
    state: str = "-"            # ActiveState/SubState, e.g. active/running, failed/failed
    pid: str = "-"
    restarts: str = "-"         # NRestarts: restarts by systemd since the last start job
    since: str = "-"
    requests: str = "-"         # colibri_requests_total summed over codes (/metrics)
    detail: str = ""


def installed_spec(remote: Remote, unit: str = UNIT_NAME) -> ServiceSpec | None:
    """Where the device's installed unit serves (None: no unit installed)."""
    text = remote.read_text(unit_path(unit), sudo=True)
    return None if text is None else spec_of_unit(text, ServiceSpec())


def requests_served(metrics: str) -> int | None:
    """Sum of ``colibri_requests_total{code=...}`` in a /metrics answer (None: not one)."""
    total, seen = 0, False
    for line in metrics.splitlines():
        if line.startswith("colibri_requests_total"):
            try:
                total += int(float(line.rsplit(None, 1)[1]))
                seen = True
            except (IndexError, ValueError):
                return None
    if seen or "colibri_generated_tokens_total" in metrics:
        return total
    return None


def service_state(remote: Remote, host_name: str, unit: str = UNIT_NAME) -> ServiceState:
    st = ServiceState(host=host_name)
    if not systemd_running(remote):
        st.detail = "device not booted with systemd"
        return st
    spec = installed_spec(remote, unit)
    if spec is None:
        st.detail = f"{unit} not installed (invoke deploy installs it)"
        return st
    st.installed = True
    res = remote.run(["systemctl", "show", unit, "-p", "ActiveState,SubState,MainPID,NRestarts,"
                      "ActiveEnterTimestamp"], sudo=True, check=False)
    props = dict(l.split("=", 1) for l in res.stdout.splitlines() if "=" in l)
    st.state = f"{props.get('ActiveState', '?')}/{props.get('SubState', '?')}"
    st.pid = props.get("MainPID", "-") if props.get("MainPID") not in (None, "0") else "-"
    st.restarts = props.get("NRestarts", "-")
    st.since = props.get("ActiveEnterTimestamp") or "-"
    if props.get("ActiveState") == "active":
        base = spec.health_url.rsplit("/", 1)[0]
        rc, out = runner(remote)(["sh", "-c", _GET_SH, "sh", spec.api_key_file or "",
                                  base + "/metrics"])
        served = requests_served(out) if rc == 0 else None
        st.requests = "-" if served is None else str(served)
        if served is None:
            st.detail = f"/metrics: {out.strip()[:120] or 'no answer'}"
    elif props.get("ActiveState") == "failed":
        st.detail = last_reason(remote, unit)
    return st


def last_reason(remote: Remote, unit: str = UNIT_NAME) -> str:
    """The service's own last error line from the journal (``colibri serve: ...``)."""
    lines = journal(remote, 30, unit).splitlines()
    own = [l for l in lines if l.startswith("colibri serve:")]
    return own[-1] if own else (lines[-1] if lines else "")


def journal(remote: Remote, lines: int = 100, unit: str = UNIT_NAME) -> str:
    """The unit's last ``lines`` journal lines, as the service wrote them."""
    if not 1 <= lines <= MAX_LOG_LINES:
        raise FleetError(f"-n must be 1..{MAX_LOG_LINES} (got {lines})")
    res = remote.run(["journalctl", "-u", unit, "-n", str(lines), "--no-pager", "-o", "cat"],
                     sudo=True, check=False, max_output=32 << 20)
    if res.exit_code != 0:
        raise FleetError(f"{remote.name}: journalctl failed: {res.stderr.strip()[:300]}")
    return res.stdout


def control(remote: Remote, host_name: str, action: str, *, unit: str = UNIT_NAME,
            timeout: float = GATE_TIMEOUT_S) -> ServiceState:
    """``restart`` (then the health gate), ``stop`` or ``start`` (then the gate) the service."""
    if action not in ("restart", "stop", "start"):
        raise FleetError(f"unknown service action {action!r}; allowed: restart, stop, start")
    if not systemd_running(remote):
        raise FleetError(f"{remote.name}: device not booted with systemd")
    spec = installed_spec(remote, unit)
    if spec is None:
        raise FleetError(f"{remote.name}: {unit} is not installed (invoke deploy installs it)")
    if action == "stop":
        remote.run(["systemctl", "stop", unit], sudo=True, timeout=SYSTEMCTL_TIMEOUT_S)
        st = service_state(remote, host_name, unit)
        st.detail = st.detail or "stopped"
        return st
    gate, downtime = restart_and_gate(remote, spec, unit=unit, timeout=timeout)
    st = service_state(remote, host_name, unit)
    if not gate.ok:
        raise FleetError(f"{remote.name}: service not healthy after {action} "
                         f"({gate.state}: {gate.detail})")
    st.detail = f"healthy after {downtime:.1f}s"
    return st


# --------------------------------------------------------------------------- invoke smoke --http

# $1 key file ("" for none), $2 URL, $3 JSON body: a POST through the running service.
_POST_SH = (
    'if [ -n "$1" ]; then key=$(head -n 1 -- "$1") && '
    'printf "Authorization: Bearer %s\\n" "$key" | curl -sS --max-time 300 -H @- '
    '-H "Content-Type: application/json" -d "$3" -- "$2"; '
    'else curl -sS --max-time 300 -H "Content-Type: application/json" -d "$3" -- "$2"; fi'
)


def http_smoke(remote: Remote, root: str, prompt_ids: list[int], max_tokens: int,
               unit: str = UNIT_NAME) -> tuple[bool, str]:
    """A greedy completion through the running service must equal ``colibri generate`` of the
    current release on the same device (cut where the service stopped at end-of-sequence).
    Returns (ok, what to show)."""
    spec = installed_spec(remote, unit)
    if spec is None or not systemd_running(remote):
        return False, f"no {unit} on the device (invoke deploy installs it)"
    if not is_active(remote, unit):
        return False, f"{unit} is not running ({last_reason(remote, unit) or 'see invoke logs'})"
    base = spec.health_url.rsplit("/", 1)[0]
    body = json.dumps({"model": spec.model_id or "model", "prompt": list(prompt_ids),
                       "max_tokens": max_tokens, "temperature": 0})
    rc, out = runner(remote, timeout=320)(["sh", "-c", _POST_SH, "sh", spec.api_key_file or "",
                                           base + "/v1/completions", body])
    try:
        choice = json.loads(out)["choices"][0]
        got = [int(t) for t in choice["token_ids"]]
        finish = choice.get("finish_reason")
    except (ValueError, KeyError, IndexError, TypeError):
        return False, f"the service's answer is not a completion: {out.strip()[:200]}"
    binary = posixpath.join(root, "current", "bin", "colibri")
    model = posixpath.join(root, "current", "model.colibri")
    gen = remote.run([binary, "generate", model, "--ids", ",".join(map(str, prompt_ids)),
                      "--max-new", str(max_tokens)], timeout=300)
    want = [int(t) for t in json.loads(gen.stdout).get("new_ids", [])]
    same = bool(got) and got == want[:len(got)] and (len(got) == max_tokens or finish == "stop")
    return same, ("same" if same else f"service {got} ({finish}), colibri generate {want}")
