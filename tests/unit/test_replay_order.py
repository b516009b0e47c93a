"""Replay releases windows in close-time order across metrics, as a live worker does, so adaptive
pricing sees the other metrics' releases as they come (not all of one metric's range first)."""

from __future__ import annotations

import asyncio
import json

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.runtime.replay import replay_lines

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1h}
metrics:
  active:
    source: clicks
    budget: b
    weight: 1
    window: {hopping: 5m, every: 1m}
    aggregate: count_units
    mechanism: gaussian
  views:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""

_T0 = 1_796_000_400 - 1_796_000_400 % 3600


def test_a_hopping_metric_listed_first_leaves_the_others_their_budget() -> None:
    """Windows straddling each hour are charged to both hours; released in time order no release of
    the 3 hours is refused (released metric by metric, the later hours' pools ran out)."""
    topo = load_topology_text(_YAML)
    lines = [json.dumps({"user_id": f"u{i % 40}", "ts": _T0 + i * 7}).encode() for i in range(3 * 3600 // 7)]

    async def go():
        ledger = await open_ledger("memory", topo, clock=lambda: _T0)

        async def publish(value: bytes, key: bytes) -> None:
            return None

        return await replay_lines(topo, lines, ledger, publish, start=_T0, end=_T0 + 3 * 3600)

    summary = asyncio.run(go())
    snap = summary.releases.snapshot()
    assert snap["published"] == 3 * 60 + (3 * 60 - 4)  # every tumbling window, every whole hopping one
    assert snap["refused_budget"] == 0 and snap["refused_breaker"] == 0, summary.releases.reasons
