"""Shipped files point only inside the repository: no pointer to an outside design document or tracker.

The design lives in the package docstrings (`dpstream.topology`, `dpstream.workers.release`,
`dpstream.workers.ledger`, `dpstream.workers.telemetry`) and the README's "How it works"; a comment
that says "DESIGN §4", "see DESIGN.md", "§5" or "issue 13" sends a reader to text they do not have.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ("workers", "topology", "deploy")
OUTSIDE_POINTER = re.compile(r"DESIGN\s*§|DESIGN\.md|DESIGN \"|§\s*\d|\bissue \d", re.IGNORECASE)


def outside_pointers(roots: list[Path]) -> list[str]:
    """`path:line: text` of every line under `roots` that points at a document or tracker item outside."""
    hits = []
    for root in roots:
        for path in sorted(root.rglob("*")):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            try:
                text = path.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                continue  # binary files hold no prose
            for number, line in enumerate(text.splitlines(), 1):
                if OUTSIDE_POINTER.search(line):
                    hits.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()}")
    return hits


def test_no_shipped_file_points_outside_the_repository() -> None:
    """No line of workers/, topology/ or deploy/ names DESIGN §N, DESIGN.md, a bare §N or an issue number."""
    hits = outside_pointers([ROOT / name for name in SHIPPED])
    assert hits == [], "state the rule where the code is, or point at a package docstring:\n" + "\n".join(hits)


@pytest.mark.parametrize(
    "line",
    ["# see DESIGN §4", "rules of DESIGN.md", 'DESIGN "recovery by replay"', "(§5 rule 2)", "(issue 11 item 4)"],
)
def test_the_check_catches_each_pointer_form(line: str) -> None:
    """Each form of outside pointer is caught, so the check above is not vacuous."""
    assert OUTSIDE_POINTER.search(line)


def test_the_check_passes_prose_that_points_inside() -> None:
    """A pointer to a package docstring or a book section is not an outside pointer."""
    assert not OUTSIDE_POINTER.search("(see dpstream.workers.ledger; Numerical Recipes, section 6.4)")
