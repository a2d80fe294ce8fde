"""The import structure: the planner imports nothing above it, and no planner module imports
itself back through another (every import counted, function-level ones too)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[1] / "dcp"
ABOVE_THE_PLANNER = ("dcp.data", "dcp.models", "dcp.profiler", "dcp.executor", "dcp.cli", "dcp.launch",
                     "dcp.whatif", "dcp.viz", "torch")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module an import statement in the file names (`from a import b` names a.b too,
    in case b is a module)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


PLANNER = {module_name(p): imports(p) for p in sorted((ROOT / "planner").rglob("*.py"))}


@pytest.mark.parametrize("module", sorted(PLANNER))
def test_the_planner_imports_nothing_above_it(module: str) -> None:
    bad = sorted(m for m in PLANNER[module] if m.startswith(ABOVE_THE_PLANNER))
    assert not bad, f"{module} imports {bad}"


def test_no_import_cycle_inside_the_planner() -> None:
    edges = {m: {d for d in deps if d in PLANNER and d != m} for m, deps in PLANNER.items()}
    state: dict[str, int] = {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for d in sorted(edges[m]):
            if state.get(d) == 1:
                raise AssertionError("import cycle: " + " -> ".join(path[path.index(d):] + [m, d]))
            if d not in state:
                visit(d, path + [m])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [])
