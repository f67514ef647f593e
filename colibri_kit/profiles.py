"""Target profiles: load ``targets/<name>.yaml``, resolve ``extends``, validate, freeze.

A profile says everything the kit needs to know about one device class: CPU architecture and
glibc floor (what the binary may require), the pinned CUDA version and SMs, the runtime's
compile-time geometry (``colibri:``), how to tune the device and what the smoke test expects.

Files whose name starts with ``_`` are abstract bases: they hold shared defaults, may be
``extends``-ed, and are neither listed nor buildable. Merging is a deep merge of mappings in
which the child wins; lists and scalars (including ``null``) replace the base value, so
``cuda: null`` in a child removes an inherited CUDA section.

Every error names the file that set the offending value, the key path, the bad value and
what is allowed, e.g. ``targets/orin-nx.yaml: colibri.routing_mode: 'topk' is not one of
softmax_topk, linear_score``.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping

import yaml

from colibri_kit import paths
from colibri_kit.errors import ProfileError
from colibri_kit.service import (RealtimeOptions, ServiceError, ServiceSpec, parse_service,
                                 service_dict)

ARCHES = ("aarch64", "x86_64")
ROUTING_MODES = ("softmax_topk", "linear_score")
STREAM_COUNTS = (1, 2)
MAX_EXPERTS_LIMIT = 512  # the bitonic top-k network in the runtime is sized for this (Qwen3-Next: 512)
TOP_K_LIMIT = 16         # the .colibri format's limit (docs/format.md, "Limits enforced by readers")

# SMs each pinned CUDA version can compile for (the nvidia-cuda-nvrtc wheels the kit installs, and
# NVIDIA's CUDA release notes).
# 11.8: sm_35..sm_90; 12.6: sm_50..sm_90a (sm_100/101/120 arrive in 12.8);
# 13.0: drops everything below sm_75, Thor is sm_110 (it was sm_101 in 12.8/12.9).
CUDA_SMS: dict[str, tuple[str, ...]] = {
    "11.8": ("sm_35", "sm_37", "sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70",
             "sm_72", "sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90"),
    "12.6": ("sm_50", "sm_52", "sm_53", "sm_60", "sm_61", "sm_62", "sm_70", "sm_72", "sm_75",
             "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a"),
    "13.0": ("sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_90a", "sm_100",
             "sm_100a", "sm_103", "sm_103a", "sm_110", "sm_110a", "sm_120", "sm_120a",
             "sm_121", "sm_121a"),
}
CUDA_VERSIONS = tuple(CUDA_SMS)
SPILL_POLICIES = ("warn", "error")   # cuda.spills: what a kernel spilling registers does
RT_POLICIES = ("other", "fifo", "rr")  # realtime.policy: SCHED_OTHER, SCHED_FIFO, SCHED_RR
RT_BARRIERS = ("spin", "sleep")        # realtime.barrier: how pool workers wait at a barrier
RT_PRIORITY = (1, 99)                  # sched_get_priority_min/max(SCHED_FIFO) on Linux
MAX_CPU = 1023

# Values are checked with fullmatch (``re.match`` with ``$`` lets one trailing newline through).
_NAME_RE = re.compile(r"[a-z0-9][a-z0-9-]*")
_BASE_NAME_RE = re.compile(r"_[a-z0-9][a-z0-9_-]*")
_GLIBC_RE = re.compile(r"2\.(\d{1,2})")
_RELEASE_RE = re.compile(r"\d+(\.\d+){1,2}")
_SM_RE = re.compile(r"sm_\d{2,3}a?")
_MCPU_RE = re.compile(r"[a-z0-9][a-z0-9_.+-]*")
_GOVERNOR_RE = re.compile(r"[a-z0-9_]+")          # reaches sysfs writes
_NVPMODEL_RE = re.compile(r"[A-Za-z0-9_]+")       # reaches the nvpmodel command line
_SOC_RE = re.compile(r"[a-z0-9]+")
_MODEL_PATTERN_RE = re.compile(r"[A-Za-z0-9 ._()-]+")
_CPU_RANGE_RE = re.compile(r"([0-9]{1,4})(?:-([0-9]{1,4}))?")


# --------------------------------------------------------------------------- public types


@dataclass(frozen=True)
class DeviceSpec:
    soc: str            # e.g. tegra234 (matched against /proc/device-tree/compatible)
    model_pattern: str  # substring of /proc/device-tree/model, e.g. "Orin NX"


@dataclass(frozen=True)
class CudaSpec:
    version: str              # "11.8" | "12.6" | "13.0"
    archs: tuple[str, ...]    # ("sm_87",): one cubin each, plus PTX
    igpu: bool                # integrated GPU sharing DRAM with the CPU (every Jetson)
    spills: str = "warn"      # a kernel spilling registers: "warn" (build output) or "error"
    # the device may need NVIDIA's cuda-compat driver for this CUDA (its BSP driver is older on
    # some accepted L4T releases): the runtime then opens /usr/local/cuda-<version>/compat/
    # libcuda.so.1 by path when present (colibri_config.h COLIBRI_CUDA_COMPAT_LIBCUDA)
    compat_driver: bool = False

    @property
    def compat_libcuda(self) -> str:
        """The cuda-compat package's libcuda.so.1 for this CUDA version, or ""."""
        return f"/usr/local/cuda-{self.version}/compat/libcuda.so.1" if self.compat_driver else ""

    @property
    def sm_numbers(self) -> tuple[int, ...]:
        """The SMs as integers (``sm_87`` -> 87), the form cubin headers carry."""
        return tuple(sm_number(a) for a in self.archs)


@dataclass(frozen=True)
class ColibriSpec:
    embed_pad: int
    stream_count: int
    routing_mode: str   # softmax_topk | linear_score
    top_k: int
    max_experts: int


@dataclass(frozen=True)
class TuneSpec:
    # A mode NAME ("MAXN"), acceptable names in order of preference (("MAXN_SUPER", "MAXN")), or
    # "max"/"min" (the device conf's highest/lowest power mode): colibri_kit.jetson.resolve_mode.
    nvpmodel_mode: str | tuple[str, ...]
    jetson_clocks: bool
    cpu_governor: str
    gpu_governor: str


@dataclass(frozen=True)
class RealtimeSpec:
    """The profile's ``realtime:`` section (docs/runtime.md, "Real-time mode"; docs/tuning.md).

    ``cpus`` are the inference cores, in order: worker thread i is pinned to ``cpus[i]``. The
    runtime options (policy, priority, lock_memory, barrier) reach ``colibri serve`` through the
    unit, which gets exactly the privileges they need; ``irq_affinity`` and ``isolate`` are
    ``invoke tune``'s: IRQs moved off ``cpus`` (live), and ``cpus`` isolated on the kernel command
    line (isolcpus, and nohz_full / rcu_nocbs where the kernel has them; a reboot)."""

    cpus: tuple[int, ...]
    policy: str = "other"        # other | fifo | rr
    priority: int = 0            # 1..99 with fifo / rr; 0 with other
    lock_memory: bool = False    # mlock + pre-fault weights and arena at init
    barrier: str = "sleep"       # spin | sleep at the pool's barriers
    isolate: bool = False        # tune --allow-reboot: isolcpus/nohz_full/rcu_nocbs = cpus
    irq_affinity: bool = False   # tune: IRQs off cpus, onto the other online CPUs
    # tune: kernel.sched_rt_runtime_us (us of every sched_rt_period_us that RT threads may run;
    # -1: no limit); None leaves the kernel's (950000 of 1000000 by default). fleet/tune/
    # rt_throttle.py; docs/runtime.md "Real-time mode" has the measurement and the -1 risk.
    rt_runtime_us: int | None = None

    @property
    def cpu_list(self) -> str:
        """``cpus`` as the kernel writes a CPU list (sorted ranges: ``2-5,7``)."""
        return cpu_list_text(self.cpus)

    @property
    def realtime_policy(self) -> bool:
        return self.policy != "other"


@dataclass(frozen=True)
class SmokeSpec:
    max_first_token_ms_p99: float
    prompt_ids: tuple[int, ...]
    greedy_tokens: int


@dataclass(frozen=True)
class MemorySpec:
    """Module DRAM for the footprint check (colibri_kit/model/footprint.py, docs/targets.md):
    the smallest module of the class unless the profile overrides it, minus a reserve for the
    OS, JetPack services and the CUDA context."""
    total_mb: int
    reserve_mb: int


@dataclass(frozen=True)
class Profile:
    name: str
    description: str
    arch: str
    glibc: str
    glibc_tuple: tuple[int, int]
    cpu_mcpu: str | None
    jetpack: str | None
    l4t: str | None
    device: DeviceSpec | None
    cuda: CudaSpec | None
    colibri: ColibriSpec
    tune: TuneSpec | None
    smoke: SmokeSpec
    source_path: Path
    hash: str  # sha256 hex of the canonical resolved profile (see to_dict)
    service: ServiceSpec | None = None  # the device service (docs/service.md); root joined at deploy
    # Not a build input, so not in the hash (a memory edit does not rebuild the runtime).
    memory: MemorySpec | None = None
    # Accepted L4T releases, e.g. "R36.3–R36.4.x" (colibri_kit.jetson.parse_l4t_range); deploy
    # refuses a device outside it. None: the major number of ``l4t`` must match.
    l4t_range: str | None = None
    # Runtime and tuning options for deadlines under load; not a build input (not in the hash).
    realtime: RealtimeSpec | None = None

    @property
    def zig_triple(self) -> str:
        """``zig cc -target`` value, e.g. ``aarch64-linux-gnu.2.35`` (pins the glibc floor)."""
        return f"{self.arch}-linux-gnu.{self.glibc}"

    @property
    def zig_mcpu(self) -> str | None:
        """``-mcpu`` spelled the way zig wants it (``cortex-a78ae`` -> ``cortex_a78ae``)."""
        return self.cpu_mcpu.replace("-", "_").replace(".", "_") if self.cpu_mcpu else None

    @property
    def short_hash(self) -> str:
        return self.hash[:16]

    @property
    def sms(self) -> tuple[str, ...]:
        return self.cuda.archs if self.cuda else ()

    def to_dict(self) -> dict[str, Any]:
        """The resolved profile as plain data (what the hash covers; no file paths)."""
        return _resolved_dict(self)


# --------------------------------------------------------------------------- public functions


_SM_NUMBER_RE = re.compile(r"(?:sm_|compute_)?(\d{2,3})a?")


def sm_number(arch: str | int) -> int:
    """'sm_87' / 'sm_90a' / 'compute_87' / 87 -> 87: the one parser of SM names (profiles,
    --cuda-archs, cubin checks)."""
    if isinstance(arch, int):
        return arch
    m = _SM_NUMBER_RE.fullmatch(str(arch).strip())
    if not m:
        raise ProfileError(f"invalid CUDA architecture {arch!r} (expected e.g. sm_87)")
    return int(m.group(1))


def list_profiles(targets_dir: Path | None = None) -> list[str]:
    """Names of the buildable profiles (abstract ``_bases`` excluded), sorted."""
    tdir = Path(targets_dir) if targets_dir else paths.targets_dir()
    if not tdir.is_dir():
        raise ProfileError(f"{tdir}: targets directory not found")
    return sorted(p.stem for p in tdir.glob("*.yaml") if not p.stem.startswith("_"))


def load_profile(name: str, targets_dir: Path | None = None) -> Profile:
    """Load, merge and validate ``targets/<name>.yaml``; raise ProfileError on any problem."""
    tdir = Path(targets_dir) if targets_dir else paths.targets_dir()
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
        raise ProfileError(
            f"target name {name!r} is not valid (lowercase letters, digits and '-'; "
            f"'_' names are abstract bases); known targets: {_known(tdir)}"
        )
    path = tdir / f"{name}.yaml"
    if not path.is_file():
        raise ProfileError(f"unknown target {name!r}: {_rel(path)} does not exist; "
                           f"known targets: {_known(tdir)}")
    data, origin = _resolve(path, tdir, chain=())
    return _build(data, origin, path)


def load_all(targets_dir: Path | None = None) -> list[Profile]:
    """Every buildable profile, loaded and validated."""
    return [load_profile(n, targets_dir) for n in list_profiles(targets_dir)]


def require_profile(value: object, function: str) -> Profile:
    """``value`` when it is a Profile; else a TypeError naming ``function`` and the fix.

    Library functions take a loaded Profile; only the edges (colibri_kit/tasks/, a module's
    ``main()``, scripts/, benchmarks/) turn a target name into one with ``load_profile``, so a
    profile is loaded and validated once per command and every step sees the same one
    (tests/test_layout_python.py enforces it). Python checks no annotations at run time: a name
    passed anyway would otherwise fail later, as an AttributeError far from the call."""
    if isinstance(value, Profile):
        return value
    if isinstance(value, str):
        raise TypeError(f"{function}() takes a Profile, not the target name {value!r}: "
                        f"pass load_profile({value!r}) (colibri_kit.profiles)")
    raise TypeError(f"{function}() takes a Profile, not {type(value).__name__}: "
                    f"pass load_profile(NAME) (colibri_kit.profiles)")


def profile_yaml(profile: Profile) -> str:
    """The resolved profile as YAML (key order as in the schema), with its hash."""
    doc = {"name": profile.name, **{k: v for k, v in profile.to_dict().items() if k != "name"},
           **({"realtime": realtime_dict(profile.realtime)} if profile.realtime else {}),
           "hash": profile.hash}
    return yaml.safe_dump(doc, sort_keys=False, default_flow_style=None, width=100)


# --------------------------------------------------------------------------- loading and merging

Origin = dict[tuple[str, ...], Path]


def _known(tdir: Path) -> str:
    try:
        return ", ".join(list_profiles(tdir)) or "(none)"
    except ProfileError:
        return "(none)"


def _rel(path: Path) -> str:
    """Path as the user knows it: relative to the project root when inside it."""
    try:
        return str(path.resolve().relative_to(paths.project_root()))
    except ValueError:
        return str(path)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys (PyYAML silently keeps the last one)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _value in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def _read(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"{_rel(path)}: cannot read: {exc.strerror}") from None
    try:
        doc = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 (a SafeLoader subclass)
    except yaml.YAMLError as exc:
        where = getattr(exc, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise ProfileError(f"{_rel(path)}: not valid YAML{line}: "
                           f"{getattr(exc, 'problem', None) or exc}") from None
    if not isinstance(doc, dict):
        raise ProfileError(f"{_rel(path)}: a profile must be a mapping of keys, "
                           f"got {type(doc).__name__}")
    return doc


def _resolve(path: Path, tdir: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], Origin]:
    """Read ``path`` and everything it extends; return merged data + which file set each key."""
    if path in chain:
        cycle = " -> ".join(p.stem for p in (*chain, path))
        raise ProfileError(f"{_rel(chain[0])}: extends: cycle {cycle}")
    raw = _read(path)
    own_name = raw.get("name")
    if own_name is not None and own_name != path.stem:
        raise ProfileError(f"{_rel(path)}: name: {own_name!r} must equal the file name "
                           f"{path.stem!r}")
    base_name = raw.pop("extends", None)
    data: dict[str, Any] = {}
    origin: Origin = {}
    if base_name is not None:
        if not isinstance(base_name, str) or not (_NAME_RE.fullmatch(base_name)
                                                  or _BASE_NAME_RE.fullmatch(base_name)):
            raise ProfileError(f"{_rel(path)}: extends: {base_name!r} is not a profile name")
        base_path = tdir / f"{base_name}.yaml"
        if not base_path.is_file():
            raise ProfileError(f"{_rel(path)}: extends: base {base_name!r} not found "
                               f"({_rel(base_path)} does not exist)")
        data, origin = _resolve(base_path, tdir, (*chain, path))
        data.pop("name", None)  # a name belongs to its own file, never inherited
    _merge(data, origin, raw, path, ())
    return data, origin


def _merge(dst: dict[str, Any], origin: Origin, src: Mapping[str, Any], path: Path,
           prefix: tuple[str, ...]) -> None:
    for key, value in src.items():
        kpath = (*prefix, str(key))
        if isinstance(value, dict) and isinstance(dst.get(key), dict):
            _merge(dst[key], origin, value, path, kpath)
        else:
            # replaced wholesale: forget where the old sub-keys came from
            for stale in [k for k in origin if k[: len(kpath)] == kpath]:
                del origin[stale]
            dst[key] = _copy(value)
            _mark(origin, value, path, kpath)


def _mark(origin: Origin, value: Any, path: Path, kpath: tuple[str, ...]) -> None:
    origin[kpath] = path
    if isinstance(value, dict):
        for k, v in value.items():
            _mark(origin, v, path, (*kpath, str(k)))


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


# --------------------------------------------------------------------------- validation


class _Checker:
    """Validates the merged mapping; errors name the file that set the value."""

    def __init__(self, origin: Origin, leaf: Path) -> None:
        self.origin = origin
        self.leaf = leaf

    def fail(self, kpath: tuple[str, ...], msg: str) -> ProfileError:
        src = self.leaf
        for n in range(len(kpath), 0, -1):
            if kpath[:n] in self.origin:
                src = self.origin[kpath[:n]]
                break
        where = ".".join(kpath) if kpath else "(top level)"
        return ProfileError(f"{_rel(src)}: {where}: {msg}")

    def mapping(self, data: Any, kpath: tuple[str, ...], required: tuple[str, ...],
                optional: tuple[str, ...] = ()) -> dict[str, Any]:
        if not isinstance(data, dict):
            raise self.fail(kpath, f"expected a mapping with keys {', '.join(required + optional)}"
                                   f", got {_show(data)} ({_tname(data)})")
        allowed = required + optional
        for key in data:
            if key not in allowed:
                raise self.fail((*kpath, str(key)),
                                f"unknown key {str(key)!r}; allowed keys: {', '.join(allowed)}")
        for key in required:
            if key not in data:
                raise self.fail((*kpath, key), "missing required key")
        return data

    def typed(self, value: Any, kpath: tuple[str, ...], kind: type | tuple[type, ...],
              what: str, hint: str = "") -> Any:
        ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in
                                              (kind if isinstance(kind, tuple) else (kind,)))
        if not ok:
            raise self.fail(kpath, f"expected {what}, got {_show(value)} ({_tname(value)}){hint}")
        return value

    def string(self, value: Any, kpath: tuple[str, ...], regex: re.Pattern[str] | None = None,
               allowed_desc: str = "") -> str:
        hint = f'; quote it in YAML, e.g. "{value}"' if isinstance(value, (int, float)) and \
            not isinstance(value, bool) else ""
        self.typed(value, kpath, str, "a string", hint)
        if regex is not None and not regex.fullmatch(value):
            raise self.fail(kpath, f"{value!r} is not valid; allowed: {allowed_desc}")
        return value

    def enum(self, value: Any, kpath: tuple[str, ...], allowed: tuple[Any, ...]) -> Any:
        if isinstance(value, bool) or value not in allowed:
            raise self.fail(kpath, f"{_show(value)} is not one of "
                                   f"{', '.join(str(a) for a in allowed)}")
        return value

    def integer(self, value: Any, kpath: tuple[str, ...], lo: int | None = None,
                hi: int | None = None) -> int:
        self.typed(value, kpath, int, "an integer")
        if (lo is not None and value < lo) or (hi is not None and value > hi):
            rng = f"{lo if lo is not None else '-inf'}..{hi if hi is not None else 'inf'}"
            raise self.fail(kpath, f"{value} is out of range; allowed: {rng}")
        return value

    def optional(self, data: dict[str, Any], key: str, kpath: tuple[str, ...],
                 build: Callable[[Any, tuple[str, ...]], Any]) -> Any:
        value = data.get(key)
        return None if value is None else build(value, (*kpath, key))


TOP_KEYS_REQUIRED = ("name", "description", "arch", "glibc", "colibri", "smoke")
TOP_KEYS_OPTIONAL = ("cpu", "jetpack", "l4t", "device", "cuda", "tune", "service", "memory",
                     "l4t_range", "realtime")


def _build(data: dict[str, Any], origin: Origin, leaf: Path) -> Profile:
    c = _Checker(origin, leaf)
    c.mapping(data, (), TOP_KEYS_REQUIRED, TOP_KEYS_OPTIONAL)
    name = c.string(data["name"], ("name",), _NAME_RE, "lowercase letters, digits and '-'")
    description = c.string(data["description"], ("description",))
    arch = c.enum(data["arch"], ("arch",), ARCHES)
    glibc = c.string(data["glibc"], ("glibc",), _GLIBC_RE, 'a glibc version "2.N", e.g. "2.35"')
    glibc_tuple = (2, int(_GLIBC_RE.fullmatch(glibc).group(1)))  # type: ignore[union-attr]

    mcpu = None
    if data.get("cpu") is not None:
        cpu = c.mapping(data["cpu"], ("cpu",), (), ("mcpu",))
        if cpu.get("mcpu") is not None:
            mcpu = c.string(cpu["mcpu"], ("cpu", "mcpu"), _MCPU_RE,
                            "a compiler CPU name such as cortex-a78ae (letters, digits, -_.+)")

    jetpack = c.optional(data, "jetpack", (), lambda v, k: c.string(
        v, k, _RELEASE_RE, 'a release number such as "6.1"'))
    l4t = c.optional(data, "l4t", (), lambda v, k: c.string(
        v, k, _RELEASE_RE, 'a release number such as "36.4"'))
    l4t_range = c.optional(data, "l4t_range", (), lambda v, k: _l4t_range(c, v, k))
    device = c.optional(data, "device", (), lambda v, k: _device(c, v, k))
    cuda = c.optional(data, "cuda", (), lambda v, k: _cuda(c, v, k))
    colibri = _colibri(c, data["colibri"], ("colibri",))
    tune = c.optional(data, "tune", (), lambda v, k: _tune(c, v, k))
    smoke = _smoke(c, data["smoke"], ("smoke",))
    service = c.optional(data, "service", (), lambda v, k: parse_service(v, k, fail=c.fail))

    if name != leaf.stem:
        raise c.fail(("name",), f"{name!r} must equal the file name {leaf.stem!r}")

    fields = dict(name=name, description=description, arch=arch, glibc=glibc,
                  glibc_tuple=glibc_tuple, cpu_mcpu=mcpu, jetpack=jetpack, l4t=l4t,
                  device=device, cuda=cuda, colibri=colibri, tune=tune, smoke=smoke,
                  source_path=leaf.resolve(), service=service, l4t_range=l4t_range)
    draft = Profile(**fields, hash="")
    digest = hashlib.sha256(_canonical_json(_resolved_dict(draft)).encode()).hexdigest()
    memory = c.optional(data, "memory", (), lambda v, k: _memory(c, v, k))
    realtime = c.optional(data, "realtime", (), lambda v, k: _realtime(c, v, k))
    if realtime is not None and service is not None:
        fields["service"] = _service_realtime(c, service, realtime)   # not hashed, as realtime
    if realtime is not None and tune is None:
        for key in ("isolate", "irq_affinity", "rt_runtime_us"):
            if getattr(realtime, key) not in (False, None):
                raise c.fail(("realtime", key), f"{_show(getattr(realtime, key))} needs a tune "
                                                f"section (invoke tune applies it with the "
                                                f"profile's tune settings)")
    return Profile(**fields, hash=digest, memory=memory, realtime=realtime)


def _service_realtime(c: _Checker, service: ServiceSpec, rt: RealtimeSpec) -> ServiceSpec:
    """The service runs the realtime section's runtime options (the unit renders them)."""
    try:
        return replace(service, realtime=RealtimeOptions(
            cpus=rt.cpus, policy=rt.policy, priority=rt.priority, lock_memory=rt.lock_memory,
            barrier=rt.barrier))
    except ServiceError as exc:
        key, _, msg = str(exc).partition(": ")
        where = ("realtime", key.split(".", 1)[1]) if key.startswith("realtime.") else \
            ("service", key)
        raise c.fail(where, msg or str(exc)) from None


def realtime_dict(rt: RealtimeSpec) -> dict[str, Any]:
    """The ``realtime:`` section as plain data (shown with the profile, not hashed)."""
    return {"cpus": list(rt.cpus), "policy": rt.policy, "priority": rt.priority,
            "lock_memory": rt.lock_memory, "barrier": rt.barrier, "isolate": rt.isolate,
            "irq_affinity": rt.irq_affinity,
            **({"rt_runtime_us": rt.rt_runtime_us} if rt.rt_runtime_us is not None else {})}


def cpu_list_text(cpus: tuple[int, ...] | list[int]) -> str:
    """CPU numbers -> the kernel's list form (``[2, 3, 4, 7]`` -> ``2-4,7``), sorted."""
    out: list[str] = []
    nums = sorted(set(cpus))
    i = 0
    while i < len(nums):
        j = i
        while j + 1 < len(nums) and nums[j + 1] == nums[j] + 1:
            j += 1
        out.append(str(nums[i]) if i == j else f"{nums[i]}-{nums[j]}")
        i = j + 1
    return ",".join(out)


_CPUS_HELP = 'a CPU list such as "2-7" or "2-5,7", or a list of CPU numbers such as [2, 3, 4, 5]'


def _cpus(c: _Checker, v: Any, k: tuple[str, ...]) -> tuple[int, ...]:
    """A CPU list: ``"2-5,7"`` (ascending) or ``[4, 2, 3]`` (the order threads are pinned in)."""
    if isinstance(v, list):
        if not v:
            raise c.fail(k, f"an empty list; expected {_CPUS_HELP}")
        cpus = tuple(c.integer(x, (*k, str(i)), lo=0, hi=MAX_CPU) for i, x in enumerate(v))
    elif isinstance(v, str):
        cpus = ()
        for part in v.split(","):
            m = _CPU_RANGE_RE.fullmatch(part.strip())
            lo = int(m.group(1)) if m else -1
            hi = int(m.group(2) or lo) if m else -1
            if not m or hi < lo or hi > MAX_CPU:
                raise c.fail(k, f"{v!r} is not valid; allowed: {_CPUS_HELP} (CPUs 0..{MAX_CPU})")
            cpus += tuple(range(lo, hi + 1))
    else:
        hint = (" (a bare number is ambiguous: write [N] for CPU N)"
                if isinstance(v, int) and not isinstance(v, bool) else "")
        raise c.fail(k, f"expected {_CPUS_HELP}, got {_show(v)} ({_tname(v)}){hint}")
    if len(set(cpus)) != len(cpus):
        raise c.fail(k, f"{_show(v)} names a CPU twice; each CPU runs one worker thread")
    return cpus


def _realtime(c: _Checker, v: Any, k: tuple[str, ...]) -> RealtimeSpec:
    m = c.mapping(v, k, ("cpus",), ("policy", "priority", "lock_memory", "barrier", "isolate",
                                   "irq_affinity", "rt_runtime_us"))
    cpus = _cpus(c, m["cpus"], (*k, "cpus"))
    policy = c.enum(m.get("policy", "other"), (*k, "policy"), RT_POLICIES)
    lo, hi = RT_PRIORITY
    if policy == "other":
        if m.get("priority") not in (None, 0):
            raise c.fail((*k, "priority"), f"{_show(m.get('priority'))} is not allowed with "
                                           f"policy other (SCHED_OTHER has no priority); set "
                                           f"policy: fifo or rr, or remove priority")
        priority = 0
    elif "priority" not in m:
        raise c.fail((*k, "priority"), f"missing: policy {policy} needs a priority; allowed: "
                                       f"{lo}..{hi}")
    else:
        priority = c.integer(m["priority"], (*k, "priority"), lo=lo, hi=hi)
    flags = {key: c.typed(m.get(key, False), (*k, key), bool, "true or false")
             for key in ("lock_memory", "isolate", "irq_affinity")}
    barrier = c.enum(m.get("barrier", "sleep"), (*k, "barrier"), RT_BARRIERS)
    if flags["isolate"] and 0 in cpus:
        # The boot CPU keeps timekeeping: the kernel clears it from nohz_full ("NO_HZ: Clearing
        # 0 from nohz_full range for timekeeping", kernel/time/tick-sched.c) and IRQs, RCU
        # callbacks and unbound kernel threads need a housekeeping CPU.
        raise c.fail((*k, "cpus"), f"{_show(m['cpus'])} includes CPU 0, which isolate: true "
                                   f"cannot isolate (the boot CPU keeps timekeeping and "
                                   f"housekeeping); use CPUs from 1, e.g. \"1-7\"")
    rt_runtime = None
    if m.get("rt_runtime_us") is not None:
        rt_runtime = _rt_runtime_us(c, m["rt_runtime_us"], (*k, "rt_runtime_us"))
    return RealtimeSpec(cpus=cpus, policy=policy, priority=priority, barrier=barrier,
                        rt_runtime_us=rt_runtime, **flags)


RT_RUNTIME_MAX = 2**31 - 1     # kernel/sched/rt.c: sched_rt_runtime_us is -1..INT_MAX


def _rt_runtime_us(c: _Checker, v: Any, k: tuple[str, ...]) -> int:
    """realtime.rt_runtime_us: -1 (no RT throttling) or 1..INT_MAX microseconds (tune also
    checks it against the device's sched_rt_period_us, 1000000 by default). 0 would stop every
    real-time thread, so it is refused."""
    if isinstance(v, bool) or not isinstance(v, int) or not (v == -1 or 1 <= v <= RT_RUNTIME_MAX):
        raise c.fail(k, f"{_show(v)} is not allowed; allowed: -1 (no limit: a runaway real-time "
                        f"thread can then hold its CPU) or 1..{RT_RUNTIME_MAX} microseconds of "
                        f"every sched_rt_period_us (1000000 by default; e.g. 990000)")
    return v


def _memory(c: _Checker, v: Any, k: tuple[str, ...]) -> MemorySpec:
    m = c.mapping(v, k, ("total_mb", "reserve_mb"))
    total = c.integer(m["total_mb"], (*k, "total_mb"), lo=64, hi=16 * 1024 * 1024)
    reserve = c.integer(m["reserve_mb"], (*k, "reserve_mb"), lo=0)
    if reserve >= total:
        raise c.fail((*k, "reserve_mb"), f"{reserve} is not allowed; must be less than "
                                         f"memory.total_mb ({total})")
    return MemorySpec(total_mb=total, reserve_mb=reserve)


def _device(c: _Checker, v: Any, k: tuple[str, ...]) -> DeviceSpec:
    m = c.mapping(v, k, ("soc", "model_pattern"))
    return DeviceSpec(
        soc=c.string(m["soc"], (*k, "soc"), _SOC_RE, "a SoC name such as tegra234"),
        model_pattern=c.string(m["model_pattern"], (*k, "model_pattern"), _MODEL_PATTERN_RE,
                               "letters, digits, spaces and ._()-"),
    )


def _cuda(c: _Checker, v: Any, k: tuple[str, ...]) -> CudaSpec:
    m = c.mapping(v, k, ("version", "archs"), ("igpu", "spills", "compat_driver"))
    version = c.string(m["version"], (*k, "version"))
    c.enum(version, (*k, "version"), CUDA_VERSIONS)
    archs = c.typed(m["archs"], (*k, "archs"), list, "a list of SMs such as [sm_87]")
    if not archs:
        raise c.fail((*k, "archs"), "empty list; name at least one SM such as sm_87")
    supported = CUDA_SMS[version]
    for i, arch in enumerate(archs):
        ak = (*k, "archs", str(i))
        c.string(arch, ak, _SM_RE, "sm_NN such as sm_87")
        if arch not in supported:
            raise c.fail(ak, f"{arch} is not supported by CUDA {version}; "
                             f"CUDA {version} targets: {', '.join(supported)}")
    if len(set(archs)) != len(archs):
        raise c.fail((*k, "archs"), f"duplicate SMs in {archs}")
    igpu = c.typed(m.get("igpu", False), (*k, "igpu"), bool, "true or false")
    spills = c.enum(m.get("spills", "warn"), (*k, "spills"), SPILL_POLICIES)
    compat = c.typed(m.get("compat_driver", False), (*k, "compat_driver"), bool, "true or false")
    return CudaSpec(version=version, archs=tuple(archs), igpu=igpu, spills=spills,
                    compat_driver=compat)


def _colibri(c: _Checker, v: Any, k: tuple[str, ...]) -> ColibriSpec:
    m = c.mapping(v, k, ("embed_pad", "stream_count", "routing_mode", "top_k", "max_experts"))
    embed_pad = c.integer(m["embed_pad"], (*k, "embed_pad"))
    if embed_pad <= 0 or embed_pad % 16:
        raise c.fail((*k, "embed_pad"), f"{embed_pad} is not allowed; "
                                        "must be a positive multiple of 16 (16, 32, 64, ...)")
    stream_count = c.enum(c.integer(m["stream_count"], (*k, "stream_count")),
                          (*k, "stream_count"), STREAM_COUNTS)
    routing_mode = c.enum(m["routing_mode"], (*k, "routing_mode"), ROUTING_MODES)
    max_experts = c.integer(m["max_experts"], (*k, "max_experts"))
    if max_experts < 1 or max_experts > MAX_EXPERTS_LIMIT or max_experts & (max_experts - 1):
        raise c.fail((*k, "max_experts"),
                     f"{max_experts} is not allowed; must be a power of two from 1 to "
                     f"{MAX_EXPERTS_LIMIT} (the routing top-k uses a bitonic network)")
    top_k = c.integer(m["top_k"], (*k, "top_k"), lo=1, hi=TOP_K_LIMIT)
    if top_k > max_experts:
        raise c.fail((*k, "top_k"), f"{top_k} is larger than colibri.max_experts "
                                    f"({max_experts}); allowed: 1..{max_experts}")
    return ColibriSpec(embed_pad=embed_pad, stream_count=stream_count,
                       routing_mode=routing_mode, top_k=top_k, max_experts=max_experts)


def _tune(c: _Checker, v: Any, k: tuple[str, ...]) -> TuneSpec:
    m = c.mapping(v, k, ("nvpmodel_mode", "jetson_clocks", "cpu_governor", "gpu_governor"))
    return TuneSpec(
        nvpmodel_mode=_nvpmodel_mode(c, m["nvpmodel_mode"], (*k, "nvpmodel_mode")),
        jetson_clocks=c.typed(m["jetson_clocks"], (*k, "jetson_clocks"), bool, "true or false"),
        cpu_governor=c.string(m["cpu_governor"], (*k, "cpu_governor"), _GOVERNOR_RE,
                              "a governor name such as performance ([a-z0-9_]+)"),
        gpu_governor=c.string(m["gpu_governor"], (*k, "gpu_governor"), _GOVERNOR_RE,
                              "a governor name such as performance ([a-z0-9_]+)"),
    )


_MODE_HELP = ("a mode name such as MAXN or 15W ([A-Za-z0-9_]+), a list of names in order of "
              "preference such as [MAXN_SUPER, MAXN], or max / min")


def _nvpmodel_mode(c: _Checker, v: Any, k: tuple[str, ...]) -> str | tuple[str, ...]:
    if isinstance(v, list):
        if not v:
            raise c.fail(k, f"an empty list; expected {_MODE_HELP}")
        return tuple(c.string(x, (*k, str(i)), _NVPMODEL_RE, _MODE_HELP) for i, x in enumerate(v))
    return c.string(v, k, _NVPMODEL_RE, _MODE_HELP)


def _l4t_range(c: _Checker, v: Any, k: tuple[str, ...]) -> str:
    from colibri_kit.jetson import JetsonError, parse_l4t_range
    text = c.string(v, k, None, 'an L4T range such as "R36.3–R36.4.x" or "R35.x"')
    try:
        parse_l4t_range(text)
    except JetsonError as exc:
        raise c.fail(k, str(exc)) from None
    return text


def _smoke(c: _Checker, v: Any, k: tuple[str, ...]) -> SmokeSpec:
    m = c.mapping(v, k, ("max_first_token_ms_p99",), ("prompt_ids", "greedy_tokens"))
    limit = c.typed(m["max_first_token_ms_p99"], (*k, "max_first_token_ms_p99"),
                    (int, float), "a number of milliseconds")
    if not limit > 0:
        raise c.fail((*k, "max_first_token_ms_p99"), f"{limit} is not allowed; must be > 0")
    ids = c.typed(m.get("prompt_ids", [1, 2, 3, 4]), (*k, "prompt_ids"), list,
                  "a list of token ids")
    if not ids:
        raise c.fail((*k, "prompt_ids"), "empty list; give at least one token id")
    for i, tok in enumerate(ids):
        c.integer(tok, (*k, "prompt_ids", str(i)), lo=0)
    greedy = c.integer(m.get("greedy_tokens", 8), (*k, "greedy_tokens"), lo=1, hi=4096)
    return SmokeSpec(max_first_token_ms_p99=float(limit), prompt_ids=tuple(ids),
                     greedy_tokens=greedy)


# --------------------------------------------------------------------------- canonical form


def _resolved_dict(p: Profile) -> dict[str, Any]:
    return {
        "name": p.name,
        "description": p.description,
        "arch": p.arch,
        "glibc": p.glibc,
        "cpu": {"mcpu": p.cpu_mcpu},
        "jetpack": p.jetpack,
        "l4t": p.l4t,
        **({"l4t_range": p.l4t_range} if p.l4t_range else {}),
        "device": None if p.device is None else
        {"soc": p.device.soc, "model_pattern": p.device.model_pattern},
        "cuda": None if p.cuda is None else
        {"version": p.cuda.version, "archs": list(p.cuda.archs), "igpu": p.cuda.igpu,
         # only when set: the default keeps every existing profile's hash
         **({"spills": p.cuda.spills} if p.cuda.spills != "warn" else {}),
         **({"compat_driver": True} if p.cuda.compat_driver else {})},
        "colibri": {"embed_pad": p.colibri.embed_pad, "stream_count": p.colibri.stream_count,
                    "routing_mode": p.colibri.routing_mode, "top_k": p.colibri.top_k,
                    "max_experts": p.colibri.max_experts},
        "tune": None if p.tune is None else
        {"nvpmodel_mode": (p.tune.nvpmodel_mode if isinstance(p.tune.nvpmodel_mode, str)
                           else list(p.tune.nvpmodel_mode)), "jetson_clocks": p.tune.jetson_clocks,
         "cpu_governor": p.tune.cpu_governor, "gpu_governor": p.tune.gpu_governor},
        "smoke": {"max_first_token_ms_p99": p.smoke.max_first_token_ms_p99,
                  "prompt_ids": list(p.smoke.prompt_ids),
                  "greedy_tokens": p.smoke.greedy_tokens},
        "service": None if p.service is None else service_dict(p.service),
    }


def _canonical_json(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def _show(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return repr(value) if isinstance(value, str) else str(value)


def _tname(value: Any) -> str:
    return {bool: "boolean", int: "integer", float: "number", str: "string", list: "list",
            dict: "mapping", type(None): "null"}.get(type(value), type(value).__name__)
