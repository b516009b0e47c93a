"""The Redis ledger prices a period's releases as in the public order whatever order they are charged in,
as the in-process one does (`tests/unit/test_release_any_order.py`): its snapshot counts charges before,
at and after the priced window end, and `charged_ends` reads the period's charges for the backlog."""

from __future__ import annotations

import random

import pytest

from dpstream.topology.loader import load_topology_text
from tests.unit.test_release_any_order import DAY0, YAML, priced, shuffled, windows_of


@pytest.mark.parametrize("seed", [1, 2])
def test_out_of_order_charges_on_redis_cost_what_they_cost_in_order_in_process(fresh_redis, seed: int) -> None:
    topo = load_topology_text(YAML.format(policy="on_warning: {stretch: 1.5}", warn_at=0.05))
    start = DAY0 + 5 * 3600
    in_order = windows_of(topo, start)
    expected = priced(topo, start, in_order)  # the in-process ledger, in order
    assert priced(topo, start, in_order, fresh_redis.url) == expected
    fresh_redis.flush()
    assert priced(topo, start, shuffled(in_order, random.Random(seed)), fresh_redis.url) == expected
