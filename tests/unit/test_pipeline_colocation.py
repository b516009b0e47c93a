"""A keyed_by_unit source's records must sit in their key's partition (`wrong_partition`), so one unit
is bounded at one point and the merger never adds its bound once per partition."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.topology.model import Partitioner, Topology
from dpstream.workers.pipeline import PartialMerger, PartitionPipeline
from dpstream.workers.pipeline.colocation import partition_of

_YAML = """
version: 1
sources:
  clicks: {{topic: t.clicks, privacy_unit: user_id, timestamp: ts, keyed_by_unit: {keyed}{extra}}}
budgets:
  b: {{epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}}
metrics:
  views:
    source: clicks
    budget: b
    window: {{tumbling: 1m}}
    aggregate: count
    contribution: {{max_per_key: 1}}
    mechanism: gaussian
sinks: {{releases: t.rel, dead_letter: t.dlq}}
"""

W = 1_000_020  # a window start (a multiple of 60)
PARTITIONS = 4


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int | None
    key: bytes | None


def _topology(partitioner: str | None = None, keyed: bool = True) -> Topology:
    extra = f", partitioner: {partitioner}" if partitioner else ""
    return load_topology_text(_YAML.format(keyed=str(keyed).lower(), extra=extra))


def _rec(offset: int, unit: str, ts: float = W + 10) -> Rec:
    return Rec(offset, json.dumps({"user_id": unit, "ts": ts}).encode(), int((ts + 1) * 1000), unit.encode())


def _run(topo: Topology, placed: dict[int, list[Rec]], **kw) -> tuple[int, list[tuple[str, int, int]]]:
    """Every partition's records through its own pipeline (as a worker reads them), the window merged
    over all partitions: (merged true count, dead letters as (reason, partition, offset))."""
    merger = PartialMerger("views", range(PARTITIONS))
    dead, merged = [], []
    for p in range(PARTITIONS):
        pipe = PartitionPipeline(topo, "clicks", p, schedule_start=W, partitions=PARTITIONS, **kw)
        out = pipe.process_batch(placed.get(p, []))
        dead += [(d.reason, d.partition, d.offset) for d in out.dead_letters]
        for partial in pipe.close_through(W + 60):
            merged += merger.add(partial)
    [window] = merged
    return int(window.values.get("", 0)), dead


@pytest.mark.parametrize("partitioner", [None, "murmur2", "crc32"])
def test_one_units_record_on_every_partition_counts_once(partitioner: str | None):
    """count, max_per_key 1, 4 partitions, the same unit's record (key = unit) on each: the merged
    true count is 1, not 4; the 3 records outside the key's partition are `wrong_partition`."""
    topo = _topology(partitioner)
    home = partition_of(b"mallory", PARTITIONS, topo.sources["clicks"].partitioner)
    total, dead = _run(topo, {p: [_rec(0, "mallory")] for p in range(PARTITIONS)}, check_keys=True)
    assert total == 1
    assert sorted(dead) == [("wrong_partition", p, 0) for p in range(PARTITIONS) if p != home]


@pytest.mark.parametrize("partitioner", list(Partitioner))
def test_records_in_their_keys_partition_are_all_counted(partitioner: Partitioner):
    """A producer partitioning by the declared partitioner loses nothing: 40 units, one record each."""
    topo = _topology(partitioner.value)
    placed: dict[int, list[Rec]] = {}
    for i in range(40):
        unit = f"user-{i}"
        mine = placed.setdefault(partition_of(unit.encode(), PARTITIONS, partitioner), [])
        mine.append(_rec(len(mine), unit))
    assert len(placed) == PARTITIONS  # every partition holds some
    total, dead = _run(topo, placed, check_keys=True)
    assert (total, dead) == (40, [])


def test_a_record_placed_by_the_other_partitioner_is_dead_lettered_where_they_differ():
    """Written by crc32 into a murmur2 source: exactly the records whose two partitions differ are refused."""
    topo = _topology("murmur2")
    placed: dict[int, list[Rec]] = {}
    differ = 0
    for i in range(40):
        key = f"user-{i}".encode()
        p = partition_of(key, PARTITIONS, Partitioner.CRC32)
        differ += p != partition_of(key, PARTITIONS, Partitioner.MURMUR2)
        mine = placed.setdefault(p, [])
        mine.append(_rec(len(mine), key.decode()))
    total, dead = _run(topo, placed, check_keys=True)
    assert differ > 0 and len(dead) == differ and {r for r, _p, _o in dead} == {"wrong_partition"}
    assert total == 40 - differ


def test_the_key_is_checked_before_the_partition():
    """A record whose key is not its unit is `key_mismatch`, whatever partition it is in."""
    topo = _topology()
    wrong_key = _rec(0, "alice")._replace(key=b"bob")
    _total, dead = _run(topo, {p: [wrong_key] for p in range(PARTITIONS)}, check_keys=True)
    assert sorted(dead) == [("key_mismatch", p, 0) for p in range(PARTITIONS)]


def test_the_by_unit_topic_of_a_repartitioned_source_is_not_checked_here():
    """A source that is not keyed_by_unit is read through the hop's by-unit topic, which the hop itself
    keys: its records are not judged by a producer's partitioner."""
    topo = _topology(keyed=False)
    placed = {p: [_rec(0, f"u{p}")] for p in range(PARTITIONS)}
    total, dead = _run(topo, placed, check_keys=True, topic="t.clicks.by-unit")
    assert (total, dead) == (PARTITIONS, [])
