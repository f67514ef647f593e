"""The device layout and the operations on it that deploy, rollback, status and smoke share.

```
<root>/releases/<release-id>/{bin,lib,include,manifest.json,release.json,model.colibri -> ../../models/<sha>.colibri}
<root>/releases/<release-id>.partial-<nonce>/   an upload in progress (never pointed at)
<root>/models/<sha256>.colibri                  content addressed; <sha256>.colibri.partial while uploading
<root>/current -> releases/<release-id>         switched by rename of a new link, then fsync
```
Only complete, verified directories are ever renamed to ``releases/<id>``, and ``current`` only
ever moves between such directories, so it always points at a complete release. Every remote
command is an argv list (quoted by the Remote in one place); every path component that comes from
outside (release id, sha256) is validated first.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from dataclasses import dataclass, field

from colibri_kit import jetson
from colibri_kit.errors import FleetError
from colibri_kit.fleet.remote import Remote
from colibri_kit.manifest import Manifest, ManifestError
from colibri_kit.profiles import Profile

RELEASE_ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")   # checked with fullmatch
SHA256_RE = re.compile(r"[0-9a-f]{64}")
L4T_RE = re.compile(r"#\s*R(\d+)\s*\(release\),\s*REVISION:\s*([0-9.]+)")


def validate_release_id(value: str) -> str:
    if not isinstance(value, str) or not RELEASE_ID_RE.fullmatch(value) or ".partial" in value:
        raise FleetError(f"{value!r} is not a release id (letters, digits, '.', '_', '-')")
    return value


def validate_sha(value: str) -> str:
    if not isinstance(value, str) or not SHA256_RE.fullmatch(value):
        raise FleetError(f"{value!r} is not a sha256 hex digest")
    return value


def releases_dir(root: str) -> str:
    return posixpath.join(root, "releases")


def release_dir(root: str, release_id: str) -> str:
    return posixpath.join(root, "releases", validate_release_id(release_id))


def model_path(root: str, sha: str) -> str:
    return posixpath.join(root, "models", f"{validate_sha(sha)}.colibri")


def current_link(root: str) -> str:
    return posixpath.join(root, "current")


# -- device identity ------------------------------------------------------------------------------
@dataclass
class DeviceInfo:
    arch: str
    l4t: str | None = None          # "36.4.3"
    model: str | None = None        # devicetree model string (raw: print it through clean())
    compatible: tuple[str, ...] = ()
    l4t_version: jetson.L4TVersion | None = None
    memtotal_kb: int | None = None
    cpus: int | None = None
    sku: jetson.Sku | None = None
    sku_error: str | None = None
    cuda_compat: tuple[str, ...] = ()   # CUDA versions whose cuda-compat driver is installed

    @property
    def shown(self) -> str:
        """What the device is, for tables: SKU and model string, cleaned."""
        if self.sku is not None:
            return f"{self.sku.key} ({self.sku.model})"
        return jetson.clean(self.model or self.arch)

    def cuda_driver(self) -> tuple[jetson.CudaVersion, str] | None:
        """The CUDA driver the device's kernels would meet, and where that figure comes from:
        the newest cuda-compat driver installed, else the stock driver of the L4T release (the
        driver is part of the BSP [docs/jetson-facts.md])."""
        if self.l4t_version is None:
            return None
        stock = jetson.stock_driver_for(self.l4t_version)
        compat = [jetson.CudaVersion.parse(v) for v in self.cuda_compat]
        best = max(compat) if compat else None
        if best is not None and (stock is None or best > stock):
            return best, f"cuda-compat {best} in /usr/local/cuda-{best}/compat"
        if stock is None:
            return None
        return stock, f"stock driver of L4T {self.l4t_version}"

    @property
    def soc(self) -> str | None:
        for c in self.compatible:
            if c.startswith("nvidia,tegra"):
                return c.split(",", 1)[1]
        return None


def _read_nul_text(remote: Remote, paths: list[str]) -> str | None:
    for p in paths:
        text = remote.read_text(p)
        if text is not None:
            return text
    return None


def identify(remote: Remote) -> DeviceInfo:
    """What the device says it is: ``uname -m``, ``/etc/nv_tegra_release``, devicetree."""
    arch = remote.run(["uname", "-m"]).stdout.strip()
    info = DeviceInfo(arch=arch)
    release = remote.read_text("/etc/nv_tegra_release")
    if release:
        m = L4T_RE.search(release)
        if m:
            info.l4t = f"{m.group(1)}.{m.group(2)}"
        try:
            info.l4t_version = jetson.parse_l4t_release(release)
        except jetson.JetsonError:
            info.l4t_version = None
    model = _read_nul_text(remote, ["/proc/device-tree/model", "/sys/firmware/devicetree/base/model"])
    if model is not None:
        info.model = model.replace("\0", "").strip()
    compat = _read_nul_text(remote, ["/proc/device-tree/compatible",
                                     "/sys/firmware/devicetree/base/compatible"])
    if compat is not None:
        info.compatible = tuple(c for c in compat.split("\0") if c)
    meminfo = remote.read_text("/proc/meminfo")
    if meminfo:
        try:
            info.memtotal_kb = jetson.parse_meminfo_kb(meminfo)
        except jetson.JetsonError:
            pass
    present = remote.read_text("/sys/devices/system/cpu/present")
    if present:
        try:
            info.cpus = jetson.parse_cpu_list(present)
        except jetson.JetsonError:
            pass
    if info.model is not None and info.compatible and info.memtotal_kb and info.cpus:
        try:
            info.sku = jetson.identify_sku(info.model, "\0".join(info.compatible),
                                           info.memtotal_kb, info.cpus)
        except jetson.JetsonError as exc:
            info.sku_error = str(exc)
    if info.l4t_version is not None:
        # NVIDIA's cuda-compat package installs /usr/local/cuda-X.Y/compat/libcuda.so.*
        ls = remote.run(["ls", "-1", "--", "/usr/local"], check=False)
        versions = sorted(m.group(1) for m in re.finditer(r"^cuda-(\d+\.\d+)$", ls.stdout, re.M))
        if versions:
            found = remote.run(["ls", "-1d", "--", *[f"/usr/local/cuda-{v}/compat/libcuda.so.1"
                                                      for v in versions]], check=False)
            info.cuda_compat = tuple(m.group(1) for m in re.finditer(
                r"/usr/local/cuda-(\d+\.\d+)/compat/libcuda\.so\.1$", found.stdout, re.M))
    return info


# The GPU's SM per SoC (Xavier sm_72, Orin sm_87, Thor sm_110), for the driver check.
SOC_SM = {"tegra194": "sm_72", "tegra234": "sm_87", "tegra264": "sm_110"}


def build_ptx_isa(cuda: jetson.CudaVersion) -> str | None:
    """The PTX ISA a build with this CUDA embeds: the newest ISA that CUDA emits."""
    best = None
    for isa, first in jetson.PTX_ISA_FIRST_CUDA.items():
        if first <= cuda and (best is None or first >= jetson.PTX_ISA_FIRST_CUDA[best]):
            best = isa
    return best


def driver_verdict(info: DeviceInfo, profile: Profile) -> jetson.DriverVerdict | None:
    """Whether the device's CUDA driver runs ``profile``'s build (docs/jetson-facts.md: a cubin
    when the build's CUDA is not newer than the driver, else PTX the driver's ISA covers)."""
    if profile.cuda is None or info.l4t_version is None:
        return None
    found = info.cuda_driver()
    if found is None:
        return None
    driver, source = found
    build = jetson.CudaVersion.parse(profile.cuda.version)
    sm = SOC_SM.get(info.soc or "", profile.sms[0] if profile.sms else "")
    v = jetson.check_cuda_driver(driver, build, sm, profile.sms, build_ptx_isa(build))
    return jetson.DriverVerdict(v.runs, v.how, f"CUDA driver {driver} ({source}): {v.message}",
                                v.notes)


def loaded_driver(remote: Remote, binary: str) -> dict | None:
    """What the deployed binary itself loads: `colibri gpuprobe --json` (a 1 MiB copy) names the
    libcuda it opened (the profile's cuda-compat driver by path, else the system's) and that
    driver's cuDriverGetVersion. None when it opens no GPU (no driver, an emulated device)."""
    res = remote.run([binary, "gpuprobe", "--mib", "1", "--iters", "1", "--json"], check=False,
                     timeout=120)
    if res.exit_code != 0:
        return None
    try:
        answer = json.loads(res.stdout)
        int(answer["driver_version"]), str(answer["libcuda"]), int(answer["sm"])
    except (ValueError, KeyError, TypeError):
        return None
    return answer


def loaded_driver_verdict(answer: dict, profile: Profile) -> jetson.DriverVerdict:
    """Whether the driver the binary loaded (loaded_driver's answer) runs the profile's build:
    the rule of driver_verdict, on the version the driver reports instead of the one the device's
    files suggest."""
    driver = jetson.CudaVersion.parse(int(answer["driver_version"]))
    build = jetson.CudaVersion.parse(profile.cuda.version)
    sm = f"sm_{int(answer['sm'])}"
    v = jetson.check_cuda_driver(driver, build, sm, profile.sms, build_ptx_isa(build))
    where = jetson.clean(str(answer["libcuda"]))
    return jetson.DriverVerdict(v.runs, v.how, f"colibri loaded {where} (CUDA driver {driver}): "
                                f"{v.message}", v.notes)


def check_device(info: DeviceInfo, profile: Profile, host_name: str) -> list[str]:
    """Problems (empty when the device is the kind ``profile`` targets)."""
    problems = []
    arch = profile.arch
    if info.arch != arch and not (arch == "aarch64" and info.arch == "arm64"):
        problems.append(f"architecture is {info.arch}, target {profile.name} needs {arch}")
    device = profile.device
    if device is not None:
        # A third-party carrier reports its own model string: the module family identified from
        # SoC + compatible (+ MemTotal, CPU count) counts as well as the model string.
        family = info.sku.family.replace("-", " ") if info.sku else ""
        if info.model is None:
            problems.append("no devicetree model (/proc/device-tree/model): not a Jetson")
        elif device.model_pattern not in info.model and \
                device.model_pattern.lower() not in family:
            problems.append(f"device is {jetson.clean(info.model)!r}"
                            f"{f' ({info.sku.key})' if info.sku else ''}, target {profile.name} "
                            f"expects a {device.model_pattern!r} module")
        if info.compatible and info.soc != device.soc:
            problems.append(f"SoC is {info.soc}, target expects {device.soc}")
    version = info.l4t_version
    if version is None and info.l4t:
        try:
            version = jetson.parse_l4t_release(f"# R{info.l4t.split('.', 1)[0]} (release), "
                                               f"REVISION: {info.l4t.split('.', 1)[-1]}")
        except jetson.JetsonError:
            version = None
    if profile.l4t_range:
        if version is None:
            problems.append("no /etc/nv_tegra_release: cannot tell the L4T release")
        else:
            try:
                jetson.check_l4t(version, jetson.parse_l4t_range(profile.l4t_range),
                                 profile.name)
            except jetson.JetsonError as exc:
                problems.append(str(exc))
    elif profile.l4t:
        if info.l4t is None:
            problems.append("no /etc/nv_tegra_release: cannot tell the L4T release")
        elif info.l4t.split(".")[0] != str(profile.l4t).split(".")[0]:
            problems.append(f"L4T is R{info.l4t}, target {profile.name} is built for "
                            f"R{profile.l4t} (JetPack {profile.jetpack or '?'})")
    out = [f"{host_name}: wrong device kind: {p}" for p in problems]
    if not problems and device is not None:
        verdict = driver_verdict(info, profile)
        if verdict is not None and not verdict.runs:
            out.append(f"{host_name}: {verdict.message}")
    return out


# -- releases -------------------------------------------------------------------------------------
@dataclass
class ReleaseEntry:
    id: str
    mtime: float


@dataclass
class InstalledReleases:
    """What is installed under a device root: the current release, the complete ones, and
    uploads left unfinished."""

    current: str | None                 # release id current points at
    releases: list[ReleaseEntry] = field(default_factory=list)  # complete ones, newest first
    partials: list[str] = field(default_factory=list)           # names of *.partial-* dirs


def installed(remote: Remote, root: str) -> InstalledReleases:
    rel = releases_dir(root)
    res = remote.run(["find", rel, "-mindepth", "1", "-maxdepth", "1", "-type", "d",
                      "-printf", "%T@ %f\\n"], check=False)
    entries: list[ReleaseEntry] = []
    partials: list[str] = []
    if res.exit_code == 0:
        for line in res.stdout.splitlines():
            stamp, _, name = line.partition(" ")
            if ".partial-" in name:
                partials.append(name)
            elif RELEASE_ID_RE.fullmatch(name):
                entries.append(ReleaseEntry(name, float(stamp)))
    entries.sort(key=lambda e: (-e.mtime, e.id))
    return InstalledReleases(current=current_release(remote, root), releases=entries, partials=partials)


def current_release(remote: Remote, root: str) -> str | None:
    res = remote.run(["readlink", "--", current_link(root)], check=False)
    if res.exit_code != 0:
        return None
    target = res.stdout.strip()
    name = posixpath.basename(target.rstrip("/"))
    return name if RELEASE_ID_RE.fullmatch(name) else None


def remote_size(remote: Remote, path: str) -> int | None:
    """A remote file's size in bytes, None when it does not exist."""
    res = remote.run(["stat", "-c", "%s", "--", path], check=False)
    if res.exit_code != 0:
        if "No such file" in res.stderr:
            return None
        raise FleetError(f"{remote.name}: cannot stat {path}: {res.stderr.strip()}")
    return int(res.stdout.strip())


def release_meta(remote: Remote, root: str, release_id: str) -> dict | None:
    text = remote.read_text(posixpath.join(release_dir(root, release_id), "release.json"))
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return None


def remote_sha256(remote: Remote, paths: list[str], timeout: float = 600.0) -> dict[str, str]:
    """sha256 of remote files (path -> digest); missing files are absent from the result."""
    if not paths:
        return {}
    res = remote.run(["sha256sum", "--", *paths], check=False, timeout=timeout)
    out: dict[str, str] = {}
    for line in res.stdout.splitlines():
        digest, _, path = line.partition("  ")
        if SHA256_RE.fullmatch(digest):
            out[path] = digest
    return out


def verify_dir(remote: Remote, directory: str, expected: dict[str, str]) -> list[str]:
    """Files in ``directory`` whose sha256 differs from ``expected`` (relative path -> sha)."""
    paths = [posixpath.join(directory, rel) for rel in sorted(expected)]
    got = remote_sha256(remote, paths)
    bad = []
    for rel in sorted(expected):
        digest = got.get(posixpath.join(directory, rel))
        if digest != expected[rel]:
            bad.append(f"{rel} ({'missing' if digest is None else 'sha256 ' + digest[:12] + '…, expected ' + expected[rel][:12] + '…'})")
    return bad


def verify_release(remote: Remote, root: str, release_id: str) -> list[str]:
    """Check an installed release against its own manifest and release.json."""
    directory = release_dir(root, release_id)
    text = remote.read_text(posixpath.join(directory, "manifest.json"))
    meta = release_meta(remote, root, release_id)
    if text is None or meta is None:
        return ["manifest.json or release.json missing"]
    if hashlib.sha256(text.encode()).hexdigest() != meta.get("manifest_sha256"):
        return ["manifest.json does not match release.json"]
    try:
        manifest = Manifest.parse(text.encode(), f"{remote.name}: {directory}/manifest.json")
    except ManifestError as exc:
        return [str(exc)]
    return verify_dir(remote, directory, manifest.hashes())


def activate(remote: Remote, root: str, release_id: str) -> None:
    """Point ``current`` at ``releases/<id>`` atomically: a new link renamed over the old one."""
    new = posixpath.join(root, "current.new")
    remote.run(["rm", "-f", "--", new])
    remote.run(["ln", "-s", posixpath.join("releases", validate_release_id(release_id)), new])
    remote.run(["mv", "-T", "--", new, current_link(root)])
    remote.run(["touch", "-h", "--", release_dir(root, release_id)])
    # fsync the directory holding the link so the switch survives a power cut.
    remote.run(["sync", "--", root], check=False)


def rollback(remote: Remote, root: str, to: str | None = None) -> tuple[str | None, str]:
    """Switch ``current`` to ``to`` or to the newest other complete release. Returns (from, to)."""
    state = installed(remote, root)
    if to is not None:
        validate_release_id(to)
        if to not in {r.id for r in state.releases}:
            have = ", ".join(r.id for r in state.releases) or "none"
            raise FleetError(f"{remote.name}: no release {to} on the device (have: {have})")
        target = to
    else:
        others = [r.id for r in state.releases if r.id != state.current]
        if not others:
            raise FleetError(f"{remote.name}: no previous release to roll back to")
        target = others[0]
    bad = verify_release(remote, root, target)
    if bad:
        raise FleetError(f"{remote.name}: release {target} is damaged ({'; '.join(bad)}); not switching")
    meta = release_meta(remote, root, target) or {}
    sha = meta.get("model_sha256")
    if sha:
        got = remote_sha256(remote, [model_path(root, sha)]).get(model_path(root, sha))
        if got != sha:
            raise FleetError(f"{remote.name}: the model of release {target} is missing or damaged; not switching")
    activate(remote, root, target)
    return state.current, target
