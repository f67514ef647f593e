"""Helpers shared by task modules: turn KitError into a clean exit."""

from __future__ import annotations

import functools
from typing import Any, Callable

from invoke.exceptions import Exit

from colibri_kit.errors import KitError


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print a KitError as one actionable message and exit 1, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KitError as exc:
            raise Exit(f"error: {exc}", code=1) from None

    return wrapper
