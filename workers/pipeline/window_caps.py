"""Per-unit state over a budget period: `contribution.max_windows` and a running total's `max_per_period`.

Both rules are decided at each window's close, in the public close order (C(w), then start; for one
metric simply window order), for the units *present* in the window (holding a contribution that
survived per-window L0/L∞ bounding). Each reads the units' state as it stood before the window, so the
outcome does not depend on the order units are visited in; what a unit keeps is a function of its own
records only (windows never straddle a period: the loader refuses it). A new period starts from zero.

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

from dpstream.topology.errors import InternalError

UNIT_KEY_BYTES = 16
"""Size of a unit's state key: 128 bits, so a collision joining two units' state is out of reach."""

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
            len(self.amounts) != len(self.keys) or any(type(a) is not int or a < 1 for a in self.amounts)
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

    def _commit(self, period: int, window_start: int, spent: dict[bytes, int]) -> CountDelta | None:
        """Add what each unit used in the window to its amount; the window's delta (None if none used any)."""
        if not spent:
            return None
        counts = self.counts
        for key, amount in spent.items():
            counts[key] = counts.get(key, 0) + amount
        keys = tuple(sorted(spent))
        amounts = tuple(spent[k] for k in keys) if self.amounts else None
        return CountDelta(self.metric, period, window_start, keys, amounts)

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
        """Decide window `window_start` for the units `present` in it: return the units to drop (their
        count had reached max_windows) and the delta of the included ones (None when none was).
        `keys`: each present unit's `unit_key`, when the caller holds them (None: hashed here)."""
        period = self._enter(window_start)
        counts, cap = self.counts, self.max_windows
        included: dict[bytes, int] = {}
        dropped: list[str] = []
        for unit in present:
            key = unit_key(unit) if keys is None else keys[unit]
            if counts.get(key, 0) < cap:  # counts as they stood before this window: order-free
                included[key] = 1
            else:
                dropped.append(unit)
        return dropped, self._commit(period, window_start, included)


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
        """Decide window `window_start` for the units `present` in it (unit → its (key, v) contributions,
        v a count or a sum in grid units): return the contributions cut, as (unit, key, v, c) with c the
        part kept (0: dropped whole), and the delta of the amounts used (None when none was). `keys`:
        each present unit's `unit_key`, when the caller holds them (None: hashed here)."""
        period = self._enter(window_start)
        counts, bound = self.counts, self.bound
        spent: dict[bytes, int] = {}
        cuts: list[tuple[str, str, int, int]] = []
        for unit, contributions in present.items():
            key = unit_key(unit) if keys is None else keys[unit]
            left = max(0, bound - counts.get(key, 0))  # as it stood before this window: order-free
            used = 0
            for k, v in sorted(contributions):
                c = v if -left <= v <= left else (left if v > 0 else -left)
                if c != v:
                    cuts.append((unit, k, v, c))
                left -= abs(c)
                used += abs(c)
            if used:
                spent[key] = spent.get(key, 0) + used
        return cuts, self._commit(period, window_start, spent)
