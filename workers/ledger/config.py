"""A budget scope as the ledger registers it: cap, reserve and warning threshold in units, metric plans.

Built from the topology once at `open_ledger`; its digest is stored with the scope so a changed
config is noticed and audited, and every charge carries it so a worker whose topology
disagrees with the registered one is refused.
"""

from __future__ import annotations

__all__ = ["MetricShare", "ScopeConfig", "scope_configs"]

import hashlib
import json
from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property

from dpstream.topology.allocation import (
    MetricDemand,
    hour_weights,
    period_weighted_windows,
    release_rates,
    release_share,
)
from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Accounting, Budget, Metric, Topology, WarningPolicy, Window, charged_windows
from dpstream.topology.schedule import Schedule
from dpstream.topology.selection import scope_cap, selection_delta_total
from dpstream.workers.ledger import topm
from dpstream.workers.ledger.keys import check_scope_name
from dpstream.workers.ledger.units import cap_to_units, delta_cap_to_units, share_of_units


@dataclass(frozen=True)
class MetricShare:
    """What the ledger's allocation needs of one metric: weight (exact), window, releases per period
    (the plan's full per-metric figures are `topology.plan.MetricPlan`)."""

    name: str
    weight: Fraction
    window: Window
    per_period: int
    may_use_reserve: bool
    max_windows: int | None = None
    """`contribution.max_windows`: a unit counts in at most this many of the metric's windows per
    period, so the period pays only the metric's largest `max_windows` charges (`decision`)."""
    hours: tuple[int, ...] | None = None
    """The metric's budget schedule as the rule's integer weights by UTC hour of day
    (`topology.allocation.hour_weights`); None: flat."""

    @property
    def paid_per_period(self) -> int:
        """The windows a period pays for on plan (`topology.model.charged_windows`)."""
        return charged_windows(self.per_period, self.max_windows)


@dataclass(frozen=True)
class ScopeConfig:
    """One budget scope in ledger terms."""

    name: str
    accounting: Accounting
    epsilon: float
    delta: float
    period_s: int
    cap_units: int
    reserve_units: int
    warn_units: int
    reserve: float
    warn_at: float
    on_warning: WarningPolicy
    metrics: tuple[MetricShare, ...]
    delta_cap_units: int = 0
    """The partition-selection δ a period may spend, in δ units (1e-18; 0 when nothing selects)."""
    topology_version: str = ""
    """The version of the topology this process runs (not stored: processes of several versions
    charge one scope; under `max_windows` each version's charges are bounded apart, `topm.field`)."""

    @classmethod
    def from_budget(cls, budget: Budget, metrics: list[Metric], topology_version: str = "") -> ScopeConfig:
        """Cap = ρ* (CKS20, at the δ left after partition selection) for zCDP scopes, ε for pure ones."""
        check_scope_name(budget.name)
        where = f"budget {budget.name!r}"
        if not 0 <= budget.reserve < 1:
            raise ConfigError(f"{where}: reserve {budget.reserve!r} must be in [0, 1)")
        if not 0 < budget.warn_at <= 1:
            raise ConfigError(f"{where}: warn_at {budget.warn_at!r} must be in (0, 1]")
        cap = scope_cap(budget, metrics)
        cap_units = cap_to_units(cap, where)
        plans = tuple(
            MetricShare(
                m.name,
                Fraction(repr(float(m.weight))),
                m.window,
                m.window.releases_per_period(budget.period_s),
                m.may_use_reserve,
                m.paid_windows,
                hour_weights(m.schedule),
            )
            for m in metrics
        )
        return cls(
            name=budget.name,
            accounting=budget.accounting,
            epsilon=budget.epsilon,
            delta=budget.delta,
            period_s=budget.period_s,
            cap_units=cap_units,
            reserve_units=share_of_units(cap_units, budget.reserve),
            warn_units=share_of_units(cap_units, budget.warn_at),
            reserve=budget.reserve,
            warn_at=budget.warn_at,
            on_warning=budget.on_warning,
            metrics=plans,
            delta_cap_units=delta_cap_to_units(selection_delta_total(budget, metrics), where),
            topology_version=topology_version,
        )

    def metric(self, name: str) -> MetricShare:
        """The plan of one metric of this scope (ConfigError if it is not charged here)."""
        for plan in self.metrics:
            if plan.name == name:
                return plan
        raise ConfigError(f"metric {name!r} is not charged to budget {self.name!r}")

    @cached_property
    def plans(self) -> dict[str, MetricShare]:
        """Metric name → its plan (the first of that name, as `metric` finds it)."""
        plans: dict[str, MetricShare] = {}
        for p in self.metrics:
            plans.setdefault(p.name, p)
        return plans

    @cached_property
    def pricing_rates(self) -> dict[str, int]:
        """Each metric's rate k_j (`topology.allocation.release_rates`), the pricing rule's input, once
        per scope; a name that repeats is priced as its first plan (`plans`)."""
        paid = self.paid_weighted
        return release_rates({name: MetricDemand(p.weight, paid[name], paid[name]) for name, p in self.plans.items()})

    @cached_property
    def paid_weighted(self) -> dict[str, int]:
        """Per metric, the windows a whole period pays for, weighted by its schedule
        (`topology.allocation.period_weighted_windows`; flat: `MetricShare.paid_per_period`)."""
        return {
            name: period_weighted_windows(p.window, self.period_s, p.hours, p.max_windows)
            for name, p in self.plans.items()
        }

    @cached_property
    def shaped(self) -> dict[str, tuple[int, ...]]:
        """Metric → its integer hour weights, for the metrics with a (non-flat) schedule."""
        return {name: p.hours for name, p in self.plans.items() if p.hours is not None}

    @cached_property
    def capped(self) -> dict[str, tuple[int, str]]:
        """Metric → (its `max_windows`, the period block's field of its largest charges under this
        topology version: `topm.field`), for the metrics that have one."""
        return {
            name: (p.max_windows, topm.field(name, self.topology_version))
            for name, p in self.plans.items()
            if p.max_windows is not None
        }

    @cached_property
    def _schedules(self) -> dict[int | None, tuple[tuple[str, int, Schedule], ...]]:
        return {}

    def schedules(self, schedule_start: int | None) -> tuple[tuple[str, int, Schedule], ...]:
        """(name, window size, its `Schedule` from S) of each metric `pricing_rates` prices, kept per S
        (one S per deployment: a few entries), so a quote builds and hashes nothing."""
        found = self._schedules.get(schedule_start)
        if found is None:
            found = tuple((n, w.size_s, Schedule.of_window(w, schedule_start)) for n, w in self.pricing_windows)
            self._schedules[schedule_start] = found
        return found

    @cached_property
    def pricing_windows(self) -> tuple[tuple[str, Window], ...]:
        """(name, window) of each metric `pricing_rates` prices."""
        return tuple((p.name, p.window) for p in self.plans.values())

    @cached_property
    def planned_shares(self) -> dict[str, Fraction]:
        """Each metric's share of the pool on plan (every release to come): w_m / Σw / N_m, exact
        (shaped: per unit of window weight, w_m / Σw / W_m; a window of weight h gets h times it)."""
        rates = self.pricing_rates
        left = self.paid_weighted
        return {name: release_share(name, rates, left) for name in rates}

    @cached_property
    def digest(self) -> str:
        """The digest of the stored fields (what `register` stores and every charge carries)."""
        return self.stored_fields()["digest"]

    def stored_fields(self) -> dict[str, str]:
        """The fields kept in the scope's config hash (read by scripts and the CLI)."""
        fields = {
            "cap": str(self.cap_units),
            "reserve": str(self.reserve_units),
            "warn": str(self.warn_units),
            "reserve_frac": repr(self.reserve),
            "warn_at": repr(self.warn_at),
            "accounting": self.accounting.value,
            "epsilon": repr(self.epsilon),
            "delta": repr(self.delta),
            "period_s": str(self.period_s),
            "delta_cap": str(self.delta_cap_units),
            "stretch": repr(self.on_warning.stretch),
            "thin": str(self.on_warning.thin),
            "metrics": json.dumps(
                [
                    [p.name, str(p.weight), p.window.size_s, p.window.every_s, p.may_use_reserve]
                    + ([] if p.max_windows is None else [p.max_windows])  # (digests without it unchanged)
                    + ([] if p.hours is None else [{"schedule": list(p.hours)}])  # flat: digest unchanged
                    for p in self.metrics
                ],
                separators=(",", ":"),
            ),
        }
        fields["digest"] = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:16]
        return fields


def scope_configs(topology: Topology) -> dict[str, ScopeConfig]:
    """Every budget scope of a topology, by name."""
    return {
        name: ScopeConfig.from_budget(b, topology.metrics_of(name), topology.topology_version)
        for name, b in topology.budgets.items()
    }
