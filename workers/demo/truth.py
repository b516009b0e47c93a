"""The demo's synthetic truth: what an un-noised worker would publish for each window, from the events the
demo itself sent.

Only a demo can have this: it produced the feed, so it runs every well-formed event it sent through the
worker's own bounding and windowing code (`pipeline.MetricAccumulator`), with the moment it sent the event as
its arrival. An event counts in window w iff its time lies in w and it arrived by C(w) = end + lateness, the
same rule as the worker's (which uses the broker's append time, a few milliseconds later). Values are the
worker's true aggregates before noise: counts and distinct users as integers, sums in EUR, means as
sum / count. A running total's step releases the period's total so far: its truth is the sum of its windows'
values (the increments, cut by the accumulator as the worker cuts them) from the period's first step at or
after the schedule start S through that step. Nothing of this leaves the demo process: it is printed beside
the noisy value, labelled.
"""

from __future__ import annotations

__all__ = ["TruthBook"]

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from dpstream.topology.model import Aggregate, Metric, Source, Topology
from dpstream.topology.periods import period_start
from dpstream.topology.schedule import Schedule
from dpstream.workers.pipeline.accumulator import MetricAccumulator
from dpstream.workers.pipeline.batch import EventBatch
from dpstream.workers.pipeline.quantile_cells import quantile_scores
from dpstream.workers.synthetic.generator import SyntheticEvent

_KEEP_WINDOWS = 64
"""Closed windows kept per metric for look-up (a release arrives a second or two after its close)."""


class TruthBook:
    """True values per (metric, window start) of one source, for windows of the schedule from `start`."""

    def __init__(self, topology: Topology, start: int, source: str | None = None) -> None:
        self._source: Source = topology.sources[source] if source else next(iter(topology.sources.values()))
        self._metrics: dict[str, Metric] = {
            m.name: m for m in topology.metrics.values() if m.source == self._source.name
        }
        self._acc = {
            name: MetricAccumulator(
                m, self._source, Schedule.of(m, start).first_window(), period_s=topology.budgets[m.budget].period_s
            )
            for name, m in self._metrics.items()
        }
        self._closed: dict[str, dict[int, dict[str, Any]]] = {name: {} for name in self._metrics}
        self._schedules = {name: Schedule.of(m, start) for name, m in self._metrics.items() if m.running_total}
        self._period_s = {name: topology.budgets[m.budget].period_s for name, m in self._metrics.items()}
        self._totals: dict[str, dict[int, tuple[int, dict[str, float]]]] = {name: {} for name in self._schedules}
        """A running total's truth per step start: (its period's first step, the increments summed through it)."""
        self._sums: dict[str, tuple[int, int, dict[str, float]]] = {}
        """A running total's (first step, last step added, totals so far) of the period being summed."""
        self._offset = 0
        self._lateness = int(self._source.allowed_lateness_s)
        self.events = 0
        """Well-formed events seen (malformed ones are dead-lettered by the worker and count nowhere)."""

    def observe(self, events: Iterable[SyntheticEvent], arrival: float) -> None:
        """Add events that reached the broker by `arrival` (wall-clock seconds)."""
        unit_field, ts_field = self._source.privacy_unit, self._source.timestamp
        sent = [event.fields for event in events if event.fields is not None]
        if not sent:
            return
        n = len(sent)
        times = [float(f[ts_field]) if ts_field else arrival for f in sent]  # the time as sent, as the worker reads it
        batch = EventBatch.of(
            [f[unit_field] for f in sent],
            np.array(times, np.float64),
            np.full(n, arrival - self._lateness),
            np.arange(self._offset + 1, self._offset + n + 1, dtype=np.int64),
            sent,
        )
        self._offset += n
        self.events += n
        for acc in self._acc.values():
            acc.add_batch(batch)

    def close_through(self, t: float) -> None:
        """Close every window with C(w) ≤ t; call only once every event sent up to t was observed."""
        for name, acc in self._acc.items():
            closed = self._closed[name]
            for start, values in acc.close_through(t):
                closed[start] = self._finish(self._metrics[name], values, acc.exponent)
                if name in self._schedules:
                    self._add_step(name, start, closed[start])
            for old in sorted(closed)[:-_KEEP_WINDOWS]:
                del closed[old]
            totals = self._totals.get(name, {})
            for old in sorted(totals)[:-_KEEP_WINDOWS]:
                del totals[old]

    def _add_step(self, name: str, start: int, increments: dict[str, float]) -> None:
        """Add a running total's closed window to its period's sums (from the period's first step on)."""
        first = self._schedules[name].first_in_period(period_start(self._period_s[name], start))
        every = self._schedules[name].every_s
        held = self._sums.get(name)
        base: dict[str, float]
        if start == first:
            base = {}
        elif held is not None and held[0] == first and held[1] + every == start:
            base = held[2]
        else:  # a step whose predecessors were not all summed here: no truth from it to the period's end
            self._sums.pop(name, None)
            return
        sums = {key: base.get(key, 0.0) + v for key, v in increments.items()}
        self._sums[name] = (first, start, sums)
        self._totals[name][start] = (first, sums)

    def values(self, metric: str, window_start: int) -> dict[str, float] | None:
        """True values {key: value} ('' for an ungrouped metric) of a closed window, or None if unknown."""
        return self._closed.get(metric, {}).get(int(window_start))

    def total_so_far(self, metric: str, step_start: int, first_start: int | None = None) -> dict[str, float] | None:
        """A running total's truth at the step starting at `step_start`: {key: Σ of its period's window
        values from the first step through this one}, or None if unknown (or if the sum did not start at
        `first_start`, the record's `running_total.first_start`, when given)."""
        held = self._totals.get(metric, {}).get(int(step_start))
        if held is None or (first_start is not None and held[0] != int(first_start)):
            return None
        return held[1]

    def released(self, record: dict[str, Any]) -> dict[str, float] | None:
        """The truth of what a release record publishes: its window's values, or a running total's total
        so far (from the step the record names as its period's first)."""
        metric, start = record["metric"], record["window"]["start_epoch"]
        if metric in self._totals:
            first = (record.get("running_total") or {}).get("first_start")
            return self.total_so_far(metric, start, first)
        return self.values(metric, start)

    def capped(self, metric: str) -> int:
        """Events of `metric` cut by contribution bounding so far (the busiest users' surplus)."""
        return self._acc[metric].capped

    @staticmethod
    def _finish(metric: Metric, values: dict[str, Any], exponent: int) -> dict[str, float]:
        if metric.aggregate is Aggregate.QUANTILE:
            return _true_quantiles(metric, values.get("", ()))
        scale = math.ldexp(1.0, -exponent)
        out: dict[str, float] = {}
        keys = metric.keys if metric.keys is not None else (tuple(values) if metric.group_by else ("",))
        for key in keys:
            v = values.get(key)
            if metric.aggregate is Aggregate.MEAN and metric.denominator is None:
                out[key] = (v[0] * scale / v[1]) if v else math.nan
            elif metric.aggregate is Aggregate.MEAN:
                out[key] = (v or 0) * scale / float(metric.denominator or 1)
            elif metric.aggregate is Aggregate.SUM:
                out[key] = (v or 0) * scale
            else:
                out[key] = float(v or 0)
        return out


def _true_quantiles(metric: Metric, cells: Any) -> dict[str, float]:
    """Per level ('p50', ...), the grid candidate of smallest rank error: what a noiseless release
    would pick (the first of equals); NaN for an empty window."""
    grid = metric.candidates or ()
    if not cells or not sum(cells):
        return dict.fromkeys(metric.quantile_labels, math.nan)
    out: dict[str, float] = {}
    for label, alpha in zip(metric.quantile_labels, metric.quantiles or (), strict=True):
        score = quantile_scores(alpha, grid, cells)
        out[label] = grid[min(range(len(grid)), key=score.__getitem__)]
    return out
