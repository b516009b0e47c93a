"""Release dispatch: merged windows are released off the merge loop, concurrently.

Why: the release agent merges partials of every metric in one stream. Releasing inline made each
window wait behind every earlier window's ledger round trips and publish ack (a slow 50 ms publish
delayed the next window by as much; a burst of windows closing together queued up). Now the merge
loop only records a window as *releasing* in the metric's durable state and hands it here; up to
`max_concurrent` releases run at once. The budget is unaffected: every charge is one atomic
ledger call, and the `Releaser` runs quote → charge one scope at a time, so releases are priced as if
they ran in turn (canonical (P(w), metric) order); only the publish acks and commits overlap.

Why it stays exactly-once: a window stays in `releasing` (persisted with the merger state) until its
release finished, so an owner that crashed or lost the metric mid-release leaves it there and the
next owner releases it again; the ledger's stored payload makes that retry republish the same bytes
with one charge. A release that failed (Redis or Kafka unreachable) stays there too and is
dispatched again after a backoff (2, 4, … 60 s): a fresh attempt draws fresh noise only if nothing
was charged, since a charged release_id returns its stored bytes. A window that failed on an outage
(`transient`) does not sit out the rest of its backoff once the outage is over: the first release
that succeeds afterwards makes every such window due again at once (a 30 s Redis outage otherwise
held windows back for up to a further 60 s).

Poison windows: a release that keeps failing on an internal error (a bug, a record the producer
refuses; not the ledger or Kafka being unreachable, which `transient` tells apart) would retry
forever. After `max_attempts` such failures the dispatcher hands the window to `park` (the ledger
records it, audited) and holds it: it is not dispatched again until `unpark` (an operator's
`dpstream budget retry`). The window itself stays in the metric's `releasing` state, so nothing is
dropped and a charged window, once retried, publishes its stored bytes.
"""

from __future__ import annotations

__all__ = ["DEFAULT_MAX_ATTEMPTS", "MetricReleaseState", "Park", "ReleaseDispatcher", "Finished", "WindowParked"]

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dpstream.workers.pipeline.merger import MergedWindow, PartialMerger

_log = logging.getLogger(__name__)

RETRY_MAX_S = 60.0
"""Longest wait before a failed release is attempted again."""

Finished = Callable[[MergedWindow, Any, BaseException | None], None]
"""on_finished(window, result or None, error or None): called once per release attempt."""

Park = Callable[[MergedWindow, int, BaseException], Awaitable[None]]
"""park(window, attempts, last error): record the window as parked (raises if it could not)."""

DEFAULT_MAX_ATTEMPTS = 8
"""Internal failures in a row after which a window is parked (~4 min of backoff: 2 + 4 + … + 60 s)."""


class WindowParked(Exception):
    """Raised by a release callable for a window the ledger holds parked: the dispatcher holds it
    too, without counting an attempt."""


def _never_transient(error: BaseException) -> bool:
    return False


def _monotonic() -> float:
    return time.monotonic()  # looked up at each call, so a patched time.monotonic is seen


def _window_doc(w: MergedWindow) -> dict[str, Any]:
    return {"end": w.end, "values": w.values}


def _window_from(metric: str, start: str, doc: dict[str, Any]) -> MergedWindow:
    return MergedWindow(metric, int(start), int(doc["end"]), doc["values"])


@dataclass
class MetricReleaseState:
    """One metric's durable release-side state: its merger and the windows merged but not yet released."""

    merger: PartialMerger
    releasing: dict[int, MergedWindow] = field(default_factory=dict)

    def to_state(self) -> dict[str, Any]:
        """JSON-able form for the changelogged Table."""
        return {
            "merger": self.merger.to_state(),
            "releasing": {str(s): _window_doc(w) for s, w in self.releasing.items()},
        }

    @classmethod
    def from_state(cls, metric: str, partitions: Iterable[int], state: dict[str, Any] | None) -> MetricReleaseState:
        """Rebuild from `to_state` (None: a fresh metric)."""
        if state is None:
            return cls(PartialMerger(metric, partitions))
        merger = PartialMerger.from_state(metric, partitions, state.get("merger", {}))
        releasing = {int(s): _window_from(metric, s, d) for s, d in state.get("releasing", {}).items()}
        return cls(merger, releasing)


class ReleaseDispatcher:
    """Runs `release(window)` for dispatched windows, at most `max_concurrent` at once."""

    def __init__(
        self,
        release: Callable[[MergedWindow], Awaitable[Any]],
        on_finished: Finished | None = None,
        max_concurrent: int = 16,
        *,
        park: Park | None = None,
        max_attempts: int = DEFAULT_MAX_ATTEMPTS,
        transient: Callable[[BaseException], bool] = _never_transient,
        clock: Callable[[], float] | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self._release = release
        self._on_finished = on_finished
        self._park = park
        self._max_attempts = max_attempts
        self._transient = transient
        self._clock = clock or _monotonic
        """Monotonic seconds for the backoff (tests pass a manual clock)."""
        self._internal: dict[tuple[str, int], int] = {}
        """(metric, start) → internal (not transient) failures in a row."""
        self._parked: set[tuple[str, int]] = set()
        """(metric, start) of windows held parked: never dispatched until `unpark`."""
        self._slots = asyncio.Semaphore(max_concurrent)
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight: set[tuple[str, int]] = set()
        self._finished: dict[str, set[int]] = {}
        self._retry: dict[tuple[str, int], tuple[int, float]] = {}
        """(metric, start) of failed releases → (attempts, monotonic time before which not to retry)."""
        self._after_outage: set[tuple[str, int]] = set()
        """(metric, start) of windows whose last attempt failed on an outage (a transient error)."""

    def dispatch(self, window: MergedWindow) -> bool:
        """Start releasing a window; False when it is already queued or running here, or when it
        failed and its backoff has not passed yet."""
        key = (window.metric, window.start)
        if key in self._inflight or key in self._parked:
            return False
        retry = self._retry.get(key)
        if retry is not None and self._clock() < retry[1]:
            return False
        self._inflight.add(key)
        task = asyncio.get_running_loop().create_task(self._run(window))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return True

    def take_finished(self, metric: str) -> set[int]:
        """Window starts of `metric` whose release finished since the last call (to drop from state)."""
        return self._finished.pop(metric, set())

    def failures(self, metric: str, start: int) -> int:
        """Failed attempts so far of one window (0 once it finished)."""
        return self._retry.get((metric, start), (0, 0.0))[0]

    def parked(self, metric: str, start: int) -> bool:
        """True while the window is held parked."""
        return (metric, start) in self._parked

    def hold(self, metric: str, start: int) -> None:
        """Hold a window the ledger lists as parked (e.g. parked by this metric's previous owner)."""
        if (metric, start) not in self._inflight:
            self._parked.add((metric, start))

    def unpark(self, metric: str, start: int) -> bool:
        """Let a parked window be dispatched again, with fresh attempt counts; False if it was not parked."""
        key = (metric, start)
        if key not in self._parked:
            return False
        self._parked.discard(key)
        self._retry.pop(key, None)
        self._internal.pop(key, None)
        return True

    @contextlib.asynccontextmanager
    async def outside_slot(self) -> AsyncIterator[None]:
        """Give up the calling release's slot for the block (then take one again): a release waiting
        for its public time P(w) holds no slot, so the windows of one close time that exceed
        `max_concurrent` are charged before P(w) too, not one slot-full after another. Only for code
        run by a dispatched release."""
        self._slots.release()
        try:
            yield
        finally:
            await self._slots.acquire()

    def busy(self, metric: str) -> bool:
        """True while some window of `metric` is queued or being released."""
        return any(m == metric for m, _ in self._inflight)

    async def drain(self, timeout: float | None = None) -> None:
        """Wait for every queued release (shutdown); what is still running after `timeout` is left to
        the next owner, which finds it in the state's `releasing` windows."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)

    async def _run(self, window: MergedWindow) -> None:
        result: Any = None
        error: BaseException | None = None
        key = (window.metric, window.start)
        try:
            async with self._slots:
                result = await self._release(window)
        except WindowParked:
            self._parked.add(key)
            self._inflight.discard(key)
            return
        except Exception as exc:  # reported to on_finished, retried later (or parked)
            error = exc
            attempts = self._retry.get(key, (0, 0.0))[0] + 1
            self._retry[key] = (attempts, self._clock() + min(RETRY_MAX_S, 2.0**attempts))
            if self._transient(exc):
                self._after_outage.add(key)
            else:
                self._after_outage.discard(key)
            await self._count_internal(window, exc)
        else:
            self._retry.pop(key, None)
            self._internal.pop(key, None)
            self._after_outage.discard(key)
            self._finished.setdefault(window.metric, set()).add(window.start)
            self._outage_over()
        finally:
            self._inflight.discard(key)
        if self._on_finished is not None:
            try:
                self._on_finished(window, result, error)
            except Exception:  # a reporting bug must not stop releases
                _log.exception("release dispatch: on_finished failed")

    def _outage_over(self) -> None:
        """A release went through: what failed on an outage is due again now, not after its backoff."""
        for key in self._after_outage:
            retry = self._retry.get(key)
            if retry is not None:
                self._retry[key] = (retry[0], 0.0)
        self._after_outage.clear()

    async def _count_internal(self, window: MergedWindow, error: BaseException) -> None:
        """Count a failure that is not transient; at `max_attempts` in a row, park the window."""
        key = (window.metric, window.start)
        if self._park is None or self._transient(error):
            self._internal.pop(key, None)  # "in a row": an outage in between starts the count again
            return
        internal = self._internal[key] = self._internal.get(key, 0) + 1
        if internal < self._max_attempts:
            return
        try:
            await self._park(window, internal, error)
        except Exception as exc:  # not parked (e.g. ledger down): retried as before, parked next time
            _log.warning("release dispatch: parking a window failed (%s); retried later", type(exc).__name__)
            return
        self._parked.add(key)
        self._internal.pop(key, None)
        self._retry.pop(key, None)
