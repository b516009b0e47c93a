"""Telemetry arithmetic and rendering without servers: planned ratio, spent total, the budget reader on the
in-process ledger, the worker collector on stand-in counters, the ledger timing proxy, the histograms."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import CollectorRegistry

from dpstream.topology.loader import load_topology_text
from dpstream.topology.periods import period_id
from dpstream.topology.plan import build_plan
from dpstream.topology.schedule import Schedule
from dpstream.workers.ledger import LedgerUnavailable, Outcome, ReleaseRequest, open_ledger
from dpstream.workers.pipeline.counters import EventCounts
from dpstream.workers.pipeline.events import REASONS
from dpstream.workers.release.outcomes import ReleaseCounts, ReleaseOutcome
from dpstream.workers.runtime.clock_skew import ClockSkewGate
from dpstream.workers.telemetry.budget import (
    BudgetCollector,
    BudgetReader,
    LedgerSource,
    SpentTotals,
    planned_ratio,
    planned_spend_rate,
    planned_spent,
)
from dpstream.workers.telemetry.histogram import LabelledHistogram
from dpstream.workers.telemetry.ledger_proxy import LEDGER_OPS, LedgerTimings, TimedLedger
from dpstream.workers.telemetry.worker import WorkerCollector, fold_event_counts, noise_stddev

DAY = 86_400
HOUR = 3_600
P0 = (1_796_000_000 // DAY) * DAY  # a UTC day boundary (2026-11-29)

_YAML = """
version: 1
sources:
  s: {{topic: t, privacy_unit: user_id, timestamp: ts, allowed_lateness: 30s}}
budgets:
  b: {{epsilon: 1.0, delta: 1.0e-6, accounting: {accounting}, period: 1d, reserve: 0.2, warn_at: 0.8}}
metrics:
  hourly:
    source: s
    budget: b
    weight: 1
    window: {{tumbling: 1h}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: {mechanism}
  daily:
    source: s
    budget: b
    weight: 3
    window: {{tumbling: 1d}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: {mechanism}
  sliding:
    source: s
    budget: b
    weight: 2
    window: {{hopping: 2h, every: 1h}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: {mechanism}
sinks: {{releases: r, dead_letter: d}}
"""


def _topology(accounting: str = "zcdp"):
    mechanism = "gaussian" if accounting == "zcdp" else "laplace"
    return load_topology_text(_YAML.format(accounting=accounting, mechanism=mechanism))


# ---- plan arithmetic --------------------------------------------------------------------------------


def test_schedule_ended_tumbling_hopping_and_the_period_edges() -> None:
    end = P0 + DAY
    assert Schedule(HOUR, HOUR).ended(P0, end, P0) == 0
    assert Schedule(HOUR, HOUR).ended(P0, end, P0 + HOUR - 0.001) == 0
    assert Schedule(HOUR, HOUR).ended(P0, end, P0 + HOUR) == 1  # [P0, P0+1h) has just ended
    assert Schedule(HOUR, HOUR).ended(P0, end, P0 + 12.5 * HOUR) == 12
    assert Schedule(HOUR, HOUR).ended(P0, end, end) == 24
    assert Schedule(HOUR, HOUR).ended(P0, end, end + 5 * DAY) == 24  # only this period's windows
    assert Schedule(DAY, DAY).ended(P0, end, end - 1) == 0 and Schedule(DAY, DAY).ended(P0, end, end) == 1
    # hopping 2h every 1h: 24 windows start in the period; the last one ends an hour into the next period
    assert Schedule(2 * HOUR, HOUR).ended(P0, end, P0 + HOUR) == 0
    assert Schedule(2 * HOUR, HOUR).ended(P0, end, P0 + 2 * HOUR) == 1
    assert Schedule(2 * HOUR, HOUR).ended(P0, end, end) == 23
    assert Schedule(2 * HOUR, HOUR).ended(P0, end, end + HOUR) == 24
    # the window starting an hour before the period belongs to the previous period, not this one
    assert Schedule(2 * HOUR, HOUR).ended(P0, end, P0 + HOUR + 1) == 0
    assert Schedule(HOUR, HOUR).ended(P0, end, P0 - HOUR) == 0


def test_planned_ratio_spreads_the_pool_by_weight_over_each_metrics_releases() -> None:
    """weights 1 : 3 : 2 over a pool of 0.8 cap: hourly 24, daily 1, sliding 24 releases a day."""
    scope = build_plan(_topology()).scope("b")
    end = P0 + DAY
    assert planned_ratio(scope, P0, end, P0) == 0.0
    # 12.5 h in: hourly has 12 of 24 ended, daily 0 of 1, sliding 11 of 24
    want = 0.8 * (1 / 6 * 12 / 24 + 3 / 6 * 0 + 2 / 6 * 11 / 24)
    assert math.isclose(planned_ratio(scope, P0, end, P0 + 12.5 * HOUR), want, rel_tol=1e-9)
    assert math.isclose(planned_spent(scope, P0, end, P0 + 12.5 * HOUR), want * scope.cap, rel_tol=1e-9)
    # at the period's end everything but the sliding window that straddles into the next day has ended
    at_end = 0.8 * (1 / 6 + 3 / 6 + 2 / 6 * 23 / 24)
    assert math.isclose(planned_ratio(scope, P0, end, end), at_end, rel_tol=1e-9)
    # an hour later the plan has spent the whole pool: 1 - reserve of the cap
    assert math.isclose(planned_ratio(scope, P0, end, end + HOUR), 0.8, rel_tol=1e-9)
    # monotone in time
    ratios = [planned_ratio(scope, P0, end, P0 + t) for t in range(0, DAY + 2 * HOUR, 600)]
    assert ratios == sorted(ratios)


@pytest.mark.parametrize("accounting", ["zcdp", "pure"])
def test_planned_spend_rate_is_the_pool_over_the_period(accounting: str) -> None:
    scope = build_plan(_topology(accounting)).scope("b")
    assert math.isclose(planned_spend_rate(scope), scope.cap * 0.8 / DAY, rel_tol=1e-12)
    assert math.isclose(planned_spend_rate(scope) * DAY, scope.planned_total, rel_tol=1e-9)


S_MID = P0 + 6 * HOUR + 1800  # a deployment that starts at 06:30


def test_planned_ratio_counts_from_a_mid_period_start() -> None:
    """From S = 06:30 the daily window (started at 00:00) is never released and the plan spends the pool
    on the 17 hourly and 17 sliding windows from 07:00: at 12:30 5 hourly and 4 sliding have ended."""
    scope = build_plan(_topology()).scope("b")
    end = P0 + DAY
    assert planned_ratio(scope, P0, end, S_MID, S_MID) == 0.0
    released = 1 / 24 * 17 + 2 / 24 * 17  # per-release cost ∝ weight / releases per period
    want = 0.8 * (1 / 24 * 5 + 2 / 24 * 4) / released
    assert math.isclose(planned_ratio(scope, P0, end, P0 + 12.5 * HOUR, S_MID), want, rel_tol=1e-9)
    assert math.isclose(planned_ratio(scope, P0, end, end, S_MID), 0.8 * (1 / 24 * 17 + 2 / 24 * 16) / released)
    assert math.isclose(planned_ratio(scope, P0, end, end + HOUR, S_MID), 0.8, rel_tol=1e-9)
    ratios = [planned_ratio(scope, P0, end, P0 + t, S_MID) for t in range(0, DAY + 2 * HOUR, 600)]
    assert ratios == sorted(ratios)
    # S at or before the period start, and every later period: exactly the whole-period figures
    for t in range(0, DAY + 2 * HOUR, 1800):
        whole = planned_ratio(scope, P0, end, P0 + t)
        assert planned_ratio(scope, P0, end, P0 + t, P0) == whole
        assert planned_ratio(scope, P0, end, P0 + t, P0 - 5 * HOUR) == whole
        assert planned_ratio(scope, end, end + DAY, end + t, S_MID) == planned_ratio(scope, end, end + DAY, end + t)
    # nothing is planned in a period before S, nor after the period's last window start
    assert planned_ratio(scope, P0, end, end + HOUR, end + 5 * HOUR) == 0.0
    assert planned_ratio(scope, P0, end, end + HOUR, end - 1800) == 0.0


def test_planned_spend_rate_in_a_first_partial_period_spends_the_pool_from_s() -> None:
    """The plan spends the pool between S and the period end: pool / (end − S); the whole-period rate
    from the next period on and for S at or before the period start; 0 where nothing is released."""
    scope = build_plan(_topology()).scope("b")
    end = P0 + DAY
    whole = planned_spend_rate(scope)
    assert planned_spend_rate(scope, P0, end, S_MID) == scope.pool / (end - S_MID)
    assert planned_spend_rate(scope, P0, end, S_MID) * (end - S_MID) == scope.pool
    for start in (None, P0, P0 - HOUR):
        assert planned_spend_rate(scope, P0, end, start) == whole
    assert planned_spend_rate(scope, end, end + DAY, S_MID) == whole
    assert planned_spend_rate(scope, P0, end, end - 1800) == 0.0  # no window starts in the last half hour
    assert planned_spend_rate(scope, P0, end, end + 5 * HOUR) == 0.0  # S in a later period


_FRONT_YAML = """
version: 1
sources:
  s: {{topic: t, privacy_unit: user_id, timestamp: ts, allowed_lateness: 30s}}
budgets:
  b: {{epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d, reserve: 0.2, warn_at: 0.8}}
metrics:
{metrics}sinks: {{releases: r, dead_letter: d}}
"""
_HOURLY = """  hourly:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    contribution: {max_per_key: 1}
    mechanism: gaussian
"""
_CAPPED = """  minutely:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 1, max_windows: 60}
    mechanism: gaussian
"""


def _front_loaded(hourly: bool = True):
    """A 1-day scope of a minute metric under max_windows 60 (and, with `hourly`, an hourly metric of
    the same weight): the minute metric's share is spent in the first hour of each period."""
    return load_topology_text(_FRONT_YAML.format(metrics=(_HOURLY if hourly else "") + _CAPPED))


def test_planned_spend_rate_front_loads_a_max_windows_metric() -> None:
    """Hourly (uncapped) and minutely (m = 60) of equal weight: each gets half the pool; the hourly half is
    spread over the day, the minutely half over the first hour (its cost / 60 s), then 0. Without `now`
    the rate is the period's average, as before."""
    scope = build_plan(_front_loaded()).scope("b")
    end = P0 + DAY
    half = scope.pool / 2
    first_hour, after = half / DAY + half / HOUR, half / DAY
    for t in (P0, P0 + 1, P0 + 59, P0 + 60, P0 + 30 * 60, P0 + HOUR - 1):
        assert math.isclose(planned_spend_rate(scope, P0, end, now=t), first_hour, rel_tol=1e-12), t - P0
    for t in (P0 + HOUR, P0 + HOUR + 1, P0 + 12 * HOUR, end - 1):
        assert math.isclose(planned_spend_rate(scope, P0, end, now=t), after, rel_tol=1e-12), t - P0
    assert planned_spend_rate(scope, P0, end, now=P0 + HOUR) < planned_spend_rate(scope, P0, end, now=P0 + HOUR - 1)
    # the same shape in every period, and the same without an S or with S at or before the period start
    for start in (None, P0, P0 - HOUR):
        assert planned_spend_rate(scope, end, end + DAY, start, now=end + 10) == planned_spend_rate(
            scope, P0, end, start, now=P0 + 10
        )
    assert planned_spend_rate(scope, P0, end) == planned_spend_rate(scope) == scope.pool / DAY
    # over the period it spends the pool (the rate is constant within each minute)
    spent = math.fsum(planned_spend_rate(scope, P0, end, now=t) * 60 for t in range(P0, end, 60))
    assert math.isclose(spent, scope.pool, rel_tol=1e-9)


_RUNNING = """
  so_far:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    release: running_total
    contribution: {max_per_period: 10}
    mechanism: gaussian
"""


def test_a_running_totals_lump_is_planned_with_its_first_step() -> None:
    """A running total is one lump a period, charged with its first step: the plan spends its half of the
    pool over that first minute (cost / 60 s), then only the hourly metric's half over the day, so the
    planned ratio after the first minute already holds the lump and the burn-rate rules read a lump on
    plan as on plan."""
    scope = build_plan(load_topology_text(_FRONT_YAML.format(metrics=_HOURLY + _RUNNING))).scope("b")
    end = P0 + DAY
    half = scope.pool / 2
    running = next(m for m in scope.metrics if m.name == "so_far")
    assert running.max_windows == 1 and running.charged == 1 and math.isclose(running.per_release_cost, half)
    for t in (P0, P0 + 59):
        assert math.isclose(planned_spend_rate(scope, P0, end, now=t), half / 60 + half / DAY, rel_tol=1e-12)
    for t in (P0 + 60, P0 + HOUR, end - 1):
        assert math.isclose(planned_spend_rate(scope, P0, end, now=t), half / DAY, rel_tol=1e-12)
    assert math.isclose(planned_spent(scope, P0, end, P0 + 60), half, rel_tol=1e-12)
    assert math.isclose(planned_spent(scope, P0, end, P0 + HOUR), half + half / 24, rel_tol=1e-12)


def test_planned_spend_rate_of_a_capped_metric_integrates_to_planned_spent() -> None:
    """A scope of the capped minute metric alone: cost / 60 s for the first hour, then exactly 0 (the burn-rate
    rules then have no series); at each window end the rate's integral is `planned_spent`."""
    scope = build_plan(_front_loaded(hourly=False)).scope("b")
    (metric,) = scope.metrics
    end = P0 + DAY
    assert metric.max_windows == 60 and metric.charged == 60
    assert math.isclose(planned_spend_rate(scope, P0, end, now=P0), metric.per_release_cost / 60, rel_tol=1e-12)
    assert planned_spend_rate(scope, P0, end, now=P0 + HOUR) == 0.0
    assert planned_spend_rate(scope, P0, end, now=end - 1) == 0.0
    integral = 0.0
    for k in range(1, 120):
        integral += planned_spend_rate(scope, P0, end, now=P0 + (k - 1) * 60) * 60
        assert math.isclose(integral, planned_spent(scope, P0, end, P0 + k * 60), rel_tol=1e-9), k


def test_planned_spend_rate_front_loads_from_a_mid_period_start() -> None:
    """From S = 06:30 the minute metric pays for its 60 windows from 06:30 (to 07:30) and the hourly one for
    its 17 from 07:00: the minute metric's part is spent by 07:30, the hourly part over S .. period end."""
    scope = build_plan(_front_loaded()).scope("b")
    end = P0 + DAY
    planned = scope.planned_from(P0, end, S_MID)
    assert planned["minutely"][0] == 60 and planned["hourly"][0] == 17
    even = planned["hourly"][0] * planned["hourly"][1] / (end - S_MID)
    front = planned["minutely"][1] / 60
    assert planned_spend_rate(scope, P0, end, S_MID, now=S_MID - 60) == even  # not before S
    for t in (S_MID, S_MID + 60, S_MID + HOUR - 1):
        assert math.isclose(planned_spend_rate(scope, P0, end, S_MID, now=t), even + front, rel_tol=1e-12)
    assert planned_spend_rate(scope, P0, end, S_MID, now=S_MID + HOUR) == even
    spent = math.fsum(planned_spend_rate(scope, P0, end, S_MID, now=t) * 60 for t in range(S_MID, end, 60))
    assert math.isclose(spent, scope.pool, rel_tol=1e-9)
    # from 23:30 only 30 minute windows are released: the whole pool goes to them, none to the hourly metric
    late = scope.planned_from(P0, end, end - 1800)
    assert late["hourly"][0] == 0 and late["minutely"][0] == 30
    assert planned_spend_rate(scope, P0, end, end - 1800, now=end - 60) == late["minutely"][1] / 60
    assert math.isclose(late["minutely"][1] * 30, scope.pool, rel_tol=1e-12)
    assert planned_spend_rate(scope, P0, end, end + 5 * HOUR, now=end - 60) == 0.0  # S in a later period


def test_budget_reader_serves_the_planned_spend_rate_at_its_clock() -> None:
    """The reader passes its (injected) clock to `planned_spend_rate`: the front-loaded rate in the first
    hour, the hourly metric's alone after it."""
    topology = _front_loaded()
    plan = build_plan(topology).scope("b")

    async def body(now: float) -> float | None:
        ledger = await open_ledger("memory", topology, clock=_Clock(now))
        return (await BudgetReader(topology, clock=_Clock(now)).read(ledger))[0].planned_spend_rate

    during, after = asyncio.run(body(P0 + 30 * 60)), asyncio.run(body(P0 + 2 * HOUR))
    assert during == planned_spend_rate(plan, P0, P0 + DAY, now=P0 + 30 * 60)
    assert after == planned_spend_rate(plan, P0, P0 + DAY, now=P0 + 2 * HOUR)
    assert during is not None and after is not None
    assert math.isclose(during, after * 25, rel_tol=1e-12)  # (1/DAY + 1/HOUR) over 1/DAY


def test_on_plan_the_gauge_and_the_ledger_agree_in_a_first_partial_period() -> None:
    """Charging every window from S = 06:30 at its quote, the ledger's spent ratio after each close equals
    the planned ratio at that time (to the ledger's rounding), as it does in a whole period."""

    async def body(start: int) -> list[tuple[float, float]]:
        topology = _topology()
        plan = build_plan(topology).scope("b")
        ledger = await open_ledger("memory", topology, clock=_Clock(start), schedule_start=start)
        windows = []
        for name, m in topology.metrics.items():
            first = -(-start // m.window.every_s) * m.window.every_s
            windows += [(s + m.window.size_s, s, name) for s in range(first, P0 + DAY, m.window.every_s)]
        out = []
        windows.sort()
        for k, (end, s, name) in enumerate(windows):
            q = await ledger.quote(name, s, end)
            later = ((period_id(DAY, P0 + DAY), P0 + DAY),) if end > P0 + DAY else ()
            req = ReleaseRequest(f"{name}{s}", "b", q.period_id, name, s, end, q.cost, b"{}", extra_periods=later)
            assert (await ledger.charge(req)).outcome is Outcome.CHARGED
            if k + 1 == len(windows) or windows[k + 1][0] != end:  # every window closing at `end` is charged
                block = next(h for h in await ledger.history("b") if h.start == P0)
                out.append((block.spent_units / block.cap_units, planned_ratio(plan, P0, P0 + DAY, end, start)))
        return out

    for start in (P0, S_MID):
        pairs = asyncio.run(body(start))
        assert len(pairs) == (25 if start == P0 else 18)  # one per close time
        for spent, planned in pairs:
            assert math.isclose(spent, planned, abs_tol=1e-9), (start - P0, spent, planned)


def test_budget_reader_counts_the_plan_from_the_deployment_start() -> None:
    """The reader takes S from the ledger it reads (the release side's in-process ledger prices with it), or
    from the topology's `start:`; without either it counts from the period start."""
    from dataclasses import replace

    clock = _Clock(P0 + 12.5 * HOUR)
    plan = build_plan(_topology()).scope("b")

    async def body() -> list[tuple[float | None, float | None]]:
        out = []
        for topology, start in (
            (_topology(), S_MID),
            (replace(_topology(), schedule_start=S_MID), None),
            (_topology(), None),
        ):
            ledger = await open_ledger("memory", topology, clock=clock, schedule_start=start)
            figures = (await BudgetReader(topology, clock=clock).read(ledger))[0]
            out.append((figures.planned_ratio, figures.planned_spend_rate))
        return out

    mid, declared, plain = asyncio.run(body())
    now = P0 + 12.5 * HOUR
    assert mid == declared == (planned_ratio(plan, P0, P0 + DAY, now, S_MID), plan.pool / (P0 + DAY - S_MID))
    assert plain == (planned_ratio(plan, P0, P0 + DAY, now), planned_spend_rate(plan))
    assert mid[0] > plain[0]  # the daily window's half of the pool is not planned from 06:30


def test_spent_total_sums_blocks_and_never_goes_down() -> None:

    def block(pid: str, units: int) -> SimpleNamespace:
        return SimpleNamespace(period_id=pid, spent_units=units)

    totals = SpentTotals()
    totals.update("b", [block("d3", 5), block("d2", 100), block("d1", 1000)])  # a full read
    assert totals.units("b") == 1105
    totals.update("b", [block("d3", 7)])  # a recent-blocks read: older blocks still count
    assert totals.units("b") == 1107
    totals.update("b", [block("d4", 1), block("d3", 6)])  # a new period; a stale smaller read is ignored
    assert totals.units("b") == 1108
    assert totals.units("other") == 0


# ---- the budget reader on the in-process ledger -----------------------------------------------------


class _Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _request(rid: str, metric: str, start: int, end: int, cost: float) -> ReleaseRequest:
    return ReleaseRequest(rid, "b", period_id(DAY, start), metric, start, end, cost, b"{}")


def test_budget_reader_matches_status_and_sums_history_across_periods() -> None:
    topology = _topology()
    clock = _Clock(P0 + 5 * HOUR)

    async def body():
        ledger = await open_ledger("memory", topology, clock=clock)
        assert (await ledger.charge(_request("r1", "hourly", P0, P0 + HOUR, 1e-4))).outcome is Outcome.CHARGED
        assert (
            await ledger.charge(_request("r2", "hourly", P0 + HOUR, P0 + 2 * HOUR, 2e-4))
        ).outcome is Outcome.CHARGED
        reader = BudgetReader(topology, clock=clock)
        first = (await reader.read(ledger))[0]
        status1 = await ledger.status("b")
        clock.t = P0 + DAY + 3 * HOUR  # next day
        assert (
            await ledger.charge(_request("r3", "hourly", P0 + DAY, P0 + DAY + HOUR, 5e-5))
        ).outcome is Outcome.CHARGED
        second = (await reader.read(ledger))[0]
        status2 = await ledger.status("b")
        history = await ledger.history("b", 100)
        return first, status1, second, status2, history

    first, status1, second, status2, history = asyncio.run(body())
    assert first.ratio == status1.ratio and first.spent == status1.spent and first.cap == status1.cap
    assert first.currency == "rho" and first.state == "normal" and not first.breaker_open
    assert first.warn_ratio == 0.8 and math.isclose(first.reserve_ratio, 0.2, rel_tol=1e-9)
    assert first.period_end - first.period_start == DAY and first.period_start == P0
    assert first.spent_total == first.spent  # one period so far (charges are rounded up to a 1e-12 unit)
    assert math.isclose(first.spent_total, 3e-4, abs_tol=1e-11)
    plan = build_plan(_topology()).scope("b")
    assert first.planned_ratio == planned_ratio(plan, P0, P0 + DAY, P0 + 5 * HOUR)
    assert second.ratio == status2.ratio and second.period_start == P0 + DAY
    assert len(history) == 2
    assert second.spent_total == sum(b.spent_units for b in history) / 10**12
    assert second.spent_total > first.spent_total


def test_a_charge_landing_during_a_read_is_never_counted_before_its_public_time() -> None:
    """A release charged while the reader reads (here: after the status, before the period blocks) and due
    at a P(w) still to come is in neither the spend nor `spent_total`. The audit is read last, so every
    charge the snapshots hold is in it (read first, the total showed the charge early: 3e-4), and each
    snapshot hides only the charges it holds (hiding it from the status too showed 0 spent)."""
    topology = _topology()
    clock = _Clock(P0 + 5 * HOUR)

    def published_at(t: int) -> bytes:
        return b'{"published_at":"%s"}' % time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t)).encode()

    class RacingLedger:
        """The ledger, with one charge landing between the reader's status and history reads."""

        def __init__(self, ledger: Any) -> None:
            self._ledger, self._raced = ledger, False

        def __getattr__(self, name: str) -> Any:
            return getattr(self._ledger, name)

        async def history(self, scope: str, limit: int = 30) -> Any:
            if not self._raced:
                self._raced = True
                early = _request("r2", "hourly", P0 + 4 * HOUR, P0 + 5 * HOUR, 2e-4)
                charged = await self._ledger.charge(early._replace(payload=published_at(P0 + 5 * HOUR + 60)))
                assert charged.outcome is Outcome.CHARGED
            return await self._ledger.history(scope, limit)

    async def body():
        ledger = await open_ledger("memory", topology, clock=clock)
        done = _request("r1", "hourly", P0 + 3 * HOUR, P0 + 4 * HOUR, 1e-4)
        assert (await ledger.charge(done._replace(payload=published_at(P0 + 4 * HOUR + 5)))).outcome is Outcome.CHARGED
        figures = (await BudgetReader(topology, clock=clock).read(RacingLedger(ledger)))[0]
        return figures, await ledger.status("b")

    figures, status = asyncio.run(body())
    assert math.isclose(status.spent, 3e-4, abs_tol=1e-11)  # both charges are in the ledger
    assert math.isclose(figures.spent, 1e-4, abs_tol=1e-11) and figures.spent_total == figures.spent


def test_budget_collector_renders_every_budget_family_and_ledger_up() -> None:
    topology = _topology("pure")
    clock = _Clock(P0 + 5 * HOUR)

    async def body() -> bytes:
        ledger = await open_ledger("memory", topology, clock=clock)
        await ledger.charge(_request("r1", "hourly", P0, P0 + HOUR, 0.01))
        collector = BudgetCollector(LedgerSource("memory", shared=lambda: ledger), BudgetReader(topology, clock=clock))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        assert await collector.refresh()
        return generate_latest(registry)

    text = asyncio.run(body()).decode()
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    assert samples[("dpstream_ledger_up", ())] == 1.0
    assert samples[("dpstream_budget_cap", (("currency", "epsilon"), ("scope", "b")))] == 1.0
    spent = samples[("dpstream_budget_spent", (("currency", "epsilon"), ("scope", "b")))]
    assert math.isclose(spent, 0.01, abs_tol=1e-11)  # charges round up to a 1e-12 unit
    assert samples[("dpstream_budget_spent_ratio", (("scope", "b"),))] == spent  # cap 1
    assert samples[("dpstream_budget_spent_total", (("currency", "epsilon"), ("scope", "b")))] == spent
    assert samples[("dpstream_budget_epsilon_spent", (("scope", "b"),))] == spent
    assert samples[("dpstream_budget_period_seconds", (("scope", "b"),))] == DAY
    assert samples[("dpstream_budget_period_end_timestamp_seconds", (("scope", "b"),))] == P0 + DAY
    assert math.isclose(
        samples[("dpstream_budget_planned_spend_rate", (("currency", "epsilon"), ("scope", "b")))], 0.8 / DAY
    )
    assert samples[("dpstream_budget_state", (("scope", "b"), ("state", "normal")))] == 1.0
    assert samples[("dpstream_budget_state", (("scope", "b"), ("state", "warning")))] == 0.0
    assert samples[("dpstream_budget_state", (("scope", "b"), ("state", "open")))] == 0.0
    assert samples[("dpstream_breaker_open", (("scope", "b"),))] == 0.0
    for name in ("dpstream_budget_warn_ratio", "dpstream_budget_planned_ratio", "dpstream_budget_reserve_ratio"):
        assert (name, (("scope", "b"),)) in samples
    assert "# TYPE dpstream_budget_spent_total counter" in text


def test_budget_collector_reports_a_failing_ledger_as_down_and_serves_no_stale_gauge() -> None:
    class Broken:
        async def scopes(self):
            raise LedgerUnavailable("down")

        async def status(self, scope):
            raise LedgerUnavailable("down")

    topology = _topology()
    healthy = {"ledger": None}

    async def body() -> list[str]:
        ledger = await open_ledger("memory", topology, clock=_Clock(P0 + HOUR))
        healthy["ledger"] = ledger
        collector = BudgetCollector(LedgerSource("memory", shared=lambda: healthy["ledger"]), BudgetReader(topology))
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        out = []
        assert await collector.refresh()
        out.append(generate_latest(registry).decode())
        healthy["ledger"] = Broken()
        assert not await collector.refresh()
        out.append(generate_latest(registry).decode())
        return out

    up, down = asyncio.run(body())
    assert "dpstream_ledger_up 1.0" in up and "dpstream_budget_spent_ratio{" in up
    assert "dpstream_ledger_up 0.0" in down and "dpstream_budget_" not in down


# ---- the worker collector ---------------------------------------------------------------------------


@dataclass
class _Stats:
    outcomes: Counter = field(default_factory=Counter)
    retries: Counter = field(default_factory=Counter)
    last_payload: dict = field(default_factory=dict)
    parked: Counter = field(default_factory=Counter)
    publish_misses: Counter = field(default_factory=Counter)


class _ReleaseSide:
    def __init__(self, topology) -> None:
        self.stats = _Stats()
        self.latency = LabelledHistogram("metric", topology.metrics, (0.1, 1.0))
        self.ledger_timings = LedgerTimings()
        self.releaser = SimpleNamespace(counts=ReleaseCounts(swept=2, clamped=Counter({"hourly": 3})))
        self.windows: dict[str, list[int]] = {}
        self.clock_skew = ClockSkewGate(0.5, 30.0)

    def open_windows(self) -> dict[str, list[int]]:
        return self.windows


class _Ingest:
    def __init__(self) -> None:
        self.revoked_counts: dict[str, EventCounts] = {}
        self.hop_counts: dict[str, EventCounts] = {}
        self.live: list = []
        self.clock_skew = ClockSkewGate(0.5, 30.0)

    def pipelines(self) -> list:
        return self.live


def _samples(collector) -> dict:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_worker_collector_release_side() -> None:
    topology = _topology()
    side = _ReleaseSide(topology)
    now = P0 + 10 * HOUR
    side.stats.outcomes[("hourly", "published")] += 3
    side.stats.outcomes[("hourly", "ledger_unavailable")] += 1
    side.stats.retries["hourly"] += 1
    side.stats.last_payload["hourly"] = json.dumps({"noise": {"scale": 2.0, "stddev": 2.5}}).encode()
    side.latency.observe("hourly", 0.05)
    side.latency.observe("hourly", 0.5)
    side.windows = {"hourly": [P0 + 9 * HOUR, P0 + 8 * HOUR], "daily": []}
    got = _samples(WorkerCollector(topology, releases=side, clock=lambda: now))
    for m in topology.metrics:
        for o in ReleaseOutcome:
            assert (("dpstream_releases_total", (("metric", m), ("outcome", o.value)))) in got
    assert got[("dpstream_releases_total", (("metric", "hourly"), ("outcome", "published")))] == 3
    assert got[("dpstream_releases_total", (("metric", "hourly"), ("outcome", "ledger_unavailable")))] == 1
    assert got[("dpstream_release_retries_total", (("metric", "hourly"),))] == 1
    assert got[("dpstream_release_noise_stddev", (("metric", "hourly"),))] == 2.5
    assert ("dpstream_release_noise_stddev", (("metric", "daily"),)) not in got  # nothing released yet
    assert got[("dpstream_release_lag_seconds", (("metric", "hourly"),))] == 2 * HOUR - 30  # oldest, lateness 30 s
    assert got[("dpstream_release_lag_seconds", (("metric", "daily"),))] == 0
    assert got[("dpstream_windows_pending", (("metric", "hourly"),))] == 2
    assert got[("dpstream_release_latency_seconds_bucket", (("le", "0.1"), ("metric", "hourly")))] == 1
    assert got[("dpstream_release_latency_seconds_bucket", (("le", "+Inf"), ("metric", "hourly")))] == 2
    assert got[("dpstream_release_latency_seconds_count", (("metric", "daily"),))] == 0
    assert got[("dpstream_releases_swept_total", ())] == 2
    assert got[("dpstream_release_clamped_total", (("metric", "hourly"),))] == 3  # keys clamped to the grid
    for op in LEDGER_OPS:
        assert got[("dpstream_ledger_errors_total", (("op", op),))] == 0
        assert got[("dpstream_ledger_request_duration_seconds_count", (("op", op),))] == 0
    assert not any(k[0].startswith("dpstream_events") for k in got)  # a release-only process


def test_worker_collector_events_stay_monotone_across_a_revoke() -> None:
    topology = _topology()
    ingest = _Ingest()
    p0 = SimpleNamespace(
        source=SimpleNamespace(name="s"), counts=EventCounts(accepted=10, late=2, invalid=Counter({"not_json": 3}))
    )
    p0.refresh_counts = lambda: p0.counts
    p1 = SimpleNamespace(source=SimpleNamespace(name="s"), counts=EventCounts(accepted=5, capped=4, clamped=1))
    p1.refresh_counts = lambda: p1.counts
    ingest.live = [p0, p1]
    collector = WorkerCollector(topology, ingest=ingest)
    before = _samples(collector)
    assert before[("dpstream_events_total", (("outcome", "accepted"), ("source", "s")))] == 15
    assert before[("dpstream_events_total", (("outcome", "invalid"), ("source", "s")))] == 3
    assert before[("dpstream_events_total", (("outcome", "capped"), ("source", "s")))] == 4
    for reason in REASONS:
        assert ("dpstream_dead_letters_total", (("reason", reason), ("source", "s"))) in before
    # p0 is revoked: its totals fold into the source's base (what IngestService.drop_partitions does)
    fold_event_counts(ingest.revoked_counts.setdefault("s", EventCounts()), p0.refresh_counts())
    ingest.live = [p1]
    after = _samples(collector)
    for key, value in before.items():
        if key[0] in ("dpstream_events_total", "dpstream_dead_letters_total"):
            assert after[key] == value, key
    assert not any(k[0].startswith("dpstream_releases") for k in after)  # an ingest-only process


def test_noise_stddev_plain_mean_and_top_k() -> None:
    assert noise_stddev(b'{"noise": {"scale": 1.0, "stddev": 1.41}}') == 1.41
    assert noise_stddev(b'{"noise": {"sum": {"scale": 4, "stddev": 5.5}, "count": {"stddev": 1.0}}}') == 5.5
    assert noise_stddev(b'{"noise": {"scale": 3.0, "stddev": null}}') is None
    assert noise_stddev(b"not json") is None


# ---- the ledger timing proxy and histograms ---------------------------------------------------------


def test_timed_ledger_times_the_five_calls_counts_errors_and_passes_the_rest() -> None:
    class Fake:
        backend = "fake"

        async def quote(self, *a):
            return "q"

        async def charge(self, req):
            raise LedgerUnavailable("down")

        async def status(self, scope):
            return scope

    timings = LedgerTimings()
    timed = TimedLedger(Fake(), timings)

    async def body() -> None:
        assert await timed.quote("m", 0, 1) == "q"
        with pytest.raises(LedgerUnavailable):
            await timed.charge(object())
        assert await timed.status("b") == "b"  # not timed

    asyncio.run(body())
    assert timed.backend == "fake"
    assert timings.durations.count("quote") == 1 and timings.durations.count("charge") == 1
    assert timings.errors["charge"] == 1 and timings.errors["quote"] == 0
    assert sum(timings.durations.count(op) for op in LEDGER_OPS) == 2


def test_histogram_buckets_are_cumulative_and_le_inclusive() -> None:
    h = LabelledHistogram("op", ["a"], (0.1, 1.0))
    for v in (0.1, 0.5, 1.0, 7.0, float("nan")):
        h.observe("a", v)
    fam = h.family("x_seconds", "doc")
    got = {(s.name, s.labels.get("le")): s.value for s in fam.samples}
    assert got[("x_seconds_bucket", "0.1")] == 1
    assert got[("x_seconds_bucket", "1.0")] == 3
    assert got[("x_seconds_bucket", "+Inf")] == 4
    assert got[("x_seconds_count", None)] == 4 and math.isclose(got[("x_seconds_sum", None)], 8.6)


def test_the_report_cards_plan_curve_front_loads_as_the_gauges_do() -> None:
    """The report card draws the plan by `planned_ratio` at every window end: under max_windows 60 the minute
    metric's half of the pool is on the curve by 01:00, the hourly half a 24th per hour; the last point
    is the plan's whole ratio (1 − reserve). Its burn-rate bins subtract the same curve."""
    from dpstream.workers.report.build import plan_curve
    from dpstream.workers.report.planned import Span

    scope = build_plan(_front_loaded()).scope("b")
    curve = plan_curve(scope, Span(P0, DAY, None))
    at = dict(zip(curve["hours"], curve["ratio"], strict=True))
    assert len(at) == 1 + 1440 and at[0.0] == 0.0
    half = scope.pool / 2 / scope.cap
    assert math.isclose(at[1.0], half + half / 24, rel_tol=1e-12)
    assert math.isclose(at[0.5], half / 2, rel_tol=1e-12)  # 30 of the 60 paid minute windows, no hour yet
    assert math.isclose(at[24.0], scope.pool / scope.cap, rel_tol=1e-12)
    assert all(a <= b for a, b in zip(curve["ratio"], curve["ratio"][1:], strict=False))
