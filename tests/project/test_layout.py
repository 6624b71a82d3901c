"""The package's layout: no import cycle, and nothing reaches into the recorder's private state.

The import graph is read from the source with ``ast``: every import at module level (inside
``if``/``try`` blocks too) and every import under ``if TYPE_CHECKING:``, since a cycle that only
type checkers follow still ties two stages together. Imports inside functions are left out: they
run late, on purpose.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "gputrace"


def _modules(root: Path) -> dict[str, Path]:
    mods = {}
    for f in root.rglob("*.py"):
        name = ".".join(f.relative_to(root.parent).with_suffix("").parts)
        mods[name.removesuffix(".__init__")] = f
    return mods


def _top_level_imports(body: list[ast.stmt]) -> list[ast.Import | ast.ImportFrom]:
    """Imports run when the module loads, and those under ``if TYPE_CHECKING:``: every branch
    of module-level ``if``/``try``/``with`` blocks, never function or class bodies."""
    out: list[ast.Import | ast.ImportFrom] = []
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.append(node)
        elif isinstance(node, ast.If):
            out += _top_level_imports(node.body) + _top_level_imports(node.orelse)
        elif isinstance(node, ast.Try):
            out += _top_level_imports(node.body) + _top_level_imports(node.orelse)
            out += _top_level_imports(node.finalbody)
            for h in node.handlers:
                out += _top_level_imports(h.body)
        elif isinstance(node, ast.With):
            out += _top_level_imports(node.body)
    return out


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the package modules it imports at load time or for type checking."""
    mods = _modules(root)
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        pkg = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in _top_level_imports(ast.parse(f.read_text(encoding="utf-8")).body):
            if isinstance(node, ast.Import):
                graph[m] |= {a.name for a in node.names if a.name in mods}
                continue
            base = node.module or ""
            if node.level:
                parts = pkg.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            for a in node.names:
                full = f"{base}.{a.name}"
                if full in mods:
                    graph[m].add(full)
                elif base in mods:
                    graph[m].add(base)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module, and modules importing
    themselves (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1 or v in graph[v]:
                    out.append(sorted(comp))
    return out


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph(PACKAGE)
    assert len(graph) > 50 and graph["gputrace.recorder"], "the graph misses the package"
    assert cycles(graph) == []


def test_the_cycle_finder_finds_cycles_type_checking_ones_included(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from .. import c\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import thing\n"
    )
    (pkg / "d.py").write_text("def f():\n    from pkg import a\n")  # late: not a load-time edge
    graph = import_graph(pkg)
    assert graph["pkg.c"] == {"pkg.a"} and graph["pkg.d"] == set()
    assert cycles(graph) == [["pkg.a", "pkg.c", "pkg.sub.b"]]
    (pkg / "c.py").write_text("")
    assert cycles(import_graph(pkg)) == []


def _recorder_private_names() -> set[str]:
    """Attributes and methods of ``Recorder`` whose names start with one underscore."""
    tree = ast.parse((PACKAGE / "recorder.py").read_text(encoding="utf-8"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Recorder")
    names = set()
    for node in ast.walk(cls):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            names.add(node.attr)
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def test_nothing_outside_the_recorder_touches_its_private_state() -> None:
    private = _recorder_private_names()
    assert "_buffers_lock" in private
    touched = []
    files = [*PACKAGE.rglob("*.py"), *PACKAGE.parent.joinpath("tests").rglob("*.py")]
    for f in files:
        if f == PACKAGE / "recorder.py":
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Attribute) or node.attr not in private:
                continue
            # ``self._x`` is the class's own attribute of that name, not the recorder's
            if not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                touched.append(f"{f.relative_to(PACKAGE.parent)}:{node.lineno}: .{node.attr}")
    assert touched == []


@pytest.mark.parametrize("reach", ["rec._buffers_lock", "self.recorder._extra_track('t')"])
def test_the_private_state_check_sees_a_reach(reach: str) -> None:
    node = ast.parse(reach).body[0]
    assert isinstance(node, ast.Expr)
    attrs = [n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)]
    assert set(attrs) & _recorder_private_names()
