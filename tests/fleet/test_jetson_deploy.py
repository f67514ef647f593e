"""Deploy/status checks against emulated devices that report what real Jetsons report (L4T release
lines, devicetree, MemTotal, CPU count from colibri_kit/sim/data/skus.json): the profile's L4T
range, the CUDA driver rule for JetPack 5 (docs/jetson-facts.md), SKU identity, third-party
carriers and control characters in device strings. In-process (LocalRemote), no root.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from colibri_kit.errors import ProfileError
from colibri_kit.fleet import release as rel
from colibri_kit.fleet import status as statuslib
from colibri_kit.fleet.fleet import Fleet
from colibri_kit.fleet.inventory import Host
from colibri_kit.profiles import load_profile
from colibri_kit.sim.local import local_device

R39 = "# R39 (release), REVISION: 0.0, GCID: 0, BOARD: generic, EABI: aarch64, DATE: x\n"
R35 = "# R35 (release), REVISION: 5.0, GCID: 35550185, BOARD: t186ref, EABI: aarch64, DATE: x\n"


def problems(dev, target: str) -> list[str]:
    return rel.check_device(rel.identify(dev), load_profile(target), dev.name)


def test_thor_on_r39_is_accepted_and_r37_refused(tmp_path):
    thor = local_device(tmp_path / "thor", "agx-thor", name="thor")
    assert problems(thor, "agx-thor") == []                       # R38.2.0 as shipped
    thor.path("/etc/nv_tegra_release").write_text(R39)
    assert problems(thor, "agx-thor") == []                       # JetPack 7.2
    thor.path("/etc/nv_tegra_release").write_text(R39.replace("R39", "R40"))
    [p] = problems(thor, "agx-thor")
    assert "L4T R40.0.0, outside agx-thor's accepted range R38.2–R39.x" in p


def test_orin_on_r35_is_refused_naming_both(tmp_path):
    nx = local_device(tmp_path / "nx", "orin-nx", name="nx")
    assert problems(nx, "orin-nx") == []
    nx.path("/etc/nv_tegra_release").write_text(R35)
    [p] = problems(nx, "orin-nx")
    assert "device runs L4T R35.5.0, outside orin-nx's accepted range R36.3–R36.4.x" in p


def test_jp5_driver_check_both_ways(tmp_path):
    """Stock JetPack 5.1.x has a CUDA 11.4 driver: the xavier-nx build (CUDA 11.8, PTX ISA 7.8)
    cannot run; with NVIDIA's cuda-compat 11.8 installed it can."""
    xa = local_device(tmp_path / "xa", "xavier-nx", name="xa")
    [p] = problems(xa, "xavier-nx")
    assert "CUDA driver 11.4 (stock driver of L4T R35.5.0): the device's CUDA 11.4 driver " \
           "cannot run this build" in p
    assert "PTX ISA 7.8 needs a CUDA 11.8 driver" in p
    assert "install NVIDIA's cuda-compat package for CUDA 11.8" in p
    compat = xa.path("/usr/local/cuda-11.8/compat")
    compat.mkdir(parents=True)
    (compat / "libcuda.so.1").write_bytes(b"")
    assert problems(xa, "xavier-nx") == []
    v = rel.driver_verdict(rel.identify(xa), load_profile("xavier-nx"))
    assert v.runs and v.how == "cubin" and "cuda-compat 11.8" in v.message


def test_orin_on_r36_3_needs_a_12_6_driver(tmp_path):
    nx = local_device(tmp_path / "nx", "orin-nx", name="nx")
    nx.path("/etc/nv_tegra_release").write_text(
        "# R36 (release), REVISION: 3.0, GCID: 36191598, BOARD: generic, EABI: aarch64, DATE: x\n")
    [p] = problems(nx, "orin-nx")
    assert "CUDA driver 12.2 (stock driver of L4T R36.3.0): the device's CUDA 12.2 driver " \
           "cannot run this build" in p


def test_sku_identity_uses_memtotal_and_cpu_count(tmp_path):
    info16 = rel.identify(local_device(tmp_path / "a", "orin-nx-16gb", name="a"))
    info8 = rel.identify(local_device(tmp_path / "b", "orin-nx-8gb", name="b"))
    assert info16.model == info8.model           # one model string for both
    assert (info16.sku.key, info8.sku.key) == ("orin-nx-16gb", "orin-nx-8gb")
    nano = rel.identify(local_device(tmp_path / "c", "orin-nano-4gb", name="c"))
    assert nano.sku.key == "orin-nano-4gb"


def test_third_party_carrier_is_accepted_by_soc_and_compatible(tmp_path):
    nx = local_device(tmp_path / "nx", "orin-nx", name="nx")
    dt = nx.path("/sys/firmware/devicetree/base")
    (dt / "model").write_bytes(b"Acme Vision Box 3000\x1b[31m\x07\0")
    (dt / "compatible").write_bytes(b"acme,visionbox\0nvidia,p3767-0000\0nvidia,tegra234\0")
    info = rel.identify(nx)
    assert info.sku.key == "orin-nx-16gb" and info.sku.carrier == "third-party"
    assert problems(nx, "orin-nx") == []
    assert "\x1b" not in info.shown and "\x07" not in info.shown
    assert info.shown.startswith("orin-nx-16gb (Acme Vision Box 3000")
    rows = statuslib.status(Fleet([Host(name="nx", address="x", target="orin-nx")],
                                  connect=lambda h: nx))
    table = statuslib.status_table(rows)
    assert "Acme Vision Box 3000" in table and "\x1b" not in table
    assert problems(nx, "agx-orin") and "expects a 'AGX Orin' module" in problems(nx, "agx-orin")[0]


def test_profiles_accept_mode_intents_and_l4t_ranges(tmp_path):
    tdir = tmp_path / "targets"
    tdir.mkdir()
    base = Path(load_profile("orin-nx").source_path).parent
    for name in ("_jetson.yaml", "_orin.yaml", "orin-nx.yaml"):
        (tdir / name).write_text((base / name).read_text())

    def write(mode: str, rng: str = '"R36.3–R36.4.x"') -> None:
        (tdir / "t.yaml").write_text(f"name: t\ndescription: x\nextends: orin-nx\n"
                                     f"l4t_range: {rng}\ntune: {{nvpmodel_mode: {mode}}}\n")

    write("[MAXN_SUPER, MAXN]")
    assert load_profile("t", tdir).tune.nvpmodel_mode == ("MAXN_SUPER", "MAXN")
    write("min")
    assert load_profile("t", tdir).tune.nvpmodel_mode == "min"
    for bad, match in (("[]", "empty list"), ("[MAXN, 'a;b']", r"nvpmodel_mode\.1"),
                       ("'rm -rf'", "not valid")):
        write(bad)
        with pytest.raises(ProfileError, match=match):
            load_profile("t", tdir)
    write("max", '"36.3-36.4"')
    with pytest.raises(ProfileError, match="l4t_range: bad L4T"):
        load_profile("t", tdir)


def make_dist(where: Path) -> Path:
    """A minimal dist tree (deploy verifies it against its manifest)."""
    import hashlib
    import json
    (where / "bin").mkdir(parents=True)
    (where / "lib").mkdir()
    (where / "bin/colibri").write_text("#!/bin/sh\necho 'colibri 0.0.0 target=orin-nano'\n")
    (where / "bin/colibri").chmod(0o755)
    (where / "lib/libcolibri.a").write_bytes(b"!<arch>\n")
    files = {r: {"sha256": hashlib.sha256((where / r).read_bytes()).hexdigest()}
             for r in ("bin/colibri", "lib/libcolibri.a")}
    (where / "manifest.json").write_text(json.dumps(
        {"target": "orin-nano", "profile_hash": load_profile("orin-nano").hash, "files": files}))
    return where


def test_deploy_refuses_a_model_the_memory_cannot_hold(tmp_path):
    from colibri_kit.fleet import deploy as D
    from colibri_kit.model.format import HEADER_SIZE, ModelHeader
    from colibri_kit.model.tiny import write_tiny_model
    model = tmp_path / "m.colibri"
    write_tiny_model(model, pad=64)
    h = ModelHeader.unpack(model.read_bytes()[:HEADER_SIZE])
    kv = 2 * h.n_layers * h.max_seq_len * h.n_kv_heads * h.head_dim * 4
    nano = local_device(tmp_path / "nano", "orin-nano-4gb", name="nano")
    host = Host(name="nano", address="x", target="orin-nano")
    art = D.prepare(load_profile("orin-nano"), make_dist(tmp_path / "dist"), model)
    steps = D.plan_host(nano, host, art)
    assert any(s.startswith("memory: model needs at least") for s in steps), steps
    # Something else holds the memory: MemAvailable below weights + KV cache.
    avail_kb = (model.stat().st_size + kv) // 1024 - 1
    nano.path("/proc/meminfo").write_text(f"MemTotal: 3800000 kB\nMemAvailable: {avail_kb} kB\n")
    [res] = D.deploy(Fleet([host], connect=lambda h: nano), art, load_profile("orin-nano"),
                     hooks=D.Hooks())
    assert res.result == "failed"
    assert f"KV cache at {h.max_seq_len} tokens" in res.detail and "MemAvailable is" in res.detail
    assert not nano.path("/opt/colibri/models").exists() or \
        not list(nano.path("/opt/colibri/models").iterdir())


def test_status_warns_when_the_deployed_target_cannot_run_on_the_driver(tmp_path):
    xa = local_device(tmp_path / "xa", "xavier-nx", name="xa")
    note = statuslib._driver_note(rel.identify(xa), load_profile("xavier-nx"))
    assert note.startswith("WARNING: CUDA driver 11.4 (stock driver of L4T R35.5.0)")
    nx = local_device(tmp_path / "nx", "orin-nx", name="nx")
    assert statuslib._driver_note(rel.identify(nx), load_profile("orin-nx")) == ""  # 12.6 on 12.6
    assert statuslib._driver_note(rel.identify(nx), None) == ""     # a target not in targets/
