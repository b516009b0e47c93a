"""The report's fairness section: each metric's share of the period's spend against its weight
share, and its releases refused (by reason), stretched (charged while the warning policy
stretched noise) and skipped (scheduled windows that left no ledger record: thinned, or not
released by the last charged window's end). The schedule starts at S (the public
schedule): in a deployment's first period no window starting before S is scheduled, so none is skipped."""

from __future__ import annotations

__all__ = ["fairness_section", "scheduled_windows"]

from collections import Counter
from typing import Any

from dpstream.topology.model import Metric
from dpstream.topology.schedule import Schedule
from dpstream.workers.ledger.units import UNITS_PER_CURRENCY
from dpstream.workers.report.collect import PeriodData


def scheduled_windows(metric: Metric, period_start: int, horizon: int, schedule_start: int | None = None) -> int:
    """Windows of `metric` that touch the period from `period_start` and end by `horizon`, none starting
    before the schedule start S (`schedule_start`): the schedule's first window is the first grid
    window starting at or after S (`Schedule.touching`)."""
    return Schedule.of(metric, schedule_start).touching(period_start, horizon)


def fairness_section(data: PeriodData) -> list[dict[str, Any]]:
    """One row per metric of the scope (JSON-able)."""
    metrics = data.topology.metrics_of(data.scope)
    budget = data.topology.budgets[data.scope]
    total_w = sum(m.weight for m in metrics) or 1.0
    spend: Counter[str] = Counter()
    charged: Counter[str] = Counter()
    stretched: Counter[str] = Counter()
    out: Counter[str] = Counter()  # charges of windows ending after the period (straddling out)
    ends = []
    for ch in data.charges:
        spend[ch.metric] += ch.cost_units
        charged[ch.metric] += 1
        if budget.on_warning.stretch > 1 and ch.spent_units_after - ch.cost_units >= data.warn_units:
            stretched[ch.metric] += 1
        end = ((ch.record or {}).get("window") or {}).get("end_epoch")
        if isinstance(end, int):
            ends.append(end)
            if end > data.period_start + data.period_s:
                out[ch.metric] += 1
    refused: dict[str, Counter[str]] = {}
    for ev in data.events:
        if ev.kind == "refusal":
            refused.setdefault(ev.metric, Counter())[ev.reason.split(":")[0]] += 1
    horizon = max(ends) if ends else data.period_start + data.period_s
    total_spend = sum(spend.values()) or 1
    rows = []
    for m in metrics:
        n_ref = sum(refused.get(m.name, Counter()).values())
        period_end = data.period_start + data.period_s
        sched = scheduled_windows(m, data.period_start, min(horizon, period_end), data.schedule_start)
        # the schedule counts the windows straddling in from the period before (charged there) and not
        # those straddling out (charged here, ending after the period): an out-charge stands for an
        # in-window, one for one. Where S cut the in-windows (a first period), the surplus ones stand for
        # none, or they would hide as many windows skipped.
        straddle_in = sched - scheduled_windows(
            m, data.period_start, min(horizon, period_end), max(data.schedule_start or 0, data.period_start)
        )
        matched = charged[m.name] - max(0, out[m.name] - straddle_in)
        w_share = m.weight / total_w
        s_share = spend[m.name] / total_spend
        rows.append(
            {
                "metric": m.name,
                "weight": m.weight,
                "weight_share": w_share,
                "spend": spend[m.name] / UNITS_PER_CURRENCY,
                "spend_share": s_share,
                "spend_over_weight": s_share / w_share if w_share else None,
                "charged": charged[m.name],
                "refused": n_ref,
                "refused_reasons": dict(refused.get(m.name, Counter())),
                "stretched": stretched[m.name],
                "scheduled_by_horizon": sched,
                "skipped": max(0, sched - matched - n_ref),
            }
        )
    return rows
