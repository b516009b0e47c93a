"""The deployment start S: `start:` when declared, else the first start of the topology version, kept in Redis."""

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
        other = await resolve_schedule_start(replace(topo, start_s=1_795_000_000), fresh_redis.url, now=1_796_050_000)
        return first, later, other

    first, later, declared = asyncio.run(body())
    assert first == later == 1_796_000_000
    assert declared == 1_795_000_000  # a declared start wins and is not taken from the ledger
