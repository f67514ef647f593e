"""The emulated Jetson files and the nvpmodel / jetson_clocks stand-ins, run as real programs.

The stand-ins are executed from the populated tree (the installed scripts, not the package
modules) with COLIBRI_SIM_ROOT pointing at it, and once inside a private mount namespace at the
real paths, the way an emulated device runs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from colibri_kit.sim import _devlib
from colibri_kit.sim.device_files import populate
from colibri_kit.sim.modules import MODULES

ALL = sorted(MODULES)
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


def tool(root: Path, name: str, *args: str, stdin: bytes | None = None, prefix: list[str] = (),
         env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    rel = "usr/sbin/nvpmodel" if name == "nvpmodel" else "usr/bin/jetson_clocks"
    full_env = {"PATH": os.environ["PATH"], "COLIBRI_SIM_ROOT": str(root), "HOME": str(root.parent),
                **(env or {})}
    kwargs = {"input": stdin.decode()} if stdin is not None else {"stdin": subprocess.DEVNULL}
    # timeout: a stand-in waiting on a prompt must not hang the suite (it would fail here).
    return subprocess.run([*prefix, str(root / rel), *args], capture_output=True, text=True,
                          env=full_env, timeout=30, **kwargs)


@pytest.fixture(params=ALL)
def device(request, tmp_path: Path) -> tuple[str, Path]:
    root = tmp_path / "root"
    populate(root, request.param)
    return request.param, root


def test_populate_writes_identity_cpus_gpu_and_modes(device: tuple[str, Path]) -> None:
    key, root = device
    mod = MODULES[key]
    release = (root / "etc/nv_tegra_release").read_text().splitlines()[0]
    assert release.startswith(f"# {mod.release} (release), REVISION: {mod.revision}, GCID: ")
    model = (root / "sys/firmware/devicetree/base/model").read_bytes()
    assert model == mod.model.encode() + b"\0"
    compat = (root / "sys/firmware/devicetree/base/compatible").read_bytes()
    assert compat.endswith(b"\0") and f"nvidia,{mod.soc}".encode() in compat.split(b"\0")
    cpus = sorted(p.name for p in (root / "sys/devices/system/cpu").glob("cpu[0-9]*"))
    assert len(cpus) == mod.cpus
    assert (root / "sys/devices/system/cpu/present").read_text() == f"0-{mod.cpus - 1}\n"
    default = mod.mode(mod.default_mode)
    online = _devlib.parse_ranges((root / "sys/devices/system/cpu/online").read_text())
    assert online == list(range(default.cores))
    # The GPU node is found through the class link, at the release's own device path.
    link = root / "sys/class/devfreq" / mod.gpu_node
    assert link.is_symlink() and link.resolve() == (root / "sys" / mod.gpu_dir).resolve()
    assert (link / "governor").read_text() == "nvhost_podgov\n"
    if key == "xavier-nx":
        assert (root / "sys/devices/17000000.gv11b/devfreq/17000000.gv11b/governor").is_file()
    modes, dflt = _devlib.parse_conf((root / "etc/nvpmodel.conf").read_text())
    assert dflt == mod.default_mode
    assert {i: m["name"] for i, m in modes.items()} == {m.id: m.name for m in mod.modes}
    for rel in ("usr/sbin/nvpmodel", "usr/bin/jetson_clocks"):
        script = (root / rel).read_text()
        assert script.startswith("#!/usr/bin/env python3\n") and "colibri_kit" not in script
        assert os.access(root / rel, os.X_OK)


def test_mode_tables_match_the_documented_ids() -> None:
    names = {k: {m.name: m.id for m in MODULES[k].modes} for k in MODULES}
    assert names["orin-nx"] == {"MAXN": 0, "10W": 1, "15W": 2, "25W": 3}
    assert MODULES["orin-nx"].default_mode == 2
    assert names["orin-nano"] == {"15W": 0, "7W": 1}
    assert names["agx-orin"] == {"MAXN": 0, "15W": 1, "30W": 2, "50W": 3}
    assert names["xavier-nx"]["MODE_20W_6CORE"] == 8 and names["xavier-nx"]["MODE_15W_2CORE"] == 0


def test_nvpmodel_query_and_list(device: tuple[str, Path]) -> None:
    key, root = device
    mod = MODULES[key]
    q = tool(root, "nvpmodel", "-q")
    assert q.returncode == 0
    assert q.stdout.splitlines()[:2] == [f"NV Power Mode: {mod.mode(mod.default_mode).name}",
                                         str(mod.default_mode)]
    p = tool(root, "nvpmodel", "-p", "--verbose")
    assert p.returncode == 0
    for m in mod.modes:
        assert f"POWER_MODEL: ID={m.id} NAME={m.name}" in p.stdout


def test_populate_is_the_boot_state_of_the_default_mode(device: tuple[str, Path]) -> None:
    """Re-applying the default mode changes no byte: populate wrote what nvpmodel would."""
    key, root = device
    before = snapshot(root)
    r = tool(root, "nvpmodel", "-m", str(MODULES[key].default_mode))
    assert r.returncode == 0, r.stderr
    assert snapshot(root) == before


def test_nvpmodel_switch_changes_cpus_and_caps(tmp_path: Path) -> None:
    root = tmp_path / "root"
    populate(root, "orin-nx")
    r = tool(root, "nvpmodel", "-m", "0")
    assert r.returncode == 0, r.stderr
    assert (root / "sys/devices/system/cpu/online").read_text() == "0-7\n"
    assert (root / "sys/devices/system/cpu/cpu7/cpufreq/scaling_max_freq").read_text() == "1984000\n"
    assert (root / "sys/class/devfreq/17000000.gpu/max_freq").read_text() == "918000000\n"
    assert tool(root, "nvpmodel", "-q").stdout.startswith("NV Power Mode: MAXN\n0\n")
    bad = tool(root, "nvpmodel", "-m", "9")
    assert bad.returncode != 0 and "Invalid power mode" in bad.stderr


def test_reboot_prompt_without_an_answer_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    populate(root, "orin-nx")
    before = snapshot(root)
    r = tool(root, "nvpmodel", "-m", "1")  # 15W -> 10W changes the TPC mask: reboot prompt
    assert r.returncode == 1
    assert "Reboot required" in r.stdout and "not changed" in r.stdout
    assert snapshot(root) == before
    no = tool(root, "nvpmodel", "-m", "1", stdin=b"no\n")
    assert no.returncode == 1 and snapshot(root) == before
    yes = tool(root, "nvpmodel", "-m", "1", stdin=b"YES\n")
    assert yes.returncode == 0
    assert tool(root, "nvpmodel", "-q").stdout.startswith("NV Power Mode: 10W\n1\n")


def test_orin_nano_7w_needs_a_reboot(tmp_path: Path) -> None:
    root = tmp_path / "root"
    populate(root, "orin-nano")
    r = tool(root, "nvpmodel", "-m", "1")
    assert r.returncode == 1 and "Reboot required" in r.stdout


def test_tools_refuse_non_root() -> None:
    if os.geteuid() != 0:
        pytest.fail("this test drops from root to nobody; run the suite as root (CI does)")
    base = Path(tempfile.mkdtemp(prefix="colibri-simtools-"))  # pytest's tmp is root-only
    try:
        os.chmod(base, 0o755)
        root = base / "root"
        populate(root, "orin-nx")
        before = snapshot(root)
        r = tool(root, "nvpmodel", "-m", "0", prefix=NOBODY)
        assert r.returncode != 0 and "NVPM ERROR" in r.stderr and "as root" in r.stderr
        j = tool(root, "jetson_clocks", prefix=NOBODY)
        assert j.returncode != 0 and "as a root user" in j.stderr
        q = tool(root, "nvpmodel", "-q", prefix=NOBODY)  # querying needs no privilege
        assert q.returncode == 0 and q.stdout.startswith("NV Power Mode: 15W")
        assert snapshot(root) == before
    finally:
        shutil.rmtree(base)


def test_jetson_clocks_max_show_and_restore_round_trip(device: tuple[str, Path]) -> None:
    key, root = device
    before = snapshot(root)
    store = root.parent / "dfs.conf"
    assert tool(root, "jetson_clocks", "--store", str(store)).returncode == 0
    assert tool(root, "jetson_clocks").returncode == 0
    show = tool(root, "jetson_clocks", "--show").stdout
    cpu0 = next(l for l in show.splitlines() if l.startswith("cpu0:"))
    fields = dict(f.split("=") for f in cpu0.split()[1:] if "=" in f)
    assert fields["MinFreq"] == fields["MaxFreq"] == fields["CurrentFreq"]
    assert "FreqOverride=1" in show and "hwmon0_pwm1=255" in show
    assert f"Machine:{MODULES[key].model}" in show
    assert snapshot(root) != before
    r = tool(root, "jetson_clocks", "--restore", str(store))
    assert r.returncode == 0, r.stderr
    assert snapshot(root) == before


def test_jetson_clocks_store_asks_before_overwriting(tmp_path: Path) -> None:
    root = tmp_path / "root"
    populate(root, "orin-nx")
    default = tmp_path / "l4t_dfs.conf"  # HOME is tmp_path in tool()
    assert tool(root, "jetson_clocks", "--store").returncode == 0
    first = default.read_text()
    assert "/sys/devices/system/cpu/cpu0/cpufreq/scaling_min_freq 115200" in first
    tool(root, "jetson_clocks")
    again = tool(root, "jetson_clocks", "--store")  # stdin closed: no answer
    assert again.returncode != 0 and "File exists, overwrite? Y/N" in again.stdout
    assert default.read_text() == first
    yes = tool(root, "jetson_clocks", "--store", stdin=b"Y\n")
    assert yes.returncode == 0 and default.read_text() != first


def test_jetson_clocks_restore_refuses_paths_outside_sys(tmp_path: Path) -> None:
    root = tmp_path / "root"
    populate(root, "orin-nx")
    bad = tmp_path / "bad.conf"
    bad.write_text("/etc/passwd 0\n")
    r = tool(root, "jetson_clocks", "--restore", str(bad))
    assert r.returncode != 0 and "malformed" in r.stderr
    missing = tool(root, "jetson_clocks", "--restore", str(tmp_path / "nope.conf"))
    assert missing.returncode != 0 and "not found" in missing.stderr


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
    assert inside.stdout.startswith("NV Power Mode: MODE_15W_6CORE\n2\n")
    assert "# R35 (release), REVISION: 5.0" in inside.stdout
    assert "Machine:NVIDIA Jetson Xavier NX Developer Kit" in inside.stdout
    # The switch inside the namespace landed in the tree; the host's own paths never saw it.
    assert (root / "var/lib/nvpmodel/status").read_text() == "pmode:0008\n"
    assert [p for p in ("/etc/nv_tegra_release", "/etc/nvpmodel.conf") if Path(p).exists()] == host_had
