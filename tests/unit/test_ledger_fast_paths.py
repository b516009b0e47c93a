"""The in-process ledger's fast paths answer and write exactly what its full port of the scripts does."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import math
from fractions import Fraction
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Accounting
from dpstream.topology.periods import period_id, period_start, periods_touched
from dpstream.workers.ledger import ChargeResult, Ledger, Outcome, Quote, ReleaseRequest, State, open_ledger
from dpstream.workers.ledger.memory import MemoryLedger
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.ledger.units import (
    DELTA_UNITS_PER_DELTA,
    UNITS_PER_CURRENCY,
    cost_to_units,
    delta_to_units,
    grantable_float,
)

HOUR = 3_600
P0 = 1_796_083_200  # 2026-12-01T00:00Z
RECORD = b'{"release_id":"%s","budget":{"scope":"s","ratio_after":null}}'
METRICS = (("a", 1.0, 600, 600, False), ("b", 2.0, 1_200, 600, True))


async def _pair() -> tuple[MemoryLedger, MemoryLedger, list[int]]:
    """Two ledgers on one clock: `fast` as shipped, `slow` with only the scripts' port and the
    snapshot built from the raw hashes (the path the Redis backend takes); and a counter of the
    charges the fast path answered."""
    topo = one_scope_topology(period_s=HOUR, epsilon=1.0, accounting=Accounting.PURE, metrics=METRICS)
    clock = ManualClock(P0 + 100)
    fast = await open_ledger("memory", topo, clock=clock)
    slow = await open_ledger("memory", topo, clock=clock)
    assert isinstance(fast, MemoryLedger) and isinstance(slow, MemoryLedger)
    used = [0]
    inner = fast._grant_in_open_period

    def counted(*args: Any) -> Any:
        out = inner(*args)
        used[0] += out is not None
        return out

    fast._grant_in_open_period = counted  # type: ignore[method-assign]  # counts the fast path's answers
    slow._grant_in_open_period = lambda *args: None  # type: ignore[method-assign]  # the full port only
    slow._quote_snapshot = functools.partial(Ledger._quote_snapshot, slow)  # type: ignore[method-assign]  # from _snapshot
    return fast, slow, used


def _request(metric: str, start: int, size: int, cost: float, version: int | None, delta: float) -> ReleaseRequest:
    rid = f"{metric}-{start}"
    later = tuple((period_id(HOUR, p), p) for p in periods_touched(HOUR, start, start + size)[1:])
    return ReleaseRequest(
        rid,
        "s",
        period_id(HOUR, period_start(HOUR, start)),
        metric,
        start,
        start + size,
        cost,
        RECORD % rid.encode(),
        metric == "b",
        "worker",
        delta,
        later,
        version,
    )


async def _apply(ledger: MemoryLedger, op: tuple[Any, ...]) -> Any:
    """One operation; its answer (what the contract returns)."""
    kind = op[0]
    if kind == "release":
        _, which, slot, cost_mode, version_mode, delta = op
        name, _, size, every, _ = METRICS[which]
        start = P0 + slot * every
        quote = await ledger.quote(name, start, start + size)
        cost = {"quoted": quote.cost if quote.ok else 0.05, "big": 0.3, "huge": 0.9}[cost_mode]
        version = {"quoted": quote.version, "stale": (quote.version or 0) + 1, "none": None}[version_mode]
        charged = await ledger.charge(_request(name, start, size, cost, version, delta))
        return quote, charged
    if kind == "commit":
        name, _, _, every, _ = METRICS[op[1]]
        return await ledger.commit("s", f"{name}-{P0 + op[2] * every}")
    if kind == "grant":
        try:
            return await ledger.grant_reserve("s", op[1], "test", "op")
        except ConfigError as exc:  # more than is left to grant: refused, nothing written
            return ("refused", str(exc))
    if kind == "breaker":
        if op[1]:
            return await ledger.open_breaker("s", "test", "op")
        return await ledger.close_breaker("s", "test", "op")
    assert kind == "advance"
    assert callable(ledger._clock) and isinstance(ledger._clock, ManualClock)
    ledger._clock.advance(op[1])
    return None


_OPS = st.one_of(
    st.tuples(
        st.just("release"),
        st.integers(0, 1),
        st.integers(0, 17),
        st.sampled_from(["quoted", "quoted", "quoted", "big", "huge"]),
        st.sampled_from(["quoted", "quoted", "stale", "none"]),
        st.sampled_from([0.0, 0.0, 0.0, 1e-12]),
    ),
    st.tuples(st.just("commit"), st.integers(0, 1), st.integers(0, 17)),
    st.tuples(st.just("grant"), st.sampled_from([0.01, 0.1])),
    st.tuples(st.just("breaker"), st.booleans()),
    st.tuples(st.just("advance"), st.integers(0, 1_800)),
)


async def _run_both(ops: list[tuple[Any, ...]]) -> tuple[MemoryLedger, MemoryLedger, int]:
    fast, slow, used = await _pair()
    clock = fast._clock
    assert isinstance(clock, ManualClock)
    for op in ops:
        a = await _apply(fast, op)
        if op[0] == "advance":
            continue  # one clock: advanced once
        b = await _apply(slow, op)
        assert a == b, op
    assert fast._store == slow._store
    assert fast._last_id == slow._last_id
    return fast, slow, used[0]


@settings(max_examples=150, deadline=None)
@given(ops=st.lists(_OPS, max_size=40))
def test_fast_paths_answer_and_write_as_the_scripts_port(ops: list[tuple[Any, ...]]) -> None:
    """Random releases (duplicates, stale and unchecked versions, refusals, straddling windows, selection δ),
    grants, breakers and clock steps: every answer, every stored field and every audit entry are equal."""
    asyncio.run(_run_both(ops))


def test_a_plain_period_of_releases_takes_the_fast_path() -> None:
    """On plan (quoted version, one period) every charge after a period's first goes the fast way, with
    the same answers and state as the full port."""
    ops: list[tuple[Any, ...]] = [("release", 0, slot, "quoted", "quoted", 0.0) for slot in range(6)]
    ops += [("commit", 0, slot) for slot in range(6)]
    fast, _, used = asyncio.run(_run_both(ops))
    assert used == 5  # the first charge opens the period block (the port does that, with its audit entry)
    assert asyncio.run(fast.charge(_request("a", P0, 600, 0.01, None, 0.0))).outcome is Outcome.DUPLICATE


@given(st.floats(min_value=0.0, max_value=9000.0, allow_nan=False, allow_subnormal=True))
def test_integer_unit_conversions_equal_the_fraction_rule(x: float) -> None:
    """Charges in cost and δ units are ceil(exact value × scale), as Fraction arithmetic computes it."""
    if x > 0:
        assert cost_to_units(x) == math.ceil(Fraction(x) * UNITS_PER_CURRENCY)
    if x < 0.009:  # the δ units' exact range
        assert delta_to_units(x) == math.ceil(Fraction(x) * DELTA_UNITS_PER_DELTA)


@given(st.integers(min_value=0, max_value=9 * 10**15))
def test_grantable_float_is_the_largest_float_at_most_the_units(units: int) -> None:
    """grantable_float(u) <= u x 1e-12 exactly, and the next float up is above it."""
    value = grantable_float(units)
    assert Fraction(value) <= Fraction(units, UNITS_PER_CURRENCY)
    if units > 0:
        assert Fraction(math.nextafter(value, math.inf)) > Fraction(units, UNITS_PER_CURRENCY)


def test_quote_and_charge_result_built_fast_equal_their_constructors() -> None:
    """`Quote.of` and `ChargeResult.of` set every field (none forgotten when one is added) and equal,
    hash and print as the dataclass constructor's value, still frozen."""
    q_args = ("m", "s", "2026-12-01", 0.25, 250, State.WARNING, False, True, None, True, 7)
    quote = Quote.of(*q_args)
    assert quote == Quote(*q_args) and hash(quote) == hash(Quote(*q_args)) and repr(quote) == repr(Quote(*q_args))
    assert set(vars(quote)) == {f.name for f in dataclasses.fields(Quote)}
    c_args = (Outcome.GRANTED, b"{}", "", 0.5, State.NORMAL, 250)
    result = ChargeResult.of(*c_args)
    assert result == ChargeResult(*c_args) and repr(result) == repr(ChargeResult(*c_args))
    assert set(vars(result)) == {f.name for f in dataclasses.fields(ChargeResult)}
    with pytest.raises(dataclasses.FrozenInstanceError):
        quote.cost = 1.0  # type: ignore[misc]  # the point: it is frozen
