"""Parse and validate one source event: raw bytes → (unit, event time, fields), or an EventError.

Failures carry a reason from a fixed vocabulary (`REASONS`) so the dead-letter topic and the
`invalid` counter never need the raw value; messages name the field, never its content.
"""

from __future__ import annotations

__all__ = [
    "REASONS",
    "ParsedBatch",
    "MAX_UNIT_LENGTH",
    "MAX_DEAD_LETTER_RAW",
    "Event",
    "DeadLetter",
    "EventParser",
    "decode_json",
    "unit_of",
]

import base64
import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

import numpy as np

from dpstream.topology.errors import EventError
from dpstream.topology.model import Source

try:  # optional: 3-4× faster decoding on the hot path; the stdlib is the fallback
    import orjson as _orjson

    decode_json: Callable[[bytes], Any] = _orjson.loads
    _DECODE_ERRORS: tuple[type[BaseException], ...] = (ValueError, TypeError)
    _FINITE_FLOATS = True
    """orjson refuses NaN, Infinity and numbers past the float range: every float it gives is finite."""
except ImportError:  # pragma: no cover - depends on the environment
    decode_json = json.loads
    _DECODE_ERRORS = (ValueError, TypeError, UnicodeDecodeError, RecursionError)
    _FINITE_FLOATS = False

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

    A NamedTuple, not a dataclass: `parse` builds one per event (the batch path builds columns instead).
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


def unit_of(raw: object, field: str) -> str:
    """The privacy unit a unit field's value names, as str, or EventError: a non-empty string of at
    most MAX_UNIT_LENGTH characters, or an integer (its decimal string)."""
    if type(raw) is str:
        if not raw:
            raise EventError("missing_unit", field)
        if len(raw) > MAX_UNIT_LENGTH:
            raise EventError("bad_unit", f"{field} is longer than {MAX_UNIT_LENGTH} characters")
        return raw
    if type(raw) is int:
        return str(raw)
    if raw is None:
        raise EventError("missing_unit", field)
    raise EventError("bad_unit", f"{field} is not a string or integer")


def _parse_time(raw: object) -> float:
    """Epoch seconds from epoch seconds / milliseconds (number or numeric string) or ISO-8601 (always seconds)."""
    if type(raw) is float or type(raw) is int:
        ts = float(raw)
    elif type(raw) is str:
        try:
            ts = float(raw)
        except ValueError:
            return _parse_iso(raw)
    else:  # bool included: JSON true / false is not a time
        raise EventError("bad_timestamp", "timestamp is not a number or string")
    if not 0.0 <= ts < math.inf:  # NaN fails this too
        raise EventError("bad_timestamp", "timestamp is not a finite time after 1970")
    return ts / 1000.0 if ts >= _MS_THRESHOLD else ts


def _parse_iso(raw: str) -> float:
    """Epoch seconds of an ISO-8601 time with a UTC offset (always seconds, whatever its year)."""
    try:
        parsed = datetime.fromisoformat(raw.replace("Z", "+00:00") if raw.endswith("Z") else raw)
    except ValueError:
        raise EventError("bad_timestamp", "not epoch or ISO-8601") from None
    if parsed.tzinfo is None:
        raise EventError("bad_timestamp", "ISO-8601 time without a UTC offset")
    ts = parsed.timestamp()
    if not ts >= 0:
        raise EventError("bad_timestamp", "timestamp is not a finite time after 1970")
    return ts


_NUMBER = frozenset({int, float})
_NUMBER_OR_NONE = frozenset({int, float, type(None)})
_KEY_OR_NONE = frozenset({str, int, type(None)})


def _decoded_or_none(raw: bytes | None) -> Any:
    """The decoded event, or None when it is no JSON (`parse` then says so)."""
    try:
        return decode_json(raw)  # type: ignore[arg-type]
    except _DECODE_ERRORS:
        return None


def _plain_number(v: object) -> bool:
    """A value field as the common shape has it: absent, an integer or a finite float."""
    return v is None or type(v) is int or (type(v) is float and math.isfinite(v))


class ParsedBatch(NamedTuple):
    """A batch of raw events after `EventParser.parse_batch`: the valid ones column-wise, the others by reason."""

    valid: np.ndarray
    """int64: positions (in the batch) of the valid events, ascending."""
    units: list[str]
    """Their privacy units."""
    time: np.ndarray
    """float64: their event times (epoch s)."""
    fields: list[dict[str, Any]]
    """Their decoded objects."""
    columns: dict[str, list[Any]]
    """Their value and key fields (name → one value per valid event, None where absent)."""
    invalid: list[tuple[int, str]]
    """(position, reason) of every invalid event, ascending."""


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

    def parse(self, raw: bytes, record_time_ms: int | None = None, offset: int = 0) -> Event:
        """The validated event, or raise EventError(reason). `offset` names event-level units."""
        try:
            obj = decode_json(raw)
        except _DECODE_ERRORS:
            raise EventError("not_json") from None
        if type(obj) is not dict:
            raise EventError("not_object")
        unit = f"#{offset}" if self._event_level else unit_of(obj.get(self._unit_field), self._unit_field)
        ts_raw = obj.get(self._ts_field) if self._ts_field is not None else None
        if ts_raw is not None:
            ts = _parse_time(ts_raw)
        elif record_time_ms is not None and record_time_ms >= 0:
            ts = record_time_ms / 1000.0
        else:
            raise EventError("missing_timestamp", self._ts_field or "record time")
        for name in self._value_fields:
            v = obj.get(name)
            if v is not None and type(v) is not int and (type(v) is not float or not math.isfinite(v)):
                raise EventError("bad_value", f"{name} is not a finite number")
        for name in self._key_fields:
            k = obj.get(name)
            if k is not None and type(k) is not str and type(k) is not int:
                raise EventError("bad_key", f"{name} is not a string or integer")
        return Event(unit, ts, obj)

    def parse_batch(
        self, raws: list[bytes | None], record_times_ms: list[int | None], offsets: list[int]
    ) -> ParsedBatch:
        """`parse` over a batch, decided column by column: the events of the common shape (a JSON
        object whose unit is a non-empty string or an integer, whose time is a number or absent with a
        record time, whose values are numbers and keys strings or integers) are checked at once; every
        other event goes through `parse` itself, which gives its reason (or accepts it). Same events,
        same reasons, in the same order as `parse` one by one."""
        n = len(raws)
        try:
            objs: list[Any] = list(map(decode_json, raws))  # type: ignore[arg-type]  # None: not_json, below
        except _DECODE_ERRORS:
            objs = [_decoded_or_none(raw) for raw in raws]
        odd = np.zeros(n, bool)  # events `parse` decides one by one
        if set(map(type, objs)) != {dict}:
            odd |= np.fromiter((type(o) is not dict for o in objs), bool, n)
            objs = [o if type(o) is dict else {} for o in objs]
        if self._event_level:
            units = [f"#{o}" for o in offsets]
        else:
            units = [o.get(self._unit_field) for o in objs]
            if set(map(type, units)) != {str}:
                odd |= np.fromiter((type(u) is not str and type(u) is not int for u in units), bool, n)
                units = [str(u) if type(u) is int else u if type(u) is str else "" for u in units]
            lengths = np.fromiter(map(len, units), np.int64, n)
            odd |= (lengths == 0) | (lengths > MAX_UNIT_LENGTH)
        time = self._times(objs, record_times_ms, odd)
        columns: dict[str, list[Any]] = {}
        for name in self._value_fields:
            column = columns[name] = [o.get(name) for o in objs]
            kinds = set(map(type, column))
            if not kinds <= _NUMBER_OR_NONE or (
                float in kinds
                and not _FINITE_FLOATS
                and not np.isfinite(np.fromiter((v for v in column if type(v) is float), float)).all()
            ):
                odd |= np.fromiter((not _plain_number(v) for v in column), bool, n)
        for name in self._key_fields:
            column = columns[name] = [o.get(name) for o in objs]
            if not set(map(type, column)) <= _KEY_OR_NONE:
                odd |= np.fromiter((type(k) not in _KEY_OR_NONE for k in column), bool, n)
        if not odd.any():
            return ParsedBatch(np.arange(n), units, time, objs, columns, [])
        invalid: list[tuple[int, str]] = []
        for i in np.flatnonzero(odd).tolist():
            try:
                unit, ts, obj = self.parse(raws[i], record_times_ms[i], offsets[i])  # type: ignore[arg-type]
            except EventError as exc:
                invalid.append((i, exc.reason))
                continue
            units[i], time[i] = unit, ts  # obj is the object decoded above: its columns hold
            odd[i] = False
        good = np.flatnonzero(~odd)
        keep = good.tolist()
        return ParsedBatch(
            good,
            [units[i] for i in keep],
            time[good],
            [objs[i] for i in keep],
            {name: [column[i] for i in keep] for name, column in columns.items()},
            invalid,
        )

    def _times(self, objs: list[dict[str, Any]], record_times_ms: list[int | None], odd: np.ndarray) -> np.ndarray:
        """Event times of a batch (epoch s) as `parse` reads them; marks in `odd` the events whose time
        `parse` must decide: not a number (an ISO-8601 string, say), not a finite time after 1970, or
        absent without a record time."""
        n = len(objs)
        column: list[Any] = [o.get(self._ts_field) for o in objs] if self._ts_field is not None else [None] * n
        if set(map(type, column)) <= _NUMBER:  # the common shape: a number each
            raw = np.fromiter(map(float, column), np.float64, n)
            odd |= ~((raw >= 0.0) & (raw < math.inf))  # NaN fails this too
            return np.where(raw >= _MS_THRESHOLD, raw / 1000.0, raw)
        numeric = np.fromiter((type(v) in _NUMBER for v in column), bool, n)
        absent = np.fromiter((v is None for v in column), bool, n)
        raw = np.fromiter((float(v) if type(v) in _NUMBER else 0.0 for v in column), np.float64, n)
        record = np.fromiter((-1.0 if t is None else float(t) for t in record_times_ms), np.float64, n)
        usable = absent & (record >= 0.0)  # the record time stands in for an absent time
        odd |= ~((numeric & (raw >= 0.0) & (raw < math.inf)) | usable)
        return np.where(usable, record / 1000.0, np.where(raw >= _MS_THRESHOLD, raw / 1000.0, raw))
