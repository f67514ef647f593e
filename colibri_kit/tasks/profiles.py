"""Tasks for target profiles: list them, show one resolved, render its config header."""

from __future__ import annotations

from invoke import Context, task

from colibri_kit import profiles, render
from colibri_kit.paths import project_root
from colibri_kit.tasks._common import user_errors


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


@task(help={"show": "print the resolved profile NAME (after `extends`) as YAML, with its hash"})
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
    print(_table(rows))


@task(name="render", help={"target": "profile name from targets/ (see `invoke targets`)"})
@user_errors
def render_header(c: Context, target: str) -> None:  # `invoke render`; avoids the module name
    """Render build/TARGET/include/colibri_config.h from the target profile."""
    path = render.write_config(profiles.load_profile(target))
    try:
        shown = path.relative_to(project_root())
    except ValueError:
        shown = path
    print(f"rendered {shown}")


TASKS = [targets, render_header]
