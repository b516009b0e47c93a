"""Per-record cost check: each stored record's noise scale, run through the privacy map of the
OpenDP measurement that drew it, must give exactly the cost the ledger charged for it.

The record carries the noise scale in value units (and the fixed-point grid step), the metric
the sensitivity (from the topology's declared bounds), the audit entry the charged units. A
record whose scale was changed after the charge (a tampered or corrupted ledger) maps to another
cost and is flagged. The components found here are also what the tight re-accounting composes.
"""

from __future__ import annotations

__all__ = ["Component", "RecordCheck", "check_record", "components_of"]

import math
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any

import opendp.prelude as dp

from dpstream.topology import accounting as acc
from dpstream.topology.calibration import calibrate
from dpstream.topology.model import Accounting, Aggregate, Mechanism, Metric
from dpstream.topology.sensitivity import quantile_d_in
from dpstream.workers.ledger.units import cost_to_units
from dpstream.workers.noise import measurements
from dpstream.workers.noise.measurements import COST_RTOL
from dpstream.workers.report.collect import Charge

dp.enable_features("contrib")


@dataclass(frozen=True)
class Component:
    """One noisy part of a release as drawn: mechanism, integer-unit scale, sensitivity, cost by the map.

    kind: 'gaussian' (discrete Gaussian, sensitivity = L2), 'laplace' (discrete Laplace, L1) or
    'top_k' (k Gumbel / permute-and-flip selections, L∞ of the scores; `k` selections).
    """

    kind: str
    scale: float
    sensitivity: float
    mapped_cost: float
    k: int = 1
    epsilon0: float = 0.0
    """top-k only: the pure ε of one selection by OpenDP's map on monotone scores
    (`linf_distance(monotonic=True)`: counts of bounded contributions only grow when a unit is
    added), half the 2Δ∞/scale the ledger charges; what the tight PLD composes."""
    from_record: bool = True
    """False when the record does not carry this part's scale (top-k's partition selection):
    it is then recalibrated from the charged cost, as the releaser did."""


@dataclass
class RecordCheck:
    """The outcome of one record's check: ok, or the problems found (one line each)."""

    release_id: str
    metric: str
    charged: float
    record_cost: float | None = None
    mapped: float | None = None
    components: list[Component] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the record exists, names this release and its scale maps to the charge."""
        return not self.problems


def _currency(accounting: Accounting, mechanism: Mechanism, mapped: float) -> float:
    """A map's output in the scope's currency (a pure ε in a zCDP scope costs ε²/2)."""
    if mechanism is Mechanism.LAPLACE and accounting is Accounting.ZCDP:
        return acc.pure_to_rho(mapped)
    return mapped


def _integer(kind: Mechanism, scale: float, l1: float, l2: float, accounting: Accounting) -> Component:
    meas, _pool = measurements._measurement(kind, scale)  # the same (cached) OpenDP object the releaser drew from
    if kind is Mechanism.GAUSSIAN:
        return Component("gaussian", scale, l2, float(meas.map(l2)))
    return Component("laplace", scale, l1, _currency(accounting, kind, float(meas.map(int(l1)))))


def _per_key_units(linf: float, noise: dict[str, Any]) -> tuple[int, float]:
    """(integer sensitivity per key, value unit) of a noisy part: counts are themselves; sums sit on
    the record's power-of-two grid with ⌈Δ/step⌉ + 1 units per key (`workers.noise.grid`)."""
    step = noise.get("grid_step")
    if step is None:
        return int(linf), 1.0
    return math.ceil(Fraction(linf) / Fraction(float(step))) + 1, float(step)


def _value_part(part: Any, noise: dict[str, Any], metric: Metric, accounting: Accounting, integer: bool) -> Component:
    keys = metric.contribution.max_keys if metric.group_by is not None else 1
    if integer:
        units, unit = int(part.sensitivity.linf), 1.0
    else:
        units, unit = _per_key_units(part.sensitivity.linf, noise)
    scale = float(noise["scale"]) / unit
    return _integer(part.mechanism, scale, keys * units, math.sqrt(keys) * units, accounting)


def _top_k(metric: Metric, accounting: Accounting, scale: float, linf: int) -> Component:
    k = metric.k or 1
    measure = dp.zero_concentrated_divergence() if accounting is Accounting.ZCDP else dp.max_divergence()
    domain = dp.vector_domain(dp.atom_domain(T="i64"))
    meas = dp.m.make_noisy_top_k(domain, dp.linf_distance(T="i64"), measure, k=k, scale=scale)
    monotone = dp.m.make_noisy_top_k(
        domain, dp.linf_distance(T="i64", monotonic=True), dp.max_divergence(), k=k, scale=scale
    )
    eps0 = float(monotone.map(linf)) / k
    return Component("top_k", scale, float(linf), float(meas.map(linf)), k=k, epsilon0=eps0)


def _quantile(accounting: Accounting, scale: float, alpha: float, candidates: list[float], d_in: int) -> Component:
    """One quantile level as drawn: OpenDP's private quantile at the record's scale (in ranks), mapped
    at d_in; for the tight accounting an exponential mechanism (one selection, k = 1) of pure ε
    2Δ/scale, Δ = max(α, 1 − α)·d_in (its scores are not monotone, so no halving)."""
    measure = dp.zero_concentrated_divergence() if accounting is Accounting.ZCDP else dp.max_divergence()
    domain = dp.vector_domain(dp.atom_domain(T=float, nan=False))
    meas = dp.m.make_private_quantile(
        domain, dp.symmetric_distance(), measure, candidates=candidates, alpha=alpha, scale=scale
    )
    sens = max(alpha, 1.0 - alpha) * d_in
    return Component("top_k", scale, sens, float(meas.map(d_in)), k=1, epsilon0=2.0 * sens / scale)


def components_of(metric: Metric, accounting: Accounting, record: dict[str, Any]) -> list[Component]:
    """The noisy parts of a stored record, each with its OpenDP-mapped cost (KeyError/TypeError on a
    record without the expected noise fields)."""
    cost = float(record["cost"]["rho" if accounting is Accounting.ZCDP else "epsilon"])
    noise = record["noise"]
    if metric.aggregate is Aggregate.QUANTILE:  # every level at the record's one scale
        grid, d_in = list(metric.candidates or ()), quantile_d_in(metric)
        return [_quantile(accounting, float(noise["scale"]), a, grid, d_in) for a in metric.quantiles or ()]
    parts = calibrate(metric, accounting, cost)  # sensitivities and the split, not the scales
    if metric.aggregate is Aggregate.TOP_K:
        *selection, top = parts
        out = [_top_k(metric, accounting, float(noise["scale"]), int(top.sensitivity.linf))]
        for sel in selection:
            noise_sel = measurements.integer_noise(
                sel.mechanism, accounting, sel.cost, sel.sensitivity.l1, sel.sensitivity.l2
            )
            c = _integer(sel.mechanism, noise_sel.scale, noise_sel.d_in, noise_sel.d_in, accounting)
            out.append(Component(c.kind, c.scale, c.sensitivity, c.mapped_cost, from_record=False))
        return out
    if metric.aggregate is Aggregate.MEAN and metric.denominator is None:
        sum_part, count_part = parts
        return [
            _value_part(sum_part, noise["sum"], metric, accounting, integer=False),
            _value_part(count_part, noise["count"], metric, accounting, integer=True),
        ]
    (part,) = parts
    integer = metric.aggregate in (Aggregate.COUNT, Aggregate.COUNT_UNITS)
    return [_value_part(part, noise, metric, accounting, integer)]


def check_record(charge: Charge, metric: Metric | None, accounting: Accounting) -> RecordCheck:
    """Check one charge against its stored record (see the module docstring)."""
    out = RecordCheck(charge.release_id, charge.metric, charge.cost)
    rec = charge.record
    if rec is None:
        out.problems.append("no stored record (past retention, or deleted)")
        return out
    if rec.get("_undecodable"):
        out.problems.append("stored record is not a JSON object")
        return out
    if metric is None:
        out.problems.append(f"metric {charge.metric!r} is not in the topology")
        return out
    if rec.get("release_id") != charge.release_id or rec.get("metric") != charge.metric:
        out.problems.append("stored record names another release or metric than its audit entry")
    try:
        out.record_cost = float(rec["cost"]["rho" if accounting is Accounting.ZCDP else "epsilon"])
        out.components = components_of(metric, accounting, rec)
    except (KeyError, TypeError, ValueError) as exc:
        out.problems.append(f"record lacks its cost or noise fields ({type(exc).__name__}: {exc})")
        return out
    out.mapped = sum(c.mapped_cost for c in out.components)
    if cost_to_units(out.record_cost) != charge.cost_units:
        out.problems.append(
            f"record cost {out.record_cost!r} is {cost_to_units(out.record_cost)} units; the ledger charged "
            f"{charge.cost_units}"
        )
    if not math.isclose(out.mapped, out.record_cost, rel_tol=COST_RTOL, abs_tol=0.0):
        out.problems.append(
            f"noise scale maps to {out.mapped!r} by the mechanism's privacy map, not the {out.record_cost!r} charged"
        )
    elif out.mapped > out.record_cost:
        out.problems.append(f"noise scale maps to {out.mapped!r}, above the {out.record_cost!r} charged")
    return out
