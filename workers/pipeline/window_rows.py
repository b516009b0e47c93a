"""The rows of a bounded metric's open windows, and the per-(window, unit, key) groups they form.

A row is one (event, window) pair the metric took: its window start, unit and key codes (`codes`),
and for sums, means and quantiles its L∞ order key and clamped grid value. Rows wait in `Piles`
(one sorted chunk per batch) until their window closes; then they are grouped and bounded at once,
so a window's outcome is a function of the set of its rows, whatever order or batches they came in.
"""

from __future__ import annotations

__all__ = ["Pile", "Piles", "Groups", "group_rows"]

from typing import NamedTuple

import numpy as np

_EXACT_ROWS = 1 << 19
"""int64 sums of up to this many grid values below 2^43 cannot overflow; more are summed as Python ints."""


class Pile(NamedTuple):
    """Rows, column by column (one entry per row)."""

    start: np.ndarray
    """Window start (int64; Python ints in an object array past 2^52)."""
    unit: np.ndarray
    """Unit code (int64)."""
    key: np.ndarray
    """Key code (int64; 0 for an ungrouped metric)."""
    order: tuple[np.ndarray, ...]
    """The L∞ order key's columns, most significant first; () when only how many rows counts."""
    value: np.ndarray | None
    """Clamped grid value (int64, or Python ints when they may not fit); None for counts."""
    weight: np.ndarray | None
    """count_units: the events a row stands for (1, or more once compacted); None otherwise."""

    @property
    def length(self) -> int:
        """How many rows."""
        return len(self.start)

    def take(self, index: np.ndarray | slice) -> Pile:
        """The rows `index` selects."""
        return Pile(
            self.start[index],
            self.unit[index],
            self.key[index],
            tuple(c[index] for c in self.order),
            None if self.value is None else self.value[index],
            None if self.weight is None else self.weight[index],
        )

    @staticmethod
    def concat(piles: list[Pile]) -> Pile:
        """The rows of `piles`, one after the other."""
        if len(piles) == 1:
            return piles[0]
        first = piles[0]
        return Pile(
            np.concatenate([p.start for p in piles]),
            np.concatenate([p.unit for p in piles]),
            np.concatenate([p.key for p in piles]),
            tuple(np.concatenate([p.order[i] for p in piles]) for i in range(len(first.order))),
            None if first.value is None else np.concatenate([p.value for p in piles]),
            None if first.weight is None else np.concatenate([p.weight for p in piles]),
        )

    def by_start(self) -> Pile:
        """The rows sorted by window start (stable)."""
        start = self.start
        if len(start) < 2 or bool((start[1:] >= start[:-1]).all()):
            return self
        return self.take(np.argsort(start, kind="stable"))


class Piles:
    """The rows of open windows: one chunk per batch, each sorted by window start."""

    __slots__ = ("chunks", "rows")

    def __init__(self) -> None:
        self.chunks: list[Pile] = []
        self.rows = 0
        """Rows held."""

    def add(self, pile: Pile) -> None:
        if pile.length:
            self.chunks.append(pile.by_start())
            self.rows += pile.length

    def take_through(self, last_start: int) -> Pile | None:
        """Remove and return the rows of windows starting at or before `last_start` (None: none)."""
        out, keep = [], []
        for chunk in self.chunks:
            i = int(np.searchsorted(chunk.start, last_start, side="right"))
            if i:
                out.append(chunk.take(slice(0, i)))
            if i < chunk.length:
                keep.append(chunk if not i else chunk.take(slice(i, None)))
        self.chunks = keep
        if not out:
            return None
        taken = Pile.concat(out)
        self.rows -= taken.length
        return taken

    def drop_after(self, last_start: int) -> None:
        """Forget the rows of windows starting after `last_start`."""
        kept = self.take_through(last_start)
        self.chunks = [] if kept is None else [kept]
        self.rows = 0 if kept is None else kept.length

    def all(self) -> Pile | None:
        """Every row held, as one pile (the chunks are joined into it)."""
        if not self.chunks:
            return None
        joined = Pile.concat(self.chunks)
        self.chunks = [joined.by_start()]
        return self.chunks[0]


class Groups(NamedTuple):
    """Rows grouped per (window, unit, key), in (window, unit, key) order, with what L∞ keeps of each."""

    window: np.ndarray
    """The group's window (an index the caller chose)."""
    unit: np.ndarray
    key: np.ndarray
    size: np.ndarray
    """Rows in the group (count_units: the events they stand for)."""
    kept: np.ndarray
    """Rows L∞ keeps: the max_per_key of smallest (order key, value) (count_units: 1)."""
    kept_rows: np.ndarray
    """The rows kept (indexes into the pile), group by group."""
    amount: np.ndarray
    """What the group brings: its kept rows (counts), 1 (count_units), the sum of its kept values."""


def group_rows(window: np.ndarray, pile: Pile, max_per_key: int, units: int, keys: int) -> Groups:
    """Group a non-empty `pile` per (window, unit, key) (`window`: each row's window index; `units`,
    `keys`: bounds of the codes) and keep, per group, the `max_per_key` rows of smallest (order key,
    value): for counts any that many, for count_units one."""
    n_rows = pile.length
    width = int(window.max()) + 1
    if width * units * keys < 1 << 62:
        group = (window * units + pile.unit) * keys + pile.key
    else:  # pragma: no cover - millions of windows, units and keys at once
        stacked = np.stack([window, pile.unit, pile.key])
        group = np.unique(stacked, axis=1, return_inverse=True)[1].reshape(-1)
    order = np.argsort(group)  # (a group's rows in any order: L∞ sorts those it must choose among)
    ordered = group[order]
    heads = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])
    count = np.diff(np.r_[heads, n_rows])
    first = order[heads]
    g_window, g_unit, g_key = window[first], pile.unit[first], pile.key[first]
    if pile.weight is not None:  # count_units: how many events it saw, one kept
        one = np.ones(len(heads), np.int64)
        return Groups(g_window, g_unit, g_key, np.add.reduceat(pile.weight[order], heads), one, first, one)
    kept = np.minimum(count, max_per_key)
    over = count > max_per_key
    if pile.value is not None and over.any():  # the rows of groups past the bound, by order key then value
        at = np.flatnonzero(np.repeat(over, count))
        rows = order[at]
        value = pile.value[rows]
        if value.dtype == object:
            value = np.unique(value, return_inverse=True)[1].reshape(-1)
        owner = np.repeat(np.arange(len(heads)), count)[at]
        order[at] = rows[np.lexsort((value, *(c[rows] for c in reversed(pile.order)), owner))]
    kept_rows = order[np.arange(n_rows) - np.repeat(heads, count) < max_per_key] if over.any() else order
    if pile.value is None:  # a count: how many, whichever they were
        return Groups(g_window, g_unit, g_key, count, kept, kept_rows, kept)
    values = pile.value[kept_rows]
    if len(values) >= _EXACT_ROWS and values.dtype != object:
        values = values.astype(object)
    amount = np.add.reduceat(values, np.cumsum(kept) - kept)
    return Groups(g_window, g_unit, g_key, count, kept, kept_rows, amount)
