"""IRQ affinity: move a device's interrupts off the real-time CPUs (pure parsers apart from the
code that acts), and put them back.

The files and their formats (Documentation/core-api/irq/irq-affinity.rst): ``/proc/irq/N/
smp_affinity_list`` is the CPU list an IRQ may be delivered to (``0-7``), ``smp_affinity`` the
same as a hex mask, ``/proc/irq/default_smp_affinity`` the mask every IRQ gets when it is
activated. "It's not allowed to turn off all CPUs, and if an IRQ controller does not support IRQ
affinity then the value will not change from the default of all cpus." A kernel prints a mask
with lib/vsprintf.c's ``%*pb``: 32-bit chunks, most significant first, the first as wide as its
bits need, the others 8 digits (8 CPUs: ``ff``; 12: ``fff``; 40: ``ff,ffffffff``).

Which IRQs are left alone:

* per-CPU interrupts: the GIC's SGIs and PPIs (hardware IRQ numbers below 32: arch_timer, arm-pmu,
  vgic, the KVM timers), and the PPI partitions (chip ``GICv3-N``). One exists on every CPU; the
  kernel refuses to move them (kernel/irq/proc.c write_irq_affinity: ``-EIO`` unless
  ``irq_can_set_affinity_usr``);
* IRQs the kernel refuses when asked (the same ``-EIO``: managed IRQs, whose affinity the kernel
  owns, and controllers that cannot route an IRQ): ``tee`` reports "Input/output error" for that
  file and writes the others; the kit reports them;
* IRQs already off the real-time CPUs.

Every other IRQ gets its list minus the real-time CPUs (all housekeeping CPUs when nothing would
be left). Only ``write_affinity`` writes, and only to paths of the fixed patterns below, values
that are canonical CPU lists of online CPUs or masks of them, on standard input (``tee``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from colibri_kit.errors import FleetError
from colibri_kit.fleet.remote import Remote
from colibri_kit.fleet.tune.governors import CPU_LIST_RE, parse_cpu_list
from colibri_kit.fleet.tune.state import read_files
from colibri_kit.profiles import cpu_list_text

IRQ_DIR = "/proc/irq"
INTERRUPTS = "/proc/interrupts"
DEFAULT_AFFINITY = f"{IRQ_DIR}/default_smp_affinity"
CMD_TIMEOUT = 30.0

# Used with fullmatch only.
IRQ_LIST_PATH_RE = re.compile(r"/proc/irq/[0-9]{1,6}/smp_affinity_list")
MASK_RE = re.compile(r"[0-9a-f]{1,8}(?:,[0-9a-f]{8}){0,31}")
_ROW_RE = re.compile(r"\s*([0-9]+):((?:\s+[0-9]+)*)\s+(\S+)\s+(?:([0-9]+)\s+)?(?:(Level|Edge)\b\s*)?(.*)")
_PER_CPU_CHIP_RE = re.compile(r"GICv[234]|GIC-[0-9]+")     # with hwirq < 32: SGI / PPI
_PPI_PARTITION_RE = re.compile(r"GICv3-[0-9]+")             # a PPI partition (big.LITTLE PMUs)
_TEE_ERROR_RE = re.compile(r"^tee: (/proc/irq/[0-9]+/smp_affinity_list): (.+)$", re.M)


# --------------------------------------------------------------------------- pure


@dataclass(frozen=True)
class Irq:
    """One numbered row of /proc/interrupts."""

    number: int
    chip: str
    hwirq: int | None
    actions: str          # the handlers' names ("eth0", "arm-smmu global fault, ...")

    @property
    def per_cpu(self) -> bool:
        """A GIC SGI/PPI (one per CPU: the arch timer, the PMU, the vGIC) or a PPI partition."""
        if _PPI_PARTITION_RE.fullmatch(self.chip):
            return True
        return bool(_PER_CPU_CHIP_RE.fullmatch(self.chip)) and self.hwirq is not None \
            and self.hwirq < 32

    @property
    def name(self) -> str:
        return self.actions or f"{self.chip} {self.hwirq if self.hwirq is not None else ''}".strip()


def parse_interrupts(text: str) -> list[Irq]:
    """The numbered rows of /proc/interrupts (kernel/irq/proc.c show_interrupts: "%*d: ", a
    count per online CPU, the chip name, the hardware IRQ, Level/Edge, the actions). The IPI
    and Err rows have no /proc/irq entry and are skipped."""
    lines = text.splitlines()
    if not lines or not lines[0].split() or not all(c.startswith("CPU") for c in lines[0].split()):
        raise FleetError(f"{INTERRUPTS}: no CPU header line")
    ncpu = len(lines[0].split())
    out = []
    for line in lines[1:]:
        m = _ROW_RE.fullmatch(line)
        if not m or len(m.group(2).split()) != ncpu:
            continue                       # IPIn:, Err:, or a row this parser does not know
        out.append(Irq(int(m.group(1)), m.group(3),
                       int(m.group(4)) if m.group(4) is not None else None, m.group(6).strip()))
    return out


def mask_text(cpus: list[int] | tuple[int, ...], nbits: int) -> str:
    """A CPU set as the kernel prints a mask of ``nbits`` CPUs (see the module)."""
    value = sum(1 << c for c in cpus)
    chunks = []
    for low in range(0, max(nbits, 1), 32):
        width = (min(32, nbits - low) + 3) // 4
        chunks.append(f"{(value >> low) & 0xFFFFFFFF:0{width}x}")
    return ",".join(reversed(chunks))


def parse_mask(text: str) -> list[int]:
    text = text.strip()
    if not MASK_RE.fullmatch(text):
        raise FleetError(f"unexpected CPU mask {text!r}")
    value = int(text.replace(",", ""), 16)
    return [c for c in range(value.bit_length()) if value >> c & 1]


@dataclass(frozen=True)
class IrqMove:
    irq: int
    name: str
    before: str           # smp_affinity_list now
    after: str            # what the kit writes


@dataclass
class IrqState:
    """The IRQs of a device and where they may run (read without changing anything)."""

    irqs: list[Irq] = field(default_factory=list)
    affinity: dict[int, list[int]] = field(default_factory=dict)     # smp_affinity_list
    effective: dict[int, list[int]] = field(default_factory=dict)    # effective_affinity_list
    default_mask: str | None = None
    default_cpus: list[int] = field(default_factory=list)


@dataclass
class IrqPlan:
    moves: list[IrqMove]
    per_cpu: list[Irq]                 # left alone: one per CPU, the kernel keeps them
    default_before: str | None
    default_after: str | None          # None: already right
    housekeeping: list[int]
    rt_cpus: list[int]

    @property
    def change(self) -> bool:
        return bool(self.moves) or self.default_after is not None


def plan_moves(st: IrqState, rt_cpus: list[int] | tuple[int, ...], online: list[int],
               nbits: int) -> IrqPlan:
    """Which IRQs to move where (pure): every IRQ not per-CPU whose list includes a real-time
    CPU gets the list without them, or all housekeeping CPUs when none of its own is left."""
    rt = set(rt_cpus)
    housekeeping = [c for c in online if c not in rt]
    if not housekeeping:
        raise FleetError(f"realtime.cpus {cpu_list_text(list(rt))} cover every online CPU "
                         f"({cpu_list_text(online)}): IRQs need at least one other CPU")
    moves, per_cpu = [], []
    for irq in st.irqs:
        if irq.per_cpu:
            per_cpu.append(irq)
            continue
        now = st.affinity.get(irq.number)
        if now is None or not rt & set(now):
            continue
        kept = [c for c in now if c not in rt and c in online] or housekeeping
        moves.append(IrqMove(irq.number, irq.name, cpu_list_text(now), cpu_list_text(kept)))
    default_after = None
    if st.default_mask is not None and rt & set(st.default_cpus):
        default_after = mask_text(housekeeping, nbits)
    return IrqPlan(moves, per_cpu, st.default_mask, default_after, housekeeping, sorted(rt))


def irq_record(st: IrqState) -> dict[str, Any]:
    """What restore puts back: each IRQ's list (by number, with its name) and the default."""
    names = {i.number: i.name for i in st.irqs}
    return {"default_smp_affinity": st.default_mask,
            "irqs": {str(n): {"name": names.get(n, ""), "affinity": cpu_list_text(cpus)}
                     for n, cpus in sorted(st.affinity.items())}}


def tee_failures(stderr: str) -> dict[int, str]:
    """``tee``'s per-file errors ("tee: PATH: Input/output error") -> {irq: message}."""
    return {int(m.group(1).split("/")[3]): m.group(2).strip()
            for m in _TEE_ERROR_RE.finditer(stderr)}


# --------------------------------------------------------------------------- device


def list_path(irq: int) -> str:
    return f"{IRQ_DIR}/{int(irq)}/smp_affinity_list"


def read_irqs(remote: Remote) -> IrqState:
    """/proc/interrupts, then every listed IRQ's affinity in one round trip."""
    text = remote.read_text(INTERRUPTS, sudo=True)
    if text is None:
        raise FleetError(f"{remote.name}: {INTERRUPTS} is missing")
    st = IrqState(irqs=parse_interrupts(text))
    paths = [DEFAULT_AFFINITY]
    for irq in st.irqs:
        paths += [list_path(irq.number), f"{IRQ_DIR}/{irq.number}/effective_affinity_list"]
    values = read_files(remote, paths, sudo=True)
    for irq in st.irqs:
        for name, dest in (("smp_affinity_list", st.affinity),
                           ("effective_affinity_list", st.effective)):
            v = values.get(f"{IRQ_DIR}/{irq.number}/{name}")
            if v:
                dest[irq.number] = parse_cpu_list(v)
    st.default_mask = values.get(DEFAULT_AFFINITY)
    if st.default_mask:
        st.default_cpus = parse_mask(st.default_mask)
    return st


def refusal(paths: list[str], value: str, online: list[int]) -> str | None:
    """Why writing CPU list ``value`` to ``paths`` is refused (None: allowed)."""
    if not CPU_LIST_RE.fullmatch(value):
        return f"refusing to write {value!r}: not a CPU list"
    cpus = parse_cpu_list(value)
    if cpu_list_text(cpus) != value:
        return f"refusing to write {value!r}: not in the kernel's canonical form"
    if not cpus or any(c not in online for c in cpus):
        return (f"refusing to write {value!r}: every CPU must be online "
                f"({cpu_list_text(online)})")
    for path in paths:
        if not IRQ_LIST_PATH_RE.fullmatch(path):
            return f"refusing to write {path!r}: not an IRQ affinity path"
    return None


def write_affinity(remote: Remote, irqs: list[int], value: str, online: list[int]) -> dict[int, str]:
    """Write CPU list ``value`` to the IRQs' ``smp_affinity_list`` (root, ``tee``, the value on
    standard input). Returns {irq: error} for the files the kernel refused (``tee`` goes on with
    the others); any other failure raises."""
    if not irqs:
        return {}
    paths = [list_path(i) for i in irqs]
    why = refusal(paths, value, online)
    if why:
        raise FleetError(f"{remote.name}: {why}")
    res = remote.run(["tee", "--", *paths], sudo=True, timeout=CMD_TIMEOUT, check=False,
                     input=(value + "\n").encode())
    failed = tee_failures(res.stderr)
    if res.exit_code != 0 and not failed:
        raise FleetError(f"{remote.name}: writing IRQ affinity failed ({res.exit_code}): "
                         f"{res.stderr.strip()}")
    return failed


def write_default(remote: Remote, mask: str, online: list[int]) -> None:
    """``/proc/irq/default_smp_affinity`` = ``mask`` (a mask of online CPUs only)."""
    if not MASK_RE.fullmatch(mask) or not parse_mask(mask) or \
            any(c not in online for c in parse_mask(mask)):
        raise FleetError(f"{remote.name}: refusing to write {mask!r} to {DEFAULT_AFFINITY}: not "
                         f"a mask of online CPUs")
    remote.run(["tee", "--", DEFAULT_AFFINITY], sudo=True, timeout=CMD_TIMEOUT,
               input=(mask + "\n").encode())


def apply(remote: Remote, plan: IrqPlan, online: list[int]) -> dict[int, str]:
    """Write the plan (one ``tee`` per distinct list). Returns the IRQs the kernel refused."""
    by_value: dict[str, list[int]] = {}
    for m in plan.moves:
        by_value.setdefault(m.after, []).append(m.irq)
    refused: dict[int, str] = {}
    for value, irqs in sorted(by_value.items()):
        refused.update(write_affinity(remote, irqs, value, online))
    if plan.default_after is not None:
        write_default(remote, plan.default_after, online)
    return refused


def restore(remote: Remote, saved: dict[str, Any], online: list[int]) -> list[str]:
    """Put back the recorded lists of the IRQs that still have the same name (a reboot may number
    them otherwise), and the default mask. Returns notes."""
    st = read_irqs(remote)
    names = {i.number: i.name for i in st.irqs}
    by_value: dict[str, list[int]] = {}
    skipped = []
    for key, entry in dict(saved.get("irqs") or {}).items():
        if not str(key).isdigit() or not isinstance(entry, dict):
            raise FleetError(f"{remote.name}: the saved IRQ record is corrupt ({key!r})")
        n, want = int(key), str(entry.get("affinity", ""))
        if n not in names:
            continue
        if names[n] != entry.get("name"):
            skipped.append(f"{n} ({names[n]}, was {entry.get('name')})")
            continue
        if st.affinity.get(n) is not None and cpu_list_text(st.affinity[n]) != want:
            by_value.setdefault(want, []).append(n)
    notes = []
    for value, irqs in sorted(by_value.items()):
        usable = [c for c in parse_cpu_list(value) if c in online] if CPU_LIST_RE.fullmatch(value) \
            else []
        if not usable:
            notes.append(f"IRQs {', '.join(map(str, irqs))}: saved list {value!r} names no online "
                         f"CPU, left as they are")
            continue
        refused = write_affinity(remote, irqs, cpu_list_text(usable), online)
        if refused:
            notes.append("the kernel refused IRQ " + ", ".join(
                f"{n} ({msg})" for n, msg in sorted(refused.items())))
    if skipped:
        notes.append(f"IRQs renumbered since the record, left alone: {', '.join(skipped)}")
    default = saved.get("default_smp_affinity")
    if isinstance(default, str) and default != st.default_mask and MASK_RE.fullmatch(default):
        write_default(remote, default, online)
    return notes
