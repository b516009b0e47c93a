"""The release protocol on the in-process ledger with real OpenDP noise: one noisy value per window."""

from __future__ import annotations

import asyncio
import json
import math
from fractions import Fraction

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.release import ReleaseOutcome, Releaser, sweep

_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d, reserve: 0.2}
metrics:
  hist:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    group_by: page
    keys: [a, b]
    contribution: {max_keys: 1, max_per_key: 1}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""

_T0 = 1_796_000_400  # an hour boundary


def _run(coro):
    return asyncio.run(coro)


class _Sink:
    """Collects (value, key) the way a releases topic would."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[bytes, bytes]] = []
        self.fail = fail

    async def __call__(self, value: bytes, key: bytes) -> None:
        if self.fail:
            raise ConnectionError("broker down")
        self.sent.append((value, key))


def _max_error(record: dict) -> float:
    """|noise| bound with false-failure rate < 1e-9 per value: 7σ for Gaussian noise."""
    return 7.0 * float(record["noise"]["stddev"])


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


def test_charged_release_publishes_the_stored_record_keyed_by_release_id(topo):
    """A charged release publishes the ledger's stored bytes once, key = release_id, values near the truth."""

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        rel = Releaser(topo, ledger)
        sink = _Sink()
        res = await rel.release("hist", (_T0, _T0 + 3600), {"a": 500, "b": 20}, sink)
        return res, sink, rel

    res, sink, rel = _run(go())
    assert res.outcome is ReleaseOutcome.PUBLISHED
    [(value, key)] = sink.sent
    assert key == res.release_id.encode() and value == res.payload
    rec = json.loads(value)
    assert rec["release_id"] == rel.release_id("hist", _T0, _T0 + 3600)
    assert rec["budget"]["ratio_after"] is not None and rec["budget"]["ratio_after"] > 0
    assert abs(rec["values"]["a"] - 500) <= _max_error(rec)
    assert abs(rec["values"]["b"] - 20) <= _max_error(rec)
    assert rel.counts.snapshot()["published"] == 1


def test_known_release_id_republishes_identical_bytes(topo):
    """A second release of the same window (fresh noise, other true values) publishes the first bytes."""

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        rel = Releaser(topo, ledger)
        sink = _Sink()
        first = await rel.release("hist", (_T0, _T0 + 3600), {"a": 5, "b": 5}, sink)
        second = await rel.release("hist", (_T0, _T0 + 3600), {"a": 10**6, "b": 0}, sink)
        status = await ledger.status("b")
        return first, second, sink, status, rel

    first, second, sink, status, rel = _run(go())
    assert second.outcome is ReleaseOutcome.DUPLICATE
    assert sink.sent[0] == sink.sent[1] and second.payload == first.payload
    assert status.charged == 1
    assert rel.counts.snapshot()["duplicate"] == 1


def test_refused_release_publishes_nothing(topo):
    """With the breaker open the release is refused (refused_breaker) with a reason and nothing is published."""

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        await ledger.open_breaker("b", "test", "pytest")
        rel = Releaser(topo, ledger)
        sink = _Sink()
        res = await rel.release("hist", (_T0, _T0 + 3600), {"a": 1, "b": 1}, sink)
        [block] = await ledger.history("b")
        audit = await ledger.audit("b")
        return res, sink, rel, block, audit

    res, sink, rel, block, audit = _run(go())
    assert res.outcome is ReleaseOutcome.REFUSED_BREAKER and "breaker" in res.reason
    assert sink.sent == [] and res.payload == b""
    assert rel.counts.snapshot()["refused_breaker"] == 1
    assert (block.refused, block.spent_units) == (1, 0)  # the ledger counted the refusal, charged nothing
    assert any(e.kind.value == "refusal" for e in audit)


def test_sweeper_republishes_a_charged_release_with_its_stored_bytes(topo):
    """A publish failure after charging leaves the release charged; the sweeper publishes those bytes once."""

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        rel = Releaser(topo, ledger)
        with pytest.raises(ConnectionError):
            await rel.release("hist", (_T0, _T0 + 3600), {"a": 3, "b": 4}, _Sink(fail=True))
        [pending] = await ledger.pending(0)
        sink = _Sink()
        swept = await sweep(ledger, sink, 0, rel.counts)
        again = await sweep(ledger, sink, 0, rel.counts)
        status = await ledger.status("b")
        return pending, sink, swept, again, status, rel

    pending, sink, swept, again, status, rel = _run(go())
    assert (swept, again) == (1, 0)
    assert sink.sent == [(pending.payload, pending.release_id.encode())]
    assert status.charged == 1
    assert rel.counts.failed == 1 and rel.counts.swept == 1


_STRADDLE_YAML = _YAML.replace("period: 1d", "period: 1h").replace(
    "window: {tumbling: 1h}", "window: {hopping: 2m, every: 1m}"
)


def test_window_straddling_a_period_boundary_is_charged_to_both_periods():
    """DESIGN §3: a hopping window across the period boundary is charged in both periods, published once."""
    topo = load_topology_text(_STRADDLE_YAML)

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        rel = Releaser(topo, ledger)
        sink = _Sink()
        window = (_T0 + 3540, _T0 + 3660)  # 00:59–01:01 across the hour boundary
        first = await rel.release("hist", window, {"a": 3, "b": 1}, sink)
        again = await rel.release("hist", window, {"a": 3, "b": 1}, sink)
        swept = await sweep(ledger, sink, older_than_s=0.0)
        blocks = {p.period_id: p for p in await ledger.history("b")}
        return first, again, swept, blocks, sink

    first, again, swept, blocks, sink = _run(go())
    assert first.outcome is ReleaseOutcome.PUBLISHED and again.outcome is ReleaseOutcome.DUPLICATE
    assert swept == 0
    assert len(blocks) == 2
    spent = sorted(p.spent_units for p in blocks.values())
    assert spent[0] == spent[1] and spent[0] > 0
    assert all(key == first.release_id.encode() for _, key in sink.sent) and len({v for v, _ in sink.sent}) == 1


def test_refusal_in_the_later_period_publishes_nothing_and_charges_nothing_earlier():
    """If the later period cannot take the straddling window's charge, nothing is published or charged before it."""
    topo = load_topology_text(_STRADDLE_YAML)

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        await ledger.open_breaker("b", "test: later period closed", "pytest")
        rel = Releaser(topo, ledger)
        sink = _Sink()
        res = await rel.release("hist", (_T0 + 3540, _T0 + 3660), {"a": 3}, sink)
        return res, sink, await ledger.history("b")

    res, sink, history = _run(go())
    assert res.outcome is ReleaseOutcome.REFUSED_BREAKER
    assert sink.sent == []
    assert all(p.spent_units == 0 for p in history)


def test_prepare_builds_the_mechanism_at_the_planned_cost_without_sampling(topo):
    """Warm-up: `prepare` builds (caches) the mechanism at the planned cost; nothing is released or charged."""
    from dpstream.workers.noise import build_release_mechanism

    built = []

    def factory(metric, accounting, cost, *, delta=0.0):
        built.append((metric.name, cost))
        return build_release_mechanism(metric, accounting, cost, delta=delta)

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        rel = Releaser(topo, ledger, mechanism_factory=factory)
        rel.prepare(topo.metrics["hist"])
        rel.prepare(topo.metrics["hist"], 0.0)  # a refused quote prices 0: the planned cost is built
        return rel, await ledger.status("b")

    rel, status = _run(go())
    planned = rel._planned_cost["hist"]
    assert built == [("hist", planned), ("hist", planned)] and planned > 0
    assert status.charged == 0 and rel.counts.snapshot()["published"] == 0


def test_concurrent_releases_are_priced_as_if_in_turn(topo):
    """The last three hourly windows of a day released at once (a burst after downtime): each gets a
    third of what is left, as in turn; without one-at-a-time pricing the later ones would see the
    pool before the earlier charges landed, take more, and the last would be refused."""

    class _RoundTrips:
        """The in-process ledger with a network's suspension point before every call (as Redis has)."""

        def __init__(self, inner):
            self._inner = inner

        def __getattr__(self, name):
            attr = getattr(self._inner, name)
            if not asyncio.iscoroutinefunction(attr):
                return attr

            async def call(*args, **kwargs):
                await asyncio.sleep(0)
                return await attr(*args, **kwargs)

            return call

    async def go():
        ledger = _RoundTrips(await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600)))
        rel = Releaser(topo, ledger)
        day_end = (_T0 // 86_400 + 1) * 86_400
        starts = [day_end - 3 * 3600, day_end - 2 * 3600, day_end - 3600]
        ledger.use_schedule_start(starts[0])  # deployed three hours before the day's end
        before = await ledger.quote("hist", starts[0], starts[0] + 3600)
        sink = _Sink()
        results = await asyncio.gather(*(rel.release("hist", (s, s + 3600), {"a": 1, "b": 1}, sink) for s in starts))
        return before, results, await ledger.status("b")

    before, results, status = _run(go())
    assert [r.outcome for r in results] == [ReleaseOutcome.PUBLISHED] * 3
    costs = [json.loads(r.payload)["cost"]["rho"] for r in results]
    assert max(costs) - min(costs) <= 1e-9 * max(costs)
    assert abs(costs[0] - before.cost) <= 1e-9 * before.cost  # a third of the pool, as quoted alone


def _straddle_fill(topo, start: int, cost_share: float):
    """A request that spends `cost_share` of the cap in the period of `start` (a window inside it)."""
    from dpstream.topology.periods import period_id
    from dpstream.workers.ledger import ReleaseRequest

    async def fill(ledger):
        cap = (await ledger.status("b")).cap
        req = ReleaseRequest(
            f"fill-{start}",
            "b",
            period_id(3600, start),
            "hist",
            start,
            start + 120,
            cap * cost_share,
            b"{}",
            may_use_reserve=True,
        )
        assert (await ledger.charge(req)).outcome.value == "charged"

    return fill


@pytest.mark.parametrize("exhausted", ["main", "later"])
def test_straddling_window_is_charged_all_or_nothing(exhausted):
    """DESIGN §4: the main and the later period are charged in one atomic call. With the main period
    exhausted, the later period gets no (stranded) charge; with the later one exhausted, the main period
    is not charged either; nothing is published and no charge-only record is left for the sweeper."""
    topo = load_topology_text(_STRADDLE_YAML)
    boundary = _T0 + 3600

    async def go():
        ledger = await open_ledger("memory", topo, clock=lambda: _T0 + 3600 + 90)
        await _straddle_fill(topo, _T0 if exhausted == "main" else boundary, 0.99)(ledger)
        before = {p.period_id: p.spent_units for p in await ledger.history("b")}
        rel = Releaser(topo, ledger)
        sink = _Sink()
        res = await rel.release("hist", (boundary - 60, boundary + 60), {"a": 3, "b": 1}, sink)
        after = {p.period_id: p.spent_units for p in await ledger.history("b")}
        pending = await ledger.pending(0)
        return res, sink, before, after, pending

    res, sink, before, after, pending = _run(go())
    assert res.outcome is ReleaseOutcome.REFUSED_BUDGET and sink.sent == []
    assert "budget exhausted" in res.reason or "pool exhausted" in res.reason
    assert {pid: units for pid, units in after.items() if units} == before  # no period charged by the release
    assert [p.release_id for p in pending] == [f"fill-{_T0 if exhausted == 'main' else boundary}"]


_SELECTING_YAML = _YAML.replace("    keys: [a, b]\n", "")


def test_selection_delta_is_calibrated_and_charged_as_one_amount():
    """A metric with data-derived keys: the mechanism gets the per-release selection δ rounded down to the
    ledger's unit, and the ledger charges exactly that δ to the period's δ counter."""
    from dpstream.topology.selection import selection_delta_per_release
    from dpstream.workers.ledger.units import DELTA_UNITS_PER_DELTA, ledger_delta
    from dpstream.workers.noise import build_release_mechanism

    topo = load_topology_text(_SELECTING_YAML)
    deltas = []

    def factory(metric, accounting, cost, *, delta=0.0):
        deltas.append(delta)
        return build_release_mechanism(metric, accounting, cost, delta=delta)

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        rel = Releaser(topo, ledger, mechanism_factory=factory)
        res = await rel.release("hist", (_T0, _T0 + 3600), {"a": 500, "b": 400}, _Sink())
        return res, await ledger.status("b"), (await ledger.history("b"))[0]

    res, status, block = _run(go())
    metric, budget = topo.metrics["hist"], topo.budgets["b"]
    share = selection_delta_per_release(metric, budget, list(topo.metrics.values()))
    expected = ledger_delta(share)
    assert res.outcome is ReleaseOutcome.PUBLISHED and deltas == [expected] and 0 < expected <= share
    assert block.delta_spent_units == math.floor(Fraction(share) * DELTA_UNITS_PER_DELTA)  # charged as calibrated
    assert status.delta_spent == pytest.approx(expected) and status.delta_cap == pytest.approx(1e-7)
    assert block.delta_spent_units * 24 <= block.delta_cap_units  # the period's 24 releases fit the δ cap


_SUM_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d, reserve: 0.2}
metrics:
  spend:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: sum
    value: eur
    bounds: [0, 200]
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""


def test_a_true_sum_past_the_grid_is_published_and_counted_clamped_off_the_record():
    """A true sum past the fixed-point grid's range is published (clamped before noise, never a failed
    window), counted once per charged release for the curator (`counts.clamped`), and the record does not
    say so; a republish of the known release id counts nothing more."""
    topo = load_topology_text(_SUM_YAML)

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        rel = Releaser(topo, ledger)
        sink = _Sink()
        huge = {"": Fraction(10) ** 40}
        first = await rel.release("spend", (_T0, _T0 + 3600), huge, sink)
        again = await rel.release("spend", (_T0, _T0 + 3600), huge, sink)
        ordinary = await rel.release("spend", (_T0 + 3600, _T0 + 7200), {"": Fraction(10)}, sink)
        return first, again, ordinary, rel

    first, again, ordinary, rel = _run(go())
    assert (first.outcome, again.outcome, ordinary.outcome) == (
        ReleaseOutcome.PUBLISHED,
        ReleaseOutcome.DUPLICATE,
        ReleaseOutcome.PUBLISHED,
    )
    assert dict(rel.counts.clamped) == {"spend": 1}
    clamped_record, ordinary_record = json.loads(first.payload), json.loads(ordinary.payload)
    assert clamped_record.keys() == ordinary_record.keys()  # the record says nothing of the clamp
    assert clamped_record["noise"] == ordinary_record["noise"] and "clamped" not in first.payload.decode()


def test_a_max_windows_metric_spends_its_share_in_its_first_m_windows_and_releases_every_window() -> None:
    """contribution.max_windows: 4 on 24 hourly windows: every window is released at the same noise
    (P/4 each, then priced at the 4th largest), the period pays only 4 of them (the pool), each
    record's privacy event names max_windows, and the σ is √6 smaller than without the cap."""
    capped = load_topology_text(_YAML.replace("max_per_key: 1}", "max_per_key: 1, max_windows: 4}"))
    plain = load_topology_text(_YAML)

    async def body() -> tuple[list[dict], float, float, int, int]:
        day = _T0 - _T0 % 86_400
        ledger = await open_ledger("memory", capped, clock=ManualClock(day + 86_399))
        releaser = Releaser(capped, ledger)
        sink = _Sink()
        records = []
        for h in range(24):
            result = await releaser.release("hist", (day + h * 3600, day + (h + 1) * 3600), {"a": 3, "b": 5}, sink)
            assert result.outcome is ReleaseOutcome.PUBLISHED
            records.append(json.loads(result.payload))
        status = await ledger.status("b")
        cfg = ledger.scope_of("hist")
        await ledger.close()
        plain_ledger = await open_ledger("memory", plain, clock=ManualClock(day + 86_400))
        plain_quote = await plain_ledger.quote("hist", day, day + 3600)
        await plain_ledger.close()
        pool = cfg.cap_units - cfg.reserve_units
        return records, plain_quote.cost, records[0]["cost"]["rho"], status.spent_units, pool

    records, plain_cost, capped_cost, spent, pool = _run(body())
    assert {r["event"]["max_windows"] for r in records} == {4}
    for r in records:  # the same noise in every window (to a unit of 1e-12: P/4 floors)
        assert r["cost"]["rho"] == pytest.approx(capped_cost, rel=1e-9)
    assert capped_cost == pytest.approx(6 * plain_cost, rel=1e-9)  # ρ ∝ 1/σ²: σ √6 smaller
    assert spent == pool  # four windows paid P/4, the other twenty raised nothing
