"""Parse and validate one source event: raw bytes → (unit, event time, fields), or an EventError.

Failures carry a reason from a fixed vocabulary (`REASONS`) so the dead-letter topic and the
`invalid` counter never need the raw value; messages name the field, never its content.

An event is decoded into the fields the topology reads (its projection, with msgspec), so a field no
metric reads costs no decoding: it must be JSON in UTF-8 (syntax, escapes, nesting), and is never
looked at again (its numbers' range is not checked). A field that is read holds what orjson would
give: an integer outside [-2^63, 2^64) becomes the nearest float, and a number past the float range
makes the event `not_json`.
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
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime
from operator import attrgetter
from typing import Annotated, Any, NamedTuple

import msgspec
import numpy as np
import orjson

from dpstream.topology.errors import EventError
from dpstream.topology.model import Source

decode_json: Callable[[bytes], Any] = orjson.loads
"""A whole JSON document, as the read fields of an event decode (see the module docstring)."""

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


_INT_RANGE = (-(1 << 63), 1 << 64)
"""Integers orjson decodes as integers: [-2^63, 2^64). Past them it gives the nearest float."""

_INT64 = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
_BATCH_FIELD = _INT64 | float | str | bool | list | dict | None
"""A read field in the batch decoder: any JSON value, but an integer only within int64 (one outside it
refuses the event there, and `parse` decides it, as orjson would)."""
_BATCH_UNIT = (
    _INT64 | Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_UNIT_LENGTH)] | float | bool | list | dict | None
)
"""The unit field in the batch decoder: a string only when `unit_of` would take it as it is."""

_NUMBER = frozenset({int, float})
_NUMBER_OR_NONE = frozenset({int, float, type(None)})
_KEY_OR_NONE = frozenset({str, int, type(None)})


def _plain_number(v: object) -> bool:
    """A value field as the common shape has it: absent, an integer or a finite float."""
    return v is None or type(v) is int or (type(v) is float and math.isfinite(v))


def _utf8(raw: bytes) -> bool:
    """Whether `raw` is UTF-8 (msgspec checks only the strings it decodes)."""
    if raw.isascii():
        return True
    try:
        raw.decode()
    except UnicodeDecodeError:
        return False
    return True


def _decode(decode: Callable[[Any], Any], raw: bytes | None) -> Any:
    """`decode(raw)`; a document nested too deep for the stack it ran on is decoded again at a fixed,
    shallow stack (`_decode_afresh`), so whether it decodes depends on the document alone."""
    try:
        return decode(raw)
    except RecursionError:
        return _decode_afresh(decode, raw)


_afresh: ThreadPoolExecutor | None = None


def _decode_afresh(decode: Callable[[Any], Any], raw: bytes | None) -> Any:
    """`decode(raw)` on a thread of its own, its stack the same shallow one every time: msgspec refuses
    a document as deep as what is left of the recursion limit, which the caller's stack would set."""
    global _afresh  # noqa: PLW0603 - one thread, started the first time a document needs it
    if _afresh is None:
        _afresh = ThreadPoolExecutor(1, thread_name_prefix="dpstream-deep-json")
    return _afresh.submit(decode, raw).result()


class ParsedBatch(NamedTuple):
    """A batch of raw events after `EventParser.parse_batch`: the valid ones column-wise, the others by reason."""

    valid: np.ndarray
    """int64: positions (in the batch) of the valid events, ascending."""
    units: list[str]
    """Their privacy units."""
    time: np.ndarray
    """float64: their event times (epoch s)."""
    columns: dict[str, list[Any]]
    """Their value and key fields (name → one value per valid event, None where absent or null)."""
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
        unit = () if self._event_level else (self._unit_field,)
        stamp = () if self._ts_field is None else (self._ts_field,)
        self._read = tuple(dict.fromkeys((*unit, *stamp, *self._value_fields, *self._key_fields)))
        """The fields the topology reads, each once (a field can be both a unit and a key, say)."""
        attrs = [f"f{i}" for i in range(len(self._read))]
        rename = dict(zip(attrs, self._read, strict=True))
        one = msgspec.defstruct("Event", [(a, Any, None) for a in attrs], rename=rename, gc=False)
        kinds = [
            _BATCH_UNIT if name == self._unit_field and not self._event_level else _BATCH_FIELD for name in self._read
        ]
        batch = msgspec.defstruct(
            "BatchEvent", [(a, kind, None) for a, kind in zip(attrs, kinds, strict=True)], rename=rename, gc=False
        )
        self._decode_one = msgspec.json.Decoder(one).decode
        self._decode_batch = msgspec.json.Decoder(batch).decode
        self._getters = {name: attrgetter(a) for a, name in rename.items()}
        self._absent = batch()
        """Stands in for an event the batch decoder refused (`parse` decides it)."""

    def parse(self, raw: bytes, record_time_ms: int | None = None, offset: int = 0) -> Event:
        """The validated event, or raise EventError(reason). `offset` names event-level units. Its
        `fields` are the fields the topology reads that the event has (not null)."""
        obj = self._read_fields(raw)
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

    def unit(self, raw: bytes | None) -> str | None:
        """The event's privacy unit as `parse` reads it (None for an event-level source, which has no
        unit field), or EventError when it has none; for routing an event to its unit's partition."""
        if self._event_level:
            return None
        return unit_of(self._read_fields(raw).get(self._unit_field), self._unit_field)

    def _read_fields(self, raw: bytes | None) -> dict[str, Any]:
        """The fields the topology reads, decoded (absent and null ones left out), or EventError:
        `not_json` (bytes that are no JSON, or a read number past the float range), `not_object`."""
        if raw is not None and not _utf8(raw):
            raise EventError("not_json")
        try:
            decoded = _decode(self._decode_one, raw)
        except msgspec.ValidationError:  # JSON, but not an object, or a number past the float range
            try:
                _decode(msgspec.json.decode, raw)
            except (msgspec.DecodeError, RecursionError):
                raise EventError("not_json") from None
            raise EventError("not_object") from None
        except (msgspec.DecodeError, TypeError, RecursionError):  # (a ValidationError is caught above)
            raise EventError("not_json") from None
        out: dict[str, Any] = {}
        for name, get in self._getters.items():
            v = get(decoded)
            if v is None:
                continue
            if type(v) is int and not _INT_RANGE[0] <= v < _INT_RANGE[1]:
                try:
                    v = float(v)  # as orjson decodes it
                except OverflowError:
                    raise EventError("not_json") from None
            out[name] = v
        return out

    def parse_batch(
        self, raws: list[bytes | None], record_times_ms: list[int | None], offsets: list[int]
    ) -> ParsedBatch:
        """`parse` over a batch, decided column by column: the events of the common shape (a JSON
        object whose unit is a non-empty string or an integer, whose time is a number or absent with a
        record time, whose values are numbers and keys strings or integers, every integer within int64)
        are checked at once; every other event goes through `parse` itself, which gives its reason (or
        accepts it). Same events, same reasons, in the same order as `parse` one by one."""
        n = len(raws)
        decode = self._decode_batch
        try:
            objs: list[Any] = list(map(decode, raws))  # type: ignore[arg-type]  # None: refused, below
        except (msgspec.MsgspecError, TypeError, RecursionError):
            objs = [self._batch_or_none(raw) for raw in raws]
        try:
            utf8 = all(map(bytes.isascii, raws))  # type: ignore[arg-type]  # None: TypeError, below
        except TypeError:  # a tombstone
            utf8 = False
        if not utf8:  # msgspec checks no UTF-8 in what it skips: `parse` refuses what is not UTF-8
            objs = [o if raw is not None and _utf8(raw) else None for o, raw in zip(objs, raws, strict=True)]
        odd = np.zeros(n, bool)  # events `parse` decides one by one
        if None in objs:
            odd |= np.fromiter((o is None for o in objs), bool, n)
            absent = self._absent
            objs = [absent if o is None else o for o in objs]
        columns = {name: list(map(get, objs)) for name, get in self._getters.items()}
        if self._event_level:
            units = [f"#{o}" for o in offsets]
        else:
            units = columns[self._unit_field]  # a str here is 1 to MAX_UNIT_LENGTH characters (_BATCH_UNIT)
            if set(map(type, units)) != {str}:
                odd |= np.fromiter((type(u) is not str and type(u) is not int for u in units), bool, n)
                units = [str(u) if type(u) is int else u if type(u) is str else "" for u in units]
        time = self._times(columns, record_times_ms, odd)
        for name in self._value_fields:
            if not set(map(type, columns[name])) <= _NUMBER_OR_NONE:
                odd |= np.fromiter((not _plain_number(v) for v in columns[name]), bool, n)
        for name in self._key_fields:
            if not set(map(type, columns[name])) <= _KEY_OR_NONE:
                odd |= np.fromiter((type(k) not in _KEY_OR_NONE for k in columns[name]), bool, n)
        wanted = {name: columns[name] for name in (*self._value_fields, *self._key_fields)}
        if not odd.any():
            return ParsedBatch(np.arange(n), units, time, wanted, [])
        invalid: list[tuple[int, str]] = []
        for i in np.flatnonzero(odd).tolist():
            try:
                unit, ts, fields = self.parse(raws[i], record_times_ms[i], offsets[i])  # type: ignore[arg-type]
            except EventError as exc:
                invalid.append((i, exc.reason))
                continue
            units[i], time[i] = unit, ts
            for name, column in wanted.items():
                column[i] = fields.get(name)
            odd[i] = False
        good = np.flatnonzero(~odd)
        keep = good.tolist()
        return ParsedBatch(
            good,
            [units[i] for i in keep],
            time[good],
            {name: [column[i] for i in keep] for name, column in wanted.items()},
            invalid,
        )

    def _batch_or_none(self, raw: bytes | None) -> Any:
        """The event as the batch decoder reads it, or None when it refuses it (`parse` then decides)."""
        try:
            return _decode(self._decode_batch, raw)
        except (msgspec.MsgspecError, TypeError, RecursionError):
            return None

    def _times(self, columns: dict[str, list[Any]], record_times_ms: list[int | None], odd: np.ndarray) -> np.ndarray:
        """Event times of a batch (epoch s) as `parse` reads them; marks in `odd` the events whose time
        `parse` must decide: not a number (an ISO-8601 string, say), not a finite time after 1970, or
        absent without a record time."""
        n = len(record_times_ms)
        column: list[Any] = columns[self._ts_field] if self._ts_field is not None else [None] * n
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
