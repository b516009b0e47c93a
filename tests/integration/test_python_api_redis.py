"""`dpstream.replay` with a Redis ledger: charged once, across the CLI and the API, with the same stored bytes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import dpstream
from dpstream.workers.cli import main

ROOT = Path(__file__).resolve().parents[2]
WEB = ROOT / "topology" / "examples" / "web-analytics.yaml"

FUTURE = 4_102_444_800
"""2100-01-01T00:00:00Z: the Redis ledger reads the wall clock; windows in 2100 are never past its
idempotency horizon, whatever the date the test runs."""


def _events() -> list[dict[str, Any]]:
    return [
        {"user_id": f"u{i % 30}", "ts": FUTURE + 4 * i, "page": ["home", "cart"][i % 2], "basket_eur": 12.5}
        for i in range(450)
    ]


def test_cli_then_api_on_one_redis_ledger_publish_the_stored_bytes(fresh_redis: Any, tmp_path: Path, capsys) -> None:
    """The CLI replays into Redis first; the API replaying the range gets the same bytes back and charges nothing."""
    events = tmp_path / "events.jsonl"
    events.write_text("".join(json.dumps(e) + "\n" for e in _events()))
    out = tmp_path / "releases.jsonl"
    span = ["--from", str(FUTURE), "--to", str(FUTURE + 1800)]
    assert main(["replay", str(WEB), str(events), "--ledger", fresh_redis.url, "--out", str(out), *span]) == 0
    capsys.readouterr()
    cli = out.read_bytes().splitlines()
    assert len(cli) > 50

    topology = dpstream.load_topology(WEB)
    with dpstream.open_ledger(fresh_redis.url, topology) as ledger:
        again = dpstream.replay(topology, _events(), start=FUTURE, end=FUTURE + 1800, ledger=ledger)
        assert ledger.scopes() == ["web-daily"]
        assert ledger.ledger_id is not None
    assert [r.raw for r in again] == cli  # the ledger's stored records: no fresh noise for a known release
    assert again.release_counts["duplicate"] == len(cli) and again.release_counts["published"] == 0
    assert {r.record["ledger"] for r in again} == {again.ledger_id}


def test_a_redis_url_opens_and_closes_a_ledger_around_one_replay(fresh_redis: Any) -> None:
    """replay(ledger=URL) charges a Redis ledger and names it in every record; a second run is all duplicates."""
    first = dpstream.replay(WEB, _events(), start=FUTURE, end=FUTURE + 600, ledger=fresh_redis.url)
    second = dpstream.replay(WEB, _events(), start=FUTURE, end=FUTURE + 600, ledger=fresh_redis.url)
    assert first.ledger_id is not None and first.release_counts["published"] == len(first) > 0
    assert [r.raw for r in second] == [r.raw for r in first]
    assert second.release_counts["duplicate"] == len(first)


def test_an_unreachable_redis_is_the_ledgers_own_error() -> None:
    """A Redis nobody listens on raises LedgerUnavailable (the CLI's exit-1 class), not a traceback of the client."""
    from dpstream.workers.ledger import LedgerUnavailable

    with pytest.raises(LedgerUnavailable):
        dpstream.open_ledger("redis://127.0.0.1:1/0")
