"""The package's layers, read from its source: no import cycle anywhere, and the agents reach the
launchers only through the public ``jaxdist`` surface."""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "jaxdist"


def modules(root: pathlib.Path = PACKAGE) -> dict[str, pathlib.Path]:
    """Dotted module name -> source file, packages by their ``__init__``."""
    found = {}
    for path in root.rglob("*.py"):
        parts = path.relative_to(root.parent).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: pathlib.Path, known: dict[str, pathlib.Path]) -> set[str]:
    """The package's modules ``name`` imports, at any depth of its code: a deferred import is a
    dependency too, and so is one for type checking alone (a reader follows it the same)."""
    tree = ast.parse(path.read_text())
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join([*package.split(".")[:len(package.split(".")) - node.level + 1], *filter(None, [base])])
            targets.update(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names)
    resolved = set()
    for target in targets:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target != name:
            resolved.add(target)
    return resolved


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while not component or component[-1] != node:
                component.append(stack.pop())
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def test_no_module_of_the_package_imports_itself_back_through_others(graph):
    assert cycles(graph) == []


def test_the_agents_reach_the_launchers_only_through_the_public_surface(graph):
    """``jaxdist`` and ``jaxdist.launch`` (its ``__init__``) are the surface; the modules behind
    them (running, context, run_lock, output, the launchers) are theirs to change."""
    reaching = {f"{name} -> {target}" for name, targets in graph.items() if name.startswith("jaxdist.agents")
                for target in targets if target.startswith("jaxdist.launch.")}
    assert reaching == set()


def test_the_checks_find_a_cycle_and_a_reach_behind_the_surface(tmp_path):
    """The two checks above, shown to fail where they should, on a package made for it."""
    package = tmp_path / "jaxdist"
    for module, source in {"__init__.py": "", "a.py": "from jaxdist import b\n",
                           "b.py": "def f():\n    from jaxdist.a import x\n",
                           "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from jaxdist import d\n",
                           "d.py": "from jaxdist import c\n",
                           "agents/__init__.py": "", "agents/x.py": "from jaxdist.launch import context\n",
                           "launch/__init__.py": "", "launch/context.py": ""}.items():
        (package / module).parent.mkdir(parents=True, exist_ok=True)
        (package / module).write_text(source)
    known = modules(package)
    made = {name: imports(name, path, known) for name, path in known.items()}
    assert cycles(made) == [["jaxdist.a", "jaxdist.b"], ["jaxdist.c", "jaxdist.d"]]  # a type-only import counts
    assert made["jaxdist.agents.x"] == {"jaxdist.launch.context"}
