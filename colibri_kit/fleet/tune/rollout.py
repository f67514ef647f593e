"""Tuning a fleet: check every host, then apply, rebooting at most ``max_unavailable`` at a time.

``tune_fleet`` is what ``invoke tune`` does (the task only resolves each host's profile and
prints): phase 1 plans every host and changes nothing anywhere unless every plan passes; phase 2
(``rollout``) applies. A host whose plan is a live switch (or no switch) is applied in parallel,
without permission to reboot. A host that needs a reboot, by the plan's prediction or by the
device's own answer in phase 1 (nvpmodel asked, or the switched mode's mask is not live), gets a
reboot only with ``allow_reboot``, and through one ``Fleet.rollout``: a canary first, then
``max_unavailable`` at a time; each must come back (a new ``boot_id``, then nvpmodel naming the
mode with the GPU running its mask) within ``reboot_timeout``; the first that fails or does not
come back stops the rollout and the hosts not started are left as they were.
``restore_fleet`` rolls the reboots of ``--restore --allow-reboot`` the same way.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, TypeVar

from colibri_kit import jetson
from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet.fleet import Fleet, Outcome, Results, Rollout
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.remote import Remote
from colibri_kit.fleet.tune import nvpmodel
from colibri_kit.fleet.tune.plan import (Check, ModeSwitch, Restored, RestoreReport, TunePlan,
                                         TuneReport, apply, boot_isolation_gone, plan, restore)
from colibri_kit.fleet.tune.state import mode_now
from colibri_kit.profiles import RealtimeSpec, TuneSpec

REBOOT_TIMEOUT = 600.0    # seconds a rebooting device has to answer SSH in its new mode
POLL = 2.0
T = TypeVar("T")


def wait_back(fleet: Fleet, host: Host, boot_id: str | None, mode: str, timeout: float,
              poll: float, then: Callable[[Remote, float], T]) -> T:
    """After a device went down for ``mode``: wait until it answers from a new boot (its
    ``boot_id`` differs from ``boot_id``) and nvpmodel reports ``mode`` with the GPU running its
    mask; then ``then(remote, seconds it took)``. FleetError at ``timeout`` saying what it last
    saw. Without a ``boot_id`` from before (a device that does not say), the mode alone decides."""
    start = time.monotonic()
    deadline = start + timeout
    last = "no answer yet"
    time.sleep(min(poll, 1.0))
    while time.monotonic() < deadline:
        try:
            with fleet.connect(host) as remote:
                now = nvpmodel.read_boot_id(remote)
                if boot_id is not None and now == boot_id:
                    last = "answers from the boot it had before (it has not rebooted yet)"
                else:
                    name, live = mode_now(remote)
                    if name == mode and live:
                        return then(remote, time.monotonic() - start)
                    last = (f"back from a new boot in {name}" if boot_id is not None else
                            f"answers in {name}") + ("" if live else " (its mask not live)")
        except KitError as exc:
            last = str(exc)
        time.sleep(poll)
    raise FleetError(f"{host.name}: did not come back in {mode} within {timeout:g}s after its "
                     f"reboot (last: {jetson.clean(last)})")


def _reboot_rollout(max_unavailable: int) -> Rollout:
    if max_unavailable < 1:
        raise FleetError(f"--max-unavailable must be at least 1 (got {max_unavailable})")
    return Rollout(canary=1, batch=max_unavailable, max_failures=1,
                   hint="a device that fails or does not come back stops the rollout")


def rollout(fleet: Fleet, plans: dict[str, TunePlan | None], *, allow_reboot: bool = False,
            max_unavailable: int = 1, reboot_timeout: float = REBOOT_TIMEOUT,
            poll: float = POLL) -> tuple[Results[TuneReport], str | None]:
    """Apply the plans (see the module). Returns the results and the host the rolling reboots
    stopped after (None: they did not stop)."""
    rolling_plan = _reboot_rollout(max_unavailable)
    todo = [h for h in fleet.hosts if plans.get(h.name) is not None]
    predicted = {h.name for h in todo if allow_reboot and plans[h.name].needs_reboot}  # type: ignore[union-attr]
    outcomes: dict[str, Outcome[TuneReport]] = {}
    live = [h for h in todo if h.name not in predicted]
    if live:
        for o in fleet.run(lambda r, h: apply(r, plans[h.name], allow_reboot=False), hosts=live):
            outcomes[o.host] = o
    # The device's own answer wins over the prediction: a host that asked for a reboot in the
    # live phase (nothing was applied there) joins the rolling reboots, with their limit.
    asked = {n for n, o in outcomes.items() if allow_reboot and o.value is not None
             and o.value.mode is ModeSwitch.NEEDS_REBOOT}
    rolling = [h for h in todo if h.name in predicted or h.name in asked]

    def one(remote: Remote, host: Host) -> TuneReport:
        p = plans[host.name]
        assert p is not None
        if host.name in asked:     # the device disagreed with its plan: plan it again
            p = plan(remote, p.spec, p.realtime)
        first = apply(remote, p, allow_reboot=True)
        if first.mode is not ModeSwitch.REBOOTING:
            return first
        target = first.target_mode or (p.mode.target.name if p.mode else "?")

        def finish(back: Remote, seconds: float) -> TuneReport:
            confirmed = "a new boot_id" if first.boot_id else "its mode (no boot_id to compare)"
            again = plan(back, p.spec, p.realtime)
            if again.boot_reboot:       # the boot did not take the isolation: do not loop
                assert again.realtime is not None and again.boot_state is not None
                bs = again.boot_state
                return TuneReport(host.name, [Check(
                    "isolated cpus", again.realtime.cpu_list,
                    f"{','.join(map(str, bs.isolated)) or 'none'} after the reboot", False)], [
                    f"rebooted once into {target}, back after {seconds:.0f}s (confirmed by "
                    f"{confirmed}), but the kernel does not run the isolation: /proc/cmdline is "
                    f"{bs.cmdline!r}; did the bootloader boot another label or file? Nothing "
                    f"else was applied"], ModeSwitch.REBOOTING)
            report = apply(back, again, allow_reboot=False)
            report.mode = ModeSwitch.REBOOTING
            report.notes.insert(0, f"rebooted once into {target}, back after {seconds:.0f}s "
                                   f"(confirmed by {confirmed}); mode verified, then clocks, "
                                   f"governors and IRQs applied")
            return report
        return wait_back(fleet, host, first.boot_id, target, reboot_timeout, poll, finish)

    stopped = None
    if rolling:
        rolled = fleet.rollout(one, rolling_plan, hosts=rolling)
        for o in rolled:
            outcomes[o.host] = o
        stopped = rolled.stopped_after
    return Results([outcomes[h.name] for h in todo], stopped), stopped


@dataclass
class TuneRun:
    """What ``tune_fleet`` did: every host's plan, and (unless refused or a dry run) the
    results of applying them."""

    plans: Results[TunePlan | None]
    results: Results[TuneReport] | None = None
    stopped: str | None = None

    @property
    def refused(self) -> bool:
        return bool(self.plans.failed)

    @property
    def reboots(self) -> list[str]:
        """Hosts whose plan predicts a reboot (the power mode, the CPU isolation)."""
        return [o.host for o in self.plans if o.value is not None and o.value.needs_reboot]


def tune_fleet(fleet: Fleet, spec_for: Callable[[Host], TuneSpec | None], *,
               realtime_for: Callable[[Host], RealtimeSpec | None] | None = None,
               dry_run: bool = False, allow_reboot: bool = False, max_unavailable: int = 1,
               reboot_timeout: float = REBOOT_TIMEOUT, poll: float = POLL) -> TuneRun:
    """Plan every host (``spec_for(host)``: its profile's tune section, None to skip it;
    ``realtime_for(host)``: its realtime section, for the IRQ and isolation steps), then, unless
    a plan failed or ``dry_run``, apply them (``rollout``)."""
    _reboot_rollout(max_unavailable)     # a bad limit is refused before anything is read

    def one(r: Remote, h: Host) -> TunePlan | None:
        spec = spec_for(h)
        return None if spec is None else plan(r, spec, realtime_for(h) if realtime_for else None)
    plans = fleet.run(one)
    run = TuneRun(plans)
    if run.refused or dry_run:
        return run
    run.results, run.stopped = rollout(
        fleet, {o.host: o.value for o in plans}, allow_reboot=allow_reboot,
        max_unavailable=max_unavailable, reboot_timeout=reboot_timeout, poll=poll)
    return run


def restore_fleet(fleet: Fleet, *, allow_reboot: bool = False, max_unavailable: int = 1,
                  reboot_timeout: float = REBOOT_TIMEOUT,
                  poll: float = POLL) -> tuple[Results[RestoreReport], str | None]:
    """``restore`` on every host; a switch back that needs a reboot is rolled like tune's
    (canary, ``max_unavailable`` at a time, wait for the new boot in the saved mode)."""
    rolling_plan = _reboot_rollout(max_unavailable)
    first = fleet.run(lambda r, h: restore(r, allow_reboot=False))
    outcomes = {o.host: o for o in first}
    again = [h for h in fleet.hosts if allow_reboot and outcomes[h.name].value is not None
             and outcomes[h.name].value.needs_reboot]            # type: ignore[union-attr]

    def one(remote: Remote, host: Host) -> RestoreReport:
        report = restore(remote, allow_reboot=True)
        if not report.rebooting:
            return report

        def back(again: Remote, seconds: float) -> RestoreReport:
            report.notes.insert(0, f"rebooted once into {report.reboot_into}, back after "
                                   f"{seconds:.0f}s")
            left = boot_isolation_gone(again, report.boot_wrote) if report.boot_wrote else []
            if left:
                report.outcome = Restored.INCOMPLETE
                report.notes.append(f"the kernel still runs {' '.join(left)} after the reboot")
            return report
        return wait_back(fleet, host, report.boot_id, str(report.reboot_into), reboot_timeout,
                         poll, back)

    stopped = None
    if again:
        rolled = fleet.rollout(one, rolling_plan, hosts=again)
        outcomes.update({o.host: o for o in rolled})
        stopped = rolled.stopped_after
    return Results([outcomes[h.name] for h in fleet.hosts], stopped), stopped

