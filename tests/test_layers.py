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


LAYERS = {
    "kit": ("knobs", "levels", "lpt", "colgen", "timebudget", "ilp.budget", "ilp.solvers"),
    "core": ("sample", "plan", "options", "inputs", "feasibility", "status", "pricing", "ilp.costs", "sync",
             "slots", "common", "simulate"),
    "bounds": ("bounds", "bounds.work", "bounds.release", "bounds.group"),
    "baselines": ("baselines", "greedy"),
    "search": ("ilp", "ilp.search", "ilp.warm", "ilp.incumbent", "ilp.heuristic", "ilp.bestfit", "ilp.fill",
               "ilp.pack", "ilp.lns", "ilp.classes", "ilp.cuts", "ilp.model", "ilp.exact", "ilp.columns",
               "ilp.patterns"),
    "phased": ("phases", "backfill", "nested", "nested_columns"),
    "api": ("", "run", "report"),
}
"""Every planner module's layer (docs/design.md, "The planner's layout"), lowest first: kit (the
clock and time budget, the solver back end, LPT, column generation, level search), core
(samples, plans, options, inputs, pricing, the cost table, step pricing, slots, plan assembly,
simulation), bounds, baselines (dcp-greedy, bucket, packed), search (the single-layout program
and its column programs), phased (backfill, nested, splits), api (`dcp.planner`, the
orchestration the CLI shares). "" is `dcp.planner` itself."""

RANK = {f"dcp.planner.{m}".rstrip("."): k for k, mods in enumerate(LAYERS.values()) for m in mods}


def test_every_planner_module_has_a_layer() -> None:
    assert sorted(set(PLANNER) - set(RANK)) == [], "assign the new module a layer in LAYERS"
    assert sorted(set(RANK) - set(PLANNER)) == [], "LAYERS names a module that is gone"


@pytest.mark.parametrize("module", sorted(PLANNER))
def test_a_planner_module_imports_only_its_own_layer_or_lower(module: str) -> None:
    names = list(LAYERS)
    up = sorted(f"{d} ({names[RANK[d]]})" for d in PLANNER[module] if d in RANK and RANK[d] > RANK[module])
    assert not up, f"{module} ({names[RANK[module]]}) imports from above its layer: {up}"
