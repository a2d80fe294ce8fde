"""Every tuning knob of the planner in one module (`dcp.planner.knobs`): no module-level tuning
constant elsewhere in dcp/planner but tolerances and schema names, every knob with one line on
what it trades and an entry in docs/tuning-log.md."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLANNER = ROOT / "dcp" / "planner"
KNOBS = PLANNER / "knobs.py"
NOT_KNOBS = {
    "PLAN_SCHEMA_VERSION": "the plan JSON's schema",
    "READABLE_SCHEMA_VERSIONS": "the plan JSON's schemas read",
    "_FAST_MAX_TOKENS": "the int64 range of tokens * (tokens + 1)",
}
"""Numeric module constants that are not tuning: schema versions and a representation limit."""
TOLERANCE = 1e-4
"""A constant named *TOL or *RTOL of at most this is a floating-point tolerance, not a knob."""


def _numeric(node: ast.AST) -> bool:
    """A number, or a tuple or arithmetic of numbers only."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.Tuple):
        return bool(node.elts) and all(_numeric(e) for e in node.elts)
    if isinstance(node, ast.BinOp):
        return _numeric(node.left) and _numeric(node.right)
    if isinstance(node, ast.UnaryOp):
        return _numeric(node.operand)
    return False


def tuning_constants(source: str) -> list[str]:
    """Module-level UPPER_CASE names bound to numbers (or tuples of them), but tolerances and the
    names of `NOT_KNOBS`."""
    out = []
    for node in ast.parse(source).body:
        if not isinstance(node, ast.Assign | ast.AnnAssign) or node.value is None:
            continue
        pairs: list[tuple[ast.AST, ast.AST]] = []
        for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
            if isinstance(t, ast.Tuple) and isinstance(node.value, ast.Tuple):  # A, B = 1, 2
                pairs += zip(t.elts, node.value.elts, strict=False)
            else:
                pairs.append((t, node.value))
        for t, value in pairs:
            if not (isinstance(t, ast.Name) and t.id.lstrip("_").isupper()) or not _numeric(value):
                continue
            if t.id in NOT_KNOBS or (re.search(r"R?TOL$", t.id) and abs(ast.literal_eval(value)) <= TOLERANCE):
                continue
            out.append(t.id)
    return out


def test_the_scanner_finds_knobs_and_leaves_tolerances() -> None:
    source = ("A_SHARE = 0.3\nLEVELS = (1.0, 1.02)\nHALF = 1 / 2\n_PRIVATE = 16\n_TOL = 1e-9\nBAND_TOL = 0.01\n"
              "NAME = 'x'\nPLAN_SCHEMA_VERSION = 3\nlower = 4\nWATER, SHARE = 256, 1 / 64\n")
    assert tuning_constants(source) == ["A_SHARE", "LEVELS", "HALF", "_PRIVATE", "BAND_TOL", "WATER", "SHARE"]


@pytest.mark.parametrize("path", sorted(p.relative_to(PLANNER).as_posix() for p in PLANNER.rglob("*.py")
                                        if p != KNOBS))
def test_no_tuning_constant_outside_the_knob_module(path: str) -> None:
    assert tuning_constants((PLANNER / path).read_text()) == []


def _knobs() -> list[tuple[str, str | None]]:
    """(name, docstring) of every knob, in the module's order."""
    body = ast.parse(KNOBS.read_text()).body
    out = []
    for i, node in enumerate(body):
        if isinstance(node, ast.Assign):
            nxt = body[i + 1] if i + 1 < len(body) else None
            doc = nxt.value.value if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) else None
            out.append((node.targets[0].id, doc))
    return out


def test_every_knob_has_one_line_on_what_it_trades_and_a_tuning_log_entry() -> None:
    knobs = _knobs()
    names = [n for n, _ in knobs]
    assert len(names) == len(set(names))  # no knob defined twice (the old modules reused names)
    log = (ROOT / "docs" / "tuning-log.md").read_text()
    logged = re.findall(r"^## `(\w+)` = ", log, re.M)
    for name, doc in knobs:
        assert doc is not None and "\n" not in doc.strip(), name
        assert name in logged, name
    assert sorted(logged) == sorted(names)  # one entry per knob, none for a knob that is gone
