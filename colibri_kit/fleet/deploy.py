"""Deploy a built target (``dist/<target>/``) and a model to fleet hosts, atomically per host.

Per host: identify the device and refuse the wrong kind, check free space, upload the model to
``models/<sha>.colibri.partial`` (resuming an earlier partial upload), verify, rename; upload the
release to ``releases/<id>.partial-<nonce>/``, verify every file's sha256 on the device, check the
binary runs there, rename to ``releases/<id>``; only then switch ``current``; prune old releases.
A host that fails leaves its previous release current and does not stop the others.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import secrets
import shutil
import stat
import struct
import sys
import tempfile
import threading
import weakref
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Callable

from colibri_kit import jetson
from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet import release as rel
from colibri_kit.fleet import service as svc
from colibri_kit.fleet.fleet import DEFAULT_KEEP, Fleet, Outcome, Results, Rollout
from colibri_kit.fleet.inventory import Host
from colibri_kit.fleet.remote import Remote
from colibri_kit.fleet.service import ServiceStep
from colibri_kit.hashing import file_sha256
from colibri_kit.manifest import MANIFEST_NAME, Manifest, ManifestError
from colibri_kit.profiles import Profile, require_profile
from colibri_kit.report import table
from colibri_kit.service import ServiceSpec

SPACE_MARGIN = 1.05  # need 5 % more than the bytes we upload
MiB = 1 << 20


@dataclass(frozen=True)
class Artifact:
    """What gets deployed: the dist tree (verified against its manifest, built from ``profile``)
    and an optional model."""

    profile: Profile
    dist: Path                       # a private snapshot of dist/<target>/, removed with the object
    manifest: Manifest
    sizes: dict[str, int]
    model: Path | None
    model_sha: str | None
    model_size: int
    release_id: str

    @property
    def target(self) -> str:
        return self.profile.name

    @property
    def manifest_bytes(self) -> bytes:
        return self.manifest.raw

    @property
    def files(self) -> dict[str, str]:
        """relative path -> sha256, from the manifest."""
        return self.manifest.hashes()

    @property
    def release_bytes(self) -> int:
        return sum(self.sizes.values()) + len(self.manifest_bytes) + len(self.release_json())

    def release_json(self) -> bytes:
        meta = {"id": self.release_id, "target": self.target,
                "manifest_sha256": hashlib.sha256(self.manifest_bytes).hexdigest(),
                "model_sha256": self.model_sha, "model_size": self.model_size if self.model else None}
        return (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode()


def prepare(profile: Profile, dist: Path, model: Path | None = None) -> Artifact:
    """Read and check the local build of ``profile``: its manifest must name this target and
    this profile's hash (else: refused, naming both hashes and the command that rebuilds), every
    file must match it. The release id is derived from the manifest and the model.

    The tasks pass the Profile they loaded (a target name: TypeError, ``require_profile``)."""
    profile = require_profile(profile, "prepare")
    target = profile.name
    if not (Path(dist) / MANIFEST_NAME).is_file():
        raise FleetError(f"{dist} has no {MANIFEST_NAME}: build it first (invoke build --target "
                         f"{target})")
    try:
        manifest = Manifest.load(dist)
        manifest.check_built_from(profile, str(Path(dist) / MANIFEST_NAME))
    except ManifestError as exc:
        raise FleetError(str(exc)) from None
    sizes = {}
    # Upload from a private snapshot: a rebuild of dist/ during a long rollout must not change
    # what the remaining hosts receive (the manifest was read once, above).
    snapshot = Path(tempfile.mkdtemp(prefix=f"colibri-release-{target}-"))
    for relpath, sha in manifest.hashes().items():
        local = dist / relpath
        if not local.is_file():
            shutil.rmtree(snapshot, ignore_errors=True)
            raise FleetError(f"{local} is listed in the manifest but missing: rebuild {target}")
        copy = snapshot / relpath
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(local, copy)
        if file_sha256(copy) != sha:
            shutil.rmtree(snapshot, ignore_errors=True)
            raise FleetError(f"{local} does not match its manifest (sha256 differs): rebuild "
                             f"{target} (invoke build --target {target})")
        sizes[relpath] = copy.stat().st_size
    model_sha = None
    model_size = 0
    if model is not None:
        if not model.is_file():
            shutil.rmtree(snapshot, ignore_errors=True)
            raise FleetError(f"model file {model} not found")
        model_sha = file_sha256(model)
        model_size = model.stat().st_size
    digest = hashlib.sha256(manifest.raw + b"\0" + (model_sha or "").encode()).hexdigest()
    release_id = rel.validate_release_id(f"{target}-{digest[:12]}")
    art = Artifact(profile, snapshot, manifest, sizes, model, model_sha, model_size, release_id)
    weakref.finalize(art, shutil.rmtree, snapshot, True)
    return art


class HostState(StrEnum):
    """The outcome of one host in a deploy, rollback or smoke table."""

    OK = "ok"
    UNCHANGED = "unchanged"        # already deployed and healthy: nothing uploaded or restarted
    PLANNED = "planned"            # --dry-run
    FAILED = "failed"
    ROLLED_BACK = "rolled-back"    # the service failed its gate; the previous release serves
    SKIPPED = "skipped"            # not started (canary failed, failure budget spent)


@dataclass
class HostResult:
    host: str
    release: str = "-"
    model: str = "-"
    result: HostState = HostState.FAILED
    seconds: float = 0.0
    detail: str = ""
    uploaded: int = 0                        # bytes sent
    previous: str | None = None              # the release current before: what an undo restores
    service: ServiceStep | None = None       # the service step (None: files only, --no-service)
    downtime_s: float | None = None          # restart -> health gate passed
    extra: dict[str, str] = field(default_factory=dict)   # columns other concerns add (smoke)

    @property
    def ok(self) -> bool:
        return self.result in (HostState.OK, HostState.UNCHANGED, HostState.PLANNED)

    def column(self, name: str) -> str:
        """One table cell: the typed fields by name, else what ``extra`` holds."""
        if name == "service":
            return "-" if self.service is None else str(self.service)
        if name == "downtime":
            return "-" if self.downtime_s is None else f"{self.downtime_s:.1f}s"
        if name == "previous":
            return self.previous or "-"
        return self.extra.get(name, "-")

    def to_json(self) -> dict[str, object]:
        return {**asdict(self), "result": str(self.result),
                "service": None if self.service is None else str(self.service)}


@dataclass
class Hooks:
    """Observation points (progress display; tests use them to inject real faults)."""

    progress: Callable[[str, str, int, int], None] | None = None   # host, label, done, total
    uploaded: Callable[[str, str], None] | None = None             # host, remote path, before verify


class _Progress:
    """Prints a line per 25 % of each large upload; thread-safe."""

    def __init__(self, stream=sys.stderr, min_bytes: int = 8 * MiB) -> None:
        self.stream = stream
        self.min_bytes = min_bytes
        self.lock = threading.Lock()
        self.last: dict[tuple[str, str], int] = {}

    def __call__(self, host: str, label: str, done: int, total: int) -> None:
        if total < self.min_bytes:
            return
        step = done * 4 // total
        key = (host, label)
        with self.lock:
            if self.last.get(key, -1) < step:
                self.last[key] = step
                print(f"  {host}: {label} {done * 100 // total}% ({done // MiB}/{total // MiB} MiB)",
                      file=self.stream, flush=True)


def _need_space(remote: Remote, root: str, need: int) -> None:
    res = remote.run(["df", "-Pk", "--", root])
    lines = res.stdout.strip().splitlines()
    try:
        avail = int(lines[-1].split()[3]) * 1024
    except (IndexError, ValueError):
        raise FleetError(f"{remote.name}: cannot read free space of {root}: {res.stdout!r}") from None
    if avail < need * SPACE_MARGIN:
        raise FleetError(f"{remote.name}: not enough space on {root}: need {need / MiB:.1f} MiB "
                         f"(+5 %), {avail / MiB:.1f} MiB free; free space or lower --keep")


def _upload_model(remote: Remote, art: Artifact, root: str, hooks: Hooks) -> int:
    """Content-addressed, resumable model upload. Returns bytes sent."""
    assert art.model is not None and art.model_sha is not None
    final = rel.model_path(root, art.model_sha)
    if rel.remote_sha256(remote, [final]).get(final) == art.model_sha:
        return 0
    remote.run(["rm", "-f", "--", final])
    partial = final + ".partial"
    sent = 0
    for attempt in (0, 1):
        size = rel.remote_size(remote, partial) or 0
        offset = size if attempt == 0 and 0 < size <= art.model_size else 0
        progress = (lambda d, t: hooks.progress(remote.name, "model", d, t)) if hooks.progress else None
        sent += remote.upload(art.model, partial, offset=offset, progress=progress)
        if hooks.uploaded:
            hooks.uploaded(remote.name, partial)
        if rel.remote_sha256(remote, [partial]).get(partial) == art.model_sha:
            remote.run(["mv", "-T", "--", partial, final])
            return sent
        remote.run(["rm", "-f", "--", partial])
        if offset == 0:
            break  # a full upload that does not verify: do not loop
    raise FleetError(f"{remote.name}: model upload does not verify (sha256 mismatch on the device); "
                     f"nothing activated")


def _upload_release(remote: Remote, art: Artifact, root: str, hooks: Hooks) -> int:
    final = rel.release_dir(root, art.release_id)
    partial = f"{final}.partial-{secrets.token_hex(4)}"
    dirs = sorted({posixpath.dirname(p) for p in art.files if "/" in p})
    remote.run(["mkdir", "-p", "--", partial, *(posixpath.join(partial, d) for d in dirs)])
    sent = 0
    executables = []
    for relpath in sorted(art.files):
        local = art.dist / relpath
        dest = posixpath.join(partial, relpath)
        progress = (lambda d, t, r=relpath: hooks.progress(remote.name, r, d, t)) if hooks.progress else None
        sent += remote.upload(local, dest, progress=progress)
        if local.stat().st_mode & stat.S_IXUSR:
            executables.append(dest)
    for name, data in (("manifest.json", art.manifest_bytes), ("release.json", art.release_json())):
        remote.write_bytes(posixpath.join(partial, name), data)
        sent += len(data)
    if executables:
        remote.run(["chmod", "0755", "--", *executables])
    if art.model_sha:
        remote.run(["ln", "-s", posixpath.join("..", "..", "models", f"{art.model_sha}.colibri"),
                    posixpath.join(partial, "model.colibri")])
    if hooks.uploaded:
        hooks.uploaded(remote.name, partial)
    expected = dict(art.files)
    expected["manifest.json"] = hashlib.sha256(art.manifest_bytes).hexdigest()
    expected["release.json"] = hashlib.sha256(art.release_json()).hexdigest()
    bad = rel.verify_dir(remote, partial, expected)
    if bad:
        remote.run(["rm", "-rf", "--", partial])
        raise FleetError(f"{remote.name}: checksum mismatch after upload: {', '.join(bad)}; "
                         f"release not activated, previous release stays current")
    binary = posixpath.join(partial, "bin", "colibri")
    if "bin/colibri" in art.files:
        res = remote.run([binary, "--version"], check=False, timeout=120)
        if res.exit_code != 0:
            remote.run(["rm", "-rf", "--", partial])
            raise FleetError(f"{remote.name}: the uploaded colibri does not run on the device "
                             f"(exit {res.exit_code}: {(res.stderr or res.stdout).strip()[:300]}); "
                             f"not activated")
    if remote.run(["test", "-e", final], check=False).ok:
        # Replacing a damaged copy (maybe the current one): two renames, the window is tiny.
        old = f"{final}.partial-old-{secrets.token_hex(4)}"
        remote.run(["mv", "-T", "--", final, old])
        remote.run(["mv", "-T", "--", partial, final])
        remote.run(["rm", "-rf", "--", old])
    else:
        remote.run(["mv", "-T", "--", partial, final])
    return sent


def prune(remote: Remote, root: str, keep: int, keep_model: str | None) -> list[str]:
    """Delete releases beyond the newest ``keep`` (never current), stale partial uploads, and
    models no kept release uses. Returns what was removed."""
    state = rel.installed(remote, root)
    kept = [r.id for r in state.releases][:keep]
    if state.current and state.current not in kept:
        kept.append(state.current)
    doomed = [r.id for r in state.releases if r.id not in kept]
    paths = [rel.release_dir(root, r) for r in doomed]
    paths += [posixpath.join(rel.releases_dir(root), p) for p in state.partials]
    if paths:
        remote.run(["rm", "-rf", "--", *paths])
    used = {keep_model} if keep_model else set()
    for r in kept:
        meta = rel.release_meta(remote, root, r) or {}
        if meta.get("model_sha256"):
            used.add(meta["model_sha256"])
    models_dir = posixpath.join(root, "models")
    res = remote.run(["find", models_dir, "-mindepth", "1", "-maxdepth", "1", "-printf", "%f\\n"], check=False)
    gone_models = []
    for name in res.stdout.split():
        sha = name.split(".", 1)[0]
        if rel.SHA256_RE.fullmatch(sha) and sha not in used and name in (f"{sha}.colibri", f"{sha}.colibri.partial"):
            gone_models.append(posixpath.join(models_dir, name))
    if gone_models:
        remote.run(["rm", "-f", "--", *gone_models])
    return doomed + state.partials + [posixpath.basename(m) for m in gone_models]


def model_footprint(model: Path, size: int, kv_cache: str = "f32") -> dict[str, int]:
    """The memory a model needs on the device, by part: its weights (the file, mmapped) and the
    KV cache at its full context length as the runtime lays it out (runtime/src/core/arena.c: a key
    and a value cache of n_layers x max_seq_len x n_kv_heads x head_dim float32 each, or float16
    with the service's ``kv_cache: f16``). The
    arena's activation buffers, bounded by the prefill chunk, are not counted: a lower bound,
    so a refusal is never wrong."""
    from colibri_kit.model.format import HEADER_SIZE, ModelHeader
    with open(model, "rb") as fh:
        h = ModelHeader.unpack(fh.read(HEADER_SIZE))
    h.validate_geometry()       # not a .colibri header (ModelError, a KitError): nothing to size
    kv = 2 * h.n_layers * h.max_seq_len * h.n_kv_heads * h.head_dim * (2 if kv_cache == "f16" else 4)
    return {"weights": size, f"KV cache at {h.max_seq_len} tokens": kv}


def check_memory(remote: Remote, host: Host, art: Artifact, kv_cache: str = "f32") -> str | None:
    """Refuse a model that cannot fit the device's memory (the GPU shares DRAM with the CPU:
    ``jetson.check_footprint`` against MemAvailable). Only for a model not yet on the device:
    one already running holds memory MemAvailable does not count. Returns a plan line."""
    if art.model is None or rel.remote_size(remote, rel.model_path(host.root, art.model_sha)) \
            == art.model_size:
        return None
    meminfo = remote.read_text("/proc/meminfo")
    if not meminfo:
        return None
    try:
        parts = model_footprint(art.model, art.model_size, kv_cache)
        left = jetson.check_footprint(parts, jetson.parse_meminfo(meminfo), host.name)
    except jetson.JetsonError as exc:
        raise FleetError(str(exc)) from None
    except (OSError, KitError, ValueError, struct.error):
        return None                 # not a .colibri header the kit can read: nothing to size
    return (f"memory: model needs at least {sum(parts.values()) / MiB:.0f} MiB, "
            f"{left / MiB:.0f} MiB of MemAvailable left")


def plan_host(remote: Remote, host: Host, art: Artifact,
              service: ServiceSpec | None = None) -> list[str]:
    """What a deploy would do on this host (no changes)."""
    profile = art.profile
    info = rel.identify(remote)
    problems = rel.check_device(info, profile, host.name)
    if problems:
        raise FleetError("; ".join(problems))
    root = host.root
    state = rel.installed(remote, root)
    steps = [f"device {info.shown}, L4T {info.l4t_version or (f'R{info.l4t}' if info.l4t else '?')}"]
    verdict = rel.driver_verdict(info, profile)
    if verdict is not None:
        steps.append(verdict.message)
    memory = check_memory(remote, host, art, service.kv_cache if service else "f32")
    if memory:
        steps.append(memory)
    have_release = art.release_id in {r.id for r in state.releases}
    steps.append(f"release {art.release_id}: " + ("present" if have_release else
                 f"upload {len(art.files) + 2} files ({art.release_bytes / MiB:.1f} MiB)"))
    if art.model_sha:
        final = rel.model_path(root, art.model_sha)
        have_model = rel.remote_size(remote, final) == art.model_size
        steps.append(f"model {art.model_sha[:12]}: " + ("present (verify)" if have_model else
                     f"upload {art.model_size / MiB:.1f} MiB"))
    steps.append("current: unchanged" if state.current == art.release_id else
                 f"switch current {state.current or '(none)'} -> {art.release_id}")
    if state.partials:
        steps.append(f"remove stale partial uploads: {', '.join(state.partials)}")
    if service is not None:
        steps.append("service: install/refresh colibri.service, restart, health gate, roll back "
                     "on failure" if svc.systemd_running(remote) else
                     "service: none (device not booted with systemd)")
    return steps


def deploy_host(remote: Remote, host: Host, art: Artifact, *,
                keep: int = DEFAULT_KEEP, hooks: Hooks | None = None,
                service: ServiceSpec | None = None,
                gate_timeout: float = svc.GATE_TIMEOUT_S) -> HostResult:
    """Upload, verify, switch ``current``; with ``service`` (the profile's, or None for files
    only) also install the unit, restart it and roll back when the health gate fails."""
    hooks = hooks or Hooks()
    result = HostResult(host=host.name, release=art.release_id,
                        model=art.model_sha[:12] if art.model_sha else "-")
    info = rel.identify(remote)
    problems = rel.check_device(info, art.profile, host.name)
    if problems:
        raise FleetError("; ".join(problems))
    check_memory(remote, host, art, service.kv_cache if service else "f32")
    root = host.root
    made = remote.run(["mkdir", "-p", "--", rel.releases_dir(root), posixpath.join(root, "models")],
                      check=False)
    writable = made.ok and remote.run(["test", "-w", root, "-a", "-w", rel.releases_dir(root), "-a", "-w",
                                       posixpath.join(root, "models")], check=False).ok
    if not writable:
        raise FleetError(
            f"{host.name}: {host.user} cannot write {root} ({made.stderr.strip() or 'permission denied'}); "
            f"once, as root on the device: mkdir -p {root} && chown {host.user} {root} "
            f"(or log in as root: user: root in the fleet file)")
    state = rel.installed(remote, root)
    have_release = art.release_id in {r.id for r in state.releases}
    damaged = have_release and bool(rel.verify_release(remote, root, art.release_id))
    if damaged:
        have_release = False  # re-upload; the damaged copy is swapped out only once the new one verifies
    need = 0 if have_release else art.release_bytes
    if art.model_sha:
        final = rel.model_path(root, art.model_sha)
        if rel.remote_size(remote, final) != art.model_size:
            need += art.model_size - (rel.remote_size(remote, final + ".partial") or 0)
    if need:
        _need_space(remote, root, need)
    if art.model is not None:
        result.uploaded += _upload_model(remote, art, root, hooks)
    if not have_release:
        result.uploaded += _upload_release(remote, art, root, hooks)
    _check_loaded_driver(remote, host, art, result)
    result.previous = state.current
    changed = state.current != art.release_id
    out = None
    if service is None:
        if changed:
            rel.activate(remote, root, art.release_id)
    else:
        out = svc.activate(
            remote, service.with_root(root), target=art.target,
            switch=lambda: rel.activate(remote, root, art.release_id) if changed else None,
            switch_back=(lambda: rel.rollback(remote, root, to=state.current)[1])
            if state.current and changed else None,
            changed=changed, timeout=gate_timeout)
        result.service, result.downtime_s = out.state, out.downtime_s
        if not out.ok:
            result.result = (HostState.ROLLED_BACK if out.state is ServiceStep.ROLLED_BACK
                             else HostState.FAILED)
            result.detail = out.detail
            return result
        if out.state is ServiceStep.HEALTHY:
            changed = True   # restarted: not "unchanged" even when the files were
    result.result = HostState.OK if changed or result.uploaded else HostState.UNCHANGED
    removed = prune(remote, root, keep, art.model_sha)
    result.detail = f"uploaded {result.uploaded / MiB:.1f} MiB" + (
        f", removed {len(removed)} old" if removed else "")
    if out is not None and out.state is not ServiceStep.UNCHANGED:
        result.detail += f"; {out.detail}"
    return result


def _check_loaded_driver(remote: Remote, host: Host, art: Artifact, result: HostResult) -> None:
    """The driver check on the answer of the binary itself: the release's colibri says which
    libcuda it loaded and that driver's version (release.loaded_driver); one that cannot run the
    build refuses the release before ``current`` moves (it stays uploaded, not current). A device
    where the binary opens no GPU keeps the file-based verdict of check_device."""
    profile = art.profile
    if profile.cuda is None or "bin/colibri" not in art.files:
        return
    binary = posixpath.join(rel.release_dir(host.root, art.release_id), "bin", "colibri")
    answer = rel.loaded_driver(remote, binary)
    if answer is None:
        return
    verdict = rel.loaded_driver_verdict(answer, profile)
    result.extra["driver"] = f"{answer['driver_version']} ({answer['libcuda']})"
    if not verdict.runs:
        raise FleetError(f"{host.name}: {verdict.message}; release {art.release_id} not "
                         f"activated, the previous release stays current")


def host_results(results: Results[HostResult], release: str = "-") -> list[HostResult]:
    """One HostResult per host: the value, or a failed/skipped row for the host's outcome."""
    out = []
    for o in results:
        if o.value is not None:
            r = o.value
        elif o.skipped:
            r = HostResult(host=o.host, release=release, result=HostState.SKIPPED,
                           detail=o.why or "not started")
        else:
            r = HostResult(host=o.host, release=release, result=HostState.FAILED,
                           detail=o.error or "")
        r.seconds = o.seconds
        out.append(r)
    return out


def deploy(fleet: Fleet, art: Artifact, profile: Profile | None = None, *,
           keep: int = DEFAULT_KEEP, dry_run: bool = False, canary: int = 0,
           smoke_fn: Callable[[Fleet], list[HostResult]] | None = None,
           hooks: Hooks | None = None, service: ServiceSpec | None = None,
           gate_timeout: float = svc.GATE_TIMEOUT_S) -> list[HostResult]:
    """Deploy to every host of the fleet (see deploy_host), as one rollout: the first
    ``canary`` hosts, smoke-tested with ``smoke_fn`` (a canary that fails goes back to its
    previous release, and nothing else starts), then the rest, no host starting once the
    fleet's ``max_failures`` hosts failed. ``service``: the unit to install and restart
    (``profile.service`` from the task unless --no-service); None: files only. ``profile``,
    when given, must be the one ``art`` was prepared from (the same hash): refused otherwise."""
    if profile is not None and profile.hash != art.profile.hash:
        raise FleetError(f"release {art.release_id} was prepared from profile {art.profile.name} "
                         f"{art.profile.short_hash}, not from {profile.name} {profile.short_hash}: "
                         f"prepare it from the profile you deploy")
    if keep < 1:
        raise FleetError(f"--keep must be at least 1 (got {keep})")
    if dry_run:
        def plan(remote: Remote, host: Host) -> HostResult:
            steps = plan_host(remote, host, art, service)
            return HostResult(host=host.name, release=art.release_id,
                              model=art.model_sha[:12] if art.model_sha else "-",
                              result=HostState.PLANNED, detail="; ".join(steps))
        return host_results(fleet.run(plan), art.release_id)

    hooks = hooks or Hooks(progress=_Progress())

    def one(remote: Remote, host: Host) -> HostResult:
        return deploy_host(remote, host, art, keep=keep, hooks=hooks, service=service,
                           gate_timeout=gate_timeout)

    def smoke_canaries(done: list[Outcome[HostResult]]) -> list[Outcome[HostResult]]:
        if smoke_fn is None or not all(o.ok and o.value is not None and o.value.ok for o in done):
            return done
        first = [h for h in fleet.hosts if h.name in {o.host for o in done}]
        smoked = {r.host: r for r in smoke_fn(fleet.only(first))}
        bad = [h for h in first if h.name in smoked and not smoked[h.name].ok]
        if not bad:
            return done
        # A canary that fails its smoke test goes back to what it ran before.
        previous = {o.host: o.value.previous for o in done if o.value is not None}
        back = {r.host: r for r in host_results(fleet.run(_undo(previous, service, gate_timeout),
                                                          hosts=bad))}
        for o in done:
            if o.host in back and o.value is not None:
                o.value.result = HostState.FAILED
                o.value.detail = (f"canary smoke test failed: {smoked[o.host].detail}; "
                                  f"{back[o.host].detail}")
        return done

    plan_ = Rollout(canary=max(0, canary), max_failures=fleet.max_failures, hint="--max-failures")
    return host_results(fleet.rollout(one, plan_, after_canary=smoke_canaries), art.release_id)


def rollback(fleet: Fleet, to: str | None = None) -> list[HostResult]:
    """Switch ``current`` back to the previous release (or ``to``) on every host."""
    def one(remote: Remote, host: Host) -> HostResult:
        before, after = rel.rollback(remote, host.root, to)
        return HostResult(host=host.name, release=after, result=HostState.OK, previous=before,
                          detail=f"was {before or '(none)'}")
    return host_results(fleet.run(one))


def _undo(previous: dict[str, str | None], service: ServiceSpec | None = None,
          gate_timeout: float = svc.GATE_TIMEOUT_S) -> Callable[[Remote, Host], HostResult]:
    """Put each host back on ``previous[host]`` (the release it ran before this deploy)."""
    def one(remote: Remote, host: Host) -> HostResult:
        prev = previous.get(host.name)
        if not prev:
            return HostResult(host=host.name, result=HostState.FAILED,
                              detail="no previous release to go back to")
        rel.rollback(remote, host.root, to=prev)
        detail = f"rolled back to {prev}"
        if service is not None and svc.systemd_running(remote):
            gate, _ = svc.restart_and_gate(remote, service.with_root(host.root), timeout=gate_timeout)
            detail += f", service {gate.state}"
            if not gate.ok:
                return HostResult(host=host.name, release=prev, result=HostState.FAILED,
                                  detail=f"{detail}: {gate.detail}")
        return HostResult(host=host.name, release=prev, result=HostState.OK, detail=detail)
    return one


def results_table(results: list[HostResult], extra_cols: list[str] | None = None) -> str:
    cols = extra_cols or []
    rows = [["host", "release", "model", "result", "time", *cols, "detail"]]
    for r in results:
        rows.append([r.host, r.release, r.model, str(r.result), f"{r.seconds:.1f}s",
                     *(r.column(c) for c in cols), r.detail])
    return table(rows)
