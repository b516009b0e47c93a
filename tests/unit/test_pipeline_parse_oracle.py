"""`EventParser.parse` against a slow, plainly written model of the event rules: the same event, or the
same dead-letter reason, on random objects with right, wrong and missing fields. The model decodes the
whole object with orjson and keeps the fields the topology reads; `parse` decodes only those (their
values must be what orjson gives; the rest must only be JSON, see the tests at the end)."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.errors import EventError
from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import EventParser
from dpstream.workers.pipeline.events import REASONS, decode_json

pytestmark = pytest.mark.unit

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
  visits: {topic: t.visits, privacy_unit: event}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  basket:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: sum
    value: eur
    bounds: [0, 100]
    mechanism: gaussian
  pages:
    source: clicks
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    group_by: page
    keys: [a, b]
    mechanism: gaussian
  visits:
    source: visits
    budget: b
    weight: 1
    window: {tumbling: 1m}
    aggregate: count
    mechanism: gaussian
sinks: {releases: t.rel, dead_letter: t.dlq}
"""
_TOPO = load_topology_text(_YAML)
_PARSER = EventParser(_TOPO.sources["clicks"], value_fields=["eur"], key_fields=["page"])
_EVENT_LEVEL = EventParser(_TOPO.sources["visits"])


def _model_time(t: Any, record_time_ms: int | None) -> float | str:
    """Event time by the rules, read one at a time: absent → the record time; a number or numeric
    string → epoch seconds, or milliseconds from 1e11 on; another string → ISO-8601 with an offset."""
    if t is None:
        if record_time_ms is None or record_time_ms < 0:
            return "missing_timestamp"
        return record_time_ms / 1000
    if isinstance(t, bool) or not isinstance(t, (int, float, str)):
        return "bad_timestamp"
    try:
        x = float(t)
    except ValueError:
        try:
            when = datetime.fromisoformat(t[:-1] + "+00:00" if t.endswith("Z") else t)  # type: ignore[index,union-attr]
        except ValueError:
            return "bad_timestamp"
        if when.tzinfo is None or when.timestamp() < 0:
            return "bad_timestamp"
        return when.timestamp()
    if math.isnan(x) or math.isinf(x) or x < 0:
        return "bad_timestamp"
    return x / 1000 if x >= 1e11 else x


def _model(parser: EventParser, raw: bytes, record_time_ms: int | None, offset: int) -> tuple | str:
    """The reason, or (unit, time, fields): the rules written out, slowly, in the order they apply."""
    try:
        obj = decode_json(raw)  # the decoder is a library: the model starts from what it decoded
    except Exception:
        return "not_json"
    if not isinstance(obj, dict):
        return "not_object"
    if parser.source.event_level:
        unit = f"#{offset}"
    else:
        u = obj.get(parser.source.privacy_unit)
        if u is None or u == "":
            return "missing_unit"
        if isinstance(u, bool) or not isinstance(u, (str, int)) or (isinstance(u, str) and len(u) > 1024):
            return "bad_unit"
        unit = str(u)
    ts = _model_time(obj.get(parser.source.timestamp) if parser.source.timestamp else None, record_time_ms)
    if isinstance(ts, str):
        return ts
    for name in ("eur",) if parser is _PARSER else ():
        v = obj.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v)):
            return "bad_value"
    for name in ("page",) if parser is _PARSER else ():
        k = obj.get(name)
        if k is not None and (isinstance(k, bool) or not isinstance(k, (str, int))):
            return "bad_key"
    read = ("user_id", "ts", "eur", "page") if parser is _PARSER else ()
    return unit, ts, {name: obj[name] for name in read if obj.get(name) is not None}


def _check(parser: EventParser, raw: bytes, record_time_ms: int | None = None, offset: int = 7) -> bool:
    """True when the model accepts `raw`; asserts `parse` gave the model's event or raised its reason."""
    expected = _model(parser, raw, record_time_ms, offset)
    batch = parser.parse_batch([raw], [record_time_ms], [offset])  # the batch path, on a batch of one
    if isinstance(expected, str):
        with pytest.raises(EventError) as error:
            parser.parse(raw, record_time_ms, offset)
        assert error.value.reason == expected
        assert batch.invalid == [(0, expected)]
        return False
    unit, ts, fields = parser.parse(raw, record_time_ms, offset)
    assert (unit, ts, fields) == expected
    assert type(unit) is str and type(ts) is float and math.isfinite(ts)
    assert (batch.units, batch.time.tolist(), batch.invalid) == ([unit], [ts], [])
    assert {name: column[0] for name, column in batch.columns.items() if column[0] is not None} == {
        name: v for name, v in fields.items() if name in batch.columns
    }
    return True


def _encode(doc: object) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()  # NaN/Infinity tokens are not JSON: parsers must reject them


_any = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(), max_size=2),
)
_iso = st.builds(
    lambda d, z: d.isoformat().replace("+00:00", "Z") if z else d.isoformat(),
    st.datetimes(
        min_value=datetime(1960, 1, 1), max_value=datetime(2300, 1, 1), timezones=st.sampled_from([None, UTC])
    ),
    st.booleans(),
)
_times = st.one_of(
    st.floats(min_value=-10.0, max_value=2e11),
    st.integers(min_value=-10, max_value=2 * 10**11),
    st.sampled_from([99_999_999_999, 100_000_000_000, 1e11, "1e11", "1790000000", " 12 ", "nan", "-0", "soon", ""]),
    _iso,
    _any,
)
_docs = st.fixed_dictionaries(
    {},
    optional={
        "user_id": st.one_of(st.text(max_size=4), st.integers(min_value=-5, max_value=5), st.just("x" * 1025), _any),
        "ts": _times,
        "eur": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), _any),
        "page": st.one_of(st.sampled_from(["a", "b", "c"]), st.integers(), _any),
        "other": _any,
    },
)
_record_times = st.one_of(st.none(), st.integers(min_value=-5, max_value=2 * 10**12))


@settings(max_examples=1500, deadline=None)
@given(_docs, _record_times)
def test_parse_answers_as_the_model_on_objects(doc, record_time_ms):
    """Random objects with right, wrong and missing fields: the model's event or the model's reason."""
    _check(_PARSER, _encode(doc), record_time_ms)


@settings(max_examples=300, deadline=None)
@given(_docs, _record_times, st.integers(min_value=0, max_value=10**9))
def test_event_level_units_are_named_by_offset(doc, record_time_ms, offset):
    """An event-level source has no unit field: each event is its own unit '#offset'."""
    _check(_EVENT_LEVEL, _encode(doc), record_time_ms, offset)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=20), st.builds(_encode, _any)))
def test_bytes_that_are_not_an_object_are_refused_with_the_models_reason(raw):
    """Bytes that are not a JSON object are never accepted, and get the model's reason."""
    assert _check(_PARSER, raw) is False


@pytest.mark.parametrize(
    "ts",
    [
        99_999_999_999,
        100_000_000_000,
        99_999_999_999.9,
        1e11,
        "1e11",
        "99999999999",
        -0.0,
        0,
        "-0",
        "nan",
        "inf",
        "2026-11-30T12:00:00Z",
        "2026-11-30T12:00:00+02:00",
        "1969-12-31T23:59:59Z",
        True,
        None,
    ],
)
@pytest.mark.parametrize("unit", ["u", "", "x" * 1024, "x" * 1025, 0, -3, True, 1.0, None])
def test_boundaries_answer_as_the_model(ts, unit):
    """The edges of each rule (the milliseconds threshold, 1970, unit length and type) on both sides."""
    _check(_PARSER, _encode({"user_id": unit, "ts": ts}), 1_790_000_000_000)


def test_the_model_is_not_vacuous():
    """The everyday event is accepted (float seconds kept, integer milliseconds divided), others refused."""
    assert _check(_PARSER, _encode({"user_id": "u1", "ts": 1_790_000_000.25, "eur": 12.5, "page": "a"}))
    assert _PARSER.parse(_encode({"user_id": 5, "ts": 1_790_000_000_000, "other": [1]})) == (
        "5",
        1_790_000_000.0,
        {"user_id": 5, "ts": 1_790_000_000_000},
    )
    assert _check(_PARSER, _encode({"user_id": "u1", "ts": "2026-11-30T12:00:00Z"}))
    assert not _check(_PARSER, _encode({"user_id": "u1", "ts": 1.0, "eur": True}))


def test_fields_no_metric_reads_only_need_to_be_json():
    """An unread field is never decoded: a number past the float range in one does not refuse the
    event; what is not JSON in UTF-8 still does, wherever it is (a field's name included)."""
    head = b'{"user_id": "u1", "ts": 1790000000, "other": '
    assert _PARSER.parse(head + b"1e999}").fields == {"user_id": "u1", "ts": 1790000000}
    assert _PARSER.parse(head + '"é用"}'.encode()).unit == "u1"
    for other in (b'"\xff\xfe"', b"NaN", b'"\\ud800"', b'"\\x"', b"[" * 2000 + b"]" * 2000, b"01", b"[1,]"):
        with pytest.raises(EventError) as error:
            _PARSER.parse(head + other + b"}")
        assert error.value.reason == "not_json", other
    named = b'{"\xffuser_id": "u1", "user_id": "u2", "ts": 1790000000}'  # not UTF-8 in a field's name
    assert _PARSER.parse_batch([named, head + b"1}"], [None, None], [0, 1]).invalid == [(0, "not_json")]


@pytest.mark.parametrize(
    ("field", "literal", "expected"),
    [
        ("user_id", b"18446744073709551615", "18446744073709551615"),  # the largest orjson integer
        ("user_id", b"18446744073709551616", "bad_unit"),  # orjson: a float
        ("user_id", b"-9223372036854775809", "bad_unit"),
        ("page", b"18446744073709551616", "bad_key"),
        ("page", b"-9223372036854775808", -(2**63)),
        ("eur", b"18446744073709551616", 1.8446744073709552e19),
        ("eur", b"1" + b"0" * 400, "not_json"),  # past the float range
        ("eur", b"1e999", "not_json"),
        ("ts", b"1" + b"0" * 400, "not_json"),
    ],
)
def test_read_numbers_are_what_orjson_gives(field, literal, expected):
    """A read field's integer is kept within [-2^63, 2^64) and is the nearest float past it, as orjson
    decodes it (so a unit or key that large is refused); a number past the float range is not JSON."""
    doc = {"user_id": "u1", "ts": 1_790_000_000}
    doc.pop(field, None)
    raw = json.dumps(doc)[:-1].encode() + b', "' + field.encode() + b'": ' + literal + b"}"
    if expected in REASONS:
        with pytest.raises(EventError) as error:
            _PARSER.parse(raw)
        assert error.value.reason == expected
        return
    event = _PARSER.parse(raw)
    got = event.unit if field == "user_id" else event.fields[field]
    assert got == expected and type(got) is type(expected)
    if field == "page":
        assert _PARSER.parse_batch([raw], [None], [0]).columns["page"] == [expected]


_TAILS = [
    b', "other": 1e999}',
    b', "eur": 1e999}',
    b', "other": "\xff"}',
    b', "user_id": 18446744073709551616}',
    b', "user_id": 9223372036854775808}',
    b', "page": -9223372036854775809}',
    b', "eur": 99999999999999999999}',
    b', "ts": true}',
    b', "page": "\xc3\xa9"}',
    b"} x",
]
"""Endings that make the two decoders' edges meet: past int64, past the float range, not UTF-8."""

_hostile = st.one_of(
    st.builds(_encode, _docs),
    st.binary(max_size=24),
    st.builds(lambda d, tail: _encode(d)[:-1] + tail, _docs.filter(bool), st.sampled_from(_TAILS)),
    st.none(),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(_hostile, _record_times), max_size=12))
def test_a_batch_is_parsed_as_each_of_its_events_alone(events):
    """`parse_batch` on hostile batches (bytes that are no JSON, tombstones, integers past int64, numbers
    past the float range, non-UTF-8 bytes, read and unread): the events `parse` accepts, with its unit,
    time and read fields, and the others with its reasons, in order."""
    raws = [raw for raw, _ in events]
    stamps = [stamp for _, stamp in events]
    offsets = list(range(100, 100 + len(events)))
    batch = _PARSER.parse_batch(raws, stamps, offsets)  # type: ignore[arg-type]  # tombstones: None
    accepted, refused = [], []
    for i, (raw, stamp) in enumerate(events):
        try:
            unit, ts, fields = _PARSER.parse(raw, stamp, offsets[i])  # type: ignore[arg-type]
        except EventError as exc:
            refused.append((i, exc.reason))
            continue
        accepted.append((i, unit, ts, fields.get("eur"), fields.get("page")))
    assert batch.invalid == refused
    assert [
        (i, unit, ts, eur, page)
        for i, unit, ts, eur, page in zip(
            batch.valid.tolist(),
            batch.units,
            batch.time.tolist(),
            batch.columns["eur"],
            batch.columns["page"],
            strict=True,
        )
    ] == accepted


def _nested(depth: int) -> bytes:
    """An event whose unread field nests `depth` arrays."""
    return b'{"user_id": "u1", "ts": 1790000000, "other": ' + b"[" * depth + b"]" * depth + b"}"


def _verdict(raw: bytes) -> str:
    try:
        _PARSER.parse(raw)
    except EventError as exc:
        return exc.reason
    return "accepted"


def _frames_below(frames: int, call: Any) -> Any:
    """`call()` with `frames` more Python frames on the stack."""
    return call() if frames == 0 else _frames_below(frames - 1, call)


def test_a_deep_event_gets_one_verdict_whatever_the_stack_or_batch():
    """How deep a document msgspec decodes follows what the stack leaves of the recursion limit; the
    verdict on an event must not: the same with 400 more frames on the stack, and in a batch whose
    other event sends the whole batch down the slow path."""
    depths = range(50, 1200, 50)
    verdicts = {d: _verdict(_nested(d)) for d in depths}
    assert set(verdicts.values()) == {"accepted", "not_json"}  # the limit lies in the range
    for d in depths:
        assert _frames_below(400, lambda d=d: _verdict(_nested(d))) == verdicts[d], d
        batch = _frames_below(300, lambda d=d: _PARSER.parse_batch([_nested(d), b"{"], [None, None], [0, 1]))
        assert batch.invalid == ([(1, "not_json")] if verdicts[d] == "accepted" else [(0, "not_json"), (1, "not_json")])
