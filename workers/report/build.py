"""Assemble the report card of one period (JSON-able dict, `report_version: 1`)."""

from __future__ import annotations

__all__ = ["REPORT_VERSION", "build_report"]

from typing import Any

from dpstream.topology.model import Accounting, guarantee_label
from dpstream.topology.plan import ScopePlan, build_plan
from dpstream.topology.schedule import Schedule
from dpstream.workers.ledger.units import UNITS_PER_CURRENCY
from dpstream.workers.release.record import iso_utc
from dpstream.workers.report.accounting import accounting_section, checks_of
from dpstream.workers.report.advice import advice_section
from dpstream.workers.report.collect import PeriodData
from dpstream.workers.report.fairness import fairness_section
from dpstream.workers.report.planned import Span, planned_of_plan, span_of
from dpstream.workers.report.utility import utility_of
from dpstream.workers.telemetry.budget import planned_ratio

REPORT_VERSION = 1

PLAN_CURVE_POINTS = 2_000
"""At most this many points of the plan curve (a day of 1-minute windows is 1,441; past it, an even grid)."""


def plan_curve(scope_plan: ScopePlan, span: Span) -> dict[str, list[float]]:
    """The plan's spent / cap over the period (`telemetry.budget.planned_ratio`: the one rule the plan
    gauges and burn-rate alerts use, so it follows `max_windows` front-loading and budget schedules), at
    the period start and at each window end of the scope's metrics (from S in a first period): a step
    function, flat between two points."""
    start, end = span.period_start, span.period_start + span.period_s
    ends: set[int] = set()
    for m in scope_plan.metrics:
        grid = Schedule(m.window_size_s, m.window_every_s, span.start)
        first = grid.first_start_at_or_after(max(start, span.start or start))
        ends.update(s + m.window_size_s for s in range(first, end, max(1, m.window_every_s)))
    points = sorted({start, *ends})
    if len(points) > PLAN_CURVE_POINTS:
        last = points[-1]
        step = (last - start) / (PLAN_CURVE_POINTS - 1)
        points = [start + round(i * step) for i in range(PLAN_CURVE_POINTS)]
    return {
        "hours": [(t - start) / 3600 for t in points],
        "ratio": [planned_ratio(scope_plan, start, end, t, span.start) for t in points],
    }


def _timeline(data: PeriodData) -> dict[str, Any]:
    """Spend over the period (after each charge) and the breaker / state / grant events, for the page.

    An event's `window_time` is the window end of the last charge before it in the audit stream (the
    period start if none): on the schedule's clock, so a replayed period plots its events where they
    happened in the period, not at the wall-clock time of the replay."""
    ends: list[int | None] = []
    for ch in data.charges:
        end = ((ch.record or {}).get("window") or {}).get("end_epoch")
        ends.append(end if isinstance(end, int) else None)

    def window_time(after: int) -> int:
        for i in range(min(after, len(ends)) - 1, -1, -1):
            end = ends[i]
            if end is not None:
                return end
        return data.period_start

    return {
        "spend": [[ch.at_ms, ch.spent_units_after / data.cap_units] for ch in data.charges],
        "window_ends": ends,
        "events": [
            {
                "kind": ev.kind,
                "at_ms": ev.at_ms,
                "window_time": window_time(ev.after_charges),
                "metric": ev.metric,
                "reason": ev.reason,
                "state": ev.state,
            }
            for ev in data.events
        ],
    }


def build_report(data: PeriodData) -> dict[str, Any]:
    """The whole report: accounting, utility, fairness, advice, timeline."""
    accounting = Accounting(data.accounting)
    plan = build_plan(data.topology)
    scope_plan = next(s for s in plan.scopes if s.name == data.scope)
    span = span_of(data)
    planned = planned_of_plan(span, plan, data.scope)
    checks = checks_of(data)
    util, util_rows = utility_of(data, accounting, planned)
    budget = data.topology.budgets[data.scope]
    return {
        "report_version": REPORT_VERSION,
        "scope": data.scope,
        "period": {
            "id": data.period_id,
            "start": iso_utc(data.period_start),
            "end": iso_utc(data.period_start + data.period_s),
            "start_epoch": data.period_start,
            "seconds": data.period_s,
            # the schedule start S when it lies inside this period (its first): nothing is scheduled before it
            "schedule_start": iso_utc(data.first_release_start) if data.first_release_start is not None else None,
            "schedule_start_epoch": data.first_release_start,
        },
        "topology": {"path": data.topology.path, "version": data.topology.topology_version},
        # `event-level (weaker)` when a metric of the scope protects single events (privacy_unit: event)
        "guarantee": guarantee_label(scope_plan.event_level),
        "event_level_metrics": [m.name for m in scope_plan.metrics if m.event_level],
        "terms": {
            "accounting": data.accounting,
            "epsilon": data.epsilon,
            "delta": data.delta,
            "cap": data.cap_units / UNITS_PER_CURRENCY,
            "reserve": data.reserve_units / UNITS_PER_CURRENCY,
            "warn_at": budget.warn_at,
            "on_warning": {"stretch": budget.on_warning.stretch, "thin": budget.on_warning.thin},
        },
        "source": "the ledger's audit stream and stored release records only (no raw data, no true aggregate)",
        "accounting": accounting_section(data, checks),
        "utility": util_rows,
        "fairness": fairness_section(data),
        "advice": advice_section(data.topology, data.scope, accounting, util, span),
        "timeline": _timeline(data),
        "plan_curve": plan_curve(scope_plan, span),
    }
