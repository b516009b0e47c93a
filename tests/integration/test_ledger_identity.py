"""A ledger namespace's id, on both backends: created once by the first open (set-if-absent), the same
for every later or concurrent open, different per namespace, and named by every release record; the
in-process ledger has none and its records say `"ledger": null` (charged to no ledger)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.keys import LEDGER_ID_KEY, in_namespace
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.runtime.replay import replay_lines

DAY = 86_400
T0 = 1_796_000_000
P0 = T0 - T0 % DAY
YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, period: 1d}
metrics:
  hourly: {source: clicks, budget: b, window: {tumbling: 1h}, aggregate: count, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""


@pytest.fixture(params=["memory", "redis"])
def where(request: pytest.FixtureRequest) -> str:
    """Where the ledger lives: 'memory' or the fresh session Redis."""
    if request.param == "memory":
        return "memory"
    return str(request.getfixturevalue("fresh_redis").url)


def _ids(where: str, opens: int, namespace: str | None = None) -> list[str | None]:
    """The ledger id each of `opens` concurrent opens (then one more, after they closed) resolved."""
    url = where if namespace is None or where == "memory" else f"{where}?namespace={namespace}"
    topo = one_scope_topology()

    async def one() -> str | None:
        ledger = await open_ledger(url, topo, clock=ManualClock(T0))
        try:
            return ledger.ledger_id
        finally:
            await ledger.close()

    async def body() -> list[str | None]:
        first = await asyncio.gather(*(one() for _ in range(opens)))
        return [*first, await one()]

    return asyncio.run(body())


def test_the_id_is_created_once_and_read_by_every_later_open(where: str) -> None:
    """Redis: five concurrent opens of a fresh namespace and a reopen after them all name one 32-hex id
    (SET NX: the first proposal wins). In-process: no id, every time."""
    ids = _ids(where, 5)
    if where == "memory":
        assert ids == [None] * 6
        return
    assert len(set(ids)) == 1 and isinstance(ids[0], str) and len(ids[0]) == 32, ids
    assert int(ids[0], 16) >= 0


def test_each_namespace_has_its_own_id(where: str, request: pytest.FixtureRequest) -> None:
    """Two namespaces on one Redis get different ids, each stored under its own namespaced key; the
    default namespace's key is left alone until the default namespace is opened."""
    blue, green = _ids(where, 1, "blue")[0], _ids(where, 1, "green")[0]
    if where == "memory":
        assert blue is None and green is None
        return
    assert blue != green
    redis = request.getfixturevalue("fresh_redis")
    with redis.client() as client:
        assert client.get(in_namespace(LEDGER_ID_KEY, "blue")).decode() == blue
        assert client.get(in_namespace(LEDGER_ID_KEY, "green")).decode() == green
        assert client.get(LEDGER_ID_KEY) is None


def test_a_read_only_open_and_recorded_ledger_id_create_no_id(where: str) -> None:
    """Opening without a topology (the CLI's read calls, the exporter) and `recorded_ledger_id` (verify)
    only read: a fresh ledger still has no id after them."""

    async def body() -> tuple[str | None, str | None]:
        reader = await open_ledger(where, None, clock=ManualClock(T0))
        try:
            before = await reader.recorded_ledger_id()
        finally:
            await reader.close()
        writer = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
        try:
            return before, await writer.recorded_ledger_id()
        finally:
            await writer.close()

    before, after = asyncio.run(body())
    assert before is None
    assert after is None if where == "memory" else (after is not None and len(after) == 32)


def test_every_release_record_names_the_ledger_it_was_charged_to(where: str) -> None:
    """A replay's records carry `ledger`: the Redis namespace's id, or null for the in-process ledger."""
    topo = load_topology_text(YAML)

    async def body() -> tuple[list[dict[str, Any]], str | None]:
        ledger = await open_ledger(where, topo, clock=ManualClock(P0 + 3 * 3600), schedule_start=P0)
        out: list[dict[str, Any]] = []

        async def publish(value: bytes, key: bytes) -> None:
            out.append(json.loads(value))

        try:
            await replay_lines(topo, [], ledger, publish, start=P0, end=P0 + 2 * 3600)
            return out, await ledger.recorded_ledger_id()
        finally:
            await ledger.close()

    records, stored = asyncio.run(body())
    assert len(records) == 2 and all("ledger" in r for r in records)
    assert {r["ledger"] for r in records} == {stored}
    assert (stored is None) is (where == "memory")
