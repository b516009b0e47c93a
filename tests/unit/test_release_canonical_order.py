"""Releases of one close time are priced in the canonical (P(w), metric) order, whatever order ran."""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.release import ReleaseOutcome, Releaser

# warn_at is low so the scope is in `warning` from the first charge on: `stretch` then charges
# each release a fraction of its share, so what one release leaves to the next depends on order
_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b:
    epsilon: 1.0
    delta: 1.0e-6
    period: 1d
    reserve: 0.2
    warn_at: 0.01
    on_warning: {stretch: 1.5}
metrics:
  alpha:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    mechanism: gaussian
  beta:
    source: s
    budget: b
    weight: 3
    window: {tumbling: 1h}
    aggregate: count
    mechanism: gaussian
  gamma:
    source: s
    budget: b
    weight: 2
    window: {tumbling: 30m}
    aggregate: count
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""

_T0 = 1_796_000_400 - 1_796_000_400 % 86_400  # a day boundary
_HOUR = 3600


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


def _run(topo, order: list[str]) -> dict[str, dict]:
    """A fresh ledger: the first hour released (the scope enters `warning`), then the windows that
    end at 02:00 released in `order`; metric → its 02:00 record."""

    async def go() -> dict[str, dict]:
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 2 * _HOUR + 1))
        ledger.use_schedule_start(_T0)
        releaser = Releaser(topo, ledger)
        out: dict[str, dict] = {}

        async def publish(value: bytes, key: bytes) -> None:
            out[key.decode()] = json.loads(value)

        for name in ("alpha", "beta"):
            await releaser.release(name, (_T0, _T0 + _HOUR), {"": 1}, publish)
        for start in (_T0, _T0 + 1800, _T0 + _HOUR):
            await releaser.release("gamma", (start, start + 1800), {"": 1}, publish)
        records: dict[str, dict] = {}
        for name in order:
            size = topo.metrics[name].window.size_s
            window = (_T0 + 2 * _HOUR - size, _T0 + 2 * _HOUR)
            result = await releaser.release(name, window, {"": 2}, publish)
            assert result.outcome is ReleaseOutcome.PUBLISHED
            records[name] = json.loads(result.payload)
        return records

    return asyncio.run(go())


def _priced(records: dict[str, dict]) -> dict[str, tuple[float, float, float]]:
    return {m: (r["cost"]["rho"], r["budget"]["ratio_after"], r["noise"]["scale"]) for m, r in sorted(records.items())}


def test_two_metrics_closing_together_cost_the_same_charged_in_either_order(topo):
    """Two metrics whose windows close at the same time, charged in either order under `stretch`:
    identical costs, noise scales and ratio_after (in the canonical order alpha, beta)."""
    ab, ba = _run(topo, ["alpha", "beta"]), _run(topo, ["beta", "alpha"])
    assert _priced(ab) == _priced(ba)
    assert ab["alpha"]["budget"]["ratio_after"] < ab["beta"]["budget"]["ratio_after"]


def test_three_releases_of_one_close_in_every_order_cost_the_same(topo):
    """Every order of three releases closing together (two window sizes) gives the same prices."""
    orders = (["alpha", "beta", "gamma"], ["gamma", "beta", "alpha"], ["beta", "gamma", "alpha"])
    prices = [_priced(_run(topo, list(order))) for order in orders]
    assert prices[0] == prices[1] == prices[2]
    ratios = [prices[0][m][1] for m in ("alpha", "beta", "gamma")]
    assert ratios == sorted(ratios)  # ratio_after grows along the canonical order


class _Yielding:
    """A ledger whose every call yields to the event loop first, as a network round trip does, so
    concurrent releases interleave as they do against Redis."""

    def __init__(self, ledger) -> None:
        self._ledger = ledger

    def __getattr__(self, name: str):
        attr = getattr(self._ledger, name)
        if not asyncio.iscoroutinefunction(attr):
            return attr

        async def call(*args, **kwargs):
            await asyncio.sleep(0)
            return await attr(*args, **kwargs)

        return call


def _windows(topo) -> list[tuple[str, tuple[int, int]]]:
    """Every window of alpha, beta and gamma in the first three hours after the start, in time order."""
    out = []
    for name in ("alpha", "beta", "gamma"):
        size = topo.metrics[name].window.size_s
        out += [(name, (s, s + size)) for s in range(_T0, _T0 + 3 * _HOUR, size)]
    return sorted(out, key=lambda w: (w[1][1], w[0]))


def _run_across_closes(topo, windows: list[tuple[str, tuple[int, int]]], together: bool) -> dict:
    """Release `windows` (all ready at once, dispatched in the list's order) from a fresh ledger:
    concurrently when `together`, else one after the other in that order; (metric, start) → cost."""

    async def go() -> dict:
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3 * _HOUR + 1))
        ledger.use_schedule_start(_T0)
        releaser = Releaser(topo, _Yielding(ledger))

        async def publish(value: bytes, key: bytes) -> None:
            await asyncio.sleep(0)

        async def one(name: str, window: tuple[int, int]):
            return (name, window[0]), await releaser.release(name, window, {"": 1}, publish)

        if together:
            results = await asyncio.gather(*(one(n, w) for n, w in windows))
        else:
            results = [await one(n, w) for n, w in windows]
        assert all(r.outcome is ReleaseOutcome.PUBLISHED for _, r in results)
        return {k: json.loads(r.payload)["cost"]["rho"] for k, r in results}

    return asyncio.run(go())


def test_releases_ready_together_across_close_times_cost_what_they_cost_in_order(topo):
    """A worker catching up on a backlog has windows of several close times ready at once, in
    whatever order its partials arrived: they are priced in the public order all the same."""
    in_order = _windows(topo)
    expected = _run_across_closes(topo, in_order, together=False)
    for dispatched in (in_order[::-1], in_order[1::2] + in_order[::2], in_order):
        assert _run_across_closes(topo, dispatched, together=True) == expected


def test_releases_charged_one_by_one_in_any_order_cost_what_they_cost_in_order(topo):
    """Releases charged one after the other out of the public order (a window retried after a failure,
    partials of one metric late behind another's, another worker ahead): each costs what it costs in
    order, under `stretch` and with three window schedules. The period's backlog prices the earlier
    releases not charged yet as if they were, and takes out the later ones charged already."""
    in_order = _windows(topo)
    expected = _run_across_closes(topo, in_order, together=False)
    shuffled = [in_order[i] for i in random.Random(7).sample(range(len(in_order)), len(in_order))]
    for charged in (in_order[::-1], in_order[1::2] + in_order[::2], shuffled):
        assert _run_across_closes(topo, charged, together=False) == expected


_LATE_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1000.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  spend: {source: s, budget: b, weight: 1, window: {tumbling: 2s}, aggregate: count, mechanism: gaussian}
  users: {source: s, budget: b, weight: 1, window: {tumbling: 2s}, aggregate: count, mechanism: gaussian}
  views: {source: s, budget: b, weight: 1, window: {tumbling: 2s}, aggregate: count, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""


def _period_end_run(late_by: int) -> tuple[dict[tuple[str, int], tuple[ReleaseOutcome, float]], object]:
    """Two workers releasing the last 40 s of a period; the one releasing `spend` is `late_by` closes
    behind (a ledger outage, say). (metric, window end − period end) → (outcome, cost); the period's status."""
    topo = load_topology_text(_LATE_YAML)
    end = _T0 + 86_400
    start = end - 40

    async def go() -> tuple[dict[tuple[str, int], tuple[ReleaseOutcome, float]], object]:
        ledger = await open_ledger("memory", topo, clock=ManualClock(end + 10))
        ledger.use_schedule_start(start)
        on_time, late = Releaser(topo, ledger), Releaser(topo, ledger)
        out: dict[tuple[str, int], tuple[ReleaseOutcome, float]] = {}

        async def publish(value: bytes, key: bytes) -> None:
            return None

        async def release(releaser: Releaser, name: str, close: int) -> None:
            r = await releaser.release(name, (close - 2, close), {"": 5}, publish)
            cost = json.loads(r.payload)["cost"]["rho"] if r.payload else 0.0
            out[(name, close - end)] = (r.outcome, cost)

        closes = list(range(start + 2, end + 1, 2))
        for i, close in enumerate(closes):
            for name in ("users", "views"):
                await release(on_time, name, close)
            if i >= late_by:
                await release(late, "spend", closes[i - late_by])
        for c in closes[len(closes) - late_by :]:
            await release(late, "spend", c)
        return out, next(p for p in await ledger.history("b") if p.start == end - 86_400)

    return asyncio.run(go())


def test_a_metric_late_at_the_period_end_costs_what_it_costs_on_time() -> None:
    """Two workers, one late by four closes as the period ends: the other's releases price its windows
    not charged yet as if they were, so every release, late or not, costs what it costs when both are on
    time; nothing is refused and the whole pool is spent. (Before the period's backlog was priced, the
    late windows found the pool priced away: the last two were refused, as in a chaos run that crossed
    midnight.)"""
    on_time, status = _period_end_run(0)
    late, late_status = _period_end_run(4)
    assert late == on_time
    assert all(outcome is ReleaseOutcome.PUBLISHED for outcome, _ in late.values())
    assert late_status.spent_units == status.spent_units == status.cap_units - status.reserve_units
