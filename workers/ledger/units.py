"""Fixed-point spend: budgets in integer units of 1e-12 of the scope's currency (ρ or ε).

Charges are rounded up and caps down, from the exact binary value of the float, so integer
`INCRBY` arithmetic can never hide an overspend. Every amount stays below 2**53 so the Lua
scripts (which hold numbers as doubles) compare them exactly.
"""

from __future__ import annotations

__all__ = [
    "UNITS_PER_CURRENCY",
    "MAX_UNITS",
    "cost_to_units",
    "cap_to_units",
    "share_of_units",
    "units_to_float",
    "grantable_float",
]

import math
from decimal import Decimal
from fractions import Fraction

from topology.errors import ConfigError, InternalError

UNITS_PER_CURRENCY = 10**12
"""One unit is 1e-12 of ρ (zCDP scopes) or ε (pure scopes)."""

MAX_UNITS = 2**53 - 1
"""Largest amount the Lua scripts can hold exactly (a double's integer range)."""


def cost_to_units(cost: float) -> int:
    """A release's charge in units: the exact value of `cost` rounded up (never under-charged)."""
    if not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost <= 0:
        raise InternalError(f"release cost must be a finite positive number, got {cost!r}")
    units = math.ceil(Fraction(cost) * UNITS_PER_CURRENCY)
    if units > MAX_UNITS:
        raise InternalError(f"release cost {cost!r} exceeds the ledger's exact range ({MAX_UNITS} units)")
    return units


def cap_to_units(cap: float, where: str) -> int:
    """A scope cap in units, rounded down (never over-stated); `where` names it in errors."""
    if not math.isfinite(cap) or cap <= 0:
        raise ConfigError(f"{where}: cap {cap!r} is not a positive number: check epsilon/delta")
    units = math.floor(Fraction(cap) * UNITS_PER_CURRENCY)
    if units > MAX_UNITS or units < 1:
        raise ConfigError(
            f"{where}: cap {cap!r} is outside the ledger's exact range (1e-12 .. {MAX_UNITS / UNITS_PER_CURRENCY:.0f}): "
            "choose a smaller epsilon"
        )
    return units


def share_of_units(units: int, share: float) -> int:
    """`share` (a decimal fraction from the config, e.g. 0.2) of `units`, rounded up, read as written."""
    return math.ceil(Decimal(repr(float(share))) * units)


def units_to_float(units: int) -> float:
    """Units as the nearest float in the scope's currency (for display)."""
    return units / UNITS_PER_CURRENCY


def grantable_float(units: int) -> float:
    """The largest float whose exact value is at most `units` × 1e-12.

    A release calibrated with this cost is charged (rounded up) no more than `units`.
    """
    if units <= 0:
        return 0.0
    exact = Fraction(units, UNITS_PER_CURRENCY)
    value = units / UNITS_PER_CURRENCY
    while Fraction(value) > exact:
        value = math.nextafter(value, 0.0)
    return value
