"""Fixed-point spend units and the ledger's key names."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from topology.errors import ConfigError, InternalError
from workers.ledger.keys import ScopeKeys
from workers.ledger.units import cap_to_units, cost_to_units, grantable_float, share_of_units


@given(st.floats(min_value=1e-12, max_value=9000.0, allow_nan=False))
def test_charge_is_never_below_the_cost(cost: float) -> None:
    """A charge in units, rounded up, covers the exact binary value of the cost, by less than one unit."""
    units = cost_to_units(cost)
    assert 0 <= Fraction(units, 10**12) - Fraction(cost) < Fraction(1, 10**12)


@given(st.integers(min_value=1, max_value=9 * 10**15))
def test_grantable_float_charges_at_most_the_grant(units: int) -> None:
    """A release calibrated with the quoted float is charged no more than the quoted units."""
    assert cost_to_units(grantable_float(units)) <= units


def test_cap_rounds_down_and_shares_read_as_written() -> None:
    """Caps round down; reserve 0.2 of 2.0 is exactly 0.4 (decimal as written), not the binary 0.2's ceiling."""
    assert cap_to_units(2.0, "b") == 2 * 10**12
    assert share_of_units(2 * 10**12, 0.2) == 4 * 10**11
    with pytest.raises(ConfigError, match="exact range"):
        cap_to_units(1e5, "budget 'x'")
    with pytest.raises(InternalError):
        cost_to_units(0.0)


def test_keys_share_one_hash_tag() -> None:
    """Every key of a scope carries the `{scope}` hash tag; braces in names are refused."""
    k = ScopeKeys("web-daily")
    keys = [k.config, k.breaker, k.audit, k.pending, k.periods, k.period("2026-11-30"),
            k.ends("2026-11-30", "m"), k.release("abc")]
    assert all(key.startswith("dpstream:{web-daily}:") for key in keys)
    assert k.period("2026-11-30") == "dpstream:{web-daily}:period:2026-11-30"
    with pytest.raises(ConfigError, match="braces"):
        ScopeKeys("a{b}")
