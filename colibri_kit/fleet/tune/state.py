"""A device's tuning state, read without changing anything: what ``--show`` prints, what a plan
starts from and what verify compares. Paths are discovered on the device and every value is
parsed strictly; one ``grep`` round trip reads many small sysfs files."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from colibri_kit import jetson
from colibri_kit.errors import FleetError
from colibri_kit.fleet.remote import Remote
from colibri_kit.fleet.tune.governors import (CPU_DIR, DEVFREQ_DIR, DEVFREQ_NODE_RE, cpu_path,
                                              parse_cpu_list)
from colibri_kit.fleet.tune.nvpmodel import (CMD_TIMEOUT, LIVE_TPC_MASK, parse_power_models,
                                             parse_query, run_nvpmodel)

EMC_DIR = "/sys/kernel/debug/bpmp/debug/clk/emc"
FAN_PWM = "/sys/devices/platform/pwm-fan/hwmon/hwmon0/pwm1"


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

    @property
    def pending(self) -> bool:
        """nvpmodel's status names a mode whose TPC mask the GPU does not run: a switch was
        accepted and its reboot never happened (or the device lies). Such a device needs a
        reboot before that mode is real."""
        if self.conf is None or self.mode_id is None:
            return False
        try:
            return jetson.reboot_pending(self.conf, self.mode_id, self.live_tpc_mask)
        except jetson.JetsonError:
            return False


def read_files(remote: Remote, paths: list[str], *, sudo: bool) -> dict[str, str]:
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


def int_or_none(text: str | None) -> int | None:
    return int(text) if text is not None and text.strip().isdigit() else None


def read_state(remote: Remote, *, sudo: bool = True, modes: bool = True) -> TuningState:
    """The device's tuning state (paths discovered on the device, every value parsed strictly)."""
    st = TuningState()
    base = read_files(remote, [f"{CPU_DIR}/present", f"{CPU_DIR}/online"], sudo=sudo)
    if f"{CPU_DIR}/online" not in base:
        raise FleetError(f"{remote.name}: {CPU_DIR}/online is missing: not a Linux device?")
    st.cpus_online = parse_cpu_list(base[f"{CPU_DIR}/online"])
    st.cpus_present = parse_cpu_list(base.get(f"{CPU_DIR}/present", base[f"{CPU_DIR}/online"]))
    ls = remote.run(["ls", "-1", "--", DEVFREQ_DIR], sudo=sudo, timeout=CMD_TIMEOUT, check=False)
    every = [n for n in ls.stdout.splitlines() if DEVFREQ_NODE_RE.fullmatch(n)] \
        if ls.exit_code == 0 else []
    # GPU domains by their device's of_node name, as jtop finds them (Thor: gpu-gpc-0, gpu-nvd-0).
    of = read_files(remote, [f"{DEVFREQ_DIR}/{n}/device/of_node/name" for n in every], sudo=sudo)
    st.gpu_nodes = jetson.gpu_devfreq_nodes(
        {n: of.get(f"{DEVFREQ_DIR}/{n}/device/of_node/name") for n in every})
    st.gpu_node = st.gpu_nodes[0] if st.gpu_nodes else None

    paths = []
    for c in st.cpus_present:
        paths += [cpu_path(c, n) for n in ("scaling_governor", "scaling_available_governors",
                                       "scaling_cur_freq", "scaling_min_freq", "scaling_max_freq")]
    gdir = st.gpu_dir
    for node in st.gpu_nodes:
        paths += [f"{DEVFREQ_DIR}/{node}/{n}" for n in ("governor", "available_governors",
                                                        "cur_freq", "min_freq", "max_freq")]
    paths += [f"{EMC_DIR}/rate", f"{EMC_DIR}/max_rate", f"{EMC_DIR}/mrq_rate_locked", FAN_PWM,
              LIVE_TPC_MASK]
    v = read_files(remote, paths, sudo=sudo)
    for c in st.cpus_present:
        gov = v.get(cpu_path(c, "scaling_governor"))
        if gov is not None:
            st.cpu_governor[c] = gov
        avail = v.get(cpu_path(c, "scaling_available_governors"))
        if avail is not None:
            st.cpu_available[c] = avail.split()
        for name, dest in (("scaling_cur_freq", st.cpu_cur), ("scaling_min_freq", st.cpu_min),
                           ("scaling_max_freq", st.cpu_max)):
            val = int_or_none(v.get(cpu_path(c, name)))
            if val is not None:
                dest[c] = val
    if gdir:
        st.gpu_governor = v.get(f"{gdir}/governor")
        st.gpu_available = (v.get(f"{gdir}/available_governors") or "").split()
        st.gpu_cur = int_or_none(v.get(f"{gdir}/cur_freq"))
        st.gpu_min = int_or_none(v.get(f"{gdir}/min_freq"))
        st.gpu_max = int_or_none(v.get(f"{gdir}/max_freq"))
    for node in st.gpu_nodes:
        d = f"{DEVFREQ_DIR}/{node}"
        if v.get(f"{d}/governor") is not None:
            st.gpu_governors[node] = v[f"{d}/governor"]
        st.gpu_avail[node] = (v.get(f"{d}/available_governors") or "").split()
        lo, hi, cur = (int_or_none(v.get(f"{d}/{n}")) for n in ("min_freq", "max_freq", "cur_freq"))
        st.gpu_pinned[node] = lo is not None and lo == hi
    st.live_tpc_mask = v.get(LIVE_TPC_MASK)
    st.emc_cur = int_or_none(v.get(f"{EMC_DIR}/rate"))
    st.emc_max = int_or_none(v.get(f"{EMC_DIR}/max_rate"))
    locked = v.get(f"{EMC_DIR}/mrq_rate_locked")
    st.emc_locked = None if locked is None else locked.strip() == "1"
    st.fan_pwm = int_or_none(v.get(FAN_PWM))

    q = run_nvpmodel(remote, ["-q"], sudo=sudo)
    if q.exit_code == 0:
        st.mode_name, st.mode_id = parse_query(q.stdout)
    if modes and q.exit_code == 0:
        p = run_nvpmodel(remote, ["-p", "--verbose"], sudo=sudo)
        if p.exit_code == 0:
            st.modes = parse_power_models(p.stdout)
            try:
                st.conf = jetson.parse_nvpmodel_verbose(p.stdout)
            except jetson.JetsonError:
                st.conf = None
    return st


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


def mode_now(remote: Remote) -> tuple[str | None, bool]:
    """(the mode nvpmodel reports, whether the GPU already runs its mask): a rebooted device is
    verified when the second is True."""
    st = read_state(remote)
    if st.conf is None or st.mode_id is None:
        return st.mode_name, False
    return st.mode_name, not st.pending


def state_dict(st: TuningState) -> dict[str, Any]:
    d = asdict(st)
    d["jetson_clocks_active"] = st.jetson_clocks_active
    return d
