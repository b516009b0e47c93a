"""Typed privacy costs: `Rho` (zero-concentrated DP) and `Epsilon` (pure DP), never bare floats.

A scope's cap, its spend and a release's cost are in the scope's currency: ρ for a `zcdp` scope,
ε for a `pure` one. The two types do not mix: `Rho(0.1) + Epsilon(0.1)` and `Rho(1) < Epsilon(2)`
raise TypeError, so a ρ can never be read as an ε by mistake.

    >>> Rho(0.004) + Rho(0.001)
    Rho(0.005)
    >>> Epsilon(1.0) > Epsilon(0.5)
    True
"""

from __future__ import annotations

__all__ = ["Cost", "Epsilon", "Rho", "cost_in"]

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeAlias

if TYPE_CHECKING:
    from dpstream.topology.accounting import EpsilonEquivalent


def _check(kind: str, value: float) -> None:
    """A ConfigError naming the type, the value and what is allowed, unless `value` is a finite number >= 0."""
    from dpstream.topology.errors import ConfigError

    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{kind}({value!r}): not a number; give a finite float >= 0, e.g. {kind}(0.5)")
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{kind}({value!r}): must be finite and >= 0, e.g. {kind}(0.5)")


@dataclass(frozen=True, order=True, slots=True)
class Rho:
    """A zero-concentrated DP cost ρ (zCDP): what a `zcdp` scope's cap, spend and releases are in.

    ρ values add up under composition. `epsilon_at(delta)` is the (ε, δ) the spend amounts to.
    0 is allowed (a period with nothing spent yet); negative, NaN and infinite values are not.
    """

    value: float

    def __post_init__(self) -> None:
        _check("Rho", self.value)

    def __repr__(self) -> str:
        return f"Rho({self.value:.6g})"

    def __float__(self) -> float:
        return float(self.value)

    def __add__(self, other: Rho) -> Rho:
        if not isinstance(other, Rho):
            return NotImplemented
        return Rho(self.value + other.value)

    def epsilon_at(self, delta: float) -> EpsilonEquivalent:
        """The ε this ρ amounts to at `delta` (the CKS20 conversion dpstream's plan and status use)."""
        from dpstream.topology.accounting import epsilon_equivalent

        return epsilon_equivalent(True, self.value, delta)


@dataclass(frozen=True, order=True, slots=True)
class Epsilon:
    """A pure DP cost ε: what a `pure` scope's cap, spend and releases are in.

    ε values add up under composition. 0 is allowed (nothing spent yet); negative, NaN and
    infinite values are not.
    """

    value: float

    def __post_init__(self) -> None:
        _check("Epsilon", self.value)

    def __repr__(self) -> str:
        return f"Epsilon({self.value:.6g})"

    def __float__(self) -> float:
        return float(self.value)

    def __add__(self, other: Epsilon) -> Epsilon:
        if not isinstance(other, Epsilon):
            return NotImplemented
        return Epsilon(self.value + other.value)


Cost: TypeAlias = Rho | Epsilon
"""A cost in a scope's currency: `Rho` (zcdp scopes) or `Epsilon` (pure scopes)."""


def cost_in(accounting: str, value: float) -> Cost:
    """`value` typed by the scope's accounting (`"zcdp"` → Rho, `"pure"` → Epsilon)."""
    from dpstream.topology.model import Accounting

    return Rho(value) if Accounting(accounting) is Accounting.ZCDP else Epsilon(value)
