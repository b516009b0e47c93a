"""Open windows' rows (`window_rows`): how L∞ orders a group's rows, and that compaction keeps a heavy
unit's open window small."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.window_rows import Pile, _group_order, group_rows

pytestmark = pytest.mark.unit

T0 = 1_799_971_200


class _Rec:
    def __init__(self, offset: int, value: bytes) -> None:
        self.offset, self.value, self.timestamp, self.key, self.headers = offset, value, None, None, ()


def test_a_group_keeps_its_rows_of_smallest_order_key_then_value() -> None:
    """Per (window, unit, key), max_per_key rows of smallest (order key, value), whatever their row order."""
    order = (np.array([5.0, 1.0, 1.0, 3.0, 2.0]), np.array([0, 0, 0, 0, 0]), np.array([9, 4, 4, 7, 1]))
    pile = Pile(
        np.zeros(5, np.int64),
        np.array([0, 0, 0, 0, 1]),
        np.zeros(5, np.int64),
        order,
        np.array([10, 30, 20, 40, 50]),
        None,
    )
    g = group_rows(np.zeros(5, np.int64), pile, 2, 2, 1)
    assert g.size.tolist() == [4, 1] and g.kept.tolist() == [2, 1]
    assert g.kept_rows.tolist() == [2, 1, 4]  # unit 0: order 1.0 twice, ties to the smaller value first
    assert g.amount.tolist() == [50, 50]


def test_compaction_keeps_a_heavy_unit_s_open_window_small() -> None:
    """300k events of one unit in one open hour: the window holds what L∞ keeps, not every event, and its
    partial and capped count come out as without compaction."""
    topo = load_topology_text(
        """
version: 1
sources: {s: {topic: t, privacy_unit: user_id, timestamp: ts}}
budgets: {b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}}
metrics:
  spend: {source: s, budget: b, window: {tumbling: 1h}, aggregate: sum, value: eur, bounds: [0, 100],
          group_by: page, keys: [a, b, c], contribution: {max_keys: 2, max_per_key: 3}, mechanism: gaussian}
sinks: {releases: r, dead_letter: d}
"""
    )
    pipe = PartitionPipeline(topo, "s", 0, schedule_start=T0)
    n = 300_000
    events = [
        json.dumps({"user_id": "heavy", "ts": T0 + i * 3000 / n, "page": "abc"[i % 3], "eur": i % 101}).encode()
        for i in range(n)
    ]
    held = 0
    for a in range(0, n, 5000):
        pipe.process_batch([_Rec(i, events[i]) for i in range(a, a + 5000)])
        held = max(held, pipe._accs[0]._piles.rows)
    assert held < 3 * 65_536  # compacted at 65,536 rows, to 6 (2 keys × 3)
    out = pipe.flush()
    values = [p.values for p in out.partials if p.values]
    counts = pipe.refresh_counts()
    assert len(values) == 1 and counts.capped == n - 6
    kept = {k: v for k, v in values[0].items()}
    assert len(kept) == 2 and all(v > 0 for v in kept.values())


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=30), max_size=40),
    st.lists(st.integers(min_value=0, max_value=30), max_size=40),
)
def test_rows_in_group_order_are_merged_with_the_others_into_group_order(head, tail):
    """Rows a compaction left in group order, then unsorted ones: the order `group_rows` uses sorts
    them all by group, each row once."""
    group = np.array(sorted(head) + tail, np.int64)
    order = _group_order(group, len(head))
    assert sorted(order.tolist()) == list(range(len(group)))
    assert group[order].tolist() == sorted(group.tolist())


def test_group_rows_gives_the_same_groups_with_a_grouped_head_or_without() -> None:
    """`grouped` only saves a sort: the groups and what L∞ keeps of them are the same either way."""
    rng = np.random.default_rng(3)
    n = 400
    window, unit, key = rng.integers(0, 3, n), rng.integers(0, 20, n), rng.integers(0, 4, n)
    head = np.lexsort((key, unit, window))[:250]  # a compaction's rows come first, in group order
    rows = np.concatenate([head, np.setdiff1d(np.arange(n), head)])
    order = (rng.integers(0, 5, n).astype(np.float64), np.zeros(n, np.int64), rng.integers(0, 9, n))
    pile = Pile(window * 60, unit, key, order, rng.integers(-5, 5, n), None).take(rows)
    plain = group_rows(window[rows], pile, 2, 20, 4)
    merged = group_rows(window[rows], pile, 2, 20, 4, grouped=250)
    for got, want in zip(merged, plain, strict=True):
        if got is merged.kept_rows:
            continue  # a group's rows are chosen alike, listed in either order
        assert got.tolist() == want.tolist()
    assert sorted(pile.value[merged.kept_rows].tolist()) == sorted(pile.value[plain.kept_rows].tolist())
