"""`PartitionPipeline.process_batch` (the batch path) against the per-event pipeline it replaced, kept in
tests as the oracle (`_pipeline_oracle`): the same random batches, close marks and flush through both
give the same partial bytes, dead letters (reasons, order, bytes), count deltas, counters, commit
points and per-window state, on every example topology and on one built to hit every rule's edge.

The batches mix heavy units (past max_keys and max_per_key), undeclared and integer keys, missing
fields, malformed JSON, bad units, times and values, ISO and millisecond times, late, early and
far-future events, out-of-order times, hop copies, wrong keys and partitions, and random batch cuts."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, NamedTuple
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpstream.topology.loader import load_topology, load_topology_text
from dpstream.topology.model import Topology
from dpstream.workers.pipeline import PartitionPipeline, accumulator, partition
from dpstream.workers.pipeline.codes import Codes
from dpstream.workers.pipeline.copies import SOURCE_POSITION_HEADER
from dpstream.workers.pipeline.unit_ids import UNIT_HMAC_KEY_ENV
from tests.unit._pipeline_oracle import oracle_pipeline, oracle_process_batch

pytestmark = pytest.mark.unit

_ROOT = Path(__file__).resolve().parents[2]

_EDGES = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 3s, keyed_by_unit: true,
           max_future: 1m}
  visits: {topic: t.visits, privacy_unit: event}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1h}
metrics:
  views:
    {source: clicks, budget: b, window: {tumbling: 10s}, aggregate: count, group_by: page, keys: [a, b, c, "7"],
     contribution: {max_keys: 2, max_per_key: 2}, mechanism: gaussian}
  refs:
    {source: clicks, budget: b, window: {tumbling: 30s}, aggregate: top_k, k: 2, group_by: ref,
     contribution: {max_keys: 2, max_per_key: 1}, mechanism: exponential}
  active:
    {source: clicks, budget: b, window: {hopping: 20s, every: 10s}, aggregate: count_units, group_by: page,
     keys: [a, b, c], contribution: {max_keys: 1}, mechanism: gaussian}
  users:
    {source: clicks, budget: b, window: {tumbling: 10s}, aggregate: count_units,
     contribution: {max_windows: 3}, mechanism: gaussian}
  spend:
    {source: clicks, budget: b, window: {tumbling: 10s}, aggregate: sum, value: eur, bounds: [-10, 200],
     group_by: ref, contribution: {max_keys: 2, max_per_key: 3}, mechanism: gaussian}
  tips:
    {source: clicks, budget: b, window: {hopping: 30s, every: 10s}, aggregate: sum, value: eur, bounds: [0, 10],
     contribution: {max_per_key: 1}, mechanism: gaussian}
  avg:
    {source: clicks, budget: b, window: {tumbling: 10s}, aggregate: mean, value: eur, bounds: [0, 100],
     contribution: {max_per_key: 2}, mechanism: gaussian}
  avgd:
    {source: clicks, budget: b, window: {tumbling: 10s}, aggregate: mean, value: eur, bounds: [0, 100],
     denominator: 50, group_by: page, keys: [a, b], contribution: {max_keys: 1, max_per_key: 2}, mechanism: gaussian}
  lat:
    {source: clicks, budget: b, window: {tumbling: 10s}, aggregate: quantile, value: ms, bounds: [0, 100], bins: 10,
     quantiles: [0.5], contribution: {max_per_key: 2}, mechanism: exponential}
  so_far:
    {source: clicks, budget: b, window: {tumbling: 10s}, aggregate: count, group_by: page, keys: [a, b, c],
     release: running_total, contribution: {max_keys: 2, max_per_key: 3, max_per_period: 7}, mechanism: gaussian}
  spent:
    {source: clicks, budget: b, window: {tumbling: 10s}, aggregate: sum, value: eur, bounds: [-10, 200],
     release: running_total, contribution: {max_per_key: 2, max_per_period: 300}, mechanism: gaussian}
  hit_total:
    {source: visits, budget: b, window: {tumbling: 10s}, aggregate: sum, value: eur, bounds: [0, 50],
     release: running_total, contribution: {max_per_period: 20}, mechanism: gaussian}
  hits:
    {source: visits, budget: b, window: {tumbling: 10s}, aggregate: count, group_by: page, keys: [a, b],
     mechanism: gaussian}
  hit_eur:
    {source: visits, budget: b, window: {hopping: 20s, every: 10s}, aggregate: sum, value: eur, bounds: [0, 50],
     mechanism: gaussian}
  hit_avg:
    {source: visits, budget: b, window: {tumbling: 10s}, aggregate: mean, value: eur, bounds: [0, 50],
     group_by: page, mechanism: gaussian}
  hit_lat:
    {source: visits, budget: b, window: {tumbling: 10s}, aggregate: quantile, value: ms, bounds: [0, 100], bins: 5,
     quantiles: [0.9], mechanism: exponential}
sinks: {releases: t.rel, dead_letter: t.dlq}
"""

_SECRET = "an-hmac-secret-of-enough-bytes-0123"


def _topologies() -> dict[str, Topology]:
    out = {p.name: load_topology(p) for p in sorted((_ROOT / "topology" / "examples").glob("*.yaml"))}
    for p in sorted((_ROOT / "tests" / "topologies").glob("*.yaml")):  # the suite's loadable ones (broken/ is not)
        out[p.name] = load_topology(p)
    out["edges"] = load_topology_text(_EDGES)
    hashed = _EDGES.replace("max_future: 1m}", "max_future: 1m, privacy_unit_hash: hmac-sha256}")
    with mock.patch.dict(os.environ, {UNIT_HMAC_KEY_ENV: _SECRET}):
        out["edges-hashed"] = load_topology_text(hashed)
    return out


_TOPOLOGIES = _topologies()
_CASES = [(name, src) for name, topo in _TOPOLOGIES.items() for src in topo.sources]
_T0 = 1_800_000_000 - 1_800_000_000 % 86_400
"""A UTC midnight: every window grid and period of the topologies starts here."""


class _Rec(NamedTuple):
    offset: int
    value: bytes | None
    timestamp: int | None = None
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


class _Shape(NamedTuple):
    """What one source's events carry: the unit and time fields, group-by fields with their declared keys,
    value fields with their bounds."""

    unit: str | None
    time: str | None
    groups: dict[str, list[str]]
    values: dict[str, tuple[float, float]]
    scale: int
    """The smallest window step (s): times spread over a few of them."""


def _shape(topo: Topology, source: str) -> _Shape:
    src = topo.sources[source]
    metrics = [m for m in topo.metrics.values() if m.source == source]
    groups: dict[str, list[str]] = {}
    values: dict[str, tuple[float, float]] = {}
    for m in metrics:
        if m.group_by:
            groups.setdefault(m.group_by, []).extend(m.keys or ["k1", "k2", "k3", "k4"])
        if m.value:
            lo, hi = (m.bounds.lower, m.bounds.upper) if m.bounds else (0.0, 1.0)
            values[m.value] = (min(lo, values.get(m.value, (lo, hi))[0]), max(hi, values.get(m.value, (lo, hi))[1]))
    return _Shape(
        None if src.event_level else src.privacy_unit,
        src.timestamp,
        groups,
        values,
        min(m.window.every_s for m in metrics),
    )


_MISSING = object()
_UNITS = ["heavy", "heavy2", "u1", "u2", "u3", "u4", "u5", "u6", 7]


@st.composite
def _event(draw: Any, shape: _Shape, ts: float) -> bytes | None:
    """One record value: mostly a well-formed event at `ts`, sometimes broken in one field or as a whole."""
    whole = draw(st.sampled_from(["ok"] * 14 + ["garbage", "tombstone", "array", "string", "nan"]))
    if whole == "garbage":
        return draw(st.sampled_from([b"", b"{", b'{"user_id": ', b"\xff\xfe", b"nul"]))
    if whole == "tombstone":
        return None
    if whole == "array":
        return b"[1, 2]"
    if whole == "string":
        return b'"u1"'
    doc: dict[str, Any] = {}
    if shape.unit is not None:
        unit = draw(st.sampled_from(_UNITS * 4 + ["", "x" * 1025, True, 1.5, None, _MISSING, ["u1"]]))
        if unit is not _MISSING:
            doc[shape.unit] = unit
    if shape.time is not None:
        how = draw(st.sampled_from(["s"] * 12 + ["ms", "iso", "numstr", "bad", "neg", "bool", "absent", "null"]))
        doc[shape.time] = {
            "s": ts,
            "ms": round(ts * 1000),
            "iso": _iso(ts),
            "numstr": repr(ts),
            "bad": "yesterday",
            "neg": -5,
            "bool": True,
            "absent": _MISSING,
            "null": None,
        }[how]
        if doc[shape.time] is _MISSING:
            del doc[shape.time]
    for name, keys in shape.groups.items():
        k = draw(st.sampled_from(keys * 3 + ["zzz", 7, 1.5, None, _MISSING, True]))
        if k is not _MISSING:
            doc[name] = k
    for name, (lo, hi) in shape.values.items():
        width = hi - lo
        v = draw(
            st.one_of(
                st.floats(min_value=lo - width / 2, max_value=hi + width / 2, allow_nan=False),
                st.integers(min_value=int(lo) - 5, max_value=int(hi) + 5),
                st.sampled_from([lo, hi, None, _MISSING, _MISSING, "3", True]),
            )
        )
        if v is not _MISSING:
            doc[name] = v
    raw = json.dumps(doc).encode()
    if whole == "nan" and shape.values:
        raw = raw[:-1] + b', "' + next(iter(shape.values)).encode() + b'": NaN}'
    return raw


def _iso(ts: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@st.composite
def _scenario(draw: Any, shape: _Shape, mode: str) -> list[tuple[str, Any]]:
    """Steps: ("batch", records) and ("mark", (read_at, end offset)), then the test flushes."""
    n = draw(st.integers(min_value=0, max_value=160))
    scale = shape.scale
    arrival = float(_T0 + draw(st.integers(min_value=-2, max_value=3)) * scale)
    recs: list[_Rec] = []
    positions: list[bytes] = []
    for offset in range(n):
        arrival += draw(st.sampled_from([0.0, 0.0, 0.001, 0.5, 1.0, scale / 4, scale / 2, scale]))
        delay = draw(
            st.sampled_from([0.0, 0.1, 1.0, -1.0, scale / 2, scale, 2.5 * scale, 10.0 * scale, -30.0, -4000.0, 9e5])
        )
        ts = max(arrival - delay, 0.0)
        value = draw(_event(shape, ts))
        stamp = None if mode == "replay" else draw(st.sampled_from([round(arrival * 1000)] * 8 + [None]))
        key = None
        headers: tuple[tuple[str, bytes], ...] = ()
        if mode == "keys":
            key = draw(st.sampled_from([b"heavy", b"u1", b"u2", b"7", b"nope"]))
        if mode == "hop":
            if positions and draw(st.booleans()):
                position = draw(st.sampled_from(positions))  # a second copy of a source record
            else:
                position = draw(st.sampled_from([b"%d:%d" % (offset % 3, 1000 + offset)] * 5 + [b"junk", b"1:x"]))
                positions.append(position)
            headers = ((SOURCE_POSITION_HEADER, position),)
        recs.append(_Rec(offset, value, stamp, key, headers))
    steps: list[tuple[str, Any]] = []
    i = 0
    while i < n:
        j = draw(st.integers(min_value=i + 1, max_value=n))
        steps.append(("batch", recs[i:j]))
        if draw(st.booleans()):
            read_at = _T0 + draw(st.integers(min_value=-scale, max_value=(n // 4 + 4) * scale))
            steps.append(("mark", (float(read_at), draw(st.integers(min_value=0, max_value=n)))))
        i = j
    return steps


def _state(pipe: PartitionPipeline) -> Any:
    """Everything a later close or commit reads: per metric the open windows' first offsets, tallies and
    progress, and the period rule's state."""
    out = []
    for acc in pipe._accs:
        windows = {s: getattr(st, "first_offset", st) for s, st in acc.windows.items()}
        caps = None if acc.caps is None else (acc.caps.counts, acc.caps.period_start, acc.caps.last_start)
        tallies = (acc.capped, acc.clamped, acc.skips, acc.capped_windows, acc.capped_period)
        out.append((acc.metric.name, windows, acc.next_start, tallies, caps))
    seen = pipe.seen_copies
    copies = None if seen is None else (dict(seen._ts), list(seen._order), seen.skipped)
    return out, copies, pipe.last_offset, pipe.safe_offset(), pipe.progress(), pipe.refresh_counts()


def _output(out: Any) -> Any:
    return (
        [p.to_bytes() for p in out.partials],
        [d.to_bytes() for d in out.dead_letters],
        [d.to_bytes() for d in out.counted],
    )


def _pipelines(topo: Topology, source: str, mode: str) -> tuple[PartitionPipeline, PartitionPipeline]:
    src = topo.sources[source]
    kwargs: dict[str, Any] = {"schedule_start": _T0}
    if mode == "replay":
        kwargs.update(until=_T0 + 40 * 3600, event_range=(float(_T0), float(_T0 + 40 * 3600)))
    if mode == "keys":
        kwargs.update(check_keys=True, partitions=2, topic=src.topic)
    if mode == "hop":
        kwargs.update(topic=f"{src.topic}.by-unit")
    return oracle_pipeline(PartitionPipeline(topo, source, 1, **kwargs)), PartitionPipeline(topo, source, 1, **kwargs)


def _check(topo_name: str, source: str, mode: str, steps: list[tuple[str, Any]]) -> None:
    topo = _TOPOLOGIES[topo_name]
    old, new = _pipelines(topo, source, mode)
    for kind, arg in steps:
        if kind == "batch":
            got_old, got_new = oracle_process_batch(old, arg), new.process_batch(arg)
        else:
            got_old, got_new = old.mark_end(*arg), new.mark_end(*arg)
        assert _output(got_new) == _output(got_old)
        assert _state(new) == _state(old)
    assert _output(new.flush()) == _output(old.flush())
    assert _state(new) == _state(old)


def _random_case(data: st.DataObject) -> None:
    topo_name, source = data.draw(st.sampled_from(_CASES))
    topo = _TOPOLOGIES[topo_name]
    modes = ["live", "live", "replay"] + ([] if topo.sources[source].event_level else ["hop", "keys"])
    mode = data.draw(st.sampled_from(modes))
    steps = data.draw(_scenario(_shape(topo, source), mode))
    with mock.patch.dict(os.environ, {UNIT_HMAC_KEY_ENV: _SECRET}):
        _check(topo_name, source, mode, steps)


_SLOW = [HealthCheck.too_slow, HealthCheck.data_too_large]


@settings(max_examples=120, deadline=None, suppress_health_check=_SLOW)
@given(st.data())
def test_the_batch_path_matches_the_per_event_oracle(data: st.DataObject) -> None:
    """Same partials, dead letters, count deltas, counters, commit points and window state after every
    batch and close mark, and after the flush."""
    _random_case(data)


@settings(max_examples=60, deadline=None, suppress_health_check=_SLOW)
@given(st.data())
def test_compaction_and_code_pruning_change_nothing(data: st.DataObject) -> None:
    """Open windows compacted every few rows and code tables pruned at every close (tiny floors): the
    batch path still matches the oracle, so compaction drops only what L∞ drops and pruning renumbers
    only codes no open window holds."""
    with (
        mock.patch.object(accumulator, "_COMPACT_FLOOR", 8),
        mock.patch.object(accumulator, "_KEY_FLOOR", 1),
        mock.patch.object(Codes.__init__, "__defaults__", (1,)),
    ):
        _random_case(data)


@settings(max_examples=40, deadline=None, suppress_health_check=_SLOW)
@given(st.data(), st.integers(1, 4))
def test_a_batch_consumed_in_chunks_matches_the_oracle(data: st.DataObject, chunk: int) -> None:
    """A fetch is consumed in chunks of `CHUNK_RECORDS` records: with chunks of 1 to 4 records, every
    batch is cut (copies, dead letters and windows across chunk edges), and still matches the oracle."""
    with mock.patch.object(partition, "CHUNK_RECORDS", chunk):
        _random_case(data)


@pytest.mark.slow
@settings(max_examples=1500, deadline=None, suppress_health_check=_SLOW)
@given(st.data())
def test_the_batch_path_matches_the_per_event_oracle_at_length(data: st.DataObject) -> None:
    """The same comparison on many more random cases (`--runslow`)."""
    _random_case(data)


def test_a_heavy_unit_hits_every_cap_alike() -> None:
    """One unit, 60 events over 4 keys in one window, cut into 7 batches: both paths cap it the same
    (a non-vacuous case: something is capped and something kept)."""
    topo = _TOPOLOGIES["edges"]
    recs = [
        _Rec(
            i,
            json.dumps(
                {
                    "user_id": "heavy",
                    "ts": _T0 + 1 + i / 100,
                    "page": "abc7"[i % 4],
                    "ref": f"r{i % 5}",
                    "eur": float(i),
                    "ms": i % 100,
                }
            ).encode(),
            (_T0 + 2) * 1000 + 60 - i,
        )
        for i in range(60)
    ]
    steps = [("batch", recs[a:b]) for a, b in zip([0, 5, 6, 20, 33, 34, 50], [5, 6, 20, 33, 34, 50, 60], strict=True)]
    _check("edges", "clicks", "live", steps)
    pipe = _pipelines(topo, "clicks", "live")[1]
    for _, batch in steps:
        pipe.process_batch(batch)
    out = pipe.flush()  # what bounding dropped is counted when the window closes
    counts = pipe.refresh_counts()
    assert counts.capped > 0 and counts.accepted == 60
    assert any(p.values for p in out.partials)
