"""Adaptive pricing is exact across processes: two releasers on one scope (each with its own Redis
connection) charge exactly what one serialized releaser charges for the same order of charges."""

from __future__ import annotations

import asyncio
import random
from typing import Any

import pytest

from dpstream.topology.model import Topology
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import AuditKind, Ledger, Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.ledger.types import ChargeResult, PendingRelease, Quote, StoredCharge
from dpstream.workers.release import Releaser

DAY = 86_400
HOUR = 3_600
T0 = 1_796_000_000
P0 = (T0 // DAY) * DAY


def _topology() -> Topology:
    """One pure scope, one hourly count metric: 24 releases a period share the pool adaptively."""
    return one_scope_topology(epsilon=1.0, reserve=0.2, warn_at=0.9, metrics=(("m", 1.0, HOUR, HOUR, False),))


async def _sink(value: bytes, key: bytes) -> None:
    """A releases topic that accepts everything (the charges are what is compared)."""


@pytest.fixture(params=["memory", "redis"])
def where(request: pytest.FixtureRequest) -> str:
    """Where the ledger lives: 'memory' or the fresh session Redis."""
    if request.param == "memory":
        return "memory"
    return str(request.getfixturevalue("fresh_redis").url)


class _Gated:
    """A real ledger whose quote/charge calls wait on events, to force one interleaving of two
    processes: the ReleaseLedger seam, nothing of Redis replaced."""

    def __init__(self, ledger: Ledger, before_charge: asyncio.Event | None, after_quote: asyncio.Event | None) -> None:
        self.ledger = ledger
        self.before_charge = before_charge
        self.after_quote = after_quote
        self.after_charge = asyncio.Event()
        self.quotes = 0
        self.outcomes: list[Outcome] = []

    @property
    def ledger_id(self) -> str | None:
        return self.ledger.ledger_id

    async def quote(self, metric: str, window_start: int, window_end: int, **order: Any) -> Quote:
        q = await self.ledger.quote(metric, window_start, window_end, **order)
        self.quotes += 1
        if self.after_quote is not None:
            self.after_quote.set()
        return q

    async def charge(self, req: ReleaseRequest) -> ChargeResult:
        if self.before_charge is not None:
            await self.before_charge.wait()
        r = await self.ledger.charge(req)
        self.outcomes.append(r.outcome)
        self.after_charge.set()
        return r

    async def commit(self, scope: str, release_id: str) -> bool:
        return await self.ledger.commit(scope, release_id)

    async def stored_payload(self, scope: str, release_id: str) -> bytes | None:
        return await self.ledger.stored_payload(scope, release_id)

    async def stored_charge(self, scope: str, release_id: str) -> StoredCharge | None:
        return await self.ledger.stored_charge(scope, release_id)

    async def charged_ends(
        self, scope: str, period_id: str, since: int | None = None
    ) -> tuple[int, dict[str, dict[str, int]]]:
        return await self.ledger.charged_ends(scope, period_id, since)

    async def stored_charges(self, scope: str, release_ids: list[str]) -> dict[str, StoredCharge]:
        return await self.ledger.stored_charges(scope, release_ids)

    async def pending(self, older_than_s: float) -> list[PendingRelease]:
        return await self.ledger.pending(older_than_s)


async def _charged_units(ledger: Ledger) -> list[tuple[str, str, int]]:
    """(kind, release_id, cost units) of every charge and refusal in the audit stream, in the order
    they landed."""
    return [
        (e.kind.value, e.fields["release_id"], int(e.fields["cost"]))
        for e in await ledger.audit("s")
        if e.kind in (AuditKind.CHARGE, AuditKind.REFUSAL)
    ]


async def _serial(order: list[int]) -> list[tuple[str, str, int]]:
    """What one releaser charges for the windows (hour offsets) released one after another."""
    topo = _topology()
    ledger = await open_ledger("memory", topo, clock=ManualClock(T0))
    rel = Releaser(topo, ledger)
    for h in order:
        await rel.release("m", (P0 + h * HOUR, P0 + (h + 1) * HOUR), {"": 5}, _sink)
    return await _charged_units(ledger)


def test_interleaved_quotes_charge_as_serialized(fresh_redis: Any) -> None:
    """Two processes quote from the same ledger state (hour 10 and hour 3), then charge in turn: the
    second charge is priced again from the state after the first (it was stale), and both cost what
    one releaser charges for them in either order: each is priced as in the period's public order,
    the hours before it not charged yet as if they were (`allocation.price_in_order`). On the old
    code (quote → charge serialized only within a process) hour 3 was charged the share it was
    quoted before hour 10's charge."""

    async def body() -> tuple[
        list[tuple[str, str, int]], list[tuple[str, str, int]], list[tuple[str, str, int]], _Gated
    ]:
        topo = _topology()
        a_ledger = await open_ledger(fresh_redis.url, topo, clock=ManualClock(T0))
        b_ledger = await open_ledger(fresh_redis.url, topo, clock=ManualClock(T0))
        b_quoted = asyncio.Event()
        a = _Gated(a_ledger, before_charge=b_quoted, after_quote=None)
        b = _Gated(b_ledger, before_charge=a.after_charge, after_quote=b_quoted)
        ra, rb = Releaser(topo, a), Releaser(topo, b)
        await asyncio.gather(
            ra.release("m", (P0 + 10 * HOUR, P0 + 11 * HOUR), {"": 5}, _sink),
            rb.release("m", (P0 + 3 * HOUR, P0 + 4 * HOUR), {"": 7}, _sink),
        )
        got = await _charged_units(a_ledger)
        await a_ledger.close()
        await b_ledger.close()
        return got, await _serial([10, 3]), await _serial([3, 10]), b

    got, serial, reversed_serial, b = asyncio.run(body())
    assert got == serial
    assert b.outcomes == [Outcome.STALE_QUOTE, Outcome.CHARGED]
    assert sorted(units for *_, units in serial) == sorted(units for *_, units in reversed_serial)


def test_racing_releasers_match_a_serial_replay(fresh_redis: Any) -> None:
    """Two releasers on separate connections release 24 hourly windows in a shuffled order, 3 at a
    time each, unsynchronised: whatever order the ledger decided them in, replaying that order
    through one serialized releaser charges (or refuses) every release alike, to the unit, and the
    total stays within the pool. (Off plan: a late window released early takes a large share.)"""

    async def body() -> tuple[list[tuple[str, str, int]], list[tuple[str, str, int]], int]:
        topo = _topology()
        order = list(range(24))
        random.Random(11).shuffle(order)
        ledgers = [await open_ledger(fresh_redis.url, topo, clock=ManualClock(T0)) for _ in range(2)]
        releasers = [Releaser(topo, ledger) for ledger in ledgers]
        slots = [asyncio.Semaphore(3), asyncio.Semaphore(3)]

        async def one(k: int, h: int) -> None:
            async with slots[k]:
                await releasers[k].release("m", (P0 + h * HOUR, P0 + (h + 1) * HOUR), {"": h}, _sink)

        await asyncio.gather(*(one(i % 2, h) for i, h in enumerate(order)))
        got = await _charged_units(ledgers[0])
        status = await ledgers[0].status("s")
        for ledger in ledgers:
            await ledger.close()
        by_rid = {releasers[0].release_id("m", P0 + h * HOUR, P0 + (h + 1) * HOUR): h for h in range(24)}
        landed = [by_rid[rid] for _, rid, _ in got]
        pool = status.cap_units - int(round(0.2 * status.cap_units))
        assert sum(units for kind, _, units in got if kind == "charge") <= pool
        return got, await _serial(landed), len(landed)

    got, serial, n = asyncio.run(body())
    assert n == 24  # every window was decided once: charged or refused
    assert got == serial


def test_stale_quote_writes_nothing(where: str) -> None:
    """Both backends: a charge quoted at an old spend version (a charge or a grant landed since) is
    answered STALE_QUOTE and changes nothing (no spend, no refusal, no audit entry); re-quoted, it is
    charged; a charge without a quoted version is not checked."""

    async def body() -> None:
        topo = _topology()
        ledger = await open_ledger(where, topo, clock=ManualClock(T0))
        pid = period_id(DAY, P0)

        def req(h: int, cost: float, version: int | None) -> ReleaseRequest:
            return ReleaseRequest(
                f"r{h}", "s", pid, "m", P0 + h * HOUR, P0 + (h + 1) * HOUR, cost, b"{}", quoted_version=version
            )

        q0 = await ledger.quote("m", P0, P0 + HOUR)
        assert q0.version == 0
        first = await ledger.charge(req(0, q0.cost, q0.version))
        assert first.outcome is Outcome.CHARGED
        stale_q = await ledger.quote("m", P0 + HOUR, P0 + 2 * HOUR)
        assert stale_q.version == 1
        await ledger.charge(req(5, 0.1, None))  # unchecked, off plan: another writer's charge
        before = (await ledger.status("s"), len(await ledger.audit("s")))
        stale = await ledger.charge(req(1, stale_q.cost, stale_q.version))
        assert stale.outcome is Outcome.STALE_QUOTE
        assert "version is now 2" in stale.reason
        after = (await ledger.status("s"), len(await ledger.audit("s")))
        assert after == before
        assert await ledger.stored_payload("s", "r1") is None
        fresh = await ledger.quote("m", P0 + HOUR, P0 + 2 * HOUR)
        assert fresh.version == 2
        assert fresh.cost != stale_q.cost
        assert (await ledger.charge(req(1, fresh.cost, fresh.version))).outcome is Outcome.CHARGED
        await ledger.grant_reserve("s", 0.01, "more room", "ops")
        granted_q = await ledger.quote("m", P0 + 2 * HOUR, P0 + 3 * HOUR)
        assert granted_q.version == 4
        assert (await ledger.charge(req(2, granted_q.cost, 3))).outcome is Outcome.STALE_QUOTE
        dup = await ledger.charge(req(0, q0.cost, 0))  # a known release_id answers duplicate first
        assert dup.outcome is Outcome.DUPLICATE
        await ledger.close()

    asyncio.run(body())
