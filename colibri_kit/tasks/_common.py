"""Helpers shared by task modules: one table of short flags, KitError as a clean exit.

Short flags. Invoke gives each option the first free letter of its name, so the same letter
meant different options in different tasks (``-h`` was ``--hosts`` or ``--hf-dir`` instead of
help, ``--target`` was ``-a`` on rollback where ``-t`` meant ``--to``). Every kit task is made
with ``kit_task`` instead: an option gets a short flag only from ``SHORT_FLAGS``, so a letter
means one option everywhere and ``-h`` is always ``--help``. tests/test_task_flags.py walks every
task and checks it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from invoke import Task, task
from invoke.exceptions import Exit

from colibri_kit.errors import KitError

# option (as the task function spells it) -> its one-letter flag, the same in every task.
# Not here: "h" (help), and the letters of one-letter options (logs -n, gpucheck -k).
SHORT_FLAGS = {
    "target": "t",
    "fleet": "f",
    "hosts": "H",        # as Fabric's own `fab -H`
    "group": "g",
    "parallel": "p",
    "json": "j",
    "model": "m",
    "out": "o",
    "dtype": "d",
    "count": "c",
    "show": "s",
    "restore": "r",
    "list": "l",
    "all": "a",
    "bench": "b",
    "in_": "i",
}
RESERVED = {"h"}   # invoke's --help


class KitTask(Task):
    """An Invoke task whose short flags come from ``SHORT_FLAGS`` only."""

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(name)
        if short and short not in taken_names and short not in RESERVED:
            opts["names"].append(short)
        return opts


def kit_task(*args: Any, **kwargs: Any) -> Any:
    """``invoke.task`` for the kit: ``@kit_task(help={...})`` or ``@kit_task``."""
    return task(*args, klass=KitTask, auto_shortflags=False, **kwargs)


def user_errors(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Print a KitError as one actionable message and exit 1, without a traceback."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except KitError as exc:
            raise Exit(f"error: {exc}", code=1) from None

    return wrapper
