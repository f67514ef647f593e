"""CPU isolation through the Jetson's boot configuration: ``isolcpus`` (and ``nohz_full`` /
``rcu_nocbs`` where the kernel has them) on the kernel command line, via
``/boot/extlinux/extlinux.conf``; pure parsers apart from the code that acts.

The file's format is what NVIDIA's UEFI L4TLauncher reads (NVIDIA/edk2-nvidia,
Silicon/NVIDIA/Application/L4TLauncher/L4TLauncher.c, ProcessExtLinuxConfig; JetPack 5 and 6
boot through it by default, OE4T meta-tegra wiki "extlinux.conf support"): a ``#`` starts a
comment anywhere; spaces and tabs around a line are dropped; a line starts with a key (TIMEOUT,
DEFAULT, MENU TITLE, LABEL, MENU LABEL, LINUX, INITRD, FDT, OVERLAYS, APPEND; case sensitive);
at most 10 LABELs; the LABEL equal to DEFAULT boots, else the first; its APPEND is the command
line, with ``${cbootargs}`` (and the spaces after it) removed, the platform's own arguments
appended. So the kit edits exactly one line, the APPEND of the entry that boots, token by token,
and leaves every other byte of the file as it was (restore gives the file back byte for byte).

The kernel side (Documentation/admin-guide/kernel-parameters.txt and the code behind it):
``isolcpus=[flag-list,]<cpu-list>`` with flags ``nohz``, ``domain``, ``managed_irq``: the kit
writes ``managed_irq,domain,<cpus>`` (domain: the scheduler leaves the CPUs alone; managed_irq:
kernel-managed IRQs, which userspace cannot move, stay off them where possible); the result is
``/sys/devices/system/cpu/isolated``. ``nohz_full=`` needs CONFIG_NO_HZ_FULL (without it the
kernel says "Housekeeping: nohz unsupported. Build with CONFIG_NO_HZ_FULL" and ignores it) and
shows in ``/sys/devices/system/cpu/nohz_full``, which exists exactly on such kernels; L4T's stock
kernel has ``CONFIG_NO_HZ=y`` only (OE4T/linux-tegra-5.10 arch/arm64/configs/defconfig), so there
the kit writes isolcpus alone and says why. ``rcu_nocbs=`` needs CONFIG_RCU_NOCB_CPU, which
depends on NO_HZ_FULL (or RCU_EXPERT) in these kernels: written together with nohz_full.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from colibri_kit.errors import FleetError
from colibri_kit.fleet.remote import Remote
from colibri_kit.fleet.tune.governors import CPU_DIR, CPU_LIST_RE, parse_cpu_list
from colibri_kit.profiles import cpu_list_text

EXTLINUX = "/boot/extlinux/extlinux.conf"
EXTLINUX_DIR = "/boot/extlinux"
CMDLINE = "/proc/cmdline"
ISOLATED = f"{CPU_DIR}/isolated"
NOHZ_FULL = f"{CPU_DIR}/nohz_full"
PARAMS = ("isolcpus", "nohz_full", "rcu_nocbs")
ISOLCPUS_FLAGS = "managed_irq,domain,"
KEYS = ("TIMEOUT", "DEFAULT", "MENU TITLE", "LABEL", "MENU LABEL", "LINUX", "INITRD", "FDT",
        "OVERLAYS", "APPEND")
MAX_LABELS = 10                 # L4TLauncher.h MAX_EXTLINUX_OPTIONS
MAX_ARGS = 2048 - 256           # arm64 COMMAND_LINE_SIZE, less L4TLauncher's MAX_CBOOTARG_SIZE
MAX_CONF = 64 * 1024
CMD_TIMEOUT = 30.0
# Used with fullmatch only: the tokens the kit writes.
_VALUE_RE = {"isolcpus": re.compile(r"managed_irq,domain," + CPU_LIST_RE.pattern),
             "nohz_full": CPU_LIST_RE, "rcu_nocbs": CPU_LIST_RE}
# A value restore puts back is the user's own, whatever it was: a plain token.
_PLAIN_RE = re.compile(r"[A-Za-z0-9_,.:-]{1,256}")


# --------------------------------------------------------------------------- pure


@dataclass(frozen=True)
class BootEntry:
    label: str
    append_line: int | None      # index of its APPEND line in the file's lines


@dataclass(frozen=True)
class ExtlinuxConf:
    lines: tuple[str, ...]       # with their line endings
    default: str | None
    entries: tuple[BootEntry, ...]

    @property
    def booted(self) -> BootEntry | None:
        """The entry L4TLauncher boots: the LABEL equal to DEFAULT, else the first."""
        for e in self.entries:
            if e.label == self.default:
                return e
        return self.entries[0] if self.entries else None


def _clean(line: str) -> str:
    return line.split("#", 1)[0].strip(" \t\r\n")


def parse_extlinux(text: str) -> ExtlinuxConf:
    """L4TLauncher's reading of the file (see the module)."""
    default = None
    entries: list[list[Any]] = []
    lines = tuple(text.splitlines(keepends=True))
    for i, raw in enumerate(lines):
        line = _clean(raw)
        key = next((k for k in KEYS if line.startswith(k)), None)
        if key == "DEFAULT":
            default = _clean(line[len(key):])
        elif key == "LABEL" and len(entries) < MAX_LABELS:
            entries.append([_clean(line[len(key):]), None])
        elif key == "APPEND" and entries:
            entries[-1][1] = i
    return ExtlinuxConf(lines, default, tuple(BootEntry(lbl, ln) for lbl, ln in entries))


def _split_append(raw: str) -> tuple[str, list[str], str]:
    """An APPEND line -> (everything up to the arguments, the arguments as they are separated
    in the file (tokens and the whitespace between, alternating), everything after them: the
    trailing whitespace, a comment, the line ending)."""
    body, hash_, comment = raw.partition("#")
    end = len(body.rstrip(" \t\r\n"))
    tail = raw[end:]
    head_m = re.match(r"[ \t]*APPEND[ \t]*", body)
    assert head_m is not None
    head = body[:head_m.end()]
    args = body[head_m.end():end]
    return head, re.split(r"([ \t]+)", args) if args else [], tail


def append_args(conf: ExtlinuxConf) -> str:
    """The booted entry's APPEND arguments as the file has them ('' when it has none)."""
    e = conf.booted
    if e is None or e.append_line is None:
        return ""
    _, parts, _ = _split_append(conf.lines[e.append_line])
    return "".join(parts)


def params_of(args: str) -> dict[str, list[str]]:
    """``key=value`` tokens of a command line -> {key: [values in order]}."""
    out: dict[str, list[str]] = {}
    for token in args.split():
        key, eq, value = token.partition("=")
        if eq:
            out.setdefault(key, []).append(value)
    return out


def wanted_params(cpus: list[int] | tuple[int, ...], nohz: bool) -> dict[str, str]:
    """The tokens isolation writes for ``cpus`` (nohz: the kernel has CONFIG_NO_HZ_FULL)."""
    text = cpu_list_text(list(cpus))
    want = {"isolcpus": ISOLCPUS_FLAGS + text}
    if nohz:
        want.update(nohz_full=text, rcu_nocbs=text)
    return want


def edit_append(text: str, values: dict[str, str | None], *, plain: bool = False) -> str:
    """``text`` with the booted entry's APPEND changed: each key of ``values`` set to its value
    (replacing the token in place, or appended after the last argument) or, for None, removed
    (with the whitespace before it). Every other byte stays. A value must be what the kit
    writes (a CPU list), or with ``plain`` (restore: the user's own value back) a plain token.
    Raises FleetError when the file has no entry to boot, no APPEND there, or a key twice (the
    kernel would see both)."""
    conf = parse_extlinux(text)
    e = conf.booted
    if e is None:
        raise FleetError(f"{EXTLINUX} has no LABEL to boot")
    if e.append_line is None:
        raise FleetError(f"{EXTLINUX}: label {e.label!r} (the one that boots) has no APPEND line")
    head, parts, tail = _split_append(conf.lines[e.append_line])
    for key, value in values.items():
        if value is not None and not (_PLAIN_RE if plain else _VALUE_RE[key]).fullmatch(value):
            raise FleetError(f"refusing to write {key}={value!r}: not "
                             + ("a plain value" if plain else "a CPU list"))
        at = [i for i, p in enumerate(parts) if i % 2 == 0 and p.startswith(key + "=")]
        if len(at) > 1:
            raise FleetError(f"{EXTLINUX}: {key}= appears {len(at)} times in the APPEND line of "
                             f"label {e.label!r}; leave one (or none) and run tune again")
        if at and value is not None:
            parts[at[0]] = f"{key}={value}"
        elif at:          # the token goes, with the whitespace before it (after it, when first)
            i = at[0]
            lo, hi = (i - 1, i + 1) if i else (0, 2)
            del parts[lo:hi]
        elif value is not None:
            parts += [" ", f"{key}={value}"] if parts else [f"{key}={value}"]
    args = "".join(parts)
    if len(args) > MAX_ARGS:
        raise FleetError(f"{EXTLINUX}: the APPEND line would be {len(args)} characters; the "
                         f"kernel takes at most {MAX_ARGS} from it")
    lines = list(conf.lines)
    lines[e.append_line] = head + args + tail
    new = "".join(lines)
    # The edited file must read back as the same entries, with the values where they belong.
    again = parse_extlinux(new)
    if [x.label for x in again.entries] != [x.label for x in conf.entries] or again.booted != e:
        raise FleetError(f"{EXTLINUX}: the edit would change which label boots (refused)")
    got = params_of(append_args(again))
    for key, value in values.items():
        read_back = got.get(key, [None])[-1]
        if read_back != value:
            raise FleetError(f"{EXTLINUX}: {key} did not read back after the edit (refused)")
    return new


@dataclass
class BootState:
    """What a device boots with and what it runs (read without changing anything)."""

    conf_text: str | None = None
    conf: ExtlinuxConf | None = None
    cmdline: str = ""
    isolated: list[int] = field(default_factory=list)
    nohz_full: list[int] | None = None     # None: the kernel has no CONFIG_NO_HZ_FULL

    @property
    def running(self) -> dict[str, list[str]]:
        return params_of(self.cmdline)

    @property
    def configured(self) -> dict[str, list[str]]:
        return params_of(append_args(self.conf)) if self.conf else {}


def _cpus(text: str | None) -> list[int]:
    text = (text or "").strip()
    return parse_cpu_list(text) if text else []


def read_boot(remote: Remote) -> BootState:
    st = BootState()
    st.conf_text = remote.read_text(EXTLINUX, sudo=True, max_bytes=MAX_CONF)
    if st.conf_text is not None:
        st.conf = parse_extlinux(st.conf_text)
    st.cmdline = (remote.read_text(CMDLINE) or "").strip()
    st.isolated = _cpus(remote.read_text(ISOLATED))
    nohz = remote.read_text(NOHZ_FULL)
    st.nohz_full = None if nohz is None else _cpus(nohz.replace("(null)", ""))
    return st


@dataclass
class BootPlan:
    wanted: dict[str, str]
    change: bool                 # the file must be written (then a reboot)
    pending: bool                # the file has it, the running kernel does not: a reboot
    new_text: str | None
    notes: list[str]

    @property
    def needs_reboot(self) -> bool:
        return self.change or self.pending


def live(st: BootState, wanted: dict[str, str], cpus: list[int]) -> bool:
    """The running kernel was booted with ``wanted`` and isolates ``cpus``."""
    run = st.running
    ok = all(run.get(k, [None])[-1] == v for k, v in wanted.items()) and st.isolated == sorted(cpus)
    if "nohz_full" in wanted and st.nohz_full is not None:
        ok = ok and st.nohz_full == sorted(cpus)
    return ok


def plan_isolation(st: BootState, cpus: list[int] | tuple[int, ...]) -> BootPlan:
    """What isolating ``cpus`` takes on this device (pure over ``st``)."""
    if st.conf is None or st.conf_text is None:
        raise FleetError(f"{EXTLINUX} not found: this device does not boot through L4TLauncher's "
                         f"extlinux.conf, so the kit cannot isolate CPUs on it")
    nohz = st.nohz_full is not None
    wanted = wanted_params(cpus, nohz)
    notes = []
    if not nohz:
        notes.append("nohz_full and rcu_nocbs not written: this kernel is built without "
                     f"CONFIG_NO_HZ_FULL (no {NOHZ_FULL}; L4T's stock kernel), so it would ignore "
                     "them")
    configured = st.configured
    has = all(configured.get(k, [None])[-1] == v for k, v in wanted.items())
    if live(st, wanted, list(cpus)):
        if not has:
            notes.append(f"the running kernel isolates {cpu_list_text(list(cpus))}, but "
                         f"{EXTLINUX} no longer says so: the next boot would not")
        return BootPlan(wanted, not has, False, None if has else
                        edit_append(st.conf_text, dict(wanted)), notes)
    new = None if has else edit_append(st.conf_text, dict(wanted))
    return BootPlan(wanted, not has, has, new, notes)


def boot_record(st: BootState, wanted: dict[str, str]) -> dict[str, Any]:
    """What restore needs: the label edited, what the kit wrote, what was there before."""
    assert st.conf is not None and st.conf.booted is not None
    before = st.configured
    return {"path": EXTLINUX, "label": st.conf.booted.label, "wrote": dict(wanted),
            "before": {k: (before[k][-1] if k in before else None) for k in wanted}}


def restored_text(text: str, saved: dict[str, Any]) -> tuple[str | None, list[str]]:
    """The file with the kit's tokens taken back (the value each key had before, or none), only
    where the file still has what the kit wrote. (None, notes) when nothing is to be done."""
    conf = parse_extlinux(text)
    notes: list[str] = []
    booted = conf.booted
    if booted is None or booted.label != saved.get("label"):
        notes.append(f"{EXTLINUX} now boots label {booted.label if booted else None!r}, not "
                     f"{saved.get('label')!r}: left as it is")
        return None, notes
    now = params_of(append_args(conf))
    values: dict[str, str | None] = {}
    for key, wrote in dict(saved.get("wrote") or {}).items():
        if key not in PARAMS:
            raise FleetError(f"the saved boot record names {key!r} (corrupt?)")
        if now.get(key, [None])[-1] == wrote:
            before = (saved.get("before") or {}).get(key)
            if before is not None and not (isinstance(before, str) and _PLAIN_RE.fullmatch(before)):
                raise FleetError(f"the saved {key} value {before!r} is not a plain value (corrupt?)")
            values[key] = before
        else:
            notes.append(f"{key} in {EXTLINUX} was changed since tune wrote it: left as it is")
    if not values:
        return None, notes
    return edit_append(text, values, plain=True), notes


# --------------------------------------------------------------------------- device


def _root_only(remote: Remote, path: str) -> None:
    """``path`` belongs to the uid sudo gives and nobody else can write it (else a login that
    can would swap the file between the kit's steps)."""
    uid = remote.run(["id", "-u"], sudo=True, timeout=CMD_TIMEOUT).stdout.strip()
    got = remote.run(["stat", "-c", "%u %a", "--", path], sudo=True, timeout=CMD_TIMEOUT,
                     check=False)
    parts = got.stdout.split()
    if not got.ok or len(parts) != 2 or parts[0] != uid or int(parts[1], 8) & 0o022:
        raise FleetError(f"{remote.name}: {path} is not root's own (owner, mode: "
                         f"{got.stdout.strip() or got.stderr.strip()!r}); refusing to write the "
                         f"boot configuration there")


def write_conf(remote: Remote, text: str, *, expect: str) -> None:
    """Replace /boot/extlinux/extlinux.conf with ``text`` (root, atomically: a temporary file in
    the same root-only directory, flushed to disk, then renamed over it), only if the file still
    holds ``expect`` (what the plan read). The mode is kept."""
    if "\0" in text or len(text.encode()) > MAX_CONF:
        raise FleetError(f"{remote.name}: refusing to write {EXTLINUX}: not a small text file")
    _root_only(remote, EXTLINUX_DIR)
    _root_only(remote, EXTLINUX)
    now = remote.read_text(EXTLINUX, sudo=True, max_bytes=MAX_CONF)
    if now != expect:
        raise FleetError(f"{remote.name}: {EXTLINUX} changed since it was read (by someone "
                         f"else?); nothing written, run tune again")
    mode = remote.run(["stat", "-c", "%a", "--", EXTLINUX], sudo=True,
                      timeout=CMD_TIMEOUT).stdout.strip()
    if not re.fullmatch(r"[0-7]{3,4}", mode):
        raise FleetError(f"{remote.name}: unexpected mode {mode!r} of {EXTLINUX}")
    tmp = f"{EXTLINUX_DIR}/.extlinux.conf.colibri-tune"
    try:
        remote.run(["cp", "--", "/dev/stdin", tmp], sudo=True, timeout=CMD_TIMEOUT,
                   input=text.encode())
        remote.run(["chmod", mode, "--", tmp], sudo=True, timeout=CMD_TIMEOUT)
        remote.run(["sync", "--", tmp], sudo=True, timeout=CMD_TIMEOUT)
        remote.run(["mv", "-f", "--", tmp, EXTLINUX], sudo=True, timeout=CMD_TIMEOUT)
        remote.run(["sync", "--", EXTLINUX_DIR], sudo=True, timeout=CMD_TIMEOUT)
    except FleetError:
        remote.run(["rm", "-f", "--", tmp], sudo=True, timeout=CMD_TIMEOUT, check=False)
        raise
    if remote.read_text(EXTLINUX, sudo=True, max_bytes=MAX_CONF) != text:
        raise FleetError(f"{remote.name}: {EXTLINUX} did not read back as written")
