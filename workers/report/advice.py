"""Allocation advice for the next period: the weights that minimise the sum of importance ×
relative error under the same cap, from the fitted E_j = c_j/m_j, and the errors they predict.

What is minimised. The topology's weight w_j of metric j is read as its importance; the relative
error of j is r_j = E_j / g_j, its expected |error| over its typical released magnitude g_j
(`utility.MetricUtility.magnitude`), so J = Σ_j w_j·c_j/(g_j·m_j) over the numeric metrics S, m_j the
noise multiplier of a release (`utility.noise_multiplier`: √(2ρ_j) in a zCDP scope, ε_j in a pure
one; the scale factor of the error model, not an ε-equivalent). Each of j's N_j releases per period costs
m_j²/2 (zCDP) or m_j (pure), and S keeps the pool share it has now: Σ_S N_j·cost(m_j) = B_S.
Lagrange (∂/∂m_j: w_j c_j/(g_j m_j²) = λ·N_j·cost′(m_j)) gives

    pure:  m_j ∝ √(w_j c_j / (g_j N_j))        (the textbook ε_j ∝ √(w_j c_j) when N_j = 1, g_j = 1)
    zCDP:  m_j ∝ (w_j c_j / (g_j N_j))^(1/3)   (the cost is quadratic in m)

and, since the allocation gives metric j the pool share W_j/ΣW spread over its N_j releases, the
advised weights are W′_j ∝ N_j·cost(m_j), scaled so S keeps its total weight (top-k and other
non-numeric metrics keep theirs). The weights are for the next, whole period (N_j its releases).

What is compared. The realised E of this period against the plans priced over the same span as this
period (`planned.planned_of_plan`): a whole period, or in a deployment's first period the windows from the
schedule start S with the pool spread over them, as the ledger priced them. So a partial first period's
boosted per-release share is never set against a whole period's plan. E′_j = c_j/m′_j under the advised
weights over that span; the whole next period's figures (what `dpstream plan FILE --weights-from
REPORT.json` shows) are beside them (`*_next_period`). The predicted change and its verdict compare the
advised weights with this period's realised error; in a first period with the current weights' plan over a
whole next period instead (`predicted_change_over`), since weights optimal for a whole period are not
optimal over a partial span and could be called worse there.
"""

from __future__ import annotations

__all__ = ["CHANGE_TOLERANCE", "advice_section", "verdict", "with_weights"]

import dataclasses
from typing import Any

from dpstream.topology.model import Accounting, Topology
from dpstream.topology.plan import build_plan
from dpstream.workers.report.planned import Span, planned_of_plan
from dpstream.workers.report.utility import MetricUtility, noise_multiplier, unfitted_note

CHANGE_TOLERANCE = 0.01
"""A predicted change of the weighted relative error within 1 % is "no change" (the weights are rounded to
4 digits and the ledger floors each grant to its unit)."""


def with_weights(topology: Topology, weights: dict[str, float]) -> Topology:
    """A copy of `topology` whose named metrics carry the given weights (nothing else changes)."""
    metrics = {
        name: dataclasses.replace(m, weight=float(weights[name])) if name in weights else m
        for name, m in topology.metrics.items()
    }
    return dataclasses.replace(topology, metrics=metrics)


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def verdict(change: float | None) -> str | None:
    """ "better", "worse" or "no change" for a predicted ratio advised / this period (None: nothing to compare)."""
    if change is None:
        return None
    if change < 1.0 - CHANGE_TOLERANCE:
        return "better"
    return "worse" if change > 1.0 + CHANGE_TOLERANCE else "no change"


def _not_advised(metrics: list[Any], numeric: list[Any], util: dict[str, MetricUtility]) -> dict[str, str]:
    return {
        m.name: unfitted_note(util[m.name].aggregate, util[m.name].releases)
        if not util[m.name].numeric
        else "fitted c = 0: no error to trade; kept out of the advice"
        for m in metrics
        if m not in numeric
    }


def advice_section(
    topology: Topology,
    scope: str,
    accounting: Accounting,
    util: dict[str, MetricUtility],
    span: Span | None = None,
) -> dict[str, Any]:
    """The advice section (JSON-able): advised weights, predicted multiplier and E per metric, objective.
    `span`: the part of the period this period's plan spent on (`planned.span_of`; None: a whole period)."""
    metrics = topology.metrics_of(scope)
    plan_now = build_plan(topology)
    numeric = [m for m in metrics if util[m.name].numeric and (util[m.name].c or 0) > 0]
    if not numeric:
        return {
            "weights": {m.name: m.weight for m in metrics},
            "metrics": [],
            "note": "no numeric metric released",
            "not_advised": [m.name for m in metrics],
            "not_advised_notes": _not_advised(metrics, numeric, util),
        }
    span = span or Span(0, topology.budgets[scope].period_s)
    power = 1.0 / 3.0 if accounting is Accounting.ZCDP else 0.5
    raw: dict[str, float] = {}
    for m in numeric:
        u = util[m.name]
        n = plan_now.metric(m.name).releases_per_period
        mult = (m.weight * (u.c or 0.0) / ((u.magnitude or 1.0) * n)) ** power  # up to the common λ
        raw[m.name] = n * (mult * mult / 2.0 if accounting is Accounting.ZCDP else mult)
    keep = sum(m.weight for m in numeric)
    total_raw = sum(raw.values())
    weights = {m.name: m.weight for m in metrics}
    for name, r in raw.items():
        weights[name] = _round(keep * r / total_raw)
    plan_new = build_plan(with_weights(topology, weights))
    now = planned_of_plan(span, plan_now, scope)  # both plans over this period's span
    new = planned_of_plan(span, plan_new, scope)
    rows = []
    j_now = j_plan = j_new = j_next_plan = j_next_new = 0.0
    for m in numeric:
        u = util[m.name]
        c, mag = u.c or 0.0, u.magnitude or 1.0
        m_plan = noise_multiplier(accounting, now[m.name].cost)
        m_new = noise_multiplier(accounting, new[m.name].cost)
        e_next_plan = c / noise_multiplier(accounting, plan_now.metric(m.name).per_release_cost)
        e_next = c / noise_multiplier(accounting, plan_new.metric(m.name).per_release_cost)
        e_now = u.mean_error or 0.0
        e_plan, e_new = c / m_plan, c / m_new
        j_now += m.weight * e_now / mag
        j_plan += m.weight * e_plan / mag
        j_new += m.weight * e_new / mag
        j_next_plan += m.weight * e_next_plan / mag
        j_next_new += m.weight * e_next / mag
        rows.append(
            {
                "metric": m.name,
                "importance": m.weight,
                "weight_now": m.weight,
                "weight_advised": weights[m.name],
                "c": c,
                "typical_magnitude": mag,
                "noise_multiplier_now_planned": m_plan,
                "noise_multiplier_advised": m_new,
                "expected_abs_error_this_period": e_now,
                "expected_abs_error_planned": e_plan,
                "expected_abs_error_advised": e_new,
                "relative_error_this_period": e_now / mag,
                "relative_error_advised": e_new / mag,
                "expected_abs_error_advised_next_period": e_next,
                # the plan's own ε-equivalent of one release (`epsilon_equivalent` at the conversion δ)
                "epsilon_equivalent_advised_next_period": plan_new.metric(m.name).per_release_epsilon,
            }
        )
    first = span.start is not None
    # the verdict judges the weights for what they are for, the next period: in a first period by the two
    # plans over a whole one (weights optimal for a whole period need not be over a partial span, where
    # they may look up to ~1 % worse as the noisy magnitudes fall); else advised against this period
    ours, theirs = (j_next_new, j_next_plan) if first else (j_new, j_now)
    change = ours / theirs if theirs else None
    return {
        "objective": "sum over numeric metrics of importance (the topology weight) x relative error "
        "(expected |error| / typical released magnitude), same cap and pool share",
        "closed_form": "zCDP: m_j ∝ (w_j c_j / (g_j N_j))^(1/3); pure: m_j ∝ (w_j c_j / (g_j N_j))^(1/2), "
        "m the noise multiplier (sqrt(2 rho) or eps), E = c/m; advised weight ∝ N_j cost(m_j)",
        "span": {
            "from_epoch": span.start if first else span.period_start,
            "first_period": first,
            "note": (
                "first period: this period's figures are compared with both plans priced over the windows "
                "from the schedule start, as the ledger priced them; *_next_period: a whole period"
                if first
                else "a whole period: this period's figures are compared with both plans over it"
            ),
        },
        "weights": weights,
        "metrics": rows,
        "weighted_relative_error": {
            "this_period": j_now,
            "this_plan": j_plan,
            "advised": j_new,
            "predicted_change": change,
            "predicted_change_over": "a whole next period, advised vs current weights" if first else "this period",
            "verdict": verdict(change),
            "next_period": {"this_plan": j_next_plan, "advised": j_next_new},
        },
        "not_advised": [m.name for m in metrics if m not in numeric],
        "not_advised_notes": _not_advised(metrics, numeric, util),
    }
