"""Device tuning: power mode, jetson_clocks, CPU and GPU governors; verified and reversible.

One module per concern, pure parsers apart from the code that acts on a device:

- ``nvpmodel``: the power mode: nvpmodel's output, the switch and the device's answer, reboots
  and the ``boot_id`` that confirms one;
- ``clocks``: jetson_clocks (store once, pin, restore; its output read for failures);
- ``governors``: CPU and GPU governor paths and the one sysfs writer;
- ``irq``: IRQ affinity off the real-time CPUs (/proc/interrupts, /proc/irq/N/smp_affinity_list);
- ``boot``: CPU isolation on the kernel command line (/boot/extlinux/extlinux.conf's APPEND);
- ``rt_throttle``: the kernel's RT throttling budget (/proc/sys/kernel/sched_rt_runtime_us);
- ``state``: ``TuningState``, what a device reports (read without changing anything);
- ``record``: root's own record of the pre-tuning state (``TUNE_DIR``);
- ``plan``: ``plan`` / ``apply`` / ``verify`` / ``restore`` on one device;
- ``rollout``: a fleet: plan every host, then apply, rolling the reboots (``tune_fleet``,
  ``restore_fleet``);
- ``show``: ``--show`` lines and the one-cell summary for smoke tables.

docs/tuning.md describes the behaviour; docs/jetson-facts.md the rules and their sources.
"""

from colibri_kit.fleet.tune.clocks import restore_failures
from colibri_kit.fleet.tune.governors import write_governor
from colibri_kit.fleet.tune.nvpmodel import parse_power_models, parse_query, read_boot_id
from colibri_kit.fleet.tune.plan import (Check, ModeSwitch, Restored, RestoreReport, TunePlan,
                                         TuneRefused, TuneReport, apply, plan, realtime_checks,
                                         restore, verify)
from colibri_kit.fleet.tune.record import TUNE_DIR
from colibri_kit.fleet.tune.rollout import (REBOOT_TIMEOUT, TuneRun, restore_fleet, rollout,
                                            tune_fleet, wait_back)
from colibri_kit.fleet.tune.show import show_lines, summary_text, tuning_summary
from colibri_kit.fleet.tune.state import (TuningState, mode_now, read_state, read_state_any,
                                          state_dict)

__all__ = [
    "Check", "ModeSwitch", "REBOOT_TIMEOUT", "Restored", "RestoreReport", "TUNE_DIR", "TunePlan",
    "TuneRefused", "TuneReport", "TuneRun", "TuningState", "apply", "mode_now",
    "parse_power_models", "parse_query", "plan", "read_boot_id", "read_state", "read_state_any",
    "realtime_checks",
    "restore", "restore_failures", "restore_fleet", "rollout", "show_lines", "state_dict",
    "summary_text", "tune_fleet", "tuning_summary", "verify", "wait_back", "write_governor",
]
