"""Tasks for target profiles: list them, show one resolved, render its config header."""

from __future__ import annotations

from invoke import Context

import json as jsonlib
from pathlib import Path

from colibri_kit import profiles, render, verify as verify_mod
from colibri_kit.paths import dist_dir, project_root
from colibri_kit.report import table
from colibri_kit.tasks._common import kit_task, user_errors


@kit_task(help={"show": "print the resolved profile NAME (after `extends`) as YAML, with its hash"})
@user_errors
def targets(c: Context, show: str = "") -> None:
    """List the target profiles (or show one resolved with --show NAME)."""
    if show:
        print(profiles.profile_yaml(profiles.load_profile(show)), end="")
        return
    rows = [["name", "arch", "jetpack/l4t", "cuda", "sms", "glibc", "description"]]
    for p in profiles.load_all():
        rows.append([
            p.name, p.arch,
            f"{p.jetpack}/{p.l4t}" if p.jetpack else "-",
            p.cuda.version if p.cuda else "-",
            ",".join(p.sms) or "-",
            p.glibc, p.description,
        ])
    print(table(rows))


@kit_task(name="render", help={"target": "profile name from targets/ (see `invoke targets`)"})
@user_errors
def render_header(c: Context, target: str) -> None:  # `invoke render`; avoids the module name
    """Render build/TARGET/include/colibri_config.h from the target profile."""
    path = render.write_config(profiles.load_profile(target))
    try:
        shown = path.relative_to(project_root())
    except ValueError:
        shown = path
    print(f"rendered {shown}")


@kit_task(name="verify", help={
    "target": "profile name the build must match",
    "dist": "directory to check (default dist/TARGET)",
    "run": "run bin/colibri --version (under qemu for another arch); --no-run skips it",
    "json": "print the report as JSON instead of lines",
})
@user_errors
def verify_task(c: Context, target: str, dist: str = "", run: bool = True,
                json: bool = False) -> None:  # noqa: A002
    """Check a build against its profile: ELF machine, glibc floor, cubin SMs, PTX, --version."""
    profile = profiles.load_profile(target)
    where = Path(dist) if dist else dist_dir(target)
    try:
        report = verify_mod.verify_build(profile, where, run=run)
    except verify_mod.VerifyError as exc:
        if json and exc.report is not None:
            print(jsonlib.dumps(exc.report.to_dict(), indent=2))
        raise
    print(jsonlib.dumps(report.to_dict(), indent=2) if json else report.format())


TASKS = [targets, render_header, verify_task]
