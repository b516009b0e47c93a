"""The report's accounting section: every charge, the per-record cost check, the period's total
as charged, the tight non-adaptive recomputation (PLD, RDP) and the gap.

Why the gap is not credited back: the ledger is a privacy *filter*. Each release's cost is
chosen after earlier outputs (the adaptive reallocation re-divides what is left after every
release; the warning policy stretches noise), and the period's (ε, δ) promise rests on zCDP and
pure-ε costs adding up under such fully adaptive composition (privacy filters: Rogers, Roth,
Ullman and Vadhan 2016; Feldman and Zrnic 2021; Whitehouse, Ramdas, Rogers and Wu 2023). The PLD
figure bounds this sequence of releases taken as fixed in advance. dpstream applies no theorem
under which spending the difference again in the same period would keep the promise, so there is
no in-period credit: the gap is reported, never returned to the period's budget.
"""

from __future__ import annotations

__all__ = ["GAP_REASON", "accounting_section", "checks_of", "composed_checks"]

from typing import Any

from dpstream.topology.accounting import epsilon_equivalent
from dpstream.topology.model import Accounting
from dpstream.topology.selection import conversion_delta
from dpstream.workers.ledger.units import DELTA_UNITS_PER_DELTA, UNITS_PER_CURRENCY
from dpstream.workers.report.collect import Charge, PeriodData
from dpstream.workers.report.costcheck import Component, RecordCheck, check_record
from dpstream.workers.report.tight import PLD_DISCRETIZATION, RDP_ORDERS, tight_epsilons

GAP_REASON = (
    "the ledger is a privacy filter whose costs are chosen adaptively (the allocation re-divides what is left "
    "after every release, the warning policy stretches noise); its (epsilon, delta) promise rests on zCDP and "
    "pure-epsilon costs adding up under fully adaptive composition (privacy filters: Rogers et al. 2016, "
    "Feldman-Zrnic 2021, Whitehouse et al. 2023). The PLD figure bounds these releases taken as a composition "
    "fixed in advance; no theorem applied here keeps the promise if the difference were spent again in the "
    "same period, so it is reported and never credited back"
)


def checks_of(data: PeriodData) -> list[RecordCheck]:
    """The per-record cost check of every charge of the period."""
    accounting = Accounting(data.accounting)
    return [check_record(c, data.topology.metrics.get(c.metric), accounting) for c in data.charges]


def composed_checks(checks: list[RecordCheck], charges: list[Charge]) -> list[RecordCheck]:
    """The checked records a period composes: each one, except that under `contribution.max_windows`
    m only the m costliest of a (metric, topology version) count (a unit is in at most m of them)."""
    kept: list[RecordCheck] = []
    capped: dict[tuple[str, str, int], list[RecordCheck]] = {}
    for chk, charge in zip(checks, charges, strict=True):
        if not chk.ok:
            continue
        record = charge.record or {}
        m = (record.get("event") or {}).get("max_windows")
        if m is None:
            kept.append(chk)
        else:
            capped.setdefault((charge.metric, str(record.get("topology_version", "")), int(m)), []).append(chk)
    for (_, _, m), group in capped.items():
        kept += sorted(group, key=lambda c: c.record_cost or 0.0, reverse=True)[:m]
    return kept


def accounting_section(data: PeriodData, checks: list[RecordCheck]) -> dict[str, Any]:
    """The accounting section of the report (JSON-able)."""
    budget = data.topology.budgets[data.scope]
    metrics = data.topology.metrics_of(data.scope)
    zcdp = data.accounting == Accounting.ZCDP.value
    conv_delta = conversion_delta(budget, metrics) if zcdp else 0.0
    spent = data.spent_units / UNITS_PER_CURRENCY
    audited_units = sum(c.cost_units for c in data.charges)
    selection_delta = data.delta_spent_units / DELTA_UNITS_PER_DELTA
    charged_eps = epsilon_equivalent(zcdp, spent, conv_delta).epsilon
    composed = composed_checks(checks, data.charges)
    components: list[Component] = [p for chk in composed for p in chk.components]
    flagged = [c for c in checks if not c.ok]
    section: dict[str, Any] = {
        "currency": "rho" if zcdp else "epsilon",
        "charges": [
            {
                "release_id": c.release_id,
                "metric": c.metric,
                "at_ms": ch.at_ms,
                "cost": ch.cost,
                "cost_units": ch.cost_units,
                "delta": ch.delta_units / DELTA_UNITS_PER_DELTA,
                "mechanism": (ch.record or {}).get("mechanism"),
                "noise": (ch.record or {}).get("noise"),
                "window": (ch.record or {}).get("window", {}).get("start"),
                "mapped_cost": c.mapped,
                "check": "ok" if c.ok else "FLAGGED",
                "problems": c.problems,
            }
            for c, ch in zip(checks, data.charges, strict=True)
        ],
        "record_check": {
            "checked": len(checks),
            "ok": len(checks) - len(flagged),
            "flagged": [{"release_id": c.release_id, "metric": c.metric, "problems": c.problems} for c in flagged],
            "rule": "the OpenDP privacy maps of the record's privacy event (each part's scale at its d_in, the "
            "parts the metric declares) sum to the record's cost (1e-9 relative, never above), and that cost is "
            "the event's and the ledger's charged units",
        },
        "charged": {
            "total": spent,
            "total_units": data.spent_units,
            "audited_units": audited_units,
            "reconciles": audited_units == data.spent_units,
            "cap": data.cap_units / UNITS_PER_CURRENCY,
            "ratio": data.spent_units / data.cap_units if data.cap_units else 0.0,
            "epsilon": charged_eps,
            "conversion_delta": conv_delta,
            "selection_delta_spent": selection_delta,
            "delta": (conv_delta + selection_delta) if zcdp else selection_delta,
            "scope_epsilon": data.epsilon,
            "scope_delta": data.delta,
        },
    }
    if len(composed) < len(checks) - len(flagged):
        section["charged"]["max_windows_note"] = (
            f"{len(composed)} of {len(checks) - len(flagged)} records are composed: under contribution.max_windows "
            "a period pays only each metric's m largest charges per topology version, so the ledger's spend is "
            "not the sum of the records' costs"
        )
    if not zcdp or not components:
        section["tight"] = None
        section["gap"] = None
        section["tight_note"] = (
            "pure scope: ε adds up exactly at δ = 0, which is the scope's promise; a tighter figure exists only "
            "at a δ > 0 the scope does not hold"
            if not zcdp
            else "no charge with a readable record in this period"
        )
        return section
    tight = tight_epsilons(components, conv_delta)
    section["tight"] = {
        "delta": tight.delta,
        "pld_epsilon": tight.pld_epsilon,
        "rdp_epsilon": tight.rdp_epsilon,
        "rdp_order": tight.rdp_order,
        "pld_discretization": PLD_DISCRETIZATION,
        "rdp_orders": [min(RDP_ORDERS), max(RDP_ORDERS), len(RDP_ORDERS)],
        "parts": tight.parts,
        "distinct_parts": tight.distinct_parts,
        "excluded_flagged_records": len(flagged),
        "method": "non-adaptive composition of the recorded noise: dp-accounting PLD (Gaussians composed "
        "exactly into one; discrete Laplace exact; top-k as k generic ε0-DP selections at OpenDP's "
        "monotone-score ε0) and RdpAccountant over the order grid; at the conversion δ",
    }
    section["gap"] = {
        "epsilon": charged_eps - tight.pld_epsilon,
        "relative": (charged_eps - tight.pld_epsilon) / charged_eps if charged_eps else 0.0,
        "credited": False,
        "reason": GAP_REASON,
    }
    return section
