"""Typical true values per window for `dpstream plan --typical/--sample`: given, or from a sample of events.

A sample (JSON lines, one event of one source each) runs through the worker's own parsing, bounding
and windowing (`pipeline.PartitionPipeline`, one partition, each event arriving at its own event
time as in `replay`) and the release side's reading of a window's aggregate
(`release.record.true_values_for`), so heavy units are cut to the contribution bounds exactly as
a deployment cuts them. Only windows the sample covers whole count. The figures are exact, not DP:
the data owner's planning aid, never for publication.
"""

from __future__ import annotations

__all__ = ["SampleTypicals", "parse_typical", "sample_typicals"]

import math
import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from dpstream.topology.errors import ConfigError, EventError
from dpstream.topology.model import Aggregate, Metric, Topology


@dataclass(frozen=True)
class SampleTypicals:
    """What a sample gave: the typical value of each metric with a whole window in it, and how many windows."""

    path: str
    source: str
    events: int
    """Lines that parsed as events of the source (exact: curator-only)."""
    values: dict[str, float]
    windows: dict[str, int]
    """Whole windows per metric the median is over (0: the sample is shorter than one window)."""


def parse_typical(items: Iterable[str], metrics: Mapping[str, Any]) -> dict[str, float]:
    """`--typical metric=value` flags → {metric: value}; a one-line ConfigError names a bad flag and the fix."""
    out: dict[str, float] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ConfigError(f"--typical {item!r}: write it as METRIC=VALUE, e.g. --typical page_views=1200")
        if name not in metrics:
            raise ConfigError(
                f"--typical {item!r}: FILE has no metric {name!r}; choose one of {', '.join(sorted(metrics))}"
            )
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value == 0:
            raise ConfigError(
                f"--typical {item!r}: {raw.strip() or 'the value'!r} is not a non-zero number; give the typical "
                "true value of one window, e.g. 1200"
            )
        out[name] = value
    return out


@dataclass(frozen=True, slots=True)
class _Line:
    """A sample line dressed as a record (no record time: events carry their own timestamp)."""

    offset: int
    value: bytes
    timestamp: int | None = None


def _read_lines(path: str) -> list[bytes]:
    try:
        with open(path, "rb") as fh:
            return [raw for raw in (line.rstrip(b"\r\n") for line in fh) if raw.strip()]
    except OSError as exc:
        raise ConfigError(
            f"--sample {path}: cannot read ({exc.strerror}); give a JSON-lines file of the source's events"
        ) from None


def _pick_source(topology: Topology, source: str | None, path: str) -> str:
    if source is not None:
        if source not in topology.sources:
            raise ConfigError(f"--source {source!r}: not a source of FILE; choose one of {', '.join(topology.sources)}")
        return source
    if len(topology.sources) != 1:
        raise ConfigError(
            f"--sample {path}: FILE has sources {', '.join(topology.sources)}; name the sample's with --source"
        )
    return next(iter(topology.sources))


def _span(topology: Topology, source: str, lines: list[bytes], path: str) -> tuple[float, float, int]:
    """(first, last) event time of the parsable lines and how many there are (the pipeline's own parser)."""
    from dpstream.workers.pipeline import EventParser

    metrics = [m for m in topology.metrics.values() if m.source == source]
    parser = EventParser(
        topology.sources[source],
        value_fields=[m.value for m in metrics if m.value],
        key_fields=[m.group_by for m in metrics if m.group_by],
    )
    times = []
    for offset, raw in enumerate(lines):
        try:
            times.append(parser.parse(raw, None, offset).time)
        except EventError:
            continue
    if not times:
        raise ConfigError(
            f"--sample {path}: no line is a valid event of source {source!r} (JSON objects with its privacy unit "
            f"and timestamp fields); give a sample of that source"
        )
    return min(times), max(times), len(times)


def _window_value(metric: Metric, values: Mapping[str, Any]) -> float | None:
    """One window's typical true value: ungrouped its value; declared keys the smallest key's (its CI is
    relatively widest); data-derived keys the median key's. None: a mean with no value behind it."""
    per_key: list[float] = []
    for v in values.values():
        if metric.aggregate is Aggregate.MEAN and metric.denominator is None:
            total, count = v
            if count:
                per_key.append(float(Fraction(total) / count))
        elif metric.aggregate is Aggregate.MEAN:
            per_key.append(float(v) / float(metric.denominator or 1))
        else:
            per_key.append(float(v))
    if not per_key:
        return None if metric.aggregate is Aggregate.MEAN else 0.0
    if metric.group_by is not None and metric.keys is not None:
        return min(per_key)
    return float(statistics.median(per_key))


def sample_typicals(topology: Topology, path: str, source: str | None = None) -> SampleTypicals:
    """Median over the sample's whole windows of each metric's bounded true value (see `_window_value`)."""
    from dpstream.workers.pipeline import PartitionPipeline
    from dpstream.workers.release.record import true_values_for

    src = _pick_source(topology, source, path)
    lines = _read_lines(path)
    first, last, events = _span(topology, src, lines, path)
    start, until = math.floor(first), math.floor(last) + 1
    pipe = PartitionPipeline(topology, src, 0, schedule_start=start, until=until)
    partials = pipe.process_batch(_Line(i, raw) for i, raw in enumerate(lines)).partials
    partials += pipe.flush().partials
    per_metric: dict[str, list[float]] = {m.name: [] for m in topology.metrics.values() if m.source == src}
    for partial in partials:
        metric = topology.metrics[partial.metric]
        if metric.aggregate is Aggregate.QUANTILE:
            continue  # its error is in ranks, not in the value's unit: no CI to set beside a typical value
        v = _window_value(metric, true_values_for(metric, partial.values))
        if v is not None:
            per_metric[metric.name].append(v)
    return SampleTypicals(
        path=path,
        source=src,
        events=events,
        values={name: float(statistics.median(vs)) for name, vs in per_metric.items() if vs},
        windows={name: len(vs) for name, vs in per_metric.items()},
    )
