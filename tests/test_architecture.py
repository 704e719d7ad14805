"""The layout a newcomer can live in: stage packages with no import cycle, and modules, classes
and functions small enough to read (limits from docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "eqsat_fuse"
MAX_MODULE_LINES = 900
MAX_CLASS_LINES = 500
MAX_FUNCTION_LINES = 100
STAGES = ("frontend", "saturation", "extraction", "lowering", "backends", "checking", "tools",
          "testing")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


MODULES = _modules()


def _runtime_nodes(tree: ast.AST):
    """Every node that can run: all of them but what `if TYPE_CHECKING:` guards (annotations)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if isinstance(node, ast.If) and getattr(node.test, "id", None) == "TYPE_CHECKING":
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def _imports(name: str, path: Path) -> set[str]:
    """Every eqsat_fuse module `name` imports, at the top or inside a function."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _runtime_nodes(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("eqsat_fuse")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("eqsat_fuse"):
                module = node.module
            else:
                continue
            for alias in node.names:        # `from . import x` imports the module x
                sub = f"{module}.{alias.name}"
                found.add(sub if sub in MODULES else module)
    return {m for m in found if m in MODULES and m != name}


def test_every_stage_is_a_package_with_a_docstring_saying_its_job():
    for stage in STAGES:
        init = PACKAGE / stage / "__init__.py"
        assert init.exists(), stage
        assert ast.get_docstring(ast.parse(init.read_text())), stage


def test_no_import_cycle_among_the_packages_modules_lazy_imports_included():
    # a package's __init__ that re-exports its modules is where a package is entered, not a
    # cycle: the edge from a module to its own package's __init__ is left out
    graph = {name: {m for m in _imports(name, path)
                    if not (path.name != "__init__.py" and name.startswith(m + "."))}
             for name, path in MODULES.items()}
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycle = stack[stack.index(nxt):] + [nxt]
                pytest.fail("import cycle: " + " -> ".join(cycle))
            if nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = 2

    for name in sorted(graph):
        if name not in state:
            visit(name)


def _too_long() -> list[str]:
    found = []
    for name, path in MODULES.items():
        text = path.read_text()
        lines = text.count("\n") + 1
        if lines > MAX_MODULE_LINES:
            found.append(f"module {name}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            length = node.end_lineno - node.lineno + 1
            if isinstance(node, ast.ClassDef) and length > MAX_CLASS_LINES:
                found.append(f"class {name}.{node.name}: {length} lines")
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                    and length > MAX_FUNCTION_LINES:
                found.append(f"function {name}.{node.name} (line {node.lineno}): {length} lines")
    return found


def test_modules_classes_and_functions_stay_readable():
    assert _too_long() == []


def test_docs_architecture_lists_every_module():
    """docs/architecture.md's module tree names exactly the package's modules (regenerate it
    with `python scripts/architecture_tree.py`)."""
    import subprocess
    import sys
    script = Path(__file__).resolve().parent.parent / "scripts" / "architecture_tree.py"
    result = subprocess.run([sys.executable, str(script), "--check"], capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
