"""Key namespaces: two deployments share one Redis, with the same scope name, and keep independent budgets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.keys import ScopeKeys, in_namespace
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology

DAY = 86_400
T0 = 1_796_000_000
P0 = (T0 // DAY) * DAY
PID = period_id(DAY, P0)


def _req(rid: str, cost: float) -> ReleaseRequest:
    return ReleaseRequest(rid, "s", PID, "m", P0, P0 + DAY, cost, b'{"id":"%s","ratio_after":null}' % rid.encode())


def test_namespaced_keys_keep_the_scope_hash_tag() -> None:
    """A namespace goes between `dpstream:` and the hash tag; the default namespace keeps the old keys."""
    assert ScopeKeys("web", "prod").period("2026-11-30") == "dpstream:prod:{web}:period:2026-11-30"
    assert ScopeKeys("web").period("2026-11-30") == "dpstream:{web}:period:2026-11-30"
    assert in_namespace("dpstream:{deploy}:start:v1", "prod") == "dpstream:prod:{deploy}:start:v1"
    with pytest.raises(ConfigError, match=r"namespace 'a:b': use 1-64 letters"):
        ScopeKeys("web", "a:b")


def test_two_namespaces_share_one_redis_with_independent_budgets(fresh_redis: Any) -> None:
    """Deployments `blue` and `green` use scope `s` on one Redis: a charge, a refusal, a breaker and a
    schedule start in one are invisible to the other, and nothing lands under the default keys."""

    async def body() -> None:
        topo = one_scope_topology(epsilon=1.0, reserve=0.0, warn_at=1.0)
        blue = await open_ledger(f"{fresh_redis.url}?namespace=blue", topo, clock=ManualClock(T0))
        green = await open_ledger(f"{fresh_redis.url}?namespace=green", topo, clock=ManualClock(T0))
        try:
            assert (await blue.charge(_req("r1", 0.75))).outcome is Outcome.CHARGED
            assert (await blue.charge(_req("r2", 0.5))).outcome is Outcome.REFUSED  # blue's budget is spent
            assert (await green.charge(_req("r2", 0.5))).outcome is Outcome.CHARGED  # green's is not
            assert (await green.charge(_req("r1", 0.25))).outcome is Outcome.CHARGED  # same id, another deployment
            await blue.open_breaker("s", "drill", "alice")
            blue_status, green_status = await blue.status("s"), await green.status("s")
            assert blue_status.spent_units == 750_000_000_000
            assert green_status.spent_units == 750_000_000_000
            assert blue_status.breaker is not None and green_status.breaker is None
            assert await blue.stored_payload("s", "r2") is None
            assert await green.stored_payload("s", "r2") is not None
            assert await blue.version_schedule_start("v1", 100) == 100
            assert await green.version_schedule_start("v1", 200) == 200
        finally:
            await blue.close()
            await green.close()
        with fresh_redis.client() as client:
            keys = [k.decode() for k in client.scan_iter(count=1000)]
        assert keys and all(k.startswith(("dpstream:blue:", "dpstream:green:")) for k in keys), sorted(keys)[:5]

    asyncio.run(body())


def test_bad_namespace_in_the_url_is_one_line(fresh_redis: Any) -> None:
    """A namespace that would break the hash tag is refused before anything is written."""
    with pytest.raises(ConfigError, match=r"namespace '\{x\}': use 1-64 letters"):
        asyncio.run(open_ledger(f"{fresh_redis.url}?namespace={{x}}", one_scope_topology()))
