"""`dpstream replay --from` off a metric's window grid says which window it cuts (not released, as for
a worker deployed at that moment) and where that metric's releases begin; on the grid it says nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dpstream.workers.cli import main

_YAML = """\
version: 1
sources:
  s: {topic: t, privacy_unit: u, timestamp: ts}
budgets:
  b: {epsilon: 1.0, accounting: pure, period: 1d}
metrics:
  per_minute: {source: s, budget: b, window: {tumbling: 1m}, aggregate: count, mechanism: laplace}
  hourly: {source: s, budget: b, window: {tumbling: 1h}, aggregate: count, mechanism: laplace}
sinks: {releases: r, dead_letter: d}
"""


@pytest.mark.parametrize("start", ["2026-11-30T06:00:00Z", "2026-11-30T06:00:07Z", "2026-11-30T06:01:00Z"])
def test_a_from_off_the_grid_is_noted_per_metric(
    start: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    topology, events, out = tmp_path / "t.yaml", tmp_path / "e.jsonl", tmp_path / "r.jsonl"
    topology.write_text(_YAML)
    events.write_text("")
    argv = ["replay", str(topology), str(events), "--out", str(out), "--from", start, "--to", "2026-11-30T08:00:00Z"]
    assert main(argv) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "not on" in line]
    released = [json.loads(line) for line in out.read_text().splitlines()]
    first_hour = min(r["window"]["start"] for r in released if r["metric"] == "hourly")
    if start.endswith("06:00:00Z"):
        assert notes == [] and first_hour == "2026-11-30T06:00:00Z"
    else:
        cut = {"per_minute"} if start.endswith(":07Z") else set()
        assert {n.split("'s window grid")[0].split()[-1] for n in notes} == cut | {"hourly"}
        assert first_hour == "2026-11-30T07:00:00Z"  # the hour --from cuts is not released
        assert any("hourly's window grid (every 3600 s): its first release is the window starting "
                   "2026-11-30T07:00:00Z" in n for n in notes)  # fmt: skip
