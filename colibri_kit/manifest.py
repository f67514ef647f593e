"""``manifest.json``: what a build made, the one record build, verify and deploy agree on.

``invoke build`` writes it into ``dist/<target>/`` (``Manifest.to_bytes``: sorted keys, stable
bytes, so two identical builds give identical manifests); ``verify`` checks it against the
profile and the files; ``deploy`` reads it once (``Manifest.load``), refuses a dist built from
another profile than the one it loaded (``check_built_from``: both hashes and the command that
rebuilds), uploads exactly the files it lists and derives the release id from its bytes.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from colibri_kit.errors import KitError

if TYPE_CHECKING:
    from colibri_kit.profiles import Profile

MANIFEST_NAME = "manifest.json"
SHA256_RE = re.compile(r"[0-9a-f]{64}")


class ManifestError(KitError):
    """A manifest is missing, malformed, lists an unsafe path, or was built from another profile."""


@dataclass(frozen=True)
class FileEntry:
    sha256: str
    size: int | None = None      # every manifest invoke build writes has it


@dataclass(frozen=True)
class Manifest:
    """A build's record. ``raw`` is the exact bytes it was read from (or is written as): the
    release id and the device's ``release.json`` hash those bytes, not a re-serialisation."""

    target: str
    files: dict[str, FileEntry]
    profile_hash: str | None = None
    glibc_floor: str | None = None
    arch: str | None = None
    variant: str | None = None
    source_revision: str | None = None
    toolchain: dict[str, Any] = field(default_factory=dict)
    cuda: dict[str, Any] | None = None
    kernels: dict[str, Any] | None = None
    raw: bytes = field(default=b"", repr=False, compare=False)

    # ------------------------------------------------------------------ reading and writing

    @classmethod
    def parse(cls, data: bytes, where: str = MANIFEST_NAME) -> "Manifest":
        """A manifest from its bytes; ManifestError naming ``where`` when it is not one."""
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ManifestError(f"{where} is not readable JSON ({exc}): rebuild with "
                                f"invoke build") from None
        if not isinstance(doc, dict):
            raise ManifestError(f"{where} is not a JSON object: rebuild with invoke build")
        target = doc.get("target")
        if not isinstance(target, str) or not target:
            raise ManifestError(f"{where} names no target: rebuild with invoke build")
        raw_files = doc.get("files")
        if not isinstance(raw_files, dict) or not raw_files:
            raise ManifestError(f"{where} has no 'files' map (rebuild with invoke build "
                                f"--target {target})")
        files = {}
        for rel, spec in raw_files.items():
            if not isinstance(rel, str) or not safe_relpath(rel):
                raise ManifestError(f"{where} lists an unsafe path {rel!r}")
            sha = spec.get("sha256") if isinstance(spec, dict) else spec
            size = spec.get("size") if isinstance(spec, dict) else None
            if not isinstance(sha, str) or not SHA256_RE.fullmatch(sha):
                raise ManifestError(f"{where}: {rel} has no valid sha256 ({sha!r})")
            if size is not None and (isinstance(size, bool) or not isinstance(size, int)
                                     or size < 0):
                raise ManifestError(f"{where}: {rel} has an invalid size ({size!r})")
            files[rel] = FileEntry(sha, size)

        def text(key: str) -> str | None:
            value = doc.get(key)
            return None if value is None else str(value)

        cuda = doc.get("cuda")
        kernels = doc.get("kernels")
        toolchain = doc.get("toolchain")
        return cls(target=target, files=files, profile_hash=text("profile_hash"),
                   glibc_floor=text("glibc_floor"), arch=text("arch"), variant=text("variant"),
                   source_revision=text("source_revision"),
                   toolchain=toolchain if isinstance(toolchain, dict) else {},
                   cuda=cuda if isinstance(cuda, dict) else None,
                   kernels=kernels if isinstance(kernels, dict) else None, raw=bytes(data))

    @classmethod
    def load(cls, dist: Path) -> "Manifest":
        path = Path(dist) / MANIFEST_NAME
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ManifestError(f"{dist} has no {MANIFEST_NAME}: build it first (invoke build "
                                f"--target NAME)") from None
        except OSError as exc:
            raise ManifestError(f"cannot read {path}: {exc.strerror}") from None
        return cls.parse(data, str(path))

    def to_bytes(self) -> bytes:
        """The bytes ``invoke build`` writes: sorted keys, two-space indent, a final newline."""
        doc = {
            "target": self.target, "variant": self.variant, "arch": self.arch,
            "glibc_floor": self.glibc_floor, "profile_hash": self.profile_hash,
            "source_revision": self.source_revision, "toolchain": self.toolchain,
            "cuda": self.cuda, "kernels": self.kernels,
            "files": {rel: {"sha256": f.sha256, "size": f.size}
                      for rel, f in sorted(self.files.items())},
        }
        return (json.dumps(doc, indent=2, sort_keys=True) + "\n").encode()

    def with_raw(self) -> "Manifest":
        """This manifest carrying its own serialisation as ``raw`` (after ``to_bytes``)."""
        return replace(self, raw=self.to_bytes())

    # ------------------------------------------------------------------ questions

    def hashes(self) -> dict[str, str]:
        """relative path -> sha256, for every file the build made."""
        return {rel: f.sha256 for rel, f in self.files.items()}

    @property
    def sms(self) -> list[int] | None:
        """The SMs of the embedded cubins (None: no CUDA section or one without a list)."""
        if not self.cuda or not isinstance(self.cuda.get("sms"), list):
            return None
        return sorted(self.cuda["sms"])

    def profile_problems(self, profile: "Profile") -> list[str]:
        """What in this manifest disagrees with ``profile`` (verify's manifest check)."""
        problems = []
        for key, got, want in (("target", self.target, profile.name),
                               ("glibc_floor", self.glibc_floor, profile.glibc),
                               ("profile_hash", self.profile_hash, profile.hash)):
            if got != want:
                problems.append(f"{key} is {got!r}, profile has {want!r}")
        if profile.cuda is None and self.cuda:
            problems.append("lists CUDA images but the profile has no CUDA")
        elif profile.cuda is not None and self.sms != sorted(profile.cuda.sm_numbers):
            problems.append(f"cuda.sms is {self.sms}, profile has {list(profile.cuda.sm_numbers)}")
        if "bin/colibri" not in self.files:
            problems.append("files does not list bin/colibri")
        return problems

    def check_built_from(self, profile: "Profile", where: str) -> None:
        """Refuse a dist that was not built from ``profile`` (its target, its hash): deploying
        it would ship a binary whose compiled-in settings differ from what the kit checks."""
        rebuild = f"invoke build --target {profile.name}"
        if self.target != profile.name:
            raise ManifestError(f"{where} is for target {self.target}, not {profile.name}: "
                                f"deploy dist/{self.target}/ with --target {self.target}, or "
                                f"rebuild: {rebuild}")
        if self.profile_hash is None:
            raise ManifestError(f"{where} records no profile hash (not written by invoke "
                                f"build): rebuild it: {rebuild}")
        if self.profile_hash != profile.hash:
            raise ManifestError(
                f"{where} was built from profile {profile.name} with hash "
                f"{self.profile_hash[:12]}, but targets/{profile.name}.yaml now has hash "
                f"{profile.short_hash} ({profile.hash}): the profile changed since the build; "
                f"rebuild it: {rebuild}")


def safe_relpath(rel: str) -> bool:
    """A path inside the dist: relative, no ``..``, no empty or ``.`` parts, plain characters."""
    parts = rel.split("/")
    return (bool(rel) and not rel.startswith("/") and "\\" not in rel
            and all(p not in ("", ".", "..") for p in parts)
            and not any(ord(ch) < 0x20 or ch == "\x7f" for ch in rel))
