"""Static guard: no non-cryptographic RNG or float sampler where published values are made.

Scans every module under workers/ and topology/ with `ast` (paths containing 'synthetic' or
'bench' are exempt: they generate test events or benchmark baselines, never published values).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_SAMPLER_ATTRS = {"laplace", "normal", "gauss", "gumbel", "exponential", "uniform", "randint", "random"}
_RNG_MODULES = ("random", "numpy.random")


def _guarded_modules() -> list[Path]:
    files = []
    for top in ("workers", "topology"):
        for path in sorted((ROOT / top).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if "synthetic" in rel or "bench" in rel:
                continue
            files.append(path)
    return files


def _dotted(node: ast.AST) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def violations(source: str) -> list[str]:
    """What in `source` imports an RNG module or calls a float sampler (line: reason)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name in _RNG_MODULES or alias.name.startswith("numpy.random."):
                    found.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            mod = node.module or ""
            names = {a.name for a in node.names}
            if mod in _RNG_MODULES or mod.startswith("numpy.random") or (mod == "numpy" and "random" in names):
                found.append(f"{node.lineno}: from {mod} import {', '.join(sorted(names))}")
        elif isinstance(node, ast.Attribute):
            dotted = _dotted(node)
            if dotted.startswith(("np.random", "numpy.random")) or dotted.split(".")[0] == "random":
                found.append(f"{node.lineno}: uses {dotted}")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _SAMPLER_ATTRS
            and (
                node.func.attr in {"laplace", "normal", "gauss"}
                or _dotted(node.func).split(".")[0] in {"np", "numpy", "random", "rng"}
            )
        ):
            found.append(f"{node.lineno}: calls .{node.func.attr}(")
    return found


@pytest.mark.parametrize("path", _guarded_modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_rng_in_published_paths(path: Path) -> None:
    """A module on a publishing path neither imports numpy.random / random nor calls a float sampler."""
    assert violations(path.read_text()) == []


@pytest.mark.parametrize(
    "snippet",
    [
        "import random",
        "import numpy.random",
        "from numpy import random",
        "from numpy.random import default_rng",
        "import numpy as np\nx = np.random.default_rng()",
        "x = rng.normal(0, 1)",
        "y = gen.laplace(0.0, 1.0)",
        "import random as r",
        "z = random.gauss(0, 1)",
    ],
)
def test_guard_catches(snippet: str) -> None:
    """Each forbidden pattern is detected (the guard is not vacuous)."""
    assert violations(snippet)


def test_guard_scans_something() -> None:
    """The scan covers the noise package and skips bench modules."""
    rels = {str(p.relative_to(ROOT)) for p in _guarded_modules()}
    assert "workers/noise/mechanisms.py" in rels
    assert not any("bench" in r for r in rels)
