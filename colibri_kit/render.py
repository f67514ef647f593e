"""Render a target profile into the runtime's ``colibri_config.h`` (Jinja2, deterministic).

The header is the only place the runtime's compile-time configuration comes from. Rendering is
a pure function of the profile: no timestamps, no absolute paths, so identical profiles give
identical bytes, and ``write_config`` leaves an unchanged file untouched (make stays
incremental).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import jinja2

from colibri_kit import paths
from colibri_kit.errors import ProfileError
from colibri_kit.profiles import Profile

TEMPLATE = "colibri_config.h.j2"
HEADER = "colibri_config.h"

_ROUTING_MACROS = {
    "softmax_topk": "COLIBRI_ROUTING_SOFTMAX_TOPK",
    "linear_score": "COLIBRI_ROUTING_LINEAR_SCORE",
}


def _environment(templates_dir: Path) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,   # a typo in the template is an error, not ""
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def render_config(profile: Profile, templates_dir: Path | None = None) -> str:
    """The text of ``colibri_config.h`` for ``profile``."""
    tdir = Path(templates_dir) if templates_dir else paths.templates_dir()
    try:
        template = _environment(tdir).get_template(TEMPLATE)
        return template.render(
            p=profile,
            routing_macro=_ROUTING_MACROS[profile.colibri.routing_mode],
            source=f"targets/{profile.name}.yaml",
        )
    except jinja2.TemplateNotFound:
        raise ProfileError(f"{tdir / TEMPLATE}: template not found") from None
    except jinja2.UndefinedError as exc:
        raise ProfileError(f"{tdir / TEMPLATE}: {exc.message}") from None


def config_path(profile: Profile, out_dir: Path | None = None) -> Path:
    """Where the header goes: ``build/<name>/include/colibri_config.h`` by default."""
    base = Path(out_dir) if out_dir else paths.build_dir(profile.name) / "include"
    return base / HEADER


def write_config(profile: Profile, out_dir: Path | None = None,
                 templates_dir: Path | None = None) -> Path:
    """Write the header into ``out_dir`` (default ``build/<name>/include``); return its path.

    The file is rewritten only when its content changes, atomically (temp file + rename), so
    a make-driven build sees an unchanged mtime and recompiles nothing.
    """
    text = render_config(profile, templates_dir).encode("utf-8")
    dest = config_path(profile, out_dir)
    try:
        if dest.is_file() and dest.read_bytes() == text:
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".colibri_config.", dir=dest.parent)
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(text)
            os.chmod(tmp, 0o644)
            os.replace(tmp, dest)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise ProfileError(f"cannot write {dest}: {exc.strerror}") from None
    return dest
