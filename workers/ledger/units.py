"""Fixed-point spend: budgets in integer units of 1e-12 of the scope's currency (ρ or ε), and
the partition-selection δ in integer units of 1e-18.

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
    "chargeable_float",
    "DELTA_UNITS_PER_DELTA",
    "delta_to_units",
    "delta_cap_to_units",
    "delta_units_to_float",
    "ledger_delta",
]

import math
from decimal import Decimal
from fractions import Fraction

from dpstream.topology.errors import ConfigError, InternalError

UNITS_PER_CURRENCY = 10**12
"""One unit is 1e-12 of ρ (zCDP scopes) or ε (pure scopes)."""

MAX_UNITS = 2**53 - 1
"""Largest amount the Lua scripts can hold exactly (a double's integer range)."""

DELTA_UNITS_PER_DELTA = 10**18
"""One δ unit is 1e-18 of δ: a selection δ up to ~0.009 per period is held exactly."""


def _ceil_scaled(amount: float, scale: int) -> int:
    """ceil(exact value of `amount` × `scale`), in integers: `math.ceil(Fraction(amount) * scale)`
    without building Fractions (this runs on every charge)."""
    n, d = amount.as_integer_ratio()
    return -((-n * scale) // d)


def cost_to_units(cost: float) -> int:
    """A release's charge in units: the exact value of `cost` rounded up (never under-charged)."""
    if not isinstance(cost, (int, float)) or not math.isfinite(cost) or cost <= 0:
        raise InternalError(f"release cost must be a finite positive number, got {cost!r}")
    units = _ceil_scaled(cost, UNITS_PER_CURRENCY)
    if units > MAX_UNITS:
        raise InternalError(f"release cost {cost!r} exceeds the ledger's exact range ({MAX_UNITS} units)")
    return units


def grant_to_units(amount: float) -> int:
    """An operator's grant of reserve in units, rounded down (a grant loosens the limit: never
    more than asked); a one-line user error when it is not a positive number or rounds to nothing."""
    if not isinstance(amount, (int, float)) or not math.isfinite(amount) or amount <= 0:
        raise ConfigError(f"--amount {amount!r}: give a positive amount of the scope's currency (ρ or ε)")
    units = math.floor(Fraction(amount) * UNITS_PER_CURRENCY)
    if units < 1 or units > MAX_UNITS:
        raise ConfigError(
            f"--amount {amount!r}: outside the ledger's exact range (1e-12 .. {MAX_UNITS / UNITS_PER_CURRENCY:.0f})"
        )
    return units


def cap_to_units(cap: float, where: str) -> int:
    """A scope cap in units, rounded down (never over-stated); `where` names it in errors."""
    if not math.isfinite(cap) or cap <= 0:
        raise ConfigError(f"{where}: cap {cap!r} is not a positive number: check epsilon/delta")
    units = math.floor(Fraction(cap) * UNITS_PER_CURRENCY)
    if units > MAX_UNITS or units < 1:
        raise ConfigError(
            f"{where}: cap {cap!r} is outside the ledger's exact range "
            f"(1e-12 .. {MAX_UNITS / UNITS_PER_CURRENCY:.0f}): "
            "choose a smaller epsilon"
        )
    return units


def share_of_units(units: int, share: float) -> int:
    """`share` (a decimal fraction from the config, e.g. 0.2) of `units`, rounded up, read as written."""
    return math.ceil(Decimal(repr(float(share))) * units)


def units_to_float(units: int) -> float:
    """Units as the nearest float in the scope's currency (for display)."""
    return units / UNITS_PER_CURRENCY


def chargeable_float(units: int) -> float:
    """The largest float whose exact value is at most `units` × 1e-12.

    A release calibrated with this cost is charged (rounded up) no more than `units`.
    """
    return _float_at_most(units, UNITS_PER_CURRENCY) if units > 0 else 0.0


def _float_at_most(units: int, scale: int) -> float:
    """The largest float whose exact value is at most `units` / `scale`, compared in integers."""
    value = units / scale
    n, d = value.as_integer_ratio()
    while n * scale > units * d:  # value = n/d is above units/scale
        value = math.nextafter(value, 0.0)
        n, d = value.as_integer_ratio()
    return value


def delta_to_units(delta: float) -> int:
    """A release's selection δ in δ units: its exact value rounded up (0 for no selection)."""
    if not isinstance(delta, (int, float)) or not math.isfinite(delta) or delta < 0:
        raise InternalError(f"release selection delta must be a finite number >= 0, got {delta!r}")
    units = _ceil_scaled(delta, DELTA_UNITS_PER_DELTA) if delta else 0
    if units > MAX_UNITS:
        raise InternalError(f"release selection delta {delta!r} exceeds the ledger's exact range")
    return units


def delta_cap_to_units(delta: float, where: str) -> int:
    """A period's selection-δ cap in δ units, rounded down (0 when nothing selects)."""
    if not math.isfinite(delta) or delta < 0:
        raise ConfigError(f"{where}: selection delta {delta!r} is not a number >= 0: check delta")
    units = math.floor(Fraction(delta) * DELTA_UNITS_PER_DELTA)
    if units > MAX_UNITS:
        raise ConfigError(
            f"{where}: selection delta {delta!r} per period is above what the ledger holds exactly "
            f"({MAX_UNITS / DELTA_UNITS_PER_DELTA:.4g}): choose a smaller delta"
        )
    return units


def delta_units_to_float(units: int) -> float:
    """δ units as the nearest float δ (for display)."""
    return units / DELTA_UNITS_PER_DELTA


def ledger_delta(delta: float) -> float:
    """The largest float δ' <= `delta` whose charge (rounded up) is at most floor(`delta` × 1e18) units.

    The Releaser calibrates partition selection at δ' and charges δ', so a period's planned
    releases, each charged rounded up, never add up past the period's cap (rounded down).
    """
    if delta <= 0:
        return 0.0
    # `delta` is a float share (total / n, rounded to nearest, so up to 2^-53 above the exact share):
    # 2^-50 below it, n charges of floor(share) units never add up past the cap's floor(total) units.
    units = math.floor(Fraction(delta) * DELTA_UNITS_PER_DELTA * (1 - Fraction(1, 2**50)))
    if units <= 0:
        raise ConfigError(
            f"selection delta per release {delta!r} is below the ledger's unit (1e-18): choose a larger delta"
        )
    return _float_at_most(units, DELTA_UNITS_PER_DELTA)
