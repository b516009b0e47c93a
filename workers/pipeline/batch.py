"""`EventBatch`: the validated events of one fetched batch, column by column, as the accumulators read them.

Each column holds one entry per event, in record order: the unit (a code into the batch's distinct unit
ids), the event time, the horizon (arrival time − allowed lateness: a window ending before it had closed
when the event arrived), the record offset, and the L∞ order key (source append time, source partition,
source offset), or the offset itself when the driver gives none. Group-by and value fields are read
from the decoded objects once per batch and field, whatever number of metrics use them, and so are the
order keys' ranks and Python values.
"""

from __future__ import annotations

__all__ = ["EventBatch", "KeyColumn", "ValueColumn", "objects"]

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np

from dpstream.workers.pipeline.window_caps import unit_key

_NO_KEY, _UNDECLARED = -1, -2
"""Key codes of an event without the group field, and of one whose key is not declared."""


class KeyColumn(NamedTuple):
    """One group-by field over a batch: a code per event (≥ 0: index into `keys`; -1: no field; -2: a
    key outside the declared ones) and the distinct keys, as str (an integer key is its decimal string)."""

    code: np.ndarray
    keys: np.ndarray
    """The distinct keys (object array of str)."""
    alone: list[tuple[str]]
    """Each key as a 1-tuple (a unit's only key in a window, shared rather than built per unit)."""


class ValueColumn(NamedTuple):
    """One numeric field over a batch: whether each event has it, and its value as float (NaN where absent)."""

    present: np.ndarray
    value: np.ndarray


@dataclass(eq=False)
class EventBatch:
    """Validated events, column-wise; build with `EventBatch.of`."""

    units: list[str]
    """The batch's distinct unit ids; `unit` holds indexes into it."""
    unit: np.ndarray
    """int64: each event's unit, as an index into `units`."""
    time: np.ndarray
    """float64: event time, epoch seconds."""
    horizon: np.ndarray
    """float64: arrival (append) time − allowed lateness."""
    offset: np.ndarray
    """int64: the record offset (a window's first offset, for the safe commit)."""
    fields: Sequence[dict[str, Any]]
    """The decoded objects."""
    order: tuple[np.ndarray, ...] | None = None
    """The L∞ order key as columns, most significant first (the pipeline's: source append time, source
    partition, source offset); None: the offset."""
    columns: Mapping[str, list[Any]] = field(default_factory=dict)
    """Fields already read out of `fields` (name → one value per event, None where absent)."""
    _names: np.ndarray | None = field(default=None, repr=False)
    _keys: dict[tuple[str, frozenset[str] | None], KeyColumn] = field(default_factory=dict, repr=False)
    _values: dict[str, ValueColumn] = field(default_factory=dict, repr=False)
    _rank: tuple[np.ndarray, bool] | None = field(default=None, repr=False)
    _order_keys: list[Any] | None = field(default=None, repr=False)
    _digests: np.ndarray | None = field(default=None, repr=False)

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
        """A batch from per-event unit ids (coded here) and the other columns."""
        distinct = list(dict.fromkeys(units))
        code = dict(zip(distinct, range(len(distinct)), strict=True))
        unit = np.fromiter(map(code.__getitem__, units), np.int64, len(units))
        return cls(distinct, unit, time, horizon, offset, fields, order, columns or {})

    def __len__(self) -> int:
        return len(self.unit)

    def column(self, name: str) -> list[Any]:
        """The field `name` of every event (None where absent)."""
        got = self.columns.get(name)
        return got if got is not None else [f.get(name) for f in self.fields]

    def unit_names(self) -> np.ndarray:
        """`units` as an object array (so a column of unit indexes maps to ids in one step)."""
        if self._names is None:
            self._names = objects(self.units)
        return self._names

    def unit_digests(self) -> np.ndarray:
        """Each of `units`' period-state key (`window_caps.unit_key`), as an object array; hashed once
        per batch, whatever number of metrics and windows need them."""
        if self._digests is None:
            self._digests = objects(list(map(unit_key, self.units)))
        return self._digests

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
        got = self._keys[(name, declared)] = KeyColumn(code, objects(keys), [(k,) for k in keys])
        return got

    def values(self, name: str) -> ValueColumn:
        """The numeric field `name` over the batch, as float (`float(v)` of each int or float); cached."""
        got = self._values.get(name)
        if got is not None:
            return got
        column = self.column(name)
        if None in column:
            present = np.fromiter((v is not None for v in column), bool, len(column))
            column = [_NAN if v is None else v for v in column]
        else:
            present = np.ones(len(column), bool)
        value = np.fromiter(map(float, column), np.float64, len(column))
        got = self._values[name] = ValueColumn(present, value)
        return got

    def order_rank(self) -> tuple[np.ndarray, bool]:
        """Each event's L∞ order key as a dense rank over the batch (int64; equal keys, equal ranks), and
        whether the keys are distinct. Keys already increasing in record order (a partition read in order)
        rank as their positions."""
        if self._rank is None:
            n = len(self)
            columns = (self.offset,) if self.order is None else self.order  # most significant first
            greater = np.zeros(max(n - 1, 0), bool)
            tied = np.ones(max(n - 1, 0), bool)
            for c in columns:
                greater |= tied & (c[1:] > c[:-1])
                tied &= c[1:] == c[:-1]
            if greater.all():
                self._rank = (np.arange(n, dtype=np.int64), True)
            else:
                by = np.lexsort(columns[::-1])
                step = np.zeros(n, np.int64)
                for c in columns:
                    ordered = c[by]
                    step[1:] |= ordered[1:] != ordered[:-1]
                rank = np.empty(n, np.int64)
                rank[by] = np.cumsum(step)
                self._rank = (rank, bool(step[1:].all()))
        return self._rank

    def order_keys(self, rows: np.ndarray) -> list[Any]:
        """The L∞ order keys of events `rows` as Python values: tuples (e.g. (append time, partition,
        offset)), or the offsets when the batch has no order columns. Built once per batch."""
        if self._order_keys is None:
            if self.order is None:
                self._order_keys = self.offset.tolist()
            else:
                self._order_keys = list(zip(*(c.tolist() for c in self.order), strict=True))
        return list(map(self._order_keys.__getitem__, rows.tolist()))


_NAN = float("nan")


def objects(items: Sequence[Any]) -> np.ndarray:
    """A 1-d object array of `items` (numpy would make a fixed-width str array of a list of str, and an
    int64 one of a list of ints)."""
    out = np.empty(len(items), object)
    out[:] = items
    return out
