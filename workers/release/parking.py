"""Parked (poison) windows on the release side: what the ledger holds parked, and the parks made here.

A window whose release keeps failing on an internal error is parked in the ledger (`Ledger.park`,
audited: scope, release_id, metric, window, attempts, error class) after the dispatcher's
`max_attempts`; it stays in the metric's changelogged `releasing` state, held, until an operator runs
`dpstream budget retry`. The ledger's list is the truth (it outlives this process and is shared by
every worker); `Parking` keeps a copy, refreshed by the sweeper timer and updated by its own parks.
A retried window that is released leaves the ledger's list (`unpark`, audited).
"""

from __future__ import annotations

__all__ = ["ParkLedger", "Parking", "is_transient"]

from collections import Counter
from collections.abc import Awaitable, Callable, Iterable
from typing import Protocol

from dpstream.topology.model import Topology
from dpstream.workers.ledger.errors import LedgerUnavailable
from dpstream.workers.ledger.types import ParkedRelease
from dpstream.workers.pipeline.merger import MergedWindow
from dpstream.workers.release.dispatch import ReleaseDispatcher, WindowParked
from dpstream.workers.release.ids import release_id as make_release_id
from dpstream.workers.release.outcomes import ReleaseResult


class ParkLedger(Protocol):
    """The ledger calls parking makes."""

    async def park(
        self,
        scope: str,
        release_id: str,
        metric: str,
        window: tuple[int, int],
        attempts: int,
        error: str,
        actor: str,
    ) -> bool: ...

    async def parked(self, scope: str) -> list[ParkedRelease]: ...

    async def unpark(self, scope: str, release_id: str, outcome: str, actor: str) -> bool: ...


def is_transient(error: BaseException) -> bool:
    """True for a failure that heals by itself (the ledger or the network unreachable, a Kafka
    timeout or a retriable broker error): retried forever, never parked. Anything else (a bug, a
    record the producer refuses) counts towards parking."""
    if isinstance(error, (LedgerUnavailable, OSError, TimeoutError)):
        return True
    from aiokafka.errors import KafkaConnectionError, KafkaError, KafkaTimeoutError

    if isinstance(error, (KafkaTimeoutError, KafkaConnectionError)):
        return True
    return isinstance(error, KafkaError) and bool(error.retriable)


class Parking:
    """The parked windows of one topology's scopes, as the ledger lists them, and parks made here."""

    def __init__(self, topology: Topology, ledger: ParkLedger, actor: str) -> None:
        self.topology = topology
        self.ledger = ledger
        self.actor = actor
        self.parks: Counter[str] = Counter()
        """metric → windows this process parked (`dpstream_releases_parked_total`)."""
        self._rows: dict[str, ParkedRelease] = {}

    def release_id(self, window: MergedWindow) -> str:
        """The window's release_id under this topology."""
        return make_release_id(self.topology.topology_version, window.metric, window.start, window.end)

    async def refresh(self) -> None:
        """Read every scope's parked list from the ledger (raises what the ledger raises)."""
        rows: dict[str, ParkedRelease] = {}
        for scope in sorted(self.topology.budgets):
            for row in await self.ledger.parked(scope):
                rows[row.release_id] = row
        self._rows = rows

    def held(self, window: MergedWindow) -> bool:
        """True when the ledger holds this window parked (no retry asked for yet)."""
        row = self._rows.get(self.release_id(window))
        return row is not None and row.state == "parked"

    def held_id(self, release_id: str) -> bool:
        """`held`, by release_id (the sweeper leaves a held, charged window alone)."""
        row = self._rows.get(release_id)
        return row is not None and row.state == "parked"

    def retry_requested(self, window: MergedWindow) -> bool:
        """True when an operator asked for this parked window to be retried."""
        row = self._rows.get(self.release_id(window))
        return row is not None and row.state == "retry"

    async def park(self, window: MergedWindow, attempts: int, error: BaseException) -> None:
        """Park the window in the ledger (audited; only the error's class name is recorded)."""
        metric = self.topology.metrics[window.metric]
        rid = self.release_id(window)
        kind = type(error).__name__
        await self.ledger.park(
            metric.budget, rid, window.metric, (window.start, window.end), attempts, kind, self.actor
        )
        self._rows[rid] = ParkedRelease(rid, metric.budget, window.metric, window.start, window.end, attempts, kind, 0)
        self.parks[window.metric] += 1

    async def settle(self, window: MergedWindow, outcome: str) -> None:
        """A window's release finished: if it was parked (and retried), it leaves the ledger's list."""
        rid = self.release_id(window)
        if rid not in self._rows:
            return
        await self.ledger.unpark(self.topology.metrics[window.metric].budget, rid, outcome, self.actor)
        self._rows.pop(rid, None)

    async def release(
        self, window: MergedWindow, release: Callable[[MergedWindow], Awaitable[ReleaseResult]]
    ) -> ReleaseResult:
        """Run `release(window)` unless the ledger holds the window parked (then raise WindowParked,
        which the dispatcher holds); a finished release of a retried window leaves the parked list."""
        if self.held(window):
            raise WindowParked()
        result = await release(window)
        await self.settle(window, result.outcome.value)
        return result

    def redispatch(self, dispatcher: ReleaseDispatcher, windows: Iterable[MergedWindow]) -> int:
        """Dispatch again the held windows (of `windows`) an operator asked to retry; how many."""
        n = 0
        for window in windows:
            if self.retry_requested(window):
                dispatcher.unpark(window.metric, window.start)
                n += dispatcher.dispatch(window)
        return n
