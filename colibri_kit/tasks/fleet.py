"""Fleet tasks: deploy, rollback, status, smoke (inventory in fleet.yaml, see docs/fleet.md)."""

from __future__ import annotations

import json as jsonlib
from pathlib import Path

from invoke import Context
from invoke.exceptions import Exit

from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet import deploy as deploylib
from colibri_kit.fleet import release as rel
from colibri_kit.fleet import status as statuslib
from colibri_kit.fleet.fleet import DEFAULT_KEEP, DEFAULT_PARALLEL, Fleet
from colibri_kit.fleet.inventory import Host, Inventory, load_inventory
from colibri_kit.fleet.remote import Remote
from colibri_kit.paths import dist_dir, project_root
from colibri_kit.profiles import Profile, load_profile
from colibri_kit.tasks._common import kit_task, user_errors

SELECT_HELP = {
    "fleet": "inventory file (default: fleet.path in invoke.yaml, i.e. fleet.yaml)",
    "hosts": "only these hosts (comma-separated names)",
    "group": "only the hosts of this group (or tag)",
    "target": "only hosts whose target is T",
    "tags": "only hosts carrying all these tags (comma-separated)",
    "parallel": f"connections at once (default: fleet.parallel in invoke.yaml, else {DEFAULT_PARALLEL})",
    "accept_new_host_keys": "record unknown host keys in the project known_hosts (never changed ones)",
}


def _cfg(c: Context, key: str, default):
    try:
        return c.config.fleet[key]
    except (AttributeError, KeyError):
        return default


def _inventory(c: Context, fleet: str) -> Inventory:
    path = Path(fleet or _cfg(c, "path", "fleet.yaml"))
    if not path.is_absolute() and not path.exists():
        path = project_root() / path
    return load_inventory(path)


def select_fleet(c: Context, fleet: str, hosts: str = "", group: str = "", target: str = "",
                 tags: str = "", parallel: int = 0, accept_new_host_keys: bool = False,
                 max_failures: int | None = None) -> Fleet:
    """The options every fleet task shares, as one Fleet (defaults: invoke.yaml's fleet.*)."""
    return Fleet.select(_inventory(c, fleet), hosts=hosts, group=group, target=target, tags=tags,
                        accept_new=accept_new_host_keys,
                        parallel=parallel or int(_cfg(c, "parallel", DEFAULT_PARALLEL)),
                        max_failures=max_failures)


def profile_or_none(target: str) -> Profile | None:
    """The profile a device's release names, for status's driver check (None: not one of
    targets/, e.g. a release made from another checkout)."""
    try:
        return load_profile(target)
    except KitError:
        return None


def _for_target(f: Fleet, target: str) -> Fleet:
    """Hosts whose target is ``target`` or unset (deploy and smoke name the target to act on)."""
    chosen = [h for h in f.hosts if h.target in (None, target)]
    if not chosen:
        raise FleetError(f"no selected host has target {target}")
    return f.only(chosen)


def _finish(results: list[deploylib.HostResult], as_json: bool, cols: list[str] | None = None) -> None:
    if as_json:
        print(jsonlib.dumps([r.to_json() for r in results], indent=1))
    else:
        print(deploylib.results_table(results, cols))
    failed = [r.host for r in results if not r.ok]
    if failed:
        raise Exit(f"failed on {len(failed)} of {len(results)} host(s): {', '.join(failed)}", code=1)


@kit_task(help={
    **SELECT_HELP,
    "target": "target profile to deploy (dist/<target>/ must be built); also selects hosts whose "
              "target is T, or hosts with no target",
    "model": "a .colibri model file to deploy with the release",
    "dist": "deploy this dist directory instead of dist/<target>/",
    "keep": f"releases kept on each device (default {DEFAULT_KEEP})",
    "dry_run": "print what would be uploaded and switched, change nothing",
    "canary": "deploy to the first N hosts, smoke-test them, continue only if they pass",
    "max_failures": "stop starting new hosts after K failures",
    "max_first_token_ms": "with --canary: override the profile's first-token p99 limit for the canary smoke test",
    "no_service": "deploy files and switch `current` only: do not install or restart colibri.service",
    "gate_timeout": "seconds the health gate waits for /health and a completion after the restart "
                    "(default 90); then the host is rolled back",
    "json": "print results as JSON",
})
@user_errors
def deploy(c: Context, target: str, model: str = "", fleet: str = "", hosts: str = "", group: str = "",
           tags: str = "", parallel: int = 0, keep: int = 0, dry_run: bool = False, canary: int = 0,
           max_failures: int = -1, accept_new_host_keys: bool = False, dist: str = "",
           max_first_token_ms: float = -1.0, no_service: bool = False, gate_timeout: float = 0.0,
           json: bool = False) -> None:
    """Upload dist/<target>/ (+ a model), switch `current` per host, restart colibri.service.

    With the profile's `service:` section (and without --no-service) each host also gets the
    unit installed or updated, the service restarted and health-gated (/health + a one-token
    completion); a host whose gate fails is switched back to its previous release (exit 1)."""
    from colibri_kit.fleet import smoke as smokelib

    profile = load_profile(target)
    f = _for_target(select_fleet(c, fleet, hosts, group, "", tags, parallel, accept_new_host_keys,
                                 None if max_failures < 0 else max_failures), target)
    art = deploylib.prepare(profile, Path(dist) if dist else dist_dir(target),
                            Path(model) if model else None)

    def canary_smoke(canaries: Fleet) -> list[deploylib.HostResult]:
        return smokelib.smoke(canaries, profile, model=Path(model) if model else None,
                              max_first_token_ms=None if max_first_token_ms < 0 else max_first_token_ms)
    from colibri_kit.fleet.service import GATE_TIMEOUT_S

    service = None if no_service else profile.service
    results = deploylib.deploy(
        f, art, keep=keep or _cfg(c, "keep", DEFAULT_KEEP), dry_run=dry_run,
        canary=canary, smoke_fn=canary_smoke if canary else None, service=service,
        gate_timeout=gate_timeout or GATE_TIMEOUT_S)
    _finish(results, json, ["service", "downtime"] if service is not None and not dry_run else None)


@kit_task(help={**SELECT_HELP, "to": "switch to this release id instead of the previous one",
            "json": "print results as JSON"})
@user_errors
def rollback(c: Context, to: str = "", fleet: str = "", hosts: str = "", group: str = "", target: str = "",
             tags: str = "", parallel: int = 0, accept_new_host_keys: bool = False, json: bool = False) -> None:
    """Switch `current` back to the previous release (or --to ID), atomically, per host."""
    if to:
        rel.validate_release_id(to)
    f = select_fleet(c, fleet, hosts, group, target, tags, parallel, accept_new_host_keys)
    _finish(deploylib.rollback(f, to or None), json)


@kit_task(help={**SELECT_HELP, "json": "print results as JSON"})
@user_errors
def status(c: Context, fleet: str = "", hosts: str = "", group: str = "", target: str = "", tags: str = "",
           parallel: int = 0, accept_new_host_keys: bool = False, json: bool = False) -> None:
    """Show per host: reachable, current release, model, target, L4T, uptime, service state, requests served."""
    f = select_fleet(c, fleet, hosts, group, target, tags, parallel, accept_new_host_keys)
    rows = statuslib.status(f, profile_for=profile_or_none)
    if json:
        print(jsonlib.dumps([r.__dict__ for r in rows], indent=1))
    else:
        print(statuslib.status_table(rows))
    if any(not r.reachable for r in rows):
        raise Exit("some hosts are unreachable", code=1)


def _tuning_column(remote: Remote, host: Host) -> dict[str, str]:
    """The tuning state next to the latency figures."""
    from colibri_kit.fleet.tune import summary_text, tuning_summary

    return {"tuning": summary_text(tuning_summary(remote))}


@kit_task(help={
    **SELECT_HELP,
    "target": "target profile to check against (prompt, threshold, device identity); also selects "
              "hosts whose target is T, or hosts with no target",
    "model": "local copy of the deployed model for the reference (default: fetched from a device "
             "once, by sha256, into the kit cache)",
    "max_first_token_ms": "override the profile's first-token p99 limit (e.g. for emulated devices under qemu)",
    "bench_runs": "colibri bench --runs (default 5)",
    "http": "also check the running colibri.service: a greedy completion through it must equal "
            "colibri generate of the deployed release (column http)",
    "json": "print results as JSON (for CI)",
})
@user_errors
def smoke(c: Context, target: str, fleet: str = "", hosts: str = "", group: str = "", tags: str = "",
          parallel: int = 0, model: str = "", max_first_token_ms: float = -1.0, bench_runs: int = 5,
          accept_new_host_keys: bool = False, http: bool = False, json: bool = False) -> None:
    """Run the deployed colibri on each device: logits/top-k/greedy vs the NumPy reference, the
    generated text vs `tokenizers` + the reference (models with a tokenizer), latency."""
    from colibri_kit.fleet import smoke as smokelib

    profile = load_profile(target)
    f = _for_target(select_fleet(c, fleet, hosts, group, "", tags, parallel, accept_new_host_keys),
                    target)
    results = smokelib.smoke(
        f, profile, model=Path(model) if model else None,
        max_first_token_ms=None if max_first_token_ms < 0 else max_first_token_ms,
        bench_runs=bench_runs, extra_fields=[_tuning_column])
    cols = smokelib.SMOKE_COLUMNS + ["tuning"]
    if http:
        from colibri_kit.fleet import service as svc

        checked = {o.host: o for o in f.run(lambda r, h: svc.http_smoke(
            r, h.root, list(profile.smoke.prompt_ids), int(profile.smoke.greedy_tokens)))}
        for row in results:
            o = checked.get(row.host)
            ok, what = o.value if o is not None and o.value is not None else (
                False, (o.error if o is not None else None) or "not checked")
            row.extra["http"] = "same" if ok else "FAILED"
            if not ok and row.result is not deploylib.HostState.SKIPPED:
                row.result = deploylib.HostState.FAILED
                row.detail = f"{row.detail}; http: {what}" if row.detail else f"http: {what}"
        cols.append("http")
    _finish(results, json, cols)


def _service_table(rows) -> str:
    from colibri_kit.report import table

    out = [["host", "state", "pid", "restarts", "requests", "since", "detail"]]
    for r in rows:
        out.append([r.host, r.state, r.pid, r.restarts, r.requests, r.since, r.detail])
    return table(out)


@kit_task(help={
    **SELECT_HELP,
    "status": "show colibri.service per host: state, main pid, restarts, requests served (default)",
    "restart": "restart the service and wait for its health gate (/health + a one-token completion)",
    "stop": "stop the service (in-flight requests drain first, up to the drain timeout)",
    "start": "start the service and wait for its health gate",
    "gate_timeout": "seconds to wait for the health gate after --restart/--start (default 90)",
    "json": "print results as JSON",
})
@user_errors
def service(c: Context, status: bool = False, restart: bool = False, stop: bool = False,
            start: bool = False, fleet: str = "", hosts: str = "", group: str = "", target: str = "",
            tags: str = "", parallel: int = 0, gate_timeout: float = 0.0,
            accept_new_host_keys: bool = False, json: bool = False) -> None:
    """Show or control colibri.service (the unit `invoke deploy` installs) on each host."""
    from colibri_kit.fleet import service as svc

    actions = [a for a, on in (("restart", restart), ("stop", stop), ("start", start)) if on]
    if len(actions) + status > 1:
        raise FleetError("choose one of --status, --restart, --stop, --start")
    f = select_fleet(c, fleet, hosts, group, target, tags, parallel, accept_new_host_keys)
    if actions:
        results = f.run(lambda r, h: svc.control(r, h.name, actions[0],
                                                 timeout=gate_timeout or svc.GATE_TIMEOUT_S))
    else:
        results = f.run(lambda r, h: svc.service_state(r, h.name))
    rows = [o.value if o.value is not None else
            svc.ServiceState(host=o.host, detail=o.error or "skipped") for o in results]
    print(jsonlib.dumps([r.__dict__ for r in rows], indent=1) if json else _service_table(rows))
    bad = [o.host for o in results if not o.ok]
    if not actions:
        bad += [r.host for r in rows if r.installed and not r.state.startswith("active/")]
    if bad:
        raise Exit(f"service not {'healthy' if actions != ['stop'] else 'stopped'} on "
                   f"{len(bad)} of {len(rows)} host(s): {', '.join(bad)}", code=1)


@kit_task(help={
    **SELECT_HELP,
    "n": "journal lines per host (default 100)",
})
@user_errors
def logs(c: Context, n: int = 100, fleet: str = "", hosts: str = "", group: str = "", target: str = "",
         tags: str = "", parallel: int = 0, accept_new_host_keys: bool = False) -> None:
    """Print colibri.service's journal of each host (journalctl -u colibri -n N -o cat)."""
    from colibri_kit.fleet import service as svc

    f = select_fleet(c, fleet, hosts, group, target, tags, parallel, accept_new_host_keys)
    results = f.run(lambda r, h: svc.journal(r, n))
    for o in results:
        print(f"== {o.host} ==")
        print((o.value or "").rstrip("\n") if o.ok else f"(failed: {o.error})")
    failed = [o.host for o in results if not o.ok]
    if failed:
        raise Exit(f"no logs from {', '.join(failed)}", code=1)


TASKS = [deploy, rollback, status, smoke, service, logs]
