"""The budget plan: what every release of a topology costs and how noisy it is.

`build_plan(topology)` divides each scope's pool, cap × (1 − reserve), over its metrics by weight
and over each metric's releases in one period (`topology.allocation.planned_release_costs`), then
calibrates the noise of one release from its cost. `plan_to_json(plan)` is the stable,
machine-readable form printed by `dpstream plan FILE --json`; later code and tests read it.

JSON shape (version 1). Costs are in the scope's currency: ρ (zcdp) or ε (pure). Floats are
unrounded; `null` marks a value that does not apply.

    {
      "plan_version": 1,
      "topology": str,                   # path of the topology file ("" if built in memory)
      "topology_version": str,           # hash of the normalised topology (release ids use it)
      "publish_delay_s": int,            # each release is published at P(w) = C(w) + this, stamped with P(w)
      "scopes": [                        # one per budget, in file order
        {
          "name": str,
          "accounting": "zcdp" | "pure",
          "currency": "rho" | "epsilon",
          "epsilon": float, "delta": float,  # the scope's promise per period (δ = 0 for pure)
          "period": str, "period_s": int,    # e.g. "1d", 86400; periods are UTC-aligned
          "cap": float,                      # ρ* (largest ρ fitting (ε, conversion_delta) by CKS20) or ε
          "selection_delta": float,          # δ per period set aside for partition selection (topology.selection)
          "conversion_delta": float,         # δ at which ρ converts to ε (zcdp: δ − selection_delta; pure: 0)
          "reserve_fraction": float,         # never planned; only audited or may_use_reserve draws
          "reserve": float,                  # cap × reserve_fraction
          "pool": float,                     # cap − reserve: what the plan spends each period
          "warn_at": float,
          "on_warning": {"stretch": float, "thin": int},
          "releases_per_period": int,        # sum over the scope's metrics
          "planned_total": float,            # Σ releases × per-release cost; equals pool (0 if no metric)
          "planned_epsilon": float,          # ε of planned_total at the scope's δ (pure: planned_total)
          "event_level": bool,               # true if any metric protects events, not units (weaker)
          "horizon": {                       # guarantee over 30 days of renewals, per privacy unit
            "days": 30,
            "periods": int,                  # ceil(30 days / period): 30 for 1d, 720 for 1h
            "rho": float | null,             # periods × planned_total (zcdp only)
            "epsilon": float,                # planned spend composed: zcdp CKS(rho, δ); pure periods × planned_total
            "delta": float,                  # conversion δ + periods × selection δ (pure: periods × selection δ)
            "epsilon_if_reserve_spent": float,  # same with the full cap spent every period
            "naive_epsilon": float,          # periods × ε (basic composition of the stated promise)
            "naive_delta": float             # periods × δ
          },
          "metrics": [                       # the scope's metrics, in file order
            {
              "name": str,
              "aggregate": "count" | "count_units" | "sum" | "mean" | "top_k" | "quantile",
              "mechanism": "laplace" | "gaussian" | "exponential",
              "privacy_unit": str,
              "event_level": bool,           # privacy_unit 'event': event-level DP (weaker)
              "create_time_arrival": bool,   # arrival 'create_time': producer record times (weaker)
              "window": {"kind": "tumbling" | "hopping", "size_s": int, "every_s": int,
                         "overlap": int},    # overlap: windows one event falls into
              "straddling_windows": int,     # overlap − 1 windows per period boundary, charged to both periods
              "weight": float,
              "weight_share": float,         # w / Σw of the scope
              "releases_per_period": int,    # period / every
              "max_windows": int | null,     # contribution.max_windows: windows one unit counts in per period
              "charged_per_period": int,     # min(releases_per_period, max_windows): the windows one unit's
                                             # contributions reach, which the pricing rule divides the share by
              "per_release_cost": float,     # currency of the scope
              "per_release_epsilon": float,  # ε-equivalent: pure ε; zcdp CKS(ρ, δ of the scope)
              "per_period_cost": float,      # charged_per_period × per_release_cost: one unit's worst case
              "uncapped": {...} | absent,    # with max_windows only: the same release without the cap,
                                             # {per_release_cost, components: [{component, stddev, scale}]}
              "may_use_reserve": bool,
              "group_by": str | null,
              "keys": "none" | "declared" | "data",  # where the released keys come from
              "declared_keys": [str] | null,
              "partition_selection": bool,   # data-derived keys pass DP partition selection
              "selection_delta": float,      # δ of one release's partition selection (0 if keys are declared)
              "k": int | null,               # top-k only
              "quantiles": [float],          # quantile only: the levels (one component each, 'p50', ...)
              "candidates": int,             # quantile only: the public grid's size
              "schedule": {...} | absent,    # shaped metrics only (`schedule:`): {name: str | null, segments:
                                             # [{hours: "08-18" (UTC, end excluded), weight, releases_per_period,
                                             # per_release_cost, per_release_epsilon, components}]}; then
                                             # per_release_cost is the mean over the period's paid windows
              "typical": {...} | absent,     # only with `plan --typical` / `--sample`: `TypicalComparison`
                                             # {value, origin, ci95_half_width, ci_over_typical, exceeds, warning}
              "components": [                # noisy parts of one release ('value'; 'sum'+'count' of a noisy
                                             # mean; 'selection'+'value' of a top-k over data-derived keys)
                {
                  "component": str,
                  "mechanism": str,
                  "sensitivity": {"l1": float, "l2": float, "linf": float},
                  "cost": float,             # this part's share, in the scope's currency
                  "epsilon": float | null,   # pure ε of a Laplace / exponential part
                  "scale": float,            # OpenDP scale: Laplace b, Gaussian σ, top-k Gumbel scale
                  "stddev": float | null,    # noise σ (Laplace √2·b); null for top-k
                  "ci95_half_width": float | null,
                  "expected_abs_error": float | null,  # E|noise|: Laplace b, Gaussian σ√(2/π)
                  "rank_error95": float      # quantile parts only: P(rank error ≤ grid's smallest + this) ≥ 95 %
                }
              ]
            }
          ]
        }
      ],
      "privacy_units": [                 # per privacy unit (event-level sources left out): topology.composition
        {
          "privacy_unit": str,
          "sources": [str], "scopes": [str],
          "composes": bool,              # two or more scopes protect this unit: their guarantees add up
          "rho_per_day": float | null,   # Σ caps in ρ (pure ε as ε²/2) × periods per UTC day; null: pure only
          "epsilon_per_day": float,      # ε at the smallest zCDP conversion δ (pure only: Σ ε per day)
          "delta_per_day": float         # that δ + every scope's partition-selection δ in the day
        }
      ]
    }
"""

from __future__ import annotations

__all__ = [
    "PLAN_JSON_VERSION",
    "HORIZON_DAYS",
    "NoiseComponentPlan",
    "MetricPlan",
    "HorizonGuarantee",
    "ScopePlan",
    "Plan",
    "TypicalComparison",
    "compare_typical",
    "typical_warning",
    "format_ratio",
    "build_plan",
    "scope_plan",
    "plan_to_json",
]

import math
from collections.abc import Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpstream.topology import accounting as acc
from dpstream.topology import running_total
from dpstream.topology.allocation import (
    MetricDemand,
    hour_weights,
    period_weighted_windows,
    planned_release_costs,
    release_rates,
    release_share,
    weighted_windows,
)
from dpstream.topology.calibration import NoiseComponent, calibrate, quantile_rank_error, running_total_component
from dpstream.topology.composition import UnitGuarantee, unit_guarantees
from dpstream.topology.durations import format_duration
from dpstream.topology.model import (
    DEFAULT_PUBLISH_DELAY_S,
    Accounting,
    Budget,
    Mechanism,
    Metric,
    Topology,
    Window,
    WindowKind,
    charged_windows,
)
from dpstream.topology.schedule import Schedule
from dpstream.topology.selection import conversion_delta, scope_cap, selection_delta_per_release, selection_delta_total

PLAN_JSON_VERSION = 1
"""Bumped whenever a field of `plan_to_json`'s output changes meaning or disappears."""

HORIZON_DAYS = 30
"""The longer horizon over which the plan states the composed guarantee of renewals."""

_DAY_S = 86_400


@dataclass(frozen=True)
class NoiseComponentPlan:
    """One noisy part of a planned release: sensitivity, scale and the error it implies."""

    component: str
    mechanism: Mechanism
    l1: float
    l2: float
    linf: float
    cost: float
    epsilon: float | None
    scale: float
    stddev: float | None
    ci95_half_width: float | None
    expected_abs_error: float | None
    rank_error95: float | None = None
    """A quantile part's error statement: with probability ≥ 95 % the released candidate's rank
    error is at most this (in ranks) above the grid's smallest (`calibration.quantile_rank_error`)."""


@dataclass(frozen=True)
class SegmentPlan:
    """A run of UTC hours of day with one schedule weight: what a release starting in them costs on plan."""

    first_hour: int
    end_hour: int
    """Hours [first_hour, end_hour) UTC."""
    weight: float
    """The schedule's weight of these hours, as written."""
    releases_per_period: int
    """The metric's windows starting in these hours in one period."""
    per_release_cost: float
    per_release_epsilon: float
    components: tuple[NoiseComponentPlan, ...]

    @property
    def hours(self) -> str:
        """'08-18': the hours, end excluded."""
        return f"{self.first_hour:02d}-{self.end_hour:02d}"


@dataclass(frozen=True)
class MetricPlan:
    """One metric's share of its scope, per release and per period."""

    name: str
    aggregate: str
    mechanism: Mechanism
    privacy_unit: str
    event_level: bool
    window_kind: WindowKind
    window_size_s: int
    window_every_s: int
    overlap: int
    straddling_windows: int
    weight: float
    weight_share: float
    releases_per_period: int
    per_release_cost: float
    per_release_epsilon: float
    may_use_reserve: bool
    group_by: str | None
    keys: str
    declared_keys: tuple[str, ...] | None
    partition_selection: bool
    selection_delta: float
    k: int | None
    components: tuple[NoiseComponentPlan, ...]
    create_time_arrival: bool = False
    """The source's arrival is the producer's record time (`arrival: create_time`): weaker."""
    quantiles: tuple[float, ...] | None = None
    """A quantile metric's levels (None otherwise)."""
    candidates: int | None = None
    """How many candidates a quantile metric's public grid has (None otherwise)."""
    max_windows: int | None = None
    """`contribution.max_windows`: windows of the metric one unit counts in per period (None: all)."""
    charged_per_period: int | None = None
    """Windows of a period one unit's contributions reach, min(releases, max_windows) (None: releases)."""
    uncapped_per_release_cost: float | None = None
    """With max_windows: what one release would cost without the cap (None otherwise)."""
    uncapped_components: tuple[NoiseComponentPlan, ...] | None = None
    """With max_windows: the noisy parts of one release without the cap, to show σ beside σ capped."""
    hour_weights: tuple[int, ...] | None = None
    """The metric's budget schedule as the rule's integer weights (`allocation.hour_weights`); None: flat.
    Shaped, `per_release_cost` is the mean over the period's paid windows and `segments` the costs by hour."""
    schedule_name: str | None = None
    segments: tuple[SegmentPlan, ...] = ()
    """Shaped metrics only: the cost and noise of a release per run of hours of one weight."""
    running_total_steps: int | None = None
    """`release: running_total`: its T steps a period (the components' scale is each y's σ)."""

    @property
    def running_total_max_stddev(self) -> float | None:
        """A running total's largest noise std, of the total at its last step: σ·‖c‖₂ over T steps."""
        if self.running_total_steps is None:
            return None
        return running_total.total_stddev(self.running_total_steps, self.components[0].scale)

    @property
    def charged(self) -> int:
        """Windows of a period one unit's contributions reach (the releases per period without a cap)."""
        return self.releases_per_period if self.charged_per_period is None else self.charged_per_period

    @property
    def per_period_cost(self) -> float:
        """What the metric spends on one unit in one period on plan: its charged windows × the release cost."""
        return self.charged * self.per_release_cost


@dataclass(frozen=True)
class HorizonGuarantee:
    """The per-unit guarantee of `periods` renewed periods composed (zCDP adds ρ; pure adds ε)."""

    days: int
    periods: int
    rho: float | None
    epsilon: float
    delta: float
    epsilon_if_reserve_spent: float
    naive_epsilon: float
    naive_delta: float


@dataclass(frozen=True)
class ScopePlan:
    """A budget scope's cap, reserve, pool and the metrics that share the pool."""

    name: str
    accounting: Accounting
    epsilon: float
    delta: float
    period_s: int
    cap: float
    selection_delta: float
    conversion_delta: float
    reserve_fraction: float
    warn_at: float
    stretch: float
    thin: int
    metrics: tuple[MetricPlan, ...]
    planned_epsilon: float
    horizon: HorizonGuarantee

    @property
    def currency(self) -> str:
        """'rho' for zCDP scopes, 'epsilon' for pure ones."""
        return "rho" if self.accounting is Accounting.ZCDP else "epsilon"

    @property
    def reserve(self) -> float:
        """The part of the cap never planned."""
        return self.cap * self.reserve_fraction

    @property
    def pool(self) -> float:
        """What the plan spends each period: cap × (1 − reserve)."""
        return self.cap * (1.0 - self.reserve_fraction)

    @property
    def releases_per_period(self) -> int:
        """All releases of the scope in one period."""
        return sum(m.releases_per_period for m in self.metrics)

    @property
    def planned_total(self) -> float:
        """Σ over metrics of releases × per-release cost (equals the pool when there is a metric)."""
        return math.fsum(m.per_period_cost for m in self.metrics)

    @property
    def event_level(self) -> bool:
        """True when any metric of the scope is event-level (the weaker guarantee)."""
        return any(m.event_level for m in self.metrics)

    def planned_from(
        self, period_start: int, period_end: int, schedule_start: int | None = None
    ) -> dict[str, tuple[int, float]]:
        """Per metric, (charged releases, per-release cost) the plan spends the pool on in [period_start,
        period_end): the whole period's (charged windows, static cost; under `max_windows` m at most m);
        in a deployment's first period (S, `schedule_start`, after the period start) the windows starting
        at or after S (again at most m charged), priced by the same
        rule over those alone (`allocation.planned_release_costs`). No window from S: (0, static cost)."""
        if schedule_start is None or schedule_start <= period_start:
            return {m.name: (m.charged, m.per_release_cost) for m in self.metrics}
        if any(m.hour_weights is not None for m in self.metrics):
            return self._shaped_from(period_start, period_end, schedule_start)
        starts = {
            m.name: Schedule(m.window_size_s, m.window_every_s, schedule_start).starts_in(period_start, period_end)
            for m in self.metrics
        }
        demands = {
            m.name: MetricDemand(m.weight, m.charged, charged_windows(starts[m.name], m.max_windows))
            for m in self.metrics
        }
        if not any(d.left for d in demands.values()):
            return {m.name: (0, m.per_release_cost) for m in self.metrics}
        costs = planned_release_costs(self.pool, demands)
        return {name: (demands[name].left, costs[name]) for name in demands}

    def _shaped_from(self, period_start: int, period_end: int, schedule_start: int) -> dict[str, tuple[int, float]]:
        """`planned_from` in a first period when a metric is shaped: the rule on weighted counts; a shaped
        metric's cost is the mean over its paid windows from S (they add up to its part of the pool)."""
        demands: dict[str, MetricDemand] = {}
        paid: dict[str, int] = {}
        for m in self.metrics:
            grid = Schedule(m.window_size_s, m.window_every_s, schedule_start)
            paid[m.name] = charged_windows(grid.starts_in(period_start, period_end), m.max_windows)
            whole = period_weighted_windows(
                Window(m.window_size_s, m.window_every_s), self.period_s, m.hour_weights, m.max_windows
            )
            left = (
                paid[m.name]
                if m.hour_weights is None
                else weighted_windows(grid.starts_by_hour(period_start, period_end), m.hour_weights, m.max_windows)
            )
            demands[m.name] = MetricDemand(Fraction(m.weight), whole, left)
        if not any(d.left for d in demands.values()):
            return {m.name: (0, m.per_release_cost) for m in self.metrics}
        rates = release_rates(demands)
        lefts = {name: d.left for name, d in demands.items()}
        out: dict[str, tuple[int, float]] = {}
        for name, d in demands.items():
            share = release_share(name, rates, lefts)
            mean = share * d.left / paid[name] if paid[name] else share
            out[name] = (paid[name], self.pool * float(mean))
        return out


@dataclass(frozen=True)
class Plan:
    """The plan of a whole topology: one ScopePlan per budget, in file order."""

    topology_path: str
    topology_version: str
    scopes: tuple[ScopePlan, ...]
    publish_delay_s: int = DEFAULT_PUBLISH_DELAY_S
    """Seconds from a window's close time C(w) to its public release time P(w)."""
    privacy_units: tuple[UnitGuarantee, ...] = ()
    """What the scopes promise together per privacy unit and UTC day (`topology.composition`)."""

    def scope(self, name: str) -> ScopePlan:
        """The plan of one scope by name (KeyError if absent)."""
        for scope in self.scopes:
            if scope.name == name:
                return scope
        raise KeyError(name)

    def metric(self, name: str) -> MetricPlan:
        """The plan of one metric by name, whatever its scope (KeyError if absent)."""
        for scope in self.scopes:
            for metric in scope.metrics:
                if metric.name == name:
                    return metric
        raise KeyError(name)


def _to_epsilon(budget: Budget, conversion: float, cost: float) -> float:
    """ε-equivalent of a spend in the scope's currency at the scope's conversion δ."""
    return acc.epsilon_equivalent(budget.accounting is Accounting.ZCDP, cost, conversion).epsilon


def _expected_abs_error(mechanism: Mechanism, scale: float) -> float | None:
    if mechanism is Mechanism.LAPLACE:
        return scale
    if mechanism is Mechanism.GAUSSIAN:
        return scale * math.sqrt(2.0 / math.pi)
    return None


def _component_plan(part: NoiseComponent, candidates: int | None = None) -> NoiseComponentPlan:
    """The plan of one noisy part; `candidates`: a quantile metric's grid size (its parts get a rank error)."""
    noisy_value = part.mechanism is not Mechanism.EXPONENTIAL
    rank_error = quantile_rank_error(part.scale, candidates) if candidates is not None else None
    return NoiseComponentPlan(
        component=part.component,
        mechanism=part.mechanism,
        l1=part.sensitivity.l1,
        l2=part.sensitivity.l2,
        linf=part.sensitivity.linf,
        cost=part.cost,
        epsilon=part.epsilon,
        scale=part.scale,
        stddev=part.stddev if noisy_value else None,
        ci95_half_width=part.ci95_half_width if noisy_value else None,
        expected_abs_error=_expected_abs_error(part.mechanism, part.scale),
        rank_error95=rank_error,
    )


def _keys_source(metric: Metric) -> str:
    if metric.group_by is None:
        return "none"
    return "declared" if metric.keys is not None else "data"


def _metric_plan(
    topology: Topology,
    budget: Budget,
    metric: Metric,
    cost: float,
    demands: dict[str, MetricDemand],
    conversion: float,
    uncapped_cost: float | None = None,
    segments: tuple[tuple[int, int, float, int, float], ...] = (),
) -> MetricPlan:
    """`uncapped_cost`: with `contribution.max_windows`, the release's cost without the cap."""
    grid = len(metric.candidates) if metric.candidates is not None else None
    total_weight = math.fsum(d.weight for d in demands.values())
    source = topology.sources.get(metric.source)
    privacy_unit = source.privacy_unit if source is not None else ""
    window = metric.window
    return MetricPlan(
        name=metric.name,
        aggregate=metric.aggregate.value,
        mechanism=metric.mechanism,
        privacy_unit=privacy_unit,
        event_level=source.event_level if source is not None else False,
        window_kind=window.kind,
        window_size_s=window.size_s,
        window_every_s=window.every_s,
        overlap=window.overlap,
        straddling_windows=window.overlap - 1,
        weight=metric.weight,
        weight_share=metric.weight / total_weight,
        releases_per_period=window.releases_per_period(budget.period_s),
        per_release_cost=cost,
        per_release_epsilon=_to_epsilon(budget, conversion, cost),
        may_use_reserve=metric.may_use_reserve,
        group_by=metric.group_by,
        keys=_keys_source(metric),
        declared_keys=metric.keys,
        partition_selection=metric.needs_partition_selection,
        selection_delta=selection_delta_per_release(metric, budget, list(topology.metrics.values())),
        k=metric.k,
        components=tuple(_component_plan(p, grid) for p in _calibrated(metric, budget, cost)),
        create_time_arrival=source.create_time_arrival if source is not None else False,
        quantiles=metric.quantiles,
        candidates=grid,
        max_windows=metric.paid_windows,
        charged_per_period=metric.charged_per_period(budget.period_s),
        uncapped_per_release_cost=uncapped_cost,
        uncapped_components=None
        if uncapped_cost is None
        else tuple(_component_plan(p, grid) for p in calibrate(metric, budget.accounting, uncapped_cost)),
        hour_weights=hour_weights(metric.schedule),
        schedule_name=metric.schedule.name if metric.schedule is not None else None,
        running_total_steps=running_total.steps_per_period(metric, budget.period_s) if metric.running_total else None,
        segments=tuple(
            SegmentPlan(
                lo,
                hi,
                weight,
                count,
                c,
                _to_epsilon(budget, conversion, c),
                tuple(_component_plan(p, grid) for p in _calibrated(metric, budget, c)),
            )
            for lo, hi, weight, count, c in segments
        ),
    )


def _calibrated(metric: Metric, budget: Budget, cost: float) -> tuple[NoiseComponent, ...]:
    """The noisy parts of one release at `cost`: a running total's are its period's one Gaussian."""
    if metric.running_total:
        return (running_total_component(metric, budget.period_s, cost),)
    return calibrate(metric, budget.accounting, cost)


def _segments(
    metric: Metric, period_s: int, pool: float, share: Fraction
) -> tuple[tuple[int, int, float, int, float], ...]:
    """(first hour, end hour, weight, windows per period, cost of one release) per run of hours of one
    weight of a shaped metric; `share` is the pool's part per unit of integer weight."""
    weights = hour_weights(metric.schedule)
    if weights is None or metric.schedule is None:
        return ()
    counts = Schedule.of(metric).starts_by_hour(0, period_s)
    runs: list[tuple[int, int, float, int, float]] = []
    lo = 0
    for hour in range(1, len(weights) + 1):
        if hour == len(weights) or weights[hour] != weights[lo]:
            cost = pool * float(share * weights[lo])
            runs.append((lo, hour, metric.schedule.hours[lo], sum(counts[lo:hour]), cost))
            lo = hour
    return tuple(runs)


def _horizon(budget: Budget, cap: float, planned: float, selection: float, conversion: float) -> HorizonGuarantee:
    periods = -(-HORIZON_DAYS * _DAY_S // budget.period_s)
    zcdp = budget.accounting is Accounting.ZCDP
    return HorizonGuarantee(
        days=HORIZON_DAYS,
        periods=periods,
        rho=periods * planned if zcdp else None,
        epsilon=_to_epsilon(budget, conversion, periods * planned),
        delta=conversion + periods * selection,  # a pure scope converts at δ = 0
        epsilon_if_reserve_spent=_to_epsilon(budget, conversion, periods * cap),
        naive_epsilon=periods * budget.epsilon,
        naive_delta=periods * budget.delta,
    )


def scope_plan(topology: Topology, budget: Budget) -> ScopePlan:
    """The plan of one budget scope of `topology`."""
    metrics = topology.metrics_of(budget.name)
    cap = scope_cap(budget, metrics)
    selection = selection_delta_total(budget, metrics)
    conversion = conversion_delta(budget, metrics) if budget.accounting is Accounting.ZCDP else 0.0
    pool = cap * (1.0 - budget.reserve)
    weights = {m.name: hour_weights(m.schedule) for m in metrics}
    paid = {
        m.name: period_weighted_windows(m.window, budget.period_s, weights[m.name], m.paid_windows) for m in metrics
    }
    demands = {m.name: MetricDemand(weight=m.weight, per_period=paid[m.name], left=paid[m.name]) for m in metrics}
    costs = planned_release_costs(pool, demands)
    segments: dict[str, tuple[tuple[int, int, float, int, float], ...]] = {}
    if any(w is not None for w in weights.values()):
        rates = release_rates(demands)
        for m in metrics:
            if weights[m.name] is None:
                continue
            unit = release_share(m.name, rates, paid)
            count = m.charged_per_period(budget.period_s)
            costs[m.name] = pool * float(unit * paid[m.name] / count)  # the mean over the paid windows
            segments[m.name] = _segments(m, budget.period_s, pool, unit)
    uncapped: dict[str, float] = {}
    if any(m.contribution.max_windows is not None for m in metrics):  # the same plan without the caps, beside it
        n = {m.name: m.window.releases_per_period(budget.period_s) for m in metrics}
        uncapped = planned_release_costs(pool, {m.name: MetricDemand(m.weight, n[m.name], n[m.name]) for m in metrics})
    plans = tuple(
        _metric_plan(
            topology,
            budget,
            m,
            costs[m.name],
            demands,
            conversion,
            uncapped[m.name] if m.contribution.max_windows is not None else None,
            segments.get(m.name, ()),
        )
        for m in metrics
    )
    planned = math.fsum(p.per_period_cost for p in plans)
    return ScopePlan(
        name=budget.name,
        accounting=budget.accounting,
        epsilon=budget.epsilon,
        delta=budget.delta,
        period_s=budget.period_s,
        cap=cap,
        selection_delta=selection,
        conversion_delta=conversion,
        reserve_fraction=budget.reserve,
        warn_at=budget.warn_at,
        stretch=budget.on_warning.stretch,
        thin=budget.on_warning.thin,
        metrics=plans,
        planned_epsilon=_to_epsilon(budget, conversion, planned) if planned > 0 else 0.0,
        horizon=_horizon(budget, cap, planned, selection, conversion),
    )


def build_plan(topology: Topology) -> Plan:
    """The static plan of every scope of `topology` (weights over cap − reserve)."""
    return Plan(
        topology_path=topology.path,
        topology_version=topology.topology_version,
        scopes=tuple(scope_plan(topology, b) for b in topology.budgets.values()),
        publish_delay_s=topology.publish_delay_s,
        privacy_units=tuple(unit_guarantees(topology)),
    )


@dataclass(frozen=True)
class TypicalComparison:
    """A metric's 95 % CI half-width against a typical true value per window (`plan --typical/--sample`)."""

    metric: str
    value: float
    """The typical true value of one release (per key: see `plan --help`)."""
    origin: str
    """Where it came from: 'typical' (given on the command line) or 'sample' (computed from events)."""
    ci95_half_width: float | None
    """The release's own 95 % half-width in value units; None when the plan has none (top-k, a ratio mean)."""

    @property
    def ratio(self) -> float | None:
        """CI / |typical| (inf for a typical value of 0); None when there is no CI to compare."""
        if self.ci95_half_width is None:
            return None
        return self.ci95_half_width / abs(self.value) if self.value else math.inf

    @property
    def exceeds(self) -> bool:
        """True when the noise's 95 % interval is wider than the value itself: noise swamps the signal."""
        return self.ratio is not None and self.ratio > 1.0


def compare_typical(metric: MetricPlan, value: float, origin: str) -> TypicalComparison:
    """`metric`'s CI against `value`: counts, sums and public-denominator means compare their one 'value'
    part; a mean over a noisy count has no CI of its own in the plan and top-k has none (n/a)."""
    parts = {c.component: c for c in metric.components}
    value_part = parts.get("value")
    ci = value_part.ci95_half_width if metric.aggregate != "top_k" and value_part is not None else None
    return TypicalComparison(metric.name, value, origin, ci)


def format_ratio(ratio: float | None) -> str:
    """CI / typical as text: three significant digits, whole numbers from 1000 on, '∞', or 'n/a' (no CI)."""
    if ratio is None:
        return "n/a"
    if not math.isfinite(ratio):
        return "∞"
    return f"{ratio:,.0f}" if ratio >= 1000 else f"{ratio:.3g}"


def typical_warning(metric: MetricPlan, t: TypicalComparison) -> str | None:
    """The one-line warning when the 95 % CI exceeds the typical value (None otherwise), with what would
    narrow it (a longer window, a larger weight, a smaller or new `contribution.max_windows`)."""
    if not t.exceeds:
        return None
    cap = (
        f"a smaller contribution.max_windows (now {metric.max_windows})"
        if metric.max_windows is not None
        else "contribution.max_windows (at most that many windows per unit and period)"
    )
    return (
        f"WARNING {metric.name}: 95% CI ±{t.ci95_half_width:.4g} is {format_ratio(t.ratio)}× "
        f"its typical value {t.value:.4g} per window (noise swamps the signal); "
        f"try a longer window (now {format_duration(metric.window_size_s)}), "
        f"a larger weight (now {metric.weight_share:.3f} of the scope), or {cap}"
    )


def _component_json(c: NoiseComponentPlan) -> dict[str, Any]:
    return {
        "component": c.component,
        "mechanism": c.mechanism.value,
        "sensitivity": {"l1": c.l1, "l2": c.l2, "linf": c.linf},
        "cost": c.cost,
        "epsilon": c.epsilon,
        "scale": c.scale,
        "stddev": c.stddev,
        "ci95_half_width": c.ci95_half_width,
        "expected_abs_error": c.expected_abs_error,
        **({"rank_error95": c.rank_error95} if c.rank_error95 is not None else {}),
    }


def _typical_json(t: TypicalComparison, warning: str | None) -> dict[str, Any]:
    ratio = t.ratio
    return {
        "value": t.value,
        "origin": t.origin,
        "ci95_half_width": t.ci95_half_width,
        "ci_over_typical": ratio if ratio is None or math.isfinite(ratio) else None,
        "exceeds": t.exceeds,
        "warning": warning,
    }


def _metric_json(m: MetricPlan, typical: Mapping[str, TypicalComparison]) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "name": m.name,
        "aggregate": m.aggregate,
        "mechanism": m.mechanism.value,
        "privacy_unit": m.privacy_unit,
        "event_level": m.event_level,
        "create_time_arrival": m.create_time_arrival,
        "window": {
            "kind": m.window_kind.value,
            "size_s": m.window_size_s,
            "every_s": m.window_every_s,
            "overlap": m.overlap,
        },
        "straddling_windows": m.straddling_windows,
        "weight": m.weight,
        "weight_share": m.weight_share,
        "releases_per_period": m.releases_per_period,
        "max_windows": m.max_windows,
        "charged_per_period": m.charged,
        "per_release_cost": m.per_release_cost,
        "per_release_epsilon": m.per_release_epsilon,
        "per_period_cost": m.per_period_cost,
        "may_use_reserve": m.may_use_reserve,
        "group_by": m.group_by,
        "keys": m.keys,
        "declared_keys": list(m.declared_keys) if m.declared_keys is not None else None,
        "partition_selection": m.partition_selection,
        "selection_delta": m.selection_delta,
        "k": m.k,
        "components": [_component_json(c) for c in m.components],
    }
    if m.uncapped_components is not None:
        doc["uncapped"] = {
            "per_release_cost": m.uncapped_per_release_cost,
            "components": [
                {"component": c.component, "stddev": c.stddev, "scale": c.scale} for c in m.uncapped_components
            ],
        }
    if m.quantiles is not None:
        doc["quantiles"] = list(m.quantiles)
        doc["candidates"] = m.candidates
    if m.segments:
        doc["schedule"] = {
            "name": m.schedule_name,
            "segments": [
                {
                    "hours": seg.hours,
                    "weight": seg.weight,
                    "releases_per_period": seg.releases_per_period,
                    "per_release_cost": seg.per_release_cost,
                    "per_release_epsilon": seg.per_release_epsilon,
                    "components": [_component_json(c) for c in seg.components],
                }
                for seg in m.segments
            ],
        }
    t = typical.get(m.name)
    if t is not None:
        doc["typical"] = _typical_json(t, typical_warning(m, t))
    return doc


def _scope_json(s: ScopePlan, typical: Mapping[str, TypicalComparison]) -> dict[str, Any]:
    h = s.horizon
    return {
        "name": s.name,
        "accounting": s.accounting.value,
        "currency": s.currency,
        "epsilon": s.epsilon,
        "delta": s.delta,
        "period": format_duration(s.period_s),
        "period_s": s.period_s,
        "cap": s.cap,
        "selection_delta": s.selection_delta,
        "conversion_delta": s.conversion_delta,
        "reserve_fraction": s.reserve_fraction,
        "reserve": s.reserve,
        "pool": s.pool,
        "warn_at": s.warn_at,
        "on_warning": {"stretch": s.stretch, "thin": s.thin},
        "releases_per_period": s.releases_per_period,
        "planned_total": s.planned_total,
        "planned_epsilon": s.planned_epsilon,
        "event_level": s.event_level,
        "horizon": {
            "days": h.days,
            "periods": h.periods,
            "rho": h.rho,
            "epsilon": h.epsilon,
            "delta": h.delta,
            "epsilon_if_reserve_spent": h.epsilon_if_reserve_spent,
            "naive_epsilon": h.naive_epsilon,
            "naive_delta": h.naive_delta,
        },
        "metrics": [_metric_json(m, typical) for m in s.metrics],
    }


def plan_to_json(plan: Plan, typical: Mapping[str, TypicalComparison] | None = None) -> dict[str, Any]:
    """The plan as plain JSON data, in the documented shape of this module's docstring; `typical`
    (metric → comparison) adds each named metric's `typical` object."""
    typical = typical or {}
    return {
        "plan_version": PLAN_JSON_VERSION,
        "topology": plan.topology_path,
        "topology_version": plan.topology_version,
        "publish_delay_s": plan.publish_delay_s,
        "scopes": [_scope_json(s, typical) for s in plan.scopes],
        "privacy_units": [_unit_json(u) for u in plan.privacy_units],
    }


def _unit_json(u: UnitGuarantee) -> dict[str, Any]:
    return {
        "privacy_unit": u.privacy_unit,
        "sources": list(u.sources),
        "scopes": [s.scope for s in u.scopes],
        "composes": u.composes,
        "rho_per_day": u.rho_per_day,
        "epsilon_per_day": u.epsilon,
        "delta_per_day": u.delta,
    }
