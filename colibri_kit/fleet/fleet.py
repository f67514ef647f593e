"""One fleet object: which hosts, how to reach them, how many at once, how many failures to bear.

deploy, smoke, status, rollback and tune all fan out through ``Fleet.run``: ``fn(remote, host)``
on every selected host, at most ``parallel`` at a time (Fabric's ThreadingGroup starts one thread
per host with no bound), each host's failure recorded in its ``Outcome`` instead of stopping the
others, and once ``max_failures`` hosts have failed the hosts not yet started are skipped.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Callable, Generic, Iterable, TypeVar

from colibri_kit.errors import FleetError, KitError
from colibri_kit.fleet.inventory import Host, Inventory
from colibri_kit.fleet.remote import Remote

DEFAULT_PARALLEL = 8   # connections at once
DEFAULT_KEEP = 3       # releases kept per device

T = TypeVar("T")
R = TypeVar("R")

Connector = Callable[[Host], "AbstractContextManager[Remote]"]


@dataclass
class Outcome(Generic[T]):
    """What happened on one host: a value, or the error that stopped it, or skipped."""

    host: str
    value: T | None = None
    error: str | None = None
    skipped: bool = False
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None and not self.skipped


@dataclass
class Results(Generic[T]):
    outcomes: list[Outcome[T]] = field(default_factory=list)

    @property
    def succeeded(self) -> list[Outcome[T]]:
        return [o for o in self.outcomes if o.ok]

    @property
    def failed(self) -> list[Outcome[T]]:
        return [o for o in self.outcomes if o.error is not None]

    @property
    def skipped(self) -> list[Outcome[T]]:
        return [o for o in self.outcomes if o.skipped]

    @property
    def ok(self) -> bool:
        return all(o.ok for o in self.outcomes)

    def __iter__(self):
        return iter(self.outcomes)

    def __len__(self) -> int:
        return len(self.outcomes)


def for_each(items: Iterable[T], fn: Callable[[T], R], parallel: int = DEFAULT_PARALLEL) -> list[R]:
    """fn on every item with at most ``parallel`` at a time; results in input order. fn catches
    its own per-item failures."""
    items = list(items)
    if parallel < 1:
        raise FleetError(f"--parallel must be at least 1 (got {parallel})")
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=min(parallel, len(items))) as pool:
        return list(pool.map(fn, items))


def ssh_connector(inventory: Inventory, accept_new: bool = False) -> Connector:
    from colibri_kit.fleet.connect import SSHRemote

    def connect(host: Host) -> SSHRemote:
        return SSHRemote(host, known_hosts=inventory.known_hosts,
                         identity_file=inventory.identity_file, accept_new=accept_new)
    return connect


@dataclass
class Fleet:
    """Selected hosts plus the policy to act on them. ``connect`` makes a Remote for a host (a
    context manager): SSH by default, a LocalRemote in the in-process tests."""

    hosts: list[Host]
    connect: Connector
    parallel: int = DEFAULT_PARALLEL
    max_failures: int | None = None

    @classmethod
    def select(cls, inventory: Inventory, *, hosts: str | None = None, group: str | None = None,
               target: str | None = None, tags: str | None = None, accept_new: bool = False,
               parallel: int = DEFAULT_PARALLEL, max_failures: int | None = None) -> "Fleet":
        chosen = inventory.select(hosts=hosts or None, group=group or None,
                                  target=target or None, tags=tags or None)
        return cls(chosen, ssh_connector(inventory, accept_new), parallel, max_failures)

    def only(self, hosts: list[Host]) -> "Fleet":
        return Fleet(hosts, self.connect, self.parallel, self.max_failures)

    def run(self, fn: Callable[[Remote, Host], T], *, hosts: list[Host] | None = None,
            max_failures: int | None = None) -> Results[T]:
        budget = self.max_failures if max_failures is None else max_failures
        failures = 0
        lock = threading.Lock()

        def one(host: Host) -> Outcome[T]:
            nonlocal failures
            with lock:
                if budget is not None and failures >= budget:
                    return Outcome(host.name, skipped=True)
            start = time.monotonic()
            out: Outcome[T] = Outcome(host.name)
            try:
                with self.connect(host) as remote:
                    out.value = fn(remote, host)
            except KitError as exc:
                out.error = str(exc)
            except Exception as exc:  # noqa: BLE001 - a bug on one host must not stop the fleet
                out.error = f"{type(exc).__name__}: {exc}"
            out.seconds = time.monotonic() - start
            if out.error is not None:
                with lock:
                    failures += 1
            return out

        return Results(for_each(hosts if hosts is not None else self.hosts, one, self.parallel))
