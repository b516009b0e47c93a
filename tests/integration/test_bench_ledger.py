"""`dpstream bench ledger` on a real Redis: every charge it times is a fresh release (none answered as a
duplicate from the stored payload), and each phase reports its client CPU and Redis time per op."""

from __future__ import annotations

import asyncio
from typing import Any

import redis

from dpstream.workers.bench.ledger import run_bench


def test_every_timed_charge_is_a_new_release_and_each_phase_is_costed(fresh_redis: Any) -> None:
    result = asyncio.run(run_bench(fresh_redis.url, clients=4, seconds=0.4))
    with redis.Redis.from_url(fresh_redis.url) as admin:
        records = sum(1 for _ in admin.scan_iter("dpstream:{bench}:release:*"))
    assert result.charge.ops > 0 and result.incrby.ops > 0
    assert records == result.charge.ops  # one stored release per timed charge: both halves charge anew
    for phase in (result.incrby, result.charge):
        assert phase.client_cpu_us > 0
        assert phase.server_us is not None and phase.server_us > 0
