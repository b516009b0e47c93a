"""`dpstream budget status --topology` labels a scope with a `privacy_unit: event` metric
`event-level (weaker)` in its text and JSON, against a real Redis ledger."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dpstream.topology.loader import load_topology
from dpstream.workers.cli import main
from dpstream.workers.commands import budget as budget_command
from dpstream.workers.ledger import open_ledger

NOW = datetime(2026, 3, 10, 6, 0, tzinfo=UTC).timestamp()

_TOPOLOGY = """
version: 1
sources:
  people: {topic: t1, privacy_unit: user_id, timestamp: ts}
  clicks: {topic: t2, privacy_unit: event, timestamp: ts}
budgets:
  mixed: {epsilon: 1.0, delta: 1.0e-6, period: 1d}
  plain: {epsilon: 1.0, delta: 1.0e-6, period: 1d}
metrics:
  views: {source: people, budget: mixed, weight: 1, window: {tumbling: 1h}, aggregate: count, mechanism: gaussian}
  taps: {source: clicks, budget: mixed, weight: 1, window: {tumbling: 1h}, aggregate: count, mechanism: gaussian}
  users: {source: people, budget: plain, weight: 1, window: {tumbling: 1h}, aggregate: count, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""


def test_status_labels_an_event_level_scope_in_text_and_json(
    fresh_redis: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With --topology: `guarantee` is `event-level (weaker)` and names `taps` for the scope that has it,
    `unit-level` for the other; the text says the label under the scope's header. Without a topology
    the ledger cannot know the privacy unit: `guarantee` is null."""
    monkeypatch.setattr(budget_command, "clock", lambda: NOW)
    path = tmp_path / "topology.yaml"
    path.write_text(_TOPOLOGY)

    async def register() -> None:
        ledger = await open_ledger(fresh_redis.url, load_topology(str(path)), clock=lambda: NOW)
        await ledger.close()

    asyncio.run(register())
    base = ["budget", "status", "--topology", str(path), "--redis", fresh_redis.url]
    assert main([*base, "--json"]) == 0
    rows = {s["scope"]: s for s in json.loads(capsys.readouterr().out)["scopes"]}
    assert (rows["mixed"]["guarantee"], rows["mixed"]["event_level_metrics"]) == ("event-level (weaker)", ["taps"])
    assert (rows["plain"]["guarantee"], rows["plain"]["event_level_metrics"]) == ("unit-level", [])

    assert main(base) == 0
    text = capsys.readouterr().out
    mixed, plain = text.split("\nplain ")[0], text.split("\nplain ")[1]
    assert "event-level (weaker): taps protect single events, not people" in mixed
    assert "event-level" not in plain

    assert main(["budget", "status", "--redis", fresh_redis.url, "--json"]) == 0
    assert {s["guarantee"] for s in json.loads(capsys.readouterr().out)["scopes"]} == {None}
