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

With a profile's ``realtime`` section (``realtime=``), the plan also moves IRQs off the real-time
CPUs (``irq``, live, after the governors) and isolates them on the kernel command line
(``boot``): that is a reboot like a mode switch's, with the same consent and rolling; the boot
file is written first, so a mode switch that reboots anyway takes both in one reboot. Its
``rt_runtime_us`` sets the kernel's RT throttling budget (``rt_throttle``, live, after the IRQs;
the previous value is recorded and ``restore`` writes it back).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from enum import Enum
from typing import Any

from colibri_kit import jetson
from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet.remote import Remote
from colibri_kit.fleet.tune import boot, clocks, irq, nvpmodel, record, rt_throttle
from colibri_kit.fleet.tune.governors import (DEVFREQ_DIR, GOVERNOR_RE, cpu_path, gpu_path,
                                              write_governor)
from colibri_kit.fleet.tune.nvpmodel import MODE_NAME_RE, Answer
from colibri_kit.fleet.tune.record import require_privilege
from colibri_kit.fleet.tune.state import TuningState, int_or_none, read_files, read_state
from colibri_kit.profiles import RealtimeSpec, TuneSpec, cpu_list_text


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
    realtime: RealtimeSpec | None = None    # the profile's realtime section
    irq_plan: irq.IrqPlan | None = None     # realtime.irq_affinity: the IRQs to move
    irq_state: irq.IrqState | None = None
    boot_plan: boot.BootPlan | None = None  # realtime.isolate: the boot file edit
    boot_state: boot.BootState | None = None
    throttle_plan: rt_throttle.ThrottlePlan | None = None   # realtime.rt_runtime_us

    @property
    def mode_reboot(self) -> bool:
        return self.mode is not None and self.mode.reboot

    @property
    def boot_reboot(self) -> bool:
        return self.boot_plan is not None and self.boot_plan.needs_reboot

    @property
    def needs_reboot(self) -> bool:
        return self.mode_reboot or self.boot_reboot


def _intent_text(intent: str | tuple[str, ...]) -> str:
    return intent if isinstance(intent, str) else "[" + ", ".join(intent) + "]"


def plan(remote: Remote, spec: TuneSpec, realtime: RealtimeSpec | None = None) -> TunePlan:
    """Read the device and check the profile against it; raises TuneRefused, changing nothing.
    Needs root on the device (checked first): nvpmodel -m, jetson_clocks and sysfs writes.
    The mode is resolved from the intent (a name, names in order, max/min) against the device's
    own conf, and the reboot rule (TPC_PG_MASK of the two modes, the GPU's live mask first) says
    whether the switch needs a reboot (docs/jetson-facts.md). ``realtime`` adds the IRQ and
    isolation steps of the profile's realtime section."""
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
    rt_parts = _plan_realtime(remote, realtime, st, problems,
                              _online_in(mode_plan, st)) if realtime else (None,) * 4
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
    irq_plan, irq_state, boot_plan, boot_state = rt_parts
    steps += _realtime_steps(realtime, irq_plan, boot_plan, boot_state)
    throttle = _plan_throttle(remote, realtime)
    if throttle is not None:
        steps.append(_throttle_step(throttle))
    return TunePlan(remote.name, spec, st, target.id, steps, mode_plan, realtime, irq_plan,
                    irq_state, boot_plan, boot_state, throttle)


def _plan_throttle(remote: Remote, rt: RealtimeSpec | None) -> rt_throttle.ThrottlePlan | None:
    """realtime.rt_runtime_us against the device's RT bandwidth (raises TuneRefused when the
    value cannot be written there, e.g. above its sched_rt_period_us)."""
    if rt is None or rt.rt_runtime_us is None:
        return None
    try:
        return rt_throttle.plan_runtime(rt_throttle.read_bandwidth(remote), rt.rt_runtime_us)
    except FleetError as exc:
        raise TuneRefused(f"{remote.name}: " + str(exc).removeprefix(f"{remote.name}: ")) \
            from None


def _throttle_step(tp: rt_throttle.ThrottlePlan) -> str:
    want = rt_throttle.runtime_text(tp.want, tp.before.period_us)
    if not tp.change:
        return f"RT throttling {want} already"
    return (f"RT throttling: {rt_throttle.RUNTIME_PATH} {tp.before.text()} -> {want} (live; a "
            f"reboot restores the kernel default)")


def _online_in(mode_plan: jetson.ModePlan | None, st: TuningState) -> tuple[list[int], str]:
    """The CPUs online once the plan's mode runs (its conf's CPU_ONLINE CORE_n lines; a mode
    that sets none keeps what is online now), and the mode's name for messages."""
    if mode_plan is None or not mode_plan.change:
        return st.cpus_online, str(st.mode_name)
    target = mode_plan.target
    flags = {int(a.removeprefix("CORE_")): v == "1" for p, a, v in target.params
             if p == "CPU_ONLINE" and a.startswith("CORE_") and a[5:].isdigit()}
    if not flags:
        return st.cpus_online, target.name
    return [c for c in st.cpus_present if flags.get(c, c in st.cpus_online)], target.name


def _plan_realtime(remote: Remote, rt: RealtimeSpec, st: TuningState, problems: list[str],
                   online_in: tuple[list[int], str]
                   ) -> tuple[irq.IrqPlan | None, irq.IrqState | None, boot.BootPlan | None,
                              boot.BootState | None]:
    """The realtime section against the device: its CPUs online (in the mode the plan
    switches to), one left for housekeeping, the IRQs to move, the boot file edit. Problems are
    appended (nothing changes)."""
    online, mode = online_in
    offline = [c for c in rt.cpus if c not in online]
    if offline:
        problems.append(f"realtime.cpus {rt.cpu_list}: CPU {cpu_list_text(offline)} not online "
                        f"in power mode {mode} (online there: {cpu_list_text(online)})")
        return None, None, None, None
    if not [c for c in online if c not in rt.cpus]:
        problems.append(f"realtime.cpus {rt.cpu_list} are every online CPU: IRQs and the kernel's "
                        f"housekeeping need at least one other")
        return None, None, None, None
    irq_plan = irq_state = boot_plan = boot_state = None
    try:
        if rt.irq_affinity:
            irq_state = irq.read_irqs(remote)
            irq_plan = irq.plan_moves(irq_state, rt.cpus, online,
                                      _mask_bits(irq_state.default_mask, st.cpus_present))
        if rt.isolate:
            if 0 in rt.cpus:
                problems.append("realtime.isolate: CPU 0 (the boot CPU, which keeps timekeeping) "
                                "cannot be isolated")
            else:
                boot_state = boot.read_boot(remote)
                boot_plan = boot.plan_isolation(boot_state, rt.cpus)
    except FleetError as exc:
        problems.append(str(exc).removeprefix(f"{remote.name}: "))
    return irq_plan, irq_state, boot_plan, boot_state


def _mask_bits(mask: str | None, present: list[int]) -> int:
    """How many CPUs the device's masks print: the width of one it printed (every mask of a
    kernel has the same width), else the CPUs present."""
    if mask and irq.MASK_RE.fullmatch(mask):
        chunks = mask.split(",")
        return 4 * len(chunks[0]) + 32 * (len(chunks) - 1)
    return max(present, default=0) + 1


def _realtime_steps(rt: RealtimeSpec | None, ip: irq.IrqPlan | None, bp: boot.BootPlan | None,
                    bs: boot.BootState | None) -> list[str]:
    steps = []
    if ip is not None:
        alone = f"; {len(ip.per_cpu)} per-CPU IRQs left alone" if ip.per_cpu else ""
        if ip.moves or ip.default_after is not None:
            steps.append(f"IRQ affinity: {len(ip.moves)} IRQs off CPUs {cpu_list_text(ip.rt_cpus)}"
                         f" onto {cpu_list_text(ip.housekeeping)}"
                         + (f", default_smp_affinity {ip.default_before} -> {ip.default_after}"
                            if ip.default_after is not None else "") + alone)
        else:
            steps.append(f"IRQ affinity: none on CPUs {cpu_list_text(ip.rt_cpus)} already{alone}")
    if bp is not None and rt is not None and bs is not None and bs.conf is not None:
        label = bs.conf.booted.label if bs.conf.booted else "?"
        tokens = " ".join(f"{k}={v}" for k, v in bp.wanted.items())
        if bp.change:
            steps.append(f"isolate CPUs {rt.cpu_list}: {tokens} on the APPEND line of label "
                         f"{label} in {boot.EXTLINUX}; needs a reboot")
        elif bp.pending:
            steps.append(f"isolate CPUs {rt.cpu_list}: {boot.EXTLINUX} has {tokens} already, the "
                         f"running kernel does not (written earlier, waits for a reboot); needs a "
                         f"reboot")
        else:
            steps.append(f"CPUs {rt.cpu_list} isolated already ({tokens})")
        steps += bp.notes
    return steps


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


def realtime_record(plan: TunePlan) -> dict[str, Any]:
    """The sections the realtime steps add to the pre-tuning record."""
    out: dict[str, Any] = {}
    if plan.irq_state is not None:
        out["irq"] = irq.irq_record(plan.irq_state)
    if plan.boot_plan is not None and plan.boot_state is not None:
        out["boot"] = boot.boot_record(plan.boot_state, plan.boot_plan.wanted)
    if plan.throttle_plan is not None:
        out["rt_throttle"] = rt_throttle.throttle_record(plan.throttle_plan.before)
    return out


def _isolation_refused(plan: TunePlan) -> TuneReport:
    """isolate needs a reboot and none is allowed: nothing is applied (a reboot would undo the
    rest, and the isolation is not real without one)."""
    rt, bs = plan.realtime, plan.boot_state
    assert rt is not None and bs is not None
    checks = [Check("isolated cpus", rt.cpu_list, cpu_list_text(bs.isolated) or "none", False)]
    why = (f"isolating CPUs {rt.cpu_list} needs a reboot" if not plan.boot_plan.pending  # type: ignore[union-attr]
           else f"the isolation of CPUs {rt.cpu_list} was written earlier and waits for a reboot")
    if plan.mode_reboot:
        assert plan.mode is not None
        checks.insert(0, Check("power mode", plan.mode.target.name,
                               f"{plan.state.mode_name} ({plan.state.mode_id})", False))
        why += f", and so does power mode {plan.state.mode_name} -> {plan.mode.target.name}"
    return TuneReport(plan.host, checks, [
        f"{why}: not applied (re-run with --allow-reboot); IRQs, jetson_clocks and governors not "
        f"applied either (a reboot would undo them); nothing was changed"],
        ModeSwitch.NEEDS_REBOOT)


def _reboot_for_isolation(remote: Remote, plan: TunePlan) -> TuneReport:
    """allow_reboot: the boot file first, then the mode (whose own reboot, if it needs one,
    takes the isolation along), else a reboot of the kit's own."""
    rt, bp, bs, mp = plan.realtime, plan.boot_plan, plan.boot_state, plan.mode
    assert rt is not None and bp is not None and bs is not None
    notes = []
    if bp.change:
        assert bp.new_text is not None and bs.conf_text is not None
        boot.write_conf(remote, bp.new_text, expect=bs.conf_text)
        notes.append(f"wrote {' '.join(f'{k}={v}' for k, v in bp.wanted.items())} to "
                     f"{boot.EXTLINUX}")
    target = mp.target.name if mp is not None else str(plan.state.mode_name)
    if mp is not None and mp.change:
        stop, _now, _changed = _mode_step(remote, plan, True)
        if stop is not None:                       # the mode's reboot: one for both
            stop.notes += notes
            return stop
    boot_id = nvpmodel.read_boot_id(remote)
    notes.append(nvpmodel.reboot(remote, f"isolating CPUs {rt.cpu_list}"))
    return TuneReport(plan.host, [Check("isolated cpus", rt.cpu_list, "rebooting", False)], notes,
                      ModeSwitch.REBOOTING, boot_id=boot_id, target_mode=target)


def apply(remote: Remote, plan: TunePlan, *, allow_reboot: bool = False) -> TuneReport:
    """Apply a checked plan, then verify. Changes nothing the device already has.

    When the mode switch needs a reboot (nvpmodel says so, or the switched mode's mask is not
    live), or the isolation does: without ``allow_reboot`` nothing is applied at all and the
    report says what was not applied; with it the device reboots and the report is
    ``REBOOTING``: the caller (``rollout``) waits for it, verifies the mode and applies the
    rest (IRQs last: a reboot resets them)."""
    spec, st, mp = plan.spec, plan.state, plan.mode
    had_record = record.exists(remote)
    tdir = record.root_dir(remote)
    extra = realtime_record(plan)
    saved_now = record.save(remote, tdir, {**pre_tuning_record(st), **extra})
    if not saved_now:
        record.extend(remote, tdir, extra)
    notes: list[str] = []
    now = st
    switch = None
    if plan.boot_reboot:
        if not allow_reboot:
            if saved_now and not had_record:
                record.remove(remote, tdir)         # this run made the record: take it back
            return _isolation_refused(plan)
        return _reboot_for_isolation(remote, plan)
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
    refused = _apply_irqs(remote, plan, now, switch is not None)
    if plan.throttle_plan is not None:
        rt_throttle.apply(remote, plan.throttle_plan)
    report = verify(remote, spec, notes, mode_name=mp.target.name if mp else None,
                    realtime=plan.realtime, irq_refused=refused)
    report.mode = switch
    return report


def _apply_irqs(remote: Remote, plan: TunePlan, now: TuningState, switched: bool
                ) -> dict[int, str]:
    """Move the IRQs (planned again after a mode switch: it may have changed the online CPUs)."""
    rt, ip = plan.realtime, plan.irq_plan
    if rt is None or ip is None:
        return {}
    if switched:
        offline = [c for c in rt.cpus if c not in now.cpus_online]
        if offline:
            raise TuneRefused(f"{remote.name}: realtime.cpus {rt.cpu_list}: CPU "
                              f"{cpu_list_text(offline)} went offline with the mode switch; IRQs "
                              f"were left unchanged")
        ist = irq.read_irqs(remote)
        ip = irq.plan_moves(ist, rt.cpus, now.cpus_online,
                            _mask_bits(ist.default_mask, now.cpus_present))
    return irq.apply(remote, ip, now.cpus_online) if ip.change else {}


def verify(remote: Remote, spec: TuneSpec, notes: list[str] | None = None, *,
           mode_name: str | None = None, realtime: RealtimeSpec | None = None,
           irq_refused: dict[int, str] | None = None) -> TuneReport:
    """Read everything back and compare with what the profile wants (``mode_name``: the
    concrete mode the plan resolved the profile's intent to; ``realtime``: its IRQ and isolation
    steps; ``irq_refused``: IRQs the kernel would not move this run, reported, not failed)."""
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
    notes = list(notes or [])
    if realtime is not None:
        rt_checks, rt_notes = realtime_checks(remote, realtime, irq_refused or {})
        checks += rt_checks
        notes += rt_notes
    return TuneReport(remote.name, checks, notes)


def realtime_checks(remote: Remote, rt: RealtimeSpec, refused: dict[int, str]
                    ) -> tuple[list[Check], list[str]]:
    """The realtime section read back: no movable IRQ (nor the default affinity) on its CPUs,
    and, with isolate, the running kernel's command line and isolated CPUs."""
    checks: list[Check] = []
    notes: list[str] = []
    cpus = set(rt.cpus)
    if rt.irq_affinity:
        ist = irq.read_irqs(remote)
        on_rt = [i for i in ist.irqs if not i.per_cpu and i.number not in refused
                 and cpus & (set(ist.affinity.get(i.number, [])) |
                             set(ist.effective.get(i.number, [])))]
        checks.append(Check("irq affinity", f"off {rt.cpu_list}",
                            "none on them" if not on_rt else f"{len(on_rt)} on them: " +
                            ", ".join(f"{i.number} {i.name}" for i in on_rt[:4]), not on_rt))
        checks.append(Check("irq default", f"off {rt.cpu_list}", str(ist.default_mask),
                            ist.default_mask is not None and not cpus & set(ist.default_cpus)))
        per_cpu = sorted({i.name for i in ist.irqs if i.per_cpu})
        if per_cpu:
            notes.append(f"per-CPU IRQs stay on every CPU (the kernel keeps them there): "
                         f"{', '.join(per_cpu)}")
        if refused:
            notes.append("the kernel refused to move IRQ " + ", ".join(
                f"{n} ({msg})" for n, msg in sorted(refused.items()))
                + " (kernel-managed, or its controller cannot route it)")
    if rt.rt_runtime_us is not None:
        bw = rt_throttle.read_bandwidth(remote)
        checks.append(Check("rt throttling",
                            rt_throttle.runtime_text(rt.rt_runtime_us, bw.period_us), bw.text(),
                            bw.runtime_us == rt.rt_runtime_us))
    if rt.isolate:
        bst = boot.read_boot(remote)
        wanted = boot.wanted_params(rt.cpus, bst.nohz_full is not None)
        missing = [f"{k}={v}" for k, v in wanted.items() if bst.running.get(k, [None])[-1] != v]
        checks.append(Check("kernel cmdline", " ".join(f"{k}={v}" for k, v in wanted.items()),
                            "has them" if not missing else "lacks " + " ".join(missing),
                            not missing))
        checks.append(Check("isolated cpus", rt.cpu_list, cpu_list_text(bst.isolated) or "none",
                            bst.isolated == sorted(cpus)))
        if bst.nohz_full is not None:
            checks.append(Check("nohz_full cpus", rt.cpu_list,
                                cpu_list_text(bst.nohz_full) or "none",
                                bst.nohz_full == sorted(cpus)))
    return checks, notes


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
    boot_wrote: dict[str, str] | None = None   # rebooting: the isolation taken out of the file

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
    if isinstance(saved.get("irq"), dict):
        notes += irq.restore(remote, saved["irq"], st.cpus_online)
    if "rt_throttle" in saved:
        notes += rt_throttle.restore(remote, saved["rt_throttle"])
    boot_text, boot_read, boot_live, boot_notes = _boot_back(remote, saved.get("boot"))
    notes += boot_notes
    boot_reboot = boot_text is not None or boot_live
    mode_id = saved.get("mode_id")
    name = saved.get("mode_name")
    mode_back = isinstance(mode_id, int) and st.mode_id != mode_id
    mode_reboot = False
    if mode_back:
        answer, _ = nvpmodel.switch(remote, mode_id, confirm=False)   # a live switch happens
        mode_reboot = answer is Answer.ASKS_REBOOT
    if (mode_reboot or boot_reboot) and not allow_reboot:
        # Keep the saved state: the next --restore (with --allow-reboot) finishes the job.
        why = [f"power mode {mode_id}: reboot required"] if mode_reboot else []
        if boot_reboot:
            why.append(f"the CPU isolation in {boot.EXTLINUX}: reboot required")
        return RestoreReport(remote.name, Restored.INCOMPLETE, notes + [
            f"{'; '.join(why)}, not applied (re-run with --allow-reboot to switch and reboot); "
            f"governors, clocks and IRQs were restored, the saved state is kept"],
            needs_reboot=True)
    if mode_reboot or boot_reboot:
        boot_id = nvpmodel.read_boot_id(remote)
        if boot_text is not None:
            boot.write_conf(remote, boot_text, expect=boot_read)
            notes.append(f"took the CPU isolation out of {boot.EXTLINUX}")
        if not failed:
            # The device goes down now: remove the record first (the reboot itself returns
            # every clock, governor and IRQ to the boot defaults).
            record.remove(remote, tdir)
        into = str(name) if mode_back else str(st.mode_name)
        if mode_reboot:
            _, note = nvpmodel.switch(remote, mode_id, confirm=True)   # type: ignore[arg-type]
        else:
            note = nvpmodel.reboot(remote, "restoring the kernel command line")
        notes += [note, f"restored governors and clocks" + ("" if failed else f", removed {tdir}")
                  + f"; rebooting into mode {into}"]
        boot_saved = saved.get("boot") if isinstance(saved.get("boot"), dict) else None
        return RestoreReport(remote.name, Restored.INCOMPLETE if failed else Restored.RESTORED,
                             notes, boot_id=boot_id, reboot_into=into,
                             boot_wrote=dict(boot_saved.get("wrote") or {}) if boot_saved else None)
    if failed:
        return RestoreReport(remote.name, Restored.INCOMPLETE, notes + [
            f"the rest was restored; the saved state is kept in {tdir} for inspection (remove "
            f"it as root when done)"])
    record.remove(remote, tdir)
    notes.append(f"restored mode {name}, governors and clocks; removed {tdir}")
    return RestoreReport(remote.name, Restored.RESTORED, notes)


def _boot_back(remote: Remote, saved: Any) -> tuple[str | None, str, bool, list[str]]:
    """For the record's ``boot`` section: (the boot file with the kit's tokens taken back, or
    None; the file as read; whether the running kernel still runs them; notes)."""
    if not isinstance(saved, dict):
        return None, "", False, []
    bs = boot.read_boot(remote)
    if bs.conf_text is None:
        return None, "", False, [f"{boot.EXTLINUX} is gone: the CPU isolation cannot be taken "
                                 f"out"]
    text, notes = boot.restored_text(bs.conf_text, saved)
    wrote = dict(saved.get("wrote") or {})
    running = bs.running
    still = any(running.get(k, [None])[-1] == v for k, v in wrote.items())
    return text, bs.conf_text, still, notes


def boot_isolation_gone(remote: Remote, wrote: dict[str, str]) -> list[str]:
    """After the restore's reboot: the tokens tune wrote that the kernel still runs with."""
    running = boot.read_boot(remote).running
    return [f"{k}={v}" for k, v in wrote.items() if running.get(k, [None])[-1] == v]
