"""Generate events for one source of a topology: the fields its metrics read, Zipf-skewed users.

A few heavy users and many light ones (Zipf over user ranks), group-by keys from the declared
public keys or a Zipf-ish referrer set, numeric values mostly within bounds and sometimes outside
(so clamping has work to do). A live feed (`producer.produce_async`) stamps each event with the
wall clock when it is sent; `speedup` > 1 makes event time run faster than that (only for offline
files and tests now: a live worker includes an event by its arrival, so accelerated event time
lands in windows that close far in the future). Malformed events (bad JSON, missing unit, NaN value, ...) are
mixed in at a requested fraction to exercise the dead-letter path.
"""

from __future__ import annotations

__all__ = ["Malformation", "GeneratorConfig", "SyntheticEvent", "EventGenerator", "write_jsonl"]

import json
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from dpstream.topology.errors import ConfigError
from dpstream.topology.model import Metric, Source, Topology


class Malformation(Enum):
    """A kind of broken event the generator can emit."""

    BAD_JSON = "bad_json"
    """Bytes that are not JSON at all."""
    MISSING_UNIT = "missing_unit"
    """A JSON object without the privacy-unit field."""
    NAN_VALUE = "nan_value"
    """A numeric field set to the string "NaN" (not a finite number under any JSON decoder)."""
    BAD_TIMESTAMP = "bad_timestamp"
    """A timestamp that is neither epoch seconds nor ISO-8601."""
    NOT_OBJECT = "not_object"
    """Valid JSON that is not an object (a list)."""
    FUTURE_TIMESTAMP = "future_timestamp"
    """A well-formed time ten years ahead (a live worker dead-letters it: past the source's max_future)."""


_TEN_YEARS_S = 10 * 365 * 86_400

_ENCODE = orjson.dumps
"""Compact JSON bytes (orjson: a tenth of the stdlib encoder's time, which dominated a 2,000 events/s feed)."""

_REFERRERS_DEFAULT = 40
"""Size of the referrer-like key set used when a group-by field has no declared keys."""


@dataclass(frozen=True)
class GeneratorConfig:
    """How to generate: population, skew, event clock and malformed fraction."""

    users: int = 1000
    seed: int | None = None
    malformed: float = 0.0
    """Fraction of events that are malformed (0 ≤ f < 1)."""
    zipf_s: float = 1.1
    """Zipf exponent of user activity: larger means a few users dominate more."""
    outside_bounds: float = 0.02
    """Fraction of numeric values drawn outside the declared bounds."""
    start_ts: float | None = None
    """Event time of the first event (epoch seconds); None means now."""
    speedup: float = 1.0
    """Event-time seconds per wall-clock second (60 makes one minute of windows pass each second)."""

    def __post_init__(self) -> None:
        if self.users < 1:
            raise ConfigError(f"--users {self.users}: need at least 1 user")
        if not 0.0 <= self.malformed < 1.0 or math.isnan(self.malformed):
            raise ConfigError(f"--malformed {self.malformed}: must be a fraction in [0, 1)")
        if not self.speedup > 0 or math.isinf(self.speedup):
            raise ConfigError(f"--speedup {self.speedup}: must be a positive number")


@dataclass(frozen=True)
class SyntheticEvent:
    """One generated record: Kafka key (the privacy unit, or None when malformed) and value bytes."""

    key: bytes | None
    value: bytes
    ts: float
    malformation: Malformation | None = None
    fields: dict[str, Any] | None = field(default=None, compare=False, repr=False)
    """The event as a dict (None when malformed): what a consumer would parse, without parsing."""


class EventGenerator:
    """Events for one source of a topology; deterministic for a given seed."""

    def __init__(self, topology: Topology, source: str | None = None, config: GeneratorConfig | None = None) -> None:
        self._config = config or GeneratorConfig()
        self._source = _pick_source(topology, source)
        self._metrics = [m for m in topology.metrics.values() if m.source == self._source.name]
        self._rng = np.random.default_rng(self._config.seed)
        ranks = np.arange(1, self._config.users + 1, dtype=float)
        weights = 1.0 / ranks**self._config.zipf_s
        self._user_cdf = np.cumsum(weights / weights.sum())
        self._groups = _group_fields(self._metrics)
        self._values = _value_fields(self._metrics)
        self._start = self._config.start_ts if self._config.start_ts is not None else time.time()

    @property
    def config(self) -> GeneratorConfig:
        """The settings this generator was built with."""
        return self._config

    @property
    def source(self) -> Source:
        """The source these events are for."""
        return self._source

    def user_name(self, index: int) -> str:
        """The privacy-unit value of user number `index` (0 is the heaviest)."""
        return f"u{index:06d}"

    def events(self, count: int, rate: float | None = None) -> Iterator[SyntheticEvent]:
        """`count` events; with `rate` (events per wall second) event time advances by speedup / rate each."""
        step = (self._config.speedup / rate) if rate else 0.0
        batch = 4096
        produced = 0
        while produced < count:
            n = min(batch, count - produced)
            times = [self._start + (produced + i) * step for i in range(n)] if rate else [self._start] * n
            yield from self._batch(times)
            produced += n

    def events_at(self, count: int, ts: float) -> list[SyntheticEvent]:
        """`count` events all stamped with event time `ts` (a live feed stamps each send with the clock)."""
        return self._batch([ts] * count)

    def _batch(self, times: list[float]) -> list[SyntheticEvent]:
        """One event per entry of `times`: every random draw of the batch is one numpy call per field."""
        n = len(times)
        if n == 0:
            return []
        rng, cfg = self._rng, self._config
        users = np.minimum(np.searchsorted(self._user_cdf, rng.random(n), side="right"), cfg.users - 1).tolist()
        broken = (rng.random(n) < cfg.malformed).tolist() if cfg.malformed > 0 else [False] * n
        columns: list[tuple[str, list[Any]]] = []
        for name, keys, zipf in self._groups:
            if zipf:
                index = rng.zipf(1.3, n) - 1
                index = np.where(index < len(keys), index, rng.integers(len(keys), size=n))
            else:
                index = rng.integers(len(keys), size=n)
            columns.append((name, [keys[i] for i in index.tolist()]))
        for name, lower, upper in self._values:
            columns.append((name, self._value_column(n, lower, upper)))
        source = self._source
        unit_field = None if source.event_level else source.privacy_unit
        ts_field = source.timestamp
        out = []
        for i in range(n):
            unit = f"u{users[i]:06d}"
            event: dict[str, object] = {}
            if unit_field is not None:
                event[unit_field] = unit
            if ts_field:
                event[ts_field] = round(times[i], 3)
            for name, column in columns:
                event[name] = column[i]
            key = None if unit_field is None else unit.encode()
            if not broken[i]:
                out.append(SyntheticEvent(key, _ENCODE(event), times[i], None, event))
            else:
                kind = self._malformation()
                out.append(SyntheticEvent(key, _break(event, kind, source, self._values), times[i], kind))
        return out

    def _value_column(self, n: int, lower: float, upper: float) -> list[float]:
        """n values: right-skewed within bounds (most baskets small, a few large), a few outside them."""
        rng, width = self._rng, upper - lower
        inside = lower + width * rng.beta(1.5, 4.0, n)
        outside = rng.random(n) < self._config.outside_bounds
        if outside.any():
            above = rng.random(n) < 0.5
            spill = width * rng.random(n)
            inside = np.where(outside, np.where(above, upper + spill, lower - spill), inside)
        return np.round(inside, 2).tolist()

    def _malformation(self) -> Malformation:
        kinds = [Malformation.BAD_JSON, Malformation.NOT_OBJECT]
        if not self._source.event_level:
            kinds.append(Malformation.MISSING_UNIT)
        if self._values:
            kinds.append(Malformation.NAN_VALUE)
        if self._source.timestamp:
            kinds += [Malformation.BAD_TIMESTAMP, Malformation.FUTURE_TIMESTAMP]
        return kinds[int(self._rng.integers(len(kinds)))]


def _break(
    event: dict[str, object], kind: Malformation, source: Source, values: list[tuple[str, float, float]]
) -> bytes:
    """Serialise `event` broken in the way `kind` names."""
    if kind is Malformation.BAD_JSON:
        return b"{not json" + json.dumps(event).encode()[:20]
    if kind is Malformation.NOT_OBJECT:
        return json.dumps([event]).encode()
    broken = dict(event)
    if kind is Malformation.MISSING_UNIT:
        broken.pop(source.privacy_unit, None)
    elif kind is Malformation.NAN_VALUE:
        broken[values[0][0]] = "NaN"
    elif kind is Malformation.BAD_TIMESTAMP and source.timestamp:
        broken[source.timestamp] = "not-a-time"
    elif kind is Malformation.FUTURE_TIMESTAMP and source.timestamp:
        broken[source.timestamp] = float(broken[source.timestamp]) + _TEN_YEARS_S  # type: ignore[arg-type]
    return json.dumps(broken).encode()


def _pick_source(topology: Topology, source: str | None) -> Source:
    if source is None:
        if len(topology.sources) != 1:
            names = ", ".join(sorted(topology.sources))
            raise ConfigError(f"{topology.path}: several sources ({names}): pick one with --source NAME")
        return next(iter(topology.sources.values()))
    if source not in topology.sources:
        names = ", ".join(sorted(topology.sources))
        raise ConfigError(f"--source {source!r}: not a source of {topology.path}; choose one of {names}")
    return topology.sources[source]


def _group_fields(metrics: list[Metric]) -> list[tuple[str, tuple[str, ...], bool]]:
    """(field, candidate keys, zipf?) for each group-by field; declared keys first, else a referrer-like set."""
    fields: dict[str, tuple[tuple[str, ...], bool]] = {}
    for metric in metrics:
        if metric.group_by is None:
            continue
        if metric.keys is not None:
            fields[metric.group_by] = (tuple(metric.keys), False)
        elif metric.group_by not in fields:
            referrers = tuple(f"{metric.group_by}-{i:02d}.example" for i in range(_REFERRERS_DEFAULT))
            fields[metric.group_by] = (referrers, True)
    return [(name, keys, zipf) for name, (keys, zipf) in fields.items()]


def _value_fields(metrics: list[Metric]) -> list[tuple[str, float, float]]:
    """(field, lower, upper) for each numeric field a metric reads."""
    fields: dict[str, tuple[float, float]] = {}
    for metric in metrics:
        if metric.value is not None:
            bounds = metric.bounds
            fields[metric.value] = (bounds.lower, bounds.upper) if bounds else (0.0, 100.0)
    return [(name, lo, hi) for name, (lo, hi) in fields.items()]


def write_jsonl(path: str | Path, events: Iterator[SyntheticEvent] | list[SyntheticEvent]) -> int:
    """Write events' value bytes one per line (replay input); returns the number written."""
    written = 0
    with open(path, "wb") as out:
        for event in events:
            out.write(event.value.replace(b"\n", b" ") + b"\n")
            written += 1
    return written
