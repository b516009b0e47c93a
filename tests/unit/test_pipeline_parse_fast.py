"""The hot path's `parse_fast` answers as the full `parse` does: same event, or the same dead-letter reason."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpstream.topology.errors import EventError
from dpstream.topology.loader import load_topology_text
from dpstream.workers.pipeline import EventParser

_YAML = """
version: 1
sources:
  clicks: {topic: t.clicks, privacy_unit: user_id, timestamp: ts}
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
sinks: {releases: t.rel, dead_letter: t.dlq}
"""
_SOURCE = load_topology_text(_YAML).sources["clicks"]
_PARSER = EventParser(_SOURCE, value_fields=["eur"], key_fields=["page"])

_any = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.text(max_size=5),
    st.floats(allow_nan=True, allow_infinity=True),
    st.lists(st.integers(), max_size=2),
)
_times = st.one_of(
    st.floats(min_value=-10.0, max_value=2e11),
    st.integers(min_value=-10, max_value=2 * 10**11),
    st.sampled_from(["1790000000", "2026-11-30T12:00:00Z", "2026-11-30T12:00:00", "soon", ""]),
    _any,
)
_docs = st.fixed_dictionaries(
    {},
    optional={
        "user_id": st.one_of(st.text(max_size=4), st.integers(min_value=-5, max_value=5), _any),
        "ts": _times,
        "eur": st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), _any),
        "page": st.one_of(st.sampled_from(["a", "b", "c"]), st.integers(), _any),
        "other": _any,
    },
)


def _encode(doc: object) -> bytes:
    return json.dumps(doc, allow_nan=True).encode()  # NaN/Infinity tokens are not JSON: parsers must reject them


def _check(raw: bytes) -> bool:
    """True when parse accepts `raw`; asserts parse_fast gave the same event or raised the same reason."""
    try:
        full = _PARSER.parse(raw, None, 7)
    except EventError as exc:
        with pytest.raises(EventError) as fast_error:
            _PARSER.parse_fast(raw, None, 7)
        assert fast_error.value.reason == exc.reason, "parse_fast gave another reason than parse"
        return False
    unit, ts, fields = _PARSER.parse_fast(raw, None, 7)
    assert (unit, ts, fields) == (full.unit, full.time, full.fields)
    assert type(ts) is float and math.isfinite(ts)
    return True


@settings(max_examples=1500, deadline=None)
@given(_docs)
def test_parse_fast_agrees_with_parse_on_objects(doc):
    """Random objects with right, wrong and missing fields: the same event or the same reason."""
    _check(_encode(doc))


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=20), st.builds(_encode, _any)))
def test_parse_fast_rejects_non_objects_as_parse_does(raw):
    """Bytes that are not a JSON object are never accepted, and get parse's reason."""
    assert _check(raw) is False


def test_the_common_shape_takes_the_inline_path():
    """The everyday event (string unit, float seconds, finite value, string key) is answered inline (a
    plain tuple); a millisecond time goes to the general path (an Event); both as parse answers."""
    raw = _encode({"user_id": "u1", "ts": 1_790_000_000.25, "eur": 12.5, "page": "a"})
    assert _check(raw) is True and type(_PARSER.parse_fast(raw)) is tuple
    ms = _encode({"user_id": "u1", "ts": 1_790_000_000_000})
    assert _check(ms) is True and type(_PARSER.parse_fast(ms)) is not tuple
