"""Fleet tasks: deploy, rollback, status, smoke (inventory in fleet.yaml, see docs/fleet.md)."""

from __future__ import annotations

import json as jsonlib
from pathlib import Path

from invoke import Context, task
from invoke.exceptions import Exit

from colibri_kit.errors import FleetError
from colibri_kit.fleet import deploy as deploylib
from colibri_kit.fleet import release as rel
from colibri_kit.fleet import status as statuslib
from colibri_kit.fleet.fleet import DEFAULT_KEEP, DEFAULT_PARALLEL, Fleet
from colibri_kit.fleet.inventory import Host, Inventory, load_inventory
from colibri_kit.fleet.remote import Remote
from colibri_kit.paths import dist_dir, project_root
from colibri_kit.tasks._common import user_errors

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


def _for_target(f: Fleet, target: str) -> Fleet:
    """Hosts whose target is ``target`` or unset (deploy and smoke name the target to act on)."""
    chosen = [h for h in f.hosts if h.target in (None, target)]
    if not chosen:
        raise FleetError(f"no selected host has target {target}")
    return f.only(chosen)


def _finish(results: list[deploylib.HostResult], as_json: bool, cols: list[str] | None = None) -> None:
    if as_json:
        print(jsonlib.dumps([r.__dict__ for r in results], indent=1))
    else:
        print(deploylib.results_table(results, cols))
    failed = [r.host for r in results if not r.ok]
    if failed:
        raise Exit(f"failed on {len(failed)} of {len(results)} host(s): {', '.join(failed)}", code=1)


@task(auto_shortflags=False, help={
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
    "json": "print results as JSON",
})
@user_errors
def deploy(c: Context, target: str, model: str = "", fleet: str = "", hosts: str = "", group: str = "",
           tags: str = "", parallel: int = 0, keep: int = 0, dry_run: bool = False, canary: int = 0,
           max_failures: int = -1, accept_new_host_keys: bool = False, dist: str = "",
           max_first_token_ms: float = -1.0, json: bool = False) -> None:
    """Upload dist/<target>/ (+ a model) to the fleet and switch `current` atomically per host."""
    from colibri_kit.fleet import smoke as smokelib
    from colibri_kit.profiles import load_profile

    profile = load_profile(target)
    f = _for_target(select_fleet(c, fleet, hosts, group, "", tags, parallel, accept_new_host_keys,
                                 None if max_failures < 0 else max_failures), target)
    art = deploylib.prepare(target, Path(dist) if dist else dist_dir(target), Path(model) if model else None)

    def canary_smoke(canaries: Fleet) -> list[deploylib.HostResult]:
        return smokelib.smoke(canaries, profile, model=Path(model) if model else None,
                              max_first_token_ms=None if max_first_token_ms < 0 else max_first_token_ms)
    results = deploylib.deploy(
        f, art, profile, keep=keep or _cfg(c, "keep", DEFAULT_KEEP), dry_run=dry_run,
        canary=canary, smoke_fn=canary_smoke if canary else None)
    _finish(results, json)


@task(help={**SELECT_HELP, "to": "switch to this release id instead of the previous one",
            "json": "print results as JSON"})
@user_errors
def rollback(c: Context, to: str = "", fleet: str = "", hosts: str = "", group: str = "", target: str = "",
             tags: str = "", parallel: int = 0, accept_new_host_keys: bool = False, json: bool = False) -> None:
    """Switch `current` back to the previous release (or --to ID), atomically, per host."""
    if to:
        rel.validate_release_id(to)
    f = select_fleet(c, fleet, hosts, group, target, tags, parallel, accept_new_host_keys)
    _finish(deploylib.rollback(f, to or None), json)


@task(help={**SELECT_HELP, "json": "print results as JSON"})
@user_errors
def status(c: Context, fleet: str = "", hosts: str = "", group: str = "", target: str = "", tags: str = "",
           parallel: int = 0, accept_new_host_keys: bool = False, json: bool = False) -> None:
    """Show per host: reachable, current release, model, target, L4T, uptime."""
    f = select_fleet(c, fleet, hosts, group, target, tags, parallel, accept_new_host_keys)
    rows = statuslib.status(f)
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


@task(help={
    **SELECT_HELP,
    "target": "target profile to check against (prompt, threshold, device identity); also selects "
              "hosts whose target is T, or hosts with no target",
    "model": "local copy of the deployed model for the reference (default: fetched from a device "
             "once, by sha256, into the kit cache)",
    "max_first_token_ms": "override the profile's first-token p99 limit (e.g. for emulated devices under qemu)",
    "bench_runs": "colibri bench --runs (default 5)",
    "json": "print results as JSON (for CI)",
})
@user_errors
def smoke(c: Context, target: str, fleet: str = "", hosts: str = "", group: str = "", tags: str = "",
          parallel: int = 0, model: str = "", max_first_token_ms: float = -1.0, bench_runs: int = 5,
          accept_new_host_keys: bool = False, json: bool = False) -> None:
    """Run the deployed colibri on each device: logits/top-k/greedy vs the NumPy reference, latency."""
    from colibri_kit.fleet import smoke as smokelib
    from colibri_kit.profiles import load_profile

    profile = load_profile(target)
    f = _for_target(select_fleet(c, fleet, hosts, group, "", tags, parallel, accept_new_host_keys),
                    target)
    results = smokelib.smoke(
        f, profile, model=Path(model) if model else None,
        max_first_token_ms=None if max_first_token_ms < 0 else max_first_token_ms,
        bench_runs=bench_runs, extra_fields=[_tuning_column])
    _finish(results, json, smokelib.SMOKE_COLUMNS + ["tuning"])


TASKS = [deploy, rollback, status, smoke]
