"""Poison windows: a release that keeps failing on an internal error is parked after N attempts
(audited, counted), held, never dropped, and released exactly once after an operator's retry."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiokafka.errors import (
    KafkaConnectionError,
    KafkaTimeoutError,
    MessageSizeTooLargeError,
    NotLeaderForPartitionError,
)

from dpstream.topology.errors import InternalError
from dpstream.topology.model import Accounting, Metric, Topology
from dpstream.workers.ledger import AuditKind, Ledger, open_ledger
from dpstream.workers.ledger.errors import LedgerUnavailable
from dpstream.workers.ledger.testing import ManualClock, one_scope_topology
from dpstream.workers.noise import build_release_mechanism
from dpstream.workers.pipeline.merger import MergedWindow
from dpstream.workers.release import Releaser
from dpstream.workers.release.dispatch import ReleaseDispatcher
from dpstream.workers.release.outcomes import ReleaseOutcome
from dpstream.workers.release.parking import Parking, is_transient
from dpstream.workers.release.ports import ReleaseMechanism

DAY = 86_400
HOUR = 3_600
T0 = 1_796_000_000
P0 = (T0 // DAY) * DAY
TRUE_COUNT = 48_611_317
"""The window's true count: must appear in no audit entry and no parked listing."""


class _FlakyFactory:
    """The releaser's mechanism factory with a test hook: while `broken`, building a mechanism raises
    (as an OpenDP build failure for a metric would); fixed, it is the real factory."""

    def __init__(self) -> None:
        self.broken = True
        self.calls = 0

    def __call__(self, metric: Metric, accounting: Accounting, cost: float, *, delta: float = 0.0) -> ReleaseMechanism:
        self.calls += 1
        if self.broken:
            raise RuntimeError("mechanism build failed")
        return build_release_mechanism(metric, accounting, cost, delta=delta)


class _Sink:
    """A releases topic; `refuse` makes it raise what aiokafka raises for a record over max_request_size."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, bytes]] = []
        self.refuse: BaseException | None = None

    async def __call__(self, value: bytes, key: bytes) -> None:
        if self.refuse is not None:
            raise self.refuse
        self.sent.append((value, key))


class _Harness:
    """The release side's wiring (runtime.releases.ReleaseSide) without Faust: dispatcher → parking →
    releaser on a ledger, with a manual clock for the backoff."""

    def __init__(self, topology: Topology, ledger: Ledger, factory: Any, sink: _Sink, attempts: int) -> None:
        self.clock = ManualClock(0.0)
        self.releaser = Releaser(topology, ledger, mechanism_factory=factory)
        self.parking = Parking(topology, ledger, "worker-test")
        self.sink = sink
        self.dispatcher = ReleaseDispatcher(
            self._release, park=self.parking.park, max_attempts=attempts, transient=is_transient, clock=self.clock
        )

    async def _release(self, window: MergedWindow) -> Any:
        return await self.parking.release(window, self._now)

    async def _now(self, window: MergedWindow) -> Any:
        return await self.releaser.release_merged(window, self.sink)

    async def attempt(self, window: MergedWindow) -> bool:
        """Dispatch once (after the backoff) and wait for it; False when the dispatcher held it."""
        self.clock.advance(61.0)
        started = self.dispatcher.dispatch(window)
        await self.dispatcher.drain()
        return started


def _topology() -> Topology:
    return one_scope_topology(metrics=(("m", 1.0, HOUR, HOUR, False),))


def _window() -> MergedWindow:
    return MergedWindow("m", P0 + 5 * HOUR, P0 + 6 * HOUR, {"": TRUE_COUNT})


async def _kinds(ledger: Ledger) -> list[AuditKind]:
    return [e.kind for e in await ledger.audit("s")]


def test_an_internal_failure_parks_the_window_after_n_attempts_then_retry_releases_it_once() -> None:
    """A mechanism that cannot be built fails every attempt: after 4 the window is parked (one audit
    entry with release_id, metric, window, attempts and the error class, no value), held (not
    dispatched again, nothing charged); an operator retry (audited with actor and reason) after the
    fix releases it once, with one charge, and it leaves the parked list (audited)."""

    async def body() -> None:
        topo = _topology()
        ledger = await open_ledger("memory", topo, clock=ManualClock(T0))
        factory, sink = _FlakyFactory(), _Sink()
        h = _Harness(topo, ledger, factory, sink, attempts=4)
        w = _window()
        rid = h.parking.release_id(w)
        for _ in range(4):
            assert await h.attempt(w)
        assert h.dispatcher.parked("m", w.start)
        assert h.parking.parks["m"] == 1
        parked = await ledger.parked("s")
        assert [(p.release_id, p.attempts, p.error, p.state) for p in parked] == [(rid, 4, "RuntimeError", "parked")]
        entries = [e for e in await ledger.audit("s") if e.kind is AuditKind.PARK]
        assert len(entries) == 1
        f = entries[0].fields
        assert (f["release_id"], f["metric"], f["attempts"], f["error"]) == (rid, "m", "4", "RuntimeError")
        assert (int(f["window_start"]), int(f["window_end"])) == (w.start, w.end)
        assert "mechanism build failed" not in json.dumps(f)  # the class, never the message
        calls = factory.calls
        for _ in range(3):  # held: never dispatched again, however long
            assert not await h.attempt(w)
        assert factory.calls == calls
        assert AuditKind.CHARGE not in await _kinds(ledger)

        factory.broken = False  # the fix is deployed; then the operator retries
        assert await ledger.retry_parked("s", rid, "mechanism fixed in 1.2.3", "alice") == 1
        await h.parking.refresh()
        assert h.parking.redispatch(h.dispatcher, [w]) == 1
        await h.dispatcher.drain()
        assert len(sink.sent) == 1 and sink.sent[0][1] == rid.encode()
        assert await ledger.parked("s") == []
        kinds = await _kinds(ledger)
        assert kinds.count(AuditKind.CHARGE) == 1
        assert kinds.index(AuditKind.PARK) < kinds.index(AuditKind.RETRY) < kinds.index(AuditKind.UNPARK)
        retry = next(e for e in await ledger.audit("s") if e.kind is AuditKind.RETRY)
        assert (retry.fields["actor"], retry.fields["reason"]) == ("alice", "mechanism fixed in 1.2.3")
        assert h.parking.redispatch(h.dispatcher, [w]) == 0
        assert await h.attempt(w)  # a later dispatch (a replay): the stored bytes again, no charge
        assert sink.sent[1] == sink.sent[0]
        assert (await _kinds(ledger)).count(AuditKind.CHARGE) == 1
        for e in await ledger.audit("s"):
            assert str(TRUE_COUNT) not in json.dumps(e.fields)

    asyncio.run(body())


def test_a_charged_window_that_parks_publishes_its_stored_bytes_when_retried() -> None:
    """The record is charged, then the producer refuses it (MessageSizeTooLargeError, not retriable):
    parked after 3 attempts with the charge kept; retried after the fix, the stored bytes are
    published (never fresh noise) and nothing is charged again."""

    async def body() -> None:
        topo = _topology()
        ledger = await open_ledger("memory", topo, clock=ManualClock(T0))
        sink = _Sink()
        sink.refuse = MessageSizeTooLargeError()
        h = _Harness(topo, ledger, build_release_mechanism, sink, attempts=3)
        w = _window()
        rid = h.parking.release_id(w)
        for _ in range(3):
            assert await h.attempt(w)
        assert [(p.release_id, p.error) for p in await ledger.parked("s")] == [(rid, "MessageSizeTooLargeError")]
        stored = await ledger.stored_payload("s", rid)
        assert stored is not None
        sink.refuse = None
        assert not await h.attempt(w)  # still held until the retry
        await ledger.retry_parked("s", None, "raised max_request_size", "bob")
        await h.parking.refresh()
        h.parking.redispatch(h.dispatcher, [w])
        await h.dispatcher.drain()
        assert sink.sent == [(stored, rid.encode())]
        assert (await _kinds(ledger)).count(AuditKind.CHARGE) == 1
        assert h.releaser.counts.by_outcome[ReleaseOutcome.DUPLICATE] == 1

    asyncio.run(body())


def test_outages_never_count_towards_parking() -> None:
    """Ledger or Kafka unreachable (transient) resets the count of internal failures in a row: an
    outage between internal failures never parks a window; N internal failures in a row do."""

    async def body() -> None:
        topo = _topology()
        ledger = await open_ledger("memory", topo, clock=ManualClock(T0))
        sink = _Sink()
        h = _Harness(topo, ledger, _FlakyFactory(), sink, attempts=2)
        w = _window()
        for _ in range(2):
            assert await h.attempt(w)  # internal (RuntimeError from the factory), in a row
        assert h.dispatcher.parked("m", w.start)

        h2 = _Harness(topo, ledger, build_release_mechanism, sink, attempts=2)
        w2 = MergedWindow("m", P0 + 7 * HOUR, P0 + 8 * HOUR, {"": 1})
        for error in (InternalError("bug"), KafkaTimeoutError(), InternalError("bug"), LedgerUnavailable("down")):
            sink.refuse = error
            assert await h2.attempt(w2)
        assert not h2.dispatcher.parked("m", w2.start)
        assert len(await ledger.parked("s")) == 1

    asyncio.run(body())


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (LedgerUnavailable("down"), True),
        (ConnectionResetError(), True),
        (TimeoutError(), True),
        (KafkaTimeoutError(), True),
        (KafkaConnectionError(), True),
        (NotLeaderForPartitionError(), True),
        (MessageSizeTooLargeError(), False),
        (InternalError("bug"), False),
        (RuntimeError("x"), False),
    ],
)
def test_is_transient(error: BaseException, transient: bool) -> None:
    """Outages are retried forever; bugs and records the producer refuses count towards parking."""
    assert is_transient(error) is transient


def test_park_is_idempotent_and_retry_needs_a_parked_window() -> None:
    """Parking a parked window changes nothing (one audit entry); a retry of an unknown id retries
    nothing; a retried window that fails again is parked again (a second audit entry)."""

    async def body() -> None:
        ledger = await open_ledger("memory", _topology(), clock=ManualClock(T0))
        w = (P0, P0 + HOUR)
        assert await ledger.park("s", "r1", "m", w, 8, "RuntimeError", "w1")
        assert not await ledger.park("s", "r1", "m", w, 9, "RuntimeError", "w2")
        assert await ledger.retry_parked("s", "nope", "why", "ops") == 0
        assert await ledger.retry_parked("s", "r1", "why", "ops") == 1
        assert await ledger.retry_parked("s", "r1", "why", "ops") == 0  # already asked
        assert await ledger.park("s", "r1", "m", w, 8, "RuntimeError", "w1")
        assert (await _kinds(ledger)).count(AuditKind.PARK) == 2
        with pytest.raises(InternalError):
            await ledger.park("s", "r2", "m", w, 8, "not a class: value 17", "w1")

    asyncio.run(body())


def test_the_worker_release_side_parks_counts_hides_from_lag_and_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    """runtime.releases.ReleaseSide (a Faust app that is never started): a window failing on an internal
    error with park_after_attempts=1 is parked in the ledger, counted in dpstream_release_parks_total,
    left out of the release lag and held; after `budget retry` the sweeper's pass releases it once."""
    import faust
    from prometheus_client import CollectorRegistry

    from dpstream.workers.release.dispatch import MetricReleaseState
    from dpstream.workers.runtime.releases import ReleaseSide
    from dpstream.workers.runtime.settings import RuntimeSettings
    from dpstream.workers.telemetry.worker import WorkerCollector

    async def body() -> None:
        topo = _topology()
        app = faust.App("test-parking", broker="kafka://127.0.0.1:1", web_enabled=False)
        settings = RuntimeSettings(bootstrap="127.0.0.1:1", redis_url="memory", park_after_attempts=1)
        side = ReleaseSide(app, topo, settings, {"m": 1})
        ledger = await open_ledger("memory", topo, clock=ManualClock(T0))
        factory, sink = _FlakyFactory(), _Sink()
        side._releaser = Releaser(topo, ledger, mechanism_factory=factory)
        side._parking = Parking(topo, ledger, settings.worker_id)
        monkeypatch.setattr(side, "_publish", sink)  # the releases topic (no broker in a unit test)
        side._ready.set()
        w = _window()
        state = MetricReleaseState.from_state("m", [0], None)
        state.releasing[w.start] = w
        side._states["m"] = (state.to_state(), state)
        side._metric_tp["m"] = "tp-0"
        monkeypatch.setattr(app.assignor, "assigned_actives", lambda: {"tp-0"})

        assert side._dispatcher.dispatch(w)
        await side._dispatcher.drain()
        assert [p.error for p in await ledger.parked("s")] == ["RuntimeError"]
        assert side.stats.parked["m"] == 1
        assert side.open_windows() == {"m": []}  # parked: DPReleasesParked, not DPReleaseLag
        registry = CollectorRegistry(auto_describe=False)
        registry.register(WorkerCollector(topo, releases=side))
        assert registry.get_sample_value("dpstream_release_parks_total", {"metric": "m"}) == 1.0
        await side._retry_parked()  # a sweeper pass without a retry request: still held
        await side._dispatcher.drain()
        assert sink.sent == [] and state.releasing == {w.start: w}

        factory.broken = False
        await ledger.retry_parked("s", None, "fixed", "erin")
        await side._retry_parked()
        await side._dispatcher.drain()
        assert [key for _, key in sink.sent] == [side._parking.release_id(w).encode()]
        assert await ledger.parked("s") == []
        assert side._dispatcher.take_finished("m") == {w.start}

    asyncio.run(body())


def test_the_sweeper_skips_held_windows_and_is_not_blocked_by_a_poison_record() -> None:
    """Two charged, unpublished releases, the older one refused by the producer: a sweep round still
    publishes and commits the other, then raises the error; with the poison one held (skip), the round
    leaves it alone and raises nothing."""
    from dpstream.topology.periods import period_id
    from dpstream.workers.ledger import ReleaseRequest
    from dpstream.workers.release import sweep

    class _PoisonSink(_Sink):
        async def __call__(self, value: bytes, key: bytes) -> None:
            if key == b"r-old":
                raise MessageSizeTooLargeError()
            self.sent.append((value, key))

    async def body() -> None:
        clock = ManualClock(T0)
        ledger = await open_ledger("memory", _topology(), clock=clock)
        pid = period_id(DAY, P0)
        for h, rid in ((1, "r-old"), (2, "r-new")):
            req = ReleaseRequest(rid, "s", pid, "m", P0 + h * HOUR, P0 + (h + 1) * HOUR, 0.01, b"{}")
            await ledger.charge(req)
            clock.advance(1.0)
        clock.advance(60.0)
        sink = _PoisonSink()
        with pytest.raises(MessageSizeTooLargeError):
            await sweep(ledger, sink, 30.0)
        assert [key for _, key in sink.sent] == [b"r-new"]
        assert [p.release_id for p in await ledger.pending(30.0)] == ["r-old"]
        assert await sweep(ledger, sink, 30.0, skip=lambda rid: rid == "r-old") == 0

    asyncio.run(body())
