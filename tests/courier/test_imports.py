"""Courier's modules import one another without a cycle (type-only imports included): each can
be read, and changed, knowing only the modules below it."""

from __future__ import annotations

import ast
import graphlib
import pathlib

import jaxdist.courier

PACKAGE = "jaxdist.courier"


def courier_imports(path: pathlib.Path) -> set[str]:
    """The courier modules `path` imports, wherever the import stands."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module == PACKAGE:
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith(PACKAGE + "."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {alias.name.split(".")[2] for alias in node.names if alias.name.startswith(PACKAGE + ".")}
    return found


def test_courier_modules_import_one_another_without_a_cycle():
    directory = pathlib.Path(jaxdist.courier.__file__).parent
    modules = {path.stem: path for path in directory.glob("*.py") if path.stem != "__init__"}
    graph = {name: courier_imports(path) & set(modules) for name, path in modules.items()}
    graphlib.TopologicalSorter(graph).prepare()  # raises CycleError naming the cycle
