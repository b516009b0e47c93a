"""Budget exhaustion end to end: once a scope's cap is spent, releases stop, are refused and counted,
nothing is published."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.units import chargeable_float
from tests.e2e.harness import deploy, event, poll, releases, send

pytestmark = pytest.mark.e2e

WINDOW = 2


async def _block(redis_url: str, topology, pid: str):
    ledger = await open_ledger(redis_url, topology)
    try:
        return next((b for b in await ledger.history("b") if b.period_id == pid), None)
    finally:
        await ledger.close()


async def _spend_the_rest(redis_url: str, topology, pid: str, start: int) -> None:
    """Another deployment drawing on the same scope spends everything left of the cap (reserve included)."""
    ledger = await open_ledger(redis_url, topology)
    try:
        block = next(b for b in await ledger.history("b") if b.period_id == pid)
        rest = chargeable_float(block.cap_units - block.spent_units)
        request = ReleaseRequest(
            "other-deployment", "b", pid, "views", start, start + WINDOW, rest, b"{}", may_use_reserve=True
        )
        assert (await ledger.charge(request)).outcome is Outcome.CHARGED
    finally:
        await ledger.close()


def test_exhausted_budget_stops_releases_refuses_and_counts(tmp_path: Path, kafka_broker, fresh_redis) -> None:
    """A tiny budget: windows release until the cap is spent; later windows are refused by the ledger and counted."""
    dep = deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url, epsilon=0.05)
    try:
        t0 = (int(time.time()) // WINDOW + 2) * WINDOW
        pid = period_id(86_400, t0)
        dep.start_worker("w1")
        send(dep.bootstrap, dep.source_topic, [event(f"u{i}", t0 + 0.5) for i in range(20)])
        send(dep.bootstrap, dep.source_topic, [event("u0", t0 + WINDOW + 0.5)])  # moves the watermark past t0
        first = poll(lambda: len(releases(dep.bootstrap, dep.topology.sinks.releases)) >= 2 or None, timeout_s=120)
        assert first, dep.log("w1")[-3000:]

        asyncio.run(_spend_the_rest(dep.redis_url, dep.topology, pid, t0))
        later = [event(f"u{i}", t0 + k * WINDOW + 0.5) for k in (2, 3) for i in range(20)]
        send(dep.bootstrap, dep.source_topic, later)

        def refused_enough():
            block = asyncio.run(_block(dep.redis_url, dep.topology, pid))
            return block if block is not None and block.refused >= 4 else None

        block = poll(refused_enough, timeout_s=120)
        assert block is not None, dep.log("w1")[-3000:]
        assert block.spent_units == block.cap_units  # the cap is spent exactly, never passed
        published = releases(dep.bootstrap, dep.topology.sinks.releases)
        assert len(published) >= 2  # the windows before exhaustion went out
        assert not [r for r in published if r["window"]["start_epoch"] >= t0 + 2 * WINDOW]  # none after it
    finally:
        dep.stop_all()
