"""The real-time part of colibri.service, rendered from a profile's ``realtime:`` section
(docs/service.md, "Real-time mode"): exactly the limits and system calls its options need and
nothing more (no capability), the real `systemd-analyze verify` accepts it, and the real
`systemd-analyze security` still rates it 2.0 or lower (tests/test_service_unit.py has the units
without it)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from unit_support import directives, exposure

from colibri_kit.errors import ProfileError
from colibri_kit.profiles import load_profile
from colibri_kit.service import (Privileges, RealtimeOptions, ServiceError, ServiceSpec,
                                 render_unit, unit_privileges, verify_unit)

BASE_SYSCALLS = ["@system-service", "~@privileged @resources"]


def test_the_example_profile_renders_its_options_and_only_their_limits(tmp_path) -> None:
    plain = render_unit(load_profile("orin-nx").service, target="orin-nx")
    text = render_unit(load_profile("orin-nx-rt").service, target="orin-nx-rt")
    assert verify_unit(text) == ""
    d, p = directives(text), directives(plain)
    assert d["ExecStart"][0].endswith(" --threads 6 --cpus 2,3,4,5,6,7 --sched fifo:50 --mlock "
                                      "--barrier spin")
    assert d["LimitRTPRIO"] == ["50"] and d["LimitMEMLOCK"] == ["infinity"]
    assert d["RestrictRealtime"] == ["no"]
    assert d["CapabilityBoundingSet"] == [""] and d["AmbientCapabilities"] == [""]
    assert d["SystemCallFilter"] == BASE_SYSCALLS + [
        "sched_setaffinity sched_setparam sched_setscheduler"]
    # Every other line is the plain unit's.
    changed = {k for k in set(d) | set(p) if d.get(k) != p.get(k)}
    assert changed == {"ExecStart", "LimitRTPRIO", "LimitMEMLOCK", "RestrictRealtime",
                       "SystemCallFilter"}
    plain_score, _ = exposure(plain, tmp_path)
    score, table = exposure(text, tmp_path)
    assert plain_score <= 2.0 and score <= 2.0, table
    print(f"systemd-analyze security: orin-nx {plain_score}, orin-nx-rt {score}")


@pytest.mark.parametrize("rt,limits,allow,realtime", [
    (RealtimeOptions(cpus=(1,)), (), ("sched_setaffinity",), False),
    (RealtimeOptions(cpus=(1,), lock_memory=True), (("LimitMEMLOCK", "infinity"),),
     ("sched_setaffinity",), False),
    (RealtimeOptions(cpus=(1, 2), policy="rr", priority=10), (("LimitRTPRIO", "10"),),
     ("sched_setaffinity", "sched_setparam", "sched_setscheduler"), True),
])
def test_each_option_adds_exactly_what_it_needs(rt, limits, allow, realtime, tmp_path) -> None:
    spec = ServiceSpec(realtime=rt)
    assert unit_privileges(spec) == Privileges(limits=limits, syscall_allow=allow,
                                               realtime=realtime)
    text = render_unit(spec)
    assert verify_unit(text) == ""
    d = directives(text)
    assert d["RestrictRealtime"] == ["no" if realtime else "yes"]
    assert [k for k in d if k.startswith("Limit") and k != "LimitNOFILE"] == [k for k, _ in limits]
    assert exposure(text, tmp_path)[0] <= 2.0


def test_slots_get_the_cpus_in_runs(tmp_path) -> None:
    spec = ServiceSpec(slots=2, realtime=RealtimeOptions(cpus=(2, 3, 4, 5)))
    assert spec.threads_per_slot == 2
    args = " ".join(spec.serve_args())
    assert "--slots 2 " in args and "--threads 2 " in args and args.endswith("--cpus 2,3,4,5")
    with pytest.raises(ServiceError, match="2 slots cannot share realtime.cpus \\(3 CPUs\\) evenly"):
        ServiceSpec(slots=2, realtime=RealtimeOptions(cpus=(2, 3, 4)))
    with pytest.raises(ServiceError, match="threads: 1 slots x 2 threads need 2 realtime.cpus, the "
                                           "profile gives 3"):
        ServiceSpec(threads=2, realtime=RealtimeOptions(cpus=(2, 3, 4)))
    with pytest.raises(ServiceError, match="cpu_affinity: '0-3' leaves out realtime CPU\\(s\\) 4"):
        ServiceSpec(cpu_affinity="0-3", realtime=RealtimeOptions(cpus=(3, 4)))
    for bad in (RealtimeOptions(cpus=()), RealtimeOptions(cpus=(1, 1)),
                RealtimeOptions(cpus=(1,), policy="fifo"),
                RealtimeOptions(cpus=(1,), priority=5), RealtimeOptions(cpus=(1,), barrier="x")):
        with pytest.raises(ServiceError, match="realtime\\."):
            ServiceSpec(realtime=bad)


def test_a_profile_whose_service_cannot_run_its_realtime_section_names_the_key(tmp_path) -> None:
    doc = {"name": "rt", "extends": "orin-nx", "description": "x",
           "service": {"slots": 2}, "realtime": {"cpus": "1-3"}}
    targets = tmp_path / "targets"
    targets.mkdir()
    for src in (Path(__file__).resolve().parents[1] / "targets").glob("*.yaml"):
        (targets / src.name).write_text(src.read_text())
    (targets / "rt.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ProfileError, match="rt.yaml: service.slots: 2 slots cannot share "
                                           "realtime.cpus \\(3 CPUs\\) evenly"):
        load_profile("rt", targets)
    doc["service"] = {"slots": 1}
    (targets / "rt.yaml").write_text(yaml.safe_dump(doc))
    spec = load_profile("rt", targets).service
    assert spec.realtime == RealtimeOptions(cpus=(1, 2, 3))
    assert dataclasses.replace(spec, realtime=None) == load_profile("orin-nx").service
