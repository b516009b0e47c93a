"""The schedule start S: `start:` when declared, else the first start of the topology version, kept in Redis."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from typing import Any

from dpstream.workers.ledger.testing import one_scope_topology
from dpstream.workers.runtime.schedule import resolve_schedule_start


def test_the_first_start_of_a_version_is_recorded_once(fresh_redis: Any) -> None:
    """Every later worker, restart or rebalance of the same version reads the first one's S."""
    topo = one_scope_topology()

    async def body() -> tuple[int, int, int]:
        first = await resolve_schedule_start(topo, fresh_redis.url, now=1_796_000_000)
        later = await resolve_schedule_start(topo, fresh_redis.url, now=1_796_050_000)
        other = await resolve_schedule_start(
            replace(topo, schedule_start=1_795_000_000), fresh_redis.url, now=1_796_050_000
        )
        return first, later, other

    first, later, declared = asyncio.run(body())
    assert first == later == 1_796_000_000
    assert declared == 1_795_000_000  # a declared start wins and is not taken from the ledger


def test_every_release_side_prices_from_the_same_recorded_start(fresh_redis: Any) -> None:
    """Two workers of one version (started an hour apart, the first mid-day) read the first one's S from
    the ledger and so quote the first period alike; that S is the ingest's (`resolve_schedule_start`)."""
    from dpstream.workers.ledger import open_ledger
    from dpstream.workers.runtime.schedule import schedule_start_of

    day = 86_400
    p0 = (1_796_000_000 // day) * day
    s = p0 + 6 * 3600 + 1800  # 06:30
    topo = one_scope_topology(
        metrics=(("hourly", 1.0, 3600, 3600, False), ("daily", 3.0, day, day, False), ("hop", 2.0, 7200, 3600, False))
    )

    async def body() -> tuple[list[int | None], list[float], float, int]:
        a = await open_ledger(fresh_redis.url, topo)
        b = await open_ledger(fresh_redis.url, topo)
        plain = await open_ledger(fresh_redis.url, topo)
        try:
            a.use_schedule_start(await schedule_start_of(topo, a, now=s))
            b.use_schedule_start(await schedule_start_of(topo, b, now=s + 3600))
            quotes = [(await x.quote("hourly", p0 + 7 * 3600, p0 + 8 * 3600)).cost for x in (a, b)]
            unpriced = (await plain.quote("hourly", p0 + 7 * 3600, p0 + 8 * 3600)).cost
            ingest = await resolve_schedule_start(topo, fresh_redis.url, now=s + 7200)
            return [a.schedule_start, b.schedule_start], quotes, unpriced, ingest
        finally:
            for x in (a, b, plain):
                await x.close()

    starts, quotes, unpriced, ingest = asyncio.run(body())
    assert starts == [s, s] and ingest == s
    assert quotes[0] == quotes[1] > unpriced  # the daily window's share is not held back from S on


def test_reading_the_recorded_start_records_nothing(fresh_redis: Any) -> None:
    """A reader (the budget gauges) sees None before any worker recorded S, and the first worker's S after;
    its read does not record a start of its own."""
    from dpstream.workers.ledger import open_ledger

    topo = one_scope_topology()

    async def body() -> tuple[int | None, int | None, int, int | None]:
        reader = await open_ledger(fresh_redis.url, None)
        try:
            before = await reader.recorded_version_schedule_start(topo.topology_version)
            again = await reader.recorded_version_schedule_start(topo.topology_version)
            first = await resolve_schedule_start(topo, fresh_redis.url, now=1_796_000_000)
            after = await reader.recorded_version_schedule_start(topo.topology_version)
            return before, again, first, after
        finally:
            await reader.close()

    before, again, first, after = asyncio.run(body())
    assert before is None and again is None
    assert first == after == 1_796_000_000  # the worker's start, not the reader's


def test_the_exporters_gauges_count_the_plan_from_the_recorded_start(fresh_redis: Any) -> None:
    """An exporter (a read-only ledger of its own, without S) reads the S a worker recorded in Redis:
    its planned figures count from S, as the workers' ledgers price; before any record, from the period start."""
    from dpstream.topology.plan import build_plan
    from dpstream.workers.ledger import open_ledger
    from dpstream.workers.ledger.testing import ManualClock
    from dpstream.workers.telemetry.budget import BudgetReader, planned_ratio, planned_spend_rate

    day = 86_400
    p0 = (1_796_000_000 // day) * day
    s = p0 + 6 * 3600 + 1800
    topo = one_scope_topology(
        metrics=(("hourly", 1.0, 3600, 3600, False), ("daily", 3.0, day, day, False), ("hop", 2.0, 7200, 3600, False))
    )
    plan = build_plan(topo).scope("s")
    clock = ManualClock(p0 + 12 * 3600)

    async def body() -> list[tuple[float | None, float | None]]:
        worker = await open_ledger(fresh_redis.url, topo, clock=clock)  # registers the scope
        exporter = await open_ledger(fresh_redis.url, None, clock=clock)
        try:
            reader = BudgetReader(topo, clock=clock)
            before = (await reader.read(exporter))[0]
            await resolve_schedule_start(topo, fresh_redis.url, now=s)
            after = (await reader.read(exporter))[0]
            return [(f.planned_ratio, f.planned_spend_rate) for f in (before, after)]
        finally:
            await worker.close()
            await exporter.close()

    before, after = asyncio.run(body())
    now = p0 + 12 * 3600
    assert before == (planned_ratio(plan, p0, p0 + day, now), planned_spend_rate(plan))
    assert after == (planned_ratio(plan, p0, p0 + day, now, s), plan.pool / (p0 + day - s))
