"""A profile's ``realtime:`` section: values, defaults, and errors that name the file, the key path
and what is allowed (docs/runtime.md, "Real-time mode"; docs/tuning.md)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from colibri_kit.errors import ProfileError
from colibri_kit.profiles import RealtimeSpec, load_profile, profile_yaml

BASE = {
    "name": "rt", "description": "test device", "arch": "aarch64", "glibc": "2.35",
    "colibri": {"embed_pad": 64, "stream_count": 2, "routing_mode": "softmax_topk", "top_k": 8,
                "max_experts": 64},
    "tune": {"nvpmodel_mode": "MAXN", "jetson_clocks": True, "cpu_governor": "performance",
             "gpu_governor": "performance"},
    "smoke": {"max_first_token_ms_p99": 2000},
}


def load(tmp_path: Path, realtime: object, **top: object):
    doc = {**BASE, **top, "realtime": realtime}
    (tmp_path / "rt.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_profile("rt", tmp_path)


def test_shipped_example_and_defaults(tmp_path: Path) -> None:
    p = load_profile("orin-nx-rt")
    assert p.realtime == RealtimeSpec(cpus=(2, 3, 4, 5, 6, 7), policy="fifo", priority=50,
                                      lock_memory=True, barrier="spin", isolate=True,
                                      irq_affinity=True)
    assert p.tune == load_profile("orin-nx").tune
    assert "realtime:" in profile_yaml(p) and "cpus: [2, 3, 4, 5, 6, 7]" in profile_yaml(p)
    # Not a build input: the same header hash as without it.
    plain = load(tmp_path, None)
    assert load(tmp_path, {"cpus": "1-3"}).hash == plain.hash
    rt = load(tmp_path, {"cpus": [5, 3, 4]}).realtime
    assert rt == RealtimeSpec(cpus=(5, 3, 4))          # list order = the order threads are pinned
    assert (rt.policy, rt.priority, rt.lock_memory, rt.barrier, rt.isolate, rt.irq_affinity) == \
        ("other", 0, False, "sleep", False, False)
    assert rt.cpu_list == "3-5"


@pytest.mark.parametrize("realtime,where,message", [
    ({"cpus": 4}, "realtime.cpus", "got 4 (integer) (a bare number is ambiguous: write [N] for "
                                   "CPU N)"),
    ({"cpus": "3-2"}, "realtime.cpus", "'3-2' is not valid; allowed: a CPU list such as \"2-7\""),
    ({"cpus": "2-7;reboot"}, "realtime.cpus", "is not valid; allowed: a CPU list"),
    ({"cpus": [2, 2]}, "realtime.cpus", "names a CPU twice"),
    ({"cpus": []}, "realtime.cpus", "an empty list"),
    ({"cpus": [1024]}, "realtime.cpus.0", "1024 is out of range; allowed: 0..1023"),
    ({"cpus": "0-3", "isolate": True}, "realtime.cpus", "includes CPU 0, which isolate: true "
                                                        "cannot isolate"),
    ({"cpus": "1-3", "policy": "batch"}, "realtime.policy", "'batch' is not one of other, fifo, "
                                                            "rr"),
    ({"cpus": "1-3", "policy": "fifo"}, "realtime.priority", "missing: policy fifo needs a "
                                                             "priority; allowed: 1..99"),
    ({"cpus": "1-3", "policy": "rr", "priority": 100}, "realtime.priority",
     "100 is out of range; allowed: 1..99"),
    ({"cpus": "1-3", "priority": 10}, "realtime.priority", "not allowed with policy other"),
    ({"cpus": "1-3", "barrier": "yield"}, "realtime.barrier", "'yield' is not one of spin, "
                                                              "sleep"),
    ({"cpus": "1-3", "lock_memory": "yes"}, "realtime.lock_memory", "expected true or false"),
    ({"cpus": "1-3", "pin": True}, "realtime.pin", "unknown key 'pin'; allowed keys: cpus, "
                                                   "policy, priority, lock_memory, barrier, "
                                                   "isolate, irq_affinity, "
                                                   "rt_runtime_us"),
    ({"policy": "fifo"}, "realtime.cpus", "missing required key"),
    ({"cpus": "1-3", "rt_runtime_us": 0}, "realtime.rt_runtime_us", "0 is not allowed; allowed: "
                                                                    "-1 (no limit"),
    ({"cpus": "1-3", "rt_runtime_us": -2}, "realtime.rt_runtime_us", "-2 is not allowed"),
    ({"cpus": "1-3", "rt_runtime_us": 2**31}, "realtime.rt_runtime_us", "or 1..2147483647 "
                                                                        "microseconds"),
    ({"cpus": "1-3", "rt_runtime_us": "max"}, "realtime.rt_runtime_us", "'max' is not allowed"),
    ({"cpus": "1-3", "rt_runtime_us": True}, "realtime.rt_runtime_us", "true is not allowed"),
])
def test_bad_values_name_file_key_and_what_is_allowed(tmp_path: Path, realtime, where,
                                                       message) -> None:
    with pytest.raises(ProfileError) as err:
        load(tmp_path, realtime)
    assert str(err.value).startswith(f"{tmp_path / 'rt.yaml'}: {where}: "), str(err.value)
    assert message in str(err.value)


def test_tune_steps_need_a_tune_section(tmp_path: Path) -> None:
    doc = {k: v for k, v in BASE.items() if k != "tune"}
    (tmp_path / "rt.yaml").write_text(yaml.safe_dump(
        {**doc, "realtime": {"cpus": "1-3", "irq_affinity": True}}, sort_keys=False))
    with pytest.raises(ProfileError, match="realtime.irq_affinity: true needs a tune section"):
        load_profile("rt", tmp_path)
    (tmp_path / "rt.yaml").write_text(yaml.safe_dump(
        {**doc, "realtime": {"cpus": "1-3", "lock_memory": True}}, sort_keys=False))
    assert load_profile("rt", tmp_path).realtime.lock_memory       # runtime options alone: fine
    (tmp_path / "rt.yaml").write_text(yaml.safe_dump(
        {**doc, "realtime": {"cpus": "1-3", "rt_runtime_us": -1}}, sort_keys=False))
    with pytest.raises(ProfileError, match="realtime.rt_runtime_us: -1 needs a tune section"):
        load_profile("rt", tmp_path)


def test_rt_runtime_us_takes_minus_one_or_a_budget(tmp_path: Path) -> None:
    assert load(tmp_path, {"cpus": "1-3"}).realtime.rt_runtime_us is None   # kernel's own
    assert load(tmp_path, {"cpus": "1-3", "rt_runtime_us": -1}).realtime.rt_runtime_us == -1
    p = load(tmp_path, {"cpus": "1-3", "rt_runtime_us": 990000})
    assert p.realtime.rt_runtime_us == 990000 and "rt_runtime_us: 990000" in profile_yaml(p)
