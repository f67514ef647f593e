"""Target profiles: the shipped ones, extends merging, validation messages, hash stability."""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kit_support import zig_command
import yaml

from colibri_kit import paths
from colibri_kit.errors import ProfileError
from colibri_kit.profiles import (CUDA_SMS, Profile, list_profiles, load_all, load_profile,
                                  profile_yaml)

ROOT = paths.project_root()

# A complete, valid flat profile; each validation test breaks one thing in a copy.
VALID = {
    "name": "dev",
    "description": "test device",
    "arch": "aarch64",
    "glibc": "2.35",
    "cpu": {"mcpu": "cortex-a78ae"},
    "jetpack": "6.1",
    "l4t": "36.4",
    "device": {"soc": "tegra234", "model_pattern": "Orin NX"},
    "cuda": {"version": "12.6", "archs": ["sm_87"], "igpu": True},
    "colibri": {"embed_pad": 64, "stream_count": 2, "routing_mode": "softmax_topk",
                "top_k": 8, "max_experts": 64},
    "tune": {"nvpmodel_mode": "MAXN", "jetson_clocks": True, "cpu_governor": "performance",
             "gpu_governor": "performance"},
    "smoke": {"max_first_token_ms_p99": 2000, "prompt_ids": [1, 2, 3, 4], "greedy_tokens": 8},
}


def write(tdir: Path, name: str, doc: dict | str) -> Path:
    tdir.mkdir(parents=True, exist_ok=True)
    path = tdir / f"{name}.yaml"
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc, sort_keys=False))
    return path


def set_path(doc: dict, keypath: str, value: object) -> dict:
    doc = copy.deepcopy(doc)
    *parents, last = keypath.split(".")
    node = doc
    for key in parents:
        node = node[key]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return doc


DELETE = object()


# --------------------------------------------------------------------------- shipped profiles


def test_shipped_profiles_are_listed_without_bases():
    names = list_profiles()
    assert names == sorted(names)
    for required in ("orin-nx", "orin-nano", "agx-orin", "xavier-nx", "agx-thor", "host"):
        assert required in names
    assert not [n for n in names if n.startswith("_")]
    assert (ROOT / "targets" / "_jetson.yaml").is_file()


@pytest.mark.parametrize("name,arch,glibc,cuda,sms,mcpu,soc", [
    ("orin-nx", "aarch64", "2.35", "12.6", ("sm_87",), "cortex-a78ae", "tegra234"),
    ("orin-nano", "aarch64", "2.35", "12.6", ("sm_87",), "cortex-a78ae", "tegra234"),
    ("agx-orin", "aarch64", "2.35", "12.6", ("sm_87",), "cortex-a78ae", "tegra234"),
    ("xavier-nx", "aarch64", "2.31", "11.8", ("sm_72",), "carmel", "tegra194"),
    ("agx-thor", "aarch64", "2.39", "13.0", ("sm_110",), "neoverse-v3ae", "tegra264"),
])
def test_jetson_profiles_match_the_hardware_table(name, arch, glibc, cuda, sms, mcpu, soc):
    p = load_profile(name)
    assert (p.name, p.arch, p.glibc, p.cpu_mcpu) == (name, arch, glibc, mcpu)
    assert p.cuda is not None and p.cuda.version == cuda and p.cuda.archs == sms
    assert p.cuda.igpu is True
    assert p.device is not None and p.device.soc == soc
    assert p.zig_triple == f"aarch64-linux-gnu.{glibc}"
    assert p.tune is not None and p.tune.jetson_clocks is True
    assert p.glibc_tuple == tuple(int(x) for x in glibc.split("."))


def test_orin_modules_use_their_own_nvpmodel_mode_names():
    assert load_profile("orin-nx").tune.nvpmodel_mode == ("MAXN_SUPER", "MAXN")
    assert load_profile("orin-nano").tune.nvpmodel_mode == "max"   # 15W on JP6.1, MAXN_SUPER on 6.2
    assert load_profile("agx-orin").tune.nvpmodel_mode == "MAXN"
    assert load_profile("xavier-nx").tune.nvpmodel_mode == "MODE_20W_6CORE"
    assert load_profile("orin-nano").l4t == "36.4"
    assert load_profile("xavier-nx").jetpack == "5.1.3"


def test_host_profile_has_no_device_parts():
    p = load_profile("host")
    assert p.arch == "x86_64" and p.cuda is None and p.device is None and p.tune is None
    assert p.cpu_mcpu is None and p.zig_mcpu is None and p.sms == ()
    # The host floor must not be above the glibc of the machine that builds and runs it.
    import platform
    libc, ver = platform.libc_ver()
    if libc == "glibc":
        assert p.glibc_tuple <= tuple(int(x) for x in ver.split(".")[:2])


def test_every_shipped_profile_is_valid():
    profiles = load_all()
    assert len(profiles) >= 6
    assert len({p.hash for p in profiles}) == len(profiles)   # no two resolve to the same thing


@pytest.mark.parametrize("name", list_profiles())
def test_every_shipped_profile_accepts_the_expert_counts_users_run(name):
    """Qwen3-30B-A3B has 128 routed experts, top-8; Qwen3.5-35B-A3B 256, top-8 (their
    config.json: num_experts, num_experts_per_tok); OLMoE 64. Every shipped target must convert
    them (the top-k network is sized by the model's E at run time, not by this cap); Qwen3-Next's
    512, top-10, the targets that have the memory for it (AGX Thor) and the host."""
    from colibri_kit.model.convert import target_limits
    limits = target_limits(load_profile(name))
    assert limits.max_experts >= 256 and limits.top_k >= 8
    if name in ("agx-thor", "host"):
        assert limits.max_experts >= 512 and limits.top_k >= 10


def _name_takers():
    """Every library function that once took a target name (issue 19), called with one."""
    from colibri_kit import build
    from colibri_kit.fleet import deploy
    from colibri_kit.model import convert, footprint

    h = None  # never read: the profile is checked first
    return {
        "build": lambda: build.build("host", where="host"),
        "prepare": lambda: deploy.prepare("orin-nx", Path("dist/orin-nx")),
        "target_limits": lambda: convert.target_limits("host"),
        "convert": lambda: convert.convert("hf", "out.colibri", "f32", "host"),
        "footprint": lambda: footprint.footprint(h, "orin-nx"),
        "model_footprint": lambda: footprint.model_footprint("m.colibri", "orin-nx"),
        "suggestions": lambda: footprint.suggestions(h, "orin-nx"),
        "check_fits": lambda: footprint.check_fits(h, "orin-nx"),
        "check_model_fits": lambda: footprint.check_model_fits("m.colibri", "orin-nx"),
    }


@pytest.mark.parametrize("function", sorted(_name_takers()))
def test_library_functions_refuse_a_target_name_and_say_what_to_pass(function, tmp_path, monkeypatch):
    """A name where a Profile belongs: a TypeError naming the function and the call that gives
    the Profile, before anything is read, built or written (the cwd is an empty directory)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(TypeError) as err:
        _name_takers()[function]()
    target = "host" if function in ("build", "target_limits", "convert") else "orin-nx"
    assert str(err.value) == (f"{function}() takes a Profile, not the target name {target!r}: "
                              f"pass load_profile({target!r}) (colibri_kit.profiles)")
    assert list(tmp_path.iterdir()) == []


def test_require_profile_passes_a_profile_and_names_any_other_type():
    from colibri_kit.profiles import require_profile

    p = load_profile("host")
    assert require_profile(p, "f") is p
    with pytest.raises(TypeError, match=r"^f\(\) takes a Profile, not PosixPath: pass load_profile\(NAME\)"):
        require_profile(Path("targets/host.yaml"), "f")


def test_convert_needs_a_profile_or_limits(tmp_path):
    from colibri_kit.model.convert import convert

    with pytest.raises(TypeError, match=r"convert\(\) needs the target's Profile \(profile=load_profile"):
        convert(tmp_path / "hf", tmp_path / "out.colibri")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_zig_knows_every_shipped_cpu_name(tmp_path):
    """The profile's -mcpu reaches `zig cc`: compile a file with each one for real."""
    src = tmp_path / "t.c"
    src.write_text("int f(int x) { return x * 3; }\n")
    seen = set()
    for p in load_all():
        if p.zig_mcpu is None or (p.zig_triple, p.zig_mcpu) in seen:
            continue
        seen.add((p.zig_triple, p.zig_mcpu))
        out = tmp_path / f"{p.name}.o"
        proc = subprocess.run(
            [*zig_command(), "cc", "-target", p.zig_triple,
             f"-mcpu={p.zig_mcpu}", "-c", str(src), "-o", str(out)],
            capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, f"{p.name}: zig rejects -mcpu={p.zig_mcpu}: {proc.stderr}"
        assert out.read_bytes()[18] == 183  # EM_AARCH64 (low byte of e_machine)
    assert ("aarch64-linux-gnu.2.39", "neoverse_v3ae") in seen


def test_zig_rejects_an_unknown_cpu_name(tmp_path):
    """The check above can fail: zig does refuse a CPU it does not know."""
    src = tmp_path / "t.c"
    src.write_text("int f(void) { return 0; }\n")
    proc = subprocess.run(
        [*zig_command(), "cc", "-target", "aarch64-linux-gnu.2.35",
         "-mcpu=neoverse_v99", "-c", str(src), "-o", str(tmp_path / "t.o")],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "neoverse_v99" in proc.stderr


# --------------------------------------------------------------------------- extends


def test_extends_deep_merges_with_child_winning(tmp_path):
    base = {k: v for k, v in VALID.items() if k != "name"}
    write(tmp_path, "_base", base)
    write(tmp_path, "_mid", {"extends": "_base", "colibri": {"top_k": 2},
                             "cuda": {"archs": ["sm_72", "sm_87"]}})
    write(tmp_path, "leaf", {"name": "leaf", "extends": "_mid", "description": "leaf dev",
                             "colibri": {"routing_mode": "linear_score"}})
    p = load_profile("leaf", tmp_path)
    assert p.description == "leaf dev"
    assert p.colibri.top_k == 2 and p.colibri.routing_mode == "linear_score"
    assert p.colibri.max_experts == 64 and p.colibri.embed_pad == 64   # from the base
    assert p.cuda.archs == ("sm_72", "sm_87")   # lists replace, they do not append
    assert p.cuda.version == "12.6" and p.cuda.igpu is True
    assert list_profiles(tmp_path) == ["leaf"]


def test_null_in_child_removes_an_inherited_section(tmp_path):
    write(tmp_path, "_base", {k: v for k, v in VALID.items() if k != "name"})
    write(tmp_path, "cpuonly", {"name": "cpuonly", "extends": "_base", "cuda": None,
                                "tune": None})
    p = load_profile("cpuonly", tmp_path)
    assert p.cuda is None and p.tune is None and p.device is not None


def test_same_resolved_profile_gives_same_hash_however_written(tmp_path):
    flat = write(tmp_path / "a", "dev", VALID)
    reordered = dict(reversed(list(VALID.items())))
    write(tmp_path / "b", "dev", reordered)
    write(tmp_path / "c", "_base", {k: v for k, v in VALID.items() if k not in ("name", "smoke")})
    write(tmp_path / "c", "dev", {"name": "dev", "extends": "_base", "smoke": VALID["smoke"]})
    hashes = {load_profile("dev", d).hash for d in (tmp_path / "a", tmp_path / "b",
                                                    tmp_path / "c")}
    assert len(hashes) == 1
    h = hashes.pop()
    assert len(h) == 64 and int(h, 16) >= 0
    assert load_profile("dev", flat.parent).hash == h           # stable across loads
    write(tmp_path / "d", "dev", set_path(VALID, "colibri.top_k", 4))
    assert load_profile("dev", tmp_path / "d").hash != h        # and it does cover the values


def test_hash_does_not_depend_on_where_the_checkout_is(tmp_path):
    copy_dir = tmp_path / "elsewhere" / "targets"
    shutil.copytree(ROOT / "targets", copy_dir)
    for name in list_profiles():
        assert load_profile(name, copy_dir).hash == load_profile(name).hash


def test_to_dict_round_trips_through_yaml(tmp_path):
    p = load_profile("orin-nx")
    doc = p.to_dict()
    write(tmp_path, "orin-nx", doc)
    again = load_profile("orin-nx", tmp_path)
    assert again.hash == p.hash and again.to_dict() == doc
    shown = yaml.safe_load(profile_yaml(p))
    assert shown["hash"] == p.hash and shown["cuda"]["archs"] == ["sm_87"]


def test_cuda_spills_policy_defaults_to_warn_and_keeps_the_hash(tmp_path):
    """`cuda.spills: error` makes a kernel's register spill fail the build (colibri_kit.build);
    the default `warn` is the same profile, hash included, as one that does not say it."""
    write(tmp_path / "a", "dev", VALID)
    write(tmp_path / "b", "dev", set_path(VALID, "cuda.spills", "warn"))
    write(tmp_path / "c", "dev", set_path(VALID, "cuda.spills", "error"))
    plain = load_profile("dev", tmp_path / "a")
    assert plain.cuda.spills == "warn"
    assert load_profile("dev", tmp_path / "b").hash == plain.hash
    p = load_profile("dev", tmp_path / "c")
    assert p.cuda.spills == "error" and p.hash != plain.hash
    assert p.to_dict()["cuda"]["spills"] == "error"


def test_profile_is_frozen():
    p = load_profile("orin-nx")
    with pytest.raises(Exception):
        p.name = "other"  # type: ignore[misc]
    assert isinstance(p, Profile) and hash(p) == hash(load_profile("orin-nx"))


# --------------------------------------------------------------------------- validation errors

# (key path to change, new value, fragments the message must contain)
BROKEN = [
    ("colibri.routing_mode", "topk", ["colibri.routing_mode", "'topk'", "softmax_topk",
                                      "linear_score"]),
    ("colibri.bogus", 1, ["colibri.bogus", "unknown key", "embed_pad"]),
    ("bogus_top", 1, ["bogus_top", "unknown key", "allowed keys"]),
    ("colibri.top_k", "8", ["colibri.top_k", "expected an integer", "'8'"]),
    ("colibri.top_k", True, ["colibri.top_k", "expected an integer", "true"]),
    ("colibri.top_k", 128, ["colibri.top_k", "128", "out of range", "1..16"]),
    ("colibri.top_k", 17, ["colibri.top_k", "17", "out of range", "1..16"]),
    ("colibri.top_k", 0, ["colibri.top_k", "out of range"]),
    ("colibri.max_experts", 48, ["colibri.max_experts", "48", "power of two"]),
    ("colibri.max_experts", 1024, ["colibri.max_experts", "1024", "512"]),
    ("colibri.embed_pad", 40, ["colibri.embed_pad", "40", "multiple of 16"]),
    ("colibri.embed_pad", 0, ["colibri.embed_pad", "0", "multiple of 16"]),
    ("colibri.stream_count", 3, ["colibri.stream_count", "3", "1, 2"]),
    ("colibri.embed_pad", DELETE, ["colibri.embed_pad", "missing required key"]),
    ("description", DELETE, ["description", "missing required key"]),
    ("arch", "armv7", ["arch", "'armv7'", "aarch64, x86_64"]),
    ("glibc", 2.35, ["glibc", "expected a string", "quote it"]),
    ("glibc", "2.x", ["glibc", "'2.x'", "2.N"]),
    ("cuda.version", "12.4", ["cuda.version", "'12.4'", "11.8, 12.6, 13.0"]),
    ("cuda.archs", ["sm_35"], ["cuda.archs.0", "sm_35", "not supported by CUDA 12.6"]),
    ("cuda.archs", ["sm_110"], ["cuda.archs.0", "sm_110", "not supported by CUDA 12.6"]),
    ("cuda.archs", ["sm87"], ["cuda.archs.0", "'sm87'", "sm_NN"]),
    ("cuda.archs", [], ["cuda.archs", "empty"]),
    ("cuda.archs", "sm_87", ["cuda.archs", "expected a list"]),
    ("cuda.archs", ["sm_87", "sm_87"], ["cuda.archs", "duplicate"]),
    ("cuda", "12.6", ["cuda", "expected a mapping"]),
    ("cuda.spills", "ignore", ["cuda.spills", "'ignore'", "warn, error"]),
    ("tune.cpu_governor", "performance; reboot", ["tune.cpu_governor", "[a-z0-9_]+"]),
    ("tune.gpu_governor", "../../x", ["tune.gpu_governor", "'../../x'", "[a-z0-9_]+"]),
    ("tune.nvpmodel_mode", "MAXN && rm", ["tune.nvpmodel_mode", "[A-Za-z0-9_]+"]),
    ("tune.jetson_clocks", "yes", ["tune.jetson_clocks", "true or false", "'yes'"]),
    ("smoke.max_first_token_ms_p99", -1, ["smoke.max_first_token_ms_p99", "> 0"]),
    ("smoke.prompt_ids", [1, -2], ["smoke.prompt_ids.1", "-2"]),
    ("cpu.mcpu", "cortex a78; rm", ["cpu.mcpu", "cortex a78; rm"]),
    ("device.model_pattern", "Orin`id`", ["device.model_pattern"]),
    ("name", "other", ["name", "'other'", "must equal the file name"]),
    # One trailing newline (re.match with "$" let it through to sysfs writes and command lines).
    ("tune.cpu_governor", "performance\n", ["tune.cpu_governor", "[a-z0-9_]+"]),
    ("tune.nvpmodel_mode", "MAXN\n", ["tune.nvpmodel_mode", "[A-Za-z0-9_]+"]),
    ("cpu.mcpu", "cortex-a78ae\n", ["cpu.mcpu"]),
    ("glibc", "2.35\n", ["glibc", "2.N"]),
    ("device.soc", "tegra234\n", ["device.soc"]),
]


@pytest.mark.parametrize("keypath,value,fragments", BROKEN,
                         ids=[f"{k}={v!r}" for k, v, _ in BROKEN])
def test_broken_profile_error_names_file_key_and_allowed_values(tmp_path, keypath, value,
                                                                fragments):
    path = write(tmp_path, "dev", set_path(VALID, keypath, value))
    with pytest.raises(ProfileError) as err:
        load_profile("dev", tmp_path)
    msg = str(err.value)
    assert msg.startswith(f"{path}: "), msg
    for fragment in fragments:
        assert fragment in msg, f"{fragment!r} not in {msg!r}"


def test_sm_support_follows_the_pinned_cuda_version(tmp_path):
    ok = [("11.8", "sm_72"), ("11.8", "sm_87"), ("12.6", "sm_72"), ("12.6", "sm_87"),
          ("13.0", "sm_87"), ("13.0", "sm_110")]
    bad = [("13.0", "sm_72"), ("13.0", "sm_53"), ("11.8", "sm_110"), ("12.6", "sm_110"),
           ("11.8", "sm_100")]
    for version, sm in ok + bad:
        doc = set_path(set_path(VALID, "cuda.version", version), "cuda.archs", [sm])
        write(tmp_path, "dev", doc)
        if (version, sm) in ok:
            assert load_profile("dev", tmp_path).cuda.archs == (sm,)
        else:
            with pytest.raises(ProfileError, match=rf"cuda\.archs\.0: {sm} is not supported "
                                                   rf"by CUDA {version}"):
                load_profile("dev", tmp_path)
    assert "sm_72" not in CUDA_SMS["13.0"] and "sm_110" in CUDA_SMS["13.0"]


def test_error_names_the_base_file_that_set_the_bad_value(tmp_path):
    base = {k: v for k, v in VALID.items() if k != "name"}
    base_path = write(tmp_path, "_base", set_path(base, "colibri.embed_pad", 20))
    write(tmp_path, "dev", {"name": "dev", "extends": "_base"})
    with pytest.raises(ProfileError) as err:
        load_profile("dev", tmp_path)
    assert str(err.value).startswith(f"{base_path}: colibri.embed_pad: 20")


def test_top_k_checked_against_the_merged_max_experts(tmp_path):
    """Each file alone is fine; only the merge makes top_k > max_experts."""
    write(tmp_path, "_base", {k: v for k, v in VALID.items() if k != "name"})
    leaf = write(tmp_path, "dev", {"name": "dev", "extends": "_base",
                                   "colibri": {"max_experts": 4}})
    with pytest.raises(ProfileError) as err:
        load_profile("dev", tmp_path)
    assert "colibri.top_k: 8 is larger than colibri.max_experts (4)" in str(err.value)
    # top_k's value came from the base, so the base is the file named
    assert str(err.value).startswith(f"{tmp_path / '_base.yaml'}: colibri.top_k")
    assert leaf.is_file()


def test_extends_cycle_is_refused(tmp_path):
    write(tmp_path, "_a", {"extends": "_b"})
    write(tmp_path, "_b", {"extends": "_a"})
    path = write(tmp_path, "dev", {"name": "dev", "extends": "_a"})
    with pytest.raises(ProfileError, match=r"extends: cycle dev -> _a -> _b -> _a") as err:
        load_profile("dev", tmp_path)
    assert str(err.value).startswith(str(path))


def test_missing_base_is_refused(tmp_path):
    path = write(tmp_path, "dev", {"name": "dev", "extends": "_nowhere"})
    with pytest.raises(ProfileError) as err:
        load_profile("dev", tmp_path)
    assert str(err.value).startswith(f"{path}: extends: base '_nowhere' not found")


def test_unknown_target_lists_the_known_ones(tmp_path):
    write(tmp_path, "dev", VALID)
    with pytest.raises(ProfileError, match=r"unknown target 'nope'.*known targets: dev"):
        load_profile("nope", tmp_path)
    with pytest.raises(ProfileError, match=r"not valid"):
        load_profile("../etc/passwd", tmp_path)
    with pytest.raises(ProfileError, match=r"not valid"):
        load_profile("_base", tmp_path)   # abstract bases are not buildable


def test_invalid_yaml_and_non_mapping(tmp_path):
    path = write(tmp_path, "dev", "name: dev\ncolibri: {embed_pad: 64\n")
    with pytest.raises(ProfileError, match=r"not valid YAML \(line \d+\)") as err:
        load_profile("dev", tmp_path)
    assert str(err.value).startswith(str(path))
    write(tmp_path, "dev", "name: dev\ncolibri: {top_k: 1}\ncolibri: {top_k: 2}\n")
    with pytest.raises(ProfileError, match=r"not valid YAML \(line 3\): duplicate key 'colibri'"):
        load_profile("dev", tmp_path)
    write(tmp_path, "dev", "- just\n- a list\n")
    with pytest.raises(ProfileError, match=r"must be a mapping"):
        load_profile("dev", tmp_path)


# --------------------------------------------------------------------------- tasks


def _invoke(*args: str, root: Path | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    if root is not None:
        env["COLIBRI_PROJECT_ROOT"] = str(root)
    return subprocess.run([sys.executable, "-m", "invoke", "-r", str(ROOT), *args],
                          capture_output=True, text=True, env=env, timeout=120)


def test_invoke_targets_lists_and_shows():
    listed = _invoke("targets")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split() == ["name", "arch", "jetpack/l4t", "cuda", "sms", "glibc",
                                "description"]
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert set(rows) == set(list_profiles())
    assert rows["agx-thor"][1:6] == ["aarch64", "7.0/38.2", "13.0", "sm_110", "2.39"]
    assert rows["host"][1:6] == ["x86_64", "-", "-", "-", "2.36"]
    shown = _invoke("targets", "--show", "xavier-nx")
    assert shown.returncode == 0, shown.stderr
    doc = yaml.safe_load(shown.stdout)
    assert doc["hash"] == load_profile("xavier-nx").hash
    assert doc["cuda"] == {"version": "11.8", "archs": ["sm_72"], "igpu": True, "compat_driver": True}
    assert doc["tune"]["nvpmodel_mode"] == "MODE_20W_6CORE"


def test_invoke_with_a_broken_profile_exits_nonzero_naming_file_and_key(tmp_path):
    shutil.copytree(ROOT / "targets", tmp_path / "targets")
    shutil.copytree(ROOT / "templates", tmp_path / "templates")
    text = (tmp_path / "targets" / "orin-nx.yaml").read_text()
    (tmp_path / "targets" / "orin-nx.yaml").write_text(
        text + "colibri: {routing_mode: topk}\n")
    for args in (("targets", "--show", "orin-nx"), ("render", "--target", "orin-nx"),
                 ("targets",)):
        proc = _invoke(*args, root=tmp_path)
        assert proc.returncode == 1, proc
        assert "Traceback" not in proc.stderr
        assert ("error: targets/orin-nx.yaml: colibri.routing_mode: 'topk' is not one of "
                "softmax_topk, linear_score") in proc.stderr
    assert not (tmp_path / "build").exists()


CLI_BROKEN = [
    ("colibri: {bogus: 1}\n", "colibri.bogus: unknown key 'bogus'; allowed keys: embed_pad"),
    ("colibri: {top_k: eight}\n", "colibri.top_k: expected an integer, got 'eight' (string)"),
    ("colibri: {top_k: 16, max_experts: 8}\n",
     "colibri.top_k: 16 is larger than colibri.max_experts (8)"),
    ("colibri: {embed_pad: 100}\n", "colibri.embed_pad: 100 is not allowed; must be a positive "
                                    "multiple of 16"),
    ("cuda: {version: '13.0', archs: [sm_72]}\n", "cuda.archs.0: sm_72 is not supported by "
                                                  "CUDA 13.0; CUDA 13.0 targets: sm_75,"),
    ("arch: riscv64\n", "arch: 'riscv64' is not one of aarch64, x86_64"),
    ("glibc: 2.35\n", "glibc: expected a string, got 2.35 (number); quote it in YAML"),
]


@pytest.mark.slow
@pytest.mark.parametrize("appended,expected", CLI_BROKEN, ids=[e.split(":")[0] for _, e in
                                                               CLI_BROKEN])
def test_each_error_class_exits_nonzero_from_the_cli(tmp_path, appended, expected):
    shutil.copytree(ROOT / "targets", tmp_path / "targets")
    path = tmp_path / "targets" / "agx-thor.yaml"
    kept = [line for line in path.read_text().splitlines(keepends=True)
            if not line.startswith(appended.split(":")[0] + ":")]
    path.write_text("".join(kept) + appended)
    proc = _invoke("targets", "--show", "agx-thor", root=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"error: targets/agx-thor.yaml: {expected}"), proc.stderr
