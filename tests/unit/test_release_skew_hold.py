"""Publication at P(w) waits on the clock-skew gate too (a manual clock; no broker)."""

from __future__ import annotations

import asyncio
import json

from dpstream.workers.release.record import iso_utc
from dpstream.workers.runtime.clock_skew import ClockSkewGate, SkewReading
from dpstream.workers.runtime.releases import PublicTimePublisher

_T0 = 1_796_000_400


def _record(published_at: int) -> bytes:
    return json.dumps({"published_at": iso_utc(published_at), "release_id": "r"}, separators=(",", ":")).encode()


def test_a_due_release_waits_while_the_gate_is_shut_and_checks_p_w_again_after_a_clock_step() -> None:
    """P(w) passed, gate shut (skew 2 s past a 0.5 s bound): nothing is sent, each recheck is counted. The
    clock is then stepped back 10 s (as a fix of a fast clock may do) with a good reading: the release
    waits for P(w) again on the corrected clock, then goes out stamped P(w)."""
    now = [_T0 + 6.0]
    gate = ClockSkewGate(0.5, 30.0)
    gate.record(SkewReading(-2.0, 0.01, now[0]))
    sent: list[tuple[float, int | None]] = []
    holds: list[str | None] = []

    stepped = [False]

    async def sleep(seconds: float) -> None:
        now[0] += seconds
        if len(holds) == 3 and not stepped[0]:  # the clock is fixed during the third hold
            stepped[0] = True
            now[0] -= 10.0
            gate.record(SkewReading(0.0, 0.01, now[0]))

    async def send(value: bytes, key: bytes, timestamp_ms: int | None) -> None:
        sent.append((now[0], timestamp_ms))

    publisher = PublicTimePublisher(send, clock=lambda: now[0], sleep=sleep, problem=gate.problem, on_hold=holds.append)
    asyncio.run(publisher.publish(_record(_T0 + 5), b"r"))
    assert [h is not None for h in holds] == [True, True, True, False]
    assert "exceeds the bound 0.5 s" in str(holds[0])
    ((at, stamp),) = sent
    assert stamp == (_T0 + 5) * 1000
    assert at >= _T0 + 5  # not before P(w) on the corrected clock


def test_without_a_gate_a_due_release_goes_at_once() -> None:
    """No `problem` given: the publisher behaves as before (a release past P(w) is sent at once)."""
    sent: list[int | None] = []

    async def send(value: bytes, key: bytes, timestamp_ms: int | None) -> None:
        sent.append(timestamp_ms)

    async def sleep(seconds: float) -> None:
        raise AssertionError("no wait expected")

    publisher = PublicTimePublisher(send, clock=lambda: _T0 + 9.0, sleep=sleep)
    asyncio.run(publisher.publish(_record(_T0 + 5), b"r"))
    assert sent == [(_T0 + 5) * 1000]
