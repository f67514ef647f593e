"""Plan, apply, verify and restore the tuning of one device (the profile's ``tune`` section).

``plan`` reads the device and checks the profile against it, changing nothing. ``apply`` does,
in this order, skipping whatever the device already has: record the pre-tuning state once
(``record``), the power mode (``nvpmodel``), ``jetson_clocks`` (``clocks``), the CPU and GPU
governors (``governors``); then ``verify`` reads everything back.

The power mode follows the device's own answer, not the plan's prediction: ``nvpmodel -m`` runs
with standard input closed, so a switch that needs a reboot is only ever a question. Asked for a
reboot without ``allow_reboot``, nothing is applied (a reboot would undo clocks and governors)
and the record made for this run is removed again: nothing was changed. A switch that nvpmodel
made without asking but whose TPC mask is not live (a "pending" mode) is a reboot too. With
``allow_reboot`` the kit answers ``YES`` (or reboots a pending device itself) and the report is
``REBOOTING`` with the boot it went down from; ``rollout`` waits for a new ``boot_id`` and the
mode, then applies the rest. Which hosts get ``allow_reboot`` and when is ``rollout``'s decision
(the rolling limit), never ``apply``'s.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from colibri_kit import jetson
from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet.remote import Remote
from colibri_kit.fleet.tune import clocks, nvpmodel, record
from colibri_kit.fleet.tune.governors import (DEVFREQ_DIR, GOVERNOR_RE, cpu_path, gpu_path,
                                              write_governor)
from colibri_kit.fleet.tune.nvpmodel import MODE_NAME_RE, Answer
from colibri_kit.fleet.tune.record import require_privilege
from colibri_kit.fleet.tune.state import TuningState, int_or_none, read_files, read_state
from colibri_kit.profiles import TuneSpec


class TuneRefused(KitError):
    """The profile asks for something the device cannot do; nothing was changed."""


@dataclass
class TunePlan:
    host: str
    spec: TuneSpec
    state: TuningState
    mode_id: int | None
    steps: list[str]
    mode: jetson.ModePlan | None = None     # which mode, why, and whether it needs a reboot

    @property
    def needs_reboot(self) -> bool:
        return self.mode is not None and self.mode.reboot


def _intent_text(intent: str | tuple[str, ...]) -> str:
    return intent if isinstance(intent, str) else "[" + ", ".join(intent) + "]"


def plan(remote: Remote, spec: TuneSpec) -> TunePlan:
    """Read the device and check the profile against it; raises TuneRefused, changing nothing.
    Needs root on the device (checked first): nvpmodel -m, jetson_clocks and sysfs writes.
    The mode is resolved from the intent (a name, names in order, max/min) against the device's
    own conf, and the reboot rule (TPC_PG_MASK of the two modes, the GPU's live mask first) says
    whether the switch needs a reboot (docs/jetson-facts.md)."""
    require_privilege(remote)
    intents = (spec.nvpmodel_mode,) if isinstance(spec.nvpmodel_mode, str) else spec.nvpmodel_mode
    for what, values, regex in (("nvpmodel_mode", intents, MODE_NAME_RE),
                                ("cpu_governor", (spec.cpu_governor,), GOVERNOR_RE),
                                ("gpu_governor", (spec.gpu_governor,), GOVERNOR_RE)):
        for value in values:
            if not isinstance(value, str) or not regex.fullmatch(value):
                raise TuneRefused(f"{remote.name}: tune.{what} {value!r} is not a valid name")
    st = read_state(remote)
    problems = []
    mode_plan = None
    if not st.modes or st.conf is None:
        problems.append("nvpmodel -p --verbose listed no power modes (is nvpmodel installed?)")
    elif st.mode_id is None:
        problems.append("nvpmodel -q did not say the current mode")
    else:
        try:
            mode_plan = jetson.plan_mode(st.conf, st.mode_id, spec.nvpmodel_mode,
                                         st.live_tpc_mask)
        except jetson.JetsonError as exc:
            problems.append(str(exc))
    for c in st.cpus_online:
        avail = st.cpu_available.get(c)
        if avail is None:
            problems.append(f"cpu{c} has no scaling_available_governors (no cpufreq?)")
        elif spec.cpu_governor not in avail:
            problems.append(f"cpu{c} has no governor {spec.cpu_governor!r} "
                            f"(available: {' '.join(avail)})")
            break
    if not st.gpu_nodes:
        problems.append(f"no GPU devfreq node under {DEVFREQ_DIR}")
    for node in st.gpu_nodes:
        if spec.gpu_governor not in st.gpu_avail.get(node, []):
            problems.append(f"GPU {node} has no governor {spec.gpu_governor!r} "
                            f"(available: {' '.join(st.gpu_avail.get(node, []))})")
    if problems:
        raise TuneRefused(f"{remote.name}: " + "; ".join(problems))
    assert mode_plan is not None
    steps = []
    target = mode_plan.target
    if mode_plan.change:
        how = "needs a reboot (TPC_PG_MASK differs)" if mode_plan.reboot else "live"
        if mode_plan.pending:
            how = (f"{st.mode_name} was accepted earlier and waits for a reboot (the GPU runs TPC "
                   f"mask {(st.live_tpc_mask or '?').strip()}); " +
                   ("so this needs a reboot" if mode_plan.reboot else
                    f"a live switch to {target.name}, whose mask is the live one, replaces it"))
        steps.append(f"power mode {st.mode_name} -> {target.name} (id {target.id}; "
                     f"{mode_plan.reason}); {how}")
    else:
        steps.append(f"power mode {target.name} already ({mode_plan.reason})")
    if spec.jetson_clocks and (not st.jetson_clocks_active or mode_plan.reboot):
        steps.append("jetson_clocks (after --store of the current clocks, once)")
    cpus = [c for c in st.cpus_online if st.cpu_governor.get(c) != spec.cpu_governor]
    if cpus or mode_plan.reboot:
        steps.append(f"cpu governor {spec.cpu_governor} on the online cpus")
    gnodes = [n for n in st.gpu_nodes if st.gpu_governors.get(n) != spec.gpu_governor]
    if gnodes or mode_plan.reboot:
        steps.append(f"gpu governor {spec.gpu_governor} on {', '.join(st.gpu_nodes)}")
    return TunePlan(remote.name, spec, st, target.id, steps, mode_plan)


class ModeSwitch(Enum):
    DONE = "done"                    # the device runs the new mode now
    NEEDS_REBOOT = "needs reboot"    # nothing applied: the switch needs a reboot, not allowed
    REBOOTING = "rebooting"          # applied; the device is going down to boot into it


@dataclass(frozen=True)
class Check:
    what: str
    wanted: str
    actual: str
    ok: bool


@dataclass
class TuneReport:
    host: str
    checks: list[Check]
    notes: list[str]
    mode: ModeSwitch | None = None   # None: the mode was already right
    boot_id: str | None = None       # REBOOTING: the boot the device went down from
    target_mode: str | None = None   # REBOOTING: the mode it boots into
    device_asked: bool = False       # NEEDS_REBOOT although the plan predicted a live switch

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def pre_tuning_record(st: TuningState) -> dict[str, Any]:
    return {
        "mode_id": st.mode_id, "mode_name": st.mode_name,
        "cpu_governor": {str(c): g for c, g in st.cpu_governor.items()},
        "gpu_node": st.gpu_node, "gpu_governor": st.gpu_governor,
        "gpu_governors": dict(st.gpu_governors),
    }


def _not_rebooted(plan: TunePlan, why: str, *, asked: bool, changed: bool) -> TuneReport:
    st, target = plan.state, plan.mode.target          # type: ignore[union-attr]
    note = (f"{why}: not applied (re-run with --allow-reboot); jetson_clocks and governors not "
            f"applied either (a reboot would undo them); "
            + ("the recorded mode changed, nothing else" if changed else "nothing was changed"))
    if asked:
        note = f"the device asked for a reboot, the plan predicted a live switch; {note}"
    return TuneReport(plan.host, [Check("power mode", target.name,
                                        f"{st.mode_name} ({st.mode_id})", False)],
                      [note], ModeSwitch.NEEDS_REBOOT, device_asked=asked)


def _mode_step(remote: Remote, plan: TunePlan, allow_reboot: bool
               ) -> tuple[TuneReport | None, TuningState, bool]:
    """The power-mode switch: (a report when the run stops here, the state to go on from,
    whether the device changed)."""
    st, mp = plan.state, plan.mode
    assert mp is not None
    target = mp.target
    boot = nvpmodel.read_boot_id(remote)      # the boot a reboot must leave behind
    answer, note = nvpmodel.switch(remote, target.id, confirm=False)
    if answer is Answer.ASKS_REBOOT:
        if not allow_reboot:
            why = (f"power mode {target.name} was accepted earlier and still waits for its "
                   f"reboot" if mp.pending and target.id == st.mode_id else
                   f"power mode {st.mode_name} -> {target.name} needs a reboot")
            return _not_rebooted(plan, why, asked=not mp.reboot, changed=False), st, False
        answer, note = nvpmodel.switch(remote, target.id, confirm=True)
    else:
        now = read_state(remote, modes=False)
        pending = now.mode_id is not None and st.conf is not None and \
            jetson.reboot_pending(st.conf, now.mode_id, now.live_tpc_mask)
        if not pending:
            return None, now, True
        # Recorded, yet the GPU still runs another mask: only a reboot makes the mode real.
        why = (f"power mode {target.name}: nvpmodel took it without asking, but the GPU still "
               f"runs TPC mask {(now.live_tpc_mask or '?').strip()} ({target.name} wants "
               f"{target.tpc_pg_mask}), so it waits for a reboot")
        changed = now.mode_id != st.mode_id
        if not allow_reboot:
            return _not_rebooted(plan, why, asked=not mp.reboot, changed=changed), st, changed
        note = nvpmodel.reboot(remote, why)
    return TuneReport(plan.host, [Check("power mode", target.name, "rebooting", False)], [note],
                      ModeSwitch.REBOOTING, boot_id=boot, target_mode=target.name), st, True


def apply(remote: Remote, plan: TunePlan, *, allow_reboot: bool = False) -> TuneReport:
    """Apply a checked plan, then verify. Changes nothing the device already has.

    When the mode switch needs a reboot (nvpmodel says so, or the switched mode's mask is not
    live): without ``allow_reboot`` nothing is applied at all and the report says what was not
    applied; with it the device reboots and the report is ``REBOOTING``: the caller
    (``rollout``) waits for it, verifies the mode and applies the rest."""
    spec, st, mp = plan.spec, plan.state, plan.mode
    had_record = record.exists(remote)
    tdir = record.root_dir(remote)
    saved_now = record.save(remote, tdir, pre_tuning_record(st))
    notes: list[str] = []
    now = st
    switch = None
    if mp is not None and mp.change:
        stop, now, changed = _mode_step(remote, plan, allow_reboot)
        if stop is not None:
            if not changed and saved_now and not had_record:
                record.remove(remote, tdir)     # this run made the record: take it back
            return stop
        switch = ModeSwitch.DONE
    if spec.jetson_clocks and not now.jetson_clocks_active:
        clocks.pin(remote, tdir)
    # CPUs brought online by the mode switch must list the governor too.
    for c in now.cpus_online:
        if spec.cpu_governor not in now.cpu_available.get(c, []):
            raise TuneRefused(f"{remote.name}: cpu{c} (online after the mode switch) has no "
                              f"governor {spec.cpu_governor!r}; governors were left unchanged")
    cpu_paths = {cpu_path(c, "scaling_governor"): now.cpu_available[c] for c in now.cpus_online
                 if now.cpu_governor.get(c) != spec.cpu_governor}
    write_governor(remote, list(cpu_paths), spec.cpu_governor, cpu_paths)
    gpu_paths = {gpu_path(n, "governor"): now.gpu_avail.get(n, []) for n in now.gpu_nodes
                 if now.gpu_governors.get(n) != spec.gpu_governor}
    write_governor(remote, list(gpu_paths), spec.gpu_governor, gpu_paths)
    report = verify(remote, spec, notes, mode_name=mp.target.name if mp else None)
    report.mode = switch
    return report


def verify(remote: Remote, spec: TuneSpec, notes: list[str] | None = None, *,
           mode_name: str | None = None) -> TuneReport:
    """Read everything back and compare with what the profile wants (``mode_name``: the
    concrete mode the plan resolved the profile's intent to)."""
    st = read_state(remote, modes=mode_name is None)
    if mode_name is None:
        try:
            mode_name = jetson.resolve_mode(st.conf, spec.nvpmodel_mode).mode.name \
                if st.conf is not None else _intent_text(spec.nvpmodel_mode)
        except jetson.JetsonError:
            mode_name = _intent_text(spec.nvpmodel_mode)
    checks = [
        Check("power mode", mode_name, f"{st.mode_name} ({st.mode_id})",
              st.mode_name == mode_name),
        Check("cpu governor", spec.cpu_governor, st.cpu_governors(),
              bool(st.cpus_online) and all(st.cpu_governor.get(c) == spec.cpu_governor
                                           for c in st.cpus_online)),
    ]
    for node in st.gpu_nodes:
        label = "gpu governor" if len(st.gpu_nodes) == 1 else f"gpu governor {node}"
        checks.append(Check(label, spec.gpu_governor, str(st.gpu_governors.get(node)),
                            st.gpu_governors.get(node) == spec.gpu_governor))
    if not st.gpu_nodes:
        checks.append(Check("gpu governor", spec.gpu_governor, "no GPU node", False))
    if spec.jetson_clocks:
        checks.append(Check("jetson_clocks", "active",
                            "active" if st.jetson_clocks_active else "inactive",
                            st.jetson_clocks_active))
        # Pinned clocks read back: every online CPU and the GPU running at their maximum.
        tops = [st.cpu_max.get(c) for c in st.cpus_online]
        curs = [st.cpu_cur.get(c) for c in st.cpus_online]
        cpu_ok = bool(tops) and None not in tops and tops == curs
        checks.append(Check("cpu kHz", f"max {max((t or 0) for t in tops) if tops else '?'}",
                            f"{min((c or 0) for c in curs) if curs else '?'}"
                            f"-{max((c or 0) for c in curs) if curs else '?'}", cpu_ok))
        for node in st.gpu_nodes:
            v = read_files(remote, [f"{DEVFREQ_DIR}/{node}/{n}" for n in ("cur_freq", "max_freq")],
                            sudo=True)
            cur, top = int_or_none(v.get(f"{DEVFREQ_DIR}/{node}/cur_freq")), \
                int_or_none(v.get(f"{DEVFREQ_DIR}/{node}/max_freq"))
            label = "gpu Hz" if len(st.gpu_nodes) == 1 else f"gpu Hz {node}"
            checks.append(Check(label, f"max {top}", str(cur), cur is not None and cur == top))
    return TuneReport(remote.name, checks, list(notes or []))


class Restored(Enum):
    RESTORED = "restored"
    NOTHING_SAVED = "nothing saved"
    INCOMPLETE = "incomplete"        # the mode switch back needs a reboot: saved state kept


@dataclass
class RestoreReport:
    host: str
    outcome: Restored
    notes: list[str]
    needs_reboot: bool = False       # INCOMPLETE only because the switch back needs a reboot
    boot_id: str | None = None       # rebooting: the boot the device went down from
    reboot_into: str | None = None   # rebooting: the saved mode it boots into

    @property
    def ok(self) -> bool:
        return self.outcome is not Restored.INCOMPLETE

    @property
    def rebooting(self) -> bool:
        return self.reboot_into is not None


def restore(remote: Remote, *, allow_reboot: bool = False) -> RestoreReport:
    """Put back the saved pre-tuning state and remove it. A switch back that needs a reboot
    needs ``allow_reboot`` (else the record is kept for a later run); with it the record is
    removed first and the device reboots (``rebooting``; ``restore_fleet`` rolls those)."""
    require_privilege(remote)
    tdir = record.root_dir(remote) if record.exists(remote) else None
    text = record.saved(remote, tdir) if tdir else None
    tdir = tdir or record.TUNE_DIR
    if text is None:
        return RestoreReport(remote.name, Restored.NOTHING_SAVED, [
            "nothing saved: the device was not tuned by the kit (or already restored)"])
    try:
        saved: dict[str, Any] = json.loads(text)
        cpu_saved = {int(k): str(v) for k, v in dict(saved.get("cpu_governor") or {}).items()}
    except (ValueError, TypeError, AttributeError):
        raise FleetError(f"{remote.name}: {tdir}/{record.STATE_NAME} is corrupt; inspect and "
                         f"remove it") from None
    st = read_state(remote, modes=False)
    by_value: dict[str, dict[str, list[str]]] = {}
    for c, gov in sorted(cpu_saved.items()):
        if st.cpu_governor.get(c) != gov and c in st.cpu_available:
            by_value.setdefault(gov, {})[cpu_path(c, "scaling_governor")] = st.cpu_available[c]
    for gov, paths in by_value.items():
        write_governor(remote, list(paths), gov, paths)
    gsaved = {str(k): str(v) for k, v in dict(saved.get("gpu_governors") or {}).items()}
    if not gsaved and saved.get("gpu_node") and saved.get("gpu_governor"):
        gsaved = {str(saved["gpu_node"]): str(saved["gpu_governor"])}
    for node, ggov in sorted(gsaved.items()):
        if node in st.gpu_nodes and st.gpu_governors.get(node) != ggov:
            gpath = gpu_path(node, "governor")
            write_governor(remote, [gpath], ggov, {gpath: st.gpu_avail.get(node, [])})
    notes: list[str] = []
    failed: list[str] = []
    restored = clocks.restore(remote, tdir)
    if restored is not None:
        status, failed = restored
        if failed:   # the script exits 0 even when a line failed: read its output [S]
            notes.append(f"jetson_clocks --restore exited {status} but failed to restore "
                         f"{', '.join(jetson.clean(p) for p in failed)}")
    mode_id = saved.get("mode_id")
    name = saved.get("mode_name")
    if isinstance(mode_id, int) and st.mode_id != mode_id:
        boot = nvpmodel.read_boot_id(remote)
        answer, _ = nvpmodel.switch(remote, mode_id, confirm=False)
        if answer is Answer.ASKS_REBOOT and not allow_reboot:
            # Keep the saved state: the next --restore (with --allow-reboot) finishes the job.
            return RestoreReport(remote.name, Restored.INCOMPLETE, notes + [
                f"power mode {mode_id}: reboot required, not applied (re-run with --allow-reboot "
                f"to switch and reboot); governors and clocks were restored, the saved state is "
                f"kept"], needs_reboot=True)
        if answer is Answer.ASKS_REBOOT:
            if not failed:
                # The device goes down with the switch: remove the record first (the reboot
                # itself returns every clock and governor to the boot defaults).
                record.remove(remote, tdir)
            answer, note = nvpmodel.switch(remote, mode_id, confirm=True)
            notes += [note, f"restored governors and clocks" +
                      ("" if failed else f", removed {tdir}") + f"; rebooting into mode {name}"]
            return RestoreReport(remote.name, Restored.INCOMPLETE if failed else Restored.RESTORED,
                                 notes, boot_id=boot, reboot_into=str(name))
    if failed:
        return RestoreReport(remote.name, Restored.INCOMPLETE, notes + [
            f"the rest was restored; the saved state is kept in {tdir} for inspection (remove "
            f"it as root when done)"])
    record.remove(remote, tdir)
    notes.append(f"restored mode {name}, governors and clocks; removed {tdir}")
    return RestoreReport(remote.name, Restored.RESTORED, notes)
