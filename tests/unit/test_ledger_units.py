"""Fixed-point spend units and the ledger's key names."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from dpstream.topology.errors import ConfigError, InternalError
from dpstream.workers.ledger.keys import ScopeKeys, version_schedule_start_key
from dpstream.workers.ledger.units import (
    DELTA_UNITS_PER_DELTA,
    UNITS_PER_CURRENCY,
    cap_to_units,
    chargeable_float,
    cost_to_units,
    delta_cap_to_units,
    delta_to_units,
    ledger_delta,
    share_of_units,
)


@given(st.floats(min_value=1e-12, max_value=9000.0, allow_nan=False))
def test_charge_is_never_below_the_cost(cost: float) -> None:
    """A charge in units, rounded up, covers the exact binary value of the cost, by less than one unit."""
    units = cost_to_units(cost)
    assert 0 <= Fraction(units, 10**12) - Fraction(cost) < Fraction(1, 10**12)


@given(st.integers(min_value=1, max_value=9 * 10**15))
def test_chargeable_float_charges_at_most_the_grant(units: int) -> None:
    """A release calibrated with the quoted float is charged no more than the quoted units."""
    assert cost_to_units(chargeable_float(units)) <= units


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
    keys = [
        k.config,
        k.breaker,
        k.audit,
        k.pending,
        k.periods,
        k.period("2026-11-30"),
        k.ends("2026-11-30", "m"),
        k.release("abc"),
    ]
    assert all(key.startswith("dpstream:{web-daily}:") for key in keys)
    assert k.period("2026-11-30") == "dpstream:{web-daily}:period:2026-11-30"
    with pytest.raises(ConfigError, match="braces"):
        ScopeKeys("a{b}")


@given(st.floats(min_value=0.0, max_value=0.009, allow_nan=False))
def test_selection_delta_is_charged_rounded_up(delta: float) -> None:
    """A release's δ in 1e-18 units covers its exact binary value, by less than one unit."""
    units = delta_to_units(delta)
    assert 0 <= Fraction(units, 10**18) - Fraction(delta) < Fraction(1, 10**18)


@given(st.floats(min_value=1e-15, max_value=0.009, allow_nan=False), st.integers(min_value=1, max_value=100_000))
def test_a_periods_planned_selection_deltas_fit_its_cap(total: float, releases: int) -> None:
    """Each of a period's planned releases calibrated and charged at ledger_delta(total / n) is at most its
    share, and n of them fit the period's δ cap (rounded down): the last planned release is never refused."""
    assume(total / releases >= 1e-18)  # below one unit per release the topology is refused
    per = ledger_delta(total / releases)
    assert 0 < per <= total / releases
    assert releases * delta_to_units(per) <= delta_cap_to_units(total, "b")


def test_delta_cap_rounds_down_and_refuses_what_it_cannot_hold() -> None:
    """1e-7 (binary 9.99…e-8) is 99999999999 units; a selection δ past 2**53 units is a ConfigError."""
    assert delta_cap_to_units(1e-7, "b") == 99_999_999_999
    assert delta_cap_to_units(0.0, "b") == 0 and delta_to_units(0.0) == 0 and ledger_delta(0.0) == 0.0
    with pytest.raises(ConfigError, match="smaller delta"):
        delta_cap_to_units(0.05, "budget 'x'")
    with pytest.raises(InternalError):
        delta_to_units(-1e-9)
    with pytest.raises(ConfigError, match="below the ledger's unit"):
        ledger_delta(1e-20)


def test_version_schedule_start_key_has_its_own_hash_tag() -> None:
    """The schedule start lives outside every scope's slot, one key per topology version."""
    assert version_schedule_start_key("abc123") == "dpstream:{deploy}:start:abc123"
    with pytest.raises(ConfigError):
        version_schedule_start_key("a b")


def test_a_grant_is_rounded_down_and_a_bad_amount_is_a_user_error() -> None:
    """A grant loosens the limit: never more than asked; zero, negative or non-finite is one line, exit 2."""
    from fractions import Fraction

    import pytest

    from dpstream.topology.errors import ConfigError
    from dpstream.workers.ledger.units import UNITS_PER_CURRENCY, cost_to_units, grant_to_units

    for amount in (0.0001, 0.1, 1 / 3):
        units = grant_to_units(amount)
        assert Fraction(units) <= Fraction(amount) * UNITS_PER_CURRENCY < units + 1
        assert units <= cost_to_units(amount)
    for bad in (0, -1.0, float("nan"), float("inf"), 1e-15):
        with pytest.raises(ConfigError, match="--amount"):
            grant_to_units(bad)


@given(st.floats(min_value=0.0, max_value=9000.0, allow_nan=False, allow_subnormal=True))
def test_integer_unit_conversions_equal_the_fraction_rule(x: float) -> None:
    """Charges in cost and δ units are ceil(exact value × scale), as Fraction arithmetic computes it."""
    if x > 0:
        assert cost_to_units(x) == math.ceil(Fraction(x) * UNITS_PER_CURRENCY)
    if x < 0.009:  # the δ units' exact range
        assert delta_to_units(x) == math.ceil(Fraction(x) * DELTA_UNITS_PER_DELTA)


@given(st.integers(min_value=0, max_value=9 * 10**15))
def test_chargeable_float_is_the_largest_float_at_most_the_units(units: int) -> None:
    """chargeable_float(u) <= u x 1e-12 exactly, and the next float up is above it."""
    value = chargeable_float(units)
    assert Fraction(value) <= Fraction(units, UNITS_PER_CURRENCY)
    if units > 0:
        assert Fraction(math.nextafter(value, math.inf)) > Fraction(units, UNITS_PER_CURRENCY)
