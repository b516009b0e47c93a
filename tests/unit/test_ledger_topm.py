"""`ledger.topm`: what a charge raises the sum of a metric's m largest charges by, against brute force, and
its undoing."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from dpstream.workers.ledger import topm


@given(costs=st.lists(st.integers(0, 10**12), max_size=40), m=st.integers(1, 8))
def test_raised_is_the_rise_of_the_m_largest(costs: list[int], m: int) -> None:
    """Charging each cost in turn: every raise is the brute-force rise of the m largest, the stored
    list round-trips, and the raises add up to the m largest of all."""
    top: tuple[int, ...] = ()
    total = 0
    for i, cost in enumerate(costs):
        rise, top = topm.raised(topm.parse(topm.text(top)), m, cost)
        seen = costs[: i + 1]
        assert rise == sum(sorted(seen, reverse=True)[:m]) - sum(sorted(seen[:-1], reverse=True)[:m]) >= 0
        assert top == tuple(sorted(seen, reverse=True)[:m])
        total += rise
    assert total == sum(sorted(costs, reverse=True)[:m])


@given(costs=st.lists(st.integers(1, 10**6), max_size=40), m=st.integers(1, 8))
def test_lowered_undoes_raised(costs: list[int], m: int) -> None:
    """Given a charge's cost and what it raised the sum by, `lowered` gives back the m largest before it
    (what pricing a close in its canonical order takes out for a charge that already ran)."""
    top: tuple[int, ...] = ()
    for cost in costs:
        rise, after = topm.raised(top, m, cost)
        assert topm.lowered(after, cost, rise) == top
        top = after


def test_field_names_the_metric_and_topology_version() -> None:
    """Each topology version's largest charges are kept apart (its pipeline counts units afresh)."""
    assert topm.field("m", "v1") != topm.field("m", "v2") != topm.field("n", "v2")
