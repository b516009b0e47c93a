"""Release dispatch: merged windows are released off the merge loop, concurrently.

Why: the release agent merges partials of every metric in one stream. Releasing inline made each
window wait behind every earlier window's ledger round trips and publish ack (a slow 50 ms publish
delayed the next window by as much; a burst of windows closing together queued up). Now the merge
loop only records a window as *releasing* in the metric's durable state and hands it here; up to
`max_concurrent` releases run at once. The budget is unaffected: every charge is one atomic
reserve, and the `Releaser` runs quote → reserve one scope at a time, so releases are priced as if
they ran in turn (DESIGN §5); only the publish acks and commits overlap.

Why it stays exactly-once: a window stays in `releasing` (persisted with the merger state) until its
release finished, so an owner that crashed or lost the metric mid-release leaves it there and the
next owner releases it again; the ledger's stored payload makes that retry republish the same bytes
with one charge (DESIGN §4). A release that failed (Redis or Kafka unreachable) stays there too and is
dispatched again after a backoff (2, 4, … 60 s): a fresh attempt draws fresh noise only if nothing
was reserved, since a reserved release_id returns its stored bytes.
"""

from __future__ import annotations

__all__ = ["MetricReleaseState", "ReleaseDispatcher", "Finished"]

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dpstream.workers.pipeline.merger import MergedWindow, PartialMerger

_log = logging.getLogger(__name__)

RETRY_MAX_S = 60.0
"""Longest wait before a failed release is attempted again."""

Finished = Callable[[MergedWindow, Any, BaseException | None], None]
"""on_finished(window, result or None, error or None): called once per release attempt."""


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
    ) -> None:
        self._release = release
        self._on_finished = on_finished
        self._slots = asyncio.Semaphore(max_concurrent)
        self._tasks: set[asyncio.Task[None]] = set()
        self._inflight: set[tuple[str, int]] = set()
        self._finished: dict[str, set[int]] = {}
        self._retry: dict[tuple[str, int], tuple[int, float]] = {}
        """(metric, start) of failed releases → (attempts, monotonic time before which not to retry)."""

    def dispatch(self, window: MergedWindow) -> bool:
        """Start releasing a window; False when it is already queued or running here, or when it
        failed and its backoff has not passed yet."""
        key = (window.metric, window.start)
        if key in self._inflight:
            return False
        retry = self._retry.get(key)
        if retry is not None and time.monotonic() < retry[1]:
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
        except Exception as exc:  # reported to on_finished, retried later
            error = exc
            attempts = self._retry.get(key, (0, 0.0))[0] + 1
            self._retry[key] = (attempts, time.monotonic() + min(RETRY_MAX_S, 2.0**attempts))
        else:
            self._retry.pop(key, None)
            self._finished.setdefault(window.metric, set()).add(window.start)
        finally:
            self._inflight.discard(key)
        if self._on_finished is not None:
            try:
                self._on_finished(window, result, error)
            except Exception:  # a reporting bug must not stop releases
                _log.exception("release dispatch: on_finished failed")
