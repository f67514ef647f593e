"""The device's ``colibri serve`` systemd unit: a typed spec, the profile's ``service:`` section,
the rendered unit file, its system user, and ``systemd-analyze verify``.

Every value that reaches the unit file is checked here: a newline would start a new directive, a
``%`` is a systemd specifier, a space splits ``ExecStart=`` arguments. So ports, counts and nice
are integers in range, CPU lists and sizes match strict patterns, paths are absolute and made of
``[A-Za-z0-9._/-]`` without ``..`` components, and names are plain identifiers.

The unit runs ``<root>/current/bin/colibri serve <root>/current/model.colibri`` (docs/fleet.md,
"What deploy does": ``current -> releases/<id>``, and each release holds ``model.colibri ->
../../models/<sha256>.colibri``), so one atomic switch of ``current`` changes binary and model
together and a rollback restores both. See docs/service.md.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import re
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable

import jinja2

from colibri_kit import paths
from colibri_kit.errors import KitError, ProfileError

UNIT_NAME = "colibri.service"
DEFAULT_ROOT = "/opt/colibri"
BACKENDS = ("auto", "cpu", "cuda")
KV_CACHES = ("f32", "f16")  # colibri serve --kv-cache (runtime/include/colibri.h colibri_kv_dtype)
SECTION_KEYS = ("port", "bind", "slots", "threads", "cpu_affinity", "nice", "memory_max",
                "api_key_file", "max_queue", "backend", "user", "groups", "restart_sec",
                "drain_timeout_s", "model_id", "kv_cache", "deadline_ms", "warm_prompts",
                "prompt_rows")
# service.warm_prompts (colibri serve --warm-prompts-b64, runtime/serve/warm.h): prompts computed
# at start-up into the prefix cache. Each is ("system", TEXT): a chat system prompt, or
# ("prompt", TEXT): a completion prompt's text. The limits are colibri serve's (SERVE_MAX_WARM)
# and keep the unit's command line far below systemd's line limit.
WARM_KINDS = ("system", "prompt")
MAX_WARM_PROMPTS = 16
MAX_WARM_BYTES = 64 * 1024       # all texts together, UTF-8
SCHED_POLICIES = ("other", "fifo", "rr")
BARRIERS = ("spin", "sleep")

# Used with fullmatch only: `$` in re.match would also accept a trailing newline.
_PATH_RE = re.compile(r"^/[A-Za-z0-9._/-]*$")
_NAME_RE = re.compile(r"^[a-z_][a-z0-9_-]{0,31}$")   # a POSIX-ish system user/group name
_CPU_ITEM_RE = re.compile(r"^(\d{1,4})(?:-(\d{1,4}))?$")
_MODEL_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_SIZE_RE = re.compile(r"^(?:[1-9]\d{0,15}[KMGT]?|(?:100|[1-9]\d?)%|infinity)$")
MAX_CPU = 1023
# Hidden or replaced for the service by ProtectHome=, PrivateTmp= and the kernel filesystems.
HIDDEN_FROM_SERVICE = ("/home", "/root", "/run/user", "/tmp", "/var/tmp", "/proc", "/sys", "/dev")

# The Jetson GPU device nodes the CUDA backend may open: the unit's device allow-list
# (DevicePolicy=closed + DeviceAllow=). Source: the device nodes NVIDIA's container runtime hands a
# GPU container on L4T, /etc/nvidia-container-runtime/host-files-for-container.d/devices.csv of
# JetPack 6/7 (as carried by OE4T meta-tegra, recipes-bsp/tegra-binaries/tegra-configs/devices.csv)
# and l4t.csv of JetPack 4/5 (recipes-containers/nvidia-container-runtime/.../l4t.csv), keeping
# the GPU's own nodes and leaving out display (fb, dri, tegra_dc), codecs (nvdec, nvenc, vic,
# msenc, nvjpg, v4l2-*), DLA/PVA and cameras. JetPack's 99-tegra-devices.rules give them to group
# video (hence SupplementaryGroups=video). A node missing on a module (nvgpu/ before JetPack 6,
# nvhost-* on Thor's OpenRM driver, which uses /dev/nvidia*) is skipped by systemd.
JETSON_GPU_NODES = (
    "/dev/nvmap", "/dev/nvhost-ctrl", "/dev/host1x-fence", "/dev/nvsciipc",
    "/dev/nvhost-as-gpu", "/dev/nvhost-ctrl-gpu", "/dev/nvhost-ctxsw-gpu", "/dev/nvhost-dbg-gpu",
    "/dev/nvhost-gpu", "/dev/nvhost-nvsched-gpu", "/dev/nvhost-power-gpu", "/dev/nvhost-prof-ctx-gpu",
    "/dev/nvhost-prof-dev-gpu", "/dev/nvhost-prof-gpu", "/dev/nvhost-sched-gpu", "/dev/nvhost-tsg-gpu",
    *(f"/dev/nvgpu/igpu0/{n}" for n in ("as", "channel", "ctrl", "ctxsw", "dbg", "nvsched", "power",
                                          "prof", "prof-ctx", "prof-dev", "sched", "tsg")),
    "/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
)


class ServiceError(KitError):
    """A service setting is invalid, or the rendered unit does not verify."""


@dataclass(frozen=True)
class RealtimeOptions:
    """The runtime half of a profile's ``realtime:`` section, as the service runs it
    (docs/runtime.md, "Real-time mode"): the worker threads of slot i pinned to the i-th run of
    ``threads`` CPUs of ``cpus``, in order; their scheduling policy; memory locked at init; how
    they wait at the pool's barriers."""

    cpus: tuple[int, ...]
    policy: str = "other"
    priority: int = 0
    lock_memory: bool = False
    barrier: str = "sleep"


@dataclass(frozen=True)
class ServiceSpec:
    """What the unit needs. ``root`` is the device install root (per fleet, not per profile)."""

    port: int = 8080
    bind: str = "127.0.0.1"
    slots: int = 1
    threads: int | None = None             # compute threads (the CPU batch engine's; per slot on
                                           # CUDA); None: serve picks (online CPUs)
    cpu_affinity: str | None = None        # normalised systemd list, e.g. "2-5 7"
    nice: int = 0
    memory_max: str | None = None          # e.g. "6G", "80%"
    api_key_file: str | None = None        # root-only file on the device; passed as a credential
    max_queue: int = 16
    backend: str = "auto"
    user: str = "colibri"
    groups: tuple[str, ...] = ("video",)   # Jetson GPU nodes (/dev/nvhost-*, /dev/nvmap) are group video
    restart_sec: float = 2.0
    drain_timeout_s: int = 30
    model_id: str | None = None            # name in the API; default: serve's (file name: "model")
    kv_cache: str = "f32"                  # f16: half the KV memory (CPU and CUDA backends)
    warm_prompts: tuple[tuple[str, str], ...] = ()  # ((kind, text), ...): WARM_KINDS
    start_limit_burst: int = 5
    start_limit_interval_s: int = 60
    root: str = DEFAULT_ROOT
    deadline_ms: int | None = None         # serve's --deadline-ms: a request's default deadline
    prompt_rows: int | None = None         # serve's --prompt-rows: prompts' rows a step while a
                                           # request decodes (None: no cap)
    realtime: RealtimeOptions | None = None  # from the profile's realtime section

    def __post_init__(self) -> None:
        check_spec(self)

    @property
    def loopback(self) -> bool:
        return self.bind == "localhost" or ipaddress.ip_address(self.bind).is_loopback

    @property
    def health_url(self) -> str:
        """Where the device itself asks for /health (the deploy's gate runs curl on the device)."""
        host = {"0.0.0.0": "127.0.0.1", "localhost": "127.0.0.1", "::": "::1"}.get(self.bind, self.bind)
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}/health"

    def with_root(self, root: str) -> "ServiceSpec":
        """The same settings for a fleet whose install root is ``root`` (validated)."""
        return replace(self, root=root)

    def serve_args(self) -> list[str]:
        """``colibri serve`` options after ``MODEL`` (all values already validated)."""
        args = ["--host", self.bind, "--port", str(self.port), "--slots", str(self.slots),
                "--max-queue", str(self.max_queue), "--backend", self.backend,
                "--drain-timeout", str(self.drain_timeout_s * 1000)]
        if self.threads_per_slot is not None:
            args += ["--threads", str(self.threads_per_slot)]
        if self.model_id is not None:
            args += ["--model-id", self.model_id]
        if self.api_key_file:
            args += ["--api-key-file", "%d/api-key"]
        if self.kv_cache != "f32":  # only when set, so existing units stay byte for byte the same
            args += ["--kv-cache", self.kv_cache]
        if self.deadline_ms is not None:
            args += ["--deadline-ms", str(self.deadline_ms)]
        if self.prompt_rows is not None:
            args += ["--prompt-rows", str(self.prompt_rows)]
        rt = self.realtime
        if rt is not None:
            args += ["--cpus", ",".join(map(str, rt.cpus))]
            if rt.policy != "other":
                args += ["--sched", f"{rt.policy}:{rt.priority}"]
            if rt.lock_memory:
                args.append("--mlock")
            if rt.barrier != "sleep":
                args += ["--barrier", rt.barrier]
        if self.warm_prompts:
            args += ["--warm-prompts-b64", warm_prompts_b64(self.warm_prompts)]
        return args

    @property
    def threads_per_slot(self) -> int | None:
        """--threads: the given value, or with realtime cpus, the CPUs each slot gets."""
        if self.threads is None and self.realtime is not None:
            return len(self.realtime.cpus) // self.slots
        return self.threads


def warm_prompts_b64(warm: tuple[tuple[str, str], ...]) -> str:
    """What `colibri serve --warm-prompts-b64` takes: base64 (RFC 4648, padded) of the JSON list
    [{"system": TEXT} | {"prompt": TEXT}, ...]. A unit's ExecStart cannot carry arbitrary text
    (spaces split arguments, '%' and '$' are expanded, a newline ends the line); base64's
    alphabet has none of those, so the texts arrive byte for byte whatever they hold."""
    doc = json.dumps([{kind: text} for kind, text in warm], ensure_ascii=False, separators=(",", ":"))
    return base64.b64encode(doc.encode()).decode("ascii")


def parse_warm_prompts(value: Any) -> tuple[tuple[str, str], ...]:
    """A profile's service.warm_prompts: a list whose items are a system prompt's text, or a
    mapping with one key, ``system`` or ``prompt``, and its text."""
    if not isinstance(value, list):
        raise ServiceError(f"expected a list of system prompts (text) or {{prompt: TEXT}} "
                           f"mappings, got {value!r}")
    out = []
    for i, item in enumerate(value):
        if isinstance(item, str):
            item = {"system": item}
        if not isinstance(item, dict) or len(item) != 1 or next(iter(item)) not in WARM_KINDS:
            raise ServiceError(f"item {i}: {item!r} is not allowed; give a system prompt's text, "
                               f"or a mapping with one key, system or prompt")
        kind, text = next(iter(item.items()))
        out.append((kind, text))
    warm = tuple(out)
    check_warm(warm)
    return warm


def check_warm(warm: Any) -> None:
    """Raise ServiceError (without the field's name) for warm prompts serve would refuse."""
    if not isinstance(warm, tuple):
        raise ServiceError(f"{warm!r} must be a tuple of (kind, text) pairs")
    if len(warm) > MAX_WARM_PROMPTS:
        raise ServiceError(f"{len(warm)} prompts; at most {MAX_WARM_PROMPTS}")
    total = 0
    for i, pair in enumerate(warm):
        if not (isinstance(pair, tuple) and len(pair) == 2 and pair[0] in WARM_KINDS
                and isinstance(pair[1], str) and pair[1]):
            raise ServiceError(f"item {i}: {pair!r} is not allowed; a non-empty text of kind "
                               f"{' or '.join(WARM_KINDS)}")
        if "\0" in pair[1]:
            raise ServiceError(f"item {i}: a NUL character is not allowed")
        total += len(pair[1].encode("utf-8", "surrogatepass"))
    if total > MAX_WARM_BYTES:
        raise ServiceError(f"{total} bytes of text; at most {MAX_WARM_BYTES} in all")


# --------------------------------------------------------------------------- validation

Fail = Callable[[tuple[str, ...], str], Exception]


def _default_fail(kpath: tuple[str, ...], msg: str) -> Exception:
    return ProfileError(f"{'.'.join(kpath)}: {msg}")


def check_path(value: Any, what: str) -> str:
    """An absolute path safe inside a unit file and a shell: ``[A-Za-z0-9._/-]``, no ``..``."""
    if not isinstance(value, str) or not _PATH_RE.fullmatch(value) or len(value) > 255:
        raise ServiceError(f"{what}: {value!r} is not allowed; give an absolute path of letters, "
                           f"digits and ._/- (no spaces, quotes, '%' or newlines)")
    parts = value.split("/")
    if ".." in parts or "." in parts or "//" in value or (value != "/" and value.endswith("/")):
        raise ServiceError(f"{what}: {value!r} must be a normalised absolute path "
                           f"(no '.', '..', '//' or trailing '/')")
    return value


def parse_cpu_list(value: Any) -> str:
    """``"0-3,6"``, ``"0-3 6"``, ``[0, 1, 2]`` or ``5`` -> systemd's ``"0-3 6"`` form."""
    if isinstance(value, bool):
        raise ServiceError(f"{value!r} is not a CPU list")
    if isinstance(value, int):
        items = [str(value)]
    elif isinstance(value, list):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise ServiceError(f"{value!r} is not a CPU list; a list must hold CPU numbers")
        items = [str(v) for v in value]
    elif isinstance(value, str):
        items = [p for p in re.split(r"[ ,]+", value.strip()) if p]
    else:
        raise ServiceError(f"{value!r} is not a CPU list")
    if not items:
        raise ServiceError("empty CPU list")
    out = []
    for item in items:
        m = _CPU_ITEM_RE.fullmatch(item)
        if not m:
            raise ServiceError(f"{item!r} in {value!r} is not a CPU number or range such as 2-5")
        lo = int(m.group(1))
        hi = int(m.group(2)) if m.group(2) is not None else lo
        if hi < lo or hi > MAX_CPU:
            raise ServiceError(f"{item!r} in {value!r} is not a range of CPUs 0..{MAX_CPU}")
        out.append(f"{lo}-{hi}" if hi != lo else str(lo))
    return " ".join(out)


def cpus_of(cpu_list: str) -> list[int]:
    """``"0-2 5"`` -> ``[0, 1, 2, 5]``."""
    cpus: set[int] = set()
    for item in cpu_list.split():
        lo, _, hi = item.partition("-")
        cpus.update(range(int(lo), int(hi or lo) + 1))
    return sorted(cpus)


def check_realtime(s: ServiceSpec) -> None:
    """The realtime options against the rest of the service: every slot gets the same number
    of CPUs (one thread each), inside cpu_affinity when one is set."""
    rt = s.realtime
    assert rt is not None
    if not isinstance(rt.cpus, tuple) or not rt.cpus or any(
            isinstance(c, bool) or not isinstance(c, int) or not 0 <= c <= MAX_CPU for c in rt.cpus) \
            or len(set(rt.cpus)) != len(rt.cpus):
        raise ServiceError(f"realtime.cpus: {rt.cpus!r} is not a list of distinct CPUs 0..{MAX_CPU}")
    if rt.policy not in SCHED_POLICIES:
        raise ServiceError(f"realtime.policy: {rt.policy!r} is not one of {', '.join(SCHED_POLICIES)}")
    if (rt.policy == "other") != (rt.priority == 0) or not 0 <= rt.priority <= 99 or \
            isinstance(rt.priority, bool):
        raise ServiceError(f"realtime.priority: {rt.priority!r} is not allowed with policy "
                           f"{rt.policy} (1..99 with fifo or rr, 0 with other)")
    if rt.barrier not in BARRIERS:
        raise ServiceError(f"realtime.barrier: {rt.barrier!r} is not one of {', '.join(BARRIERS)}")
    if not isinstance(rt.lock_memory, bool):
        raise ServiceError(f"realtime.lock_memory: {rt.lock_memory!r} is not true or false")
    n = len(rt.cpus)
    if s.threads is None and n % s.slots:
        raise ServiceError(f"slots: {s.slots} slots cannot share realtime.cpus ({n} CPUs) evenly; "
                           f"give a number of CPUs that is a multiple of the slots")
    if s.threads is not None and s.threads * s.slots != n:
        raise ServiceError(f"threads: {s.slots} slots x {s.threads} threads need {s.slots * s.threads} "
                           f"realtime.cpus, the profile gives {n}; drop service.threads (it is "
                           f"then {n} / slots) or match them")
    if s.cpu_affinity is not None:
        outside = [c for c in rt.cpus if c not in cpus_of(s.cpu_affinity)]
        if outside:
            raise ServiceError(f"cpu_affinity: {s.cpu_affinity!r} leaves out realtime CPU(s) "
                               f"{', '.join(map(str, outside))}; the workers run there")


def check_spec(s: ServiceSpec) -> None:
    """Raise ServiceError naming the field for any value that must not reach the unit."""
    def integer(name: str, v: Any, lo: int, hi: int) -> None:
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise ServiceError(f"{name}: {v!r} is not allowed; an integer {lo}..{hi}")

    integer("port", s.port, 1, 65535)
    integer("slots", s.slots, 1, 64)
    if s.threads is not None:
        integer("threads", s.threads, 1, 64)
    integer("nice", s.nice, -20, 19)
    integer("max_queue", s.max_queue, 0, 4096)
    integer("drain_timeout_s", s.drain_timeout_s, 0, 3600)
    integer("start_limit_burst", s.start_limit_burst, 1, 100)
    integer("start_limit_interval_s", s.start_limit_interval_s, 1, 86400)
    if isinstance(s.restart_sec, bool) or not isinstance(s.restart_sec, (int, float)) \
            or not 0.1 <= s.restart_sec <= 600:
        raise ServiceError(f"restart_sec: {s.restart_sec!r} is not allowed; seconds 0.1..600")
    if not isinstance(s.bind, str):
        raise ServiceError(f"bind: {s.bind!r} is not an IP address")
    if s.bind != "localhost":
        try:
            ipaddress.ip_address(s.bind)
        except ValueError:
            raise ServiceError(f"bind: {s.bind!r} is not allowed; an IP address such as 127.0.0.1, "
                               f"0.0.0.0 or ::1, or localhost") from None
        if "%" in s.bind:
            raise ServiceError(f"bind: {s.bind!r}: scoped addresses are not supported")
    if s.cpu_affinity is not None:
        try:
            ok = isinstance(s.cpu_affinity, str) and parse_cpu_list(s.cpu_affinity) == s.cpu_affinity
        except ServiceError as exc:
            raise ServiceError(f"cpu_affinity: {exc}") from None
        if not ok:
            raise ServiceError(f"cpu_affinity: {s.cpu_affinity!r} is not a normalised CPU list "
                               f"such as '0-3 6' (parse_cpu_list makes one)")
    if s.memory_max is not None and (not isinstance(s.memory_max, str)
                                     or not _SIZE_RE.fullmatch(s.memory_max)):
        raise ServiceError(f"memory_max: {s.memory_max!r} is not allowed; a size such as 512M, 6G, "
                           f"a percentage of RAM such as 80%, or infinity")
    if s.api_key_file is not None:
        check_path(s.api_key_file, "api_key_file")
    if not s.loopback and s.api_key_file is None:
        raise ServiceError(f"bind: {s.bind} is reachable beyond the device; set api_key_file too "
                           f"(colibri serve refuses to listen there without a key)")
    if s.backend not in BACKENDS:
        raise ServiceError(f"backend: {s.backend!r} is not one of {', '.join(BACKENDS)}")
    if s.kv_cache not in KV_CACHES:
        raise ServiceError(f"kv_cache: {s.kv_cache!r} is not one of {', '.join(KV_CACHES)}")
    try:
        check_warm(s.warm_prompts)
    except ServiceError as exc:
        raise ServiceError(f"warm_prompts: {exc}") from None
    if not isinstance(s.user, str) or not _NAME_RE.fullmatch(s.user) or s.user == "root":
        raise ServiceError(f"user: {s.user!r} is not allowed; a system user name such as colibri "
                           f"(lowercase letters, digits, _ and -; not root)")
    if not isinstance(s.groups, tuple):
        raise ServiceError(f"groups: {s.groups!r} must be a tuple of group names")
    for g in s.groups:
        if not isinstance(g, str) or not _NAME_RE.fullmatch(g) or g == "root":
            raise ServiceError(f"groups: {g!r} is not allowed; a group name such as video")
    if s.model_id is not None and (not isinstance(s.model_id, str)
                                   or not _MODEL_ID_RE.fullmatch(s.model_id)):
        raise ServiceError(f"model_id: {s.model_id!r} is not allowed; 1..100 of letters, digits "
                           f"and ._- starting with a letter or digit")
    if s.deadline_ms is not None:
        integer("deadline_ms", s.deadline_ms, 1, 86_400_000)
    if s.prompt_rows is not None:
        integer("prompt_rows", s.prompt_rows, 1, 512)  # a pass's rows (runtime COLIBRI_CHUNK)
    if s.realtime is not None:
        check_realtime(s)
    check_path(s.root, "root")
    if s.root == "/":
        raise ServiceError("root: '/' is not allowed; the install root is a directory such as /opt/colibri")
    for hidden in HIDDEN_FROM_SERVICE:
        if s.root == hidden or s.root.startswith(hidden + "/"):
            raise ServiceError(f"root: {s.root} is under {hidden}, which the unit's hardening "
                               f"(ProtectHome, PrivateTmp, ...) hides from the service; use a "
                               f"directory such as /opt/colibri")


def parse_service(raw: Any, kpath: tuple[str, ...] = ("service",), *, root: str = DEFAULT_ROOT,
                  fail: Fail = _default_fail) -> ServiceSpec:
    """A profile's ``service:`` mapping -> ServiceSpec. ``fail(kpath, message)`` builds the error
    (profiles.py passes its checker's, which names the file that set the value)."""
    if not isinstance(raw, dict):
        raise fail(kpath, f"expected a mapping with keys {', '.join(SECTION_KEYS)}, got {raw!r}")
    for key in raw:
        if key not in SECTION_KEYS:
            raise fail((*kpath, str(key)), f"unknown key {str(key)!r}; allowed keys: "
                                           f"{', '.join(SECTION_KEYS)}")
    kw: dict[str, Any] = {"root": root}
    for key, value in raw.items():
        k = (*kpath, key)
        if value is None and key in ("threads", "cpu_affinity", "memory_max", "api_key_file",
                                     "model_id", "prompt_rows"):
            continue
        try:
            if key == "cpu_affinity":
                value = parse_cpu_list(value)
            elif key == "memory_max" and isinstance(value, int) and not isinstance(value, bool):
                value = str(value)                       # bytes, as systemd reads a bare number
            elif key == "groups":
                if not isinstance(value, list):
                    raise ServiceError(f"expected a list of group names such as [video], got {value!r}")
                value = tuple(value)
            elif key == "warm_prompts":
                value = parse_warm_prompts(value)
            kw[key] = value
        except ServiceError as exc:
            raise fail(k, str(exc)) from None
    try:
        return ServiceSpec(**kw)
    except ServiceError as exc:  # every message starts with the field it is about
        key, _, msg = str(exc).partition(": ")
        raise fail((*kpath, key) if key in SECTION_KEYS else kpath, msg or str(exc)) from None


def service_dict(spec: ServiceSpec) -> dict[str, Any]:
    """The profile-level fields as plain data (for a profile's canonical form and hash)."""
    return {"port": spec.port, "bind": spec.bind, "slots": spec.slots, "threads": spec.threads,
            "cpu_affinity": spec.cpu_affinity, "nice": spec.nice, "memory_max": spec.memory_max,
            "api_key_file": spec.api_key_file, "max_queue": spec.max_queue,
            "backend": spec.backend, "user": spec.user, "groups": list(spec.groups),
            "restart_sec": spec.restart_sec, "drain_timeout_s": spec.drain_timeout_s,
            "model_id": spec.model_id,
            # only when set: profiles without them keep their hash (and their builds)
            **({"kv_cache": spec.kv_cache} if spec.kv_cache != "f32" else {}),
            **({"deadline_ms": spec.deadline_ms} if spec.deadline_ms is not None else {}),
            **({"prompt_rows": spec.prompt_rows} if spec.prompt_rows is not None else {}),
            **({"warm_prompts": [{k: t} for k, t in spec.warm_prompts]} if spec.warm_prompts else {})}


# --------------------------------------------------------------------------- rendering


@dataclass(frozen=True)
class Privileges:
    """What the service may do beyond an ordinary user; the unit renders exactly this.

    Nothing by default. A port below 1024 needs CAP_NET_BIND_SERVICE. The real-time mode (the
    profile's ``realtime:`` section) adds exactly what its options need, and no capability:

    * ``cpus`` (threads pinned): ``sched_setaffinity`` back in the system-call filter (it is in
      ``@resources``, which the unit denies);
    * ``policy`` fifo/rr: ``RestrictRealtime=no``, ``LimitRTPRIO=<priority>`` and
      ``sched_setscheduler``/``sched_setparam``. An unprivileged process may take SCHED_FIFO/RR up
      to its RLIMIT_RTPRIO (sched(7), "Privileges and resource limits"), so CAP_SYS_NICE, which
      would also let it renice or re-prioritise any process of the system, is not given;
    * ``lock_memory``: ``LimitMEMLOCK=infinity`` (mlock needs no capability within the limit;
      ``mlock`` is in ``@system-service``'s ``@memlock``), not CAP_IPC_LOCK."""

    capabilities: tuple[str, ...] = ()
    limits: tuple[tuple[str, str], ...] = ()
    realtime: bool = False
    syscall_deny: tuple[str, ...] = ("@privileged", "@resources")
    syscall_allow: tuple[str, ...] = ()     # allowed again after the deny list


def unit_privileges(spec: ServiceSpec) -> Privileges:
    caps = ("CAP_NET_BIND_SERVICE",) if spec.port < 1024 else ()
    rt = spec.realtime
    if rt is None:
        return Privileges(capabilities=caps)
    limits: list[tuple[str, str]] = []
    allow = ["sched_setaffinity"]
    if rt.policy != "other":
        limits.append(("LimitRTPRIO", str(rt.priority)))
        allow += ["sched_setparam", "sched_setscheduler"]
    if rt.lock_memory:
        limits.append(("LimitMEMLOCK", "infinity"))
    return Privileges(capabilities=caps, limits=tuple(limits), realtime=rt.policy != "other",
                      syscall_allow=tuple(allow))


def gpu_nodes(spec: ServiceSpec) -> tuple[str, ...]:
    """The device nodes the unit allows besides the pseudo devices: the GPU's, unless the
    service runs on the CPU only."""
    return () if spec.backend == "cpu" else JETSON_GPU_NODES


def _environment(templates_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(templates_dir)),
                              undefined=jinja2.StrictUndefined, trim_blocks=True,
                              lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)


def render_unit(spec: ServiceSpec, *, target: str = "host", templates_dir: Path | None = None) -> str:
    """The unit file text for ``spec`` (deterministic)."""
    check_spec(spec)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", target):
        raise ServiceError(f"target name {target!r} is not valid")
    env = _environment(Path(templates_dir) if templates_dir else paths.templates_dir())
    try:
        text = env.get_template("colibri.service.j2").render(
            spec=spec, args=spec.serve_args(), target=target, unit_name=UNIT_NAME,
            priv=unit_privileges(spec), gpu_nodes=gpu_nodes(spec))
    except jinja2.TemplateNotFound:
        raise ServiceError("templates/colibri.service.j2 not found") from None
    return text


def render_sysusers(spec: ServiceSpec) -> str:
    """``/etc/sysusers.d/colibri.conf``: the service's system user (no login, no home)."""
    check_spec(spec)
    return (f"# Colibri inference service user (rendered by the Colibri kit)\n"
            f"u {spec.user} - \"Colibri inference service\" /nonexistent /usr/sbin/nologin\n")


SYSUSERS_PATH = "/etc/sysusers.d/colibri.conf"


def unit_path(unit: str = UNIT_NAME) -> str:
    return f"/etc/systemd/system/{unit}"


def device_files(spec: ServiceSpec, *, target: str = "host", unit: str = UNIT_NAME) -> dict[str, str]:
    """The files a deploy writes on the device (root-owned, mode 0644): the verified unit and
    the service user's sysusers.d entry."""
    text = render_unit(spec, target=target)
    verify_unit(text, name=unit)
    return {SYSUSERS_PATH: render_sysusers(spec), unit_path(unit): text}


def install_commands(unit: str = UNIT_NAME, *, enable: bool = True) -> list[list[str]]:
    """What a deploy runs as root after writing ``device_files``: create the user, reload,
    enable at boot. (Starting or restarting is the deploy's switch step.)"""
    cmds = [["systemd-sysusers", SYSUSERS_PATH], ["systemctl", "daemon-reload"]]
    if enable:
        cmds.append(["systemctl", "enable", unit])
    return cmds


def verify_unit(text: str, *, name: str = UNIT_NAME) -> str:
    """Run ``systemd-analyze verify`` on the unit text; return its output, raise on findings.

    The unit is checked inside a scratch root (``--root``) that holds this machine's vendor units
    (the targets it names must exist) and an executable stand-in at its ``ExecStart`` path, so
    the check is about the unit, not about which release this machine happens to have."""
    tool = shutil.which("systemd-analyze")
    if tool is None:
        raise ServiceError("systemd-analyze not found: apt-get install systemd")
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*\.service", name):
        raise ServiceError(f"unit name {name!r} is not valid")
    with tempfile.TemporaryDirectory(prefix="colibri-unit-") as tmp:
        root = _scratch_root(Path(tmp) / "root", text)
        unit_dir = root / "etc/systemd/system"
        unit_dir.mkdir(parents=True, exist_ok=True)
        (unit_dir / name).write_text(text)
        proc = subprocess.run([tool, "verify", "--man=no", f"--root={root}",
                               f"/etc/systemd/system/{name}"],
                              capture_output=True, text=True, timeout=60)
    out = (proc.stdout + proc.stderr).strip()
    if proc.returncode != 0 or out:
        raise ServiceError(f"{name} does not verify (systemd-analyze verify): "
                           f"{out or f'exit status {proc.returncode}'}")
    return out


def _scratch_root(root: Path, text: str) -> Path:
    """A root with this machine's vendor units (the targets the unit names must exist) and an
    executable stand-in at the ExecStart path."""
    vendor = Path("/usr/lib/systemd/system")
    if vendor.is_dir():
        shutil.copytree(vendor, root / "usr/lib/systemd/system", symlinks=True)
    for line in text.splitlines():
        if line.startswith("ExecStart="):
            exe = line.split("=", 1)[1].split()[0].lstrip("-@:+!")
            stand_in = root / exe.lstrip("/")
            stand_in.parent.mkdir(parents=True, exist_ok=True)
            stand_in.write_text("#!/bin/sh\nexit 0\n")
            stand_in.chmod(0o755)
    return root


# --------------------------------------------------------------------------- the health gate

Run = Callable[[list[str]], "tuple[int, str]"]

# Runs on the device as root: reads the key file itself so the key never appears in an argv
# (printf is a shell builtin; curl reads the header from stdin). Values arrive as $1..$3.
_COMPLETION_SH = (
    'if [ -n "$1" ]; then key=$(head -n 1 -- "$1") && '
    'printf "Authorization: Bearer %s\\n" "$key" | curl -sS --max-time 20 -H @- '
    '-H "Content-Type: application/json" -d "$3" -- "$2"; '
    'else curl -sS --max-time 20 -H "Content-Type: application/json" -d "$3" -- "$2"; fi'
)


@dataclass(frozen=True)
class GateResult:
    ok: bool
    state: str          # "healthy" | "failed" (systemd gave up) | "timeout"
    waited_s: float
    detail: str         # for the deploy table: the last answer or the journal's last lines


def health_gate(run: Run, spec: ServiceSpec, *, unit: str = UNIT_NAME, timeout: float = 60.0,
                poll: float = 0.5, clock: Callable[[], float] | None = None,
                sleep: Callable[[float], None] | None = None) -> GateResult:
    """Wait until the service on a device is healthy: ``/health`` answers 200 and a one-token
    completion answers. Gives up at once when systemd marks the unit failed (start limit hit),
    or after ``timeout``. ``run(argv) -> (exit status, stdout)`` runs as root on the device
    (the deploy passes its remote; the emulation tests pass SystemdDevice.run)."""
    clock = clock or time.monotonic
    sleep = sleep or time.sleep
    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*\.service", unit):
        raise ServiceError(f"unit name {unit!r} is not valid")
    url = spec.health_url
    body = json.dumps({"model": spec.model_id or "model", "prompt": [1], "max_tokens": 1,
                       "temperature": 0})
    start = clock()
    detail = ""
    while True:
        _, state = run(["systemctl", "is-failed", unit])
        if state.strip() == "failed":
            _, log = run(["journalctl", "-u", unit, "-n", "30", "--no-pager", "-o", "cat"])
            lines = log.strip().splitlines()
            own = [l for l in lines if l.startswith("colibri serve:")]   # the service's reason
            return GateResult(False, "failed", clock() - start,
                              own[-1] if own else "\n".join(lines[-2:]) or "unit failed")
        _, code = run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2",
                       "--", url])
        code = code.strip()
        detail = f"/health {code or 'no answer'}"
        if code == "200":
            rc, out = run(["sh", "-c", _COMPLETION_SH, "sh", spec.api_key_file or "",
                           url.rsplit("/", 1)[0] + "/v1/completions", body])
            try:
                answer = json.loads(out) if rc == 0 else {}
            except ValueError:
                answer = {}
            if isinstance(answer, dict) and answer.get("choices"):
                return GateResult(True, "healthy", clock() - start, "/health 200, completion answered")
            detail = f"/health 200 but the completion failed: {out.strip()[:200]}"
        if clock() - start >= timeout:
            return GateResult(False, "timeout", clock() - start, detail)
        sleep(poll)
