"""The fleet inventory (``fleet.yaml``): hosts, groups, tags, and how to select some of them.

No secrets live here: keys come from ssh-agent, ``~/.ssh/config`` or ``identity_file``; a sudo
password only from the environment. Every value that later reaches a remote shell, a path or an
SSH connection is validated here, and errors name the file and the key.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

import yaml

from colibri_kit.errors import FleetError

# Every value is checked with fullmatch: ``re.match`` with ``$`` also accepts one trailing
# newline ("cab-01\n" in a quoted YAML string), which would then reach a command line or a path.
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
# A DNS name, an IPv4 address or a bracket-free IPv6 address: letters, digits, '.', '-', ':'.
ADDRESS_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9.:-]{0,252}")
USER_RE = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
ROOT_RE = re.compile(r"/[A-Za-z0-9._/-]*")

DEFAULT_USER = "root"
DEFAULT_PORT = 22
DEFAULT_ROOT = "/opt/colibri"

HOST_KEYS = {"address", "port", "user", "target", "tags", "root"}
TOP_KEYS = {"defaults", "known_hosts", "identity_file", "hosts", "groups"}
DEFAULT_KEYS = {"user", "port", "root", "target"}


@dataclass(frozen=True)
class Host:
    name: str
    address: str
    port: int = DEFAULT_PORT
    user: str = DEFAULT_USER
    target: str | None = None
    tags: tuple[str, ...] = ()
    root: str = DEFAULT_ROOT


@dataclass(frozen=True)
class Inventory:
    path: Path
    hosts: dict[str, Host]
    groups: dict[str, tuple[str, ...]] = field(default_factory=dict)
    known_hosts: Path | None = None
    identity_file: Path | None = None

    def select(
        self,
        hosts: str | Iterable[str] | None = None,
        group: str | None = None,
        target: str | None = None,
        tags: str | Iterable[str] | None = None,
    ) -> list[Host]:
        """Hosts matching every given filter, in inventory order. No filter: every host."""
        chosen = list(self.hosts.values())
        if hosts:
            names = _split(hosts)
            unknown = [n for n in names if n not in self.hosts]
            if unknown:
                raise FleetError(
                    f"{self.path}: no host named {', '.join(unknown)} (known: {', '.join(self.hosts)})"
                )
            chosen = [h for h in chosen if h.name in names]
        if group:
            if group not in self.groups:
                raise FleetError(
                    f"{self.path}: no group {group!r} (known: {', '.join(self.groups) or 'none'})"
                )
            members = set(self.groups[group])
            chosen = [h for h in chosen if h.name in members]
        if target:
            chosen = [h for h in chosen if h.target == target]
        if tags:
            wanted = set(_split(tags))
            chosen = [h for h in chosen if wanted <= set(h.tags)]
        if not chosen:
            raise FleetError(f"{self.path}: the selection matches no host")
        return chosen


def _split(value: str | Iterable[str]) -> list[str]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return [s.strip() for s in items if s.strip()]


def validate_name(value: Any, what: str) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise FleetError(f"{what}: {value!r} is not a valid name (letters, digits, '.', '_', '-'; "
                         f"starts with a letter or digit; at most 64)")
    return value


def validate_address(value: Any, what: str) -> str:
    if not isinstance(value, str) or not ADDRESS_RE.fullmatch(value) or ".." in value:
        raise FleetError(f"{what}: {value!r} is not a host name or IP address")
    return value


def validate_user(value: Any, what: str) -> str:
    if not isinstance(value, str) or not USER_RE.fullmatch(value):
        raise FleetError(f"{what}: {value!r} is not a valid user name")
    return value


def validate_port(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise FleetError(f"{what}: {value!r} is not a port number (1-65535)")
    return value


def validate_root(value: Any, what: str) -> str:
    """An absolute, normalised path of plain characters: it is used in commands and as a prefix."""
    if (not isinstance(value, str) or not ROOT_RE.fullmatch(value) or value == "/"
            or posixpath.normpath(value) != value or "/../" in value + "/" or "/./" in value + "/"):
        raise FleetError(f"{what}: {value!r} must be an absolute, normalised path "
                         f"(letters, digits, '.', '_', '-', '/'), not '/'")
    return value


def _refuse_unknown_keys(where: str, mapping: dict, allowed: set[str]) -> None:
    """One message shape for every level of the file: where, the unknown keys, the allowed ones."""
    unknown = set(mapping) - allowed
    if unknown:
        raise FleetError(f"{where}: unknown key(s) {', '.join(sorted(map(str, unknown)))} "
                         f"(allowed: {', '.join(sorted(allowed))})")


def _refuse_duplicate_keys(path: Path, node: yaml.Node | None) -> None:
    """PyYAML keeps the last of two equal keys; in a fleet file that silently drops a host."""
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    raise FleetError(f"{path}: line {key.start_mark.line + 1}: duplicate key "
                                     f"{key.value!r}")
                seen.add(key.value)
            _refuse_duplicate_keys(path, value)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _refuse_duplicate_keys(path, item)


def load_inventory(path: str | Path) -> Inventory:
    path = Path(path).expanduser()
    if not path.exists():
        raise FleetError(f"fleet file {path} not found; write one (see docs/fleet.md) or pass "
                         f"--fleet PATH (the emulated fleet writes one: invoke sim.up)")
    try:
        text = path.read_text()
        _refuse_duplicate_keys(path, yaml.compose(text, Loader=yaml.SafeLoader))
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise FleetError(f"{path}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise FleetError(f"{path}: must be a mapping with a 'hosts' key")
    _refuse_unknown_keys(f"{path}", data, TOP_KEYS)

    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise FleetError(f"{path}: defaults must be a mapping")
    _refuse_unknown_keys(f"{path}: defaults", defaults, DEFAULT_KEYS)

    base = path.parent
    known_hosts = None
    if data.get("known_hosts") is not None:
        if not isinstance(data["known_hosts"], str):
            raise FleetError(f"{path}: known_hosts must be a path")
        known_hosts = (base / Path(data["known_hosts"]).expanduser()).resolve()
    identity_file = None
    if data.get("identity_file") is not None:
        if not isinstance(data["identity_file"], str):
            raise FleetError(f"{path}: identity_file must be a path")
        identity_file = (base / Path(data["identity_file"]).expanduser()).resolve()

    raw_hosts = data.get("hosts")
    if not isinstance(raw_hosts, dict) or not raw_hosts:
        raise FleetError(f"{path}: hosts must be a non-empty mapping of name -> settings")
    hosts: dict[str, Host] = {}
    for name, spec in raw_hosts.items():
        where = f"{path}: hosts.{name}"
        validate_name(name, f"{path}: hosts")
        if not isinstance(spec, dict):
            raise FleetError(f"{where}: must be a mapping with at least 'address'")
        _refuse_unknown_keys(where, spec, HOST_KEYS)
        merged = {**defaults, **spec}
        if "address" not in merged:
            raise FleetError(f"{where}: address is required")
        tags = merged.get("tags") or []
        if not isinstance(tags, list):
            raise FleetError(f"{where}.tags: must be a list")
        target = merged.get("target")
        hosts[name] = Host(
            name=name,
            address=validate_address(merged["address"], f"{where}.address"),
            port=validate_port(merged.get("port", DEFAULT_PORT), f"{where}.port"),
            user=validate_user(merged.get("user", DEFAULT_USER), f"{where}.user"),
            target=None if target is None else validate_name(target, f"{where}.target"),
            tags=tuple(validate_name(t, f"{where}.tags") for t in tags),
            root=validate_root(merged.get("root", DEFAULT_ROOT), f"{where}.root"),
        )

    groups: dict[str, tuple[str, ...]] = {}
    raw_groups = data.get("groups") or {}
    if not isinstance(raw_groups, dict):
        raise FleetError(f"{path}: groups must be a mapping of name -> [hosts]")
    for gname, members in raw_groups.items():
        validate_name(gname, f"{path}: groups")
        if not isinstance(members, list):
            raise FleetError(f"{path}: groups.{gname}: must be a list of host names")
        for m in members:
            if m not in hosts:
                raise FleetError(f"{path}: groups.{gname}: no host named {m!r}")
        groups[gname] = tuple(members)
    # Tags act as implicit groups when no explicit group has that name.
    for h in hosts.values():
        for t in h.tags:
            if t not in raw_groups:
                groups.setdefault(t, ())
                groups[t] = groups[t] + (h.name,)
    return Inventory(path=path, hosts=hosts, groups=groups, known_hosts=known_hosts,
                     identity_file=identity_file)


def write_inventory(path: Path, hosts: list[Host], *, known_hosts: str | None = None,
                    identity_file: str | None = None, groups: dict[str, list[str]] | None = None) -> None:
    """Write a fleet file (used by the emulated fleet). Deterministic key order."""
    doc: dict[str, Any] = {}
    if known_hosts:
        doc["known_hosts"] = known_hosts
    if identity_file:
        doc["identity_file"] = identity_file
    doc["hosts"] = {
        h.name: {"address": h.address, "port": h.port, "user": h.user, "root": h.root,
                 **({"target": h.target} if h.target else {}),
                 **({"tags": list(h.tags)} if h.tags else {})}
        for h in hosts
    }
    if groups:
        doc["groups"] = groups
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
