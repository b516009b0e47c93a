"""`contribution.max_windows`: per unit, how many windows of a metric it has counted in this period.

The rule, applied at each window's close, in the public close order (C(w), then start; for one
metric simply window order): the units *present* in the window (holding a contribution that
survived per-window bounding) whose count is below m are included and their count goes up by one,
whatever that window's release does; the others' contributions to the window are dropped
(`capped_windows`, a curator-side count). The decision reads the counts as they stood before the
window, so it does not depend on the order units are visited in; which windows a unit counts in
is a function of its own records only (windows never straddle a period: the loader refuses it).

State: the counts of the current period, keyed by a 16-byte BLAKE2b digest of the unit (`unit_key`),
in the accumulator that bounds the unit (bounding is global per unit: one partition holds all its
records). A shared digest would join two units' counts and could move one's windows with the
other's records; at 128 bits that needs about 2^64 units for an even chance, or 2^128 work to aim
at a known unit. Memory: about 100 bytes of CPython heap per unit active in the period (a 49-byte
bytes key, a dict slot, the count); see `tests/unit/test_pipeline_window_caps.py` for the measure.

Recovery: each close with a unit included yields a `CountDelta` (metric, period, window, the
included units' keys: 16 bytes each, so at most 16·m bytes per active unit and period). The driver
persists them before it commits the progress point past that window; a restarted pipeline applies
the deltas of the current period below its progress point (`WindowCaps.restore`) and rebuilds
exactly the counts a clean run has, without replaying the period's events.
"""

from __future__ import annotations

__all__ = ["UNIT_KEY_BYTES", "CountDelta", "WindowCaps", "unit_key"]

import base64
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass

from dpstream.topology.errors import InternalError

UNIT_KEY_BYTES = 16
"""Size of a unit's counter key: 128 bits, so a collision joining two units' counts is out of reach."""

_PERSON = b"dpstream-maxwin"
"""BLAKE2b personalisation: these digests match no other hash of a unit in dpstream."""


def unit_key(unit: str) -> bytes:
    """The counter key of a unit: a 16-byte BLAKE2b digest of its id (already HMAC'd when the source
    hashes unit ids); never logged, only persisted with the count deltas.

    >>> len(unit_key("u1"))
    16
    """
    return hashlib.blake2b(unit.encode("utf-8", "surrogatepass"), digest_size=UNIT_KEY_BYTES, person=_PERSON).digest()


@dataclass(frozen=True)
class CountDelta:
    """The units one window of a metric counted in: their keys, sorted (a function of the window alone)."""

    metric: str
    period_start: int
    window_start: int
    keys: tuple[bytes, ...]

    def to_bytes(self) -> bytes:
        """Compact JSON, the keys concatenated and base64-encoded (about 21.3 bytes per unit)."""
        doc = {
            "metric": self.metric,
            "period": self.period_start,
            "start": self.window_start,
            "keys": base64.b64encode(b"".join(self.keys)).decode(),
        }
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
            return cls(str(doc["metric"]), int(doc["period"]), int(doc["start"]), keys)
        except (ValueError, KeyError, TypeError) as exc:
            raise InternalError(f"malformed max_windows count delta: {exc}") from exc


class WindowCaps:
    """The per-unit window counts of one metric in the current period, on the partition bounding them."""

    __slots__ = ("metric", "max_windows", "period_s", "period_start", "counts", "last_start")

    def __init__(self, metric: str, max_windows: int, period_s: int) -> None:
        if max_windows < 1 or period_s < 1:
            raise InternalError(f"metric {metric!r}: max_windows {max_windows} and period {period_s} must be >= 1")
        self.metric = metric
        self.max_windows = max_windows
        self.period_s = period_s
        self.period_start: int | None = None
        """The period the counts are of (None before the first window closed or was restored)."""
        self.counts: dict[bytes, int] = {}
        """unit key → windows of this period the unit counted in (only units that counted in one)."""
        self.last_start: int | None = None
        """The last window start decided (or restored): windows are decided once, in order."""

    def _enter(self, window_start: int) -> int:
        """Move to the period of `window_start` (a new period starts from zero counts); its start."""
        if self.last_start is not None and window_start <= self.last_start:
            raise InternalError(f"metric {self.metric!r}: window {window_start} decided twice or out of order")
        period = window_start // self.period_s * self.period_s
        if period != self.period_start:
            self.period_start, self.counts = period, {}
        self.last_start = window_start
        return period

    def close(self, window_start: int, present: Iterable[str]) -> tuple[list[str], CountDelta | None]:
        """Decide window `window_start` for the units `present` in it: return the units to drop (their
        count had reached max_windows) and the delta of the included ones (None when none was)."""
        period = self._enter(window_start)
        counts, cap = self.counts, self.max_windows
        included: set[bytes] = set()
        dropped: list[str] = []
        for unit in present:
            key = unit_key(unit)
            if counts.get(key, 0) < cap:  # counts as they stood before this window: order-free
                included.add(key)
            else:
                dropped.append(unit)
        for key in included:
            counts[key] = counts.get(key, 0) + 1
        if not included:
            return dropped, None
        return dropped, CountDelta(self.metric, period, window_start, tuple(sorted(included)))

    def restore(self, deltas: Iterable[CountDelta], next_start: int) -> None:
        """Rebuild the counts a clean run has just before window `next_start` closes, from the deltas
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
            for key in d.keys:
                counts[key] = counts.get(key, 0) + 1
            last = d.window_start if last is None else max(last, d.window_start)
        self.period_start, self.counts = period, counts
        self.last_start = last
