"""Worker–broker clock skew: measured from a probe record's broker append time, and the gate it sets.

Windows close on the worker's clock: a partition reads its end offsets once the worker's clock has
passed C(w) + `close_grace_s`, and an event counts in w when its broker append time is at or before
C(w). If the broker's clock runs behind the worker's by more than the grace, the end offsets are read
before the broker's clock reaches C(w), and a record appended after the read but still stamped at or
before C(w) is missed: whether it counts then depends on when the worker got round to reading, i.e. on
its load. So the skew is measured, at start and every `clock_probe_interval_s`: a probe record (an
empty value, no data) is produced to a LogAppendTime topic, and the broker's append time in the produce
response is compared with the worker's clock before and after the round trip. The true skew lies within
the reading's `skew_s ± uncertainty_s`. While that interval is not inside ±`max_clock_skew_s` (or the
last reading is missing or stale), window closes are held: releases wait (release lag grows, and
`DPClockSkew` alerts), they are never made on a clock that cannot be trusted.

The release side publishes each release no earlier than its public time P(w) on its own clock, so a
release-only process measures the same skew with the same probe (`measure`) and holds publication
while the same gate is shut; a process running both halves shares one gate.
"""

from __future__ import annotations

__all__ = [
    "SkewReading",
    "ClockSkewGate",
    "reading_from",
    "probe_skew",
    "measure",
    "READING_MAX_AGE",
    "PROBE_TIMEOUT_S",
    "PROBES_PER_ROUND",
]

import asyncio
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiokafka.errors import KafkaError

from dpstream.topology.errors import ConfigError

_log = logging.getLogger(__name__)

READING_MAX_AGE = 3
"""A clock-skew reading older than this many probe intervals no longer opens the gate."""

PROBE_TIMEOUT_S = 5.0
"""A probe not acknowledged within this is given up (the reading ages out and then shuts the gate)."""

PROBES_PER_ROUND = 3
"""Probes per measurement at most: the one with the shortest round trip is kept (a slow ack widens the
reading's uncertainty, not the skew)."""

_LOG_APPEND_TIME = 1
"""`RecordMetadata.timestamp_type` of a record the broker stamped (its topic is LogAppendTime)."""

_APPEND_RESOLUTION_S = 0.001
"""The broker's append time is in whole milliseconds: the true time lies up to 1 ms after it."""


@dataclass(frozen=True)
class SkewReading:
    """One measurement: broker clock minus worker clock, in seconds (positive: the broker is ahead)."""

    skew_s: float
    """Midpoint estimate of broker − worker."""
    uncertainty_s: float
    """Half the probe's round trip (plus the append time's resolution): the true skew is within ± this."""
    at: float
    """Worker clock when the probe's acknowledgement came back."""

    @property
    def worst_s(self) -> float:
        """The largest |skew| the reading allows."""
        return abs(self.skew_s) + self.uncertainty_s


def reading_from(sent_at: float, acked_at: float, append_ms: int) -> SkewReading:
    """The skew reading of a probe sent at worker time `sent_at`, acknowledged at `acked_at`, whose record
    the broker stamped `append_ms` (epoch ms). The append happened between send and ack, so broker −
    worker lies in [append − acked_at, append + 1 ms − sent_at].

    >>> reading_from(100.0, 100.2, 99_100)
    SkewReading(skew_s=-0.9995, uncertainty_s=0.1005, at=100.2)
    """
    if not acked_at >= sent_at:
        raise ValueError(f"probe acknowledged at {acked_at} before it was sent at {sent_at}")
    append_s = append_ms / 1000
    low = append_s - acked_at
    high = append_s + _APPEND_RESOLUTION_S - sent_at
    return SkewReading(round((low + high) / 2, 6), round((high - low) / 2, 6), acked_at)


async def probe_skew(producer: Any, topic: str, clock: Callable[[], float]) -> SkewReading:
    """Produce one empty probe record to `topic` (LogAppendTime) with a started aiokafka producer and
    read the skew from the broker's append time in its acknowledgement. A topic that is not
    LogAppendTime is one line naming the setting and the fix (ConfigError)."""
    sent_at = clock()
    metadata = await producer.send_and_wait(topic, b"")
    acked_at = clock()
    if metadata.timestamp_type != _LOG_APPEND_TIME:
        raise ConfigError(
            f"topic {topic!r} (clock probe): message.timestamp.type is CreateTime, so its records carry no broker "
            f"time; run `kafka-configs --alter --entity-type topics --entity-name {topic} "
            "--add-config message.timestamp.type=LogAppendTime`"
        )
    return reading_from(sent_at, acked_at, metadata.timestamp)


async def measure(gate: ClockSkewGate, producer: Any, topic: str, clock: Callable[[], float], who: str) -> None:
    """Read the skew (the best of up to `PROBES_PER_ROUND` probes) into `gate`; a failed probe leaves
    the last reading, which ages out and then shuts the gate. `who` names the side in log lines."""
    best = None
    for _ in range(PROBES_PER_ROUND):
        try:
            reading = await asyncio.wait_for(probe_skew(producer, topic, clock), PROBE_TIMEOUT_S)
        except (KafkaError, TimeoutError, ValueError) as exc:  # ValueError: the clock stepped back meanwhile
            _log.warning("%s: clock-skew probe failed (%s); retrying", who, type(exc).__name__)
            break
        except ConfigError as exc:  # the start's topic check refuses this; changed since: the gate shuts
            _log.error("%s: %s", who, exc)
            break
        if best is None or reading.uncertainty_s < best.uncertainty_s:
            best = reading
        if best.worst_s <= gate.bound_s:
            break
    if best is not None:
        gate.record(best)


class ClockSkewGate:
    """Whether windows may close (and releases go out) now: only with a fresh reading whose whole
    interval is within the bound."""

    @classmethod
    def for_interval(cls, bound_s: float, probe_interval_s: float) -> ClockSkewGate:
        """The gate of a process that probes every `probe_interval_s` (readings age out after
        `READING_MAX_AGE` intervals)."""
        return cls(bound_s, READING_MAX_AGE * probe_interval_s)

    def next_probe_in(self, now: float, probe_interval_s: float) -> float:
        """Seconds until the next measurement: `probe_interval_s`, or at most 1 s while the gate is shut."""
        return min(1.0, probe_interval_s) if self.holding(now) else probe_interval_s

    def __init__(self, bound_s: float, max_age_s: float) -> None:
        if not (math.isfinite(bound_s) and bound_s > 0):
            raise ConfigError(f"max_clock_skew {bound_s}: must be a positive number of seconds")
        self.bound_s = bound_s
        self.max_age_s = max_age_s
        self.last: SkewReading | None = None
        self.holds = 0
        """Close rounds held because the gate was shut (for tests and logs)."""

    def record(self, reading: SkewReading) -> None:
        """Keep `reading` as the current one."""
        self.last = reading

    def problem(self, now: float) -> str | None:
        """Why closes are held at worker time `now` (None: they may go ahead). No reading older than
        `max_age_s` counts, nor one from the future (the worker's clock stepped back since)."""
        r = self.last
        if r is None:
            return "no clock-skew reading yet"
        if not 0 <= now - r.at <= self.max_age_s:
            return f"the last clock-skew reading is {now - r.at:.0f} s old"
        if r.worst_s > self.bound_s:
            return (
                f"worker-broker clock skew {r.skew_s:+.3f} s (± {r.uncertainty_s:.3f} s) exceeds the bound "
                f"{self.bound_s:g} s"
            )
        return None

    def holding(self, now: float) -> bool:
        """True when window closes are held at `now`."""
        return self.problem(now) is not None
