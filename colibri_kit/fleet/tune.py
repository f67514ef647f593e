"""Device tuning: power mode, jetson_clocks, CPU and GPU governors; verified and reversible.

Per host, ``tune`` does, in this order (each step skipped when the device already has it):

1. power mode by *name*: the id is looked up on the device (``nvpmodel -p --verbose``), never
   hard-coded; a switch that needs a reboot is reported and left alone unless ``allow_reboot``;
2. the pre-tuning state is saved once in ``TUNE_DIR`` (``/var/lib/colibri-tune``, created by
   root, mode 0700, checked to be root's own before every use): ``state.json`` (mode, governors,
   taken before anything changes) and ``l4t_dfs.conf`` (``jetson_clocks --store``, never in
   ``$HOME``, never over an existing saved state);
3. ``jetson_clocks`` if the profile asks for it;
4. the CPU governor on every online CPU and the GPU devfreq governor.

Privileges: with a login that is not root, nothing root does may depend on a file the login can
write (it could swap the file between two steps). So root keeps its state only in ``TUNE_DIR``,
never under the device root (which the login owns), and the values root writes come from the
kit through the command's standard input, never from a file.

Everything the kit writes to sysfs goes through ``write_governor``: the path must match one of the
fixed patterns below (paths are discovered on the device, then checked), the value must be a
governor name ``[a-z0-9_]+`` that the device lists as available, and root writes it with ``tee``
(argv only, the value on standard input): no value ever reaches a shell. Every command has a
deadline, so no prompt can hang a run.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Any

from colibri_kit import jetson
from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet.fleet import Fleet, Outcome, Results
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.remote import Remote, Result
from colibri_kit.profiles import TuneSpec

CPU_DIR = "/sys/devices/system/cpu"
DEVFREQ_DIR = "/sys/class/devfreq"
EMC_DIR = "/sys/kernel/debug/bpmp/debug/clk/emc"
FAN_PWM = "/sys/devices/platform/pwm-fan/hwmon/hwmon0/pwm1"

GOVERNOR_RE = re.compile(r"^[a-z0-9_]{1,32}\Z")
MODE_NAME_RE = re.compile(r"^[A-Za-z0-9_]{1,48}\Z")
CPU_LIST_RE = re.compile(r"^[0-9]{1,4}(?:-[0-9]{1,4})?(?:,[0-9]{1,4}(?:-[0-9]{1,4})?)*\Z")
GPU_NODE_RE = re.compile(r"^(?:[0-9a-f]{1,16}\.(?:gpu|gv11b|ga10b|gp10b|gb10b)|gpu-(?:gpc|nvd)-[0-9]{1,2})\Z")
DEVFREQ_NODE_RE = re.compile(r"^[A-Za-z0-9@._-]{1,64}\Z")   # any node name we may read under
CPU_GOV_PATH_RE = re.compile(r"^/sys/devices/system/cpu/cpu[0-9]{1,4}/cpufreq/scaling_governor\Z")
GPU_GOV_PATH_RE = re.compile(
    r"^/sys/class/devfreq/[A-Za-z0-9@._-]{1,64}/governor\Z")   # and a GPU node found on the device
POWER_MODEL_RE = re.compile(r"POWER_MODEL:\s*ID=([0-9]+)\s+NAME=(\S+)")
REBOOT_RE = re.compile(r"reboot required|do you want to reboot", re.IGNORECASE)

LIVE_TPC_MASK = "/sys/devices/platform/gpu.0/tpc_pg_mask"   # what the GPU runs (set at boot)
TUNE_DIR = "/var/lib/colibri-tune"   # root's own: the saved pre-tuning state
CMD_TIMEOUT = 30.0     # seconds for any one tool invocation
MODE_TIMEOUT = 90.0    # nvpmodel -m can take a while (clocks, CPU hotplug)


class TuneRefused(KitError):
    """The profile asks for something the device cannot do; nothing was changed."""


# --------------------------------------------------------------------------- device state


@dataclass
class TuningState:
    """A device's power mode, clocks and governors: what ``--show`` prints and verify compares;
    read without changing anything."""

    mode_id: int | None = None
    mode_name: str | None = None
    modes: dict[str, int] = field(default_factory=dict)      # name -> id, from the device
    cpus_present: list[int] = field(default_factory=list)
    cpus_online: list[int] = field(default_factory=list)
    cpu_governor: dict[int, str] = field(default_factory=dict)
    cpu_available: dict[int, list[str]] = field(default_factory=dict)
    cpu_cur: dict[int, int] = field(default_factory=dict)
    cpu_min: dict[int, int] = field(default_factory=dict)
    cpu_max: dict[int, int] = field(default_factory=dict)
    gpu_node: str | None = None          # the first GPU domain (Thor has two: gpu_nodes)
    gpu_nodes: list[str] = field(default_factory=list)
    gpu_governors: dict[str, str] = field(default_factory=dict)     # node -> governor
    gpu_avail: dict[str, list[str]] = field(default_factory=dict)   # node -> available governors
    gpu_pinned: dict[str, bool] = field(default_factory=dict)       # node -> min == max == cur
    live_tpc_mask: str | None = None
    conf: Any = None                     # jetson.NvpConf from nvpmodel -p --verbose
    gpu_governor: str | None = None
    gpu_available: list[str] = field(default_factory=list)
    gpu_cur: int | None = None
    gpu_min: int | None = None
    gpu_max: int | None = None
    emc_cur: int | None = None
    emc_max: int | None = None
    emc_locked: bool | None = None
    fan_pwm: int | None = None

    @property
    def gpu_dir(self) -> str | None:
        return f"{DEVFREQ_DIR}/{self.gpu_node}" if self.gpu_node else None

    @property
    def jetson_clocks_active(self) -> bool:
        """Clocks pinned at their maximum: min == max for every online CPU and the GPU, and the
        memory clock locked (jetson_clocks' signature)."""
        if not self.cpus_online:
            return False
        for c in self.cpus_online:
            if c not in self.cpu_min or self.cpu_min.get(c) != self.cpu_max.get(c):
                return False
        if self.gpu_node and (self.gpu_min is None or self.gpu_min != self.gpu_max):
            return False
        if self.gpu_pinned and not all(self.gpu_pinned.values()):
            return False
        if self.emc_locked is False:
            return False
        return True

    def cpu_governors(self) -> str:
        """The online CPUs' governors, collapsed ("performance" or "cpu0-3=a cpu4=b")."""
        values = {self.cpu_governor.get(c, "?") for c in self.cpus_online}
        if len(values) == 1:
            return values.pop()
        return " ".join(f"cpu{c}={self.cpu_governor.get(c, '?')}" for c in self.cpus_online)


def parse_cpu_list(text: str) -> list[int]:
    text = text.strip()
    if not CPU_LIST_RE.match(text):
        raise FleetError(f"unexpected CPU list {text!r}")
    out: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def parse_power_models(text: str) -> dict[str, int]:
    """``nvpmodel -p --verbose`` output -> {name: id}."""
    modes: dict[str, int] = {}
    for m in POWER_MODEL_RE.finditer(text):
        modes[m.group(2)] = int(m.group(1))
    return modes


def parse_query(text: str) -> tuple[str | None, int | None]:
    """``nvpmodel -q``: "NV Power Mode: NAME" then the id on the next line."""
    name = None
    lines = [l.strip() for l in text.splitlines() if l.strip()]
    for i, line in enumerate(lines):
        m = re.match(r"^NV Power Mode:\s*(\S+)$", line)
        if m:
            name = m.group(1)
            if i + 1 < len(lines) and lines[i + 1].isdigit():
                return name, int(lines[i + 1])
    return name, None


def _read_files(remote: Remote, paths: list[str], *, sudo: bool) -> dict[str, str]:
    """One round trip for many small files: ``grep -sH '' -- paths`` prints "path:line"."""
    if not paths:
        return {}
    res = remote.run(["grep", "-asH", "", "--", *paths], sudo=sudo, timeout=CMD_TIMEOUT,
                     check=False)
    if res.exit_code not in (0, 1, 2):
        raise FleetError(f"{remote.name}: cannot read device state: {res.stderr.strip()}")
    values: dict[str, str] = {}
    wanted = set(paths)
    for line in res.stdout.splitlines():
        path, sep, value = line.partition(":")
        if sep and path in wanted and path not in values:
            values[path] = value.replace("\0", "").strip()
    return values


def _int(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def _cpu(c: int, name: str) -> str:
    return f"{CPU_DIR}/cpu{c}/cpufreq/{name}"


def read_state(remote: Remote, *, sudo: bool = True, modes: bool = True) -> TuningState:
    """The device's tuning state (paths discovered on the device, every value parsed strictly)."""
    st = TuningState()
    base = _read_files(remote, [f"{CPU_DIR}/present", f"{CPU_DIR}/online"], sudo=sudo)
    if f"{CPU_DIR}/online" not in base:
        raise FleetError(f"{remote.name}: {CPU_DIR}/online is missing: not a Linux device?")
    st.cpus_online = parse_cpu_list(base[f"{CPU_DIR}/online"])
    st.cpus_present = parse_cpu_list(base.get(f"{CPU_DIR}/present", base[f"{CPU_DIR}/online"]))
    ls = remote.run(["ls", "-1", "--", DEVFREQ_DIR], sudo=sudo, timeout=CMD_TIMEOUT, check=False)
    every = [n for n in ls.stdout.splitlines() if DEVFREQ_NODE_RE.match(n)] \
        if ls.exit_code == 0 else []
    # GPU domains by their device's of_node name, as jtop finds them (Thor: gpu-gpc-0, gpu-nvd-0).
    of = _read_files(remote, [f"{DEVFREQ_DIR}/{n}/device/of_node/name" for n in every], sudo=sudo)
    st.gpu_nodes = jetson.gpu_devfreq_nodes(
        {n: of.get(f"{DEVFREQ_DIR}/{n}/device/of_node/name") for n in every})
    st.gpu_node = st.gpu_nodes[0] if st.gpu_nodes else None

    paths = []
    for c in st.cpus_present:
        paths += [_cpu(c, n) for n in ("scaling_governor", "scaling_available_governors",
                                       "scaling_cur_freq", "scaling_min_freq", "scaling_max_freq")]
    gdir = st.gpu_dir
    for node in st.gpu_nodes:
        paths += [f"{DEVFREQ_DIR}/{node}/{n}" for n in ("governor", "available_governors",
                                                        "cur_freq", "min_freq", "max_freq")]
    paths += [f"{EMC_DIR}/rate", f"{EMC_DIR}/max_rate", f"{EMC_DIR}/mrq_rate_locked", FAN_PWM,
              LIVE_TPC_MASK]
    v = _read_files(remote, paths, sudo=sudo)
    for c in st.cpus_present:
        gov = v.get(_cpu(c, "scaling_governor"))
        if gov is not None:
            st.cpu_governor[c] = gov
        avail = v.get(_cpu(c, "scaling_available_governors"))
        if avail is not None:
            st.cpu_available[c] = avail.split()
        for name, dest in (("scaling_cur_freq", st.cpu_cur), ("scaling_min_freq", st.cpu_min),
                           ("scaling_max_freq", st.cpu_max)):
            val = _int(v.get(_cpu(c, name)))
            if val is not None:
                dest[c] = val
    if gdir:
        st.gpu_governor = v.get(f"{gdir}/governor")
        st.gpu_available = (v.get(f"{gdir}/available_governors") or "").split()
        st.gpu_cur = _int(v.get(f"{gdir}/cur_freq"))
        st.gpu_min = _int(v.get(f"{gdir}/min_freq"))
        st.gpu_max = _int(v.get(f"{gdir}/max_freq"))
    for node in st.gpu_nodes:
        d = f"{DEVFREQ_DIR}/{node}"
        if v.get(f"{d}/governor") is not None:
            st.gpu_governors[node] = v[f"{d}/governor"]
        st.gpu_avail[node] = (v.get(f"{d}/available_governors") or "").split()
        lo, hi, cur = (_int(v.get(f"{d}/{n}")) for n in ("min_freq", "max_freq", "cur_freq"))
        st.gpu_pinned[node] = lo is not None and lo == hi
    st.live_tpc_mask = v.get(LIVE_TPC_MASK)
    st.emc_cur = _int(v.get(f"{EMC_DIR}/rate"))
    st.emc_max = _int(v.get(f"{EMC_DIR}/max_rate"))
    locked = v.get(f"{EMC_DIR}/mrq_rate_locked")
    st.emc_locked = None if locked is None else locked.strip() == "1"
    st.fan_pwm = _int(v.get(FAN_PWM))

    q = _nvpmodel(remote, ["-q"], sudo=sudo)
    if q.exit_code == 0:
        st.mode_name, st.mode_id = parse_query(q.stdout)
    if modes and q.exit_code == 0:
        p = _nvpmodel(remote, ["-p", "--verbose"], sudo=sudo)
        if p.exit_code == 0:
            st.modes = parse_power_models(p.stdout)
            try:
                st.conf = jetson.parse_nvpmodel_verbose(p.stdout)
            except jetson.JetsonError:
                st.conf = None
    return st


def _nvpmodel(remote: Remote, args: list[str], *, sudo: bool,
              timeout: float = CMD_TIMEOUT) -> Result:
    """nvpmodel lives in /usr/sbin, which a plain login's PATH may lack (sudo's secure_path has
    it): fall back to the full path when the name is not found."""
    res = remote.run(["nvpmodel", *args], sudo=sudo, timeout=timeout, check=False)
    if res.exit_code == 127:
        res = remote.run(["/usr/sbin/nvpmodel", *args], sudo=sudo, timeout=timeout, check=False)
    return res


# --------------------------------------------------------------------------- privileges, files


def require_privilege(remote: Remote) -> None:
    """Fail fast, before anything changes, when the kit cannot act as root on the device."""
    try:
        remote.run(["true"], sudo=True, timeout=CMD_TIMEOUT)
    except FleetError as exc:
        raise FleetError(f"{exc} (tuning needs root on the device: nvpmodel -m, jetson_clocks "
                         f"and sysfs writes)") from None


def read_state_any(remote: Remote) -> TuningState:
    """``read_state`` as root when the kit can, else as the login user (``--show`` without sudo:
    the EMC clock, in debugfs, then reads as unknown)."""
    try:
        return read_state(remote, sudo=True)
    except FleetError as first:
        try:
            return read_state(remote, sudo=False)
        except FleetError:
            raise first from None


def root_dir(remote: Remote) -> str:
    """Create ``TUNE_DIR`` as root and check it is root's own (owner root, mode 0700, a real
    directory): refuse to keep state anywhere another user could have prepared."""
    remote.run(["mkdir", "-p", "-m", "0700", "--", TUNE_DIR], sudo=True, timeout=CMD_TIMEOUT)
    uid = remote.run(["id", "-u"], sudo=True, timeout=CMD_TIMEOUT).stdout.strip()
    got = remote.run(["stat", "-c", "%u %a %F", "--", TUNE_DIR], sudo=True,
                     timeout=CMD_TIMEOUT).stdout.strip()
    if got != f"{uid} 700 directory":
        raise FleetError(f"{remote.name}: {TUNE_DIR} is not a root-only directory (owner, mode, "
                         f"type: {got!r}); someone else made it: inspect and remove it")
    return TUNE_DIR


def write_governor(remote: Remote, paths: list[str], value: str,
                   allowed: dict[str, list[str]]) -> None:
    """The one way the kit writes sysfs. Every path must match a fixed governor-path pattern
    (they were discovered on the device), the value must be a plain name ``[a-z0-9_]+`` that the
    device lists for that path (``allowed``: path -> available governors). Root writes it with
    ``tee PATH...``, the value on standard input: argv only, no shell, no file in between, one
    round trip whatever the CPU count."""
    if not paths:
        return
    if not GOVERNOR_RE.match(value):
        raise FleetError(f"{remote.name}: refusing to write {value!r}: not a governor name")
    for path in paths:
        if not (CPU_GOV_PATH_RE.match(path) or GPU_GOV_PATH_RE.match(path)):
            raise FleetError(f"{remote.name}: refusing to write {path!r}: not a governor path")
        if value not in allowed.get(path, []):
            raise FleetError(f"{remote.name}: refusing to write {value!r} to {path}: not one of "
                             f"{' '.join(allowed.get(path, [])) or 'nothing listed'}")
    remote.run(["tee", "--", *paths], sudo=True, timeout=CMD_TIMEOUT,
               input=(value + "\n").encode())


# --------------------------------------------------------------------------- plan, apply, verify


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
            if not isinstance(value, str) or not regex.match(value):
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
            how = "accepted earlier, waits for its reboot"
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

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


class Restored(Enum):
    RESTORED = "restored"
    NOTHING_SAVED = "nothing saved"
    INCOMPLETE = "incomplete"        # the mode switch back needs a reboot: saved state kept


@dataclass
class RestoreReport:
    host: str
    outcome: Restored
    notes: list[str]

    @property
    def ok(self) -> bool:
        return self.outcome is not Restored.INCOMPLETE


def _set_mode(remote: Remote, mode_id: int, allow_reboot: bool) -> tuple[ModeSwitch, str | None]:
    """Switch the power mode: (what happened, a note for the report)."""
    argv = ["nvpmodel", "-m", str(int(mode_id))]
    res = remote.run(argv, sudo=True, timeout=MODE_TIMEOUT, check=False)
    if res.exit_code == 0 and not REBOOT_RE.search(res.stdout + res.stderr):
        return ModeSwitch.DONE, None
    if REBOOT_RE.search(res.stdout + res.stderr):
        if not allow_reboot:
            return ModeSwitch.NEEDS_REBOOT, (
                f"power mode {mode_id}: reboot required, not applied "
                f"(re-run with --allow-reboot to switch and reboot)")
        # Answer the tool's own prompt. The script is a constant; the id is a positional
        # parameter (an integer), never part of the script text.
        try:
            res = remote.run(["sh", "-c", 'echo YES | exec nvpmodel -m "$1"', "sh",
                              str(int(mode_id))], sudo=True, timeout=MODE_TIMEOUT, check=False)
        except FleetError as exc:  # a real device drops the connection as it goes down
            return ModeSwitch.REBOOTING, f"power mode {mode_id}: switched, the device is rebooting ({exc})"
        if res.exit_code == 0:
            return ModeSwitch.REBOOTING, f"power mode {mode_id}: switched, the device reboots into it"
        if "NVPM ERROR" not in res.stdout + res.stderr:
            # The session went down with the device before its exit status came (exit -1 over
            # SSH): the answer was taken; whether it really rebooted is what rollout waits for.
            return ModeSwitch.REBOOTING, (f"power mode {mode_id}: switched, the device went down "
                                          f"(exit {res.exit_code})")
    raise FleetError(f"{remote.name}: nvpmodel -m {mode_id} failed ({res.exit_code}): "
                     f"{(res.stderr or res.stdout).strip()}")


def save_state(remote: Remote, tdir: str, st: TuningState) -> bool:
    """Record the pre-tuning mode and governors, once. Returns False when already saved."""
    path = f"{tdir}/state.json"
    if remote.read_text(path, sudo=True) is not None:
        return False
    data = {
        "mode_id": st.mode_id, "mode_name": st.mode_name,
        "cpu_governor": {str(c): g for c, g in st.cpu_governor.items()},
        "gpu_node": st.gpu_node, "gpu_governor": st.gpu_governor,
        "gpu_governors": dict(st.gpu_governors),
    }
    remote.write_bytes(path, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode(),
                       sudo=True)
    return True


def apply(remote: Remote, plan: TunePlan, *, allow_reboot: bool = False) -> TuneReport:
    """Apply a checked plan, then verify. Changes nothing the device already has.

    When the mode switch needs a reboot: without ``allow_reboot`` nothing is applied at all (the
    reboot would undo clocks and governors; the report says what was not applied); with it the
    kit answers nvpmodel's prompt, the device reboots, and the report is ``REBOOTING``: the
    caller (``rollout``) waits for it, verifies the mode and applies the rest."""
    spec, st = plan.spec, plan.state
    mp = plan.mode
    if mp is not None and mp.reboot and not allow_reboot:
        wanted = mp.target.name
        return TuneReport(plan.host, [Check("power mode", wanted, f"{st.mode_name} ({st.mode_id})",
                                            False)], [
            f"power mode {st.mode_name} -> {wanted} needs a reboot: not applied (re-run with "
            f"--allow-reboot); jetson_clocks and governors not applied either (a reboot would "
            f"undo them); nothing was changed"], ModeSwitch.NEEDS_REBOOT)
    tdir = root_dir(remote)
    notes: list[str] = []
    save_state(remote, tdir, st)
    now = st
    switch = None
    if mp is not None and mp.change:
        if mp.pending:      # accepted before: only the reboot is missing
            switch, note = _reboot(remote, mp.target.id)
        else:
            switch, note = _set_mode(remote, mp.target.id, allow_reboot)
        notes += [note] if note else []
        if switch is ModeSwitch.REBOOTING:  # the device is going down: the rest when it is back
            return TuneReport(plan.host, [Check("power mode", mp.target.name, "rebooting",
                                                False)], notes, switch)
        if switch is ModeSwitch.NEEDS_REBOOT:   # the device disagreed with the plan
            return TuneReport(plan.host, [Check("power mode", mp.target.name,
                                                f"{st.mode_name} ({st.mode_id})", False)],
                              notes + ["jetson_clocks and governors not applied"], switch)
        now = read_state(remote, modes=False)  # online CPUs and caps follow the mode
    if spec.jetson_clocks and not now.jetson_clocks_active:
        store = f"{tdir}/l4t_dfs.conf"
        if remote.read_text(store, sudo=True) is None:  # the first pre-tuning clocks win
            remote.run(["jetson_clocks", "--store", store], sudo=True, timeout=CMD_TIMEOUT)
        remote.run(["jetson_clocks"], sudo=True, timeout=CMD_TIMEOUT)
    # CPUs brought online by the mode switch must list the governor too.
    for c in now.cpus_online:
        if spec.cpu_governor not in now.cpu_available.get(c, []):
            raise TuneRefused(f"{remote.name}: cpu{c} (online after the mode switch) has no "
                              f"governor {spec.cpu_governor!r}; governors were left unchanged")
    cpu_paths = {_cpu(c, "scaling_governor"): now.cpu_available[c] for c in now.cpus_online
                 if now.cpu_governor.get(c) != spec.cpu_governor}
    write_governor(remote, list(cpu_paths), spec.cpu_governor, cpu_paths)
    gpu_paths = {f"{DEVFREQ_DIR}/{n}/governor": now.gpu_avail.get(n, []) for n in now.gpu_nodes
                 if now.gpu_governors.get(n) != spec.gpu_governor}
    write_governor(remote, list(gpu_paths), spec.gpu_governor, gpu_paths)
    report = verify(remote, spec, notes, mode_name=mp.target.name if mp else None)
    report.mode = switch
    return report


def _reboot(remote: Remote, mode_id: int) -> tuple[ModeSwitch, str]:
    try:
        remote.run(["reboot"], sudo=True, timeout=CMD_TIMEOUT, check=False)
    except FleetError as exc:   # the connection drops as the device goes down
        return ModeSwitch.REBOOTING, f"power mode {mode_id}: rebooting into it ({exc})"
    return ModeSwitch.REBOOTING, f"power mode {mode_id}: recorded earlier, rebooting into it"


def mode_now(remote: Remote) -> tuple[str | None, bool]:
    """(the mode nvpmodel reports, whether the GPU already runs its mask): a rebooted device is
    verified when the second is True."""
    st = read_state(remote)
    if st.conf is None or st.mode_id is None:
        return st.mode_name, False
    return st.mode_name, not jetson.reboot_pending(st.conf, st.mode_id, st.live_tpc_mask)


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
            v = _read_files(remote, [f"{DEVFREQ_DIR}/{node}/{n}" for n in ("cur_freq", "max_freq")],
                            sudo=True)
            cur, top = _int(v.get(f"{DEVFREQ_DIR}/{node}/cur_freq")), \
                _int(v.get(f"{DEVFREQ_DIR}/{node}/max_freq"))
            label = "gpu Hz" if len(st.gpu_nodes) == 1 else f"gpu Hz {node}"
            checks.append(Check(label, f"max {top}", str(cur), cur is not None and cur == top))
    return TuneReport(remote.name, checks, list(notes or []))


def restore(remote: Remote, *, allow_reboot: bool = False) -> RestoreReport:
    """Put back the saved pre-tuning state and remove it."""
    require_privilege(remote)
    exists = remote.run(["test", "-e", TUNE_DIR], sudo=True, check=False, timeout=CMD_TIMEOUT)
    tdir = root_dir(remote) if exists.ok else TUNE_DIR
    text = remote.read_text(f"{tdir}/state.json", sudo=True) if exists.ok else None
    if text is None:
        return RestoreReport(remote.name, Restored.NOTHING_SAVED, [
            "nothing saved: the device was not tuned by the kit (or already restored)"])
    try:
        saved: dict[str, Any] = json.loads(text)
        cpu_saved = {int(k): str(v) for k, v in dict(saved.get("cpu_governor") or {}).items()}
    except (ValueError, TypeError, AttributeError):
        raise FleetError(f"{remote.name}: {tdir}/state.json is corrupt; inspect and remove "
                         f"it") from None
    st = read_state(remote, modes=False)
    by_value: dict[str, dict[str, list[str]]] = {}
    for c, gov in sorted(cpu_saved.items()):
        if st.cpu_governor.get(c) != gov and c in st.cpu_available:
            by_value.setdefault(gov, {})[_cpu(c, "scaling_governor")] = st.cpu_available[c]
    for gov, paths in by_value.items():
        write_governor(remote, list(paths), gov, paths)
    gsaved = {str(k): str(v) for k, v in dict(saved.get("gpu_governors") or {}).items()}
    if not gsaved and saved.get("gpu_node") and saved.get("gpu_governor"):
        gsaved = {str(saved["gpu_node"]): str(saved["gpu_governor"])}
    for node, ggov in sorted(gsaved.items()):
        if node in st.gpu_nodes and st.gpu_governors.get(node) != ggov:
            gpath = f"{DEVFREQ_DIR}/{node}/governor"
            write_governor(remote, [gpath], ggov, {gpath: st.gpu_avail.get(node, [])})
    store = f"{tdir}/l4t_dfs.conf"
    notes: list[str] = []
    failed: list[str] = []
    if remote.read_text(store, sudo=True) is not None:
        res = remote.run(["jetson_clocks", "--restore", store], sudo=True, timeout=CMD_TIMEOUT)
        # The script exits 0 even when a line failed: read its output [S].
        failed = restore_failures(res.stdout + res.stderr)
        if failed:
            notes.append(f"jetson_clocks --restore exited {res.exit_code} but failed to restore "
                         f"{', '.join(jetson.clean(p) for p in failed)}")
    mode_id = saved.get("mode_id")
    if isinstance(mode_id, int) and st.mode_id != mode_id:
        full = read_state(remote)
        needs = full.conf is not None and full.mode_id is not None and \
            any(m.id == mode_id for m in full.conf.modes) and \
            jetson.reboot_required(full.conf, full.mode_id, mode_id, full.live_tpc_mask)
        if needs and allow_reboot and not failed:
            # The device goes down with the switch: remove the record first (the reboot
            # itself returns every clock and governor to the boot defaults).
            remote.run(["rm", "-rf", "--", tdir], sudo=True, timeout=CMD_TIMEOUT)
        switch, note = _set_mode(remote, mode_id, allow_reboot)
        if switch is ModeSwitch.NEEDS_REBOOT:
            # Keep the saved state: the next --restore (with --allow-reboot) finishes the job.
            return RestoreReport(remote.name, Restored.INCOMPLETE, notes + [
                f"{note}; governors and clocks were restored, the saved state is kept"])
        notes += [note] if note else []
        if switch is ModeSwitch.REBOOTING:
            notes.append(f"restored governors and clocks, removed {tdir}; rebooting into mode "
                         f"{saved.get('mode_name')}")
            return RestoreReport(remote.name, Restored.RESTORED, notes)
    if failed:
        return RestoreReport(remote.name, Restored.INCOMPLETE, notes + [
            f"the rest was restored; the saved state is kept in {tdir} for inspection (remove "
            f"it as root when done)"])
    remote.run(["rm", "-rf", "--", tdir], sudo=True, timeout=CMD_TIMEOUT)
    notes.append(f"restored mode {saved.get('mode_name')}, governors and clocks; removed {tdir}")
    return RestoreReport(remote.name, Restored.RESTORED, notes)


# --------------------------------------------------------------------------- rolling reboots

REBOOT_TIMEOUT = 600.0    # seconds a rebooting device has to answer SSH in its new mode


def _wait_back(fleet: Fleet, host: Host, plan_: TunePlan, timeout: float,
               poll: float) -> TuneReport:
    """After a device went down for its mode: wait until SSH answers and nvpmodel reports the
    target mode with the GPU running its mask, then plan again and apply clocks and governors."""
    target = plan_.mode.target.name if plan_.mode else None
    deadline = time.monotonic() + timeout
    last = "no answer yet"
    time.sleep(min(poll, 1.0))
    while time.monotonic() < deadline:
        try:
            with fleet.connect(host) as remote:
                name, booted = mode_now(remote)
                if name == target and booted:
                    again = plan(remote, plan_.spec)
                    report = apply(remote, again, allow_reboot=False)
                    report.mode = ModeSwitch.REBOOTING
                    report.notes.insert(0, f"rebooted once into {target}, back after "
                                           f"{timeout - (deadline - time.monotonic()):.0f}s; "
                                           f"mode verified, then clocks and governors applied")
                    return report
                last = f"answers in {name}" + ("" if booted else " (reboot still pending)")
        except KitError as exc:
            last = str(exc)
        time.sleep(poll)
    raise FleetError(f"{host.name}: did not come back in {target} within {timeout:g}s after its "
                     f"reboot (last: {jetson.clean(last)})")


def rollout(fleet: Fleet, plans: dict[str, TunePlan | None], *, allow_reboot: bool = False,
            max_unavailable: int = 1, reboot_timeout: float = REBOOT_TIMEOUT,
            poll: float = 2.0) -> tuple[Results[TuneReport], str | None]:
    """Apply the plans. Hosts whose mode switch is live (or that cannot reboot: no
    ``allow_reboot``) are applied in parallel. Hosts that need a reboot, with ``allow_reboot``,
    go down at most ``max_unavailable`` at a time, one canary first; each must come back in its
    new mode within ``reboot_timeout``; the first that does not stops the rollout (the hosts not
    started are skipped). Returns the results and the host the rollout stopped after (or None)."""
    if max_unavailable < 1:
        raise FleetError(f"--max-unavailable must be at least 1 (got {max_unavailable})")
    todo = [h for h in fleet.hosts if plans.get(h.name) is not None]
    rebooting = [h for h in todo if allow_reboot and plans[h.name].needs_reboot]
    live = [h for h in todo if h not in rebooting]
    outcomes: dict[str, Outcome[TuneReport]] = {}
    if live:
        for o in fleet.run(lambda r, h: apply(r, plans[h.name], allow_reboot=False), hosts=live):
            outcomes[o.host] = o

    def one(remote: Remote, host: Host) -> TuneReport:
        first = apply(remote, plans[host.name], allow_reboot=True)
        if first.mode is not ModeSwitch.REBOOTING:
            return first
        return _wait_back(fleet, host, plans[host.name], reboot_timeout, poll)

    batches = [rebooting[:1]] + [rebooting[i:i + max_unavailable]
                                 for i in range(1, len(rebooting), max_unavailable)]
    stopped = None
    for batch in (b for b in batches if b):
        if stopped is not None:
            for h in batch:
                outcomes[h.name] = Outcome(h.name, skipped=True)
            continue
        for o in fleet.run(one, hosts=batch, max_failures=len(batch) + 1):
            outcomes[o.host] = o
            if stopped is None and (not o.ok or not o.value.ok):
                stopped = o.host
    return Results([outcomes[h.name] for h in todo]), stopped


RESTORE_FAILED_RE = re.compile(r"^Error: Failed to restore (.*)$", re.M)


def restore_failures(output: str) -> list[str]:
    """The paths ``jetson_clocks --restore`` printed ``Error: Failed to restore PATH`` for (it
    still exits 0 after them, as NVIDIA's script does)."""
    return [m.group(1).strip() for m in RESTORE_FAILED_RE.finditer(output)]


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


def state_dict(st: TuningState) -> dict[str, Any]:
    d = asdict(st)
    d["jetson_clocks_active"] = st.jetson_clocks_active
    return d
