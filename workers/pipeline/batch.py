"""`EventBatch`: the validated events of one fetched batch, column by column, as the accumulators read them.

Each column holds one entry per event, in record order: the unit id, the event time, the horizon
(arrival time − allowed lateness: a window ending before it had closed when the event arrived), the
record offset, and the L∞ order key (source append time, source partition, source offset), or the
offset itself when the driver gives none. Group-by and value fields are read from the decoded objects
once per batch and field, whatever number of metrics use them, and so are the whole seconds of the
event times and the units' codes in a partition's code table (`codes`).
"""

from __future__ import annotations

__all__ = ["EventBatch", "KeyColumn", "ValueColumn", "objects"]

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from dpstream.topology.errors import InternalError
from dpstream.workers.pipeline.codes import Codes

_NO_KEY, _UNDECLARED = -1, -2
"""Key codes of an event without the group field, and of one whose key is not declared."""


class KeyColumn(NamedTuple):
    """One group-by field over a batch: a code per event (≥ 0: index into `keys`; -1: no field; -2: a
    key outside the declared ones) and the distinct keys, as str (an integer key is its decimal string)."""

    code: np.ndarray
    keys: np.ndarray
    """The distinct keys (object array of str)."""


class ValueColumn(NamedTuple):
    """One numeric field over a batch: whether each event has it, and its value as float (NaN where absent)."""

    present: np.ndarray
    value: np.ndarray


@dataclass(eq=False)
class EventBatch:
    """Validated events, column-wise; build with `EventBatch.of`."""

    units: Sequence[str]
    """Each event's unit id."""
    time: np.ndarray
    """float64: event time, epoch seconds."""
    horizon: np.ndarray
    """float64: arrival (append) time − allowed lateness."""
    offset: np.ndarray
    """int64: the record offset (a window's first offset, for the safe commit)."""
    fields: Sequence[dict[str, Any]]
    """The decoded objects (empty when `columns` holds every field read)."""
    order: tuple[np.ndarray, ...] | None = None
    """The L∞ order key as columns, most significant first (the pipeline's: source append time, source
    partition, source offset); None: the offset."""
    columns: Mapping[str, list[Any]] = field(default_factory=dict)
    """Fields already read out of `fields` (name → one value per event, None where absent)."""
    _keys: dict[tuple[str, frozenset[str] | None], KeyColumn] = field(default_factory=dict, repr=False)
    _values: dict[str, ValueColumn] = field(default_factory=dict, repr=False)
    _codes: tuple[Codes, int, np.ndarray] | None = field(default=None, repr=False)
    _seconds: np.ndarray | None = field(default=None, repr=False)

    @classmethod
    def of(
        cls,
        units: Sequence[str],
        time: np.ndarray,
        horizon: np.ndarray,
        offset: np.ndarray,
        fields: Sequence[dict[str, Any]],
        order: tuple[np.ndarray, ...] | None = None,
        columns: Mapping[str, list[Any]] | None = None,
    ) -> EventBatch:
        """A batch from per-event unit ids and the other columns."""
        return cls(units, time, horizon, offset, fields, order, columns or {})

    def __len__(self) -> int:
        return len(self.time)

    def column(self, name: str) -> list[Any]:
        """The field `name` of every event (None where absent)."""
        got = self.columns.get(name)
        if got is not None:
            return got
        if len(self.fields) != len(self.time):  # pragma: no cover - a batch built without a field it needs
            raise InternalError(f"field {name!r} was not read for this batch")
        return [f.get(name) for f in self.fields]

    def unit_codes(self, codes: Codes) -> np.ndarray:
        """Each event's unit as its code in `codes` (int64); once per batch and table."""
        got = self._codes
        if got is None or got[0] is not codes or got[1] != codes.generation:
            got = self._codes = (codes, codes.generation, codes.column(self.units))
        return got[2]

    def seconds(self) -> np.ndarray | None:
        """⌊event time⌋ of each event (int64), shared by every metric's window grid (⌊⌊t⌋ / every⌋ is
        ⌊t / every⌋); None when some time is past 2^52 s, where a float is not an exact second."""
        if self._seconds is None and len(self.time) and float(self.time.max()) < _EXACT_SECONDS:
            self._seconds = np.floor(self.time).astype(np.int64)
        return self._seconds

    def keys(self, name: str, declared: frozenset[str] | None) -> KeyColumn:
        """The group-by field `name` coded over the batch (see `KeyColumn`); cached per field and key list."""
        got = self._keys.get((name, declared))
        if got is not None:
            return got
        column = self.column(name)
        keys: list[str] = []
        index: dict[str, int] = {}
        raw_code: dict[Any, int] = {}
        for raw in dict.fromkeys(column):  # raw values: str, int or None (the parser refused the rest)
            if raw is None:
                raw_code[raw] = _NO_KEY
                continue
            key = raw if type(raw) is str else str(raw)
            if declared is not None and key not in declared:
                raw_code[raw] = _UNDECLARED
                continue
            c = index.get(key)
            if c is None:
                c = index[key] = len(keys)
                keys.append(key)
            raw_code[raw] = c
        code = np.fromiter(map(raw_code.__getitem__, column), np.int64, len(column))
        got = self._keys[(name, declared)] = KeyColumn(code, objects(keys))
        return got

    def values(self, name: str) -> ValueColumn:
        """The numeric field `name` over the batch, as float (`float(v)` of each int or float); cached.
        numpy reads None as NaN, and a value read is never NaN (JSON has none)."""
        got = self._values.get(name)
        if got is not None:
            return got
        value = np.array(self.column(name), np.float64)
        got = self._values[name] = ValueColumn(~np.isnan(value), value)
        return got


_EXACT_SECONDS = float(1 << 52)


def objects(items: Sequence[Any]) -> np.ndarray:
    """A 1-d object array of `items` (numpy would make a fixed-width str array of a list of str, and an
    int64 one of a list of ints)."""
    out = np.empty(len(items), object)
    out[:] = items
    return out
