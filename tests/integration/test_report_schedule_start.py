"""The report reads the schedule start S recorded in a Redis ledger for the topology's version, and
never records one itself (that would fix S at the first report instead of the first worker's start)."""

from __future__ import annotations

import asyncio
from typing import Any

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.report.collect import schedule_start_read

_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1h, reserve: 0.2, warn_at: 0.8}
metrics:
  minute: {source: s, budget: b, weight: 1, window: {tumbling: 1m}, aggregate: count, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""

S = 1_796_000_400


def test_the_report_reads_the_recorded_start_and_records_none(fresh_redis: Any) -> None:
    """Before any worker: None, and still none recorded after the read; once recorded: that start."""

    async def run() -> tuple[int | None, int | None, int | None]:
        topo = load_topology_text(_YAML)
        ledger = await open_ledger(fresh_redis.url, topo)
        try:
            before = await schedule_start_read(ledger, topo)
            still = await ledger.recorded_version_schedule_start(topo.topology_version)
            await ledger.version_schedule_start(topo.topology_version, S)  # what the first worker does
            return before, still, await schedule_start_read(ledger, topo)
        finally:
            await ledger.close()

    before, still, recorded = asyncio.run(run())
    assert before is None and still is None and recorded == S
