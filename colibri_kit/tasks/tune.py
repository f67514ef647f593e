"""`invoke tune`: apply the target profile's tune section (power mode, jetson_clocks, governors)
and its realtime section's IRQ affinity and CPU isolation, verify it, show the devices' state, or
restore what was there before (docs/tuning.md)."""

from __future__ import annotations

import json as jsonlib

from invoke import Context
from invoke.exceptions import Exit

from colibri_kit.errors import FleetError
from colibri_kit.fleet import tune as tunelib
from colibri_kit.fleet.inventory import Host
from colibri_kit.profiles import RealtimeSpec, TuneSpec, load_profile
from colibri_kit.report import clean, table
from colibri_kit.tasks._common import kit_task, user_errors
from colibri_kit.tasks.fleet import SELECT_HELP, select_fleet


def _spec_for(host: Host) -> TuneSpec | None:
    """The host's profile's tune section (None: the profile has none)."""
    if not host.target:
        raise FleetError(f"{host.name}: no target in the fleet file, so no profile to tune from")
    return load_profile(host.target).tune


def _realtime_for(host: Host) -> RealtimeSpec | None:
    """The host's profile's realtime section (its IRQ and isolation steps), if any."""
    return load_profile(host.target).realtime if host.target else None


def _show(results, as_json: bool) -> None:
    if as_json:
        print(jsonlib.dumps({o.host: tunelib.state_dict(o.value) if o.ok else {"error": o.error}
                             for o in results}, indent=1, default=str))
    elif results.succeeded:
        labels = [label for label, _ in tunelib.show_lines(tunelib.TuningState())]
        print(table([["host", *labels]] + [[o.host, *[v for _, v in tunelib.show_lines(o.value)]]
                                           for o in results.succeeded]))
    for o in results.failed if not as_json else []:
        print(clean(f"{o.host}: {o.error}"))
    if results.failed:
        raise Exit(f"could not read {len(results.failed)} host(s): "
                   f"{', '.join(o.host for o in results.failed)}", code=1)


def _restore_table(results) -> None:
    rows = [["host", "result", "detail"]]
    for o in results:
        if o.skipped:
            rows.append([o.host, "skipped", o.why])
            continue
        rows.append([o.host, "failed" if o.error else o.value.outcome.value,
                     o.error or "; ".join(o.value.notes)])
    print(table(rows))
    bad = [o.host for o in results if not o.ok or not o.value.ok]
    if bad:
        raise Exit(f"restore incomplete on {len(bad)} host(s): {', '.join(bad)}", code=1)


def _apply_table(results, stopped: str | None = None) -> None:
    rows = [["host", "setting", "wanted", "actual", "ok"]]
    notes = []
    for o in results:
        if o.skipped:
            rows.append([o.host, "-", "-", o.why or f"not started: the rollout stopped after "
                                                     f"{stopped}", "SKIPPED"])
            continue
        if o.error:
            rows.append([o.host, "-", "-", f"error: {o.error}", "FAIL"])
            continue
        for ch in o.value.checks:
            rows.append([o.host, ch.what, ch.wanted, ch.actual, "ok" if ch.ok else "DIFFERS"])
        notes += [f"{o.host}: {n}" for n in o.value.notes]
    print(table(rows))
    for n in notes:
        print(clean(n))
    if stopped:
        print(clean(f"rollout stopped after {stopped}: it failed or did not come back; hosts "
                    f"not started were left as they were"))
    bad = [o.host for o in results if not o.ok or not o.value.ok]
    if bad:
        raise Exit(f"tuning not verified on {len(bad)} host(s): {', '.join(bad)}", code=1)


@kit_task(help={
    **SELECT_HELP,
    "dry_run": "check the profile against each device and print the steps, change nothing",
    "allow_reboot": "let a device reboot when its power-mode switch or the profile's CPU "
                    "isolation (realtime.isolate) needs it (without it such a host is reported "
                    "and nothing is applied there)",
    "max_unavailable": "with --allow-reboot: devices rebooting at once (after one canary; also "
                       "for --restore); 1",
    "reboot_timeout": "with --allow-reboot: seconds a device has to come back over SSH in its "
                      "new mode (600); one that does not stops the rollout",
    "show": "print each device's mode, governors, clocks, jetson_clocks and fan; change nothing",
    "restore": "put back the state saved by the first tune (clocks, governors, mode, IRQ "
               "affinity, the kernel command line), remove it",
    "json": "with --show: print the state as JSON",
})
@user_errors
def tune(c: Context, fleet: str = "", hosts: str = "", group: str = "", target: str = "",
         tags: str = "", parallel: int = 0, accept_new_host_keys: bool = False,
         dry_run: bool = False, allow_reboot: bool = False, show: bool = False,
         restore: bool = False, json: bool = False, max_unavailable: int = 1,
         reboot_timeout: int = int(tunelib.REBOOT_TIMEOUT)) -> None:
    """Tune devices per their target profile (nvpmodel, jetson_clocks, governors, IRQs, CPU
    isolation) and verify."""
    if show and restore:
        raise FleetError("--show and --restore are separate actions: pick one")
    if dry_run and (show or restore):
        raise FleetError("--dry-run previews tuning only (--show never changes anything; "
                         "--restore --dry-run is not supported)")
    f = select_fleet(c, fleet, hosts, group, target, tags, parallel, accept_new_host_keys)
    if show:
        _show(f.run(lambda r, h: tunelib.read_state_any(r)), json)
        return
    if restore:
        results, _ = tunelib.restore_fleet(f, allow_reboot=allow_reboot,
                                           max_unavailable=max_unavailable,
                                           reboot_timeout=reboot_timeout)
        _restore_table(results)
        return

    # Phase 1 on every host (privileges, profile vs device), then phase 2 only if all pass.
    run = tunelib.tune_fleet(f, _spec_for, realtime_for=_realtime_for, dry_run=dry_run,
                             allow_reboot=allow_reboot,
                             max_unavailable=max_unavailable, reboot_timeout=reboot_timeout)
    if run.refused:
        for o in run.plans.failed:
            print(clean(f"{o.host}: {o.error}"))
        raise Exit(f"tune refused on {len(run.plans.failed)} of {len(run.plans)} host(s) (see "
                   f"above); nothing was changed on any host", code=1)
    if dry_run:
        rows = [["host", "steps"]]
        for o in run.plans:
            steps = o.value.steps if o.value else ["profile has no tune section: skipped"]
            for i, step in enumerate(steps or ["nothing to do"]):
                rows.append([o.host if i == 0 else "", clean(step)])
        print(table(rows))
    if run.reboots:
        print()
        print(clean(f"needs a reboot (power mode or CPU isolation): {', '.join(run.reboots)}" +
                    (f" (rolling: one canary, then {max_unavailable} at a time)" if allow_reboot
                     else " (not allowed: nothing will be applied there; add --allow-reboot)")))
    if dry_run:
        print("\ndry run: nothing was changed")
        return
    assert run.results is not None
    _apply_table(run.results, run.stopped)

TASKS = [tune]
