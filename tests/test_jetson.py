"""colibri_kit.jetson: the rules of real Jetsons, on strings real devices and NVIDIA files give.

Fixtures are real outputs (sources named at each) and the reconstructed confs under
colibri_kit/sim/data/nvpmodel/ (each names its sources and what it could not check).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from colibri_kit import jetson
from colibri_kit.jetson import (CudaVersion, JetsonError, L4TVersion, check_cuda_driver,
                                check_l4t, clean, identify_sku, parse_l4t_range,
                                parse_l4t_release, parse_nvpmodel_conf, parse_nvpmodel_query,
                                parse_nvpmodel_verbose, reboot_required, resolve_mode)

DATA = Path(jetson.__file__).resolve().parent / "sim" / "data"
CONFS = sorted(p.stem for p in (DATA / "nvpmodel").glob("*.conf"))


def conf(name: str) -> jetson.NvpConf:
    return parse_nvpmodel_conf((DATA / "nvpmodel" / f"{name}.conf").read_text())


# An AGX Orin's `nvpmodel -p --verbose`, as captured in rbonghi/jetson_stats tests/nvpmodel
# (JetPack 5), cut to the lines of two modes plus the definitions a parser must skip.
AGX_ORIN_VERBOSE = """\
NVPM VERB: Config file: /etc/nvpmodel.conf
NVPM VERB: parsing done for /etc/nvpmodel.conf
succeed to parse file /etc/nvpmodel.conf.
NVPM VERB: PM_CONFIG: DEFAULT=MODE_30W(2)
NVPM VERB: PARAM TYPE=FILE NAME=TPC_POWER_GATING
NVPM VERB: TPC_PG_MASK /sys/devices/gpu.0/tpc_pg_mask
NVPM VERB: PARAM TYPE=CLOCK NAME=GPU
NVPM VERB: MAX_FREQ /sys/devices/17000000.ga10b/devfreq_dev/max_freq
NVPM VERB: 
NVPM VERB: POWER_MODEL: ID=0 NAME=MAXN
NVPM VERB: CPU_ONLINE CORE_0 1
NVPM VERB: TPC_POWER_GATING TPC_PG_MASK 0
NVPM VERB: GPU MAX_FREQ 2147483647
NVPM VERB: 
NVPM VERB: POWER_MODEL: ID=1 NAME=MODE_15W
NVPM VERB: CPU_ONLINE CORE_0 1
NVPM VERB: TPC_POWER_GATING TPC_PG_MASK 248
NVPM VERB: GPU MAX_FREQ 420750000
NVPM VERB: 
NVPM VERB: POWER_MODEL: ID=2 NAME=MODE_30W
NVPM VERB: CPU_ONLINE CORE_0 1
NVPM VERB: TPC_POWER_GATING TPC_PG_MASK 240
NVPM VERB: GPU MAX_FREQ 624750000
NVPM VERB: 
"""


# ----------------------------------------------------------------------------- confs

@pytest.mark.parametrize("name", CONFS)
def test_every_conf_parses_with_a_default_and_a_source_header(name):
    text = (DATA / "nvpmodel" / f"{name}.conf").read_text()
    c = parse_nvpmodel_conf(text)
    assert c.default_id is not None
    assert all(m.tpc_pg_mask is not None for m in c.modes)
    header = text.split("<", 1)[0]
    assert "Checked" in header          # each file names what was checked...
    assert "nvpmodel" in header         # ...and which NVIDIA file it reconstructs


def test_conf_ids_names_masks_match_the_checked_facts():
    nx = conf("orin-nx-16gb")
    assert [(m.id, m.name, m.tpc_pg_mask) for m in nx.modes] == [
        (0, "MAXN", "240"), (1, "10W", "252"), (2, "15W", "252"), (3, "25W", "240")]
    assert nx.default_id == 2
    agx = conf("agx-orin-64gb")
    assert [(m.name, m.tpc_pg_mask) for m in agx.modes] == [
        ("MAXN", "0"), ("MODE_15W", "248"), ("MODE_30W", "240"), ("MODE_50W", "0")]
    assert agx.default_id == 2
    assert conf("orin-nx-8gb").by_name("20W") and not conf("orin-nx-8gb").by_name("25W")
    assert conf("agx-orin-32gb").by_name("MODE_40W")
    assert conf("orin-nano-4gb").names() == ["10W", "7W_AI", "7W_CPU"]
    sup = conf("orin-nx-16gb-super")
    assert sup.names() == ["MAXN_SUPER", "10W", "15W", "25W", "40W"] and sup.default_id == 4
    nano = conf("orin-nano-8gb-super")
    assert [(m.id, m.name) for m in nano.modes] == [(0, "15W"), (1, "25W"), (2, "MAXN_SUPER")]
    assert nano.default_id == 1
    assert {m.tpc_pg_mask for m in conf("xavier-nx").modes} == {"1"}


def test_conf_parser_skips_param_definitions_and_rejects_bad_blocks():
    c = parse_nvpmodel_conf("< PARAM TYPE=CLOCK NAME=GPU >\nMAX_FREQ /sys/x/max_freq\n"
                            "MIN_FREQ /sys/x/min_freq\n< POWER_MODEL ID=3 NAME=A >\n"
                            "GPU MAX_FREQ 5 # cap\n< PM_CONFIG DEFAULT=3 >\n")
    assert c.modes == (jetson.PowerMode(3, "A", (("GPU", "MAX_FREQ", "5"),)),)
    with pytest.raises(JetsonError, match="PM_CONFIG DEFAULT=9 is not a mode id"):
        parse_nvpmodel_conf("< POWER_MODEL ID=0 NAME=A >\n< PM_CONFIG DEFAULT=9 >\n")
    with pytest.raises(JetsonError, match="duplicate POWER_MODEL ids"):
        parse_nvpmodel_conf("< POWER_MODEL ID=0 NAME=A >\n< POWER_MODEL ID=0 NAME=B >\n")
    with pytest.raises(JetsonError, match="line 1: POWER_MODEL needs"):
        parse_nvpmodel_conf("< POWER_MODEL NAME=A >\n")
    with pytest.raises(JetsonError, match="no POWER_MODEL"):
        parse_nvpmodel_conf("# empty\n")


def test_verbose_output_of_a_real_agx_orin():
    c = parse_nvpmodel_verbose(AGX_ORIN_VERBOSE)
    assert c.default_id == 2
    assert [(m.id, m.name, m.tpc_pg_mask) for m in c.modes] == [
        (0, "MAXN", "0"), (1, "MODE_15W", "248"), (2, "MODE_30W", "240")]
    assert c.by_id(1).param("GPU", "MAX_FREQ") == "420750000"
    assert reboot_required(c, 2, 0)          # MODE_30W -> MAXN: 240 vs 0


@pytest.mark.parametrize("text, expected", [
    ("NV Power Mode: 15W\n2\n", ("15W", 2)),
    # jetson_stats' capture: a fan warning may come first.
    ("NVPM WARN: fan mode is not set!\nNV Power Mode: MAXN\n0\n", ("MAXN", 0)),
    ("NVPM WARN: fan mode is not set to cool\nNV Power Mode: MAXN_SUPER\n0\n", ("MAXN_SUPER", 0)),
    # `nvpmodel -q --verbose` (a TX2 capture quoted in a public write-up).
    ("NVPM VERB: parsing done for /etc/nvpmodel.conf\n"
     "NVPM VERB: Current mode: NV Power Mode: MAXN\n0\nNVPM VERB: PM_CONFIG: DEFAULT=X(3)\n",
     ("MAXN", 0)),
])
def test_query_output(text, expected):
    assert parse_nvpmodel_query(text) == expected


def test_query_output_without_a_mode_is_an_error_that_shows_it_cleanly():
    with pytest.raises(JetsonError, match="no 'NV Power Mode:'") as e:
        parse_nvpmodel_query("NVPM ERROR: \x1b[31mfailed\x1b[0m\n")
    assert "\x1b" not in str(e.value)
    with pytest.raises(JetsonError, match="no mode id"):
        parse_nvpmodel_query("NV Power Mode: MAXN\nNVPM WARN: x\n")


# ----------------------------------------------------------------------------- reboot rule

@pytest.mark.parametrize("name, frm, to, needs", [
    ("orin-nx-16gb", "15W", "MAXN", True),        # factory default -> MAXN: 252 vs 240
    ("orin-nx-16gb", "15W", "10W", False),        # 252 both
    ("orin-nx-16gb", "10W", "15W", False),
    ("orin-nx-16gb", "25W", "MAXN", False),       # 240 both
    ("agx-orin-64gb", "MODE_30W", "MAXN", True),  # 240 vs 0
    ("agx-orin-64gb", "MODE_50W", "MAXN", False),
    ("agx-thor", "120W", "MAXN", False),          # 64 both
    ("agx-thor", "120W", "90W", True),
    ("xavier-nx", "MODE_15W_6CORE", "MODE_20W_6CORE", False),
    ("orin-nano-8gb-super", "25W", "MAXN_SUPER", False),
    ("orin-nx-16gb-super", "40W", "MAXN_SUPER", False),
])
def test_reboot_required_is_a_mask_comparison(name, frm, to, needs):
    c = conf(name)
    assert reboot_required(c, c.by_name(frm).id, c.by_name(to).id) is needs


def test_live_mask_wins_and_a_pending_switch_is_seen():
    nx = conf("orin-nx-16gb")
    # Accepted 15W -> MAXN (status says MAXN) but not rebooted: the GPU still runs 252.
    assert jetson.reboot_pending(nx, 0, "252\n")
    assert not jetson.reboot_pending(nx, 0, "240")
    assert not jetson.reboot_pending(nx, 0, None)
    assert reboot_required(nx, 0, 3, live_mask="252")       # MAXN -> 25W while still at 252
    assert not reboot_required(nx, 0, 2, live_mask="252")   # back to 15W: no reboot
    assert not reboot_required(nx, 0, 3, live_mask="")      # unreadable: the mode's mask


def test_modes_without_a_mask_never_need_a_reboot_and_unknown_ids_are_named():
    c = parse_nvpmodel_conf("< POWER_MODEL ID=0 NAME=MAXN >\n< POWER_MODEL ID=1 NAME=5W >\n"
                            "TPC_POWER_GATING TPC_PG_MASK 1\n< PM_CONFIG DEFAULT=0 >\n")
    assert reboot_required(c, 0, 1) is False
    with pytest.raises(JetsonError, match="no mode id 7 .ids: 0 MAXN, 1 5W"):
        reboot_required(c, 0, 7)


# ----------------------------------------------------------------------------- modes by intent

@pytest.mark.parametrize("name, intent, expected", [
    ("orin-nx-16gb", "max", "MAXN"),
    ("orin-nx-16gb", "min", "10W"),
    ("orin-nx-16gb-super", "max", "MAXN_SUPER"),
    ("orin-nx-16gb-super", ["MAXN_SUPER", "MAXN"], "MAXN_SUPER"),
    ("orin-nx-16gb", ["MAXN_SUPER", "MAXN"], "MAXN"),
    ("orin-nano-8gb-super", "max", "MAXN_SUPER"),
    ("orin-nano-8gb", "max", "15W"),
    ("orin-nano-8gb", "min", "7W"),
    ("orin-nano-4gb", "min", "7W_AI"),            # 7 W tie: fewer CPUs online wins
    ("agx-orin-64gb", "min", "MODE_15W"),
    ("agx-orin-32gb", "max", "MAXN"),
    ("xavier-nx", "max", "MODE_20W_6CORE"),       # 20 W tie: more CPUs online wins
    ("xavier-nx", "min", "MODE_10W_2CORE"),
    ("agx-thor", "min", "70W"),
    ("agx-thor", "90W", "90W"),
])
def test_resolve_mode(name, intent, expected):
    r = resolve_mode(conf(name), intent)
    assert r.mode.name == expected
    assert str(r.mode.id) in r.reason


def test_plan_mode_for_the_issue_cases():
    nx = conf("orin-nx-16gb")
    p = jetson.plan_mode(nx, 2, "max")                      # factory Orin NX tuned to max
    assert (p.target.name, p.change, p.reboot, p.pending) == ("MAXN", True, True, False)
    p = jetson.plan_mode(nx, 2, "10W")
    assert (p.change, p.reboot) == (True, False)
    p = jetson.plan_mode(nx, 0, "max", live_mask="240")     # already there
    assert (p.change, p.reboot) == (False, False)
    p = jetson.plan_mode(nx, 0, "max", live_mask="252")     # accepted, not rebooted yet
    assert (p.change, p.reboot, p.pending) == (True, True, True)
    sup = jetson.plan_mode(conf("orin-nx-16gb-super"), 4, ["MAXN_SUPER", "MAXN"])
    assert (sup.target.name, sup.reboot) == ("MAXN_SUPER", False)
    agx = jetson.plan_mode(conf("agx-orin-64gb"), 2, "MAXN")
    assert agx.reboot and agx.reason == "MAXN is mode 0"


def test_resolve_mode_explains_fallbacks_and_refusals():
    r = resolve_mode(conf("orin-nx-16gb"), ["MAXN_SUPER", "MAXN"])
    assert r.reason == "MAXN is mode 0 (MAXN_SUPER not on this device)"
    with pytest.raises(JetsonError, match=r"no mode named MAXN on this device \(it has: "
                                          r"0 MAXN_SUPER, 1 10W"):
        resolve_mode(conf("orin-nx-16gb-super"), "MAXN")
    custom = parse_nvpmodel_conf("< POWER_MODEL ID=0 NAME=FAST >\n< POWER_MODEL ID=1 NAME=SLOW >\n")
    with pytest.raises(JetsonError, match="cannot tell the max mode"):
        resolve_mode(custom, "max")
    with pytest.raises(JetsonError, match="must hold mode names"):
        resolve_mode(custom, [])


# ----------------------------------------------------------------------------- L4T

@pytest.mark.parametrize("line, expected", [
    ("# R36 (release), REVISION: 4.3, GCID: 38968081, BOARD: generic, EABI: aarch64, "
     "DATE: Wed Jan  8 01:49:37 UTC 2025\n# KERNEL_VARIANT: oot\n", L4TVersion(36, 4, 3)),
    ("# R35 (release), REVISION: 5.0, GCID: 35550185, BOARD: t186ref, EABI: aarch64, DATE: x",
     L4TVersion(35, 5, 0)),
    ("# R39 (release), REVISION: 0, GCID: 1, BOARD: generic", L4TVersion(39, 0, 0)),
])
def test_l4t_release(line, expected):
    assert parse_l4t_release(line) == expected


def test_l4t_release_garbage_is_refused():
    with pytest.raises(JetsonError, match="no '# R<n> .release.,"):
        parse_l4t_release("Ubuntu 22.04\n")


def test_l4t_ranges():
    orin = parse_l4t_range("R36.3–R36.4.x")
    assert L4TVersion(36, 3, 0) in orin and L4TVersion(36, 4, 4) in orin
    assert L4TVersion(36, 2, 0) not in orin and L4TVersion(36, 5, 0) not in orin
    assert L4TVersion(35, 5, 0) not in orin
    thor = parse_l4t_range("R38.2-R39.x")
    assert L4TVersion(39, 2, 0) in thor and L4TVersion(38, 2, 0) in thor
    assert L4TVersion(38, 0, 0) not in thor and L4TVersion(40, 0, 0) not in thor
    exact = parse_l4t_range("R36.4.3")
    assert L4TVersion(36, 4, 3) in exact and L4TVersion(36, 4, 4) not in exact
    assert L4TVersion(35, 6, 0) in parse_l4t_range("R35.x")
    for bad in ("36.3-36.4", "R36.x.1", "R37-R36", "R36-R37-R38"):
        with pytest.raises(JetsonError, match="bad L4T"):
            parse_l4t_range(bad)


def test_check_l4t_names_both_sides():
    with pytest.raises(JetsonError, match=r"L4T R35.5.0, outside orin-nx's accepted range "
                                          r"R36.3–R36.4.x"):
        check_l4t(L4TVersion(35, 5, 0), parse_l4t_range("R36.3–R36.4.x"), "orin-nx")
    check_l4t(L4TVersion(39, 0, 0), parse_l4t_range("R38.2–R39.x"), "agx-thor")


def test_jetpack_and_stock_driver_for_l4t():
    assert jetson.jetpack_for(L4TVersion(36, 4, 3)) == "6.2"
    assert jetson.jetpack_for(L4TVersion(36, 4, 0)) == "6.1"
    assert jetson.jetpack_for(L4TVersion(39, 0, 0)) == "7.2"
    assert jetson.stock_driver_for(L4TVersion(35, 5, 0)) == CudaVersion(11, 4)
    assert jetson.stock_driver_for(L4TVersion(36, 3, 0)) == CudaVersion(12, 2)
    assert jetson.stock_driver_for(L4TVersion(36, 4, 3)) == CudaVersion(12, 6)
    assert jetson.stock_driver_for(L4TVersion(38, 2, 0)) == CudaVersion(13, 0)
    assert jetson.stock_driver_for(L4TVersion(32, 7, 0)) is None


# ----------------------------------------------------------------------------- CUDA driver

def test_cuda_version_parsing():
    assert CudaVersion.parse(11040) == CudaVersion(11, 4)
    assert CudaVersion.parse("12060") == CudaVersion(12, 6)
    assert CudaVersion.parse("12.6.68") == CudaVersion(12, 6)
    with pytest.raises(JetsonError, match="bad CUDA version"):
        CudaVersion.parse("twelve")
    assert jetson.ptx_isa_of("//\n// Generated by NVIDIA NVVM Compiler\n.version 7.8\n"
                             ".target sm_72\n") == "7.8"


def test_stock_jp5_driver_cannot_run_a_cuda_11_8_xavier_build():
    v = check_cuda_driver(CudaVersion(11, 4), CudaVersion(11, 8), "sm_72", ["sm_72"], "7.8")
    assert not v.runs
    assert "PTX ISA 7.8 needs a CUDA 11.8 driver" in v.message
    assert "cuda-compat" in v.message


def test_jp5_with_the_compat_driver_or_a_cuda_11_4_build_runs():
    assert check_cuda_driver(CudaVersion(11, 8), CudaVersion(11, 8), "sm_72", ["sm_72"],
                             "7.8").how == "cubin"
    v = check_cuda_driver(CudaVersion(11, 4), CudaVersion(11, 4), "sm_72", ["sm_72"], "7.4")
    assert v.runs and v.how == "cubin"
    # No cubin for the device, PTX the driver knows: JIT.
    v = check_cuda_driver(CudaVersion(11, 4), CudaVersion(11, 4), "sm_72", ["sm_87"], "7.4")
    assert v.runs and v.how == "ptx-jit"


def test_cuda_12_build_on_a_cuda_11_driver_and_13_on_12():
    assert not check_cuda_driver(CudaVersion(11, 4), CudaVersion(12, 6), "sm_87", ["sm_87"],
                                 "8.5").runs
    assert not check_cuda_driver(CudaVersion(12, 6), CudaVersion(13, 0), "sm_87", ["sm_87"],
                                 "9.0").runs
    assert check_cuda_driver(CudaVersion(12, 6), CudaVersion(12, 6), "sm_87", ["sm_87"],
                             "8.5").runs
    assert check_cuda_driver(CudaVersion(13, 0), CudaVersion(13, 0), "sm_110", ["sm_110"],
                             None).runs
    v = check_cuda_driver(CudaVersion(12, 2), CudaVersion(12, 6), "sm_87", ["sm_87"], None)
    assert not v.runs and "embeds no PTX" in v.message


# ----------------------------------------------------------------------------- SKU identity

def dt(*compatible: str) -> bytes:
    return b"".join(c.encode() + b"\0" for c in compatible)


ORIN_NX_MODEL = b"NVIDIA Jetson Orin NX Engineering Reference Developer Kit\0"


def test_orin_nx_16_and_8_share_a_model_string():
    sixteen = identify_sku(ORIN_NX_MODEL, dt("nvidia,p3768-0000+p3767-0000", "nvidia,p3767-0000",
                                             "nvidia,tegra234"), 15655436, 8)
    assert (sixteen.key, sixteen.carrier, sixteen.super_mode) == ("orin-nx-16gb", "nvidia", False)
    eight = identify_sku(ORIN_NX_MODEL, dt("nvidia,p3768-0000+p3767-0001", "nvidia,p3767-0001",
                                           "nvidia,tegra234"), 7620000, 6)
    assert eight.key == "orin-nx-8gb"
    with pytest.raises(JetsonError, match="16GB has 8 CPUs and 8GB has 6"):
        identify_sku(ORIN_NX_MODEL, dt("nvidia,p3767-0000", "nvidia,tegra234"), 7620000, 8)


def test_orin_nano_by_memory_and_super_by_model():
    nano = identify_sku(b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit Super\0",
                        dt("nvidia,p3768-0000+p3767-0005-super", "nvidia,p3767-0005",
                           "nvidia,tegra234"), 7620000, 6)
    assert (nano.key, nano.super_mode) == ("orin-nano-8gb", True)
    four = identify_sku(b"NVIDIA Jetson Orin Nano Engineering Reference Developer Kit\0",
                        dt("nvidia,p3767-0004", "nvidia,tegra234"), 3665844, 6)
    assert four.key == "orin-nano-4gb"
    # JetPack 5.1.1's model string for the Orin Nano developer kit (its /proc/device-tree/model).
    old = identify_sku(b"NVIDIA Orin Nano Developer Kit\0",
                       dt("nvidia,p3768-0000+p3767-0005", "nvidia,tegra234"), 7620000, 6)
    assert (old.key, old.carrier) == ("orin-nano-8gb", "nvidia")


def test_third_party_carrier_is_accepted_by_soc_and_part_and_shown_cleanly():
    sku = identify_sku(b"Acme \x1b[2JRobot\x07 Carrier v2\0",
                       dt("acme,robot-carrier", "nvidia,p3767-0000", "nvidia,tegra234"),
                       15655436, 8)
    assert sku.key == "orin-nx-16gb" and sku.carrier == "third-party"
    assert sku.model == "Acme Robot Carrier v2"
    # No part number either: the SoC and CPU count still name a unique family.
    thor = identify_sku(b"Vendor T5000 box\0", dt("vendor,box", "nvidia,tegra264"), 128359552, 14)
    assert thor.key == "agx-thor"


def test_sku_refusals_name_what_was_seen():
    with pytest.raises(JetsonError, match="not a Jetson"):
        identify_sku(b"Raspberry Pi 5\0", dt("raspberrypi,5-model-b", "brcm,bcm2712"), 8e6, 4)
    with pytest.raises(JetsonError, match="cannot tell the module .tegra234, 6 CPUs"):
        identify_sku(b"Box\0", dt("vendor,box", "nvidia,tegra234"), 7620000, 6)
    with pytest.raises(JetsonError, match="agx-orin modules have 32/64 GB"):
        identify_sku(b"NVIDIA Jetson AGX Orin Developer Kit\0",
                     dt("nvidia,p3701-0005", "nvidia,tegra234"), 15655436, 12)


def test_emulated_sku_table_identifies_as_itself():
    skus = json.loads((DATA / "skus.json").read_text())
    for key, s in skus.items():
        if key.startswith("_"):
            continue
        sku = identify_sku(s["model"] + "\0", "\0".join(s["compatible"]) + "\0",
                           s["memtotal_kb"], s["cpus"])
        assert sku.key == key.removesuffix("-super"), key
        assert sku.super_mode == key.endswith("-super"), key
        assert (DATA / "nvpmodel" / s["conf"]).is_file()
        assert parse_l4t_release(s["nv_tegra_release"]).major in (35, 36, 38)


def test_gpu_devfreq_nodes_by_of_node_name():
    # Thor: two GPU domains; the VIC is not a GPU; JetPack 5 Orin names the node after ga10b.
    assert jetson.gpu_devfreq_nodes({"gpu-gpc-0": "gpu\0", "gpu-nvd-0": "gpu\0",
                                     "15340000.vic": "vic\0"}) == ["gpu-gpc-0", "gpu-nvd-0"]
    assert jetson.gpu_devfreq_nodes({"17000000.ga10b": "ga10b", "15480000.nvdec": "nvdec"}) \
        == ["17000000.ga10b"]
    # No of_node in the tree: by node name.
    assert jetson.gpu_devfreq_nodes({"17000000.gpu": None, "15340000.vic": None}) == \
        ["17000000.gpu"]


REAL_MEMINFO = """\
MemTotal:        7620000 kB
MemFree:         5312044 kB
MemAvailable:    6489200 kB
Buffers:           35688 kB
HugePages_Total:       0
"""


def test_footprint_check_names_the_numbers():
    info = jetson.parse_meminfo(REAL_MEMINFO)
    assert info["MemAvailable"] == 6489200 and info["HugePages_Total"] == 0
    left = jetson.check_footprint({"weights": 4 << 30, "arena": 512 << 20, "kv": 256 << 20}, info)
    assert left == 6489200 * 1024 - (4 << 30) - (768 << 20)
    with pytest.raises(JetsonError, match=r"cab-01: the model needs 7168 MiB \(weights 6144 MiB, "
                                          r"arena 512 MiB, kv 512 MiB\) but MemAvailable is "
                                          r"6337 MiB"):
        jetson.check_footprint({"weights": 6 << 30, "arena": 512 << 20, "kv": 512 << 20}, info,
                               "cab-01")


def test_meminfo_and_cpu_list():
    assert jetson.parse_meminfo_kb("MemTotal:        7620000 kB\nMemFree: 1 kB\n") == 7620000
    assert jetson.parse_cpu_list("0-5\n") == 6 and jetson.parse_cpu_list("0-3,6,8-9") == 7
    with pytest.raises(JetsonError):
        jetson.parse_meminfo_kb("nothing")
    with pytest.raises(JetsonError):
        jetson.parse_cpu_list("a-b")


# ----------------------------------------------------------------------------- clean

@pytest.mark.parametrize("raw, expected", [
    (b"NVIDIA Jetson AGX Thor Developer Kit\0", "NVIDIA Jetson AGX Thor Developer Kit"),
    ("red \x1b[31mALERT\x1b[0m done", "red ALERT done"),
    ("title \x1b]0;pwned\x07 end", "title end"),
    ("bidi \u202eevil\u202c text", "bidi evil text"),
    ("line\nbreak\r\tand\x00nul\x7fdel\x9bc1", "line break and nul del c1"),
    ("x" * 300, "x" * 199 + "…"),
])
def test_clean(raw, expected):
    assert clean(raw) == expected
