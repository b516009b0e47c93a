"""The report's utility section, per metric, from the stored records (the published values and
their noise, never the truth): releases, realised σ and 95 % CI, expected absolute error E,
planned against realised noise, and E fitted against each release's noise multiplier as E = c/m.

The noise multiplier m of a release is the scale factor of its error model, not an ε-equivalent:
√(2ρ) in a zCDP scope (a Gaussian's σ = Δ₂/√(2ρ) is then exactly Δ₂/m, so E = c/m holds with
c = Δ₂·√(2/π)), the charged ε in a pure scope. The ε-equivalent of a cost, where the report shows
one, is `topology.accounting.epsilon_equivalent` at the scope's conversion δ, as in the plan and the
release record. E is the expected |noise| of one released value: σ·√(2/π) for Gaussian noise, σ/√2
for Laplace (σ = √2·b), the CI half-width / z₀.₉₇₅ · √(2/π) for a noisy-ratio mean (its σ is
approximate). Top-k releases keys, not numbers: it has no E and is left out of the fit and the
advice, as is a numeric metric with no readable release yet (each labelled by its aggregate). A running
total is left out too: one lump pays its period (the later steps' charges are 0, so no multiplier) and
its std grows with the step, σ·‖c_<t‖₂, so E = c/m describes none of its releases.
"""

from __future__ import annotations

__all__ = ["MetricUtility", "collect_utility", "expected_abs_error", "noise_multiplier", "unfitted_note", "utility_of"]

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from dpstream.topology.accounting import epsilon_equivalent
from dpstream.topology.calibration import Z95
from dpstream.topology.model import Accounting, Aggregate
from dpstream.topology.selection import conversion_delta
from dpstream.workers.report.collect import PeriodData
from dpstream.workers.report.planned import Planned

_GAUSS = math.sqrt(2.0 / math.pi)


def noise_multiplier(accounting: Accounting, cost: float) -> float:
    """The noise multiplier of one release's cost, the m of its error model E = c/m: √(2ρ) (zCDP) or
    ε (pure). Not an ε-equivalent (that is `epsilon_equivalent` at the scope's conversion δ)."""
    return math.sqrt(2.0 * cost) if accounting is Accounting.ZCDP else cost


def unfitted_note(aggregate: str, releases: int, running_total: bool = False) -> str:
    """Why a metric has no fit, by its aggregate: top-k releases keys; a running total's std grows with the
    step under one lump; any other has no readable release."""
    if running_total:
        return (
            f"{aggregate} running total: one lump a period, each step's std σ·‖c_<t‖₂ (in its record); "
            "not fitted, kept out of the advice"
        )
    if aggregate == Aggregate.TOP_K.value:
        return "top-k: keys in rank order, no numeric error; not fitted, kept out of the advice"
    if aggregate == Aggregate.QUANTILE.value:
        return "quantile: grid candidates with a rank error, no value error; not fitted, kept out of the advice"
    if releases == 0:
        return f"{aggregate}: no release yet; not fitted, kept out of the advice"
    return f"{aggregate}: no readable release record (past retention?); not fitted, kept out of the advice"


def expected_abs_error(record: dict[str, Any]) -> tuple[float, float, float] | None:
    """(σ, 95 % CI half-width, E|error|) of one released value, from the record; None for top-k and
    quantiles (their error is a rank, not a value)."""
    mech = str(record.get("mechanism", ""))
    noise, ci = record.get("noise") or {}, record.get("ci") or {}
    if mech.startswith(("noisy_top_k", "private_quantile")):
        return None
    half = ci.get("half_width")
    if isinstance(half, dict):  # a noisy-ratio mean: approximate per-key half-widths
        if not half:
            return None
        h = statistics.fmean(float(v) for v in half.values())
        sigma = h / Z95
        return sigma, h, sigma * _GAUSS
    sigma = float(noise["stddev"])
    e = sigma * _GAUSS if "gaussian" in mech else sigma / math.sqrt(2.0)
    return sigma, float(half) if half is not None else Z95 * sigma, e


@dataclass
class MetricUtility:
    """One metric's utility over the period."""

    metric: str
    aggregate: str
    releases: int
    multipliers: list[float] = field(default_factory=list)
    """Noise multiplier of each readable release (`noise_multiplier`), beside its E in `errors`."""
    errors: list[float] = field(default_factory=list)
    sigmas: list[float] = field(default_factory=list)
    halves: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    costs: list[float] = field(default_factory=list)

    @property
    def numeric(self) -> bool:
        """True when some release has a readable numeric error (never for top-k: it releases keys)."""
        return bool(self.errors)

    @property
    def c(self) -> float | None:
        """Least-squares c of E = c/m over the releases (m the noise multiplier; minimises Σ(E − c/m)²)."""
        if not self.errors:
            return None
        num = math.fsum(e / x for e, x in zip(self.errors, self.multipliers, strict=True))
        den = math.fsum(1.0 / (x * x) for x in self.multipliers)
        return num / den

    @property
    def fit_max_rel_residual(self) -> float | None:
        """Largest |E − c/m| / E over the releases (0 when E = c/m holds exactly)."""
        c = self.c
        if c is None:
            return None
        return max(abs(e - c / x) / e for e, x in zip(self.errors, self.multipliers, strict=True))

    @property
    def mean_error(self) -> float | None:
        """Mean E over the releases."""
        return statistics.fmean(self.errors) if self.errors else None

    @property
    def standard_error(self) -> float | None:
        """Standard error of the mean released value (noise alone): mean σ / √(values)."""
        if not self.errors or not self.values:
            return None
        return statistics.fmean(self.sigmas) / math.sqrt(len(self.values))

    @property
    def magnitude(self) -> float | None:
        """Typical size m of a released value: |mean released value| (the noise is zero-mean and no
        post-processing is applied, so this estimates the mean true value), at least its standard
        error (a period too noisy to resolve the mean gets m = its resolution). Public: released values only."""
        if not self.errors:
            return None
        mean = abs(statistics.fmean(self.values)) if self.values else 0.0
        return max(mean, self.standard_error or 0.0, 1e-300)

    @property
    def resolved(self) -> bool:
        """True when the period resolves the mean released value (|mean| ≥ 3 standard errors)."""
        se, mag = self.standard_error, self.magnitude
        return se is not None and mag is not None and mag >= 3.0 * se


def _values(record: dict[str, Any]) -> list[float]:
    vals = record.get("values") or {}
    return [float(v) for v in vals.values() if isinstance(v, (int, float)) and math.isfinite(v)]


def collect_utility(data: PeriodData, accounting: Accounting) -> dict[str, MetricUtility]:
    """Per metric of the scope, the figures of every charged release with a readable record."""
    metrics = data.topology.metrics_of(data.scope)
    out = {m.name: MetricUtility(m.name, m.aggregate.value, 0) for m in metrics}
    running = {m.name for m in metrics if m.running_total}
    for ch in data.charges:
        u = out.get(ch.metric)
        if u is None:
            continue
        u.releases += 1
        u.costs.append(ch.release_cost)  # the noise's cost: a later capped window may pay nothing
        rec = ch.record
        if not rec or rec.get("_undecodable") or ch.metric in running:  # a running total: no E = c/m fit
            continue
        try:
            fig = expected_abs_error(rec)
        except (KeyError, TypeError, ValueError):
            continue
        if fig is None:
            continue
        u.sigmas.append(fig[0])
        u.halves.append(fig[1])
        u.errors.append(fig[2])
        u.multipliers.append(noise_multiplier(accounting, ch.release_cost))
        u.values.extend(_values(rec))
    return out


def utility_of(
    data: PeriodData, accounting: Accounting, planned: dict[str, Planned]
) -> tuple[dict[str, MetricUtility], list[dict[str, Any]]]:
    """The per-metric utility objects and the section's JSON rows (planned figures: `planned.planned_of_plan`,
    counted from the schedule start S in a deployment's first period)."""
    util = collect_utility(data, accounting)
    zcdp = accounting is Accounting.ZCDP
    conversion = conversion_delta(data.topology.budgets[data.scope], data.topology.metrics_of(data.scope))
    rows = []
    for name, u in util.items():
        plan = planned[name]
        planned_m = noise_multiplier(accounting, plan.cost)
        row: dict[str, Any] = {
            "metric": name,
            "aggregate": u.aggregate,
            "releases": u.releases,
            "planned_releases": plan.releases,
            "planned_cost": plan.cost,
            "realised_cost_mean": statistics.fmean(u.costs) if u.costs else None,
            "planned_noise_multiplier": planned_m,
            # one number for one release: the plan's and the record's ε-equivalent, at the conversion δ
            "planned_epsilon_equivalent": epsilon_equivalent(zcdp, plan.cost, conversion).epsilon,
            "conversion_delta": conversion,
        }
        if u.numeric:
            c = u.c
            assert c is not None
            sig = statistics.fmean(u.sigmas)
            planned_sigma = plan.sigma
            if data.topology.metrics[name].aggregate is Aggregate.MEAN and planned_sigma is not None:
                planned_sigma = None  # a plan σ of a mean's parts is not the σ of the released mean
            row.update(
                {
                    "sigma_mean": sig,
                    "sigma_min": min(u.sigmas),
                    "sigma_max": max(u.sigmas),
                    "ci95_half_width_mean": statistics.fmean(u.halves),
                    "expected_abs_error_mean": u.mean_error,
                    "planned_sigma": planned_sigma,
                    "realised_over_planned_sigma": (sig / planned_sigma) if planned_sigma else None,
                    "fit": {"c": c, "max_rel_residual": u.fit_max_rel_residual, "form": "E = c / noise_multiplier"},
                    "points": [list(p) for p in sorted(set(zip(u.multipliers, u.errors, strict=True)))][:500],
                    "planned_expected_abs_error": c / planned_m,
                    "typical_magnitude": u.magnitude,
                    "magnitude_resolved": u.resolved,
                    "relative_error": (u.mean_error or 0.0) / (u.magnitude or 1.0),
                }
            )
        else:
            row["note"] = unfitted_note(u.aggregate, u.releases, data.topology.metrics[name].running_total)
        rows.append(row)
    return util, rows
