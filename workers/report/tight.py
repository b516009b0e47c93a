"""Tight re-accounting of a period's releases as a non-adaptive composition: the privacy loss
distribution (PLD) through Google's `dp-accounting`, and Rényi DP over a grid of orders.

Each noisy part of each charged release becomes one `dp_accounting` event built from the part of
the record's privacy event (`event`: scale and d_in as drawn; the parts the per-record cost check maps):

- discrete Gaussians at σᵢ with L2 sensitivities Δᵢ → one Gaussian of noise multiplier
  1/√(Σ Δᵢ²/σᵢ²): Gaussians compose exactly into one (Dong–Roth–Su 2019, GDP), so no PLD
  discretization error piles up over thousands of tiny releases. It stands for the discrete
  Gaussians: both are exactly Δ²/(2σ²)-zCDP (Canonne–Kamath–Steinke 2020, Thm 14) and their
  (ε, δ) curves agree closely, but the multivariate discrete Gaussian's curve is not proven to lie
  below the continuous one: the PLD figure is an estimate of the exact curve (one more reason it
  is reported, never credited back);
- discrete Laplace at b with integer L1 sensitivity Δ₁ → its exact PLD (`from_discrete_laplace_mechanism`);
- noisy top-k, k selections → k times the PLD of a generic ε₀-DP mechanism
  (`from_privacy_parameters`, the dominating pair of any ε₀-DP mechanism), with ε₀ = Δ∞/scale:
  OpenDP's own map of the same measurement on monotone scores (`linf_distance(monotonic=True)`;
  top-k scores are counts of bounded contributions, which adding a unit never lowers). The ledger
  charges the non-monotone 2Δ∞/scale as bounded range (k·ε₀²/8 in zCDP); the generic ε₀-DP PLD
  ignores the bounded-range structure, so this part stays loose.

The PLDs are composed with dp-accounting's `compose`/`self_compose` (pessimistic discretization at
`PLD_DISCRETIZATION`). The RDP figure composes the same parts with dp-accounting's `RdpAccountant`
(Gaussians by their RDP; Laplace and top-k by their zCDP bounds ε²/2 and k·ε₀²/8 as `ZCDpEvent`)
over `RDP_ORDERS`. Both are taken at the δ the ledger converts at (the scope's δ minus the
partition-selection δ), so they compare with the charged ε.
"""

from __future__ import annotations

__all__ = [
    "RDP_ORDERS",
    "PLD_DISCRETIZATION",
    "TightResult",
    "gaussian_multiplier",
    "pld_of",
    "rdp_events",
    "tight_epsilons",
]

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dpstream.workers.report.costcheck import Component

RDP_ORDERS: tuple[float, ...] = tuple(
    [1.0 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [64.0, 80.0, 96.0, 128.0, 256.0, 512.0, 1024.0]
)
"""Rényi orders the RDP figure is minimised over (dp-accounting's own default grid, made finer)."""

PLD_DISCRETIZATION = 1e-4
"""dp-accounting's PLD value discretization interval (its default: pessimistic rounding)."""


@dataclass(frozen=True)
class TightResult:
    """ε at `delta` by PLD and by RDP, and the number of distinct noisy parts composed."""

    delta: float
    pld_epsilon: float
    rdp_epsilon: float
    rdp_order: float
    distinct_parts: int
    parts: int


def _key(c: Component) -> tuple[str, float, float, int, float]:
    return (c.kind, c.scale, c.sensitivity, c.k, c.epsilon0)


def gaussian_multiplier(components: Iterable[Component]) -> float | None:
    """Noise multiplier of the one Gaussian that all Gaussian parts compose into (None if none)."""
    mu2 = math.fsum((c.sensitivity / c.scale) ** 2 for c in components if c.kind == "gaussian")
    return 1.0 / math.sqrt(mu2) if mu2 > 0 else None


def _groups(components: Iterable[Component], kind: str) -> list[tuple[tuple[str, float, float, int, float], int]]:
    return sorted(Counter(_key(c) for c in components if c.kind == kind).items())


def pld_of(components: list[Component], discretization: float = PLD_DISCRETIZATION) -> object | None:
    """The composed PLD of `components` (a dp-accounting PrivacyLossDistribution; None if empty)."""
    from dp_accounting.pld import common
    from dp_accounting.pld import privacy_loss_distribution as pld_lib

    plds = []
    mult = gaussian_multiplier(components)
    if mult is not None:
        plds.append(pld_lib.from_gaussian_mechanism(mult, value_discretization_interval=discretization))
    for (_kind, scale, sens, _k, _e), n in _groups(components, "laplace"):
        one = pld_lib.from_discrete_laplace_mechanism(
            1.0 / scale, int(sens), value_discretization_interval=discretization
        )
        plds.append(one.self_compose(n) if n > 1 else one)
    for (_kind, _scale, _sens, k, eps0), n in _groups(components, "exponential"):
        params = common.DifferentialPrivacyParameters(eps0, 0.0)
        one = pld_lib.from_privacy_parameters(params, value_discretization_interval=discretization)
        plds.append(one.self_compose(n * k) if n * k > 1 else one)
    if not plds:
        return None
    total = plds[0]
    for other in plds[1:]:
        total = total.compose(other)
    return total


def rdp_events(components: list[Component]) -> list[object]:
    """dp-accounting events of the parts for the RDP accountant, identical parts self-composed."""
    from dp_accounting import dp_event

    out: list[object] = []
    mult = gaussian_multiplier(components)
    if mult is not None:
        out.append(dp_event.GaussianDpEvent(mult))
    for (_kind, scale, sens, _k, _e), n in _groups(components, "laplace"):
        out.append(dp_event.SelfComposedDpEvent(dp_event.ZCDpEvent((sens / scale) ** 2 / 2.0), n))
    for (_kind, scale, sens, k, _e), n in _groups(components, "exponential"):
        out.append(dp_event.SelfComposedDpEvent(dp_event.ZCDpEvent(k * (2.0 * sens / scale) ** 2 / 8.0), n))
    return out


def tight_epsilons(components: list[Component], delta: float) -> TightResult:
    """ε at `delta` of the non-adaptive composition of `components`, by PLD and by RDP."""
    from dp_accounting import dp_event
    from dp_accounting.rdp.rdp_privacy_accountant import RdpAccountant

    total: Any = pld_of(components)
    rdp = RdpAccountant(orders=list(RDP_ORDERS))
    rdp.compose(dp_event.ComposedDpEvent(rdp_events(components)))
    rdp_eps, order = rdp.get_epsilon_and_optimal_order(delta)
    return TightResult(
        delta=delta,
        pld_epsilon=float(total.get_epsilon_for_delta(delta)) if total is not None else 0.0,
        rdp_epsilon=float(rdp_eps),
        rdp_order=float(order),
        distinct_parts=len({_key(c) for c in components}),
        parts=len(components),
    )
