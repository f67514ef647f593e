"""Short flags are consistent across every task (issue 19): ``-h`` is help everywhere, a letter
means one option in every task that has it, an option has the same letter (or none) everywhere.
Before: ``invoke status -h`` took ``-h`` as ``--hosts``, ``invoke convert -h`` as ``--hf-dir``,
rollback's ``--target`` was ``-a`` while ``-t`` meant ``--to``, and ``invoke deploy -h`` said
"target name '-h' is not valid" (Invoke hands the token to a missing positional argument)."""

from __future__ import annotations

import contextlib
import io

import pytest
from invoke import Collection, Program

from colibri_kit.tasks import namespace


def every_task(coll: Collection, prefix: str = ""):
    for name, task in sorted(coll.tasks.items()):
        yield prefix + name, task
    for cname, sub in sorted(coll.collections.items()):
        yield from every_task(sub, f"{prefix}{cname}.")


TASKS = dict(every_task(namespace()))


def flags(task) -> dict[str, str]:
    """long option -> its one-letter flag ("" for none); a one-letter option is its own flag."""
    out = {}
    for arg in task.get_arguments():
        long = max(arg.names, key=len)
        shorts = [n for n in arg.names if len(n) == 1]
        out[long] = shorts[0] if shorts else ""
    return out


def test_every_task_was_read() -> None:
    assert {"deploy", "status", "convert", "rollback", "tune", "build", "sim.up"} <= set(TASKS)


def test_h_is_never_an_option_of_a_task() -> None:
    offenders = {name: long for name, task in TASKS.items()
                 for long, short in flags(task).items() if short == "h"}
    assert offenders == {}


def test_a_letter_means_one_option_and_an_option_has_one_letter_everywhere() -> None:
    letter_to_long: dict[str, set[str]] = {}
    long_to_letter: dict[str, set[str]] = {}
    for name, task in TASKS.items():
        for long, short in flags(task).items():
            long_to_letter.setdefault(long, set()).add(short)
            if short:
                letter_to_long.setdefault(short, set()).add(long)
    assert {k: v for k, v in letter_to_long.items() if len(v) > 1} == {}
    assert {k: v for k, v in long_to_letter.items() if len(v) > 1} == {}
    assert long_to_letter["target"] == {"t"} and "a" not in long_to_letter["target"]


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            Program(namespace=namespace(), binary="invoke").run(["invoke", *argv], exit=True)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return code, out.getvalue()


@pytest.mark.parametrize("name", sorted(TASKS))
def test_dash_h_prints_the_task_help_and_exits_0(name: str) -> None:
    code, out = run(name, "-h")
    assert code == 0 and out.startswith(f"Usage: invoke [--core-opts] {name} "), out[:500]
    assert "Options:" in out


def test_the_short_flags_reach_their_options(tmp_path) -> None:
    """-t is rollback's --target (it was -a), -H its --hosts: both reach the selection."""
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text("hosts: {cab-01: {address: 192.0.2.11, target: orin-nx}}\n")
    code, out = run("rollback", "-f", str(fleet), "-t", "xavier-nx")
    assert code == 1 and "the selection matches no host" in out, out
    code, out = run("rollback", "-f", str(fleet), "-H", "nope")
    assert code == 1 and "no host named nope" in out, out
