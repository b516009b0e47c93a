"""PartialMerger: dedupe by (window, partition), completeness (no deadline), partition counts, state round trip."""

from __future__ import annotations

import json

import pytest

from dpstream.topology.errors import InternalError
from dpstream.workers.pipeline import PartialMerger, WindowPartial
from dpstream.workers.pipeline.merger import PartitionCountChanged


def _p(start: int, partition: int, values: dict, metric: str = "m", of: int = 2) -> WindowPartial:
    return WindowPartial(metric, start, start + 60, "src", "topic", partition, values, partitions=of)


def test_window_released_once_all_partitions_reported():
    """A window is merged (summed) only when every expected partition sent its partial."""
    m = PartialMerger("m", [0, 1, 2])
    assert m.add(_p(0, 0, {"": 3}, of=3)) == []
    assert m.add(_p(0, 2, {"": 4}, of=3)) == []
    [w] = m.add(_p(0, 1, {"": 5}, of=3))
    assert (w.start, w.end, w.values) == (0, 60, {"": 12})


def test_duplicate_partials_are_ignored():
    """A second partial of the same (window, partition) — e.g. after replay — never adds again."""
    m = PartialMerger("m", [0, 1])
    m.add(_p(0, 0, {"a": 1}))
    m.add(_p(0, 0, {"a": 1}))
    [w] = m.add(_p(0, 1, {"a": 2, "b": 1}))
    assert w.values == {"a": 3, "b": 1}
    assert m.duplicates == 1
    assert m.add(_p(0, 1, {"a": 7})) == []  # already released
    assert m.late == 1


def test_later_partial_implies_earlier_window_empty_there():
    """A partition that reports a later window had nothing in the windows it skipped."""
    m = PartialMerger("m", [0, 1])
    assert m.add(_p(0, 0, {"": 2})) == []
    [w] = m.add(_p(60, 1, {"": 1}))
    assert (w.start, w.values) == (0, {"": 2})


def test_mean_pairs_merge_pairwise():
    """[sum, count] partials of a mean add component-wise."""
    m = PartialMerger("m", [0, 1])
    m.add(_p(0, 0, {"": [10.5, 2]}))
    [w] = m.add(_p(0, 1, {"": [1.5, 1]}))
    assert w.values == {"": [12.0, 3]}


def test_a_missing_partial_holds_the_window_back_however_long():
    """No deadline: until every partition reported, nothing is released (a missing partition's units
    are never dropped); the window shows as pending (release lag)."""
    m = PartialMerger("m", [0, 1, 2])
    for start in range(0, 6000, 60):
        assert m.add(_p(start, 0, {"": 1}, of=3)) == []
        assert m.add(_p(start, 1, {"": 1}, of=3)) == []
    assert m.pending_windows()[:2] == [0, 60] and len(m.pending_windows()) == 100
    [w] = m.add(_p(0, 2, {"": 5}, of=3))
    assert (w.start, w.values) == (0, {"": 7})


def test_a_changed_partition_count_is_refused_with_one_line():
    """A partial from a source that now has another number of partitions is refused, not merged."""
    m = PartialMerger("m", [0, 1])
    with pytest.raises(PartitionCountChanged, match="now reports 3 partitions, the release side expects 2") as err:
        m.add(_p(0, 2, {"": 1}, of=3))
    assert "\n" not in str(err.value)
    with pytest.raises(PartitionCountChanged):
        m.add(_p(0, 0, {"": 1}, of=3))
    assert m.pending_windows() == []


def test_state_round_trips_through_json():
    """to_state / from_state (via JSON) keeps pending sums, reports and released windows."""
    m = PartialMerger("m", [0, 1])
    m.add(_p(0, 0, {"": 1}))
    m.add(_p(0, 1, {"": 1}))
    m.add(_p(60, 0, {"k": [1.0, 1]}))
    restored = PartialMerger.from_state("m", [0, 1], json.loads(json.dumps(m.to_state())))
    assert restored.add(_p(0, 1, {"": 9})) == []
    [w] = restored.add(_p(60, 1, {"k": [2.0, 1]}))
    assert w.values == {"k": [3.0, 2]}


def test_partials_round_trip_as_bytes():
    """WindowPartial bytes decode to an equal partial; the Kafka key is the metric."""
    p = _p(120, 3, {"a": 1, "b": [0.1, 2]})
    assert WindowPartial.from_bytes(p.to_bytes()) == p
    assert p.key == b"m"


def test_foreign_partials_are_bugs():
    """A partial of another metric raises InternalError."""
    m = PartialMerger("m", [0])
    with pytest.raises(InternalError, match="merger of 'm'"):
        m.add(_p(0, 0, {}, metric="other", of=1))
