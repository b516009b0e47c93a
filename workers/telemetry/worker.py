"""The worker's own metrics, read from its in-process counters at scrape time (see dpstream.workers.telemetry).

Release side (roles `all` and `release`), per `metric` of the topology:

    dpstream_releases_total{metric,outcome}       published|duplicate|refused_budget|refused_breaker|
                                                  ledger_unavailable|failed|expired, every one present
    dpstream_release_retries_total{metric}        failed release attempts the dispatcher retries later
    dpstream_release_parks_total{metric}          windows this process parked after repeated internal
                                                  failures (parked now, from the ledger, per scope:
                                                  dpstream_releases_parked)
    dpstream_release_latency_seconds{metric}      histogram: close (last partial appended) → published
    dpstream_release_clamped_total{metric}        keys clamped to the fixed-point grid's range before noise
    dpstream_release_publish_misses_total{metric} releases ready only after their public time P(w) =
                                                  C(w) + publish_delay (published at once, stamped P(w))
    dpstream_release_noise_stddev{metric}         noise σ of the last release published here, in value
                                                  units (a mean: its sum component's σ; absent for top-k
                                                  and before the first release)
    dpstream_release_lag_seconds{metric}          now − C(w) of the oldest window closed but not released
                                                  (pending in the merger or releasing), C(w) = end +
                                                  allowed_lateness; 0 when none
    dpstream_windows_pending{metric}              windows closed but not released (merger + releasing)
    dpstream_releases_swept_total                 charged releases the sweeper republished
    dpstream_ledger_request_duration_seconds{op}  histogram of the releaser's ledger calls
    dpstream_ledger_errors_total{op}              those calls that raised

Ingest side (roles `all` and `ingest`), per `source`:

    dpstream_events_total{source,outcome}         accepted|invalid|late|capped|clamped (`late` events are
                                                  also `accepted`: valid, but too late for a window)
    dpstream_dead_letters_total{source,reason}    every reason of workers.pipeline.events.REASONS
    dpstream_windows_capped_total{source,metric}  (unit, window) contributions dropped by max_windows
    dpstream_period_capped_total{source,metric}   (unit, window, key) contributions a running total's
                                                  max_per_period cut, in part or whole
    dpstream_events_skipped_total{source,metric,reason}
                                                  accepted events a metric of the source left out, by
                                                  workers.pipeline.counters.SKIP_REASONS (no group field,
                                                  undeclared key, no value field), every one present
    dpstream_clock_skew_seconds                   broker clock − worker clock, from the last probe record's
                                                  append time (absent before the first reading)
    dpstream_clock_skew_uncertainty_seconds       ± of that reading (half the probe's round trip)
    dpstream_clock_skew_bound_seconds             the bound past which window closes are held
    dpstream_clock_skew_closes_held               1 while window closes are held (skew past the bound, or
                                                  no fresh reading), else 0

Both sides: the skew reading, its uncertainty and bound come from the process's one gate (the ingest's,
else the release side's own probe); a release side also serves

    dpstream_clock_skew_publishes_held            1 while publication of releases is held (the same gate
                                                  shut), else 0

`dpstream_build_info` and `dpstream_metric_privacy_info` come from workers.telemetry.info. Which of
these a scrape serves is workers.telemetry.classes's call: every family here but the noise σ is
curator-only (served only with `dpstream worker --curator-metrics`).

Labels are topology names (metric, source), fixed vocabularies (outcome, reason, op) and versions:
never a unit, a key, an event field or an aggregate. The release side's windows are read only for
their public schedule times; the noise σ comes from the published record's `noise` field, which is
public (the releases topic is).
"""

from __future__ import annotations

__all__ = ["WorkerCollector", "fold_event_counts", "noise_stddev", "EVENT_OUTCOMES"]

import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from dpstream.topology.model import Topology
from dpstream.workers.pipeline.counters import SKIP_REASONS, EventCounts
from dpstream.workers.pipeline.events import REASONS
from dpstream.workers.release.outcomes import ReleaseOutcome

EVENT_OUTCOMES = ("accepted", "invalid", "late", "capped", "clamped")
"""Values of the `outcome` label of `dpstream_events_total`."""


_K = TypeVar("_K")


def _copy(counter: Mapping[_K, int]) -> dict[_K, int]:
    """A copy of a Counter another thread may grow (the ingest thread adds dead-letter reasons)."""
    for _ in range(10):
        try:
            return dict(counter)
        except RuntimeError:  # changed size during iteration: try again
            continue
    return {}


def fold_event_counts(into: EventCounts, counts: EventCounts) -> EventCounts:
    """Add `counts` into `into` (a revoked partition's totals into its source's base) and return it."""
    into.accepted += counts.accepted
    into.late += counts.late
    into.capped += counts.capped
    into.clamped += counts.clamped
    into.skipped += counts.skipped
    for reason, n in _copy(counts.invalid).items():
        into.invalid[reason] += n
    for pair, n in _copy(counts.skips).items():
        into.skips[pair] += n
    for metric, n in _copy(counts.capped_windows).items():
        into.capped_windows[metric] += n
    for metric, n in _copy(counts.capped_period).items():
        into.capped_period[metric] += n
    return into


def noise_stddev(payload: bytes) -> float | None:
    """σ of a release record's noise (the record's `noise {scale, stddev}`), in value units; for a mean
    (`noise {sum, count}`) the sum component's σ. None when the record has none (top-k)."""
    try:
        noise = json.loads(payload).get("noise")
    except (ValueError, AttributeError, TypeError):
        return None
    if isinstance(noise, dict) and "stddev" not in noise and isinstance(noise.get("sum"), dict):
        noise = noise["sum"]
    value = noise.get("stddev") if isinstance(noise, dict) else None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


class WorkerCollector(Collector):
    """Release-side and ingest-side families of one worker process (whichever halves it runs)."""

    def __init__(
        self,
        topology: Topology,
        *,
        ingest: Any = None,
        releases: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.topology = topology
        self.ingest = ingest
        self.releases = releases
        self._clock = clock
        self._noise: dict[str, tuple[bytes, float | None]] = {}
        self._lateness = {
            name: float(topology.sources[m.source].allowed_lateness_s) for name, m in topology.metrics.items()
        }

    def collect(self) -> Iterator[Metric]:
        if self.releases is not None:
            yield from self._release_families()
        if self.ingest is not None:
            yield from self._event_families()
        yield from self._clock_families()

    # ---- release side -------------------------------------------------------------------------

    def _release_families(self) -> Iterator[Metric]:
        side = self.releases
        metrics = list(self.topology.metrics)
        stats = side.stats
        outcomes = _copy(stats.outcomes)
        total = CounterMetricFamily(
            "dpstream_releases_total",
            "Release attempts by outcome (published, "
            "duplicate, refused_budget, refused_breaker, ledger_unavailable, failed, expired).",
            labels=["metric", "outcome"],
        )
        for m in metrics:
            for o in ReleaseOutcome:
                total.add_metric([m, o.value], float(outcomes.get((m, o.value), 0)))
        yield total

        retries = CounterMetricFamily(
            "dpstream_release_retries_total",
            "Failed release attempts, each dispatched again after a backoff (the stored bytes if charged).",
            labels=["metric"],
        )
        failed = _copy(stats.retries)
        for m in metrics:
            retries.add_metric([m], float(failed.get(m, 0)))
        yield retries

        parked = CounterMetricFamily(
            "dpstream_release_parks",
            "Windows this process parked after repeated internal release failures (held until "
            "`dpstream budget retry`).",
            labels=["metric"],
        )
        parks = _copy(stats.parked)
        for m in metrics:
            parked.add_metric([m], float(parks.get(m, 0)))
        yield parked

        misses = CounterMetricFamily(
            "dpstream_release_publish_misses",
            "Releases ready only after their public time P(w) = close time + publish_delay (published at "
            "once, stamped P(w)): their timing may show how long the data took to process.",
            labels=["metric"],
        )
        missed = _copy(stats.publish_misses)
        for m in metrics:
            misses.add_metric([m], float(missed.get(m, 0)))
        yield misses

        yield side.latency.family(
            "dpstream_release_latency_seconds",
            "Window close (its last partial appended) to release published, seconds.",
        )

        stddev = GaugeMetricFamily(
            "dpstream_release_noise_stddev",
            "Noise standard deviation of the last "
            "release published by this process, in value units (a mean: its sum's).",
            labels=["metric"],
        )
        for m, payload in list(stats.last_payload.items()):
            value = self._stddev(m, payload)
            if value is not None:
                stddev.add_metric([m], value)
        yield stddev

        now = self._clock()
        open_windows = side.open_windows()
        lag = GaugeMetricFamily(
            "dpstream_release_lag_seconds",
            "Age of the oldest window closed but not released (now − (end + allowed_lateness)); 0 when none.",
            labels=["metric"],
        )
        pending = GaugeMetricFamily(
            "dpstream_windows_pending",
            "Windows closed but not yet released (waiting for partials or being released).",
            labels=["metric"],
        )
        for m in metrics:
            ends = open_windows.get(m, [])
            age = max(0.0, now - (min(ends) + self._lateness.get(m, 0.0))) if ends else 0.0
            lag.add_metric([m], age)
            pending.add_metric([m], float(len(ends)))
        yield lag
        yield pending

        releaser = side.releaser
        grid = CounterMetricFamily(
            "dpstream_release_clamped",
            "Keys whose true value lay past the fixed-point grid's range and was clamped to it before noise, "
            "over the releases this process charged (a fact about the data: curator-only).",
            labels=["metric"],
        )
        clamped = _copy(releaser.counts.clamped) if releaser is not None else {}
        for m in metrics:
            grid.add_metric([m], float(clamped.get(m, 0)))
        yield grid

        swept = CounterMetricFamily(
            "dpstream_releases_swept", "Reserved releases the sweeper republished with their stored bytes."
        )
        swept.add_metric([], float(releaser.counts.swept if releaser is not None else 0))
        yield swept

        timings = side.ledger_timings
        yield timings.durations.family(
            "dpstream_ledger_request_duration_seconds", "Duration of the release side's ledger calls, seconds, by op."
        )
        errors = CounterMetricFamily(
            "dpstream_ledger_errors_total", "Release-side ledger calls that raised, by op.", labels=["op"]
        )
        for op, n in sorted(_copy(timings.errors).items()):
            errors.add_metric([op], float(n))
        yield errors

    def _stddev(self, metric: str, payload: bytes) -> float | None:
        cached = self._noise.get(metric)
        if cached is not None and cached[0] is payload:
            return cached[1]
        value = noise_stddev(payload)
        self._noise[metric] = (payload, value)
        return value

    # ---- ingest side --------------------------------------------------------------------------

    def _event_families(self) -> Iterator[Metric]:
        totals = self.event_totals()
        events = CounterMetricFamily(
            "dpstream_events_total",
            "Events read by this worker's ingest, by "
            "outcome (late events are also accepted; capped and clamped count "
            "contributions dropped by L0/L-inf caps and values clamped to bounds).",
            labels=["source", "outcome"],
        )
        dead = CounterMetricFamily(
            "dpstream_dead_letters_total",
            "Events sent to the dead-letter topic, by reason.",
            labels=["source", "reason"],
        )
        skipped = CounterMetricFamily(
            "dpstream_events_skipped",
            "Accepted events a metric of the source left out, by reason (missing_group_field, undeclared_key, "
            "missing_value_field): the metric is released without them.",
            labels=["source", "metric", "reason"],
        )
        capped = CounterMetricFamily(
            "dpstream_windows_capped",
            "Contributions (unit, window) a metric's contribution.max_windows dropped: the unit had already "
            "counted in max_windows windows of the period.",
            labels=["source", "metric"],
        )
        cut = CounterMetricFamily(
            "dpstream_period_capped",
            "Contributions (unit, window, key) a running total's contribution.max_per_period cut, in part or "
            "whole: the unit had used (nearly) all of its bound this period.",
            labels=["source", "metric"],
        )
        for source in self.topology.sources:
            c = totals.get(source) or EventCounts()
            skips = _copy(c.skips)
            dropped = _copy(c.capped_windows)
            cuts = _copy(c.capped_period)
            for m in self.topology.metrics.values():
                if m.source == source and m.contribution.max_windows is not None:
                    capped.add_metric([source, m.name], float(dropped.get(m.name, 0)))
                if m.source == source and m.contribution.max_per_period is not None:
                    cut.add_metric([source, m.name], float(cuts.get(m.name, 0)))
            for m in self.topology.metrics.values():
                if m.source == source:
                    for reason in SKIP_REASONS:  # the fixed vocabulary, every one present
                        skipped.add_metric([source, m.name, reason], float(skips.get((m.name, reason), 0)))
            invalid = _copy(c.invalid)
            figures = {
                "accepted": c.accepted,
                "invalid": sum(invalid.values()),
                "late": c.late,
                "capped": c.capped,
                "clamped": c.clamped,
            }
            for outcome in EVENT_OUTCOMES:
                events.add_metric([source, outcome], float(figures[outcome]))
            for reason in REASONS:  # the fixed vocabulary; nothing else is ever a reason
                dead.add_metric([source, reason], float(invalid.get(reason, 0)))
        yield events
        yield dead
        yield skipped
        yield capped
        yield cut

    def _clock_families(self) -> Iterator[Metric]:
        """The skew reading of the process's one gate (the ingest's; a release-only process's own) and
        what it holds: window closes (ingest), publication (release side)."""
        side = self.ingest if self.ingest is not None else self.releases
        if side is None:
            return
        gate = side.clock_skew
        held = 1.0 if gate.holding(self._clock()) else 0.0
        reading = gate.last
        if reading is not None:
            yield GaugeMetricFamily(
                "dpstream_clock_skew_seconds",
                "Broker clock minus this worker's clock, seconds, from the last clock probe's append time.",
                value=reading.skew_s,
            )
            yield GaugeMetricFamily(
                "dpstream_clock_skew_uncertainty_seconds",
                "Half the last clock probe's round trip: the true skew lies within ± this of the reading.",
                value=reading.uncertainty_s,
            )
        yield GaugeMetricFamily(
            "dpstream_clock_skew_bound_seconds",
            "Clock skew (± its uncertainty) past which this worker holds window closes.",
            value=gate.bound_s,
        )
        if self.ingest is not None:
            yield GaugeMetricFamily(
                "dpstream_clock_skew_closes_held",
                "1 while window closes are held for clock skew (past the bound, or no fresh reading), else 0.",
                value=held,
            )
        if self.releases is not None:
            yield GaugeMetricFamily(
                "dpstream_clock_skew_publishes_held",
                "1 while release publication is held for clock skew (past the bound, or no fresh reading), else 0.",
                value=held,
            )

    def event_totals(self) -> dict[str, EventCounts]:
        """Per source: the partitions revoked from this worker (their totals at revoke) plus the
        partitions it owns now: monotone across rebalances."""
        out: dict[str, EventCounts] = {}
        for source, base in [*self.ingest.revoked_counts.items(), *self.ingest.hop_counts.items()]:
            fold_event_counts(out.setdefault(source, EventCounts()), base)
        for pipeline in self.ingest.pipelines():
            fold_event_counts(out.setdefault(pipeline.source.name, EventCounts()), pipeline.refresh_counts())
        return out
