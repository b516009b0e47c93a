"""Per-unit state over a budget period: `contribution.max_windows` and a running total's `max_per_period`.

Both rules are decided at each window's close, in the public close order (C(w), then start; for one
metric simply window order), for the units *present* in the window (holding a contribution that
survived per-window L0/L∞ bounding). Each reads the units' state as it stood before the window, so the
outcome does not depend on the order units are visited in; what a unit keeps is a function of its own
records only (windows never straddle a period: the loader refuses it). A new period starts from zero.
`decide` takes every window of one close call at once, on arrays: a unit's windows follow one another
in it as they would one close at a time (its count or amount carried from one to the next), so closing
windows one by one or many at once gives the same result, unless two units of one close share a key
(about 2^-64 even with 2^32 units): each then reads the shared state as it stood before the call, and
stays within its own bound.

- `WindowCaps` (`max_windows: m`): a unit whose count of windows this period is below m is included
  and its count goes up by one, whatever that window's release does; the others' contributions to the
  window are dropped (`capped_windows`, a curator-side count).
- `PeriodBound` (`max_per_period: L`, running totals): with r = L − what the unit used earlier this
  period, its contribution v to each key it holds (a count; for a sum the sum of its retained clamped
  values in grid units), taken in sorted key order, is cut to c = sign(v)·min(|v|, r), then r −= |c|;
  the unit's used amount grows by Σ|c|. The rest is dropped (`capped_period`, a curator-side count of
  the (unit, window, key) contributions cut). So Σ over the period's windows and keys of a unit's |c|
  is at most L. A sum's L is converted to grid units conservatively: ⌊L / 2^-E⌋.

State: per metric, the amounts used in the current period (windows counted, or |c| summed), keyed by a
16-byte BLAKE2b digest of the unit (`unit_key`), in the accumulator that bounds the unit (bounding is
global per unit: one partition holds all its records). A shared digest would join two units' amounts
and could move one's contributions with the other's records; at 128 bits that needs about 2^64 units
for an even chance, or 2^128 work to aim at a known unit. Memory, per unit active in the period: about
100 bytes of CPython heap (a 49-byte bytes key, a dict slot, the amount: a cached small int up to 256);
a `PeriodBound` amount past 256 is its own int object, 28 bytes more, so at most about 130 bytes. See
`tests/unit/test_pipeline_window_caps.py` and `tests/unit/test_pipeline_period_bound.py` for the measure.

Recovery: each close in which some unit used an amount yields a `CountDelta` (metric, period, window,
the units' keys, sorted, and the amount each used in that window; for `max_windows` the amount is 1
and not written, so those deltas keep their original bytes). Persisted: 16 bytes of key per unit and
window (21.3 in base64), plus, for `max_per_period`, the amount as a decimal JSON integer and a comma
(2 to 11 bytes: counts are small, a sum's grid units up to L·2^E), so at most 16·m bytes (max_windows)
or about 33 bytes times the windows a unit was present in (max_per_period) per active unit and period.
The driver persists them before it commits the progress point past that window; a restarted pipeline
applies the deltas of the current period below its progress point (`restore`) and rebuilds exactly the
state a clean run has, without replaying the period's events.
"""

from __future__ import annotations

__all__ = ["UNIT_KEY_BYTES", "CountDelta", "PeriodBound", "PeriodRule", "WindowCaps", "unit_key"]

import base64
import hashlib
import json
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import compress, repeat
from operator import add

import numpy as np

from dpstream.topology.errors import InternalError

UNIT_KEY_BYTES = 16
"""Size of a unit's state key: 128 bits, so a collision joining two units' state is out of reach."""

_NARROW = 1 << 62
"""A `max_per_period` bound below this is decided in int64 (a sum's amounts are at most the bound)."""

_PERSON = b"dpstream-maxwin"
"""BLAKE2b personalisation: these digests match no other hash of a unit in dpstream."""


def unit_key(unit: str) -> bytes:
    """The state key of a unit: a 16-byte BLAKE2b digest of its id (already HMAC'd when the source
    hashes unit ids); never logged, only persisted with the deltas.

    >>> len(unit_key("u1"))
    16
    """
    hasher = _HASHER.copy()
    hasher.update(unit.encode("utf-8", "surrogatepass"))
    return hasher.digest()


_HASHER = hashlib.blake2b(digest_size=UNIT_KEY_BYTES, person=_PERSON)
"""The keyed-and-personalised BLAKE2b state before any input: `unit_key` copies it (0.5 µs a unit
against 1.1 µs for a new `blake2b(..., person=...)`: its parameter block is set up once)."""


@dataclass(frozen=True)
class CountDelta:
    """What the units present in one window of a metric used of their period state: their keys, sorted
    (a function of the window alone), and the amount each used (`amounts`, aligned with `keys`; None
    for `max_windows`, where every included unit used one window)."""

    metric: str
    period_start: int
    window_start: int
    keys: tuple[bytes, ...]
    amounts: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if self.amounts is not None and (
            len(self.amounts) != len(self.keys)
            or (self.amounts and (set(map(type, self.amounts)) != {int} or min(self.amounts) < 1))
        ):
            raise InternalError(f"metric {self.metric!r}: a delta's amounts must be one positive int per key")

    def used(self) -> Iterator[tuple[bytes, int]]:
        """(unit key, amount used in this window) pairs."""
        if self.amounts is None:
            return ((key, 1) for key in self.keys)
        return zip(self.keys, self.amounts, strict=True)

    def to_bytes(self) -> bytes:
        """Compact JSON, the keys concatenated and base64-encoded (about 21.3 bytes per unit), the amounts
        (when any) a list of integers; a `max_windows` delta has no `amounts` field."""
        doc: dict[str, object] = {
            "metric": self.metric,
            "period": self.period_start,
            "start": self.window_start,
            "keys": base64.b64encode(b"".join(self.keys)).decode(),
        }
        if self.amounts is not None:
            doc["amounts"] = list(self.amounts)
        return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, raw: bytes) -> CountDelta:
        """Inverse of `to_bytes`; a malformed delta is a bug (only dpstream writes them)."""
        try:
            doc = json.loads(raw)
            blob = base64.b64decode(doc["keys"], validate=True)
            if len(blob) % UNIT_KEY_BYTES:
                raise ValueError("keys are not whole 16-byte digests")
            keys = tuple(blob[i : i + UNIT_KEY_BYTES] for i in range(0, len(blob), UNIT_KEY_BYTES))
            listed = doc.get("amounts")
            if listed is not None and (not isinstance(listed, list) or any(type(a) is not int for a in listed)):
                raise ValueError("amounts are not a list of integers")
            amounts = None if listed is None else tuple(listed)
            return cls(str(doc["metric"]), int(doc["period"]), int(doc["start"]), keys, amounts)
        except (ValueError, KeyError, TypeError, InternalError) as exc:
            raise InternalError(f"malformed period-state delta: {exc}") from exc


class PeriodRule:
    """The per-unit amounts of one metric in the current period, on the partition bounding the units:
    what `WindowCaps` and `PeriodBound` share (period entry, window order, restore from deltas)."""

    __slots__ = ("metric", "period_s", "period_start", "counts", "last_start")

    option = ""
    """The topology field of the rule (`contribution.<option>`), for messages."""
    amounts = True
    """Whether its deltas carry each unit's amount (False: every unit in a delta used 1)."""

    def __init__(self, metric: str, period_s: int) -> None:
        if period_s < 1:
            raise InternalError(f"metric {metric!r}: period {period_s} must be >= 1")
        self.metric = metric
        self.period_s = period_s
        self.period_start: int | None = None
        """The period the amounts are of (None before the first window closed or was restored)."""
        self.counts: dict[bytes, int] = {}
        """unit key → amount used this period (only units that used some)."""
        self.last_start: int | None = None
        """The last window start decided (or restored): windows are decided once, in order."""

    def _enter(self, window_start: int) -> int:
        """Move to the period of `window_start` (a new period starts from zero); its start."""
        if self.last_start is not None and window_start <= self.last_start:
            raise InternalError(f"metric {self.metric!r}: window {window_start} decided twice or out of order")
        period = window_start // self.period_s * self.period_s
        if period != self.period_start:
            self.period_start, self.counts = period, {}
        self.last_start = window_start
        return period

    def _periods(self, starts: Sequence[int]) -> Iterator[tuple[int, int, int]]:
        """The windows `starts` (consecutive closes, in order) period by period: (period start, first,
        end) index ranges, each entered only when the one before it has been decided."""
        lo = 0
        while lo < len(starts):
            period = self._enter(starts[lo])
            hi = lo + 1
            while hi < len(starts) and starts[hi] // self.period_s * self.period_s == period:
                self._enter(starts[hi])
                hi += 1
            yield period, lo, hi
            lo = hi

    def _segments(
        self, starts: Sequence[int], window: np.ndarray, unit: np.ndarray, keys: np.ndarray
    ) -> Iterator[tuple[int, int, int, np.ndarray, list[bytes]]]:
        """The entries of `decide`, period by period (`_periods`), skipping periods without any: (period
        start, first entry, end entry, each entry's unit as a dense id, each id's key)."""
        for period, lo, hi in self._periods(starts):
            a, b = np.searchsorted(window, [lo, hi]).tolist()
            if a < b:
                ids, digests = _units_of(unit[a:b], keys[a:b])
                yield period, a, b, ids, digests

    def _window_deltas(
        self,
        period: int,
        starts: Sequence[int],
        window: np.ndarray,
        keys: np.ndarray,
        use: np.ndarray,
        amounts: np.ndarray,
    ) -> list[CountDelta]:
        """One delta per window with entries `use`d: the keys of their units, sorted (units sharing a key
        are one), and the amounts each used."""
        picked = np.flatnonzero(use)
        if not len(picked):
            return []
        w, k, n = window[picked], keys[picked], amounts[picked]
        order, shared = _by_window_and_key(w, k)
        w, k, n = w[order], k[order], n[order]
        if shared is not None:  # units sharing a key: one unit's amounts
            w, k, n = w[shared], k[shared], np.add.reduceat(n, shared)
        cuts = np.flatnonzero(np.concatenate(([True], w[1:] != w[:-1]))).tolist() + [len(w)]
        keys_out, amounts_out, windows = k.tolist(), n.tolist(), w.tolist()
        return [
            CountDelta(
                self.metric,
                period,
                starts[windows[i]],
                tuple(keys_out[i:j]),
                tuple(amounts_out[i:j]) if self.amounts else None,
            )
            for i, j in zip(cuts[:-1], cuts[1:], strict=True)
        ]

    def _add(self, keys: list[bytes], used: list[int]) -> None:
        """Add `used` (each > 0) to the units' amounts (units sharing a key add up)."""
        counts = self.counts
        if len(set(keys)) < len(keys):
            for key, amount in zip(keys, used, strict=True):
                counts[key] = counts.get(key, 0) + amount
            return
        counts.update(zip(keys, map(add, map(counts.get, keys, repeat(0)), used), strict=True))

    def restore(self, deltas: Iterable[CountDelta], next_start: int) -> None:
        """Rebuild the amounts a clean run has just before window `next_start` closes, from the deltas
        persisted for this metric: those of `next_start`'s period below it, each window once (a delta
        written again after a restart is the same delta). Deltas of other metrics or periods are ignored."""
        period = next_start // self.period_s * self.period_s
        seen: set[int] = set()
        counts: dict[bytes, int] = {}
        last: int | None = None
        for d in deltas:
            if d.metric != self.metric or d.period_start != period or d.window_start >= next_start:
                continue
            if d.window_start in seen:
                continue
            seen.add(d.window_start)
            for key, amount in d.used():
                counts[key] = counts.get(key, 0) + amount
            last = d.window_start if last is None else max(last, d.window_start)
        self.period_start, self.counts = period, counts
        self.last_start = last


def _by_window_and_key(window: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """The order of entries by (window, key bytes), and where each distinct (window, key) starts in that
    order when some key repeats within a window (None: none does). One sort of an integer made of the
    window index and the key's leading bits; only when two entries of a window share those bits
    (about n²/2^49 for n entries in a window) are the whole keys compared, in a sort of every byte."""
    raw = np.frombuffer(b"".join(keys.tolist()), dtype=">u8").reshape(len(keys), -1)
    shift = max(int(window.max()).bit_length(), 1)
    if shift <= 16:
        packed = (window.astype(np.uint64) << np.uint64(64 - shift)) | (raw[:, 0] >> np.uint64(shift))
        order = np.argsort(packed)
        packed = packed[order]
        if not bool((packed[1:] == packed[:-1]).any()):
            return order, None
    order = np.lexsort((*(raw[:, i] for i in reversed(range(raw.shape[1]))), window))
    w, raw = window[order], raw[order]
    new = np.concatenate(([True], (w[1:] != w[:-1]) | (raw[1:] != raw[:-1]).any(axis=1)))
    return order, None if new.all() else np.flatnonzero(new)


def _units_of(unit: np.ndarray, keys: np.ndarray) -> tuple[np.ndarray, list[bytes]]:
    """The entries' units as dense ids 0..n-1 (by `unit`, the caller's unit ids), and each id's key."""
    _, first, ids = np.unique(unit, return_index=True, return_inverse=True)
    return ids.reshape(-1), keys[first].tolist()


def _by_unit(ids: np.ndarray, window: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries by unit then window (stable: a window's own order kept): the order, where each unit's run
    starts, and for each entry in that order whether it opens a new window of its unit."""
    order = np.argsort(ids, kind="stable")
    u, w = ids[order], window[order]
    unit_head = np.flatnonzero(np.concatenate(([True], u[1:] != u[:-1])))
    new_window = np.concatenate(([True], (u[1:] != u[:-1]) | (w[1:] != w[:-1])))
    return order, unit_head, new_window


class WindowCaps(PeriodRule):
    """`contribution.max_windows`: the per-unit window counts of one metric in the current period."""

    __slots__ = ("max_windows",)

    option = "max_windows"
    amounts = False

    def __init__(self, metric: str, max_windows: int, period_s: int) -> None:
        if max_windows < 1 or period_s < 1:
            raise InternalError(f"metric {metric!r}: max_windows {max_windows} and period {period_s} must be >= 1")
        super().__init__(metric, period_s)
        self.max_windows = max_windows

    def close(
        self, window_start: int, present: Iterable[str], keys: Mapping[str, bytes] | None = None
    ) -> tuple[list[str], CountDelta | None]:
        """`decide` one window for the units `present` by id (`keys`: their `unit_key`s, when the caller
        holds them): the units dropped, and the window's delta (None when none was included)."""
        units = list(present)
        digests = _objects([unit_key(u) for u in units] if keys is None else [keys[u] for u in units])
        every = np.arange(len(units))
        drop, deltas = self.decide([window_start], np.zeros(len(units), np.int64), every, digests)
        return list(compress(units, drop.tolist())), deltas[0] if deltas else None

    def decide(
        self, starts: Sequence[int], window: np.ndarray, unit: np.ndarray, keys: np.ndarray
    ) -> tuple[np.ndarray, list[CountDelta]]:
        """Decide the windows `starts` (consecutive closes, in order) for the units present in them: one
        entry per (window, unit), `window` its index into `starts` (ascending), `unit` the caller's id of
        its unit and `keys` that unit's key (`unit_key`). A unit is included in its windows while its count
        stays below max_windows: in its first max_windows − count of them, its count as it stood before
        these windows. Returns which entries are dropped, and the deltas of the windows that included some."""
        drop = np.zeros(len(unit), bool)
        deltas: list[CountDelta] = []
        for period, a, b, ids, digests in self._segments(starts, window, unit, keys):
            order, heads, new_window = _by_unit(ids, window[a:b])
            seen = np.cumsum(new_window)  # the unit's windows up to each entry
            rank = seen - np.repeat(seen[heads], np.diff(np.append(heads, len(order))))
            used = np.fromiter(map(self.counts.get, digests, repeat(0)), np.int64, len(digests))
            out = np.empty(b - a, bool)
            out[order] = used[ids[order]] + rank >= self.max_windows
            drop[a:b] = out
            taken = np.bincount(ids[~out], minlength=len(digests))
            self._add([digests[i] for i in np.flatnonzero(taken).tolist()], taken[taken > 0].tolist())
            ones = np.ones(b - a, np.int64)
            deltas += self._window_deltas(period, starts, window[a:b], keys[a:b], ~out, ones)
        return drop, deltas


class PeriodBound(PeriodRule):
    """`contribution.max_per_period: L`: what each unit used of L in the current period (events for a
    count, the absolute sum of its kept clamped values in grid units for a sum)."""

    __slots__ = ("bound",)

    option = "max_per_period"

    def __init__(self, metric: str, bound: int, period_s: int) -> None:
        if bound < 0 or period_s < 1:
            raise InternalError(f"metric {metric!r}: max_per_period {bound} and period {period_s} must be >= 0 and 1")
        super().__init__(metric, period_s)
        self.bound = bound
        """L in the metric's units: events, or grid units (2^-E) of a sum."""

    def close(
        self,
        window_start: int,
        present: Mapping[str, Sequence[tuple[str, int]]],
        keys: Mapping[str, bytes] | None = None,
    ) -> tuple[list[tuple[str, str, int, int]], CountDelta | None]:
        """`decide` one window for the units `present` by id (unit → its (key, v) contributions; `keys`:
        their `unit_key`s, when the caller holds them): the contributions cut, as (unit, key, v, c) with c
        the part kept (0: dropped whole), and the window's delta (None when none used any)."""
        units = list(present)
        flat = [(i, k, v) for i, u in enumerate(units) for k, v in sorted(present[u])]
        digests = [unit_key(u) for u in units] if keys is None else [keys[u] for u in units]
        ids = np.fromiter((i for i, _, _ in flat), np.int64, len(flat))
        kept, deltas = self.decide(
            [window_start],
            np.zeros(len(flat), np.int64),
            ids,
            _objects([digests[i] for i, _, _ in flat]),
            _objects([v for _, _, v in flat]),
        )
        cuts = [(units[i], k, v, c) for (i, k, v), c in zip(flat, kept.tolist(), strict=True) if c != v]
        return cuts, deltas[0] if deltas else None

    def decide(
        self, starts: Sequence[int], window: np.ndarray, unit: np.ndarray, keys: np.ndarray, amounts: np.ndarray
    ) -> tuple[np.ndarray, list[CountDelta]]:
        """Decide the windows `starts` (consecutive closes, in order) for the contributions present in them:
        one entry per (window, unit, key), in window order and, within a window, a unit's keys together in
        sorted key order; `window` is its index into `starts`, `unit` the caller's id of its unit, `keys`
        that unit's key (`unit_key`) and `amounts` its v (a count, or a sum in grid units). Each unit's
        entries, window by window and key by key, are cut to what is left of L: c = sign(v)·min(|v|, r),
        then r −= |c|, r starting from L less what the unit used before these windows. Returns each entry's
        c (0: dropped whole), and the deltas of the windows in which some unit used an amount."""
        kept_all = np.zeros(len(unit), object if amounts.dtype == object else np.int64)
        deltas: list[CountDelta] = []
        for period, a, b, ids, digests in self._segments(starts, window, unit, keys):
            asked = amounts[a:b]
            wide = asked.dtype == object or self.bound >= _NARROW
            if not wide and int(np.abs(asked).max()) * len(asked) >= _NARROW:
                asked, wide = asked.astype(object), True  # their running sums might not fit in int64
            order, heads, _ = _by_unit(ids, window[a:b])
            runs = np.diff(np.append(heads, len(order)))
            used = np.fromiter(map(self.counts.get, digests, repeat(0)), object if wide else np.int64, len(digests))
            left = np.maximum(self.bound - used, 0)
            size = np.abs(asked[order])
            before = np.cumsum(size) - size  # what the unit's earlier entries asked for
            before = before - np.repeat(before[heads], runs)
            kept_size = np.minimum(size, np.maximum(np.repeat(left[ids[order][heads]], runs) - before, 0))
            kept = np.empty(b - a, object if wide else np.int64)
            kept[order] = np.where(asked[order] < 0, -kept_size, kept_size)
            kept_all[a:b] = kept
            spent = np.add.reduceat(kept_size, heads)
            used_any = np.flatnonzero(spent != 0)
            self._add(
                [digests[i] for i in ids[order][heads][used_any].tolist()], [int(x) for x in spent[used_any].tolist()]
            )
            magnitude = np.abs(kept)
            deltas += self._window_deltas(period, starts, window[a:b], keys[a:b], magnitude != 0, magnitude)
        return kept_all, deltas


def _objects(items: list) -> np.ndarray:
    """A 1-d object array of `items`."""
    out = np.empty(len(items), object)
    out[:] = items
    return out
