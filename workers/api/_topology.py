"""Load, validate and plan a topology from Python: the same loader, lint and plan as the CLI."""

from __future__ import annotations

__all__ = ["Plan", "PlannedScope", "Validation", "load_topology", "plan", "validate"]

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dpstream.topology.errors import ConfigWarning

from ._costs import Cost, cost_in

if TYPE_CHECKING:
    from dpstream.topology import plan as plan_module
    from dpstream.topology.model import Topology


def load_topology(path: str | os.PathLike[str]) -> Topology:
    """Read and check a topology file (what `dpstream validate` checks); returns the frozen `Topology`.

    A mistake raises `dpstream.ConfigError`, one line `FILE:LINE: entity: field value: problem; fix`;
    for a file with several mistakes, its `problems` lists every one in file order.
    """
    from dpstream.topology.loader import load_topology as load

    return load(path)


@dataclass(frozen=True)
class Validation:
    """A valid topology and its warnings (legal but probably unintended: `dpstream validate` prints them)."""

    topology: Topology
    warnings: tuple[ConfigWarning, ...]


def validate(path: str | os.PathLike[str]) -> Validation:
    """Load `path` and lint it, like `dpstream validate FILE`: mistakes raise `ConfigError`, warnings are returned."""
    from dpstream.topology.loader import load_with_warnings

    topology, warnings = load_with_warnings(path)
    return Validation(topology, tuple(warnings))


@dataclass(frozen=True)
class PlannedScope:
    """One budget scope of the plan, its costs typed in the scope's currency (`Rho` or `Epsilon`)."""

    name: str
    accounting: str
    """`zcdp` (costs are `Rho`) or `pure` (costs are `Epsilon`)."""
    epsilon: float
    delta: float
    """The (ε, δ) the topology promises per period and privacy unit (δ = 0 for pure)."""
    period_s: int
    cap: Cost
    """What the scope may spend per period: ρ* (the largest ρ whose (ε, δ) fits) or ε."""
    reserve: Cost
    """The part of the cap never planned (only an audited grant or `may_use_reserve` draws on it)."""
    pool: Cost
    """cap − reserve: what the plan spends each period."""
    releases_per_period: int
    per_release: Mapping[str, Cost]
    """Metric name → the planned cost of one of its releases."""


@dataclass(frozen=True)
class Plan:
    """The budget plan of a topology (`dpstream plan FILE`): per scope its cap, reserve, pool and costs.

    `str(plan)` is the text `dpstream plan` prints, `plan.to_json()` the object `dpstream plan
    --json` prints; `plan.details` holds every field (noise σ, 95 % CI, 30-day guarantee per metric).
    """

    topology_version: str
    scopes: Mapping[str, PlannedScope]
    details: plan_module.Plan = field(repr=False)

    def to_json(self) -> dict[str, Any]:
        """The plan as `dpstream plan FILE --json` prints it (`plan_version` 1)."""
        from dpstream.topology.plan import plan_to_json

        return plan_to_json(self.details)

    def __str__(self) -> str:
        from dpstream.topology.plan_render import render_plan

        return render_plan(self.details)


def plan(topology: Topology | str | os.PathLike[str]) -> Plan:
    """The budget plan of a topology (or of the topology file at a path), as `dpstream plan` computes it."""
    from dpstream.topology.model import Topology
    from dpstream.topology.plan import build_plan

    loaded = topology if isinstance(topology, Topology) else load_topology(topology)
    details = build_plan(loaded)
    scopes = {}
    for s in details.scopes:
        currency = s.accounting.value
        scopes[s.name] = PlannedScope(
            name=s.name,
            accounting=currency,
            epsilon=s.epsilon,
            delta=s.delta,
            period_s=s.period_s,
            cap=cost_in(currency, s.cap),
            reserve=cost_in(currency, s.reserve),
            pool=cost_in(currency, s.pool),
            releases_per_period=s.releases_per_period,
            per_release={m.name: cost_in(currency, m.per_release_cost) for m in s.metrics},
        )
    return Plan(details.topology_version, scopes, details)
