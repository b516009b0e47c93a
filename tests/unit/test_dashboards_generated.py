"""deploy/grafana/dashboards/*.json are the output of deploy/grafana/dashboards.py (grafana-foundation-sdk).

Regenerating every dashboard must reproduce the checked-in files byte for byte, so a hand edit of the
JSON, or a change to the Python that was not regenerated, fails here.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[2]
GENERATOR = REPO / "deploy" / "grafana" / "dashboards.py"
DASHBOARDS = REPO / "deploy" / "grafana" / "dashboards"


def generator() -> ModuleType:
    """deploy/grafana/dashboards.py imported by path (deploy/ is not a package)."""
    spec = importlib.util.spec_from_file_location("dpstream_grafana_dashboards", GENERATOR)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_checked_in_dashboard_is_generated():
    """Each JSON file has a builder and each builder a file: nothing hand-written is left beside the generated."""
    generated = {path.name for path in generator().rendered()}
    assert generated == {path.name for path in DASHBOARDS.glob("*.json")}


@pytest.mark.parametrize("name", sorted(path.name for path in DASHBOARDS.glob("*.json")))
def test_regenerating_reproduces_the_file_byte_for_byte(name: str):
    """The builder's output equals the checked-in text exactly."""
    texts = {path.name: text for path, text in generator().rendered().items()}
    assert name in texts, f"{name} has no builder in deploy/grafana/dashboards.py"
    assert (DASHBOARDS / name).read_text(encoding="utf-8") == texts[name], (
        f"stale: run python deploy/grafana/dashboards.py ({name})"
    )


def test_output_is_deterministic_sorted_json_with_a_trailing_newline():
    """Two renders agree; keys are sorted, indent two, and the text ends in exactly one newline."""
    first, second = generator().rendered(), generator().rendered()
    assert first == second
    for path, text in first.items():
        assert text.endswith("}\n") and not text.endswith("\n\n"), path.name
        assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_check_flag_passes_on_the_repository():
    """`python deploy/grafana/dashboards.py --check` exits 0 and prints nothing when every file is current."""
    result = subprocess.run(
        [sys.executable, str(GENERATOR), "--check"], capture_output=True, text=True, timeout=120, check=False
    )
    assert (result.returncode, result.stdout) == (0, ""), result.stdout + result.stderr


def test_check_flag_reports_a_stale_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """--check names a file that differs from its source and exits 1 (the source is not rewritten)."""
    module = generator()
    (tmp_path / "dashboards").mkdir()
    for path, text in module.rendered().items():
        (tmp_path / "dashboards" / path.name).write_text(text, encoding="utf-8")
    victim = tmp_path / "dashboards" / "dpstream-feed.json"
    victim.write_text(victim.read_text(encoding="utf-8").replace("dpstream feed", "hand-edited"), encoding="utf-8")
    monkeypatch.setattr(module, "OUT", tmp_path / "dashboards")
    monkeypatch.setattr(module, "HERE", tmp_path / "a" / "b")
    assert module.main(["--check"]) == 1
    assert "hand-edited" in victim.read_text(encoding="utf-8")
