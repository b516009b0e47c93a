"""Windows close by arrival, on a public schedule: inclusion, closing, empty windows, resume, safe offset."""

from __future__ import annotations

import json
from typing import NamedTuple

import pytest

from dpstream.topology.loader import load_topology_text
from dpstream.topology.schedule import Schedule
from dpstream.workers.pipeline import PartitionPipeline
from dpstream.workers.pipeline.partials import WindowPartial
from dpstream.workers.pipeline.partition import MAX_WINDOWS_PER_CLOSE

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts, allowed_lateness: 10s}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  tumble:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    contribution: {max_per_key: 100}
    mechanism: gaussian
  hop:
    source: clicks
    budget: b
    weight: 1
    window: {hopping: 3m, every: 1m}
    aggregate: count
    contribution: {max_per_key: 100}
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""

S = 1_000_050  # a schedule start on no window boundary: the first window starts at 1_000_080


class Rec(NamedTuple):
    offset: int
    value: bytes
    timestamp: int | None = None
    key: bytes | None = None


@pytest.fixture(scope="module")
def topo():
    return load_topology_text(_YAML)


def _rec(offset: int, ts: float, arrival: float, unit: str = "u") -> Rec:
    """An event at `ts` appended at `arrival` (record time in ms), keyed by its unit."""
    return Rec(offset, json.dumps({"user_id": unit, "ts": ts}).encode(), int(arrival * 1000), unit.encode())


def _by_metric(partials, metric):
    return {p.start: p.values.get("", 0) for p in partials if p.metric == metric}


def _pipe(topo, **kw):
    return PartitionPipeline(topo, "clicks", 0, schedule_start=S, **kw)


def test_schedule_starts_at_the_first_window_at_or_after_s(topo):
    """S is public: the first window of each metric is the first grid window starting at or after it."""
    assert Schedule.of(topo.metrics["tumble"], S).first_window() == 1_000_080
    assert Schedule.of(topo.metrics["tumble"], 1_000_080).first_window() == 1_000_080
    pipe = _pipe(topo)
    assert pipe.next_close_time() == 1_000_080 + 60 + 10


def test_an_event_counts_iff_it_arrived_by_its_windows_close_time(topo):
    """[1000080, 1000140) closes at 1000150: an event appended at 1000150 counts, at 1000150.001 it is late."""
    w = 1_000_080
    pipe = _pipe(topo)
    out = pipe.process_batch(
        [_rec(0, w + 30, w + 70, "a"), _rec(1, w + 31, w + 70.001, "b"), _rec(2, w + 5, w + 20, "c")]
    )
    assert pipe.counts.late == 1  # b arrived after C(w) for the tumbling window
    out = pipe.mark_end(w + 100, 3)
    assert _by_metric(out.partials, "tumble") == {w: 2}


def test_a_far_future_event_closes_no_one_elses_window(topo):
    """One unit's event timed 3,000 s ahead (inside max_future) leaves every other event counted."""
    w = 1_000_080
    events = [_rec(i if i < 25 else i + 1, w + i % 60, w + 61, f"u{i}") for i in range(50)]
    pipe = _pipe(topo)
    pipe.process_batch(events[:25] + [_rec(25, w + 3000, w + 61, "attacker")] + events[25:])
    assert pipe.counts.late == 0
    closed = _by_metric(pipe.mark_end(w + 70, 51).partials, "tumble")
    assert closed == {w: 50}


def test_windows_close_only_when_consumption_reaches_the_end_offset_read_after_c(topo):
    """A mark (end offset read at T ≥ C(w)) closes w only once every record before that offset is in."""
    w = 1_000_080
    pipe = _pipe(topo)
    pipe.process_batch([_rec(0, w + 1, w + 2, "a")])
    assert pipe.mark_end(w + 75, 3).partials == []  # records 1 and 2 not consumed yet
    out = pipe.process_batch([_rec(1, w + 3, w + 60, "b"), _rec(2, w + 4, w + 71, "c")])
    assert _by_metric(out.partials, "tumble") == {w: 2}  # c arrived after C(w) = w + 70: late
    assert pipe.counts.late == 1


def test_a_mark_read_before_c_closes_nothing(topo):
    """An end offset read before C(w) proves nothing about records appended up to C(w)."""
    w = 1_000_080
    pipe = _pipe(topo)
    assert pipe.mark_end(w + 69, 0).partials == []
    assert _by_metric(pipe.mark_end(w + 70, 0).partials, "tumble") == {w: 0}


def test_every_window_from_s_is_emitted_empty_or_not_and_no_run_is_skipped(topo):
    """A partition that never saw an event emits an empty partial for every scheduled window."""
    pipe = _pipe(topo)
    n = 3 * MAX_WINDOWS_PER_CLOSE + 7  # longer than one close call: continued, never skipped
    t = 1_000_080 + n * 60 + 10
    partials = pipe.mark_end(t, 0).partials
    while True:
        more = pipe.process_batch([]).partials
        if not more:
            break
        partials += more
    starts = sorted(p.start for p in partials if p.metric == "tumble")
    assert starts == list(range(1_000_080, 1_000_080 + n * 60, 60))
    assert all(p.values == {} for p in partials)


def test_events_before_s_and_1970_times_create_no_window(topo):
    """A 1970 timestamp or a time before S is late for every window: nothing is scheduled before S."""
    pipe = _pipe(topo)
    pipe.process_batch([_rec(0, 1.0, 1_000_100, "a"), _rec(1, S - 30, S + 1, "b")])
    assert pipe.counts.late == 2 and pipe.counts.accepted == 2
    partials = pipe.mark_end(1_000_300, 2).partials
    assert min(p.start for p in partials) == 1_000_080
    assert all(p.values == {} for p in partials)


def test_event_timed_beyond_max_future_of_its_own_arrival_is_dead_lettered(topo):
    """max_future (default 1h) is judged against the record's own append time."""
    pipe = _pipe(topo)
    out = pipe.process_batch([_rec(0, 1_000_100 + 3601, 1_000_100), _rec(1, 1_000_100 + 3599, 1_000_100)])
    assert [(d.reason, d.offset) for d in out.dead_letters] == [("future_timestamp", 0)]


def test_hopping_event_lands_in_every_covering_window(topo):
    """An event at w+130 counts in the 3m windows starting at w, w+60 and w+120."""
    w = 1_000_080
    pipe = _pipe(topo)
    pipe.process_batch([_rec(0, w + 130, w + 131)])
    closed = _by_metric(pipe.mark_end(w + 600, 1).partials, "hop")
    assert {s: v for s, v in closed.items() if v} == {w: 1, w + 60: 1, w + 120: 1}


def test_key_mismatch_is_dead_lettered_when_keys_are_checked(topo):
    """A record whose Kafka key is not its unit would escape global bounding: dead-lettered."""
    pipe = _pipe(topo, check_keys=True)
    good = _rec(0, 1_000_100, 1_000_101, "alice")
    bad = Rec(1, good.value, good.timestamp, b"mallory")
    out = pipe.process_batch([good, bad])
    assert [(d.reason, d.offset) for d in out.dead_letters] == [("key_mismatch", 1)]
    assert pipe.counts.accepted == 1


def test_safe_offset_never_passes_first_event_of_an_open_window(topo):
    """The commit offset stays at the first event of the oldest unemitted window, then moves on."""
    w = 1_000_080
    pipe = _pipe(topo, start_offset=100)
    assert pipe.safe_offset() == 100
    pipe.process_batch([_rec(100 + i, w + t, w + t + 1) for i, t in enumerate([10, 20, 30])])
    assert pipe.safe_offset() == 100
    pipe.process_batch([_rec(103, w + 70, w + 71), _rec(104, w + 80, w + 81)])
    pipe.mark_end(w + 75, 105)  # tumbling [w, w+60) closes, hop [w, w+180) is still open
    assert pipe.safe_offset() == 100
    pipe.mark_end(w + 400, 105)
    assert pipe.safe_offset() == 105


def _stream():
    w = 1_000_080
    times = [
        (5, 6),
        (50, 55),
        (61, 62),
        (62, 75),
        (64, 65),
        (119, 125),
        (130, 131),
        (185, 200),
        (190, 260),
        (250, 251),
        (251, 252),
        (400, 401),
    ]
    return [_rec(i, w + t, w + a, f"u{i % 3}") for i, (t, a) in enumerate(times)]


def _run(topo, recs, cut=None, marks=(130, 250, 330, 480)):
    """Feed records with end-offset marks as a live driver would; with `cut`, restart at the safe
    offset with the committed progress after the first `cut` records (a crash and a new owner)."""
    w = 1_000_080
    pipe = _pipe(topo)
    out = []
    fed = 0
    for m in marks:
        upto = [r for r in recs if r.timestamp <= (w + m) * 1000]
        batch = [r for r in upto if r.offset >= fed]
        if cut is not None and fed <= cut < fed + len(batch) + 1:
            out += pipe.process_batch([r for r in batch if r.offset < cut]).partials
            resume, offset = pipe.progress(), pipe.safe_offset()
            pipe = _pipe(topo, resume=resume, start_offset=offset)
            batch = [r for r in recs if offset <= r.offset < len(upto)]
            cut = None
        out += pipe.process_batch(batch).partials
        fed = len(upto)
        out += pipe.mark_end(w + m, fed).partials
    return out


def test_restart_at_the_safe_offset_with_progress_rebuilds_the_same_partials(topo):
    """A worker restarted at safe_offset() with its committed progress emits exactly what the
    uninterrupted one would (the merger dedupes by (window, partition))."""
    recs = _stream()
    expected = sorted(_run(topo, recs), key=lambda p: (p.metric, p.start))
    for cut in range(1, len(recs)):
        got = _run(topo, recs, cut=cut)
        first = {}
        for p in got:
            first.setdefault((p.metric, p.start), p)
        assert sorted(first.values(), key=lambda p: (p.metric, p.start)) == expected, cut


def test_batch_boundaries_do_not_change_partials(topo):
    """Feeding events one by one or in one batch yields the same partials."""
    recs = _stream()
    a = _pipe(topo)
    a.process_batch(recs)
    one = a.mark_end(1_000_080 + 1000, len(recs)).partials
    b = _pipe(topo)
    for r in recs:
        b.process_batch([r])
    many = b.mark_end(1_000_080 + 1000, len(recs)).partials

    def key(p: WindowPartial) -> tuple[str, int]:
        return (p.metric, p.start)

    assert sorted(one, key=key) == sorted(many, key=key)
