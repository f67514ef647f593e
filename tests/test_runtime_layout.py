"""The runtime's layout (docs/runtime.md, "Source map"): folders by concern, no include circle
between files, and the HTTP service linked into the `colibri` binary only, not into libcolibri.a."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RT = ROOT / "runtime"
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def _module(path: Path) -> Path:
    """A .c file and its .h are one unit (model.c + model.h): a circle through the pair is one."""
    return path.with_suffix("")


def include_graph() -> dict[Path, set[Path]]:
    """module -> modules it includes, resolved as the compiler does (the file's own folder, then
    -Isrc and -Iinclude, as runtime/Makefile passes them)."""
    files = [*RT.glob("src/*/*.[ch]"), *RT.glob("serve/*.[ch]"), *RT.glob("tools/*.[ch]"),
             *RT.glob("include/*.h")]
    graph: dict[Path, set[Path]] = {}
    for f in files:
        deps = graph.setdefault(_module(f), set())
        for name in INCLUDE.findall(f.read_text()):
            for base in (f.parent, RT / "src", RT / "include"):
                target = (base / name).resolve()
                if target.is_file():
                    if _module(target) != _module(f):
                        deps.add(_module(target))
                    break
    return graph


def find_cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """Every strongly connected component of more than one module (Tarjan)."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    on_stack: set[Path] = set()
    cycles: list[list[Path]] = []

    def visit(v: Path) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_a_circle() -> None:
    a, b, c = Path("a"), Path("b"), Path("c")
    assert find_cycles({a: {b}, b: {c}, c: {a}}) == [[a, b, c]]
    assert find_cycles({a: {b}, b: {c}, c: set()}) == []


def test_no_include_circle_between_runtime_files() -> None:
    graph = include_graph()
    assert len(graph) > 30   # the walk saw the tree
    cycles = [[p.relative_to(RT).as_posix() for p in c] for c in find_cycles(graph)]
    assert cycles == []


def test_sources_live_in_folders_by_concern() -> None:
    assert sorted(p.name for p in (RT / "src").iterdir()) == ["core", "cpu", "cuda", "layers", "text"]
    assert not list((RT / "src").glob("*.[ch]"))
    assert (RT / "serve" / "server.c").is_file() and (RT / "tools" / "main.c").is_file()


def test_the_library_has_no_http_or_sockets(host_colibri: Path) -> None:
    """An embedded program that links libcolibri.a gets the engine, not a web server."""
    lib = host_colibri.parents[1] / "lib" / "libcolibri.a"
    nm = subprocess.run(["nm", "--format=posix", str(lib)], capture_output=True, text=True,
                        check=True).stdout
    defined, undefined = set(), set()
    for line in nm.splitlines():
        parts = line.split()
        if len(parts) >= 2 and len(parts[1]) == 1:
            (undefined if parts[1] == "U" else defined).add(parts[0])
    assert "colibri_forward" in defined and "colibri_tokenize" in defined   # the engine is there
    sockets = {"socket", "bind", "listen", "accept", "accept4", "connect", "getaddrinfo",
               "setsockopt", "recv", "send", "poll", "epoll_create1"}
    assert sockets & undefined == set()
    serve_prefixes = ("http_", "json_", "jb_", "oai_", "colibri_serve")
    assert [s for s in defined if s.startswith(serve_prefixes)] == []
    # ... and the binary still serves
    binary_syms = subprocess.run(["nm", "-D", "--undefined-only", str(host_colibri)],
                                 capture_output=True, text=True).stdout
    assert re.search(r"\bsocket\b", binary_syms) or b"socket" in host_colibri.read_bytes()


def test_a_source_directly_in_src_is_refused(tmp_path: Path) -> None:
    """A .c dropped into src/ itself would be silently left out of the library: make refuses it."""
    rt = tmp_path / "runtime"
    (rt / "src" / "core").mkdir(parents=True)
    (rt / "Makefile").write_text((RT / "Makefile").read_text())
    (rt / "src" / "stray.c").write_text("int stray(void) { return 1; }\n")
    proc = subprocess.run(["make", "-n", "-C", str(rt), "CONFIG_DIR=.", f"OUT_DIR={tmp_path}/o"],
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "src/stray.c: runtime sources live in a folder of src/" in proc.stderr
    (rt / "src" / "stray.c").rename(rt / "src" / "core" / "stray.c")
    proc = subprocess.run(["make", "-n", "-C", str(rt), "CONFIG_DIR=.", f"OUT_DIR={tmp_path}/o",
                           "KERNEL_EMBED="], capture_output=True, text=True)
    assert proc.returncode == 0 and "src/core/stray.c" in proc.stdout


def _source_map_names() -> set[str]:
    """Every file name written in backticks in docs/runtime.md's "Source map" section."""
    text = (ROOT / "docs" / "runtime.md").read_text(encoding="utf-8")
    section = text.split("## Source map", 1)[1].split("\n## ", 1)[0]
    return {Path(tok).name for tok in re.findall(r"`([^`\s]+)`", section)}


def test_the_source_map_names_every_runtime_source() -> None:
    # The map is how a newcomer finds code: a file it does not name is a file nobody finds.
    named = _source_map_names()
    sources = [p for d in ("src", "serve", "tools") for p in (ROOT / "runtime" / d).rglob("*.c")]
    assert sources, "no runtime sources found: the walk is wrong"
    missing = sorted(str(p.relative_to(ROOT)) for p in sources if p.name not in named)
    assert not missing, f"docs/runtime.md's source map does not name: {missing}"
