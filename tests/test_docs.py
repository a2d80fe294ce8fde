"""The project's documents stand alone: nothing in the README, docs/, code comments or notebooks
points outside the repository, and every relative link the documents make resolves."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
OUTSIDE = re.compile(r"\.\./shared|shared/|DESIGN\.md|REFERENCES\.md|STYLE\.md")
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SOURCES = [p for d in ("dcp", "tests", "benchmarks", "examples", "scripts", "notebooks")
           for p in sorted((ROOT / d).rglob("*")) if p.suffix in (".py", ".sh", ".ipynb", ".md")]


@pytest.mark.parametrize("path", DOCUMENTS + SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_nothing_points_outside_the_repository(path: Path) -> None:
    text = path.read_text()
    if path == Path(__file__):
        text = text.replace(OUTSIDE.pattern, "")
    found = [m.group(0) for m in OUTSIDE.finditer(text)]
    assert not found, f"{path.relative_to(ROOT)} cites {found}: cite the public source (paper, arXiv id, issue)"


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    for target in re.findall(r"\]\(([^)#]+)\)", path.read_text()):
        if "://" in target:
            continue
        assert (path.parent / target).exists(), f"{path.relative_to(ROOT)} links to missing {target}"


def test_the_readme_points_to_the_design() -> None:
    assert "(docs/design.md)" in (ROOT / "README.md").read_text()
    design = (ROOT / "docs" / "design.md").read_text()
    for part in ("## The cost model", "## The planner", "## The executor", "What is deterministic"):
        assert part in design
