"""The layout rules of ``batchq/``, read from the source with :mod:`ast` (nothing is
imported): no import cycle between its modules, and no module over 500 lines.

What counts as an import of a module inside the package: every ``import`` and
``from ... import`` statement anywhere in the file (top level, inside functions and
methods, under ``if TYPE_CHECKING:`` too: a circle that only the type checker follows
is still a circle for a reader), absolute (``batchq.x``) or relative (``.x``,
``..x``); ``from pkg import name`` is an import of the submodule ``pkg.name`` when
that module exists, else of ``pkg``. Importing a submodule also runs its parent
package's ``__init__``, but that implicit edge is not counted (every package would
otherwise be in a circle with its own submodules).

The checker itself is tested on small synthetic packages in a temporary directory.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGE_DIR = REPO_ROOT / "batchq"
MAX_LINES = 500


# --- the checker -------------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``path:line``."""

    source: str
    target: str
    path: Path
    line: int


def module_files(package_dir: Path) -> dict[str, Path]:
    """Every module of the package under ``package_dir`` by its dotted name (a package
    by the name of its ``__init__``)."""
    root = package_dir.name
    out: dict[str, Path] = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = [root, *path.relative_to(package_dir).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The module of the package that importing ``name`` runs (its longest dotted
    prefix that is a module), None when it is outside the package."""
    parts = name.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in modules:
            return candidate
        parts.pop()
    return None


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool,
             modules: dict[str, Path]) -> Iterator[str]:
    if isinstance(node, ast.Import):
        for alias in node.names:
            found = _resolve(alias.name, modules)
            if found is not None:
                yield found
        return
    if node.level:
        # relative: ``.`` is the module's own package (a package's __init__ is in it)
        package = module.split(".") if is_package else module.split(".")[:-1]
        up = node.level - 1
        if up > len(package) - 1:
            raise ValueError(f"{module}: relative import beyond the top-level package "
                             f"(line {node.lineno})")
        base = ".".join(package[: len(package) - up])
        full = f"{base}.{node.module}" if node.module else base
    else:
        full = node.module or ""
    for alias in node.names:
        submodule = f"{full}.{alias.name}"
        found = submodule if submodule in modules else _resolve(full, modules)
        if found is not None:
            yield found


def import_edges(package_dir: Path) -> list[Edge]:
    """Every import of one module of the package by another, with where it is."""
    modules = module_files(package_dir)
    edges = []
    for module, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                for target in _targets(node, module, is_package, modules):
                    if target != module:
                        edges.append(Edge(module, target, path, node.lineno))
    return edges


@dataclass(frozen=True)
class Cycle:
    """The modules that all reach each other through imports (a strongly connected
    group), and the shortest cycle through the first of them."""

    group: list[str]
    edges: list[Edge]


def import_cycles(package_dir: Path) -> list[Cycle]:
    """One :class:`Cycle` per strongly connected group of modules (Tarjan), ordered by
    their first module; empty when there is none."""
    edges = import_edges(package_dir)
    graph: dict[str, dict[str, Edge]] = {m: {} for m in module_files(package_dir)}
    for e in edges:
        graph[e.source].setdefault(e.target, e)  # the first line that imports it

    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(v: str) -> None:  # recursion depth is bounded by the module count
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted((Cycle(g, _cycle_in(g, graph)) for g in groups),
                  key=lambda cycle: cycle.group[0])


def _cycle_in(group: list[str], graph: dict[str, dict[str, Edge]]) -> list[Edge]:
    """The shortest cycle through the group's first module (breadth-first inside it)."""
    start = group[0]
    members = set(group)
    came_by: dict[str, Edge] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph[v]):
                if w not in members:
                    continue
                if w == start:
                    path = [graph[v][w]]
                    while v != start:
                        path.append(came_by[v])
                        v = came_by[v].source
                    return path[::-1]
                if w not in came_by:
                    came_by[w] = graph[v][w]
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start} in {group}")  # pragma: no cover


def format_cycle(cycle: Cycle, root: Path) -> str:
    """``a -> b (a.py:3) -> a (b.py:12)``: each step names the line that imports; when
    more modules are tangled with them, they are named too."""
    steps = [cycle.edges[0].source]
    for e in cycle.edges:
        steps.append(f"{e.target} ({e.path.relative_to(root)}:{e.line})")
    text = " -> ".join(steps)
    if len(cycle.group) > len(cycle.edges):
        text += f"\n    (all in one circle: {', '.join(cycle.group)})"
    return text


def long_modules(package_dir: Path, max_lines: int = MAX_LINES) -> list[tuple[str, int]]:
    """``(module, lines)`` of every module longer than ``max_lines``."""
    out = []
    for module, path in module_files(package_dir).items():
        n = len(path.read_text(encoding="utf-8").splitlines())
        if n > max_lines:
            out.append((module, n))
    return out


# --- the rules, on batchq/ ---------------------------------------------------------------


def test_no_import_cycle_inside_batchq() -> None:
    cycles = import_cycles(PACKAGE_DIR)
    if cycles:
        pytest.fail("import cycles inside batchq/ (break each one):\n" + "\n".join(
            "  " + format_cycle(c, REPO_ROOT) for c in cycles), pytrace=False)


def test_no_module_in_batchq_over_500_lines() -> None:
    long = long_modules(PACKAGE_DIR)
    if long:
        pytest.fail(f"modules over {MAX_LINES} lines in batchq/ (split them):\n" + "\n".join(
            f"  {m}: {n} lines" for m, n in long), pytrace=False)


def _closure(start: str, graph: dict[str, set[str]]) -> dict[str, str]:
    """Every module ``start`` imports, directly or not, with the module that imports it."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        v = todo.pop()
        for w in sorted(graph.get(v, ())):
            if w not in seen and w != start:
                seen[w] = v
                todo.append(w)
    return seen


def _leaf(module: str) -> str:
    return module.rsplit(".", 1)[-1]


METRICS_SIDE = {"metrics", "metrics_http", "flow_metrics", "stats"}
"""Modules of the metrics and stats (by their last name, wherever they live)."""
REGISTRY = {"app", "task", "periodic", "campaign"}
"""The task registry and what is built on it."""


def metrics_reaching_registry(package_dir: Path) -> list[str]:
    """``metrics -> ... -> task`` for each metrics or stats module that imports (even
    indirectly, even lazily) the task registry: they take clients, not the app."""
    graph: dict[str, set[str]] = {}
    for e in import_edges(package_dir):
        graph.setdefault(e.source, set()).add(e.target)
    out = []
    for module in sorted(module_files(package_dir)):
        if _leaf(module) not in METRICS_SIDE:
            continue
        reached = _closure(module, graph)
        for bad in sorted(m for m in reached if _leaf(m) in REGISTRY):
            chain = [bad]
            while chain[-1] != module:
                chain.append(reached.get(chain[-1], module))
            out.append(" -> ".join(reversed(chain)))
    return out


def imports_of_bench(package_dir: Path) -> list[str]:
    """``path:line`` of every import of the top-level ``bench`` folder (a statement, or
    ``importlib.import_module("bench...")``): the installed package has no bench/."""
    out = []
    for module, path in module_files(package_dir).items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            elif (isinstance(node, ast.Call) and node.args
                  and isinstance(node.args[0], ast.Constant)
                  and isinstance(node.args[0].value, str)
                  and getattr(node.func, "attr", getattr(node.func, "id", "")) in
                  ("import_module", "run_module", "spec_from_file_location")):
                names = [node.args[0].value]
            if any(n == "bench" or n.startswith("bench.") for n in names):
                out.append(f"{module} ({path.name}:{node.lineno})")
    return out


def imports_of_the_cli(package_dir: Path) -> list[Edge]:
    """Imports of the CLI from outside it: only a ``__main__`` (an entry point, never
    imported) may; the CLI sits on top of every package."""
    cli = f"{package_dir.name}.cli"
    return [e for e in import_edges(package_dir)
            if (e.target == cli or e.target.startswith(cli + "."))
            and not (e.source == cli or e.source.startswith(cli + "."))
            and _leaf(e.source) != "__main__"]


def test_metrics_and_stats_never_import_the_task_registry() -> None:
    found = metrics_reaching_registry(PACKAGE_DIR)
    if found:
        pytest.fail("metrics and stats take clients, not the app's registry:\n" +
                    "\n".join("  " + f for f in found), pytrace=False)


def test_nothing_in_batchq_imports_bench() -> None:
    found = imports_of_bench(PACKAGE_DIR)
    if found:
        pytest.fail("batchq/ imports bench/, which is not installed:\n" +
                    "\n".join("  " + f for f in found), pytrace=False)


def test_no_package_imports_the_cli() -> None:
    found = imports_of_the_cli(PACKAGE_DIR)
    if found:
        pytest.fail("only a __main__ imports the CLI:\n" + "\n".join(
            f"  {e.source} -> {e.target} ({e.path.relative_to(REPO_ROOT)}:{e.line})"
            for e in found), pytrace=False)


def test_a_moved_module_keeps_its_old_path_with_a_warning(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib
    import sys
    import warnings

    import batchq

    home = batchq.Limit.__module__.removeprefix("batchq.")
    monkeypatch.setitem(batchq._MOVED, "_old_home_of_limit", home)
    monkeypatch.delitem(sys.modules, "batchq._old_home_of_limit", raising=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        old = importlib.import_module("batchq._old_home_of_limit")
        again = importlib.import_module("batchq._old_home_of_limit")
    try:
        assert old is again is sys.modules[f"batchq.{home}"]
        assert old.__spec__ is not None and old.__spec__.name == f"batchq.{home}"
        assert old.Limit is batchq.Limit
        assert [(w.category, str(w.message)) for w in caught] == [
            (DeprecationWarning, f"batchq._old_home_of_limit moved to batchq.{home}; the "
             "old path goes in the next release")]
        assert caught[0].filename == __file__  # points at the import, not importlib
    finally:
        sys.modules.pop("batchq._old_home_of_limit", None)


def test_every_old_path_is_the_module_at_its_new_path() -> None:
    import importlib
    import sys
    import warnings

    import batchq

    for old, new in sorted(batchq._MOVED.items()):
        saved = sys.modules.pop(f"batchq.{old}", None)
        try:
            with pytest.warns(DeprecationWarning, match=f"batchq.{old} moved to batchq.{new}"):
                module = importlib.import_module(f"batchq.{old}")
            assert module is importlib.import_module(f"batchq.{new}"), old
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # once per path
                assert importlib.import_module(f"batchq.{old}") is module
            assert getattr(batchq, old) is module
        finally:
            sys.modules.pop(f"batchq.{old}", None)
            if saved is not None:
                sys.modules[f"batchq.{old}"] = saved


# --- the checker, on synthetic packages ----------------------------------------------------


def _package(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "pkg"
    for name, text in {"__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_checker_reports_a_cycle_through_relative_and_function_level_imports(
        tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "a.py": "from .sub import b\n",
        "sub/__init__.py": "",
        "sub/b.py": "def f():\n    from ..c import g\n    return g\n",
        "c.py": "import os\n\n\nclass C:\n    def m(self):\n        import pkg.a\n",
        "d.py": "from . import a, c\n",  # imports into the cycle, is not part of it
    })
    cycles = import_cycles(root)
    assert len(cycles) == 1
    assert cycles[0].group == ["pkg.a", "pkg.c", "pkg.sub.b"]
    assert [(e.source, e.target, e.line) for e in cycles[0].edges] == [
        ("pkg.a", "pkg.sub.b", 1), ("pkg.sub.b", "pkg.c", 2), ("pkg.c", "pkg.a", 6)]
    assert format_cycle(cycles[0], tmp_path) == (
        "pkg.a -> pkg.sub.b (pkg/a.py:1) -> pkg.c (pkg/sub/b.py:2) -> pkg.a (pkg/c.py:6)")


def test_checker_counts_type_checking_imports_and_the_package_root(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "__init__.py": "from .app import App\n",
        "app.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                  "    from .queue import Queue\n",
        "queue.py": "from . import __version__\n",  # the root: its __init__ imports app
    })
    cycles = import_cycles(root)
    assert len(cycles) == 1
    assert [(e.source, e.target) for e in cycles[0].edges] == [
        ("pkg", "pkg.app"), ("pkg.app", "pkg.queue"), ("pkg.queue", "pkg")]


def test_checker_reports_each_separate_cycle(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "a.py": "import pkg.b\n", "b.py": "from pkg import a\n",
        "x.py": "from pkg.y import f\n", "y.py": "from .x import g\n",
    })
    found = [[e.source for e in c.edges] for c in import_cycles(root)]
    assert found == [["pkg.a", "pkg.b"], ["pkg.x", "pkg.y"]]


def test_checker_names_every_module_of_a_tangle(tmp_path: Path) -> None:
    # a <-> b and b <-> c: one group of three; the cycle shown is a -> b -> a
    root = _package(tmp_path, {
        "a.py": "from . import b\n", "b.py": "from . import a, c\n",
        "c.py": "from .b import x\n",
    })
    (cycle,) = import_cycles(root)
    assert format_cycle(cycle, tmp_path) == (
        "pkg.a -> pkg.b (pkg/a.py:1) -> pkg.a (pkg/b.py:1)\n"
        "    (all in one circle: pkg.a, pkg.b, pkg.c)")


def test_checker_accepts_a_layered_package(tmp_path: Path) -> None:
    # a package importing its submodules, siblings importing each other one way, and
    # imports from outside the package (stdlib, a package with a similar name)
    root = _package(tmp_path, {
        "__init__.py": "from .core import run\nfrom .dev import tool\n",
        "core.py": "import json\nfrom .util import helper\nimport pkgextra.x\n",
        "util.py": "from collections import abc\n",
        "dev/__init__.py": "from .tool import T\n",
        "dev/tool.py": "from ..core import run\nfrom . import helper2\n",
        "dev/helper2.py": "from pkg.util import helper\n",
    })
    assert import_cycles(root) == []
    edges = {(e.source, e.target) for e in import_edges(root)}
    assert ("pkg.dev.tool", "pkg.dev.helper2") in edges  # ``from . import submodule``
    assert ("pkg.dev.tool", "pkg.core") in edges
    assert not any(e[1].startswith("pkgextra") for e in edges)


def test_checker_rejects_a_relative_import_beyond_the_package(tmp_path: Path) -> None:
    root = _package(tmp_path, {"a.py": "from .. import other\n"})
    with pytest.raises(ValueError, match=r"pkg\.a: relative import beyond"):
        import_edges(root)


def test_long_module_check_names_the_module_and_its_length(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "short.py": "x = 1\n" * 500,
        "sub/long.py": "x = 1\n" * 501,
    })
    assert long_modules(root) == [("pkg.sub.long", 501)]


def test_rules_find_a_registry_import_bench_and_the_cli(tmp_path: Path) -> None:
    root = _package(tmp_path, {
        "stats.py": "from . import codec\n",
        "codec.py": "def f():\n    from .task import Task\n",
        "task.py": "",
        "metrics.py": "from .stats import read\n",
        "tool.py": "import importlib\nimportlib.import_module('bench.__main__')\n",
        "web/__init__.py": "", "web/__main__.py": "from ..cli import main\n",
        "web/page.py": "from ..cli.common import out\n",
        "cli/__init__.py": "from ..web import page\n", "cli/common.py": "",
    })
    assert metrics_reaching_registry(root) == [
        "pkg.metrics -> pkg.stats -> pkg.codec -> pkg.task", "pkg.stats -> pkg.codec -> pkg.task"]
    assert imports_of_bench(root) == ["pkg.tool (tool.py:2)"]
    assert [(e.source, e.target) for e in imports_of_the_cli(root)] == [
        ("pkg.web.page", "pkg.cli.common")]
