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
import inspect
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


HELP_TOKENS = ("-h", "--help")


class KitTask(Task):
    """An Invoke task whose short flags come from ``SHORT_FLAGS`` only, and that answers ``-h`` /
    ``--help`` even where a positional argument is still missing (Invoke's parser hands that
    token to the positional argument: ``invoke deploy -h`` used to say "target name '-h' is not
    valid")."""

    def __init__(self, body: Callable[..., Any], **kwargs: Any) -> None:
        super().__init__(body, **kwargs)
        self._help_text = dict(self.help)   # get_arguments() consumes self.help

    def arg_opts(self, name: str, default: str, taken_names: set[str]) -> dict[str, Any]:
        opts = super().arg_opts(name, default, taken_names)
        short = SHORT_FLAGS.get(name)
        if short and short not in taken_names and short not in RESERVED:
            opts["names"].append(short)
        return opts

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        given = [*args[1:], *(kwargs.get(p) for p in self.positional)]
        if any(isinstance(v, str) and v in HELP_TOKENS for v in given):
            self.print_help()
            raise Exit(code=0)
        return super().__call__(*args, **kwargs)

    def print_help(self) -> None:
        """What ``invoke --help NAME`` prints (Invoke's own layout)."""
        from invoke import Program
        from invoke.parser import ParserContext

        name = self.name.replace("_", "-")     # as Collection names it (auto_dash_names)
        saved, self.help = self.help, dict(self._help_text)
        try:
            ctx = ParserContext(name=name, args=self.get_arguments())
        finally:
            self.help = saved
        program = Program()
        tuples = ctx.help_tuples()
        print(f"Usage: invoke [--core-opts] {name} {'[--options] ' if tuples else ''}"
              f"[other tasks here ...]\n")
        print("Docstring:")
        for line in (inspect.getdoc(self.body) or "none").splitlines():
            print(program.leading_indent + line if line.strip() else "")
        print("\nOptions:")
        program.print_columns(tuples) if tuples else print(program.leading_indent + "none")


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
