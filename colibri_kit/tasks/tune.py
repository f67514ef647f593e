"""`invoke tune`: apply the target profile's tune section (power mode, jetson_clocks, governors),
verify it, show the devices' state, or restore what was there before (docs/tuning.md)."""

from __future__ import annotations

import json as jsonlib
from dataclasses import dataclass, field
from typing import Callable, TypeVar

from invoke import Context, task
from invoke.exceptions import Exit

from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet import tune as tunelib
from colibri_kit.fleet.connect import for_each
from colibri_kit.fleet.deploy import connect_for
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.report import table
from colibri_kit.profiles import TuneSpec, load_profile
from colibri_kit.tasks._common import user_errors
from colibri_kit.tasks.fleet import SELECT_HELP, _cfg, _inventory, _select

T = TypeVar("T")


@dataclass
class _Outcome:
    host: str
    value: object = None
    error: str | None = None
    notes: list[str] = field(default_factory=list)


def _spec_for(host: Host) -> TuneSpec | None:
    if not host.target:
        raise FleetError(f"{host.name}: no target in the fleet file, so no profile to tune from")
    return load_profile(host.target).tune


def _each(hosts: list[Host], make, parallel: int, fn: Callable[[object, Host], T]) -> list[_Outcome]:
    """fn(remote, host) on every host, bounded; one host's failure is recorded, not raised."""
    def one(host: Host) -> _Outcome:
        try:
            with make(host) as remote:
                return _Outcome(host.name, fn(remote, host))
        except KitError as exc:
            return _Outcome(host.name, error=str(exc))
        except Exception as exc:  # noqa: BLE001 - a bug on one host must not stop the others
            return _Outcome(host.name, error=f"{type(exc).__name__}: {exc}")
    return for_each(hosts, one, parallel)


def _show(results: list[_Outcome], as_json: bool) -> None:
    ok = [r for r in results if r.value is not None]
    if as_json:
        print(jsonlib.dumps({r.host: (tunelib.state_dict(r.value) if r.value else {"error": r.error})
                             for r in results}, indent=1, default=str))
    elif ok:
        labels = [label for label, _ in tunelib.show_lines(tunelib.DeviceState())]
        rows = [["host", *labels]] + [[r.host, *[v for _, v in tunelib.show_lines(r.value)]]
                                      for r in ok]
        print(table(rows))
    failed = [r for r in results if r.value is None]
    for r in failed if not as_json else []:
        print(f"{r.host}: {r.error}")
    if failed:
        raise Exit(f"could not read {len(failed)} host(s): {', '.join(r.host for r in failed)}",
                   code=1)


@task(help={
    **SELECT_HELP,
    "dry_run": "check the profile against each device and print the steps, change nothing",
    "allow_reboot": "let nvpmodel reboot a device when its power-mode switch needs it",
    "show": "print each device's mode, governors, clocks, jetson_clocks and fan; change nothing",
    "restore": "put back the state saved by the first tune (clocks, governors, mode), remove it",
    "json": "with --show: print the state as JSON",
})
@user_errors
def tune(c: Context, fleet: str = "", hosts: str = "", group: str = "", target: str = "",
         tags: str = "", parallel: int = 0, accept_new_host_keys: bool = False,
         dry_run: bool = False, allow_reboot: bool = False, show: bool = False,
         restore: bool = False, json: bool = False) -> None:
    """Tune devices per their target profile (nvpmodel, jetson_clocks, governors) and verify."""
    if show and restore:
        raise FleetError("--show and --restore are separate actions: pick one")
    if dry_run and (show or restore):
        raise FleetError("--dry-run previews tuning only (--show never changes anything; "
                         "--restore --dry-run is not supported)")
    inv = _inventory(c, fleet)
    chosen = _select(inv, hosts, group, target, tags)
    parallel = parallel or int(_cfg(c, "parallel", 8))
    make = connect_for(inv, accept_new_host_keys)

    if show:
        _show(_each(chosen, make, parallel, lambda r, h: tunelib.read_state_any(r)), json)
        return

    if restore:
        results = _each(chosen, make, parallel,
                        lambda r, h: tunelib.restore_host(r, h.root, allow_reboot=allow_reboot))
        rows = [["host", "result", "detail"]]
        for r in results:
            notes = r.value or []
            kept = any("saved state is kept" in n for n in notes)
            rows.append([r.host, "failed" if r.error else ("incomplete" if kept else "restored"),
                         r.error or "; ".join(notes)])
        print(table(rows))
        bad = [r.host for r in results
               if r.error or any("saved state is kept" in n for n in (r.value or []))]
        if bad:
            raise Exit(f"restore incomplete on {len(bad)} host(s): {', '.join(bad)}", code=1)
        return

    # Phase 1, every host: privileges, profile vs device. Nothing changes anywhere unless all pass.
    def plan(remote, host: Host):
        spec = _spec_for(host)
        if spec is None:
            return None
        tunelib.require_privilege(remote)
        return tunelib.plan_host(remote, spec)

    plans = _each(chosen, make, parallel, plan)
    refused = [p for p in plans if p.error]
    if refused:
        for p in refused:
            print(f"{p.host}: {p.error}")
        raise Exit(f"tune refused on {len(refused)} of {len(plans)} host(s) (see above); "
                   f"nothing was changed on any host", code=1)
    rows = [["host", "steps"]]
    for p in plans:
        steps = p.value.steps if p.value else ["profile has no tune section: skipped"]
        for i, step in enumerate(steps or ["nothing to do"]):
            rows.append([p.host if i == 0 else "", step])
    if dry_run:
        print(table(rows))
        print("\ndry run: nothing was changed")
        return

    # Phase 2: apply and verify.
    by_host = {p.host: p.value for p in plans}
    todo = [h for h in chosen if by_host.get(h.name) is not None]
    results = _each(todo, make, parallel, lambda r, h: tunelib.apply_host(
        r, by_host[h.name], h.root, allow_reboot=allow_reboot))
    out = [["host", "setting", "wanted", "actual", "ok"]]
    notes = []
    for r in results:
        if r.error:
            out.append([r.host, "-", "-", f"error: {r.error}", "FAIL"])
            continue
        for what, wanted, actual, ok in r.value.rows:
            out.append([r.host, what, wanted, actual, "ok" if ok else "DIFFERS"])
        notes += [f"{r.host}: {n}" for n in r.value.notes]
    print(table(out))
    for n in notes:
        print(n)
    bad = [r.host for r in results if r.error or not r.value.ok]
    if bad:
        raise Exit(f"tuning not verified on {len(bad)} host(s): {', '.join(bad)}", code=1)


TASKS = [tune]
