"""Allocation advice for the next period: the weights that minimise the sum of importance ×
relative error under the same cap, from the fitted E_j = c_j/ε_j, and the errors they predict.

What is minimised. The topology's weight w_j of metric j is read as its importance; the relative
error of j is r_j = E_j / m_j, its expected |error| over its typical released magnitude m_j
(`utility.MetricUtility.magnitude`), so J = Σ_j w_j·c_j/(m_j·ε_j) over the numeric metrics S.
Each of j's N_j releases per period costs ε_j²/2 in a zCDP scope (ε_j is the pure-ε equivalent
√(2ρ_j)) or ε_j in a pure one, and S keeps the pool share it has now: Σ_S N_j·cost(ε_j) = B_S.
Lagrange (∂/∂ε_j: w_j c_j/(m_j ε_j²) = λ·N_j·cost′(ε_j)) gives

    pure:  ε_j ∝ √(w_j c_j / (m_j N_j))        (the textbook ε_j ∝ √(w_j c_j) when N_j = 1, m_j = 1)
    zCDP:  ε_j ∝ (w_j c_j / (m_j N_j))^(1/3)   (the cost is quadratic in ε)

and, since the allocation gives metric j the pool share W_j/ΣW spread over its N_j releases, the
advised weights are W′_j ∝ N_j·cost(ε_j), scaled so S keeps its total weight (top-k and other
non-numeric metrics keep theirs). The prediction runs the ordinary plan under W′ (what
`dpstream plan FILE --weights-from REPORT.json` shows): E′_j = c_j/ε′_j.
"""

from __future__ import annotations

__all__ = ["advice_section", "with_weights"]

import dataclasses
from typing import Any

from dpstream.topology.model import Accounting, Topology
from dpstream.topology.plan import build_plan
from dpstream.workers.report.utility import MetricUtility, release_epsilon


def with_weights(topology: Topology, weights: dict[str, float]) -> Topology:
    """A copy of `topology` whose named metrics carry the given weights (nothing else changes)."""
    metrics = {
        name: dataclasses.replace(m, weight=float(weights[name])) if name in weights else m
        for name, m in topology.metrics.items()
    }
    return dataclasses.replace(topology, metrics=metrics)


def _round(x: float) -> float:
    return float(f"{x:.4g}")


def advice_section(
    topology: Topology, scope: str, accounting: Accounting, util: dict[str, MetricUtility]
) -> dict[str, Any]:
    """The advice section (JSON-able): advised weights, predicted ε and E per metric, objective."""
    metrics = topology.metrics_of(scope)
    plan_now = build_plan(topology)
    numeric = [m for m in metrics if util[m.name].numeric and (util[m.name].c or 0) > 0]
    if not numeric:
        return {"weights": {m.name: m.weight for m in metrics}, "metrics": [], "note": "no numeric metric released"}
    power = 1.0 / 3.0 if accounting is Accounting.ZCDP else 0.5
    raw: dict[str, float] = {}
    for m in numeric:
        u = util[m.name]
        n = plan_now.metric(m.name).releases_per_period
        eps = (m.weight * (u.c or 0.0) / ((u.magnitude or 1.0) * n)) ** power  # up to the common λ
        raw[m.name] = n * (eps * eps / 2.0 if accounting is Accounting.ZCDP else eps)
    keep = sum(m.weight for m in numeric)
    total_raw = sum(raw.values())
    weights = {m.name: m.weight for m in metrics}
    for name, r in raw.items():
        weights[name] = _round(keep * r / total_raw)
    plan_new = build_plan(with_weights(topology, weights))
    rows = []
    j_now = j_plan = j_new = 0.0
    for m in numeric:
        u = util[m.name]
        c, mag = u.c or 0.0, u.magnitude or 1.0
        eps_plan = release_epsilon(accounting, plan_now.metric(m.name).per_release_cost)
        eps_new = release_epsilon(accounting, plan_new.metric(m.name).per_release_cost)
        e_now = u.mean_error or 0.0
        e_new = c / eps_new
        j_now += m.weight * e_now / mag
        j_plan += m.weight * (c / eps_plan) / mag
        j_new += m.weight * e_new / mag
        rows.append(
            {
                "metric": m.name,
                "importance": m.weight,
                "weight_now": m.weight,
                "weight_advised": weights[m.name],
                "c": c,
                "typical_magnitude": mag,
                "epsilon_now_planned": eps_plan,
                "epsilon_advised": eps_new,
                "expected_abs_error_this_period": e_now,
                "expected_abs_error_advised": e_new,
                "relative_error_this_period": e_now / mag,
                "relative_error_advised": e_new / mag,
            }
        )
    return {
        "objective": "sum over numeric metrics of importance (the topology weight) x relative error "
        "(expected |error| / typical released magnitude), same cap and pool share",
        "closed_form": "zCDP: eps_j ∝ (w_j c_j / (m_j N_j))^(1/3); pure: eps_j ∝ (w_j c_j / (m_j N_j))^(1/2); "
        "advised weight ∝ N_j cost(eps_j)",
        "weights": weights,
        "metrics": rows,
        "weighted_relative_error": {
            "this_period": j_now,
            "this_plan": j_plan,
            "advised": j_new,
            "predicted_change": (j_new / j_now) if j_now else None,
        },
        "not_advised": [m.name for m in metrics if m not in numeric],
    }
