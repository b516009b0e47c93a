"""Copies of one source record seen twice on a by-unit topic count once.

The repartition hop copies each source record to `<topic>.by-unit` and commits after the acks, so a
hop that dies between the two copies those records again on restart. Counted twice, a copy would
change a window's true aggregate, which must not depend on what the hop went through (see dpstream.topology, rule 3).
Each copy carries its source position (partition:offset, a header, nothing about the unit); the
by-unit partition's pipeline keeps the positions of the events that may still land in an open
window and skips a position it has already seen. Copies of one record have one unit, hence one
by-unit partition, so one pipeline sees them all. The position also orders the copies for
bounding (`position_order`), so which of a unit's events survive does not depend on the hop.
"""

from __future__ import annotations

__all__ = ["SOURCE_POSITION_HEADER", "SeenCopies", "position_order", "source_position", "source_position_of"]

from collections import deque
from typing import Any

SOURCE_POSITION_HEADER = "dpstream-source-position"
"""Header of a hop copy: b"<source partition>:<source offset>"."""


def source_position(partition: int, offset: int) -> bytes:
    """The header value naming one source record."""
    return b"%d:%d" % (partition, offset)


def source_position_of(record: Any) -> bytes | None:
    """The source position a hop copy carries (None for a record without one)."""
    for name, value in getattr(record, "headers", None) or ():
        if name == SOURCE_POSITION_HEADER:
            return bytes(value)
    return None


def position_order(position: bytes, fallback: tuple[int, int]) -> tuple[int, int]:
    """(source partition, source offset) of a header value: with the source append time (the
    copy's timestamp), the order key bounding keeps the smallest of, whatever order the hop
    delivered the copies in. `fallback` for a header that is not "<int>:<int>" (not the hop's)."""
    partition, _, offset = position.partition(b":")
    try:
        return int(partition), int(offset)
    except ValueError:
        return fallback


class SeenCopies:
    """Source positions of the events counted on one by-unit partition, kept while they may still
    land in a window not yet emitted (event time at or after the earliest next window of any metric).

    Positions are dropped from the oldest added on, while their event time is below the floor: O(1)
    per event over time. An event added out of time order may outlive its need behind a later one;
    that only keeps memory a little longer (a kept position is never wrong to skip: its windows
    are emitted, so a copy of it would be late anyway)."""

    def __init__(self) -> None:
        self._ts: dict[bytes, float] = {}
        self._order: deque[tuple[float, bytes]] = deque()
        self.skipped = 0
        """Copies skipped because their source position had been counted already."""

    def __contains__(self, position: bytes) -> bool:
        return position in self._ts

    def __len__(self) -> int:
        return len(self._ts)

    def add(self, position: bytes, event_time: float) -> None:
        """Remember a counted event's position (its copies are skipped while it can still count)."""
        self._ts[position] = event_time
        self._order.append((event_time, position))

    def forget_before(self, floor: float) -> None:
        """Drop the positions of events timed before `floor`, oldest added first: every window that
        could hold them has been emitted, so a copy of them would be late anyway."""
        order, ts = self._order, self._ts
        while order and order[0][0] < floor:
            _, position = order.popleft()
            ts.pop(position, None)
