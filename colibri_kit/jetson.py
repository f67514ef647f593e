"""What a real Jetson says about itself, and the rules NVIDIA's own tools follow.

Pure functions over the text a device gives (``/etc/nvpmodel.conf``, ``nvpmodel -q`` and
``nvpmodel -p --verbose`` output, ``/etc/nv_tegra_release``, the devicetree ``model`` and
``compatible``, ``/proc/meminfo``); no I/O, no global state, so fleet code calls them on what it
read over SSH and tests call them on strings copied from real devices. docs/jetson-facts.md states
every rule with its source; the comments here name the source next to the code.

Rules in this module:

* nvpmodel.conf / ``nvpmodel -p --verbose`` parsing (``parse_nvpmodel_conf``,
  ``parse_nvpmodel_verbose``) and ``nvpmodel -q`` parsing (``parse_nvpmodel_query``).
* "reboot required" between two modes (``reboot_required``): their ``TPC_PG_MASK`` differ.
* modes by intent (``resolve_mode``): a name, names in order of preference, ``max`` or ``min``.
* L4T releases (``parse_l4t_release``) and accepted ranges (``parse_l4t_range``).
* CUDA driver versus a build (``check_cuda_driver``).
* SKU identity (``identify_sku``) from devicetree model + compatible + MemTotal + CPU count.
* ``clean`` strips control characters from any device-provided string before it is printed.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from colibri_kit.errors import KitError


class JetsonError(KitError):
    """A device's answer cannot be parsed, or it does not satisfy what the profile asks."""


# ----------------------------------------------------------------------------- device strings

# CSI/OSC escape sequences as a terminal would act on them (ECMA-48): drop the whole sequence so
# no "[31m" residue is left behind, then drop every remaining control or format character.
_ESCAPE_RE = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def clean(text: str | bytes, limit: int = 200) -> str:
    """A device-provided string made safe to print: no escape sequences, no control characters
    (C0, DEL, C1: each becomes a space, so devicetree NULs separate words), no bidirectional or
    other format characters (Unicode category Cf), whitespace runs collapsed, at most ``limit``
    characters (an ellipsis marks a cut)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8", "replace")
    text = _ESCAPE_RE.sub("", text)
    kept = []
    for ch in text:
        cat = unicodedata.category(ch)
        if cat == "Cc":
            kept.append(" ")
        elif cat in ("Cf", "Cs", "Co", "Cn"):
            continue
        else:
            kept.append(ch)
    out = " ".join("".join(kept).split())
    if len(out) > limit:
        out = out[: max(0, limit - 1)] + "…"
    return out


# ----------------------------------------------------------------------------- nvpmodel

@dataclass(frozen=True)
class PowerMode:
    """One ``< POWER_MODEL ID=n NAME=x >`` block of an nvpmodel conf."""

    id: int
    name: str
    params: tuple[tuple[str, str, str], ...] = ()   # (PARAM, ARG, VALUE) lines, in file order

    def param(self, name: str, arg: str) -> str | None:
        for p, a, v in self.params:
            if p == name and a == arg:
                return v
        return None

    @property
    def tpc_pg_mask(self) -> str | None:
        """The GPU TPC power-gating mask the mode writes, or None when the mode sets none."""
        return self.param("TPC_POWER_GATING", "TPC_PG_MASK")

    @property
    def cpus_online(self) -> int | None:
        flags = [v for p, _a, v in self.params if p == "CPU_ONLINE"]
        return sum(1 for v in flags if v == "1") if flags else None

    @property
    def watts(self) -> int | None:
        """The power budget the NAME states (``15W``, ``MODE_30W``, ``7W_AI`` -> 15, 30, 7), or
        None when the name states none (``MAXN``, ``MAXN_SUPER``, custom names)."""
        m = re.search(r"(?:^|_)(\d+)W(?:_|$)", self.name)
        return int(m.group(1)) if m else None

    @property
    def unconstrained(self) -> bool:
        """MAXN / MAXN_SUPER: NVIDIA's modes without a power budget (the highest of a conf)."""
        return self.name in ("MAXN", "MAXN_SUPER")


@dataclass(frozen=True)
class NvpConf:
    """The power modes of a device and its boot default (``< PM_CONFIG DEFAULT=n >``)."""

    modes: tuple[PowerMode, ...]
    default_id: int | None = None

    def by_id(self, mode_id: int) -> PowerMode:
        for m in self.modes:
            if m.id == mode_id:
                return m
        raise JetsonError(f"nvpmodel has no mode id {mode_id} (ids: {self.ids_text()})")

    def by_name(self, name: str) -> PowerMode | None:
        for m in self.modes:
            if m.name == name:
                return m
        return None

    def names(self) -> list[str]:
        return [m.name for m in self.modes]

    def ids_text(self) -> str:
        return ", ".join(f"{m.id} {m.name}" for m in self.modes)


_BLOCK_RE = re.compile(r"^<\s*(\w+)\s*(.*?)\s*>$")
_ATTR_RE = re.compile(r"(\w+)\s*=\s*([^\s>]+)")


def parse_nvpmodel_conf(text: str) -> NvpConf:
    """Parse an ``/etc/nvpmodel.conf`` (L4T format: ``< PARAM ... >`` definitions,
    ``< POWER_MODEL ID=n NAME=x >`` blocks of ``PARAM ARG VALUE`` lines, ``< PM_CONFIG
    DEFAULT=n >``). Lines under a PARAM definition (``MAX_FREQ /sys/...``) are not mode lines."""
    modes: list[PowerMode] = []
    default: int | None = None
    cur: dict | None = None

    def close() -> None:
        if cur is not None:
            modes.append(PowerMode(cur["id"], cur["name"], tuple(cur["params"])))

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = _BLOCK_RE.match(line)
        if m:
            close()
            cur = None
            kind, attrs = m.group(1), dict(_ATTR_RE.findall(m.group(2)))
            if kind == "POWER_MODEL":
                if "ID" not in attrs or "NAME" not in attrs or not attrs["ID"].isdigit():
                    raise JetsonError(f"nvpmodel.conf line {lineno}: POWER_MODEL needs ID=<n> "
                                      f"NAME=<name>: {clean(raw)!r}")
                cur = {"id": int(attrs["ID"]), "name": attrs["NAME"], "params": []}
            elif kind == "PM_CONFIG":
                if not attrs.get("DEFAULT", "").isdigit():
                    raise JetsonError(f"nvpmodel.conf line {lineno}: PM_CONFIG needs "
                                      f"DEFAULT=<id>: {clean(raw)!r}")
                default = int(attrs["DEFAULT"])
            continue
        if line.startswith("<"):
            continue  # "< /POWER_MODEL >" closers some hand-written confs carry
        if cur is not None:
            parts = line.split()
            if len(parts) == 3:
                cur["params"].append((parts[0], parts[1], parts[2]))
    close()
    return _checked(NvpConf(tuple(modes), default), "nvpmodel.conf")


# `nvpmodel -p --verbose` (jetson_stats tests/nvpmodel, a captured AGX Orin JP5 output):
#   NVPM VERB: PM_CONFIG: DEFAULT=MODE_30W(2)
#   NVPM VERB: POWER_MODEL: ID=0 NAME=MAXN
#   NVPM VERB: TPC_POWER_GATING TPC_PG_MASK 0
_VERB_DEFAULT_RE = re.compile(r"PM_CONFIG: DEFAULT=(\w+)\((\d+)\)")
_VERB_MODEL_RE = re.compile(r"POWER_MODEL: ID=(\d+) NAME=(\w+)")
_VERB_LINE_RE = re.compile(r"^NVPM VERB: (\w+) (\w+) (\S+)$")


def parse_nvpmodel_verbose(text: str) -> NvpConf:
    """Parse ``nvpmodel -p --verbose`` output: the modes with their parameter lines and the
    default (``PM_CONFIG: DEFAULT=NAME(id)``). Parameter definitions (``NVPM VERB: MAX_FREQ
    /sys/...``, two fields) are skipped; -1 ("no cap") prints as 2147483647 there."""
    modes: list[PowerMode] = []
    default: int | None = None
    cur: dict | None = None
    for raw in text.splitlines():
        line = raw.strip()
        m = _VERB_DEFAULT_RE.search(line)
        if m:
            default = int(m.group(2))
            continue
        m = _VERB_MODEL_RE.search(line)
        if m:
            if cur is not None:
                modes.append(PowerMode(cur["id"], cur["name"], tuple(cur["params"])))
            cur = {"id": int(m.group(1)), "name": m.group(2), "params": []}
            continue
        m = _VERB_LINE_RE.match(line)
        if m and cur is not None:
            cur["params"].append((m.group(1), m.group(2), m.group(3)))
    if cur is not None:
        modes.append(PowerMode(cur["id"], cur["name"], tuple(cur["params"])))
    return _checked(NvpConf(tuple(modes), default), "nvpmodel -p --verbose output")


def _checked(conf: NvpConf, what: str) -> NvpConf:
    if not conf.modes:
        raise JetsonError(f"{what}: no POWER_MODEL found")
    ids = [m.id for m in conf.modes]
    if len(set(ids)) != len(ids):
        raise JetsonError(f"{what}: duplicate POWER_MODEL ids {sorted(ids)}")
    names = [m.name for m in conf.modes]
    if len(set(names)) != len(names):
        raise JetsonError(f"{what}: duplicate POWER_MODEL names {sorted(names)}")
    if conf.default_id is not None and conf.default_id not in ids:
        raise JetsonError(f"{what}: PM_CONFIG DEFAULT={conf.default_id} is not a mode id "
                          f"({', '.join(map(str, ids))})")
    return conf


# `nvpmodel -q` prints "NV Power Mode: NAME" and the id on the next line; warnings may come first
# ("NVPM WARN: fan mode is not set!"), and with --verbose the line reads
# "NVPM VERB: Current mode: NV Power Mode: NAME".
_QUERY_RE = re.compile(r"NV Power Mode: (\w+)\s*$")


def parse_nvpmodel_query(text: str) -> tuple[str, int]:
    """``(name, id)`` from ``nvpmodel -q [--verbose]`` output."""
    lines = [ln.strip() for ln in text.splitlines()]
    for i, line in enumerate(lines):
        m = _QUERY_RE.search(line)
        if not m:
            continue
        for nxt in lines[i + 1:]:
            if nxt.isdigit():
                return m.group(1), int(nxt)
            if nxt:
                break
        raise JetsonError(f"nvpmodel -q: no mode id after {clean(line)!r}")
    raise JetsonError(f"nvpmodel -q: no 'NV Power Mode:' line in {clean(text)!r}")


def reboot_required(conf: NvpConf, current_id: int, target_id: int,
                    live_mask: str | None = None) -> bool:
    """Whether nvpmodel asks for a reboot to go from ``current_id`` to ``target_id``.

    The rule (jetson_stats ``nvpmodel.py``: a mode is switchable live when its TPC_PG_MASK
    equals the current mode's; NVIDIA's nvpmodel prints "Reboot required for changing to this
    power mode" exactly for the switches whose masks differ on Orin NX 15W -> MAXN, 240 vs 252,
    and AGX Orin MODE_30W -> MAXN, 0 vs 240): the GPU's TPC power-gating mask is applied at boot,
    so a switch that changes it needs a reboot. Modes that set no mask (Orin Nano, the L4T 32
    confs) never need one for this reason.

    ``live_mask`` is what the GPU runs now (``/sys/devices/platform/gpu.0/tpc_pg_mask``) when the
    caller read it; it wins over the current mode's mask, which differs from it while an accepted
    switch waits for its reboot (see ``reboot_pending``)."""
    old = (live_mask or "").strip() or conf.by_id(current_id).tpc_pg_mask
    new = conf.by_id(target_id).tpc_pg_mask
    if old is None or new is None:
        return False
    return _mask_value(old) != _mask_value(new)


def reboot_pending(conf: NvpConf, current_id: int, live_mask: str | None) -> bool:
    """True when nvpmodel already records ``current_id`` (its status file, what ``nvpmodel -q``
    prints) but the GPU still runs another mask: the switch was accepted and the device has not
    rebooted yet."""
    want = conf.by_id(current_id).tpc_pg_mask
    if not live_mask or not live_mask.strip() or want is None:
        return False
    return _mask_value(live_mask.strip()) != _mask_value(want)


def _mask_value(text: str) -> int | str:
    try:
        return int(text, 0)
    except ValueError:
        return text


# ----------------------------------------------------------------------------- modes by intent

@dataclass(frozen=True)
class Resolution:
    mode: PowerMode
    reason: str      # one line for the plan: why this mode was chosen


def _power_key(m: PowerMode) -> tuple[int, int, int]:
    """Order of "power" within one conf: MAXN/MAXN_SUPER above every budget, then the watts the
    name states, then more CPUs online (Xavier NX has MODE_20W_2CORE/4CORE/6CORE)."""
    return (1 if m.unconstrained else 0, m.watts or 0, m.cpus_online or 0)


def rankable(m: PowerMode) -> bool:
    return m.unconstrained or m.watts is not None


def resolve_mode(conf: NvpConf, intent: str | Sequence[str]) -> Resolution:
    """The device mode a profile's ``nvpmodel_mode`` asks for.

    ``intent`` is a mode NAME (``MAXN``), a list of names in order of preference
    (``[MAXN_SUPER, MAXN]``: the first the device has), or ``max`` / ``min``: the highest / lowest
    power mode of this device's conf. "Power" is what the conf states, nothing measured: MAXN and
    MAXN_SUPER (no budget) rank highest, then the wattage in the name (``25W``, ``MODE_30W``,
    ``7W_AI``), then the number of CPUs the mode keeps online; remaining ties go to the lowest id.
    Modes whose name states no power (custom names) are never chosen by max/min."""
    if isinstance(intent, str):
        if intent in ("max", "min"):
            return _resolve_extreme(conf, intent)
        choices = [intent]
    else:
        choices = list(intent)
        if not choices or not all(isinstance(c, str) and c for c in choices):
            raise JetsonError(f"nvpmodel_mode list must hold mode names, got {choices!r}")
    for i, name in enumerate(choices):
        if name in ("max", "min"):
            return _resolve_extreme(conf, name)
        mode = conf.by_name(name)
        if mode is not None:
            why = f"{name} is mode {mode.id}"
            if i:
                why += f" ({', '.join(choices[:i])} not on this device)"
            return Resolution(mode, why)
    raise JetsonError(f"no mode named {' or '.join(choices)} on this device (it has: "
                      f"{conf.ids_text()}); name one of them, or use max/min")


def _resolve_extreme(conf: NvpConf, which: str) -> Resolution:
    ranked = [m for m in conf.modes if rankable(m)]
    if not ranked:
        raise JetsonError(f"cannot tell the {which} mode: no mode name states a power budget "
                          f"or MAXN ({conf.ids_text()}); name the mode instead")
    if which == "max":
        best = sorted(ranked, key=lambda m: (_power_key(m), -m.id))[-1]
        why = ("max: " + (f"{best.name} has no power budget" if best.unconstrained
                          else f"{best.name} states the highest budget ({best.watts} W)"))
    else:
        best = sorted(ranked, key=lambda m: (_power_key(m), m.id))[0]
        why = f"min: {best.name} states the lowest budget ({best.watts} W)"
    return Resolution(best, f"{why}, mode {best.id}")


@dataclass(frozen=True)
class ModePlan:
    """What ``tune`` should do about the power mode of one device."""

    current: PowerMode
    target: PowerMode
    reason: str          # why this target (``Resolution.reason``)
    change: bool         # target differs from the current mode (or a reboot is still pending)
    reboot: bool         # nvpmodel will ask for a reboot (masks differ)
    pending: bool        # an accepted switch to ``current`` still waits for its reboot


def plan_mode(conf: NvpConf, current_id: int, intent: str | Sequence[str],
              live_mask: str | None = None) -> ModePlan:
    """The power-mode step of a tune plan: which mode ``intent`` means on this device, whether
    it is a change, and whether nvpmodel will ask for a reboot (``reboot_required`` against the
    GPU's live mask when given). A device whose status already names the target but still runs
    another mask is ``pending``: it needs the reboot, not another ``nvpmodel -m``."""
    res = resolve_mode(conf, intent)
    current = conf.by_id(current_id)
    pending = reboot_pending(conf, current_id, live_mask)
    if res.mode.id == current_id:
        return ModePlan(current, res.mode, res.reason, pending, pending, pending)
    return ModePlan(current, res.mode, res.reason, True,
                    reboot_required(conf, current_id, res.mode.id, live_mask), pending)


# ----------------------------------------------------------------------------- L4T releases

@dataclass(frozen=True, order=True)
class L4TVersion:
    major: int
    minor: int
    patch: int = 0

    def __str__(self) -> str:
        return f"R{self.major}.{self.minor}.{self.patch}"


# "# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, DATE: ..."
_RELEASE_RE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*(\d+)(?:\.(\d+))?")


def parse_l4t_release(text: str) -> L4TVersion:
    """The L4T version from ``/etc/nv_tegra_release`` (its first line)."""
    m = _RELEASE_RE.search(text)
    if not m:
        raise JetsonError(f"/etc/nv_tegra_release: no '# R<n> (release), REVISION: <x.y>' line "
                          f"in {clean(text)!r}")
    return L4TVersion(int(m.group(1)), int(m.group(2)), int(m.group(3) or 0))


@dataclass(frozen=True)
class L4TRange:
    """Accepted L4T releases: ``low <= v < high`` (high exclusive), and the text it came from."""

    low: L4TVersion
    high: L4TVersion
    text: str

    def __contains__(self, v: L4TVersion) -> bool:
        return self.low <= v < self.high


_BOUND_RE = re.compile(r"R(\d+)(?:\.(\d+|x))?(?:\.(\d+|x))?")   # fullmatch


def _bound(text: str, upper: bool) -> L4TVersion:
    m = _BOUND_RE.fullmatch(text.strip())
    if not m:
        raise JetsonError(f"bad L4T bound {text!r}: write R<major>[.<minor>[.<patch>]], "
                          f"'x' for any (e.g. R36.3, R36.4.x, R39.x)")
    major = int(m.group(1))
    parts = [p for p in (m.group(2), m.group(3)) if p is not None]
    if "x" in parts[:-1]:
        raise JetsonError(f"bad L4T bound {text!r}: only the last part may be 'x'")
    fixed = [int(p) for p in parts if p != "x"]
    if not upper:
        fixed += [0] * (2 - len(fixed))
        return L4TVersion(major, fixed[0], fixed[1])
    # Upper bounds are inclusive in the text: R36.4.x -> < R36.5.0, R39.x -> < R40.0.0,
    # R36.4.3 -> < R36.4.4, R36.4 -> < R36.5.0.
    if not fixed:
        return L4TVersion(major + 1, 0, 0)
    if len(fixed) == 1:
        return L4TVersion(major, fixed[0] + 1, 0)
    return L4TVersion(major, fixed[0], fixed[1] + 1)


def parse_l4t_range(text: str) -> L4TRange:
    """``"R36.3–R36.4.x"`` (en dash or hyphen between two bounds) or one bound (``"R36.4.x"``,
    ``"R35.x"``). Both ends are inclusive as written: R38.2–R39.x accepts 38.2.0 up to every
    39.*; R36.3–R36.4.x accepts 36.3.0 up to every 36.4.*."""
    parts = re.split(r"\s*(?:–|—|-|\.\.)\s*(?=R)", text.strip())
    if len(parts) == 1:
        low, high = _bound(parts[0], False), _bound(parts[0], True)
    elif len(parts) == 2:
        low, high = _bound(parts[0], False), _bound(parts[1], True)
    else:
        raise JetsonError(f"bad L4T range {text!r}: write LOW–HIGH, e.g. R36.3–R36.4.x")
    if not low < high:
        raise JetsonError(f"bad L4T range {text!r}: the low end is above the high end")
    return L4TRange(low, high, text.strip())


def check_l4t(version: L4TVersion, accepted: L4TRange, target: str = "the target") -> None:
    """Refuse a device outside the profile's accepted range, naming both."""
    if version not in accepted:
        raise JetsonError(f"device runs L4T {version}, outside {target}'s accepted range "
                          f"{accepted.text}: reflash it to a release in range, or deploy a "
                          f"target built for {version}")


# JetPack release for an L4T release (NVIDIA's Jetson Linux / JetPack archive pages).
JETPACK_BY_L4T: tuple[tuple[L4TVersion, str], ...] = (
    (L4TVersion(35, 2, 1), "5.1"), (L4TVersion(35, 3, 1), "5.1.1"),
    (L4TVersion(35, 4, 1), "5.1.2"), (L4TVersion(35, 5, 0), "5.1.3"),
    (L4TVersion(35, 6, 0), "5.1.4"), (L4TVersion(36, 3, 0), "6.0"),
    (L4TVersion(36, 4, 0), "6.1"), (L4TVersion(36, 4, 3), "6.2"),
    (L4TVersion(36, 4, 4), "6.2.1"), (L4TVersion(38, 2, 0), "7.0"),
    (L4TVersion(38, 4, 0), "7.1"), (L4TVersion(39, 0, 0), "7.2"),
)


def jetpack_for(version: L4TVersion) -> str | None:
    """The JetPack a stock image of this L4T belongs to (the newest entry not above it, within
    the same L4T major), or None when unknown."""
    found = None
    for v, jp in JETPACK_BY_L4T:
        if v.major == version.major and v <= version:
            found = jp
    return found


# ----------------------------------------------------------------------------- CUDA driver

@dataclass(frozen=True, order=True)
class CudaVersion:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"

    @classmethod
    def parse(cls, text: str | int) -> "CudaVersion":
        """``"11.4"``, ``"12.6.68"`` or the integer ``cuDriverGetVersion`` returns (11040)."""
        if isinstance(text, int) or str(text).isdigit():
            n = int(text)
            return cls(n // 1000, (n % 1000) // 10)
        m = re.match(r"^\s*(\d+)\.(\d+)", str(text))
        if not m:
            raise JetsonError(f"bad CUDA version {text!r}: expected e.g. 11.4 or 11040")
        return cls(int(m.group(1)), int(m.group(2)))


# The CUDA version whose driver first loads each PTX ISA version: NVIDIA's PTX ISA release
# history (the table cuda-python's cuda/bindings/utils/_ptx_utils.py carries). A driver JIT-
# compiles PTX of its own ISA or older only: CUDA 11.4 -> 7.4, 11.8 -> 7.8, 12.6 -> 8.5 (12.6
# has no ISA of its own: 8.5 is 12.5's, 8.6 is 12.7's), 13.0 -> 9.0.
PTX_ISA_FIRST_CUDA: dict[str, CudaVersion] = {
    "7.0": CudaVersion(11, 0), "7.1": CudaVersion(11, 1), "7.2": CudaVersion(11, 2),
    "7.3": CudaVersion(11, 3), "7.4": CudaVersion(11, 4), "7.5": CudaVersion(11, 5),
    "7.6": CudaVersion(11, 6), "7.7": CudaVersion(11, 7), "7.8": CudaVersion(11, 8),
    "8.0": CudaVersion(12, 0), "8.1": CudaVersion(12, 1), "8.2": CudaVersion(12, 2),
    "8.3": CudaVersion(12, 3), "8.4": CudaVersion(12, 4), "8.5": CudaVersion(12, 5),
    "8.6": CudaVersion(12, 7), "8.7": CudaVersion(12, 8), "8.8": CudaVersion(12, 9),
    "9.0": CudaVersion(13, 0), "9.1": CudaVersion(13, 1),
}

# The CUDA driver a stock image ships (it is part of the L4T BSP, not of the toolkit: NVIDIA's
# "Simplifying CUDA Upgrades for NVIDIA Jetson Users"): JetPack 5.1.x 11.4, JetPack 6.0 12.2,
# JetPack 6.1/6.2 12.6, JetPack 7 13.0. A newer driver needs NVIDIA's cuda-compat package.
STOCK_DRIVER_BY_L4T: tuple[tuple[L4TVersion, CudaVersion], ...] = (
    (L4TVersion(35, 0, 0), CudaVersion(11, 4)),
    (L4TVersion(36, 0, 0), CudaVersion(12, 2)),
    (L4TVersion(36, 4, 0), CudaVersion(12, 6)),
    (L4TVersion(38, 0, 0), CudaVersion(13, 0)),
)


def stock_driver_for(version: L4TVersion) -> CudaVersion | None:
    found = None
    for v, cuda in STOCK_DRIVER_BY_L4T:
        if v.major == version.major and v <= version:
            found = cuda
    return found


def ptx_isa_of(ptx_text: str) -> str:
    """The ``.version X.Y`` a PTX file declares."""
    m = re.search(r"^\s*\.version\s+(\d+\.\d+)", ptx_text, re.M)
    if not m:
        raise JetsonError("PTX has no '.version X.Y' directive")
    return m.group(1)


@dataclass(frozen=True)
class DriverVerdict:
    runs: bool                    # the device's driver can run this build's kernels
    how: str                      # "cubin", "ptx-jit" or "" (cannot)
    message: str                  # one line for status/deploy
    notes: tuple[str, ...] = field(default=())


def check_cuda_driver(driver: CudaVersion, build_cuda: CudaVersion, device_sm: str,
                      cubin_sms: Iterable[str], ptx_isa: str | None) -> DriverVerdict:
    """Can a device whose CUDA driver is ``driver`` run a build made with ``build_cuda``?

    The rule, for Jetson (the driver is part of the L4T BSP): a cubin for the device's SM loads
    when the build's CUDA is not newer than the driver (major.minor); the kit does not rely on
    minor-version compatibility, which NVIDIA does not promise for Jetson's BSP driver (JetPack
    5.1.x + CUDA 11.8 needs the cuda-compat upgrade package). Otherwise the driver JIT-compiles
    the embedded PTX when the PTX ISA is one it knows (``PTX_ISA_FIRST_CUDA``): ISA 7.8 (CUDA
    11.8) is not JIT-compiled by an 11.4 driver (ISA 7.4), which is why a stock JetPack 5.1.x
    device cannot run an xavier-nx build made with CUDA 11.8."""
    sms = sorted(set(cubin_sms))
    if device_sm in sms and build_cuda <= driver:
        return DriverVerdict(True, "cubin", f"{device_sm} cubin (CUDA {build_cuda}) loads on the "
                             f"CUDA {driver} driver")
    notes = []
    if device_sm in sms:
        notes.append(f"the {device_sm} cubin needs a CUDA {build_cuda} driver, the device has "
                     f"{driver}")
    else:
        notes.append(f"no {device_sm} cubin in the build (it has {', '.join(sms) or 'none'})")
    if ptx_isa is not None:
        first = PTX_ISA_FIRST_CUDA.get(ptx_isa)
        if first is None:
            notes.append(f"PTX ISA {ptx_isa} is not in the kit's table")
        elif first <= driver:
            return DriverVerdict(True, "ptx-jit", f"PTX ISA {ptx_isa} is JIT-compiled by the CUDA "
                                 f"{driver} driver ({'; '.join(notes)})", tuple(notes))
        else:
            notes.append(f"PTX ISA {ptx_isa} needs a CUDA {first} driver")
    else:
        notes.append("the build embeds no PTX")
    return DriverVerdict(False, "", f"the device's CUDA {driver} driver cannot run this build: "
                         f"{'; '.join(notes)}. Build with CUDA {driver} or older for this device, "
                         f"or install NVIDIA's cuda-compat package for CUDA {build_cuda} on it",
                         tuple(notes))


# ----------------------------------------------------------------------------- SKU identity

@dataclass(frozen=True)
class Sku:
    key: str            # "orin-nx-16gb", "orin-nano-8gb", "agx-orin-64gb", "xavier-nx", "agx-thor"
    family: str         # "orin-nx", "orin-nano", "agx-orin", "xavier-nx", "agx-xavier", "agx-thor"
    soc: str            # "tegra234"
    memory_gb: int      # nominal module memory
    cpus: int
    super_mode: bool    # devicetree model ends in " Super" (JetPack 6.2 super confs)
    model: str          # the devicetree model string, cleaned for printing
    carrier: str        # "nvidia" for NVIDIA's developer kits, "third-party" otherwise


# Nominal module memories: MemTotal is below them (firmware carve-outs); an 8 GB module reports
# ~7.4 GiB (7620000 kB seen on an Orin Nano 8GB), a 16 GB one ~15.3 GiB.
_NOMINAL_GB = (4, 8, 16, 32, 64, 128)

# (family, SoC, CPU counts the family ships with, memories it ships with). Module part numbers in
# compatible (p3767-0000 Orin NX 16GB, -0001 NX 8GB, -0003/-0005 Nano 8GB, -0004 Nano 4GB; p3701
# AGX Orin; p3668 Xavier NX; p2888 AGX Xavier; p3834 Thor) pick the family first; the model string
# and the CPU count next (custom carriers report their own model strings).
_FAMILIES: dict[str, tuple[str, tuple[int, ...], tuple[int, ...]]] = {
    "orin-nx": ("tegra234", (6, 8), (8, 16)),
    "orin-nano": ("tegra234", (6,), (4, 8)),
    "agx-orin": ("tegra234", (8, 12), (32, 64)),
    "xavier-nx": ("tegra194", (6,), (8, 16)),
    "agx-xavier": ("tegra194", (8,), (16, 32, 64)),
    "agx-thor": ("tegra264", (12, 14), (64, 128)),
}
_PART_FAMILY = {
    "p3767-0000": "orin-nx", "p3767-0001": "orin-nx", "p3767-0003": "orin-nano",
    "p3767-0004": "orin-nano", "p3767-0005": "orin-nano", "p3701": "agx-orin",
    "p3668": "xavier-nx", "p2888": "agx-xavier", "p3834": "agx-thor",
}


# GPU devfreq nodes, found as jtop finds them: by the device's of_node name (JetPack 5 Orin
# 17000000.ga10b, JetPack 6 17000000.gpu, Xavier 17000000.gv11b, Thor gpu-gpc-0 and gpu-nvd-0, all
# GPU devices); by node name when the tree has no of_node.
GPU_OF_NODE_NAMES = frozenset({"gv11b", "gp10b", "ga10b", "gb10b", "gpu"})
_GPU_NODE_RE = re.compile(r"(?:[0-9a-f]+\.(?:gpu|gv11b|ga10b|gp10b|gb10b)|gpu-(?:gpc|nvd)-\d+)")


def gpu_devfreq_nodes(nodes: dict[str, str | None]) -> list[str]:
    """The GPU domains among ``/sys/class/devfreq`` nodes, given as {node name: its
    ``device/of_node/name`` (None when absent)}. Thor returns both of its domains."""
    out = []
    for node, of_name in sorted(nodes.items()):
        name = (of_name or "").replace("\0", "").strip()
        is_gpu = name in GPU_OF_NODE_NAMES if name else bool(_GPU_NODE_RE.fullmatch(node))
        if is_gpu:
            out.append(node)
    return out


def parse_meminfo(text: str) -> dict[str, int]:
    """``/proc/meminfo`` as {field: kB}."""
    out = {}
    for line in text.splitlines():
        m = re.match(r"^(\w+(?:\(\w+\))?):\s+(\d+)(?:\s*kB)?\s*$", line)
        if m:
            out[m.group(1)] = int(m.group(2))
    return out


def check_footprint(parts: dict[str, int], meminfo: dict[str, int], device: str = "device") -> int:
    """Refuse a model whose footprint does not fit. ``parts`` names its bytes (weights, arena,
    KV cache at the context length, ...). On a Jetson the GPU shares DRAM with the CPU, so every
    part counts against the same memory; the bound is the kernel's ``MemAvailable`` (its estimate
    of what a new workload can use without swapping, Documentation/filesystems/proc.rst), or
    ``MemTotal`` when an old kernel lacks it. Returns the bytes left."""
    need = sum(parts.values())
    field_ = "MemAvailable" if "MemAvailable" in meminfo else "MemTotal"
    if field_ not in meminfo:
        raise JetsonError(f"{device}: /proc/meminfo has neither MemAvailable nor MemTotal")
    have = meminfo[field_] * 1024
    if need > have:
        detail = ", ".join(f"{k} {_mib(v)}" for k, v in parts.items())
        raise JetsonError(f"{device}: the model needs {_mib(need)} ({detail}) but {field_} is "
                          f"{_mib(have)}; use a smaller model, quantisation or context length, "
                          f"or stop what else runs there")
    return have - need


def _mib(n: int) -> str:
    return f"{n / (1024 * 1024):.0f} MiB"


def parse_meminfo_kb(text: str) -> int:
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", text, re.M)
    if not m:
        raise JetsonError("/proc/meminfo has no 'MemTotal: <n> kB' line")
    return int(m.group(1))


def nominal_memory_gb(memtotal_kb: int) -> int:
    gib = memtotal_kb / (1024 * 1024)
    for n in _NOMINAL_GB:
        if gib <= n:
            return n
    return _NOMINAL_GB[-1]


def identify_sku(model: str | bytes, compatible: str | bytes, memtotal_kb: int,
                 cpus: int) -> Sku:
    """Which Jetson module this is, from the devicetree (``model``, the NUL-separated
    ``compatible`` list), ``MemTotal`` and the CPU count (``/sys/devices/system/cpu/present``).

    Orin NX 8GB and 16GB share one model string (the 16GB has 8 CPUs, the 8GB 6); Orin Nano 8GB
    and 4GB differ only in memory. A third-party carrier board reports its own model string: it
    is accepted when the SoC and a module part number (or the CPU count) name a known family."""
    if isinstance(model, bytes):
        model = model.decode("utf-8", "replace")
    if isinstance(compatible, bytes):
        compatible = compatible.decode("utf-8", "replace")
    shown = clean(model) or "(no devicetree model)"
    compat = [c.strip() for c in compatible.replace("\0", "\n").splitlines() if c.strip()]
    socs = [c.split(",", 1)[1] for c in compat if re.fullmatch(r"nvidia,tegra\d+", c)]
    if not socs:
        raise JetsonError(f"{shown}: not a Jetson (no nvidia,tegraNNN in devicetree compatible "
                          f"{clean(' '.join(compat))!r})")
    soc = socs[0]
    family = None
    for c in compat:
        for part, fam in _PART_FAMILY.items():
            if re.search(rf"\b{part}(?:\b|-)", c):
                family = family or fam
    lowered = model.lower()
    if family is None:
        if "orin nx" in lowered:
            family = "orin-nx"
        elif "orin nano" in lowered:
            family = "orin-nano"
        elif "agx orin" in lowered:
            family = "agx-orin"
        elif "xavier nx" in lowered:
            family = "xavier-nx"
        elif "thor" in lowered:
            family = "agx-thor"
    if family is None:
        by_soc = [f for f, (s, counts, _m) in _FAMILIES.items() if s == soc and cpus in counts]
        if len(by_soc) == 1:
            family = by_soc[0]
        else:
            raise JetsonError(f"{shown}: cannot tell the module ({soc}, {cpus} CPUs, compatible "
                              f"{clean(' '.join(compat))!r}); known families: "
                              f"{', '.join(_FAMILIES)}")
    fam_soc, counts, memories = _FAMILIES[family]
    if soc != fam_soc:
        raise JetsonError(f"{shown}: compatible names {family} but the SoC is {soc}, not "
                          f"{fam_soc}")
    if cpus not in counts:
        raise JetsonError(f"{shown}: {family} modules have {'/'.join(map(str, counts))} CPUs, "
                          f"this device reports {cpus}")
    mem = nominal_memory_gb(memtotal_kb)
    if mem not in memories:
        raise JetsonError(f"{shown}: {family} modules have {'/'.join(map(str, memories))} GB, "
                          f"MemTotal {memtotal_kb} kB is a {mem} GB module")
    if family == "orin-nx" and (mem, cpus) not in ((16, 8), (8, 6)):
        raise JetsonError(f"{shown}: Orin NX 16GB has 8 CPUs and 8GB has 6; this device has "
                          f"{cpus} CPUs and {mem} GB")
    key = family if family in ("xavier-nx", "agx-xavier", "agx-thor") else f"{family}-{mem}gb"
    nvidia_kit = bool(re.match(r"^NVIDIA (Jetson |Orin )", model.strip("\0 ")))
    return Sku(key=key, family=family, soc=soc, memory_gb=mem, cpus=cpus,
               super_mode=model.strip("\0 ").endswith(" Super"), model=shown,
               carrier="nvidia" if nvidia_kit else "third-party")


def parse_cpu_list(text: str) -> int:
    """How many CPUs a kernel CPU list (``/sys/devices/system/cpu/present``: ``0-7``) names."""
    n = 0
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise JetsonError(f"bad CPU list {clean(text)!r}")
        n += int(hi or lo) - int(lo) + 1
    return n
