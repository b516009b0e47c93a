"""`PartialMerger`: the release side's merge of one metric's window partials across source partitions.

Every source partition emits a partial for every scheduled window, in order, empty ones included.
A window is complete once every expected partition has sent its partial for it (or one for a
later window: partitions emit contiguously, so an earlier one was sent and merged before). Only a
complete window is released: there is no deadline, so the true aggregate never depends on which
partial arrived first; a missing partial delays the release and shows up as release lag.

Partials are deduped by (window, partition); ones for a window already released are dropped. A
partial from a source whose partition count differs from the expected one is refused
(`PartitionCountChanged`): adding partitions mid-deployment would bound a unit once per
partition. The state is JSON-able (`to_state` / `from_state`) so a Faust changelogged Table can
hold it.
"""

from __future__ import annotations

__all__ = ["MergedWindow", "PartialMerger", "PartitionCountChanged", "merge_values"]

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dpstream.topology.errors import InternalError
from dpstream.workers.pipeline.partials import WindowPartial

_RELEASED_KEEP = 4096
"""Released window starts remembered for dedupe; older ones fall under `released_floor`."""


class PartitionCountChanged(Exception):
    """A partial says its source has a different number of partitions than the merger expects."""


@dataclass(frozen=True)
class MergedWindow:
    """The true aggregate of one metric window over every source partition."""

    metric: str
    start: int
    end: int
    values: dict[str, Any]


def merge_values(into: dict[str, Any], values: dict[str, Any]) -> None:
    """Add partial `values` into `into` key by key (numbers add; lists, [sum, count] pairs and
    quantile cell counts, add element by element)."""
    for key, v in values.items():
        cur = into.get(key)
        if cur is None:
            into[key] = list(v) if isinstance(v, list) else v
        elif isinstance(cur, list):  # a mean's [sum, count], or a quantile's cell counts
            for i, x in enumerate(v):
                cur[i] += x
        else:
            into[key] = cur + v


class _Pending:
    __slots__ = ("end", "reported", "values")

    def __init__(self, end: int) -> None:
        self.end = end
        self.reported: set[int] = set()
        self.values: dict[str, Any] = {}


class PartialMerger:
    """Merges the partials of one metric from `partitions` (the source topic's partition ids)."""

    def __init__(self, metric: str, partitions: Iterable[int]) -> None:
        self.metric = metric
        self.partitions = frozenset(partitions)
        if not self.partitions:
            raise InternalError(f"merger of metric {metric!r} built with no source partitions")
        self._pending: dict[int, _Pending] = {}
        self._latest: dict[int, int] = {}
        self._released: set[int] = set()
        self.released_floor: int | None = None
        self.duplicates = 0
        self.late = 0

    def add(self, partial: WindowPartial) -> list[MergedWindow]:
        """Take one partial; return the windows (in start order) that it completed."""
        if partial.metric != self.metric:
            raise InternalError(f"partial of {partial.metric!r} given to the merger of {self.metric!r}")
        p, s = partial.partition, partial.start
        if partial.partitions != len(self.partitions) or p not in self.partitions:
            raise PartitionCountChanged(
                f"metric {self.metric}: source topic {partial.topic} now reports {partial.partitions} partitions, "
                f"the release side expects {len(self.partitions)}; changing a source's partition count "
                "mid-deployment would bound a unit once per partition: restore the count, or deploy a new "
                "topology version on a new topic"
            )
        if s in self._released or (self.released_floor is not None and s < self.released_floor):
            self.late += 1
            return []
        if s > self._latest.get(p, s - 1):
            self._latest[p] = s
        pending = self._pending.get(s)
        if pending is None:
            pending = self._pending[s] = _Pending(partial.end)
        if p in pending.reported:
            self.duplicates += 1
        else:
            pending.reported.add(p)
            merge_values(pending.values, partial.values)
        return self._ready()

    def pending_windows(self) -> list[int]:
        """Starts of windows some partition reported that are not released yet (release lag)."""
        return sorted(self._pending)

    def drain(self) -> list[MergedWindow]:
        """End of a finite stream (every partition flushed): release everything pending."""
        return [self._release(s) for s in sorted(self._pending)]

    def _complete(self, s: int, w: _Pending) -> bool:
        latest = self._latest
        return all(p in w.reported or latest.get(p, s) > s for p in self.partitions)

    def _ready(self) -> list[MergedWindow]:
        ready = [s for s, w in self._pending.items() if self._complete(s, w)]
        return [self._release(s) for s in sorted(ready)]

    def _release(self, s: int) -> MergedWindow:
        w = self._pending.pop(s)
        self._released.add(s)
        if len(self._released) > _RELEASED_KEEP:
            keep = sorted(self._released)[-_RELEASED_KEEP // 2 :]
            self.released_floor = keep[0]
            self._released = set(keep)
        return MergedWindow(self.metric, s, w.end, w.values)

    # -- persistence ---------------------------------------------------------------------
    def to_state(self) -> dict[str, Any]:
        """JSON-able state (for a changelogged Table)."""
        return {
            "pending": {
                str(s): {"end": w.end, "reported": sorted(w.reported), "values": w.values}
                for s, w in self._pending.items()
            },
            "latest": {str(p): s for p, s in self._latest.items()},
            "released": sorted(self._released),
            "released_floor": self.released_floor,
        }

    @classmethod
    def from_state(cls, metric: str, partitions: Iterable[int], state: dict[str, Any]) -> PartialMerger:
        """Rebuild a merger from `to_state` output."""
        m = cls(metric, partitions)
        for s, doc in state.get("pending", {}).items():
            w = _Pending(int(doc["end"]))
            w.reported = set(doc["reported"])
            w.values = doc["values"]
            m._pending[int(s)] = w
        m._latest = {int(p): int(s) for p, s in state.get("latest", {}).items()}
        m._released = set(state.get("released", ()))
        m.released_floor = state.get("released_floor")
        return m
