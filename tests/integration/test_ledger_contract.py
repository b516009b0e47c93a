"""The ledger contract, run against both backends (in-process and real Redis): same inputs, same answers."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.topology.loader import load_topology
from dpstream.topology.model import Accounting, WarningPolicy
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import AuditKind, Ledger, Outcome, ReleaseRequest, State, open_ledger
from dpstream.workers.ledger.testing import ManualClock, charge_on_plan, one_scope_topology
from dpstream.workers.ledger.units import grant_to_units

DAY = 86_400
T0 = 1_796_000_000  # 2026-11-30T... (inside one UTC day)
P0 = (T0 // DAY) * DAY
SEED = "topology/examples/seed-adaptive.yaml"
RECORD = b'{"release_id":"%s","values":{"all":%d},"budget":{"scope":"s","ratio_after":null}}'


def run(coro: Coroutine[Any, Any, Any]) -> Any:
    return asyncio.run(coro)


@pytest.fixture(params=["memory", "redis"])
def where(request: pytest.FixtureRequest) -> str:
    """Where the ledger lives: 'memory' or the fresh session Redis."""
    if request.param == "memory":
        return "memory"
    return request.getfixturevalue("fresh_redis").url


def req(
    rid: str,
    cost: float,
    *,
    scope: str = "s",
    metric: str = "m",
    start: int = P0,
    size: int = DAY,
    may_use_reserve: bool = False,
    value: int = 1,
) -> ReleaseRequest:
    return ReleaseRequest(
        rid,
        scope,
        period_id(DAY, start),
        metric,
        start,
        start + size,
        cost,
        RECORD % (rid.encode(), value),
        may_use_reserve,
    )


async def _seed(where: str) -> tuple[Ledger, list[float], list[Any]]:
    ledger = await open_ledger(where, load_topology(SEED), clock=ManualClock(T0))
    quotes, results = [], []
    for m in ("diagnosis", "income", "postcode", "member_tier"):
        q = await ledger.quote(m, P0, P0 + DAY)
        quotes.append(q.cost)
        results.append(
            await ledger.charge(
                ReleaseRequest(f"r-{m}", q.scope, q.period_id, m, P0, P0 + DAY, q.cost, b'{"ratio_after":null}')
            )
        )
    return ledger, quotes, results


def test_seed_002_sequence(where: str) -> None:
    """The worked budget example (four metrics, weights 4:3:2:1): allowances 0.64, 0.48, 0.32, 0.16, ratio 0.8
    is warning, a next 0.1 is refused unless from the reserve."""

    async def body() -> None:
        ledger, quotes, results = await _seed(where)
        assert quotes == pytest.approx([0.64, 0.48, 0.32, 0.16], abs=1e-12)
        assert [r.outcome for r in results] == [Outcome.CHARGED] * 4
        assert results[-1].ratio_after == 0.8 and results[-1].state is State.WARNING
        assert results[-1].payload == b'{"ratio_after":0.800000}'
        pid = period_id(DAY, P0)
        extra = await ledger.charge(ReleaseRequest("x", "columns", pid, "diagnosis", P0, P0 + DAY, 0.1, b"{}"))
        assert extra.outcome is Outcome.REFUSED and "pool exhausted" in extra.reason
        from_reserve = await ledger.charge(
            ReleaseRequest("y", "columns", pid, "diagnosis", P0, P0 + DAY, 0.1, b"{}", may_use_reserve=True)
        )
        assert from_reserve.outcome is Outcome.CHARGED and from_reserve.ratio_after == pytest.approx(0.85)
        await ledger.close()

    run(body())


def test_duplicate_returns_first_payload_and_charges_once(where: str) -> None:
    """A known release_id returns the first stored bytes (ratio filled in) and is charged once."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
        first = await ledger.charge(req("a", 0.25, value=1))
        again = await ledger.charge(req("a", 0.25, value=2))
        assert first.outcome is Outcome.CHARGED and again.outcome is Outcome.DUPLICATE
        assert (
            again.payload
            == first.payload
            == b'{"release_id":"a","values":{"all":1},"budget":{"scope":"s","ratio_after":0.250000}}'
        )
        status = await ledger.status("s")
        assert (status.charged, status.spent_units) == (1, 250_000_000_000)
        await ledger.close()

    run(body())


def test_stored_payload_looks_up_known_releases_only(where: str) -> None:
    """stored_payload returns the final stored bytes of a known release_id and None for an unknown one."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
        first = await ledger.charge(req("a", 0.25, value=1))
        assert await ledger.stored_payload("s", "a") == first.payload
        assert await ledger.stored_payload("s", "never-charged") is None
        await ledger.close()

    run(body())


def test_stored_charge_holds_what_the_period_paid(where: str) -> None:
    """stored_charge returns a known release's stored bytes and the units its period paid: under
    `max_windows: 1` the first charge pays its cost, a later one only what it raises the largest by."""

    async def body() -> None:
        topo = one_scope_topology(metrics=(("m", 1.0, 3_600, 3_600, False),), max_windows={"m": 1})
        ledger = await open_ledger(where, topo, clock=ManualClock(T0))
        first = await ledger.charge(req("a", 0.25, size=3_600))
        second = await ledger.charge(req("b", 0.3, start=P0 + 3_600, size=3_600))
        third = await ledger.charge(req("c", 0.2, start=P0 + 7_200, size=3_600))
        assert await ledger.stored_charge("s", "a") == (first.payload, 250_000_000_000)
        assert await ledger.stored_charge("s", "b") == (second.payload, 50_000_000_000)
        assert await ledger.stored_charge("s", "c") == (third.payload, 0)
        assert await ledger.stored_charge("s", "never-charged") is None
        await ledger.close()

    run(body())


def test_charges_are_rounded_up_to_units(where: str) -> None:
    """0.1 (binary 0.1000000000000000055…) is charged 100000000001 units, never less."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
        r = await ledger.charge(req("a", 0.1))
        assert r.cost_units == 100_000_000_001
        assert (await ledger.status("s")).spent_units == 100_000_000_001
        await ledger.close()

    run(body())


def test_refusal_changes_nothing_but_its_record(where: str) -> None:
    """A refused charge stores no release and no spend; the same id can be charged later."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
        refused = await ledger.charge(req("big", 0.9))  # pool is 0.8
        assert refused.outcome is Outcome.REFUSED and refused.payload == b""
        status = await ledger.status("s")
        assert (status.spent_units, status.charged, status.refused) == (0, 0, 1)
        assert await ledger.pending(0) == []
        granted = await ledger.charge(req("big", 0.5))
        assert granted.outcome is Outcome.CHARGED
        kinds = [e.kind for e in await ledger.audit("s")]
        assert kinds.count(AuditKind.REFUSAL) == 1 and kinds.count(AuditKind.CHARGE) == 1
        await ledger.close()

    run(body())


def test_pending_and_commit(where: str) -> None:
    """Reserved releases are pending with their stored bytes until committed; commit is idempotent."""

    async def body() -> None:
        clock = ManualClock(T0)
        ledger = await open_ledger(where, one_scope_topology(), clock=clock)
        r = await ledger.charge(req("a", 0.1))
        clock.advance(60)
        pending = await ledger.pending(30)
        assert [(p.release_id, p.payload) for p in pending] == [("a", r.payload)]
        assert await ledger.pending(120) == []
        assert await ledger.commit("s", "a") is True
        assert await ledger.commit("s", "a") is False
        assert await ledger.pending(0) == []
        await ledger.close()

    run(body())


def test_manual_breaker_refuses_everything_and_survives_rollover(where: str) -> None:
    """An operator-opened breaker refuses all (reserve included) across periods until closed, all audited."""

    async def body() -> None:
        clock = ManualClock(T0)
        ledger = await open_ledger(where, one_scope_topology(), clock=clock)
        with pytest.raises(ConfigError, match="reason"):
            await ledger.open_breaker("s", " ", "alice")
        assert await ledger.open_breaker("s", "incident 42", "alice") is True
        r = await ledger.charge(req("a", 0.1, may_use_reserve=True))
        assert r.outcome is Outcome.REFUSED and r.state is State.OPEN and "incident 42" in r.reason
        q = await ledger.quote("m", P0 + DAY, P0 + 2 * DAY)
        assert q.refused_reason and q.state is State.OPEN
        clock.advance(DAY)
        r2 = await ledger.charge(req("b", 0.1, start=P0 + DAY))
        assert r2.outcome is Outcome.REFUSED
        assert await ledger.close_breaker("s", "resolved", "bob") is True
        r3 = await ledger.charge(req("b", 0.1, start=P0 + DAY))
        assert r3.outcome is Outcome.CHARGED and r3.state is State.NORMAL
        trail = [(e.kind, e.fields.get("actor"), e.fields.get("reason")) for e in await ledger.audit("s")]
        assert (AuditKind.BREAKER_OPEN, "alice", "incident 42") in trail
        assert (AuditKind.BREAKER_CLOSE, "bob", "resolved") in trail
        await ledger.close()

    run(body())


def test_automatic_open_closes_with_the_new_period(where: str) -> None:
    """A release that cannot fit the cap opens the breaker for the period; the next period starts closed."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
        assert (await ledger.charge(req("a", 0.9, may_use_reserve=True))).outcome is Outcome.CHARGED
        over = await ledger.charge(req("b", 0.2, may_use_reserve=True))
        assert over.outcome is Outcome.REFUSED and over.state is State.OPEN and "budget exhausted" in over.reason
        small = await ledger.charge(req("c", 0.01, may_use_reserve=True))
        assert small.outcome is Outcome.REFUSED and "breaker open (automatic)" in small.reason
        nxt = await ledger.charge(req("d", 0.1, start=P0 + DAY))
        assert nxt.outcome is Outcome.CHARGED and nxt.ratio_after == pytest.approx(0.1)
        closes = [e for e in await ledger.audit("s") if e.kind is AuditKind.BREAKER_CLOSE]
        assert len(closes) == 1 and "rollover" in closes[0].fields["reason"]
        hist = await ledger.history("s")
        assert [h.period_id for h in hist] == [period_id(DAY, P0 + DAY), period_id(DAY, P0)]
        assert hist[1].spent_units == 900_000_000_001 and hist[0].spent_units == 100_000_000_001
        await ledger.close()

    run(body())


def test_operator_grant_opens_the_reserve_to_ordinary_metrics(where: str) -> None:
    """After the pool is spent, an audited operator grant lets ordinary releases draw that much reserve."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
        assert (await ledger.charge(req("a", 0.75))).outcome is Outcome.CHARGED
        assert (await ledger.charge(req("b", 0.0625))).outcome is Outcome.REFUSED
        await ledger.grant_reserve("s", 0.0625, "quarterly report", "carol")
        assert (await ledger.charge(req("b", 0.0625))).outcome is Outcome.CHARGED
        assert (await ledger.charge(req("c", 0.06))).outcome is Outcome.REFUSED
        grants = [e for e in await ledger.audit("s") if e.kind is AuditKind.GRANT]
        assert grants[0].fields["actor"] == "carol"
        await ledger.close()

    run(body())


def test_a_grant_beyond_what_is_left_to_grant_is_refused_and_writes_nothing(where: str) -> None:
    """The reserve (0.25 of cap 1) can be granted up to what is not granted yet and what the cap has left;
    more is refused with one line naming what is left, and neither the grant nor the audit moves."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(reserve=0.25), clock=ManualClock(T0))
        assert await ledger.grant_reserve("s", 0.125, "first", "carol") == grant_to_units(0.125)
        with pytest.raises(ConfigError) as too_much:
            await ledger.grant_reserve("s", 0.25, "second", "carol")
        before = [e for e in await ledger.audit("s") if e.kind is AuditKind.GRANT]
        assert await ledger.grant_reserve("s", 0.125, "the rest", "carol") == grant_to_units(0.25)
        with pytest.raises(ConfigError) as none_left:
            await ledger.grant_reserve("s", 0.001, "more", "carol")
        grants = [e for e in await ledger.audit("s") if e.kind is AuditKind.GRANT]
        await ledger.close()
        assert "only 0.125 is left to grant" in str(too_much.value) and "\n" not in str(too_much.value)
        assert "reserve is already granted in full" in str(none_left.value)
        assert [g.fields["reason"] for g in before] == ["first"]
        assert [g.fields["reason"] for g in grants] == ["first", "the rest"]

    run(body())


def test_no_grant_once_the_cap_is_spent(where: str) -> None:
    """With the whole cap spent (a may_use_reserve metric drew the reserve), a grant has nothing to widen."""

    async def body() -> None:
        topo = one_scope_topology(metrics=(("m", 1.0, 86_400, 86_400, True),))
        ledger = await open_ledger(where, topo, clock=ManualClock(T0))
        assert (await ledger.charge(req("a", 1.0, may_use_reserve=True))).outcome is Outcome.CHARGED
        with pytest.raises(ConfigError) as spent:
            await ledger.grant_reserve("s", 0.01, "too late", "carol")
        await ledger.close()
        assert "nothing left to grant" in str(spent.value) and "the cap is spent" in str(spent.value)

    run(body())


def test_config_changes_are_audited(fresh_redis: Any) -> None:
    """Registering the same config again is silent; a changed cap is one more config audit entry (Redis persists it)."""
    where = fresh_redis.url

    async def body() -> None:
        for eps in (1.0, 1.0, 2.0):
            ledger = await open_ledger(where, one_scope_topology(epsilon=eps), clock=ManualClock(T0))
            await ledger.close()
        configs = [e for e in await ledger.audit("s") if e.kind is AuditKind.CONFIG]
        assert len(configs) == 2 and "changed" in configs[1].fields["reason"]
        assert (await ledger.status("s")).cap == 2.0

    run(body())


def test_warning_stretch_and_thinning(where: str) -> None:
    """In warning, `stretch: 2` quarters a zCDP grant and `thin: 2` skips every other window."""

    async def body() -> None:
        metrics = (("m", 1.0, 3600, 3600, False),)
        for policy, check in ((WarningPolicy(stretch=2.0), "stretch"), (WarningPolicy(thin=2), "thin")):
            topo = one_scope_topology(
                accounting=Accounting.ZCDP,
                delta=1e-6,
                warn_at=0.5,
                on_warning=policy,
                metrics=metrics,
                scope=f"z{check}",
            )
            ledger = await open_ledger(where, topo, clock=ManualClock(T0))
            before = await ledger.quote("m", P0, P0 + 3600)
            cap = (await ledger.status(f"z{check}")).cap
            pid = period_id(DAY, P0)
            await ledger.charge(ReleaseRequest("big", f"z{check}", pid, "m", P0, P0 + 3600, cap * 0.6, b"{}"))
            q1 = await ledger.quote("m", P0 + 3600, P0 + 7200)
            q2 = await ledger.quote("m", P0 + 7200, P0 + 10800)
            assert q1.state is State.WARNING and before.state is State.NORMAL
            if check == "stretch":
                plain = (cap * 0.8 - cap * 0.6) / 23
                assert q1.stretched and q1.cost == pytest.approx(plain / 4, rel=1e-9)
            else:
                assert q1.thinned != q2.thinned and not (q1.ok and q2.ok)
            await ledger.close()

    run(body())


def test_reconcile_matches_after_mixed_traffic(where: str) -> None:
    """Spend rebuilt from the audit stream equals the stored spend, per period."""

    async def body() -> None:
        clock = ManualClock(T0)
        ledger = await open_ledger(where, one_scope_topology(), clock=clock)
        for i in range(20):
            await ledger.charge(req(f"r{i}", 0.05 + i / 1000, start=P0 + (i % 2) * DAY))
        report = await ledger.reconcile("s")
        assert report.ok and len(report.periods) == 2
        assert sum(p.audited_charges for p in report.periods) == sum(p.stored_charges for p in report.periods) > 0
        await ledger.close()

    run(body())


def test_both_backends_give_identical_answers(fresh_redis: Any) -> None:
    """The same script of calls yields the same outcomes, bytes, ratios, states and audit kinds on both backends."""

    async def script(where: str) -> list[Any]:
        clock = ManualClock(T0)
        ledger = await open_ledger(where, load_topology(SEED), clock=clock)
        out: list[Any] = []
        pid = period_id(DAY, P0)
        for i, (m, cost, reserve) in enumerate(
            [
                ("diagnosis", 0.7, False),
                ("income", 0.33333, False),
                ("income", 0.33333, False),
                ("postcode", 0.7, False),
                ("postcode", 0.5, True),
                ("member_tier", 0.6, True),
                ("member_tier", 0.01, False),
            ]
        ):
            r = await ledger.charge(
                ReleaseRequest(
                    f"id{i % 6}", "columns", pid, m, P0, P0 + DAY, cost, b'{"n":%d,"ratio_after":null}' % i, reserve
                )
            )
            q = await ledger.quote("diagnosis", P0, P0 + DAY)
            out.append((r.outcome, r.payload, r.reason, r.ratio_after, r.state, r.cost_units, q.cost_units, q.state))
        status = await ledger.status("columns")
        out.append((status.spent_units, status.charged, status.refused, status.state))
        out.append([(e.kind, e.fields.get("cost"), e.fields.get("state")) for e in await ledger.audit("columns")])
        await ledger.close()
        return out

    assert run(script("memory")) == run(script(fresh_redis.url))


# ---- a period's terms against the caller's, whatever registered last ------------------------------

HOUR = 3600
P1 = P0 + DAY


def _at(rid: str, cost: float, start: int, period_s: int, size: int | None = None) -> ReleaseRequest:
    """A release of the window [start, start + size) charged to its `period_s` period."""
    end = start + (size or period_s)
    return ReleaseRequest(rid, "s", period_id(period_s, start), "m", start, end, cost, RECORD % (rid.encode(), 1))


async def _second(where: str, first: Ledger, clock: ManualClock, **topo: Any) -> Ledger:
    """A second worker with its own topology on the first one's store (registered now)."""
    if where != "memory":
        return await open_ledger(where, one_scope_topology(**topo), clock=clock)
    from dpstream.workers.ledger.config import scope_configs
    from dpstream.workers.ledger.memory import MemoryLedger

    other = MemoryLedger(scope_configs(one_scope_topology(**topo)), clock=clock)
    other._store = first._store  # type: ignore[attr-defined]  # one store, two topologies (two workers, one Redis)
    other._lock = first._lock  # type: ignore[attr-defined]  # the same store's lock
    await other.register("worker-2")
    return other


async def _unchanged_but_one_refusal(ledger: Ledger, before: list[Any], rid: str, block: str) -> None:
    """Nothing but one refusal audit entry (in `block`) since `before`; nothing stored for `rid`."""
    new = (await ledger.audit("s"))[len(before) :]
    assert [(e.kind, e.fields["period"], e.fields["release_id"]) for e in new] == [(AuditKind.REFUSAL, block, rid)]
    assert await ledger.stored_payload("s", rid) is None
    assert (await ledger.reconcile("s")).ok


def test_a_charge_into_a_block_of_another_currency_is_refused(where: str) -> None:
    """A zCDP worker registered on day 2 (accepted: day 2 has no block yet) that releases a day-1 window
    is refused by day 1's pure block, one line, counted and audited there: no ρ drawn from an ε pool."""

    async def body() -> None:
        clock = ManualClock(T0)
        pure = await open_ledger(where, one_scope_topology(epsilon=1.0), clock=clock)
        assert (await pure.charge(_at("day1-a", 0.1, P0, DAY))).outcome is Outcome.CHARGED
        clock.advance(DAY)
        zcdp = await _second(where, pure, clock, accounting=Accounting.ZCDP, delta=1e-6)
        before = await zcdp.audit("s")
        [block_before] = await zcdp.history("s")
        r = await zcdp.charge(_at("day1-b", 0.05, P0, DAY))  # a new release id under the new version
        assert r.outcome is Outcome.REFUSED and "\n" not in r.reason
        assert r.reason.startswith(
            f"period terms differ: block {period_id(DAY, P0)} keeps accounting pure, this worker zcdp"
        )
        assert r.reason.endswith("or use a new scope name") and r.cost_units == 0
        [block] = await zcdp.history("s")
        assert (block.spent_units, block.charged, block.refused) == (block_before.spent_units, 1, 1)
        await _unchanged_but_one_refusal(zcdp, before, "day1-b", period_id(DAY, P0))
        assert (await zcdp.charge(_at("day2-a", 0.001, P1, DAY))).outcome is Outcome.CHARGED  # its own period
        await zcdp.close()
        await pure.close()

    run(body())


def test_a_caller_whose_cap_is_below_the_block_cap_is_refused(where: str) -> None:
    """A block whose cap is larger than the caller's refuses it (the period could spend more than the
    caller's topology promises); a caller with a larger cap charges under the block's own terms."""

    async def body() -> None:
        clock = ManualClock(T0)
        first = await open_ledger(where, one_scope_topology(epsilon=1.0), clock=clock)
        assert (await first.charge(_at("a", 0.1, P0, DAY))).outcome is Outcome.CHARGED
        clock.advance(DAY)
        smaller = await _second(where, first, clock, epsilon=0.5)
        before = await smaller.audit("s")
        r = await smaller.charge(_at("b", 0.05, P0, DAY))
        assert r.outcome is Outcome.REFUSED
        assert (
            f"block {period_id(DAY, P0)} keeps cap 1000000000000 units, this worker 500000000000 (smaller)" in r.reason
        )
        await _unchanged_but_one_refusal(smaller, before, "b", period_id(DAY, P0))
        larger = await _second(where, first, clock, epsilon=2.0)
        granted = await larger.charge(_at("c", 0.05, P0, DAY))
        assert granted.outcome is Outcome.CHARGED and granted.ratio_after == pytest.approx(0.15)  # of the block's 1.0
        for ledger in (larger, smaller, first):
            await ledger.close()

    run(body())


_HOURLY = dict(period_s=HOUR, metrics=(("m", 1.0, HOUR, HOUR, False),))


def test_a_period_length_change_mid_period_is_refused_at_registration(where: str) -> None:
    """Hourly -> daily at 10:00 (before hour 10's block opens) would open a daily block over the day's
    hourly ones: registration is refused with one line while any block lies in the new period, and the
    daily length is accepted on a day with no block yet."""

    async def body() -> None:
        clock = ManualClock(P0 + 10 * HOUR + 30)
        hourly = await open_ledger(where, one_scope_topology(**_HOURLY), clock=clock)
        for h in (8, 9):
            assert (await hourly.charge(_at(f"h{h}", 0.5, P0 + h * HOUR, HOUR))).outcome is Outcome.CHARGED
        with pytest.raises(ConfigError) as err:
            await _second(where, hourly, clock)
        msg = str(err.value)
        assert "\n" not in msg and "'s'" in msg and "period 3600 s -> 86400 s" in msg
        assert f"until {period_id(DAY, P1)}T00:00:00Z" in msg and "use a new scope name" in msg
        assert len([e for e in await hourly.audit("s") if e.kind is AuditKind.CONFIG]) == 1
        assert (await hourly.charge(_at("h10", 0.5, P0 + 10 * HOUR, HOUR))).outcome is Outcome.CHARGED
        clock.now = P1 + 30  # day 2, before any of its blocks opened
        daily = await _second(where, hourly, clock)
        assert (await daily.status("s")).period_end == P1 + DAY
        await daily.close()
        await hourly.close()

    run(body())


def test_a_block_over_blocks_of_another_length_is_refused(where: str) -> None:
    """A daily worker registered on day 2 that releases a day-1 window would open a daily block over day
    1's hourly blocks (their pools plus a daily one): refused, counted and audited in the first hourly
    block it overlaps; no daily block is opened and the day's spend stays what the hourly blocks hold."""

    async def body() -> None:
        clock = ManualClock(P0 + 10 * HOUR + 30)
        hourly = await open_ledger(where, one_scope_topology(**_HOURLY), clock=clock)
        for h in (8, 9):
            assert (await hourly.charge(_at(f"h{h}", 0.5, P0 + h * HOUR, HOUR))).outcome is Outcome.CHARGED
        clock.now = P1 + 30
        daily = await _second(where, hourly, clock)
        before = await daily.audit("s")
        r = await daily.charge(_at("d1", 0.5, P0, DAY))
        first_hour = period_id(HOUR, P0 + 8 * HOUR)
        assert r.outcome is Outcome.REFUSED and r.reason.startswith(
            f"period terms differ: block {first_hour} keeps period 3600 s, this worker 86400 s, "
            f"whose period {period_id(DAY, P0)} overlaps it"
        )
        await _unchanged_but_one_refusal(daily, before, "d1", first_hour)
        assert {h.period_id: (h.spent_units, h.refused) for h in await daily.history("s")} == {
            first_hour: (500_000_000_000, 1),
            period_id(HOUR, P0 + 9 * HOUR): (500_000_000_000, 0),
        }
        await daily.close()
        await hourly.close()

    run(body())


def test_a_shorter_block_inside_a_longer_one_is_refused(where: str) -> None:
    """An hourly worker registered on day 2 that releases a window of day 1's hour 10 would open an hourly
    block inside day 1's daily block: refused, counted and audited in the daily block, nothing opened."""

    async def body() -> None:
        clock = ManualClock(T0)
        daily = await open_ledger(where, one_scope_topology(), clock=clock)
        assert (await daily.charge(_at("d1", 0.5, P0, DAY))).outcome is Outcome.CHARGED
        clock.now = P1 + 30
        hourly = await _second(where, daily, clock, **_HOURLY)
        before = await hourly.audit("s")
        r = await hourly.charge(_at("h10", 0.5, P0 + 10 * HOUR, HOUR))
        assert r.outcome is Outcome.REFUSED and r.reason.startswith(
            f"period terms differ: block {period_id(DAY, P0)} keeps period 86400 s, this worker 3600 s, "
            f"whose period {period_id(HOUR, P0 + 10 * HOUR)} overlaps it"
        )
        await _unchanged_but_one_refusal(hourly, before, "h10", period_id(DAY, P0))
        assert [(h.period_id, h.refused) for h in await hourly.history("s")] == [(period_id(DAY, P0), 1)]
        assert (await hourly.charge(_at("h0", 0.5, P1, HOUR))).outcome is Outcome.CHARGED  # day 2 is free
        await hourly.close()
        await daily.close()

    run(body())


def test_a_known_release_id_is_answered_before_any_terms_check(where: str) -> None:
    """A release id already charged returns its stored bytes even to a caller the block would refuse."""

    async def body() -> None:
        clock = ManualClock(T0)
        pure = await open_ledger(where, one_scope_topology(), clock=clock)
        first = await pure.charge(_at("a", 0.1, P0, DAY))
        clock.advance(DAY)
        zcdp = await _second(where, pure, clock, accounting=Accounting.ZCDP, delta=1e-6)
        again = await zcdp.charge(_at("a", 0.05, P0, DAY))
        assert (again.outcome, again.payload) == (Outcome.DUPLICATE, first.payload)
        await zcdp.close()
        await pure.close()

    run(body())


def test_a_block_opened_by_a_grant_keeps_its_own_length(where: str) -> None:
    """A daily block opened by an operator grant (no charge in it) records its length, so an hourly worker
    registered the next day cannot open an hourly block inside it: refused in the daily block (the length
    is the block's own, not the hourly one registered last)."""

    async def body() -> None:
        clock = ManualClock(P0 + 10 * HOUR)
        daily = await open_ledger(where, one_scope_topology(), clock=clock)
        await daily.grant_reserve("s", 0.0625, "report", "carol")
        clock.now = P1 + 30
        hourly = await _second(where, daily, clock, **_HOURLY)
        r = await hourly.charge(_at("h10", 0.5, P0 + 10 * HOUR, HOUR))
        assert r.outcome is Outcome.REFUSED and r.reason.startswith(
            f"period terms differ: block {period_id(DAY, P0)} keeps period 86400 s, this worker 3600 s"
        )
        assert await hourly.stored_payload("s", "h10") is None
        await hourly.close()
        await daily.close()

    run(body())


def test_a_shaped_scope_prices_by_its_schedule_on_both_backends(where: str) -> None:
    """business_hours (08-18 UTC weigh 2): on plan peak windows cost twice the others, the period spends
    exactly the pool, and both backends answer the same costs."""
    from dpstream.topology.model import NAMED_SHAPES, HourlyShape
    from dpstream.workers.ledger.config import scope_configs

    shape = HourlyShape(NAMED_SHAPES["business_hours"], "business_hours")
    topo = one_scope_topology(
        metrics=(("a", 3.0, 3600, 3600, False), ("b", 1.0, 7200, 7200, False)), schedules={"a": shape}
    )
    cfg = scope_configs(topo)["s"]
    pool = cfg.cap_units - cfg.reserve_units

    async def body() -> dict[tuple[str, int], int]:
        ledger = await open_ledger(where, topo, clock=ManualClock(P0))
        costs = await charge_on_plan(ledger, topo, "s", P0)
        hist = await ledger.history("s")
        assert hist[0].spent_units == pool
        await ledger.close()
        return costs

    costs = run(body())
    assert costs[("a", P0)] == pool * 3 // (4 * 34)
    assert abs(costs[("a", P0 + 9 * 3600)] - 2 * costs[("a", P0 + 7 * 3600)]) <= 100
