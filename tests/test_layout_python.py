"""The Python package's shape (issue 19, "Python spine"): no import circles inside colibri_kit,
and the product package imports nothing from the project's benchmarks/, tests/ or scripts/.

How it is checked: every module under colibri_kit/ is parsed with ``ast`` (nothing is imported
or run), every ``import``/``from ... import`` anywhere in it is collected (at the top, inside
functions, under ``if TYPE_CHECKING:``: a circle through a type-only import is still a circle a
reader must untangle), relative imports are resolved, ``from package import name`` counts as an
import of the submodule when ``name`` is one, and the strongly connected components of that graph
are computed (Tarjan, shared with the runtime's include check). Any component with more than one
module is a circle."""

from __future__ import annotations

import ast
from pathlib import Path

from test_runtime_layout import find_cycles

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "colibri_kit"
OUTSIDE = ("benchmarks", "tests", "scripts")
# Calls that load code from a path (importlib.util.spec_from_file_location, runpy.run_path,
# importlib.machinery.SourceFileLoader) or change where imports come from (sys.path).
LOADERS = {"spec_from_file_location", "run_path", "SourceFileLoader", "SourcelessFileLoader"}


def modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imported_names(name: str, path: Path) -> set[str]:
    """Every module name ``path`` imports (absolute; a ``from X import y`` gives X.y and X)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names.update(f"{base}.{alias.name}" for alias in node.names)
    return names


def import_graph() -> dict[str, set[str]]:
    mods = modules()

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for name, path in mods.items():
        targets = {owner(n) for n in imported_names(name, path) if n.split(".")[0] == "colibri_kit"}
        # The package's own __init__ (imported by every submodule import) is not an edge back.
        graph[name] = {t for t in targets if t and t != name and not name.startswith(t + ".")}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module: the runtime's include check's
    Tarjan (tests/test_runtime_layout.py), over module names."""
    return find_cycles(graph)   # type: ignore[arg-type]


def test_the_checker_finds_a_circle() -> None:
    """The check itself can fail: a three-module circle and a self-contained pair are told apart."""
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_colibri_kit_has_no_import_circles() -> None:
    graph = import_graph()
    assert len(graph) > 40 and "colibri_kit.errors" in graph      # the whole package was read
    assert circles(graph) == []


def test_errors_imports_nothing_from_the_kit() -> None:
    """Every module imports errors.py; so it imports none of them."""
    assert import_graph()["colibri_kit.errors"] == set()


def reaches_outside(name: str, path: Path) -> list[str]:
    found = [n for n in imported_names(name, path) if n.split(".")[0] in OUTSIDE]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Call):
            fn = node.func
            called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
            if called in LOADERS:
                found.append(f"{called}() at line {node.lineno}")
        if isinstance(node, ast.Attribute) and node.attr == "path" and \
                isinstance(node.value, ast.Name) and node.value.id == "sys":
            found.append(f"sys.path at line {node.lineno}")
    return found


def test_the_product_imports_nothing_from_benchmarks_tests_or_scripts() -> None:
    offenders = {name: reaches_outside(name, path) for name, path in modules().items()}
    offenders = {name: what for name, what in offenders.items() if what}
    assert offenders == {}


# Library functions take a Profile; only the edges resolve a target name (issue 19). The edges:
# colibri_kit/tasks/ (the Invoke tasks), a module's command-line entry (a top-level ``def main``
# or its ``if __name__ == "__main__":`` block), and profiles.py, which defines the loaders.
RESOLVERS = {"load_profile", "list_profiles", "load_all"}
RESOLVER_HOMES = ("colibri_kit/tasks/", "colibri_kit/profiles.py")


def _is_main_block(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and \
        isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__" and \
        any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)


def name_resolutions(source: str, filename: str = "<source>") -> list[str]:
    """Every use of a profile loader (a call, a reference, an import of it) outside the module's
    command-line entry, as "file:line: name" in source order. A reference counts, not only a call: ``f =
    load_profile`` then ``f(name)`` resolves a name as much as a direct call does."""
    tree = ast.parse(source, filename)
    edges = [n for n in tree.body if (isinstance(n, ast.FunctionDef) and n.name == "main")
             or _is_main_block(n)]
    allowed = {id(node) for edge in edges for node in ast.walk(edge)}
    found = []
    for node in ast.walk(tree):
        if id(node) in allowed:
            continue
        names = [a.name for a in node.names] if isinstance(node, ast.ImportFrom) else \
            [node.id] if isinstance(node, ast.Name) else \
            [node.attr] if isinstance(node, ast.Attribute) else []
        found += [(node.lineno, node.col_offset, n) for n in names if n in RESOLVERS]
    return [f"{filename}:{line}: {n}" for line, _, n in sorted(found)]


def test_the_name_rule_checker_finds_a_resolution() -> None:
    """The check itself can fail: a call, an attribute call, an import and a bare reference are
    each found in a library function, and none inside ``main`` or the ``__main__`` block."""
    src = ("from colibri_kit.profiles import load_profile\n"
           "from colibri_kit import profiles\n"
           "def footprint(target):\n"
           "    return load_profile(target)\n"
           "def every():\n"
           "    return [profiles.load_all(), profiles.list_profiles]\n"
           "def main(argv):\n"
           "    return profiles.load_profile(argv[0])\n"
           "if __name__ == '__main__':\n"
           "    profiles.load_all()\n")
    assert name_resolutions(src, "m.py") == [
        "m.py:1: load_profile", "m.py:4: load_profile", "m.py:6: load_all", "m.py:6: list_profiles"]


def test_library_functions_take_a_profile_only_the_edges_resolve_names() -> None:
    """No module of colibri_kit/ outside tasks/ (and profiles.py) loads a profile by name: a
    library function takes the Profile its caller loaded (profiles.require_profile refuses a
    name), so a command loads and validates it once and every step sees the same one."""
    scanned, found = 0, []
    for path in modules().values():
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(RESOLVER_HOMES):
            continue
        scanned += 1
        found += name_resolutions(path.read_text(), rel)
    assert scanned > 40     # the whole package was read
    assert found == [], "resolve the target name in the task and pass the Profile:\n" + "\n".join(found)
