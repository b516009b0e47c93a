"""What several budget scopes promise together to one privacy unit, per UTC day.

Each scope's cap holds on its own, but a person whose events feed metrics of two scopes (or of
two sources with the same privacy unit charged to two scopes) is protected by their composition
only: nothing in the ledger adds them up. The combined guarantee, per unit and UTC day:

- every scope's cap in ρ: a zCDP cap ρ* as it is; a pure cap ε counts as ε²/2 (ε-DP implies
  ε²/2-zCDP);
- times the periods of the scope one UTC day can touch (24 for 1h, 1 for 1d or 1w): ρ adds up
  across period lengths;
- converted to ε at the smallest conversion δ among the zCDP scopes (`selection.conversion_delta`;
  a pure scope's δ is for partition selection only), by `accounting.epsilon_equivalent`; δ is
  that plus the partition-selection δ every scope may spend in the day. When every scope is pure,
  basic composition (Σ ε per day) is used instead.

Event-level sources (`privacy_unit: event`) protect single events, not people, and are left out.

    for g in unit_guarantees(topology):
        if g.composes: print(g.privacy_unit, g.epsilon, g.delta)
"""

from __future__ import annotations

__all__ = ["ScopeShare", "UnitGuarantee", "periods_per_day", "unit_guarantees"]

import math
from dataclasses import dataclass

from dpstream.topology import accounting as acc
from dpstream.topology.model import Accounting, Topology
from dpstream.topology.selection import conversion_delta, scope_cap, selection_delta_total

DAY_S = 86_400


def periods_per_day(period_s: int) -> int:
    """The most periods of `period_s` seconds (UTC-aligned) one UTC day touches.

    >>> periods_per_day(3600), periods_per_day(86_400), periods_per_day(7 * 86_400), periods_per_day(5 * 3600)
    (24, 1, 1, 6)
    """
    if DAY_S % period_s == 0:
        return DAY_S // period_s
    if period_s % DAY_S == 0:
        return 1
    return -(-DAY_S // period_s) + 1


@dataclass(frozen=True)
class ScopeShare:
    """One scope's part in a unit's day: its cap in ρ and how many of its periods a day touches."""

    scope: str
    accounting: Accounting
    period_s: int
    periods_per_day: int
    rho_per_day: float
    """cap in ρ (pure: ε²/2) × periods_per_day."""
    epsilon_per_day: float | None
    """Pure scopes only: cap ε × periods_per_day (basic composition)."""
    conversion_delta: float
    selection_delta_per_day: float


@dataclass(frozen=True)
class UnitGuarantee:
    """The combined per-day guarantee of every scope over one privacy unit."""

    privacy_unit: str
    sources: tuple[str, ...]
    scopes: tuple[ScopeShare, ...]
    rho_per_day: float | None
    """Σ of the scopes' ρ per day (None when the ε comes from pure basic composition alone)."""
    epsilon: float
    delta: float

    @property
    def composes(self) -> bool:
        """Two or more scopes protect this unit: their guarantees add up silently."""
        return len(self.scopes) > 1

    def summary(self) -> str:
        """`ρ = 0.049 per UTC day → (ε = 1.41, δ = 1.1e-06)-DP per user_id per UTC day`."""
        rho = f"ρ = {self.rho_per_day:.4g} per UTC day → " if self.rho_per_day is not None else ""
        return f"{rho}(ε = {self.epsilon:.4g}, δ = {self.delta:.2g})-DP per {self.privacy_unit} per UTC day"


def _share(topology: Topology, scope: str) -> ScopeShare:
    budget = topology.budgets[scope]
    metrics = topology.metrics_of(scope)
    cap = scope_cap(budget, metrics)
    n = periods_per_day(budget.period_s)
    pure = budget.accounting is Accounting.PURE
    conv = conversion_delta(budget, metrics)  # 0 in a pure scope
    return ScopeShare(
        scope=scope,
        accounting=budget.accounting,
        period_s=budget.period_s,
        periods_per_day=n,
        rho_per_day=(acc.pure_to_rho(cap) if pure else cap) * n,
        epsilon_per_day=cap * n if pure else None,
        conversion_delta=conv,
        selection_delta_per_day=selection_delta_total(budget, metrics) * n,
    )


def unit_guarantees(topology: Topology) -> list[UnitGuarantee]:
    """One guarantee per privacy unit (event-level sources left out), in the order units first appear."""
    units: dict[str, tuple[list[str], list[str]]] = {}
    for metric in topology.metrics.values():
        source = topology.sources.get(metric.source)
        if source is None or source.event_level or metric.budget not in topology.budgets:
            continue
        sources, scopes = units.setdefault(source.privacy_unit, ([], []))
        if source.name not in sources:
            sources.append(source.name)
        if metric.budget not in scopes:
            scopes.append(metric.budget)
    out = []
    for unit, (sources, scopes) in units.items():
        shares = tuple(_share(topology, s) for s in scopes)
        rho = math.fsum(s.rho_per_day for s in shares)
        selection = math.fsum(s.selection_delta_per_day for s in shares)
        deltas = [s.conversion_delta for s in shares if s.conversion_delta > 0]
        basic = [s.epsilon_per_day for s in shares]
        pure_sum = math.fsum(e for e in basic if e is not None) if all(e is not None for e in basic) else None
        if pure_sum is not None or not deltas:  # every scope pure: basic composition
            out.append(UnitGuarantee(unit, tuple(sources), shares, None, pure_sum or 0.0, selection))
            continue
        smallest = min(deltas)
        eps = acc.epsilon_equivalent(True, rho, smallest).epsilon
        out.append(UnitGuarantee(unit, tuple(sources), shares, rho, eps, smallest + selection))
    return out
