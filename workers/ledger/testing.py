"""Test helpers for the ledger: small in-code topologies and a settable clock (tests, the ledger bench).

Named like `numpy.testing`: nothing in the runtime imports it.
"""

from __future__ import annotations

__all__ = ["ManualClock", "charge_on_plan", "one_scope_topology"]

from collections.abc import Mapping, Sequence
from typing import Any

from dpstream.topology.model import (
    Accounting,
    Aggregate,
    Budget,
    Contribution,
    HourlyShape,
    Mechanism,
    Metric,
    ReleaseKind,
    Sinks,
    Source,
    Topology,
    WarningPolicy,
    Window,
)


async def charge_on_plan(
    ledger: Any, topology: Topology, scope: str, period_start: int, since: int | None = None
) -> dict[tuple[str, int], int]:
    """Quote and charge, each at its quote, every window of `scope`'s metrics starting in the period from
    `period_start` (and at or after `since`), in close order: (metric, window start) → units charged.
    Every charge must go through (AssertionError otherwise)."""
    from dpstream.workers.ledger.types import Outcome, ReleaseRequest

    end = period_start + topology.budgets[scope].period_s
    lo = max(period_start, since if since is not None else period_start)
    windows = sorted(
        (s + m.window.size_s, m.name, s)
        for m in topology.metrics.values()
        if m.budget == scope
        for s in range(period_start, end, m.window.every_s)
        if s >= lo
    )
    costs: dict[tuple[str, int], int] = {}
    for window_end, metric, start in windows:
        q = await ledger.quote(metric, start, window_end)
        costs[(metric, start)] = q.cost_units
        req = ReleaseRequest(f"{metric}{start}", scope, q.period_id, metric, start, window_end, q.cost, b"")
        charged = await ledger.charge(req)
        assert charged.outcome is Outcome.CHARGED, (metric, start, charged)
    return costs


class ManualClock:
    """A clock that only moves when told (`clock()` returns epoch seconds)."""

    def __init__(self, now: float) -> None:
        self.now = float(now)

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        self.now += seconds


def one_scope_topology(
    scope: str = "s",
    *,
    epsilon: float = 1.0,
    delta: float = 0.0,
    accounting: Accounting = Accounting.PURE,
    period_s: int = 86_400,
    reserve: float = 0.2,
    warn_at: float = 0.8,
    on_warning: WarningPolicy | None = None,
    metrics: Sequence[tuple[str, float, int, int, bool]] = (("m", 1.0, 86_400, 86_400, False),),
    max_windows: Mapping[str, int] | None = None,
    topology_version: int = 1,
    schedules: Mapping[str, HourlyShape] | None = None,
    running_totals: Mapping[str, int] | None = None,
) -> Topology:
    """One budget scope; metrics as (name, weight, window size s, every s, may_use_reserve), with
    `contribution.max_windows` for the metrics `max_windows` names, a budget schedule for those
    `schedules` names and `release: running_total` with `max_per_period` L for those `running_totals`
    names (give the scope zCDP accounting for them)."""
    caps = max_windows or {}
    totals = running_totals or {}
    mech = Mechanism.LAPLACE if accounting is Accounting.PURE else Mechanism.GAUSSIAN
    return Topology(
        version=topology_version,
        sources={"src": Source("src", "events", "user_id")},
        budgets={
            scope: Budget(scope, epsilon, delta, accounting, period_s, reserve, warn_at, on_warning or WarningPolicy())
        },
        metrics={
            name: Metric(
                name,
                "src",
                scope,
                weight,
                Window(size, every),
                Aggregate.COUNT,
                mech,
                contribution=Contribution(max_windows=caps.get(name), max_per_period=totals.get(name)),
                may_use_reserve=may_use,
                schedule=(schedules or {}).get(name),
                release=ReleaseKind.RUNNING_TOTAL if name in totals else ReleaseKind.WINDOW,
            )
            for name, weight, size, every, may_use in metrics
        },
        sinks=Sinks("releases", "dead"),
    )
