"""Open windows' rows (`window_rows`): how L∞ orders a group's rows, and that compaction keeps a heavy
unit's open window small."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.window_rows import Pile, group_rows

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
