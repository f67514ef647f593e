"""One fleet object: which hosts, how to reach them, how many at once, how many failures to bear.

deploy, smoke, status, rollback and tune all fan out through ``Fleet.run``: ``fn(remote, host)``
on every selected host, at most ``parallel`` at a time (Fabric's ThreadingGroup starts one thread
per host with no bound), each host's failure recorded in its ``Outcome`` instead of stopping the
others, and once ``max_failures`` hosts have failed the hosts not yet started are skipped.

A change that must not hit every host at once goes through ``Fleet.rollout`` with a ``Rollout``
(canary wave, batch size, stop rule): deploy's ``--canary``/``--max-failures`` and tune's rolling
reboots (one canary, then ``--max-unavailable`` at a time, the first device that fails or does
not come back stops it) are the same loop.
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
    """What happened on one host: a value, or the error that stopped it, or skipped (and why)."""

    host: str
    value: T | None = None
    error: str | None = None
    skipped: bool = False
    seconds: float = 0.0
    why: str = ""                # why it was skipped: "not started: ..."

    @property
    def ok(self) -> bool:
        return self.error is None and not self.skipped


def succeeded(outcome: Outcome) -> bool:
    """The default success rule of a rollout: no error, not skipped, and a value that does not
    say it failed (a value with an ``ok`` attribute, e.g. a deploy or tune report, decides)."""
    return outcome.ok and bool(getattr(outcome.value, "ok", True))


@dataclass
class Results(Generic[T]):
    outcomes: list[Outcome[T]] = field(default_factory=list)
    stopped_after: str | None = None     # the host whose failure stopped the rollout

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


class Budget:
    """Failures counted over every wave of one rollout: once ``limit`` hosts failed, no host
    starts (those not started are skipped, saying after which host the rollout stopped)."""

    def __init__(self, limit: int | None, hint: str = "") -> None:
        if limit is not None and limit < 0:
            raise FleetError(f"--max-failures must be 0 or more (got {limit})")
        self.limit = limit
        self.hint = hint
        self.failed: list[str] = []
        self._lock = threading.Lock()

    @property
    def spent(self) -> bool:
        with self._lock:
            return self.limit is not None and len(self.failed) >= self.limit

    def fail(self, host: str) -> None:
        with self._lock:
            self.failed.append(host)

    @property
    def stopped_after(self) -> str | None:
        with self._lock:
            if self.limit is None or len(self.failed) < self.limit:
                return None
            return self.failed[self.limit - 1] if self.limit else None

    def why(self) -> str:
        after = self.stopped_after
        what = f"the rollout stopped after {after}" if after else "the failure budget is 0"
        return f"not started: {what}" + (f" ({self.hint})" if self.hint else "")


@dataclass(frozen=True)
class Rollout:
    """How a change goes over the hosts, the same for deploy and tune: a canary wave first (all
    of it must succeed, or nothing else starts), then waves of ``batch`` hosts (None: the rest
    in one wave, ``parallel`` connections at a time), and the stop rule: once ``max_failures``
    hosts failed, no host starts (None: every host is tried). ``hint`` names the setting in the
    "not started" note (e.g. ``--max-failures``)."""

    canary: int = 0
    batch: int | None = None
    max_failures: int | None = None
    hint: str = ""

    def waves(self, hosts: list[Host]) -> list[list[Host]]:
        if self.canary < 0:
            raise FleetError(f"--canary must be 0 or more (got {self.canary})")
        if self.batch is not None and self.batch < 1:
            raise FleetError(f"the batch size must be at least 1 (got {self.batch})")
        first, rest = hosts[:self.canary], hosts[self.canary:]
        size = self.batch or max(1, len(rest))
        return [w for w in [first] + [rest[i:i + size] for i in range(0, len(rest), size)] if w]


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
        """``fn(remote, host)`` on every host (one wave), the fleet's failure budget applying
        (``max_failures`` overrides it)."""
        budget = Budget(self.max_failures if max_failures is None else max_failures)
        chosen = hosts if hosts is not None else self.hosts
        return Results(self._wave(fn, chosen, budget, succeeded), budget.stopped_after)

    def rollout(self, fn: Callable[[Remote, Host], T], plan: Rollout, *,
                hosts: list[Host] | None = None,
                ok: Callable[[Outcome[T]], bool] = succeeded,
                after_canary: Callable[[list[Outcome[T]]], list[Outcome[T]]] | None = None,
                budget: Budget | None = None) -> Results[T]:
        """``fn`` over the hosts wave by wave (``plan``). ``after_canary`` may check the canary
        wave further (deploy smoke-tests it and undoes a canary that fails) and returns its
        outcomes as they stand then. ``ok`` decides what counts as a failure. ``budget``: a
        budget shared with an earlier phase of the same run (default: ``plan.max_failures``)."""
        budget = budget or Budget(plan.max_failures, plan.hint)
        chosen = hosts if hosts is not None else self.hosts
        out: list[Outcome[T]] = []
        stop_why = ""
        for i, wave in enumerate(plan.waves(chosen)):
            if not stop_why and budget.spent:
                stop_why = budget.why()
            if stop_why:
                out += [Outcome(h.name, skipped=True, why=stop_why) for h in wave]
                continue
            done = self._wave(fn, wave, budget, ok)
            if i == 0 and plan.canary:
                if after_canary is not None:
                    done = after_canary(done)
                bad = [o.host for o in done if not ok(o)]
                if bad:
                    stop_why = f"not started: the canary failed ({', '.join(bad)})"
            out += done
        return Results(out, budget.stopped_after)

    def _wave(self, fn: Callable[[Remote, Host], T], hosts: list[Host], budget: Budget,
              ok: Callable[[Outcome[T]], bool]) -> list[Outcome[T]]:
        def one(host: Host) -> Outcome[T]:
            if budget.spent:
                return Outcome(host.name, skipped=True, why=budget.why())
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
            if not ok(out):
                budget.fail(host.name)
            return out

        return for_each(hosts, one, self.parallel)
