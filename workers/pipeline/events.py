"""Parse and validate one source event: raw bytes → (unit, event time, fields), or an EventError.

Failures carry a reason from a fixed vocabulary (`REASONS`) so the dead-letter topic and the
`invalid` counter never need the raw value; messages name the field, never its content.
"""

from __future__ import annotations

__all__ = ["REASONS", "MAX_UNIT_LENGTH", "MAX_DEAD_LETTER_RAW", "Event", "DeadLetter", "EventParser", "decode_json"]

import base64
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from dpstream.topology.errors import EventError
from dpstream.topology.model import Source

try:  # optional: 3-4× faster decoding on the hot path; the stdlib is the fallback
    import orjson as _orjson

    decode_json: Callable[[bytes], Any] = _orjson.loads
    _DECODE_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError)
except ImportError:  # pragma: no cover - depends on the environment
    decode_json = json.loads
    _DECODE_ERRORS = (ValueError, TypeError, UnicodeDecodeError, RecursionError)

REASONS = (
    "not_json",
    "not_object",
    "missing_unit",
    "bad_unit",
    "missing_timestamp",
    "bad_timestamp",
    "bad_value",
    "bad_key",
    "future_timestamp",
    "key_mismatch",
    "out_of_range",
    "wrong_partition",
)
"""Every reason an event can be dead-lettered for."""

MAX_UNIT_LENGTH = 1024
"""A longer unit id (in characters) is `bad_unit`: no real person needs more, and each one held per
window costs its length in memory."""

MAX_DEAD_LETTER_RAW = 512 * 1024
"""Raw bytes kept in one dead letter; a longer event keeps its first bytes (`raw_truncated`, `raw_size`),
so the dead letter stays under Kafka's default 1 MiB message and request sizes (the partition and
offset still point at the whole event)."""

_MS_THRESHOLD = 100_000_000_000.0
"""Epoch numbers above this (year 5138 in seconds) are read as milliseconds."""


class Event(NamedTuple):
    """A validated event: its privacy unit (as str), event time (epoch s) and decoded fields.

    A NamedTuple, not a dataclass: it is built once per event on the hot path.
    """

    unit: str
    time: float
    fields: dict[str, Any]


@dataclass(frozen=True)
class DeadLetter:
    """An unusable event bound for the dead-letter topic: why and where, plus the raw bytes."""

    reason: str
    source: str
    topic: str
    partition: int
    offset: int
    raw: bytes

    def to_bytes(self) -> bytes:
        """JSON for the dead-letter topic; the raw event is base64 so any bytes survive (its first
        MAX_DEAD_LETTER_RAW bytes, with `raw_truncated` and `raw_size`, when it is longer)."""
        doc: dict[str, Any] = {
            "reason": self.reason,
            "source": self.source,
            "topic": self.topic,
            "partition": self.partition,
            "offset": self.offset,
            "raw_b64": base64.b64encode(self.raw[:MAX_DEAD_LETTER_RAW]).decode("ascii"),
        }
        if len(self.raw) > MAX_DEAD_LETTER_RAW:
            doc["raw_truncated"], doc["raw_size"] = True, len(self.raw)
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _parse_time(raw: object) -> float:
    """Epoch seconds from epoch seconds / milliseconds (number or numeric string) or ISO-8601 (always seconds)."""
    if isinstance(raw, bool):
        raise EventError("bad_timestamp", "boolean timestamp")
    if isinstance(raw, (int, float)):
        ts = float(raw)
    elif isinstance(raw, str):
        try:
            ts = float(raw)
        except ValueError:
            try:
                parsed = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
            except ValueError:
                raise EventError("bad_timestamp", "not epoch or ISO-8601") from None
            if parsed.tzinfo is None:
                raise EventError("bad_timestamp", "ISO-8601 time without a UTC offset") from None
            ts = parsed.timestamp()
            if not ts >= 0:
                raise EventError("bad_timestamp", "timestamp is not a finite time after 1970") from None
            return ts  # an ISO time is in seconds whatever its year (the milliseconds rule is for numbers)
    else:
        raise EventError("bad_timestamp", "timestamp is not a number or string")
    if not math.isfinite(ts) or ts < 0:
        raise EventError("bad_timestamp", "timestamp is not a finite time after 1970")
    return ts / 1000.0 if ts >= _MS_THRESHOLD else ts


class EventParser:
    """Validates events of one source; `value_fields` are the numeric fields some metric needs.

    A numeric field that is absent only keeps the event out of the metrics that need it; one
    that is present but not a finite number makes the whole event invalid (`bad_value`). Group-by
    fields (`key_fields`) work alike: absent is fine, present but not a string or integer is
    `bad_key`. Checking every field here means an event is used by all its metrics or by none.
    """

    def __init__(self, source: Source, value_fields: Iterable[str] = (), key_fields: Iterable[str] = ()) -> None:
        self.source = source
        self._unit_field = source.privacy_unit
        self._event_level = source.event_level
        self._ts_field = source.timestamp
        self._value_fields = tuple(sorted(set(value_fields)))
        self._key_fields = tuple(sorted(set(key_fields)))
        self.parse_fast = self._make_parse_fast()
        """`parse` for the hot path: same answers and reasons, as a plain tuple (see below)."""

    def _make_parse_fast(self) -> Callable[[bytes, int | None, int], tuple[str, float, dict[str, Any]]]:
        """`parse` specialised to this source: the common shape (a JSON object with a non-empty string
        unit, epoch-seconds number time, finite numbers and string keys where present) is checked
        inline and returned as a tuple; anything else goes, already decoded, to the general
        `_parse_object`, which accepts the other shapes and names the reason for the rest. A
        property test shows it answers as `parse` does."""
        if self._event_level or self._ts_field is None:
            return self.parse
        unit_field, ts_field = self._unit_field, self._ts_field
        value_fields, key_fields = self._value_fields, self._key_fields
        loads, isfinite, ms, general = decode_json, math.isfinite, _MS_THRESHOLD, self._parse_object

        def parse_fast(
            raw: bytes, record_time_ms: int | None = None, offset: int = 0
        ) -> tuple[str, float, dict[str, Any]]:
            try:
                obj = loads(raw)
            except _DECODE_ERRORS:
                raise EventError("not_json") from None
            if type(obj) is not dict:
                return general(obj, record_time_ms, offset)
            unit = obj.get(unit_field)
            if type(unit) is not str or not unit or len(unit) > MAX_UNIT_LENGTH:
                return general(obj, record_time_ms, offset)
            ts: Any = obj.get(ts_field)  # narrowed by the exact type() checks below
            tt = type(ts)
            if tt is float:
                if not 0.0 <= ts < ms:
                    return general(obj, record_time_ms, offset)
            elif tt is int and 0 <= ts < ms:
                ts = float(ts)
            else:
                return general(obj, record_time_ms, offset)
            for name in value_fields:
                v = obj.get(name)
                if v is not None and type(v) is not int and (type(v) is not float or not isfinite(v)):
                    return general(obj, record_time_ms, offset)
            for name in key_fields:
                k = obj.get(name)
                if k is not None and type(k) is not str:
                    return general(obj, record_time_ms, offset)
            return unit, ts, obj

        return parse_fast

    def parse(self, raw: bytes, record_time_ms: int | None = None, offset: int = 0) -> Event:
        """The validated event, or raise EventError(reason). `offset` names event-level units."""
        try:
            obj = decode_json(raw)
        except _DECODE_ERRORS:
            raise EventError("not_json") from None
        return self._parse_object(obj, record_time_ms, offset)

    def _parse_object(self, obj: Any, record_time_ms: int | None, offset: int) -> Event:  # noqa: C901 - per-event hot path: pipeline_core 17 µs/event; one call per event
        """`parse` after decoding: every accepted shape, or EventError naming the reason."""
        if type(obj) is not dict:
            raise EventError("not_object")
        if self._event_level:
            unit = f"#{offset}"
        else:
            u = obj.get(self._unit_field)
            tu = type(u)
            if tu is str:
                if not u:
                    raise EventError("missing_unit", self._unit_field)
                if len(u) > MAX_UNIT_LENGTH:
                    raise EventError("bad_unit", f"{self._unit_field} is longer than {MAX_UNIT_LENGTH} characters")
                unit = u
            elif tu is int:
                unit = str(u)
            elif u is None:
                raise EventError("missing_unit", self._unit_field)
            else:
                raise EventError("bad_unit", f"{self._unit_field} is not a string or integer")
        ts_raw = obj.get(self._ts_field) if self._ts_field is not None else None
        if ts_raw is None:
            if record_time_ms is None or record_time_ms < 0:
                raise EventError("missing_timestamp", self._ts_field or "record time")
            ts = record_time_ms / 1000.0
        elif type(ts_raw) is float and 0.0 <= ts_raw < _MS_THRESHOLD:
            ts = ts_raw  # the common case, fast: epoch seconds with a fraction
        elif type(ts_raw) is int and 0 <= ts_raw < _MS_THRESHOLD:
            ts = float(ts_raw)
        else:
            ts = _parse_time(ts_raw)
        for name in self._value_fields:
            v = obj.get(name)
            if v is None:
                continue
            tv = type(v)
            if tv is int:
                continue
            if tv is not float or not math.isfinite(v):
                raise EventError("bad_value", f"{name} is not a finite number")
        for name in self._key_fields:
            k = obj.get(name)
            if k is not None and type(k) is not str and type(k) is not int:
                raise EventError("bad_key", f"{name} is not a string or integer")
        return Event(unit, ts, obj)
