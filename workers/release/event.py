"""`PrivacyEvent`: what one release's charge is, in the terms privacy accounting composes.

Modelled on dp_accounting's `DpEvent` (a composition of noise events, each a mechanism with its
noise scale and sensitivity), as pure values: the runtime never imports dp_accounting. The
mechanism that draws the noise builds it once per cost (`workers.noise`), the record carries it
as `event`, and the report card's cost check and tight accounting read it back (`of_fields`).
"""

from __future__ import annotations

__all__ = ["EventError", "Noise", "NoiseEvent", "PrivacyEvent"]

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from functools import cached_property
from typing import Any

from dpstream.topology.model import Accounting
from dpstream.workers.frozen import FrozenFields


class EventError(ValueError):
    """A record's `event` is missing a field or holds a value of the wrong kind."""


class Noise(StrEnum):
    """The mechanism of one noisy part, and what its `scale` and `d_in` mean."""

    GAUSSIAN = "gaussian"
    """OpenDP's discrete Gaussian on integers: scale σ, d_in the L2 distance."""
    LAPLACE = "laplace"
    """OpenDP's discrete Laplace on integers: scale b, d_in the L1 distance."""
    TOP_K = "top_k"
    """OpenDP's noisy top-k, k selections (exponential mechanism: Gumbel in zCDP, permute-and-flip
    in pure ε): d_in the L∞ distance of the scores."""
    MATRIX = "gaussian_matrix"
    """A running total's period: OpenDP's float Gaussian on the vector C x (the square-root
    factorization of the prefix sums), scale σ, d_in the L2 distance L·‖c‖₂, k the vector's size
    (steps × keys)."""
    QUANTILE = "quantile"
    """OpenDP's private quantile at level `alpha` over a public candidate grid (one exponential
    mechanism, scale in ranks): d_in the symmetric distance of the values."""


@dataclass(frozen=True)
class NoiseEvent:
    """One noisy part as drawn: mechanism, OpenDP `scale` in the units it drew (integer units,
    ranks for a quantile), sensitivity `d_in`, and the part's cost in the scope's currency."""

    mechanism: Noise
    scale: float
    d_in: float
    cost: float
    k: int = 1
    """Selections (top-k); 1 otherwise."""
    alpha: float | None = None
    """The quantile level (quantile only)."""


@dataclass(frozen=True)
class PrivacyEvent:
    """One release's charge: its noisy parts (composed), the cost charged for all of them, and the
    partition-selection δ (0 when the keys are public)."""

    accounting: Accounting
    cost: float
    parts: tuple[NoiseEvent, ...]
    delta: float = 0.0
    max_windows: int | None = None
    """The metric's `contribution.max_windows`: a unit counts in at most this many of its windows per
    period, so a period composes only the metric's largest charges of a topology version (`ledger.topm`)."""
    lump: float | None = None
    """A running total's lump: the period's one charge, taken with its first step (every step's record
    carries it; the period composes it once, `max_windows` 1)."""

    @cached_property
    def fields(self) -> FrozenFields:
        """The record's `event`: built once, the same read-only object in every release at this cost."""
        parts = tuple(
            FrozenFields(mechanism=p.mechanism.value, scale=p.scale, d_in=p.d_in, cost=p.cost, k=p.k, alpha=p.alpha)
            for p in self.parts
        )
        return FrozenFields(
            accounting=self.accounting.value,
            cost=self.cost,
            parts=parts,
            delta=self.delta,
            max_windows=self.max_windows,
            lump=self.lump,
        )

    @classmethod
    def of_fields(cls, doc: Any) -> PrivacyEvent:
        """The event of a record's `event` field (EventError when it is not one)."""
        if not isinstance(doc, Mapping):
            raise EventError("the record has no event object")
        try:
            parts = doc["parts"]
            if not isinstance(parts, list | tuple) or not parts:
                raise EventError("event.parts is not a non-empty list")
            return cls(
                accounting=Accounting(doc["accounting"]),
                cost=_number(doc["cost"], "event.cost"),
                parts=tuple(_part(p) for p in parts),
                delta=_number(doc["delta"], "event.delta"),
                max_windows=None if doc.get("max_windows") is None else int(doc["max_windows"]),
                lump=None if doc.get("lump") is None else _number(doc["lump"], "event.lump"),
            )
        except (KeyError, TypeError, ValueError) as exc:
            if isinstance(exc, EventError):
                raise
            raise EventError(f"event field {exc}") from exc


def _number(value: Any, name: str) -> float:
    if type(value) not in (int, float) or not math.isfinite(value):
        raise EventError(f"{name} is not a finite number")
    return float(value)


def _part(doc: Any) -> NoiseEvent:
    if not isinstance(doc, Mapping):
        raise EventError("an event part is not an object")
    k = doc.get("k", 1)
    if type(k) is not int or k < 1:
        raise EventError("event part k is not a positive integer")
    alpha = doc.get("alpha")
    return NoiseEvent(
        mechanism=Noise(doc["mechanism"]),
        scale=_number(doc["scale"], "event part scale"),
        d_in=_number(doc["d_in"], "event part d_in"),
        cost=_number(doc["cost"], "event part cost"),
        k=k,
        alpha=None if alpha is None else _number(alpha, "event part alpha"),
    )
