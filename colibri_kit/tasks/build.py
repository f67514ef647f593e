"""Tasks for toolchains and builds: install/report pinned toolchains, build targets into dist/."""

from __future__ import annotations

from invoke import Context

from colibri_kit import build as kit_build
from colibri_kit import profiles, toolchain
from colibri_kit.errors import BuildError, KitError
from colibri_kit.paths import project_root
from colibri_kit.report import table
from colibri_kit.tasks._common import kit_task, user_errors


def _say(target: str):
    return lambda msg: print(f"[{target}] {msg}", flush=True)


def _archs(text: str) -> list[str] | None:
    return [a.strip() for a in text.split(",") if a.strip()] or None


@kit_task(name="toolchain", help={
    "target": "profile name: install its pinned toolchain (zig, CUDA wheels) and print versions",
    "list": "show the toolchain sets in the cache and their sizes",
})
@user_errors
def toolchain_task(c: Context, target: str = "", list: bool = False) -> None:  # noqa: A002
    """Install a target's pinned toolchain (--target NAME) or list the cache (--list)."""
    if not target and not list:
        raise BuildError("give --target NAME (install + report versions) or --list")
    if target:
        versions = toolchain.install_for_profile(profiles.load_profile(target), _say(target))
        width = max(len(k) for k in versions)
        for key, value in versions.items():
            print(f"{key:{width}}  {value}")
    if list:
        sets = toolchain.cached_sets()
        print(f"toolchain cache: {toolchain.toolchains_dir()}")
        if not sets:
            print("  (empty: `invoke toolchain --target NAME` installs one)")
        for s in sets:
            print(f"  {s.name:14} {s.size_bytes / 2**20:8.1f} MiB  {' '.join(s.packages)}")
        total = sum(s.size_bytes for s in sets)
        print(f"  {'total':14} {total / 2**20:8.1f} MiB")


@kit_task(name="build", help={
    "target": "profile name from targets/ (see `invoke targets`)",
    "all": "build every target and print a summary table",
    "in": "where to build: auto (docker when an engine answers), host or docker",
    "debug": "-O0 -g -DCOLIBRI_DEBUG into build/TARGET/out-debug and dist/TARGET-debug",
    "cuda-archs": "device code for a profile without CUDA (host), e.g. sm_90 or sm_87,sm_90",
    "cuda-version": "CUDA version for --cuda-archs (default 12.6)",
    "nvcc": "use this system nvcc instead of the pinned CUDA wheels (version must match)",
    "jobs": "parallel make jobs (default 2)",
})
@user_errors
def build_task(c: Context, target: str = "", all: bool = False, in_: str = "auto",  # noqa: A002
               debug: bool = False, cuda_archs: str = "", cuda_version: str = "",
               nvcc: str = "", jobs: int = 2) -> None:
    """Cross-compile the runtime for a target into dist/TARGET/ and verify it."""
    if all == bool(target):
        raise BuildError("give exactly one of --target NAME or --all")
    if not all:
        r = kit_build.build(profiles.load_profile(target), where=in_, debug=debug, cuda_archs=_archs(cuda_archs),
                            cuda_version=cuda_version or None, nvcc=nvcc or None, jobs=jobs,
                            progress=_say(target))
        print(f"built {r.dist_dir.relative_to(project_root())}/ in {r.seconds:.1f} s ({r.where})")
        return
    names = profiles.list_profiles()
    results = []
    for name in names:
        try:
            r = kit_build.build(profiles.load_profile(name), where=in_, debug=debug, jobs=jobs,
                                progress=_say(name))
            m = r.manifest
            sms = ",".join(f"sm_{s}" for s in m.sms or []) or "-"
            results.append([name, "ok", m.arch or "?", m.glibc_floor or "?", sms,
                            str(m.files["bin/colibri"].size), f"{r.seconds:.1f}"])
        except KitError as exc:
            results.append([name, "FAILED", "", "", "", "", str(exc).splitlines()[0][:60]])
    rows = [["target", "status", "arch", "glibc", "sms", "bin bytes", "seconds / error"], *results]
    print(table(rows))
    failed = [r[0] for r in results if r[1] != "ok"]
    if failed:
        raise BuildError(f"{len(failed)} target(s) failed: {', '.join(failed)}")


TASKS = [toolchain_task, build_task]
