"""Hostile input through a real worker: 10,000 hypothesis-generated events per run.

Malformed JSON, wrong types, NaN and ±Infinity as raw bytes, 1e308, negative numbers, missing /
empty / 1 MB unit ids, timestamps far in the past and in the future, ~1 MB messages, bytes that
are not UTF-8, tombstones and wrong Kafka keys, interleaved with good events of a few units.

One deployment gets everything. Then:

- its worker never crashed (still running, no traceback in its log);
- every bad event is in the dead-letter topic, at its own partition and offset, with its raw bytes
  and a reason from `pipeline.events.REASONS` that fits what was wrong with it; nothing else is
  there (events timed before S are accepted and counted late, not dead-lettered);
- the good events' releases are unchanged: the worker's merged partials (the true aggregates the
  releases are drawn from; sums in integer grid units) equal, window by window, a clean run of the
  good events alone, in the same partition order and with the same broker append times, through
  the ingest hot path (`PartitionPipeline`) in-process. The clean run takes the append times the
  broker gave the hostile run's records, so it needs no second deployment and no assumption about
  how fast the events were sent (inclusion is by append time, DESIGN §1 rule 1);
- `dpstream verify` finds nothing wrong with the deployment.

The events come from hypothesis: each example of a `@given` test draws pools of values (extra fields,
amounts, far-past / future / negative times, non-objects, garbage bytes; POOL of each) and a seed, from
which a seeded random source composes PER_EXAMPLE events of every hostile kind; batches of which at
least half the events are new are kept until N events (a few seconds; drawing each of the ~10 values
of 10,000 events from hypothesis one by one took minutes). Event times are relative (to the deployment
start S, to the first test window T0, to the send time) and are rendered into bytes only when the events
are sent.
`DPSTREAM_HOSTILE_EVENTS=N` changes the count (e.g. 50000 for a long run).
"""

from __future__ import annotations

import base64
import collections
import json
import os
import random
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any, NamedTuple

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from kafka import KafkaProducer

from dpstream.topology.loader import load_topology
from dpstream.topology.schedule import Schedule
from dpstream.workers.cli import main
from dpstream.workers.pipeline.events import REASONS
from dpstream.workers.pipeline.partition import PartitionPipeline
from dpstream.workers.runtime.admin import create_topics
from dpstream.workers.runtime.topics import APPEND_TIME, topic_names
from tests.e2e.harness import TOPOLOGY, Deployment, poll, read_all

pytestmark = pytest.mark.e2e

WINDOW = 2
PARTITIONS = 4
N_EVENTS = int(os.environ.get("DPSTREAM_HOSTILE_EVENTS", "10000"))
WINDOWS = 4
"""A chunk's good events fall in the WINDOWS windows starting at its T0."""
CHUNK = 1000
"""Events rendered and sent at a time (their times are relative to the chunk's send)."""
MAX_MESSAGE = 8 * 1024 * 1024
BIG = 1024 * 1024 + 17
"""A ~1 MB message or unit id."""
MAX_BIG = 6
"""~1 MB events per kind and run (they cost broker time; more prove nothing more)."""
UNITS: tuple[str | int, ...] = ("u0", "u1", "u2", "u3", "ünï", "用户", 42, "u-long-" + "x" * 200)
"""The good events' units (42 is an integer unit: its Kafka key is b"42")."""
PER_EXAMPLE = 500
"""Events per hypothesis example."""


@dataclass(frozen=True)
class Times:
    """The times a chunk of events is rendered against: schedule start S, its first window T0, send time."""

    start: int
    t0: int
    now: float


Render = Callable[[Times], bytes | None]


@dataclass
class Sent:
    """One generated event: its key, how to render its value, and what must become of it."""

    kind: str
    key: bytes | None
    render: Render = field(compare=False)
    reasons: frozenset[str] = frozenset()
    """Bad events: the reasons that fit (one defect each; two where the JSON decoder decides, e.g. raw
    NaN is not JSON to orjson and a non-finite number to the stdlib). Empty for good and ignored ones."""
    good: bool = False
    """Counts in a window of the test."""
    value: bytes | None = field(default=None, compare=False)
    """The bytes sent (rendered at send time)."""
    where: tuple[int, int] | None = field(default=None, compare=False)
    """(partition, offset) in the source topic, once sent."""
    append_ms: int | None = field(default=None, compare=False)
    """The broker's append time of the record, once sent."""


@dataclass(frozen=True)
class _Record:
    """A sent record as `PartitionPipeline` reads it."""

    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None


def _unit_key(unit: str | int) -> bytes:
    return str(unit).encode()


def _iso(ts: float, suffix: str = "Z") -> str:
    dt = datetime.fromtimestamp(ts, tz=UTC)
    return dt.strftime("%Y-%m-%dT%H:%M:%S.") + f"{dt.microsecond // 1000:03d}" + suffix


def _dumps(doc: dict[str, Any]) -> bytes:
    return json.dumps(doc, ensure_ascii=False).encode()


# ---- strategies (built once: hypothesis validates a strategy on first use) -------------------------

_FINITE = st.floats(allow_nan=False, allow_infinity=False)
_JSONABLE = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _FINITE | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=5,
)
_EXTRA = st.dictionaries(
    st.sampled_from(("count", "ref", "ua", "", "ü", "n")),
    st.none() | st.integers() | _FINITE | st.text(max_size=8),
    max_size=2,
)
_KINDS = ("good",) * 10 + (
    "far_past",
    "not_json",
    "truncated",
    "non_utf8",
    "not_object",
    "nan_value",
    "nan_ts",
    "future_ts",
    "negative_ts",
    "bad_ts_type",
    "missing_unit",
    "bad_unit",
    "huge_unit",
    "bad_value",
    "bad_key",
    "key_mismatch",
    "oversized_garbage",
    "oversized_good",
    "tombstone",
)
_TS_FORMS = ("float", "int", "ms", "numeric_string", "iso_z", "iso_offset")
_OFFSET_MS = st.integers(0, WINDOWS * WINDOW * 1000 - 1)
_PAGES = ("home", "cart", "home", "cart", "search", 7, None)
_BASKETS = (
    st.none()
    | st.integers(-1000, 1000)
    | _FINITE
    | st.sampled_from((1e308, -1e308, 5e-324, -0.0, 0, 100, 100.0000001, -5))
)
_FAR_PAST = st.sampled_from((0, 1, 86_400.5, 1e9, 1.5e11, "1970-01-01T00:00:01Z")) | st.integers(0, 1_600_000_000)
"""Before any S of a run (2020 and earlier)."""
_FUTURE_ABS = (1e308, 9.9e10, 1e14, 1e300, "9999-12-31T23:59:59Z", "2200-01-01T00:00:00+00:00")
_FUTURE_AHEAD_S = st.floats(7200, 5e10)
"""Seconds after the send time (the worker's max_future is 3600 s)."""
_NEGATIVE_TS = st.sampled_from((-1, -0.5, -1e300, "-5", "0001-01-01T00:00:00Z")) | st.integers(max_value=-1)
_BAD_TS: tuple[Any, ...] = (True, False, [], {}, [1], {"t": 1}, "yesterday", "", "2026-01-01T00:00:00", "1e", "nan")
_BAD_UNITS: tuple[Any, ...] = (1.5, 1e308, -0.0, True, False, [], ["u1"], {"id": "u1"})
_BAD_VALUES = ("12", "NaN", "", [1], {"eur": 1}, True, False)
_BAD_KEYS: tuple[Any, ...] = (1.5, -0.0, 1e308, [], ["home"], {"p": "home"}, True)
_NOT_JSON_HEADS = (b"}", b"]", b"{{", b"", b"\x00", b"nul", b"tru", b"'x'")
_NOT_UTF8 = (b"\xff", b"\xfe\xfe", b"\xc3(", b"\xed\xa0\x80", b"\x80")
_NON_FINITE = (b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999")
_NOT_OBJECT = (
    st.lists(_JSONABLE, max_size=3) | st.integers() | st.text(max_size=10) | st.none() | st.booleans() | _FINITE
)
_MISSING = ("absent", "null", "empty")
_HUGE_CHARS = ("u", "ü", "用")
Pick = Callable[[st.SearchStrategy[Any] | tuple[Any, ...]], Any]


def _good_ts(pick: Pick, rnd: random.Random) -> Callable[[Times], Any]:
    """An event time inside the test's windows (relative to T0), in one of the accepted spellings."""
    off_ms = rnd.randrange(WINDOWS * WINDOW * 1000) if rnd.random() < 0.5 else pick(_OFFSET_MS)
    form = pick(_TS_FORMS)

    def ts(t: Times) -> Any:
        exact = t.t0 + off_ms / 1000
        if form == "float":
            return exact
        if form == "int":
            return t.t0 + off_ms // 1000
        if form == "ms":
            return t.t0 * 1000 + off_ms
        if form == "numeric_string":
            return f"{exact:.3f}"
        return _iso(exact, "Z" if form == "iso_z" else "+00:00")

    return ts


def _fields(pick: Pick, rnd: random.Random, unit: str | int) -> dict[str, Any]:
    """A good event's fields without its time."""
    doc: dict[str, Any] = dict(pick(_EXTRA))
    doc["user_id"] = unit
    page = pick(_PAGES)
    if page is not None:
        doc["page"] = page
    basket = rnd.choice((pick(_BASKETS), round(rnd.uniform(-50, 150), rnd.randrange(5)), rnd.randrange(-20, 120)))
    if basket is not None:
        doc["basket_eur"] = basket
    return doc


def _doc(fields: dict[str, Any], ts: Any) -> Render:
    """Render `fields` with `ts` (a value, or a function of the times) as the event time."""

    def render(t: Times) -> bytes:
        return _dumps({**fields, "ts": ts(t) if callable(ts) else ts})

    return render


def _patched(render: Render, patch: Callable[[bytes], bytes]) -> Render:
    def out(t: Times) -> bytes:
        raw = render(t)
        assert raw is not None
        return patch(raw)

    return out


def _garbage_reasons(raw: bytes) -> frozenset[str]:
    """Random bytes are not JSON, unless they happen to be (`18`, `null`, ` true`): then what a decoder
    that reads them says (orjson, or the stdlib where it is missing, may differ)."""
    reasons = {"not_json"}
    for loads in (json.loads, orjson.loads):
        try:
            obj = loads(raw)
        except (ValueError, TypeError):
            continue
        reasons.add("not_object" if type(obj) is not dict else "missing_unit")
    return frozenset(reasons)


def _replace_marker(raw: bytes, literal: bytes) -> bytes:
    return raw.replace(b'"@@"', literal)


def _const(value: bytes | None) -> Render:
    return lambda _t: value


_BINARY = st.binary(max_size=40)
_POOLED = (_EXTRA, _OFFSET_MS, _BASKETS, _FAR_PAST, _FUTURE_AHEAD_S, _NEGATIVE_TS, _NOT_OBJECT, _BINARY)
"""The strategies an example draws a pool of POOL values from (the tuples above are picked from directly)."""
POOL = 25


@st.composite
def _events(draw: st.DrawFn, big: collections.Counter[str]) -> list[Sent]:
    """PER_EXAMPLE events, composed by a seeded random source from POOL hypothesis-drawn values of each
    strategy (a hypothesis draw costs ~0.3 ms, so 10,000 events drawn value by value take minutes);
    `big` caps the ~1 MB ones per run."""
    pools = {id(s): draw(st.lists(s, min_size=POOL, max_size=POOL)) for s in _POOLED}
    rnd = random.Random(draw(st.integers(0, 2**64 - 1)))
    """Seeded by hypothesis (its own `st.randoms` draws a choice per call: too many for one example). It
    picks from the pools and spreads event times and amounts over their whole range, where hypothesis'
    own draws favour a few boundary values."""

    def pick(source: st.SearchStrategy[Any] | tuple[Any, ...]) -> Any:
        return rnd.choice(source if isinstance(source, tuple) else pools[id(source)])

    def big_allowed(kind: str) -> bool:
        big[kind] += 1
        return big[kind] <= MAX_BIG

    src = _Source(pick, rnd, big_allowed)
    out: list[Sent] = []
    for _ in range(PER_EXAMPLE):
        kind = pick(_KINDS)
        unit = rnd.choice(UNITS)
        key = _unit_key(unit)
        fields = _fields(pick, rnd, unit)
        good = _doc(fields, _good_ts(pick, rnd))
        out.append(_event(src, kind, key, fields, good))
    return out


class _Source(NamedTuple):
    """An example's random source: picks from the pools, the seeded random, the cap on ~1 MB events."""

    pick: Pick
    rnd: random.Random
    big_allowed: Callable[[str], bool]


_ACCEPTED_KINDS = ("good", "oversized_good", "far_past")
_BAD_TIME_KINDS = ("future_ts", "negative_ts", "bad_ts_type")
_BAD_FIELD_KINDS = ("missing_unit", "bad_unit", "huge_unit", "bad_value", "bad_key", "key_mismatch")


def _event(src: _Source, kind: str, key: bytes, fields: dict[str, Any], good: Render) -> Sent:
    """One event of `kind` (unit key `key`, good fields `fields`, rendered well as `good`): one branch per kind."""
    if kind in _ACCEPTED_KINDS:
        return _accepted_event(src, kind, key, fields, good)
    if kind in _BAD_TIME_KINDS:
        return _bad_time_event(src, kind, key, fields)
    if kind in _BAD_FIELD_KINDS:
        return _bad_field_event(src, kind, key, fields, good)
    return _undecodable_event(src, kind, key, fields, good)


def _accepted_event(src: _Source, kind: str, key: bytes, fields: dict[str, Any], good: Render) -> Sent:
    """Events no reason refuses: good, ~1 MB good, and far in the past (counted late)."""
    pick, rnd, big_allowed = src
    if kind == "good":
        return Sent(kind, key, good, good=True)
    if kind == "oversized_good":  # well-formed, ~1 MB: no reason refuses it, so it counts
        pad = "p" * (BIG if big_allowed(kind) else 20_000)
        return Sent(kind, key, _doc({**fields, "pad": pad}, _good_ts(pick, rnd)), good=True)
    assert kind == "far_past"  # accepted and counted late: before S, no window of the schedule holds it
    return Sent(kind, key, _doc(fields, pick(_FAR_PAST)))


def _undecodable_event(src: _Source, kind: str, key: bytes, fields: dict[str, Any], good: Render) -> Sent:
    """Values that are not a JSON object a decoder reads: garbage, truncated, non-UTF-8, not an object,
    raw non-finite numbers, ~1 MB of garbage, tombstones."""
    pick, rnd, big_allowed = src
    if kind == "not_json":
        raw = pick(_NOT_JSON_HEADS) + pick(_BINARY)
        return Sent(kind, key, _const(raw), _garbage_reasons(raw))
    if kind == "truncated":
        return Sent(kind, key, _patched(good, lambda raw: raw[:-1]), frozenset({"not_json"}))
    if kind == "non_utf8":
        junk = pick(_NOT_UTF8)

        def insert(raw: bytes, junk: bytes = junk) -> bytes:
            at = raw.index(b'"user_id"') + 1
            return raw[:at] + junk + raw[at:]

        return Sent(kind, key, _patched(good, insert), frozenset({"not_json"}))
    if kind == "not_object":
        return Sent(kind, key, _const(json.dumps(pick(_NOT_OBJECT)).encode()), frozenset({"not_object"}))
    if kind in ("nan_value", "nan_ts"):
        literal = pick(_NON_FINITE)
        if kind == "nan_value":
            render = _doc({**fields, "basket_eur": "@@"}, _good_ts(pick, rnd))
            reason = "bad_value"
        else:
            render = _doc(fields, "@@")
            reason = "bad_timestamp"
        return Sent(
            kind,
            key,
            _patched(render, partial(_replace_marker, literal=literal)),
            frozenset({"not_json", reason}),
        )
    if kind == "oversized_garbage":
        size = BIG if big_allowed(kind) else 20_000
        if rnd.random() < 0.5:
            return Sent(kind, key, _const(b"x" * size), frozenset({"not_json"}))
        return Sent(kind, key, _const(json.dumps([0] * (size // 2)).encode()), frozenset({"not_object"}))
    assert kind == "tombstone"
    return Sent(kind, key, _const(None), frozenset({"not_json"}))


def _bad_time_event(src: _Source, kind: str, key: bytes, fields: dict[str, Any]) -> Sent:
    """Event times the ingest refuses: in the future (absolute, or ahead of the send), negative, of a bad type."""
    pick, rnd, _ = src
    if kind == "future_ts":
        if rnd.random() < 0.5:
            return Sent(kind, key, _doc(fields, pick(_FUTURE_ABS)), frozenset({"future_timestamp"}))

        def after_send(t: Times, ahead: float = pick(_FUTURE_AHEAD_S)) -> float:
            return t.now + ahead

        return Sent(kind, key, _doc(fields, after_send), frozenset({"future_timestamp"}))
    if kind == "negative_ts":
        negative = pick(_NEGATIVE_TS)
        # orjson refuses an integer beyond the float range
        fits = not isinstance(negative, int) or negative > -(2**1023)
        reasons = frozenset({"bad_timestamp"} if fits else {"bad_timestamp", "not_json"})
        return Sent(kind, key, _doc(fields, negative), reasons)
    assert kind == "bad_ts_type"
    return Sent(kind, key, _doc(fields, pick(_BAD_TS)), frozenset({"bad_timestamp"}))


def _bad_field_event(src: _Source, kind: str, key: bytes, fields: dict[str, Any], good: Render) -> Sent:
    """A unit, value or key the ingest refuses, or a Kafka key that is not the event's unit."""
    pick, rnd, big_allowed = src
    if kind == "missing_unit":
        how = pick(_MISSING)
        changed = {k: v for k, v in fields.items() if k != "user_id"}
        if how != "absent":
            changed["user_id"] = None if how == "null" else ""
        return Sent(kind, key, _doc(changed, _good_ts(pick, rnd)), frozenset({"missing_unit"}))
    if kind == "bad_unit":
        changed = {**fields, "user_id": pick(_BAD_UNITS)}
        return Sent(kind, key, _doc(changed, _good_ts(pick, rnd)), frozenset({"bad_unit"}))
    if kind == "huge_unit":  # a 1 MB unit id (the Kafka key is the unit too): dead-lettered as bad_unit
        huge = pick(_HUGE_CHARS) * (BIG if big_allowed(kind) else 5000)
        changed = {**fields, "user_id": huge}
        return Sent(kind, _unit_key(huge), _doc(changed, _good_ts(pick, rnd)), frozenset({"bad_unit"}))
    if kind == "bad_value":
        changed = {**fields, "basket_eur": pick(_BAD_VALUES)}
        return Sent(kind, key, _doc(changed, _good_ts(pick, rnd)), frozenset({"bad_value"}))
    if kind == "bad_key":
        changed = {**fields, "page": pick(_BAD_KEYS)}
        return Sent(kind, key, _doc(changed, _good_ts(pick, rnd)), frozenset({"bad_key"}))
    assert kind == "key_mismatch"
    other = key.upper() if key.upper() != key else b"X"
    wrong = rnd.choice((None, b"", b"\xff", key + b" ", other, b"u9", b"042" if key == b"42" else b"42"))
    return Sent(kind, wrong, good, frozenset({"key_mismatch"}))


def generate_events(n: int) -> list[Sent]:
    """`n` event templates from hypothesis, PER_EXAMPLE per example. A run's first example is hypothesis'
    minimal one and later ones may mutate earlier ones, so it runs ten examples at a time, afresh, and
    keeps the batches of which at least half the templates are new (by kind, key and value rendered at
    fixed times)."""
    events: list[Sent] = []
    seen: set[tuple[str, bytes | None, bytes | None]] = set()
    big: collections.Counter[str] = collections.Counter()
    probe = Times(start=1_800_000_000, t0=1_800_000_100, now=1_800_000_000.0)

    @settings(
        max_examples=10,
        phases=[Phase.generate],
        derandomize=False,  # hypothesis' "ci" profile (active when $CI is set) derandomizes: every batch would repeat
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(_events(big))
    def draw_batch(batch: list[Sent]) -> None:
        fresh = {(e.kind, e.key, e.render(probe)) for e in batch} - seen
        if len(fresh) >= PER_EXAMPLE // 2:
            events.extend(batch)
            seen.update(fresh)

    for _ in range(4 * n // PER_EXAMPLE):
        if len(events) >= n:
            break
        draw_batch()
    assert len(events) >= n, f"hypothesis produced {len(events)} diverse events"
    return events[:n]


# ---- deployment --------------------------------------------------------------------------------


def _deploy(tmp_path: Path, bootstrap: str, redis_url: str, start: int) -> Deployment:
    """The harness topology (2 s windows, keyed by unit) with unique topics; source and dead-letter topics
    take messages up to MAX_MESSAGE bytes."""
    prefix = f"hostile-{uuid.uuid4().hex[:8]}"
    path = tmp_path / prefix / "topology.yaml"
    path.parent.mkdir(parents=True)
    path.write_text(
        TOPOLOGY.format(
            prefix=prefix, keyed="true", epsilon=1.0, start=start, source_topic=f"{prefix}.clicks", period="1d"
        )
    )
    topology = load_topology(path)
    names = topic_names(topology)
    big = {"max.message.bytes": str(MAX_MESSAGE)}
    configs = {names.sources[0]: {**APPEND_TIME, **big}, names.dead_letter: big}
    create_topics(bootstrap, names.all, PARTITIONS, configs=configs)
    return Deployment(path, topology, bootstrap, redis_url)


def _send(bootstrap: str, topic: str, events: list[Sent], start: int) -> int:
    """Render and produce in order, CHUNK events at a time (one request in flight, so partition order is
    send order); note where each landed and its broker append time. Each chunk's good events are timed
    in the WINDOWS windows from the second window after the chunk starts, so they arrive before their
    windows close however slow the machine is. Returns the start of the last window a good event is in."""
    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        acks="all",
        linger_ms=5,
        batch_size=1024 * 1024,
        max_request_size=MAX_MESSAGE,
        max_in_flight_requests_per_connection=1,
        request_timeout_ms=60_000,
    )
    t0 = start
    for i in range(0, len(events), CHUNK):
        chunk = events[i : i + CHUNK]
        now = time.time()
        t0 = (int(now) // WINDOW + 2) * WINDOW
        times = Times(start=start, t0=t0, now=now)
        for e in chunk:
            e.value = e.render(times)
        futures = [producer.send(topic, key=e.key, value=e.value) for e in chunk]
        producer.flush(timeout=300)
        for e, f in zip(chunk, futures, strict=True):
            meta = f.get(timeout=60)
            e.where, e.append_ms = (meta.partition, meta.offset), meta.timestamp
    producer.close()
    return t0 + (WINDOWS - 1) * WINDOW


def _merge(partials: list[dict[str, Any]]) -> dict[tuple[str, int], dict[str, Any]]:
    """(metric, window start) → the merged true aggregate: counts and integer grid-unit sums, exactly;
    each (metric, window, partition) once."""
    merged: dict[tuple[str, int], dict[str, Any]] = collections.defaultdict(dict)
    seen = set()
    for p in partials:
        if (p["metric"], p["start"], p["partition"]) in seen:
            continue
        seen.add((p["metric"], p["start"], p["partition"]))
        into = merged[(p["metric"], p["start"])]
        for key, v in p["values"].items():
            if isinstance(v, list):
                cur = into.setdefault(key, [0, 0])
                cur[0] += v[0]
                cur[1] += v[1]
            else:
                into[key] = into.get(key, 0) + v
    return merged


def _live_partials(dep: Deployment) -> dict[tuple[str, int], dict[str, Any]]:
    raw = read_all(dep.bootstrap, dep.topology.sinks.partials_topic, timeout_s=60)
    return _merge([json.loads(v) for _k, v in raw if v.startswith(b"{")])


def _clean_run(dep: Deployment, good: list[Sent], start: int, through: float) -> dict[tuple[str, int], dict[str, Any]]:
    """The good events alone through the ingest hot path, partition by partition in offset order, with the
    append times the broker gave them; every window with C(w) ≤ `through` closed."""
    partials = []
    for p in range(PARTITIONS):
        core = PartitionPipeline(
            dep.topology,
            "clicks",
            p,
            schedule_start=start,
            topic=dep.source_topic,
            partitions=PARTITIONS,
            check_keys=True,
        )
        mine = sorted((e for e in good if e.where is not None and e.where[0] == p), key=lambda e: e.where or (0, 0))
        out = core.process_batch([_Record(e.where[1], e.key, e.value, e.append_ms) for e in mine if e.where])
        assert not out.dead_letters
        partials += [json.loads(w.to_bytes()) for w in out.partials + core.close_through(through)]
    return _merge(partials)


def _windows_through(dep: Deployment, start: int, last_start: int) -> set[tuple[str, int]]:
    return {
        (m.name, s)
        for m in dep.topology.metrics.values()
        for s in range(Schedule.of(m, start).first_window(), last_start + 1, m.window.every_s)
    }


def test_ten_thousand_hostile_events_through_a_real_worker(
    tmp_path: Path, kafka_broker: Any, fresh_redis: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    """No crash; every bad event dead-lettered with a fitting reason; the good events' aggregates unchanged."""
    start = int(time.time()) // WINDOW * WINDOW
    dep = _deploy(tmp_path, kafka_broker.bootstrap, fresh_redis.url, start)
    try:
        dep.start_worker("hostile")  # starts while hypothesis draws; reads the events as they arrive
        events = generate_events(N_EVENTS)
        kinds = collections.Counter(e.kind for e in events)
        assert len(kinds) >= 20 and kinds["good"] >= N_EVENTS // 5, kinds
        good = [e for e in events if e.good]
        bad = [e for e in events if e.reasons]
        assert all(r in REASONS for e in bad for r in e.reasons)

        last = _send(dep.bootstrap, dep.source_topic, events, start)
        assert len({(e.key, e.value) for e in events}) >= N_EVENTS // 2, "not diverse enough"
        want = _windows_through(dep, start, last)

        def all_released() -> dict[tuple[str, int], dict[str, Any]] | None:
            live = _live_partials(dep)
            return live if want <= set(live) else None

        got = poll(all_released, timeout_s=WINDOWS * WINDOW + 240, every_s=2)
        assert got, dep.log("hostile")[-3000:]

        # the worker never crashed
        assert dep.workers[0].poll() is None, dep.log("hostile")[-3000:]
        assert "Traceback" not in dep.log("hostile"), dep.log("hostile")[-5000:]

        # the good events' true aggregates are unchanged, window by window (empty ones included)
        source = dep.topology.sources["clicks"]
        clean = _clean_run(dep, good, start, last + WINDOW + source.allowed_lateness_s)
        assert want <= set(clean)
        for w in sorted(want):
            assert got[w] == clean[w], (w, got[w], clean[w])
        counted = sum(sum(v.values()) for (m, s), v in got.items() if m == "views" and (m, s) in want)
        assert counted > 0, f"no view of {len(good)} good events counted"

        # every bad event is in the dead-letter topic, at its place, with its bytes and a fitting reason
        letters = {}
        for _k, raw in read_all(dep.bootstrap, dep.topology.sinks.dead_letter, timeout_s=120):
            d = json.loads(raw)
            assert d["reason"] in REASONS
            assert d["source"] == "clicks" and d["topic"] == dep.source_topic
            letters[(d["partition"], d["offset"])] = d
        wrong = []
        for e in bad:
            assert e.where is not None
            d = letters.pop(e.where, None)
            if d is None or d["reason"] not in e.reasons:
                wrong.append((e.kind, sorted(e.reasons), d and d["reason"], (e.value or b"")[:120]))
                continue
            raw = base64.b64decode(d["raw_b64"])
            expected = e.value or b""
            if d.get("raw_truncated"):
                assert expected.startswith(raw) and d.get("raw_size") == len(expected), e.kind
            else:
                assert raw == expected, e.kind
        assert not wrong, f"{len(wrong)} bad events without their dead letter: {wrong[:10]}"
        assert not letters, f"{len(letters)} dead letters of events that were not bad: {list(letters.values())[:5]}"

        # and the deployment verifies (release ids, charges, budget, schedule, dead-letter reasons)
        capsys.readouterr()
        code = main(
            [
                "verify",
                "--topology",
                str(dep.path),
                "--bootstrap",
                dep.bootstrap,
                "--redis",
                dep.redis_url,
                "--grace",
                "30",
                "--json",
            ]
        )
        doc = json.loads(capsys.readouterr().out)
        assert code == 0, doc["violations"][:10]
        assert doc["counts"]["dead_letters"] == len(bad)
        assert sum(doc["counts"]["dead_letter_reasons"].values()) == len(bad)
    finally:
        dep.stop_all()
