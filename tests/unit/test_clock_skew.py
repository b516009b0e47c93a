"""Tests of the worker-broker clock-skew reading and the gate that holds window closes."""

from __future__ import annotations

import pytest

from dpstream.topology.errors import ConfigError
from dpstream.workers.runtime.clock_skew import ClockSkewGate, SkewReading, reading_from

pytestmark = pytest.mark.unit


def test_a_reading_brackets_the_true_skew_between_send_and_ack() -> None:
    """Broker 2 s behind, appended anywhere in the round trip: the reading's interval holds −2 s."""
    sent, acked = 1000.0, 1000.4
    for append_at_worker_time in (1000.0, 1000.2, 1000.4):
        r = reading_from(sent, acked, int((append_at_worker_time - 2.0) * 1000))
        assert r.skew_s - r.uncertainty_s <= -2.0 <= r.skew_s + r.uncertainty_s
        assert r.uncertainty_s == pytest.approx(0.2005)
        assert r.at == acked


def test_a_reading_refuses_an_ack_before_its_send() -> None:
    """A clock that stepped back during the probe gives no reading at all."""
    with pytest.raises(ValueError, match="before it was sent"):
        reading_from(10.0, 9.0, 9_500)


def test_the_gate_holds_without_a_reading_and_with_a_stale_or_future_one() -> None:
    """Closes go ahead only with a reading at most max_age old, taken at or before now."""
    gate = ClockSkewGate(0.5, 30.0)
    assert gate.problem(100.0) == "no clock-skew reading yet"
    gate.record(SkewReading(0.01, 0.002, at=100.0))
    assert not gate.holding(100.0)
    assert not gate.holding(130.0)
    assert "31 s old" in (gate.problem(131.0) or "")
    assert gate.holding(99.0)  # the worker's clock stepped back since the reading


def test_the_gate_holds_when_skew_plus_uncertainty_passes_the_bound() -> None:
    """|skew| + uncertainty ≤ bound lets closes go ahead, in either direction; past it they are held."""
    gate = ClockSkewGate(0.5, 30.0)
    for skew, uncertainty, held in ((0.4, 0.1, False), (-0.4, 0.1, False), (0.45, 0.1, True), (-0.6, 0.0, True)):
        gate.record(SkewReading(skew, uncertainty, at=0.0))
        assert gate.holding(0.0) is held, (skew, uncertainty)
    assert "exceeds the bound 0.5 s" in (gate.problem(0.0) or "")


@pytest.mark.parametrize("bound", [0.0, -1.0, float("nan"), float("inf")])
def test_the_bound_must_be_a_positive_number(bound: float) -> None:
    """A bound that is not a positive finite number of seconds is a one-line config error."""
    with pytest.raises(ConfigError, match="max_clock_skew"):
        ClockSkewGate(bound, 30.0)


def test_runtime_settings_keep_the_bound_within_the_close_grace() -> None:
    """max_clock_skew_s above close_grace_s (the room a close leaves for skew) is refused in one line."""
    from dpstream.workers.runtime.settings import RuntimeSettings

    assert RuntimeSettings("k:9092", "redis://r").max_clock_skew_s == 0.5
    with pytest.raises(ConfigError, match=r"max_clock_skew 0.8 s: must be positive and at most the close grace"):
        RuntimeSettings("k:9092", "redis://r", max_clock_skew_s=0.8)


def test_a_probe_failing_after_a_reading_keeps_that_reading() -> None:
    """Of a measurement round, a reading taken before a later probe failed is still recorded."""
    import asyncio

    from aiokafka.errors import KafkaTimeoutError
    from aiokafka.structs import RecordMetadata

    from dpstream.workers.ledger.testing import one_scope_topology
    from dpstream.workers.runtime.ingest import IngestService
    from dpstream.workers.runtime.settings import RuntimeSettings

    ticks = iter([100.0, 101.0, 102.0, 103.0])  # a 1 s round trip: ± 0.5 s, past the 0.5 s bound

    class _Producer:  # stands in for aiokafka's: one acknowledged probe, then the broker stops answering
        calls = 0

        async def send_and_wait(self, topic: str, value: bytes) -> RecordMetadata:
            self.calls += 1
            if self.calls > 1:
                raise KafkaTimeoutError()
            return RecordMetadata(topic, 0, None, 0, 100_500, 1, 0)

    svc = IngestService(one_scope_topology(), RuntimeSettings("k:9092", "redis://r"), clock=lambda: next(ticks))
    svc._producer = _Producer()  # noqa: SLF001 - the service's producer, replaced for this round
    asyncio.run(svc.measure_clock_skew())
    assert svc.clock_skew.last == reading_from(100.0, 101.0, 100_500)
