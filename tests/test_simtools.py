"""The emulated Jetson trees (colibri_kit.sim.device_files.populate): per SKU of
colibri_kit/sim/data/skus.json, with its real-format nvpmodel conf and the v2 tools installed, as
a device shows them. The tools themselves are tested as programs in tests/test_jetson_tools.py;
here they run from the populated tree (the installed files), with COLIBRI_SIM_ROOT, and once in a
private mount namespace at the real paths. Everything read back goes through the product's
parsers (colibri_kit.jetson).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from colibri_kit import jetson
from colibri_kit.sim.device_files import ALIASES, populate, skus

SKUS = skus()
NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file and link under root: the bytes a round trip must give back."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = b"-> " + os.readlink(path).encode()
        elif path.is_file():
            out[rel] = path.read_bytes()
    return out


def tool(root: Path, name: str, *args: str, stdin: str | None = None,
         prefix: list[str] = ()) -> subprocess.CompletedProcess[str]:
    rel = {"nvpmodel": "usr/sbin/nvpmodel", "jetson_clocks": "usr/bin/jetson_clocks",
           "reboot": "usr/sbin/reboot"}[name]
    env = {"PATH": os.environ["PATH"], "COLIBRI_SIM_ROOT": str(root), "HOME": "/root"}
    kwargs = {"input": stdin} if stdin is not None else {"stdin": subprocess.DEVNULL}
    return subprocess.run([*prefix, str(root / rel), *args], capture_output=True, text=True,
                          env=env, timeout=30, **kwargs)


@pytest.mark.parametrize("key", sorted(SKUS))
def test_populate_is_the_sku_as_a_device_reports_it(tmp_path: Path, key: str) -> None:
    s, root = SKUS[key], tmp_path / "root"
    populate(root, key)
    assert (root / "etc/nv_tegra_release").read_text().splitlines()[0] == s["nv_tegra_release"]
    dt = root / "sys/firmware/devicetree/base"
    assert (dt / "model").read_bytes() == s["model"].encode() + b"\0"
    meminfo = (root / "proc/meminfo").read_text()
    assert jetson.parse_meminfo_kb(meminfo) == s["memtotal_kb"]
    cpus = jetson.parse_cpu_list((root / "sys/devices/system/cpu/present").read_text())
    sku = jetson.identify_sku((dt / "model").read_bytes(), (dt / "compatible").read_bytes(),
                              s["memtotal_kb"], cpus)
    assert sku.key == key.removesuffix("-super") and sku.soc == s["soc"]
    # Booted by nvpmodel: the default mode, its mask live on the GPU.
    conf = jetson.parse_nvpmodel_conf((root / "etc/nvpmodel.conf").read_text())
    name, mid = jetson.parse_nvpmodel_query(tool(root, "nvpmodel", "-q").stdout)
    assert mid == conf.default_id and name == conf.by_id(mid).name
    live = (root / "sys/devices/platform/gpu.0/tpc_pg_mask").read_text().strip()
    assert not jetson.reboot_pending(conf, mid, live)
    # GPU domains by of_node name, as the kit finds them; the VIC is not one.
    cls = root / "sys/class/devfreq"
    nodes = {n.name: ((n / "device/of_node/name").read_text() if (n / "device/of_node/name")
                      .exists() else None) for n in cls.iterdir()}
    want = ["gpu-gpc-0", "gpu-nvd-0"] if s["soc"] == "tegra264" else \
        ["17000000.gv11b" if s["soc"] == "tegra194" else "17000000.gpu"]
    assert jetson.gpu_devfreq_nodes(nodes) == want


def test_aliases_name_the_factory_skus() -> None:
    assert ALIASES == {"orin-nx": "orin-nx-16gb", "orin-nano": "orin-nano-8gb",
                       "agx-orin": "agx-orin-64gb"}
    with pytest.raises(ValueError, match="unknown emulated module 'tx2'"):
        populate(Path(tempfile.gettempdir()) / "never", "tx2")


@pytest.mark.parametrize("key", ["orin-nx", "agx-thor", "xavier-nx"])
def test_clocks_pinned_read_back_at_max_and_restore_gives_the_same_bytes(tmp_path: Path,
                                                                         key: str) -> None:
    root = tmp_path / "root"
    populate(root, key)
    before = snapshot(root)
    store = "/root/dfs.conf"
    assert tool(root, "jetson_clocks", "--store", store).returncode == 0
    assert tool(root, "jetson_clocks").returncode == 0
    # No kernel here: a current frequency is its floor, so pinned clocks read back at the top.
    fq = root / "sys/devices/system/cpu/cpu0/cpufreq"
    assert (fq / "scaling_cur_freq").read_text() == (fq / "scaling_max_freq").read_text()
    for node in (root / "sys/class/devfreq").iterdir():
        if node.name != "15340000.vic":
            assert (node / "cur_freq").read_text() == (node / "max_freq").read_text()
    r = tool(root, "jetson_clocks", "--restore", store)
    assert r.returncode == 0 and "Error" not in r.stdout, r.stdout
    after = snapshot(root)
    after.pop("root/dfs.conf")
    after.pop("root/.jetsonclocks_fan.txt")     # the script's own fan status file in $HOME
    # The EMC rate is the kernel's to set back once unlocked (the script restores only
    # mrq_rate_locked); there is no kernel here.
    emc = "sys/kernel/debug/bpmp/debug/clk/emc/rate"
    assert after.pop(emc) != before.pop(emc)
    assert after == before


def test_reboot_outside_a_device_boots_into_the_recorded_mode(tmp_path: Path) -> None:
    root = tmp_path / "root"
    populate(root, "orin-nx")
    r = subprocess.run([str(root / "usr/sbin/nvpmodel"), "-m", "0"], input="YES\n",
                       capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{root}/usr/sbin:{os.environ['PATH']}",
                            "COLIBRI_SIM_ROOT": str(root)})
    assert r.returncode == 0, r.stderr
    # The device's reboot stand-in ran the boot: mode and mask applied.
    assert (root / "sys/devices/platform/gpu.0/tpc_pg_mask").read_text().strip() == "240"
    assert (root / "sys/devices/system/cpu/online").read_text().strip() == "0-7"
    env = {"PATH": os.environ["PATH"]}
    no_button = subprocess.run([str(root / "usr/sbin/reboot")], capture_output=True, text=True,
                               env=env, timeout=30)
    assert no_button.returncode == 1 and "no power button" in no_button.stderr


def test_tools_refuse_non_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test drops from root to nobody; run the suite as root (CI does)")
    base = Path(tempfile.mkdtemp(prefix="colibri-simtools-"))  # pytest's tmp is root-only
    try:
        os.chmod(base, 0o755)
        root = base / "root"
        populate(root, "orin-nx")
        before = snapshot(root)
        r = tool(root, "nvpmodel", "-m", "1", prefix=NOBODY)
        assert r.returncode == 1 and "root" in r.stderr
        j = tool(root, "jetson_clocks", prefix=NOBODY)
        assert j.returncode == 1 and "as a root user" in j.stdout
        q = tool(root, "nvpmodel", "-q", prefix=NOBODY)  # querying needs no privilege
        assert jetson.parse_nvpmodel_query(q.stdout) == ("15W", 2)
        assert snapshot(root) == before
    finally:
        shutil.rmtree(base)


def test_enter_mounts_the_tree_at_real_paths_only_in_its_namespace(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("this test mounts in a private mount namespace: needs root and util-linux")
    root = tmp_path / "root"
    populate(root, "xavier-nx")
    entry = [sys.executable, "-m", "colibri_kit.sim.enter", str(root), "--"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("COLIBRI_SIM_ROOT", None)
    host_had = [p for p in ("/etc/nv_tegra_release", "/etc/nvpmodel.conf") if Path(p).exists()]
    outside = subprocess.run([*entry, "true"], capture_output=True, text=True, env=env, timeout=30)
    assert outside.returncode == 2 and "refusing" in outside.stderr
    inside = subprocess.run(
        ["unshare", "-m", "--propagation", "private", *entry, "sh", "-c",
         "nvpmodel -q && jetson_clocks --show && cat /etc/nv_tegra_release "
         "&& cat /sys/class/devfreq/17000000.gv11b/governor && nvpmodel -m 8 </dev/null"],
        capture_output=True, text=True, env=env, timeout=60)
    assert inside.returncode == 0, inside.stderr
    assert jetson.parse_nvpmodel_query(inside.stdout) == ("MODE_15W_6CORE", 2)
    assert "# R35 (release), REVISION: 5.0" in inside.stdout
    assert "Machine:NVIDIA Jetson Xavier NX Developer Kit" in inside.stdout
    # The switch inside the namespace landed in the tree; the host's own paths never saw it.
    assert (root / "var/lib/nvpmodel/status").read_text().startswith("pmode:0008")
    assert [p for p in ("/etc/nv_tegra_release", "/etc/nvpmodel.conf") if Path(p).exists()] == host_had
