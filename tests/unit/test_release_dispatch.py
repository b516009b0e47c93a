"""Release dispatch: metrics released concurrently, windows of one metric in order, state survives an owner."""

from __future__ import annotations

import asyncio
import contextlib
import json

from dpstream.topology.loader import load_topology_text
from dpstream.workers.ledger import open_ledger
from dpstream.workers.ledger.testing import ManualClock
from dpstream.workers.pipeline.merger import MergedWindow
from dpstream.workers.pipeline.partials import WindowPartial
from dpstream.workers.release import ReleaseOutcome, Releaser
from dpstream.workers.release.dispatch import MetricReleaseState, ReleaseDispatcher

_YAML = """
version: 1
sources:
  s: {topic: t, privacy_unit: user_id, timestamp: ts}
budgets:
  b: {epsilon: 1.0, delta: 1.0e-6, accounting: zcdp, period: 1d}
metrics:
  hist:
    source: s
    budget: b
    weight: 1
    window: {tumbling: 1h}
    aggregate: count
    group_by: page
    keys: [a, b]
    contribution: {max_keys: 1, max_per_key: 1}
    mechanism: gaussian
sinks: {releases: r, dead_letter: d}
"""
_T0 = 1_796_000_400


def _window(metric: str, start: int) -> MergedWindow:
    return MergedWindow(metric, start, start + 10, {"a": 1})


def test_a_slow_metric_does_not_hold_up_another():
    """While metric a's release is stuck (a slow publish), metric b's window is released."""

    async def go():
        gate = asyncio.Event()
        done: list[tuple[str, int]] = []

        async def release(w: MergedWindow) -> str:
            if w.metric == "a":
                await gate.wait()
            done.append((w.metric, w.start))
            return "ok"

        d = ReleaseDispatcher(release)
        d.dispatch(_window("a", 0))
        d.dispatch(_window("b", 0))
        for _ in range(20):
            await asyncio.sleep(0)
        before = (list(done), d.take_finished("b"), d.take_finished("a"), d.busy("a"), d.busy("b"))
        assert not d.dispatch(_window("a", 0))  # in flight: not started twice
        gate.set()
        await d.drain()
        return before, done, d.take_finished("a")

    (done_before, fin_b, fin_a, busy_a, busy_b), done, fin_a_after = asyncio.run(go())
    assert done_before == [("b", 0)]
    assert (fin_b, fin_a, busy_a, busy_b) == ({0}, set(), True, False)
    assert done == [("b", 0), ("a", 0)] and fin_a_after == {0}


def test_windows_of_one_metric_overlap_up_to_the_limit():
    """A burst of windows closing together is released concurrently, never more than max_concurrent at once."""

    async def go():
        running, peak = [0], [0]

        async def release(w: MergedWindow) -> None:
            running[0] += 1
            peak[0] = max(peak[0], running[0])
            await asyncio.sleep(0.01)
            running[0] -= 1

        d = ReleaseDispatcher(release, max_concurrent=3)
        for s in range(0, 80, 10):
            d.dispatch(_window("a", s))
        await d.drain()
        return peak[0], d.take_finished("a")

    peak, finished = asyncio.run(go())
    assert peak == 3
    assert finished == set(range(0, 80, 10))


def test_a_window_already_in_flight_is_not_dispatched_twice():
    """Resuming state while its release still runs here does not start a second release of it."""

    async def go():
        calls: list[int] = []

        async def release(w: MergedWindow) -> None:
            calls.append(w.start)
            await asyncio.sleep(0)

        d = ReleaseDispatcher(release)
        first = d.dispatch(_window("a", 0))
        second = d.dispatch(_window("a", 0))
        await d.drain()
        third = d.dispatch(_window("a", 0))  # finished: a new dispatch is a new attempt
        await d.drain()
        return first, second, third, calls

    first, second, third, calls = asyncio.run(go())
    assert (first, second, third) == (True, False, True)
    assert calls == [0, 0]


def test_a_failed_release_is_reported_kept_and_retried_after_a_backoff(monkeypatch):
    """An exception reaches on_finished as the error and the metric's next window still goes out; the
    failed window is not finished (it stays in the state), is refused a retry until its backoff has
    passed, then is released."""
    import dpstream.workers.release.dispatch as dispatch_module

    clock = [1000.0]
    monkeypatch.setattr(dispatch_module.time, "monotonic", lambda: clock[0])

    async def go():
        reports: list[tuple[int, object, str]] = []
        down = [True]

        async def release(w: MergedWindow) -> str:
            if w.start == 0 and down[0]:
                raise ConnectionError("redis down")
            return "ok"

        d = ReleaseDispatcher(release, lambda w, r, e: reports.append((w.start, r, type(e).__name__)))
        d.dispatch(_window("a", 0))
        d.dispatch(_window("a", 10))
        await d.drain()
        after_failure = (d.take_finished("a"), d.failures("a", 0))
        too_soon = d.dispatch(_window("a", 0))
        clock[0] += dispatch_module.RETRY_MAX_S
        down[0] = False
        retried = d.dispatch(_window("a", 0))
        await d.drain()
        return reports, after_failure, too_soon, retried, d.take_finished("a"), d.failures("a", 0)

    reports, after_failure, too_soon, retried, finished, failures = asyncio.run(go())
    assert reports == [(0, None, "ConnectionError"), (10, "ok", "NoneType"), (0, "ok", "NoneType")]
    assert after_failure == ({10}, 1)
    assert (too_soon, retried) == (False, True)
    assert (finished, failures) == ({0}, 0)


def test_state_round_trips_through_json_with_its_releasing_windows():
    """Merger and releasing windows survive to_state → JSON → from_state (what the changelog holds)."""
    state = MetricReleaseState.from_state("hist", range(2), None)
    for p in (0, 1):
        state.merger.add(WindowPartial("hist", 0, 10, "s", "t", p, {"a": 2 + p}, partitions=2))
    state.releasing[0] = MergedWindow("hist", 0, 10, {"a": 5, "b": [1.5, 2]})
    doc = json.loads(json.dumps(state.to_state()))
    back = MetricReleaseState.from_state("hist", range(2), doc)
    assert back.releasing == state.releasing
    assert back.merger.to_state() == state.merger.to_state()
    # the merger remembers window 0 as released: a replayed partial of it is dropped
    assert back.merger.add(WindowPartial("hist", 0, 10, "s", "t", 0, {"a": 9}, partitions=2)) == []


def test_a_new_owner_finishes_a_release_its_predecessor_charged_without_a_second_charge():
    """Owner A charges then dies before publishing; owner B resumes the state's releasing window and
    publishes A's stored bytes; the ledger holds one charge."""
    topo = load_topology_text(_YAML)

    async def go():
        ledger = await open_ledger("memory", topo, clock=ManualClock(_T0 + 3600))
        window = MergedWindow("hist", _T0, _T0 + 3600, {"a": 40, "b": 2})
        state = MetricReleaseState.from_state("hist", range(1), None)
        state.releasing[window.start] = window
        doc = json.loads(json.dumps(state.to_state()))

        async def crash(value: bytes, key: bytes) -> None:
            raise asyncio.CancelledError  # the process died between reserve and publish

        owner_a = Releaser(topo, ledger)
        with contextlib.suppress(asyncio.CancelledError):
            await owner_a.release_merged(window, crash)
        sent: list[tuple[bytes, bytes]] = []

        async def sink(value: bytes, key: bytes) -> None:
            sent.append((value, key))

        owner_b = Releaser(topo, ledger)
        results = []
        d = ReleaseDispatcher(lambda w: owner_b.release_merged(w, sink), lambda w, r, e: results.append(r))
        resumed = MetricReleaseState.from_state("hist", range(1), doc)
        for start in sorted(resumed.releasing):
            d.dispatch(resumed.releasing[start])
        await d.drain()
        stored = await ledger.stored_payload("b", owner_a.release_id("hist", window.start, window.end))
        return results, sent, stored, await ledger.status("b")

    results, sent, stored, status = asyncio.run(go())
    [result] = results
    assert result.outcome is ReleaseOutcome.DUPLICATE
    assert [value for value, _ in sent] == [stored]
    assert status.charged == 1


def test_windows_that_failed_on_an_outage_are_due_again_once_a_release_goes_through():
    """After an outage, the first release that succeeds makes the windows that failed on it (transient
    errors) due at once, however long their backoff had grown; a window that failed on an internal error
    keeps its backoff."""
    clock = [1000.0]

    async def go():
        down = [True]

        async def release(w: MergedWindow) -> str:
            if w.start == 20:
                raise ValueError("a poison window")
            if down[0]:
                raise ConnectionError("redis down")
            return "ok"

        d = ReleaseDispatcher(release, transient=lambda e: isinstance(e, ConnectionError), clock=lambda: clock[0])
        for attempt in range(5):  # five failures in a row, each retried once its backoff passed: 32 s now
            clock[0] += 2.0**attempt if attempt else 0.0
            for start in (0, 20):
                assert d.dispatch(_window("a", start))
            await d.drain()
        held = (d.dispatch(_window("a", 0)), d.dispatch(_window("a", 20)), d.failures("a", 0))
        down[0] = False
        d.dispatch(_window("a", 10))  # a new window after the outage: released
        await d.drain()
        due = (d.dispatch(_window("a", 0)), d.dispatch(_window("a", 20)))
        await d.drain()
        return held, due, d.take_finished("a"), d.failures("a", 20)

    held, due, finished, poison_failures = asyncio.run(go())
    assert held == (False, False, 5)
    assert due == (True, False)  # the outage's window is due at once; the poison window still waits
    assert finished == {0, 10}
    assert poison_failures == 5
