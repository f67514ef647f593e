"""Invoke task modules, one per concern, assembled into one namespace for tasks.py.

Each module exposes ``TASKS`` (top-level tasks) and may expose ``COLLECTIONS``
(a mapping of sub-collection name -> list of tasks, e.g. ``sim.up``).
"""

from __future__ import annotations

import importlib

from invoke import Collection

# Order is the order `invoke --list` groups them in.
MODULES = ("profiles", "build", "model", "fleet", "tune", "sim", "gpu", "dev", "package")


def namespace() -> Collection:
    ns = Collection()
    for name in MODULES:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as exc:  # a concern not written yet
            if exc.name == f"{__name__}.{name}":
                continue
            raise
        for task in getattr(mod, "TASKS", ()):
            ns.add_task(task)
        for coll_name, tasks in getattr(mod, "COLLECTIONS", {}).items():
            sub = Collection(coll_name)
            for task in tasks:
                sub.add_task(task)
            ns.add_collection(sub)
    return ns
