"""`EventParser.parse` against a slow, plainly written model of the event rules: the same event, or the
same dead-letter reason, on random objects with right, wrong and missing fields."""

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
from dpstream.workers.pipeline.events import decode_json

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
    return unit, ts, obj


def _check(parser: EventParser, raw: bytes, record_time_ms: int | None = None, offset: int = 7) -> bool:
    """True when the model accepts `raw`; asserts `parse` gave the model's event or raised its reason."""
    expected = _model(parser, raw, record_time_ms, offset)
    if isinstance(expected, str):
        with pytest.raises(EventError) as error:
            parser.parse(raw, record_time_ms, offset)
        assert error.value.reason == expected
        return False
    unit, ts, fields = parser.parse(raw, record_time_ms, offset)
    assert (unit, ts, fields) == expected
    assert type(unit) is str and type(ts) is float and math.isfinite(ts)
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
    assert _PARSER.parse(_encode({"user_id": 5, "ts": 1_790_000_000_000})) == (
        "5",
        1_790_000_000.0,
        {"user_id": 5, "ts": 1_790_000_000_000},
    )
    assert _check(_PARSER, _encode({"user_id": "u1", "ts": "2026-11-30T12:00:00Z"}))
    assert not _check(_PARSER, _encode({"user_id": "u1", "ts": 1.0, "eur": True}))
