"""`invoke tune`'s real-time steps (a profile's ``realtime:`` section) in-process, on emulated
Jetsons (LocalRemote, no root): IRQs moved off the inference CPUs, the CPUs isolated on the kernel
command line through /boot/extlinux/extlinux.conf, the reboot that takes (with consent, rolled
like a mode switch's, one reboot for both), verification, and restore byte for byte. The emulated
boot (colibri_kit/sim/tools/kernel_boot.py) builds /proc/cmdline and the isolated CPUs from the
file as NVIDIA's L4TLauncher and the kernel do; tests/fleet/test_tune.py runs the same over real
sshd with devices that really go down.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from fleet_support import Recording

from colibri_kit.errors import FleetError
from colibri_kit.fleet import tune as tunelib
from colibri_kit.fleet.fleet import Fleet
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.remote import Result
from colibri_kit.fleet.tune import boot, irq
from colibri_kit.profiles import RealtimeSpec, TuneSpec
from colibri_kit.sim import device_files
from colibri_kit.sim.local import LocalRemote, local_device

MAXN = TuneSpec(nvpmodel_mode="MAXN", jetson_clocks=True, cpu_governor="performance",
                gpu_governor="performance")
RT = RealtimeSpec(cpus=(2, 3, 4, 5, 6, 7), policy="fifo", priority=50, lock_memory=True,
                  barrier="spin", isolate=True, irq_affinity=True)
BOOT_ID = "/proc/sys/kernel/random/boot_id"
# /proc/cmdline of a JetPack 6 Orin (csantanapr/k8s-nvidia README.md, kernel 5.15.136-tegra):
# the emulated boot must give it back from the stock extlinux.conf byte for byte.
REAL_CMDLINE = ("root=PARTUUID=4b8a73c4-da72-45a0-bf8e-233d1240f538 rw rootwait rootfstype=ext4 "
                "mminit_loglevel=4 console=ttyTCU0,115200 firmware_class.path=/etc/firmware "
                "fbcon=map:0 net.ifnames=0 nospectre_bhb video=efifb:off console=tty0 "
                "bl_prof_dataptr=2031616@0x471E10000 bl_prof_ro_ptr=65536@0x471E00000")
# The shape jetson-io.py leaves (a JetPack 6 Orin NX's file as pasted in a public bring-up log):
# DEFAULT names a second, tab-indented label with FDT and OVERLAYS; the kit edits that one.
JETSON_IO = """TIMEOUT 30
DEFAULT JetsonIO

MENU TITLE L4T boot options

LABEL primary
      MENU LABEL primary kernel
      LINUX /boot/Image
      INITRD /boot/initrd
      APPEND ${cbootargs} root=PARTUUID=5c9805f0-8c5e-438c-b078-5d543df8f876 rw rootwait rootfstype=ext4 mminit_loglevel=4 console=ttyTCU0,115200 firmware_class.path=/etc/firmware fbcon=map:0 net.ifnames=0 nospectre_bhb video=efifb:off console=tty0

# LABEL backup
#    MENU LABEL backup kernel
#    APPEND ${cbootargs}

LABEL JetsonIO
\tMENU LABEL Custom Header Config: <CSI Camera TC358743 HDMI-CSI Bridge>
\tLINUX /boot/Image
\tFDT /boot/dtb/kernel_tegra234-p3768-0000+p3767-0000-nv.dtb
\tINITRD /boot/initrd
\tAPPEND ${cbootargs} root=PARTUUID=5c9805f0-8c5e-438c-b078-5d543df8f876 rw rootwait rootfstype=ext4 mminit_loglevel=4 console=ttyTCU0,115200 firmware_class.path=/etc/firmware fbcon=map:0 net.ifnames=0 nospectre_bhb video=efifb:off console=tty0
\tOVERLAYS /boot/tegra234-p3767-camera-tc358743.dtbo
"""


def tree(dev: LocalRemote) -> dict[str, bytes]:
    """Every faked file the real-time steps read or write (links as their target): /proc (IRQs,
    the command line), /boot, the isolated CPUs. (The rest of sysfs: an in-process reboot does
    not power the tree off, so the clocks nvpmodel's boot applies stay; the sshd devices of
    tests/fleet/test_tune.py start every boot from power-on and compare all of it.)"""
    out = {}
    for top in ("proc", "boot", "sys/devices/system/cpu/isolated"):
        for p in sorted([dev.root / top, *(dev.root / top).rglob("*")]):
            rel = str(p.relative_to(dev.root))
            if rel == BOOT_ID.lstrip("/"):
                continue          # a new boot's id
            if p.is_symlink():
                out[rel] = b"-> " + str(p.readlink()).encode()
            elif p.is_file():
                out[rel] = p.read_bytes()
    return out


@pytest.fixture
def nx(tmp_path: Path) -> LocalRemote:
    return local_device(tmp_path / "nx", "orin-nx", name="nx")


def fleet_of(devs: dict[str, LocalRemote], wrap=lambda r: r) -> Fleet:
    hosts = [Host(name=n, address="127.0.0.1", target="orin-nx-rt") for n in devs]
    return Fleet(hosts, connect=lambda h: wrap(devs[h.name]), parallel=len(devs))


# --------------------------------------------------------------------------- the files


def test_the_emulated_boot_gives_the_real_cmdline_and_irq_layout(nx) -> None:
    assert nx.read_text("/proc/cmdline") == REAL_CMDLINE + "\n"
    assert nx.read_text("/sys/devices/system/cpu/isolated") == "\n"
    assert nx.read_text("/sys/devices/system/cpu/nohz_full") is None   # stock L4T: no NO_HZ_FULL
    # The real 6-CPU file printed for 6 CPUs is the real file again, byte for byte.
    src = (device_files.DATA / "interrupts/tegra234.txt").read_text()
    real = "".join(ln + "\n" for ln in src.splitlines() if not ln.startswith("#"))
    assert device_files.interrupts_text(6) == real
    irqs = {i.number: i for i in irq.parse_interrupts(nx.read_text("/proc/interrupts"))}
    assert {n for n, i in irqs.items() if i.per_cpu} == {9, 11, 12, 13, 115}  # vgic, timers, pmu
    assert irqs[13].actions == "arch_timer" and irqs[13].hwirq == 26
    assert irqs[24].actions == "arm-smmu global fault, arm-smmu-context-fault"
    assert irqs[301].chip == "MSI" and irqs[301].hwirq == 1074266112 and not irqs[301].per_cpu
    assert irqs[298].chip == "gpio" and irqs[298].actions == "power-key"
    assert nx.read_text("/proc/irq/70/smp_affinity_list") == "0-7\n"
    assert nx.read_text("/proc/irq/default_smp_affinity") == "ff\n"


def test_masks_print_as_the_kernel_prints_them() -> None:
    # lib/vsprintf.c bitmap_string: the first chunk as wide as its bits, then 8-digit chunks.
    assert irq.mask_text(range(8), 8) == "ff"
    assert irq.mask_text([0, 1], 8) == "03"
    assert irq.mask_text(range(6), 6) == "3f"
    assert irq.mask_text(range(12), 12) == "fff"
    assert irq.mask_text(range(40), 40) == "ff,ffffffff"
    assert irq.mask_text([0], 14) == "0001"
    assert irq.parse_mask("ff,ffffffff") == list(range(40))
    with pytest.raises(FleetError):
        irq.parse_mask("ff;reboot")


def test_extlinux_edit_is_one_token_on_the_label_that_boots_and_restore_is_exact() -> None:
    conf = boot.parse_extlinux(JETSON_IO)
    assert conf.booted.label == "JetsonIO" and [e.label for e in conf.entries] == [
        "primary", "JetsonIO"]                       # "# LABEL backup" is a comment
    wanted = boot.wanted_params([2, 3, 4, 5, 6, 7], nohz=True)
    new = boot.edit_append(JETSON_IO, wanted)
    changed = [(a, b) for a, b in zip(JETSON_IO.splitlines(), new.splitlines()) if a != b]
    assert len(changed) == 1 and changed[0][0].startswith("\tAPPEND ${cbootargs} ")
    assert changed[0][1] == changed[0][0] + (" isolcpus=managed_irq,domain,2-7 nohz_full=2-7 "
                                             "rcu_nocbs=2-7")
    saved = {"label": "JetsonIO", "wrote": wanted,
             "before": {"isolcpus": None, "nohz_full": None, "rcu_nocbs": None}}
    back, notes = boot.restored_text(new, saved)
    assert back == JETSON_IO and notes == []
    # A user's own value is replaced in place and put back; a comment after APPEND survives.
    own = JETSON_IO.replace("console=tty0\n\tOVERLAYS", "isolcpus=3 console=tty0  # mine\n"
                            "\tOVERLAYS")
    edited = boot.edit_append(own, {"isolcpus": wanted["isolcpus"]})
    assert "isolcpus=managed_irq,domain,2-7 console=tty0  # mine\n" in edited
    back, _ = boot.restored_text(edited, {"label": "JetsonIO", "wrote": {
        "isolcpus": wanted["isolcpus"]}, "before": {"isolcpus": "3"}})
    assert back == own
    # The kit's token changed by someone since: restore leaves it and says so.
    moved = new.replace("nohz_full=2-7", "nohz_full=3-7")
    back, notes = boot.restored_text(moved, saved)
    assert "nohz_full=3-7" in back and "isolcpus=" not in back.split("JetsonIO")[-1]
    assert notes == ["nohz_full in /boot/extlinux/extlinux.conf was changed since tune wrote it: "
                     "left as it is"]


def test_extlinux_edits_that_would_mislead_the_kernel_are_refused() -> None:
    twice = JETSON_IO.replace("console=tty0\n\tOVERLAYS", "isolcpus=1 isolcpus=2 console=tty0\n"
                              "\tOVERLAYS")
    with pytest.raises(FleetError, match="isolcpus= appears 2 times in the APPEND line of label "
                                         "'JetsonIO'"):
        boot.edit_append(twice, {"isolcpus": "managed_irq,domain,2-7"})
    no_append = "DEFAULT a\nLABEL a\n  LINUX /boot/Image\n"
    with pytest.raises(FleetError, match="label 'a' \\(the one that boots\\) has no APPEND"):
        boot.edit_append(no_append, {"isolcpus": "managed_irq,domain,2-7"})
    for hostile in ("managed_irq,domain,2-7 init=/bin/sh", "2-7\nLABEL x", "2-7#", "$(reboot)"):
        with pytest.raises(FleetError, match="refusing to write"):
            boot.edit_append(JETSON_IO, {"nohz_full": hostile})
    with pytest.raises(FleetError, match="is not a plain value"):
        boot.restored_text(boot.edit_append(JETSON_IO, {"nohz_full": "2-7"}), {
            "label": "JetsonIO", "wrote": {"nohz_full": "2-7"}, "before": {"nohz_full": "x y"}})


# --------------------------------------------------------------------------- plan and apply


def test_the_plan_names_every_step_and_changes_nothing(nx) -> None:
    before = tree(nx)
    p = tunelib.plan(nx, MAXN, RT)
    assert p.needs_reboot and p.mode_reboot and p.boot_reboot
    assert "IRQ affinity: 22 IRQs off CPUs 2-7 onto 0-1, default_smp_affinity ff -> 03; 5 " \
           "per-CPU IRQs left alone" in p.steps
    assert ("isolate CPUs 2-7: isolcpus=managed_irq,domain,2-7 on the APPEND line of label "
            "primary in /boot/extlinux/extlinux.conf; needs a reboot") in p.steps
    assert any("nohz_full and rcu_nocbs not written: this kernel is built without "
               "CONFIG_NO_HZ_FULL" in s for s in p.steps)
    assert tree(nx) == before


def test_realtime_cpus_the_device_cannot_give_are_refused_before_anything_changes(nx) -> None:
    before = tree(nx)
    # 10W runs CPUs 0-3 only (its conf's CPU_ONLINE lines): 2-7 cannot be inference cores there.
    with pytest.raises(tunelib.TuneRefused, match="realtime.cpus 2-7: CPU 4-7 not online in power "
                                                  "mode 10W \\(online there: 0-3\\)"):
        tunelib.plan(nx, dataclasses.replace(MAXN, nvpmodel_mode="10W"), RT)
    with pytest.raises(tunelib.TuneRefused, match="are every online CPU"):
        tunelib.plan(nx, MAXN, dataclasses.replace(RT, cpus=tuple(range(8)), isolate=False))
    nx.path(boot.EXTLINUX).unlink()
    with pytest.raises(tunelib.TuneRefused, match="does not boot through L4TLauncher's "
                                                  "extlinux.conf"):
        tunelib.plan(nx, MAXN, RT)
    del before["boot/extlinux/extlinux.conf"]
    assert tree(nx) == before


def test_without_allow_reboot_nothing_is_applied_and_the_report_says_why(nx) -> None:
    before = tree(nx)
    report = tunelib.apply(nx, tunelib.plan(nx, MAXN, RT))
    assert report.mode is tunelib.ModeSwitch.NEEDS_REBOOT and not report.ok
    assert report.notes == [
        "isolating CPUs 2-7 needs a reboot, and so does power mode 15W -> MAXN: not applied "
        "(re-run with --allow-reboot); IRQs, jetson_clocks and governors not applied either (a "
        "reboot would undo them); nothing was changed"]
    assert tree(nx) == before and not nx.path(tunelib.TUNE_DIR).exists()


def test_one_reboot_takes_mode_and_isolation_then_irqs_verify_and_restore_is_exact(nx) -> None:
    before = tree(nx)
    boot0 = nx.read_text(BOOT_ID)
    reboots = []

    class Counting(Recording):
        def run(self, argv, **kw):
            if list(argv[:2]) == ["sh", "-c"] and "YES" in argv[2] or list(argv[:1]) == ["reboot"]:
                reboots.append(argv)
            return super().run(argv, **kw)

    f = fleet_of({"nx": nx}, Counting)
    run = tunelib.tune_fleet(f, lambda h: MAXN, realtime_for=lambda h: RT, allow_reboot=True,
                             poll=0.05, reboot_timeout=30)
    o = run.results.succeeded[0]
    assert o.value.ok, o.value.checks
    assert len(reboots) == 1 and nx.read_text(BOOT_ID) != boot0   # nvpmodel's YES took both
    assert "rebooted once into MAXN" in o.value.notes[0]
    got = {c.what: c for c in o.value.checks}
    assert got["kernel cmdline"] == tunelib.Check(
        "kernel cmdline", "isolcpus=managed_irq,domain,2-7", "has them", True)
    assert got["isolated cpus"].actual == "2-7" and got["irq affinity"].actual == "none on them"
    assert got["irq default"].actual == "03"
    assert nx.read_text("/proc/cmdline") == REAL_CMDLINE.replace(
        "console=tty0 ", "console=tty0 isolcpus=managed_irq,domain,2-7 ") + "\n"
    assert nx.read_text("/sys/devices/system/cpu/isolated") == "2-7\n"
    assert nx.read_text("/proc/irq/70/smp_affinity_list") == "0-1\n"
    assert nx.read_text("/proc/irq/13/smp_affinity_list") == "0-7\n"        # arch_timer: per-CPU
    assert any("per-CPU IRQs stay on every CPU" in n for n in o.value.notes)

    # Again: nothing to do, nothing written, still verified.
    rec = Recording(nx)
    again = tunelib.plan(rec, MAXN, RT)
    assert not again.needs_reboot and not again.irq_plan.change
    second = tunelib.apply(rec, again)
    assert second.ok, second.checks
    writes = [c for c in rec.calls if c[0] in ("tee", "cp", "mv", "sh", "write_bytes", "reboot")
              or c[:2] == ("nvpmodel", "-m")]
    assert writes == []

    # Restore: IRQs live, the file and the mode back with one reboot, every file as before.
    back, stopped = tunelib.restore_fleet(f, allow_reboot=True, poll=0.05, reboot_timeout=30)
    (done,) = list(back)
    assert done.value.outcome is tunelib.Restored.RESTORED, done.value.notes
    assert len(reboots) == 2 and not nx.path(tunelib.TUNE_DIR).exists()
    assert tree(nx) == before


def test_a_kernel_with_nohz_full_gets_all_three_and_shows_them(tmp_path) -> None:
    root = tmp_path / "rtk"
    device_files.populate(root, "orin-nx", nohz_full=True)
    dev = local_device(root, "orin-nx", name="rtk")
    report = tunelib.apply(dev, tunelib.plan(dev, MAXN, RT), allow_reboot=True)
    assert report.mode is tunelib.ModeSwitch.REBOOTING
    assert dev.read_text("/sys/devices/system/cpu/nohz_full") == "2-7\n"
    done = tunelib.apply(dev, tunelib.plan(dev, MAXN, RT))
    assert done.ok, done.checks
    cmd = {c.what: c for c in done.checks}["kernel cmdline"]
    assert cmd.wanted == "isolcpus=managed_irq,domain,2-7 nohz_full=2-7 rcu_nocbs=2-7"
    assert {c.what: c for c in done.checks}["nohz_full cpus"].actual == "2-7"


def test_isolation_written_but_not_booted_is_pending_and_a_live_mode_goes_along(nx) -> None:
    """The file says isolcpus, the running kernel does not (a reboot that never came): the plan
    says so and needs a reboot; with a live mode switch (15W -> 10W) the kit reboots itself."""
    text = nx.path(boot.EXTLINUX).read_text()
    nx.path(boot.EXTLINUX).write_text(boot.edit_append(text, {
        "isolcpus": "managed_irq,domain,2-3"}))
    live = dataclasses.replace(MAXN, nvpmodel_mode="10W")
    rt = dataclasses.replace(RT, cpus=(2, 3))
    p = tunelib.plan(nx, live, rt)
    assert p.boot_reboot and not p.mode_reboot and p.boot_plan.pending
    assert any("written earlier, waits for a reboot" in s for s in p.steps)
    boot0 = nx.read_text(BOOT_ID)
    first = tunelib.apply(nx, p, allow_reboot=True)
    assert first.mode is tunelib.ModeSwitch.REBOOTING and first.target_mode == "10W"
    assert nx.read_text(BOOT_ID) != boot0 and first.boot_id == boot0.strip()
    done = tunelib.apply(nx, tunelib.plan(nx, live, rt))
    assert done.ok, done.checks
    assert nx.read_text("/proc/irq/70/smp_affinity_list") == "0-1\n"


def test_irqs_the_kernel_refuses_are_reported_not_failed(nx) -> None:
    """A managed IRQ (or one whose controller cannot route it) refuses the write with EIO and
    tee goes on with the others: the kit reports it. The emulated files cannot refuse a write,
    so this wrapper answers as tee does on a device for IRQ 301 (eth0)."""
    class Refusing(Recording):
        def run(self, argv, **kw):
            argv = list(argv)
            if argv[:2] == ["tee", "--"] and irq.list_path(301) in argv:
                rest = [a for a in argv if a != irq.list_path(301)]
                res = self.inner.run(rest, **{**kw, "check": False})
                return Result(tuple(argv), 1, res.stdout, f"tee: {irq.list_path(301)}: "
                                                          f"Input/output error\n")
            return super().run(argv, **kw)

    dev = Refusing(nx)
    report = tunelib.apply(dev, tunelib.plan(dev, MAXN, dataclasses.replace(RT, isolate=False)),
                           allow_reboot=True)
    assert report.mode is tunelib.ModeSwitch.REBOOTING       # the power mode's own reboot
    done = tunelib.apply(dev, tunelib.plan(dev, MAXN, dataclasses.replace(RT, isolate=False)))
    assert done.ok, done.checks
    assert any("the kernel refused to move IRQ 301 (Input/output error)" in n for n in done.notes)
    assert nx.read_text("/proc/irq/301/smp_affinity_list") == "0-7\n"
    assert nx.read_text("/proc/irq/70/smp_affinity_list") == "0-1\n"


def test_values_reaching_proc_are_checked(nx) -> None:
    online = list(range(8))
    for value, why in (("0-1;reboot", "not a CPU list"), ("1,0", "canonical form"),
                       ("0-9", "every CPU must be online"), ("2,2-3", "canonical form")):
        with pytest.raises(FleetError, match=why):
            irq.write_affinity(nx, [70], value, online)
    with pytest.raises(ValueError):                  # IRQs are numbers: no path gets through
        irq.write_affinity(nx, ["70/../../../etc/passwd"], "0-1", online)  # type: ignore[list-item]
    assert "not an IRQ affinity path" in irq.refusal(["/proc/irq/70/../../../etc/passwd"], "0-1",
                                                     online)
    with pytest.raises(FleetError, match="not a mask of online CPUs"):
        irq.write_default(nx, "100", online)


def test_a_boot_that_ignores_the_file_is_reported_and_not_retried(tmp_path) -> None:
    """Someone points DEFAULT at another label between the kit's write and its reboot: the
    device comes back without the isolation; the rollout says what it booted instead of
    rebooting again."""
    dev = local_device(tmp_path / "nx", "orin-nx", name="nx")
    conf = dev.path(boot.EXTLINUX)
    conf.write_text(conf.read_text() + "\nLABEL other\n      LINUX /boot/Image\n"
                                       "      APPEND ${cbootargs} root=/dev/nvme0n1p1\n")

    class Switching(Recording):
        def run(self, argv, **kw):
            if list(argv[:2]) == ["sh", "-c"] and "YES" in argv[2]:
                conf.write_text(conf.read_text().replace("DEFAULT primary", "DEFAULT other"))
            return super().run(argv, **kw)

    f = fleet_of({"nx": dev}, Switching)
    run = tunelib.tune_fleet(f, lambda h: MAXN, realtime_for=lambda h: RT, allow_reboot=True,
                             poll=0.05, reboot_timeout=30)
    (o,) = list(run.results)
    assert not o.value.ok
    assert "but the kernel does not run the isolation: /proc/cmdline is 'root=/dev/nvme0n1p1" \
        in o.value.notes[0]
