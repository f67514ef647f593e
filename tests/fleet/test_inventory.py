"""Inventory parsing, validation (errors name file and key) and selection; hostile values."""

from __future__ import annotations

from pathlib import Path

import pytest

from colibri_kit.errors import FleetError
from colibri_kit.fleet.inventory import load_inventory
from colibri_kit.fleet.release import validate_release_id, validate_sha

DESIGN_EXAMPLE = """\
defaults: {user: root, port: 22, root: /opt/colibri}
known_hosts: fleet_known_hosts
identity_file: ~/.ssh/id_ed25519
hosts:
  cab-01: {address: 192.0.2.11, target: orin-nx, tags: [line-a]}
  cab-02: {address: 192.0.2.12, port: 2222, user: jetson, target: orin-nx}
  lab-x: {address: xavier.lab.example, target: xavier-nx, tags: [lab, line-b]}
groups:
  line-a: [cab-01, cab-02]
"""


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "fleet.yaml"
    p.write_text(text)
    return p


def test_design_shape_is_accepted(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, DESIGN_EXAMPLE))
    cab2 = inv.hosts["cab-02"]
    assert (cab2.address, cab2.port, cab2.user, cab2.target, cab2.root) == (
        "192.0.2.12", 2222, "jetson", "orin-nx", "/opt/colibri")
    assert inv.hosts["cab-01"].tags == ("line-a",)
    assert inv.known_hosts == (tmp_path / "fleet_known_hosts").resolve()  # relative to the file
    assert inv.identity_file == Path("~/.ssh/id_ed25519").expanduser()


def test_selection(tmp_path: Path) -> None:
    inv = load_inventory(write(tmp_path, DESIGN_EXAMPLE))
    names = lambda hs: [h.name for h in hs]  # noqa: E731
    assert names(inv.select()) == ["cab-01", "cab-02", "lab-x"]
    assert names(inv.select(hosts="cab-02,lab-x")) == ["cab-02", "lab-x"]
    assert names(inv.select(group="line-a")) == ["cab-01", "cab-02"]
    assert names(inv.select(group="lab")) == ["lab-x"]          # a tag acts as a group
    assert names(inv.select(target="xavier-nx")) == ["lab-x"]
    assert names(inv.select(tags="lab,line-b")) == ["lab-x"]
    assert names(inv.select(group="line-a", hosts="cab-01")) == ["cab-01"]
    with pytest.raises(FleetError, match="no host named nope"):
        inv.select(hosts="nope")
    with pytest.raises(FleetError, match="no group 'g'"):
        inv.select(group="g")
    with pytest.raises(FleetError, match="matches no host"):
        inv.select(target="agx-thor")


@pytest.mark.parametrize("text, where", [
    ("hosts: {a: {address: 10.0.0.1, prot: 22}}", "hosts.a: unknown key(s) prot"),
    ("hosts: {a: {port: 22}}", "hosts.a: address is required"),
    ("hosts: {a: {address: 10.0.0.1, port: 70000}}", "hosts.a.port"),
    ("hosts: {a: {address: 10.0.0.1, port: '22'}}", "hosts.a.port"),
    ("hosts: {a: {address: 10.0.0.1}}\ngroups: {g: [b]}", "groups.g: no host named 'b'"),
    ("hostz: {}", "unknown key(s) hostz"),
    ("defaults: {password: x}\nhosts: {a: {address: h}}", "defaults: unknown key(s) password"),
    ("hosts: [a]", "hosts must be a non-empty mapping"),
    ("hosts: {a: {address: h, tags: x}}", "hosts.a.tags"),
    # PyYAML keeps the last of two equal keys: a second cab-01 would silently replace the first.
    ("hosts:\n  cab-01: {address: 10.0.0.1}\n  cab-01: {address: 10.0.0.2}\n",
     "line 3: duplicate key 'cab-01'"),
    ("hosts: {a: {address: h, port: 22, port: 23}}", "duplicate key 'port'"),
])
def test_errors_name_file_and_key(tmp_path: Path, text: str, where: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(FleetError) as exc:
        load_inventory(path)
    assert str(path) in str(exc.value)
    assert where in str(exc.value)


def one_host(key: str, value: str) -> str:
    """A fleet file of one host whose ``key`` (or its name) is ``value`` (YAML text)."""
    if key == "name":
        return f"hosts: {{{value}: {{address: 10.0.0.1}}}}"
    if key == "address":
        return f"hosts: {{cab: {{address: {value}}}}}"
    return f"hosts: {{cab: {{address: 10.0.0.1, {key}: {value}}}}}"


@pytest.mark.parametrize("key, value", [
    ("name", "'cab;reboot'"),
    ("name", "'-oProxyCommand=id'"),
    ("address", "'10.0.0.1;id'"),
    ("address", "'-oProxyCommand=touch /tmp/x'"),
    ("address", "'$(id)'"),
    ("address", "'a b'"),
    ("user", "'root$(id)'"),
    ("user", "'-l'"),
    ("root", "'/opt/colibri; rm -rf /'"),
    ("root", "'opt/colibri'"),
    ("root", "'/opt/../etc'"),
    ("root", "'/opt/colibri/'"),
    ("root", "'/'"),
    ("root", "'/opt/`id`'"),
    ("target", "'../../etc'"),
])
def test_hostile_values_are_refused(tmp_path: Path, key: str, value: str) -> None:
    text = one_host(key, value)
    with pytest.raises(FleetError, match="not a valid|not a host name|must be an absolute"):
        load_inventory(write(tmp_path, text))


@pytest.mark.parametrize("bad", ["../etc", "a/b", "x;rm", "-rf", "", "a b", "orin-nx-1.partial-ab", "$(id)"])
def test_hostile_release_ids_are_refused(bad: str) -> None:
    with pytest.raises(FleetError):
        validate_release_id(bad)


def test_release_id_and_sha_accept_good_values() -> None:
    assert validate_release_id("orin-nx-0123456789ab") == "orin-nx-0123456789ab"
    assert validate_sha("a" * 64) == "a" * 64
    with pytest.raises(FleetError):
        validate_sha("A" * 64)


# ``re.match`` with ``$`` accepts one trailing newline; a quoted YAML value can carry one, and it
# would then reach a command line ("ssh user\n@host", a path "/opt/colibri\n/current").
@pytest.mark.parametrize("key, value", [
    ("name", '"cab-01\\n"'),
    ("address", '"192.0.2.11\\n"'),
    ("user", '"jetson\\n"'),
    ("root", '"/opt/colibri\\n"'),
    ("target", '"orin-nx\\n"'),
    ("tags", '["line-a\\n"]'),
])
def test_a_trailing_newline_is_refused(tmp_path: Path, key: str, value: str) -> None:
    text = one_host(key, value)
    with pytest.raises(FleetError, match="not a valid|not a host name|must be an absolute"):
        load_inventory(write(tmp_path, text))
    # the same value without the newline is accepted
    load_inventory(write(tmp_path, text.replace("\\n", "")))


def test_a_group_name_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    with pytest.raises(FleetError, match="not a valid name"):
        load_inventory(write(tmp_path, 'hosts: {cab: {address: 10.0.0.1}}\ngroups: {"g\\n": [cab]}\n'))


@pytest.mark.parametrize("validate, good", [(validate_release_id, "orin-nx-0123456789ab"),
                                            (validate_sha, "a" * 64)])
def test_release_ids_and_shas_with_a_trailing_newline_are_refused(validate, good) -> None:
    assert validate(good) == good
    with pytest.raises(FleetError):
        validate(good + "\n")
