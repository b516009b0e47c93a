"""`CanonicalOrder`: a scope's releases pending in this process are priced one at a time, in the
public order (`order_key`: window end, P(w), metric), whichever of them was ready first.

Adaptive pricing reads what the period has spent so far, so a release priced before an earlier one
of the same scope costs something else than it would in order: a worker catching up on a backlog
after a restart, or two metrics whose partials arrive in a different interleaving, would otherwise
turn processing timing into prices. Every release is registered when it enters the protocol
(before its first await) and takes its turn only when no earlier registered release of its scope
is still pending; one that fails leaves the queue, so the later ones are not held by it. The
ledger prices in the same order whatever ran (`allocation.price_in_order`): this queue only spares
it the backlog's extra read when the releases ready together are all in this process.
"""

from __future__ import annotations

__all__ = ["CanonicalOrder", "OrderKey", "Ticket", "order_key"]

import asyncio
import heapq
from typing import NamedTuple

from dpstream.topology.model import Metric, Topology


class OrderKey(NamedTuple):
    """A release's place in the public order of its period: its window end, its publish time P(w),
    its metric (one window of a metric ends at a given time)."""

    window_end: int
    publish_time: int
    metric: str


def order_key(topology: Topology, metric: Metric, window_end: int) -> OrderKey:
    """The place of `metric`'s release of the window ending at `window_end` in the public order."""
    return OrderKey(window_end, topology.publish_time(metric, window_end), metric.name)


class Ticket:
    """One registered release: its key, and whether it has left the queue."""

    __slots__ = ("key", "seq", "left")

    def __init__(self, key: OrderKey, seq: int) -> None:
        self.key, self.seq, self.left = key, seq, False

    def __lt__(self, other: Ticket) -> bool:
        return (self.key, self.seq) < (other.key, other.seq)


class CanonicalOrder:
    """One scope's pricing turn: `enter` registers a release, `turn` waits until it is the
    earliest one registered and nothing else is being priced, `leave` ends its turn or drops it
    from the queue (idempotent: a ticket leaves once)."""

    def __init__(self) -> None:
        self._pending: list[Ticket] = []
        self._busy: Ticket | None = None
        self._seq = 0
        self._changed = asyncio.Event()

    def enter(self, key: OrderKey) -> Ticket:
        """Register a release that will be priced (synchronous: call it before the first await)."""
        self._seq += 1
        ticket = Ticket(key, self._seq)
        heapq.heappush(self._pending, ticket)
        return ticket

    def _earliest(self) -> Ticket | None:
        while self._pending and self._pending[0].left:
            heapq.heappop(self._pending)
        return self._pending[0] if self._pending else None

    async def turn(self, ticket: Ticket) -> None:
        """Wait until `ticket` is the earliest registered release and no other is being priced."""
        while self._busy is not None or self._earliest() is not ticket:
            self._changed.clear()
            await self._changed.wait()
        self._busy = ticket

    def leave(self, ticket: Ticket) -> None:
        """End `ticket`'s turn, or drop it from the queue if it never had one (it failed or was known)."""
        if ticket.left:
            return
        ticket.left = True
        if self._busy is ticket:
            self._busy = None
        self._earliest()
        self._changed.set()

    def __len__(self) -> int:
        """Releases registered and not yet left."""
        return sum(1 for t in self._pending if not t.left)
