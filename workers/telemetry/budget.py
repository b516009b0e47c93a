"""Budget gauges read from the ledger at scrape time, for every worker and the exporter.

A scrape first awaits the ledger (`BudgetCollector.refresh`, under a timeout, on the caller's event
loop), then renders what it read (`collect`, synchronous, no I/O): the page handler never blocks the
loop on Redis, and the figures of one scrape come from one pass over the ledger.

Per `scope` (the topology's budget scopes that are registered in the ledger):

    dpstream_budget_cap{scope,currency}                this period's cap (ρ* or ε), from its block
    dpstream_budget_spent{scope,currency}              spent this period
    dpstream_budget_spent_ratio{scope}                 spent / cap: `dpstream budget status --json`'s ratio
    dpstream_budget_warn_ratio{scope}                  the scope's warn_at
    dpstream_budget_planned_ratio{scope}               what the plan has spent by now, / cap (from S in
                                                       the deployment's first period: `planned_spent`)
    dpstream_budget_spent_total{scope,currency}        counter: spend summed over every period block
    dpstream_budget_planned_spend_rate{scope,currency} currency per second the plan spends now: each
                                                       metric's part of the pool / period seconds (/ (period
                                                       end − S) in the first period), plus for a metric under
                                                       contribution.max_windows m its per-release cost / window
                                                       every_s until its m-th window of the period ends (its
                                                       whole share is spent in its first m), 0 after
    dpstream_budget_epsilon_spent{scope}               ε-equivalent of this period's spend
    dpstream_budget_period_end_timestamp_seconds{scope}
    dpstream_budget_period_seconds{scope}
    dpstream_budget_reserve_ratio{scope}               reserve / cap of this period
    dpstream_budget_projected_ratio{scope}             spend at the period's average rate, at period end, / cap
                                                       (the ledger's; the alert rules project along the plan)
    dpstream_budget_state{scope,state}                 1 for the current of normal|warning|open
    dpstream_breaker_open{scope}
    dpstream_releases_parked{scope}                    windows parked now (repeated internal release
                                                       failures), waiting for `dpstream budget retry`
    dpstream_ledger_up                                 1 if the ledger answered this scrape

Published spend only: a release is charged before its public time P(w) = C(w) + publish_delay
and published at P(w), so a charge whose P(w) is still to come is left out of every figure here
(spent, ratio, ε, state, projection, spent_total) until P(w) has passed; otherwise the gauges
would show when processing finished, which depends on the data. The charges of the last
publish_delay (plus a minute of clock slack) are read from the audit trail and each one's P(w)
from its stored record (`published_at`).

`currency` is `rho` for zCDP scopes and `epsilon` for pure ones. Everything here is a budget figure
of the ledger or of the topology's plan: no event, key, unit or aggregate reaches this module.
"""

from __future__ import annotations

__all__ = [
    "CURRENCY",
    "BudgetCollector",
    "BudgetReader",
    "LedgerSource",
    "ScopeFigures",
    "SpentTotals",
    "planned_ratio",
    "planned_spend_rate",
    "planned_spent",
]

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dpstream.topology.accounting import epsilon_equivalent
from dpstream.topology.allocation import weighted_windows, window_weight
from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Topology
from dpstream.topology.schedule import Schedule
from dpstream.workers.ledger.decision import state_of
from dpstream.workers.ledger.types import AuditKind, State
from dpstream.workers.ledger.units import UNITS_PER_CURRENCY, share_of_units, units_to_float
from dpstream.workers.release.record import publish_time_of

_log = logging.getLogger(__name__)

CURRENCY = {"zcdp": "rho", "pure": "epsilon"}
"""The `currency` label of a scope's accounting."""

STATES = ("normal", "warning", "open")
"""Values of the `state` label of `dpstream_budget_state` (the ledger's `State`)."""

RECENT_BLOCKS = 3
"""Period blocks re-read at every scrape for `spent_total` (the current one and the two before it:
a late window or a straddling charge still lands there)."""

FULL_REFRESH_S = 300.0
"""Every block is re-read this often (and at the first scrape); older blocks rarely change."""

ALL_BLOCKS = 1_000_000
"""`history` limit that reads every block."""

READ_TIMEOUT_S = 5.0
"""A scrape gives up on the ledger after this long and reports `dpstream_ledger_up 0`."""

CLOCK_SLACK_S = 60
"""Charges are made after C(w) on a worker's clock; this much skew is allowed for when looking back
for charges whose P(w) has not passed yet."""

NO_TOPOLOGY_LOOKBACK_S = 3600
"""How far back to look for unpublished charges when no topology gives the publish delay."""

_KNOWN_TIMES = 4096
"""P(w) of this many release_ids is remembered between scrapes."""


# ---- plan arithmetic (pure) -------------------------------------------------------------------


def planned_spent(
    scope_plan: Any, period_start: int, period_end: int, now: float, schedule_start: int | None = None
) -> float:
    """What the plan (`topology.plan.scope_plan`) has spent by `now` in the period: each metric's
    per-release cost on plan times its windows of the period that have ended, up to the windows it
    pays for (under `contribution.max_windows` m, its share is spent in its first m windows). Reaches
    the pool when the period's last window ends.

    In a deployment's first period (the schedule start S, `schedule_start`, after the period start)
    only windows starting at or after S are released (the public schedule) and the ledger spends the
    whole pool on them: the costs are the plan's over those windows alone (`ScopePlan.planned_from`),
    and only they count here. S at or before the period start changes nothing."""
    planned = scope_plan.planned_from(period_start, period_end, schedule_start)
    return math.fsum(
        _shaped_spent(m, planned[m.name], period_start, period_end, now, schedule_start)
        if getattr(m, "hour_weights", None) is not None
        else planned[m.name][1]
        * min(
            planned[m.name][0],
            Schedule(m.window_size_s, m.window_every_s, schedule_start).ended(period_start, period_end, now),
        )
        for m in scope_plan.metrics
        if planned[m.name][0] > 0
    )


def _shaped_spent(
    m: Any, planned: tuple[int, float], period_start: int, period_end: int, now: float, schedule_start: int | None
) -> float:
    """A shaped metric's planned spend by `now`: its part of the pool (releases × mean cost) times the
    weighted share of its windows that have ended (`topology.allocation.weighted_windows`)."""
    grid = Schedule(m.window_size_s, m.window_every_s, schedule_start)
    whole = weighted_windows(grid.starts_by_hour(period_start, period_end), m.hour_weights, m.max_windows)
    until = min(period_end, math.floor(now) - m.window_size_s + 1)  # s + size ≤ now
    ended = weighted_windows(grid.starts_by_hour(period_start, until), m.hour_weights, m.max_windows)
    return planned[0] * planned[1] * ended / whole if whole > 0 else 0.0


def planned_ratio(
    scope_plan: Any, period_start: int, period_end: int, now: float, schedule_start: int | None = None
) -> float:
    """`planned_spent` over the plan's cap: 0 at the period start (or at S), 1 − reserve at its end."""
    cap = float(scope_plan.cap)
    return planned_spent(scope_plan, period_start, period_end, now, schedule_start) / cap if cap > 0 else 0.0


def planned_spend_rate(
    scope_plan: Any,
    period_start: int | None = None,
    period_end: int | None = None,
    schedule_start: int | None = None,
    *,
    now: float | None = None,
) -> float:
    """Currency per second the plan spends at `now` (the burn-rate denominator: rate(dpstream_budget_spent_total)
    over a window / this averaged over the same window = 1 on plan).

    A metric without `contribution.max_windows` spends its part of the pool evenly over the period. A
    metric under max_windows m spends its whole share in its first m windows (`planned_spent`): its
    per-release cost per `every` seconds (cost / window every_s) from one `every` before its first
    window of the period ends until its m-th ends, then 0. Its rate integrates to exactly
    `planned_spent` at each of its window ends, and the sum over the period to the pool. On a 1-day
    scope of an hourly metric and a minute metric under m = 60 of equal weight the rate is the minute
    metric's half of the pool over the first hour plus the hourly one's half over the day, then the
    latter alone. A metric with a budget schedule (`schedule:`, no max_windows) spends at the rate of
    the window whose end is next, its cost on plan over `every` (`_shaped_rate`): twice the off-peak
    rate in hours of weight 2. Without `now` (or without the period) it is the period's average, pool
    over its length.

    In a deployment's first period (S after the period start) the ledger spends the whole pool on the
    windows from S (`ScopePlan.planned_from`), so the spread-out part is spread over the time from S to
    the period end (pool / (period end − S) with no capped metric): a burn rate of 1 still means "on
    plan", and a deployment that starts late in a period does not read as burning fast (from 18:00 on
    a daily scope the plan itself spends 4× the daily rate). When no window of the period starts at or
    after S the plan spends nothing in it: 0 (the burn-rate rules then have no series, as for a scope
    with nothing planned). From the next period on it is the whole period's rate again."""
    period_s = float(scope_plan.period_s)
    pool = float(scope_plan.pool)
    if period_start is None or period_end is None:
        return pool / period_s if period_s > 0 else 0.0
    planned = scope_plan.planned_from(period_start, period_end, schedule_start)
    span = period_s
    if schedule_start is not None and schedule_start > period_start:
        if not any(n for n, _ in planned.values()):
            return 0.0
        span = float(period_end - int(schedule_start))
    if span <= 0:
        return 0.0
    capped = [m for m in scope_plan.metrics if m.max_windows is not None]
    shaped = [m for m in scope_plan.metrics if m.max_windows is None and _shaped(m)]
    if now is None or not (capped or shaped):
        return pool / span
    even = math.fsum(
        planned[m.name][0] * planned[m.name][1] for m in scope_plan.metrics if m.max_windows is None and not _shaped(m)
    )
    front = math.fsum(
        planned[m.name][1] / m.window_every_s
        for m in capped
        if _front_loading(m, planned[m.name][0], period_start, period_end, now, schedule_start)
    )
    peaks = math.fsum(_shaped_rate(m, planned[m.name], period_start, period_end, now, schedule_start) for m in shaped)
    return even / span + front + peaks


def _shaped(metric: Any) -> bool:
    return getattr(metric, "hour_weights", None) is not None


def _shaped_rate(
    m: Any, planned: tuple[int, float], period_start: int, period_end: int, now: float, schedule_start: int | None
) -> float:
    """A shaped metric's planned rate at `now`: the cost on plan of the window whose end is next
    (its part of the pool × h(w) / the period's weighted windows) over `every` seconds, so the rate
    integrates to `planned_spent` at each window end; 0 outside its windows of the period (from S)."""
    every = m.window_every_s
    t = math.floor(now) - m.window_size_s + every
    start = t - t % every
    lo = period_start if schedule_start is None or schedule_start <= period_start else int(schedule_start)
    if planned[0] <= 0 or every <= 0 or not lo <= start < period_end:
        return 0.0
    grid = Schedule(m.window_size_s, every, schedule_start)
    whole = weighted_windows(grid.starts_by_hour(period_start, period_end), m.hour_weights, None)
    part = planned[0] * planned[1]
    return part * window_weight(m.hour_weights, start) / whole / every if whole > 0 else 0.0


def _front_loading(
    metric: Any, paid: int, period_start: int, period_end: int, now: float, schedule_start: int | None
) -> bool:
    """True while a metric under max_windows spends on plan at `now`: from one `every` before its first
    window of the period (from S) ends until its `paid`-th window ends."""
    if paid <= 0 or metric.window_every_s <= 0:
        return False
    schedule = Schedule(metric.window_size_s, metric.window_every_s, schedule_start)
    lo = period_start if schedule_start is None or schedule_start <= period_start else int(schedule_start)
    first = schedule.first_start_at_or_after(lo)
    if first >= period_end:
        return False
    begins = first + metric.window_size_s - metric.window_every_s
    return begins <= now and schedule.ended(period_start, period_end, now) < paid


def hidden_in(unpublished: Mapping[str, list[tuple[int, int]]], period_id: str, spent_units: int) -> int:
    """Units of the unpublished charges (`BudgetReader.unpublished`) that a snapshot of `period_id` whose
    spend is `spent_units` holds: those whose spend after the charge is at most it (a period's spend only
    grows, each paying charge raising it). A charge made after the snapshot was read is not in it, and
    taking it out as well would show less than what was published."""
    return sum(paid for after, paid in unpublished.get(period_id, ()) if after <= spent_units)


def as_published(status: Any, unpublished_units: int) -> Any:
    """`status` (a `ScopeStatus`) without `unpublished_units` of its period's spend: the charges whose
    P(w) has not passed yet. Spend, ratio, ε, state and projection follow; the breaker stays."""
    if unpublished_units <= 0:
        return status
    spent = max(0, int(status.spent_units) - unpublished_units)
    cap = int(status.cap_units)
    zcdp = status.accounting == "zcdp"
    equiv = epsilon_equivalent(zcdp, units_to_float(spent), float(status.delta))
    scale = spent / status.spent_units if status.spent_units else 0.0
    state = state_of(spent, share_of_units(cap, float(status.warn_at)), status.breaker is not None)
    return replace(
        status,
        spent=units_to_float(spent),
        spent_units=spent,
        ratio=spent / cap if cap > 0 else 0.0,
        epsilon_equiv=equiv.epsilon,
        state=state if status.state is not State.OPEN else State.OPEN,
        projected_spend=status.projected_spend * scale,
        projected_ratio=status.projected_ratio * scale,
    )


class SpentTotals:
    """`dpstream_budget_spent_total`: a scope's spend summed over its period blocks, in units.

    Each block's spend only grows (the ledger never refunds), so the largest spend seen per block is
    kept: a scrape that re-reads only the newest blocks still counts every older one, and the total
    never goes down (a counter, safe for `rate()`)."""

    def __init__(self) -> None:
        self._blocks: dict[str, dict[str, int]] = {}

    def update(self, scope: str, blocks: Iterable[Any]) -> None:
        """Merge `PeriodSummary`-like blocks (period_id, spent_units) of one scope."""
        seen = self._blocks.setdefault(scope, {})
        for block in blocks:
            units = int(block.spent_units)
            if units > seen.get(block.period_id, -1):
                seen[block.period_id] = units

    def units(self, scope: str) -> int:
        """Total spent units of `scope` over every block seen."""
        return sum(self._blocks.get(scope, {}).values())


# ---- what one scrape reads --------------------------------------------------------------------


@dataclass(frozen=True)
class ScopeFigures:
    """One scope's budget figures at one scrape."""

    scope: str
    currency: str
    cap: float
    spent: float
    ratio: float
    warn_ratio: float
    epsilon_spent: float
    period_start: int
    period_end: int
    state: str
    breaker_open: bool
    projected_ratio: float
    spent_total: float
    reserve_ratio: float | None
    planned_ratio: float | None
    planned_spend_rate: float | None
    parked: int | None = None
    """Windows parked in the scope now (None when the ledger cannot list them)."""


class LedgerSource:
    """A ledger opened lazily without registering anything (read-only use), reopened after a failure.

    `where` is a redis:// URL. `shared` (optional) returns a ledger another part of the process
    already holds; it is used for the in-process `memory` backend, which cannot be opened twice."""

    def __init__(
        self,
        where: str,
        *,
        allow_volatile: bool = False,
        shared: Callable[[], Any] | None = None,
        max_connections: int = 4,
    ) -> None:
        self.where = where
        self._allow_volatile = allow_volatile
        self._shared = shared
        self._max_connections = max_connections
        self._ledger: Any = None

    async def get(self) -> Any:
        """The ledger (opened now if needed); raises what `open_ledger` raises."""
        if self._ledger is not None:
            return self._ledger
        if self.where == "memory":
            ledger = self._shared() if self._shared is not None else None
            if ledger is None:
                raise ConfigError("the in-process ledger is not open in this process")
            return ledger
        from dpstream.workers.ledger import open_ledger

        self._ledger = await open_ledger(
            self.where,
            None,
            allow_volatile=self._allow_volatile,
            actor="telemetry",
            max_connections=self._max_connections,
        )
        return self._ledger

    async def reset(self) -> None:
        """Drop the connection after a failure; the next `get` opens a new one."""
        ledger, self._ledger = self._ledger, None
        if ledger is not None:
            with contextlib.suppress(Exception):  # it is being discarded because it failed
                await ledger.close()

    async def close(self) -> None:
        """Close the ledger this source opened (not a shared one)."""
        await self.reset()


class BudgetReader:
    """Reads the figures of the topology's scopes from a ledger (one pass per scrape).

    The projection and the plan's figures count from the schedule start S in its first period: the
    S recorded with the scope (what `budget status` reads, with or without a topology); for a scope
    without one, the topology's `start:`, else the S the ledger prices with (an in-process ledger
    shared with the release side), else the one recorded in the ledger for this topology version
    (read only; until a worker records one the plan counts from the period start). Once known it
    is kept: S never changes."""

    def __init__(self, topology: Topology | None, *, clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self._scopes: list[str] = list(topology.budgets) if topology is not None else []
        self._version = topology.topology_version if topology is not None else None
        self._start: int | None = (
            int(topology.schedule_start) if topology is not None and topology.schedule_start is not None else None
        )
        self._plans: dict[str, Any] = {}
        if topology is not None:
            from dpstream.topology.plan import build_plan

            self._plans = {s.name: s for s in build_plan(topology).scopes}
        self._totals = SpentTotals()
        self._full_at: dict[str, float] = {}
        self._lookback_s = topology.publish_delay_s + CLOCK_SLACK_S if topology is not None else NO_TOPOLOGY_LOOKBACK_S
        self._publish_times: dict[str, int | None] = {}
        """release_id → P(w) from its stored record (None: no record stored)."""

    async def scopes(self, ledger: Any) -> list[str]:
        """The topology's scopes; without a topology, every scope registered in the ledger."""
        return self._scopes or list(await ledger.scopes())

    async def read(self, ledger: Any) -> list[ScopeFigures]:
        """Every scope's figures; a scope not registered in the ledger yet is left out. Ledger
        errors propagate (the scrape reports the ledger down)."""
        out = []
        for scope in await self.scopes(ledger):
            try:
                out.append(await self._read_scope(ledger, scope))
            except ConfigError:
                continue  # not registered yet: no worker of this topology has started
        return out

    async def schedule_start(self, ledger: Any) -> int | None:
        """The schedule start S of a scope with none recorded with it (None while no worker recorded one)."""
        if self._start is None and self._version is not None:
            start = ledger.schedule_start
            if start is None:
                start = await ledger.recorded_version_schedule_start(self._version)
            self._start = int(start) if start is not None else None
        return self._start

    async def unpublished(self, ledger: Any, scope: str, now: float) -> dict[str, list[tuple[int, int]]]:
        """period_id → (the period's spend after the charge, units paid) of each charge whose release's
        public time P(w) is after `now` and that paid something (`hidden_in` sums those a snapshot holds)."""
        out: dict[str, list[tuple[int, int]]] = {}
        for entry in await ledger.audit(scope, int((now - self._lookback_s) * 1000)):
            if entry.kind is not AuditKind.CHARGE:
                continue
            rid = entry.fields.get("release_id", "")
            if rid not in self._publish_times:
                stored = await ledger.stored_payload(scope, rid)
                if len(self._publish_times) >= _KNOWN_TIMES:
                    self._publish_times.clear()
                self._publish_times[rid] = publish_time_of(stored) if stored is not None else None
            at = self._publish_times[rid]
            paid = int(entry.fields.get("cost", 0))
            if at is not None and at > now and paid > 0:
                after = int(entry.fields.get("spent", 0))
                out.setdefault(entry.fields.get("period", ""), []).append((after, paid))
        return out

    async def _read_scope(self, ledger: Any, scope: str) -> ScopeFigures:
        plan = self._plans.get(scope)
        status = await ledger.status(scope)  # projected from the scope's S, as `budget status` does
        start = status.schedule_start
        if start is None and plan is not None:  # no S recorded with the scope yet (older workers)
            start = await self.schedule_start(ledger)
            if start is not None:
                status = await ledger.status(scope, start)
        mono = time.monotonic()
        full = mono - self._full_at.get(scope, -math.inf) >= FULL_REFRESH_S
        blocks = await ledger.history(scope, ALL_BLOCKS if full else RECENT_BLOCKS)
        if full:
            self._full_at[scope] = mono
        # the audit is read last, so every charge the status and the blocks above hold is in it; each
        # snapshot hides the unpublished charges it holds, and only those (`hidden_in`)
        hidden = await self.unpublished(ledger, scope, self._clock())
        status = as_published(status, hidden_in(hidden, status.period_id, status.spent_units))
        if hidden:
            blocks = [
                replace(b, spent_units=b.spent_units - hidden_in(hidden, b.period_id, b.spent_units)) for b in blocks
            ]
        self._totals.update(scope, blocks)
        # the current block (if opened) holds the period's terms; before its first charge the
        # period will open with the registered ones, which the plan of the same topology shares
        current = next((b for b in blocks if b.period_id == status.period_id), None)
        reserve_ratio: float | None = None
        if current is not None and current.cap_units > 0:
            reserve_ratio = current.reserve_units / current.cap_units
        elif plan is not None:
            reserve_ratio = float(plan.reserve_fraction)
        now = self._clock()
        state = status.state.value if hasattr(status.state, "value") else str(status.state)
        return ScopeFigures(
            scope=scope,
            currency=CURRENCY.get(status.accounting, status.accounting),
            cap=float(status.cap),
            spent=float(status.spent),
            ratio=float(status.ratio),
            warn_ratio=float(status.warn_at),
            epsilon_spent=float(status.epsilon_equiv),
            period_start=int(status.period_start),
            period_end=int(status.period_end),
            state=state,
            breaker_open=status.breaker is not None,
            projected_ratio=float(status.projected_ratio),
            spent_total=self._totals.units(scope) / UNITS_PER_CURRENCY,
            reserve_ratio=reserve_ratio,
            planned_ratio=(
                planned_ratio(plan, status.period_start, status.period_end, now, start) if plan is not None else None
            ),
            planned_spend_rate=(
                planned_spend_rate(plan, status.period_start, status.period_end, start, now=now)
                if plan is not None
                else None
            ),
            parked=len(await ledger.parked(scope)),
        )


class BudgetCollector(Collector):
    """The budget families of one process: `refresh()` (async) reads the ledger, `collect()` renders.

    Register it in the process's CollectorRegistry; call `refresh()` before `generate_latest` (the
    `/metrics` handlers do, holding `lock` across both so concurrent scrapes do not interleave)."""

    def __init__(
        self,
        source: LedgerSource,
        reader: BudgetReader,
        *,
        timeout_s: float = READ_TIMEOUT_S,
    ) -> None:
        self.source = source
        self.reader = reader
        self.timeout_s = timeout_s
        self.lock = asyncio.Lock()
        self.ledger_up = False
        self.figures: list[ScopeFigures] = []
        self._last_error: str | None = None

    async def refresh(self) -> bool:
        """Read the ledger now; True when it answered. On failure the figures are dropped (no stale
        gauge is served) and `dpstream_ledger_up` is 0."""
        try:
            self.figures = await asyncio.wait_for(self._read(), self.timeout_s)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # any failure to read is "the ledger is down" here
            self.figures = []
            self.ledger_up = False
            await self.source.reset()
            kind = type(exc).__name__
            if kind != self._last_error:  # once per kind of failure, never a value or a URL
                _log.warning("telemetry: budget ledger unreadable (%s); dpstream_ledger_up 0", kind)
                self._last_error = kind
            return False
        if self._last_error is not None:
            _log.warning("telemetry: budget ledger readable again")
            self._last_error = None
        self.ledger_up = True
        return True

    async def _read(self) -> list[ScopeFigures]:
        ledger = await self.source.get()
        return await self.reader.read(ledger)

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "dpstream_ledger_up",
            "1 if the budget ledger answered this scrape, else 0.",
            value=1.0 if self.ledger_up else 0.0,
        )
        if self.figures:
            yield from budget_families(self.figures)


def budget_families(figures: Sequence[ScopeFigures]) -> Iterator[Metric]:
    """The budget metric families of `figures` (scopes in the order given)."""

    def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
        return GaugeMetricFamily(name, doc, labels=labels)

    cap = gauge(
        "dpstream_budget_cap",
        "Cap of the scope's current period in its currency (rho for zCDP, epsilon for pure).",
        ["scope", "currency"],
    )
    spent = gauge(
        "dpstream_budget_spent", "Spent in the scope's current period, in its currency.", ["scope", "currency"]
    )
    ratio = gauge(
        "dpstream_budget_spent_ratio",
        "Spent / cap of the current period (as `dpstream budget status --json` ratio).",
        ["scope"],
    )
    warn = gauge(
        "dpstream_budget_warn_ratio",
        "The scope's warn_at: spent_ratio at or above it is the warning state (the reserve is being drawn).",
        ["scope"],
    )
    planned = gauge(
        "dpstream_budget_planned_ratio",
        "What the plan has spent by now in the current period (releases whose windows ended; in the "
        "deployment's first period, of the windows from its start), over the cap.",
        ["scope"],
    )
    total = CounterMetricFamily(
        "dpstream_budget_spent_total",
        "Spend summed over every period block of the scope, in its currency (for rate()).",
        labels=["scope", "currency"],
    )
    rate = gauge(
        "dpstream_budget_planned_spend_rate",
        "Currency per second the plan spends now: each metric's part of the pool / period seconds (in the "
        "deployment's first period: / seconds from its start to the period end); a metric under "
        "contribution.max_windows m adds its per-release cost / window step until its m-th window ends, then 0.",
        ["scope", "currency"],
    )
    eps = gauge(
        "dpstream_budget_epsilon_spent",
        "Epsilon-equivalent of the current period's spend "
        "(zCDP converted at the scope's delta; pure: the spend itself).",
        ["scope"],
    )
    end = gauge(
        "dpstream_budget_period_end_timestamp_seconds",
        "End of the scope's current period, Unix seconds (UTC boundary).",
        ["scope"],
    )
    length = gauge("dpstream_budget_period_seconds", "Length of the scope's budget period in seconds.", ["scope"])
    reserve = gauge("dpstream_budget_reserve_ratio", "Reserve / cap of the current period (never planned).", ["scope"])
    projected = gauge(
        "dpstream_budget_projected_ratio",
        "Spend at the current period's average rate, extrapolated to its end, over the cap.",
        ["scope"],
    )
    state = gauge(
        "dpstream_budget_state",
        "1 for the scope's current state (normal, warning, open), 0 for the others.",
        ["scope", "state"],
    )
    breaker = gauge("dpstream_breaker_open", "1 while the scope's breaker is open (nothing is released).", ["scope"])
    parked = gauge(
        "dpstream_releases_parked",
        "Windows parked now after repeated internal release failures, held until `dpstream budget retry`.",
        ["scope"],
    )
    for f in figures:
        cap.add_metric([f.scope, f.currency], f.cap)
        spent.add_metric([f.scope, f.currency], f.spent)
        ratio.add_metric([f.scope], f.ratio)
        warn.add_metric([f.scope], f.warn_ratio)
        if f.planned_ratio is not None:
            planned.add_metric([f.scope], f.planned_ratio)
        total.add_metric([f.scope, f.currency], f.spent_total)
        if f.planned_spend_rate is not None:
            rate.add_metric([f.scope, f.currency], f.planned_spend_rate)
        eps.add_metric([f.scope], f.epsilon_spent)
        end.add_metric([f.scope], float(f.period_end))
        length.add_metric([f.scope], float(f.period_end - f.period_start))
        if f.reserve_ratio is not None:
            reserve.add_metric([f.scope], f.reserve_ratio)
        projected.add_metric([f.scope], f.projected_ratio)
        for s in STATES:
            state.add_metric([f.scope, s], 1.0 if f.state == s else 0.0)
        breaker.add_metric([f.scope], 1.0 if f.breaker_open else 0.0)
        if f.parked is not None:
            parked.add_metric([f.scope], float(f.parked))
    fams = (cap, spent, ratio, warn, planned, total, rate, eps, end, length, reserve, projected, state, breaker, parked)
    for fam in fams:
        if fam.samples:
            yield fam
