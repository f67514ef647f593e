"""The rendered colibri.service: the real `systemd-analyze verify` accepts it, the real
`systemd-analyze security` rates every target's 2.0 or lower, hostile values never reach it, and a
profile's `service:` section parses with errors that name the key path.
(The unit running under a real systemd is tests/test_sim_systemd.py.)"""

from __future__ import annotations

import re

import pytest
import yaml
from unit_support import directives, exposure

from colibri_kit.errors import ProfileError
from colibri_kit.paths import project_root
from colibri_kit.profiles import load_profile
from colibri_kit.service import (JETSON_GPU_NODES, Privileges, ServiceError, ServiceSpec, cpus_of,
                                 device_files, health_gate, install_commands, parse_cpu_list,
                                 parse_service, render_sysusers, render_unit, service_dict,
                                 unit_privileges, verify_unit)

FULL = ServiceSpec(port=8443, bind="0.0.0.0", slots=2, threads=3, cpu_affinity="2-5 7", nice=-5,
                   memory_max="6G", api_key_file="/etc/colibri/api-key", max_queue=32,
                   backend="cuda", model_id="mixtral-tiny", root="/data/colibri")


def test_default_unit_verifies_and_runs_the_current_release():
    text = render_unit(ServiceSpec())
    assert verify_unit(text) == ""
    d = directives(text)
    assert d["ExecStart"] == ["/opt/colibri/current/bin/colibri serve /opt/colibri/current/model.colibri "
                              "--host 127.0.0.1 --port 8080 --slots 1 --max-queue 16 --backend auto "
                              "--drain-timeout 30000"]
    assert d["User"] == ["colibri"] and d["Restart"] == ["on-failure"]
    assert "LoadCredential" not in d and "CPUAffinity" not in d and "MemoryMax" not in d
    assert d["WantedBy"] == ["multi-user.target"]


def test_full_unit_verifies_with_hardening_and_limits():
    text = render_unit(FULL, target="orin-nx")
    assert verify_unit(text) == ""
    d = directives(text)
    for key, value in [("NoNewPrivileges", "yes"), ("ProtectSystem", "strict"), ("ProtectHome", "yes"),
                       ("PrivateTmp", "yes"), ("ReadOnlyPaths", "/data/colibri"),
                       ("CPUAffinity", "2-5 7"), ("MemoryMax", "6G"), ("Nice", "-5"),
                       ("SupplementaryGroups", "video"), ("TimeoutStopSec", "40")]:
        assert d[key] == [value], key
    exec_start = d["ExecStart"][0]
    assert exec_start.startswith("/data/colibri/current/bin/colibri serve /data/colibri/current/model.colibri ")
    assert "--host 0.0.0.0 --port 8443 --slots 2 --max-queue 32 --backend cuda" in exec_start
    assert "--threads 3 --model-id mixtral-tiny" in exec_start
    # the key is a credential: a path in the command line, never the key or its file there
    assert exec_start.endswith("--api-key-file %d/api-key")
    assert d["LoadCredential"] == ["api-key:/etc/colibri/api-key"]
    assert "Environment" not in d and "/etc/colibri/api-key" not in exec_start
    assert render_unit(FULL, target="orin-nx") == text  # deterministic


def test_verify_finds_what_systemd_would_ignore():
    text = render_unit(ServiceSpec())
    for broken, words in [(text.replace("UMask=0077", "UMask=0077\nFrobnicate=yes"), "Unknown key"),
                          (text.replace("Nice=0", "Nice=40"), "Nice"),
                          (text.replace("[Install]", "[Instal]"), "Unknown section")]:
        with pytest.raises(ServiceError, match=words):
            verify_unit(broken)


HOSTILE = [
    (dict(port=0), "port"), (dict(port=65536), "port"), (dict(port="8080"), "port"),
    (dict(port=True), "port"), (dict(slots=0), "slots"), (dict(threads=65), "threads"),
    (dict(nice=20), "nice"), (dict(nice=-21), "nice"), (dict(max_queue=-1), "max_queue"),
    (dict(bind="127.0.0.1\nExecStartPre=/bin/sh -c id"), "bind"),
    (dict(bind="example.com"), "bind"), (dict(bind="fe80::1%eth0"), "bind"),
    (dict(bind="0.0.0.0"), "bind"),                           # beyond loopback without a key
    (dict(cpu_affinity="0-3\nUser=root"), "cpu_affinity"), (dict(cpu_affinity="0-3,5"), "cpu_affinity"),
    (dict(memory_max="1G\nMemoryMax=infinity"), "memory_max"), (dict(memory_max="%d"), "memory_max"),
    (dict(memory_max="0"), "memory_max"), (dict(memory_max="101%"), "memory_max"),
    (dict(api_key_file="etc/key"), "api_key_file"), (dict(api_key_file="/etc/key file"), "api_key_file"),
    (dict(api_key_file="/etc/../shadow"), "api_key_file"), (dict(api_key_file="/etc/%n"), "api_key_file"),
    (dict(api_key_file="/etc/k\nExecStart=/bin/sh"), "api_key_file"),
    (dict(root="/opt/colibri;rm"), "root"), (dict(root="/"), "root"), (dict(root="/opt//x"), "root"),
    (dict(root="/opt/colibri/"), "root"), (dict(root="/home/jetson/colibri"), "root"),
    (dict(root="/tmp/colibri"), "root"), (dict(root="/root"), "root"), (dict(user="root"), "user"), (dict(user="Colibri"), "user"),
    (dict(user="c b"), "user"), (dict(groups=("video\nUser=root",)), "groups"),
    (dict(backend="tpu"), "backend"), (dict(restart_sec=0), "restart_sec"),
    (dict(model_id="my model"), "model_id"), (dict(model_id="-x"), "model_id"),
    # a trailing newline (a YAML block scalar can carry one) would end the directive early
    (dict(api_key_file="/etc/colibri/api-key\n"), "api_key_file"), (dict(user="colibri\n"), "user"),
    (dict(memory_max="1G\n"), "memory_max"), (dict(model_id="tiny\n"), "model_id"),
    (dict(cpu_affinity="0-3\n"), "cpu_affinity"), (dict(bind="127.0.0.1\n"), "bind"),
    (dict(root="/opt/colibri\n"), "root"), (dict(groups=("video\n",)), "groups"),
]


def test_beyond_loopback_needs_a_key():
    with pytest.raises(ServiceError, match="set api_key_file too"):
        ServiceSpec(bind="0.0.0.0")
    assert ServiceSpec(bind="0.0.0.0", api_key_file="/etc/colibri/api-key").loopback is False


@pytest.mark.parametrize("kw,field", HOSTILE, ids=[f"{i}-{f}" for i, (_, f) in enumerate(HOSTILE)])
def test_hostile_values_never_reach_the_unit(kw, field):
    with pytest.raises(ServiceError) as err:
        ServiceSpec(**kw)
    assert str(err.value).startswith(f"{field}: ")


def test_cpu_lists_are_normalised():
    assert parse_cpu_list("0-3,6") == "0-3 6"
    assert parse_cpu_list(" 2 , 4-5 ") == "2 4-5"
    assert parse_cpu_list([0, 1, 7]) == "0 1 7"
    assert parse_cpu_list(5) == "5"
    assert parse_cpu_list("3-3") == "3"
    assert cpus_of("0-2 5") == [0, 1, 2, 5]
    for bad in ["", "3-1", "a", "1-", "0-99999", [], [True], "1;2", True, 1.5]:
        with pytest.raises(ServiceError):
            parse_cpu_list(bad)


def test_service_section_parses_from_yaml():
    raw = yaml.safe_load("""
        port: 8443
        bind: 0.0.0.0
        slots: 2
        threads: 3
        cpu_affinity: 2-5,7
        nice: -5
        memory_max: 6G
        api_key_file: /etc/colibri/api-key
        max_queue: 32
        backend: cuda
        model_id: mixtral-tiny
    """)
    assert parse_service(raw, root="/data/colibri") == FULL
    assert parse_service({}) == ServiceSpec()
    assert parse_service({"memory_max": 1073741824, "groups": []}).memory_max == "1073741824"
    assert service_dict(FULL)["cpu_affinity"] == "2-5 7"
    assert parse_service(service_dict(FULL), root="/data/colibri") == FULL  # round trip


@pytest.mark.parametrize("raw,where,words", [
    ({"prot": 8080}, "service.prot", "allowed keys: port, bind"),
    ({"port": "8080"}, "service.port", "an integer 1..65535"),
    ({"port": 99999}, "service.port", "an integer 1..65535"),
    ({"backend": "tpu"}, "service.backend", "auto, cpu, cuda"),
    ({"cpu_affinity": "0-3;7"}, "service.cpu_affinity", "CPU number or range"),
    ({"groups": "video"}, "service.groups", "a list of group names"),
    ({"bind": "0.0.0.0"}, "service.bind", "set api_key_file"),
    ({"memory_max": "lots"}, "service.memory_max", "512M, 6G"),
    ("fast", "service", "expected a mapping"),
])
def test_service_section_errors_name_the_key_path(raw, where, words):
    with pytest.raises(ProfileError) as err:
        parse_service(raw)
    assert str(err.value).startswith(f"{where}: ")
    assert words in str(err.value)


def test_service_section_errors_go_through_the_callers_fail():
    seen = []

    def fail(kpath, msg):
        seen.append(kpath)
        return ProfileError(f"targets/orin-nx.yaml: {'.'.join(kpath)}: {msg}")

    with pytest.raises(ProfileError, match=r"^targets/orin-nx.yaml: service.nice: "):
        parse_service({"nice": 42}, fail=fail)
    assert seen == [("service", "nice")]


def test_sysusers_line_and_health_url():
    assert render_sysusers(ServiceSpec()).splitlines()[1] == \
        'u colibri - "Colibri inference service" /nonexistent /usr/sbin/nologin'
    assert ServiceSpec(port=9000).health_url == "http://127.0.0.1:9000/health"
    assert FULL.health_url == "http://127.0.0.1:8443/health"
    assert ServiceSpec(bind="::1").health_url == "http://[::1]:8080/health"
    assert ServiceSpec(bind="192.0.2.7", api_key_file="/etc/k").health_url == "http://192.0.2.7:8080/health"
    assert ServiceSpec().with_root("/data/c").root == "/data/c"
    with pytest.raises(ServiceError, match="root"):
        ServiceSpec().with_root("/data/c d")


def test_health_gate_gives_up_at_its_deadline():
    """A service that never gets healthy (here: /health stays 503 while 'loading'): the timeout
    path, which a real service would need minutes to show; the healthy and failed paths run
    against a real systemd in tests/test_sim_systemd.py."""
    calls: list[list[str]] = []
    now = [0.0]

    def run(argv):
        calls.append(argv)
        return (3, "activating\n") if argv[:2] == ["systemctl", "is-failed"] else (0, "503")

    gate = health_gate(run, ServiceSpec(port=9001), timeout=5, poll=1,
                       clock=lambda: now[0], sleep=lambda s: now.__setitem__(0, now[0] + s))
    assert not gate.ok and gate.state == "timeout" and gate.waited_s == 5
    assert gate.detail == "/health 503"
    assert ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "2", "--",
            "http://127.0.0.1:9001/health"] in calls
    with pytest.raises(ServiceError, match="unit name"):
        health_gate(run, ServiceSpec(), unit="x; reboot")


def test_device_files_and_install_commands():
    files = device_files(FULL, target="orin-nx")
    assert files == {"/etc/sysusers.d/colibri.conf": render_sysusers(FULL),
                     "/etc/systemd/system/colibri.service": render_unit(FULL, target="orin-nx")}
    assert install_commands() == [["systemd-sysusers", "/etc/sysusers.d/colibri.conf"],
                                  ["systemctl", "daemon-reload"],
                                  ["systemctl", "enable", "colibri.service"]]
    assert install_commands("colibri-b.service", enable=False)[-1] == ["systemctl", "daemon-reload"]


def _targets_with_a_service() -> list[str]:
    names = sorted(p.stem for p in (project_root() / "targets").glob("[a-z]*.yaml"))
    return [n for n in names if load_profile(n).service is not None]


@pytest.mark.parametrize("target", _targets_with_a_service())
def test_every_targets_unit_is_rated_2_or_lower(target, tmp_path):
    """Issue #21 item 8: the orin-nx unit was rated 5.6 MEDIUM (no CapabilityBoundingSet=, no
    system call filter, no device policy, /proc open, ...)."""
    text = render_unit(load_profile(target).service, target=target)
    score, table = exposure(text, tmp_path)
    assert score <= 2.0, table


@pytest.mark.parametrize("spec", [FULL, ServiceSpec(port=80), ServiceSpec(backend="cpu")],
                         ids=["full", "port-80", "cpu-only"])
def test_other_settings_are_rated_2_or_lower_too(spec, tmp_path):
    text = render_unit(spec, target="orin-nx")
    assert verify_unit(text) == ""
    score, table = exposure(text, tmp_path)
    assert score <= 2.0, table


def test_the_unit_keeps_the_jetson_gpu_nodes_and_nothing_else():
    d = directives(render_unit(load_profile("orin-nx").service, target="orin-nx"))
    assert d["DevicePolicy"] == ["closed"]
    allowed = [v.rsplit(" ", 1) for v in d["DeviceAllow"]]
    assert all(mode == "rw" for _, mode in allowed)
    nodes = [n for n, _ in allowed]
    assert nodes == list(JETSON_GPU_NODES) and len(set(nodes)) == len(nodes)
    for node in ("/dev/nvmap", "/dev/nvhost-ctrl-gpu", "/dev/nvhost-gpu", "/dev/nvhost-as-gpu",
                 "/dev/nvgpu/igpu0/ctrl", "/dev/nvgpu/igpu0/channel", "/dev/nvidiactl"):
        assert node in nodes, node
    assert not [n for n in nodes if re.search(r"nvdec|nvenc|nvjpg|vic|dla|pva|fb|dri|video", n)]
    assert d["SupplementaryGroups"] == ["video"]   # JetPack's udev rules give the nodes to video
    cpu = directives(render_unit(ServiceSpec(backend="cpu")))
    assert cpu["DevicePolicy"] == ["closed"] and "DeviceAllow" not in cpu


def test_no_privileges_unless_a_low_port_needs_one():
    d = directives(render_unit(ServiceSpec()))
    assert d["CapabilityBoundingSet"] == [""] and d["AmbientCapabilities"] == [""]
    assert d["RestrictRealtime"] == ["yes"] and d["NoNewPrivileges"] == ["yes"]
    assert d["SystemCallFilter"] == ["@system-service", "~@privileged @resources"]
    assert d["SystemCallErrorNumber"] == ["EPERM"] and d["ProtectProc"] == ["invisible"]
    assert not [k for k in d if k.startswith("Limit") and k != "LimitNOFILE"]
    low = directives(render_unit(ServiceSpec(port=443)))
    assert low["CapabilityBoundingSet"] == ["CAP_NET_BIND_SERVICE"]
    assert low["AmbientCapabilities"] == ["CAP_NET_BIND_SERVICE"]
    assert unit_privileges(ServiceSpec()) == Privileges()
