"""Every operator command that changes the ledger records who ran it in the audit stream.

The commands that write to a shared ledger: `breaker open|close`, `budget grant`, `budget retry` (its own
tests: tests/integration/test_parked_windows.py) and `replay --ledger redis://…` (registers the topology's
scopes and charges its releases). The read-only ones (`budget status|history|audit|reconcile|parked`,
`verify`, `exporter`) and the worker (its worker id is the actor of its registration) write nothing here.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from dpstream.workers.cli import main

pytestmark = pytest.mark.integration

TOPOLOGY = """\
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d, reserve: 0.2}
metrics:
  views:
    source: clicks
    budget: b
    window: {tumbling: 1h}
    aggregate: count
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""


def _audit(url: str, topology: Path, capsys: pytest.CaptureFixture[str]) -> list[dict[str, Any]]:
    capsys.readouterr()
    assert main(["budget", "audit", "--redis", url, "--topology", str(topology), "--json", "--limit", "1000"]) == 0
    entries: list[dict[str, Any]] = json.loads(capsys.readouterr().out)["entries"]
    return entries


def test_each_ledger_changing_operator_command_records_its_actor(
    tmp_path: Path, fresh_redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """replay (on Redis: registration and charges), breaker open, breaker close and budget grant each leave
    entries with their --actor."""
    topology = tmp_path / "topology.yaml"
    topology.write_text(TOPOLOGY)
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps({"user_id": f"u{i}", "ts": 1796083200 + 60 * i}) + "\n" for i in range(5)))
    who = uuid.uuid4().hex[:8]
    url = fresh_redis.url
    common = ["--redis", url, "--topology", str(topology)]
    replay = [str(topology), str(events), "--ledger", url, "--out", str(tmp_path / "out.jsonl")]
    window = ["--from", "2026-12-01T00:00:00Z", "--to", "2026-12-01T02:00:00Z"]
    assert main(["replay", *replay, *window, "--actor", f"replay-{who}"]) == 0
    assert main(["breaker", "open", "--scope", "b", "--reason", "drill", "--actor", f"open-{who}", *common]) == 0
    assert main(["breaker", "close", "--scope", "b", "--reason", "drill over", "--actor", f"close-{who}", *common]) == 0
    assert (
        main(
            [
                "budget",
                "grant",
                "--scope",
                "b",
                "--amount",
                "0.001",
                "--reason",
                "x",
                "--actor",
                f"grant-{who}",
                *common,
            ]
        )
        == 0
    )
    entries = _audit(url, topology, capsys)
    actors = {e.get("actor") for e in entries}
    for command in ("replay", "open", "close", "grant"):
        assert f"{command}-{who}" in actors, (command, sorted(a for a in actors if a))
    by_replay = {e["kind"] for e in entries if e.get("actor") == f"replay-{who}"}
    assert {"config", "charge"} <= by_replay, by_replay  # its registration and each of its charges
    assert not [e for e in entries if e["kind"] == "charge" and e.get("actor") != f"replay-{who}"]


def test_replay_on_redis_defaults_to_a_replay_actor(
    tmp_path: Path, fresh_redis: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without --actor a replay is audited as replay:$USER, not as a worker."""
    monkeypatch.setenv("USER", "carol")
    topology = tmp_path / "topology.yaml"
    topology.write_text(TOPOLOGY)
    events = tmp_path / "events.jsonl"
    events.write_text(json.dumps({"user_id": "u", "ts": 1796083200}) + "\n")
    argv = [str(topology), str(events), "--ledger", fresh_redis.url, "--out", str(tmp_path / "out.jsonl")]
    assert main(["replay", *argv, "--from", "2026-12-01T00:00:00Z", "--to", "2026-12-01T01:00:00Z"]) == 0
    actors = {e.get("actor") for e in _audit(fresh_redis.url, topology, capsys)}
    assert "replay:carol" in actors and "worker" not in actors, actors
