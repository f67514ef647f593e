"""The emulated nvpmodel and jetson_clocks (colibri_kit/sim/tools/*_v2.py), run as the standalone
programs they are on a device, against a temporary device tree built from the reconstructed confs
and SKU table (colibri_kit/sim/data/). Their output is read back with the product's own parsers
(colibri_kit.jetson), so emulation and product are checked against each other and against the
real strings. No sshd, no namespace: COLIBRI_SIM_ROOT prefixes every device path.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from colibri_kit import jetson

KIT = Path(jetson.__file__).resolve().parent
DATA = KIT / "sim" / "data"
TOOLS = KIT / "sim" / "tools"
SKUS = {k: v for k, v in json.loads((DATA / "skus.json").read_text()).items()
        if not k.startswith("_")}
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]

# Cluster size per SoC (cpuN/cpufreq links to the policy of its cluster, as on a real kernel).
CLUSTER = {"tegra234": 4, "tegra194": 2, "tegra264": 14}
CPU_KHZ = {"tegra234": [115200, 729600, 1190400, 1497600, 1984000, 2201600],
           "tegra194": [115200, 1190400, 1420800, 1907200],
           "tegra264": [972000, 1620000, 2268000, 2601000]}
GPU_HZ = [306000000, 408000000, 612000000, 714000000, 918000000, 1173000000, 1300500000]
GPU = {"tegra234": ("devices/platform/bus@0/17000000.gpu", ["17000000.gpu"], "gpu"),
       "tegra194": ("devices/17000000.gv11b", ["17000000.gv11b"], "gv11b"),
       "tegra264": ("devices/platform/bus@0/d0b0000000.gpu", ["gpu-gpc-0", "gpu-nvd-0"], "gpu")}


def put(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text)


def build_device(base: Path, key: str) -> Path:
    """A device tree for SKU ``key`` at its real paths under ``base``, booted by nvpmodel."""
    s = SKUS[key]
    root = base / key
    soc = s["soc"]
    put(root / "etc/nvpmodel.conf", (DATA / "nvpmodel" / s["conf"]).read_text())
    put(root / "etc/nv_tegra_release", s["nv_tegra_release"] + "\n")
    dt = root / "sys/firmware/devicetree/base"
    put(dt / "model", (s["model"] + "\0").encode())
    put(dt / "compatible", "".join(c + "\0" for c in s["compatible"]).encode())
    cpu = root / "sys/devices/system/cpu"
    n = s["cpus"]
    put(cpu / "present", f"0-{n - 1}\n")
    put(cpu / "online", f"0-{n - 1}\n")
    khz = CPU_KHZ[soc]
    for c in range(n):
        put(cpu / f"cpu{c}/online", "1\n")
        for st, name in ((0, "C1"), (1, "c7")):
            put(cpu / f"cpu{c}/cpuidle/state{st}/name", name + "\n")
            put(cpu / f"cpu{c}/cpuidle/state{st}/disable", "0\n")
        policy = c - c % CLUSTER[soc]
        pol = cpu / f"cpufreq/policy{policy}"
        if c == policy:
            for name, value in (("scaling_available_frequencies", " ".join(map(str, khz)) + " "),
                                ("scaling_min_freq", khz[0]), ("scaling_max_freq", khz[-1]),
                                ("scaling_cur_freq", khz[0]), ("cpuinfo_min_freq", khz[0]),
                                ("cpuinfo_max_freq", khz[-1]),
                                ("scaling_governor", "schedutil")):
                put(pol / name, f"{value}\n")
        (cpu / f"cpu{c}/cpufreq").symlink_to(f"../cpufreq/policy{policy}")
    gdir, nodes, of_name = GPU[soc]
    dev = root / "sys" / gdir
    put(dev / "of_node/name", of_name + "\0")
    for node in nodes:
        d = dev / "devfreq" / node
        put(d / "available_frequencies", " ".join(map(str, GPU_HZ)) + "\n")
        for name in ("min_freq", "cur_freq"):
            put(d / name, f"{GPU_HZ[0]}\n")
        put(d / "max_freq", f"{GPU_HZ[-1]}\n")
        put(d / "governor", "nvhost_podgov\n")
        (d / "device").symlink_to("../..")
        cls = root / "sys/class/devfreq"
        cls.mkdir(parents=True, exist_ok=True)
        (cls / node).symlink_to(os.path.relpath(d, cls))
    vic = root / "sys/devices/platform/15340000.vic/devfreq/15340000.vic"   # not a GPU
    put(vic / "min_freq", "115200000\n")
    put(vic / "max_freq", "115200000\n")
    put(vic.parent.parent / "of_node/name", "vic\0")
    (vic / "device").symlink_to("../..")
    (root / "sys/class/devfreq/15340000.vic").symlink_to(
        os.path.relpath(vic, root / "sys/class/devfreq"))
    gpu0 = root / "sys/devices/platform/gpu.0"
    put(gpu0 / "tpc_pg_mask", "0\n")
    put(gpu0 / "railgate_enable", "1\n")
    put(gpu0 / "power/control", "auto\n")
    emc = root / "sys/kernel/debug/bpmp/debug/clk/emc"
    for name, value in (("min_rate", 204000000), ("max_rate", 3199000000), ("rate", 204000000),
                        ("mrq_rate_locked", 0)):
        put(emc / name, f"{value}\n")
    put(root / "sys/kernel/nvpmodel_emc_cap/emc_iso_cap", "0\n")
    put(root / "sys/devices/platform/pwm-fan/hwmon/hwmon0/pwm1", "64\n")
    (root / "var/lib/nvpmodel").mkdir(parents=True)
    (root / "root").mkdir()
    r = run(root, "nvpmodel", "--sim-boot")
    assert r.returncode == 0, r.stderr
    return root


def run(root: Path, tool: str, *args: str, stdin: str | None = None,
        prefix: list[str] | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    script = TOOLS / f"{tool}_v2.py"
    e = {"PATH": os.environ["PATH"], "HOME": "/root", "COLIBRI_SIM_ROOT": str(root),
         "COLIBRI_SIM_REBOOT": f"sh -c {shlex.quote('echo reboot >> ' + str(root / 'reboots'))}"}
    e.update(env or {})
    return subprocess.run([*(prefix or []), sys.executable, "-I", "-S", str(script), *args],
                          input=stdin, stdin=None if stdin is not None else subprocess.DEVNULL,
                          capture_output=True, text=True, env=e, timeout=30)


@pytest.fixture(scope="module")
def base():
    # Readable by the unprivileged user the non-root checks run as.
    d = Path(tempfile.mkdtemp(prefix="colibri-jetson-tools-"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def fresh(base: Path, key: str) -> Path:
    root = base / key
    if root.exists():
        shutil.rmtree(root)
    return build_device(base, key)


def rd(root: Path, path: str) -> str:
    return (root / path.lstrip("/")).read_text().strip()


def query(root: Path) -> tuple[str, int]:
    r = run(root, "nvpmodel", "-q")
    assert r.returncode == 0, r.stderr
    return jetson.parse_nvpmodel_query(r.stdout)


# ----------------------------------------------------------------------------- nvpmodel

@pytest.mark.parametrize("key", sorted(SKUS))
def test_parse_verbose_output_matches_the_conf(base, key):
    root = fresh(base, key)
    r = run(root, "nvpmodel", "-p", "--verbose")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("NVPM VERB: Config file: /etc/nvpmodel.conf\n")
    from_tool = jetson.parse_nvpmodel_verbose(r.stdout)
    from_file = jetson.parse_nvpmodel_conf(rd(root, "etc/nvpmodel.conf"))
    assert from_tool.default_id == from_file.default_id
    assert [(m.id, m.name, m.tpc_pg_mask) for m in from_tool.modes] == \
        [(m.id, m.name, m.tpc_pg_mask) for m in from_file.modes]
    # The device boots in its default mode, its live mask that mode's.
    name, mid = query(root)
    assert mid == from_file.default_id and name == from_file.by_id(mid).name
    assert rd(root, "sys/devices/platform/gpu.0/tpc_pg_mask") == from_file.by_id(mid).tpc_pg_mask
    if "-1" in r.stdout.split():
        pytest.fail("-1 caps must print as 2147483647, as the real tool does")


def test_query_prints_the_fan_warning_first_and_verbose_form(base):
    root = fresh(base, "orin-nx-16gb")
    r = run(root, "nvpmodel", "-q")
    assert r.stdout == "NVPM WARN: fan mode is not set!\nNV Power Mode: 15W\n2\n"
    (root / "var/lib/nvpmodel/status").write_text("pmode:0002 fmode:quiet\n")
    assert run(root, "nvpmodel", "-q").stdout == "NV Power Mode: 15W\n2\n"
    v = run(root, "nvpmodel", "-q", "--verbose").stdout
    assert "NVPM VERB: Current mode: NV Power Mode: 15W\n2\n" in v
    assert jetson.parse_nvpmodel_query(v) == ("15W", 2)


def test_orin_nx_15w_to_10w_is_live(base):
    root = fresh(base, "orin-nx-16gb")
    r = run(root, "nvpmodel", "-m", "1")
    assert (r.returncode, r.stdout, r.stderr) == (0, "", "")
    assert query(root) == ("10W", 1)
    assert rd(root, "sys/devices/system/cpu/online") == "0-3"
    assert rd(root, "sys/devices/system/cpu/cpu4/online") == "0"
    assert rd(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_max_freq") == "1190400"
    assert rd(root, "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu/max_freq") \
        == "612000000"
    assert rd(root, "sys/kernel/nvpmodel_emc_cap/emc_iso_cap") == "2133000000"
    assert not (root / "reboots").exists()


@pytest.mark.parametrize("answer", [None, "no\n", "\n", "maybe\n"])
def test_orin_nx_15w_to_maxn_asks_for_a_reboot_and_changes_nothing_without_yes(base, answer):
    root = fresh(base, "orin-nx-16gb")
    before = rd(root, "var/lib/nvpmodel/status")
    r = run(root, "nvpmodel", "-m", "0", stdin=answer)
    assert r.stdout == ("NVPM WARN: Reboot required for changing to this power mode: 0\n"
                        "NVPM WARN: DO YOU WANT TO REBOOT NOW? enter YES/yes to confirm:\n"
                        "NVPM ERROR: bad input!\n"
                        "NVPM ERROR: optMask is 1, no request for power mode\n")
    assert r.returncode == 234
    assert rd(root, "var/lib/nvpmodel/status") == before
    assert query(root) == ("15W", 2)
    assert not (root / "reboots").exists()


def test_orin_nx_15w_to_maxn_with_yes_reboots_into_maxn(base):
    root = fresh(base, "orin-nx-16gb")
    r = run(root, "nvpmodel", "-m", "0", stdin="YES\n")
    assert r.returncode == 0, r.stderr
    assert "Reboot required for changing to this power mode: 0" in r.stdout
    assert rd(root, "reboots") == "reboot"
    # Pending: the status names MAXN, the GPU still runs the 15W mask and 4 CPUs until the boot.
    assert query(root) == ("MAXN", 0)
    assert rd(root, "sys/devices/platform/gpu.0/tpc_pg_mask") == "252"
    assert rd(root, "sys/devices/system/cpu/online") == "0-3"
    assert run(root, "nvpmodel", "--sim-boot").returncode == 0
    assert rd(root, "sys/devices/platform/gpu.0/tpc_pg_mask") == "240"
    assert rd(root, "sys/devices/system/cpu/online") == "0-7"
    assert rd(root, "sys/devices/system/cpu/cpu4/cpufreq/scaling_max_freq") == "2201600"
    # Back in a 240 mode: 25W is live, 15W needs a reboot again.
    assert run(root, "nvpmodel", "-m", "3").returncode == 0
    assert run(root, "nvpmodel", "-m", "2").returncode == 234


@pytest.mark.parametrize("key, frm, to, reboot", [
    ("agx-orin-64gb", "MODE_30W", "MAXN", True),
    ("agx-orin-64gb", "MODE_50W", "MAXN", False),
    ("agx-thor", "120W", "MAXN", False),
    ("agx-thor", "120W", "90W", True),
    ("xavier-nx", "MODE_15W_6CORE", "MODE_20W_6CORE", False),
    ("orin-nx-16gb-super", "40W", "MAXN_SUPER", False),
    ("orin-nano-8gb-super", "25W", "MAXN_SUPER", False),
])
def test_reboot_decision_agrees_with_the_product_rule(base, key, frm, to, reboot):
    root = fresh(base, key)
    conf = jetson.parse_nvpmodel_conf(rd(root, "etc/nvpmodel.conf"))
    src, dst = conf.by_name(frm).id, conf.by_name(to).id
    if query(root)[1] != src:
        assert run(root, "nvpmodel", "-m", str(src), stdin="YES\n").returncode == 0
        run(root, "nvpmodel", "--sim-boot")
    assert jetson.reboot_required(conf, src, dst) is reboot
    r = run(root, "nvpmodel", "-m", str(dst))
    assert ("Reboot required" in r.stdout) is reboot
    assert r.returncode == (234 if reboot else 0)
    assert query(root)[1] == (src if reboot else dst)


def test_nvpmodel_refusals(base):
    root = fresh(base, "orin-nx-16gb")
    r = run(root, "nvpmodel", "-m", "9")
    assert r.returncode == 1 and "Invalid power mode ID 9" in r.stderr
    r = run(root, "nvpmodel", "-m", "x")
    assert r.returncode == 1
    r = run(root, "nvpmodel", "--bogus")
    assert r.returncode == 1 and "usage" in r.stderr
    (root / "etc/nvpmodel.conf").write_text("< POWER_MODEL ID=0 NAME=A >\n")
    assert "no valid PM_CONFIG DEFAULT" in run(root, "nvpmodel", "-q").stderr


def test_nvpmodel_switch_needs_root_query_does_not(base):
    root = fresh(base, "orin-nx-16gb")
    prefix = NOBODY if os.geteuid() == 0 else []
    r = run(root, "nvpmodel", "-m", "1", prefix=prefix)
    assert r.returncode == 1 and "root" in r.stderr
    assert jetson.parse_nvpmodel_query(run(root, "nvpmodel", "-q", prefix=prefix).stdout) \
        == ("15W", 2)


# ----------------------------------------------------------------------------- jetson_clocks

GPU_NODE = "sys/devices/platform/bus@0/17000000.gpu/devfreq/17000000.gpu"


def test_store_then_max_then_restore_round_trip(base):
    root = fresh(base, "orin-nx-16gb")
    r = run(root, "jetson_clocks", "--store", "/opt/colibri/tune/l4t_dfs.conf")
    # Its directory must exist; like the script, a failed write still exits 0.
    assert r.returncode == 0 and "No such file or directory" in r.stderr
    assert not (root / "opt/colibri/tune/l4t_dfs.conf").exists()
    (root / "opt/colibri/tune").mkdir(parents=True)
    r = run(root, "jetson_clocks", "--store", "/opt/colibri/tune/l4t_dfs.conf")
    assert (r.returncode, r.stdout) == (
        0, "Storing system configuration in /opt/colibri/tune/l4t_dfs.conf\n")
    stored = (root / "opt/colibri/tune/l4t_dfs.conf").read_text().splitlines()
    assert "/sys/devices/system/cpu/cpu0/online:1" in stored
    assert "/sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq:729600" in stored
    assert "/sys/devices/system/cpu/cpu3/cpuidle/state1/disable:0" in stored
    # The script stores the GPU through its class link, as it found it.
    assert "/sys/class/devfreq/17000000.gpu/min_freq:306000000" in stored
    assert "/sys/devices/platform/gpu.0/railgate_enable:1" in stored
    assert "/sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked:0" in stored
    assert "/root/.jetsonclocks_fan.txt:inactive" in stored
    assert all(":" in line and line.startswith("/") for line in stored)

    r = run(root, "jetson_clocks")
    assert r.returncode == 0 and r.stdout == ""
    # 15W caps the cluster at 1497600: min follows the capped max.
    assert rd(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq") == "1497600"
    assert rd(root, f"{GPU_NODE}/min_freq") == rd(root, f"{GPU_NODE}/max_freq") == "714000000"
    assert rd(root, "sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked") == "1"
    assert rd(root, "sys/devices/system/cpu/cpu2/cpuidle/state0/disable") == "1"
    assert rd(root, "sys/devices/platform/gpu.0/railgate_enable") == "0"
    assert rd(root, "sys/devices/platform/pwm-fan/hwmon/hwmon0/pwm1") == "64"   # only --fan

    r = run(root, "jetson_clocks", "--restore", "/opt/colibri/tune/l4t_dfs.conf")
    assert (r.returncode, r.stdout) == (
        0, "Restoring system configuration from /opt/colibri/tune/l4t_dfs.conf\n")
    assert rd(root, "sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq") == "729600"
    assert rd(root, f"{GPU_NODE}/min_freq") == "306000000"
    assert rd(root, "sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked") == "0"
    assert rd(root, "sys/devices/system/cpu/cpu2/cpuidle/state0/disable") == "0"
    assert rd(root, "sys/devices/platform/gpu.0/railgate_enable") == "1"


def test_store_over_an_existing_file_asks_and_refuses_without_y(base):
    root = fresh(base, "orin-nx-16gb")
    conf = root / "root/.jetsonclocks_conf.txt"     # the script's default file
    assert run(root, "jetson_clocks", "--store").returncode == 0
    first = conf.read_text()
    run(root, "jetson_clocks")
    for answer in (None, "n\n", "YES\n"):
        r = run(root, "jetson_clocks", "--store", stdin=answer)
        assert r.returncode == 1
        assert r.stdout == ("File /root/.jetsonclocks_conf.txt already exists. Can I overwrite "
                            "it? Y/N:\nError: file /root/.jetsonclocks_conf.txt already exists!\n")
        assert conf.read_text() == first
    r = run(root, "jetson_clocks", "--store", stdin="y\n")
    assert r.returncode == 0 and "Storing system configuration" in r.stdout
    assert conf.read_text() != first and "scaling_min_freq:1497600" in conf.read_text()


def test_restore_reports_failures_and_still_exits_0(base):
    root = fresh(base, "orin-nx-16gb")
    bad = root / "root/bad.conf"
    bad.write_text("/sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked:1\n"
                   "/sys/does/not/exist:5\n/etc/shadow:x\n/sys/../etc/passwd:x\n")
    r = run(root, "jetson_clocks", "--restore", "/root/bad.conf")
    assert r.returncode == 0
    assert r.stdout.splitlines() == [
        "Restoring system configuration from /root/bad.conf",
        "Error: Failed to restore /sys/does/not/exist",
        "Error: Failed to restore /etc/shadow",
        "Error: Failed to restore /sys/../etc/passwd"]
    assert rd(root, "sys/kernel/debug/bpmp/debug/clk/emc/mrq_rate_locked") == "1"
    assert not (root / "etc/shadow").exists()
    r = run(root, "jetson_clocks", "--restore", "/root/none.conf")
    assert (r.returncode, r.stdout) == (1, "Error: /root/none.conf file not found !\n")


def test_store_survives_a_missing_home(base):
    root = fresh(base, "xavier-nx")
    r = run(root, "jetson_clocks", "--store", "/root/x.conf", env={"HOME": "/nonexistent"})
    assert r.returncode == 0 and "/nonexistent/.jetsonclocks_fan.txt" in r.stderr
    assert "/sys/class/devfreq/17000000.gv11b/min_freq:" in (root / "root/x.conf").read_text()


def test_show_and_fan(base):
    root = fresh(base, "orin-nx-16gb")
    assert run(root, "jetson_clocks", "--fan").returncode == 0
    assert rd(root, "sys/devices/platform/pwm-fan/hwmon/hwmon0/pwm1") == "255"
    out = run(root, "jetson_clocks", "--show").stdout.splitlines()
    assert out[0] == ("SOC family:tegra234  Machine:NVIDIA Jetson Orin NX Engineering Reference "
                      "Developer Kit")
    assert out[1] == "Online CPUs: 0-3"
    assert out[2].startswith("cpu0: Online=1 Governor=schedutil MinFreq=1497600 MaxFreq=1497600")
    assert "IdleStates: C1=0 c7=0" in out[2]
    assert any(line.startswith("GPU MinFreq=714000000 MaxFreq=714000000") for line in out)
    assert any(line.startswith("EMC MinFreq=204000000 MaxFreq=3199000000") for line in out)
    assert "FAN Dynamic Speed control=inactive hwmon0_pwm1=255" in out
    assert out[-1] == "NV Power Mode: 15W"


def test_thor_locks_both_gpu_domains(base):
    root = fresh(base, "agx-thor")
    assert run(root, "jetson_clocks", "--store", "/root/t.conf").returncode == 0
    stored = (root / "root/t.conf").read_text()
    assert run(root, "jetson_clocks").returncode == 0
    for node in ("gpu-gpc-0", "gpu-nvd-0"):
        d = f"sys/devices/platform/bus@0/d0b0000000.gpu/devfreq/{node}"
        assert f"/sys/class/devfreq/{node}/min_freq:" in stored
        assert rd(root, f"{d}/min_freq") == rd(root, f"{d}/max_freq")
    vic = "sys/devices/platform/15340000.vic/devfreq/15340000.vic/min_freq"
    assert rd(root, vic) == "115200000"          # not a GPU: left alone


def test_jetson_clocks_needs_root_and_rejects_unknown_options(base):
    root = fresh(base, "orin-nx-16gb")
    if os.geteuid() == 0:
        r = run(root, "jetson_clocks", prefix=NOBODY)
        assert r.returncode == 1 and "as a root user" in r.stdout
    r = run(root, "jetson_clocks", "--bogus")
    assert r.returncode == 1 and r.stdout == "Unknown option: --bogus\n"


def test_tools_are_standalone():
    for tool in TOOLS.glob("*_v2.py"):
        text = tool.read_text()
        assert "colibri_kit" not in text.split('"""', 2)[2], tool   # only in the docstring
        assert text.startswith("#!/usr/bin/env python3\n")
