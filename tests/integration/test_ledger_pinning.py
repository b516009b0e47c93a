"""A period's terms are fixed when it opens; selection δ is ledgered; a straddling window is charged
to every period it touches in one atomic call; a deployment's start is recorded once. Run against
both backends (in-process and real Redis), as the ledger contract is."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from dpstream.topology.errors import ConfigError, InternalError
from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Accounting
from dpstream.topology.periods import period_id
from dpstream.workers.ledger import AuditKind, Outcome, ReleaseRequest, open_ledger
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology

DAY = 86_400
HOUR = 3600
T0 = 1_796_000_000
P0 = (T0 // DAY) * DAY
P1 = P0 + DAY
PID0, PID1 = period_id(DAY, P0), period_id(DAY, P1)

_SELECTING = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d, reserve: 0.2}
metrics:
  pages:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1d}
    aggregate: count
    group_by: page
    contribution: {max_keys: 1, max_per_key: 1}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""


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
    start: int = P0,
    size: int = DAY,
    may_use_reserve: bool = False,
    extra: tuple[tuple[str, int], ...] = (),
    period_s: int = DAY,
    scope: str = "s",
    metric: str = "m",
    delta: float = 0.0,
) -> ReleaseRequest:
    return ReleaseRequest(
        rid,
        scope,
        period_id(period_s, start),
        metric,
        start,
        start + size,
        cost,
        b'{"id":"%s","ratio_after":null}' % rid.encode(),
        may_use_reserve,
        delta=delta,
        extra_periods=extra,
    )


async def _reopen(where: str, ledgers: dict[str, Any], **topo: Any) -> Any:
    """A ledger with its own topology on the same store (memory: the same in-process store)."""
    if where != "memory":
        return await open_ledger(where, one_scope_topology(**topo), clock=ledgers["clock"])
    from dpstream.workers.ledger.config import scope_configs
    from dpstream.workers.ledger.memory import MemoryLedger

    other = MemoryLedger(scope_configs(one_scope_topology(**topo)), clock=ledgers["clock"])
    other._store = ledgers["first"]._store  # one store, two topologies (as two workers on one Redis)
    other._lock = ledgers["first"]._lock
    await other.register("worker-2")
    return other


# ---- 1. a period's terms are fixed when it opens ---------------------------------------------------


def test_a_larger_cap_takes_effect_from_the_next_period(where: str) -> None:
    """A re-registered larger cap is stored and audited, but the open period keeps its cap, reserve and pool
    (quote, charge, grant and status all use the block's terms); the next period opens with the new cap."""

    async def body() -> None:
        clock = ManualClock(T0)
        first = await open_ledger(where, one_scope_topology(epsilon=1.0), clock=clock)
        assert (await first.charge(req("a", 0.5))).outcome is Outcome.CHARGED  # opens the block at cap 1.0
        ledgers = {"clock": clock, "first": first}
        bigger = await _reopen(where, ledgers, epsilon=2.0)
        configs = [e for e in await bigger.audit("s") if e.kind is AuditKind.CONFIG]
        assert len(configs) == 2 and "changed" in configs[1].fields["reason"]
        status = await bigger.status("s")
        assert (status.cap, status.cap_units) == (1.0, 10**12)
        q = await bigger.quote("m", P0, P0 + DAY)
        assert q.cost_units <= 300_000_000_000  # pool 0.8 of the block's cap 1.0, minus 0.5 spent
        over = await bigger.charge(req("b", 0.4))  # fits the new pool (1.6), not the block's (0.8)
        assert over.outcome is Outcome.REFUSED and "pool exhausted" in over.reason
        await bigger.grant_reserve("s", 0.1, "report", "carol")  # the grant keeps the block's terms too
        [block] = await bigger.history("s")
        assert (block.cap_units, block.reserve_units) == (10**12, 200_000_000_000)
        top = await bigger.charge(req("c", 0.6, may_use_reserve=True))  # 0.5 + 0.6 > the block's cap 1.0
        assert top.outcome is Outcome.REFUSED and "budget exhausted" in top.reason
        clock.advance(DAY)
        nxt = await bigger.charge(req("d", 1.5, start=P1))  # new period: cap 2.0, pool 1.6
        assert nxt.outcome is Outcome.CHARGED and nxt.ratio_after == pytest.approx(0.75)
        assert (await bigger.status("s")).cap == 2.0
        await bigger.close()
        await first.close()

    run(body())


def test_a_smaller_cap_mid_period_is_refused_with_one_line(where: str) -> None:
    """Shrinking the cap while the current period's block exists raises one ConfigError line naming the scope,
    the change and the fix; nothing is stored. Before any charge, or from the next period, it is accepted."""

    async def body() -> None:
        clock = ManualClock(T0)
        first = await open_ledger(where, one_scope_topology(epsilon=1.0), clock=clock)
        ledgers = {"clock": clock, "first": first}
        assert (await first.charge(req("a", 0.25))).outcome is Outcome.CHARGED
        with pytest.raises(ConfigError) as err:
            await _reopen(where, ledgers, epsilon=0.5)
        msg = str(err.value)
        assert "\n" not in msg and "'s'" in msg and "cap 1 -> 0.5" in msg
        assert "takes effect only from the next period" in msg and "use a new scope name" in msg
        assert f"until {period_id(DAY, P1)}T00:00:00Z" in msg
        assert (await first.status("s")).cap == 1.0
        assert (await first.charge(req("b", 0.25))).outcome is Outcome.CHARGED  # registered terms unchanged
        configs = [e for e in await first.audit("s") if e.kind is AuditKind.CONFIG]
        assert len(configs) == 1
        clock.advance(DAY)
        smaller = await _reopen(where, ledgers, epsilon=0.5)
        assert (await smaller.status("s")).cap == 0.5
        await smaller.close()
        await first.close()

    run(body())


def test_smaller_cap_before_the_period_opens_is_accepted(where: str) -> None:
    """No block yet in the current period: the period has no terms to keep, the new config is stored."""

    async def body() -> None:
        clock = ManualClock(T0)
        first = await open_ledger(where, one_scope_topology(epsilon=1.0), clock=clock)
        smaller = await _reopen(where, {"clock": clock, "first": first}, epsilon=0.5)
        assert (await smaller.status("s")).cap == 0.5
        await smaller.close()
        await first.close()

    run(body())


def test_an_accounting_change_mid_period_is_refused(where: str) -> None:
    """pure -> zCDP in an open period is refused (one line); the next period accepts it."""

    async def body() -> None:
        clock = ManualClock(T0)
        first = await open_ledger(where, one_scope_topology(epsilon=1.0), clock=clock)
        ledgers = {"clock": clock, "first": first}
        await first.charge(req("a", 0.1))
        with pytest.raises(ConfigError, match=r"accounting pure -> zcdp .*keep accounting pure"):
            await _reopen(where, ledgers, accounting=Accounting.ZCDP, delta=1e-6)
        clock.advance(DAY)
        zcdp = await _reopen(where, ledgers, accounting=Accounting.ZCDP, delta=1e-6)
        assert (await zcdp.status("s")).accounting == "zcdp"
        await zcdp.close()
        await first.close()

    run(body())


def test_a_worker_whose_topology_disagrees_is_refused_counted_and_audited(where: str) -> None:
    """The newest registration wins: a worker still on the older topology is refused (never charged under
    the other's terms), the refusal counted and audited with both digests; the newer worker is charged."""

    async def body() -> None:
        clock = ManualClock(T0)
        old = await open_ledger(where, one_scope_topology(epsilon=1.0), clock=clock)
        new = await _reopen(where, {"clock": clock, "first": old}, epsilon=2.0)
        refused = await old.charge(req("a", 0.1))
        assert refused.outcome is Outcome.REFUSED and refused.reason.startswith(
            "topology disagrees with the scope's registered terms (digest "
        )
        assert "restart it with the current topology" in refused.reason
        assert old._configs["s"].digest in refused.reason and new._configs["s"].digest in refused.reason
        status = await new.status("s")
        assert (status.refused, status.spent_units, status.charged) == (1, 0, 0)
        [entry] = [e for e in await new.audit("s") if e.kind is AuditKind.REFUSAL]
        assert entry.fields["reason"] == refused.reason and entry.fields["release_id"] == "a"
        assert (await new.charge(req("a", 0.1))).outcome is Outcome.CHARGED
        await new.close()
        await old.close()

    run(body())


# ---- 2. selection δ is ledgered -------------------------------------------------------------------


def test_selection_delta_is_charged_rounded_up_against_its_own_cap(where: str) -> None:
    """δ is an integer counter per period (1e-18 units, charges rounded up) capped at selection_delta_total;
    a release that does not fit is refused ("selection delta exhausted") and charges neither ρ nor δ."""

    async def body() -> None:
        ledger = await open_ledger(where, load_topology_text(_SELECTING), clock=ManualClock(T0))
        status = await ledger.status("b")
        assert status.delta_cap == pytest.approx(1e-7) and status.delta_spent == 0.0
        r1 = await ledger.charge(req("a", 1e-4, scope="b", metric="pages", delta=4e-8))
        r2 = await ledger.charge(req("b", 1e-4, scope="b", metric="pages", delta=4e-8))
        assert (r1.outcome, r2.outcome) == (Outcome.CHARGED, Outcome.CHARGED)
        before = await ledger.status("b")
        r3 = await ledger.charge(req("c", 1e-4, scope="b", metric="pages", delta=4e-8))
        assert r3.outcome is Outcome.REFUSED and r3.reason.startswith("selection delta exhausted")
        after = await ledger.status("b")
        assert (after.spent_units, after.delta_spent, after.refused) == (before.spent_units, before.delta_spent, 1)
        assert after.delta_spent == pytest.approx(8e-8)
        tiny = await ledger.charge(req("d", 1e-4, scope="b", metric="pages", delta=1e-30))  # rounds up to 1 unit
        assert tiny.outcome is Outcome.CHARGED
        charges = [e.fields for e in await ledger.audit("b") if e.kind is AuditKind.CHARGE]
        assert [c["delta"] for c in charges] == ["40000000001", "40000000001", "1"]  # 4e-8 is 4.0000000000000001e-8
        [block] = await ledger.history("b")
        assert (block.delta_spent_units, block.delta_cap_units) == (80_000_000_003, 99_999_999_999)  # cap rounded down
        await ledger.close()

    run(body())


def test_no_selection_means_a_zero_delta_cap(where: str) -> None:
    """A scope whose keys are all declared sets no δ aside: any δ charge is refused, δ = 0 is fine."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
        assert (await ledger.status("s")).delta_cap == 0.0
        refused = await ledger.charge(req("a", 0.1, delta=1e-9))
        assert refused.outcome is Outcome.REFUSED and refused.reason.startswith("selection delta exhausted")
        assert (await ledger.charge(req("a", 0.1))).outcome is Outcome.CHARGED
        await ledger.close()

    run(body())


# ---- 3. a straddling window: every period it touches, in one atomic call --------------------------

_HOURLY = dict(period_s=HOUR, metrics=(("m", 1.0, 120, 60, False),))
H0 = (T0 // HOUR) * HOUR
H1 = H0 + HOUR
STRADDLE = dict(start=H1 - 60, size=120, period_s=HOUR, extra=((period_id(HOUR, H1), H1),))


def _spent(history: list[Any]) -> dict[str, int]:
    return {h.period_id: h.spent_units for h in history}


def test_a_straddling_window_is_charged_to_both_periods_once(where: str) -> None:
    """One charge covers the main and the later period (spend, count, δ, audit), stores one release."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(**_HOURLY), clock=ManualClock(H0 + 10))
        r = await ledger.charge(req("x", 0.1, **STRADDLE))
        assert r.outcome is Outcome.CHARGED and r.ratio_after == pytest.approx(0.1)
        again = await ledger.charge(req("x", 0.1, **STRADDLE))
        assert again.outcome is Outcome.DUPLICATE and again.payload == r.payload
        assert _spent(await ledger.history("s")) == {
            period_id(HOUR, H0): 100_000_000_001,
            period_id(HOUR, H1): 100_000_000_001,
        }
        assert [p.release_id for p in await ledger.pending(0)] == ["x"]
        assert (await ledger.reconcile("s")).ok
        charged = [e.fields["period"] for e in await ledger.audit("s") if e.kind is AuditKind.CHARGE]
        assert charged == [period_id(HOUR, H0), period_id(HOUR, H1)]
        await ledger.close()

    run(body())


def test_main_period_exhausted_leaves_no_charge_on_the_later_period(where: str) -> None:
    """The main period cannot take the straddling window: nothing is charged anywhere (no stranded charge)."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(**_HOURLY), clock=ManualClock(H0 + 10))
        fill = await ledger.charge(req("fill", 0.95, start=H0, size=120, period_s=HOUR, may_use_reserve=True))
        assert fill.outcome is Outcome.CHARGED
        r = await ledger.charge(req("x", 0.1, **STRADDLE))
        assert r.outcome is Outcome.REFUSED and "budget exhausted" in r.reason
        spent = _spent(await ledger.history("s"))
        assert spent == {period_id(HOUR, H0): 950_000_000_000}  # the later period has no block at all
        assert await ledger.stored_payload("s", "x") is None
        assert [p.release_id for p in await ledger.pending(0)] == ["fill"]
        await ledger.close()

    run(body())


def test_later_period_exhausted_charges_nothing_in_the_main_period(where: str) -> None:
    """The later period cannot take it: the main period is not charged either, the refusal names the
    later period and is counted there (its automatic breaker opens, the main period's does not)."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(**_HOURLY), clock=ManualClock(H0 + 10))
        fill = await ledger.charge(req("fill", 0.95, start=H1, size=120, period_s=HOUR, may_use_reserve=True))
        assert fill.outcome is Outcome.CHARGED
        r = await ledger.charge(req("x", 0.1, **STRADDLE))
        assert r.outcome is Outcome.REFUSED and r.reason.startswith("budget exhausted")
        assert f"in later period {period_id(HOUR, H1)}" in r.reason
        blocks = {h.period_id: h for h in await ledger.history("s")}
        assert list(blocks) == [period_id(HOUR, H1)]  # the main period was not even opened
        assert (blocks[period_id(HOUR, H1)].spent_units, blocks[period_id(HOUR, H1)].refused) == (950_000_000_000, 1)
        main = await ledger.charge(req("y", 0.1, start=H0, size=120, period_s=HOUR))
        assert main.outcome is Outcome.CHARGED  # the main period's breaker stayed closed
        await ledger.close()

    run(body())


def test_a_request_must_name_every_later_period_its_window_touches(where: str) -> None:
    """A straddling window without (or with wrong) extra periods is a bug, refused before any write."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(**_HOURLY), clock=ManualClock(H0 + 10))
        with pytest.raises(InternalError, match="charged to every period it touches"):
            await ledger.charge(req("x", 0.1, start=H1 - 60, size=120, period_s=HOUR))
        with pytest.raises(InternalError, match="charged to every period it touches"):
            await ledger.charge(req("y", 0.1, start=H0, size=120, period_s=HOUR, extra=((period_id(HOUR, H1), H1),)))
        assert await ledger.history("s") == []
        await ledger.close()

    run(body())


# ---- 4. the schedule start, recorded once ----------------------------------------------------------


def test_version_schedule_start_first_start_wins(where: str) -> None:
    """The first proposed start of a topology version is stored and returned forever; versions are separate."""

    async def body() -> None:
        ledger = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
        assert await ledger.version_schedule_start("v1", 1_000) == 1_000
        assert await ledger.version_schedule_start("v1", 2_000) == 1_000
        assert await ledger.version_schedule_start("v2", 3_000) == 3_000
        with pytest.raises(ConfigError):
            await ledger.version_schedule_start("", 1)
        if where != "memory":  # another process, same Redis
            other = await open_ledger(where, one_scope_topology(), clock=ManualClock(T0))
            assert await other.version_schedule_start("v1", 5_000) == 1_000
            await other.close()
        results = await asyncio.gather(*(ledger.version_schedule_start("v3", 10_000 + i) for i in range(16)))
        assert len(set(results)) == 1
        await ledger.close()

    run(body())


# ---- both backends, same answers ----------------------------------------------------------------------


def test_both_backends_agree_on_terms_straddles_and_delta(fresh_redis: Any) -> None:
    """Outcomes, reasons, ratios and every audit field (but ids) are the same on both backends."""

    async def script(where: str) -> list[Any]:
        clock = ManualClock(H0 + 10)
        topo = load_topology_text(
            _SELECTING.replace("period: 1d", "period: 1h").replace(
                "window: {tumbling: 1d}", "window: {hopping: 2m, every: 1m}"
            )
        )
        ledger = await open_ledger(where, topo, clock=clock)
        cap = (await ledger.status("b")).cap
        out: list[Any] = []
        calls = [
            ("fill", cap * 0.7, H0, False, 3e-10),
            ("x", cap * 0.2, H1 - 60, False, 3e-10),
            ("y", cap * 0.2, H1 - 60, True, 3e-10),
            ("z", cap * 0.05, H1 - 60, True, 1e-6),
            ("w", cap * 0.05, H1, False, 1e-12),
            ("x", cap * 0.2, H1 - 60, False, 3e-10),
        ]
        for rid, cost, start, may_use, delta in calls:
            extra = ((period_id(HOUR, H1), H1),) if start == H1 - 60 else ()
            r = await ledger.charge(
                ReleaseRequest(
                    rid,
                    "b",
                    period_id(HOUR, start),
                    "pages",
                    start,
                    start + 120,
                    cost,
                    b'{"ratio_after":null}',
                    may_use,
                    delta=delta,
                    extra_periods=extra,
                )
            )
            out.append((r.outcome, r.payload, r.reason, r.ratio_after, r.state, r.cost_units))
        out.append(
            [(h.period_id, h.spent_units, h.delta_spent_units, h.charged, h.refused) for h in await ledger.history("b")]
        )
        out.append([{k: v for k, v in e.fields.items()} for e in await ledger.audit("b")])
        await ledger.close()
        return out

    assert run(script("memory")) == run(script(fresh_redis.url))
